// Backward kernels for float.
#include "cuda/backward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_backward<float>(const BackwardArgs&, const plan::Device&, cudaStream_t);
}  // namespace rmsnorm::cuda
