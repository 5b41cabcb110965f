// The softmax-attention backward on the GPU: the two kernels of codegen/cuda/attention_backward.h
// generated for the variant, compiled through the cache and launched on a stream, on device
// tensors throughout (nothing returns to the host between the kernels).
//   gpu::run_attention_backward_into(variant, args /* device views, o and lse the forward's */, grads, {&stream});
// ops/attention.cpp's run_attention_backward calls it for a forward that ran on the GPU.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ladle/codegen/cpu/attention.h>
#include <ladle/codegen/cuda/attention_backward.h>
#include <ladle/runtime/compiler.h>
#include <ladle/runtime/driver.h>
#include <ladle/runtime/tensor_map.h>

#include "attention_bind.h"
#include "gpu_attention.h"  // AttentionLaunch
#include "gpu_recurrent.h"  // LaunchOptions

namespace ladle::gpu {

// The spec of a call's backward kernels: the variant's dtypes and head dims, which gradients are
// wanted (grads' entries), whether d_output must be copied to q's type for TMA (any other dtype,
// or rows TMA cannot copy). arch: the target ("" : the default, sm_90a).
cuda::AttentionBackwardSpec attention_backward_spec(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                                    const cpu::AttentionGrads& grads, const std::string& arch = cuda::Target::hopper);

// Generates and compiles (through the cache) without launching: what ladle-dump shows.
struct CompiledAttentionBackward {
  cuda::AttentionBackwardKernel kernel;
  CompiledProgram program;
};
CompiledAttentionBackward compile_attention_backward(const ir::AttentionVariant& variant, const cuda::AttentionBackwardSpec& spec,
                                                     const std::string& arch = "");

// The argument arrays of the two kernels, by parameter role, from bound arguments and gradient
// views whose pointers the kernels can read and write (device pointers on a GPU, host pointers on
// the host emulation). row_stats: [B,H,Tq] float2 scratch; d_output_copy: q's 16-bit type,
// [B,Tq,H,Dv] contiguous (used when the spec copies d_output; else grads.d_output is read by TMA).
struct AttentionBackwardArguments {
  KernelArgs prep, main;
};
AttentionBackwardArguments pack_attention_backward_arguments(const cuda::AttentionBackwardKernel& kernel,
                                                             const cuda::AttentionBackwardSpec& spec, const ops::AttentionArgs& args,
                                                             const cpu::AttentionGrads& grads, void* row_stats, void* d_output_copy,
                                                             const void* cu_seqlens_q, const void* cu_seqlens_k,
                                                             TensorMap (*encode)(const TensorMapDescription&) = encode_tensor_map);

// The backward's plan (as gpu::AttentionPlan for the forward): the spec with its tile (the caller's
// or the tuner's; none: heuristic_attention_backward_tile; the sync form's tile is with_sync_tile's),
// checked (InvalidArgument naming the tile), and its two launches: prep over the query rows, then the
// main kernel over the key blocks. The launcher, ladle-dump and `ladle-cache prebuild --backward`
// (ladle::generated_backward_kernels) read it.
struct AttentionBackwardPlan {
  cuda::AttentionBackwardSpec spec;
  cuda::AttentionBackwardTile tile;       // what the ws form was given (the sync form ignores it; with_tile takes dQ's
                                          // TMA stage off where it does not fit: spec.dq_tma says what runs)
  std::vector<AttentionLaunch> launches;  // prep over query_rows, main over key_blocks
};
AttentionBackwardPlan plan_attention_backward(const ir::AttentionVariant& variant, const ops::AttentionArgs& args,
                                              const cpu::AttentionGrads& grads, const std::optional<cuda::AttentionBackwardTile>& tile,
                                              const std::string& arch);
// "form ws, stages=2 dq=tma" (the spec's, as with_tile made it) or "form sync, 32 rows x 128 columns"
std::string to_string(const AttentionBackwardPlan& plan);

// What keeps a call off the GPU backward, in words (empty: it runs): the head dims and dtypes
// attention_backward_unsupported names, a GPU other than sm_90.
std::vector<std::string> gpu_attention_backward_unsupported(const ir::AttentionVariant& variant, const ops::AttentionArgs& args);

// Runs the backward on device views: args as the forward bound them (o and lse: the forward's
// outputs, lse required), grads.d_output (any floating dtype and strides) and the gradients, fp32:
// dq [B,Tq,H,D] with unit stride over D, dk, dv, each wanted input's and the sinks' (canonical
// views; broadcast axes at stride 0 over memory the call owns). Every gradient is overwritten.
// Throws InvalidArgument for what gpu_attention_backward_unsupported names. tile: the main
// kernel's stages and dQ path; none: the tuned one (tuned_attention_backward_tile, policy from
// LADLE_AUTOTUNE; the heuristic's under heuristic). A tile that does not fit throws, naming it.
void run_attention_backward_into(const ir::AttentionVariant& variant, const ops::AttentionArgs& args, const cpu::AttentionGrads& grads,
                                 const LaunchOptions& launch = {}, const std::optional<cuda::AttentionBackwardTile>& tile = std::nullopt);

// The heuristic tile for a call's spec: 2 stages, dQ by TMA where the call's dq allows it.
cuda::AttentionBackwardTile heuristic_attention_backward_tile(const cuda::AttentionBackwardSpec& spec);

}  // namespace ladle::gpu
