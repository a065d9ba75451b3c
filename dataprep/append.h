// `kiln prep --append DATASET`: adds new input to a prepared dataset, deduplicated against it.
//
// The new input is prepared in DATASET/.kiln-append/stage (an ordinary, resumable prep run with
// DATASET as its first dedup.against, DATASET's tokenizer, domain rules, dedup settings and shard
// and split settings (each where the config leaves the default; the run says which it took), its
// sample keys after DATASET's and its index segment after DATASET's). Then the commit:
//   1. the merged manifest.json, stats.json and dedup/removed.jsonl are written into the stage,
//      together with the list of moves that put the stage's shards, rejects and index segment
//      into DATASET (new shard names continue each domain's numbering);
//   2. DATASET/.kiln-append/commit.json (that list) is written atomically: the commit point;
//   3. the moves run in order, manifest.json last; then commit.json and the stage are removed.
// Before step 2 DATASET is untouched (the stage is a hidden folder the loader never reads); after
// it, every kiln command that opens DATASET for prep or inspection (prep --append, --against,
// inspect) first finishes the moves (finish_pending_append), like a database replaying its
// journal, and the loader, which reads manifest.json only, sees the old or the new manifest with
// all of its shards in place. So a kill -9 at any point leaves DATASET as it was or appended.
// Running the same command again resumes the stage (as any prep run) or finishes the commit.
// Every rank calls append_prep(); rank 0 commits.
#pragma once

#include <string>

#include "comm/comm.h"
#include "common/config.h"
#include "common/status.h"
#include "dataprep/prep.h"

namespace kiln::prep {

// config: the prep config of the new input (its `output` must be empty: the output is DATASET).
// Settings the user left at their defaults are taken from DATASET's index (dedup.*, tokenizer,
// domains, shards.*, split.*); a dedup setting or tokenizer given that differs from the index is
// refused naming it (kUsage); a shards.* / split.* value given is used (and reported).
Result<PrepResult> append_prep(Config config, const std::string& dataset, comm::ProcessGroup& g,
                               const PrepRunOptions& options = {});

// When DATASET holds a decided but unfinished commit, completes it. Returns whether it did.
// Call it from one process while nothing else writes DATASET.
Result<bool> finish_pending_append(const std::string& dataset);

}  // namespace kiln::prep
