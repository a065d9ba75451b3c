// Internal to loader/: decoding — one planned unit read from its shard into the packed token
// stream the packer cuts sequences from.
//
// decode_unit() reads the unit's shard (checking its XXH3 against the manifest when asked),
// takes the planned members in the plan's order (reading only their .tokens.npy, and .json for ids:
// the other members and samples are skipped without a copy), stores their tokens, drops the
// first skip_tokens tokens of the first member (a restored position) and appends the eos id after
// every document, and carries <key>.mask.npy loss masks beside (Unit::loss). Problems (missing
// member, malformed .npy, a token id >= vocab_size, a sample count that differs from the manifest)
// set Unit::status to a kData naming the shard and member. Thread-safe for distinct units (workers
// decode in parallel without the loader's lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"
#include "format/manifest.h"
#include "loader/plan.h"

namespace kiln::loader::detail {

// One unit's packed tokens once decoded.
struct Unit {
  UnitPlan plan;
  bool ready = false;
  bool skipped = false;  // a bad shard skipped under skip_bad_shards: no documents
  Status status;
  // Packed: every document's tokens then eos. Stored 16 bits wide (`narrow`, tokens16) when the
  // shard's .tokens.npy are uint16 and eos fits, else 32 bits (tokens): half the memory for every
  // vocabulary up to 65,536; rows are widened when they are cut (copy_tokens).
  bool narrow = false;
  std::vector<uint32_t> tokens;
  std::vector<uint16_t> tokens16;
  // Per packed token: 1 when it is a target the loss counts. Empty when no document of the
  // unit has a <key>.mask.npy (every token counts). A chat document's tokens take its mask and
  // the eos after it 0 (its template's end-of-turn token ends it); other documents' are all 1.
  std::vector<uint8_t> loss;
  std::vector<uint64_t> doc_start;  // offsets into the packed tokens, size docs + 1
  std::vector<std::string> ids;     // raw JSON ids (sample_ids only)
  uint64_t tar_bytes = 0;
  size_t docs() const { return doc_start.empty() ? 0 : doc_start.size() - 1; }
  uint64_t size() const { return narrow ? tokens16.size() : tokens.size(); }
  // Packed tokens [begin, begin + n) as uint32 into dst.
  void copy_tokens(uint64_t begin, uint64_t n, uint32_t* dst) const {
    if (!narrow) {
      std::memcpy(dst, tokens.data() + begin, n * sizeof(uint32_t));
      return;
    }
    const uint16_t* src = tokens16.data() + begin;
    for (uint64_t i = 0; i < n; ++i) dst[i] = src[i];
  }
};

struct DecodeOptions {
  bool verify_checksums = true;  // check the shard's XXH3-64 against the manifest first
  bool sample_ids = false;       // also parse "id" from each sample's <key>.json
  uint32_t eos = 0;              // appended after every document
};

// Fills unit->tokens / doc_start / ids / tar_bytes from unit->plan, or sets unit->status.
// unit->tokens / tokens16 may hold recycled buffers (their capacity is reused). When `abort`
// becomes true the decode stops early with a kInternal "loader stopped". `siblings`: units of other
// streams in the same shard (disjoint members) filled from the same read (tar_bytes stays 0 for
// them); one that fails gets its own status, and unit's status is set when the read itself fails.
void decode_unit(const Manifest& manifest, const DecodeOptions& options,
                 const std::atomic<bool>& abort, Unit* unit,
                 const std::vector<Unit*>& siblings = {});

}  // namespace kiln::loader::detail
