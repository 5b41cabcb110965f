// The NCCL functions ladle calls, opened at run time (communicator.cpp) so that ladle builds and
// runs where NCCL is not installed. Internal: not part of the API.
#pragma once

#include <cstddef>

#include <ladle/runtime/communicator.h>

#if __has_include(<nccl.h>)
#include <nccl.h>
#else
// A CUDA toolkit without NCCL's header: the few declarations ladle's table needs, as nccl.h 2.x
// declares them (its ABI). The functions are only named for their types; libnccl is opened at run
// time, and without it every call throws LibraryUnavailable.
typedef struct CUstream_st* cudaStream_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef enum { ncclInt8 = 0, ncclFloat32 = 7 } ncclDataType_t;
extern "C" {
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
}
#endif

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
