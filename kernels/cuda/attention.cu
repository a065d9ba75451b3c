// Causal multi-head attention on the GPU, tiled with an online softmax (FlashAttention-1/2
// structure on CUDA cores): a block owns 16 query rows (forward, dQ) or 16 keys (dK/dV) of one
// (batch, head) and streams the other side through shared memory in tiles of 32 rows; within a
// warp each lane owns one key (scores) and one slice of the head dimension (outputs). Memory is
// O(T) (the (T, T) scores are never stored; backward recomputes them from the saved logsumexp).
// No atomics: dQ and dK/dV are separate kernels that each own their outputs, every sum runs in a
// fixed order, so results repeat bit for bit. Head size up to 256.
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kWarps = 4;                  // warps per block
constexpr int kRowsPerWarp = 4;            // rows (queries or keys) a warp owns
constexpr int kOwn = kWarps * kRowsPerWarp;  // rows a block owns: 16
constexpr int kTile = 32;                  // streamed rows per tile: one per lane
constexpr unsigned kFull = 0xffffffffu;

template <typename T>
__device__ __forceinline__ float ld_f(const T* p) {
  return to_float(*p);
}

// Shared-memory row stride: one float of padding keeps lanes reading different rows on
// different banks.
__host__ __device__ inline int pad(int hs) { return hs + 1; }

template <typename T>
__device__ void load_rows(float* dst, const T* src, size_t src_stride, int first, int count,
                          int limit, int hs) {
  const int ld = pad(hs);
  for (int idx = threadIdx.x; idx < count * hs; idx += blockDim.x) {
    const int r = idx / hs, d = idx - r * hs;
    const int row = first + r;
    dst[r * ld + d] = row < limit ? ld_f(src + size_t(row) * src_stride + d) : 0.0f;
  }
}

__device__ inline float dot_smem(const float* a, const float* b, int hs) {
  float acc = 0.0f;
  for (int d = 0; d < hs; ++d) acc += a[d] * b[d];
  return acc;
}

// Forward: out_i = sum_j softmax_j(q_i k_j / sqrt(hs)) v_j over j <= i; lse_i = log sum exp.
template <typename T, int KH>
__global__ void __launch_bounds__(kWarps * 32)
attention_forward_tiled(T* out, float* lse, const T* qkv, int T_, int C, int NH) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = pad(hs);
  float* Ks = smem;
  float* Vs = Ks + kTile * ld;
  float* Qs = Vs + kTile * ld;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int r0 = blockIdx.x * kOwn;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t C3 = size_t(3) * C;
  const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
  const float scale = 1.0f / sqrtf(float(hs));  // correctly rounded, as the CPU and the mma path
  load_rows(Qs, base, C3, r0, kOwn, T_, hs);
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][KH];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int k = 0; k < KH; ++k) o[rr][k] = 0.0f;
  }
  const int last = min(T_ - 1, r0 + kOwn - 1);
  for (int t0 = 0; t0 <= last; t0 += kTile) {
    __syncthreads();
    load_rows(Ks, base + C, C3, t0, kTile, T_, hs);
    load_rows(Vs, base + 2 * C, C3, t0, kTile, T_, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, i = r0 + r;
      if (i >= T_ || t0 > i) continue;  // warp-uniform
      const int key = t0 + lane;
      const bool valid = key <= i;
      const float s = valid ? dot_smem(Qs + r * ld, Ks + lane * ld, hs) * scale : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(s));  // finite: key t0 <= i is valid
      const float corr = expf(m[rr] - m_new);
      const float p = valid ? expf(s - m_new) : 0.0f;
      l[rr] = l[rr] * corr + warp_sum(p);
      m[rr] = m_new;
#pragma unroll
      for (int k = 0; k < KH; ++k) o[rr][k] *= corr;
      for (int j = 0; j < kTile; ++j) {
        const float pj = __shfl_sync(kFull, p, j);
#pragma unroll
        for (int k = 0; k < KH; ++k) {
          const int d = lane + 32 * k;
          if (d < hs) o[rr][k] += pj * Vs[j * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = r0 + warp * kRowsPerWarp + rr;
    if (i >= T_) continue;
    T* dst = out + (size_t(b) * T_ + i) * C + size_t(h) * hs;
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int k = 0; k < KH; ++k) {
      const int d = lane + 32 * k;
      if (d < hs) st(dst + d, o[rr][k] * inv);
    }
    if (lane == 0) lse[(size_t(b) * NH + h) * T_ + i] = m[rr] + logf(l[rr]);
  }
}

// D[row] = rowsum(dO * O), one warp per row.
template <typename T>
__global__ void attention_d_kernel(float* D, const T* dout, const T* out, int B, int T_, int C,
                                   int NH) {
  const int hs = C / NH;
  const size_t rows = size_t(B) * NH * T_;
  const size_t row = size_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int i = int(row % T_), h = int((row / T_) % NH), b = int(row / (size_t(T_) * NH));
  const size_t off = (size_t(b) * T_ + i) * C + size_t(h) * hs;
  float acc = 0.0f;
  for (int d = threadIdx.x & 31; d < hs; d += 32) acc += ld_f(dout + off + d) * ld_f(out + off + d);
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) D[row] = acc;
}

// dq_i += scale * sum_{j<=i} dS_ij k_j,  dS_ij = P_ij (dO_i . v_j - D_i),  P_ij = exp(s_ij - lse_i)
template <typename T, int KH>
__global__ void __launch_bounds__(kWarps * 32)
attention_dq_tiled(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_,
                   int C, int NH) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = pad(hs);
  float* Ks = smem;
  float* Vs = Ks + kTile * ld;
  float* Qs = Vs + kTile * ld;
  float* dOs = Qs + kOwn * ld;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int r0 = blockIdx.x * kOwn;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t C3 = size_t(3) * C;
  const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
  const size_t stat0 = (size_t(b) * NH + h) * T_;
  const float scale = 1.0f / sqrtf(float(hs));  // correctly rounded, as the CPU and the mma path
  load_rows(Qs, base, C3, r0, kOwn, T_, hs);
  load_rows(dOs, dout + size_t(b) * T_ * C + size_t(h) * hs, size_t(C), r0, kOwn, T_, hs);
  float acc[kRowsPerWarp][KH], row_lse[kRowsPerWarp], row_d[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = r0 + warp * kRowsPerWarp + rr;
    row_lse[rr] = i < T_ ? lse[stat0 + i] : 0.0f;
    row_d[rr] = i < T_ ? D[stat0 + i] : 0.0f;
#pragma unroll
    for (int k = 0; k < KH; ++k) acc[rr][k] = 0.0f;
  }
  const int last = min(T_ - 1, r0 + kOwn - 1);
  for (int t0 = 0; t0 <= last; t0 += kTile) {
    __syncthreads();
    load_rows(Ks, base + C, C3, t0, kTile, T_, hs);
    load_rows(Vs, base + 2 * C, C3, t0, kTile, T_, hs);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, i = r0 + r;
      if (i >= T_ || t0 > i) continue;
      const bool valid = t0 + lane <= i;
      float ds = 0.0f;
      if (valid) {
        const float p = expf(dot_smem(Qs + r * ld, Ks + lane * ld, hs) * scale - row_lse[rr]);
        ds = p * (dot_smem(dOs + r * ld, Vs + lane * ld, hs) - row_d[rr]);
      }
      for (int j = 0; j < kTile; ++j) {
        const float dsj = __shfl_sync(kFull, ds, j);
#pragma unroll
        for (int k = 0; k < KH; ++k) {
          const int d = lane + 32 * k;
          if (d < hs) acc[rr][k] += dsj * Ks[j * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = r0 + warp * kRowsPerWarp + rr;
    if (i >= T_) continue;
    T* dq = dqkv + (size_t(b) * T_ + i) * C3 + size_t(h) * hs;
#pragma unroll
    for (int k = 0; k < KH; ++k) {
      const int d = lane + 32 * k;
      if (d < hs) st(dq + d, ld_f(dq + d) + acc[rr][k] * scale);
    }
  }
}

// dk_j += scale * sum_{i>=j} dS_ij q_i ;  dv_j += sum_{i>=j} P_ij dO_i
template <typename T, int KH>
__global__ void __launch_bounds__(kWarps * 32)
attention_dkv_tiled(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_,
                    int C, int NH) {
  extern __shared__ float smem[];
  const int hs = C / NH, ld = pad(hs);
  float* Qs = smem;
  float* dOs = Qs + kTile * ld;
  float* Ks = dOs + kTile * ld;
  float* Vs = Ks + kOwn * ld;
  float* lse_s = Vs + kOwn * ld;
  float* d_s = lse_s + kTile;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int j0 = blockIdx.x * kOwn;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const size_t C3 = size_t(3) * C;
  const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
  const T* dbase = dout + size_t(b) * T_ * C + size_t(h) * hs;
  const size_t stat0 = (size_t(b) * NH + h) * T_;
  const float scale = 1.0f / sqrtf(float(hs));  // correctly rounded, as the CPU and the mma path
  load_rows(Ks, base + C, C3, j0, kOwn, T_, hs);
  load_rows(Vs, base + 2 * C, C3, j0, kOwn, T_, hs);
  float dk[kRowsPerWarp][KH], dv[kRowsPerWarp][KH];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int k = 0; k < KH; ++k) dk[rr][k] = dv[rr][k] = 0.0f;
  }
  for (int t0 = j0; t0 < T_; t0 += kTile) {
    __syncthreads();
    load_rows(Qs, base, C3, t0, kTile, T_, hs);
    load_rows(dOs, dbase, size_t(C), t0, kTile, T_, hs);
    if (threadIdx.x < kTile) {
      const int i = t0 + threadIdx.x;
      lse_s[threadIdx.x] = i < T_ ? lse[stat0 + i] : 0.0f;
      d_s[threadIdx.x] = i < T_ ? D[stat0 + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, j = j0 + r;
      if (j >= T_) continue;
      const int i = t0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i >= j && i < T_) {
        p = expf(dot_smem(Qs + lane * ld, Ks + r * ld, hs) * scale - lse_s[lane]);
        ds = p * (dot_smem(dOs + lane * ld, Vs + r * ld, hs) - d_s[lane]);
      }
      for (int x = 0; x < kTile; ++x) {
        const float px = __shfl_sync(kFull, p, x);
        const float dsx = __shfl_sync(kFull, ds, x);
#pragma unroll
        for (int k = 0; k < KH; ++k) {
          const int d = lane + 32 * k;
          if (d < hs) {
            dv[rr][k] += px * dOs[x * ld + d];
            dk[rr][k] += dsx * Qs[x * ld + d];
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int j = j0 + warp * kRowsPerWarp + rr;
    if (j >= T_) continue;
    T* dst = dqkv + (size_t(b) * T_ + j) * C3 + size_t(h) * hs;
#pragma unroll
    for (int k = 0; k < KH; ++k) {
      const int d = lane + 32 * k;
      if (d < hs) {
        st(dst + C + d, ld_f(dst + C + d) + dk[rr][k] * scale);
        st(dst + 2 * C + d, ld_f(dst + 2 * C + d) + dv[rr][k]);
      }
    }
  }
}

// Launches kernel<T, KH> with KH = head-dimension slices per lane (hs <= 32 KH), raising the
// dynamic shared-memory limit when the tiles need more than the default 48 KiB.
template <typename T, int KH>
struct FwdK {
  static void* fn() { return reinterpret_cast<void*>(&attention_forward_tiled<T, KH>); }
};
template <typename T, int KH>
struct DqK {
  static void* fn() { return reinterpret_cast<void*>(&attention_dq_tiled<T, KH>); }
};
template <typename T, int KH>
struct DkvK {
  static void* fn() { return reinterpret_cast<void*>(&attention_dkv_tiled<T, KH>); }
};

template <template <typename, int> class K, typename T, int KH>
void launch_one(dim3 grid, size_t smem, void** args) {
  const void* fn = K<T, KH>::fn();
  if (smem > 48 * 1024) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  KILN_CUDA_CHECK(cudaLaunchKernel(fn, grid, dim3(kWarps * 32), args, smem, stream()));
}

template <template <typename, int> class K, typename T>
void launch(int hs, dim3 grid, size_t smem, void** args) {
  if (hs <= 32) launch_one<K, T, 1>(grid, smem, args);
  else if (hs <= 64) launch_one<K, T, 2>(grid, smem, args);
  else if (hs <= 128) launch_one<K, T, 4>(grid, smem, args);
  else launch_one<K, T, 8>(grid, smem, args);
}

void check_shape(const char* op, int C, int NH) {
  KILN_CHECK(NH > 0 && C % NH == 0, std::string(op) + ": C must be a multiple of NH");
  KILN_CHECK(C / NH <= 256, std::string(op) + ": head size above 256");
}
}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const Same<T>* qkv, int B, int T_, int C, int NH) {
  KILN_CUDA_TIMED(kAttention);
  check_shape("attention_forward", C, NH);
  if (size_t(B) * NH * T_ == 0) return;
  if constexpr (!std::is_same_v<T, float>) {  // tensor cores: bf16 / fp16 only
    if (use_attention_mma<T>(qkv, qkv, C, NH)) {
      attention_forward_mma<T>(out, lse, qkv, B, T_, C, NH);
      return;
    }
  }
  const int hs = C / NH;
  const dim3 grid(unsigned((T_ + kOwn - 1) / kOwn), unsigned(B * NH));
  const size_t smem = sizeof(float) * size_t(2 * kTile + kOwn) * pad(hs);
  void* args[] = {&out, &lse, const_cast<T**>(&qkv), &T_, &C, &NH};
  launch<FwdK, T>(hs, grid, smem, args);
}

template <typename T>
void attention_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                        const float* lse, int B, int T_, int C, int NH) {
  KILN_CUDA_TIMED(kAttention);
  check_shape("attention_backward", C, NH);
  const size_t rows = size_t(B) * NH * T_;
  if (rows == 0) return;
  const int hs = C / NH;
  float* D = static_cast<float*>(workspace(sizeof(float) * rows, 0));
  attention_d_kernel<<<unsigned((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream()>>>(
      D, dout, out, B, T_, C, NH);
  KILN_CUDA_LAUNCHED();
  if constexpr (!std::is_same_v<T, float>) {
    if (use_attention_mma<T>(qkv, dout, C, NH)) {
      attention_backward_mma<T>(dqkv, dout, qkv, lse, D, B, T_, C, NH);
      return;
    }
  }
  const dim3 grid(unsigned((T_ + kOwn - 1) / kOwn), unsigned(B * NH));
  const float* Dc = D;
  void* args[] = {&dqkv, const_cast<T**>(&dout), const_cast<T**>(&qkv), const_cast<float**>(&lse),
                  const_cast<float**>(&Dc), &T_, &C, &NH};
  launch<DqK, T>(hs, grid, sizeof(float) * size_t(2 * kTile + 2 * kOwn) * pad(hs), args);
  launch<DkvK, T>(hs, grid,
                  sizeof(float) * (size_t(2 * kTile + 2 * kOwn) * pad(hs) + 2 * kTile), args);
}

#define KILN_INSTANTIATE(T)                                                                     \
  template void attention_forward<T>(T*, float*, const T*, int, int, int, int);                \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const float*, int, int, \
                                      int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
