// Validated arguments handed from api.cpp to a backend. Backends may assume
// everything here was checked: shapes, strides, eps, dtype, flags, gw mode,
// alignment to the element size, overlap, memory space, workspace size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rmsnorm/gw_mode.hpp"
#include "rmsnorm/rmsnorm.h"

namespace rmsnorm {

enum class DType : int32_t { kF32 = RMSNORM_DTYPE_F32, kF16 = RMSNORM_DTYPE_F16, kBF16 = RMSNORM_DTYPE_BF16 };

inline constexpr bool known_dtype(int32_t dt) {
  return dt == RMSNORM_DTYPE_F32 || dt == RMSNORM_DTYPE_F16 || dt == RMSNORM_DTYPE_BF16;
}

// Bytes of one element: the single definition behind rmsnorm_dtype_size, the
// validation in api.cpp and the backends.
inline constexpr size_t dtype_size(DType dt) { return dt == DType::kF32 ? 4 : 2; }

// rmsnorm::GwMode: include/rmsnorm/gw_mode.hpp (one definition, shared with the C++ API).

inline bool gw_is_f32(GwMode m) { return m == GwMode::kStoreF32 || m == GwMode::kAccumulateF32; }
inline bool gw_accumulates(GwMode m) { return m == GwMode::kAccumulate || m == GwMode::kAccumulateF32; }
// Bytes of one gw element: fp32 in the _F32 modes, else the problem's dtype.
inline size_t gw_elem_size(GwMode m, DType dt) { return gw_is_f32(m) ? sizeof(float) : dtype_size(dt); }

struct ForwardArgs {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kF32;
  float eps = 1e-5f;
  bool weight_offset = false;  // w' = 1 + w
  bool weight_f32 = false;     // the weight is float (RMSNORM_FLAG_WEIGHT_F32 with 16-bit x)
  // The weight's dtype, a DType; -1: float with weight_f32, else dtype (weight_dtype_of). RMSNORM_FLAG_WEIGHT_Y_DTYPE
  // sets y's; the fp32 residual stream's forward runs with dtype x's (16-bit), the weight's.
  int32_t weight_dtype = -1;
  bool round_xhat = false;     // y = T(T(x_hat) * w')
  bool pdl = true;             // CUDA: programmatic dependent launch (rmsnorm.h)
  int32_t y_dtype = -1;  // y's dtype (RMSNORM_FLAG_Y_DTYPE), a DType; -1: dtype (y_dtype_of)
  bool residual_f32 = false;  // residual and h are float (RMSNORM_FLAG_RESIDUAL_F32 with 16-bit x)
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* weight = nullptr;  // may be null
  void* y = nullptr;
  int64_t y_stride = 0;
  float* rstd = nullptr;  // may be null
  // Residual add (rmsnorm_add_forward): h = T(x + residual) is written to h and
  // normalized in place of x. Null residual: the plain forward.
  const void* residual = nullptr;
  int64_t residual_stride = 0;
  void* h = nullptr;
  int64_t h_stride = 0;
};

// rmsnorm_forward_quant: the forward's y quantized into q (src/common/quant.hpp).
struct QuantArgs {
  bool fp8 = true;       // else int8
  bool per_row = false;  // else static
  const float* scale = nullptr;
  float* row_scales = nullptr;
  const float* scale_ub = nullptr;
  void* q = nullptr;
  int64_t q_stride = 0;
  // Block scales (rmsnorm_forward_block_quant; per_row then true): > 0, the block's columns, with row_scales the
  // scales matrix, element (r, b) at row_scales[r * scales_row_stride + b * scales_block_stride].
  int block_cols = 0;
  int64_t scales_row_stride = 1;
  int64_t scales_block_stride = 0;
};

struct BackwardArgs {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kF32;
  float eps = 1e-5f;
  bool weight_offset = false;
  bool weight_f32 = false;  // the weight is float (gw modes already mapped to the fp32 ones)
  bool pdl = true;  // CUDA: programmatic dependent launch (rmsnorm.h)
  int32_t y_dtype = -1;  // gy's dtype (the forward's y; RMSNORM_FLAG_Y_DTYPE), a DType; -1: dtype (y_dtype_of)
  // The weight's (and gw's store) dtype, a DType; -1: float with weight_f32, else dtype (weight_dtype_of).
  // RMSNORM_FLAG_RESIDUAL_F32's backward runs with dtype fp32 (h, g_h, gx) and the weight in x's dtype.
  int32_t weight_dtype = -1;
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* weight = nullptr;  // may be null (then gw_mode == kNone)
  const void* gy = nullptr;
  int64_t gy_stride = 0;
  const float* rstd = nullptr;  // may be null: recompute
  void* gx = nullptr;
  int64_t gx_stride = 0;
  // rmsnorm_add_backward: gx = T(T(gx of the norm) + g_h); null: the plain backward.
  const void* g_h = nullptr;
  int64_t g_h_stride = 0;
  // rmsnorm_add_backward_x (the fp32 residual stream): x's gradient, gx_x = Y(gx) in gy's dtype; null: not written.
  void* gx_x = nullptr;
  int64_t gx_x_stride = 0;
  void* gw = nullptr;  // null iff gw_mode == kNone
  GwMode gw_mode = GwMode::kNone;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

template <typename Args>
DType weight_dtype_of(const Args& a) {
  return a.weight_dtype >= 0 ? static_cast<DType>(a.weight_dtype) : a.weight_f32 ? DType::kF32 : a.dtype;
}

// y's (forward) or gy's (backward) dtype.
template <typename Args>
DType y_dtype_of(const Args& a) {
  return a.y_dtype < 0 ? a.dtype : static_cast<DType>(a.y_dtype);
}

}  // namespace rmsnorm
