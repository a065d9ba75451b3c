#include "engine/mixing/policy.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/json.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

WeightMap normalised(const WeightMap& w) {
  double total = 0;
  for (const auto& [k, v] : w) total += v;
  WeightMap out;
  for (const auto& [k, v] : w) out[k] = total > 0 ? v / total : 0.0;
  return out;
}

// w <- min_weight + (1 - k * min_weight) * w / sum(w): every weight at least min_weight.
WeightMap floor_weights(const WeightMap& w, double min_weight) {
  WeightMap n = normalised(w);
  double total = 0;
  for (const auto& [name, v] : n) total += v;
  if (!(total > 0))  // no weights given: uniform
    for (auto& [name, v] : n) v = 1.0 / static_cast<double>(n.size());
  const double k = static_cast<double>(n.size());
  const double m = std::clamp(min_weight, 0.0, k > 0 ? 1.0 / k : 0.0);
  for (auto& [name, v] : n) v = m + (1.0 - k * m) * v;
  return n;
}

// softmax over the domains of `logits`.
WeightMap softmax(const WeightMap& logits) {
  double top = -INFINITY;
  for (const auto& [k, v] : logits) top = std::max(top, v);
  WeightMap out;
  double total = 0;
  for (const auto& [k, v] : logits) total += out[k] = std::exp(v - top);
  for (auto& [k, v] : out) v /= total;
  return out;
}

nlohmann::json weights_json(const WeightMap& w) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : w) j[k] = v;
  return j;
}

WeightMap weights_from(const nlohmann::json& j) {
  WeightMap w;
  for (auto it = j.begin(); it != j.end(); ++it) w[it.key()] = it.value().get<double>();
  return w;
}

Result<MixState> doremi_update(const MixingConfig& c, MixState s, const MixObservation& obs) {
  // The per-domain loss: validation loss when evaluated (every domain, whatever its weight),
  // else the interval's training loss; a domain with neither keeps its last value.
  for (const auto& [d, w] : s.weights) {
    if (auto it = obs.val_loss.find(d); it != obs.val_loss.end())
      s.last_loss[d] = it->second;
    else if (auto t = obs.train_loss.find(d); t != obs.train_loss.end())
      s.last_loss[d] = t->second;
  }
  WeightMap logits;
  for (const auto& [d, w] : s.weights) {
    auto ref = c.doremi_reference_loss.find(d);
    if (ref == c.doremi_reference_loss.end()) {
      return Status::internal("doremi: no reference loss for domain '" + d + "'");
    }
    auto loss = s.last_loss.find(d);
    const double excess =
        loss == s.last_loss.end() ? 0.0 : std::max(loss->second - ref->second, 0.0);
    logits[d] = std::log(std::max(w, 1e-300)) + c.doremi_eta * excess;
  }
  WeightMap a = softmax(logits);
  const double k = static_cast<double>(a.size());
  for (auto& [d, v] : a) v = (1.0 - c.doremi_smoothing) * v + c.doremi_smoothing / k;
  s.weights = floor_weights(a, c.min_weight);
  ++s.updates;
  for (const auto& [d, v] : s.weights) s.weight_sum[d] += v;
  return s;
}

MixState odm_update(const MixingConfig& c, MixState s, const MixObservation& obs) {
  const double k = static_cast<double>(s.weights.size());
  int64_t total = 0;
  for (const auto& [d, n] : obs.sequences) total += n;
  for (const auto& [d, loss] : obs.train_loss) {
    auto p = s.weights.find(d);
    if (p == s.weights.end() || !std::isfinite(loss)) continue;
    double importance = 1.0;
    if (total > 0) {
      auto n = obs.sequences.find(d);
      importance = (n == obs.sequences.end() ? 0.0 : static_cast<double>(n->second)) /
                   (static_cast<double>(total) * std::max(p->second, 1e-12));
    }
    const double g = c.odm_reward_smoothing;
    s.reward[d] = g * s.reward[d] + (1.0 - g) * loss * importance;
  }
  ++s.updates;
  const double t = static_cast<double>(s.updates);
  const double eps = c.odm_exploration > 0 ? c.odm_exploration
                                           : std::min(1.0 / k, std::sqrt(std::log(k) / (k * t)));
  // EXP3 uses the previous round's rate on the rewards (eps_0 = eps_1 on the first update).
  const double prev = s.prev_exploration > 0 ? s.prev_exploration : eps;
  WeightMap logits;
  for (const auto& [d, w] : s.weights) logits[d] = prev * s.reward[d];
  WeightMap p = softmax(logits);
  for (auto& [d, v] : p) v = (1.0 - k * eps) * v + eps;
  s.prev_exploration = eps;
  s.weights = floor_weights(p, c.min_weight);
  return s;
}

}  // namespace

WeightMap MixState::average() const {
  if (updates == 0) return weights;
  WeightMap out;
  for (const auto& [d, v] : weight_sum) out[d] = v / static_cast<double>(updates);
  return normalised(out);
}

std::string MixState::to_json() const {
  nlohmann::json j;
  j["policy"] = policy;
  j["paused"] = paused;
  j["updates"] = updates;
  j["weights"] = weights_json(weights);
  j["weight_sum"] = weights_json(weight_sum);
  j["reward"] = weights_json(reward);
  j["prev_exploration"] = prev_exploration;
  j["last_loss"] = weights_json(last_loss);
  return j.dump();
}

Result<MixState> MixState::from_json(const std::string& text, const std::string& origin) {
  try {
    nlohmann::json j = parse_untrusted_json_or_throw(text);
    MixState s;
    s.policy = j.at("policy").get<std::string>();
    KILN_RETURN_IF_ERROR(parse_mix_policy(s.policy, "policy").status());
    s.paused = j.at("paused").get<bool>();
    s.updates = json_integer_at<int64_t>(j, "updates");
    s.weights = weights_from(j.at("weights"));
    s.weight_sum = weights_from(j.at("weight_sum"));
    s.reward = weights_from(j.at("reward"));
    s.prev_exploration = j.at("prev_exploration").get<double>();
    s.last_loss = weights_from(j.at("last_loss"));
    return s;
  } catch (const std::exception& e) {
    return Status::data(std::string("bad mixing state: ") + e.what()).with_file(origin);
  }
}

MixState mix_initial_state(const MixingConfig& config, const std::vector<std::string>& domains,
                           const WeightMap& base) {
  MixState s;
  s.policy = mix_policy_name(config.policy);
  WeightMap w;
  for (const auto& d : domains) {
    auto it = base.find(d);
    w[d] = it == base.end() ? 0.0 : it->second;
  }
  if (config.policy == MixPolicy::kSchedule && !config.schedule.empty()) {
    for (auto& [d, v] : w) v = 0;
    for (const auto& [d, v] : schedule_weights(config, 0)) w[d] = v;
  }
  // The adaptive policies start from the base weights, floored so every domain can be observed.
  const bool adaptive = config.policy == MixPolicy::kDoremi || config.policy == MixPolicy::kOdm;
  s.weights = floor_weights(w, adaptive ? config.min_weight : 0.0);
  return s;
}

bool mix_due(const MixingConfig& config, const MixState& state, int64_t step) {
  if (state.paused) return false;
  if (state.policy == "static") return false;
  if (step % config.update_every == 0) return true;
  if (state.policy == "schedule" && !config.interpolate) {
    for (const auto& p : config.schedule)
      if (p.step == step) return true;
  }
  return false;
}

WeightMap schedule_weights(const MixingConfig& config, int64_t step) {
  const auto& pts = config.schedule;
  if (pts.empty()) return {};
  size_t i = 0;
  while (i + 1 < pts.size() && pts[i + 1].step <= step) ++i;
  if (!config.interpolate || i + 1 == pts.size() || step <= pts[i].step) {
    return normalised(pts[i].weights);
  }
  const double f =
      static_cast<double>(step - pts[i].step) / static_cast<double>(pts[i + 1].step - pts[i].step);
  WeightMap a = normalised(pts[i].weights), b = normalised(pts[i + 1].weights), out;
  for (const auto& [d, v] : a) out[d] += (1.0 - f) * v;
  for (const auto& [d, v] : b) out[d] += f * v;
  return out;
}

Result<MixState> mix_update(const MixingConfig& config, const MixState& state,
                            const MixObservation& obs) {
  if (state.paused) return state;
  if (state.policy == "static") return state;
  if (state.policy == "schedule") {
    MixState s = state;
    WeightMap w = s.weights;
    for (auto& [d, v] : w) v = 0;
    for (const auto& [d, v] : schedule_weights(config, obs.step)) w[d] = v;
    s.weights = normalised(w);
    return s;
  }
  if (state.policy == "doremi") return doremi_update(config, state, obs);
  return odm_update(config, state, obs);
}

Result<WeightMap> load_reference_loss(const std::string& path) {
  const std::string key = "mixing.doremi.reference";
  std::error_code ec;
  if (path.empty()) {
    return Status::config(
               "the doremi policy needs reference losses: a finished run's directory "
               "or a JSON file {\"domain\": loss}")
        .with_key(key);
  }
  if (fs::is_directory(path, ec)) {
    std::ifstream in(fs::path(path) / "metrics.jsonl");
    if (!in) {
      return Status::config("reference run " + path + " has no metrics.jsonl").with_key(key);
    }
    std::vector<nlohmann::json> rows;
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = parse_untrusted_json_or_discarded(line);
      if (!j.is_discarded() && j.is_object()) rows.push_back(std::move(j));
    }
    for (auto it = rows.rbegin(); it != rows.rend(); ++it) {
      if (it->contains("val_loss") && (*it)["val_loss"].is_object() && !(*it)["val_loss"].empty()) {
        WeightMap out;
        for (auto v = (*it)["val_loss"].begin(); v != (*it)["val_loss"].end(); ++v)
          if (v.value().is_number()) out[v.key()] = v.value().get<double>();
        return out;
      }
    }
    WeightMap sum, n;
    const size_t from = rows.size() > 20 ? rows.size() - 20 : 0;
    for (size_t i = from; i < rows.size(); ++i) {
      if (!rows[i].contains("domain_loss") || !rows[i]["domain_loss"].is_object()) continue;
      for (auto v = rows[i]["domain_loss"].begin(); v != rows[i]["domain_loss"].end(); ++v) {
        if (!v.value().is_number()) continue;
        sum[v.key()] += v.value().get<double>();
        n[v.key()] += 1;
      }
    }
    if (sum.empty()) {
      return Status::config("reference run " + path + " logged no val_loss or domain_loss")
          .with_key(key);
    }
    for (auto& [d, v] : sum) v /= n[d];
    return sum;
  }
  auto text = read_file(path);
  if (!text.is_ok()) return Status::config(text.status().to_string()).with_key(key);
  nlohmann::json j = parse_untrusted_json_or_discarded(*text);
  if (j.is_object() && j.contains("loss")) j = j["loss"];
  if (!j.is_object() || j.empty()) {
    return Status::config(path + ": expected a JSON object {\"domain\": loss, ...}").with_key(key);
  }
  WeightMap out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number() || !std::isfinite(it.value().get<double>())) {
      return Status::config(path + ": the loss of '" + it.key() + "' is not a finite number")
          .with_key(key);
    }
    out[it.key()] = it.value().get<double>();
  }
  return out;
}

}  // namespace kiln::engine
