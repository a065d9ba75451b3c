// The inference forward on the GPU (engine/infer/gpt_infer.h): the template of
// gpt_infer_impl.h instantiated for kiln::CudaBackend. Compiled only into the CUDA module
// libkiln_cuda.so (cmake/cuda_modules.cmake, with infer_kernels.cu), never into kiln_engine, so a
// CPU process never maps the CUDA libraries; GptInference::load(w, Device::kCuda) finds the
// entry point below by name after runtime_for(Device::kCuda) has loaded the module.
#include <memory>

#include "engine/infer/gpt_infer_impl.h"

extern "C" kiln::Result<std::unique_ptr<kiln::engine::GptInference>> kiln_cuda_load_inference(
    kiln::engine::ModelWeights* w, kiln::engine::Runtime* rt) {
  return kiln::engine::detail::GptInferenceOn<kiln::CudaBackend>::load(*w, rt);
}
