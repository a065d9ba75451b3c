#include "engine/model/rng.h"

#include <tbb/parallel_for.h>

#include "common/tsan.h"

namespace kiln::engine {

void random_normal_rows(float* dst, size_t rows, size_t cols, const double* row_std, uint64_t seed,
                        uint64_t stream) {
  const tsan::ForkJoin fork_join;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, rows, 64),
                    fork_join.task([&](const tbb::blocked_range<size_t>& r) {
                      for (size_t row = r.begin(); row != r.end(); ++row) {
                        const double s = row_std[row];
                        for (size_t c = 0; c < cols; ++c) {
                          const size_t i = row * cols + c;
                          dst[i] = static_cast<float>(s * random_normal(seed, stream, i));
                        }
                      }
                    }));
  fork_join.join();
}

}  // namespace kiln::engine
