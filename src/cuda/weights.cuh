// w' (w, 1 + w, or 1 without a weight) of a thread's columns, in fp32.
#pragma once

#include "cuda/chunk_io.cuh"

namespace rmsnorm::cuda {

// w' of a chunk's elements in fp32: w, 1 + w (added in fp32), or 1 without
// weight. The persistent kernels compute it once per thread: a thread owns
// the same columns in every row.
// weights_at: the same for the columns [first, first + kN) at any alignment
// (first a multiple of kN where vector_io).
template <typename T>
__device__ __forceinline__ void weights_at(const T* __restrict__ w, int first, int cols, bool vector_io, float offset,
                                           float (&out)[Chunk<T>::kN]) {
  constexpr int kN = Chunk<T>::kN;
  if (w == nullptr) {
#pragma unroll
    for (int j = 0; j < kN; ++j) out[j] = 1.0f;
    return;
  }
  const Chunk<T> p = vector_io ? load_chunk(w, first / kN, cols, true) : load_window(w, first, cols);
#pragma unroll
  for (int j = 0; j < kN; ++j) out[j] = p.get(j) + offset;
}
template <typename T>
__device__ __forceinline__ void weights_of(const T* __restrict__ w, int chunk, int cols, bool vector_io, float offset,
                                           float (&out)[Chunk<T>::kN]) {
  weights_at(w, chunk * Chunk<T>::kN, cols, vector_io, offset, out);
}

// w' from a weight chunk already held in registers (the direct rows kernels);
// has_weight false: 1.
// WC: a Chunk<T>, or the HeldWeight floats of an fp32 weight (chunk_io.cuh).
template <typename WC, int kN>
__device__ __forceinline__ void held_weights(const WC& w, bool has_weight, float offset, float (&out)[kN]) {
#pragma unroll
  for (int j = 0; j < kN; ++j) out[j] = has_weight ? w.get(j) + offset : 1.0f;
}

// The same for a weight of another dtype W than x's (RMSNORM_FLAG_WEIGHT_F32's
// fp32 weight with 16-bit x; the fp32 residual stream's 16-bit weight with
// the float h), columns [first, first + kN): element loads (the weight's rows
// need only W's alignment).
// w' of the four 16-bit weight columns [first, first + 4), which lie on 8 bytes inside the row: one load.
template <typename W>
__device__ __forceinline__ void quad_weights(const W* __restrict__ w, int first, int cols, float offset,
                                             float (&out)[4]) {
  const Chunk<W> q = load_quad(w, first, cols, true);
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = q.get(j) + offset;
}

template <typename W, int kN>
__device__ __forceinline__ void weights_elems(const W* __restrict__ w, int first, int cols, float offset,
                                              float (&out)[kN]) {
  if constexpr (sizeof(W) == 2 && kN == 4) {
    // Four 16-bit columns on 8 bytes (the 16-bit weight of fp32 x): one load, the same values.
    if (w != nullptr && first + 4 <= cols && reinterpret_cast<uintptr_t>(w + first) % 8 == 0) {
      quad_weights(w, first, cols, offset, out);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kN; ++j)
    out[j] = w == nullptr ? 1.0f : (first + j < cols ? to_float(w[first + j]) : 0.0f) + offset;
}

// w' of chunk `chunk` in the looped kernels: from a weight of T, or of W
// passed in the same pointer.
template <typename W, typename T>
__device__ __forceinline__ void weights_any(const T* __restrict__ w, int chunk, int cols, bool vector_io, float offset,
                                            float (&out)[Chunk<T>::kN]) {
  if constexpr (std::is_same_v<W, T>)
    weights_of(w, chunk, cols, vector_io, offset, out);
  else
    weights_elems(reinterpret_cast<const W*>(w), chunk * Chunk<T>::kN, cols, offset, out);
}

// The raw weight of a chunk that is a whole vector of it (the fp32 forms' held kernels, no element path): a weight
// of T by one 16-byte load, a 16-bit W by one 8-byte load into the chunk's low words, zero without a weight. w' comes
// from it by held_weights (has_weight = w != nullptr), so a kernel can issue several chunks' loads before it waits
// on any.
template <typename W, typename T>
__device__ __forceinline__ Chunk<W> weights_vec_raw(const T* __restrict__ w, int chunk, int cols) {
  if (w == nullptr) return zero_chunk<W>();
  if constexpr (std::is_same_v<W, T>)
    return load_row_chunk<false>(w, chunk, cols);
  else
    return load_quad_whole(reinterpret_cast<const W*>(w), chunk * Chunk<T>::kN);
}

// weights_vec_raw of kCount chunks c0, c0 + step, .. (zero from `chunks` on): their loads issued together, before
// anything waits on one of them.
template <typename W, int kCount, typename T>
__device__ __forceinline__ void weights_vec_raw_n(const T* __restrict__ w, int c0, int step, int chunks, int cols,
                                                  Chunk<W> (&out)[kCount]) {
#pragma unroll
  for (int j = 0; j < kCount; ++j) {
    const int c = c0 + j * step;
    out[j] = c < chunks ? weights_vec_raw<W>(w, c, cols) : zero_chunk<W>();
  }
}

// weights_at for a weight of T or of W passed in the same pointer (the rows
// band's element path with RMSNORM_FLAG_WEIGHT_F32): W's by element.
template <typename W, typename T>
__device__ __forceinline__ void weights_at_any(const T* __restrict__ w, int first, int cols, float offset,
                                               float (&out)[Chunk<T>::kN]) {
  if constexpr (std::is_same_v<W, T>) {
    weights_at(w, first, cols, false, offset, out);
  } else {
    weights_elems(reinterpret_cast<const W*>(w), first, cols, offset, out);
  }
}

// w' of the kCpt chunks a thread owns (the same columns in every
// row). kFloat: loaded once per kernel and held as fp32, no per-row
// conversion (the 16-byte-I/O kernels). Otherwise reloaded (an L1 hit) and
// converted at each use: the element-I/O kernels need the registers for
// their loads (held packed, the misaligned forward was 1.5x slower).
// W: the weight's dtype (T, or float with RMSNORM_FLAG_WEIGHT_F32), passed as T*.
template <typename T, int kCpt, bool kFloat, typename W = T>
struct ThreadWeights {
  static constexpr int kN = Chunk<T>::kN;
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
        if (m.chunk(it) < chunks) weights_any<W>(wp, m.chunk(it), ncols, vec, off, f[it]);
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
      weights_any<W>(w, chunk[it], cols, vector_io, offset, out);
    }
  }
};

}  // namespace rmsnorm::cuda
