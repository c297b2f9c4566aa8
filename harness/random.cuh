// Device fill with the host fill's generator (random.hpp): element i of a
// fill with seed s is normal_at(s, i) on either side, for buffers too large
// to fill on the host and upload in reasonable time (the benchmark's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "harness/random.hpp"
#include "rmsnorm/rmsnorm.h"

namespace rmsnorm::harness {
namespace device_fill {

__device__ inline float round_trip(float v, float*) { return v; }
__device__ inline float round_trip(float v, __half*) { return __half2float(__float2half_rn(v)); }
__device__ inline float round_trip(float v, __nv_bfloat16*) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ inline void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// The host fill's rule: mean + scale * N(0, 1), a value that rounds to zero
// replaced by mean + 0.5 * scale.
template <typename T>
__global__ void fill_normal_kernel(T* p, size_t n, uint64_t seed, double mean, double scale) {
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float v = static_cast<float>(mean + scale * normal_at(seed, i));
    if (round_trip(v, p) == 0.0f) v = static_cast<float>(mean + 0.5 * scale);
    store(p + i, v);
  }
}

}  // namespace device_fill

// Fills n contiguous elements of dtype at p (device memory) on stream s;
// returns the launch's error.
inline cudaError_t fill_normal_device(void* p, size_t n, int32_t dtype, uint64_t seed, double mean, double scale,
                                      cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const unsigned grid = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, static_cast<size_t>(sms) * 16));
  switch (dtype) {
    case RMSNORM_DTYPE_F32:
      device_fill::fill_normal_kernel<<<grid, 256, 0, s>>>(static_cast<float*>(p), n, seed, mean, scale);
      break;
    case RMSNORM_DTYPE_F16:
      device_fill::fill_normal_kernel<<<grid, 256, 0, s>>>(static_cast<__half*>(p), n, seed, mean, scale);
      break;
    default:
      device_fill::fill_normal_kernel<<<grid, 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed, mean, scale);
      break;
  }
  return cudaGetLastError();
}

}  // namespace rmsnorm::harness
