// LayerNorm over the last dimension (eps 1e-5), forward and backward.
#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

namespace {
constexpr float kLnEps = 1e-5f;
constexpr size_t kRowsPerChunk = 32;
}  // namespace

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const Same<T>* inp, const Same<T>* weight,
                       const Same<T>* bias, int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_;
  const float* w = row_as_float(weight, C, kCallSlot);
  const float* bb = bias ? row_as_float(bias, C, kCallSlot + 1) : nullptr;
  parallel_chunks(rows, kRowsPerChunk, [&](size_t rb, size_t re) {
    float* y = scratch(C, 1);
    for (size_t r = rb; r < re; ++r) {
      const float* x = row_as_float(inp + r * C, C, 0);
      float m = row_sum(x, C) / C;
      float var = row_sq_dev(x, m, C) / C;
      float s = 1.0f / std::sqrt(var + kLnEps);
      if (bb) {
        for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * w[c] + bb[c];
      } else {
        for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * w[c];
      }
      narrow(out + r * C, y, C);
      if (mean) mean[r] = m;
      if (rstd) rstd[r] = s;
    }
  });
}

template <typename T>
void layernorm_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                        const Same<T>* inp, const Same<T>* weight, const float* mean,
                        const float* rstd, int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_;
  const size_t num_chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const float* w = row_as_float(weight, C, kCallSlot);
  // Per-chunk partial dweight / dbias, reduced in chunk order below (deterministic).
  const bool want_params = dweight != nullptr || dbias != nullptr;
  float* partial = want_params ? scratch(num_chunks * 2 * C, kCallSlot + 1) : nullptr;
  parallel_chunks(rows, kRowsPerChunk, [&](size_t rb, size_t re) {
    float* pdw = want_params ? partial + (rb / kRowsPerChunk) * 2 * C : nullptr;
    float* pdb = want_params ? pdw + C : nullptr;
    if (want_params) std::fill(pdw, pdw + 2 * C, 0.0f);
    float* xhat = scratch(C, 2);
    float* dnorm = scratch(C, 3);
    for (size_t r = rb; r < re; ++r) {
      const float* x = row_as_float(inp + r * C, C, 0);
      const float* dy = row_as_float(dout + r * C, C, 1);
      const float m = mean[r], s = rstd[r];
      for (int c = 0; c < C; ++c) {
        xhat[c] = (x[c] - m) * s;
        dnorm[c] = dy[c] * w[c];
      }
      if (want_params) {
        for (int c = 0; c < C; ++c) {
          pdw[c] += dy[c] * xhat[c];
          pdb[c] += dy[c];
        }
      }
      if (dinp) {
        float dnorm_mean = row_sum(dnorm, C) / C;
        float dnorm_xhat_mean = row_dot(dnorm, xhat, C) / C;
        // Reuse dnorm as the fp32 input gradient of this row.
        for (int c = 0; c < C; ++c) dnorm[c] = (dnorm[c] - dnorm_mean - xhat[c] * dnorm_xhat_mean) * s;
        add_row(dinp + r * C, dnorm, C);
      }
    }
  });
  if (want_params) {
    parallel_chunks(static_cast<size_t>(C), 64, [&](size_t cb, size_t ce) {
      for (size_t k = 0; k < num_chunks; ++k) {
        const float* pdw = partial + k * 2 * C;
        const float* pdb = pdw + C;
        if (dweight)
          for (size_t c = cb; c < ce; ++c) dweight[c] += pdw[c];
        if (dbias)
          for (size_t c = cb; c < ce; ++c) dbias[c] += pdb[c];
      }
    });
  }
}

// The plain sequence (CpuBackend::kFusedResidualLayernorm is false).
template <typename T>
void residual_layernorm_forward(T* res, T* out, float* mean, float* rstd, const Same<T>* inp1,
                                const Same<T>* inp2, const Same<T>* weight, const Same<T>* bias,
                                int B, int T_, int C) {
  residual_forward(res, inp1, inp2, static_cast<size_t>(B) * T_ * C);
  layernorm_forward(out, mean, rstd, res, weight, bias, B, T_, C);
}

#define KILN_INSTANTIATE(T)                                                                      \
  template void residual_layernorm_forward<T>(T*, T*, float*, float*, const T*, const T*,        \
                                              const T*, const T*, int, int, int);                \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, \
                                     int);                                                       \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*,          \
                                      const float*, const float*, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
