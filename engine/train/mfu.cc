#include "engine/train/mfu.h"

namespace kiln::engine {

double model_flops_per_token(const ModelConfig& m, size_t num_params) {
  return 6.0 * static_cast<double>(num_params) + 6.0 * static_cast<double>(m.n_layers) *
                                                     static_cast<double>(m.d_model) *
                                                     static_cast<double>(m.seq_len);
}

std::optional<double> dense_bf16_peak_flops(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // Vendor datasheets, dense bf16 with fp32 accumulation. Order matters: specific names first.
  if (has("H200") || has("GH200")) return 989e12;
  if (has("H100")) {
    if (has("PCIe")) return 756e12;
    if (has("NVL")) return 835e12;
    return 989e12;  // SXM5 ("NVIDIA H100 80GB HBM3")
  }
  if (has("H800")) return has("PCIe") ? 756e12 : 989e12;
  if (has("A100") || has("A800")) return 312e12;
  if (has("L40S")) return 362e12;
  if (has("A10") && !has("A100")) return 125e12;
  if (has("L40")) return 181e12;
  if (has("L4")) return 121e12;
  return std::nullopt;
}

}  // namespace kiln::engine
