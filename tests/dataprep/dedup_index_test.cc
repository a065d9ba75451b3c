// The dedup index files (dataprep/dedup/dedup_index.h): what is written is found again through
// the sparse indexes (across block boundaries, keys repeated over blocks, several runs and
// segments), signatures and ids come back by ref, damage and mismatching settings are named.
#include "dataprep/dedup/dedup_index.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/atomic_file.h"
#include "tests/dataprep/prep_test_util.h"

namespace kiln::prep {
namespace {
using testing_prep::TempDir;

struct Doc {
  uint64_t ref, link, lo, hi;
  std::vector<uint64_t> keys, sig;
  std::string id;
};

class DedupIndexTest : public ::testing::Test {
 protected:
  static constexpr int kPerm = 8, kBands = 4;
  // Segment s, run r: `n` entries with ordinals from `first`; with `removed`, every fifth is a
  // removed document linked to the run's first (every tenth through set_link). Band keys come
  // from a small range so that many documents share them (runs of equal keys longer than a
  // 1024-record block).
  nlohmann::json write_run(uint32_t seg, int rank, uint64_t first, uint64_t n, std::mt19937_64& rng,
                           bool removed = true) {
    IndexRunWriter w(tmp_.str() + "/dedup/index", seg, rank, kPerm, kBands, tmp_.str(), 1 << 16);
    std::filesystem::create_directories(tmp_.str() + "/dedup/index/" + index_segment_name(seg));
    for (uint64_t k = 0; k < n; ++k) {
      Doc d;
      d.ref = make_ref(seg, first + k);
      d.link = removed && k % 5 == 4 ? make_ref(seg, first) : d.ref;
      d.lo = rng();
      d.hi = rng();
      for (int b = 0; b < kBands; ++b) d.keys.push_back(rng() % 500);
      for (int p = 0; p < kPerm; ++p) d.sig.push_back(rng());
      d.id = "\"doc-" + std::to_string(seg) + "-" + std::to_string(first + k) + "\"";
      const bool later = d.link != d.ref && k % 10 == 9;
      EXPECT_TRUE(w.add_doc(d.ref, later ? IndexRunWriter::kLinkLater : d.link, d.lo, d.hi,
                            d.keys.data(), d.sig.data(), d.id)
                      .is_ok());
      if (later) {
        EXPECT_TRUE(w.set_link(d.ref, d.link).is_ok());
      }
      if (d.link != d.ref) {
        EXPECT_TRUE(w.add_exact(d.lo, d.hi, d.link).is_ok());
      }
      docs_.push_back(d);
    }
    // An extra exact hash pointing at the run's first document (a removed copy of it).
    extra_ = {rng(), rng(), make_ref(seg, first)};
    EXPECT_TRUE(w.add_exact(extra_[0], extra_[1], extra_[2]).is_ok());
    auto info = w.finish(first);
    EXPECT_TRUE(info.is_ok());
    info->rank = rank;
    return info->to_json();
  }
  void write_meta(const nlohmann::json& segments) {
    ASSERT_TRUE(write_file_atomic(tmp_.str() + "/dedup/index/index.json",
                                  make_index_meta(settings_, {}, segments).dump())
                    .is_ok());
  }
  TempDir tmp_{"dedup_index"};
  std::vector<Doc> docs_;
  std::vector<uint64_t> extra_;
  DedupSettings settings_ = [] {
    DedupSettings s;
    s.num_perm = kPerm;
    s.bands = kBands;
    s.rows = 2;
    return s;
  }();
};

TEST_F(DedupIndexTest, FindsEverythingItHolds) {
  std::mt19937_64 rng(5);
  nlohmann::json segments = nlohmann::json::array();
  nlohmann::json runs0 = {write_run(0, 0, 0, 3000, rng), write_run(0, 1, 3000, 1500, rng)};
  std::vector<uint64_t> extra0 = extra_;
  // json::array: `json x = {one_json}` is a copy of it, not a one-element array, under clang
  // (CWG 2137; g++ 12 builds the array), which made this test fail in the clang build.
  nlohmann::json runs1 = nlohmann::json::array({write_run(1, 0, 0, 700, rng)});
  segments.push_back({{"name", "seg-000000"}, {"docs", 4500}, {"runs", runs0}});
  segments.push_back({{"name", "seg-000001"}, {"docs", 700}, {"runs", runs1}});
  write_meta(segments);
  auto idx = DedupIndex::open(tmp_.str());
  ASSERT_TRUE(idx.is_ok()) << idx.status().to_string();
  EXPECT_EQ((*idx)->segments(), 2u);
  EXPECT_EQ((*idx)->entries(), 5200u);
  EXPECT_EQ((*idx)->kept_docs(), 5200u - 5200u / 5);

  std::map<uint64_t, std::vector<uint64_t>> by_key;
  for (const Doc& d : docs_)
    for (uint64_t k : d.keys) by_key[k].push_back(d.ref);
  std::vector<uint64_t> refs, sig(kPerm);
  for (const Doc& d : docs_) {
    (*idx)->find_exact(d.lo, d.hi, &refs);
    ASSERT_EQ(refs, std::vector<uint64_t>{d.link});
    auto kept = (*idx)->kept_ref(d.ref);
    ASSERT_TRUE(kept.is_ok());
    EXPECT_EQ(*kept, d.link);
    ASSERT_TRUE((*idx)->signature(d.ref, sig.data()).is_ok());
    EXPECT_EQ(sig, d.sig);
    auto id = (*idx)->id_json(d.ref);
    ASSERT_TRUE(id.is_ok());
    EXPECT_EQ(*id, d.id);
  }
  for (auto& [key, want] : by_key) {
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    (*idx)->find_band(key, &refs);
    ASSERT_EQ(refs, want) << "key " << key;
  }
  (*idx)->find_band(100000, &refs);
  EXPECT_TRUE(refs.empty());
  (*idx)->find_exact(1, 2, &refs);
  EXPECT_TRUE(refs.empty());
  (*idx)->find_exact(extra0[0], extra0[1], &refs);
  EXPECT_EQ(refs, std::vector<uint64_t>{extra0[2]});
  EXPECT_FALSE((*idx)->signature(make_ref(1, 700), sig.data()).is_ok());  // past the end
}

// An index of format 1 (older kiln: kept documents only, no .kept files) is read as such.
TEST_F(DedupIndexTest, ReadsFormatOne) {
  std::mt19937_64 rng(7);
  nlohmann::json run = write_run(0, 0, 0, 300, rng, /*removed=*/false);
  run.erase("kept");
  std::filesystem::remove(tmp_.str() + "/dedup/index/seg-000000/run-00000.kept");
  nlohmann::json segments = nlohmann::json::array();
  segments.push_back({{"name", "seg-000000"}, {"docs", 300}, {"runs", {run}}});
  nlohmann::json meta = make_index_meta(settings_, {}, segments);
  meta["format"] = "kiln-dedup-index/1";
  ASSERT_TRUE(write_file_atomic(tmp_.str() + "/dedup/index/index.json", meta.dump()).is_ok());
  auto idx = DedupIndex::open(tmp_.str());
  ASSERT_TRUE(idx.is_ok()) << idx.status().to_string();
  EXPECT_EQ((*idx)->kept_docs(), 300u);
  for (const Doc& d : docs_) {
    auto kept = (*idx)->kept_ref(d.ref);
    ASSERT_TRUE(kept.is_ok());
    EXPECT_EQ(*kept, d.ref);
  }
  // Appended to by this kiln: a format-2 segment after the format-1 one (read run by run).
  nlohmann::json run1 = write_run(1, 0, 0, 100, rng);
  segments.push_back({{"name", "seg-000001"}, {"docs", 100}, {"runs", {run1}}});
  meta = make_index_meta(settings_, {}, segments);
  ASSERT_TRUE(write_file_atomic(tmp_.str() + "/dedup/index/index.json", meta.dump()).is_ok());
  auto mixed = DedupIndex::open(tmp_.str());
  ASSERT_TRUE(mixed.is_ok()) << mixed.status().to_string();
  EXPECT_EQ((*mixed)->kept_docs(), 300u + 80u);
  EXPECT_EQ((*mixed)->entries(), 400u);
  EXPECT_TRUE((*mixed)->check_links().is_ok());
  auto link = (*mixed)->kept_ref(make_ref(1, 4));
  ASSERT_TRUE(link.is_ok());
  EXPECT_EQ(*link, make_ref(1, 0));
  meta["format"] = "kiln-dedup-index/9";
  ASSERT_TRUE(write_file_atomic(tmp_.str() + "/dedup/index/index.json", meta.dump()).is_ok());
  auto future = DedupIndex::open(tmp_.str());
  ASSERT_FALSE(future.is_ok());
  EXPECT_NE(future.status().message().find("kiln-dedup-index/9"), std::string::npos);
}

TEST_F(DedupIndexTest, DamageAndMissingIndexAreNamed) {
  auto none = DedupIndex::open(tmp_.str());
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("no dedup index"), std::string::npos);
  std::mt19937_64 rng(6);
  nlohmann::json segments = nlohmann::json::array();
  segments.push_back(
      {{"name", "seg-000000"}, {"docs", 50}, {"runs", {write_run(0, 0, 0, 50, rng)}}});
  write_meta(segments);
  ASSERT_TRUE(DedupIndex::open(tmp_.str()).is_ok());
  std::filesystem::resize_file(tmp_.str() + "/dedup/index/seg-000000/run-00000.sigs", 100);
  auto damaged = DedupIndex::open(tmp_.str());
  ASSERT_FALSE(damaged.is_ok());
  EXPECT_NE(damaged.status().to_string().find("run-00000"), std::string::npos);
}

// check_links (kiln inspect --verify): every removed entry links to a kept one.
TEST_F(DedupIndexTest, LinksAreChecked) {
  std::mt19937_64 rng(8);
  nlohmann::json segments = nlohmann::json::array();
  segments.push_back(
      {{"name", "seg-000000"}, {"docs", 40}, {"runs", {write_run(0, 0, 0, 40, rng)}}});
  write_meta(segments);
  {
    auto idx = DedupIndex::open(tmp_.str());
    ASSERT_TRUE(idx.is_ok()) << idx.status().to_string();
    EXPECT_TRUE((*idx)->check_links().is_ok());
  }
  // Entry 14 (removed) now links to entry 9, itself a removed one.
  const std::string kept_file = tmp_.str() + "/dedup/index/seg-000000/run-00000.kept";
  std::string bytes = read_file(kept_file).value();
  const uint64_t nine = make_ref(0, 9);
  std::memcpy(bytes.data() + 8 * 14, &nine, 8);
  ASSERT_TRUE(write_file_atomic(kept_file, bytes).is_ok());
  auto idx = DedupIndex::open(tmp_.str());
  ASSERT_TRUE(idx.is_ok());
  Status st = (*idx)->check_links();
  EXPECT_EQ(st.code(), StatusCode::kData);
  EXPECT_NE(st.to_string().find("not a kept document"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find("run-00000.kept"), std::string::npos) << st.to_string();
}

TEST(DedupSettingsTest, CheckSameNamesTheSetting) {
  DedupSettings a, b;
  a.bands = b.bands = 16;
  a.rows = b.rows = 8;
  EXPECT_TRUE(a.check_same(b, "A").is_ok());
  b.num_perm = 64;
  Status st = a.check_same(b, "A");
  EXPECT_EQ(st.code(), StatusCode::kUsage);
  EXPECT_NE(st.message().find("dedup.num_perm"), std::string::npos);
  EXPECT_NE(st.message().find("128"), std::string::npos);
  b = a;
  b.normalisation = "other/2";
  EXPECT_NE(a.check_same(b, "A").message().find("normalisation"), std::string::npos);
  b = a;
  b.threshold = 0.7;
  EXPECT_NE(a.check_same(b, "A").message().find("dedup.threshold"), std::string::npos);
  auto round = DedupSettings::from_json(a.to_json(), "x");
  ASSERT_TRUE(round.is_ok());
  EXPECT_TRUE(round->check_same(a, "A").is_ok());
}

}  // namespace
}  // namespace kiln::prep
