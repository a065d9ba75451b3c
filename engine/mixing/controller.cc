#include "engine/mixing/controller.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

nlohmann::json to_json_map(const WeightMap& w) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : w) j[k] = v;
  return j;
}

template <typename T>
std::map<std::string, T> from_json_map(const nlohmann::json& j) {
  std::map<std::string, T> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if constexpr (std::is_integral_v<T>) {
      out[it.key()] = json_integer<T>(it.value(), it.key());  // a double past T's range is UB
    } else {
      out[it.key()] = it.value().get<T>();
    }
  }
  return out;
}

}  // namespace

std::string policy_control_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "control" / "policy.json").string();
}

std::string mixing_history_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "mixing.jsonl").string();
}

std::string mixing_result_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "mixing_weights.json").string();
}

Status write_policy_request(const std::string& run_dir, const std::string& name) {
  auto p = parse_mix_policy(name, "NAME");
  if (!p.is_ok()) return Status::usage(p.status().message()).with_key("NAME");
  nlohmann::json j = {{"policy", name}};
  return write_file_atomic(policy_control_path(run_dir), j.dump() + "\n");
}

Result<std::unique_ptr<MixController>> MixController::open(const MixingConfig& config,
                                                           const std::string& run_dir,
                                                           const std::vector<std::string>& domains,
                                                           const WeightMap& base) {
  std::unique_ptr<MixController> m(new MixController());
  m->config_ = config;
  m->run_dir_ = run_dir;
  m->domains_ = domains;
  m->base_ = base;
  MixingConfig& mc = m->config_;
  const double k = static_cast<double>(domains.size());
  if (mc.min_weight * k > 1.0) {
    return Status::config("min_weight x " + std::to_string(domains.size()) + " domains exceeds 1")
        .with_key("mixing.min_weight");
  }
  for (const auto& p : mc.schedule) {
    for (const auto& [d, w] : p.weights) {
      if (std::find(domains.begin(), domains.end(), d) == domains.end()) {
        return Status::config("the data has no domain '" + d + "'")
            .with_key("mixing.schedule.weights." + d);
      }
    }
  }
  if (mc.policy == MixPolicy::kDoremi || !mc.doremi_reference.empty()) {
    KILN_ASSIGN_OR_RETURN(mc.doremi_reference_loss, load_reference_loss(mc.doremi_reference));
    for (const auto& d : domains) {
      if (!mc.doremi_reference_loss.count(d)) {
        return Status::config("the reference " + mc.doremi_reference + " has no loss for domain '" +
                              d + "'")
            .with_key("mixing.doremi.reference");
      }
    }
    m->reference_loaded_ = true;
  }
  m->state_ = mix_initial_state(mc, domains, base);
  return m;
}

void MixController::observe_step(const WeightMap& domain_loss,
                                 const std::map<std::string, int64_t>& seqs) {
  for (const auto& [d, v] : domain_loss) {
    if (!std::isfinite(v)) continue;
    loss_sum_[d] += v;
    ++loss_steps_[d];
  }
  for (const auto& [d, n] : seqs) sequences_[d] += n;
}

Result<std::optional<WeightMap>> MixController::after_step(int64_t step) {
  if (!mix_due(config_, state_, step)) return std::optional<WeightMap>();
  MixObservation obs;
  obs.step = step;
  for (const auto& [d, v] : loss_sum_) obs.train_loss[d] = v / static_cast<double>(loss_steps_[d]);
  obs.val_loss = last_val_;
  obs.sequences = sequences_;
  KILN_ASSIGN_OR_RETURN(MixState next, mix_update(config_, state_, obs));
  loss_sum_.clear();
  loss_steps_.clear();
  sequences_.clear();
  const bool changed = next.weights != state_.weights;
  state_ = std::move(next);
  if (!changed) return std::optional<WeightMap>();
  KILN_RETURN_IF_ERROR(record(step, "update"));
  return std::optional<WeightMap>(state_.weights);
}

void MixController::pin(const WeightMap& weights, int64_t step) {
  WeightMap w;
  for (const auto& d : domains_) w[d] = 0;
  double total = 0;
  for (const auto& [d, v] : weights) total += v;
  for (const auto& [d, v] : weights) w[d] = total > 0 ? v / total : 0.0;
  if (!state_.paused && state_.policy != "static") {
    KILN_LOG_INFO(
        "step {}: weights pinned by kiln mix set; the {} policy pauses (resume it with "
        "kiln mix policy RUN {})",
        step, state_.policy, state_.policy);
  }
  state_.paused = true;
  state_.weights = w;
  Status st = record(step, "pin");
  if (!st.is_ok()) KILN_LOG_WARN("mixing history: {}", st.to_string());
}

std::optional<std::string> MixController::read_policy_request(int64_t step) {
  const std::string path = policy_control_path(run_dir_);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  // Read before every step: a file past the cap is refused unread, once per size it has.
  constexpr uintmax_t kMaxPolicyBytes = 1 << 20;
  if (const uintmax_t size = fs::file_size(path, ec); !ec && size > kMaxPolicyBytes) {
    const uint64_t h = xxh3_64(std::to_string(size)) | 1;
    if (h != policy_hash_) {
      policy_hash_ = h;
      KILN_LOG_WARN("step {}: ignoring {}: {} bytes, larger than 1 MiB", step, path, size);
    }
    return std::nullopt;
  }
  auto text = read_file(path);
  if (!text.is_ok()) return std::nullopt;
  const uint64_t h = xxh3_64(*text) | 1;
  if (h == policy_hash_) return std::nullopt;
  policy_hash_ = h;  // acted on once: applied, or rejected with a log line
  nlohmann::json j = parse_untrusted_json_or_discarded(*text);
  if (!j.is_object() || !j.contains("policy") || !j["policy"].is_string()) {
    KILN_LOG_WARN("step {}: ignoring {}: expected {{\"policy\": NAME}}", step, path);
    return std::nullopt;
  }
  return j["policy"].get<std::string>();
}

std::optional<WeightMap> MixController::apply_policy(const std::string& name, int64_t step) {
  auto reject = [&](const std::string& why) {
    KILN_LOG_WARN("step {}: ignoring the request for mixing policy '{}': {}", step, name, why);
    return std::nullopt;
  };
  auto policy = parse_mix_policy(name, "policy");
  if (!policy.is_ok()) return reject(policy.status().message());
  if (*policy == MixPolicy::kDoremi && !reference_loaded_) {
    return reject("doremi needs mixing.doremi.reference in the run's config");
  }
  if (*policy == MixPolicy::kSchedule && config_.schedule.empty()) {
    return reject("the run's config has no mixing.schedule");
  }
  state_.policy = name;
  state_.paused = false;
  if (*policy == MixPolicy::kStatic) {
    MixingConfig fixed = config_;  // the configured weights, unfloored
    fixed.policy = MixPolicy::kStatic;
    state_.weights = mix_initial_state(fixed, domains_, base_).weights;
  } else if (*policy == MixPolicy::kSchedule) {
    for (auto& [d, v] : state_.weights) v = 0;
    for (const auto& [d, v] : schedule_weights(config_, step)) state_.weights[d] = v;
  }
  KILN_LOG_INFO("step {}: mixing policy {} resumed (kiln mix policy)", step, name);
  Status st = record(step, "resume");
  if (!st.is_ok()) KILN_LOG_WARN("mixing history: {}", st.to_string());
  return state_.weights;
}

std::string MixController::state_json() const {
  nlohmann::json j;
  j["state"] = nlohmann::json::parse(state_.to_json());
  j["loss_sum"] = to_json_map(loss_sum_);
  j["loss_steps"] = loss_steps_;
  j["sequences"] = sequences_;
  j["last_val"] = to_json_map(last_val_);
  j["policy_hash"] = hex64(policy_hash_);
  return j.dump();
}

Status MixController::restore(const std::string& json) {
  try {
    nlohmann::json j = parse_untrusted_json_or_throw(json);
    KILN_ASSIGN_OR_RETURN(state_, MixState::from_json(j.at("state").dump(), "checkpoint mixing"));
    loss_sum_ = from_json_map<double>(j.at("loss_sum"));
    loss_steps_ = from_json_map<int64_t>(j.at("loss_steps"));
    sequences_ = from_json_map<int64_t>(j.at("sequences"));
    last_val_ = from_json_map<double>(j.at("last_val"));
    KILN_ASSIGN_OR_RETURN(policy_hash_, parse_hex64(j.at("policy_hash").get<std::string>()));
  } catch (const std::exception& e) {
    return Status::data(std::string("bad mixing state in the checkpoint: ") + e.what());
  }
  return Status::ok();
}

Status MixController::open_history(int64_t step) {
  if (!writes_files_) return Status::ok();
  const std::string path = mixing_history_path(run_dir_);
  std::string kept;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      auto j = parse_untrusted_json_or_discarded(line);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() <= step)  // (an integer: no double-to-integer conversion)
        kept += line + "\n";
    }
  }
  KILN_RETURN_IF_ERROR(write_file_atomic(path, kept));
  if (kept.empty()) return record(0, "start");
  return Status::ok();
}

Status MixController::record(int64_t step, const char* event) {
  if (!writes_files_) return Status::ok();
  nlohmann::ordered_json j;
  j["step"] = step;
  j["event"] = event;
  j["policy"] = state_.policy;
  j["weights"] = to_json_map(state_.weights);
  const std::string line = j.dump() + "\n";
  const std::string path = mixing_history_path(run_dir_);
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << line;
  out.flush();
  if (!out) return Status::from_errno("append", path);
  return Status::ok();
}

Status MixController::write_result() const {
  if (!writes_files_) return Status::ok();
  nlohmann::ordered_json j;
  j["policy"] = state_.policy;
  j["updates"] = state_.updates;
  j["weights"] = to_json_map(state_.policy == "doremi" ? state_.average() : state_.weights);
  j["final_weights"] = to_json_map(state_.weights);
  return write_file_atomic(mixing_result_path(run_dir_), j.dump(2) + "\n");
}

}  // namespace kiln::engine
