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
#include "engine/plan.h"
#include "engine/safetensors.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "kiln-checkpoint/2";
// Format 1 (before meta.json): the same files as a P = 1 checkpoint of format 2.
constexpr const char* kFormat1 = "kiln-checkpoint/1";

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

Result<std::string> begin_checkpoint(const std::string& run_dir, int64_t step) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = checkpoint_dir_name(step);
  const fs::path tmp_dir = root / ("." + name + ".tmp." + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return fs_error("create checkpoint directory", tmp_dir, ec);
  return tmp_dir.string();
}

std::string partition_file_name(int64_t index, int64_t partitions, int64_t tp_rank,
                                int64_t tp_parts) {
  char buf[96];
  if (tp_parts <= 1) {
    std::snprintf(buf, sizeof buf, "shard-%05lld-of-%05lld.safetensors",
                  static_cast<long long>(index), static_cast<long long>(partitions));
  } else {
    std::snprintf(buf, sizeof buf, "shard-tp%05lld-of-%05lld-dp%05lld-of-%05lld.safetensors",
                  static_cast<long long>(tp_rank), static_cast<long long>(tp_parts),
                  static_cast<long long>(index), static_cast<long long>(partitions));
  }
  return buf;
}

Result<uint64_t> write_checkpoint_partition(const std::string& tmp_dir, int64_t index,
                                            int64_t partitions,
                                            const std::vector<TensorView>& tensors,
                                            int64_t tp_rank, int64_t tp_parts) {
  const std::string path =
      (fs::path(tmp_dir) / partition_file_name(index, partitions, tp_rank, tp_parts)).string();
  std::map<std::string, std::string> meta = {{"format", kFormat},
                                             {"partition", std::to_string(index)},
                                             {"partitions", std::to_string(partitions)},
                                             {"tp_rank", std::to_string(tp_rank)},
                                             {"tp_partitions", std::to_string(tp_parts)}};
  KILN_RETURN_IF_ERROR(write_safetensors(path, tensors, meta));
  return xxh3_file(path);
}

std::vector<TensorView> unit_partition(const ParamStore& params,
                                       std::deque<std::vector<float>>* scratch) {
  std::vector<TensorView> out;
  Backend& be = params.backend();
  for (const ParamUnit& u : params.units()) {
    const size_t S = shard_numel(u.numel, 1);
    KILN_CHECK(S == u.numel, "unit_partition: units are padded to 64 elements");
    const std::vector<int64_t> shape{static_cast<int64_t>(S)};
    for (auto [suffix, buf] : {std::pair{".master", &u.master}, std::pair{".exp_avg", &u.m},
                               std::pair{".exp_avg_sq", &u.v}}) {
      const float* data = buf->data();
      if (!be.host_addressable()) {
        scratch->emplace_back(S);
        be.copy_to_host(scratch->back().data(), data, S * sizeof(float));
        data = scratch->back().data();
      }
      out.push_back({u.name + suffix, "F32", shape, data, S * sizeof(float)});
    }
  }
  return out;
}

uint64_t replicated_digest(const ParamStore& params, int64_t index, int64_t partitions,
                           const std::vector<TensorView>& views) {
  std::vector<uint64_t> parts;
  const auto& units = params.units();
  KILN_CHECK(views.size() == 3 * units.size(), "replicated_digest: 3 views per unit");
  for (size_t i = 0; i < units.size(); ++i) {
    const size_t S = shard_numel(units[i].numel, partitions);
    const size_t begin = S * static_cast<size_t>(index);
    for (int t : units[i].tensors) {
      const ParamTensor& pt = params.tensors()[t];
      if (pt.split_dim >= 0) continue;
      const size_t a = std::max(pt.offset, begin), b = std::min(pt.offset + pt.numel, begin + S);
      if (a >= b) continue;
      for (size_t k = 0; k < 3; ++k) {
        const auto* base = static_cast<const float*>(views[3 * i + k].data);
        parts.push_back(xxh3_64(base + (a - begin), (b - a) * sizeof(float)));
      }
    }
  }
  return xxh3_64(parts.data(), parts.size() * sizeof(uint64_t));
}

namespace {

// The tensor files of a layout (TP rank major, then data-parallel partition); only TP rank
// tp_rank's when tp_rank >= 0.
std::vector<std::string> tensor_files(const CheckpointLayout& l, int64_t tp_rank = -1) {
  if (!l.sharded()) return {"model.safetensors", "optimizer.safetensors"};
  std::vector<std::string> out;
  for (int64_t t = 0; t < l.tp_partitions; ++t) {
    if (tp_rank >= 0 && t != tp_rank) continue;
    for (int64_t r = 0; r < l.partitions; ++r)
      out.push_back(partition_file_name(r, l.partitions, t, l.tp_partitions));
  }
  return out;
}

nlohmann::ordered_json meta_json(const ParamStore& params, const CheckpointLayout& l) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["world"] = l.world;
  j["dp"] = l.dp;
  j["tp"] = l.tp;
  j["zero_stage"] = l.zero_stage;
  j["precision"] = precision_name(params.precision());
  j["partitions"] = l.partitions;
  j["tp_partitions"] = l.tp_partitions;
  j["split"] = !l.sharded()
                   ? "none: model.safetensors / optimizer.safetensors per tensor"
                   : "tp then dp-flat: file (t, r) holds tensor-parallel rank t's units (every "
                     "tensor's tp_split slice, shape as listed) and of each unit the elements "
                     "[r*S, r*S+S), S = partition_numel, zero past its end";
  j["files"] = tensor_files(l);
  nlohmann::ordered_json units = nlohmann::ordered_json::array();
  for (const auto& u : params.units()) {
    units.push_back({{"name", u.name},
                     {"numel", u.numel},
                     {"partition_numel", l.sharded() ? shard_numel(u.numel, l.partitions)
                                                     : u.numel}});
  }
  j["units"] = units;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const auto& t : params.tensors()) {
    nlohmann::ordered_json e = {{"name", t.name},
                                {"shape", t.shape},
                                {"global_shape", t.global_shape},
                                {"unit", params.units()[t.unit].name},
                                {"offset", t.offset},
                                {"numel", t.numel}};
    // Tensor parallelism: dimension dim is `parts` equal parts (q, k, v: 3), each split in
    // tp_partitions; TP rank t holds the t-th piece of each part. null: replicated.
    e["tp_split"] = l.tp_partitions > 1 && t.split_dim >= 0
                        ? nlohmann::ordered_json{{"dim", t.split_dim}, {"parts", t.split_parts}}
                        : nlohmann::ordered_json(nullptr);
    e["split"] = l.sharded() ? "dp-flat" : "none";
    tensors.push_back(std::move(e));
  }
  j["tensors"] = tensors;
  return j;
}

}  // namespace

Status finish_checkpoint(const std::string& run_dir, const std::string& tmp_dir_text,
                         const ParamStore& params, const TrainerState& state,
                         const std::string& config_yaml, int64_t keep_last,
                         const CheckpointLayout& layout,
                         const std::vector<uint64_t>& hashes) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = checkpoint_dir_name(state.step);
  const fs::path final_dir = root / name;
  const fs::path tmp_dir(tmp_dir_text);
  const std::vector<std::string> files = tensor_files(layout);
  KILN_CHECK(files.size() == hashes.size(), "finish_checkpoint: one checksum per tensor file");
  std::error_code ec;

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
  for (size_t i = 0; i < files.size(); ++i) j["files"][files[i]] = hex64(hashes[i]);
  KILN_RETURN_IF_ERROR(write_file_atomic((tmp_dir / "meta.json").string(),
                                         meta_json(params, layout).dump(2) + "\n"));
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

Status save_checkpoint(const std::string& run_dir, const ParamStore& params,
                       const TrainerState& state, const std::string& config_yaml,
                       int64_t keep_last, const CheckpointLayout& layout_in) {
  CheckpointLayout layout = layout_in;
  layout.partitions = 1;
  KILN_ASSIGN_OR_RETURN(std::string tmp, begin_checkpoint(run_dir, state.step));
  const fs::path tmp_dir(tmp);
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
  return finish_checkpoint(run_dir, tmp, params, state, config_yaml, keep_last, layout,
                           {model_hash, optim_hash});
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

namespace {

// Every unit's master weights and moments from the P partition files of TP rank tp_rank
// (meta.json's layout); params holds that TP rank's slices.
Status load_partitions(const fs::path& dir, const nlohmann::json& meta,
                       const CheckpointLayout& lay, int64_t tp_rank, ParamStore* params) {
  const int64_t P = lay.partitions;
  const std::string meta_path = (dir / "meta.json").string();
  auto& units = params->units();
  const auto& mu = meta.at("units");
  if (mu.size() != units.size()) {
    return Status::data("meta.json lists " + std::to_string(mu.size()) + " units, the model has " +
                        std::to_string(units.size()))
        .with_file(meta_path);
  }
  for (size_t i = 0; i < units.size(); ++i) {
    if (mu[i].at("name") != units[i].name || mu[i].at("numel") != units[i].numel ||
        mu[i].at("partition_numel") != shard_numel(units[i].numel, P)) {
      return Status::data("meta.json unit " + mu[i].dump() + " does not match the model's " +
                          units[i].name + " (" + std::to_string(units[i].numel) + " elements)")
          .with_file(meta_path);
    }
  }
  Backend& be = params->backend();
  for (int64_t r = 0; r < P; ++r) {
    const std::string path =
        (dir / partition_file_name(r, P, tp_rank, lay.tp_partitions)).string();
    KILN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::read(path));
    for (auto& u : units) {
      const size_t S = shard_numel(u.numel, P);
      const size_t begin = S * static_cast<size_t>(r);
      if (begin >= u.numel) continue;
      const size_t n = std::min(S, u.numel - begin);
      const std::vector<int64_t> shape{static_cast<int64_t>(S)};
      for (auto [suffix, buf] : {std::pair{".master", &u.master}, std::pair{".exp_avg", &u.m},
                                 std::pair{".exp_avg_sq", &u.v}}) {
        KILN_ASSIGN_OR_RETURN(const void* src, f.get(u.name + suffix, "F32", shape));
        be.copy_to_device(buf->data() + begin, src, n * sizeof(float));
      }
    }
  }
  return Status::ok();
}

// TP rank tp_rank's tensors (all of them when the checkpoint is not split by TP) into params,
// whose TP split matches: the checksums of the files read are verified first (state.json lists
// them), then the replicated files or the data-parallel partitions are read.
Status load_tensors(const fs::path& dir, const nlohmann::json& meta, const nlohmann::json& listed,
                    const CheckpointLayout& lay, int64_t tp_rank, ParamStore* params) {
  const std::string state_path = (dir / "state.json").string();
  for (const std::string& f : tensor_files(lay, tp_rank)) {
    auto it = listed.find(f);
    if (it == listed.end() || !it->is_string()) {
      return Status::data("state.json does not list " + f).with_file(state_path);
    }
    KILN_ASSIGN_OR_RETURN(uint64_t want, parse_hex64(it->get<std::string>()));
    KILN_ASSIGN_OR_RETURN(uint64_t got, xxh3_file((dir / f).string()));
    if (want != got) return Status::data("checksum mismatch").with_file((dir / f).string());
  }
  if (lay.sharded()) {
    try {
      return load_partitions(dir, meta, lay, tp_rank, params);
    } catch (const nlohmann::json::exception& e) {
      return Status::data(std::string("malformed meta.json: ") + e.what())
          .with_file((dir / "meta.json").string());
    }
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
  return Status::ok();
}

Result<nlohmann::json> read_state_json(const fs::path& dir) {
  const std::string state_path = (dir / "state.json").string();
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (j.at("format") != kFormat && j.at("format") != kFormat1) {
      return Status::data("unknown checkpoint format " + j.at("format").dump()).with_file(state_path);
    }
    return j;
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what()).with_file(state_path);
  }
}

}  // namespace

Status load_consolidated(const std::string& path, ParamStore* params, const std::string& key) {
  KILN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::read(path));
  if (auto m = f.metadata().find("model"); m != f.metadata().end()) {
    nlohmann::json shape = nlohmann::json::parse(m->second, nullptr, false);
    if (shape != model_json(params->model())) {
      return Status::config("the weights are of model " + m->second + ", the config's is " +
                            model_json(params->model()).dump())
          .with_key(key)
          .with_file(path);
    }
  }
  std::vector<float> slice;
  const TpShard mine = params->tp_shard();
  for (size_t i = 0; i < params->tensors().size(); ++i) {
    const ParamTensor& t = params->tensors()[i];
    auto whole = f.get(t.name, "F32", t.global_shape);
    if (!whole.is_ok()) return std::move(whole).take_status().with_key(key);
    slice.resize(t.numel);
    copy_to_shard(t, mine, static_cast<const float*>(*whole), slice.data());
    params->upload(static_cast<int>(i), ParamField::kMaster, slice.data());
  }
  params->sync_low_precision();
  return Status::ok();
}

Result<std::pair<ModelConfig, Precision>> checkpoint_model(const std::string& dir_text) {
  const fs::path dir(dir_text);
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, read_state_json(dir));
  try {
    ModelConfig m;
    const auto& jm = j.at("model");
    m.vocab_size = jm.at("vocab_size").get<int64_t>();
    m.d_model = jm.at("d_model").get<int64_t>();
    m.n_layers = jm.at("n_layers").get<int64_t>();
    m.n_heads = jm.at("n_heads").get<int64_t>();
    m.seq_len = jm.at("seq_len").get<int64_t>();
    const std::string p = j.at("precision").get<std::string>();
    Precision prec = p == "bf16" ? Precision::kBf16 : p == "fp16" ? Precision::kFp16 : Precision::kFp32;
    return std::pair{m, prec};
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what())
        .with_file((dir / "state.json").string());
  }
}

namespace {

// state.json's trainer fields (everything but the model shape and the file list).
Status parse_trainer_state(const nlohmann::json& j, TrainerState* state) {
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
  return Status::ok();
}

}  // namespace

Result<TrainerState> read_trainer_state(const std::string& dir_text) {
  const fs::path dir(dir_text);
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, read_state_json(dir));
  TrainerState state;
  try {
    KILN_RETURN_IF_ERROR(parse_trainer_state(j, &state));
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what())
        .with_file((dir / "state.json").string());
  }
  return state;
}

Status load_checkpoint(const std::string& dir_text, ParamStore* params, TrainerState* state,
                       CheckpointLayout* layout, LoadStats* stats) {
  const fs::path dir(dir_text);
  const std::string state_path = (dir / "state.json").string();
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, read_state_json(dir));
  nlohmann::json meta, files;
  CheckpointLayout lay;
  try {
    if (j.at("model") != model_json(params->model())) {
      return Status::config("checkpoint model shape " + j.at("model").dump() +
                            " differs from the config's " + model_json(params->model()).dump())
          .with_file(state_path);
    }
    KILN_RETURN_IF_ERROR(parse_trainer_state(j, state).with_file(state_path));
    if (j.at("format") == kFormat) {
      const std::string meta_path = (dir / "meta.json").string();
      KILN_ASSIGN_OR_RETURN(std::string mtext, read_file(meta_path));
      try {
        meta = nlohmann::json::parse(mtext);
        lay.world = meta.at("world").get<int64_t>();
        lay.dp = meta.at("dp").get<int64_t>();
        lay.tp = meta.at("tp").get<int64_t>();
        lay.zero_stage = meta.at("zero_stage").get<int64_t>();
        lay.partitions = meta.at("partitions").get<int64_t>();
        lay.tp_partitions = meta.value("tp_partitions", int64_t{1});  // absent before TP shards
      } catch (const nlohmann::json::exception& e) {
        return Status::data(std::string("malformed meta.json: ") + e.what()).with_file(meta_path);
      }
      if (lay.partitions < 1) return Status::data("meta.json: partitions < 1").with_file(meta_path);
    }
    if (lay.tp_partitions < 1) {
      return Status::data("meta.json: tp_partitions < 1").with_file((dir / "meta.json").string());
    }
    files = j.at("files");
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what()).with_file(state_path);
  }
  if (layout) *layout = lay;
  const TpShard mine = params->tp_shard();
  if (lay.tp_partitions == mine.size) {  // the same tensor-parallel split (or none)
    KILN_RETURN_IF_ERROR(load_tensors(dir, meta, files, lay, mine.rank, params));
  } else {
    // Another tensor-parallel size: the TP ranks' files are read one TP rank at a time (its
    // data-parallel partitions one file at a time), and this rank keeps only the elements its
    // slices share with that TP rank's - the whole tensors never exist here.
    const auto& tensors = params->tensors();
    const bool in_place = params->backend().host_addressable();
    // This rank's slices in host memory: the parameters themselves on the CPU, else a copy
    // uploaded at the end.
    std::vector<std::vector<float>> staged(in_place ? 0 : 3 * tensors.size());
    uint64_t staged_bytes = 0;
    auto dst = [&](int ti, int k) -> float* {
      if (in_place) {
        return k == 0 ? params->master(ti) : k == 1 ? params->exp_avg(ti) : params->exp_avg_sq(ti);
      }
      std::vector<float>& v = staged[3 * static_cast<size_t>(ti) + static_cast<size_t>(k)];
      if (v.empty()) {
        v.assign(tensors[ti].numel, 0.0f);
        staged_bytes += v.size() * sizeof(float);
      }
      return v.data();
    };
    Backend& host = cpu_backend();
    uint64_t held = 0;
    int64_t read = 0;
    const int64_t T = lay.tp_partitions, R = mine.size, r = mine.rank;
    for (int64_t t = 0; t < T; ++t) {
      // Every split tensor cuts its dimension into equal pieces, so TP rank t of T shares
      // elements with rank r of R exactly when [t/T, (t+1)/T) and [r/R, (r+1)/R) intersect.
      if (!(t * R < (r + 1) * T && r * T < (t + 1) * R)) continue;
      const TpShard from{static_cast<int>(t), static_cast<int>(T)};
      const uint64_t base = host.memory().in_use;
      ParamStore part(params->model(), Precision::kFp32, false, &host, from);
      for (auto& u : part.units()) u.grad.clear();  // weights and moments only
      KILN_RETURN_IF_ERROR(load_tensors(dir, meta, files, lay, t, &part));
      held = std::max<uint64_t>(held, host.memory().in_use - base);
      for (size_t i = 0; i < tensors.size(); ++i) {
        const int ti = static_cast<int>(i);
        const ParamTensor& ps = part.tensors()[i];
        // Replicated tensors (the same on every TP rank: checked when written) from the first.
        if (ps.split_dim < 0 && read > 0) continue;
        copy_between_shards(ps, from, part.master(ti), tensors[i], mine, dst(ti, 0));
        copy_between_shards(ps, from, part.exp_avg(ti), tensors[i], mine, dst(ti, 1));
        copy_between_shards(ps, from, part.exp_avg_sq(ti), tensors[i], mine, dst(ti, 2));
      }
      ++read;
    }
    if (!in_place) {
      const ParamField fields[] = {ParamField::kMaster, ParamField::kExpAvg, ParamField::kExpAvgSq};
      for (size_t i = 0; i < tensors.size(); ++i) {
        for (int k = 0; k < 3; ++k) params->upload(static_cast<int>(i), fields[k], dst(static_cast<int>(i), k));
      }
    }
    if (stats) {
      stats->reshard_host_bytes = held + staged_bytes;
      stats->reshard_sources = read;
    }
    KILN_LOG_INFO("checkpoint {}: written with tensor-parallel size {}, resharded to {} "
                  "(read the files of the {} TP rank(s) that hold its slices, one at a time: {} "
                  "bytes of host memory held beside this rank's slices)",
                  dir.filename().string(), lay.tp_partitions, mine.size, read,
                  held + staged_bytes);
  }
  params->zero_grads();
  params->sync_low_precision();
  return Status::ok();
}

}  // namespace kiln::engine
