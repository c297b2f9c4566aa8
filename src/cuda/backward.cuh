// RMSNorm backward, gx and gw fused in one deterministic pass.
//
//   r  = rstd (given) or 1 / sqrt(sum(x^2) / D + eps)
//   c  = r * sum(x * w' * gy) / D                = mean(x_hat * w' * gy)
//   gx = r * (w' * gy - x_hat * c)
//   gw = sum over rows of gy * x_hat             (fp32, one rounding)
//
// Work split: a persistent grid. Each CTA (kRows, kLooped) or cluster
// (kCluster) owns the rows g, g + P, g + 2P, ... (P = number of CTAs or
// clusters); within it, rows are split exactly as in the forward (plan.hpp),
// so each thread owns fixed columns and keeps their gw partial sums in fp32:
// registers for kRows, shared memory for kCluster, its own workspace row for
// kLooped. One reduction per row carries both sum(x^2) and sum(x w' gy). At
// the end the row slots of a CTA are added in slot order and the CTA writes
// one fp32 partial row to the workspace (at most 2 per SM); the finalize
// kernel adds the partial rows in order and writes gw. With a single partial
// the main kernel writes gw itself. No atomics: bitwise deterministic.
#pragma once

#include "cuda/forward.cuh"

namespace rmsnorm::cuda {

template <typename T>
struct BackwardParams {
  const T* x;
  const T* w;  // null only when gw is not wanted
  const T* gy;
  const float* rstd;  // null: recompute
  T* gx;
  int64_t rows;
  int cols;
  int chunks;
  int64_t x_stride;
  int64_t gy_stride;
  int64_t gx_stride;
  float eps;
  float w_offset;
  bool vector_io;
  bool with_gw;
  GwOut gw;
  // Two-pass variant (benchmark only): gy * x_hat per element, {rows, cols}.
  T* temp;
  bool temp_vector_io;
};

// The weight chunk is loaded where it is used rather than held in registers
// across rows: it stays in L1, and the registers go to x, gy and the gw sums.
template <typename T>
__device__ __forceinline__ Pack<T> load_weight(const BackwardParams<T>& p, int chunk) {
  Pack<T> w;
  if (p.w != nullptr) w = load_chunk(p.w, chunk, p.cols, p.vector_io);
  return w;
}

// Per-chunk sums: x^2 and x * w' * gy.
template <typename T>
__device__ __forceinline__ float2 chunk_sums(const Pack<T>& x, const Pack<T>& gy, const Pack<T>& w, bool has_w,
                                             float w_offset) {
  float2 s = make_float2(0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; ++j) {
    const float xv = to_float(x.v[j]);
    s.x += xv * xv;
    s.y += xv * weight_of(w, j, has_w, w_offset) * to_float(gy.v[j]);
  }
  return s;
}

struct RowScalars {
  float r;  // rstd
  float c;  // mean(x_hat * w' * gy)
};

template <typename T>
__device__ __forceinline__ RowScalars row_scalars(const BackwardParams<T>& p, int64_t row, float2 sums) {
  RowScalars s;
  s.r = p.rstd != nullptr ? p.rstd[row] : inv_rms<T>(sums.x, p.cols, p.eps);
  s.c = s.r * (sums.y / static_cast<float>(p.cols));
  return s;
}

// gx for one chunk; gy * x_hat of each element goes to gw_terms.
template <typename T>
__device__ __forceinline__ Pack<T> grad_chunk(const Pack<T>& x, const Pack<T>& gy, const Pack<T>& w, bool has_w,
                                              float w_offset, RowScalars s, float (&gw_terms)[Pack<T>::kN]) {
  Pack<T> gx;
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; ++j) {
    const float xh = to_float(x.v[j]) * s.r;
    const float g = to_float(gy.v[j]);
    gx.v[j] = from_float<T>(s.r * (weight_of(w, j, has_w, w_offset) * g - xh * s.c));
    gw_terms[j] = g * xh;
  }
  return gx;
}

template <typename T>
__device__ __forceinline__ Pack<T> xhat_gy_chunk(const Pack<T>& x, const Pack<T>& gy, float r) {
  Pack<T> o;
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; ++j) o.v[j] = from_float<T>(to_float(gy.v[j]) * (to_float(x.v[j]) * r));
  return o;
}

// ---- kRows: persistent CTAs of rows_per_block row slots ----------------------------------------
// gw partials live in dynamic shared memory, acc[(it * kN + j) * kBlock + tid]
// (plan::backward_rows_smem): each entry belongs to one thread until the
// final slot sum, and consecutive threads hit consecutive banks. Registers
// hold x and gy only, so 512-thread CTAs run two per SM without spilling.
// kTwoPass: instead of accumulating gw, write gy * x_hat to p.temp (benchmark only).
template <typename T, int kTpr, bool kTwoPass>
__global__ void __launch_bounds__(plan::backward_block(kTpr), plan::backward_blocks_per_sm(kTpr))
    backward_rows_kernel(const BackwardParams<T> p) {
  constexpr int kBlock = plan::backward_block(kTpr);
  constexpr int kRowsPerBlock = kBlock / kTpr;
  constexpr int kCpt = plan::rows_chunks_per_thread(sizeof(T));
  constexpr int kN = Pack<T>::kN;
  static_assert(kRowsPerBlock * kTpr == kBlock, "plan: rows_per_block * threads_per_row == block");
  static_assert(kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  static_assert(plan::backward_rows_smem(kTpr) == sizeof(float) * kBlock * kCpt * kN,
                "plan: shared gw accumulators");
  __shared__ float2 scratch[kTpr > 32 ? kRowsPerBlock * plan::warps_per_row(kTpr) : 1];
  extern __shared__ float acc[];

  const int slot = plan::row_slot(threadIdx.x, kTpr);
  const int lane = threadIdx.x % kTpr;
  const bool has_w = p.w != nullptr;
  const bool with_gw = !kTwoPass && p.with_gw;
  if (with_gw)
    for (int k = 0; k < kCpt * kN; ++k) acc[k * kBlock + threadIdx.x] = 0.0f;

  // Software pipeline: the next row's x and gy are loaded before this row's
  // reduction, so each thread keeps a load in flight across the barriers.
  const int64_t groups = (p.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  Pack<T> x[kCpt], gy[kCpt];
  auto load_row = [&](int64_t g, Pack<T>(&xs)[kCpt], Pack<T>(&gys)[kCpt]) {
    const int64_t row = g * kRowsPerBlock + slot;
    if (g >= groups || row >= p.rows) return;
    const T* xr = p.x + row * p.x_stride;
    const T* gyr = p.gy + row * p.gy_stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * kTpr + lane;
      if (c < p.chunks) {
        xs[it] = load_chunk(xr, c, p.cols, p.vector_io);
        gys[it] = load_chunk(gyr, c, p.cols, p.vector_io);
      }
    }
  };
  load_row(blockIdx.x, x, gy);
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row = g * kRowsPerBlock + slot;
    const bool valid = row < p.rows;
    Pack<T> xn[kCpt], gyn[kCpt];
    load_row(g + gridDim.x, xn, gyn);
    float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * kTpr + lane;
      if (valid && c < p.chunks) sums = add2(sums, chunk_sums(x[it], gy[it], load_weight(p, c), has_w, p.w_offset));
    }
    sums = row_sum<kTpr, kBlock>(sums, scratch);
    const RowScalars s = valid ? row_scalars(p, row, sums) : RowScalars{0.0f, 0.0f};
    T* gxr = p.gx + row * p.gx_stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * kTpr + lane;
      if (valid && c < p.chunks) {
        float a[kN];
        const Pack<T> gx = grad_chunk(x[it], gy[it], load_weight(p, c), has_w, p.w_offset, s, a);
        store_chunk(gxr, c, p.cols, p.vector_io, gx);
        if (with_gw) {
#pragma unroll
          for (int j = 0; j < kN; ++j) acc[(it * kN + j) * kBlock + threadIdx.x] += a[j];
        }
        if constexpr (kTwoPass)
          store_chunk(p.temp + row * p.cols, c, p.cols, p.temp_vector_io, xhat_gy_chunk(x[it], gy[it], s.r));
      }
    }
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      x[it] = xn[it];
      gy[it] = gyn[it];
    }
  }
  if (!with_gw) return;

  // gw: add the row slots in slot order, write one partial (or gw itself).
  __syncthreads();
  for (int e = threadIdx.x; e < kCpt * kTpr * kN; e += kBlock) {
    const int it = e / (kTpr * kN), l = (e / kN) % kTpr, j = e % kN;
    const int col = (it * kTpr + l) * kN + j;
    if (col >= p.cols) continue;
    const float* a = acc + (it * kN + j) * kBlock + l;
    float v = a[0];
#pragma unroll
    for (int s = 1; s < kRowsPerBlock; ++s) v += a[s * kTpr];
    emit_gw<T>(p.gw, blockIdx.x, p.cols, col, v);
  }
}

// ---- kCluster: persistent clusters, one row at a time per cluster -------------------------------
// x stays in registers from the first pass to the second; gy is loaded again
// for the second pass: this CTA read those bytes microseconds earlier and the
// whole grid's working set (clusters x row) is far below the 60 MB L2, so the
// reload hits L2 and DRAM still sees gy once. gw partials in shared memory.
template <typename T>
__global__ void __launch_bounds__(plan::kClusterThreads, 1) backward_cluster_kernel(const BackwardParams<T> p) {
  constexpr int kBlock = plan::kClusterThreads;
  constexpr int kCpt = plan::cluster_chunks_per_thread(sizeof(T));
  constexpr int kN = Pack<T>::kN;
  static_assert(plan::backward_cluster_smem() == sizeof(float) * kBlock * kCpt * kN,
                "plan: shared gw accumulators");
  __shared__ float2 scratch[plan::warps_per_row(kBlock)];
  __shared__ float2 exchange;
  extern __shared__ float acc[];
  const unsigned cs = cluster_size();
  const int stride = kBlock * static_cast<int>(cs);
  const int gtid = static_cast<int>(cluster_rank()) * kBlock + threadIdx.x;
  const bool has_w = p.w != nullptr;
  if (p.with_gw)
    for (int k = 0; k < kCpt * kN; ++k) acc[k * kBlock + threadIdx.x] = 0.0f;

  for (int64_t row = blockIdx.x / cs; row < p.rows; row += gridDim.x / cs) {
    const T* xr = p.x + row * p.x_stride;
    const T* gyr = p.gy + row * p.gy_stride;
    Pack<T> x[kCpt];
    float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * stride + gtid;
      if (c < p.chunks) x[it] = load_chunk(xr, c, p.cols, p.vector_io);
    }
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * stride + gtid;
      if (c < p.chunks)
        sums = add2(sums, chunk_sums(x[it], load_chunk(gyr, c, p.cols, p.vector_io), load_weight(p, c), has_w,
                                     p.w_offset));
    }
    sums = cluster_sum(cta_sum<kBlock>(sums, scratch), &exchange);
    const RowScalars s = row_scalars(p, row, sums);
    T* gxr = p.gx + row * p.gx_stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = it * stride + gtid;
      if (c < p.chunks) {
        float a[kN];
        store_chunk(gxr, c, p.cols, p.vector_io,
                    grad_chunk(x[it], reload_chunk(gyr, c, p.cols, p.vector_io),
                               has_w ? reload_chunk(p.w, c, p.cols, p.vector_io) : Pack<T>{}, has_w, p.w_offset, s, a));
        if (p.with_gw) {
#pragma unroll
          for (int j = 0; j < kN; ++j) acc[(it * kN + j) * kBlock + threadIdx.x] += a[j];
        }
      }
    }
  }
  if (!p.with_gw) return;
  const int64_t partial = blockIdx.x / cs;
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = it * stride + gtid;
#pragma unroll
    for (int j = 0; j < kN; ++j)
      if (c < p.chunks && c * kN + j < p.cols)
        emit_gw<T>(p.gw, partial, p.cols, c * kN + j, acc[(it * kN + j) * kBlock + threadIdx.x]);
  }
}

// ---- kLooped: any D; x and gy read twice; gw partial kept in this CTA's workspace row ----------
template <typename T>
__global__ void __launch_bounds__(plan::kLoopedThreads) backward_looped_kernel(const BackwardParams<T> p) {
  constexpr int kBlock = plan::kLoopedThreads;
  constexpr int kN = Pack<T>::kN;
  __shared__ float2 scratch[plan::warps_per_row(kBlock)];
  const bool has_w = p.w != nullptr;
  // Each thread touches only the workspace columns of its own chunks, in the
  // same mapping below, so no barrier is needed around these updates.
  float* part = p.with_gw ? p.gw.partials + blockIdx.x * static_cast<int64_t>(p.cols) : nullptr;
  if (part != nullptr)
    for (int c = threadIdx.x; c < p.chunks; c += kBlock)
      for (int j = 0; j < kN; ++j)
        if (c * kN + j < p.cols) part[c * kN + j] = 0.0f;

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* xr = p.x + row * p.x_stride;
    const T* gyr = p.gy + row * p.gy_stride;
    float2 sums = make_float2(0.0f, 0.0f);
    for (int c = threadIdx.x; c < p.chunks; c += kBlock)
      sums = add2(sums, chunk_sums(load_chunk(xr, c, p.cols, p.vector_io), load_chunk(gyr, c, p.cols, p.vector_io),
                                   load_weight(p, c), has_w, p.w_offset));
    const RowScalars s = row_scalars(p, row, cta_sum<kBlock>(sums, scratch));
    T* gxr = p.gx + row * p.gx_stride;
    for (int c = threadIdx.x; c < p.chunks; c += kBlock) {
      float a[kN];
      store_chunk(gxr, c, p.cols, p.vector_io,
                  grad_chunk(load_chunk(xr, c, p.cols, p.vector_io), load_chunk(gyr, c, p.cols, p.vector_io),
                             load_weight(p, c), has_w, p.w_offset, s, a));
      if (part != nullptr)
        for (int j = 0; j < kN; ++j)
          if (c * kN + j < p.cols) part[c * kN + j] += a[j];
    }
  }
}

// ---- finalize: gw[col] = sum of the partial rows, in partial order -------------------------------
// CTA = 32 columns x 8 lanes; lane k adds partials k, k + 8, ... in order,
// then the 8 lane sums are added in lane order.
template <typename T>
__global__ void __launch_bounds__(plan::kFinalizeCols * plan::kFinalizeLanes)
    finalize_gw_kernel(const float* __restrict__ partials, int64_t count, int64_t cols, GwOut out) {
  __shared__ float lanes[plan::kFinalizeLanes][plan::kFinalizeCols];
  const int64_t col = int64_t{blockIdx.x} * plan::kFinalizeCols + threadIdx.x;
  float v = 0.0f;
  if (col < cols)
    for (int64_t b = threadIdx.y; b < count; b += plan::kFinalizeLanes) v += partials[b * cols + col];
  lanes[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = lanes[0][threadIdx.x];
#pragma unroll
  for (int k = 1; k < plan::kFinalizeLanes; ++k) total += lanes[k][threadIdx.x];
  store_gw_final<T>(out, col, total);
}

template <typename T>
rmsnorm_status_t launch_finalize(const float* partials, int64_t count, int64_t cols, const GwOut& out,
                                 cudaStream_t stream) {
  const dim3 block(plan::kFinalizeCols, plan::kFinalizeLanes);
  const dim3 grid(static_cast<unsigned>((cols + plan::kFinalizeCols - 1) / plan::kFinalizeCols));
  finalize_gw_kernel<T><<<grid, block, 0, stream>>>(partials, count, cols, out);
  RMSNORM_CUDA_LAUNCHED("finalize_gw_kernel");
  return RMSNORM_STATUS_SUCCESS;
}

template <typename T>
BackwardParams<T> backward_params(const BackwardArgs& a, const plan::BackwardLaunch& l) {
  BackwardParams<T> p;
  p.x = static_cast<const T*>(a.x);
  p.w = static_cast<const T*>(a.weight);
  p.gy = static_cast<const T*>(a.gy);
  p.rstd = a.rstd;
  p.gx = static_cast<T*>(a.gx);
  p.rows = a.rows;
  p.cols = static_cast<int>(a.cols);
  p.chunks = static_cast<int>(l.row.chunks);
  p.x_stride = a.x_stride;
  p.gy_stride = a.gy_stride;
  p.gx_stride = a.gx_stride;
  p.eps = a.eps;
  p.w_offset = a.weight_offset ? 1.0f : 0.0f;
  const int es = static_cast<int>(sizeof(T));
  p.vector_io = plan::rows_aligned16(a.x, a.x_stride, es) && plan::rows_aligned16(a.gy, a.gy_stride, es) &&
                plan::rows_aligned16(a.gx, a.gx_stride, es) && plan::rows_aligned16(a.weight, 0, es);
  p.with_gw = a.gw_mode != GwMode::kNone;
  p.gw.gw = a.gw;
  p.gw.mode = static_cast<int>(a.gw_mode);
  p.gw.partials = static_cast<float*>(a.workspace);
  p.gw.direct = l.direct_gw;
  p.temp = nullptr;
  p.temp_vector_io = false;
  return p;
}

template <typename T>
rmsnorm_status_t launch_backward(const BackwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  const bool with_gw = a.gw_mode != GwMode::kNone;
  const plan::BackwardLaunch l = plan::backward_launch(a.rows, a.cols, static_cast<int>(sizeof(T)), with_gw, dev);
  const BackwardParams<T> p = backward_params<T>(a, l);
  if (a.rows == 0) {
    // No rows: gw is the empty sum (0), stored or added per mode.
    return with_gw ? launch_finalize<T>(nullptr, 0, a.cols, p.gw, stream) : RMSNORM_STATUS_SUCCESS;
  }
  const dim3 grid(static_cast<unsigned>(l.grid));
  rmsnorm_status_t st = RMSNORM_STATUS_SUCCESS;
  switch (l.row.band) {
    case plan::Band::kRows:
      st = dispatch_tpr(l.row.threads_per_row, [&](auto tpr) -> rmsnorm_status_t {
        constexpr int kTpr = decltype(tpr)::value;
        if (plan::backward_block(kTpr) != l.row.block)
          return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "backward block disagrees with the kernel");
        const size_t smem = with_gw ? plan::backward_rows_smem(kTpr) : 0;
        if (smem != l.smem) return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "backward smem disagrees with the kernel");
        if (smem > 48 * 1024)
          RMSNORM_CUDA_TRY(cudaFuncSetAttribute(backward_rows_kernel<T, kTpr, false>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        backward_rows_kernel<T, kTpr, false><<<grid, plan::backward_block(kTpr), smem, stream>>>(p);
        RMSNORM_CUDA_LAUNCHED("backward_rows_kernel");
        return RMSNORM_STATUS_SUCCESS;
      });
      break;
    case plan::Band::kCluster: {
      // Per device (function attributes belong to a context), so set it on every call; it is a host-side call.
      if (l.smem > 0)
        RMSNORM_CUDA_TRY(cudaFuncSetAttribute(backward_cluster_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(l.smem)));
      st = launch_clustered(backward_cluster_kernel<T>, l.grid, plan::kClusterThreads, l.row.cluster, l.smem, stream,
                            p);
      break;
    }
    case plan::Band::kLooped:
      backward_looped_kernel<T><<<grid, plan::kLoopedThreads, 0, stream>>>(p);
      RMSNORM_CUDA_LAUNCHED("backward_looped_kernel");
      break;
  }
  if (st != RMSNORM_STATUS_SUCCESS) return st;
  if (with_gw && !l.direct_gw) return launch_finalize<T>(p.gw.partials, l.partials, a.cols, p.gw, stream);
  return RMSNORM_STATUS_SUCCESS;
}

}  // namespace rmsnorm::cuda
