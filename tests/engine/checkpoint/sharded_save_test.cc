// The sharded save's rank reports (engine/checkpoint/sharded_save.h): typed at both ends, and
// rank 0's check naming what is missing or disagrees. (The whole protocol runs under mpirun in
// tests/train_mpi.sh and the pipeline suites, and on one rank with ZeRO in checkpoint_test.)
#include "engine/checkpoint/sharded_save.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln::engine {
namespace {

ShardReport report(int64_t stage, int64_t first, int64_t end, int64_t tp_rank, int64_t partition,
                   uint64_t digest) {
  ShardReport r;
  r.stage = stage;
  r.first_block = first;
  r.end_block = end;
  r.tp_rank = tp_rank;
  r.partition = partition;
  r.file_hash = 1000 + static_cast<uint64_t>((stage * 10 + tp_rank) * 10 + partition);
  r.replicated_digest = digest;
  return r;
}

TEST(ShardedSave, ReportsRoundTrip) {
  const ShardReport r = report(1, 2, 4, 1, 3, 0xfedcba9876543210ull);
  auto back = ShardReport::decode(r.encode(), 5);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->stage, 1);
  EXPECT_EQ(back->first_block, 2);
  EXPECT_EQ(back->end_block, 4);
  EXPECT_EQ(back->tp_rank, 1);
  EXPECT_EQ(back->partition, 3);
  EXPECT_EQ(back->file_hash, r.file_hash);
  EXPECT_EQ(back->replicated_digest, r.replicated_digest);
  auto bad = ShardReport::decode("1 2 three", 5);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("rank 5"), std::string::npos);
}

// pp 2 x tp 2 x P 1: four files in file order (stage, TP rank, partition), the stage bounds
// gathered from the reports; a rank that wrote nothing reports "".
TEST(ShardedSave, RankZeroChecksEveryFileOnce) {
  CheckpointLayout layout;
  layout.pp = 2;
  layout.tp_partitions = 2;
  layout.partitions = 1;
  std::vector<std::string> got = {
      report(0, 0, 2, 0, 0, 7).encode(), report(0, 0, 2, 1, 0, 7).encode(), "",
      report(1, 2, 4, 1, 0, 9).encode(), report(1, 2, 4, 0, 0, 9).encode()};
  auto hashes = check_shard_reports(got, &layout);
  ASSERT_TRUE(hashes.is_ok()) << hashes.status().to_string();
  EXPECT_EQ(*hashes, (std::vector<uint64_t>{1000, 1010, 1100, 1110}));
  EXPECT_EQ(layout.pp_bounds, (std::vector<int64_t>{0, 2, 4}));

  // A file nobody wrote.
  std::vector<std::string> missing = got;
  missing[3] = "";
  auto m = check_shard_reports(missing, &layout);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().to_string().find("no rank wrote file 3 of 4"), std::string::npos)
      << m.status().to_string();

  // Stages that disagree on where stage 1 begins.
  std::vector<std::string> bounds = got;
  bounds[3] = report(1, 3, 4, 1, 0, 9).encode();
  auto b = check_shard_reports(bounds, &layout);
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().to_string().find("disagree on block boundary 1"), std::string::npos)
      << b.status().to_string();

  // Replicated tensors that differ between the TP ranks of stage 1.
  std::vector<std::string> digests = got;
  digests[3] = report(1, 2, 4, 1, 0, 8).encode();
  auto d = check_shard_reports(digests, &layout);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().to_string().find("tensor-parallel ranks 0 and 1"), std::string::npos)
      << d.status().to_string();
  EXPECT_NE(d.status().to_string().find("pipeline stage 1"), std::string::npos);

  // A report outside the layout.
  std::vector<std::string> outside = got;
  outside[2] = report(2, 4, 6, 0, 0, 9).encode();
  auto o = check_shard_reports(outside, &layout);
  ASSERT_FALSE(o.is_ok());
  EXPECT_NE(o.status().to_string().find("rank 2 reported an unreadable file"), std::string::npos);
}

}  // namespace
}  // namespace kiln::engine
