// The annotation stage: rules, the fastText model threshold, tokenizer training / loading.
#include "dataprep/annotate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/atomic_file.h"
#include "dataprep/prep_config.h"
#include "dataprep/tagging/tagger.h"
#include "dataprep/tokenizer/tokenizer.h"

namespace kiln::prep {
namespace {

// The real prep schema and its one parser, so the annotator gets exactly what `kiln prep` gives it.
Result<PrepOptions> parse(const std::vector<std::string>& sets) {
  auto c = Config::load(kPrepDefaultsYaml, "", sets);
  KILN_CHECK(c.is_ok(), c.status().to_string());
  return prep_options_from_config(*c);
}

PrepOptions config(const std::vector<std::string>& sets) {
  auto o = parse(sets);
  KILN_CHECK(o.is_ok(), o.status().to_string());
  return std::move(o).value();
}

Result<std::unique_ptr<Annotator>> create(const PrepOptions& o,
                                          const std::vector<std::string>& texts) {
  return Annotator::create(o.domains, o.tokenizer, texts);
}

Document doc(std::string text, std::string input_domain = "") {
  Document d;
  d.text = std::move(text);
  d.input_domain = std::move(input_domain);
  d.file = "in.jsonl";
  d.line = 1;
  return d;
}

std::vector<std::string> corpus() {
  std::vector<std::string> texts;
  for (int i = 0; i < 40; ++i) {
    texts.push_back("The village market opens every morning, and people walk to the river. " +
                    std::to_string(i));
    texts.push_back(
        "int main(void) {\n  for (int i = 0; i < 10; ++i) {\n    x[i] = i;\n  }\n"
        "  return 0;\n}\n");
    texts.push_back("我们使用中文文本训练语言模型，数据处理很重要。");
  }
  return texts;
}

TEST(Annotate, RulesDomainsAndTrainedTokenizer) {
  auto c = config({"tokenizer.vocab_size=400"});
  EXPECT_TRUE(c.tokenizer.trains());
  auto texts = corpus();
  auto a = create(c, texts);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  Document prose = doc(texts[0]), code = doc(texts[1]), zh = doc(texts[2]), mine = doc("x", "math");
  for (Document* d : {&prose, &code, &zh, &mine}) ASSERT_TRUE((*a)->annotate(*d).is_ok());
  EXPECT_EQ(prose.domain, "web");
  EXPECT_EQ(prose.domain_by, "default");
  EXPECT_EQ(code.domain, "code");
  EXPECT_EQ(code.domain_by, "rule:code-content");
  EXPECT_EQ(zh.domain, "zh");
  EXPECT_EQ(mine.domain, "math");
  EXPECT_EQ(mine.domain_by, "rule:declared");
  ASSERT_FALSE(zh.tokens.empty());
  EXPECT_LT(zh.tokens.size(), zh.text.size() / 3);  // merges learned the repeated Chinese text

  auto dir = std::filesystem::temp_directory_path() / ("kiln_annot_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto entry = (*a)->save_tokenizer(dir.string());
  ASSERT_TRUE(entry.is_ok()) << entry.status().to_string();
  EXPECT_EQ(entry->path, "tokenizer.json");
  EXPECT_EQ(entry->eos_id, 0);
  auto tok = Tokenizer::load((dir / "tokenizer.json").string());
  ASSERT_TRUE(tok.is_ok());
  EXPECT_EQ(entry->vocab_size, tok->vocab_size());
  EXPECT_EQ(tok->encode(zh.text), zh.tokens);
  EXPECT_EQ(*tok->decode(zh.tokens), zh.text);

  // The same tokenizer by path; "none" turns tokens off.
  auto by_path = create(config({"tokenizer.path=" + (dir / "tokenizer.json").string()}), {});
  ASSERT_TRUE(by_path.is_ok()) << by_path.status().to_string();
  Document again = doc(texts[2]);
  ASSERT_TRUE((*by_path)->annotate(again).is_ok());
  EXPECT_EQ(again.tokens, zh.tokens);
  auto none = create(config({"tokenizer.path=none"}), {});
  ASSERT_TRUE(none.is_ok());
  Document untokenized = doc(texts[2]);
  ASSERT_TRUE((*none)->annotate(untokenized).is_ok());
  EXPECT_TRUE(untokenized.tokens.empty());
  EXPECT_EQ((*none)->save_tokenizer(dir.string())->path, "");
  std::filesystem::remove_all(dir);
}

TEST(Annotate, ModelOverridesRulesAboveThresholdButNotDeclaredDomains) {
  auto dir = std::filesystem::temp_directory_path() / ("kiln_annot_m_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string labelled;
  for (int i = 0; i < 60; ++i) {
    labelled += "{\"text\": \"the village market river morning people " + std::to_string(i) +
                "\", \"domain\": \"news\"}\n";
    labelled += "{\"text\": \"int main return for struct void " + std::to_string(i) +
                "\", \"domain\": \"code\"}\n";
  }
  ASSERT_TRUE(write_file_atomic((dir / "l.jsonl").string(), labelled).is_ok());
  TaggerTrainOptions o;
  o.inputs = {(dir / "l.jsonl").string()};
  o.output = (dir / "m.bin").string();
  o.epochs = 10;
  o.dim = 8;
  o.bucket = 10000;
  ASSERT_TRUE(train_tagger(o).is_ok());
  auto texts = corpus();
  auto a = create(
      config({"tokenizer.path=none", "domains.model=" + o.output, "domains.model_threshold=0"}),
      {});
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  Document prose = doc(texts[0]), mine = doc("the village market", "math");
  ASSERT_TRUE((*a)->annotate(prose).is_ok());
  ASSERT_TRUE((*a)->annotate(mine).is_ok());
  EXPECT_EQ(prose.domain, "news");
  EXPECT_EQ(prose.domain_by, "model");
  EXPECT_EQ(mine.domain, "math");  // the input's own domain stands
  EXPECT_EQ(mine.domain_by, "rule:declared");
  std::filesystem::remove_all(dir);
}

TEST(Annotate, ConfigErrorsNameTheKey) {
  auto bad = [](std::vector<std::string> sets, const std::string& key) {
    // Values are checked when the options are parsed, files when the annotator loads them.
    auto o = parse(sets);
    Status st = o.is_ok() ? create(*o, {}).status() : o.status();
    ASSERT_FALSE(st.is_ok()) << key;
    EXPECT_NE(st.to_string().find(key), std::string::npos) << st.to_string();
  };
  bad({"domains.default=a.b", "tokenizer.path=none"}, "domains.default");
  bad({"domains.rules=/nonexistent.yaml", "tokenizer.path=none"}, "domains.rules");
  bad({"domains.model=/nonexistent.bin", "tokenizer.path=none"}, "domains.model");
  bad({"domains.model_threshold=2", "tokenizer.path=none"}, "domains.model_threshold");
  bad({"tokenizer.path=/nonexistent.json"}, "tokenizer.path");
  bad({"tokenizer.vocab_size=10"}, "tokenizer.vocab_size");
}

}  // namespace
}  // namespace kiln::prep
