#include "engine/train/metrics.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/json.h"

namespace kiln::engine {
namespace {

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

std::string step_record_json(const StepRecord& r) {
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = number_or_null(r.loss);
  j["lr"] = r.lr;
  j["grad_norm"] = number_or_null(r.grad_norm);
  j["loss_scale"] =
      r.loss_scale ? nlohmann::ordered_json(*r.loss_scale) : nlohmann::ordered_json(nullptr);
  j["tokens"] = r.tokens;
  j["tokens_per_s"] = r.tokens_per_s;
  j["step_ms"] = r.step_ms;
  j["skipped"] = r.skipped;
  if (r.skipped) j["skip_reason"] = r.skip_reason;
  j["clip_coef"] = r.clip_coef;
  nlohmann::ordered_json dl = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.domain_loss) dl[k] = number_or_null(v);
  j["domain_loss"] = dl;
  nlohmann::ordered_json dw = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.domain_weights) dw[k] = v;
  j["domain_weights"] = dw;
  j["loader_wait_ms"] = r.loader_wait_ms;
  if (!r.comm_bytes.empty()) {
    j["comm_ms"] = r.comm_ms;
    nlohmann::ordered_json cb = nlohmann::ordered_json::object();
    for (const auto& [k, v] : r.comm_bytes) cb[k] = v;
    j["comm_bytes"] = cb;
  }
  if (r.pp_bubble) j["pp_bubble"] = *r.pp_bubble;
  if (r.mfu) j["mfu"] = *r.mfu;
  if (r.device_memory_peak_mib) j["device_memory_peak_mib"] = *r.device_memory_peak_mib;
  if (!r.val_loss.empty()) {
    nlohmann::ordered_json vl = nlohmann::ordered_json::object();
    for (const auto& [k, v] : r.val_loss) vl[k] = number_or_null(v);
    j["val_loss"] = vl;
  }
  if (!r.tasks.empty()) {
    nlohmann::ordered_json tj = nlohmann::ordered_json::object();
    for (const auto& [name, m] : r.tasks) {
      nlohmann::ordered_json e = nlohmann::ordered_json::object();
      for (const auto& [k, v] : m) e[k] = number_or_null(v);
      tj[name] = e;
    }
    j["tasks"] = tj;
  }
  j["mixing_policy"] = r.mixing_policy;
  if (r.mixing_paused) j["mixing_paused"] = true;
  j["loss_z"] = number_or_null(r.loss_z);
  j["grad_z"] = number_or_null(r.grad_z);
  j["loss_mean"] = number_or_null(r.loss_mean);
  j["loss_var"] = number_or_null(r.loss_var);
  j["spike"] = r.spike.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.spike);
  if (r.skipped && r.skip_reason == "overflow") {
    j["nonfinite"] = r.nonfinite;
    j["nonfinite_layer"] = r.nonfinite_layer;
  }
  auto object = [](const std::map<std::string, double>& m) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (const auto& [k, v] : m) o[k] = number_or_null(v);
    return o;
  };
  if (!r.grad_norm_layers.empty()) j["grad_norm_layers"] = object(r.grad_norm_layers);
  if (!r.update_ratio.empty()) j["update_ratio"] = object(r.update_ratio);
  if (!r.layers_clipped.empty()) j["layers_clipped"] = object(r.layers_clipped);
  return j.dump();
}

std::string metrics_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "metrics.jsonl").string();
}

std::optional<LoggedWeights> last_logged_weights(const std::string& run_dir) {
  std::ifstream in(metrics_path(run_dir));
  std::optional<LoggedWeights> last;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = parse_untrusted_json_or_discarded(line);
    if (!j.is_object() || !j.contains("domain_weights") || !j["domain_weights"].is_object())
      continue;
    LoggedWeights w;
    try {
      w.step = json_integer_or(j, "step", int64_t{0});
    } catch (const nlohmann::json::exception&) {
      continue;  // a damaged line, as one that is not JSON
    }
    for (const auto& [domain, value] : j["domain_weights"].items())
      if (value.is_number()) w.weights.set(domain, value.get<double>());
    last = std::move(w);
  }
  return last;
}

Result<std::unique_ptr<MetricsLog>> MetricsLog::open(const std::string& run_dir,
                                                     int64_t keep_through_step) {
  const std::string path = metrics_path(run_dir);
  std::string kept;
  {
    std::ifstream in(path);  // no file yet: nothing to keep
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      try {
        auto j = parse_untrusted_json_or_throw(line);
        if (json_integer_at<int64_t>(j, "step") <= keep_through_step) kept += line + "\n";
      } catch (const std::exception&) {
        // a torn last line from a killed run: dropped
      }
    }
  }
  KILN_RETURN_IF_ERROR(write_file_atomic(path, kept));
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) return Status::from_errno("open for appending", path);
  return std::unique_ptr<MetricsLog>(new MetricsLog(path, f));
}

MetricsLog::~MetricsLog() { std::fclose(file_); }

Status MetricsLog::append(const StepRecord& r) {
  const std::string line = step_record_json(r) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return Status::from_errno("write", path_);
  }
  return Status::ok();
}

}  // namespace kiln::engine
