// Model FLOPs utilisation: the arithmetic a training step needs, against the device's peak.
//
// Model FLOPs per token (forward + backward, no recomputation counted, as in PaLM / llm.c):
//   6 N  +  6 L d T
// N = all parameters (the tied embedding counted once: it is also the LM head's matrix),
// L layers, d = d_model, T = seq_len. 6N: two FLOPs per multiply-add, one pass forward and two
// backward through every weight; 6 L d T: the causal attention scores and their weighting
// (q k^T and p v, each 2 T d per token per layer, halved by the causal mask, times three for
// forward + backward). MFU = tokens/s * FLOPs per token / peak.
//
// Peaks are the vendor's dense (no sparsity) bf16 tensor-core rates; a device not in the table is
// named in the log and gets no MFU (null in metrics), never a guess.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "engine/config/model.h"

namespace kiln::engine {

double model_flops_per_token(const ModelConfig& m, size_t num_params);

// Dense bf16 peak in FLOP/s for a CUDA device's product name (cudaDeviceProp::name, e.g.
// "NVIDIA H200", "NVIDIA H100 80GB HBM3"); nullopt when unknown.
std::optional<double> dense_bf16_peak_flops(const std::string& product_name);

}  // namespace kiln::engine
