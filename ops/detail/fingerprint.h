// A fingerprint of what a forward call read (FNV-1a over the bytes of every element of its
// tensors and its scalars), so that a backward can tell that the saved value it is handed still
// matches the tensors behind its views. Internal to ops.
//
// A device view is hashed on the host: the bytes it spans are copied down on the call's stream
// (which waits for the stream) and hashed as host memory with the same strides, so a device
// tensor gives the value its host copy would and a changed one is caught exactly as a host one
// is. The copy is the price of the check, paid at the forward and again at the backward; hashing
// on the device would save it (nothing else in the GPU path returns to the host).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ladle/runtime/driver.h>
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

// The bytes a view's elements span, from its lowest element to past its highest (strides may be
// 0 or negative): `before` bytes lie between the span's start and view.data.
struct Span {
  std::int64_t before = 0;
  std::size_t bytes = 0;
};
inline Span span_of(const TensorView& view) {
  if (view.numel() == 0) return {};
  const std::int64_t size = static_cast<std::int64_t>(dtype_size(view.type));
  std::int64_t lowest = 0, highest = 0;  // element offsets from view.data
  for (int d = 0; d < view.rank(); ++d) {
    const std::int64_t reach = (view.shape[static_cast<std::size_t>(d)] - 1) * view.strides[static_cast<std::size_t>(d)];
    (reach < 0 ? lowest : highest) += reach;
  }
  return {-lowest * size, static_cast<std::size_t>((highest - lowest + 1) * size)};
}

// A view wherever it lives: a device view's span (not a dense copy, which the driver cannot make
// of a strided view) is copied to the host on `stream`, then hashed as above with the view's own
// strides, so it hashes as the same view in host memory would.
inline std::uint64_t fingerprint_anywhere(std::uint64_t h, const TensorView& view, const Stream* stream) {
  if (view.on_host() || view.numel() == 0) return fingerprint(h, view);
  const Span span = span_of(view);
  std::vector<unsigned char> bytes(span.bytes);
  Device::get(view.location.ordinal);
  copy_device_to_host(bytes.data(), reinterpret_cast<std::uintptr_t>(view.data) - static_cast<std::uintptr_t>(span.before), bytes.size(),
                      stream);
  TensorView host = view;
  host.data = bytes.data() + span.before;
  host.location = Location::host();
  return fingerprint(h, host);
}

// Over the given views (absent ones skipped) and named tensors and scalars, on the host or the
// device (device views copied down on `stream`).
inline std::uint64_t fingerprint(const std::vector<std::optional<TensorView>>& views, const std::map<std::string, TensorView>& tensors,
                                 const std::map<std::string, float>& scalars, const Stream* stream) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& view : views)
    if (view) h = fingerprint_anywhere(h, *view, stream);
  for (const auto& [name, view] : tensors) h = fingerprint_anywhere(h, view, stream);
  for (const auto& [name, value] : scalars) h = fingerprint(h, TensorView::contiguous(&value, DType::f32, {1}));
  return h;
}

}  // namespace ladle::ops::detail
