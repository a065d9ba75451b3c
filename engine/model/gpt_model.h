// Internal to engine/model/: the decoder's implementation (gpt2 and llama blocks, model.h), a
// template over the kernel backend
// type K (kiln::CpuBackend / kiln::CudaBackend) and the storage type T. engine/model/model.cc
// instantiates it for the CPU kernels, engine/device/cuda_module.cc (in libkiln_cuda.so) for the
// CUDA ones, so the CUDA kernels are only linked into the CUDA module. Everyone else uses
// engine/model/model.h.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/model/model.h"
#include "engine/parallel/tensor_parallel.h"

namespace kiln::engine::detail {

// Sizes (elements) of one block's activations, per micro-batch, on one of tp tensor-parallel
// ranks: btca (attention output), btqkv (q, k, v), btf (MLP hidden) and btfc (the MLP's first
// layer: btf for gpt2, 2 btf for llama's gate and up) are split, btc (residual stream) is not.
struct BlockSizes {
  size_t btc, bt, lse, btca, btqkv, btf, btfc;
  BlockSizes(const ModelConfig& m, int64_t B, int64_t tp = 1) {
    bt = static_cast<size_t>(B * m.seq_len);
    btc = bt * static_cast<size_t>(m.d_model);
    lse = static_cast<size_t>(B * m.n_heads * m.seq_len / tp);
    btca = bt * static_cast<size_t>(m.n_heads * m.head_dim() / tp);
    btqkv = bt * static_cast<size_t>(m.qkv_width() / tp);
    btf = bt * static_cast<size_t>(m.ffn() / tp);
    btfc = m.llama() ? 2 * btf : btf;
  }
  // T-typed values kept per block: ln1, qkv, atty, res2, ln2, fch, gelu (the MLP's activation:
  // GELU or SwiGLU). fp32 statistics: ln1/ln2 mean+rstd (4 x bt; RMSNorm uses the rstd slots)
  // and the attention logsumexp.
};

// The head works on the logits of this many bytes at a time, unless asked otherwise: ~8 MiB on
// the CPU (the chunk stays in cache); up to 1 GiB on a GPU, where a chunk must be wide enough for
// the tensor cores and each chunk's weight-gradient GEMM reads and writes the whole fp32 dwte
// (154 MB for GPT-2), so few chunks.
inline size_t head_chunk_bytes(Device d) {
  return d == Device::kCpu ? size_t{8} << 20 : size_t{1} << 30;
}

// vocab: the logits' width (this rank's part of the vocabulary).
inline size_t head_rows(const ModelConfig& m, int64_t B, size_t elem, int64_t requested,
                        size_t vocab, Device device) {
  const size_t bt = static_cast<size_t>(B * m.seq_len);
  if (requested > 0) return std::min<size_t>(bt, static_cast<size_t>(requested));
  const size_t target = head_chunk_bytes(device) / (vocab * elem);
  return std::clamp<size_t>(target, 1, bt);
}

inline size_t elem_size(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

// K: the kernel backend (kiln::CpuBackend / kiln::CudaBackend), T: the storage type. Memory comes
// from the ParamStore's Runtime.
template <class K, typename T>
class GptModel final : public Model {
 public:
  GptModel(ParamStore* params, int64_t B, Recompute mode, int64_t head_chunk, TensorParallel* tp)
      : p_(params),
        rt_(&params->runtime()),
        m_(params->model()),
        B_(B),
        mode_(mode),
        tp_(tp),
        ntp_(tp ? tp->size() : 1),
        s_(m_, B, ntp_) {
    KILN_CHECK(params->tp_shard().size == ntp_, "Model: the ParamStore is split for another tp");
    const size_t L = static_cast<size_t>(m_.n_layers);
    const size_t e = sizeof(T);
    head_rows_ = head_rows(m_, B, e, head_chunk, static_cast<size_t>(V()), rt_->device());
    x_.resize(L + 1);
    for (auto& x : x_) x.reset(rt_, s_.btc);
    // Kept-or-recomputed block buffers: one set per block, or one shared set.
    const size_t rest_sets = mode == Recompute::kFull ? 1 : L;
    const size_t sel_sets = mode == Recompute::kNone ? L : 1;
    rest_.resize(rest_sets);
    for (auto& r : rest_) {
      r.ln1.reset(rt_, s_.btc);
      r.qkv.reset(rt_, s_.btqkv);
      r.res2.reset(rt_, s_.btc);
      r.ln2.reset(rt_, s_.btc);
      r.fch.reset(rt_, s_.btfc);
      r.stats.reset(rt_, 4 * s_.bt);
    }
    sel_.resize(sel_sets);
    for (auto& r : sel_) {
      r.atty.reset(rt_, s_.btca);
      r.gelu.reset(rt_, s_.btf);
      r.lse.reset(rt_, s_.lse);
    }
    lnf_.reset(rt_, s_.btc);
    lnf_stats_.reset(rt_, 2 * s_.bt);
    proj_.reset(rt_, s_.btc);
    dres_.reset(rt_, s_.btc);
    dlnf_.reset(rt_, s_.btc);
    dbtc1_.reset(rt_, s_.btc);
    dbtc2_.reset(rt_, s_.btc);
    dqkv_.reset(rt_, s_.btqkv);
    dfch_.reset(rt_, s_.btfc);
    if (!fused_gelu()) dgelu_.reset(rt_, s_.btf);
    logits_.reset(rt_, head_rows_ * static_cast<size_t>(V()));
    mem_ = plan_activation_memory(m_, B, params->precision(), mode, ntp_, rt_->device());
    mem_.working_bytes += logits_.bytes();
    mem_.working_bytes -= head_rows(m_, B, e, 0, V(), rt_->device()) * static_cast<size_t>(V()) * e;
    embed_unit_ = unit_of(p_->wte());
    final_unit_ = unit_of(p_->lnf_w());
    head_unit_ = unit_of(p_->lm_head());
    for (size_t l = 0; l < L; ++l)
      block_units_.push_back(unit_of(p_->block(static_cast<int>(l)).ln1_w));
  }

  void forward_backward(const int32_t* inputs, const int32_t* targets, float dloss, float* losses,
                        const int32_t* doc_start) override {
    doc_ = m_.doc_mask ? doc_start : nullptr;
    KILN_CHECK(!m_.doc_mask || doc_start, "Model: model.doc_mask without document starts");
    begin_pass(true);
    forward_blocks(inputs);
    head(targets, losses, dloss, /*backward=*/true);
    backward_blocks(inputs);
    if (hooks_) hooks_->end_pass();
  }

  void forward(const int32_t* inputs, const int32_t* targets, float* losses,
               const int32_t* doc_start) override {
    doc_ = m_.doc_mask ? doc_start : nullptr;
    KILN_CHECK(!m_.doc_mask || doc_start, "Model: model.doc_mask without document starts");
    begin_pass(false);
    forward_blocks(inputs);
    head(targets, losses, 0.0f, /*backward=*/false);
    if (hooks_) hooks_->end_pass();
  }

  ActivationMemory activation_memory() const override { return mem_; }
  int64_t micro_batch() const override { return B_; }
  Recompute recompute() const override { return mode_; }

 private:
  // The MLP's GEMM + GELU as one operator each where the backend fuses them (kernels/ops.h
  // traits: CUDA's cuBLASLt epilogues); the separate operators otherwise. GPT-2 with biases only
  // (the fused operators take a bias; llama's SwiGLU has no such fusion).
  static constexpr bool kFusedGelu = K::kFusedGemmGelu;
  bool fused_gelu() const { return kFusedGelu && !m_.llama() && m_.bias; }

  struct RestBuffers {  // kept by none and selective
    DeviceArray<T> ln1, qkv, res2, ln2, fch;
    DeviceArray<float> stats;  // ln1 mean, ln1 rstd, ln2 mean, ln2 rstd (bt each)
  };
  struct SelBuffers {  // kept only by none
    DeviceArray<T> atty, gelu;
    DeviceArray<float> lse;
  };
  struct Acts {
    T *ln1, *qkv, *atty, *res2, *ln2, *fch, *gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
  };

  Acts acts(size_t l) {
    RestBuffers& r = rest_[rest_.size() == 1 ? 0 : l];
    SelBuffers& s = sel_[sel_.size() == 1 ? 0 : l];
    float* st = r.stats.data();
    return Acts{r.ln1.data(), r.qkv.data(),   s.atty.data(),  r.res2.data(),
                r.ln2.data(), r.fch.data(),   s.gelu.data(),  st,
                st + s_.bt,   st + 2 * s_.bt, st + 3 * s_.bt, s.lse.data()};
  }

  // Tensor t's working copy, nullptr for a tensor the model does not have (t < 0: a bias of a
  // model without biases, a LayerNorm bias in llama).
  T* w(int t) { return t < 0 ? nullptr : p_->work<T>(t); }
  int unit_of(int t) const { return p_->tensors()[t].unit; }

  // UnitHooks (model.h): the units in the order forward / forward_backward acquire them.
  void begin_pass(bool backward) {
    if (!hooks_) return;
    std::vector<int> order{embed_unit_};
    order.insert(order.end(), block_units_.begin(), block_units_.end());
    order.push_back(final_unit_);
    if (tied()) {  // the LM head is wte; its backward then needs the final norm
      order.push_back(embed_unit_);
      if (backward) order.push_back(final_unit_);
    } else {  // the LM head and the final norm's backward in the final unit
      order.push_back(final_unit_);
    }
    if (backward) {
      order.insert(order.end(), block_units_.rbegin(), block_units_.rend());
      if (!tied()) order.push_back(embed_unit_);  // the embedding's gradient
    }
    hooks_->begin_pass(order);
  }
  void acquire(int unit, bool backward) {
    if (hooks_) hooks_->acquire(unit, backward);
  }
  void release(int unit) {
    if (hooks_) hooks_->release(unit);
  }
  void gradients_ready(int unit) {
    if (hooks_) hooks_->gradients_ready(unit);
  }
  float* g(int t) { return t < 0 ? nullptr : p_->grad(t); }
  bool tied() const { return head_unit_ == embed_unit_; }

  int B() const { return static_cast<int>(B_); }
  int Tn() const { return static_cast<int>(m_.seq_len); }
  int C() const { return static_cast<int>(m_.d_model); }
  // This rank's share under tensor parallelism (the whole without): attention channels and
  // heads, MLP hidden units, vocabulary.
  int CA() const { return static_cast<int>(m_.n_heads * m_.head_dim() / ntp_); }
  int NH() const { return static_cast<int>(m_.n_heads / ntp_); }
  int NKV() const { return static_cast<int>(m_.kv_heads() / ntp_); }
  int HS() const { return static_cast<int>(m_.head_dim()); }
  int QKV() const { return static_cast<int>(m_.qkv_width() / ntp_); }
  int F() const { return static_cast<int>(m_.ffn() / ntp_); }
  int FC() const { return m_.llama() ? 2 * F() : F(); }
  int V() const { return static_cast<int>(m_.vocab_size / ntp_); }
  // Tensor parallelism's sum over the group (Megatron's g in forward, f in backward).
  void tp_sum(DeviceArray<T>& x) {
    if (tp_) tp_->allreduce<K>(*rt_, x.data(), x.size());
  }
  // A row-parallel layer's bias, counted once in the sum over the group.
  const T* row_bias(int t) { return tp_ ? tp_->row_bias(w(t)) : w(t); }

  // The block's norms: LayerNorm (gpt2; mean and rstd kept) or RMSNorm (llama; rstd kept).
  void norm_forward(T* out, float* mean, float* rstd, const T* x, int wt, int bt) {
    if (m_.llama()) {
      K::rmsnorm_forward(out, rstd, x, w(wt), m_.norm_eps, B(), Tn(), C());
    } else {
      K::layernorm_forward(out, mean, rstd, x, w(wt), w(bt), B(), Tn(), C());
    }
  }
  void norm_backward(T* dx, const T* dout, const T* x, int wt, int bt, const float* mean,
                     const float* rstd) {
    if (m_.llama()) {
      K::rmsnorm_backward(dx, g(wt), dout, x, w(wt), rstd, B(), Tn(), C());
    } else {
      K::layernorm_backward(dx, g(wt), g(bt), dout, x, w(wt), mean, rstd, B(), Tn(), C());
    }
  }
  // Attention from the block's qkv: GPT-2 multi-head attention keeps its own operator (and its
  // CUDA tensor-core path); grouped-query heads or the document mask take the general one.
  bool general_attention() const { return m_.llama() || NKV() != NH() || doc_ != nullptr; }
  void attention(T* out, float* lse, const T* qkv) {
    if (general_attention()) {
      K::attention_gqa_forward(out, lse, qkv, doc_, B(), Tn(), NH(), NKV(), HS());
    } else {
      K::attention_forward(out, lse, qkv, B(), Tn(), CA(), NH());
    }
  }
  void attention_grad(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse) {
    if (general_attention()) {
      K::attention_gqa_backward(dqkv, dout, qkv, out, lse, doc_, B(), Tn(), NH(), NKV(), HS());
    } else {
      K::attention_backward(dqkv, dout, qkv, out, lse, B(), Tn(), CA(), NH());
    }
  }
  // The MLP's activation: GELU of fch (gpt2) or SwiGLU of its gate and up halves (llama).
  void mlp_act(T* out, const T* fch) {
    if (m_.llama()) {
      K::swiglu_forward(out, fch, s_.bt, F());
    } else {
      K::gelu_forward(out, fch, s_.btf);
    }
  }

  // Whether the kernel backend fuses residual + layernorm into one pass (kernels/ops.h traits).
  static constexpr bool kFusedResidualLn = K::kFusedResidualLayernorm;
  // A block's last residual fused with the next layernorm (block l+1's ln1, or ln_f after the
  // last block): only with the fused operator and without unit hooks (ZeRO-3 gathers a unit's
  // weights when it starts, so the next unit's layernorm weights are not at hand yet).
  bool fuse_next_layernorm() const { return kFusedResidualLn && hooks_ == nullptr && !m_.llama(); }

  // res = a + b, then out = layernorm(res) (one pass where the backend fuses them).
  void residual_layernorm(T* res, T* out, float* mean, float* rstd, const T* a, const T* b,
                          const T* weight, const T* bias) {
    K::residual_layernorm_forward(res, out, mean, rstd, a, b, weight, bias, B(), Tn(), C());
  }

  // Block l from x_[l]; writes x_[l+1] unless `recompute` (which stops after the GELU).
  // ln1_done: the previous block's last residual already wrote this block's ln1 (forward_blocks).
  void block_forward(size_t l, bool recompute, bool ln1_done = false) {
    const BlockTensors& bt = p_->block(static_cast<int>(l));
    Acts a = acts(l);
    const T* x = x_[l].data();
    if (!ln1_done) norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, bt.ln1_w, bt.ln1_b);
    K::matmul_forward(a.qkv, a.ln1, w(bt.qkv_w), w(bt.qkv_b), B(), Tn(), C(), QKV());
    if (m_.llama()) K::rope_forward(a.qkv, doc_, rope_theta(), B(), Tn(), NH(), NKV(), HS());
    attention(a.atty, a.lse, a.qkv);
    K::matmul_forward(proj_.data(), a.atty, w(bt.attn_proj_w), row_bias(bt.attn_proj_b), B(), Tn(),
                      CA(), C());
    tp_sum(proj_);
    if (m_.llama()) {
      K::residual_forward(a.res2, x, proj_.data(), s_.btc);
      norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, bt.ln2_w, bt.ln2_b);
    } else {
      residual_layernorm(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, proj_.data(), w(bt.ln2_w),
                         w(bt.ln2_b));
    }
    if (fused_gelu()) {  // one GEMM with the GELU in its epilogue (CUDA)
      K::matmul_gelu_forward(a.gelu, a.fch, a.ln2, w(bt.fc_w), w(bt.fc_b), B(), Tn(), C(), F());
    } else {
      K::matmul_forward(a.fch, a.ln2, w(bt.fc_w), w(bt.fc_b), B(), Tn(), C(), FC());
      mlp_act(a.gelu, a.fch);
    }
    if (recompute) return;
    K::matmul_forward(proj_.data(), a.gelu, w(bt.fc_proj_w), row_bias(bt.fc_proj_b), B(), Tn(), F(),
                      C());
    tp_sum(proj_);
    if (!fuse_next_layernorm()) {
      K::residual_forward(x_[l + 1].data(), a.res2, proj_.data(), s_.btc);
    } else if (l + 2 < x_.size()) {  // x_{l+1} and block l+1's ln1 in one pass
      const BlockTensors& next = p_->block(static_cast<int>(l + 1));
      Acts n =
          acts(l + 1);  // (with full recomputation the same buffers: block l is done with them)
      residual_layernorm(x_[l + 1].data(), n.ln1, n.ln1_mean, n.ln1_rstd, a.res2, proj_.data(),
                         w(next.ln1_w), w(next.ln1_b));
    } else {  // x_L and ln_f
      residual_layernorm(x_[l + 1].data(), lnf_.data(), lnf_stats_.data(),
                         lnf_stats_.data() + s_.bt, a.res2, proj_.data(), w(p_->lnf_w()),
                         w(p_->lnf_b()));
    }
  }

  void forward_blocks(const int32_t* inputs) {
    acquire(embed_unit_, false);
    if (tp_) {
      tp_->embedding_forward<K>(*rt_, x_[0].data(), inputs, doc_, w(p_->wte()), w(p_->wpe()), B(),
                                Tn(), C());
    } else {  // (no wpe with rotary positions; positions restart at document starts with doc_)
      K::encoder_forward(x_[0].data(), inputs, doc_, w(p_->wte()), w(p_->wpe()), B(), Tn(), C());
    }
    release(embed_unit_);
    const bool fused = fuse_next_layernorm();
    for (size_t l = 0; l < x_.size() - 1; ++l) {
      acquire(block_units_[l], false);
      block_forward(l, false, /*ln1_done=*/fused && l > 0);
      release(block_units_[l]);
    }
    acquire(final_unit_, false);
    if (!fused || x_.size() == 1) {
      norm_forward(lnf_.data(), lnf_stats_.data(), lnf_stats_.data() + s_.bt, x_.back().data(),
                   p_->lnf_w(), p_->lnf_b());
    }
    release(final_unit_);
  }

  // LM head + cross-entropy in row chunks; with backward, also dlnf and dwte, then d(x_L).
  void head(const int32_t* targets, float* losses, float dloss, bool backward) {
    const int V = this->V();
    const size_t bt = s_.bt;
    // The head's weight: wte (tied, in the embedding unit) or lm_head (in the final unit, which
    // the final norm's backward needs anyway).
    if (tied()) acquire(embed_unit_, backward);
    if (backward || !tied()) acquire(final_unit_, backward);
    T* wte = w(p_->lm_head());
    if (backward) zero(dlnf_);
    for (size_t r0 = 0; r0 < bt; r0 += head_rows_) {
      const int n = static_cast<int>(std::min(head_rows_, bt - r0));
      const T* in = lnf_.data() + r0 * C();
      K::matmul_forward(logits_.data(), in, wte, nullptr, 1, n, C(), V);
      if (tp_) {  // vocabulary-parallel: this rank's logits and per-row statistics
        tp_->crossentropy<K>(*rt_, backward ? logits_.data() : nullptr, losses + r0, logits_.data(),
                             targets + r0, dloss, n);
      } else {
        K::crossentropy_forward_backward(backward ? logits_.data() : nullptr, losses + r0,
                                         logits_.data(), targets + r0, dloss, n, V, V);
      }
      if (backward) {
        K::matmul_backward(dlnf_.data() + r0 * C(), g(p_->lm_head()), nullptr, logits_.data(), in,
                           wte, 1, n, C(), V);
      }
    }
    if (tied()) release(embed_unit_);
    if (!backward) {
      if (!tied()) release(final_unit_);
      return;
    }
    tp_sum(dlnf_);
    zero(dres_);
    norm_backward(dres_.data(), dlnf_.data(), x_.back().data(), p_->lnf_w(), p_->lnf_b(),
                  lnf_stats_.data(), lnf_stats_.data() + s_.bt);
    release(final_unit_);
    gradients_ready(final_unit_);
  }

  // dres_ holds d(x_L) on entry and d(x_0) on exit; parameter gradients accumulate.
  void backward_blocks(const int32_t* inputs) {
    for (size_t l = x_.size() - 1; l-- > 0;) {
      const BlockTensors& bt = p_->block(static_cast<int>(l));
      acquire(block_units_[l], true);
      if (mode_ == Recompute::kFull) {
        block_forward(l, true);
      }
      Acts a = acts(l);
      if (mode_ == Recompute::kSelective) {
        attention(a.atty, a.lse, a.qkv);
        mlp_act(a.gelu, a.fch);
      }
      const T* x = x_[l].data();
      // MLP: res3 = res2 + proj(act(fc(ln2(res2)))), act GELU or SwiGLU.
      if (fused_gelu()) {  // the GELU's derivative in the GEMM's epilogue (CUDA)
        K::matmul_dgelu_backward(dfch_.data(), g(bt.fc_proj_w), g(bt.fc_proj_b), dres_.data(),
                                 a.gelu, w(bt.fc_proj_w), a.fch, B(), Tn(), F(), C());
      } else {
        zero(dgelu_);
        K::matmul_backward(dgelu_.data(), g(bt.fc_proj_w), g(bt.fc_proj_b), dres_.data(), a.gelu,
                           w(bt.fc_proj_w), B(), Tn(), F(), C());
        zero(dfch_);
        if (m_.llama()) {
          K::swiglu_backward(dfch_.data(), a.fch, dgelu_.data(), s_.bt, F());
        } else {
          K::gelu_backward(dfch_.data(), a.fch, dgelu_.data(), s_.btf);
        }
      }
      zero(dbtc1_);
      K::matmul_backward(dbtc1_.data(), g(bt.fc_w), g(bt.fc_b), dfch_.data(), a.ln2, w(bt.fc_w),
                         B(), Tn(), C(), FC());
      tp_sum(dbtc1_);
      norm_backward(dres_.data(), dbtc1_.data(), a.res2, bt.ln2_w, bt.ln2_b, a.ln2_mean,
                    a.ln2_rstd);
      // Attention: res2 = x + proj(attn(rope(qkv(ln1(x))))).
      zero(dbtc1_);
      K::matmul_backward(dbtc1_.data(), g(bt.attn_proj_w), g(bt.attn_proj_b), dres_.data(), a.atty,
                         w(bt.attn_proj_w), B(), Tn(), CA(), C());
      zero(dqkv_);
      attention_grad(dqkv_.data(), dbtc1_.data(), a.qkv, a.atty, a.lse);
      if (m_.llama())
        K::rope_backward(dqkv_.data(), doc_, rope_theta(), B(), Tn(), NH(), NKV(), HS());
      zero(dbtc2_);
      K::matmul_backward(dbtc2_.data(), g(bt.qkv_w), g(bt.qkv_b), dqkv_.data(), a.ln1, w(bt.qkv_w),
                         B(), Tn(), C(), QKV());
      tp_sum(dbtc2_);
      norm_backward(dres_.data(), dbtc2_.data(), x, bt.ln1_w, bt.ln1_b, a.ln1_mean, a.ln1_rstd);
      release(block_units_[l]);
      gradients_ready(block_units_[l]);
    }
    if (!tied()) acquire(embed_unit_, true);  // (tied: the head acquired it for its gradient)
    if (tp_) {
      tp_->embedding_backward<K>(*rt_, g(p_->wte()), g(p_->wpe()), dres_.data(), inputs, doc_, B(),
                                 Tn(), C());
    } else {
      K::encoder_backward(g(p_->wte()), g(p_->wpe()), dres_.data(), inputs, doc_, B(), Tn(), C());
    }
    if (!tied()) release(embed_unit_);
    gradients_ready(embed_unit_);
  }

  float rope_theta() const { return static_cast<float>(m_.rope_theta); }

  template <typename U>
  static void zero(DeviceArray<U>& b) {
    b.zero();
  }

  ParamStore* p_;
  Runtime* rt_;
  ModelConfig m_;
  int64_t B_;
  Recompute mode_;
  TensorParallel* tp_;  // nullptr without tensor parallelism
  int64_t ntp_;
  BlockSizes s_;
  size_t head_rows_ = 0;
  std::vector<DeviceArray<T>> x_;
  std::vector<RestBuffers> rest_;
  std::vector<SelBuffers> sel_;
  DeviceArray<T> lnf_, proj_, dres_, dlnf_, dbtc1_, dbtc2_, dqkv_, dfch_, dgelu_, logits_;
  DeviceArray<float> lnf_stats_;
  ActivationMemory mem_;
  int embed_unit_ = 0, final_unit_ = 0, head_unit_ = 0;
  const int32_t* doc_ = nullptr;  // this pass's document starts (B, T), nullptr without the mask
  std::vector<int> block_units_;
};

// The model for kernel backend K in the ParamStore's precision.
template <class K>
std::unique_ptr<Model> create_on(ParamStore* params, int64_t micro_batch, Recompute mode,
                                 int64_t head_chunk_rows, TensorParallel* tp) {
  switch (params->precision()) {
    case Precision::kFp32:
      return std::make_unique<GptModel<K, float>>(params, micro_batch, mode, head_chunk_rows, tp);
    case Precision::kBf16:
      return std::make_unique<GptModel<K, bf16>>(params, micro_batch, mode, head_chunk_rows, tp);
    case Precision::kFp16:
      return std::make_unique<GptModel<K, fp16>>(params, micro_batch, mode, head_chunk_rows, tp);
  }
  return nullptr;
}

}  // namespace kiln::engine::detail
