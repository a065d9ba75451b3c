// Thread setting, per-thread scratch, casts, norms and small vector helpers.
#include <cblas.h>
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define KILN_HAVE_F16C 1
#endif

#include "common/status.h"
#include "kernels/cpu/internal.h"
#include "kernels/ops.h"

namespace kiln::cpu {
namespace detail {
namespace {

std::mutex g_threads_mu;
std::unique_ptr<tbb::global_control> g_control;
std::atomic<int> g_threads{0};

struct ScratchBuffer {
  float* data = nullptr;
  size_t capacity = 0;
  ~ScratchBuffer() { std::free(data); }
};

}  // namespace

int current_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : std::max(1, tbb::info::default_concurrency());
}

float* scratch(size_t n_floats, int slot) {
  thread_local ScratchBuffer buffers[kScratchSlots];
  KILN_CHECK(slot >= 0 && slot < kScratchSlots, "scratch slot out of range");
  ScratchBuffer& b = buffers[slot];
  if (b.capacity < n_floats) {
    std::free(b.data);
    size_t cap = std::max<size_t>(n_floats, 1024);
    size_t bytes = (cap * sizeof(float) + 63) / 64 * 64;
    b.data = static_cast<float*>(std::aligned_alloc(64, bytes));
    KILN_CHECK(b.data != nullptr, "out of memory for kernel scratch");
    b.capacity = cap;
  }
  return b.data;
}

// ---- conversions (vectorised where the CPU allows; identical results to kernels/dtype.h) -------

void widen(float* dst, const fp16* src, size_t n) {
  size_t i = 0;
#if KILN_HAVE_F16C
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}

void narrow(fp16* dst, const float* src, size_t n) {
  size_t i = 0;
#if KILN_HAVE_F16C
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = float_to_fp16(src[i]);
}

}  // namespace detail

using detail::parallel_chunks;

namespace {
constexpr size_t kElemChunk = 1 << 15;   // elements per task for elementwise loops
constexpr size_t kNormChunk = 1 << 13;   // elements per partial sum in sum_squares
}  // namespace

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(detail::g_threads_mu);
  if (n <= 0) n = std::max(1, tbb::info::default_concurrency());
  detail::g_control.reset();
  detail::g_control =
      std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, n);
  openblas_set_num_threads(1);  // GEMMs run in fixed chunks on the oneTBB threads (matmul.cc)
  detail::g_threads.store(n, std::memory_order_relaxed);
}

int num_threads() { return detail::current_threads(); }

// ---- casts ----------------------------------------------------------------------------------------

template <typename D, typename S>
static void cast_impl(D* dst, const S* src, size_t n) {
  parallel_chunks(n, kElemChunk, [&](size_t b, size_t e) {
    if constexpr (std::is_same_v<D, float>) {
      detail::widen(dst + b, src + b, e - b);
    } else {
      detail::narrow(dst + b, src + b, e - b);
    }
  });
}

void cast(bf16* dst, const float* src, size_t n) { cast_impl(dst, src, n); }
void cast(fp16* dst, const float* src, size_t n) { cast_impl(dst, src, n); }
void cast(float* dst, const bf16* src, size_t n) { cast_impl(dst, src, n); }
void cast(float* dst, const fp16* src, size_t n) { cast_impl(dst, src, n); }
void cast(float* dst, const float* src, size_t n) { cast_impl(dst, src, n); }

// ---- norms ----------------------------------------------------------------------------------------

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
  for (int t = 0; t < count; ++t) offsets[t + 1] = offsets[t] + (sizes[t] + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(offsets[count], 0.0);
  parallel_chunks(offsets[count], 4, [&](size_t b, size_t e) {
    for (size_t p = b; p < e; ++p) {
      int t = static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), p) - offsets.begin()) - 1;
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

template <typename T>
bool has_inf_or_nan_lp(const T* x, size_t n) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, fp16>);
  // Exponent all ones: bf16 0x7f80, fp16 0x7c00.
  constexpr uint16_t kMask = std::is_same_v<T, bf16> ? 0x7f80 : 0x7c00;
  std::atomic<bool> found{false};
  const uint16_t* u = reinterpret_cast<const uint16_t*>(x);
  parallel_chunks(n, kElemChunk * 4, [&](size_t b, size_t e) {
    uint32_t bad = 0;
    for (size_t i = b; i < e; ++i) bad |= ((u[i] & kMask) == kMask);
    if (bad) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}
template bool has_inf_or_nan_lp<bf16>(const bf16*, size_t);
template bool has_inf_or_nan_lp<fp16>(const fp16*, size_t);

// ---- small helpers --------------------------------------------------------------------------------

void scale(float* x, float s, size_t n) {
  parallel_chunks(n, kElemChunk, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) x[i] *= s;
  });
}

void accumulate(float* y, const float* x, size_t n) {
  parallel_chunks(n, kElemChunk, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) y[i] += x[i];
  });
}

}  // namespace kiln::cpu
