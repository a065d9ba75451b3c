// common/tsan.h: the oneTBB wrappers call the bodies exactly as oneTBB would without them
// (arguments, results, pipeline items in order, sorting), in every build. In a ThreadSanitizer
// build (tools/test --sanitize=thread) the same tests run with the annotations live, so a missing
// fork or join edge shows up there as a report; tools/sanitizers/check_tsan_supp checks that a
// real race between two tasks is still reported.
#include "common/tsan.h"

#include <gtest/gtest.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_for_each.h>
#include <tbb/task_group.h>

#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace kiln {
namespace {

// A wrapped body's move is noexcept exactly when the body's is (oneTBB may copy instead of
// moving a body whose move can throw).
struct ThrowingMove {
  ThrowingMove() = default;
  ThrowingMove(const ThrowingMove&) = default;
  ThrowingMove(ThrowingMove&&) noexcept(false) {}
  void operator()() const {}
};
struct NothrowBody {
  void operator()() const {}
};
static_assert(std::is_nothrow_move_constructible_v<
              tsan::detail::Body<NothrowBody, tsan::detail::BodyKind::task>>);
static_assert(std::is_nothrow_move_constructible_v<
              tsan::detail::Body<std::function<void()>, tsan::detail::BodyKind::task>>);
static_assert(!std::is_nothrow_move_constructible_v<
              tsan::detail::Body<ThrowingMove, tsan::detail::BodyKind::task>>);

TEST(Tsan, ParallelForTaskSeesCallerWritesAndCallerSeesTaskWrites) {
  std::vector<uint64_t> in(100000), out(in.size());
  std::iota(in.begin(), in.end(), uint64_t{1});
  const tsan::ForkJoin fork_join;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, in.size(), 512),
                    fork_join.task([&](const tbb::blocked_range<size_t>& r) {
                      for (size_t i = r.begin(); i != r.end(); ++i) out[i] = in[i] * in[i];
                    }),
                    tbb::simple_partitioner());
  fork_join.join();
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(out[i], in[i] * in[i]) << i;
}

TEST(Tsan, IndexForEachAndTaskGroupBodies) {
  std::vector<int> squares(257);
  {
    const tsan::ForkJoin fork_join;
    tbb::parallel_for(0, 257, fork_join.task([&](int i) { squares[i] = i * i; }));
    fork_join.join();
  }
  for (int i = 0; i < 257; ++i) ASSERT_EQ(squares[i], i * i);

  std::vector<std::string> words(300, "w");
  {
    const tsan::ForkJoin fork_join;
    tbb::parallel_for_each(words.begin(), words.end(),
                           fork_join.task([](std::string& w) { w += "ord"; }));
    fork_join.join();
  }
  for (const auto& w : words) ASSERT_EQ(w, "word");

  // A task group that outlives the wrapped temporaries, bodies that own what they capture.
  std::vector<std::string> built(16);
  tbb::task_group group;
  const tsan::ForkJoin fork_join;
  for (int t = 0; t < 16; ++t) {
    std::function<void()> body = [&built, t, text = std::string(size_t(t), 'x')] {
      built[t] = text;
    };
    group.run(fork_join.task(std::move(body)));
  }
  group.wait();
  fork_join.join();
  for (int t = 0; t < 16; ++t) ASSERT_EQ(built[t], std::string(size_t(t), 'x'));
}

TEST(Tsan, TaskReturnsItsBodysResult) {
  const tsan::ForkJoin fork_join;
  const auto square = fork_join.task([](int x) { return x * x; });
  EXPECT_EQ(square(12), 144);
  int hit = 0;
  const auto by_reference = fork_join.task([](int& x) -> int& { return x; });
  by_reference(hit) = 7;
  EXPECT_EQ(hit, 7);
  fork_join.join();
}

TEST(Tsan, PipelineHandsEveryItemOnInOrder) {
  struct Item {
    uint64_t index = 0, value = 0;
  };
  for (int threads : {1, 4}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    uint64_t next = 0;
    std::vector<uint64_t> seen;  // written by the serial output filter only
    const tsan::ForkJoin fork_join;
    tbb::parallel_pipeline(
        8,
        tbb::make_filter<void, Item*>(tbb::filter_mode::serial_in_order,
                                      fork_join.serial_filter([&](tbb::flow_control& fc) -> Item* {
                                        if (next == 5000) {
                                          fc.stop();
                                          return nullptr;
                                        }
                                        return new Item{next++, 0};
                                      })) &
            tbb::make_filter<Item*, Item*>(tbb::filter_mode::parallel,
                                           fork_join.parallel_filter([](Item* it) {
                                             it->value = it->index * 3 + 1;
                                             return it;
                                           })) &
            tbb::make_filter<Item*, void>(tbb::filter_mode::serial_in_order,
                                          fork_join.serial_filter([&](Item* it) {
                                            seen.push_back(it->value);
                                            delete it;
                                          })));
    fork_join.join();
    ASSERT_EQ(seen.size(), 5000u) << threads;
    for (uint64_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], i * 3 + 1) << threads;
  }
}

TEST(Tsan, ParallelSortSortsWithAndWithoutAComparator) {
  std::vector<uint32_t> v(200000);
  for (uint32_t i = 0; i < v.size(); ++i) v[i] = (i * 2654435761u) % 1000003u;
  std::vector<uint32_t> expected = v;
  std::sort(expected.begin(), expected.end());
  tsan::parallel_sort(v.begin(), v.end());
  EXPECT_EQ(v, expected);
  tsan::parallel_sort(v.begin(), v.end(), [](uint32_t a, uint32_t b) { return a > b; });
  std::reverse(expected.begin(), expected.end());
  EXPECT_EQ(v, expected);
}

}  // namespace
}  // namespace kiln
