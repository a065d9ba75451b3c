// Added tokens of a tokenizer.json found in text as Hugging Face's AddedVocabulary finds them:
// leftmost, then longest, non-overlapping, with the lstrip / rstrip / single_word flags. One
// Aho-Corasick automaton over all the tokens of a pass (built over the reversed tokens, run
// backwards over the text, it gives the longest token starting at each position), so the work is
// linear in the text plus the tokens' total length, however long or many the tokens are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::prep {

struct AddedToken {
  std::string text;  // non-empty
  uint32_t id = 0;
  bool lstrip = false, rstrip = false, single_word = false;
};

class AddedMatcher {
 public:
  AddedMatcher() = default;
  explicit AddedMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }

  // For the text between matches (and around them) calls gap(piece, offset of piece in text);
  // appends each match's id to *out in order.
  template <class Gap>
  void split(std::string_view text, std::vector<uint32_t>* out, const Gap& gap) const;

 private:
  // best[i] = 1 + index of the longest token starting at text[i], or 0.
  void longest_starts(std::string_view text, std::vector<uint32_t>* best) const;
  struct Node {
    uint32_t first_edge = UINT32_MAX;
    uint32_t fail = 0;
    uint32_t out = 0;  // 1 + token index of the longest token that is a suffix here, or 0
  };
  struct Edge {
    uint32_t child, next;
    uint8_t byte;
  };
  uint32_t child(uint32_t node, uint8_t b) const;
  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  uint32_t root_next_[256] = {};  // the root's transitions (0: back to the root)
};

// Unicode White_Space and Rust regex's \w, as the flags test them (added_vocab.cc).
bool added_is_space(int32_t cp);
bool added_is_word_char(int32_t cp);
int32_t added_last_cp(std::string_view text);
int32_t added_first_cp(std::string_view text, size_t* len = nullptr);

template <class Gap>
void AddedMatcher::split(std::string_view text, std::vector<uint32_t>* out, const Gap& gap) const {
  if (tokens_.empty()) {
    if (!text.empty()) gap(text, size_t{0});
    return;
  }
  thread_local std::vector<uint32_t> best;
  longest_starts(text, &best);
  size_t start_offset = 0;  // the end of the last match taken (stripped whitespace included)
  size_t i = 0;             // where the next match is looked for: after the last match found
  while (i < text.size()) {
    if (best[i] == 0) {
      ++i;
      continue;
    }
    const AddedToken& found = tokens_[best[i] - 1];
    size_t start = i, stop = i + found.text.size();
    i = stop;
    if (found.single_word && (added_is_word_char(added_last_cp(text.substr(0, start))) ||
                              added_is_word_char(added_first_cp(text.substr(stop)))))
      continue;
    if (found.lstrip) {
      size_t s = start;
      while (s > start_offset) {
        size_t b = s - 1;
        while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        if (!added_is_space(added_first_cp(text.substr(b, s - b)))) break;
        s = b;
      }
      start = s;
    }
    if (found.rstrip) {
      size_t len = 0;
      while (stop < text.size() && added_is_space(added_first_cp(text.substr(stop), &len)))
        stop += len;
    }
    if (start < start_offset) start = start_offset;  // (a match inside the last one's spaces)
    if (start_offset < start) gap(text.substr(start_offset, start - start_offset), start_offset);
    out->push_back(found.id);
    start_offset = stop;
  }
  if (start_offset < text.size()) gap(text.substr(start_offset), start_offset);
}

}  // namespace kiln::prep
