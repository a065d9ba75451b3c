#include "loader/weights_history.h"

#include "common/status.h"

namespace kiln::loader::detail {

void WeightsHistory::append(int64_t step, std::vector<double> weights) {
  KILN_CHECK(weights.size() == names_.size());
  changes_.push_back({step, by_name(weights)});
  by_id_.push_back(std::move(weights));
}

void WeightsHistory::set_from(int64_t step, std::vector<double> weights) {
  while (!changes_.empty() && changes_.back().step >= step) {
    changes_.pop_back();
    by_id_.pop_back();
  }
  append(step, std::move(weights));
}

const std::vector<double>& WeightsHistory::at(int64_t step) const {
  KILN_CHECK(!by_id_.empty());
  size_t i = 0;
  while (i + 1 < changes_.size() && changes_[i + 1].step <= step) ++i;
  return by_id_[i];
}

DomainWeights WeightsHistory::by_name(const std::vector<double>& weights) const {
  DomainWeights m;
  for (size_t d = 0; d < weights.size(); ++d) m.set(names_[d], weights[d]);
  return m;
}

}  // namespace kiln::loader::detail
