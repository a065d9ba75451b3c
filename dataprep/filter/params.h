// Reading one `filters:` entry's parameters, each checked and named in errors
// ("filters[1].min_doc_words: must be >= 0"). Internal to dataprep/filter/.
// A parameter the entry does not set keeps the default the caller passed in; a null value turns
// an optional rule off (datatrove's None). finish() refuses keys nobody asked for, with a
// "did you mean" suggestion.
#pragma once

#include <yaml-cpp/yaml.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "dataprep/filter/filter.h"

namespace kiln::prep::filter {

class Params {
 public:
  Params(const YAML::Node& entry, std::string key) : entry_(entry), key_(std::move(key)) {}
  const std::string& key() const { return key_; }
  std::string key_of(const char* name) const { return key_ + "." + name; }

  // Numbers in [lo, hi]; optional ones accept null (= rule off).
  Status number(const char* name, double lo, double hi, std::optional<double>* v);
  Status number(const char* name, double lo, double hi, double* v);
  Status integer(const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* v);
  Status integer(const char* name, int64_t lo, int64_t hi, int64_t* v);
  Status boolean(const char* name, bool* v);
  Status text(const char* name, std::string* v);
  Status texts(const char* name, std::vector<std::string>* v);
  // A map of integer -> number, written as a list of [n, fraction] pairs.
  Status pairs(const char* name, int64_t lo, int64_t hi,
               std::vector<std::pair<int64_t, double>>* v);
  Status finish() const;

 private:
  Result<YAML::Node> get(const char* name);
  YAML::Node entry_;
  std::string key_;
  std::vector<std::string> known_{"name"};
};

// The filters (heuristics.cc, rules.cc).
Result<std::unique_ptr<Filter>> make_gopher_quality(Params& p);
Result<std::unique_ptr<Filter>> make_gopher_repetition(Params& p);
Result<std::unique_ptr<Filter>> make_c4(Params& p);
Result<std::unique_ptr<Filter>> make_fineweb(Params& p);
Result<std::unique_ptr<Filter>> make_length(Params& p);
Result<std::unique_ptr<Filter>> make_language(Params& p);
Result<std::unique_ptr<Filter>> make_pii(Params& p);
Result<std::unique_ptr<Filter>> make_url(Params& p);
Result<std::unique_ptr<Filter>> make_regex(Params& p);

}  // namespace kiln::prep::filter
