#include "engine/config/mixing.h"

#include <array>
#include <cmath>

#include "engine/config/schema.h"
#include "engine/config/sections.h"

namespace kiln::engine {

using namespace config_schema;  // NOLINT(google-build-using-namespace): the schema's builders

namespace {

constexpr std::array<std::pair<const char*, MixPolicy>, 4> kPolicies{
    {{"static", MixPolicy::kStatic},
     {"schedule", MixPolicy::kSchedule},
     {"doremi", MixPolicy::kDoremi},
     {"odm", MixPolicy::kOdm}}};

// mixing.schedule: [{step: N, weights: {domain: weight}}, ...], steps ascending from 0.
Status read_schedule(const Config& cfg, const std::string& key, MixingConfig* mx) {
  YAML::Node sched = cfg.node(key);
  for (size_t i = 0; sched.IsSequence() && i < sched.size(); ++i) {
    const std::string at = key + "[" + std::to_string(i) + "]";
    const YAML::Node& n = sched[i];
    if (!n.IsMap() || !n["step"] || !n["weights"] || !n["weights"].IsMap() || n.size() != 2) {
      return bad(at, "expected {step: N, weights: {domain: weight, ...}}");
    }
    MixingConfig::Point p;
    try {
      p.step = n["step"].as<int64_t>();
      for (const auto& kv : n["weights"])
        p.weights[kv.first.as<std::string>()] = kv.second.as<double>();
    } catch (const YAML::Exception&) {
      return bad(at, "expected an integer step and numeric weights");
    }
    double total = 0;
    for (const auto& [d, w] : p.weights) {
      if (!std::isfinite(w) || w < 0)
        return bad(at + ".weights." + d, "must be a finite number >= 0");
      total += w;
    }
    if (total <= 0) return bad(at + ".weights", "weights sum to zero");
    if (i == 0 ? p.step != 0 : p.step <= mx->schedule.back().step) {
      return bad(at + ".step",
                 i == 0 ? "the first point must be at step 0" : "steps must increase");
    }
    mx->schedule.push_back(std::move(p));
  }
  return Status::ok();
}

}  // namespace

const Schema<MixingConfig>& mixing_schema() {
  using M = MixingConfig;
  constexpr int64_t kBig = int64_t{1} << 40;
  static const Schema<M> schema{
      "mixing",
      {
          custom<M>(
              "policy", [](const M& m) { return std::string(mix_policy_name(m.policy)); },
              [](const Config& cfg, const std::string& k, M* m) -> Status {
                KILN_ASSIGN_OR_RETURN(std::string name, cfg.get<std::string>(k));
                KILN_ASSIGN_OR_RETURN(m->policy, parse_mix_policy(name, k));
                return Status::ok();
              },
              "static | schedule | doremi | odm"),
          integer<M>("update_every", &M::update_every, 1, kBig, "steps between weight updates"),
          real<M>("min_weight", &M::min_weight, 0.0, 1.0, "floor of every domain's weight"),
          custom<M>(
              "schedule", [](const M&) { return std::string("[]"); }, read_schedule,
              "[{step: 0, weights: {web: 0.7, code: 0.3}}, {step: 1000, weights: {...}}]"),
          flag<M>("interpolate", &M::interpolate,
                  "schedule: linear between points instead of stepped"),
          real<M>("doremi.eta", &M::doremi_eta, 0.0, 1e6),
          real<M>("doremi.smoothing", &M::doremi_smoothing, 0.0, 1.0),
          text<M>("doremi.reference", &M::doremi_reference,
                  "a finished reference run's directory or a JSON file {domain: loss}"),
          real<M>("odm.reward_smoothing", &M::odm_reward_smoothing, 0.0, 1.0),
          real<M>("odm.exploration", &M::odm_exploration, 0.0, 1.0,
                  "0: min(1/k, sqrt(ln k / (k t)))"),
      },
      [](const M& mx) {
        if (mx.policy == MixPolicy::kSchedule && mx.schedule.empty()) {
          return bad("mixing.schedule",
                     "the schedule policy needs at least one {step, weights} point");
        }
        return Status::ok();
      }};
  return schema;
}

const char* mix_policy_name(MixPolicy p) { return name_of(Names<MixPolicy>(kPolicies), p); }

Result<MixPolicy> parse_mix_policy(const std::string& name, const std::string& key) {
  for (const auto& [n, p] : kPolicies)
    if (name == n) return p;
  return Status::config("'" + name + "' is not one of static | schedule | doremi | odm")
      .with_key(key);
}

Result<MixingConfig> parse_mixing_config(const Config& cfg) {
  return parse_section(cfg, mixing_schema());
}

}  // namespace kiln::engine
