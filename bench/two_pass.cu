// Two-pass backward (two_pass.hpp).
//
//   pass 1, per row:  gx = r * (w' * gy - x_hat * mean(x_hat * w' * gy)),
//                     temp[row] = T(gy * x_hat)
//   pass 2:           gw[col] = sum over rows of temp[row][col] (fp32)
//
// Pass 1 splits a row as the library's rows band does (plan::row_plan: tpr
// threads per row, the plan's chunks per thread, the row's chunks in registers), one
// row group per CTA, so that the difference measured against the fused
// backward is the temporary's traffic and the second pass, not the row work.
// It reuses the library's device building blocks (chunk I/O, reductions, w').
#include "common/scaled_rms.hpp"
#include "cuda/chunk_io.cuh"
#include "cuda/gw_out.cuh"
#include "cuda/launch.hpp"
#include "cuda/row_map.cuh"
#include "cuda/rstd.cuh"
#include "cuda/weights.cuh"
#include "two_pass.hpp"

namespace rmsnorm::bench {

namespace {

using namespace rmsnorm::cuda;

template <typename T>
struct TwoPassParams {
  const T* x;
  const T* w;
  const T* gy;
  const float* rstd;  // null: recompute
  T* gx;
  T* temp;
  int64_t rows;
  int cols;
  int chunks;
  int64_t x_stride, gy_stride, gx_stride;
  float eps;
  float w_offset;
};

template <typename T, int kTpr, int kCpt>
__global__ void __launch_bounds__(plan::backward_cta_threads(kTpr))
    two_pass_rows_kernel(const TwoPassParams<T> p) {
  constexpr int kCta = plan::backward_cta_threads(kTpr);
  constexpr int kSlots = kCta / kTpr;
  constexpr int kN = Chunk<T>::kN;
  __shared__ RowScratch<float2, kTpr, kSlots> scratch;
  const RowMap<kTpr, false> m;
  ThreadWeights<T, kCpt, true> wv;
  wv.load(p.w, p.chunks, p.cols, true, p.w_offset, m);
  int parity = 0;
  for (int64_t g = m.unit; g * kSlots < p.rows; g += m.units, parity ^= 1) {
    const int64_t row = g * kSlots + m.slot;
    const bool valid = row < p.rows;
    Chunk<T> x[kCpt], gy[kCpt];
    load_group(p.x, p.x_stride, p.rows, p.chunks, p.cols, true, m, g, kSlots, x);
    load_group(p.gy, p.gy_stride, p.rows, p.chunks, p.cols, true, m, g, kSlots, gy);
    float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      if (valid && m.chunk(it) < p.chunks) {
        float w[kN];
        wv.get(it, w);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          sums.x += x[it].get(j) * x[it].get(j);
          sums.y += x[it].get(j) * w[j] * gy[it].get(j);
        }
      }
    }
    sums = row_sum<kTpr, kSlots>(sums, scratch, parity);
    if (!valid) continue;
    const float r = p.rstd != nullptr ? p.rstd[row] : rmsnorm::rms_from_sum(sums.x, p.cols, p.eps);
    const float c = r * (sums.y / static_cast<float>(p.cols));
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int ch = m.chunk(it);
      if (ch >= p.chunks) continue;
      float w[kN];
      wv.get(it, w);
      Chunk<T> gx, t;
#pragma unroll
      for (int j = 0; j < kN; j += 2) {
        float o[2], q[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const float xh = x[it].get(j + k) * r;
          const float g = gy[it].get(j + k);
          o[k] = r * (w[j + k] * g - xh * c);
          q[k] = g * xh;
        }
        gx.set2(j, o[0], o[1]);
        t.set2(j, q[0], q[1]);
      }
      store_chunk(p.gx + row * p.gx_stride, ch, p.cols, true, gx);
      store_chunk(p.temp + row * p.cols, ch, p.cols, true, t);
    }
  }
}

// Column sums of the temporary: CTA = 32 columns x 32 row lanes; lane k adds
// rows k, k + 32, ... in order (fp32), then the 32 lane sums are added in lane
// order. Deterministic; a warp reads 32 consecutive columns of one row.
constexpr int kSumCols = 32;
constexpr int kSumLanes = 32;

template <typename T>
__global__ void __launch_bounds__(kSumCols * kSumLanes)
    column_sum_kernel(const T* __restrict__ temp, int64_t rows, int64_t cols, GwOut out) {
  __shared__ float lanes[kSumLanes][kSumCols + 1];
  const int64_t col = int64_t{blockIdx.x} * kSumCols + threadIdx.x;
  float s = 0.0f;
  if (col < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kSumLanes) s += to_float(temp[r * cols + col]);
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = lanes[0][threadIdx.x];
  for (int k = 1; k < kSumLanes; ++k) total += lanes[k][threadIdx.x];
  store_gw_final<T>(out, col, total);
}

template <typename T>
rmsnorm_status_t run(const BackwardArgs& a, void* temp, cudaStream_t stream) {
  constexpr int kEs = static_cast<int>(sizeof(T));
  int device = 0;
  RMSNORM_CUDA_TRY(cudaGetDevice(&device));
  plan::Device dev;
  const rmsnorm_status_t props = device_properties(device, &dev);
  if (props != RMSNORM_STATUS_SUCCESS) return props;
  const plan::RowPlan row = plan::row_plan(a.cols, kEs, plan::Direction::kBackward, dev);
  if (row.band != plan::Band::kRows)
    return fail(RMSNORM_STATUS_INVALID_SHAPE, "cols", "the two-pass variant covers the rows band only");
  if (plan::io_of({{a.x, a.x_stride}, {a.gy, a.gy_stride}, {a.gx, a.gx_stride}, {a.weight, 0}, {temp, a.cols}},
                  kEs) != plan::Io::kVector)
    return fail(RMSNORM_STATUS_MISALIGNED, "x, gy, gx, weight, temp",
                "the two-pass variant needs every row of every operand 16-byte aligned");
  TwoPassParams<T> p;
  p.x = static_cast<const T*>(a.x);
  p.w = static_cast<const T*>(a.weight);
  p.gy = static_cast<const T*>(a.gy);
  p.rstd = a.rstd;
  p.gx = static_cast<T*>(a.gx);
  p.temp = static_cast<T*>(temp);
  p.rows = a.rows;
  p.cols = static_cast<int>(a.cols);
  p.chunks = static_cast<int>(row.chunks);
  p.x_stride = a.x_stride;
  p.gy_stride = a.gy_stride;
  p.gx_stride = a.gx_stride;
  p.eps = a.eps;
  p.w_offset = a.weight_offset ? 1.0f : 0.0f;
  // One row group per CTA (the hardware balances the SMs).
  const int64_t groups = (a.rows + row.rows_per_cta - 1) / row.rows_per_cta;
  // No rows: only the column sum runs, and stores the empty sum (zeros).
  const rmsnorm_status_t st = groups == 0 ? RMSNORM_STATUS_SUCCESS : dispatch_rows<kEs>(row.threads_per_row, row.chunks_per_thread, [&](auto tpr, auto cpt) -> rmsnorm_status_t {
    constexpr int kTpr = decltype(tpr)::value;
    return launch_kernel("two_pass_rows", two_pass_rows_kernel<T, kTpr, decltype(cpt)::value>, groups,
                         plan::backward_cta_threads(kTpr), 1, 0, false, stream, p);
  });
  if (st != RMSNORM_STATUS_SUCCESS) return st;
  GwOut out;
  out.gw = a.gw;
  out.mode = static_cast<int>(a.gw_mode);
  return launch_kernel("column_sum", column_sum_kernel<T>, (a.cols + kSumCols - 1) / kSumCols,
                       dim3(kSumCols, kSumLanes), 1, 0, false, stream, static_cast<const T*>(temp), a.rows, a.cols, out);
}

}  // namespace

size_t two_pass_temp_bytes(int64_t rows, int64_t cols, DType dtype) {
  return static_cast<size_t>(rows) * static_cast<size_t>(cols) * dtype_size(dtype);
}

rmsnorm_status_t backward_two_pass(const BackwardArgs& a, void* temp, void* stream) {
  if (a.gw_mode != GwMode::kStore && a.gw_mode != GwMode::kStoreF32)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "gw_mode", "the two-pass variant stores gw only");
  return dispatch_dtype(a.dtype,
                        [&](auto tag) { return run<decltype(tag)>(a, temp, static_cast<cudaStream_t>(stream)); });
}

}  // namespace rmsnorm::bench
