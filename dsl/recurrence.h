// The primitives of a recurrent (linear) attention variant:
//   scan(k, v)              a state S [K,V] that accumulates k v^T, token after token;
//   .decay_k(g)             S <- diag(exp(g)) S             (log-space gate, key side)
//   .decay_v(g)             S <- S diag(exp(g))             (log-space gate, value side)
//   .decay_head(g)          S <- exp(g) S                   (log-space, per head)
//   read(state, q[, scale]) o_t = (scale q)^T S_t, after the update
//   .normalized(eps)        o_t / ((scale q)^T n_t + eps), n_t the scan of k alone
// Two further update forms (docs/operations.md: update forms):
//   scan(k, v).delta(beta)  the delta rule: S <- (I - beta k k^T) S + beta k v^T; with
//                           .decay_head(g) the gated delta rule: S <- exp(g) (I - beta k k^T) S + beta k v^T;
//                           with .decay_k(g) KDA: S <- (I - beta k k^T) diag(exp(g)) S + beta k v^T
//   read(...).l2_normalized()   q and k divided by their L2 norm over K (eps 1e-6), inside the kernel
//   read_before(state, q[, scale])  o_t = (scale q)^T S_{t-1}, read before the update
//   .bonus(u)               o_t = (scale q)^T (S_{t-1} + diag(u) k v^T)   (RWKV6; u over K)
// Feature maps are ordinary expressions: read(scan(elu(k) + 1, v), elu(q) + 1).
// A decay given twice adds in log space (decay_k(g).decay_k(gk) is exp(g + gk)).
#pragma once

#include "math.h"

namespace ladle::dsl {

// An absent slot: no decay (0 in log space), no scale (1).
struct None {
  static constexpr ir::Extent extent{};
};
template <class T>
inline constexpr bool is_present = !std::is_same_v<T, None>;

template <class K, class V, class GK = None, class GV = None, class GH = None, class Beta = None>
class Scan {
  static_assert(K::extent.feature == ir::Feature::key,
                "scan(k, v): the key must vary over the key features [..,K] (k, or an expression of k)");
  static_assert(V::extent.feature == ir::Feature::value,
                "scan(k, v): the value must vary over the value features [..,V] (v, or an expression of v)");
  // The delta rule decays the state's rows before its correction: per head (Gated DeltaNet) or per
  // key feature (KDA: S <- (I - beta k k^T) diag(exp(g)) S + beta k v^T). A value-side decay would
  // scale the columns the correction writes: not a form anyone trains.
  static_assert(!is_present<Beta> || !is_present<GV>,
                "delta(beta): the delta rule takes a per-head or key-side decay (decay_head: the gated "
                "delta rule; decay_k: KDA), not a value-side decay (decay_v)");

 public:
  static constexpr bool has_decay_v = is_present<GV>;
  static constexpr bool is_delta = is_present<Beta>;

  constexpr Scan(const K& key, const V& value, const GK& gk = {}, const GV& gv = {}, const GH& gh = {}, const Beta& beta = {})
      : k_(key), v_(value), gk_(gk), gv_(gv), gh_(gh), beta_(beta) {}

  // The delta rule: S <- (I - beta k k^T) S + beta k v^T, beta per token and head (not over features).
  template <operand B>
  constexpr auto delta(const B& beta) const {
    using E = as_expression_t<B>;
    static_assert(E::extent.feature == ir::Feature::none,
                  "delta(beta): the write strength beta is one value per token and head [B,T,H] (or per "
                  "head); it must not vary over features");
    static_assert(!is_present<Beta>, "delta(beta): the scan already has the delta rule's write strength");
    return Scan<K, V, GK, GV, GH, E>(k_, v_, gk_, gv_, gh_, as_expression(beta));
  }

  template <operand G>
  constexpr auto decay_k(const G& g) const {
    using E = as_expression_t<G>;
    static_assert(E::extent.feature != ir::Feature::value,
                  "decay_k: a key-side decay varies over the key features [..,K] (or is broadcast "
                  "over them); this gate varies over the value features, use decay_v");
    const auto gk = add_log(gk_, as_expression(g));
    return Scan<K, V, std::remove_cvref_t<decltype(gk)>, GV, GH, Beta>(k_, v_, gk, gv_, gh_, beta_);
  }
  template <operand G>
  constexpr auto decay_v(const G& g) const {
    using E = as_expression_t<G>;
    static_assert(E::extent.feature != ir::Feature::key,
                  "decay_v: a value-side decay varies over the value features [..,V] (or is "
                  "broadcast over them); this gate varies over the key features, use decay_k");
    const auto gv = add_log(gv_, as_expression(g));
    return Scan<K, V, GK, std::remove_cvref_t<decltype(gv)>, GH, Beta>(k_, v_, gk_, gv, gh_, beta_);
  }
  template <operand G>
  constexpr auto decay_head(const G& g) const {
    using E = as_expression_t<G>;
    static_assert(E::extent.feature == ir::Feature::none,
                  "decay_head: a per-head decay must not vary over features; use decay_k or decay_v");
    const auto gh = add_log(gh_, as_expression(g));
    return Scan<K, V, GK, GV, std::remove_cvref_t<decltype(gh)>, Beta>(k_, v_, gk_, gv_, gh, beta_);
  }

  constexpr const K& key() const { return k_; }
  constexpr const V& value() const { return v_; }
  constexpr const GK& log_decay_k() const { return gk_; }
  constexpr const GV& log_decay_v() const { return gv_; }
  constexpr const GH& log_decay_head() const { return gh_; }
  constexpr const Beta& write_strength() const { return beta_; }

 private:
  template <class Old, class New>
  static constexpr auto add_log(const Old& old, const New& g) {
    if constexpr (is_present<Old>)
      return old + g;
    else
      return g;
  }

  K k_;
  V v_;
  GK gk_;
  GV gv_;
  GH gh_;
  Beta beta_;
};

template <class T>
inline constexpr bool is_scan = false;
template <class K, class V, class GK, class GV, class GH, class Beta>
inline constexpr bool is_scan<Scan<K, V, GK, GV, GH, Beta>> = true;

template <operand K, operand V>
constexpr Scan<as_expression_t<K>, as_expression_t<V>> scan(const K& key, const V& value) {
  return {as_expression(key), as_expression(value)};
}

// How a read meets the update: after it (the default), or before it (Before) with an optional
// bonus on the current token; L2 normalisation of q and k (the delta rule's option).
template <bool Before = false, class Bonus = None, bool L2 = false>
struct ReadForm {
  static constexpr bool before = Before;
  static constexpr bool l2 = L2;
  using bonus_type = Bonus;
};

template <class S, class Q, class Scale = None, bool Normalize = false, class Form = ReadForm<>>
class Read {
  static_assert(is_scan<S>, "read(state, q): the state must be a scan(k, v), possibly decayed");
  static_assert(Q::extent.feature == ir::Feature::key,
                "read(state, q): the query must vary over the key features [..,K] (q, or an expression of q)");
  static_assert(!is_present<Scale> || Scale::extent.feature == ir::Feature::none,
                "read(state, q, scale): the scale must not vary over features");
  // n_t would need one normaliser per value column once the value side decays.
  static_assert(!Normalize || !S::has_decay_v,
                "normalized(): normalisation of the read is defined only without a value-side decay");
  static_assert(!Normalize || !S::is_delta, "normalized(): the delta rule has no normaliser");
  static_assert(!Normalize || !Form::before, "normalized(): a read before the update (read_before) has no normaliser");
  static_assert(!Form::before || !S::is_delta,
                "read_before(state, q): the delta rule is read after its update; use read(state, q)");
  static_assert(!Form::before || !S::has_decay_v,
                "read_before(state, q): a read before the update takes no value-side decay (decay_v)");
  static_assert(!Form::l2 || S::is_delta,
                "l2_normalized(): L2 normalisation of q and k belongs to the delta rule (scan(k, v).delta(beta))");

  using Bonus = typename Form::bonus_type;

 public:
  static constexpr bool normalize = Normalize;
  static constexpr bool before_update = Form::before;
  static constexpr bool l2_normalize = Form::l2;

  constexpr Read(const S& state, const Q& query, const Scale& scale = {}, float eps = 1e-10f, const Bonus& bonus = {})
      : state_(state), q_(query), scale_(scale), eps_(eps), bonus_(bonus) {}

  // Multiplies the scale (again) by s.
  template <operand E>
  constexpr auto scaled(const E& s) const {
    if constexpr (is_present<Scale>) {
      const auto product = scale_ * as_expression(s);
      return Read<S, Q, std::remove_cvref_t<decltype(product)>, Normalize, Form>(state_, q_, product, eps_, bonus_);
    } else {
      return Read<S, Q, as_expression_t<E>, Normalize, Form>(state_, q_, as_expression(s), eps_, bonus_);
    }
  }
  constexpr Read<S, Q, Scale, true, Form> normalized(float eps = 1e-10f) const { return {state_, q_, scale_, eps, bonus_}; }

  // q and k divided by sqrt(sum over K of x^2 + 1e-6) inside the kernel, after their feature maps.
  constexpr Read<S, Q, Scale, Normalize, ReadForm<Form::before, Bonus, true>> l2_normalized() const {
    return {state_, q_, scale_, eps_, bonus_};
  }

  // o_t = (scale q)^T (S_{t-1} + diag(u) k v^T): the current token read through the bonus u.
  template <operand U>
  constexpr auto bonus(const U& u) const {
    using E = as_expression_t<U>;
    static_assert(Form::before,
                  "bonus(u): only a read before the update (read_before(state, q)) adds a bonus on the current token");
    static_assert(!is_present<Bonus>, "bonus(u): the read already has a bonus");
    static_assert(E::extent.feature != ir::Feature::value,
                  "bonus(u): the bonus weighs the key features [..,K] (u is [H,K], dsl::head_key); this one "
                  "varies over the value features");
    return Read<S, Q, Scale, Normalize, ReadForm<true, E, Form::l2>>(state_, q_, scale_, eps_, as_expression(u));
  }

  constexpr const S& state() const { return state_; }
  constexpr const Q& query() const { return q_; }
  constexpr const Scale& scale() const { return scale_; }
  constexpr float eps() const { return eps_; }
  constexpr const Bonus& bonus_weight() const { return bonus_; }

 private:
  S state_;
  Q q_;
  Scale scale_;
  float eps_;
  Bonus bonus_;
};

template <class S, operand Q>
constexpr Read<S, as_expression_t<Q>> read(const S& state, const Q& query) {
  return {state, as_expression(query)};
}
template <class S, operand Q, operand Scale>
constexpr Read<S, as_expression_t<Q>, as_expression_t<Scale>> read(const S& state, const Q& query, const Scale& scale) {
  return {state, as_expression(query), as_expression(scale)};
}
// A read before the update: o_t = (scale q)^T S_{t-1} (add the current token with .bonus(u)).
template <class S, operand Q>
constexpr Read<S, as_expression_t<Q>, None, false, ReadForm<true>> read_before(const S& state, const Q& query) {
  return {state, as_expression(query)};
}
template <class S, operand Q, operand Scale>
constexpr Read<S, as_expression_t<Q>, as_expression_t<Scale>, false, ReadForm<true>> read_before(const S& state, const Q& query,
                                                                                                 const Scale& scale) {
  return {state, as_expression(query), as_expression(scale)};
}

template <class T>
inline constexpr bool is_read = false;
template <class S, class Q, class Scale, bool N, class Form>
inline constexpr bool is_read<Read<S, Q, Scale, N, Form>> = true;

}  // namespace ladle::dsl
