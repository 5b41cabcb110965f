// A fingerprint of what a forward call read (FNV-1a over the bytes of every element of its
// tensors and its scalars), so that a backward can tell that the saved value it is handed still
// matches the tensors behind its views. Internal to ops.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ladle/tensor/tensor_view.h>

namespace ladle::ops::detail {

inline std::uint64_t fingerprint(std::uint64_t h, const TensorView& view) {
  const std::size_t size = dtype_size(view.type);
  // Contiguous: 8 bytes at a time (then the tail byte by byte).
  std::int64_t count = 1, expected = 1;
  bool contiguous = true;
  for (int d = view.rank() - 1; d >= 0; --d) {
    if (view.shape[static_cast<std::size_t>(d)] != 1 && view.strides[static_cast<std::size_t>(d)] != expected) contiguous = false;
    expected *= view.shape[static_cast<std::size_t>(d)];
    count *= view.shape[static_cast<std::size_t>(d)];
  }
  if (contiguous) {
    const auto* bytes = static_cast<const unsigned char*>(view.data);
    const std::size_t total = static_cast<std::size_t>(count) * size;
    std::size_t at = 0;
    for (; at + 8 <= total; at += 8) {
      std::uint64_t word;
      std::memcpy(&word, bytes + at, 8);
      h = (h ^ word) * 1099511628211ull;
    }
    for (; at < total; ++at) h = (h ^ bytes[at]) * 1099511628211ull;
    return h;
  }
  std::vector<std::int64_t> index(static_cast<std::size_t>(view.rank()), 0);
  const auto* base = static_cast<const unsigned char*>(view.data);
  for (std::int64_t e = 0; e < count; ++e) {
    std::int64_t offset = 0;
    for (int d = 0; d < view.rank(); ++d) offset += index[static_cast<std::size_t>(d)] * view.strides[static_cast<std::size_t>(d)];
    for (std::size_t b = 0; b < size; ++b) h = (h ^ base[static_cast<std::size_t>(offset) * size + b]) * 1099511628211ull;
    for (int d = view.rank() - 1; d >= 0; --d) {
      if (++index[static_cast<std::size_t>(d)] < view.shape[static_cast<std::size_t>(d)]) break;
      index[static_cast<std::size_t>(d)] = 0;
    }
  }
  return h;
}

// Over the given views (absent ones skipped) and named tensors and scalars.
inline std::uint64_t fingerprint(const std::vector<std::optional<TensorView>>& views, const std::map<std::string, TensorView>& tensors,
                                 const std::map<std::string, float>& scalars) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& view : views)
    if (view) h = fingerprint(h, *view);
  for (const auto& [name, view] : tensors) h = fingerprint(h, view);
  for (const auto& [name, value] : scalars) h = fingerprint(h, TensorView::contiguous(&value, DType::f32, {1}));
  return h;
}

}  // namespace ladle::ops::detail
