// Internals of the prep pipeline shared by prep*.cc. Not a public interface.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "common/config.h"
#include "common/status.h"
#include "dataprep/annotate.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/dedup/lsh.h"
#include "dataprep/dedup/minhash.h"
#include "dataprep/ingest/doc_parser.h"
#include "dataprep/ingest/input.h"
#include "dataprep/ingest/line_reader.h"
#include "dataprep/prep_config.h"
#include "format/manifest.h"

namespace kiln::prep::detail {

// A document's identity during prep: (file index << 40) | ordinal within the file. Sorting docids
// sorts documents in the global order (files by path, then line).
constexpr int kFidShift = 40;
inline uint64_t make_docid(uint64_t fid, uint64_t ordinal) { return (fid << kFidShift) | ordinal; }
inline uint32_t docid_file(uint64_t d) { return static_cast<uint32_t>(d >> kFidShift); }
inline uint64_t docid_ordinal(uint64_t d) { return d & ((uint64_t{1} << kFidShift) - 1); }
// At most 2^23 input files, so bit 63 of a docid is free: it marks a document of an earlier
// dataset (dedup.against i, 7 bits) by its index ref (dataset << 56 | ref). External docids sort
// after every input document; the clustering orders them first (they are earlier input).
constexpr uint32_t kMaxInputFiles = uint32_t{1} << 23;
constexpr uint64_t kExternalBit = uint64_t{1} << 63;
inline uint64_t make_external(uint32_t dataset, uint64_t ref) {
  return kExternalBit | (static_cast<uint64_t>(dataset) << 56) | ref;
}
inline bool is_external(uint64_t d) { return (d & kExternalBit) != 0; }
inline uint32_t external_dataset(uint64_t d) { return static_cast<uint32_t>((d >> 56) & 0x7f); }
inline uint64_t external_ref(uint64_t d) { return d & ((uint64_t{1} << 56) - 1); }

enum Stage : int { kNone = 0, kScan = 1, kExact = 2, kDedup = 3, kAnnotator = 4, kWrite = 5,
                   kFinal = 6 };
const char* stage_name(int stage);

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
  uint64_t valid = 0;        // parsed and kept by the filters: the scan table's records
  uint64_t text_bytes = 0;   // of valid documents, as the filters left them
  uint64_t input_bytes = 0;  // of every parsed document (the filtered ones too), as read
  uint64_t repaired = 0;    // valid after UTF-8 repair
  uint64_t filtered = 0;    // parsed, then dropped by a quality filter
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

// A table record (one per valid document, in docid order):
//   u64 docid | u64 hash_lo | u64 hash_hi | u32 text_bytes | u32 flags | u64 keys[bands] |
//   u64 sig[num_perm]            (keys and sig only when near dedup is on)
struct RecordLayout {
  int bands = 0;
  int num_perm = 0;
  size_t bytes = 32;
  size_t keys_offset = 32;
  size_t sig_offset = 32;
  static RecordLayout make(bool near, int bands, int num_perm);
};
constexpr uint32_t kFlagHasSig = 1;

struct RecordView {
  const uint8_t* p;
  uint64_t docid() const { return load64(0); }
  uint64_t hash_lo() const { return load64(8); }
  uint64_t hash_hi() const { return load64(16); }
  uint32_t text_bytes() const { return load32(24); }
  uint32_t flags() const { return load32(28); }
  uint64_t key(const RecordLayout& l, int b) const { return load64(l.keys_offset + 8 * b); }
  const uint8_t* sig_bytes(const RecordLayout& l) const { return p + l.sig_offset; }
  uint64_t load64(size_t off) const;
  uint32_t load32(size_t off) const;
};

// Two docids (a duplicate and its leader, or a candidate pair); trivially copyable for comm.
struct DocPair {
  uint64_t first = 0;
  uint64_t second = 0;
  auto operator<=>(const DocPair&) const = default;
};

// A run of consecutive input files scanned together into one table: the resume granule of the
// scan (a "unit": scan_unit, load_unit, unit_path).
struct FileRun {
  uint32_t first = 0;
  uint32_t last = 0;  // exclusive
};

struct RemovedEntry {
  uint64_t docid = 0;
  uint64_t kept = 0;
  double similarity = 1.0;
  uint32_t exact = 0;  // 1 = exact duplicate (of a document whose cluster keeps `kept`)
  uint32_t pad = 0;
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
  bool val = false;  // a validation shard
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

struct Context {
  PrepOptions opt;  // parsed and validated once; the stages read nothing else of the config
  comm::ProcessGroup* g = nullptr;
  int rank = 0;
  int size = 1;
  std::string out;        // output folder
  std::string work;       // OUT/.kiln-prep
  std::string rank_dir;   // OUT/.kiln-prep/rank-RRRRR
  std::vector<InputFile> files;
  std::vector<uint32_t> rank_file_begin;  // size+1 entries: rank r owns [begin[r], begin[r+1])
  std::vector<FileRun> units;                // this rank's
  std::unique_ptr<MinHasher> hasher;
  RecordLayout layout;
  std::string fingerprint;
  std::map<std::string, double> timings;  // stage -> seconds (accumulated over runs)

  // Incremental prep (dedup.against, --append): the earlier datasets' indexes, in order.
  std::vector<std::unique_ptr<DedupIndex>> against;
  bool against_self = false;    // against[0] is the dataset this run is appended to
  uint32_t index_segment = 0;   // the index segment this run writes
  uint64_t key_base = 0;        // added to the sample keys (the documents before this run)

  // After the scan (global, every rank).
  std::vector<FileStats> file_stats;
  std::vector<uint64_t> file_base;  // global index of ordinal 0 of each file
  // After exact dedup (global): (duplicate, leader), sorted by duplicate.
  std::vector<DocPair> exact_dups;
  // After near dedup (global): every removed document, sorted by docid.
  std::vector<RemovedEntry> removed;
  DedupStats dedup;
  // After the annotator stage.
  ManifestTokenizer tokenizer;
  std::unique_ptr<Annotator> annotator;
  // After the write stage (this rank).
  WriteResult written;

  uint32_t file_owner(uint32_t fid) const;
  uint32_t my_first_file() const { return rank_file_begin[rank]; }
  uint32_t my_last_file() const { return rank_file_begin[rank + 1]; }
  uint64_t global_index(uint64_t docid) const {
    return file_base[docid_file(docid)] + docid_ordinal(docid);
  }
  std::string unit_path(const FileRun& u, const char* ext) const;
  std::string stage_marker(int stage) const;
  std::string tmp_dir() const { return rank_dir + "/tmp"; }
  bool is_removed(uint64_t docid) const;
  bool is_exact_dup(uint64_t docid) const;

  // During the scan (this rank): documents repeating an earlier document's URL (url dedup).
  std::vector<uint64_t> url_dups;
  // After the scan (this rank): the documents the quality filters dropped, sorted.
  std::vector<uint64_t> filtered;
  bool is_filtered(uint64_t docid) const {
    return std::binary_search(filtered.begin(), filtered.end(), docid);
  }
  // The kept document's text as the filters leave it, and their annotations in its metadata.
  // Call for documents the scan kept (not filtered); a no-op without rewriting filters.
  void refilter(Document* doc) const;
};

// Loads this rank's filtered lists (the scan units' .flt files) into c.filtered.
Status load_filtered(Context& c);

// Streams this rank's scan-table records in docid order (prep_dedup.cc).
class TableScanner {
 public:
  explicit TableScanner(const Context& c) : c_(c) {}
  ~TableScanner();
  TableScanner(const TableScanner&) = delete;
  TableScanner& operator=(const TableScanner&) = delete;
  // The next record, or nullptr at the end (status() tells whether it ended by an error).
  const uint8_t* next();
  const Status& status() const { return status_; }

 private:
  const Context& c_;
  size_t unit_ = 0;
  FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t at_ = 0, n_ = 0;
  Status status_;
};

// The dedup settings of this run, as an index records them.
DedupSettings dedup_settings(const PrepOptions& opt);

// Whether a removed document is an entry of this run's index segment: a near duplicate of a
// document of this dataset (docs/PREP.md "Incremental prep").
bool index_entry(const Context& c, const RemovedEntry& e);

// Builds this rank's run of the index segment (prep_index.cc) while the write stage hands it the
// kept documents and removed entries in order. Collective: every rank constructs it and calls
// finish().
class IndexBuilder {
 public:
  explicit IndexBuilder(Context& c);
  ~IndexBuilder();
  bool enabled() const { return enabled_; }
  // The next kept document or removed entry of this rank (docid order) and its input id as JSON
  // text.
  Status add(uint64_t docid, std::string_view id_json);
  // Runs the rest of the table, exchanges the refs of cluster representatives and writes the
  // run; returns its IndexRunInfo as JSON.
  Result<nlohmann::json> finish();

 private:
  Status advance_to(uint64_t docid, bool* found);
  Result<uint64_t> ref_of_kept(uint64_t kept) const;
  Context& c_;
  bool enabled_ = false;
  std::unique_ptr<IndexRunWriter> writer_;
  std::unique_ptr<TableScanner> scan_;
  uint64_t first_ = 0, next_ordinal_ = 0;
  std::vector<uint64_t> reps_;                          // this rank's documents removed ones keep
  std::vector<std::pair<uint64_t, uint64_t>> my_reps_;  // (docid, ref) of those, once written
  uint64_t last_lo_ = 0, last_hi_ = 0;                  // the record advance_to() found
  std::vector<uint64_t> last_keys_, last_sig_;
  struct Pending {
    uint64_t lo, hi, kept;
  };
  std::vector<Pending> pending_;  // removed documents whose representative's ref is elsewhere
  struct PendingLink {
    uint64_t ref, kept;
  };
  std::vector<PendingLink> pending_links_;  // removed entries whose representative is elsewhere
};

// Stage implementations (prep_scan.cc, prep_dedup.cc, prep_write.cc). Each is collective:
// every rank calls it; it returns this rank's status (callers agree() afterwards).
Status scan_stage(Context& c);
Status check_units(Context& c, bool verify_checksums);
Status exact_stage(Context& c);
Status dedup_stage(Context& c);
Status annotator_stage(Context& c, bool fresh);
Status write_stage(Context& c);

// ---- helpers shared by the stages ------------------------------------------------------------

// One batch of raw records read from one input file, in order.
struct RawItem {
  uint64_t ordinal = 0;
  uint64_t line = 0;
  LineEventKind kind = LineEventKind::kLine;
  size_t offset = 0;  // into RawBatch::data (kLine)
  size_t length = 0;  // kLine: text length; kTooLong: the line's length
  std::string detail;
};
struct RawBatch {
  uint32_t fid = 0;
  std::string data;
  std::vector<RawItem> items;
  std::string_view text(const RawItem& it) const { return {data.data() + it.offset, it.length}; }
};

// Reads one input file as batches of raw records (blank JSONL lines are skipped, not counted).
// RawBatch::data always has 64 readable bytes after its end, so lines parse in place.
class FileBatcher {
 public:
  static Result<std::unique_ptr<FileBatcher>> open(const Context& c, uint32_t fid);
  // Fills *b (cleared) with up to ~4 MiB / 4096 records. Returns false at the end of the file.
  Result<bool> next(RawBatch* b);
  uint64_t disk_bytes() const { return reader_->disk_bytes(); }

 private:
  uint32_t fid_ = 0;
  InputKind kind_ = InputKind::kJsonl;
  std::unique_ptr<LineReader> reader_;
  uint64_t ordinal_ = 0;
  bool done_ = false;
};

// Parses one raw record into doc (or a reject). Sets doc->index/file/line as well. With
// copy_text false, doc->text is left alone and only the result's text view is set.
ParseResult parse_item(const Context& c, const RawBatch& b, const RawItem& it, bool want_fields,
                       Document* doc, bool copy_text = true);

// Testing hook for kill -9 tests: when the environment variable KILN_PREP_CRASH_AT is "name" or
// "name:N", the process kills itself with SIGKILL at that point (the N-th time it is reached).
// Points: "scan-batch", "scan-unit", "stage-<name>" (after the stage is recorded),
// "write-doc", "final-removed" (after removed.jsonl, before the manifest).
// KILN_PREP_CRASH_SIGNAL=N raises signal N there instead of SIGKILL (stop-signal tests).
void crash_point(const char* name);

// The sample's <key>.json bytes: id, domain, domain_by, source, url (when set), tokens (count) and
// the carried fields, keys sorted; exactly nlohmann::json::dump() of that object.
std::string sample_metadata(const Document& doc);

// Files listing, JSON helpers.
Status make_dirs(const std::string& path);
Status remove_all(const std::string& path);
std::string rank_tag(int rank);  // "00003"
Result<nlohmann::json> read_json_file(const std::string& path);
Status write_json_file(const std::string& path, const nlohmann::json& j);
// A binary blob with a recorded checksum: "<path>" + marker fields {"bytes","xxh3"}.
Status write_blob(const std::string& path, const std::string& bytes, nlohmann::json* info);
Result<std::string> read_blob(const std::string& path, const nlohmann::json& info);

}  // namespace kiln::prep::detail
