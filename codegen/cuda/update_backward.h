// The update forms' recurrent backward on the GPU (the delta rule, the gated delta rule, KDA; a read
// before the update with a bonus, RWKV6; q and k L2-normalised in the kernel or not), in CUDA C++.
// The diagonal-decay form's backward composes plain recurrences (backward.h); these forms' state
// transitions are not diagonal (the delta rule) or their read is strictly causal (RWKV6), so their
// recurrence runs here, in fp32, from the slots the generated slots kernel wrote
// (BackwardKernelSpec::update_form), and the generated chain kernel takes the slots' gradients on
// to the inputs'.
//
// ladle_bwd_update (its device code in codegen/device/update_backward.cuh, a template the generated
// kernel instantiates with its form): grid (ceil(V / block_v), N * H), block 32 * ceil(K / 32) threads; thread i holds
// row i of the state's block_v columns (and of dS) in registers. Each block runs its sequence
// forward once, writing the state entering every 64-step chunk (ckpt), then the chunks backwards:
// the chunk's states again from its checkpoint (each thread keeps its own rows in `chunk`, scratch
// only it reads back), then its steps backwards. Per step, the sums over the state's rows
// (the delta rule's k^T S, dS's k^T dS) are one warp-transposing reduction and one exchange
// through shared memory. It writes per token, fp32, added atomically (the value slices each add
// theirs): dL/d qhat, dL/d khat (qhat = scale q / |q|, khat = k / |k| where L2-normalised, else
// scale q and k), dL/d log a per key feature (the decay of the state's rows), dL/d beta, dL/d bonus;
// dL/dv whole; and d initial_state.
//
// The chunked WY form (spec.chunked; codegen/device/wy_backward.cuh and wy_gradients.cuh): the delta
// rule, the gated delta rule and KDA (a per-feature decay) on the tensor cores, the same slots in and
// the same gradients out, in chunks of 64 tokens (the WY / UT form of chunked_delta.h). Three
// kernels, 256 threads each, `ckpt` their work arrays (bf16 tiles; wy_backward.cuh's LadleWyWork),
// `chunk` unused:
//   ladle_bwd_wy_prepare   (C, N H): every chunk at once: every tile the others read in bf16 (qhat,
//                          khat, e^(g_C - g) khat, e^g qhat, dO, v), the cumulative log decay g,
//                          M = (Q K^T . Gamma)_(t >= s), T = (I + L)^(-1) in 16 x 16 blocks in fp32, W, U;
//   ladle_bwd_wy_states    (ceil(V / 64), N H): the only serial pass, 64 value columns a block, the
//                          state (then dS) in shared memory in fp32: forward through the chunks (h, E),
//                          then backward from d_final (dh, dE), and d initial_state; each step's tiles
//                          fetched (cp.async) during the step before;
//   ladle_bwd_wy_gradients (C, N H): every chunk at once, the value width 64 columns at a time (the
//                          sums over the values in registers): dqhat, dkhat, dbeta, dv and the
//                          decay's written (a head decay's d log h into ga as [rows], d log h itself:
//                          the finish kernel takes no sum; a key decay's d log a [rows,K] as the
//                          recurrent form's), every token of a sequence; nothing atomic.
// A per-feature decay's products carry a reference per 16-token block (every factor at most 1, so
// strong decays and hard resets stay exact); its diagonal blocks run on the tensor cores in prepare
// where the block's log decay spans at most 60, else (and always in the gradients kernel) element by
// element.
// The products take bf16 operands with fp32 accumulators (fla's precision); the state, T and the
// gate and strength gradients' sums are fp32. A log decay below -110 counts as -110 (exp: 0 in fp32).
//
// ladle_bwd_update_finish (in backward_helpers_source): per token, dL/d qhat and dL/d khat to
// dL/d q_feature and dL/d k_feature through the normalisation and the scale, dL/d scale, and a head
// decay's dL/d log h as the sum over K.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ladle::cuda {

struct UpdateBackwardSpec {
  bool delta = true;           // the delta rule, read after its update; false: a read before an additive update
  bool key_decay = false;      // log_a [rows,K] (a head decay added)
  bool head_decay = false;     // log_h [rows], a head decay alone
  bool beta = false;           // beta_s [rows] (else 1)
  bool bonus = false;          // bonus_s [rows,K] (a read before the update)
  bool l2 = false;             // q and k L2-normalised over K (eps ir::l2_normalize_eps)
  bool scale_table = false;    // scale_s [rows]; else the kernel's float scale
  bool reverse = false;
  bool varlen = false;         // cu_seqlens (i64)
  bool initial_state = false;  // h0 [N,H,K,V] fp32
  bool d_final = false;        // d_final [N,H,K,V] fp32
  int block_v = 32;            // value columns a block: 8, 16 or 32 (the recurrent form)
  // The chunked WY form on the tensor cores instead of the recurrence (below): the delta rule with a
  // head decay, a key-side decay (KDA) or none, K <= 128; block_v unused.
  bool chunked = false;
  int block_k = 128;  // the chunked form's key rows: 64 or 128, at least K (update_backward_block_k)
};

inline constexpr int update_backward_chunk = 64;  // steps between checkpoints; the chunked form's chunk

// Why the chunked form cannot run this spec at K (and V, where given: its shared memory; empty: it
// can), and its block_k for K.
inline constexpr int update_backward_shared_limit = 227 * 1024;  // an H100's opt-in, bytes a block
std::string update_backward_unchunked(const UpdateBackwardSpec& spec, std::int64_t key_dim, std::int64_t value_dim = 0);
inline int update_backward_block_k(std::int64_t key_dim) { return key_dim <= 64 ? 64 : 128; }

// block_v for K and the form: up to K = 256, 16 for the delta rule and 8 for a read before the
// update (the fastest measured of each); 8 up to 512 (LADLE_UPDATE_BWD_BLOCK_V = 8, 16 or 32 forces
// one where K allows it: a measurement knob). Throws InvalidArgument past 512.
int update_backward_block_v(std::int64_t key_dim, bool delta);

// The kernel's name (ladle_bwd_update_<hash of the spec>) and source. Its parameters, in order:
//   const float* qs, kf, vf, dos, log_a, log_h, scale_s; float scale; const float* beta_s, bonus_s,
//   h0, d_final; float* ckpt ([N H S][C][block_v][KP]), chunk ([N H S][64][block_v][KP]);
//   float* gq, gk, gv, ga, gbeta, gbonus, d_h0 ([N,H,K,V]; null: none);
//   const long long* cu_seqlens; int T, H, K, V, C (checkpoints a sequence: chunks of the longest);
// with S = ceil(V / block_v), KP = 32 ceil(K / 32). Unused pointers may be null.
// (The recurrent form.)
std::string update_backward_name(const UpdateBackwardSpec& spec);
// Every kernel of the spec's form, in one source: ladle_bwd_update, or the chunked form's three.
std::string update_backward_source(const UpdateBackwardSpec& spec);

// One kernel launch of a form, in order: all take the parameters above.
struct UpdateBackwardLaunch {
  std::string name;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0;
  int shared_bytes = 0;  // dynamic
};
// The launches for N sequences, H heads, C chunks of 64 of the longest sequence, K and V; and the
// floats of `ckpt` and `chunk` they need (at least 1 each).
std::vector<UpdateBackwardLaunch> update_backward_launches(const UpdateBackwardSpec& spec, std::int64_t N, std::int64_t H,
                                                           std::int64_t C, std::int64_t K, std::int64_t V);
std::int64_t update_backward_ckpt_floats(const UpdateBackwardSpec& spec, std::int64_t N, std::int64_t H, std::int64_t C,
                                         std::int64_t K, std::int64_t V);
std::int64_t update_backward_chunk_floats(const UpdateBackwardSpec& spec, std::int64_t N, std::int64_t H, std::int64_t K,
                                          std::int64_t V);

}  // namespace ladle::cuda
