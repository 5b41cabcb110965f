// softmax attention (docs/operations.md), the reference library's `attention` op:
//   s_ij = scale · q_iᵀ k_j (+ bias_ij);  s = cap · tanh(s / cap) with logits_soft_cap
//   masked out: j > i + (Tk - Tq) under causal; outside sliding_window (left, right) around
//   that same diagonal; false entries of attention_mask; different segment ids
//   p_i = softmax_j(s_ij), with sinks (softmax_aux [H,S] or [S]) adding S logits to the
//   denominator only;  o_i = Σ_j dropout(p_ij) v_j
// q [B,Tq,H,D], k [B,Tk,H_kv,D], v [B,Tk,H_kv,Dv] with H_kv dividing H (GQA). Inputs f32,
// f16 or bf16; scores, softmax and accumulation in fp32 (on the GPU with f16 / bf16 inputs, tanh
// in score expressions is the hardware's tanh.approx, relative error 2^-11); o [B,Tq,H,Dv] in q's
// dtype. With
// cu_seqlens_q / cu_seqlens_k [N+1] the batch is 1 (inputs [1,T,H,D] or [T,H,D]) and each
// sequence attends only within itself. A query row with no key left after masking gives
// o = 0 (and lse = -inf without sinks).
//
// The op is a DSL expression (dsl/softmax.h): softmax(soft_cap(score * scale + bias, cap))
// .causal().sliding_window().mask(attention_mask != 0).segment_ids().sinks().dropout(),
// with the absent parts left out; run_attention runs any such expression a user writes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <ladle/dsl/attention_ir.h>

#include <ladle/runtime/tensor.h>
#include "variant.h"

namespace ladle {

// Dropout keeps p_ij when u >= dropout_p, where u in [0,1) comes from the seed and the
// element's (sequence, query head, i, j), and scales kept values by 1 / (1 - dropout_p):
//   x = seed ^ (sequence * 0x9E3779B97F4A7C15) ^ (head * 0xC2B2AE3D27D4EB4F)
//         ^ (i * 0x165667B19E3779F9) ^ (j * 0xD6E8FEB86659FD93)        (mod 2^64)
//   x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9; x = (x ^ (x >> 27)) * 0x94D049BB133111EB;
//   x = x ^ (x >> 31);  u = (x >> 40) * 2^-24
// i and j count from each sequence's start; the same seed gives the same result everywhere.
double dropout_uniform(std::uint64_t seed, std::uint64_t sequence, std::uint64_t head, std::uint64_t i,
                       std::uint64_t j);

// The run-time parts of an attention call: what changes between calls of one kernel.
struct AttentionRunOptions {
  // sliding window (left, right) in keys before / after the diagonal; -1: unbounded. Used
  // when the variant has a window.
  std::int64_t window_left = -1, window_right = -1;
  std::optional<TensorView> q_segment_ids;   // [B,Tq] i32/i64, when the variant has segment ids
  std::optional<TensorView> kv_segment_ids;  // [B,Tk]
  std::optional<TensorView> softmax_aux;     // [H,S] or [S], when the variant has sinks
  std::optional<TensorView> cu_seqlens_q;    // [N+1] i32/i64: packed query sequences
  std::optional<TensorView> cu_seqlens_k;    // [N+1]: packed key sequences (both or neither)
  float dropout_p = 0;                       // in [0, 1), when the variant has dropout
  std::uint64_t seed = 0;
  bool return_lse = false;                   // also return lse [B,H,Tq] f32 (varlen: [H,total_q])
  int threads = 0;                           // CPU threads; 0: one per hardware thread
  Backend backend = Backend::automatic;
  GpuOptions gpu;                            // stream, and whether host tensors may be uploaded
  // run_attention_for_backward: keep a fingerprint of the saved tensors' contents and refuse a
  // backward whose tensors changed since (device tensors hashed on the device: a few kernels and one
  // wait for the stream at the forward and again at the backward). Off where the caller guards them
  // itself, as PyTorch's autograd does with its version counters (the Python entry turns it off).
  bool check_saved = true;
};

// Outputs live where q lives: device memory when q is device memory, else the host.
struct AttentionResult {
  Tensor o;                   // [B,Tq,H,Dv] (the rank of q), q's dtype
  std::optional<Tensor> lse;  // natural-log log-sum-exp of the scores (sinks included)
};

struct AttentionOutputs {
  TensorView o;
  std::optional<TensorView> lse;  // required when return_lse
};

// Runs any softmax-attention variant built with the DSL: q, k, v by position, every further
// input (pair tensors [B,H,Tq,Tk] broadcastable, per-head [H] or [B,H], scalars) by name.
AttentionResult run_attention(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k,
                              const TensorView& v, const VariantInputs& inputs = {},
                              const AttentionRunOptions& options = {});
void run_attention_into(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k,
                        const TensorView& v, const VariantInputs& inputs, const AttentionRunOptions& options,
                        const AttentionOutputs& outputs);

struct AttentionOptions {
  std::optional<float> scale;                 // default 1/sqrt(D)
  std::optional<TensorView> bias;             // float, broadcastable to [B,H,Tq,Tk]
  std::optional<float> logits_soft_cap;       // > 0
  bool causal = false;
  std::optional<std::pair<std::int64_t, std::int64_t>> sliding_window;  // (left, right), -1 unbounded
  std::optional<TensorView> attention_mask;   // u8 (nonzero: attend) or float (nonzero), broadcastable to [B,H,Tq,Tk]
  std::optional<TensorView> q_segment_ids;    // [B,Tq] i32/i64 (with kv_segment_ids)
  std::optional<TensorView> kv_segment_ids;   // [B,Tk]
  std::optional<TensorView> softmax_aux;      // [H,S] or [S]: sinks
  std::optional<TensorView> cu_seqlens_q;     // [N+1]
  std::optional<TensorView> cu_seqlens_k;     // [N+1]
  float dropout_p = 0;
  std::uint64_t seed = 0;
  bool return_lse = false;
  int threads = 0;
  Backend backend = Backend::automatic;
  GpuOptions gpu;
  bool check_saved = true;  // attention_for_backward: as AttentionRunOptions::check_saved
};

// What the backward of an attention call needs, held by the caller: the call's arguments (views,
// host or device memory as they were given: the caller keeps those tensors alive and unchanged until
// the backward; unless options.check_saved is off, a fingerprint of their contents is checked, for
// device tensors by a hash on the device read back on options.gpu.stream at the forward and again at
// the backward: ops/detail/fingerprint.h). The CPU backward forms the logits and the softmax again from them.
struct AttentionSaved {
  ir::AttentionVariant variant;
  TensorView q, k, v;
  VariantInputs inputs;
  AttentionRunOptions options;
  std::uint64_t fingerprint = 0;
  bool valid = false;  // made by a forward
  // A forward that ran on the GPU keeps its o and lse (where q lives): the GPU backward reads them.
  std::shared_ptr<const Tensor> o, lse;
};

struct AttentionForward {
  AttentionResult result;
  AttentionSaved saved;
};

// dL/dq, dL/dk, dL/dv (GQA: dk, dv summed over the query heads that share them), dL/d every
// tensor input the score expression reads (a bias, an ALiBi slope: by name, in the shape it was
// given in, summed over broadcast axes), dL/d softmax_aux (the sinks' logits). f32, where the
// forward's outputs live: device memory when q is device memory (after a GPU forward), else the host.
struct AttentionGradients {
  Tensor dq, dk, dv;
  std::map<std::string, Tensor> inputs;
  std::optional<Tensor> d_softmax_aux;
};

// The forward of run_attention, keeping what its backward needs, and the backward. Backend gpu (or
// automatic with a GPU or a device tensor) runs both on the GPU (gpu_attention_backward.h:
// head dims 8 to 256, q, k, v of f16, bf16 or f32, sm_80 on; backend gpu refuses anything else by name,
// automatic falls back to the CPU, and then refuses a device tensor by name); backend cpu runs both
// on the CPU. Host and device tensors are taken as run_attention takes them (options.gpu): on the
// GPU, device tensors are read in place on options.gpu.stream and host ones uploaded, or refused by
// name when upload_host_tensors is off; on the CPU a device tensor is refused by name. The backward
// reads d_output = dL/do ([B,Tq,H,Dv] or packed [Tq,H,Dv], any floating dtype) under the same rules,
// on the forward's stream (saved keeps the pointer: the stream must outlive it); on device tensors
// alone it waits for the stream once, for the fingerprint's copy of the saved tensors. Dropout drops
// the same elements in both (the keep mask is drawn again from the seed). Bad input throws
// InvalidArgument naming it: a d_output of the wrong shape or dtype, a saved value whose tensors
// changed.
AttentionForward run_attention_for_backward(const ir::AttentionVariant& variant, const TensorView& q, const TensorView& k,
                                            const TensorView& v, const VariantInputs& inputs = {},
                                            const AttentionRunOptions& options = {});
AttentionGradients run_attention_backward(const AttentionSaved& saved, const TensorView& d_output);

AttentionResult attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          const AttentionOptions& options = {});
// The named op's forward keeping what its backward (run_attention_backward) needs; d bias is
// gradients.inputs.at("bias").
AttentionForward attention_for_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const AttentionOptions& options = {});
void attention_into(const TensorView& q, const TensorView& k, const TensorView& v, const AttentionOptions& options,
                    const AttentionOutputs& outputs);

// The lowered expression attention() runs for these options (for dumps and codegen).
struct AttentionFeatures {
  bool bias = false, soft_cap = false, causal = false, window = false, mask = false, segment_ids = false,
       sinks = false, dropout = false;
  friend bool operator==(const AttentionFeatures&, const AttentionFeatures&) = default;
};
const ir::AttentionVariant& attention_variant(const AttentionFeatures& features);
// Parses the tools' --mask/--mods lists: "causal,window,mask,segments,sinks,dropout,bias,softcap"
// (comma-separated, any order); unknown names throw InvalidArgument listing the accepted ones.
AttentionFeatures parse_attention_features(std::string_view list);

}  // namespace ladle
