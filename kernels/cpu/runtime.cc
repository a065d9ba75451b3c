// Thread setting, per-thread scratch, casts and small vector helpers.
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
constexpr size_t kElemChunk = 1 << 15;  // elements per task for elementwise loops
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

// ---- casts --------------------------------------------------------------------------------------

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

// ---- small helpers ------------------------------------------------------------------------------

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
