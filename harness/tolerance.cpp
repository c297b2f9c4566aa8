#include "harness/tolerance.hpp"

#include <algorithm>
#include <cmath>

#include "rmsnorm/rmsnorm.h"

namespace rmsnorm::harness {
namespace {

int mantissa_bits(int32_t dt) { return dt == RMSNORM_DTYPE_F32 ? 23 : dt == RMSNORM_DTYPE_F16 ? 10 : 7; }

}  // namespace

double ulp(int32_t dt, double v) {
  const int min_exp = dt == RMSNORM_DTYPE_F16 ? -14 : -126;
  const double a = std::fabs(v);
  int e = a > 0 ? static_cast<int>(std::floor(std::log2(a))) : min_exp;
  e = std::max(e, min_exp);
  return std::ldexp(1.0, e - mantissa_bits(dt));
}

double acc_rel(int64_t n) { return std::ldexp(8.0 + 4.0 * std::sqrt(static_cast<double>(n)), -24); }

double y_tol(int32_t dt, double ref, int64_t cols) { return ulp(dt, ref) + acc_rel(cols) * std::fabs(ref); }

double y_round_xhat_tol(int32_t dt, double ref, double x_hat, double w_prime, int64_t cols) {
  return ulp(dt, x_hat) * std::fabs(w_prime) + ulp(dt, ref) + acc_rel(cols) * std::fabs(ref);
}

double rstd_tol(double ref, int64_t cols) { return acc_rel(cols) * ref; }

double gx_tol(int32_t dt, double ref, double gx_scale, int64_t cols) {
  return ulp(dt, ref) + acc_rel(cols) * gx_scale;
}

double gw_tol(int32_t gw_dt, double ref, double gw_scale, int64_t rows, int64_t cols, double term_rel) {
  return ulp(gw_dt, ref) + (acc_rel(cols) + acc_rel(rows) + term_rel) * gw_scale;
}

double half_ulp_rel(int32_t dt) { return std::ldexp(1.0, -mantissa_bits(dt) - 1); }

}  // namespace rmsnorm::harness
