// Backward kernels for __nv_bfloat16.
#include "cuda/backward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_backward<__nv_bfloat16>(const BackwardArgs&, const plan::Device&, cudaStream_t);

const void* backward_cluster_kernel_handle() {
  return reinterpret_cast<const void*>(backward_kernel<__nv_bfloat16, plan::kClusterTpr, plan::kMaxChunksPerThread, true, true, false>);
}
const void* finalize_kernel_handle() { return reinterpret_cast<const void*>(finalize_gw_kernel<__nv_bfloat16>); }
}  // namespace rmsnorm::cuda
