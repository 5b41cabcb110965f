// The canonical, already checked arguments of one softmax-attention call, as every backend
// reads them (the CPU path here in codegen, the GPU launcher in ops): fixed ranks, broadcast
// axes with stride 0, the packed-sequence offsets on the host. ops/attention_bind.h builds it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ladle/tensor/tensor_view.h>

namespace ladle::cpu {

// Pointers are whatever the caller gave (host for the CPU path, device for the GPU path).
// Under cu_seqlens, pair inputs are indexed by packed positions ([1,H,total_q,total_k]).
struct AttentionArgs {
  bool packed = false;                  // q was [T,H,D] (with cu_seqlens)
  DType type = DType::f32;  // of q, k, v and o
  std::int64_t B = 0;                   // batch (1 under cu_seqlens)
  std::int64_t N = 0;                   // sequences: B, or the number of packed sequences
  std::int64_t Tq = 0, Tk = 0;          // tokens of q and of k/v (totals under cu_seqlens)
  std::int64_t H = 0, H_kv = 0, D = 0, Dv = 0;
  TensorView q, k, v;                   // [B,Tq,H,D], [B,Tk,H_kv,D], [B,Tk,H_kv,Dv]
  // Per variant input, index-aligned with variant.inputs: q, k, v again; pair inputs as
  // [B,H,Tq,Tk] (stride 0 on broadcast axes); per-head inputs as [B,H]; scalars in `scalars`.
  std::vector<TensorView> tensors;
  std::vector<float> scalars;
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k;  // [N+1] each, or both empty
  std::optional<TensorView> q_segment_ids, kv_segment_ids;  // [B,Tq], [B,Tk] i32/i64
  std::optional<TensorView> softmax_aux;                    // [H,S] (stride 0 on H for [S])
  std::int64_t sinks = 0;                                   // S
  std::int64_t window_left = -1, window_right = -1;         // -1: unbounded
  float dropout_p = 0;
  std::uint64_t seed = 0;
  int threads = 0;
  TensorView o;                   // [B,Tq,H,Dv]
  std::optional<TensorView> lse;  // [B,H,Tq] f32 (packed: [1,H,total_q])

  // o as the caller sees it: [B,Tq,H,Dv], or [Tq,H,Dv] when packed.
  std::vector<std::int64_t> output_shape() const {
    if (packed) return {Tq, H, Dv};
    return {B, Tq, H, Dv};
  }
  // lse as the caller sees it: [B,H,Tq], or [H,Tq] when packed.
  std::vector<std::int64_t> lse_shape() const {
    if (packed) return {H, Tq};
    return {B, H, Tq};
  }
  // Sequence n's first token and length, of q and of k.
  std::int64_t q_begin(std::int64_t n) const { return cu_seqlens_q.empty() ? 0 : cu_seqlens_q[n]; }
  std::int64_t k_begin(std::int64_t n) const { return cu_seqlens_k.empty() ? 0 : cu_seqlens_k[n]; }
  std::int64_t q_length(std::int64_t n) const { return cu_seqlens_q.empty() ? Tq : cu_seqlens_q[n + 1] - cu_seqlens_q[n]; }
  std::int64_t k_length(std::int64_t n) const { return cu_seqlens_k.empty() ? Tk : cu_seqlens_k[n + 1] - cu_seqlens_k[n]; }
  // The longest sequence's length, of q and of k (a launch's grid covers it).
  std::int64_t longest_q() const { return longest(cu_seqlens_q, Tq); }
  std::int64_t longest_k() const { return longest(cu_seqlens_k, Tk); }
  // The batch row of sequence n (0 when packed).
  std::int64_t batch_of(std::int64_t n) const { return cu_seqlens_q.empty() ? n : 0; }

 private:
  static std::int64_t longest(const std::vector<std::int64_t>& offsets, std::int64_t whole) {
    if (offsets.empty()) return whole;
    std::int64_t most = 0;
    for (std::size_t n = 0; n + 1 < offsets.size(); ++n) most = offsets[n + 1] - offsets[n] > most ? offsets[n + 1] - offsets[n] : most;
    return most;
  }
};

}  // namespace ladle::cpu
