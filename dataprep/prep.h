// `kiln prep`: read + validate -> normalise -> exact dedup -> MinHash -> LSH -> clusters ->
// annotate (domain, tokens) -> shards, with the outputs of docs/PREP.md "Output":
//   OUT/manifest.json  OUT/stats.json  OUT/dedup/removed.jsonl  OUT/rejects/  OUT/shards/
//   OUT/tokenizer.json (when the annotator has a tokenizer)
//
// Stages run in order and are recorded under OUT/.kiln-prep/ (input units with checksums, then
// each finished stage), so the same command after a crash or kill -9 resumes and produces
// byte-identical output. With a ProcessGroup of N ranks (mpirun), ranks split the input files,
// exchange exact and band hashes by owner rank, resolve clusters globally (the kept set equals
// the single-process one) and write their own shards; rank 0 writes the manifest and stats.
// Every rank must call run_prep() with the same config. docs/PREP.md explains it all.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "common/config.h"
#include "common/status.h"
#include "dataprep/dedup/lsh.h"

namespace kiln::prep {

struct PrepRunOptions {
  // Discard an existing dataset or unfinished run in the output folder instead of refusing or
  // resuming.
  bool overwrite = false;
  // Set by the --append driver (dataprep/append.h): dedup.against's first dataset is the one
  // being appended to, so this run's index segment follows its segments, its sample keys follow
  // its documents (key_base = its docs_in), and removed.jsonl names no dataset for its documents.
  bool against_self = false;
  uint64_t key_base = 0;
  // Fingerprints of runs already appended: a run with one of them does nothing and returns
  // already_complete.
  std::vector<std::string> done_fingerprints;
  // --dry-run-filters: stop after the scan with the filters' decisions (rejects/, stats.json
  // with "dry_run_filters": true); no dedup, tokenizer or shards.
  bool filters_only = false;
};

struct PrepResult {
  uint64_t docs_in = 0;
  uint64_t docs_out = 0;
  uint64_t exact_dups = 0;
  uint64_t near_dups = 0;
  uint64_t rejected = 0;
  uint64_t filtered = 0;  // dropped by the quality filters (docs/PREP.md "Quality filters")
  std::map<std::string, uint64_t> rejected_by_reason;
  LshParams lsh;
  bool already_complete = false;  // the output was complete before this call
  bool resumed = false;           // some stages were taken from an earlier, interrupted run
  bool done_before = false;       // its fingerprint is in PrepRunOptions::done_fingerprints
  std::string summary;            // multi-line human summary (rank 0)
};

// Runs (or resumes) prep with a config built from kPrepDefaultsYaml (dataprep/prep_config.h).
// Errors: kUsage/kConfig for bad settings, kData (exit 3) when the rejected share exceeds
// input.max_reject_fraction (naming the worst files), kIo/kInternal otherwise.
Result<PrepResult> run_prep(const Config& config, comm::ProcessGroup& group,
                            const PrepRunOptions& options = {});

}  // namespace kiln::prep
