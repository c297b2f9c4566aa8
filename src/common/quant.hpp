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
RMSNORM_QHD inline int8_t int8_saturated(float v) {
  if (v != v) return 0;
  if (v >= 127.0f) return 127;
  if (v <= -128.0f) return -128;
  return static_cast<int8_t>(nearbyintf(v));
}

// A row's dequantization scale from max|y| (NaN ignored by fmaxf) and an
// optional upper bound (fp8 only): max(min(absmax, ub) / qmax, min_scale).
RMSNORM_QHD inline float row_scale(float absmax, const float* ub, bool fp8) {
  const float a = ub != nullptr ? fminf(absmax, *ub) : absmax;
  return fmaxf(a / (fp8 ? kFp8Max : kInt8Max), fp8 ? kFp8MinScale : kInt8MinScale);
}

}  // namespace rmsnorm::quant
