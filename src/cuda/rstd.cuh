// A row's sum of squares and its rstd, shared by the forward and the
// backward's recompute so that both give the same bits; and the rare path
// for rows whose squares overflow or underflow fp32 (src/common/scaled_rms.hpp
// has the rule and why its constants are safe).
//
// The rare path is a second reduction over the same row, its terms scaled by
// a power of two, taken only where the plain sum says it is needed, so the
// common path costs one compare per row. Every thread of a reduction group
// must take part in it: a row slot of > 32 threads decides as a whole (its
// sum is the same in every thread), slots of < 32 threads share their warp's
// shuffles, so a warp takes the path when any of its rows needs it and only
// those rows use the result. The cluster band's decision is cluster-uniform
// (every CTA holds the same cluster sum).
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
template <typename T>
__device__ __forceinline__ float add_scaled_dot(float d, const Chunk<T>& x, const Chunk<T>& gy,
                                                const float (&w)[Chunk<T>::kN], float t) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j) d += (x.get(j) * t) * w[j] * gy.get(j);
  return d;
}

// Whether the reduction group of this thread's row takes the rare path.
template <int kTpr>
__device__ __forceinline__ bool group_any(bool pred) {
  if constexpr (kTpr < 32)
    return __any_sync(0xffffffffu, pred);
  else
    return pred;
}

// Sum of one value per CTA over the cluster on the rare path, in rank order,
// through its own slot (the row's exchange buffers are in use); the second
// barrier keeps the slot until every CTA has read it.
__device__ __forceinline__ float cluster_sum_rare(float v, float* slot) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const unsigned n = cluster.num_blocks();
  if (threadIdx.x == 0) *slot = v;
  cluster.sync();
  float total = *cluster.map_shared_rank(slot, 0);
  for (unsigned k = 1; k < n; ++k) total += *cluster.map_shared_rank(slot, k);
  cluster.sync();
  return total;
#else
  (void)slot;
  return v;
#endif
}

// A row slot's (and cluster's) sum on the rare path, in row_sum's order. It
// reuses the row's scratch whatever the row parity: the barrier before it
// waits for every earlier read, the one after for its own reads.
template <int kTpr, int kSlots, bool kClustered, typename V>
__device__ __noinline__ float rare_row_sum(float v, RowScratch<V, kTpr, kSlots>& scratch, float* cluster_slot) {
  const int slot = plan::row_slot(threadIdx.x, kTpr);
  if constexpr (kTpr > 32) slot_sync<kTpr, kSlots>(slot);
  V w;
  if constexpr (std::is_same_v<V, float>)
    w = v;
  else
    w = make_float2(v, 0.0f);
  w = row_sum<kTpr, kSlots>(w, scratch, 0);
  if constexpr (kTpr > 32) slot_sync<kTpr, kSlots>(slot);
  float total;
  if constexpr (std::is_same_v<V, float>)
    total = w;
  else
    total = w.x;
  if constexpr (kClustered) total = cluster_sum_rare(total, cluster_slot);
  return total;
}

// rstd of a row from its plain sum of squares `ss` (the same in every thread
// of the row). scaled_squares(s) returns this thread's share of sum((x s)^2)
// over its chunks of the row; called only on the rare path, by every thread
// of the reduction group.
template <int kTpr, int kSlots, bool kClustered, typename V, typename Fn>
__device__ __forceinline__ float row_rstd(float ss, bool valid, int cols, float eps,
                                          RowScratch<V, kTpr, kSlots>& scratch, float* cluster_slot,
                                          Fn&& scaled_squares) {
  float r = rms_from_sum(ss, cols, eps);
  const bool rare = valid && rms_needs_rescale(ss, eps);
  if (group_any<kTpr>(rare)) {
    const float s = rms_rescale_factor(ss);
    const float ss2 = rare_row_sum<kTpr, kSlots, kClustered>(scaled_squares(s), scratch, cluster_slot);
    if (rare) r = rms_from_scaled(ss2, s, cols, eps);
  }
  return r;
}

}  // namespace rmsnorm::cuda
