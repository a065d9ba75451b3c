// Reading shards: ShardReader streams the samples of one shard file. See format/shard.h for the
// sample format and docs/FORMATS.md "Shards".
//
// Shards are untrusted: absolute paths, "..", non-regular members, duplicate extensions for a
// key, a key appearing again after other keys, members, samples or the uncompressed stream past
// their caps (ShardReaderOptions), truncation, data after the end-of-archive marker and (when an
// expected checksum is given) checksum mismatches are kData errors naming the shard, the member
// and the cap. Memory stays bounded by one sample (at most max_sample_bytes) plus two 1 MiB
// buffers, also when diagnosing a checksum mismatch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "format/shard.h"

namespace kiln {

struct ShardReaderOptions {
  uint64_t max_member_bytes = 256ull << 20;  // members larger than this are errors
  uint64_t max_sample_bytes = 1ull << 30;    // all members of one sample together
  uint64_t max_sample_members = 256;         // members of one sample (Kiln writes 3)
  // The uncompressed tar stream may not be longer (the manifest's "tar_bytes"; nullopt: no cap).
  std::optional<uint64_t> max_tar_bytes;
  std::optional<uint64_t> expected_xxh3;     // verify the whole file's XXH3-64 before reading
  // Which members' data to read: called with the sample's 0-based index in the shard (tar order)
  // and the member's ext. false: the data is skipped without a copy (the member still comes back,
  // with `skipped` set and empty data; every name, size and structure check still applies).
  // Empty: read every member.
  std::function<bool(uint64_t sample, std::string_view ext)> want;
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
