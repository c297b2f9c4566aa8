// Exhaustive tests of the host 16-bit conversions in src/common/half.hpp, and of
// the CPU backend's bulk conversions (src/cpu/convert.hpp) against them.
// Every other test and the CPU backend trust these, so they are checked
// against values computed independently (ldexp of sign, exponent and
// mantissa; rounding done in double arithmetic), never against themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/half.hpp"
#include "cpu/convert.hpp"

namespace rmsnorm {
namespace {

// A 16-bit format: binary16 (5 exponent, 10 mantissa bits) or bfloat16 (8, 7).
struct Format {
  const char* name;
  int exp_bits, mant_bits;
  float (*decode)(uint16_t);
  uint16_t (*encode)(float);

  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint32_t exp_max() const { return (1u << exp_bits) - 1u; }
  uint16_t inf_bits() const { return static_cast<uint16_t>(exp_max() << mant_bits); }
  int min_exp() const { return 1 - bias(); }  // exponent of the smallest normal
  bool is_nan(uint16_t b) const {
    return ((b >> mant_bits) & exp_max()) == exp_max() && (b & ((1u << mant_bits) - 1u)) != 0;
  }

  // The value of bit pattern b, from the definition of the format.
  double value(uint16_t b) const {
    const bool neg = (b >> 15) != 0;
    const uint32_t e = (b >> mant_bits) & exp_max();
    const uint32_t m = b & ((1u << mant_bits) - 1u);
    double v;
    if (e == exp_max()) {
      v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) {
      v = std::ldexp(static_cast<double>(m), min_exp() - mant_bits);
    } else {
      v = std::ldexp(static_cast<double>((1u << mant_bits) + m), static_cast<int>(e) - bias() - mant_bits);
    }
    return neg ? -v : v;
  }

  double max_finite() const { return value(static_cast<uint16_t>(inf_bits() - 1u)); }

  // Round-to-nearest-even of a finite v in double arithmetic: scale to an
  // integer count of ulps (exact: a power-of-two scaling of a float), round
  // with nearbyint (ties to even in the default rounding mode), scale back.
  double round(double v) const {
    const double a = std::fabs(v);
    // Halfway between the largest finite value and the next power of two
    // ties to the even neighbour, which is infinity.
    const double overflow = max_finite() + std::ldexp(1.0, bias() - mant_bits - 1);
    if (a >= overflow) return std::copysign(std::numeric_limits<double>::infinity(), v);
    int e = min_exp();
    if (a > 0) {
      int k;
      std::frexp(a, &k);  // a = f * 2^k, f in [0.5, 1)
      e = std::max(k - 1, min_exp());
    }
    const double ulp = std::ldexp(1.0, e - mant_bits);
    return std::copysign(std::nearbyint(a / ulp) * ulp, v);
  }
};

float f16_decode(uint16_t b) { return half_to_float(b); }
uint16_t f16_encode(float f) { return float_to_half(f); }
float bf16_decode(uint16_t b) { return bf16_to_float(b); }
uint16_t bf16_encode(float f) { return float_to_bf16(f); }

// gtest prints a failing case's parameter; show the format, not the pointer.
void PrintTo(const Format* f, std::ostream* os) { *os << f->name; }

const Format kF16{"f16", 5, 10, f16_decode, f16_encode};
const Format kBF16{"bf16", 8, 7, bf16_decode, bf16_encode};

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

class HalfTest : public ::testing::TestWithParam<const Format*> {};

TEST_P(HalfTest, DecodeIsExactForEveryPattern) {
  const Format& f = *GetParam();
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const double want = f.value(h), got = f.decode(h);
    if (!same_value(got, want) && ++bad <= 5) ADD_FAILURE() << f.name << " decode(0x" << std::hex << b << ") = " << got << ", want " << want;
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(HalfTest, EncodeOfDecodeRoundTrips) {
  const Format& f = *GetParam();
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const uint16_t back = f.encode(f.decode(h));
    const bool ok = f.is_nan(h) ? f.is_nan(back) : back == h;
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << f.name << " encode(decode(0x" << std::hex << b << ")) = 0x" << back;
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(HalfTest, SpecialValues) {
  const Format& f = *GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f.encode(0.0f), 0x0000);
  EXPECT_EQ(f.encode(-0.0f), 0x8000);
  EXPECT_EQ(f.encode(inf), f.inf_bits());
  EXPECT_EQ(f.encode(-inf), f.inf_bits() | 0x8000);
  // Float NaNs of every kind, including payloads that live only in the low
  // bits a 16-bit format drops, must stay NaN (and keep their sign).
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0x7f802000u, 0xffc00000u, 0xff800001u}) {
    const uint16_t h = f.encode(bits_float(bits));
    EXPECT_TRUE(f.is_nan(h)) << f.name << " NaN 0x" << std::hex << bits << " -> 0x" << h;
    EXPECT_EQ(h >> 15, bits >> 31);
  }
  // Float subnormals are far below the smallest 16-bit subnormal for f16 and
  // follow the usual rounding for bf16 (same exponent range as float).
  EXPECT_EQ(kF16.encode(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(kF16.encode(-std::numeric_limits<float>::denorm_min()), 0x8000);
}

TEST(HalfOverflow, F16Threshold) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_half(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(float_to_half(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x7c00), inf);
}

TEST(HalfOverflow, Bf16Threshold) {
  const float max_bf16 = bf16_to_float(0x7f7f);
  EXPECT_EQ(float_to_bf16(max_bf16), 0x7f7f);
  const float tie = bits_float(0x7f7f8000u);  // halfway to 2^128
  EXPECT_EQ(float_to_bf16(std::nextafter(tie, 0.0f)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(tie), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
}

TEST(HalfSubnormal, F16) {
  const double tiny = std::ldexp(1.0, -24);  // smallest f16 subnormal
  EXPECT_EQ(float_to_half(static_cast<float>(tiny)), 0x0001);
  EXPECT_EQ(float_to_half(static_cast<float>(tiny / 2)), 0x0000);  // tie to even (0)
  EXPECT_EQ(float_to_half(std::nextafter(static_cast<float>(tiny / 2), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half(static_cast<float>(-tiny / 2)), 0x8000);
  EXPECT_EQ(float_to_half(static_cast<float>(1.5 * tiny)), 0x0002);  // tie to even (2)
  EXPECT_EQ(float_to_half(static_cast<float>(2.5 * tiny)), 0x0002);
  EXPECT_EQ(float_to_half(static_cast<float>(std::ldexp(1.0, -14))), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_half(static_cast<float>(std::ldexp(1023.5, -24))), 0x0400);  // rounds up into the normals
  EXPECT_EQ(half_to_float(0x03ff), static_cast<float>(std::ldexp(1023.0, -24)));
}

TEST(HalfSubnormal, Bf16) {
  EXPECT_EQ(bf16_to_float(0x0001), static_cast<float>(std::ldexp(1.0, -133)));
  EXPECT_EQ(float_to_bf16(static_cast<float>(std::ldexp(1.0, -134))), 0x0000);  // tie to even
  EXPECT_EQ(float_to_bf16(static_cast<float>(std::ldexp(3.0, -134))), 0x0002);  // tie to even
  EXPECT_EQ(float_to_bf16(static_cast<float>(std::ldexp(127.5, -133))), 0x0080);  // into the normals
}

// Every pair of neighbouring finite values (both signs): the midpoint ties to
// the even pattern, and the floats just either side of it go to the nearer one.
TEST_P(HalfTest, MidpointsRoundToNearestEven) {
  const Format& f = *GetParam();
  int bad = 0;
  auto expect = [&](float in, uint16_t want) {
    const uint16_t got = f.encode(in);
    if (got != want && ++bad <= 5)
      ADD_FAILURE() << f.name << " encode(" << in << ") = 0x" << std::hex << got << ", want 0x" << want;
  };
  const uint16_t last = static_cast<uint16_t>(f.inf_bits() - 1u);  // largest finite pattern
  for (uint32_t b = 0; b < last; ++b) {
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const uint16_t lo = static_cast<uint16_t>(b | sign), hi = static_cast<uint16_t>((b + 1) | sign);
      const double mid = 0.5 * (f.value(lo) + f.value(hi));
      const float m = static_cast<float>(mid);
      ASSERT_EQ(static_cast<double>(m), mid) << "midpoint not exact in float";
      expect(m, (b & 1u) == 0 ? lo : hi);
      const float away = sign ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
      expect(std::nextafter(m, away), hi);
      expect(std::nextafter(m, -away), lo);
    }
  }
  // Between the largest finite value and the next power of two.
  const float m = static_cast<float>(f.max_finite() + std::ldexp(1.0, f.bias() - f.mant_bits - 1));
  expect(m, f.inf_bits());
  expect(std::nextafter(m, 0.0f), last);
  expect(-m, static_cast<uint16_t>(f.inf_bits() | 0x8000));
  EXPECT_EQ(bad, 0);
}

// Random floats against the double-based rounding. Half are uniform bit
// patterns (all exponents, so mostly overflow/underflow for f16), half have
// exponents in and just around the format's range, where rounding matters.
TEST_P(HalfTest, RandomFloatsMatchReferenceRounding) {
  const Format& f = *GetParam();
  std::mt19937_64 rng(0x5eed + f.mant_bits);
  std::uniform_int_distribution<uint32_t> bits32;
  const int lo_exp = f.min_exp() - f.mant_bits - 3, hi_exp = f.bias() + 2;
  std::uniform_int_distribution<int> exps(lo_exp, hi_exp);
  int bad = 0;
  for (int n = 0; n < 3000000; ++n) {
    uint32_t u = bits32(rng);
    if (n & 1) {
      const uint32_t e = static_cast<uint32_t>(exps(rng) + 127);  // float biased exponent, stays in 1..254
      u = (u & 0x807fffffu) | (e << 23);
    }
    const float v = bits_float(u);
    const uint16_t got = f.encode(v);
    if (std::isnan(v)) {
      if (!f.is_nan(got) && ++bad <= 5) ADD_FAILURE() << f.name << " NaN 0x" << std::hex << u << " lost";
      continue;
    }
    const double want = f.round(v), got_v = f.value(got);
    if (!same_value(got_v, want) && ++bad <= 5)
      ADD_FAILURE() << f.name << " encode(" << v << " = 0x" << std::hex << u << ") = " << got_v << ", want " << want;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfTest, ::testing::Values(&kF16, &kBF16),
                         [](const ::testing::TestParamInfo<const Format*>& info) {
                           return std::string(info.param->name);
                         });

// The CPU backend's bulk conversions (F16C / AVX2 instructions where the CPU
// has them) give the scalar functions' bits for every float and every 16-bit
// pattern, at unaligned starts and with tails shorter than a vector.
// The scalar functions are template arguments so that the 2^32 reference
// conversions inline (about 2 s per format).
template <void (*kEncodeN)(const float*, int64_t, uint16_t*), void (*kDecodeN)(const uint16_t*, int64_t, float*),
          uint16_t (*kEncode)(float), float (*kDecode)(uint16_t)>
void check_bulk(const char* name, bool simd) {
  std::printf("bulk %s conversions: %s\n", name, simd ? "SIMD" : "scalar");
  constexpr int64_t kBlock = int64_t{1} << 20;
  std::vector<float> f(kBlock + 1);
  std::vector<uint16_t> h(kBlock + 1);
  int64_t bad = 0;
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kBlock) {
    for (int64_t k = 0; k < kBlock; ++k) f[static_cast<size_t>(k + 1)] = bits_float(static_cast<uint32_t>(base + k));
    const int64_t n = kBlock - static_cast<int64_t>((base >> 20) % 16);  // tails of 0..15 elements
    kEncodeN(f.data() + 1, n, h.data() + 1);
    for (int64_t k = 0; k < n; ++k) {
      const uint16_t want = kEncode(f[static_cast<size_t>(k + 1)]), got = h[static_cast<size_t>(k + 1)];
      if (got != want && ++bad <= 5)
        ADD_FAILURE() << name << " encode_n(0x" << std::hex << base + k << ") = 0x" << got << ", want 0x" << want;
    }
  }
  std::vector<uint16_t> all(65537);
  for (uint32_t v = 0; v < 65536; ++v) all[v + 1] = static_cast<uint16_t>(v);
  for (int64_t start : {1, 2, 3}) {
    std::vector<float> out(65537, 0.0f);
    kDecodeN(all.data() + start, 65537 - start, out.data() + start);
    for (int64_t k = start; k < 65537; ++k) {
      const uint16_t v = all[static_cast<size_t>(k)];
      const uint32_t got = float_bits(out[static_cast<size_t>(k)]), want = float_bits(kDecode(v));
      if (got != want && ++bad <= 5)
        ADD_FAILURE() << name << " decode_n(0x" << std::hex << v << ") = 0x" << got << ", want 0x" << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(HalfBulk, F16MatchesScalarForEveryPattern) {
  check_bulk<cpu::float_to_f16_n, cpu::f16_to_float_n, float_to_half, half_to_float>("f16", cpu::f16_bulk_uses_f16c());
}

TEST(HalfBulk, Bf16MatchesScalarForEveryPattern) {
  check_bulk<cpu::float_to_bf16_n, cpu::bf16_to_float_n, float_to_bf16, bf16_to_float>("bf16",
                                                                                      cpu::bf16_bulk_uses_avx2());
}

}  // namespace
}  // namespace rmsnorm
