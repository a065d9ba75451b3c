// The per-document annotation stage of `kiln prep`: domain tagging and tokenization.
//
// The prep pipeline (dataprep/prep_*) calls Annotator after deduplication, for kept documents
// only, in parallel. The implementation (annotate.cc, tagging/tokenizer engineer) uses the
// `domains.*` and `tokenizer.*` sections of the prep config:
//   domains.default      domain for documents no rule/model assigns (default "web")
//   domains.rules        YAML rules file ("" = built-in copy of configs/prep/domains.yaml)
//   domains.model        fastText model ("" = none); domains.model_threshold (0.5)
//   tokenizer.path       tokenizer JSON, or "" to train one on the kept documents
//   tokenizer.vocab_size vocabulary size when training (default 8192)
//   tokenizer.train_bytes max bytes of kept text sampled for training (default 64 MiB)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "common/status.h"
#include "dataprep/ingest/document.h"
#include "dataprep/prep_config.h"

namespace kiln::prep {

class Annotator {
 public:
  virtual ~Annotator() = default;

  // Builds the annotator from the (validated) prep options: loads the rules, the fastText model
  // and the tokenizer, or trains the tokenizer on `training_texts` (kept documents' texts in
  // global order; used only when tokenizer.trains(), may be empty otherwise). Errors name the key
  // of the file that could not be loaded.
  static Result<std::unique_ptr<Annotator>> create(const DomainOptions& domains,
                                                   const TokenizerOptions& tokenizer,
                                                   const std::vector<std::string>& training_texts);

  // Sets doc.domain, doc.domain_by and doc.tokens: tag() then tokenize(). Thread-safe (const;
  // called concurrently). The write stage calls the two apart to time them.
  Status annotate(Document& doc) const {
    KILN_RETURN_IF_ERROR(tag(doc));
    return tokenize(doc);
  }
  virtual Status tag(Document& doc) const = 0;       // doc.domain, doc.domain_by
  virtual Status tokenize(Document& doc) const = 0;  // doc.tokens (empty without a tokenizer)

  // Writes OUT/tokenizer.json (if there is a tokenizer) and returns the manifest's tokenizer
  // entry (path relative to out_dir, vocab_size, eos_id); an empty entry when none.
  virtual Result<ManifestTokenizer> save_tokenizer(const std::string& out_dir) const = 0;
};

}  // namespace kiln::prep
