#include "engine/stability/rollback.h"

#include <nlohmann/json.hpp>
#include <utility>

namespace kiln::engine {

Quarantine quarantine_window(const StabilityState& now, const StabilityState& at_checkpoint,
                             int64_t checkpoint_step, int64_t spike_step, std::string reason) {
  Quarantine q;
  q.from_step = checkpoint_step;
  q.to_step = spike_step;
  q.spike_step = spike_step;
  q.reason = std::move(reason);
  for (const auto& [domain, end] : now.sequences) {
    auto b = at_checkpoint.sequences.find(domain);
    const uint64_t begin = b == at_checkpoint.sequences.end() ? 0 : b->second;
    if (end > begin) q.sequences[domain] = {begin, end};
  }
  return q;
}

StabilityState after_rollback(const StabilityState& now, const Quarantine& window) {
  StabilityState s = now;
  ++s.rollbacks;
  s.nonfinite_in_row = 0;
  s.quarantined.push_back(window);
  return s;
}

std::string quarantine_ranges_json(const Quarantine& window) {
  nlohmann::ordered_json ranges = nlohmann::ordered_json::object();
  for (const auto& [domain, range] : window.sequences) ranges[domain] = {range.first, range.second};
  return ranges.dump();
}

}  // namespace kiln::engine
