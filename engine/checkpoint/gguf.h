// GGUF files for llama.cpp: `kiln checkpoint export --format gguf` (export_gguf).
//
// GGUF v3 (ggml's docs/gguf.md): magic "GGUF", version 3, tensor and key-value counts, the typed
// key-value pairs, one info per tensor (name, dimensions innermost first, ggml type, offset from
// the start of the data), padding to general.alignment (32), then each tensor's data, aligned.
// Little-endian throughout.
//
// What is written (llama.cpp's names, the keys its loader reads):
//   general.*      architecture ("gpt2" | "llama"), name, file_type, alignment (and
//                  quantization_version for q8_0)
//   ARCH.*         context_length (model.seq_len), embedding_length, block_count,
//                  feed_forward_length, attention.head_count, attention.head_count_kv,
//                  attention.layer_norm_epsilon (gpt2) | attention.layer_norm_rms_epsilon,
//                  rope.freq_base, rope.dimension_count, vocab_size (llama)
//   tokenizer.*    ggml.model "gpt2" (byte-level BPE), ggml.pre (the pre-tokenizer's llama.cpp
//                  name), ggml.tokens, ggml.token_type, ggml.merges, bos/eos/padding ids,
//                  add_bos_token / add_eos_token false (Kiln adds neither), chat_template when
//                  there is one (GgufVocab, made by the caller from the tokenizer)
//   tensors        gguf_tensor_parts below: a Kiln (out, in) row-major matrix is ggml's
//                  [in, out] as it is; Llama's fused attn.qkv is written as attn_q, attn_k,
//                  attn_v and mlp.fc as ffn_gate, ffn_up; the q and k rows of each head are
//                  permuted from Kiln's rotate-half order to the adjacent-pair order llama.cpp's
//                  RoPE (LLAMA_ROPE_TYPE_NORM) rotates (what convert_hf_to_gguf.py does to a
//                  Hugging Face Llama).
// dtype: f32, or f16 / bf16 / q8_0 for the matrices (ggml's Q8_0: blocks of 32 values, one fp16
// scale amax / 127 and 32 int8 round(x / scale)); vectors (norms, biases) stay f32, as
// llama.cpp's converter writes them, and a matrix whose rows are not a multiple of 32 stays f16
// under q8_0.
//
// The weights are read as the Hugging Face export reads them (open_model_weights: a checkpoint
// of any layout, a run, a consolidated file or a Hugging Face directory), one tensor at a time;
// the file is written under a temporary name and renamed when complete. The bytes depend only on
// the weights, the vocabulary and the dtype.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/checkpoint/hf.h"
#include "engine/config/model.h"
#include "engine/model/params.h"

namespace kiln::engine {

// The tokenizer as llama.cpp's "gpt2" (byte-level BPE) vocabulary.
struct GgufVocab {
  std::string pre;                                // tokenizer.ggml.pre: "llama-bpe" or "gpt-2"
  std::vector<std::string> tokens;                // id order, in GPT-2's byte-to-unicode spelling
  std::vector<int32_t> token_types;               // 1 normal, 3 control (special), 4 user-defined
  std::vector<std::string> merges;                // rank order, "left right" (spelled)
  int64_t bos_id = -1, eos_id = -1, pad_id = -1;  // -1: not written
  std::string chat_template;                      // "": not written
};

// One GGUF tensor holding Kiln elements [first, first + numel) (a block of whole rows) of one
// tensor. dims are ggml's (innermost first: [in, out] for a matrix). rope_heads > 0: the rows
// are q or k rows of that many heads, to be permuted from rotate-half to adjacent-pair order.
struct GgufPart {
  std::string name;
  size_t first = 0, numel = 0;
  std::vector<int64_t> dims;
  int64_t rope_heads = 0;
};
// kUsage error when llama.cpp's architecture cannot hold the tensor (GPT-2 without biases).
Result<std::vector<GgufPart>> gguf_tensor_parts(const ModelConfig& m, const ParamTensor& t);

// Rows of one q or k block (heads x head_dim rows of `cols` values) from rotate-half order
// (row h * head_dim + i, halves i < head_dim / 2 and i >= head_dim / 2 rotated together) to
// adjacent-pair order (row h * head_dim + 2 j + s holds rotate-half row h * head_dim +
// s * head_dim / 2 + j).
void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim, size_t cols);

// ggml's Q8_0 encoding of n values (n % 32 == 0): n / 32 blocks of 34 bytes.
void quantize_q8_0(const float* x, size_t n, uint8_t* out);

struct GgufExportOptions {
  std::string output;         // the .gguf file
  std::string dtype = "f32";  // f32 | f16 | bf16 | q8_0
  bool overwrite = false;
};
struct GgufExportReport {
  size_t tensors = 0;
  uint64_t bytes = 0;  // the file's size
  std::string arch;
};
// The vocabulary of the model at `w` (kNotFound: none; other errors: llama.cpp cannot represent
// the tokenizer, the message says why and what to retrain with).
using GgufVocabReader = std::function<Result<GgufVocab>(const ModelWeights& w)>;
Status export_gguf(const std::string& source, const GgufExportOptions& options,
                   const GgufVocabReader& vocab, GgufExportReport* report = nullptr);

}  // namespace kiln::engine
