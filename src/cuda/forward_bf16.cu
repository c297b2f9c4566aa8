// Forward kernels for __nv_bfloat16.
#include "cuda/forward.cuh"
#include "cuda/launch.hpp"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_forward<__nv_bfloat16>(const ForwardArgs&, const plan::Device&, cudaStream_t);

int query_forward_active_clusters(int cs, size_t smem) {
  return active_clusters(forward_kernel<__nv_bfloat16, plan::kClusterTpr, true, true>, cs, plan::kClusterTpr, smem);
}
}  // namespace rmsnorm::cuda
