#include "tensor_map.h"

#include <cstring>

#include "error.h"

#include "detail/api.h"
#include "driver.h"

namespace ladle {

std::uint64_t element_bytes(const TensorMapDescription& map) { return map.float32 ? 4 : 2; }

std::uint64_t box_bytes(const TensorMapDescription& map) {
  std::uint64_t bytes = element_bytes(map);
  for (std::uint32_t d = 0; d < map.rank && d < 5; ++d) bytes *= map.box[d];
  return bytes;
}

std::vector<std::string> validate_tensor_map(const TensorMapDescription& map) {
  std::vector<std::string> problems;
  const auto say = [&](const std::string& what) { problems.push_back(what); };
  if (map.rank < 1 || map.rank > 5) {
    say("rank " + std::to_string(map.rank) + ", expected 1 to 5");
    return problems;
  }
  if (reinterpret_cast<std::uintptr_t>(map.address) % 16 != 0) say("the global address is not 16-byte aligned");
  const std::uint64_t size = element_bytes(map);
  if (map.strides[0] != size)
    say("strides[0] = " + std::to_string(map.strides[0]) + ", expected " + std::to_string(size) + " (contiguous " +
        (map.float32 ? "fp32" : "16-bit") + " elements)");
  for (std::uint32_t d = 0; d < map.rank; ++d) {
    const std::string dim = "dimension " + std::to_string(d);
    if (map.dims[d] < 1 || map.dims[d] > (std::uint64_t(1) << 32)) say(dim + " has " + std::to_string(map.dims[d]) + " elements, expected 1 to 2^32");
    if (map.box[d] < 1 || map.box[d] > 256) say(dim + ": box of " + std::to_string(map.box[d]) + ", expected 1 to 256");
    if (d > 0 && (map.strides[d] % 16 != 0 || map.strides[d] >= (std::uint64_t(1) << 40)))
      say(dim + ": stride of " + std::to_string(map.strides[d]) + " bytes, expected a multiple of 16 below 2^40");
  }
  if (map.box[0] * size % 16 != 0 || map.box[0] * size > 128)
    say("inner box of " + std::to_string(map.box[0] * size) + " bytes, expected a multiple of 16 up to 128 (the swizzle span)");
  return problems;
}

namespace {
void check(const TensorMapDescription& map) {
  if (const auto problems = validate_tensor_map(map); !problems.empty())
    throw InvalidArgument("tensor map: " + problems.front());
}
}  // namespace

TensorMap encode_tensor_map(const TensorMapDescription& map) {
  check(map);
  // The driver encodes in a current context (CUDA_ERROR_INVALID_CONTEXT without one, as in a
  // process that has launched nothing yet): the primary context of the thread's device.
  Device::get(Device::current());
  static_assert(sizeof(CUtensorMap) == sizeof(TensorMap), "CUtensorMap is 128 bytes");
  CUtensorMap encoded;
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], element_strides[5];
  for (std::uint32_t d = 0; d < map.rank; ++d) {
    dims[d] = map.dims[d];
    box[d] = map.box[d];
    element_strides[d] = 1;
    if (d > 0) strides[d - 1] = map.strides[d];
  }
  LADLE_CU(detail::cuda().cuTensorMapEncodeTiled(
      &encoded,
      map.float32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : map.bfloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, map.rank,
      const_cast<void*>(map.address), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  TensorMap out;
  std::memcpy(out.bytes, &encoded, sizeof(out.bytes));
  return out;
}

TensorMap describe_tensor_map(const TensorMapDescription& map) {
  check(map);
  TensorMap out;
  std::memcpy(out.bytes, &map, sizeof(map));
  return out;
}

}  // namespace ladle
