#include "engine/checkpoint/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/json.h"
#include "common/log.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/parallel/layout_plan.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "kiln-checkpoint/2";
// Format 2 with pipeline stages (pp > 1): per-stage files, meta.json's pp / pp_stages. Only
// pipelined checkpoints carry it, so an older Kiln refuses them by their format instead of
// failing to find the files it expects; without pipelining the format stays 2.
constexpr const char* kFormatPp = "kiln-checkpoint/2.1";
// Format 1 (before meta.json): the same files as a P = 1 checkpoint of format 2.
constexpr const char* kFormat1 = "kiln-checkpoint/1";

const char* format_of(const CheckpointLayout& l) { return l.pp > 1 ? kFormatPp : kFormat; }

// The model's shape; a GPT-2 of the default options keeps the five keys it always had.
nlohmann::json model_json(const ModelConfig& m) {
  nlohmann::json j = {{"vocab_size", m.vocab_size},
                      {"d_model", m.d_model},
                      {"n_layers", m.n_layers},
                      {"n_heads", m.n_heads},
                      {"seq_len", m.seq_len}};
  const bool gpt2_defaults = !m.llama() && m.kv_heads() == m.n_heads && m.ffn() == 4 * m.d_model &&
                             m.tie_embeddings && m.bias;
  if (!gpt2_defaults) {
    j["arch"] = arch_name(m.arch);
    j["n_kv_heads"] = m.kv_heads();
    j["ffn_hidden"] = m.ffn();
    j["rope_theta"] = m.rope_theta;
    j["norm_eps"] = m.norm_eps;
    j["tie_embeddings"] = m.tie_embeddings;
    j["bias"] = m.bias;
  }
  return j;
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

int64_t checkpoint_unit_stage(const CheckpointLayout& l, int64_t n_layers, int unit) {
  if (l.pp <= 1) return 0;
  KILN_CHECK(static_cast<int64_t>(l.pp_bounds.size()) == l.pp + 1,
             "checkpoint_unit_stage: pp + 1 stage bounds expected");
  if (unit <= 0) return 0;               // embed
  if (unit > n_layers) return l.pp - 1;  // final
  const int64_t block = unit - 1;
  const auto it = std::upper_bound(l.pp_bounds.begin(), l.pp_bounds.end(), block);
  return std::clamp<int64_t>(it - l.pp_bounds.begin() - 1, 0, l.pp - 1);
}

bool checkpoint_owns(const ParamStore& params, int unit) {
  if (!params.holds(unit)) return false;
  return unit != 0 || params.pp_stage().first();  // the first stage's embeddings are written
}

std::string partition_file_name(int64_t index, int64_t partitions, int64_t tp_rank,
                                int64_t tp_parts, int64_t pp_stage, int64_t pp_stages) {
  char buf[128];
  if (pp_stages > 1) {
    std::snprintf(buf, sizeof buf,
                  "shard-pp%05lld-of-%05lld-tp%05lld-of-%05lld-dp%05lld-of-%05lld.safetensors",
                  static_cast<long long>(pp_stage), static_cast<long long>(pp_stages),
                  static_cast<long long>(tp_rank), static_cast<long long>(tp_parts),
                  static_cast<long long>(index), static_cast<long long>(partitions));
  } else if (tp_parts <= 1) {
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
                                            const std::vector<TensorView>& tensors, int64_t tp_rank,
                                            int64_t tp_parts, int64_t pp_stage, int64_t pp_stages) {
  const std::string path = (fs::path(tmp_dir) / partition_file_name(index, partitions, tp_rank,
                                                                    tp_parts, pp_stage, pp_stages))
                               .string();
  std::map<std::string, std::string> meta = {{"format", pp_stages > 1 ? kFormatPp : kFormat},
                                             {"partition", std::to_string(index)},
                                             {"partitions", std::to_string(partitions)},
                                             {"tp_rank", std::to_string(tp_rank)},
                                             {"tp_partitions", std::to_string(tp_parts)}};
  if (pp_stages > 1) {
    meta["pp_stage"] = std::to_string(pp_stage);
    meta["pp_stages"] = std::to_string(pp_stages);
  }
  KILN_RETURN_IF_ERROR(write_safetensors(path, tensors, meta));
  return xxh3_file(path);
}

std::vector<TensorView> unit_partition(const ParamStore& params,
                                       std::deque<std::vector<float>>* scratch) {
  std::vector<TensorView> out;
  Runtime& rt = params.runtime();
  for (size_t i = 0; i < params.units().size(); ++i) {
    if (!checkpoint_owns(params, static_cast<int>(i))) continue;
    const ParamUnit& u = params.units()[i];
    const size_t S = shard_numel(u.numel, 1);
    KILN_CHECK(S == u.numel, "unit_partition: units are padded to 64 elements");
    const std::vector<int64_t> shape{static_cast<int64_t>(S)};
    for (auto [suffix, buf] : {std::pair{".master", &u.master}, std::pair{".exp_avg", &u.m},
                               std::pair{".exp_avg_sq", &u.v}}) {
      const float* data = buf->data();
      if (!rt.host_addressable()) {
        scratch->emplace_back(S);
        rt.copy_to_host(scratch->back().data(), data, S * sizeof(float));
        data = scratch->back().data();
      }
      out.push_back({u.name + suffix, "F32", shape, data, S * sizeof(float)});
    }
  }
  return out;
}

std::vector<TensorView> owned_views(const ParamStore& params, std::vector<TensorView> views) {
  std::map<std::string, bool> owned;  // unit name -> written by this stage
  for (size_t i = 0; i < params.units().size(); ++i)
    owned[params.units()[i].name] = checkpoint_owns(params, static_cast<int>(i));
  std::vector<TensorView> out;
  for (TensorView& v : views) {
    // "<unit>.master" / "<unit>.exp_avg" / "<unit>.exp_avg_sq" (the field has no dot inside).
    const size_t dot = v.name.rfind('.');
    auto it = dot == std::string::npos ? owned.end() : owned.find(v.name.substr(0, dot));
    KILN_CHECK(it != owned.end(), "owned_views: a view of no unit: " + v.name);
    if (it->second) out.push_back(std::move(v));
  }
  return out;
}

uint64_t replicated_digest(const ParamStore& params, int64_t index, int64_t partitions,
                           const std::vector<TensorView>& views) {
  std::vector<uint64_t> parts;
  const auto& units = params.units();
  size_t owned = 0;
  for (size_t i = 0; i < units.size(); ++i) owned += checkpoint_owns(params, static_cast<int>(i));
  KILN_CHECK(views.size() == 3 * owned, "replicated_digest: 3 views per owned unit");
  size_t v = 0;  // the unit's first view
  for (size_t i = 0; i < units.size(); ++i) {
    if (!checkpoint_owns(params, static_cast<int>(i))) continue;
    const size_t S = shard_numel(units[i].numel, partitions);
    const size_t begin = S * static_cast<size_t>(index);
    for (int t : units[i].tensors) {
      const ParamTensor& pt = params.tensors()[t];
      if (pt.split_dim >= 0) continue;
      const size_t a = std::max(pt.offset, begin), b = std::min(pt.offset + pt.numel, begin + S);
      if (a >= b) continue;
      for (size_t k = 0; k < 3; ++k) {
        const auto* base = static_cast<const float*>(views[v + k].data);
        parts.push_back(xxh3_64(base + (a - begin), (b - a) * sizeof(float)));
      }
    }
    v += 3;
  }
  return xxh3_64(parts.data(), parts.size() * sizeof(uint64_t));
}

namespace {

// The tensor files of a layout (pipeline stage major, then TP rank, then data-parallel
// partition); only TP rank tp_rank's when tp_rank >= 0, only stage pp_stage's when pp_stage >= 0.
std::vector<std::string> tensor_files(const CheckpointLayout& l, int64_t tp_rank = -1,
                                      int64_t pp_stage = -1) {
  if (!l.sharded()) return {"model.safetensors", "optimizer.safetensors"};
  std::vector<std::string> out;
  for (int64_t s = 0; s < l.pp; ++s) {
    if (pp_stage >= 0 && s != pp_stage) continue;
    for (int64_t t = 0; t < l.tp_partitions; ++t) {
      if (tp_rank >= 0 && t != tp_rank) continue;
      for (int64_t r = 0; r < l.partitions; ++r)
        out.push_back(partition_file_name(r, l.partitions, t, l.tp_partitions, s, l.pp));
    }
  }
  return out;
}

nlohmann::ordered_json meta_json(const ParamStore& params, const CheckpointLayout& l) {
  nlohmann::ordered_json j;
  j["format"] = format_of(l);
  j["world"] = l.world;
  j["dp"] = l.dp;
  j["tp"] = l.tp;
  j["zero_stage"] = l.zero_stage;
  j["precision"] = precision_name(params.precision());
  j["partitions"] = l.partitions;
  j["tp_partitions"] = l.tp_partitions;
  j["split"] = !l.sharded() ? "none: model.safetensors / optimizer.safetensors per tensor"
               : l.pp > 1
                   ? "pp then tp then dp-flat: file (s, t, r) holds, of the units of pipeline "
                     "stage s (pp_stages), tensor-parallel rank t's (every tensor's tp_split "
                     "slice, shape as listed) and of each unit the elements [r*S, r*S+S), S = "
                     "partition_numel, zero past its end"
                   : "tp then dp-flat: file (t, r) holds tensor-parallel rank t's units (every "
                     "tensor's tp_split slice, shape as listed) and of each unit the elements "
                     "[r*S, r*S+S), S = partition_numel, zero past its end";
  j["files"] = tensor_files(l);
  const int64_t L = params.model().n_layers;
  if (l.pp > 1) {
    // Pipeline stages: each one's blocks [first, end), the units it wrote and its files.
    j["pp"] = l.pp;
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (int64_t s = 0; s < l.pp; ++s) {
      nlohmann::ordered_json names = nlohmann::ordered_json::array();
      for (size_t i = 0; i < params.units().size(); ++i) {
        if (checkpoint_unit_stage(l, L, static_cast<int>(i)) == s)
          names.push_back(params.units()[i].name);
      }
      stages.push_back(
          {{"stage", s},
           {"blocks",
            {l.pp_bounds[static_cast<size_t>(s)], l.pp_bounds[static_cast<size_t>(s) + 1]}},
           {"units", names},
           {"files", tensor_files(l, -1, s)}});
    }
    j["pp_stages"] = stages;
  }
  nlohmann::ordered_json units = nlohmann::ordered_json::array();
  for (size_t i = 0; i < params.units().size(); ++i) {
    const ParamUnit& u = params.units()[i];
    nlohmann::ordered_json e = {
        {"name", u.name},
        {"numel", u.numel},
        {"partition_numel", l.sharded() ? shard_numel(u.numel, l.partitions) : u.numel}};
    if (l.pp > 1) e["stage"] = checkpoint_unit_stage(l, L, static_cast<int>(i));
    units.push_back(std::move(e));
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
    // Parts of different sizes (grouped-query q, k, v): their rows.
    if (!e["tp_split"].is_null() && !t.part_rows.empty()) e["tp_split"]["part_rows"] = t.part_rows;
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
                         const CheckpointLayout& layout, const std::vector<uint64_t>& hashes) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = checkpoint_dir_name(state.step);
  const fs::path final_dir = root / name;
  const fs::path tmp_dir(tmp_dir_text);
  const std::vector<std::string> files = tensor_files(layout);
  KILN_CHECK(files.size() == hashes.size(), "finish_checkpoint: one checksum per tensor file");
  if (layout.pp > 1) {
    const auto& b = layout.pp_bounds;
    bool ok = static_cast<int64_t>(b.size()) == layout.pp + 1 && b.front() == 0 &&
              b.back() == params.model().n_layers;
    for (size_t s = 0; ok && s + 1 < b.size(); ++s) ok = b[s] < b[s + 1];
    KILN_CHECK(ok, "finish_checkpoint: pp_bounds must be pp + 1 rising values, 0 ... n_layers");
  }
  std::error_code ec;

  nlohmann::json j;
  j["format"] = format_of(layout);
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
                       const TrainerState& state, const std::string& config_yaml, int64_t keep_last,
                       const CheckpointLayout& layout_in) {
  KILN_CHECK(params.pp_stage().size == 1, "save_checkpoint: a whole model's store expected");
  CheckpointLayout layout = layout_in;
  layout.partitions = 1;
  layout.pp = 1;
  layout.pp_bounds.clear();
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
  KILN_RETURN_IF_ERROR(
      write_safetensors((tmp_dir / "optimizer.safetensors").string(), optim, meta));
  KILN_ASSIGN_OR_RETURN(uint64_t model_hash, xxh3_file((tmp_dir / "model.safetensors").string()));
  KILN_ASSIGN_OR_RETURN(uint64_t optim_hash,
                        xxh3_file((tmp_dir / "optimizer.safetensors").string()));
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

Result<nlohmann::json> read_state_json(const fs::path& dir) {
  const std::string state_path = (dir / "state.json").string();
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  try {
    nlohmann::json j = parse_untrusted_json_or_throw(text);
    if (j.at("format") != kFormat && j.at("format") != kFormatPp && j.at("format") != kFormat1) {
      return Status::data("unknown checkpoint format " + json_shown(j.at("format")))
          .with_file(state_path);
    }
    return j;
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what()).with_file(state_path);
  }
}

}  // namespace

Result<std::pair<ModelConfig, Precision>> checkpoint_model(const std::string& dir_text) {
  const fs::path dir(dir_text);
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, read_state_json(dir));
  try {
    ModelConfig m;
    const auto& jm = j.at("model");
    m.vocab_size = json_integer_at<int64_t>(jm, "vocab_size");
    m.d_model = json_integer_at<int64_t>(jm, "d_model");
    m.n_layers = json_integer_at<int64_t>(jm, "n_layers");
    m.n_heads = json_integer_at<int64_t>(jm, "n_heads");
    m.seq_len = json_integer_at<int64_t>(jm, "seq_len");
    if (jm.contains("arch")) {  // the architecture's options (absent: a GPT-2 of the defaults)
      const std::string arch = jm.at("arch").get<std::string>();
      if (arch != "gpt2" && arch != "llama") {
        return Status::data("model.arch '" + arch + "' is not gpt2 or llama")
            .with_file((dir / "state.json").string());
      }
      m.arch = arch == "llama" ? Arch::kLlama : Arch::kGpt2;
      m.n_kv_heads = json_integer_at<int64_t>(jm, "n_kv_heads");
      m.ffn_hidden = json_integer_at<int64_t>(jm, "ffn_hidden");
      m.rope_theta = jm.at("rope_theta").get<double>();
      m.norm_eps = jm.at("norm_eps").get<float>();
      m.tie_embeddings = jm.at("tie_embeddings").get<bool>();
      m.bias = jm.at("bias").get<bool>();
    }
    // (`kiln checkpoint consolidate` builds the model from this shape: hold it to the config's
    // bounds before anything is allocated.)
    if (Status st = check_model_shape(m); !st.is_ok()) {
      return Status::data("model shape: " + st.message())
          .with_key(st.key())
          .with_file((dir / "state.json").string());
    }
    const std::string p = j.at("precision").get<std::string>();
    Precision prec = p == "bf16"   ? Precision::kBf16
                     : p == "fp16" ? Precision::kFp16
                                   : Precision::kFp32;
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
  state->step = json_integer_at<int64_t>(j, "step");
  state->adam_updates = json_integer_at<int64_t>(j, "adam_updates");
  state->tokens = json_integer_at<int64_t>(j, "tokens");
  state->skipped_steps = json_integer_at<int64_t>(j, "skipped_steps");
  state->seed = json_integer_at<uint64_t>(j, "seed");
  const auto& ls = j.at("loss_scaler");
  state->scaler.scale = ls.at("scale").get<double>();
  state->scaler.clean_steps = json_integer_at<int64_t>(ls, "clean_steps");
  state->scaler.hysteresis_left = json_integer_at<int64_t>(ls, "hysteresis_left");
  state->scaler.overflows = json_integer_at<int64_t>(ls, "overflows");
  state->data_state = j.at("data_state").get<std::string>();
  KILN_ASSIGN_OR_RETURN(state->mixture_hash, parse_hex64(j.at("mixture_hash").get<std::string>()));
  // "extra" came later: checkpoints without it resume with fresh policy/stability state.
  state->extra.clear();
  if (auto e = j.find("extra"); e != j.end() && e->is_object()) {
    for (auto it = e->begin(); it != e->end(); ++it)
      state->extra[it.key()] = it.value().get<std::string>();
  }
  // What the run continues from, held to what a run can write: an edited or damaged value would
  // otherwise train on silently (an AdamW step after -1 updates divides by zero and turns every
  // weight to NaN; a negative step names checkpoints "step--0000006" and overwrites good ones).
  auto refuse = [](const char* key, const std::string& what) {
    return Status::data(what).with_key(key);
  };
  const int64_t step = state->step;
  if (step < 0) return refuse("step", "must be >= 0, got " + std::to_string(step));
  for (auto [key, v] : {std::pair{"adam_updates", state->adam_updates},
                        std::pair{"skipped_steps", state->skipped_steps}}) {
    if (v < 0 || v > step) {
      return refuse(key,
                    "must be in [0, step " + std::to_string(step) + "], got " + std::to_string(v));
    }
  }
  for (auto [key, v] : {std::pair{"tokens", state->tokens},
                        std::pair{"loss_scaler.clean_steps", state->scaler.clean_steps},
                        std::pair{"loss_scaler.hysteresis_left", state->scaler.hysteresis_left},
                        std::pair{"loss_scaler.overflows", state->scaler.overflows}}) {
    if (v < 0) return refuse(key, "must be >= 0, got " + std::to_string(v));
  }
  if (!std::isfinite(state->scaler.scale) || state->scaler.scale <= 0) {
    return refuse("loss_scaler.scale",
                  "must be a finite number > 0, got " + std::to_string(state->scaler.scale));
  }
  return Status::ok();
}

}  // namespace

Result<TrainerState> read_trainer_state(const std::string& dir_text) {
  const fs::path dir(dir_text);
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, read_state_json(dir));
  TrainerState state;
  try {
    KILN_RETURN_IF_ERROR(parse_trainer_state(j, &state).with_file((dir / "state.json").string()));
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what())
        .with_file((dir / "state.json").string());
  }
  return state;
}

// ---- CheckpointReader ----

struct CheckpointReader::Impl {
  fs::path dir;
  CheckpointLayout lay;
  nlohmann::json meta;   // format 2: meta.json
  nlohmann::json files;  // state.json's checksums
  const ParamStore* params = nullptr;
  TpShard mine;
  std::string consolidated;  // the file of whole tensors (open_consolidated), else empty
  std::string key;           // the config key that named it
  // Source TP ranks' layouts (no buffers), made when first needed.
  std::vector<std::unique_ptr<ParamStore>> sources;
  std::vector<bool> source_read;
  // Per unit: the writer's pipeline stage whose files hold it (all 0 without pipelining).
  std::vector<int64_t> unit_stage;
  std::vector<bool> stage_read;                 // per source stage: read from
  std::map<std::string, SafetensorsFile> open;  // header-only, checksum verified
  uint64_t bytes_read = 0;

  // The file `name`'s header, its checksum verified the first time (state.json lists it).
  Result<const SafetensorsFile*> file(const std::string& name);
  // The layout of source TP rank t (t < lay.tp_partitions), checked against meta.json's units.
  Result<const ParamStore*> source(int64_t t);
  // count elements of field f of tensor ti in source TP rank t's slice, from slice element
  // `first`, into out.
  Status read_source(int64_t t, int ti, ParamField f, size_t first, size_t count, float* out);
  // Slice elements [la, lb) of tensor ti of this rank's slice into out.
  Status read_slice(int ti, ParamField f, size_t la, size_t lb, float* out);
};

CheckpointReader::CheckpointReader() : impl_(std::make_unique<Impl>()) {}
CheckpointReader::~CheckpointReader() = default;

Result<const SafetensorsFile*> CheckpointReader::Impl::file(const std::string& name) {
  if (auto it = open.find(name); it != open.end()) return &it->second;
  const std::string path = consolidated.empty() ? (dir / name).string() : consolidated;
  if (consolidated.empty()) {
    auto it = files.find(name);
    if (it == files.end() || !it->is_string()) {
      return Status::data("state.json does not list " + name)
          .with_file((dir / "state.json").string());
    }
    KILN_ASSIGN_OR_RETURN(uint64_t want, parse_hex64(it->get<std::string>()));
    KILN_ASSIGN_OR_RETURN(uint64_t got, xxh3_file(path));
    if (want != got) return Status::data("checksum mismatch").with_file(path);
  }
  KILN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::read_header(path));
  return &open.emplace(name, std::move(f)).first->second;
}

Result<const ParamStore*> CheckpointReader::Impl::source(int64_t t) {
  if (sources.empty()) {
    sources.resize(static_cast<size_t>(lay.tp_partitions));
    source_read.assign(sources.size(), false);
  }
  auto& s = sources[static_cast<size_t>(t)];
  if (!s) {
    s = std::make_unique<ParamStore>(
        params->model(), Precision::kFp32, false, &host_runtime(),
        TpShard{static_cast<int>(t), static_cast<int>(lay.tp_partitions)},
        /*allocate=*/false);
    if (lay.sharded()) {  // meta.json's units (one TP rank's) must be this layout's
      const std::string meta_path = (dir / "meta.json").string();
      const auto& units = s->units();
      try {
        const auto& mu = meta.at("units");
        if (mu.size() != units.size()) {
          return Status::data("meta.json lists " + std::to_string(mu.size()) +
                              " units, the model has " + std::to_string(units.size()))
              .with_file(meta_path);
        }
        for (size_t i = 0; i < units.size(); ++i) {
          if (mu[i].at("name") != units[i].name || mu[i].at("numel") != units[i].numel ||
              mu[i].at("partition_numel") != shard_numel(units[i].numel, lay.partitions)) {
            return Status::data("meta.json unit " + json_shown(mu[i]) +
                                " does not match the model's " + units[i].name + " (" +
                                std::to_string(units[i].numel) + " elements)")
                .with_file(meta_path);
          }
          // Pipeline stages: the unit is in the files of the stage its blocks say.
          if (lay.pp > 1 && mu[i].at("stage") != unit_stage[i]) {
            return Status::data("meta.json unit " + json_shown(mu[i]) + " names stage " +
                                json_shown(mu[i].at("stage")) + ", pp_stages put " + units[i].name +
                                " on stage " + std::to_string(unit_stage[i]))
                .with_file(meta_path);
          }
        }
        // And each tensor where this layout puts it: with other tensor order or alignment inside
        // a unit (another Kiln version) the unit sizes can agree while the flat reads would land
        // on other tensors' values.
        if (auto mt = meta.find("tensors"); mt != meta.end()) {
          const auto& tensors = s->tensors();
          if (!mt->is_array() || mt->size() != tensors.size()) {
            return Status::data("meta.json lists " + json_shown(*mt) +
                                " as tensors, the model has " + std::to_string(tensors.size()))
                .with_file(meta_path);
          }
          for (size_t i = 0; i < tensors.size(); ++i) {
            const auto& e = (*mt)[i];
            const ParamTensor& pt = tensors[i];
            if (e.at("name") != pt.name || e.at("unit") != units[pt.unit].name ||
                e.at("offset") != pt.offset || e.at("numel") != pt.numel ||
                e.at("global_shape") != nlohmann::json(pt.global_shape)) {
              return Status::data("meta.json tensor " + std::to_string(i) + " (" +
                                  json_shown(e.at("name")) + ") is not where this model's " +
                                  pt.name + " is (unit " + units[pt.unit].name + ", offset " +
                                  std::to_string(pt.offset) + ", " + std::to_string(pt.numel) +
                                  " elements)")
                  .with_file(meta_path);
            }
          }
        }
      } catch (const nlohmann::json::exception& e) {
        return Status::data(std::string("malformed meta.json: ") + e.what()).with_file(meta_path);
      }
    }
  }
  return s.get();
}

Status CheckpointReader::Impl::read_source(int64_t t, int ti, ParamField f, size_t first,
                                           size_t count, float* out) {
  KILN_ASSIGN_OR_RETURN(const ParamStore* src, source(t));
  const ParamTensor& pt = src->tensors()[static_cast<size_t>(ti)];
  bytes_read += count * sizeof(float);
  source_read[static_cast<size_t>(t)] = true;
  if (!lay.sharded()) {  // whole tensors: model.safetensors and optimizer.safetensors
    const bool weights = f == ParamField::kMaster;
    KILN_ASSIGN_OR_RETURN(const SafetensorsFile* file,
                          file(weights ? "model.safetensors" : "optimizer.safetensors"));
    const std::string name = weights                    ? pt.name
                             : f == ParamField::kExpAvg ? pt.name + ".exp_avg"
                                                        : pt.name + ".exp_avg_sq";
    return file->read_range(name, "F32", pt.shape, first, count, out);
  }
  // Data-parallel partitions: the unit's flat elements [p*S, p*S + S) in file p.
  const char* suffix = f == ParamField::kMaster   ? ".master"
                       : f == ParamField::kExpAvg ? ".exp_avg"
                                                  : ".exp_avg_sq";
  const ParamUnit& u = src->units()[static_cast<size_t>(pt.unit)];
  const size_t S = shard_numel(u.numel, lay.partitions);
  const std::vector<int64_t> shape{static_cast<int64_t>(S)};
  // Pipeline stages: the files of the stage that wrote the unit.
  const int64_t stage = unit_stage[static_cast<size_t>(pt.unit)];
  stage_read[static_cast<size_t>(stage)] = true;
  size_t x = pt.offset + first;
  while (count > 0) {
    const size_t p = x / S, off = x % S, k = std::min(count, S - off);
    KILN_ASSIGN_OR_RETURN(const SafetensorsFile* file,
                          file(partition_file_name(static_cast<int64_t>(p), lay.partitions, t,
                                                   lay.tp_partitions, stage, lay.pp)));
    KILN_RETURN_IF_ERROR(file->read_range(u.name + suffix, "F32", shape, off, k, out));
    x += k;
    out += k;
    count -= k;
  }
  return Status::ok();
}

Status CheckpointReader::Impl::read_slice(int ti, ParamField f, size_t la, size_t lb, float* out) {
  const ParamTensor& pt = params->tensors()[static_cast<size_t>(ti)];
  struct Run {
    size_t whole, local, n;
  };
  // This rank's wanted elements as runs of the whole tensor (ascending).
  std::vector<Run> want;
  for_each_slice_run(pt, mine, [&](size_t w, size_t l, size_t n) {
    const size_t lo = std::max(l, la), hi = std::min(l + n, lb);
    if (lo < hi) want.push_back({w + (lo - l), lo - la, hi - lo});
  });
  if (!consolidated.empty()) {  // whole tensors in one file: the master weights only
    KILN_ASSIGN_OR_RETURN(const SafetensorsFile* file, file(consolidated));
    for (const Run& r : want) {
      Status st = file->read_range(pt.name, "F32", pt.global_shape, r.whole, r.n, out + r.local);
      if (!st.is_ok()) return std::move(st).with_key(key);
      bytes_read += r.n * sizeof(float);
    }
    return Status::ok();
  }
  if (lay.tp_partitions == mine.size) {  // the same split: the same slice elements
    return read_source(mine.rank, ti, f, la, lb - la, out);
  }
  const int64_t T = lay.tp_partitions;
  KILN_ASSIGN_OR_RETURN(const ParamStore* src0, source(0));
  if (src0->tensors()[static_cast<size_t>(ti)].split_dim < 0) {
    // Whole in the checkpoint: replicated (the same on every TP rank, checked when written), or
    // every tensor when it was written without TP. From the first source TP rank whose slices
    // overlap this rank's (one it reads anyway).
    const int64_t first = static_cast<int64_t>(mine.rank) * T / mine.size;
    for (const Run& r : want) {
      KILN_RETURN_IF_ERROR(read_source(first, ti, f, r.whole, r.n, out + r.local));
    }
    return Status::ok();
  }
  // Another TP size: the elements each source TP rank's slice shares with the wanted runs.
  for (int64_t t = 0; t < T; ++t) {
    const TpShard from{static_cast<int>(t), static_cast<int>(T)};
    std::vector<Run> have;
    KILN_ASSIGN_OR_RETURN(const ParamStore* src, source(t));
    for_each_slice_run(src->tensors()[static_cast<size_t>(ti)], from,
                       [&](size_t w, size_t l, size_t n) {
                         have.push_back({w, l, n});
                       });
    size_t i = 0, j = 0;
    while (i < have.size() && j < want.size()) {
      const size_t lo = std::max(have[i].whole, want[j].whole);
      const size_t hi = std::min(have[i].whole + have[i].n, want[j].whole + want[j].n);
      if (lo < hi) {
        KILN_RETURN_IF_ERROR(read_source(t, ti, f, have[i].local + (lo - have[i].whole), hi - lo,
                                         out + want[j].local + (lo - want[j].whole)));
      }
      if (have[i].whole + have[i].n <= want[j].whole + want[j].n) {
        ++i;
      } else {
        ++j;
      }
    }
  }
  return Status::ok();
}

Status CheckpointReader::read(int unit, ParamField f, size_t begin, size_t n, float* dst) {
  std::fill(dst, dst + n, 0.0f);  // padding
  const size_t end = begin + n;
  const ParamStore& params = *impl_->params;
  for (int ti : params.units()[static_cast<size_t>(unit)].tensors) {
    const ParamTensor& pt = params.tensors()[static_cast<size_t>(ti)];
    const size_t a = std::max(begin, pt.offset), b = std::min(end, pt.offset + pt.numel);
    if (a >= b) continue;
    KILN_RETURN_IF_ERROR(impl_->read_slice(ti, f, a - pt.offset, b - pt.offset, dst + (a - begin)));
  }
  return Status::ok();
}

bool CheckpointReader::zero_moments() const { return !impl_->consolidated.empty(); }

int64_t CheckpointReader::tp_sources_read() const {
  int64_t n = 0;
  for (bool b : impl_->source_read) n += b;
  return n;
}

int64_t CheckpointReader::pp_sources_read() const {
  if (impl_->lay.pp <= 1) return impl_->bytes_read > 0 ? 1 : 0;
  int64_t n = 0;
  for (bool b : impl_->stage_read) n += b;
  return n;
}

uint64_t CheckpointReader::bytes_read() const { return impl_->bytes_read; }

void CheckpointReader::log_reshard() const {
  const Impl& im = *impl_;
  if (!im.consolidated.empty()) return;
  if (im.lay.tp_partitions != im.mine.size) {
    KILN_LOG_INFO(
        "checkpoint {}: written with tensor-parallel size {}, resharded to {} (read this "
        "rank's slices from the files of the {} TP rank(s) that hold them, in byte "
        "ranges)",
        im.dir.filename().string(), im.lay.tp_partitions, im.mine.size, tp_sources_read());
  }
  const PpStage mine = im.params->pp_stage();
  const int64_t L = im.params->model().n_layers;
  const int64_t end = mine.end_block < 0 ? L : mine.end_block;
  const bool same_split =
      im.lay.pp == mine.size &&
      (mine.size == 1 || (im.lay.pp_bounds[static_cast<size_t>(mine.rank)] == mine.first_block &&
                          im.lay.pp_bounds[static_cast<size_t>(mine.rank) + 1] == end));
  if (!same_split) {
    KILN_LOG_INFO(
        "checkpoint {}: written by {} pipeline stage(s), read into stage {} of {} (blocks "
        "[{}, {})) from the files of the {} stage(s) that hold its units",
        im.dir.filename().string(), im.lay.pp, mine.rank, mine.size, mine.first_block, end,
        pp_sources_read());
  }
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& dir_text,
                                                                 const ParamStore& params,
                                                                 TrainerState* state,
                                                                 CheckpointLayout* layout) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  Impl& im = *reader->impl_;
  im.dir = fs::path(dir_text);
  im.params = &params;
  im.mine = params.tp_shard();
  const fs::path& dir = im.dir;
  const std::string state_path = (dir / "state.json").string();
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, read_state_json(dir));
  CheckpointLayout& lay = im.lay;
  try {
    if (j.at("model") != model_json(params.model())) {
      return Status::config("checkpoint model shape " + j.at("model").dump() +
                            " differs from the config's " + model_json(params.model()).dump())
          .with_file(state_path);
    }
    KILN_RETURN_IF_ERROR(parse_trainer_state(j, state).with_file(state_path));
    if (j.at("format") == kFormat || j.at("format") == kFormatPp) {
      const std::string meta_path = (dir / "meta.json").string();
      KILN_ASSIGN_OR_RETURN(std::string mtext, read_file(meta_path));
      try {
        im.meta = parse_untrusted_json_or_throw(mtext);
        lay.world = json_integer_at<int64_t>(im.meta, "world");
        lay.dp = json_integer_at<int64_t>(im.meta, "dp");
        lay.tp = json_integer_at<int64_t>(im.meta, "tp");
        lay.zero_stage = json_integer_at<int64_t>(im.meta, "zero_stage");
        lay.partitions = json_integer_at<int64_t>(im.meta, "partitions");
        lay.tp_partitions =
            json_integer_or(im.meta, "tp_partitions", int64_t{1});  // absent before TP shards
        lay.pp = json_integer_or(im.meta, "pp", int64_t{1});        // absent before pipelining
        if (lay.pp > 1) {
          // Every stage's blocks: contiguous runs of at least one block, 0 ... n_layers.
          const int64_t L = params.model().n_layers;
          if (lay.pp > L) {
            return Status::data("meta.json: pp " + std::to_string(lay.pp) + " stages for " +
                                std::to_string(L) + " blocks")
                .with_file(meta_path);
          }
          const auto& st = im.meta.at("pp_stages");
          if (!st.is_array() || static_cast<int64_t>(st.size()) != lay.pp) {
            return Status::data("meta.json: pp_stages must list pp (" + std::to_string(lay.pp) +
                                ") stages")
                .with_file(meta_path);
          }
          lay.pp_bounds = {0};
          for (const auto& e : st) {
            const std::vector<int64_t> b = json_integers<int64_t>(e.at("blocks"), "blocks");
            const int64_t first = b.size() == 2 ? b[0] : -1, end = b.size() == 2 ? b[1] : -1;
            if (first != lay.pp_bounds.back() || end <= first || end > L) {
              return Status::data("meta.json: pp_stages entry " + json_shown(e) +
                                  ": blocks must be [first, end) following the stage before (" +
                                  std::to_string(lay.pp_bounds.back()) + "), within " +
                                  std::to_string(L) + " blocks")
                  .with_file(meta_path);
            }
            lay.pp_bounds.push_back(end);
          }
          if (lay.pp_bounds.back() != L) {
            return Status::data("meta.json: pp_stages cover blocks [0, " +
                                std::to_string(lay.pp_bounds.back()) + "), the model has " +
                                std::to_string(L))
                .with_file(meta_path);
          }
        }
      } catch (const nlohmann::json::exception& e) {
        return Status::data(std::string("malformed meta.json: ") + e.what()).with_file(meta_path);
      }
      if (lay.partitions < 1) return Status::data("meta.json: partitions < 1").with_file(meta_path);
      if (lay.pp < 1) return Status::data("meta.json: pp < 1").with_file(meta_path);
    }
    if (lay.tp_partitions < 1) {
      return Status::data("meta.json: tp_partitions < 1").with_file((dir / "meta.json").string());
    }
    // Before any layout of that many TP ranks is made: the model must split over it.
    if (lay.tp_partitions > 1 && !splits_over_tp(params.model(), lay.tp_partitions)) {
      return Status::data("meta.json: tp_partitions " + std::to_string(lay.tp_partitions) +
                          " does not split the model (model.n_heads " +
                          std::to_string(params.model().n_heads) + " and model.vocab_size " +
                          std::to_string(params.model().vocab_size) + " must be multiples of it)")
          .with_file((dir / "meta.json").string());
    }
    im.files = j.at("files");
  } catch (const nlohmann::json::exception& e) {
    return Status::data(std::string("malformed state.json: ") + e.what()).with_file(state_path);
  }
  for (size_t i = 0; i < params.units().size(); ++i) {
    im.unit_stage.push_back(
        checkpoint_unit_stage(lay, params.model().n_layers, static_cast<int>(i)));
  }
  im.stage_read.assign(static_cast<size_t>(lay.pp), false);
  if (layout) *layout = lay;
  return reader;
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open_consolidated(
    const std::string& path, const ParamStore& params, const std::string& key) {
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  Impl& im = *reader->impl_;
  im.params = &params;
  im.mine = params.tp_shard();
  im.consolidated = path;
  im.key = key;
  KILN_ASSIGN_OR_RETURN(const SafetensorsFile* f, im.file(path));
  if (auto m = f->metadata().find("model"); m != f->metadata().end()) {
    nlohmann::json shape = parse_untrusted_json_or_discarded(m->second);
    if (shape != model_json(params.model())) {
      return Status::config("the weights are of model " + m->second + ", the config's is " +
                            model_json(params.model()).dump())
          .with_key(key)
          .with_file(path);
    }
  }
  // Every tensor present with its whole shape (checked before anything is read).
  for (const ParamTensor& t : params.tensors()) {
    Status st = f->read_range(t.name, "F32", t.global_shape, 0, 0, nullptr);
    if (!st.is_ok()) return std::move(st).with_key(key);
  }
  return reader;
}

Status load_checkpoint(const std::string& dir_text, ParamStore* params, TrainerState* state,
                       CheckpointLayout* layout, LoadStats* stats) {
  CheckpointLayout lay;
  KILN_ASSIGN_OR_RETURN(auto reader, CheckpointReader::open(dir_text, *params, state, &lay));
  if (layout) *layout = lay;
  KILN_RETURN_IF_ERROR(params->fill(*reader));
  if (stats) {
    stats->reshard_sources = reader->tp_sources_read();
    stats->pp_sources = reader->pp_sources_read();
  }
  reader->log_reshard();
  return Status::ok();
}

std::string model_shape_json(const ModelConfig& m) { return model_json(m).dump(); }

}  // namespace kiln::engine
