// The CUDA kernels a call would launch, worked out without a GPU and without data: the kernels the
// launcher generates for a variant (a named op's or one written in the DSL) at given sizes and
// dtypes on a target arch, through the launcher's own plan (the heuristic tiles of gpu_recurrent.h
// and gpu_attention.h, for that target). ladle-dump shows these; an application prints, diffs or
// ships its own variant's kernels with them, no launcher code copied:
//   ladle::CallShape shape;  shape.batch = 4, shape.tokens = 2048, shape.heads = 8;
//   for (const auto& k : ladle::generated_kernels(my_variant, shape, {}, "sm_90a")) std::cout <<
//   k.source;
// The tiles are the heuristic's (LADLE_AUTOTUNE=heuristic); a tuned config stored for a shape may
// replace one at run time. To see what a running program compiled, tuned tiles included: LADLE_DUMP
// (runtime/dump.h).
#pragma once

#include <ladle/codegen/cuda/attention.h>
#include <ladle/runtime/compiler.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attention.h"
#include "variant.h"

namespace ladle {
namespace ops {
struct BoundInputs;
}

// The sizes and dtypes of a call, without its data: q [B,T,H,K], k [B,Tk,H_kv,K], v [B,Tk,H_kv,V]
// (attention: K and V are the head dims D and Dv), contiguous and aligned as fresh allocations are.
struct CallShape {
  std::int64_t batch = 8, tokens = 1024, heads = 16;
  std::int64_t key_dim = 128, value_dim = 128;
  std::int64_t key_tokens = 0,
               kv_heads = 0;  // attention's Tk and the H_kv of k and v; 0: tokens, heads
  DType type = DType::bf16;   // q, k, v and o
  // Packed sequences of these lengths (cu_seqlens; batch must be 1, tokens their sum); empty: none.
  std::vector<std::int64_t> sequence_lengths;
  bool initial_state = false;  // recurrent ops: an f32 initial state [N,H,K,V] is passed
  // The variant's other inputs: a dtype by name, else `type` (recurrent ops), f32 (attention's
  // inputs; u8 for one named attention_mask); a scalar's value by name, else 1.
  std::map<std::string, DType> input_types;
  std::map<std::string, float> scalars;
};

// One kernel of a call, in launch order.
struct GeneratedKernel {
  std::string name;    // the extern "C" symbol; the source's hash is part of it
  std::string source;  // the CUDA C++ NVRTC compiles
  std::string role;  // "recurrent", "chunked", "chunked states", "segmented fold", "delta prepare",
                     // "attention", ...
  std::string tile;  // the tile, as cuda::to_string writes it
  unsigned threads = 0;
  int dynamic_shared_bytes = 0;  // what the launcher passes at launch
};

// The kernels a recurrent call launches on `arch` ("": this GPU, else as without a GPU the library
// plans: an H100's figures). options as the call passes them (algorithm, tiles, reverse,
// return_state, segments); its tensors are ignored: CallShape says the packed sequences and the
// initial state. Throws InvalidArgument as the call would (a tile or shape that does not fit).
std::vector<GeneratedKernel> generated_kernels(const ir::Variant& variant, const CallShape& shape,
                                               const RunOptions& options = {},
                                               const std::string& arch = "");
// The same from a call's bound arguments (ops/bind.h: bind_inputs, and bind_outputs, whose dtypes
// the kernels take), for callers that hold the call's real views: what run_variant_into compiles
// for it at the heuristic's tiles (or the tiles options name). The backward compiles its
// recurrences' kernels side by side this way before it runs them.
std::vector<GeneratedKernel> generated_kernels(const ir::Variant& variant, const ops::BoundInputs& bound,
                                               const RunOptions& options, const std::string& arch = "");

// The same for a softmax-attention variant (window, dropout_p and return_lse from options; segment
// ids i32 and sinks [H,1] f32 where the variant has them; options' tensors are ignored). tile: the
// tile a benchmark or the tuner names; empty: the heuristic's.
std::vector<GeneratedKernel> generated_kernels(
    const ir::AttentionVariant& variant, const CallShape& shape,
    const AttentionRunOptions& options = {}, const std::string& arch = "",
    const std::optional<cuda::AttentionTile>& tile = std::nullopt);

// The backward's kernels of a softmax-attention call of this shape on the GPU (one program: its
// prep and main kernels, named by main's), as gpu::run_attention_backward_into plans them after a
// GPU forward: every floating tensor input's gradient and the sinks' wanted, d_output contiguous
// in q's dtype, the heuristic's tile (`ladle-cache prebuild --backward` compiles these). Throws
// InvalidArgument where the GPU backward does not take the call.
std::vector<GeneratedKernel> generated_backward_kernels(const ir::AttentionVariant& variant, const CallShape& shape,
                                                        const AttentionRunOptions& options = {}, const std::string& arch = "");

// The programs the GPU backward of a recurrent call of this shape compiles (gpu::backward_planned_kernels:
// the recurrences' chunked kernels, the state passes, the slots, totals and chain kernels, the helpers'
// and the block kernel's programs, an update form's), d_output contiguous in the shape's dtype and, where
// options.return_state, a d_final_state; the heuristic's tiles. `ladle-cache prebuild --backward` compiles
// these. arch "": the default target.
std::vector<GeneratedKernel> generated_backward_kernels(const ir::Variant& variant, const CallShape& shape, const RunOptions& options = {},
                                                        const std::string& arch = "");

// Compiles one through the cache, as the launcher does (arch "": this GPU, else the default
// target).
CompiledProgram compile_generated(const GeneratedKernel& kernel, const std::string& arch = "");
// Whether compile_generated would find it in the compile cache (runtime/compiler.h, is_compiled).
bool is_compiled(const GeneratedKernel& kernel, const std::string& arch = "");
// Compiles them through the cache side by side, a thread each, and returns when all have ended. A
// head start only: a kernel that fails to compile fails again where it is launched, with its message.
void compile_side_by_side(const std::vector<GeneratedKernel>& kernels, const std::string& arch = "");

}  // namespace ladle
