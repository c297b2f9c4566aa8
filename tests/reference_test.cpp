// The float64 reference against the definition: its backward against central
// finite differences of its own forward, its rstd and outputs against values
// worked out by hand, and its tolerance scales against their definitions.
// Every backend test leans on this file being right.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "rmsnorm_reference.hpp"

namespace rmsnorm::reference {
namespace {

enum class Weight { kNone, kPlain, kOffset };

struct Shape {
  int64_t rows, cols;
};

std::vector<double> randn(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

// L = sum(y * g), the scalar whose gradient backward computes when gy = g.
double loss(const Shape& s, const std::vector<double>& x, const double* w, const std::vector<double>& g,
            const Options& opt) {
  std::vector<double> y(x.size());
  forward(s.rows, s.cols, x.data(), w, opt, y.data(), nullptr, nullptr);
  double l = 0.0;
  for (size_t i = 0; i < y.size(); ++i) l += y[i] * g[i];
  return l;
}

struct FdCase {
  Shape shape;
  Weight weight;
  double eps;
};

std::string fd_name(const ::testing::TestParamInfo<FdCase>& info) {
  const FdCase& c = info.param;
  const char* w = c.weight == Weight::kNone ? "noweight" : c.weight == Weight::kPlain ? "weight" : "offset";
  return std::to_string(c.shape.rows) + "x" + std::to_string(c.shape.cols) + "_" + w + "_eps" +
         (c.eps == 0 ? "0" : c.eps < 1e-3 ? "small" : "large");
}

class ReferenceFd : public ::testing::TestWithParam<FdCase> {};

// Central differences with step h have truncation error ~h^2 * |L'''| and
// rounding error ~1e-16 * |L| / h; with h = 1e-6 and O(1) inputs both are far
// below 1e-7, so 1e-6 relative to the gradient's magnitude scale is a safe
// bound that still catches any wrong term (those are O(scale)).
TEST_P(ReferenceFd, BackwardMatchesFiniteDifferences) {
  const FdCase& c = GetParam();
  const Shape s = c.shape;
  const size_t n = static_cast<size_t>(s.rows * s.cols);
  std::mt19937_64 rng(1234 + static_cast<uint64_t>(s.rows * 1000 + s.cols));
  std::vector<double> x = randn(n, rng), g = randn(n, rng);
  std::vector<double> w = randn(static_cast<size_t>(s.cols), rng, 0.5);
  if (c.weight == Weight::kPlain)
    for (auto& e : w) e += 1.0;  // typical trained weights, near 1
  const double* wp = c.weight == Weight::kNone ? nullptr : w.data();
  Options opt;
  opt.eps = c.eps;
  opt.weight_offset = c.weight == Weight::kOffset;

  std::vector<double> gx(n), gw(static_cast<size_t>(s.cols)), gx_scale(n), gw_scale(static_cast<size_t>(s.cols));
  backward(s.rows, s.cols, x.data(), wp, g.data(), opt, gx.data(), gw.data(), gx_scale.data(), gw_scale.data());

  const double h = 1e-6;
  for (size_t k = 0; k < n; ++k) {
    std::vector<double> xp = x, xm = x;
    xp[k] += h;
    xm[k] -= h;
    const double fd = (loss(s, xp, wp, g, opt) - loss(s, xm, wp, g, opt)) / (2 * h);
    EXPECT_NEAR(gx[k], fd, 1e-6 * (1.0 + gx_scale[k])) << "gx element " << k;
  }
  if (wp == nullptr) return;
  for (int64_t j = 0; j < s.cols; ++j) {
    std::vector<double> wplus = w, wminus = w;
    wplus[j] += h;
    wminus[j] -= h;
    // d(1 + w)/dw = 1, so gw is the same sum with and without the offset.
    const double fd = (loss(s, x, wplus.data(), g, opt) - loss(s, x, wminus.data(), g, opt)) / (2 * h);
    EXPECT_NEAR(gw[j], fd, 1e-6 * (1.0 + gw_scale[j])) << "gw element " << j;
  }
}

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> out;
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{5, 64}, Shape{2, 33}})
    for (Weight w : {Weight::kNone, Weight::kPlain, Weight::kOffset})
      for (double eps : {1e-5, 0.5}) out.push_back({s, w, eps});
  out.push_back({{3, 7}, Weight::kPlain, 0.0});
  out.push_back({{4, 16}, Weight::kNone, 0.0});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReferenceFd, ::testing::ValuesIn(fd_cases()), fd_name);

TEST(Reference, RstdAndOutputsByHand) {
  // Row 0: constant 2 -> mean(x^2) = 4. Row 1: (3, 4, 0, 0) -> 25 / 4.
  // Row 2: (-1, 1, -1, 1) -> 1.
  const double x[] = {2, 2, 2, 2, 3, 4, 0, 0, -1, 1, -1, 1};
  const double w[] = {1, 2, -0.5, 0.25};
  Options opt;
  opt.eps = 0.25;
  double y[12], rstd[3], xh[12];
  forward(3, 4, x, w, opt, y, rstd, xh);
  const double r_want[] = {1 / std::sqrt(4.25), 1 / std::sqrt(6.5), 1 / std::sqrt(1.25)};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(rstd[i], r_want[i], 1e-15);
    for (int j = 0; j < 4; ++j) {
      EXPECT_NEAR(xh[i * 4 + j], x[i * 4 + j] * r_want[i], 1e-15);
      EXPECT_NEAR(y[i * 4 + j], x[i * 4 + j] * r_want[i] * w[j], 1e-15);
    }
  }
  opt.weight_offset = true;
  forward(3, 4, x, w, opt, y, nullptr, nullptr);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(y[i * 4 + j], x[i * 4 + j] * r_want[i] * (1 + w[j]), 1e-15);
  // No weight: w' = 1; null optional outputs are allowed.
  opt.weight_offset = false;
  forward(3, 4, x, nullptr, opt, y, nullptr, nullptr);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(y[i * 4 + j], x[i * 4 + j] * r_want[i], 1e-15);
}

TEST(Reference, AllZeroRowGivesZeroWithPositiveEps) {
  const int64_t cols = 5;
  std::vector<double> x(2 * cols, 0.0), gy(2 * cols), w(cols, 1.5), y(2 * cols), rstd(2);
  for (int64_t j = 0; j < cols; ++j) x[cols + j] = 1.0 + static_cast<double>(j);  // row 1 non-zero
  for (size_t k = 0; k < gy.size(); ++k) gy[k] = 0.5 - static_cast<double>(k % 3);
  Options opt;
  opt.eps = 1e-6;
  forward(2, cols, x.data(), w.data(), opt, y.data(), rstd.data(), nullptr);
  EXPECT_DOUBLE_EQ(rstd[0], 1 / std::sqrt(1e-6));
  for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(y[j], 0.0);
  std::vector<double> gx(2 * cols), gw(cols);
  backward(2, cols, x.data(), w.data(), gy.data(), opt, gx.data(), gw.data(), nullptr, nullptr);
  // x_hat = 0 on row 0, so gx = r * w' * gy there and the row adds nothing to gw.
  for (int64_t j = 0; j < cols; ++j) {
    EXPECT_DOUBLE_EQ(gx[j], rstd[0] * w[j] * gy[j]);
    EXPECT_TRUE(std::isfinite(gx[cols + j]));
    EXPECT_DOUBLE_EQ(gw[j], gy[cols + j] * x[cols + j] * rstd[1]);
  }
}

// Properties that hold exactly in real arithmetic: y is invariant to scaling
// x when eps = 0, hence gx scales by 1/k and is orthogonal to x per row when
// w' = 1.
TEST(Reference, ScaleInvarianceWithZeroEps) {
  const int64_t rows = 4, cols = 9;
  std::mt19937_64 rng(7);
  const std::vector<double> x = randn(rows * cols, rng), gy = randn(rows * cols, rng);
  std::vector<double> xk(x.size());
  const double k = 37.5;
  for (size_t i = 0; i < x.size(); ++i) xk[i] = x[i] * k;
  Options opt;
  opt.eps = 0.0;
  std::vector<double> y(x.size()), yk(x.size()), gx(x.size()), gxk(x.size());
  forward(rows, cols, x.data(), nullptr, opt, y.data(), nullptr, nullptr);
  forward(rows, cols, xk.data(), nullptr, opt, yk.data(), nullptr, nullptr);
  backward(rows, cols, x.data(), nullptr, gy.data(), opt, gx.data(), nullptr, nullptr, nullptr);
  backward(rows, cols, xk.data(), nullptr, gy.data(), opt, gxk.data(), nullptr, nullptr, nullptr);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(yk[i], y[i], 1e-14);
    EXPECT_NEAR(gxk[i] * k, gx[i], 1e-13);
  }
  for (int64_t i = 0; i < rows; ++i) {
    double dot = 0.0, mag = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      dot += x[i * cols + j] * gx[i * cols + j];
      mag += std::fabs(x[i * cols + j] * gx[i * cols + j]);
    }
    EXPECT_NEAR(dot, 0.0, 1e-14 * (1 + mag));
  }
}

// gx_scale and gw_scale against their definitions in the header (computed
// here independently), and as bounds of |gx| and |gw|.
TEST(Reference, ToleranceScales) {
  const int64_t rows = 3, cols = 11;
  std::mt19937_64 rng(99);
  const std::vector<double> x = randn(rows * cols, rng), gy = randn(rows * cols, rng), w = randn(cols, rng);
  Options opt;
  opt.eps = 1e-3;
  opt.weight_offset = true;
  std::vector<double> gx(x.size()), gw(cols), gxs(x.size()), gws(cols), rstd(rows), xh(x.size());
  backward(rows, cols, x.data(), w.data(), gy.data(), opt, gx.data(), gw.data(), gxs.data(), gws.data());
  forward(rows, cols, x.data(), w.data(), opt, nullptr, rstd.data(), xh.data());

  std::vector<double> gws_want(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double c = 0.0, c_abs = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double t = xh[i * cols + j] * (1 + w[j]) * gy[i * cols + j];
      c += t / cols;
      c_abs += std::fabs(t) / cols;
    }
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = static_cast<size_t>(i * cols + j);
      const double want = rstd[i] * (std::fabs((1 + w[j]) * gy[k]) + std::fabs(xh[k]) * (std::fabs(c) + c_abs));
      EXPECT_NEAR(gxs[k], want, 1e-12 * want);
      EXPECT_GE(gxs[k], std::fabs(gx[k]));
      gws_want[j] += std::fabs(gy[k] * xh[k]);
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    EXPECT_NEAR(gws[j], gws_want[j], 1e-12 * gws_want[j]);
    EXPECT_GE(gws[j], std::fabs(gw[j]));
    EXPECT_GT(gws[j], 0.0);
  }
}

TEST(Reference, ZeroRowsIsANoOp) {
  double gw[3] = {7, 7, 7}, gws[3] = {7, 7, 7};
  Options opt;
  forward(0, 3, nullptr, nullptr, opt, nullptr, nullptr, nullptr);
  backward(0, 3, nullptr, nullptr, nullptr, opt, nullptr, gw, nullptr, gws);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(gw[j], 0.0);  // an empty sum
    EXPECT_EQ(gws[j], 0.0);
  }
}

}  // namespace
}  // namespace rmsnorm::reference
