// xtensor and ladle's views, both ways, over host memory and without a copy:
//   xt::xarray<float> q = ...;              ladle::gla(ladle::view_of(q), ...);
//   auto o = ladle::adapt<float>(result.o.view());   // an xtensor expression over o's memory
// view_of keeps a container's strides (xtensor gives an extent-1 axis stride 0, which a view reads
// the same); adapt keeps the view's, so a transposed or sliced view adapts as it is.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include <xtensor/xadapt.hpp>

#include <ladle/runtime/error.h>
#include <ladle/tensor/tensor_view.h>

namespace ladle {

// The view of an xtensor container or strided view (xt::xarray, xt::xtensor, an xt::adapt result,
// xt::strided_view) of a ladle element type: its memory, shape and strides, on the host. The
// container must outlive the view (so temporaries are refused at compile time).
template <class E>
  requires TensorElement<typename std::remove_const_t<E>::value_type> && requires(E& e) {
    e.data();
    e.data_offset();
    e.strides();
  }
TensorView view_of(E& container) {
  using T = typename std::remove_const_t<E>::value_type;
  TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(container.data() + container.data_offset()));
  view.type = dtype_of<T>;
  view.shape.assign(container.shape().begin(), container.shape().end());
  view.strides.assign(container.strides().begin(), container.strides().end());
  return view;
}
template <class E>
  requires std::is_rvalue_reference_v<E&&>
TensorView view_of(E&& temporary) = delete;  // a view of a temporary would dangle

// An xtensor expression (an xarray_adaptor with the view's shape and strides) over a host view's
// memory: reading and writing it reads and writes the view's elements. T must be the view's dtype;
// a device view, another dtype or a negative stride throw InvalidArgument naming what was found.
template <TensorElement T>
auto adapt(const TensorView& view) {
  require_host("adapt", "view", view, "xtensor reads and writes it on the host");
  if (view.type != dtype_of<T>)
    throw InvalidArgument(std::string("adapt: view is ") + describe(view) + ", expected dtype " + dtype_name(dtype_of<T>));
  std::size_t span = view.numel() > 0 ? 1 : 0;
  for (std::size_t d = 0; d < view.shape.size(); ++d) {
    if (view.strides[d] < 0)
      throw InvalidArgument("adapt: view " + describe(view) + " has a negative stride on axis " + std::to_string(d) +
                            ", expected strides >= 0");
    if (view.shape[d] > 0) span += static_cast<std::size_t>((view.shape[d] - 1) * view.strides[d]);
  }
  std::vector<std::size_t> shape(view.shape.begin(), view.shape.end());
  std::vector<std::ptrdiff_t> strides(view.strides.begin(), view.strides.end());
  return xt::adapt(static_cast<T*>(view.data), span, xt::no_ownership(), std::move(shape), std::move(strides));
}

}  // namespace ladle
