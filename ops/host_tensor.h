// An owning, dense, row-major host tensor: what the ops return (o, final_state) until
// ladle::Tensor (runtime/tensor.h) is merged. view() hands it to anything that takes a
// TensorView.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <ladle/tensor/dtype.h>
#include <ladle/codegen/tensor_view.h>

namespace ladle {

class HostTensor {
 public:
  HostTensor() = default;
  // Every element is `fill` (NaN by default, so that an element nobody wrote stands out).
  HostTensor(DType type, std::vector<std::int64_t> shape, float fill = std::numeric_limits<float>::quiet_NaN())
      : type_(type), shape_(std::move(shape)) {
    std::int64_t n = 1;
    for (std::int64_t s : shape_) n *= s;
    bytes_.resize(static_cast<std::size_t>(n) * dtype_size(type_));
    if (type_ == DType::f32)
      std::fill_n(reinterpret_cast<float*>(bytes_.data()), n, fill);
    else
      for (std::int64_t i = 0; i < n; ++i) set(i, fill);
  }

  DType type() const { return type_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const { return static_cast<std::int64_t>(bytes_.size() / dtype_size(type_)); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  TensorView view() const { return TensorView::contiguous(bytes_.data(), type_, shape_); }

  // Element i of the flattened tensor, as float (floating types only).
  float get(std::int64_t i) const { return load_float(bytes_.data() + offset(i), type_); }
  void set(std::int64_t i, float value) { store_float(bytes_.data() + offset(i), type_, value); }

 private:
  std::size_t offset(std::int64_t i) const { return static_cast<std::size_t>(i) * dtype_size(type_); }
  DType type_ = DType::f32;
  std::vector<std::int64_t> shape_;
  std::vector<std::byte> bytes_;
};

// A dense result into a caller's (possibly strided) view of the same type.
inline void store_into(const HostTensor& dense, const TensorView& out) {
  const std::size_t size = dtype_size(out.type);
  auto* base = static_cast<std::byte*>(out.data);
  const auto* src = static_cast<const std::byte*>(dense.data());
  for_each_offset(out, [&](std::int64_t i, std::int64_t offset) {
    std::memcpy(base + offset * static_cast<std::int64_t>(size), src + i * size, size);
  });
}

}  // namespace ladle
