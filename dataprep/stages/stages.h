// The stages of `kiln prep`, in the order the driver (prep.cc's table of resumable stages) runs
// them. Each is collective: every rank calls it; it returns this rank's status (the driver
// agrees on it afterwards). Each reads the results of the stages before it from the Context
// and fills its own (context.h says which fields are whose).
#pragma once

#include "common/status.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/prep_config.h"
#include "dataprep/stages/context.h"

namespace kiln::prep::detail {

// 1. scan (scan.cc): read, validate, filter, hash, shingle and MinHash this rank's documents into
// per-unit tables and reject lists (c.file_stats of this rank's files). check_units() restores a
// finished scan (verify_checksums: also check the tables against their checksums); load_filtered()
// reads the filters' dropped documents into c.filtered.
Status scan_stage(Context& c);
Status check_units(Context& c, bool verify_checksums);
Status load_filtered(Context& c);

// 2. exact dedup and 3. near dedup (dedup.cc): c.exact_dups, then c.removed and c.dedup.
Status exact_stage(Context& c);
Status dedup_stage(Context& c);

// 4. annotate (annotate.cc): c.annotator and c.tokenizer (training the tokenizer on a sample of
// kept documents when the config asks for it); with fresh false, rebuilds the same annotator
// for a resumed run.
Status annotator_stage(Context& c, bool fresh);

// 5. write (write.cc): this rank's kept documents, annotated, into per-domain shards, and its run
// of the dedup index (c.written).
Status write_stage(Context& c);

// The dedup settings of this run, as an index records them.
DedupSettings dedup_settings(const PrepOptions& opt);

// Whether a removed document is an entry of this run's index segment: a near duplicate of a
// document of this dataset (docs/PREP.md "Incremental prep").
bool index_entry(const Context& c, const RemovedEntry& e);

}  // namespace kiln::prep::detail
