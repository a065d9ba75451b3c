#include "format/manifest.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"

namespace kiln {
namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr const char* kManifestName = "manifest.json";

// A relative path that stays inside the manifest's directory.
Status validate_relative_path(const std::string& path) {
  if (path.empty()) return Status::data("empty path");
  if (path.front() == '/') return Status::data("path '" + path + "' is absolute");
  if (path.find('\0') != std::string::npos) return Status::data("path holds a NUL byte");
  for (const auto& part : fs::path(path)) {
    if (part == "..") return Status::data("path '" + path + "' has a '..' component");
  }
  return Status::ok();
}

ordered_json domain_json(const ManifestDomain& d) {
  ordered_json j;
  j["samples"] = d.samples;
  j["tokens"] = d.tokens;
  j["shards"] = d.shards;
  j["bytes"] = d.bytes;
  return j;
}

// Field access with errors that name the field ("shards[3].xxh3").
class Fields {
 public:
  Fields(const nlohmann::json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  Status require_object() const {
    if (!obj_.is_object()) return error(where_, "must be an object");
    return Status::ok();
  }
  Result<const nlohmann::json*> get(const char* name) const {
    auto it = obj_.find(name);
    if (it == obj_.end()) return error(field(name), "missing");
    return &*it;
  }
  Result<std::string> string(const char* name) const {
    KILN_ASSIGN_OR_RETURN(const nlohmann::json* v, get(name));
    if (!v->is_string()) return error(field(name), "must be a string");
    return v->get<std::string>();
  }
  Result<uint64_t> count(const char* name) const {
    KILN_ASSIGN_OR_RETURN(const nlohmann::json* v, get(name));
    if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0)) {
      return error(field(name), "must be a non-negative integer");
    }
    return v->get<uint64_t>();
  }
  Result<int64_t> integer(const char* name) const {
    KILN_ASSIGN_OR_RETURN(const nlohmann::json* v, get(name));
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return error(field(name), "is out of range");
      }
      return static_cast<int64_t>(v->get<uint64_t>());
    }
    if (!v->is_number_integer()) return error(field(name), "must be an integer");
    return v->get<int64_t>();
  }
  std::string field(const char* name) const {
    return where_.empty() ? std::string(name) : where_ + "." + name;
  }
  static Status error(const std::string& field, const std::string& what) {
    return Status::data(what).with_key(field);
  }

 private:
  const nlohmann::json& obj_;
  std::string where_;
};

Result<Manifest> parse_manifest(const nlohmann::json& root) {
  Manifest m;
  Fields top(root, "");
  if (!root.is_object()) return Status::data("manifest must be a JSON object");
  KILN_ASSIGN_OR_RETURN(m.format, top.string("format"));
  if (m.format != kManifestFormat) {
    return Fields::error("format", "is '" + m.format + "', expected '" + kManifestFormat + "'");
  }

  KILN_ASSIGN_OR_RETURN(const nlohmann::json* tok, top.get("tokenizer"));
  Fields tf(*tok, "tokenizer");
  KILN_RETURN_IF_ERROR(tf.require_object());
  KILN_ASSIGN_OR_RETURN(m.tokenizer.path, tf.string("path"));
  if (!m.tokenizer.path.empty()) {
    Status st = validate_relative_path(m.tokenizer.path);
    if (!st.is_ok()) return Fields::error("tokenizer.path", st.message());
  }
  KILN_ASSIGN_OR_RETURN(m.tokenizer.vocab_size, tf.count("vocab_size"));
  KILN_ASSIGN_OR_RETURN(m.tokenizer.eos_id, tf.integer("eos_id"));
  if (m.tokenizer.eos_id < -1 ||
      (m.tokenizer.eos_id >= 0 && static_cast<uint64_t>(m.tokenizer.eos_id) >= m.tokenizer.vocab_size)) {
    return Fields::error("tokenizer.eos_id", "is " + std::to_string(m.tokenizer.eos_id) +
                                                 ": must be -1 (none) or below vocab_size " +
                                                 std::to_string(m.tokenizer.vocab_size));
  }

  KILN_ASSIGN_OR_RETURN(const nlohmann::json* domains, top.get("domains"));
  if (!domains->is_object()) return Fields::error("domains", "must be an object");
  for (const auto& [name, value] : domains->items()) {
    std::string where = "domains." + name;
    if (name.empty()) return Fields::error(where, "has an empty domain name");
    Fields df(value, where);
    KILN_RETURN_IF_ERROR(df.require_object());
    ManifestDomain d;
    KILN_ASSIGN_OR_RETURN(d.samples, df.count("samples"));
    KILN_ASSIGN_OR_RETURN(d.tokens, df.count("tokens"));
    KILN_ASSIGN_OR_RETURN(d.shards, df.count("shards"));
    // "bytes" came after the first manifests; absent means unknown and is rebuilt below.
    if (value.contains("bytes")) {
      KILN_ASSIGN_OR_RETURN(d.bytes, df.count("bytes"));
    }
    m.domains[name] = d;
  }

  KILN_ASSIGN_OR_RETURN(const nlohmann::json* shards, top.get("shards"));
  if (!shards->is_array()) return Fields::error("shards", "must be an array");
  std::set<std::string> paths;
  std::map<std::string, ManifestDomain> totals;
  for (size_t i = 0; i < shards->size(); ++i) {
    std::string where = "shards[" + std::to_string(i) + "]";
    Fields sf((*shards)[i], where);
    KILN_RETURN_IF_ERROR(sf.require_object());
    ManifestShard s;
    KILN_ASSIGN_OR_RETURN(s.path, sf.string("path"));
    Status st = validate_relative_path(s.path);
    if (st.is_ok()) st = shard_compression_for_path(s.path).status();
    if (!st.is_ok()) return Fields::error(where + ".path", st.message());
    if (!paths.insert(fs::path(s.path).lexically_normal().string()).second) {
      return Fields::error(where + ".path", "'" + s.path + "' is listed twice");
    }
    KILN_ASSIGN_OR_RETURN(s.domain, sf.string("domain"));
    if (!m.domains.count(s.domain)) {
      return Fields::error(where + ".domain", "'" + s.domain + "' is not in 'domains'");
    }
    KILN_ASSIGN_OR_RETURN(s.samples, sf.count("samples"));
    KILN_ASSIGN_OR_RETURN(s.tokens, sf.count("tokens"));
    KILN_ASSIGN_OR_RETURN(s.bytes, sf.count("bytes"));
    KILN_ASSIGN_OR_RETURN(std::string hex, sf.string("xxh3"));
    Result<uint64_t> h = parse_hex64(hex);
    if (!h.is_ok()) return Fields::error(where + ".xxh3", h.status().message());
    s.xxh3 = *h;
    if ((*shards)[i].contains("tar_bytes")) {
      KILN_ASSIGN_OR_RETURN(s.tar_bytes, sf.count("tar_bytes"));
    }
    if (auto it = (*shards)[i].find("split"); it != (*shards)[i].end()) {
      if (!it->is_string() || (*it != "train" && *it != "val")) {
        return Fields::error(where + ".split", "must be \"train\" or \"val\"");
      }
      s.val = *it == "val";
    }
    if (s.val) {  // validation shards do not count in the (training) domain totals
      m.shards.push_back(std::move(s));
      continue;
    }
    ManifestDomain& t = totals[s.domain];
    t.samples += s.samples;
    t.tokens += s.tokens;
    t.bytes += s.bytes;
    t.shards += 1;
    m.shards.push_back(std::move(s));
  }
  // The domain totals are derived from the shards; a mismatch means a damaged or edited file.
  for (auto& [name, d] : m.domains) {
    ManifestDomain t = totals.count(name) ? totals[name] : ManifestDomain{};
    if (!domains->at(name).contains("bytes")) d.bytes = t.bytes;
    const std::string& domain = name;  // (clang before 16 cannot capture a structured binding)
    auto check = [&](const char* field, uint64_t listed, uint64_t derived) -> Status {
      if (listed == derived) return Status::ok();
      return Fields::error("domains." + domain + "." + field,
                           "is " + std::to_string(listed) + " but the domain's shards add up to " +
                               std::to_string(derived));
    };
    KILN_RETURN_IF_ERROR(check("samples", d.samples, t.samples));
    KILN_RETURN_IF_ERROR(check("tokens", d.tokens, t.tokens));
    KILN_RETURN_IF_ERROR(check("shards", d.shards, t.shards));
    KILN_RETURN_IF_ERROR(check("bytes", d.bytes, t.bytes));
  }
  return m;
}

}  // namespace

void Manifest::add_shard(const ShardInfo& info, const std::string& domain,
                         const std::string& root, bool val) {
  fs::path p = fs::path(info.path).lexically_normal();
  if (!root.empty()) {
    fs::path r = fs::path(root).lexically_normal();
    if (p.is_absolute() != r.is_absolute()) {
      p = fs::absolute(p).lexically_normal();
      r = fs::absolute(r).lexically_normal();
    }
    p = p.lexically_relative(r);
  }
  std::string rel = p.generic_string();
  KILN_CHECK(validate_relative_path(rel).is_ok(),
             "shard '" + info.path + "' is not inside the manifest root '" + root + "'");
  ManifestShard s;
  s.path = rel;
  s.domain = domain;
  s.samples = info.samples;
  s.tokens = info.tokens;
  s.bytes = info.bytes;
  s.xxh3 = info.xxh3;
  s.tar_bytes = info.tar_bytes;
  s.val = val;
  ManifestDomain& d = domains[domain];
  if (val) {
    shards.push_back(std::move(s));
    return;
  }
  d.samples += info.samples;
  d.tokens += info.tokens;
  d.bytes += info.bytes;
  d.shards += 1;
  shards.push_back(std::move(s));
}

Manifest select_split(const Manifest& m, bool val) {
  Manifest out;
  out.format = m.format;
  out.tokenizer = m.tokenizer;
  out.dir = m.dir;
  for (const auto& [name, d] : m.domains) out.domains[name] = ManifestDomain{};
  for (const ManifestShard& s : m.shards) {
    if (s.val != val) continue;
    ManifestDomain& d = out.domains[s.domain];
    d.samples += s.samples;
    d.tokens += s.tokens;
    d.bytes += s.bytes;
    d.shards += 1;
    out.shards.push_back(s);
  }
  return out;
}

std::string Manifest::shard_path(const ManifestShard& shard) const {
  if (dir.empty()) return shard.path;
  return (fs::path(dir) / shard.path).string();
}

Result<std::string> Manifest::checked_shard_path(const ManifestShard& shard) const {
  std::string path = shard_path(shard);
  // Only a manifest read from a folder has a folder to stay inside (one assembled in memory,
  // e.g. over several datasets, lists absolute paths and has no dir).
  if (dir.empty() || fs::path(shard.path).is_absolute()) return path;
  std::error_code ec;
  fs::path root = fs::weakly_canonical(dir.empty() ? fs::path(".") : fs::path(dir), ec);
  if (ec) return Status::from_errno("resolve dataset folder", dir, ec.value());
  fs::path real = fs::weakly_canonical(path, ec);
  if (ec) return Status::from_errno("resolve shard", path, ec.value());
  auto [root_end, real_it] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  if (root_end != root.end()) {
    return Status::data("shard '" + shard.path + "' resolves to '" + real.string() +
                        "', outside the dataset folder '" + root.string() +
                        "' (a symbolic link; copy the file in or read the dataset where it lies)")
        .with_file(path);
  }
  return path;
}

ShardReaderOptions Manifest::reader_options(const ManifestShard& shard, bool verify_checksum) {
  ShardReaderOptions options;
  if (verify_checksum) options.expected_xxh3 = shard.xxh3;
  if (shard.tar_bytes) options.max_tar_bytes = shard.tar_bytes;
  return options;
}

std::string manifest_to_json(const Manifest& m) {
  // Fixed key order and one shard per line: stable bytes, and diffs stay readable.
  ordered_json tok;
  tok["path"] = m.tokenizer.path;
  tok["vocab_size"] = m.tokenizer.vocab_size;
  tok["eos_id"] = m.tokenizer.eos_id;
  std::string out = "{\n";
  out += "  \"format\": " + ordered_json(m.format).dump() + ",\n";
  out += "  \"tokenizer\": " + tok.dump() + ",\n";
  out += "  \"domains\": {";
  bool first = true;
  for (const auto& [name, d] : m.domains) {  // std::map: sorted by name
    out += first ? "\n    " : ",\n    ";
    out += ordered_json(name).dump() + ": " + domain_json(d).dump();
    first = false;
  }
  out += first ? "},\n" : "\n  },\n";
  out += "  \"shards\": [";
  first = true;
  for (const ManifestShard& s : m.shards) {
    ordered_json j;
    j["path"] = s.path;
    j["domain"] = s.domain;
    j["samples"] = s.samples;
    j["tokens"] = s.tokens;
    j["bytes"] = s.bytes;
    j["xxh3"] = hex64(s.xxh3);
    if (s.tar_bytes) j["tar_bytes"] = s.tar_bytes;
    if (s.val) j["split"] = "val";
    out += first ? "\n    " : ",\n    ";
    out += j.dump();
    first = false;
  }
  out += first ? "]\n" : "\n  ]\n";
  out += "}\n";
  return out;
}

Result<Manifest> manifest_from_json(const std::string& text, const std::string& origin) {
  Result<nlohmann::json> parsed = parse_untrusted_json(text);
  if (!parsed.is_ok()) {
    return std::move(parsed).take_status().prefixed("manifest").with_file(origin);
  }
  nlohmann::json root = std::move(parsed).value();
  Result<Manifest> m = parse_manifest(root);
  if (!m.is_ok()) {
    Status st = std::move(m).take_status();
    return std::move(st).with_file(origin);
  }
  return m;
}

Status write_manifest(const std::string& path, const Manifest& m) {
  return write_file_atomic(path, manifest_to_json(m));
}

Result<Manifest> merge_manifests(const std::vector<Manifest>& parts) {
  if (parts.empty()) return Status::usage("no datasets to merge");
  if (parts.size() == 1) return parts[0];
  auto joined = [](const Manifest& m, const std::string& rel) {
    return m.dir.empty() ? rel : (fs::path(m.dir) / rel).string();
  };
  auto where = [](const Manifest& m) { return m.dir.empty() ? std::string(".") : m.dir; };
  Manifest out;
  out.format = parts[0].format;
  out.tokenizer = parts[0].tokenizer;
  if (!out.tokenizer.path.empty()) out.tokenizer.path = joined(parts[0], out.tokenizer.path);
  std::string first_tokenizer;
  if (!parts[0].tokenizer.path.empty()) {
    KILN_ASSIGN_OR_RETURN(first_tokenizer, read_file(out.tokenizer.path));
  }
  for (const Manifest& m : parts) {
    const ManifestTokenizer& t = m.tokenizer;
    bool same = t.vocab_size == out.tokenizer.vocab_size && t.eos_id == out.tokenizer.eos_id &&
                t.path.empty() == parts[0].tokenizer.path.empty();
    if (same && !t.path.empty()) {
      KILN_ASSIGN_OR_RETURN(std::string bytes, read_file(joined(m, t.path)));
      same = bytes == first_tokenizer;
    }
    if (!same)
      return Status::data("datasets " + where(parts[0]) + " and " + where(m) +
                          " use different tokenizers; only datasets with the same tokenizer "
                          "(e.g. prepared with --against) can be read as one");
    for (const auto& [name, d] : m.domains) out.domains[name];  // every domain, even if empty
    for (const ManifestShard& s : m.shards) {
      ManifestShard c = s;
      c.path = joined(m, s.path);
      if (!s.val) {
        ManifestDomain& d = out.domains[s.domain];
        d.samples += s.samples;
        d.tokens += s.tokens;
        d.bytes += s.bytes;
        d.shards += 1;
      }
      out.shards.push_back(std::move(c));
    }
  }
  return out;  // dir "": shard and tokenizer paths are as joined above
}

Result<Manifest> read_manifest(const std::string& path) {
  if (path.find(',') != std::string::npos) {
    std::vector<Manifest> parts;
    size_t at = 0;
    while (at <= path.size()) {
      size_t comma = path.find(',', at);
      std::string one = path.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (!one.empty()) {
        KILN_ASSIGN_OR_RETURN(Manifest m, read_manifest(one));
        parts.push_back(std::move(m));
      }
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    return merge_manifests(parts);
  }
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / kManifestName).string();
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(file));
  KILN_ASSIGN_OR_RETURN(Manifest m, manifest_from_json(text, file));
  m.dir = fs::path(file).parent_path().string();
  return m;
}

}  // namespace kiln
