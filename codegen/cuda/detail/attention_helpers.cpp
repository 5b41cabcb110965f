// The device helpers of the softmax-attention family, as source text the generated kernels
// open with. Two blocks: the portable one (plain C over the CUDA intrinsics the host emulation
// also provides: __shfl_xor_sync) and the device one (inline PTX: f16 tensor cores, cp.async),
// which a host emulation replaces by defining LADLE_ATTENTION_HELPERS first.
#include "attention_helpers.h"

namespace ladle::cuda::detail {

const char* const attention_helpers = "#include <ladle/codegen/device/attention.cuh>\n";

}  // namespace ladle::cuda::detail
