// Forward kernels for __nv_bfloat16.
#include "cuda/forward.cuh"
#include "cuda/launch.hpp"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_forward<__nv_bfloat16>(const ForwardArgs&, const plan::Device&, cudaStream_t);
}  // namespace rmsnorm::cuda
