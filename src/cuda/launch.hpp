// Host side of the CUDA backend: error handling, the one launch function
// every kernel goes through, and compile-time dispatch of the plan's
// run-time values. Nothing here decides geometry: that is plan.hpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "args.hpp"
#include "error.hpp"
#include "plan.hpp"

namespace rmsnorm::cuda {

// A CUDA error reaches the caller as this status and message. The runtime's per-thread last error is cleared of
// it, as of the errors the library handles itself: left there, a framework's launch check after its own next kernel
// (cudaGetLastError) would report it again against that kernel. A sticky error (a fault) stays, as it must.
inline rmsnorm_status_t cuda_fail(cudaError_t e, const char* what) {
  (void)cudaGetLastError();
  return fail(RMSNORM_STATUS_CUDA_ERROR, what, std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}

#define RMSNORM_CUDA_TRY(call)                                              \
  do {                                                                      \
    const cudaError_t rmsnorm_err_ = (call);                                \
    if (rmsnorm_err_ != cudaSuccess) return ::rmsnorm::cuda::cuda_fail(rmsnorm_err_, #call); \
  } while (0)

// Launches whose dynamic shared memory is at most this need no raised limit
// (the default 48 KiB less the kernels' static shared memory, the scratch).
constexpr size_t kDefaultDynamicSmem = 32 * 1024;

// Lets `kernel` take `bytes` of dynamic shared memory on the current device
// (device.cu). The limit is a function attribute of the context, shared by
// every thread, and two plans may give one kernel different sizes (with and
// without gw, say). So it is set to the largest size asked of that kernel on
// that device so far, never lower: another thread cannot lower it between
// this thread's set and its launch. It is set on every call, since a context
// (reset, or another one of the same device) may not have it yet.
cudaError_t allow_dynamic_smem(const void* kernel, size_t bytes);

// The device's properties as the plan sees them, read once per device
// (device.cu).
rmsnorm_status_t device_properties(int device, plan::Device* out);

// Typed launchers, instantiated once per dtype in forward_*.cu / backward_*.cu
// so that the kernels of each dtype compile in parallel.
template <typename T>
rmsnorm_status_t launch_forward(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream);
template <typename T>
rmsnorm_status_t launch_forward_quant(const ForwardArgs& a, const QuantArgs& qa, const plan::Device& dev,
                                      cudaStream_t stream);
template <typename T>
rmsnorm_status_t launch_backward(const BackwardArgs& a, const plan::Device& dev, cudaStream_t stream);

// Kernels whose attributes device.cu queries: the bf16 cluster kernels with
// 16-byte I/O (the heaviest of their kind; what fits for them fits for the
// other dtypes) and the bf16 finalize kernel (its PTX version tells whether
// the library carries compute_90 code). Defined in forward_bf16.cu and
// backward_bf16.cu, where those kernels are instantiated.
const void* forward_cluster_kernel_handle();
const void* backward_cluster_kernel_handle();
// backward_f32_cluster_kernel at `passes` (the residual stream's form with a bf16 gy and weight: the most registers
// at each launch bound), defined in backward_f32.cu.
const void* f32_cluster_backward_kernel_handle(int passes);
const void* finalize_kernel_handle();

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

// Calls fn(W{}) with the weight's element type W for kernels of x's type T:
// float for an fp32 weight with 16-bit x (RMSNORM_FLAG_WEIGHT_F32), else T.
template <typename T, typename Fn>
rmsnorm_status_t dispatch_weight(bool weight_f32, Fn&& fn) {
  if constexpr (!std::is_same_v<T, float>) {
    if (weight_f32) return fn(float{});
  }
  return fn(T{});
}

// Calls fn(std::integral_constant<int, tpr>, std::integral_constant<int, cpt>)
// for the rows band's threads per row and chunks per thread of rows of kEsize-byte
// elements (plan.hpp: cpt 4 with tpr 1..64, 256 and 512; cpt 2 with tpr 8, 32 and
// 256, and 512 at fp32 only, so the 16-bit kernels are not instantiated there; the
// planner's tests check that every D lands on one of these).
template <int kEsize, typename Fn>
rmsnorm_status_t dispatch_rows(int tpr, int cpt, Fn&& fn) {
  using Few = std::integral_constant<int, plan::kFewChunksPerThread>;
  using Max = std::integral_constant<int, plan::kMaxChunksPerThread>;
  if (cpt == Max::value) {
    switch (tpr) {
      case 1: return fn(std::integral_constant<int, 1>{}, Max{});
      case 2: return fn(std::integral_constant<int, 2>{}, Max{});
      case 4: return fn(std::integral_constant<int, 4>{}, Max{});
      case 8: return fn(std::integral_constant<int, 8>{}, Max{});
      case 16: return fn(std::integral_constant<int, 16>{}, Max{});
      case 32: return fn(std::integral_constant<int, 32>{}, Max{});
      case 64: return fn(std::integral_constant<int, 64>{}, Max{});
      case 256: return fn(std::integral_constant<int, 256>{}, Max{});
      case 512: return fn(std::integral_constant<int, 512>{}, Max{});
    }
  } else if (cpt == Few::value) {
    static_assert(plan::few_chunks_tpr(8, kEsize) && plan::few_chunks_tpr(32, kEsize) &&
                      plan::few_chunks_tpr(plan::kFewChunksTpr, kEsize) &&
                      plan::few_chunks_tpr(plan::kFewChunksTprF32, kEsize) == (kEsize == 4),
                  "plan: the threads per row of kFewChunksPerThread");
    switch (tpr) {
      case 8: return fn(std::integral_constant<int, 8>{}, Few{});
      case 32: return fn(std::integral_constant<int, 32>{}, Few{});
      case plan::kFewChunksTpr: return fn(std::integral_constant<int, plan::kFewChunksTpr>{}, Few{});
      case plan::kFewChunksTprF32:
        if constexpr (kEsize == 4) return fn(std::integral_constant<int, plan::kFewChunksTprF32>{}, Few{});
        break;
    }
  }
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan",
              "threads_per_row " + std::to_string(tpr) + " with " + std::to_string(cpt) + " chunks has no kernel");
}

// The failure of `call` for the kernel `name`, with the launch's geometry in the message (as cuda_fail: the runtime's
// last error cleared of it).
inline rmsnorm_status_t launch_fail(cudaError_t e, const char* name, const char* call, int64_t grid, dim3 block,
                                    size_t smem, int cs) {
  (void)cudaGetLastError();
  return fail(RMSNORM_STATUS_CUDA_ERROR, name,
              std::string(call) + " (grid " + std::to_string(grid) + ", block " + std::to_string(block.x) + "x" +
                  std::to_string(block.y) + ", " + std::to_string(smem) + " bytes of dynamic shared memory, cluster " +
                  std::to_string(cs) + "): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Every kernel launch of the library: with a cluster dimension when cs > 1,
// as a programmatic dependent of the previous kernel in the stream when pdl
// (both sm_90; the kernel starts with pdl_enter). name: the kernel, for the error message.
template <typename Kernel, typename... Args>
rmsnorm_status_t launch_kernel(const char* name, Kernel kernel, int64_t grid, dim3 block, int cs, size_t smem,
                               bool pdl, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cs > plan::kMaxPortableCluster) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess)
      return launch_fail(e, name, "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)", grid, block, smem, cs);
  }
  if (cs > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cs);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess) return launch_fail(e, name, "cudaLaunchKernelEx", grid, block, smem, cs);
  return RMSNORM_STATUS_SUCCESS;
}

// The main kernel of a plan: the kernel's CTA size (a template constant) must
// be the plan's; its dynamic shared-memory limit is raised where the plan
// needs more than the default (allow_dynamic_smem); then launch_kernel.
template <typename Kernel, typename Params>
rmsnorm_status_t launch_planned(Kernel kernel, int cta_threads, const plan::Launch& l, bool pdl, cudaStream_t stream,
                                const Params& p) {
  if (cta_threads != l.row.cta_threads)
    return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan",
                std::string(plan::kernel_name(l.kernel)) + ": the kernel's CTA size disagrees with the plan");
  const char* name = plan::kernel_name(l.kernel);
  if (l.smem > kDefaultDynamicSmem) {
    const cudaError_t e = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), l.smem);
    if (e != cudaSuccess)
      return launch_fail(e, name, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", l.grid, cta_threads, l.smem,
                         l.row.cluster);
  }
  return launch_kernel(name, kernel, l.grid, cta_threads, l.row.cluster, l.smem, pdl, stream, p);
}

}  // namespace rmsnorm::cuda
