// Test helper for the loader tests: writes a small synthetic dataset (shards + manifest.json) with
// RollingShardWriter, npy and write_manifest, and reads back the ground truth.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/random.h"
#include "common/status.h"
#include "format/manifest.h"
#include "format/npy.h"
#include "format/shard_writer.h"
#include "loader/loader.h"

namespace kiln::testing {

struct DomainSpec {
  std::string name;
  uint64_t docs = 100;
  uint64_t samples_per_shard = 10;
  uint64_t min_tokens = 0;  // document lengths are uniform in [min_tokens, max_tokens]
  uint64_t max_tokens = 40;
};

struct DatasetSpec {
  std::vector<DomainSpec> domains;
  uint64_t vocab_size = 1000;  // <= 65536: uint16 npy, else uint32
  int64_t eos_id = 0;
  ShardCompression compression = ShardCompression::kZstd;
  uint64_t seed = 1;
  bool numeric_ids = false;  // "id": <number> in <key>.json instead of "<domain>-<n>"
  // When set: document i's <key>.json is jsons[i % size] as written, its id what nlohmann::json
  // dumps of that object's "id".
  std::vector<std::string> jsons;
};

struct TruthDoc {
  std::string domain;
  std::string id;  // the id as raw JSON: "\"<domain>-<n>\"" or a number
  std::vector<uint32_t> tokens;
};

// Ground truth: docs by (manifest shard index, member index).
struct Dataset {
  std::string dir;
  Manifest manifest;
  std::map<std::pair<uint32_t, uint32_t>, TruthDoc> docs;
};

// Writes <dir>/shards/<domain>/<domain>-NNNNNN.tar[.zst] and <dir>/manifest.json.
inline Result<Dataset> make_dataset(const std::string& dir, const DatasetSpec& spec) {
  namespace fs = std::filesystem;
  fs::remove_all(dir);
  fs::create_directories(dir);
  Dataset ds;
  ds.dir = dir;
  ds.manifest.tokenizer.path = "";
  ds.manifest.tokenizer.vocab_size = spec.vocab_size;
  ds.manifest.tokenizer.eos_id = spec.eos_id;
  SplitMix64 rng(spec.seed);
  const NpyDtype dtype = npy_token_dtype(spec.vocab_size);
  for (const DomainSpec& d : spec.domains) {
    RollingShardWriter::Options o;
    o.dir = dir + "/shards/" + d.name;
    o.prefix = d.name;
    o.compression = spec.compression;
    o.max_samples = d.samples_per_shard;
    o.max_tar_bytes = 0;
    fs::create_directories(o.dir);
    RollingShardWriter writer(o);
    std::vector<TruthDoc> docs;
    for (uint64_t i = 0; i < d.docs; ++i) {
      TruthDoc doc;
      doc.domain = d.name;
      doc.id = spec.numeric_ids ? std::to_string(1000 * (&d - spec.domains.data()) + i)
                                : "\"" + d.name + "-" + std::to_string(i) + "\"";
      const uint64_t n = d.min_tokens + rng.next() % (d.max_tokens - d.min_tokens + 1);
      for (uint64_t t = 0; t < n; ++t) {
        doc.tokens.push_back(1 + static_cast<uint32_t>(rng.next() % (spec.vocab_size - 1)));
      }
      ShardSample s;
      s.key = d.name + "_" + std::to_string(i);
      s.members.push_back({"txt", "text of " + doc.id});
      if (spec.jsons.empty()) {
        s.members.push_back({"json", "{\"id\":" + doc.id + ",\"domain\":\"" + d.name +
                                         "\",\"tokens\":" + std::to_string(n) + "}"});
      } else {
        const std::string& j = spec.jsons[i % spec.jsons.size()];
        doc.id = nlohmann::json::parse(j).at("id").dump();
        s.members.push_back({"json", j});
      }
      s.members.push_back({"tokens.npy", npy_encode(doc.tokens, dtype)});
      KILN_RETURN_IF_ERROR(writer.add(s, n));
      docs.push_back(std::move(doc));
    }
    KILN_ASSIGN_OR_RETURN(auto infos, writer.finish());
    uint64_t next = 0;
    for (const ShardInfo& info : infos) {
      const uint32_t shard_index = static_cast<uint32_t>(ds.manifest.shards.size());
      ds.manifest.add_shard(info, d.name, dir);
      for (uint32_t m = 0; m < info.samples; ++m) ds.docs[{shard_index, m}] = docs[next++];
    }
    if (d.docs == 0) ds.manifest.domains[d.name];  // a domain with no samples
  }
  KILN_RETURN_IF_ERROR(write_manifest(dir + "/manifest.json", ds.manifest));
  KILN_ASSIGN_OR_RETURN(ds.manifest, read_manifest(dir + "/manifest.json"));
  return ds;
}

// A fresh directory under a per-process root that is removed when the process exits.
inline std::string test_tmpdir(const std::string& name) {
  static const std::string* root = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    auto* r = new std::string(  // never destroyed: the exit handler below still needs it
        (base ? std::string(base) : std::filesystem::temp_directory_path().string()) +
        "/kiln_loader_" + std::to_string(::getpid()));
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(test_tmpdir(""), ec);
    });
    return r;
  }();
  return name.empty() ? *root : *root + "/" + name;
}

// Checks a batch against the ground truth (every row is exactly its spans' tokens, spans tile the
// row) and records which tokens of which document each span held, per (domain, epoch).
class Coverage {
 public:
  explicit Coverage(const Dataset* ds) : ds_(ds) {}

  // Returns "" or a description of the first mismatch.
  std::string add(const loader::Batch& b, uint32_t eos, int rank = 0) {
    const int64_t width = b.seq_len + 1;
    if (static_cast<int64_t>(b.tokens.size()) != b.micro_batch * width) return "bad batch size";
    for (int64_t r = 0; r < b.micro_batch; ++r) {
      int64_t at = 0;
      for (const loader::DocSpan& s : b.docs[r]) {
        if (static_cast<int64_t>(s.seq_offset) != at) return "spans do not tile the row";
        auto it = ds_->docs.find({s.shard, s.member});
        if (it == ds_->docs.end()) return "span names an unknown document";
        const TruthDoc& doc = it->second;
        std::vector<uint32_t> full = doc.tokens;
        full.push_back(eos);
        if (s.doc_offset + s.length > full.size()) return "span past the document end";
        if (s.ends != (s.doc_offset + s.length == full.size())) return "span 'ends' flag wrong";
        for (uint32_t i = 0; i < s.length; ++i) {
          if (b.tokens[r * width + s.seq_offset + i] != full[s.doc_offset + i]) {
            return "token mismatch in " + doc.id;
          }
        }
        pieces_[{doc.domain, s.epoch}][{s.shard, s.member}].push_back({s.doc_offset, s.length});
        ranks_[{doc.domain, s.epoch}][{s.shard, s.member}].insert(rank);
        at += s.length;
      }
      if (at != width) return "spans do not fill the row";
    }
    return "";
  }

  // "" when every document of `domain` was held exactly once, completely, in `epoch`
  // (and, with one_rank, by exactly one rank).
  std::string check_epoch(const std::string& domain, uint64_t epoch, uint32_t eos,
                          bool one_rank = true) const {
    auto pit = pieces_.find({domain, epoch});
    size_t expected = 0;
    for (const auto& [key, doc] : ds_->docs) {
      if (doc.domain != domain) continue;
      ++expected;
      if (pit == pieces_.end()) return "epoch never seen";
      auto dit = pit->second.find(key);
      if (dit == pit->second.end()) return "document " + doc.id + " missing in epoch";
      auto pieces = dit->second;
      std::sort(pieces.begin(), pieces.end());
      uint64_t at = 0;
      for (const auto& [off, len] : pieces) {
        if (off != at) return "document " + doc.id + " tokens repeated or skipped";
        at += len;
      }
      if (at != doc.tokens.size() + 1) return "document " + doc.id + " incomplete";
      if (one_rank && ranks_.at({domain, epoch}).at(key).size() != 1) {
        return "document " + doc.id + " seen by several ranks";
      }
    }
    if (pit != pieces_.end() && pit->second.size() != expected) return "extra documents";
    return "";
  }

 private:
  const Dataset* ds_;
  std::map<std::pair<std::string, uint64_t>,
           std::map<std::pair<uint32_t, uint32_t>, std::vector<std::pair<uint64_t, uint64_t>>>>
      pieces_;
  std::map<std::pair<std::string, uint64_t>, std::map<std::pair<uint32_t, uint32_t>, std::set<int>>>
      ranks_;
};

}  // namespace kiln::testing
