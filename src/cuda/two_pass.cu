// Two-pass backward for the benchmark (see two_pass.hpp): the fused kernel's
// row work, but gw contributions go to a {rows, cols} temporary in the
// weight dtype, then a column sum (fp32 accumulation) writes gw.
#include "cuda/backward.cuh"
#include "cuda/launch.hpp"
#include "cuda/two_pass.hpp"

namespace rmsnorm::cuda {

namespace {

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
  int device = 0;
  RMSNORM_CUDA_TRY(cudaGetDevice(&device));
  plan::Device dev;
  const rmsnorm_status_t props = device_properties(device, &dev);
  if (props != RMSNORM_STATUS_SUCCESS) return props;
  const plan::BackwardLaunch l = plan::backward_launch(a.rows, a.cols, static_cast<int>(sizeof(T)), false, dev);
  if (l.row.band != plan::Band::kRows || l.row.threads_per_row < 32)
    return fail(RMSNORM_STATUS_INVALID_SHAPE, "cols", "the two-pass variant covers the kRows band with >= 32 threads per row only");
  BackwardParams<T> p = backward_params<T>(a, l);
  p.with_gw = false;
  p.temp = static_cast<T*>(temp);
  p.temp_vector_io = plan::rows_aligned16(temp, a.cols, static_cast<int>(sizeof(T)));
  const dim3 grid(static_cast<unsigned>(l.grid));
  const rmsnorm_status_t st = dispatch_tpr(l.row.threads_per_row, [&](auto tpr) -> rmsnorm_status_t {
    constexpr int kTpr = decltype(tpr)::value;
    if constexpr (kTpr >= 32) {
      if (!p.vector_io)
        return fail(RMSNORM_STATUS_MISALIGNED, "x", "the two-pass variant needs 16-byte aligned rows");
      const auto kernel = backward_kernel<T, kTpr, false, true, true>;
      RMSNORM_CUDA_TRY(allow_dynamic_smem(kernel, l.smem));
      kernel<<<grid, plan::backward_block(kTpr), l.smem, stream>>>(p);
      RMSNORM_CUDA_LAUNCHED("backward_kernel<two-pass>");
    }
    return RMSNORM_STATUS_SUCCESS;
  });
  if (st != RMSNORM_STATUS_SUCCESS) return st;
  GwOut out;
  out.gw = a.gw;
  out.mode = static_cast<int>(a.gw_mode);
  column_sum_kernel<T><<<static_cast<unsigned>((a.cols + kSumCols - 1) / kSumCols), dim3(kSumCols, kSumLanes), 0,
                         stream>>>(static_cast<const T*>(temp), a.rows, a.cols, out);
  RMSNORM_CUDA_LAUNCHED("column_sum_kernel");
  return RMSNORM_STATUS_SUCCESS;
}

}  // namespace

size_t two_pass_temp_bytes(int64_t rows, int64_t cols, DType dtype) {
  return static_cast<size_t>(rows) * static_cast<size_t>(cols) * (dtype == DType::kF32 ? 4 : 2);
}

rmsnorm_status_t backward_two_pass(const BackwardArgs& a, void* temp, void* stream) {
  if (a.gw_mode != GwMode::kStore && a.gw_mode != GwMode::kStoreF32)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "gw_mode", "the two-pass variant stores gw only");
  return dispatch_dtype(a.dtype, [&](auto tag) { return run<decltype(tag)>(a, temp, static_cast<cudaStream_t>(stream)); });
}

}  // namespace rmsnorm::cuda
