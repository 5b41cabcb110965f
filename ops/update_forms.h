// The variants whose update is not a diagonal decay plus k v^T (docs/operations.md: update
// forms), with fla's argument conventions. Each is a thin wrapper over its DSL expression:
//   delta_rule:        read(scan(k, v).delta(beta), q, scale)[.l2_normalized()]
//                      S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,  o_t = (scale q_t)^T S_t
//   gated_delta_rule:  read(scan(k, v).decay_head(g).delta(beta), q, scale)[.l2_normalized()]
//                      S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
//   rwkv6:             read_before(scan(k, v).decay_k(w), r, scale).bonus(u)
//                      o_t = (scale r_t)^T (S_{t-1} + diag(u) k_t v_t^T),  S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T
// Shapes: q (r) [B,T,H,K]; k [B,T,H_kv,K], v [B,T,H_kv,V] (H_kv divides H), or grouped value heads
// (fla's GVA: q, k [B,T,H,K], v [B,T,HV,V] with HV a multiple of H; o, beta, g, w, u, the states then
// take HV heads: docs/operations.md); beta and g [B,T,H];
// w [B,T,H,K] (log space); u [H,K] or [B,H,K]. With cu_seqlens [N+1] the batch is 1 (inputs
// [1,T,H,D] or [T,H,D]). scale defaults to 1/sqrt(K). Inputs f32, f16 or bf16; state and
// accumulation fp32; o in the dtype of q; states [N,H,K,V] f32.
#pragma once

#include <optional>

#include "variant.h"

namespace ladle {

struct UpdateFormOptions {
  std::optional<float> scale;               // default 1/sqrt(K)
  std::optional<TensorView> initial_state;  // [N,H,K,V]
  bool return_state = false;                // fla's output_final_state: final_state [N,H,K,V] f32
  std::optional<TensorView> cu_seqlens;     // [N+1], i32 or i64
  bool reverse = false;
  // fla's use_qk_l2norm_in_kernel: q and k divided by sqrt(sum over K of x^2 + 1e-6) first.
  // The delta rules only (rwkv6 refuses it).
  bool use_qk_l2norm_in_kernel = false;
  Backend backend = Backend::automatic;     // GPU when there is one or a tensor is device memory, else CPU
  GpuOptions gpu;                           // stream, and whether host tensors may be uploaded
  Algorithm algorithm = Algorithm::automatic;
  std::optional<cuda::RecurrentTile> tile;  // the fused-recurrent tile on the GPU; empty: tuned/heuristic
  UpdateBackward update_backward = UpdateBackward::automatic;  // the GPU backward's form (variant.h)
};

RecurrentResult delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                           const UpdateFormOptions& options = {});
void delta_rule_into(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                     const UpdateFormOptions& options, const RecurrentOutputs& outputs);

RecurrentResult gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                 const TensorView& beta, const UpdateFormOptions& options = {});
void gated_delta_rule_into(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                           const TensorView& beta, const UpdateFormOptions& options, const RecurrentOutputs& outputs);

RecurrentResult rwkv6(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w, const TensorView& u,
                      const UpdateFormOptions& options = {});
void rwkv6_into(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w, const TensorView& u,
                const UpdateFormOptions& options, const RecurrentOutputs& outputs);

// Kimi Delta Attention (KDA), with fla's chunk_kda arguments: the delta rule under a decay per key feature,
//   S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,   o_t = (scale q_t)^T S_t,
// g [B,T,H,K] in log space, beta [B,T,H]. With use_gate_in_kernel, g is the raw input and the decay is
// -exp(A_log) softplus(g + dt_bias) (A_log [H], dt_bias [H,K] or absent: fla's [H*K] viewed as [H,K]);
// with use_beta_sigmoid_in_kernel, beta is sigmoid(beta). The gate math is part of the expression, so
// the backward reaches A_log, dt_bias and the raw g and beta. Runs on the CPU path and, on the GPU, on
// the chunked delta kernels (per-feature gates; codegen/cuda/chunked_delta.h) or the fused-recurrent ones.
struct KdaOptions : UpdateFormOptions {
  bool use_gate_in_kernel = false;
  std::optional<TensorView> A_log;    // [H], with use_gate_in_kernel
  std::optional<TensorView> dt_bias;  // [H,K], with use_gate_in_kernel (optional)
  bool use_beta_sigmoid_in_kernel = false;
};
RecurrentResult kda(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g, const TensorView& beta,
                    const KdaOptions& options = {});

// Training: each op's forward, keeping what its backward needs (variant.h, run_variant_for_backward);
// then ladle::run_variant_backward(forward.saved, d_o[, d_final_state]) gives dq (dr), dk, dv,
// d initial_state and grads.inputs.at("beta"), "g", "w", "u", each in its input's shape, with q and k
// L2-normalised in it where use_qk_l2norm_in_kernel is set. It runs where the forward ran: on the CPU
// from checkpoints, on the GPU in the fused-recurrent form (codegen/cuda/update_backward.h; fp32,
// slow at training shapes: the chunked backward on the tensor cores is not built yet).
RecurrentForward delta_rule_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                                        const UpdateFormOptions& options = {});
RecurrentForward gated_delta_rule_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                              const TensorView& beta, const UpdateFormOptions& options = {});
RecurrentForward rwkv6_for_backward(const TensorView& r, const TensorView& k, const TensorView& v, const TensorView& w,
                                    const TensorView& u, const UpdateFormOptions& options = {});
// KDA's: the gradients "g", "beta", and "A_log", "dt_bias" where given.
RecurrentForward kda_for_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                                  const TensorView& beta, const KdaOptions& options = {});

// The lowered expressions the ops run (for dumps, codegen and the tools' --op).
const ir::Variant& delta_rule_variant(bool gated, bool l2_normalize_qk);
const ir::Variant& rwkv6_variant();
// KDA's expression: gate in the kernel (with dt_bias or not), beta's sigmoid in the kernel, L2.
const ir::Variant& kda_variant(bool gate_in_kernel, bool dt_bias, bool beta_sigmoid, bool l2_normalize_qk);

}  // namespace ladle
