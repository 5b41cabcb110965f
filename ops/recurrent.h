// recurrent attention (docs/operations.md):
//   S_t = diag(exp(g_t + gk_t)) S_{t-1} diag(exp(gv_t)) exp(g_gamma[h]) + k_t v_t^T
//   o_t = (scale q_t)^T S_t
// q [B,T,H,K]; k [B,T,H_kv,K] and v [B,T,H_kv,V] with H_kv dividing H (GQA), or grouped value
// heads (q, k [B,T,H,K], v [B,T,HV,V], HV a multiple of H: then o, gates and states take HV); g, gk
// [B,T,H,K]; gv [B,T,H,V]; g_gamma [H] or [B,H]; every gate optional and in log space.
// scale defaults to 1/sqrt(K). Inputs f32, f16 or bf16; state and accumulation fp32; o in
// the dtype of q. With cu_seqlens [N+1] the batch is 1 (inputs [1,T,H,D] or [T,H,D]) and
// each sequence runs from its own initial_state[n] to its own final_state[n].
// The op is a DSL expression: read(scan(k, v).decay_k(g).decay_k(gk).decay_v(gv)
// .decay_head(g_gamma), q, scale), with the absent gates left out.
#pragma once

#include <optional>
#include <string_view>

#include "variant.h"

namespace ladle {

struct RecurrentOptions {
  std::optional<TensorView> g;              // [B,T,H,K]
  std::optional<TensorView> g_gamma;        // [H] or [B,H]
  std::optional<TensorView> gk;             // [B,T,H,K]
  std::optional<TensorView> gv;             // [B,T,H,V]
  std::optional<float> scale;               // default 1/sqrt(K)
  std::optional<TensorView> initial_state;  // [N,H,K,V]
  bool reverse = false;
  std::optional<TensorView> cu_seqlens;     // [N+1], i32 or i64
  bool return_state = false;                // final_state [N,H,K,V] f32
  Backend backend = Backend::automatic;     // GPU when there is one or a tensor is device memory, else CPU
  GpuOptions gpu;                           // stream, and whether host tensors may be uploaded
  Algorithm algorithm = Algorithm::automatic;  // GPU family: chunked by shape and dtype, or forced
  std::optional<cuda::ChunkedTile> chunked_tile;  // the chunked family's tile on the GPU (serial or split form); empty: tuned/heuristic
  GateGradients gate_gradients = GateGradients::boundary_blocks;  // the GPU backward's (variant.h)
  // The chunked serial form cut into segments of at most this many tokens (> 0), run in parallel
  // and joined through their states; 0: never; empty: where few long sequences leave SMs idle.
  std::optional<std::int64_t> chunked_segment_tokens;
};

// The variant of a named op by name, with gates named as in the tools' --gates flag:
// "recurrent" with any of g,gk,gv,g_gamma (comma-separated); "gla" (always g) with an
// optional g_gamma; "delta_rule" and "gated_delta_rule" with an optional l2norm (q and k
// L2-normalised in the kernel); "rwkv6"; "kda" with l2norm, gate (the decay formed in the kernel), dt_bias
// and sigmoid (beta's in the kernel) (update_forms.h). Unknown ops or gates throw
// InvalidArgument naming them.
const ir::Variant& named_variant(std::string_view op, std::string_view gates = "");

RecurrentResult recurrent(const TensorView& q, const TensorView& k, const TensorView& v,
                          const RecurrentOptions& options = {});
// Writes into caller-owned outputs (o, and final_state when given or asked for).
void recurrent_into(const TensorView& q, const TensorView& k, const TensorView& v,
                    const RecurrentOptions& options, const RecurrentOutputs& outputs);

// Training: the forward of recurrent(), keeping what its backward needs (variant.h,
// run_variant_for_backward); then ladle::run_variant_backward(forward.saved, d_o[, d_final_state])
// gives dq, dk, dv, d initial_state and the gates' gradients by their names here ("g", "gk", "gv",
// "g_gamma"), each in the shape its gate was given in. The same options as recurrent().
//   auto forward = ladle::recurrent_for_backward(q, k, v, {.g = g});
//   auto grads = ladle::run_variant_backward(forward.saved, d_o);  // grads.inputs.at("g")
RecurrentForward recurrent_for_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const RecurrentOptions& options = {});

// The lowered expression recurrent() runs for this set of gates (for dumps and codegen).
const ir::Variant& recurrent_variant(bool g, bool gk, bool gv, bool g_gamma);

}  // namespace ladle
