// The training configuration: the `kiln train` schema (YAML defaults), parsed and validated.
//
// Sections follow docs/TRAINING.md "Config reference": model, parallel, precision, loss_scale,
// optimizer, schedule, activation_checkpointing, data, checkpoint, stability, run, device.
// parse_train_config() checks every value and names the key on error (a config error, exit 2).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "engine/mixing/policy.h"
#include "kernels/ops.h"
#include "loader/domain_weights.h"

namespace kiln::engine {

enum class Precision { kFp32, kBf16, kFp16 };
enum class Recompute { kNone, kSelective, kFull };  // activation checkpointing
enum class InitScheme { kGpt2, kDeepNet };
enum class Arch { kGpt2, kLlama };  // model.arch
enum class ScheduleKind { kConstant, kCosine, kWsd };
enum class DecayShape { kLinear, kCosine, kOneMinusSqrt };

const char* precision_name(Precision p);
const char* recompute_name(Recompute r);

const char* arch_name(Arch a);

// The decoder's shape. arch gpt2: learned positions, LayerNorm (eps 1e-5), GELU MLP, biases, tied
// embeddings. arch llama: rotary positions (rotate-half, rope_theta), RMSNorm (norm_eps), SwiGLU
// MLP of ffn_hidden units, grouped-query attention (n_kv_heads), no biases, untied embeddings.
// The Llama options are resolved by parse_train_config (a ModelConfig built in code gets the
// defaults below: GPT-2's).
struct ModelConfig {
  Arch arch = Arch::kGpt2;
  int64_t vocab_size = 8192;
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t seq_len = 256;   // also the size of the learned position table (gpt2)
  int64_t n_kv_heads = 0;  // key/value heads (n_heads % n_kv_heads == 0); 0: n_heads
  int64_t ffn_hidden = 0;  // MLP hidden units; 0: 4 d_model (gpt2), llama_ffn_hidden (llama)
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;      // RMSNorm's eps (llama; GPT-2's LayerNorm uses 1e-5)
  bool tie_embeddings = true;  // the LM head is the token embedding
  bool bias = true;            // linear layers have biases
  bool doc_mask = false;       // attention and positions restart at each document start
  InitScheme init = InitScheme::kGpt2;
  float init_std = 0.02f;
  // A safetensors file of whole fp32 weights (`kiln checkpoint consolidate`'s output) that a run
  // starts from instead of the random initialisation ("": none); not part of the model's shape.
  std::string init_from;

  bool llama() const { return arch == Arch::kLlama; }
  int64_t head_dim() const { return d_model / n_heads; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t ffn() const;
  // Width of the fused q, k, v projection: (n_heads + 2 n_kv_heads) head_dim.
  int64_t qkv_width() const { return (n_heads + 2 * kv_heads()) * head_dim(); }
};

// Llama's default SwiGLU width: 2/3 of 4 d_model, rounded up to a multiple of 256 (Meta's
// reference code with multiple_of = 256).
int64_t llama_ffn_hidden(int64_t d_model);

// Dynamic loss scaling (fp16 only), DeepSpeed/Megatron semantics: an overflow skips the step and
// spends one unit of hysteresis; when hysteresis is spent the scale is multiplied by
// backoff_factor (not below min_scale). After growth_interval consecutive clean steps the scale is
// multiplied by growth_factor and hysteresis is refilled.
struct LossScaleConfig {
  double initial = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 2;
  double min_scale = 1.0;
};

struct OptimizerConfig {
  double lr = 6e-4;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip_grad = 1.0f;               // global-norm clip; 0 disables
  bool decay_norms_and_biases = false;  // by default only matrices and embeddings decay
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;      // 0: run.steps
  double min_lr_ratio = 0.1;    // floor = lr * min_lr_ratio
  double decay_fraction = 0.2;  // wsd: the final fraction of total_steps that decays
  DecayShape decay_shape = DecayShape::kOneMinusSqrt;  // wsd decay shape
};

struct DataConfig {
  std::string manifest;  // "" : synthetic data
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  loader::DomainWeights mixture;  // empty: the manifest's token shares
  int64_t prefetch_depth = 4;     // batches the loader prepares ahead
  int64_t workers = 1;            // loader worker threads
  // Draw (and upload) the next step's micro-batches while a step computes
  // (engine/data/step_batches.h; the data and results are the same either way).
  bool prefetch_next_step = true;
  // Canonical loader partitions (loader/loader.h): the data order is the same on every
  // data-parallel size dividing them. 0: the global batch (micro_batch x grad_accum x dp).
  int64_t partitions = 0;
  // Resuming on a data-parallel size that does not divide the checkpoint's partitions (or with
  // another global batch): continue in another order (warning) instead of refusing.
  bool repartition = false;
};

enum class PpSchedule { k1F1B, kGPipe };
const char* pp_schedule_name(PpSchedule s);  // "1f1b", "gpipe"

struct ParallelConfig {
  int64_t tp = 1;
  int64_t zero_stage = 0;
  int64_t prefetch = 1;       // ZeRO-3: layers gathered ahead (distributed engine)
  bool hierarchical = false;  // DP all-reduce: intra-node, inter-node, intra-node (comm/topology.h)
  // Pipeline parallelism (engine/parallel/pipeline.h): pp stages of contiguous blocks, the
  // step's grad_accum micro-batches run through them by `pp_schedule`. pp_layers: blocks per
  // stage (pp entries summing to model.n_layers); empty: balanced by cost (pp_stage_split).
  int64_t pp = 1;
  PpSchedule pp_schedule = PpSchedule::k1F1B;
  std::vector<int64_t> pp_layers;
  // A collective outstanding longer than this stops every rank (comm/watchdog.h); 0: off.
  double collective_timeout_s = 600;
};

// The memory preflight (engine/train/preflight.h): before allocating, every rank compares its
// estimated peak with what it has.
struct MemoryConfig {
  bool check = true;
  double margin = 0.1;             // held back from the budget
  std::optional<uint64_t> budget;  // bytes per rank; unset: measured (host or device memory)
};

struct CheckpointConfig {
  int64_t every_steps = 0;  // 0: only at the end of the run
  int64_t keep_last = 3;    // 0: keep all
  bool at_end = true;       // also write one when run.steps is reached (false: speed tests)
};

enum class SpikeAction { kWarn, kSkip, kRollback };
const char* spike_action_name(SpikeAction a);

// Per-domain validation loss on a fixed set of validation sequences (see engine/train/eval.h).
struct EvalConfig {
  int64_t every_steps = 100;  // 0: off
  int64_t sequences_per_domain = 16;
  // Multiple-choice task files (engine/infer/eval_tasks.h) scored every every_steps too; the CLI
  // tokenizes them with the dataset's tokenizer (TrainOptions::eval_tasks).
  std::vector<std::string> tasks;
};

struct StabilityConfig {
  bool skip_nonfinite = true;  // skip a step whose gradients hold inf/NaN (all precisions)
  // Loss / gradient-norm spikes (engine/stability/monitor.h): z-scores against the last `window`
  // clean steps, after `warmup_steps`; a z above z_loss or z_grad triggers `action`.
  struct Spike {
    int64_t window = 200;
    double z_loss = 5.0;
    double z_grad = 5.0;
    int64_t warmup_steps = 100;
    SpikeAction action = SpikeAction::kWarn;
    int64_t max_rollbacks = 3;  // rollbacks per run before a spike only warns
  } spike;
  int64_t max_nonfinite_in_row = 10;  // stop with a diagnosis after this many skipped in a row
  // A batch where one token id makes up more than this fraction of the targets is skipped
  // before the step (0: off).
  double bad_batch_token_fraction = 0.9;
  int64_t layer_stats_every = 0;  // grad_norm_layers and update_ratio every N steps (0: off)
  // Per-layer clipping before the global clip (off when both are 0): a layer whose gradient
  // norm exceeds max_norm, or factor x its own moving average, is scaled down to that limit.
  double layer_clip_max_norm = 0;
  double layer_clip_factor = 0;
  // Testing hooks: multiply the learning rate by lr_burst_factor at these steps, or replace the
  // step's batches with one repeated token (a corrupted batch).
  std::vector<int64_t> inject_lr_burst_at;
  double lr_burst_factor = 100;
  std::vector<int64_t> inject_bad_batch_at;
  // Testing hook: after backward at these steps, one gradient value is set to +inf so the real
  // overflow path runs (skip, count, loss-scale backoff).
  std::vector<int64_t> inject_overflow_at;
};

struct RunConfig {
  std::string dir = "runs/default";
  int64_t steps = 100;
  uint64_t seed = 1234;
  int64_t log_every = 1;  // console line every N steps (metrics.jsonl gets every step)
  int64_t threads = 0;    // host threads for kernels; 0: all cores
};

struct TrainConfig {
  ModelConfig model;
  ParallelConfig parallel;
  Precision precision = Precision::kFp32;
  LossScaleConfig loss_scale;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  Recompute activation_checkpointing = Recompute::kNone;
  DataConfig data;
  MemoryConfig memory;
  CheckpointConfig checkpoint;
  StabilityConfig stability;
  MixingConfig mixing;
  EvalConfig eval;
  RunConfig run;
  Device device = Device::kCpu;  // the device the engine runs on (engine/device/runtime.h)
};

// The YAML defaults: the schema of `kiln train` configs.
extern const char* const kTrainConfigDefaults;
// Config paths whose children are free-form (domain names).
std::vector<std::string> train_config_open_paths();

// Loads file + sets over the defaults (see common/config.h).
Result<Config> load_train_config(const std::string& file, const std::vector<std::string>& sets);
// Typed, validated view. Errors are kConfig with the key.
Result<TrainConfig> parse_train_config(const Config& cfg);
// The bounds every model shape is held to (the config's, and a checkpoint's state.json): each
// size within its range and n_heads dividing d_model; a kConfig error naming the model.* key.
Status check_model_shape(const ModelConfig& m);

}  // namespace kiln::engine
