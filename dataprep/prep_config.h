// The `kiln prep` configuration: schema with defaults (kPrepDefaultsYaml, documented in
// configs/prep/default.yaml) and its validated, typed form (PrepOptions).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "dataprep/dedup/lsh.h"
#include "dataprep/filter/filter.h"
#include "format/shard.h"

namespace kiln::chat {
class ChatTemplate;
}

namespace kiln::prep {

// YAML defaults of every prep key (the schema Config::load validates against).
extern const char* const kPrepDefaultsYaml;

// domains.*: how documents get their domain.
struct DomainOptions {
  std::string default_domain = "web";  // domains.default: for documents no rule or model assigns
  std::string rules;                   // domains.rules: rules file; "" = the built-in rules
  std::string model;                   // domains.model: fastText model file; "" = none
  double model_threshold = 0.5;        // domains.model_threshold: in [0, 1]
};

// tokenizer.*: the tokenizer prep uses (or trains).
struct TokenizerOptions {
  std::string path;                   // tokenizer.path: JSON file; "" = train one; "none" = no tokens
  int64_t vocab_size = 8192;          // tokenizer.vocab_size: 257 .. 2^31, when training
  uint64_t train_bytes = 64ull << 20; // tokenizer.train_bytes: > 0, sampled kept text to train on
  std::string pretokenizer = "llama3";  // tokenizer.pretokenizer: llama3 | gpt2 | kiln-v1
  // tokenizer.special_tokens: "text" (special-token text in documents is encoded as text) or
  // "parse" (it becomes the special id, as Hugging Face's encode; chat data).
  std::string special_tokens = "text";
  bool trains() const { return path.empty(); }
};

// chat.*: how chat lines ({"messages": ...}, prompt/completion) are rendered (docs/PREP.md "Chat
// data").
struct ChatOptions {
  // chat.template: "" = the tokenizer's own (a tokenizer_config.json or chat_template.jinja beside
  // tokenizer.path), else Kiln's default; "kiln" = Kiln's default; else a model directory,
  // tokenizer_config.json or .jinja file.
  std::string template_path;
  // Resolved by prep_options_from_config. Null when the tokenizer's own template cannot delimit
  // assistant turns; `unavailable` says why and chat lines are rejected with it.
  std::shared_ptr<const chat::ChatTemplate> resolved;
  std::string unavailable;
};

struct PrepOptions {
  std::vector<std::string> inputs;
  std::string output;
  int threads = 0;               // 0 = all cores
  uint64_t memory_bytes = 0;     // budget for dedup tables before spilling
  bool keep_work = false;

  uint64_t max_line_bytes = 0;
  bool repair_utf8 = true;
  double max_reject_fraction = 0.05;

  bool exact = true;
  bool near = true;
  double threshold = 0.8;
  int num_perm = 128;
  int ngram = 5;
  uint64_t seed = 0;
  bool verify = true;
  bool strip_punct = false;
  double fp_weight = 0.05;
  double fn_weight = 0.95;
  bool index = true;                  // dedup.index: write OUT/dedup/index/
  std::vector<std::string> against;   // dedup.against: datasets whose kept documents count as
                                      // earlier input (their indexes; --against)
  LshParams lsh;                 // resolved: explicit bands/rows or optimal for the threshold
  bool lsh_explicit = false;

  DomainOptions domains;
  TokenizerOptions tokenizer;
  ChatOptions chat;

  ShardCompression compression = ShardCompression::kZstd;
  int level = 3;
  uint64_t max_samples = 0;
  uint64_t max_bytes = 0;

  // Validation split (off when both are 0): a document is held out when a hash of its id (and
  // dedup.seed) falls below val_fraction, and per domain at least val_min_docs documents (the
  // smallest hashes; never more than half the domain) are held out.
  double val_fraction = 0;
  uint64_t val_min_docs = 0;

  // filters: the quality filters, in order (dataprep/filter/filter.h); never null after
  // prep_options_from_config (an empty chain runs none). Shared: the chain is immutable.
  std::shared_ptr<const filter::FilterChain> filters;
};

// Validates every value (ranges, enums) and resolves bands x rows; errors name the key.
Result<PrepOptions> prep_options_from_config(const Config& config);

}  // namespace kiln::prep
