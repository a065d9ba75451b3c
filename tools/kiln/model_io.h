// Shared by `kiln checkpoint export`, `kiln generate` and `kiln eval`: the tokenizer that goes
// with a model, and the tokenizer files of an exported Hugging Face directory.
#pragma once

#include <string>

#include "common/status.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "engine/checkpoint/hf.h"

namespace kiln::cli {

// The tokenizer at `flag_path` when given, else the one found beside the weights
// (ModelWeights::tokenizer). kNotFound (naming --tokenizer) when there is none.
Result<prep::Tokenizer> model_tokenizer(const engine::ModelWeights& w,
                                        const std::string& flag_path);

// TEMPORARY until the Hugging Face tokenizer.json writer lands (branch tok31, issue 31 item 3):
// writes the tokenizer of `w` (or `flag_path`) into an exported directory as GPT-2's
// vocab.json + merges.txt with tokenizer_config.json (transformers' GPT2Tokenizer reads them;
// its pre-tokenizer is GPT-2's regex, so a Kiln-trained tokenizer with the "kiln-v1"
// pre-tokenizer can split some text differently there) and Kiln's own file as
// kiln_tokenizer.json (what `kiln generate` / `kiln eval` read back, exactly). Replace the body
// with tokenizer.json + tokenizer_config.json from tok31's writer. kNotFound when the model has
// no tokenizer.
Status write_hf_tokenizer_files(const std::string& dir, const engine::ModelWeights& w,
                                const std::string& flag_path);

}  // namespace kiln::cli
