// Point-to-point messages (send / recv / isend / irecv) and the pipeline layout of comm/topology.h:
// one binary, run alone (the 1-rank local backend: messages to itself) and by
// tests/comm/comm_p2p.cmake under `mpirun -np 2/4/8`. Payloads are derived from (sender, message,
// index), so every received byte is checked against what its sender must have sent.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <thread>

#include "comm/comm.h"
#include "comm/topology.h"
#include "comm/watchdog.h"

namespace kiln::comm {
namespace {

// Byte i of message `msg` from world rank `from`.
uint8_t byte_of(int from, int msg, size_t i) {
  return static_cast<uint8_t>((from * 131 + msg * 17 + i * 7 + (i >> 9)) & 0xff);
}

std::vector<uint8_t> payload(int from, int msg, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = byte_of(from, msg, i);
  return v;
}

// The first index where `got` differs from the expected payload, or -1.
long first_wrong(const std::vector<uint8_t>& got, int from, int msg) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != byte_of(from, msg, i)) return static_cast<long>(i);
  return -1;
}

// A ring of blocking sends and receives: even ranks send first, odd ranks receive first (the
// order that cannot deadlock with rendezvous sends), several tags interleaved.
TEST(CommP2p, BlockingRing) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    const auto out = payload(me, static_cast<int>(bytes % 251), bytes);
    std::vector<uint8_t> in(bytes);
    if (me % 2 == 0 || n == 1) {  // (one rank: a message to itself waits for its recv)
      ASSERT_TRUE(g.send(out.data(), bytes, next, 3).is_ok());
      ASSERT_TRUE(g.recv(in.data(), bytes, prev, 3).is_ok());
    } else {
      ASSERT_TRUE(g.recv(in.data(), bytes, prev, 3).is_ok());
      ASSERT_TRUE(g.send(out.data(), bytes, next, 3).is_ok());
    }
    EXPECT_EQ(first_wrong(in, prev, static_cast<int>(bytes % 251)), -1) << bytes << " bytes";
  }
}

// Every rank sends to its next and previous rank and receives from both at once, posting
// everything before waiting (the steady state of a pipeline: activations forward, gradients
// backward), for several rounds whose messages must not mix; tags tell the directions apart.
TEST(CommP2p, IsendIrecvBothWaysAtOnce) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  constexpr int kFwd = 1, kBwd = 2;
  const size_t bytes = (size_t{1} << 20) + 3;  // above any eager limit: rendezvous both ways
  for (int round = 0; round < 3; ++round) {
    const auto fwd = payload(me, 2 * round, bytes), bwd = payload(me, 2 * round + 1, bytes);
    std::vector<uint8_t> from_prev(bytes), from_next(bytes);
    // Sends first, receives second: with blocking sends this order deadlocks.
    auto s1 = g.isend(fwd.data(), bytes, next, kFwd);
    auto s2 = g.isend(bwd.data(), bytes, prev, kBwd);
    auto r1 = g.irecv(from_prev.data(), bytes, prev, kFwd);
    auto r2 = g.irecv(from_next.data(), bytes, next, kBwd);
    // Wait in an order opposite to posting, receives first.
    ASSERT_TRUE(r2->wait().is_ok());
    ASSERT_TRUE(r1->wait().is_ok());
    ASSERT_TRUE(s2->wait().is_ok());
    ASSERT_TRUE(s1->wait().is_ok());
    EXPECT_TRUE(s1->test());  // complete handles stay complete
    EXPECT_EQ(first_wrong(from_prev, prev, 2 * round), -1) << "round " << round;
    EXPECT_EQ(first_wrong(from_next, next, 2 * round + 1), -1) << "round " << round;
  }
}

// A 1F1B schedule over the world as a pipeline (stage = rank): warm-up forwards, then one
// forward and one backward alternately, then cool-down backwards. Each stage receives the
// activation of micro-batch k from the previous stage, adds its stage number and sends it on;
// the last stage turns it into a gradient that flows back the same way. Sends are isend (held
// until the end of the step), receives are posted ahead and waited when needed, the pattern the
// engine uses; the values that arrive show every message matched the right micro-batch.
TEST(CommP2p, OneForwardOneBackwardSchedule) {
  ProcessGroup& g = world();
  const int p = g.size(), s = g.rank();
  if (p == 1) GTEST_SKIP() << "one stage: no messages";
  constexpr int kAct = 10, kGrad = 11;
  const size_t elems = 70000;  // 280 KB per message
  for (int m : {1, p, 2 * p + 1}) {
    std::vector<std::vector<float>> act(m, std::vector<float>(elems));
    std::vector<std::vector<float>> grad(m, std::vector<float>(elems));
    std::vector<std::vector<float>> act_out(m), grad_out(m);
    std::vector<std::unique_ptr<Work>> sends;
    std::map<int, std::unique_ptr<Work>> act_recv, grad_recv;
    auto post_act_recv = [&](int k) {
      if (s > 0 && k < m && !act_recv.count(k))
        act_recv[k] = g.irecv(act[k].data(), elems * sizeof(float), s - 1, kAct);
    };
    auto forward = [&](int k) {
      if (s == 0) {
        for (size_t i = 0; i < elems; ++i) act[k][i] = static_cast<float>(k * 1000 + i % 97);
      } else {
        ASSERT_TRUE(act_recv.at(k)->wait().is_ok());
      }
      post_act_recv(k + 1);  // the next micro-batch's activation, ahead of time
      act_out[k] = act[k];
      for (float& v : act_out[k]) v += static_cast<float>(s);
      if (s < p - 1) {
        sends.push_back(g.isend(act_out[k].data(), elems * sizeof(float), s + 1, kAct));
        grad_recv[k] = g.irecv(grad[k].data(), elems * sizeof(float), s + 1, kGrad);
      }
    };
    auto backward = [&](int k) {
      if (s == p - 1) {
        grad[k] = act_out[k];  // loss gradient: the activation itself
      } else {
        ASSERT_TRUE(grad_recv.at(k)->wait().is_ok());
      }
      grad_out[k] = grad[k];
      for (float& v : grad_out[k]) v *= 2.0f;
      if (s > 0) sends.push_back(g.isend(grad_out[k].data(), elems * sizeof(float), s - 1, kGrad));
    };
    post_act_recv(0);
    const int warmup = std::min(p - s - 1, m);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k < m - warmup; ++k) {
      forward(warmup + k);
      backward(k);
    }
    for (int k = m - warmup; k < m; ++k) backward(k);
    for (auto& w : sends) ASSERT_TRUE(w->wait().is_ok());
    // Stage s's outgoing gradient of micro-batch k: (input + 0 + 1 + ... + (p-1)) * 2^(p-s).
    const float stages = static_cast<float>(p * (p - 1) / 2);
    for (int k = 0; k < m; ++k) {
      for (size_t i = 0; i < elems; i += 997) {
        const float in = static_cast<float>(k * 1000 + i % 97);
        ASSERT_EQ(act_out[k][i], in + static_cast<float>(s * (s + 1) / 2)) << k << " " << i;
        ASSERT_EQ(grad_out[k][i], (in + stages) * static_cast<float>(1 << (p - s)))
            << "micro-batch " << k << " index " << i;
      }
    }
  }
}

// Empty messages are messages (matched in order with the others), and a 64 MiB one arrives whole.
TEST(CommP2p, EmptyAndLargeMessages) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const size_t big = size_t{64} << 20;
  const auto out = payload(me, 5, big);
  std::vector<uint8_t> in(big, 0);
  uint8_t sentinel = 0xab;
  auto r0 = g.irecv(&sentinel, 0, prev, 7);
  auto r1 = g.irecv(in.data(), big, prev, 7);
  auto r2 = g.irecv(nullptr, 0, prev, 7);
  auto s0 = g.isend(nullptr, 0, next, 7);
  auto s1 = g.isend(out.data(), big, next, 7);
  auto s2 = g.isend(&sentinel, 0, next, 7);
  for (auto* w : {&r0, &r1, &r2, &s0, &s1, &s2}) ASSERT_TRUE((*w)->wait().is_ok());
  EXPECT_EQ(sentinel, 0xab);  // a 0-byte recv writes nothing
  EXPECT_EQ(first_wrong(in, prev, 5), -1);
}

TEST(CommP2p, CountersCountBytesByDirectionNotMessagesToItself) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  g.reset_counters();
  std::vector<uint8_t> a(1000), b(1000);
  for (size_t bytes : {size_t{10}, size_t{1000}, size_t{0}}) {
    auto r = g.irecv(b.data(), bytes, prev);
    ASSERT_TRUE(g.isend(a.data(), bytes, next)->wait().is_ok());
    ASSERT_TRUE(r->wait().is_ok());
  }
  ASSERT_TRUE(g.send(a.data(), 100, me, 9).is_ok());  // to itself: a copy, not counted
  ASSERT_TRUE(g.recv(b.data(), 100, me, 9).is_ok());
  const CommCounters& c = g.counters();
  if (n == 1) {  // nothing crosses a link
    EXPECT_TRUE(c.empty());
    return;
  }
  ASSERT_EQ(c.count("send"), 1u);
  ASSERT_EQ(c.count("recv"), 1u);
  EXPECT_EQ(c.at("send").calls, 3u);
  EXPECT_EQ(c.at("send").bytes, 1010u);
  EXPECT_EQ(c.at("recv").calls, 3u);
  EXPECT_EQ(c.at("recv").bytes, 1010u);
  EXPECT_EQ(c.size(), 2u);
}

TEST(CommP2p, BadPeerTagOrSizeIsAnErrorNamingIt) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  char buf[16] = {};
  g.reset_counters();
  Status st = g.send(buf, 4, n, 0);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("send to rank " + std::to_string(n) + " (tag 0) on group world"),
            std::string::npos)
      << st.to_string();
  EXPECT_NE(st.message().find("not in the group"), std::string::npos) << st.to_string();
  EXPECT_FALSE(g.irecv(buf, 4, -1)->wait().is_ok());
  st = g.isend(buf, 4, me, 40000)->wait();
  EXPECT_NE(st.message().find("tag must be 0..32767"), std::string::npos) << st.to_string();
  EXPECT_EQ(g.counters().count("send"), 0u);  // refused calls count nothing
  if (n == 1) return;
  // Rank 0 sends 8 bytes; rank 1 expects 16: an error naming the peer and both sizes.
  if (me == 0) {
    ASSERT_TRUE(g.send(buf, 8, 1, 5).is_ok());
  }
  if (me == 1) {
    st = g.recv(buf, 16, 0, 5);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("recv from rank 0 (tag 5) on group world"), std::string::npos)
        << st.to_string();
    EXPECT_NE(st.message().find("received 8 bytes where 16 were expected"), std::string::npos)
        << st.to_string();
  }
  ASSERT_TRUE(g.barrier().is_ok());
}

// Messages to itself (the local backend's only peer; MPI groups too): a copy that waits for its
// recv, in order per tag; a recv posted first completes when the send comes.
TEST(CommP2p, MessagesToItselfAreCopies) {
  for (bool local : {true, false}) {
    std::unique_ptr<ProcessGroup> own = make_local_group();
    ProcessGroup& g = local ? *own : world();
    const int me = g.rank();
    const auto a = payload(me, 1, 300), b = payload(me, 2, 300);
    std::vector<uint8_t> x(300), y(300), z(300);
    auto early = g.irecv(z.data(), 300, me, 4);
    EXPECT_FALSE(early->test());
    ASSERT_TRUE(g.send(a.data(), 300, me, 3).is_ok());
    ASSERT_TRUE(g.send(b.data(), 300, me, 3).is_ok());
    ASSERT_TRUE(g.isend(b.data(), 300, me, 4)->wait().is_ok());
    ASSERT_TRUE(early->wait().is_ok());
    ASSERT_TRUE(g.recv(x.data(), 300, me, 3).is_ok());
    ASSERT_TRUE(g.recv(y.data(), 300, me, 3).is_ok());
    EXPECT_EQ(x, a);
    EXPECT_EQ(y, b);
    EXPECT_EQ(z, b);
    // Nothing sent: waiting could never end (only this thread could send) - an error instead.
    Status st = g.recv(x.data(), 300, me, 3);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("nothing was sent to itself"), std::string::npos) << st.to_string();
    ASSERT_TRUE(g.send(a.data(), 10, me, 3).is_ok());
    st = g.recv(x.data(), 300, me, 3);
    EXPECT_NE(st.message().find("receives 300 bytes, the message has 10"), std::string::npos)
        << st.to_string();
    if (local) {
      EXPECT_FALSE(g.send(a.data(), 1, 1).is_ok());  // the only rank is 0
      EXPECT_TRUE(g.counters().empty());
    }
  }
}

// What the watchdog records of a send / recv: the peer, and the number between the two ranks; the
// collectives' numbering (#N, compared across ranks) is not advanced by point-to-point messages.
TEST(CommP2p, WatchdogRecordsOutstandingMessagesWithTheirPeer) {
  ProcessGroup& g = world();
  const int n = g.size(), me = g.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const std::string key = "world/" + std::string(g.backend());
  ASSERT_TRUE(start_watchdog(g, 600).is_ok());
  set_watchdog_context("step 2");
  ASSERT_TRUE(g.barrier().is_ok());
  const std::string before = detail::watchdog_answer(key);
  const std::string collectives = before.substr(0, before.find('\n'));
  char buf[8] = {};
  // Asked by `next`: the last line is this rank's sends to it and receives from it.
  auto counts = [&](const std::string& answer) {
    std::pair<unsigned long, unsigned long> c{0, 0};
    EXPECT_EQ(std::sscanf(answer.c_str() + answer.rfind('\n') + 1, "%lu %lu", &c.first, &c.second),
              2)
        << answer;
    return c;
  };
  const auto c0 = counts(detail::watchdog_answer(key + "\n" + std::to_string(next)));
  auto r = g.irecv(buf, 8, prev, 1);
  const std::string during = detail::watchdog_answer(key + "\n" + std::to_string(prev));
  EXPECT_NE(during.find("at step 2; in recv #"), std::string::npos) << during;
  const std::string from =
      n == 1 ? " from rank 0 on world for "  // (the local world: no world ranks recorded)
             : " from rank " + std::to_string(prev) + " (world rank " + std::to_string(prev) +
                   ") on world for ";
  EXPECT_NE(during.find(from), std::string::npos) << during;
  ASSERT_TRUE(g.send(buf, 8, next, 1).is_ok());
  ASSERT_TRUE(r->wait().is_ok());
  const std::string after = detail::watchdog_answer(key + "\n" + std::to_string(next));
  EXPECT_EQ(after.substr(0, after.find('\n')), collectives) << after;  // no collective started
  const auto c1 = counts(after);
  EXPECT_EQ(c1.first, c0.first + 1);
  EXPECT_EQ(c1.second, c0.second + (next == prev ? 1 : 0));
  stop_watchdog();
  ASSERT_TRUE(g.barrier().is_ok());
}

// ---- topology with a pipeline dimension -------------------------------------------------------

// The world ranks of each group this rank is in, checked against the formulas of
// comm/topology.h: tp_rank = r % tp, pp_rank = (r / tp) % pp, dp_rank = r / (tp * pp).
void check_layout(int tp, int pp) {
  ProcessGroup& w = world();
  const int n = w.size(), r = w.rank();
  auto t = make_topology(w, TopologyOptions{tp, false, 0, pp});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const int dp = n / (tp * pp);
  EXPECT_EQ(t->tp_size, tp);
  EXPECT_EQ(t->pp_size, pp);
  EXPECT_EQ(t->dp_size, dp);
  EXPECT_EQ(t->tp_rank, r % tp);
  EXPECT_EQ(t->pp_rank, (r / tp) % pp);
  EXPECT_EQ(t->dp_rank, r / (tp * pp));
  auto at = [&](int d, int p, int q) { return d * tp * pp + p * tp + q; };  // world rank
  auto members = [](ProcessGroup& g) {
    auto all = allgatherv(g, std::vector<int32_t>{world().rank()});
    return all.is_ok() ? *all : std::vector<int32_t>{-1};
  };
  std::vector<int32_t> want;
  for (int q = 0; q < tp; ++q) want.push_back(at(t->dp_rank, t->pp_rank, q));
  EXPECT_EQ(members(*t->tp), want);
  want.clear();
  for (int p = 0; p < pp; ++p) want.push_back(at(t->dp_rank, p, t->tp_rank));
  ASSERT_NE(t->pp, nullptr);
  EXPECT_EQ(t->pp->name(), "pp");
  EXPECT_EQ(t->pp->rank(), t->pp_rank);
  EXPECT_EQ(members(*t->pp), want);
  want.clear();
  for (int d = 0; d < dp; ++d) want.push_back(at(d, t->pp_rank, t->tp_rank));
  EXPECT_EQ(t->dp->rank(), t->dp_rank);
  EXPECT_EQ(members(*t->dp), want);
  const bool end_stage = t->pp_rank == 0 || t->pp_rank == pp - 1;
  if (pp == 1 || !end_stage) {
    EXPECT_EQ(t->embed, nullptr);
  } else {
    ASSERT_NE(t->embed, nullptr);
    EXPECT_EQ(t->embed->name(), "embed");
    EXPECT_EQ(t->embed->size(), 2);
    EXPECT_EQ(t->embed->rank(), t->pp_rank == 0 ? 0 : 1);
    want = {at(t->dp_rank, 0, t->tp_rank), at(t->dp_rank, pp - 1, t->tp_rank)};
    EXPECT_EQ(members(*t->embed), want);
    // The tied embedding's gradients: summed between the two stages.
    std::vector<float> grad(5, static_cast<float>(t->pp_rank + 1));
    ASSERT_TRUE(t->embed->allreduce(grad.data(), 5, DType::kFloat32, ReduceOp::kSum).is_ok());
    EXPECT_EQ(grad[4], static_cast<float>(pp + 1));
  }
  // groups(): world, dp, tp, then pp (pp > 1) and embed (where held).
  const auto groups = t->groups();
  std::vector<std::string> names;
  for (const ProcessGroup* g : groups) names.push_back(g->name());
  std::vector<std::string> expect{"world", "dp", "tp"};
  if (pp > 1) expect.push_back("pp");
  if (t->embed) expect.push_back("embed");
  EXPECT_EQ(names, expect);
  // Stage to stage along the pipeline: each stage sends its pp_rank to the next.
  if (pp > 1) {
    int32_t got = -1, mine = t->pp_rank;
    std::unique_ptr<Work> rw, sw;
    if (t->pp_rank > 0) rw = t->pp->irecv(&got, sizeof got, t->pp_rank - 1);
    if (t->pp_rank < pp - 1) sw = t->pp->isend(&mine, sizeof mine, t->pp_rank + 1);
    if (rw) {
      ASSERT_TRUE(rw->wait().is_ok());
    }
    if (sw) {
      ASSERT_TRUE(sw->wait().is_ok());
    }
    if (t->pp_rank > 0) {
      EXPECT_EQ(got, t->pp_rank - 1);
    }
    EXPECT_EQ(t->pp->counters().count("send"), t->pp_rank < pp - 1 ? 1u : 0u);
  }
}

TEST(CommP2pTopology, EveryLayoutThatDividesTheWorld) {
  const int n = world().size();
  for (int tp = 1; tp <= n; ++tp)
    for (int pp = 1; tp * pp <= n; ++pp)
      if (n % (tp * pp) == 0) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
        check_layout(tp, pp);
      }
}

// The issue's layouts by name, with the members spelled out (world 8).
TEST(CommP2pTopology, WorldEightLayoutsSpelledOut) {
  ProcessGroup& w = world();
  if (w.size() != 8) GTEST_SKIP() << "runs with mpirun -np 8";
  const int r = w.rank();
  {  // tp 2, pp 2, dp 2: tp {0,1} {2,3} ...; pp {0,2} {1,3} {4,6} {5,7}; dp {0,4} {1,5} ...
    auto t = make_topology(w, TopologyOptions{2, false, 0, 2});
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    const std::vector<std::vector<int>> pp = {{0, 2}, {1, 3}, {0, 2}, {1, 3},
                                              {4, 6}, {5, 7}, {4, 6}, {5, 7}};
    const std::vector<std::vector<int>> dp = {{0, 4}, {1, 5}, {2, 6}, {3, 7},
                                              {0, 4}, {1, 5}, {2, 6}, {3, 7}};
    EXPECT_EQ(t->pp->world_ranks(), pp[r]);
    EXPECT_EQ(t->dp->world_ranks(), dp[r]);
    EXPECT_EQ(t->tp->world_ranks(), (std::vector<int>{r - r % 2, r - r % 2 + 1}));
    ASSERT_NE(t->embed, nullptr);  // two stages: every rank is first or last
    EXPECT_EQ(t->embed->world_ranks(), pp[r]);
  }
  {  // pp 4, dp 2: pp {0,1,2,3} {4,5,6,7}; dp {0,4} {1,5} {2,6} {3,7}; embed {0,3} {4,7}
    auto t = make_topology(w, TopologyOptions{1, false, 0, 4});
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ(t->pp->world_ranks(),
              r < 4 ? (std::vector<int>{0, 1, 2, 3}) : (std::vector<int>{4, 5, 6, 7}));
    EXPECT_EQ(t->dp->world_ranks(), (std::vector<int>{r % 4, r % 4 + 4}));
    EXPECT_EQ(t->tp->world_ranks(), std::vector<int>{r});
    if (r % 4 == 1 || r % 4 == 2) {
      EXPECT_EQ(t->embed, nullptr);
    } else {
      ASSERT_NE(t->embed, nullptr);
      EXPECT_EQ(t->embed->world_ranks(),
                r < 4 ? (std::vector<int>{0, 3}) : (std::vector<int>{4, 7}));
    }
  }
}

TEST(CommP2pTopology, PipelineOfTwoAlone) {
  ProcessGroup& w = world();
  if (w.size() != 2) GTEST_SKIP() << "runs with mpirun -np 2";
  auto t = make_topology(w, TopologyOptions{1, false, 0, 2});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->dp_size, 1);
  EXPECT_EQ(t->tp_size, 1);
  EXPECT_EQ(t->pp_rank, w.rank());
  EXPECT_EQ(t->pp->world_ranks(), (std::vector<int>{0, 1}));
  ASSERT_NE(t->embed, nullptr);
  EXPECT_EQ(t->embed->world_ranks(), (std::vector<int>{0, 1}));
}

TEST(CommP2pTopology, RefusesPipelinesThatDoNotDivideTheWorld) {
  ProcessGroup& w = world();
  const int n = w.size();
  for (TopologyOptions o : {TopologyOptions{1, false, 0, n + 1}, TopologyOptions{1, false, 0, 0},
                            TopologyOptions{n, false, 0, 2}}) {
    auto t = make_topology(w, o);
    ASSERT_FALSE(t.is_ok()) << "tp " << o.tp << " pp " << o.pp;
    EXPECT_EQ(t.status().code(), StatusCode::kConfig);
    EXPECT_EQ(t.status().key(), "parallel.pp") << t.status().to_string();
    EXPECT_NE(t.status().message().find("parallel.pp " + std::to_string(o.pp)), std::string::npos)
        << t.status().to_string();
  }
  // tp alone not dividing is still parallel.tp's fault.
  auto t = make_topology(w, TopologyOptions{n + 1, false, 0, 1});
  if (n > 1) {
    ASSERT_FALSE(t.is_ok());
    EXPECT_EQ(t.status().key(), "parallel.tp");
  }
}

// pp == 1 is the two-dimensional layout of before: the same groups, ranks and groups() list.
TEST(CommP2pTopology, OneStageIsTheTwoDimensionalLayout) {
  ProcessGroup& w = world();
  const int n = w.size(), r = w.rank();
  const int tp = n % 2 == 0 ? 2 : 1;
  auto t = make_topology(w, TopologyOptions{tp, false, 0});
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->pp_size, 1);
  EXPECT_EQ(t->pp_rank, 0);
  EXPECT_EQ(t->tp_rank, r % tp);
  EXPECT_EQ(t->dp_rank, r / tp);
  EXPECT_EQ(t->pp->size(), 1);
  EXPECT_EQ(t->embed, nullptr);
  EXPECT_EQ(t->groups().size(), 3u);  // world, dp, tp
}

// Hierarchical DP with pipeline stages: with stages inside one "machine" (tp * pp divides the
// node size) a node holds node / (tp * pp) ranks of each DP group; with the node size dividing
// tp * pp (stages across machines) one; otherwise refused naming parallel.pp.
TEST(CommP2pTopology, HierarchicalDataParallelWithStages) {
  ProcessGroup& w = world();
  const int n = w.size(), r = w.rank();
  if (n < 4) GTEST_SKIP() << "needs 4 or more ranks";
  for (int node : {n, 2}) {
    auto t = make_topology(w, TopologyOptions{1, true, node, 2});
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    const ProcessGroup* intra = intra_node_group(*t->dp);
    ASSERT_NE(intra, nullptr);
    EXPECT_EQ(intra->size(), node % 2 == 0 && node > 2 ? std::min(node / 2, t->dp_size) : 1);
    const size_t count = 301;
    std::vector<float> h(count), f(count);
    for (size_t i = 0; i < count; ++i) h[i] = f[i] = static_cast<float>((r + 1) * (i % 13));
    ASSERT_TRUE(t->dp->allreduce(h.data(), count, DType::kFloat32, ReduceOp::kSum).is_ok());
    auto flat = make_topology(w, TopologyOptions{1, false, 0, 2});
    ASSERT_TRUE(flat.is_ok());
    ASSERT_TRUE(flat->dp->allreduce(f.data(), count, DType::kFloat32, ReduceOp::kSum).is_ok());
    EXPECT_EQ(h, f);
  }
  auto bad = make_topology(w, TopologyOptions{1, true, 3, 2});  // 3 and tp * pp = 2
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().key(), "parallel.pp");
}

// The watchdog firing on a point-to-point timeout (the process is ended: run only by
// tests/comm/comm_p2p_watchdog.sh with KILN_TEST_P2P_WATCHDOG=1). The last stage of a pipeline
// waits for an activation that stage 0 never sends (stage 0 stalls for two minutes): the job must
// end within seconds, with a message naming the group, the operation and the peer.
TEST(CommP2pWatchdog, NamesThePeerThatNeverSends) {
  if (std::getenv("KILN_TEST_P2P_WATCHDOG") == nullptr)
    GTEST_SKIP() << "ends the job: run by tests/comm/comm_p2p_watchdog.sh";
  ProcessGroup& w = world();
  auto t = make_topology(w, TopologyOptions{1, false, 0, w.size()});
  ASSERT_TRUE(t.is_ok());
  ASSERT_TRUE(start_watchdog(w, 1.0).is_ok());
  set_watchdog_context("step 3");
  float act[4] = {};
  const int last = t->pp_size - 1;
  if (t->pp_rank == last) {
    // One message that arrives, then one that never does.
    if (last > 0) {
      ASSERT_TRUE(t->pp->recv(act, sizeof act, last - 1).is_ok());
    }
    (void)t->pp->recv(act, sizeof act, 0);
    ADD_FAILURE() << "the recv from the stalled stage returned";
  } else {
    if (t->pp_rank == last - 1) {
      ASSERT_TRUE(t->pp->send(act, sizeof act, last).is_ok());
    }
    std::this_thread::sleep_for(std::chrono::seconds(120));  // a stalled stage
  }
}

}  // namespace
}  // namespace kiln::comm
