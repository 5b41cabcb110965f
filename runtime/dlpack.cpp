#include "dlpack.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "error.h"

namespace ladle {

namespace {

struct DLPackName {
  DType type;
  std::uint8_t code, bits;
};
constexpr DLPackName kDTypes[] = {
    {DType::f32, kDLFloat, 32}, {DType::f16, kDLFloat, 16}, {DType::bf16, kDLBfloat, 16}, {DType::f64, kDLFloat, 64},
    {DType::i32, kDLInt, 32},   {DType::i64, kDLInt, 64},   {DType::u8, kDLUInt, 8},
};

DType dtype_of_dlpack(const DLDataType& type) {
  if (type.lanes == 1)
    for (const DLPackName& name : kDTypes)
      if (name.code == type.code && name.bits == type.bits) return name.type;
  throw InvalidArgument(fmt::format("view_of(DLTensor): dtype (code {}, bits {}, lanes {}) has no ladle dtype, expected "
                                    "lanes 1 and float 16/32/64, bfloat 16, int 32/64 or uint 8",
                                    type.code, type.bits, type.lanes));
}

Location location_of_dlpack(const DLDevice& device) {
  switch (device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: return Location::host();
    case kDLCUDA:
    case kDLCUDAManaged: return Location::device(device.device_id);
    default: break;
  }
  throw InvalidArgument(fmt::format("view_of(DLTensor): device type {} (id {}) is not one ladle reads, expected kDLCPU, "
                                    "kDLCUDAHost, kDLCUDA or kDLCUDAManaged",
                                    static_cast<int>(device.device_type), device.device_id));
}

// What a DLManagedTensor made by to_dlpack holds: the tensor and the shape and strides it points at.
struct Exported {
  Tensor tensor;
  std::vector<std::int64_t> shape, strides;
  DLManagedTensor managed{};
};

}  // namespace

TensorView view_of(const DLTensor& tensor) {
  if (tensor.ndim < 0) throw InvalidArgument(fmt::format("view_of(DLTensor): ndim is {}, expected >= 0", tensor.ndim));
  if (tensor.ndim > 0 && tensor.shape == nullptr)
    throw InvalidArgument(fmt::format("view_of(DLTensor): ndim is {} but shape is null", tensor.ndim));
  const DType type = dtype_of_dlpack(tensor.dtype);
  std::vector<std::int64_t> shape(tensor.shape, tensor.shape + tensor.ndim);
  TensorView view = TensorView::contiguous(static_cast<const std::byte*>(tensor.data) + tensor.byte_offset, type, shape,
                                           location_of_dlpack(tensor.device));
  if (tensor.strides) view.strides.assign(tensor.strides, tensor.strides + tensor.ndim);
  return view;
}

DLDataType dlpack_dtype(DType type) {
  for (const DLPackName& name : kDTypes)
    if (name.type == type) return {name.code, name.bits, 1};
  detail::throw_unknown_dtype(static_cast<int>(type));
}

DLPackTensor::DLPackTensor(DLManagedTensor* managed) {
  if (managed == nullptr) throw InvalidArgument("DLPackTensor: managed is null, expected a DLManagedTensor");
  owner_.reset(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  view_ = view_of(managed->dl_tensor);
}

DLManagedTensor* to_dlpack(Tensor tensor) {
  auto exported = std::make_unique<Exported>();
  exported->tensor = std::move(tensor);
  exported->shape = exported->tensor.shape();
  exported->strides = exported->tensor.view().strides;
  const Location location = exported->tensor.location();
  DLTensor& dl = exported->managed.dl_tensor;
  dl.data = exported->tensor.data();
  dl.device = location.is_host() ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, location.ordinal};
  dl.ndim = static_cast<int>(exported->shape.size());
  dl.dtype = dlpack_dtype(exported->tensor.type());
  dl.shape = exported->shape.data();
  dl.strides = exported->strides.data();
  dl.byte_offset = 0;
  exported->managed.manager_ctx = exported.get();
  exported->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); };
  return &exported.release()->managed;
}

}  // namespace ladle
