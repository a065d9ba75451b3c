// `kiln inspect OUT`: what a prepared dataset holds, and (with verify) whether it is intact.
//
// The summary: per-domain table (docs, tokens, shards, shard bytes, token share) from the
// manifest, which rule or model assigned the documents and the dedup / reject counts from
// stats.json, and whether docs_in = docs_out + exact_dups + near_dups + rejected holds.
//
// verify re-reads every shard: the file's XXH3 and size against the manifest, every sample's
// members (.txt, .json, .tokens.npy), keys unique in the dataset, the .json's domain and token
// count, the .npy dtype for the vocabulary, every .tokens.npy equal to the tokenizer's encoding of
// the stored .txt, and the sample / token totals per shard and per domain against the manifest
// and stats.json. Shards are checked in parallel (oneTBB). Each mismatch is one problem line.
//
// sample prints N documents spread evenly over the dataset, decoded from their tokens.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

struct InspectOptions {
  bool verify = false;
  uint64_t sample = 0;           // documents to print
  uint64_t sample_bytes = 2000;  // print at most this much of each sampled document
};

struct InspectResult {
  std::string summary;                // the tables (always)
  std::string samples;                // the printed samples (sample > 0)
  std::vector<std::string> problems;  // empty when everything checked agrees
  uint64_t shards_checked = 0;
  uint64_t samples_checked = 0;
};

// kNotFound / kData when the manifest (or stats.json) cannot be read at all; problems found
// while verifying are reported in the result, not as an error.
Result<InspectResult> inspect_dataset(const std::string& out_dir, const InspectOptions& options);

}  // namespace kiln::prep
