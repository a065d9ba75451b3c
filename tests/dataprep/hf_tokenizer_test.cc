// Hugging Face tokenizer.json files, the PCRE2 regex pre-tokenizer and SentencePiece models:
// - the hand-written scanners (gpt2, kiln-v1) equal their regular expressions run by PCRE2 on
//   random Unicode (the fast path is tested equal to the regex path);
// - GPT-2 as a tokenizer.json (both merge forms, ByteLevel or a Split regex) gives the exact ids
//   of the independent JS encoder (tests/data/gpt2/sample.ids);
// - Kiln's tokenizers written as tokenizer.json and read back give the same ids; the older
//   kiln-tokenizer/1 file is still read;
// - added tokens, ignore_merges, NFC, add_prefix_space; unsupported files refused naming the field;
// - SentencePiece: ids equal the library's own, decode round trip, save / load.
// Equality with Hugging Face tokenizers itself: tests/python/tokenizer_hf_parity.py.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>
#include <utf8proc.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/atomic_file.h"
#include "dataprep/tokenizer/hf_pipeline.h"  // unicode_normalize
#include "dataprep/tokenizer/pretokenize.h"
#include "dataprep/tokenizer/regex_split.h"
#include "dataprep/tokenizer/tokenizer.h"
#include "tests/test_paths.h"

namespace kiln::prep {
namespace {

using nlohmann::json;

const std::string kGpt2Dir = std::string(kiln::test::source_dir()) + "/tests/data/gpt2";
const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string read_all(const std::string& path) {
  auto r = read_file(path);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : "";
}

std::vector<uint32_t> parse_ids(const std::string& text) {
  std::vector<uint32_t> ids;
  std::istringstream in(text);
  uint32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

void append_cp(std::string* out, int32_t cp) {
  utf8proc_uint8_t buf[4];
  auto len = utf8proc_encode_char(cp, buf);
  out->append(reinterpret_cast<char*>(buf), size_t(len));
}

// Random valid UTF-8 that exercises every rule of the patterns: every kind of white space,
// apostrophes and contractions in both cases, letters with marks, CJK next to Latin, digits of
// all kinds, punctuation, emoji, characters Unicode case folding maps onto ASCII (ſ, K).
std::string random_text(std::mt19937& rng, size_t max_chars) {
  static const std::vector<int32_t> specials = {
      ' ',    ' ',    ' ',    '\n',   '\n',   '\r',   '\t',    0x0B,    0x0C,   0x85,   0xA0,
      0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F,  0x3000,  0x180E, 0x200B, 0xFEFF,
      0x1C,   0x1F,   '\'',   '\'',   's',    'S',    't',     'T',     'r',    'e',    'E',
      'v',    'l',    'L',    'm',    'd',    'D',    0x17F,   0x212A,  0x0301, 0x0308, 0x3099,
      0x309B, 0x30FB, 0x30FC, 0x3005, '0',    '1',    '9',     0x0660,  0xFF11, 0x2162, 0x00BD,
      '!',    '.',    '/',    '_',    '-',    0x2014, 0x1F600, 0x1F44D, 0x200D, 0xFFFD, 0xE000};
  static const std::vector<std::pair<int32_t, int32_t>> ranges = {
      {0x20, 0x7E},       {0x0300, 0x036F}, {0x0370, 0x03FF}, {0x0400, 0x04FF},
      {0x0590, 0x06FF},   {0x0900, 0x097F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF},
      {0x3400, 0x3500},   {0xAC00, 0xD7A3}, {0xFF00, 0xFFEF}, {0x1F300, 0x1FAFF},
      {0x20000, 0x2A6DF}, {0x3100, 0x312F}, {0x31F0, 0x31FF}, {0xF900, 0xFAFF}};
  std::string out;
  size_t n = rng() % (max_chars + 1);
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 2) {
      append_cp(&out, specials[rng() % specials.size()]);
    } else {
      auto [lo, hi] = ranges[rng() % ranges.size()];
      append_cp(&out, lo + int32_t(rng() % uint32_t(hi - lo + 1)));
    }
  }
  return out;
}

std::vector<std::string> pieces_of(std::string_view text, const PretokenizerSpec& spec) {
  std::vector<std::string_view> v;
  EXPECT_TRUE(pretokenize(text, spec, &v).is_ok());
  return {v.begin(), v.end()};
}

PretokenizerSpec regex_spec(const std::string& pattern) {
  auto r = pretokenizer_for_pattern(pattern, /*fast_path=*/false);
  KILN_CHECK(r.is_ok(), r.status().to_string());
  EXPECT_EQ(r->kind, PretokenizerKind::kRegex);
  return std::move(r).value();
}

TEST(RegexPretokenizer, Gpt2ScannerEqualsItsRegex) {
  PretokenizerSpec fast;
  fast.kind = PretokenizerKind::kGpt2;
  PretokenizerSpec slow = regex_spec(gpt2_pattern());
  ASSERT_TRUE(slow.regex->jit());
  std::mt19937 rng(7);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string text = random_text(rng, 30);
    ASSERT_EQ(pieces_of(text, fast), pieces_of(text, slow)) << "text: " << text;
  }
  std::string sample = read_all(kGpt2Dir + "/sample.txt");
  EXPECT_EQ(pieces_of(sample, fast), pieces_of(sample, slow));
}

TEST(RegexPretokenizer, KilnScannerEqualsItsRegex) {
  for (uint32_t chunk : {0u, 1u, 3u}) {
    PretokenizerSpec fast;
    fast.kind = PretokenizerKind::kKiln;
    fast.cjk_chunk = chunk;
    PretokenizerSpec slow = regex_spec(kiln_v1_pattern(chunk));
    std::mt19937 rng(11 + chunk);
    for (int iter = 0; iter < 20000; ++iter) {
      std::string text = random_text(rng, 30);
      ASSERT_EQ(pieces_of(text, fast), pieces_of(text, slow)) << "chunk " << chunk << ": " << text;
    }
  }
}

TEST(RegexPretokenizer, PatternsOfTheScannersSelectTheFastPath) {
  auto g = pretokenizer_for_pattern(gpt2_pattern());
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->kind, PretokenizerKind::kGpt2);
  auto k = pretokenizer_for_pattern(kiln_v1_pattern(5));
  ASSERT_TRUE(k.is_ok());
  EXPECT_EQ(k->kind, PretokenizerKind::kKiln);
  EXPECT_EQ(k->cjk_chunk, 5u);
  auto l = pretokenizer_for_pattern(kLlama3);
  ASSERT_TRUE(l.is_ok());
  EXPECT_EQ(l->kind, PretokenizerKind::kRegex);
  EXPECT_EQ(pretokenizer_pattern(*l), kLlama3);
}

TEST(RegexPretokenizer, Llama3RulesAndInvalidBytes) {
  PretokenizerSpec s = regex_spec(kLlama3);
  EXPECT_EQ(pieces_of("Hello world's 12345 DON'T\n\n  x", s),
            (std::vector<std::string>{"Hello", " world", "'s", " ", "123", "45", " DON", "'T",
                                      "\n\n", " ", " x"}));
  // Invalid bytes never match: they stay in the text between matches, nothing is lost.
  std::string bad = "ab\xff\xfe cd\xc3";
  std::string joined;
  for (const auto& p : pieces_of(bad, s)) joined += p;
  EXPECT_EQ(joined, bad);
  // \s means Unicode White_Space, as in Oniguruma (PCRE2's own \s lacks U+0085).
  EXPECT_EQ(pieces_of("a\xc2\x85\xc2\x85"
                      "b",
                      s),
            (std::vector<std::string>{"a", "\xc2\x85",
                                      "\xc2\x85"
                                      "b"}));
}

TEST(RegexPretokenizer, RewritesAndRefusals) {
  // \d, \p{..}: PCRE2's Unicode 14 class plus what Unicode 16 (Oniguruma's tables) added.
  std::string rewritten = *oniguruma_to_pcre2(R"(a\d[\s\p{L}])");
  EXPECT_EQ(rewritten.rfind(R"(a[\p{Nd})", 0), 0u) << rewritten;
  EXPECT_NE(rewritten.find(R"(\x{1E4F0}-\x{1E4F9})"), std::string::npos);  // Nag Mundari digits
  EXPECT_NE(rewritten.find(std::string(R"([\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A})") +
                           R"(\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\p{L})"),
            std::string::npos);
  EXPECT_NE(rewritten.find(R"(\x{31350}-\x{323AF})"), std::string::npos);  // CJK Extension H
  EXPECT_EQ(*oniguruma_to_pcre2(R"(\H)"), "[^0-9a-fA-F]");
  EXPECT_FALSE(oniguruma_to_pcre2(R"([^\S])").is_ok());
  EXPECT_FALSE(oniguruma_to_pcre2(R"(\Qa\E)").is_ok());
  auto bad = RegexSplitter::compile("(unclosed");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("does not compile"), std::string::npos);
  // Empty matches are skipped; the text between matches is kept.
  auto empty = RegexSplitter::compile("x*");
  ASSERT_TRUE(empty.is_ok());
  std::vector<std::string_view> v;
  (*empty)->split("abxxc", &v);
  EXPECT_EQ(std::vector<std::string>(v.begin(), v.end()),
            (std::vector<std::string>{"ab", "xx", "c"}));
}

// ---- tokenizer.json ---------------------------------------------------------------------------

// GPT-2 as a tokenizer.json built from tests/data/gpt2; `pre` replaces the ByteLevel pre-tokenizer.
json gpt2_tokenizer_json(bool pair_merges, const json& pre = json()) {
  json vocab = json::parse(read_all(kGpt2Dir + "/vocab.json"));
  json merges = json::array();
  std::istringstream in(read_all(kGpt2Dir + "/merges.txt"));
  std::string line;
  std::getline(in, line);  // #version
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    if (pair_merges)
      merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
    else
      merges.push_back(line);
  }
  json t = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens",
             {{{"id", 50256},
               {"content", "<|endoftext|>"},
               {"single_word", false},
               {"lstrip", false},
               {"rstrip", false},
               {"normalized", true},
               {"special", true}}}},
            {"normalizer", nullptr},
            {"pre_tokenizer", pre.is_null() ? json{{"type", "ByteLevel"},
                                                   {"add_prefix_space", false},
                                                   {"trim_offsets", true},
                                                   {"use_regex", true}}
                                            : pre},
            {"post_processor",
             {{"type", "ByteLevel"},
              {"add_prefix_space", true},
              {"trim_offsets", false},
              {"use_regex", true}}},
            {"decoder",
             {{"type", "ByteLevel"},
              {"add_prefix_space", true},
              {"trim_offsets", true},
              {"use_regex", true}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", ""},
              {"end_of_word_suffix", ""},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"vocab", vocab},
              {"merges", merges}}}};
  return t;
}

json split_then_byte_level(const std::string& pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

Tokenizer load_text(const std::string& text, const std::string& origin = "tokenizer.json") {
  auto r = Tokenizer::from_json(text, origin);
  KILN_CHECK(r.is_ok(), r.status().to_string());
  return std::move(r).value();
}

TEST(HfTokenizerJson, Gpt2ExactIdsInBothMergeForms) {
  std::string text = read_all(kGpt2Dir + "/sample.txt");
  std::vector<uint32_t> expected = parse_ids(read_all(kGpt2Dir + "/sample.ids"));
  for (bool pairs : {false, true}) {
    Tokenizer tok = load_text(gpt2_tokenizer_json(pairs).dump());
    EXPECT_STREQ(tok.kind(), "huggingface");
    EXPECT_EQ(tok.pretokenizer().kind, PretokenizerKind::kGpt2);  // the fast path
    EXPECT_EQ(tok.vocab_size(), 50257u);
    EXPECT_EQ(tok.eos_id(), 50256);
    EXPECT_EQ(tok.encode(text), expected);
    EXPECT_EQ(*tok.decode(tok.encode(text)), text);
  }
  // The same pattern as a Split regex that is not byte-identical to the scanner's: PCRE2 runs it.
  Tokenizer via_regex = load_text(
      gpt2_tokenizer_json(false, split_then_byte_level("(?:" + gpt2_pattern() + ")")).dump());
  EXPECT_EQ(via_regex.pretokenizer().kind, PretokenizerKind::kRegex);
  EXPECT_EQ(via_regex.encode(text), expected);
}

const Tokenizer& trained(const PretokenizerSpec& pre) {
  static std::map<std::string, Tokenizer*> cache;
  std::string key = pretokenizer_pattern(pre);
  auto& slot = cache[key];
  if (!slot) {
    std::vector<std::string> texts;
    std::mt19937 rng(1);
    for (int i = 0; i < 300; ++i) texts.push_back(random_text(rng, 40));
    std::string sample = read_all(kGpt2Dir + "/sample.txt");
    for (int i = 0; i < 5; ++i) texts.push_back(sample);
    std::vector<std::string_view> views(texts.begin(), texts.end());
    TokenizerTrainOptions opts;
    opts.vocab_size = 1200;
    opts.special_tokens = {kEndOfText, "<|pad|>"};
    opts.pretokenizer = pre;
    auto r = Tokenizer::train(views, opts);
    KILN_CHECK(r.is_ok(), r.status().to_string());
    slot = new Tokenizer(std::move(r).value());
  }
  return *slot;
}

TEST(HfTokenizerJson, KilnTokenizersRoundTripThroughTokenizerJson) {
  PretokenizerSpec kiln, gpt2;
  gpt2.kind = PretokenizerKind::kGpt2;
  std::mt19937 rng(5);
  std::vector<std::string> texts = {read_all(kGpt2Dir + "/sample.txt"), "a<|endoftext|>b"};
  for (int i = 0; i < 300; ++i) texts.push_back(random_text(rng, 80));
  for (int i = 0; i < 100; ++i) {
    std::string bytes(rng() % 40, '\0');
    for (auto& c : bytes) c = char(rng());
    texts.push_back(bytes);
  }
  for (const PretokenizerSpec& pre : {kiln, gpt2, regex_spec(kLlama3)}) {
    const Tokenizer& tok = trained(pre);
    std::string file = tok.to_json();
    json j = json::parse(file);  // valid JSON in Hugging Face's layout
    EXPECT_EQ(j["model"]["type"], "BPE");
    EXPECT_EQ(j["added_tokens"].size(), 2u);
    EXPECT_EQ(j["added_tokens"][0]["content"], kEndOfText);
    Tokenizer back = load_text(file);
    EXPECT_EQ(back.pretokenizer().kind, pre.kind);
    EXPECT_EQ(back.vocab_size(), tok.vocab_size());
    EXPECT_EQ(back.eos_id(), 0);
    EXPECT_EQ(back.to_json(), file);  // a loaded tokenizer.json is written back unchanged
    for (const auto& t : texts) {
      ASSERT_EQ(back.encode(t), tok.encode(t));
      ASSERT_EQ(*back.decode(back.encode(t)), t);
    }
    auto ids = back.encode("a<|endoftext|>b");  // special text stays plain text
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 0u), 0);
  }
}

TEST(HfTokenizerJson, OlderKilnFileStillReads) {
  PretokenizerSpec kiln;
  const Tokenizer& tok = trained(kiln);
  std::string old = tok.to_kiln_v1_json();
  ASSERT_NE(old.find("kiln-tokenizer/1"), std::string::npos);
  Tokenizer back = load_text(old, "old.json");
  EXPECT_STREQ(back.kind(), "kiln");
  std::string sample = read_all(kGpt2Dir + "/sample.txt");
  EXPECT_EQ(back.encode(sample), tok.encode(sample));
  EXPECT_EQ(back.to_json(), tok.to_json());  // and is written as tokenizer.json
  EXPECT_EQ(regex_spec(kLlama3).kind, PretokenizerKind::kRegex);
  EXPECT_EQ(trained(regex_spec(kLlama3)).to_kiln_v1_json(), "");  // no older form for a regex
}

// Added tokens' flags as Hugging Face's AddedVocabulary applies them (its own unit tests' cases):
// single_word drops a match beside a word character (letters, digits, _, marks; not punctuation),
// lstrip / rstrip take the Unicode whitespace before / after a match into the token, and tokens
// with normalized false are matched in the raw text before those with normalized true are
// matched in the NFC text between them. (Equal ids to Hugging Face's own library on documents
// that exercise every flag: tests/python/tokenizer_hf_parity.py, variant added_flags.)
TEST(HfTokenizerJson, AddedTokenFlagsAsHuggingFace) {
  const Tokenizer& plain = trained(PretokenizerSpec{});
  json t = json::parse(plain.to_json());
  const uint32_t n = uint32_t(plain.vocab_size());
  uint32_t next = n;
  auto add = [&](const std::string& content, json flags) {
    json a = {{"id", next++},    {"content", content}, {"special", false},  {"single_word", false},
              {"lstrip", false}, {"rstrip", false},    {"normalized", true}};
    a.update(flags);
    t["added_tokens"].push_back(a);
  };
  add("<mask>", {{"single_word", true}});                                    // n
  add("<sp>", {{"lstrip", true}, {"rstrip", true}, {"normalized", false}});  // n + 1
  add("Cafe\u0301", json::object());                                         // n + 2
  add("e\u0301", {{"normalized", false}});                                   // n + 3
  t["normalizer"] = {{"type", "NFC"}};
  const Tokenizer tok = load_text(t.dump());
  // The text between added tokens, as the plain tokenizer encodes it (NFC applied).
  auto plain_ids = [&](const std::string& text) {
    return plain.encode(unicode_normalize(text, NormalizerStep::kNfc));
  };
  auto cat = [](std::initializer_list<std::vector<uint32_t>> parts) {
    std::vector<uint32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  // single_word: at the start, between spaces and at the end, not after "A" or before "ony";
  // punctuation and a dash are not word characters, a combining mark is.
  EXPECT_EQ(tok.encode("<mask> My name <mask> A<mask> <mask>ony <mask>"),
            cat({{n}, plain_ids(" My name "), {n}, plain_ids(" A<mask> <mask>ony "), {n}}));
  EXPECT_EQ(tok.encode("<mask>, <mask>- \u25cc\u0330<mask>"),
            cat({{n}, plain_ids(", "), {n}, plain_ids("- \u25cc\u0330<mask>")}));
  // lstrip / rstrip: spaces, tabs and U+2000 go into the token.
  EXPECT_EQ(tok.encode("Hi <sp> there\t<sp>\t<sp>\u2000"),
            cat({plain_ids("Hi"), {n + 1}, plain_ids("there"), {n + 1, n + 1}}));
  // normalized true: the token's NFC form in the NFC text (composed or not); normalized false
  // ("e" + U+0301, raw) is matched first, in the raw text only: it takes the decomposed "e" of
  // "Cafe\u0301" before that token can be seen.
  EXPECT_EQ(tok.encode("Caf\u00e9 x"), cat({{n + 2}, plain_ids(" x")}));
  EXPECT_EQ(tok.encode("Cafe\u0301 x"), cat({plain_ids("Caf"), {n + 3}, plain_ids(" x")}));
  EXPECT_EQ(tok.encode("\u00e9"), plain_ids("\u00e9"));
  EXPECT_EQ(*tok.decode(tok.encode("Hi <sp> there")), "Hi<sp>there");  // the spaces are gone
}

TEST(HfTokenizerJson, AddedTokensIgnoreMergesNfcPrefixSpace) {
  json base = json::parse(trained(PretokenizerSpec{}).to_json());
  const uint32_t n = uint32_t(trained(PretokenizerSpec{}).vocab_size());
  // A non-special added token is found in the text; a special one is not.
  json t = base;
  t["added_tokens"].push_back({{"id", n}, {"content", "<tool>"}, {"special", false}});
  t["added_tokens"].push_back({{"id", n + 1}, {"content", "<tool_long>"}, {"special", false}});
  Tokenizer added = load_text(t.dump());
  EXPECT_EQ(added.vocab_size(), n + 2);
  auto ids = added.encode("x<tool_long>y<tool><|endoftext|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), n), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), n + 1), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0u), 0);
  EXPECT_EQ(*added.decode(ids), "x<tool_long>y<tool><|endoftext|>");

  // ignore_merges: a word that is in the vocabulary is one token even if merges would split it.
  // Give "zq" (not learnt) an id by renaming the last merge's result... simpler: a fresh vocab.
  json small = {{"model",
                 {{"type", "BPE"},
                  {"ignore_merges", true},
                  {"vocab", json::object()},
                  {"merges", json::array()}}},
                {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}}};
  for (int b = 0; b < 256; ++b)
    small["model"]["vocab"][bytes_to_gpt2_unicode(std::string(1, char(b)))] = b;
  small["model"]["vocab"]["hello"] = 256;
  Tokenizer ignore = load_text(small.dump());
  EXPECT_EQ(ignore.encode("hello"), std::vector<uint32_t>{256});
  EXPECT_EQ(ignore.encode("hellox").size(), 6u);
  small["model"]["ignore_merges"] = false;
  EXPECT_EQ(load_text(small.dump()).encode("hello").size(), 5u);

  // NFC: decomposed and composed text encode alike.
  small["normalizer"] = {{"type", "NFC"}};
  Tokenizer nfc = load_text(small.dump());
  EXPECT_EQ(nfc.encode("e\xcc\x81"), nfc.encode("\xc3\xa9"));
  EXPECT_EQ(nfc.encode("\xff"
                       "e\xcc\x81"),
            nfc.encode("\xff\xc3\xa9"));  // invalid bytes kept
  // add_prefix_space: " " before the text (GPT-2 / RoBERTa style).
  small["normalizer"] = nullptr;
  small["pre_tokenizer"]["add_prefix_space"] = true;
  Tokenizer prefixed = load_text(small.dump());
  EXPECT_EQ(*prefixed.decode(prefixed.encode("hi")), " hi");
  EXPECT_EQ(*prefixed.decode(prefixed.encode(" hi")), " hi");
}

TEST(HfTokenizerJson, UnsupportedFilesAreRefusedNamingTheField) {
  json good = json::parse(trained(PretokenizerSpec{}).to_json());
  auto expect_refused = [](const json& t, const std::string& field, const std::string& needle) {
    auto r = Tokenizer::from_json(t.dump(), "some/tokenizer.json");
    ASSERT_FALSE(r.is_ok()) << field;
    EXPECT_EQ(r.status().code(), StatusCode::kData);
    std::string msg = r.status().to_string();
    EXPECT_NE(msg.find("some/tokenizer.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  };
  json t = good;
  t["model"] = {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}};
  expect_refused(t, "model.type", "WordPiece");
  t["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
  expect_refused(t, "model.type", "Unigram");
  t = good;
  t["normalizer"] = {{"type", "BertNormalizer"}};
  expect_refused(t, "normalizer.type", "BertNormalizer");
  t = good;
  t["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  expect_refused(t, "pre_tokenizer.type", "BertPreTokenizer");
  t = good;
  t["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_refused(t, "pre_tokenizer.pretokenizers[0].behavior", "Sideways");
  t = good;
  std::swap(t["pre_tokenizer"]["pretokenizers"][0], t["pre_tokenizer"]["pretokenizers"][1]);
  expect_refused(t, "pre_tokenizer.pretokenizers[1].type", "ByteLevel must be last");
  t = good;
  t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(oops";
  expect_refused(t, "pre_tokenizer.pretokenizers[0].pattern", "does not compile");
  t = good;
  t["model"]["dropout"] = 0.1;
  expect_refused(t, "model.dropout", "dropout");
  t = good;
  t["model"]["unk_token"] = "<nowhere>";
  expect_refused(t, "model.unk_token", "<nowhere>");
  t = good;
  t["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  expect_refused(t, "normalizer.precompiled_charsmap", "charsmap");
  t = good;
  t["decoder"] = {{"type", "WordPiece"}};
  expect_refused(t, "decoder.type", "WordPiece");
  t = good;
  t["model"]["merges"][0] = "nospace";
  expect_refused(t, "model.merges", "nospace");
  t = good;
  t["model"]["vocab"].erase("A");
  expect_refused(t, "model.vocab", "byte 65");
  t = good;
  t["added_tokens"][0]["id"] = 5;
  expect_refused(t, "added_tokens[0]", "vocabulary gives it 0");
}

TEST(HfTokenizerJson, ModelDirectoryFiles) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln_hfdir_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const Tokenizer& tok = trained(PretokenizerSpec{});
  HfTokenizerConfig cfg;
  cfg.model_max_length = 1024;
  ASSERT_TRUE(write_hf_tokenizer(tok, dir.string(), cfg).is_ok());
  json c = json::parse(read_all((dir / "tokenizer_config.json").string()));
  EXPECT_EQ(c["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(c["eos_token"], kEndOfText);
  EXPECT_EQ(c["model_max_length"], 1024);
  EXPECT_EQ(c["clean_up_tokenization_spaces"], false);
  EXPECT_EQ(read_all((dir / "tokenizer.json").string()), tok.to_json());
  auto loaded = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->eos_id(), 0);
  std::filesystem::remove_all(dir);
}

TEST(HfTokenizerJson, EosFromTokenizerConfigBesideTheFile) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln_hfeos_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(
      write_file_atomic((dir / "tokenizer.json").string(), trained(PretokenizerSpec{}).to_json())
          .is_ok());
  ASSERT_TRUE(write_file_atomic((dir / "tokenizer_config.json").string(),
                                R"({"eos_token": {"content": "<|pad|>"}})")
                  .is_ok());
  auto loaded = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->eos_id(), 1);
  std::filesystem::remove_all(dir);
}

// ---- SentencePiece ----------------------------------------------------------------------------

std::string train_sentencepiece(const std::filesystem::path& dir, int vocab_size) {
  std::filesystem::create_directories(dir);
  std::ofstream corpus(dir / "corpus.txt");
  std::string sample = read_all(kGpt2Dir + "/sample.txt");
  for (int i = 0; i < 20; ++i) corpus << sample << "\n我们使用深度学习训练语言模型。\n";
  corpus.close();
  std::string prefix = (dir / "sp").string();
  auto st = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir / "corpus.txt").string() + " --model_prefix=" + prefix +
      " --vocab_size=" + std::to_string(vocab_size) +
      " --model_type=bpe --byte_fallback=true --character_coverage=1.0 --minloglevel=2"
      " --num_threads=1");
  KILN_CHECK(st.ok(), st.ToString());
  return prefix + ".model";
}

TEST(SentencePiece, IdsEqualTheLibraryAndRoundTrip) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln_sp_" + std::to_string(getpid()));
  std::string model = train_sentencepiece(dir, 1000);
  auto loaded = Tokenizer::load(model);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const Tokenizer& tok = *loaded;
  EXPECT_STREQ(tok.kind(), "sentencepiece");
  EXPECT_STREQ(tok.file_name(), "tokenizer.model");
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(model).ok());
  EXPECT_EQ(tok.vocab_size(), size_t(sp.GetPieceSize()));
  EXPECT_EQ(tok.eos_id(), sp.eos_id());
  EXPECT_TRUE(tok.is_special(uint32_t(sp.eos_id())));
  std::mt19937 rng(3);
  std::vector<std::string> texts = {read_all(kGpt2Dir + "/sample.txt"),
                                    "Hello world </s> 深度学习 😀"};
  for (int i = 0; i < 200; ++i) texts.push_back(random_text(rng, 60));
  for (const auto& t : texts) {
    std::vector<int> expected;
    ASSERT_TRUE(sp.Encode(t, &expected).ok());
    auto ids = tok.encode(t);
    ASSERT_EQ(std::vector<uint32_t>(expected.begin(), expected.end()), ids);
    std::string back;
    ASSERT_TRUE(sp.Decode(expected, &back).ok());
    EXPECT_EQ(*tok.decode(ids), back);
  }
  // Byte fallback: text without unknown pieces comes back exactly.
  EXPECT_EQ(*tok.decode(tok.encode("Hello world 深度学习 😀")), "Hello world 深度学习 😀");
  // save() writes the model's bytes; the copy loads to the same tokenizer.
  ASSERT_TRUE(tok.save((dir / "copy.model").string()).is_ok());
  EXPECT_EQ(read_all((dir / "copy.model").string()), read_all(model));
  ASSERT_TRUE(write_hf_tokenizer(tok, dir.string()).is_ok());
  EXPECT_EQ(json::parse(read_all((dir / "tokenizer_config.json").string()))["tokenizer_class"],
            "LlamaTokenizer");
  auto bad = Tokenizer::from_sentencepiece("\x01\x02garbage", "x.model");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kData);
  EXPECT_NE(bad.status().to_string().find("x.model"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::prep
