#include "dataprep/ingest/doc_parser.h"

#include <gtest/gtest.h>

#include "dataprep/tagging/domain_rules.h"

namespace kiln::prep {
namespace {

ParseResult parse(const std::string& line, Document* d, bool repair = true) {
  ParseOptions o;
  o.repair_utf8 = repair;
  return parse_jsonl_line(line, "stem", 7, o, d);
}

TEST(DocParser, FieldsAndCarried) {
  Document d;
  auto r = parse(R"({"text":"hi there","id":42,"source":"s","url":"u","domain":"code",)"
                 R"("meta":{"k":[1,2]},"lang":"en"})",
                 &d);
  ASSERT_TRUE(r.ok) << r.detail;
  EXPECT_EQ(d.text, "hi there");
  EXPECT_EQ(d.id, "42");
  EXPECT_EQ(d.source, "s");
  EXPECT_EQ(d.url, "u");
  EXPECT_EQ(d.input_domain, "code");
  EXPECT_EQ(d.carried["meta"]["k"][1], 2);
  EXPECT_EQ(d.carried["lang"], "en");
  EXPECT_FALSE(d.carried.contains("text"));
  r = parse(R"({"text":"x","source":null})", &d);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(d.id, "stem:7");
  EXPECT_EQ(d.source, "");
}

// docs/PREP.md "Input": id is a string or a number; a number must stay a number downstream.
TEST(DocParser, NumericIdsAreMarkedAndCanonical) {
  Document d;
  ASSERT_TRUE(parse(R"({"text":"a","id":291})", &d).ok);
  EXPECT_EQ(d.id, "291");
  EXPECT_TRUE(d.id_is_number);
  ASSERT_TRUE(parse(R"({"text":"a","id":-7})", &d).ok);
  EXPECT_EQ(d.id, "-7");
  EXPECT_TRUE(d.id_is_number);
  ASSERT_TRUE(parse(R"({"text":"a","id":18446744073709551615})", &d).ok);
  EXPECT_EQ(d.id, "18446744073709551615");
  EXPECT_TRUE(d.id_is_number);
  ASSERT_TRUE(parse(R"({"text":"a","id":1.5})", &d).ok);
  EXPECT_EQ(d.id, "1.5");
  EXPECT_TRUE(d.id_is_number);
  ASSERT_TRUE(parse(R"({"text":"a","id":1E20})", &d).ok);
  EXPECT_EQ(d.id, nlohmann::json(1e20).dump());  // as nlohmann writes it
  EXPECT_TRUE(d.id_is_number);
  // The flag is reset for every document (the Document is reused).
  ASSERT_TRUE(parse(R"({"text":"a","id":"291"})", &d).ok);
  EXPECT_EQ(d.id, "291");
  EXPECT_FALSE(d.id_is_number);
  ASSERT_TRUE(parse(R"({"text":"a","id":5})", &d).ok);
  ASSERT_TRUE(parse(R"({"text":"a"})", &d).ok);
  EXPECT_EQ(d.id, "stem:7");
  EXPECT_FALSE(d.id_is_number);
  ASSERT_TRUE(parse(R"({"text":"a","id":5})", &d).ok);
  ParseOptions o;
  ASSERT_TRUE(parse_text_document("body", "dir/5", o, &d).ok);
  EXPECT_FALSE(d.id_is_number);
}

TEST(DocParser, RejectReasons) {
  Document d;
  auto reason = [&](const std::string& line, bool repair = true) {
    auto r = parse(line, &d, repair);
    EXPECT_FALSE(r.ok) << line;
    return std::string(reject_reason_name(r.reason));
  };
  EXPECT_EQ(reason("{not json"), "invalid_json");
  EXPECT_EQ(reason(R"({"text":"a"} trailing)"), "invalid_json");
  EXPECT_EQ(reason(R"([1,2])"), "not_object");
  EXPECT_EQ(reason(R"({"title":"x"})"), "missing_text");
  EXPECT_EQ(reason(R"({"text":5})"), "text_not_string");
  EXPECT_EQ(reason(R"({"text":null})"), "text_not_string");
  EXPECT_EQ(reason(R"({"text":""})"), "empty_text");
  EXPECT_EQ(reason(R"({"text":" \n\t "})"), "empty_text");
  EXPECT_EQ(reason(R"({"text":"a","id":[1]})"), "bad_field");
  EXPECT_EQ(reason(R"({"text":"a","meta":3})"), "bad_field");
  EXPECT_EQ(reason(R"({"text":"a","domain":"a/b"})"), "bad_field");
  EXPECT_EQ(reason(R"({"text":"a","url":1})"), "bad_field");
  EXPECT_EQ(reason("{\"text\":\"bad \xff byte\"}", false), "invalid_utf8");
  EXPECT_EQ(reason(R"({"text":"lone \ud800 surrogate"})", false), "invalid_utf8");
}

// One domain-name rule (issue 38): the input field, the rules/model/default check
// (validate_domain_name) and the write stage's invariant all use is_valid_domain_name. The names
// below are the ones the write stage's old, looser rule let through into folder and file names.
TEST(DocParser, DomainNameRuleIsTheOneRule) {
  const std::string longest(64, 'z');
  for (const std::string& good : std::vector<std::string>{"web", "zh-CN_2", "A", "0-9", longest}) {
    EXPECT_TRUE(is_valid_domain_name(good)) << good;
    EXPECT_TRUE(validate_domain_name(good).is_ok()) << good;
    Document d;
    EXPECT_TRUE(parse(R"({"text":"a","domain":")" + good + R"("})", &d).ok) << good;
    EXPECT_EQ(d.input_domain, good);
  }
  for (const std::string& bad :
       std::vector<std::string>{"a:b", "a*b", "caf\u00e9", "a|b", "a?b", "a~b", "a.b", "..", "a/b",
                                "a b", std::string(65, 'z')}) {
    Document d;
    const ParseResult r = parse(R"({"text":"a","domain":")" + bad + R"("})", &d);
    EXPECT_FALSE(r.ok) << bad;
    EXPECT_EQ(std::string(reject_reason_name(r.reason)), "bad_field") << bad;
    EXPECT_FALSE(is_valid_domain_name(bad)) << bad;
  }
  for (const char* bad : {"a:b", "caf\xc3\xa9", "a\x7f", "a\tb", ""}) {
    EXPECT_FALSE(is_valid_domain_name(bad)) << bad;
    EXPECT_FALSE(validate_domain_name(bad).is_ok()) << bad;
  }
}

TEST(DocParser, Utf8Repair) {
  Document d;
  auto r = parse("{\"text\":\"bad \xff byte \xe4\xbd\"}", &d, true);
  ASSERT_TRUE(r.ok) << r.detail;
  EXPECT_TRUE(r.repaired);
  EXPECT_EQ(d.text, "bad \xEF\xBF\xBD byte \xEF\xBF\xBD");
  r = parse(R"({"text":"lone \ud800 x \udc00 ok \ud83d\ude00"})", &d, true);
  ASSERT_TRUE(r.ok) << r.detail;
  EXPECT_EQ(d.text, "lone \xEF\xBF\xBD x \xEF\xBF\xBD ok \xF0\x9F\x98\x80");
  std::string out;
  EXPECT_FALSE(repair_utf8("valid \xE4\xBD\xA0", &out));
  EXPECT_TRUE(
      repair_utf8("\xC0\x80"
                  "a\xED\xA0\x80"
                  "b\xF4\x90\x80\x80",
                  &out));
  // Overlong, surrogate and out-of-range sequences: each maximal subpart is one U+FFFD.
  EXPECT_EQ(out,
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(is_valid_utf8(out));
}

TEST(DocParser, TextDocument) {
  Document d;
  ParseOptions o;
  auto r = parse_text_document("file body", "dir/a.txt", o, &d);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(d.id, "dir/a.txt");
  EXPECT_EQ(d.text, "file body");
  r = parse_text_document("  \n", "b.txt", o, &d);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, RejectReason::kEmptyText);
}

}  // namespace
}  // namespace kiln::prep
