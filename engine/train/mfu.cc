#include "engine/train/mfu.h"

namespace kiln::engine {

double model_flops_per_token(const ModelConfig& m, size_t num_params) {
  // An untied input embedding is a lookup, not a matrix product: its parameters do no FLOPs
  // (the tied one is the LM head's matrix and counts once). GPT-2's position table is counted as
  // it always was. Attention: causal, n_heads x head_dim = d_model channels, whatever n_kv_heads
  // (grouped-query heads save memory and K/V projections, which num_params already reflects);
  // the document mask's skipped blocks are not subtracted (the usual convention).
  double matmul_params = static_cast<double>(num_params);
  if (!m.tie_embeddings) {
    matmul_params -= static_cast<double>(m.vocab_size) * static_cast<double>(m.d_model);
  }
  return 6.0 * matmul_params + 6.0 * static_cast<double>(m.n_layers) *
                                   static_cast<double>(m.d_model) * static_cast<double>(m.seq_len);
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
