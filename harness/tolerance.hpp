// The tolerance model: how far a result of the library may be from the
// float64 reference (reference/), element by element. One definition for the
// tests, the CLI and the benchmark. Every bound is an absolute error: one
// unit in the last place of the output dtype (the final rounding) plus a
// term for fp32 accumulation relative to a magnitude the reference supplies.
#pragma once

#include <cstdint>

namespace rmsnorm::harness {

// Spacing of dtype's representable numbers at |v| (one unit in the last
// place), flushed at the smallest normal exponent.
double ulp(int32_t dt, double v);

// Relative error allowed for an fp32 sum of n terms (sequential or tree): a
// few units of 2^-24 plus a term that grows like sqrt(n). The rounding errors
// are bounded, roughly independent and zero-mean, so their sum grows like
// sqrt(n), not n: 4 sqrt(n) + 8 units of 2^-24.
double acc_rel(int64_t n);

// y against the unrounded float64 y `ref`, rows of D = cols: one rounding to
// dt (half an ulp; a whole ulp also covers a ref just below a power of two
// whose result rounds up onto it), plus the fp32 error of r (a D-term sum, a
// divide, a sqrt) and of two products, all relative to |y|.
double y_tol(int32_t dt, double ref, int64_t cols);

// y with RMSNORM_FLAG_ROUND_XHAT: y_tol plus the extra rounding of x_hat to
// dt, scaled by |w'|. `ref` is the reference y the caller compares against.
double y_round_xhat_tol(int32_t dt, double ref, double x_hat, double w_prime, int64_t cols);

// rstd (fp32) against the float64 r: a D-term fp32 sum, then divide, add,
// sqrt.
double rstd_tol(double ref, int64_t cols);

// gx against the reference gx, with gx_scale from reference::backward. The
// fp32 terms r * w' gy and r * x_hat * c each carry the relative errors of r
// and of the D-term sum; gx_scale bounds their magnitudes (it includes
// mean|x_hat w' gy|, the scale of that sum's rounding), so cancellation in
// gx cannot make a correct result fail.
double gx_tol(int32_t dt, double ref, double gx_scale, int64_t cols);

// gw stored in gw_dt against the reference sum over `rows` rows, with
// gw_scale = sum over rows of |gy * x_hat|. Each term gy * x_hat inherits r's
// error (acc_rel(cols)); the sum over rows is a chain of fp32 adds whose
// error grows like sqrt(rows) (acc_rel(rows)), relative to gw_scale since
// the terms cancel. term_rel: a relative rounding of every term before the
// sum (the two-pass design rounds each row's term to the dtype: 2^-(m+1)), 0
// for the library, which keeps the terms in fp32.
double gw_tol(int32_t gw_dt, double ref, double gw_scale, int64_t rows, int64_t cols, double term_rel = 0.0);

// Half an ulp relative: the rounding of a value to dt (2^-(mantissa bits + 1)).
double half_ulp_rel(int32_t dt);

}  // namespace rmsnorm::harness
