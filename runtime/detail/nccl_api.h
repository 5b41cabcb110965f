// The NCCL functions ladle calls, opened at run time (communicator.cpp) so that ladle builds and
// runs where NCCL is not installed. Internal: not part of the API.
#pragma once

#include <nccl.h>

#include <string>

namespace ladle::detail {

#define LADLE_NCCL_FUNCTIONS(X)                                                                       \
  X(ncclGetErrorString) X(ncclGetLastError) X(ncclCommUserRank) X(ncclCommCount) X(ncclCommCuDevice) \
  X(ncclAllGather) X(ncclAllReduce) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy)

struct NcclApi {
#define LADLE_DECLARE_NCCL(name) decltype(&::name) name = nullptr;
  LADLE_NCCL_FUNCTIONS(LADLE_DECLARE_NCCL)
#undef LADLE_DECLARE_NCCL
  std::string library_path;
};

// Throws LibraryUnavailable with the paths tried.
const NcclApi& nccl();
// Throws CudaError naming the call, NCCL's error and its last message (comm may be null).
void check_nccl(int result, const char* call, ncclComm_t comm);

}  // namespace ladle::detail
