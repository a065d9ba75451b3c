#include "engine/mixing/control_file.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxControlBytes = 1 << 20;
}

std::string mixture_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "control" / "mixture.json").string();
}

Result<loader::DomainWeights> parse_mixture_json(const std::string& text, const std::string& origin,
                                                 const std::set<std::string>& known_domains) {
  if (text.size() > kMaxControlBytes) {
    return Status::data("mixture file is larger than 1 MiB").with_file(origin);
  }
  Result<nlohmann::json> parsed = parse_untrusted_json(text);
  if (!parsed.is_ok()) return std::move(parsed).take_status().with_file(origin);
  nlohmann::json j = std::move(parsed).value();
  if (!j.is_object() || !j.contains("weights")) {
    return Status::data("expected {\"weights\": {\"<domain>\": <number>, ...}}").with_file(origin);
  }
  const nlohmann::json& w = j["weights"];
  if (!w.is_object()) return Status::data("\"weights\" must be an object").with_file(origin);
  loader::DomainWeights out;
  for (auto it = w.begin(); it != w.end(); ++it) {
    if (!it.value().is_number()) {
      return Status::data("weight must be a number")
          .with_file(origin)
          .with_key("weights." + it.key());
    }
    out.set(it.key(), it.value().get<double>());
  }
  loader::WeightRules rules;
  rules.code = StatusCode::kData;
  rules.known.assign(known_domains.begin(), known_domains.end());
  rules.file = origin;
  KILN_RETURN_IF_ERROR(out.check(rules));
  return out;
}

std::string mixture_to_json(const loader::DomainWeights& weights) {
  nlohmann::json w = nlohmann::json::object();
  for (const auto& [k, v] : weights) w[k] = v;
  nlohmann::json j;
  j["weights"] = w;
  return j.dump() + "\n";
}

Status write_mixture(const std::string& run_dir, const loader::DomainWeights& weights) {
  loader::WeightRules rules;
  rules.code = StatusCode::kUsage;
  KILN_RETURN_IF_ERROR(weights.check(rules));
  return write_file_atomic(mixture_path(run_dir), mixture_to_json(weights));
}

Result<std::optional<loader::DomainWeights>> read_mixture(const std::string& run_dir) {
  const std::string path = mixture_path(run_dir);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<loader::DomainWeights>();
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  KILN_ASSIGN_OR_RETURN(loader::DomainWeights w, parse_mixture_json(text, path));
  return std::optional<loader::DomainWeights>(std::move(w));
}

MixtureWatcher::MixtureWatcher(std::string run_dir, std::set<std::string> known_domains)
    : path_(mixture_path(run_dir)), known_(std::move(known_domains)) {}

Status MixtureWatcher::publish_if_absent(const loader::DomainWeights& weights) {
  std::error_code ec;
  if (fs::exists(path_, ec) || weights.empty()) return Status::ok();
  const std::string text = mixture_to_json(weights);
  KILN_RETURN_IF_ERROR(write_file_atomic(path_, text));
  applied_hash_ = xxh3_64(text) | 1;
  return Status::ok();
}

std::optional<loader::DomainWeights> MixtureWatcher::poll() {
  std::error_code ec;
  if (!fs::exists(path_, ec)) return std::nullopt;
  auto size = fs::file_size(path_, ec);
  if (ec) return std::nullopt;
  std::string text;
  if (size > kMaxControlBytes) {
    text.assign(kMaxControlBytes + 1, ' ');  // parse reports "too large"
  } else {
    auto r = read_file(path_);
    if (!r.is_ok()) {
      // A file being replaced can vanish between exists() and open(); try again next step.
      return std::nullopt;
    }
    text = std::move(r).value();
  }
  const uint64_t h = xxh3_64(text) | 1;  // never 0, so 0 means "nothing applied"
  if (h == applied_hash_ || h == last_bad_hash_) return std::nullopt;
  auto parsed = parse_mixture_json(text, path_, known_);
  if (!parsed.is_ok()) {
    last_bad_hash_ = h;
    ++rejected_;
    KILN_LOG_WARN("ignoring the mixture control file: {}", parsed.status().to_string());
    return std::nullopt;
  }
  applied_hash_ = h;
  return std::move(parsed).value();
}

}  // namespace kiln::engine
