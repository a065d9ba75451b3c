#include "engine/model/model.h"

#include "common/cuda_module.h"
#include "engine/model/gpt_model.h"
#include "kernels/ops.h"

namespace kiln::engine {

using detail::BlockSizes;
using detail::elem_size;
using detail::head_rows;

ActivationMemory plan_activation_memory(const ModelConfig& m, int64_t B, Precision p,
                                        Recompute mode, int64_t tp, Device device, PpStage stage,
                                        int pp_slots) {
  if (stage.end_block < 0) stage.end_block = m.n_layers;
  KILN_CHECK(pp_slots >= 1 && stage.first_block >= 0 && stage.first_block < stage.end_block &&
                 stage.end_block <= m.n_layers,
             "plan_activation_memory: bad pipeline stage or pp_slots");
  const BlockSizes s(m, B, tp);
  const size_t e = elem_size(p);
  const size_t L = static_cast<size_t>(stage.end_block - stage.first_block);  // the stage's blocks
  const size_t S = static_cast<size_t>(pp_slots);
  // Per block, split into what can be recomputed by "selective" and the rest.
  const size_t sel_bytes = (s.btca + s.btf) * e + s.lse * 4;  // atty, gelu/swiglu, lse
  // ln1, qkv, res2, ln2, fch; ln1/ln2 statistics.
  const size_t rest_bytes = (s.btc + s.btqkv + s.btc + s.btc + s.btfc) * e + 4 * s.bt * 4;
  ActivationMemory a;
  // Per slot: block inputs x[0..L] (x[L] feeds the final norm or the next stage), the gradients
  // exchanged with the next stage (received) and the previous one (sent).
  size_t slot_bytes = (L + 1) * s.btc * e;
  if (!stage.last()) slot_bytes += s.btc * e;
  if (!stage.first()) slot_bytes += s.btc * e;
  switch (mode) {
    case Recompute::kNone:
      slot_bytes += L * (sel_bytes + rest_bytes);
      break;
    case Recompute::kSelective:
      slot_bytes += L * rest_bytes;
      a.recompute_bytes = sel_bytes;
      break;
    case Recompute::kFull:
      a.recompute_bytes = sel_bytes + rest_bytes;
      break;
  }
  a.kept_bytes = S * slot_bytes;
  // The final norm's output and statistics (the last stage; one set, the head runs in the slot's
  // stage_forward).
  if (stage.last()) a.kept_bytes += s.btc * e + 2 * s.bt * 4;
  // proj scratch, 2 x (B,T,C) grads, dqkv, dfch, dgelu (not with the GEMM's GELU epilogue: CUDA's
  // gpt2 with biases); the whole model's dresidual; the last stage's dlnf and logits chunk.
  const bool fused_gelu =
      (device == Device::kCuda ? CudaBackend::kFusedGemmGelu : CpuBackend::kFusedGemmGelu) &&
      !m.llama() && m.bias;
  a.working_bytes = (s.btc * 3 + s.btqkv + s.btfc + (fused_gelu ? 0 : s.btf)) * e;
  if (stage.size == 1) a.working_bytes += s.btc * e;
  if (stage.last()) {
    const size_t vocab = static_cast<size_t>(m.vocab_size / tp);
    const size_t rows = head_rows(m, B, e, 0, vocab, device);
    a.working_bytes += s.btc * e + rows * vocab * e;
  }
  return a;
}

size_t Model::stage_activation_elems() const { return stage_elems_; }

// The one place the device selects the operators.
// Pipeline stages: implemented by the stage models (engine/model/gpt_model.h).
void Model::stage_forward(int, const int32_t*, const int32_t*, float*, const int32_t*, float,
                          bool) {
  KILN_CHECK(false, "Model::stage_forward: not a pipeline stage's model");
}
void Model::stage_backward(int, const int32_t*, const int32_t*) {
  KILN_CHECK(false, "Model::stage_backward: not a pipeline stage's model");
}
void* Model::stage_input(int) { return nullptr; }
const void* Model::stage_output(int) { return nullptr; }
void* Model::stage_output_grad(int) { return nullptr; }
const void* Model::stage_input_grad(int) { return nullptr; }

std::unique_ptr<Model> Model::create(ParamStore* params, int64_t micro_batch, Recompute mode,
                                     int64_t head_chunk_rows, TensorParallel* tp, int pp_slots) {
  switch (params->runtime().device()) {
    case Device::kCpu:
      return detail::create_on<CpuBackend>(params, micro_batch, mode, head_chunk_rows, tp,
                                           pp_slots);
    case Device::kCuda: {
      // The CUDA model is in libkiln_cuda.so (engine/device/cuda_module.cc), already loaded: a
      // ParamStore on the CUDA backend came from it.
      auto create = cuda_module_symbol(CudaModule::kCuda, "kiln_cuda_create_model");
      KILN_CHECK(create.is_ok(), create.status().to_string());
      using CreateFn = std::unique_ptr<Model> (*)(ParamStore*, int64_t, Recompute, int64_t,
                                                  TensorParallel*, int);
      return reinterpret_cast<CreateFn>(*create)(params, micro_batch, mode, head_chunk_rows, tp,
                                                 pp_slots);
    }
  }
  KILN_CHECK(false, "Model::create: no kernels for this device");
  return nullptr;
}

}  // namespace kiln::engine
