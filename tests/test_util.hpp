// Shared test helpers, over the harness (harness/): host matrices of any
// dtype with a base offset and a row stride, random fills (never zeros), NaN
// poison, float64 tolerance checks that look at every element and report the
// worst one, as GoogleTest assertion results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/host_matrix.hpp"
#include "harness/random.hpp"
#include "harness/tolerance.hpp"

namespace rmsnorm::test {

using harness::acc_rel;
using harness::dtype_bytes;
using harness::dtype_name;
using harness::HostMatrix;
using harness::round_to;
using harness::gw_tol;
using harness::gx_tol;
using harness::rstd_tol;
using harness::ulp;
using harness::y_round_xhat_tol;
using harness::y_tol;

// Every byte of m's storage that is not an element (row padding, the base
// offset, the slack after the last row) still holds the 0xFF poison that
// HostMatrix starts with: for outputs, so that a stray write shows. Only those
// bytes are visited (rows lie in order, stride >= cols), so the cost is the
// padding's, not the matrix's: it runs on outputs of 10^9 elements.
inline ::testing::AssertionResult padding_untouched(const char* what, const HostMatrix& m) {
  if (m.rows > 0 && m.stride < m.cols)
    return ::testing::AssertionFailure() << what << ": stride " << m.stride << " < cols " << m.cols;
  const size_t es = m.esize();
  auto byte_of = [&](int64_t r, int64_t c) { return static_cast<size_t>(m.offset + m.index(r, c)) * es; };
  // [from, to) of the storage: the gaps before the first row, between rows and after the last.
  auto first_written = [&](size_t from, size_t to) -> size_t {
    for (size_t i = from; i < to; ++i)
      if (m.storage[i] != 0xFF) return i;
    return to;
  };
  const size_t total = m.storage.size();
  size_t from = 0;
  for (int64_t r = 0; r <= m.rows; ++r) {
    const size_t to = r < m.rows ? byte_of(r, 0) : total;
    const size_t i = first_written(from, to);
    if (i != to) return ::testing::AssertionFailure() << what << ": byte " << i << " outside the elements was written";
    if (r < m.rows) from = byte_of(r, m.cols);  // past row r's last element
  }
  return ::testing::AssertionSuccess();
}

// N(0,1) * row_scale(r), rounded to dtype, exact zeros replaced (so an
// unwritten or mis-indexed output cannot pass by accident); a fresh stream
// drawn from rng.
template <typename Scale>
void fill_random(HostMatrix& m, std::mt19937_64& rng, Scale row_scale) {
  harness::fill_normal(m, rng(), row_scale);
}
inline void fill_random(HostMatrix& m, std::mt19937_64& rng) { harness::fill_normal(m, rng()); }

// The cheaper fill for matrices of up to a billion elements (the big batches
// of the batch-invariance tests): uniform in [-2, 2), zeros replaced.
inline void fill_hashed(HostMatrix& m, std::mt19937_64& rng) { harness::fill_uniform(m, rng()); }

// Every element of got (a rows x cols matrix) against ref (row-major doubles)
// with an allowed absolute error tol(r, c); on failure, the count of failures
// and the worst element (largest error / tolerance).
template <typename Tol>
::testing::AssertionResult check_matrix(const char* what, const HostMatrix& got, const std::vector<double>& ref,
                                        Tol tol) {
  harness::Worst w;
  for (int64_t r = 0; r < got.rows; ++r)
    for (int64_t c = 0; c < got.cols; ++c) w.add(r, c, got.get(r, c), ref[r * got.cols + c], tol(r, c));
  if (w.passed()) return ::testing::AssertionSuccess();
  const std::string shape = " (" + std::string(dtype_name(got.dtype)) + ", " + std::to_string(got.rows) + "x" +
                            std::to_string(got.cols) + ")";
  return ::testing::AssertionFailure() << w.describe(what, false, shape);
}

// Vector variant (gw, rstd): n values read by get(i).
template <typename Get, typename Tol>
::testing::AssertionResult check_vector(const char* what, int64_t n, Get get, const std::vector<double>& ref, Tol tol) {
  harness::Worst w;
  for (int64_t i = 0; i < n; ++i) w.add(0, i, get(i), ref[i], tol(i));
  if (w.passed()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << w.describe(what, true);
}

}  // namespace rmsnorm::test
