// Comparison of library results with expected values: every element, the
// worst one (largest error / tolerance) kept and printed. Also the whole
// check of a problem's y, gx and gw against the float64 reference, as the CLI
// and the benchmark run it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/host_matrix.hpp"
#include "rmsnorm_reference.hpp"

namespace rmsnorm::harness {

// |got - expected| / tol: infinite when got is not finite (NaN poison left
// unwritten, overflow), and when tol is 0 and the two differ.
double err_over_tol(double got, double expected, double tol);

// The worst element of one compared output, and how many failed.
struct Worst {
  int64_t count = 0, bad = 0, row = -1, col = -1;
  double ratio = -1.0, got = 0.0, expected = 0.0, tol = 0.0;

  void add(int64_t r, int64_t c, double g, double e, double t) {
    ++count;
    const double q = err_over_tol(g, e, t);
    if (!(q <= 1.0)) ++bad;
    if (row < 0 || q > ratio) {
      ratio = q;
      row = r;
      col = c;
      got = g;
      expected = e;
      tol = t;
    }
  }
  // Keeps the larger ratio; on a tie the earlier row, as one pass over all
  // rows in order would.
  void merge(const Worst& o);
  bool passed() const { return bad == 0; }
  // "NAME: B of N elements out of tolerance<context>; worst at row R col C:
  // got G expected E tol T (err/tol Q)"; a vector names the column only.
  std::string describe(const std::string& name, bool vector, const std::string& context = "") const;
};

// Library outputs of one problem, to compare with the reference.
struct Outputs {
  std::string y_name = "y";
  const HostMatrix* y = nullptr;  // forward output, or null
  struct Gx {
    std::string name;
    const HostMatrix* values;
  };
  std::vector<Gx> gx;
  struct Gw {
    std::string name;
    const HostMatrix* values;  // 1 x cols in the dtype gw was stored in
    double term_rel;           // see gw_tol; 0 for the library
  };
  std::vector<Gw> gw;
};

struct CheckResult {
  std::string name;
  bool vector = false;  // gw: one row, reported by column
  Worst worst;
};

// Every element of out's y, gx and gw against reference::forward/backward of
// x, w (1 x cols, or null: w' = 1) and gy (needed when out has gx or gw),
// with y_tol, gx_tol and gw_tol in each output's own dtype (y may have
// another dtype than x: RMSNORM_FLAG_Y_DTYPE). Works through row chunks on all hardware
// threads (the reference of 8192 x 4096 in one piece would take > 1 GB).
// Results in the order y, gx..., gw....
std::vector<CheckResult> check_against_reference(const HostMatrix& x, const HostMatrix* w, const HostMatrix* gy,
                                                 const reference::Options& opt, const Outputs& out);

// The most host memory check_against_reference allocates for rows x cols
// (its per-thread buffers with y, gx and gw checked), so that a caller can
// refuse a run that would not fit before it starts.
size_t check_host_bytes(int64_t rows, int64_t cols);

}  // namespace rmsnorm::harness
