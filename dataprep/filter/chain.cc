// The filter chain: the `filters:` list turned into filters, run in order.
#include <cmath>
#include <cstdio>
#include <map>

#include "common/config.h"
#include "dataprep/filter/filter.h"
#include "dataprep/filter/params.h"
#include "dataprep/filter/text.h"

namespace kiln::prep::filter {
namespace {

using Maker = Result<std::unique_ptr<Filter>> (*)(Params&);
const std::vector<std::pair<std::string, Maker>>& makers() {
  static const std::vector<std::pair<std::string, Maker>> m = {
      {"gopher_quality", make_gopher_quality},
      {"gopher_repetition", make_gopher_repetition},
      {"c4", make_c4},
      {"fineweb", make_fineweb},
      {"language", make_language},
      {"pii", make_pii},
      {"url", make_url},
      {"length", make_length},
      {"regex", make_regex}};
  return m;
}

std::string number_text(double v) {
  char buf[64];
  if (std::fabs(v - std::round(v)) < 1e-12 && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

Status type_error(const std::string& key, const char* want, const YAML::Node& n) {
  return Status::config(std::string("expected ") + want + ", got '" + YAML::Dump(n) + "'")
      .with_key(key);
}

}  // namespace

const std::vector<std::string>& filter_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [n, m] : makers()) v.push_back(n);
    return v;
  }();
  return names;
}

// ---- Params ------------------------------------------------------------------------------------

Result<YAML::Node> Params::get(const char* name) {
  known_.push_back(name);
  return entry_[name];
}

Status Params::number(const char* name, double lo, double hi, std::optional<double>* v) {
  KILN_ASSIGN_OR_RETURN(YAML::Node n, get(name));
  if (!n.IsDefined()) return Status::ok();
  if (n.IsNull()) {
    v->reset();
    return Status::ok();
  }
  double x = 0;
  try {
    if (!n.IsScalar()) return type_error(key_of(name), "a number", n);
    x = n.as<double>();
  } catch (const YAML::Exception&) {
    return type_error(key_of(name), "a number", n);
  }
  if (!(x >= lo && x <= hi))
    return Status::config("must be in [" + number_text(lo) + ", " + number_text(hi) + "], got " +
                          n.Scalar())
        .with_key(key_of(name));
  *v = x;
  return Status::ok();
}

Status Params::number(const char* name, double lo, double hi, double* v) {
  std::optional<double> o = *v;
  KILN_RETURN_IF_ERROR(number(name, lo, hi, &o));
  if (!o) return Status::config("must be a number, not null").with_key(key_of(name));
  *v = *o;
  return Status::ok();
}

Status Params::integer(const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* v) {
  KILN_ASSIGN_OR_RETURN(YAML::Node n, get(name));
  if (!n.IsDefined()) return Status::ok();
  if (n.IsNull()) {
    v->reset();
    return Status::ok();
  }
  int64_t x = 0;
  try {
    if (!n.IsScalar()) return type_error(key_of(name), "an integer", n);
    x = n.as<int64_t>();
  } catch (const YAML::Exception&) {
    return type_error(key_of(name), "an integer", n);
  }
  if (x < lo || x > hi)
    return Status::config("must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "], got " + n.Scalar())
        .with_key(key_of(name));
  *v = x;
  return Status::ok();
}

Status Params::integer(const char* name, int64_t lo, int64_t hi, int64_t* v) {
  std::optional<int64_t> o = *v;
  KILN_RETURN_IF_ERROR(integer(name, lo, hi, &o));
  if (!o) return Status::config("must be an integer, not null").with_key(key_of(name));
  *v = *o;
  return Status::ok();
}

Status Params::boolean(const char* name, bool* v) {
  KILN_ASSIGN_OR_RETURN(YAML::Node n, get(name));
  if (!n.IsDefined()) return Status::ok();
  try {
    if (!n.IsScalar()) return type_error(key_of(name), "true or false", n);
    *v = n.as<bool>();
  } catch (const YAML::Exception&) {
    return type_error(key_of(name), "true or false", n);
  }
  return Status::ok();
}

Status Params::text(const char* name, std::string* v) {
  KILN_ASSIGN_OR_RETURN(YAML::Node n, get(name));
  if (!n.IsDefined() || n.IsNull()) return Status::ok();
  if (!n.IsScalar()) return type_error(key_of(name), "a string", n);
  *v = n.Scalar();
  return Status::ok();
}

Status Params::texts(const char* name, std::vector<std::string>* v) {
  KILN_ASSIGN_OR_RETURN(YAML::Node n, get(name));
  if (!n.IsDefined() || n.IsNull()) return Status::ok();
  if (n.IsScalar()) {
    *v = {n.Scalar()};
    return Status::ok();
  }
  if (!n.IsSequence()) return type_error(key_of(name), "a list of strings", n);
  v->clear();
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar())
      return type_error(key_of(name) + "[" + std::to_string(i) + "]", "a string", n[i]);
    v->push_back(n[i].Scalar());
  }
  return Status::ok();
}

Status Params::pairs(const char* name, int64_t lo, int64_t hi,
                     std::vector<std::pair<int64_t, double>>* v) {
  KILN_ASSIGN_OR_RETURN(YAML::Node n, get(name));
  if (!n.IsDefined()) return Status::ok();
  if (n.IsNull()) {
    v->clear();
    return Status::ok();
  }
  if (!n.IsSequence()) return type_error(key_of(name), "a list of [n, fraction] pairs", n);
  v->clear();
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string k = key_of(name) + "[" + std::to_string(i) + "]";
    const YAML::Node& e = n[i];
    if (!e.IsSequence() || e.size() != 2) return type_error(k, "a pair [n, fraction]", e);
    try {
      int64_t len = e[0].as<int64_t>();
      double frac = e[1].as<double>();
      if (len < lo || len > hi)
        return Status::config("n must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                              "]")
            .with_key(k);
      if (!(frac >= 0 && frac <= 1))
        return Status::config("fraction must be in [0, 1]").with_key(k);
      v->emplace_back(len, frac);
    } catch (const YAML::Exception&) {
      return type_error(k, "a pair [n, fraction]", e);
    }
  }
  return Status::ok();
}

Status Params::finish() const {
  for (const auto& kv : entry_) {
    std::string k = kv.first.IsScalar() ? kv.first.Scalar() : YAML::Dump(kv.first);
    bool ok = false;
    for (const auto& n : known_) ok |= n == k;
    if (ok) continue;
    std::vector<std::string> params(known_.begin() + 1, known_.end());
    std::string hint = closest_match(k, params);
    std::string msg = "unknown parameter of filter '" + entry_["name"].Scalar() + "'";
    if (!hint.empty()) {
      msg += " (did you mean '" + hint + "'?)";
    } else {
      std::string all;
      for (const auto& p : params) all += (all.empty() ? "" : ", ") + p;
      msg += " (its parameters: " + all + ")";
    }
    return Status::config(msg).with_key(key_ + "." + k);
  }
  return Status::ok();
}

// ---- FilterChain -------------------------------------------------------------------------------

FilterChain::~FilterChain() = default;

Result<std::unique_ptr<FilterChain>> FilterChain::from_yaml(const YAML::Node& list,
                                                            const std::string& key) {
  std::unique_ptr<FilterChain> chain(new FilterChain());
  if (!list.IsDefined() || list.IsNull()) return chain;
  if (!list.IsSequence())
    return Status::config("expected a list of filters, e.g. [{name: gopher_quality}]")
        .with_key(key);
  std::map<std::string, int> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string k = key + "[" + std::to_string(i) + "]";
    YAML::Node entry = list[i];
    if (entry.IsScalar()) {  // "- gopher_quality" is short for "- {name: gopher_quality}"
      YAML::Node m(YAML::NodeType::Map);
      m["name"] = entry.Scalar();
      entry = m;
    }
    if (!entry.IsMap())
      return Status::config("expected a filter {name: ..., parameters...}").with_key(k);
    if (!entry["name"].IsDefined() || !entry["name"].IsScalar())
      return Status::config(
                 "a filter needs a name (one of gopher_quality, gopher_repetition, c4, "
                 "fineweb, language, pii, url, length, regex)")
          .with_key(k + ".name");
    const std::string name = entry["name"].Scalar();
    Maker maker = nullptr;
    for (const auto& [n, m] : makers())
      if (n == name) maker = m;
    if (!maker) {
      std::string hint = closest_match(name, filter_names());
      std::string msg = "unknown filter '" + name + "'";
      if (!hint.empty()) msg += " (did you mean '" + hint + "'?)";
      msg +=
          "; filters: gopher_quality, gopher_repetition, c4, fineweb, language, pii, url, "
          "length, regex";
      return Status::config(msg).with_key(k + ".name");
    }
    Params params(entry, k);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Filter> f, maker(params));
    KILN_RETURN_IF_ERROR(params.finish());
    int n = ++seen[name];
    chain->labels_.push_back(n == 1 ? name : name + "#" + std::to_string(n));
    chain->names_.push_back(name);
    chain->filters_.push_back(std::move(f));
  }
  return chain;
}

bool FilterChain::needs_url() const {
  for (const auto& f : filters_)
    if (f->needs_url()) return true;
  return false;
}
bool FilterChain::rewrites() const {
  for (const auto& f : filters_)
    if (f->rewrites()) return true;
  return false;
}
bool FilterChain::annotates() const {
  for (const auto& f : filters_)
    if (f->annotates()) return true;
  return false;
}

ChainOutcome FilterChain::run(std::string* text, std::string_view url) const {
  ChainOutcome o;
  reset_document_view();
  for (size_t i = 0; i < filters_.size(); ++i) {
    bool edited = false;
    if (!filters_[i]->apply(text, url, &o.drop, &edited, &o.annotations)) {
      o.keep = false;
      o.dropped_by = static_cast<int>(i);
      return o;
    }
    if (edited) reset_document_view();
    if (edited && i < 64) o.edited_mask |= uint64_t{1} << i;
  }
  return o;
}

ChainOutcome FilterChain::replay_kept(std::string* text, std::string_view url) const {
  ChainOutcome o;
  reset_document_view();
  for (size_t i = 0; i < filters_.size(); ++i) {
    if (!filters_[i]->rewrites() && !filters_[i]->annotates()) continue;
    bool edited = false;
    if (!filters_[i]->apply(text, url, &o.drop, &edited, &o.annotations)) {
      o.keep = false;  // cannot happen for a document run() kept (deterministic filters)
      o.dropped_by = static_cast<int>(i);
      return o;
    }
    if (edited) reset_document_view();
    if (edited && i < 64) o.edited_mask |= uint64_t{1} << i;
  }
  return o;
}

std::string FilterChain::describe(const ChainOutcome& o) const {
  if (o.keep || o.dropped_by < 0) return "";
  std::string s = labels_[o.dropped_by] + ": " + o.drop.rule + " " + number_text(o.drop.value) +
                  " " + o.drop.op + " " + number_text(o.drop.threshold);
  if (!o.drop.note.empty()) s += " (" + o.drop.note + ")";
  return s;
}

}  // namespace kiln::prep::filter
