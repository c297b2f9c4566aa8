// CUDA backend entry points: device selection, pointer checks, the device
// properties the plan reads, dispatch.
#include <cuda.h>  // driver types only: the functions come through cudaGetDriverEntryPointByVersion
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>
#include <new>
#include <utility>

#include "cuda/cuda_backend.hpp"
#include "cuda/launch.hpp"

namespace rmsnorm::cuda {

namespace {

// The driver functions DeviceScope needs, through the runtime's entry-point
// lookup (the library links no libcuda); null where the driver lacks one.
struct DriverContextApi {
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_get_state)(CUdevice, unsigned*, int*) = nullptr;
};

template <typename Fn>
void driver_entry(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    *fn = reinterpret_cast<Fn>(p);
  else
    cudaGetLastError();
}

const DriverContextApi& driver_context_api() {
  static const DriverContextApi api = [] {
    DriverContextApi a;
    driver_entry("cuCtxGetCurrent", &a.ctx_get_current);
    driver_entry("cuCtxSetCurrent", &a.ctx_set_current);
    driver_entry("cuDeviceGet", &a.device_get);
    driver_entry("cuDevicePrimaryCtxGetState", &a.primary_ctx_get_state);
    return a;
  }();
  return api;
}

// Whether `ordinal`'s primary context exists; true when the driver cannot say.
bool primary_context_active(int ordinal) {
  const DriverContextApi& d = driver_context_api();
  CUdevice dev = 0;
  unsigned flags = 0;
  int active = 1;
  if (d.device_get == nullptr || d.primary_ctx_get_state == nullptr || d.device_get(&dev, ordinal) != CUDA_SUCCESS ||
      d.primary_ctx_get_state(dev, &flags, &active) != CUDA_SUCCESS)
    return true;
  return active != 0;
}

}  // namespace

// DeviceScope (cuda_backend.hpp). cudaSetDevice creates the primary context of
// the device it makes current, so the caller's device is set back only where
// its primary context exists: a thread that never used CUDA reports device 0,
// and restoring that would put a context on GPU 0 (memory, and an error on a
// GPU in exclusive-process mode) in every process that calls the library for
// another GPU. Such a thread keeps `device` current, as PyTorch's device guard
// leaves it. A context of the caller's own (cuCtxCreate, a green context) is
// made current again as it was.
DeviceScope::DeviceScope(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ == device) return;  // the common case: nothing to do, nothing to restore
  const DriverContextApi& d = driver_context_api();
  CUcontext current = nullptr;
  if (d.ctx_get_current != nullptr && d.ctx_get_current(&current) == CUDA_SUCCESS) previous_context_ = current;
  status_ = static_cast<int>(cudaSetDevice(device));
  switched_ = true;
}

DeviceScope::~DeviceScope() {
  if (!switched_) return;
  if (previous_ >= 0 && primary_context_active(previous_) && cudaSetDevice(previous_) != cudaSuccess)
    cudaGetLastError();  // the caller's thread is left no error of ours
  const DriverContextApi& d = driver_context_api();
  if (previous_context_ != nullptr && d.ctx_set_current != nullptr)
    d.ctx_set_current(static_cast<CUcontext>(previous_context_));
}

// The failure of a DeviceScope to make `device` current, named as the call that failed.
static rmsnorm_status_t scope_fail(const DeviceScope& scope, int device) {
  return cuda_fail(static_cast<cudaError_t>(scope.status()), ("cudaSetDevice(" + std::to_string(device) + ")").c_str());
}

bool available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // no driver / no device is not an error of the caller's
    return false;
  }
  return n > 0;
}

rmsnorm_status_t resolve_device(int32_t requested, int* device) {
  int n = 0;
  RMSNORM_CUDA_TRY(cudaGetDeviceCount(&n));
  if (requested < 0) {
    RMSNORM_CUDA_TRY(cudaGetDevice(device));
    return RMSNORM_STATUS_SUCCESS;
  }
  if (requested >= n)
    return fail(RMSNORM_STATUS_BACKEND_UNAVAILABLE, "backend.device",
                "device " + std::to_string(requested) + " does not exist (" + std::to_string(n) + " present)");
  *device = requested;
  return RMSNORM_STATUS_SUCCESS;
}

MemorySpace memory_space(const void* p, int* owner, const char** why) {
  cudaPointerAttributes attr;
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *why = cudaGetErrorName(e);
    return MemorySpace::kUnknown;
  }
  // Managed and registered host memory are reachable from both sides.
  *owner = attr.device;
  if (attr.type == cudaMemoryTypeDevice) return MemorySpace::kDevice;
  if (attr.type == cudaMemoryTypeUnregistered) return MemorySpace::kHost;
  return MemorySpace::kBoth;
}

cudaError_t allow_dynamic_smem(const void* kernel, size_t bytes) {
  int device = 0;
  const cudaError_t ed = cudaGetDevice(&device);
  if (ed != cudaSuccess) return ed;
  // The launch itself runs outside the lock: one that blocks (a full launch
  // queue) holds up no other thread.
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> largest;
  std::lock_guard<std::mutex> lock(mutex);
  try {
    size_t& limit = largest[{device, kernel}];
    const size_t value = limit > bytes ? limit : bytes;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(value));
    if (e == cudaSuccess) limit = value;
    return e;
  } catch (const std::bad_alloc&) {
    return cudaErrorMemoryAllocation;
  }
}

namespace {

// Errors that say a capability query could not run at all (no usable
// context, a sticky error left by an earlier fault, no memory, the MPS server
// gone) rather than answer it. They are an error of the call, and nothing is
// cached: caching "no clusters, no PDL" after a transient failure would change
// the plan, and so every reduction order, for the rest of the process.
bool query_could_not_run(cudaError_t e) {
  switch (e) {
    case cudaErrorDeviceUninitialized:
    case cudaErrorMpsConnectionFailed:
    case cudaErrorMpsRpcFailure:
    case cudaErrorMpsServerNotReady:
    case cudaErrorMpsMaxClientsReached:
    case cudaErrorMpsMaxConnectionsReached:
    case cudaErrorMpsClientTerminated:
    case cudaErrorTimeout:
    case cudaErrorExternalDevice:
    case cudaErrorMemoryAllocation:
    case cudaErrorInitializationError:
    case cudaErrorCudartUnloading:
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorSystemNotReady:
    case cudaErrorNotPermitted:
    case cudaErrorOperatingSystem:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// A capability query's failure: the error itself when the query could not
// run, else cudaSuccess (the caller takes "cannot" as the answer). A failure
// the list does not name (cudaErrorUnknown, say) is an answer only while a
// query that any working context answers still succeeds: the attributes of
// one of the library's own kernels.
cudaError_t answer_or_error(cudaError_t e) {
  if (e == cudaSuccess) return cudaSuccess;
  cudaGetLastError();
  if (query_could_not_run(e)) return e;
  cudaFuncAttributes fattr;
  const cudaError_t probe = cudaFuncGetAttributes(&fattr, finalize_kernel_handle());
  if (probe == cudaSuccess) return cudaSuccess;
  cudaGetLastError();
  return query_could_not_run(probe) || probe == cudaErrorUnknown ? e : cudaSuccess;
}

// Whether the library's kernels were compiled for compute_90 or later (a
// build for older targets runs on Hopper through PTX with the sm_90 paths
// compiled out).
cudaError_t kernels_have_sm90_code(bool* out) {
  cudaFuncAttributes fattr;
  const cudaError_t e = cudaFuncGetAttributes(&fattr, finalize_kernel_handle());
  *out = e == cudaSuccess && fattr.ptxVersion >= 90;
  return answer_or_error(e);
}

// Clusters of `cs` CTAs of `kernel` (`threads` threads, `smem` bytes of
// dynamic shared memory) the current device runs at once
// (cudaOccupancyMaxActiveClusters); 0 when the device cannot run them.
cudaError_t active_clusters(const void* kernel, int cs, size_t smem, int* clusters, int threads = plan::kClusterTpr) {
  *clusters = 0;
  if (cs > plan::kMaxPortableCluster) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return answer_or_error(e);
  }
  if (smem > kDefaultDynamicSmem) {
    const cudaError_t e = allow_dynamic_smem(kernel, smem);
    if (e != cudaSuccess) return answer_or_error(e);
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cs);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(cs));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
  if (e != cudaSuccess) return answer_or_error(e);
  *clusters = n;
  return cudaSuccess;
}

// Largest cluster of cluster-band CTAs the current device can run: 1 when
// the kernels were not compiled for compute_90+, else 8, or 16 where
// non-portable clusters fit. Asked of the backward kernel, the heavier of the
// two cluster kernels (one CTA per SM): what fits for it fits for the forward.
cudaError_t query_max_cluster(int* out) {
  *out = 1;
  const void* kernel = backward_cluster_kernel_handle();
  // Clusters need the kernels compiled for compute_90 or later: a build for
  // older targets runs on Hopper through its PTX with the cluster code
  // compiled out (__CUDA_ARCH__ < 900), so the plan must not use clusters.
  cudaFuncAttributes fattr;
  const cudaError_t e = cudaFuncGetAttributes(&fattr, kernel);
  if (e != cudaSuccess) return answer_or_error(e);
  if (fattr.ptxVersion < 90) return cudaSuccess;
  int n = 0;
  const cudaError_t ec = active_clusters(kernel, plan::kMaxCluster, 0, &n);
  if (ec != cudaSuccess) return ec;
  *out = n > 0 ? plan::kMaxCluster : plan::kMaxPortableCluster;
  return cudaSuccess;
}

std::atomic<size_t> g_smem_limit_per_sm{0};
std::atomic<size_t> g_smem_limit_per_block{0};

// testing::limit_shared_memory applied to a device's properties.
void apply_smem_limit(plan::Device* d) {
  const size_t sm = g_smem_limit_per_sm.load(), block = g_smem_limit_per_block.load();
  if (sm > 0 && sm < d->smem_per_sm) d->smem_per_sm = sm;
  if (block > 0 && block < d->max_smem_optin) d->max_smem_optin = block;
}
}  // namespace

namespace testing {
void limit_shared_memory(size_t per_sm, size_t per_block) {
  g_smem_limit_per_sm.store(per_sm);
  g_smem_limit_per_block.store(per_block);
}
}  // namespace testing

// Properties are read once per device: the plan (and so every reduction
// order) must not change between calls on the same device (testing::
// limit_shared_memory aside, which only tests set). A failed query
// is an error of the call, never replaced by defaults: the workspace size
// and the launch must come from the same plan.
rmsnorm_status_t device_properties(int device, plan::Device* out) {
  static std::mutex mutex;
  static std::map<int, plan::Device> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(device);
  if (it != cache.end()) {
    *out = it->second;
    apply_smem_limit(out);
    return RMSNORM_STATUS_SUCCESS;
  }
  plan::Device d;
  int smem = 0;
  RMSNORM_CUDA_TRY(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
  RMSNORM_CUDA_TRY(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  // The plans assume sm_80's shared memory (>= 100 KiB per SM): on sm_75 (64 KiB) one stage of the rows band's
  // backward does not fit, and its launch would fail on cudaFuncSetAttribute at some D only. Refused here, by name.
  if (d.cc_major < 8) {
    int minor = 0;
    RMSNORM_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return fail(RMSNORM_STATUS_BACKEND_UNAVAILABLE, "backend.device",
                "device " + std::to_string(device) + " has compute capability " + std::to_string(d.cc_major) + "." +
                    std::to_string(minor) + "; the CUDA backend needs 8.0 (sm_80) or newer");
  }
  RMSNORM_CUDA_TRY(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  d.max_smem_optin = static_cast<size_t>(smem);
  RMSNORM_CUDA_TRY(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  d.smem_per_sm = static_cast<size_t>(smem);
  d.max_cluster = 1;
  if (d.cc_major >= 9) {
    // backward_workspace_bytes reaches here without run_on_device's scope.
    const DeviceScope scope(device);
    if (scope.status() != 0) return scope_fail(scope, device);
    RMSNORM_CUDA_TRY(kernels_have_sm90_code(&d.sm90_code));
    RMSNORM_CUDA_TRY(query_max_cluster(&d.max_cluster));
    // Co-scheduled clusters per size, with the shared memory the plan gives
    // the cluster kernels on this device.
    for (int cs = 2; cs <= d.max_cluster; cs *= 2) {
      const int k = plan::cluster_index(cs);
      const int64_t cols = int64_t{cs} * plan::kClusterTpr * plan::kMaxChunksPerThread * 8;  // a 16-bit row of that band
      RMSNORM_CUDA_TRY(active_clusters(forward_cluster_kernel_handle(), cs,
                                       plan::forward_launch(1, cols, 2, plan::Io::kVector, d).smem,
                                       &d.forward_active_clusters[k]));
      RMSNORM_CUDA_TRY(active_clusters(backward_cluster_kernel_handle(), cs,
                                       plan::backward_launch(2, cols, 2, plan::Io::kVector, true, d).smem,
                                       &d.backward_active_clusters[k]));
    }
    // A size the device does not co-schedule (0 clusters: a partition with few SMs per GPC, say) is never
    // planned, nor any larger one: their rows take the looped band, where a launch of that size would fail.
    int usable = 1;
    for (int cs = 2; cs <= d.max_cluster; cs *= 2) {
      const int k = plan::cluster_index(cs);
      if (d.forward_active_clusters[k] <= 0 || d.backward_active_clusters[k] <= 0) break;
      usable = cs;
    }
    d.max_cluster = usable;
    if (d.max_cluster >= plan::kLoopedShares)
      for (int passes : {2, plan::kF32ClusterMaxPasses}) {
        int& n = d.f32_backward_active_clusters[plan::f32_cluster_backward_index(passes)];
        RMSNORM_CUDA_TRY(active_clusters(f32_cluster_backward_kernel_handle(passes), plan::kLoopedShares, 0, &n,
                                         plan::kLoopedShareThreads));
        // The forward's cluster kernel holds fewer registers than the backward's: where these run, it does.
        if (n <= 0) d.f32_clusters = false;
      }
  }
  cache[device] = d;
  *out = d;
  apply_smem_limit(out);
  return RMSNORM_STATUS_SUCCESS;
}

static rmsnorm_status_t check_device(int device, plan::Device* dev) { return device_properties(device, dev); }

rmsnorm_status_t backward_workspace_bytes(int64_t rows, int64_t cols, DType dtype, GwMode mode, BackwardForm form,
                                          int device,
                                          size_t* bytes) {
  plan::Device dev;
  const rmsnorm_status_t st = check_device(device, &dev);
  if (st != RMSNORM_STATUS_SUCCESS) return st;
  const int esize = static_cast<int>(dtype_size(dtype));
  // The workspace does not depend on the I/O path (plan::backward_launch).
  const bool with_gw = mode != GwMode::kNone;
  const plan::Io io = plan::Io::kVector;
  *bytes = (form == BackwardForm::kMixed       ? plan::mixed_backward_launch(rows, cols, esize, io, with_gw, dev)
            : form == BackwardForm::kWeightF32 ? plan::weight_f32_backward_launch(rows, cols, esize, io, with_gw, dev)
                                               : plan::backward_launch(rows, cols, esize, io, with_gw, dev))
               .workspace;
  return RMSNORM_STATUS_SUCCESS;
}

namespace {

// The entry points' common part: makes `device` current for the call
// (restored after), checks it, and calls launch(T{}, properties) with the
// element type of dtype.
template <typename Launch>
rmsnorm_status_t run_on_device(DType dtype, int device, Launch&& launch) {
  const DeviceScope scope(device);
  if (scope.status() != 0) return scope_fail(scope, device);
  plan::Device dev;
  const rmsnorm_status_t st = check_device(device, &dev);
  if (st != RMSNORM_STATUS_SUCCESS) return st;
  return dispatch_dtype(dtype, [&](auto tag) { return launch(tag, dev); });
}

}  // namespace

rmsnorm_status_t forward(const ForwardArgs& a, int device, void* stream) {
  return run_on_device(a.dtype, device, [&](auto tag, const plan::Device& dev) {
    return launch_forward<decltype(tag)>(a, dev, static_cast<cudaStream_t>(stream));
  });
}

rmsnorm_status_t forward_quant(const ForwardArgs& a, const QuantArgs& qa, int device, void* stream) {
  return run_on_device(a.dtype, device, [&](auto tag, const plan::Device& dev) {
    return launch_forward_quant<decltype(tag)>(a, qa, dev, static_cast<cudaStream_t>(stream));
  });
}

rmsnorm_status_t backward(const BackwardArgs& a, int device, void* stream) {
  return run_on_device(a.dtype, device, [&](auto tag, const plan::Device& dev) {
    return launch_backward<decltype(tag)>(a, dev, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace rmsnorm::cuda
