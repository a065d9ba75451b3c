// Internal to format/: the byte layer under the shard writer and reader — tar records in and out
// of libarchive, zstd streaming (de)compression, the file descriptor, and the shard's XXH3.
//
// TarFileSink takes the tar stream libarchive writes (through tar_sink_write), compresses it or
// not, writes it to a file and hashes the bytes that reach the file. TarSource feeds libarchive
// (through tar_source_read) the uncompressed tar stream of a plain or zstd shard and can check
// what follows the end-of-archive marker. Neither is thread-safe.
#pragma once

#include <archive.h>
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"
#include "format/shard.h"

namespace kiln::format::detail {

// Large I/O buffers: few syscalls, and zstd gets whole blocks to work on.
constexpr size_t kIoBufferBytes = 1 << 20;
constexpr size_t kTarBlock = 512;
constexpr size_t kTarRecord = 10240;  // GNU tar / Python tarfile record size; the last is padded

// 'name' with control and non-ASCII bytes as \xNN, for error messages.
std::string quote_name(std::string_view s);
// kData "shard '<shard>': <what>" / "shard '<shard>': member '<member>': <what>".
Status shard_error(const std::string& shard, const std::string& what);
Status member_error(const std::string& shard, std::string_view member, const std::string& what);
// write(2) all of it, retrying on EINTR and short writes.
Status write_all(int fd, const char* p, size_t n, const std::string& path);

class TarFileSink {
 public:
  ~TarFileSink();

  Status open(const std::string& path, ShardCompression compression, int level);

  // Called by libarchive with tar bytes.
  Status write(const void* data, size_t size);

  // Ends the zstd frame, writes everything, fsyncs and closes the file.
  Status finish();

  // From now on bytes are dropped (the writer is being abandoned).
  void discard() { discard_ = true; }
  const Status& error() const { return error_; }
  uint64_t tar_bytes() const { return tar_bytes_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t digest() const { return hash_.digest(); }

 private:
  Status flush();
  Status remember(Status st);

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

// libarchive's write callback; `client` is a TarFileSink.
la_ssize_t tar_sink_write(struct archive* a, void* client, const void* buf, size_t n);

// Feeds libarchive the uncompressed tar stream: read(2) for plain tar, libzstd streaming for
// .tar.zst. Two output buffers alternate so the bytes delivered in the last two reads stay
// readable (the end-of-archive check looks back at bytes libarchive fetched but did not use).
class TarSource {
 public:
  ~TarSource();

  Status open(int fd, bool zstd, const std::string& path);

  // libarchive's read callback: the next chunk of tar bytes, 0 at the end, -1 on error.
  la_ssize_t read(const void** buf);

  // True when the bytes of the tar stream in [from, delivered()) are all zero; only the last two
  // chunks are kept, so `from` must lie inside them.
  bool delivered_tail_is_zero(uint64_t from, bool* checkable) const;

  // Reads the rest of the stream (not yet delivered) and checks it is all zero, that the whole
  // stream is a number of 512-byte blocks and, for zstd, that the last frame is complete.
  // Returns a message on failure, "" when fine.
  std::string drain_zero_tail();

  const std::string& error() const { return error_; }
  uint64_t delivered() const { return delivered_; }
  // Caps the uncompressed tar stream: delivering more than max_bytes is an error naming the cap
  // and `why` (where the figure comes from), so a decompression bomb stops at the cap.
  void set_limit(uint64_t max_bytes, std::string why) {
    limit_ = max_bytes;
    limit_why_ = std::move(why);
  }

 private:
  static bool all_zero(const char* p, size_t n);

  Result<size_t> read_file(char* dst, size_t cap);

  // Fills dst as far as the compressed input allows; 0 only at the clean end of the stream.
  // An error found after some output is reported on the next call, so the damage is attributed
  // to the member libarchive is reading when it reaches the damaged bytes.
  Result<size_t> decompress(char* dst, size_t cap);

  int fd_ = -1;
  std::string path_;
  ZSTD_DCtx* dctx_ = nullptr;
  std::vector<char> in_;
  ZSTD_inBuffer in_buf_{nullptr, 0, 0};
  // False (and error_ set) when `more` bytes would pass the limit.
  bool within_limit(size_t more);

  bool input_eof_ = false;
  uint64_t limit_ = UINT64_MAX;
  std::string limit_why_;
  bool frame_open_ = false;
  std::vector<char> out_[2];
  size_t len_[2] = {0, 0};
  int cur_ = 0;
  uint64_t delivered_ = 0;
  std::string error_;
  std::string deferred_error_;
};

// libarchive's read callback; `client` is a TarSource.
la_ssize_t tar_source_read(struct archive* a, void* client, const void** buf);

}  // namespace kiln::format::detail
