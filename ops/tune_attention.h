// The softmax-attention family in the autotuner: block_m x block_n x warps x stages x mma
// (warps must agree with block_m: 16 query rows per warp; mma 0 = sync, 1 = wgmma, 2 = ws), valid by
// validate_attention_tile (the device's arch for wgmma, its opt-in shared memory and the
// register guard included) and the thread limit, ranked by a cost model and pruned to
// max_candidates. The key builder and the per-process memo are the recurrence families'
// (ops/tune_recurrent.h). gpu::run_attention_into asks for a tile when the call names none
// (policy from LADLE_AUTOTUNE).
#pragma once

#include <cstdint>
#include <string_view>

#include <ladle/codegen/cpu/attention.h>
#include <ladle/codegen/cuda/attention.h>
#include <ladle/codegen/cuda/attention_backward.h>
#include <ladle/runtime/autotune.h>

#include "attention_bind.h"

namespace ladle::gpu {

// The family's name in the tuned-config cache.
inline constexpr std::string_view attention_family = "attention";

// The sizes a tile is chosen for. Pure data, so that spaces and keys are built (and tested)
// without a device.
struct AttentionTuneShape {
  std::int64_t N = 0;            // sequences
  std::int64_t Tq = 0, Tk = 0;   // tokens per sequence (packed: the longest): bucketed in the key
  std::int64_t mean_q = 0;       // tokens per sequence, Tq or the packed sequences' mean: the
  std::int64_t mean_k = 0;       //   cost model's
  std::int64_t H = 0, H_kv = 0, D = 0, Dv = 0;
  // The mask's structure, for the cost model's count of key tiles per block; a window's span
  // is in the key by power-of-two bucket.
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;  // -1: unbounded (or no window)
  static AttentionTuneShape of(const ir::AttentionVariant& variant, const ops::AttentionArgs& args);
};

Config to_config(const cuda::AttentionTile& tile);  // block_m, block_n, warps, stages, mma (0 sync, 1 wgmma, 2 ws)
cuda::AttentionTile to_attention_tile(const Config& config);

// The search space, for any device (the rules read the DeviceLimits they are given).
// operands: the type q, k and v go through the tensor cores as (f32 when any of them is f32:
// split into bf16 pairs, twice the shared memory and the q fragments; else f16 or bf16). The
// cost model predicts an SM's cycles from the key tiles every block visits (the causal or
// window range, per row block), the mma and softmax work per tile at the rate the resident
// warps reach, the copies' issue cost (K/V reuse: 64-row tiles copy twice per query row),
// the per-tile barriers (and, with one stage, the copy's latency), a register-pressure factor
// near the register guard, the blocks that fit on an SM at once (shared memory, registers,
// threads) and the blocks vs SMs; wgmma at mma.sync's rate until measured: rough, it only ranks.
// async_copy: q, k, v rows the kernels may copy 16 bytes at a time (cp.async, TMA); without it
// no ws tile is valid.
SearchSpace attention_search_space(const AttentionTuneShape& shape, DType operands, bool async_copy = true);

// The family's key: the variant's hash, the kernel's flags (varlen, lse, cp.async) and input
// dtypes (segment ids and sinks too when the variant has them), the shape bucket (N, Tq and Tk
// by powers of two; H, H_kv, D, Dv exact), the output dtype and the device.
TunedKey attention_tune_key(const ir::AttentionVariant& variant, const cuda::AttentionKernelSpec& spec,
                            const AttentionTuneShape& shape, const DeviceLimits& device);

// The job for one call, for ladle-tune and the benchmarks (measure() prints the whole table).
// Reads this GPU's limits (Device::get()); args (device pointers) must outlive the job. The
// candidate runs each tile on args' inputs into fresh poisoned outputs and compares o with the
// heuristic tile's within 1e-2 relative L2 (2e-3 for f32 inputs). Throws InvalidArgument, as
// the launcher does, when the heuristic tile does not fit.
TuneJob attention_tune_job(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                           const cuda::AttentionTile& heuristic);

// The tile for this call: the heuristic under policy heuristic (nothing built, no device
// touched) or where the heuristic is a decode tile (the space holds none), else the tuned one (tuned
// now on a miss under cached, always under force).
cuda::AttentionTile tuned_attention_tile(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                         const cuda::AttentionTile& heuristic, const TuneOptions& tune_options = {});

// ---- The backward (codegen/cuda/attention_backward.h): stages {2, 3, 4} x dq_tma {0, 1}, valid by
// attention_backward_unsupported for the call's spec with the tile applied and the device's
// opt-in shared memory; dq_tma = 1 only where the call's dq allows TMA (its spec's dq_tma) and
// the stage fits beside the ring. No cost model: the space is six tiles at most.
inline constexpr std::string_view attention_backward_family = "attention-backward";

Config to_config(const cuda::AttentionBackwardTile& tile);  // stages, dq_tma (0 red.global, 1 TMA)
cuda::AttentionBackwardTile to_attention_backward_tile(const Config& config);

// base: the call's spec (gpu::attention_backward_spec), whose stages and dq path the configs replace.
SearchSpace attention_backward_search_space(const ir::AttentionVariant& variant, const cuda::AttentionBackwardSpec& base);

// The backward's key: the variant's hash, the kernels' flags (varlen, the d_output copy, the sinks'
// gradient, the wanted input gradients, whether dq allows TMA) and dtypes, the forward's shape
// bucket (N, Tq, Tk by powers of two; H, H_kv, D, Dv exact; a window's span), the device.
TunedKey attention_backward_tune_key(const ir::AttentionVariant& variant, const cuda::AttentionBackwardSpec& spec,
                                     const AttentionTuneShape& shape, const DeviceLimits& device);

// The job for one backward call (device views; args with the forward's o and lse, grads.d_output
// the caller's): each candidate runs gpu::run_attention_backward_into into gradient buffers of
// its own (dk and dv poisoned before each checked run; the launcher zeroes the rest) and its
// gradients (dq, dk, dv, the inputs' and the sinks' it wants) must match the heuristic tile's
// within 1e-2 relative L2 before it may win.
TuneJob attention_backward_tune_job(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                    const cpu::AttentionGrads& grads, const cuda::AttentionBackwardTile& heuristic);

// The tile for this backward call: the heuristic under policy heuristic, else the tuned one.
cuda::AttentionBackwardTile tuned_attention_backward_tile(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                          const cpu::AttentionGrads& grads,
                                                          const cuda::AttentionBackwardTile& heuristic,
                                                          const TuneOptions& tune_options = {});

}  // namespace ladle::gpu
