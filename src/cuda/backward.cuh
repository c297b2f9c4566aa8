// RMSNorm backward, gx and gw fused in one deterministic pass.
//
//   r  = rstd (given) or 1 / sqrt(sum(x^2) / D + eps)
//   c  = r * sum(x * w' * gy) / D                = mean(x_hat * w' * gy)
//   gx = r * (w' * gy - x_hat * c)
//   gw = sum over rows of gy * x_hat             (fp32, one rounding)
//
// Work split: a persistent grid (plan.hpp). Each CTA (kRows, kLooped) or
// cluster (kCluster) walks the row groups unit, unit + units, ...; within a
// group rows are split exactly as in the forward, so each thread owns fixed
// columns and keeps their gw sums in fp32 registers across all its rows
// (kLooped: in its own workspace row). One reduction per row carries both
// sum(x^2) and sum(x w' gy); the next group's x and gy are loaded before it.
// At the end the row slots of a CTA are added in slot order (through shared
// memory) and each CTA or cluster writes one fp32 partial row to the
// workspace (at most one per SM); the finalize kernel adds the partial rows in
// order and writes gw. With a single partial the main kernel writes gw
// itself. No atomics: bitwise deterministic.
#pragma once

#include "cuda/cuda_backend.hpp"
#include "cuda/gw_out.cuh"
#include "cuda/launch.hpp"
#include "cuda/row_map.cuh"
#include "cuda/rstd.cuh"
#include "cuda/weights.cuh"

namespace rmsnorm::cuda {

template <typename T>
struct BackwardParams {
  const T* x;
  const T* w;  // null only when gw is not wanted
  const T* gy;
  const float* rstd;  // null: recompute
  T* gx;
  int64_t rows;
  int cols;
  int chunks;
  int64_t x_stride;
  int64_t gy_stride;
  int64_t gx_stride;
  float eps;
  float w_offset;
  bool vector_io;
  bool with_gw;
  GwOut gw;
  int stages;  // cp.async pipeline depth (16-byte I/O)
  // rmsnorm_add_backward: gx = T(T(gx of the norm) + g_h); null: the plain backward.
  const T* g_h = nullptr;
  int64_t g_h_stride = 0;
  // backward_rows_paired: every operand's rows at this offset (elements, > 0) in their 16-byte blocks; 0: not.
  int paired_offset = 0;
  // backward_looped_shares_kernel: every row of the 16-bit gy 8-byte aligned (a chunk's 4 columns in one load).
  bool gy_vector = false;
  // backward_looped_shares_kernel: x's gradient in gy's dtype, gx rounded (rmsnorm_add_backward_x); null: none.
  void* gx_x = nullptr;
  int64_t gx_x_stride = 0;
  bool gx_x_vector = false;  // every row of gx_x 8-byte aligned
  // backward_looped_shares_kernel: the CTA's gw partial in dynamic shared memory (plan::f32_shares_gw_smem).
  bool gw_smem = false;
};

// gx chunk c of a row plus the residual stream's gradient (ghr: that row of
// g_h, or null), added in fp32 and rounded once. The owner of a gx chunk
// loads the g_h chunk before any thread stores gx there, so gx == g_h is safe.
// kMayAdd false: the plain backward, with no trace of g_h in the kernel. The
// cluster and looped kernels are instantiated both ways: the runtime null
// test there cost the plain backward 12-18% at 1024x65536 and 1024x262144
// (A/B on the H200, 2026-12-01); in the rows kernels it cost nothing
// measurable, so they keep one instantiation and the runtime test.
template <typename T>
__device__ __forceinline__ Chunk<T> add_g_h(const Chunk<T>& g, const Chunk<T>& h) {
  Chunk<T> o;
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; j += 2) o.set2(j, __fadd_rn(g.get(j), h.get(j)), __fadd_rn(g.get(j + 1), h.get(j + 1)));
  return o;
}
template <bool kMayAdd, typename T>
__device__ __forceinline__ Chunk<T> plus_g_h(const Chunk<T>& g, const T* ghr, int c, int cols, bool vector_io) {
  if constexpr (!kMayAdd) return g;
  if (ghr == nullptr) return g;
  return add_g_h(g, load_chunk(ghr, c, cols, vector_io));
}

// Adds a chunk's terms to this thread's running sums: x^2 (in the forward's
// order, see add_squares) and x * w' * gy.
// Gy: a Chunk<T>, or the Floats of a gy in another dtype (anything with get(j)).
template <typename T, typename Gy>
__device__ __forceinline__ float2 add_chunk_sums(float2 s, const Chunk<T>& x, const Gy& gy,
                                                 const float (&w)[Chunk<T>::kN]) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j) {
    const float xv = x.get(j);
    s.x += xv * xv;
    s.y += xv * w[j] * gy.get(j);
  }
  return s;
}

struct RowScalars {
  float r;  // rstd
  float c;  // mean(x_hat * w' * gy)
};

// r and c of a CTA's row (the looped band) from its reduced sums (the same
// in every thread). given_r: the forward's rstd of the row when the caller
// passed it; otherwise recomputed as the forward does, the rescaled path of
// rstd.cuh included. c takes the rescaled path where r is extreme
// (rms_dot_scale): then sum(x w' gy) is summed again with x scaled by t, and
// c = (r / t) * (that sum / D). scaled_squares(s) and scaled_dot(t) return
// this thread's shares of sum((x s)^2) and sum((x t) w' gy); they run only on
// the rescaled paths, in every thread of the CTA.
template <int kCta, typename T, typename Squares, typename Dot>
__device__ __forceinline__ RowScalars cta_row_scalars(const BackwardParams<T>& p, float given_r, float2 sums,
                                                      RowScratch<float2, kCta, 1>& scratch, Squares&& scaled_squares,
                                                      Dot&& scaled_dot) {
  RowScalars s;
  s.r = p.rstd != nullptr ? given_r : cta_row_rstd<kCta>(sums.x, p.cols, p.eps, scratch, scaled_squares);
  s.c = s.r * (sums.y / static_cast<float>(p.cols));
  const float t = rms_dot_scale(s.r);
  if (t != 1.0f) s.c = (s.r / t) * (cta_sum_rare<kCta>(scaled_dot(t), scratch) / static_cast<float>(p.cols));
  return s;
}

// r and c by the plain formulas (the rows and cluster bands).
template <typename T>
__device__ __forceinline__ RowScalars plain_row_scalars(const BackwardParams<T>& p, float given_r, float2 sums) {
  RowScalars s;
  s.r = p.rstd != nullptr ? given_r : rms_from_sum(sums.x, p.cols, p.eps);
  s.c = s.r * (sums.y / static_cast<float>(p.cols));
  return s;
}

// gx of one element, and a gw sum plus its term gy * x_hat: every path computes them by these two functions,
// their roundings spelled out (which products fuse into an FMA is not left to the compiler: with fp32 gx and g_h,
// nvcc fused gx's last product with the add of g_h in one kernel and not in another, a bit apart).
__device__ __forceinline__ float gx_elem(float x, float gy, float w, RowScalars s) {
  const float xh = __fmul_rn(x, s.r);
  return __fmul_rn(s.r, __fmaf_rn(w, gy, -__fmul_rn(xh, s.c)));
}
__device__ __forceinline__ float gw_add(float sum, float x, float gy, RowScalars s) {
  return __fmaf_rn(gy, __fmul_rn(x, s.r), sum);
}

// gx of one chunk (or of any kN consecutive columns with their w').
template <typename T, typename Gy>
__device__ __forceinline__ Chunk<T> gx_chunk(const Chunk<T>& x, const Gy& gy, const float (&w)[Chunk<T>::kN],
                                            RowScalars s) {
  Chunk<T> gx;
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; j += 2)
    gx.set2(j, gx_elem(x.get(j), gy.get(j), w[j], s), gx_elem(x.get(j + 1), gy.get(j + 1), w[j + 1], s));
  return gx;
}

// gy * x_hat of each element of a chunk, added to gw_sums.
template <typename T, typename Gy>
__device__ __forceinline__ void add_gw_terms(const Chunk<T>& x, const Gy& gy, RowScalars s,
                                             float (&gw_sums)[Chunk<T>::kN]) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j) gw_sums[j] = gw_add(gw_sums[j], x.get(j), gy.get(j), s);
}

// gx for one chunk; gy * x_hat of each element is added to gw_sums.
template <typename T, typename Gy>
__device__ __forceinline__ Chunk<T> grad_chunk(const Chunk<T>& x, const Gy& gy, const float (&w)[Chunk<T>::kN],
                                              RowScalars s, float (&gw_sums)[Chunk<T>::kN]) {
  Chunk<T> gx;
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; j += 2) {
    gw_sums[j] = gw_add(gw_sums[j], x.get(j), gy.get(j), s);
    gw_sums[j + 1] = gw_add(gw_sums[j + 1], x.get(j + 1), gy.get(j + 1), s);
    gx.set2(j, gx_elem(x.get(j), gy.get(j), w[j], s), gx_elem(x.get(j + 1), gy.get(j + 1), w[j + 1], s));
  }
  return gx;
}

// The gw sums' layout. kO == 0: acc[it][j] is column c kN + j (c = m.chunk(it)). kO > 0 (backward_rows_paired,
// the sums by gx's aligned blocks): column c kN - kO + j; chunk 0's first kO positions lie before the row and
// hold nothing, and the row's last kO columns (the block past the last chunk) are in `tail`, held by the thread
// of the last chunk.
template <int kO>
using GwTail = float[kO > 0 ? kO : 1];

// gw sums of one thread's own columns (a CTA or cluster with one row slot):
// its partial for those columns, or gw itself when there is one partial.
template <typename T, int kTpr, bool kClustered, int kCpt, int kO = 0>
__device__ __forceinline__ void emit_thread_gw(const BackwardParams<T>& p, const RowMap<kTpr, kClustered>& m,
                                               const float (&acc)[kCpt][Chunk<T>::kN],
                                               const GwTail<kO>& tail = GwTail<kO>{}) {
  constexpr int kN = Chunk<T>::kN;
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    if (c >= p.chunks) continue;
    if constexpr (kO == 0) {
      emit_gw_chunk<T>(p.gw, m.unit, p.cols, c, acc[it]);
    } else {
      emit_gw_cols<T>(p.gw, m.unit, p.cols, c * kN - kO, acc[it]);
      if (c == p.chunks - 1) emit_gw_cols<T>(p.gw, m.unit, p.cols, p.cols - kO, tail);
    }
  }
}

// ---- kCluster with 16-byte I/O: the cluster exchange overlapped with the next row -------------
// As forward_cluster_pipelined: row k's (sum x^2, sum x w' gy) is pushed to
// every CTA (ClusterExchange); row k + 1's sums are computed; then the wait
// for row k's values, row k + 1's push, and row k's gx and gw terms.
// W: the weight's dtype (T, or float with RMSNORM_FLAG_WEIGHT_F32), passed as T*.
template <typename T, bool kGh, typename W = T>
__device__ __forceinline__ void backward_cluster_pipelined(const BackwardParams<T>& p, uint4* stage,
                                                           RowScratch<float2, plan::kClusterTpr, 1>& scratch,
                                                           ClusterExchange<float2>& exchange) {
  constexpr int kTpr = plan::kClusterTpr;
  constexpr int kCtaThreads = kTpr;
  constexpr int kCpt = plan::kMaxChunksPerThread;
  constexpr int kN = Chunk<T>::kN;
  constexpr int kStage = 2 * kCpt * kCtaThreads;  // uint4 per stage: x, then gy
  const RowMap<kTpr, true> m;
  const int64_t rows = p.rows;
  const int stages = p.stages;
  float acc[kCpt][kN];
#pragma unroll
  for (int it = 0; it < kCpt; ++it)
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[it][j] = 0.0f;
  auto stage_row = [&](int64_t g, int s) {
    uint4* buf = stage + s * kStage;
    stage_group<T, kTpr, true, kCtaThreads, kCpt>(p.x, p.x_stride, rows, p.chunks, p.cols, m, g, 1, buf);
    stage_group<T, kTpr, true, kCtaThreads, kCpt>(p.gy, p.gy_stride, rows, p.chunks, p.cols, m, g, 1,
                                                  buf + kCpt * kCtaThreads);
    cp_async_commit();
  };
  auto x_of = [&](int s, int it) { return as_chunk<T>(stage[s * kStage + it * kCtaThreads + threadIdx.x]); };
  auto gy_of = [&](int s, int it) { return as_chunk<T>(stage[s * kStage + (kCpt + it) * kCtaThreads + threadIdx.x]); };
  exchange.init();
  cluster_sync();  // the mbarriers are initialized before any push
  if (m.unit < rows) {  // uniform over the cluster
    for (int s = 0; s < stages; ++s) stage_row(m.unit + s * m.units, s);
  }
  ThreadWeights<T, kCpt, true, W> wv;
  wv.load(p.w, p.chunks, p.cols, true, p.w_offset, m);
  auto partial = [&](int s) {
    float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      if (m.chunk(it) < p.chunks) {
        float w[kN];
        wv.get(it, w);
        sums = add_chunk_sums(sums, x_of(s, it), gy_of(s, it), w);
      }
    }
    return sums;
  };
  if (m.unit < rows) {
    cp_async_wait(stages - 1);  // row 0
    int parity = 0, st = 0;
    int64_t k = 0;  // this cluster's row count so far
    exchange.push(0, row_sum<kTpr, 1>(partial(0), scratch, parity));
    for (int64_t g = m.unit; g < rows; g += m.units, ++k) {
      const int cur = st;
      st = st + 1 == stages ? 0 : st + 1;
      parity ^= 1;
      const bool has_next = g + m.units < rows;  // uniform over the cluster
      const float given_r = p.rstd != nullptr ? p.rstd[g] : 0.0f;
      float2 next = make_float2(0.0f, 0.0f);
      if (has_next && stages >= 2) {
        cp_async_wait(stages - 2);  // row k + 1 has landed
        next = row_sum<kTpr, 1>(partial(st), scratch, parity);
      }
      const RowScalars s = plain_row_scalars(p, given_r, exchange.wait_sum(k));  // no rescaled path: rstd.cuh
      if (has_next && stages >= 2) exchange.push(k + 1, next);
      T* gxr = p.gx + g * p.gx_stride;
      const T* ghr = p.g_h != nullptr ? p.g_h + g * p.g_h_stride : nullptr;
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        if (c < p.chunks) {
          float w[kN];
          wv.get(it, w);
          store_chunk(gxr, c, p.cols, true,
                      plus_g_h<kGh>(grad_chunk(x_of(cur, it), gy_of(cur, it), w, s, acc[it]), ghr, c, p.cols, true));
        }
      }
      stage_row(g + stages * m.units, cur);  // row k's stage is free
      if (has_next && stages < 2) {
        cp_async_wait(0);
        exchange.push(k + 1, row_sum<kTpr, 1>(partial(st), scratch, parity));
      }
    }
    cp_async_wait(0);
  }
  cluster_sync();  // no CTA exits while pushes to it may be in flight
  if (!p.with_gw) return;
  emit_thread_gw<T>(p, m, acc);
}

// ---- kRows with element I/O: the rows' aligned blocks staged (plan::shifted_stage_bytes) -------
// Starts the cp.async copies of block v = it * kTpr + pos (it = 0..kCpt; v <=
// chunks) of this thread's row of group g: block v holds bytes [16 v, 16 v +
// 16) counted from the row's first byte rounded down to 16, cut at the row's
// end (the rest zero-filled, so elements past cols read as 0). Block 0 also
// holds the bytes before the row's first byte in its aligned 16: they lie in
// the row's allocation (allocations start 16-byte aligned; rmsnorm.h), and
// are discarded by the shift, so it does not matter that in place (gx == gy)
// another row may be writing them. Block kCpt * kTpr (a row of kCpt * kTpr
// chunks, misaligned) goes to extra[slot].
template <typename T, int kTpr, int kCtaThreads, int kCpt>
__device__ __forceinline__ void stage_group_shifted(const T* __restrict__ base, int64_t stride, int64_t rows,
                                                    int chunks, int cols, const RowMap<kTpr, false>& m, int64_t g,
                                                    int slots, uint4* buf, uint4* extra) {
  const int64_t row = g * slots + m.slot;
  if (row >= rows) return;
  const char* r = reinterpret_cast<const char*>(base + row * stride);
  const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(r) & 15);
  const char* r0 = r - shift;
  const int64_t end = shift + static_cast<int64_t>(cols) * static_cast<int64_t>(sizeof(T));  // bytes from r0
#pragma unroll
  for (int it = 0; it <= kCpt; ++it) {
    const int v = it * kTpr + m.pos;
    if (v > chunks) continue;
    const int64_t left = end - int64_t{16} * v;
    const int bytes = left >= 16 ? 16 : left > 0 ? static_cast<int>(left) : 0;
    uint4* dst = it < kCpt ? &buf[it * kCtaThreads + threadIdx.x] : &extra[m.slot];
    cp_async_chunk(dst, bytes > 0 ? r0 + int64_t{16} * v : r0, bytes);
  }
}

// The staged block after this thread's block `it` (the next lane's, the slot's lane 0 one step on, or the extra
// block); and chunk `it` of this thread from staged blocks: its own block and the next, funnel-shifted by the row's
// misalignment `shift` (bytes, 0..15).
// kShift >= 0: the shift is that constant (backward_rows_paired), the window fixed at compile time.
template <int kTpr, int kCtaThreads, int kCpt>
__device__ __forceinline__ uint4 next_block(const uint4* buf, const uint4* extra, int it, int slot, int pos) {
  return pos + 1 < kTpr      ? buf[it * kCtaThreads + threadIdx.x + 1]
         : it + 1 < kCpt ? buf[(it + 1) * kCtaThreads + slot * kTpr]
                         : extra[slot];
}
template <typename T, int kTpr, int kCtaThreads, int kCpt, int kShift = -1>
__device__ __forceinline__ Chunk<T> shifted_chunk(const uint4* buf, const uint4* extra, int it, int slot, int pos,
                                                 int shift) {
  const uint4 lo = buf[it * kCtaThreads + threadIdx.x];
  const uint4 hi = next_block<kTpr, kCtaThreads, kCpt>(buf, extra, it, slot, pos);
  if constexpr (kShift >= 0) return shift_pair<T>(lo, hi, kShift);
  return shift_pair_select<T>(lo, hi, shift);
}

// w' of this thread's columns in backward_rows_paired (offset kO > 0 elements): by chunk (chunk c, for the
// sums, the gw terms and the tail) and by block (block c holds columns c kN - kO .. c kN - kO + kN - 1: the last
// kO columns of chunk c - 1, none for c = 0 as they lie before the row and are never stored, and the first
// kN - kO of chunk c). w's chunk c is held in x's dtype and converted at each use, chunk c - 1 loaded again at
// each use (an L1 hit): with both forms held in fp32 the kernel spilled at 4 chunks per thread (up to 1 KB at
// bf16), with chunks c - 1 and c held in x's dtype up to 632 bytes. The weight is 16-byte aligned and D a
// multiple of kN (plan::backward_paired_rows).
template <typename T, int kO, int kCpt, bool kBarrier>
struct PairedWeights {
  static constexpr int kN = Chunk<T>::kN;
  Chunk<T> cur[kCpt];
  const T* w;
  float offset;
  template <typename Map>
  __device__ __forceinline__ void load(const T* __restrict__ wp, int chunks, float off, const Map& m) {
    w = wp;
    offset = off;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      cur[it] = zero_chunk<T>();
      if (w != nullptr && c < chunks) cur[it] = as_chunk<T>(reinterpret_cast<const uint4*>(w)[c]);
    }
  }
  // cur[it]; with kBarrier through an empty asm, so that its conversions stay in the row loop: hoisted out of it
  // (they do not change from row to row), their fp32 forms spilled (plan::backward_paired_barrier).
  __device__ __forceinline__ Chunk<T> held(int it) const {
    Chunk<T> k = cur[it];
    if constexpr (kBarrier) {
#pragma unroll
      for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(k.w[i]));
    }
    return k;
  }
  __device__ __forceinline__ void chunk(int it, float (&out)[kN]) const {
    held_weights(held(it), w != nullptr, offset, out);
  }
  // The row's last kO columns (the last chunk's, `it`) at positions 0 .. kO - 1, as the block past the last chunk.
  __device__ __forceinline__ void tail(int it, float (&out)[kN]) const {
    const Chunk<T> k = held(it);
#pragma unroll
    for (int q = 0; q < kN; ++q) out[q] = w != nullptr ? (q < kO ? k.get(kN - kO + q) : 0.0f) + offset : 1.0f;
  }
  // c: the chunk (and block) index of `it`.
  __device__ __forceinline__ void block(int it, int c, float (&out)[kN]) const {
    const Chunk<T> prev = w != nullptr && c > 0 ? as_chunk<T>(reinterpret_cast<const uint4*>(w)[c - 1]) : zero_chunk<T>();
    const Chunk<T> k = held(it);
#pragma unroll
    for (int q = 0; q < kN; ++q)
      out[q] = w != nullptr ? (q < kO ? prev.get(kN - kO + q) : k.get(q - kO)) + offset : 1.0f;
  }
};

// gx of a staged misaligned row in gx's aligned 16-byte blocks. A row whose
// gx starts `shift` bytes past a 16-byte boundary (shift > 0) has block v
// (v = 0 .. chunks) holding its columns [v kN - lead, v kN - lead + kN), lead
// = shift / sizeof(T): the last `lead` elements of chunk v - 1 and the first
// kN - lead of chunk v, i.e. bytes [16 - shift, 32 - shift) of the two chunks'
// gx side by side (shift_pair). The owner of chunk v gets chunk v - 1 from the
// lane before it (a shuffle; for a slot's first lane, the slot's last lane's
// previous chunk) and writes block v with one 16-byte store where it lies
// inside the row, by element at the row's ends. Used where a row slot lies in
// one warp (threads per row <= 32).
// Before, a chunk 2 bytes off alignment went out as five stores (2 + 4 + 4 +
// 4 + 2 bytes). gx is computed per chunk as on every path: no bit changes.
// store_gx_block: columns [first, first + kN) of b, those inside [0, cols);
// store_gx_elems: elements [j0, j1) of b only, at columns first + j.
template <typename T>
__device__ __forceinline__ void store_gx_elems(T* __restrict__ row, int first, int j0, int j1, int cols,
                                               const Chunk<T>& b) {
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; ++j)
    if (j >= j0 && j < j1 && first + j >= 0 && first + j < cols) row[first + j] = b.elem(j);
}
template <typename T>
__device__ __forceinline__ void store_gx_block(T* __restrict__ row, int first, int cols, const Chunk<T>& b) {
  constexpr int kN = Chunk<T>::kN;
  if (first >= 0 && first + kN <= cols) {
    store16(row + first, b);
    return;
  }
  store_gx_elems(row, first, 0, kN, cols, b);
}

template <typename T>
__device__ __forceinline__ Chunk<T> shfl_chunk(const Chunk<T>& v, int src_lane) {
  Chunk<T> r;
#pragma unroll
  for (int k = 0; k < 4; ++k) r.w[k] = __shfl_sync(0xffffffffu, v.w[k], src_lane);
  return r;
}

template <typename T>
__device__ __forceinline__ Chunk<T> shfl_up_chunk(const Chunk<T>& v) {
  Chunk<T> r;
#pragma unroll
  for (int k = 0; k < 4; ++k) r.w[k] = __shfl_up_sync(0xffffffffu, v.w[k], 1);
  return r;
}

// The end of the persistent backward: this CTA's (cluster's) gw partial.
// One row slot: each thread's sums are the partial of its columns. Several:
// the slots are added in slot order through the table of plan::combine_index
// in `sums` (the stages' shared memory, written by consecutive threads, read
// without bank conflicts), then each column is written once.
// kO, tail: the sums' layout (GwTail). With kO > 0 the slot's tail goes in the table where its chunk 0's first kO
// positions would be (they hold nothing), and is written from there to the row's last kO columns.
template <typename T, int kTpr, bool kClustered, int kSlots, int kCpt, int kO = 0>
__device__ __forceinline__ void emit_cta_gw(const BackwardParams<T>& p, const RowMap<kTpr, kClustered>& m,
                                            const float (&acc)[kCpt][Chunk<T>::kN], float* sums,
                                            const GwTail<kO>& tail = GwTail<kO>{}) {
  constexpr int kCtaThreads = kTpr * kSlots;
  constexpr int kN = Chunk<T>::kN;
  // The column of position j of chunk c's sums.
  auto column = [&](int c, int j) {
    if constexpr (kO == 0) return c * kN + j;
    return c == 0 && j < kO ? p.cols - kO + j : c * kN - kO + j;
  };
  if constexpr (kSlots == 1) {
    // One slot: this thread's sums are the CTA's (cluster's) partial for its columns.
    emit_thread_gw<T, kTpr, kClustered, kCpt, kO>(p, m, acc, tail);
  } else {
    constexpr int kEs = static_cast<int>(sizeof(T));
    __syncthreads();  // every thread is done with its stages
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
#pragma unroll
      for (int j = 0; j < kN; ++j)
        if (kO == 0 || c != 0 || j >= kO) sums[plan::combine_index(it, j, threadIdx.x, kCtaThreads, kEs)] = acc[it][j];
      if constexpr (kO > 0) {
        if (c == p.chunks - 1)
#pragma unroll
          for (int j = 0; j < kO; ++j)
            sums[plan::combine_index(0, j, m.slot * kTpr, kCtaThreads, kEs)] = tail[j];
      }
    }
    __syncthreads();
    if constexpr (kCpt * kTpr >= kCtaThreads) {
      // At least one chunk per thread (kCpt * kTpr >= the CTA's threads): a thread adds one
      // chunk's kN columns and writes them together (16-byte stores).
      for (int e = threadIdx.x; e < kCpt * kTpr; e += kCtaThreads) {
        const int it = e / kTpr, l = e % kTpr;
        const int c = it * kTpr + l;  // m.chunk(it) of the threads at lane l
        if (c >= p.chunks) continue;
        float v[kN];
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float* a = sums + plan::combine_index(it, j, l, kCtaThreads, kEs);
          v[j] = a[0];
#pragma unroll
          for (int s = 1; s < kSlots; ++s) v[j] += a[s * kTpr];
        }
        if constexpr (kO == 0) {
          emit_gw_chunk<T>(p.gw, m.unit, p.cols, c, v);
        } else {
#pragma unroll
          for (int j = 0; j < kN; ++j) emit_gw<T>(p.gw, m.unit, p.cols, column(c, j), v[j]);
        }
      }
    } else {
      // Fewer chunks than threads: one thread per column, so that more
      // threads share the slot additions (kSlots of them per column).
      for (int e = threadIdx.x; e < kCpt * kTpr * kN; e += kCtaThreads) {
        const int it = e / (kTpr * kN), l = (e / kN) % kTpr, j = e % kN;
        const int c = it * kTpr + l;
        if (c * kN + (kO > 0 ? 0 : j) >= p.cols) continue;  // with kO > 0, D is a multiple of kN
        const int col = column(c, j);
        const float* a = sums + plan::combine_index(it, j, l, kCtaThreads, kEs);
        float v = a[0];
#pragma unroll
        for (int s = 1; s < kSlots; ++s) v += a[s * kTpr];
        emit_gw<T>(p.gw, m.unit, p.cols, col, v);
      }
    }
  }
}

// ---- kBackwardRowsSplit: gw by columns -------------------------------------------------------
// CTA `block` of the gw CTAs (plan.hpp, kBackwardRowsSplit) of a backward whose direct kernel has `count` CTAs
// (partials) of kSlots row slots: chunks block * n .. block * n + n - 1 of every row, n =
// plan::split_gw_chunks_per_cta(kCta, lanes), lanes = plan::finalize_lanes(count). It forms gw as the direct
// kernel and finalize_gw_kernel do, operation for operation: partial b of a column is the direct kernel's slot
// sum (slot 0's term, then + each later slot's, a term being 0 + gy * (x * rstd), an empty slot 0); thread
// (chunk i, lane y) adds partials y, y + lanes, .. as the finalize's lane y does (batches of kFinalizeBatch, 0 past
// count); the lanes' sums go through the finalize's butterfly. So gw has the two-kernel path's bits. Every
// row's x, gy and rstd are loaded before the first is used (at most kSplitMaxRowsPerThread rows).
// sums: plan::split_gw_smem(kCta, lanes, sizeof(T)) bytes.
template <typename T, bool kPartial, int kCta, int kSlots>
__device__ __forceinline__ void split_gw_columns(const BackwardParams<T>& p, int64_t count, int block, float* sums) {
  constexpr int kN = Chunk<T>::kN;
  constexpr int kB = plan::kFinalizeBatch;
  // This thread's partials are b_m = y + m lanes (m = 0, 1, ..), at most kM of them (the plan's bound on a gw
  // thread's rows), their rows b_m kSlots + s held in registers: all loaded first, then added in order.
  constexpr int kM = plan::kSplitMaxRowsPerThread / kSlots;
  constexpr int kRows = kM * kSlots;
  constexpr int kBatches = (kM + kB - 1) / kB;
  static_assert(kM >= 1, "plan: kSplitMaxSlots <= kSplitMaxRowsPerThread");
  const int lanes_n = plan::finalize_lanes(count);
  const int per_cta = plan::split_gw_chunks_per_cta(kCta, lanes_n);
  const int cols_n = per_cta * kN;  // this CTA's columns
  const int stride = cols_n + 1;
  const int ci = static_cast<int>(threadIdx.x) % per_cta;
  const int y = static_cast<int>(threadIdx.x) / per_cta;
  const int c = block * per_cta + ci;
  const bool own = c < p.chunks;
  Chunk<T> xs[kRows], gys[kRows];
  float rs[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t row = (y + int64_t{i / kSlots} * lanes_n) * kSlots + i % kSlots;
    xs[i] = zero_chunk<T>();
    gys[i] = zero_chunk<T>();
    rs[i] = 0.0f;
    if (own && row < p.rows) {
      xs[i] = load_row_chunk<kPartial>(p.x + row * p.x_stride, c, p.cols);
      gys[i] = load_row_chunk<kPartial>(p.gy + row * p.gy_stride, c, p.cols);
      rs[i] = p.rstd[row];
    }
  }
  float v[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) v[j] = 0.0f;
  if (own) {
#pragma unroll
    for (int n = 0; n < kBatches; ++n) {
      if (y + int64_t{n} * kB * lanes_n >= count) break;  // the finalize's lane y has no batch n
      // The finalize's batch n: its kB partials added in order, 0 for those past count.
#pragma unroll
      for (int k = 0; k < kB; ++k) {
        const int m = n * kB + k;
        const int64_t b = y + int64_t{m} * lanes_n;
        float t[kN];
#pragma unroll
        for (int j = 0; j < kN; ++j) t[j] = 0.0f;
        if (m < kM && b < count) {
          // Partial b: the direct kernel's CTA b, its slots added in slot order, a slot's term 0 + gy (x rstd),
          // an empty slot (a row past the last) 0.
#pragma unroll
          for (int s = 0; s < kSlots; ++s) {
            const int i = (m < kM ? m : 0) * kSlots + s;
            const bool live = b * kSlots + s < p.rows;
#pragma unroll
            for (int j = 0; j < kN; ++j) {
              float a = 0.0f;
              if (live) {
                const float xh = xs[i].get(j) * rs[i];
                a += gys[i].get(j) * xh;
              }
              t[j] = s == 0 ? a : t[j] + a;
            }
          }
        }
#pragma unroll
        for (int j = 0; j < kN; ++j) v[j] += t[j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) sums[y * stride + ci * kN + j] = v[j];
  __syncthreads();
  // As the finalize: warp w adds columns w, w + warps, ..; lane x holds lane x's sum (0 past lanes_n).
  const int warp = static_cast<int>(threadIdx.x) / plan::kWarp, lane = static_cast<int>(threadIdx.x) % plan::kWarp;
  constexpr int kWarps = kCta / plan::kWarp;
  for (int col = warp; col < cols_n; col += kWarps) {
    float total = lane < lanes_n ? sums[lane * stride + col] : 0.0f;
#pragma unroll
    for (int off = plan::kWarp / 2; off > 0; off /= 2) total += __shfl_down_sync(0xffffffffu, total, off);
    const int64_t out_col = int64_t{block} * cols_n + col;
    if (lane == 0 && out_col < p.cols) store_gw_final<T>(p.gw, out_col, total);
  }
}

// ---- kRows with 16-byte I/O and at most one row group per CTA: registers only -----------------
// Where the plan gives every CTA at most one row group (few rows: decode),
// nothing is left to pipeline: each thread loads its x, gy and w chunks at
// once into registers, the row's two sums go through the same reduction as
// in backward_kernel, and gx and the gw terms follow. The gw partial of a
// CTA is its slots' sums added in slot order (emit_cta_gw, dynamic shared
// memory plan::backward_combine_smem). Each thread owns the same chunks and
// sums them in the same order as backward_kernel, so every bit is the same.
// kPartial: D is not a multiple of the chunk width (the last chunk by
// element); without it the kernel holds no element path (a decode call runs
// from a cold instruction cache: forward_rows_direct_kernel).
// W: the weight's dtype, T or (RMSNORM_FLAG_WEIGHT_F32 with 16-bit x) float, passed in p.w and held as
// HeldWeight chunks (chunk_io.cuh). kCpt: the plan's chunks per thread.
// kDecode: plan::Kernel::kBackwardRowsDecode, a CTA of backward_decode_cta_threads(kTpr) threads holding every row.
// kSplit: plan::Kernel::kBackwardRowsSplit: the CTAs past the row groups compute gw by columns
// (split_gw_columns), the row groups' CTAs gx alone.
template <typename T, int kTpr, int kCpt, bool kPartial, typename W = T, bool kDecode = false, bool kSplit = false>
__global__ void __launch_bounds__(kDecode ? plan::backward_decode_cta_threads(kTpr) : plan::backward_cta_threads(kTpr),
                                  plan::kBackwardCtasPerSm)
    backward_rows_direct_kernel(const BackwardParams<T> p) {
  constexpr int kCtaThreads = kDecode ? plan::backward_decode_cta_threads(kTpr) : plan::backward_cta_threads(kTpr);
  constexpr int kSlots = kCtaThreads / kTpr;
  constexpr int kN = Chunk<T>::kN;
  static_assert(kCpt == plan::kFewChunksPerThread || kCpt == plan::kMaxChunksPerThread, "plan: chunks per thread");
  static_assert(kSlots * kTpr == kCtaThreads, "plan: rows_per_cta * threads_per_row == cta_threads");
  static_assert(kTpr <= plan::kMaxRowsTpr, "plan: threads per row");
  static_assert(kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  __shared__ RowScratch<float2, kTpr, kSlots> scratch;
  static_assert(!(kDecode && kSplit), "plan: a decode backward has one partial");
  static_assert(!kSplit || kSlots <= plan::kSplitMaxSlots, "plan: the split gw threads' rows");
  extern __shared__ uint4 combine[];  // plan::backward_combine_smem bytes (kSplit: plan::split_gw_smem)
  pdl_enter();
  if constexpr (kSplit) {
    const int64_t count = (p.rows + kSlots - 1) / kSlots;  // the row groups' CTAs: the direct kernel's grid
    if (blockIdx.x >= count) {
      split_gw_columns<T, kPartial, kCtaThreads, kSlots>(p, count, static_cast<int>(blockIdx.x - count),
                                                         reinterpret_cast<float*>(combine));
      return;
    }
  }
  const RowMap<kTpr, false> m;
  const int64_t row = m.unit * kSlots + m.slot;  // the plan: one group per CTA
  const bool valid = row < p.rows;
  Chunk<T> xr[kCpt], gyr[kCpt];
  HeldWeight<T, W> wr[kCpt];
  const W* const wp = reinterpret_cast<const W*>(p.w);
  const T* xrow = p.x + row * p.x_stride;
  const T* gyrow = p.gy + row * p.gy_stride;
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    if (valid && c < p.chunks) {
      xr[it] = load_row_chunk<kPartial>(xrow, c, p.cols);
      gyr[it] = load_row_chunk<kPartial>(gyrow, c, p.cols);
    }
    // x's dtype through p.w itself: with the W* copy ptxas rematerialized the pointer from the parameter bank in
    // the partial chunk's element path.
    if constexpr (std::is_same_v<W, T>) {
      if (p.w != nullptr && c < p.chunks) wr[it] = load_row_chunk<kPartial>(p.w, c, p.cols);
    } else {
      if (wp != nullptr && c < p.chunks) wr[it] = load_row_weight<kPartial, T, W>(wp, c, p.cols);
    }
  }
  const float given_r = p.rstd != nullptr && valid ? p.rstd[row] : 0.0f;
  auto w_of = [&](int it, float (&w)[kN]) { held_weights(wr[it], p.w != nullptr, p.w_offset, w); };
  float acc[kCpt][kN];
#pragma unroll
  for (int it = 0; it < kCpt; ++it)
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[it][j] = 0.0f;
  float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    if (valid && m.chunk(it) < p.chunks) {
      float w[kN];
      w_of(it, w);
      sums = add_chunk_sums(sums, xr[it], gyr[it], w);
    }
  }
  sums = row_sum<kTpr, kSlots>(sums, scratch, 0);
  if (valid) {
    const RowScalars s = plain_row_scalars(p, given_r, sums);  // no rescaled path in this band (rstd.cuh)
    T* const gxr = held_address(p.gx + row * p.gx_stride);
    const T* ghr = p.g_h != nullptr ? p.g_h + row * p.g_h_stride : nullptr;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      if (c < p.chunks) {
        float w[kN];
        w_of(it, w);
        store_row_chunk<kPartial>(gxr, c, p.cols,
                                  plus_g_h<true>(grad_chunk(xr[it], gyr[it], w, s, acc[it]), ghr, c, p.cols, true));
      }
    }
  }
  if constexpr (kSplit) return;  // gw: the column CTAs
  if (!p.with_gw) return;
  emit_cta_gw<T, kTpr, false, kSlots>(p, m, acc, reinterpret_cast<float*>(combine));
}

// ---- kRows and kCluster: persistent, x and gy staged, gw sums in registers --------------------
// kClustered == false: rows_per_cta row slots of kTpr threads per CTA, one
// CTA per SM. kClustered == true: one row per cluster, kTpr threads per CTA.
// kVec: x and gy through the cp.async pipeline (see forward_kernel; stage
// layout uint4 [stages][x, gy][kCpt][kCtaThreads]); otherwise, in the rows band,
// the same pipeline over each row's aligned blocks (stage_group_shifted;
// layout [stages][x, gy][kCpt][kCtaThreads] then [x extra, gy extra][kSlots]), and
// in the cluster band element I/O into registers.
// Each thread keeps the fp32 gw sums of its own columns in registers; at the
// end the row slots' sums are added in slot order through shared memory.
// kGh: g_h may be added (plus_g_h); the rows band always passes true.
// W: the weight's dtype, T or (RMSNORM_FLAG_WEIGHT_F32 with 16-bit x) float, passed in p.w.
// kCpt: the plan's chunks per thread (kMaxChunksPerThread in the cluster band).
// kPairedO > 0: backward_rows_paired alone, at that offset (plan::backward_paired_per_offset); 0: the offset of
// backward_rows_paired from p.paired_offset, where the kernel holds that path.
template <typename T, int kTpr, int kCpt, bool kClustered, bool kVec, bool kGh, typename W = T, int kPairedO = 0>
__global__ void __launch_bounds__(plan::backward_cta_threads(kTpr), plan::kBackwardCtasPerSm)
    backward_kernel(const BackwardParams<T> p) {
  constexpr int kCtaThreads = plan::backward_cta_threads(kTpr);
  constexpr int kSlots = kCtaThreads / kTpr;
  constexpr int kN = Chunk<T>::kN;
  static_assert(kCpt == plan::kFewChunksPerThread || kCpt == plan::kMaxChunksPerThread, "plan: chunks per thread");
  static_assert(!kClustered || kCpt == plan::kMaxChunksPerThread, "plan: the cluster band's chunks per thread");
  static_assert(kSlots * kTpr == kCtaThreads, "plan: rows_per_cta * threads_per_row == cta_threads");
  static_assert(!kClustered || (kTpr == plan::kClusterTpr && kSlots == 1), "plan: cluster CTAs hold one row slot");
  static_assert(kTpr <= plan::kMaxRowsTpr, "plan: threads per row");
  static_assert(kClustered || kGh, "the rows band has one instantiation, g_h tested at run time");
  static_assert(kPairedO == 0 || (!kClustered && !kVec && std::is_same_v<W, T> && kPairedO < plan::vec_elems(sizeof(T)) &&
                                  plan::backward_paired_per_offset(kTpr, kCpt, sizeof(T))),
                "plan: one kernel per offset only where backward_paired_per_offset");
  static_assert(kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  static_assert(plan::stage_bytes(kCtaThreads, 2, kCpt) == 2 * sizeof(uint4) * kCpt * kCtaThreads, "plan: stage size");
  static_assert(plan::backward_combine_smem(kTpr, sizeof(T), kCpt) ==
                    (kSlots == 1 ? 0 : sizeof(float) * plan::combine_stride(kCtaThreads, sizeof(T)) * kCpt * kN),
                "plan: gw slot sum");
  __shared__ RowScratch<float2, kTpr, kSlots> scratch;
  __shared__ float2 exchange[2];
  extern __shared__ uint4 stage[];  // cp.async stages; at the end, the gw slot sum
  constexpr bool kShifted = !kVec && !kClustered;  // element I/O through staged aligned blocks
  static_assert(plan::shifted_stage_bytes(kCtaThreads, kSlots, 2, kCpt) ==
                    2 * sizeof(uint4) * (kCpt * kCtaThreads + kSlots),
                "plan: shifted stage size");
  constexpr int kStage = kShifted ? 2 * (kCpt * kCtaThreads + kSlots) : 2 * kCpt * kCtaThreads;  // uint4 per stage
  constexpr int kOperand = kShifted ? kCpt * kCtaThreads + kSlots : kCpt * kCtaThreads;         // gy's offset in a stage

  pdl_enter();
  if constexpr (kClustered && kVec) {
    __shared__ ClusterExchange<float2> pushed;
    backward_cluster_pipelined<T, kGh, W>(p, stage, scratch, pushed);
    return;
  }
  const RowMap<kTpr, kClustered> m;
  const bool with_gw = p.with_gw;
  const int64_t groups = (p.rows + kSlots - 1) / kSlots;
  const int stages = p.stages;
  float acc[kCpt][kN];
#pragma unroll
  for (int it = 0; it < kCpt; ++it)
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[it][j] = 0.0f;

  auto stage_rows = [&](int64_t g, int s) {
    uint4* buf = stage + s * kStage;
    if constexpr (kShifted) {
      stage_group_shifted<T, kTpr, kCtaThreads, kCpt>(p.x, p.x_stride, p.rows, p.chunks, p.cols, m, g, kSlots, buf,
                                                      buf + kCpt * kCtaThreads);
      stage_group_shifted<T, kTpr, kCtaThreads, kCpt>(p.gy, p.gy_stride, p.rows, p.chunks, p.cols, m, g, kSlots,
                                                      buf + kOperand, buf + kOperand + kCpt * kCtaThreads);
    } else {
      stage_group<T, kTpr, kClustered, kCtaThreads, kCpt>(p.x, p.x_stride, p.rows, p.chunks, p.cols, m, g, kSlots,
                                                          buf);
      stage_group<T, kTpr, kClustered, kCtaThreads, kCpt>(p.gy, p.gy_stride, p.rows, p.chunks, p.cols, m, g, kSlots,
                                                          buf + kOperand);
    }
    cp_async_commit();
  };
  if constexpr (kVec || kShifted)
    for (int s = 0; s + 1 < stages; ++s) stage_rows(m.unit + s * m.units, s);
  // w' of this thread's columns, fp32, loaded once (see forward_kernel); the
  // cluster band's element I/O reloads it (its registers hold x and gy).
  ThreadWeights<T, kCpt, kVec || kShifted, W> wv;
  wv.load(p.w, p.chunks, p.cols, kVec, p.w_offset, m);
  int parity = 0, st = 0;
  // backward_rows_paired (p.paired_offset): every operand's every row at one offset kO > 0 (elements), the chunks'
  // shifts constants, gx computed and stored in gx's aligned blocks. Its own row loop: with the run-time loop below
  // turned into a lambda over the offset, the 16-bit 4-chunk kernels at <= 32 threads per row spilled 8 bytes and
  // ran 3% slower (docs/performance.md, "Misaligned backward: the offset as a constant").
  constexpr bool kPairedPath =
      kShifted && std::is_same_v<W, T> && (kPairedO > 0 || !plan::backward_paired_per_offset(kTpr, kCpt, sizeof(T)));
  if constexpr (kPairedPath) {
    auto paired_rows = [&](auto ko) {
      constexpr int kO = decltype(ko)::value;
      constexpr int kShift = kO * static_cast<int>(sizeof(T));  // bytes
      PairedWeights<T, kO, kCpt, plan::backward_paired_barrier(kTpr, kCpt, std::is_same_v<T, __half>)> pw;
      pw.load(p.w, p.chunks, p.w_offset, m);
      float tail[kO];  // the gw sums of the row's last kO columns (GwTail)
#pragma unroll
      for (int q = 0; q < kO; ++q) tail[q] = 0.0f;
      for (int64_t g = m.unit; g < groups; g += m.units, parity ^= 1) {
        const int64_t row = g * kSlots + m.slot;
        const bool valid = row < p.rows;
        const float given_r = p.rstd != nullptr && valid ? p.rstd[row] : 0.0f;
        const uint4* cur = stage + st * kStage;
        // The shifted staging's order of waits and barriers (the run-time loop below).
        if (stages >= 2) {
          cp_async_wait(stages - 2);
          slot_sync_any<kTpr, kSlots>(m.slot);
          stage_rows(g + (stages - 1) * m.units, st == 0 ? stages - 1 : st - 1);
        } else {
          slot_sync_any<kTpr, kSlots>(m.slot);
          stage_rows(g, st);
          cp_async_wait(0);
          slot_sync_any<kTpr, kSlots>(m.slot);
        }
        st = st + 1 == stages ? 0 : st + 1;
        auto x_of = [&](int it) {
          return shifted_chunk<T, kTpr, kCtaThreads, kCpt, kShift>(cur, cur + kCpt * kCtaThreads, it, m.slot, m.pos, 0);
        };
        auto gy_of = [&](int it) {
          return shifted_chunk<T, kTpr, kCtaThreads, kCpt, kShift>(cur + kOperand, cur + kOperand + kCpt * kCtaThreads,
                                                                  it, m.slot, m.pos, 0);
        };
        float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int it = 0; it < kCpt; ++it) {
          const int c = m.chunk(it);
          if (valid && c < p.chunks) {
            float w[kN];
            pw.chunk(it, w);
            sums = add_chunk_sums(sums, x_of(it), gy_of(it), w);
          }
        }
        sums = row_sum<kTpr, kSlots>(sums, scratch, parity);
        if (!valid) continue;
        // gx and the gw terms in gx's aligned blocks, each from the thread's own staged x and gy blocks and
        // PairedWeights' w' by block: x_hat once per element, and the same expressions as by chunk (the same bits).
        // So the gw sums are kept by block (GwTail): block 0's first kO positions lie before the row (their terms
        // are never written), and the row's last kO columns (the block past the last chunk, next_block) go to
        // `tail`. gx's block 0 from column 0 and the tail by store_span. With g_h, each block's g_h is loaded by
        // the thread that stores that block, before it does (g_h may be gx). No rescaled path in this band
        // (rstd.cuh).
        const RowScalars s = plain_row_scalars(p, given_r, sums);
        T* const gxr = p.gx + row * p.gx_stride;
        const T* ghr = p.g_h != nullptr ? p.g_h + row * p.g_h_stride : nullptr;
#pragma unroll
        for (int it = 0; it < kCpt; ++it) {
          const int c = m.chunk(it);
          if (c >= p.chunks) continue;
          float wb[kN];
          pw.block(it, c, wb);
          Chunk<T> b = grad_chunk(as_chunk<T>(cur[it * kCtaThreads + threadIdx.x]),
                                  as_chunk<T>(cur[kOperand + it * kCtaThreads + threadIdx.x]), wb, s, acc[it]);
          if (c > 0) {
            if (ghr != nullptr) b = add_g_h(b, as_chunk<T>(*reinterpret_cast<const uint4*>(ghr - kO + c * kN)));
            store16(gxr - kO + c * kN, b);
          } else {
            if (ghr != nullptr) {
              Chunk<T> h = zero_chunk<T>();
              load_span<T, kO, kN>(ghr - kO, h);
              b = add_g_h(b, h);
            }
            store_span<T, kO, kN>(gxr - kO, b);
          }
          if (c == p.chunks - 1) {
            const Chunk<T> xt = as_chunk<T>(next_block<kTpr, kCtaThreads, kCpt>(cur, cur + kCpt * kCtaThreads, it,
                                                                                m.slot, m.pos));
            const Chunk<T> gyt = as_chunk<T>(next_block<kTpr, kCtaThreads, kCpt>(
                cur + kOperand, cur + kOperand + kCpt * kCtaThreads, it, m.slot, m.pos));
            float wt[kN];
            pw.tail(it, wt);
            Chunk<T> t = gx_chunk(xt, gyt, wt, s);
#pragma unroll
            for (int q = 0; q < kO; ++q) tail[q] = gw_add(tail[q], xt.get(q), gyt.get(q), s);
            if (ghr != nullptr) {
              Chunk<T> h = zero_chunk<T>();
              load_span<T, 0, kO>(ghr + p.cols - kO, h);
              t = add_g_h(t, h);
            }
            store_span<T, 0, kO>(gxr + p.cols - kO, t);
          }
        }
      }
      cp_async_wait(0);  // the groups staged past the last row are empty
      if (with_gw) emit_cta_gw<T, kTpr, false, kSlots, kCpt, kO>(p, m, acc, reinterpret_cast<float*>(stage), tail);
    };
    if constexpr (kPairedO > 0) {
      paired_rows(std::integral_constant<int, kPairedO>{});
    } else if (p.paired_offset > 0) {
      with_nonzero_offset<T>(p.paired_offset, paired_rows);
      return;
    }
  }
  // The run-time offsets: every path but backward_rows_paired's (none in a kernel per offset).
  if constexpr (kPairedO == 0) {
    for (int64_t g = m.unit; g < groups; g += m.units, parity ^= 1) {
      const int64_t row = g * kSlots + m.slot;
      const bool valid = row < p.rows;
      const float given_r = p.rstd != nullptr && valid ? p.rstd[row] : 0.0f;
      // Element I/O (cluster band): x and gy in registers. Otherwise read
      // from the stage where used, before and again after the reduction, so
      // that nothing is held in registers across it (held, the fp32 copies
      // spilled at bf16).
      Chunk<T> xr[kVec || kShifted ? 1 : kCpt], gyr[kVec || kShifted ? 1 : kCpt];
      const uint4* cur = stage + st * kStage;
      int x_shift = 0, gy_shift = 0;
      if constexpr (kVec) {
        stage_rows(g + (stages - 1) * m.units, st == 0 ? stages - 1 : st - 1);
        cp_async_wait(stages - 1);
        st = st + 1 == stages ? 0 : st + 1;
      } else if constexpr (kShifted) {
        // A chunk reads a neighbour's block: every copy of the slot's row must
        // have landed (wait, then the slot's barrier), and a stage is refilled
        // only after that barrier, when the slot is done with its last row.
        if (stages >= 2) {
          cp_async_wait(stages - 2);
          slot_sync_any<kTpr, kSlots>(m.slot);
          stage_rows(g + (stages - 1) * m.units, st == 0 ? stages - 1 : st - 1);
        } else {
          slot_sync_any<kTpr, kSlots>(m.slot);
          stage_rows(g, st);
          cp_async_wait(0);
          slot_sync_any<kTpr, kSlots>(m.slot);
        }
        st = st + 1 == stages ? 0 : st + 1;
        x_shift = static_cast<int>(reinterpret_cast<uintptr_t>(p.x + row * p.x_stride) & 15);
        gy_shift = static_cast<int>(reinterpret_cast<uintptr_t>(p.gy + row * p.gy_stride) & 15);
      } else {
        load_group(p.x, p.x_stride, p.rows, p.chunks, p.cols, false, m, g, kSlots, xr);
        load_group(p.gy, p.gy_stride, p.rows, p.chunks, p.cols, false, m, g, kSlots, gyr);
      }
      auto x_of = [&](int it) {
        if constexpr (kVec)
          return as_chunk<T>(cur[it * kCtaThreads + threadIdx.x]);
        else if constexpr (kShifted)
          return shifted_chunk<T, kTpr, kCtaThreads, kCpt>(cur, cur + kCpt * kCtaThreads, it, m.slot, m.pos, x_shift);
        else
          return xr[it];
      };
      auto gy_of = [&](int it) {
        if constexpr (kVec)
          return as_chunk<T>(cur[kOperand + it * kCtaThreads + threadIdx.x]);
        else if constexpr (kShifted)
          return shifted_chunk<T, kTpr, kCtaThreads, kCpt>(cur + kOperand, cur + kOperand + kCpt * kCtaThreads, it, m.slot,
                                                           m.pos,
                                                gy_shift);
        else
          return gyr[it];
      };
      float2 sums = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        if (valid && c < p.chunks) {
          float w[kN];
          wv.get(it, w);
          sums = add_chunk_sums(sums, x_of(it), gy_of(it), w);
        }
      }
      sums = row_sum<kTpr, kSlots>(sums, scratch, parity);
      if constexpr (kClustered) sums = cluster_sum(sums, exchange, parity);
      // No rescaled path in this band (rstd.cuh).
      if constexpr (kShifted && kTpr <= 32) {
        // gx in gx's aligned blocks (store_gx_block) where a row slot lies in
        // one warp (threads per row <= 32). Every thread takes part in the
        // shuffles, whether its row is valid or not. With more threads per row
        // the blocks at warp boundaries needed their halves written by element,
        // and the A/B lost there (f32 base + 1 element 0.87x, odd row length
        // 0.95x; docs/performance.md, "Misaligned backward: gx exchange").
        const RowScalars s = plain_row_scalars(p, given_r, sums);
        T* gxr = p.gx + row * p.gx_stride;
        const T* ghr = p.g_h != nullptr ? p.g_h + row * p.g_h_stride : nullptr;
        const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(gxr) & 15);
        const int lead = shift / static_cast<int>(sizeof(T));  // columns of block v before chunk v
        const int lane = static_cast<int>(threadIdx.x) & 31;
        const int last = lane | (kTpr - 1);  // the slot's last lane
        Chunk<T> before;                      // this thread's gx of the previous step
#pragma unroll
        for (int it = 0; it < kCpt; ++it) {
          const int c = m.chunk(it);
          Chunk<T> g;
#pragma unroll
          for (int k = 0; k < 4; ++k) g.w[k] = 0;
          if (valid && c < p.chunks) {
            float w[kN];
            wv.get(it, w);
            g = plus_g_h<kGh>(grad_chunk(x_of(it), gy_of(it), w, s, acc[it]), ghr, c, p.cols, false);
          }
          // Chunk c - 1: the lane before's chunk, or for the slot's first lane
          // the slot's last lane's chunk of the step before.
          Chunk<T> prev = shfl_up_chunk(g);
          const Chunk<T> wrap = shfl_chunk(it > 0 ? before : g, last);
          if (m.pos == 0) prev = wrap;
          before = g;
          if (!valid || c >= p.chunks) continue;
          if (shift == 0) {
            store_gx_block(gxr, c * kN, p.cols, g);
            continue;
          }
          store_gx_block(gxr, c * kN - lead, p.cols, shift_pair(prev, g, 16 - shift));
          // The row's last block: the last chunk's tail.
          if (c == p.chunks - 1) store_gx_elems(gxr, c * kN, kN - lead, kN, p.cols, g);
        }
      } else if (valid) {
        const RowScalars s = plain_row_scalars(p, given_r, sums);
        T* gxr = p.gx + row * p.gx_stride;
        const T* ghr = p.g_h != nullptr ? p.g_h + row * p.g_h_stride : nullptr;
#pragma unroll
        for (int it = 0; it < kCpt; ++it) {
          const int c = m.chunk(it);
          if (c < p.chunks) {
            const Chunk<T> x = x_of(it), gy = gy_of(it);
            float w[kN];
            wv.get(it, w);
            store_chunk(gxr, c, p.cols, kVec, plus_g_h<kGh>(grad_chunk(x, gy, w, s, acc[it]), ghr, c, p.cols, kVec));
          }
        }
      }
    }
    if constexpr (kVec || kShifted) cp_async_wait(0);  // the groups staged past the last row are empty
    if constexpr (kClustered) cluster_sync();          // keep `exchange` alive until every CTA has read it
    if (!with_gw) return;

    emit_cta_gw<T, kTpr, kClustered, kSlots>(p, m, acc, reinterpret_cast<float*>(stage));
  }
}

// ---- kLooped: any D; x and gy read twice; gw partial kept in this CTA's workspace row ----------
// W: the weight's dtype, passed in p.w (fp32 with 16-bit x, RMSNORM_FLAG_WEIGHT_F32; 16-bit with the fp32
// residual stream's h as x). G: gy's dtype, passed in p.gy and loaded by element (RMSNORM_FLAG_Y_DTYPE; the
// fp32 residual stream's gy in the 16-bit dtype), gy_stride in G's elements.
template <typename T, bool kGh, typename W = T, typename G = T>
__global__ void __launch_bounds__(plan::kLoopedThreads) backward_looped_kernel(const BackwardParams<T> p) {
  constexpr int kCtaThreads = plan::kLoopedThreads;
  constexpr int kN = Chunk<T>::kN;
  __shared__ RowScratch<float2, kCtaThreads, 1> scratch;
  pdl_enter();
  // Each thread touches only the workspace columns of its own chunks, in the
  // same mapping below, so no barrier is needed around these updates.
  float* part = p.with_gw ? p.gw.partials + blockIdx.x * static_cast<int64_t>(p.cols) : nullptr;
  if (part != nullptr)
    for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads)
      for (int j = 0; j < kN; ++j)
        if (c * kN + j < p.cols) part[c * kN + j] = 0.0f;

  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, parity ^= 1) {
    const T* xr = p.x + row * p.x_stride;
    const T* gyr = p.gy + row * p.gy_stride;
    const G* gyr_g = reinterpret_cast<const G*>(p.gy) + row * p.gy_stride;
    auto gy_of = [&](int c) {
      if constexpr (std::is_same_v<G, T>)
        return load_chunk(gyr, c, p.cols, p.vector_io);
      else
        return load_floats<G, kN>(gyr_g, c, p.cols);
    };
    const float given_r = p.rstd != nullptr ? p.rstd[row] : 0.0f;
    float2 sums = make_float2(0.0f, 0.0f);
    for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) {
      float w[kN];
      weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
      sums = add_chunk_sums(sums, load_chunk(xr, c, p.cols, p.vector_io), gy_of(c), w);
    }
    const RowScalars s = cta_row_scalars<kCtaThreads>(
        p, given_r, cta_sum<kCtaThreads>(sums, scratch, parity), scratch,
        [&](float sc) {
          float v = 0.0f;
          for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads)
            v = add_scaled_squares(v, load_chunk(xr, c, p.cols, p.vector_io), sc);
          return v;
        },
        [&](float t) {
          float v = 0.0f;
          for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) {
            float w[kN];
            weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
            v = add_scaled_dot(v, load_chunk(xr, c, p.cols, p.vector_io), gy_of(c), w, t);
          }
          return v;
        });
    T* gxr = p.gx + row * p.gx_stride;
    const T* ghr = p.g_h != nullptr ? p.g_h + row * p.g_h_stride : nullptr;
    for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) {
      float w[kN], a[kN];
#pragma unroll
      for (int j = 0; j < kN; ++j) a[j] = 0.0f;
      weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
      store_chunk(gxr, c, p.cols, p.vector_io,
                  plus_g_h<kGh>(grad_chunk(load_chunk(xr, c, p.cols, p.vector_io), gy_of(c),
                                      w, s, a),
                           ghr, c, p.cols, p.vector_io));
      if (part != nullptr)
        for (int j = 0; j < kN; ++j)
          if (c * kN + j < p.cols) part[c * kN + j] += a[j];
    }
  }
}

// ---- kLooped in shares: fp32 x with a 16-bit gy (RMSNORM_FLAG_Y_DTYPE, the fp32 residual stream) --------
// backward_looped_kernel<float, kGh, W, G>'s arithmetic, bit for bit, at more rows per SM: the row's 1024 summing
// threads are held kShares to a thread by a CTA of kLoopedShareThreads (summing thread v = t + k kCta, chunks v,
// v + 1024, ..), the sums through row_sum_shares (row_sum<1024, 1>'s order), each gw term rounded once and added to
// the CTA's partial in row order, on the same grid (plan::mixed_backward_launch). The 1024-thread kernel fitted
// one CTA per SM (41 registers with g_h), so its second wave of CTAs waited for the first.
// One pass (D <= 4096): x, gy, g_h and w' of the row are held in registers across the reduction (g_h loaded with x
// and gy, not after it) and the CTA's gw partial too, written once at the end. More passes: x and gy are read again
// after the reduction (L1), with g_h and the CTA's workspace partial, a pass's chunks at a time. (g_h
// prefetched into L1 before the reduction cost 4-8% there: H100, 16384 x 7168 and 4096 x 16384, forward and
// backward 1390 -> 1337 and 1133 -> 1048 us without it.)
// kVec (plan::f32_shares_vec's rows: one pass, every access a whole vector): the same with the element paths
// compiled out.
template <typename T, bool kGh, typename W, typename G, bool kVec = false>
__global__ void __launch_bounds__(plan::kLoopedShareThreads, plan::kLoopedCtasPerSm)
    backward_looped_shares_kernel(const BackwardParams<T> p) {
  constexpr int kCta = plan::kLoopedShareThreads;
  constexpr int kSum = plan::kLoopedThreads;
  constexpr int kShares = kSum / kCta;
  constexpr int kN = Chunk<T>::kN;
  static_assert(kShares * kCta == kSum && kCta % 32 == 0, "plan: the looped row's summing threads in whole warps");
  static_assert(std::is_same_v<T, float> && sizeof(G) == 2 && kN == 4, "fp32 x in chunks of 4, a 16-bit gy");
  struct Shares {  // a thread's shares of a rescaled sum
    float v[kShares];
  };
  __shared__ RowScratch<float2, kSum, 1> scratch;
  pdl_enter();
  const int t = static_cast<int>(threadIdx.x);
  const bool one_pass = kVec || p.chunks <= kSum;
  float* part = p.with_gw && !p.gw.direct ? p.gw.partials + blockIdx.x * static_cast<int64_t>(p.cols) : nullptr;
  // The partial of a multi-pass row in shared memory (p.gw_smem): a float4 per chunk, thread t's chunks those
  // congruent to t modulo kCta, read and written by it alone (no barrier), copied to part at the end.
  extern __shared__ float4 shares_gw[];
  const bool gsm = p.gw_smem && part != nullptr && !one_pass;
  if (gsm)
    for (int c = t; c < p.chunks; c += kCta) shares_gw[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  else if (part != nullptr && !one_pass)
    for (int c = t; c < p.chunks; c += kCta)
      for (int j = 0; j < kN; ++j)
        if (c * kN + j < p.cols) part[c * kN + j] = 0.0f;
  float acc[kShares][kN], wh[kShares][kN];
  // kVec: the raw weight held, w' formed from it in each row, so that the first row's loads issue right behind the
  // weight's (w' formed here waited on each chunk's load in turn, before any x load: backward_f32_cluster_kernel).
  Chunk<W> wraw[kShares];
  if constexpr (kVec) weights_vec_raw_n<W>(p.w, t, kCta, p.chunks, p.cols, wraw);
#pragma unroll
  for (int k = 0; k < kShares; ++k) {
    const int c = t + k * kCta;
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[k][j] = 0.0f;
    if (!kVec && one_pass && c < p.chunks) weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, wh[k]);
  }
  auto gy_of = [&](const G* gyr, int c) {
    if constexpr (kVec) return load_quad_whole(gyr, c * kN);
    return load_quad(gyr, c * kN, p.cols, p.gy_vector);
  };
  // gx's chunk c, and with gx_x its rounding to G there.
  auto store_gx = [&](int64_t row, int c, const Chunk<T>& g) {
    if constexpr (kVec)
      store16(p.gx + row * p.gx_stride + c * kN, g);
    else
      store_chunk(p.gx + row * p.gx_stride, c, p.cols, p.vector_io, g);
    if (p.gx_x != nullptr) {
      G* const gxx = static_cast<G*>(p.gx_x) + row * p.gx_x_stride;
      if constexpr (kVec)
        store_quad_whole(gxx, c * kN, g);
      else
        store_quad(gxx, c * kN, p.cols, p.gx_x_vector, g);
    }
  };
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, parity ^= 1) {
    const T* xr = p.x + row * p.x_stride;
    const G* gyr = reinterpret_cast<const G*>(p.gy) + row * p.gy_stride;
    const T* ghr = kGh && p.g_h != nullptr ? p.g_h + row * p.g_h_stride : nullptr;
    const float given_r = p.rstd != nullptr ? p.rstd[row] : 0.0f;
    if constexpr (kVec)
#pragma unroll
      for (int k = 0; k < kShares; ++k) held_weights(wraw[k], p.w != nullptr, p.w_offset, wh[k]);
    float2 sums[kShares];
    Chunk<T> xk[kShares], hk[kShares];
    Chunk<G> gk[kShares];
    // The pass from chunk c0: the shares' chunks of x, gy and (with_gh) g_h into xk, gk and hk, 0 past the row.
    auto load_pass = [&](int c0, bool with_gh) {
#pragma unroll
      for (int k = 0; k < kShares; ++k) {
        const int c = c0 + t + k * kCta;
        xk[k] = zero_chunk<T>();
        gk[k] = zero_chunk<G>();
        hk[k] = zero_chunk<T>();
        if (c < p.chunks) {
          if constexpr (kVec) {
            xk[k] = as_chunk<T>(reinterpret_cast<const uint4*>(xr)[c]);
            if (with_gh && ghr != nullptr) hk[k] = as_chunk<T>(reinterpret_cast<const uint4*>(ghr)[c]);
          } else {
            xk[k] = load_chunk(xr, c, p.cols, p.vector_io);
            if (with_gh && ghr != nullptr) hk[k] = load_chunk(ghr, c, p.cols, p.vector_io);
          }
          gk[k] = gy_of(gyr, c);
        }
      }
    };
#pragma unroll
    for (int k = 0; k < kShares; ++k) sums[k] = make_float2(0.0f, 0.0f);
    for (int c0 = 0; c0 < p.chunks; c0 += kSum) {
      load_pass(c0, one_pass);
#pragma unroll
      for (int k = 0; k < kShares; ++k) {
        const int c = c0 + t + k * kCta;
        if (c < p.chunks) {
          float w[kN];
          if (one_pass) {
#pragma unroll
            for (int j = 0; j < kN; ++j) w[j] = wh[k][j];
          } else {
            weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
          }
          sums[k] = add_chunk_sums(sums[k], xk[k], gk[k], w);
        }
      }
    }
    const float2 total = row_sum_shares<kSum, kCta, kShares>(sums, scratch, parity);
    // cta_row_scalars with the rare sums in shares (summing thread v's terms in v's order).
    auto rare = [&](const Shares& v) { return cta_sum_rare_shares<kSum, kCta, kShares>(v.v, scratch); };
    RowScalars s;
    s.r = p.rstd != nullptr ? given_r : row_rstd(total.x, p.cols, p.eps, rare, [&](float sc) {
      Shares v;
#pragma unroll
      for (int k = 0; k < kShares; ++k) {
        v.v[k] = 0.0f;
        for (int c = t + k * kCta; c < p.chunks; c += kSum)
          v.v[k] = add_scaled_squares(v.v[k], load_chunk(xr, c, p.cols, p.vector_io), sc);
      }
      return v;
    });
    s.c = s.r * (total.y / static_cast<float>(p.cols));
    const float tsc = rms_dot_scale(s.r);
    if (tsc != 1.0f) {
      Shares v;
#pragma unroll
      for (int k = 0; k < kShares; ++k) {
        v.v[k] = 0.0f;
        for (int c = t + k * kCta; c < p.chunks; c += kSum) {
          float w[kN];
          weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
          v.v[k] = add_scaled_dot(v.v[k], load_chunk(xr, c, p.cols, p.vector_io), gy_of(gyr, c), w, tsc);
        }
      }
      s.c = (s.r / tsc) * (rare(v) / static_cast<float>(p.cols));
    }
    if (one_pass) {
#pragma unroll
      for (int k = 0; k < kShares; ++k) {
        const int c = t + k * kCta;
        if (c < p.chunks) {
          float a[kN];
#pragma unroll
          for (int j = 0; j < kN; ++j) a[j] = 0.0f;
          Chunk<T> g = grad_chunk(xk[k], gk[k], wh[k], s, a);
          if (ghr != nullptr) g = add_g_h(g, hk[k]);
          store_gx(row, c, g);
#pragma unroll
          for (int j = 0; j < kN; ++j) acc[k][j] += a[j];
        }
      }
    } else {
      // A pass's kShares chunks at once: every load (x and gy again, g_h, the partial) before any store, so that
      // a thread waits for L1 / L2 once per pass, not once per chunk (gx and the partial could alias the loads
      // for the compiler, which then kept them in order).
      for (int c0 = 0; c0 < p.chunks; c0 += kSum) {
        load_pass(c0, true);
        float pa[kShares][kN];
#pragma unroll
        for (int k = 0; k < kShares; ++k) {
          const int c = c0 + t + k * kCta;
          if (gsm) {
            const float4 v = c < p.chunks ? shares_gw[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            pa[k][0] = v.x, pa[k][1] = v.y, pa[k][2] = v.z, pa[k][3] = v.w;
          } else {
#pragma unroll
            for (int j = 0; j < kN; ++j) pa[k][j] = part != nullptr && c * kN + j < p.cols ? part[c * kN + j] : 0.0f;
          }
        }
#pragma unroll
        for (int k = 0; k < kShares; ++k) {
          const int c = c0 + t + k * kCta;
          if (c >= p.chunks) continue;
          float w[kN], a[kN];
#pragma unroll
          for (int j = 0; j < kN; ++j) a[j] = 0.0f;
          weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
          Chunk<T> g = grad_chunk(xk[k], gk[k], w, s, a);
          if (ghr != nullptr) g = add_g_h(g, hk[k]);
          store_gx(row, c, g);
          if (gsm)
            shares_gw[c] = make_float4(pa[k][0] + a[0], pa[k][1] + a[1], pa[k][2] + a[2], pa[k][3] + a[3]);
          else if (part != nullptr)
#pragma unroll
            for (int j = 0; j < kN; ++j)
              if (c * kN + j < p.cols) part[c * kN + j] = pa[k][j] + a[j];
        }
      }
    }
  }
  if (gsm)
    for (int c = t; c < p.chunks; c += kCta) {
      const float4 v = shares_gw[c];
      const float vs[kN] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < kN; ++j)
        if (c * kN + j < p.cols) part[c * kN + j] = vs[j];
    }
  // One pass: the partial, or with one CTA (plan: direct_gw) gw itself, which the finalize of that one partial
  // would give bit for bit (its sum is 0 + the partial + zeros).
  if (p.with_gw && one_pass)
#pragma unroll
    for (int k = 0; k < kShares; ++k) {
      const int c = t + k * kCta;
      if (c < p.chunks)
        for (int j = 0; j < kN; ++j) {
          if (c * kN + j >= p.cols) continue;
          if (p.gw.direct)
            store_gw_final<W>(p.gw, c * kN + j, acc[k][j]);
          else
            part[c * kN + j] = acc[k][j];
        }
    }
}

// ---- the fp32 backward's rows of 1025..4096 chunks held across a cluster (plan::f32_cluster_backward_launch) -----
// backward_looped_shares_kernel<float, kGh, W, G>'s row where a summing thread has more than one chunk (D
// 4097..16384, every access a whole vector: plan::f32_cluster_vec): a cluster of kLoopedShares CTAs of
// kLoopedShareThreads per row, thread t of CTA q being summing thread v = q kLoopedShareThreads + t with chunks v,
// v + 1024, .. (kPasses at most). It loads them (x and gy) at once and holds them to gx: its two sums in chunk order,
// each warp's butterfly pushed to every CTA of the cluster (ClusterWarpSums of float2), added there in warp order, so
// the totals are row_sum<1024, 1>'s, the shares kernel's. g_h is loaded while the exchange completes. w' of its
// chunks is loaded once and the gw sums of its columns stay in registers across the cluster's rows (each term
// rounded once, then added in row order: the shares kernel's partial). Persistent clusters, one gw partial each; a
// single cluster writes gw itself.
template <bool kGh, typename W, typename G, int kPasses>
__global__ void __launch_bounds__(plan::kLoopedShareThreads, plan::f32_cluster_backward_ctas_per_sm(kPasses))
    backward_f32_cluster_kernel(const BackwardParams<float> p) {
  using T = float;
  constexpr int kCta = plan::kLoopedShareThreads;
  constexpr int kSum = plan::kLoopedThreads;
  constexpr int kCluster = plan::kLoopedShares;
  constexpr int kN = Chunk<T>::kN;
  static_assert(kCluster * kCta == kSum, "plan: a cluster's CTAs are the looped row's summing threads");
  static_assert(kPasses == 2 || kPasses == plan::kF32ClusterMaxPasses, "plan: f32_cluster_passes");
  static_assert(sizeof(G) == 2 && kN == 4, "fp32 x in chunks of 4, a 16-bit gy");
  __shared__ ClusterWarpSums<kSum / 32, kCta / 32, float2> sums;
  sums.init();
  cluster_sync();  // the mbarriers are initialized before any push
  pdl_enter();
  const unsigned rank = cluster_rank();
  const int v = static_cast<int>(rank) * kCta + static_cast<int>(threadIdx.x);  // the summing thread
  const int64_t clusters = gridDim.x / kCluster, unit = blockIdx.x / kCluster;
  int64_t k = 0;  // this cluster's exchanges so far (one per row, more on the rescaled paths)
  auto exchange = [&](float2 share) {
    sums.push(k, rank, group_sum<32>(share));
    return sums.wait_sum(k++);
  };
  // The rescaled paths' sums: one float, the .x of a float2 exchange (the shares kernel's cta_sum_rare_shares).
  auto rare = [&](float share) { return exchange(make_float2(share, 0.0f)).x; };
  // The raw weight of this thread's chunks, held; w' is formed from it where used, so that the first row's x and gy
  // loads issue right behind it (w' formed up front waited on each chunk's load in turn, before any x load).
  Chunk<W> wraw[kPasses];
  weights_vec_raw_n<W>(p.w, v, kSum, p.chunks, p.cols, wraw);
  float acc[kPasses][kN];
#pragma unroll
  for (int j = 0; j < kPasses; ++j)
#pragma unroll
    for (int e = 0; e < kN; ++e) acc[j][e] = 0.0f;
  const bool has_w = p.w != nullptr;
  for (int64_t row = unit; row < p.rows; row += clusters) {
    const T* xr = p.x + row * p.x_stride;
    const G* gyr = reinterpret_cast<const G*>(p.gy) + row * p.gy_stride;
    const T* ghr = kGh && p.g_h != nullptr ? p.g_h + row * p.g_h_stride : nullptr;
    const float given_r = p.rstd != nullptr ? p.rstd[row] : 0.0f;
    Chunk<T> xk[kPasses], hk[kPasses];
    Chunk<G> gk[kPasses];
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int c = v + j * kSum;
      xk[j] = zero_chunk<T>();
      gk[j] = zero_chunk<G>();
      if (c < p.chunks) {
        xk[j] = as_chunk<T>(reinterpret_cast<const uint4*>(xr)[c]);
        gk[j] = load_quad_whole(gyr, c * kN);
      }
    }
    float wh[kPasses][kN];
#pragma unroll
    for (int j = 0; j < kPasses; ++j) held_weights(wraw[j], has_w, p.w_offset, wh[j]);
    float2 share = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < kPasses; ++j)
      if (v + j * kSum < p.chunks) share = add_chunk_sums(share, xk[j], gk[j], wh[j]);
    sums.push(k, rank, group_sum<32>(share));
    // g_h is not in the sums: its loads go out while the exchange completes.
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int c = v + j * kSum;
      hk[j] = zero_chunk<T>();
      if (kGh && ghr != nullptr && c < p.chunks) hk[j] = as_chunk<T>(reinterpret_cast<const uint4*>(ghr)[c]);
    }
    const float2 total = sums.wait_sum(k++);
    RowScalars s;
    s.r = p.rstd != nullptr ? given_r : row_rstd(total.x, p.cols, p.eps, rare, [&](float sc) {
      float a = 0.0f;
#pragma unroll
      for (int j = 0; j < kPasses; ++j)
        if (v + j * kSum < p.chunks) a = add_scaled_squares(a, xk[j], sc);
      return a;
    });
    s.c = s.r * (total.y / static_cast<float>(p.cols));
    const float tsc = rms_dot_scale(s.r);
    if (tsc != 1.0f) {
      float d = 0.0f;
#pragma unroll
      for (int j = 0; j < kPasses; ++j)
        if (v + j * kSum < p.chunks) d = add_scaled_dot(d, xk[j], gk[j], wh[j], tsc);
      s.c = (s.r / tsc) * (rare(d) / static_cast<float>(p.cols));
    }
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int c = v + j * kSum;
      if (c < p.chunks) {
        float a[kN];
#pragma unroll
        for (int e = 0; e < kN; ++e) a[e] = 0.0f;
        Chunk<T> g = grad_chunk(xk[j], gk[j], wh[j], s, a);
        if (kGh && ghr != nullptr) g = add_g_h(g, hk[j]);
        store16(p.gx + row * p.gx_stride + c * kN, g);
        if (p.gx_x != nullptr) store_quad_whole(static_cast<G*>(p.gx_x) + row * p.gx_x_stride, c * kN, g);
#pragma unroll
        for (int e = 0; e < kN; ++e) acc[j][e] += a[e];
      }
    }
  }
  // No cluster barrier at the end: a CTA's last wait saw every push into it land (ClusterWarpSums).
  if (!p.with_gw) return;
  float* part = p.gw.direct ? nullptr : p.gw.partials + unit * static_cast<int64_t>(p.cols);
#pragma unroll
  for (int j = 0; j < kPasses; ++j) {
    const int c = v + j * kSum;
    if (c < p.chunks)
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        if (p.gw.direct)
          store_gw_final<W>(p.gw, c * kN + e, acc[j][e]);
        else
          part[c * kN + e] = acc[j][e];
      }
  }
}

// ---- finalize: gw[col] = sum of the partial rows, in a fixed order ---------------------------
// CTA = 32 columns (threadIdx.x) x L = plan::finalize_lanes(count) lanes
// (threadIdx.y). Lane k adds partials k, k + L, k + 2L, ... in that order,
// loading kFinalizeBatch of them before adding (a lane's loads are
// independent: issued back to back, it waits for L2 once per batch, not once
// per partial). Then each column's L lane sums are added by one warp with a
// fixed shuffle tree. The order depends on the partial count alone: bitwise
// deterministic.
template <typename T>
__global__ void __launch_bounds__(plan::kFinalizeCols * plan::kFinalizeMaxLanes)
    finalize_gw_kernel(const float* __restrict__ partials, int64_t count, int64_t cols, GwOut out) {
  static_assert(plan::kFinalizeMaxLanes == plan::kWarp && plan::kFinalizeCols == plan::kWarp,
                "finalize: a column's lane sums fit one warp");
  constexpr int kB = plan::kFinalizeBatch;
  const int lanes_n = static_cast<int>(blockDim.y);
  __shared__ float lanes[plan::kFinalizeMaxLanes][plan::kFinalizeCols + 1];
  // Launched as a programmatic dependent of the main kernel (sm_90): it may
  // start while that kernel drains; this waits for its completion and memory.
  pdl_enter();
  const int64_t col = int64_t{blockIdx.x} * plan::kFinalizeCols + threadIdx.x;
  float v = 0.0f;
  if (col < cols) {
    for (int64_t b0 = threadIdx.y; b0 < count; b0 += int64_t{kB} * lanes_n) {
      float t[kB];
#pragma unroll
      for (int k = 0; k < kB; ++k) {
        const int64_t b = b0 + int64_t{k} * lanes_n;
        t[k] = b < count ? __ldcg(partials + b * cols + col) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kB; ++k) v += t[k];
    }
  }
  lanes[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  // Warp y adds columns y, y + L, ...: lane x holds lane x's sum (0 past L).
  for (int c = static_cast<int>(threadIdx.y); c < plan::kFinalizeCols; c += lanes_n) {
    float total = static_cast<int>(threadIdx.x) < lanes_n ? lanes[threadIdx.x][c] : 0.0f;
#pragma unroll
    for (int off = plan::kWarp / 2; off > 0; off /= 2) total += __shfl_down_sync(0xffffffffu, total, off);
    const int64_t out_col = int64_t{blockIdx.x} * plan::kFinalizeCols + c;
    if (threadIdx.x == 0 && out_col < cols) store_gw_final<T>(out, out_col, total);
  }
}

// pdl: launched as a programmatic dependent of the previous kernel in the
// stream: the main kernel (its launch overlaps that kernel's tail), or for
// rows == 0 whatever the caller ran before.
template <typename T>
rmsnorm_status_t launch_finalize(const plan::Launch& l, const float* partials, int64_t cols, const GwOut& out,
                                 bool pdl, cudaStream_t stream) {
  const dim3 threads(plan::kFinalizeCols, static_cast<unsigned>(l.finalize_lanes));
  return launch_kernel("finalize_gw", finalize_gw_kernel<T>, l.finalize_grid, threads, 1, 0, pdl, stream, partials,
                       l.partials, cols, out);
}

template <typename T>
BackwardParams<T> backward_params(const BackwardArgs& a, const plan::Launch& l) {
  BackwardParams<T> p;
  p.x = static_cast<const T*>(a.x);
  p.w = static_cast<const T*>(a.weight);
  p.gy = static_cast<const T*>(a.gy);
  p.rstd = a.rstd;
  p.gx = static_cast<T*>(a.gx);
  p.rows = a.rows;
  p.cols = static_cast<int>(a.cols);
  p.chunks = static_cast<int>(l.row.chunks);
  p.x_stride = a.x_stride;
  p.gy_stride = a.gy_stride;
  p.gx_stride = a.gx_stride;
  p.eps = a.eps;
  p.w_offset = a.weight_offset ? 1.0f : -0.0f;  // as the forward's: w + -0 == w
  p.vector_io = l.io == plan::Io::kVector;
  p.with_gw = l.with_gw;
  p.gw.gw = a.gw;
  p.gw.mode = static_cast<int>(a.gw_mode);
  p.gw.partials = static_cast<float*>(a.workspace);
  p.gw.direct = l.direct_gw;
  p.stages = l.stages;
  p.g_h = static_cast<const T*>(a.g_h);
  p.g_h_stride = a.g_h_stride;
  if (l.kernel == plan::Kernel::kBackwardRowsShifted && plan::backward_paired_rows(l.io, a.cols, sizeof(T)))
    p.paired_offset = static_cast<int>((reinterpret_cast<uintptr_t>(a.x) % 16) / sizeof(T));
  return p;
}

// The looped backward for a weight or gy of another dtype than x's T (W, G;
// mixed_backward_launch): T16 x with RMSNORM_FLAG_WEIGHT_F32 and/or
// RMSNORM_FLAG_Y_DTYPE (g_h only with gy in T). fp32 x takes the looped row in
// shares (launch_looped_shares). Other combinations do not occur.
template <typename T, typename Launch>
rmsnorm_status_t launch_looped_mixed(DType wdt, DType gdt, bool gh, Launch&& launch) {
  return dispatch_dtype(wdt, [&](auto wtag) -> rmsnorm_status_t {
    return dispatch_dtype(gdt, [&](auto gtag) -> rmsnorm_status_t {
      using W = decltype(wtag);
      using G = decltype(gtag);
      constexpr bool kTaken = !std::is_same_v<T, float> && (std::is_same_v<W, T> || std::is_same_v<W, float>);
      if constexpr (kTaken) {
        if (!gh) return launch(backward_looped_kernel<T, false, W, G>, plan::kLoopedThreads);
        if constexpr (std::is_same_v<G, T>) return launch(backward_looped_kernel<T, true, W, G>, plan::kLoopedThreads);
      }
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "dtype", "no looped backward for this combination of dtypes");
    });
  });
}

// backward_looped_shares_kernel (plan::mixed_backward_launch's CTA of kLoopedShareThreads): fp32 x with gy of a
// 16-bit dtype G and the weight in G or fp32, with or without g_h.
template <typename T, typename Launch>
rmsnorm_status_t launch_looped_shares(DType wdt, DType gdt, bool gh, bool vec, Launch&& launch) {
  return dispatch_dtype(wdt, [&](auto wtag) -> rmsnorm_status_t {
    return dispatch_dtype(gdt, [&](auto gtag) -> rmsnorm_status_t {
      using W = decltype(wtag);
      using G = decltype(gtag);
      if constexpr (std::is_same_v<T, float> && sizeof(G) == 2 && (std::is_same_v<W, float> || std::is_same_v<W, G>)) {
        if (vec)
          return gh ? launch(backward_looped_shares_kernel<T, true, W, G, true>, plan::kLoopedShareThreads)
                    : launch(backward_looped_shares_kernel<T, false, W, G, true>, plan::kLoopedShareThreads);
        return gh ? launch(backward_looped_shares_kernel<T, true, W, G>, plan::kLoopedShareThreads)
                  : launch(backward_looped_shares_kernel<T, false, W, G>, plan::kLoopedShareThreads);
      }
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "dtype", "no looped backward in shares for this combination of dtypes");
    });
  });
}

// backward_f32_cluster_kernel (plan::f32_cluster_backward_launch): the same dtypes as launch_looped_shares, at
// `passes` chunks per thread.
template <typename T, typename Launch>
rmsnorm_status_t launch_f32_cluster_backward(DType wdt, DType gdt, bool gh, int passes, Launch&& launch) {
  return dispatch_dtype(wdt, [&](auto wtag) -> rmsnorm_status_t {
    return dispatch_dtype(gdt, [&](auto gtag) -> rmsnorm_status_t {
      using W = decltype(wtag);
      using G = decltype(gtag);
      if constexpr (std::is_same_v<T, float> && sizeof(G) == 2 && (std::is_same_v<W, float> || std::is_same_v<W, G>)) {
        constexpr int kCta = plan::kLoopedShareThreads, kMax = plan::kF32ClusterMaxPasses;
        if (passes == 2)
          return gh ? launch(backward_f32_cluster_kernel<true, W, G, 2>, kCta)
                    : launch(backward_f32_cluster_kernel<false, W, G, 2>, kCta);
        if (passes == kMax)
          return gh ? launch(backward_f32_cluster_kernel<true, W, G, kMax>, kCta)
                    : launch(backward_f32_cluster_kernel<false, W, G, kMax>, kCta);
        return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "no fp32 cluster backward at this many passes");
      }
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "dtype", "no fp32 cluster backward for this combination of dtypes");
    });
  });
}

template <typename T>
rmsnorm_status_t launch_backward(const BackwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  constexpr int kEs = static_cast<int>(sizeof(T));
  const DType wdt = weight_dtype_of(a);
  const DType gdt = y_dtype_of(a);
  // gy of another dtype (and the fp32 residual stream's 16-bit weight): the looped kernel's mixed forms at every D;
  // operands of another dtype than x's go by element, so they do not decide the I/O path, but a weight of x's
  // dtype is read by 16-byte vectors on the 16-byte path. An fp32 weight with 16-bit x alone: the plain plan in the
  // rows band, its weight read as fp32 (16-byte vectors on the 16-byte path), else looped
  // (plan::weight_f32_backward_launch).
  const BackwardForm form = backward_form(a.dtype, wdt, gdt);
  const bool mixed = form == BackwardForm::kMixed;
  // The plain form may take one offset for every operand's rows as a constant (plan::backward_io).
  const plan::Io io =
      form == BackwardForm::kPlain
          ? plan::backward_io({{a.x, a.x_stride}, {a.gy, a.gy_stride}, {a.gx, a.gx_stride}, {a.g_h, a.g_h_stride}},
                              a.weight, kEs)
          : plan::io_of({{a.x, a.x_stride},
                         {gdt == a.dtype ? a.gy : nullptr, a.gy_stride},
                         {a.gx, a.gx_stride},
                         {a.g_h, a.g_h_stride},
                         {wdt == a.dtype || form == BackwardForm::kWeightF32 ? a.weight : nullptr, 0}},
                        kEs);
  const bool with_gw = a.gw_mode != GwMode::kNone;
  // fp32 x's 16-bit operands (gy, gx_x, a 16-bit weight) 8-byte aligned: with io, whole vectors everywhere.
  const bool quads = quad_rows(a.gy, a.gy_stride) && (a.gx_x == nullptr || quad_rows(a.gx_x, a.gx_x_stride)) &&
                     (wdt == a.dtype || quad_rows(a.weight, 0));  // quad_rows(null, ..): true
  plan::Launch planned = mixed                                ? plan::mixed_backward_launch(a.rows, a.cols, kEs, io, with_gw, dev)
                         : form == BackwardForm::kWeightF32 ? plan::weight_f32_backward_launch(a.rows, a.cols, kEs, io, with_gw, dev)
                                                            : plan::backward_launch(a.rows, a.cols, kEs, io, with_gw, dev);
  // fp32 x's mixed forms alone (mixed_backward_launch's shares plan); not by the plan's CTA size, which a 16-bit
  // plain plan's rows band can have too.
  const bool f32_cluster = kEs == 4 && mixed && plan::f32_cluster_backward(a.rows, a.cols, io, quads, dev);
  if (f32_cluster) planned = plan::f32_cluster_backward_launch(planned, a.rows, a.cols, dev);
  // gw by column CTAs (plan::split_backward_launch) needs rstd, and gy unchanged while they read it.
  const plan::Launch l =
      !mixed && a.rstd != nullptr && a.gx != a.gy ? plan::split_backward_launch(planned, a.rows, dev) : planned;
  BackwardParams<T> p = backward_params<T>(a, l);
  p.gy_vector = quad_rows(a.gy, a.gy_stride);  // read only where gy is 16-bit (backward_looped_shares_kernel)
  p.gx_x = a.gx_x;
  p.gx_x_stride = a.gx_x_stride;
  p.gx_x_vector = quad_rows(a.gx_x, a.gx_x_stride);
  // backward_looped_shares_kernel's partial in shared memory where the plan gives it (no other kernel of fp32 x's
  // mixed forms has dynamic shared memory: f32_cluster_backward_launch clears it).
  p.gw_smem = mixed && kEs == 4 && l.smem != 0;
  if (a.gx_x != nullptr && l.row.cta_threads != plan::kLoopedShareThreads)
    return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "x's gradient in its dtype from a kernel that does not write it");
  const bool pdl = a.pdl && dev.sm90_code;
  // gw's own dtype (the finalize's stores in the non-F32 modes): the weight's.
  auto finalize = [&](const float* partials, bool finalize_pdl) {
    return dispatch_dtype(wdt, [&](auto wtag) {
      return launch_finalize<decltype(wtag)>(l, partials, a.cols, p.gw, finalize_pdl, stream);
    });
  };
  if (l.grid == 0) {
    // No rows: gw is the empty sum (0). The store modes write zeros; the
    // accumulate modes leave gw as it is, bit for bit (adding 0 would turn
    // -0 into +0 and change NaN payloads), as the CPU backend does.
    const bool store = a.gw_mode == GwMode::kStore || a.gw_mode == GwMode::kStoreF32;
    return store && l.finalize ? finalize(nullptr, pdl) : RMSNORM_STATUS_SUCCESS;
  }
  auto launch = [&](auto kernel, int cta_threads) { return launch_planned(kernel, cta_threads, l, pdl, stream, p); };
  const bool gh = a.g_h != nullptr;
  using plan::Kernel;
  rmsnorm_status_t st = RMSNORM_STATUS_SUCCESS;
  switch (l.kernel) {
    case Kernel::kBackwardRows:
    case Kernel::kBackwardRowsShifted:
    case Kernel::kBackwardRowsDirect:
    case Kernel::kBackwardRowsDecode:
    case Kernel::kBackwardRowsSplit:
      st = dispatch_rows<static_cast<int>(sizeof(T))>(l.row.threads_per_row, l.row.chunks_per_thread, [&](auto tpr, auto cpt) -> rmsnorm_status_t {
        constexpr int kTpr = decltype(tpr)::value;
        constexpr int kCpt = decltype(cpt)::value;
        constexpr int kCta = plan::backward_cta_threads(kTpr);
        // W: the weight's dtype (fp32 with 16-bit x: RMSNORM_FLAG_WEIGHT_F32).
        auto rows_kernels = [&](auto wtag) -> rmsnorm_status_t {
          using W = decltype(wtag);
          const bool partial = a.cols % Chunk<T>::kN != 0;
          if (l.kernel == Kernel::kBackwardRowsDecode) {
            if constexpr (plan::backward_decode_cta_threads(kTpr) < kCta) {
              constexpr int kDecodeCta = plan::backward_decode_cta_threads(kTpr);
              return partial ? launch(backward_rows_direct_kernel<T, kTpr, kCpt, true, W, true>, kDecodeCta)
                             : launch(backward_rows_direct_kernel<T, kTpr, kCpt, false, W, true>, kDecodeCta);
            }
            return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "no decode backward at this threads per row");
          }
          if (l.kernel == Kernel::kBackwardRowsDirect)
            return partial ? launch(backward_rows_direct_kernel<T, kTpr, kCpt, true, W>, kCta)
                           : launch(backward_rows_direct_kernel<T, kTpr, kCpt, false, W>, kCta);
          if (l.kernel == Kernel::kBackwardRowsSplit) {
            // plan::split_backward_launch: at most kSplitMaxSlots row slots per CTA.
            if constexpr (kCta / kTpr <= plan::kSplitMaxSlots)
              return partial ? launch(backward_rows_direct_kernel<T, kTpr, kCpt, true, W, false, true>, kCta)
                             : launch(backward_rows_direct_kernel<T, kTpr, kCpt, false, W, false, true>, kCta);
            return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "gw by columns with more than kSplitMaxSlots row slots");
          }
          if (l.kernel == Kernel::kBackwardRows) return launch(backward_kernel<T, kTpr, kCpt, false, true, true, W>, kCta);
          if constexpr (std::is_same_v<W, T> && plan::backward_paired_per_offset(kTpr, kCpt, sizeof(T))) {
            if (p.paired_offset > 0)
              return with_nonzero_offset_host<T>(p.paired_offset, [&](auto ko) {
                return launch(backward_kernel<T, kTpr, kCpt, false, false, true, W, decltype(ko)::value>, kCta);
              });
          }
          return launch(backward_kernel<T, kTpr, kCpt, false, false, true, W>, kCta);
        };
        return dispatch_weight<T>(form == BackwardForm::kWeightF32, rows_kernels);
      });
      break;
    case Kernel::kBackwardCluster:
    case Kernel::kBackwardClusterElement: {
      // W: the weight's dtype (fp32 with 16-bit x: RMSNORM_FLAG_WEIGHT_F32).
      auto cluster_kernels = [&](auto wtag) -> rmsnorm_status_t {
        using W = decltype(wtag);
        constexpr int kC = plan::kClusterTpr;
        if (l.kernel == Kernel::kBackwardCluster)
          return gh ? launch(backward_kernel<T, kC, plan::kMaxChunksPerThread, true, true, true, W>, kC)
                    : launch(backward_kernel<T, kC, plan::kMaxChunksPerThread, true, true, false, W>, kC);
        return gh ? launch(backward_kernel<T, kC, plan::kMaxChunksPerThread, true, false, true, W>, kC)
                  : launch(backward_kernel<T, kC, plan::kMaxChunksPerThread, true, false, false, W>, kC);
      };
      st = dispatch_weight<T>(form == BackwardForm::kWeightF32, cluster_kernels);
      break;
    }
    case Kernel::kBackwardLooped:
      if (f32_cluster) {
        st = launch_f32_cluster_backward<T>(wdt, gdt, gh, l.row.chunks_per_thread, launch);
      } else if (l.row.cta_threads == plan::kLoopedShareThreads) {
        // Every access a whole vector in a one-pass row: the kernel without its element paths.
        st = launch_looped_shares<T>(wdt, gdt, gh, plan::f32_shares_vec(a.cols, io, quads), launch);
      } else if (form != BackwardForm::kPlain)
        st = launch_looped_mixed<T>(wdt, gdt, gh, launch);
      else
        st = gh ? launch(backward_looped_kernel<T, true>, plan::kLoopedThreads)
                : launch(backward_looped_kernel<T, false>, plan::kLoopedThreads);
      break;
    default:
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan",
                  std::string("no backward launch for ") + plan::kernel_name(l.kernel));
  }
  if (st != RMSNORM_STATUS_SUCCESS) return st;
  // The finalize overlaps the main kernel's tail (PDL), unless RMSNORM_FLAG_NO_PDL.
  return l.finalize ? finalize(p.gw.partials, pdl) : RMSNORM_STATUS_SUCCESS;
}

}  // namespace rmsnorm::cuda
