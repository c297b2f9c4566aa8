// A row's sum of squares and its rstd, shared by the forward and the
// backward's recompute so that both give the same bits; and the rescaled path
// for rows whose squares overflow or underflow fp32 (src/common/scaled_rms.hpp
// has the rule and why its constants are safe).
//
// Where it runs on CUDA: the looped band only (one CTA per row, D above the
// cluster band: above 262144 at 16-bit and 131072 at fp32 where clusters of 16
// are co-scheduled, as on the H200; above 131072 / 65536 with clusters of 8;
// above 16384 / 8192 before sm_90), where a second reduction over a row that needs it costs one
// compare per row otherwise. The rows and cluster bands take the plain
// formula (rmsnorm.h states the range): measured on the H200, the rescaled
// path in those kernels, never taken on ordinary data, cost the cluster band
// 12-20% wherever it sat (inside the row loop, or as a walk over the CTA's
// rows after it) and decode 5% (1 x 4096: 2.88 against 2.74 us per graph
// call, forward), beyond the 1-2% run-to-run noise (docs/performance.md,
// "Rescaled sum of squares"). The CPU backend rescales in every band.
#pragma once

#include "common/scaled_rms.hpp"
#include "cuda/element.cuh"
#include "cuda/reduce.cuh"

namespace rmsnorm::cuda {

// This thread's share of sum(x^2): one running sum over its elements in
// chunk order (the backward's recompute adds the same terms in the same order).
template <typename T>
__device__ __forceinline__ float add_squares(float ss, const Chunk<T>& x) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j) ss += x.get(j) * x.get(j);
  return ss;
}

// The same over a thread's chunks of one row held in registers (chunk it is
// the row's chunk m.chunk(it)); 0 for a row past the end.
template <typename T, typename Map, int kCpt>
__device__ __forceinline__ float thread_squares(const Chunk<T> (&x)[kCpt], const Map& m, int chunks, bool valid) {
  float ss = 0.0f;
#pragma unroll
  for (int it = 0; it < kCpt; ++it)
    if (valid && m.chunk(it) < chunks) ss = add_squares(ss, x[it]);
  return ss;
}

// The same terms, each x scaled by s first (rms_rescale_factor).
template <typename T>
__device__ __forceinline__ float add_scaled_squares(float ss, const Chunk<T>& x, float s) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j) {
    const float v = x.get(j) * s;
    ss += v * v;
  }
  return ss;
}

// The backward's sum(x * w' * gy) with each x scaled by t first
// (rms_dot_scale), in the order of the plain sum.
template <typename T, typename Gy>
__device__ __forceinline__ float add_scaled_dot(float d, const Chunk<T>& x, const Gy& gy,
                                                const float (&w)[Chunk<T>::kN], float t) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j) d += (x.get(j) * t) * w[j] * gy.get(j);
  return d;
}

// A CTA's sum (one row per CTA, the looped band) on the rescaled path, in
// row_sum's order. It reuses the row's scratch whatever the row parity: the
// barrier before it waits for every earlier read, the one after for its own.
template <int kCta, typename V>
__device__ __forceinline__ float cta_sum_rare(float v, RowScratch<V, kCta, 1>& scratch) {
  __syncthreads();
  V w;
  if constexpr (std::is_same_v<V, float>)
    w = v;
  else
    w = make_float2(v, 0.0f);
  w = row_sum<kCta, 1>(w, scratch, 0);
  __syncthreads();
  if constexpr (std::is_same_v<V, float>)
    return w;
  else
    return w.x;
}

// cta_sum_rare for a CTA whose threads each hold kShares of the kSumTpr summing threads (row_sum_shares), in a
// scratch of V (float, or the backward's float2: the shares go in .x).
template <int kSumTpr, int kCta, int kShares, typename V>
__device__ __forceinline__ float cta_sum_rare_shares(const float (&v)[kShares], RowScratch<V, kSumTpr, 1>& scratch) {
  V u[kShares];
#pragma unroll
  for (int k = 0; k < kShares; ++k) {
    if constexpr (std::is_same_v<V, float>)
      u[k] = v[k];
    else
      u[k] = make_float2(v[k], 0.0f);
  }
  __syncthreads();
  const V total = row_sum_shares<kSumTpr, kCta, kShares>(u, scratch, 0);
  __syncthreads();
  if constexpr (std::is_same_v<V, float>)
    return total;
  else
    return total.x;
}

// rstd of a row from its plain sum of squares `ss` (the same in every thread of the row). scaled_squares(s) returns
// this thread's share of sum((x s)^2) and rare_sum adds the shares over the row; they run only on the rescaled path,
// in every thread of the row.
template <typename RareSum, typename Fn>
__device__ __forceinline__ float row_rstd(float ss, int cols, float eps, RareSum&& rare_sum, Fn&& scaled_squares) {
  if (!rms_needs_rescale(ss, eps)) return rms_from_sum(ss, cols, eps);
  const float s = rms_rescale_factor(ss);
  return rms_from_scaled(rare_sum(scaled_squares(s)), s, cols, eps);
}

// row_rstd of a CTA's row (one row per CTA, the looped band).
template <int kCta, typename V, typename Fn>
__device__ __forceinline__ float cta_row_rstd(float ss, int cols, float eps, RowScratch<V, kCta, 1>& scratch,
                                              Fn&& scaled_squares) {
  return row_rstd(ss, cols, eps, [&](float v) { return cta_sum_rare<kCta>(v, scratch); }, scaled_squares);
}

}  // namespace rmsnorm::cuda
