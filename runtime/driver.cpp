#include "driver.h"

#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "compiler.h"
#include "detail/api.h"
#include "error.h"
#include "log.h"

namespace ladle {
namespace {

const detail::CudaApi& api() { return detail::cuda(); }

// The ordinal of the device whose context this thread made current last.
thread_local int current_ordinal = 0;

CUstream stream_of(const Stream* stream) {
  return stream ? static_cast<CUstream>(stream->handle()) : nullptr;
}

int attribute(CUdevice device, CUdevice_attribute which) {
  int value = 0;
  LADLE_CU(api().cuDeviceGetAttribute(&value, which, device));
  return value;
}

}  // namespace

bool driver_available() noexcept {
  try {
    return Device::count() > 0;
  } catch (...) {
    return false;
  }
}

std::string driver_unavailable_reason() {
  try {
    if (Device::count() == 0) return "no CUDA driver: the driver reports no GPU";
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string driver_unavailable_summary() {
  const std::string failure = detail::cuda_failure_summary();
  if (!failure.empty()) return failure;
  try {
    return Device::count() == 0 ? "no GPU (the CUDA driver reports none)" : "";
  } catch (const std::exception& e) {
    return e.what();  // a failed driver call: one line naming the call
  }
}

std::string DeviceProperties::arch() const {
  // The "a" targets unlock arch-specific instructions (wgmma, setmaxnreg) on Hopper and
  // later; code built for them runs only on that exact major.minor, which is this device.
  const bool has_a_target = cc_major >= 9;
  return fmt::format("sm_{}{}{}", cc_major, cc_minor, has_a_target ? "a" : "");
}

int Device::count() {
  int n = 0;
  LADLE_CU(api().cuDeviceGetCount(&n));
  return n;
}

Device& Device::get(int ordinal) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Device>> devices;
  std::lock_guard lock(mutex);
  const int n = count();
  if (n == 0) throw NoCudaDriver("no CUDA driver: the driver reports no GPU");
  if (ordinal < 0 || ordinal >= n) {
    throw InvalidArgument(
        fmt::format("Device::get: ordinal {} out of range, expected 0..{}", ordinal, n - 1));
  }
  auto& slot = devices[ordinal];
  if (!slot) slot.reset(new Device(ordinal));
  slot->make_current();
  return *slot;
}

Device::Device(int ordinal) : ordinal_(ordinal) {
  CUdevice device = 0;
  LADLE_CU(api().cuDeviceGet(&device, ordinal));
  CUcontext context = nullptr;
  LADLE_CU(api().cuDevicePrimaryCtxRetain(&context, device));
  context_ = context;
  LADLE_CU(api().cuCtxSetCurrent(context));
  char name[256] = {};
  LADLE_CU(api().cuDeviceGetName(name, sizeof(name), device));
  props_.ordinal = ordinal;
  current_ordinal = ordinal;
  props_.name = name;
  props_.cc_major = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  props_.cc_minor = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  props_.sm_count = attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  props_.max_shared_per_block_optin =
      attribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  props_.max_shared_per_sm =
      attribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  props_.max_registers_per_block = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  props_.max_threads_per_block = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  props_.l2_bytes = attribute(device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  std::size_t total = 0;
  LADLE_CU(api().cuDeviceTotalMem(&total, device));
  props_.total_memory = total;
  LADLE_CU(api().cuDriverGetVersion(&props_.driver_version));
}

int Device::current() { return current_ordinal; }

void Device::make_current() const {
  LADLE_CU(api().cuCtxSetCurrent(static_cast<CUcontext>(context_)));
  current_ordinal = ordinal_;
}

void Device::synchronize() const {
  make_current();
  LADLE_CU(api().cuCtxSynchronize());
}

Stream::Stream() {
  Device::get();  // a current context
  CUstream stream = nullptr;
  LADLE_CU(api().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  stream_ = stream;
}

Stream::~Stream() {
  if (owned_ && stream_) api().cuStreamDestroy(static_cast<CUstream>(stream_));
}

void Stream::synchronize() const { LADLE_CU(api().cuStreamSynchronize(static_cast<CUstream>(stream_))); }

bool Stream::capturing() const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  LADLE_CU(api().cuStreamIsCapturing(static_cast<CUstream>(stream_), &status));
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

Event::Event() {
  Device::get();
  CUevent event = nullptr;
  LADLE_CU(api().cuEventCreate(&event, CU_EVENT_DEFAULT));
  event_ = event;
}

Event::~Event() {
  if (event_) api().cuEventDestroy(static_cast<CUevent>(event_));
}

void Event::record(const Stream* stream) {
  LADLE_CU(api().cuEventRecord(static_cast<CUevent>(event_), stream_of(stream)));
}

void Event::synchronize() const { LADLE_CU(api().cuEventSynchronize(static_cast<CUevent>(event_))); }

float Event::elapsed_ms_to(const Event& stop) const {
  float ms = 0;
  LADLE_CU(api().cuEventElapsedTime(&ms, static_cast<CUevent>(event_),
                                    static_cast<CUevent>(stop.event_)));
  return ms;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  Device::get(Device::current());  // the device this thread made current (0 unless told otherwise)
  ordinal_ = Device::current();
  if (bytes == 0) return;
  CUdeviceptr ptr = 0;
  LADLE_CU(api().cuMemAlloc(&ptr, bytes));
  ptr_ = ptr;
}

DeviceBuffer DeviceBuffer::on_stream(std::size_t bytes, const Stream* stream) {
  Device::get(Device::current());
  DeviceBuffer buffer;
  buffer.bytes_ = bytes;
  if (bytes == 0) return buffer;
  // The device's pool keeps what stream-ordered frees give back instead of returning it to the OS
  // at every synchronisation (the default threshold, 0): the next call's scratch memory is then
  // mapped already. Otherwise the segmented chunked form's per-call scratch left the GPU idle
  // between calls (bench/RESULTS.md, "Evidence behind the heuristics", H17).
  static std::once_flag keep_pool;
  std::call_once(keep_pool, [] {
    CUdevice device = 0;
    LADLE_CU(api().cuDeviceGet(&device, Device::get().properties().ordinal));
    CUmemoryPool pool = nullptr;
    LADLE_CU(api().cuDeviceGetDefaultMemPool(&pool, device));
    cuuint64_t keep = ~cuuint64_t{0};
    LADLE_CU(api().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  });
  CUdeviceptr ptr = 0;
  LADLE_CU(api().cuMemAllocAsync(&ptr, bytes, stream_of(stream)));
  buffer.ptr_ = ptr;
  buffer.ordinal_ = Device::current();
  buffer.stream_ordered_ = true;
  buffer.stream_ = stream_of(stream);
  return buffer;
}

void DeviceBuffer::release() noexcept {
  if (!ptr_) return;
  if (stream_ordered_) api().cuMemFreeAsync(static_cast<CUdeviceptr>(ptr_), static_cast<CUstream>(stream_));
  else api().cuMemFree(static_cast<CUdeviceptr>(ptr_));
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      ordinal_(std::exchange(other.ordinal_, 0)),
      stream_ordered_(std::exchange(other.stream_ordered_, false)),
      stream_(std::exchange(other.stream_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    ordinal_ = std::exchange(other.ordinal_, 0);
    stream_ordered_ = std::exchange(other.stream_ordered_, false);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

namespace {
void check_range(const char* what, std::size_t bytes, std::size_t offset, std::size_t size) {
  if (offset > size || bytes > size - offset) {
    throw InvalidArgument(fmt::format("DeviceBuffer::{}: {} bytes at offset {} exceed the buffer "
                                      "of {} bytes",
                                      what, bytes, offset, size));
  }
}
}  // namespace

void DeviceBuffer::copy_from_host(const void* src, std::size_t bytes, std::size_t offset,
                                  const Stream* stream) {
  check_range("copy_from_host", bytes, offset, bytes_);
  if (bytes == 0) return;
  LADLE_CU(api().cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(ptr_ + offset), src, bytes,
                                   stream_of(stream)));
  if (!stream) LADLE_CU(api().cuStreamSynchronize(nullptr));
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t bytes, std::size_t offset,
                                const Stream* stream) const {
  check_range("copy_to_host", bytes, offset, bytes_);
  if (bytes == 0) return;
  LADLE_CU(api().cuMemcpyDtoHAsync(dst, static_cast<CUdeviceptr>(ptr_ + offset), bytes,
                                   stream_of(stream)));
  if (!stream) LADLE_CU(api().cuStreamSynchronize(nullptr));
}

void DeviceBuffer::copy_from(const DeviceBuffer& src, std::size_t bytes, const Stream* stream) {
  check_range("copy_from (destination)", bytes, 0, bytes_);
  check_range("copy_from (source)", bytes, 0, src.bytes_);
  if (bytes == 0) return;
  LADLE_CU(api().cuMemcpyDtoDAsync(static_cast<CUdeviceptr>(ptr_),
                                   static_cast<CUdeviceptr>(src.ptr_), bytes, stream_of(stream)));
}

TensorView DeviceBuffer::view(DType type, std::vector<std::int64_t> shape) const {
  return TensorView::contiguous(reinterpret_cast<const void*>(ptr_), type, std::move(shape), Location::device(ordinal_));
}

void copy_host_to_device(std::uint64_t dst, const void* src, std::size_t bytes, const Stream* stream) {
  if (bytes == 0) return;
  LADLE_CU(api().cuMemcpyHtoDAsync(static_cast<CUdeviceptr>(dst), src, bytes, stream_of(stream)));
  if (!stream) LADLE_CU(api().cuStreamSynchronize(nullptr));
}

void copy_device_to_host(void* dst, std::uint64_t src, std::size_t bytes, const Stream* stream) {
  if (bytes == 0) return;
  LADLE_CU(api().cuMemcpyDtoHAsync(dst, static_cast<CUdeviceptr>(src), bytes, stream_of(stream)));
  LADLE_CU(api().cuStreamSynchronize(stream_of(stream)));
}

void copy_device_to_device(std::uint64_t dst, std::uint64_t src, std::size_t bytes, const Stream* stream) {
  if (bytes == 0) return;
  LADLE_CU(api().cuMemcpyDtoDAsync(static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src), bytes, stream_of(stream)));
  if (!stream) LADLE_CU(api().cuStreamSynchronize(nullptr));
}

Location location_of(const void* address) {
  Device::get(Device::current());  // a current context
  const auto pointer = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(address));
  // cuPointerGetAttributes, not cuPointerGetAttribute: for an address the driver never saw (ordinary
  // host memory) it answers CUDA_SUCCESS with memory type 0 instead of CUDA_ERROR_INVALID_VALUE, so
  // a host tensor's check is not an API error (compute-sanitizer reported every one of them).
  unsigned int memory_type = 0;
  int ordinal = 0;
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* values[] = {&memory_type, &ordinal};
  LADLE_CU(api().cuPointerGetAttributes(2, attributes, values, pointer));
  // Managed memory counts as device memory: kernels read it where it is.
  if (memory_type != CU_MEMORYTYPE_DEVICE && memory_type != CU_MEMORYTYPE_UNIFIED) return Location::host();
  return Location::device(ordinal);
}

void DeviceBuffer::fill_bytes(unsigned char value, const Stream* stream) { fill_device_bytes(ptr_, bytes_, value, stream); }

void fill_device_bytes(std::uint64_t ptr, std::size_t bytes, unsigned char value, const Stream* stream) {
  if (bytes == 0) return;
  LADLE_CU(api().cuMemsetD8Async(static_cast<CUdeviceptr>(ptr), value, bytes, stream_of(stream)));
}

namespace {
int function_attribute(void* function, CUfunction_attribute which) {
  int value = 0;
  LADLE_CU(api().cuFuncGetAttribute(&value, which, static_cast<CUfunction>(function)));
  return value;
}
}  // namespace

void Kernel::set_max_dynamic_shared(int bytes) {
  LADLE_CU(api().cuFuncSetAttribute(static_cast<CUfunction>(function_),
                                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes));
}

int Kernel::registers() const { return function_attribute(function_, CU_FUNC_ATTRIBUTE_NUM_REGS); }

int Kernel::local_bytes() const { return function_attribute(function_, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES); }

int Kernel::static_shared_bytes() const { return function_attribute(function_, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES); }

int Kernel::max_threads_per_block() const { return function_attribute(function_, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK); }

void Kernel::launch(Dim3 grid, Dim3 block, KernelArgs& args, unsigned dynamic_shared,
                    const Stream* stream) const {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
    throw InvalidArgument(fmt::format("launch {}: grid ({},{},{}) and block ({},{},{}) must be "
                                      "non-zero",
                                      name_, grid.x, grid.y, grid.z, block.x, block.y, block.z));
  }
  const CUresult result = api().cuLaunchKernel(
      static_cast<CUfunction>(function_), grid.x, grid.y, grid.z, block.x, block.y, block.z,
      dynamic_shared, stream_of(stream), args.data(), nullptr);
  if (result != CUDA_SUCCESS) {
    try {
      detail::check_cuda(result, "cuLaunchKernel");
    } catch (const CudaError& e) {
      throw CudaError(fmt::format("{} [kernel {}, grid ({},{},{}), block ({},{},{}), {} bytes "
                                  "dynamic shared]",
                                  e.what(), name_, grid.x, grid.y, grid.z, block.x, block.y,
                                  block.z, dynamic_shared),
                      e.code());
    }
  }
}

Module::Module(const CompiledProgram& program) {
  const auto& props = Device::get().properties();
  // The cubin is only usable on the arch it was built for; otherwise let the driver JIT
  // the PTX (slower first load, but correct on any newer GPU).
  from_cubin_ = !program.cubin.empty() && program.arch == props.arch();
  const void* image = from_cubin_ ? static_cast<const void*>(program.cubin.data())
                                  : static_cast<const void*>(program.ptx.c_str());
  if (!from_cubin_ && program.ptx.empty()) {
    throw InvalidArgument("Module: the program has neither a cubin for this device nor PTX");
  }
  CUmodule module = nullptr;
  char error_log[4096] = {};
  CUjit_option keys[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[] = {error_log, reinterpret_cast<void*>(sizeof(error_log))};
  const CUresult result = api().cuModuleLoadDataEx(&module, image, 2, keys, values);
  if (result != CUDA_SUCCESS) {
    try {
      detail::check_cuda(result, from_cubin_ ? "cuModuleLoadDataEx(cubin)" : "cuModuleLoadDataEx(ptx)");
    } catch (const CudaError& e) {
      throw CudaError(fmt::format("{} for {} on {} ({}): {}", e.what(), program.arch, props.name,
                                  props.arch(), error_log),
                      e.code());
    }
  }
  module_ = module;
}

Module::~Module() {
  if (module_) api().cuModuleUnload(static_cast<CUmodule>(module_));
}

Kernel Module::kernel(const std::string& name) const {
  CUfunction function = nullptr;
  const CUresult result = api().cuModuleGetFunction(&function, static_cast<CUmodule>(module_),
                                                    name.c_str());
  if (result != CUDA_SUCCESS) {
    try {
      detail::check_cuda(result, "cuModuleGetFunction");
    } catch (const CudaError& e) {
      throw CudaError(fmt::format("{}: no kernel named '{}' in the module (extern \"C\" "
                                  "missing, or a mangled name?)",
                                  e.what(), name),
                      e.code());
    }
  }
  return Kernel(function, name);
}

}  // namespace ladle
