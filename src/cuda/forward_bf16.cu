// Forward kernels for __nv_bfloat16.
#include "cuda/forward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_forward<__nv_bfloat16>(const ForwardArgs&, const plan::Device&, cudaStream_t);

const void* forward_cluster_kernel_handle() {
  return reinterpret_cast<const void*>(forward_kernel<__nv_bfloat16, plan::kClusterTpr, plan::kMaxChunksPerThread, true, true>);
}
}  // namespace rmsnorm::cuda
