#include "dataprep/dedup/minhash.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/random.h"
#include "common/status.h"

namespace kiln::prep {
namespace {

constexpr uint64_t kP = kMersenne61;
constexpr int kBlock = 32;  // permutations per vector block (4 x 8 lanes)

inline uint64_t reduce61(uint64_t x) {
  x = (x & kP) + (x >> 61);
  return x >= kP ? x - kP : x;
}

__extension__ typedef unsigned __int128 u128;

inline uint64_t hash61(uint64_t a, uint64_t b, uint64_t xr) {  // xr already < p
  u128 prod = static_cast<u128>(a) * xr;
  uint64_t lo = static_cast<uint64_t>(prod) & kP;
  uint64_t hi = static_cast<uint64_t>(prod >> 61);
  uint64_t s = lo + hi + b;  // < 3 * 2^61
  s = (s & kP) + (s >> 61);  // <= p + 2
  return s >= kP ? s - kP : s;
}

enum Kernel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// Vector kernels. With 31-bit limbs x = xh*2^31 + xl and a = ah*2^31 + al (xl, al < 2^31;
// xh, ah < 2^30):  a*x = al*xl + (al*xh + ah*xl)*2^31 + ah*xh*2^62, and mod p = 2^61 - 1
// (2^61 = 1, 2^62 = 2):
//   a*x + b = al*xl + (mid >> 30) + ((mid << 31) & p) + 2*ah*xh + b     (mid = al*xh + ah*xl)
// where every term is < 2^62 and the sum < 2^64, so one fold (t & p) + (t >> 61) and one
// conditional subtraction give the exact value in [0, p). 4 multiplies + 14 other operations
// per vector of permutations.

// ---- AVX-512: 8 permutations per vector, 4 vectors per block ---------------------------------
__attribute__((target("avx512f"))) void sig_avx512(const uint64_t* xl, const uint64_t* xh,
                                                   size_t n, const uint64_t* al,
                                                   const uint64_t* ah, const uint64_t* ah2,
                                                   const uint64_t* b, int padded, uint64_t* out) {
  const __m512i P = _mm512_set1_epi64(static_cast<long long>(kP));
  for (int k0 = 0; k0 < padded; k0 += kBlock) {
    __m512i acc[4], va[4], vah[4], vah2[4], vb[4];
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm512_set1_epi64(-1);
      va[j] = _mm512_loadu_si512(al + k0 + 8 * j);
      vah[j] = _mm512_loadu_si512(ah + k0 + 8 * j);
      vah2[j] = _mm512_loadu_si512(ah2 + k0 + 8 * j);
      vb[j] = _mm512_loadu_si512(b + k0 + 8 * j);
    }
    for (size_t i = 0; i < n; ++i) {
      const __m512i x0 = _mm512_set1_epi64(static_cast<long long>(xl[i]));
      const __m512i x1 = _mm512_set1_epi64(static_cast<long long>(xh[i]));
      for (int j = 0; j < 4; ++j) {
        __m512i p00 = _mm512_mul_epu32(va[j], x0);
        __m512i mid = _mm512_add_epi64(_mm512_mul_epu32(va[j], x1), _mm512_mul_epu32(vah[j], x0));
        __m512i p11 = _mm512_mul_epu32(vah2[j], x1);  // 2 * ah * xh
        __m512i t = _mm512_add_epi64(p00, vb[j]);
        t = _mm512_add_epi64(t, _mm512_srli_epi64(mid, 30));
        t = _mm512_add_epi64(t, _mm512_and_si512(_mm512_slli_epi64(mid, 31), P));
        t = _mm512_add_epi64(t, p11);
        t = _mm512_add_epi64(_mm512_and_si512(t, P), _mm512_srli_epi64(t, 61));
        t = _mm512_min_epu64(t, _mm512_sub_epi64(t, P));
        acc[j] = _mm512_min_epu64(acc[j], t);
      }
    }
    for (int j = 0; j < 4; ++j) _mm512_storeu_si512(out + k0 + 8 * j, acc[j]);
  }
}

// ---- AVX2: 4 permutations per vector, 4 vectors per block half --------------------------------
__attribute__((target("avx2"))) void sig_avx2(const uint64_t* xl, const uint64_t* xh, size_t n,
                                              const uint64_t* al, const uint64_t* ah,
                                              const uint64_t* ah2, const uint64_t* b, int padded,
                                              uint64_t* out) {
  const __m256i P = _mm256_set1_epi64x(static_cast<long long>(kP));
  const __m256i Pm1 = _mm256_set1_epi64x(static_cast<long long>(kP - 1));
  for (int k0 = 0; k0 < padded; k0 += kBlock) {
    for (int half = 0; half < 2; ++half) {
      const int base = k0 + 16 * half;
      __m256i acc[4], va[4], vah[4], vah2[4], vb[4];
      for (int j = 0; j < 4; ++j) {
        acc[j] = _mm256_set1_epi64x(static_cast<long long>(kP));  // > any reduced value
        va[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(al + base + 4 * j));
        vah[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ah + base + 4 * j));
        vah2[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ah2 + base + 4 * j));
        vb[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + base + 4 * j));
      }
      for (size_t i = 0; i < n; ++i) {
        const __m256i x0 = _mm256_set1_epi64x(static_cast<long long>(xl[i]));
        const __m256i x1 = _mm256_set1_epi64x(static_cast<long long>(xh[i]));
        for (int j = 0; j < 4; ++j) {
          __m256i p00 = _mm256_mul_epu32(va[j], x0);
          __m256i mid =
              _mm256_add_epi64(_mm256_mul_epu32(va[j], x1), _mm256_mul_epu32(vah[j], x0));
          __m256i p11 = _mm256_mul_epu32(vah2[j], x1);
          __m256i t = _mm256_add_epi64(p00, vb[j]);
          t = _mm256_add_epi64(t, _mm256_srli_epi64(mid, 30));
          t = _mm256_add_epi64(t, _mm256_and_si256(_mm256_slli_epi64(mid, 31), P));
          t = _mm256_add_epi64(t, p11);
          t = _mm256_add_epi64(_mm256_and_si256(t, P), _mm256_srli_epi64(t, 61));
          // Values are < 2^62, so signed compares are exact.
          t = _mm256_sub_epi64(t, _mm256_and_si256(_mm256_cmpgt_epi64(t, Pm1), P));
          acc[j] = _mm256_blendv_epi8(acc[j], t, _mm256_cmpgt_epi64(acc[j], t));
        }
      }
      for (int j = 0; j < 4; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + base + 4 * j), acc[j]);
    }
  }
}

int detect_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return kAvx512;
  if (__builtin_cpu_supports("avx2")) return kAvx2;
  return kScalar;
}

}  // namespace

uint64_t universal_hash61(uint64_t a, uint64_t b, uint64_t x) { return hash61(a, b, reduce61(x)); }

MinHasher::MinHasher(int num_perm, uint64_t seed) : num_perm_(num_perm) {
  KILN_CHECK(num_perm >= 1 && num_perm <= 4096, "num_perm out of range");
  padded_ = (num_perm + kBlock - 1) / kBlock * kBlock;
  a_.assign(padded_, 1);
  b_.assign(padded_, 0);
  SplitMix64 rng(seed);
  for (int k = 0; k < num_perm; ++k) {
    a_[k] = 1 + rng.next() % (kP - 1);
    b_[k] = rng.next() % kP;
  }
  a_lo31_.resize(padded_);
  a_hi31_.resize(padded_);
  a_hi31x2_.resize(padded_);
  for (int k = 0; k < padded_; ++k) {
    a_lo31_[k] = a_[k] & 0x7FFFFFFF;
    a_hi31_[k] = a_[k] >> 31;
    a_hi31x2_[k] = 2 * (a_[k] >> 31);
  }
  kernel_ = detect_kernel();
  if (const char* force = std::getenv("KILN_MINHASH_KERNEL")) {  // tests / benchmarks
    if (std::strcmp(force, "scalar") == 0) kernel_ = kScalar;
    if (std::strcmp(force, "avx2") == 0 && kernel_ >= kAvx2) kernel_ = kAvx2;
  }
}

const char* MinHasher::kernel() const {
  return kernel_ == kAvx512 ? "avx512" : kernel_ == kAvx2 ? "avx2" : "scalar";
}

void MinHasher::signature_scalar(const uint64_t* hashes, size_t n, uint64_t* sig) const {
  if (n == 0) {
    std::fill(sig, sig + num_perm_, kEmptySlot);
    return;
  }
  thread_local std::vector<uint64_t> xr;
  xr.resize(n);
  for (size_t i = 0; i < n; ++i) xr[i] = reduce61(hashes[i]);
  for (int k = 0; k < num_perm_; ++k) {
    const uint64_t a = a_[k], b = b_[k];
    uint64_t m = kEmptySlot;
    for (size_t i = 0; i < n; ++i) m = std::min(m, hash61(a, b, xr[i]));
    sig[k] = m;
  }
}

void MinHasher::signature(const uint64_t* hashes, size_t n, uint64_t* sig) const {
  if (kernel_ == kScalar || n == 0) return signature_scalar(hashes, n, sig);
  thread_local std::vector<uint64_t> xl, xh, out;
  xl.resize(n);
  xh.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = reduce61(hashes[i]);
    xl[i] = x & 0x7FFFFFFF;
    xh[i] = x >> 31;
  }
  out.resize(padded_);
  if (kernel_ == kAvx512)
    sig_avx512(xl.data(), xh.data(), n, a_lo31_.data(), a_hi31_.data(), a_hi31x2_.data(),
               b_.data(), padded_, out.data());
  else
    sig_avx2(xl.data(), xh.data(), n, a_lo31_.data(), a_hi31_.data(), a_hi31x2_.data(),
             b_.data(), padded_, out.data());
  std::memcpy(sig, out.data(), sizeof(uint64_t) * num_perm_);
}

double MinHasher::jaccard(const uint64_t* a, const uint64_t* b, int num_perm) {
  int equal = 0;
  for (int k = 0; k < num_perm; ++k) equal += a[k] == b[k];
  return static_cast<double>(equal) / num_perm;
}

}  // namespace kiln::prep
