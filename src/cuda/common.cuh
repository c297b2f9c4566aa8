// Device building blocks shared by the forward and backward kernels:
// element types, 16-byte chunks, row reductions, gw output.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "args.hpp"
#include "error.hpp"
#include "plan.hpp"

namespace rmsnorm::cuda {

// Programmatic dependent launch (rmsnorm.h, RMSNORM_FLAG_NO_PDL); the first
// statement of every kernel, before any operand or workspace is touched.
// Waits until the previous kernel in the stream has completed and its writes
// are visible (returns at once when this grid was launched plainly), then
// lets the next kernel be scheduled: a next kernel launched as a programmatic
// dependent waits in turn, so this grid's writes are complete before it reads.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

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
struct alignas(16) Pack {
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

// Words k .. k + 4 of w[0..7] for a run-time k in 0..3, without indexing a
// register array at run time (which would put it in local memory).
__device__ __forceinline__ void window5(const uint32_t (&w)[8], int k, uint32_t (&out)[5]) {
#pragma unroll
  for (int i = 0; i < 5; ++i) out[i] = k == 0 ? w[i] : k == 1 ? w[i + 1] : k == 2 ? w[i + 2] : w[i + 3];
}

// The 16 bytes that start `offset` (0..15) bytes into two consecutive
// aligned 16-byte blocks lo, hi.
template <typename T>
__device__ __forceinline__ Pack<T> shift_pair(const uint4& lo, const uint4& hi, int offset) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  uint32_t win[5];
  window5(w, offset >> 2, win);
  const unsigned sh = static_cast<unsigned>(offset & 3) * 8;
  Pack<T> r;
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
__device__ __forceinline__ Pack<T> load_shifted(const T* p, int offset) {
  const uint4* a = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(p) - offset);
  return shift_pair<T>(a[0], a[1], offset);
}

template <typename T>
__device__ __forceinline__ Pack<T> pack_of(const uint4& u) {
  Pack<T> p;
  p.w[0] = u.x;
  p.w[1] = u.y;
  p.w[2] = u.z;
  p.w[3] = u.w;
  return p;
}

// Columns [first, first + kN) of a row at any alignment (elements past
// `cols` read as 0): one 16-byte load where the window is aligned, two
// aligned 16-byte loads and a funnel shift where both blocks lie inside the
// row (the lower one starts at or after the row's first byte, the upper one
// ends at or before its last), element loads otherwise.
template <typename T>
__device__ __forceinline__ Pack<T> load_window(const T* __restrict__ row, int first, int cols) {
  constexpr int kN = Pack<T>::kN;
  Pack<T> p;
  if (first + kN <= cols) {
    const int offset = static_cast<int>(reinterpret_cast<uintptr_t>(row + first) & 15);
    if (offset == 0) return pack_of<T>(*reinterpret_cast<const uint4*>(row + first));
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
__device__ __forceinline__ Pack<T> load_chunk(const T* __restrict__ row, int chunk, int cols, bool vector_io) {
  constexpr int kN = Pack<T>::kN;
  const int base = chunk * kN;
  if (!vector_io) return load_window(row, base, cols);
  if (base + kN <= cols) return pack_of<T>(*reinterpret_cast<const uint4*>(row + base));
  return load_window(row, base, cols);  // the partial last chunk: by element
}

// One 16-byte store to an address that is 16-byte aligned by construction.
// Written as PTX: from plain C++ here nvcc emitted four 4-byte stores.
template <typename T>
__device__ __forceinline__ void store16(T* dst, const Pack<T>& v) {
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
                                            const Pack<T>& p) {
  constexpr int kN = Pack<T>::kN;
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

// ---- cp.async pipeline (16-byte I/O) ---------------------------------------------------------
// Each thread copies its own chunks into its own shared-memory slots and
// later reads exactly those slots back, so completion (wait_group) is the
// only synchronization a stage needs. cp.async.cg caches in L2 only; a
// partial last chunk copies the row's remaining bytes and zero-fills the rest
// (elements past cols read as 0, as with load_chunk).
__device__ __forceinline__ void cp_async_chunk(uint4* smem, const void* gmem, int src_bytes) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
#else
  // Before sm_80 (no cp.async): a synchronous copy with the same zero fill.
  uint4 v = make_uint4(0, 0, 0, 0);
  if (src_bytes == 16) {
    v = *static_cast<const uint4*>(gmem);
  } else {
    unsigned char* b = reinterpret_cast<unsigned char*>(&v);
    for (int i = 0; i < src_bytes; ++i) b[i] = static_cast<const unsigned char*>(gmem)[i];
  }
  *smem = v;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most `pending` of this thread's groups are in flight (0..2).
static_assert(plan::kMaxStages <= 3, "cp_async_wait covers at most stages - 1 = 2 pending groups");
__device__ __forceinline__ void cp_async_wait(int pending) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if (pending <= 0)
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  else if (pending == 1)
    asm volatile("cp.async.wait_group 1;" ::: "memory");
  else
    asm volatile("cp.async.wait_group 2;" ::: "memory");
#else
  (void)pending;
#endif
}

// w' of a chunk's elements in fp32: w, 1 + w (added in fp32), or 1 without
// weight. The persistent kernels compute it once per thread: a thread owns
// the same columns in every row.
// weights_at: the same for the columns [first, first + kN) at any alignment
// (first a multiple of kN where vector_io).
template <typename T>
__device__ __forceinline__ void weights_at(const T* __restrict__ w, int first, int cols, bool vector_io, float offset,
                                           float (&out)[Pack<T>::kN]) {
  constexpr int kN = Pack<T>::kN;
  if (w == nullptr) {
#pragma unroll
    for (int j = 0; j < kN; ++j) out[j] = 1.0f;
    return;
  }
  const Pack<T> p = vector_io ? load_chunk(w, first / kN, cols, true) : load_window(w, first, cols);
#pragma unroll
  for (int j = 0; j < kN; ++j) out[j] = p.get(j) + offset;
}
template <typename T>
__device__ __forceinline__ void weights_of(const T* __restrict__ w, int chunk, int cols, bool vector_io, float offset,
                                           float (&out)[Pack<T>::kN]) {
  weights_at(w, chunk * Pack<T>::kN, cols, vector_io, offset, out);
}

// w' of the kChunksPerThread chunks a thread owns (the same columns in every
// row). kFloat: loaded once per kernel and held as fp32, no per-row
// conversion (the 16-byte-I/O kernels). Otherwise reloaded (an L1 hit) and
// converted at each use: the element-I/O kernels need the registers for
// their loads (held packed, the misaligned forward was 1.5x slower).
template <typename T, bool kFloat>
struct ThreadWeights {
  static constexpr int kN = Pack<T>::kN;
  static constexpr int kCpt = plan::kChunksPerThread;
  float f[kFloat ? kCpt : 1][kN];
  const T* w = nullptr;
  int cols = 0;
  bool vector_io = false;
  float offset = 0.0f;
  int chunk[kFloat ? 1 : kCpt];

  // chunk(it) < chunks for the chunks to load (others are never used).
  template <typename Map>
  __device__ __forceinline__ void load(const T* __restrict__ wp, int chunks, int ncols, bool vec, float off,
                                       const Map& m) {
    w = wp;
    cols = ncols;
    vector_io = vec;
    offset = off;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      if constexpr (kFloat) {
        if (m.chunk(it) < chunks) weights_of(wp, m.chunk(it), ncols, vec, off, f[it]);
      } else {
        chunk[it] = m.chunk(it);
      }
    }
  }
  __device__ __forceinline__ void get(int it, float (&out)[kN]) const {
    if constexpr (kFloat) {
#pragma unroll
      for (int j = 0; j < kN; ++j) out[j] = f[it][j];
    } else {
      weights_of(w, chunk[it], cols, vector_io, offset, out);
    }
  }
};

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float2 add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
// Lane `src`'s value, whole warp.
__device__ __forceinline__ float shfl_lane(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ float2 shfl_lane(float2 v, int src) {
  return make_float2(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src));
}
__device__ __forceinline__ float shfl_xor(float v, int off) { return __shfl_xor_sync(0xffffffffu, v, off); }
__device__ __forceinline__ float2 shfl_xor(float2 v, int off) {
  return make_float2(__shfl_xor_sync(0xffffffffu, v.x, off), __shfl_xor_sync(0xffffffffu, v.y, off));
}

// Sum over the kGroup (power of two <= 32) aligned lanes that own one row.
// An xor butterfly rather than cub::WarpReduce: every lane needs the total
// (no broadcast step), and the order is fixed, so every lane holds the same
// bits. All 32 lanes of the warp execute it (rows past the end contribute 0),
// so the full mask is always right. V is float (forward) or float2
// (backward); .x follows the same order in both, so the sums of x^2 agree.
template <int kGroup, typename V>
__device__ __forceinline__ V group_sum(V v) {
  static_assert(kGroup >= 1 && kGroup <= 32 && (kGroup & (kGroup - 1)) == 0, "group must be a power of two <= 32");
#pragma unroll
  for (int off = 1; off < kGroup; off <<= 1) v = add(v, shfl_xor(v, off));
  return v;
}

// Barrier over the threads of one row slot: the whole CTA when it holds
// one slot, else the slot's own named barrier (so slots never wait for each
// other). Orders shared-memory accesses like __syncthreads.
template <int kTpr, int kSlots>
__device__ __forceinline__ void slot_sync(int slot) {
  if constexpr (kSlots == 1) {
    __syncthreads();
  } else {
    static_assert(kTpr % 32 == 0 && plan::slot_barrier_id(kSlots - 1, kSlots) < 16, "named barriers: 1..15");
    asm volatile("bar.sync %0, %1;" ::"r"(plan::slot_barrier_id(slot, kSlots)), "r"(kTpr) : "memory");
  }
}

// The same for any kTpr: slots of kTpr <= 32 threads lie inside one warp,
// whose threads then synchronize (and order shared memory) together.
template <int kTpr, int kSlots>
__device__ __forceinline__ void slot_sync_any(int slot) {
  if constexpr (kTpr <= 32) {
    (void)slot;
    __syncwarp();
  } else {
    slot_sync<kTpr, kSlots>(slot);
  }
}

// Per-row scratch of a CTA: one entry per warp of each row slot, twice (by
// row parity). A slot writes buffer `parity`, syncs, reads it; the next
// write of that buffer comes two rows later, after the next row's barrier,
// which no thread passes before every thread has finished reading: one
// barrier per row, no write-after-read race.
template <typename V, int kTpr, int kSlots>
struct RowScratch {
  static constexpr int kEntries = kTpr > 32 ? 2 * kSlots * plan::warps_per_row(kTpr) : 1;
  alignas(16) V v[kEntries];
};

// Sum over the kTpr threads of each row slot; every thread of the CTA calls
// it (uniform control flow). tpr <= 32: lanes only. tpr > 32: each warp's
// sum to scratch, then every thread adds its slot's warp sums in warp order.
template <int kTpr, int kSlots, typename V>
__device__ __forceinline__ V row_sum(V v, RowScratch<V, kTpr, kSlots>& scratch, int parity) {
  static_assert(kTpr <= 32 ? 32 % kTpr == 0 : kTpr % 32 == 0, "threads per row must tile warps");
  constexpr int kLanes = kTpr < 32 ? kTpr : 32;
  v = group_sum<kLanes>(v);
  if constexpr (kTpr > 32) {
    constexpr int kWarps = plan::warps_per_row(kTpr);
    const int slot = plan::row_slot(threadIdx.x, kTpr);
    const int warp_in_row = (threadIdx.x % kTpr) / 32;
    if (threadIdx.x % 32 == 0) scratch.v[plan::scratch_index(parity, slot, warp_in_row, kTpr, kSlots)] = v;
    slot_sync<kTpr, kSlots>(slot);
    const V* s = &scratch.v[plan::scratch_index(parity, slot, 0, kTpr, kSlots)];
    V total = s[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total = add(total, s[w]);
    v = total;
  }
  return v;
}

__device__ __forceinline__ unsigned cluster_size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}

__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().block_rank();
#else
  return 0;
#endif
}

__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#endif
}

// Sum of one value per CTA over the cluster, in rank order (the same bits in
// every CTA). exchange[parity] is this CTA's slot; double-buffered like
// RowScratch, so one cluster barrier per row. Callers end with cluster_sync()
// so that no CTA exits while another may still read its slot.
template <typename V>
__device__ __forceinline__ V cluster_sum(V v, V* exchange, int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const unsigned n = cluster.num_blocks();
  if (threadIdx.x == 0) exchange[parity] = v;
  cluster.sync();
  V total = *cluster.map_shared_rank(&exchange[parity], 0);
  for (unsigned k = 1; k < n; ++k) total = add(total, *cluster.map_shared_rank(&exchange[parity], k));
  return total;
#else
  (void)exchange;
  (void)parity;
  return v;  // pre-Hopper plans use clusters of one CTA
#endif
}

// Which rows and chunks a thread works on (plan.hpp): row slot, position
// among the row's threads, and the persistent walk over row groups by
// CTA (kRows) or by cluster (kCluster).
template <int kTpr, bool kClustered>
struct RowMap {
  int slot;       // row slot in the CTA
  int pos;        // index among the row's G threads (CTA rank major)
  int stride;     // G = kTpr * cluster size
  int64_t unit;   // this CTA's (cluster's) index among the workers
  int64_t units;  // workers
  __device__ __forceinline__ RowMap() {
    slot = plan::row_slot(threadIdx.x, kTpr);
    const int lane = threadIdx.x % kTpr;
    if constexpr (kClustered) {
      const int cs = static_cast<int>(cluster_size());
      pos = static_cast<int>(cluster_rank()) * kTpr + lane;
      stride = kTpr * cs;
      unit = blockIdx.x / cs;
      units = gridDim.x / cs;
    } else {
      pos = lane;
      stride = kTpr;
      unit = blockIdx.x;
      units = gridDim.x;
    }
  }
  __device__ __forceinline__ int chunk(int it) const { return it * stride + pos; }
};

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

// kN fp32 values to dst[0 .. n) (n may be less than kN at the row's end):
// 16-byte stores where dst is 16-byte aligned and the chunk is whole.
template <int kN>
__device__ __forceinline__ void store_f32_chunk(float* dst, int n, const float (&v)[kN]) {
  static_assert(kN % 4 == 0, "whole float4s");
  if (n >= kN && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
#pragma unroll
    for (int q = 0; q < kN / 4; ++q)
      reinterpret_cast<float4*>(dst)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kN; ++j)
    if (j < n) dst[j] = v[j];
}

// The finished gw sums of chunk `chunk` (columns chunk * kN ..): into this
// worker's partial row, or (one partial in all) into the user's gw in its
// mode, with one thread writing the chunk's columns together (16-byte stores
// where aligned; the accumulate modes read and write element by element).
template <typename T>
__device__ __forceinline__ void emit_gw_chunk(const GwOut& o, int64_t partial, int cols, int chunk,
                                              const float (&v)[Pack<T>::kN]) {
  constexpr int kN = Pack<T>::kN;
  const int base = chunk * kN;
  if (!o.direct) {
    store_f32_chunk<kN>(o.partials + partial * cols + base, cols - base, v);
    return;
  }
  switch (static_cast<GwMode>(o.mode)) {
    case GwMode::kStore: {
      Pack<T> pk;
#pragma unroll
      for (int j = 0; j < kN; j += 2) pk.set2(j, v[j], v[j + 1]);
      store_chunk(static_cast<T*>(o.gw), chunk, cols, false, pk);
      break;
    }
    case GwMode::kStoreF32: store_f32_chunk<kN>(static_cast<float*>(o.gw) + base, cols - base, v); break;
    default:
#pragma unroll
      for (int j = 0; j < kN; ++j)
        if (base + j < cols) store_gw_final<T>(o, base + j, v[j]);
  }
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

// Raises a kernel's dynamic shared-memory limit when a launch needs more than
// the default 48 KiB less the kernel's static shared memory (scratch); a
// function attribute belongs to a context, so this runs on every call.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 32 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace rmsnorm::cuda
