#include "common/shard.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include "common/atomic_file.h"
#include "common/hash.h"

namespace kiln {
namespace fs = std::filesystem;

namespace {

// Large I/O buffers: few syscalls, and zstd gets whole blocks to work on.
constexpr size_t kIoBufferBytes = 1 << 20;
constexpr size_t kTarBlock = 512;
constexpr size_t kTarRecord = 10240;  // GNU tar / Python tarfile record size; the last is padded
constexpr size_t kMaxKeyBytes = 200;
constexpr size_t kMaxExtBytes = 64;
constexpr size_t kUstarNameBytes = 100;

uint64_t round_up_block(uint64_t n) { return (n + kTarBlock - 1) / kTarBlock * kTarBlock; }

std::string quote_name(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

Status shard_error(const std::string& shard, const std::string& what) {
  return Status::data("shard " + quote_name(shard) + ": " + what);
}

Status member_error(const std::string& shard, std::string_view member, const std::string& what) {
  return Status::data("shard " + quote_name(shard) + ": member " + quote_name(member) + ": " + what);
}

// Write(2) all of it, retrying on EINTR and short writes.
Status write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::from_errno("write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::ok();
}

// Tar bytes one member adds: header (+ a pax header when the name needs one) + padded data.
uint64_t member_tar_bytes(size_t name_bytes, uint64_t data_bytes) {
  uint64_t bytes = kTarBlock + round_up_block(data_bytes);
  if (name_bytes > kUstarNameBytes) {
    // "NN path=<name>\n" in a pax extended header of its own.
    uint64_t record = name_bytes + 8 + 4;
    bytes += kTarBlock + round_up_block(record);
  }
  return bytes;
}

Status validate_sample(const ShardSample& sample) {
  KILN_RETURN_IF_ERROR(validate_sample_key(sample.key));
  for (size_t i = 0; i < sample.members.size(); ++i) {
    Status st = validate_member_ext(sample.members[i].ext);
    if (!st.is_ok()) {
      return Status::data("sample " + quote_name(sample.key) + ": " + st.message());
    }
    for (size_t j = 0; j < i; ++j) {
      if (sample.members[j].ext == sample.members[i].ext) {
        return Status::data("sample " + quote_name(sample.key) + ": duplicate member ext " +
                            quote_name(sample.members[i].ext));
      }
    }
  }
  if (sample.members.empty()) {
    return Status::data("sample " + quote_name(sample.key) + ": has no members");
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Writer

// Receives the tar stream from libarchive, compresses it (zstd) or not, writes it to the file and
// hashes the bytes that reach the file.
class ShardSink {
 public:
  ~ShardSink() {
    if (cctx_) ZSTD_freeCCtx(cctx_);
    if (fd_ >= 0) ::close(fd_);
  }

  Status open(const std::string& path, ShardCompression compression, int level) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::from_errno("open for writing", path);
    out_.resize(kIoBufferBytes);
    if (compression == ShardCompression::kZstd) {
      if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel() || level == 0) {
        return Status::config("zstd level " + std::to_string(level) + " is out of range (" +
                              std::to_string(ZSTD_minCLevel()) + ".." +
                              std::to_string(ZSTD_maxCLevel()) + ", not 0)");
      }
      cctx_ = ZSTD_createCCtx();
      if (!cctx_) return Status::internal("ZSTD_createCCtx failed");
      size_t r = ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
      if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
      if (ZSTD_isError(r)) {
        return Status::config("zstd level " + std::to_string(level) + ": " +
                              ZSTD_getErrorName(r));
      }
    }
    return Status::ok();
  }

  // Called by libarchive with tar bytes.
  Status write(const void* data, size_t size) {
    if (!error_.is_ok()) return error_;
    if (discard_) return Status::ok();
    tar_bytes_ += size;
    if (!cctx_) {
      const char* p = static_cast<const char*>(data);
      while (size > 0) {
        size_t n = std::min(size, out_.size() - out_pos_);
        std::memcpy(out_.data() + out_pos_, p, n);
        out_pos_ += n;
        p += n;
        size -= n;
        if (out_pos_ == out_.size()) KILN_RETURN_IF_ERROR(remember(flush()));
      }
      return Status::ok();
    }
    ZSTD_inBuffer in{data, size, 0};
    while (in.pos < in.size) {
      ZSTD_outBuffer out{out_.data(), out_.size(), out_pos_};
      size_t r = ZSTD_compressStream2(cctx_, &out, &in, ZSTD_e_continue);
      out_pos_ = out.pos;
      if (ZSTD_isError(r)) {
        return remember(Status::internal(std::string("zstd compression failed: ") +
                                         ZSTD_getErrorName(r)));
      }
      if (out_pos_ == out_.size()) KILN_RETURN_IF_ERROR(remember(flush()));
    }
    return Status::ok();
  }

  // Ends the zstd frame, writes everything, fsyncs and closes the file.
  Status finish() {
    if (!error_.is_ok()) return error_;
    if (cctx_) {
      for (;;) {
        ZSTD_inBuffer in{nullptr, 0, 0};
        ZSTD_outBuffer out{out_.data(), out_.size(), out_pos_};
        size_t left = ZSTD_compressStream2(cctx_, &out, &in, ZSTD_e_end);
        out_pos_ = out.pos;
        if (ZSTD_isError(left)) {
          return remember(Status::internal(std::string("zstd compression failed: ") +
                                           ZSTD_getErrorName(left)));
        }
        if (left == 0) break;
        KILN_RETURN_IF_ERROR(remember(flush()));
      }
    }
    KILN_RETURN_IF_ERROR(remember(flush()));
    if (::fsync(fd_) != 0) return remember(Status::from_errno("fsync", path_));
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return remember(Status::from_errno("close", path_));
    return Status::ok();
  }

  // From now on bytes are dropped (the writer is being abandoned).
  void discard() { discard_ = true; }
  const Status& error() const { return error_; }
  uint64_t tar_bytes() const { return tar_bytes_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t digest() const { return hash_.digest(); }

 private:
  Status flush() {
    if (out_pos_ == 0) return Status::ok();
    hash_.update(out_.data(), out_pos_);
    KILN_RETURN_IF_ERROR(write_all(fd_, out_.data(), out_pos_, path_));
    file_bytes_ += out_pos_;
    out_pos_ = 0;
    return Status::ok();
  }
  Status remember(Status st) {
    if (!st.is_ok() && error_.is_ok()) error_ = st;
    return st;
  }

  std::string path_;
  int fd_ = -1;
  ZSTD_CCtx* cctx_ = nullptr;
  std::vector<char> out_;
  size_t out_pos_ = 0;
  Xxh3Stream hash_;
  uint64_t tar_bytes_ = 0;
  uint64_t file_bytes_ = 0;
  bool discard_ = false;
  Status error_;
};

la_ssize_t sink_write_cb(struct archive* a, void* client, const void* buf, size_t n) {
  Status st = static_cast<ShardSink*>(client)->write(buf, n);
  if (!st.is_ok()) {
    archive_set_error(a, EIO, "%s", st.message().c_str());
    return -1;
  }
  return static_cast<la_ssize_t>(n);
}

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
        archive_write_open2(archive_, &sink_, nullptr, sink_write_cb, nullptr, nullptr) !=
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
  ShardSink sink_;
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

// ---------------------------------------------------------------------------------------------
// Reader

// Feeds libarchive the uncompressed tar stream: read(2) for plain tar, libzstd streaming for
// .tar.zst. Two output buffers alternate so the bytes delivered in the last two reads stay
// readable (the end-of-archive check looks back at bytes libarchive fetched but did not use).
class TarSource {
 public:
  ~TarSource() {
    if (dctx_) ZSTD_freeDCtx(dctx_);
  }

  Status open(int fd, bool zstd, const std::string& path) {
    fd_ = fd;
    path_ = path;
    for (auto& b : out_) b.resize(kIoBufferBytes);
    if (zstd) {
      dctx_ = ZSTD_createDCtx();
      if (!dctx_) return Status::internal("ZSTD_createDCtx failed");
      in_.resize(kIoBufferBytes);
    }
    return Status::ok();
  }

  // libarchive's read callback: the next chunk of tar bytes, 0 at the end, -1 on error.
  la_ssize_t read(const void** buf) {
    if (!error_.empty()) return -1;
    cur_ ^= 1;
    std::vector<char>& out = out_[cur_];
    size_t n = 0;
    if (!dctx_) {
      Result<size_t> r = read_file(out.data(), out.size());
      if (!r.is_ok()) return -1;
      n = *r;
    } else {
      Result<size_t> r = decompress(out.data(), out.size());
      if (!r.is_ok()) return -1;
      n = *r;
    }
    len_[cur_] = n;
    delivered_ += n;
    *buf = out.data();
    return static_cast<la_ssize_t>(n);
  }

  // True when the bytes of the tar stream in [from, delivered()) are all zero; only the last two
  // chunks are kept, so `from` must lie inside them.
  bool delivered_tail_is_zero(uint64_t from, bool* checkable) const {
    uint64_t back = delivered_ - from;
    *checkable = back <= len_[0] + len_[1];
    if (!*checkable) return false;
    size_t last = len_[cur_];
    size_t in_last = static_cast<size_t>(std::min<uint64_t>(back, last));
    if (!all_zero(out_[cur_].data() + last - in_last, in_last)) return false;
    size_t in_prev = static_cast<size_t>(back - in_last);
    size_t prev_len = len_[cur_ ^ 1];
    return all_zero(out_[cur_ ^ 1].data() + prev_len - in_prev, in_prev);
  }

  // Reads the rest of the stream (not yet delivered) and checks it is all zero, that the whole
  // stream is a number of 512-byte blocks and, for zstd, that the last frame is complete.
  // Returns a message on failure, "" when fine.
  std::string drain_zero_tail() {
    std::vector<char>& out = out_[cur_ ^ 1];
    for (;;) {
      Result<size_t> r = dctx_ ? decompress(out.data(), out.size())
                               : read_file(out.data(), out.size());
      if (!r.is_ok()) return error_;
      if (*r == 0) break;
      delivered_ += *r;
      if (!all_zero(out.data(), *r)) {
        return "data follows the end-of-archive marker (concatenated or damaged archive)";
      }
    }
    if (delivered_ % kTarBlock != 0) {
      return "the tar stream is " + std::to_string(delivered_) +
             " bytes, not a whole number of 512-byte blocks (truncated shard)";
    }
    return "";
  }

  const std::string& error() const { return error_; }
  uint64_t delivered() const { return delivered_; }

 private:
  static bool all_zero(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != 0) return false;
    }
    return true;
  }

  Result<size_t> read_file(char* dst, size_t cap) {
    size_t got = 0;
    while (got < cap) {
      ssize_t r = ::read(fd_, dst + got, cap - got);
      if (r < 0) {
        if (errno == EINTR) continue;
        error_ = std::string("read failed: ") + std::strerror(errno);
        return Status::io(error_);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

  // Fills dst as far as the compressed input allows; 0 only at the clean end of the stream.
  // An error found after some output is reported on the next call, so the damage is attributed
  // to the member libarchive is reading when it reaches the damaged bytes.
  Result<size_t> decompress(char* dst, size_t cap) {
    if (!deferred_error_.empty()) {
      error_ = deferred_error_;
      return Status::data(error_);
    }
    ZSTD_outBuffer out{dst, cap, 0};
    while (out.pos < out.size) {
      if (in_buf_.pos == in_buf_.size) {
        if (input_eof_) break;
        Result<size_t> r = read_file(in_.data(), in_.size());
        if (!r.is_ok()) return r;
        if (*r == 0) {
          input_eof_ = true;
          break;
        }
        in_buf_ = ZSTD_inBuffer{in_.data(), *r, 0};
      }
      size_t ret = ZSTD_decompressStream(dctx_, &out, &in_buf_);
      if (ZSTD_isError(ret)) {
        std::string msg = std::string("corrupt zstd data: ") + ZSTD_getErrorName(ret);
        if (out.pos > 0) {
          deferred_error_ = msg;
          return out.pos;
        }
        error_ = msg;
        return Status::data(error_);
      }
      frame_open_ = ret != 0;
    }
    if (out.pos == 0 && input_eof_ && frame_open_) {
      error_ = "truncated zstd stream (the file ends inside a frame)";
      return Status::data(error_);
    }
    return out.pos;
  }

  int fd_ = -1;
  std::string path_;
  ZSTD_DCtx* dctx_ = nullptr;
  std::vector<char> in_;
  ZSTD_inBuffer in_buf_{nullptr, 0, 0};
  bool input_eof_ = false;
  bool frame_open_ = false;
  std::vector<char> out_[2];
  size_t len_[2] = {0, 0};
  int cur_ = 0;
  uint64_t delivered_ = 0;
  std::string error_;
  std::string deferred_error_;
};

la_ssize_t source_read_cb(struct archive* a, void* client, const void** buf) {
  auto* src = static_cast<TarSource*>(client);
  la_ssize_t n = src->read(buf);
  if (n < 0) archive_set_error(a, EIO, "%s", src->error().c_str());
  return n;
}

const char* filetype_name(mode_t type) {
  switch (type) {
    case AE_IFLNK: return "a symbolic link";
    case AE_IFDIR: return "a directory";
    case AE_IFCHR: return "a character device";
    case AE_IFBLK: return "a block device";
    case AE_IFIFO: return "a FIFO";
    case AE_IFSOCK: return "a socket";
    default: return "not a regular file";
  }
}

class ShardReaderImpl final : public ShardReader {
 public:
  ShardReaderImpl(std::string path, ShardReaderOptions options)
      : path_(std::move(path)), options_(options) {}

  ~ShardReaderImpl() override {
    if (archive_) archive_read_free(archive_);
    if (fd_ >= 0) ::close(fd_);
  }

  Status open() {
    KILN_ASSIGN_OR_RETURN(ShardCompression compression, shard_compression_for_path(path_));
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return Status::from_errno("open shard", path_);
    struct stat st;
    if (::fstat(fd_, &st) != 0) return Status::from_errno("stat shard", path_);
    if (!S_ISREG(st.st_mode)) return shard_error(path_, "not a regular file");
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (options_.expected_xxh3) KILN_RETURN_IF_ERROR(verify_checksum(*options_.expected_xxh3));
    KILN_RETURN_IF_ERROR(source_.open(fd_, compression == ShardCompression::kZstd, path_));
    archive_ = archive_read_new();
    if (!archive_) return Status::internal("libarchive: out of memory");
    if (archive_read_support_format_tar(archive_) != ARCHIVE_OK) {
      return Status::internal(std::string("libarchive: ") + archive_error_string(archive_));
    }
    if (archive_read_open(archive_, &source_, nullptr, source_read_cb, nullptr) != ARCHIVE_OK) {
      return fail(shard_error(path_, "not a readable tar archive (failed before the first member): " +
                                         archive_message()));
    }
    return Status::ok();
  }

  Result<bool> next(ShardSample* out) override {
    if (!failed_.is_ok()) return failed_;
    if (done_) return false;
    if (!have_pending_) {
      Result<bool> got = read_member();
      if (!got.is_ok()) return fail(std::move(got).take_status());
      if (!*got) {
        done_ = true;
        return false;
      }
    }
    // Start the sample with the pending member; swap strings so buffers circulate, not copies.
    out->key.swap(pending_key_);
    if (!seen_keys_.insert(out->key).second) {
      return fail(member_error(path_, member_name_,
                               "key " + quote_name(out->key) +
                                   " appears again after other keys (a sample's members must be "
                                   "consecutive, and keys unique in a shard)"));
    }
    size_t used = 0;
    take_pending(out, &used);
    for (;;) {
      Result<bool> got = read_member();
      if (!got.is_ok()) return fail(std::move(got).take_status());
      if (!*got) {
        done_ = true;
        break;
      }
      if (pending_key_ != out->key) break;  // starts the next sample
      for (size_t i = 0; i < used; ++i) {
        if (out->members[i].ext == pending_.ext) {
          return fail(member_error(path_, member_name_,
                                   "duplicate ext " + quote_name(pending_.ext) + " for key " +
                                       quote_name(out->key)));
        }
      }
      take_pending(out, &used);
    }
    out->members.resize(used);
    return true;
  }

  uint64_t tar_bytes() const override {
    la_int64_t n = archive_ ? archive_filter_bytes(archive_, 0) : 0;
    return n > 0 ? static_cast<uint64_t>(n) : 0;
  }

 private:
  void take_pending(ShardSample* out, size_t* used) {
    if (out->members.size() <= *used) out->members.resize(*used + 1);
    ShardMember& m = out->members[*used];
    m.ext.swap(pending_.ext);
    m.data.swap(pending_.data);
    ++*used;
    have_pending_ = false;
  }

  std::string archive_message() const {
    if (!source_.error().empty()) return source_.error();
    const char* msg = archive_error_string(archive_);
    return msg ? msg : "unknown libarchive error";
  }

  std::string where_after() const {
    return member_name_.empty() ? std::string("the first member")
                                : "the member after " + quote_name(member_name_);
  }

  // Reads the next member into pending_ / pending_key_. False at the (verified) end.
  Result<bool> read_member() {
    struct archive_entry* entry = nullptr;
    int r = archive_read_next_header(archive_, &entry);
    if (r == ARCHIVE_EOF) {
      KILN_RETURN_IF_ERROR(check_end());
      return false;
    }
    if (r != ARCHIVE_OK) {
      return shard_error(path_, "reading the header of " + where_after() + ": " +
                                    archive_message() + " (truncated or corrupt shard)");
    }
    const char* raw = archive_entry_pathname(entry);
    if (!raw || !*raw) {
      return shard_error(path_, "member after " + quote_name(member_name_) +
                                    " has an empty or undecodable name");
    }
    member_name_.assign(raw);
    std::string_view name = member_name_;
    if (name.front() == '/') return member_error(path_, name, "absolute path");
    for (size_t pos = 0; pos <= name.size();) {
      size_t slash = name.find('/', pos);
      if (slash == std::string_view::npos) slash = name.size();
      if (name.substr(pos, slash - pos) == "..") {
        return member_error(path_, name, "path with a '..' component");
      }
      pos = slash + 1;
    }
    const char* hardlink = archive_entry_hardlink(entry);
    if (hardlink) {
      return member_error(path_, name, std::string("a hard link to ") + quote_name(hardlink) +
                                           ", not a regular file");
    }
    mode_t type = archive_entry_filetype(entry);
    if (type != AE_IFREG) {
      std::string what = filetype_name(type);
      const char* target = archive_entry_symlink(entry);
      if (type == AE_IFLNK && target) what += std::string(" to ") + quote_name(target);
      return member_error(path_, name, what + ", not a regular file");
    }
    if (archive_entry_sparse_count(entry) > 0) {
      return member_error(path_, name, "a sparse file, not a plain regular file");
    }
    if (!archive_entry_size_is_set(entry) || archive_entry_size(entry) < 0) {
      return member_error(path_, name, "member has no size");
    }
    auto size = static_cast<uint64_t>(archive_entry_size(entry));
    if (size > options_.max_member_bytes) {
      return member_error(path_, name, std::to_string(size) + " bytes, over the limit of " +
                                           std::to_string(options_.max_member_bytes) +
                                           " (max_member_bytes)");
    }
    size_t dot = name.find('.');
    if (dot == std::string_view::npos) {
      return member_error(path_, name, "name has no extension (expected <key>.<ext>)");
    }
    pending_key_.assign(name.substr(0, dot));
    pending_.ext.assign(name.substr(dot + 1));
    Status st = validate_sample_key(pending_key_);
    if (st.is_ok()) st = validate_member_ext(pending_.ext);
    if (!st.is_ok()) {
      return member_error(path_, name, "not a valid <key>.<ext> name: " + st.message());
    }
    // Data: archive_read_data_block hands out pointers into the decompressed buffer; one copy.
    pending_.data.clear();
    pending_.data.reserve(size);
    for (;;) {
      const void* block = nullptr;
      size_t len = 0;
      la_int64_t offset = 0;
      r = archive_read_data_block(archive_, &block, &len, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK) {
        return member_error(path_, name, "reading data: " + archive_message() +
                                              " (truncated or corrupt shard)");
      }
      if (static_cast<uint64_t>(offset) != pending_.data.size() ||
          pending_.data.size() + len > size) {
        return member_error(path_, name, "data blocks are not contiguous");
      }
      pending_.data.append(static_cast<const char*>(block), len);
    }
    if (pending_.data.size() != size) {
      return member_error(path_, name, "holds " + std::to_string(pending_.data.size()) +
                                           " bytes, header says " + std::to_string(size) +
                                           " (truncated shard)");
    }
    // The member and its padding are consumed: where the next header (or the end) starts.
    end_of_members_ = tar_bytes();
    have_pending_ = true;
    return true;
  }

  // At libarchive's EOF: require two zero blocks right after the last member (libarchive also
  // accepts a stream that simply stops at a member boundary, which is what truncation looks like),
  // then only zero padding, then the end of a complete zstd stream.
  Status check_end() {
    std::string after =
        member_name_.empty() ? std::string("before any member") : "after member " + quote_name(member_name_);
    uint64_t end = tar_bytes();
    if (end < end_of_members_ + 2 * kTarBlock) {
      return shard_error(path_, "the archive ends " + after +
                                    " without the end-of-archive marker (truncated shard)");
    }
    bool checkable = false;
    if (!source_.delivered_tail_is_zero(end, &checkable)) {
      return shard_error(path_, checkable ? "data follows the end-of-archive marker " + after +
                                                " (concatenated or damaged archive)"
                                          : "cannot check the bytes after the end-of-archive marker");
    }
    std::string tail = source_.drain_zero_tail();
    if (!tail.empty()) return shard_error(path_, tail + " (" + after + ")");
    return Status::ok();
  }

  Status verify_checksum(uint64_t expected) {
    Xxh3Stream hash;
    std::vector<char> buf(kIoBufferBytes);
    uint64_t offset = 0;
    for (;;) {
      ssize_t r = ::pread(fd_, buf.data(), buf.size(), static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Status::from_errno("read shard", path_);
      }
      if (r == 0) break;
      hash.update(buf.data(), static_cast<size_t>(r));
      offset += static_cast<uint64_t>(r);
    }
    uint64_t actual = hash.digest();
    if (actual == expected) return Status::ok();
    // Name the member where the damage shows, when a plain read finds it.
    std::string where;
    ShardReaderOptions plain = options_;
    plain.expected_xxh3.reset();
    Result<std::vector<ShardSample>> diag = ShardReader::read_all(path_, plain);
    if (!diag.is_ok()) {
      std::string msg = diag.status().message();
      std::string prefix = "shard " + quote_name(path_) + ": ";
      if (msg.starts_with(prefix)) msg = msg.substr(prefix.size());
      where = "; reading it fails: " + msg;
    } else {
      where = "; every member still parses (" + std::to_string(diag->size()) +
              " samples), so the damage is inside member data";
      if (!diag->empty() && !diag->back().members.empty()) {
        where += " (last member " + quote_name(diag->back().key + "." + diag->back().members.back().ext) + ")";
      }
    }
    return shard_error(path_, "checksum mismatch: expected xxh3 " + hex64(expected) +
                                  ", the file has " + hex64(actual) + " (" +
                                  std::to_string(offset) + " bytes)" + where);
  }

  Status fail(Status st) {
    if (!st.is_ok() && failed_.is_ok()) failed_ = st;
    return st;
  }

  std::string path_;
  ShardReaderOptions options_;
  int fd_ = -1;
  TarSource source_;
  struct archive* archive_ = nullptr;
  bool done_ = false;
  Status failed_;
  bool have_pending_ = false;
  std::string pending_key_;
  ShardMember pending_;
  std::string member_name_;
  uint64_t end_of_members_ = 0;
  std::unordered_set<std::string> seen_keys_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

const char* shard_extension(ShardCompression c) {
  return c == ShardCompression::kZstd ? ".tar.zst" : ".tar";
}

Result<ShardCompression> shard_compression_for_path(const std::string& path) {
  auto ends_with = [&](std::string_view suffix) {
    return path.size() > suffix.size() &&
           std::string_view(path).substr(path.size() - suffix.size()) == suffix;
  };
  if (ends_with(".tar.zst")) return ShardCompression::kZstd;
  if (ends_with(".tar")) return ShardCompression::kNone;
  return Status::data("shard " + quote_name(path) + ": not a shard path (expected .tar or .tar.zst)");
}

const ShardMember* ShardSample::find(std::string_view ext) const {
  for (const ShardMember& m : members) {
    if (m.ext == ext) return &m;
  }
  return nullptr;
}

Status validate_sample_key(std::string_view key) {
  if (key.empty()) return Status::data("sample key is empty");
  if (key.size() > kMaxKeyBytes) {
    return Status::data("sample key " + quote_name(key.substr(0, 40)) + "... is " +
                        std::to_string(key.size()) + " bytes, over " +
                        std::to_string(kMaxKeyBytes));
  }
  for (char c : key) {
    auto u = static_cast<unsigned char>(c);
    if (c == '.' || c == '/') {
      return Status::data("sample key " + quote_name(key) + " contains '" + std::string(1, c) + "'");
    }
    if (u < 0x20 || u > 0x7e) {
      return Status::data("sample key " + quote_name(key) +
                          " contains a byte outside printable ASCII");
    }
  }
  return Status::ok();
}

Status validate_member_ext(std::string_view ext) {
  if (ext.empty()) return Status::data("member ext is empty");
  if (ext.size() > kMaxExtBytes) {
    return Status::data("member ext " + quote_name(ext.substr(0, 40)) + "... is over " +
                        std::to_string(kMaxExtBytes) + " bytes");
  }
  bool part_empty = true;
  for (char c : ext) {
    if (c == '.') {
      if (part_empty) return Status::data("member ext " + quote_name(ext) + " has an empty part");
      part_empty = true;
      continue;
    }
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) {
      return Status::data("member ext " + quote_name(ext) +
                          " may hold only letters, digits, '_', '-' and '.'");
    }
    part_empty = false;
  }
  if (part_empty) return Status::data("member ext " + quote_name(ext) + " has an empty part");
  return Status::ok();
}

int member_order(std::string_view ext) {
  if (ext == "txt") return 0;
  if (ext == "json") return 1;
  if (ext == "tokens.npy") return 2;
  return 3;
}

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

RollingShardWriter::RollingShardWriter(Options options)
    : options_(std::move(options)), next_index_(options_.first_index) {}

RollingShardWriter::~RollingShardWriter() = default;

Status RollingShardWriter::add(const ShardSample& sample, uint64_t tokens) {
  KILN_RETURN_IF_ERROR(validate_sample(sample));
  if (current_ && current_->samples() > 0) {
    uint64_t next_bytes = 0;
    for (const ShardMember& m : sample.members) {
      next_bytes += member_tar_bytes(sample.key.size() + 1 + m.ext.size(), m.data.size());
    }
    bool full_samples = options_.max_samples > 0 && current_->samples() >= options_.max_samples;
    bool full_bytes =
        options_.max_tar_bytes > 0 && current_->tar_bytes() + next_bytes > options_.max_tar_bytes;
    if (full_samples || full_bytes) {
      Result<ShardInfo> info = current_->close();
      current_.reset();
      if (!info.is_ok()) return std::move(info).take_status();
      done_.push_back(std::move(info).value());
    }
  }
  if (!current_) {
    char name[64];
    std::snprintf(name, sizeof name, "-%06" PRIu64, next_index_);
    std::string path = (fs::path(options_.dir) / (options_.prefix + name)).string() +
                       shard_extension(options_.compression);
    KILN_ASSIGN_OR_RETURN(current_,
                          ShardWriter::open(path, options_.compression, options_.zstd_level));
    ++next_index_;
  }
  return current_->add(sample, tokens);
}

Result<std::vector<ShardInfo>> RollingShardWriter::finish() {
  if (current_) {
    Result<ShardInfo> info = current_->close();
    current_.reset();
    if (!info.is_ok()) return std::move(info).take_status();
    done_.push_back(std::move(info).value());
  }
  return done_;
}

Result<std::unique_ptr<ShardReader>> ShardReader::open(const std::string& path,
                                                       ShardReaderOptions options) {
  auto reader = std::make_unique<ShardReaderImpl>(path, options);
  KILN_RETURN_IF_ERROR(reader->open());
  return std::unique_ptr<ShardReader>(std::move(reader));
}

Result<std::vector<ShardSample>> ShardReader::read_all(const std::string& path,
                                                       ShardReaderOptions options) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader, ShardReader::open(path, options));
  std::vector<ShardSample> samples;
  for (;;) {
    ShardSample sample;
    KILN_ASSIGN_OR_RETURN(bool more, reader->next(&sample));
    if (!more) break;
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace kiln
