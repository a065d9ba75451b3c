// `kiln stream`: the JSON-lines contract, ranks, weights, state in/out (incl. a world-size change)
// and exit codes, run through the real binary.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/atomic_file.h"
#include "loader/stream.h"
#include "tests/kiln_cli.h"
#include "tests/loader/loader_testutil.h"

namespace kiln::loader {
namespace {

using nlohmann::json;
using testing::Dataset;
using testing::DatasetSpec;

const Dataset& dataset() {
  static const Dataset* ds = [] {
    DatasetSpec spec;
    spec.domains = {{"alpha", 47, 10, 0, 30}, {"beta", 23, 4, 0, 30}};
    auto r = testing::make_dataset(testing::test_tmpdir("stream"), spec);
    KILN_CHECK(r.is_ok(), r.status().to_string());
    return new Dataset(std::move(r).value());
  }();
  return *ds;
}

using testing_cli::CliRun;

CliRun kiln(const std::string& args) { return testing_cli::run_kiln(args); }

std::vector<json> lines(const std::string& text) {
  std::vector<json> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(json::parse(text.substr(at, nl - at)));
    at = nl + 1;
  }
  return out;
}

const std::string kCommon = " --seq-len 7 --micro-batch 4 --seed 5 ";

TEST(KilnStream, PrintsOneLinePerSequenceWithTheDocumentIds) {
  const Dataset& ds = dataset();
  std::map<std::string, std::string> domain_of;  // raw JSON id -> domain
  for (const auto& [key, doc] : ds.docs) domain_of[doc.id] = doc.domain;
  std::vector<std::vector<json>> ranks;
  for (int r = 0; r < 3; ++r) {
    CliRun run = kiln("stream " + ds.dir + " --world 3 --rank " + std::to_string(r) +
                      " --steps 12" + kCommon + "--weights alpha=3,beta=1");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    ranks.push_back(lines(run.out));
    ASSERT_EQ(ranks.back().size(), 48u);
  }
  std::set<std::string> seen_ids;
  for (size_t i = 0; i < 48; ++i) {
    for (int r = 0; r < 3; ++r) {
      const json& l = ranks[r][i];
      ASSERT_EQ(l.size(), 5u) << l.dump();
      EXPECT_EQ(l["step"], static_cast<int>(i / 4));
      EXPECT_EQ(l["row"], static_cast<int>(r * 4 + i % 4));  // rank r: rows [4r, 4r + 4)
      EXPECT_EQ(l["rank"], r);
      ASSERT_TRUE(l["samples"].is_array());
      ASSERT_FALSE(l["samples"].empty());
      for (const json& id : l["samples"]) {
        ASSERT_TRUE(domain_of.count(id.dump())) << id.dump();
        EXPECT_EQ(domain_of[id.dump()], l["domain"]);
        seen_ids.insert(id.dump());
      }
    }
  }
  EXPECT_GT(seen_ids.size(), 40u);
}

TEST(KilnStream, NumericIdsStayNumbers) {
  DatasetSpec spec;
  spec.domains = {{"n", 12, 5, 1, 5}};
  spec.numeric_ids = true;
  auto ds = testing::make_dataset(testing::test_tmpdir("numeric"), spec);
  ASSERT_TRUE(ds.is_ok());
  CliRun run = kiln("stream " + ds->dir + "/manifest.json --steps 2" + kCommon);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  for (const json& l : lines(run.out)) {
    for (const json& id : l["samples"]) EXPECT_TRUE(id.is_number_integer()) << l.dump();
  }
}

TEST(KilnStream, StateOutThenStateInContinuesExactly) {
  const Dataset& ds = dataset();
  const std::string dir = testing::test_tmpdir("streamstate");
  std::filesystem::create_directories(dir);
  const std::string w = " --weights alpha=1,beta=1";
  CliRun full = kiln("stream " + ds.dir + " --world 2 --rank 1 --steps 30" + kCommon + w);
  ASSERT_EQ(full.exit_code, 0) << full.err;
  CliRun first = kiln("stream " + ds.dir + " --world 2 --rank 1 --steps 18" + kCommon + w +
                      " --state-out " + dir + "/s-{rank}.json");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_TRUE(std::filesystem::exists(dir + "/s-1.json"));
  CliRun rest = kiln("stream " + ds.dir + " --world 2 --rank 1 --steps 12" + kCommon +
                     " --state-in " + dir + "/s-1.json");
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_EQ(first.out + rest.out, full.out);

  // A new weight on resume is applied from the next step (and the state's are replaced).
  CliRun reweighted = kiln("stream " + ds.dir + " --world 2 --rank 1 --steps 12" + kCommon +
                           " --weights beta=1 --state-in " + dir + "/s-1.json");
  ASSERT_EQ(reweighted.exit_code, 0) << reweighted.err;
  for (const json& l : lines(reweighted.out)) EXPECT_EQ(l["domain"], "beta");
}

TEST(KilnStream, WorldSizeChangeFromAllRanksStates) {
  const Dataset& ds = dataset();
  const std::string dir = testing::test_tmpdir("streamworld");
  std::filesystem::create_directories(dir);
  std::string states;
  std::multiset<std::string> before;
  for (int r = 0; r < 4; ++r) {
    CliRun run = kiln("stream " + ds.dir + " --world 4 --rank " + std::to_string(r) + " --steps 3" +
                      kCommon + "--state-out " + dir + "/s-{rank}.json");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    states += " " + dir + "/s-" + std::to_string(r) + ".json";
  }
  // Restoring with --world 2 from one rank's state is refused; from all four it works.
  CliRun one = kiln("stream " + ds.dir + " --world 2 --rank 0 --steps 1 --global-batch 16" +
                    kCommon + "--state-in " + dir + "/s-0.json");
  EXPECT_EQ(one.exit_code, 2) << one.err;
  EXPECT_NE(one.err.find("merged states of all ranks"), std::string::npos) << one.err;
  // Another global batch (8 instead of 16) is refused unless --repartition.
  CliRun other =
      kiln("stream " + ds.dir + " --world 2 --rank 0 --steps 1" + kCommon + "--state-in" + states);
  EXPECT_EQ(other.exit_code, 2) << other.err;
  EXPECT_NE(other.err.find("--repartition"), std::string::npos) << other.err;
  // The same global batch of 16 on 2 ranks (micro-batch 4, accumulation 2) and on 1 rank
  // continues with exactly the rows the 4-rank run would have read next.
  std::map<std::pair<int, int>, json> want, got2, got1;
  for (int r = 0; r < 4; ++r) {
    CliRun run = kiln("stream " + ds.dir + " --world 4 --rank " + std::to_string(r) + " --steps 5" +
                      kCommon);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    for (const json& l : lines(run.out)) {
      if (l["step"] >= 3) want[{l["step"], l["row"]}] = l["samples"];
    }
  }
  for (int r = 0; r < 2; ++r) {
    CliRun run = kiln("stream " + ds.dir + " --world 2 --rank " + std::to_string(r) +
                      " --steps 4 --global-batch 16" + kCommon + "--state-in" + states);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto ls = lines(run.out);
    ASSERT_EQ(ls.size(), 16u);
    EXPECT_EQ(ls.front()["step"], 3);
    EXPECT_EQ(ls.front()["rank"], r);
    for (const json& l : ls) got2[{l["step"], l["row"]}] = l["samples"];
  }
  EXPECT_EQ(got2, want);
  CliRun single = kiln("stream " + ds.dir + " --world 1 --steps 2 --global-batch 16" +
                       std::string(" --seq-len 7 --seed 5 --state-in") + states);
  ASSERT_EQ(single.exit_code, 0) << single.err;
  for (const json& l : lines(single.out)) got1[{l["step"], l["row"]}] = l["samples"];
  EXPECT_EQ(got1, want);
  // With --repartition the other global batch continues (in another order).
  CliRun re = kiln("stream " + ds.dir + " --world 2 --rank 1 --steps 2 --repartition" + kCommon +
                   "--state-in" + states);
  EXPECT_EQ(re.exit_code, 0) << re.err;
}

TEST(KilnStream, ErrorsAndExitCodes) {
  const Dataset& ds = dataset();
  CliRun r = kiln("stream " + ds.dir + " --steps 1 --weights alpha");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--weights"), std::string::npos) << r.err;
  r = kiln("stream " + ds.dir + " --steps 1 --weights alpha=-1");
  EXPECT_EQ(r.exit_code, 2);
  r = kiln("stream " + ds.dir + " --steps 1 --weights alpah=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'alpha'"), std::string::npos) << r.err;
  r = kiln("stream " + ds.dir + " --steps 1 --world 2 --rank 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--rank"), std::string::npos) << r.err;
  r = kiln("stream " + ds.dir);
  EXPECT_EQ(r.exit_code, 2);  // --steps is required
  r = kiln("stream " + testing::test_tmpdir("nonexistent") + " --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 3);
}

}  // namespace
}  // namespace kiln::loader
