// Domain tagging rules (YAML), applied in order: the first rule that matches a document names its
// domain; documents no rule matches get the caller's default domain. Documented with the default
// rules file, configs/prep/domains.yaml, and in docs/TAGGING.md.
//
// A rules file:
//   rules:
//     - name: code-files           # required, unique; recorded as domain_by "rule:<name>"
//       domain: code               # the domain to assign, or
//       domain_from: domain        # ... take it from an input field: domain | source
//       # conditions; all given must hold (at least one); `any:` is a list of condition maps of
//       # which at least one must hold:
//       input_domain: [glob, ...]  # the input "domain" field
//       source: [glob, ...]        # the input "source" field
//       url_host: [glob, ...]      # host of the input "url" (lower-cased, no port)
//       url_path: [glob, ...]      # path of the input "url" ("/a/b.html", no query)
//       path: [glob, ...]          # input file path (text folders: also the document id); a glob
//                                  # without '/' matches the base name, one with '/' the whole path
//       meta: {key: glob | [globs] | true}  # a field of "meta" (or a carried top-level field)
//       head_contains: [text, ...] # any of these, ASCII case-insensitive, in the head of the text
//       head_regex: "..."          # ECMAScript regex searched in the head of the text
//       head_bytes: 4096           # size of the head for head_* (default 4096)
//       cjk_share: 0.1             # min share of CJK characters among the letters (first 8 KiB)
//       code_score: 0.5            # min code-likeness in [0, 1] (first 8 KiB; see code_score())
//       min_bytes: 0               # text length bounds
//       max_bytes: 0
// Globs are fnmatch(3) patterns (* ? [..]); one string may stand for a one-element list.
// Parsing errors are kConfig Statuses naming the file, the rule and the key (with "did you mean").
// match() is const and thread-safe.
#pragma once

#include <yaml-cpp/yaml.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "dataprep/ingest/document.h"

namespace kiln::prep {

// A domain name is used in paths and file names: ingest/document.h's is_valid_domain_name (1-64
// characters of [A-Za-z0-9_-], the rule the JSONL reader applies to an input "domain" field too).
// A kConfig Status naming the name otherwise.
Status validate_domain_name(std::string_view name);

// Text statistics used by the content conditions (exposed for tests and `kiln inspect`).
// Share of CJK characters (pretokenize.h's is_cjk_codepoint) among all letters, over the first
// `max_bytes` bytes; 0 when there are no letters.
double cjk_share(std::string_view text, size_t max_bytes = 8192);
// Code-likeness in [0, 1] over the first `max_bytes` after any leading /* */ or // comments (a
// licence header says nothing about the code): 0.45 * symbol density ({}[]()<>;=#*&|\_
// among non-space characters, saturating at 12%) + 0.30 * share of lines ending in ; { or }
// (saturating at 35%) + 0.25 * share of lines starting with a code keyword or directive
// (#include, def, return, //, ...; saturating at 25%). Prose scores below 0.1, C headers and
// source files mostly above 0.5.
double code_score(std::string_view text, size_t max_bytes = 8192);

struct DomainMatch {
  std::string domain;
  std::string rule;  // the rule's name
};

class DomainRules {
 public:
  DomainRules();
  ~DomainRules();
  DomainRules(DomainRules&&) noexcept;
  DomainRules& operator=(DomainRules&&) noexcept;

  // Parses a rules document; `origin` names it in errors.
  static Result<DomainRules> parse(const YAML::Node& root, const std::string& origin);
  static Result<DomainRules> parse_text(std::string_view yaml_text, const std::string& origin);
  // Reads a rules file; "" gives the built-in copy of configs/prep/domains.yaml.
  static Result<DomainRules> load(const std::string& path);
  // The text of the built-in default rules (configs/prep/domains.yaml as compiled in).
  static std::string_view builtin_yaml();

  // The first matching rule, or nullopt.
  std::optional<DomainMatch> match(const Document& doc) const;
  size_t size() const;
  // Names of the rules that take the domain from the input's "domain" field.
  std::set<std::string> rules_from_input_domain() const;
  // Every domain a fixed `domain:` rule can assign (domain_from rules add others at run time).
  std::vector<std::string> domains() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::prep
