// Multi-rank prep: one binary, run by tests/dataprep/prep_mpi.cmake under `mpirun -np 1/2/3` (and,
// alone, as a 1-rank test). Rank 0 makes a corpus and a single-process reference run; then every
// rank runs prep together; the kept set, removed list, stats and per-sample contents must equal the
// reference exactly. Incremental prep too: B --against A and --append B to A under mpirun
// remove what one process removes.
#include <gtest/gtest.h>

#include "comm/comm.h"
#include "dataprep/append.h"
#include "dataprep/dedup/dedup_index.h"
#include "dataprep/inspect.h"
#include "dataprep/prep.h"
#include "format/manifest.h"
#include "format/shard_reader.h"
#include "tests/dataprep/prep_test_util.h"

namespace kiln::prep {
namespace {
using namespace testing_prep;

// key -> txt + json of every sample in a dataset.
std::map<std::string, std::string> samples_of(const std::string& out) {
  std::map<std::string, std::string> all;
  auto m = read_manifest(out);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return all;
  for (const auto& s : m->shards) {
    auto rows = ShardReader::read_all(m->shard_path(s));
    EXPECT_TRUE(rows.is_ok()) << rows.status().to_string();
    if (!rows.is_ok()) continue;
    for (const auto& smp : *rows) {
      std::string v = s.domain + "|";
      for (const auto& mem : smp.members) v += mem.ext + "=" + mem.data + "|";
      EXPECT_TRUE(all.emplace(smp.key, v).second) << "duplicate key " << smp.key;
    }
  }
  return all;
}

nlohmann::json stats_without_run_details(const std::string& out) {
  auto j = nlohmann::json::parse(read_text(out + "/stats.json"));
  j.erase("timings_s");
  j.erase("cpu_s");
  j.erase("ranks");
  return j;
}

TEST(PrepMpi, KeptSetEqualsSingleProcess) {
  comm::ProcessGroup& world = comm::world();
  std::unique_ptr<TempDir> tmp;
  std::string dir;
  if (world.rank() == 0) {
    tmp = std::make_unique<TempDir>("prep_mpi");
    dir = tmp->str();
    CorpusGen gen(77);
    auto docs = gen.make(260, 0.3, {0.0, 0.005, 0.01, 0.02, 0.05, 0.2}, 3);
    write_corpus(docs, dir + "/in", 7);
    write_file(dir + "/in/zz-bad.jsonl", "{broken\n{\"text\": \"\"}\n");
    write_file(dir + "/in/texts/a.txt", docs[0].text);  // a copy as a text-folder document
    auto ref = run_prep(prep_config({"input.paths=[\"" + dir + "/in\"]",
                                     "output=\"" + dir + "/ref\"", "tokenizer.path=none",
                                     "input.max_reject_fraction=1", "shards.max_samples=40"}),
                        *comm::make_local_group());
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  }
  ASSERT_TRUE(comm::bcast_string(world, &dir, 0).is_ok());
  auto r = run_prep(prep_config({"input.paths=[\"" + dir + "/in\"]", "output=\"" + dir + "/mpi\"",
                                 "tokenizer.path=none", "input.max_reject_fraction=1",
                                 "shards.max_samples=40", "memory=1M"}),
                    world);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE(world.barrier().is_ok());
  if (world.rank() == 0) {
    EXPECT_EQ(read_text(dir + "/mpi/dedup/removed.jsonl"),
              read_text(dir + "/ref/dedup/removed.jsonl"));
    EXPECT_EQ(stats_without_run_details(dir + "/mpi"), stats_without_run_details(dir + "/ref"));
    auto a = samples_of(dir + "/mpi"), b = samples_of(dir + "/ref");
    EXPECT_EQ(a.size(), b.size());
    EXPECT_TRUE(a == b) << "the kept samples differ from the single-process run";
    // Every rank's rejects together equal the reference's.
    std::string rejects;
    for (int rk = 0; rk < world.size(); ++rk) {
      char name[64];
      std::snprintf(name, sizeof name, "/mpi/rejects/rejects-%05d.jsonl", rk);
      rejects += read_text(dir + name);
    }
    EXPECT_EQ(rejects, read_text(dir + "/ref/rejects/rejects-00000.jsonl"));
    std::printf("ranks %d: %llu in, %llu out, %llu exact, %llu near, %llu rejected\n", world.size(),
                (unsigned long long)r->docs_in, (unsigned long long)r->docs_out,
                (unsigned long long)r->exact_dups, (unsigned long long)r->near_dups,
                (unsigned long long)r->rejected);
  }
  ASSERT_TRUE(world.barrier().is_ok());
}

// A prepared by all ranks (an index with one run per rank), then B --against it and --append B
// to it by all ranks: removed.jsonl equals the single-process runs' (A, B --against A, append),
// the appended index covers the dataset. The corpus has chains through documents A removed whose
// kept document another rank holds (index links resolved across ranks).
TEST(PrepMpi, AgainstAndAppendEqualSingleProcess) {
  comm::ProcessGroup& world = comm::world();
  std::unique_ptr<TempDir> tmp;
  std::string dir;
  const std::vector<std::string> common = {"input.max_reject_fraction=1", "shards.max_samples=40"};
  auto config = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), common.begin(), common.end());
    return prep_config(sets);
  };
  auto in = [&](const std::string& part) { return "input.paths=[\"" + dir + "/" + part + "\"]"; };
  if (world.rank() == 0) {
    tmp = std::make_unique<TempDir>("prep_mpi_incr");
    dir = tmp->str();
    CorpusGen gen(91);
    auto docs = gen.make(240, 0.2, {0.0, 0.01, 0.02, 0.05, 0.2}, 3);
    const size_t n_a = docs.size() * 3 / 4;
    write_corpus({docs.begin(), docs.begin() + n_a}, dir + "/A", 6);
    write_corpus({docs.begin() + n_a, docs.end()}, dir + "/B", 3);
    // Chains: x in A's first file, x' (a near copy) in its last, x'' (near x', not x) in B.
    std::mt19937_64 rng(4);
    auto change = [&](std::vector<std::string> t, int k) {
      std::uniform_int_distribution<size_t> pos(5, t.size() - 1);
      for (int i = 0; i < k; ++i) t[pos(rng)] = gen.english_tokens(1)[0] + "q";
      return t;
    };
    std::string a0, a1, b0;
    for (int i = 0; i < 20; ++i) {
      auto x = gen.english_tokens(300);
      auto x1 = change(x, 4), x2 = change(x1, 4);
      auto line = [&](const char* p, const std::vector<std::string>& t) {
        std::string id = p;
        id += std::to_string(i);
        return nlohmann::json{{"id", id}, {"text", CorpusGen::join(t, false)}}.dump() + "\n";
      };
      a0 += line("x", x);
      a1 += line("y", x1);
      b0 += line("z", x2);
    }
    write_file(dir + "/A/part-000-chain.jsonl", a0);
    write_file(dir + "/A/part-999-chain.jsonl", a1);
    write_file(dir + "/B/part-000-chain.jsonl", b0);
    auto local_group = comm::make_local_group();
    auto& local = *local_group;
    auto ra =
        run_prep(config({in("A"), "output=\"" + dir + "/refA\"", "tokenizer.path=none"}), local);
    ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
    auto rb = run_prep(config({in("B"), "output=\"" + dir + "/refB\"", "tokenizer.path=none",
                               "dedup.against=[\"" + dir + "/refA\"]"}),
                       local);
    ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
    fs::copy(dir + "/refA", dir + "/refApp", fs::copy_options::recursive);
    auto rp = append_prep(config({in("B")}), dir + "/refApp", local);
    ASSERT_TRUE(rp.is_ok()) << rp.status().to_string();
  }
  ASSERT_TRUE(comm::bcast_string(world, &dir, 0).is_ok());
  auto ma = run_prep(
      config({in("A"), "output=\"" + dir + "/mpiA\"", "tokenizer.path=none", "memory=1M"}), world);
  ASSERT_TRUE(ma.is_ok()) << ma.status().to_string();
  auto mb = run_prep(config({in("B"), "output=\"" + dir + "/mpiB\"", "tokenizer.path=none",
                             "memory=1M", "dedup.against=[\"" + dir + "/mpiA\"]"}),
                     world);
  ASSERT_TRUE(mb.is_ok()) << mb.status().to_string();
  if (world.rank() == 0) fs::copy(dir + "/mpiA", dir + "/mpiApp", fs::copy_options::recursive);
  ASSERT_TRUE(world.barrier().is_ok());
  auto mp = append_prep(config({in("B"), "memory=1M"}), dir + "/mpiApp", world);
  ASSERT_TRUE(mp.is_ok()) << mp.status().to_string();
  ASSERT_TRUE(world.barrier().is_ok());
  if (world.rank() == 0) {
    EXPECT_EQ(read_text(dir + "/mpiA/dedup/removed.jsonl"),
              read_text(dir + "/refA/dedup/removed.jsonl"));
    // kept_dataset names the dataset given to --against: mpiA here, refA there.
    std::string mpi_b = read_text(dir + "/mpiB/dedup/removed.jsonl");
    for (size_t at; (at = mpi_b.find(dir + "/mpiA")) != std::string::npos;)
      mpi_b.replace(at, dir.size() + 5, dir + "/refA");
    const std::string ref_b = read_text(dir + "/refB/dedup/removed.jsonl");
    EXPECT_EQ(mpi_b, ref_b);
    EXPECT_NE(ref_b.find("\"z"), std::string::npos);  // some chain ends were removed
    EXPECT_EQ(read_text(dir + "/mpiApp/dedup/removed.jsonl"),
              read_text(dir + "/refApp/dedup/removed.jsonl"));
    auto ia = DedupIndex::open(dir + "/mpiApp"), ib = DedupIndex::open(dir + "/refApp");
    ASSERT_TRUE(ia.is_ok() && ib.is_ok());
    EXPECT_EQ((*ia)->entries(), (*ib)->entries());
    EXPECT_EQ((*ia)->kept_docs(), (*ib)->kept_docs());
    EXPECT_GT((*ia)->entries(), (*ia)->kept_docs());  // removed documents are entries too
    InspectOptions verify;
    verify.verify = true;
    for (const char* out : {"/mpiApp", "/mpiB", "/refApp"}) {
      auto r = inspect_dataset(dir + out, verify);
      ASSERT_TRUE(r.is_ok()) << out << ": " << r.status().to_string();
      EXPECT_TRUE(r->problems.empty()) << out << ": " << r->problems.front();
    }
  }
  ASSERT_TRUE(world.barrier().is_ok());
}

TEST(PrepMpi, CollectivesMoveWhatTheySay) {
  comm::ProcessGroup& g = comm::world();
  const int n = g.size(), me = g.rank();
  // allreduce
  int64_t v = me + 1;
  ASSERT_TRUE(comm::allreduce(g, &v, 1, comm::ReduceOp::kSum).is_ok());
  EXPECT_EQ(v, int64_t{n} * (n + 1) / 2);
  // allgatherv with rank-dependent sizes
  std::vector<uint64_t> mine(me + 1, static_cast<uint64_t>(me));
  std::vector<size_t> counts;
  auto all = comm::allgatherv(g, mine, &counts);
  ASSERT_TRUE(all.is_ok());
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(counts[r], static_cast<size_t>(r + 1));
    for (int k = 0; k <= r; ++k) EXPECT_EQ((*all)[at++], static_cast<uint64_t>(r));
  }
  // alltoallv: rank r sends (r*100 + d) repeated d+1 times to rank d
  std::vector<std::vector<uint64_t>> per(n);
  for (int d = 0; d < n; ++d) per[d].assign(d + 1, static_cast<uint64_t>(me * 100 + d));
  auto got = comm::alltoallv(g, per, &counts);
  ASSERT_TRUE(got.is_ok());
  at = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(counts[r], static_cast<size_t>(me + 1));
    for (int k = 0; k <= me; ++k) EXPECT_EQ((*got)[at++], static_cast<uint64_t>(r * 100 + me));
  }
  // bcast + gather of strings
  std::string s = me == 0 ? "hello" : "";
  ASSERT_TRUE(comm::bcast_string(g, &s, 0).is_ok());
  EXPECT_EQ(s, "hello");
  auto gathered = comm::gather_strings(g, std::string(me, 'x'), 0);
  ASSERT_TRUE(gathered.is_ok());
  if (me == 0) {
    ASSERT_EQ(gathered->size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) EXPECT_EQ((*gathered)[r], std::string(r, 'x'));
  }
  // agree(): one failing rank makes every rank fail with its code.
  Status local = me == n - 1 ? Status::data("bad input here") : Status::ok();
  Status agreed = comm::agree(g, local);
  EXPECT_FALSE(agreed.is_ok());
  EXPECT_EQ(agreed.exit_code(), 3);
  EXPECT_NE(agreed.message().find("bad input here"), std::string::npos);
  // split: even and odd ranks
  auto sub = g.split(me % 2, me);
  ASSERT_TRUE(sub.is_ok());
  EXPECT_EQ((*sub)->size(), (n + 1 - me % 2) / 2);
  EXPECT_EQ((*sub)->rank(), me / 2);
}

}  // namespace
}  // namespace kiln::prep
