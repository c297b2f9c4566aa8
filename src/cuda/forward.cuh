// RMSNorm forward.
//
//   r = 1 / sqrt(sum(x^2) / D + eps)      (fp32)
//   y = T(x * r * w')   or   T(T(x * r) * w') with round_xhat
//
// Work split (plan.hpp): each row is owned by threads_per_row threads of one
// CTA (kRows: rows_per_block rows per CTA; kCluster: one row per cluster of
// CTAs), each thread holding up to chunks_per_thread 16-byte chunks in
// registers, so x is read once and y written once. The sum of squares is
// reduced inside each row's lanes, then across the row's warps through a
// per-row scratch slot, then across the cluster's CTAs through distributed
// shared memory. No scratch is shared between rows. kLooped reads x twice.
#pragma once

#include <cooperative_groups.h>

#include <mutex>

#include "cuda/common.cuh"

namespace rmsnorm::cuda {

namespace cg = cooperative_groups;

template <typename T>
struct ForwardParams {
  const T* x;
  const T* w;  // null: w' = 1
  T* y;
  float* rstd;  // null: not written
  int64_t rows;
  int cols;
  int chunks;
  int64_t x_stride;
  int64_t y_stride;
  float eps;
  float w_offset;  // 1.0f with the Gemma offset, else 0
  bool round_xhat;
  bool vector_io;
};

template <typename T>
__device__ __forceinline__ Pack<T> normalize_chunk(const ForwardParams<T>& p, const Pack<T>& x, const Pack<T>& w,
                                                   float r) {
  Pack<T> y;
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; ++j) {
    const float xh = to_float(x.v[j]) * r;
    const float wv = weight_of(w, j, p.w != nullptr, p.w_offset);
    y.v[j] = p.round_xhat ? from_float<T>(to_float(from_float<T>(xh)) * wv) : from_float<T>(xh * wv);
  }
  return y;
}

template <typename T>
__device__ __forceinline__ float inv_rms(float sum_sq, int cols, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + eps);
}

// ---- kRows: rows_per_block rows per CTA, threads_per_row = kTpr --------------------------------
template <typename T, int kTpr>
__global__ void __launch_bounds__(plan::forward_block(kTpr), plan::kMaxThreadsPerSm / plan::forward_block(kTpr))
    forward_rows_kernel(const ForwardParams<T> p) {
  constexpr int kBlock = plan::forward_block(kTpr);
  constexpr int kRowsPerBlock = kBlock / kTpr;
  constexpr int kCpt = plan::rows_chunks_per_thread(sizeof(T));
  static_assert(kRowsPerBlock * kTpr == kBlock, "plan: rows_per_block * threads_per_row == block");
  static_assert(Pack<T>::kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  __shared__ float2 scratch[kTpr > 32 ? kRowsPerBlock * plan::warps_per_row(kTpr) : 1];

  const int slot = plan::row_slot(threadIdx.x, kTpr);
  const int lane = threadIdx.x % kTpr;
  // Persistent CTAs with a software pipeline: the next row group's x is
  // loaded before this one's reduction, so loads stay in flight across the
  // barriers (one 16-byte chunk per thread would otherwise leave the memory
  // system idle while rows reduce and store).
  const int64_t groups = (p.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  auto load_row = [&](int64_t g, Pack<T>(&xs)[kCpt]) {
    const int64_t row = g * kRowsPerBlock + slot;
    if (g >= groups || row >= p.rows) return;
    const T* xr = p.x + row * p.x_stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * kTpr + lane;
      if (c < p.chunks) xs[it] = load_chunk(xr, c, p.cols, p.vector_io);
    }
  };
  Pack<T> x[kCpt];
  load_row(blockIdx.x, x);
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row = g * kRowsPerBlock + slot;
    const bool valid = row < p.rows;
    Pack<T> xn[kCpt];
    load_row(g + gridDim.x, xn);
    float ss = 0.0f;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * kTpr + lane;
      if (valid && c < p.chunks) {
#pragma unroll
        for (int j = 0; j < Pack<T>::kN; ++j) ss += to_float(x[it].v[j]) * to_float(x[it].v[j]);
      }
    }
    const float total = row_sum<kTpr, kBlock>(make_float2(ss, 0.0f), scratch).x;
    if (valid) {
      const float r = inv_rms<T>(total, p.cols, p.eps);
      if (p.rstd != nullptr && lane == 0) p.rstd[row] = r;
      T* yr = p.y + row * p.y_stride;
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = it * kTpr + lane;
        if (c < p.chunks) {
          // w from L1 at each use: registers go to the prefetched row instead.
          Pack<T> w;
          if (p.w != nullptr) w = load_chunk(p.w, c, p.cols, p.vector_io);
          store_chunk(yr, c, p.cols, p.vector_io, normalize_chunk(p, x[it], w, r));
        }
      }
    }
#pragma unroll
    for (int it = 0; it < kCpt; ++it) x[it] = xn[it];
  }
}

// Sum over a CTA of kBlock threads (one row slot), result in every thread.
template <int kBlock>
__device__ __forceinline__ float2 cta_sum(float2 v, float2* scratch) {
  return row_sum<kBlock, kBlock>(v, scratch);
}

// Sum of one float2 per CTA over the cluster, in rank order (same bits in
// every CTA). `slot` is this CTA's shared exchange slot. Two cluster barriers:
// the first publishes the slots, the second keeps them alive until every CTA
// has read them (also before this CTA reuses its slot or exits).
__device__ __forceinline__ float2 cluster_sum(float2 v, float2* slot) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned n = cluster.num_blocks();
  if (n == 1) return v;
  if (threadIdx.x == 0) *slot = v;
  cluster.sync();
  float2 total = *cluster.map_shared_rank(slot, 0);
  for (unsigned k = 1; k < n; ++k) total = add2(total, *cluster.map_shared_rank(slot, k));
  cluster.sync();
  return total;
#else
  (void)slot;
  return v;  // pre-Hopper plans use clusters of one CTA
#endif
}

__device__ __forceinline__ unsigned cluster_size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().num_blocks();
#else
  return 1;
#endif
}

__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cg::this_cluster().block_rank();
#else
  return 0;
#endif
}

// ---- kCluster: one row per cluster of CTAs of 1024 threads -------------------------------------
template <typename T>
__global__ void __launch_bounds__(plan::kClusterThreads, 1) forward_cluster_kernel(const ForwardParams<T> p) {
  constexpr int kBlock = plan::kClusterThreads;
  constexpr int kCpt = plan::cluster_chunks_per_thread(sizeof(T));
  __shared__ float2 scratch[plan::warps_per_row(kBlock)];
  __shared__ float2 exchange;
  const unsigned cs = cluster_size();
  const int stride = kBlock * static_cast<int>(cs);  // G: threads per row over the cluster
  const int gtid = static_cast<int>(cluster_rank()) * kBlock + threadIdx.x;
  for (int64_t row = blockIdx.x / cs; row < p.rows; row += gridDim.x / cs) {
    const T* xr = p.x + row * p.x_stride;
    Pack<T> x[kCpt];
    float ss = 0.0f;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * stride + gtid;
      if (c < p.chunks) {
        x[it] = load_chunk(xr, c, p.cols, p.vector_io);
#pragma unroll
        for (int j = 0; j < Pack<T>::kN; ++j) ss += to_float(x[it].v[j]) * to_float(x[it].v[j]);
      }
    }
    const float total = cluster_sum(cta_sum<kBlock>(make_float2(ss, 0.0f), scratch), &exchange).x;
    const float r = inv_rms<T>(total, p.cols, p.eps);
    if (p.rstd != nullptr && gtid == 0) p.rstd[row] = r;
    T* yr = p.y + row * p.y_stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * stride + gtid;
      if (c < p.chunks) {
        // Weight loaded here, not held across the reduction (1024 threads leave 64 registers each).
        Pack<T> w;
        if (p.w != nullptr) w = load_chunk(p.w, c, p.cols, p.vector_io);
        store_chunk(yr, c, p.cols, p.vector_io, normalize_chunk(p, x[it], w, r));
      }
    }
  }
}

// ---- kLooped: any D, one CTA per row, x read twice ---------------------------------------------
template <typename T>
__global__ void __launch_bounds__(plan::kLoopedThreads) forward_looped_kernel(const ForwardParams<T> p) {
  constexpr int kBlock = plan::kLoopedThreads;
  __shared__ float2 scratch[plan::warps_per_row(kBlock)];
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* xr = p.x + row * p.x_stride;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < p.chunks; c += kBlock) {
      const Pack<T> x = load_chunk(xr, c, p.cols, p.vector_io);
#pragma unroll
      for (int j = 0; j < Pack<T>::kN; ++j) ss += to_float(x.v[j]) * to_float(x.v[j]);
    }
    const float r = inv_rms<T>(cta_sum<kBlock>(make_float2(ss, 0.0f), scratch).x, p.cols, p.eps);
    if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = r;
    T* yr = p.y + row * p.y_stride;
    for (int c = threadIdx.x; c < p.chunks; c += kBlock) {
      const Pack<T> x = load_chunk(xr, c, p.cols, p.vector_io);
      Pack<T> w;
      if (p.w != nullptr) w = load_chunk(p.w, c, p.cols, p.vector_io);
      store_chunk(yr, c, p.cols, p.vector_io, normalize_chunk(p, x, w, r));
    }
  }
}

// ---- launch ------------------------------------------------------------------------------------

template <typename Fn>
rmsnorm_status_t dispatch_tpr(int tpr, Fn&& fn) {
  switch (tpr) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    case 16: return fn(std::integral_constant<int, 16>{});
    case 32: return fn(std::integral_constant<int, 32>{});
    case 64: return fn(std::integral_constant<int, 64>{});
    case 128: return fn(std::integral_constant<int, 128>{});
    case 256: return fn(std::integral_constant<int, 256>{});
    case 512: return fn(std::integral_constant<int, 512>{});
    case 1024: return fn(std::integral_constant<int, 1024>{});
  }
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "threads_per_row " + std::to_string(tpr) + " has no kernel");
}

// Launches with a cluster dimension when cs > 1 (sm_90), plainly otherwise.
template <typename Kernel, typename Params>
rmsnorm_status_t launch_clustered(Kernel kernel, int64_t grid, int block, int cs, size_t smem, cudaStream_t stream,
                                  const Params& params) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(block));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (cs > plan::kMaxPortableCluster)
    RMSNORM_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (cs > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(cs);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  RMSNORM_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, params));
  return RMSNORM_STATUS_SUCCESS;
}

template <typename T>
rmsnorm_status_t launch_forward(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  const plan::ForwardLaunch l = plan::forward_launch(a.rows, a.cols, static_cast<int>(sizeof(T)), dev);
  ForwardParams<T> p;
  p.x = static_cast<const T*>(a.x);
  p.w = static_cast<const T*>(a.weight);
  p.y = static_cast<T*>(a.y);
  p.rstd = a.rstd;
  p.rows = a.rows;
  p.cols = static_cast<int>(a.cols);
  p.chunks = static_cast<int>(l.row.chunks);
  p.x_stride = a.x_stride;
  p.y_stride = a.y_stride;
  p.eps = a.eps;
  p.w_offset = a.weight_offset ? 1.0f : 0.0f;
  p.round_xhat = a.round_xhat;
  const int es = static_cast<int>(sizeof(T));
  p.vector_io = plan::rows_aligned16(a.x, a.x_stride, es) && plan::rows_aligned16(a.y, a.y_stride, es) &&
                plan::rows_aligned16(a.weight, 0, es);
  const dim3 grid(static_cast<unsigned>(l.grid));
  switch (l.row.band) {
    case plan::Band::kRows:
      return dispatch_tpr(l.row.threads_per_row, [&](auto tpr) -> rmsnorm_status_t {
        constexpr int kTpr = decltype(tpr)::value;
        if (plan::forward_block(kTpr) != l.row.block)
          return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "forward block disagrees with the kernel");
        forward_rows_kernel<T, kTpr><<<grid, plan::forward_block(kTpr), 0, stream>>>(p);
        RMSNORM_CUDA_LAUNCHED("forward_rows_kernel");
        return RMSNORM_STATUS_SUCCESS;
      });
    case plan::Band::kCluster:
      return launch_clustered(forward_cluster_kernel<T>, l.grid, plan::kClusterThreads, l.row.cluster, 0, stream, p);
    case plan::Band::kLooped:
      forward_looped_kernel<T><<<grid, plan::kLoopedThreads, 0, stream>>>(p);
      RMSNORM_CUDA_LAUNCHED("forward_looped_kernel");
      return RMSNORM_STATUS_SUCCESS;
  }
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "unknown band");
}

}  // namespace rmsnorm::cuda
