#include "dataprep/tokenizer/added_vocab.h"

#include <utf8proc.h>

#include <algorithm>

#include "dataprep/tokenizer/unicode_data.h"

namespace kiln::prep {

AddedMatcher::AddedMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  nodes_.emplace_back();  // the root
  auto find_edge = [&](uint32_t node, uint8_t b) -> uint32_t {
    for (uint32_t e = nodes_[node].first_edge; e != UINT32_MAX; e = edges_[e].next)
      if (edges_[e].byte == b) return edges_[e].child;
    return 0;
  };
  // The trie of the reversed tokens.
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& s = tokens_[t].text;
    uint32_t node = 0;
    for (size_t k = s.size(); k-- > 0;) {
      const auto b = static_cast<uint8_t>(s[k]);
      uint32_t next = find_edge(node, b);
      if (next == 0) {
        next = uint32_t(nodes_.size());
        nodes_.emplace_back();
        edges_.push_back({next, nodes_[node].first_edge, b});
        nodes_[node].first_edge = uint32_t(edges_.size() - 1);
        if (node == 0) root_next_[b] = next;
      }
      node = next;
    }
    if (nodes_[node].out == 0) nodes_[node].out = uint32_t(t + 1);  // (the first of equal texts)
  }
  // Failure links, breadth first; out = own token, else the failure node's (a shorter suffix).
  std::vector<uint32_t> queue;
  for (uint32_t e = nodes_[0].first_edge; e != UINT32_MAX; e = edges_[e].next)
    queue.push_back(edges_[e].child);
  for (size_t q = 0; q < queue.size(); ++q) {
    const uint32_t node = queue[q];
    if (nodes_[node].out == 0) nodes_[node].out = nodes_[nodes_[node].fail].out;
    for (uint32_t e = nodes_[node].first_edge; e != UINT32_MAX; e = edges_[e].next) {
      const uint32_t c = edges_[e].child;
      nodes_[c].fail = child(nodes_[node].fail, edges_[e].byte);
      queue.push_back(c);
    }
  }
}

uint32_t AddedMatcher::child(uint32_t node, uint8_t b) const {
  while (true) {
    if (node == 0) return root_next_[b];
    for (uint32_t e = nodes_[node].first_edge; e != UINT32_MAX; e = edges_[e].next)
      if (edges_[e].byte == b) return edges_[e].child;
    node = nodes_[node].fail;
  }
}

void AddedMatcher::longest_starts(std::string_view text, std::vector<uint32_t>* best) const {
  best->assign(text.size(), 0);
  uint32_t node = 0;
  for (size_t i = text.size(); i-- > 0;) {
    node = child(node, static_cast<uint8_t>(text[i]));
    (*best)[i] = nodes_[node].out;
  }
}

bool added_is_space(int32_t cp) { return unicode::is_white_space(cp); }

// Rust regex \w: Alphabetic, marks, decimal digits, connector punctuation, Join_Control.
// Alphabetic is taken as the letters, Nl and the Other_Alphabetic symbols (circled and squared
// Latin letters); its other Other_Alphabetic code points are marks.
bool added_is_word_char(int32_t c) {
  if (c < 0) return false;
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189))
    return true;
  const unicode::Gc g = unicode::category(c);
  return unicode::is_letter(g) || g == unicode::kNl || unicode::is_mark(g) || g == unicode::kNd ||
         g == unicode::kPc;
}

int32_t added_last_cp(std::string_view text) {
  if (text.empty()) return -1;
  size_t i = text.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  utf8proc_int32_t c = -1;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                   static_cast<utf8proc_ssize_t>(text.size() - i), &c);
  return c;
}

int32_t added_first_cp(std::string_view text, size_t* len) {
  if (text.empty()) return -1;
  utf8proc_int32_t c = -1;
  const utf8proc_ssize_t n =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                       static_cast<utf8proc_ssize_t>(text.size()), &c);
  if (len) *len = n > 0 ? static_cast<size_t>(n) : 1;
  return c;
}

}  // namespace kiln::prep
