// RUN/control/mixture.json: live domain weights, {"weights": {"<domain>": <number>, ...}}.
//
// `kiln mix set` writes the file atomically; the trainer polls it between optimizer steps and
// hands valid new weights to the loader. Content is untrusted: it must be a JSON object with a
// "weights" object of finite numbers >= 0 summing to more than 0, naming only known domains
// (domains not named get weight 0). Bad content is logged once (per distinct content) and ignored;
// it never stops a run.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "common/status.h"
#include "loader/domain_weights.h"

namespace kiln::engine {

std::string mixture_path(const std::string& run_dir);

// Parses and validates. known_domains empty: any names are accepted. Data error on bad content.
Result<loader::DomainWeights> parse_mixture_json(const std::string& text, const std::string& origin,
                                                 const std::set<std::string>& known_domains = {});
// {"weights": {...}} with keys sorted; numbers printed so they read back exactly.
std::string mixture_to_json(const loader::DomainWeights& weights);
// Validates (kUsage on bad weights) then writes RUN/control/mixture.json atomically.
Status write_mixture(const std::string& run_dir, const loader::DomainWeights& weights);
// The weights in the file, or nullopt when there is no file. Errors for unreadable/bad content.
Result<std::optional<loader::DomainWeights>> read_mixture(const std::string& run_dir);

// Polls the control file. Not thread-safe; owned by the training loop.
class MixtureWatcher {
 public:
  MixtureWatcher(std::string run_dir, std::set<std::string> known_domains);
  // New, valid weights when the file's content changed since the last applied content;
  // nullopt otherwise (no file, unchanged, or bad content — the latter is logged once).
  std::optional<loader::DomainWeights> poll();
  // When there is no control file yet, writes `weights` (the run's current ones) to it and marks
  // that content applied, so users find the live weights and the format in RUN/control/.
  Status publish_if_absent(const loader::DomainWeights& weights);
  // Hash of the last applied content (0: none); saved in checkpoints so a resumed run does not
  // re-apply a file the uninterrupted run had already applied.
  uint64_t applied_hash() const { return applied_hash_; }
  void set_applied_hash(uint64_t h) { applied_hash_ = h; }
  int64_t rejected() const { return rejected_; }

 private:
  std::string path_;
  std::set<std::string> known_;
  uint64_t applied_hash_ = 0;
  uint64_t last_bad_hash_ = 0;
  int64_t rejected_ = 0;
};

}  // namespace kiln::engine
