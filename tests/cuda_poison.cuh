// Stale-shared-memory poison for the GPU tests (cuda_test.cu, cuda_range_test.cu):
// fills every SM's shared memory with NaN bytes, so a kernel that reads shared
// memory it did not write in this launch (a stale row sum, another row's
// scaled sum) sees garbage. Internal linkage: each test file has its own copy.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <stdexcept>

namespace rmsnorm::test {
namespace {

__global__ void poison_shared_kernel(int words) {
  extern __shared__ unsigned s[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = 0xFFFFFFFFu;
  __syncthreads();
  if (s[(threadIdx.x * 7) % words] == 0u) s[0] = 1u;  // keep the stores alive
}

void poison_shared_memory() {
  // Under racecheck (scripts/gpu_check.sh) this kernel's accesses would
  // dominate the run; races do not depend on the stale contents.
  static const bool skip = std::getenv("RMSNORM_TEST_SKIP_SMEM_POISON") != nullptr;
  if (skip) return;
  int dev = 0, smem = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaFuncSetAttribute(poison_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  poison_shared_kernel<<<sms, 1024, static_cast<size_t>(smem)>>>(smem / 4);
  if (cudaGetLastError() != cudaSuccess) throw std::runtime_error("shared-memory poison kernel failed");
}

}  // namespace
}  // namespace rmsnorm::test
