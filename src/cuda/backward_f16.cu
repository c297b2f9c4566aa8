// Backward kernels for __half.
#include "cuda/backward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_backward<__half>(const BackwardArgs&, const plan::Device&, cudaStream_t);
}  // namespace rmsnorm::cuda
