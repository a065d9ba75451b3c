#include "engine/checkpoint.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/log.h"
#include "engine/safetensors.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "kiln-checkpoint/1";

nlohmann::json model_json(const ModelConfig& m) {
  return {{"vocab_size", m.vocab_size}, {"d_model", m.d_model}, {"n_layers", m.n_layers},
          {"n_heads", m.n_heads}, {"seq_len", m.seq_len}};
}

Status fs_error(const std::string& what, const fs::path& p, const std::error_code& ec) {
  return Status::io(what + ": " + ec.message()).with_file(p.string());
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

Status save_checkpoint(const std::string& run_dir, const ParamStore& params,
                       const TrainerState& state, const std::string& config_yaml,
                       int64_t keep_last) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = checkpoint_dir_name(state.step);
  const fs::path final_dir = root / name;
  const fs::path tmp_dir = root / ("." + name + ".tmp." + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return fs_error("create checkpoint directory", tmp_dir, ec);

  std::vector<TensorView> model, optim;
  // Host copies of device tensors (none when the parameters are in host memory).
  std::deque<std::vector<float>> scratch;
  auto view = [&](int ti, ParamField f) {
    scratch.emplace_back();
    return params.host_view(ti, f, &scratch.back());
  };
  const auto& tensors = params.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ParamTensor& t = tensors[i];
    const int ti = static_cast<int>(i);
    model.push_back({t.name, "F32", t.shape, view(ti, ParamField::kMaster), t.numel * 4});
    optim.push_back(
        {t.name + ".exp_avg", "F32", t.shape, view(ti, ParamField::kExpAvg), t.numel * 4});
    optim.push_back(
        {t.name + ".exp_avg_sq", "F32", t.shape, view(ti, ParamField::kExpAvgSq), t.numel * 4});
  }
  std::map<std::string, std::string> meta = {{"format", kFormat},
                                             {"precision", precision_name(params.precision())}};
  KILN_RETURN_IF_ERROR(write_safetensors((tmp_dir / "model.safetensors").string(), model, meta));
  KILN_RETURN_IF_ERROR(write_safetensors((tmp_dir / "optimizer.safetensors").string(), optim, meta));
  KILN_ASSIGN_OR_RETURN(uint64_t model_hash, xxh3_file((tmp_dir / "model.safetensors").string()));
  KILN_ASSIGN_OR_RETURN(uint64_t optim_hash, xxh3_file((tmp_dir / "optimizer.safetensors").string()));

  nlohmann::json j;
  j["format"] = kFormat;
  j["step"] = state.step;
  j["adam_updates"] = state.adam_updates;
  j["tokens"] = state.tokens;
  j["skipped_steps"] = state.skipped_steps;
  j["seed"] = state.seed;
  j["precision"] = precision_name(params.precision());
  j["model"] = model_json(params.model());
  j["loss_scaler"] = {{"scale", state.scaler.scale},
                      {"clean_steps", state.scaler.clean_steps},
                      {"hysteresis_left", state.scaler.hysteresis_left},
                      {"overflows", state.scaler.overflows}};
  j["data_state"] = state.data_state;
  j["mixture_hash"] = hex64(state.mixture_hash);
  j["extra"] = state.extra;
  j["rng"] = {{"kind", "counter"}, {"seed", state.seed}};
  j["files"] = {{"model.safetensors", hex64(model_hash)},
                {"optimizer.safetensors", hex64(optim_hash)}};
  KILN_RETURN_IF_ERROR(write_file_atomic((tmp_dir / "config.yaml").string(), config_yaml));
  // state.json last: a directory without it is never complete.
  KILN_RETURN_IF_ERROR(write_file_atomic((tmp_dir / "state.json").string(), j.dump(2) + "\n"));
  KILN_RETURN_IF_ERROR(fsync_dir(tmp_dir.string()));

  if (fs::exists(final_dir, ec)) {  // an older attempt at the same step (e.g. after a crash)
    fs::remove_all(final_dir, ec);
    if (ec) return fs_error("remove old checkpoint", final_dir, ec);
  }
  KILN_RETURN_IF_ERROR(rename_durable(tmp_dir.string(), final_dir.string()));
  KILN_RETURN_IF_ERROR(write_file_atomic((root / "latest").string(), name + "\n"));

  if (keep_last > 0) {
    std::vector<std::string> steps;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string n = entry.path().filename().string();
      if (entry.is_directory() && n.rfind("step-", 0) == 0) steps.push_back(n);
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < steps.size(); ++i) {
      if (steps[i] == name) continue;
      fs::remove_all(root / steps[i], ec);
      if (ec) KILN_LOG_WARN("could not remove old checkpoint {}: {}", steps[i], ec.message());
    }
  }
  return Status::ok();
}

Result<std::string> latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path latest = root / "latest";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return Status::not_found("no checkpoint").with_file(latest.string());
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(latest.string()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.rfind("step-", 0) != 0 || text.find('/') != std::string::npos) {
    return Status::data("'latest' does not name a step directory").with_file(latest.string());
  }
  const fs::path dir = root / text;
  if (!fs::exists(dir / "state.json", ec)) {
    return Status::data("'latest' names an incomplete or missing checkpoint: " + text)
        .with_file(latest.string());
  }
  return dir.string();
}

Status load_checkpoint(const std::string& dir_text, ParamStore* params, TrainerState* state) {
  const fs::path dir(dir_text);
  const std::string state_path = (dir / "state.json").string();
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    if (j.at("format") != kFormat) return Status::data("unknown checkpoint format").with_file(state_path);
    if (j.at("model") != model_json(params->model())) {
      return Status::config("checkpoint model shape " + j.at("model").dump() +
                            " differs from the config's " + model_json(params->model()).dump())
          .with_file(state_path);
    }
    state->precision = j.at("precision").get<std::string>();
    state->step = j.at("step").get<int64_t>();
    state->adam_updates = j.at("adam_updates").get<int64_t>();
    state->tokens = j.at("tokens").get<int64_t>();
    state->skipped_steps = j.at("skipped_steps").get<int64_t>();
    state->seed = j.at("seed").get<uint64_t>();
    const auto& ls = j.at("loss_scaler");
    state->scaler.scale = ls.at("scale").get<double>();
    state->scaler.clean_steps = ls.at("clean_steps").get<int64_t>();
    state->scaler.hysteresis_left = ls.at("hysteresis_left").get<int64_t>();
    state->scaler.overflows = ls.at("overflows").get<int64_t>();
    state->data_state = j.at("data_state").get<std::string>();
    KILN_ASSIGN_OR_RETURN(state->mixture_hash, parse_hex64(j.at("mixture_hash").get<std::string>()));
    // "extra" came later: checkpoints without it resume with fresh policy/stability state.
    state->extra.clear();
    if (auto e = j.find("extra"); e != j.end() && e->is_object()) {
      for (auto it = e->begin(); it != e->end(); ++it) state->extra[it.key()] = it.value().get<std::string>();
    }
    for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
      KILN_ASSIGN_OR_RETURN(uint64_t want, parse_hex64(j.at("files").at(f).get<std::string>()));
      KILN_ASSIGN_OR_RETURN(uint64_t got, xxh3_file((dir / f).string()));
      if (want != got) return Status::data("checksum mismatch").with_file((dir / f).string());
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what()).with_file(state_path);
  }
  KILN_ASSIGN_OR_RETURN(SafetensorsFile model, SafetensorsFile::read((dir / "model.safetensors").string()));
  KILN_ASSIGN_OR_RETURN(SafetensorsFile optim,
                        SafetensorsFile::read((dir / "optimizer.safetensors").string()));
  const auto& tensors = params->tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ParamTensor& t = tensors[i];
    const int ti = static_cast<int>(i);
    KILN_ASSIGN_OR_RETURN(const void* w, model.get(t.name, "F32", t.shape));
    KILN_ASSIGN_OR_RETURN(const void* m, optim.get(t.name + ".exp_avg", "F32", t.shape));
    KILN_ASSIGN_OR_RETURN(const void* v, optim.get(t.name + ".exp_avg_sq", "F32", t.shape));
    params->upload(ti, ParamField::kMaster, static_cast<const float*>(w));
    params->upload(ti, ParamField::kExpAvg, static_cast<const float*>(m));
    params->upload(ti, ParamField::kExpAvgSq, static_cast<const float*>(v));
  }
  params->zero_grads();
  params->sync_low_precision();
  return Status::ok();
}

}  // namespace kiln::engine
