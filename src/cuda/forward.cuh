// RMSNorm forward.
//
//   r = 1 / sqrt(sum(x^2) / D + eps)      (fp32)
//   y = T(x * r * w')   or   T(T(x * r) * w') with round_xhat
//
// Work split (plan.hpp): each row is owned by threads_per_row threads of one
// CTA (kRows: rows_per_block rows per CTA; kCluster: one row per cluster of
// CTAs), each thread owning up to 4 16-byte chunks, so x is read once and y
// written once. With 16-byte I/O each thread stages its chunks of the next
// row groups through shared memory with cp.async; w' stays in registers for
// the whole kernel. The sum of squares is reduced inside each row's lanes,
// then across the row's warps through a per-row scratch slot, then across
// the cluster's CTAs through distributed shared memory. No scratch is shared
// between rows. kLooped reads x twice.
#pragma once

#include <mutex>

#include "cuda/common.cuh"

namespace rmsnorm::cuda {

template <typename T>
struct ForwardParams {
  const T* x;
  const T* w;  // null: w' = 1
  T* y;
  float* rstd;  // null: not written
  int64_t rows;
  int cols;
  int chunks;
  int64_t x_stride;
  int64_t y_stride;
  float eps;
  float w_offset;  // 1.0f with the Gemma offset, else 0
  bool round_xhat;
  bool vector_io;
  int stages;  // cp.async pipeline depth (16-byte I/O)
  int64_t groups_per_cta;  // > 0: this CTA's row groups are [unit * n, unit * n + n); 0: unit, unit + units, ...
};

// y for one chunk from x, w' (fp32) and r; kRoundXhat: x_hat rounded to T first.
template <typename T, bool kRoundXhat>
__device__ __forceinline__ Pack<T> normalize_chunk(const Pack<T>& x, const float (&w)[Pack<T>::kN], float r) {
  Pack<T> y;
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; j += 2) {
    float o[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float xh = x.get(j + k) * r;
      o[k] = kRoundXhat ? to_float(from_float<T>(xh)) * w[j + k] : xh * w[j + k];
    }
    y.set2(j, o[0], o[1]);
  }
  return y;
}

template <typename T>
__device__ __forceinline__ void store_normalized(T* __restrict__ yr, int chunk, int cols, bool vector_io,
                                                 bool round_xhat, const Pack<T>& x, const float (&w)[Pack<T>::kN],
                                                 float r) {
  if (round_xhat)
    store_chunk(yr, chunk, cols, vector_io, normalize_chunk<T, true>(x, w, r));
  else
    store_chunk(yr, chunk, cols, vector_io, normalize_chunk<T, false>(x, w, r));
}

// y of columns [first, first + kN) (past `cols`: unused), x and w' loaded as
// windows at any alignment.
template <typename T>
__device__ __forceinline__ Pack<T> normalized_window(const T* __restrict__ xr, const T* __restrict__ w, int first,
                                                     int cols, float w_offset, bool round_xhat, float r) {
  float wf[Pack<T>::kN];
  weights_at(w, first, cols, false, w_offset, wf);
  const Pack<T> x = load_window(xr, first, cols);
  return round_xhat ? normalize_chunk<T, true>(x, wf, r) : normalize_chunk<T, false>(x, wf, r);
}

// Element I/O: the y of a thread's chunk `chunk` goes out in y's aligned
// 16-byte blocks (plan::store_head_cols / store_blocks): this thread writes
// block `chunk` (columns that straddle chunks `chunk` and `chunk` + 1), plus
// the head for chunk 0 and the tail for the last chunk, by element. x and w'
// of those columns are loaded again as windows (L1 hits: the row was just
// read), so the chunks held for the row's sum are dead by here: holding them
// as well spilled at 64 registers. Every y is x r w' computed element by
// element as on every path: the split changes no bit. One 16-byte store per
// block, where a chunk 2 bytes off alignment took five.
template <typename T>
__device__ __forceinline__ void store_normalized_blocks(const T* __restrict__ xr, T* __restrict__ yr,
                                                        const T* __restrict__ w, int chunk, int chunks, int cols,
                                                        float w_offset, bool round_xhat, float r) {
  constexpr int kN = Pack<T>::kN;
  const int head = plan::store_head_cols(static_cast<int>(reinterpret_cast<uintptr_t>(yr) & 15), sizeof(T));
  const int blocks = static_cast<int>(plan::store_blocks(cols, head, sizeof(T)));
  auto y_at = [&](int first) { return normalized_window(xr, w, first, cols, w_offset, round_xhat, r); };
  auto store_elems = [&](int first, int n, const Pack<T>& y) {
#pragma unroll
    for (int j = 0; j < kN; ++j)
      if (j < n) yr[first + j] = y.elem(j);
  };
  if (chunk < blocks) {
    const int first = head + chunk * kN;
    store16(yr + first, y_at(first));
  }
  if (chunk == 0 && head > 0) store_elems(0, head < cols ? head : cols, y_at(0));
  if (chunk == chunks - 1) {
    const int tail = head + blocks * kN;
    if (tail < cols) store_elems(tail, cols - tail, y_at(tail));
  }
}

template <typename T>
__device__ __forceinline__ float inv_rms(float sum_sq, int cols, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + eps);
}

// Loads this thread's chunks of row group g (nothing past the rows).
template <typename T, int kTpr, bool kClustered>
__device__ __forceinline__ void load_group(const T* __restrict__ base, int64_t stride, int64_t rows, int chunks,
                                           int cols, bool vector_io, const RowMap<kTpr, kClustered>& m, int64_t g,
                                           int slots, Pack<T> (&out)[plan::kChunksPerThread]) {
  const int64_t row = g * slots + m.slot;
  if (row >= rows) return;
  const T* r = base + row * stride;
#pragma unroll
  for (int it = 0; it < plan::kChunksPerThread; ++it) {
    const int c = m.chunk(it);
    if (c < chunks) out[it] = load_chunk(r, c, cols, vector_io);
  }
}

// Starts the cp.async copies of this thread's chunks of row group g into
// buf[it * kBlock + threadIdx.x]; the caller commits them as one group (an
// empty group past the rows, so that every thread counts groups alike).
template <typename T, int kTpr, bool kClustered, int kBlock>
__device__ __forceinline__ void stage_group(const T* __restrict__ base, int64_t stride, int64_t rows, int chunks,
                                            int cols, const RowMap<kTpr, kClustered>& m, int64_t g, int slots,
                                            uint4* buf) {
  const int64_t row = g * slots + m.slot;
  if (row < rows) {
    const T* r = base + row * stride;
#pragma unroll
    for (int it = 0; it < plan::kChunksPerThread; ++it) {
      const int c = m.chunk(it);
      if (c < chunks) {
        constexpr int kN = Pack<T>::kN;
        const int n = cols - c * kN < kN ? cols - c * kN : kN;
        cp_async_chunk(&buf[it * kBlock + threadIdx.x], r + c * kN, n * static_cast<int>(sizeof(T)));
      }
    }
  }
}

// This thread's share of sum(x^2): one running sum over its elements in
// chunk order (the backward's recompute adds the same terms in the same order).
template <typename T>
__device__ __forceinline__ float add_squares(float ss, const Pack<T>& x) {
#pragma unroll
  for (int j = 0; j < Pack<T>::kN; ++j) ss += x.get(j) * x.get(j);
  return ss;
}

// ---- kCluster with 16-byte I/O: the cluster exchange overlapped with the next row -------------
// A CTA's share of row k's sums is pushed into every CTA of the cluster
// (st.async over distributed shared memory, into slot [k % kDepth][rank]),
// and each push completes the transaction count of the receiving CTA's
// mbarrier for that slot, which its thread 0 armed with expect_tx(n * bytes).
// A CTA waits on its own mbarrier and adds the slots in rank order (the same
// order, so the same bits, in every CTA and as cluster_sum). Measured before:
// with barrier.cluster.arrive.release per row, every thread executed
// MEMBAR.ALL.GPU, which waits for its earlier y stores to complete GPU-wide
// (ncu: 2.1 of 14 cycles between a warp's instructions stalled on membar),
// and the wait.acquire invalidated L1; a push needs neither.
//
// Slot reuse: a CTA pushes row k + 1 only after its wait for row k, which
// needs every CTA's push of row k, which each issues after its barrier of
// row k (row_sum) that its threads pass only after reading row k - 2's
// slots. So when row k + 1's values land in slot (k + 1) % kDepth, the row
// that last used it (k + 1 - kDepth <= k - 2 for kDepth >= 3) has been read,
// and that slot's mbarrier phase has completed and been waited on.
template <typename V>
struct ClusterExchange {
  static constexpr int kDepth = 4;
  alignas(8) unsigned long long bar[kDepth];
  V slot[kDepth][plan::kMaxCluster];

  // Thread 0 initializes; the caller then passes a cluster barrier before any push.
  __device__ __forceinline__ void init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[d])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
  }
  // This CTA's value of row k to every CTA (warp 0; lane r writes to rank r,
  // its own CTA included: st.async may target any CTA of a cluster of > 1).
  __device__ __forceinline__ void push(int64_t k, V v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int d = static_cast<int>(k % kDepth);
    const unsigned n = cluster_size();
    const unsigned lane = threadIdx.x % 32;
    if (threadIdx.x < 32) {
      if (lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar[d])),
                     "r"(static_cast<unsigned>(n * sizeof(V)))
                     : "memory");
      if (lane < n) {
        const unsigned dst = map_rank(smem_u32(&slot[d][cluster_rank()]), lane);
        const unsigned dst_bar = map_rank(smem_u32(&bar[d]), lane);
        store_async(dst, v, dst_bar);
      }
    }
#else
    slot[k % kDepth][0] = v;
#endif
  }
  // Row k's total over the cluster, in rank order (every thread).
  __device__ __forceinline__ V wait_sum(int64_t k) {
    const int d = static_cast<int>(k % kDepth);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned phase = static_cast<unsigned>((k / kDepth) & 1);
    unsigned done = 0;
    do {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(smem_u32(&bar[d])), "r"(phase)
          : "memory");
    } while (done == 0);
    const unsigned n = cluster_size();
    V total = slot[d][0];
    for (unsigned r = 1; r < n; ++r) total = add(total, slot[d][r]);
    return total;
#else
    return slot[d][0];
#endif
  }

 private:
  static __device__ __forceinline__ unsigned smem_u32(const void* ptr) {
    return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
  }
  static __device__ __forceinline__ unsigned map_rank(unsigned addr, unsigned rank) {
    unsigned out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
    return out;
  }
  static __device__ __forceinline__ void store_async(unsigned dst, float v, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(dst), "f"(v),
                 "r"(bar)
                 : "memory");
  }
  static __device__ __forceinline__ void store_async(unsigned dst, float2 v, unsigned bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(dst),
                 "f"(v.x), "f"(v.y), "r"(bar)
                 : "memory");
  }
};

template <typename T>
__device__ __forceinline__ void forward_cluster_pipelined(const ForwardParams<T>& p, uint4* stage,
                                                          RowScratch<float, plan::kClusterTpr, 1>& scratch,
                                                          ClusterExchange<float>& exchange) {
  constexpr int kTpr = plan::kClusterTpr;
  constexpr int kBlock = kTpr;
  constexpr int kCpt = plan::kChunksPerThread;
  constexpr int kStage = kCpt * kBlock;  // uint4 per stage
  const RowMap<kTpr, true> m;
  const int64_t rows = p.rows;  // one row per group
  const int stages = p.stages;
  auto stage_row = [&](int64_t g, int s) {
    stage_group<T, kTpr, true, kBlock>(p.x, p.x_stride, rows, p.chunks, p.cols, m, g, 1, stage + s * kStage);
    cp_async_commit();
  };
  auto x_of = [&](int s, int it) { return pack_of<T>(stage[s * kStage + it * kBlock + threadIdx.x]); };
  auto partial = [&](int s) {
    float ss = 0.0f;
#pragma unroll
    for (int it = 0; it < kCpt; ++it)
      if (m.chunk(it) < p.chunks) ss = add_squares(ss, x_of(s, it));
    return ss;
  };
  exchange.init();
  cluster_sync();               // the mbarriers are initialized before any push
  if (m.unit >= rows) return;  // uniform over the cluster
  // Rows k = 0, 1, ... of this cluster are unit + k * units; row k lives in stage k % stages.
  for (int s = 0; s < stages; ++s) stage_row(m.unit + s * m.units, s);
  ThreadWeights<T, true> wv;
  wv.load(p.w, p.chunks, p.cols, true, p.w_offset, m);
  cp_async_wait(stages - 1);  // row 0
  int parity = 0, st = 0;
  int64_t k = 0;  // this cluster's row count so far
  exchange.push(0, row_sum<kTpr, 1>(partial(0), scratch, parity));
  for (int64_t g = m.unit; g < rows; g += m.units, ++k) {
    const int cur = st;
    st = st + 1 == stages ? 0 : st + 1;
    parity ^= 1;
    const bool has_next = g + m.units < rows;  // uniform over the cluster
    float ss_next = 0.0f;
    if (has_next && stages >= 2) {
      cp_async_wait(stages - 2);  // row k + 1 has landed
      ss_next = row_sum<kTpr, 1>(partial(st), scratch, parity);
    }
    const float r = inv_rms<T>(exchange.wait_sum(k), p.cols, p.eps);
    if (has_next && stages >= 2) exchange.push(k + 1, ss_next);
    if (p.rstd != nullptr && m.pos == 0) p.rstd[g] = r;
    T* yr = p.y + g * p.y_stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      if (c < p.chunks) {
        float w[Pack<T>::kN];
        wv.get(it, w);
        store_normalized(yr, c, p.cols, true, p.round_xhat, x_of(cur, it), w, r);
      }
    }
    // Row k's stage is free: stage row k + stages into it.
    stage_row(g + stages * m.units, cur);
    if (has_next && stages < 2) {  // no room to stage row k + 1 beside row k: it was staged just now
      cp_async_wait(0);
      exchange.push(k + 1, row_sum<kTpr, 1>(partial(st), scratch, parity));
    }
  }
  cp_async_wait(0);
  cluster_sync();  // no CTA exits while pushes to it may be in flight
}

// ---- kRows and kCluster: persistent, x staged through shared memory ---------------------------
// kClustered == false: rows_per_block row slots of kTpr threads per CTA.
// kClustered == true: one row per cluster, kTpr threads per CTA.
// kVec: every operand row is 16-byte aligned: x comes through the cp.async
// pipeline (p.stages row groups deep, dynamic shared memory
// plan::stage_bytes(block, 1) per stage), y and w move as 16-byte vectors.
// Otherwise element I/O straight into registers, no lookahead.
template <typename T, int kTpr, bool kClustered, bool kVec>
__global__ void __launch_bounds__(plan::forward_block(kTpr), plan::forward_blocks_per_sm(kTpr))
    forward_kernel(const ForwardParams<T> p) {
  constexpr int kBlock = plan::forward_block(kTpr);
  constexpr int kSlots = kBlock / kTpr;
  constexpr int kCpt = plan::kChunksPerThread;
  static_assert(kSlots * kTpr == kBlock, "plan: rows_per_block * threads_per_row == block");
  static_assert(!kClustered || (kTpr == plan::kClusterTpr && kSlots == 1), "plan: cluster CTAs hold one row slot");
  static_assert(kTpr <= plan::kMaxRowsTpr, "plan: threads per row");
  static_assert(Pack<T>::kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  static_assert(plan::stage_bytes(kBlock, 1) == sizeof(uint4) * kCpt * kBlock, "plan: stage size");
  __shared__ RowScratch<float, kTpr, kSlots> scratch;
  __shared__ float exchange[2];
  extern __shared__ uint4 stage[];  // [stages][kCpt][kBlock]
  pdl_enter();
  if constexpr (kClustered && kVec) {
    __shared__ ClusterExchange<float> pushed;
    forward_cluster_pipelined<T>(p, stage, scratch, pushed);
    return;
  }
  const RowMap<kTpr, kClustered> m;
  const int64_t groups = (p.rows + kSlots - 1) / kSlots;
  const int stages = p.stages;
  // This CTA's walk over row groups: g0, g0 + step, ... < gend. Only rows
  // below rows_end are staged, so a tile never loads its neighbour's rows.
  const bool tiled = !kClustered && p.groups_per_cta > 0;
  const int64_t g0 = tiled ? m.unit * p.groups_per_cta : m.unit;
  const int64_t step = tiled ? 1 : m.units;
  const int64_t gend = tiled ? (g0 + p.groups_per_cta < groups ? g0 + p.groups_per_cta : groups) : groups;
  const int64_t rows_end = gend * kSlots < p.rows ? gend * kSlots : p.rows;
  if constexpr (kVec)
    for (int s = 0; s + 1 < stages; ++s) {
      stage_group<T, kTpr, kClustered, kBlock>(p.x, p.x_stride, rows_end, p.chunks, p.cols, m, g0 + s * step,
                                               kSlots, stage + s * kCpt * kBlock);
      cp_async_commit();
    }
  // w' of this thread's columns, fp32, loaded once (reloading it per row put
  // an L2 round trip before every row's stores: ncu showed L1 hits of 28%),
  // after the first stages are in flight: its conversion waits for the loads.
  ThreadWeights<T, kVec> wv;
  wv.load(p.w, p.chunks, p.cols, kVec, p.w_offset, m);
  int parity = 0, st = 0;
  for (int64_t g = g0; g < gend; g += step, parity ^= 1) {
    const int64_t row = g * kSlots + m.slot;
    const bool valid = row < p.rows;
    // Element I/O: x in registers. 16-byte I/O: read from the stage where
    // used, before and again after the reduction (nothing held across it).
    Pack<T> xr[kVec ? 1 : kCpt];
    const uint4* cur = stage + st * kCpt * kBlock;
    if constexpr (kVec) {
      // Refill the slot consumed last iteration with the group stages - 1 ahead.
      const int refill = st == 0 ? stages - 1 : st - 1;
      stage_group<T, kTpr, kClustered, kBlock>(p.x, p.x_stride, rows_end, p.chunks, p.cols, m,
                                               g + (stages - 1) * step, kSlots, stage + refill * kCpt * kBlock);
      cp_async_commit();
      cp_async_wait(stages - 1);
      st = st + 1 == stages ? 0 : st + 1;
    } else {
      load_group(p.x, p.x_stride, p.rows, p.chunks, p.cols, false, m, g, kSlots, xr);
    }
    auto x_of = [&](int it) {
      if constexpr (kVec)
        return pack_of<T>(cur[it * kBlock + threadIdx.x]);
      else
        return xr[it];
    };
    float ss = 0.0f;
#pragma unroll
    for (int it = 0; it < kCpt; ++it)
      if (valid && m.chunk(it) < p.chunks) ss = add_squares(ss, x_of(it));
    ss = row_sum<kTpr, kSlots>(ss, scratch, parity);
    if constexpr (kClustered) ss = cluster_sum(ss, exchange, parity);
    if (valid) {
      const float r = inv_rms<T>(ss, p.cols, p.eps);
      if (p.rstd != nullptr && m.pos == 0) p.rstd[row] = r;
      T* yr = p.y + row * p.y_stride;
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        if (c < p.chunks) {
          // Element I/O in the rows band: aligned blocks. The cluster band's element-I/O kernel keeps the
          // per-chunk stores: with the block stores it spilled (208 bytes at 16-bit, 64 registers).
          if constexpr (kVec || kClustered) {
            float w[Pack<T>::kN];
            wv.get(it, w);
            store_normalized(yr, c, p.cols, kVec, p.round_xhat, x_of(it), w, r);
          } else {
            store_normalized_blocks(p.x + row * p.x_stride, yr, p.w, c, p.chunks, p.cols, p.w_offset, p.round_xhat,
                                    r);
          }
        }
      }
    }
  }
  if constexpr (kVec) cp_async_wait(0);      // the groups staged past the last row are empty
  if constexpr (kClustered) cluster_sync();  // keep `exchange` alive until every CTA has read it
}

// Sum over a CTA of kBlock threads (one row slot), result in every thread.
template <int kBlock>
__device__ __forceinline__ float2 cta_sum(float2 v, RowScratch<float2, kBlock, 1>& scratch, int parity) {
  return row_sum<kBlock, 1>(v, scratch, parity);
}

// ---- kLooped: any D, one CTA per row, x read twice ---------------------------------------------
template <typename T>
__global__ void __launch_bounds__(plan::kLoopedThreads) forward_looped_kernel(const ForwardParams<T> p) {
  constexpr int kBlock = plan::kLoopedThreads;
  __shared__ RowScratch<float, kBlock, 1> scratch;
  pdl_enter();
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, parity ^= 1) {
    const T* xr = p.x + row * p.x_stride;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < p.chunks; c += kBlock) ss = add_squares(ss, load_chunk(xr, c, p.cols, p.vector_io));
    const float r = inv_rms<T>(row_sum<kBlock, 1>(ss, scratch, parity), p.cols, p.eps);
    if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = r;
    T* yr = p.y + row * p.y_stride;
    for (int c = threadIdx.x; c < p.chunks; c += kBlock) {
      float w[Pack<T>::kN];
      weights_of(p.w, c, p.cols, p.vector_io, p.w_offset, w);
      store_normalized(yr, c, p.cols, p.vector_io, p.round_xhat, load_chunk(xr, c, p.cols, p.vector_io), w, r);
    }
  }
}

// ---- launch ------------------------------------------------------------------------------------

template <typename Fn>
rmsnorm_status_t dispatch_tpr(int tpr, Fn&& fn) {
  switch (tpr) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    case 16: return fn(std::integral_constant<int, 16>{});
    case 32: return fn(std::integral_constant<int, 32>{});
    case 64: return fn(std::integral_constant<int, 64>{});
    case 128: return fn(std::integral_constant<int, 128>{});
    case 256: return fn(std::integral_constant<int, 256>{});
    case 512: return fn(std::integral_constant<int, 512>{});
  }
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "threads_per_row " + std::to_string(tpr) + " has no kernel");
}

// Every kernel launch of the library: with a cluster dimension when cs > 1,
// as a programmatic dependent of the previous kernel in the stream when pdl
// (both sm_90; the kernel starts with pdl_enter).
template <typename Kernel, typename... Args>
rmsnorm_status_t launch_kernel(Kernel kernel, int64_t grid, dim3 block, int cs, size_t smem, bool pdl,
                               cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cs > plan::kMaxPortableCluster)
    RMSNORM_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (cs > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(cs);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  RMSNORM_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, args...));
  return RMSNORM_STATUS_SUCCESS;
}

template <typename T>
rmsnorm_status_t launch_forward(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  const plan::ForwardLaunch l = plan::forward_launch(a.rows, a.cols, static_cast<int>(sizeof(T)), dev);
  ForwardParams<T> p;
  p.x = static_cast<const T*>(a.x);
  p.w = static_cast<const T*>(a.weight);
  p.y = static_cast<T*>(a.y);
  p.rstd = a.rstd;
  p.rows = a.rows;
  p.cols = static_cast<int>(a.cols);
  p.chunks = static_cast<int>(l.row.chunks);
  p.x_stride = a.x_stride;
  p.y_stride = a.y_stride;
  p.eps = a.eps;
  p.w_offset = a.weight_offset ? 1.0f : 0.0f;
  p.round_xhat = a.round_xhat;
  p.stages = l.stages;
  p.groups_per_cta = l.groups_per_cta;
  const int es = static_cast<int>(sizeof(T));
  p.vector_io = plan::rows_aligned16(a.x, a.x_stride, es) && plan::rows_aligned16(a.y, a.y_stride, es) &&
                plan::rows_aligned16(a.weight, 0, es);
  const bool pdl = a.pdl && dev.sm90_code;
  switch (l.row.band) {
    case plan::Band::kRows:
      return dispatch_tpr(l.row.threads_per_row, [&](auto tpr) -> rmsnorm_status_t {
        constexpr int kTpr = decltype(tpr)::value;
        if (plan::forward_block(kTpr) != l.row.block)
          return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "forward block disagrees with the kernel");
        const auto kernel = p.vector_io ? forward_kernel<T, kTpr, false, true> : forward_kernel<T, kTpr, false, false>;
        const size_t smem = p.vector_io ? l.smem : 0;
        // Function attributes belong to a context: set on every call (host-side only).
        RMSNORM_CUDA_TRY(allow_dynamic_smem(kernel, smem));
        return launch_kernel(kernel, l.grid, plan::forward_block(kTpr), 1, smem, pdl, stream, p);
      });
    case plan::Band::kCluster:
      if (l.row.block != plan::kClusterTpr)
        return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "cluster block disagrees with the kernel");
    {
      const auto kernel = p.vector_io ? forward_kernel<T, plan::kClusterTpr, true, true>
                                      : forward_kernel<T, plan::kClusterTpr, true, false>;
      const size_t smem = p.vector_io ? l.smem : 0;
      RMSNORM_CUDA_TRY(allow_dynamic_smem(kernel, smem));
      return launch_kernel(kernel, l.grid, plan::kClusterTpr, l.row.cluster, smem, pdl, stream, p);
    }
    case plan::Band::kLooped:
      return launch_kernel(forward_looped_kernel<T>, l.grid, plan::kLoopedThreads, 1, 0, pdl, stream, p);
  }
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "unknown band");
}

}  // namespace rmsnorm::cuda
