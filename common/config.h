// YAML configuration with a schema of defaults.
//
// Every command declares its keys as a YAML document of defaults. A user's config file and
// `--set key.path=value` overrides are merged on top; a key that the defaults do not have is a
// config error naming it, with a "did you mean" suggestion. A value whose kind differs from the
// default's (map vs scalar, number vs text, bool) is an error naming the key. Paths listed as
// open (e.g. "data.mixture") accept any child keys.
//
// Typed reads: get<T>("model.d_model"). Errors name the key. Not thread-safe for writes.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln {

class Config {
 public:
  // defaults_yaml: the schema and defaults. file: a YAML file or "" for none.
  // sets: "key.path=value" strings (value parsed as YAML). Flags are applied by the caller
  // afterwards with set(), so they win over both.
  static Result<Config> load(std::string_view defaults_yaml, const std::string& file,
                             const std::vector<std::string>& sets,
                             std::vector<std::string> open_paths = {});

  // Overrides one key (dotted path) with a YAML-parsed value, validated against the schema.
  Status set(const std::string& path, const std::string& value);
  Status set_node(const std::string& path, const YAML::Node& value);

  bool has(const std::string& path) const;
  YAML::Node node(const std::string& path) const;

  template <typename T>
  Result<T> get(const std::string& path) const {
    YAML::Node n = node(path);
    if (!n.IsDefined() || n.IsNull()) return Status::config("missing value").with_key(path);
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      return Status::config("has the wrong type for this key: '" + YAML::Dump(n) + "'")
          .with_key(path);
    }
  }

  const YAML::Node& root() const { return root_; }
  // The resolved config as YAML text (written to RUN/config.yaml).
  std::string dump() const;

 private:
  Status merge(const YAML::Node& schema, YAML::Node target, const YAML::Node& user,
               const std::string& prefix, const std::string& origin);
  bool is_open(const std::string& path) const;
  YAML::Node schema_;
  YAML::Node root_;
  std::vector<std::string> open_paths_;
};

// Levenshtein edit distance; used for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word` within a small distance, or "" if none is close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace kiln
