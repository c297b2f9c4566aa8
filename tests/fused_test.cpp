// rmsnorm_add_forward and rmsnorm_add_backward on the CPU backend, through the C ABI: h = T(x + residual) (the sum in fp32, rounded once),
// y = rms_norm(h) * w'. Every element of h is checked exactly against that rule, computed here; y against the
// float64 reference of h as stored (the tests' tolerance model) and bit for bit against rmsnorm_forward of that h
// (the documented identity); rstd bit for bit against rmsnorm_forward's. Outputs start as NaN (HostMatrix's 0xFF
// storage), so an element left unwritten fails. Then the in-place forms, the overlap rules (nothing written when a
// call is refused), and rows == 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
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
#include "common/quant.hpp"
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
    for (int over : {0, 1})  // 0: h == x, 1: h == residual
    for (int64_t cols : {130, 1000}) {  // 1000: several of the CPU backend's 256-column blocks, the last partial
      AddCase c;
      c.dtype = dt;
      c.rows = 9;
      c.cols = cols;
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
  // The problem is checked before the operands: a bad eps with g_h NULL is the eps's error, in both add forms.
  rmsnorm_problem_t bad = p;
  bad.eps = -1.0f;
  EXPECT_EQ(RMSNORM_STATUS_INVALID_EPS,
            rmsnorm_add_backward(&bad, h.data(), c.cols, w.data(), gy.data(), c.cols, nullptr, nullptr, c.cols,
                                 gx.data(), c.cols, nullptr, RMSNORM_GW_NONE, nullptr, 0, &be));
  EXPECT_EQ(RMSNORM_STATUS_INVALID_EPS,
            rmsnorm_add_backward_x(&bad, h.data(), c.cols, w.data(), gy.data(), c.cols, nullptr, nullptr, c.cols,
                                   gx.data(), c.cols, gx.data(), c.cols, nullptr, RMSNORM_GW_NONE, nullptr, 0, &be));
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, call(gy.data(), gy.data(), gx.data())) << "g_h == gy";
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, call(gy.data(), b, b + 8 * es)) << "gx partly over g_h";
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, call(gy.data(), h.data(), gx.data())) << "g_h == h";
  EXPECT_EQ(RMSNORM_STATUS_INVALID_STRIDE,
            rmsnorm_add_backward(&p, h.data(), c.cols, w.data(), gy.data(), c.cols, nullptr, big.data(), c.cols - 1,
                                 gx.data(), c.cols, nullptr, RMSNORM_GW_NONE, nullptr, 0, &be));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("g_h_row_stride"), std::string::npos) << rmsnorm_last_error();
  EXPECT_TRUE(gx.storage == before) << "a refused call wrote gx";
}

// ---- quantized outputs ------------------------------------------------------------------------

// e4m3fn by its definition: code k (0..126) is m 2^-9 for exponent field 0, else (1 + m / 8) 2^(e - 7).
double fp8_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (code & 0x80) ? -mag : mag;
}

// The oracle: clamp to [-448, 448] (NaN to 448), then the nearest code by brute force, ties to the even code.
uint8_t fp8_oracle(float v) {
  double c = std::isnan(v) ? 448.0 : std::max(-448.0, std::min(448.0, static_cast<double>(v)));
  const bool neg = std::signbit(c);
  c = std::fabs(c);
  int best = 0;
  for (int k = 1; k <= 126; ++k) {
    const double d = std::fabs(fp8_value(k) - c), db = std::fabs(fp8_value(best) - c);
    if (d < db || (d == db && (k & 1) == 0)) best = k;
  }
  return static_cast<uint8_t>(best | (neg ? 0x80 : 0));
}

TEST(Quant, Fp8MatchesTheBruteForceOracle) {
  std::vector<float> vs = {0.0f, -0.0f, 448.0f, 449.0f, 464.0f, 480.0f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN,
                           std::ldexp(1.0f, -10), std::ldexp(1.0f, -9), std::ldexp(3.0f, -11), 1e-30f};
  for (uint32_t nan_bits : {0x7f800001u, 0x7fbfffffu, 0x7fc00001u})  // signalling and quiet: +448 whatever the sign
    vs.push_back(bits_float(nan_bits));
  for (int k = 0; k <= 126; ++k) {
    const float a = static_cast<float>(fp8_value(k));
    vs.push_back(a);
    if (k < 126) {
      const float mid = static_cast<float>((fp8_value(k) + fp8_value(k + 1)) / 2);  // exact in fp32: a tie
      vs.push_back(mid);
      vs.push_back(std::nextafter(mid, 0.0f));
      vs.push_back(std::nextafter(mid, 1000.0f));
    }
  }
  std::mt19937_64 rng(51);
  std::uniform_real_distribution<float> u(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) vs.push_back(std::exp2(u(rng)));
  for (float v : std::vector<float>(vs)) vs.push_back(-v);
  for (float v : vs) {
    const uint8_t got = quant::fp8_e4m3_saturated(v), want = fp8_oracle(v);
    ASSERT_EQ(got, want) << "v = " << v << ": got 0x" << std::hex << int(got) << " (" << fp8_value(got)
                         << ") expected 0x" << int(want) << " (" << fp8_value(want) << ")";
  }
}

TEST(Quant, Int8RoundsHalfToEvenAndSaturates) {
  const std::vector<std::pair<float, int>> cases = {
      {0.5f, 0},   {1.5f, 2},     {2.5f, 2},     {-0.5f, 0},   {-1.5f, -2},   {126.5f, 126}, {127.4f, 127},
      {127.5f, 127}, {200.0f, 127}, {-128.4f, -128}, {-129.0f, -128}, {-1e30f, -128}, {INFINITY, 127},
      {-INFINITY, -128}, {NAN, 0}, {-NAN, 0}, {bits_float(0x7f800001u), 0}, {bits_float(0xffbfffffu), 0},
      {0.49999997f, 0}, {3.0f, 3}, {1024.5f, 127}, {-1e6f, -128}, {-0.0f, 0}};
  for (const auto& [v, want] : cases) EXPECT_EQ(int(quant::int8_saturated(v)), want) << "v = " << v;
}

// The device's fp8 per-row divide, y / s by way of 1 / s (quant::quotient_by_inverse): the code it gives is the
// divided value's for every bf16 and every f16 y and random fp32 y, over scales from the smallest allowed up; and
// the quotient is the divided one, bit for bit, wherever |y / s| >= 2^-60 (below, only the fp8 code must agree).
// The bit check is the one with teeth: the uncorrected y * (1 / s) gives the same codes on these inputs (a review
// counted 0 code and 7.7 M bit mismatches), and a code can differ only where y / s sits on an e4m3 tie.
TEST(Quant, QuotientByInverseGivesTheDividedCode) {
  // The sign of zero: -0 / s is -0 (e4m3 code 0x80), which y - q0 s as the remainder would have lost.
  for (float s : {quant::kFp8MinScale, 1.0f, 1e30f}) {
    EXPECT_TRUE(std::signbit(quant::quotient_by_inverse(-0.0f, s, 1.0f / s))) << "s = " << s;
    EXPECT_TRUE(std::signbit(quant::corrected_quotient(-0.0f, s, 1.0f / s))) << "s = " << s;
    EXPECT_FALSE(std::signbit(quant::corrected_quotient(0.0f, s, 1.0f / s))) << "s = " << s;
  }
  // Where the correction alone is not y / s, quotients_finite says so.
  EXPECT_FALSE(quant::quotients_finite(INFINITY, 1.0f));
  EXPECT_FALSE(quant::quotients_finite(INFINITY, 0.0f));
  EXPECT_FALSE(quant::quotients_finite(1e30f, 1e9f));
  EXPECT_TRUE(quant::quotients_finite(448.0f, 1.0f));
  EXPECT_TRUE(std::isnan(quant::corrected_quotient(INFINITY, 1.0f, 1.0f)));
  EXPECT_EQ(quant::quotient_by_inverse(-INFINITY, 1.0f, 1.0f), -INFINITY);
  EXPECT_EQ(quant::quotient_by_inverse(-3e38f, 1e-5f, 1e5f), -INFINITY);
  std::mt19937_64 rng(73);
  std::vector<float> scales = {quant::kFp8MinScale, 1.0f, 0.5f, 3.0f, 1.0f / 448.0f, 1e-3f, 7.25e5f, 1e30f};
  std::uniform_real_distribution<float> lg(-20.0f, 40.0f);
  for (int i = 0; i < 150; ++i) scales.push_back(std::max(quant::kFp8MinScale, std::exp2(lg(rng)) / quant::kFp8Max));
  std::vector<float> ys;
  for (uint32_t b = 0; b < 65536; ++b) {
    float v;
    const uint32_t u = b << 16;
    std::memcpy(&v, &u, 4);
    ys.push_back(v);  // every bf16
    ys.push_back(half_to_float(static_cast<uint16_t>(b)));  // every f16
  }
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    float v;
    const uint32_t u = bits(rng);
    std::memcpy(&v, &u, 4);
    ys.push_back(v);
  }
  for (float s : scales) {
    const float inv = 1.0f / s;
    for (float y : ys) {
      const float want = y / s, got = quant::quotient_by_inverse(y, s, inv);
      const uint8_t cw = quant::fp8_e4m3_saturated(want), cg = quant::fp8_e4m3_saturated(got);
      ASSERT_EQ(cg, cw) << "y = " << y << ", s = " << s << ": " << got << " against " << want;
      // The correction alone, as the device runs it for a row whose max|y| passes quotients_finite (y's own
      // |y| standing for the row's max: the largest quotient the rule admits).
      const bool finite = quant::quotients_finite(std::isnan(y) ? 0.0f : std::fabs(y), inv);
      const float fast = quant::corrected_quotient(y, s, inv);
      if (finite) {
        ASSERT_EQ(quant::fp8_e4m3_saturated(fast), cw) << "y = " << y << ", s = " << s << ": corrected " << fast;
      }
      if (!(std::fabs(want) >= 0x1p-60f) || std::isnan(want)) continue;
      uint32_t uw, ug, uf;
      std::memcpy(&uw, &want, 4);
      std::memcpy(&ug, &got, 4);
      std::memcpy(&uf, &fast, 4);
      ASSERT_EQ(ug, uw) << "y = " << y << ", s = " << s << ": " << got << " against " << want;
      if (finite) {
        ASSERT_EQ(uf, uw) << "y = " << y << ", s = " << s << ": corrected " << fast << " against " << want;
      }
    }
  }
}

struct QuantRun {
  std::vector<uint8_t> q;
  std::vector<float> scales, rstd;
  rmsnorm_status_t status;
};

QuantRun run_quant(const AddCase& c, const HostMatrix& x, const HostMatrix& w, int32_t kind, int32_t mode, float scale,
                   const float* ub) {
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(2);
  QuantRun r;
  r.q.assign(static_cast<size_t>(c.rows * (c.cols + 5)), 0xAB);
  r.scales.assign(static_cast<size_t>(c.rows), std::nanf(""));
  r.rstd.assign(static_cast<size_t>(c.rows), std::nanf(""));
  rmsnorm_quant_t qt;
  qt.kind = kind;
  qt.scale_mode = mode;
  qt.scale = &scale;
  qt.row_scales = r.scales.data();
  qt.scale_ub = ub;
  r.status = rmsnorm_forward_quant(&p, x.data(), x.stride, c.weight ? w.data() : nullptr, &qt, r.q.data(), c.cols + 5,
                                   r.rstd.data(), &be);
  return r;
}

// q is the documented rule applied to rmsnorm_forward's y (computed here from that y, with the oracle above), the
// scales the documented formula, rstd the forward's; the row padding of q is left alone.
TEST(Quant, ForwardQuantIsTheRuleAppliedToTheForwardsY) {
  std::mt19937_64 rng(52);
  for (int32_t dt : kDtypes)
    for (int64_t cols : {1, 7, 64, 1000})
      for (uint32_t flags : {0u, static_cast<uint32_t>(RMSNORM_FLAG_ROUND_XHAT)}) {
        AddCase c;
        c.dtype = dt;
        c.rows = 9;
        c.cols = cols;
        c.flags = flags;
        HostMatrix x(dt, c.rows, cols), w(dt, 1, cols);
        harness::fill_normal(x, rng(), harness::hetero_row_scale);
        harness::fill_normal(w, rng(), {}, 1.0);
        for (int64_t k = 0; k < cols; ++k) x.set(2, k, 0.0);  // an all-zero row: the smallest scale
        // y as the forward stores it.
        const rmsnorm_problem_t p = problem(c);
        const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
        HostMatrix y(dt, c.rows, cols);
        std::vector<float> rstd(static_cast<size_t>(c.rows));
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                  rmsnorm_forward(&p, x.data(), cols, w.data(), y.data(), cols, rstd.data(), &be));
        const float ub_value = 0.5f;
        for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8})
          for (int32_t mode : {RMSNORM_QUANT_STATIC, RMSNORM_QUANT_PER_ROW})
            for (bool with_ub : {false, true}) {
              if (with_ub && !(kind == RMSNORM_QUANT_FP8_E4M3 && mode == RMSNORM_QUANT_PER_ROW)) continue;
              SCOPED_TRACE(describe(c) + " kind " + std::to_string(kind) + " mode " + std::to_string(mode) +
                           (with_ub ? " ub" : ""));
              const bool fp8 = kind == RMSNORM_QUANT_FP8_E4M3;
              const float scale = 0.037f;
              const QuantRun r = run_quant(c, x, w, kind, mode, scale, with_ub ? &ub_value : nullptr);
              ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
              EXPECT_EQ(0, std::memcmp(r.rstd.data(), rstd.data(), rstd.size() * sizeof(float)));
              for (int64_t i = 0; i < c.rows; ++i) {
                float s = 0.0f;
                if (mode == RMSNORM_QUANT_PER_ROW) {
                  double amax = 0.0;
                  for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(y.get(i, k)));
                  float a = static_cast<float>(amax);
                  if (with_ub) a = std::min(a, ub_value);
                  s = std::max(a / (fp8 ? 448.0f : 127.0f), fp8 ? 1.0f / (448.0f * 512.0f) : FLT_EPSILON);
                  ASSERT_EQ(r.scales[static_cast<size_t>(i)], s) << "row " << i;
                }
                for (int64_t k = 0; k < cols; ++k) {
                  const float yv = static_cast<float>(y.get(i, k));
                  const float v = mode == RMSNORM_QUANT_STATIC ? yv * (1.0f / scale) : fp8 ? yv / s : yv * (1.0f / s);
                  int want;
                  if (fp8) {
                    want = fp8_oracle(v);
                  } else {
                    want = std::isnan(v) ? 0 : static_cast<int>(std::max(-128.0f, std::min(127.0f, std::nearbyint(v))));
                    want &= 0xFF;
                  }
                  ASSERT_EQ(int(r.q[static_cast<size_t>(i * (cols + 5) + k)]), want)
                      << "row " << i << " col " << k << " y " << yv << " v " << v;
                }
                for (int64_t k = cols; k < cols + 5; ++k)
                  ASSERT_EQ(r.q[static_cast<size_t>(i * (cols + 5) + k)], 0xAB) << "padding written, row " << i;
              }
              if (mode == RMSNORM_QUANT_PER_ROW) {
                EXPECT_EQ(r.scales[2], fp8 ? 1.0f / (448.0f * 512.0f) : FLT_EPSILON);
              }
            }
      }
}

// A NaN in a row makes its every y NaN: max|y| is 0, the scale the smallest, and q 448 (fp8) or 0 (int8).
TEST(Quant, NanRow) {
  AddCase c;
  c.dtype = RMSNORM_DTYPE_F32;
  c.rows = 2;
  c.cols = 8;
  HostMatrix x(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols);
  for (int64_t k = 0; k < c.cols; ++k) {
    x.set(0, k, 1.0 + k);
    x.set(1, k, 1.0 + k);
    w.set(0, k, 1.0);
  }
  x.set(1, 3, NAN);
  const QuantRun f = run_quant(c, x, w, RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, 1.0f, nullptr);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, f.status) << rmsnorm_last_error();
  EXPECT_EQ(f.scales[1], 1.0f / (448.0f * 512.0f));
  for (int64_t k = 0; k < c.cols; ++k) EXPECT_EQ(f.q[static_cast<size_t>(c.cols + 5 + k)], 0x7E) << k;
  const QuantRun n = run_quant(c, x, w, RMSNORM_QUANT_INT8, RMSNORM_QUANT_PER_ROW, 1.0f, nullptr);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, n.status);
  for (int64_t k = 0; k < c.cols; ++k) EXPECT_EQ(n.q[static_cast<size_t>(c.cols + 5 + k)], 0) << k;
}

// int8 per row is y * (1 / s), not y / s: at 1024 x 256 bf16 the two round apart at dozens of elements (counted
// here, so that the case is known to tell them apart), and every q must be the former.
TEST(Quant, Int8PerRowMultipliesByTheInverse) {
  std::mt19937_64 rng(56);
  AddCase c;
  c.dtype = RMSNORM_DTYPE_BF16;
  c.rows = 1024;
  c.cols = 256;
  HostMatrix x(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols), y(c.dtype, c.rows, c.cols);
  harness::fill_normal(x, rng(), harness::hetero_row_scale);
  harness::fill_normal(w, rng(), {}, 1.0);
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, x.data(), c.cols, w.data(), y.data(), c.cols, nullptr, &be));
  const QuantRun r = run_quant(c, x, w, RMSNORM_QUANT_INT8, RMSNORM_QUANT_PER_ROW, 1.0f, nullptr);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
  int64_t apart = 0;
  for (int64_t i = 0; i < c.rows; ++i) {
    const float s = r.scales[static_cast<size_t>(i)];
    for (int64_t k = 0; k < c.cols; ++k) {
      const float yv = static_cast<float>(y.get(i, k));
      const int by_inverse = static_cast<int>(std::max(-128.0f, std::min(127.0f, std::nearbyint(yv * (1.0f / s)))));
      const int by_division = static_cast<int>(std::max(-128.0f, std::min(127.0f, std::nearbyint(yv / s))));
      apart += by_inverse != by_division;
      ASSERT_EQ(int(static_cast<int8_t>(r.q[static_cast<size_t>(i * (c.cols + 5) + k)])), by_inverse)
          << "row " << i << " col " << k << " y " << yv << " s " << s;
    }
  }
  EXPECT_GT(apart, 0) << "no element tells y * (1 / s) from y / s: the case does not test the rule";
}

// A NaN weight makes y NaN in that column of every row, and only there: the row's max|y| ignores it (the scale is
// that of the other columns) and the column's q is 448's code (fp8) or 0 (int8). The NaN columns include the last,
// so that a running max that took a NaN in would end on it.
TEST(Quant, NanColumnIsIgnoredByTheRowMax) {
  std::mt19937_64 rng(57);
  AddCase c;
  c.dtype = RMSNORM_DTYPE_F32;
  c.rows = 6;
  c.cols = 40;
  HostMatrix x(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols), y(c.dtype, c.rows, c.cols);
  harness::fill_normal(x, rng(), harness::hetero_row_scale);
  harness::fill_normal(w, rng(), {}, 1.0);
  const int64_t nan_cols[] = {7, c.cols - 1};
  for (int64_t k : nan_cols) w.set(0, k, NAN);
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, x.data(), c.cols, w.data(), y.data(), c.cols, nullptr, &be));
  for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8}) {
    const bool fp8 = kind == RMSNORM_QUANT_FP8_E4M3;
    const QuantRun r = run_quant(c, x, w, kind, RMSNORM_QUANT_PER_ROW, 1.0f, nullptr);
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
    for (int64_t i = 0; i < c.rows; ++i) {
      float amax = 0.0f;
      for (int64_t k = 0; k < c.cols; ++k) {
        const float v = std::fabs(static_cast<float>(y.get(i, k)));
        if (!std::isnan(v) && v > amax) amax = v;
      }
      ASSERT_GT(amax, 0.0f);
      const float s = std::max(amax / (fp8 ? 448.0f : 127.0f), fp8 ? 1.0f / (448.0f * 512.0f) : FLT_EPSILON);
      ASSERT_EQ(r.scales[static_cast<size_t>(i)], s) << (fp8 ? "fp8" : "int8") << " row " << i;
      for (int64_t k : nan_cols)
        ASSERT_EQ(int(r.q[static_cast<size_t>(i * (c.cols + 5) + k)]), fp8 ? 0x7E : 0) << "row " << i << " col " << k;
    }
  }
}

// rmsnorm_add_forward_quant: h exactly by the rule, then q, the row scales and rstd bit for bit
// rmsnorm_forward_quant's of that h; in place over x and over residual; q overlapping h refused with nothing written.
TEST(Quant, AddForwardQuantIsTheQuantOfH) {
  std::mt19937_64 rng(54);
  for (int32_t dt : kDtypes)
    for (int64_t cols : {1, 7, 64, 1000})
      for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8})
        for (int over : {0, 1, 2}) {  // h: its own buffer, over residual, over x
          AddCase c;
          c.dtype = dt;
          c.rows = 9;
          c.cols = cols;
          SCOPED_TRACE(describe(c) + " kind " + std::to_string(kind) + " over " + std::to_string(over));
          HostMatrix x(dt, c.rows, cols), res(dt, c.rows, cols), w(dt, 1, cols);
          harness::fill_normal(x, rng(), harness::hetero_row_scale);
          harness::fill_normal(res, rng());
          harness::fill_normal(w, rng(), {}, 1.0);
          const HostMatrix h_want = expected_h(c, x, res);
          HostMatrix h(dt, c.rows, cols), x_io = x, res_io = res;
          void* hp = over == 1 ? res_io.data() : over == 2 ? x_io.data() : h.data();
          const rmsnorm_problem_t p = problem(c);
          const rmsnorm_backend_t be = rmsnorm_backend_cpu(2);
          std::vector<uint8_t> q(static_cast<size_t>(c.rows * cols), 0xAB), q_want(q.size(), 0xCD);
          std::vector<float> s(static_cast<size_t>(c.rows), NAN), s_want(s.size(), NAN);
          std::vector<float> r(static_cast<size_t>(c.rows), NAN), r_want(r.size(), NAN);
          rmsnorm_quant_t qt{kind, RMSNORM_QUANT_PER_ROW, nullptr, s.data(), nullptr};
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                    rmsnorm_add_forward_quant(&p, x_io.data(), cols, res_io.data(), cols, w.data(), hp, cols, &qt,
                                              q.data(), cols, r.data(), &be))
              << rmsnorm_last_error();
          const HostMatrix& h_got = over == 1 ? res_io : over == 2 ? x_io : h;
          expect_same_values(h_got, h_want, "h");
          if (HasFatalFailure()) return;
          qt.row_scales = s_want.data();
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward_quant(&p, h_want.data(), cols, w.data(), &qt, q_want.data(),
                                                                  cols, r_want.data(), &be));
          EXPECT_EQ(q, q_want) << "q differs from rmsnorm_forward_quant of h";
          EXPECT_EQ(0, std::memcmp(s.data(), s_want.data(), s.size() * 4)) << "row scales";
          EXPECT_EQ(0, std::memcmp(r.data(), r_want.data(), r.size() * 4)) << "rstd";
        }
  // q over h: refused, nothing written.
  AddCase c;
  c.dtype = RMSNORM_DTYPE_F32;
  c.rows = 2;
  c.cols = 16;
  HostMatrix x(c.dtype, c.rows, c.cols), res(c.dtype, c.rows, c.cols), h(c.dtype, c.rows, c.cols);
  harness::fill_normal(x, 3);
  harness::fill_normal(res, 4);
  const HostMatrix h0 = h;
  std::vector<float> s(2);
  rmsnorm_quant_t qt{RMSNORM_QUANT_INT8, RMSNORM_QUANT_PER_ROW, nullptr, s.data(), nullptr};
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, rmsnorm_add_forward_quant(&p, x.data(), c.cols, res.data(), c.cols, nullptr,
                                                              h.data(), c.cols, &qt, h.data(), c.cols, nullptr, &be));
  EXPECT_EQ(0, std::memcmp(h.storage.data(), h0.storage.data(), h.storage.size())) << "written although refused";
  EXPECT_EQ(RMSNORM_STATUS_NULL_POINTER, rmsnorm_add_forward_quant(&p, x.data(), c.cols, nullptr, c.cols, nullptr,
                                                                   h.data(), c.cols, &qt, h.data(), c.cols, nullptr, &be));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("residual"), std::string::npos) << rmsnorm_last_error();
}

TEST(Quant, ArgumentRules) {
  AddCase c;
  c.rows = 3;
  c.cols = 16;
  HostMatrix x(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols);
  std::mt19937_64 rng(53);
  harness::fill_normal(x, rng());
  harness::fill_normal(w, rng());
  const float ub = 1.0f;
  auto expect = [&](rmsnorm_status_t st, const char* arg, const QuantRun& r) {
    EXPECT_EQ(r.status, st) << rmsnorm_last_error();
    EXPECT_NE(std::string(rmsnorm_last_error()).find(arg), std::string::npos) << rmsnorm_last_error();
    for (uint8_t v : r.q) EXPECT_EQ(v, 0xAB);
  };
  expect(RMSNORM_STATUS_INVALID_OPTION, "quant.kind", run_quant(c, x, w, 7, RMSNORM_QUANT_STATIC, 1.0f, nullptr));
  expect(RMSNORM_STATUS_INVALID_OPTION, "quant.scale_mode",
         run_quant(c, x, w, RMSNORM_QUANT_INT8, 5, 1.0f, nullptr));
  expect(RMSNORM_STATUS_INVALID_OPTION, "quant.scale_ub",
         run_quant(c, x, w, RMSNORM_QUANT_INT8, RMSNORM_QUANT_PER_ROW, 1.0f, &ub));
  expect(RMSNORM_STATUS_INVALID_OPTION, "quant.scale_ub",
         run_quant(c, x, w, RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_STATIC, 1.0f, &ub));
  // q over x.
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  float scale = 1.0f;
  rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_STATIC, &scale, nullptr, nullptr};
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP,
            rmsnorm_forward_quant(&p, x.data(), c.cols, w.data(), &qt, x.data(), c.cols, nullptr, &be));
  qt.scale = nullptr;
  EXPECT_EQ(RMSNORM_STATUS_NULL_POINTER,
            rmsnorm_forward_quant(&p, x.data(), c.cols, w.data(), &qt, x.data(), c.cols, nullptr, &be));
  EXPECT_EQ(RMSNORM_STATUS_NULL_POINTER,
            rmsnorm_forward_quant(&p, x.data(), c.cols, w.data(), nullptr, x.data(), c.cols, nullptr, &be));
}

// Each scale mode reads one of quant.scale and quant.row_scales; the other is ignored, as rmsnorm.h says: a
// misaligned pointer there (which would be MISALIGNED where it is read) changes neither the status nor q.
TEST(Quant, TheOtherModesPointerIsIgnored) {
  AddCase c;
  c.rows = 3;
  c.cols = 40;
  HostMatrix x(c.dtype, c.rows, c.cols), w(c.dtype, 1, c.cols);
  std::mt19937_64 rng(71);
  harness::fill_normal(x, rng());
  harness::fill_normal(w, rng());
  const rmsnorm_problem_t p = problem(c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  alignas(16) unsigned char junk[32] = {};
  float* const misaligned = reinterpret_cast<float*>(junk + 1);  // never dereferenced
  auto run = [&](const rmsnorm_quant_t& qt, std::vector<uint8_t>* q) {
    q->assign(static_cast<size_t>(c.rows * c.cols), 0xAB);
    return rmsnorm_forward_quant(&p, x.data(), c.cols, w.data(), &qt, q->data(), c.cols, nullptr, &be);
  };
  for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8}) {
    SCOPED_TRACE(kind == RMSNORM_QUANT_INT8 ? "int8" : "fp8");
    const float scale = 0.05f;
    std::vector<uint8_t> q_want, q;
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, run({kind, RMSNORM_QUANT_STATIC, &scale, nullptr, nullptr}, &q_want))
        << rmsnorm_last_error();
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS, run({kind, RMSNORM_QUANT_STATIC, &scale, misaligned, nullptr}, &q))
        << "static with a misaligned row_scales: " << rmsnorm_last_error();
    EXPECT_EQ(q, q_want);
    std::vector<float> s_want(static_cast<size_t>(c.rows)), s(static_cast<size_t>(c.rows));
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, run({kind, RMSNORM_QUANT_PER_ROW, nullptr, s_want.data(), nullptr}, &q_want))
        << rmsnorm_last_error();
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS, run({kind, RMSNORM_QUANT_PER_ROW, misaligned, s.data(), nullptr}, &q))
        << "per row with a misaligned scale: " << rmsnorm_last_error();
    EXPECT_EQ(q, q_want);
    EXPECT_EQ(0, std::memcmp(s.data(), s_want.data(), s.size() * sizeof(float)));
  }
}

// ---- block scales (rmsnorm_forward_block_quant) -----------------------------------------------------------------
//
// The expected values come from the documented identity and the rules, not from the call under test: y is
// rmsnorm_forward's (same problem, weight and flags); per block of row r, max|y| with NaN skipped, the scale
// quant::row_scale of it (itself checked against the header's formula), fp8 bytes by the brute-force oracle of y / s,
// int8 bytes nearest-even and saturated of y * (1 / s) (quant::int8_saturated, checked against a clamp of nearbyint).
// q and the scales buffer start as poison, so a scale at a wrong address or an element nobody wrote fails, and every
// float of the buffer that is not a scale (a layout's padding, a guard after it) must keep its poison bits.

enum class ScaleLayout { kRowMajor, kColMajor };

struct BlockCase {
  AddCase c;
  int32_t kind = RMSNORM_QUANT_FP8_E4M3;
  int32_t block_cols = 128;
  ScaleLayout layout = ScaleLayout::kRowMajor;
  bool padded = true;  // strides past the smallest: row-major nb + 3, column-major rows + 2
  bool ub = false;     // fp8: scale_ub = kBlockUb
};

// Below the max|y| of most full blocks and above that of many short ones, so that both sides of the bound are taken
// (EveryScaleAndByteByTheRule counts them).
const float kBlockUb = 2.0f;

bool block_fp8(const BlockCase& b) { return b.kind == RMSNORM_QUANT_FP8_E4M3; }
// The smallest scale as the header states it, written out here rather than taken from quant.hpp.
float block_min_scale(const BlockCase& b) { return block_fp8(b) ? 1.0f / (448.0f * 512.0f) : FLT_EPSILON; }
int64_t num_blocks(const BlockCase& b) { return (b.c.cols + b.block_cols - 1) / b.block_cols; }
int64_t scales_row_stride(const BlockCase& b) {
  return b.layout == ScaleLayout::kRowMajor ? num_blocks(b) + (b.padded ? 3 : 0) : 1;
}
int64_t scales_block_stride(const BlockCase& b) {
  return b.layout == ScaleLayout::kRowMajor ? 1 : b.c.rows + (b.padded ? 2 : 0);
}
// The layout's whole matrix, padding included, and 4 guard floats after it.
int64_t scales_floats(const BlockCase& b) {
  const int64_t m = b.layout == ScaleLayout::kRowMajor ? b.c.rows * scales_row_stride(b)
                                                       : num_blocks(b) * scales_block_stride(b);
  return m + 4;
}
int64_t block_q_stride(const BlockCase& b) { return b.c.cols + 5; }  // 5 bytes of row padding, poisoned

std::string describe(const BlockCase& b) {
  std::ostringstream os;
  os << describe(b.c) << (block_fp8(b) ? " fp8" : " int8") << " block " << b.block_cols
     << (b.layout == ScaleLayout::kRowMajor ? " row-major" : " column-major") << " (rs " << scales_row_stride(b)
     << ", bs " << scales_block_stride(b) << ")" << (b.ub ? " scale_ub" : "");
  return os.str();
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The outputs of one call, poisoned: q's bytes (0xAB) in the storage of an f32 matrix (which also keeps the floats
// aligned), the scales and rstd NaN (0xFF bytes); HostMatrix so that expect_refused can compare them.
struct BlockRun {
  HostMatrix q, scales, rstd;
  rmsnorm_status_t status = RMSNORM_STATUS_SUCCESS;
  uint8_t* q_bytes() { return static_cast<uint8_t*>(q.data()); }
  const uint8_t* q_bytes() const { return static_cast<const uint8_t*>(q.data()); }
  float* scale_data() { return static_cast<float*>(scales.data()); }
  const float* scale_data() const { return static_cast<const float*>(scales.data()); }
  float* rstd_data() { return static_cast<float*>(rstd.data()); }
  const float* rstd_data() const { return static_cast<const float*>(rstd.data()); }
};

BlockRun block_outputs(const BlockCase& b) {
  BlockRun r;
  r.q = HostMatrix(RMSNORM_DTYPE_F32, 1, (b.c.rows * block_q_stride(b) + 3) / 4);
  std::fill(r.q.storage.begin(), r.q.storage.end(), static_cast<unsigned char>(0xAB));
  r.scales = HostMatrix(RMSNORM_DTYPE_F32, 1, scales_floats(b));
  r.rstd = HostMatrix(RMSNORM_DTYPE_F32, 1, std::max<int64_t>(b.c.rows, 1));
  return r;
}

rmsnorm_block_quant_t block_quant(const BlockCase& b, BlockRun& r) {
  rmsnorm_block_quant_t qt;
  qt.kind = b.kind;
  qt.block_cols = b.block_cols;
  qt.scales = r.scale_data();
  qt.scales_row_stride = scales_row_stride(b);
  qt.scales_block_stride = scales_block_stride(b);
  qt.scale_ub = b.ub ? &kBlockUb : nullptr;
  return qt;
}

BlockRun run_block_quant(const BlockCase& b, const HostMatrix& x, const HostMatrix* w) {
  BlockRun r = block_outputs(b);
  const rmsnorm_block_quant_t qt = block_quant(b, r);
  const rmsnorm_problem_t p = problem(b.c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(2);  // rows split over two threads: each writes its own scales
  r.status = rmsnorm_forward_block_quant(&p, x.data(), x.stride, w != nullptr ? w->data() : nullptr, &qt,
                                         r.q_bytes(), block_q_stride(b), r.rstd_data(), &be);
  return r;
}

// Exact comparisons over many elements: how many were checked and failed, and the first failure described.
struct Tally {
  explicit Tally(const char* n) : name(n) {}
  const char* name;
  int64_t checked = 0, bad = 0;
  std::string first;
  template <typename Describe>
  void add(bool ok, Describe&& describe_failure) {
    ++checked;
    if (!ok && bad++ == 0) first = describe_failure();
  }
};

void expect_clean(const Tally& t) {
  EXPECT_EQ(t.bad, 0) << t.name << ": " << t.bad << " of " << t.checked << " differ; the first: " << t.first;
}

std::string hex_byte(int v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// How often the fp8 bound clipped a block's max|y| (scale_ub taken) and how often not.
struct UbCount {
  int64_t clipped = 0, unclipped = 0;
};

// Every output of r (a successful rmsnorm_forward_block_quant of x, w under b) against the rule applied to
// rmsnorm_forward's y, as this section's opening comment says.
void check_block_quant(const BlockCase& b, const HostMatrix& x, const HostMatrix* w, const BlockRun& r,
                       UbCount* ub_count = nullptr) {
  const int64_t rows = b.c.rows, cols = b.c.cols, bc = b.block_cols, nb = num_blocks(b);
  const int64_t rs = scales_row_stride(b), bs = scales_block_stride(b), qs = block_q_stride(b);
  const rmsnorm_problem_t p = problem(b.c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  HostMatrix y(b.c.dtype, rows, cols);
  std::vector<float> rstd(static_cast<size_t>(rows), std::nanf(""));
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, x.data(), x.stride, w != nullptr ? w->data() : nullptr,
                                                     y.data(), y.stride, rstd.data(), &be))
      << rmsnorm_last_error();
  const bool fp8 = block_fp8(b);
  const float qmax = fp8 ? 448.0f : 127.0f, min_scale = block_min_scale(b);
  const float* ub = b.ub ? &kBlockUb : nullptr;
  const float* scales = r.scale_data();
  const uint8_t* q = r.q_bytes();
  const int64_t n_floats = static_cast<int64_t>(r.scales.storage.size() / 4);
  std::vector<char> is_scale(static_cast<size_t>(n_floats), 0);
  Tally t_rstd{"rstd (against rmsnorm_forward's)"}, t_rule{"quant.hpp's rule against the header's formula"},
      t_scale{"scale"}, t_q{"q"}, t_q_pad{"q bytes outside the rows x cols matrix"},
      t_s_pad{"scales buffer floats that are not a scale (padding, guard)"};
  for (int64_t i = 0; i < rows; ++i) {
    t_rstd.add(float_bits(r.rstd_data()[i]) == float_bits(rstd[static_cast<size_t>(i)]), [&] {
      std::ostringstream os;
      os << "row " << i << ": got " << r.rstd_data()[i] << " expected " << rstd[static_cast<size_t>(i)];
      return os.str();
    });
    for (int64_t blk = 0; blk < nb; ++blk) {
      const int64_t j0 = blk * bc, j1 = std::min(cols, j0 + bc);
      float amax = 0.0f;
      for (int64_t j = j0; j < j1; ++j) {
        const float v = std::fabs(static_cast<float>(y.get(i, j)));
        if (v > amax) amax = v;  // a NaN fails the comparison: skipped, as fmaxf skips it
      }
      const float s = quant::row_scale(amax, ub, fp8);
      const float formula = std::max((ub != nullptr ? std::min(amax, *ub) : amax) / qmax, min_scale);
      t_rule.add(float_bits(s) == float_bits(formula), [&] {
        std::ostringstream os;
        os << "scale of max|y| " << amax << ": row_scale " << s << ", the formula " << formula;
        return os.str();
      });
      if (ub_count != nullptr && ub != nullptr) ++(amax > *ub ? ub_count->clipped : ub_count->unclipped);
      const int64_t at = i * rs + blk * bs;
      ASSERT_TRUE(at >= 0 && at < n_floats && is_scale[static_cast<size_t>(at)] == 0) << "test layout, at " << at;
      is_scale[static_cast<size_t>(at)] = 1;
      t_scale.add(float_bits(scales[at]) == float_bits(s), [&] {
        std::ostringstream os;
        os << "row " << i << " block " << blk << " (cols " << j0 << ".." << j1 - 1 << ", scales[" << at
           << "]): got " << scales[at] << " expected " << s << " (max|y| " << amax << ")";
        return os.str();
      });
      for (int64_t j = j0; j < j1; ++j) {
        const float yv = static_cast<float>(y.get(i, j));
        float v;
        int want;
        if (fp8) {
          v = yv / s;
          want = fp8_oracle(v);
        } else {
          v = yv * (1.0f / s);
          want = quant::int8_saturated(v) & 0xFF;
          const int plain =
              std::isnan(v) ? 0 : static_cast<int>(std::max(-128.0f, std::min(127.0f, std::nearbyint(v))));
          t_rule.add(want == (plain & 0xFF), [&] {
            std::ostringstream os;
            os << "int8 of " << v << ": int8_saturated " << want << ", clamped nearbyint " << plain;
            return os.str();
          });
        }
        const int got = q[i * qs + j];
        t_q.add(got == want, [&] {
          std::ostringstream os;
          os << "row " << i << " col " << j << " (block " << blk << ", scale " << s << "): got " << hex_byte(got)
             << " expected " << hex_byte(want) << " (y " << yv << ", v " << v << ")";
          return os.str();
        });
      }
    }
  }
  // The rest of both buffers: q's row padding and tail, and every float of the scales buffer that holds no scale.
  for (size_t k = 0; k < r.q.storage.size(); ++k) {
    const int64_t row = static_cast<int64_t>(k) / qs, col = static_cast<int64_t>(k) % qs;
    if (row < rows && col < cols) continue;
    t_q_pad.add(r.q.storage[k] == 0xAB, [&] { return "byte " + std::to_string(k) + ": " + hex_byte(r.q.storage[k]); });
  }
  for (int64_t k = 0; k < n_floats; ++k) {
    if (is_scale[static_cast<size_t>(k)] != 0) continue;
    t_s_pad.add(float_bits(scales[k]) == 0xFFFFFFFFu, [&] {
      std::ostringstream os;
      os << "scales[" << k << "] = " << scales[k];
      return os.str();
    });
  }
  for (const Tally* t : {&t_rstd, &t_rule, &t_scale, &t_q, &t_q_pad, &t_s_pad}) expect_clean(*t);
}

// x for the block tests: rows of different scales, and three rows built to catch a block loop that mixes blocks
// up. Row 0: its second block all zero (that scale the smallest). Row 1: all zero (every scale the smallest). Row 2:
// its last block (often a short one) of magnitude 1000-1875 times the row's scale, the rest N(0, scale), so that
// without a weight or a bound its scale is over 100 times every other block's.
HostMatrix block_input(const BlockCase& b, uint64_t seed) {
  HostMatrix x = matrix(b.c, 0);
  harness::fill_normal(x, seed, harness::hetero_row_scale);
  const int64_t cols = b.c.cols, bc = b.block_cols, nb = num_blocks(b);
  if (nb >= 2)
    for (int64_t j = bc; j < std::min(cols, 2 * bc); ++j) x.set(0, j, 0.0);
  if (b.c.rows > 1)
    for (int64_t j = 0; j < cols; ++j) x.set(1, j, 0.0);
  if (b.c.rows > 2 && nb >= 2)
    for (int64_t j = (nb - 1) * bc; j < cols; ++j)
      x.set(2, j, (j % 2 == 0 ? 1000.0 : -1000.0) * (1.0 + (j % 8) / 8.0) * harness::hetero_row_scale(2));
  return x;
}

// The stressed rows' scales by what they were built for, apart from the rule check.
void expect_stressed_rows(const BlockCase& b, const BlockRun& r, bool weight) {
  const int64_t nb = num_blocks(b), rs = scales_row_stride(b), bs = scales_block_stride(b);
  const float* s = r.scale_data();
  const float smallest = block_min_scale(b);
  if (nb >= 2) {
    EXPECT_EQ(s[0 * rs + 1 * bs], smallest) << "row 0's zero block";
  }
  if (b.c.rows > 1) {
    for (int64_t blk = 0; blk < nb; ++blk) EXPECT_EQ(s[1 * rs + blk * bs], smallest) << "zero row, block " << blk;
  }
  if (b.c.rows > 2 && nb >= 2 && !weight && !b.ub) {
    const float big = s[2 * rs + (nb - 1) * bs];
    for (int64_t blk = 0; blk + 1 < nb; ++blk)
      EXPECT_GT(big, 100.0f * s[2 * rs + blk * bs]) << "row 2: block " << blk << " against the large last block";
  }
}

// D: below, at and past one block of 64 and of 128 (a short last block, one column long at 65 and 129), several
// blocks, and 1000 (a short last block of 40 or 104). Rows: one, the three stressed rows and one more, and 37 split
// over two threads. Both layouts padded, every kind and block size, with and without a weight and (fp8) a bound. One
// test per dtype (the fp8 oracle's brute force makes each take about 2 s), so that ctest -j runs them side by side.
void every_scale_and_byte(int32_t dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  UbCount ub_count;
  for (int64_t cols : {1, 63, 64, 65, 127, 128, 129, 200, 256, 1000})
    for (int64_t rows : {1, 4, 37})
      for (int32_t bc : {64, 128}) {
        BlockCase b;
        b.c.dtype = dt;
        b.c.rows = rows;
        b.c.cols = cols;
        b.c.strided = (cols + rows) % 2 == 1;  // x with a row stride > cols and a base offset
        b.block_cols = bc;
        const HostMatrix x = block_input(b, rng());
        HostMatrix w(dt, 1, cols);
        harness::fill_normal(w, rng(), {}, 1.0);
        for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8})
          for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kColMajor})
            for (bool weight : {true, false})
              for (bool ub : {false, true}) {
                if (ub && kind != RMSNORM_QUANT_FP8_E4M3) continue;
                b.kind = kind;
                b.layout = layout;
                b.c.weight = weight;
                b.ub = ub;
                SCOPED_TRACE(describe(b));
                const BlockRun r = run_block_quant(b, x, weight ? &w : nullptr);
                ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
                check_block_quant(b, x, weight ? &w : nullptr, r, &ub_count);
                expect_stressed_rows(b, r, weight);
                if (::testing::Test::HasFailure()) return;
              }
      }
  EXPECT_GT(ub_count.clipped, 0) << "scale_ub never bounded a block";
  EXPECT_GT(ub_count.unclipped, 0) << "scale_ub bounded every block";
}

TEST(BlockQuant, EveryScaleAndByteByTheRuleF32) { every_scale_and_byte(RMSNORM_DTYPE_F32, 61); }
TEST(BlockQuant, EveryScaleAndByteByTheRuleF16) { every_scale_and_byte(RMSNORM_DTYPE_F16, 68); }
TEST(BlockQuant, EveryScaleAndByteByTheRuleBf16) { every_scale_and_byte(RMSNORM_DTYPE_BF16, 69); }

// The flags reach y (and so the scales) as in rmsnorm_forward: Gemma's offset, the rounded x_hat, an fp32 weight.
TEST(BlockQuant, Flags) {
  std::mt19937_64 rng(62);
  for (uint32_t flags : {RMSNORM_FLAG_WEIGHT_OFFSET, RMSNORM_FLAG_ROUND_XHAT, RMSNORM_FLAG_WEIGHT_F32})
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F16})
      for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8})
        for (int32_t bc : {64, 128}) {
          BlockCase b;
          b.c.dtype = dt;
          b.c.rows = 6;
          b.c.cols = 300;
          b.c.flags = flags;
          b.kind = kind;
          b.block_cols = bc;
          b.layout = bc == 64 ? ScaleLayout::kColMajor : ScaleLayout::kRowMajor;
          SCOPED_TRACE(describe(b));
          const HostMatrix x = block_input(b, rng());
          HostMatrix w(flags == RMSNORM_FLAG_WEIGHT_F32 ? RMSNORM_DTYPE_F32 : dt, 1, b.c.cols);
          harness::fill_normal(w, rng(), {}, flags == RMSNORM_FLAG_WEIGHT_OFFSET ? 0.0 : 1.0);
          const BlockRun r = run_block_quant(b, x, &w);
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
          check_block_quant(b, x, &w, r);
          if (HasFailure()) return;
        }
}

// The smallest strides of each layout (row stride nb, block stride rows) are accepted and written exactly; with one
// row, the column-major layout (1, 1) is the tight row-major one.
TEST(BlockQuant, SmallestStrides) {
  std::mt19937_64 rng(63);
  for (int64_t rows : {1, 3, 8})
    for (int64_t cols : {64, 129, 1000})
      for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kColMajor}) {
        BlockCase b;
        b.c.dtype = RMSNORM_DTYPE_F16;
        b.c.rows = rows;
        b.c.cols = cols;
        b.block_cols = 64;
        b.layout = layout;
        b.padded = false;
        b.ub = cols == 129;
        SCOPED_TRACE(describe(b));
        const HostMatrix x = block_input(b, rng());
        const BlockRun r = run_block_quant(b, x, nullptr);
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
        check_block_quant(b, x, nullptr, r);
        if (HasFailure()) return;
      }
}

// cols <= block_cols: one block is the row, so q, the scale and rstd are rmsnorm_forward_quant's per-row ones bit for
// bit (q with the same row stride and poison, padding included).
TEST(BlockQuant, OneBlockIsThePerRowQuant) {
  std::mt19937_64 rng(64);
  for (int32_t dt : kDtypes)
    for (int32_t bc : {64, 128})
      for (int64_t cols : {1, 37, 64, 100, 128}) {
        if (cols > bc) continue;
        for (int64_t rows : {1, 7})
          for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8})
            for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kColMajor})
              for (bool ub : {false, true}) {
                if (ub && kind != RMSNORM_QUANT_FP8_E4M3) continue;
                BlockCase b;
                b.c.dtype = dt;
                b.c.rows = rows;
                b.c.cols = cols;
                b.c.weight = rows == 7;
                b.kind = kind;
                b.block_cols = bc;
                b.layout = layout;
                b.ub = ub;
                SCOPED_TRACE(describe(b));
                HostMatrix x(dt, rows, cols), w(dt, 1, cols);
                harness::fill_normal(x, rng(), harness::hetero_row_scale);
                harness::fill_normal(w, rng(), {}, 1.0);
                const BlockRun r = run_block_quant(b, x, b.c.weight ? &w : nullptr);
                ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
                const QuantRun pr = run_quant(b.c, x, w, kind, RMSNORM_QUANT_PER_ROW, 1.0f, ub ? &kBlockUb : nullptr);
                ASSERT_EQ(RMSNORM_STATUS_SUCCESS, pr.status) << rmsnorm_last_error();
                ASSERT_EQ(pr.q.size(), static_cast<size_t>(rows * block_q_stride(b)));
                EXPECT_EQ(0, std::memcmp(r.q_bytes(), pr.q.data(), pr.q.size())) << "q, padding included";
                for (int64_t i = 0; i < rows; ++i) {
                  EXPECT_EQ(float_bits(r.scale_data()[i * scales_row_stride(b)]), float_bits(pr.scales[i]))
                      << "row " << i << ": " << r.scale_data()[i * scales_row_stride(b)] << " against "
                      << pr.scales[i];
                  EXPECT_EQ(float_bits(r.rstd_data()[i]), float_bits(pr.rstd[i])) << "rstd, row " << i;
                }
                check_block_quant(b, x, b.c.weight ? &w : nullptr, r);  // the padding of the scales buffer too
                if (HasFailure()) return;
              }
      }
}

// NaN and infinity. A NaN in x makes its row's every y NaN: every block's max|y| is 0 (NaN skipped), its scale the
// smallest, q 448's code (fp8) or 0 (int8). A NaN weight column makes that one y NaN in every row: its block's scale
// comes from the other columns, its byte is 448's code or 0. An infinite weight column makes its block's max|y|
// infinite: without a bound the scale is inf (fp8 y / inf: 0 or NaN -> 448; int8 y * 0), with one it is ub / 448.
TEST(BlockQuant, NanAndInfinity) {
  std::mt19937_64 rng(65);
  for (int32_t dt : kDtypes)
    for (int32_t bc : {64, 128})
      for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8})
        for (bool ub : {false, true}) {
          if (ub && kind != RMSNORM_QUANT_FP8_E4M3) continue;
          BlockCase b;
          b.c.dtype = dt;
          b.c.rows = 4;
          b.c.cols = 200;
          b.kind = kind;
          b.block_cols = bc;
          b.layout = bc == 64 ? ScaleLayout::kRowMajor : ScaleLayout::kColMajor;
          b.ub = ub;
          SCOPED_TRACE(describe(b));
          HostMatrix x(dt, b.c.rows, b.c.cols), w(dt, 1, b.c.cols);
          harness::fill_normal(x, rng(), harness::hetero_row_scale);
          harness::fill_normal(w, rng(), {}, 1.0);
          x.set(1, 70, NAN);
          w.set(0, 5, NAN);
          w.set(0, 150, INFINITY);
          w.set(0, 151, -INFINITY);
          const BlockRun r = run_block_quant(b, x, &w);
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS, r.status) << rmsnorm_last_error();
          check_block_quant(b, x, &w, r);
          const bool fp8 = block_fp8(b);
          const int64_t rs = scales_row_stride(b), bs = scales_block_stride(b), qs = block_q_stride(b);
          const float* s = r.scale_data();
          const uint8_t* q = r.q_bytes();
          const int nan_code = fp8 ? 0x7E : 0;
          for (int64_t blk = 0; blk < num_blocks(b); ++blk) EXPECT_EQ(s[1 * rs + blk * bs], block_min_scale(b));
          for (int64_t j = 0; j < b.c.cols; ++j) EXPECT_EQ(q[1 * qs + j], nan_code) << "NaN row, col " << j;
          for (int64_t i : {0, 2, 3}) {
            EXPECT_EQ(q[i * qs + 5], nan_code) << "NaN weight column, row " << i;
            EXPECT_NE(s[i * rs], block_min_scale(b)) << "the NaN column's block, row " << i;
            const float inf_block = s[i * rs + (150 / bc) * bs];
            if (!fp8 || !ub) {
              EXPECT_EQ(inf_block, INFINITY) << "row " << i;
            } else {
              EXPECT_EQ(inf_block, kBlockUb / 448.0f) << "row " << i;
              EXPECT_EQ(q[i * qs + 150], x.get(i, 150) > 0 ? 0x7E : 0xFE) << "row " << i;
            }
          }
          if (HasFailure()) return;
        }
}

// rmsnorm_add_forward_block_quant: h by the rule and bit for bit rmsnorm_add_forward's h; q, the scales buffer (its
// padding included) and rstd bit for bit rmsnorm_forward_block_quant's of that h. h in its own buffer, over residual,
// over x.
TEST(BlockQuant, AddFormIsTheBlockQuantOfH) {
  std::mt19937_64 rng(66);
  for (int32_t dt : kDtypes)
    for (int64_t cols : {1, 65, 200, 1000})
      for (int64_t rows : {1, 9})
        for (int32_t kind : {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_INT8})
          for (int32_t bc : {64, 128})
            for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kColMajor})
              for (int over : {0, 1, 2}) {  // h: its own buffer, over residual, over x
                BlockCase b;
                b.c.dtype = dt;
                b.c.rows = rows;
                b.c.cols = cols;
                b.c.strided = (cols + over) % 2 == 1;
                b.c.weight = bc == 64;
                b.kind = kind;
                b.block_cols = bc;
                b.layout = layout;
                b.ub = kind == RMSNORM_QUANT_FP8_E4M3 && over == 1;
                SCOPED_TRACE(describe(b) + " over " + std::to_string(over));
                HostMatrix x = matrix(b.c, 0), res = matrix(b.c, 1), h = matrix(b.c, 2), w(dt, 1, cols);
                harness::fill_normal(x, rng(), harness::hetero_row_scale);
                harness::fill_normal(res, rng(), [](int64_t r) { return 8.0 * harness::hetero_row_scale(r + 3); });
                harness::fill_normal(w, rng(), {}, 1.0);
                const HostMatrix h_want = expected_h(b.c, x, res);
                const void* wp = b.c.weight ? w.data() : nullptr;
                const rmsnorm_problem_t p = problem(b.c);
                const rmsnorm_backend_t be = rmsnorm_backend_cpu(2);
                // The unfused add's h.
                HostMatrix h_add(dt, rows, cols), y_add(dt, rows, cols);
                ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                          rmsnorm_add_forward(&p, x.data(), x.stride, res.data(), res.stride, wp, h_add.data(),
                                              h_add.stride, y_add.data(), y_add.stride, nullptr, &be))
                    << rmsnorm_last_error();
                HostMatrix& target = over == 1 ? res : over == 2 ? x : h;
                BlockRun r = block_outputs(b);
                const rmsnorm_block_quant_t qt = block_quant(b, r);
                ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                          rmsnorm_add_forward_block_quant(&p, x.data(), x.stride, res.data(), res.stride, wp,
                                                          target.data(), target.stride, &qt, r.q_bytes(),
                                                          block_q_stride(b), r.rstd_data(), &be))
                    << rmsnorm_last_error();
                expect_same_values(target, h_want, "h (the rule)");
                expect_same_values(target, h_add, "h (rmsnorm_add_forward's)");
                if (HasFatalFailure()) return;
                // The plain form over h as stored.
                const BlockRun plain = run_block_quant(b, h_want, b.c.weight ? &w : nullptr);
                ASSERT_EQ(RMSNORM_STATUS_SUCCESS, plain.status) << rmsnorm_last_error();
                EXPECT_TRUE(r.q.storage == plain.q.storage) << "q differs from rmsnorm_forward_block_quant of h";
                EXPECT_TRUE(r.scales.storage == plain.scales.storage) << "the scales buffer differs";
                EXPECT_EQ(0, std::memcmp(r.rstd_data(), plain.rstd_data(), static_cast<size_t>(rows) * 4)) << "rstd";
                // And the rule itself, so that the identity above is not one between two wrong calls.
                check_block_quant(b, h_want, b.c.weight ? &w : nullptr, r);
                if (HasFailure()) return;
              }
}

// Refused calls write nothing (q, the scales buffer, rstd, h, and the inputs keep their bytes), and name the argument.
TEST(BlockQuant, ArgumentRules) {
  BlockCase b;
  b.c.dtype = RMSNORM_DTYPE_F32;
  b.c.rows = 5;
  b.c.cols = 200;
  b.block_cols = 64;  // nb = 4
  const int64_t nb = num_blocks(b), rows = b.c.rows, cols = b.c.cols;
  std::mt19937_64 rng(67);
  HostMatrix x(b.c.dtype, rows, cols), res(b.c.dtype, rows, cols), w(b.c.dtype, 1, cols), h(b.c.dtype, rows, cols);
  harness::fill_normal(x, rng());
  harness::fill_normal(res, rng());
  harness::fill_normal(w, rng(), {}, 1.0);
  BlockRun r = block_outputs(b);
  const std::vector<HostMatrix*> outs = {&r.q, &r.scales, &r.rstd, &h, &x, &res, &w};
  std::vector<std::vector<unsigned char>> before;
  for (const HostMatrix* m : outs) before.push_back(m->storage);
  const rmsnorm_problem_t p = problem(b.c);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  const float ub = 1.0f;
  auto plain = [&](const rmsnorm_block_quant_t* qt) {
    return rmsnorm_forward_block_quant(&p, x.data(), cols, w.data(), qt, r.q_bytes(), block_q_stride(b),
                                       r.rstd_data(), &be);
  };
  auto with = [&](auto&& edit) {
    rmsnorm_block_quant_t qt = block_quant(b, r);
    edit(qt);
    return plain(&qt);
  };
  expect_refused(plain(nullptr), RMSNORM_STATUS_NULL_POINTER, "quant", outs, before);
  for (int32_t bad : {32, 0, 256, -64, 65, 96})
    expect_refused(with([&](rmsnorm_block_quant_t& qt) { qt.block_cols = bad; }), RMSNORM_STATUS_INVALID_OPTION,
                   "quant.block_cols", outs, before);
  for (int32_t bad : {7, -1, 2})
    expect_refused(with([&](rmsnorm_block_quant_t& qt) { qt.kind = bad; }), RMSNORM_STATUS_INVALID_OPTION,
                   "quant.kind", outs, before);
  expect_refused(with([&](rmsnorm_block_quant_t& qt) {
                   qt.kind = RMSNORM_QUANT_INT8;
                   qt.scale_ub = &ub;
                 }),
                 RMSNORM_STATUS_INVALID_OPTION, "quant.scale_ub", outs, before);
  expect_refused(with([&](rmsnorm_block_quant_t& qt) { qt.scales = nullptr; }), RMSNORM_STATUS_NULL_POINTER,
                 "quant.scales", outs, before);
  // Strides that are neither layout: row-major rows too short, column-major columns too short, neither stride 1,
  // zero and negative ones.
  const std::vector<std::pair<int64_t, int64_t>> bad_strides = {
      {nb - 1, 1}, {2, 1}, {1, rows - 1}, {0, 1}, {0, 0}, {nb, 0},
      {nb + 3, 2}, {2, rows + 2}, {-1, 1}, {1, -5}, {nb, -1}};
  for (const auto& [rs, bs] : bad_strides) {
    SCOPED_TRACE("strides " + std::to_string(rs) + ", " + std::to_string(bs));
    expect_refused(with([&](rmsnorm_block_quant_t& qt) {
                     qt.scales_row_stride = rs;
                     qt.scales_block_stride = bs;
                   }),
                   RMSNORM_STATUS_INVALID_STRIDE, "quant.scales", outs, before);
  }
  // The scales over another operand: inside x, inside q, on rstd, inside the weight.
  auto over = [&](float* at) {
    return with([&](rmsnorm_block_quant_t& qt) { qt.scales = at; });
  };
  expect_refused(over(static_cast<float*>(x.data()) + 3), RMSNORM_STATUS_OVERLAP, "quant.scales", outs, before);
  expect_refused(over(reinterpret_cast<float*>(r.q_bytes()) + 4), RMSNORM_STATUS_OVERLAP, "quant.scales", outs, before);
  expect_refused(over(r.rstd_data()), RMSNORM_STATUS_OVERLAP, "quant.scales", outs, before);
  expect_refused(over(static_cast<float*>(w.data()) + cols - 2), RMSNORM_STATUS_OVERLAP, "quant.scales", outs, before);
  // The add form: residual and h required; the scales over h and over residual.
  auto add = [&](const void* rp, void* hp, float* scales) {
    rmsnorm_block_quant_t qt = block_quant(b, r);
    qt.scales = scales;
    return rmsnorm_add_forward_block_quant(&p, x.data(), cols, rp, cols, w.data(), hp, cols, &qt, r.q_bytes(),
                                           block_q_stride(b), r.rstd_data(), &be);
  };
  expect_refused(add(nullptr, h.data(), r.scale_data()), RMSNORM_STATUS_NULL_POINTER, "residual", outs, before);
  expect_refused(add(res.data(), nullptr, r.scale_data()), RMSNORM_STATUS_NULL_POINTER, "h", outs, before);
  {  // the problem before the add form's pointers: a bad eps with residual NULL is the eps's error
    rmsnorm_problem_t bad = p;
    bad.eps = -1.0f;
    rmsnorm_block_quant_t qt = block_quant(b, r);
    expect_refused(rmsnorm_add_forward_block_quant(&bad, x.data(), cols, nullptr, cols, w.data(), h.data(), cols, &qt,
                                                   r.q_bytes(), block_q_stride(b), r.rstd_data(), &be),
                   RMSNORM_STATUS_INVALID_EPS, "eps", outs, before);
  }
  expect_refused(add(res.data(), h.data(), static_cast<float*>(h.data()) + 7), RMSNORM_STATUS_OVERLAP, "quant.scales",
                 outs, before);
  expect_refused(add(res.data(), h.data(), static_cast<float*>(res.data()) + cols * (rows - 1)),
                 RMSNORM_STATUS_OVERLAP, "quant.scales", outs, before);
  expect_refused(add(res.data(), h.data(), nullptr), RMSNORM_STATUS_NULL_POINTER, "quant.scales", outs, before);

  // The overlap check sees exactly the scales' extent: rstd right after the last scale is accepted, one float
  // earlier refused. Column-major, padded: the last scale is at (nb - 1) * bs + rows - 1.
  for (ScaleLayout layout : {ScaleLayout::kRowMajor, ScaleLayout::kColMajor}) {
    BlockCase e = b;
    e.layout = layout;
    SCOPED_TRACE(describe(e));
    const int64_t end = layout == ScaleLayout::kRowMajor ? (rows - 1) * scales_row_stride(e) + nb
                                                         : (nb - 1) * scales_block_stride(e) + rows;
    HostMatrix buf(RMSNORM_DTYPE_F32, 1, end + rows);
    const std::vector<unsigned char> buf_before = buf.storage;
    float* scales = static_cast<float*>(buf.data());
    rmsnorm_block_quant_t qt{e.kind, e.block_cols, scales, scales_row_stride(e), scales_block_stride(e), nullptr};
    BlockRun got = block_outputs(e);
    EXPECT_EQ(RMSNORM_STATUS_OVERLAP, rmsnorm_forward_block_quant(&p, x.data(), cols, w.data(), &qt, got.q_bytes(),
                                                                  block_q_stride(e), scales + end - 1, &be));
    EXPECT_TRUE(buf.storage == buf_before) << "written although refused";
    EXPECT_TRUE(std::all_of(got.q.storage.begin(), got.q.storage.end(), [](unsigned char v) { return v == 0xAB; }))
        << "q written although refused";
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward_block_quant(&p, x.data(), cols, w.data(), &qt, got.q_bytes(),
                                                                  block_q_stride(e), scales + end, &be))
        << rmsnorm_last_error();
    // Moved into a BlockRun's layout (the same strides), the result passes the rule check.
    std::memcpy(got.scale_data(), scales, static_cast<size_t>(end) * 4);
    std::memcpy(got.rstd_data(), scales + end, static_cast<size_t>(rows) * 4);
    check_block_quant(e, x, &w, got);
  }
}

// rows == 0: success with nothing read or written, the scales pointer NULL or not and its strides unchecked; the add
// form with NULL residual and h as well.
TEST(BlockQuant, ZeroRowsWriteNothing) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = 0;
  p.cols = 200;
  p.dtype = RMSNORM_DTYPE_BF16;
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(1);
  alignas(16) unsigned char poison[256];
  std::memset(poison, 0xAB, sizeof(poison));
  float* fp = reinterpret_cast<float*>(poison);
  for (float* scales : {static_cast<float*>(nullptr), fp}) {
    rmsnorm_block_quant_t qt{RMSNORM_QUANT_FP8_E4M3, 128, scales, 0, 0, nullptr};
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward_block_quant(&p, poison, p.cols, nullptr, &qt, poison, p.cols, fp,
                                                                  &be))
        << rmsnorm_last_error();
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward_block_quant(&p, poison, p.cols, nullptr, p.cols, nullptr,
                                                                      nullptr, p.cols, &qt, poison, p.cols, fp, &be))
        << rmsnorm_last_error();
    qt.kind = RMSNORM_QUANT_INT8;
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_forward_block_quant(&p, poison, p.cols, poison, p.cols, nullptr, poison, p.cols, &qt, poison,
                                              p.cols, nullptr, &be))
        << rmsnorm_last_error();
  }
  for (unsigned char v : poison) EXPECT_EQ(v, 0xAB);
}

}  // namespace
}  // namespace rmsnorm::test
