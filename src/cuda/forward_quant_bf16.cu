// Quantized-output forward kernels for __nv_bfloat16 (their own unit, so that they
// compile in parallel with the plain forward's).
#include "cuda/forward.cuh"

namespace rmsnorm::cuda {
template rmsnorm_status_t launch_forward_quant<__nv_bfloat16>(const ForwardArgs&, const QuantArgs&, const plan::Device&,
                                                        cudaStream_t);
}  // namespace rmsnorm::cuda
