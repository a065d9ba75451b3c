// Causal multi-head self-attention, FlashAttention-style on the CPU.
//
// Forward: one task per (batch, head, query block); key blocks are streamed through an online
// softmax (running max m, running sum l, rescaled output accumulator), so no (T,T) matrix exists;
// per task memory is O(block * head_size). The logsumexp of each row is saved for backward.
// Backward: one task per (batch, head). It recomputes each probability block from q, k and the
// saved logsumexp (P = exp(q k^T * scale - lse)) and accumulates dq, dk, dv in a fixed order, so
// the result is deterministic without atomics. D = rowsum(dO * O) replaces the softmax Jacobian
// sum (FlashAttention-2).
// The block products (64 x 64 x head_size) use a small register-tiled GEMM (gemm_acc, one build
// per CPU path) with keys stored transposed, so the innermost loops run along contiguous memory
// without reductions and vectorise; softmax rows use the vectorised exp.
#include <immintrin.h>

#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

namespace {
constexpr int kBlockQ = 64;
constexpr int kBlockK = 64;

// C[m x n] += A[m x k] @ B[k x n], all row-major with the given row strides. An MR x 16 tile of C
// is held in MR 16-float vectors (GCC vector extensions: one zmm each with AVX-512, two ymm with
// AVX2) for the whole k loop; edges fall back to plain loops. MR is 8 on the AVX-512 path (8 of
// the 32 zmm) and 6 on AVX2 (12 of the 16 ymm, leaving room for the two B vectors and the
// broadcast). Every element sums over d = 0..k-1 in order with one fused multiply-add per term, so
// results do not depend on the tiling, and both paths give the same bits.
typedef float VecF16 __attribute__((vector_size(64)));

// By reference, not by value: keeps the vector type out of the function ABI (no -Wpsabi noise
// when AVX-512 is not enabled; the calls are inlined either way).
inline void load16(VecF16& v, const float* p) { __builtin_memcpy(&v, p, sizeof(v)); }
inline void store16(float* p, const VecF16& v) { __builtin_memcpy(p, &v, sizeof(v)); }

template <int MR>
__attribute__((always_inline)) inline void gemm_acc_tiles(float* __restrict C, int ldc,
                                                          const float* __restrict A, int lda,
                                                          const float* __restrict B, int ldb,
                                                          int m, int n, int k) {
  constexpr int NR = 16;
  const int m_main = m / MR * MR, n_main = n / NR * NR;
  for (int r0 = 0; r0 < m_main; r0 += MR) {
    const float* a0 = A + static_cast<size_t>(r0) * lda;
    for (int c0 = 0; c0 < n_main; c0 += NR) {
      float* c = C + static_cast<size_t>(r0) * ldc + c0;
      VecF16 acc[MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) load16(acc[i], c + static_cast<size_t>(i) * ldc);
      const float* b = B + c0;
      for (int d = 0; d < k; ++d, b += ldb) {
        VecF16 bv;
        load16(bv, b);
        const float* a = a0 + d;
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) acc[i] += a[static_cast<size_t>(i) * lda] * bv;
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) store16(c + static_cast<size_t>(i) * ldc, acc[i]);
    }
    if (n_main < n) {
      for (int i = 0; i < MR; ++i) {
        float* c = C + static_cast<size_t>(r0 + i) * ldc;
        for (int d = 0; d < k; ++d) {
          const float a = A[static_cast<size_t>(r0 + i) * lda + d];
          const float* b = B + static_cast<size_t>(d) * ldb;
          for (int j = n_main; j < n; ++j) c[j] += a * b[j];
        }
      }
    }
  }
  for (int r = m_main; r < m; ++r) {
    float* c = C + static_cast<size_t>(r) * ldc;
    for (int d = 0; d < k; ++d) axpy(c, A[static_cast<size_t>(r) * lda + d], B + static_cast<size_t>(d) * ldb, n);
  }
}

// The AVX2 build of the 16-column tiles, written with intrinsics: GCC keeps 64-byte vector-
// extension values in memory when only 32-byte registers exist (every FMA then loads and stores
// its accumulator), which ran this kernel at about a tenth of the FMA peak.
void gemm_acc_avx2(float* __restrict C, int ldc, const float* __restrict A, int lda,
                   const float* __restrict B, int ldb, int m, int n, int k) {
  constexpr int MR = 6, NR = 16;
  const int m_main = m / MR * MR, n_main = n / NR * NR;
  for (int r0 = 0; r0 < m_main; r0 += MR) {
    const float* a0 = A + static_cast<size_t>(r0) * lda;
    for (int c0 = 0; c0 < n_main; c0 += NR) {
      float* c = C + static_cast<size_t>(r0) * ldc + c0;
      __m256 acc[MR][2];
      for (int i = 0; i < MR; ++i) {
        acc[i][0] = _mm256_loadu_ps(c + static_cast<size_t>(i) * ldc);
        acc[i][1] = _mm256_loadu_ps(c + static_cast<size_t>(i) * ldc + 8);
      }
      const float* b = B + c0;
      for (int d = 0; d < k; ++d, b += ldb) {
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        const float* a = a0 + d;
        for (int i = 0; i < MR; ++i) {
          const __m256 ai = _mm256_broadcast_ss(a + static_cast<size_t>(i) * lda);
          acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
      }
      for (int i = 0; i < MR; ++i) {
        _mm256_storeu_ps(c + static_cast<size_t>(i) * ldc, acc[i][0]);
        _mm256_storeu_ps(c + static_cast<size_t>(i) * ldc + 8, acc[i][1]);
      }
    }
    if (n_main < n) {
      for (int i = 0; i < MR; ++i) {
        float* c = C + static_cast<size_t>(r0 + i) * ldc;
        for (int d = 0; d < k; ++d) {
          const float a = A[static_cast<size_t>(r0 + i) * lda + d];
          const float* b = B + static_cast<size_t>(d) * ldb;
          for (int j = n_main; j < n; ++j) c[j] += a * b[j];
        }
      }
    }
  }
  for (int r = m_main; r < m; ++r) {
    float* c = C + static_cast<size_t>(r) * ldc;
    for (int d = 0; d < k; ++d) axpy(c, A[static_cast<size_t>(r) * lda + d], B + static_cast<size_t>(d) * ldb, n);
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void gemm_acc_avx512(
    float* __restrict C, int ldc, const float* __restrict A, int lda, const float* __restrict B,
    int ldb, int m, int n, int k) {
  gemm_acc_tiles<8>(C, ldc, A, lda, B, ldb, m, n, k);
}

using GemmAcc = void (*)(float*, int, const float*, int, const float*, int, int, int, int);

// The block GEMM of the process's CPU path (kernels/cpu_isa.h).
GemmAcc pick_gemm_acc() {
  return cpu_runtime().isa == Isa::kAvx2 ? gemm_acc_avx2 : gemm_acc_avx512;
}

// dst[c][r] = src[r][c] for r < m, c < n.
inline void transpose(float* __restrict dst, int ldd, const float* __restrict src, int lds, int m,
                      int n) {
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) dst[static_cast<size_t>(c) * ldd + r] = src[static_cast<size_t>(r) * lds + c];
}

// p = exp(p * scale - lse); ds = p * (dp - D)   (ds holds dp on entry)
inline void softmax_backward_row(float* __restrict p, float* __restrict ds, float scale, float lse,
                                 float D, int n) {
  for (int c = 0; c < n; ++c) {
    const float pc = fast_exp(p[c] * scale - lse);
    p[c] = pc;
    ds[c] = pc * (ds[c] - D);
  }
}

}  // namespace

// The general form (attention_gqa_*): NH query heads over NKV key/value heads of hs values, an
// optional document mask. qkv rows hold W = (NH + 2 NKV) hs values: q of head h at h*hs, k of
// key/value head g at (NH + g) hs, v at (NH + NKV + g) hs. attention_forward/backward are this
// with NKV = NH and no mask (then W = 3C and the offsets are theirs).
namespace {

struct AttnShape {
  int B, T, NH, NKV, hs;
  size_t W() const { return static_cast<size_t>(NH + 2 * NKV) * hs; }
  size_t q_off(int h) const { return static_cast<size_t>(h) * hs; }
  size_t k_off(int g) const { return static_cast<size_t>(NH + g) * hs; }
  size_t v_off(int g) const { return static_cast<size_t>(NH + NKV + g) * hs; }
  int group(int h) const { return h / (NH / NKV); }
};

// The first key query i may see: its document's start (0 without a mask).
inline int first_key(const int32_t* ds, int i) { return ds ? ds[i] : 0; }

template <typename T>
void attention_fwd_impl(T* out, float* lse, const T* qkv, const int32_t* doc_start,
                        const AttnShape& sh) {
  const int T_ = sh.T, NH = sh.NH, hs = sh.hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nqb = (T_ + kBlockQ - 1) / kBlockQ;
  const size_t W = sh.W();
  const size_t OC = static_cast<size_t>(NH) * hs;
  const size_t tasks = static_cast<size_t>(sh.B) * NH * nqb;
  const GemmAcc gemm_acc = pick_gemm_acc();

  parallel_tasks(tasks, [&](size_t task) {
    const int qb = static_cast<int>(task % nqb);
    const int h = static_cast<int>((task / nqb) % NH);
    const int b = static_cast<int>(task / (static_cast<size_t>(nqb) * NH));
    const int g = sh.group(h);
    const int i0 = qb * kBlockQ;
    const int nq = std::min(kBlockQ, T_ - i0);
    const T* base = qkv + static_cast<size_t>(b) * T_ * W;
    const int32_t* ds = doc_start ? doc_start + static_cast<size_t>(b) * T_ : nullptr;

    float* Q = scratch(static_cast<size_t>(kBlockQ) * hs, 0);
    float* KtV = scratch(static_cast<size_t>(2) * kBlockK * hs, 1);
    float* Kt = KtV;                                     // hs x kBlockK
    float* V = KtV + static_cast<size_t>(kBlockK) * hs;  // kBlockK x hs
    float* S = scratch(static_cast<size_t>(kBlockQ) * kBlockK, 2);
    float* acc = scratch(static_cast<size_t>(kBlockQ) * (hs + 2), 3);
    float* O = acc;                                      // kBlockQ x hs
    float* m = acc + static_cast<size_t>(kBlockQ) * hs;  // running max
    float* l = m + kBlockQ;                              // running sum

    for (int r = 0; r < nq; ++r) {
      const T* q = base + static_cast<size_t>(i0 + r) * W + sh.q_off(h);
      float* qr = Q + static_cast<size_t>(r) * hs;
      widen(qr, q, hs);
      scal(qr, scale, hs);
      m[r] = -HUGE_VALF;
      l[r] = 0.0f;
    }
    std::fill(O, O + static_cast<size_t>(nq) * hs, 0.0f);
    const int last_key = i0 + nq - 1;
    // Key blocks wholly before the first query's document hold no key any query here may see.
    const int first_block = first_key(ds, i0) / kBlockK * kBlockK;
    for (int j0 = first_block; j0 <= last_key; j0 += kBlockK) {
      const int nk = std::min(kBlockK, last_key + 1 - j0);
      for (int c = 0; c < nk; ++c) {
        const T* row = base + static_cast<size_t>(j0 + c) * W;
        float* vrow = V + static_cast<size_t>(c) * hs;
        widen(vrow, row + sh.k_off(g), hs);  // the key row, staged in V's row and transposed
        for (int d = 0; d < hs; ++d) Kt[static_cast<size_t>(d) * kBlockK + c] = vrow[d];
        widen(vrow, row + sh.v_off(g), hs);
      }
      std::fill(S, S + static_cast<size_t>(nq) * kBlockK, 0.0f);
      gemm_acc(S, kBlockK, Q, hs, Kt, kBlockK, nq, nk, hs);
      const bool diagonal = j0 + nk - 1 > i0;  // some keys lie after some queries
      for (int r = 0; r < nq; ++r) {
        float* s = S + static_cast<size_t>(r) * kBlockK;
        const int valid = diagonal ? std::min(nk, i0 + r - j0 + 1) : nk;
        const int lo = std::max(0, first_key(ds, i0 + r) - j0);  // masked before its document
        if (lo >= valid) {  // no key of this block for this query
          std::fill(s, s + nk, 0.0f);
          continue;
        }
        const float m_new = std::max(m[r], row_max(s + lo, valid - lo));
        const float corr = fast_exp(m[r] - m_new);
        exp_shifted(s + lo, s + lo, m_new, valid - lo);
        for (int c = 0; c < lo; ++c) s[c] = 0.0f;
        for (int c = valid; c < nk; ++c) s[c] = 0.0f;
        l[r] = l[r] * corr + row_sum(s + lo, valid - lo);
        m[r] = m_new;
        scal(O + static_cast<size_t>(r) * hs, corr, hs);
      }
      gemm_acc(O, hs, S, kBlockK, V, hs, nq, hs, nk);
    }
    for (int r = 0; r < nq; ++r) {
      float* o = O + static_cast<size_t>(r) * hs;
      scal(o, 1.0f / l[r], hs);
      narrow(out + (static_cast<size_t>(b) * T_ + i0 + r) * OC + sh.q_off(h), o, hs);
      lse[(static_cast<size_t>(b) * NH + h) * T_ + i0 + r] = m[r] + std::log(l[r]);
    }
  });
}

// One task per (batch, key/value head): its query heads run in head order, each adding into the
// task's dK, dV (so a shared head's gradient sums over its query heads in a fixed order).
template <typename T>
void attention_bwd_impl(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                        const int32_t* doc_start, const AttnShape& sh) {
  const int T_ = sh.T, NH = sh.NH, NKV = sh.NKV, hs = sh.hs;
  const int rep = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t W = sh.W();
  const size_t OC = static_cast<size_t>(NH) * hs;
  const size_t Ths = static_cast<size_t>(T_) * hs;
  const GemmAcc gemm_acc = pick_gemm_acc();

  parallel_tasks(static_cast<size_t>(sh.B) * NKV, [&](size_t task) {
    const int g = static_cast<int>(task % NKV);
    const int b = static_cast<int>(task / NKV);
    const T* base = qkv + static_cast<size_t>(b) * T_ * W;
    const int32_t* ds = doc_start ? doc_start + static_cast<size_t>(b) * T_ : nullptr;

    // Per-task fp32 copies (linear in T): K, V, dK, dV of the shared head; Q, dO, dQ, D of the
    // query head in hand.
    float* buf = scratch(8 * Ths + T_, 0);
    float* K = buf;
    float* V = K + Ths;
    float* dKall = V + Ths;
    float* dVall = dKall + Ths;
    float* Q = dVall + Ths;
    float* dO = Q + Ths;
    float* dQ = dO + Ths;
    float* D = dQ + Ths;
    for (int t = 0; t < T_; ++t) {
      const T* row = base + static_cast<size_t>(t) * W;
      widen(K + static_cast<size_t>(t) * hs, row + sh.k_off(g), hs);
      widen(V + static_cast<size_t>(t) * hs, row + sh.v_off(g), hs);
    }
    std::fill(dKall, dKall + 2 * Ths, 0.0f);

    float* tb = scratch(static_cast<size_t>(2) * hs * kBlockK, 1);
    float* Kt = tb;                                      // hs x kBlockK
    float* Vt = tb + static_cast<size_t>(hs) * kBlockK;  // hs x kBlockK
    const size_t blk = static_cast<size_t>(kBlockQ) * kBlockK;
    float* sb = scratch(4 * blk, 2);
    float* P = sb;              // kBlockQ x kBlockK
    float* dS = sb + blk;       // kBlockQ x kBlockK
    float* Pt = sb + 2 * blk;   // kBlockK x kBlockQ
    float* dSt = sb + 3 * blk;  // kBlockK x kBlockQ

    for (int h = g * rep; h < (g + 1) * rep; ++h) {
      const float* L = lse + (static_cast<size_t>(b) * NH + h) * T_;
      for (int t = 0; t < T_; ++t) {
        const T* row = base + static_cast<size_t>(t) * W;
        widen(Q + static_cast<size_t>(t) * hs, row + sh.q_off(h), hs);
        const size_t o_off = (static_cast<size_t>(b) * T_ + t) * OC + sh.q_off(h);
        widen(dO + static_cast<size_t>(t) * hs, dout + o_off, hs);
        // D = rowsum(dO * O), with O as stored by forward (dQ's row is borrowed as a buffer).
        float* orow = dQ + static_cast<size_t>(t) * hs;
        widen(orow, out + o_off, hs);
        D[t] = row_dot(dO + static_cast<size_t>(t) * hs, orow, hs);
      }
      std::fill(dQ, dQ + Ths, 0.0f);

      for (int j0 = 0; j0 < T_; j0 += kBlockK) {
        const int nk = std::min(kBlockK, T_ - j0);
        transpose(Kt, kBlockK, K + static_cast<size_t>(j0) * hs, hs, nk, hs);
        transpose(Vt, kBlockK, V + static_cast<size_t>(j0) * hs, hs, nk, hs);
        float* dK = dKall + static_cast<size_t>(j0) * hs;  // kBlockK x hs
        float* dV = dVall + static_cast<size_t>(j0) * hs;
        // Query blocks aligned to kBlockQ starting at the block that holds key j0.
        for (int i0 = (j0 / kBlockQ) * kBlockQ; i0 < T_; i0 += kBlockQ) {
          // From here on every query's document starts after this key block (starts only grow).
          if (first_key(ds, i0) > j0 + nk - 1) break;
          const int nq = std::min(kBlockQ, T_ - i0);
          const float* Qi = Q + static_cast<size_t>(i0) * hs;
          const float* dOi = dO + static_cast<size_t>(i0) * hs;
          std::fill(sb, sb + 2 * blk, 0.0f);
          gemm_acc(P, kBlockK, Qi, hs, Kt, kBlockK, nq, nk, hs);    // raw scores
          gemm_acc(dS, kBlockK, dOi, hs, Vt, kBlockK, nq, nk, hs);  // dP = dO V^T
          for (int r = 0; r < nq; ++r) {
            const int i = i0 + r;
            float* p = P + static_cast<size_t>(r) * kBlockK;
            float* ds_row = dS + static_cast<size_t>(r) * kBlockK;
            const int valid = std::max(0, std::min(nk, i - j0 + 1));
            const int lo = std::min(valid, std::max(0, first_key(ds, i) - j0));
            softmax_backward_row(p + lo, ds_row + lo, scale, L[i], D[i], valid - lo);
            for (int c = 0; c < lo; ++c) p[c] = ds_row[c] = 0.0f;
            for (int c = valid; c < nk; ++c) p[c] = ds_row[c] = 0.0f;
          }
          // dQ_i += dS K_j ; dV_j += P^T dO_i ; dK_j += dS^T Q_i  (scale applied at the end).
          gemm_acc(dQ + static_cast<size_t>(i0) * hs, hs, dS, kBlockK,
                   K + static_cast<size_t>(j0) * hs, hs, nq, hs, nk);
          transpose(Pt, kBlockQ, P, kBlockK, nq, nk);
          transpose(dSt, kBlockQ, dS, kBlockK, nq, nk);
          gemm_acc(dV, hs, Pt, kBlockQ, dOi, hs, nk, hs, nq);
          gemm_acc(dK, hs, dSt, kBlockQ, Qi, hs, nk, hs, nq);
        }
      }
      for (int t = 0; t < T_; ++t) {
        T* row = dqkv + (static_cast<size_t>(b) * T_ + t) * W + sh.q_off(h);
        float* dq = dQ + static_cast<size_t>(t) * hs;
        scal(dq, scale, hs);
        add_row(row, dq, hs);
      }
    }
    for (int t = 0; t < T_; ++t) {
      T* row = dqkv + (static_cast<size_t>(b) * T_ + t) * W;
      float* dk = dKall + static_cast<size_t>(t) * hs;
      scal(dk, scale, hs);
      add_row(row + sh.k_off(g), dk, hs);
      add_row(row + sh.v_off(g), dVall + static_cast<size_t>(t) * hs, hs);
    }
  });
}

AttnShape check_gqa(const char* op, int B, int T_, int NH, int NKV, int hs) {
  KILN_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0,
             std::string(op) + ": NH must be a positive multiple of NKV");
  return AttnShape{B, T_, NH, NKV, hs};
}

}  // namespace

template <typename T>
void attention_gqa_forward(T* out, float* lse, const Same<T>* qkv, const int32_t* doc_start, int B,
                           int T_, int NH, int NKV, int hs) {
  attention_fwd_impl(out, lse, qkv, doc_start,
                     check_gqa("attention_gqa_forward", B, T_, NH, NKV, hs));
}

template <typename T>
void attention_gqa_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                            const float* lse, const int32_t* doc_start, int B, int T_, int NH,
                            int NKV, int hs) {
  attention_bwd_impl(dqkv, dout, qkv, out, lse, doc_start,
                     check_gqa("attention_gqa_backward", B, T_, NH, NKV, hs));
}

template <typename T>
void attention_forward(T* out, float* lse, const Same<T>* qkv, int B, int T_, int C, int NH) {
  KILN_CHECK(NH > 0 && C % NH == 0, "attention_forward: C must be a multiple of NH");
  attention_fwd_impl(out, lse, qkv, nullptr, AttnShape{B, T_, NH, NH, C / NH});
}

template <typename T>
void attention_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                        const float* lse, int B, int T_, int C, int NH) {
  KILN_CHECK(NH > 0 && C % NH == 0, "attention_backward: C must be a multiple of NH");
  attention_bwd_impl(dqkv, dout, qkv, out, lse, nullptr, AttnShape{B, T_, NH, NH, C / NH});
}

#define KILN_INSTANTIATE(T)                                                                        \
  template void attention_forward<T>(T*, float*, const T*, int, int, int, int);                    \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const float*, int, int,    \
                                      int, int);                                                   \
  template void attention_gqa_forward<T>(T*, float*, const T*, const int32_t*, int, int, int, int, \
                                         int);                                                     \
  template void attention_gqa_backward<T>(T*, const T*, const T*, const T*, const float*,          \
                                          const int32_t*, int, int, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
