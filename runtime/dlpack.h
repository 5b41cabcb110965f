// DLPack (dlpack/dlpack.h, the DLManagedTensor of DLPack 0.6 and later): a PyTorch, JAX or CuPy
// tensor handed over by an extension reaches the ops as it is, strides, device and all, and
// ladle's tensors go back the same way. No element is copied in either direction.
//   ladle::DLPackTensor q(managed_from_torch);          // owns it; its deleter runs at the end
//   auto out = ladle::gla(q.view(), k.view(), v.view(), g.view());
//   DLManagedTensor* back = ladle::to_dlpack(std::move(out.o));  // the receiver calls deleter
#pragma once

#include <memory>

#include <dlpack/dlpack.h>

#include "tensor.h"

namespace ladle {

// The view of a DLTensor: data (plus byte_offset), dtype, shape, strides in elements (null:
// row-major) and location (kDLCPU and kDLCUDAHost: the host; kDLCUDA and kDLCUDAManaged: that CUDA
// device). Another device type, a dtype ladle has no DType for, or lanes other than 1 throw
// InvalidArgument naming what was found and what is accepted.
TensorView view_of(const DLTensor& tensor);

// DLPack's description of a DType (lanes 1).
DLDataType dlpack_dtype(DType type);

// A DLManagedTensor taken over: its deleter runs once, when the last copy of this object dies.
// view() stays valid as long as this object (or a copy) lives.
class DLPackTensor {
 public:
  // Throws InvalidArgument on a null pointer or a tensor view_of refuses (and then calls its deleter
  // at once, since ownership passed here).
  explicit DLPackTensor(DLManagedTensor* managed);
  const TensorView& view() const { return view_; }
  const DLManagedTensor* managed() const { return owner_.get(); }

 private:
  std::shared_ptr<DLManagedTensor> owner_;
  TensorView view_;
};

// Hands `tensor` over: the returned DLManagedTensor owns it (moved in, no copy: data points at the
// tensor's memory) and describes it row-major on its location; its deleter frees both. Whoever
// receives it calls deleter exactly once, as DLPack asks.
DLManagedTensor* to_dlpack(Tensor tensor);

}  // namespace ladle
