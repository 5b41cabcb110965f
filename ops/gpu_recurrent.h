// The GPU path of every recurrent variant: the same argument checking as the CPU path,
// then the fused-recurrent kernel generated for this variant, dtypes and tile, compiled
// through the cache (once per process and kernel), and launched on a stream.
//   ladle::gpu::run_variant_into(variant, q, k, v, inputs, options, outputs, {&stream});
// Tensor views passed here are device memory (TensorView::location; InvalidArgument naming the
// view otherwise), except options.cu_seqlens, which may be either: it is read on the host to
// check it and then uploaded. ladle::run_variant_into (variant.h) takes host tensors too.
#pragma once

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

// Tokens per segment of the chunked serial form for this call (0: whole sequences): the
// caller's RunOptions::chunked_segment_tokens, else, where the (sequence, head) pairs fill less
// than half the SMs and the sequences are long, a power-of-two cut of each sequence that keeps at
// least 1024 tokens a segment. A split tile runs whole sequences.
std::int64_t chunked_segment_tokens(const ops::BoundInputs& bound, const RunOptions& options);
std::int64_t chunked_segment_tokens(const ops::BoundInputs& bound, const RunOptions& options, const GpuTarget& target);

// Why TMA cannot copy this call's q, k and v as the chunked ws form reads them (empty: it can):
// bf16 [B,T,X,D] views with contiguous features, a 16-byte aligned start and strides of whole 16 bytes.
std::string ws_copyable(const ir::Variant& variant, const ops::BoundInputs& bound);

// The chunked tile without tuning: by K and V, the device's shared memory, and the number
// of blocks the shape gives (sequences: the segments when the call runs segmented, else 0: N).
cuda::ChunkedTile heuristic_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound,
                                         std::int64_t sequences = 0);
// The same for a target (device_target() without a driver is planned as named_target(cuda::Target::hopper)).
cuda::ChunkedTile heuristic_chunked_tile(const ir::Variant& variant, const ops::BoundInputs& bound, std::int64_t sequences,
                                         const GpuTarget& target);
// The split form of a serial tile (state tiles 64 x 64 of 4 warps, bf16 per-chunk states).
cuda::ChunkedTile split_chunked_tile(const cuda::ChunkedTile& serial, std::int64_t value_dim);
cuda::ChunkedKernelSpec chunked_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                            const RunOptions& options);
cuda::ChunkedKernelSpec chunked_kernel_spec(const ir::Variant& variant, const ops::BoundInputs& bound,
                                            const RunOptions& options, const GpuTarget& target);
// The segmented form's two kernels for a call's serial spec: the state pass over every segment but
// the last (the split form's state tile of split_chunked_tile, at 64-token chunks where they fit
// max_shared_bytes; 0: not checked), then the serial form over every segment.
struct SegmentedSpecs {
  cuda::ChunkedKernelSpec first, fold, serial;  // the state pass, the fold, the serial form
  // Whether the fold runs as a kernel of its own: not after a ws serial tile, whose kernel folds the
  // earlier segments' states itself as it starts.
  bool fold_runs() const { return !serial.tile.ws; }
};
// On sm_90a (serial.arch, or a ws serial tile) the state pass runs in the ws form where the variant
// and types allow (cuda::chunked_ws_unsupported of a states spec) and ws_state_pass is set: the caller
// clears it where TMA cannot copy the call's k, v and gate inputs (ws_states_copyable).
SegmentedSpecs segmented_chunked_specs(const ir::Variant& variant, const cuda::ChunkedKernelSpec& serial,
                                       std::int64_t key_dim, std::int64_t value_dim, int max_shared_bytes = 0,
                                       bool ws_state_pass = true);
// Why TMA cannot copy this call's k, v and key-gate inputs as the ws state pass reads them (empty: it can).
std::string ws_states_copyable(const ir::Variant& variant, const ops::BoundInputs& bound);
// The chunked kernels a call of serial spec `spec` launches, in order: the split form's state and
// output passes, the segmented form's state pass, fold (where it runs) and serial form
// (segmented: the call runs segmented, chunked_segment_tokens > 0), else spec alone.
std::vector<cuda::ChunkedKernelSpec> chunked_launch_specs(const ir::Variant& variant, const cuda::ChunkedKernelSpec& spec,
                                                          const ops::BoundInputs& bound, bool segmented, const GpuTarget& target);
// The delta rule's chunked form: its prepare, states and outputs specs for a call.
std::vector<cuda::ChunkedDeltaSpec> chunked_delta_specs(const ir::Variant& variant, const ops::BoundInputs& bound,
                                                        const RunOptions& options);
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

}  // namespace ladle::gpu
