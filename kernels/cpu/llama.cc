// The Llama block's element-wise operators on the CPU: RMSNorm, rotary position embedding
// (rotate-half layout) and SwiGLU, forward and backward (kernels/operators.inc). Row-parallel over
// fixed chunks; parameter gradients reduce per-chunk partials in chunk order (deterministic).
#include <cmath>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

namespace {
constexpr size_t kRowsPerChunk = 32;

// The rotation of one head row x (hs values, fp32) by cos/sin (hs/2 each); inverse: by -angle.
inline void rotate_half(float* x, const float* cs, const float* sn, int half, bool inverse) {
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    const float s = inverse ? -sn[i] : sn[i];
    x[i] = a * cs[i] - b * s;
    x[i + half] = b * cs[i] + a * s;
  }
}

// cos and sin of pos * theta^(-2i/hs), i < hs/2, computed in fp64 and rounded to fp32.
inline void rope_angles(float* cs, float* sn, int pos, float theta, int hs) {
  const int half = hs / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / hs);
    const double a = static_cast<double>(pos) * inv_freq;
    cs[i] = static_cast<float>(std::cos(a));
    sn[i] = static_cast<float>(std::sin(a));
  }
}

template <typename T>
void rope_apply(T* qkv, const int32_t* doc_start, float theta, int B, int T_, int NH, int NKV,
                int hs, bool inverse) {
  KILN_CHECK(hs > 0 && hs % 2 == 0, "rope: the head size must be even");
  const size_t W = static_cast<size_t>(NH + 2 * NKV) * hs;
  const size_t rotated = static_cast<size_t>(NH + NKV) * hs;  // q and k heads
  const int half = hs / 2;
  parallel_chunks(static_cast<size_t>(B) * T_, kRowsPerChunk, [&](size_t rb, size_t re) {
    float* cs = scratch(static_cast<size_t>(hs), 0);
    float* sn = cs + half;
    float* row = scratch(rotated, 1);
    for (size_t r = rb; r < re; ++r) {
      const int t = static_cast<int>(r % static_cast<size_t>(T_));
      const int pos = t - (doc_start ? doc_start[r] : 0);
      rope_angles(cs, sn, pos, theta, hs);
      T* x = qkv + r * W;
      widen(row, x, rotated);
      for (int h = 0; h < NH + NKV; ++h)
        rotate_half(row + static_cast<size_t>(h) * hs, cs, sn, half, inverse);
      narrow(x, row, rotated);
    }
  });
}
}  // namespace

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const Same<T>* inp, const Same<T>* weight, float eps,
                     int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_;
  const float* w = row_as_float(weight, C, kCallSlot);
  parallel_chunks(rows, kRowsPerChunk, [&](size_t rb, size_t re) {
    float* y = scratch(C, 1);
    for (size_t r = rb; r < re; ++r) {
      const float* x = row_as_float(inp + r * C, C, 0);
      const float s = 1.0f / std::sqrt(row_dot(x, x, C) / C + eps);
      for (int c = 0; c < C; ++c) y[c] = x[c] * s * w[c];
      narrow(out + r * C, y, C);
      if (rstd) rstd[r] = s;
    }
  });
}

template <typename T>
void rmsnorm_backward(Same<T>* dinp, float* dweight, const T* dout, const Same<T>* inp,
                      const Same<T>* weight, const float* rstd, int B, int T_, int C) {
  const size_t rows = static_cast<size_t>(B) * T_;
  const size_t num_chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const float* w = row_as_float(weight, C, kCallSlot);
  float* partial = dweight ? scratch(num_chunks * C, kCallSlot + 1) : nullptr;
  parallel_chunks(rows, kRowsPerChunk, [&](size_t rb, size_t re) {
    float* pdw = dweight ? partial + (rb / kRowsPerChunk) * C : nullptr;
    if (pdw) std::fill(pdw, pdw + C, 0.0f);
    float* xhat = scratch(C, 2);
    float* dnorm = scratch(C, 3);
    for (size_t r = rb; r < re; ++r) {
      const float* x = row_as_float(inp + r * C, C, 0);
      const float* dy = row_as_float(dout + r * C, C, 1);
      const float s = rstd[r];
      for (int c = 0; c < C; ++c) {
        xhat[c] = x[c] * s;
        dnorm[c] = dy[c] * w[c];
      }
      if (pdw)
        for (int c = 0; c < C; ++c) pdw[c] += dy[c] * xhat[c];
      if (dinp) {
        // d x = s (dnorm - xhat mean(dnorm xhat)).
        const float dnorm_xhat_mean = row_dot(dnorm, xhat, C) / C;
        for (int c = 0; c < C; ++c) dnorm[c] = (dnorm[c] - xhat[c] * dnorm_xhat_mean) * s;
        add_row(dinp + r * C, dnorm, C);
      }
    }
  });
  if (dweight) {
    parallel_chunks(static_cast<size_t>(C), 64, [&](size_t cb, size_t ce) {
      for (size_t k = 0; k < num_chunks; ++k) {
        const float* pdw = partial + k * C;
        for (size_t c = cb; c < ce; ++c) dweight[c] += pdw[c];
      }
    });
  }
}

template <typename T>
void rope_forward(T* qkv, const int32_t* doc_start, float theta, int B, int T_, int NH, int NKV,
                  int hs) {
  rope_apply(qkv, doc_start, theta, B, T_, NH, NKV, hs, /*inverse=*/false);
}

template <typename T>
void rope_backward(T* dqkv, const int32_t* doc_start, float theta, int B, int T_, int NH, int NKV,
                   int hs) {
  rope_apply(dqkv, doc_start, theta, B, T_, NH, NKV, hs, /*inverse=*/true);
}

template <typename T>
void swiglu_forward(T* out, const Same<T>* inp, size_t rows, int F) {
  parallel_chunks(rows, kRowsPerChunk, [&](size_t rb, size_t re) {
    float* y = scratch(F, 2);
    for (size_t r = rb; r < re; ++r) {
      const float* g = row_as_float(inp + r * 2 * F, F, 0);
      const float* u = row_as_float(inp + r * 2 * F + F, F, 1);
      for (int c = 0; c < F; ++c) y[c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
      narrow(out + r * F, y, F);
    }
  });
}

template <typename T>
void swiglu_backward(Same<T>* dinp, const T* inp, const Same<T>* dout, size_t rows, int F) {
  parallel_chunks(rows, kRowsPerChunk, [&](size_t rb, size_t re) {
    float* d = scratch(2 * static_cast<size_t>(F), 3);
    for (size_t r = rb; r < re; ++r) {
      const float* g = row_as_float(inp + r * 2 * F, F, 0);
      const float* u = row_as_float(inp + r * 2 * F + F, F, 1);
      const float* dy = row_as_float(dout + r * F, F, 2);
      for (int c = 0; c < F; ++c) {
        const float sig = 1.0f / (1.0f + std::exp(-g[c]));
        const float silu = g[c] * sig;
        d[c] = dy[c] * u[c] * sig * (1.0f + g[c] * (1.0f - sig));  // d silu / d gate
        d[F + c] = dy[c] * silu;
      }
      add_row(dinp + r * 2 * F, d, 2 * static_cast<size_t>(F));
    }
  });
}

#define KILN_INSTANTIATE(T)                                                                      \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, float, int, int, int);        \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int, \
                                    int, int);                                                   \
  template void rope_forward<T>(T*, const int32_t*, float, int, int, int, int, int);             \
  template void rope_backward<T>(T*, const int32_t*, float, int, int, int, int, int);            \
  template void swiglu_forward<T>(T*, const T*, size_t, int);                                    \
  template void swiglu_backward<T>(T*, const T*, const T*, size_t, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
