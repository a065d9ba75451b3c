// Config section `model`: the decoder's shape (docs/TRAINING.md "Config reference").
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

enum class InitScheme { kGpt2, kDeepNet };
enum class Arch { kGpt2, kLlama };  // model.arch

const char* arch_name(Arch a);

// The decoder's shape. arch gpt2: learned positions, LayerNorm (eps 1e-5), GELU MLP, biases, tied
// embeddings. arch llama: rotary positions (rotate-half, rope_theta), RMSNorm (norm_eps), SwiGLU
// MLP of ffn_hidden units, grouped-query attention (n_kv_heads), no biases, untied embeddings.
// The Llama options are resolved by parse_model_config (a ModelConfig built in code gets the
// defaults below: GPT-2's). These initialisers are the defaults of the YAML schema too.
struct ModelConfig {
  Arch arch = Arch::kGpt2;
  int64_t vocab_size = 8192;
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t seq_len = 256;   // also the size of the learned position table (gpt2)
  int64_t n_kv_heads = 0;  // key/value heads (n_heads % n_kv_heads == 0); 0: n_heads
  int64_t ffn_hidden = 0;  // MLP hidden units; 0: 4 d_model (gpt2), llama_ffn_hidden (llama)
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;      // RMSNorm's eps (llama; GPT-2's LayerNorm uses 1e-5)
  bool tie_embeddings = true;  // the LM head is the token embedding
  bool bias = true;            // linear layers have biases
  bool doc_mask = false;       // attention and positions restart at each document start
  InitScheme init = InitScheme::kGpt2;
  float init_std = 0.02f;
  // A safetensors file of whole fp32 weights (`kiln checkpoint consolidate`'s output) that a run
  // starts from instead of the random initialisation ("": none); not part of the model's shape.
  std::string init_from;

  bool llama() const { return arch == Arch::kLlama; }
  int64_t head_dim() const { return d_model / n_heads; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t ffn() const;
  // Width of the fused q, k, v projection: (n_heads + 2 n_kv_heads) head_dim.
  int64_t qkv_width() const { return (n_heads + 2 * kv_heads()) * head_dim(); }
};

// Llama's default SwiGLU width: 2/3 of 4 d_model, rounded up to a multiple of 256 (Meta's
// reference code with multiple_of = 256).
int64_t llama_ffn_hidden(int64_t d_model);

// The bounds every model shape is held to (the config's, and a checkpoint's state.json): each
// size within its range and n_heads dividing d_model; a kConfig error naming the model.* key.
Status check_model_shape(const ModelConfig& m);

// The section's keys read and checked (kConfig naming the key).
Result<ModelConfig> parse_model_config(const Config& cfg);

}  // namespace kiln::engine
