// The fp64 oracle of softmax attention (docs/operations.md; docs/design.md: correctness): a direct loop over the
// equations, in double, on dense row-major arrays. It shares no code with ladle, so that a
// bug in the library cannot hide in both. Per sequence, query head h (kv head h / (H/H_kv)),
// query row i and key j, with d = Tk - Tq the offset that aligns the last query with the
// last key:
//   s_ij = scale · q_iᵀ k_j;  s += bias_ij;  s = cap · tanh(s / cap);  s = score_mod(s, b, h, i, j)
//   kept when: j <= i + d (causal); i + d - left <= j <= i + d + right (window, -1 unbounded);
//              mask_ij; q_segment_i == kv_segment_j; keep(b, h, i, j)
//   lse_i = log(Σ_kept exp(s_ij) + Σ_s exp(sink_hs));  p_ij = exp(s_ij - lse_i)
//   o_i = Σ_kept dropout(p_ij) v_j, dropout keeping p_ij / (1 - p) when u_ij >= p
// A row with nothing kept and no sinks gets o = 0 and lse = -inf. Everything is given dense:
// a test expands broadcast shapes before it fills this struct.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace reference {

struct Attention {
  int B = 1, Tq = 0, Tk = 0, H = 1, H_kv = 1, D = 1, Dv = 1;
  std::vector<double> q, k, v;         // [B,Tq,H,D], [B,Tk,H_kv,D], [B,Tk,H_kv,Dv]
  double scale = 1.0;
  std::vector<double> bias;            // empty, or [B,H,Tq,Tk]
  double soft_cap = 0;                 // 0: none
  // Applied last, on the biased and capped score. Under cu_seqlens b is the sequence index
  // and i, j count from that sequence's start (as for dropout).
  std::function<double(double s, int b, int h, int i, int j)> score_mod;
  bool causal = false;
  bool window = false;
  std::int64_t window_left = -1, window_right = -1;  // -1: unbounded on that side
  std::vector<bool> mask;              // empty, or [B,H,Tq,Tk]; true: attend
  std::vector<std::int64_t> q_segment_ids, kv_segment_ids;  // empty, or [B,Tq] and [B,Tk]
  std::function<bool(int b, int h, int i, int j)> keep;     // same indices as score_mod
  int S = 0;
  std::vector<double> sinks;           // [H,S] when S > 0
  double dropout_p = 0;
  std::uint64_t seed = 0;
  // Packed sequences (B = 1): q token t of sequence n is cu_seqlens_q[n] + i. bias, mask and
  // segment ids stay indexed by the packed token positions.
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k;
};

struct AttentionOutput {
  std::vector<double> o;    // [B,Tq,H,Dv]
  std::vector<double> lse;  // [B,H,Tq] (packed: [H,total_q])
};

// The uniform in [0,1) that decides dropout of element (sequence, head, i, j): the
// splitmix64 finaliser over the seed mixed with the four indices, top 24 bits.
inline double dropout_uniform(std::uint64_t seed, std::uint64_t sequence, std::uint64_t head, std::uint64_t i,
                              std::uint64_t j) {
  std::uint64_t x = seed ^ (sequence * 0x9E3779B97F4A7C15ull) ^ (head * 0xC2B2AE3D27D4EB4Full) ^
                    (i * 0x165667B19E3779F9ull) ^ (j * 0xD6E8FEB86659FD93ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x = x ^ (x >> 31);
  return static_cast<double>(x >> 40) / 16777216.0;
}

inline AttentionOutput attention(const Attention& p) {
  const int H = p.H, D = p.D, Dv = p.Dv, group = p.H / p.H_kv;
  // Sequences as (batch row, first query, query count, first key, key count).
  struct Sequence { int b, q0, nq, k0, nk; };
  std::vector<Sequence> sequences;
  if (p.cu_seqlens_q.empty()) {
    for (int b = 0; b < p.B; ++b) sequences.push_back({b, 0, p.Tq, 0, p.Tk});
  } else {
    for (std::size_t n = 0; n + 1 < p.cu_seqlens_q.size(); ++n)
      sequences.push_back({0, int(p.cu_seqlens_q[n]), int(p.cu_seqlens_q[n + 1] - p.cu_seqlens_q[n]),
                           int(p.cu_seqlens_k[n]), int(p.cu_seqlens_k[n + 1] - p.cu_seqlens_k[n])});
  }
  const double inf = std::numeric_limits<double>::infinity();

  AttentionOutput out;
  out.o.assign(std::size_t(p.B) * p.Tq * H * Dv, 0.0);
  out.lse.assign(std::size_t(p.B) * H * p.Tq, -inf);
  for (std::size_t n = 0; n < sequences.size(); ++n) {
    const Sequence& seq = sequences[n];
    const int b = seq.b, offset = seq.nk - seq.nq;
    // The index handed to user functions and the dropout hash: the batch row, or the sequence.
    const int id = p.cu_seqlens_q.empty() ? b : int(n);
    for (int h = 0; h < H; ++h) {
      const int hk = h / group;
      for (int i = 0; i < seq.nq; ++i) {
        const int tq = seq.q0 + i;
        std::vector<double> s(seq.nk, 0.0);
        std::vector<bool> kept(seq.nk, false);
        for (int j = 0; j < seq.nk; ++j) {
          const int tk = seq.k0 + j;
          const std::size_t pair = ((std::size_t(b) * H + h) * p.Tq + tq) * p.Tk + tk;  // [b,h,tq,tk]
          bool keep = true;
          if (p.causal && j > i + offset) keep = false;
          if (p.window && p.window_left >= 0 && j < i + offset - p.window_left) keep = false;
          if (p.window && p.window_right >= 0 && j > i + offset + p.window_right) keep = false;
          if (!p.mask.empty() && !p.mask[pair]) keep = false;
          if (!p.q_segment_ids.empty() &&
              p.q_segment_ids[std::size_t(b) * p.Tq + tq] != p.kv_segment_ids[std::size_t(b) * p.Tk + tk])
            keep = false;
          if (p.keep && !p.keep(id, h, i, j)) keep = false;
          kept[j] = keep;
          if (!keep) continue;
          double dot = 0.0;
          for (int d = 0; d < D; ++d)
            dot += p.q[((std::size_t(b) * p.Tq + tq) * H + h) * D + d] *
                   p.k[((std::size_t(b) * p.Tk + tk) * p.H_kv + hk) * D + d];
          double score = p.scale * dot;
          if (!p.bias.empty()) score += p.bias[pair];
          if (p.soft_cap > 0) score = p.soft_cap * std::tanh(score / p.soft_cap);
          if (p.score_mod) score = p.score_mod(score, id, h, i, j);
          s[j] = score;
        }

        // log Σ exp over the kept scores and the sinks, shifted by their maximum.
        double m = -inf;
        for (int j = 0; j < seq.nk; ++j)
          if (kept[j]) m = std::max(m, s[j]);
        for (int t = 0; t < p.S; ++t) m = std::max(m, p.sinks[std::size_t(h) * p.S + t]);
        if (m == -inf) continue;  // nothing to attend to: o stays 0, lse -inf
        double sum = 0.0;
        for (int j = 0; j < seq.nk; ++j)
          if (kept[j]) sum += std::exp(s[j] - m);
        for (int t = 0; t < p.S; ++t) sum += std::exp(p.sinks[std::size_t(h) * p.S + t] - m);
        const double lse = m + std::log(sum);
        out.lse[(std::size_t(b) * H + h) * p.Tq + tq] = lse;

        double* o = &out.o[((std::size_t(b) * p.Tq + tq) * H + h) * Dv];
        for (int j = 0; j < seq.nk; ++j) {
          if (!kept[j]) continue;
          double weight = std::exp(s[j] - lse);
          if (p.dropout_p > 0)
            weight = dropout_uniform(p.seed, id, h, i, j) >= p.dropout_p ? weight / (1.0 - p.dropout_p) : 0.0;
          for (int e = 0; e < Dv; ++e)
            o[e] += weight * p.v[((std::size_t(b) * p.Tk + seq.k0 + j) * p.H_kv + hk) * Dv + e];
        }
      }
    }
  }
  return out;
}

}  // namespace reference
