// AdamW on fp32 master weights, optionally writing the low-precision copy in the same pass.
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

namespace {
constexpr size_t kChunk = 1 << 14;

void adamw_chunk(float* __restrict p, float* __restrict m, float* __restrict v,
                 const float* __restrict grads, size_t n, float gs, float b1, float b2,
                 float one_minus_b1, float one_minus_b2, float eps, float bc2_sqrt,
                 float step_size, float decay) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grads[i] * gs;  // gs == 1 is exact
    const float mi = m[i] * b1 + g * one_minus_b1;
    const float vi = v[i] * b2 + (g * g) * one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

template <typename L>
void adamw_impl(float* params, float* m, float* v, const float* grads, size_t n,
                const AdamWParams& hp, L* params_lp) {
  // Evaluation order of torch.optim.AdamW (single-tensor path), so parity runs match closely:
  //   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g g;
  //   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
  // with the bias corrections bc1 = 1 - b1^step, bc2 = 1 - b2^step computed in double.
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  const float step_size = static_cast<float>(static_cast<double>(hp.lr) / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  const float b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  const float one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(hp.beta1));
  const float one_minus_b2 = static_cast<float>(1.0 - static_cast<double>(hp.beta2));
  const float gs = hp.grad_scale;
  parallel_chunks(n, kChunk, [&](size_t b, size_t e) {
    adamw_chunk(params + b, m + b, v + b, grads + b, e - b, gs, b1, b2, one_minus_b1, one_minus_b2,
                eps, bc2_sqrt, step_size, decay);
    if constexpr (!std::is_same_v<L, float>) {
      if (params_lp) narrow(params_lp + b, params + b, e - b);
    }
  });
}
}  // namespace

void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp) {
  adamw_impl<float>(params, m, v, grads, n, hp, nullptr);
}
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, bf16* params_lp) {
  adamw_impl(params, m, v, grads, n, hp, params_lp);
}
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, fp16* params_lp) {
  adamw_impl(params, m, v, grads, n, hp, params_lp);
}

// One tensor after the other (CpuBackend::kMultiTensorAdamW is false).
void adamw_update_multi(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                        DType lp_type) {
  kiln::detail::adamw_update_each<CpuBackend>(tensors, count, hp, lp_type);
}

}  // namespace kiln::cpu
