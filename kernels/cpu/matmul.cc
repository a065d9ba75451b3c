// matmul: out = inp @ weight^T + bias, and its backward.
//
// fp32 goes to OpenBLAS cblas_sgemm on the caller's buffers (no copies), with the output rows split
// into fixed chunks on the oneTBB threads and OpenBLAS single-threaded inside each: the chunking
// depends on the shape only, so the result does not depend on the thread count (OpenBLAS's own
// threading does change the bits: its edge kernels accumulate in another order).
// bf16 uses oneDNN's matmul (AMX / AVX512-BF16 kernels, fp32 accumulation) when the start-up probe
// (probe_onednn_bf16, via kernels/cpu_isa.h) found that oneDNN can run it on this CPU and path, in
// fixed row chunks with one oneDNN thread per chunk, again independent of the thread count.
// Otherwise (and for fp16) Kiln's own AVX2/FMA GEMM (gemm_lp.cc) runs on the bf16/fp16 operands:
// it widens them while packing its panels and rounds the result on its output tiles, so no
// widened copy of an operand and no separate rounding pass is made.
// No oneDNN exception leaves this file: the probe turns one into the fallback, and a failure after
// a successful probe stops the process via KILN_CHECK (file and line).
#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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

// The fixed partition of a GEMM's output C[M,N] (a function of the shape only, never of the thread
// count): the larger of M and N is cut into at most 8 chunks of at least 128 rows (columns). Each
// chunk repacks the operand it shares with the others (about 1/(2 * chunk) of its flops in memory
// traffic), so fewer, larger chunks keep that small; up to 8 keep 2-8 threads busy. Cutting the
// larger dimension repacks the smaller operand (e.g. the LM head splits the vocabulary).
struct GemmSplit {
  bool cols;     // split N (columns) instead of M (rows)
  size_t len;    // M or N
  size_t chunk;  // rows or columns per chunk
};
GemmSplit gemm_split(size_t m, size_t n) {
  // OpenBLAS runs single-threaded inside the chunks (also set by cpu::set_num_threads).
  static const bool single = (openblas_set_num_threads(1), true);
  (void)single;
  const bool cols = n > m;
  const size_t len = cols ? n : m;
  size_t c = (len + 7) / 8;
  c = (c + 15) / 16 * 16;
  return {cols, len, std::max<size_t>(c, 128)};
}

// Runs fn(r0, r1, c0, c1) for every block of the fixed partition of an M x N output, in parallel.
template <typename Fn>
void for_gemm_blocks(size_t M, size_t N, const Fn& fn) {
  const GemmSplit s = gemm_split(M, N);
  parallel_chunks(s.len, s.chunk, [&](size_t b, size_t e) {
    if (s.cols) fn(size_t{0}, M, b, e);
    else fn(b, e, size_t{0}, N);
  });
}

// One block [r0,r1) x [c0,c1) of C[M,N] = op(A)[M,K] @ op(B)[K,N] + beta C (row-major, the
// caller's strides) as a single-threaded OpenBLAS call. OpenBLAS's own threading is not used: it
// changes the bits with the thread count (its edge kernels accumulate differently).
void sgemm_block(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, size_t r0, size_t r1, size_t c0,
                 size_t c1, int K, const float* A, int lda, const float* B, int ldb, float beta,
                 float* C, int ldc) {
  const float* a = ta == CblasNoTrans ? A + r0 * lda : A + r0;
  const float* b = tb == CblasNoTrans ? B + c0 : B + c0 * ldb;
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(r1 - r0), static_cast<int>(c1 - c0), K, 1.0f,
              a, lda, b, ldb, beta, C + r0 * ldc + c0, ldc);
}

// out (BT, OC) = inp (BT, C) @ weight (OC, C)^T + bias in fp32, on the caller's buffers.
void sgemm_forward(float* out, const float* inp, const float* weight, const float* bias, int BT,
                   int C, int OC) {
  for_gemm_blocks(BT, OC, [&](size_t r0, size_t r1, size_t c0, size_t c1) {
    if (bias) {
      for (size_t r = r0; r < r1; ++r)
        std::memcpy(out + r * OC + c0, bias + c0, (c1 - c0) * sizeof(float));
    }
    sgemm_block(CblasNoTrans, CblasTrans, r0, r1, c0, c1, C, inp, C, weight, C, bias ? 1.0f : 0.0f,
                out, OC);
  });
}

// dinp (BT, C) += dout @ weight; dweight (OC, C) += dout^T @ inp, fp32, in fixed blocks.
void sgemm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                    const float* weight, int BT, int C, int OC) {
  if (dweight) {
    for_gemm_blocks(OC, C, [&](size_t r0, size_t r1, size_t c0, size_t c1) {
      sgemm_block(CblasTrans, CblasNoTrans, r0, r1, c0, c1, BT, dout, OC, inp, C, 1.0f, dweight,
                  C);
    });
  }
  if (!dinp) return;
  for_gemm_blocks(BT, C, [&](size_t r0, size_t r1, size_t c0, size_t c1) {
    sgemm_block(CblasNoTrans, CblasNoTrans, r0, r1, c0, c1, OC, dout, OC, weight, C, 1.0f, dinp, C);
  });
}

// bf16/fp16 without oneDNN: gemm_lp (packs and widens the operands itself, rounds on the tile).
// Its bits do not depend on how the output is split, so the split follows the thread count: one
// block on one thread (no operand packed twice), else the larger dimension in 2 blocks per thread.
template <typename Fn>
void for_lp_blocks(size_t M, size_t N, const Fn& fn) {
  const size_t parts = current_threads() == 1 ? 1 : 2 * static_cast<size_t>(current_threads());
  const bool cols = N > M;
  const size_t len = cols ? N : M, align = cols ? 16 : 48;
  const size_t chunk = std::max(align, ((len + parts - 1) / parts + align - 1) / align * align);
  parallel_chunks(len, chunk, [&](size_t b, size_t e) {
    if (cols) fn(size_t{0}, M, b, e);
    else fn(b, e, size_t{0}, N);
  });
}

template <typename T>
void lp_forward(T* out, const T* inp, const T* weight, const T* bias, int BT, int C, int OC) {
  float* b_f = nullptr;
  if (bias) {
    b_f = scratch(static_cast<size_t>(OC), kCallSlot);
    widen(b_f, bias, static_cast<size_t>(OC));
  }
  for_lp_blocks(BT, OC, [&](size_t r0, size_t r1, size_t c0, size_t c1) {
    // out block = inp rows (K contiguous) @ weight rows^T (B's columns contiguous in k)
    gemm_lp<T, T>(static_cast<int>(r1 - r0), static_cast<int>(c1 - c0), C, inp + r0 * C, C, 1,
                  weight + c0 * C, 1, C, out + r0 * OC + c0, OC, b_f ? b_f + c0 : nullptr,
                  false);
  });
}

template <typename T>
void lp_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, int BT,
                 int C, int OC) {
  if (dweight) {  // dweight (OC, C) += dout^T @ inp
    for_lp_blocks(OC, C, [&](size_t r0, size_t r1, size_t c0, size_t c1) {
      gemm_lp<T, float>(static_cast<int>(r1 - r0), static_cast<int>(c1 - c0), BT, dout + r0, 1,
                        OC, inp + c0, C, 1, dweight + r0 * C + c0, C, nullptr, true);
    });
  }
  if (dinp) {  // dinp (BT, C) += dout @ weight
    for_lp_blocks(BT, C, [&](size_t r0, size_t r1, size_t c0, size_t c1) {
      gemm_lp<T, T>(static_cast<int>(r1 - r0), static_cast<int>(c1 - c0), OC, dout + r0 * OC, OC,
                    1, weight + c0, C, 1, dinp + r0 * C + c0, C, nullptr, true);
    });
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
  GemmKey key{M, N, K, a_rs, a_cs, b_rs, b_cs, ldc, c_bf16, accumulate, bias != nullptr};
  try {
    thread_local dnnl::stream strm(dnnl_engine());
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
  } catch (const dnnl::error& e) {
    KILN_CHECK(false, "oneDNN bf16 matmul " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                          std::to_string(K) + " failed after the start-up probe passed: " + e.what());
  }
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
dnnl::cpu_isa dnnl_max_isa(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return dnnl::cpu_isa::avx2;
    case Isa::kAvx512: return dnnl::cpu_isa::avx512_core_bf16;
    case Isa::kAmx: break;
  }
  return dnnl::cpu_isa::avx512_core_amx;
}
#endif  // KILN_HAVE_DNNL

bool use_onednn() { return cpu_runtime().bf16_gemm == Bf16Gemm::kOneDnn; }

}  // namespace

namespace detail {
bool probe_onednn_bf16([[maybe_unused]] Isa isa, std::string* why) {
#if KILN_HAVE_DNNL
  static std::once_flag capped;
  std::call_once(capped, [&] { dnnl::set_max_cpu_isa(dnnl_max_isa(isa)); });
  try {
    using dt = dnnl::memory::data_type;
    const int64_t n = 64;
    dnnl::memory::desc a({n, n}, dt::bf16, dnnl::memory::dims{n, 1});
    dnnl::memory::desc b({n, n}, dt::bf16, dnnl::memory::dims{1, n});
    dnnl::memory::desc bias({1, n}, dt::bf16, dnnl::memory::dims{n, 1});
    dnnl::memory::desc c16({n, n}, dt::bf16, dnnl::memory::dims{n, 1});
    dnnl::memory::desc c32({n, n}, dt::f32, dnnl::memory::dims{n, 1});
    dnnl::primitive_attr sum;
    dnnl::post_ops po;
    po.append_sum(1.0f);
    sum.set_post_ops(po);
    dnnl::matmul::primitive_desc fwd(dnnl::matmul::desc(a, b, bias, c16), dnnl_engine());
    dnnl::matmul::primitive_desc acc(dnnl::matmul::desc(a, b, c32), sum, dnnl_engine());
    for (const char* impl : {fwd.impl_info_str(), acc.impl_info_str()}) {
      if (std::string_view(impl).substr(0, 3) == "ref") {
        *why = std::string("oneDNN has only its slow reference bf16 matmul here: ") + impl;
        return false;
      }
    }
    *why = std::string("oneDNN ") + fwd.impl_info_str();
    return true;
  } catch (const dnnl::error& e) {
    *why = std::string("oneDNN cannot run bf16 matmul on this CPU/path: ") + e.what();
    return false;
  }
#else
  *why = "built without oneDNN";
  return false;
#endif
}
}  // namespace detail

bool have_native_bf16_gemm() { return use_onednn(); }

template <typename T>
void matmul_forward(T* out, const Same<T>* inp, const Same<T>* weight, const Same<T>* bias, int B,
                    int T_, int C, int OC) {
  const int BT = B * T_;
#if KILN_HAVE_DNNL
  if constexpr (std::is_same_v<T, bf16>) {
    if (use_onednn()) {
      dnnl_forward(out, inp, weight, bias, BT, C, OC);
      return;
    }
  }
#endif
  if constexpr (std::is_same_v<T, float>) sgemm_forward(out, inp, weight, bias, BT, C, OC);
  else lp_forward(out, inp, weight, bias, BT, C, OC);
}

template <typename T>
void matmul_backward(Same<T>* dinp, float* dweight, float* dbias, const T* dout,
                     const Same<T>* inp, const Same<T>* weight, int B, int T_, int C, int OC) {
  const int BT = B * T_;
  if (dbias) bias_backward(dbias, dout, BT, OC);
#if KILN_HAVE_DNNL
  if constexpr (std::is_same_v<T, bf16>) {
    if (use_onednn()) {
      dnnl_backward(dinp, dweight, dout, inp, weight, BT, C, OC);
      return;
    }
  }
#endif
  if constexpr (std::is_same_v<T, float>) sgemm_backward(dinp, dweight, dout, inp, weight, BT, C, OC);
  else lp_backward(dinp, dweight, dout, inp, weight, BT, C, OC);
}

// GEMM + GELU as the separate operators (CpuBackend::kFusedGemmGelu is false).
template <typename T>
void matmul_gelu_forward(T* out, T* pre, const Same<T>* inp, const Same<T>* weight,
                         const Same<T>* bias, int B, int T_, int C, int OC) {
  matmul_forward(pre, inp, weight, bias, B, T_, C, OC);
  gelu_forward(out, pre, static_cast<size_t>(B) * T_ * OC);
}

template <typename T>
void matmul_dgelu_backward(Same<T>* dpre, float* dweight, float* dbias, const T* dout,
                           const Same<T>* inp, const Same<T>* weight, const Same<T>* pre, int B,
                           int T_, int C, int OC) {
  const size_t n = static_cast<size_t>(B) * T_ * C;
  thread_local std::vector<T> dinp;  // grow-only: no allocation in steady state
  if (dinp.size() < n) dinp.resize(n);
  std::fill_n(dinp.data(), n, T{});
  matmul_backward(dinp.data(), dweight, dbias, dout, inp, weight, B, T_, C, OC);
  std::fill_n(dpre, n, T{});
  gelu_backward(dpre, pre, dinp.data(), n);
}

#define KILN_INSTANTIATE(T)                                                                       \
  template void matmul_gelu_forward<T>(T*, T*, const T*, const T*, const T*, int, int, int, int); \
  template void matmul_dgelu_backward<T>(T*, float*, float*, const T*, const T*, const T*,        \
                                         const T*, int, int, int, int);                           \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int, int, int, int);          \
  template void matmul_backward<T>(T*, float*, float*, const T*, const T*, const T*, int, int,    \
                                   int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cpu
