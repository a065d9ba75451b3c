// Byte-level BPE core: the merge table and encoding of one pre-token (training: bpe_train.h).
// Internal to dataprep; users go through dataprep/tokenizer/tokenizer.h.
//
// Token ids: every byte value has a token; each merge (left, right) -> result has a rank (its
// position in the merge list: lower merges first). Encoding a word applies, repeatedly, the
// lowest-ranked merge present in it, at every non-overlapping position left to right — GPT-2's
// algorithm, done with a linked list and a heap in O(n log n).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

struct BpeMerge {
  uint32_t left = 0;
  uint32_t right = 0;
  uint32_t result = 0;
};

class BpeModel {
 public:
  // byte_ids[b] is the token of byte b; merges in rank order. Ids must be < vocab_size.
  BpeModel(std::array<uint32_t, 256> byte_ids, std::vector<BpeMerge> merges);
  BpeModel() = default;

  // Appends the tokens of one pre-token (non-empty bytes). Thread-safe (const).
  void encode_word(std::string_view word, std::vector<uint32_t>* out) const;
  // The same from initial symbols (token ids) instead of bytes: SentencePiece-style BPE, whose
  // symbols are characters (or byte-fallback tokens).
  void encode_symbols(const uint32_t* symbols, size_t n, std::vector<uint32_t>* out) const;

  const std::array<uint32_t, 256>& byte_ids() const { return byte_ids_; }
  const std::vector<BpeMerge>& merges() const { return merges_; }

 private:
  static uint64_t key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }
  // (rank, result) of the merge of a and b, or rank UINT32_MAX when none.
  std::pair<uint32_t, uint32_t> lookup(uint32_t a, uint32_t b) const;

  std::array<uint32_t, 256> byte_ids_{};
  std::vector<BpeMerge> merges_;
  // Open-addressing table keyed by (left << 32 | right); value rank.
  std::vector<uint64_t> table_keys_;
  std::vector<uint32_t> table_ranks_;
  uint64_t table_mask_ = 0;
};

}  // namespace kiln::prep
