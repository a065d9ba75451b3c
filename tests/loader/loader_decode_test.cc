// loader/decode.h: one planned unit read from its shard: the planned members in plan order,
// tokens widened, the restored prefix skipped, eos after every document; errors name the shard.
#include <gtest/gtest.h>

#include "loader/decode.h"
#include "tests/loader/loader_testutil.h"

namespace kiln::loader::detail {
namespace {

using kiln::testing::Dataset;
using kiln::testing::DatasetSpec;

const Dataset& dataset() {
  static const Dataset ds = [] {
    DatasetSpec spec;
    spec.domains = {{"alpha", 6, 6, 3, 9}};
    spec.vocab_size = 500;
    spec.eos_id = 0;
    auto r = kiln::testing::make_dataset(kiln::testing::test_tmpdir("decode"), spec);
    KILN_CHECK(r.is_ok(), r.status().to_string());
    return std::move(r).value();
  }();
  return ds;
}

Unit planned(std::vector<uint32_t> members, uint64_t skip_tokens = 0) {
  Unit u;
  u.plan.shard = 0;
  u.plan.members = std::move(members);
  u.plan.skip_tokens = skip_tokens;
  return u;
}

TEST(LoaderDecode, PlannedMembersInOrderWithEosAndSkippedPrefix) {
  const Dataset& ds = dataset();
  DecodeOptions o;
  o.eos = 0;
  o.sample_ids = true;
  std::atomic<bool> abort{false};
  Unit u = planned({4, 1, 2}, /*skip_tokens=*/2);
  decode_unit(ds.manifest, o, abort, &u);
  ASSERT_TRUE(u.status.is_ok()) << u.status.to_string();
  ASSERT_EQ(u.docs(), 3u);
  std::vector<uint32_t> expected;
  for (size_t i = 0; i < 3; ++i) {
    const auto& truth = ds.docs.at({0, u.plan.members[i]});
    EXPECT_EQ(u.doc_start[i], expected.size());
    expected.insert(expected.end(), truth.tokens.begin() + (i == 0 ? 2 : 0), truth.tokens.end());
    expected.push_back(0);
    EXPECT_EQ(u.ids[i], truth.id);
  }
  EXPECT_EQ(u.doc_start[3], expected.size());
  ASSERT_EQ(u.size(), expected.size());
  EXPECT_TRUE(u.narrow);  // the fixture's vocabulary fits uint16: stored 16 bits wide
  std::vector<uint32_t> widened(u.size());
  u.copy_tokens(0, u.size(), widened.data());
  EXPECT_EQ(widened, expected);
  EXPECT_GT(u.tar_bytes, 0u);
}

TEST(LoaderDecode, WideVocabularyKeeps32BitTokens) {
  // A vocabulary past 65,536: .tokens.npy are uint32 and the unit stores 32-bit tokens.
  DatasetSpec spec;
  spec.domains = {{"wide", 4, 4, 3, 9}};
  spec.vocab_size = 200000;
  spec.eos_id = 150000;
  auto ds = kiln::testing::make_dataset(kiln::testing::test_tmpdir("decode_wide"), spec);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  DecodeOptions o;
  o.eos = 150000;
  std::atomic<bool> abort{false};
  Unit u = planned({3, 0});
  decode_unit(ds->manifest, o, abort, &u);
  ASSERT_TRUE(u.status.is_ok()) << u.status.to_string();
  EXPECT_FALSE(u.narrow);
  std::vector<uint32_t> expected;
  for (uint32_t m : u.plan.members) {
    const auto& truth = ds->docs.at({0, m});
    expected.insert(expected.end(), truth.tokens.begin(), truth.tokens.end());
    expected.push_back(150000);
  }
  std::vector<uint32_t> got(u.size());
  u.copy_tokens(0, u.size(), got.data());
  EXPECT_EQ(got, expected);
}

TEST(LoaderDecode, IdsAreWhatNlohmannDumps) {
  // The ids' fast path (simdjson) and the general one (nlohmann::json) give the same text.
  DatasetSpec spec;
  spec.domains = {{"ids", 12, 12, 1, 4}};
  spec.jsons = {R"({"id":"plain-7","domain":"ids"})",
                R"({"domain":"ids","id":17})",
                R"({"id":-3})",
                R"({"id":18446744073709551615})",
                R"({"id":2.50})",
                R"({"id":1e3})",
                R"({"id":"quote \" and \\ and \u0001 and \/"})",
                R"({"id":"caf\u00e9 \u00e9 é"})",
                R"({"id":"first","id":"last"})",
                R"({"meta":{"id":"nested"},"id":"outer"})",
                R"( { "id" : "spaced" } )",
                R"({"id":"tab\there"})"};
  auto ds = kiln::testing::make_dataset(kiln::testing::test_tmpdir("decode_ids"), spec);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  DecodeOptions o;
  o.sample_ids = true;
  std::atomic<bool> abort{false};
  std::vector<uint32_t> all(12);
  for (uint32_t i = 0; i < 12; ++i) all[i] = i;
  Unit u = planned(all);
  decode_unit(ds->manifest, o, abort, &u);
  ASSERT_TRUE(u.status.is_ok()) << u.status.to_string();
  ASSERT_EQ(u.ids.size(), 12u);
  for (uint32_t i = 0; i < 12; ++i) EXPECT_EQ(u.ids[i], ds->docs.at({0, i}).id) << i;
  EXPECT_EQ(u.ids[0], "\"plain-7\"");
  EXPECT_EQ(u.ids[8], "\"last\"");
}

TEST(LoaderDecode, ErrorsNameTheShard) {
  const Dataset& ds = dataset();
  std::atomic<bool> abort{false};
  Manifest small = ds.manifest;
  small.tokenizer.vocab_size = 2;  // every document holds ids >= 2
  Unit u = planned({0});
  decode_unit(small, {}, abort, &u);
  EXPECT_EQ(u.status.code(), StatusCode::kData);
  EXPECT_NE(u.status.to_string().find(".tokens.npy"), std::string::npos) << u.status.to_string();

  Manifest wrong = ds.manifest;
  wrong.shards[0].samples += 1;  // the shard holds fewer samples than the manifest says
  Unit v = planned({0});
  decode_unit(wrong, {}, abort, &v);
  EXPECT_EQ(v.status.code(), StatusCode::kData);
  EXPECT_NE(v.status.to_string().find(wrong.shard_path(wrong.shards[0])), std::string::npos)
      << v.status.to_string();

  Unit past = planned({0}, /*skip_tokens=*/1000);  // a restored position past the document
  decode_unit(ds.manifest, {}, abort, &past);
  EXPECT_FALSE(past.status.is_ok());

  abort = true;
  Unit stopped = planned({0});
  decode_unit(ds.manifest, {}, abort, &stopped);
  EXPECT_FALSE(stopped.status.is_ok());
}

}  // namespace
}  // namespace kiln::loader::detail
