// manifest.json: the dataset description written by `kiln prep` and read by the loader.
// Format "kiln-shards/1" (see docs/FORMATS.md "manifest.json"). Reading validates every field
// and shard path (relative, no "..") and names the field on error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/shard.h"
#include "format/shard_reader.h"
#include "common/status.h"

namespace kiln {

inline constexpr const char* kManifestFormat = "kiln-shards/1";

struct ManifestTokenizer {
  std::string path;  // relative to the manifest's directory; "" when no tokenizer
  uint64_t vocab_size = 0;
  int64_t eos_id = -1;
};

struct ManifestDomain {
  uint64_t samples = 0;
  uint64_t tokens = 0;
  uint64_t shards = 0;
  uint64_t bytes = 0;
};

struct ManifestShard {
  std::string path;    // relative to the manifest's directory
  std::string domain;
  uint64_t samples = 0;
  uint64_t tokens = 0;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  // Length of the uncompressed tar stream ("tar_bytes"; 0 = not recorded, manifests before it).
  // Readers refuse a shard that decompresses to more.
  uint64_t tar_bytes = 0;
  bool val = false;    // "split": "val" - a validation shard (absent means train)
};

struct Manifest {
  std::string format = kManifestFormat;
  ManifestTokenizer tokenizer;
  // Totals of each domain's training shards (validation shards are listed in `shards` only),
  // derived from shards by add_shard().
  std::map<std::string, ManifestDomain> domains;
  std::vector<ManifestShard> shards;
  std::string dir;  // directory the manifest was read from (not serialised)

  // Appends a shard (path made relative to `root`) and updates its domain's totals.
  void add_shard(const ShardInfo& info, const std::string& domain, const std::string& root,
                 bool val = false);
  // Absolute-or-cwd-relative path of a shard: dir / shard.path.
  std::string shard_path(const ManifestShard& shard) const;
  // shard_path() for opening: a kData error naming the shard when it (through a symbolic link
  // anywhere on the way) resolves to a file outside the manifest's directory.
  Result<std::string> checked_shard_path(const ManifestShard& shard) const;
  // How to read a listed shard: its checksum (when verify_checksum) and its tar_bytes cap.
  static ShardReaderOptions reader_options(const ManifestShard& shard, bool verify_checksum);
};

// The dataset of one split: only the training shards (val false) or only the validation shards,
// with the domain totals recomputed from them (every domain kept, possibly empty).
Manifest select_split(const Manifest& m, bool val);

std::string manifest_to_json(const Manifest& m);  // deterministic bytes (sorted keys, fixed order)
Result<Manifest> manifest_from_json(const std::string& text, const std::string& origin);
Status write_manifest(const std::string& path, const Manifest& m);  // atomic
// A file, or a directory holding one; or several of them separated by commas ("ds1,ds2"), read
// as one dataset (merge_manifests).
Result<Manifest> read_manifest(const std::string& path);
// Several datasets as one: their shards in order (paths joined with each one's directory; the
// result's dir is ""), domain totals added. kData unless all use the same tokenizer (same
// vocab_size, eos_id and file bytes), naming the two datasets that differ.
Result<Manifest> merge_manifests(const std::vector<Manifest>& parts);

}  // namespace kiln
