// The counters the prep stages produce and exchange between ranks (FileStats per input file,
// DedupStats, the write stage's WriteResult), with their JSON forms for the stage markers and the
// final stage's gather. Plain values; not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dataprep/ingest/doc_parser.h"

namespace kiln::prep::detail {

// What one filter of the chain did (FileStats::filters, by the filter's index in the chain).
struct FilterTally {
  uint64_t docs = 0;                      // documents it dropped
  uint64_t bytes = 0;                     // their input text bytes
  uint64_t edited = 0;                    // kept documents whose text it changed
  int64_t edited_bytes = 0;               // text bytes its edits removed (negative: added)
  std::map<std::string, uint64_t> rules;  // dropped documents by rule
  void add(const FilterTally& o);
};

struct FileStats {
  uint64_t docs_in = 0;
  uint64_t valid = 0;                // parsed and kept by the filters: the scan table's records
  uint64_t text_bytes = 0;           // of valid documents, as the filters left them
  uint64_t input_bytes = 0;          // of every parsed document (the filtered ones too), as read
  uint64_t repaired = 0;             // valid after UTF-8 repair
  uint64_t filtered = 0;             // parsed, then dropped by a quality filter
  std::vector<FilterTally> filters;  // per filter of the chain (empty without filters)
  std::array<uint64_t, kRejectReasonCount> rejected{};
  uint64_t rejected_total() const {
    uint64_t s = 0;
    for (uint64_t r : rejected) s += r;
    return s;
  }
  void add(const FileStats& o);
  nlohmann::json to_json() const;
  static FileStats from_json(const nlohmann::json& j);
};

struct DedupStats {
  uint64_t candidate_pairs = 0;
  uint64_t verified_pairs = 0;
  uint64_t spilled_bytes = 0;
  nlohmann::json to_json() const;
  static DedupStats from_json(const nlohmann::json& j);
};

struct DomainStats {
  uint64_t docs = 0;
  uint64_t tokens = 0;
  uint64_t bytes = 0;
  std::map<std::string, uint64_t> domain_by;
  uint64_t val_docs = 0, val_tokens = 0;  // of docs / tokens: held out for validation
};

struct WrittenShard {
  std::string path;  // relative to OUT, as written by this rank
  std::string domain;
  uint64_t samples = 0, tokens = 0, bytes = 0, xxh3 = 0;
  uint64_t tar_bytes = 0;  // the uncompressed tar stream (the manifest's cap for readers)
  bool val = false;        // a validation shard
};

struct WriteResult {
  std::vector<WrittenShard> shards;
  std::map<std::string, DomainStats> domains;
  // docid -> input id (a JSON string or number) of removed docs and their kept
  std::vector<std::pair<uint64_t, nlohmann::json>> ids;
  uint64_t docs_out = 0;
  nlohmann::json index_run;  // this rank's IndexRunInfo (null when no index is written)
  nlohmann::json to_json() const;
  static WriteResult from_json(const nlohmann::json& j);
};

}  // namespace kiln::prep::detail
