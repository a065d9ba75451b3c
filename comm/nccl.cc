// comm/nccl.h over the NCCL module: the NCCL group itself is in libkiln_nccl.so
// (comm/nccl_group.cc), loaded on the first call, so processes without NCCL groups never map NCCL
// or the CUDA runtime.
#include "comm/nccl.h"

#include "common/cuda_module.h"

namespace kiln::comm {

Status nccl_status() { return cuda_module_symbol(CudaModule::kNccl, "kiln_nccl_make_group").status(); }

bool nccl_available() { return nccl_status().is_ok(); }

Result<std::unique_ptr<ProcessGroup>> make_nccl_group(ProcessGroup& bootstrap, int device,
                                                      void* stream) {
  KILN_ASSIGN_OR_RETURN(void* make, cuda_module_symbol(CudaModule::kNccl, "kiln_nccl_make_group"));
  using MakeFn = Result<std::unique_ptr<ProcessGroup>> (*)(ProcessGroup&, int, void*);
  return reinterpret_cast<MakeFn>(make)(bootstrap, device, stream);
}

}  // namespace kiln::comm
