// Properties of the fp64 oracle of the delta rule and the bonus read (tests/reference/
// update_forms_reference.h), each a fact about the equations that a slip in the oracle's
// indexing, normalisation, gating or read order would break, checked against closed forms and
// against the recurrent oracle, without going through ladle.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "reference/update_forms_reference.h"

namespace {

std::vector<double> random_values(std::mt19937_64& rng, std::size_t n, double mean = 0.0, double spread = 1.0) {
  std::normal_distribution<double> dist(mean, spread);
  std::vector<double> out(n);
  for (double& x : out) x = dist(rng);
  return out;
}

reference::UpdateForm random_form(std::mt19937_64& rng, int B, int T, int H, int H_kv, int K, int V) {
  reference::UpdateForm p;
  p.B = B, p.T = T, p.H = H, p.H_kv = H_kv, p.K = K, p.V = V;
  p.q = random_values(rng, std::size_t(B) * T * H * K);
  p.k = random_values(rng, std::size_t(B) * T * H_kv * K);
  p.v = random_values(rng, std::size_t(B) * T * H_kv * V);
  p.scale = 1.0 / std::sqrt(double(K));
  return p;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double most = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(a[i] - b[i]));
  return most;
}

std::vector<double> sigmoid_values(std::mt19937_64& rng, std::size_t n) {
  std::vector<double> out = random_values(rng, n);
  for (double& x : out) x = 1.0 / (1.0 + std::exp(-x));
  return out;
}

}  // namespace

TEST_CASE("delta rule at beta = 1 with normalised keys stores v under k exactly, gated or not") {
  std::mt19937_64 rng(1);
  for (bool gated : {false, true}) {
    reference::UpdateForm p = random_form(rng, 2, 9, 2, 2, 6, 5);
    p.l2_normalize = true, p.eps = 0.0, p.scale = 1.0;
    p.q = p.k;  // read with the key just written
    p.initial_state = random_values(rng, std::size_t(2) * 2 * 6 * 5);
    if (gated) p.g = random_values(rng, std::size_t(2) * 9 * 2, -0.5, 0.3);
    const reference::RecurrentOutput out = reference::delta_rule(p);
    CHECK(max_difference(out.o, p.v) < 1e-12);
  }
}

TEST_CASE("delta rule at beta = 0 only decays the initial state") {
  std::mt19937_64 rng(2);
  reference::UpdateForm p = random_form(rng, 1, 7, 2, 1, 4, 3);
  p.beta.assign(std::size_t(7) * 2, 0.0);
  p.g = random_values(rng, std::size_t(7) * 2, -0.2, 0.1);
  p.initial_state = random_values(rng, std::size_t(2) * 4 * 3);
  const reference::RecurrentOutput out = reference::delta_rule(p);
  for (int h = 0; h < 2; ++h) {
    double log_decay = 0.0;
    for (int t = 0; t < 7; ++t) {
      log_decay += p.g[std::size_t(t) * 2 + h];
      for (int j = 0; j < 3; ++j) {
        double o = 0.0;
        for (int i = 0; i < 4; ++i) o += p.scale * p.q[(std::size_t(t) * 2 + h) * 4 + i] * p.initial_state[(h * 4 + i) * 3 + j];
        CHECK(std::abs(out.o[(std::size_t(t) * 2 + h) * 3 + j] - std::exp(log_decay) * o) < 1e-12);
      }
    }
    for (int i = 0; i < 12; ++i) CHECK(std::abs(out.final_state[h * 12 + i] - std::exp(log_decay) * p.initial_state[h * 12 + i]) < 1e-12);
  }
}

TEST_CASE("delta rule with mutually orthogonal keys is the gated linear recurrence with beta k") {
  // k_t orthogonal to every earlier key: k_t^T S_{t-1} = 0, so S_t = alpha_t S_{t-1} + beta_t k_t v_t^T.
  std::mt19937_64 rng(3);
  const int T = 6, H = 2, K = 8, V = 3;
  reference::UpdateForm p = random_form(rng, 1, T, H, H, K, V);
  std::fill(p.k.begin(), p.k.end(), 0.0);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) p.k[(std::size_t(t) * H + h) * K + (t + h) % K] = 0.5 + t;  // distinct axes per step
  p.beta = sigmoid_values(rng, std::size_t(T) * H);
  p.g = random_values(rng, std::size_t(T) * H, -0.3, 0.2);
  const reference::RecurrentOutput delta = reference::delta_rule(p);

  reference::Recurrent r;
  r.B = 1, r.T = T, r.H = H, r.H_kv = H, r.K = K, r.V = V, r.q = p.q, r.v = p.v, r.scale = p.scale;
  r.k = p.k;
  r.g.assign(std::size_t(T) * H * K, 0.0);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < K; ++i) {
        r.k[(std::size_t(t) * H + h) * K + i] *= p.beta[std::size_t(t) * H + h];
        r.g[(std::size_t(t) * H + h) * K + i] = p.g[std::size_t(t) * H + h];
      }
    }
  const reference::RecurrentOutput linear = reference::recurrent(r);
  CHECK(max_difference(delta.o, linear.o) < 1e-12);
  CHECK(max_difference(delta.final_state, linear.final_state) < 1e-12);
}

TEST_CASE("delta rule: GQA repeats k and v, packed sequences are separate rows, reverse walks back") {
  std::mt19937_64 rng(4);
  const int T = 5, H = 4, H_kv = 2, K = 3, V = 2;
  reference::UpdateForm p = random_form(rng, 2, T, H, H_kv, K, V);
  p.beta = sigmoid_values(rng, std::size_t(2) * T * H);
  p.g = random_values(rng, std::size_t(2) * T * H, -0.2, 0.1);
  p.l2_normalize = true;
  p.initial_state = random_values(rng, std::size_t(2) * H * K * V);
  const reference::RecurrentOutput grouped = reference::delta_rule(p);

  reference::UpdateForm repeated = p;
  repeated.H_kv = H;
  repeated.k.clear(), repeated.v.clear();
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const std::size_t row = (std::size_t(b) * T + t) * H_kv + h / 2;
        repeated.k.insert(repeated.k.end(), p.k.begin() + row * K, p.k.begin() + (row + 1) * K);
        repeated.v.insert(repeated.v.end(), p.v.begin() + row * V, p.v.begin() + (row + 1) * V);
      }
  CHECK(max_difference(grouped.o, reference::delta_rule(repeated).o) == 0.0);

  // The two batch rows packed as sequences of one row: the same outputs and final states.
  reference::UpdateForm packed = p;
  packed.B = 1, packed.T = 2 * T, packed.cu_seqlens = {0, T, 2 * T};
  const reference::RecurrentOutput as_packed = reference::delta_rule(packed);
  CHECK(max_difference(grouped.o, as_packed.o) == 0.0);
  CHECK(max_difference(grouped.final_state, as_packed.final_state) == 0.0);

  // reverse: the time-reversed inputs, read forwards.
  reference::UpdateForm backwards = p, flipped = p;
  backwards.reverse = true;
  const auto flip = [&](std::vector<double>& x, const std::vector<double>& from, int width) {
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < T; ++t)
        std::copy(from.begin() + (std::size_t(b) * T + t) * width, from.begin() + (std::size_t(b) * T + t + 1) * width,
                  x.begin() + (std::size_t(b) * T + (T - 1 - t)) * width);
  };
  flip(flipped.q, p.q, H * K), flip(flipped.k, p.k, H_kv * K), flip(flipped.v, p.v, H_kv * V);
  flip(flipped.beta, p.beta, H), flip(flipped.g, p.g, H);
  const reference::RecurrentOutput reversed = reference::delta_rule(backwards), forwards = reference::delta_rule(flipped);
  std::vector<double> unflipped(forwards.o.size());
  flip(unflipped, forwards.o, H * V);
  CHECK(max_difference(reversed.o, unflipped) < 1e-12);
  CHECK(max_difference(reversed.final_state, forwards.final_state) < 1e-12);
}

TEST_CASE("bonus read: the state is the gated recurrence's; the read is before the update plus u's bonus") {
  std::mt19937_64 rng(5);
  const int T = 7, H = 2, H_kv = 1, K = 4, V = 3;
  reference::UpdateForm p = random_form(rng, 2, T, H, H_kv, K, V);
  p.w = random_values(rng, std::size_t(2) * T * H * K, -0.3, 0.2);
  p.u = random_values(rng, std::size_t(H) * K);
  p.initial_state = random_values(rng, std::size_t(2) * H * K * V);
  const reference::RecurrentOutput bonus = reference::bonus_read(p);

  reference::Recurrent r;
  r.B = 2, r.T = T, r.H = H, r.H_kv = H_kv, r.K = K, r.V = V, r.q = p.q, r.k = p.k, r.v = p.v, r.scale = p.scale;
  r.g = p.w, r.initial_state = p.initial_state;
  CHECK(max_difference(bonus.final_state, reference::recurrent(r).final_state) < 1e-12);

  // Without decay and with u = 1 the read is q^T S_t: plain linear attention.
  reference::UpdateForm flat = p;
  std::fill(flat.w.begin(), flat.w.end(), 0.0);
  std::fill(flat.u.begin(), flat.u.end(), 1.0);
  r.g.clear();
  CHECK(max_difference(reference::bonus_read(flat).o, reference::recurrent(r).o) < 1e-12);

  // Without decay and with u = 0: o_t = q_t^T S_t - (q_t . k_t) v_t.
  std::fill(flat.u.begin(), flat.u.end(), 0.0);
  const reference::RecurrentOutput before = reference::bonus_read(flat), after = reference::recurrent(r);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const std::size_t qh = (std::size_t(b) * T + t) * H + h, kh = (std::size_t(b) * T + t) * H_kv;
        double qk = 0.0;
        for (int i = 0; i < K; ++i) qk += p.scale * p.q[qh * K + i] * p.k[kh * K + i];
        for (int j = 0; j < V; ++j) CHECK(std::abs(before.o[qh * V + j] - (after.o[qh * V + j] - qk * p.v[kh * V + j])) < 1e-12);
      }
}

TEST_CASE("KDA: a key-side decay equal on every key is the gated delta rule; at beta = 0 each row decays by its own gate") {
  std::mt19937_64 rng(7);
  reference::UpdateForm p = random_form(rng, 2, 8, 2, 1, 5, 4);
  p.beta = sigmoid_values(rng, std::size_t(2) * 8 * 2);
  p.l2_normalize = true;
  p.initial_state = random_values(rng, std::size_t(2) * 2 * 5 * 4);
  reference::UpdateForm gated = p, kda = p;
  gated.g = random_values(rng, std::size_t(2) * 8 * 2, -0.4, 0.2);
  kda.gk.resize(gated.g.size() * 5);
  for (std::size_t e = 0; e < kda.gk.size(); ++e) kda.gk[e] = gated.g[e / 5];
  const reference::RecurrentOutput a = reference::delta_rule(gated), b = reference::delta_rule(kda);
  CHECK(max_difference(a.o, b.o) < 1e-12);
  CHECK(max_difference(a.final_state, b.final_state) < 1e-12);

  // beta = 0: S_T = diag(exp(sum of gk)) S_0, a different decay on each key row.
  kda.beta.assign(kda.beta.size(), 0.0);
  kda.gk = random_values(rng, kda.gk.size(), -0.3, 0.2);
  const reference::RecurrentOutput c = reference::delta_rule(kda);
  for (int n = 0; n < 2; ++n)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 5; ++i) {
        double log_decay = 0.0;
        for (int t = 0; t < 8; ++t) log_decay += kda.gk[((std::size_t(n) * 8 + t) * 2 + h) * 5 + i];
        for (int j = 0; j < 4; ++j) {
          const std::size_t at = ((std::size_t(n) * 2 + h) * 5 + i) * 4 + j;
          CHECK(std::abs(c.final_state[at] - std::exp(log_decay) * kda.initial_state[at]) < 1e-12);
        }
      }
}
