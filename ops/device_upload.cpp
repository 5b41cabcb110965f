#include "device_upload.h"

#include <cstring>

namespace ladle::gpu {

std::vector<std::byte> pack_dense(const TensorView& view) {
  const std::size_t size = dtype_size(view.type);
  std::vector<std::byte> out(static_cast<std::size_t>(view.numel()) * size);
  const auto* base = static_cast<const std::byte*>(view.data);
  for_each_offset(view, [&](std::int64_t i, std::int64_t offset) {
    std::memcpy(out.data() + i * size, base + offset * static_cast<std::int64_t>(size), size);
  });
  return out;
}

Uploaded upload(const TensorView& host) {
  Uploaded u;
  const std::vector<std::byte> bytes = pack_dense(host);
  u.buffer = DeviceBuffer(bytes.size());
  u.buffer.copy_from_host(bytes.data(), bytes.size());
  u.view = TensorView::contiguous(reinterpret_cast<const void*>(u.buffer.device_ptr()), host.type, host.shape);
  return u;
}

Uploaded poisoned(DType type, const std::vector<std::int64_t>& shape) {
  Uploaded u;
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  u.buffer = DeviceBuffer(static_cast<std::size_t>(n) * dtype_size(type));
  u.buffer.fill_bytes(0xff);
  u.view = TensorView::contiguous(reinterpret_cast<const void*>(u.buffer.device_ptr()), type, shape);
  return u;
}

}  // namespace ladle::gpu
