// The fp64 oracle of the update forms beyond a diagonal decay (issue 14; docs/operations.md):
// a direct loop over the equations, in double, on dense row-major arrays, sharing no code with
// ladle. The layout, GQA, reverse, cu_seqlens and state conventions are the recurrent oracle's
// (recurrent_reference.h): q [B,T,H,K], k [B,T,H_kv,K], v [B,T,H_kv,V], the state per query head,
// initial and final states [N,H,K,V], packed sequences with B = 1.
//
// Delta rule (DeltaNet) and gated delta rule (Gated DeltaNet), read after the update:
//   S_t = (I - beta_t k_t k_t^T) A_t S_{t-1} + beta_t k_t v_t^T,   o_t = (scale q_t)^T S_t
//   A_t = exp(g_t) (g [B,T,H] log decay; empty: 1) times diag(exp(gk_t)) (KDA: gk [B,T,H,K] log
//   decay per key feature; empty: 1), beta_t [B,T,H] (empty: 1)
//   l2_normalize: q and k divided by sqrt(sum over K of x^2 + eps) first (eps 1e-6)
// Bonus read (RWKV6), read before the update:
//   o_t = (scale q_t)^T (S_{t-1} + diag(u) k_t v_t^T),   S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T
//   w [B,T,H,K] log decay, u [H,K] (or [B,H,K], one per batch row)
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "recurrent_reference.h"  // RecurrentOutput

namespace reference {

struct UpdateForm {
  int B = 1, T = 0, H = 1, H_kv = 1, K = 1, V = 1;
  std::vector<double> q, k, v;           // [B,T,H,K], [B,T,H_kv,K], [B,T,H_kv,V]
  // Grouped value heads (fla's GVA): gva_heads > 0 gives q and k that many heads and v H (a multiple).
  int gva_heads = 0;
  int q_heads() const { return gva_heads ? gva_heads : H; }
  int k_heads() const { return gva_heads ? gva_heads : H_kv; }
  int v_heads() const { return gva_heads ? H : H_kv; }
  double scale = 1.0;
  std::vector<double> initial_state;     // empty, or [N,H,K,V]
  std::vector<std::int64_t> cu_seqlens;  // empty, or [N+1] with B = 1
  bool reverse = false;
  // Delta rule
  std::vector<double> beta, g;  // empty, or [B,T,H]
  std::vector<double> gk;       // empty, or [B,T,H,K] (KDA)
  bool l2_normalize = false;
  double eps = 1e-6;
  // Bonus read
  std::vector<double> w;  // [B,T,H,K]
  std::vector<double> u;  // [H,K], or [B,H,K]
};

namespace detail {

// Runs the recurrence of every (sequence, head) from its initial state, calling step(b, t, h, S, out)
// for each token in the order the recurrence takes them; the final states go into out.
template <class Step>
RecurrentOutput run(const UpdateForm& p, Step step) {
  struct Sequence { int b, begin, end; };
  std::vector<Sequence> sequences;
  if (p.cu_seqlens.empty()) {
    for (int b = 0; b < p.B; ++b) sequences.push_back({b, 0, p.T});
  } else {
    for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n) sequences.push_back({0, int(p.cu_seqlens[n]), int(p.cu_seqlens[n + 1])});
  }
  const std::size_t KV = std::size_t(p.K) * p.V;
  RecurrentOutput out;
  out.o.assign(std::size_t(p.B) * p.T * p.H * p.V, 0.0);
  out.final_state.assign(sequences.size() * p.H * KV, 0.0);
  for (int n = 0; n < int(sequences.size()); ++n)
    for (int h = 0; h < p.H; ++h) {
      std::vector<double> S(KV, 0.0);
      if (!p.initial_state.empty())
        for (std::size_t i = 0; i < KV; ++i) S[i] = p.initial_state[(std::size_t(n) * p.H + h) * KV + i];
      const int length = sequences[n].end - sequences[n].begin;
      for (int s = 0; s < length; ++s) {
        const int t = p.reverse ? sequences[n].end - 1 - s : sequences[n].begin + s;
        step(sequences[n].b, t, h, S, out);
      }
      for (std::size_t i = 0; i < KV; ++i) out.final_state[(std::size_t(n) * p.H + h) * KV + i] = S[i];
    }
  return out;
}

inline std::vector<double> normalized(const double* x, int n, bool on, double eps) {
  std::vector<double> out(x, x + n);
  if (!on) return out;
  double sum = 0.0;
  for (double e : out) sum += e * e;
  const double inv = 1.0 / std::sqrt(sum + eps);
  for (double& e : out) e *= inv;
  return out;
}

}  // namespace detail

inline RecurrentOutput delta_rule(const UpdateForm& p) {
  const int T = p.T, H = p.H, K = p.K, V = p.V;
  return detail::run(p, [&](int b, int t, int h, std::vector<double>& S, RecurrentOutput& out) {
    const std::size_t qh = (std::size_t(b) * T + t) * H + h;  // o, the gates
    const std::size_t qq = (std::size_t(b) * T + t) * p.q_heads() + h * p.q_heads() / H;
    const std::size_t kh = (std::size_t(b) * T + t) * p.k_heads() + h * p.k_heads() / H;
    const std::size_t vh = (std::size_t(b) * T + t) * p.v_heads() + h * p.v_heads() / H;
    const std::vector<double> q = detail::normalized(&p.q[qq * K], K, p.l2_normalize, p.eps);
    const std::vector<double> k = detail::normalized(&p.k[kh * K], K, p.l2_normalize, p.eps);
    const double beta = p.beta.empty() ? 1.0 : p.beta[qh], alpha = p.g.empty() ? 1.0 : std::exp(p.g[qh]);
    // S <- A S (row i times alpha exp(gk_i)); kS = k^T S (a row of V); S_t = S - beta k kS + beta k v^T.
    for (int i = 0; i < K; ++i) {
      const double a = alpha * (p.gk.empty() ? 1.0 : std::exp(p.gk[qh * K + i]));
      for (int j = 0; j < V; ++j) S[i * V + j] *= a;
    }
    std::vector<double> kS(V, 0.0);
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < V; ++j) kS[j] += k[i] * S[i * V + j];
    for (int i = 0; i < K; ++i)
      for (int j = 0; j < V; ++j) S[i * V + j] += beta * k[i] * (p.v[vh * V + j] - kS[j]);
    for (int j = 0; j < V; ++j) {
      double o = 0.0;
      for (int i = 0; i < K; ++i) o += p.scale * q[i] * S[i * V + j];
      out.o[qh * V + j] = o;
    }
  });
}

inline RecurrentOutput bonus_read(const UpdateForm& p) {
  const int T = p.T, H = p.H, K = p.K, V = p.V;
  return detail::run(p, [&](int b, int t, int h, std::vector<double>& S, RecurrentOutput& out) {
    const std::size_t qh = (std::size_t(b) * T + t) * H + h;  // o, the gates
    const std::size_t qq = (std::size_t(b) * T + t) * p.q_heads() + h * p.q_heads() / H;
    const std::size_t kh = (std::size_t(b) * T + t) * p.k_heads() + h * p.k_heads() / H;
    const std::size_t vh = (std::size_t(b) * T + t) * p.v_heads() + h * p.v_heads() / H;
    const std::size_t uh = p.u.size() == std::size_t(H) * K ? std::size_t(h) : std::size_t(b) * H + h;
    for (int j = 0; j < V; ++j) {
      double o = 0.0;
      for (int i = 0; i < K; ++i)
        o += p.scale * p.q[qq * K + i] * (S[i * V + j] + p.u[uh * K + i] * p.k[kh * K + i] * p.v[vh * V + j]);
      out.o[qh * V + j] = o;
    }
    for (int i = 0; i < K; ++i) {
      const double a = std::exp(p.w[qh * K + i]);
      for (int j = 0; j < V; ++j) S[i * V + j] = a * S[i * V + j] + p.k[kh * K + i] * p.v[vh * V + j];
    }
  });
}

}  // namespace reference
