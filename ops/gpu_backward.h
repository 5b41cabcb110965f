// The recurrent backward on the GPU, by composition, for any variant the DSL lowers (normalised
// reads aside): generated kernels evaluate the slots at every token (codegen/cuda/backward.h), three
// recurrences of the plain form run on the forward's kernels (the chunked tensor-core family for
// 16-bit inputs of chunk-sized sequences, the fused-recurrent one otherwise, the slots then in fp32):
//   u_t = S_t do_t          over the transposed state, in the forward's direction;
//   dv_t = dS_t^T k_t       over dS, in the other direction, the decays shifted one step;
//   dk_t = dS_t v_t         the same, transposed;
// (and the forward's o again when there is a value-side decay), then generated kernels sum the log
// decays' gradients back along each sequence and apply the chain rule through ir::derivative of the
// slots' expressions. Nothing returns to the host between the kernels.
// The update forms (the delta rule, gated delta rule, KDA; a read before the update, RWKV6) are no
// composition of plain recurrences: the slots kernel writes their slots in fp32, ladle_bwd_update runs
// their recurrence backward from checkpoints in fp32 (codegen/cuda/update_backward.h), and the chain
// kernel takes the slots' gradients to the inputs'.
//   ladle::gpu::run_variant_backward_into(variant, q, k, v, inputs, options, d_o, std::nullopt, grads, {&stream});
#pragma once

#include <map>
#include <optional>
#include <string>

#include <ladle/codegen/cuda/backward.h>
#include <ladle/codegen/cuda/update_backward.h>

#include "generated_kernels.h"
#include "gpu_recurrent.h"

namespace ladle::gpu {

// Device-resident gradients (ladle::RecurrentGradientViews of variant.h), written by the call.
using RecurrentGradientViews = ladle::RecurrentGradientViews;

// The backward of gpu::run_variant_into with the same arguments (device views; options.cu_seqlens on
// the host, as there; ladle::run_variant_backward routes host and device tensors here), d_output
// [B,T,H,V] (or packed [T,H,V]) of any floating dtype and strides, and
// optionally d_final_state [N,H,K,V]. Bad input throws InvalidArgument naming it.
void run_variant_backward_into(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                               const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                               const std::optional<TensorView>& d_final_state, const RecurrentGradientViews& gradients,
                               const LaunchOptions& launch = {});

// dL/d initial_state alone, as run_variant_backward_into writes it (options.initial_state given, for its
// shape), without dq, dk, dv or the inputs' gradients: the slots and dS's recurrence only (about a
// forward's cost; the update forms: the slots and ladle_bwd_update, no chain). What a
// context-parallel backward exchanges (ops/context_parallel.h).
void run_initial_state_gradient(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                const VariantInputs& inputs, const RunOptions& options, const TensorView& d_output,
                                const std::optional<TensorView>& d_final_state, const TensorView& d_initial_state,
                                const LaunchOptions& launch = {});

// Generates and compiles (through the cache) the backward's two generated kernels for a call, without
// launching: what ladle-dump shows. arch empty: this GPU's.
struct CompiledBackward {
  cuda::BackwardKernel kernel;
  CompiledProgram program;
};
CompiledBackward compile_backward(const ir::Variant& variant, const cuda::BackwardKernelSpec& spec, const std::string& arch = "");
// One helper kernel (cuda::backward_helper_source: a program of its own), compiled through the cache.
CompiledProgram compile_backward_helper(const std::string& name, const std::string& arch = "");
// The plain form's block kernel ladle_bwd_block_bf16 (cuda::backward_block_source), compiled through
// the cache: a program of its own, so that a cold call compiles it beside the helpers.
CompiledProgram compile_backward_block(const std::string& arch = "");
// The update forms' kernels (ladle_bwd_update, or the chunked WY form's; codegen/cuda/update_backward.h)
// of a call: their spec (d_final: the call passes d_final_state; form: options.update_backward,
// which LADLE_UPDATE_BWD_FORM = recurrent or chunked overrides) and their program, compiled through
// the cache.
cuda::UpdateBackwardSpec update_backward_spec(const ir::Variant& variant, const ops::BoundInputs& bound, bool d_final,
                                              UpdateBackward form = UpdateBackward::automatic);
CompiledProgram compile_update_backward(const cuda::UpdateBackwardSpec& spec, const std::string& arch = "");
// The spec of a call's kernel of `phase` (the slots' dtype: q's when the recurrences run chunked).
cuda::BackwardKernelSpec backward_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options,
                                              cuda::BackwardPhase phase, DType d_output_type);
// The programs a call of the GPU backward compiles for `arch` (sm_90a, sm_80, ...), planned as the
// launcher plans them with the heuristic's tiles but with nothing allocated or launched and no GPU: the
// recurrences' chunked kernels (their chunk-states forms where they write the boundary states), the
// state passes left, the slots, totals and chain kernels, the update form's program, the helpers' and
// the block kernel's programs. The tensors need shapes and types only (data may be null). For
// ladle-cache prebuild --backward and ladle-dump; compile each with compile_generated.
std::vector<GeneratedKernel> backward_planned_kernels(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                                                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                                                      const TensorView& d_output, const std::optional<TensorView>& d_final_state,
                                                      const std::string& arch);
// Whether a call's backward takes u and dk from ladle_bwd_block_bf16 instead of their recurrences: the
// plain form with a key-side or head decay and no value-side one, no normalised read, bf16 slots (`slots`:
// the call's backward_kernel_spec for the slots phase), K and V at most cuda::backward_block_features,
// and options.gate_gradients boundary_blocks (the default).
bool backward_block_kernel(const ir::Variant& variant, const cuda::BackwardKernelSpec& slots, const RunOptions& options,
                           std::int64_t key_dim, std::int64_t value_dim);

}  // namespace ladle::gpu
