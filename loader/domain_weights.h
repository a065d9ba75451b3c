// Domain weights: how much of each domain a mixture draws ("web=0.7,code=0.3").
//
// One value type with one parser, one validation and one set of error messages, used by every
// place that takes weights: the train config's data.mixture, RUN/control/mixture.json and
// `kiln mix set`, `kiln stream --weights`, the loader (options, set_weights, saved state) and
// synthetic training data.
//
// Valid weights name each domain once, every weight is a finite number >= 0 and they sum to more
// than 0 without overflowing; when the caller knows the domains, every name must be one of them. Weights need not sum
// to 1: normalised() divides by the sum. Domains not named have weight 0.
//
// A DomainWeights holds whatever it was given (constructing one checks nothing, so a caller can
// collect values first); check() validates it. Errors carry the caller's status code and name
// the key: "<key>.<domain>" for one weight, "<key>" for the whole. A value type: copyable,
// comparable, no shared state.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kiln::loader {

// How a caller's weights are checked and how their errors read.
struct WeightRules {
  StatusCode code = StatusCode::kConfig;  // kConfig (config), kData (files), kUsage (flags)
  std::string key = "weights";            // errors name "<key>.<domain>" or "<key>"
  bool key_per_domain = true;             // false: every error names just "<key>" (a flag)
  std::vector<std::string> known;         // the domains there are; empty: any name
  std::string file;                       // where the weights came from, when a file
};

class DomainWeights {
 public:
  using Map = std::map<std::string, double>;

  DomainWeights() = default;
  DomainWeights(Map weights) : w_(std::move(weights)) {}  // NOLINT(implicit): unchecked
  DomainWeights(std::initializer_list<Map::value_type> weights) : w_(weights) {}

  // Parses "d1=w1,d2=w2" (or its items given separately, as `kiln mix set` gets them) and
  // checks the result (rules). Errors: "expected DOMAIN=WEIGHT, got '...'", "weight of 'd' must
  // be a finite number >= 0, got '...'", "domain 'd' given twice", "no DOMAIN=WEIGHT given".
  static Result<DomainWeights> parse(std::string_view text, const WeightRules& rules);
  static Result<DomainWeights> parse(const std::vector<std::string>& items,
                                     const WeightRules& rules);

  // OK when valid (see the top of this file); otherwise the first problem, with its key:
  // "unknown domain 'd' (did you mean 'e'?)", "weight must be a finite number >= 0",
  // "weights must sum to more than 0", "weights are too large: their sum overflows ...".
  Status check(const WeightRules& rules) const;

  // The weights divided by their sum (all 0 when the sum is 0); the same domains.
  DomainWeights normalised() const;
  // The weights of `domains`, in that order (0 for those not named), divided by their sum.
  std::vector<double> normalised_over(const std::vector<std::string>& domains) const;

  const Map& map() const { return w_; }
  bool empty() const { return w_.empty(); }
  size_t size() const { return w_.size(); }
  bool contains(const std::string& domain) const { return w_.count(domain) > 0; }
  size_t count(const std::string& domain) const { return w_.count(domain); }
  double at(const std::string& domain) const { return w_.at(domain); }
  // The weight of `domain`, 0 when not named.
  double get(const std::string& domain) const;
  void set(const std::string& domain, double weight) { w_[domain] = weight; }
  Map::const_iterator begin() const { return w_.begin(); }
  Map::const_iterator end() const { return w_.end(); }
  bool operator==(const DomainWeights&) const = default;

 private:
  Map w_;
};

}  // namespace kiln::loader
