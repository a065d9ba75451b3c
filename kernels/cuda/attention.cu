// Causal multi-head attention on the GPU, first version: one warp per row with an online softmax
// (forward) and recomputation from the saved logsumexp (backward). Memory is O(T) per row (no T x T
// matrix); every output element is written by exactly one warp, in a fixed order, so results
// repeat bit for bit. Simple rather than fast: a tiled tensor-core kernel replaces it later
// without changing the interface.
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kWarps = 4;             // rows per block
constexpr int kMaxHeadPerLane = 8;    // head size up to 256

// q k^T / sqrt(hs) for one (row i, key j) pair: lanes split the head dimension.
template <typename T>
__device__ float dot_row(const T* a, const T* b, int hs) {
  float s = 0.0f;
  for (int d = threadIdx.x & 31; d < hs; d += 32) s += ld(a + d) * ld(b + d);
  return warp_sum(s);
}

template <typename T>
__global__ void attention_forward_kernel(T* out, float* lse, const T* qkv, int B, int T_, int C,
                                         int NH) {
  const int hs = C / NH;
  const size_t rows = size_t(B) * NH * T_;
  const size_t row = size_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int i = int(row % T_);
  const int h = int((row / T_) % NH);
  const int b = int(row / (size_t(T_) * NH));
  const size_t C3 = size_t(3) * C;
  const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
  const T* q = base + size_t(i) * C3;
  const float scale = rsqrtf(float(hs));
  float o[kMaxHeadPerLane];
  for (int k = 0; k < kMaxHeadPerLane; ++k) o[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= i; ++j) {
    const T* kv = base + size_t(j) * C3;
    const float s = dot_row(q, kv + C, hs) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);
    const float p = expf(s - m_new);
    l = l * corr + p;
    m = m_new;
    for (int k = 0, d = lane; d < hs; ++k, d += 32) o[k] = o[k] * corr + p * ld(kv + 2 * C + d);
  }
  T* dst = out + (size_t(b) * T_ + i) * C + size_t(h) * hs;
  for (int k = 0, d = lane; d < hs; ++k, d += 32) st(dst + d, o[k] / l);
  if (lane == 0) lse[row] = m + logf(l);
}

// D[row] = rowsum(dO * O)
template <typename T>
__global__ void attention_d_kernel(float* D, const T* dout, const T* out, int B, int T_, int C,
                                   int NH) {
  const int hs = C / NH;
  const size_t rows = size_t(B) * NH * T_;
  const size_t row = size_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int i = int(row % T_), h = int((row / T_) % NH), b = int(row / (size_t(T_) * NH));
  const size_t off = (size_t(b) * T_ + i) * C + size_t(h) * hs;
  const float d = dot_row(dout + off, out + off, hs);
  if ((threadIdx.x & 31) == 0) D[row] = d;
}

// dq_i += scale * sum_{j<=i} dS_ij k_j,  dS_ij = P_ij (dO_i . v_j - D_i),  P_ij = exp(s_ij - lse_i)
template <typename T>
__global__ void attention_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                    const float* D, int B, int T_, int C, int NH) {
  const int hs = C / NH;
  const size_t rows = size_t(B) * NH * T_;
  const size_t row = size_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int i = int(row % T_), h = int((row / T_) % NH), b = int(row / (size_t(T_) * NH));
  const size_t C3 = size_t(3) * C;
  const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
  const T* q = base + size_t(i) * C3;
  const T* dO = dout + (size_t(b) * T_ + i) * C + size_t(h) * hs;
  const float scale = rsqrtf(float(hs));
  float acc[kMaxHeadPerLane];
  for (int k = 0; k < kMaxHeadPerLane; ++k) acc[k] = 0.0f;
  for (int j = 0; j <= i; ++j) {
    const T* kv = base + size_t(j) * C3;
    const float p = expf(dot_row(q, kv + C, hs) * scale - lse[row]);
    const float ds = p * (dot_row(dO, kv + 2 * C, hs) - D[row]);
    for (int k = 0, d = lane; d < hs; ++k, d += 32) acc[k] += ds * ld(kv + C + d);
  }
  T* dq = dqkv + (size_t(b) * T_ + i) * C3 + size_t(h) * hs;
  for (int k = 0, d = lane; d < hs; ++k, d += 32) st(dq + d, ld(dq + d) + acc[k] * scale);
}

// dk_j += scale * sum_{i>=j} dS_ij q_i ;  dv_j += sum_{i>=j} P_ij dO_i
template <typename T>
__global__ void attention_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                     const float* D, int B, int T_, int C, int NH) {
  const int hs = C / NH;
  const size_t rows = size_t(B) * NH * T_;
  const size_t row = size_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int j = int(row % T_), h = int((row / T_) % NH), b = int(row / (size_t(T_) * NH));
  const size_t C3 = size_t(3) * C;
  const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
  const T* k = base + size_t(j) * C3 + C;
  const T* v = k + C;
  const size_t stat0 = (size_t(b) * NH + h) * T_;
  const float scale = rsqrtf(float(hs));
  float dk[kMaxHeadPerLane], dv[kMaxHeadPerLane];
  for (int x = 0; x < kMaxHeadPerLane; ++x) dk[x] = dv[x] = 0.0f;
  for (int i = j; i < T_; ++i) {
    const T* q = base + size_t(i) * C3;
    const T* dO = dout + (size_t(b) * T_ + i) * C + size_t(h) * hs;
    const float p = expf(dot_row(q, k, hs) * scale - lse[stat0 + i]);
    const float ds = p * (dot_row(dO, v, hs) - D[stat0 + i]);
    for (int x = 0, d = lane; d < hs; ++x, d += 32) {
      dk[x] += ds * ld(q + d);
      dv[x] += p * ld(dO + d);
    }
  }
  T* dst = dqkv + (size_t(b) * T_ + j) * C3 + size_t(h) * hs;
  for (int x = 0, d = lane; d < hs; ++x, d += 32) {
    st(dst + C + d, ld(dst + C + d) + dk[x] * scale);
    st(dst + 2 * C + d, ld(dst + 2 * C + d) + dv[x]);
  }
}
}  // namespace

template <typename T>
void attention_forward(T* out, float* lse, const Same<T>* qkv, int B, int T_, int C, int NH) {
  KILN_CHECK(NH > 0 && C % NH == 0, "attention_forward: C must be a multiple of NH");
  KILN_CHECK(C / NH <= 32 * kMaxHeadPerLane, "attention_forward: head size above 256");
  const size_t rows = size_t(B) * NH * T_;
  if (rows == 0) return;
  attention_forward_kernel<<<unsigned((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream()>>>(
      out, lse, qkv, B, T_, C, NH);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void attention_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                        const float* lse, int B, int T_, int C, int NH) {
  KILN_CHECK(NH > 0 && C % NH == 0, "attention_backward: C must be a multiple of NH");
  KILN_CHECK(C / NH <= 32 * kMaxHeadPerLane, "attention_backward: head size above 256");
  const size_t rows = size_t(B) * NH * T_;
  if (rows == 0) return;
  float* D = static_cast<float*>(workspace(sizeof(float) * rows, 0));
  const unsigned blocks = unsigned((rows + kWarps - 1) / kWarps);
  attention_d_kernel<<<blocks, 32 * kWarps, 0, stream()>>>(D, dout, out, B, T_, C, NH);
  KILN_CUDA_LAUNCHED();
  attention_dq_kernel<<<blocks, 32 * kWarps, 0, stream()>>>(dqkv, dout, qkv, lse, D, B, T_, C, NH);
  KILN_CUDA_LAUNCHED();
  attention_dkv_kernel<<<blocks, 32 * kWarps, 0, stream()>>>(dqkv, dout, qkv, lse, D, B, T_, C, NH);
  KILN_CUDA_LAUNCHED();
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
