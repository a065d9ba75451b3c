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
  // TODO(pipeline): the stage's blocks and pp_slots micro-batches (engine/model/model.h).
  (void)stage;
  (void)pp_slots;
  const BlockSizes s(m, B, tp);
  const size_t e = elem_size(p);
  const size_t L = static_cast<size_t>(m.n_layers);
  // Per block, split into what can be recomputed by "selective" and the rest.
  const size_t sel_bytes = (s.btca + s.btf) * e + s.lse * 4;  // atty, gelu/swiglu, lse
  // ln1, qkv, res2, ln2, fch; ln1/ln2 statistics.
  const size_t rest_bytes = (s.btc + s.btqkv + s.btc + s.btc + s.btfc) * e + 4 * s.bt * 4;
  ActivationMemory a;
  // Block inputs x[0..L] (x[L] feeds the final norm) + final norm output and statistics.
  a.kept_bytes = (L + 1) * s.btc * e + s.btc * e + 2 * s.bt * 4;
  switch (mode) {
    case Recompute::kNone:
      a.kept_bytes += L * (sel_bytes + rest_bytes);
      break;
    case Recompute::kSelective:
      a.kept_bytes += L * rest_bytes;
      a.recompute_bytes = sel_bytes;
      break;
    case Recompute::kFull:
      a.recompute_bytes = sel_bytes + rest_bytes;
      break;
  }
  const size_t vocab = static_cast<size_t>(m.vocab_size / tp);
  const size_t rows = head_rows(m, B, e, 0, vocab, device);
  // proj scratch, dresidual, dlnf, 2 x (B,T,C) grads, dqkv, dfch, dgelu; logits chunk.
  a.working_bytes = (s.btc * 5 + s.btqkv + s.btfc + s.btf) * e + rows * vocab * e;
  return a;
}

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
  KILN_CHECK(pp_slots == 1 && params->pp_stage().size == 1,
             "Model::create: pipeline stages are not implemented yet");
  switch (params->runtime().device()) {
    case Device::kCpu:
      return detail::create_on<CpuBackend>(params, micro_batch, mode, head_chunk_rows, tp);
    case Device::kCuda: {
      // The CUDA model is in libkiln_cuda.so (engine/device/cuda_module.cc), already loaded: a
      // ParamStore on the CUDA backend came from it.
      auto create = cuda_module_symbol(CudaModule::kCuda, "kiln_cuda_create_model");
      KILN_CHECK(create.is_ok(), create.status().to_string());
      using CreateFn =
          std::unique_ptr<Model> (*)(ParamStore*, int64_t, Recompute, int64_t, TensorParallel*);
      return reinterpret_cast<CreateFn>(*create)(params, micro_batch, mode, head_chunk_rows, tp);
    }
  }
  KILN_CHECK(false, "Model::create: no kernels for this device");
  return nullptr;
}

}  // namespace kiln::engine
