// Domain rules: the default rules file on typical documents, every condition kind, errors.
#include "dataprep/tagging/domain_rules.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/atomic_file.h"
#include "tests/test_paths.h"

namespace kiln::prep {
namespace {

Document doc_with(std::string text, std::string file = "corpus.jsonl", uint64_t line = 1) {
  Document d;
  d.text = std::move(text);
  d.file = std::move(file);
  d.line = line;
  d.id = "corpus:" + std::to_string(line);
  return d;
}

const DomainRules& defaults() {
  static DomainRules* rules = [] {
    auto r = DomainRules::load("");
    KILN_CHECK(r.is_ok(), r.status().to_string());
    return new DomainRules(std::move(r).value());
  }();
  return *rules;
}

std::string tag(const Document& d) {
  auto m = defaults().match(d);
  return m ? m->domain + "/" + m->rule : "default";
}

const char* kProse =
    "The quick brown fox jumps over the lazy dog. Language models learn from large amounts of "
    "text, and the quality of that text matters as much as its quantity. In this essay we look "
    "at how people write, edit and publish documents (and why some of them are worth keeping).";

const char* kCode =
    "#include <stdio.h>\n\nstatic int add(int a, int b) {\n  return a + b;\n}\n\n"
    "int main(void) {\n  for (int i = 0; i < 3; ++i) {\n    printf(\"%d\\n\", add(i, i));\n  }\n"
    "  return 0;\n}\n";

const char* kChinese =
    "自然语言处理是人工智能的一个重要方向。它研究人与计算机之间用自然语言进行有效通信的各种理论和方"
    "法。"
    "本文介绍 GPU 上的训练方法。";

TEST(DomainRules, BuiltinEqualsConfigFile) {
  auto file = read_file(std::string(kiln::test::source_dir()) + "/configs/prep/domains.yaml");
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ(*file, DomainRules::builtin_yaml())
      << "regenerate dataprep/tagging/domain_rules_default.cc from configs/prep/domains.yaml";
  EXPECT_GE(defaults().size(), 5u);
  auto domains = defaults().domains();
  for (const char* d : {"code", "zh", "legal"})
    EXPECT_NE(std::find(domains.begin(), domains.end(), d), domains.end()) << d;
}

TEST(DomainRules, DefaultRulesOnTypicalDocuments) {
  EXPECT_EQ(tag(doc_with(kProse)), "default");
  EXPECT_EQ(tag(doc_with(kCode)), "code/code-content");
  EXPECT_EQ(tag(doc_with(kChinese)), "zh/zh");
  EXPECT_EQ(tag(doc_with("int x;", "src/include/foo.h", 0)), "code/code-files");
  EXPECT_EQ(tag(doc_with(kProse, "/usr/share/common-licenses/GPL-3", 0)), "legal/legal-files");
  EXPECT_EQ(tag(doc_with("                    GNU GENERAL PUBLIC LICENSE\n Version 3\n...")),
            "legal/legal-text");
  // A C header that opens with a licence comment is still code: the file rule comes first.
  EXPECT_EQ(tag(doc_with("/* GNU General Public License */\nint x;", "a/b.h", 0)),
            "code/code-files");
  // Chinese comments do not make a source file Chinese.
  EXPECT_EQ(tag(doc_with(std::string("// ") + kChinese + "\nint x;", "x.cc", 0)),
            "code/code-files");
  Document declared = doc_with(kCode);
  declared.input_domain = "math";
  EXPECT_EQ(tag(declared), "math/declared");
  declared.input_domain = "bad.name";  // not a valid domain: the next rules decide
  EXPECT_EQ(tag(declared), "code/code-content");
  Document url = doc_with("x = 1");
  url.url = "https://raw.example.com:8080/repo/tool.py?raw=1";
  EXPECT_EQ(tag(url), "code/code-files");
}

TEST(DomainRules, DefaultRulesOnSystemFiles) {
  struct Case {
    const char* path;
    const char* expect;
  };
  int checked = 0;
  for (const Case& c :
       {Case{"/usr/share/common-licenses/Apache-2.0", "legal"},
        Case{"/usr/share/common-licenses/GPL-2", "legal"}, Case{"/usr/include/stdlib.h", "code"},
        Case{"/usr/include/string.h", "code"}}) {
    auto text = read_file(c.path);
    if (!text.is_ok()) continue;
    // By content alone (the file name hidden in a JSONL line).
    auto m = defaults().match(doc_with(*text));
    ASSERT_TRUE(m.has_value()) << c.path;
    EXPECT_EQ(m->domain, c.expect) << c.path << " rule " << m->rule;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "system files not present";
}

TEST(DomainRules, TextStatistics) {
  EXPECT_DOUBLE_EQ(cjk_share(""), 0.0);
  EXPECT_DOUBLE_EQ(cjk_share("abc"), 0.0);
  EXPECT_DOUBLE_EQ(cjk_share("中文"), 1.0);
  EXPECT_DOUBLE_EQ(cjk_share("ab中文"), 0.5);
  EXPECT_LT(code_score(kProse), 0.1);
  EXPECT_GT(code_score(kCode), 0.7);
  EXPECT_DOUBLE_EQ(code_score(""), 0.0);
}

TEST(DomainRules, EveryConditionKind) {
  auto rules = DomainRules::parse_text(R"(
rules:
  - name: by-source
    domain: wiki
    source: ["wikipedia*"]
  - name: by-host
    domain: news
    url_host: ["*.bbc.co.uk", "news.example.com"]
  - name: by-meta
    domain: math
    meta: {subject: ["math*", "algebra"], reviewed: true}
  - name: by-regex
    domain: faq
    head_regex: "^Q: .*\\?"
  - name: from-source
    domain_from: source
    any:
      - min_bytes: 100
      - head_contains: ["marker"]
)",
                                       "test.yaml");
  ASSERT_TRUE(rules.is_ok()) << rules.status().to_string();
  auto tag_of = [&](const Document& d) {
    auto m = rules->match(d);
    return m ? m->domain + "/" + m->rule : std::string("none");
  };
  Document d = doc_with("short");
  EXPECT_EQ(tag_of(d), "none");
  d.source = "wikipedia-en";
  EXPECT_EQ(tag_of(d), "wiki/by-source");
  d.source = "";
  d.url = "http://WWW.BBC.co.uk/news/1";
  EXPECT_EQ(tag_of(d), "news/by-host");
  d.url = "";
  d.carried = {{"meta", {{"subject", "mathematics"}, {"reviewed", false}}}};
  EXPECT_EQ(tag_of(d), "math/by-meta");
  d.carried = {{"subject", "algebra"}};  // a carried top-level field; "reviewed" missing
  EXPECT_EQ(tag_of(d), "none");
  d.carried = nlohmann::json::object();
  d.text = "Q: what is this?\nA: a test.";
  EXPECT_EQ(tag_of(d), "faq/by-regex");
  d.text = "a marker here";
  d.source = "forum";
  EXPECT_EQ(tag_of(d), "forum/from-source");
  d.text = "plain";
  EXPECT_EQ(tag_of(d), "none");
}

TEST(DomainRules, ErrorsNameTheRuleAndKey) {
  auto bad = [](const std::string& yaml, const std::string& needle) {
    auto r = DomainRules::parse_text(yaml, "r.yaml");
    ASSERT_FALSE(r.is_ok()) << yaml;
    EXPECT_EQ(r.status().code(), StatusCode::kConfig);
    EXPECT_NE(r.status().to_string().find(needle), std::string::npos) << r.status().to_string();
  };
  bad("rules: [{name: a, domain: x, cjk_shar: 0.2}]", "did you mean 'cjk_share'");
  bad("rules: [{domain: x, cjk_share: 0.2}]", "name");
  bad("rules: [{name: a, domain: x.y, cjk_share: 0.2}]", "must be 1-64");
  bad("rules: [{name: a, domain: x}]", "no conditions");
  bad("rules: [{name: a, domain: x, domain_from: source, cjk_share: 1}]", "exactly one");
  bad("rules: [{name: a, domain: x, cjk_share: 2}]", "cjk_share");
  bad("rules: [{name: a, domain: x, head_regex: '('}]", "regular expression");
  bad("rules: [{name: a, domain: x, min_bytes: 1}, {name: a, domain: y, min_bytes: 1}]",
      "duplicate");
  bad("rulez: []", "rules");
  bad("rules: [{name: a, domain: x, any: [{nope: 1}]}]", "any[0].nope");
  EXPECT_FALSE(DomainRules::load("/nonexistent/rules.yaml").is_ok());
}

TEST(DomainRules, DomainNames) {
  EXPECT_TRUE(validate_domain_name("code").is_ok());
  EXPECT_TRUE(validate_domain_name("zh-CN_2").is_ok());
  for (const char* bad : {"", "a.b", "a/b", "a b", "a\\b", "a\tb", "中文"})
    EXPECT_FALSE(validate_domain_name(bad).is_ok()) << bad;
  EXPECT_FALSE(validate_domain_name(std::string(65, 'x')).is_ok());
}

}  // namespace
}  // namespace kiln::prep
