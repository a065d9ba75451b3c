// Document identities during `kiln prep` and the outcomes of deduplication, as plain values.
// Header-only, no dependencies: every stage and the driver use these.
#pragma once

#include <compare>
#include <cstdint>

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

// Two docids (a duplicate and its leader, or a candidate pair); trivially copyable for comm.
struct DocPair {
  uint64_t first = 0;
  uint64_t second = 0;
  auto operator<=>(const DocPair&) const = default;
};

// One removed document (trivially copyable: the dedup stage's blob is an array of these).
struct RemovedEntry {
  uint64_t docid = 0;
  uint64_t kept = 0;
  double similarity = 1.0;
  uint32_t exact = 0;  // 1 = exact duplicate (of a document whose cluster keeps `kept`)
  uint32_t pad = 0;
};

}  // namespace kiln::prep::detail
