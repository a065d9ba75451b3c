// Internal to engine/model/: the GPT model's implementation, a template over the kernel backend
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
// ranks: btca (attention channels) and btf (MLP hidden) are split, btc (residual stream) is not.
struct BlockSizes {
  size_t btc, bt, lse, btca, btf;
  BlockSizes(const ModelConfig& m, int64_t B, int64_t tp = 1) {
    bt = static_cast<size_t>(B * m.seq_len);
    btc = bt * static_cast<size_t>(m.d_model);
    lse = static_cast<size_t>(B * m.n_heads * m.seq_len / tp);
    btca = btc / static_cast<size_t>(tp);
    btf = 4 * btc / static_cast<size_t>(tp);
  }
  // T-typed values kept per block: ln1 1, qkv 3, atty 1, res2 1, ln2 1, fch 4, gelu 4 (x btc).
  // fp32 statistics: ln1/ln2 mean+rstd (4 x bt) and the attention logsumexp.
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
      r.qkv.reset(rt_, 3 * s_.btca);
      r.res2.reset(rt_, s_.btc);
      r.ln2.reset(rt_, s_.btc);
      r.fch.reset(rt_, s_.btf);
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
    dqkv_.reset(rt_, 3 * s_.btca);
    dfch_.reset(rt_, s_.btf);
    if constexpr (!kFusedGelu) dgelu_.reset(rt_, s_.btf);
    logits_.reset(rt_, head_rows_ * static_cast<size_t>(V()));
    mem_ = plan_activation_memory(m_, B, params->precision(), mode, ntp_, rt_->device());
    mem_.working_bytes += logits_.bytes();
    mem_.working_bytes -= head_rows(m_, B, e, 0, V(), rt_->device()) * static_cast<size_t>(V()) * e;
    embed_unit_ = unit_of(p_->wte());
    final_unit_ = unit_of(p_->lnf_w());
    for (size_t l = 0; l < L; ++l)
      block_units_.push_back(unit_of(p_->block(static_cast<int>(l)).ln1_w));
  }

  void forward_backward(const int32_t* inputs, const int32_t* targets, float dloss,
                        float* losses) override {
    begin_pass(true);
    forward_blocks(inputs);
    head(targets, losses, dloss, /*backward=*/true);
    backward_blocks(inputs);
    if (hooks_) hooks_->end_pass();
  }

  void forward(const int32_t* inputs, const int32_t* targets, float* losses) override {
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
  // traits: CUDA's cuBLASLt epilogues); the separate operators otherwise.
  static constexpr bool kFusedGelu = K::kFusedGemmGelu;

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

  T* w(int t) { return p_->work<T>(t); }
  int unit_of(int t) const { return p_->tensors()[t].unit; }

  // UnitHooks (model.h): the units in the order forward / forward_backward acquire them.
  void begin_pass(bool backward) {
    if (!hooks_) return;
    std::vector<int> order{embed_unit_};
    order.insert(order.end(), block_units_.begin(), block_units_.end());
    order.push_back(final_unit_);
    order.push_back(embed_unit_);  // the tied LM head
    if (backward) {
      order.push_back(final_unit_);
      order.insert(order.end(), block_units_.rbegin(), block_units_.rend());
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
  float* g(int t) { return p_->grad(t); }

  int B() const { return static_cast<int>(B_); }
  int Tn() const { return static_cast<int>(m_.seq_len); }
  int C() const { return static_cast<int>(m_.d_model); }
  // This rank's share under tensor parallelism (the whole without): attention channels and
  // heads, MLP hidden units, vocabulary.
  int CA() const { return static_cast<int>(m_.d_model / ntp_); }
  int NH() const { return static_cast<int>(m_.n_heads / ntp_); }
  int F() const { return static_cast<int>(4 * m_.d_model / ntp_); }
  int V() const { return static_cast<int>(m_.vocab_size / ntp_); }
  // Tensor parallelism's sum over the group (Megatron's g in forward, f in backward).
  void tp_sum(DeviceArray<T>& x) {
    if (tp_) tp_->allreduce<K>(*rt_, x.data(), x.size());
  }
  // A row-parallel layer's bias, counted once in the sum over the group.
  const T* row_bias(int t) { return tp_ ? tp_->row_bias(w(t)) : w(t); }

  // Whether the kernel backend fuses residual + layernorm into one pass (kernels/ops.h traits).
  static constexpr bool kFusedResidualLn = K::kFusedResidualLayernorm;
  // A block's last residual fused with the next layernorm (block l+1's ln1, or ln_f after the
  // last block): only with the fused operator and without unit hooks (ZeRO-3 gathers a unit's
  // weights when it starts, so the next unit's layernorm weights are not at hand yet).
  bool fuse_next_layernorm() const { return kFusedResidualLn && hooks_ == nullptr; }

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
    if (!ln1_done) {
      K::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w(bt.ln1_w), w(bt.ln1_b), B(), Tn(),
                           C());
    }
    K::matmul_forward(a.qkv, a.ln1, w(bt.qkv_w), w(bt.qkv_b), B(), Tn(), C(), 3 * CA());
    K::attention_forward(a.atty, a.lse, a.qkv, B(), Tn(), CA(), NH());
    K::matmul_forward(proj_.data(), a.atty, w(bt.attn_proj_w), row_bias(bt.attn_proj_b), B(), Tn(),
                      CA(), C());
    tp_sum(proj_);
    residual_layernorm(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x, proj_.data(), w(bt.ln2_w),
                       w(bt.ln2_b));
    if constexpr (kFusedGelu) {  // one GEMM with the GELU in its epilogue (CUDA)
      K::matmul_gelu_forward(a.gelu, a.fch, a.ln2, w(bt.fc_w), w(bt.fc_b), B(), Tn(), C(), F());
    } else {
      K::matmul_forward(a.fch, a.ln2, w(bt.fc_w), w(bt.fc_b), B(), Tn(), C(), F());
      K::gelu_forward(a.gelu, a.fch, s_.btf);
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
      tp_->embedding_forward<K>(*rt_, x_[0].data(), inputs, w(p_->wte()), w(p_->wpe()), B(), Tn(),
                                C());
    } else {
      K::encoder_forward(x_[0].data(), inputs, w(p_->wte()), w(p_->wpe()), B(), Tn(), C());
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
      K::layernorm_forward(lnf_.data(), lnf_stats_.data(), lnf_stats_.data() + s_.bt,
                           x_.back().data(), w(p_->lnf_w()), w(p_->lnf_b()), B(), Tn(), C());
    }
    release(final_unit_);
  }

  // LM head + cross-entropy in row chunks; with backward, also dlnf and dwte, then d(x_L).
  void head(const int32_t* targets, float* losses, float dloss, bool backward) {
    const int V = this->V();
    const size_t bt = s_.bt;
    acquire(embed_unit_, backward);
    if (backward) acquire(final_unit_, true);
    T* wte = w(p_->wte());
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
        K::matmul_backward(dlnf_.data() + r0 * C(), g(p_->wte()), nullptr, logits_.data(), in, wte,
                           1, n, C(), V);
      }
    }
    release(embed_unit_);
    if (!backward) return;
    tp_sum(dlnf_);
    zero(dres_);
    K::layernorm_backward(dres_.data(), g(p_->lnf_w()), g(p_->lnf_b()), dlnf_.data(),
                          x_.back().data(), w(p_->lnf_w()), lnf_stats_.data(),
                          lnf_stats_.data() + s_.bt, B(), Tn(), C());
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
        K::attention_forward(a.atty, a.lse, a.qkv, B(), Tn(), CA(), NH());
        K::gelu_forward(a.gelu, a.fch, s_.btf);
      }
      const T* x = x_[l].data();
      // MLP: res3 = res2 + proj(gelu(fc(ln2(res2)))).
      if constexpr (kFusedGelu) {  // the GELU's derivative in the GEMM's epilogue (CUDA)
        K::matmul_dgelu_backward(dfch_.data(), g(bt.fc_proj_w), g(bt.fc_proj_b), dres_.data(),
                                 a.gelu, w(bt.fc_proj_w), a.fch, B(), Tn(), F(), C());
      } else {
        zero(dgelu_);
        K::matmul_backward(dgelu_.data(), g(bt.fc_proj_w), g(bt.fc_proj_b), dres_.data(), a.gelu,
                           w(bt.fc_proj_w), B(), Tn(), F(), C());
        zero(dfch_);
        K::gelu_backward(dfch_.data(), a.fch, dgelu_.data(), s_.btf);
      }
      zero(dbtc1_);
      K::matmul_backward(dbtc1_.data(), g(bt.fc_w), g(bt.fc_b), dfch_.data(), a.ln2, w(bt.fc_w),
                         B(), Tn(), C(), F());
      tp_sum(dbtc1_);
      K::layernorm_backward(dres_.data(), g(bt.ln2_w), g(bt.ln2_b), dbtc1_.data(), a.res2,
                            w(bt.ln2_w), a.ln2_mean, a.ln2_rstd, B(), Tn(), C());
      // Attention: res2 = x + proj(attn(qkv(ln1(x)))).
      zero(dbtc1_);
      K::matmul_backward(dbtc1_.data(), g(bt.attn_proj_w), g(bt.attn_proj_b), dres_.data(), a.atty,
                         w(bt.attn_proj_w), B(), Tn(), CA(), C());
      zero(dqkv_);
      K::attention_backward(dqkv_.data(), dbtc1_.data(), a.qkv, a.atty, a.lse, B(), Tn(), CA(),
                            NH());
      zero(dbtc2_);
      K::matmul_backward(dbtc2_.data(), g(bt.qkv_w), g(bt.qkv_b), dqkv_.data(), a.ln1, w(bt.qkv_w),
                         B(), Tn(), C(), 3 * CA());
      tp_sum(dbtc2_);
      K::layernorm_backward(dres_.data(), g(bt.ln1_w), g(bt.ln1_b), dbtc2_.data(), x, w(bt.ln1_w),
                            a.ln1_mean, a.ln1_rstd, B(), Tn(), C());
      release(block_units_[l]);
      gradients_ready(block_units_[l]);
    }
    if (tp_) {
      tp_->embedding_backward<K>(*rt_, g(p_->wte()), g(p_->wpe()), dres_.data(), inputs, B(), Tn(),
                                 C());
    } else {
      K::encoder_backward(g(p_->wte()), g(p_->wpe()), dres_.data(), inputs, B(), Tn(), C());
    }
    gradients_ready(embed_unit_);
  }

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
  int embed_unit_ = 0, final_unit_ = 0;
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
