// The primitives of a recurrent (linear) attention variant:
//   scan(k, v)              a state S [K,V] that accumulates k v^T, token after token;
//   .decay_k(g)             S <- diag(exp(g)) S             (log-space gate, key side)
//   .decay_v(g)             S <- S diag(exp(g))             (log-space gate, value side)
//   .decay_head(g)          S <- exp(g) S                   (log-space, per head)
//   read(state, q[, scale]) o_t = (scale q)^T S_t, after the update
//   .normalized(eps)        o_t / ((scale q)^T n_t + eps), n_t the scan of k alone
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

template <class K, class V, class GK = None, class GV = None, class GH = None>
class Scan {
  static_assert(K::extent.feature == ir::Feature::key,
                "scan(k, v): the key must vary over the key features [..,K] (k, or an expression of k)");
  static_assert(V::extent.feature == ir::Feature::value,
                "scan(k, v): the value must vary over the value features [..,V] (v, or an expression of v)");

 public:
  static constexpr bool has_decay_v = is_present<GV>;

  constexpr Scan(const K& key, const V& value, const GK& gk = {}, const GV& gv = {}, const GH& gh = {})
      : k_(key), v_(value), gk_(gk), gv_(gv), gh_(gh) {}

  template <operand G>
  constexpr auto decay_k(const G& g) const {
    using E = as_expression_t<G>;
    static_assert(E::extent.feature != ir::Feature::value,
                  "decay_k: a key-side decay varies over the key features [..,K] (or is broadcast "
                  "over them); this gate varies over the value features, use decay_v");
    const auto gk = add_log(gk_, as_expression(g));
    return Scan<K, V, std::remove_cvref_t<decltype(gk)>, GV, GH>(k_, v_, gk, gv_, gh_);
  }
  template <operand G>
  constexpr auto decay_v(const G& g) const {
    using E = as_expression_t<G>;
    static_assert(E::extent.feature != ir::Feature::key,
                  "decay_v: a value-side decay varies over the value features [..,V] (or is "
                  "broadcast over them); this gate varies over the key features, use decay_k");
    const auto gv = add_log(gv_, as_expression(g));
    return Scan<K, V, GK, std::remove_cvref_t<decltype(gv)>, GH>(k_, v_, gk_, gv, gh_);
  }
  template <operand G>
  constexpr auto decay_head(const G& g) const {
    using E = as_expression_t<G>;
    static_assert(E::extent.feature == ir::Feature::none,
                  "decay_head: a per-head decay must not vary over features; use decay_k or decay_v");
    const auto gh = add_log(gh_, as_expression(g));
    return Scan<K, V, GK, GV, std::remove_cvref_t<decltype(gh)>>(k_, v_, gk_, gv_, gh);
  }

  constexpr const K& key() const { return k_; }
  constexpr const V& value() const { return v_; }
  constexpr const GK& log_decay_k() const { return gk_; }
  constexpr const GV& log_decay_v() const { return gv_; }
  constexpr const GH& log_decay_head() const { return gh_; }

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
};

template <class T>
inline constexpr bool is_scan = false;
template <class K, class V, class GK, class GV, class GH>
inline constexpr bool is_scan<Scan<K, V, GK, GV, GH>> = true;

template <operand K, operand V>
constexpr Scan<as_expression_t<K>, as_expression_t<V>> scan(const K& key, const V& value) {
  return {as_expression(key), as_expression(value)};
}

template <class S, class Q, class Scale = None, bool Normalize = false>
class Read {
  static_assert(is_scan<S>, "read(state, q): the state must be a scan(k, v), possibly decayed");
  static_assert(Q::extent.feature == ir::Feature::key,
                "read(state, q): the query must vary over the key features [..,K] (q, or an expression of q)");
  static_assert(!is_present<Scale> || Scale::extent.feature == ir::Feature::none,
                "read(state, q, scale): the scale must not vary over features");
  // n_t would need one normaliser per value column once the value side decays.
  static_assert(!Normalize || !S::has_decay_v,
                "normalized(): normalisation of the read is defined only without a value-side decay");

 public:
  static constexpr bool normalize = Normalize;

  constexpr Read(const S& state, const Q& query, const Scale& scale = {}, float eps = 1e-10f)
      : state_(state), q_(query), scale_(scale), eps_(eps) {}

  // Multiplies the scale (again) by s.
  template <operand E>
  constexpr auto scaled(const E& s) const {
    if constexpr (is_present<Scale>) {
      const auto product = scale_ * as_expression(s);
      return Read<S, Q, std::remove_cvref_t<decltype(product)>, Normalize>(state_, q_, product, eps_);
    } else {
      return Read<S, Q, as_expression_t<E>, Normalize>(state_, q_, as_expression(s), eps_);
    }
  }
  constexpr Read<S, Q, Scale, true> normalized(float eps = 1e-10f) const { return {state_, q_, scale_, eps}; }

  constexpr const S& state() const { return state_; }
  constexpr const Q& query() const { return q_; }
  constexpr const Scale& scale() const { return scale_; }
  constexpr float eps() const { return eps_; }

 private:
  S state_;
  Q q_;
  Scale scale_;
  float eps_;
};

template <class S, operand Q>
constexpr Read<S, as_expression_t<Q>> read(const S& state, const Q& query) {
  return {state, as_expression(query)};
}
template <class S, operand Q, operand Scale>
constexpr Read<S, as_expression_t<Q>, as_expression_t<Scale>> read(const S& state, const Q& query, const Scale& scale) {
  return {state, as_expression(query), as_expression(scale)};
}

template <class T>
inline constexpr bool is_read = false;
template <class S, class Q, class Scale, bool N>
inline constexpr bool is_read<Read<S, Q, Scale, N>> = true;

}  // namespace ladle::dsl
