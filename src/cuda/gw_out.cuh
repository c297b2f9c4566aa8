// Where the backward's gw sums go: a workspace partial row, or the user's gw
// in its mode when the call has a single partial.
#pragma once

#include "cuda/chunk_io.cuh"

namespace rmsnorm::cuda {

// Where gw goes: a finished value for column `col` is either one partial of
// the workspace or (one partial in all) the user's gw in its mode.
struct GwOut {
  void* gw = nullptr;       // user gw (T or float, per mode)
  int mode = 0;             // GwMode
  float* partials = nullptr;
  bool direct = false;
};

template <typename T>
__device__ __forceinline__ void store_gw_final(const GwOut& o, int64_t col, float v) {
  switch (static_cast<GwMode>(o.mode)) {
    case GwMode::kStore: static_cast<T*>(o.gw)[col] = from_float<T>(v); break;
    case GwMode::kStoreF32: static_cast<float*>(o.gw)[col] = v; break;
    case GwMode::kAccumulate: {
      T* g = static_cast<T*>(o.gw) + col;
      *g = from_float<T>(to_float(*g) + v);
      break;
    }
    case GwMode::kAccumulateF32: static_cast<float*>(o.gw)[col] += v; break;
    case GwMode::kNone: break;
  }
}

template <typename T>
__device__ __forceinline__ void emit_gw(const GwOut& o, int64_t partial, int64_t cols, int64_t col, float v) {
  if (o.direct)
    store_gw_final<T>(o, col, v);
  else
    o.partials[partial * cols + col] = v;
}

// The finished gw sums v[0 .. kM) of columns first .. first + kM - 1, those inside [0, cols), by element
// (backward_rows_paired's sums by gx's blocks, which start kO columns before a chunk: once per CTA).
template <typename T, int kM>
__device__ __forceinline__ void emit_gw_cols(const GwOut& o, int64_t partial, int cols, int first,
                                             const float (&v)[kM]) {
#pragma unroll
  for (int j = 0; j < kM; ++j)
    if (first + j >= 0 && first + j < cols) emit_gw<T>(o, partial, cols, first + j, v[j]);
}

// kN fp32 values to dst[0 .. n) (n may be less than kN at the row's end):
// 16-byte stores where dst is 16-byte aligned and the chunk is whole.
template <int kN>
__device__ __forceinline__ void store_f32_chunk(float* dst, int n, const float (&v)[kN]) {
  static_assert(kN % 4 == 0, "whole float4s");
  if (n >= kN && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
#pragma unroll
    for (int q = 0; q < kN / 4; ++q)
      reinterpret_cast<float4*>(dst)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (j < n) dst[j] = v[j];
}

// The finished gw sums of chunk `chunk` (columns chunk * kN ..): into this
// worker's partial row, or (one partial in all) into the user's gw in its
// mode, with one thread writing the chunk's columns together (16-byte stores
// where aligned; the accumulate modes read and write element by element).
template <typename T>
__device__ __forceinline__ void emit_gw_chunk(const GwOut& o, int64_t partial, int cols, int chunk,
                                              const float (&v)[Chunk<T>::kN]) {
  constexpr int kN = Chunk<T>::kN;
  const int base = chunk * kN;
  if (!o.direct) {
    store_f32_chunk<kN>(o.partials + partial * cols + base, cols - base, v);
    return;
  }
  switch (static_cast<GwMode>(o.mode)) {
    case GwMode::kStore: {
      Chunk<T> pk;
#pragma unroll
      for (int j = 0; j < kN; j += 2) pk.set2(j, v[j], v[j + 1]);
      store_chunk(static_cast<T*>(o.gw), chunk, cols, false, pk);
      break;
    }
    case GwMode::kStoreF32: store_f32_chunk<kN>(static_cast<float*>(o.gw) + base, cols - base, v); break;
    default:
#pragma unroll
      for (int j = 0; j < kN; ++j)
        if (base + j < cols) store_gw_final<T>(o, base + j, v[j]);
  }
}

}  // namespace rmsnorm::cuda
