// Host conversions between float and the 16-bit storage formats.
// float -> 16-bit rounds to nearest, ties to even; NaN stays NaN (quiet; f16 ->
// float quiets a NaN too, bf16 -> float is the exact shift), infinities and
// signed zeros are kept, subnormals are produced and read.
// Header-only and constexpr-free so that tests, the CPU backend and the CLI
// share one definition.
#pragma once

#include <cstdint>
#include <cstring>

namespace rmsnorm {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  // A NaN comes back quiet with its payload (IEEE 754's conversion, and what
  // F16C's VCVTPH2PS gives: cpu/convert.cpp).
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {  // below 2^-14: half subnormal or zero
    if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to zero (tie to even)
    const uint32_t e = ax >> 23;
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias, then round to nearest even by adding just under half an
  // ulp plus the kept mantissa's lowest bit (a carry out of the mantissa moves
  // the exponent up, as it should). No branch: on random data a rounding
  // branch is mispredicted half the time.
  const uint32_t r = ax - (112u << 23);
  return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}

inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace rmsnorm
