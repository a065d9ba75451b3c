// The state of one `kiln prep` run that the driver (prep.cc) hands from stage to stage: the
// parsed options, this rank's share of the input, and each finished stage's results (filled in
// order: scan -> exact -> dedup -> annotate -> write; a resumed run restores them from the stage
// markers). A stage reads the results of the stages before it and fills its own; the helpers the
// stages share take narrower views (input_batches.h's InputView, scan_table.h's TableScanner).
// Not thread-safe: the stages' parallel parts read it and write only their own batches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "dataprep/annotate.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/dedup/minhash.h"
#include "dataprep/ingest/document.h"
#include "dataprep/ingest/input.h"
#include "dataprep/prep_config.h"
#include "dataprep/stages/docid.h"
#include "dataprep/stages/input_batches.h"
#include "dataprep/stages/scan_table.h"
#include "dataprep/stages/stats.h"
#include "format/manifest.h"

namespace kiln::prep::detail {

enum Stage : int {
  kNone = 0,
  kScan = 1,
  kExact = 2,
  kDedup = 3,
  kAnnotator = 4,
  kWrite = 5,
  kFinal = 6
};
const char* stage_name(int stage);

// A run of consecutive input files scanned together into one table: the resume granule of the
// scan (a "unit": scan_unit, load_unit, unit_path).
struct FileRun {
  uint32_t first = 0;
  uint32_t last = 0;  // exclusive
};

struct Context {
  PrepOptions opt;  // parsed and validated once; the stages read nothing else of the config
  comm::ProcessGroup* g = nullptr;
  int rank = 0;
  int size = 1;
  std::string out;       // output folder
  std::string work;      // OUT/.kiln-prep
  std::string rank_dir;  // OUT/.kiln-prep/rank-RRRRR
  std::vector<InputFile> files;
  std::vector<uint32_t> rank_file_begin;  // size+1 entries: rank r owns [begin[r], begin[r+1])
  std::vector<FileRun> units;             // this rank's
  std::unique_ptr<MinHasher> hasher;
  RecordLayout layout;
  std::string fingerprint;
  std::map<std::string, double> timings;  // stage -> seconds (accumulated over runs)

  // Incremental prep (dedup.against, --append): the earlier datasets' indexes, in order.
  std::vector<std::unique_ptr<DedupIndex>> against;
  bool against_self = false;   // against[0] is the dataset this run is appended to
  uint32_t index_segment = 0;  // the index segment this run writes
  uint64_t key_base = 0;       // added to the sample keys (the documents before this run)

  // After the scan (global, every rank).
  std::vector<FileStats> file_stats;
  std::vector<uint64_t> file_base;  // global index of ordinal 0 of each file
  // After exact dedup (global): (duplicate, leader), sorted by duplicate.
  std::vector<DocPair> exact_dups;
  // After near dedup (global): every removed document, sorted by docid.
  std::vector<RemovedEntry> removed;
  DedupStats dedup;
  // The annotator (domain tagging, tokenizer): built from the inputs before anything is written
  // when it loads its tokenizer (run_prep), else by the annotator stage after training one.
  ManifestTokenizer tokenizer;
  std::unique_ptr<Annotator> annotator;
  // After the write stage (this rank).
  WriteResult written;

  // The input side of the run, for reading and parsing records (file_base once known).
  InputView inputs() const {
    return {&files, &file_base, opt.repair_utf8, opt.max_line_bytes, &opt.chat};
  }
  uint32_t file_owner(uint32_t fid) const;
  uint32_t my_first_file() const { return rank_file_begin[rank]; }
  uint32_t my_last_file() const { return rank_file_begin[rank + 1]; }
  uint64_t global_index(uint64_t docid) const {
    return file_base[docid_file(docid)] + docid_ordinal(docid);
  }
  std::string unit_path(const FileRun& u, const char* ext) const;
  // This rank's scan tables, in docid order (TableScanner's input).
  std::vector<std::string> table_paths() const;
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

}  // namespace kiln::prep::detail
