#include "tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "error.h"

namespace ladle {

namespace {

std::int64_t count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t extent : shape) {
    if (extent < 0) throw InvalidArgument(fmt::format("Tensor: shape has extent {}, expected none negative", extent));
    n *= extent;
  }
  return n;
}

std::uint64_t address(const TensorView& view) { return reinterpret_cast<std::uintptr_t>(view.data); }

// A host view's elements, dense in row-major order.
std::vector<std::byte> packed(const TensorView& view) {
  std::vector<std::byte> dense(static_cast<std::size_t>(view.numel()) * dtype_size(view.type));
  copy_host(view, TensorView::contiguous(dense.data(), view.type, view.shape));
  return dense;
}

}  // namespace

Tensor::Tensor(DType type, std::vector<std::int64_t> shape, float fill) : type_(type), shape_(std::move(shape)) {
  const std::int64_t n = count(shape_);
  host_.resize(static_cast<std::size_t>(n) * dtype_size(type_));
  if (type_ == DType::f32) {
    std::fill_n(reinterpret_cast<float*>(host_.data()), n, fill);
  } else if (is_floating(type_)) {
    for (std::int64_t i = 0; i < n; ++i) store_float(host_.data() + i * dtype_size(type_), type_, fill);
  } else {
    visit_dtype(type_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_integral_v<T>) std::fill_n(reinterpret_cast<T*>(host_.data()), n, fill == fill ? static_cast<T>(fill) : T{0});
    });
  }
}

namespace {

// A tensor's device memory: stream-ordered on the default stream (the legacy stream, which orders
// itself with every blocking stream, and which outlives every tensor), else plain cuMemAlloc.
DeviceBuffer device_memory(std::size_t bytes, const Stream* stream) {
  return stream == nullptr || stream->handle() == nullptr ? DeviceBuffer::on_stream(bytes, nullptr) : DeviceBuffer(bytes);
}

}  // namespace

Tensor::Tensor(DType type, std::vector<std::int64_t> shape, Location location, const Stream* stream)
    : type_(type), shape_(std::move(shape)), location_(location) {
  if (location_.is_host()) {
    *this = Tensor(type_, std::move(shape_));
    return;
  }
  Device::get(location_.ordinal);
  device_ = device_memory(static_cast<std::size_t>(count(shape_)) * dtype_size(type_), stream);
  device_.fill_bytes(0xff, stream);
}

Tensor Tensor::for_output(DType type, std::vector<std::int64_t> shape, Location location, const Stream* stream) {
  static const bool poison = [] {
    const char* value = std::getenv("LADLE_POISON_OUTPUTS");
    return value != nullptr && std::string(value) == "1";
  }();
  if (location.is_host() || poison) return Tensor(type, std::move(shape), location, stream);
  Device::get(location.ordinal);
  Tensor out;
  out.type_ = type;
  out.shape_ = std::move(shape);
  out.location_ = location;
  out.device_ = device_memory(static_cast<std::size_t>(count(out.shape_)) * dtype_size(type), stream);
  return out;
}

Tensor::Tensor(const Tensor& other) : Tensor(other.to(other.location_)) {}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = other.to(other.location_);
  return *this;
}

std::int64_t Tensor::numel() const { return count(shape_); }

void* Tensor::data() {
  return location_.is_host() ? static_cast<void*>(host_.data()) : reinterpret_cast<void*>(device_.device_ptr());
}

const void* Tensor::data() const {
  return location_.is_host() ? static_cast<const void*>(host_.data()) : reinterpret_cast<const void*>(device_.device_ptr());
}

TensorView Tensor::view() const { return TensorView::contiguous(data(), type_, shape_, location_); }

void Tensor::check_host(const char* what) const {
  if (location_.is_device())
    throw InvalidArgument(fmt::format("Tensor::{}: the tensor is {}, expected host memory (copy it with to(Location::host()))",
                                      what, describe(view())));
}

float Tensor::get(std::int64_t i) const {
  check_host("get");
  return load_float(host_.data() + static_cast<std::size_t>(i) * dtype_size(type_), type_);
}

void Tensor::set(std::int64_t i, float value) {
  check_host("set");
  store_float(host_.data() + static_cast<std::size_t>(i) * dtype_size(type_), type_, value);
}

Tensor Tensor::to(Location location, const Stream* stream) const { return copy_of(view(), location, stream); }

Tensor Tensor::copy_of(const TensorView& source, Location location, const Stream* stream) {
  Tensor out;
  out.type_ = source.type;
  out.shape_ = source.shape;
  out.location_ = location;
  if (location.is_host()) {
    out.host_.resize(static_cast<std::size_t>(source.numel()) * dtype_size(source.type));
  } else {
    Device::get(location.ordinal);
    out.device_ = device_memory(static_cast<std::size_t>(source.numel()) * dtype_size(source.type), stream);
  }
  copy(source, out.view(), stream);
  return out;
}

void copy(const TensorView& source, const TensorView& target, const Stream* stream) {
  if (source.type != target.type || source.shape != target.shape)
    throw InvalidArgument(fmt::format("copy: source is {}, target is {}, expected the same dtype and shape", describe(source),
                                      describe(target)));
  if (source.on_host() && target.on_host()) return copy_host(source, target);
  if (source.on_device() && !source.is_contiguous())
    throw InvalidArgument(fmt::format("copy: source is a strided device view ({}), expected a contiguous one", describe(source)));
  if (target.on_device() && !target.is_contiguous())
    throw InvalidArgument(fmt::format("copy: target is a strided device view ({}), expected a contiguous one", describe(target)));
  const std::size_t bytes = static_cast<std::size_t>(source.numel()) * dtype_size(source.type);
  if (bytes == 0) return;
  if (source.on_device() && target.on_device()) {
    copy_device_to_device(address(target), address(source), bytes, stream);
  } else if (target.on_device()) {
    if (source.is_contiguous()) {
      copy_host_to_device(address(target), source.data, bytes, stream);
    } else {
      const std::vector<std::byte> dense = packed(source);  // staged by the driver before the call returns
      copy_host_to_device(address(target), dense.data(), bytes, stream);
    }
  } else if (target.is_contiguous()) {
    copy_device_to_host(target.data, address(source), bytes, stream);
  } else {
    std::vector<std::byte> dense(bytes);
    copy_device_to_host(dense.data(), address(source), bytes, stream);
    copy_host(TensorView::contiguous(dense.data(), source.type, source.shape), target);
  }
}

}  // namespace ladle
