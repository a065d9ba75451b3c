// kiln mix set RUN d1=w1 d2=w2 ... | kiln mix show RUN
// Writes / reads RUN/control/mixture.json, which a running `kiln train` polls between steps.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "engine/mixture_control.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

struct MixArgs {
  std::string run_dir;
  std::vector<std::string> assignments;
};

// The domains and weights the run last reported (last line of RUN/metrics.jsonl), if any.
std::optional<nlohmann::json> last_metrics(const std::string& run_dir) {
  std::ifstream in(std::filesystem::path(run_dir) / "metrics.jsonl");
  if (!in) return std::nullopt;
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  if (last.empty()) return std::nullopt;
  try {
    return nlohmann::json::parse(last);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a line being written
  }
}

std::string format_weights(const DomainWeights& w) {
  std::string out;
  const DomainWeights norm = w.normalised();
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
  WeightRules rules;
  rules.code = StatusCode::kUsage;
  if (auto m = last_metrics(args.run_dir); m && m->contains("domain_weights") &&
                                            (*m)["domain_weights"].is_object()) {
    for (auto it = (*m)["domain_weights"].begin(); it != (*m)["domain_weights"].end(); ++it)
      rules.known.push_back(it.key());
  }
  KILN_ASSIGN_OR_RETURN(const DomainWeights weights, DomainWeights::parse(args.assignments, rules));
  KILN_RETURN_IF_ERROR(engine::write_mixture(args.run_dir, weights));
  std::printf("wrote %s\n%s", engine::mixture_path(args.run_dir).c_str(),
              format_weights(weights).c_str());
  return Status::ok();
}

Status run_show(const MixArgs& args) {
  if (!std::filesystem::is_directory(args.run_dir)) {
    return Status::usage("run directory does not exist: " + args.run_dir);
  }
  if (!std::filesystem::exists(std::filesystem::path(args.run_dir) / "config.yaml")) {
    return Status::usage("not a training run directory (no config.yaml): " + args.run_dir);
  }
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
  if (auto m = last_metrics(args.run_dir); m && m->contains("domain_weights")) {
    DomainWeights in_effect;
    for (auto it = (*m)["domain_weights"].begin(); it != (*m)["domain_weights"].end(); ++it)
      if (it.value().is_number()) in_effect.set(it.key(), it.value().get<double>());
    std::printf("in effect at step %s:\n%s", m->value("step", nlohmann::json()).dump().c_str(),
                format_weights(in_effect).c_str());
  }
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
  CLI::App* show = mix->add_subcommand("show", "print the control file and the weights in effect");
  show->add_option("run", args->run_dir, "run directory")->required();
  return [args, set, show]() -> Status {
    if (set->parsed()) return run_set(*args);
    if (show->parsed()) return run_show(*args);
    return Status::usage("expected 'kiln mix set' or 'kiln mix show'");
  };
}

}  // namespace kiln::cli
