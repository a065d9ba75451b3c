// WebDataset-style tar shards: the on-disk format shared by `kiln prep` (writes) and the loader
// (reads); this header has the sample, its validation and the shard file names, shard_writer.h
// and shard_reader.h the writing and reading. See docs/FORMATS.md "Shards".
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
  std::string data;  // raw bytes (empty when a reader's member filter skipped them)
  bool skipped = false;  // ShardReaderOptions::want said no: data not read (its size and
                         // place in the tar were still checked)
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
// The key and every member ext valid, no ext twice, at least one member. kData naming the sample.
Status validate_sample(const ShardSample& sample);
// Bytes the sample's members take in a tar stream: per member a 512-byte header (plus a pax
// header for names past 100 bytes) and the data padded to 512 bytes. What rolling counts.
uint64_t sample_tar_bytes(const ShardSample& sample);

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

// The file name of shard `index` of a series: "<prefix>-NNNNNN<ext>" (index zero-padded to six
// digits; more digits past 999999), e.g. "web-000003.tar.zst".
std::string shard_file_name(std::string_view prefix, uint64_t index, ShardCompression compression);

}  // namespace kiln
