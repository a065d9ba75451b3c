// GELU (tanh approximation) and residual add, forward and backward.
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

namespace {
constexpr size_t kElemChunk = 1 << 14;
constexpr size_t kSub = 1024;  // sub-block widened to fp32 at a time
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

void gelu_fwd_f32(float* __restrict y, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kGeluK * (xi + kGeluA * xi * xi * xi);
    y[i] = 0.5f * xi * (1.0f + fast_tanh(u));
  }
}

// g = gelu'(x) * dy
void gelu_bwd_f32(float* __restrict g, const float* __restrict x, const float* __restrict dy,
                  size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kGeluK * (xi + kGeluA * xi * xi * xi);
    const float t = fast_tanh(u);
    const float dudx = kGeluK * (1.0f + 3.0f * kGeluA * xi * xi);
    const float grad = 0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * dudx;
    g[i] = grad * dy[i];
  }
}

// Runs body(offset, len, views...) over [0,n) in fixed chunks, giving fp32 views of the inputs.
// For float inputs the views are the arrays themselves.
template <typename T, typename Body>
void for_blocks(size_t n, const Body& body) {
  parallel_chunks(n, kElemChunk, [&](size_t b, size_t e) {
    for (size_t s = b; s < e; s += kSub) body(s, std::min(kSub, e - s));
  });
}
}  // namespace

template <typename T>
void gelu_forward(T* out, const Same<T>* inp, size_t N) {
  for_blocks<T>(N, [&](size_t off, size_t len) {
    const float* x = row_as_float(inp + off, len, 0);
    if constexpr (std::is_same_v<T, float>) {
      if (out + off == x) {  // in place
        float* y = scratch(len, 1);
        gelu_fwd_f32(y, x, len);
        std::memcpy(out + off, y, len * sizeof(float));
      } else {
        gelu_fwd_f32(out + off, x, len);
      }
    } else {
      float* y = scratch(len, 1);
      gelu_fwd_f32(y, x, len);
      narrow(out + off, y, len);
    }
  });
}

template <typename T>
void gelu_backward(Same<T>* dinp, const T* inp, const Same<T>* dout, size_t N) {
  for_blocks<T>(N, [&](size_t off, size_t len) {
    const float* x = row_as_float(inp + off, len, 0);
    const float* dy = row_as_float(dout + off, len, 1);
    float* g = scratch(len, 2);
    gelu_bwd_f32(g, x, dy, len);
    add_row(dinp + off, g, len);
  });
}

template <typename T>
void residual_forward(T* out, const Same<T>* inp1, const Same<T>* inp2, size_t N) {
  for_blocks<T>(N, [&](size_t off, size_t len) {
    if constexpr (std::is_same_v<T, float>) {
      for (size_t i = 0; i < len; ++i) out[off + i] = inp1[off + i] + inp2[off + i];
    } else {
      const float* a = row_as_float(inp1 + off, len, 0);
      const float* b = row_as_float(inp2 + off, len, 1);
      float* y = scratch(len, 2);
      for (size_t i = 0; i < len; ++i) y[i] = a[i] + b[i];
      narrow(out + off, y, len);
    }
  });
}

template <typename T>
void residual_backward(Same<T>* dinp1, Same<T>* dinp2, const T* dout, size_t N) {
  for_blocks<T>(N, [&](size_t off, size_t len) {
    const float* d = row_as_float(dout + off, len, 0);
    if (dinp1) add_row(dinp1 + off, d, len);
    if (dinp2) add_row(dinp2 + off, d, len);
  });
}

#define KILN_INSTANTIATE(T)                                                 \
  template void gelu_forward<T>(T*, const T*, size_t);                     \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);          \
  template void residual_forward<T>(T*, const T*, const T*, size_t);       \
  template void residual_backward<T>(T*, T*, const T*, size_t);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
