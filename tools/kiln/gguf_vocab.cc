// A model's tokenizer as llama.cpp's vocabulary (model_io.h gguf_vocab).
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "dataprep/tokenizer/pretokenize.h"
#include "tools/kiln/model_io.h"

namespace kiln::cli {
namespace {

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;  // llama_token_type

Status refuse(const std::string& origin, const std::string& why) {
  return Status::usage(
             "llama.cpp cannot tokenize text as this tokenizer does: " + why +
             ". Retrain the tokenizer with `kiln tokenizer train` (its default pre-tokenizer, "
             "llama3, is llama.cpp's llama-bpe; --pretokenizer gpt2 is llama.cpp's gpt-2), then "
             "prep and train with it; --format hf still exports this model")
      .with_file(origin);
}

}  // namespace

Result<engine::GgufVocab> gguf_vocab(const engine::ModelWeights& w, const std::string& flag_path) {
  KILN_ASSIGN_OR_RETURN(prep::Tokenizer tok, model_tokenizer(w, flag_path));
  const std::string origin = flag_path.empty() ? w.tokenizer : flag_path;
  if (std::string_view(tok.kind()) == "sentencepiece")
    return refuse(origin,
                  "it is a SentencePiece model, and this export writes byte-level BPE "
                  "vocabularies only");
  if (!tok.round_trips()) return refuse(origin, "it has a normalizer or adds a prefix space");
  const std::string label = prep::pretokenizer_label(tok.pretokenizer());
  const nlohmann::json j = nlohmann::json::parse(tok.to_json(), nullptr, false);
  if (j.is_discarded() || !j.contains("model") || !j["model"].is_object())
    return Status::internal("the tokenizer's tokenizer.json text does not parse").with_file(origin);
  const nlohmann::json& model = j["model"];
  const bool ignore_merges = model.value("ignore_merges", false);
  engine::GgufVocab v;
  if (label == "llama3") {
    if (!ignore_merges)
      return refuse(origin,
                    "it pre-tokenizes with Llama 3's pattern but without ignore_merges, which "
                    "llama.cpp always applies with that pattern (a word in the vocabulary is one "
                    "token), so a few words would get other ids");
    v.pre = "llama-bpe";
  } else if (label == "gpt2") {
    if (ignore_merges)
      return refuse(origin, "GPT-2's pattern with ignore_merges is not llama.cpp's gpt-2");
    v.pre = "gpt-2";
  } else if (label == "kiln-v1") {
    return refuse(origin,
                  "its pre-tokenizer is kiln-v1, Kiln's own, which llama.cpp does not implement "
                  "(kiln-v1 keeps CJK runs apart from Latin letters and combining marks inside "
                  "words; neither llama-bpe nor gpt-2 does), so typed text would get ids the "
                  "model was not trained on");
  } else {
    return refuse(origin,
                  "its pre-tokenizer regex is not one this export maps to llama.cpp (Llama 3's "
                  "and GPT-2's are)");
  }
  if (model.value("byte_fallback", false))
    return refuse(origin, "it uses byte_fallback, which llama.cpp's byte-level BPE does not");

  const size_t n = static_cast<size_t>(w.model.vocab_size);
  v.tokens.assign(n, std::string());
  v.token_types.assign(n, 0);
  if (model.contains("vocab") && model["vocab"].is_object()) {
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || size_t(id) >= n) continue;  // model_tokenizer checked the size
      v.tokens[size_t(id)] = it.key();
      v.token_types[size_t(id)] = kNormal;
    }
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      const int64_t id = a.value("id", int64_t{-1});
      if (id < 0 || size_t(id) >= n) continue;
      v.tokens[size_t(id)] = a.value("content", std::string());
      v.token_types[size_t(id)] = a.value("special", false) ? kControl : kUserDefined;
    }
  }
  for (size_t id = 0; id < n; ++id) {
    if (v.token_types[id] != 0) continue;
    if (id < tok.vocab_size())
      return Status::internal("token " + std::to_string(id) + " has no text").with_file(origin);
    v.tokens[id] = "[PAD" + std::to_string(id) + "]";  // as llama.cpp's converter pads
    v.token_types[id] = kUnused;
  }
  if (model.contains("merges") && model["merges"].is_array()) {
    v.merges.reserve(model["merges"].size());
    for (const auto& m : model["merges"]) {
      if (m.is_string())
        v.merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2)
        v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
  }
  v.eos_id = tok.eos_id();
  v.bos_id = v.eos_id;  // as GPT-2 and Kiln's Hugging Face export: one token begins and ends
  v.pad_id = v.eos_id;
  // A chat template: tokenizer_config.json beside the tokenizer file.
  std::error_code ec;
  const auto config = std::filesystem::path(origin).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config, ec)) {
    auto text = read_file(config.string());
    if (text.is_ok()) {
      const nlohmann::json c = nlohmann::json::parse(*text, nullptr, false);
      if (c.is_object() && c.contains("chat_template") && c["chat_template"].is_string())
        v.chat_template = c["chat_template"].get<std::string>();
    }
  }
  return v;
}

}  // namespace kiln::cli
