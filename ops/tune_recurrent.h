// The recurrence families in the autotuner. Fused recurrent: block_v x warps at the heuristic
// block_k, valid by validate_tile and the device's thread limit. Chunked: chunk x block_v x
// warps at the heuristic block_k (and wgmma, ws on or off where the heuristic takes them), valid by validate_chunked_tile (the device's shared memory
// included) and the thread limit, ranked by a cost model and pruned to max_candidates. Both
// share one Candidate (compiles in prepare(), runs each tile into its own output buffers),
// one key builder and one per-process memo (the softmax-attention family, ops/tune_attention.h,
// uses the key builder and the memo too). The op layer asks for a tile when the call names
// none (policy from LADLE_AUTOTUNE).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <ladle/codegen/cuda/chunked.h>
#include <ladle/codegen/cuda/recurrent.h>
#include <ladle/runtime/autotune.h>

#include "bind.h"
#include "variant.h"

namespace ladle::gpu {

// The families' names in the tuned-config cache.
inline constexpr std::string_view recurrent_family = "fused_recurrent";
inline constexpr std::string_view chunked_family = "chunked";
// The chunked family where the call runs segmented (gpu::chunked_segment_tokens > 0): its own
// tuned entries, and the cost model sees the segments as the sequences.
inline constexpr std::string_view chunked_segmented_family = "chunked_segmented";

// The sizes a tile is chosen for. Pure data, so that spaces and keys are built (and tested)
// without a device.
struct TuneShape {
  std::int64_t N = 0;                    // sequences
  std::int64_t T = 0;                    // tokens (packed: all of them): bucketed in the key
  std::int64_t tokens_per_sequence = 0;  // T, or the packed sequences' mean: the cost model's
  std::int64_t H = 0, K = 0, V = 0;      // query heads, key and value dims
  static TuneShape of(const ops::BoundInputs& bound);
};

Config to_config(const cuda::RecurrentTile& tile);  // block_k, block_v, warps
Config to_config(const cuda::ChunkedTile& tile);    // block_k, chunk, block_v, warps (wgmma, ws; a split tile's state fields)
cuda::RecurrentTile to_recurrent_tile(const Config& config);
cuda::ChunkedTile to_chunked_tile(const Config& config);

// The search spaces, for any device (the rules read the DeviceLimits they are given).
SearchSpace recurrent_search_space(const TuneShape& shape, const cuda::RecurrentTile& heuristic);
// The cost model predicts a block's time from its mma and elementwise work per chunk, a fixed
// latency per chunk (barriers, the unprefetched loads of the next chunk), the blocks each SM
// runs after the others' share (blocks vs SMs) and how many of them fit at once (shared
// memory, registers): rough, it only ranks.
SearchSpace chunked_search_space(const ir::Variant& variant, const TuneShape& shape,
                                 const cuda::ChunkedTile& heuristic);

// A family's key: the variant's hash, the kernel's flags and input dtypes, the shape bucket
// (N and T by powers of two, H, K, V exact), the output dtype and the device.
TunedKey tune_key(std::string_view family, const ir::Variant& variant, const cuda::KernelTypes& types,
                  const TuneShape& shape, const DeviceLimits& device);
// What every family's key is made of (the softmax-attention family's too): `what` (the
// variant's hash and the kernel's flags) with "-<dtype>" per input type appended, the shape
// bucket, the output dtype and the device.
TunedKey tune_key(std::string_view family, std::string what, const std::vector<DType>& input_types,
                  std::string bucket, DType output_type, const DeviceLimits& device);

// The per-process memo every family's op goes through: one tuning (or cache read) per key,
// then a map lookup per call. Under force the first call of the process tunes again (and
// replaces the stored result); the calls after it reuse that tuning.
Config tuned_config(const TuneJob& job, Policy policy, const TuneOptions& tune_options);

// The tile for this call: the heuristic under policy heuristic (nothing built), else the
// tuned one (tuned now on a miss under cached, always under force). Bound views hold device
// pointers.
cuda::RecurrentTile tuned_tile(const ir::Variant& variant, const ops::BoundInputs& bound,
                               const RunOptions& options, const cuda::RecurrentTile& heuristic,
                               const TuneOptions& tune_options = {});
cuda::ChunkedTile tuned_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound,
                                     const RunOptions& options, const cuda::ChunkedTile& heuristic,
                                     const TuneOptions& tune_options = {});

// The jobs themselves, for ladle-tune and the benchmarks (measure() prints the whole table).
// They read this GPU's limits (Device::get()).
TuneJob recurrent_tune_job(const ir::Variant& variant, const ops::BoundInputs& bound,
                           const RunOptions& options, const cuda::RecurrentTile& heuristic);
TuneJob chunked_tune_job(const ir::Variant& variant, const ops::BoundInputs& bound,
                         const RunOptions& options, const cuda::ChunkedTile& heuristic);

}  // namespace ladle::gpu
