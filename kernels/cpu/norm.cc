// The global gradient norm (sum of squares, fp64, fixed order) and the inf/NaN check on the CPU
// (kernels/cuda/norm.cu is the GPU side).
#include <atomic>
#include <cstring>

#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {

using detail::parallel_chunks;

namespace {
constexpr size_t kElemChunk = 1 << 15;  // elements per task for the inf/NaN scan
constexpr size_t kNormChunk = 1 << 13;  // elements per partial sum in sum_squares
}  // namespace

// ---- norms --------------------------------------------------------------------------------------

namespace {

// Sum of squares of x[0..n) in fp64, fixed order: 8 interleaved accumulators then a fixed tree.
double chunk_sum_squares(const float* x, size_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      double v = x[i + j];
      acc[j] += v * v;
    }
  }
  for (; i < n; ++i) {
    double v = x[i];
    acc[0] += v * v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

bool chunk_has_inf_or_nan(const uint32_t* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= ((x[i] & 0x7f800000u) == 0x7f800000u);
  return bad != 0;
}

}  // namespace

double sum_squares(const float* const* tensors, const size_t* sizes, int count) {
  // Partials indexed by (tensor, chunk): fixed partition, summed in order afterwards.
  std::vector<size_t> offsets(static_cast<size_t>(count) + 1, 0);
  for (int t = 0; t < count; ++t)
    offsets[t + 1] = offsets[t] + (sizes[t] + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(offsets[count], 0.0);
  parallel_chunks(offsets[count], 4, [&](size_t b, size_t e) {
    for (size_t p = b; p < e; ++p) {
      int t =
          static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), p) - offsets.begin()) -
          1;
      size_t start = (p - offsets[t]) * kNormChunk;
      size_t len = std::min(kNormChunk, sizes[t] - start);
      partial[p] = chunk_sum_squares(tensors[t] + start, len);
    }
  });
  double total = 0.0;
  for (double v : partial) total += v;
  return total;
}

double sum_squares(const float* x, size_t n) {
  const float* t[1] = {x};
  size_t s[1] = {n};
  return sum_squares(t, s, 1);
}

bool has_inf_or_nan(const float* x, size_t n) {
  std::atomic<bool> found{false};
  parallel_chunks(n, kElemChunk * 4, [&](size_t b, size_t e) {
    if (chunk_has_inf_or_nan(reinterpret_cast<const uint32_t*>(x) + b, e - b)) {
      found.store(true, std::memory_order_relaxed);
    }
  });
  return found.load();
}

bool has_inf_or_nan(const float* const* tensors, const size_t* sizes, int count) {
  for (int t = 0; t < count; ++t) {
    if (has_inf_or_nan(tensors[t], sizes[t])) return true;
  }
  return false;
}

}  // namespace kiln::cpu
