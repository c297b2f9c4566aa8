// Backward kernels for float.
#include "cuda/backward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_backward<float>(const BackwardArgs&, const plan::Device&, cudaStream_t);

const void* f32_cluster_backward_kernel_handle(int passes) {
  using B = __nv_bfloat16;
  constexpr int kMax = plan::kF32ClusterMaxPasses;
  return passes == 2 ? reinterpret_cast<const void*>(backward_f32_cluster_kernel<true, B, B, 2>)
                     : reinterpret_cast<const void*>(backward_f32_cluster_kernel<true, B, B, kMax>);
}
}  // namespace rmsnorm::cuda
