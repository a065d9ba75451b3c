// The persistent dedup index of a prep output, OUT/dedup/index/ (docs/PREP.md "Incremental
// prep"): what later runs need to deduplicate new data against the dataset without re-reading
// its text.
//
//   index.json                 format "kiln-dedup-index/2", the settings the index was built
//                              with (MinHash, LSH, normalisation, domain rules, and the latest
//                              run's shards.* / split.* settings as "layout") and its segments
//                              (one per prep run: the first, then one per --append)
//   seg-SSSSSS/run-RRRRR.*     one run per rank of the run that wrote the segment:
//     .exact  sorted (hash_lo, hash_hi, ref) records, 24 bytes: every valid document of the run
//             (a removed one points at the document its cluster kept)
//     .bands  sorted (band key, ref) records, 16 bytes: every band of every entry
//     .xidx / .bidx  sparse indexes: the first key of every block of 1024 records
//     .sigs   the entries' MinHash signatures, num_perm x u64, in ref order (empty without near
//             dedup)
//     .ids    one JSON value per line (the entries' input ids), in ref order
//     .idoff  u64 offsets of those lines (entries + 1 values)
//     .kept   u64 per entry, in ref order: the ref of the document its cluster kept (its own ref
//             for a kept document)
//
// The entries of a segment are its kept documents and the near duplicates it removed for a
// document of the same dataset, in input order; both take part in later runs' LSH buckets (as in
// one run over all the data, where a removed document still links its near copies to the cluster
// it joined), and `.kept` links a removed one to its cluster's kept document. A ref is
// (segment << 40) | ordinal, the ordinal being the entry's position in the segment (input order,
// ranks in order), so refs sort in input order. All record fields are little-endian u64. Files
// are memory-mapped and searched through the sparse indexes (one binary search in memory, one
// 1024-record block read), so a lookup reads a few pages whatever the size. Everything is written
// atomically; index.json (the list of segments) is written last.
//
// Format 1 (older kiln) has no removed entries and no `.kept` files; it is read as such (its runs'
// entries are all kept documents). A run records "kept" in index.json when it has a `.kept` file.
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

inline constexpr const char* kDedupIndexFormat = "kiln-dedup-index/2";
inline constexpr const char* kDedupIndexFormatV1 = "kiln-dedup-index/1";  // read, never written
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
  uint64_t first = 0;   // ordinal of its first entry in the segment
  uint64_t docs = 0;    // entries (kept documents and linked removed ones)
  uint64_t kept = 0;    // kept documents among them
  uint64_t exact = 0;   // .exact records
  uint64_t bands = 0;   // .bands records
  bool links = true;    // has a .kept file (false: a format-1 run, every entry kept)
  nlohmann::json to_json() const;
  static IndexRunInfo from_json(const nlohmann::json& j);
};

std::string index_segment_name(uint32_t segment);                       // "seg-000003"
std::string index_run_stem(const std::string& index_dir, uint32_t segment, int rank);

// Writes one run (one rank's part of a segment). Call add_doc() for the entries in ref order,
// add_exact() for any other (hash, ref) pairs, set_link() for links given as kLinkLater, then
// finish(). Records are sorted under `memory_bytes` (spilling to tmp_dir). Not thread-safe.
class IndexRunWriter {
 public:
  IndexRunWriter(std::string index_dir, uint32_t segment, int rank, int num_perm, int bands,
                 std::string tmp_dir, size_t memory_bytes);
  ~IndexRunWriter();
  IndexRunWriter(const IndexRunWriter&) = delete;
  IndexRunWriter& operator=(const IndexRunWriter&) = delete;

  static constexpr uint64_t kLinkLater = ~uint64_t{0};
  // The next entry: `link` is `ref` for a kept document, else the ref of the kept document of its
  // cluster (kLinkLater: given by set_link() before finish()). Then its band keys (bands values,
  // or nullptr when it has no signature), signature (num_perm values; nullptr = none) and input
  // id as JSON text. The exact hash is recorded for a kept document only (a removed one's goes
  // through add_exact, pointing at the kept document).
  Status add_doc(uint64_t ref, uint64_t link, uint64_t hash_lo, uint64_t hash_hi,
                 const uint64_t* keys, const uint64_t* sig, std::string_view id_json);
  Status set_link(uint64_t ref, uint64_t link);
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
  uint64_t kept_docs() const;  // the kept documents (entries that link to themselves)
  uint64_t entries() const;    // kept documents and linked removed ones

  // Refs recorded for an exact hash (earliest segment first); empty when none.
  void find_exact(uint64_t hash_lo, uint64_t hash_hi, std::vector<uint64_t>* refs) const;
  // Refs of the entries with this band key (kept and removed), ascending and unique (all
  // segments).
  void find_band(uint64_t key, std::vector<uint64_t>* refs) const;
  // The ref of the kept document an entry's cluster kept (`ref` itself for a kept document).
  Result<uint64_t> kept_ref(uint64_t ref) const;
  // Checks every entry's link: it goes to a kept entry of the index (which links to itself), and
  // each run holds as many kept entries as index.json says. kData naming the run otherwise.
  Status check_links() const;
  // The signature (num_perm values) of an entry.
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
