// The fused-recurrent family in the autotuner: its search space (block_v x warps at the
// heuristic block_k), its validity rule (validate_tile and the device's thread limit), and
// a Candidate that compiles in prepare() and runs each tile into its own output buffers.
// The op layer asks it for a tile when the call names none (policy from LADLE_AUTOTUNE).
#pragma once

#include <ladle/codegen/cuda_recurrent.h>
#include <ladle/runtime/autotune.h>

#include "bind.h"
#include "variant.h"

namespace ladle::gpu {

// The tile for this call: the heuristic under policy heuristic, else the tuned one (tuned
// now on a miss under cached, always under force). Bound views hold device pointers.
cuda::RecurrentTile tuned_tile(const ir::Variant& variant, const ops::BoundInputs& bound,
                               const RunOptions& options, const cuda::RecurrentTile& heuristic,
                               const TuneOptions& tune_options = {});

// The job itself, for ladle-tune and the benchmarks (measure() prints the whole table).
TuneJob recurrent_tune_job(const ir::Variant& variant, const ops::BoundInputs& bound,
                           const RunOptions& options, const cuda::RecurrentTile& heuristic);

}  // namespace ladle::gpu
