#include "engine/checkpoint/sharded_save.h"

#include <fmt/format.h>

#include <sstream>

#include "common/hash.h"
#include "common/log.h"

namespace kiln::engine {

std::string ShardReport::encode() const {
  return fmt::format("{} {} {} {} {} {} {}", stage, first_block, end_block, tp_rank, partition,
                     hex64(file_hash), hex64(replicated_digest));
}

Result<ShardReport> ShardReport::decode(const std::string& text, size_t rank) {
  std::istringstream in(text);
  ShardReport r;
  r.stage = r.first_block = r.end_block = r.tp_rank = r.partition = -1;
  std::string hash_hex, digest_hex;
  in >> r.stage >> r.first_block >> r.end_block >> r.tp_rank >> r.partition >> hash_hex >>
      digest_hex;
  auto hash = parse_hex64(hash_hex);
  auto digest = parse_hex64(digest_hex);
  if (!in || !hash.is_ok() || !digest.is_ok()) {
    return Status::internal("checkpoint: rank " + std::to_string(rank) +
                            " reported an unreadable file: " + text);
  }
  r.file_hash = *hash;
  r.replicated_digest = *digest;
  return r;
}

Result<std::vector<uint64_t>> check_shard_reports(const std::vector<std::string>& reports,
                                                  CheckpointLayout* layout) {
  const int64_t tp = layout->tp_partitions, pp = layout->pp, P = layout->partitions;
  // The files are listed stage first, then TP rank, then partition (tensor_files).
  const size_t files = static_cast<size_t>(pp * tp * P);
  std::vector<uint64_t> hash(files, 0), digest(files, 0);
  std::vector<bool> have(files, false);
  layout->pp_bounds.assign(pp > 1 ? static_cast<size_t>(pp + 1) : 0, -1);
  for (size_t w = 0; w < reports.size(); ++w) {
    if (reports[w].empty()) continue;
    KILN_ASSIGN_OR_RETURN(ShardReport r, ShardReport::decode(reports[w], w));
    if (r.stage < 0 || r.stage >= pp || r.tp_rank < 0 || r.tp_rank >= tp || r.partition < 0 ||
        r.partition >= P) {
      return Status::internal("checkpoint: rank " + std::to_string(w) +
                              " reported an unreadable file: " + reports[w]);
    }
    const size_t at = static_cast<size_t>((r.stage * tp + r.tp_rank) * P + r.partition);
    hash[at] = r.file_hash;
    digest[at] = r.replicated_digest;
    have[at] = true;
    if (pp <= 1) continue;
    for (auto [i, b] : {std::pair{r.stage, r.first_block}, std::pair{r.stage + 1, r.end_block}}) {
      int64_t& slot = layout->pp_bounds[static_cast<size_t>(i)];
      if (slot >= 0 && slot != b) {
        return Status::internal(
            fmt::format("checkpoint: pipeline stages disagree on block boundary {} ({} and {}): "
                        "checkpoint not written",
                        i, slot, b));
      }
      slot = b;
    }
  }
  for (size_t f = 0; f < files; ++f) {
    if (!have[f]) {
      return Status::internal("checkpoint: no rank wrote file " + std::to_string(f) + " of " +
                              std::to_string(files) + ": checkpoint not written");
    }
  }
  // The replicated parameters (norms, wpe, row-parallel biases) live by being bit-identical on
  // every TP rank: each partition's digest must agree across the TP ranks of its stage.
  for (int64_t s = 0; s < pp; ++s) {
    for (int64_t t = 1; t < tp; ++t) {
      for (int64_t r = 0; r < P; ++r) {
        if (digest[static_cast<size_t>((s * tp + t) * P + r)] !=
            digest[static_cast<size_t>(s * tp * P + r)]) {
          return Status::internal(fmt::format(
              "replicated parameters differ between tensor-parallel ranks 0 and {} (partition "
              "{}{}): checkpoint not written",
              t, r, pp > 1 ? fmt::format(", pipeline stage {}", s) : std::string()));
        }
      }
    }
  }
  if (tp > 1)
    KILN_LOG_INFO("checkpoint: replicated tensors identical on {} tensor-parallel ranks", tp);
  return hash;
}

Status save_sharded_checkpoint(ShardedSaveGroup& group, const ShardContent& content,
                               const std::string& run_dir, const ParamStore& params,
                               const TrainerState& state, const std::string& config_yaml,
                               int64_t keep_last, CheckpointLayout layout, Status* written) {
  const PpStage stage = params.pp_stage();
  const int64_t end_block = stage.end_block < 0 ? params.model().n_layers : stage.end_block;
  std::string tmp;
  if (group.is_root() && written->is_ok()) {
    auto begun = begin_checkpoint(run_dir, state.step);
    if (begun.is_ok())
      tmp = *begun;
    else
      *written = begun.status();
  }
  KILN_RETURN_IF_ERROR(group.agree(std::move(*written)));
  KILN_RETURN_IF_ERROR(group.broadcast(&tmp));
  // Writers report; every rank of every stage takes part in the gather.
  std::string mine;
  Status local = Status::ok();
  if (content.writes) {
    std::deque<std::vector<float>> scratch;
    const std::vector<TensorView> views = content.views(&scratch);
    auto hash =
        write_checkpoint_partition(tmp, content.index, layout.partitions, views, content.tp_rank,
                                   layout.tp_partitions, stage.rank, layout.pp);
    if (hash.is_ok()) {
      ShardReport r;
      r.stage = stage.rank;
      r.first_block = stage.first_block;
      r.end_block = end_block;
      r.tp_rank = content.tp_rank;
      r.partition = content.index;
      r.file_hash = *hash;
      r.replicated_digest = replicated_digest(params, content.index, layout.partitions, views);
      mine = r.encode();
    } else {
      local = hash.status();
    }
  }
  KILN_RETURN_IF_ERROR(group.agree(std::move(local)));
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> got, group.gather_world(mine));
  *written = Status::ok();
  if (group.is_root()) {
    // (A bad report sets *written: every rank still meets rank 0 in the caller's agreement.)
    auto hashes = check_shard_reports(got, &layout);
    if (!hashes.is_ok()) {
      *written = hashes.status();
    } else {
      *written =
          finish_checkpoint(run_dir, tmp, params, state, config_yaml, keep_last, layout, *hashes);
    }
  }
  return Status::ok();
}

}  // namespace kiln::engine
