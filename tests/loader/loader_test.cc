// Loader: partitioning across ranks, packing, mixture, errors, state serialisation.
#include "loader/loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "format/shard_writer.h"
#include "loader/order.h"
#include "loader/reshard.h"
#include "tests/loader/loader_testutil.h"

namespace kiln::loader {
namespace {

using testing::Coverage;
using testing::Dataset;
using testing::DatasetSpec;

Dataset make(const std::string& name, const DatasetSpec& spec) {
  auto ds = testing::make_dataset(testing::test_tmpdir(name), spec);
  KILN_CHECK(ds.is_ok(), ds.status().to_string());
  return std::move(ds).value();
}

std::unique_ptr<Loader> open_loader(const Dataset& ds, LoaderOptions o) {
  auto l = Loader::open(ds.manifest, o);
  KILN_CHECK(l.is_ok(), l.status().to_string());
  return std::move(l).value();
}

// Two domains, shard counts 5 and 6 (not divisible by 2, 3, 4, 7, 8 at once), documents of
// 0..30 tokens (some empty), short sequences so documents cross sequence boundaries often.
DatasetSpec two_domains() {
  DatasetSpec spec;
  spec.domains = {{"alpha", 47, 10, 0, 30}, {"beta", 23, 4, 0, 30}};
  return spec;
}

TEST(Order, PermutationAndBlocksAreDeterministicAndComplete) {
  using namespace loader::detail;
  auto p = permutation(42, 1000);
  auto q = permutation(42, 1000);
  EXPECT_EQ(p, q);
  std::sort(q.begin(), q.end());
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(q[i], i);
  EXPECT_NE(p, permutation(43, 1000));
  for (uint64_t n : {0, 1, 5, 47, 1000}) {
    for (uint64_t w : {1, 2, 3, 7, 8, 64}) {
      for (uint64_t e = 0; e < 3; ++e) {
        std::vector<int> hit(n, 0);
        for (uint64_t r = 0; r < w; ++r) {
          const Block b = rank_block(n, w, r, e);
          EXPECT_LE(b.end - b.begin, n / w + 1);
          EXPECT_GE(b.end - b.begin, n / w);
          for (uint64_t i = b.begin; i < b.end; ++i) ++hit[i];
        }
        for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(hit[i], 1);
      }
    }
  }
}

TEST(Order, EpochOrderVisitsEverySampleOnceAndReshufflesPerEpoch) {
  using namespace loader::detail;
  const std::vector<uint32_t> ids = {3, 4, 5, 6};
  const std::vector<uint64_t> counts = {10, 0, 7, 3};
  EpochOrder a(9, "code", 0, ids, counts), b(9, "code", 1, ids, counts);
  EXPECT_EQ(a.total(), 20u);
  auto flatten = [](const EpochOrder& o) {
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (uint64_t p = 0; p < o.total();) {
      const size_t k = o.shard_at(p);
      for (uint32_t m : o.members(k)) out.push_back({o.shard_id(k), m});
      p = o.shard_end(k);
    }
    return out;
  };
  auto fa = flatten(a), fb = flatten(b);
  EXPECT_NE(fa, fb);
  std::sort(fa.begin(), fa.end());
  std::sort(fb.begin(), fb.end());
  EXPECT_EQ(fa, fb);
  EXPECT_EQ(fa.size(), 20u);
}

TEST(Order, MixtureSequenceIsEvenlySpread) {
  // Any 2,000 consecutive slots fall into [0, 0.7) within a few counts of 1,400.
  for (uint64_t start : {0ull, 12345ull, 1ull << 40}) {
    int below = 0;
    for (uint64_t i = 0; i < 2000; ++i) below += loader::detail::mix_uniform(5, start + i) < 0.7;
    EXPECT_NEAR(below, 1400, 10);
  }
}

// Runs W in-process ranks in lockstep until every rank has finished epoch 0 of every domain;
// checks every batch against the truth and the exactly-once property of epoch 0.
void check_partition(const Dataset& ds, int world, LoaderOptions base) {
  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < world; ++r) {
    LoaderOptions o = base;
    o.dp_rank = r;
    o.dp_world = world;
    ranks.push_back(open_loader(ds, o));
  }
  const uint32_t eos = static_cast<uint32_t>(ds.manifest.tokenizer.eos_id);
  Coverage cov(&ds);
  auto all_past_epoch0 = [&] {
    for (auto& l : ranks) {
      for (const auto& d : l->stats().domains) {
        if (d.epoch < 1) return false;
      }
    }
    return true;
  };
  int steps = 0;
  while (!all_past_epoch0()) {
    ASSERT_LT(steps, 10000) << "W=" << world << ": epoch 0 never ends";
    std::set<int64_t> rows;  // the ranks' rows together: the step's global batch, once each
    for (int r = 0; r < world; ++r) {
      auto b = ranks[r]->next_batch();
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      ASSERT_EQ(b->step, steps);
      ASSERT_EQ(b->micro_batch, base.micro_batch) << "rank " << r << " ran dry";
      ASSERT_EQ(cov.add(*b, eos, r), "") << "W=" << world << " rank " << r;
      rows.insert(b->global_rows.begin(), b->global_rows.end());
    }
    ASSERT_EQ(rows.size(), static_cast<size_t>(world * base.micro_batch));
    ASSERT_EQ(*rows.rbegin(), world * base.micro_batch - 1);
    ++steps;
  }
  for (const auto& name : ranks[0]->domain_names()) {
    EXPECT_EQ(cov.check_epoch(name, 0, eos), "") << "W=" << world << " domain " << name;
  }
  for (auto& l : ranks) EXPECT_EQ(l->stats().step, steps);
}

TEST(LoaderPartition, EveryRankCountGetsEachSampleOncePerEpoch) {
  const Dataset ds = make("partition", two_domains());
  ASSERT_EQ(ds.manifest.shards.size(), 11u);
  LoaderOptions o;
  o.seq_len = 7;
  o.micro_batch = 4;
  o.seed = 3;
  o.weights = {{"alpha", 0.6}, {"beta", 0.4}};
  o.workers = 2;
  o.prefetch_depth = 2;
  for (int w : {1, 2, 3, 4, 7, 8}) check_partition(ds, w, o);
}

TEST(LoaderPartition, MoreRanksThanSamples) {
  DatasetSpec spec;
  spec.domains = {{"tiny", 5, 2, 1, 6}};
  const Dataset ds = make("tiny", spec);
  LoaderOptions o;
  o.seq_len = 3;
  o.micro_batch = 2;
  o.workers = 1;
  check_partition(ds, 8, o);
}

TEST(LoaderPacking, EpochTokenMultisetIsShardTokensPlusOneEosPerDocument) {
  DatasetSpec spec;
  spec.domains = {{"only", 61, 7, 0, 50}};
  spec.vocab_size = 70000;  // uint32 npy
  spec.eos_id = 69999;
  const Dataset ds = make("packing", spec);
  LoaderOptions o;
  o.seq_len = 31;
  o.micro_batch = 3;
  auto l = open_loader(ds, o);
  std::map<uint32_t, int64_t> emitted;
  while (l->stats().domains[0].epoch == 0) {
    auto b = l->next_batch();
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    for (int64_t r = 0; r < b->micro_batch; ++r) {
      for (const DocSpan& s : b->docs[r]) {
        if (s.epoch != 0) continue;
        for (uint32_t i = 0; i < s.length; ++i) ++emitted[b->row(r)[s.seq_offset + i]];
      }
    }
  }
  std::map<uint32_t, int64_t> expected;
  for (const auto& [key, doc] : ds.docs) {
    for (uint32_t t : doc.tokens) ++expected[t];
    ++expected[69999];
  }
  EXPECT_EQ(emitted, expected);
}

TEST(LoaderPacking, DocumentBoundaries) {
  DatasetSpec spec;
  spec.domains = {{"only", 20, 5, 3, 9}};
  const Dataset ds = make("bounds", spec);
  LoaderOptions o;
  o.seq_len = 15;
  o.micro_batch = 2;
  auto l = open_loader(ds, o);
  auto b = l->next_batch();
  ASSERT_TRUE(b.is_ok());
  for (int64_t r = 0; r < 2; ++r) {
    const auto starts = b->doc_starts(r);
    // A document starts at 0 (unless the row continues one) and right after every eos.
    std::vector<int32_t> after_eos;
    if (b->docs[r].front().doc_offset == 0) after_eos.push_back(0);
    const auto row = b->row(r);
    for (size_t i = 0; i + 1 < row.size(); ++i) {
      if (row[i] == 0) after_eos.push_back(static_cast<int32_t>(i + 1));
    }
    EXPECT_EQ(starts, after_eos) << "row " << r;
  }
}

TEST(LoaderMixture, SharesFollowWeightsBeforeAndAfterAChange) {
  DatasetSpec spec;
  spec.domains = {{"a", 200, 20, 0, 10}, {"b", 150, 20, 0, 10}, {"c", 100, 20, 0, 10}};
  const Dataset ds = make("mixture", spec);
  for (int world : {1, 2}) {
    std::vector<std::unique_ptr<Loader>> ranks;
    for (int r = 0; r < world; ++r) {
      LoaderOptions o;
      o.seq_len = 8;
      o.micro_batch = 8;
      o.seed = 11;
      o.dp_rank = r;
      o.dp_world = world;
      o.weights = {{"a", 7}, {"b", 2}, {"c", 1}};  // normalised to 0.7 / 0.2 / 0.1
      ranks.push_back(open_loader(ds, o));
    }
    EXPECT_NEAR(ranks[0]->weights().at("a"), 0.7, 1e-12);
    auto run = [&](std::vector<double> want) {
      std::vector<int> count(3, 0);
      for (int step = 0; step < 250; ++step) {  // 2,000 sequences per rank
        for (int r = 0; r < world; ++r) {
          auto b = ranks[r]->next_batch();
          ASSERT_TRUE(b.is_ok()) << b.status().to_string();
          for (int32_t d : b->domains) ++count[d];
        }
      }
      for (int d = 0; d < 3; ++d) {
        EXPECT_NEAR(count[d] / (2000.0 * world), want[d], 0.02) << "domain " << d;
      }
    };
    run({0.7, 0.2, 0.1});
    for (auto& l : ranks) ASSERT_TRUE(l->set_weights({{"a", 0.1}, {"b", 0.3}, {"c", 0.6}}).is_ok());
    run({0.1, 0.3, 0.6});
    // A domain not named gets weight 0.
    for (auto& l : ranks) ASSERT_TRUE(l->set_weights({{"b", 1}}).is_ok());
    run({0, 1, 0});
    const auto hist = ranks[0]->state().weights_history;
    ASSERT_EQ(hist.size(), 3u);
    EXPECT_EQ(hist[1].step, 250);
    EXPECT_EQ(hist[2].step, 500);
    EXPECT_EQ(hist[2].weights.at("a"), 0.0);
  }
}

TEST(LoaderMixture, DefaultWeightsAreTokenShares) {
  const Dataset ds = make("defaults", two_domains());
  auto l = open_loader(ds, LoaderOptions{});
  const double a = static_cast<double>(ds.manifest.domains.at("alpha").tokens);
  const double b = static_cast<double>(ds.manifest.domains.at("beta").tokens);
  EXPECT_NEAR(l->weights().at("alpha"), a / (a + b), 1e-12);
  EXPECT_NEAR(l->weights().at("beta"), b / (a + b), 1e-12);
}

TEST(LoaderErrors, BadOptionsAndWeightsNameTheProblem) {
  const Dataset ds = make("options", two_domains());
  LoaderOptions o;
  o.dp_rank = 2;
  o.dp_world = 2;
  auto l = Loader::open(ds.manifest, o);
  ASSERT_FALSE(l.is_ok());
  EXPECT_EQ(l.status().code(), StatusCode::kConfig);
  EXPECT_EQ(l.status().key(), "dp_rank");
  o = LoaderOptions{};
  o.weights = {{"alpah", 1}};
  l = Loader::open(ds.manifest, o);
  ASSERT_FALSE(l.is_ok());
  EXPECT_NE(l.status().message().find("did you mean 'alpha'"), std::string::npos);
  o.weights = {{"alpha", -1}};
  EXPECT_FALSE(Loader::open(ds.manifest, o).is_ok());
  o.weights = {{"alpha", 0}};
  EXPECT_FALSE(Loader::open(ds.manifest, o).is_ok());
  o.weights = {};
  o.seq_len = 0;
  EXPECT_FALSE(Loader::open(ds.manifest, o).is_ok());
  Manifest no_eos = ds.manifest;
  no_eos.tokenizer.eos_id = -1;
  EXPECT_FALSE(Loader::open(no_eos, LoaderOptions{}).is_ok());
}

void corrupt(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(40);
  const char junk[16] = {'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
                         'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'};
  f.write(junk, sizeof(junk));
}

TEST(LoaderErrors, BadShardStopsNamingItOrIsSkippedAndCounted) {
  DatasetSpec spec;
  spec.domains = {{"only", 40, 10, 1, 20}};
  const Dataset ds = make("badshard", spec);
  const std::string bad = ds.manifest.shards[1].path;
  corrupt(ds.manifest.shard_path(ds.manifest.shards[1]));
  for (bool verify : {true, false}) {
    LoaderOptions o;
    o.seq_len = 15;
    o.micro_batch = 4;
    o.verify_checksums = verify;
    auto l = open_loader(ds, o);
    Status err;
    for (int i = 0; i < 100 && err.is_ok(); ++i) {
      auto b = l->next_batch();
      if (!b.is_ok()) err = b.status();
    }
    ASSERT_FALSE(err.is_ok()) << "verify=" << verify;
    EXPECT_EQ(err.code(), StatusCode::kData) << err.to_string();
    EXPECT_NE(err.to_string().find(bad), std::string::npos) << err.to_string();
    // The error repeats rather than yielding later data.
    EXPECT_FALSE(l->next_batch().is_ok());

    o.skip_bad_shards = true;
    auto s = open_loader(ds, o);
    Coverage cov(&ds);
    for (int i = 0; i < 100; ++i) {
      auto b = s->next_batch();
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      ASSERT_EQ(cov.add(*b, 0), "");
      for (const auto& row : b->docs) {
        for (const auto& span : row) ASSERT_NE(span.shard, 1u);
      }
    }
    EXPECT_EQ(s->stats().skipped_shards, 1u);
    EXPECT_EQ(s->state().skipped_shards, 1u);
  }
}

TEST(LoaderErrors, MissingShardAndMissingTokensMember) {
  DatasetSpec spec;
  spec.domains = {{"only", 20, 10, 1, 20}};
  const Dataset ds = make("missing", spec);
  std::filesystem::remove(ds.manifest.shard_path(ds.manifest.shards[0]));
  LoaderOptions o;
  o.seq_len = 15;
  auto l = open_loader(ds, o);
  Status err;
  for (int i = 0; i < 100 && err.is_ok(); ++i) {
    auto b = l->next_batch();
    if (!b.is_ok()) err = b.status();
  }
  ASSERT_FALSE(err.is_ok());
  EXPECT_NE(err.to_string().find(ds.manifest.shards[0].path), std::string::npos) << err.to_string();

  // A sample without its tokens.npy member: the error names the member.
  const std::string dir = testing::test_tmpdir("notokens");
  std::filesystem::remove_all(dir);
  RollingShardWriter::Options wo;
  wo.dir = dir + "/shards/x";
  wo.prefix = "x";
  std::filesystem::create_directories(wo.dir);
  RollingShardWriter w(wo);
  ShardSample sample;
  sample.key = "doc_without_tokens";
  sample.members = {{"txt", "hello"}, {"json", "{\"id\":\"q\"}"}};
  ASSERT_TRUE(w.add(sample, 0).is_ok());
  auto infos = w.finish();
  ASSERT_TRUE(infos.is_ok());
  Manifest m;
  m.dir = dir;
  m.tokenizer.eos_id = 0;
  m.tokenizer.vocab_size = 10;
  m.add_shard(infos->front(), "x", dir);
  auto bad = Loader::open(m, LoaderOptions{});
  ASSERT_TRUE(bad.is_ok());
  auto b = (*bad)->next_batch();
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().to_string().find("doc_without_tokens.tokens.npy"), std::string::npos)
      << b.status().to_string();
  std::filesystem::remove_all(dir);
}

TEST(LoaderState, JsonRoundTripAndMergeChecks) {
  LoaderState s;
  s.dataset = 0xfedcba9876543210ull;
  s.seed = 1ull << 63;
  s.partitions = 4;
  s.global_batch = 8;
  s.world = 2;
  s.micro_batch = 4;
  s.step = 17;
  s.weights_history = {{0, {{"a", 0.25}, {"b", 0.75}}}, {9, {{"a", 1.0 / 3}, {"b", 2.0 / 3}}}};
  LoaderState::DomainCursor c;
  c.pending = {{1, 5, 9, 3}, {1, 20, 30, 0}};
  c.next_epoch = 2;
  c.sequences = 40;
  s.cursors = {{1, {{"a", c}, {"b", {}}}}};
  auto back = LoaderState::from_json(s.to_json());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->to_json(), s.to_json());
  EXPECT_EQ(back->weights_history[1].weights.at("a"), 1.0 / 3);  // exact round trip
  EXPECT_EQ(back->seed, 1ull << 63);

  LoaderState s0 = s;
  s0.cursors[0].partition = 0;
  auto merged = LoaderState::merge({s, s0});
  ASSERT_TRUE(merged.is_ok());
  ASSERT_EQ(merged->cursors.size(), 2u);
  EXPECT_EQ(merged->cursors[0].partition, 0);
  EXPECT_FALSE(LoaderState::merge({s, s}).is_ok());
  LoaderState other = s0;
  other.step = 18;
  EXPECT_FALSE(LoaderState::merge({s, other}).is_ok());

  EXPECT_FALSE(LoaderState::from_json("{").is_ok());
  EXPECT_FALSE(LoaderState::from_json("{\"format\":\"nope\"}").is_ok());
  std::string text = s.to_json();
  text.replace(text.find("\"partitions\":4"), 14, "\"partitions\":1");  // partition 1 of 1
  auto r = LoaderState::from_json(text, "state.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().file(), "state.json");
}

TEST(LoaderState, ReshardSplitsTheLeftoversEvenly) {
  // World 3 over 10 samples; rank 0 finished epoch 0 and started epoch 1, rank 1 is mid-part,
  // rank 2 has not started its part of epoch 0... well, only pending intervals matter.
  using loader::detail::rank_block;
  std::vector<LoaderState::DomainCursor> old(3);
  const auto b00 = rank_block(10, 3, 0, 1), b1 = rank_block(10, 3, 1, 0),
             b2 = rank_block(10, 3, 2, 0);
  old[0].pending = {{1, b00.begin + 1, b00.end, 0}};
  old[0].next_epoch = 2;
  old[1].pending = {{0, b1.begin + 1, b1.end, 5}};
  old[1].next_epoch = 1;
  old[2].pending = {{0, b2.begin, b2.end, 0}};
  old[2].next_epoch = 1;
  std::map<std::pair<uint64_t, uint64_t>, int> seen;
  uint64_t skip_owner = 0;
  for (int r = 0; r < 2; ++r) {
    auto c = loader::detail::reshard_cursor(old, 3, 10, 2, r);
    EXPECT_EQ(c.next_epoch, 2u);
    for (const auto& iv : c.pending) {
      for (uint64_t p = iv.begin; p < iv.end; ++p) ++seen[{iv.epoch, p}];
      if (iv.skip_tokens == 5) skip_owner += 1;
    }
  }
  EXPECT_EQ(skip_owner, 1u);
  // Expected leftovers: epoch 0: rank 1's part after its first sample, rank 2's whole part;
  // epoch 1: rank 0's part after one sample plus ranks 1 and 2's whole parts.
  std::map<std::pair<uint64_t, uint64_t>, int> want;
  for (uint64_t p = b1.begin + 1; p < b1.end; ++p) want[{0, p}] = 1;
  for (uint64_t p = b2.begin; p < b2.end; ++p) want[{0, p}] = 1;
  for (uint64_t p = b00.begin + 1; p < b00.end; ++p) want[{1, p}] = 1;
  for (int r : {1, 2}) {
    const auto b = rank_block(10, 3, r, 1);
    for (uint64_t p = b.begin; p < b.end; ++p) want[{1, p}] = 1;
  }
  EXPECT_EQ(seen, want);
}

}  // namespace
}  // namespace kiln::loader
