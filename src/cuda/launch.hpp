// Typed launchers, instantiated once per dtype in forward_*.cu / backward_*.cu
// so that the kernels of each dtype compile in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "args.hpp"
#include "plan.hpp"

namespace rmsnorm::cuda {

template <typename T>
rmsnorm_status_t launch_forward(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream);
template <typename T>
rmsnorm_status_t launch_backward(const BackwardArgs& a, const plan::Device& dev, cudaStream_t stream);

// Largest cluster of cluster-band CTAs the current device can run: 1 when
// the kernels were not compiled for compute_90+, else 8, or 16 where
// non-portable clusters fit; defined in backward_bf16.cu.
int query_max_cluster();

// Whether the library's kernels were compiled for compute_90 or later (a
// build for older targets runs on Hopper through PTX with the sm_90 paths
// compiled out); defined in backward_bf16.cu.
bool kernels_have_sm90_code();

// Calls fn(T{}) with the CUDA element type of dtype.
template <typename Fn>
rmsnorm_status_t dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kF16: return fn(__half{});
    case DType::kBF16: return fn(__nv_bfloat16{});
  }
  return RMSNORM_STATUS_INVALID_DTYPE;
}

}  // namespace rmsnorm::cuda
