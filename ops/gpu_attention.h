// The GPU path of every softmax-attention variant: the tile kernel of codegen/cuda/attention.h
// generated for this variant, dtypes and head dims, compiled through the cache (once per
// process and kernel), and launched on a stream. ops/attention.cpp binds and checks the
// arguments (ops/attention_bind.h) and calls run_attention_into with *device* pointers in
// every view (the cu_seqlens stay host vectors in AttentionArgs and are uploaded here).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <cstdint>

#include <ladle/codegen/cuda/attention.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/tensor_map.h>

#include "attention_bind.h"
#include "gpu_recurrent.h"  // LaunchOptions

namespace ladle::gpu {

// The tile used without tuning: by head dims and, on a GPU, by the number of blocks the
// shape gives (64-row tiles when 128-row ones would leave SMs idle).
// Where the default does not fit the head dims (or fp32 inputs the shared memory), the first
// tile that does: fewer keys per tile, one stage, 64-row tiles, then wgmma on sm_90a.
cuda::AttentionTile heuristic_attention_tile(const ops::AttentionArgs& args);
// The same for a device given by its SM count, target arch ("": unknown, no wgmma) and opt-in
// shared memory per block (0: not checked).
cuda::AttentionTile heuristic_attention_tile(const ops::AttentionArgs& args, int sms, const std::string& arch,
                                             int max_shared_bytes);

// The kernel spec a call needs (every input's dtype, head dims, varlen, lse, tile); `tile`
// empty: heuristic_attention_tile. Throws InvalidArgument for a tile that does not fit.
cuda::AttentionKernelSpec attention_kernel_spec(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                const std::optional<cuda::AttentionTile>& tile = std::nullopt);
// The same for a target (gpu_recurrent.h): `tile` empty, the heuristic tile for that target; what
// ladle-dump and ladle::generated_kernels plan with, and the launcher with device_target().
cuda::AttentionKernelSpec attention_kernel_spec(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                const std::optional<cuda::AttentionTile>& tile, const GpuTarget& target);

// Generates and compiles (through the cache) without launching: what ladle-dump shows and
// what CI compiles. arch empty: this GPU, else the default target.
struct CompiledAttention {
  cuda::AttentionKernel kernel;
  CompiledProgram program;
};
CompiledAttention compile_attention(const ir::AttentionVariant& variant, const cuda::AttentionKernelSpec& spec,
                                    const std::string& arch = "");

// The decode form's splits (cuda::AttentionMma::decode): how many, the keys each takes (a multiple
// of the tile's block_n), the rows per (sequence, head) of the partial results (the longest query
// sequence) and where those live (the launcher's scratch: o_part [splits][N][H][rows][Dv] and
// lse_part [splits][N][H][rows], fp32).
struct AttentionDecodeSplit {
  int splits = 1;
  int split_len = 0;
  std::int64_t partial_rows = 0;
  const void* o_part = nullptr;
  const void* lse_part = nullptr;
};
// Splits for a decode tile at these arguments on `sms` SMs: the count whose blocks of (sequence,
// key/value head, row block, split) finish soonest by waves x (key tiles a split + 2), each split at
// least eight key tiles, at most cuda::attention_merge_splits.
// shared_per_sm: the SM's shared memory (0: an H100's 227 KB), which bounds the blocks an SM holds.
AttentionDecodeSplit attention_decode_split(const ops::AttentionArgs& args, const cuda::AttentionTile& tile, int sms,
                                            int shared_per_sm = 0);
// The persistent forward's work (cuda::AttentionKernelSpec::persistent): its row blocks per
// (sequence, head), ceil(longest query sequence / block_m), so N * H * row_blocks items, and its
// counter (an unsigned the launcher zeroes before the launch: device memory on a GPU, host memory
// on the emulation).
struct AttentionWork {
  std::int64_t row_blocks = 0;
  void* counter = nullptr;
  std::int64_t items(const ops::AttentionArgs& args) const { return args.N * args.H * row_blocks; }
};
AttentionWork attention_work(const ops::AttentionArgs& args, int block_m);
// Whether ws kernels are made persistent: only under LADLE_ATTENTION_PERSISTENT=1. Measured on an
// H200 (bench/RESULTS.md, issue 38, stop 54) it gained nothing for causal attention, 2 % for a
// window, and cost a call ~30 us of counter allocation and zeroing (B1 T4096: 0.141 -> 0.174 ms),
// so the grid form stays the default.
bool attention_persistent_enabled();
// Whether a call is decode-shaped: a few query tokens (up to 16) against many more keys (at least
// 128, and 8 per query token), no dropout, at most 65535 (sequence, key/value head) pairs.
// heuristic_attention_tile then picks a decode tile where one fits the head dims.
bool attention_decode_shaped(const ops::AttentionArgs& args);

// How a softmax-attention call runs, decided once (as ops/chunked_plan.h does for the chunked
// family): the form, the kernel spec with its tile (validated against the call and the target), the
// decode form's key splits or the row blocks, and the kernels launched in order with what each grid
// walks. The launcher (run_attention_into), the tuner and ladle-dump (ladle::generated_kernels) read
// the same plan; codegen emits the spec and decides nothing again.
struct AttentionLaunch {
  enum class Kernel { main, merge, prep };
  // row_blocks: (sequence, head) x row blocks (cuda::attention_grid); work_items: a block an SM,
  // drawing (sequence, head, row block) items from a counter (cuda::attention_persistent_blocks);
  // key_splits: (split, row block of the packed GQA rows, sequence x key/value head)
  // (cuda::attention_decode_grid); merged_rows: a block a row of the splits' partial results
  // (cuda::attention_merge_blocks); query_rows: the backward's prep, row groups x (sequence, head);
  // key_blocks: the backward's main kernel, (sequence, key/value head) x key blocks x column parts.
  enum class Over { row_blocks, work_items, key_splits, merged_rows, query_rows, key_blocks };
  Kernel kernel = Kernel::main;
  Over over = Over::row_blocks;
};
const char* to_string(AttentionLaunch::Kernel kernel);
const char* to_string(AttentionLaunch::Over over);

struct AttentionPlan {
  // tiles: a block per (sequence, head, row block); persistent: a block an SM walking those
  // (LADLE_ATTENTION_PERSISTENT=1); decode: a few query tokens against many keys, the keys split
  // over blocks and the splits merged by lse.
  enum class Form { tiles, persistent, decode };
  Form form = Form::tiles;
  cuda::AttentionKernelSpec spec;
  AttentionDecodeSplit split;            // decode: splits, keys a split, partial rows (not where they live)
  std::int64_t row_blocks = 0;           // tiles, persistent: ceil(longest query sequence / block_m)
  std::vector<AttentionLaunch> launches;  // in launch order
};
const char* to_string(AttentionPlan::Form form);
// "decode: 4 key splits of 2048 keys; main over key_splits, merge over merged_rows"
std::string to_string(const AttentionPlan& plan);

// The plan of a bound call on a target: `tile` where given (the caller's or the tuner's), else
// heuristic_attention_tile for that target; the decode form's splits by attention_decode_split on
// the target's SMs (132 where unknown) and shared memory. Throws InvalidArgument for a tile that
// does not fit.
AttentionPlan plan_attention(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                             const std::optional<cuda::AttentionTile>& tile, const GpuTarget& target);

// The argument array of an attention kernel, by parameter role, from bound arguments whose
// pointers the kernel can read (device pointers on a GPU; host pointers on the host
// emulation of tests/codegen). cu_seqlens_q / cu_seqlens_k: where the int64 offsets are.
// Tensor maps (the ws tiles) are encoded by `encode`: the driver's encoding for a GPU,
// describe_tensor_map for the host emulation.
// `decode`: the splits of a decode kernel or its merge kernel (their partial_* and split roles).
// `work`: a persistent kernel's (work_counter, row_blocks).
KernelArgs pack_attention_arguments(const std::vector<cuda::AttentionParam>& params, const ops::AttentionArgs& args,
                                    const void* cu_seqlens_q, const void* cu_seqlens_k,
                                    TensorMap (*encode)(const TensorMapDescription&) = encode_tensor_map,
                                    const AttentionDecodeSplit* decode = nullptr, const AttentionWork* work = nullptr);
// One parameter of the forward's roles appended to `packed` (what pack_attention_arguments does for each;
// the backward's launcher packs its own roles and hands the rest here). Throws for a backward role.
void pack_attention_argument(KernelArgs& packed, const cuda::AttentionParam& param, const ops::AttentionArgs& args,
                             const void* cu_seqlens_q, const void* cu_seqlens_k,
                             TensorMap (*encode)(const TensorMapDescription&) = encode_tensor_map,
                             const AttentionDecodeSplit* decode = nullptr, const AttentionWork* work = nullptr);
// The TMA map of a [B,T,X,D] view (q, k, v: 16-bit elements; the backward's dq: fp32): dims
// (D, T, X, B) innermost first, boxes of 128 bytes of head-dim elements (64, or 32 fp32) by
// box_rows tokens.
TensorMapDescription attention_tensor_map(const TensorView& view, int box_rows);

// Runs the variant on bound arguments whose views hold device pointers, with the tile
// tuned_attention_tile gives (ops/tune_attention.h: LADLE_AUTOTUNE). Throws NoCudaDriver
// without a GPU.
void run_attention_into(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                        const LaunchOptions& launch = {});
// The same with a named tile (benchmarks, the autotuner) instead of the heuristic one.
void run_attention_into(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const LaunchOptions& launch,
                        const cuda::AttentionTile& tile);

}  // namespace ladle::gpu
