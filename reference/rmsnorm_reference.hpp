// float64 reference for RMSNorm forward and backward. Its own target, no CUDA.
// Inputs are row-major contiguous doubles; the caller rounds to a dtype.
#pragma once

#include <cstdint>

namespace rmsnorm::reference {

struct Options {
  double eps = 1e-5;
  bool weight_offset = false;  // w' = 1 + w
};

// y = x * r * w', r = 1 / sqrt(mean(x^2) + eps). w may be null (w' = 1).
// rstd (rows) and x_hat (rows * cols) may be null.
void forward(int64_t rows, int64_t cols, const double* x, const double* w, const Options& opt, double* y,
             double* rstd, double* x_hat);

// gx = r * (w' * gy - x_hat * mean(x_hat * w' * gy)); gw = sum_rows gy * x_hat.
// Optional magnitude outputs, for tolerances:
//   gx_scale[i] = r * (|w' gy| + |x_hat| * (|c| + mean|x_hat w' gy|)),  c = mean(x_hat w' gy)
//   gw_scale[j] = sum_rows |gy * x_hat|
// gw, gx_scale, gw_scale may be null.
void backward(int64_t rows, int64_t cols, const double* x, const double* w, const double* gy, const Options& opt,
              double* gx, double* gw, double* gx_scale, double* gw_scale);

}  // namespace rmsnorm::reference
