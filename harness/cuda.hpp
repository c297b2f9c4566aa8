// CUDA pieces of the harness, for the CLI (built with CUDA) and the
// benchmark: checked CUDA calls and an owning device buffer. Header-only and
// compiled only where the CUDA runtime is available, so the CPU-only build
// never sees it.
#pragma once

#if defined(RMSNORM_WITH_CUDA) || defined(__CUDACC__)

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace rmsnorm::harness {

// A failed CUDA call: what was called, where, and the runtime's error.
class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t e, const char* expr, const char* file, int line)
      : std::runtime_error(std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"),
        error(e) {}
  cudaError_t error;
};

inline void cuda_check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess) throw CudaError(e, expr, file, line);
}

// Throws CudaError when the call fails.
#define RMSNORM_HARNESS_CUDA(call) ::rmsnorm::harness::cuda_check((call), #call, __FILE__, __LINE__)

// cudaMalloc'd bytes, freed on destruction; move-only. Throws CudaError when
// the allocation fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e != cudaSuccess) {
      p_ = nullptr;
      throw CudaError(e, ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str(), __FILE__, __LINE__);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);  // nothing useful to do with an error in a destructor
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace rmsnorm::harness

#endif  // RMSNORM_WITH_CUDA || __CUDACC__
