// Writing shards: ShardWriter writes one shard file; RollingShardWriter writes a numbered series
// of them ("<dir>/<prefix>-NNNNNN<ext>"), several files at once. See format/shard.h for the
// sample format and docs/FORMATS.md "Shards".
//
// Writers write "<path>.partial" and rename it to <path> only when the shard is complete
// (fsyncing the file and the directory), so a killed process never leaves a file that looks
// complete; a writer destroyed before it finished removes its .partial files. Shards are
// deterministic: the same samples give the same bytes, whatever the thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "format/shard.h"

namespace kiln {

// Writes one shard. Not thread-safe.
class ShardWriter {
 public:
  virtual ~ShardWriter() = default;
  // Opens "<path>.partial" for writing (creating the directory). path must end in
  // shard_extension(compression); zstd_level outside zstd's range is kConfig.
  static Result<std::unique_ptr<ShardWriter>> open(const std::string& path,
                                                   ShardCompression compression,
                                                   int zstd_level = 3);
  // Validates the key and member exts (sorted into the fixed order), then appends.
  virtual Status add(const ShardSample& sample, uint64_t tokens = 0) = 0;
  // Uncompressed tar bytes written so far.
  virtual uint64_t tar_bytes() const = 0;
  virtual uint64_t samples() const = 0;
  // Finishes the archive, fsyncs, renames .partial to the final path, fsyncs the directory.
  // Destroying a writer that was not closed (or whose close failed) removes the .partial file.
  virtual Result<ShardInfo> close() = 0;
};

// The threads and the memory budget RollingShardWriters write with. Several writers can share one
// (`kiln prep` writes one series per domain): a writer whose samples queued for writing pass the
// budget helps with the writing until the pool's queue is below it again. Thread-safe.
class ShardWritePool {
 public:
  // max_queued_bytes 0: max(64 MiB, 4 chunks of 8 MiB per thread).
  explicit ShardWritePool(uint64_t max_queued_bytes = 0);
  ~ShardWritePool();  // waits for the queued work
  ShardWritePool(const ShardWritePool&) = delete;
  ShardWritePool& operator=(const ShardWritePool&) = delete;

 private:
  friend class RollingShardWriter;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes samples, handed over in order by one thread, into a series of shards and starts the next
// shard when the next sample would pass max_samples or max_tar_bytes (0 = no limit). Bytes count
// as sample_tar_bytes() (the end-of-archive blocks and record padding, at most 10 KiB, come on
// top); a sample larger than the limit gets a shard of its own. Which samples go to which shard is
// decided as they arrive, so the output does not depend on timing; the samples are then queued
// in chunks and written by pool tasks, one task at a time per shard but shards in parallel, so
// compression is not one serial stage. Shards are opened lazily: finish() with no samples added
// writes nothing. add() and finish() are called by one thread.
class RollingShardWriter {
 public:
  struct Options {
    std::string dir;
    std::string prefix;
    ShardCompression compression = ShardCompression::kZstd;
    int zstd_level = 3;
    uint64_t max_samples = 10000;
    uint64_t max_tar_bytes = 256ull << 20;
    uint64_t first_index = 0;  // NNNNNN of the first shard
  };
  // pool null: the writer makes its own.
  explicit RollingShardWriter(Options options, std::shared_ptr<ShardWritePool> pool = nullptr);
  ~RollingShardWriter();  // waits for its tasks; removes the .partial of unfinished shards
  RollingShardWriter(const RollingShardWriter&) = delete;
  RollingShardWriter& operator=(const RollingShardWriter&) = delete;

  // Validates the sample (kData at once) and queues it; a write error of an earlier sample is
  // returned here or by finish().
  Status add(ShardSample sample, uint64_t tokens = 0);
  // Closes every shard, waits for the writing and returns the shards in order.
  Result<std::vector<ShardInfo>> finish();

 private:
  struct Shard;
  void submit(Shard* shard, bool close);
  void drain(Shard* shard);
  Status first_error();

  Options options_;
  std::shared_ptr<ShardWritePool> pool_;
  std::vector<std::unique_ptr<Shard>> shards_;
  Shard* open_ = nullptr;
  uint64_t next_index_;
  struct Errors;
  std::unique_ptr<Errors> errors_;
};

}  // namespace kiln
