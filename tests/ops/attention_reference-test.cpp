// Properties of the fp64 attention oracle itself (tests/reference/attention_reference.h):
// each one is a fact about softmax attention that a slip in the oracle's indexing, masking,
// sinks or dropout would break, checked without going through ladle.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "reference/attention_reference.h"

namespace {

std::vector<double> random_values(std::mt19937_64& rng, std::size_t n) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> out(n);
  for (double& x : out) x = dist(rng);
  return out;
}

reference::Attention random_problem(std::mt19937_64& rng, int B, int Tq, int Tk, int H, int H_kv, int D, int Dv) {
  reference::Attention p;
  p.B = B, p.Tq = Tq, p.Tk = Tk, p.H = H, p.H_kv = H_kv, p.D = D, p.Dv = Dv;
  p.q = random_values(rng, std::size_t(B) * Tq * H * D);
  p.k = random_values(rng, std::size_t(B) * Tk * H_kv * D);
  p.v = random_values(rng, std::size_t(B) * Tk * H_kv * Dv);
  p.scale = 1.0 / std::sqrt(double(D));
  return p;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // equal infinities
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

}  // namespace

TEST_CASE("reference: equal scores average the values over the kept keys", "[reference][attention]") {
  std::mt19937_64 rng(1);
  auto p = random_problem(rng, 2, 5, 7, 2, 1, 4, 3);
  // Every key the same vector: every score in a row is the same, whatever q is.
  for (int b = 0; b < p.B; ++b)
    for (int t = 1; t < p.Tk; ++t)
      for (int d = 0; d < p.D; ++d) p.k[(std::size_t(b) * p.Tk + t) * p.D + d] = p.k[std::size_t(b) * p.Tk * p.D + d];
  p.causal = true;  // row i keeps keys 0 .. i + (Tk - Tq)
  const auto out = reference::attention(p);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < p.Tq; ++i) {
        const int kept = i + (p.Tk - p.Tq) + 1;
        for (int e = 0; e < p.Dv; ++e) {
          double mean = 0;
          for (int j = 0; j < kept; ++j) mean += p.v[(std::size_t(b) * p.Tk + j) * p.Dv + e] / kept;
          CHECK(out.o[((std::size_t(b) * p.Tq + i) * p.H + h) * p.Dv + e] == Approx(mean).margin(1e-12));
        }
      }
}

TEST_CASE("reference: under causal with Tq == Tk the first query sees only the first value", "[reference][attention]") {
  std::mt19937_64 rng(2);
  auto p = random_problem(rng, 2, 6, 6, 4, 2, 5, 3);
  p.causal = true;
  const auto out = reference::attention(p);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int e = 0; e < p.Dv; ++e)
        CHECK(out.o[(std::size_t(b) * p.Tq * p.H + h) * p.Dv + e] ==
              Approx(p.v[(std::size_t(b) * p.Tk * p.H_kv + h / 2) * p.Dv + e]).margin(1e-12));
}

TEST_CASE("reference: causal with Tq > Tk leaves the first Tq - Tk rows empty: o = 0, lse = -inf", "[reference][attention]") {
  std::mt19937_64 rng(3);
  auto p = random_problem(rng, 1, 7, 4, 2, 2, 3, 3);
  p.causal = true;
  const auto out = reference::attention(p);
  for (int h = 0; h < p.H; ++h)
    for (int i = 0; i < p.Tq; ++i) {
      const bool empty = i < p.Tq - p.Tk;
      CHECK(std::isinf(out.lse[std::size_t(h) * p.Tq + i]) == empty);
      if (empty) {
        CHECK(out.lse[std::size_t(h) * p.Tq + i] < 0);
        for (int e = 0; e < p.Dv; ++e) CHECK(out.o[(std::size_t(i) * p.H + h) * p.Dv + e] == 0.0);
      }
    }
}

TEST_CASE("reference: lse is log Σ exp of the scores, and sinks only add to it", "[reference][attention]") {
  std::mt19937_64 rng(4);
  auto p = random_problem(rng, 2, 3, 5, 2, 1, 4, 2);
  p.bias = random_values(rng, std::size_t(p.B) * p.H * p.Tq * p.Tk);
  const auto plain = reference::attention(p);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < p.Tq; ++i) {
        double sum = 0;  // no shift: the scores are small
        for (int j = 0; j < p.Tk; ++j) {
          double dot = 0;
          for (int d = 0; d < p.D; ++d)
            dot += p.q[((std::size_t(b) * p.Tq + i) * p.H + h) * p.D + d] * p.k[(std::size_t(b) * p.Tk + j) * p.D + d];
          sum += std::exp(p.scale * dot + p.bias[((std::size_t(b) * p.H + h) * p.Tq + i) * p.Tk + j]);
        }
        CHECK(plain.lse[(std::size_t(b) * p.H + h) * p.Tq + i] == Approx(std::log(sum)).epsilon(1e-12));
      }

  // Sinks add exp(sink) to the denominator: lse grows by that much, o shrinks by the ratio.
  p.S = 3;
  p.sinks = random_values(rng, std::size_t(p.H) * p.S);
  const auto sunk = reference::attention(p);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int i = 0; i < p.Tq; ++i) {
        const double before = plain.lse[(std::size_t(b) * p.H + h) * p.Tq + i];
        double extra = 0;
        for (int t = 0; t < p.S; ++t) extra += std::exp(p.sinks[std::size_t(h) * p.S + t]);
        const double after = std::log(std::exp(before) + extra);
        CHECK(sunk.lse[(std::size_t(b) * p.H + h) * p.Tq + i] == Approx(after).epsilon(1e-12));
        for (int e = 0; e < p.Dv; ++e) {
          const std::size_t at = ((std::size_t(b) * p.Tq + i) * p.H + h) * p.Dv + e;
          CHECK(sunk.o[at] == Approx(plain.o[at] * std::exp(before - after)).margin(1e-12));
        }
      }
}

TEST_CASE("reference: sinks of -inf are no sinks, and sinks alone give o = 0 with a finite lse", "[reference][attention]") {
  std::mt19937_64 rng(5);
  auto p = random_problem(rng, 1, 5, 3, 2, 2, 3, 4);
  p.causal = true;  // rows 0 and 1 keep no key
  const auto plain = reference::attention(p);
  p.S = 2;
  p.sinks.assign(std::size_t(p.H) * p.S, -std::numeric_limits<double>::infinity());
  const auto none = reference::attention(p);
  CHECK(max_difference(none.o, plain.o) == 0.0);
  CHECK(max_difference(none.lse, plain.lse) == 0.0);

  p.sinks = {0.5, -1.0, 2.0, 0.0};
  const auto sunk = reference::attention(p);
  for (int h = 0; h < p.H; ++h) {
    const double expected = std::log(std::exp(p.sinks[2 * h]) + std::exp(p.sinks[2 * h + 1]));
    CHECK(sunk.lse[std::size_t(h) * p.Tq + 0] == Approx(expected).epsilon(1e-12));
    for (int e = 0; e < p.Dv; ++e) CHECK(sunk.o[std::size_t(h) * p.Dv + e] == 0.0);
  }
}

TEST_CASE("reference: a huge negative bias on a column is the same as masking it", "[reference][attention]") {
  std::mt19937_64 rng(6);
  auto p = random_problem(rng, 2, 4, 6, 2, 2, 3, 3);
  const int column = 2;
  p.bias.assign(std::size_t(p.B) * p.H * p.Tq * p.Tk, 0.0);
  for (std::size_t row = 0; row < std::size_t(p.B) * p.H * p.Tq; ++row) p.bias[row * p.Tk + column] = -1e4;
  const auto biased = reference::attention(p);
  p.bias.clear();
  p.mask.assign(std::size_t(p.B) * p.H * p.Tq * p.Tk, true);
  for (std::size_t row = 0; row < std::size_t(p.B) * p.H * p.Tq; ++row) p.mask[row * p.Tk + column] = false;
  const auto masked = reference::attention(p);
  CHECK(max_difference(biased.o, masked.o) < 1e-12);
  CHECK(max_difference(biased.lse, masked.lse) < 1e-12);
  // And the same again through a user predicate.
  p.mask.clear();
  p.keep = [&](int, int, int, int j) { return j != column; };
  CHECK(max_difference(reference::attention(p).o, masked.o) == 0.0);
}

TEST_CASE("reference: causal is the window (-1, 0), and an unbounded window keeps everything", "[reference][attention]") {
  std::mt19937_64 rng(7);
  for (auto [Tq, Tk] : {std::pair{5, 5}, std::pair{3, 6}, std::pair{6, 3}}) {
    auto p = random_problem(rng, 1, Tq, Tk, 2, 1, 4, 4);
    const auto full = reference::attention(p);
    p.causal = true;
    const auto causal = reference::attention(p);
    p.causal = false;
    p.window = true;
    p.window_left = -1, p.window_right = 0;
    CHECK(max_difference(reference::attention(p).o, causal.o) == 0.0);
    p.window_right = -1;
    CHECK(max_difference(reference::attention(p).o, full.o) == 0.0);
  }
}

TEST_CASE("reference: a window (left, right) keeps exactly left + right + 1 keys away from the edges", "[reference][attention]") {
  std::mt19937_64 rng(8);
  auto p = random_problem(rng, 1, 8, 10, 1, 1, 2, 10);
  // v_j = e_j: o_i[j] is p_ij, so o shows which keys were kept.
  p.v.assign(std::size_t(p.Tk) * p.Tk, 0.0);
  for (int j = 0; j < p.Tk; ++j) p.v[std::size_t(j) * p.Tk + j] = 1.0;
  p.window = true;
  p.window_left = 2, p.window_right = 1;
  const auto out = reference::attention(p);
  for (int i = 0; i < p.Tq; ++i)
    for (int j = 0; j < p.Tk; ++j) {
      const int diagonal = i + (p.Tk - p.Tq);
      const bool kept = j >= diagonal - 2 && j <= diagonal + 1;
      CHECK((out.o[std::size_t(i) * p.Tk + j] > 0) == kept);
    }
}

TEST_CASE("reference: dropout 0 is no dropout; 0.5 drops about half and rescales the rest", "[reference][attention]") {
  std::mt19937_64 rng(9);
  auto p = random_problem(rng, 2, 32, 64, 2, 1, 4, 64);
  p.v.assign(std::size_t(p.B) * p.Tk * p.Tk, 0.0);  // v_j = e_j: o_i[j] is the weight p_ij
  for (int b = 0; b < p.B; ++b)
    for (int j = 0; j < p.Tk; ++j) p.v[(std::size_t(b) * p.Tk + j) * p.Tk + j] = 1.0;
  const auto plain = reference::attention(p);
  p.seed = 1234;
  p.dropout_p = 0.0;
  CHECK(max_difference(reference::attention(p).o, plain.o) == 0.0);

  p.dropout_p = 0.5;
  const auto dropped = reference::attention(p);
  CHECK(max_difference(dropped.lse, plain.lse) == 0.0);  // lse is of the scores, before dropout
  std::size_t zeros = 0;
  for (std::size_t at = 0; at < dropped.o.size(); ++at) {
    if (dropped.o[at] == 0.0) {
      ++zeros;
    } else {
      CHECK(dropped.o[at] == Approx(2.0 * plain.o[at]).epsilon(1e-12));
    }
  }
  const double fraction = double(zeros) / double(dropped.o.size());
  INFO("dropped " << zeros << " of " << dropped.o.size());
  CHECK(fraction > 0.47);  // 8192 Bernoulli(0.5) trials: 3 sigma is 0.017
  CHECK(fraction < 0.53);
  p.seed = 1235;
  CHECK(max_difference(reference::attention(p).o, dropped.o) > 0.0);  // another seed, another pattern
}

TEST_CASE("reference: packed sequences equal each sequence run alone", "[reference][attention]") {
  std::mt19937_64 rng(10);
  const int H = 4, H_kv = 2, D = 3, Dv = 2;
  const std::vector<std::int64_t> cu_q{0, 3, 3, 4, 9}, cu_k{0, 5, 7, 8, 12};
  auto packed = random_problem(rng, 1, 9, 12, H, H_kv, D, Dv);
  packed.cu_seqlens_q = cu_q, packed.cu_seqlens_k = cu_k;
  packed.causal = true;
  packed.S = 1;
  packed.sinks = {0.1, -0.2, 0.3, 0.0};
  packed.dropout_p = 0.3;
  packed.seed = 77;
  const auto out = reference::attention(packed);
  for (int n = 0; n + 1 < int(cu_q.size()); ++n) {
    // Dropout hashes the sequence index where a batch hashes its row: sequence n alone sits
    // in row n of a batch of n + 1 copies of it.
    reference::Attention alone = packed;
    alone.cu_seqlens_q.clear(), alone.cu_seqlens_k.clear();
    alone.B = n + 1;
    alone.Tq = int(cu_q[n + 1] - cu_q[n]), alone.Tk = int(cu_k[n + 1] - cu_k[n]);
    alone.q.clear(), alone.k.clear(), alone.v.clear();
    for (int copy = 0; copy <= n; ++copy) {
      alone.q.insert(alone.q.end(), packed.q.begin() + cu_q[n] * H * D, packed.q.begin() + cu_q[n + 1] * H * D);
      alone.k.insert(alone.k.end(), packed.k.begin() + cu_k[n] * H_kv * D, packed.k.begin() + cu_k[n + 1] * H_kv * D);
      alone.v.insert(alone.v.end(), packed.v.begin() + cu_k[n] * H_kv * Dv, packed.v.begin() + cu_k[n + 1] * H_kv * Dv);
    }
    const auto single = reference::attention(alone);
    for (int i = 0; i < alone.Tq; ++i)
      for (int h = 0; h < H; ++h) {
        CHECK(single.lse[(std::size_t(n) * H + h) * alone.Tq + i] == out.lse[std::size_t(h) * 9 + cu_q[n] + i]);
        for (int e = 0; e < Dv; ++e)
          CHECK(single.o[((std::size_t(n) * alone.Tq + i) * H + h) * Dv + e] == out.o[((cu_q[n] + i) * H + h) * Dv + e]);
      }
  }
}

TEST_CASE("reference: GQA is the same as repeating each key/value head", "[reference][attention]") {
  std::mt19937_64 rng(11);
  auto grouped = random_problem(rng, 2, 4, 5, 4, 2, 3, 2);
  grouped.causal = true;
  auto repeated = grouped;
  repeated.H_kv = 4;
  repeated.k.clear(), repeated.v.clear();
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 5; ++t)
      for (int h = 0; h < 4; ++h) {
        const std::size_t row = (std::size_t(b) * 5 + t) * 2 + h / 2;
        repeated.k.insert(repeated.k.end(), grouped.k.begin() + row * 3, grouped.k.begin() + row * 3 + 3);
        repeated.v.insert(repeated.v.end(), grouped.v.begin() + row * 2, grouped.v.begin() + row * 2 + 2);
      }
  CHECK(max_difference(reference::attention(grouped).o, reference::attention(repeated).o) == 0.0);
}

TEST_CASE("reference: the soft cap bounds the scores and a huge cap changes nothing", "[reference][attention]") {
  std::mt19937_64 rng(12);
  auto p = random_problem(rng, 1, 4, 6, 1, 1, 8, 3);
  p.scale = 3.0;  // large scores, so that the cap matters
  const auto plain = reference::attention(p);
  p.soft_cap = 1e9;
  CHECK(max_difference(reference::attention(p).o, plain.o) < 1e-9);
  // With cap c every score lies in [-c, c] (tanh rounds to 1 for large scores): lse within
  // log(Tk) ± c.
  p.soft_cap = 0.5;
  const auto capped = reference::attention(p);
  for (double lse : capped.lse) {
    CHECK(lse <= std::log(6.0) + 0.5);
    CHECK(lse >= std::log(6.0) - 0.5);
  }
  // The score modifier sees the capped score.
  p.score_mod = [](double s, int, int, int, int) {
    CHECK(std::fabs(s) <= 0.5);
    return s;
  };
  CHECK(max_difference(reference::attention(p).o, capped.o) == 0.0);
}

TEST_CASE("reference: the dropout hash gives the values of an independent evaluation of the formula", "[reference][attention]") {
  // Computed with Python's integers from ops/attention.h's formula: u = (x >> 40) / 2^24.
  CHECK(reference::dropout_uniform(0, 0, 0, 0, 0) == 0.0);
  CHECK(reference::dropout_uniform(1234, 0, 0, 0, 0) == 1583790 / 16777216.0);
  CHECK(reference::dropout_uniform(1234, 1, 2, 3, 4) == 7507354 / 16777216.0);
  CHECK(reference::dropout_uniform(0xFFFFFFFFFFFFFFFFull, 7, 15, 4095, 16383) == 2978753 / 16777216.0);
  CHECK(reference::dropout_uniform(42, 3, 0, 100000, 99999) == 9181749 / 16777216.0);
}

TEST_CASE("reference: dropout decides element (b, h, i, j) by the hash of the sequence and per-sequence indices", "[reference][attention]") {
  std::mt19937_64 rng(13);
  const std::vector<std::int64_t> cu_q{0, 3, 8}, cu_k{0, 6, 12};
  for (bool packed : {false, true}) {
    auto p = packed ? random_problem(rng, 1, 8, 12, 2, 1, 4, 12) : random_problem(rng, 2, 4, 6, 2, 1, 4, 6);
    if (packed) p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;
    // v_j = e_j (j counted from the sequence's start): o_i[j] is the kept weight of key j.
    p.v.assign(std::size_t(p.B) * p.Tk * p.Dv, 0.0);
    for (int b = 0; b < p.B; ++b)
      for (int t = 0; t < p.Tk; ++t) p.v[(std::size_t(b) * p.Tk + t) * p.Dv + (packed ? t % 6 : t)] = 1.0;
    p.dropout_p = 0.4;
    p.seed = 321;
    const auto out = reference::attention(p);
    const int sequences = packed ? 2 : p.B;
    for (int n = 0; n < sequences; ++n) {
      const int b = packed ? 0 : n, q0 = packed ? int(cu_q[n]) : 0, nq = packed ? int(cu_q[n + 1] - cu_q[n]) : p.Tq;
      for (int h = 0; h < p.H; ++h)
        for (int i = 0; i < nq; ++i)
          for (int j = 0; j < 6; ++j) {
            const bool dropped = reference::dropout_uniform(321, n, h, i, j) < 0.4;
            CHECK((out.o[((std::size_t(b) * p.Tq + q0 + i) * p.H + h) * p.Dv + j] == 0.0) == dropped);
          }
    }
  }
}

TEST_CASE("reference: segment ids on one row equal the same segments packed with cu_seqlens", "[reference][attention]") {
  std::mt19937_64 rng(14);
  auto by_ids = random_problem(rng, 1, 9, 9, 2, 2, 3, 4);
  by_ids.q_segment_ids = by_ids.kv_segment_ids = {0, 0, 0, 0, 1, 2, 2, 2, 2};
  auto packed = by_ids;
  packed.q_segment_ids.clear(), packed.kv_segment_ids.clear();
  packed.cu_seqlens_q = packed.cu_seqlens_k = {0, 4, 5, 9};
  for (bool causal : {false, true}) {
    // Each segment has as many queries as keys, so the causal diagonals agree too.
    by_ids.causal = packed.causal = causal;
    const auto a = reference::attention(by_ids), b = reference::attention(packed);
    CHECK(max_difference(a.o, b.o) == 0.0);
    CHECK(max_difference(a.lse, b.lse) == 0.0);
  }
  // Different ids on the key side: query 4 (segment 1) has no key left.
  by_ids.kv_segment_ids = {0, 0, 0, 0, 3, 2, 2, 2, 2};
  const auto out = reference::attention(by_ids);
  for (int h = 0; h < 2; ++h) CHECK(std::isinf(out.lse[std::size_t(h) * 9 + 4]));
}
