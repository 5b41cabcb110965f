// The CUDA driver API, opened at run time: devices, streams, events, device memory,
// modules and launches. Every driver call is checked; a failure throws CudaError naming
// the call. Nothing here needs libcuda to build: on a machine without a driver the first
// use throws NoCudaDriver, and driver_available() answers false without throwing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <memory>
#include <string>
#include <vector>

#include <ladle/tensor/tensor_view.h>

namespace ladle {

struct CompiledProgram;

// True when libcuda.so.1 opened, cuInit succeeded and at least one device exists.
bool driver_available() noexcept;
// Why driver_available() is false ("" when it is true), with the library paths tried.
std::string driver_unavailable_reason();
// The same reason in one short line, for a program's status line: "no CUDA driver
// (libcuda.so.1 could not be opened)" ("" when driver_available() is true).
std::string driver_unavailable_summary();

struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::size_t total_memory = 0;
  int max_shared_per_block_optin = 0;  // bytes, after cuFuncSetAttribute
  int max_shared_per_sm = 0;
  int max_registers_per_block = 0;
  int max_threads_per_block = 0;
  int l2_bytes = 0;
  int driver_version = 0;              // e.g. 13000
  // "sm_90a" on Hopper (so wgmma is available), else "sm_<major><minor>".
  std::string arch() const;
};

class Device {
 public:
  // The ordinal of the device whose context this thread made current last (0 before any).
  static int current();
  static int count();           // throws NoCudaDriver without a driver
  static Device& get(int ordinal = 0);  // retains the primary context, makes it current
  const DeviceProperties& properties() const { return props_; }
  void make_current() const;
  void synchronize() const;
  void* context_handle() const { return context_; }

 private:
  explicit Device(int ordinal);
  int ordinal_;
  void* context_ = nullptr;
  DeviceProperties props_;
};

class Stream {
 public:
  Stream();  // a new non-blocking stream on the current device
  // A stream the caller owns (a framework's current stream, e.g. PyTorch's), used as it is and
  // never destroyed here; nullptr is the legacy default stream.
  static Stream borrowed(void* handle) { return Stream(handle, Borrow{}); }
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(other.stream_), owned_(other.owned_) { other.owned_ = false; }
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void synchronize() const;
  // Whether work queued on this stream is being captured into a CUDA graph (cuStreamIsCapturing):
  // what is launched then is replayed by every launch of the graph.
  bool capturing() const;
  void* handle() const { return stream_; }

 private:
  struct Borrow {};
  Stream(void* handle, Borrow) : stream_(handle), owned_(false) {}
  void* stream_ = nullptr;
  bool owned_ = true;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream* stream = nullptr);
  void synchronize() const;
  // Milliseconds between two recorded events (start.elapsed_ms_to(stop)).
  float elapsed_ms_to(const Event& stop) const;

 private:
  void* event_ = nullptr;
};

// Device memory; moves, never copies.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  // Stream-ordered memory (cuMemAllocAsync): usable by work on `stream` after this call, and
  // given back on that stream when the buffer dies, so neither waits for the device. For
  // scratch memory between the kernels of one call.
  static DeviceBuffer on_stream(std::size_t bytes, const Stream* stream);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::uint64_t device_ptr() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  int ordinal() const { return ordinal_; }  // the device it was allocated on
  // A dense row-major view of the buffer's memory, located on its device.
  TensorView view(DType type, std::vector<std::int64_t> shape) const;
  // Bounds-checked copies: bytes + offset must fit in the buffer.
  void copy_from_host(const void* src, std::size_t bytes, std::size_t offset = 0,
                      const Stream* stream = nullptr);
  void copy_to_host(void* dst, std::size_t bytes, std::size_t offset = 0,
                    const Stream* stream = nullptr) const;
  void copy_from(const DeviceBuffer& src, std::size_t bytes, const Stream* stream = nullptr);
  void fill_bytes(unsigned char value, const Stream* stream = nullptr);

 private:
  std::uint64_t ptr_ = 0;
  std::size_t bytes_ = 0;
  int ordinal_ = 0;
  bool stream_ordered_ = false;
  void* stream_ = nullptr;  // stream_ordered_: the stream it is freed on
  void release() noexcept;
};

// Sets `bytes` bytes of device memory at `ptr` (memory the caller owns, e.g. a view's) to `value`,
// ordered on `stream` (nullptr: the default stream).
void fill_device_bytes(std::uint64_t ptr, std::size_t bytes, unsigned char value, const Stream* stream = nullptr);

// Copies between host memory and device addresses (memory the caller owns, e.g. a view's), ordered
// on `stream` (nullptr: the default stream). A copy into host memory, and any copy on the default
// stream, waits for the stream before it returns; a host source may be freed once the call returns.
void copy_host_to_device(std::uint64_t dst, const void* src, std::size_t bytes, const Stream* stream = nullptr);
void copy_device_to_host(void* dst, std::uint64_t src, std::size_t bytes, const Stream* stream = nullptr);
void copy_device_to_device(std::uint64_t dst, std::uint64_t src, std::size_t bytes, const Stream* stream = nullptr);

// Where the driver knows `address` to live: a device (memory from cuMemAlloc / cudaMalloc, also a
// framework's allocator) with its ordinal, else the host (ordinary or pinned host memory). Needs a
// driver (NoCudaDriver otherwise).
Location location_of(const void* address);

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// Builds a launch's argument array from values; each value is copied and must be trivially
// copyable (pointers as std::uint64_t, ints, floats, structs matching the kernel's).
class KernelArgs {
 public:
  KernelArgs() {
    blocks_.reserve(32);
    offsets_.reserve(64);
  }
  // Copied in, each at its type's alignment, into one buffer (a call packs some 50 arguments; one
  // allocation each was a measurable part of a cached call's host cost).
  template <class T>
  KernelArgs& add(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "kernel arguments are copied bytewise");
    static_assert(alignof(T) <= sizeof(Block), "a kernel argument aligned past 64 bytes");
    const std::size_t offset = (used_ + alignof(T) - 1) / alignof(T) * alignof(T);
    used_ = offset + sizeof(T);
    blocks_.resize((used_ + sizeof(Block) - 1) / sizeof(Block));
    std::memcpy(reinterpret_cast<std::byte*>(blocks_.data()) + offset, &value, sizeof(T));
    offsets_.push_back(offset);
    return *this;
  }
  KernelArgs& add(const DeviceBuffer& buffer) { return add(buffer.device_ptr()); }
  // The address of each argument, in order (valid until the next add).
  void** data() {
    pointers_.resize(offsets_.size());
    for (std::size_t i = 0; i < offsets_.size(); ++i) pointers_[i] = reinterpret_cast<std::byte*>(blocks_.data()) + offsets_[i];
    return pointers_.data();
  }
  std::size_t size() const { return offsets_.size(); }

 private:
  struct alignas(64) Block {
    std::byte bytes[64];
  };
  std::vector<Block> blocks_;
  std::size_t used_ = 0;
  std::vector<std::size_t> offsets_;
  std::vector<void*> pointers_;
};

class Kernel {
 public:
  const std::string& name() const { return name_; }
  // Raises the dynamic shared memory limit (needed past 48 KiB).
  void set_max_dynamic_shared(int bytes);
  int registers() const;           // as the driver reports them
  int local_bytes() const;         // per thread: stack frame and spills
  int static_shared_bytes() const;
  int max_threads_per_block() const;
  void launch(Dim3 grid, Dim3 block, KernelArgs& args, unsigned dynamic_shared = 0,
              const Stream* stream = nullptr) const;
  void* handle() const { return function_; }

 private:
  friend class Module;
  Kernel(void* function, std::string name) : function_(function), name_(std::move(name)) {}
  void* function_;
  std::string name_;
};

// A loaded module: the cubin when the program was compiled for this device's arch,
// otherwise its PTX (JIT-compiled by the driver).
class Module {
 public:
  explicit Module(const CompiledProgram& program);
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Kernel kernel(const std::string& name) const;  // throws CudaError if no such kernel
  bool loaded_from_cubin() const { return from_cubin_; }

 private:
  void* module_ = nullptr;
  bool from_cubin_ = false;
};

}  // namespace ladle
