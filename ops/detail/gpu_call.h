// Where an op call runs and how its tensors get there, shared by every op family: the CPU path
// takes host memory only (a device tensor is an error naming it); the GPU path keeps device
// tensors where they are (no host round trip), uploads host inputs on the call's stream unless
// GpuOptions::upload_host_tensors is off, and gives host outputs a device stand-in that
// finish() copies back. A view's location is checked against the driver's record of its address,
// so a host pointer said to be device memory (or the reverse) is refused before a kernel reads it.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include <ladle/runtime/tensor.h>
#include <ladle/tensor/tensor_view.h>

#include <ladle/ops/variant.h>

namespace ladle::ops::detail {

struct NamedView {
  std::string name;
  const TensorView* view;
};

// The backend a call runs on: gpu or cpu when asked; automatic: the GPU when any tensor is device
// memory or a driver and device are present. Backend::cpu with a device tensor throws naming it, so
// false means every view is in host memory: the CPU path needs no check of its own.
bool runs_on_gpu(const std::string& op, Backend backend, const std::vector<NamedView>& views);

// The CPU path's check: every view in host memory.
void require_host_views(const std::string& op, const std::vector<NamedView>& views, const std::string& why);

class GpuCall {
 public:
  // Every device view of the call must be on device 0 (the device the GPU path runs on).
  GpuCall(std::string op, const GpuOptions& options);
  GpuCall(const GpuCall&) = delete;
  GpuCall& operator=(const GpuCall&) = delete;

  // An input as the kernels read it: a device view as it is, a host view uploaded (dense).
  TensorView input(const std::string& name, const TensorView& view);
  // An index input that the checks read on the host (cu_seqlens): a device view is copied down.
  TensorView host_input(const std::string& name, const TensorView& view);
  // An output: a device view as it is; a host view gets a device stand-in (every byte 0xff), copied
  // back into it by finish().
  TensorView output(const std::string& name, const TensorView& view);
  // Copies the host outputs back and waits for the stream when anything was staged; a call on
  // device tensors alone returns with its work queued on the stream.
  void finish();

  const Stream* stream() const { return options_.stream; }

 private:
  void check_address(const std::string& name, const TensorView& view) const;
  std::string op_;
  GpuOptions options_;
  std::deque<Tensor> staged_;
  std::vector<std::pair<TensorView, const Tensor*>> downloads_;  // host output, its device stand-in
};

}  // namespace ladle::ops::detail
