// Element types of the kernels and the 16-byte chunk they move: fp32
// conversions, raw bits, and Chunk<T>.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "args.hpp"
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

// Raw bits of one element, and back.
__device__ __forceinline__ uint32_t bits_of(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t bits_of(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint32_t bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <typename T>
__device__ __forceinline__ T from_bits(uint32_t b);
template <>
__device__ __forceinline__ float from_bits<float>(uint32_t b) {
  return __uint_as_float(b);
}
template <>
__device__ __forceinline__ __half from_bits<__half>(uint32_t b) {
  return __ushort_as_half(static_cast<unsigned short>(b));
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_bits<__nv_bfloat16>(uint32_t b) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(b));
}

// One chunk: 16 bytes of T, kept as four 32-bit words (two 16-bit elements
// per word) and converted element by element where used. Held as words, a
// 16-bit chunk takes 4 registers; as an array of __nv_bfloat16 the compiler
// unpacked each element into its own register, doubling the footprint of
// the prefetched rows (the backward spilled).
template <typename T>
struct alignas(16) Chunk {
  static constexpr int kN = plan::kChunkBytes / static_cast<int>(sizeof(T));
  static constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));  // 1 or 2
  uint32_t w[4];

  // Element j (a compile-time index after unrolling) as fp32.
  __device__ __forceinline__ float get(int j) const {
    const uint32_t word = w[j / kPerWord];
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(word);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float(j % 2 == 0 ? word << 16 : word & 0xffff0000u);
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(j % 2 == 0 ? word : word >> 16)));
    }
  }
  // Elements j and j + 1 (j even) from fp32, rounded to nearest even.
  __device__ __forceinline__ void set2(int j, float a, float b) {
    if constexpr (sizeof(T) == 4) {
      w[j] = __float_as_uint(a);
      w[j + 1] = __float_as_uint(b);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
      memcpy(&w[j / 2], &v, 4);
    } else {
      const __half2 v = __floats2half2_rn(a, b);
      memcpy(&w[j / 2], &v, 4);
    }
  }
  __device__ __forceinline__ T elem(int j) const {
    return from_bits<T>(sizeof(T) == 4 ? w[j] : (w[j / 2] >> (16 * (j % 2))) & 0xffffu);
  }
  __device__ __forceinline__ void set_elem(int j, T v) {
    if constexpr (sizeof(T) == 4) {
      w[j] = bits_of(v);
    } else {
      const int sh = 16 * (j % 2);
      w[j / 2] = (w[j / 2] & ~(0xffffu << sh)) | (bits_of(v) << sh);
    }
  }
};

// A chunk from the 16 bytes of a uint4 (a shared-memory stage entry).
template <typename T>
__device__ __forceinline__ Chunk<T> as_chunk(const uint4& u) {
  Chunk<T> p;
  p.w[0] = u.x;
  p.w[1] = u.y;
  p.w[2] = u.z;
  p.w[3] = u.w;
  return p;
}

// A chunk of zeros, and one of ones (T(1) in every element).
template <typename T>
__device__ __forceinline__ Chunk<T> zero_chunk() {
  return as_chunk<T>(make_uint4(0u, 0u, 0u, 0u));
}
template <typename T>
__device__ __forceinline__ Chunk<T> one_chunk() {
  constexpr uint32_t kWord = sizeof(T) == 4 ? 0x3f800000u : std::is_same_v<T, __nv_bfloat16> ? 0x3f803f80u : 0x3c003c00u;
  return as_chunk<T>(make_uint4(kWord, kWord, kWord, kWord));
}

}  // namespace rmsnorm::cuda
