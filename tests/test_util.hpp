// Shared test helpers: host matrices of any dtype with a base offset and a row
// stride, random fills (never zeros), NaN poison, float64 tolerance checks that
// look at every element and report the worst one.
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

#include "common/half.hpp"
#include "rmsnorm/rmsnorm.h"

namespace rmsnorm::test {

inline const char* dtype_name(int32_t dt) {
  switch (dt) {
    case RMSNORM_DTYPE_F32: return "f32";
    case RMSNORM_DTYPE_F16: return "f16";
    case RMSNORM_DTYPE_BF16: return "bf16";
  }
  return "?";
}

inline size_t dtype_bytes(int32_t dt) { return dt == RMSNORM_DTYPE_F32 ? 4 : 2; }

// Value of a float after rounding to dtype (as double).
inline double round_to(int32_t dt, double v) {
  const float f = static_cast<float>(v);
  switch (dt) {
    case RMSNORM_DTYPE_F16: return half_to_float(float_to_half(f));
    case RMSNORM_DTYPE_BF16: return bf16_to_float(float_to_bf16(f));
    default: return f;
  }
}

// Spacing of dtype's representable numbers at |v| (one unit in the last place).
inline double ulp(int32_t dt, double v) {
  const int mant_bits = dt == RMSNORM_DTYPE_F32 ? 23 : dt == RMSNORM_DTYPE_F16 ? 10 : 7;
  const int min_exp = dt == RMSNORM_DTYPE_F32 ? -126 : dt == RMSNORM_DTYPE_F16 ? -14 : -126;
  const double a = std::fabs(v);
  int e = a > 0 ? static_cast<int>(std::floor(std::log2(a))) : min_exp;
  e = std::max(e, min_exp);
  return std::ldexp(1.0, e - mant_bits);
}

// Relative error allowed for an fp32 sum of n terms (sequential or tree):
// a few units of 2^-24 plus a term that grows like sqrt(n) (random rounding).
inline double acc_rel(int64_t n) { return std::ldexp(8.0 + 4.0 * std::sqrt(static_cast<double>(n)), -24); }

// A rows x cols matrix of dtype, with a row stride and a base offset (in
// elements) into its storage, so that misaligned bases can be tested.
struct HostMatrix {
  int32_t dtype = RMSNORM_DTYPE_F32;
  int64_t rows = 0, cols = 0, stride = 0, offset = 0;
  std::vector<unsigned char> storage;

  HostMatrix() = default;
  HostMatrix(int32_t dt, int64_t r, int64_t c, int64_t s = -1, int64_t off = 0)
      : dtype(dt), rows(r), cols(c), stride(s < 0 ? c : s), offset(off) {
    const int64_t elems = off + (r > 0 ? (r - 1) * stride + c : 0);
    storage.assign(static_cast<size_t>(elems) * dtype_bytes(dt) + 16, 0xFF);  // 0xFF..: NaN in every dtype
  }
  size_t esize() const { return dtype_bytes(dtype); }
  void* data() { return storage.data() + offset * esize(); }
  const void* data() const { return storage.data() + offset * esize(); }
  size_t span_bytes() const { return storage.size(); }
  int64_t index(int64_t r, int64_t c) const { return r * stride + c; }

  double get(int64_t r, int64_t c) const {
    const unsigned char* p = static_cast<const unsigned char*>(data()) + index(r, c) * esize();
    if (dtype == RMSNORM_DTYPE_F32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype == RMSNORM_DTYPE_F16 ? half_to_float(h) : bf16_to_float(h);
  }
  void set(int64_t r, int64_t c, double v) {
    unsigned char* p = static_cast<unsigned char*>(data()) + index(r, c) * esize();
    const float f = static_cast<float>(v);
    if (dtype == RMSNORM_DTYPE_F32) {
      std::memcpy(p, &f, 4);
      return;
    }
    const uint16_t h = dtype == RMSNORM_DTYPE_F16 ? float_to_half(f) : float_to_bf16(f);
    std::memcpy(p, &h, 2);
  }
  void poison() { std::fill(storage.begin(), storage.end(), static_cast<unsigned char>(0xFF)); }
  // Row-major float64 copy (what the reference consumes).
  std::vector<double> to_double() const {
    std::vector<double> out(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = get(r, c);
    return out;
  }
};

// Fills with N(0,1) * row_scale(r), rounded to dtype; exact zeros are replaced,
// so an unwritten or mis-indexed output cannot pass by accident.
template <typename Scale>
void fill_random(HostMatrix& m, std::mt19937_64& rng, Scale row_scale) {
  std::normal_distribution<double> n01(0.0, 1.0);
  for (int64_t r = 0; r < m.rows; ++r) {
    const double s = row_scale(r);
    for (int64_t c = 0; c < m.cols; ++c) {
      double v = n01(rng) * s;
      if (round_to(m.dtype, v) == 0.0) v = 0.5 * s;
      m.set(r, c, v);
    }
  }
}
inline void fill_random(HostMatrix& m, std::mt19937_64& rng) {
  fill_random(m, rng, [](int64_t) { return 1.0; });
}

// A faster fill for matrices of up to a billion elements (the big batches of
// the batch-invariance tests): uniform in [-2, 2) from a counter hash
// (splitmix64) seeded by rng, rounded to dtype; exact zeros replaced.
inline void fill_hashed(HostMatrix& m, std::mt19937_64& rng) {
  const uint64_t seed = rng();
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      uint64_t z = seed + static_cast<uint64_t>(r * m.cols + c + 1) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      double v = static_cast<double>(z >> 11) * 0x1p-53 * 4.0 - 2.0;
      if (round_to(m.dtype, v) == 0.0) v = 0.5;
      m.set(r, c, v);
    }
  }
}

// Every element of got (a rows x cols matrix) against ref (row-major doubles)
// with an allowed absolute error tol(r, c). Reports the count of failures and
// the worst element (largest error / tolerance).
template <typename Tol>
::testing::AssertionResult check_matrix(const char* what, const HostMatrix& got, const std::vector<double>& ref,
                                        Tol tol) {
  int64_t bad = 0, worst_r = -1, worst_c = -1;
  double worst_ratio = -1.0;
  for (int64_t r = 0; r < got.rows; ++r) {
    for (int64_t c = 0; c < got.cols; ++c) {
      const double g = got.get(r, c), e = ref[r * got.cols + c], t = tol(r, c);
      const double err = std::fabs(g - e);
      double ratio = std::isfinite(g) ? (t > 0 ? err / t : (err == 0 ? 0.0 : INFINITY)) : INFINITY;
      if (std::isnan(ratio)) ratio = INFINITY;
      if (!(ratio <= 1.0)) ++bad;
      if (worst_r < 0 || ratio > worst_ratio) {
        worst_ratio = ratio;
        worst_r = r;
        worst_c = c;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << what << ": " << bad << " of " << got.rows * got.cols << " elements out of tolerance (" << dtype_name(got.dtype)
     << ", " << got.rows << "x" << got.cols << "); worst at row " << worst_r << " col " << worst_c << ": got "
     << got.get(worst_r, worst_c) << " expected " << ref[worst_r * got.cols + worst_c] << " tol "
     << tol(worst_r, worst_c) << " (err/tol " << worst_ratio << ")";
  return ::testing::AssertionFailure() << os.str();
}

// Vector variant (gw, rstd): n values of dtype dt read by get(i).
template <typename Get, typename Tol>
::testing::AssertionResult check_vector(const char* what, int64_t n, Get get, const std::vector<double>& ref, Tol tol) {
  int64_t bad = 0, worst = -1;
  double worst_ratio = -1.0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = get(i), t = tol(i), err = std::fabs(g - ref[i]);
    double ratio = std::isfinite(g) ? (t > 0 ? err / t : (err == 0 ? 0.0 : INFINITY)) : INFINITY;
    if (std::isnan(ratio)) ratio = INFINITY;
    if (!(ratio <= 1.0)) ++bad;
    if (ratio > worst_ratio || worst < 0) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(9);
  os << what << ": " << bad << " of " << n << " elements out of tolerance; worst at " << worst << ": got " << get(worst)
     << " expected " << ref[worst] << " tol " << tol(worst) << " (err/tol " << worst_ratio << ")";
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace rmsnorm::test
