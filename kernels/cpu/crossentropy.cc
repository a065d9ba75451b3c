// Fused softmax + cross-entropy over the vocabulary. Each row is handled start to finish by one
// task: max, exp and sum, loss, then (optionally) the gradient written over the row, so no
// probability tensor is ever materialised and dlogits may alias logits.
#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

template <typename T>
void crossentropy_forward_backward(Same<T>* dlogits, float* losses, const T* logits,
                                   const int32_t* targets, float dloss, int BT, int V, int Vp) {
  KILN_CHECK(V > 0 && Vp >= V, "crossentropy: need 0 < V <= Vp");
  parallel_chunks(static_cast<size_t>(BT), 4, [&](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      const int32_t target = targets[r];
      KILN_CHECK(target < V, "crossentropy: target id out of range");
      T* drow = dlogits ? dlogits + r * Vp : nullptr;
      if (target < 0) {
        losses[r] = 0.0f;
        if (drow) std::memset(static_cast<void*>(drow), 0, sizeof(T) * Vp);
        continue;
      }
      const float* x = row_as_float(logits + r * Vp, V, 0);
      const float m = row_max(x, V);
      const float xt = x[target];
      // e = exp(x - m) in fp32 (in place over the row for float with a gradient, where dlogits
      // may be logits; otherwise in scratch).
      float* e = (std::is_same_v<T, float> && drow) ? reinterpret_cast<float*>(drow) : scratch(V, 1);
      exp_shifted(e, x, m, V);
      const float sum = row_sum(e, V);
      losses[r] = std::log(sum) + m - xt;
      if (drow == nullptr) continue;
      scal(e, dloss / sum, V);
      e[target] -= dloss;
      narrow(drow, e, V);
      for (int c = V; c < Vp; ++c) drow[c] = from_float<T>(0.0f);
    }
  });
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void crossentropy_forward_backward<T>(T*, float*, const T*, const int32_t*, float, \
                                                 int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
