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
// HostMatrix starts with: for outputs, so that a stray write shows.
inline ::testing::AssertionResult padding_untouched(const char* what, const HostMatrix& m) {
  std::vector<bool> elem(m.storage.size(), false);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) {
      const size_t b = static_cast<size_t>((m.offset + m.index(r, c)) * static_cast<int64_t>(m.esize()));
      for (size_t k = 0; k < m.esize(); ++k) elem[b + k] = true;
    }
  for (size_t i = 0; i < m.storage.size(); ++i)
    if (!elem[i] && m.storage[i] != 0xFF)
      return ::testing::AssertionFailure() << what << ": byte " << i << " outside the elements was written";
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
