// Internal to engine/ (used by the trainer and the model): Megatron-style tensor parallelism over
// the ranks of one tensor-parallel group (comm/topology.h: tp adjacent ranks, which share a
// data-parallel rank and so the same batches).
//
// Layout (ParamStore with a TpShard holds this rank's slices; engine/model/params.h names the split
// of every tensor):
//   column-parallel  attn.qkv (the same heads of q, k and v: n_heads / tp query heads per rank
//                    and, grouped-query (llama), the n_kv_heads / tp key/value heads they read)
//                    and mlp.fc (ffn / tp hidden units; llama: of the gate and of the up rows);
//                    their outputs stay split
//   row-parallel     attn.proj and mlp.proj take the split input; their partial outputs are summed
//                    by one all-reduce in forward (Megatron's g); their bias is added once
//   vocabulary       wte rows [rank * V/tp, (rank+1) * V/tp): the embedding looks up the rows it
//                    owns and all-reduces; the tied LM head computes this rank's V/tp logits and
//                    the cross-entropy combines per-row statistics (max, sum of exponentials,
//                    target logit: 3 fp32 per row), so the full logits never exist on one rank
//   replicated       norms, position embeddings and row-parallel biases: identical on every rank,
//                    because their gradients are computed from identical (all-reduced) inputs
// Backward all-reduces the input gradient of each column-parallel layer and of the LM head
// (Megatron's f). Activation sums travel as fp32 (bf16/fp16 activations are widened and rounded
// back) and are rank-order sums (comm/comm.h), so every rank holds the same bits and takes the
// same clip and overflow decisions. Per micro-batch that is (4 L + 2) all-reduces of B T C values
// plus the cross-entropy's 3 B T (L more with full activation checkpointing, which reruns
// attention-out); engine/parallel/layout_plan.h has the formula, tests/train_tp.sh checks it.
//
// With ZeRO (engine/parallel/zero.h) each TP rank's slices are sharded over its data-parallel
// group, and ZeroOptimizer::inspect takes over the norm below. Checkpoints: every TP rank writes
// its own slices (engine/checkpoint/checkpoint.h); loading reshards to any TP size. Two groups over
// the same ranks, as data parallelism has (engine/parallel/parallelism.h): the host group (MPI)
// for host values (the gradient norm's sum) and the data group for the model's memory - the same
// MPI group on the CPU, an NCCL group with device: cuda, where the activation sums, the embedding
// and the cross-entropy statistics stay on the GPU. The model's calls are templates over the kernel
// backend K (kernels/ops.h: tp_embedding_*, the crossentropy_shard_* statistics, cast to widen
// bf16/fp16 sums to fp32), the same code for every device. A failed collective stops the process
// (mpirun then stops every rank). Not thread-safe: the training thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/comm.h"
#include "common/status.h"
#include "engine/config/model.h"
#include "engine/config/stability.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "kernels/ops.h"

namespace kiln::engine {

class TensorParallel {
 public:
  // kConfig naming the key when the config cannot be split over group's ranks (heads, vocabulary)
  // or asks for what is not combined with tensor parallelism yet (per-layer clipping and
  // statistics). group must outlive it.
  // data_group (nullptr: group itself) carries the model's memory: an NCCL group over the same
  // ranks with device: cuda.
  static Result<std::unique_ptr<TensorParallel>> create(const ModelConfig& model,
                                                        const StabilityConfig& stability,
                                                        comm::ProcessGroup& group,
                                                        comm::ProcessGroup* data_group = nullptr);

  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  TpShard shard() const { return TpShard{rank(), size()}; }
  int64_t vocab_local() const { return model_.vocab_size / size(); }
  int64_t heads_local() const { return model_.n_heads / size(); }

  // In-place sum over the group of n values in be's memory (fp32 on the wire). K: the kernel
  // backend type (kiln::CpuBackend / kiln::CudaBackend).
  template <class K, typename T>
  void allreduce(Runtime& rt, T* x, size_t n);
  // A row-parallel layer's bias: added by rank 0 only (nullptr elsewhere), so the sum has it once.
  template <typename T>
  const T* row_bias(const T* bias) const {
    return rank() == 0 ? bias : nullptr;
  }
  // Vocabulary-parallel embedding: out (B, T, C) = wte[token] + wpe[t - doc_start[b,t]], summed
  // over the group (doc_start nullable: kernels/operators.inc encoder_forward).
  template <class K, typename T>
  void embedding_forward(Runtime& rt, T* out, const int32_t* tokens, const int32_t* doc_start,
                         const T* wte_local, const T* wpe, int B, int T_, int C);
  // Accumulates this rank's wte rows and the (replicated) wpe gradient from dout (identical on
  // every rank).
  template <class K, typename T>
  void embedding_backward(Runtime& rt, float* dwte_local, float* dwpe, const T* dout,
                          const int32_t* tokens, const int32_t* doc_start, int B, int T_, int C);
  // Vocabulary-parallel softmax cross-entropy of n rows of this rank's logits (n, V/tp): losses
  // (every rank the same), and with dlogits (may alias logits) dloss * (softmax - onehot).
  // K: the kernel backend type (kiln::CpuBackend / kiln::CudaBackend) whose
  // crossentropy_shard_* kernels compute the row statistics in be's memory; the statistics are
  // all-reduced in place (through host memory when be's memory is not the host's).
  template <class K, typename T>
  void crossentropy(Runtime& rt, T* dlogits, float* losses, const T* logits, const int32_t* targets,
                    float dloss, int n);

  // AdamW::inspect for sharded parameters: the global norm counts the split tensors of every rank
  // and the replicated ones once; every rank gets the same (finite or not) result.
  StepStats inspect(const AdamW& optimizer, const ParamStore& params, double loss_scale);

 private:
  TensorParallel(comm::ProcessGroup& group, comm::ProcessGroup& data, const ModelConfig& model)
      : group_(group), data_(data), model_(model) {}
  void sum(float* x, size_t n);
  // In-place sum of n fp32 values in device memory over the data group.
  void device_sum(float* x, size_t n);
  // fp32 device scratch of at least n values.
  float* device_wide(Runtime& rt, size_t n);
  // In-place all-reduce of n fp32 statistics in be's memory.
  void reduce_stats(Runtime& rt, float* x, size_t n, comm::ReduceOp op);

  comm::ProcessGroup& group_;  // host values
  comm::ProcessGroup& data_;   // the model's memory (group_ on the CPU; NCCL with cuda)
  ModelConfig model_;
  std::vector<float> staged_;    // host copy of device statistics (no device group)
  DeviceArray<float> stats_;     // cross-entropy row statistics (max, sum of exp, target logit)
  DeviceArray<float> wide_dev_;  // fp32 device scratch: widened sums, the embedding's sum
};

template <class K, typename T>
void TensorParallel::allreduce(Runtime& rt, T* x, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    device_sum(x, n);
  } else {  // bf16/fp16: summed in fp32 and rounded back once
    float* w = device_wide(rt, n);
    K::cast(w, x, n);
    device_sum(w, n);
    K::cast(x, w, n);
  }
}

template <class K, typename T>
void TensorParallel::embedding_forward(Runtime& rt, T* out, const int32_t* tokens,
                                       const int32_t* doc_start, const T* wte_local, const T* wpe,
                                       int B, int T_, int C) {
  const size_t n = static_cast<size_t>(B) * T_ * C;
  float* w = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    w = out;
  } else {
    w = device_wide(rt, n);
  }
  // This rank's rows (zero for the others' tokens), the position embedding on rank 0 only.
  K::tp_embedding_forward(w, tokens, doc_start, wte_local, rank() == 0 ? wpe : nullptr, B, T_, C,
                          static_cast<int>(rank() * vocab_local()),
                          static_cast<int>(vocab_local()));
  device_sum(w, n);
  if constexpr (!std::is_same_v<T, float>) K::cast(out, w, n);
}

template <class K, typename T>
void TensorParallel::embedding_backward(Runtime&, float* dwte_local, float* dwpe, const T* dout,
                                        const int32_t* tokens, const int32_t* doc_start, int B,
                                        int T_, int C) {
  K::tp_embedding_backward_wte(dwte_local, dout, tokens, B, T_, C,
                               static_cast<int>(rank() * vocab_local()),
                               static_cast<int>(vocab_local()));
  K::encoder_backward(static_cast<float*>(nullptr), dwpe, dout, tokens, doc_start, B, T_, C);
}

// In the header so that each kernel backend's model (engine/model/gpt_model.h) instantiates it.
template <class K, typename T>
void TensorParallel::crossentropy(Runtime& rt, T* dlogits, float* losses, const T* logits,
                                  const int32_t* targets, float dloss, int n) {
  const size_t rows = static_cast<size_t>(n);
  if (stats_.size() < 3 * rows) stats_.reset(&rt, 3 * rows);
  float* mx = stats_.data();
  float* se = mx + rows;
  float* xt = se + rows;
  const int Vl = static_cast<int>(vocab_local()), v0 = static_cast<int>(rank() * vocab_local());
  // Row maxima (max over ranks), then the sums of exponentials and the target logits (sums).
  K::crossentropy_shard_max(mx, logits, n, Vl);
  reduce_stats(rt, mx, rows, comm::ReduceOp::kMax);
  K::crossentropy_shard_sum(se, xt, logits, mx, targets, n, Vl, v0);
  reduce_stats(rt, se, 2 * rows, comm::ReduceOp::kSum);
  K::crossentropy_shard_loss(losses, mx, se, xt, targets, n);
  if (dlogits) K::crossentropy_shard_backward(dlogits, logits, mx, se, targets, dloss, n, Vl, v0);
}

}  // namespace kiln::engine
