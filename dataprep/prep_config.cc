#include "dataprep/prep_config.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/text.h"
#include "dataprep/chat/chat_template.h"
#include "dataprep/filter/filter.h"
#include "dataprep/tagging/domain_rules.h"
#include "dataprep/tokenizer/pretokenize.h"

namespace kiln::prep {

const char* const kPrepDefaultsYaml = R"(
input:
  paths: []
  max_line_bytes: 16777216
  utf8: repair
  max_reject_fraction: 0.05
output: ""
threads: 0
memory: 2G
keep_work: false
dedup:
  exact: true
  near: true
  threshold: 0.8
  num_perm: 128
  bands: 0
  rows: 0
  fp_weight: 0.05
  fn_weight: 0.95
  ngram: 5
  seed: 1
  verify: true
  strip_punct: false
  index: true
  against: []
domains:
  default: web
  rules: ""
  model: ""
  model_threshold: 0.5
tokenizer:
  path: ""
  vocab_size: 8192
  train_bytes: 67108864
  pretokenizer: llama3
  special_tokens: text
chat:
  template: ""
shards:
  compression: zstd
  level: 3
  max_samples: 10000
  max_bytes: 268435456
split:
  val_fraction: 0.0
  val_min_docs: 0
filters: []
)";

namespace {

template <typename T>
Status get_into(const Config& c, const std::string& key, T* out) {
  auto r = c.get<T>(key);
  if (!r.is_ok()) return std::move(r).take_status();
  *out = *r;
  return Status::ok();
}

Status range_error(const std::string& key, const std::string& what) {
  return Status::config(what).with_key(key);
}

}  // namespace

// chat.template resolved (ChatOptions in prep_config.h).
static Status resolve_chat_template(const TokenizerOptions& tokenizer, ChatOptions* chat) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string dir;
  if (!tokenizer.path.empty() && tokenizer.path != "none")
    dir = fs::is_directory(tokenizer.path, ec) ? tokenizer.path
                                               : fs::path(tokenizer.path).parent_path().string();
  if (dir.empty()) dir = ".";
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  const bool beside =
      !tokenizer.path.empty() && tokenizer.path != "none" &&
      (fs::exists(fs::path(dir) / "chat_template.jinja", ec) || fs::exists(config_path, ec));
  auto kiln_default = [&]() -> Status {
    // Kiln's template ends assistant turns with the tokenizer's end of text.
    nlohmann::ordered_json specials = {{"eos_token", "<|endoftext|>"}};
    if (beside && fs::exists(config_path, ec)) {
      try {
        std::ifstream in(config_path);
        auto cfg = nlohmann::ordered_json::parse(in);
        if (cfg.contains("eos_token") && cfg["eos_token"].is_string())
          specials["eos_token"] = cfg["eos_token"];
        if (cfg.contains("eos_token") && cfg["eos_token"].is_object() &&
            cfg["eos_token"].contains("content"))
          specials["eos_token"] = cfg["eos_token"]["content"];
      } catch (const std::exception&) {
      }
    }
    auto t = chat::ChatTemplate::from_source(chat::kKilnChatTemplate, specials,
                                             "Kiln's default chat template");
    if (!t.is_ok()) return t.status();
    chat->resolved = std::make_shared<const chat::ChatTemplate>(std::move(t).value());
    return Status::ok();
  };
  if (chat->template_path == "kiln") return kiln_default();
  if (!chat->template_path.empty()) {
    auto t = chat::ChatTemplate::load(chat->template_path);
    if (!t.is_ok()) return Status::config(t.status().message()).with_key("chat.template");
    Status st = t->check_trainable();
    if (!st.is_ok()) return Status::config(st.message()).with_key("chat.template");
    chat->resolved = std::make_shared<const chat::ChatTemplate>(std::move(t).value());
    return Status::ok();
  }
  if (beside) {
    auto t = chat::ChatTemplate::load(dir);
    if (!t.is_ok()) return kiln_default();  // no chat_template there: Kiln's
    Status st = t->check_trainable();
    if (!st.is_ok()) {
      chat->unavailable = st.message() + " (chat.template)";
      return Status::ok();
    }
    chat->resolved = std::make_shared<const chat::ChatTemplate>(std::move(t).value());
    return Status::ok();
  }
  return kiln_default();
}

Result<PrepOptions> prep_options_from_config(const Config& c) {
  PrepOptions o;
  YAML::Node paths = c.node("input.paths");
  if (paths.IsSequence()) {
    for (const auto& p : paths) o.inputs.push_back(p.as<std::string>());
  } else if (paths.IsScalar() && !paths.Scalar().empty()) {
    o.inputs.push_back(paths.Scalar());
  }
  KILN_RETURN_IF_ERROR(get_into(c, "output", &o.output));
  KILN_RETURN_IF_ERROR(get_into(c, "threads", &o.threads));
  if (o.threads < 0 || o.threads > 4096) return range_error("threads", "must be 0..4096");
  std::string memory;
  KILN_RETURN_IF_ERROR(get_into(c, "memory", &memory));
  auto mem = parse_byte_size(memory);
  if (!mem.is_ok()) return Status::config(mem.status().message()).with_key("memory");
  o.memory_bytes = *mem;
  if (o.memory_bytes < (64u << 10)) return range_error("memory", "must be at least 64K");
  KILN_RETURN_IF_ERROR(get_into(c, "keep_work", &o.keep_work));

  KILN_RETURN_IF_ERROR(get_into(c, "input.max_line_bytes", &o.max_line_bytes));
  if (o.max_line_bytes < 1 || o.max_line_bytes > (uint64_t{1} << 32))
    return range_error("input.max_line_bytes", "must be 1..4294967296");
  std::string utf8;
  KILN_RETURN_IF_ERROR(get_into(c, "input.utf8", &utf8));
  if (utf8 != "repair" && utf8 != "reject")
    return range_error("input.utf8", "must be 'repair' or 'reject', got '" + utf8 + "'");
  o.repair_utf8 = utf8 == "repair";
  KILN_RETURN_IF_ERROR(get_into(c, "input.max_reject_fraction", &o.max_reject_fraction));
  if (!(o.max_reject_fraction >= 0 && o.max_reject_fraction <= 1))
    return range_error("input.max_reject_fraction", "must be in [0, 1]");

  KILN_RETURN_IF_ERROR(get_into(c, "dedup.exact", &o.exact));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.near", &o.near));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.threshold", &o.threshold));
  if (!(o.threshold > 0 && o.threshold < 1))
    return range_error("dedup.threshold", "must be in (0, 1)");
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.num_perm", &o.num_perm));
  if (o.num_perm < 2 || o.num_perm > 1024) return range_error("dedup.num_perm", "must be 2..1024");
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.ngram", &o.ngram));
  if (o.ngram < 1 || o.ngram > 64) return range_error("dedup.ngram", "must be 1..64");
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.seed", &o.seed));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.verify", &o.verify));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.strip_punct", &o.strip_punct));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.fp_weight", &o.fp_weight));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.fn_weight", &o.fn_weight));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.index", &o.index));
  YAML::Node against = c.node("dedup.against");
  if (against.IsSequence()) {
    for (const auto& p : against) o.against.push_back(p.as<std::string>());
  } else if (against.IsScalar() && !against.Scalar().empty()) {
    o.against.push_back(against.Scalar());
  }
  if (o.against.size() > 127) return range_error("dedup.against", "at most 127 datasets");
  if (!(o.fp_weight >= 0) || !(o.fn_weight >= 0) || o.fp_weight + o.fn_weight <= 0)
    return range_error("dedup.fp_weight", "weights must be >= 0 and not both 0");
  int bands = 0, rows = 0;
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.bands", &bands));
  KILN_RETURN_IF_ERROR(get_into(c, "dedup.rows", &rows));
  if (bands < 0 || rows < 0) return range_error("dedup.bands", "must be >= 0");
  if ((bands == 0) != (rows == 0))
    return range_error(bands == 0 ? "dedup.bands" : "dedup.rows",
                       "set both dedup.bands and dedup.rows, or neither (0 = from the threshold)");
  if (bands > 0) {
    if (static_cast<int64_t>(bands) * rows > o.num_perm)
      return range_error("dedup.bands", "bands x rows = " + std::to_string(bands) + " x " +
                                            std::to_string(rows) + " exceeds dedup.num_perm = " +
                                            std::to_string(o.num_perm));
    o.lsh = {bands, rows};
    o.lsh_explicit = true;
  } else {
    o.lsh = optimal_lsh_params(o.threshold, o.num_perm, o.fp_weight, o.fn_weight);
  }

  KILN_RETURN_IF_ERROR(get_into(c, "domains.default", &o.domains.default_domain));
  if (Status st = validate_domain_name(o.domains.default_domain); !st.is_ok())
    return std::move(st).with_key("domains.default");
  KILN_RETURN_IF_ERROR(get_into(c, "domains.rules", &o.domains.rules));
  KILN_RETURN_IF_ERROR(get_into(c, "domains.model", &o.domains.model));
  KILN_RETURN_IF_ERROR(get_into(c, "domains.model_threshold", &o.domains.model_threshold));
  if (!(o.domains.model_threshold >= 0 && o.domains.model_threshold <= 1))
    return range_error("domains.model_threshold", "must be in [0, 1]");

  KILN_RETURN_IF_ERROR(get_into(c, "tokenizer.path", &o.tokenizer.path));
  KILN_RETURN_IF_ERROR(get_into(c, "tokenizer.vocab_size", &o.tokenizer.vocab_size));
  if (o.tokenizer.trains() &&
      (o.tokenizer.vocab_size < 257 || o.tokenizer.vocab_size > (int64_t{1} << 31)))
    return range_error("tokenizer.vocab_size", "must be between 257 and 2^31");
  int64_t train_bytes = 0;
  KILN_RETURN_IF_ERROR(get_into(c, "tokenizer.train_bytes", &train_bytes));
  if (o.tokenizer.trains() && train_bytes <= 0)
    return range_error("tokenizer.train_bytes", "must be positive");
  o.tokenizer.train_bytes = train_bytes > 0 ? static_cast<uint64_t>(train_bytes) : 0;
  KILN_RETURN_IF_ERROR(get_into(c, "tokenizer.pretokenizer", &o.tokenizer.pretokenizer));
  if (auto pre = pretokenizer_by_name(o.tokenizer.pretokenizer); !pre.is_ok())
    return range_error("tokenizer.pretokenizer", pre.status().message());
  KILN_RETURN_IF_ERROR(get_into(c, "chat.template", &o.chat.template_path));
  KILN_RETURN_IF_ERROR(resolve_chat_template(o.tokenizer, &o.chat));
  KILN_RETURN_IF_ERROR(get_into(c, "tokenizer.special_tokens", &o.tokenizer.special_tokens));
  if (o.tokenizer.special_tokens != "text" && o.tokenizer.special_tokens != "parse")
    return Status::usage("must be 'text' or 'parse', not '" + o.tokenizer.special_tokens + "'")
        .with_key("tokenizer.special_tokens");

  std::string comp;
  KILN_RETURN_IF_ERROR(get_into(c, "shards.compression", &comp));
  if (comp == "zstd") o.compression = ShardCompression::kZstd;
  else if (comp == "none") o.compression = ShardCompression::kNone;
  else return range_error("shards.compression", "must be 'zstd' or 'none', got '" + comp + "'");
  KILN_RETURN_IF_ERROR(get_into(c, "shards.level", &o.level));
  if (o.level < 1 || o.level > 19) return range_error("shards.level", "must be 1..19");
  KILN_RETURN_IF_ERROR(get_into(c, "shards.max_samples", &o.max_samples));
  KILN_RETURN_IF_ERROR(get_into(c, "shards.max_bytes", &o.max_bytes));
  KILN_RETURN_IF_ERROR(get_into(c, "split.val_fraction", &o.val_fraction));
  if (!(o.val_fraction >= 0 && o.val_fraction <= 0.5))
    return range_error("split.val_fraction", "must be in [0, 0.5]");
  KILN_RETURN_IF_ERROR(get_into(c, "split.val_min_docs", &o.val_min_docs));
  if (o.val_min_docs > 1000000) return range_error("split.val_min_docs", "must be 0..1000000");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<filter::FilterChain> chain,
                        filter::FilterChain::from_yaml(c.node("filters"), "filters"));
  o.filters = std::move(chain);
  return o;
}

}  // namespace kiln::prep
