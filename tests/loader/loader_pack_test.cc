// loader/pack.h: the mixture decision and cutting rows out of a domain's packed stream.
#include <gtest/gtest.h>

#include <map>
#include <string_view>

#include "common/hash.h"
#include "loader/order.h"
#include "loader/pack.h"

namespace kiln::loader::detail {
namespace {

// A decoded unit holding documents of the given lengths; token values count up from `first`.
std::shared_ptr<const Unit> unit(uint64_t seq, std::vector<uint32_t> lengths, uint32_t first) {
  auto u = std::make_shared<Unit>();
  u->plan.seq = seq;
  u->plan.shard = static_cast<uint32_t>(seq);
  for (size_t i = 0; i < lengths.size(); ++i) {
    u->plan.members.push_back(static_cast<uint32_t>(10 + i));
    u->doc_start.push_back(u->tokens.size());
    for (uint32_t t = 0; t < lengths[i]; ++t) u->tokens.push_back(first++);
  }
  u->doc_start.push_back(u->tokens.size());
  u->ready = true;
  return u;
}

TEST(LoaderPack, RowsTileTheStreamAcrossDocumentsAndUnits) {
  // Stream: [1 2 3] [4 5] | [6 7 8 9] — rows of width 4.
  std::map<uint64_t, std::shared_ptr<const Unit>> units = {{0, unit(0, {3, 2}, 1)},
                                                           {1, unit(1, {4}, 6)}};
  int fetches = 0;
  UnitFetch fetch = [&](uint64_t seq) -> std::shared_ptr<const Unit> {
    ++fetches;
    auto it = units.find(seq);
    return it == units.end() ? nullptr : it->second;
  };
  std::shared_ptr<const Unit> current;
  Pos pos;
  Status error;
  uint32_t row[4];
  std::vector<DocSpan> spans;
  ASSERT_EQ(fill_row(fetch, &current, &pos, 4, row, &spans, &error), FillResult::kFilled);
  EXPECT_EQ(std::vector<uint32_t>(row, row + 4), (std::vector<uint32_t>{1, 2, 3, 4}));
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_TRUE(spans[0].ends);
  EXPECT_EQ(spans[0].length, 3u);
  EXPECT_EQ(spans[0].member, 10u);
  EXPECT_FALSE(spans[1].ends);
  EXPECT_EQ(spans[1].seq_offset, 3u);
  spans.clear();
  ASSERT_EQ(fill_row(fetch, &current, &pos, 4, row, &spans, &error), FillResult::kFilled);
  EXPECT_EQ(std::vector<uint32_t>(row, row + 4), (std::vector<uint32_t>{5, 6, 7, 8}));
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].doc_offset, 1u);  // the second piece of document [4 5]
  EXPECT_EQ(spans[1].shard, 1u);
  EXPECT_EQ(pos.unit, 1u);
  EXPECT_EQ(pos.tok, 3u);
  EXPECT_EQ(fetches, 2);  // each unit fetched once
  // The stream runs out: the fetch gives nothing, the row is abandoned.
  spans.clear();
  EXPECT_EQ(fill_row(fetch, &current, &pos, 4, row, &spans, &error), FillResult::kAbandoned);
}

TEST(LoaderPack, AFailedUnitFailsTheRow) {
  auto bad = std::make_shared<Unit>();
  bad->status = Status::data("broken shard");
  UnitFetch fetch = [&](uint64_t) -> std::shared_ptr<const Unit> { return bad; };
  std::shared_ptr<const Unit> current;
  Pos pos;
  Status error;
  uint32_t row[2];
  std::vector<DocSpan> spans;
  EXPECT_EQ(fill_row(fetch, &current, &pos, 2, row, &spans, &error), FillResult::kFailed);
  EXPECT_EQ(error.message(), "broken shard");
}

TEST(LoaderPack, ChooseDomainFollowsTheWeights) {
  const std::vector<double> w = {0.25, 0.0, 0.75};
  int count[3] = {0, 0, 0};
  for (uint64_t i = 0; i < 4000; ++i) ++count[choose_domain(w, 11, i)];
  EXPECT_EQ(count[1], 0);           // weight 0: never chosen
  EXPECT_NEAR(count[0], 1000, 10);  // low-discrepancy: very close to the share
  EXPECT_EQ(choose_domain(w, 11, 17), choose_domain(w, 11, 17));  // same on every rank
  EXPECT_EQ(choose_domain({0.0, 1.0}, 3, 5), 1);
}

// Regression: the mixture's start was xxh3_64("mixture", seed), which picked the (data, size)
// overload and hashed `seed` bytes from the string literal: decisions depended on what the linker
// put after the literal (kiln stream, the Python module and kiln train disagreed for seed 11) and
// a large seed read far out of bounds. The start is now the hash of "mixture" seeded with seed.
TEST(LoaderPack, MixtureStartHashesTheNameWithTheSeed) {
  const double kPhi = 0x9E3779B97F4A7C15ull * 0x1.0p-64;  // 2^64 / golden ratio, as a fraction
  for (uint64_t seed : {0ull, 5ull, 11ull, 1234ull, 1ull << 40, ~0ull}) {
    const uint64_t start = xxh3_64(std::string_view("mixture"), seed);
    EXPECT_EQ(mix_uniform(seed, 0), static_cast<double>(start >> 11) * 0x1.0p-53) << seed;
    const double u3 = mix_uniform(seed, 3);
    double want = static_cast<double>(start >> 11) * 0x1.0p-53 + 3 * kPhi;
    want -= static_cast<double>(static_cast<int64_t>(want));
    EXPECT_NEAR(u3, want, 1e-12) << seed;
  }
}

}  // namespace
}  // namespace kiln::loader::detail
