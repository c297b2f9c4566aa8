// Quantized output of the forward (rmsnorm_forward_quant) on the device: a
// row's max|y|, its scale, and a chunk of y to fp8 e4m3 or int8 bytes. The
// rules are src/common/quant.hpp's; the fp8 conversion here is the
// hardware's (cvt.rn.satfinite.e4m3x2.f32 on sm_89 and later), after
// fminf(v, 448), which maps NaN to 448 as the encoder's clamp does, so that it
// gives the encoder's bits (Cuda.ForwardQuant compares every q with the host
// rule).
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "common/quant.hpp"
#include "cuda/element.cuh"

namespace rmsnorm::cuda {

// Where q goes and how it is scaled (ForwardParams::quant); q null: no quantized output.
struct QuantParams {
  uint8_t* q = nullptr;
  int64_t q_stride = 0;
  const float* scale = nullptr;     // static: the scale
  float* row_scales = nullptr;      // per row: written
  const float* scale_ub = nullptr;  // per row, fp8: bound on max|y|, or null
  bool fp8 = true;
  bool per_row = false;   // per row or (block_shift > 0) per block: scale_ub read, scales written
  bool q_vector = false;  // every q row aligned to a chunk's kN bytes (plan::q_rows_aligned)
  // Block scales (block_shift > 0): a block is 1 << block_shift chunks (block_cols / kN: 8 to 32); the scale
  // of block b of row r goes to row_scales[r * scales_row_stride + b * scales_block_stride].
  int block_shift = 0;
  int64_t scales_row_stride = 0;
  int64_t scales_block_stride = 0;
};

// The quantized rows kernel's kind (forward_rows_direct_kernel<..., kQ>).
// The block kinds have their own instantiations, so that the per-row and static kernels keep their registers.
enum class QuantKind { kNone, kFp8PerRow, kFp8Static, kInt8PerRow, kInt8Static, kFp8PerBlock, kInt8PerBlock };
__host__ __device__ constexpr bool quant_fp8(QuantKind k) {
  return k == QuantKind::kFp8PerRow || k == QuantKind::kFp8Static || k == QuantKind::kFp8PerBlock;
}
__host__ __device__ constexpr bool quant_per_row(QuantKind k) { return k == QuantKind::kFp8PerRow || k == QuantKind::kInt8PerRow; }
__host__ __device__ constexpr bool quant_per_block(QuantKind k) {
  return k == QuantKind::kFp8PerBlock || k == QuantKind::kInt8PerBlock;
}
template <typename Fn>
auto dispatch_quant_kind(bool fp8, bool per_row, bool per_block, Fn&& fn) {
  using K = QuantKind;
  if (per_block)
    return fp8 ? fn(std::integral_constant<K, K::kFp8PerBlock>{}) : fn(std::integral_constant<K, K::kInt8PerBlock>{});
  if (fp8)
    return per_row ? fn(std::integral_constant<K, K::kFp8PerRow>{}) : fn(std::integral_constant<K, K::kFp8Static>{});
  return per_row ? fn(std::integral_constant<K, K::kInt8PerRow>{}) : fn(std::integral_constant<K, K::kInt8Static>{});
}

// A running max for row_sum (max|y| over a row): fmaxf, so NaN is ignored and
// the order does not change the result.
struct AbsMax {
  float v;
};
__device__ __forceinline__ AbsMax add(AbsMax a, AbsMax b) { return {fmaxf(a.v, b.v)}; }
__device__ __forceinline__ AbsMax shfl_xor(AbsMax a, int off) { return {__shfl_xor_sync(0xffffffffu, a.v, off)}; }

// max(m, |y_j|) over the first n elements of a chunk.
template <typename T>
__device__ __forceinline__ float chunk_absmax(float m, const Chunk<T>& y, int n) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j)
    if (j < n) m = fmaxf(m, fabsf(y.get(j)));
  return m;
}

// max|y| of 16-bit chunks on packed pairs: the largest and the smallest y of
// each half, two elements per instruction (three-operand max and min), and
// max|y| = max(|largest|, |smallest|) folded to fp32 once. Every 16-bit value
// converts to fp32 exactly and in order, so this is chunk_absmax's value; NaN
// is ignored as fmaxf ignores it (the packed max and min return the other
// operand; both start at +0, which no |y| is below, and are never NaN).
// Whole chunks only: a partial chunk's elements past the row are not y.
// chunk_absmax's form costs two instructions per element (an unpack and a
// max) in one dependent chain; this costs half of one.
template <typename T>
struct PackedRange {
  static_assert(sizeof(T) == 2, "16-bit pairs");
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  T2 hi = zero();
  T2 lo = zero();
  __device__ __forceinline__ static T2 zero() {
    const uint32_t bits = 0u;  // +0 in both halves
    T2 z;
    memcpy(&z, &bits, 4);
    return z;
  }
  __device__ __forceinline__ void add(const Chunk<T>& y) {
    T2 v[4];
    memcpy(v, y.w, sizeof v);
    hi = __hmax2(__hmax2(hi, v[0]), v[1]);
    lo = __hmin2(__hmin2(lo, v[0]), v[1]);
    hi = __hmax2(__hmax2(hi, v[2]), v[3]);
    lo = __hmin2(__hmin2(lo, v[2]), v[3]);
  }
  // max(m, max|y|) over what was added.
  __device__ __forceinline__ float abs_max(float m) const {
    const T2 a = __hmax2(__habs2(hi), __habs2(lo));
    return fmaxf(m, fmaxf(__low2float(a), __high2float(a)));
  }
};

// How a row's y become the values that are rounded: v = y / s (fp8 per row,
// as vLLM divides; quant::quotient_by_inverse from s and mul = 1 / s) or
// v = y * mul (mul = 1 / scale: static, and int8 per row).
struct QuantRow {
  float s = 1.0f;
  float mul = 1.0f;
  bool finite = false;  // divided kinds: every y / s of the row finite (quant::quotients_finite)
};

// The scalars a kernel reads once: the static rule (1 / scale), or scale_ub.
// The rows kernel reads them after its first row group's x loads are issued
// (read before them, the scale's round trip came first and the x loads waited
// for it) and before that row's reduction needs them; the looped kernel right
// after pdl_enter().
struct QuantConsts {
  QuantRow fixed;  // static: the rule of every row
  float ub = 0.0f;
  bool has_ub = false;
};
__device__ __forceinline__ QuantConsts load_quant_consts(const QuantParams& q) {
  QuantConsts k;
  if (!q.per_row) {
    k.fixed.mul = 1.0f / *q.scale;
  } else if (q.scale_ub != nullptr) {
    k.ub = *q.scale_ub;
    k.has_ub = true;
  }
  return k;
}

// A row's rule from its max|y| (per row): quant::row_scale's rule, the bound
// applied here (row_scale's pointer to a local put it on the stack).
__device__ __forceinline__ QuantRow per_row_quant(const QuantParams& q, const QuantConsts& k, float absmax) {
  QuantRow r;
  r.s = quant::bounded_row_scale(k.has_ub ? fminf(absmax, k.ub) : absmax, q.fp8);
  r.mul = 1.0f / r.s;
  r.finite = quant::quotients_finite(absmax, r.mul);
  return r;
}

// The kN bytes of a chunk of y, packed little-endian into words (element j in
// byte j).
template <typename T>
struct QuantBytes {
  static constexpr int kN = Chunk<T>::kN;
  uint32_t w[kN / 4];
};

// int8 code of v in the low byte (the rest is its sign extension): the
// conversion rounds to nearest even, clamps to [-128, 127] and gives 0 for NaN,
// which is quant::int8_saturated's rule in one instruction (its selects and
// clamps took five).
__device__ __forceinline__ uint32_t int8_code(float v) {
  int32_t c;
  asm("cvt.rni.s8.f32 %0, %1;" : "=r"(c) : "f"(v));
  return static_cast<uint32_t>(c);
}

// Whether kQ's v is y / s (fp8 with per-row or block scales: vLLM divides there) rather than y * mul.
__host__ __device__ constexpr bool quant_divides(QuantKind k) {
  return quant_fp8(k) && (quant_per_row(k) || quant_per_block(k));
}

// kQ: e4m3 or int8; v = y / s for the dividing kinds, else v = y * mul.
// kFinite: the row's quotients are finite (QuantRow::finite), so the
// correction alone gives y / s (quant::corrected_quotient). fp8: fminf maps
// NaN and +inf to 448; the conversion's satfinite takes everything below -448
// (-inf included) to -448 and rounds to nearest even.
template <QuantKind kQ, bool kFinite, typename T>
__device__ __forceinline__ QuantBytes<T> quantize_chunk_as(const Chunk<T>& y, const QuantRow& r) {
  static_assert(kQ != QuantKind::kNone, "a quantized kind");
  constexpr int kN = Chunk<T>::kN;
  static_assert(kN % 4 == 0, "whole words of q bytes");
  float v[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const float yv = y.get(j);
    if constexpr (!quant_divides(kQ))
      v[j] = yv * r.mul;
    else if constexpr (kFinite)
      v[j] = quant::corrected_quotient(yv, r.s, r.mul);
    else
      v[j] = quant::quotient_by_inverse(yv, r.s, r.mul);
  }
  QuantBytes<T> b;
#pragma unroll
  for (int k = 0; k < kN / 4; ++k) {
    const float* u = v + 4 * k;
    if constexpr (quant_fp8(kQ)) {
      uint32_t pair[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 c = make_float2(fminf(u[2 * h], quant::kFp8Max), fminf(u[2 * h + 1], quant::kFp8Max));
        pair[h] = static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(c, __NV_SATFINITE, __NV_E4M3));
      }
      b.w[k] = pair[0] | (pair[1] << 16);
    } else {
      // Bytes 0 of four codes into one word (byte j = element j), as two byte permutes of pairs and one of those.
      const uint32_t lo = __byte_perm(int8_code(u[0]), int8_code(u[1]), 0x0040);
      const uint32_t hi = __byte_perm(int8_code(u[2]), int8_code(u[3]), 0x0040);
      b.w[k] = __byte_perm(lo, hi, 0x5410);
    }
  }
  return b;
}

// A chunk's q bytes under its row's rule: the correction-only form where the row's quotients are finite (a
// branch that is uniform across the row), the guarded one otherwise.
template <QuantKind kQ, typename T>
__device__ __forceinline__ QuantBytes<T> quantize_chunk(const Chunk<T>& y, const QuantRow& r) {
  if constexpr (quant_divides(kQ)) {
    if (r.finite) return quantize_chunk_as<kQ, true>(y, r);
  }
  return quantize_chunk_as<kQ, false>(y, r);
}
// Stores the bytes of chunk `chunk` of a q row: the first n (elements past
// the row's end are not written). vec: q's rows are aligned to kN bytes, so
// a whole chunk is one kN-byte store.
template <typename T>
__device__ __forceinline__ void store_q_chunk(uint8_t* __restrict__ qrow, int chunk, int n, bool vec,
                                              const QuantBytes<T>& b) {
  constexpr int kN = Chunk<T>::kN;
  uint8_t* dst = qrow + static_cast<int64_t>(chunk) * kN;
  if (vec && n == kN) {
    if constexpr (kN == 8)
      *reinterpret_cast<uint2*>(dst) = make_uint2(b.w[0], b.w[1]);
    else
      *reinterpret_cast<uint32_t*>(dst) = b.w[0];
    return;
  }
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (j < n) dst[j] = static_cast<uint8_t>(b.w[j / 4] >> (8 * (j % 4)));
}

// max|y| of a block of `lanes` consecutive lanes (a power of two <= 32, the
// group aligned to it within the warp), each lane's own value in m: every
// lane of the warp must take part.
__device__ __forceinline__ float block_absmax(float m, int lanes) {
  for (int off = 1; off < lanes; off <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}

// The max|y| of every block a warp holds at kCpt chunk indices, reduced together. A block is `lanes` consecutive
// lanes (a power of two, 8 to 32, the group aligned to it within the warp) at one chunk index, each lane's own
// value of chunk index it in m[it]. Reduced one index at a time, every lane would repeat its block's shuffles and
// then its scale (a division, a reciprocal and their range checks) kCpt times. Here the first log2(kCpt) steps
// halve what a lane holds: a lane keeps one half of its values and sends its partner the other half, so one shuffle
// serves two values; the remaining steps are the plain butterfly. Afterwards each lane holds one block's max, that
// of chunk index `it` (block_rule_lane gives the lane that holds a given index), and computes one scale. max is
// exact and ignores order, so the values are those of reducing each index alone. Every lane of the warp takes part.
template <int kCpt>
struct BlockMax {
  static_assert(kCpt == 1 || kCpt == 2 || kCpt == 4, "a power of two chunk indices");
  float value;
  int it;  // the chunk index value belongs to
};
template <int kCpt>
__device__ __forceinline__ BlockMax<kCpt> block_absmax_all(const float (&m)[kCpt], int lanes) {
  float v[kCpt];
#pragma unroll
  for (int i = 0; i < kCpt; ++i) v[i] = m[i];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  int it = 0;
#pragma unroll
  for (int n = kCpt, off = lanes >> 1; n > 1; n >>= 1, off >>= 1) {
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int k = 0; k < n / 2; ++k) {
      const float keep = upper ? v[k + n / 2] : v[k];
      const float send = upper ? v[k] : v[k + n / 2];
      v[k] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, off));
    }
    if (upper) it += n / 2;
  }
  // The lanes / kCpt lanes that now hold partial maxes of one block: the plain butterfly over them.
  return {block_absmax(v[0], lanes / kCpt), it};
}
// The lane of this lane's block group that holds chunk index it's block max after block_absmax_all.
template <int kCpt>
__device__ __forceinline__ int block_rule_lane(int it, int lanes) {
  return (static_cast<int>(threadIdx.x) & 31 & ~(lanes - 1)) | (it * (lanes / kCpt));
}

}  // namespace rmsnorm::cuda
