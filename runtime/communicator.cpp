// Communicators (communicator.h): NCCL opened at run time, and a group of threads.
#include "communicator.h"

#include <dlfcn.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "driver.h"
#include "error.h"
#include "detail/nccl_api.h"

#ifndef LADLE_DEFAULT_CUDA_ROOT
#define LADLE_DEFAULT_CUDA_ROOT "/usr/local/cuda"
#endif

namespace ladle {
namespace detail {
namespace {

struct NcclTable {
  NcclApi api;
  std::string failure;
};

const NcclTable& nccl_table() {
  static NcclTable table;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("LADLE_NCCL_LIBRARY"); env && *env) {
      candidates.emplace_back(env);  // explicit: the only candidate
    } else {
      candidates.emplace_back("libnccl.so.2");
      std::vector<std::string> roots;
      if (const char* home = std::getenv("CUDA_HOME")) roots.emplace_back(home);
      roots.emplace_back(LADLE_DEFAULT_CUDA_ROOT);
      roots.emplace_back("/usr/local/cuda");
      for (const auto& root : roots)
        for (const char* lib : {"lib64", "lib", "targets/x86_64-linux/lib"}) candidates.push_back(root + "/" + lib + "/libnccl.so.2");
    }
    std::string tried;
    void* handle = nullptr;
    for (const auto& candidate : candidates) {
      dlerror();
      handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) {
        table.api.library_path = candidate;
        break;
      }
      const char* why = dlerror();
      tried += fmt::format("\n  {}: {}", candidate, why ? why : "not found");
    }
    if (!handle) {
      table.failure = "ladle could not open libnccl (NCCL, for context parallelism across GPUs). Install NCCL or set "
                      "LADLE_NCCL_LIBRARY to the library's path. Tried:" + tried;
      return;
    }
#define LADLE_BIND_NCCL(name)                                                                                      \
  if (void* symbol = dlsym(handle, #name)) {                                                                       \
    table.api.name = reinterpret_cast<decltype(table.api.name)>(symbol);                                            \
  } else {                                                                                                         \
    table.failure = fmt::format("{} has no symbol {} (NCCL too old for ladle?)", table.api.library_path, #name); \
    return;                                                                                                        \
  }
    LADLE_NCCL_FUNCTIONS(LADLE_BIND_NCCL)
#undef LADLE_BIND_NCCL
  });
  return table;
}

}  // namespace

const NcclApi& nccl() {
  const NcclTable& table = nccl_table();
  if (!table.failure.empty()) throw LibraryUnavailable(table.failure);
  return table.api;
}

void check_nccl(int result, const char* call, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  const NcclApi& api = nccl();
  const char* name = api.ncclGetErrorString(static_cast<ncclResult_t>(result));
  const char* last = comm ? api.ncclGetLastError(comm) : nullptr;
  throw CudaError(fmt::format("{} failed: {} ({}){}{}", call, name ? name : "unknown NCCL error", result,
                              last && *last ? ": " : "", last ? last : ""),
                  result);
}

}  // namespace detail

#define LADLE_NCCL(call, comm) ::ladle::detail::check_nccl(static_cast<int>(call), #call, comm)

bool nccl_available() { return detail::nccl_table().failure.empty(); }
std::string nccl_library_path() { return nccl_available() ? detail::nccl_table().api.library_path : std::string(); }

NcclCommunicator::NcclCommunicator(ncclComm_t comm) : comm_(comm) {
  if (!comm) throw InvalidArgument("NcclCommunicator: comm is null, expected the caller's ncclComm_t");
  const detail::NcclApi& api = detail::nccl();
  LADLE_NCCL(api.ncclCommUserRank(comm_, &rank_), comm_);
  LADLE_NCCL(api.ncclCommCount(comm_, &size_), comm_);
  LADLE_NCCL(api.ncclCommCuDevice(comm_, &device_), comm_);
}

void NcclCommunicator::all_gather(const void* send, void* receive, std::size_t bytes, const Stream* stream) {
  const detail::NcclApi& api = detail::nccl();
  LADLE_NCCL(api.ncclAllGather(send, receive, bytes, ncclInt8, comm_, static_cast<cudaStream_t>(stream ? stream->handle() : nullptr)),
             comm_);
}

void NcclCommunicator::all_sum(float* data, std::size_t count, const Stream* stream) {
  const detail::NcclApi& api = detail::nccl();
  LADLE_NCCL(api.ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_,
                               static_cast<cudaStream_t>(stream ? stream->handle() : nullptr)),
             comm_);
}

std::string NcclCommunicator::describe() const { return fmt::format("NCCL rank {} of {} on cuda:{}", rank_, size_, device_); }

namespace nccl {

UniqueId unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId), "ncclUniqueId's size");
  ncclUniqueId id;
  LADLE_NCCL(detail::nccl().ncclGetUniqueId(&id), nullptr);
  UniqueId out;
  std::memcpy(out.bytes.data(), &id, sizeof id);
  return out;
}

ncclComm_t init_rank(int ranks, const UniqueId& id, int rank) {
  if (ranks < 1) throw InvalidArgument(fmt::format("nccl::init_rank: ranks = {}, expected at least 1", ranks));
  if (rank < 0 || rank >= ranks) throw InvalidArgument(fmt::format("nccl::init_rank: rank = {}, expected 0 to {}", rank, ranks - 1));
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.bytes.data(), sizeof nccl_id);
  ncclComm_t comm = nullptr;
  LADLE_NCCL(detail::nccl().ncclCommInitRank(&comm, ranks, nccl_id, rank), nullptr);
  return comm;
}

void destroy(ncclComm_t comm) {
  if (comm) LADLE_NCCL(detail::nccl().ncclCommDestroy(comm), nullptr);
}

}  // namespace nccl

// ---- ThreadGroup -------------------------------------------------------------------------------

struct ThreadGroup::Shared {
  int size = 1;
  Location location;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::vector<const void*> buffers;  // each rank's, published before the barrier
  std::vector<std::size_t> sizes;

  // Every rank waits here until all have arrived.
  void barrier() {
    std::unique_lock lock(mutex);
    const std::uint64_t mine = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      changed.notify_all();
      return;
    }
    changed.wait(lock, [&] { return generation != mine; });
  }
};

namespace {

void wait_for(const Stream* stream) {
  if (stream) stream->synchronize();
  else Device::get(Device::current()).synchronize();
}

class ThreadRank final : public Communicator {
 public:
  ThreadRank(std::shared_ptr<ThreadGroup::Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  Location location() const override { return shared_->location; }
  std::string describe() const override {
    return fmt::format("thread rank {} of {} on {}", rank_, shared_->size, to_string(shared_->location));
  }

  void all_gather(const void* send, void* receive, std::size_t bytes, const Stream* stream) override {
    const bool device = shared_->location.is_device();
    if (device) wait_for(stream);  // what this rank's stream writes into `send` is there
    publish(send, bytes);
    shared_->barrier();
    std::string mismatch;
    for (int r = 0; r < shared_->size; ++r)
      if (shared_->sizes[r] != bytes && mismatch.empty())
        mismatch = fmt::format("thread group all_gather: rank {} sends {} bytes, rank {} {}: every rank sends the same", r,
                               shared_->sizes[r], rank_, bytes);
    if (mismatch.empty()) {
      for (int r = 0; r < shared_->size; ++r) {
        auto* to = static_cast<std::byte*>(receive) + static_cast<std::size_t>(r) * bytes;
        if (bytes == 0) continue;
        if (device) copy_device_to_device(reinterpret_cast<std::uintptr_t>(to), reinterpret_cast<std::uintptr_t>(shared_->buffers[r]), bytes, stream);
        else std::memcpy(to, shared_->buffers[r], bytes);
      }
      if (device) wait_for(stream);
    }
    shared_->barrier();  // nobody changes its send buffer before every rank has read it
    if (!mismatch.empty()) throw InvalidArgument(mismatch);
  }

  void all_sum(float* data, std::size_t count, const Stream* stream) override {
    const bool device = shared_->location.is_device();
    if (device) wait_for(stream);
    publish(data, count * sizeof(float));
    shared_->barrier();
    std::vector<float> sum(count, 0.0f), part(device ? count : 0);
    bool same = true;
    for (int r = 0; r < shared_->size; ++r) same = same && shared_->sizes[r] == count * sizeof(float);
    if (same) {
      for (int r = 0; r < shared_->size; ++r) {
        const float* from = static_cast<const float*>(shared_->buffers[r]);
        if (device) {
          if (count) copy_device_to_host(part.data(), reinterpret_cast<std::uintptr_t>(from), count * sizeof(float), nullptr);
          from = part.data();
        }
        for (std::size_t i = 0; i < count; ++i) sum[i] += from[i];
      }
    }
    shared_->barrier();  // every rank has read every buffer before any is overwritten
    if (!same) throw InvalidArgument(fmt::format("thread group all_sum: the ranks sum different counts (rank {}: {})", rank_, count));
    if (device) {
      if (count) copy_host_to_device(reinterpret_cast<std::uintptr_t>(data), sum.data(), count * sizeof(float), stream);
      wait_for(stream);
    } else {
      std::memcpy(data, sum.data(), count * sizeof(float));
    }
    shared_->barrier();
  }

 private:
  void publish(const void* buffer, std::size_t bytes) {
    std::lock_guard lock(shared_->mutex);
    shared_->buffers[rank_] = buffer;
    shared_->sizes[rank_] = bytes;
  }

  std::shared_ptr<ThreadGroup::Shared> shared_;
  int rank_;
};

}  // namespace

ThreadGroup::ThreadGroup(int size, Location location) : shared_(std::make_shared<Shared>()) {
  if (size < 1) throw InvalidArgument(fmt::format("ThreadGroup: size = {}, expected at least 1", size));
  shared_->size = size;
  shared_->location = location;
  shared_->buffers.assign(static_cast<std::size_t>(size), nullptr);
  shared_->sizes.assign(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<ThreadRank>(shared_, r));
}

ThreadGroup::~ThreadGroup() = default;

Communicator& ThreadGroup::rank(int r) {
  if (r < 0 || r >= size()) throw InvalidArgument(fmt::format("ThreadGroup::rank: r = {}, expected 0 to {}", r, size() - 1));
  return *ranks_[static_cast<std::size_t>(r)];
}

}  // namespace ladle
