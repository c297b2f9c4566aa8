// Entry points of the CUDA backend, called by api.cpp after validation.
// Nothing here allocates; every CUDA error becomes a status plus a message.
#pragma once

#include <cstddef>
#include <cstdint>

#include "args.hpp"

namespace rmsnorm::cuda {

// A CUDA device is present and the runtime works.
bool available();

// Resolves backend.device (-1 = current) to an ordinal; BACKEND_UNAVAILABLE
// when there is no such device.
rmsnorm_status_t resolve_device(int32_t requested, int* device);

// Makes `device` current until destroyed, then gives the thread back its
// device and context (device.cu says how a thread without a context is left).
// Nothing happens where `device` is current already.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  int status() const { return status_; }  // cudaError_t of making `device` current

 private:
  int previous_ = -1;
  void* previous_context_ = nullptr;  // CUcontext
  bool switched_ = false;
  int status_ = 0;
};

// Where a pointer lives, as far as the CUDA runtime can tell: pageable host
// memory, device-only memory (of device *owner), or memory both sides reach
// (managed, pinned); kUnknown when cudaPointerGetAttributes fails (no driver,
// or a sticky error from an earlier fault), *why naming the error.
enum class MemorySpace { kHost, kDevice, kBoth, kUnknown };
MemorySpace memory_space(const void* p, int* owner, const char** why);

// Workspace bytes of the fused backward on `device` (0 for GwMode::kNone).
// Which launch the backward makes (launch_backward):
enum class BackwardForm {
  kPlain,      // every operand in x's dtype: plan::backward_launch
  kWeightF32,  // only the weight differs (RMSNORM_FLAG_WEIGHT_F32): plan::weight_f32_backward_launch
  kMixed,      // gy of another dtype (RMSNORM_FLAG_Y_DTYPE, RMSNORM_FLAG_RESIDUAL_F32): the looped band's launch
};
inline BackwardForm backward_form(DType x, DType weight, DType gy) {
  if (gy != x) return BackwardForm::kMixed;
  if (weight == x) return BackwardForm::kPlain;
  return x != DType::kF32 && weight == DType::kF32 ? BackwardForm::kWeightF32 : BackwardForm::kMixed;
}
rmsnorm_status_t backward_workspace_bytes(int64_t rows, int64_t cols, DType dtype, GwMode mode, BackwardForm form,
                                          int device,
                                          size_t* bytes);

rmsnorm_status_t forward(const ForwardArgs& a, int device, void* stream);
rmsnorm_status_t forward_quant(const ForwardArgs& a, const QuantArgs& qa, int device, void* stream);
rmsnorm_status_t backward(const BackwardArgs& a, int device, void* stream);

namespace testing {
// For tests only: later calls plan as if every device had at most `per_sm`
// bytes of shared memory per SM and `per_block` per CTA (0: the device's
// own), e.g. an sm_86 / sm_89 part's 100 KiB, where the cp.async pipelines
// get one stage. The kernels and their launch checks are the real ones.
// Set it only while no other thread calls the library; the workspace query
// and the call it sizes must see the same limit.
void limit_shared_memory(size_t per_sm, size_t per_block);
}  // namespace testing

}  // namespace rmsnorm::cuda
