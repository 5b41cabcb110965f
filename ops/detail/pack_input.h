// The kernel arguments of a variant's inputs (data, strides, heads) from a call's canonical views:
// what every kernel of the recurrence families takes first. Internal to ops (not installed).
#pragma once

#include <ladle/codegen/cpu/recurrent.h>
#include <ladle/codegen/cuda/recurrent.h>
#include <ladle/runtime/driver.h>

namespace ladle::gpu::detail {

// Adds p's argument and returns true when p is one of the input roles (not input_tensor_map).
bool pack_input(KernelArgs& packed, const cuda::KernelParam& p, const ir::Variant& variant, const cpu::RecurrentArgs& args);

}  // namespace ladle::gpu::detail
