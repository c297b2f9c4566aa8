// A row's sum of squares and its rstd, shared by the forward and the
// backward's recompute so that both give the same bits.
#pragma once

#include "cuda/element.cuh"

namespace rmsnorm::cuda {

// This thread's share of sum(x^2): one running sum over its elements in
// chunk order (the backward's recompute adds the same terms in the same order).
template <typename T>
__device__ __forceinline__ float add_squares(float ss, const Chunk<T>& x) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j) ss += x.get(j) * x.get(j);
  return ss;
}

template <typename T>
__device__ __forceinline__ float inv_rms(float sum_sq, int cols, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + eps);
}

}  // namespace rmsnorm::cuda
