// Internal to kernels/cpu/: the template part of kernels/cpu/internal.h (oneTBB-based
// fixed-partition loops).
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "common/tsan.h"

namespace kiln::cpu::detail {

int current_threads();  // the value set by set_num_threads (>= 1)

template <typename Fn>
void parallel_chunks(size_t n, size_t chunk, const Fn& fn) {
  if (n == 0) return;
  if (chunk == 0) chunk = 1;
  size_t num_chunks = (n + chunk - 1) / chunk;
  if (num_chunks == 1 || current_threads() == 1) {
    for (size_t c = 0; c < num_chunks; ++c) fn(c * chunk, std::min(n, (c + 1) * chunk));
    return;
  }
  // simple_partitioner with grain 1: every range handed to a worker is exactly one chunk, so the
  // partition is independent of the thread count and of work stealing.
  const tsan::ForkJoin fork_join;
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, num_chunks, 1),
      fork_join.task([&](const tbb::blocked_range<size_t>& r) {
        for (size_t c = r.begin(); c < r.end(); ++c) fn(c * chunk, std::min(n, (c + 1) * chunk));
      }),
      tbb::simple_partitioner());
  fork_join.join();
}

}  // namespace kiln::cpu::detail
