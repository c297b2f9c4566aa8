// The per-row normalizer r = 1 / sqrt(sum(x^2) / D + eps) over the whole
// fp32 range: one rule, shared by the CPU backend and the CUDA kernels, so
// both take the same path for the same row sum.
//
//   ss = the plain fp32 sum of x^2 (each backend's usual order)
//   if rms_needs_rescale(ss, eps):        ss overflowed, or is tiny while eps is too
//     s   = rms_rescale_factor(ss)        2^-80 after an overflow, else 2^80
//     ss2 = fp32 sum of (x * s)^2, in the same order as ss
//     r   = rms_from_scaled(ss2, s, D, eps)
//   else
//     r   = rms_from_sum(ss, D, eps)
//
// Why these constants. ss == +inf means some partial sum overflowed, yet every
// |x| <= FLT_MAX < 2^128, so |x * 2^-80| < 2^48 and at most 2^31 squares sum
// below 2^127: ss2 is finite. ss < 2^-64 means every |x| < 2^-32, so
// |x * 2^80| < 2^48 likewise, and squares that underflowed in ss are now
// normal numbers. Scaling by a power of two is exact, so on the rescaled path
// r = s / sqrt(ss2 / D + eps * s * s) is the plain formula evaluated 2^160
// (or 2^-160) higher. eps * s * s is two multiplies, each exact or below any
// ulp of the sum: with s = 2^80, eps < 2^-40 keeps it below 2^120; with
// s = 2^-80 it can only underflow against an ss2 that is >= 2^-63. With
// eps >= 2^-40 and ss < 2^-64 the plain formula is already accurate, because
// eps dominates ss / D. A NaN ss compares false and stays on the plain path.
//
// Range: every finite row whose largest |x| lies in [2^-100, FLT_MAX] gets r
// to fp32 accuracy for any eps up to 2^100 (beyond that, ss / D + eps itself
// can overflow). r is subnormal where the row's rms exceeds 2^126 and has a
// subnormal float's precision there. f16 rows never overflow
// (65504^2 * 2^31 < 2^64) and a non-zero f16 row has ss >= 2^-48, so f16
// takes the rescaled path only for an all-zero row with eps < 2^-40, where it
// gives the plain formula's result bit for bit.
//
// Backward: c = mean(x_hat * w' * gy) = r * sum(x * w'gy) / D. That sum
// overflows fp32 where the row's rms is near FLT_MAX, and its terms go
// subnormal for the tiniest rows, whether r was recomputed or given.
// rms_dot_scale(r) is the power of two t that brings such x back near 1, and
// 1 on every other row:
//   t == 1: c = (r * sum(x * w'gy)) / D              the plain expression
//   else:   c = ((r / t) * sum((x * t) * w'gy)) / D  same order of terms
// (the CPU backend's grouping; the CUDA kernels compute r * (sum / D) and
// (r / t) * (sum / D), within the same rounding).
// r < 2^-64 only where the row's rms exceeds 2^64, and any finite
// |x * 2^-80| < 2^48. r > 2^64 means sum(x^2) / D + eps < 2^-128, so every
// |x| < 2^-48.5 (D <= 2^31) and |x * 2^80| < 2^31.5. With 2^-64 <= r <= 2^64
// the plain sum is bounded by ||x||_2 ||w'gy||_2 <= (sqrt(D) / r) ||w'gy||_2
// <= 2^79.5 ||w'gy||_2: finite while ||w'gy||_2 stays below about 2^48, but
// not for any gy (x near 1e19 with gy near 1e20 overflows it, and gx is NaN;
// rmsnorm.h states the limit). r / t is exact (r is a float, t a power of
// two, the product normal).
#pragma once

#include <math.h>

#ifndef RMSNORM_HD
#if defined(__CUDACC__)
#define RMSNORM_HD __host__ __device__
#else
#define RMSNORM_HD
#endif
#endif

namespace rmsnorm {

inline constexpr float kRmsFloatMax = 0x1.fffffep127f;  // FLT_MAX: ss > this is ss == +inf
inline constexpr float kRmsTinySum = 0x1p-64f;          // ss below this may have lost squares to underflow
inline constexpr float kRmsTinyEps = 0x1p-40f;          // eps at or above this dominates such an ss
inline constexpr float kRmsScaleDown = 0x1p-80f;
inline constexpr float kRmsScaleUp = 0x1p80f;
inline constexpr float kRmsDotSmallR = 0x1p-64f;  // r below this: the backward dot can overflow
inline constexpr float kRmsDotLargeR = 0x1p64f;   // r above this: its terms can go subnormal

RMSNORM_HD constexpr bool rms_needs_rescale(float ss, float eps) {
  return ss > kRmsFloatMax || (ss < kRmsTinySum && eps < kRmsTinyEps);
}

RMSNORM_HD constexpr float rms_rescale_factor(float ss) { return ss > kRmsFloatMax ? kRmsScaleDown : kRmsScaleUp; }

// The plain formula.
RMSNORM_HD inline float rms_from_sum(float ss, int cols, float eps) {
  return 1.0f / sqrtf(ss / static_cast<float>(cols) + eps);
}

// ss2 = sum of (x * s)^2; the two multiplies of eps keep eps * s * s finite.
RMSNORM_HD inline float rms_from_scaled(float ss2, float s, int cols, float eps) {
  return s / sqrtf(ss2 / static_cast<float>(cols) + (eps * s) * s);
}

RMSNORM_HD constexpr float rms_dot_scale(float r) {
  return r < kRmsDotSmallR ? kRmsScaleDown : r > kRmsDotLargeR ? kRmsScaleUp : 1.0f;
}

}  // namespace rmsnorm
