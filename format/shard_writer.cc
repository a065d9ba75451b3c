#include "format/shard_writer.h"

#include <archive.h>
#include <archive_entry.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <utility>

#include "common/atomic_file.h"
#include "common/tsan.h"
#include "format/tar_zstd.h"

namespace kiln {
namespace fs = std::filesystem;

using format::detail::kTarRecord;
using format::detail::quote_name;
using format::detail::shard_error;
using format::detail::tar_sink_write;
using format::detail::TarFileSink;

namespace {

class ShardWriterImpl final : public ShardWriter {
 public:
  ShardWriterImpl(std::string path, ShardCompression compression)
      : path_(std::move(path)), partial_(path_ + ".partial"), compression_(compression) {}

  ~ShardWriterImpl() override {
    if (!closed_) abandon();
    if (entry_) archive_entry_free(entry_);
  }

  Status open(int level) {
    std::error_code ec;
    fs::path parent = fs::path(path_).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (ec) return Status::io("create directory failed: " + ec.message()).with_file(parent);
    opened_file_ = true;
    KILN_RETURN_IF_ERROR(sink_.open(partial_, compression_, level));
    archive_ = archive_write_new();
    entry_ = archive_entry_new();
    if (!archive_ || !entry_) return Status::internal("libarchive: out of memory");
    // pax_restricted writes plain ustar headers and adds a pax header only for names past 100
    // bytes: what GNU tar, Python tarfile and every WebDataset reader understand.
    if (archive_write_set_format_pax_restricted(archive_) != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(archive_, kTarRecord) != ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(archive_, kTarRecord) != ARCHIVE_OK ||
        archive_write_open2(archive_, &sink_, nullptr, tar_sink_write, nullptr, nullptr) !=
            ARCHIVE_OK) {
      return archive_failure("opening the tar writer");
    }
    return Status::ok();
  }

  Status add(const ShardSample& sample, uint64_t tokens) override {
    if (closed_) return Status::internal("shard " + quote_name(path_) + ": add() after close()");
    if (!failed_.is_ok()) return failed_;
    Status st = validate_sample(sample);
    if (!st.is_ok()) return shard_error(path_, st.message());
    order_.resize(sample.members.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
      const std::string& ea = sample.members[a].ext;
      const std::string& eb = sample.members[b].ext;
      int ra = member_order(ea), rb = member_order(eb);
      return ra != rb ? ra < rb : ea < eb;
    });
    for (size_t idx : order_) {
      const ShardMember& m = sample.members[idx];
      name_.assign(sample.key);
      name_ += '.';
      name_ += m.ext;
      archive_entry_clear(entry_);
      archive_entry_copy_pathname(entry_, name_.c_str());
      archive_entry_set_filetype(entry_, AE_IFREG);
      archive_entry_set_perm(entry_, 0644);
      archive_entry_set_uid(entry_, 0);
      archive_entry_set_gid(entry_, 0);
      archive_entry_set_mtime(entry_, 0, 0);
      archive_entry_set_size(entry_, static_cast<la_int64_t>(m.data.size()));
      if (archive_write_header(archive_, entry_) != ARCHIVE_OK) {
        return fail(archive_failure("writing the header of member " + quote_name(name_)));
      }
      la_ssize_t w = archive_write_data(archive_, m.data.data(), m.data.size());
      if (w < 0 || static_cast<size_t>(w) != m.data.size()) {
        return fail(archive_failure("writing member " + quote_name(name_)));
      }
      // Writes the padding now, so tar_bytes() is exact between samples.
      if (archive_write_finish_entry(archive_) != ARCHIVE_OK) {
        return fail(archive_failure("finishing member " + quote_name(name_)));
      }
    }
    ++samples_;
    tokens_ += tokens;
    return Status::ok();
  }

  uint64_t tar_bytes() const override { return sink_.tar_bytes() + pending_tar_bytes(); }
  uint64_t samples() const override { return samples_; }

  Result<ShardInfo> close() override {
    if (closed_) return Status::internal("shard " + quote_name(path_) + ": close() called twice");
    if (!failed_.is_ok()) return failed_;
    if (archive_write_close(archive_) != ARCHIVE_OK) {
      return fail(archive_failure("finishing the archive"));
    }
    archive_write_free(archive_);
    archive_ = nullptr;
    KILN_RETURN_IF_ERROR(fail(sink_.finish()));
    KILN_RETURN_IF_ERROR(fail(rename_durable(partial_, path_)));
    closed_ = true;
    ShardInfo info;
    info.path = path_;
    info.samples = samples_;
    info.tokens = tokens_;
    info.bytes = sink_.file_bytes();
    info.xxh3 = sink_.digest();
    info.tar_bytes = sink_.tar_bytes();
    return info;
  }

 private:
  // libarchive blocks output into 10 KiB records; bytes it holds have not reached the sink yet.
  uint64_t pending_tar_bytes() const {
    if (!archive_) return 0;
    la_int64_t total = archive_filter_bytes(archive_, 0);
    return total > 0 && static_cast<uint64_t>(total) > sink_.tar_bytes()
               ? static_cast<uint64_t>(total) - sink_.tar_bytes()
               : 0;
  }

  Status archive_failure(const std::string& what) {
    if (!sink_.error().is_ok()) return shard_error(path_, what + ": " + sink_.error().message());
    const char* msg = archive_ ? archive_error_string(archive_) : nullptr;
    return Status::io("shard " + quote_name(partial_) + ": " + what + ": " +
                      (msg ? msg : "libarchive error"));
  }

  Status fail(Status st) {
    if (!st.is_ok() && failed_.is_ok()) failed_ = st;
    return st;
  }

  // Drops everything: no bytes reach the file any more, and the .partial is removed.
  void abandon() {
    sink_.discard();
    if (archive_) {
      archive_write_free(archive_);  // may "close" into the discarding sink
      archive_ = nullptr;
    }
    if (opened_file_) ::unlink(partial_.c_str());
    closed_ = true;
  }

  std::string path_;
  std::string partial_;
  ShardCompression compression_;
  TarFileSink sink_;
  struct archive* archive_ = nullptr;
  struct archive_entry* entry_ = nullptr;
  bool opened_file_ = false;
  bool closed_ = false;
  Status failed_;
  uint64_t samples_ = 0;
  uint64_t tokens_ = 0;
  std::vector<size_t> order_;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<ShardWriter>> ShardWriter::open(const std::string& path,
                                                       ShardCompression compression,
                                                       int zstd_level) {
  Result<ShardCompression> implied = shard_compression_for_path(path);
  if (!implied.is_ok() || *implied != compression) {
    return Status::internal("shard path " + quote_name(path) + " must end in " +
                            shard_extension(compression));
  }
  auto writer = std::make_unique<ShardWriterImpl>(path, compression);
  KILN_RETURN_IF_ERROR(writer->open(zstd_level));
  return std::unique_ptr<ShardWriter>(std::move(writer));
}
// ---- ShardWritePool -------------------------------------------------------------------------

namespace {
constexpr uint64_t kChunkBytes = uint64_t{8} << 20;  // samples queued per writing task
}

struct ShardWritePool::Impl {
  // The writing tasks run in their own arena: a thread waiting here (even inside a TBB pipeline,
  // even with one thread) executes writing tasks only, never the caller's other work.
  tbb::task_arena arena;
  tbb::task_group tasks;
  tsan::ForkJoin fork_join;  // each task sees what its caller did; wait() sees every task's work
  std::atomic<uint64_t> queued{0};
  uint64_t limit = 0;

  void run(std::function<void()> f) {
    arena.execute([&] { tasks.run(fork_join.task(std::move(f))); });
  }
  void wait() {
    arena.execute([&] { tasks.wait(); });
    fork_join.join();
  }
};

ShardWritePool::ShardWritePool(uint64_t max_queued_bytes) : impl_(std::make_unique<Impl>()) {
  impl_->limit = max_queued_bytes > 0
                     ? max_queued_bytes
                     : std::max<uint64_t>(uint64_t{64} << 20,
                                          4 * kChunkBytes *
                                              static_cast<uint64_t>(tbb::this_task_arena::max_concurrency()));
}

ShardWritePool::~ShardWritePool() { impl_->wait(); }

// ---- RollingShardWriter ---------------------------------------------------------------------

struct RollingShardWriter::Shard {
  std::string path;
  // Assignment side (the adding thread only).
  uint64_t samples = 0, tar_bytes = 0, filling_bytes = 0;
  std::vector<std::pair<ShardSample, uint64_t>> filling;  // (sample, tokens)
  // Writing side.
  std::mutex mu;
  std::deque<std::pair<std::vector<std::pair<ShardSample, uint64_t>>, uint64_t>> queue;
  bool running = false, close_requested = false;
  std::unique_ptr<ShardWriter> writer;
  ShardInfo info;
};

struct RollingShardWriter::Errors {
  std::mutex mu;
  Status first;
  std::atomic<bool> failed{false};
};

RollingShardWriter::RollingShardWriter(Options options, std::shared_ptr<ShardWritePool> pool)
    : options_(std::move(options)),
      pool_(pool ? std::move(pool) : std::make_shared<ShardWritePool>()),
      next_index_(options_.first_index),
      errors_(std::make_unique<Errors>()) {}

RollingShardWriter::~RollingShardWriter() {
  // Tasks may still reference this writer's shards; unfinished ShardWriters remove their .partial.
  errors_->failed = true;
  pool_->impl_->wait();
}

Status RollingShardWriter::add(ShardSample sample, uint64_t tokens) {
  KILN_RETURN_IF_ERROR(validate_sample(sample));
  const uint64_t size = sample_tar_bytes(sample);
  Shard* sh = open_;
  if (sh && sh->samples > 0 &&
      ((options_.max_samples > 0 && sh->samples + 1 > options_.max_samples) ||
       (options_.max_tar_bytes > 0 && sh->tar_bytes + size > options_.max_tar_bytes))) {
    submit(sh, /*close=*/true);
    sh = open_ = nullptr;
  }
  if (!sh) {
    auto owned = std::make_unique<Shard>();
    owned->path = (fs::path(options_.dir) /
                   shard_file_name(options_.prefix, next_index_++, options_.compression))
                      .string();
    sh = open_ = owned.get();
    shards_.push_back(std::move(owned));
  }
  ++sh->samples;
  sh->tar_bytes += size;
  sh->filling_bytes += size;
  sh->filling.emplace_back(std::move(sample), tokens);
  if (sh->filling_bytes >= kChunkBytes) submit(sh, /*close=*/false);
  ShardWritePool::Impl& pool = *pool_->impl_;
  if (pool.queued.load() > pool.limit) pool.wait();  // too much queued: help the writers
  return first_error();
}

Result<std::vector<ShardInfo>> RollingShardWriter::finish() {
  if (open_) submit(open_, /*close=*/true);
  open_ = nullptr;
  pool_->impl_->wait();
  KILN_RETURN_IF_ERROR(first_error());
  std::vector<ShardInfo> out;
  for (const auto& sh : shards_) out.push_back(sh->info);
  return out;
}

void RollingShardWriter::submit(Shard* sh, bool close) {
  const uint64_t bytes = sh->filling_bytes;
  ShardWritePool::Impl& pool = *pool_->impl_;
  pool.queued += bytes;
  std::lock_guard lock(sh->mu);
  if (!sh->filling.empty()) sh->queue.emplace_back(std::move(sh->filling), bytes);
  sh->filling.clear();
  sh->filling_bytes = 0;
  if (close) sh->close_requested = true;
  if (!sh->running) {
    sh->running = true;
    pool.run([this, sh] { drain(sh); });
  }
}

// Writes a shard's queued chunks in order, then closes it when asked; one task per shard at a
// time (`running`).
void RollingShardWriter::drain(Shard* sh) {
  ShardWritePool::Impl& pool = *pool_->impl_;
  for (;;) {
    std::pair<std::vector<std::pair<ShardSample, uint64_t>>, uint64_t> chunk;
    bool close = false;
    {
      std::lock_guard lock(sh->mu);
      if (!sh->queue.empty()) {
        chunk = std::move(sh->queue.front());
        sh->queue.pop_front();
      } else if (sh->close_requested) {
        close = true;
        sh->close_requested = false;
      } else {
        sh->running = false;
        return;
      }
    }
    Status st;
    if (!close) {
      if (!sh->writer && !errors_->failed.load()) {
        auto w = ShardWriter::open(sh->path, options_.compression, options_.zstd_level);
        if (w.is_ok()) sh->writer = std::move(*w);
        else st = std::move(w).take_status();
      }
      for (auto& [sample, tokens] : chunk.first) {
        if (!st.is_ok() || errors_->failed.load()) break;
        st = sh->writer->add(sample, tokens);
      }
      pool.queued -= chunk.second;
    } else if (sh->writer && !errors_->failed.load()) {
      auto info = sh->writer->close();
      if (info.is_ok()) sh->info = std::move(*info);
      else st = std::move(info).take_status();
      sh->writer.reset();
    }
    if (!st.is_ok()) {
      std::lock_guard lock(errors_->mu);
      if (errors_->first.is_ok()) errors_->first = std::move(st);
      errors_->failed = true;
    }
  }
}

Status RollingShardWriter::first_error() {
  std::lock_guard lock(errors_->mu);
  return errors_->first;
}

}  // namespace kiln
