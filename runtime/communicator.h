// The ranks of a context-parallel call (ops/context_parallel.h) and the two collectives it needs:
// an all-gather of equal-sized buffers (the ranks' fixed-size summaries) and a sum of f32 buffers
// (gradients of per-head parameters, the final states of packed sequences). Two kinds:
//
//   NcclCommunicator  the caller's ncclComm_t, one rank per GPU in any number of processes. ladle
//                     never creates a communicator or a process: the caller made this one (with
//                     ncclCommInitRank and its unique id) and destroys it after ladle is done.
//                     libnccl is opened at run time ($LADLE_NCCL_LIBRARY, else libnccl.so.2 on the
//                     loader's path, else under the CUDA root), so ladle builds and runs without it;
//                     a call then throws LibraryUnavailable naming the paths tried.
//   ThreadGroup       `size` ranks as threads of one process, their buffers on the host or on one
//                     device: the CPU path, the tests, and one GPU cut into slices.
//
//   ncclComm_t comm;  ncclCommInitRank(&comm, ranks, id, rank);      // the caller's
//   ladle::NcclCommunicator group(comm);
//   ladle::context_parallel::run_variant_into(variant, q, k, v, inputs, options, outputs, group);
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <ladle/tensor/tensor_view.h>

// nccl.h's own declaration of the handle (identical, so including both is fine).
struct ncclComm;
typedef struct ncclComm* ncclComm_t;

namespace ladle {

class Stream;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the collectives' buffers live: a device (NCCL: its GPU) or the host.
  virtual Location location() const = 0;
  // Collective (every rank calls it, with the same `bytes`): receive[i * bytes, (i + 1) * bytes) =
  // rank i's send, for every rank i. Device buffers are read and written in order on `stream`
  // (nullptr: the default stream); host buffers are complete on return.
  virtual void all_gather(const void* send, void* receive, std::size_t bytes, const Stream* stream) = 0;
  // Collective: data[i] = the sum over the ranks of their data[i], in place (f32, `count` each).
  virtual void all_sum(float* data, std::size_t count, const Stream* stream) = 0;
  // "NCCL rank 1 of 4 on cuda:1", "thread rank 0 of 2 on the host": for error messages.
  virtual std::string describe() const = 0;
};

// The caller's NCCL communicator. Its device (ncclCommCuDevice) is where the call's tensors must be.
class NcclCommunicator final : public Communicator {
 public:
  // Throws LibraryUnavailable when libnccl cannot be opened, CudaError naming the NCCL call that failed.
  explicit NcclCommunicator(ncclComm_t comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Location location() const override { return Location::device(device_); }
  void all_gather(const void* send, void* receive, std::size_t bytes, const Stream* stream) override;
  void all_sum(float* data, std::size_t count, const Stream* stream) override;
  std::string describe() const override;

 private:
  ncclComm_t comm_;
  int rank_ = 0, size_ = 1, device_ = 0;
};

// Whether libnccl can be opened here (without throwing), and where it was found.
bool nccl_available();
std::string nccl_library_path();  // "" when not available

// For callers that do not link NCCL themselves (examples/context_parallel): the same calls through
// ladle's run-time loaded libnccl. The caller still owns what these make.
namespace nccl {
struct UniqueId {
  std::array<char, 128> bytes{};  // ncclUniqueId: pass it to every rank (a file, the environment)
};
UniqueId unique_id();                                            // ncclGetUniqueId
ncclComm_t init_rank(int ranks, const UniqueId& id, int rank);   // ncclCommInitRank on the current device
void destroy(ncclComm_t comm);                                   // ncclCommDestroy
}  // namespace nccl

// `size` ranks as threads of one process. Each thread calls the collective of its own rank(r); they
// meet at a barrier, so every rank must call every collective (as with NCCL). For device buffers
// each rank waits for its stream before the exchange and copies peers' buffers with the driver.
// A rank whose call fails before a collective must still reach it: ops/context_parallel does so by
// exchanging each rank's verdict on its arguments first.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size, Location location = Location::host());
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;
  int size() const { return static_cast<int>(ranks_.size()); }
  Communicator& rank(int r);  // InvalidArgument for r outside [0, size)

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace ladle
