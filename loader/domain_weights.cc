#include "loader/domain_weights.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/config.h"

namespace kiln::loader {
namespace {

Status error(const WeightRules& rules, std::string message, const std::string& domain = "") {
  Status st;
  switch (rules.code) {
    case StatusCode::kUsage: st = Status::usage(std::move(message)); break;
    case StatusCode::kData: st = Status::data(std::move(message)); break;
    default: st = Status::config(std::move(message)); break;
  }
  st.with_key(rules.key_per_domain && !domain.empty() ? rules.key + "." + domain : rules.key);
  if (!rules.file.empty()) st.with_file(rules.file);
  return st;
}

// One "domain=weight" item into `out`.
Status parse_item(const std::string& item, const WeightRules& rules, DomainWeights* out) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
    return error(rules, "expected DOMAIN=WEIGHT, got '" + item + "'");
  }
  const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
  char* end = nullptr;
  errno = 0;
  const double w = std::strtod(value.c_str(), &end);
  if (errno != 0 || end != value.c_str() + value.size() || !std::isfinite(w) || w < 0) {
    return error(rules, "weight of '" + name + "' must be a finite number >= 0, got '" + value +
                            "'", name);
  }
  if (out->contains(name)) return error(rules, "domain '" + name + "' given twice", name);
  out->set(name, w);
  return Status::ok();
}

}  // namespace

Result<DomainWeights> DomainWeights::parse(std::string_view text, const WeightRules& rules) {
  std::vector<std::string> items;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string_view::npos) comma = text.size();
    if (comma > at) items.emplace_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return parse(items, rules);
}

Result<DomainWeights> DomainWeights::parse(const std::vector<std::string>& items,
                                           const WeightRules& rules) {
  DomainWeights out;
  for (const std::string& item : items) KILN_RETURN_IF_ERROR(parse_item(item, rules, &out));
  if (out.empty()) return error(rules, "no DOMAIN=WEIGHT given");
  KILN_RETURN_IF_ERROR(out.check(rules));
  return out;
}

Status DomainWeights::check(const WeightRules& rules) const {
  double total = 0;
  for (const auto& [name, value] : w_) {
    if (!rules.known.empty()) {
      bool found = false;
      for (const std::string& k : rules.known) found = found || k == name;
      if (!found) {
        const std::string near = closest_match(name, rules.known);
        std::string hint;
        if (!near.empty()) {
          hint = " (did you mean '" + near + "'?)";
        } else {
          for (const std::string& k : rules.known) hint += (hint.empty() ? " (domains: " : ", ") + k;
          hint += ")";
        }
        return error(rules, "unknown domain '" + name + "'" + hint, name);
      }
    }
    if (!std::isfinite(value) || value < 0) {
      return error(rules, "weight must be a finite number >= 0", name);
    }
    total += value;
  }
  if (!std::isfinite(total)) {
    // Each weight is finite but their sum overflows a double: normalising would give 0 or NaN.
    return error(rules, "weights are too large: their sum overflows (use relative weights, e.g. 1 and 3)");
  }
  if (!(total > 0)) {
    return error(rules, "weights must sum to more than 0");
  }
  return Status::ok();
}

DomainWeights DomainWeights::normalised() const {
  double total = 0;
  for (const auto& [name, value] : w_) total += value;
  DomainWeights out;
  for (const auto& [name, value] : w_) out.set(name, total > 0 ? value / total : 0.0);
  return out;
}

std::vector<double> DomainWeights::normalised_over(const std::vector<std::string>& domains) const {
  std::vector<double> w(domains.size(), 0.0);
  double total = 0;
  for (size_t d = 0; d < domains.size(); ++d) {
    w[d] = get(domains[d]);
    total += w[d];
  }
  for (double& v : w) v = total > 0 ? v / total : 0.0;
  return w;
}

double DomainWeights::get(const std::string& domain) const {
  auto it = w_.find(domain);
  return it == w_.end() ? 0.0 : it->second;
}

}  // namespace kiln::loader
