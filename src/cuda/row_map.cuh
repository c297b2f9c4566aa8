// The work split seen from one thread (plan.hpp): which row slot, which
// chunks, which row groups; and the loads and cp.async copies of its chunks
// of a row group.
#pragma once

#include "cuda/chunk_io.cuh"
#include "cuda/pipeline.cuh"
#include "cuda/reduce.cuh"

namespace rmsnorm::cuda {

// Which rows and chunks a thread works on (plan.hpp): row slot, position
// among the row's threads, and the persistent walk over row groups by
// CTA (kRows) or by cluster (kCluster).
template <int kTpr, bool kClustered>
struct RowMap {
  int slot;       // row slot in the CTA
  int pos;        // index among the row's G threads (CTA rank major)
  int stride;     // G = kTpr * cluster size
  int64_t unit;   // this CTA's (cluster's) index among the workers
  int64_t units;  // workers
  __device__ __forceinline__ RowMap() {
    slot = plan::row_slot(threadIdx.x, kTpr);
    const int lane = threadIdx.x % kTpr;
    if constexpr (kClustered) {
      const int cs = static_cast<int>(cluster_size());
      pos = static_cast<int>(cluster_rank()) * kTpr + lane;
      stride = kTpr * cs;
      unit = blockIdx.x / cs;
      units = gridDim.x / cs;
    } else {
      pos = lane;
      stride = kTpr;
      unit = blockIdx.x;
      units = gridDim.x;
    }
  }
  __device__ __forceinline__ int chunk(int it) const { return it * stride + pos; }
};

// Loads this thread's chunks of row group g (nothing past the rows).
template <typename T, int kTpr, bool kClustered, int kCpt>
__device__ __forceinline__ void load_group(const T* __restrict__ base, int64_t stride, int64_t rows, int chunks,
                                           int cols, bool vector_io, const RowMap<kTpr, kClustered>& m, int64_t g,
                                           int slots, Chunk<T> (&out)[kCpt]) {
  const int64_t row = g * slots + m.slot;
  if (row >= rows) return;
  const T* r = base + row * stride;
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    if (c < chunks) out[it] = load_chunk(r, c, cols, vector_io);
  }
}

// Starts the cp.async copies of this thread's kCpt chunks of row group g into
// buf[it * kCtaThreads + threadIdx.x]; the caller commits them as one group (an
// empty group past the rows, so that every thread counts groups alike).
template <typename T, int kTpr, bool kClustered, int kCtaThreads, int kCpt>
__device__ __forceinline__ void stage_group(const T* __restrict__ base, int64_t stride, int64_t rows, int chunks,
                                            int cols, const RowMap<kTpr, kClustered>& m, int64_t g, int slots,
                                            uint4* buf) {
  const int64_t row = g * slots + m.slot;
  if (row < rows) {
    const T* r = base + row * stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      if (c < chunks) {
        constexpr int kN = Chunk<T>::kN;
        const int n = cols - c * kN < kN ? cols - c * kN : kN;
        cp_async_chunk(&buf[it * kCtaThreads + threadIdx.x], r + c * kN, n * static_cast<int>(sizeof(T)));
      }
    }
  }
}

}  // namespace rmsnorm::cuda
