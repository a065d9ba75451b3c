// Quality filters of `kiln prep` (docs/PREP.md "Quality filters"): an ordered chain configured by
// the `filters:` list of the prep config, run on every valid document in the scan pass, before
// normalisation and hashing, so deduplication, tagging and tokenization see only what is kept,
// as the filters left it.
//
// Each filter either keeps a document (possibly editing its text: c4 drops lines, pii masks
// addresses, regex strips lines; or annotating it: language writes `language` and
// `language_score` into its metadata) or drops it with a FilterDrop: the filter, the rule, the
// measured value and the threshold it crossed, e.g. "gopher_quality: alpha_words_ratio 0.41 <
// 0.8". The first filter that drops a document decides; later filters do not see it.
//
// Filters and parameters, their defaults (datatrove's, where datatrove implements the filter)
// and what every rule does for CJK text are listed in docs/PREP.md; the reference definitions
// the tests compare against are in tests/dataprep/filter_reference.py.
//
// Words (text.h, split_words): white-space separated tokens, with a leading or trailing run of
// punctuation split off as a token of its own (close to the Treebank tokenizer datatrove uses for
// English), and every CJK ideograph or kana its own word (Chinese and Japanese have no spaces).
//
// Determinism: a filter's decision and edit depend only on the text (and url) it is given.
// Thread safety: a FilterChain is immutable after construction; run() may be called from any
// number of threads at once (each thread keeps its own scratch, so a document costs no heap
// allocation once the scratch has grown).
// Failure: building a chain from a bad config returns kConfig naming the key
// ("filters[1].min_doc_words"), or kNotFound/kData naming a missing or unusable file.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln::prep::filter {

// Why a document was dropped.
struct FilterDrop {
  const char* rule = "";  // a static name, e.g. "alpha_words_ratio"
  double value = 0;       // what was measured
  double threshold = 0;   // the limit it crossed
  const char* op = "<";   // value <op> threshold is why it was dropped: "<", ">", "<=", ">=", "=="
  std::string note;       // optional detail (the language found, the matching pattern)
};

// The annotations a filter may add to a kept document's metadata.
struct FilterAnnotations {
  std::string language;       // "" = not set
  double language_score = 0;  // set with language
};

// What run() did to one document.
struct ChainOutcome {
  bool keep = true;
  int dropped_by = -1;  // index of the filter that dropped it
  FilterDrop drop;
  uint64_t edited_mask = 0;  // bit i: filter i changed the text (first 64 filters)
  FilterAnnotations annotations;
};

class Filter {
 public:
  virtual ~Filter() = default;
  // Returns true to keep. May edit *text (then sets *edited) or fill *ann; on a drop fills *drop.
  virtual bool apply(std::string* text, std::string_view url, FilterDrop* drop, bool* edited,
                     FilterAnnotations* ann) const = 0;
  virtual bool rewrites() const { return false; }  // may edit the text
  virtual bool annotates() const { return false; }
  virtual bool needs_url() const { return false; }
};

class FilterChain {
 public:
  // `filters` is the config's list (a YAML sequence of maps with a `name`); `key` names it in
  // errors. An empty or null list gives an empty chain.
  static Result<std::unique_ptr<FilterChain>> from_yaml(const YAML::Node& filters,
                                                        const std::string& key = "filters");
  ~FilterChain();

  bool empty() const { return filters_.empty(); }
  size_t size() const { return filters_.size(); }
  // A unique label per entry: its name, or "name#k" for the k-th (k >= 2) entry of that name.
  const std::string& label(size_t i) const { return labels_[i]; }
  const std::string& name(size_t i) const { return names_[i]; }
  bool needs_url() const;
  bool rewrites() const;   // some filter may edit the text
  bool annotates() const;  // some filter adds metadata

  // Runs every filter in order on *text (edited in place) until one drops it.
  ChainOutcome run(std::string* text, std::string_view url) const;
  // Re-applies only the filters that edit or annotate, in order, to a document run() kept: gives
  // the same text and annotations as run() at a fraction of the cost (the write stage uses it).
  ChainOutcome replay_kept(std::string* text, std::string_view url) const;

  // "gopher_quality: alpha_words_ratio 0.41 < 0.8" (values with up to 4 significant decimals).
  std::string describe(const ChainOutcome& o) const;

 private:
  FilterChain() = default;
  std::vector<std::unique_ptr<Filter>> filters_;
  std::vector<std::string> labels_, names_;
};

// The filter names the chain knows, in documentation order.
const std::vector<std::string>& filter_names();

}  // namespace kiln::prep::filter
