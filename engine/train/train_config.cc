#include "engine/train/train_config.h"

#include <fmt/format.h>

#include <cmath>

#include "common/text.h"
#include "engine/device/runtime.h"

namespace kiln::engine {

const char* const kTrainConfigDefaults = R"(
model:
  arch: gpt2            # gpt2 | llama
  vocab_size: 8192
  d_model: 256
  n_layers: 4
  n_heads: 4
  seq_len: 256
  n_kv_heads: 0         # key/value heads, grouped-query attention (0: n_heads)
  ffn_hidden: 0         # MLP hidden units (0: 4 d_model for gpt2; 8/3 d_model rounded up to 256 for llama)
  rope_theta: 10000.0   # llama: rotary base
  norm_eps: 1.0e-5      # llama: RMSNorm eps (gpt2's LayerNorm uses 1e-5)
  tie_embeddings: auto  # auto (gpt2 true, llama false) | true | false
  bias: auto            # auto (gpt2 true, llama false) | true | false
  doc_mask: auto        # auto (gpt2 false, llama true) | true | false: attention and positions restart at document starts
  init: gpt2            # gpt2 | deepnet
  init_std: 0.02
  init_from: ""         # start from these weights (a `kiln checkpoint consolidate` file or a Hugging Face GPT-2 directory)
parallel:
  tp: 1
  zero_stage: 0
  prefetch: 1
  hierarchical: false   # data-parallel all-reduce inside each machine first, then across
  pp: 1                 # pipeline stages (rank order: tp innermost, then pp, then dp)
  pp_schedule: 1f1b     # 1f1b | gpipe
  pp_layers: []         # blocks per stage, e.g. [5, 6, 6, 5]; empty: balanced by cost
  collective_timeout_s: 600   # a collective waiting longer stops every rank, naming who is missing (0: off)
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
  prefetch_next_step: true   # draw and upload the next step's batches while a step computes
  partitions: 0         # canonical loader partitions; 0: the global batch (docs/LOADER.md)
  repartition: false    # resume on a layout the partitions do not allow, in another data order
memory:
  check: true           # refuse a run whose estimated peak per rank exceeds what the rank has
  margin: 0.1           # the share of the budget held back for what the estimate leaves out
  budget: ""            # bytes per rank to check against ("20GiB"); empty: what the machine has
checkpoint:
  every_steps: 0
  keep_last: 3
  at_end: true
stability:
  skip_nonfinite: true
  spike:
    window: 200         # clean steps the z-scores are measured against
    z_loss: 5.0
    z_grad: 5.0
    warmup_steps: 100   # no spike detection before this step
    action: warn        # warn | skip | rollback
    max_rollbacks: 3    # then spikes are skipped
  max_nonfinite_in_row: 10   # stop with a diagnosis after this many inf/NaN steps in a row (0: never)
  bad_batch_token_fraction: 0.9   # skip a batch one token id dominates beyond this (0: off)
  layer_stats_every: 0       # grad_norm_layers + update_ratio every N steps (0: off)
  layer_clip:
    max_norm: 0.0       # clip a layer whose gradient norm exceeds this (0: off)
    factor: 0.0         # ... or exceeds factor x its moving average (0: off)
  inject_overflow_at: []
  inject_lr_burst_at: []
  lr_burst_factor: 100.0
  inject_bad_batch_at: []
mixing:
  policy: static        # static | schedule | doremi | odm
  update_every: 10      # steps between weight updates
  min_weight: 0.01      # floor of every domain's weight
  schedule: []          # [{step: 0, weights: {web: 0.7, code: 0.3}}, {step: 1000, weights: {...}}]
  interpolate: false    # schedule: linear between points instead of stepped
  doremi:
    eta: 1.0
    smoothing: 1.0e-3
    reference: ""       # a finished reference run's directory or a JSON file {domain: loss}
  odm:
    reward_smoothing: 0.9
    exploration: 0.0    # 0: min(1/k, sqrt(ln k / (k t)))
eval:
  every_steps: 100      # per-domain validation loss every N steps (0: off)
  sequences_per_domain: 16
  tasks: []             # multiple-choice task files (JSONL {context, choices, label}) scored then too
run:
  dir: runs/default
  steps: 100
  seed: 1234
  log_every: 1
  threads: 0
device: cpu
)";

const char* arch_name(Arch a) { return a == Arch::kLlama ? "llama" : "gpt2"; }

int64_t llama_ffn_hidden(int64_t d_model) {
  const int64_t h = 2 * (4 * d_model) / 3;
  return (h + 255) / 256 * 256;
}

int64_t ModelConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  return llama() ? llama_ffn_hidden(d_model) : 4 * d_model;
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

const char* pp_schedule_name(PpSchedule s) { return s == PpSchedule::kGPipe ? "gpipe" : "1f1b"; }

const char* spike_action_name(SpikeAction a) {
  switch (a) {
    case SpikeAction::kWarn:
      return "warn";
    case SpikeAction::kSkip:
      return "skip";
    case SpikeAction::kRollback:
      return "rollback";
  }
  return "?";
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
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

// OK when lo <= v <= hi, else an error naming key.
Status check_range(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(v));
  }
  return Status::ok();
}

// Reads an integer key and checks lo <= v <= hi.
Status read_int(const Config& cfg, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
  KILN_ASSIGN_OR_RETURN(int64_t v, cfg.get<int64_t>(key));
  KILN_RETURN_IF_ERROR(check_range(key, v, lo, hi));
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

// A list of 1-based step numbers (testing hooks).
Status read_steps(const Config& cfg, const std::string& key, std::vector<int64_t>* out) {
  YAML::Node inj = cfg.node(key);
  if (!inj.IsDefined() || inj.IsNull()) return Status::ok();
  if (!inj.IsSequence()) return bad(key, "expected a list of steps");
  for (const auto& n : inj) {
    try {
      int64_t step = n.as<int64_t>();
      if (step < 1) return bad(key, "steps start at 1");
      out->push_back(step);
    } catch (const YAML::Exception&) {
      return bad(key, "expected integers");
    }
  }
  return Status::ok();
}

}  // namespace

Status check_model_shape(const ModelConfig& m) {
  KILN_RETURN_IF_ERROR(check_range("model.vocab_size", m.vocab_size, 2, int64_t{1} << 31));
  KILN_RETURN_IF_ERROR(check_range("model.d_model", m.d_model, 1, 1 << 20));
  KILN_RETURN_IF_ERROR(check_range("model.n_layers", m.n_layers, 1, 1 << 16));
  KILN_RETURN_IF_ERROR(check_range("model.n_heads", m.n_heads, 1, 1 << 16));
  KILN_RETURN_IF_ERROR(check_range("model.seq_len", m.seq_len, 1, 1 << 24));
  if (m.d_model % m.n_heads != 0) {
    return bad("model.n_heads", "must divide model.d_model (" + std::to_string(m.d_model) + ")");
  }
  KILN_RETURN_IF_ERROR(check_range("model.n_kv_heads", m.n_kv_heads, 0, m.n_heads));
  if (m.n_heads % m.kv_heads() != 0) {
    return bad("model.n_kv_heads",
               "must divide model.n_heads (" + std::to_string(m.n_heads) + "), got " +
                   std::to_string(m.n_kv_heads) +
                   ": each key/value head serves n_heads / n_kv_heads query heads");
  }
  KILN_RETURN_IF_ERROR(check_range("model.ffn_hidden", m.ffn_hidden, 0, int64_t{1} << 24));
  if (m.llama() && m.head_dim() % 2 != 0) {
    return bad("model.n_heads",
               "gives an odd head dimension d_model / n_heads = " + std::to_string(m.head_dim()) +
                   ": rotary embeddings rotate pairs of channels, so "
                   "model.d_model / model.n_heads must be even");
  }
  if (!(m.rope_theta > 1.0) || !std::isfinite(m.rope_theta)) {
    return bad("model.rope_theta", "must be a finite number above 1");
  }
  if (!(m.norm_eps > 0.0f) || !std::isfinite(m.norm_eps)) {
    return bad("model.norm_eps", "must be a positive finite number");
  }
  return Status::ok();
}

namespace {
// A boolean key that may be `auto` (the architecture's default).
Status read_auto_bool(const Config& cfg, const std::string& key, bool auto_value, bool* out) {
  KILN_ASSIGN_OR_RETURN(std::string v, cfg.get<std::string>(key));
  if (v == "auto") {
    *out = auto_value;
  } else if (v == "true") {
    *out = true;
  } else if (v == "false") {
    *out = false;
  } else {
    return bad(key, "'" + v + "' is not one of auto | true | false");
  }
  return Status::ok();
}
}  // namespace

Result<TrainConfig> parse_train_config(const Config& cfg) {
  TrainConfig c;
  constexpr int64_t kBig = int64_t{1} << 40;
  // model
  ModelConfig& m = c.model;
  KILN_ASSIGN_OR_RETURN(m.vocab_size, cfg.get<int64_t>("model.vocab_size"));
  KILN_ASSIGN_OR_RETURN(m.d_model, cfg.get<int64_t>("model.d_model"));
  KILN_ASSIGN_OR_RETURN(m.n_layers, cfg.get<int64_t>("model.n_layers"));
  KILN_ASSIGN_OR_RETURN(m.n_heads, cfg.get<int64_t>("model.n_heads"));
  KILN_ASSIGN_OR_RETURN(m.seq_len, cfg.get<int64_t>("model.seq_len"));
  KILN_RETURN_IF_ERROR(read_enum<Arch>(cfg, "model.arch",
                                       {{"gpt2", Arch::kGpt2}, {"llama", Arch::kLlama}}, &m.arch));
  KILN_ASSIGN_OR_RETURN(m.n_kv_heads, cfg.get<int64_t>("model.n_kv_heads"));
  KILN_ASSIGN_OR_RETURN(m.ffn_hidden, cfg.get<int64_t>("model.ffn_hidden"));
  KILN_RETURN_IF_ERROR(read_real(cfg, "model.rope_theta", 1.0, 1e12, &m.rope_theta, true));
  KILN_RETURN_IF_ERROR(read_real(cfg, "model.norm_eps", 0.0, 1.0, &m.norm_eps, true));
  KILN_RETURN_IF_ERROR(read_auto_bool(cfg, "model.tie_embeddings", !m.llama(), &m.tie_embeddings));
  KILN_RETURN_IF_ERROR(read_auto_bool(cfg, "model.bias", !m.llama(), &m.bias));
  KILN_RETURN_IF_ERROR(read_auto_bool(cfg, "model.doc_mask", m.llama(), &m.doc_mask));
  if (!m.llama() && m.norm_eps != 1e-5f) {
    return bad("model.norm_eps", "applies to model.arch: llama (GPT-2's LayerNorm uses 1e-5)");
  }
  KILN_RETURN_IF_ERROR(check_model_shape(m));
  KILN_RETURN_IF_ERROR(read_enum<InitScheme>(
      cfg, "model.init", {{"gpt2", InitScheme::kGpt2}, {"deepnet", InitScheme::kDeepNet}},
      &m.init));
  KILN_RETURN_IF_ERROR(read_real(cfg, "model.init_std", 0.0, 10.0, &m.init_std, true));
  KILN_ASSIGN_OR_RETURN(m.init_from, cfg.get<std::string>("model.init_from"));
  // parallel
  KILN_RETURN_IF_ERROR(read_int(cfg, "parallel.tp", 1, 1 << 16, &c.parallel.tp));
  KILN_RETURN_IF_ERROR(read_int(cfg, "parallel.zero_stage", 0, 3, &c.parallel.zero_stage));
  KILN_RETURN_IF_ERROR(read_int(cfg, "parallel.prefetch", 0, 64, &c.parallel.prefetch));
  KILN_ASSIGN_OR_RETURN(c.parallel.hierarchical, cfg.get<bool>("parallel.hierarchical"));
  KILN_RETURN_IF_ERROR(
      read_real(cfg, "parallel.collective_timeout_s", 0.0, 1e7, &c.parallel.collective_timeout_s));
  KILN_RETURN_IF_ERROR(read_int(cfg, "parallel.pp", 1, 1 << 12, &c.parallel.pp));
  KILN_RETURN_IF_ERROR(read_enum<PpSchedule>(
      cfg, "parallel.pp_schedule", {{"1f1b", PpSchedule::k1F1B}, {"gpipe", PpSchedule::kGPipe}},
      &c.parallel.pp_schedule));
  {
    YAML::Node layers = cfg.node("parallel.pp_layers");
    if (layers.IsDefined() && !layers.IsNull()) {
      if (!layers.IsSequence()) return bad("parallel.pp_layers", "expected a list of block counts");
      int64_t total = 0;
      for (const auto& n : layers) {
        int64_t v = 0;
        try {
          v = n.as<int64_t>();
        } catch (const YAML::Exception&) {
          return bad("parallel.pp_layers", "expected whole numbers of blocks");
        }
        if (v < 1) return bad("parallel.pp_layers", "every stage needs at least one block");
        // (each entry at most n_layers <= 2^16 and at most parallel.pp entries: the sum cannot
        // overflow, as [2^63 - 1, 2^63 - 1, 6] once did, passing the check below)
        if (v > m.n_layers) {
          return bad("parallel.pp_layers",
                     fmt::format("a stage of {} blocks, model.n_layers is {}", v, m.n_layers));
        }
        if (static_cast<int64_t>(c.parallel.pp_layers.size()) >= c.parallel.pp) {
          return bad("parallel.pp_layers",
                     fmt::format("has more than parallel.pp ({}) entries", c.parallel.pp));
        }
        total += v;
        c.parallel.pp_layers.push_back(v);
      }
      if (!c.parallel.pp_layers.empty()) {
        if (static_cast<int64_t>(c.parallel.pp_layers.size()) != c.parallel.pp) {
          return bad("parallel.pp_layers", fmt::format("has {} entries for parallel.pp {}",
                                                       c.parallel.pp_layers.size(), c.parallel.pp));
        }
        if (total != m.n_layers) {
          return bad("parallel.pp_layers",
                     fmt::format("sums to {} blocks, model.n_layers is {}", total, m.n_layers));
        }
      }
    }
  }
  if (c.parallel.pp > m.n_layers) {
    return bad("parallel.pp", fmt::format("{} stages for {} blocks (each stage needs a block)",
                                          c.parallel.pp, m.n_layers));
  }
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
      if (!(b[i] >= 0.0 && b[i] < 1.0))
        return bad("optimizer.betas", "each beta must be in [0, 1)");
    }
    o.beta1 = static_cast<float>(b[0]);
    o.beta2 = static_cast<float>(b[1]);
  }
  KILN_RETURN_IF_ERROR(read_real(cfg, "optimizer.eps", 0.0, 1.0, &o.eps, true));
  KILN_RETURN_IF_ERROR(read_real(cfg, "optimizer.weight_decay", 0.0, 10.0, &o.weight_decay));
  KILN_RETURN_IF_ERROR(read_real(cfg, "optimizer.clip_grad", 0.0, 1e12, &o.clip_grad));
  KILN_ASSIGN_OR_RETURN(o.decay_norms_and_biases,
                        cfg.get<bool>("optimizer.decay_norms_and_biases"));
  // schedule
  ScheduleConfig& s = c.schedule;
  KILN_RETURN_IF_ERROR(read_enum<ScheduleKind>(cfg, "schedule.type",
                                               {{"constant", ScheduleKind::kConstant},
                                                {"cosine", ScheduleKind::kCosine},
                                                {"wsd", ScheduleKind::kWsd}},
                                               &s.kind));
  KILN_RETURN_IF_ERROR(read_int(cfg, "schedule.warmup_steps", 0, kBig, &s.warmup_steps));
  KILN_RETURN_IF_ERROR(read_int(cfg, "schedule.total_steps", 0, kBig, &s.total_steps));
  KILN_RETURN_IF_ERROR(read_real(cfg, "schedule.min_lr_ratio", 0.0, 1.0, &s.min_lr_ratio));
  KILN_RETURN_IF_ERROR(read_real(cfg, "schedule.decay_fraction", 0.0, 1.0, &s.decay_fraction));
  KILN_RETURN_IF_ERROR(read_enum<DecayShape>(cfg, "schedule.decay_shape",
                                             {{"linear", DecayShape::kLinear},
                                              {"cosine", DecayShape::kCosine},
                                              {"1-sqrt", DecayShape::kOneMinusSqrt}},
                                             &s.decay_shape));
  KILN_RETURN_IF_ERROR(read_enum<Recompute>(cfg, "activation_checkpointing",
                                            {{"none", Recompute::kNone},
                                             {"selective", Recompute::kSelective},
                                             {"full", Recompute::kFull}},
                                            &c.activation_checkpointing));
  // data
  DataConfig& d = c.data;
  KILN_ASSIGN_OR_RETURN(d.manifest, cfg.get<std::string>("data.manifest"));
  if (m.doc_mask && d.manifest.empty()) {
    return bad("model.doc_mask",
               "needs document starts, which synthetic data (data.manifest empty) does not have: "
               "set data.manifest to a `kiln prep` dataset or model.doc_mask: false");
  }
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.micro_batch", 1, 1 << 20, &d.micro_batch));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.grad_accum", 1, 1 << 20, &d.grad_accum));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.prefetch_depth", 1, 1 << 12, &d.prefetch_depth));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.workers", 1, 256, &d.workers));
  KILN_ASSIGN_OR_RETURN(d.prefetch_next_step, cfg.get<bool>("data.prefetch_next_step"));
  KILN_RETURN_IF_ERROR(read_int(cfg, "data.partitions", 0, 1 << 24, &d.partitions));
  KILN_ASSIGN_OR_RETURN(d.repartition, cfg.get<bool>("data.repartition"));
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
      loader::WeightRules rules;
      rules.key = "data.mixture";
      if (!d.mixture.empty()) KILN_RETURN_IF_ERROR(d.mixture.check(rules));
    }
  }
  // memory (engine/train/preflight.h)
  KILN_ASSIGN_OR_RETURN(c.memory.check, cfg.get<bool>("memory.check"));
  KILN_RETURN_IF_ERROR(read_real(cfg, "memory.margin", 0.0, 0.9, &c.memory.margin));
  KILN_ASSIGN_OR_RETURN(std::string budget, cfg.get<std::string>("memory.budget"));
  if (!budget.empty()) {
    auto b = parse_byte_size(budget);
    if (!b.is_ok()) return Status::config(b.status().message()).with_key("memory.budget");
    if (*b == 0) return Status::config("must be more than 0 bytes").with_key("memory.budget");
    c.memory.budget = *b;
  }
  // checkpoint
  KILN_RETURN_IF_ERROR(read_int(cfg, "checkpoint.every_steps", 0, kBig, &c.checkpoint.every_steps));
  KILN_RETURN_IF_ERROR(read_int(cfg, "checkpoint.keep_last", 0, kBig, &c.checkpoint.keep_last));
  KILN_ASSIGN_OR_RETURN(c.checkpoint.at_end, cfg.get<bool>("checkpoint.at_end"));
  // stability
  StabilityConfig& st = c.stability;
  KILN_ASSIGN_OR_RETURN(st.skip_nonfinite, cfg.get<bool>("stability.skip_nonfinite"));
  KILN_RETURN_IF_ERROR(read_steps(cfg, "stability.inject_overflow_at", &st.inject_overflow_at));
  KILN_RETURN_IF_ERROR(read_steps(cfg, "stability.inject_lr_burst_at", &st.inject_lr_burst_at));
  KILN_RETURN_IF_ERROR(read_steps(cfg, "stability.inject_bad_batch_at", &st.inject_bad_batch_at));
  KILN_RETURN_IF_ERROR(read_real(cfg, "stability.lr_burst_factor", 0.0, 1e12, &st.lr_burst_factor));
  KILN_RETURN_IF_ERROR(read_int(cfg, "stability.spike.window", 2, 1 << 20, &st.spike.window));
  KILN_RETURN_IF_ERROR(read_real(cfg, "stability.spike.z_loss", 0.0, 1e6, &st.spike.z_loss, true));
  KILN_RETURN_IF_ERROR(read_real(cfg, "stability.spike.z_grad", 0.0, 1e6, &st.spike.z_grad, true));
  KILN_RETURN_IF_ERROR(
      read_int(cfg, "stability.spike.warmup_steps", 0, kBig, &st.spike.warmup_steps));
  KILN_RETURN_IF_ERROR(read_enum<SpikeAction>(cfg, "stability.spike.action",
                                              {{"warn", SpikeAction::kWarn},
                                               {"skip", SpikeAction::kSkip},
                                               {"rollback", SpikeAction::kRollback}},
                                              &st.spike.action));
  KILN_RETURN_IF_ERROR(
      read_int(cfg, "stability.spike.max_rollbacks", 0, 1 << 20, &st.spike.max_rollbacks));
  KILN_RETURN_IF_ERROR(
      read_int(cfg, "stability.max_nonfinite_in_row", 0, kBig, &st.max_nonfinite_in_row));
  KILN_RETURN_IF_ERROR(
      read_real(cfg, "stability.bad_batch_token_fraction", 0.0, 1.0, &st.bad_batch_token_fraction));
  KILN_RETURN_IF_ERROR(
      read_int(cfg, "stability.layer_stats_every", 0, kBig, &st.layer_stats_every));
  KILN_RETURN_IF_ERROR(
      read_real(cfg, "stability.layer_clip.max_norm", 0.0, 1e12, &st.layer_clip_max_norm));
  KILN_RETURN_IF_ERROR(
      read_real(cfg, "stability.layer_clip.factor", 0.0, 1e12, &st.layer_clip_factor));
  if (st.layer_clip_factor > 0 && st.layer_clip_factor <= 1) {
    return bad("stability.layer_clip.factor", "must be 0 (off) or above 1");
  }
  // mixing
  MixingConfig& mx = c.mixing;
  {
    KILN_ASSIGN_OR_RETURN(std::string name, cfg.get<std::string>("mixing.policy"));
    KILN_ASSIGN_OR_RETURN(mx.policy, parse_mix_policy(name, "mixing.policy"));
  }
  KILN_RETURN_IF_ERROR(read_int(cfg, "mixing.update_every", 1, kBig, &mx.update_every));
  KILN_RETURN_IF_ERROR(read_real(cfg, "mixing.min_weight", 0.0, 1.0, &mx.min_weight));
  KILN_ASSIGN_OR_RETURN(mx.interpolate, cfg.get<bool>("mixing.interpolate"));
  KILN_RETURN_IF_ERROR(read_real(cfg, "mixing.doremi.eta", 0.0, 1e6, &mx.doremi_eta));
  KILN_RETURN_IF_ERROR(read_real(cfg, "mixing.doremi.smoothing", 0.0, 1.0, &mx.doremi_smoothing));
  KILN_ASSIGN_OR_RETURN(mx.doremi_reference, cfg.get<std::string>("mixing.doremi.reference"));
  KILN_RETURN_IF_ERROR(
      read_real(cfg, "mixing.odm.reward_smoothing", 0.0, 1.0, &mx.odm_reward_smoothing));
  KILN_RETURN_IF_ERROR(read_real(cfg, "mixing.odm.exploration", 0.0, 1.0, &mx.odm_exploration));
  {
    YAML::Node sched = cfg.node("mixing.schedule");
    const std::string key = "mixing.schedule";
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
      if (i == 0 ? p.step != 0 : p.step <= mx.schedule.back().step) {
        return bad(at + ".step",
                   i == 0 ? "the first point must be at step 0" : "steps must increase");
      }
      mx.schedule.push_back(std::move(p));
    }
    if (mx.policy == MixPolicy::kSchedule && mx.schedule.empty()) {
      return bad(key, "the schedule policy needs at least one {step, weights} point");
    }
  }
  KILN_RETURN_IF_ERROR(read_int(cfg, "eval.every_steps", 0, kBig, &c.eval.every_steps));
  KILN_RETURN_IF_ERROR(
      read_int(cfg, "eval.sequences_per_domain", 1, 1 << 20, &c.eval.sequences_per_domain));
  {
    YAML::Node tasks = cfg.node("eval.tasks");
    if (tasks.IsDefined() && !tasks.IsNull()) {
      if (!tasks.IsSequence()) return bad("eval.tasks", "expected a list of task files");
      for (const auto& n : tasks) {
        if (!n.IsScalar() || n.as<std::string>().empty()) {
          return bad("eval.tasks", "expected file names");
        }
        c.eval.tasks.push_back(n.as<std::string>());
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
  // Pipeline parallelism (engine/parallel/pipeline.h): what does not combine with it.
  if (c.parallel.pp > 1 && c.parallel.zero_stage >= 2) {
    return bad(
        "parallel.zero_stage",
        fmt::format("ZeRO-{} with parallel.pp {}: ZeRO-2/3 reduce (and ZeRO-3 gathers) every "
                    "unit once per micro-batch, which a pipeline's interleaved micro-batches "
                    "would multiply by the micro-batch count (DeepSpeed refuses it too); use "
                    "parallel.zero_stage 1 (the optimizer states sharded, gradients reduced "
                    "once per step) or 0",
                    c.parallel.zero_stage, c.parallel.pp));
  }
  return c;
}

}  // namespace kiln::engine
