// The elementwise kernels of the recurrent backward on the GPU, in CUDA C++. The backward runs by
// composition (ops/gpu_backward.cpp): these kernels turn the call's inputs into the slots (q times
// the scale, the k and v features, the log decays and the decays shifted one step), three
// recurrences of the plain form run on the forward's kernels, then these kernels sum the decays'
// gradients back along the sequence and apply the chain rule through ir::derivative of each slot's
// expression, so that a gate written as logsigmoid(x) / tau gets dx and dtau from generated code.
//
// Every kernel of this file walks steps (the recurrence's order: t = bos + s, or eos - 1 - s when
// reversed) in blocks of backward_chunk steps: grid (chunks of the longest sequence, N * H), block
// (threads: one per key feature and one per value feature, backward_threads(K, V)). Slot tensors
// are contiguous [B,T,H,K] or [B,T,H,V] (B = 1 with cu_seqlens), row r = (b * T + t) * H + h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include "../kernel.h"

namespace ladle::cuda {

inline constexpr int backward_chunk = 64;  // steps per block of the elementwise kernels
// ladle_bwd_block_bf16's limits and shared memory (plain_backward.cuh's LADLE_BLOCK_FEATURES and
// LADLE_BLOCK_SHARED; codegen-cuda_backward holds them equal).
inline constexpr int backward_block_features = 128;
inline constexpr int backward_block_shared = 112128;
inline constexpr int backward_block_keys = 64;  // key features a block (grid z: ceil(K / 64))
// The block size: one thread per feature of the wider side, whole warps. Throws InvalidArgument
// past 1024 features.
unsigned backward_threads(std::int64_t key_dim, std::int64_t value_dim);

enum class BackwardPhase {
  // The slots at every token: qs = q_feature * scale, kf, vf and do (slot_type); the log decays
  // log_a (key side, head decay included) and log_b (value side) and the same shifted one step
  // along the recurrence (the next step's; 0 at a sequence's last step), fp32.
  slots,
  // Each block's sums of the decays' per-step terms, (scale q_feature) . u - k_feature . dk per key
  // feature and o . do - v . dv per value feature (the slots recomputed in fp32 from the inputs).
  totals,
  // The chain rule: the slots' gradients (from the recurrences' outputs u = S do, dk = dS v,
  // dv = dS^T k, the forward's o, and the decays' running sums that start from `carry`) times the
  // derivative of each slot's expression by each tensor input, written to the inputs' gradients
  // (fp32; added atomically where several query heads or tokens share an element).
  chain,
};
const char* to_string(BackwardPhase phase);

struct BackwardKernelSpec : KernelTypes {  // input_types, reverse, varlen (cu_seqlens i64)
  BackwardPhase phase = BackwardPhase::slots;
  DType slot_type = DType::bf16;     // qs, kf, vf, do
  DType d_output_type = DType::f32;  // the caller's d_output
  // A per-call scale (absent, a constant or a scalar input) is folded into the recurrences: qs holds
  // q_feature alone and u holds scale * S do. Else qs = q_feature * scale_t and u = S do.
  bool fold_scale = false;
  // slots: the slot tensors written; a slot that is exactly one of the call's tensors in the
  // recurrences' layout is read from it instead. log_a is the key side's decay, a head decay added
  // where there is both; a head decay alone is log_h [B,T,H] and log_h_next (always written).
  bool write_q = true, write_k = true, write_v = true, write_do = true, write_log_a = true, write_log_b = true;
  DType log_a_next_type = DType::f32, log_b_next_type = DType::f32;
  bool write_first = false;  // first_decay [N,H,K+V]: the total log decays at each sequence's first step
  // chain: the recurrences wrote the gradient of q (u), k (dk) or v (dv) into the caller's tensor
  // (the slot is exactly that input, with every query head); the chain adds the other slots' parts.
  bool direct_q = false, direct_k = false, direct_v = false;
  // The update forms (the delta rule, gated delta, KDA; a read before the update with a bonus, RWKV6),
  // whose recurrence runs in ladle_bwd_update (codegen/cuda/update_backward.h), not by composition:
  //   slots writes fp32 qs = q_feature (unscaled), kf, vf, dos, log_a [rows,K] (the key side's log
  //     decay, a head decay added) or log_h [rows] (a head decay alone), scale_s [rows] (a scale that
  //     is not per call), beta_s [rows] (write_strength), bonus_s [rows,K];
  //   chain reads the slots' gradients in the same layout (gq, gk, gv, ga or gh, gscale, gbeta,
  //     gbonus, fp32) and applies the chain rule into every input's gradient.
  // The write_* and direct_* flags, slot_type and the next-step decays do not apply (fp32, all written).
  bool update_form = false;
};

struct BackwardKernel {
  std::string name;                       // the extern "C" symbol
  std::string source;
  std::vector<KernelParam> params;        // the variant's inputs (data, strides, heads), first
  // Then these, by what a launcher passes: the C name, except for the gradients of the inputs:
  // "d/<input name>" (float*) and "d/<input name>/sb", "/st", "/sh", "/sd" (its strides in the
  // canonical [B,T,X,D] / [B,T,X] / [B,X] layout, 0 for a dimension it lacks).
  std::vector<std::string> extra_params;
  std::vector<std::string> extra_types;  // their C types, in the same order
};

// Everything in a spec that changes the source (with the variant's hash: a kernel's name and cache key).
std::string backward_spec_key(const BackwardKernelSpec& spec);

// Throws InvalidArgument for a malformed or normalised variant, input_types of the wrong length, or
// an input read on the other side than its kind (a key-width input in a value-side slot).
BackwardKernel generate_backward(const ir::Variant& variant, const BackwardKernelSpec& spec);

// The kernels that do not depend on the variant, in one source (compiled once per arch):
//   ladle_bwd_carry: per (sequence, head, feature), the sum over every later block of the
//     sequence plus sum(d_final * S_T) -> carry (what the chain's running sums start from);
//   ladle_bwd_carry_states: the same carries from the states at the blocks' boundaries: per block,
//     factor sum of S_e . A_(e+1) dS_(e+1) B_(e+1) by row (key side) and by column (value side), S_e the
//     forward's state after the block and dS_(e+1) the gradient that reaches it, from tables of the
//     segmented form's entry states (gpu::run_entry_states), with only fp32 rounding: no sum over
//     later blocks, whose bf16-rounded terms cancel;
//   ladle_bwd_initial: d initial_state = factor exp(log_a_0) dS_0 exp(log_b_0) (first_decay);
//   ladle_bwd_convert_<f32|bf16|f16>: a strided [N,H,R,C] state times a factor to fp32 [N,H,R,C] and
//     [N,H,C,R].
// Their parameters are listed in the source.
std::string backward_helpers_source();
// One of them alone, in a program of its own (named as the kernel): what the launcher compiles, so that
// a call compiles only the helpers it launches, each in about a tenth of all of them's NVRTC time.
// Throws InvalidArgument for a name not in backward_helper_names().
std::string backward_helper_source(const std::string& name);
const std::vector<std::string>& backward_helper_names();

// The plain form's block kernel, in a source of its own (a compile of about a second, which a cold call
// runs beside the helpers' instead of after them):
//   ladle_bwd_block_bf16 (codegen/device/plain_backward.cuh): u = scale S_t do_t and dk = dS_t v_t of
//     the plain form with a key-side or head decay, a block of backward_chunk steps at a time, from the
//     states at the blocks' boundaries (the tables ladle_bwd_carry_states reads), in fp32 from one set
//     of products, so that the decays' gradients (sums of qs . u - kf . dk, whose terms inside a block
//     cancel) keep fp32 precision; bf16 slots, K and V up to backward_block_features; grid (C, N H,
//     ceil(K / backward_block_keys)), 256 threads, backward_block_shared bytes of dynamic shared memory;
std::string backward_block_source();

}  // namespace ladle::cuda
