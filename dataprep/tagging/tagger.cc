#include "dataprep/tagging/tagger.h"

#include <fasttext/fasttext.h>
#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <cstdio>
#include <filesystem>
#include <cstring>
#include <sstream>

#include "common/atomic_file.h"
#include "common/hash.h"
#include "dataprep/tagging/domain_rules.h"
#include "dataprep/tokenizer/pretokenize.h"
#include "dataprep/tokenizer/tokenizer_io.h"

namespace kiln::prep {
namespace {

constexpr const char* kLabelPrefix = "__label__";

enum class Kind { kWord, kCjk, kSpace, kOther };

}  // namespace

std::string fasttext_line(std::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes) text = text.substr(0, max_bytes);
  std::string out;
  out.reserve(text.size() + 16);
  Kind prev = Kind::kSpace;
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp;
    auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                utf8proc_ssize_t(text.size() - i), &cp);
    if (len <= 0) {  // invalid byte (or a character cut by max_bytes): drop it
      ++i;
      continue;
    }
    std::string_view ch = text.substr(i, size_t(len));
    i += size_t(len);
    Kind kind;
    auto cat = utf8proc_category(cp);
    if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || cp == '\f' || cp == '\v' ||
        cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP ||
        cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF) {
      kind = Kind::kSpace;
    } else if (is_cjk_codepoint(cp)) {
      kind = Kind::kCjk;
    } else if ((cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NO)) {
      kind = Kind::kWord;  // letters, marks, numbers
    } else {
      kind = Kind::kOther;
    }
    if (kind == Kind::kSpace) {
      prev = kind;
      continue;
    }
    bool joins = kind == prev && kind != Kind::kCjk;
    if (!joins && !out.empty()) out.push_back(' ');
    if (cp < 0x80) {
      out.push_back((cp >= 'A' && cp <= 'Z') ? char(cp - 'A' + 'a') : char(cp));
    } else {
      out.append(ch);
    }
    prev = kind;
  }
  return out;
}

// ---- prediction --------------------------------------------------------------------------------

struct FastTextTagger::Impl {
  fasttext::FastText ft;
};

FastTextTagger::FastTextTagger() : impl_(std::make_unique<Impl>()) {}
FastTextTagger::~FastTextTagger() = default;

Result<std::unique_ptr<FastTextTagger>> FastTextTagger::load(const std::string& path) {
  if (!std::filesystem::exists(path))
    return Status::not_found("fastText model not found").with_file(path);
  std::unique_ptr<FastTextTagger> tagger(new FastTextTagger());
  try {
    tagger->impl_->ft.loadModel(path);
  } catch (const std::exception& e) {
    return Status::data(std::string("not a fastText model: ") + e.what()).with_file(path);
  }
  if (tagger->impl_->ft.getArgs().model != fasttext::model_name::sup)
    return Status::data("not a supervised fastText model").with_file(path);
  for (const auto& label : tagger->labels()) {
    Status st = validate_domain_name(label);
    if (!st.is_ok()) return Status::data("model label: " + st.message()).with_file(path);
  }
  return tagger;
}

std::vector<std::string> FastTextTagger::labels() const {
  auto dict = impl_->ft.getDictionary();
  std::vector<std::string> out;
  for (int32_t i = 0; i < dict->nlabels(); ++i) {
    std::string l = dict->getLabel(i);
    if (l.rfind(kLabelPrefix, 0) == 0) l = l.substr(std::strlen(kLabelPrefix));
    out.push_back(l);
  }
  return out;
}

std::optional<TaggerPrediction> FastTextTagger::predict(std::string_view text) const {
  std::string line = fasttext_line(text);
  if (line.empty()) return std::nullopt;
  line.push_back('\n');
  std::istringstream in(line);
  std::vector<std::pair<fasttext::real, std::string>> predictions;
  impl_->ft.predictLine(in, predictions, 1, 0.0);
  if (predictions.empty()) return std::nullopt;
  TaggerPrediction p;
  p.domain = predictions[0].second;
  if (p.domain.rfind(kLabelPrefix, 0) == 0) p.domain = p.domain.substr(std::strlen(kLabelPrefix));
  p.probability = predictions[0].first;
  return p;
}

// ---- training ----------------------------------------------------------------------------------

std::string TaggerReport::to_json() const {
  nlohmann::ordered_json j;
  j["train_docs"] = train_docs;
  j["holdout_docs"] = holdout_docs;
  j["skipped_lines"] = skipped;
  j["accuracy"] = accuracy;
  nlohmann::ordered_json labels = nlohmann::ordered_json::object();
  for (const auto& [label, n] : label_docs) {
    auto it = holdout_by_label.find(label);
    uint64_t correct = it == holdout_by_label.end() ? 0 : it->second.first;
    uint64_t total = it == holdout_by_label.end() ? 0 : it->second.second;
    labels[label] = {{"docs", n},
                     {"holdout", total},
                     {"holdout_recall", total ? double(correct) / double(total) : 0.0}};
  }
  j["domains"] = labels;
  return j.dump(2) + "\n";
}

Result<TaggerReport> train_tagger(const TaggerTrainOptions& o) {
  if (o.inputs.empty()) return Status::usage("no --input given");
  if (o.output.empty()) return Status::usage("no --output given");
  if (!(o.holdout >= 0 && o.holdout < 1)) return Status::usage("--holdout must be in [0, 1)");
  if (o.epochs < 1 || o.dim < 1 || o.bucket < 1 || o.threads < 1 || !(o.lr > 0))
    return Status::usage("epochs, dim, bucket, threads and lr must be positive");

  if (o.max_text_bytes == 0) return Status::usage("--max-text-bytes must be positive");

  // Streamed: each input is read one line at a time (a line longer than max_text_bytes is an
  // error naming it), the prepared training lines go straight to the file libfasttext trains from
  // and the held-out ones to a second file next to the output, so memory does not grow with the
  // input. Both files are removed however training ends (AtomicFile never committed).
  TaggerReport report;
  AtomicFile train_file, holdout_file;
  KILN_RETURN_IF_ERROR(train_file.open(o.output + ".train"));
  KILN_RETURN_IF_ERROR(holdout_file.open(o.output + ".holdout"));
  const uint64_t cut = uint64_t(o.holdout * 18446744073709551615.0);
  uint64_t global_line = 0;
  for (const auto& path : o.inputs) {
    if (!std::filesystem::is_regular_file(path)) return Status::usage("input not found: " + path);
    KILN_RETURN_IF_ERROR(for_each_line(path, o.max_text_bytes,
                                       [&](std::string_view line, uint64_t line_no, bool*) -> Status {
      ++global_line;
      if (line.find_first_not_of(" \t\r") == std::string::npos) return Status::ok();
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        return Status::data(std::string("invalid JSON: ") + e.what()).with_file(path).with_line(long(line_no));
      }
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string() || !j.contains("domain") ||
          !j["domain"].is_string())
        return Status::data("each line needs a string \"text\" and a string \"domain\"")
            .with_file(path)
            .with_line(long(line_no));
      std::string domain = j["domain"].get<std::string>();
      Status st = validate_domain_name(domain);
      if (!st.is_ok()) return Status::data(st.message()).with_file(path).with_line(long(line_no));
      std::string prepared = fasttext_line(j["text"].get<std::string>());
      if (prepared.empty()) {
        ++report.skipped;
        return Status::ok();
      }
      ++report.label_docs[domain];
      std::string labelled = kLabelPrefix + domain + " " + prepared + "\n";
      uint64_t h = xxh3_64(&global_line, sizeof(global_line), o.seed);
      if (o.holdout > 0 && h < cut) {
        ++report.holdout_docs;
        return holdout_file.write(labelled);
      }
      ++report.train_docs;
      return train_file.write(labelled);
    }));
  }
  if (report.label_docs.size() < 2)
    return Status::data("the labelled input needs at least two domains (found " +
                        std::to_string(report.label_docs.size()) + ")");
  if (report.train_docs == 0) return Status::data("no training lines left after the hold-out");
  for (AtomicFile* f : {&train_file, &holdout_file})
    if (std::fflush(f->stream()) != 0) return Status::from_errno("write", f->temp_path());

  fasttext::Args args;
  args.input = train_file.temp_path();
  args.model = fasttext::model_name::sup;
  args.loss = fasttext::loss_name::softmax;
  args.epoch = o.epochs;
  args.lr = o.lr;
  args.dim = o.dim;
  args.wordNgrams = o.word_ngrams;
  args.minn = o.minn;
  args.maxn = o.maxn;
  args.bucket = o.bucket;
  args.thread = o.threads;
  args.minCount = 1;
  args.seed = int(o.seed);
  args.verbose = 0;
  fasttext::FastText ft;
  try {
    ft.train(args);
  } catch (const std::exception& e) {
    return Status::internal(std::string("fastText training failed: ") + e.what());
  }
  train_file.abort();

  uint64_t correct = 0;
  KILN_RETURN_IF_ERROR(for_each_line(holdout_file.temp_path(), o.max_text_bytes,
                                     [&](std::string_view line, uint64_t, bool*) -> Status {
    // "__label__<domain> <prepared text>", as written above.
    size_t space = line.find(' ');
    if (space == std::string_view::npos) return Status::internal("bad held-out line");
    std::string label(line.substr(0, space));
    std::istringstream in(std::string(line.substr(space + 1)) + "\n");
    std::vector<std::pair<fasttext::real, std::string>> predictions;
    ft.predictLine(in, predictions, 1, 0.0);
    bool ok = !predictions.empty() && predictions[0].second == label;
    correct += ok;
    auto& [c, t] = report.holdout_by_label[label.substr(std::strlen(kLabelPrefix))];
    c += ok;
    ++t;
    return Status::ok();
  }));
  holdout_file.abort();
  report.accuracy = report.holdout_docs == 0 ? 0.0 : double(correct) / double(report.holdout_docs);

  std::string partial = o.output + ".partial";
  try {
    ft.saveModel(partial);
  } catch (const std::exception& e) {
    return Status::io(std::string("saving the model: ") + e.what()).with_file(o.output);
  }
  KILN_RETURN_IF_ERROR(rename_durable(partial, o.output));
  KILN_RETURN_IF_ERROR(write_file_atomic(o.output + ".json", report.to_json()));
  return report;
}

}  // namespace kiln::prep
