// ladle::Tensor: an owning, dense, row-major tensor in host memory or in a CUDA device's memory.
// What the ops return, what tests, tools and examples fill, and what .npy files load into.
// view() hands it to anything that takes a TensorView; to() and copy() move data between the
// host and a device, ordered on a stream. Device memory comes from runtime/driver.h (libcuda
// opened at run time), so host tensors work on a machine without a driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <vector>

#include <ladle/tensor/tensor_view.h>

#include "driver.h"

namespace ladle {

class Tensor {
 public:
  // f32 of shape [0] on the host: no elements.
  Tensor() : shape_{0} {}
  // Host memory, every element `fill` (NaN by default, so that an element nobody wrote stands
  // out); integer dtypes take fill converted (0 for NaN).
  Tensor(DType type, std::vector<std::int64_t> shape, float fill = std::numeric_limits<float>::quiet_NaN());
  // Memory at `location`: on the host as above; on a device every byte 0xff (NaN in every float
  // type), set on `stream` (nullptr: the default stream). Throws NoCudaDriver without a GPU.
  // Device memory for the default stream (stream nullptr) is stream-ordered on it (cuMemAllocAsync,
  // and cuMemFreeAsync when the tensor dies), so that neither its allocation nor its release waits
  // for the device; a tensor made for another stream keeps cuMemAlloc / cuMemFree (its release
  // waits), since ladle cannot know that stream outlives the tensor.
  Tensor(DType type, std::vector<std::int64_t> shape, Location location, const Stream* stream = nullptr);
  // An output a kernel writes whole: on a device its memory is left as the allocator gives it (no
  // 0xff fill: at B8 T4096 the attention outputs' fills were 0.27 ms a training step), unless
  // LADLE_POISON_OUTPUTS=1 (the test programs set it, so that an element a kernel skips stands out);
  // on the host as the constructor above.
  static Tensor for_output(DType type, std::vector<std::int64_t> shape, Location location, const Stream* stream = nullptr);

  // A copy is deep, in the same location (a device copy is ordered on the default stream).
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;

  DType type() const { return type_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  Location location() const { return location_; }
  std::int64_t numel() const;
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(type_); }
  // The host pointer, or the device address; may be null when numel() is 0.
  void* data();
  const void* data() const;
  TensorView view() const;

  // Element i of the flattened tensor, as float (floating dtypes of a host tensor only: a device
  // tensor throws InvalidArgument; copy it with to(Location::host()) first).
  float get(std::int64_t i) const;
  void set(std::int64_t i, float value);

  // A dense copy at `location`, ordered on `stream`; a copy to the host waits for the stream, so
  // its data can be read at once.
  Tensor to(Location location, const Stream* stream = nullptr) const;
  // A dense copy of any view (host views of any strides; device views contiguous) at `location`.
  static Tensor copy_of(const TensorView& source, Location location, const Stream* stream = nullptr);

 private:
  void check_host(const char* what) const;
  DType type_ = DType::f32;
  std::vector<std::int64_t> shape_;
  Location location_;
  std::vector<std::byte> host_;
  DeviceBuffer device_;
};

// Copies source's elements into target: the same dtype and shape, either on the host or a
// device. Host views may have any strides; a device view must be contiguous (InvalidArgument
// naming it otherwise). Ordered on `stream`; a copy into host memory waits for it.
void copy(const TensorView& source, const TensorView& target, const Stream* stream = nullptr);

// .npy files (format versions 1.0, 2.0 and 3.0 are read; 1.0 is written, 2.0 when the header
// needs it). Descriptors: float32 '<f4', float64 '<f8', float16 '<f2', int32 '<i4', int64
// '<i8', uint8 '|u1'; a bool file ('|b1') loads as uint8.
//
// bfloat16 has no numpy descriptor of its own. numpy saves an ml_dtypes.bfloat16 array with
// descr '<V2' (a 2-byte void) and loads that back as '|V2', to be viewed as bfloat16 with
// `.view(ml_dtypes.bfloat16)`. save_npy writes '<V2' for bfloat16, the same bytes Python
// writes, and load_npy reads both '<V2' and '|V2' as bfloat16 (so any 2-byte void is taken
// to be bfloat16).
//
// A file in Fortran order is transposed into row-major on load, so values land at the same
// indices as in numpy. Big-endian data, structured dtypes, and any other descriptor throw
// InvalidArgument naming the file and the descriptor, as do a missing file, a bad magic
// string, a malformed header and data shorter than the header promises.
Tensor load_npy(const std::filesystem::path& path);
// Any view: a strided one is written in row-major order, a device one is copied to the host
// first. Throws InvalidArgument when the file cannot be created, Error when writing it fails.
void save_npy(const std::filesystem::path& path, const TensorView& tensor);

}  // namespace ladle
