// Typed launchers, instantiated once per dtype in forward_*.cu / backward_*.cu
// so that the kernels of each dtype compile in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "args.hpp"
#include "plan.hpp"

namespace rmsnorm::cuda {

template <typename T>
rmsnorm_status_t launch_forward(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream);
template <typename T>
rmsnorm_status_t launch_backward(const BackwardArgs& a, const plan::Device& dev, cudaStream_t stream);

// Largest cluster of cluster-band CTAs the current device can run: 1 when
// the kernels were not compiled for compute_90+, else 8, or 16 where
// non-portable clusters fit; defined in backward_bf16.cu.
int query_max_cluster();

// Whether the library's kernels were compiled for compute_90 or later (a
// build for older targets runs on Hopper through PTX with the sm_90 paths
// compiled out); defined in backward_bf16.cu.
bool kernels_have_sm90_code();

// Clusters of `cs` CTAs of the bf16 forward / backward cluster kernel (16-byte
// I/O, `smem` bytes of dynamic shared memory) the current device runs at
// once; 0 when the query fails. Defined in forward_bf16.cu / backward_bf16.cu.
int query_forward_active_clusters(int cs, size_t smem);
int query_backward_active_clusters(int cs, size_t smem);

// cudaOccupancyMaxActiveClusters for a cluster launch of `kernel`.
template <typename Kernel>
int active_clusters(Kernel kernel, int cs, int block, size_t smem) {
  if (cs > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (smem > 48 * 1024 && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cs);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(cs));
  cfg.blockDim = dim3(static_cast<unsigned>(block));
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

// Calls fn(T{}) with the CUDA element type of dtype.
template <typename Fn>
rmsnorm_status_t dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kF16: return fn(__half{});
    case DType::kBF16: return fn(__nv_bfloat16{});
  }
  return RMSNORM_STATUS_INVALID_DTYPE;
}

}  // namespace rmsnorm::cuda
