// WebDataset-style tar shards: the on-disk format shared by `kiln prep` (writes) and the loader
// (reads). See docs/FORMATS.md and ../shared/DESIGN.md "Shard samples".
//
// A sample is a key plus members; member "<key>.<ext>" for each ext. When reading, a sample is
// the run of consecutive members sharing a key (WebDataset: the key is the member name up to the
// first '.', the ext is the rest: "k.tokens.npy" -> key "k", ext "tokens.npy"); a key may appear
// in only one run per shard. Members are written in a
// fixed extension order (txt, json, tokens.npy, then any others in byte order), so shards are
// deterministic: fixed mtime (0), uid/gid 0, mode 0644, ustar/pax headers only, no user names.
// Shards are plain tar (".tar") or the whole tar compressed with zstd (".tar.zst").
//
// Writers write "<path>.partial" and rename to <path> only when the shard is complete, so a killed
// process never leaves a file that looks complete. Readers treat shards as untrusted: absolute
// paths, "..", non-regular members, duplicate extensions for a key, members past a size limit,
// truncation and (when an expected checksum is given) checksum mismatches are data errors naming
// the shard and the member.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln {

enum class ShardCompression { kNone, kZstd };

// ".tar" or ".tar.zst".
const char* shard_extension(ShardCompression c);

struct ShardMember {
  std::string ext;   // without the leading dot: "txt", "json", "tokens.npy"
  std::string data;  // raw bytes
};

struct ShardSample {
  std::string key;  // non-empty, no '.' or '/'
  std::vector<ShardMember> members;
  // The member with this ext, or nullptr.
  const ShardMember* find(std::string_view ext) const;
};

// Non-empty, no '.', no '/', no NUL, at most 200 bytes, and printable ASCII only (0x20..0x7e):
// tar names outside ASCII depend on the reader's locale, so they are refused. kData otherwise.
Status validate_sample_key(std::string_view key);
// Non-empty, at most 64 bytes, dot-separated parts each made of [A-Za-z0-9_-]+ ("txt",
// "tokens.npy"). kData otherwise.
Status validate_member_ext(std::string_view ext);
// Rank of an extension in the fixed member order (txt=0, json=1, tokens.npy=2, others after).
int member_order(std::string_view ext);

struct ShardInfo {
  std::string path;       // final path as written
  uint64_t samples = 0;
  uint64_t tokens = 0;    // as reported by the caller through add()
  uint64_t bytes = 0;     // size of the shard file on disk
  uint64_t xxh3 = 0;      // XXH3-64 of the shard file bytes
  uint64_t tar_bytes = 0; // size of the uncompressed tar stream (== bytes for plain tar)
};

// The compression a shard path implies: ".tar" -> kNone, ".tar.zst" -> kZstd, else kData.
Result<ShardCompression> shard_compression_for_path(const std::string& path);

// Writes one shard. Not thread-safe.
class ShardWriter {
 public:
  virtual ~ShardWriter() = default;
  // Opens "<path>.partial" for writing. path must end in shard_extension(compression).
  static Result<std::unique_ptr<ShardWriter>> open(const std::string& path,
                                                   ShardCompression compression,
                                                   int zstd_level = 3);
  // Validates the key and member exts (sorted into the fixed order), then appends.
  virtual Status add(const ShardSample& sample, uint64_t tokens = 0) = 0;
  // Uncompressed tar bytes written so far (for rolling).
  virtual uint64_t tar_bytes() const = 0;
  virtual uint64_t samples() const = 0;
  // Finishes the archive, fsyncs, renames .partial to the final path, fsyncs the directory.
  // Destroying a writer that was not closed (or whose close failed) removes the .partial file.
  virtual Result<ShardInfo> close() = 0;
};

// Rolls to a new shard "<dir>/<prefix>-NNNNNN<ext>" when the next sample would pass
// max_samples or max_tar_bytes (0 = no limit). max_tar_bytes bounds the tar headers + data of the
// members (the end-of-archive blocks and record padding, at most 10 KiB, come on top); a single
// sample larger than the limit gets a shard of its own. Shards are opened lazily: finish() with
// no samples added writes nothing. Not thread-safe.
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
  explicit RollingShardWriter(Options options);
  ~RollingShardWriter();
  Status add(const ShardSample& sample, uint64_t tokens = 0);
  // Closes the open shard (if any) and returns every shard written, in order.
  Result<std::vector<ShardInfo>> finish();

 private:
  Options options_;
  std::unique_ptr<ShardWriter> current_;
  std::vector<ShardInfo> done_;
  uint64_t next_index_;
};

struct ShardReaderOptions {
  uint64_t max_member_bytes = 256ull << 20;  // members larger than this are errors
  std::optional<uint64_t> expected_xxh3;     // verify the whole file's XXH3-64 before reading
};

// Streams samples from one shard. Not thread-safe.
class ShardReader {
 public:
  virtual ~ShardReader() = default;
  // Compression is detected from the extension (".tar" / ".tar.zst").
  static Result<std::unique_ptr<ShardReader>> open(const std::string& path,
                                                   ShardReaderOptions options = {});
  // Reads the next sample into *out (its strings' capacity is reused, so pass the same sample
  // object every time when reading many). Members come in file order. Returns false at the end
  // of the shard, after checking the end-of-archive marker, that nothing but zero padding
  // follows it and (for zstd) that the compressed stream is complete. After an error, every
  // further call returns an error.
  virtual Result<bool> next(ShardSample* out) = 0;
  // Uncompressed tar bytes consumed so far.
  virtual uint64_t tar_bytes() const = 0;
  // Reads every sample.
  static Result<std::vector<ShardSample>> read_all(const std::string& path,
                                                   ShardReaderOptions options = {});
};

}  // namespace kiln
