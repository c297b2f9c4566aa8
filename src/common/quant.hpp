// Quantized outputs (rmsnorm_forward_quant): the conversion and scale rules,
// one definition for the backends (docs/fusions.md has where they come from).
// Host and device: plain C++ float arithmetic, no library calls that differ
// between the two.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

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

// v clamped to [-448, 448] (fminf / fmaxf: NaN gives +448), then to the
// nearest e4m3fn value, ties to even: 1 sign, 4 exponent bits (bias 7), 3
// mantissa bits, subnormals below 2^-6, no infinities.
RMSNORM_QHD inline uint8_t fp8_e4m3_saturated(float v) {
  const float c = fmaxf(-kFp8Max, fminf(v, kFp8Max));
  const uint8_t sign = std::signbit(c) ? 0x80 : 0x00;
  const float a = fabsf(c);
  if (a < 0.015625f) {  // below 2^-6: multiples of 2^-9 (8 of them reach 2^-6, code 0x08)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(nearbyintf(a * 512.0f)));
  }
  int e = 0;
  const float f = frexpf(a, &e);  // a = f 2^e, f in [0.5, 1)
  // a = (1 + m / 8) 2^(e - 1); 8 m is exact in fp32, rounded to nearest even.
  int m = static_cast<int>(nearbyintf((2.0f * f - 1.0f) * 8.0f));
  int exp = e - 1;
  if (m == 8) {
    m = 0;
    ++exp;
  }
  return static_cast<uint8_t>(sign | ((exp + 7) << 3) | m);
}

// v to int8: nearest, ties to even, saturated to [-128, 127]; NaN gives 0.
// Selects, not branches: the device's per-element code is issue-bound.
RMSNORM_QHD inline int8_t int8_saturated(float v) {
  const float c = v != v ? 0.0f : fminf(fmaxf(v, -128.0f), 127.0f);
  return static_cast<int8_t>(nearbyintf(c));
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
