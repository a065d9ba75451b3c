// Internal to loader/: the weights of every step, as the loader's state records them
// (LoaderState::weights_history): a list of changes, each applying from its step until the next.
// Kept both by name (for the state) and by domain id (for the mixture decisions). Not
// thread-safe; the loader guards it with its lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/loader.h"

namespace kiln::loader::detail {

class WeightsHistory {
 public:
  // `names`: the domains in id order.
  explicit WeightsHistory(std::vector<std::string> names) : names_(std::move(names)) {}

  // Appends a change applying from `step` (normalised weights by domain id).
  void append(int64_t step, std::vector<double> weights);
  // A change from `step` on that replaces every change at or after `step` (set_weights).
  void set_from(int64_t step, std::vector<double> weights);

  bool empty() const { return changes_.empty(); }
  const std::vector<double>& first() const { return by_id_.front(); }
  int64_t first_step() const { return changes_.front().step; }
  // The weights in effect at `step` (the last change at or before it; the first change when
  // `step` is before every change). Not empty.
  const std::vector<double>& at(int64_t step) const;
  // The changes by name, every domain named: LoaderState::weights_history.
  const std::vector<LoaderState::WeightChange>& changes() const { return changes_; }
  // `weights` by name.
  DomainWeights by_name(const std::vector<double>& weights) const;

 private:
  std::vector<std::string> names_;
  std::vector<LoaderState::WeightChange> changes_;
  std::vector<std::vector<double>> by_id_;  // changes_ as vectors by domain id
};

}  // namespace kiln::loader::detail
