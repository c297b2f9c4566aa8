// Forward kernels for __half.
#include "cuda/forward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_forward<__half>(const ForwardArgs&, const plan::Device&, cudaStream_t);
}  // namespace rmsnorm::cuda
