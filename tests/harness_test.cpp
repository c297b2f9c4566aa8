// The harness (harness/) that the tests, the CLI and the benchmark share:
// tolerance values, fills, the worst-element comparison, the reference check
// and the JSON writer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/host_matrix.hpp"
#include "harness/json.hpp"
#include "harness/random.hpp"
#include "harness/stats.hpp"
#include "harness/tolerance.hpp"
#include "rmsnorm/rmsnorm.h"

namespace rmsnorm::harness {
namespace {

const int32_t kDtypes[] = {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16};

TEST(HarnessTolerance, UlpOfEachDtype) {
  EXPECT_EQ(ulp(RMSNORM_DTYPE_F32, 1.0), std::ldexp(1.0, -23));
  EXPECT_EQ(ulp(RMSNORM_DTYPE_F16, 1.0), std::ldexp(1.0, -10));
  EXPECT_EQ(ulp(RMSNORM_DTYPE_BF16, 1.0), std::ldexp(1.0, -7));
  EXPECT_EQ(ulp(RMSNORM_DTYPE_F16, -3.0), std::ldexp(1.0, -9));
  // Below the smallest normal the spacing stays that of the subnormals.
  EXPECT_EQ(ulp(RMSNORM_DTYPE_F16, 0.0), std::ldexp(1.0, -24));
  EXPECT_EQ(ulp(RMSNORM_DTYPE_F16, 1e-7), std::ldexp(1.0, -24));
  EXPECT_EQ(ulp(RMSNORM_DTYPE_BF16, 0.0), std::ldexp(1.0, -133));
}

TEST(HarnessTolerance, BoundsAreTheModelsSums) {
  const int64_t rows = 300, cols = 4096;
  EXPECT_EQ(acc_rel(cols), std::ldexp(8.0 + 4.0 * 64.0, -24));
  for (int32_t dt : kDtypes) {
    EXPECT_EQ(y_tol(dt, -0.7, cols), ulp(dt, -0.7) + acc_rel(cols) * 0.7);
    EXPECT_EQ(y_round_xhat_tol(dt, 0.7, 1.3, -2.0, cols), ulp(dt, 1.3) * 2.0 + ulp(dt, 0.7) + acc_rel(cols) * 0.7);
    EXPECT_EQ(gx_tol(dt, 0.25, 3.0, cols), ulp(dt, 0.25) + acc_rel(cols) * 3.0);
    EXPECT_EQ(gw_tol(dt, 5.0, 40.0, rows, cols), ulp(dt, 5.0) + (acc_rel(cols) + acc_rel(rows)) * 40.0);
    // The gw bound grows with sqrt(rows).
    EXPECT_GT(gw_tol(dt, 5.0, 40.0, 4 * rows, cols), gw_tol(dt, 5.0, 40.0, rows, cols));
  }
  EXPECT_EQ(half_ulp_rel(RMSNORM_DTYPE_BF16), std::ldexp(1.0, -8));
}

TEST(HarnessRandom, NeverZeroAndIndependentOfLayout) {
  for (int32_t dt : kDtypes) {
    // Four times the smallest subnormal: draws under 1/8 round to zero.
    const double tiny = std::ldexp(1.0, dt == RMSNORM_DTYPE_F16 ? -22 : dt == RMSNORM_DTYPE_BF16 ? -131 : -147);
    HostMatrix m(dt, 5, 300);
    fill_normal(m, 7, [&](int64_t r) { return r == 2 ? tiny : 1.0; });
    HostMatrix strided(dt, 5, 300, 311, 3);
    fill_normal(strided, 7, [&](int64_t r) { return r == 2 ? tiny : 1.0; });
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) {
        ASSERT_NE(m.get(r, c), 0.0) << r << " " << c;
        ASSERT_TRUE(std::isfinite(m.get(r, c)));
        ASSERT_EQ(m.get(r, c), strided.get(r, c));
      }
    HostMatrix u(dt, 3, 1000);
    fill_uniform(u, 9);
    for (int64_t c = 0; c < u.cols; ++c) {
      ASSERT_NE(u.get(1, c), 0.0);
      ASSERT_GE(u.get(1, c), -2.0);
      ASSERT_LE(u.get(1, c), 2.0);
    }
  }
}

TEST(HarnessRandom, FreshPerSeedAndNormal) {
  HostMatrix a(RMSNORM_DTYPE_F32, 1, 20000), b(RMSNORM_DTYPE_F32, 1, 20000);
  fill_normal(a, 1);
  fill_normal(b, 2);
  double sum = 0, sq = 0;
  int64_t same = 0;
  for (int64_t c = 0; c < a.cols; ++c) {
    sum += a.get(0, c);
    sq += a.get(0, c) * a.get(0, c);
    same += a.get(0, c) == b.get(0, c);
  }
  EXPECT_EQ(same, 0);
  EXPECT_NEAR(sum / 20000, 0.0, 0.05);
  EXPECT_NEAR(sq / 20000, 1.0, 0.05);
  // The heterogeneous scales: neighbours differ, 2^-4 .. 2^4 over a cycle of 9.
  EXPECT_EQ(hetero_row_scale(0), 1.0 / 16);
  EXPECT_EQ(hetero_row_scale(1), 2.0);
  for (int64_t r = 0; r < 9; ++r) EXPECT_NE(hetero_row_scale(r), hetero_row_scale(r + 1));
}

TEST(HarnessCompare, WorstElementRules) {
  EXPECT_EQ(err_over_tol(1.5, 1.0, 1.0), 0.5);
  EXPECT_EQ(err_over_tol(1.0, 1.0, 0.0), 0.0);
  EXPECT_EQ(err_over_tol(1.1, 1.0, 0.0), INFINITY);
  EXPECT_EQ(err_over_tol(NAN, 1.0, 1.0), INFINITY);  // poison left unwritten
  EXPECT_EQ(err_over_tol(INFINITY, INFINITY, 1.0), INFINITY);

  Worst a, b;
  a.add(0, 0, 1.0, 1.0, 1.0);
  a.add(0, 1, 3.0, 1.0, 1.0);  // ratio 2: bad
  b.add(5, 2, 0.0, 2.0, 1.0);  // ratio 2 too, later row
  b.add(6, 0, 1.0, 1.5, 1.0);
  Worst m = b;
  m.merge(a);
  EXPECT_EQ(m.count, 4);
  EXPECT_EQ(m.bad, 2);
  EXPECT_EQ(m.row, 0);  // on a tie, the earlier row
  EXPECT_EQ(m.col, 1);
  EXPECT_FALSE(m.passed());
  EXPECT_EQ(m.describe("gx", false),
            "gx: 2 of 4 elements out of tolerance; worst at row 0 col 1: got 3 expected 1 tol 1 (err/tol 2)");
  EXPECT_EQ(m.describe("gw", true, " (f16)"),
            "gw: 2 of 4 elements out of tolerance (f16); worst at col 1: got 3 expected 1 tol 1 (err/tol 2)");
}

// The CPU backend's results pass the reference check; one wrong element is
// found and named.
TEST(HarnessCompare, ReferenceCheckFindsTheWrongElement) {
  const int64_t rows = 37, cols = 300;
  for (int32_t dt : kDtypes) {
    HostMatrix x(dt, rows, cols), gy(dt, rows, cols), w(dt, 1, cols);
    fill_normal(x, 1, hetero_row_scale);
    fill_normal(gy, 2);
    fill_normal(w, 3, [](int64_t) { return 0.25; }, 1.0);
    HostMatrix y(dt, rows, cols), gx(dt, rows, cols), gw(RMSNORM_DTYPE_F32, 1, cols);
    rmsnorm_problem_t p = rmsnorm_problem_default();
    p.rows = rows;
    p.cols = cols;
    p.dtype = dt;
    const rmsnorm_backend_t be = rmsnorm_backend_cpu(0);
    size_t ws_bytes = 0;
    ASSERT_EQ(rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE_F32, &be, &ws_bytes), RMSNORM_STATUS_SUCCESS);
    std::vector<float> ws(ws_bytes / 4 + 4);
    ASSERT_EQ(rmsnorm_forward(&p, x.data(), cols, w.data(), y.data(), cols, nullptr, &be), RMSNORM_STATUS_SUCCESS);
    ASSERT_EQ(rmsnorm_backward(&p, x.data(), cols, w.data(), gy.data(), cols, nullptr, gx.data(), cols, gw.data(),
                               RMSNORM_GW_STORE_F32, ws.data(), ws.size() * 4, &be),
              RMSNORM_STATUS_SUCCESS);
    Outputs out;
    out.y = &y;
    out.gx.push_back({"gx", &gx});
    out.gw.push_back({"gw", &gw, 0.0});
    reference::Options opt;
    opt.eps = static_cast<double>(p.eps);
    std::vector<CheckResult> r = check_against_reference(x, &w, &gy, opt, out);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r[0].name, "y");
    for (const CheckResult& c : r) {
      EXPECT_TRUE(c.worst.passed()) << c.worst.describe(c.name, c.vector);
      EXPECT_EQ(c.worst.count, c.vector ? cols : rows * cols);
    }
    EXPECT_TRUE(r[2].vector);

    gx.set(29, 123, gx.get(29, 123) * 1.5 + 1.0);
    r = check_against_reference(x, &w, &gy, opt, out);
    EXPECT_EQ(r[1].worst.bad, 1);
    EXPECT_EQ(r[1].worst.row, 29);
    EXPECT_EQ(r[1].worst.col, 123);
  }
}

TEST(HarnessStats, Quantiles) {
  EXPECT_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(median({4.0, 1.0, 2.0, 3.0}), 2.5);
  EXPECT_TRUE(std::isnan(median({})));
  const std::vector<double> s = {0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0};
  EXPECT_DOUBLE_EQ(quantile(s, 0.1), 10.0);
  EXPECT_DOUBLE_EQ(quantile(s, 0.95), 95.0);
}

TEST(HarnessJson, Layout) {
  JsonWriter j;
  j.begin_object();
  j.field("name", "a\"b\\c\n").field("n", int64_t{-3}).field("bytes", 2147483648.0).field("x", 0.1);
  j.field("eps", 1e-5f).field("nan", NAN).field("ok", true);
  j.key("items").begin_array();
  j.begin_object(true).field("k", 1).key("v").begin_array().value(1.5).null().end_array().end_object();
  j.end_array();
  j.key("empty").begin_array().end_array();
  j.end_object();
  EXPECT_EQ(j.str(),
            "{\n"
            "  \"name\": \"a\\\"b\\\\c\\n\",\n"
            "  \"n\": -3,\n"
            "  \"bytes\": 2147483648,\n"
            "  \"x\": 0.1,\n"
            "  \"eps\": 1e-05,\n"
            "  \"nan\": null,\n"
            "  \"ok\": true,\n"
            "  \"items\": [\n"
            "    {\"k\": 1, \"v\": [1.5, null]}\n"
            "  ],\n"
            "  \"empty\": []\n"
            "}\n");
}

TEST(HarnessJson, FileChecks) {
  const std::string dir = ::testing::TempDir();
  EXPECT_NE(json_file_error(dir + "/no-such-dir/x.json"), "");
  const std::string path = dir + "/harness_test_probe.json";
  std::remove(path.c_str());
  EXPECT_EQ(json_file_error(path), "");
  std::FILE* f = std::fopen(path.c_str(), "r");
  EXPECT_EQ(f, nullptr) << "the probe left a file behind";
  if (f != nullptr) std::fclose(f);
  ASSERT_EQ(write_text_file(path, "{}\n"), "");
  EXPECT_EQ(json_file_error(path), "");  // an existing file keeps its contents
  f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[8] = {};
  EXPECT_EQ(std::fread(buf, 1, sizeof buf, f), 3u);
  std::fclose(f);
  EXPECT_EQ(std::string(buf), "{}\n");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace rmsnorm::harness
