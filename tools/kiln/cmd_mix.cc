// kiln mix set RUN d1=w1 d2=w2 ... | kiln mix policy RUN NAME | kiln mix show RUN
// Writes / reads RUN/control/mixture.json and RUN/control/policy.json, which a running
// `kiln train` polls between steps, and RUN/mixing.jsonl (the history of weight changes).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/json.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/mixing/control_file.h"
#include "engine/mixing/controller.h"
#include "engine/stability/monitor.h"
#include "engine/train/metrics.h"
#include "loader/loader.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct MixArgs {
  std::string run_dir;
  std::vector<std::string> assignments;
  std::string policy;
  int history = 20;
};

Status require_run_dir(const std::string& run_dir) {
  if (!std::filesystem::is_directory(run_dir)) {
    return Status::usage("run directory does not exist: " + run_dir);
  }
  if (!std::filesystem::exists(std::filesystem::path(run_dir) / "config.yaml")) {
    return Status::usage("not a training run directory (no config.yaml): " + run_dir);
  }
  return Status::ok();
}

Status run_policy(const MixArgs& args) {
  KILN_RETURN_IF_ERROR(require_run_dir(args.run_dir));
  KILN_RETURN_IF_ERROR(engine::write_policy_request(args.run_dir, args.policy));
  std::printf("wrote %s: the run resumes the %s policy at its next step (from the weights in "
              "effect)\n",
              engine::policy_control_path(args.run_dir).c_str(), args.policy.c_str());
  return Status::ok();
}

std::string format_weights_line(const loader::DomainWeights& w) {
  std::string out;
  for (const auto& [domain, weight] : w) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.4f", out.empty() ? "" : ", ", domain.c_str(), weight);
    out += buf;
  }
  return out;
}

// A JSON object of weights as logged (a value that is not a number shows as nan).
std::string format_weights_line(const nlohmann::json& w) {
  loader::DomainWeights weights;
  if (!w.is_object()) return {};
  for (auto it = w.begin(); it != w.end(); ++it)
    weights.set(it.key(), it.value().is_number() ? it.value().get<double>() : NAN);
  return format_weights_line(weights);
}

// The policy and the last `limit` lines of RUN/mixing.jsonl.
void print_history(const std::string& run_dir, int limit) {
  std::ifstream in(engine::mixing_history_path(run_dir));
  if (!in) {
    std::printf("no mixing history (%s)\n", engine::mixing_history_path(run_dir).c_str());
    return;
  }
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    // Lines as the trainer writes them (a damaged one is skipped): an integer step within
    // int64, and strings where there are strings.
    auto j = parse_untrusted_json_or_discarded(line);
    auto string_or_absent = [&](const char* k) { return !j.contains(k) || j[k].is_string(); };
    bool ok = j.is_object() && string_or_absent("event") && string_or_absent("policy");
    try {
      if (ok) (void)json_integer_at<int64_t>(j, "step");
    } catch (const nlohmann::json::exception&) {
      ok = false;
    }
    if (ok) rows.push_back(std::move(j));
  }
  if (rows.empty()) return;
  const auto& last = rows.back();
  std::printf("policy: %s%s\n", last.value("policy", std::string("?")).c_str(),
              last.value("event", std::string()) == "pin"
                  ? " (paused: weights pinned by kiln mix set; resume with kiln mix policy)"
                  : "");
  const size_t from = rows.size() > static_cast<size_t>(limit) ? rows.size() - limit : 0;
  std::printf("history (%zu change%s%s):\n", rows.size(), rows.size() == 1 ? "" : "s",
              from > 0 ? (", the last " + std::to_string(limit)).c_str() : "");
  for (size_t i = from; i < rows.size(); ++i) {
    const auto& r = rows[i];
    std::printf("  step %8lld  %-7s %-9s %s\n",
                static_cast<long long>(json_integer_at<int64_t>(r, "step")),
                r.value("event", std::string()).c_str(), r.value("policy", std::string()).c_str(),
                format_weights_line(r.value("weights", nlohmann::json())).c_str());
  }
}

std::string format_weights(const loader::DomainWeights& w) {
  std::string out;
  const loader::DomainWeights norm = w.normalised();
  for (const auto& [k, v] : w) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "  %-20s %10.4g  (%.1f%%)\n", k.c_str(), v, 100.0 * norm.at(k));
    out += buf;
  }
  return out;
}

Status run_set(const MixArgs& args) {
  if (!std::filesystem::is_directory(args.run_dir)) {
    return Status::usage("run directory does not exist: " + args.run_dir);
  }
  // Names are checked against the domains the run reports, when it has reported any.
  loader::WeightRules rules;
  rules.code = StatusCode::kUsage;
  if (auto logged = engine::last_logged_weights(args.run_dir)) {
    for (const auto& [domain, weight] : logged->weights) rules.known.push_back(domain);
  }
  KILN_ASSIGN_OR_RETURN(const loader::DomainWeights weights,
                        loader::DomainWeights::parse(args.assignments, rules));
  KILN_RETURN_IF_ERROR(engine::write_mixture(args.run_dir, weights));
  std::printf("wrote %s\n%s", engine::mixture_path(args.run_dir).c_str(),
              format_weights(weights).c_str());
  return Status::ok();
}

// Exactly-once accounting from the latest checkpoint: sequences handed out per domain, the
// quarantined ranges (rollbacks), and the loader's weight history (mixture changes).
void print_accounting(const std::string& run_dir) {
  auto latest = engine::latest_checkpoint(run_dir);
  if (!latest.is_ok()) return;
  auto state = engine::read_trainer_state(*latest);
  if (!state.is_ok()) {
    std::printf("latest checkpoint %s is unreadable: %s\n", latest->c_str(),
                state.status().to_string().c_str());
    return;
  }
  std::printf("data accounting at checkpoint step %lld (%s):\n",
              static_cast<long long>(state->step), latest->c_str());
  if (auto it = state->extra.find("stability"); it != state->extra.end()) {
    engine::StabilityState st;
    if (engine::StabilityState::from_json(it->second, &st, nullptr).ok()) {
      std::map<std::string, uint64_t> skipped;
      for (const auto& q : st.quarantined)
        for (const auto& [domain, range] : q.sequences) skipped[domain] += range.second - range.first;
      for (const auto& [domain, n] : st.sequences) {
        std::printf("  %-20s %10llu sequences read, %llu trained, %llu quarantined\n",
                    domain.c_str(), static_cast<unsigned long long>(n),
                    static_cast<unsigned long long>(n - skipped[domain]),
                    static_cast<unsigned long long>(skipped[domain]));
      }
      for (const auto& q : st.quarantined) {
        std::string ranges;
        for (const auto& [domain, range] : q.sequences) {
          ranges += (ranges.empty() ? "" : ", ") + domain + " [" + std::to_string(range.first) +
                    ", " + std::to_string(range.second) + ")";
        }
        std::printf("  quarantined by a rollback at step %lld (steps %lld..%lld): %s\n",
                    static_cast<long long>(q.spike_step), static_cast<long long>(q.from_step + 1),
                    static_cast<long long>(q.to_step), ranges.c_str());
      }
    }
  }
  auto data = loader::LoaderState::from_json(state->data_state);
  if (data.is_ok() && !data->weights_history.empty()) {
    std::printf("  loader weight history (step the weights apply from):\n");
    for (const auto& w : data->weights_history) {
      std::printf("    step %8lld  %s\n", static_cast<long long>(w.step),
                  format_weights_line(w.weights).c_str());
    }
  }
}

Status run_show(const MixArgs& args) {
  KILN_RETURN_IF_ERROR(require_run_dir(args.run_dir));
  auto file = engine::read_mixture(args.run_dir);
  if (!file.is_ok()) {
    std::printf("control file %s is invalid (the run ignores it): %s\n",
                engine::mixture_path(args.run_dir).c_str(), file.status().to_string().c_str());
  } else if (!file->has_value()) {
    std::printf("no control file (%s): the run uses its configured mixture\n",
                engine::mixture_path(args.run_dir).c_str());
  } else {
    std::printf("control file %s:\n%s", engine::mixture_path(args.run_dir).c_str(),
                format_weights(**file).c_str());
  }
  if (auto logged = engine::last_logged_weights(args.run_dir)) {
    std::printf("in effect at step %lld:\n%s", static_cast<long long>(logged->step),
                format_weights(logged->weights).c_str());
  }
  print_history(args.run_dir, args.history);
  print_accounting(args.run_dir);
  return Status::ok();
}

}  // namespace

RunFn add_mix_command(CLI::App& root) {
  CLI::App* mix = root.add_subcommand("mix", "show or set the live domain mixture of a run");
  mix->require_subcommand(1);
  auto args = std::make_shared<MixArgs>();
  CLI::App* set = mix->add_subcommand(
      "set", "write RUN/control/mixture.json; a running `kiln train` applies it at its next step");
  set->add_option("run", args->run_dir, "run directory")->required();
  set->add_option("weights", args->assignments, "DOMAIN=WEIGHT ... (weights are normalised; "
                                                "domains not named get 0)")
      ->required();
  CLI::App* policy = mix->add_subcommand(
      "policy", "resume a mixing policy (after kiln mix set paused it) or switch to another: "
                "writes RUN/control/policy.json, applied at the run's next step");
  policy->add_option("run", args->run_dir, "run directory")->required();
  policy->add_option("name", args->policy, "static | schedule | doremi | odm")->required();
  CLI::App* show = mix->add_subcommand(
      "show", "print the control file, the weights in effect, the policy and its history");
  show->add_option("run", args->run_dir, "run directory")->required();
  show->add_option("--history", args->history, "history lines to print")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  return [args, set, policy, show]() -> Status {
    if (set->parsed()) return run_set(*args);
    if (policy->parsed()) return run_policy(*args);
    if (show->parsed()) return run_show(*args);
    return Status::usage("expected 'kiln mix set', 'kiln mix policy' or 'kiln mix show'");
  };
}

}  // namespace kiln::cli
