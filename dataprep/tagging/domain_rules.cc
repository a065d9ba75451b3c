#include "dataprep/tagging/domain_rules.h"

#include <fnmatch.h>
#include <utf8proc.h>

#include <algorithm>
#include <regex>
#include <set>

#include "common/atomic_file.h"
#include "common/config.h"
#include "dataprep/ingest/url.h"
#include "dataprep/tokenizer/pretokenize.h"

namespace kiln::prep {

// The built-in default rules: configs/prep/domains.yaml (domain_rules_default.cc).
extern const char* const kDefaultDomainRulesYaml;

namespace {

bool glob_match(const std::string& pattern, std::string_view value, bool path_mode) {
  std::string v(value);
  if (path_mode && pattern.find('/') == std::string::npos) {
    size_t slash = v.rfind('/');
    if (slash != std::string::npos) v = v.substr(slash + 1);
  }
  return fnmatch(pattern.c_str(), v.c_str(), 0) == 0;
}

bool any_glob(const std::vector<std::string>& patterns, std::string_view value, bool path_mode) {
  for (const auto& p : patterns)
    if (glob_match(p, value, path_mode)) return true;
  return false;
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

bool contains_ci(std::string_view hay, const std::string& needle_lower) {
  if (needle_lower.empty()) return true;
  if (hay.size() < needle_lower.size()) return false;
  for (size_t i = 0; i + needle_lower.size() <= hay.size(); ++i) {
    if (lower(hay[i]) != needle_lower[0]) continue;
    size_t k = 1;
    while (k < needle_lower.size() && lower(hay[i + k]) == needle_lower[k]) ++k;
    if (k == needle_lower.size()) return true;
  }
  return false;
}

// Head of a text cut at a UTF-8 boundary.
std::string_view head(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

std::string json_scalar_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

// ---- conditions --------------------------------------------------------------------------------

struct Conditions {
  std::vector<std::string> input_domain, source, url_host, url_path, path;
  std::vector<std::pair<std::string, std::vector<std::string>>> meta;  // empty globs = present
  std::vector<std::string> head_contains;  // lower-cased
  std::optional<std::regex> head_regex;
  size_t head_bytes = 4096;
  std::optional<double> cjk_share, code_score;
  std::optional<uint64_t> min_bytes, max_bytes;
  std::vector<Conditions> any;
  size_t count = 0;  // conditions given
};

// Lazily computed per-document facts shared by the rules.
struct DocFacts {
  const Document& doc;
  std::optional<double> cjk, code;
  bool url_split = false;
  std::string host, url_path;
  explicit DocFacts(const Document& d) : doc(d) {}
  double get_cjk() {
    if (!cjk) cjk = cjk_share(doc.text);
    return *cjk;
  }
  double get_code() {
    if (!code) code = prep::code_score(doc.text);
    return *code;
  }
  void split() {
    if (!url_split) split_url(doc.url, &host, &url_path);
    url_split = true;
  }
};

const nlohmann::json* find_meta(const Document& doc, const std::string& key) {
  const auto& c = doc.carried;
  if (!c.is_object()) return nullptr;
  auto meta = c.find("meta");
  if (meta != c.end() && meta->is_object()) {
    auto it = meta->find(key);
    if (it != meta->end()) return &*it;
  }
  auto it = c.find(key);
  return it == c.end() ? nullptr : &*it;
}

bool holds(const Conditions& c, DocFacts& f) {
  const Document& doc = f.doc;
  if (!c.input_domain.empty() && !any_glob(c.input_domain, doc.input_domain, false)) return false;
  if (!c.source.empty() && !any_glob(c.source, doc.source, false)) return false;
  if (!c.url_host.empty() || !c.url_path.empty()) {
    if (doc.url.empty()) return false;
    f.split();
    if (!c.url_host.empty() && !any_glob(c.url_host, f.host, false)) return false;
    if (!c.url_path.empty() && !any_glob(c.url_path, f.url_path, false)) return false;
  }
  if (!c.path.empty()) {
    bool ok = any_glob(c.path, doc.file, true) || (doc.line == 0 && any_glob(c.path, doc.id, true));
    if (!ok) return false;
  }
  for (const auto& [key, globs] : c.meta) {
    const nlohmann::json* v = find_meta(doc, key);
    if (!v || v->is_null()) return false;
    if (!globs.empty() && !any_glob(globs, json_scalar_text(*v), false)) return false;
  }
  if (c.min_bytes && doc.text.size() < *c.min_bytes) return false;
  if (c.max_bytes && doc.text.size() > *c.max_bytes) return false;
  if (!c.head_contains.empty()) {
    std::string_view h = head(doc.text, c.head_bytes);
    bool ok = false;
    for (const auto& needle : c.head_contains)
      if (contains_ci(h, needle)) {
        ok = true;
        break;
      }
    if (!ok) return false;
  }
  if (c.head_regex) {
    std::string_view h = head(doc.text, c.head_bytes);
    if (!std::regex_search(h.begin(), h.end(), *c.head_regex)) return false;
  }
  if (c.cjk_share && f.get_cjk() < *c.cjk_share) return false;
  if (c.code_score && f.get_code() < *c.code_score) return false;
  if (!c.any.empty()) {
    bool ok = false;
    for (const auto& alt : c.any)
      if (holds(alt, f)) {
        ok = true;
        break;
      }
    if (!ok) return false;
  }
  return true;
}

// ---- parsing -----------------------------------------------------------------------------------

const std::vector<std::string> kConditionKeys = {
    "input_domain", "source",     "url_host",   "url_path",  "path",      "meta",
    "head_contains", "head_regex", "head_bytes", "cjk_share", "code_score", "min_bytes",
    "max_bytes",    "any"};

Status key_error(const std::string& origin, const std::string& where, const std::string& msg) {
  return Status::config(msg).with_file(origin).with_key(where);
}

Result<std::vector<std::string>> string_list(const YAML::Node& n, const std::string& origin,
                                             const std::string& where) {
  std::vector<std::string> out;
  if (n.IsScalar()) {
    out.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (const auto& item : n) {
      if (!item.IsScalar()) return key_error(origin, where, "must be a string or a list of strings");
      out.push_back(item.Scalar());
    }
  } else {
    return key_error(origin, where, "must be a string or a list of strings");
  }
  if (out.empty()) return key_error(origin, where, "must not be an empty list");
  return out;
}

Result<double> number(const YAML::Node& n, const std::string& origin, const std::string& where,
                      double lo, double hi) {
  double v;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !(v >= lo && v <= hi))
    return key_error(origin, where,
                     "must be a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

Status parse_conditions(const YAML::Node& map, const std::string& origin, const std::string& where,
                        bool allow_rule_keys, Conditions* c) {
  for (const auto& kv : map) {
    std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    std::string at = where + "." + key;
    if (allow_rule_keys && (key == "name" || key == "domain" || key == "domain_from")) continue;
    if (key == "input_domain" || key == "source" || key == "url_host" || key == "url_path" ||
        key == "path") {
      KILN_ASSIGN_OR_RETURN(auto list, string_list(v, origin, at));
      if (key == "url_host")
        for (auto& s : list) std::transform(s.begin(), s.end(), s.begin(), lower);
      (key == "input_domain" ? c->input_domain
       : key == "source"     ? c->source
       : key == "url_host"   ? c->url_host
       : key == "url_path"   ? c->url_path
                             : c->path) = std::move(list);
    } else if (key == "meta") {
      if (!v.IsMap() || v.size() == 0) return key_error(origin, at, "must be a map of field: glob(s) or true");
      for (const auto& m : v) {
        std::string field = m.first.as<std::string>();
        bool present_only = false;
        if (m.second.IsScalar() && YAML::convert<bool>::decode(m.second, present_only) &&
            m.second.Scalar() != "0" && m.second.Scalar() != "1") {
          if (!present_only) return key_error(origin, at + "." + field, "use true (present) or glob(s)");
          c->meta.emplace_back(field, std::vector<std::string>{});
        } else {
          KILN_ASSIGN_OR_RETURN(auto globs, string_list(m.second, origin, at + "." + field));
          c->meta.emplace_back(field, std::move(globs));
        }
      }
    } else if (key == "head_contains") {
      KILN_ASSIGN_OR_RETURN(auto list, string_list(v, origin, at));
      for (auto& s : list) std::transform(s.begin(), s.end(), s.begin(), lower);
      c->head_contains = std::move(list);
    } else if (key == "head_regex") {
      if (!v.IsScalar()) return key_error(origin, at, "must be a regular expression string");
      try {
        c->head_regex.emplace(v.Scalar(), std::regex::ECMAScript | std::regex::optimize);
      } catch (const std::regex_error& e) {
        return key_error(origin, at, std::string("invalid regular expression: ") + e.what());
      }
    } else if (key == "head_bytes") {
      KILN_ASSIGN_OR_RETURN(double b, number(v, origin, at, 1, double(1 << 30)));
      c->head_bytes = size_t(b);
      continue;  // a setting, not a condition
    } else if (key == "cjk_share" || key == "code_score") {
      KILN_ASSIGN_OR_RETURN(double x, number(v, origin, at, 0, 1));
      (key == "cjk_share" ? c->cjk_share : c->code_score) = x;
    } else if (key == "min_bytes" || key == "max_bytes") {
      KILN_ASSIGN_OR_RETURN(double x, number(v, origin, at, 0, 1e18));
      (key == "min_bytes" ? c->min_bytes : c->max_bytes) = uint64_t(x);
    } else if (key == "any") {
      if (!v.IsSequence() || v.size() == 0) return key_error(origin, at, "must be a non-empty list of condition maps");
      for (size_t i = 0; i < v.size(); ++i) {
        std::string at_i = at + "[" + std::to_string(i) + "]";
        if (!v[i].IsMap()) return key_error(origin, at_i, "must be a map of conditions");
        Conditions alt;
        KILN_RETURN_IF_ERROR(parse_conditions(v[i], origin, at_i, false, &alt));
        c->any.push_back(std::move(alt));
      }
    } else {
      std::vector<std::string> known = kConditionKeys;
      if (allow_rule_keys) known.insert(known.end(), {"name", "domain", "domain_from"});
      std::string hint = closest_match(key, known);
      return key_error(origin, at, "unknown key" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
    ++c->count;
  }
  if (c->count == 0) return key_error(origin, where, "has no conditions");
  return Status::ok();
}

struct Rule {
  std::string name;
  std::string domain;       // fixed domain, or
  std::string domain_from;  // "domain" | "source"
  Conditions when;
};

}  // namespace

struct DomainRules::Impl {
  std::vector<Rule> rules;
};

DomainRules::DomainRules() : impl_(std::make_unique<Impl>()) {}
DomainRules::~DomainRules() = default;
DomainRules::DomainRules(DomainRules&&) noexcept = default;
DomainRules& DomainRules::operator=(DomainRules&&) noexcept = default;

size_t DomainRules::size() const { return impl_->rules.size(); }

std::vector<std::string> DomainRules::domains() const {
  std::set<std::string> out;
  for (const auto& r : impl_->rules)
    if (!r.domain.empty()) out.insert(r.domain);
  return {out.begin(), out.end()};
}

std::set<std::string> DomainRules::rules_from_input_domain() const {
  std::set<std::string> out;
  for (const auto& r : impl_->rules)
    if (r.domain_from == "domain") out.insert(r.name);
  return out;
}

std::string_view DomainRules::builtin_yaml() { return kDefaultDomainRulesYaml; }

Status validate_domain_name(std::string_view name) {
  if (!is_valid_domain_name(name))
    return Status::config("domain name '" + std::string(name) +
                          "' must be 1-64 characters of A-Z a-z 0-9 _ -");
  return Status::ok();
}

Result<DomainRules> DomainRules::parse(const YAML::Node& root, const std::string& origin) {
  if (!root.IsMap() || !root["rules"])
    return Status::config("a rules file must be a map with a 'rules' list").with_file(origin);
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    if (key != "rules")
      return key_error(origin, key, "unknown key (a rules file has only 'rules')");
  }
  const YAML::Node& list = root["rules"];
  if (!list.IsSequence()) return key_error(origin, "rules", "must be a list");
  DomainRules out;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node& r = list[i];
    std::string where = "rules[" + std::to_string(i) + "]";
    if (!r.IsMap()) return key_error(origin, where, "must be a map");
    Rule rule;
    if (!r["name"] || !r["name"].IsScalar() || r["name"].Scalar().empty())
      return key_error(origin, where + ".name", "every rule needs a name");
    rule.name = r["name"].Scalar();
    where = "rules[" + std::to_string(i) + "] (" + rule.name + ")";
    if (!names.insert(rule.name).second) return key_error(origin, where, "duplicate rule name");
    bool has_domain = bool(r["domain"]), has_from = bool(r["domain_from"]);
    if (has_domain == has_from)
      return key_error(origin, where, "needs exactly one of 'domain' and 'domain_from'");
    if (has_domain) {
      if (!r["domain"].IsScalar()) return key_error(origin, where + ".domain", "must be a name");
      rule.domain = r["domain"].Scalar();
      Status st = validate_domain_name(rule.domain);
      if (!st.is_ok()) return key_error(origin, where + ".domain", st.message());
    } else {
      rule.domain_from = r["domain_from"].IsScalar() ? r["domain_from"].Scalar() : "";
      if (rule.domain_from != "domain" && rule.domain_from != "source")
        return key_error(origin, where + ".domain_from", "must be 'domain' or 'source'");
    }
    KILN_RETURN_IF_ERROR(parse_conditions(r, origin, where, true, &rule.when));
    out.impl_->rules.push_back(std::move(rule));
  }
  return out;
}

Result<DomainRules> DomainRules::parse_text(std::string_view yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return Status::config(std::string("invalid YAML: ") + e.what()).with_file(origin);
  }
  return parse(root, origin);
}

Result<DomainRules> DomainRules::load(const std::string& path) {
  if (path.empty()) return parse_text(builtin_yaml(), "built-in configs/prep/domains.yaml");
  auto text = read_file(path);
  if (!text.is_ok()) return std::move(text).take_status();
  return parse_text(*text, path);
}

std::optional<DomainMatch> DomainRules::match(const Document& doc) const {
  DocFacts facts(doc);
  for (const auto& rule : impl_->rules) {
    std::string domain = rule.domain;
    if (!rule.domain_from.empty()) {
      domain = rule.domain_from == "domain" ? doc.input_domain : doc.source;
      if (domain.empty() || !validate_domain_name(domain).is_ok()) continue;
    }
    if (holds(rule.when, facts)) return DomainMatch{domain, rule.name};
  }
  return std::nullopt;
}

// ---- text statistics ---------------------------------------------------------------------------

double cjk_share(std::string_view text, size_t max_bytes) {
  std::string_view h = head(text, max_bytes);
  uint64_t letters = 0, cjk = 0;
  size_t i = 0;
  while (i < h.size()) {
    auto b = static_cast<unsigned char>(h[i]);
    if (b < 0x80) {
      letters += ((b | 0x20) >= 'a' && (b | 0x20) <= 'z');
      ++i;
      continue;
    }
    utf8proc_int32_t cp;
    auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(h.data() + i),
                                utf8proc_ssize_t(h.size() - i), &cp);
    if (len <= 0) {
      ++i;
      continue;
    }
    i += size_t(len);
    auto cat = utf8proc_category(cp);
    if (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) {
      ++letters;
      cjk += is_cjk_codepoint(cp);
    }
  }
  return letters ? double(cjk) / double(letters) : 0.0;
}

// Skips a leading block comment ("/* ... */") and "//" comment lines: source files often open
// with a long licence comment that says nothing about the code after it.
std::string_view skip_leading_comments(std::string_view text) {
  while (true) {
    size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return {};
    std::string_view rest = text.substr(first);
    if (rest.starts_with("/*")) {
      size_t end = rest.find("*/", 2);
      if (end == std::string_view::npos) return {};
      text = rest.substr(end + 2);
    } else if (rest.starts_with("//")) {
      size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) return {};
      text = rest.substr(nl + 1);
    } else {
      return text;
    }
  }
}

double code_score(std::string_view text, size_t max_bytes) {
  static const char* const kKeywords[] = {
      "#include", "#define", "#if",    "#endif",    "#pragma", "#!",       "import ",   "from ",
      "def ",     "class ",  "return", "static ",   "const ",  "int ",     "void ",     "struct ",
      "typedef ", "extern ", "public:", "private:", "function ", "var ",   "let ",      "fn ",
      "package ", "//",      "/*",     "*/",        "template", "namespace ", "using ", "if (",
      "for (",    "while (", "} else", "else {",    "enum ",   "union ",   "#else",     "#undef"};
  std::string_view h = head(skip_leading_comments(text), max_bytes);
  uint64_t lines = 0, end_lines = 0, kw_lines = 0, nonspace = 0, symbols = 0;
  size_t pos = 0;
  while (pos < h.size()) {
    size_t nl = h.find('\n', pos);
    if (nl == std::string_view::npos) nl = h.size();
    std::string_view line = h.substr(pos, nl - pos);
    pos = nl + 1;
    size_t first = line.find_first_not_of(" \t\r\f\v");
    if (first == std::string_view::npos) continue;
    size_t last = line.find_last_not_of(" \t\r\f\v");
    ++lines;
    char end = line[last];
    end_lines += (end == ';' || end == '{' || end == '}');
    std::string_view body = line.substr(first);
    for (const char* kw : kKeywords)
      if (body.starts_with(kw)) {
        ++kw_lines;
        break;
      }
    for (char c : line) {
      if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') continue;
      ++nonspace;
      switch (c) {
        case '{': case '}': case '[': case ']': case '(': case ')': case '<': case '>':
        case ';': case '=': case '#': case '*': case '&': case '|': case '\\': case '_':
          ++symbols;
          break;
        default:
          break;
      }
    }
  }
  if (lines == 0 || nonspace == 0) return 0.0;
  double sym = double(symbols) / double(nonspace);
  double end = double(end_lines) / double(lines);
  double kw = double(kw_lines) / double(lines);
  return 0.45 * std::min(1.0, sym / 0.12) + 0.30 * std::min(1.0, end / 0.35) +
         0.25 * std::min(1.0, kw / 0.25);
}

}  // namespace kiln::prep
