// Byte-level BPE training: counting pre-token words, then learning merges. Internal to dataprep;
// users go through Tokenizer::train (dataprep/tokenizer/tokenizer.h). The method is in
// docs/TOKENIZER.md.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dataprep/tokenizer/bpe.h"
#include "dataprep/tokenizer/pretokenize.h"

namespace kiln::prep {

struct WordCount {
  std::string_view word;
  uint64_t count = 0;
};

// Pre-tokenises `texts` and counts each distinct word, in parallel (oneTBB). The views point into
// `texts`. The order of the result is deterministic (by a hash of the word, then its bytes), so
// it does not depend on the thread count.
std::vector<WordCount> count_words(const std::vector<std::string_view>& texts,
                                   const PretokenizerSpec& spec);

struct BpeTrainResult {
  std::vector<BpeMerge> merges;     // ids are: first_merge_id + rank
  std::vector<std::string> tokens;  // bytes of each merged token, in rank order
};

// Learns up to `num_merges` merges from word counts (words need not be distinct; a repeated
// word adds its counts). Byte b has token id byte_ids[b]; the merge of rank r gets id
// first_merge_id + r. Each step merges the pair with the highest count (adjacent occurrences
// summed over words, weighted by the word's count); ties go to the smaller (left, right) id pair,
// so the result is a function of the multiset of words alone: not of their order, nor of the
// thread count (large merge steps run in parallel with oneTBB). Stops early when no pair occurs
// at least `min_frequency` times.
BpeTrainResult train_bpe(std::span<const WordCount> words, const std::array<uint32_t, 256>& byte_ids,
                         uint32_t first_merge_id, size_t num_merges, uint64_t min_frequency);

}  // namespace kiln::prep
