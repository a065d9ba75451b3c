// Shared by `kiln checkpoint export`, `kiln generate` and `kiln eval`: the tokenizer that goes
// with a model, and the tokenizer files of an exported Hugging Face directory.
#pragma once

#include <string>

#include "common/status.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "engine/checkpoint/gguf.h"
#include "engine/checkpoint/hf.h"
#include "engine/infer/gpt_infer.h"

namespace kiln::cli {

// The tokenizer at `flag_path` when given, else the one found beside the weights
// (ModelWeights::tokenizer). kNotFound (naming --tokenizer) when there is none.
Result<prep::Tokenizer> model_tokenizer(const engine::ModelWeights& w,
                                        const std::string& flag_path);

// The inference model of `w` on the device `kiln generate` / `kiln eval` run on: --device
// (`flag`: cpu | cuda) when given, else the run's config.yaml `device` (ModelWeights::device),
// else cpu. An unknown name, or cuda where no GPU is usable (or the build has no CUDA), is an
// error naming --device (exit 2) that says why. Before the weights are read, the memory of
// `positions` positions on that device is held against what it has
// (engine::check_inference_memory; over it: an error naming `key`, exit 2).
Result<std::unique_ptr<engine::GptInference>> load_inference(engine::ModelWeights& w,
                                                             const std::string& flag,
                                                             int64_t positions,
                                                             const std::string& key);

// Writes the tokenizer of `w` (or `flag_path`) into an exported directory as Hugging Face
// tokenizer.json + tokenizer_config.json (a SentencePiece tokenizer: tokenizer.model), through
// prep::write_hf_tokenizer; model_max_length is the model's seq_len. kNotFound when the model has
// no tokenizer.
Status write_hf_tokenizer_files(const std::string& dir, const engine::ModelWeights& w,
                                const std::string& flag_path);

// The tokenizer of `w` (or `flag_path`) as llama.cpp's byte-level BPE vocabulary for a GGUF file
// (tools/kiln/gguf_vocab.cc): tokens and merges spelled as in tokenizer.json, special tokens
// control, added ones user-defined, ids past the tokenizer up to the model's vocab_size "[PADn]"
// (unused); bos = eos = pad = its end-of-text; the chat template of a tokenizer_config.json
// beside the tokenizer file. The pre-tokenizer must be one llama.cpp implements exactly: Llama
// 3's ("llama-bpe", with ignore_merges) or GPT-2's ("gpt-2"); anything else (kiln-v1, another
// regex, a normalizer, SentencePiece) is a usage error that says why and what to retrain with.
// kNotFound when the model has no tokenizer.
Result<engine::GgufVocab> gguf_vocab(const engine::ModelWeights& w, const std::string& flag_path);

}  // namespace kiln::cli
