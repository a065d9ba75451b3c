// Casts fp32 <-> bf16 / fp16 (round to nearest even), exhaustive over all 16-bit patterns for the
// up-casts and over all midpoints (ties) for the down-casts; plus sum_squares (global gradient
// norm) and the inf/NaN check.
#include <bit>

#include "kernels/reference.h"
#include "tests/kernels/kernels_test_util.h"

namespace kiln {
namespace {

using namespace kiln::testing;

float f_of(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t u_of(float f) { return std::bit_cast<uint32_t>(f); }

template <typename H>
std::vector<H> all_patterns() {
  std::vector<H> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = H{static_cast<uint16_t>(i)};
  return v;
}

TEST(KernelsCast, Bf16UpcastExhaustive) {
  auto h = all_patterns<bf16>();
  std::vector<float> f(h.size());
  cpu::cast(f.data(), h.data(), h.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const double want = ref::bf16_value(static_cast<uint16_t>(i));
    const float scalar = bf16_to_float(h[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f[i])) << i;
      ASSERT_EQ(std::signbit(f[i]), (i & 0x8000) != 0) << i;
    } else {
      ASSERT_EQ(double(f[i]), want) << i;
      ASSERT_EQ(std::signbit(f[i]), (i & 0x8000) != 0) << i;  // -0 stays -0
    }
    ASSERT_EQ(u_of(f[i]), u_of(scalar)) << i;
    ASSERT_EQ(u_of(f[i]), i << 16) << i;  // bf16 is the top half of fp32, NaN payload included
  }
}

TEST(KernelsCast, Fp16UpcastExhaustive) {
  auto h = all_patterns<fp16>();
  std::vector<float> f(h.size());
  cpu::cast(f.data(), h.data(), h.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const double want = ref::fp16_value(static_cast<uint16_t>(i));
    const float scalar = fp16_to_float(h[i]);
    ASSERT_EQ(u_of(f[i]), u_of(scalar)) << i;
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f[i])) << i;
      // Quiet NaN with the 10-bit payload in the top of the fp32 mantissa.
      ASSERT_EQ(u_of(f[i]), ((i & 0x8000u) << 16) | 0x7fc00000u | ((i & 0x3ffu) << 13)) << i;
    } else {
      ASSERT_EQ(double(f[i]), want) << i;
    }
    ASSERT_EQ(std::signbit(f[i]), (i & 0x8000) != 0) << i;
  }
}

// Down-cast every input through the vectorised cast and the scalar conversion; compare with the
// search-based reference (and each other, bit for bit, NaNs included).
template <typename H>
void check_downcast(const std::vector<float>& in) {
  std::vector<H> out(in.size());
  cpu::cast(out.data(), in.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t scalar = from_float<H>(in[i]).bits;
    ASSERT_EQ(out[i].bits, scalar) << "input bits 0x" << std::hex << u_of(in[i]);
    if (std::isnan(in[i])) {
      const bool nan = std::is_same_v<H, bf16> ? ((scalar & 0x7f80) == 0x7f80 && (scalar & 0x7f))
                                               : ((scalar & 0x7c00) == 0x7c00 && (scalar & 0x3ff));
      ASSERT_TRUE(nan) << std::hex << u_of(in[i]);
      ASSERT_EQ(scalar >> 15, u_of(in[i]) >> 31);
      continue;
    }
    const uint16_t want =
        std::is_same_v<H, bf16> ? ref::float_to_bf16_bits(in[i]) : ref::float_to_fp16_bits(in[i]);
    ASSERT_EQ(scalar, want) << "input " << in[i] << " bits 0x" << std::hex << u_of(in[i]);
  }
}

// Every representable value, every midpoint between neighbours (a tie: must go to the even
// pattern), and the floats just below and above each midpoint.
template <typename H>
std::vector<float> tie_inputs(double (*value)(uint16_t), uint16_t max_finite) {
  std::vector<float> in;
  for (uint32_t s = 0; s <= 1; ++s) {
    for (uint32_t h = 0; h <= max_finite; ++h) {
      const double lo = value(static_cast<uint16_t>(h));
      const double hi = h < max_finite ? value(static_cast<uint16_t>(h + 1))
                                       : 2 * lo - value(static_cast<uint16_t>(h - 1));
      const float mid = static_cast<float>((lo + hi) / 2);  // exact in fp32
      EXPECT_EQ(double(mid), (lo + hi) / 2);
      const float sign = s ? -1.0f : 1.0f;
      in.push_back(sign * static_cast<float>(lo));
      in.push_back(sign * mid);
      in.push_back(sign * std::nextafter(mid, 0.0f));
      in.push_back(sign * std::nextafter(mid, HUGE_VALF));
    }
  }
  return in;
}

TEST(KernelsCast, Bf16DowncastTiesAndNeighbours) {
  auto in = tie_inputs<bf16>(ref::bf16_value, 0x7f7f);
  check_downcast<bf16>(in);
  // Spot checks that spell out the rule.
  EXPECT_EQ(float_to_bf16(f_of(0x3f808000)).bits, 0x3f80);  // tie, even below
  EXPECT_EQ(float_to_bf16(f_of(0x3f818000)).bits, 0x3f82);  // tie, even above
  EXPECT_EQ(float_to_bf16(f_of(0x3f808001)).bits, 0x3f81);  // just above the tie
  EXPECT_EQ(float_to_bf16(f_of(0x7f7fffff)).bits, 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(float_to_bf16(f_of(0x7f7f7fff)).bits, 0x7f7f);  // below the overflow midpoint
  EXPECT_EQ(float_to_bf16(-HUGE_VALF).bits, 0xff80);
  EXPECT_EQ(float_to_bf16(f_of(0x00000001)).bits, 0x0000);  // smallest subnormal -> +0
  EXPECT_EQ(float_to_bf16(f_of(0x00018000)).bits, 0x0002);  // subnormal tie -> even
  EXPECT_EQ(float_to_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(float_to_bf16(f_of(0x7f800001)).bits, 0x7fc0);  // signalling NaN -> quiet NaN
  EXPECT_EQ(float_to_bf16(f_of(0xffc00000)).bits, 0xffc0);
}

TEST(KernelsCast, Fp16DowncastTiesAndNeighbours) {
  auto in = tie_inputs<fp16>(ref::fp16_value, 0x7bff);
  check_downcast<fp16>(in);
  EXPECT_EQ(float_to_fp16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(float_to_fp16(65519.996f).bits, 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f).bits, 0x7c00);  // overflow midpoint -> inf (even)
  EXPECT_EQ(float_to_fp16(1e10f).bits, 0x7c00);
  EXPECT_EQ(float_to_fp16(-1e10f).bits, 0xfc00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie with 0 -> even (0)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)).bits, 0x0002);     // 1.5 ulp tie -> even (2)
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.5f, -24)).bits, 0x0400);  // rounds up to min normal
  EXPECT_EQ(float_to_fp16(f_of(0x7f800001)).bits, 0x7e00);
  EXPECT_EQ(float_to_fp16(-0.0f).bits, 0x8000);
}

TEST(KernelsCast, RandomBitPatterns) {
  std::mt19937_64 rng(7);
  std::vector<float> in(1 << 20);
  for (auto& f : in) f = f_of(static_cast<uint32_t>(rng()));
  // Plus fp32 subnormals and values near the fp16 range edges.
  for (int i = 0; i < 4096; ++i) {
    in[i] = f_of(static_cast<uint32_t>(rng()) & 0x807fffff);
    in[4096 + i] = std::ldexp(static_cast<float>(rng() % 2048), -(int)(rng() % 40));
  }
  check_downcast<bf16>(in);
  check_downcast<fp16>(in);
}

TEST(KernelsCast, RoundTripsAreExact) {
  auto hb = all_patterns<bf16>();
  auto hf = all_patterns<fp16>();
  std::vector<float> f(65536);
  std::vector<bf16> b2(65536);
  std::vector<fp16> f2(65536);
  cpu::cast(f.data(), hb.data(), 65536);
  cpu::cast(b2.data(), f.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7f80) == 0x7f80 && (i & 0x7f);
    if (!nan) {
      ASSERT_EQ(b2[i].bits, i);
    } else {
      ASSERT_EQ(b2[i].bits, i | 0x40);  // quiet bit set, payload kept
    }
  }
  cpu::cast(f.data(), hf.data(), 65536);
  cpu::cast(f2.data(), f.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
    if (!nan) {
      ASSERT_EQ(f2[i].bits, i);
    } else {
      ASSERT_EQ(f2[i].bits, i | 0x200);  // quiet bit set, payload kept
    }
  }
}

TEST(KernelsNorm, SumSquaresMatchesDoubleReference) {
  std::vector<std::vector<float>> tensors;
  for (size_t n : {size_t(1), size_t(1000), size_t(8192), size_t(8193), size_t(123457)})
    tensors.push_back(to_t<float>(randn(n, n, 0.01)));
  std::vector<const float*> ptrs;
  std::vector<size_t> sizes;
  long double want = 0;
  for (auto& t : tensors) {
    ptrs.push_back(t.data());
    sizes.push_back(t.size());
    for (float x : t) want += static_cast<long double>(x) * x;
  }
  const double got = cpu::sum_squares(ptrs.data(), sizes.data(), int(ptrs.size()));
  EXPECT_NEAR(got, double(want), 1e-13 * double(want));
  EXPECT_NEAR(cpu::sum_squares(tensors[3].data(), tensors[3].size()),
              cpu::sum_squares(ptrs.data() + 3, sizes.data() + 3, 1), 0.0);
  EXPECT_EQ(cpu::sum_squares(ptrs.data(), sizes.data(), 0), 0.0);
  // Thread invariance, bit for bit.
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    EXPECT_EQ(cpu::sum_squares(ptrs.data(), sizes.data(), int(ptrs.size())), got) << n;
  }
  // inf and NaN propagate.
  tensors[2][17] = HUGE_VALF;
  EXPECT_TRUE(std::isinf(cpu::sum_squares(ptrs.data(), sizes.data(), int(ptrs.size()))));
  tensors[2][18] = NAN;
  EXPECT_TRUE(std::isnan(cpu::sum_squares(ptrs.data(), sizes.data(), int(ptrs.size()))));
}

TEST(KernelsNorm, HasInfOrNan) {
  std::vector<float> a(100000, 1.0f), b(37, -2.0f);
  const float* ptrs[2] = {a.data(), b.data()};
  size_t sizes[2] = {a.size(), b.size()};
  EXPECT_FALSE(cpu::has_inf_or_nan(ptrs, sizes, 2));
  a[0] = 3.4e38f;  // finite max is fine
  b[36] = std::numeric_limits<float>::denorm_min();
  EXPECT_FALSE(cpu::has_inf_or_nan(ptrs, sizes, 2));
  for (float bad : {HUGE_VALF, -HUGE_VALF, NAN}) {
    b[36] = bad;
    EXPECT_TRUE(cpu::has_inf_or_nan(ptrs, sizes, 2));
    EXPECT_FALSE(cpu::has_inf_or_nan(a.data(), a.size()));
    b[36] = 0.0f;
    a[99999] = bad;
    EXPECT_TRUE(cpu::has_inf_or_nan(a.data(), a.size()));
    a[99999] = 1.0f;
  }
}

TEST(KernelsCast, ThreadCountInvariant) {
  auto in = to_t<float>(randn(300000, 3, 100.0));
  std::vector<fp16> h0;
  for (int n : thread_counts()) {
    ThreadCount tc(n);
    std::vector<fp16> h(in.size());
    cpu::cast(h.data(), in.data(), in.size());
    if (h0.empty()) h0 = h;
    EXPECT_TRUE(bits_equal(h, h0));
  }
}

}  // namespace
}  // namespace kiln
