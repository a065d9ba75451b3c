#include "tools/kiln/model_io.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"

namespace kiln::cli {
namespace fs = std::filesystem;

Result<prep::Tokenizer> model_tokenizer(const engine::ModelWeights& w,
                                        const std::string& flag_path) {
  const std::string path = flag_path.empty() ? w.tokenizer : flag_path;
  if (path.empty()) {
    return Status::not_found("no tokenizer found beside " + w.path +
                             " (the run's data.manifest names none, or the directory has no "
                             "tokenizer file): give --tokenizer FILE")
        .with_key("--tokenizer");
  }
  KILN_ASSIGN_OR_RETURN(prep::Tokenizer tok, prep::Tokenizer::load(path));
  if (static_cast<int64_t>(tok.vocab_size()) > w.model.vocab_size) {
    return Status::usage("the tokenizer has " + std::to_string(tok.vocab_size()) +
                         " tokens, more than the model's vocabulary of " +
                         std::to_string(w.model.vocab_size))
        .with_file(path);
  }
  return tok;
}

Status write_hf_tokenizer_files(const std::string& dir, const engine::ModelWeights& w,
                                const std::string& flag_path) {
  auto tok = model_tokenizer(w, flag_path);
  if (!tok.is_ok()) {
    if (tok.status().code() == StatusCode::kNotFound) return tok.status();
    return std::move(tok).take_status();
  }
  const fs::path d(dir);
  KILN_RETURN_IF_ERROR(tok->save_gpt2((d / "vocab.json").string(), (d / "merges.txt").string()));
  KILN_RETURN_IF_ERROR(tok->save((d / "kiln_tokenizer.json").string()));
  nlohmann::ordered_json cfg;
  cfg["tokenizer_class"] = "GPT2Tokenizer";
  cfg["model_max_length"] = w.model.seq_len;
  cfg["add_prefix_space"] = false;
  cfg["clean_up_tokenization_spaces"] = false;
  if (tok->eos_id() >= 0) {
    const std::string eos = tok->token_bytes(static_cast<uint32_t>(tok->eos_id()));
    cfg["bos_token"] = eos;
    cfg["eos_token"] = eos;
    cfg["unk_token"] = eos;
  }
  return write_file_atomic((d / "tokenizer_config.json").string(), cfg.dump(2) + "\n");
}

}  // namespace kiln::cli
