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

#include "common/config.h"
#include "common/manifest.h"
#include "common/status.h"
#include "dataprep/document.h"

namespace kiln {

class Annotator {
 public:
  virtual ~Annotator() = default;

  // Builds the annotator from the prep config. `training_texts` are kept documents' texts in
  // global order (used only when a tokenizer must be trained; may be empty otherwise).
  static Result<std::unique_ptr<Annotator>> create(const Config& prep_config,
                                                   const std::vector<std::string>& training_texts);

  // True when create() needs training_texts (no tokenizer.path given).
  static bool needs_training_texts(const Config& prep_config);

  // Sets doc.domain, doc.domain_by and doc.tokens. Thread-safe (const; called concurrently).
  virtual Status annotate(Document& doc) const = 0;

  // Writes OUT/tokenizer.json (if there is a tokenizer) and returns the manifest's tokenizer
  // entry (path relative to out_dir, vocab_size, eos_id); an empty entry when none.
  virtual Result<ManifestTokenizer> save_tokenizer(const std::string& out_dir) const = 0;
};

}  // namespace kiln
