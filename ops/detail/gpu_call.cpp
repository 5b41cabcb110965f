#include "gpu_call.h"

#include <fmt/format.h>

#include <ladle/runtime/driver.h>
#include <ladle/runtime/error.h>

namespace ladle::ops::detail {

bool runs_on_gpu(const std::string& op, Backend backend, const std::vector<NamedView>& views) {
  if (backend == Backend::gpu) return true;
  if (backend == Backend::cpu) {
    require_host_views(op, views, "backend = cpu reads every tensor on the host (copy it to the host, or run with backend = gpu)");
    return false;
  }
  for (const NamedView& named : views)
    if (named.view && named.view->on_device()) return true;
  return driver_available();
}

void require_host_views(const std::string& op, const std::vector<NamedView>& views, const std::string& why) {
  for (const NamedView& named : views)
    if (named.view) require_host(op, named.name, *named.view, why);
}

GpuCall::GpuCall(std::string op, const GpuOptions& options) : op_(std::move(op)), options_(options) {}

void GpuCall::check_address(const std::string& name, const TensorView& view) const {
  if (view.numel() == 0 || view.data == nullptr) return;
  const Location known = location_of(view.data);
  if (view.on_device() && view.location.ordinal != 0)
    throw InvalidArgument(fmt::format("{}: {} is {}, expected memory on cuda:0: the GPU path runs on device 0", op_, name,
                                      describe(view)));
  if (view.on_device() && !known.is_device())
    throw InvalidArgument(fmt::format("{}: {} is {}, but the driver does not know its address {} as device memory (a host "
                                      "pointer given as device memory?): expected a device allocation",
                                      op_, name, describe(view), view.data));
  if (view.on_device() && known.ordinal != view.location.ordinal)
    throw InvalidArgument(fmt::format("{}: {} is {}, but its address {} is memory of {}", op_, name, describe(view), view.data,
                                      to_string(known)));
  if (view.on_host() && known.is_device())
    throw InvalidArgument(fmt::format("{}: {} is {}, but its address {} is device memory of {} (a device pointer given as host "
                                      "memory?): expected Location::device({})",
                                      op_, name, describe(view), view.data, to_string(known), known.ordinal));
}

TensorView GpuCall::input(const std::string& name, const TensorView& view) {
  if (view.on_host() && !options_.upload_host_tensors)
    require_device(op_, name, view, "upload_host_tensors is off, so the GPU path takes device tensors only");
  check_address(name, view);
  if (view.on_device()) return view;
  staged_.push_back(Tensor::copy_of(view, Location::device(0), options_.stream));
  return staged_.back().view();
}

TensorView GpuCall::host_input(const std::string& name, const TensorView& view) {
  check_address(name, view);
  if (view.on_host()) return view;
  staged_.push_back(Tensor::copy_of(view, Location::host(), options_.stream));
  return staged_.back().view();
}

TensorView GpuCall::output(const std::string& name, const TensorView& view) {
  if (view.on_host() && !options_.upload_host_tensors)
    require_device(op_, name, view, "upload_host_tensors is off, so the GPU path writes device tensors only");
  check_address(name, view);
  if (view.on_device()) return view;
  staged_.emplace_back(view.type, view.shape, Location::device(0), options_.stream);
  downloads_.emplace_back(view, &staged_.back());
  return staged_.back().view();
}

void GpuCall::finish() {
  for (const auto& [host, device] : downloads_) copy(device->view(), host, options_.stream);
  downloads_.clear();
  // Staged copies are freed with this call: the kernels that read them must be done. A call on
  // device tensors alone stages nothing and returns with its work queued on the stream.
  if (staged_.empty()) return;
  if (options_.stream) options_.stream->synchronize();
  else Device::get().synchronize();
}

}  // namespace ladle::ops::detail
