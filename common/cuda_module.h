// Kiln's CUDA parts live in shared modules loaded on first use, so a process that never asks for
// a GPU (prep, inspect, a CPU train, the tests) never maps the CUDA libraries (cuBLAS/cuBLASLt
// alone cost ~200 MiB of resident memory at load):
//   libkiln_cuda.so  the engine's CUDA backend, the CUDA kernels and the CUDA model
//                    (engine/device/cuda_module.cc, kernels/cuda/); needs libcublas + libcublasLt
//   libkiln_nccl.so  the NCCL process group (comm/nccl_group.cc); needs libnccl
// Two modules, so a GPU machine without NCCL still trains on one GPU.
//
// A module is looked for, in order: in $KILN_CUDA_MODULE_DIR when it is set (and only there);
// beside the executable (/proc/self/exe; where `kiln` is installed); in the executable's parent
// directory (build-tree programs in build/tests and build/bench). It must come from the same
// build as the executable (it is refused otherwise: its C++ types must match). Its undefined
// Kiln symbols bind to the executable's (executables export them, cmake/kiln_exports.list).
#pragma once

#include "common/status.h"

namespace kiln {

enum class CudaModule { kCuda, kNccl };

const char* cuda_module_file(CudaModule m);  // "libkiln_cuda.so" | "libkiln_nccl.so"
// Whether this build produced the module (CMake found the CUDA toolkit, and NCCL for kNccl).
bool cuda_module_built(CudaModule m);

// The address of `symbol` in module m, loading the module on the first call (thread-safe; a
// failed load is not retried). Errors (kUnimplemented) say which file, where it was looked for
// and why it could not be used (not built, not found, the loader's message, another build's).
Result<void*> cuda_module_symbol(CudaModule m, const char* symbol);

}  // namespace kiln

// Every module defines this, returning KILN_CUDA_MODULE_STAMP as it was compiled; the loader
// compares it with its own.
extern "C" const char* kiln_cuda_module_stamp();
