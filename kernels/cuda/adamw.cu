// AdamW on the GPU (kernels/cpu/adamw.cc is the CPU side): one tensor per launch, or every tensor
// of a step in one launch over a multi-tensor chunk table (launch_plan.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch_plan.h"

namespace kiln::cuda {

using namespace detail;

namespace {
constexpr int kThreads = 256;

struct AdamWConst {
  float gs, b1, b2, one_minus_b1, one_minus_b2, eps, bc2_sqrt, step_size, decay;
};
float adamw_decay(float lr, float weight_decay) { return float(1.0 - double(lr) * weight_decay); }

// One element of AdamW; `decay` is 1 - lr * weight_decay.
template <typename L>
__device__ __forceinline__ void adamw_element(float* p, float* m, float* v, const float* g, L* p_lp,
                                              size_t i, const AdamWConst& k, float decay) {
  const float gi = g[i] * k.gs;
  // Same operation order as the CPU kernel and torch.optim.AdamW; __fmul_rn/__fadd_rn keep the
  // compiler from contracting into FMAs so CPU and GPU agree closely.
  const float mi = __fadd_rn(__fmul_rn(m[i], k.b1), __fmul_rn(gi, k.one_minus_b1));
  const float vi = __fadd_rn(__fmul_rn(v[i], k.b2), __fmul_rn(__fmul_rn(gi, gi), k.one_minus_b2));
  m[i] = mi;
  v[i] = vi;
  const float denom = __fadd_rn(__fdiv_rn(sqrtf(vi), k.bc2_sqrt), k.eps);
  const float pi = __fsub_rn(__fmul_rn(p[i], decay), __fmul_rn(k.step_size, __fdiv_rn(mi, denom)));
  p[i] = pi;
  if (p_lp) p_lp[i] = from_float<L>(pi);
}

template <typename L>
__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, L* p_lp, size_t n,
                             AdamWConst k) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    adamw_element(p, m, v, g, p_lp, i, k, k.decay);
}

// Multi-tensor AdamW: block b updates chunk chunks[b] (launch_plan.h) of tensor chunks[b].tensor.
// The tables hold no per-step value, so they are uploaded once (device_table): each tensor names
// one of up to kDecayClasses weight decays, whose factors 1 - lr * wd the host computes each step
// exactly as adamw_impl does and passes by value.
constexpr int kDecayClasses = 8;
struct AdamWSegment {
  float *p, *m, *v;
  const float* g;
  void* lp;
  size_t n;
  int64_t decay_class;  // (64-bit: no padding bytes, the table is compared bytewise)
};
struct DecayFactors {
  float f[kDecayClasses];
};
template <typename L>
__global__ void adamw_multi_kernel(const AdamWSegment* segs, const TensorChunk* chunks,
                                   AdamWConst k, DecayFactors decay) {
  const TensorChunk c = chunks[blockIdx.x];
  const AdamWSegment s = segs[c.tensor];
  const size_t begin = size_t(c.chunk) * kMultiTensorChunk;
  const size_t end = min(s.n, begin + kMultiTensorChunk);
  const float d = decay.f[s.decay_class];
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    adamw_element(s.p, s.m, s.v, s.g, static_cast<L*>(s.lp), i, k, d);
}

AdamWConst adamw_const(const AdamWParams& hp) {
  const double bc1 = 1.0 - std::pow(double(hp.beta1), double(hp.step));
  const double bc2 = 1.0 - std::pow(double(hp.beta2), double(hp.step));
  AdamWConst k;
  k.gs = hp.grad_scale;
  k.b1 = hp.beta1;
  k.b2 = hp.beta2;
  k.one_minus_b1 = float(1.0 - double(hp.beta1));
  k.one_minus_b2 = float(1.0 - double(hp.beta2));
  k.eps = hp.eps;
  k.bc2_sqrt = float(std::sqrt(bc2));
  k.step_size = float(double(hp.lr) / bc1);
  k.decay = adamw_decay(hp.lr, hp.weight_decay);
  return k;
}

template <typename L>
void adamw_impl(float* params, float* m, float* v, const float* grads, size_t n,
                const AdamWParams& hp, L* params_lp) {
  KILN_CUDA_TIMED(kOptimizer);
  if (n == 0) return;
  const AdamWConst k = adamw_const(hp);
  adamw_kernel<L>
      <<<grid_for(n, kThreads), kThreads, 0, stream()>>>(params, m, v, grads, params_lp, n, k);
  KILN_CUDA_LAUNCHED();
}

}  // namespace

void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp) {
  adamw_impl<float>(params, m, v, grads, n, hp, nullptr);
}
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, bf16* params_lp) {
  adamw_impl(params, m, v, grads, n, hp, params_lp);
}
void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                  const AdamWParams& hp, fp16* params_lp) {
  adamw_impl(params, m, v, grads, n, hp, params_lp);
}

void adamw_update_multi(const AdamWTensor* tensors, int count, const AdamWParams& hp,
                        DType lp_type) {
  KILN_CUDA_TIMED(kOptimizer);
  if (count <= 0) return;
  // The weight decays in use (almost always two: wd and 0).
  std::vector<float> wds;
  for (int i = 0; i < count; ++i) {
    if (std::find(wds.begin(), wds.end(), tensors[i].weight_decay) == wds.end())
      wds.push_back(tensors[i].weight_decay);
  }
  if (!fused_kernels() || wds.size() > size_t(kDecayClasses)) {
    kiln::detail::adamw_update_each<CudaBackend>(tensors, count, hp, lp_type);
    return;
  }
  std::vector<AdamWSegment> segs(static_cast<size_t>(count));
  std::vector<size_t> sizes(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const AdamWTensor& t = tensors[i];
    const int cls = int(std::find(wds.begin(), wds.end(), t.weight_decay) - wds.begin());
    segs[i] = AdamWSegment{
        t.params, t.m, t.v, t.grads, lp_type == DType::kF32 ? nullptr : t.params_lp, t.n, cls};
    sizes[i] = t.n;
  }
  DecayFactors decay{};
  for (size_t c = 0; c < wds.size(); ++c) decay.f[c] = adamw_decay(hp.lr, wds[c]);
  const std::vector<TensorChunk> chunks = plan_tensor_chunks(sizes.data(), count);
  if (chunks.empty()) return;
  const auto* dsegs = static_cast<const AdamWSegment*>(
      device_table(segs.data(), segs.size() * sizeof(AdamWSegment), 0));
  const auto* dchunks = static_cast<const TensorChunk*>(
      device_table(chunks.data(), chunks.size() * sizeof(TensorChunk), 1));
  const AdamWConst k = adamw_const(hp);
  const unsigned blocks = static_cast<unsigned>(chunks.size());
  switch (lp_type) {
    case DType::kBF16:
      adamw_multi_kernel<bf16><<<blocks, kThreads, 0, stream()>>>(dsegs, dchunks, k, decay);
      break;
    case DType::kF16:
      adamw_multi_kernel<fp16><<<blocks, kThreads, 0, stream()>>>(dsegs, dchunks, k, decay);
      break;
    default:
      adamw_multi_kernel<float><<<blocks, kThreads, 0, stream()>>>(dsegs, dchunks, k, decay);
      break;
  }
  KILN_CUDA_LAUNCHED();
}

}  // namespace kiln::cuda
