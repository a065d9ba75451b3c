#include "common/config.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

namespace kiln {
namespace {

enum class ScalarKind { kBool, kInt, kFloat, kText, kNull };

ScalarKind scalar_kind(const YAML::Node& n) {
  if (n.IsNull()) return ScalarKind::kNull;
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return ScalarKind::kText;  // quoted in the source
  bool b;
  if (YAML::convert<bool>::decode(n, b) && s != "0" && s != "1") return ScalarKind::kBool;
  long long i;
  if (YAML::convert<long long>::decode(n, i)) return ScalarKind::kInt;
  double d;
  if (YAML::convert<double>::decode(n, d)) return ScalarKind::kFloat;
  return ScalarKind::kText;
}

const char* kind_name(ScalarKind k) {
  switch (k) {
    case ScalarKind::kBool: return "a boolean";
    case ScalarKind::kInt: return "an integer";
    case ScalarKind::kFloat: return "a number";
    case ScalarKind::kText: return "text";
    case ScalarKind::kNull: return "empty";
  }
  return "?";
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  return parts;
}

std::vector<std::string> child_keys(const YAML::Node& map) {
  std::vector<std::string> keys;
  if (map.IsMap())
    for (const auto& kv : map) keys.push_back(kv.first.as<std::string>());
  return keys;
}

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

bool Config::is_open(const std::string& path) const {
  for (const auto& p : open_paths_)
    if (path == p || path.rfind(p + ".", 0) == 0) return true;
  return false;
}

Status Config::merge(const YAML::Node& schema, YAML::Node target, const YAML::Node& user,
                     const std::string& prefix, const std::string& origin) {
  if (!user.IsMap()) {
    return Status::config("expected a mapping of keys").with_key(prefix.empty() ? "<top>" : prefix)
        .with_file(origin);
  }
  // A key must be a name: YAML's explicit keys (`? [a, b]`, `? {a: 1}`, a bare `?`) are lists,
  // mappings or null, which as<std::string>() throws on (a fuzz finding: kiln train aborted).
  auto key_of = [&](const YAML::Node& k, std::string* out) {
    if (!k.IsScalar()) {
      return Status::config("a key must be a name, not " +
                            std::string(k.IsNull() ? "empty" : k.IsMap() ? "a mapping" : "a list"))
          .with_key(prefix.empty() ? "<top>" : prefix)
          .with_file(origin)
          .with_line(k.Mark().line + 1);  // (0, not shown, when the node has no position)
    }
    *out = k.Scalar();
    return Status::ok();
  };
  for (const auto& kv : user) {
    std::string key;
    KILN_RETURN_IF_ERROR(key_of(kv.first, &key));
    std::string path = prefix.empty() ? key : prefix + "." + key;
    YAML::Node schema_child = schema.IsMap() ? schema[key] : YAML::Node();
    if (is_open(path)) {
      // Free-form subtree: merge maps key by key so repeated --set calls accumulate.
      YAML::Node existing = target[key];
      if (kv.second.IsMap() && existing.IsMap()) {
        for (const auto& child : kv.second) {
          std::string child_key;
          KILN_RETURN_IF_ERROR(key_of(child.first, &child_key));
          existing[child_key] = YAML::Clone(child.second);
        }
      } else {
        target[key] = YAML::Clone(kv.second);
      }
      continue;
    }
    if (!schema_child.IsDefined()) {
      std::string hint = closest_match(key, child_keys(schema));
      std::string msg = "unknown config key";
      if (!hint.empty()) {
        msg += " (did you mean '" + (prefix.empty() ? hint : prefix + "." + hint) + "'?)";
      } else if (schema.IsMap()) {
        std::string all;
        for (const auto& k : child_keys(schema)) all += (all.empty() ? "" : ", ") + k;
        msg += " (known keys here: " + all + ")";
      }
      return Status::config(msg).with_key(path).with_file(origin);
    }
    if (schema_child.IsMap()) {
      if (!kv.second.IsMap() && !kv.second.IsNull())
        return Status::config("expected a mapping").with_key(path).with_file(origin);
      if (kv.second.IsNull()) continue;
      KILN_RETURN_IF_ERROR(merge(schema_child, target[key], kv.second, path, origin));
      continue;
    }
    if (schema_child.IsSequence()) {
      if (!kv.second.IsSequence())
        return Status::config("expected a list").with_key(path).with_file(origin);
      target[key] = YAML::Clone(kv.second);
      continue;
    }
    // Scalar in the schema: the user's value must be a compatible scalar.
    if (!kv.second.IsScalar() && !kv.second.IsNull())
      return Status::config("expected a single value").with_key(path).with_file(origin);
    ScalarKind want = scalar_kind(schema_child);
    ScalarKind got = scalar_kind(kv.second);
    bool ok = want == got || want == ScalarKind::kNull || want == ScalarKind::kText ||
              got == ScalarKind::kNull || (want == ScalarKind::kFloat && got == ScalarKind::kInt);
    if (!ok) {
      return Status::config(std::string("expected ") + kind_name(want) + ", got '" +
                            kv.second.Scalar() + "'")
          .with_key(path).with_file(origin);
    }
    target[key] = YAML::Clone(kv.second);
  }
  return Status::ok();
}

namespace {

// A private copy of the built-in defaults, parsed once per process: yaml-cpp's scanner makes that
// parse cost more than the rest of a typical load, and a clone of the parsed tree a fraction of it
// (replaying the train_config fuzz corpus, 624 inputs: 0.54 -> 0.34 s of CPU).
Result<YAML::Node> parsed_defaults(std::string_view text) {
  static std::mutex mu;
  static std::map<std::string, YAML::Node, std::less<>> parsed;
  std::lock_guard lock(mu);
  auto it = parsed.find(text);
  if (it == parsed.end()) {
    YAML::Node node;
    try {
      node = YAML::Load(std::string(text));
    } catch (const YAML::Exception& e) {
      return Status::internal(std::string("built-in config defaults do not parse: ") + e.what());
    }
    it = parsed.emplace(std::string(text), node).first;
  }
  return YAML::Clone(it->second);
}

}  // namespace

Result<Config> Config::load(std::string_view defaults_yaml, const std::string& file,
                            const std::vector<std::string>& sets,
                            std::vector<std::string> open_paths) {
  Config cfg;
  cfg.open_paths_ = std::move(open_paths);
  KILN_ASSIGN_OR_RETURN(cfg.schema_, parsed_defaults(defaults_yaml));
  cfg.root_ = YAML::Clone(cfg.schema_);
  if (!file.empty()) {
    YAML::Node user;
    try {
      user = YAML::LoadFile(file);
    } catch (const YAML::BadFile&) {
      return Status::config("cannot open config file").with_file(file);
    } catch (const YAML::Exception& e) {
      return Status::config(std::string("invalid YAML: ") + e.msg).with_file(file)
          .with_line(e.mark.line + 1);
    }
    if (!user.IsNull()) KILN_RETURN_IF_ERROR(cfg.merge(cfg.schema_, cfg.root_, user, "", file));
  }
  for (const auto& s : sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::usage("--set expects key.path=value, got '" + s + "'");
    KILN_RETURN_IF_ERROR(cfg.set(s.substr(0, eq), s.substr(eq + 1)));
  }
  return cfg;
}

Status Config::set(const std::string& path, const std::string& value) {
  YAML::Node v;
  try {
    v = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    return Status::config("value does not parse: " + value).with_key(path);
  }
  return set_node(path, v);
}

Status Config::set_node(const std::string& path, const YAML::Node& value) {
  auto parts = split_path(path);
  if (parts.empty()) return Status::config("empty key");
  // Build {a: {b: {c: value}}} and merge it like a file, so validation is identical.
  YAML::Node user = YAML::Clone(value);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node wrap(YAML::NodeType::Map);
    wrap[*it] = user;
    user = wrap;
  }
  return merge(schema_, root_, user, "", "--set");
}

YAML::Node Config::node(const std::string& path) const {
  // Walks root_ itself with const lookups (a non-const operator[] can add the key) and moves along
  // with reset() (yaml-cpp's Node::operator= would overwrite the node assigned to, here one of
  // root_'s); only the subtree found is cloned, so the caller never shares root_. (Cloning root_
  // for every lookup made loading a config quadratic in its size.)
  YAML::Node cur(root_);
  for (const auto& part : split_path(path)) {
    if (!cur.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& view = cur;
    const YAML::Node next = view[part];
    if (!next.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    cur.reset(next);
  }
  return YAML::Clone(cur);
}

bool Config::has(const std::string& path) const {
  YAML::Node n = node(path);
  return n.IsDefined() && !n.IsNull();
}

std::string Config::dump() const {
  YAML::Emitter out;
  out << root_;
  return std::string(out.c_str()) + "\n";
}

}  // namespace kiln
