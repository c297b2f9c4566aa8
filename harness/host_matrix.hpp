// Host matrices of any storage dtype, shared by the tests, the CLI and the
// benchmark: a row stride and a base offset (so that misaligned bases can be
// tested), values read and written as double, NaN poison.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/half.hpp"
#include "rmsnorm/rmsnorm.h"

namespace rmsnorm::harness {

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

// A rows x cols matrix of dtype, with a row stride and a base offset (in
// elements) into its storage. The storage starts as 0xFF bytes, NaN in every
// dtype, so an element nobody wrote cannot pass a check.
struct HostMatrix {
  int32_t dtype = RMSNORM_DTYPE_F32;
  int64_t rows = 0, cols = 0, stride = 0, offset = 0;
  std::vector<unsigned char> storage;

  HostMatrix() = default;
  HostMatrix(int32_t dt, int64_t r, int64_t c, int64_t s = -1, int64_t off = 0)
      : dtype(dt), rows(r), cols(c), stride(s < 0 ? c : s), offset(off) {
    const int64_t elems = off + (r > 0 ? (r - 1) * stride + c : 0);
    storage.assign(static_cast<size_t>(elems) * dtype_bytes(dt) + 16, 0xFF);
  }
  size_t esize() const { return dtype_bytes(dtype); }
  void* data() { return storage.data() + offset * esize(); }
  const void* data() const { return storage.data() + offset * esize(); }
  size_t span_bytes() const { return storage.size(); }
  // Bytes from data() to the end of the last row.
  size_t data_bytes() const { return rows > 0 ? static_cast<size_t>((rows - 1) * stride + cols) * esize() : 0; }
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

}  // namespace rmsnorm::harness
