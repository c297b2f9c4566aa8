// float64 reference. Deliberately plain: one row at a time, straightforward
// loops, no shared code with the backends, so that it can judge them.
#include "rmsnorm_reference.hpp"

#include <cmath>

namespace rmsnorm::reference {
namespace {

double weight_prime(const double* w, const Options& opt, int64_t j) {
  if (w == nullptr) return 1.0;
  return opt.weight_offset ? 1.0 + w[j] : w[j];
}

double row_rstd(const double* xr, int64_t cols, double eps) {
  double ss = 0.0;
  for (int64_t j = 0; j < cols; ++j) ss += xr[j] * xr[j];
  return 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
}

}  // namespace

void forward(int64_t rows, int64_t cols, const double* x, const double* w, const Options& opt, double* y,
             double* rstd, double* x_hat) {
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = x + i * cols;
    const double r = row_rstd(xr, cols, opt.eps);
    if (rstd != nullptr) rstd[i] = r;
    for (int64_t j = 0; j < cols; ++j) {
      const double xh = xr[j] * r;
      if (x_hat != nullptr) x_hat[i * cols + j] = xh;
      if (y != nullptr) y[i * cols + j] = xh * weight_prime(w, opt, j);
    }
  }
}

void backward(int64_t rows, int64_t cols, const double* x, const double* w, const double* gy, const Options& opt,
              double* gx, double* gw, double* gx_scale, double* gw_scale) {
  if (gw != nullptr)
    for (int64_t j = 0; j < cols; ++j) gw[j] = 0.0;
  if (gw_scale != nullptr)
    for (int64_t j = 0; j < cols; ++j) gw_scale[j] = 0.0;

  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = x + i * cols;
    const double* gr = gy + i * cols;
    const double r = row_rstd(xr, cols, opt.eps);

    double dot = 0.0, dot_abs = 0.0;  // sums of x_hat * w' * gy and of its magnitude
    for (int64_t j = 0; j < cols; ++j) {
      const double t = xr[j] * r * weight_prime(w, opt, j) * gr[j];
      dot += t;
      dot_abs += std::fabs(t);
    }
    const double c = dot / static_cast<double>(cols);
    const double c_abs = dot_abs / static_cast<double>(cols);

    for (int64_t j = 0; j < cols; ++j) {
      const double xh = xr[j] * r;
      const double wg = weight_prime(w, opt, j) * gr[j];
      if (gx != nullptr) gx[i * cols + j] = r * (wg - xh * c);
      if (gx_scale != nullptr) gx_scale[i * cols + j] = r * (std::fabs(wg) + std::fabs(xh) * (std::fabs(c) + c_abs));
      if (gw != nullptr) gw[j] += gr[j] * xh;
      if (gw_scale != nullptr) gw_scale[j] += std::fabs(gr[j] * xh);
    }
  }
}

}  // namespace rmsnorm::reference
