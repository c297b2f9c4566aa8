// RMSNORM_FLAG_WEIGHT_F32 (an fp32 weight with f16 / bf16 x) on the CPU backend, through the C ABI. The identity
// checked: with x, gy widened to fp32 (exactly), the fp32 problem with the same fp32 weight computes the same fp32
// values, so the mixed call's rstd and gw are bit for bit the fp32 call's and its y and gx are those values rounded
// once to the dtype. y also against the float64 reference (the tests' tolerance model), and against the call with the
// weight rounded to the dtype first, which must differ somewhere (the fp32 weight is used as fp32). Then the
// argument rules. The same flags on CUDA: cuda_mixed_test.cu and cuda_test.cu (Cuda.WeightF32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/host_matrix.hpp"
#include "harness/random.hpp"
#include "harness/tolerance.hpp"
#include "rmsnorm/rmsnorm.h"
#include "rmsnorm/rmsnorm.hpp"
#include "rmsnorm_reference.hpp"

namespace rmsnorm::test {
namespace {

using harness::HostMatrix;

rmsnorm_problem_t problem(int32_t dtype, int64_t rows, int64_t cols, uint32_t flags) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype;
  p.flags = flags;
  return p;
}

// m widened to fp32 (every f16 / bf16 value is exact in fp32), same layout.
HostMatrix widened(const HostMatrix& m) {
  HostMatrix f(RMSNORM_DTYPE_F32, m.rows, m.cols, m.stride, m.offset);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t k = 0; k < m.cols; ++k) f.set(r, k, m.get(r, k));
  return f;
}

const rmsnorm_backend_t kCpu = rmsnorm_backend_cpu(2);

struct Fwd {
  HostMatrix y;
  std::vector<float> rstd;
};

Fwd forward(const HostMatrix& x, const HostMatrix& w, int32_t dtype, uint32_t flags) {
  Fwd f;
  f.y = HostMatrix(dtype, x.rows, x.cols, x.stride, x.offset);
  f.rstd.assign(static_cast<size_t>(x.rows), NAN);
  const rmsnorm_problem_t p = problem(dtype, x.rows, x.cols, flags);
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_forward(&p, x.data(), x.stride, w.data(), f.y.data(), f.y.stride, f.rstd.data(), &kCpu))
      << rmsnorm_last_error();
  return f;
}

// rmsnorm_backward (g_h null) or rmsnorm_add_backward on the CPU backend with the workspace the library asks for;
// gx and gw are the caller's (gw preset for the accumulate modes, not passed with RMSNORM_GW_NONE).
void cpu_backward(const rmsnorm_problem_t& p, const HostMatrix& x, const HostMatrix& w, const HostMatrix& gy,
                  const HostMatrix* g_h, HostMatrix* gx, HostMatrix* gw, int32_t mode) {
  size_t bytes = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, mode, &kCpu, &bytes));
  std::vector<unsigned char> ws(bytes + 16);
  void* const gwp = mode == RMSNORM_GW_NONE ? nullptr : gw->data();
  void* const wsp = bytes > 0 ? ws.data() : nullptr;
  const rmsnorm_status_t st =
      g_h == nullptr ? rmsnorm_backward(&p, x.data(), x.stride, w.data(), gy.data(), gy.stride, nullptr, gx->data(),
                                        gx->stride, gwp, mode, wsp, bytes, &kCpu)
                     : rmsnorm_add_backward(&p, x.data(), x.stride, w.data(), gy.data(), gy.stride, nullptr, g_h->data(),
                                            g_h->stride, gx->data(), gx->stride, gwp, mode, wsp, bytes, &kCpu);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, st) << rmsnorm_last_error();
}

// gw against the fp32 problem's gw32: rounded once to dt in RMSNORM_GW_STORE, bit for bit in the fp32 modes.
void expect_gw_of(const HostMatrix& gw, const HostMatrix& gw32, int32_t mode, int32_t dt) {
  if (mode == RMSNORM_GW_NONE) return;
  for (int64_t k = 0; k < gw.cols; ++k) {
    const double want = mode == RMSNORM_GW_STORE ? harness::round_to(dt, gw32.get(0, k)) : gw32.get(0, k);
    ASSERT_EQ(gw.get(0, k), want) << "gw at col " << k;
  }
}

TEST(WeightF32, ForwardIsTheFp32ProblemRoundedOnce) {
  std::mt19937_64 rng(61);
  for (int32_t dt : {RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16})
    for (int64_t cols : {1, 7, 64, 1000, 4096})
      for (uint32_t extra : {0u, static_cast<uint32_t>(RMSNORM_FLAG_WEIGHT_OFFSET)})
        for (bool strided : {false, true}) {
          SCOPED_TRACE("dtype " + std::to_string(dt) + " cols " + std::to_string(cols) + " flags " +
                       std::to_string(extra) + (strided ? " strided" : ""));
          const int64_t rows = 9;
          HostMatrix x = strided ? HostMatrix(dt, rows, cols, cols + 5, 1) : HostMatrix(dt, rows, cols);
          HostMatrix w(RMSNORM_DTYPE_F32, 1, cols, cols, strided ? 1 : 0);  // fp32, 4-byte aligned either way
          harness::fill_normal(x, rng(), harness::hetero_row_scale);
          harness::fill_normal(w, rng(), {}, 1.0);
          const Fwd mixed = forward(x, w, dt, RMSNORM_FLAG_WEIGHT_F32 | extra);
          const HostMatrix xf = widened(x);
          const Fwd wide = forward(xf, w, RMSNORM_DTYPE_F32, extra);
          ASSERT_EQ(0, std::memcmp(mixed.rstd.data(), wide.rstd.data(), mixed.rstd.size() * sizeof(float)))
              << "rstd differs from the fp32 problem's";
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cols; ++k)
              ASSERT_EQ(mixed.y.get(r, k), harness::round_to(dt, wide.y.get(r, k)))
                  << "y at row " << r << " col " << k;
          // Against float64, with the fp32 weight's values.
          const std::vector<double> xd = x.to_double(), wd = w.to_double();
          std::vector<double> yr(static_cast<size_t>(rows * cols)), rr(static_cast<size_t>(rows)),
              xh(static_cast<size_t>(rows * cols));
          reference::Options o;
          o.eps = 1e-5;
          o.weight_offset = extra != 0;
          reference::forward(rows, cols, xd.data(), wd.data(), o, yr.data(), rr.data(), xh.data());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cols; ++k) {
              const double want = yr[static_cast<size_t>(r * cols + k)];
              ASSERT_LE(std::fabs(mixed.y.get(r, k) - want), harness::y_tol(dt, want, cols))
                  << "y against float64 at row " << r << " col " << k;
            }
          // The weight rounded to the dtype first gives other bits somewhere: the fp32 values were used.
          HostMatrix wt(dt, 1, cols);
          for (int64_t k = 0; k < cols; ++k) wt.set(0, k, w.get(0, k));
          const Fwd rounded = forward(x, wt, dt, extra);
          if (cols >= 64) {
            EXPECT_NE(0, std::memcmp(rounded.y.data(), mixed.y.data(), mixed.y.data_bytes()))
                << "the same y with the weight rounded to the dtype";
          }
        }
}

// gx is the fp32 problem's rounded once; gw (fp32 in every mode) and the accumulate modes' sums bit for bit.
TEST(WeightF32, BackwardIsTheFp32ProblemRoundedOnce) {
  std::mt19937_64 rng(62);
  for (int32_t dt : {RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16})
    for (int64_t cols : {1, 33, 1000})
      for (int32_t mode : {RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE, RMSNORM_GW_ACCUMULATE_F32}) {
        SCOPED_TRACE("dtype " + std::to_string(dt) + " cols " + std::to_string(cols) + " gw_mode " +
                     std::to_string(mode));
        const int64_t rows = 40;
        HostMatrix x(dt, rows, cols), gy(dt, rows, cols), w(RMSNORM_DTYPE_F32, 1, cols);
        harness::fill_normal(x, rng(), harness::hetero_row_scale);
        harness::fill_normal(gy, rng());
        harness::fill_normal(w, rng(), {}, 1.0);
        HostMatrix gw0(RMSNORM_DTYPE_F32, 1, cols);
        harness::fill_normal(gw0, rng());
        const bool accumulate = mode == RMSNORM_GW_ACCUMULATE || mode == RMSNORM_GW_ACCUMULATE_F32;
        auto run = [&](const HostMatrix& xs, const HostMatrix& gys, int32_t dtype, uint32_t flags, int32_t m,
                       HostMatrix* gx, HostMatrix* gw) {
          *gx = HostMatrix(dtype, rows, cols);
          *gw = accumulate ? gw0 : HostMatrix(RMSNORM_DTYPE_F32, 1, cols);
          cpu_backward(problem(dtype, rows, cols, flags), xs, w, gys, nullptr, gx, gw, m);
        };
        HostMatrix gx, gw, gxf, gwf;
        run(x, gy, dt, RMSNORM_FLAG_WEIGHT_F32, mode, &gx, &gw);
        ASSERT_FALSE(HasFatalFailure());
        // The fp32 problem: gw's fp32 modes (the dtype of an fp32 weight).
        run(widened(x), widened(gy), RMSNORM_DTYPE_F32, 0,
            accumulate ? RMSNORM_GW_ACCUMULATE_F32 : RMSNORM_GW_STORE_F32, &gxf, &gwf);
        ASSERT_FALSE(HasFatalFailure());
        ASSERT_EQ(0, std::memcmp(gw.data(), gwf.data(), static_cast<size_t>(cols) * 4)) << "gw";
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k)
            ASSERT_EQ(gx.get(r, k), harness::round_to(dt, gxf.get(r, k))) << "gx at row " << r << " col " << k;
      }
}

// The residual add and the quantized forward take the flag too: each is its unfused composition with it.
TEST(WeightF32, AddAndQuantFollowTheForward) {
  std::mt19937_64 rng(63);
  const int32_t dt = RMSNORM_DTYPE_BF16;
  const int64_t rows = 5, cols = 200;
  HostMatrix x(dt, rows, cols), res(dt, rows, cols), w(RMSNORM_DTYPE_F32, 1, cols);
  harness::fill_normal(x, rng(), harness::hetero_row_scale);
  harness::fill_normal(res, rng());
  harness::fill_normal(w, rng(), {}, 1.0);
  const rmsnorm_problem_t p = problem(dt, rows, cols, RMSNORM_FLAG_WEIGHT_F32);
  HostMatrix h(dt, rows, cols), y(dt, rows, cols);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, x.data(), cols, res.data(), cols, w.data(), h.data(), cols,
                                                         y.data(), cols, nullptr, &kCpu))
      << rmsnorm_last_error();
  const Fwd plain = forward(h, w, dt, RMSNORM_FLAG_WEIGHT_F32);
  EXPECT_EQ(0, std::memcmp(plain.y.data(), y.data(), y.data_bytes())) << "add: y differs from the forward of h";
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols)), q_plain(q.size());
  std::vector<float> s(static_cast<size_t>(rows)), s_plain(s.size());
  rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, nullptr, s.data(), nullptr};
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_forward_quant(&p, h.data(), cols, w.data(), &qt, q.data(), cols, nullptr, &kCpu))
      << rmsnorm_last_error();
  // The same call with the weight rounded to bf16.
  HostMatrix wt(dt, 1, cols);
  for (int64_t k = 0; k < cols; ++k) wt.set(0, k, w.get(0, k));
  qt.row_scales = s_plain.data();
  const rmsnorm_problem_t pt = problem(dt, rows, cols, 0);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_forward_quant(&pt, h.data(), cols, wt.data(), &qt, q_plain.data(), cols, nullptr, &kCpu));
  // Quantized from the fp32-weight y, not the rounded-weight one: the scales differ somewhere.
  EXPECT_NE(0, std::memcmp(s.data(), s_plain.data(), s.size() * 4));
  for (int64_t r = 0; r < rows; ++r) {
    double amax = 0.0;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(plain.y.get(r, k)));
    EXPECT_EQ(s[static_cast<size_t>(r)], std::max(static_cast<float>(amax) / 448.0f, 1.0f / (448.0f * 512.0f)))
        << "scale of row " << r << " (from the y of the forward with the flag)";
  }
}

// The C++ API's forward_mixed / backward_mixed are the C ABI with the flag.
TEST(WeightF32, CppForwardAndBackwardMixedAreTheCAbi) {
  const int64_t rows = 6, cols = 96;
  HostMatrix x(RMSNORM_DTYPE_BF16, rows, cols), gy(RMSNORM_DTYPE_BF16, rows, cols), w(RMSNORM_DTYPE_F32, 1, cols);
  harness::fill_normal(x, 81, harness::hetero_row_scale);
  harness::fill_normal(gy, 82);
  harness::fill_normal(w, 83, {}, 1.0);
  const Fwd c = forward(x, w, RMSNORM_DTYPE_BF16, RMSNORM_FLAG_WEIGHT_F32);
  using B = rmsnorm::bfloat16;
  HostMatrix y(RMSNORM_DTYPE_BF16, rows, cols);
  std::vector<float> rstd(static_cast<size_t>(rows));
  const auto xv = rmsnorm::make_matrix(static_cast<const B*>(x.data()), rows, cols);
  const auto wv = rmsnorm::make_vector(static_cast<const float*>(w.data()), cols);
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(2);
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            rmsnorm::forward_mixed<B>(xv, wv, rmsnorm::make_matrix(static_cast<B*>(y.data()), rows, cols),
                                      rmsnorm::make_vector(rstd.data(), rows), rmsnorm::Options{}, be))
      << rmsnorm::last_error();
  EXPECT_EQ(0, std::memcmp(y.data(), c.y.data(), y.data_bytes()));
  EXPECT_EQ(0, std::memcmp(rstd.data(), c.rstd.data(), rstd.size() * 4));
  HostMatrix gx(RMSNORM_DTYPE_BF16, rows, cols), gx_c(RMSNORM_DTYPE_BF16, rows, cols);
  std::vector<float> gw(static_cast<size_t>(cols)), gw_c(static_cast<size_t>(cols));
  std::vector<double> ws(1 << 16);
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            rmsnorm::backward_mixed<B>(xv, wv, rmsnorm::make_matrix(static_cast<const B*>(gy.data()), rows, cols),
                                       rmsnorm::make_vector(static_cast<const float*>(rstd.data()), rows),
                                       rmsnorm::make_matrix(static_cast<B*>(gx.data()), rows, cols),
                                       rmsnorm::GradWeight<float>::store(rmsnorm::make_vector(gw.data(), cols)),
                                       rmsnorm::Workspace{ws.data(), ws.size() * sizeof(double)}, rmsnorm::Options{}, be))
      << rmsnorm::last_error();
  const rmsnorm_problem_t p = problem(RMSNORM_DTYPE_BF16, rows, cols, RMSNORM_FLAG_WEIGHT_F32);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_backward(&p, x.data(), cols, w.data(), gy.data(), cols, rstd.data(), gx_c.data(), cols, gw_c.data(),
                             RMSNORM_GW_STORE_F32, ws.data(), ws.size() * sizeof(double), &kCpu));
  EXPECT_EQ(0, std::memcmp(gx.data(), gx_c.data(), gx.data_bytes()));
  EXPECT_EQ(0, std::memcmp(gw.data(), gw_c.data(), gw.size() * 4));
}

// The C++ API's fused forms with an fp32 weight (W = float: add_forward<T, R, float>, add_backward<R, T, float>,
// add_backward_x<T, float>, forward_quant<const T, float>, add_forward_quant<const T, float>) are the C ABI with
// RMSNORM_FLAG_WEIGHT_F32, bit for bit, with the residual stream in T and in fp32.
TEST(WeightF32, CppFusedFormsAreTheCAbi) {
  using B = rmsnorm::bfloat16;
  const int32_t dt = RMSNORM_DTYPE_BF16;
  const int64_t rows = 5, cols = 136;
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(2);
  const rmsnorm::Options opt;
  HostMatrix x(dt, rows, cols), gy(dt, rows, cols), w(RMSNORM_DTYPE_F32, 1, cols);
  harness::fill_normal(x, 84, harness::hetero_row_scale);
  harness::fill_normal(gy, 85);
  harness::fill_normal(w, 86, {}, 1.0);
  const auto xv = rmsnorm::make_matrix(static_cast<const B*>(x.data()), rows, cols);
  const auto gyv = rmsnorm::make_matrix(static_cast<const B*>(gy.data()), rows, cols);
  const auto wv = rmsnorm::make_vector(static_cast<const float*>(w.data()), cols);
  auto same = [](const HostMatrix& a, const HostMatrix& b, const char* what) {
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.data_bytes())) << what;
  };
  for (int32_t rdt : {dt, static_cast<int32_t>(RMSNORM_DTYPE_F32)}) {
    SCOPED_TRACE(rdt == dt ? "residual in T" : "fp32 residual stream");
    const bool wide = rdt != dt;
    const uint32_t flags = RMSNORM_FLAG_WEIGHT_F32 | (wide ? RMSNORM_FLAG_RESIDUAL_F32 : 0u);
    const rmsnorm_problem_t p = problem(dt, rows, cols, flags);
    HostMatrix res(rdt, rows, cols), h(rdt, rows, cols), h_c(rdt, rows, cols), y(dt, rows, cols), y_c(dt, rows, cols),
        g_h(rdt, rows, cols);
    harness::fill_normal(res, 87);
    harness::fill_normal(g_h, 88);
    std::vector<float> rstd(static_cast<size_t>(rows)), rstd_c(rstd.size());
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, x.data(), cols, res.data(), cols, w.data(), h_c.data(),
                                                           cols, y_c.data(), cols, rstd_c.data(), &kCpu))
        << rmsnorm_last_error();
    rmsnorm::Status st;
    if (wide) {
      st = rmsnorm::add_forward<B, float, float>(
          xv, rmsnorm::make_matrix(static_cast<const float*>(res.data()), rows, cols), wv,
          rmsnorm::make_matrix(static_cast<float*>(h.data()), rows, cols),
          rmsnorm::make_matrix(static_cast<B*>(y.data()), rows, cols), rmsnorm::make_vector(rstd.data(), rows), opt, be);
    } else {
      st = rmsnorm::add_forward<B, B, float>(
          xv, rmsnorm::make_matrix(static_cast<const B*>(res.data()), rows, cols), wv,
          rmsnorm::make_matrix(static_cast<B*>(h.data()), rows, cols),
          rmsnorm::make_matrix(static_cast<B*>(y.data()), rows, cols), rmsnorm::make_vector(rstd.data(), rows), opt, be);
    }
    ASSERT_EQ(rmsnorm::Status::kSuccess, st) << rmsnorm::last_error();
    same(h, h_c, "h");
    same(y, y_c, "y");
    EXPECT_EQ(0, std::memcmp(rstd.data(), rstd_c.data(), rstd.size() * 4)) << "rstd";
    // The backward, gw fp32 (the weight's dtype), and with the fp32 stream x's gradient as well.
    size_t wsb = 0;
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE, &kCpu, &wsb));
    size_t wsb_cpp = 0;
    const rmsnorm::Status ws_status =
        wide ? rmsnorm::backward_workspace_size<B, B, float, float>(rows, cols, rmsnorm::GwMode::kStore, be, &wsb_cpp)
             : rmsnorm::backward_workspace_size<B, B, float, B>(rows, cols, rmsnorm::GwMode::kStore, be, &wsb_cpp);
    ASSERT_EQ(rmsnorm::Status::kSuccess, ws_status);
    EXPECT_EQ(wsb, wsb_cpp);
    std::vector<double> ws(wsb / sizeof(double) + 2);
    const rmsnorm::Workspace wk{ws.data(), ws.size() * sizeof(double)};
    const auto rv = rmsnorm::make_vector(static_cast<const float*>(rstd.data()), rows);
    HostMatrix gx(rdt, rows, cols), gx_c(rdt, rows, cols), gx_x(dt, rows, cols), gx_x_c(dt, rows, cols);
    std::vector<float> gw(static_cast<size_t>(cols)), gw_c(gw.size());
    const auto gwv = rmsnorm::GradWeight<float>::store(rmsnorm::make_vector(gw.data(), cols));
    if (wide) {
      const auto hv = rmsnorm::make_matrix(static_cast<const float*>(h.data()), rows, cols);
      const auto ghv = rmsnorm::make_matrix(static_cast<const float*>(g_h.data()), rows, cols);
      ASSERT_EQ(rmsnorm::Status::kSuccess,
                (rmsnorm::add_backward_x<B, float>(hv, wv, gyv, rv, ghv,
                                                   rmsnorm::make_matrix(static_cast<float*>(gx.data()), rows, cols),
                                                   rmsnorm::make_matrix(static_cast<B*>(gx_x.data()), rows, cols), gwv,
                                                   wk, opt, be)))
          << rmsnorm::last_error();
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                rmsnorm_add_backward_x(&p, h.data(), cols, w.data(), gy.data(), cols, rstd.data(), g_h.data(), cols,
                                       gx_c.data(), cols, gx_x_c.data(), cols, gw_c.data(), RMSNORM_GW_STORE, ws.data(),
                                       ws.size() * sizeof(double), &kCpu))
          << rmsnorm_last_error();
      same(gx_x, gx_x_c, "gx_x");
      ASSERT_EQ(rmsnorm::Status::kSuccess,
                (rmsnorm::add_backward<float, B, float>(
                    hv, wv, gyv, rv, ghv, rmsnorm::make_matrix(static_cast<float*>(gx.data()), rows, cols), gwv, wk,
                    opt, be)))
          << rmsnorm::last_error();
    } else {
      ASSERT_EQ(rmsnorm::Status::kSuccess,
                (rmsnorm::add_backward<B, B, float>(
                    rmsnorm::make_matrix(static_cast<const B*>(h.data()), rows, cols), wv, gyv, rv,
                    rmsnorm::make_matrix(static_cast<const B*>(g_h.data()), rows, cols),
                    rmsnorm::make_matrix(static_cast<B*>(gx.data()), rows, cols), gwv, wk, opt, be)))
          << rmsnorm::last_error();
    }
    std::vector<float> gw_c2(gw.size());
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_backward(&p, h.data(), cols, w.data(), gy.data(), cols, rstd.data(), g_h.data(), cols,
                                   gx_c.data(), cols, gw_c2.data(), RMSNORM_GW_STORE, ws.data(),
                                   ws.size() * sizeof(double), &kCpu))
        << rmsnorm_last_error();
    same(gx, gx_c, "gx");
    EXPECT_EQ(0, std::memcmp(gw.data(), gw_c2.data(), gw.size() * 4)) << "gw";
  }
  // The quantized forms: per-row fp8, and static int8 after the add.
  const rmsnorm_problem_t p = problem(dt, rows, cols, RMSNORM_FLAG_WEIGHT_F32);
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols)), q_c(q.size());
  std::vector<float> sc(static_cast<size_t>(rows)), sc_c(sc.size());
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            (rmsnorm::forward_quant<const B, float>(xv, wv, rmsnorm::QuantKind::kFp8E4m3,
                                                     rmsnorm::QuantScales::per_row(rmsnorm::make_vector(sc.data(), rows)),
                                                     rmsnorm::make_matrix(q.data(), rows, cols), {}, opt, be)))
      << rmsnorm::last_error();
  const rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, nullptr, sc_c.data(), nullptr};
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_forward_quant(&p, x.data(), cols, w.data(), &qt, q_c.data(), cols, nullptr, &kCpu));
  EXPECT_EQ(q, q_c);
  EXPECT_EQ(0, std::memcmp(sc.data(), sc_c.data(), sc.size() * 4));
  HostMatrix res(dt, rows, cols), h(dt, rows, cols), h_c(dt, rows, cols);
  harness::fill_normal(res, 89);
  const float scale = 0.03f;
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            (rmsnorm::add_forward_quant<const B, float>(
                xv, rmsnorm::make_matrix(static_cast<const B*>(res.data()), rows, cols), wv,
                rmsnorm::make_matrix(static_cast<B*>(h.data()), rows, cols), rmsnorm::QuantKind::kInt8,
                rmsnorm::QuantScales::fixed(&scale), rmsnorm::make_matrix(q.data(), rows, cols), {}, opt, be)))
      << rmsnorm::last_error();
  const rmsnorm_quant_t qs{RMSNORM_QUANT_INT8, RMSNORM_QUANT_STATIC, &scale, nullptr, nullptr};
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward_quant(&p, x.data(), cols, res.data(), cols, w.data(),
                                                               h_c.data(), cols, &qs, q_c.data(), cols, nullptr, &kCpu));
  EXPECT_EQ(q, q_c);
  same(h, h_c, "h (quantized add)");
}

TEST(WeightF32, ArgumentRules) {
  const int64_t rows = 2, cols = 8;
  HostMatrix x(RMSNORM_DTYPE_BF16, rows, cols), y(RMSNORM_DTYPE_BF16, rows, cols);
  harness::fill_normal(x, 5);
  std::vector<float> wbuf(cols + 1, 1.0f);
  // A weight 2 bytes past a float boundary: aligned for bf16, not for the fp32 weight the flag announces.
  const void* w_misaligned = reinterpret_cast<const unsigned char*>(wbuf.data()) + 2;
  const rmsnorm_problem_t p = problem(RMSNORM_DTYPE_BF16, rows, cols, RMSNORM_FLAG_WEIGHT_F32);
  const HostMatrix y0 = y;
  EXPECT_EQ(RMSNORM_STATUS_MISALIGNED, rmsnorm_forward(&p, x.data(), cols, w_misaligned, y.data(), cols, nullptr, &kCpu));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("weight"), std::string::npos) << rmsnorm_last_error();
  EXPECT_EQ(0, std::memcmp(y.storage.data(), y0.storage.data(), y.storage.size())) << "written although refused";
  // With fp32 x the flag changes nothing.
  HostMatrix xf(RMSNORM_DTYPE_F32, rows, cols), w(RMSNORM_DTYPE_F32, 1, cols);
  harness::fill_normal(xf, 6);
  harness::fill_normal(w, 7);
  const Fwd a = forward(xf, w, RMSNORM_DTYPE_F32, RMSNORM_FLAG_WEIGHT_F32);
  const Fwd b = forward(xf, w, RMSNORM_DTYPE_F32, 0);
  EXPECT_EQ(0, std::memcmp(a.y.data(), b.y.data(), a.y.data_bytes()));
}

// RMSNORM_FLAG_Y_DTYPE: y (and gy) in another dtype than x's. The identity checked: the same call with y in fp32
// computes the fp32 values, and y in any dtype is those rounded once; rstd is the plain call's bit for bit. The
// backward: with gy in Y, gx and gw are the fp32 problem's (x and gy widened) rounded once to x's dtype (gx) or as
// the gw mode says; against float64 too.
TEST(YDtype, ForwardIsTheFp32ValuesRoundedOnceToY) {
  std::mt19937_64 rng(64);
  const int32_t kDts[] = {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16};
  for (int32_t xdt : kDts)
    for (int32_t ydt : kDts)
      for (int64_t cols : {1, 33, 1000})
        for (uint32_t extra : {0u, static_cast<uint32_t>(RMSNORM_FLAG_ROUND_XHAT), static_cast<uint32_t>(RMSNORM_FLAG_WEIGHT_OFFSET)}) {
          SCOPED_TRACE("x " + std::to_string(xdt) + " y " + std::to_string(ydt) + " cols " + std::to_string(cols) +
                       " flags " + std::to_string(extra));
          const int64_t rows = 7;
          HostMatrix x(xdt, rows, cols, cols + 3, 1), w(xdt, 1, cols);
          harness::fill_normal(x, rng(), harness::hetero_row_scale);
          harness::fill_normal(w, rng(), {}, 1.0);
          const rmsnorm_problem_t p = problem(xdt, rows, cols, RMSNORM_FLAG_Y_DTYPE(ydt) | extra);
          HostMatrix y(ydt, rows, cols, cols + 1, 0);
          std::vector<float> rstd(static_cast<size_t>(rows), NAN);
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                    rmsnorm_forward(&p, x.data(), x.stride, w.data(), y.data(), y.stride, rstd.data(), &kCpu))
              << rmsnorm_last_error();
          // The fp32 values: the same problem with y in fp32.
          const rmsnorm_problem_t p32 = problem(xdt, rows, cols, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_F32) | extra);
          HostMatrix y32(RMSNORM_DTYPE_F32, rows, cols);
          std::vector<float> rstd32(static_cast<size_t>(rows), NAN);
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                    rmsnorm_forward(&p32, x.data(), x.stride, w.data(), y32.data(), cols, rstd32.data(), &kCpu));
          // The plain call (y in x's dtype) for rstd.
          const Fwd plain = forward(x, w, xdt, extra);
          ASSERT_EQ(0, std::memcmp(rstd.data(), plain.rstd.data(), rstd.size() * 4)) << "rstd";
          ASSERT_EQ(0, std::memcmp(rstd32.data(), plain.rstd.data(), rstd.size() * 4)) << "rstd (fp32 y)";
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cols; ++k) {
              ASSERT_EQ(y.get(r, k), harness::round_to(ydt, y32.get(r, k))) << "y at row " << r << " col " << k;
              if (ydt == xdt) {
                ASSERT_EQ(y.get(r, k), plain.y.get(r, k)) << "y (same dtype) at row " << r;
              }
            }
          // Against float64 (round_xhat rounds x_hat first: the reference has no such mode, so it is skipped there).
          if (extra != RMSNORM_FLAG_ROUND_XHAT) {
            const std::vector<double> xd = x.to_double(), wd = w.to_double();
            std::vector<double> yr(static_cast<size_t>(rows * cols)), rr(static_cast<size_t>(rows)),
                xh(static_cast<size_t>(rows * cols));
            reference::Options o;
            o.eps = 1e-5;
            o.weight_offset = extra == RMSNORM_FLAG_WEIGHT_OFFSET;
            reference::forward(rows, cols, xd.data(), wd.data(), o, yr.data(), rr.data(), xh.data());
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t k = 0; k < cols; ++k) {
                const double want = yr[static_cast<size_t>(r * cols + k)];
                ASSERT_LE(std::fabs(y.get(r, k) - want), harness::y_tol(ydt, want, cols))
                    << "y against float64 at row " << r << " col " << k;
              }
          }
        }
}

TEST(YDtype, BackwardReadsGyInY) {
  std::mt19937_64 rng(65);
  const int32_t kDts[] = {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16};
  for (int32_t xdt : kDts)
    for (int32_t ydt : kDts)
      for (int64_t cols : {1, 40, 1000})
        for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE_F32, RMSNORM_GW_STORE}) {
          SCOPED_TRACE("x " + std::to_string(xdt) + " gy " + std::to_string(ydt) + " cols " + std::to_string(cols) +
                       " gw_mode " + std::to_string(mode));
          const int64_t rows = 37;
          HostMatrix x(xdt, rows, cols), gy(ydt, rows, cols), w(xdt, 1, cols);
          harness::fill_normal(x, rng(), harness::hetero_row_scale);
          harness::fill_normal(gy, rng());
          harness::fill_normal(w, rng(), {}, 1.0);
          auto run = [&](const HostMatrix& xs, const HostMatrix& gys, const HostMatrix& ws, int32_t dtype,
                         uint32_t flags, int32_t m, HostMatrix* gx, HostMatrix* gw) {
            *gx = HostMatrix(dtype, rows, cols);
            *gw = HostMatrix(m == RMSNORM_GW_STORE ? dtype : RMSNORM_DTYPE_F32, 1, cols);
            cpu_backward(problem(dtype, rows, cols, flags), xs, ws, gys, nullptr, gx, gw, m);
          };
          HostMatrix gx, gw, gxf, gwf;
          run(x, gy, w, xdt, RMSNORM_FLAG_Y_DTYPE(ydt), mode, &gx, &gw);
          ASSERT_FALSE(HasFatalFailure());
          run(widened(x), widened(gy), widened(w), RMSNORM_DTYPE_F32, 0,
              mode == RMSNORM_GW_NONE ? RMSNORM_GW_NONE : RMSNORM_GW_STORE_F32, &gxf, &gwf);
          ASSERT_FALSE(HasFatalFailure());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < cols; ++k)
              ASSERT_EQ(gx.get(r, k), harness::round_to(xdt, gxf.get(r, k))) << "gx at row " << r << " col " << k;
          expect_gw_of(gw, gwf, mode, xdt);
        }
}

TEST(YDtype, ArgumentRules) {
  const int64_t rows = 3, cols = 16;
  HostMatrix x(RMSNORM_DTYPE_F32, rows, cols), y(RMSNORM_DTYPE_BF16, rows, cols), w(RMSNORM_DTYPE_F32, 1, cols);
  harness::fill_normal(x, 8);
  harness::fill_normal(w, 9);
  const uint32_t bf16_y = RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_BF16);
  const rmsnorm_problem_t p = problem(RMSNORM_DTYPE_F32, rows, cols, bf16_y);
  const HostMatrix x0 = x;
  // In place needs equal dtypes: a bf16 y over the fp32 x is an overlap.
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, rmsnorm_forward(&p, x.data(), cols, w.data(), x.data(), cols, nullptr, &kCpu));
  EXPECT_EQ(0, std::memcmp(x.storage.data(), x0.storage.data(), x.storage.size())) << "written although refused";
  // y aligned for its own dtype (2 bytes), not x's.
  std::vector<uint16_t> ybuf(static_cast<size_t>(rows * cols) + 1);
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, x.data(), cols, w.data(), ybuf.data() + 1, cols, nullptr, &kCpu))
      << rmsnorm_last_error();
  // The fused operations refuse another y dtype, naming the flag.
  HostMatrix h(RMSNORM_DTYPE_F32, rows, cols);
  EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION, rmsnorm_add_forward(&p, x.data(), cols, x0.data(), cols, w.data(), h.data(),
                                                               cols, y.data(), cols, nullptr, &kCpu));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("RMSNORM_FLAG_Y_DTYPE"), std::string::npos) << rmsnorm_last_error();
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
  std::vector<float> s(static_cast<size_t>(rows));
  rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, nullptr, s.data(), nullptr};
  EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION,
            rmsnorm_forward_quant(&p, x.data(), cols, w.data(), &qt, q.data(), cols, nullptr, &kCpu));
  // In place needs equal dtypes even where the sizes match (f16 y over bf16 x).
  HostMatrix xb(RMSNORM_DTYPE_BF16, rows, cols);
  harness::fill_normal(xb, 10);
  const HostMatrix xb0 = xb;
  const rmsnorm_problem_t pb = problem(RMSNORM_DTYPE_BF16, rows, cols, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_F16));
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, rmsnorm_forward(&pb, xb.data(), cols, nullptr, xb.data(), cols, nullptr, &kCpu));
  EXPECT_EQ(0, std::memcmp(xb.storage.data(), xb0.storage.data(), xb.storage.size())) << "written although refused";
  HostMatrix gyb(RMSNORM_DTYPE_F16, rows, cols);
  harness::fill_normal(gyb, 11);
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, rmsnorm_backward(&pb, xb.data(), cols, nullptr, gyb.data(), cols, nullptr,
                                                     gyb.data(), cols, nullptr, RMSNORM_GW_NONE, nullptr, 0, &kCpu));
  // rmsnorm_add_backward refuses the flag with no rows too (g_h may then be NULL); gw is not written.
  std::vector<float> gw0(static_cast<size_t>(cols), 7.0f);
  size_t wsb = 0;
  const rmsnorm_problem_t p0 = problem(RMSNORM_DTYPE_F32, 0, cols, bf16_y);
  EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION,
            rmsnorm_add_backward(&p0, nullptr, cols, w.data(), nullptr, cols, nullptr, nullptr, cols, nullptr, cols,
                                 gw0.data(), RMSNORM_GW_STORE_F32, nullptr, wsb, &kCpu));
  EXPECT_EQ(gw0[0], 7.0f) << "gw written although refused";
  // The C++ API takes a non-const x view too.
  HostMatrix yc(RMSNORM_DTYPE_BF16, rows, cols);
  EXPECT_EQ(rmsnorm::Status::kSuccess,
            (rmsnorm::forward_to<rmsnorm::bfloat16>(rmsnorm::make_matrix(static_cast<float*>(x.data()), rows, cols), {},
                                                    rmsnorm::make_matrix(static_cast<rmsnorm::bfloat16*>(yc.data()), rows, cols),
                                                    {}, rmsnorm::Options{}, rmsnorm::Backend::cpu(1))))
      << rmsnorm::last_error();
  // The flag naming x's own dtype is the plain call.
  const rmsnorm_problem_t same = problem(RMSNORM_DTYPE_F32, rows, cols, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_F32));
  HostMatrix ya(RMSNORM_DTYPE_F32, rows, cols), yb(RMSNORM_DTYPE_F32, rows, cols);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&same, x.data(), cols, w.data(), ya.data(), cols, nullptr, &kCpu));
  const rmsnorm_problem_t plain = problem(RMSNORM_DTYPE_F32, rows, cols, 0);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&plain, x.data(), cols, w.data(), yb.data(), cols, nullptr, &kCpu));
  EXPECT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.data_bytes()));
}

// fp32 x with bf16 y and gy and the weight of W (fp32, or bf16 with RMSNORM_FLAG_WEIGHT_Y_DTYPE): the C++ API's
// forward and backward (cpp_forward(x, w, y, rstd), cpp_backward(x, w, gy, rstd, gx, gw, workspace)) against the C
// ABI with `flags`, bit for bit; gw in W.
template <class W, class Fwd, class Bwd>
void expect_cpp_is_the_c_abi(uint32_t flags, Fwd&& cpp_forward, Bwd&& cpp_backward) {
  using B = rmsnorm::bfloat16;
  const int64_t rows = 5, cols = 72;
  const int32_t wdt = std::is_same<W, float>::value ? RMSNORM_DTYPE_F32 : RMSNORM_DTYPE_BF16;
  HostMatrix x(RMSNORM_DTYPE_F32, rows, cols), gy(RMSNORM_DTYPE_BF16, rows, cols), w(wdt, 1, cols);
  harness::fill_normal(x, 91, harness::hetero_row_scale);
  harness::fill_normal(gy, 92);
  harness::fill_normal(w, 93, {}, 1.0);
  const rmsnorm_problem_t p = problem(RMSNORM_DTYPE_F32, rows, cols, flags);
  HostMatrix y_c(RMSNORM_DTYPE_BF16, rows, cols), y(RMSNORM_DTYPE_BF16, rows, cols);
  std::vector<float> rstd_c(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_forward(&p, x.data(), cols, w.data(), y_c.data(), cols, rstd_c.data(), &kCpu));
  const auto xv = rmsnorm::make_matrix(static_cast<const float*>(x.data()), rows, cols);
  const auto wv = rmsnorm::make_vector(static_cast<const W*>(w.data()), cols);
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            (cpp_forward(xv, wv, rmsnorm::make_matrix(static_cast<B*>(y.data()), rows, cols),
                                           rmsnorm::make_vector(rstd.data(), rows))))
      << rmsnorm::last_error();
  EXPECT_EQ(0, std::memcmp(y.data(), y_c.data(), y.data_bytes()));
  EXPECT_EQ(0, std::memcmp(rstd.data(), rstd_c.data(), rstd.size() * 4));
  HostMatrix gx(RMSNORM_DTYPE_F32, rows, cols), gx_c(RMSNORM_DTYPE_F32, rows, cols);
  std::vector<W> gw(static_cast<size_t>(cols)), gw_c(static_cast<size_t>(cols));
  size_t wsb = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE, &kCpu, &wsb));
  std::vector<double> ws(wsb / sizeof(double) + 2);
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            cpp_backward(xv, wv, rmsnorm::make_matrix(static_cast<const B*>(gy.data()), rows, cols),
                         rmsnorm::make_vector(static_cast<const float*>(rstd.data()), rows),
                         rmsnorm::make_matrix(static_cast<float*>(gx.data()), rows, cols),
                         rmsnorm::GradWeight<W>::store(rmsnorm::make_vector(gw.data(), cols)),
                         rmsnorm::Workspace{ws.data(), ws.size() * sizeof(double)}))
      << rmsnorm::last_error();
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_backward(&p, x.data(), cols, w.data(), gy.data(), cols, rstd.data(), gx_c.data(), cols, gw_c.data(),
                             RMSNORM_GW_STORE, ws.data(), ws.size() * sizeof(double), &kCpu));
  EXPECT_EQ(0, std::memcmp(gx.data(), gx_c.data(), gx.data_bytes()));
  EXPECT_EQ(0, std::memcmp(gw.data(), gw_c.data(), gw.size() * sizeof(W)));
}

// The C++ API's forward_to / backward_from are the C ABI with the flag.
TEST(YDtype, CppForwardToAndBackwardFromAreTheCAbi) {
  using B = rmsnorm::bfloat16;
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(2);
  expect_cpp_is_the_c_abi<float>(
      RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_BF16),
      [&](auto x, auto w, auto y, auto rstd) { return rmsnorm::forward_to<B>(x, w, y, rstd, rmsnorm::Options{}, be); },
      [&](auto x, auto w, auto gy, auto rstd, auto gx, auto gw, auto ws) {
        return rmsnorm::backward_from<B, float>(x, w, gy, rstd, gx, gw, ws, rmsnorm::Options{}, be);
      });
}

// RMSNORM_FLAG_WEIGHT_Y_DTYPE: fp32 x with the weight in y's 16-bit dtype. Everything is the same call with the fp32
// weight float(w) (every f16 / bf16 value is exact in fp32), bit for bit: rstd, y, gx, and gw, which in
// RMSNORM_GW_STORE / RMSNORM_GW_ACCUMULATE is in the weight's dtype (the fp32 sum rounded once).
TEST(WeightYDtype, IsTheFp32WeightsCallBitForBit) {
  std::mt19937_64 rng(67);
  for (int32_t ydt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F16})
    for (int64_t cols : {1, 33, 1000})
      for (uint32_t extra : {0u, static_cast<uint32_t>(RMSNORM_FLAG_ROUND_XHAT), static_cast<uint32_t>(RMSNORM_FLAG_WEIGHT_OFFSET)})
        for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE}) {
          SCOPED_TRACE("y " + std::to_string(ydt) + " cols " + std::to_string(cols) + " flags " +
                       std::to_string(extra) + " gw_mode " + std::to_string(mode));
          const int64_t rows = 9;
          HostMatrix x(RMSNORM_DTYPE_F32, rows, cols, cols + 3, 1), w(ydt, 1, cols, cols, 1), gy(ydt, rows, cols);
          harness::fill_normal(x, rng(), harness::hetero_row_scale);
          harness::fill_normal(w, rng(), {}, 1.0);
          harness::fill_normal(gy, rng());
          const HostMatrix w32 = widened(w);
          const uint32_t yflag = RMSNORM_FLAG_Y_DTYPE(ydt) | extra;
          const rmsnorm_problem_t p = problem(RMSNORM_DTYPE_F32, rows, cols, yflag | RMSNORM_FLAG_WEIGHT_Y_DTYPE);
          const rmsnorm_problem_t p32 = problem(RMSNORM_DTYPE_F32, rows, cols, yflag);
          HostMatrix y(ydt, rows, cols), y32(ydt, rows, cols);
          std::vector<float> rstd(static_cast<size_t>(rows), NAN), rstd32(static_cast<size_t>(rows), NAN);
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                    rmsnorm_forward(&p, x.data(), x.stride, w.data(), y.data(), cols, rstd.data(), &kCpu))
              << rmsnorm_last_error();
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                    rmsnorm_forward(&p32, x.data(), x.stride, w32.data(), y32.data(), cols, rstd32.data(), &kCpu));
          ASSERT_EQ(0, std::memcmp(rstd.data(), rstd32.data(), rstd.size() * 4)) << "rstd";
          ASSERT_EQ(0, std::memcmp(y.data(), y32.data(), y.data_bytes())) << "y";
          // Backward: gw in the weight's dtype against the fp32 weight's fp32 gw, rounded once.
          const int32_t gw32_mode = mode == RMSNORM_GW_NONE ? RMSNORM_GW_NONE : RMSNORM_GW_STORE_F32;
          HostMatrix gx(RMSNORM_DTYPE_F32, rows, cols), gxf(RMSNORM_DTYPE_F32, rows, cols),
              gw(mode == RMSNORM_GW_STORE_F32 ? RMSNORM_DTYPE_F32 : ydt, 1, cols), gwf(RMSNORM_DTYPE_F32, 1, cols);
          if (mode == RMSNORM_GW_ACCUMULATE) {
            for (int64_t k = 0; k < cols; ++k) gw.set(0, k, 0.0);  // 0 + sum: the store's rounding
          }
          cpu_backward(p, x, w, gy, nullptr, &gx, &gw, mode);
          cpu_backward(p32, x, w32, gy, nullptr, &gxf, &gwf, gw32_mode);
          ASSERT_FALSE(HasFatalFailure());
          ASSERT_EQ(0, std::memcmp(gx.data(), gxf.data(), gx.data_bytes())) << "gx";
          expect_gw_of(gw, gwf, mode == RMSNORM_GW_ACCUMULATE ? RMSNORM_GW_STORE : mode, ydt);
        }
}

TEST(WeightYDtype, ArgumentRules) {
  const int64_t rows = 3, cols = 16;
  HostMatrix x(RMSNORM_DTYPE_F32, rows, cols), y(RMSNORM_DTYPE_BF16, rows, cols), w(RMSNORM_DTYPE_BF16, 1, cols);
  harness::fill_normal(x, 12);
  harness::fill_normal(w, 13);
  const HostMatrix y0 = y;
  auto refused = [&](int32_t dtype, uint32_t flags, const char* why) {
    SCOPED_TRACE(why);
    const rmsnorm_problem_t p = problem(dtype, rows, cols, flags | RMSNORM_FLAG_WEIGHT_Y_DTYPE);
    EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION,
              rmsnorm_forward(&p, x.data(), cols, w.data(), y.data(), cols, nullptr, &kCpu));
    EXPECT_NE(std::string(rmsnorm_last_error()).find("RMSNORM_FLAG_WEIGHT_Y_DTYPE"), std::string::npos)
        << rmsnorm_last_error();
    EXPECT_EQ(0, std::memcmp(y.storage.data(), y0.storage.data(), y.storage.size())) << "written although refused";
    size_t bytes = 0;
    EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE, &kCpu, &bytes));
  };
  refused(RMSNORM_DTYPE_F32, 0, "no RMSNORM_FLAG_Y_DTYPE");
  refused(RMSNORM_DTYPE_F32, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_F32), "fp32 y");
  refused(RMSNORM_DTYPE_BF16, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_F16), "16-bit x");
  refused(RMSNORM_DTYPE_F32, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_BF16) | RMSNORM_FLAG_WEIGHT_F32, "with WEIGHT_F32");
  // The weight needs its own dtype's alignment (2 bytes), not x's.
  const rmsnorm_problem_t p =
      problem(RMSNORM_DTYPE_F32, rows, cols, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_BF16) | RMSNORM_FLAG_WEIGHT_Y_DTYPE);
  std::vector<uint16_t> wbuf(static_cast<size_t>(cols) + 1);
  std::memcpy(wbuf.data() + 1, w.data(), static_cast<size_t>(cols) * 2);
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, x.data(), cols, wbuf.data() + 1, y.data(), cols, nullptr, &kCpu))
      << rmsnorm_last_error();
  // gw in the weight's dtype: cols elements of 2 bytes, so gy may start right after it (a gw of fp32 elements would
  // overlap gy), and not one element earlier.
  std::vector<uint16_t> buf(static_cast<size_t>(cols + rows * cols));
  HostMatrix gy(RMSNORM_DTYPE_BF16, rows, cols), gx(RMSNORM_DTYPE_F32, rows, cols);
  harness::fill_normal(gy, 14);
  std::memcpy(buf.data() + cols, gy.data(), gy.data_bytes());
  size_t wsb = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE, &kCpu, &wsb));
  std::vector<unsigned char> ws(wsb + 16);
  void* const wsp = wsb > 0 ? ws.data() : nullptr;
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward(&p, x.data(), cols, w.data(), buf.data() + cols, cols, nullptr,
                                                     gx.data(), cols, buf.data(), RMSNORM_GW_STORE, wsp, wsb, &kCpu))
      << rmsnorm_last_error();
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, rmsnorm_backward(&p, x.data(), cols, w.data(), buf.data() + cols, cols, nullptr,
                                                     gx.data(), cols, buf.data() + 1, RMSNORM_GW_STORE, wsp, wsb, &kCpu));
}

// The C++ API's forward_f32_to / backward_f32_from are the C ABI with the flags; its workspace query names the dtypes.
TEST(WeightYDtype, CppForwardAndBackwardAreTheCAbi) {
  using B = rmsnorm::bfloat16;
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(2);
  const uint32_t flags = RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_BF16) | RMSNORM_FLAG_WEIGHT_Y_DTYPE;
  expect_cpp_is_the_c_abi<B>(
      flags,
      [&](auto x, auto w, auto y, auto rstd) { return rmsnorm::forward_f32_to<B>(x, w, y, rstd, rmsnorm::Options{}, be); },
      [&](auto x, auto w, auto gy, auto rstd, auto gx, auto gw, auto ws) {
        return rmsnorm::backward_f32_from<B>(x, w, gy, rstd, gx, gw, ws, rmsnorm::Options{}, be);
      });
  const rmsnorm_problem_t p = problem(RMSNORM_DTYPE_F32, 5, 72, flags);
  size_t bytes = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE, &kCpu, &bytes));
  EXPECT_EQ(bytes, (rmsnorm::backward_workspace_size_or_throw<float, B, B>(5, 72, rmsnorm::GwMode::kStore, be)));
}

// RMSNORM_FLAG_RESIDUAL_F32: an fp32 residual stream with bf16 / f16 x. Forward: h is float(x) + residual exactly,
// and y and rstd are rmsnorm_forward's of that fp32 h with y in x's dtype. Backward: gx is float(gx_norm + g_h),
// gx_norm and gw being rmsnorm_backward's of the fp32 h with gy in x's dtype.
TEST(ResidualF32, ForwardIsTheForwardOfTheFp32H) {
  std::mt19937_64 rng(66);
  for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F16})
    for (int64_t cols : {1, 33, 1000})
      for (int in_place : {0, 1, 2}) {  // 2: h apart, with round_xhat (x_hat rounds to h's dtype: fp32)
        SCOPED_TRACE("dtype " + std::to_string(dt) + " cols " + std::to_string(cols) + " case " + std::to_string(in_place));
        const uint32_t extra = in_place == 2 ? static_cast<uint32_t>(RMSNORM_FLAG_ROUND_XHAT) : 0u;
        const int64_t rows = 11;
        HostMatrix x(dt, rows, cols), res(RMSNORM_DTYPE_F32, rows, cols, cols + 2, 1), w(dt, 1, cols);
        harness::fill_normal(x, rng(), harness::hetero_row_scale);
        harness::fill_normal(res, rng(), harness::hetero_row_scale);
        harness::fill_normal(w, rng(), {}, 1.0);
        const HostMatrix res0 = res;
        HostMatrix h_own(RMSNORM_DTYPE_F32, rows, cols), y(dt, rows, cols);
        HostMatrix& h = in_place == 1 ? res : h_own;
        std::vector<float> rstd(static_cast<size_t>(rows), NAN);
        const rmsnorm_problem_t p = problem(dt, rows, cols, RMSNORM_FLAG_RESIDUAL_F32 | extra);
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                  rmsnorm_add_forward(&p, x.data(), cols, res.data(), res.stride, w.data(), h.data(), h.stride,
                                      y.data(), cols, rstd.data(), &kCpu))
            << rmsnorm_last_error();
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k)
            ASSERT_EQ(h.get(r, k), static_cast<double>(static_cast<float>(x.get(r, k)) + static_cast<float>(res0.get(r, k))))
                << "h at row " << r << " col " << k;
        const rmsnorm_problem_t p32 = problem(RMSNORM_DTYPE_F32, rows, cols, RMSNORM_FLAG_Y_DTYPE(dt) | extra);
        const HostMatrix w32 = widened(w);
        HostMatrix y_want(dt, rows, cols);
        std::vector<float> rstd_want(static_cast<size_t>(rows), NAN);
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p32, h.data(), h.stride, w32.data(), y_want.data(), cols,
                                                          rstd_want.data(), &kCpu));
        ASSERT_EQ(0, std::memcmp(rstd.data(), rstd_want.data(), rstd.size() * 4)) << "rstd";
        ASSERT_EQ(0, std::memcmp(y.data(), y_want.data(), y.data_bytes())) << "y";
      }
}

TEST(ResidualF32, BackwardIsTheFp32ProblemPlusGh) {
  std::mt19937_64 rng(67);
  for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F16})
    for (int64_t cols : {1, 40, 1000})
      for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32}) {
        SCOPED_TRACE("dtype " + std::to_string(dt) + " cols " + std::to_string(cols) + " gw_mode " + std::to_string(mode));
        const int64_t rows = 29;
        HostMatrix h(RMSNORM_DTYPE_F32, rows, cols), gy(dt, rows, cols), gh(RMSNORM_DTYPE_F32, rows, cols), w(dt, 1, cols);
        harness::fill_normal(h, rng(), harness::hetero_row_scale);
        harness::fill_normal(gy, rng());
        harness::fill_normal(gh, rng());
        harness::fill_normal(w, rng(), {}, 1.0);
        HostMatrix gx(RMSNORM_DTYPE_F32, rows, cols), gw(mode == RMSNORM_GW_STORE ? dt : RMSNORM_DTYPE_F32, 1, cols);
        cpu_backward(problem(dt, rows, cols, RMSNORM_FLAG_RESIDUAL_F32), h, w, gy, &gh, &gx, &gw, mode);
        ASSERT_FALSE(HasFatalFailure());
        // The fp32 problem on h with gy in dt and the weight widened.
        HostMatrix gx32(RMSNORM_DTYPE_F32, rows, cols), gw32(RMSNORM_DTYPE_F32, 1, cols);
        cpu_backward(problem(RMSNORM_DTYPE_F32, rows, cols, RMSNORM_FLAG_Y_DTYPE(dt)), h, widened(w), gy, nullptr,
                     &gx32, &gw32, mode == RMSNORM_GW_NONE ? RMSNORM_GW_NONE : RMSNORM_GW_STORE_F32);
        ASSERT_FALSE(HasFatalFailure());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k)
            ASSERT_EQ(gx.get(r, k), static_cast<double>(static_cast<float>(gx32.get(r, k)) + static_cast<float>(gh.get(r, k))))
                << "gx at row " << r << " col " << k;
        expect_gw_of(gw, gw32, mode, dt);
      }
}

TEST(ResidualF32, ArgumentRules) {
  const int64_t rows = 3, cols = 16;
  const int32_t dt = RMSNORM_DTYPE_BF16;
  HostMatrix x(dt, rows, cols), res(RMSNORM_DTYPE_F32, rows, cols), y(dt, rows, cols), w(dt, 1, cols);
  harness::fill_normal(x, 12);
  harness::fill_normal(res, 13);
  const rmsnorm_problem_t p = problem(dt, rows, cols, RMSNORM_FLAG_RESIDUAL_F32);
  const HostMatrix x0 = x;
  // h over x (another dtype) is an overlap; nothing written.
  EXPECT_EQ(RMSNORM_STATUS_OVERLAP, rmsnorm_add_forward(&p, x.data(), cols, res.data(), cols, w.data(), x.data(), cols,
                                                        y.data(), cols, nullptr, &kCpu));
  EXPECT_EQ(0, std::memcmp(x.storage.data(), x0.storage.data(), x.storage.size())) << "written although refused";
  // The other operations refuse the flag.
  EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION, rmsnorm_forward(&p, x.data(), cols, w.data(), y.data(), cols, nullptr, &kCpu));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("RMSNORM_FLAG_RESIDUAL_F32"), std::string::npos) << rmsnorm_last_error();
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
  std::vector<float> s(static_cast<size_t>(rows));
  rmsnorm_quant_t qt{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, nullptr, s.data(), nullptr};
  HostMatrix h(RMSNORM_DTYPE_F32, rows, cols);
  EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION, rmsnorm_add_forward_quant(&p, x.data(), cols, res.data(), cols, w.data(),
                                                                     h.data(), cols, &qt, q.data(), cols, nullptr, &kCpu));
  HostMatrix gx(dt, rows, cols);
  EXPECT_EQ(RMSNORM_STATUS_INVALID_OPTION, rmsnorm_backward(&p, x.data(), cols, w.data(), x.data(), cols, nullptr,
                                                            gx.data(), cols, nullptr, RMSNORM_GW_NONE, nullptr, 0, &kCpu));
  // With fp32 x the flag changes nothing.
  HostMatrix xf(RMSNORM_DTYPE_F32, rows, cols), wf(RMSNORM_DTYPE_F32, 1, cols), ya(RMSNORM_DTYPE_F32, rows, cols),
      yb(RMSNORM_DTYPE_F32, rows, cols), ha(RMSNORM_DTYPE_F32, rows, cols), hb(RMSNORM_DTYPE_F32, rows, cols);
  harness::fill_normal(xf, 14);
  harness::fill_normal(wf, 15);
  const rmsnorm_problem_t pf = problem(RMSNORM_DTYPE_F32, rows, cols, RMSNORM_FLAG_RESIDUAL_F32);
  const rmsnorm_problem_t pp = problem(RMSNORM_DTYPE_F32, rows, cols, 0);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&pf, xf.data(), cols, res.data(), cols, wf.data(), ha.data(),
                                                        cols, ya.data(), cols, nullptr, &kCpu));
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&pp, xf.data(), cols, res.data(), cols, wf.data(), hb.data(),
                                                        cols, yb.data(), cols, nullptr, &kCpu));
  EXPECT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.data_bytes()));
  EXPECT_EQ(0, std::memcmp(ha.data(), hb.data(), ha.data_bytes()));
}

// rmsnorm_add_backward_x: gx and gw bit for bit rmsnorm_add_backward's, and x's gradient gx_x each element of gx
// rounded to x's dtype (the harness's own rounding, round to nearest even); the C++ add_backward_x is the C ABI.
// Refused with nothing written: without RMSNORM_FLAG_RESIDUAL_F32, gx_x NULL, a short row stride, gx_x over gy, gx
// or g_h. No rows: gx_x may be NULL.
TEST(ResidualF32, BackwardXIsGxRoundedToXsDtype) {
  for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F16}) {
    SCOPED_TRACE(dt);
    const int64_t rows = 5, cols = 70;
    HostMatrix h(RMSNORM_DTYPE_F32, rows, cols), w(dt, 1, cols), gy(dt, rows, cols), gh(RMSNORM_DTYPE_F32, rows, cols);
    harness::fill_normal(h, 120, harness::hetero_row_scale);
    harness::fill_normal(w, 121, {}, 1.0);
    harness::fill_normal(gy, 122);
    harness::fill_normal(gh, 123);
    const rmsnorm_problem_t p = problem(dt, rows, cols, RMSNORM_FLAG_RESIDUAL_F32);
    std::vector<double> ws(1 << 16);
    const size_t wsb = ws.size() * 8;
    HostMatrix gx_c(RMSNORM_DTYPE_F32, rows, cols), gw_c(dt, 1, cols);
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_backward(&p, h.data(), cols, w.data(), gy.data(), cols, nullptr, gh.data(), cols,
                                   gx_c.data(), cols, gw_c.data(), RMSNORM_GW_STORE, ws.data(), wsb, &kCpu));
    HostMatrix gx(RMSNORM_DTYPE_F32, rows, cols), gx_x(dt, rows, cols + 3), gw(dt, 1, cols);
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_backward_x(&p, h.data(), cols, w.data(), gy.data(), cols, nullptr, gh.data(), cols,
                                     gx.data(), cols, gx_x.data(), cols + 3, gw.data(), RMSNORM_GW_STORE, ws.data(),
                                     wsb, &kCpu))
        << rmsnorm_last_error();
    EXPECT_EQ(0, std::memcmp(gx.data(), gx_c.data(), gx.data_bytes()));
    EXPECT_EQ(0, std::memcmp(gw.data(), gw_c.data(), gw.data_bytes()));
    HostMatrix want(dt, rows, cols + 3);  // the padding keeps its poison in both
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) want.set(r, k, gx_c.get(r, k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols + 3; ++k)
        ASSERT_EQ(0, std::memcmp(static_cast<const char*>(gx_x.data()) + gx_x.index(r, k) * 2,
                                 static_cast<const char*>(want.data()) + want.index(r, k) * 2, 2))
            << "gx_x(" << r << ", " << k << ") = " << gx_x.get(r, k) << ", want " << want.get(r, k);

    // The C++ API.
    using B = rmsnorm::bfloat16;
    using H = rmsnorm::half;
    HostMatrix gx2(RMSNORM_DTYPE_F32, rows, cols), gx_x2(dt, rows, cols + 3), gw2(dt, 1, cols);
    auto cpp = [&](auto tag) {
      using T = decltype(tag);
      return rmsnorm::add_backward_x<T>(
          rmsnorm::make_matrix(static_cast<const float*>(h.data()), rows, cols),
          rmsnorm::make_vector(static_cast<const T*>(w.data()), cols),
          rmsnorm::make_matrix(static_cast<const T*>(gy.data()), rows, cols), rmsnorm::VectorView<const float>{},
          rmsnorm::make_matrix(static_cast<const float*>(gh.data()), rows, cols),
          rmsnorm::make_matrix(static_cast<float*>(gx2.data()), rows, cols),
          rmsnorm::make_matrix(static_cast<T*>(gx_x2.data()), rows, cols, cols + 3),
          rmsnorm::GradWeight<T>::store(rmsnorm::make_vector(static_cast<T*>(gw2.data()), cols)),
          rmsnorm::Workspace{ws.data(), wsb}, rmsnorm::Options{}, rmsnorm::Backend::cpu(2));
    };
    ASSERT_EQ(rmsnorm::Status::kSuccess, dt == RMSNORM_DTYPE_BF16 ? cpp(B{}) : cpp(H{})) << rmsnorm::last_error();
    EXPECT_EQ(0, std::memcmp(gx_x2.storage.data(), gx_x.storage.data(), gx_x.storage.size()));
    EXPECT_EQ(0, std::memcmp(gx2.data(), gx.data(), gx.data_bytes()));
    EXPECT_EQ(0, std::memcmp(gw2.data(), gw.data(), gw.data_bytes()));

    // Refusals: every output keeps its poison.
    auto refused = [&](rmsnorm_status_t want_status, const rmsnorm_problem_t& q, void* gxx, int64_t gxx_stride,
                       const void* gyp, const char* what) {
      SCOPED_TRACE(what);
      HostMatrix gx3(RMSNORM_DTYPE_F32, rows, cols), gw3(dt, 1, cols);
      const std::vector<unsigned char> gx_before = gx3.storage, gw_before = gw3.storage, gy_before = gy.storage;
      EXPECT_EQ(want_status, rmsnorm_add_backward_x(&q, h.data(), cols, w.data(), gyp, cols, nullptr, gh.data(), cols,
                                                    gx3.data(), cols, gxx, gxx_stride, gw3.data(),
                                                    RMSNORM_GW_STORE, ws.data(), wsb, &kCpu));
      EXPECT_TRUE(gx3.storage == gx_before);
      EXPECT_TRUE(gw3.storage == gw_before);
      EXPECT_TRUE(gy.storage == gy_before);
    };
    HostMatrix poison_x(dt, rows, cols);
    refused(RMSNORM_STATUS_INVALID_OPTION, problem(dt, rows, cols, 0), poison_x.data(), cols, gy.data(),
            "without RMSNORM_FLAG_RESIDUAL_F32");
    EXPECT_TRUE(poison_x.storage == HostMatrix(dt, rows, cols).storage);
    refused(RMSNORM_STATUS_NULL_POINTER, p, nullptr, cols, gy.data(), "gx_x NULL");
    EXPECT_NE(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_backward_x(&p, h.data(), cols, w.data(), gy.data(), cols, nullptr, gh.data(), cols,
                                     gx.data(), cols, poison_x.data(), cols - 1, gw.data(), RMSNORM_GW_STORE, ws.data(),
                                     wsb, &kCpu));
    EXPECT_TRUE(poison_x.storage == HostMatrix(dt, rows, cols).storage) << "short stride";
    HostMatrix gy_copy = gy;
    refused(RMSNORM_STATUS_OVERLAP, p, gy_copy.data(), cols, gy_copy.data(), "gx_x over gy");
    EXPECT_TRUE(gy_copy.storage == gy.storage);
    // gx_x over g_h's first half (g_h is read, gx_x would be written).
    EXPECT_EQ(RMSNORM_STATUS_OVERLAP,
              rmsnorm_add_backward_x(&p, h.data(), cols, w.data(), gy.data(), cols, nullptr, gh.data(), cols,
                                     gx.data(), cols, gh.data(), cols, gw.data(), RMSNORM_GW_STORE, ws.data(), wsb,
                                     &kCpu));
    EXPECT_EQ(RMSNORM_STATUS_OVERLAP,
              rmsnorm_add_backward_x(&p, h.data(), cols, w.data(), gy.data(), cols, nullptr, gh.data(), cols,
                                     gx.data(), cols, gx.data(), cols, gw.data(), RMSNORM_GW_STORE, ws.data(), wsb,
                                     &kCpu));
    // No rows: nothing is read or written but gw (the empty sum); gx_x may be NULL.
    const rmsnorm_problem_t p0 = problem(dt, 0, cols, RMSNORM_FLAG_RESIDUAL_F32);
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_add_backward_x(&p0, nullptr, cols, w.data(), nullptr, cols, nullptr, nullptr, cols, nullptr, cols,
                                     nullptr, cols, gw.data(), RMSNORM_GW_STORE, nullptr, 0, &kCpu))
        << rmsnorm_last_error();
  }
}

// The C++ API: add_forward with a float h (R deduced) and add_backward<float, T> are the C ABI with the flag.
TEST(ResidualF32, CppAddForwardAndBackwardAreTheCAbi) {
  const int64_t rows = 4, cols = 80;
  using B = rmsnorm::bfloat16;
  HostMatrix x(RMSNORM_DTYPE_BF16, rows, cols), res(RMSNORM_DTYPE_F32, rows, cols), w(RMSNORM_DTYPE_BF16, 1, cols),
      gy(RMSNORM_DTYPE_BF16, rows, cols), gh(RMSNORM_DTYPE_F32, rows, cols);
  harness::fill_normal(x, 94, harness::hetero_row_scale);
  harness::fill_normal(res, 95);
  harness::fill_normal(w, 96, {}, 1.0);
  harness::fill_normal(gy, 97);
  harness::fill_normal(gh, 98);
  const rmsnorm_problem_t p = problem(RMSNORM_DTYPE_BF16, rows, cols, RMSNORM_FLAG_RESIDUAL_F32);
  HostMatrix h_c(RMSNORM_DTYPE_F32, rows, cols), y_c(RMSNORM_DTYPE_BF16, rows, cols), h(RMSNORM_DTYPE_F32, rows, cols),
      y(RMSNORM_DTYPE_BF16, rows, cols);
  std::vector<float> rstd_c(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, x.data(), cols, res.data(), cols, w.data(), h_c.data(),
                                                        cols, y_c.data(), cols, rstd_c.data(), &kCpu));
  const rmsnorm::Backend be = rmsnorm::Backend::cpu(2);
  const auto wv = rmsnorm::make_vector(static_cast<const B*>(w.data()), cols);
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            rmsnorm::add_forward(rmsnorm::make_matrix(static_cast<const B*>(x.data()), rows, cols),
                                 rmsnorm::make_matrix(static_cast<const float*>(res.data()), rows, cols), wv,
                                 rmsnorm::make_matrix(static_cast<float*>(h.data()), rows, cols),
                                 rmsnorm::make_matrix(static_cast<B*>(y.data()), rows, cols),
                                 rmsnorm::make_vector(rstd.data(), rows), rmsnorm::Options{}, be))
      << rmsnorm::last_error();
  EXPECT_EQ(0, std::memcmp(h.data(), h_c.data(), h.data_bytes()));
  EXPECT_EQ(0, std::memcmp(y.data(), y_c.data(), y.data_bytes()));
  EXPECT_EQ(0, std::memcmp(rstd.data(), rstd_c.data(), rstd.size() * 4));
  HostMatrix gx_c(RMSNORM_DTYPE_F32, rows, cols), gx(RMSNORM_DTYPE_F32, rows, cols), gw_c(RMSNORM_DTYPE_BF16, 1, cols),
      gw(RMSNORM_DTYPE_BF16, 1, cols);
  std::vector<double> ws(1 << 16);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_add_backward(&p, h.data(), cols, w.data(), gy.data(), cols, rstd.data(), gh.data(), cols,
                                 gx_c.data(), cols, gw_c.data(), RMSNORM_GW_STORE, ws.data(), ws.size() * 8, &kCpu));
  ASSERT_EQ(rmsnorm::Status::kSuccess,
            (rmsnorm::add_backward<float, B>(
                rmsnorm::make_matrix(static_cast<const float*>(h.data()), rows, cols), wv,
                rmsnorm::make_matrix(static_cast<const B*>(gy.data()), rows, cols),
                rmsnorm::make_vector(static_cast<const float*>(rstd.data()), rows),
                rmsnorm::make_matrix(static_cast<const float*>(gh.data()), rows, cols),
                rmsnorm::make_matrix(static_cast<float*>(gx.data()), rows, cols),
                rmsnorm::GradWeight<B>::store(rmsnorm::make_vector(static_cast<B*>(gw.data()), cols)),
                rmsnorm::Workspace{ws.data(), ws.size() * 8}, rmsnorm::Options{}, be)))
      << rmsnorm::last_error();
  EXPECT_EQ(0, std::memcmp(gx.data(), gx_c.data(), gx.data_bytes()));
  EXPECT_EQ(0, std::memcmp(gw.data(), gw_c.data(), gw.data_bytes()));
}

}  // namespace
}  // namespace rmsnorm::test
