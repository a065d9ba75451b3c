// The decoder, model.arch gpt2 or llama (engine/config/model.h ModelConfig):
//   gpt2   token + learned position embeddings, pre-LayerNorm blocks (causal multi-head
//          attention, GELU MLP), final LayerNorm, LM head tied to the token embedding
//   llama  token embedding, pre-RMSNorm blocks (grouped-query attention with rotary positions,
//          SwiGLU MLP), final RMSNorm, a separate LM head (lm_head.weight), no biases
// (model.tie_embeddings and model.bias switch the head and the biases for either), and with
// model.doc_mask attention and rotary positions that restart at each document start of a row.
//
// The model owns its activation buffers (sized for one micro-batch at construction, in the
// ParamStore's runtime memory) and reads and writes parameters and fp32 gradients in a ParamStore
// it does not own. Every operator comes from the kernel API (kernels/ops.h) of the runtime's device
// (kiln::CpuBackend or kiln::CudaBackend, chosen once in create()); the storage type of activations
// and working parameters is the run's precision (fp32, bf16 or fp16), parameter gradients are fp32.
//
// Activation checkpointing (engine/config/memory.h Recompute):
//   none       every block keeps ln1, qkv, attention output + logsumexp, res2, ln2, fc, gelu
//   selective  the attention output/logsumexp and the GELU output are recomputed in backward
//              (from qkv and fc) instead of kept: about 5 of 16 values per token and channel
//   full       only block inputs are kept; each block's forward is rerun before its backward
// Recomputation reruns the same deterministic kernels, so all three give bit-identical results.
//
// The LM head and the fused softmax + cross-entropy run in chunks of rows, so the (tokens x vocab)
// logits never exist at once. With a TensorParallel (engine/parallel/tensor_parallel.h) the same
// code runs Megatron-style on this rank's slices: n_heads / tp heads (and n_kv_heads / tp key/value
// heads), ffn / tp MLP units, V / tp vocabulary rows, with the group's all-reduces where the layers
// meet. Not thread-safe: one model per training thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/config/memory.h"
#include "engine/config/model.h"
#include "engine/config/precision.h"
#include "engine/model/params.h"

namespace kiln::engine {

struct ActivationMemory {
  size_t kept_bytes = 0;       // activations kept from forward to backward
  size_t recompute_bytes = 0;  // buffers for recomputed activations (one block's worth, shared)
  size_t working_bytes = 0;    // transient buffers: gradients of activations, head chunk, scratch
  size_t total() const { return kept_bytes + recompute_bytes + working_bytes; }
};

// What a model of this shape allocates for one micro-batch of `micro_batch` sequences (on one of
// `tp` tensor-parallel ranks) on `device` (its logits chunk differs: engine/model/gpt_model.h).
// With a pipeline stage: that stage's blocks (and embedding / head), `pp_slots` micro-batches'
// kept activations in flight (Model::create) and the buffers the stages exchange. Exactly what
// Model::create allocates with the default head chunk: kept_bytes is pp_slots x (the slot's
// block inputs and outputs, kept block buffers and exchanged gradients) + the last stage's final
// norm output; recompute_bytes and working_bytes are shared by the slots (docs/TRAINING.md).
ActivationMemory plan_activation_memory(const ModelConfig& model, int64_t micro_batch,
                                        Precision precision, Recompute mode, int64_t tp = 1,
                                        Device device = Device::kCpu, PpStage stage = {},
                                        int pp_slots = 1);

class TensorParallel;

// What the model tells the distributed engine around each parameter unit (engine/model/params.h:
// embed, blocks.l, final) so it can gather sharded weights just before use, free them after, and
// reduce a unit's gradients as soon as backward has finished them (engine/parallel/zero.h,
// ZeRO-2/3). Units are ParamStore unit indices. A pass: begin_pass(order of the acquire() calls to
// come), then acquire/release pairs (a unit's weights are read only between them; with backward,
// its gradients may be written from acquire on), gradients_ready once per unit in forward_backward,
// end_pass. Errors are kept by the implementation and checked by its owner after the pass.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void begin_pass(const std::vector<int>& order) = 0;
  virtual void acquire(int unit, bool backward) = 0;
  virtual void release(int unit) = 0;
  virtual void gradients_ready(int unit) = 0;
  virtual void end_pass() = 0;
};

class Model {
 public:
  // params must outlive the model. head_chunk_rows 0: chosen so a logits chunk is ~8 MiB on the
  // CPU, <= 1 GiB on a GPU.
  // tp (engine/parallel/tensor_parallel.h, outlives the model): params holds this rank's slices and
  // the layers run Megatron-style; nullptr: one rank holds everything.
  // pp_slots: with a ParamStore of one pipeline stage (ParamStore::pp_stage(), size > 1), how many
  // micro-batches' activations the stage keeps at once (the stage_* calls below; the schedule's
  // in-flight count, engine/parallel/pipeline.h).
  static std::unique_ptr<Model> create(ParamStore* params, int64_t micro_batch, Recompute mode,
                                       int64_t head_chunk_rows = 0, TensorParallel* tp = nullptr,
                                       int pp_slots = 1);
  virtual ~Model() = default;

  // Pointers (inputs, targets, losses) are in the runtime's memory: host memory on the CPU, device
  // memory on a GPU (engine/data/device_batches.h stages them), where the call only queues the
  // work. One micro-batch: inputs and targets are (micro_batch, seq_len) token ids; a target < 0 is
  // ignored (loss 0, no gradient). Runs forward, the loss and backward, ACCUMULATING the fp32
  // parameter gradients of dloss * sum(losses) into the ParamStore (zero them before the first
  // micro-batch of a step). losses receives the per-token cross-entropy (natural log, unscaled).
  // doc_start (micro_batch, seq_len), same memory, nullable: each token's document start in its
  // row (kernels/operators.inc attention_gqa_forward); required with model.doc_mask (attention
  // and rotary positions restart there), ignored without.
  virtual void forward_backward(const int32_t* inputs, const int32_t* targets, float dloss,
                                float* losses, const int32_t* doc_start = nullptr) = 0;
  // Forward and per-token losses only.
  virtual void forward(const int32_t* inputs, const int32_t* targets, float* losses,
                       const int32_t* doc_start = nullptr) = 0;

  // ---- Pipeline parallelism (engine/parallel/pipeline.h) ----
  // A model of one stage runs only that stage's blocks, for micro-batches in `slot`s 0 ..
  // pp_slots - 1 (a slot is free again after its stage_backward). forward_backward() and forward()
  // are for the whole model only. What stages exchange is (micro_batch, seq_len, d_model) values
  // of the work dtype (ParamStore::work_dtype()), stage_activation_elems() of them, in the
  // runtime's memory, at fixed addresses per slot:
  //   stage_input(slot)        the previous stage's output is received here (not the first stage)
  //   stage_output(slot)       sent to the next stage after stage_forward (not the last)
  //   stage_output_grad(slot)  the next stage's input gradient is received here (not the last)
  //   stage_input_grad(slot)   sent to the previous stage after stage_backward (not the first)
  // stage_forward: the first stage embeds `inputs`; then the stage's blocks; the last stage runs
  // the head and the loss on `targets` into `losses` (per token, unscaled) and, with backward,
  // the head's backward with dloss (as forward_backward). stage_backward: the blocks' backward
  // from the slot's output gradient (the last stage: from its head's), and on the first stage
  // the embedding's, ACCUMULATING parameter gradients. inputs / doc_start are the slot's
  // micro-batch, on every stage (doc_start: the attention mask and rotary positions; inputs:
  // the first stage's embedding; targets and losses: the last stage's).
  // Buffer lifetimes per slot (calls queue work on a GPU: these are stream orders): stage_input is
  // read until the slot's stage_backward (block 0's backward reads it), stage_output is written
  // by the slot's next stage_forward, stage_output_grad is read by (and on the first stage
  // overwritten in) the slot's stage_backward, stage_input_grad is written by the last stage's
  // stage_forward with backward and by stage_backward. stage_backward needs a stage_forward of
  // the slot before it (with backward on the last stage); a stage_forward without backward
  // (evaluation) leaves the slot free. Unit hooks (ZeRO-2/3) are refused here. A whole model
  // (pp size 1, pp_slots 1) may run them too, with slot 0: forward_backward split in two.
  virtual void stage_forward(int slot, const int32_t* inputs, const int32_t* targets, float* losses,
                             const int32_t* doc_start, float dloss, bool backward);
  virtual void stage_backward(int slot, const int32_t* inputs, const int32_t* doc_start);
  virtual void* stage_input(int slot);
  virtual const void* stage_output(int slot);
  virtual void* stage_output_grad(int slot);
  virtual const void* stage_input_grad(int slot);
  size_t stage_activation_elems() const;
  virtual int pp_slots() const { return 1; }

  virtual ActivationMemory activation_memory() const = 0;
  virtual int64_t micro_batch() const = 0;
  virtual Recompute recompute() const = 0;

  // nullptr (the default): every unit's weights and gradients are always resident.
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }

 protected:
  UnitHooks* hooks_ = nullptr;
  size_t stage_elems_ = 0;  // stage_activation_elems()
};

}  // namespace kiln::engine
