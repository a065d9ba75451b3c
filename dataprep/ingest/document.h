// One input document as it flows through `kiln prep`.
// Owned by the prep pipeline (dataprep/prep_*); annotate.h fills the annotation fields.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::prep {

// The one rule for a domain name, wherever it comes from (an input "domain" field, a rules file,
// a tagger model's label, domains.default): it names a folder and the shards' file names under
// OUT/shards/, so 1-64 characters of [A-Za-z0-9_-] and nothing else (no '.', '/', space,
// non-ASCII). tagging/domain_rules.h's validate_domain_name() wraps it in a config error.
constexpr bool is_valid_domain_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

struct Document {
  // Position in the deterministic global order: inputs sorted by path, then line (0-based).
  uint64_t index = 0;
  std::string id;            // input "id", else "<file stem>:<line>" (text folders: relative path)
  bool id_is_number = false;  // the input "id" was a JSON number: `id` is its JSON text, and
                              // the sample's .json writes it back as a number
  std::string text;          // the original text (after optional UTF-8 repair); never normalised
  std::string source;        // input "source" or ""
  std::string url;           // input "url" or ""
  std::string input_domain;  // input "domain" or ""
  std::string file;          // input file path
  uint64_t line = 0;         // 1-based line in `file` (0 for text-folder documents)
  nlohmann::json carried = nlohmann::json::object();  // "meta" and unknown fields, carried as-is

  // Filled by Annotator::annotate().
  std::string domain;        // final domain (is_valid_domain_name)
  std::string domain_by;     // which rule or model assigned it, e.g. "rule:code", "default"
  std::vector<uint32_t> tokens;  // token ids (empty when no tokenizer is configured)

  // Chat samples (a "messages" or prompt/completion line, dataprep/chat/): `text` is the
  // conversation rendered with the chat template, chat_spans the byte ranges of `text` that are
  // assistant turns; the annotator fills loss_mask beside `tokens` (1: a target the loss counts).
  bool chat = false;
  std::vector<std::pair<uint32_t, uint32_t>> chat_spans;
  std::vector<uint8_t> loss_mask;
};

}  // namespace kiln::prep
