// Internal to kernels/cpu/: helpers shared by the CPU kernels (not part of the operator API).
//
// * parallel_chunks: a parallel loop over a FIXED partition (chunk boundaries depend only on the
//   problem size, never on the thread count), so every result is bit-identical for any number of
//   threads. Runs on the oneTBB arena sized by cpu::set_num_threads.
// * scratch: grow-only per-thread buffers (allocated on first use, reused afterwards).
// * vectorisable math (exp, tanh) written branch-free so the compiler emits SIMD code.
// * load/store of rows between T (float/bf16/fp16) and fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu_isa.h"
#include "kernels/dtype.h"

namespace kiln::cpu::detail {

// Runs fn(begin, end) for the chunks [0,chunk), [chunk,2chunk), ... of [0,n), in parallel.
// The partition depends only on n and chunk. fn must be safe to run concurrently on distinct
// chunks.
template <typename Fn>
void parallel_chunks(size_t n, size_t chunk, const Fn& fn);

// Runs fn(i) for i in [0, count) in parallel, one task per index (for coarse tasks).
template <typename Fn>
void parallel_tasks(size_t count, const Fn& fn) {
  parallel_chunks(count, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) fn(i);
  });
}

// A per-thread grow-only scratch buffer; `slot` selects one of a few independent buffers so a
// kernel can hold several at once. Contents are unspecified on return. 64-byte aligned.
// Slots 0..3 are for use INSIDE parallel task bodies; slots 4..7 for call-level buffers taken by
// the calling thread before a parallel loop (a task may run on the calling thread, so the two
// ranges must not overlap).
float* scratch(size_t n_floats, int slot);
constexpr int kScratchSlots = 8;
constexpr int kCallSlot = 4;

// ---- start-up choices (kernels/cpu_isa.h) -------------------------------------------------------

// matmul.cc: caps oneDNN at path `isa` (first call only, before oneDNN initialises) and checks
// that it can create the bf16 matmuls Kiln uses with a non-reference implementation. *why gets
// oneDNN's implementation name, or the reason it cannot (its error message). Never throws.
bool probe_onednn_bf16(Isa isa, std::string* why);

// ---- gemm_lp.cc: the AVX2/FMA GEMM for bf16/fp16 operands --------------------------------------

// One block of C (M x N, row stride ldc) = bias + A (M x K) @ B (K x N), or C += A @ B when
// `accumulate` (bias then nullptr); fp32 arithmetic, the result rounded into TC once. Element
// (i, k) of A is A[i * a_rs + k * a_cs], (k, n) of B is B[k * b_rs + n * b_cs]; each operand must
// have a contiguous dimension (a_rs or a_cs == 1, b_rs or b_cs == 1). bias (N fp32) nullable.
// Single-threaded (callers split C into blocks); uses scratch slots 0..3. Element (m, n) is one
// fp32 FMA chain over k in order from the bias (or 0): the bits do not depend on the blocking.
template <typename T, typename TC>
void gemm_lp(int M, int N, int K, const T* A, size_t a_rs, size_t a_cs, const T* B, size_t b_rs,
             size_t b_cs, TC* C, size_t ldc, const float* bias, bool accumulate);

// ---- vectorisable reductions (fixed order: 16 interleaved partial sums, then a fixed tree) -----

inline float reduce16(const float* acc) {
  float s8[8];
  for (int j = 0; j < 8; ++j) s8[j] = acc[j] + acc[j + 8];
  float s4[4];
  for (int j = 0; j < 4; ++j) s4[j] = s8[j] + s8[j + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

inline float row_sum(const float* x, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
  for (; i < n; ++i) acc[i & 15] += x[i];
  return reduce16(acc);
}

inline float row_dot(const float* x, const float* y, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j] * y[i + j];
  for (; i < n; ++i) acc[i & 15] += x[i] * y[i];
  return reduce16(acc);
}

// sum_i (x_i - c)^2
inline float row_sq_dev(const float* x, float c, size_t n) {
  float acc[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) {
      float d = x[i + j] - c;
      acc[j] += d * d;
    }
  for (; i < n; ++i) {
    float d = x[i] - c;
    acc[i & 15] += d * d;
  }
  return reduce16(acc);
}

// max is exactly associative, so letting the compiler pick the reduction order is deterministic.
inline float row_max(const float* __restrict x, size_t n) {
  float m = -HUGE_VALF;
#pragma omp simd reduction(max : m)
  for (size_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// ---- vectorisable math --------------------------------------------------------------------------

inline float bits_as_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline int32_t float_as_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, 4);
  return i;
}

// exp(x) with ~1-2 ulp error (Cephes expf polynomial), branch-free so loops vectorise.
// exp(-inf) = 0, exp(x) = 0 below -87.3 (subnormal results flushed), +inf above 88.72, NaN -> NaN.
inline float fast_exp(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kC1 = 0.693359375f;
  const float kC2 = -2.12194440e-4f;
  float xc = std::min(std::max(x, -87.3f), 88.7f);
  // Round x*log2(e) to the nearest integer with the 1.5*2^23 trick (no floor call needed).
  float n = (xc * kLog2e + 12582912.0f) - 12582912.0f;
  float r = xc - n * kC1;
  r = r - n * kC2;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t ni = static_cast<int32_t>(n);
  float pow2n = bits_as_float((ni + 127) << 23);
  float y = p * pow2n;
  y = x < -87.3f ? 0.0f : y;
  y = x > 88.7f ? HUGE_VALF : y;
  y = x != x ? x : y;
  return y;
}

// tanh(x) via exp: sign(x) (1 - 2 / (exp(2|x|) + 1)); absolute error ~1e-7.
inline float fast_tanh(float x) {
  float ax = std::fabs(x);
  float e = fast_exp(std::min(2.0f * ax, 88.0f));
  float t = 1.0f - 2.0f / (e + 1.0f);
  return std::copysign(t, x);
}

// ---- small vector primitives (restrict pointers, scalars by value: they vectorise reliably) -----

// y += a * x
inline void axpy(float* __restrict y, float a, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}
// y *= a
inline void scal(float* __restrict y, float a, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] *= a;
}
// out = exp(in - m); out may equal in.
inline void exp_shifted(float* out, const float* in, float m, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fast_exp(in[i] - m);
}

// ---- rows of T <-> fp32 -------------------------------------------------------------------------

// bf16 <-> fp32 of one value, inline and branch-free so loops that convert in registers
// vectorise; identical results to kernels/dtype.h (round to nearest even, NaN stays a quiet NaN).
inline float bf16_bits_to_float(uint16_t h) {
  return bits_as_float(static_cast<int32_t>(static_cast<uint32_t>(h) << 16));
}
inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = static_cast<uint32_t>(float_as_bits(f));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// Element i of a float or bf16 array as fp32, and v stored into one (rounded for bf16): for
// kernels that convert in registers instead of widening whole rows into scratch.
template <typename T>
inline float load_f32(const T* p, size_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else {
    static_assert(std::is_same_v<T, bf16>, "load_f32: float or bf16");
    return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
  }
}
template <typename T>
inline void store_f32(T* p, size_t i, float v) {
  if constexpr (std::is_same_v<T, float>) {
    p[i] = v;
  } else {
    static_assert(std::is_same_v<T, bf16>, "store_f32: float or bf16");
    reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16_bits(v);
  }
}

// bf16 <-> fp32 rows inline (short rows, e.g. one attention head, are widened in hot loops; the
// loops vectorise).
inline void widen(float* __restrict dst, const bf16* __restrict src, size_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
}
inline void narrow(bf16* __restrict dst, const float* __restrict src, size_t n) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(src[i]);
}
// dst = bf16(a * src[i]) in one pass (scale and round fused: same bits as scal then narrow).
inline void narrow_scaled(bf16* __restrict dst, const float* __restrict src, float a, size_t n) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16_bits(a * src[i]);
}
void widen(float* dst, const fp16* src, size_t n);
void narrow(fp16* dst, const float* src, size_t n);
inline void widen(float* dst, const float* src, size_t n) {
  if (dst != src) std::memcpy(dst, src, n * sizeof(float));
}
inline void narrow(float* dst, const float* src, size_t n) {
  if (dst != src) std::memcpy(dst, src, n * sizeof(float));
}

// A row of n values of type T viewed as fp32: for float it is the row itself (no copy); otherwise
// it is widened into the given scratch slot.
template <typename T>
inline const float* row_as_float(const T* src, size_t n, int slot) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    float* buf = scratch(n, slot);
    widen(buf, src, n);
    return buf;
  }
}

// dst (T) += src (fp32), n values; for T != float this rounds once per element.
template <typename T>
inline void add_row(T* __restrict dst, const float* __restrict src, size_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    for (size_t i = 0; i < n; ++i) store_f32(dst, i, load_f32(dst, i) + src[i]);
  } else {
    float tmp[256];
    for (size_t off = 0; off < n; off += 256) {
      const size_t len = std::min<size_t>(256, n - off);
      widen(tmp, dst + off, len);
      for (size_t i = 0; i < len; ++i) tmp[i] += src[off + i];
      narrow(dst + off, tmp, len);
    }
  }
}

}  // namespace kiln::cpu::detail

#include "kernels/cpu/parallel_impl.h"
