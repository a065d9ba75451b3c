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
      // x: the row in fp32 (the row itself for float, else widened into scratch); e = exp(x - m)
      // in fp32, over x where it may be overwritten (a float row with a gradient, where dlogits
      // may be logits, or the widened copy), else in scratch.
      const float* x = row_as_float(logits + r * Vp, V, 0);
      const float m = row_max(x, V);
      const float xt = x[target];
      float* e = std::is_same_v<T, float> ? (drow ? reinterpret_cast<float*>(drow) : scratch(V, 1))
                                          : const_cast<float*>(x);
      exp_shifted(e, x, m, V);
      const float sum = row_sum(e, V);
      losses[r] = std::log(sum) + m - xt;
      if (drow == nullptr) continue;
      const float scale = dloss / sum;
      if constexpr (std::is_same_v<T, bf16>) {
        // scale and round in one pass (same bits as scal, subtract, narrow).
        const float et = e[target] * scale - dloss;
        narrow_scaled(drow, e, scale, V);
        drow[target] = from_float<T>(et);
      } else {
        scal(e, scale, V);
        e[target] -= dloss;
        narrow(drow, e, V);
      }
      for (int c = V; c < Vp; ++c) drow[c] = from_float<T>(0.0f);
    }
  });
}

template <typename T>
void crossentropy_shard_max(float* row_max_out, const T* logits, int BT, int V) {
  parallel_chunks(static_cast<size_t>(BT), 4, [&](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) row_max_out[r] = row_max(row_as_float(logits + r * V, V, 0), V);
  });
}

template <typename T>
void crossentropy_shard_sum(float* sum_exp, float* target_logit, const T* logits,
                            const float* row_max, const int32_t* targets, int BT, int V, int v0) {
  parallel_chunks(static_cast<size_t>(BT), 4, [&](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      const float* x = row_as_float(logits + r * V, V, 0);
      float* e = scratch(V, 1);
      exp_shifted(e, x, row_max[r], V);
      sum_exp[r] = row_sum(e, V);
      const int32_t t = targets[r] - v0;
      target_logit[r] = targets[r] >= 0 && t >= 0 && t < V ? x[t] : 0.0f;
    }
  });
}

template <typename T>
void crossentropy_shard_backward(Same<T>* dlogits, const T* logits, const float* row_max,
                                 const float* sum_exp, const int32_t* targets, float dloss, int BT,
                                 int V, int v0) {
  parallel_chunks(static_cast<size_t>(BT), 4, [&](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) {
      T* drow = dlogits + r * V;
      if (targets[r] < 0) {
        std::memset(static_cast<void*>(drow), 0, sizeof(T) * V);
        continue;
      }
      const float* x = row_as_float(logits + r * V, V, 0);
      float* e = scratch(V, 1);
      exp_shifted(e, x, row_max[r], V);
      scal(e, dloss / sum_exp[r], V);
      const int32_t t = targets[r] - v0;
      if (t >= 0 && t < V) e[t] -= dloss;
      narrow(drow, e, V);
    }
  });
}

void crossentropy_shard_loss(float* losses, const float* row_max, const float* sum_exp,
                             const float* target_logit, const int32_t* targets, int BT) {
  for (int r = 0; r < BT; ++r) {
    losses[r] = targets[r] < 0 ? 0.0f : std::log(sum_exp[r]) + row_max[r] - target_logit[r];
  }
}

#define KILN_INSTANTIATE(T)                                                                 \
  template void crossentropy_forward_backward<T>(T*, float*, const T*, const int32_t*, float, \
                                                 int, int, int); \
  template void crossentropy_shard_max<T>(float*, const T*, int, int);                        \
  template void crossentropy_shard_sum<T>(float*, float*, const T*, const float*,             \
                                          const int32_t*, int, int, int);                     \
  template void crossentropy_shard_backward<T>(T*, const T*, const float*, const float*,      \
                                               const int32_t*, float, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
