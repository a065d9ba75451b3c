// matmul: out = inp @ weight^T + bias, and its backward.
//
// fp32 goes straight to OpenBLAS cblas_sgemm on the caller's buffers (no copies; OpenBLAS splits
// only the M/N dimensions across its threads, so the K-order of every dot product, and hence the
// result, does not depend on the thread count).
// bf16 uses oneDNN's matmul (AMX / AVX512-BF16 kernels, fp32 accumulation) when Kiln is built
// with oneDNN, in fixed row chunks on the oneTBB threads with one oneDNN thread per chunk, so the
// result is again independent of the thread count. Otherwise (and for fp16) the operands are
// widened to fp32 in scratch buffers and multiplied with sgemm.
#include <cblas.h>

#include <unordered_map>

#if KILN_HAVE_DNNL
#include <omp.h>

#include <dnnl.hpp>
#endif

#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using namespace detail;

namespace {

constexpr size_t kElemChunk = 1 << 15;

// out rows = bias (fp32), as the C input of a beta=1 GEMM.
void fill_bias_rows(float* out, const float* bias, size_t rows, int OC) {
  parallel_chunks(rows, 64, [&](size_t rb, size_t re) {
    for (size_t r = rb; r < re; ++r) std::memcpy(out + r * OC, bias, OC * sizeof(float));
  });
}

// dbias (OC) += column sums of dout (rows, OC); column slices in parallel, rows in order.
template <typename T>
void bias_backward(float* dbias, const T* dout, size_t rows, int OC) {
  parallel_chunks(static_cast<size_t>(OC), 256, [&](size_t cb, size_t ce) {
    const size_t w = ce - cb;
    float* acc = scratch(w, 0);
    std::fill(acc, acc + w, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
      const T* d = dout + r * OC + cb;
      for (size_t c = 0; c < w; ++c) acc[c] += to_float(d[c]);
    }
    for (size_t c = 0; c < w; ++c) dbias[cb + c] += acc[c];
  });
}

template <typename T>
const float* widen_all(const T* src, size_t n, int slot) {
  float* dst = scratch(n, slot);
  parallel_chunks(n, kElemChunk, [&](size_t b, size_t e) { widen(dst + b, src + b, e - b); });
  return dst;
}

void sgemm_forward(float* out, const float* inp, const float* weight, const float* bias, int BT,
                   int C, int OC) {
  if (bias) fill_bias_rows(out, bias, BT, OC);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, inp, C, weight, C,
              bias ? 1.0f : 0.0f, out, OC);
}

void sgemm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                    const float* weight, int BT, int C, int OC) {
  if (dinp) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  }
  if (dweight) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
  }
}

#if KILN_HAVE_DNNL
// ---- oneDNN bf16 GEMM ---------------------------------------------------------------------------
// C[M,N] (+)= A[M,K] @ B[K,N] (+ bias[N]); A, B bf16 with arbitrary strides, C fp32 or bf16.
struct GemmKey {
  int64_t M, N, K, a_rs, a_cs, b_rs, b_cs, ldc;
  int c_bf16, accumulate, has_bias;
  bool operator==(const GemmKey&) const = default;
};
struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : {k.M, k.N, k.K, k.a_rs, k.a_cs, k.b_rs, k.b_cs, k.ldc,
                      static_cast<int64_t>(k.c_bf16 * 4 + k.accumulate * 2 + k.has_bias)}) {
      h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    }
    return h;
  }
};
struct GemmPrim {
  dnnl::memory::desc a, b, c, bias;
  dnnl::matmul prim;
};

dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

void dnnl_gemm(int64_t M, int64_t N, int64_t K, const bf16* A, int64_t a_rs, int64_t a_cs,
               const bf16* B, int64_t b_rs, int64_t b_cs, void* Cmat, bool c_bf16, int64_t ldc,
               bool accumulate, const bf16* bias) {
  using dt = dnnl::memory::data_type;
  thread_local std::unordered_map<GemmKey, GemmPrim, GemmKeyHash> cache;
  thread_local dnnl::stream strm(dnnl_engine());
  GemmKey key{M, N, K, a_rs, a_cs, b_rs, b_cs, ldc, c_bf16, accumulate, bias != nullptr};
  auto it = cache.find(key);
  if (it == cache.end()) {
    GemmPrim p;
    p.a = dnnl::memory::desc({M, K}, dt::bf16, dnnl::memory::dims{a_rs, a_cs});
    p.b = dnnl::memory::desc({K, N}, dt::bf16, dnnl::memory::dims{b_rs, b_cs});
    p.c = dnnl::memory::desc({M, N}, c_bf16 ? dt::bf16 : dt::f32, dnnl::memory::dims{ldc, 1});
    if (bias) p.bias = dnnl::memory::desc({1, N}, dt::bf16, dnnl::memory::dims{N, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    auto desc = bias ? dnnl::matmul::desc(p.a, p.b, p.bias, p.c) : dnnl::matmul::desc(p.a, p.b, p.c);
    dnnl::matmul::primitive_desc pd(desc, attr, dnnl_engine());
    p.prim = dnnl::matmul(pd);
    it = cache.emplace(key, std::move(p)).first;
  }
  GemmPrim& p = it->second;
  auto& eng = dnnl_engine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(p.a, eng, const_cast<bf16*>(A))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(p.b, eng, const_cast<bf16*>(B))},
      {DNNL_ARG_DST, dnnl::memory(p.c, eng, Cmat)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias, eng, const_cast<bf16*>(bias)));
  p.prim.execute(strm, args);
}

// Fixed chunk of the split dimension (depends on the shape only, never on the thread count): at
// most 8 chunks of at least 64 rows. Fewer, larger chunks keep oneDNN's per-call packing of B
// cheap (16 chunks of 128 rows measured 1.3-1.6x slower than 8 of 256 on the layer shapes).
size_t dnnl_chunk(int64_t m) {
  size_t c = static_cast<size_t>((m + 7) / 8);
  c = (c + 31) / 32 * 32;
  return std::max<size_t>(c, 64);
}

// C[M,N] (+)= A[M,K] @ B[K,N] in fixed chunks of rows, one oneDNN call (one thread) per chunk.
// (Splitting columns instead, to avoid repacking B per chunk, measured slower for every shape of
// the GPT layers, including the LM head.)
void dnnl_gemm_split(int64_t M, int64_t N, int64_t K, const bf16* A, int64_t a_rs, int64_t a_cs,
                     const bf16* B, int64_t b_rs, int64_t b_cs, void* Cmat, bool c_bf16,
                     int64_t ldc, bool accumulate, const bf16* bias) {
  const size_t c_elem = c_bf16 ? sizeof(bf16) : sizeof(float);
  char* Cb = static_cast<char*>(Cmat);
  parallel_chunks(static_cast<size_t>(M), dnnl_chunk(M), [&](size_t mb, size_t me) {
    omp_set_num_threads(1);
    dnnl_gemm(static_cast<int64_t>(me - mb), N, K, A + mb * a_rs, a_rs, a_cs, B, b_rs, b_cs,
              Cb + mb * ldc * c_elem, c_bf16, ldc, accumulate, bias);
  });
}

void dnnl_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias, int BT, int C,
                  int OC) {
  dnnl_gemm_split(BT, OC, C, inp, C, 1, weight, 1, C, out, true, OC, false, bias);
}

void dnnl_backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* inp,
                   const bf16* weight, int BT, int C, int OC) {
  // dinp (BT, C) += dout (BT, OC) @ weight (OC, C)
  if (dinp) dnnl_gemm_split(BT, C, OC, dout, OC, 1, weight, C, 1, dinp, true, C, true, nullptr);
  // dweight (OC, C) += dout^T (OC, BT) @ inp (BT, C)
  if (dweight) dnnl_gemm_split(OC, C, BT, dout, 1, OC, inp, C, 1, dweight, false, C, true, nullptr);
}
#endif  // KILN_HAVE_DNNL

}  // namespace

bool have_native_bf16_gemm() { return KILN_HAVE_DNNL != 0; }

template <typename T>
void matmul_forward(T* out, const Same<T>* inp, const Same<T>* weight, const Same<T>* bias, int B,
                    int T_, int C, int OC) {
  const int BT = B * T_;
  if constexpr (std::is_same_v<T, float>) {
    sgemm_forward(out, inp, weight, bias, BT, C, OC);
  } else {
#if KILN_HAVE_DNNL
    if constexpr (std::is_same_v<T, bf16>) {
      dnnl_forward(out, inp, weight, bias, BT, C, OC);
      return;
    }
#endif
    const size_t n_out = static_cast<size_t>(BT) * OC;
    const float* inp_f = widen_all(inp, static_cast<size_t>(BT) * C, kCallSlot);
    const float* w_f = widen_all(weight, static_cast<size_t>(OC) * C, kCallSlot + 1);
    const float* b_f = bias ? widen_all(bias, OC, kCallSlot + 2) : nullptr;
    float* out_f = scratch(n_out, kCallSlot + 3);
    sgemm_forward(out_f, inp_f, w_f, b_f, BT, C, OC);
    parallel_chunks(n_out, kElemChunk, [&](size_t b, size_t e) { narrow(out + b, out_f + b, e - b); });
  }
}

template <typename T>
void matmul_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                     const Same<T>* inp, const Same<T>* weight, int B, int T_, int C, int OC) {
  const int BT = B * T_;
  if (dbias) bias_backward(dbias, dout, BT, OC);
  if constexpr (std::is_same_v<T, float>) {
    sgemm_backward(dinp, dweight, dout, inp, weight, BT, C, OC);
  } else {
#if KILN_HAVE_DNNL
    if constexpr (std::is_same_v<T, bf16>) {
      dnnl_backward(dinp, dweight, dout, inp, weight, BT, C, OC);
      return;
    }
#endif
    const float* dout_f = widen_all(dout, static_cast<size_t>(BT) * OC, kCallSlot);
    if (dweight) {
      const float* inp_f = widen_all(inp, static_cast<size_t>(BT) * C, kCallSlot + 1);
      sgemm_backward(nullptr, dweight, dout_f, inp_f, nullptr, BT, C, OC);
    }
    if (dinp) {
      const size_t n_in = static_cast<size_t>(BT) * C;
      const float* w_f = widen_all(weight, static_cast<size_t>(OC) * C, kCallSlot + 2);
      float* dinp_f = scratch(n_in, kCallSlot + 3);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout_f, OC, w_f, C,
                  0.0f, dinp_f, C);
      parallel_chunks(n_in, kElemChunk, [&](size_t b, size_t e) { add_row(dinp + b, dinp_f + b, e - b); });
    }
  }
}

#define KILN_INSTANTIATE(T)                                                                      \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, int);        \
  template void matmul_backward<T>(T*, float*, float*, const T*, const T*, const T*, int, int,  \
                                   int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
