// Element types of Kiln tensors and exact scalar conversions between them.
//
// Kiln stores tensors in fp32, bf16 or fp16. `bf16` and `fp16` are 2-byte storage types with the
// IEEE/bfloat16 bit layout (bit-compatible with __nv_bfloat16 / __half, so CUDA code may
// reinterpret_cast the pointers); they have no arithmetic: compute in float, round on store.
//
// Conversions:
//   * up-casts (bf16 -> float, fp16 -> float) are exact for every bit pattern (NaN stays NaN with
//     its sign and payload; fp16 NaNs come out quiet, as the F16C instructions make them;
//     subnormal fp16 values become normal floats);
//   * down-casts (float -> bf16, float -> fp16) round to nearest, ties to even; finite values
//     beyond the target range become +-inf (bf16 keeps fp32's range, so only values that round
//     past bf16's largest finite value overflow), fp16 subnormals are produced with correct
//     rounding, and NaN stays a (quiet) NaN with its sign.
// All functions are pure, thread-safe and usable from CUDA device code (KILN_HD).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an fp32).
struct bf16 {
  uint16_t bits;
};
// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits.
struct fp16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
// "fp32", "bf16", "fp16" (the spelling used in configs and metrics).
constexpr const char* dtype_name(DType t) {
  return t == DType::kF32 ? "fp32" : (t == DType::kBF16 ? "bf16" : "fp16");
}
// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"/"half". False if unknown.
inline bool parse_dtype(std::string_view s, DType* out) {
  if (s == "fp32" || s == "float32") *out = DType::kF32;
  else if (s == "bf16" || s == "bfloat16") *out = DType::kBF16;
  else if (s == "fp16" || s == "float16" || s == "half") *out = DType::kF16;
  else return false;
  return true;
}

// The DType of a C++ storage type: dtype_of<float>() == DType::kF32.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kF32; }
template <>
constexpr DType dtype_of<bf16>() { return DType::kBF16; }
template <>
constexpr DType dtype_of<fp16>() { return DType::kF16; }

namespace dtype_detail {
KILN_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KILN_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
}  // namespace dtype_detail

KILN_HD inline float bf16_to_float(bf16 x) {
  return dtype_detail::bits_float(static_cast<uint32_t>(x.bits) << 16);
}

KILN_HD inline bf16 float_to_bf16(float f) {
  uint32_t u = dtype_detail::float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload, force quiet bit
    return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  // Round to nearest even on the low 16 bits. Overflow of the mantissa carries into the
  // exponent, which is exactly right (including rounding up to inf near the top of the range).
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

KILN_HD inline float fp16_to_float(fp16 x) {
  uint32_t h = x.bits;
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {  // inf, or NaN: payload kept, quiet bit set (as F16C / CUDA convert it)
    u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {  // normal
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // +-0
    u = sign;
  } else {  // subnormal: value = mant * 2^-24, normalise into an fp32 normal
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    mant &= 0x3ffu;
    u = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mant << 13);
  }
  return dtype_detail::bits_float(u);
}

KILN_HD inline fp16 float_to_fp16(float f) {
  uint32_t u = dtype_detail::float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return fp16{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  }
  if (a >= 0x477ff000u) {  // >= 65520 rounds to inf (65504 is the largest finite fp16)
    return fp16{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (a >= 0x38800000u) {  // normal fp16 range (>= 2^-14)
    uint32_t rounding_bias = 0xfffu + ((a >> 13) & 1u);
    // Re-bias the exponent (127 -> 15); a mantissa carry correctly bumps the exponent.
    return fp16{static_cast<uint16_t>(sign | ((a - 0x38000000u + rounding_bias) >> 13))};
  }
  if (a < 0x33000000u) {  // < 2^-25: rounds to zero (2^-25 exactly is a tie -> even = 0)
    return fp16{sign};
  }
  // Subnormal result: value / 2^-24 rounded to an integer mantissa (0..1024; 1024 = min normal).
  uint32_t exp = a >> 23;  // 102..112
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - exp;  // 14..24
  uint32_t q = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return fp16{static_cast<uint16_t>(sign | q)};
}

// Generic helpers for templated kernels: to_float(x) and from_float<T>(f).
KILN_HD inline float to_float(float x) { return x; }
KILN_HD inline float to_float(bf16 x) { return bf16_to_float(x); }
KILN_HD inline float to_float(fp16 x) { return fp16_to_float(x); }
template <typename T>
KILN_HD inline T from_float(float f);
template <>
KILN_HD inline float from_float<float>(float f) { return f; }
template <>
KILN_HD inline bf16 from_float<bf16>(float f) { return float_to_bf16(f); }
template <>
KILN_HD inline fp16 from_float<fp16>(float f) { return float_to_fp16(f); }

// Largest finite values, for loss-scaler and overflow reasoning.
constexpr float kFp16Max = 65504.0f;
constexpr float kBf16Max = 3.38953139e38f;

}  // namespace kiln
