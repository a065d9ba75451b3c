// Content classifier for domain tagging: fastText supervised models through libfasttext.
//
// `kiln tagger train` learns from labelled JSONL (a "text" string and a "domain" label per line),
// holding out a deterministic share of the lines (by a hash of the line number) to measure
// accuracy, and writes the model plus a report "<model>.json" with the accuracy. `kiln prep`
// applies a model through the Annotator (domains.model, domains.model_threshold).
//
// Texts are prepared the same way for training and prediction (fasttext_line): the first 4 KiB,
// ASCII lower-cased, each CJK character and each punctuation run a word of its own (fastText
// splits on spaces, and Chinese has none), whitespace collapsed to single spaces.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "dataprep/tokenizer/tokenizer_io.h"

namespace kiln::prep {

// How much of a text is classified (and trained on): its first 4 KiB.
inline constexpr size_t kTaggerTextBytes = 4096;
std::string fasttext_line(std::string_view text, size_t max_bytes = kTaggerTextBytes);

struct TaggerPrediction {
  std::string domain;  // without fastText's "__label__" prefix
  double probability = 0;
};

class FastTextTagger {
 public:
  ~FastTextTagger();
  // kData (or kNotFound) naming the file when it is not a readable fastText model.
  static Result<std::unique_ptr<FastTextTagger>> load(const std::string& path);
  // The most probable domain, or nullopt for an empty text. Thread-safe (const).
  std::optional<TaggerPrediction> predict(std::string_view text) const;
  std::vector<std::string> labels() const;

 private:
  FastTextTagger();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TaggerTrainOptions {
  std::vector<std::string> inputs;  // labelled JSONL ("text", "domain"); .gz/.zst/.xz read too
  std::string output;               // model path; the report goes to output + ".json"
  double holdout = 0.1;             // share of lines held out for the accuracy
  uint64_t seed = 1;                // chooses the held-out lines
  int epochs = 25;
  double lr = 0.5;
  int dim = 32;
  int word_ngrams = 2;
  int minn = 2, maxn = 4;           // character n-grams (0 = off)
  int bucket = 200000;
  int threads = 1;                  // 1 = deterministic
  // The longest input line (after decompression); a longer one is an error naming the file, the
  // line and the limit. Inputs are streamed, so this bounds what one line makes Kiln hold.
  uint64_t max_text_bytes = kDefaultMaxTextBytes;
};

struct TaggerReport {
  uint64_t train_docs = 0, holdout_docs = 0, skipped = 0;
  double accuracy = 0;  // on the held-out lines (0 when none)
  std::map<std::string, uint64_t> label_docs;  // all lines per domain
  std::map<std::string, std::pair<uint64_t, uint64_t>> holdout_by_label;  // correct, total
  std::string to_json() const;
};

// Trains, evaluates and saves. kUsage for bad options, kData for unusable input (e.g. fewer than
// two domains, a line past max_text_bytes), naming file and line. The inputs are streamed: the
// prepared lines go to "<output>.train.tmp.<pid>" (what libfasttext trains from) and
// "<output>.holdout.tmp.<pid>", both removed before returning.
Result<TaggerReport> train_tagger(const TaggerTrainOptions& options);

}  // namespace kiln::prep
