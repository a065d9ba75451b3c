#include "engine/train_config.h"

#include <cmath>

#include "engine/backend.h"

namespace kiln::engine {

const char* const kTrainConfigDefaults = R"(
model:
  vocab_size: 8192
  d_model: 256
  n_layers: 4
  n_heads: 4
  seq_len: 256
  init: gpt2            # gpt2 | deepnet
  init_std: 0.02
parallel:
  tp: 1
  zero_stage: 0
  prefetch: 1
  hierarchical: false   # data-parallel all-reduce inside each machine first, then across
precision: fp32         # fp32 | bf16 | fp16
loss_scale:
  initial: 65536.0
  growth_factor: 2.0
  backoff_factor: 0.5
  growth_interval: 2000
  hysteresis: 2
  min_scale: 1.0
optimizer:
  lr: 6.0e-4
  betas: [0.9, 0.95]
  eps: 1.0e-8
  weight_decay: 0.1
  clip_grad: 1.0
  decay_norms_and_biases: false
schedule:
  type: cosine          # constant | cosine | wsd
  warmup_steps: 0
  total_steps: 0        # 0: run.steps
  min_lr_ratio: 0.1
  decay_fraction: 0.2
  decay_shape: 1-sqrt   # wsd: linear | cosine | 1-sqrt
activation_checkpointing: none   # none | selective | full
data:
  manifest: ""          # empty: synthetic data
  micro_batch: 8
  grad_accum: 1
  mixture: {}
  prefetch_depth: 4
  workers: 1
checkpoint:
  every_steps: 0
  keep_last: 3
  at_end: true
stability:
  skip_nonfinite: true
  inject_overflow_at: []
run:
  dir: runs/default
  steps: 100
  seed: 1234
  log_every: 1
  threads: 0
device: cpu
)";

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

std::vector<std::string> train_config_open_paths() { return {"data.mixture"}; }

Result<Config> load_train_config(const std::string& file, const std::vector<std::string>& sets) {
  return Config::load(kTrainConfigDefaults, file, sets, train_config_open_paths());
}

namespace {

Status bad(const std::string& key, const std::string& msg) {
  return Status::config(msg).with_key(key);
}

// Reads an integer key and checks lo <= v <= hi.
Status read_int(const Config& cfg, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
  KILN_ASSIGN_OR_RETURN(int64_t v, cfg.get<int64_t>(key));
  if (v < lo || v > hi) {
    return bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(v));
  }
  *out = v;
  return Status::ok();
}

template <typename F>
Status read_real(const Config& cfg, const std::string& key, double lo, double hi, F* out,
                 bool lo_open = false) {
  KILN_ASSIGN_OR_RETURN(double v, cfg.get<double>(key));
  if (!std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
    return bad(key, std::string("must be a finite number in ") + (lo_open ? "(" : "[") +
                        std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(v));
  }
  *out = static_cast<F>(v);
  return Status::ok();
}

template <typename E>
Status read_enum(const Config& cfg, const std::string& key,
                 const std::vector<std::pair<std::string, E>>& choices, E* out) {
  KILN_ASSIGN_OR_RETURN(std::string v, cfg.get<std::string>(key));
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) {
    if (v == name) {
      *out = value;
      return Status::ok();
    }
    names.push_back(name);
  }
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : " | ") + n;
  std::string hint = closest_match(v, names);
  return bad(key, "'" + v + "' is not one of " + all +
                      (hint.empty() ? std::string() : " (did you mean '" + hint + "'?)"));
}

}  // namespace

Result<TrainConfig> parse_train_config(const Config& cfg) {
  TrainConfig c;
  constexpr int64_t kBig = int64_t{1} << 40;
  // model
  ModelConfig& m = c.model;
  KILN_RETURN_IF_ERROR(read_int(cfg, "model.vocab_size", 2, int64_t{1} << 31, &m.vocab_size));
  KILN_RETURN_IF_ERROR(read_int(cfg, "model.d_model", 1, 1 << 20, &m.d_model));
  KILN_RETURN_IF_ERROR(read_int(cfg, "model.n_layers", 1, 1 << 16, &m.n_layers));
  KILN_RETURN_IF_ERROR(read_int(cfg, "model.n_heads", 1, 1 << 16, &m.n_heads));
  KILN_RETURN_IF_ERROR(read_int(cfg, "model.seq_len", 1, 1 << 24, &m.seq_len));
  if (m.d_model % m.n_heads != 0) {
    return bad("model.n_heads", "must divide model.d_model (" + std::to_string(m.d_model) + ")");
  }
  KILN_RETURN_IF_ERROR(read_enum<InitScheme>(
      cfg, "model.init", {{"gpt2", InitScheme::kGpt2}, {"deepnet", InitScheme::kDeepNet}}, &m.init));
  KILN_RETURN_IF_ERROR(read_real(cfg, "model.init_std", 0.0, 10.0, &m.init_std, true));
  // parallel
  KILN_RETURN_IF_ERROR(read_int(cfg, "parallel.tp", 1, 1 << 16, &c.parallel.tp));
  KILN_RETURN_IF_ERROR(read_int(cfg, "parallel.zero_stage", 0, 3, &c.parallel.zero_stage));
  KILN_RETURN_IF_ERROR(read_int(cfg, "parallel.prefetch", 0, 64, &c.parallel.prefetch));
  KILN_ASSIGN_OR_RETURN(c.parallel.hierarchical, cfg.get<bool>("parallel.hierarchical"));
  // precision + loss scale
  KILN_RETURN_IF_ERROR(read_enum<Precision>(
      cfg, "precision",
      {{"fp32", Precision::kFp32}, {"bf16", Precision::kBf16}, {"fp16", Precision::kFp16}},
      &c.precision));
  LossScaleConfig& ls = c.loss_scale;
  KILN_RETURN_IF_ERROR(read_real(cfg, "loss_scale.initial", 0.0, 1e30, &ls.initial, true));
  KILN_RETURN_IF_ERROR(read_real(cfg, "loss_scale.growth_factor", 1.0, 1e6, &ls.growth_factor));
  KILN_RETURN_IF_ERROR(
      read_real(cfg, "loss_scale.backoff_factor", 0.0, 1.0, &ls.backoff_factor, true));
  KILN_RETURN_IF_ERROR(read_int(cfg, "loss_scale.growth_interval", 1, kBig, &ls.growth_interval));
  KILN_RETURN_IF_ERROR(read_int(cfg, "loss_scale.hysteresis", 1, 1 << 20, &ls.hysteresis));
  KILN_RETURN_IF_ERROR(read_real(cfg, "loss_scale.min_scale", 0.0, 1e30, &ls.min_scale, true));
  if (ls.min_scale > ls.initial) {
    return bad("loss_scale.min_scale", "must not exceed loss_scale.initial");
  }
  // optimizer
  OptimizerConfig& o = c.optimizer;
  KILN_RETURN_IF_ERROR(read_real(cfg, "optimizer.lr", 0.0, 10.0, &o.lr));
  {
    YAML::Node betas = cfg.node("optimizer.betas");
    if (!betas.IsSequence() || betas.size() != 2) {
      return bad("optimizer.betas", "expected a list of two numbers, e.g. [0.9, 0.95]");
    }
    double b[2];
    for (int i = 0; i < 2; ++i) {
      try {
        b[i] = betas[i].as<double>();
      } catch (const YAML::Exception&) {
        return bad("optimizer.betas", "expected numbers");
      }
      if (!(b[i] >= 0.0 && b[i] < 1.0)) return bad("optimizer.betas", "each beta must be in [0, 1)");
    }
    o.beta1 = static_cast<float>(b[0]);
    o.beta2 = static_cast<float>(b[1]);
  }
  KILN_RETURN_IF_ERROR(read_real(cfg, "optimizer.eps", 0.0, 1.0, &o.eps, true));
  KILN_RETURN_IF_ERROR(read_real(cfg, "optimizer.weight_decay", 0.0, 10.0, &o.weight_decay));
  KILN_RETURN_IF_ERROR(read_real(cfg, "optimizer.clip_grad", 0.0, 1e12, &o.clip_grad));
  KILN_ASSIGN_OR_RETURN(o.decay_norms_and_biases, cfg.get<bool>("optimizer.decay_norms_and_biases"));
  // schedule
  ScheduleConfig& s = c.schedule;
  KILN_RETURN_IF_ERROR(read_enum<ScheduleKind>(
      cfg, "schedule.type",
      {{"constant", ScheduleKind::kConstant}, {"cosine", ScheduleKind::kCosine},
       {"wsd", ScheduleKind::kWsd}},
      &s.kind));
  KILN_RETURN_IF_ERROR(read_int(cfg, "schedule.warmup_steps", 0, kBig, &s.warmup_steps));
  KILN_RETURN_IF_ERROR(read_int(cfg, "schedule.total_steps", 0, kBig, &s.total_steps));
  KILN_RETURN_IF_ERROR(read_real(cfg, "schedule.min_lr_ratio", 0.0, 1.0, &s.min_lr_ratio));
  KILN_RETURN_IF_ERROR(read_real(cfg, "schedule.decay_fraction", 0.0, 1.0, &s.decay_fraction));
  KILN_RETURN_IF_ERROR(read_enum<DecayShape>(
      cfg, "schedule.decay_shape",
      {{"linear", DecayShape::kLinear}, {"cosine", DecayShape::kCosine},
       {"1-sqrt", DecayShape::kOneMinusSqrt}},
      &s.decay_shape));
  KILN_RETURN_IF_ERROR(read_enum<Recompute>(
      cfg, "activation_checkpointing",
      {{"none", Recompute::kNone}, {"selective", Recompute::kSelective},
       {"full", Recompute::kFull}},
      &c.activation_checkpointing));
  // data
  DataConfig& d = c.data;
  KILN_ASSIGN_OR_RETURN(d.manifest, cfg.get<std::string>("data.manifest"));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.micro_batch", 1, 1 << 20, &d.micro_batch));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.grad_accum", 1, 1 << 20, &d.grad_accum));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.prefetch_depth", 1, 1 << 12, &d.prefetch_depth));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.workers", 1, 256, &d.workers));
  {
    YAML::Node mix = cfg.node("data.mixture");
    if (mix.IsDefined() && !mix.IsNull()) {
      if (!mix.IsMap()) return bad("data.mixture", "expected a mapping domain: weight");
      for (const auto& kv : mix) {
        const std::string name = kv.first.as<std::string>();
        try {
          d.mixture.set(name, kv.second.as<double>());
        } catch (const YAML::Exception&) {
          return bad("data.mixture." + name, "expected a number");
        }
      }
      WeightRules rules;
      rules.key = "data.mixture";
      if (!d.mixture.empty()) KILN_RETURN_IF_ERROR(d.mixture.check(rules));
    }
  }
  // checkpoint
  KILN_RETURN_IF_ERROR(read_int(cfg, "checkpoint.every_steps", 0, kBig, &c.checkpoint.every_steps));
  KILN_RETURN_IF_ERROR(read_int(cfg, "checkpoint.keep_last", 0, kBig, &c.checkpoint.keep_last));
  KILN_ASSIGN_OR_RETURN(c.checkpoint.at_end, cfg.get<bool>("checkpoint.at_end"));
  // stability
  KILN_ASSIGN_OR_RETURN(c.stability.skip_nonfinite, cfg.get<bool>("stability.skip_nonfinite"));
  {
    YAML::Node inj = cfg.node("stability.inject_overflow_at");
    if (inj.IsDefined() && !inj.IsNull()) {
      if (!inj.IsSequence()) return bad("stability.inject_overflow_at", "expected a list of steps");
      for (const auto& n : inj) {
        try {
          int64_t step = n.as<int64_t>();
          if (step < 1) return bad("stability.inject_overflow_at", "steps start at 1");
          c.stability.inject_overflow_at.push_back(step);
        } catch (const YAML::Exception&) {
          return bad("stability.inject_overflow_at", "expected integers");
        }
      }
    }
  }
  // run
  KILN_ASSIGN_OR_RETURN(c.run.dir, cfg.get<std::string>("run.dir"));
  if (c.run.dir.empty()) return bad("run.dir", "must not be empty");
  KILN_RETURN_IF_ERROR(read_int(cfg, "run.steps", 0, kBig, &c.run.steps));
  {
    int64_t seed;
    KILN_RETURN_IF_ERROR(read_int(cfg, "run.seed", 0, INT64_MAX, &seed));
    c.run.seed = static_cast<uint64_t>(seed);
  }
  KILN_RETURN_IF_ERROR(read_int(cfg, "run.log_every", 1, kBig, &c.run.log_every));
  KILN_RETURN_IF_ERROR(read_int(cfg, "run.threads", 0, 4096, &c.run.threads));
  {
    KILN_ASSIGN_OR_RETURN(std::string device, cfg.get<std::string>("device"));
    auto d = parse_device(device, "device");
    if (!d.is_ok()) return bad("device", "'" + device + "' is not one of cpu | cuda");
    c.device = *d;
  }
  if (c.schedule.total_steps == 0) c.schedule.total_steps = c.run.steps;
  return c;
}

}  // namespace kiln::engine
