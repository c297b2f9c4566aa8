// Loads and stores of one chunk of a row at any alignment: whole 16-byte
// accesses where aligned, two aligned loads and a funnel shift where not,
// element accesses at the row's ends. No access leaves the row's bytes
// (stores never leave the chunk's own).
#pragma once

#include <type_traits>

#include "cuda/element.cuh"

namespace rmsnorm::cuda {

// The 16 bytes that start `offset` (0..15) bytes into two consecutive
// aligned 16-byte blocks lo, hi. The offset's word index picks one of four
// cases of four funnel shifts of fixed words (shift_pair_select below: the
// run-time window, more instructions and registers).
template <typename T>
__device__ __forceinline__ Chunk<T> shift_pair(const uint4& lo, const uint4& hi, int offset) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const unsigned sh = static_cast<unsigned>(offset & 3) * 8;
  Chunk<T> r;
  auto take = [&](auto q) {
    constexpr int kQ = decltype(q)::value;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.w[i] = __funnelshift_r(w[i + kQ], w[i + kQ + 1], sh);
  };
  switch (offset >> 2) {
    case 0: take(std::integral_constant<int, 0>{}); break;
    case 1: take(std::integral_constant<int, 1>{}); break;
    case 2: take(std::integral_constant<int, 2>{}); break;
    default: take(std::integral_constant<int, 3>{}); break;
  }
  return r;
}
template <typename T>
__device__ __forceinline__ Chunk<T> shift_pair(const Chunk<T>& lo, const Chunk<T>& hi, int offset) {
  return shift_pair<T>(make_uint4(lo.w[0], lo.w[1], lo.w[2], lo.w[3]), make_uint4(hi.w[0], hi.w[1], hi.w[2], hi.w[3]),
                       offset);
}

// The same by a run-time word window: select chains over all eight words
// (19 instructions, 17 words live at once). The backward's staged misaligned
// path keeps it: with shift_pair there it ran 2-3% slower (8192 x 4096
// 16-bit, base + 1 element; A/B on the H200, 2026-12-03).
template <typename T>
__device__ __forceinline__ Chunk<T> shift_pair_select(const uint4& lo, const uint4& hi, int offset) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const int k = offset >> 2;
  const unsigned sh = static_cast<unsigned>(offset & 3) * 8;
  uint32_t win[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) win[i] = k == 0 ? w[i] : k == 1 ? w[i + 1] : k == 2 ? w[i + 2] : w[i + 3];
  Chunk<T> r;
#pragma unroll
  for (int i = 0; i < 4; ++i) r.w[i] = __funnelshift_r(win[i], win[i + 1], sh);
  return r;
}

// A full chunk at a misaligned address: the two aligned 16-byte blocks that
// hold it, funnel-shifted into place. The caller guarantees that both blocks
// lie inside the row: not the row's first chunk (the lower block starts
// after the row's first byte) and `avail` bytes from the chunk's start to
// the row's end >= 32 - offset (the upper block ends inside the row).
template <typename T>
__device__ __forceinline__ Chunk<T> load_shifted(const T* p, int offset) {
  const uint4* a = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(p) - offset);
  return shift_pair<T>(a[0], a[1], offset);
}

// Columns [first, first + kN) of a row at any alignment (elements past
// `cols` read as 0): one 16-byte load where the window is aligned, two
// aligned 16-byte loads and a funnel shift where both blocks lie inside the
// row (the lower one starts at or after the row's first byte, the upper one
// ends at or before its last), element loads otherwise.
template <typename T>
__device__ __forceinline__ Chunk<T> load_window(const T* __restrict__ row, int first, int cols) {
  constexpr int kN = Chunk<T>::kN;
  Chunk<T> p;
  if (first + kN <= cols) {
    const int offset = static_cast<int>(reinterpret_cast<uintptr_t>(row + first) & 15);
    if (offset == 0) return as_chunk<T>(*reinterpret_cast<const uint4*>(row + first));
    const int64_t before = static_cast<int64_t>(first) * static_cast<int64_t>(sizeof(T));
    const int64_t avail = static_cast<int64_t>(cols - first) * static_cast<int64_t>(sizeof(T));
    if (before >= offset && avail >= 32 - offset) return load_shifted(row + first, offset);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) p.w[k] = 0;
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (first + j < cols) p.set_elem(j, row[first + j]);
  return p;
}

// In-row indices are 32-bit (api.cpp limits cols to plan::kMaxCols); row
// offsets are 64-bit. Loads chunk `chunk` of a row; elements past `cols`
// read as 0 (they add nothing to any sum). vector_io: every row start is
// 16-byte aligned, so a full chunk is one 16-byte load (kernels pass it as a
// template constant). Otherwise the chunk's window (load_window): for the
// row's first chunk the lower block would start before the row, so it is
// loaded by element where misaligned.
template <typename T>
__device__ __forceinline__ Chunk<T> load_chunk(const T* __restrict__ row, int chunk, int cols, bool vector_io) {
  constexpr int kN = Chunk<T>::kN;
  const int base = chunk * kN;
  if (!vector_io) return load_window(row, base, cols);
  if (base + kN <= cols) return as_chunk<T>(*reinterpret_cast<const uint4*>(row + base));
  return load_window(row, base, cols);  // the partial last chunk: by element
}

// L1 eviction priorities for a row that one thread block reads twice, the second time from L1 (the fp32 forms'
// read-back forward): kL1Keep on the first read, which the read-back wants to find in L1, kL1Drop on the
// read-back, the chunk's last use. Without them the two passes' lines compete in L1 on equal terms with the
// weight's, which every row reads again. Read-only, non-coherent loads (ld.global.nc): the row must not be written
// by this kernel.
enum class L1Hint : int { kL1Keep, kL1Drop };
template <L1Hint kHint>
__device__ __forceinline__ uint4 load16_hint(const void* a) {
  uint4 v;
  if constexpr (kHint == L1Hint::kL1Keep)
    asm volatile("ld.global.nc.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(a));
  else
    asm volatile("ld.global.nc.L1::evict_first.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(a));
  return v;
}
// load_chunk with an L1 priority on its whole 16-byte chunks.
template <L1Hint kHint, typename T>
__device__ __forceinline__ Chunk<T> load_chunk_hint(const T* __restrict__ row, int chunk, int cols, bool vector_io) {
  constexpr int kN = Chunk<T>::kN;
  const int base = chunk * kN;
  if (vector_io && base + kN <= cols) return as_chunk<T>(load16_hint<kHint>(row + base));
  return load_window(row, base, cols);
}

// p, opaque to the compiler from here on, so that it stays in two registers.
// Without it nvcc rebuilt the 64-bit row address (the row from the row loop's
// counter, times the stride) before each chunk's store in the direct forward:
// about 20 instructions a chunk, where the store's own address takes 4 (SASS
// at bf16, D = 128: 1048 instructions, 920 with the address held;
// docs/performance.md, "Direct kernels: the output row's address held").
template <typename P>
__device__ __forceinline__ P* held_address(P* p) {
  asm("" : "+l"(p));
  return p;
}

// Chunk `chunk` of a 16-byte aligned row in the direct kernels: kPartial ==
// false (D a multiple of the chunk width, every chunk whole) takes one plain
// 16-byte load and carries no element path; kPartial takes load_chunk (its
// last chunk may be partial).
template <bool kPartial, typename T>
__device__ __forceinline__ Chunk<T> load_row_chunk(const T* __restrict__ row, int chunk, int cols) {
  if constexpr (kPartial) return load_chunk(row, chunk, cols, true);
  return as_chunk<T>(reinterpret_cast<const uint4*>(row)[chunk]);
}

// One 16-byte store to an address that is 16-byte aligned by construction.
// Written as PTX: from plain C++ here nvcc emitted four 4-byte stores.
template <typename T>
__device__ __forceinline__ void store16(T* dst, const Chunk<T>& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
               "r"(v.w[3])
               : "memory");
}

// Stores chunk `chunk` of a row (elements past `cols` are not written).
// vector_io: one 16-byte store per full chunk. Otherwise a full chunk goes
// out in the widest stores its address allows: 16, 8 or 4 bytes; at a 2-byte
// offset (16-bit T) one 2-byte store, three funnel-shifted 4-byte stores and
// one 2-byte store. Stores never touch bytes outside the chunk (neighbouring
// chunks belong to other threads).
template <typename T>
__device__ __forceinline__ void store_chunk(T* __restrict__ row, int chunk, int cols, bool vector_io,
                                            const Chunk<T>& p) {
  constexpr int kN = Chunk<T>::kN;
  const int base = chunk * kN;
  if (base + kN <= cols) {
    char* a = reinterpret_cast<char*>(row + base);
    const unsigned offset = static_cast<unsigned>(reinterpret_cast<uintptr_t>(a) & 15);
    if (vector_io || offset == 0) {
      *reinterpret_cast<uint4*>(a) = make_uint4(p.w[0], p.w[1], p.w[2], p.w[3]);
      return;
    }
    if ((offset & 7) == 0) {
      reinterpret_cast<uint2*>(a)[0] = make_uint2(p.w[0], p.w[1]);
      reinterpret_cast<uint2*>(a)[1] = make_uint2(p.w[2], p.w[3]);
      return;
    }
    if ((offset & 3) == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) reinterpret_cast<uint32_t*>(a)[i] = p.w[i];
      return;
    }
    if constexpr (sizeof(T) == 2) {  // offset % 4 == 2
      *reinterpret_cast<unsigned short*>(a) = static_cast<unsigned short>(p.w[0] & 0xffffu);
#pragma unroll
      for (int i = 0; i < 3; ++i)
        *reinterpret_cast<uint32_t*>(a + 2 + 4 * i) = __funnelshift_r(p.w[i], p.w[i + 1], 16);
      *reinterpret_cast<unsigned short*>(a + 14) = static_cast<unsigned short>(p.w[3] >> 16);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (base + j < cols) row[base + j] = p.elem(j);
}

// The store that goes with load_row_chunk.
template <bool kPartial, typename T>
__device__ __forceinline__ void store_row_chunk(T* __restrict__ row, int chunk, int cols, const Chunk<T>& v) {
  if constexpr (kPartial)
    store_chunk(row, chunk, cols, true, v);
  else
    store16(row + chunk * Chunk<T>::kN, v);
}

// The line holding *p into L1 (no register, no wait).
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// Every row of a 16-bit operand (base p, row stride in elements) 8-byte aligned: load_quad's and store_quad's
// `vec`, 4 columns in one 8-byte access (the launchers decide it once per call).
inline bool quad_rows(const void* p, int64_t stride) {
  return reinterpret_cast<uintptr_t>(p) % 8 == 0 && static_cast<uint64_t>(stride) * 2u % 8 == 0;  // as whole_chunks
}

// Columns [first, first + 4) of a 16-bit row that lie in the row and on 8 bytes, in the low two words of a
// Chunk<T>: one 8-byte load. The _whole forms serve the kernels whose plan admits only such rows (the fp32 forms'
// held kernels): no element path, whose registers and code they would otherwise carry.
template <typename T>
__device__ __forceinline__ Chunk<T> load_quad_whole(const T* __restrict__ row, int first) {
  static_assert(sizeof(T) == 2, "4 columns of a 16-bit row");
  Chunk<T> q = zero_chunk<T>();
  const uint2 u = *reinterpret_cast<const uint2*>(row + first);
  q.w[0] = u.x;
  q.w[1] = u.y;
  return q;
}

// Columns [first, first + 4) of a 16-bit row (0 past cols), in the low two words of a Chunk<T>.
template <typename T>
__device__ __forceinline__ Chunk<T> load_quad(const T* __restrict__ row, int first, int cols, bool vec) {
  static_assert(sizeof(T) == 2, "4 columns of a 16-bit row");
  if (vec && first + 4 <= cols) return load_quad_whole(row, first);
  Chunk<T> q = zero_chunk<T>();
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (first + j < cols) q.set_elem(j, row[first + j]);
  return q;
}

// Columns [first, first + 4) of a 16-bit row, in the row and on 8 bytes, from an fp32 chunk, each rounded to T:
// one 8-byte store (load_quad_whole's callers).
template <typename T>
__device__ __forceinline__ void store_quad_whole(T* __restrict__ row, int first, const Chunk<float>& v) {
  static_assert(sizeof(T) == 2, "4 columns of a 16-bit row");
  Chunk<T> q;
  q.set2(0, v.get(0), v.get(1));
  q.set2(2, v.get(2), v.get(3));
  // PTX, as store16: from the uint2 store in C++ nvcc emitted two 4-byte stores (twice the store instructions and
  // L2 write requests for the same bytes).
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(row + first), "r"(q.w[0]), "r"(q.w[1]) : "memory");
}

// Columns [first, first + 4) of a 16-bit row (not past cols) from an fp32 chunk, each rounded to T: one 8-byte
// store where vec (the row 8-byte aligned) and the 4 columns lie in the row.
template <typename T>
__device__ __forceinline__ void store_quad(T* __restrict__ row, int first, int cols, bool vec, const Chunk<float>& v) {
  static_assert(sizeof(T) == 2, "4 columns of a 16-bit row");
  if (vec && first + 4 <= cols) {
    store_quad_whole(row, first, v);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (first + j < cols) row[first + j] = from_float<T>(v.get(j));
}

// kN elements of a row of G widened to fp32, with a Chunk's get(j): a gy of
// another dtype than x's in the looped backward (elements past `cols` read
// as 0). Element loads: G's rows need only G's alignment.
template <int kN>
struct Floats {
  float v[kN];
  __device__ __forceinline__ float get(int j) const { return v[j]; }
};
template <typename G, int kN>
__device__ __forceinline__ Floats<kN> load_floats(const G* __restrict__ row, int chunk, int cols) {
  Floats<kN> f;
  const int base = chunk * kN;
#pragma unroll
  for (int j = 0; j < kN; ++j) f.v[j] = base + j < cols ? to_float(row[base + j]) : 0.0f;
  return f;
}

// The weight's chunk as the direct rows kernels hold it: a Chunk<T> for a
// weight of x's dtype; kN floats for an fp32 weight with 16-bit x, loaded as
// kN / 4 16-byte vectors (the weight 16-byte aligned: plan::io_of), the
// partial last chunk by element (0 past cols).
template <typename T, typename W>
using HeldWeight = std::conditional_t<std::is_same_v<W, T>, Chunk<T>, Floats<Chunk<T>::kN>>;
template <typename T, typename W>
__device__ __forceinline__ HeldWeight<T, W> one_weight() {
  if constexpr (std::is_same_v<W, T>) {
    return one_chunk<T>();
  } else {
    HeldWeight<T, W> f;
#pragma unroll
    for (int j = 0; j < Chunk<T>::kN; ++j) f.v[j] = 1.0f;
    return f;
  }
}
template <bool kPartial, typename T, typename W>
__device__ __forceinline__ HeldWeight<T, W> load_row_weight(const W* __restrict__ w, int chunk, int cols) {
  if constexpr (std::is_same_v<W, T>) {
    return load_row_chunk<kPartial>(w, chunk, cols);
  } else {
    static_assert(std::is_same_v<W, float> && Chunk<T>::kN % 4 == 0, "an fp32 weight with 16-bit x");
    constexpr int kN = Chunk<T>::kN;
    if (kPartial && (chunk + 1) * kN > cols) return load_floats<float, kN>(w, chunk, cols);
    HeldWeight<T, W> f;
    const float4* v = reinterpret_cast<const float4*>(w + chunk * kN);
#pragma unroll
    for (int k = 0; k < kN / 4; ++k) {
      const float4 q = v[k];
      f.v[4 * k] = q.x;
      f.v[4 * k + 1] = q.y;
      f.v[4 * k + 2] = q.z;
      f.v[4 * k + 3] = q.w;
    }
    return f;
  }
}

// Columns [first + kJ0, first + kJ1) of a row by element into a chunk's
// elements kJ0..kJ1 - 1 (columns outside [0, cols) and the other elements: 0).
template <typename T, int kJ0, int kJ1>
__device__ __forceinline__ Chunk<T> load_elems(const T* __restrict__ row, int first, int cols) {
  Chunk<T> p = zero_chunk<T>();
#pragma unroll
  for (int j = kJ0; j < kJ1; ++j)
    if (first + j >= 0 && first + j < cols) p.set_elem(j, row[first + j]);
  return p;
}

// The widest aligned access (in elements; at most 8 bytes) that starts at
// position p0 of a 16-byte block and ends at or before p1.
template <typename T>
__host__ __device__ constexpr int span_piece(int p0, int p1) {
  int s = Chunk<T>::kN / 2;
  while (s > 1 && (p0 % s != 0 || p0 + s > p1)) s /= 2;
  return s;
}

// Positions [kP0, kP1) of the 16-byte aligned block at `block` (constants):
// the run split into its widest aligned pieces of 2, 4 or 8 bytes, so that a
// row's head (the positions from its offset to the block's end) or its tail
// (the block's first positions) is at most three accesses, not one per
// element with its own bounds test. The caller guarantees that the positions
// lie inside the row. Positions outside [kP0, kP1) of the chunk are left as
// they are (loads) or not written (stores).
template <typename T, int kP0, int kP1>
__device__ __forceinline__ void load_span(const T* __restrict__ block, Chunk<T>& v) {
  if constexpr (kP0 < kP1) {
    constexpr int kS = span_piece<T>(kP0, kP1);
    constexpr int kBytes = kS * static_cast<int>(sizeof(T));
    const char* a = reinterpret_cast<const char*>(block) + kP0 * static_cast<int>(sizeof(T));
    if constexpr (kBytes == 2) {
      v.set_elem(kP0, from_bits<T>(*reinterpret_cast<const unsigned short*>(a)));
    } else if constexpr (kBytes == 4) {
      v.w[kP0 * sizeof(T) / 4] = *reinterpret_cast<const uint32_t*>(a);
    } else {
      const uint2 u = *reinterpret_cast<const uint2*>(a);
      v.w[kP0 * sizeof(T) / 4] = u.x;
      v.w[kP0 * sizeof(T) / 4 + 1] = u.y;
    }
    load_span<T, kP0 + kS, kP1>(block, v);
  }
}
template <typename T, int kP0, int kP1>
__device__ __forceinline__ void store_span(T* block, const Chunk<T>& v) {
  if constexpr (kP0 < kP1) {
    constexpr int kS = span_piece<T>(kP0, kP1);
    constexpr int kBytes = kS * static_cast<int>(sizeof(T));
    constexpr int kW = kP0 * static_cast<int>(sizeof(T)) / 4;
    char* a = reinterpret_cast<char*>(block) + kP0 * static_cast<int>(sizeof(T));
    if constexpr (kBytes == 2) {
      const unsigned short h = static_cast<unsigned short>(v.w[kW] >> (16 * (kP0 % 2)));
      asm volatile("st.global.b16 [%0], %1;" ::"l"(a), "h"(h) : "memory");
    } else if constexpr (kBytes == 4) {
      asm volatile("st.global.b32 [%0], %1;" ::"l"(a), "r"(v.w[kW]) : "memory");
    } else {
      asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(a), "r"(v.w[kW]), "r"(v.w[kW + 1]) : "memory");
    }
    store_span<T, kP0 + kS, kP1>(block, v);
  }
}

// Positions [0, len) of the 16-byte aligned block at `block`, 0 <= len < kN known at run time: load_span and
// store_span of that constant length, picked by a chain of tests (len is one value for every row at one offset,
// so the warp takes one branch). The caller guarantees that the positions lie inside the row.
template <typename T, int kL = 1>
__device__ __forceinline__ void load_run(const T* __restrict__ block, int len, Chunk<T>& v) {
  if constexpr (kL < Chunk<T>::kN) {
    if (len == kL) {
      load_span<T, 0, kL>(block, v);
    } else {
      load_run<T, kL + 1>(block, len, v);
    }
  }
}
template <typename T, int kL = 1>
__device__ __forceinline__ void store_run(T* block, int len, const Chunk<T>& v) {
  if constexpr (kL < Chunk<T>::kN) {
    if (len == kL) {
      store_span<T, 0, kL>(block, v);
    } else {
      store_run<T, kL + 1>(block, len, v);
    }
  }
}

// Element e (0 <= e < 2 kN, a constant after unrolling) of two consecutive blocks.
template <typename T>
__device__ __forceinline__ float pair_elem(const Chunk<T>& lo, const Chunk<T>& hi, int e) {
  return e < Chunk<T>::kN ? lo.get(e) : hi.get(e - Chunk<T>::kN);
}

// f(std::integral_constant<int, o>) for o in 0..kN - 1 (the row's offset in elements).
template <typename T, typename F>
__device__ __forceinline__ void with_row_offset(int o, F&& f) {
  using std::integral_constant;
  if constexpr (Chunk<T>::kN == 4) {
    switch (o) {
      case 0: f(integral_constant<int, 0>{}); break;
      case 1: f(integral_constant<int, 1>{}); break;
      case 2: f(integral_constant<int, 2>{}); break;
      default: f(integral_constant<int, 3>{}); break;
    }
  } else {
    switch (o) {
      case 0: f(integral_constant<int, 0>{}); break;
      case 1: f(integral_constant<int, 1>{}); break;
      case 2: f(integral_constant<int, 2>{}); break;
      case 3: f(integral_constant<int, 3>{}); break;
      case 4: f(integral_constant<int, 4>{}); break;
      case 5: f(integral_constant<int, 5>{}); break;
      case 6: f(integral_constant<int, 6>{}); break;
      default: f(integral_constant<int, 7>{}); break;
    }
  }
}

// f(std::integral_constant<int, o>) for o in kO..kN - 1 (o >= kO: a misaligned row's offset in elements).
template <typename T, int kO = 1, typename F>
__device__ __forceinline__ void with_nonzero_offset(int o, F&& f) {
  if constexpr (kO + 1 < Chunk<T>::kN) {
    if (o == kO) {
      f(std::integral_constant<int, kO>{});
    } else {
      with_nonzero_offset<T, kO + 1>(o, f);
    }
  } else {
    f(std::integral_constant<int, kO>{});
  }
}
// The same on the host, returning f's result (the launch of a kernel per offset).
template <typename T, int kO = 1, typename F>
decltype(auto) with_nonzero_offset_host(int o, F&& f) {
  if constexpr (kO + 1 < Chunk<T>::kN) {
    if (o == kO) return f(std::integral_constant<int, kO>{});
    return with_nonzero_offset_host<T, kO + 1>(o, f);
  } else {
    return f(std::integral_constant<int, kO>{});
  }
}

}  // namespace rmsnorm::cuda
