// The one threaded pipeline of the prep stages: batches are read in order by one thread, worked on
// in parallel, and handed on in input order by one thread, so the output bytes do not depend on
// the thread count (the scan's tables and rejects, the write stage's shards).
//
// Contract:
//   - `next(Work&)` (serial, in order) fills a fresh Work and returns true, or false at the end;
//     an error Status ends the pass.
//   - `proc(Work&)` runs on any thread, several batches at once; returns a Status.
//   - `out(Work&)` (serial, in the order `next` produced them) consumes the batch.
//   - The first error (of any of the three) is returned; once one is recorded, no further batch
//     is read and the ones in flight skip `proc` and `out`.
//   - At most 2 x the task arena's concurrency batches are in flight (memory: that many Works).
// Every oneTBB hand-off is annotated for ThreadSanitizer (common/tsan.h). pass_over_files() runs
// it over input files' record batches.
#pragma once

#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>

#include <memory>
#include <mutex>
#include <utility>

#include "common/status.h"
#include "common/tsan.h"
#include "dataprep/stages/input_batches.h"

namespace kiln::prep::detail {

template <typename Work, typename Next, typename Proc, typename Out>
Status run_batch_pipeline(Next&& next, Proc&& proc, Out&& out) {
  Status status;
  std::mutex mu;
  auto fail = [&](Status st) {
    std::lock_guard lock(mu);
    if (status.is_ok()) status = std::move(st);
  };
  auto failed = [&] {
    std::lock_guard lock(mu);
    return !status.is_ok();
  };
  const size_t tokens = 2 * static_cast<size_t>(tbb::this_task_arena::max_concurrency());
  const tsan::ForkJoin fork_join;
  tbb::parallel_pipeline(
      tokens,
      tbb::make_filter<void, Work*>(tbb::filter_mode::serial_in_order,
                                    fork_join.serial_filter([&](tbb::flow_control& fc) -> Work* {
                                      if (!failed()) {
                                        auto w = std::make_unique<Work>();
                                        Result<bool> more = next(*w);
                                        if (!more.is_ok())
                                          fail(std::move(more).take_status());
                                        else if (*more)
                                          return w.release();
                                      }
                                      fc.stop();
                                      return nullptr;
                                    })) &
          tbb::make_filter<Work*, Work*>(tbb::filter_mode::parallel,
                                         fork_join.parallel_filter([&](Work* w) {
                                           if (!failed()) {
                                             Status st = proc(*w);
                                             if (!st.is_ok()) fail(std::move(st));
                                           }
                                           return w;
                                         })) &
          tbb::make_filter<Work*, void>(tbb::filter_mode::serial_in_order,
                                        fork_join.serial_filter([&](Work* w) {
                                          std::unique_ptr<Work> owned(w);
                                          if (!failed()) {
                                            Status st = out(*w);
                                            if (!st.is_ok()) fail(std::move(st));
                                          }
                                        })));
  fork_join.join();
  return status;
}

// run_batch_pipeline over every batch of the input files [first_file, last_file) in global
// order; Work has a `RawBatch raw` member that the reading step fills.
template <typename Work, typename Proc, typename Out>
Status pass_over_files(const InputView& in, uint32_t first_file, uint32_t last_file, Proc&& proc,
                       Out&& out) {
  uint32_t fid = first_file;
  std::unique_ptr<FileBatcher> batcher;
  return run_batch_pipeline<Work>(
      [&](Work& w) -> Result<bool> {
        for (; fid < last_file; ++fid) {
          if (!batcher) {
            KILN_ASSIGN_OR_RETURN(batcher, FileBatcher::open(in, fid));
          }
          KILN_ASSIGN_OR_RETURN(bool more, batcher->next(&w.raw));
          if (more) return true;
          batcher.reset();
        }
        return false;
      },
      std::forward<Proc>(proc), std::forward<Out>(out));
}

// The 64-bit hash threshold below which a uniform hash falls with probability p (sampling the
// tokenizer's training texts, the validation split).
inline uint64_t sample_cut(double p) {
  if (p >= 1.0) return ~uint64_t{0};
  if (p <= 0.0) return 0;
  return static_cast<uint64_t>(p * 18446744073709551616.0);
}

}  // namespace kiln::prep::detail
