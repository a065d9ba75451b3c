// The sharded checkpoint's save protocol (ZeRO, tensor or pipeline parallelism), run by every
// rank together: rank 0 begins the checkpoint (a fresh temporary directory, sent to every rank),
// every rank that holds states of its own writes its partition file there and reports it, and
// rank 0, once every rank's report has arrived, checks them and completes the checkpoint
// (engine/checkpoint/checkpoint.h has the files). A report is a ShardReport, typed at both ends
// (text only on the wire). A failure on one rank is every rank's (ShardedSaveGroup::agree), so no
// rank waits in a collective for a rank that gave up.
//
// Thread safety: one call per rank at a time, every rank of the world calling.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/checkpoint/checkpoint.h"

namespace kiln::engine {

// What one writing rank hands rank 0 after writing its file.
struct ShardReport {
  int64_t stage = 0;        // pipeline stage
  int64_t first_block = 0;  // the stage's blocks [first_block, end_block)
  int64_t end_block = 0;
  int64_t tp_rank = 0;
  int64_t partition = 0;           // data-parallel partition (file index)
  uint64_t file_hash = 0;          // the file's XXH3-64
  uint64_t replicated_digest = 0;  // replicated_digest() of what it wrote

  std::string encode() const;
  // kInternal naming `rank` when the text is not a report.
  static Result<ShardReport> decode(const std::string& text, size_t rank);
};

// Rank 0's check of every rank's report (reports[w]: world rank w's encoded report, "" when it
// wrote none): each file of `layout` reported exactly once, the stages agreeing on their block
// boundaries (filled into layout->pp_bounds with pp > 1), the replicated tensors' digests equal
// on every TP rank of a partition. Returns the files' hashes in file order (stage, TP rank,
// partition); kInternal naming the rank, file, boundary or TP rank otherwise.
Result<std::vector<uint64_t>> check_shard_reports(const std::vector<std::string>& reports,
                                                  CheckpointLayout* layout);

// The collectives the protocol runs over (the trainer's rank groups implement it).
class ShardedSaveGroup {
 public:
  virtual ~ShardedSaveGroup() = default;
  virtual bool is_root() const = 0;  // world rank 0
  // Every rank gets the first error of any rank (or OK).
  virtual Status agree(Status local) = 0;
  virtual Status broadcast(std::string* blob) = 0;  // rank 0's value to every rank
  // Every world rank's value, in world-rank order, on rank 0 (others get an empty list).
  virtual Result<std::vector<std::string>> gather_world(const std::string& mine) = 0;
};

// What this rank writes: nothing (writes false), or partition `index` (of layout.partitions) of
// its TP rank and stage, the views `views` returns (host copies in scratch).
struct ShardContent {
  bool writes = false;
  int64_t index = 0;
  int64_t tp_rank = 0;
  std::function<std::vector<TensorView>(std::deque<std::vector<float>>* scratch)> views;
};

// One checkpoint of run_dir at state.step. *written: rank 0's state so far in (an error there is
// every rank's), the checkpoint's result out (rank 0; the caller agrees it with every rank).
// Errors returned: a collective failed or a rank failed to write its file.
Status save_sharded_checkpoint(ShardedSaveGroup& group, const ShardContent& content,
                               const std::string& run_dir, const ParamStore& params,
                               const TrainerState& state, const std::string& config_yaml,
                               int64_t keep_last, CheckpointLayout layout, Status* written);

}  // namespace kiln::engine
