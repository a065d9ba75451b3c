// Causal attention on tensor cores (FlashAttention-2 structure): bf16 / fp16 inputs, head size 64
// or 128, sm_80 or newer (mma.sync.m16n8k16, fp32 accumulation). Same contract as
// attention_forward / attention_backward (kernels/ops.h); attention.cu calls these when the
// tensor-core kernel is selected (ops.h set_attention_kernel) and the shape is eligible.
//
// Forward: a block owns 64 query rows of one (batch, head), 16 per warp, and streams 64-key
// tiles of K and V through shared memory up to the diagonal (later tiles are skipped: causal).
// S = Q K^T on tensor cores, online softmax in fp32 registers, P rounded to the input type (as
// FlashAttention does) for O += P V. Backward from the saved log-sum-exp and D = rowsum(dO o O)
// (computed by attention.cu): one kernel per 64 queries for dQ (key tiles up to the diagonal),
// one per 64 keys for dK and dV (query tiles from the diagonal on). No atomics: every output has
// one owner and every sum runs in a fixed order, so results repeat bit for bit.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, per lane, g = lane / 4, c = lane % 4):
//   A 16x16 row-major: a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B 16x8  (k x n):   b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g)
//   C 16x8  fp32:      c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// Two adjacent C tiles (keys 16j..16j+15) are exactly the A fragment of k-step j, so P and dS go
// from accumulators to the next product without shared memory. Pairs along a row are one 32-bit
// load; pairs down a column (V, K, Q, dO as B of a k = key/query product) are two 16-bit loads.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kOwnRows = 16 * kMmaWarps;  // rows a block owns (queries, or keys for dK/dV): 64
constexpr int kFwdTile = 64;              // keys per streamed tile, forward
constexpr int kBwdTile = 32;              // streamed rows per tile, backward (fewer registers)

// Shared-memory row stride in elements: 8 elements of padding make the 8 rows x 4 words a warp
// reads for one fragment fall on 32 different banks.
template <int HS>
constexpr int kStride = HS + 8;

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t(from_float<T>(lo).bits) | (uint32_t(from_float<T>(hi).bits) << 16);
}

// Two consecutive elements at p (4-byte aligned) as one register.
__device__ __forceinline__ uint32_t ld2(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
// Elements p[0] and p[stride] as one register (p[0] in the low half).
__device__ __forceinline__ uint32_t ld2_col(const uint16_t* p, int stride) {
  return uint32_t(p[0]) | (uint32_t(p[stride]) << 16);
}

// d (16x8 fp32) += a (16x16) b (16x8).
template <typename T>
__device__ __forceinline__ void mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // never launched below sm_80 (attention_mma_eligible)
#endif
}

// Copies rows [first, first + count) of one head (HS elements at src + row * row_stride) into
// smem (stride kStride<HS>), zero-filling rows at or past `limit`. 16-byte accesses: the caller
// checked that every row start is 16-byte aligned.
template <int HS>
__device__ void load_tile(uint16_t* dst, const uint16_t* src, size_t row_stride, int first,
                          int count, int limit) {
  constexpr int kVec = 8;  // elements per 16 bytes
  for (int idx = threadIdx.x; idx < count * (HS / kVec); idx += kMmaThreads) {
    const int r = idx / (HS / kVec), v = idx % (HS / kVec);
    uint4 val = make_uint4(0, 0, 0, 0);
    if (first + r < limit) {
      val = *reinterpret_cast<const uint4*>(src + size_t(first + r) * row_stride + v * kVec);
    }
    *reinterpret_cast<uint4*>(dst + r * kStride<HS> + v * kVec) = val;
  }
}

// A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a smem tile.
template <int HS>
__device__ __forceinline__ void frag_a(uint32_t a[4], const uint16_t* tile, int r0, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint16_t* p = tile + (r0 + g) * kStride<HS> + k0 + 2 * c;
  a[0] = ld2(p);
  a[1] = ld2(p + 8 * kStride<HS>);
  a[2] = ld2(p + 8);
  a[3] = ld2(p + 8 * kStride<HS> + 8);
}

// B fragment (k x n = 16 x 8) whose column n is smem row n0 + n, k the columns [k0, k0 + 16):
// the transposed tile, as in S = Q K^T (B = K^T).
template <int HS>
__device__ __forceinline__ void frag_b_rows(uint32_t& b0, uint32_t& b1, const uint16_t* tile,
                                           int n0, int k0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint16_t* p = tile + (n0 + g) * kStride<HS> + k0 + 2 * c;
  b0 = ld2(p);
  b1 = ld2(p + 8);
}

// B fragment whose k are smem rows [k0, k0 + 16) and n the columns [n0, n0 + 8): the tile as is,
// as in O = P V (B = V).
template <int HS>
__device__ __forceinline__ void frag_b_cols(uint32_t& b0, uint32_t& b1, const uint16_t* tile,
                                            int k0, int n0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint16_t* p = tile + (k0 + 2 * c) * kStride<HS> + n0 + g;
  b0 = ld2_col(p, kStride<HS>);
  b1 = ld2_col(p + 8 * kStride<HS>, kStride<HS>);
}

// The A fragment of k-step j from accumulator tiles acc[2j], acc[2j+1] (16 x 8 each).
template <typename T>
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// out[d] += A . B over the head-dim columns d: A the k-step j fragment of accumulator tiles
// s[2j], s[2j+1] (rounded to T), B rows [16j, 16j + 16) of `tile` - P.V in forward, dS.K, P^T.dO
// and dS^T.Q in backward.
template <typename T, int HS>
__device__ __forceinline__ void mma_acc_by_tile(float (*out)[4], const float (*s)[4], int j,
                                                const uint16_t* tile) {
  uint32_t a[4];
  acc_to_a<T>(a, s[2 * j], s[2 * j + 1]);
#pragma unroll
  for (int d = 0; d < HS / 8; ++d) {
    uint32_t b0, b1;
    frag_b_cols<HS>(b0, b1, tile, j * 16, d * 8);
    mma<T>(out[d], a, b0, b1);
  }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <typename T>
__device__ __forceinline__ const uint16_t* bits(const T* p) {
  return reinterpret_cast<const uint16_t*>(p);
}

// ---- forward ------------------------------------------------------------------------------------
template <typename T, int HS>
__global__ void __launch_bounds__(kMmaThreads)
fwd_mma_kernel(T* out, float* lse, const T* qkv, int T_, int C, int NH) {
  extern __shared__ __align__(16) uint16_t smem_fwd[];
  uint16_t* Qs = smem_fwd;
  uint16_t* Ks = Qs + kOwnRows * kStride<HS>;
  uint16_t* Vs = Ks + kFwdTile * kStride<HS>;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = blockIdx.x * kOwnRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t C3 = size_t(3) * C;
  const uint16_t* base = bits(qkv) + size_t(b) * T_ * C3 + size_t(h) * HS;
  const float scale = 1.0f / sqrtf(float(HS));

  load_tile<HS>(Qs, base, C3, q0, kOwnRows, T_);
  __syncthreads();
  uint32_t qa[HS / 16][4];
#pragma unroll
  for (int k = 0; k < HS / 16; ++k) frag_a<HS>(qa[k], Qs, warp * 16, k * 16);

  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8 of the warp
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int last_key = min(T_, q0 + kOwnRows) - 1;
  for (int k0 = 0; k0 <= last_key; k0 += kFwdTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<HS>(Ks, base + C, C3, k0, kFwdTile, T_);
    load_tile<HS>(Vs, base + 2 * C, C3, k0, kFwdTile, T_);
    __syncthreads();
    float s[kFwdTile / 8][4] = {};
#pragma unroll
    for (int n = 0; n < kFwdTile / 8; ++n) {
#pragma unroll
      for (int k = 0; k < HS / 16; ++k) {
        uint32_t b0, b1;
        frag_b_rows<HS>(b0, b1, Ks, n * 8, k * 16);
        mma<T>(s[n], qa[k], b0, b1);
      }
    }
    // Scale, mask (key > query, key past the end), new row maxima.
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < kFwdTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, key = k0 + n * 8 + 2 * c + (e & 1);
        const float v = (key <= row[r] && key < T_) ? s[n][e] * scale : -INFINITY;
        s[n][e] = v;
        mx[r] = fmaxf(mx[r], v);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      // A row with no valid key yet keeps max -inf: exp(-inf - 0) = 0 everywhere below.
      const float ref = mx[r] == -INFINITY ? 0.0f : mx[r];
      alpha[r] = expf(m[r] - ref);  // 0 on the first tile (m = -inf)
      m[r] = mx[r];
      l[r] *= alpha[r];
#pragma unroll
      for (int n = 0; n < kFwdTile / 8; ++n) {
        s[n][2 * r] = expf(s[n][2 * r] - ref);
        s[n][2 * r + 1] = expf(s[n][2 * r + 1] - ref);
        l[r] += s[n][2 * r] + s[n][2 * r + 1];  // this lane's share; summed over the quad at the end
      }
    }
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
      o[d][0] *= alpha[0];
      o[d][1] *= alpha[0];
      o[d][2] *= alpha[1];
      o[d][3] *= alpha[1];
    }
    // O += P V, P rounded to T.
#pragma unroll
    for (int j = 0; j < kFwdTile / 16; ++j) mma_acc_by_tile<T, HS>(o, s, j, Vs);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(l[r]);
    if (row[r] >= T_) continue;
    const float inv = 1.0f / total;
    T* dst = out + (size_t(b) * T_ + row[r]) * C + size_t(h) * HS + 2 * c;
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
      dst[d * 8] = from_float<T>(o[d][2 * r] * inv);
      dst[d * 8 + 1] = from_float<T>(o[d][2 * r + 1] * inv);
    }
    if (c == 0) lse[(size_t(b) * NH + h) * T_ + row[r]] = m[r] + logf(total);
  }
}

// ---- backward: dQ -------------------------------------------------------------------------------
// dq_i += scale * sum_{j<=i} dS_ij k_j, dS_ij = P_ij (dO_i . v_j - D_i), P_ij = exp(s_ij - lse_i)
template <typename T, int HS>
__global__ void __launch_bounds__(kMmaThreads)
dq_mma_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_,
                 int C, int NH) {
  extern __shared__ __align__(16) uint16_t smem_dq[];
  uint16_t* Qs = smem_dq;
  uint16_t* dOs = Qs + kOwnRows * kStride<HS>;
  uint16_t* Ks = dOs + kOwnRows * kStride<HS>;
  uint16_t* Vs = Ks + kBwdTile * kStride<HS>;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = blockIdx.x * kOwnRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t C3 = size_t(3) * C;
  const uint16_t* base = bits(qkv) + size_t(b) * T_ * C3 + size_t(h) * HS;
  const float scale = 1.0f / sqrtf(float(HS));
  const size_t stat0 = (size_t(b) * NH + h) * T_;

  load_tile<HS>(Qs, base, C3, q0, kOwnRows, T_);
  load_tile<HS>(dOs, bits(dout) + size_t(b) * T_ * C + size_t(h) * HS, C, q0, kOwnRows, T_);
  __syncthreads();
  uint32_t qa[HS / 16][4], da[HS / 16][4];
#pragma unroll
  for (int k = 0; k < HS / 16; ++k) {
    frag_a<HS>(qa[k], Qs, warp * 16, k * 16);
    frag_a<HS>(da[k], dOs, warp * 16, k * 16);
  }
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float row_lse[2], row_d[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_lse[r] = row[r] < T_ ? lse[stat0 + row[r]] : 0.0f;
    row_d[r] = row[r] < T_ ? D[stat0 + row[r]] : 0.0f;
  }
  float dq[HS / 8][4] = {};
  const int last_key = min(T_, q0 + kOwnRows) - 1;
  for (int k0 = 0; k0 <= last_key; k0 += kBwdTile) {
    __syncthreads();
    load_tile<HS>(Ks, base + C, C3, k0, kBwdTile, T_);
    load_tile<HS>(Vs, base + 2 * C, C3, k0, kBwdTile, T_);
    __syncthreads();
    float s[kBwdTile / 8][4] = {}, dp[kBwdTile / 8][4] = {};
#pragma unroll
    for (int n = 0; n < kBwdTile / 8; ++n) {
#pragma unroll
      for (int k = 0; k < HS / 16; ++k) {
        uint32_t b0, b1;
        frag_b_rows<HS>(b0, b1, Ks, n * 8, k * 16);
        mma<T>(s[n], qa[k], b0, b1);
        frag_b_rows<HS>(b0, b1, Vs, n * 8, k * 16);
        mma<T>(dp[n], da[k], b0, b1);
      }
    }
#pragma unroll
    for (int n = 0; n < kBwdTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, key = k0 + n * 8 + 2 * c + (e & 1);
        const bool valid = key <= row[r] && key < T_ && row[r] < T_;
        const float p = valid ? expf(s[n][e] * scale - row_lse[r]) : 0.0f;
        s[n][e] = p * (dp[n][e] - row_d[r]);  // dS
      }
    }
#pragma unroll
    for (int j = 0; j < kBwdTile / 16; ++j) mma_acc_by_tile<T, HS>(dq, s, j, Ks);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= T_) continue;
    T* dst = dqkv + (size_t(b) * T_ + row[r]) * C3 + size_t(h) * HS + 2 * c;
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
      dst[d * 8] = from_float<T>(to_float(dst[d * 8]) + scale * dq[d][2 * r]);
      dst[d * 8 + 1] = from_float<T>(to_float(dst[d * 8 + 1]) + scale * dq[d][2 * r + 1]);
    }
  }
}

// ---- backward: dK, dV ---------------------------------------------------------------------------
// dv_j += sum_{i>=j} P_ij dO_i;  dk_j += scale * sum_{i>=j} dS_ij q_i. Computed transposed: the
// warp's 16 keys are the rows, the streamed queries the columns.
template <typename T, int HS>
__global__ void __launch_bounds__(kMmaThreads)
dkv_mma_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D, int T_,
                  int C, int NH) {
  extern __shared__ __align__(16) uint16_t smem_dkv[];
  uint16_t* Ks = smem_dkv;
  uint16_t* Vs = Ks + kOwnRows * kStride<HS>;
  uint16_t* Qs = Vs + kOwnRows * kStride<HS>;
  uint16_t* dOs = Qs + kBwdTile * kStride<HS>;
  float* lse_s = reinterpret_cast<float*>(dOs + kBwdTile * kStride<HS>);
  float* d_s = lse_s + kBwdTile;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int key0 = blockIdx.x * kOwnRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t C3 = size_t(3) * C;
  const uint16_t* base = bits(qkv) + size_t(b) * T_ * C3 + size_t(h) * HS;
  const uint16_t* dbase = bits(dout) + size_t(b) * T_ * C + size_t(h) * HS;
  const float scale = 1.0f / sqrtf(float(HS));
  const size_t stat0 = (size_t(b) * NH + h) * T_;

  load_tile<HS>(Ks, base + C, C3, key0, kOwnRows, T_);
  load_tile<HS>(Vs, base + 2 * C, C3, key0, kOwnRows, T_);
  // K and V stay in shared memory (their fragments are read per use: registers go to dK, dV).
  const int key[2] = {key0 + warp * 16 + g, key0 + warp * 16 + g + 8};
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  for (int i0 = key0; i0 < T_; i0 += kBwdTile) {  // key0 is a multiple of kBwdTile
    __syncthreads();
    load_tile<HS>(Qs, base, C3, i0, kBwdTile, T_);
    load_tile<HS>(dOs, dbase, C, i0, kBwdTile, T_);
    for (int i = threadIdx.x; i < kBwdTile; i += kMmaThreads) {
      lse_s[i] = i0 + i < T_ ? lse[stat0 + i0 + i] : 0.0f;
      d_s[i] = i0 + i < T_ ? D[stat0 + i0 + i] : 0.0f;
    }
    __syncthreads();
    float st[kBwdTile / 8][4] = {}, dpt[kBwdTile / 8][4] = {};  // S^T, dP^T: keys x queries
#pragma unroll
    for (int k = 0; k < HS / 16; ++k) {
      uint32_t ka[4], va[4];
      frag_a<HS>(ka, Ks, warp * 16, k * 16);
      frag_a<HS>(va, Vs, warp * 16, k * 16);
#pragma unroll
      for (int n = 0; n < kBwdTile / 8; ++n) {
        uint32_t b0, b1;
        frag_b_rows<HS>(b0, b1, Qs, n * 8, k * 16);
        mma<T>(st[n], ka, b0, b1);
        frag_b_rows<HS>(b0, b1, dOs, n * 8, k * 16);
        mma<T>(dpt[n], va, b0, b1);
      }
    }
#pragma unroll
    for (int n = 0; n < kBwdTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, qi = n * 8 + 2 * c + (e & 1), query = i0 + qi;
        const bool valid = key[r] <= query && query < T_ && key[r] < T_;
        const float p = valid ? expf(st[n][e] * scale - lse_s[qi]) : 0.0f;
        st[n][e] = p;                            // P^T
        dpt[n][e] = p * (dpt[n][e] - d_s[qi]);   // dS^T
      }
    }
#pragma unroll
    for (int j = 0; j < kBwdTile / 16; ++j) {
      mma_acc_by_tile<T, HS>(dv, st, j, dOs);
      mma_acc_by_tile<T, HS>(dk, dpt, j, Qs);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= T_) continue;
    T* dkd = dqkv + (size_t(b) * T_ + key[r]) * C3 + C + size_t(h) * HS + 2 * c;
    T* dvd = dkd + C;
#pragma unroll
    for (int d = 0; d < HS / 8; ++d) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        dkd[d * 8 + e] = from_float<T>(to_float(dkd[d * 8 + e]) + scale * dk[d][2 * r + e]);
        dvd[d * 8 + e] = from_float<T>(to_float(dvd[d * 8 + e]) + dv[d][2 * r + e]);
      }
    }
  }
}

template <int HS>
constexpr size_t fwd_smem() {
  return sizeof(uint16_t) * size_t(kOwnRows + 2 * kFwdTile) * kStride<HS>;
}
template <int HS>
constexpr size_t dq_smem() {
  return sizeof(uint16_t) * size_t(2 * kOwnRows + 2 * kBwdTile) * kStride<HS>;
}
template <int HS>
constexpr size_t dkv_smem() {
  return sizeof(uint16_t) * size_t(2 * kOwnRows + 2 * kBwdTile) * kStride<HS> +
         sizeof(float) * 2 * kBwdTile;
}

void launch(const void* fn, dim3 grid, size_t smem, void** args) {
  if (smem > 48 * 1024) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  KILN_CUDA_CHECK(cudaLaunchKernel(fn, grid, dim3(kMmaThreads), args, smem, stream()));
}

AttentionKernel initial_choice() {
  const char* env = std::getenv("KILN_CUDA_ATTENTION");
  return env && std::strcmp(env, "mma") == 0 ? AttentionKernel::kTensorCore : AttentionKernel::kTiled;
}
AttentionKernel& chosen() {
  static AttentionKernel k = initial_choice();
  return k;
}

}  // namespace

void set_attention_kernel(AttentionKernel k) { chosen() = k; }
AttentionKernel attention_kernel() { return chosen(); }

bool attention_mma_eligible(DType t, int C, int NH) {
  if (t == DType::kF32 || NH <= 0 || C % NH != 0) return false;
  const int hs = C / NH;
  if (hs != 64 && hs != 128) return false;
  static const int major = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return v;
  }();
  return major >= 8;
}

namespace detail {

template <typename T>
bool use_attention_mma(const T* qkv, const T* dout, int C, int NH) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    // 16-byte row starts: every row begins at a multiple of C (3C) elements plus h * hs.
    const bool aligned = reinterpret_cast<uintptr_t>(qkv) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(dout) % 16 == 0 && C % 8 == 0;
    return chosen() == AttentionKernel::kTensorCore && aligned &&
           attention_mma_eligible(dtype_of<T>(), C, NH);
  }
}

template <typename T>
void attention_forward_mma(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH) {
  const int hs = C / NH;
  const dim3 grid(unsigned((T_ + kOwnRows - 1) / kOwnRows), unsigned(B * NH));
  void* args[] = {&out, &lse, const_cast<T**>(&qkv), &T_, &C, &NH};
  if (hs == 64) {
    launch(reinterpret_cast<const void*>(&fwd_mma_kernel<T, 64>), grid, fwd_smem<64>(), args);
  } else {
    launch(reinterpret_cast<const void*>(&fwd_mma_kernel<T, 128>), grid, fwd_smem<128>(), args);
  }
}

template <typename T>
void attention_backward_mma(T* dqkv, const T* dout, const T* qkv, const float* lse,
                            const float* D, int B, int T_, int C, int NH) {
  const int hs = C / NH;
  const dim3 grid(unsigned((T_ + kOwnRows - 1) / kOwnRows), unsigned(B * NH));
  void* args[] = {&dqkv, const_cast<T**>(&dout), const_cast<T**>(&qkv), const_cast<float**>(&lse),
                  const_cast<float**>(&D), &T_, &C, &NH};
  if (hs == 64) {
    launch(reinterpret_cast<const void*>(&dq_mma_kernel<T, 64>), grid, dq_smem<64>(), args);
    launch(reinterpret_cast<const void*>(&dkv_mma_kernel<T, 64>), grid, dkv_smem<64>(), args);
  } else {
    launch(reinterpret_cast<const void*>(&dq_mma_kernel<T, 128>), grid, dq_smem<128>(), args);
    launch(reinterpret_cast<const void*>(&dkv_mma_kernel<T, 128>), grid, dkv_smem<128>(), args);
  }
}

#define KILN_INSTANTIATE(T)                                                                      \
  template bool use_attention_mma<T>(const T*, const T*, int, int);                              \
  template void attention_forward_mma<T>(T*, float*, const T*, int, int, int, int);             \
  template void attention_backward_mma<T>(T*, const T*, const T*, const float*, const float*,    \
                                          int, int, int, int);
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace detail
}  // namespace kiln::cuda
