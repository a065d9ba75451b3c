// gemm_lp: Kiln's own AVX2/FMA GEMM for bf16/fp16 operands (kernels/cpu/internal.h), used by
// matmul when oneDNN has no bf16 matmul for this CPU and path (and always for fp16).
//
// Blocked like BLIS/GotoBLAS: B is packed per (KC x NC) block into fp32 panels of 16 columns, A
// per (MC x KC) block into fp32 (rows of A in place when A's rows are contiguous in k, panels of
// 6 rows when its columns are), and a 6x16 micro-kernel of 12 ymm accumulators multiplies them.
// The bf16/fp16 -> fp32 widening happens inside those packing passes, which any GEMM makes
// anyway, and the rounding of the result (or the += into a low-precision output) happens on the
// 6x16 tile while it is in registers' reach: no whole-operand widened copies, no separate
// rounding pass.
//
// Bits: element (m, n) is one FMA chain over k = 0..K-1 in order, starting from the bias (or 0),
// then stored (rounded) or added to the output (rounded once): the same for any block sizes, any
// block of the output a call computes, and any thread count.
#include <immintrin.h>

#include "kernels/cpu/internal.h"

namespace kiln::cpu::detail {
namespace {

constexpr int kMr = 6, kNr = 16, kKc = 256, kNc = 1024, kMcMax = 144, kSumBudget = 128 << 10;

// 8 consecutive values of T as fp32 (exact: every bf16/fp16 value is an fp32 value).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const fp16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// r[c][k] -> r[k][c] for an 8x8 block.
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// B (kc x nc, element (k, n) at B[k * rs + n * cs]) as fp32 panels of 16 columns: panel j holds
// for each k the 16 values of columns 16j..16j+15 (zeros past nc). dst is 64-byte aligned.
template <typename T>
void pack_b(float* __restrict dst, const T* __restrict B, size_t rs, size_t cs, int kc, int nc) {
  const int full = nc / kNr * kNr;
  const size_t ps = static_cast<size_t>(kc) * kNr;  // panel stride
  if (cs == 1) {  // rows contiguous: each row k read once, 16 values to each panel
    for (int k = 0; k < kc; ++k) {
      const T* s = B + k * rs;
      float* d = dst + k * kNr;
      for (int j = 0; j < full; j += kNr, d += ps) {
        _mm256_store_ps(d, load8(s + j));
        _mm256_store_ps(d + 8, load8(s + j + 8));
      }
    }
  } else if (rs == 1) {  // columns contiguous (a transposed operand): 8x8 blocks
    for (int j = 0; j < full; j += kNr) {
      float* d = dst + (j / kNr) * ps;
      int k = 0;
      for (; k + 8 <= kc; k += 8) {
        for (int h = 0; h < 2; ++h) {
          __m256 r[8];
          for (int c = 0; c < 8; ++c) r[c] = load8(B + (j + h * 8 + c) * cs + k);
          transpose8(r);
          for (int q = 0; q < 8; ++q) _mm256_store_ps(d + (k + q) * kNr + h * 8, r[q]);
        }
      }
      for (; k < kc; ++k)
        for (int c = 0; c < kNr; ++c) d[k * kNr + c] = to_float(B[(j + c) * cs + k]);
    }
  } else {
    for (int k = 0; k < kc; ++k)
      for (int j = 0; j < full; ++j)
        dst[(j / kNr) * ps + k * kNr + j % kNr] = to_float(B[k * rs + j * cs]);
  }
  if (full < nc) {  // last, partial panel: zeros past nc
    float* d = dst + (full / kNr) * ps;
    for (int k = 0; k < kc; ++k)
      for (int c = 0; c < kNr; ++c)
        d[k * kNr + c] = full + c < nc ? to_float(B[k * rs + (full + c) * cs]) : 0.0f;
  }
}

// A block (mc x kc, element (i, k) at A[i * rs + k * cs]) as the micro-kernel reads it.
//  rows: rs is the row stride of the returned buffer (rows contiguous in k, rounded up to a
//        multiple of 6 rows with zeros);
//  panels (rows == false): panel p at p * stride holds for each k the 6 values of rows 6p..6p+5.
struct ABlock {
  const float* a;
  size_t stride;  // rows: row stride; panels: panel stride
  bool rows;
};

template <typename T>
ABlock prepare_a(const T* __restrict A, size_t rs, size_t cs, int mc, int kc, float* buf) {
  const int mp = (mc + kMr - 1) / kMr * kMr;
  if (cs == 1) {
    const size_t ld = static_cast<size_t>(kc);
    for (int i = 0; i < mc; ++i) widen(buf + i * ld, A + i * rs, ld);
    std::fill(buf + mc * ld, buf + mp * ld, 0.0f);
    return {buf, ld, true};
  }
  // Columns contiguous: each column k read once, 6 values to each panel. The 8-wide store spills
  // 2 values into the panel's next k (written after) or, at the last k, into its padding.
  const size_t ps = static_cast<size_t>(kc) * kMr + 8;
  const int np = (mc + kMr - 1) / kMr;
  int vec = 0;  // panels whose 8-value loads stay inside the block
  while (vec < np && vec * kMr + 8 <= mc) ++vec;
  for (int k = 0; k < kc; ++k) {
    const T* s = A + k * cs;
    float* d = buf + k * kMr;
    for (int p = 0; p < vec; ++p) _mm256_storeu_ps(d + p * ps, load8(s + p * kMr));
  }
  for (int p = vec; p < np; ++p) {
    float* d = buf + p * ps;
    const int r = std::min(kMr, mc - p * kMr);
    for (int k = 0; k < kc; ++k)
      for (int i = 0; i < kMr; ++i)
        d[k * kMr + i] = i < r ? to_float(A[k * cs + p * kMr + i]) : 0.0f;
  }
  return {buf, ps, false};
}

// out (6 x 16, row stride out_ld) = init + A panel (6 x kc) @ B panel (kc x 16), one FMA chain
// per element over k in order. init: 6 rows of 16 at init + i * init_ld (init_ld 0: one row for
// all, the bias), or zeros when nullptr. A rows: a[i * rs + k]; A panel: a[k * 6 + i].
template <bool kRows>
inline void micro_kernel(int kc, const float* __restrict a, size_t rs, const float* __restrict b,
                         const float* init, size_t init_ld, float* out, size_t out_ld) {
  __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  if (init) {
    c00 = _mm256_loadu_ps(init), c01 = _mm256_loadu_ps(init + 8);
    c10 = _mm256_loadu_ps(init + init_ld), c11 = _mm256_loadu_ps(init + init_ld + 8);
    c20 = _mm256_loadu_ps(init + 2 * init_ld), c21 = _mm256_loadu_ps(init + 2 * init_ld + 8);
    c30 = _mm256_loadu_ps(init + 3 * init_ld), c31 = _mm256_loadu_ps(init + 3 * init_ld + 8);
    c40 = _mm256_loadu_ps(init + 4 * init_ld), c41 = _mm256_loadu_ps(init + 4 * init_ld + 8);
    c50 = _mm256_loadu_ps(init + 5 * init_ld), c51 = _mm256_loadu_ps(init + 5 * init_ld + 8);
  } else {
    c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  }
  const float *a0 = a, *a1, *a2, *a3, *a4, *a5;
  if constexpr (kRows) {
    a1 = a + rs, a2 = a + 2 * rs, a3 = a + 3 * rs, a4 = a + 4 * rs, a5 = a + 5 * rs;
  } else {
    a1 = a + 1, a2 = a + 2, a3 = a + 3, a4 = a + 4, a5 = a + 5;
  }
  constexpr size_t step = kRows ? 1 : kMr;
#pragma GCC unroll 4
  for (int k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    b += kNr;
    __m256 x = _mm256_broadcast_ss(a0);
    c00 = _mm256_fmadd_ps(x, b0, c00);
    c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a1);
    c10 = _mm256_fmadd_ps(x, b0, c10);
    c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a2);
    c20 = _mm256_fmadd_ps(x, b0, c20);
    c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a3);
    c30 = _mm256_fmadd_ps(x, b0, c30);
    c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a4);
    c40 = _mm256_fmadd_ps(x, b0, c40);
    c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a5);
    c50 = _mm256_fmadd_ps(x, b0, c50);
    c51 = _mm256_fmadd_ps(x, b1, c51);
    a0 += step, a1 += step, a2 += step, a3 += step, a4 += step, a5 += step;
  }
  _mm256_storeu_ps(out, c00), _mm256_storeu_ps(out + 8, c01);
  _mm256_storeu_ps(out + out_ld, c10), _mm256_storeu_ps(out + out_ld + 8, c11);
  _mm256_storeu_ps(out + 2 * out_ld, c20), _mm256_storeu_ps(out + 2 * out_ld + 8, c21);
  _mm256_storeu_ps(out + 3 * out_ld, c30), _mm256_storeu_ps(out + 3 * out_ld + 8, c31);
  _mm256_storeu_ps(out + 4 * out_ld, c40), _mm256_storeu_ps(out + 4 * out_ld + 8, c41);
  _mm256_storeu_ps(out + 5 * out_ld, c50), _mm256_storeu_ps(out + 5 * out_ld + 8, c51);
}

// 8 fp32 values rounded to bf16, the same bits as float_to_bf16_bits (internal.h): nearest even,
// NaN kept as a quiet NaN.
inline __m128i round8_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; take qwords 0 and 2.
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

// Row i of the finished tile into C: stored (rounded) or added (rounded once), as narrow /
// add_row do.
template <typename TC>
inline void finish_row(TC* out, const float* v, int w, bool accumulate) {
  if (w == kNr && !std::is_same_v<TC, fp16>) {
    for (int h = 0; h < kNr; h += 8) {
      __m256 x = _mm256_load_ps(v + h);
      if constexpr (std::is_same_v<TC, float>) {
        if (accumulate) x = _mm256_add_ps(_mm256_loadu_ps(out + h), x);
        _mm256_storeu_ps(out + h, x);
      } else {
        if (accumulate) x = _mm256_add_ps(load8(out + h), x);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + h), round8_bf16(x));
      }
    }
  } else if (accumulate) {
    add_row(out, v, static_cast<size_t>(w));
  } else {
    narrow(out, v, static_cast<size_t>(w));
  }
}

}  // namespace

template <typename T, typename TC>
void gemm_lp(int M, int N, int K, const T* A, size_t a_rs, size_t a_cs, const T* B, size_t b_rs,
             size_t b_cs, TC* C, size_t ldc, const float* bias, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  // Block sizes change nothing in the result (each element is one FMA chain over k in order,
  // carried across k blocks through an fp32 buffer), only the speed. kc <= 320 keeps a 16-column
  // panel of B (kc x 16 fp32) in L1 while the 6-row panels of A pass over it.
  const int kc_max = K <= kKc + kKc / 4 ? std::max(K, 1) : kKc;
  if (K > kc_max && static_cast<size_t>(M) * std::min(N, kNc) > kSumBudget) {
    // Several k blocks: split the output so that its partial sums (fp32) stay within ~512 KiB,
    // by rows (B packed once per row group) or by columns (A once per column group), whichever
    // packs fewer values.
    const int rg = (M + kSumBudget / std::min(N, kNc) - 1) / (kSumBudget / std::min(N, kNc));
    const int cw = std::max(kNr, kSumBudget / (M + kMr) / kNr * kNr);
    const int cg = (N + cw - 1) / cw;
    if (static_cast<size_t>(rg) * N <= static_cast<size_t>(cg) * M) {
      const int mg = ((M + rg - 1) / rg + kMr - 1) / kMr * kMr;
      for (int g = 0; g < M; g += mg) {
        gemm_lp(std::min(mg, M - g), N, K, A + g * a_rs, a_rs, a_cs, B, b_rs, b_cs, C + g * ldc,
                ldc, bias, accumulate);
      }
    } else {
      const int ng = ((N + cg - 1) / cg + kNr - 1) / kNr * kNr;
      for (int g = 0; g < N; g += ng) {
        gemm_lp(M, std::min(ng, N - g), K, A, a_rs, a_cs, B + g * b_cs, b_rs, b_cs, C + g, ldc,
                bias ? bias + g : nullptr, accumulate);
      }
    }
    return;
  }
  const int mc_blocks = (M + kMcMax - 1) / kMcMax;
  const int mc_max = ((M + mc_blocks - 1) / mc_blocks + kMr - 1) / kMr * kMr;
  const int nc_max = std::min(N, kNc);
  const int nc_pad = (nc_max + kNr - 1) / kNr * kNr;
  const int m_pad = (M + kMr - 1) / kMr * kMr;
  float* bp = scratch(static_cast<size_t>(kc_max) * nc_pad, 0);
  float* ap = scratch(static_cast<size_t>(mc_max + kMr) * (kc_max + 2), 1);
  // Partial sums between k blocks (rows padded to the 6-row panels, columns to 16).
  const bool multi = K > kc_max;
  float* sum = multi ? scratch(static_cast<size_t>(m_pad) * nc_pad, 2) : nullptr;
  float* bias_pad = bias ? scratch(static_cast<size_t>(nc_pad), 3) : nullptr;
  alignas(64) float t[kMr * kNr];
  for (int jc = 0; jc < N; jc += kNc) {
    const int nc = std::min(kNc, N - jc);
    if (bias) {
      std::copy(bias + jc, bias + jc + nc, bias_pad);
      std::fill(bias_pad + nc, bias_pad + nc_pad, 0.0f);
    }
    for (int pc = 0; pc < std::max(K, 1); pc += kc_max) {
      const int kc = std::min(kc_max, K - pc);
      const bool first = pc == 0, last = pc + kc_max >= K;
      if (kc > 0) pack_b(bp, B + pc * b_rs + jc * b_cs, b_rs, b_cs, kc, nc);
      for (int ic = 0; ic < M; ic += mc_max) {
        const int mc = std::min(mc_max, M - ic);
        const ABlock ab =
            kc > 0 ? prepare_a(A + ic * a_rs + pc * a_cs, a_rs, a_cs, mc, kc, ap) : ABlock{};
        for (int jr = 0; jr < nc; jr += kNr) {
          const int w = std::min(kNr, nc - jr);
          for (int ir = 0; ir < mc; ir += kMr) {
            float* s = multi ? sum + static_cast<size_t>(ic + ir) * nc_pad + jr : nullptr;
            const float* init = first ? (bias ? bias_pad + jr : nullptr) : s;
            const size_t init_ld = first ? 0 : static_cast<size_t>(nc_pad);
            float* out = last ? t : s;
            const size_t out_ld = last ? kNr : static_cast<size_t>(nc_pad);
            if (last) {  // the output rows of this tile, fetched while the micro-kernel runs
              const int r = std::min(kMr, mc - ir);
              for (int i = 0; i < r; ++i)
                _mm_prefetch(reinterpret_cast<const char*>(
                                 C + static_cast<size_t>(ic + ir + i) * ldc + jc + jr),
                             _MM_HINT_T0);
            }
            if (kc == 0) {
              for (int i = 0; i < kMr; ++i)
                for (int c = 0; c < kNr; ++c) t[i * kNr + c] = init ? init[c] : 0.0f;
            } else if (ab.rows) {
              micro_kernel<true>(kc, ab.a + ir * ab.stride, ab.stride, bp + jr * kc, init,
                                 init_ld, out, out_ld);
            } else {
              micro_kernel<false>(kc, ab.a + (ir / kMr) * ab.stride, 0, bp + jr * kc, init,
                                  init_ld, out, out_ld);
            }
            if (!last) continue;
            const int r = std::min(kMr, mc - ir);
            for (int i = 0; i < r; ++i)
              finish_row(C + static_cast<size_t>(ic + ir + i) * ldc + jc + jr, t + i * kNr, w,
                         accumulate);
          }
        }
      }
      if (K <= 0) break;
    }
  }
}

#define KILN_INSTANTIATE(T, TC)                                                              \
  template void gemm_lp<T, TC>(int, int, int, const T*, size_t, size_t, const T*, size_t,   \
                               size_t, TC*, size_t, const float*, bool);
KILN_INSTANTIATE(bf16, bf16)
KILN_INSTANTIATE(bf16, float)
KILN_INSTANTIATE(fp16, fp16)
KILN_INSTANTIATE(fp16, float)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu::detail
