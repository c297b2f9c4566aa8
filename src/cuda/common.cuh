// Device building blocks shared by the forward and backward kernels:
// element types, 16-byte chunks, row reductions, gw output.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "args.hpp"
#include "error.hpp"
#include "plan.hpp"

namespace rmsnorm::cuda {

template <typename T>
struct TypeOf;
template <>
struct TypeOf<float> {
  static constexpr DType kDType = DType::kF32;
};
template <>
struct TypeOf<__half> {
  static constexpr DType kDType = DType::kF16;
};
template <>
struct TypeOf<__nv_bfloat16> {
  static constexpr DType kDType = DType::kBF16;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// One chunk: 16 bytes of T. Moved to and from memory as one uint4 (see
// load_chunk), never by copying the struct.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = plan::kChunkBytes / static_cast<int>(sizeof(T));
  T v[kN];
};

// In-row indices are 32-bit (api.cpp limits cols to plan::kMaxCols); row
// offsets are 64-bit. Loads chunk `chunk` of a row; elements past `cols` read as 0 (they add
// nothing to any sum). vector_io: every row start is 16-byte aligned, so a
// full chunk is one 16-byte load; otherwise element loads (any alignment).
template <typename T>
__device__ __forceinline__ Pack<T> load_chunk(const T* __restrict__ row, int chunk, int cols, bool vector_io) {
  constexpr int kN = Pack<T>::kN;
  const int base = chunk * kN;
  Pack<T> p;
  if (vector_io && base + kN <= cols) {
    // Through uint4: copying Pack<T> itself copies __half / __nv_bfloat16
    // members one by one (they are not trivially copyable), which compiles
    // to eight 2-byte loads instead of one 16-byte load.
    const uint4 u = *reinterpret_cast<const uint4*>(row + base);
    memcpy(&p, &u, sizeof(u));
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) p.v[j] = base + j < cols ? row[base + j] : from_float<T>(0.0f);
  }
  return p;
}

// A second read of a chunk this thread loaded moments ago (an L2 hit). The
// volatile asm keeps the compiler from merging it with the first load and
// holding the value in registers across the row reduction, which is what
// would otherwise spill at 1024 threads per CTA.
template <typename T>
__device__ __forceinline__ Pack<T> reload_chunk(const T* __restrict__ row, int chunk, int cols, bool vector_io) {
  constexpr int kN = Pack<T>::kN;
  const int base = chunk * kN;
  if (vector_io && base + kN <= cols) {
    uint4 u;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(row + base));
    Pack<T> p;
    static_assert(sizeof(p) == sizeof(u), "chunk is 16 bytes");
    memcpy(&p, &u, sizeof(u));
    return p;
  }
  return load_chunk(row, chunk, cols, vector_io);
}

template <typename T>
__device__ __forceinline__ void store_chunk(T* __restrict__ row, int chunk, int cols, bool vector_io,
                                            const Pack<T>& p) {
  constexpr int kN = Pack<T>::kN;
  const int base = chunk * kN;
  if (vector_io && base + kN <= cols) {
    uint4 u;
    memcpy(&u, &p, sizeof(u));
    *reinterpret_cast<uint4*>(row + base) = u;
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j)
      if (base + j < cols) row[base + j] = p.v[j];
  }
}

// w' for element j of a chunk: w, 1 + w (added in fp32), or 1 without weight.
template <typename T>
__device__ __forceinline__ float weight_of(const Pack<T>& w, int j, bool has_weight, float offset) {
  return has_weight ? to_float(w.v[j]) + offset : 1.0f;
}

__device__ __forceinline__ float2 add2(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }

// Sum over the kGroup (power of two <= 32) aligned lanes that own one row.
// An xor butterfly rather than cub::WarpReduce: every lane needs the total
// (no broadcast step), and the order is fixed, so every lane holds the same
// bits. All 32 lanes of the warp execute it (rows past the end contribute 0),
// so the full mask is always right.
template <int kGroup>
__device__ __forceinline__ float2 group_sum(float2 v) {
  static_assert(kGroup >= 1 && kGroup <= 32 && (kGroup & (kGroup - 1)) == 0, "group must be a power of two <= 32");
#pragma unroll
  for (int off = 1; off < kGroup; off <<= 1) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, off);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, off);
  }
  return v;
}

// Sum over the kTpr threads of each row slot of a CTA of kBlock threads.
// tpr <= 32: lanes only. tpr > 32: each warp's sum goes to
// scratch[plan::scratch_index(slot, warp)], then every thread of the slot
// adds its slot's warp sums in warp order. The trailing barrier keeps the
// next call from overwriting scratch while a slow warp still reads it (the
// write-after-read race of persistent kernels that reuse scratch per row).
// Every thread of the CTA must call it (uniform control flow).
template <int kTpr, int kBlock>
__device__ __forceinline__ float2 row_sum(float2 v, float2* scratch) {
  static_assert(kTpr <= 32 ? 32 % kTpr == 0 : kTpr % 32 == 0, "threads per row must tile warps");
  static_assert(kBlock % kTpr == 0, "a CTA holds whole rows");
  constexpr int kLanes = kTpr < 32 ? kTpr : 32;
  v = group_sum<kLanes>(v);
  if constexpr (kTpr > 32) {
    constexpr int kWarps = plan::warps_per_row(kTpr);
    const int slot = plan::row_slot(threadIdx.x, kTpr);
    const int warp_in_row = (threadIdx.x % kTpr) / 32;
    if (threadIdx.x % 32 == 0) scratch[plan::scratch_index(slot, warp_in_row, kTpr)] = v;
    __syncthreads();
    float2 total = scratch[plan::scratch_index(slot, 0, kTpr)];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total = add2(total, scratch[plan::scratch_index(slot, w, kTpr)]);
    __syncthreads();
    v = total;
  }
  return v;
}

// Where gw goes: a finished value for column `col` is either one partial of
// the workspace or (one partial in all) the user's gw in its mode.
struct GwOut {
  void* gw = nullptr;       // user gw (T or float, per mode)
  int mode = 0;             // GwMode
  float* partials = nullptr;
  bool direct = false;
};

template <typename T>
__device__ __forceinline__ void store_gw_final(const GwOut& o, int64_t col, float v) {
  switch (static_cast<GwMode>(o.mode)) {
    case GwMode::kStore: static_cast<T*>(o.gw)[col] = from_float<T>(v); break;
    case GwMode::kStoreF32: static_cast<float*>(o.gw)[col] = v; break;
    case GwMode::kAccumulate: {
      T* g = static_cast<T*>(o.gw) + col;
      *g = from_float<T>(to_float(*g) + v);
      break;
    }
    case GwMode::kAccumulateF32: static_cast<float*>(o.gw)[col] += v; break;
    case GwMode::kNone: break;
  }
}

template <typename T>
__device__ __forceinline__ void emit_gw(const GwOut& o, int64_t partial, int64_t cols, int64_t col, float v) {
  if (o.direct)
    store_gw_final<T>(o, col, v);
  else
    o.partials[partial * cols + col] = v;
}

// ---- host side ------------------------------------------------------------------------------

inline rmsnorm_status_t cuda_fail(cudaError_t e, const char* what) {
  return fail(RMSNORM_STATUS_CUDA_ERROR, what, std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
}

#define RMSNORM_CUDA_TRY(call)                                              \
  do {                                                                      \
    const cudaError_t rmsnorm_err_ = (call);                                \
    if (rmsnorm_err_ != cudaSuccess) return ::rmsnorm::cuda::cuda_fail(rmsnorm_err_, #call); \
  } while (0)

// After a launch: configuration errors surface here, not at the next call.
#define RMSNORM_CUDA_LAUNCHED(name) RMSNORM_CUDA_TRY(cudaGetLastError())

rmsnorm_status_t device_properties(int device, plan::Device* out);

}  // namespace rmsnorm::cuda
