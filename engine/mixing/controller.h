// The trainer's side of the mixing policies (engine/mixing/policy.h): it gathers what each step
// observed, asks the policy for new weights when one is due, obeys the run's control files and
// keeps the history of weight changes.
//
// Control: `kiln mix set` (RUN/control/mixture.json, polled by MixtureWatcher) pins weights by
// hand - the policy pauses (pin()). `kiln mix policy RUN NAME` writes RUN/control/policy.json
// {"policy": NAME}; poll_policy() resumes that policy from the current weights (static: the
// configured weights; schedule: the schedule's weights at this step).
// History: RUN/mixing.jsonl, one line per change {"step", "event" (start | update | pin |
// resume), "policy", "weights"}; on resume the lines after the checkpoint's step are dropped.
// State (policy state, the interval's observations, the applied policy.json hash) is saved in
// checkpoints (state_json / restore) so a resumed run makes the same updates.
// Not thread-safe; owned by the training loop.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/mixing.h"
#include "engine/mixing/policy.h"

namespace kiln::engine {

std::string policy_control_path(const std::string& run_dir);  // RUN/control/policy.json
// Validates NAME and writes RUN/control/policy.json atomically (kUsage on a bad name).
Status write_policy_request(const std::string& run_dir, const std::string& name);
std::string mixing_history_path(const std::string& run_dir);  // RUN/mixing.jsonl
// RUN/mixing_weights.json: {"weights": the policy's result for reuse} (doremi: the average).
std::string mixing_result_path(const std::string& run_dir);

class MixController {
 public:
  // `config`: section mixing; `run_dir`: where the control files and the history live (run.dir).
  // `base`: the run's starting weights (data.mixture or the token shares). Loads doremi's
  // reference losses when the policy is doremi or a reference is configured (kConfig on error).
  static Result<std::unique_ptr<MixController>> open(const MixingConfig& config,
                                                     const std::string& run_dir,
                                                     const std::vector<std::string>& domains,
                                                     const WeightMap& base);

  const MixState& state() const { return state_; }
  // The weights the policy wants from the first step (written to the history as "start").
  const WeightMap& weights() const { return state_.weights; }

  // After step `step` trained on these per-domain losses and sequence counts.
  void observe_step(const WeightMap& domain_loss, const std::map<std::string, int64_t>& seqs);
  void observe_val(const WeightMap& val_loss) { last_val_ = val_loss; }
  // After step `step`: new weights when the policy updated (logged and in the history).
  Result<std::optional<WeightMap>> after_step(int64_t step);

  // `kiln mix set` applied weights before step `step`: the policy pauses.
  void pin(const WeightMap& weights, int64_t step);
  // A new `kiln mix policy` request in RUN/control/policy.json: the policy name, once per new
  // content (bad content is logged once). Under data parallelism rank 0 reads it and every rank
  // applies it.
  std::optional<std::string> read_policy_request(int64_t step);
  // Resumes policy `name` before step `step`: the weights to apply, or nullopt when the run
  // cannot run that policy (logged).
  std::optional<WeightMap> apply_policy(const std::string& name, int64_t step);
  // Only one rank writes RUN/mixing.jsonl and RUN/mixing_weights.json.
  void set_writes_files(bool writes) { writes_files_ = writes; }

  std::string state_json() const;
  Status restore(const std::string& json);
  // Drops history lines after `step` (resume) and writes the "start" line when the history is
  // empty. Then appends.
  Status open_history(int64_t step);
  // Writes RUN/mixing_weights.json (end of run).
  Status write_result() const;

 private:
  MixController() = default;
  Status record(int64_t step, const char* event);

  MixingConfig config_;
  std::string run_dir_;
  std::vector<std::string> domains_;
  WeightMap base_;
  MixState state_;
  bool reference_loaded_ = false;
  // The interval's observations.
  WeightMap loss_sum_;
  std::map<std::string, int64_t> loss_steps_;
  std::map<std::string, int64_t> sequences_;
  WeightMap last_val_;
  uint64_t policy_hash_ = 0;  // hash of the last policy.json acted on
  bool writes_files_ = true;
};

}  // namespace kiln::engine
