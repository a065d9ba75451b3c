// Training checkpoints: RUN/checkpoints/step-NNNNNNNN/ with RUN/checkpoints/latest naming the
// newest complete one.
//
// A checkpoint directory holds
//   meta.json               the layout that wrote it: world, dp, tp, zero_stage, precision, the
//                           number of partitions P and the files holding them, every unit's
//                           length and partition length, every tensor's global shape, unit,
//                           offset and split (format "kiln-checkpoint/2"); with pipeline
//                           parallelism also pp, the stages (each one's blocks, units and files)
//                           and every unit's stage (format "kiln-checkpoint/2.1", below)
//   P = 1 (replicated states: ZeRO-0, or one data-parallel rank; rank 0 writes):
//     model.safetensors     fp32 master weights, one tensor per parameter (names as ParamStore)
//     optimizer.safetensors AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq" (fp32)
//   P = dp (ZeRO-1/2/3: every data-parallel rank writes its own):
//     shard-RRRRR-of-PPPPP.safetensors   for every unit "<unit>.master", "<unit>.exp_avg",
//                           "<unit>.exp_avg_sq" (fp32, [S]): the unit's flat elements
//                           [R*S, R*S + S), zero past its end (S = shard_numel(N, P), plan.h)
//   tensor parallelism (tp > 1, tp_partitions = tp): every TP rank writes its own slices, P
//   files each (P = dp with ZeRO-1/2/3, else 1 written by data-parallel rank 0):
//     shard-tpTTTTT-of-TTTTT-dpRRRRR-of-PPPPP.safetensors   as above, of TP rank T's units
//                           (meta.json gives every tensor's global shape and tp_split)
//   pipeline parallelism (pp > 1, format "kiln-checkpoint/2.1"): every stage writes the units it
//   owns - its blocks, the embeddings on the first stage, the final unit on the last (the last
//   stage's copy of tied embeddings is not written: it equals the first stage's) - in the files
//   of the layout above, one set per stage (P files per TP rank, written as above):
//     shard-ppSSSSS-of-SSSSS-tpTTTTT-of-TTTTT-dpRRRRR-of-PPPPP.safetensors
//                           (tp and dp parts always present); meta.json's "pp_stages" lists
//                           each stage's blocks [first, end), units and files, and every unit
//                           names its "stage". With pp = 1 the names and format are as before.
//   state.json              step, AdamW update count, tokens, skipped steps, loss-scaler state,
//                           data (loader) state, applied mixture-file hash, seed, precision,
//                           model shape, and the XXH3-64 of every tensor file
//   config.yaml             the resolved config of the run
// It is written under a temporary name (every rank writes its file there), fsynced and renamed
// by rank 0 after every file is complete (every rank of every stage has handed in its file's
// checksum), state.json last, so it appears complete or not at all; `latest` is then replaced
// atomically and directories beyond keep_last are removed (oldest first). Loading
// (CheckpointReader) checks the model shape and the checksums, naming the file on any mismatch,
// and reads any range of a rank's units from any number of partitions, any tensor-parallel size
// and any pipeline split (a unit from the file of the stage that wrote it), so a checkpoint
// resumes on another data-parallel size, ZeRO stage, TP size or PP size with each rank reading
// only the byte ranges it keeps (no whole tensor or file is held; a stage's store fills only
// the units it holds); the precision may differ (the stored tensors are fp32 either
// way). The low-precision working copy is not stored: it is re-derived from the master weights by
// the same rounding, so resumed training is bit-identical. Checkpoints of format 1 (no meta.json,
// per-tensor files) still load.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/loss_scaler.h"
#include "engine/model/params.h"

namespace kiln::engine {

struct TrainerState {
  int64_t step = 0;          // optimizer steps completed
  int64_t adam_updates = 0;  // steps that updated the weights (AdamW bias correction)
  int64_t tokens = 0;        // tokens trained on (cumulative, skipped steps included)
  int64_t skipped_steps = 0;
  LossScaler::State scaler;
  std::string data_state;     // DataSource::state()
  uint64_t mixture_hash = 0;  // MixtureWatcher::applied_hash()
  uint64_t seed = 0;
  std::string precision;  // of the run that wrote the checkpoint ("fp32", "bf16", "fp16")
  // Further components' states by name (JSON text each): "mixing" (the mixing policy),
  // "stability" (spike statistics, rollbacks, quarantined data).
  std::map<std::string, std::string> extra;
};

std::string checkpoint_dir_name(int64_t step);  // "step-00000012"

// The layout a checkpoint records in meta.json.
struct CheckpointLayout {
  int64_t world = 1, dp = 1, tp = 1, zero_stage = 0;
  int64_t partitions = 1;     // data-parallel partitions: 1 (replicated), dp (ZeRO-1/2/3 shards)
  int64_t tp_partitions = 1;  // 1: whole tensors; tp: one set of files per TP rank (its slices)
  // Pipeline stages: stage s owns blocks [pp_bounds[s], pp_bounds[s + 1]) (pp + 1 values, 0 ...
  // n_layers; empty with pp 1), the embeddings the first, the final unit the last.
  int64_t pp = 1;
  std::vector<int64_t> pp_bounds;
  // Per-rank shard files (else model.safetensors + optimizer.safetensors, whole tensors).
  bool sharded() const { return partitions > 1 || tp_partitions > 1 || pp > 1; }
};

// The stage of `layout` whose files hold unit `unit` of a model of n_layers blocks (units: embed,
// blocks.0 ... blocks.{n_layers - 1}, final): 0 without pipelining.
int64_t checkpoint_unit_stage(const CheckpointLayout& layout, int64_t n_layers, int unit);
// Whether params' stage writes unit `unit`: the units it holds, except the last stage's copy of
// tied embeddings (the first stage's is written). Every unit without pipelining.
bool checkpoint_owns(const ParamStore& params, int unit);

// Writes RUN/checkpoints/step-NNNNNNNN from one process's full ParamStore (P = 1), updates latest,
// prunes to keep_last (0: keep all).
Status save_checkpoint(const std::string& run_dir, const ParamStore& params,
                       const TrainerState& state, const std::string& config_yaml, int64_t keep_last,
                       const CheckpointLayout& layout = {});

// The sharded write, in three parts: rank 0 begins (a fresh temporary directory, its path
// returned for every rank), every rank writes its partition there and hands its checksum to
// rank 0, which finishes (meta.json, config.yaml, state.json last, rename, latest, pruning).
Result<std::string> begin_checkpoint(const std::string& run_dir, int64_t step);
// tensors: the partition's "<unit>.master" / ".exp_avg" / ".exp_avg_sq" views (of TP rank
// tp_rank's units of pipeline stage pp_stage: the units it owns, checkpoint_owns()). Returns the
// file's XXH3-64.
Result<uint64_t> write_checkpoint_partition(const std::string& tmp_dir, int64_t index,
                                            int64_t partitions,
                                            const std::vector<TensorView>& tensors,
                                            int64_t tp_rank = 0, int64_t tp_parts = 1,
                                            int64_t pp_stage = 0, int64_t pp_stages = 1);
// shard-00001-of-00002.safetensors; with tp_parts > 1 shard-tp00000-of-00002-dp00001-of-00002...;
// with pp_stages > 1 shard-pp00001-of-00002-tp00000-of-00001-dp00000-of-00001.safetensors.
std::string partition_file_name(int64_t index, int64_t partitions, int64_t tp_rank = 0,
                                int64_t tp_parts = 1, int64_t pp_stage = 0, int64_t pp_stages = 1);
// The single partition (P = 1) of the units params' stage owns (checkpoint_owns(); all without
// pipelining): "<unit>.master" / ".exp_avg" / ".exp_avg_sq", views of its buffers (host copies
// in *scratch when the backend's memory is not the host's).
std::vector<TensorView> unit_partition(const ParamStore& params,
                                       std::deque<std::vector<float>>* scratch);
// `views` ("<unit>.<field>", e.g. a ZeRO rank's shards) less those of units params' stage does
// not own (checkpoint_owns()), in their order.
std::vector<TensorView> owned_views(const ParamStore& params, std::vector<TensorView> views);
// A digest of the replicated tensors' (split_dim < 0) elements inside partition `index` of
// `partitions` (views as written: three per owned unit, in unit order): equal on every TP rank
// of a stage when they hold the same bits.
uint64_t replicated_digest(const ParamStore& params, int64_t index, int64_t partitions,
                           const std::vector<TensorView>& views);
Status finish_checkpoint(const std::string& run_dir, const std::string& tmp_dir,
                         const ParamStore& params, const TrainerState& state,
                         const std::string& config_yaml, int64_t keep_last,
                         const CheckpointLayout& layout,
                         const std::vector<uint64_t>& partition_hashes);
// The directory `latest` names; kNotFound when the run has no checkpoint.
Result<std::string> latest_checkpoint(const std::string& run_dir);
// The trainer state a checkpoint directory records (state.json only; no tensor is read), for
// tools that report on a run (`kiln mix show`).
Result<TrainerState> read_trainer_state(const std::string& dir);
// A checkpoint (or a consolidated file) opened for reading model states in ranges: a
// StateSource for the run's layout (`params`: this rank's TP slice, with or without buffers).
// A read of a unit's elements [begin, begin + n) reads only the byte ranges of the files that
// hold them - from any writer's layout: data-parallel partitions of any count, another TP size's
// slices (the elements this rank's slice shares with each source TP rank's), the files of the
// pipeline stage that wrote the unit (any PP size and split), whole tensors - so
// a ZeRO rank reads only its shard and no rank assembles a whole tensor or file in memory. Each
// file's XXH3-64 (state.json) is verified the first time it is read from (streamed), so a rank
// checks exactly the files it uses. Not thread-safe.
class CheckpointReader final : public StateSource {
 public:
  // Reads state.json (trainer state into *state) and meta.json (*layout, optional); checks the
  // model shape against params' (which must outlive the reader).
  static Result<std::unique_ptr<CheckpointReader>> open(const std::string& dir,
                                                        const ParamStore& params,
                                                        TrainerState* state,
                                                        CheckpointLayout* layout = nullptr);
  // A safetensors file of whole fp32 tensors named as the model's (`kiln checkpoint
  // consolidate`): the master weights, moments zero. Its "model" metadata, when present, must
  // match params' shape; every tensor must be there with its whole shape. Errors name the file
  // and `key` (the config key that named it).
  static Result<std::unique_ptr<CheckpointReader>> open_consolidated(const std::string& path,
                                                                     const ParamStore& params,
                                                                     const std::string& key);
  ~CheckpointReader() override;
  Status read(int unit, ParamField f, size_t begin, size_t n, float* dst) override;
  bool zero_moments() const override;
  // Source TP ranks whose files were read from so far.
  int64_t tp_sources_read() const;
  // Source pipeline stages whose files were read from so far (1 without pipelining).
  int64_t pp_sources_read() const;
  // Tensor bytes read so far.
  uint64_t bytes_read() const;
  // After the reads: logs how the states were resharded when the checkpoint was written with
  // another tensor-parallel size or pipeline split than params' (nothing otherwise).
  void log_reshard() const;

 private:
  CheckpointReader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a load did beside filling its destination.
struct LoadStats {
  // How many source TP ranks' files were read (with another tensor-parallel size: those whose
  // slices share elements with this rank's; else 1).
  int64_t reshard_sources = 0;
  // How many source pipeline stages' files were read (1 without pipelining).
  int64_t pp_sources = 0;
};
// Loads master weights and moments into params (allocated buffers; then refreshes the
// low-precision copy) from any layout, through a CheckpointReader: nothing but params' own
// buffers (and, on a GPU, a kStateChunk host staging buffer) is held. *layout (optional)
// receives the writer's; *stats (optional) what it read.
Status load_checkpoint(const std::string& dir, ParamStore* params, TrainerState* state,
                       CheckpointLayout* layout = nullptr, LoadStats* stats = nullptr);
// The model shape and precision a checkpoint was written with (for tools that load one without
// a run's config, e.g. `kiln checkpoint consolidate`).
Result<std::pair<ModelConfig, Precision>> checkpoint_model(const std::string& dir);
// The model shape as state.json and a consolidated file's "model" metadata hold it (JSON text).
std::string model_shape_json(const ModelConfig& m);

}  // namespace kiln::engine
