// The scan tables: one fixed-size record per valid document, in docid order, written by the scan
// stage (one file per input unit) and read back by exact / near dedup and the index builder.
//   u64 docid | u64 hash_lo | u64 hash_hi | u32 text_bytes | u32 flags | u64 keys[bands] |
//   u64 sig[num_perm]            (keys and sig only when near dedup is on)
// Records are little-endian host bytes (the tables never leave the machine that wrote them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace kiln::prep::detail {

struct RecordLayout {
  int bands = 0;
  int num_perm = 0;
  size_t bytes = 32;
  size_t keys_offset = 32;
  size_t sig_offset = 32;
  static RecordLayout make(bool near, int bands, int num_perm);
};
constexpr uint32_t kFlagHasSig = 1;  // the document had shingles: keys and sig are set

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

// Streams the records of `tables` (files in order) one at a time. Not thread-safe.
class TableScanner {
 public:
  TableScanner(const RecordLayout& layout, std::vector<std::string> tables)
      : layout_(layout), tables_(std::move(tables)) {}
  ~TableScanner();
  TableScanner(const TableScanner&) = delete;
  TableScanner& operator=(const TableScanner&) = delete;
  // The next record (valid until the next call), or nullptr at the end (status() tells whether it
  // ended by an error).
  const uint8_t* next();
  const Status& status() const { return status_; }

 private:
  RecordLayout layout_;
  std::vector<std::string> tables_;
  size_t table_ = 0;
  FILE* f_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t at_ = 0, n_ = 0;
  Status status_;
};

}  // namespace kiln::prep::detail
