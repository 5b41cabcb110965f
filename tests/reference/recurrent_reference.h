// The fp64 oracle of the recurrent family (docs/operations.md; docs/design.md: correctness): a direct loop over
// the equations, in double, on dense row-major arrays. It shares no code with ladle, so
// that a bug in the library cannot hide in both.
//   S_t = diag(a_t) S_{t-1} diag(b_t) c + k_t v_t^T,   o_t = (scale q_t)^T S_t
//   a_t = exp(g_t + gk_t),  b_t = exp(gv_t),  c = exp(g_gamma[h])
// With `normalize`: n_t = diag(a_t) n_{t-1} c + k_t (from zero), o_t /= (scale q_t)^T n_t + eps.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace reference {

struct Recurrent {
  int B = 1, T = 0, H = 1, H_kv = 1, K = 1, V = 1;
  std::vector<double> q, k, v;        // [B,T,H,K], [B,T,H_kv,K], [B,T,H_kv,V]
  // Grouped value heads (fla's GVA): gva_heads > 0 gives q and k that many heads and v H (a multiple).
  int gva_heads = 0;
  std::vector<double> g, gk, gv;      // empty, or [B,T,H,K], [B,T,H,K], [B,T,H,V]
  std::vector<double> g_gamma;        // empty, [H], or [B,H]
  double scale = 1.0;
  std::vector<double> initial_state;  // empty, or [N,H,K,V]
  std::vector<std::int64_t> cu_seqlens;  // empty, or [N+1] with B = 1
  bool reverse = false;
  bool normalize = false;
  double eps = 1e-10;
};

struct RecurrentOutput {
  std::vector<double> o;            // [B,T,H,V]
  std::vector<double> final_state;  // [N,H,K,V]
};

inline RecurrentOutput recurrent(const Recurrent& p) {
  const int B = p.B, T = p.T, H = p.H, K = p.K, V = p.V;
  const int Hq = p.gva_heads ? p.gva_heads : H, Hk = p.gva_heads ? p.gva_heads : p.H_kv, Hv = p.gva_heads ? H : p.H_kv;
  // Sequences as (batch row, first token, end token).
  struct Sequence { int b, begin, end; };
  std::vector<Sequence> sequences;
  if (p.cu_seqlens.empty()) {
    for (int b = 0; b < B; ++b) sequences.push_back({b, 0, T});
  } else {
    for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n)
      sequences.push_back({0, int(p.cu_seqlens[n]), int(p.cu_seqlens[n + 1])});
  }
  const int N = int(sequences.size());

  RecurrentOutput out;
  out.o.assign(std::size_t(B) * T * H * V, 0.0);
  out.final_state.assign(std::size_t(N) * H * K * V, 0.0);
  for (int n = 0; n < N; ++n) {
    const int b = sequences[n].b;
    for (int h = 0; h < H; ++h) {
      std::vector<double> S(std::size_t(K) * V, 0.0), z(K, 0.0);
      if (!p.initial_state.empty())
        for (int i = 0; i < K * V; ++i) S[i] = p.initial_state[(std::size_t(n) * H + h) * K * V + i];
      double log_c = 0.0;
      if (!p.g_gamma.empty()) log_c = p.g_gamma.size() == std::size_t(H) ? p.g_gamma[h] : p.g_gamma[b * H + h];

      const int length = sequences[n].end - sequences[n].begin;
      for (int step = 0; step < length; ++step) {
        const int t = p.reverse ? sequences[n].end - 1 - step : sequences[n].begin + step;
        const std::size_t qh = (std::size_t(b) * T + t) * H + h;                 // [b,t,h] among H heads (o, gates)
        const std::size_t qq = (std::size_t(b) * T + t) * Hq + h * Hq / H;      // q's head
        const std::size_t kh = (std::size_t(b) * T + t) * Hk + h * Hk / H;      // k's head
        const std::size_t vh = (std::size_t(b) * T + t) * Hv + h * Hv / H;      // v's head
        for (int i = 0; i < K; ++i) {
          double log_a = log_c;
          if (!p.g.empty()) log_a += p.g[qh * K + i];
          if (!p.gk.empty()) log_a += p.gk[qh * K + i];
          for (int j = 0; j < V; ++j) {
            const double log_b = p.gv.empty() ? 0.0 : p.gv[qh * V + j];
            S[i * V + j] = std::exp(log_a + log_b) * S[i * V + j] + p.k[kh * K + i] * p.v[vh * V + j];
          }
          z[i] = std::exp(log_a) * z[i] + p.k[kh * K + i];
        }
        double denominator = 0.0;
        for (int i = 0; i < K; ++i) denominator += p.scale * p.q[qq * K + i] * z[i];
        for (int j = 0; j < V; ++j) {
          double o = 0.0;
          for (int i = 0; i < K; ++i) o += p.scale * p.q[qq * K + i] * S[i * V + j];
          out.o[qh * V + j] = p.normalize ? o / (denominator + p.eps) : o;
        }
      }
      for (int i = 0; i < K * V; ++i) out.final_state[(std::size_t(n) * H + h) * K * V + i] = S[i];
    }
  }
  return out;
}

}  // namespace reference
