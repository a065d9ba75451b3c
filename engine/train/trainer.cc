#include "engine/train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/stop_signal.h"
#include "common/text.h"
#include "engine/checkpoint/hf.h"
#include "engine/checkpoint/sharded_save.h"
#include "engine/model/schedule.h"
#include "engine/parallel/gradient_strategy.h"
#include "engine/parallel/parallelism.h"
#include "engine/parallel/pipeline.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/stability/decision.h"
#include "engine/stability/rollback.h"
#include "engine/train/mfu.h"
#include "engine/train/preflight.h"
#include "engine/train/step_loss.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"

namespace kiln::engine {
namespace fs = std::filesystem;

namespace {

std::string mib(size_t bytes) { return bytes_in(bytes, ByteUnit::kMiB); }

std::string human_count(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

}  // namespace

Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::open(const TrainConfig& config,
                                               const std::string& config_yaml,
                                               const TrainOptions& options) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->config_ = config;
  t->config_yaml_ = config_yaml;
  t->options_ = options;
  // Under mpirun: this rank's place among the data-parallel ranks (one process otherwise).
  KILN_ASSIGN_OR_RETURN(
      t->par_,
      Parallelism::create(config.parallel, config.activation_checkpointing, config.device));
  if (!t->par_->is_root()) t->options_.console = false;
  cpu::set_num_threads(static_cast<int>(config.run.threads));  // host threads (loader, CPU kernels)
  // The device is chosen here, once; everything below reaches it through the Runtime.
  // (Under mpirun with cuda, Parallelism::create bound this rank to its GPU and opened the NCCL
  // group that carries the device buffers; host values stay on the MPI groups.)
  KILN_ASSIGN_OR_RETURN(Runtime * runtime, runtime_for(config.device));
  if (t->par_->tp_group().size() > 1) {
    KILN_ASSIGN_OR_RETURN(t->tp_, TensorParallel::create(config.model, config.stability,
                                                         t->par_->tp_group(), &t->par_->data_tp()));
  }

  // The memory preflight (engine/train/preflight.h), on every rank before its model states exist:
  // a run that cannot fit stops here, all ranks together, instead of at the OOM killer.
  const MemoryBudget budget = budget_for(config, *runtime, comm::ranks_on_this_host(comm::world()));
  // With pipeline stages each rank checks its own stage (rank order tp, pp, dp: comm/topology.h).
  const int pp_rank =
      static_cast<int>((comm::world().rank() / std::max<int64_t>(1, config.parallel.tp)) %
                       std::max<int64_t>(1, config.parallel.pp));
  KILN_RETURN_IF_ERROR(
      t->par_->agree(check_memory(config, t->par_->world_size(), budget, pp_rank)));

  auto data = open_data_source(config.data, config.model, config.run.seed, t->par_->data_rank());
  KILN_RETURN_IF_ERROR(t->par_->agree(data.is_ok() ? Status::ok() : data.status()));
  t->data_ = std::move(data).value();
  KILN_RETURN_IF_ERROR(t->build_model_states(runtime));
  t->optimizer_ = std::make_unique<AdamW>(config.optimizer);
  t->grads_ =
      make_gradient_strategy(*t->par_, *t->params_, *t->optimizer_, config.optimizer, t->tp_.get());
  t->scaler_ = LossScaler(config.loss_scale, config.precision == Precision::kFp16);
  // Pipeline parallelism: this stage's model keeps the schedule's micro-batches in flight, and
  // the executor runs the step's micro-batches through the stages.
  const int pp = t->par_->pp_size();
  const int accum = static_cast<int>(config.data.grad_accum);
  const int pp_slots =
      pp > 1 ? pp_in_flight(config.parallel.pp_schedule, t->par_->pp_rank(), pp, accum) : 1;
  t->model_ = Model::create(t->params_.get(), config.data.micro_batch,
                            config.activation_checkpointing, 0, t->tp_.get(), pp_slots);
  if (pp > 1) {
    t->pipeline_ = std::make_unique<PipelineExecutor>(
        *t->model_, t->par_->data_pp(), config.parallel.pp_schedule,
        t->model_->stage_activation_elems() * dtype_size(t->params_->work_dtype()));
  }
  t->batches_ = std::make_unique<StepBatches>(t->data_.get(), runtime, config.data.micro_batch,
                                              config.model.seq_len, config.model.vocab_size,
                                              config.data.prefetch_next_step);
  std::set<std::string> domains(t->data_->domains().begin(), t->data_->domains().end());
  t->mixture_ = std::make_unique<MixtureWatcher>(config.run.dir, domains);
  t->state_.seed = config.run.seed;
  t->state_.scaler = t->scaler_.state();
  KILN_ASSIGN_OR_RETURN(t->mix_,
                        MixController::open(config.mixing, config.run.dir, t->data_->domains(),
                                            t->data_->weights().map()));
  t->spikes_ = std::make_unique<SpikeDetector>(config.stability.spike);
  t->faults_ = std::make_unique<FaultInjection>(config.stability);
  if (config.eval.every_steps > 0) {
    KILN_ASSIGN_OR_RETURN(t->eval_,
                          Evaluator::open(*t->data_, config.eval, config.data.micro_batch,
                                          config.model.seq_len, config.model.vocab_size, runtime));
    if (t->eval_->empty()) {
      KILN_LOG_WARN(
          "eval: the dataset has no validation split (kiln prep split.val_fraction / "
          "split.val_min_docs), so no val_loss is measured");
      t->eval_.reset();
    } else {
      KILN_LOG_INFO("eval: {} validation sequences, every {} steps", t->eval_->sequences(),
                    config.eval.every_steps);
    }
  }
  if (config.eval.every_steps > 0 && !options.eval_tasks.empty()) {
    t->task_eval_ = std::make_unique<TaskEvaluator>(options.eval_tasks, config.data.micro_batch,
                                                    config.model.seq_len, runtime);
    KILN_LOG_INFO("eval: {} multiple-choice task(s) every {} steps", options.eval_tasks.size(),
                  config.eval.every_steps);
  }
  if (config.mixing.policy == MixPolicy::kDoremi && !t->eval_) {
    KILN_LOG_WARN("mixing: doremi without validation loss uses the per-domain training loss");
  }

  // Rank 0 owns the run directory; every rank learns whether it could.
  KILN_RETURN_IF_ERROR(t->par_->agree(t->par_->is_root() ? t->prepare_run_dir() : Status::ok()));

  t->flops_per_token_ = model_flops_per_token(config.model, t->params_->num_params());
  if (!runtime->product_name().empty()) {  // an accelerator
    t->peak_flops_ = dense_bf16_peak_flops(runtime->product_name());
  }
  t->log_run_summary(*runtime);
  KILN_RETURN_IF_ERROR(t->restore_resumed_state());
  // ZeRO-2/3: the model hands each unit's gradients over (and gathers its weights) as it goes.
  if (t->par_->zero() && t->par_->zero()->stage() >= 2) t->model_->set_unit_hooks(t->par_->zero());
  if (t->state_.step == 0 && t->mix_->weights() != t->batches_->weights().map()) {
    KILN_RETURN_IF_ERROR(t->batches_->set_weights(t->mix_->weights()));
  }
  t->mix_->set_writes_files(t->par_->is_root());
  KILN_LOG_INFO("mixing: policy {}{}", t->mix_->state().policy,
                t->mix_->state().paused ? " (paused: weights pinned by kiln mix set)" : "");
  if (!t->par_->is_root()) return t;  // rank 0 alone writes the run directory's files
  KILN_RETURN_IF_ERROR(t->mix_->open_history(t->state_.step));
  KILN_RETURN_IF_ERROR(t->mixture_->publish_if_absent(t->batches_->weights().normalised()));
  // metrics.jsonl: keep the lines up to the step we continue from, then append.
  KILN_RETURN_IF_ERROR(t->truncate_metrics(t->state_.step));
  return t;
}

void Trainer::log_run_summary(Runtime& runtime) {
  const TrainConfig& config = config_;
  KILN_LOG_INFO("{}", cpu::describe_cpu_runtime());
  // Report sizes: parameters, model states, activations per checkpointing mode.
  const auto& m = config.model;
  KILN_LOG_INFO("device: {}", runtime.describe());
  KILN_LOG_INFO("model: {} {} parameters (vocab {}, d_model {}, {} layers, {} heads, seq {}), {}",
                arch_name(m.arch), human_count(static_cast<double>(params_->num_params())),
                m.vocab_size, m.d_model, m.n_layers, m.n_heads, m.seq_len,
                precision_name(config.precision));
  if (m.llama()) {
    KILN_LOG_INFO("llama: {} key/value heads, SwiGLU {}, rope_theta {}, {} embeddings, {}, {}",
                  m.kv_heads(), m.ffn(), m.rope_theta, m.tie_embeddings ? "tied" : "untied",
                  m.bias ? "biases" : "no biases",
                  m.doc_mask ? "document-masked attention" : "no document mask");
  }
  KILN_LOG_INFO("model states (weights, grads, AdamW moments{}): {}",
                config.precision == Precision::kFp32 ? "" : ", low-precision copy",
                mib(params_->padded_numel() * (config.precision == Precision::kFp32 ? 16 : 18)));
  const ActivationMemory none = plan_activation_memory(m, config.data.micro_batch, config.precision,
                                                       Recompute::kNone, 1, config.device);
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    ActivationMemory a =
        plan_activation_memory(m, config.data.micro_batch, config.precision, r, 1, config.device);
    const size_t stored = a.kept_bytes + a.recompute_bytes;
    const size_t base = none.kept_bytes + none.recompute_bytes;
    KILN_LOG_INFO("activations ({}{}): kept {} + recompute buffers {} = {}; saves {} vs none",
                  recompute_name(r), r == config.activation_checkpointing ? ", this run" : "",
                  mib(a.kept_bytes), mib(a.recompute_bytes), mib(stored),
                  mib(base > stored ? base - stored : 0));
  }
  KILN_LOG_INFO("data: {}", data_->describe());
  if (par_->world_size() > 1) {
    KILN_LOG_INFO(
        "distributed: {} ranks ({}), data-parallel {}, tensor-parallel {}, pipeline {}, ZeRO "
        "stage {}{}; global batch {} sequences",
        par_->world_size(), par_->backend(), par_->size(), config.parallel.tp, par_->pp_size(),
        config.parallel.zero_stage, config.parallel.hierarchical ? ", hierarchical all-reduce" : "",
        config.data.micro_batch * config.data.grad_accum * par_->size());
  }
  if (par_->pp_size() > 1) {
    const int p = par_->pp_size();
    const int m = static_cast<int>(config.data.grad_accum);
    const std::vector<int64_t> bounds = pp_stage_split(config.model, p, config.parallel.pp_layers);
    std::string split;
    for (int s = 0; s < p; ++s) {
      split += fmt::format(
          "{}stage {}: blocks {}..{}{}{}", s ? "; " : "", s, bounds[s], bounds[s + 1] - 1,
          s == 0 ? " + embeddings" : "",
          s == p - 1 ? (config.model.tie_embeddings ? " + final norm, head (tied embeddings)"
                                                    : " + final norm, head")
                     : "");
    }
    KILN_LOG_INFO(
        "pipeline: {} stages, schedule {}, {} micro-batches per step; bubble (p-1)/(m+p-1) = "
        "{:.3f}; this rank: stage {} ({} micro-batches in flight); {}",
        p, pp_schedule_name(config.parallel.pp_schedule), m, pp_bubble_fraction(p, m),
        par_->pp_rank(), model_->pp_slots(), split);
    if (m < p) {
      KILN_LOG_WARN(
          "pipeline: data.grad_accum {} (micro-batches per step) is below parallel.pp {}: "
          "stages idle {:.0f}% of the step (bubble); raise data.grad_accum to at least {} "
          "(4x for a bubble under 20%)",
          m, p, 100.0 * pp_bubble_fraction(p, m), p);
    }
  }
  if (!runtime.product_name().empty()) {  // an accelerator
    if (peak_flops_) {
      KILN_LOG_INFO(
          "MFU: {:.3g} model FLOPs per token (6N + 6LdT) against {} dense bf16 peak "
          "{:.0f} TFLOP/s",
          flops_per_token_, runtime.product_name(), *peak_flops_ / 1e12);
    } else {
      KILN_LOG_WARN(
          "MFU not reported: '{}' is not in the table of known GPUs' dense bf16 peaks "
          "(engine/train/mfu.cc)",
          runtime.product_name());
    }
  }
}

// With --resume: the trainer state build_model_states read from the checkpoint, applied to the
// data, the loss scaler, the optimizer's update count, the mixing and stability states.
Status Trainer::restore_resumed_state() {
  const TrainConfig& config = config_;
  if (!resumed_) return Status::ok();  // build_model_states read the checkpoint's state
  const std::string latest = resumed_from_;
  state_ = resumed_state_;
  if (state_.seed != config.run.seed) {
    return Status::config("run.seed differs from the checkpoint's (" + std::to_string(state_.seed) +
                          ")")
        .with_key("run.seed");
  }
  KILN_RETURN_IF_ERROR(batches_->restore(state_.data_state).prefixed("restoring data state"));
  if (state_.precision == precision_name(config.precision)) {
    scaler_.set_state(state_.scaler);
  } else {  // master weights and moments are fp32 in every precision: switching is fine
    KILN_LOG_WARN("the checkpoint was trained in {}; continuing in {} (loss scaler reset)",
                  state_.precision, precision_name(config.precision));
    state_.scaler = scaler_.state();
  }
  optimizer_->set_updates(state_.adam_updates);
  if (auto m = state_.extra.find("mixing"); m != state_.extra.end()) {
    KILN_RETURN_IF_ERROR(mix_->restore(m->second));
  }
  if (auto m = state_.extra.find("stability"); m != state_.extra.end()) {
    KILN_RETURN_IF_ERROR(StabilityState::from_json(m->second, &stab_, spikes_.get()));
  }
  mixture_->set_applied_hash(state_.mixture_hash);
  last_saved_step_ = state_.step;
  KILN_LOG_INFO("resumed from {} (step {}, {} tokens)", latest, state_.step, state_.tokens);
  return Status::ok();
}

Status Trainer::build_model_states(Runtime* runtime) {
  const TrainConfig& config = config_;
  // The backend's allocations so far, to tell this phase's peak (when nothing was freed before,
  // the global peak after it is the phase's).
  const DeviceMemory before = runtime->memory();
  const auto t0 = std::chrono::steady_clock::now();
  // ZeRO: a rank keeps only shards of its model states, so its store starts without buffers.
  // Pipeline parallelism: the store allocates only this stage's units (ParamStore::holds).
  const PpStage stage = par_->pp_size() > 1 ? pp_stage(config.model, par_->pp_rank(),
                                                       par_->pp_size(), config.parallel.pp_layers)
                                            : PpStage{};
  params_ = std::make_unique<ParamStore>(
      config.model, config.precision, config.optimizer.decay_norms_and_biases, runtime,
      tp_ ? tp_->shard() : TpShard{}, !par_->shards_states(), stage);
  std::unique_ptr<StateSource> source;
  std::string from = "the initialisation (run.seed " + std::to_string(config.run.seed) + ")";
  if (options_.resume) {
    // Rank 0 picks the checkpoint; every rank reads the same one (a shared run directory).
    auto latest = latest_checkpoint(config.run.dir);
    std::string found = latest.is_ok() ? *latest : std::string();
    KILN_RETURN_IF_ERROR(par_->broadcast(&found));
    if (!latest.is_ok() && latest.status().code() != StatusCode::kNotFound && found.empty()) {
      return std::move(latest).take_status();
    }
    if (!found.empty()) {
      // Any layout: each rank reads its TP slices' shards from the writer's partitions.
      auto reader = CheckpointReader::open(found, *params_, &resumed_state_);
      KILN_RETURN_IF_ERROR(par_->agree(reader.is_ok() ? Status::ok() : reader.status()));
      source = std::move(reader).value();
      resumed_ = true;
      resumed_from_ = found;
      from = found;
    } else {
      KILN_LOG_WARN("--resume: no checkpoint in {}; starting from step 0", config.run.dir);
    }
  }
  if (!source && !config.model.init_from.empty() && is_hf_dir(config.model.init_from)) {
    // A Hugging Face directory (engine/checkpoint/hf.h): each rank reads its slices' ranges.
    auto reader = HfSource::open(config.model.init_from, *params_, "model.init_from");
    KILN_RETURN_IF_ERROR(par_->agree(reader.is_ok() ? Status::ok() : reader.status()));
    source = std::move(reader).value();
    from = config.model.init_from + " (model.init_from, Hugging Face; AdamW moments start at zero)";
  } else if (!source && !config.model.init_from.empty()) {
    auto reader =
        CheckpointReader::open_consolidated(config.model.init_from, *params_, "model.init_from");
    KILN_RETURN_IF_ERROR(par_->agree(reader.is_ok() ? Status::ok() : reader.status()));
    source = std::move(reader).value();
    from = config.model.init_from + " (model.init_from; AdamW moments start at zero)";
  }
  if (!source) source = std::make_unique<InitSource>(*params_, config.run.seed);
  Runtime& rt = *runtime;
  // ZeRO: each rank computes or reads only its shards (and the full buffers its stage keeps).
  KILN_RETURN_IF_ERROR(par_->agree(par_->attach(*params_, config.optimizer, *source)));
  if (auto* reader = dynamic_cast<CheckpointReader*>(source.get())) reader->log_reshard();
  const DeviceMemory after = rt.memory();
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  KILN_LOG_INFO(
      "model states from {} in {:.2f} s: {} bytes held; start-up peak {} bytes through "
      "the backend{} (host staging at most {} bytes); peak RSS {:.1f} MiB",
      from, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      after.in_use - before.in_use,
      before.peak == before.in_use ? std::to_string(after.peak - before.in_use)
                                   : std::string("(not measurable: memory freed before)"),
      par_->shards_states() ? " (this rank's shards and the buffers its ZeRO stage keeps)" : "",
      rt.host_addressable() ? 0 : kStateChunk * sizeof(float),
      static_cast<double>(ru.ru_maxrss) / 1024.0);
  return Status::ok();
}

Status Trainer::truncate_metrics(int64_t step) {
  history_.erase(std::remove_if(history_.begin(), history_.end(),
                                [&](const StepRecord& r) { return r.step > step; }),
                 history_.end());
  if (!par_->is_root()) return Status::ok();  // rank 0 writes the run directory's files
  metrics_.reset();                           // closes the file before MetricsLog::open rewrites it
  KILN_ASSIGN_OR_RETURN(metrics_, MetricsLog::open(config_.run.dir, step));
  return Status::ok();
}

Status Trainer::log_event(const std::string& json_line) {
  if (!par_->is_root()) return Status::ok();  // rank 0 writes the run directory's files
  const std::string path = (fs::path(config_.run.dir) / "stability.jsonl").string();
  std::ofstream out(path, std::ios::app | std::ios::binary);
  out << json_line << "\n";
  out.flush();
  if (!out) return Status::from_errno("append", path);
  return Status::ok();
}

Result<StepRecord> Trainer::skip_bad_batch(StepRecord rec, const BatchCheck& check,
                                           std::chrono::steady_clock::time_point t0) {
  rec.skipped = true;
  rec.skip_reason = "bad_batch";
  rec.loss = NAN;
  rec.grad_norm = NAN;
  rec.lr = learning_rate(config_.schedule, config_.optimizer.lr, state_.step);
  ++stab_.bad_batches;
  ++state_.skipped_steps;
  std::vector<std::string> samples;
  for (const auto& b : batches_->batches())
    samples.insert(samples.end(), b.samples.begin(), b.samples.end());
  KILN_LOG_WARN(
      "step {}: bad batch skipped before the step: token {} is {:.1f}% of its {} "
      "targets (stability.bad_batch_token_fraction {}){}",
      rec.step, check.token, 100.0 * check.fraction, check.targets,
      config_.stability.bad_batch_token_fraction,
      samples.empty() ? std::string() : "; samples: " + listed_samples(samples));
  nlohmann::ordered_json ev = {{"step", rec.step},         {"action", "bad_batch"},
                               {"token", check.token},     {"fraction", check.fraction},
                               {"targets", check.targets}, {"samples", samples}};
  KILN_RETURN_IF_ERROR(log_event(ev.dump()));
  if (scaler_.enabled()) rec.loss_scale = scaler_.scale();
  rec.mixing_policy = mix_->state().policy;
  rec.mixing_paused = mix_->state().paused;
  state_.step = rec.step;
  rec.tokens = state_.tokens;
  rec.step_ms = ms_since(t0);
  if (metrics_) KILN_RETURN_IF_ERROR(metrics_->append(rec));  // rank 0 alone writes files
  history_.push_back(rec);
  return rec;
}

Result<bool> Trainer::rollback(StepRecord* rec) {
  auto latest = latest_checkpoint(config_.run.dir);
  if (!latest.is_ok()) {
    if (latest.status().code() == StatusCode::kNotFound) return false;
    return std::move(latest).take_status();
  }
  const StabilityState now = stab_;
  TrainerState ck;
  if (ZeroOptimizer* zero = par_->zero()) {  // each rank reads its shards' ranges again
    auto reader = CheckpointReader::open(*latest, *params_, &ck);
    Status st = reader.is_ok() ? zero->reload(**reader) : reader.status();
    KILN_RETURN_IF_ERROR(par_->agree(std::move(st).prefixed("rollback")));
  } else {
    KILN_RETURN_IF_ERROR(
        par_->agree(load_checkpoint(*latest, params_.get(), &ck).prefixed("rollback")));
  }
  StabilityState at_ck;
  spikes_ = std::make_unique<SpikeDetector>(config_.stability.spike);
  if (auto m = ck.extra.find("stability"); m != ck.extra.end()) {
    KILN_RETURN_IF_ERROR(StabilityState::from_json(m->second, &at_ck, spikes_.get()));
  }
  if (auto m = ck.extra.find("mixing"); m != ck.extra.end()) {
    KILN_RETURN_IF_ERROR(mix_->restore(m->second));
  }
  // The model, optimizer, scaler and policy go back to the checkpoint; the data does not: the
  // batches since the checkpoint (the spike's included) are quarantined, never trained on
  // (engine/stability/rollback.h).
  const Quarantine q =
      quarantine_window(now, at_ck, ck.step, rec->step,
                        fmt::format("loss z {:.2f}, grad z {:.2f}", rec->loss_z, rec->grad_z));
  const nlohmann::ordered_json ranges = nlohmann::ordered_json::parse(quarantine_ranges_json(q));
  stab_ = after_rollback(now, q);
  const uint64_t mixture_hash = state_.mixture_hash;
  state_.step = ck.step;
  state_.tokens = ck.tokens;
  state_.skipped_steps = ck.skipped_steps;
  state_.adam_updates = ck.adam_updates;
  state_.scaler = ck.scaler;
  state_.mixture_hash = mixture_hash;  // control files already applied stay applied
  optimizer_->set_updates(ck.adam_updates);
  scaler_.set_state(ck.scaler);
  KILN_RETURN_IF_ERROR(batches_->set_weights(mix_->state().weights));
  KILN_RETURN_IF_ERROR(truncate_metrics(ck.step));
  KILN_RETURN_IF_ERROR(mix_->open_history(ck.step));
  last_saved_step_ = ck.step;
  rec->skipped = true;
  rec->skip_reason = "rollback";
  nlohmann::ordered_json ev = {{"step", rec->step},
                               {"action", "rollback"},
                               {"to_step", ck.step},
                               {"reason", q.reason},
                               {"loss", rec->loss},
                               {"grad_norm", rec->grad_norm},
                               {"quarantined_sequences", ranges},
                               {"rollbacks", stab_.rollbacks}};
  KILN_RETURN_IF_ERROR(log_event(ev.dump()));
  KILN_LOG_WARN(
      "step {}: rolled back to {} (rollback {} of at most {}); quarantined the batches of "
      "steps {}..{}: {}",
      rec->step, *latest, stab_.rollbacks, config_.stability.spike.max_rollbacks, ck.step + 1,
      rec->step, ranges.dump());
  return true;
}

Status Trainer::prepare_run_dir() {
  const fs::path dir(config_.run.dir);
  std::error_code ec;
  fs::create_directories(dir / "control", ec);
  if (ec) return Status::io("cannot create run directory: " + ec.message()).with_file(dir.string());
  // A run is there once it has written a metrics line or a checkpoint. The error codes are
  // deliberately not checked: a file that cannot be examined counts as present (file_size then
  // returns -1), so the run refuses rather than overwrite what it could not see.
  const bool has_run =
      (fs::exists(dir / "metrics.jsonl", ec) && fs::file_size(dir / "metrics.jsonl", ec) > 0) ||
      fs::exists(dir / "checkpoints" / "latest");
  if (has_run && !options_.resume) {
    if (!options_.overwrite) {
      return Status::usage("run directory " + dir.string() +
                           " already holds a run: continue it with --resume, or start over with "
                           "--overwrite, or choose another run.dir");
    }
    for (const fs::path& old :
         {fs::path(metrics_path(dir.string())), dir / "control" / "mixture.json",
          dir / "control" / "policy.json", dir / "mixing.jsonl", dir / "mixing_weights.json",
          dir / "stability.jsonl", dir / "checkpoints"}) {
      fs::remove_all(old, ec);  // a missing file is not an error
      if (ec)
        return Status::io("cannot clear the old run: " + ec.message()).with_file(old.string());
    }
  }
  return write_file_atomic((dir / "config.yaml").string(), config_yaml_);
}

Result<StepRecord> Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  StepRecord rec;
  rec.step = state_.step + 1;
  par_->begin_step(rec.step);
  KILN_RETURN_IF_ERROR(apply_controls(&rec));
  KILN_ASSIGN_OR_RETURN(StepInput in, draw_checked_batches(&rec));
  if (in.bad_anywhere) return skip_bad_batch(rec, in.check, t0);
  KILN_RETURN_IF_ERROR(forward_backward(in, &rec));
  KILN_ASSIGN_OR_RETURN(StepStats stats, inspect_gradients(in, &rec));
  KILN_ASSIGN_OR_RETURN(bool rolled_back, decide_and_update(in, stats, &rec));
  if (rolled_back) return rec;
  KILN_RETURN_IF_ERROR(observe(in, &rec));
  return record(std::move(rec), in, t0);
}

// Live mixture changes apply from this step's batch on: rank 0 reads the control files and every
// rank applies what it read, at the same step.
Status Trainer::apply_controls(StepRecord* rec) {
  std::string polled;
  if (par_->is_root()) {
    if (auto w = mixture_->poll()) polled = mixture_to_json(*w);
  }
  KILN_RETURN_IF_ERROR(par_->broadcast(&polled));
  std::optional<loader::DomainWeights> w;
  if (!polled.empty()) {
    KILN_ASSIGN_OR_RETURN(w, parse_mixture_json(polled, "rank 0's control file"));
  }
  if (w) {
    Status st = batches_->set_weights(*w);
    if (st.is_ok()) {
      KILN_LOG_INFO("step {}: domain weights changed to {}", rec->step,
                    mixture_to_json(w->normalised()));
      mix_->pin(w->map(), rec->step);
    } else {
      KILN_LOG_WARN("step {}: ignoring the mixture control file: {}", rec->step, st.to_string());
    }
  }
  // `kiln mix policy`: rank 0 reads the request, every rank applies it.
  std::string policy_request;
  if (par_->is_root()) policy_request = mix_->read_policy_request(rec->step).value_or("");
  KILN_RETURN_IF_ERROR(par_->broadcast(&policy_request));
  if (!policy_request.empty()) {
    if (auto pw = mix_->apply_policy(policy_request, rec->step)) {
      KILN_RETURN_IF_ERROR(batches_->set_weights(*pw));
    }
  }
  rec->domain_weights = batches_->weights();
  return Status::ok();
}

// The step's micro-batches (drawn ahead during the previous step when it could), checked on
// every rank: a rank without its batch stops every rank (named in the message) instead of leaving
// them waiting in the gradient all-reduce, and every rank skips when any rank's batch is bad (the
// ranks must take the same steps). The valid targets and the sequences per domain are counted
// over all ranks (the loss is the mean over every rank's targets; accounting, the ODM reward).
Result<Trainer::StepInput> Trainer::draw_checked_batches(StepRecord* rec) {
  StepInput in;
  StepBatches::Drawn drawn = batches_->take(static_cast<size_t>(config_.data.grad_accum));
  std::vector<MicroBatch>& batches = batches_->batches();
  rec->loader_wait_ms = drawn.wait_ms;
  in.valid = drawn.valid;
  Status fetched = std::move(drawn.status);
  if (fetched.is_ok() && faults_->corrupt_batch(rec->step, &batches)) {
    for (size_t bi = 0; bi < batches.size(); ++bi) batches_->staged().upload(bi, batches[bi]);
  }
  KILN_RETURN_IF_ERROR(par_->agree(std::move(fetched)));
  KILN_RETURN_IF_ERROR(par_->sum(&in.valid, 1));
  in.check = inspect_batch(batches, config_.stability.bad_batch_token_fraction);
  const std::vector<std::string>& domains = data_->domains();
  std::vector<int64_t> counts = count_domain_sequences(batches, domains.size());
  counts.insert(counts.begin(), in.check.bad ? 1 : 0);
  KILN_RETURN_IF_ERROR(par_->sum(counts.data(), counts.size()));
  in.bad_anywhere = counts[0] > 0;
  for (size_t d = 0; d < domains.size(); ++d) {
    if (counts[1 + d] == 0) continue;
    in.domain_sequences[domains[d]] = counts[1 + d];
    stab_.sequences[domains[d]] += static_cast<uint64_t>(counts[1 + d]);
  }
  in.scale = scaler_.scale();
  return in;
}

// Forward and backward over the micro-batches, the loss (mean over every rank's valid targets,
// and per domain), and the gradients summed over the data-parallel ranks (ZeRO-1: each rank keeps
// its shard's sums; ZeRO-2/3 reduced them during backward).
Status Trainer::forward_backward(const StepInput& in, StepRecord* rec) {
  std::vector<MicroBatch>& batches = batches_->batches();
  DeviceBatches& staged = batches_->staged();
  const float dloss = static_cast<float>(in.scale / std::max<int64_t>(1, in.valid));
  params_->zero_grads();
  grads_->zero_grads();
  // The next step's micro-batches are drawn (and uploaded) while this one computes - not after
  // the last step, nor when the mixing policy may change the weights after this one (they would
  // be drawn again; StepBatches keeps the data exact either way).
  if (rec->step < config_.run.steps && !mix_due(config_.mixing, mix_->state(), rec->step)) {
    batches_->prefetch(static_cast<size_t>(config_.data.grad_accum));
  }
  PpTiming pp_timing;
  if (pipeline_) {
    // Every stage of the pipeline has the same micro-batches (the first embeds the inputs, the
    // last scores the targets, every stage masks by doc_start).
    std::vector<PpMicroBatch> mbs;
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const DeviceBatches::Tokens tok = staged.at(bi);
      mbs.push_back({tok.inputs, tok.targets, staged.losses(bi), tok.doc_start});
    }
    KILN_ASSIGN_OR_RETURN(pp_timing, pipeline_->train(mbs, dloss));
  } else {
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const DeviceBatches::Tokens tok = staged.at(bi);
      model_->forward_backward(tok.inputs, tok.targets, dloss, staged.losses(bi), tok.doc_start);
    }
  }
  // The step's one wait for the device: every micro-batch's per-token losses, one copy (pinned).
  const float* step_losses = staged.host_losses(batches.size());
  const std::vector<std::string>& domains = data_->domains();
  StepLoss local = sum_step_loss(
      batches, step_losses, static_cast<size_t>(config_.data.micro_batch * config_.model.seq_len),
      domains.size());
  // Sums over the data-parallel ranks: loss, then per domain the loss and the target count.
  std::vector<double> sums;
  sums.push_back(local.sum);
  sums.insert(sums.end(), local.domain_sum.begin(), local.domain_sum.end());
  for (int64_t c : local.domain_targets) sums.push_back(static_cast<double>(c));
  const auto c0 = std::chrono::steady_clock::now();
  if (pipeline_) {
    // The losses exist on the last stage only: summed over the pipeline with zeros elsewhere
    // (exact: x + 0 is x), so every stage logs and decides the same; with the stages' waits and
    // times for the measured bubble.
    sums.push_back(pp_timing.wait_ms);
    sums.push_back(pp_timing.total_ms);
    KILN_RETURN_IF_ERROR(from_last_stage(&sums, 2, "step loss"));
    const double total = sums.back();
    sums.pop_back();
    const double waited = sums.back();
    sums.pop_back();
    rec->pp_bubble = total > 0 ? waited / total : 0.0;
  }
  KILN_RETURN_IF_ERROR(par_->sum(sums.data(), sums.size()));
  rec->loss = sums[0] / std::max<int64_t>(1, in.valid);
  for (size_t d = 0; d < domains.size(); ++d) {
    const double targets = sums[1 + domains.size() + d];
    if (targets > 0) rec->domain_loss[domains[d]] = sums[1 + d] / targets;
  }
  if (faults_->overflow(rec->step, par_->world_rank(), par_->world_size())) {
    params_->runtime().fill(grads_->overflow_target(), std::numeric_limits<float>::infinity(), 1);
  }
  // The tied embedding's stage copies, then the data-parallel reduction (gradient_strategy.h).
  KILN_RETURN_IF_ERROR(grads_->reduce());
  // Collectives after backward, and ZeRO-2/3's waits during it: the step's exposed comm time.
  rec->comm_ms = ms_since(c0) + grads_->take_wait_ms();
  return Status::ok();
}

// The learning rate, per-layer statistics and clipping, and the global norm with the overflow
// check (one decision on every rank).
Result<StepStats> Trainer::inspect_gradients(const StepInput& in, StepRecord* rec) {
  const StabilityConfig& sc = config_.stability;
  rec->lr = faults_->learning_rate(
      rec->step, learning_rate(config_.schedule, config_.optimizer.lr, state_.step));
  // Per-layer statistics and clipping read whole gradients: not with ZeRO's sharded ones (yet).
  if (layer_stats_due(rec->step)) rec->grad_norm_layers = unit_grad_norms(*params_, in.scale);
  if (grads_->whole_units()) {  // not ZeRO's shards, not a pipeline's stages
    rec->layers_clipped =
        clip_units(*params_, in.scale, sc.layer_clip_max_norm, sc.layer_clip_factor, &layer_norms_);
  }
  for (const auto& [unit, norm] : rec->layers_clipped) {
    ++stab_.layer_clips;
    KILN_LOG_WARN("step {}: clipped {} on its own (gradient norm {:.4g}; stability.layer_clip)",
                  rec->step, unit, norm);
  }
  KILN_ASSIGN_OR_RETURN(StepStats stats, grads_->inspect(in.scale));
  rec->grad_norm = stats.grad_norm;
  rec->clip_coef = stats.clip_coef;
  rec->loss_mean = spikes_->loss().mean();
  rec->loss_var = spikes_->loss().variance();
  return stats;
}

bool Trainer::layer_stats_due(int64_t step) const {
  const int64_t every = config_.stability.layer_stats_every;
  return grads_->whole_units() && every > 0 && step % every == 0;
}

// The stability decision (engine/stability/decision.h) carried out: the optimizer's update, a
// skip, a rollback (true: the step ends there) or the end of the run; then the loss scaler.
Result<bool> Trainer::decide_and_update(const StepInput& in, const StepStats& stats,
                                        StepRecord* rec) {
  if (stats.finite) {
    stab_.nonfinite_in_row = 0;
    const SpikeCheck check = spikes_->check(rec->step, rec->loss, stats.grad_norm);
    rec->loss_z = check.loss_z;
    rec->grad_z = check.grad_z;
    StepDecision d = decide_finite(config_.stability, check, stab_.rollbacks);
    if (d.spike) {
      ++stab_.spikes;
      if (d.rollbacks_spent) {
        KILN_LOG_WARN(
            "step {}: spike ({}), but stability.spike.max_rollbacks ({}) are spent: "
            "skipping the step instead",
            rec->step, check.why, config_.stability.spike.max_rollbacks);
      }
      if (d.action == StepAction::kRollback) {
        rec->spike = "rollback";
        KILN_LOG_WARN("step {}: spike ({}): rolling back to the last checkpoint", rec->step,
                      check.why);
        KILN_ASSIGN_OR_RETURN(bool rolled, rollback(rec));
        if (rolled) return true;
        KILN_LOG_WARN("step {}: no checkpoint to roll back to: skipping the step instead",
                      rec->step);
        d.action = StepAction::kSkipSpike;
        d.spike_name = spike_action_name(SpikeAction::kSkip);
      }
      rec->spike = d.spike_name;
      if (d.action == StepAction::kUpdate) {
        KILN_LOG_WARN("step {}: spike ({}; loss {:.4f}, grad norm {:.4g})", rec->step, check.why,
                      rec->loss, rec->grad_norm);
      } else {
        rec->skipped = true;
        rec->skip_reason = "spike";
        ++stab_.spike_skips;
        KILN_LOG_WARN("step {}: spike ({}; loss {:.4f}, grad norm {:.4g}): update skipped",
                      rec->step, check.why, rec->loss, rec->grad_norm);
      }
      nlohmann::ordered_json ev = {{"step", rec->step},           {"action", rec->spike},
                                   {"reason", check.why},         {"loss", rec->loss},
                                   {"grad_norm", rec->grad_norm}, {"loss_z", rec->loss_z},
                                   {"grad_z", rec->grad_z}};
      KILN_RETURN_IF_ERROR(log_event(ev.dump()));
    }
    if (!rec->skipped) {
      KILN_RETURN_IF_ERROR(update(in, stats, rec));
      if (!check.spike) spikes_->record_clean(rec->loss, rec->grad_norm);
    }
  } else {
    KILN_RETURN_IF_ERROR(skip_overflow(in, rec));
  }
  const double before = scaler_.scale();
  scaler_.update(!stats.finite);
  if (rec->skipped) {
    ++state_.skipped_steps;
    if (rec->skip_reason == "overflow") {
      KILN_LOG_WARN(
          "step {}: skipped, {} inf/NaN gradient values, first in {}{} ({} skipped so "
          "far)",
          rec->step, rec->nonfinite, rec->nonfinite_layer.empty() ? "?" : rec->nonfinite_layer,
          scaler_.enabled() ? fmt::format("; loss scale {} -> {}", before, scaler_.scale())
                            : std::string(),
          state_.skipped_steps);
    }
  }
  if (scaler_.enabled()) rec->loss_scale = in.scale;
  return false;
}

Status Trainer::update(const StepInput& in, const StepStats& stats, StepRecord* rec) {
  const bool layer_stats = layer_stats_due(rec->step);
  std::vector<std::vector<float>> before;
  if (layer_stats) before = snapshot_masters(*params_);
  KILN_RETURN_IF_ERROR(grads_->apply(rec->lr, in.scale, stats));
  if (layer_stats) rec->update_ratio = update_ratios(*params_, before);
  return Status::ok();
}

// inf/NaN gradients: skipped (and counted, with where they started), or the end of the run.
Status Trainer::skip_overflow(const StepInput& in, StepRecord* rec) {
  rec->skipped = true;
  rec->skip_reason = "overflow";
  KILN_ASSIGN_OR_RETURN(NonFinite nf, grads_->find_nonfinite());
  rec->nonfinite = nf.count;
  rec->nonfinite_layer = nf.first_unit;
  ++stab_.nonfinite_in_row;
  const std::string diagnosis =
      fmt::format("step {}: {} inf/NaN gradient values, first in backward order in {}{}", rec->step,
                  nf.count, nf.first_unit.empty() ? "?" : nf.first_unit,
                  scaler_.enabled() ? fmt::format(" (loss scale {})", in.scale) : std::string());
  const StepDecision d =
      decide_nonfinite(config_.stability, scaler_.enabled(), stab_.nonfinite_in_row);
  if (d.action != StepAction::kStop) return Status::ok();
  if (!scaler_.enabled() && !config_.stability.skip_nonfinite) {
    return Status::internal(diagnosis + " (" + d.why + ")");
  }
  nlohmann::ordered_json ev = {{"step", rec->step},
                               {"action", "stop"},
                               {"reason", diagnosis},
                               {"nonfinite_in_row", stab_.nonfinite_in_row}};
  KILN_RETURN_IF_ERROR(log_event(ev.dump()));
  return Status::internal(fmt::format(
      "stopping: {}; last: {}. Lower the learning rate, check the data around this step, or "
      "resume from an earlier checkpoint",
      d.why, diagnosis));
}

Status Trainer::from_last_stage(std::vector<double>* values, size_t own, const char* what) {
  // Zeros elsewhere make the sum exact (x + 0 is x).
  if (!pipeline_->last()) std::fill(values->begin(), values->end() - own, 0.0);
  return par_->pp_group()
      .allreduce(values->data(), values->size(), comm::DType::kFloat64, comm::ReduceOp::kSum)
      .prefixed(fmt::format("{} over the pipeline stages", what));
}

// Evaluation and the mixing policy see the weights after this step's update.
Status Trainer::observe(const StepInput& in, StepRecord* rec) {
  // With pipeline stages the forward pass runs through them, the last stage's results are
  // shared with the others (summed over the stages with zeros elsewhere, exact), so every rank
  // logs and decides the same.
  ForwardPass pass;
  if (pipeline_) {
    pass = [this](const std::vector<DeviceBatches::Tokens>& toks,
                  const std::vector<float*>& losses) {
      std::vector<PpMicroBatch> mbs;
      for (size_t i = 0; i < toks.size(); ++i)
        mbs.push_back({toks[i].inputs, toks[i].targets, losses[i], toks[i].doc_start});
      return pipeline_->forward(mbs);
    };
  }
  auto share = [&](std::vector<double>* v) -> Status {
    return pipeline_ ? from_last_stage(v, 0, "evaluation") : Status::ok();
  };
  if (eval_ && rec->step % config_.eval.every_steps == 0) {
    KILN_ASSIGN_OR_RETURN(rec->val_loss, eval_->evaluate(*model_, pass));
    std::vector<double> v;
    for (const auto& [d, loss] : rec->val_loss) v.push_back(loss);
    KILN_RETURN_IF_ERROR(share(&v));
    size_t i = 0;
    for (auto& [d, loss] : rec->val_loss) loss = v[i++];
    mix_->observe_val(rec->val_loss);
  }
  if (task_eval_ && rec->step % config_.eval.every_steps == 0) {
    KILN_ASSIGN_OR_RETURN(auto results, task_eval_->evaluate(*model_, pass));
    std::vector<double> v;
    for (const auto& [name, r] : results) v.insert(v.end(), {r.acc, r.acc_norm});
    KILN_RETURN_IF_ERROR(share(&v));
    size_t i = 0;
    for (const auto& [name, r] : results) {
      rec->tasks[name] = {{"acc", v[i]}, {"acc_norm", v[i + 1]}};
      i += 2;
    }
  }
  mix_->observe_step(rec->domain_loss, in.domain_sequences);
  KILN_ASSIGN_OR_RETURN(std::optional<loader::DomainWeights> mixed, mix_->after_step(rec->step));
  if (mixed) KILN_RETURN_IF_ERROR(batches_->set_weights(*mixed));
  rec->mixing_policy = mix_->state().policy;
  rec->mixing_paused = mix_->state().paused;
  return Status::ok();
}

// The trainer state after the step, the speed and memory figures, the metrics line.
Result<StepRecord> Trainer::record(StepRecord rec, const StepInput& in,
                                   std::chrono::steady_clock::time_point t0) {
  state_.step = rec.step;
  state_.tokens += in.valid;
  state_.adam_updates = optimizer_->updates();
  state_.scaler = scaler_.state();
  rec.tokens = state_.tokens;
  const double secs = seconds_since(t0);
  rec.step_ms = secs * 1e3;
  rec.tokens_per_s = secs > 0 ? static_cast<double>(in.valid) / secs : 0.0;
  if (par_->world_size() > 1) {
    std::map<std::string, uint64_t> now = par_->comm_bytes();
    for (const auto& [k, v] : now) {
      const uint64_t before_step = comm_seen_.count(k) ? comm_seen_[k] : 0;
      if (v > before_step) rec.comm_bytes[k] = v - before_step;
    }
    comm_seen_ = std::move(now);
  }
  if (peak_flops_) rec.mfu = rec.tokens_per_s * flops_per_token_ / *peak_flops_;
  const DeviceMemory dm = params_->runtime().memory();
  if (dm.total > 0) {  // a device with its own memory
    device_memory_peak_ = std::max({device_memory_peak_, dm.used_by_process, dm.peak});
    rec.device_memory_peak_mib = static_cast<double>(device_memory_peak_) / (1024.0 * 1024.0);
  }
  if (metrics_) KILN_RETURN_IF_ERROR(metrics_->append(rec));  // rank 0 alone writes files
  history_.push_back(rec);
  return rec;
}

void Trainer::print_progress(const StepRecord& r) {
  // Single steps are noisy on small batches: also show the mean since the previous line.
  double sum = 0;
  int n = 0;
  for (auto it = history_.rbegin(); it != history_.rend() && it->step > last_printed_step_; ++it) {
    if (std::isfinite(it->loss)) {
      sum += it->loss;
      ++n;
    }
  }
  last_printed_step_ = r.step;
  std::string line =
      fmt::format("step {:>{}}/{} | loss {:.4f}", r.step, std::to_string(config_.run.steps).size(),
                  config_.run.steps, r.loss);
  if (n > 1) line += fmt::format(" (mean of {} steps {:.4f})", n, sum / n);
  line += fmt::format(" | lr {:.2e} | grad norm {:.3f} | {} tok/s | {:.0f} ms", r.lr, r.grad_norm,
                      human_count(r.tokens_per_s), r.step_ms);
  if (r.mfu) line += fmt::format(" | MFU {:.1f}%", 100.0 * *r.mfu);
  if (r.loss_scale) line += fmt::format(" | scale {:g}", *r.loss_scale);
  if (r.skipped) line += " | SKIPPED (" + r.skip_reason + ")";
  // ETA from the mean step time of this process so far.
  const int64_t done = r.step - run_first_step_;
  const int64_t left = config_.run.steps - r.step;
  if (done > 0 && left > 0) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start_).count() /
        done * left;
    line += secs >= 60 ? fmt::format(" | ETA {}m{:02d}s", static_cast<int64_t>(secs) / 60,
                                     static_cast<int>(secs) % 60)
                       : fmt::format(" | ETA {:.0f}s", secs);
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

Status Trainer::save() {
  // Every data-parallel rank's loader position, merged on rank 0 into one state that resumes on
  // any number of ranks. Replicated states (ZeRO-0 without tensor parallelism): rank 0 writes
  // them. Otherwise every rank that holds states of its own writes its file into the directory
  // rank 0 prepares — with ZeRO-1/2/3 every rank its shards, with tensor parallelism (ZeRO-0)
  // data-parallel rank 0 of each TP rank its slices — and rank 0 completes it
  // (engine/checkpoint/checkpoint.h).
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> per_rank, par_->gather(batches_->state()));
  Status written = Status::ok();
  state_.extra["mixing"] = mix_->state_json();
  state_.extra["stability"] = stab_.to_json(*spikes_);
  const auto t0 = std::chrono::steady_clock::now();
  if (par_->is_root()) {
    auto merged = data_->merge_states(per_rank);
    if (merged.is_ok()) {
      state_.data_state = *merged;
      state_.mixture_hash = mixture_->applied_hash();
      state_.scaler = scaler_.state();
      state_.adam_updates = optimizer_->updates();
      state_.precision = precision_name(config_.precision);
    } else {
      written = merged.status();
    }
  }
  ZeroOptimizer* zero = par_->zero();
  const int64_t tp = par_->tp_size();
  CheckpointLayout layout;
  layout.world = par_->world_size();
  layout.dp = par_->size();
  layout.tp = tp;
  layout.zero_stage = config_.parallel.zero_stage;
  layout.partitions = zero ? par_->size() : 1;
  layout.tp_partitions = tp;
  // Pipeline stages: each writes the units it owns (the stage bounds are gathered from them).
  layout.pp = params_->pp_stage().size;
  if (layout.sharded()) {
    KILN_RETURN_IF_ERROR(save_sharded_checkpoint(*par_, par_->checkpoint_shard(*params_),
                                                 config_.run.dir, *params_, state_, config_yaml_,
                                                 config_.checkpoint.keep_last, layout, &written));
  } else if (par_->is_root() && written.is_ok()) {
    written = save_checkpoint(config_.run.dir, *params_, state_, config_yaml_,
                              config_.checkpoint.keep_last, layout);
  }
  KILN_RETURN_IF_ERROR(par_->agree(std::move(written)));
  last_saved_step_ = state_.step;
  const int64_t files = layout.sharded() ? layout.partitions * layout.tp_partitions * layout.pp : 0;
  KILN_LOG_INFO(
      "checkpoint {} written ({:.0f} ms{})", checkpoint_dir_name(state_.step),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      files > 0 ? fmt::format(", {} shard files", files) : "");
  return Status::ok();
}

Status Trainer::run() {
  StopSignals stop_signals("training after the current step");

  const int64_t first = state_.step;
  last_printed_step_ = first;
  run_first_step_ = first;
  run_start_ = std::chrono::steady_clock::now();
  if (first >= config_.run.steps) {
    KILN_LOG_INFO("nothing to do: the run is at step {} of run.steps {}", first, config_.run.steps);
  }
  double first_loss = NAN, last_loss = NAN;
  const auto t0 = std::chrono::steady_clock::now();
  while (state_.step < config_.run.steps) {
    KILN_ASSIGN_OR_RETURN(StepRecord rec, step());
    if (std::isnan(first_loss)) first_loss = rec.loss;
    last_loss = rec.loss;
    if (options_.console && (rec.step % config_.run.log_every == 0 || rec.step == first + 1 ||
                             rec.skipped || rec.step == config_.run.steps)) {
      print_progress(rec);
    }
    const int64_t every = config_.checkpoint.every_steps;
    if (every > 0 && rec.step % every == 0 && rec.step == state_.step) KILN_RETURN_IF_ERROR(save());
    // Every rank stops after the same step when any rank got the signal (SIGTERM / SIGINT /
    // SIGUSR1): finish the step, checkpoint, exit 0 so a requeued job resumes from it.
    int64_t sig_any = StopSignals::requested();
    if (par_->world_size() > 1) {
      // Over the world: a signal to one stage or TP rank must stop its peers too.
      int64_t v[1] = {sig_any};
      KILN_RETURN_IF_ERROR(par_->sum_world(v, 1));
      sig_any = v[0] ? (StopSignals::requested() ? StopSignals::requested() : SIGTERM) : 0;
    }
    if (int sig = static_cast<int>(sig_any)) {
      if (last_saved_step_ != state_.step) KILN_RETURN_IF_ERROR(save());
      KILN_LOG_WARN(
          "stopped by {} after step {} of {}: checkpoint {} is complete; run the same "
          "command with --resume to continue",
          StopSignals::requested() ? StopSignals::name(sig) : "a signal to another rank",
          state_.step, config_.run.steps, checkpoint_dir_name(state_.step));
      return Status::ok();
    }
  }
  if (config_.checkpoint.at_end && last_saved_step_ != state_.step && state_.step > 0) {
    KILN_RETURN_IF_ERROR(save());
  }
  KILN_RETURN_IF_ERROR(mix_->write_result());
  if (batches_->prefetched_steps() > 0 || batches_->discarded() > 0) {
    KILN_LOG_INFO(
        "next-step prefetch: {} steps found their batches drawn during the step before; "
        "{} micro-batches drawn ahead were dropped (the weights changed first) and drawn "
        "again",
        batches_->prefetched_steps(), batches_->discarded());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  if (state_.step > first) {
    KILN_LOG_INFO(
        "trained steps {}..{} in {:.1f} s: loss {:.4f} -> {:.4f}; {} steps skipped; "
        "peak memory {}",
        first + 1, state_.step, secs, first_loss, last_loss, state_.skipped_steps,
        mib(static_cast<size_t>(ru.ru_maxrss) * 1024));
    if (par_->zero() && par_->zero()->stage() >= 2) {
      KILN_LOG_INFO(
          "ZeRO-{}: gathered weights and full gradient buffers peaked at {} bytes on "
          "rank {}",
          par_->zero()->stage(), par_->zero()->peak_buffer_bytes(), par_->world_rank());
    }
    // Every rank: what it allocated through the backend at most (model states, activations,
    // staged batches, communication buffers), beside `kiln plan`'s per-rank figure.
    const DeviceMemory dm = params_->runtime().memory();
    KILN_LOG_INFO(
        "world rank {} (pipeline stage {} of {}, {} micro-batch(es) in flight): peak {} bytes "
        "allocated through the backend",
        par_->world_rank(), par_->pp_rank(), par_->pp_size(), model_->pp_slots(), dm.peak);
    if (device_memory_peak_ > 0) {
      KILN_LOG_INFO("peak device memory {} ({})", mib(device_memory_peak_),
                    params_->runtime().describe());
    }
  }
  return Status::ok();
}

}  // namespace kiln::engine
