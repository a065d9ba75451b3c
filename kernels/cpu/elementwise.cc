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

// y = gelu(x); float or bf16 arrays, converted in registers (y must not alias x).
template <typename TO, typename TI>
void gelu_fwd(TO* __restrict y, const TI* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float xi = load_f32(x, i);
    const float u = kGeluK * (xi + kGeluA * xi * xi * xi);
    store_f32(y, i, 0.5f * xi * (1.0f + fast_tanh(u)));
  }
}

// dx (+)= gelu'(x) * dy: ACC adds to dx (rounding once for bf16), otherwise overwrites it.
template <bool ACC, typename TO, typename TI>
void gelu_bwd(TO* __restrict dx, const TI* __restrict x, const TI* __restrict dy, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float xi = load_f32(x, i);
    const float u = kGeluK * (xi + kGeluA * xi * xi * xi);
    const float t = fast_tanh(u);
    const float dudx = kGeluK * (1.0f + 3.0f * kGeluA * xi * xi);
    const float grad = 0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * dudx;
    const float g = grad * load_f32(dy, i);
    store_f32(dx, i, ACC ? load_f32(dx, i) + g : g);
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

// float and bf16 convert in registers (no widened copies); fp16 widens blocks through F16C.
template <typename T>
constexpr bool kInRegisters = std::is_same_v<T, float> || std::is_same_v<T, bf16>;

template <typename T>
void gelu_forward(T* out, const Same<T>* inp, size_t N) {
  for_blocks<T>(N, [&](size_t off, size_t len) {
    if constexpr (std::is_same_v<T, float>) {
      if (out + off == inp + off) {  // in place
        float* y = scratch(len, 1);
        gelu_fwd(y, inp + off, len);
        std::memcpy(out + off, y, len * sizeof(float));
      } else {
        gelu_fwd(out + off, inp + off, len);
      }
    } else {
      // (bf16 converting in registers measured slower here: 495 vs 573 Melem/s on AVX2.)
      const float* x = row_as_float(inp + off, len, 0);
      float* y = scratch(len, 1);
      gelu_fwd(y, x, len);
      narrow(out + off, y, len);
    }
  });
}

template <typename T>
void gelu_backward(Same<T>* dinp, const T* inp, const Same<T>* dout, size_t N) {
  for_blocks<T>(N, [&](size_t off, size_t len) {
    if constexpr (kInRegisters<T>) {
      if (dinp + off != inp + off && dinp + off != dout + off) {
        gelu_bwd<true>(dinp + off, inp + off, dout + off, len);
        return;
      }
    }
    const float* x = row_as_float(inp + off, len, 0);
    const float* dy = row_as_float(dout + off, len, 1);
    float* g = scratch(len, 2);
    gelu_bwd<false>(g, x, dy, len);
    add_row(dinp + off, g, len);
  });
}

template <typename T>
void residual_forward(T* out, const Same<T>* inp1, const Same<T>* inp2, size_t N) {
  for_blocks<T>(N, [&](size_t off, size_t len) {
    if constexpr (kInRegisters<T>) {
      T* o = out + off;
      const T* a = inp1 + off;
      const T* b = inp2 + off;
      for (size_t i = 0; i < len; ++i) store_f32(o, i, load_f32(a, i) + load_f32(b, i));
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
