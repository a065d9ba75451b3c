// fastText tagger: training with a held-out accuracy, the report, loading and prediction.
#include "dataprep/tagging/tagger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/atomic_file.h"

namespace kiln::prep {
namespace {

// Synthetic labelled documents: each domain draws from its own word list (with shared filler).
std::string make_doc(const std::string& domain, std::mt19937& rng) {
  static const std::vector<std::string> prose = {
      "the",    "river",     "village", "morning", "walked",   "story", "history",
      "people", "beautiful", "garden",  "evening", "children", "market"};
  static const std::vector<std::string> code = {
      "int", "return", "if",     "(",        ")",     "{",     "}",       ";",          "void",
      "for", "i++",    "struct", "#include", "const", "char*", "nullptr", "std::vector"};
  static const std::vector<std::string> zh = {"我们", "使用", "训练", "语言", "模型",
                                              "数据", "中文", "文本", "处理", "人工",
                                              "智能", "方法", "研究"};
  static const std::vector<std::string> filler = {"a", "of", "to", "and", "x", "1", "2"};
  const auto& words = domain == "web" ? prose : domain == "code" ? code : zh;
  std::string text;
  int n = 8 + int(rng() % 20);
  for (int i = 0; i < n; ++i) {
    const auto& list = (rng() % 5 == 0) ? filler : words;
    text += list[rng() % list.size()];
    if (domain != "zh" || rng() % 4 == 0) text += " ";
  }
  return text;
}

class TaggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kiln_tagger_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write_labelled(int n) {
    std::mt19937 rng(17);
    std::string path = (dir_ / "labelled.jsonl").string();
    std::ofstream out(path);
    const char* domains[] = {"web", "code", "zh"};
    for (int i = 0; i < n; ++i) {
      std::string d = domains[i % 3];
      out << nlohmann::json{{"text", make_doc(d, rng)}, {"domain", d}}.dump() << "\n";
    }
    return path;
  }
  TaggerTrainOptions options(const std::string& input) {
    TaggerTrainOptions o;
    o.inputs = {input};
    o.output = (dir_ / "model.bin").string();
    o.epochs = 10;
    o.dim = 16;
    o.bucket = 20000;
    return o;
  }
  std::filesystem::path dir_;
};

TEST(FastTextLine, SplitsCjkAndPunctuationAndLowercases) {
  EXPECT_EQ(fasttext_line("Hello, World!\n"), "hello , world !");
  EXPECT_EQ(fasttext_line("我们使用GPU"), "我 们 使 用 gpu");
  EXPECT_EQ(fasttext_line("  a\t\tb  "), "a b");
  EXPECT_EQ(fasttext_line(""), "");
  EXPECT_EQ(fasttext_line("abcdef", 3), "abc");
}

TEST_F(TaggerTest, TrainsReportsAccuracyAndPredicts) {
  auto report = train_tagger(options(write_labelled(900)));
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_GT(report->holdout_docs, 40u);
  EXPECT_LT(report->holdout_docs, 150u);
  EXPECT_EQ(report->train_docs + report->holdout_docs, 900u);
  EXPECT_GE(report->accuracy, 0.9);
  EXPECT_EQ(report->label_docs.size(), 3u);
  auto json = read_file((dir_ / "model.bin.json").string());
  ASSERT_TRUE(json.is_ok());
  auto j = nlohmann::json::parse(*json);
  EXPECT_DOUBLE_EQ(j["accuracy"].get<double>(), report->accuracy);
  EXPECT_TRUE(j["domains"].contains("zh"));
  // The streamed training and held-out lines went to temporaries next to the model; none is left.
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    files.push_back(e.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"labelled.jsonl", "model.bin", "model.bin.json"}));

  auto tagger = FastTextTagger::load((dir_ / "model.bin").string());
  ASSERT_TRUE(tagger.is_ok()) << tagger.status().to_string();
  auto labels = (*tagger)->labels();
  EXPECT_EQ(labels.size(), 3u);
  auto p = (*tagger)->predict("我们 使用 中文 文本 训练 语言 模型");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->domain, "zh");
  EXPECT_GT(p->probability, 0.5);
  p = (*tagger)->predict("int main() { for (;;) { return 0; } }");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->domain, "code");
  EXPECT_FALSE((*tagger)->predict("   ").has_value());
}

TEST_F(TaggerTest, BadInputsAreErrors) {
  std::string path = (dir_ / "one.jsonl").string();
  ASSERT_TRUE(write_file_atomic(path, "{\"text\": \"a b\", \"domain\": \"web\"}\n").is_ok());
  EXPECT_EQ(train_tagger(options(path)).status().code(), StatusCode::kData);  // one domain
  ASSERT_TRUE(write_file_atomic(path, "{\"text\": \"a\"}\n").is_ok());
  auto r = train_tagger(options(path));
  EXPECT_EQ(r.status().code(), StatusCode::kData);
  EXPECT_EQ(r.status().line(), 1);
  ASSERT_TRUE(write_file_atomic(path, "{\"text\": \"a\", \"domain\": \"a.b\"}\n").is_ok());
  EXPECT_EQ(train_tagger(options(path)).status().code(), StatusCode::kData);
  EXPECT_FALSE(FastTextTagger::load(path).is_ok());  // not a model
  EXPECT_EQ(FastTextTagger::load((dir_ / "missing.bin").string()).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln::prep
