// `kiln stream`: the loader alone, printing what one data-parallel rank sees — one JSON line per
// sequence: {"step": S, "row": J (index in the step's global batch), "rank": R, "domain": "name",
// "samples": [input ids of the documents whose
// tokens the sequence holds, in order]} (ids as stored in each sample's <key>.json "id": strings
// or numbers). See docs/LOADER.md "kiln stream".
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "loader/loader.h"

namespace kiln::loader {

struct StreamOptions {
  std::string dataset;  // prep output folder or its manifest.json
  LoaderOptions loader; // dp_rank / dp_world / seq_len / micro_batch / seed / weights ...
  int64_t steps = 0;
  std::vector<std::string> state_in;  // one state, or the states of all ranks (merged)
  std::string state_out;              // "" = none; "{rank}" is replaced by the rank
  // Also print each sequence's "tokens" (seq_len + 1 ids), "doc_starts" (offsets where a document
  // begins) and "loss_mask" (a string of '0' / '1' per token: 1 = a target the loss counts).
  bool show_tokens = false;
};

// Runs the loader for `steps` batches and writes the lines to `out`; writes the state after the
// last batch to state_out (atomically) when set.
Status run_stream(const StreamOptions& options, std::FILE* out);

}  // namespace kiln::loader
