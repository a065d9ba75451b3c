// The quality filters' byte-level paths for ASCII texts (text.h take_ascii_path) against their
// general code point paths: every filter, with its defaults and with parameters that let more
// rules decide, on generated ASCII documents made of prose, boilerplate, citations, lists,
// repeated lines and every str.splitlines() break that ASCII has; the decision, rule, measured
// value and edited text must be the same both ways. Non-ASCII documents (which always take the
// general path) are mixed in so the chain switches between the two paths from one document to
// the next.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <random>
#include <string>
#include <vector>

#include "dataprep/filter/filter.h"
#include "dataprep/filter/text.h"

namespace kiln::prep::filter {
namespace {

// plain: only " " between words (else tabs and other ASCII white space too).
std::string random_line(std::mt19937_64& rng, bool allow_non_ascii, bool plain) {
  static const char* kProse[] = {"the",  "of",      "and",   "to",       "with",  "that",
                                 "have", "be",      "river", "mountain", "data",  "people",
                                 "town", "through", "north", "winter",   "built", "was"};
  static const char* kNoise[] = {"Home",
                                 "About",
                                 "Contact",
                                 "cookies",
                                 "Privacy",
                                 "policy",
                                 "Terms",
                                 "of use",
                                 "uses",
                                 "JavaScript",
                                 "lorem",
                                 "ipsum",
                                 "Lorem Ipsum",
                                 "{",
                                 "}",
                                 "[1]",
                                 "[12]",
                                 "[edit]",
                                 "[citation needed]",
                                 "[x]",
                                 "#tag",
                                 "...",
                                 "-",
                                 "*",
                                 "ABC",
                                 "e.g.",
                                 "Mr.",
                                 "!",
                                 "?",
                                 "'",
                                 "\"",
                                 "(see",
                                 "this)",
                                 "x",
                                 "a-b",
                                 "well,",
                                 "end.",
                                 "ok!",
                                 "why?",
                                 "use cookies",
                                 "cookie policy",
                                 "use of cookies",
                                 "www.example.com",
                                 "info@example.org",
                                 "10.0.0.1",
                                 "8.8.8.8",
                                 "192.168.1.1",
                                 "supercalifragilisticexpialidociousandthenalittlemorethanthat"};
  static const char* kNonAscii[] = {"\u00e9t\u00e9", "\u4e2d\u6587\u3002", "\u2026", "\u2022",
                                    "\u212a",        "caf\u00e9."};
  static const char* kSpace[] = {" ", " ", " ", "  ", "\t", "\x0b", "\x1c", "\x1f"};
  std::uniform_int_distribution<int> n_words(0, 18);
  std::string line;
  const int n = n_words(rng);
  for (int i = 0; i < n; ++i) {
    if (i > 0) line += plain ? " " : kSpace[rng() % std::size(kSpace)];
    if (allow_non_ascii && rng() % 30 == 0)
      line += kNonAscii[rng() % std::size(kNonAscii)];
    else if (rng() % 6 == 0)
      line += kNoise[rng() % std::size(kNoise)];
    else
      line += kProse[rng() % std::size(kProse)];
  }
  static const char* kEnd[] = {".", ".", ".", "!", "?", "", "", "...", "\"", "'", "]", ":", " "};
  line += kEnd[rng() % std::size(kEnd)];
  return line;
}

// plain: lines broken by "\n" only (else by every ASCII str.splitlines() break too).
std::string random_document(std::mt19937_64& rng, bool allow_non_ascii, bool plain) {
  static const char* kBreak[] = {"\n", "\n",   "\n",   "\n\n", "\n\n\n", "\r\n",
                                 "\r", "\x0c", "\x1d", "\x1e", "\n \n"};
  std::vector<std::string> lines;
  const int n = static_cast<int>(rng() % 60);
  for (int i = 0; i < n; ++i) {
    if (!lines.empty() && rng() % 4 == 0)
      lines.push_back(lines[rng() % lines.size()]);  // a repeated line
    else
      lines.push_back(random_line(rng, allow_non_ascii, plain));
  }
  std::string doc = rng() % 5 == 0 ? "  " : "";
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) doc += kBreak[rng() % (plain ? 2 : std::size(kBreak))];
    doc += lines[i];
  }
  if (rng() % 5 == 0) doc += "\n";
  return doc;
}

std::string describe(const ChainOutcome& o, const std::string& text) {
  return std::string(o.keep ? "keep" : "drop") + " " + o.drop.rule + " " +
         std::to_string(o.drop.value) + " " + std::to_string(o.edited_mask) + " [" + text + "]";
}

TEST(FilterAsciiPath, SameDecisionsValuesAndTextsAsTheGeneralPath) {
  const std::vector<std::string> chains = {
      R"([{"name": "c4"}])",
      R"([{"name": "c4", "min_num_sentences": 1, "min_words_per_line": 1}])",
      R"([{"name": "c4", "split_paragraph": false, "min_num_sentences": 1}])",
      R"([{"name": "c4", "filter_no_terminal_punct": false, "max_word_length": 20,
           "min_num_sentences": 0}])",
      R"([{"name": "gopher_quality", "min_doc_words": 5}])",
      R"([{"name": "gopher_repetition"}])",
      R"([{"name": "fineweb"}])",
      R"([{"name": "pii"}])",
      R"([{"name": "url", "domains": ["spam.example"]}, {"name": "c4"}, {"name": "pii"},
          {"name": "gopher_repetition"}, {"name": "gopher_quality"}, {"name": "fineweb"}])",
  };
  std::mt19937_64 rng(2929);
  std::vector<std::string> docs;
  size_t ascii = 0;
  for (int i = 0; i < 1500; ++i) {
    docs.push_back(random_document(rng, i % 3 == 0, i % 3 == 1));
    ascii += is_ascii(docs.back());
  }
  ASSERT_GT(ascii, 900u);
  for (const std::string& json : chains) {
    auto chain = FilterChain::from_yaml(YAML::Load(json));
    ASSERT_TRUE(chain.is_ok()) << json;
    size_t kept = 0, edited = 0;
    for (const std::string& doc : docs) {
      std::string fast = doc, general = doc;
      set_ascii_paths(true);
      const ChainOutcome a = (*chain)->run(&fast, "http://a.example/x");
      set_ascii_paths(false);
      const ChainOutcome b = (*chain)->run(&general, "http://a.example/x");
      set_ascii_paths(true);
      ASSERT_EQ(describe(a, fast), describe(b, general)) << json << "\ninput: [" << doc << "]";
      ASSERT_EQ(a.drop.threshold, b.drop.threshold);
      ASSERT_STREQ(a.drop.op, b.drop.op);
      kept += a.keep;
      edited += a.keep && a.edited_mask != 0;
    }
    // The generated documents exercise both outcomes under every chain.
    EXPECT_GT(kept, 0u) << json;
    if (json.find("pii") == std::string::npos || json.find("c4") != std::string::npos) {
      EXPECT_LT(kept, docs.size()) << json;
    }
    if (json.find("c4") != std::string::npos || json.find("pii") != std::string::npos) {
      EXPECT_GT(edited, 0u) << json;
    }
  }
}

}  // namespace
}  // namespace kiln::prep::filter
