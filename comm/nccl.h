// The NCCL backend: a ProcessGroup whose buffers are CUDA device memory.
//
// make_nccl_group() is collective over `bootstrap` (an MPI group of the same ranks): every rank
// selects `device` (cudaSetDevice: call it before the process allocates on a GPU), rank 0
// creates an ncclUniqueId, bootstrap broadcasts it, and every rank joins the NCCL communicator
// on `device`; a failure on any rank is an error on every rank (the failing one names the CUDA
// device count it sees). Collectives run on the group's own stream, each ordered after the work
// queued on `stream` (the compute stream that wrote the buffers; nullptr: the legacy default
// stream, where Kiln's CUDA kernels run) when it is issued, so they overlap the compute queued
// after them: blocking calls synchronize the group's stream before returning; the i*() calls
// return a handle that records a CUDA event, whose wait() synchronizes on it. Counters, names and call-order rules are
// those of comm/comm.h. Floating-point sums are NCCL's: deterministic for a fixed rank count,
// topology and NCCL_ALGO / NCCL_PROTO, but not in rank order as the MPI backend's. Variable-size
// and point-to-point shapes (allgatherv, gatherv, alltoallv) use ncclSend / ncclRecv in a group
// call. The group lives in the NCCL module libkiln_nccl.so (common/cuda_module.h), built when CMake
// finds CUDA and NCCL and loaded on the first call here; where it is not built, not found or cannot
// load (no libnccl), make_nccl_group() returns kUnimplemented with the reason.
#pragma once

#include <memory>

#include "comm/comm.h"
#include "common/status.h"

namespace kiln::comm {

// Ok when the NCCL module is built and loads here, else why not (not built, not found, the
// loader's message); this loads it: NCCL and the CUDA runtime. nccl_available() is its is_ok().
Status nccl_status();
bool nccl_available();

// stream: the cudaStream_t the collectives follow (nullptr: the legacy default stream).
Result<std::unique_ptr<ProcessGroup>> make_nccl_group(ProcessGroup& bootstrap, int device,
                                                      void* stream = nullptr);

}  // namespace kiln::comm
