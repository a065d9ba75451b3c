// kiln tagger train | predict — the fastText domain classifier (dataprep/tagging/tagger.h, docs/TAGGING.md).
#include <algorithm>
#include <cstdio>
#include <memory>

#include "dataprep/tagging/tagger.h"
#include "tools/kiln/command.h"

namespace kiln::cli {

RunFn add_tagger_command(CLI::App& root) {
  auto o = std::make_shared<prep::TaggerTrainOptions>();
  auto model = std::make_shared<std::string>();
  auto max_text_bytes = std::make_shared<std::string>("1G");
  CLI::App* cmd = root.add_subcommand("tagger", "train and try the fastText domain classifier");
  cmd->require_subcommand(1);
  CLI::App* train = cmd->add_subcommand(
      "train", "train a fastText model on labelled JSONL (\"text\" and \"domain\" per line)");
  train->add_option("--input", o->inputs, "labelled JSONL files")->required()->take_all();
  train->add_option("--output", o->output, "model file; the report goes to <output>.json")
      ->required();
  train->add_option("--holdout", o->holdout, "share of lines held out to measure accuracy")
      ->capture_default_str();
  train->add_option("--seed", o->seed, "chooses the held-out lines; fastText's seed")
      ->capture_default_str();
  train->add_option("--epochs", o->epochs, "training epochs")->capture_default_str();
  train->add_option("--lr", o->lr, "learning rate")->capture_default_str();
  train->add_option("--dim", o->dim, "vector size")->capture_default_str();
  train->add_option("--word-ngrams", o->word_ngrams, "word n-gram length")->capture_default_str();
  train->add_option("--minn", o->minn, "min character n-gram (0 = none)")->capture_default_str();
  train->add_option("--maxn", o->maxn, "max character n-gram (0 = none)")->capture_default_str();
  train->add_option("--bucket", o->bucket, "hash buckets for n-grams")->capture_default_str();
  train->add_option("--threads", o->threads, "training threads (1 = deterministic)")
      ->capture_default_str();
  train->add_option("--max-text-bytes", *max_text_bytes,
                    "refuse an input line longer than this, after decompression (K, M, G)")
      ->capture_default_str();
  CLI::App* predict = cmd->add_subcommand(
      "predict", "read text on standard input, print the predicted domain and its probability");
  predict->add_option("--model", *model, "fastText model file")->required();

  return [o, model, max_text_bytes, train, predict]() -> Status {
    if (train->parsed()) {
      KILN_ASSIGN_OR_RETURN(o->max_text_bytes, parse_size("--max-text-bytes", *max_text_bytes));
      KILN_ASSIGN_OR_RETURN(prep::TaggerReport r, prep::train_tagger(*o));
      std::printf("trained on %llu documents, %zu domains; held-out accuracy %.4f on %llu "
                  "documents -> %s (report %s.json)\n",
                  (unsigned long long)r.train_docs, r.label_docs.size(), r.accuracy,
                  (unsigned long long)r.holdout_docs, o->output.c_str(), o->output.c_str());
      for (const auto& [label, n] : r.label_docs) {
        auto it = r.holdout_by_label.find(label);
        uint64_t c = it == r.holdout_by_label.end() ? 0 : it->second.first;
        uint64_t t = it == r.holdout_by_label.end() ? 0 : it->second.second;
        std::printf("  %-16s %8llu docs  held-out %llu/%llu correct\n", label.c_str(),
                    (unsigned long long)n, (unsigned long long)c, (unsigned long long)t);
      }
      return Status::ok();
    }
    KILN_ASSIGN_OR_RETURN(auto tagger, prep::FastTextTagger::load(*model));
    // Only the first kTaggerTextBytes of a text are classified (prep::fasttext_line); the rest of
    // standard input is read and dropped, never held.
    std::string text;
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), stdin)) > 0)
      if (text.size() < prep::kTaggerTextBytes)
        text.append(buf, std::min(n, prep::kTaggerTextBytes - text.size()));
    auto p = tagger->predict(text);
    if (!p) return Status::data("no words in the input to classify");
    std::printf("%s %.4f\n", p->domain.c_str(), p->probability);
    return Status::ok();
  };
}

}  // namespace kiln::cli
