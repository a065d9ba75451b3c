// The persistent dedup index of a prep output, OUT/dedup/index/ (docs/PREP.md "Incremental
// prep"): what later runs need to deduplicate new data against the dataset without re-reading
// its text.
//
//   index.json                 format "kiln-dedup-index/1", the settings the index was built
//                              with (MinHash, LSH, normalisation, domain rules, tokenizer) and
//                              its segments (one per prep run: the first, then one per --append)
//   seg-SSSSSS/run-RRRRR.*     one run per rank of the run that wrote the segment:
//     .exact  sorted (hash_lo, hash_hi, ref) records, 24 bytes: every valid document of the run
//             (a removed one points at the document its cluster kept)
//     .bands  sorted (band key, ref) records, 16 bytes: every band of every kept document
//     .xidx / .bidx  sparse indexes: the first key of every block of 1024 records
//     .sigs   the kept documents' MinHash signatures, num_perm x u64, in ref order (empty
//             without near dedup)
//     .ids    one JSON value per line (the kept documents' input ids), in ref order
//     .idoff  u64 offsets of those lines (kept + 1 values)
//
// A ref is (segment << 40) | ordinal: ordinal is the kept document's position in the segment
// (the segment's kept documents in input order, ranks in order). All record fields are
// little-endian u64. Files are memory-mapped and searched through the sparse indexes (one binary
// search in memory, one 1024-record block read), so a lookup reads a few pages whatever the size.
// Everything is written atomically; index.json (the list of segments) is written last.
//
// Thread-safety: a DedupIndex is read-only after open() and safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kiln::prep {

inline constexpr const char* kDedupIndexFormat = "kiln-dedup-index/1";
// The normalisation of dataprep/dedup/normalise.h; bump when its output changes.
inline constexpr const char* kNormalisationVersion = "nfkc-casefold-ignorables-ws/1";

inline constexpr int kRefSegmentShift = 40;
inline uint64_t make_ref(uint64_t segment, uint64_t ordinal) {
  return (segment << kRefSegmentShift) | ordinal;
}
inline uint32_t ref_segment(uint64_t ref) { return static_cast<uint32_t>(ref >> kRefSegmentShift); }
inline uint64_t ref_ordinal(uint64_t ref) { return ref & ((uint64_t{1} << kRefSegmentShift) - 1); }

// The settings that decide which documents are duplicates. Two indexes (or an index and a run)
// can be compared only when all of them are equal.
struct DedupSettings {
  bool exact = true;
  bool near = true;
  double threshold = 0.8;
  int num_perm = 128;
  int bands = 0;
  int rows = 0;
  int ngram = 5;
  uint64_t seed = 1;
  bool strip_punct = false;
  std::string normalisation = kNormalisationVersion;

  nlohmann::json to_json() const;
  static Result<DedupSettings> from_json(const nlohmann::json& j, const std::string& origin);
  // Ok when equal; else kUsage naming the first differing setting (its config key) and both
  // values, e.g. "dedup.num_perm: the index of A was built with 64, this run uses 128".
  Status check_same(const DedupSettings& mine, const std::string& index_name) const;
};

// One run of a segment as recorded in index.json.
struct IndexRunInfo {
  int rank = 0;
  uint64_t first = 0;   // ordinal of its first kept document in the segment
  uint64_t docs = 0;    // kept documents
  uint64_t exact = 0;   // .exact records
  uint64_t bands = 0;   // .bands records
  nlohmann::json to_json() const;
  static IndexRunInfo from_json(const nlohmann::json& j);
};

std::string index_segment_name(uint32_t segment);                       // "seg-000003"
std::string index_run_stem(const std::string& index_dir, uint32_t segment, int rank);

// Writes one run (one rank's part of a segment). Call add_kept() for the kept documents in ref
// order, add_exact() for any (hash, ref) pairs, then finish(). Records are sorted under
// `memory_bytes` (spilling to tmp_dir). Not thread-safe.
class IndexRunWriter {
 public:
  IndexRunWriter(std::string index_dir, uint32_t segment, int rank, int num_perm, int bands,
                 std::string tmp_dir, size_t memory_bytes);
  ~IndexRunWriter();
  IndexRunWriter(const IndexRunWriter&) = delete;
  IndexRunWriter& operator=(const IndexRunWriter&) = delete;

  // The next kept document: its exact hash, band keys (bands values, or nullptr when it has no
  // signature), signature (num_perm values; nullptr = none) and input id as JSON text.
  Status add_kept(uint64_t ref, uint64_t hash_lo, uint64_t hash_hi, const uint64_t* keys,
                  const uint64_t* sig, std::string_view id_json);
  // An exact hash that points at a kept document (of this or an earlier segment).
  Status add_exact(uint64_t hash_lo, uint64_t hash_hi, uint64_t ref);
  Result<IndexRunInfo> finish(uint64_t first_ordinal);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A whole index opened for lookups.
class DedupIndex {
 public:
  // Opens DATASET/dedup/index (DATASET: a prep output folder). kUsage when there is none (the
  // message says the dataset was made without an index), kData when it is damaged.
  static Result<std::unique_ptr<DedupIndex>> open(const std::string& dataset_dir);
  ~DedupIndex();

  const std::string& dataset_dir() const { return dataset_dir_; }
  const DedupSettings& settings() const { return settings_; }
  const nlohmann::json& meta() const { return meta_; }  // the whole index.json
  uint32_t segments() const;
  uint64_t kept_docs() const;

  // Refs recorded for an exact hash (earliest segment first); empty when none.
  void find_exact(uint64_t hash_lo, uint64_t hash_hi, std::vector<uint64_t>* refs) const;
  // Refs of kept documents with this band key, ascending and unique (all segments).
  void find_band(uint64_t key, std::vector<uint64_t>* refs) const;
  // The signature (num_perm values) of a kept document.
  Status signature(uint64_t ref, uint64_t* sig) const;
  // Its input id as JSON text.
  Result<std::string> id_json(uint64_t ref) const;

 private:
  DedupIndex() = default;
  struct Run;
  std::string dataset_dir_;
  DedupSettings settings_;
  nlohmann::json meta_;
  std::vector<std::vector<std::unique_ptr<Run>>> segments_;  // [segment][run]
  const Run* run_of(uint64_t ref) const;
};

// index.json: {"format", "settings": DedupSettings + extra (domains, tokenizer), "segments":
// [{"name", "docs", "runs": [IndexRunInfo...]}]}.
nlohmann::json make_index_meta(const DedupSettings& s, const nlohmann::json& extra,
                               const nlohmann::json& segments);

}  // namespace kiln::prep
