// Quantized outputs (rmsnorm_forward_quant): the conversion and scale rules,
// one definition for the backends (docs/fusions.md has where they come from).
// Host and device: plain C++ float arithmetic, no library calls that differ
// between the two.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/half.hpp"

#if defined(__CUDACC__)
#define RMSNORM_QHD __host__ __device__
#else
#define RMSNORM_QHD
#endif

namespace rmsnorm::quant {

inline constexpr float kFp8Max = 448.0f;  // e4m3fn's largest finite value
inline constexpr float kInt8Max = 127.0f;
// The smallest per-row scale: 1 / (448 * 512) for fp8, FLT_EPSILON for int8.
inline constexpr float kFp8MinScale = 1.0f / (448.0f * 512.0f);
inline constexpr float kInt8MinScale = FLT_EPSILON;

// The two conversions below are the rule for the CPU backend and the tests,
// host only (the device has instructions for it: cuda/quant.cuh). One float
// add each, and integer selects on the float's bits (common/half.hpp's casts):
// no float compare, conversion or library call (fminf and nearbyint are calls
// on the host), so that the loops over a row vectorise.
// v clamped to [-448, 448] (NaN of either sign gives +448), then to the
// nearest e4m3fn value, ties to even: 1 sign, 4 exponent bits (bias 7), 3
// mantissa bits, subnormals below 2^-6, no infinities. For a = |v| in
// [2^k, 2^(k+1)) (k >= -6; below 2^-6, as k = -6) e4m3's spacing is 2^(k-3),
// the ulp of M = 2^(k+20): t = M + a rounds a to j spacings (in the current
// rounding mode: to nearest even by default), and j = bits(t) - bits(M) (8..16
// in a binade, 0..8 below it). The code is then 8 (k + 6) + j; a carry to
// j = 16 lands on the next binade's first code.
inline uint8_t fp8_e4m3_saturated(float v) {
  constexpr uint32_t k448 = 0x43e00000u;  // 448.0f
  const uint32_t u = float_bits(v), mag = u & 0x7fffffffu;
  const bool nan = mag > 0x7f800000u;
  const uint32_t sign = nan ? 0u : (u >> 24) & 0x80u;
  const uint32_t abits = nan || mag > k448 ? k448 : mag;
  const uint32_t e = abits >> 23 > 121u ? abits >> 23 : 121u;  // 121 = 127 - 6: k + 127, at least 2^-6's
  const uint32_t mbits = (e + 20u) << 23;
  const uint32_t j = float_bits(bits_float(abits) + bits_float(mbits)) - mbits;
  return static_cast<uint8_t>(sign | ((e - 121u) * 8u + j));
}

// v to int8: nearest, ties to even, saturated to [-128, 127]; NaN gives 0.
// |v| is first capped at 1024 (on the bits: the same result, since clamping to
// integer bounds commutes with rounding to integers); then t = c + M, M = 1.5
// 2^23 with c's sign, whose ulp is 1, holds c rounded as +-(bits(t) - bits(M))
// (nearbyint's result in every rounding mode, M carrying c's sign so that
// toward-zero rounds the magnitude), and the integer is clamped.
inline int8_t int8_saturated(float v) {
  constexpr uint32_t k1024 = 0x44800000u, kMagic = 0x4b400000u;  // 1024.0f, 1.5 2^23
  const uint32_t u = float_bits(v), mag = u & 0x7fffffffu, sign = u & 0x80000000u;
  // A NaN becomes +0 by a mask, not a select: with a select the compiler branches around the add.
  const uint32_t keep = 0u - static_cast<uint32_t>(mag <= 0x7f800000u);
  const float c = bits_float((sign | (mag > k1024 ? k1024 : mag)) & keep);
  const uint32_t m = (sign & keep) | kMagic;
  const int32_t d = static_cast<int32_t>(float_bits(c + bits_float(m)) - m);
  const int32_t i = sign & keep ? -d : d;
  return static_cast<int8_t>(i < -128 ? -128 : (i > 127 ? 127 : i));
}

// A row's dequantization scale from max|y| (NaN ignored by fmaxf) and an
// optional upper bound (fp8 only): max(min(absmax, ub) / qmax, min_scale).
RMSNORM_QHD inline float bounded_row_scale(float a, bool fp8) {
  return fmaxf(a / (fp8 ? kFp8Max : kInt8Max), fp8 ? kFp8MinScale : kInt8MinScale);
}
RMSNORM_QHD inline float row_scale(float absmax, const float* ub, bool fp8) {
  return bounded_row_scale(ub != nullptr ? fminf(absmax, *ub) : absmax, fp8);
}

// y / s for a row's scale s > 0 and inv = 1 / s (correctly rounded), without a
// divide per element: q0 = y inv is within an ulp of y / s, the FMA gives the
// exact remainder y - q0 s (negated: t = q0 s - y), and q0 - t inv rounds to
// y / s (Markstein's correction). The negated remainder keeps the sign of
// zero: y = -0 gives -0 + -0 = -0 where y - q0 s would give +0. Where the
// remainder underflows (|y / s| far below anything an 8-bit format keeps) the
// result can be an ulp off, and the sign is y's in any case, so
// fp8_e4m3_saturated of it equals that of y / s for every finite y
// (Quant.QuotientByInverseGivesTheDividedCode, tests/fused_test.cpp, checks
// every 16-bit y against many scales, the quotient bit for bit).
// corrected_quotient is the correction alone: y / s for finite y whose
// quotient is finite, NaN for NaN y. quotient_by_inverse also covers
// y = +-inf and quotients past FLT_MAX, where the correction gives NaN and q0
// (+-inf or NaN) is kept, as y / s would give.
// q0 = y inv, rounded on its own (the device must not contract it into the FMA that follows).
RMSNORM_QHD inline float first_quotient(float y, float inv) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(y, inv);
#else
  return y * inv;
#endif
}
RMSNORM_QHD inline float corrected_quotient(float y, float s, float inv) {
  const float q0 = first_quotient(y, inv);
  return fmaf(-fmaf(q0, s, -y), inv, q0);
}
RMSNORM_QHD inline float quotient_by_inverse(float y, float s, float inv) {
  const float q1 = corrected_quotient(y, s, inv);
  return q1 == q1 ? q1 : first_quotient(y, inv);
}

// Whether corrected_quotient is y / s for every y of a row (or block) whose
// max|y| (NaN ignored) is absmax: absmax finite and every quotient at most
// absmax inv <= 1e38, far from FLT_MAX (so that neither q0 s nor the
// correction overflows). False for absmax = inf, and for inv = 0 (s = inf).
RMSNORM_QHD inline bool quotients_finite(float absmax, float inv) { return absmax * inv <= 1e38f; }

}  // namespace rmsnorm::quant
