// Collectives, groups and byte counters: one binary, run alone (the 1-rank local backend) and by
// tests/comm/comm_mpi.cmake under `mpirun -np 2/3/4`. Every check uses data whose result is exactly
// predictable on every rank (nccl-tests' "verifiable" style): floating-point sums are compared
// bit for bit with the rank-order sum computed locally.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "comm/comm.h"
#include "comm/nccl.h"
#include "comm/topology.h"
#include "comm/watchdog.h"

namespace kiln::comm {
namespace {

// Rank r's value at index i: non-integer, so the summation order shows in the low bits.
float value(int r, size_t i) {
  return 0.1f * static_cast<float>(r + 1) + 1e-3f * static_cast<float>(i) + 1.0f / 3.0f;
}

std::vector<float> rank_order_sum(int n, size_t count) {
  std::vector<float> s(count);
  for (size_t i = 0; i < count; ++i) {
    float acc = value(0, i);
    for (int r = 1; r < n; ++r) acc += value(r, i);
    s[i] = acc;
  }
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp of an empty vector's null data() is undefined behaviour: UBSan, count 0 below.)
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(CommMpi, AllreduceFloatSumIsRankOrderedAndBitIdentical) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{1000}, size_t{4099}}) {
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = value(me, i);
    ASSERT_TRUE(g.allreduce(x.data(), count, DType::kFloat32, ReduceOp::kSum).is_ok());
    EXPECT_TRUE(same_bits(x, rank_order_sum(n, count))) << "count " << count;
    // Every rank holds the same bits.
    std::vector<float> all(count * n);
    ASSERT_TRUE(g.allgather(x.data(), count * sizeof(float), all.data()).is_ok());
    for (int r = 0; r < n && count > 0; ++r)  // (count 0: data() may be null, see same_bits)
      EXPECT_EQ(0, std::memcmp(all.data() + r * count, x.data(), count * sizeof(float)));
  }
}

TEST(CommMpi, AllreduceIntegersAndMinMax) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  std::vector<int64_t> v = {me, 10 * me + 1, -me};
  ASSERT_TRUE(allreduce(g, v.data(), v.size(), ReduceOp::kSum).is_ok());
  EXPECT_EQ(v[0], n * (n - 1) / 2);
  EXPECT_EQ(v[1], 10 * n * (n - 1) / 2 + n);
  auto mx = allreduce_value<double>(g, 1.5 * me, ReduceOp::kMax);
  auto mn = allreduce_value<int32_t>(g, 7 - me, ReduceOp::kMin);
  ASSERT_TRUE(mx.is_ok() && mn.is_ok());
  EXPECT_EQ(*mx, 1.5 * (n - 1));
  EXPECT_EQ(*mn, 7 - (n - 1));
}

TEST(CommMpi, ReduceScatterSumsEachBlockInRankOrder) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  for (size_t rc : {size_t{1}, size_t{5}, size_t{333}}) {
    std::vector<float> send(rc * n), recv(rc);
    for (size_t i = 0; i < send.size(); ++i) send[i] = value(me, i);
    ASSERT_TRUE(
        g.reduce_scatter(send.data(), recv.data(), rc, DType::kFloat32, ReduceOp::kSum).is_ok());
    const std::vector<float> full = rank_order_sum(n, rc * n);
    std::vector<float> mine(full.begin() + me * rc, full.begin() + (me + 1) * rc);
    EXPECT_TRUE(same_bits(recv, mine)) << "recv_count " << rc;
  }
}

TEST(CommMpi, AllgatherInPlaceBroadcastBarrier) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  std::vector<int32_t> buf(3 * n, -1);
  for (int k = 0; k < 3; ++k) buf[me * 3 + k] = 100 * me + k;
  ASSERT_TRUE(g.allgather(buf.data() + me * 3, 3 * sizeof(int32_t), buf.data()).is_ok());
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(buf[r * 3 + k], 100 * r + k);
  for (int root = 0; root < n; ++root) {
    std::string s = me == root ? "from " + std::to_string(root) : std::string();
    ASSERT_TRUE(bcast_string(g, &s, root).is_ok());
    EXPECT_EQ(s, "from " + std::to_string(root));
  }
  EXPECT_TRUE(g.barrier().is_ok());
}

TEST(CommMpi, AsyncHandlesMatchBlockingResults) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const size_t count = 257;
  std::vector<float> a(count), rs_send(count * n), rs_recv(count), ag(count * n);
  std::vector<double> ints(5);
  for (size_t i = 0; i < count; ++i) a[i] = value(me, i);
  for (size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = value(me, i);
  for (size_t i = 0; i < count; ++i) ag[me * count + i] = value(me, i);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<double>(me * 10 + i);
  int64_t token = me == n - 1 ? 4242 : 0;
  // Several in flight at once, completed in start order.
  auto w1 = g.iallreduce(a.data(), count, DType::kFloat32, ReduceOp::kSum);
  auto w2 =
      g.ireduce_scatter(rs_send.data(), rs_recv.data(), count, DType::kFloat32, ReduceOp::kSum);
  auto w3 = g.iallgather(ag.data() + me * count, count * sizeof(float), ag.data());
  auto w4 = g.iallreduce(ints.data(), ints.size(), DType::kFloat64, ReduceOp::kMax);
  auto w5 = g.ibcast(&token, sizeof(token), n - 1);
  auto w6 = g.ibarrier();
  while (!w1->test()) {
  }
  for (auto* w : {w1.get(), w2.get(), w3.get(), w4.get(), w5.get(), w6.get()})
    ASSERT_TRUE(w->wait().is_ok());
  EXPECT_TRUE(w1->wait().is_ok());  // idempotent
  EXPECT_TRUE(same_bits(a, rank_order_sum(n, count)));
  const std::vector<float> full = rank_order_sum(n, count * n);
  EXPECT_TRUE(same_bits(
      rs_recv, std::vector<float>(full.begin() + me * count, full.begin() + (me + 1) * count)));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(ag[r * count + i], value(r, i));
  for (size_t i = 0; i < ints.size(); ++i) EXPECT_EQ(ints[i], (n - 1) * 10.0 + i);
  EXPECT_EQ(token, 4242);
}

TEST(CommMpi, ByteCountersFollowTheDocumentedFormulas) {
  ProcessGroup& g = world();
  const int n = g.size();
  g.reset_counters();
  std::vector<float> x(100, 1.0f), big(100 * n), small(100);
  ASSERT_TRUE(g.allreduce(x.data(), 100, DType::kFloat32, ReduceOp::kSum).is_ok());
  ASSERT_TRUE(g.allreduce(x.data(), 50, DType::kFloat32, ReduceOp::kSum).is_ok());
  ASSERT_TRUE(
      g.reduce_scatter(big.data(), small.data(), 100, DType::kFloat32, ReduceOp::kSum).is_ok());
  ASSERT_TRUE(g.allgather(small.data(), 400, big.data()).is_ok());
  ASSERT_TRUE(g.iallgather(small.data(), 400, big.data())->wait().is_ok());
  ASSERT_TRUE(g.bcast(x.data(), 64, 0).is_ok());
  const CommCounters& c = g.counters();
  if (n == 1) {  // nothing moves in a one-rank group
    EXPECT_TRUE(c.empty());
    return;
  }
  EXPECT_EQ(c.at("all_reduce").calls, 2u);
  EXPECT_EQ(c.at("all_reduce").bytes, 2u * 150 * 4);
  EXPECT_EQ(c.at("reduce_scatter").bytes, 400u * n);
  EXPECT_EQ(c.at("all_gather").calls, 2u);
  EXPECT_EQ(c.at("all_gather").bytes, 2u * 400 * n);
  EXPECT_EQ(c.at("broadcast").bytes, 64u);
}

TEST(CommMpi, TopologyPutsTensorParallelRanksSideBySide) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int tp = n % 2 == 0 ? 2 : 1;
  auto t = make_topology(g, TopologyOptions{tp, false, 0});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->tp_size, tp);
  EXPECT_EQ(t->dp_size, n / tp);
  EXPECT_EQ(t->tp->size(), tp);
  EXPECT_EQ(t->tp->rank(), me % tp);
  EXPECT_EQ(t->dp->rank(), me / tp);
  EXPECT_EQ(t->tp->name(), "tp");
  EXPECT_EQ(t->dp->name(), "dp");
  // The TP group holds ranks me - me % tp ... (adjacent): sum of world ranks is known.
  auto s = allreduce_value<int32_t>(*t->tp, me, ReduceOp::kSum);
  ASSERT_TRUE(s.is_ok());
  const int first = me - me % tp;
  EXPECT_EQ(*s, tp * first + tp * (tp - 1) / 2);
  // The DP group holds ranks with the same me % tp.
  auto d = allreduce_value<int32_t>(*t->dp, me, ReduceOp::kSum);
  ASSERT_TRUE(d.is_ok());
  int expect = 0;
  for (int r = me % tp; r < n; r += tp) expect += r;
  EXPECT_EQ(*d, expect);
  if (n > 1) {
    auto bad = make_topology(g, TopologyOptions{n + 1, false, 0});
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().key(), "parallel.tp");
  }
}

TEST(CommMpi, HierarchicalAllreduceMatchesFlatAndSplitsTheBytes) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int node = n % 2 == 0 ? 2 : 1;  // a declared node size: "machines" of `node` ranks
  auto t = make_topology(g, TopologyOptions{1, true, node});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const ProcessGroup* intra = intra_node_group(*t->dp);
  const ProcessGroup* inter = inter_node_group(*t->dp);
  ASSERT_NE(intra, nullptr);
  ASSERT_NE(inter, nullptr);
  EXPECT_EQ(intra->size(), node);
  EXPECT_EQ(inter->size(), n / node);
  EXPECT_EQ(t->groups().size(), 5u);  // world, dp, dp.intra_node, dp.inter_node, tp
  // Integer-valued floats: every order gives the exact sum, so it must equal the flat result.
  const size_t count = 1001;
  std::vector<float> h(count), f(count);
  for (size_t i = 0; i < count; ++i) h[i] = f[i] = static_cast<float>((me + 1) * (i % 97));
  ASSERT_TRUE(t->dp->allreduce(h.data(), count, DType::kFloat32, ReduceOp::kSum).is_ok());
  ASSERT_TRUE(g.allreduce(f.data(), count, DType::kFloat32, ReduceOp::kSum).is_ok());
  EXPECT_EQ(h, f);
  if (n == 1) return;
  // Bytes: the logical all-reduce on the dp group; a reduce-scatter and an all-gather of the
  // (padded) buffer inside the node; an all-reduce of one shard across nodes.
  const size_t block = (count + node - 1) / node;
  EXPECT_EQ(t->dp->counters().at("all_reduce").bytes, 2u * count * 4);
  if (node > 1) {
    EXPECT_EQ(intra->counters().at("reduce_scatter").bytes, block * node * 4);
    EXPECT_EQ(intra->counters().at("all_gather").bytes, block * node * 4);
  }
  if (n / node > 1) {
    EXPECT_EQ(inter->counters().at("all_reduce").bytes, 2u * block * 4);
  }
}

TEST(CommMpi, AgreeNamesTheFailingRank) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  Status local = me == n - 1 ? Status::data("bad batch") : Status::ok();
  Status agreed = agree(g, local);
  ASSERT_FALSE(agreed.is_ok());
  if (me != n - 1 && n > 1) {
    EXPECT_NE(agreed.to_string().find("rank " + std::to_string(n - 1) + " failed"),
              std::string::npos)
        << agreed.to_string();
  }
}

// The collective watchdog's records (comm/watchdog.h): an asynchronous collective is outstanding
// until its handle completes, a blocking one until it returns; what a rank answers names them.
TEST(CommMpi, WatchdogRecordsOutstandingCollectives) {
  ProcessGroup& g = world();
  const std::string key = "world/" + std::string(g.backend());
  // NaN passed `timeout_s <= 0` and every comparison after it: a thread that spun, never firing.
  for (double bad : {std::nan(""), -1.0, HUGE_VAL}) {
    const Status st = start_watchdog(g, bad, "--collective-timeout");
    EXPECT_EQ(st.code(), StatusCode::kUsage) << bad;
    EXPECT_NE(st.message().find("--collective-timeout"), std::string::npos) << st.to_string();
  }
  ASSERT_TRUE(start_watchdog(g, 600).is_ok());
  EXPECT_EQ(watchdog_timeout_s(), 600);
  set_watchdog_context("step 7");
  std::vector<float> a(64, 1.0f);
  auto w = g.iallreduce(a.data(), a.size(), DType::kFloat32, ReduceOp::kSum);
  const std::string during = detail::watchdog_answer(key);
  const uint64_t n = std::stoull(during.substr(0, during.find('\n')));
  EXPECT_NE(during.find("at step 7; in all_reduce #" + std::to_string(n) + " on world for "),
            std::string::npos)
      << during;
  ASSERT_TRUE(w->wait().is_ok());
  const std::string after = detail::watchdog_answer(key);
  EXPECT_NE(after.find("in no collective for"), std::string::npos) << after;
  EXPECT_NE(after.find("the last one it completed: all_reduce #" + std::to_string(n) + " on world"),
            std::string::npos)
      << after;
  ASSERT_TRUE(g.barrier().is_ok());
  EXPECT_EQ(detail::watchdog_answer(key).substr(0, after.find('\n')), std::to_string(n + 1));
  EXPECT_EQ(detail::watchdog_answer("no-such-group/mpi").substr(0, 2), "0\n");
  stop_watchdog();
  // Not watched any more: nothing is recorded.
  ASSERT_TRUE(g.barrier().is_ok());
  EXPECT_NE(detail::watchdog_answer(key).find("barrier #" + std::to_string(n + 1)),
            std::string::npos);
}

// The watchdog threads' channel: every rank asks every other rank at once (each serves while it
// waits) and gets each one's own answer.
TEST(CommMpi, WatchdogLinkAnswersEveryAsker) {
  ProcessGroup& g = world();
  if (g.size() == 1) GTEST_SKIP() << "one process: nobody to ask";
  auto link = g.open_watchdog_link();
  ASSERT_TRUE(link.is_ok()) << link.status().to_string();
  ASSERT_NE(link.value(), nullptr) << "this MPI does not provide MPI_THREAD_MULTIPLE";
  std::vector<int> peers;
  for (int r = 0; r < g.size(); ++r)
    if (r != g.rank()) peers.push_back(r);
  const int me = g.rank();
  auto answer = [me](const std::string& q) { return "rank " + std::to_string(me) + " on " + q; };
  auto got = link.value()->ask(peers, "dp/mpi", 60.0, answer);
  ASSERT_EQ(got.size(), peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << "rank " << peers[i] << " did not answer";
    EXPECT_EQ(*got[i], "rank " + std::to_string(peers[i]) + " on dp/mpi");
  }
  // Others may still be asking this rank: keep answering until every rank has its answers.
  auto done = g.ibarrier();
  while (!done->test()) link.value()->serve(answer);
  ASSERT_TRUE(done->wait().is_ok());
}

TEST(CommMpi, NcclBackendIsBuiltOrSaysWhy) {
  if (nccl_available()) GTEST_SKIP() << "NCCL backend built; exercised only where GPUs exist";
  auto g = make_nccl_group(world(), 0);
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace kiln::comm
