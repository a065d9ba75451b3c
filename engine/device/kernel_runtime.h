// Internal to engine/device/: the part of a Runtime that is the same for every kernel backend -
// the optimizer's update, the gradient sums and norms and the casts, each one call to the
// backend type K's operator (kernels/ops.h). The CPU runtime (runtime.cc) and the CUDA runtime
// (cuda_module.cc) derive from KernelRuntime<their backend> and add only memory and copies.
#pragma once

#include "common/status.h"
#include "engine/device/runtime.h"
#include "kernels/ops.h"

namespace kiln::engine::detail {

template <class K>
class KernelRuntime : public Runtime {
 public:
  Device device() const final { return K::kDevice; }

  void adamw_update_multi(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                          DType lp_type) final {
    K::adamw_update_multi(tensors, count, hp, lp_type);
  }
  void accumulate(float* y, const float* x, size_t n) final { K::accumulate(y, x, n); }
  void cast_from_fp32(void* dst, DType lp_type, const float* src, size_t n) final {
    if (lp_type == DType::kBF16) {
      K::cast(static_cast<bf16*>(dst), src, n);
    } else {
      KILN_CHECK(lp_type == DType::kF16, "cast_from_fp32 to a type that is not bf16/fp16");
      K::cast(static_cast<fp16*>(dst), src, n);
    }
  }
  double sum_squares(const float* const* tensors, const size_t* sizes, int count) final {
    return K::sum_squares(tensors, sizes, count);
  }
};

}  // namespace kiln::engine::detail
