// DomainWeights (loader/domain_weights.h): parsing "d=w" lists, validation with the caller's
// status code and key, normalisation.
#include "loader/domain_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kiln::loader {
namespace {

WeightRules flag_rules() {
  WeightRules r;
  r.code = StatusCode::kUsage;
  r.key = "--weights";
  r.key_per_domain = false;
  return r;
}

TEST(DomainWeights, ParsesAList) {
  auto w = DomainWeights::parse("a=1,b=0.5,c=0", flag_rules());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->size(), 3u);
  EXPECT_EQ(w->at("b"), 0.5);
  EXPECT_EQ(w->get("c"), 0.0);
  EXPECT_EQ(w->get("absent"), 0.0);
  // Separate items (as `kiln mix set` gets them) and empty items between commas.
  auto items = DomainWeights::parse(std::vector<std::string>{"a=1", "b=0.5", "c=0"}, flag_rules());
  ASSERT_TRUE(items.is_ok());
  EXPECT_EQ(*items, *w);
  EXPECT_TRUE(DomainWeights::parse("a=1,,b=2,", flag_rules()).is_ok());
}

TEST(DomainWeights, RejectsBadListsNamingTheKey) {
  for (const char* bad : {"a=1,a=2", "a=x", "=1", "a=", "a", "a=inf", "a=nan", "a=-1", "a=1e999",
                          "", ",", "a=0,b=0"}) {
    auto w = DomainWeights::parse(bad, flag_rules());
    ASSERT_FALSE(w.is_ok()) << bad;
    EXPECT_EQ(w.status().code(), StatusCode::kUsage) << bad;
    EXPECT_EQ(w.status().key(), "--weights") << bad;
  }
  EXPECT_NE(DomainWeights::parse("a=1,a=2", flag_rules()).status().message().find("given twice"),
            std::string::npos);
}

TEST(DomainWeights, CheckUsesTheCallersCodeKeyAndDomains) {
  WeightRules rules;  // kConfig, "weights.<domain>"
  rules.known = {"code", "web"};
  EXPECT_TRUE(DomainWeights({{"code", 3}, {"web", 0}}).check(rules).is_ok());
  Status unknown = DomainWeights({{"cdoe", 1}}).check(rules);
  EXPECT_EQ(unknown.code(), StatusCode::kConfig);
  EXPECT_EQ(unknown.key(), "weights.cdoe");
  EXPECT_NE(unknown.message().find("did you mean 'code'"), std::string::npos) << unknown.message();
  Status far = DomainWeights({{"zzzzzzzz", 1}}).check(rules);
  EXPECT_NE(far.message().find("domains: code, web"), std::string::npos) << far.message();

  rules.code = StatusCode::kData;
  rules.key = "data.mixture";
  rules.file = "mix.json";
  Status negative = DomainWeights({{"web", -1}}).check(rules);
  EXPECT_EQ(negative.code(), StatusCode::kData);
  EXPECT_EQ(negative.key(), "data.mixture.web");
  EXPECT_EQ(negative.file(), "mix.json");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(DomainWeights({{"web", inf}}).check(rules).key(), "data.mixture.web");
  EXPECT_EQ(DomainWeights({{"web", std::nan("")}}).check(rules).key(), "data.mixture.web");
  Status zero = DomainWeights({{"web", 0}, {"code", 0}}).check(rules);
  EXPECT_EQ(zero.key(), "data.mixture");
  EXPECT_NE(zero.message().find("sum to more than 0"), std::string::npos);
  EXPECT_FALSE(DomainWeights().check(rules).is_ok());  // nothing weighted
  // Overflowing sum of finite weights.
  Status huge = DomainWeights({{"code", 1e308}, {"web", 1e308}}).check(rules);
  EXPECT_EQ(huge.key(), "data.mixture");
  EXPECT_NE(huge.message().find("sum overflows"), std::string::npos) << huge.message();
}

TEST(DomainWeights, Normalises) {
  const DomainWeights w{{"code", 3}, {"web", 1}};
  const DomainWeights n = w.normalised();
  EXPECT_DOUBLE_EQ(n.at("code"), 0.75);
  EXPECT_DOUBLE_EQ(n.at("web"), 0.25);
  const std::vector<double> v = w.normalised_over({"code", "prose", "web"});
  ASSERT_EQ(v.size(), 3u);
  EXPECT_DOUBLE_EQ(v[0], 0.75);
  EXPECT_EQ(v[1], 0.0);
  EXPECT_DOUBLE_EQ(v[2], 0.25);
  EXPECT_EQ(DomainWeights({{"a", 0}}).normalised().at("a"), 0.0);
}

}  // namespace
}  // namespace kiln::loader
