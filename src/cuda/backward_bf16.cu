// Backward kernels for __nv_bfloat16.
#include "cuda/backward.cuh"
#include "cuda/launch.hpp"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_backward<__nv_bfloat16>(const BackwardArgs&, const plan::Device&, cudaStream_t);

bool kernels_have_sm90_code() {
  cudaFuncAttributes fattr;
  if (cudaFuncGetAttributes(&fattr, finalize_gw_kernel<__nv_bfloat16>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return fattr.ptxVersion >= 90;
}

int query_backward_active_clusters(int cs, size_t smem) {
  return active_clusters(backward_kernel<__nv_bfloat16, plan::kClusterTpr, true, false, true>, cs, plan::kClusterTpr,
                         smem);
}

int query_max_cluster() {
  // The backward kernel is the heavier of the two cluster kernels (one CTA
  // per SM), so what fits for it fits for the forward.
  const auto kernel = backward_kernel<__nv_bfloat16, plan::kClusterTpr, true, false, true>;
  // Clusters need the kernels compiled for compute_90 or later: a build for
  // older targets runs on Hopper through its PTX with the cluster code
  // compiled out (__CUDA_ARCH__ < 900), so the plan must not use clusters.
  cudaFuncAttributes fattr;
  if (cudaFuncGetAttributes(&fattr, kernel) != cudaSuccess || fattr.ptxVersion < 90) {
    cudaGetLastError();
    return 1;
  }
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return plan::kMaxPortableCluster;
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = plan::kMaxCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(plan::kMaxCluster);
  cfg.blockDim = dim3(plan::kClusterTpr);
  cfg.dynamicSmemBytes = 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return plan::kMaxPortableCluster;
  }
  return clusters > 0 ? plan::kMaxCluster : plan::kMaxPortableCluster;
}
}  // namespace rmsnorm::cuda
