// rmsnorm_add_forward and rmsnorm_add_backward on the CPU backend, through the C ABI: h = T(x + residual) (the sum in fp32, rounded once),
// y = rms_norm(h) * w'. Every element of h is checked exactly against that rule, computed here; y against the
// float64 reference of h as stored (the tests' tolerance model) and bit for bit against rmsnorm_forward of that h
// (the documented identity); rstd bit for bit against rmsnorm_forward's. Outputs start as NaN (HostMatrix's 0xFF
// storage), so an element left unwritten fails. Then the in-place forms, the overlap rules (nothing written when a
// call is refused), and rows == 0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/host_matrix.hpp"
#include "harness/random.hpp"
#include "harness/tolerance.hpp"
#include "rmsnorm/rmsnorm.h"

namespace rmsnorm::test {
namespace {

using harness::HostMatrix;

const int32_t kDtypes[] = {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16};

struct AddCase {
  int32_t dtype = RMSNORM_DTYPE_BF16;
  int64_t rows = 3, cols = 64;
  bool strided = false;  // every operand with its own row stride > cols and a base offset
  bool weight = true;
  uint32_t flags = 0;
};

std::string describe(const AddCase& c) {
  std::ostringstream os;
  os << c.rows << "x" << c.cols << " dtype " << c.dtype << (c.strided ? " strided" : "") << (c.weight ? "" : " no-weight")
     << " flags " << c.flags;
  return os.str();
}

HostMatrix matrix(const AddCase& c, int operand) {
  if (!c.strided) return HostMatrix(c.dtype, c.rows, c.cols);
  return HostMatrix(c.dtype, c.rows, c.cols, c.cols + 3 + operand, 1 + operand % 2);
}

rmsnorm_problem_t problem(const AddCase& c) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = c.rows;
  p.cols = c.cols;
  p.dtype = c.dtype;
  p.flags = c.flags;
  return p;
}

// h by the documented rule, from x and residual as stored: fp32 sum, one rounding to the dtype.
HostMatrix expected_h(const AddCase& c, const HostMatrix& x, const HostMatrix& res) {
  HostMatrix h(c.dtype, c.rows, c.cols);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k)
      h.set(r, k, static_cast<float>(x.get(r, k)) + static_cast<float>(res.get(r, k)));
  return h;
}

void expect_same_values(const HostMatrix& got, const HostMatrix& want, const char* name) {
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t k = 0; k < want.cols; ++k) {
      const double g = got.get(r, k), w = want.get(r, k);
      ASSERT_TRUE(std::memcmp(&g, &w, sizeof(double)) == 0)
          << name << " differs at row " << r << " col " << k << ": got " << g << " expected " << w;
    }
}

void check_case(const AddCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  HostMatrix x = matrix(c, 0), res = matrix(c, 1), h = matrix(c, 2), y = matrix(c, 3);
  // Rows of different scales, and the residual larger than x, as in a deep residual stream.
  harness::fill_normal(x, rng(), harness::hetero_row_scale);
  harness::fill_normal(res, rng(), [](int64_t r) { return 8.0 * harness::hetero_row_scale(r + 3); });
  HostMatrix w(c.dtype, 1, c.cols);
  harness::fill_normal(w, rng(), {}, 1.0);
  std::vector<float> rstd(static_cast<size_t>(c.rows), std::nanf(""));
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(2);
  const void* wp = c.weight ? w.data() : nullptr;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, x.data(), x.stride, res.data(), res.stride, wp, h.data(),
                                                         h.stride, y.data(), y.stride, rstd.data(), &be))
      << rmsnorm_last_error();

  const HostMatrix h_want = expected_h(c, x, res);
  expect_same_values(h, h_want, "h");
  if (::testing::Test::HasFatalFailure()) return;

  // y against the float64 reference of h as stored.
  reference::Options opt;
  opt.eps = p.eps;
  opt.weight_offset = (c.flags & RMSNORM_FLAG_WEIGHT_OFFSET) != 0;
  if ((c.flags & RMSNORM_FLAG_ROUND_XHAT) == 0) {
    harness::Outputs out;
    out.y = &y;
    const auto results = harness::check_against_reference(h_want, c.weight ? &w : nullptr, nullptr, opt, out);
    for (const auto& r : results) EXPECT_TRUE(r.worst.passed()) << r.worst.describe(r.name, r.vector);
  }

  // The identity: y and rstd bit for bit those of rmsnorm_forward of h.
  HostMatrix y_plain(c.dtype, c.rows, c.cols);
  std::vector<float> rstd_plain(static_cast<size_t>(c.rows), 0.0f);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, h_want.data(), h_want.stride, wp, y_plain.data(),
                                                     y_plain.stride, rstd_plain.data(), &be))
      << rmsnorm_last_error();
  expect_same_values(y, y_plain, "y (against rmsnorm_forward of h)");
  EXPECT_EQ(0, std::memcmp(rstd.data(), rstd_plain.data(), rstd.size() * sizeof(float))) << "rstd";
}

TEST(AddForward, AgainstTheReferenceAndTheUnfusedForm) {
  std::mt19937_64 rng(31);
  for (int32_t dt : kDtypes)
    for (int64_t cols : {1, 7, 8, 33, 64, 1000, 4096})
      for (int64_t rows : {1, 3, 37}) {
        AddCase c;
        c.dtype = dt;
        c.rows = rows;
        c.cols = cols;
        c.strided = (cols + rows) % 2 == 1;
        c.weight = cols % 5 != 0;
        check_case(c, rng);
        if (HasFatalFailure()) return;
      }
}

TEST(AddForward, Flags) {
  std::mt19937_64 rng(32);
  for (uint32_t flags : {RMSNORM_FLAG_WEIGHT_OFFSET, RMSNORM_FLAG_ROUND_XHAT, RMSNORM_FLAG_NO_PDL}) {
    AddCase c;
    c.rows = 5;
    c.cols = 96;
    c.flags = flags;
    check_case(c, rng);
    if (HasFatalFailure()) return;
  }
}

// h written over residual, or over x (same pointer and stride): the same h, y and rstd as out of place.
TEST(AddForward, InPlace) {
  std::mt19937_64 rng(33);
  for (int32_t dt : kDtypes) {
    for (int over : {0, 1}) {  // 0: h == x, 1: h == residual
      AddCase c;
      c.dtype = dt;
      c.rows = 9;
      c.cols = 130;
      SCOPED_TRACE(describe(c) + (over == 0 ? " h == x" : " h == residual"));
      HostMatrix x(c.dtype, c.rows, c.cols), res(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols);
      harness::fill_normal(x, rng());
      harness::fill_normal(res, rng());
      harness::fill_normal(w, rng(), {}, 1.0);
      const rmsnorm_problem_t p = problem(c);
      const rmsnorm_backend_t be = rmsnorm_backend_cpu(3);
      HostMatrix h(c.dtype, c.rows, c.cols), y(c.dtype, c.rows, c.cols), y2(c.dtype, c.rows, c.cols);
      std::vector<float> r1(static_cast<size_t>(c.rows)), r2(static_cast<size_t>(c.rows));
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, x.data(), c.cols, res.data(), c.cols, w.data(),
                                                             h.data(), c.cols, y.data(), c.cols, r1.data(), &be));
      HostMatrix& target = over == 0 ? x : res;
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, x.data(), c.cols, res.data(), c.cols, w.data(),
                                                             target.data(), c.cols, y2.data(), c.cols, r2.data(), &be))
          << rmsnorm_last_error();
      expect_same_values(target, h, "h in place");
      expect_same_values(y2, y, "y");
      EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)));
    }
  }
}

// Refused calls write nothing: every output keeps its poison bytes.
void expect_refused(rmsnorm_status_t got, rmsnorm_status_t want, const char* arg, const std::vector<HostMatrix*>& outs,
                    const std::vector<std::vector<unsigned char>>& before) {
  EXPECT_EQ(got, want) << rmsnorm_last_error();
  EXPECT_NE(std::string(rmsnorm_last_error()).find(arg), std::string::npos) << rmsnorm_last_error();
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(outs[i]->storage == before[i]) << "output " << i << " written";
}

TEST(AddForward, OverlapAndArgumentRules) {
  AddCase c;
  c.rows = 4;
  c.cols = 16;
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  HostMatrix x(c.dtype, c.rows, c.cols), res(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols);
  std::mt19937_64 rng(34);
  harness::fill_normal(x, rng());
  harness::fill_normal(res, rng());
  harness::fill_normal(w, rng());
  HostMatrix h(c.dtype, c.rows, c.cols), y(c.dtype, c.rows, c.cols);
  // One buffer holding a 4 x 16 matrix at 8 elements' shift from another: a partial overlap.
  HostMatrix big(c.dtype, 1, 2 * c.rows * c.cols);
  harness::fill_normal(big, rng());
  char* b = static_cast<char*>(big.data());
  const size_t es = big.esize();
  const std::vector<HostMatrix*> outs = {&h, &y};
  auto snapshot = [&] { return std::vector<std::vector<unsigned char>>{h.storage, y.storage}; };
  const auto before = snapshot();
  auto call = [&](const void* xp, const void* rp, void* hp, void* yp) {
    return rmsnorm_add_forward(&p, xp, c.cols, rp, c.cols, w.data(), hp, c.cols, yp, c.cols, nullptr, &be);
  };
  // h partially over x / residual; residual partially over x.
  expect_refused(call(b, res.data(), b + 8 * es, y.data()), RMSNORM_STATUS_OVERLAP, "h", outs, before);
  expect_refused(call(x.data(), b, b + 8 * es, y.data()), RMSNORM_STATUS_OVERLAP, "h", outs, before);
  expect_refused(call(b, b + 8 * es, h.data(), y.data()), RMSNORM_STATUS_OVERLAP, "residual", outs, before);
  // y over any other operand, even exactly.
  expect_refused(call(x.data(), res.data(), h.data(), x.data()), RMSNORM_STATUS_OVERLAP, "y", outs, before);
  expect_refused(call(x.data(), res.data(), h.data(), res.data()), RMSNORM_STATUS_OVERLAP, "y", outs, before);
  expect_refused(call(x.data(), res.data(), h.data(), h.data()), RMSNORM_STATUS_OVERLAP, "y", outs, before);
  // Null and stride errors name the operand.
  expect_refused(call(x.data(), nullptr, h.data(), y.data()), RMSNORM_STATUS_NULL_POINTER, "residual", outs, before);
  expect_refused(call(x.data(), res.data(), nullptr, y.data()), RMSNORM_STATUS_NULL_POINTER, "h", outs, before);
  expect_refused(rmsnorm_add_forward(&p, x.data(), c.cols, res.data(), c.cols - 1, w.data(), h.data(), c.cols,
                                     y.data(), c.cols, nullptr, &be),
                 RMSNORM_STATUS_INVALID_STRIDE, "residual_row_stride", outs, before);
  expect_refused(rmsnorm_add_forward(&p, x.data(), c.cols, res.data(), c.cols, w.data(), h.data(), c.cols - 1,
                                     y.data(), c.cols, nullptr, &be),
                 RMSNORM_STATUS_INVALID_STRIDE, "h_row_stride", outs, before);
  // x == residual exactly is allowed: h = T(2x).
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, call(x.data(), x.data(), h.data(), y.data())) << rmsnorm_last_error();
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k) EXPECT_EQ(h.get(r, k), 2.0 * x.get(r, k));
}

TEST(AddForward, ZeroRowsWriteNothing) {
  AddCase c;
  c.rows = 0;
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  unsigned char poison[64];
  std::memset(poison, 0xAB, sizeof(poison));
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_add_forward(&p, poison, c.cols, poison, c.cols, nullptr, poison, c.cols, poison, c.cols, nullptr, &be));
  for (unsigned char v : poison) EXPECT_EQ(v, 0xAB);
}

// rmsnorm_add_backward: gx = T(T(gx_norm) + g_h), with T(gx_norm) and gw bit for bit rmsnorm_backward's. In place
// over g_h and over gy as well; the g_h rules.
struct BackwardRun {
  HostMatrix gx;
  std::vector<float> gw;
};

BackwardRun run_backward(const AddCase& c, const HostMatrix& h, const HostMatrix& w, const HostMatrix& gy,
                         const HostMatrix* g_h, int32_t gw_mode, void* gx_target = nullptr) {
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(2);
  BackwardRun out;
  out.gx = HostMatrix(c.dtype, c.rows, c.cols);
  HostMatrix gw(gw_mode == RMSNORM_GW_STORE_F32 ? RMSNORM_DTYPE_F32 : c.dtype, 1, c.cols);
  size_t ws_bytes = 0;
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, gw_mode, &be, &ws_bytes));
  std::vector<float> ws(ws_bytes / 4 + 4);
  void* gxp = gx_target != nullptr ? gx_target : out.gx.data();
  void* gwp = gw_mode == RMSNORM_GW_NONE ? nullptr : gw.data();
  const rmsnorm_status_t st =
      g_h == nullptr
          ? rmsnorm_backward(&p, h.data(), h.stride, w.data(), gy.data(), gy.stride, nullptr, gxp, c.cols, gwp, gw_mode,
                             ws.data(), ws_bytes, &be)
          : rmsnorm_add_backward(&p, h.data(), h.stride, w.data(), gy.data(), gy.stride, nullptr, g_h->data(),
                                 g_h->stride, gxp, c.cols, gwp, gw_mode, ws.data(), ws_bytes, &be);
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS, st) << rmsnorm_last_error();
  if (gx_target != nullptr) std::memcpy(out.gx.data(), gx_target, out.gx.data_bytes());
  if (gwp != nullptr)
    for (int64_t k = 0; k < c.cols; ++k) out.gw.push_back(static_cast<float>(gw.get(0, k)));
  return out;
}

TEST(AddBackward, IsTheBackwardPlusTheResidualGradient) {
  std::mt19937_64 rng(35);
  for (int32_t dt : kDtypes)
    for (int64_t cols : {1, 9, 64, 1000})
      for (int64_t rows : {1, 5, 300})
        for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32}) {
          AddCase c;
          c.dtype = dt;
          c.rows = rows;
          c.cols = cols;
          SCOPED_TRACE(describe(c) + " gw_mode " + std::to_string(mode));
          HostMatrix h(dt, rows, cols), w(dt, 1, cols), gy(dt, rows, cols), gh(dt, rows, cols);
          harness::fill_normal(h, rng(), harness::hetero_row_scale);
          harness::fill_normal(w, rng(), {}, 1.0);
          harness::fill_normal(gy, rng());
          harness::fill_normal(gh, rng(), [](int64_t r) { return 0.5 * harness::hetero_row_scale(r + 2); });
          const BackwardRun plain = run_backward(c, h, w, gy, nullptr, mode);
          const BackwardRun fused = run_backward(c, h, w, gy, &gh, mode);
          HostMatrix want(dt, rows, cols);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cols; ++k)
              want.set(r, k, static_cast<float>(plain.gx.get(r, k)) + static_cast<float>(gh.get(r, k)));
          expect_same_values(fused.gx, want, "gx");
          EXPECT_TRUE(fused.gw == plain.gw) << "gw differs from rmsnorm_backward's";
          // In place over g_h, and over gy.
          HostMatrix gh2 = gh, gy2 = gy;
          const BackwardRun over_gh = run_backward(c, h, w, gy, &gh2, mode, gh2.data());
          expect_same_values(over_gh.gx, want, "gx written over g_h");
          const BackwardRun over_gy = run_backward(c, h, w, gy2, &gh, mode, gy2.data());
          expect_same_values(over_gy.gx, want, "gx written over gy");
          if (HasFatalFailure()) return;
        }
}

TEST(AddBackward, ResidualGradientRules) {
  AddCase c;
  c.rows = 4;
  c.cols = 16;
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  std::mt19937_64 rng(36);
  HostMatrix h(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols), gy(c.dtype, c.rows, c.cols), gx(c.dtype, c.rows, c.cols);
  HostMatrix big(c.dtype, 1, 2 * c.rows * c.cols);
  for (HostMatrix* m : {&h, &w, &gy, &big}) harness::fill_normal(*m, rng());
  char* b = static_cast<char*>(big.data());
  const size_t es = big.esize();
  const auto before = gx.storage;
  auto call = [&](const void* gyp, const void* ghp, void* gxp) {
    return rmsnorm_add_backward(&p, h.data(), c.cols, w.data(), gyp, c.cols, nullptr, ghp, c.cols, gxp, c.cols,
                                nullptr, RMSNORM_GW_NONE, nullptr, 0, &be);
  };
  EXPECT_EQ(RMSNORM_STATUS_NULL_POINTER, call(gy.data(), nullptr, gx.data()));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("g_h"), std::string::npos) << rmsnorm_last_error();
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, call(gy.data(), gy.data(), gx.data())) << "g_h == gy";
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, call(gy.data(), b, b + 8 * es)) << "gx partly over g_h";
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, call(gy.data(), h.data(), gx.data())) << "g_h == h";
  EXPECT_EQ(RMSNORM_STATUS_INVALID_STRIDE,
            rmsnorm_add_backward(&p, h.data(), c.cols, w.data(), gy.data(), c.cols, nullptr, big.data(), c.cols - 1,
                                 gx.data(), c.cols, nullptr, RMSNORM_GW_NONE, nullptr, 0, &be));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("g_h_row_stride"), std::string::npos) << rmsnorm_last_error();
  EXPECT_TRUE(gx.storage == before) << "a refused call wrote gx";
}

}  // namespace
}  // namespace rmsnorm::test
