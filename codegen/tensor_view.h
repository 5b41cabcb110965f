// A non-owning view of a host tensor (pointer, element type, shape, strides in elements):
// what the CPU path reads and writes and what the ops take. It stands in until
// ladle::Tensor (runtime/tensor.h) is merged; the ops will then gain Tensor overloads that
// make one of these, so nothing below the ops needs to change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ladle/tensor/dtype.h>

namespace ladle {

struct TensorView {
  // Inputs are only read through a view; the const is dropped so that one type serves both.
  void* data = nullptr;
  DType type = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements; may be 0 (broadcast) or negative

  int rank() const { return static_cast<int>(shape.size()); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    return n;
  }

  // A dense row-major view.
  static TensorView contiguous(const void* data, DType type, std::vector<std::int64_t> shape) {
    TensorView view;
    view.data = const_cast<void*>(data);
    view.type = type;
    view.strides.assign(shape.size(), 1);
    for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) view.strides[d] = view.strides[d + 1] * shape[d + 1];
    view.shape = std::move(shape);
    return view;
  }
};

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

// The i32 or i64 element at `offset` (in elements) of an integer view, as int64.
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

}  // namespace ladle
