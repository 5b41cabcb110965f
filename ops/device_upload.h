// Host tensors to the GPU and back, for the ops' host-tensor entry points: a strided host
// view is packed dense, uploaded, and described by a contiguous view of the device copy.
#pragma once

#include <cstddef>
#include <vector>

#include <ladle/codegen/tensor_view.h>
#include <ladle/runtime/driver.h>

namespace ladle::gpu {

// Host strided view -> dense bytes in row-major order.
std::vector<std::byte> pack_dense(const TensorView& view);

struct Uploaded {
  DeviceBuffer buffer;
  TensorView view;  // contiguous, over buffer's device memory, the host view's shape and type
};
Uploaded upload(const TensorView& host);

// A device buffer for a dense tensor of this type and shape, every byte 0xff (NaN in every
// float type, so an element a kernel skips stands out), and its view.
Uploaded poisoned(DType type, const std::vector<std::int64_t>& shape);

}  // namespace ladle::gpu
