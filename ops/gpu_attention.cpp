#include "gpu_attention.h"

#include <ladle/runtime/error.h>

namespace ladle::gpu {

// Intermediate: the generator lands next; these fail clearly until then.
cuda::AttentionTile heuristic_attention_tile(const ops::AttentionArgs&) { return {}; }

cuda::AttentionKernelSpec attention_kernel_spec(const ir::AttentionVariant&, const ops::AttentionArgs&,
                                                const std::optional<cuda::AttentionTile>&) {
  throw InvalidArgument("attention: the GPU kernel family is not built yet");
}

CompiledAttention compile_attention(const ir::AttentionVariant&, const cuda::AttentionKernelSpec&, const std::string&) {
  throw InvalidArgument("attention: the GPU kernel family is not built yet");
}

void run_attention_into(const ir::AttentionVariant&, const ops::AttentionArgs&, const LaunchOptions&) {
  throw InvalidArgument("attention: the GPU kernel family is not built yet");
}

}  // namespace ladle::gpu
