// Causal multi-head self-attention, FlashAttention-style on the CPU.
//
// Forward: one task per (batch, head, query block); key blocks are streamed through an online
// softmax (running max m, running sum l, rescaled output accumulator), so no (T,T) matrix exists;
// per task memory is O(block * head_size). The logsumexp of each row is saved for backward.
// Backward: one task per (batch, head). It recomputes each probability block from q, k and the
// saved logsumexp (P = exp(q k^T * scale - lse)) and accumulates dq, dk, dv in a fixed order, so
// the result is deterministic without atomics. D = rowsum(dO * O) replaces the softmax Jacobian
// sum (FlashAttention-2).
// Inner loops are arranged so the innermost loop runs along a contiguous dimension without a
// reduction (keys stored transposed for q k^T and dO v^T), which compilers vectorise.
#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

namespace {
constexpr int kBlockQ = 64;
constexpr int kBlockK = 64;

// S[r][c] = sum_d A[r][d] * Bt[d][c] for r < m, c < n; A is m x k (row stride k), Bt is k x ldb.
inline void block_a_bt(float* S, int lds, const float* A, int m, int k, const float* Bt, int ldb,
                       int n) {
  for (int r = 0; r < m; ++r) {
    float* s = S + static_cast<size_t>(r) * lds;
    for (int c = 0; c < n; ++c) s[c] = 0.0f;
    const float* a = A + static_cast<size_t>(r) * k;
    for (int d = 0; d < k; ++d) {
      const float ad = a[d];
      const float* bt = Bt + static_cast<size_t>(d) * ldb;
      for (int c = 0; c < n; ++c) s[c] += ad * bt[c];
    }
  }
}

}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const Same<T>* qkv, int B, int T_, int C, int NH) {
  KILN_CHECK(NH > 0 && C % NH == 0, "attention_forward: C must be a multiple of NH");
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nqb = (T_ + kBlockQ - 1) / kBlockQ;
  const size_t C3 = static_cast<size_t>(3) * C;
  const size_t tasks = static_cast<size_t>(B) * NH * nqb;

  parallel_tasks(tasks, [&](size_t task) {
    const int qb = static_cast<int>(task % nqb);
    const int h = static_cast<int>((task / nqb) % NH);
    const int b = static_cast<int>(task / (static_cast<size_t>(nqb) * NH));
    const int i0 = qb * kBlockQ;
    const int nq = std::min(kBlockQ, T_ - i0);
    const T* base = qkv + static_cast<size_t>(b) * T_ * C3;

    float* Q = scratch(static_cast<size_t>(kBlockQ) * hs, 0);
    float* KtV = scratch(static_cast<size_t>(2) * kBlockK * hs, 1);
    float* Kt = KtV;                       // hs x kBlockK
    float* V = KtV + static_cast<size_t>(kBlockK) * hs;  // kBlockK x hs
    float* S = scratch(static_cast<size_t>(kBlockQ) * kBlockK, 2);
    float* acc = scratch(static_cast<size_t>(kBlockQ) * (hs + 2), 3);
    float* O = acc;
    float* m = acc + static_cast<size_t>(kBlockQ) * hs;
    float* l = m + kBlockQ;

    for (int r = 0; r < nq; ++r) {
      const T* q = base + static_cast<size_t>(i0 + r) * C3 + static_cast<size_t>(h) * hs;
      float* qr = Q + static_cast<size_t>(r) * hs;
      for (int d = 0; d < hs; ++d) qr[d] = to_float(q[d]) * scale;
      m[r] = -HUGE_VALF;
      l[r] = 0.0f;
      std::fill(O + static_cast<size_t>(r) * hs, O + static_cast<size_t>(r + 1) * hs, 0.0f);
    }
    const int last_key = i0 + nq - 1;
    for (int j0 = 0; j0 <= last_key; j0 += kBlockK) {
      const int nk = std::min(kBlockK, last_key + 1 - j0);
      for (int c = 0; c < nk; ++c) {
        const T* kv = base + static_cast<size_t>(j0 + c) * C3 + static_cast<size_t>(h) * hs;
        const T* k = kv + C;
        const T* v = kv + 2 * static_cast<size_t>(C);
        for (int d = 0; d < hs; ++d) Kt[static_cast<size_t>(d) * kBlockK + c] = to_float(k[d]);
        float* vr = V + static_cast<size_t>(c) * hs;
        for (int d = 0; d < hs; ++d) vr[d] = to_float(v[d]);
      }
      block_a_bt(S, kBlockK, Q, nq, hs, Kt, kBlockK, nk);
      const bool diagonal = j0 + nk - 1 > i0;  // some keys lie after some queries
      for (int r = 0; r < nq; ++r) {
        float* s = S + static_cast<size_t>(r) * kBlockK;
        int valid = nk;
        if (diagonal) valid = std::min(nk, i0 + r - j0 + 1);
        float bmax = row_max(s, valid);
        float m_new = std::max(m[r], bmax);
        float corr = fast_exp(m[r] - m_new);
        for (int c = 0; c < valid; ++c) s[c] = fast_exp(s[c] - m_new);
        l[r] = l[r] * corr + row_sum(s, valid);
        m[r] = m_new;
        float* o = O + static_cast<size_t>(r) * hs;
        for (int d = 0; d < hs; ++d) o[d] *= corr;
        for (int c = 0; c < valid; ++c) {
          const float p = s[c];
          const float* vr = V + static_cast<size_t>(c) * hs;
          for (int d = 0; d < hs; ++d) o[d] += p * vr[d];
        }
      }
    }
    for (int r = 0; r < nq; ++r) {
      float* o = O + static_cast<size_t>(r) * hs;
      const float inv = 1.0f / l[r];
      for (int d = 0; d < hs; ++d) o[d] *= inv;
      narrow(out + (static_cast<size_t>(b) * T_ + i0 + r) * C + static_cast<size_t>(h) * hs, o, hs);
      lse[(static_cast<size_t>(b) * NH + h) * T_ + i0 + r] = m[r] + std::log(l[r]);
    }
  });
}

template <typename T>
void attention_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                        const float* lse, int B, int T_, int C, int NH) {
  KILN_CHECK(NH > 0 && C % NH == 0, "attention_backward: C must be a multiple of NH");
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = static_cast<size_t>(3) * C;
  const size_t Ths = static_cast<size_t>(T_) * hs;

  parallel_tasks(static_cast<size_t>(B) * NH, [&](size_t task) {
    const int h = static_cast<int>(task % NH);
    const int b = static_cast<int>(task / NH);
    const T* base = qkv + static_cast<size_t>(b) * T_ * C3;
    const float* L = lse + (static_cast<size_t>(b) * NH + h) * T_;

    // Per-head fp32 copies (linear in T): Q, K, V, dO, dQ accumulator, D.
    float* buf = scratch(5 * Ths + T_, 0);
    float* Q = buf;
    float* K = Q + Ths;
    float* V = K + Ths;
    float* dO = V + Ths;
    float* dQ = dO + Ths;
    float* D = dQ + Ths;
    for (int t = 0; t < T_; ++t) {
      const T* row = base + static_cast<size_t>(t) * C3 + static_cast<size_t>(h) * hs;
      widen(Q + static_cast<size_t>(t) * hs, row, hs);
      widen(K + static_cast<size_t>(t) * hs, row + C, hs);
      widen(V + static_cast<size_t>(t) * hs, row + 2 * static_cast<size_t>(C), hs);
      const size_t o_off = (static_cast<size_t>(b) * T_ + t) * C + static_cast<size_t>(h) * hs;
      widen(dO + static_cast<size_t>(t) * hs, dout + o_off, hs);
      // D = rowsum(dO * O), with O as stored by forward.
      float* orow = dQ + static_cast<size_t>(t) * hs;  // dQ is zeroed below; borrow it here
      widen(orow, out + o_off, hs);
      D[t] = row_dot(dO + static_cast<size_t>(t) * hs, orow, hs);
    }
    std::fill(dQ, dQ + Ths, 0.0f);

    float* tb = scratch(static_cast<size_t>(2) * hs * kBlockK, 1);
    float* Kt = tb;                                   // hs x kBlockK
    float* Vt = tb + static_cast<size_t>(hs) * kBlockK;  // hs x kBlockK
    float* sb = scratch(static_cast<size_t>(2) * kBlockQ * kBlockK, 2);
    float* P = sb;                                       // kBlockQ x kBlockK
    float* dS = sb + static_cast<size_t>(kBlockQ) * kBlockK;  // kBlockQ x kBlockK
    float* kv = scratch(static_cast<size_t>(2) * kBlockK * hs + hs, 3);
    float* dK = kv;                                     // kBlockK x hs
    float* dV = kv + static_cast<size_t>(kBlockK) * hs;  // kBlockK x hs
    float* tmp = dV + static_cast<size_t>(kBlockK) * hs;  // hs

    for (int j0 = 0; j0 < T_; j0 += kBlockK) {
      const int nk = std::min(kBlockK, T_ - j0);
      for (int c = 0; c < nk; ++c) {
        const float* k = K + static_cast<size_t>(j0 + c) * hs;
        const float* v = V + static_cast<size_t>(j0 + c) * hs;
        for (int d = 0; d < hs; ++d) {
          Kt[static_cast<size_t>(d) * kBlockK + c] = k[d];
          Vt[static_cast<size_t>(d) * kBlockK + c] = v[d];
        }
      }
      std::fill(dK, dK + static_cast<size_t>(2) * kBlockK * hs, 0.0f);  // dK and dV
      // Query blocks aligned to kBlockQ starting at the block that holds key j0.
      for (int i0 = (j0 / kBlockQ) * kBlockQ; i0 < T_; i0 += kBlockQ) {
        const int nq = std::min(kBlockQ, T_ - i0);
        const float* Qi = Q + static_cast<size_t>(i0) * hs;
        const float* dOi = dO + static_cast<size_t>(i0) * hs;
        block_a_bt(P, kBlockK, Qi, nq, hs, Kt, kBlockK, nk);     // raw scores
        block_a_bt(dS, kBlockK, dOi, nq, hs, Vt, kBlockK, nk);   // dP = dO V^T
        for (int r = 0; r < nq; ++r) {
          const int i = i0 + r;
          float* p = P + static_cast<size_t>(r) * kBlockK;
          float* ds = dS + static_cast<size_t>(r) * kBlockK;
          const int valid = std::max(0, std::min(nk, i - j0 + 1));
          const float li = L[i];
          const float Di = D[i];
          for (int c = 0; c < valid; ++c) {
            p[c] = fast_exp(p[c] * scale - li);
            ds[c] = p[c] * (ds[c] - Di);
          }
          for (int c = valid; c < nk; ++c) {
            p[c] = 0.0f;
            ds[c] = 0.0f;
          }
          // dQ_i += dS K_j (scale applied at the end).
          float* dq = dQ + static_cast<size_t>(i) * hs;
          for (int c = 0; c < valid; ++c) {
            const float w = ds[c];
            const float* k = K + static_cast<size_t>(j0 + c) * hs;
            for (int d = 0; d < hs; ++d) dq[d] += w * k[d];
          }
        }
        // dV_j += P^T dO_i ; dK_j += dS^T Q_i  (rows in order).
        for (int r = 0; r < nq; ++r) {
          const float* p = P + static_cast<size_t>(r) * kBlockK;
          const float* ds = dS + static_cast<size_t>(r) * kBlockK;
          const float* dorow = dOi + static_cast<size_t>(r) * hs;
          const float* qrow = Qi + static_cast<size_t>(r) * hs;
          for (int c = 0; c < nk; ++c) {
            const float pc = p[c];
            const float dc = ds[c];
            float* dv = dV + static_cast<size_t>(c) * hs;
            float* dk = dK + static_cast<size_t>(c) * hs;
            for (int d = 0; d < hs; ++d) {
              dv[d] += pc * dorow[d];
              dk[d] += dc * qrow[d];
            }
          }
        }
      }
      for (int c = 0; c < nk; ++c) {
        T* row = dqkv + (static_cast<size_t>(b) * T_ + j0 + c) * C3 + static_cast<size_t>(h) * hs;
        float* dk = dK + static_cast<size_t>(c) * hs;
        for (int d = 0; d < hs; ++d) tmp[d] = dk[d] * scale;
        add_row(row + C, tmp, hs);
        add_row(row + 2 * static_cast<size_t>(C), dV + static_cast<size_t>(c) * hs, hs);
      }
    }
    for (int t = 0; t < T_; ++t) {
      T* row = dqkv + (static_cast<size_t>(b) * T_ + t) * C3 + static_cast<size_t>(h) * hs;
      float* dq = dQ + static_cast<size_t>(t) * hs;
      for (int d = 0; d < hs; ++d) dq[d] *= scale;
      add_row(row, dq, hs);
    }
  });
}

#define KILN_INSTANTIATE(T)                                                                     \
  template void attention_forward<T>(T*, float*, const T*, int, int, int, int);                \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const float*, int, int, \
                                      int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
