// The annotation stage of `kiln prep`: domain (rules, then an optional fastText model) and tokens.
//
// Domain decision per document:
//   1. the rules (domains.rules, default configs/prep/domains.yaml), first match wins;
//   2. when a fastText model is configured (domains.model) and the document's domain did not come
//      from its own input "domain" field, the model's top label replaces the rules' answer if its
//      probability is at least domains.model_threshold; below it the rules' answer stands;
//   3. otherwise domains.default.
// domain_by records which: "rule:<name>", "model", or "default".
//
// Tokens: tokenizer.path names a tokenizer file (a Hugging Face tokenizer.json, a SentencePiece
// .model, Kiln's older JSON, or a GPT-2 vocab.json with merges.txt beside it); "" trains a
// byte-level BPE tokenizer of tokenizer.vocab_size on the kept texts (a deterministic, evenly
// spread sample of at most tokenizer.train_bytes); "none" disables tokenization (no .tokens.npy).
#include "dataprep/annotate.h"

#include <filesystem>
#include <optional>
#include <set>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/log.h"
#include "dataprep/chat/chat_data.h"
#include "dataprep/tagging/domain_rules.h"
#include "dataprep/tagging/tagger.h"
#include "dataprep/tokenizer/tokenizer.h"

namespace kiln::prep {
namespace {

class RulesAnnotator final : public Annotator {
 public:
  Status annotate(Document& doc) const override {
    std::optional<DomainMatch> m = rules_.match(doc);
    // A domain read from the input's own "domain" field is never overridden by the model.
    bool declared = m && declared_rules_.count(m->rule);
    if (m) {
      doc.domain = m->domain;
      doc.domain_by = "rule:" + m->rule;
    } else {
      doc.domain = default_domain_;
      doc.domain_by = "default";
    }
    if (model_ && !declared) {
      auto p = model_->predict(doc.text);
      if (p && p->probability >= model_threshold_) {
        doc.domain = p->domain;
        doc.domain_by = "model";
      }
    }
    doc.tokens.clear();
    doc.loss_mask.clear();
    if (tokenizer_ && doc.chat) {
      // Chat samples: special-token text parsed (as transformers tokenizes a rendered template)
      // and the loss mask beside the ids.
      if (!chat_) return chat_status_;
      std::vector<std::pair<size_t, size_t>> spans(doc.chat_spans.begin(), doc.chat_spans.end());
      chat_->encode(doc.text, spans, &doc.tokens, &doc.loss_mask);
    } else if (tokenizer_) {
      KILN_RETURN_IF_ERROR(tokenizer_->encode(doc.text, &doc.tokens));
    }
    return Status::ok();
  }

  Result<ManifestTokenizer> save_tokenizer(const std::string& out_dir) const override {
    if (!tokenizer_) return ManifestTokenizer{};
    // tokenizer.json (Hugging Face format; a loaded tokenizer.json as it was), or
    // tokenizer.model for a SentencePiece model.
    std::string path = (std::filesystem::path(out_dir) / tokenizer_->file_name()).string();
    KILN_RETURN_IF_ERROR(tokenizer_->save(path));
    // A given tokenizer.json may have taken its end of text from the tokenizer_config.json beside
    // it: one goes beside the copy too, so the copy loads with the same eos_id.
    if (std::string_view(tokenizer_->kind()) == "huggingface")
      KILN_RETURN_IF_ERROR(
          write_file_atomic((std::filesystem::path(out_dir) / "tokenizer_config.json").string(),
                            hf_tokenizer_config_json(*tokenizer_, {})));
    ManifestTokenizer t;
    t.path = tokenizer_->file_name();
    t.vocab_size = tokenizer_->vocab_size();
    t.eos_id = tokenizer_->eos_id();
    return t;
  }

  DomainRules rules_;
  std::set<std::string> declared_rules_;
  std::string default_domain_;
  std::unique_ptr<FastTextTagger> model_;
  double model_threshold_ = 0.5;
  std::optional<Tokenizer> tokenizer_;
  std::optional<chat::ChatEncoder> chat_;  // for chat samples; when unset, chat_status_ says why
  Status chat_status_ = Status::usage("chat data needs a tokenizer");
};

// An evenly spread, deterministic sample of at most max_bytes of the texts: each text is kept
// when a hash of its position falls under the sampling rate, so the sample does not favour the
// inputs that sort first.
std::vector<std::string_view> sample_texts(const std::vector<std::string>& texts,
                                           uint64_t max_bytes) {
  uint64_t total = 0;
  for (const auto& t : texts) total += t.size();
  std::vector<std::string_view> out;
  if (total <= max_bytes) {
    out.assign(texts.begin(), texts.end());
    return out;
  }
  double rate = double(max_bytes) / double(total);
  uint64_t cut = uint64_t(rate * 18446744073709551615.0);
  uint64_t taken = 0;
  for (uint64_t i = 0; i < texts.size(); ++i) {
    if (xxh3_64(&i, sizeof(i), 0x6b696c6e) >= cut) continue;
    if (taken + texts[i].size() > max_bytes) continue;
    taken += texts[i].size();
    out.push_back(texts[i]);
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Annotator>> Annotator::create(const DomainOptions& domains,
                                                     const TokenizerOptions& tokenizer,
                                                     const std::vector<std::string>& training_texts) {
  auto a = std::make_unique<RulesAnnotator>();
  a->default_domain_ = domains.default_domain;
  auto rules = DomainRules::load(domains.rules);
  if (!rules.is_ok()) return std::move(rules).take_status().prefixed("domains.rules");
  a->rules_ = std::move(rules).value();
  a->declared_rules_ = a->rules_.rules_from_input_domain();

  a->model_threshold_ = domains.model_threshold;
  if (!domains.model.empty()) {
    auto model = FastTextTagger::load(domains.model);
    if (!model.is_ok()) return std::move(model).take_status().with_key("domains.model");
    a->model_ = std::move(model).value();
  }

  const std::string& tok_path = tokenizer.path;
  if (tok_path == "none") {
    // No tokenizer: documents carry no tokens.
  } else if (!tok_path.empty()) {
    auto tok = Tokenizer::load(tok_path);
    if (!tok.is_ok()) {
      // A field inside the tokenizer file (e.g. model.type) is the more useful key to name.
      Status st = std::move(tok).take_status();
      if (st.key().empty()) st.with_key("tokenizer.path");
      return st;
    }
    a->tokenizer_ = std::move(tok).value();
    a->tokenizer_->set_special_tokens(tokenizer.special_tokens == "parse" ? SpecialTokens::kParse
                                                                          : SpecialTokens::kText);
  } else {
    const int64_t vocab = tokenizer.vocab_size;
    TokenizerTrainOptions opts;
    opts.vocab_size = size_t(vocab);
    auto pre = pretokenizer_by_name(tokenizer.pretokenizer);
    if (!pre.is_ok()) return std::move(pre).take_status().with_key("tokenizer.pretokenizer");
    opts.pretokenizer = std::move(pre).value();
    auto sample = sample_texts(training_texts, tokenizer.train_bytes);
    uint64_t bytes = 0;
    for (auto s : sample) bytes += s.size();
    KILN_LOG_INFO("training a {}-token BPE tokenizer on {} documents ({:.1f} MiB)", vocab,
                  sample.size(), double(bytes) / (1 << 20));
    auto tok = Tokenizer::train(sample, opts);
    if (!tok.is_ok()) return std::move(tok).take_status().with_key("tokenizer.vocab_size");
    a->tokenizer_ = std::move(tok).value();
    KILN_LOG_INFO("tokenizer: {} tokens ({} merges)", a->tokenizer_->vocab_size(),
                  a->tokenizer_->num_merges());
  }
  if (a->tokenizer_) {
    auto enc = chat::ChatEncoder::create(*a->tokenizer_);
    if (enc.is_ok())
      a->chat_ = std::move(enc).value();
    else
      a->chat_status_ = std::move(enc).take_status().with_key("tokenizer.path");
  }
  return std::unique_ptr<Annotator>(std::move(a));
}

}  // namespace kiln::prep
