// The device helpers of the softmax-attention kernels (source text; see attention_helpers.cpp).
// Internal to codegen (not installed).
#pragma once

namespace ladle::cuda::detail {

// Row reductions over a quad, the dropout hash, u8 loads (portable: the host emulation runs
// them as they are); f16 mma, packing, cp.async, shared zero-fill (device: guarded by
// LADLE_ATTENTION_HELPERS, which the host emulation defines with its own versions).
extern const char* const attention_helpers;

}  // namespace ladle::cuda::detail
