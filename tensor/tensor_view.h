// A non-owning view of a tensor: data pointer, dtype, shape, strides in elements, and where the
// memory lives (the host, or a CUDA device and its ordinal). Every op takes these; the CPU path
// reads host views only and the GPU path device views (uploading host ones unless told not to),
// so a pointer is never dereferenced on the wrong side. Owning tensors (runtime/tensor.h), DLPack
// tensors and xtensor containers (tensor/interop.h) all hand out views of this type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ladle/tensor/dtype.h>

namespace ladle {

enum class MemoryKind : std::uint8_t { host, device };

// Where a tensor's memory lives. A device location names the CUDA device's ordinal.
struct Location {
  MemoryKind kind = MemoryKind::host;
  int ordinal = 0;  // the device's ordinal; 0 on the host

  static constexpr Location host() { return {}; }
  static constexpr Location device(int ordinal = 0) { return {MemoryKind::device, ordinal}; }
  constexpr bool is_host() const { return kind == MemoryKind::host; }
  constexpr bool is_device() const { return kind == MemoryKind::device; }
  friend constexpr bool operator==(const Location&, const Location&) = default;
};

// "host", "cuda:0".
inline std::string to_string(const Location& location) {
  return location.is_host() ? std::string("host") : "cuda:" + std::to_string(location.ordinal);
}

struct TensorView {
  // Inputs are only read through a view; the const is dropped so that one type serves both.
  // On a device this is the device address (a CUdeviceptr), not a host pointer.
  void* data = nullptr;
  DType type = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements; may be 0 (broadcast) or negative
  Location location;                  // the host unless said otherwise

  int rank() const { return static_cast<int>(shape.size()); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    return n;
  }
  bool on_host() const { return location.is_host(); }
  bool on_device() const { return location.is_device(); }
  // Dense row-major: every stride the product of the extents after it (extents of 1 excepted).
  bool is_contiguous() const {
    std::int64_t expected = 1;
    for (int d = rank() - 1; d >= 0; --d) {
      if (shape[d] != 1 && strides[d] != expected) return false;
      expected *= shape[d];
    }
    return true;
  }

  // A dense row-major view.
  static TensorView contiguous(const void* data, DType type, std::vector<std::int64_t> shape,
                               Location location = Location::host()) {
    TensorView view;
    view.data = const_cast<void*>(data);
    view.type = type;
    view.location = location;
    view.strides.assign(shape.size(), 1);
    for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) view.strides[d] = view.strides[d + 1] * shape[d + 1];
    view.shape = std::move(shape);
    return view;
  }
};

// "bf16[2,64,8,128] on cuda:0": what error messages say about a view.
std::string describe(const TensorView& view);

// The checks every entry point makes before it touches a view's memory: `argument` is the name
// the caller knows ("q", "initial_state"), `op` the entry point. Each throws InvalidArgument
//   recurrent: q is bf16[2,64,8,128] on cuda:0, expected host memory (the CPU path reads it ...)
void require_host(const std::string& op, const std::string& argument, const TensorView& view,
                  const std::string& why = "the CPU path reads it on the host");
void require_device(const std::string& op, const std::string& argument, const TensorView& view,
                    const std::string& why = "the GPU path reads it on the device");

// Bytes from a view's first element to one past its last, for non-negative strides (broadcast
// axes at stride 0 add nothing; an empty view spans none).
inline std::size_t span_bytes(const TensorView& view) {
  std::int64_t last = 0;
  for (std::size_t d = 0; d < view.shape.size(); ++d) {
    if (view.shape[d] == 0) return 0;
    last += (view.shape[d] - 1) * view.strides[d];
  }
  return static_cast<std::size_t>(last + 1) * dtype_size(view.type);
}

// The i32 or i64 element at `offset` (in elements) of an integer host view, as int64.
inline std::int64_t load_integer(const TensorView& view, std::int64_t offset) {
  const auto* p = static_cast<const std::byte*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.type));
  if (view.type == DType::i32) {
    std::int32_t x;
    std::memcpy(&x, p, sizeof x);
    return x;
  }
  std::int64_t x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// Calls f(i, offset) for every element in row-major order: i counts elements 0..numel-1,
// offset is the element's position in the view's storage (in elements, from strides).
template <class F>
void for_each_offset(const TensorView& view, F&& f) {
  std::vector<std::int64_t> index(view.shape.size(), 0);
  const std::int64_t n = view.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < index.size(); ++d) offset += index[d] * view.strides[d];
    f(i, offset);
    for (int d = static_cast<int>(index.size()) - 1; d >= 0; --d) {
      if (++index[d] < view.shape[d]) break;
      index[d] = 0;
    }
  }
}

// Copies a host view's elements into a host view of the same dtype and shape (any strides).
void copy_host(const TensorView& source, const TensorView& target);

}  // namespace ladle
