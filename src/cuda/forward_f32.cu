// Forward kernels for float.
#include "cuda/forward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_forward<float>(const ForwardArgs&, const plan::Device&, cudaStream_t);
}  // namespace rmsnorm::cuda
