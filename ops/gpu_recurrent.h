// The GPU path of every recurrent variant: the same argument checking as the CPU path,
// then the fused-recurrent kernel generated for this variant, dtypes and tile, compiled
// through the cache (once per process and kernel), and launched on a stream.
//   ladle::gpu::run_variant_into(variant, q, k, v, inputs, options, outputs, {&stream});
// Tensor views passed here are device memory (TensorView::location; InvalidArgument naming the
// view otherwise), except options.cu_seqlens, which may be either: it is read on the host to
// check it and then uploaded. ladle::run_variant_into (variant.h) takes host tensors too.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include <ladle/codegen/cuda/chunked_delta.h>
#include <ladle/codegen/cuda/recurrent.h>
#include <ladle/codegen/cuda/target.h>
#include <ladle/runtime/compiler.h>

#include "bind.h"
#include "variant.h"

namespace ladle {
class Stream;
}

namespace ladle::gpu {

struct LaunchOptions {
  const Stream* stream = nullptr;  // nullptr: the default stream
};

// The GPU a kernel is chosen for: this one (device_target), or one named by its arch without a
// device (named_target: what ladle-dump and ladle::generated_kernels plan for). Every heuristic
// below takes one, so that a plan made without a GPU picks what the launcher picks on that GPU.
struct GpuTarget {
  std::string arch;          // "sm_90a", "sm_80"; "": not known (no device)
  int sms = 0;               // streaming multiprocessors; 0: not known
  int max_shared_bytes = 0;  // opt-in shared memory per block; 0: not checked
  int shared_per_sm = 0;     // shared memory per SM (what bounds the blocks an SM holds); 0: an H100's
};
// This GPU's figures; without a driver, {"", 0, 0}.
GpuTarget device_target();
// A GPU of that arch: 132 SMs (an H100's) and the arch's opt-in shared memory per block
// (cuda::target(arch).max_shared_bytes; 0 where not known: not checked).
// An empty arch: device_target().
GpuTarget named_target(const std::string& arch);

// The tile used without tuning: by K and V, and on a GPU also by the number of blocks the
// shape gives (narrow tiles when wide ones would leave SMs idle).
cuda::RecurrentTile heuristic_tile(const ops::BoundInputs& bound);
cuda::RecurrentTile heuristic_tile(const ops::BoundInputs& bound, const GpuTarget& target);

// The dtypes and flags of the kernel a call needs, whichever family runs it (every input's
// dtype, the output's, reverse, varlen, states): what both specs and the tuned keys hold.
cuda::KernelTypes kernel_types(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options);

// The kernel spec a call needs (dtypes of every input, reverse, varlen, states, tile).
cuda::RecurrentKernelSpec kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                      const RunOptions& options);
cuda::RecurrentKernelSpec kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                      const RunOptions& options, const GpuTarget& target);

// Generates and compiles (through the cache) without launching: what ladle-dump shows and
// what CI compiles for every variant. arch empty: this GPU, else the default target.
struct CompiledRecurrent {
  cuda::RecurrentKernel kernel;
  CompiledProgram program;
};
CompiledRecurrent compile_recurrent(const ir::Variant& variant, const cuda::RecurrentKernelSpec& spec,
                                    const std::string& arch = "");

// The family a call runs (RunOptions::algorithm resolved by shape and dtype). Throws
// InvalidArgument when chunked is forced on a variant or dtype it cannot run.
Algorithm choose_algorithm(const ir::Variant& variant, const ops::BoundInputs& bound, const RunOptions& options);

struct CompiledChunked {
  cuda::ChunkedKernel kernel;
  CompiledProgram program;
};
CompiledChunked compile_chunked(const ir::Variant& variant, const cuda::ChunkedKernelSpec& spec,
                                const std::string& arch = "");

// Device-resident inputs and outputs (see the header comment).
void run_variant_into(const ir::Variant& variant, const TensorView& q, const TensorView& k,
                      const TensorView& v, const VariantInputs& inputs, const RunOptions& options,
                      const RecurrentOutputs& outputs, const LaunchOptions& launch = {});

// run_variant_into, where it runs the serial ws form (sm_90a, whole sequences, a key-side gate or a
// head decay: the plan the call takes anyway), also writing the state entering each 64-token chunk of
// every sequence in the recurrence's direction, fp32, to the device table chunk_states [chunks][H][K][V]
// at row first chunk of n + c (chunks: the sum over sequences of ceil(length / 64)). Returns false,
// running nothing, where the call takes another form (the caller then runs it and forms the states
// otherwise). The recurrent backward's boundary states (ops/gpu_backward.cpp) come from here.
bool run_variant_with_chunk_states(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                   const VariantInputs& inputs, const RunOptions& options, const RecurrentOutputs& outputs,
                                   std::uint64_t chunk_states, const LaunchOptions& launch = {});

// The state entering every segment but each sequence's first, for a call of the chunked family cut
// by the caller's `segments` (cuda::ChunkedSegments, one piece per segment; the tokens of each
// sequence in order, in the recurrence's direction): the segmented form's state pass and fold
// alone (gpu::plan_entry_states), written to `states`, device fp32 [segments.earlier rows][H][K][V]:
// row r holds the state after the segment of row r. The recurrent backward reads its forward
// state and its dS at the 64-step blocks this way (ops/gpu_backward.cpp). Device tensors;
// options.algorithm is taken as chunked and options.return_state must be false. Throws
// InvalidArgument where the chunked family cannot run the call (the delta rule, a dtype or shape
// it refuses).
void run_entry_states(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                      const VariantInputs& inputs, const RunOptions& options, const cuda::ChunkedSegments& segments,
                      std::uint64_t states, const LaunchOptions& launch = {});

// A context-parallel forward's slice (ops/context_parallel.h) in one pass over its tokens: where the
// call runs the chunked segmented form, its state pass covers every segment (each sequence's last one
// too), then `hook(segment_states, segment_decay, chains)` runs on the host, in stream order:
// segment_states [rows][H][K][V] and segment_decay [rows][H][DL] f32 hold each segment's own final
// state from zero and total log2 decay, chains[n] the rows of sequence n in the recurrence's
// direction. The hook writes the state each sequence starts from into options.initial_state (device
// f32 [N,H,K,V], contiguous) before the fold and the serial kernels read it, on the same stream.
// Returns false, having launched nothing, where the call does not run that form (the caller
// summarises by run_segment_summaries and runs run_variant_into instead).
using SegmentSummariesHook =
    std::function<void(std::uint64_t segment_states, std::uint64_t segment_decay, const std::vector<std::vector<long long>>& chains)>;
bool run_variant_with_summaries(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                                const VariantInputs& inputs, const RunOptions& options, const RecurrentOutputs& outputs,
                                const SegmentSummariesHook& hook, const LaunchOptions& launch = {});

// The segmented form's state pass alone over the `earlier` rows of the caller's `segments` (one piece
// each, tokens of batch row b as the rows say, no cu_seqlens and no initial state): row r's own final
// state from zero to `states` (device f32 [rows][H][K][V]) and its total log2 decay to `decay` (device
// f32 [rows][H][DL], DL = cuda::chunked_segment_decay_width): the summaries a context-parallel call
// exchanges (ops/context_parallel.h). Throws InvalidArgument where the chunked family cannot run the call.
void run_segment_summaries(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                           const VariantInputs& inputs, const RunOptions& options, const cuda::ChunkedSegments& segments,
                           std::uint64_t states, std::uint64_t decay, const LaunchOptions& launch = {});

// The state entering every chunk of `chunk` tokens (in the recurrence's direction, each sequence's
// chunks after the earlier sequences'), h0 for each sequence's first: the split form's state pass
// alone, fp32, written to `states`, device [chunks over all sequences][H][K][V]. Where the caller's
// blocks are the chunks of the recurrence's own direction, this is one serial pass per state tile
// instead of run_entry_states' state pass and fold. Device tensors; options.return_state must be
// false; chunk is 16, 32 or 64. Throws InvalidArgument where the chunked family cannot run the call.
void run_chunk_states(const ir::Variant& variant, const TensorView& q, const TensorView& k, const TensorView& v,
                      const VariantInputs& inputs, const RunOptions& options, int chunk, std::uint64_t states,
                      const LaunchOptions& launch = {});

}  // namespace ladle::gpu
