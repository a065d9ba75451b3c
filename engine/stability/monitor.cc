#include "engine/stability/monitor.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/json.h"
#include "common/log.h"

namespace kiln::engine {

namespace {
constexpr int64_t kMinWindow = 8;  // z-scores need a few values to mean anything

// A unit buffer readable on the host: the buffer itself when the runtime's memory is host
// memory, else a copy made into *scratch (engine/device/runtime.h: host code reaches device memory
// only through the runtime's copies).
const float* host_read(Runtime& rt, const DeviceArray<float>& a, size_t n,
                       std::vector<float>* scratch) {
  if (rt.host_addressable()) return a.data();
  scratch->resize(n);
  rt.copy_to_host(scratch->data(), a.data(), n * sizeof(float));
  return scratch->data();
}

}  // namespace

void RollingStats::push(double x) {
  values_.push_back(x);
  while (static_cast<int64_t>(values_.size()) > window_) values_.pop_front();
}

double RollingStats::mean() const {
  if (values_.empty()) return 0;
  double s = 0;
  for (double v : values_) s += v;
  return s / static_cast<double>(values_.size());
}

double RollingStats::variance() const {
  if (values_.empty()) return 0;
  const double m = mean();
  double s = 0;
  for (double v : values_) s += (v - m) * (v - m);
  return s / static_cast<double>(values_.size());
}

double RollingStats::z(double x) const {
  if (values_.empty()) return 0;
  const double m = mean();
  // Floor the spread at 1e-3 of the mean: a perfectly flat window must not turn noise into z 1e9.
  const double sd = std::max(std::sqrt(variance()), 1e-3 * std::abs(m) + 1e-12);
  return (x - m) / sd;
}

SpikeCheck SpikeDetector::check(int64_t step, double loss, double grad_norm) const {
  SpikeCheck c;
  if (loss_.size() >= kMinWindow) c.loss_z = loss_.z(loss);
  if (grad_.size() >= kMinWindow) c.grad_z = grad_.z(grad_norm);
  if (step <= config_.warmup_steps || loss_.size() < kMinWindow) return c;
  char buf[96];
  if (std::isfinite(loss) && c.loss_z > config_.z_loss) {
    std::snprintf(buf, sizeof buf, "loss z %.1f > %g", c.loss_z, config_.z_loss);
    c.spike = true;
    c.why = buf;
  } else if (std::isfinite(grad_norm) && c.grad_z > config_.z_grad) {
    std::snprintf(buf, sizeof buf, "grad norm z %.1f > %g", c.grad_z, config_.z_grad);
    c.spike = true;
    c.why = buf;
  }
  return c;
}

void SpikeDetector::record_clean(double loss, double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return;
  loss_.push(loss);
  grad_.push(grad_norm);
}

BatchCheck inspect_batch(const std::vector<MicroBatch>& batches, double max_fraction) {
  BatchCheck c;
  std::unordered_map<int32_t, int64_t> counts;
  for (const MicroBatch& b : batches) {
    for (int32_t t : b.targets) {
      if (t < 0) continue;
      ++counts[t];
      ++c.targets;
    }
  }
  int64_t top = 0;
  for (const auto& [tok, n] : counts) {
    if (n > top || (n == top && tok < c.token)) {
      top = n;
      c.token = tok;
    }
  }
  c.fraction = c.targets > 0 ? static_cast<double>(top) / static_cast<double>(c.targets) : 0.0;
  c.bad = max_fraction > 0 && c.targets > 0 && c.fraction > max_fraction;
  return c;
}

std::map<std::string, double> unit_grad_norms(const ParamStore& params, double loss_scale) {
  std::map<std::string, double> out;
  for (const ParamUnit& u : params.units()) {
    const float* g = u.grad.data();
    const size_t n = u.numel;
    out[u.name] = std::sqrt(params.runtime().sum_squares(&g, &n, 1)) / loss_scale;
  }
  return out;
}

NonFinite find_nonfinite(const ParamStore& params) {
  // Units are stored in forward order (embed, blocks.0 .. blocks.L-1, final): walk them
  // backwards, the order backward fills them in (the tied embedding also gets its LM-head
  // gradient first, but a problem there shows in the final unit too).
  NonFinite r;
  const auto& units = params.units();
  std::vector<float> scratch;
  for (int i = static_cast<int>(units.size()) - 1; i >= 0; --i) {
    const ParamUnit& u = units[i];
    const float* g = host_read(params.runtime(), u.grad, u.numel, &scratch);
    int64_t n = 0;
    for (size_t k = 0; k < u.numel; ++k) n += !std::isfinite(g[k]);
    if (n > 0 && r.first_unit.empty()) r.first_unit = u.name;
    r.count += n;
  }
  return r;
}

std::map<std::string, double> clip_units(ParamStore& params, double loss_scale, double max_norm,
                                         double factor,
                                         std::map<std::string, RollingStats>* averages) {
  std::map<std::string, double> clipped;
  if (max_norm <= 0 && factor <= 0) return clipped;
  const auto norms = unit_grad_norms(params, loss_scale);
  for (ParamUnit& u : params.units()) {
    const double n = norms.at(u.name);
    if (!std::isfinite(n)) continue;
    double limit = max_norm > 0 ? max_norm : INFINITY;
    auto [it, fresh] = averages->try_emplace(u.name, RollingStats(50));
    if (factor > 0 && it->second.size() >= kMinWindow)
      limit = std::min(limit, factor * it->second.mean());
    it->second.push(n);
    if (n <= limit || n == 0) continue;
    const float k = static_cast<float>(limit / n);
    Runtime& rt = params.runtime();
    if (rt.host_addressable()) {
      float* g = u.grad.data();
      for (size_t i = 0; i < u.numel; ++i) g[i] *= k;
    } else {  // rare (only a unit over its limit): a round trip through the host
      std::vector<float> g(u.numel);
      rt.copy_to_host(g.data(), u.grad.data(), u.numel * sizeof(float));
      for (float& x : g) x *= k;
      rt.copy_to_device(u.grad.data(), g.data(), u.numel * sizeof(float));
    }
    clipped[u.name] = n;
  }
  return clipped;
}

std::vector<std::vector<float>> snapshot_masters(const ParamStore& params) {
  std::vector<std::vector<float>> out;
  for (const ParamUnit& u : params.units()) {
    out.emplace_back(u.numel);
    params.runtime().copy_to_host(out.back().data(), u.master.data(), u.numel * sizeof(float));
  }
  return out;
}

std::map<std::string, double> update_ratios(const ParamStore& params,
                                            const std::vector<std::vector<float>>& before) {
  std::map<std::string, double> out;
  const auto& units = params.units();
  std::vector<float> scratch;
  for (size_t i = 0; i < units.size() && i < before.size(); ++i) {
    double d = 0, w = 0;
    const float* now = host_read(params.runtime(), units[i].master, units[i].numel, &scratch);
    for (size_t k = 0; k < units[i].numel; ++k) {
      const double diff = static_cast<double>(now[k]) - before[i][k];
      d += diff * diff;
      w += static_cast<double>(before[i][k]) * before[i][k];
    }
    out[units[i].name] = w > 0 ? std::sqrt(d / w) : 0.0;
  }
  return out;
}

std::string StabilityState::to_json(const SpikeDetector& detector) const {
  nlohmann::json j;
  j["spikes"] = spikes;
  j["spike_skips"] = spike_skips;
  j["rollbacks"] = rollbacks;
  j["bad_batches"] = bad_batches;
  j["layer_clips"] = layer_clips;
  j["nonfinite_in_row"] = nonfinite_in_row;
  j["sequences"] = sequences;
  j["loss_window"] =
      std::vector<double>(detector.loss().values().begin(), detector.loss().values().end());
  j["grad_window"] =
      std::vector<double>(detector.grad().values().begin(), detector.grad().values().end());
  j["quarantined"] = nlohmann::json::array();
  for (const Quarantine& q : quarantined) {
    nlohmann::json s = nlohmann::json::object();
    for (const auto& [d, r] : q.sequences) s[d] = {r.first, r.second};
    j["quarantined"].push_back({{"from_step", q.from_step},
                                {"to_step", q.to_step},
                                {"spike_step", q.spike_step},
                                {"reason", q.reason},
                                {"sequences", s}});
  }
  return j.dump();
}

Status StabilityState::from_json(const std::string& text, StabilityState* state,
                                 SpikeDetector* detector) {
  try {
    nlohmann::json j = parse_untrusted_json_or_throw(text);
    StabilityState s;
    s.spikes = json_integer_at<int64_t>(j, "spikes");
    s.spike_skips = json_integer_at<int64_t>(j, "spike_skips");
    s.rollbacks = json_integer_at<int64_t>(j, "rollbacks");
    s.bad_batches = json_integer_at<int64_t>(j, "bad_batches");
    s.layer_clips = json_integer_at<int64_t>(j, "layer_clips");
    s.nonfinite_in_row = json_integer_at<int64_t>(j, "nonfinite_in_row");
    s.sequences = json_integer_map<uint64_t>(j.at("sequences"), "sequences");
    auto lw = j.at("loss_window").get<std::vector<double>>();
    auto gw = j.at("grad_window").get<std::vector<double>>();
    if (detector) {
      detector->loss().set_values({lw.begin(), lw.end()});
      detector->grad().set_values({gw.begin(), gw.end()});
    }
    for (const auto& q : j.at("quarantined")) {
      Quarantine r;
      r.from_step = json_integer_at<int64_t>(q, "from_step");
      r.to_step = json_integer_at<int64_t>(q, "to_step");
      r.spike_step = json_integer_at<int64_t>(q, "spike_step");
      r.reason = q.at("reason").get<std::string>();
      for (auto it = q.at("sequences").begin(); it != q.at("sequences").end(); ++it)
        r.sequences[it.key()] = {json_integer<uint64_t>(it.value().at(0), it.key()),
                                 json_integer<uint64_t>(it.value().at(1), it.key())};
      s.quarantined.push_back(std::move(r));
    }
    *state = std::move(s);
  } catch (const std::exception& e) {
    return Status::data(std::string("bad stability state in the checkpoint: ") + e.what());
  }
  return Status::ok();
}

}  // namespace kiln::engine
