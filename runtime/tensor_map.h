// TMA tensor maps: what a Hopper kernel's cp.async.bulk.tensor copies read to find a box of a
// global tensor. A kernel receives one as a `const __grid_constant__` parameter of 128 bytes.
// The library describes each map once (TensorMapDescription: the arguments of
// cuTensorMapEncodeTiled) and encodes it either through the driver, for a GPU, or as the
// description's own bytes, which the host emulation of the copies reads
// (tests/codegen/cuda_emulation.h). So the boxes and coordinates a kernel uses are checked
// without a GPU; only the driver's encoding of them is not.
//
// Every map here is of 16-bit elements (f16 or bf16) or fp32 ones (the attention backward's dq,
// which TMA reductions add into), with the 128-byte swizzle (each 128-byte
// row r of a box lands with its 16-byte pieces permuted: piece p at p ^ (r % 8), the layout
// wgmma's 128B-swizzle descriptors read), no interleave, and zero fill of the elements of a box
// that lie outside the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ladle {

struct TensorMapDescription {
  const void* address = nullptr;  // global memory, 16-byte aligned
  std::uint32_t rank = 0;         // dimensions, 1 to 5, innermost first
  std::uint32_t bfloat16 = 0;     // 1: bf16 elements, 0: f16 (unless float32)
  std::uint32_t float32 = 0;      // 1: fp32 elements
  std::uint64_t dims[5] = {};     // elements per dimension, 1 to 2^32
  std::uint64_t strides[5] = {};  // bytes between consecutive indices of a dimension; strides[0] = the
                                  // element's size (contiguous); the others multiples of 16, below 2^40
  std::uint32_t box[5] = {};      // elements copied per dimension, 1 to 256; box[0] times the element's size
                                  // a multiple of 16 and at most 128 (the swizzle span)
};
static_assert(sizeof(TensorMapDescription) <= 128, "a description must fit where the encoded map goes");

// The 128 bytes a kernel receives.
struct alignas(64) TensorMap {
  std::byte bytes[128] = {};
};

// The size of the map's elements: 4 for float32, else 2.
std::uint64_t element_bytes(const TensorMapDescription& map);
// Bytes one copy of the whole box moves (elements outside the tensor count: they are written as zeros).
std::uint64_t box_bytes(const TensorMapDescription& map);
// What breaks TMA's rules in a description (empty: encodable).
std::vector<std::string> validate_tensor_map(const TensorMapDescription& map);
// Through the driver (cuTensorMapEncodeTiled). Throws InvalidArgument quoting the rule a
// description breaks, CudaError when the driver refuses it.
TensorMap encode_tensor_map(const TensorMapDescription& map);
// The description's own bytes (after the same checks): what the host emulation reads.
TensorMap describe_tensor_map(const TensorMapDescription& map);

}  // namespace ladle
