// Internal to engine/infer/: the inference forward (gpt_infer.h) once, as a template over the
// kernel backend K (kernels/ops.h). gpt_infer.cc instantiates it for kiln::CpuBackend;
// gpt_infer_cuda.cc, compiled only into libkiln_cuda.so, for kiln::CudaBackend. Every buffer is
// in the runtime's memory (DeviceArray); token ids go in and logits / losses come out through
// the runtime's copies, so the host sees only what gpt_infer.h's functions take and give.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/device/runtime.h"
#include "engine/infer/gpt_infer.h"
#include "engine/infer/infer_kernels.h"
#include "kernels/ops.h"

namespace kiln::engine::detail {

// The pieces that are not operators (engine/infer/infer_kernels.h), per backend.
template <class K>
struct InferKernels;
template <>
struct InferKernels<CpuBackend> {
  static void cached_attention(float* out, const float* rows, float* scores, int p0, int n, int NH,
                               int NKV, int hs) {
    infer::cached_attention_cpu(out, rows, scores, p0, n, NH, NKV, hs);
  }
  static void rope_rows(float* qkv, int n, int p0, double theta, int NH, int NKV, int hs) {
    engine::rope_rows(qkv, n, p0, theta, NH, NKV, hs);
  }
};
template <>
struct InferKernels<CudaBackend> {
  static void cached_attention(float* out, const float* rows, float* scores, int p0, int n, int NH,
                               int NKV, int hs) {
    infer::cached_attention_cuda(out, rows, scores, p0, n, NH, NKV, hs);
  }
  static void rope_rows(float* qkv, int n, int p0, double theta, int NH, int NKV, int hs) {
    infer::rope_rows_cuda(qkv, n, p0, theta, NH, NKV, hs);
  }
};

template <class K>
class GptInferenceOn final : public GptInference {
 public:
  // `rt` is the runtime of K's device (runtime_for(K::kDevice)).
  static Result<std::unique_ptr<GptInference>> load(ModelWeights& w, Runtime* rt) {
    std::unique_ptr<GptInferenceOn> g(new GptInferenceOn(rt));
    g->m_ = w.model;
    const ParamStore& layout = *w.layout;
    const auto& tensors = layout.tensors();
    g->w_.resize(tensors.size());
    std::vector<float> staging;  // one tensor at a time, where the device is not host memory
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t n = tensors[i].numel;
      g->w_[i].reset(rt, n, tensors[i].name);
      float* dst = g->w_[i].data();
      if (!rt->host_addressable()) {
        staging.resize(n);
        dst = staging.data();
      }
      KILN_RETURN_IF_ERROR(read_tensor(w, static_cast<int>(i), 0, n, dst));
      if (!rt->host_addressable()) rt->copy_to_device(g->w_[i].data(), dst, n * sizeof(float));
    }
    for (int l = 0; l < w.model.n_layers; ++l) g->blocks_.push_back(layout.block(l));
    g->wte_ = layout.wte();
    g->wpe_ = layout.wpe();
    g->lnf_w_ = layout.lnf_w();
    g->lnf_b_ = layout.lnf_b();
    g->head_ = layout.lm_head();
    return std::unique_ptr<GptInference>(std::move(g));
  }

  Device device() const override { return K::kDevice; }

  Cache new_cache(int64_t positions) override {
    KILN_CHECK(positions >= 1 && positions <= m_.seq_len, "GptInference: cache positions");
    Cache c;
    c.capacity = positions;
    const size_t per = static_cast<size_t>(positions * m_.qkv_width());
    c.rows.resize(static_cast<size_t>(m_.n_layers));
    for (auto& r : c.rows) r.reset(rt_, per, "kv cache");
    return c;
  }

  void step(const int32_t* tokens, int n, Cache* cache, float* logits) override {
    const int C = static_cast<int>(m_.d_model), V = static_cast<int>(m_.vocab_size);
    upload(tokens, n);
    fit(h_, static_cast<size_t>(n) * C);
    hidden(tok_.data(), n, cache, h_.data());
    fit(logits_, static_cast<size_t>(V));
    K::matmul_forward(logits_.data(), h_.data() + static_cast<size_t>(n - 1) * C, t(head_), nullptr,
                      1, 1, C, V);
    rt_->copy_to_host(logits, logits_.data(), static_cast<size_t>(V) * sizeof(float));
  }

  void forward_full(const int32_t* tokens, int n, float* logits) override {
    const int C = static_cast<int>(m_.d_model), V = static_cast<int>(m_.vocab_size);
    upload(tokens, n);
    fit(h_, static_cast<size_t>(n) * C);
    hidden(tok_.data(), n, nullptr, h_.data());
    fit(logits_, static_cast<size_t>(n) * V);
    K::matmul_forward(logits_.data(), h_.data(), t(head_), nullptr, 1, n, C, V);
    rt_->copy_to_host(logits, logits_.data(), static_cast<size_t>(n) * V * sizeof(float));
  }

  void token_nll(const int32_t* tokens, int n, float* nll) override {
    if (n < 2) return;
    const int C = static_cast<int>(m_.d_model), V = static_cast<int>(m_.vocab_size);
    const int rows = n - 1;
    upload(tokens, n);
    fit(h_, static_cast<size_t>(rows) * C);
    hidden(tok_.data(), rows, nullptr, h_.data());
    // The LM head and the cross-entropy in chunks of rows (about 8 MiB of logits each).
    const int chunk = std::max(1, static_cast<int>((size_t{8} << 20) / (sizeof(float) * V)));
    fit(logits_, static_cast<size_t>(std::min(chunk, rows)) * V);
    fit(nll_, static_cast<size_t>(rows));
    for (int r0 = 0; r0 < rows; r0 += chunk) {
      const int k = std::min(chunk, rows - r0);
      K::matmul_forward(logits_.data(), h_.data() + static_cast<size_t>(r0) * C, t(head_), nullptr,
                        1, k, C, V);
      K::crossentropy_forward_backward(static_cast<float*>(nullptr), nll_.data() + r0,
                                       logits_.data(), tok_.data() + r0 + 1, 1.0f, k, V, V);
    }
    rt_->copy_to_host(nll, nll_.data(), static_cast<size_t>(rows) * sizeof(float));
  }

 private:
  explicit GptInferenceOn(Runtime* rt) : rt_(rt) {}

  const float* t(int index) const { return w_[static_cast<size_t>(index)].data(); }
  const float* tb(int index) const { return index < 0 ? nullptr : t(index); }  // a bias or none
  // Grows `a` to at least n elements (the contents are not kept).
  template <typename T>
  void fit(DeviceArray<T>& a, size_t n) {
    if (a.size() < n) a.reset(rt_, n, "inference activations");
  }
  void upload(const int32_t* tokens, int n) {
    fit(tok_, static_cast<size_t>(n));
    rt_->copy_to_device(tok_.data(), tokens, static_cast<size_t>(n) * sizeof(int32_t));
  }

  // The final norm's output (n, C) of tokens (device) at positions p0.. (attention over `cache`
  // when given, its rows written at p0.., else causal attention among the n tokens).
  void hidden(const int32_t* tokens, int n, Cache* cache, float* out) {
    const int C = static_cast<int>(m_.d_model), NH = static_cast<int>(m_.n_heads);
    const int NKV = static_cast<int>(m_.kv_heads()), hs = static_cast<int>(m_.head_dim());
    const int QKV = static_cast<int>(m_.qkv_width());
    const int F = static_cast<int>(m_.ffn()), FC = m_.llama() ? 2 * F : F;
    const bool llama = m_.llama();
    const int p0 = cache ? static_cast<int>(cache->len) : 0;
    KILN_CHECK(n > 0 && p0 + n <= (cache ? cache->capacity : m_.seq_len),
               "GptInference: positions past the cache or seq_len");
    const size_t nc = static_cast<size_t>(n) * C, nn = static_cast<size_t>(n);
    for (auto* b : {&x_, &x2_, &ln_, &att_, &proj_}) fit(*b, nc);
    if (!cache) fit(qkv_, nn * QKV);
    fit(fc_, nn * FC);
    fit(act_, nn * F);
    fit(lse_, static_cast<size_t>(NH) * n);
    if (cache && p0 > 0) fit(scores_, nn * NH * static_cast<size_t>(p0 + n));
    K::encoder_forward(x_.data(), tokens, nullptr, t(wte_),
                       llama ? nullptr : t(wpe_) + static_cast<size_t>(p0) * C, 1, n, C);
    const float eps = m_.norm_eps;
    // Norm: LayerNorm (gpt2) or RMSNorm (llama).
    auto norm = [&](float* y, const float* x, int w, int b) {
      if (llama) {
        K::rmsnorm_forward(y, static_cast<float*>(nullptr), x, t(w), eps, 1, n, C);
      } else {
        K::layernorm_forward(y, static_cast<float*>(nullptr), static_cast<float*>(nullptr), x, t(w),
                             t(b), 1, n, C);
      }
    };
    for (size_t l = 0; l < blocks_.size(); ++l) {
      const BlockTensors& b = blocks_[l];
      // With a cache, the rows are made in place at their positions: they are the cache.
      float* qkv = cache ? cache->rows[l].data() + static_cast<size_t>(p0) * QKV : qkv_.data();
      norm(ln_.data(), x_.data(), b.ln1_w, b.ln1_b);
      K::matmul_forward(qkv, ln_.data(), t(b.qkv_w), tb(b.qkv_b), 1, n, C, QKV);
      if (llama) {  // rotate q and k at their positions before k is read
        if (p0 == 0) {
          K::rope_forward(qkv, static_cast<const int32_t*>(nullptr),
                          static_cast<float>(m_.rope_theta), 1, n, NH, NKV, hs);
        } else {
          InferKernels<K>::rope_rows(qkv, n, p0, m_.rope_theta, NH, NKV, hs);
        }
      }
      if (p0 == 0) {  // the prompt (or a full forward): the training kernel
        if (llama) {
          K::attention_gqa_forward(att_.data(), lse_.data(), qkv,
                                   static_cast<const int32_t*>(nullptr), 1, n, NH, NKV, hs);
        } else {
          K::attention_forward(att_.data(), lse_.data(), qkv, 1, n, C, NH);
        }
      } else {
        InferKernels<K>::cached_attention(att_.data(), cache->rows[l].data(), scores_.data(), p0, n,
                                          NH, NKV, hs);
      }
      K::matmul_forward(proj_.data(), att_.data(), t(b.attn_proj_w), tb(b.attn_proj_b), 1, n, C, C);
      K::residual_forward(x2_.data(), x_.data(), proj_.data(), nc);
      norm(ln_.data(), x2_.data(), b.ln2_w, b.ln2_b);
      K::matmul_forward(fc_.data(), ln_.data(), t(b.fc_w), tb(b.fc_b), 1, n, C, FC);
      if (llama) {
        K::swiglu_forward(act_.data(), fc_.data(), nn, F);
      } else {
        K::gelu_forward(act_.data(), fc_.data(), nn * F);
      }
      K::matmul_forward(proj_.data(), act_.data(), t(b.fc_proj_w), tb(b.fc_proj_b), 1, n, F, C);
      K::residual_forward(x_.data(), x2_.data(), proj_.data(), nc);
    }
    if (cache) cache->len += n;
    norm(out, x_.data(), lnf_w_, lnf_b_);
  }

  Runtime* rt_;
  std::vector<DeviceArray<float>> w_;  // per ParamStore tensor, whole
  std::vector<BlockTensors> blocks_;
  int wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, head_ = 0;  // head_: wte_ when tied
  // Activations, grown to the largest n seen.
  DeviceArray<float> x_, x2_, ln_, qkv_, att_, lse_, proj_, fc_, act_, scores_, h_, logits_, nll_;
  DeviceArray<int32_t> tok_;
};

}  // namespace kiln::engine::detail
