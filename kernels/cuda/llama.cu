// The Llama block's operators on the GPU, in their simplest correct form, mirroring
// kernels/cpu/llama.cc and the CPU's grouped-query attention: RMSNorm (one warp per row, weight
// gradient by fixed row chunks), RoPE (one thread per rotated pair), SwiGLU (element-wise), and
// grouped-query attention with the document mask (one thread per query row for out / lse / dq,
// one per key row of a key/value head for dk / dv, summing its query heads in order; no atomics,
// no shared-memory tiling). No GPU has run these yet (docs/KERNELS.md): speed work comes after
// a GPU run has checked them against the CPU (tests/kernels/kernels_cuda_gpu.cc).
#include "kernels/cuda/common.cuh"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 8;  // RMSNorm: one warp per row
constexpr int kMaxHead = 256;     // attention: head sizes up to 256 (per-thread accumulators)

// ---- RMSNorm ------------------------------------------------------------------------------------
template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight,
                                       float eps, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += ld(x + c) * ld(x + c);
  const float r = 1.0f / sqrtf(warp_sum(s) / C + eps);
  T* o = out + size_t(row) * C;
  for (int c = lane; c < C; c += 32) st(o + c, ld(x + c) * r * ld(weight + c));
  if (lane == 0 && rstd) rstd[row] = r;
}

template <typename T>
__global__ void rmsnorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                             const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* x = inp + size_t(row) * C;
  const T* dy = dout + size_t(row) * C;
  const float r = rstd[row];
  float a = 0.0f;
  for (int c = lane; c < C; c += 32) a += ld(dy + c) * ld(weight + c) * ld(x + c) * r;
  const float dnorm_xhat_mean = warp_sum(a) / C;
  T* dx = dinp + size_t(row) * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = ld(x + c) * r;
    st(dx + c, ld(dx + c) + (ld(dy + c) * ld(weight + c) - xhat * dnorm_xhat_mean) * r);
  }
}

// partial[chunk * C + c] = sum over the chunk's rows (in order) of dy * x * rstd.
template <typename T>
__global__ void rmsnorm_dweight_partial(float* partial, const T* dout, const T* inp,
                                        const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int r0 = blockIdx.y * kColumnChunkRows, r1 = min(N, r0 + kColumnChunkRows);
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r)
    acc += ld(dout + size_t(r) * C + c) * ld(inp + size_t(r) * C + c) * rstd[r];
  partial[size_t(blockIdx.y) * C + c] = acc;
}

__global__ void add_partials(float* out, const float* partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; ++k) acc += partial[size_t(k) * C + c];
  out[c] += acc;
}

// ---- RoPE ---------------------------------------------------------------------------------------
// One thread per (row, rotated head, pair i < hs/2).
template <typename T>
__global__ void rope_kernel(T* qkv, const int32_t* doc_start, float theta, int rows, int T_, int NH,
                            int NKV, int hs, float sign) {
  const int half = hs / 2;
  const size_t n = size_t(rows) * (NH + NKV) * half;
  const size_t W = size_t(NH + 2 * NKV) * hs;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < n;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half);
    const size_t rh = idx / half;
    const int h = int(rh % (NH + NKV));
    const size_t r = rh / (NH + NKV);
    const int t = int(r % T_);
    const int pos = t - (doc_start ? doc_start[r] : 0);
    // fp64 angle and cos/sin, rounded to fp32, as the CPU.
    const double a = double(pos) * pow(double(theta), -2.0 * i / hs);
    const float c = float(cos(a)), s = sign * float(sin(a));
    T* x = qkv + r * W + size_t(h) * hs;
    const float x1 = ld(x + i), x2 = ld(x + i + half);
    st(x + i, x1 * c - x2 * s);
    st(x + i + half, x2 * c + x1 * s);
  }
}

// ---- SwiGLU -------------------------------------------------------------------------------------
template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, size_t rows, int F) {
  const size_t n = rows * F;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < n;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t r = idx / F, c = idx % F;
    const float g = ld(inp + r * 2 * F + c), u = ld(inp + r * 2 * F + F + c);
    st(out + idx, g / (1.0f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t rows, int F) {
  const size_t n = rows * F;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < n;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t r = idx / F, c = idx % F;
    const float g = ld(inp + r * 2 * F + c), u = ld(inp + r * 2 * F + F + c);
    const float dy = ld(dout + idx);
    const float sig = 1.0f / (1.0f + expf(-g));
    T* dg = dinp + r * 2 * F + c;
    T* du = dg + F;
    st(dg, ld(dg) + dy * u * sig * (1.0f + g * (1.0f - sig)));
    st(du, ld(du) + dy * g * sig);
  }
}

// ---- grouped-query attention with the document mask --------------------------------------------
struct Gqa {
  int T, NH, NKV, hs;
  __device__ size_t W() const { return size_t(NH + 2 * NKV) * hs; }
  __device__ int group(int h) const { return h / (NH / NKV); }
};

// One thread per (b, h, i): online softmax over keys doc_start .. i.
template <typename T>
__global__ void gqa_forward_kernel(T* out, float* lse, const T* qkv, const int32_t* doc_start,
                                   int B, Gqa g) {
  const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(B) * g.NH * g.T) return;
  const int i = int(idx % g.T), h = int((idx / g.T) % g.NH), b = int(idx / (size_t(g.T) * g.NH));
  const int kv = g.group(h), hs = g.hs;
  const size_t W = g.W();
  const T* base = qkv + size_t(b) * g.T * W;
  const T* q = base + size_t(i) * W + size_t(h) * hs;
  const int j0 = doc_start ? doc_start[size_t(b) * g.T + i] : 0;
  const float scale = 1.0f / sqrtf(float(hs));
  float o[kMaxHead];
  for (int d = 0; d < hs; ++d) o[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = j0; j <= i; ++j) {
    const T* k = base + size_t(j) * W + size_t(g.NH + kv) * hs;
    const T* v = base + size_t(j) * W + size_t(g.NH + g.NKV + kv) * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += ld(q + d) * ld(k + d);
    s *= scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
    for (int d = 0; d < hs; ++d) o[d] = o[d] * corr + p * ld(v + d);
    m = m_new;
  }
  T* orow = out + (size_t(b) * g.T + i) * g.NH * hs + size_t(h) * hs;
  for (int d = 0; d < hs; ++d) st(orow + d, o[d] / l);
  lse[(size_t(b) * g.NH + h) * g.T + i] = m + logf(l);
}

// D[b,h,i] = dO . O (the stored output).
template <typename T>
__global__ void gqa_d_kernel(float* D, const T* dout, const T* out, int B, Gqa g) {
  const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(B) * g.NH * g.T) return;
  const int i = int(idx % g.T), h = int((idx / g.T) % g.NH), b = int(idx / (size_t(g.T) * g.NH));
  const size_t off = (size_t(b) * g.T + i) * g.NH * g.hs + size_t(h) * g.hs;
  float s = 0.0f;
  for (int d = 0; d < g.hs; ++d) s += ld(dout + off + d) * ld(out + off + d);
  D[idx] = s;
}

// P_ij and dS_ij = P_ij (dO_i . v_j - D_i), recomputed from q, k, lse.
template <typename T>
__device__ void score_grad(float* p, float* ds, const T* q, const T* k, const T* v, const T* dO,
                           float lse, float D, float scale, int hs) {
  float s = 0.0f, dp = 0.0f;
  for (int d = 0; d < hs; ++d) {
    s += ld(q + d) * ld(k + d);
    dp += ld(dO + d) * ld(v + d);
  }
  *p = expf(s * scale - lse);
  *ds = *p * (dp - D);
}

// dq: one thread per (b, h, i), keys in order.
template <typename T>
__global__ void gqa_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                              const float* D, const int32_t* doc_start, int B, Gqa g) {
  const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(B) * g.NH * g.T) return;
  const int i = int(idx % g.T), h = int((idx / g.T) % g.NH), b = int(idx / (size_t(g.T) * g.NH));
  const int kv = g.group(h), hs = g.hs;
  const size_t W = g.W();
  const T* base = qkv + size_t(b) * g.T * W;
  const T* q = base + size_t(i) * W + size_t(h) * hs;
  const T* dO = dout + (size_t(b) * g.T + i) * g.NH * hs + size_t(h) * hs;
  const int j0 = doc_start ? doc_start[size_t(b) * g.T + i] : 0;
  const float scale = 1.0f / sqrtf(float(hs));
  float dq[kMaxHead];
  for (int d = 0; d < hs; ++d) dq[d] = 0.0f;
  for (int j = j0; j <= i; ++j) {
    const T* k = base + size_t(j) * W + size_t(g.NH + kv) * hs;
    const T* v = base + size_t(j) * W + size_t(g.NH + g.NKV + kv) * hs;
    float p, ds;
    score_grad(&p, &ds, q, k, v, dO, lse[idx], D[idx], scale, hs);
    for (int d = 0; d < hs; ++d) dq[d] += ds * ld(k + d);
  }
  T* row = dqkv + (size_t(b) * g.T + i) * W + size_t(h) * hs;
  for (int d = 0; d < hs; ++d) st(row + d, ld(row + d) + dq[d] * scale);
}

// dk, dv: one thread per (b, kv head, j); the group's query heads in order, queries i >= j whose
// document includes j.
template <typename T>
__global__ void gqa_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                               const float* D, const int32_t* doc_start, int B, Gqa g) {
  const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(B) * g.NKV * g.T) return;
  const int j = int(idx % g.T), kv = int((idx / g.T) % g.NKV), b = int(idx / (size_t(g.T) * g.NKV));
  const int hs = g.hs, rep = g.NH / g.NKV;
  const size_t W = g.W();
  const T* base = qkv + size_t(b) * g.T * W;
  const T* k = base + size_t(j) * W + size_t(g.NH + kv) * hs;
  const T* v = base + size_t(j) * W + size_t(g.NH + g.NKV + kv) * hs;
  const float scale = 1.0f / sqrtf(float(hs));
  float dk[kMaxHead], dv[kMaxHead];
  for (int d = 0; d < hs; ++d) dk[d] = dv[d] = 0.0f;
  for (int h = kv * rep; h < (kv + 1) * rep; ++h) {
    for (int i = j; i < g.T; ++i) {
      if (doc_start && doc_start[size_t(b) * g.T + i] > j) break;  // starts only grow
      const T* q = base + size_t(i) * W + size_t(h) * hs;
      const T* dO = dout + (size_t(b) * g.T + i) * g.NH * hs + size_t(h) * hs;
      const size_t r = (size_t(b) * g.NH + h) * g.T + i;
      float p, ds;
      score_grad(&p, &ds, q, k, v, dO, lse[r], D[r], scale, hs);
      for (int d = 0; d < hs; ++d) {
        dv[d] += p * ld(dO + d);
        dk[d] += ds * ld(q + d);
      }
    }
  }
  T* krow = dqkv + (size_t(b) * g.T + j) * W + size_t(g.NH + kv) * hs;
  T* vrow = dqkv + (size_t(b) * g.T + j) * W + size_t(g.NH + g.NKV + kv) * hs;
  for (int d = 0; d < hs; ++d) {
    st(krow + d, ld(krow + d) + dk[d] * scale);
    st(vrow + d, ld(vrow + d) + dv[d]);
  }
}

Gqa check_gqa(const char* op, int T_, int NH, int NKV, int hs) {
  KILN_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0,
             std::string(op) + ": NH must be a positive multiple of NKV");
  KILN_CHECK(hs <= kMaxHead, std::string(op) + ": head size above 256");
  return Gqa{T_, NH, NKV, hs};
}
}  // namespace

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const Same<T>* inp, const Same<T>* weight, float eps,
                     int B, int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  const int N = B * T_;
  if (N == 0) return;
  rmsnorm_forward_kernel<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0,
                           stream()>>>(out, rstd, inp, weight, eps, N, C);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void rmsnorm_backward(Same<T>* dinp, float* dweight, const T* dout, const Same<T>* inp,
                      const Same<T>* weight, const float* rstd, int B, int T_, int C) {
  KILN_CUDA_TIMED(kElementwise);
  const int N = B * T_;
  if (N == 0) return;
  if (dinp) {
    rmsnorm_backward_dinp_kernel<<<(N + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock, 0,
                                   stream()>>>(dinp, dout, inp, weight, rstd, N, C);
    KILN_CUDA_LAUNCHED();
  }
  if (dweight) {
    const int chunks = (N + kColumnChunkRows - 1) / kColumnChunkRows;
    float* partial = static_cast<float*>(workspace(sizeof(float) * size_t(chunks) * C, 1));
    rmsnorm_dweight_partial<<<dim3((C + 255) / 256, chunks), 256, 0, stream()>>>(partial, dout, inp,
                                                                                 rstd, N, C);
    KILN_CUDA_LAUNCHED();
    add_partials<<<(C + 255) / 256, 256, 0, stream()>>>(dweight, partial, chunks, C);
    KILN_CUDA_LAUNCHED();
  }
}

template <typename T>
void rope_forward(T* qkv, const int32_t* doc_start, float theta, int B, int T_, int NH, int NKV,
                  int hs) {
  KILN_CUDA_TIMED(kElementwise);
  KILN_CHECK(hs > 0 && hs % 2 == 0, "rope_forward: the head size must be even");
  const size_t n = size_t(B) * T_ * (NH + NKV) * (hs / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(qkv, doc_start, theta, B * T_, T_,
                                                                NH, NKV, hs, 1.0f);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void rope_backward(T* dqkv, const int32_t* doc_start, float theta, int B, int T_, int NH, int NKV,
                   int hs) {
  KILN_CUDA_TIMED(kElementwise);
  KILN_CHECK(hs > 0 && hs % 2 == 0, "rope_backward: the head size must be even");
  const size_t n = size_t(B) * T_ * (NH + NKV) * (hs / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(dqkv, doc_start, theta, B * T_, T_,
                                                                NH, NKV, hs, -1.0f);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void swiglu_forward(T* out, const Same<T>* inp, size_t rows, int F) {
  KILN_CUDA_TIMED(kElementwise);
  if (rows * F == 0) return;
  swiglu_forward_kernel<<<grid_for(rows * F, kThreads), kThreads, 0, stream()>>>(out, inp, rows, F);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void swiglu_backward(Same<T>* dinp, const T* inp, const Same<T>* dout, size_t rows, int F) {
  KILN_CUDA_TIMED(kElementwise);
  if (rows * F == 0) return;
  swiglu_backward_kernel<<<grid_for(rows * F, kThreads), kThreads, 0, stream()>>>(dinp, inp, dout,
                                                                                  rows, F);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void attention_gqa_forward(T* out, float* lse, const Same<T>* qkv, const int32_t* doc_start, int B,
                           int T_, int NH, int NKV, int hs) {
  KILN_CUDA_TIMED(kAttention);
  const Gqa g = check_gqa("attention_gqa_forward", T_, NH, NKV, hs);
  const size_t rows = size_t(B) * NH * T_;
  if (rows == 0) return;
  gqa_forward_kernel<<<grid_for(rows, 128, (1u << 31) - 1), 128, 0, stream()>>>(out, lse, qkv,
                                                                                doc_start, B, g);
  KILN_CUDA_LAUNCHED();
}

template <typename T>
void attention_gqa_backward(Same<T>* dqkv, const T* dout, const Same<T>* qkv, const Same<T>* out,
                            const float* lse, const int32_t* doc_start, int B, int T_, int NH,
                            int NKV, int hs) {
  KILN_CUDA_TIMED(kAttention);
  const Gqa g = check_gqa("attention_gqa_backward", T_, NH, NKV, hs);
  const size_t rows = size_t(B) * NH * T_;
  if (rows == 0) return;
  float* D = static_cast<float*>(workspace(sizeof(float) * rows, 0));
  gqa_d_kernel<<<grid_for(rows, 128, (1u << 31) - 1), 128, 0, stream()>>>(D, dout, out, B, g);
  KILN_CUDA_LAUNCHED();
  gqa_dq_kernel<<<grid_for(rows, 128, (1u << 31) - 1), 128, 0, stream()>>>(dqkv, dout, qkv, lse, D,
                                                                           doc_start, B, g);
  KILN_CUDA_LAUNCHED();
  const size_t kv_rows = size_t(B) * NKV * T_;
  gqa_dkv_kernel<<<grid_for(kv_rows, 128, (1u << 31) - 1), 128, 0, stream()>>>(dqkv, dout, qkv, lse,
                                                                               D, doc_start, B, g);
  KILN_CUDA_LAUNCHED();
}

#define KILN_INSTANTIATE(T)                                                                        \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, float, int, int, int);          \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int,   \
                                    int, int);                                                     \
  template void rope_forward<T>(T*, const int32_t*, float, int, int, int, int, int);               \
  template void rope_backward<T>(T*, const int32_t*, float, int, int, int, int, int);              \
  template void swiglu_forward<T>(T*, const T*, size_t, int);                                      \
  template void swiglu_backward<T>(T*, const T*, const T*, size_t, int);                           \
  template void attention_gqa_forward<T>(T*, float*, const T*, const int32_t*, int, int, int, int, \
                                         int);                                                     \
  template void attention_gqa_backward<T>(T*, const T*, const T*, const T*, const float*,          \
                                          const int32_t*, int, int, int, int, int);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(bf16)
KILN_INSTANTIATE(fp16)
#undef KILN_INSTANTIATE

}  // namespace kiln::cuda
