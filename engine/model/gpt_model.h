// Internal to engine/model/: the decoder's implementation (gpt2 and llama blocks, model.h), a
// template over the kernel backend
// type K (kiln::CpuBackend / kiln::CudaBackend) and the storage type T. engine/model/model.cc
// instantiates it for the CPU kernels, engine/device/cuda_module.cc (in libkiln_cuda.so) for the
// CUDA ones, so the CUDA kernels are only linked into the CUDA module. Everyone else uses
// engine/model/model.h.
//
// One code path for the whole model and a pipeline stage (ParamStore::pp_stage()): the whole
// model is the stage that is both first and last, with one slot. A stage runs its blocks
// [first_block, end_block) ("local" block l is global block first_block + l); the first stage
// embeds, the last runs the final norm, the head and the loss. Buffers:
//   per slot   block inputs x[0 .. nb] (x[0]: stage_input on a later stage, x[nb]: stage_output
//              on an earlier one), the kept block buffers (rest: none and selective, sel: none),
//              the received output gradient (not the last stage) and the input gradient backward
//              runs on in place (not the first stage; on the last the head writes it)
//   shared     the recomputed buffers, the final norm's output (last stage), the working
//              gradients, the logits chunk; d(x) of the whole model (dres_)
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
  GptModel(ParamStore* params, int64_t B, Recompute mode, int64_t head_chunk, TensorParallel* tp,
           int slots)
      : p_(params),
        rt_(&params->runtime()),
        m_(params->model()),
        B_(B),
        mode_(mode),
        tp_(tp),
        ntp_(tp ? tp->size() : 1),
        s_(m_, B, ntp_),
        pp_(params->pp_stage()),
        nb_(static_cast<size_t>(pp_.end_block - pp_.first_block)),
        slots_(slots) {
    KILN_CHECK(params->tp_shard().size == ntp_, "Model: the ParamStore is split for another tp");
    KILN_CHECK(slots >= 1 && (pp_.size > 1 || slots == 1),
               "Model: pp_slots must be 1 without pipelining, at least 1 with it");
    stage_elems_ = s_.btc;
    const size_t S = static_cast<size_t>(slots);
    const size_t e = sizeof(T);
    head_rows_ = head_rows(m_, B, e, head_chunk, static_cast<size_t>(V()), rt_->device());
    x_.resize(S * (nb_ + 1));
    for (auto& x : x_) x.reset(rt_, s_.btc);
    // Kept-or-recomputed block buffers: one set per block and slot, or one shared set.
    const size_t rest_sets = mode == Recompute::kFull ? 1 : S * nb_;
    const size_t sel_sets = mode == Recompute::kNone ? S * nb_ : 1;
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
    // The gradients stages exchange, per slot: received (not the last stage) and sent (not the
    // first).
    if (!pp_.last()) {
      gout_.resize(S);
      for (auto& d : gout_) d.reset(rt_, s_.btc);
    }
    if (!pp_.first()) {
      din_.resize(S);
      for (auto& d : din_) d.reset(rt_, s_.btc);
    }
    if (pp_.last()) {
      lnf_.reset(rt_, s_.btc);
      lnf_stats_.reset(rt_, 2 * s_.bt);
    }
    proj_.reset(rt_, s_.btc);
    if (whole()) dres_.reset(rt_, s_.btc);
    if (pp_.last()) dlnf_.reset(rt_, s_.btc);
    dbtc1_.reset(rt_, s_.btc);
    dbtc2_.reset(rt_, s_.btc);
    dqkv_.reset(rt_, s_.btqkv);
    dfch_.reset(rt_, s_.btfc);
    if (!fused_gelu()) dgelu_.reset(rt_, s_.btf);
    if (pp_.last()) logits_.reset(rt_, head_rows_ * static_cast<size_t>(V()));
    mem_ =
        plan_activation_memory(m_, B, params->precision(), mode, ntp_, rt_->device(), pp_, slots);
    if (pp_.last()) {  // the plan's logits chunk is the default one
      mem_.working_bytes += logits_.bytes();
      mem_.working_bytes -=
          head_rows(m_, B, e, 0, V(), rt_->device()) * static_cast<size_t>(V()) * e;
    }
    forwarded_.assign(S, false);
    head_backward_.assign(S, false);
    embed_unit_ = unit_of(p_->wte());
    final_unit_ = unit_of(p_->lnf_w());
    head_unit_ = unit_of(p_->lm_head());
    for (size_t l = 0; l < nb_; ++l) block_units_.push_back(unit_of(p_->block(global(l)).ln1_w));
  }

  void forward_backward(const int32_t* inputs, const int32_t* targets, float dloss, float* losses,
                        const int32_t* doc_start) override {
    KILN_CHECK(whole(), "Model::forward_backward: a pipeline stage's model runs stage_forward");
    set_doc(doc_start);
    begin_pass(true);
    forward_blocks(0, inputs);
    head(0, targets, losses, dloss, /*backward=*/true);
    backward_blocks(0, inputs);
    if (hooks_) hooks_->end_pass();
  }

  void forward(const int32_t* inputs, const int32_t* targets, float* losses,
               const int32_t* doc_start) override {
    KILN_CHECK(whole(), "Model::forward: a pipeline stage's model runs stage_forward");
    set_doc(doc_start);
    begin_pass(false);
    forward_blocks(0, inputs);
    head(0, targets, losses, 0.0f, /*backward=*/false);
    if (hooks_) hooks_->end_pass();
  }

  // Pipeline stages (model.h). The same passes as forward_backward, split at the head on the last
  // stage and run on the slot's buffers; the whole model may run them too (slot 0).
  void stage_forward(int slot, const int32_t* inputs, const int32_t* targets, float* losses,
                     const int32_t* doc_start, float dloss, bool backward) override {
    check_stage_call(slot, "stage_forward");
    set_doc(doc_start);
    forward_blocks(slot, inputs);
    if (pp_.last()) head(slot, targets, losses, dloss, backward);
    forwarded_[slot] = true;
    head_backward_[slot] = backward;
  }

  void stage_backward(int slot, const int32_t* inputs, const int32_t* doc_start) override {
    check_stage_call(slot, "stage_backward");
    KILN_CHECK(forwarded_[slot], "Model::stage_backward: slot " + std::to_string(slot) +
                                     " has no stage_forward to go back from");
    KILN_CHECK(!pp_.last() || head_backward_[slot],
               "Model::stage_backward: the last stage's stage_forward of slot " +
                   std::to_string(slot) + " ran without backward (no head gradient)");
    set_doc(doc_start);
    // A middle stage computes the gradient it sends in its own buffer, from a copy of the one
    // it received (the first stage works in place on the received one; the last on its head's).
    if (!pp_.first() && !pp_.last())
      rt_->copy(din_[slot].data(), gout_[slot].data(), s_.btc * sizeof(T));
    backward_blocks(slot, inputs);
    forwarded_[slot] = false;
    head_backward_[slot] = false;
  }

  void* stage_input(int slot) override {
    check_slot(slot);
    return pp_.first() ? nullptr : xs(slot, 0);
  }
  const void* stage_output(int slot) override {
    check_slot(slot);
    return pp_.last() ? nullptr : xs(slot, nb_);
  }
  void* stage_output_grad(int slot) override {
    check_slot(slot);
    return pp_.last() ? nullptr : gout_[static_cast<size_t>(slot)].data();
  }
  const void* stage_input_grad(int slot) override {
    check_slot(slot);
    return pp_.first() ? nullptr : din_[static_cast<size_t>(slot)].data();
  }
  int pp_slots() const override { return slots_; }

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

  // The whole model: the one stage, first and last.
  bool whole() const { return pp_.size == 1; }
  int global(size_t l) const { return static_cast<int>(pp_.first_block + static_cast<int64_t>(l)); }
  // Block input l (0 .. nb_; nb_: the stage's output) of `slot`.
  T* xs(int slot, size_t l) { return x_[static_cast<size_t>(slot) * (nb_ + 1) + l].data(); }
  // The gradient backward runs on in place: d(x[nb_]) on entry, d(x[0]) on exit.
  T* dgrad(int slot) {
    if (whole()) return dres_.data();
    // The first stage sends nothing back: in place on the received gradient.
    if (pp_.first()) return gout_[static_cast<size_t>(slot)].data();
    return din_[static_cast<size_t>(slot)].data();
  }
  void check_slot(int slot) const {
    KILN_CHECK(slot >= 0 && slot < slots_,
               "Model: slot " + std::to_string(slot) + " not in 0.." + std::to_string(slots_ - 1));
  }
  void check_stage_call(int slot, const char* what) const {
    check_slot(slot);
    KILN_CHECK(hooks_ == nullptr, std::string("Model::") + what +
                                      ": unit hooks (ZeRO-2/3) are not used with pipelining");
  }
  void set_doc(const int32_t* doc_start) {
    doc_ = m_.doc_mask ? doc_start : nullptr;
    KILN_CHECK(!m_.doc_mask || doc_start, "Model: model.doc_mask without document starts");
  }

  // Local block l's buffers for `slot` (the shared set where they are recomputed).
  Acts acts(int slot, size_t l) {
    const size_t kept = static_cast<size_t>(slot) * nb_ + l;
    RestBuffers& r = rest_[mode_ == Recompute::kFull ? 0 : kept];
    SelBuffers& s = sel_[mode_ == Recompute::kNone ? kept : 0];
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

  // Local block l from xs(slot, l); writes xs(slot, l+1) unless `recompute` (which stops after the
  // GELU). ln1_done: the previous block's last residual already wrote this block's ln1
  // (forward_blocks).
  void block_forward(int slot, size_t l, bool recompute, bool ln1_done = false) {
    const BlockTensors& bt = p_->block(global(l));
    Acts a = acts(slot, l);
    const T* x = this->xs(slot, l);
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
    T* out = this->xs(slot, l + 1);
    // (The stage's last block before another stage: the next norm is there.)
    if (!fuse_next_layernorm() || (l + 1 == nb_ && !pp_.last())) {
      K::residual_forward(out, a.res2, proj_.data(), s_.btc);
    } else if (l + 1 < nb_) {  // x_{l+1} and block l+1's ln1 in one pass
      const BlockTensors& next = p_->block(global(l + 1));
      Acts n =
          acts(slot,
               l + 1);  // (with full recomputation the same buffers: block l is done with them)
      residual_layernorm(out, n.ln1, n.ln1_mean, n.ln1_rstd, a.res2, proj_.data(), w(next.ln1_w),
                         w(next.ln1_b));
    } else {  // x_L and ln_f
      residual_layernorm(out, lnf_.data(), lnf_stats_.data(), lnf_stats_.data() + s_.bt, a.res2,
                         proj_.data(), w(p_->lnf_w()), w(p_->lnf_b()));
    }
  }

  // The first stage's embedding, the stage's blocks, the last stage's final norm.
  void forward_blocks(int slot, const int32_t* inputs) {
    if (pp_.first()) {
      acquire(embed_unit_, false);
      T* x0 = xs(slot, 0);
      if (tp_) {
        tp_->embedding_forward<K>(*rt_, x0, inputs, doc_, w(p_->wte()), w(p_->wpe()), B(), Tn(),
                                  C());
      } else {  // (no wpe with rotary positions; positions restart at document starts with doc_)
        K::encoder_forward(x0, inputs, doc_, w(p_->wte()), w(p_->wpe()), B(), Tn(), C());
      }
      release(embed_unit_);
    }
    const bool fused = fuse_next_layernorm();
    for (size_t l = 0; l < nb_; ++l) {
      acquire(block_units_[l], false);
      block_forward(slot, l, false, /*ln1_done=*/fused && l > 0);
      release(block_units_[l]);
    }
    if (!pp_.last()) return;
    acquire(final_unit_, false);
    if (!fused || nb_ == 0) {
      norm_forward(lnf_.data(), lnf_stats_.data(), lnf_stats_.data() + s_.bt, xs(slot, nb_),
                   p_->lnf_w(), p_->lnf_b());
    }
    release(final_unit_);
  }

  // LM head + cross-entropy in row chunks; with backward, also dlnf and dwte, then d(x_L) into
  // dgrad(slot). The head's weight is this store's wte (tied; on the last stage its own copy of
  // the embedding unit, whose gradient the pipeline sums with the first stage's) or lm_head.
  void head(int slot, const int32_t* targets, float* losses, float dloss, bool backward) {
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
    T* dres = dgrad(slot);
    rt_->fill_zero(dres, s_.btc * sizeof(T));
    norm_backward(dres, dlnf_.data(), xs(slot, nb_), p_->lnf_w(), p_->lnf_b(), lnf_stats_.data(),
                  lnf_stats_.data() + s_.bt);
    release(final_unit_);
    gradients_ready(final_unit_);
  }

  // dgrad(slot) holds d(x[nb_]) on entry and d(x[0]) on exit; parameter gradients accumulate
  // (the embedding's on the first stage).
  void backward_blocks(int slot, const int32_t* inputs) {
    T* dres = dgrad(slot);
    for (size_t l = nb_; l-- > 0;) {
      const BlockTensors& bt = p_->block(global(l));
      acquire(block_units_[l], true);
      if (mode_ == Recompute::kFull) {
        block_forward(slot, l, true);
      }
      Acts a = acts(slot, l);
      if (mode_ == Recompute::kSelective) {
        attention(a.atty, a.lse, a.qkv);
        mlp_act(a.gelu, a.fch);
      }
      const T* x = this->xs(slot, l);
      // MLP: res3 = res2 + proj(act(fc(ln2(res2)))), act GELU or SwiGLU.
      if (fused_gelu()) {  // the GELU's derivative in the GEMM's epilogue (CUDA)
        K::matmul_dgelu_backward(dfch_.data(), g(bt.fc_proj_w), g(bt.fc_proj_b), dres, a.gelu,
                                 w(bt.fc_proj_w), a.fch, B(), Tn(), F(), C());
      } else {
        zero(dgelu_);
        K::matmul_backward(dgelu_.data(), g(bt.fc_proj_w), g(bt.fc_proj_b), dres, a.gelu,
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
      norm_backward(dres, dbtc1_.data(), a.res2, bt.ln2_w, bt.ln2_b, a.ln2_mean, a.ln2_rstd);
      // Attention: res2 = x + proj(attn(rope(qkv(ln1(x))))).
      zero(dbtc1_);
      K::matmul_backward(dbtc1_.data(), g(bt.attn_proj_w), g(bt.attn_proj_b), dres, a.atty,
                         w(bt.attn_proj_w), B(), Tn(), CA(), C());
      zero(dqkv_);
      attention_grad(dqkv_.data(), dbtc1_.data(), a.qkv, a.atty, a.lse);
      if (m_.llama())
        K::rope_backward(dqkv_.data(), doc_, rope_theta(), B(), Tn(), NH(), NKV(), HS());
      zero(dbtc2_);
      K::matmul_backward(dbtc2_.data(), g(bt.qkv_w), g(bt.qkv_b), dqkv_.data(), a.ln1, w(bt.qkv_w),
                         B(), Tn(), C(), QKV());
      tp_sum(dbtc2_);
      norm_backward(dres, dbtc2_.data(), x, bt.ln1_w, bt.ln1_b, a.ln1_mean, a.ln1_rstd);
      release(block_units_[l]);
      gradients_ready(block_units_[l]);
    }
    if (!pp_.first()) return;
    if (!tied()) acquire(embed_unit_, true);  // (tied: the head acquired it for its gradient)
    if (tp_) {
      tp_->embedding_backward<K>(*rt_, g(p_->wte()), g(p_->wpe()), dres, inputs, doc_, B(), Tn(),
                                 C());
    } else {
      K::encoder_backward(g(p_->wte()), g(p_->wpe()), dres, inputs, doc_, B(), Tn(), C());
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
  PpStage pp_;  // the whole model: one stage of all blocks
  size_t nb_;   // the stage's blocks
  int slots_;   // micro-batches in flight (pp_slots)
  size_t head_rows_ = 0;
  std::vector<DeviceArray<T>> x_;     // slot-major: xs(slot, l)
  std::vector<RestBuffers> rest_;     // slot-major per local block, or one shared set (full)
  std::vector<SelBuffers> sel_;       // slot-major per local block (none), or one shared set
  std::vector<DeviceArray<T>> gout_;  // per slot: stage_output_grad (not the last stage)
  std::vector<DeviceArray<T>> din_;   // per slot: stage_input_grad (not the first stage)
  DeviceArray<T> lnf_, proj_, dres_, dlnf_, dbtc1_, dbtc2_, dqkv_, dfch_, dgelu_, logits_;
  DeviceArray<float> lnf_stats_;
  ActivationMemory mem_;
  std::vector<bool> forwarded_, head_backward_;  // per slot: stage_forward ran (with backward)
  int embed_unit_ = 0, final_unit_ = 0, head_unit_ = 0;
  const int32_t* doc_ = nullptr;  // this pass's document starts (B, T), nullptr without the mask
  std::vector<int> block_units_;
};

// The model for kernel backend K in the ParamStore's precision.
template <class K>
std::unique_ptr<Model> create_on(ParamStore* params, int64_t micro_batch, Recompute mode,
                                 int64_t head_chunk_rows, TensorParallel* tp, int pp_slots) {
  switch (params->precision()) {
    case Precision::kFp32:
      return std::make_unique<GptModel<K, float>>(params, micro_batch, mode, head_chunk_rows, tp,
                                                  pp_slots);
    case Precision::kBf16:
      return std::make_unique<GptModel<K, bf16>>(params, micro_batch, mode, head_chunk_rows, tp,
                                                 pp_slots);
    case Precision::kFp16:
      return std::make_unique<GptModel<K, fp16>>(params, micro_batch, mode, head_chunk_rows, tp,
                                                 pp_slots);
  }
  return nullptr;
}

}  // namespace kiln::engine::detail
