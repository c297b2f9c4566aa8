// RMSNorm forward.
//
//   r = 1 / sqrt(sum(x^2) / D + eps)      (fp32)
//   y = T(x * r * w')   or   T(T(x * r) * w') with round_xhat
//
// Work split (plan.hpp): each row is owned by threads_per_row threads of one
// CTA (kRows: rows_per_cta rows per CTA; kCluster: one row per cluster of
// CTAs), each thread owning up to 4 16-byte chunks, so x is read once and y
// written once. The rows band's 16-byte path takes one row group per CTA
// and holds its chunks of x and w in registers (forward_rows_direct_kernel);
// the cluster band's 16-byte path is persistent, each thread staging its
// chunks of the next rows through shared memory with cp.async while w' stays
// in registers for the whole kernel. The sum of squares is reduced inside each row's lanes,
// then across the row's warps through a per-row scratch slot, then across
// the cluster's CTAs through distributed shared memory. No scratch is shared
// between rows. kLooped reads x twice.
//
// Which kernel runs for which D and alignment: the dispatch table in plan.hpp.
#pragma once

#include "cuda/launch.hpp"
#include "cuda/quant.cuh"
#include "cuda/row_map.cuh"
#include "cuda/rstd.cuh"
#include "cuda/weights.cuh"

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
  float w_offset;  // w' = w + w_offset: 1.0f with the Gemma offset, else -0.0f (w' = w exactly)
  bool round_xhat;
  bool vector_io;
  int stages;  // cp.async pipeline depth (16-byte I/O)
  int64_t groups_per_cta;  // > 0: this CTA's row groups are [unit * n, unit * n + n); 0: unit, unit + units, ...
  // Residual add (kAdd kernels): h = T(x + res) is stored and normalized in place of x.
  const T* res = nullptr;
  int64_t res_stride = 0;
  T* h = nullptr;
  int64_t h_stride = 0;
};

// The paired forward's parameters: its row order (plan::RowClassOrder, set up on the host; in the kernel's
// parameters, so that its fields take no registers across the row loop) beside the plain ones. A type of its
// own, so that the other kernels' parameters stay as they are (see QuantForwardParams).
template <typename T>
struct PairedForwardParams : ForwardParams<T> {
  plan::RowClassOrder order;
};

// The exact-rows direct forward's y form (plan::forward_rows_exact): kNone, the general kernel (the form a run-time
// branch); kPlain T(x r w); kOffset T(x r (w + offset)); kRound T(T(x r) (w + offset)).
enum class ExactForm { kNone, kPlain, kOffset, kRound };

// The kQuant kernels' parameters: q in place of y. A separate type, so that the
// plain kernels' parameters stay as they were: with QuantParams inside
// ForwardParams, nvcc compiled the plain fp32 rows kernel differently
// (536 SASS instructions against 632) and it ran 6.6% slower at 8192 x 4096
// (A/B on the H200, 2026-12-01).
template <typename T>
struct QuantForwardParams : ForwardParams<T> {
  QuantParams quant;
};
template <typename T, bool kQuant>
using ForwardParamsOf = std::conditional_t<kQuant, QuantForwardParams<T>, ForwardParams<T>>;

// h = T(x + r) element by element (the sum in fp32, one rounding).
template <typename T>
__device__ __forceinline__ Chunk<T> add_chunks(const Chunk<T>& x, const Chunk<T>& r) {
  Chunk<T> h;
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; j += 2) h.set2(j, x.get(j) + r.get(j), x.get(j + 1) + r.get(j + 1));
  return h;
}

// y for one chunk from x, w' (fp32) and r; kRoundXhat: x_hat rounded to T first.
template <typename T, bool kRoundXhat>
__device__ __forceinline__ Chunk<T> normalize_chunk(const Chunk<T>& x, const float (&w)[Chunk<T>::kN], float r) {
  Chunk<T> y;
#pragma unroll
  for (int j = 0; j < Chunk<T>::kN; j += 2) {
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
                                                 bool round_xhat, const Chunk<T>& x, const float (&w)[Chunk<T>::kN],
                                                 float r) {
  if (round_xhat)
    store_chunk(yr, chunk, cols, vector_io, normalize_chunk<T, true>(x, w, r));
  else
    store_chunk(yr, chunk, cols, vector_io, normalize_chunk<T, false>(x, w, r));
}

// y of columns [first, first + kN) (past `cols`: unused), x and w' loaded as
// windows at any alignment.
template <typename T, typename W = T>
__device__ __forceinline__ Chunk<T> normalized_window(const T* __restrict__ xr, const T* __restrict__ w, int first,
                                                     int cols, float w_offset, bool round_xhat, float r) {
  float wf[Chunk<T>::kN];
  weights_at_any<W>(w, first, cols, w_offset, wf);
  const Chunk<T> x = load_window(xr, first, cols);
  return round_xhat ? normalize_chunk<T, true>(x, wf, r) : normalize_chunk<T, false>(x, wf, r);
}

// Element I/O: the y of a thread's chunk `chunk` goes out in y's aligned
// 16-byte blocks (plan::store_head_cols / store_blocks): this thread writes
// block `chunk` (columns that straddle chunks `chunk` and `chunk` + 1), plus
// the head for chunk 0 and the tail for the last chunk, by element. block_x(first)
// gives the x of the block at column `first`: held from the sum where x and y
// share their misalignment (paired_squares), else loaded again as a window
// (an L1 hit: the row was just read). w' is loaded as a window at each use.
// Every y is x r w' computed element by element as on every path: the split
// changes no bit. One 16-byte store per block, where a chunk 2 bytes off
// alignment took five.
// W: the weight's dtype (T, or float with RMSNORM_FLAG_WEIGHT_F32), passed as T*.
template <typename T, typename W, typename BlockX>
__device__ __forceinline__ void store_normalized_blocks(const T* __restrict__ xr, T* __restrict__ yr,
                                                        const T* __restrict__ w, int chunk, int chunks, int cols,
                                                        float w_offset, bool round_xhat, float r,
                                                        const BlockX& block_x) {
  constexpr int kN = Chunk<T>::kN;
  const int head = plan::store_head_cols(static_cast<int>(reinterpret_cast<uintptr_t>(yr) & 15), sizeof(T));
  const int blocks = static_cast<int>(plan::store_blocks(int64_t{cols}, head, sizeof(T)));
  auto y_at = [&](int first) { return normalized_window<T, W>(xr, w, first, cols, w_offset, round_xhat, r); };
  auto store_elems = [&](int first, int n, const Chunk<T>& y) {
#pragma unroll
    for (int j = 0; j < kN; ++j)
      if (j < n) yr[first + j] = y.elem(j);
  };
  if (chunk < blocks) {
    const int first = head + chunk * kN;
    float wf[kN];
    weights_at_any<W>(w, first, cols, w_offset, wf);
    const Chunk<T> x = block_x(first);
    store16(yr + first, round_xhat ? normalize_chunk<T, true>(x, wf, r) : normalize_chunk<T, false>(x, wf, r));
  }
  if (chunk == 0 && head > 0) store_elems(0, head < cols ? head : cols, y_at(0));
  if (chunk == chunks - 1) {
    const int tail = head + blocks * kN;
    if (tail < cols) store_elems(tail, cols - tail, y_at(tail));
  }
}

// The rows band's sum of squares where a row's x starts at the same offset
// in its 16-byte block as its y: x of y's block c (columns head + c kN ..,
// plan::store_blocks) is one aligned 16-byte load, held in held[it] for the
// store; chunk c (the sum's order, as on every path) is blocks c - 1 and c
// funnel-shifted. The row's first chunk (its lower block starts before the
// row) and chunks past the last whole block are loaded as windows
// (load_window: by element where they would leave the row).
template <typename T, typename Map, int kCpt>
__device__ __forceinline__ float paired_squares(const T* __restrict__ xr, const Map& m, int chunks, int cols,
                                                Chunk<T> (&held)[kCpt]) {
  constexpr int kN = Chunk<T>::kN;
  const int offset = static_cast<int>(reinterpret_cast<uintptr_t>(xr) & 15);
  const int head = plan::store_head_cols(offset, sizeof(T));
  const int blocks = static_cast<int>(plan::store_blocks(int64_t{cols}, head, sizeof(T)));
  float ss = 0.0f;
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    if (c < chunks) {
      const uint4* b = reinterpret_cast<const uint4*>(xr + head + c * kN);
      if (c < blocks) held[it] = as_chunk<T>(b[0]);
      Chunk<T> x;
      if (c < blocks && offset == 0)
        x = held[it];
      else if (c < blocks && c > 0)
        x = shift_pair<T>(b[-1], b[0], offset);
      else
        x = load_window(xr, c * kN, cols);
      ss = add_squares(ss, x);
    }
  }
  return ss;
}

// ---- kCluster with 16-byte I/O: the cluster exchange overlapped with the next row -------------
// W: the weight's dtype (T, or float with RMSNORM_FLAG_WEIGHT_F32), passed as T*.
template <typename T, typename W = T>
__device__ __forceinline__ void forward_cluster_pipelined(const ForwardParams<T>& p, uint4* stage,
                                                          RowScratch<float, plan::kClusterTpr, 1>& scratch,
                                                          ClusterExchange<float>& exchange) {
  constexpr int kTpr = plan::kClusterTpr;
  constexpr int kCtaThreads = kTpr;
  constexpr int kCpt = plan::kMaxChunksPerThread;
  constexpr int kStage = kCpt * kCtaThreads;  // uint4 per stage
  const RowMap<kTpr, true> m;
  const int64_t rows = p.rows;  // one row per group
  const int stages = p.stages;
  auto stage_row = [&](int64_t g, int s) {
    stage_group<T, kTpr, true, kCtaThreads, kCpt>(p.x, p.x_stride, rows, p.chunks, p.cols, m, g, 1, stage + s * kStage);
    cp_async_commit();
  };
  auto x_of = [&](int s, int it) { return as_chunk<T>(stage[s * kStage + it * kCtaThreads + threadIdx.x]); };
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
  ThreadWeights<T, kCpt, true, W> wv;
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
    const float r = rms_from_sum(exchange.wait_sum(k), p.cols, p.eps);  // no rescaled path in this band: rstd.cuh
    if (has_next && stages >= 2) exchange.push(k + 1, ss_next);
    if (p.rstd != nullptr && m.pos == 0) p.rstd[g] = r;
    T* yr = p.y + g * p.y_stride;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      if (c < p.chunks) {
        float w[Chunk<T>::kN];
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

// y of one chunk in T, as every forward kernel computes it.
template <typename T>
__device__ __forceinline__ Chunk<T> y_chunk(const Chunk<T>& x, const float (&w)[Chunk<T>::kN], float r,
                                            bool round_xhat) {
  return round_xhat ? normalize_chunk<T, true>(x, w, r) : normalize_chunk<T, false>(x, w, r);
}

// The quantized epilogue of forward_rows_direct_kernel<..., kQuant>: this
// thread's chunks of y (from x and w' in registers) overwrite x; with
// per-row scales the row's max|y| is reduced (every thread of the CTA takes
// part) and lane 0 writes the scale; then q. kQ: the kernel's kind (no branch
// on it in the per-element code).
template <int kTpr, int kSlots, bool kPartial, QuantKind kQ, typename T, typename Map, int kCpt, int kMaxSlots>
__device__ __forceinline__ void quantize_row(const QuantForwardParams<T>& p, Chunk<T> (&xr)[kCpt],
                                             const Chunk<T> (&wr)[kCpt], float ss, int64_t row, bool valid,
                                             const Map& m, RowScratch<AbsMax, kTpr, kMaxSlots>& max_scratch,
                                             int parity, const QuantConsts& qk) {
  static_assert(kMaxSlots == kSlots || quant_per_block(kQ), "the per-row max needs a slot per row");
  constexpr int kN = Chunk<T>::kN;
  constexpr bool kPerRow = quant_per_row(kQ);
  constexpr bool kPerBlock = quant_per_block(kQ);
  const QuantParams& qp = p.quant;
  float absmax = 0.0f;
  // Whole 16-bit chunks: max|y| on packed pairs (PackedRange), folded after the loop.
  constexpr bool kPackedMax = sizeof(T) == 2 && !kPartial;
  [[maybe_unused]] PackedRange<std::conditional_t<sizeof(T) == 2, T, __half>> range;
  if (valid) {
    const float r = rms_from_sum(ss, p.cols, p.eps);  // no rescaled path in this band: rstd.cuh
    if (p.rstd != nullptr && m.pos == 0) p.rstd[row] = r;
    // As in store_direct: every chunk (the ones not held are x = 0, w = 1, so y = 0, which leaves max|y| as it
    // is), a null weight loaded as 1 and no offset then; the offset's add skipped where it is 0 (-0 with a
    // weight, +0 with the null one's 1: w + offset == w, bit for bit), one of the few instructions per element
    // of this issue-bound epilogue.
    const float offset = p.w != nullptr ? p.w_offset : 0.0f;
    auto y_chunks = [&](auto with_offset) {
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        float w[kN];
#pragma unroll
        for (int j = 0; j < kN; ++j) w[j] = decltype(with_offset)::value ? wr[it].get(j) + offset : wr[it].get(j);
        xr[it] = y_chunk(xr[it], w, r, p.round_xhat);
        if constexpr (kPerRow && kPackedMax)
          range.add(xr[it]);
        else if constexpr (kPerRow)
          absmax = chunk_absmax(absmax, xr[it], kPartial ? p.cols - m.chunk(it) * kN : kN);
      }
    };
    if (offset != 0.0f)
      y_chunks(std::true_type{});
    else
      y_chunks(std::false_type{});
    if constexpr (kPerRow && kPackedMax) absmax = range.abs_max(absmax);
  }
  if constexpr (kPerBlock) {
    // A block's chunks at one chunk index are 1 << block_shift consecutive lanes of one row slot (the plan puts
    // a whole number of blocks in a row's threads: plan::quant_fused), so its max|y| is a few shuffles; the
    // blocks of all kCpt indices are reduced together and each lane computes one of their scales
    // (block_absmax_all), which the lanes of a block then read by shuffles. Every thread takes part, valid or
    // not: a slot past the rows holds y = 0 and writes nothing.
    const int shift = qp.block_shift;
    const int lanes = 1 << shift;
    uint8_t* qrow = qp.q + row * qp.q_stride;
    float* srow = qp.row_scales + row * qp.scales_row_stride;
    float chunk_max[kCpt];
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      if constexpr (kPackedMax) {
        PackedRange<T> block;
        block.add(xr[it]);
        chunk_max[it] = block.abs_max(0.0f);
      } else {
        chunk_max[it] = chunk_absmax(0.0f, xr[it], kPartial ? min(kN, p.cols - m.chunk(it) * kN) : kN);
      }
    }
    const BlockMax<kCpt> bm = block_absmax_all(chunk_max, lanes);
    const QuantRow own = per_row_quant(qp, qk, bm.value);
    // One lane of those holding a block's rule writes its scale (the block's first chunk within the row).
    const int first = m.chunk(bm.it) & ~(lanes - 1);
    if (valid && (threadIdx.x & (lanes / kCpt - 1)) == 0 && first < p.chunks)
      srow[(first >> shift) * qp.scales_block_stride] = own.s;
    [[maybe_unused]] const unsigned finite = quant_divides(kQ) ? __ballot_sync(0xffffffffu, own.finite) : 0u;
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      const int n = kPartial ? min(kN, p.cols - c * kN) : kN;
      QuantRow br = own;
      if constexpr (kCpt > 1) {
        const int src = block_rule_lane<kCpt>(it, lanes);
        br.mul = __shfl_sync(0xffffffffu, own.mul, src);
        if constexpr (quant_divides(kQ)) {
          br.s = __shfl_sync(0xffffffffu, own.s, src);
          br.finite = ((finite >> src) & 1u) != 0;
        }
      }
      if (valid && c < p.chunks) store_q_chunk<T>(qrow, c, n, true, quantize_chunk<kQ>(xr[it], br));
    }
    return;
  }
  QuantRow qr;
  if constexpr (kPerRow) {
    absmax = row_sum<kTpr, kSlots>(AbsMax{absmax}, max_scratch, parity).v;
    qr = per_row_quant(qp, qk, absmax);
    if (valid && m.pos == 0) qp.row_scales[row] = qr.s;
  } else {
    qr = qk.fixed;
  }
  if (!valid) return;
  uint8_t* qrow = qp.q + row * qp.q_stride;
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    if (c < p.chunks) {
      const int n = kPartial ? min(kN, p.cols - c * kN) : kN;
      store_q_chunk<T>(qrow, c, n, true, quantize_chunk<kQ>(xr[it], qr));
    }
  }
}

// The direct kernel's y: every chunk computed (branch-free), the chunks this
// thread holds stored; x_hat rounded or not, and the weight offset added or
// not, as branches around the whole. kOffset == false where w' = w exactly
// (offset -0.0f, or a null weight read as 1 with offset +0.0f): the add
// would leave every bit as it is, and it is one of the few instructions per
// element that this issue-bound kernel runs.
template <typename T, bool kRoundXhat, bool kOffset, bool kPartial, typename WC, typename Map, int kCpt>
__device__ __forceinline__ void store_direct(T* __restrict__ yr, const Chunk<T> (&xr)[kCpt], const WC (&wr)[kCpt],
                                             float offset, float r, const Map& m, int chunks, int cols) {
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    float w[Chunk<T>::kN];
#pragma unroll
    for (int j = 0; j < Chunk<T>::kN; ++j) w[j] = kOffset ? wr[it].get(j) + offset : wr[it].get(j);
    const Chunk<T> y = normalize_chunk<T, kRoundXhat>(xr[it], w, r);
    const int c = m.chunk(it);
    if (c < chunks) store_row_chunk<kPartial>(yr, c, cols, y);
  }
}

// ---- kRows with 16-byte I/O: one row group per CTA, the row in registers ----------------------
// No shared-memory stages and no persistence: each CTA loads its rows' x and
// w' chunks (all of them in flight at once), reduces, and stores y; the
// hardware's CTA scheduler keeps plan::forward_threads_per_sm(kTpr, kCpt, kForwardRows) threads per SM
// busy (docs/performance.md, "Forward rows kernel"). Each thread owns the
// same chunks, summed in the same order, as in every other rows-band kernel,
// so r is bitwise the same.
// kPartial: D is not a multiple of the chunk width, so the row's last chunk
// is loaded and stored by element; without it the kernel holds no element
// path at all (a decode call runs once per layer from a cold instruction
// cache, and the unused paths spread the used code over more cache lines).
// kAdd: the residual add fused in (rmsnorm_add_forward): each thread adds its
// residual chunks to its x chunks, stores h = T(x + res) and goes on with h as
// x. A thread reads its x and residual chunks before it writes its h chunks,
// so h == x and h == res are safe.
// kQ: q = quant(y) in place of y (rmsnorm_forward_quant), y computed as
// above; with per-row scales the row's max|y| is reduced like its sum. One
// kernel per kind: with the kinds as run-time branches in one kernel ptxas
// spilled, and the per-element code is what limits this kernel (issue-bound).
// W: the weight's dtype, T or (RMSNORM_FLAG_WEIGHT_F32 with 16-bit x, not quantized) float, passed in p.w and
// held as HeldWeight chunks. kCpt: the plan's chunks per thread. kSumTpr = 2 kTpr: the sum of squares as by a
// row of kSumTpr threads of 2 chunks, each thread two of them (plan::quant_sum_pairs, row_sum_pairs).
// kExact (plan::forward_rows_exact; not kNone: the y form, fixed for the instance): every chunk of each thread lies
// in the row and each CTA takes one row group, so the kernel carries no chunk guard, no row loop and one store
// form. At 128 x 4096 bf16 the three together took 0.16 us off 2.66 us of kernel time (H100, the
// benchmarks' flush; any one of them alone at most 0.04: docs/performance.md, "Exact rows").
template <typename T, int kTpr, int kCpt, bool kPartial, bool kAdd, QuantKind kQ = QuantKind::kNone, typename W = T,
          int kSumTpr = kTpr, ExactForm kExact = ExactForm::kNone>
__global__ void __launch_bounds__(plan::forward_cta_threads(kTpr), plan::forward_ctas_per_sm(kTpr, kCpt, plan::Kernel::kForwardRows))
    forward_rows_direct_kernel(const ForwardParamsOf<T, kQ != QuantKind::kNone> p) {
  constexpr bool kQuant = kQ != QuantKind::kNone;
  static_assert(std::is_same_v<W, T> || !kQuant, "an fp32 weight: the plain and the add forward");
  constexpr bool kIsExact = kExact != ExactForm::kNone;
  static_assert(!kIsExact || (!kPartial && !kQuant && kSumTpr == kTpr),
                "plan: forward_rows_exact is the plain and the add forward's");
  static_assert(kSumTpr == kTpr || (kSumTpr == 2 * kTpr && kSumTpr == plan::kFewChunksTpr &&
                                    kCpt == plan::kMaxChunksPerThread && kQuant),
                "plan: quant_sum_pairs");
  const W* const wp = reinterpret_cast<const W*>(p.w);
  constexpr int kCtaThreads = plan::forward_cta_threads(kTpr);
  constexpr int kSlots = kCtaThreads / kTpr;
  constexpr int kN = Chunk<T>::kN;
  static_assert(kSlots * kTpr == kCtaThreads, "plan: rows_per_cta * threads_per_row == cta_threads");
  static_assert(kTpr <= plan::kMaxRowsTpr, "plan: threads per row");
  static_assert(kCpt == plan::kFewChunksPerThread || kCpt == plan::kMaxChunksPerThread, "plan: chunks per thread");
  static_assert(kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  __shared__ RowScratch<float, kSumTpr, kSlots> scratch;
  __shared__ RowScratch<AbsMax, kTpr, (kQuant && !quant_per_block(kQ)) ? kSlots : 1> max_scratch;
  pdl_enter();
  QuantConsts qk;
  const RowMap<kTpr, false> m;
  const int64_t groups = (p.rows + kSlots - 1) / kSlots;
  int parity = 0;
  for (int64_t g = m.unit; g < groups; g += m.units, parity ^= 1) {
    const int64_t row = g * kSlots + m.slot;
    const bool valid = (kIsExact && kSlots == 1) || row < p.rows;  // exact: g < groups == rows
    // Chunks this thread does not hold (past the row, or a row past the end) read as x = 0 and w = 1, so
    // that every chunk goes through the same straight-line code: the extra terms add +0 to the sum of
    // squares, which leaves its bits as they are, and their y is never stored.
    Chunk<T> xr[kCpt];
    HeldWeight<T, W> wr[kCpt];
    const T* xrow = p.x + row * p.x_stride;
    T* const yrow = held_address(p.y + row * p.y_stride);
    auto load_w = [&] {
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        wr[it] = one_weight<T, W>();
        if (valid && (kIsExact || c < p.chunks) && wp != nullptr)
          wr[it] = load_row_weight<kPartial, T, W>(wp, c, p.cols);
      }
    };
    if constexpr (kAdd) {
      // x and residual first, all in flight at once, then h, then w' (behind the reduction that follows):
      // x, residual and w' held together spilled at 64 registers. Every residual load comes before every h
      // store in program order, so h == residual (the in-place stream update) reads each element before it
      // is overwritten.
      const T* rrow = p.res + row * p.res_stride;
      T* hrow = p.h + row * p.h_stride;
      Chunk<T> rr[kCpt];
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        const bool own = valid && (kIsExact || c < p.chunks);
        xr[it] = zero_chunk<T>();
        rr[it] = zero_chunk<T>();
        if (own) xr[it] = load_row_chunk<kPartial>(xrow, c, p.cols);
        if (own) rr[it] = load_row_chunk<kPartial>(rrow, c, p.cols);
      }
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        xr[it] = add_chunks(xr[it], rr[it]);
        if (valid && (kIsExact || c < p.chunks)) store_row_chunk<kPartial>(hrow, c, p.cols, xr[it]);
      }
      load_w();
    } else {
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        const bool own = valid && (kIsExact || c < p.chunks);
        xr[it] = zero_chunk<T>();
        wr[it] = one_weight<T, W>();
        if (own) xr[it] = load_row_chunk<kPartial>(xrow, c, p.cols);
        if (own && wp != nullptr) wr[it] = load_row_weight<kPartial, T, W>(wp, c, p.cols);
      }
    }
    // The quantization's constants after the first row group's loads: read before them, the scale's own
    // round trip (and the reciprocal that waits for it) came before the first x load was issued. Once per
    // CTA; later row groups keep them.
    if constexpr (kQuant) {
      if (g == m.unit) qk = load_quant_consts(p.quant);
    }
    float ss;
    if constexpr (kSumTpr == kTpr) {
      float part = 0.0f;
#pragma unroll
      for (int it = 0; it < kCpt; ++it) part = add_squares(part, xr[it]);
      ss = row_sum<kTpr, kSlots>(part, scratch, parity);
    } else {
      // Chunk it is pos + it kTpr: thread pos of the kSumTpr row holds it = 0, 2, thread pos + kTpr it = 1, 3.
      const float2 part = make_float2(add_squares(add_squares(0.0f, xr[0]), xr[2]),
                                      add_squares(add_squares(0.0f, xr[1]), xr[3]));
      ss = row_sum_pairs<kSumTpr, kTpr, kSlots>(part, scratch, parity);
    }
    if constexpr (kQuant) {
      if constexpr (std::is_same_v<W, T>)
        quantize_row<kTpr, kSlots, kPartial, kQ>(p, xr, wr, ss, row, valid, m, max_scratch, parity, qk);
      continue;
    }
    if (valid) {
      const float r = rms_from_sum(ss, p.cols, p.eps);  // no rescaled path in this band: rstd.cuh
      if (p.rstd != nullptr && m.pos == 0) p.rstd[row] = r;
      // A null weight was loaded as 1: no offset then.
      const float offset = p.w != nullptr ? p.w_offset : 0.0f;
      const bool add_offset = offset != 0.0f;  // -0.0f == 0.0f
      if constexpr (kIsExact)  // the form's store: x_hat rounded (kRound), the offset added (kOffset, kRound)
        store_direct<T, kExact == ExactForm::kRound, kExact != ExactForm::kPlain, false>(yrow, xr, wr, offset, r, m,
                                                                                       kTpr * kCpt, p.cols);
      else if (p.round_xhat)
        store_direct<T, true, true, kPartial>(yrow, xr, wr, offset, r, m, p.chunks, p.cols);
      else if (add_offset)
        store_direct<T, false, true, kPartial>(yrow, xr, wr, offset, r, m, p.chunks, p.cols);
      else
        store_direct<T, false, false, kPartial>(yrow, xr, wr, offset, r, m, p.chunks, p.cols);
    }
    if constexpr (kIsExact) break;  // the grid is the row groups
  }
}

// ---- kRows, x and y at one offset: one row group per CTA, the offset a constant -------------
// forward_rows_paired_kernel (plan::Kernel::kForwardRowsPaired): where each
// row of x starts at the same offset in its 16-byte block as the same row of
// y, every row at the same offset (plan::Io::kPaired), and the weight is
// 16-byte aligned. A row at offset kO elements (0 <= kO < kN) has kHead =
// (kN - kO) % kN columns before its first 16-byte boundary, then
// plan::store_blocks whole aligned blocks (block b: columns kHead + b kN ..),
// then a tail. Chunk c of the sum (columns c kN .., the order of every other
// path) is the last kN - kO columns of block c - 1 and the first kO of block
// c; the thread that owns chunk c stores y block c, whose w' is the last kO
// columns of w's chunk c and the first kN - kO of chunk c + 1. With kO a
// template constant, taking a chunk's elements out of two blocks is register
// selection (no funnel shifts), and every access but the head's and the
// tail's is one aligned 16-byte load or store; the kernel switches on the
// row's offset once per row (the same branch in every row). Columns
// outside the blocks (the head, the tail, a row shorter than its head) are
// loaded by the owner of their chunk, by element where D is not a multiple
// of kN; they are stored by span (the head by its owner, the tail as one
// partial block by the owner of chunk `blocks`) where
// plan::paired_edge_spans, else by element (store_offset_row). Every x read that
// another thread's y store may overwrite (y == x in place) happens before the
// row's reduction; after it a thread reads only the head and tail columns
// that it alone writes.

// Whole aligned blocks of a row at offset kO, in 32-bit unsigned arithmetic (0 <= cols < 2^31 here).
template <typename T, int kO>
__device__ __forceinline__ int offset_blocks(int cols) {
  constexpr int kN = Chunk<T>::kN;
  return static_cast<int>(plan::store_blocks(static_cast<uint32_t>(cols), (kN - kO) % kN, sizeof(T)));
}

// This thread's part of the row's sum of squares (chunk by chunk, element by
// element, as add_squares), and in held[it] the x of block m.chunk(it) where
// it is whole (y's block, stored after the reduction). Every whole block is
// loaded first, all of them in flight at once (predicated loads, no
// branches), then the columns outside them (the head's and tail's chunks
// only), then the sum. kPartial: D is not a multiple of kN, and the columns
// outside the blocks go by element; without it the head is positions kO.. of
// the block before column 0 and the tail positions ..kO - 1 of the last
// block, each a few aligned accesses (load_span).
template <typename T, int kO, bool kPartial, bool kOneEdge, typename Map, int kCpt>
__device__ __forceinline__ float offset_squares(const T* __restrict__ xr, bool valid, const Map& m, int chunks,
                                                int cols, Chunk<T> (&held)[kCpt]) {
  constexpr int kN = Chunk<T>::kN;
  constexpr int kHead = (kN - kO) % kN;
  const int blocks = offset_blocks<T, kO>(cols);
  // kO > 0: chunk c is block c - 1 (lo, from column kHead + (c - 1) kN; before the row for c = 0) and block c
  // (held). kO == 0: chunk c is block c.
  Chunk<T> lo[kCpt];
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    lo[it] = zero_chunk<T>();
    held[it] = zero_chunk<T>();
    const T* b = xr + kHead + c * kN;  // block c
    if (valid && c < blocks) held[it] = as_chunk<T>(*reinterpret_cast<const uint4*>(b));
    // Chunk 0's lo is the aligned block that holds the row's first element, as in every other chunk (the bytes
    // before the row are read and not used: they lie in the row's allocation, rmsnorm.h), so every thread
    // issues the same loads; with kPartial only where that block lies inside the row (cols >= kN), else by
    // element below.
    if (kO != 0 && valid && (c >= 1 || !kPartial || cols >= kN) && c <= blocks) lo[it] = as_chunk<T>(*reinterpret_cast<const uint4*>(b - kN));
  }
  if constexpr (!kPartial) {
    // kO == 0: every chunk is a block. Else chunk `blocks` (the last) holds the tail: positions ..kO - 1 of
    // block `blocks`. A branch the warp takes together (a vote): predicated, ptxas interleaved the first
    // chunk's squares with the next chunk's loads. Every row a warp holds has this offset
    // (plan::paired_whole_rows), so the whole warp is here.
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      const bool tail = kO != 0 && valid && c == blocks;
      if (__any_sync(0xffffffffu, tail)) {
        if (tail) load_span<T, 0, kO>(xr + kHead + c * kN, held[it]);
      }
    }
  }
  if constexpr (kPartial && kOneEdge) {
    // The chunks past the blocks are `blocks` and blocks + 1 at most, consecutive, so with two or more threads per
    // row (plan::paired_edge_spans) a thread holds one of them at most: its columns loaded by one copy of the code
    // (ce, the thread's first chunk from `blocks` on), then given to the held chunk it is; a copy per held chunk
    // issued every copy's predicates in every thread. Every row holds more than two chunks here, so the head's
    // block is whole (the first loop's).
    const int ce = blocks <= m.pos ? m.pos : m.pos + (blocks - m.pos + m.stride - 1) / m.stride * m.stride;
    if (valid && ce < chunks) {
      const int first = kHead + (ce - 1) * kN;
      const Chunk<T> h = kO == 0 ? load_elems<T, 0, kN>(xr, ce * kN, cols) : load_elems<T, 0, kO>(xr, first + kN, cols);
      const bool past = kO != 0 && ce > blocks;
      const Chunk<T> l = past ? load_elems<T, kO, kN>(xr, first, cols) : zero_chunk<T>();
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        if (m.chunk(it) != ce) continue;
        held[it] = h;
        if (past) lo[it] = l;
      }
    }
  } else {
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      if (!kPartial || !valid || c >= chunks) continue;
      const int first = kHead + (c - 1) * kN;
      if (c >= blocks) held[it] = kO == 0 ? load_elems<T, 0, kN>(xr, c * kN, cols) : load_elems<T, 0, kO>(xr, first + kN, cols);
      // The head (chunk 0: it == 0, pos == 0) with its columns known here, apart from the tail's chunks.
      if (kO != 0 && it == 0 && c == 0 && cols < kN) lo[it] = load_elems<T, kO, kN>(xr, -kO, cols);
      if (kO != 0 && c > blocks) lo[it] = load_elems<T, kO, kN>(xr, first, cols);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    if (!valid || m.chunk(it) >= chunks) continue;
    if constexpr (kO == 0) {
      ss = add_squares(ss, held[it]);
    } else {
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float v = pair_elem(lo[it], held[it], kO + j);
        ss += v * v;
      }
    }
  }
  return ss;
}

// y of one element, as normalize_chunk computes it.
template <typename T, bool kRoundXhat>
__device__ __forceinline__ T y_elem(float x, float w, float r) {
  const float xh = x * r;
  return from_float<T>(kRoundXhat ? to_float(from_float<T>(xh)) * w : xh * w);
}

// y of a row's head (offset kO > 0, the row at least kN columns): chunk 0's first kN - kO columns, positions
// kO.. of the aligned block before column 0, by load_span and store_span. w0: w's chunk 0.
template <typename T, int kO, bool kRoundXhat>
__device__ __forceinline__ void store_head_span(const T* __restrict__ xr, T* __restrict__ yr, const Chunk<T>& w0,
                                                float offset, float r) {
  constexpr int kN = Chunk<T>::kN;
  Chunk<T> x = zero_chunk<T>();
  load_span<T, kO, kN>(xr - kO, x);
  float wf[kN];
#pragma unroll
  for (int q = 0; q < kN; ++q) wf[q] = q >= kO ? w0.get(q - kO) + offset : 0.0f;
  store_span<T, kO, kN>(yr - kO, normalize_chunk<T, kRoundXhat>(x, wf, r));
}

// y of this thread's chunks of one row at offset kO (offset_squares's held blocks): block c by one 16-byte
// store, the head (c = 0) and tail columns of chunk c by store_span, or with kPartial by store_span and
// store_run (kEdgeSpans) or by element. offset: added to w (0 without a weight, which reads as 1). The
// weight's chunks are loaded first, all in flight at once.
template <typename T, int kO, bool kPartial, bool kRoundXhat, bool kEdgeSpans, typename Map, int kCpt>
__device__ __forceinline__ void store_offset_row(const T* __restrict__ xr, T* __restrict__ yr,
                                                 const T* __restrict__ w, float offset, float r, const Map& m,
                                                 int chunks, int cols, const Chunk<T> (&held)[kCpt]) {
  constexpr int kN = Chunk<T>::kN;
  constexpr int kHead = (kN - kO) % kN;
  const int blocks = offset_blocks<T, kO>(cols);
  const int tail = kHead + blocks * kN;  // first column after the blocks
  // wc: w's chunk c; wn: chunk c + 1 (kO > 0; it exists where c < blocks, block c ending inside the row).
  Chunk<T> wc[kCpt], wn[kCpt];
  const bool has_w = w != nullptr;
  // w's chunk c past the blocks (kPartial): one 16-byte load where it is whole (the last chunk where D is a multiple
  // of kN), else by element.
  const auto w_edge_chunk = [&](int c) {
    return (c + 1) * kN <= cols ? as_chunk<T>(reinterpret_cast<const uint4*>(w)[c]) : load_elems<T, 0, kN>(w, c * kN, cols);
  };
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    wc[it] = one_chunk<T>();
    wn[it] = one_chunk<T>();
    if (!kPartial && has_w && c < chunks) {
      // Every chunk of w is whole; chunk c + 1 exists where block c does.
      wc[it] = as_chunk<T>(reinterpret_cast<const uint4*>(w)[c]);
      if (kO != 0 && c < blocks) wn[it] = as_chunk<T>(reinterpret_cast<const uint4*>(w)[c + 1]);
    }
    if (kPartial && has_w && c < blocks) {
      wc[it] = as_chunk<T>(reinterpret_cast<const uint4*>(w)[c]);
      if (kO != 0 && (c + 2) * kN <= cols) wn[it] = as_chunk<T>(reinterpret_cast<const uint4*>(w)[c + 1]);
    }
  }
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    if (!kPartial || !has_w || c >= chunks) continue;
    if (c >= blocks) wc[it] = w_edge_chunk(c);
    if (kO != 0 && c < blocks && (c + 2) * kN > cols) wn[it] = load_elems<T, 0, kN>(w, (c + 1) * kN, cols);
  }
#pragma unroll
  for (int it = 0; it < kCpt; ++it) {
    const int c = m.chunk(it);
    if (c < blocks) {
      float wf[kN];
#pragma unroll
      for (int j = 0; j < kN; ++j) wf[j] = (kO == 0 ? wc[it].get(j) : pair_elem(wc[it], wn[it], kN - kO + j)) + offset;
      store16(yr + kHead + c * kN, normalize_chunk<T, kRoundXhat>(held[it], wf, r));
    }
  }
  if constexpr (!kPartial) {
    // The head is chunk 0's first kHead columns (positions kO.. of the block before column 0), the tail the
    // last chunk's last kO columns (positions ..kO - 1 of block `blocks`). Only this thread reads or writes
    // them.
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      if (kO == 0 || c >= chunks) continue;
      if (c == 0) store_head_span<T, kO, kRoundXhat>(xr, yr, wc[it], offset, r);
      if (c >= blocks) {
        Chunk<T> x = zero_chunk<T>();
        load_span<T, 0, kO>(xr + tail, x);
        float wf[kN];
#pragma unroll
        for (int q = 0; q < kN; ++q) wf[q] = q < kO ? wc[it].get(kN - kO + q) + offset : 0.0f;
        store_span<T, 0, kO>(yr + tail, normalize_chunk<T, kRoundXhat>(x, wf, r));
      }
    }
  } else if constexpr (kEdgeSpans) {
    // Every row holds more than two chunks (plan::paired_edge_spans), so the head is whole: stored by span as
    // above. The tail, columns tail..cols - 1 (fewer than kN: chunk `blocks`'s last kO columns, then chunk
    // blocks + 1's first), is one partial block that the owner of chunk `blocks` alone loads and stores in its
    // widest aligned pieces, w' taken from w's chunks `blocks` (w0) and blocks + 1. The owner of chunk blocks + 1
    // read those x columns before the row's reduction and touches them no more, so x == y in place holds.
    const int len = cols - tail;
    const auto store_tail = [&](const Chunk<T>& w0) {
      Chunk<T> x = zero_chunk<T>();
      load_run<T>(xr + tail, len, x);
      const Chunk<T> w1 = kO != 0 && has_w ? load_elems<T, 0, kN>(w, (blocks + 1) * kN, cols) : one_chunk<T>();
      float wf[kN];
#pragma unroll
      for (int q = 0; q < kN; ++q) wf[q] = q < len ? pair_elem(w0, w1, kHead + q) + offset : 0.0f;
      store_run<T>(yr + tail, len, normalize_chunk<T, kRoundXhat>(x, wf, r));
    };
    // Two forms of the same stores (neither spills: ptxas -v, sm_90): at 2 chunks the head and tail code inside
    // the loop over held chunks, w0 the held chunk, since one copy after the loop took 1.015-1.085x its time at
    // 16-bit (branch exp/one-tail-copy-2; docs/performance.md, "Misaligned forward: what the odd row length
    // costs"); at 4 one copy after it, w0 loaded again from L1, where a copy per held chunk had spilled 428 bytes at
    // f16 (with the row order still computed in the kernel; not measured since).
    if constexpr (kCpt == plan::kFewChunksPerThread) {
#pragma unroll
      for (int it = 0; it < kCpt; ++it) {
        const int c = m.chunk(it);
        if (c >= chunks) continue;
        if (kO != 0 && c == 0) store_head_span<T, kO, kRoundXhat>(xr, yr, wc[it], offset, r);
        if (c == blocks && len > 0) store_tail(wc[it]);
      }
    } else {
      // Chunk 0 can only be a thread's first (m.chunk(it) grows with it).
      if (kO != 0 && m.chunk(0) == 0) store_head_span<T, kO, kRoundXhat>(xr, yr, wc[0], offset, r);
      bool owner = false;
#pragma unroll
      for (int it = 0; it < kCpt; ++it) owner |= m.chunk(it) == blocks;
      if (owner && len > 0) {
        store_tail(has_w ? w_edge_chunk(blocks) : one_chunk<T>());
      }
    }
  } else {
#pragma unroll
    for (int it = 0; it < kCpt; ++it) {
      const int c = m.chunk(it);
      if (c < chunks && ((kO != 0 && c == 0) || c >= blocks)) {
        // The head and tail columns of chunk c: no block holds them, and only this thread reads or writes them.
        const int first = c * kN;
        Chunk<T> x = zero_chunk<T>();
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const int col = first + j;
          if (col < cols && (col < kHead || col >= tail)) x.set_elem(j, xr[col]);
        }
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const int col = first + j;
          if (col < cols && (col < kHead || col >= tail))
            yr[col] = y_elem<T, kRoundXhat>(x.get(j), wc[it].get(j) + offset, r);
        }
      }
    }
  }
}

// The geometry (threads per row, chunks per thread, row slots, grid) is the
// 16-byte rows kernel's: the same chunks per thread, summed in the same
// order, so rstd and y are bitwise that kernel's (Cuda.AlignmentDoesNotChangeBits).
// kPartial: the head and tail loaded by element (offset_squares) and stored by span (plan::paired_edge_spans)
// or by element, where plan::paired_whole_rows is false: D not a multiple of kN, or a warp's rows at
// different offsets (the whole-row form's vote needs them at one).
template <typename T, int kTpr, int kCpt, bool kPartial>
__global__ void __launch_bounds__(plan::forward_cta_threads(kTpr), plan::forward_ctas_per_sm(kTpr, kCpt, plan::Kernel::kForwardRowsPaired))
    forward_rows_paired_kernel(const PairedForwardParams<T> p) {
  constexpr int kCtaThreads = plan::forward_cta_threads(kTpr);
  constexpr int kSlots = kCtaThreads / kTpr;
  static_assert(kSlots * kTpr == kCtaThreads, "plan: rows_per_cta * threads_per_row == cta_threads");
  static_assert(kTpr <= plan::kMaxRowsTpr, "plan: threads per row");
  static_assert(kCpt == plan::kFewChunksPerThread || kCpt == plan::kMaxChunksPerThread, "plan: chunks per thread");
  static_assert(Chunk<T>::kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  constexpr bool kEdgeSpans = kPartial && plan::paired_edge_spans(kTpr);
  __shared__ RowScratch<float, kTpr, kSlots> scratch;
  pdl_enter();
  const RowMap<kTpr, false> m;
  const int64_t groups = (p.rows + kSlots - 1) / kSlots;
  // A null weight reads as 1: no offset then.
  const float offset = p.w != nullptr ? p.w_offset : 0.0f;
  int parity = 0;
  for (int64_t g = m.unit; g < groups; g += m.units, parity ^= 1) {
    // The rows of one offset class, then of the next (p.order): the CTAs that run at once take one or two
    // offsets' code (with rows in order the eight offsets' code ran at once on an SM and lost to the element
    // path: docs/performance.md, "Misaligned forward: the offset as a constant").
    const int64_t row = plan::row_at(p.order, g * kSlots + m.slot, p.rows);
    const bool valid = row < p.rows;
    const T* xrow = p.x + row * p.x_stride;
    T* const yrow = held_address(p.y + row * p.y_stride);
    const int o = static_cast<int>((reinterpret_cast<uintptr_t>(xrow) & 15) / sizeof(T));
    Chunk<T> held[kCpt];
    float part = 0.0f;
    with_row_offset<T>(o, [&](auto k) {
      part = offset_squares<T, decltype(k)::value, kPartial, kEdgeSpans>(xrow, valid, m, p.chunks, p.cols, held);
    });
    const float ss = row_sum<kTpr, kSlots>(part, scratch, parity);
    if (valid) {
      const float r = rms_from_sum(ss, p.cols, p.eps);  // no rescaled path in this band: rstd.cuh
      if (p.rstd != nullptr && m.pos == 0) p.rstd[row] = r;
      with_row_offset<T>(o, [&](auto k) {
        constexpr int kO = decltype(k)::value;
        if (p.round_xhat)
          store_offset_row<T, kO, kPartial, true, kEdgeSpans>(xrow, yrow, p.w, offset, r, m, p.chunks, p.cols, held);
        else
          store_offset_row<T, kO, kPartial, false, kEdgeSpans>(xrow, yrow, p.w, offset, r, m, p.chunks, p.cols, held);
      });
    }
  }
}

// ---- kCluster (both I/O paths) and kRows with element I/O: persistent -------------------------
// kClustered == false: rows_per_cta row slots of kTpr threads per CTA, element
// I/O (the 16-byte path is forward_rows_direct_kernel).
// kClustered == true: one row per cluster, kTpr threads per CTA. kVec: every
// operand row is 16-byte aligned: forward_cluster_pipelined (x through the
// cp.async pipeline, p.stages rows deep, dynamic shared memory
// plan::stage_bytes(cta_threads, 1, kCpt) per stage). Otherwise element I/O
// straight into registers, no lookahead.
// W: the weight's dtype, T or (RMSNORM_FLAG_WEIGHT_F32) float, passed in p.w.
// kCpt: the plan's chunks per thread (kMaxChunksPerThread in the cluster band).
template <typename T, int kTpr, int kCpt, bool kClustered, bool kVec, typename W = T>
__global__ void __launch_bounds__(plan::forward_cta_threads(kTpr),
                                  plan::forward_ctas_per_sm(kTpr, kCpt,
                                                            !kClustered ? plan::Kernel::kForwardRowsElement
                                                            : kVec      ? plan::Kernel::kForwardCluster
                                                                        : plan::Kernel::kForwardClusterElement))
    forward_kernel(const ForwardParams<T> p) {
  constexpr int kCtaThreads = plan::forward_cta_threads(kTpr);
  constexpr int kSlots = kCtaThreads / kTpr;
  static_assert(kSlots * kTpr == kCtaThreads, "plan: rows_per_cta * threads_per_row == cta_threads");
  static_assert(!kClustered || (kTpr == plan::kClusterTpr && kSlots == 1), "plan: cluster CTAs hold one row slot");
  static_assert(!kClustered || kCpt == plan::kMaxChunksPerThread, "plan: the cluster band's chunks per thread");
  static_assert(kCpt == plan::kFewChunksPerThread || kCpt == plan::kMaxChunksPerThread, "plan: chunks per thread");
  static_assert(kClustered || !kVec, "plan: the rows band's 16-byte path is forward_rows_direct_kernel");
  static_assert(kTpr <= plan::kMaxRowsTpr, "plan: threads per row");
  static_assert(Chunk<T>::kN == plan::vec_elems(sizeof(T)), "plan: chunk width");
  static_assert(plan::stage_bytes(kCtaThreads, 1, kCpt) == sizeof(uint4) * kCpt * kCtaThreads, "plan: stage size");
  __shared__ RowScratch<float, kTpr, kSlots> scratch;
  pdl_enter();
  if constexpr (kVec) {
    extern __shared__ uint4 stage[];  // [stages][kCpt][kCtaThreads]
    __shared__ ClusterExchange<float> pushed;
    forward_cluster_pipelined<T, W>(p, stage, scratch, pushed);
    return;
  } else {
    __shared__ float exchange[2];
    const RowMap<kTpr, kClustered> m;
    const int64_t groups = (p.rows + kSlots - 1) / kSlots;
    // This CTA's walk over row groups: g0, g0 + step, ... < gend.
    const bool tiled = !kClustered && p.groups_per_cta > 0;
    const int64_t g0 = tiled ? m.unit * p.groups_per_cta : m.unit;
    const int64_t step = tiled ? 1 : m.units;
    const int64_t gend = tiled ? (g0 + p.groups_per_cta < groups ? g0 + p.groups_per_cta : groups) : groups;
    // w' reloaded at each use (an L1 hit): the loads need the registers.
    ThreadWeights<T, kCpt, false, W> wv;
    wv.load(p.w, p.chunks, p.cols, false, p.w_offset, m);
    int parity = 0;
    for (int64_t g = g0; g < gend; g += step, parity ^= 1) {
      const int64_t row = g * kSlots + m.slot;
      const bool valid = row < p.rows;
      const T* xrow = p.x + row * p.x_stride;
      T* yrow = p.y + row * p.y_stride;
      // x and y at the same offset in their 16-byte blocks (one misaligned base for both, or odd D with equal
      // strides): the rows band holds x of y's aligned blocks from the sum to the store.
      const bool paired = !kClustered && ((reinterpret_cast<uintptr_t>(xrow) ^ reinterpret_cast<uintptr_t>(yrow)) & 15) == 0;
      Chunk<T> xr[kCpt];
      float part = 0.0f;
      if (paired) {
        if (valid) part = paired_squares(xrow, m, p.chunks, p.cols, xr);
      } else {
        load_group(p.x, p.x_stride, p.rows, p.chunks, p.cols, false, m, g, kSlots, xr);
        part = thread_squares(xr, m, p.chunks, valid);
      }
      float ss = row_sum<kTpr, kSlots>(part, scratch, parity);
      if constexpr (kClustered) ss = cluster_sum(ss, exchange, parity);
      if (valid) {
        const float r = rms_from_sum(ss, p.cols, p.eps);  // no rescaled path in this band: rstd.cuh
        if (p.rstd != nullptr && m.pos == 0) p.rstd[row] = r;
        T* yr = yrow;
#pragma unroll
        for (int it = 0; it < kCpt; ++it) {
          const int c = m.chunk(it);
          if (c < p.chunks) {
            // The rows band stores aligned blocks. The cluster band keeps the per-chunk stores: with the block
            // stores it spilled (208 bytes at 16-bit, 64 registers).
            if constexpr (kClustered) {
              float w[Chunk<T>::kN];
              wv.get(it, w);
              store_normalized(yr, c, p.cols, false, p.round_xhat, xr[it], w, r);
            } else {
              const Chunk<T> held = xr[it];
              store_normalized_blocks<T, W>(xrow, yr, p.w, c, p.chunks, p.cols, p.w_offset, p.round_xhat, r,
                                            [&](int first) { return paired ? held : load_window(xrow, first, p.cols); });
            }
          }
        }
      }
    }
    if constexpr (kClustered) cluster_sync();  // keep `exchange` alive until every CTA has read it
  }
}

// y's 4 columns from an fp32 chunk of x (or h), r and w', in fp32 for store_quad's one rounding to a 16-bit y:
// x_hat = x r (rounded to the norm's input dtype, fp32, with round_xhat), times w'. The looped forward's fp32 x with
// a 16-bit y, and the fp32 forms' kernel in shares, so that both give the same bits.
__device__ __forceinline__ Chunk<float> y_quad(const Chunk<float>& x, float r, const float (&w)[4], bool round_xhat) {
  Chunk<float> o;
#pragma unroll
  for (int j = 0; j < 4; j += 2) {
    const float xa = x.get(j) * r, xb = x.get(j + 1) * r;
    o.set2(j, (round_xhat ? to_float(from_float<float>(xa)) : xa) * w[j],
           (round_xhat ? to_float(from_float<float>(xb)) : xb) * w[j + 1]);
  }
  return o;
}

// ---- kLooped: any D, one CTA per row, x read twice ---------------------------------------------
// kQuant: q = quant(y) in place of y (rmsnorm_forward_quant), at any D and
// alignment (plan::quant_launch): y is computed again for each pass over the
// row (max|y| with per-row scales, then q); x and w' come from L1 or L2.
// W: the weight's dtype, passed in p.w (an fp32 weight with 16-bit x,
// RMSNORM_FLAG_WEIGHT_F32; a 16-bit weight with the fp32 residual stream's h
// as x). Y: y's dtype, passed in p.y (RMSNORM_FLAG_Y_DTYPE; the fp32 residual
// stream's y in the 16-bit dtype of the call's x); stored by element, y_stride
// in Y's elements.
// kQ: the quantized kind, as in forward_rows_direct_kernel.
template <typename T, QuantKind kQ = QuantKind::kNone, typename W = T, typename Y = T>
__global__ void __launch_bounds__(plan::kLoopedThreads)
    forward_looped_kernel(const ForwardParamsOf<T, kQ != QuantKind::kNone> p) {
  constexpr bool kQuant = kQ != QuantKind::kNone;
  constexpr int kCtaThreads = plan::kLoopedThreads;
  constexpr int kN = Chunk<T>::kN;
  static_assert(!kQuant || std::is_same_v<Y, T>, "the quantized forward writes q, not y");
  __shared__ RowScratch<float, kCtaThreads, 1> scratch;
  __shared__ RowScratch<AbsMax, quant_per_row(kQ) ? kCtaThreads : 1, 1> max_scratch;
  pdl_enter();
  QuantConsts qk;
  if constexpr (kQuant) qk = load_quant_consts(p.quant);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, parity ^= 1) {
    const T* xr = p.x + row * p.x_stride;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) ss = add_squares(ss, load_chunk(xr, c, p.cols, p.vector_io));
    const float r = cta_row_rstd<kCtaThreads>(row_sum<kCtaThreads, 1>(ss, scratch, parity), p.cols, p.eps, scratch,
                                                    [&](float s) {
                                                      float v = 0.0f;
                                                      for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads)
                                                        v = add_scaled_squares(v, load_chunk(xr, c, p.cols, p.vector_io), s);
                                                      return v;
                                                    });
    if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = r;
    auto y_of = [&](int c) {
      float w[kN];
      weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
      return y_chunk(load_chunk(xr, c, p.cols, p.vector_io), w, r, p.round_xhat);
    };
    if constexpr (quant_per_block(kQ)) {
      // One pass: each chunk's y once, its block's max|y| by shuffles over the block's consecutive lanes. The
      // trip count is the same for every thread, so that every lane of a warp takes part in them.
      const QuantParams& qp = p.quant;
      const int shift = qp.block_shift;
      uint8_t* qrow = qp.q + row * qp.q_stride;
      float* srow = qp.row_scales + row * qp.scales_row_stride;
      for (int c0 = 0; c0 < p.chunks; c0 += kCtaThreads) {
        const int c = c0 + static_cast<int>(threadIdx.x);
        const bool own = c < p.chunks;
        const int n = min(kN, p.cols - c * kN);
        Chunk<T> y = zero_chunk<T>();
        if (own) y = y_of(c);
        const QuantRow br = per_row_quant(qp, qk, block_absmax(chunk_absmax(0.0f, y, n), 1 << shift));
        if (own) {
          if ((c & ((1 << shift) - 1)) == 0) srow[(c >> shift) * qp.scales_block_stride] = br.s;
          store_q_chunk<T>(qrow, c, n, qp.q_vector, quantize_chunk<kQ>(y, br));
        }
      }
    } else if constexpr (kQuant) {
      const QuantParams& qp = p.quant;
      QuantRow qrule;
      if constexpr (quant_per_row(kQ)) {
        float absmax = 0.0f;
        for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) absmax = chunk_absmax(absmax, y_of(c), p.cols - c * kN);
        absmax = row_sum<kCtaThreads, 1>(AbsMax{absmax}, max_scratch, parity).v;
        qrule = per_row_quant(qp, qk, absmax);
        if (threadIdx.x == 0) qp.row_scales[row] = qrule.s;
      } else {
        qrule = qk.fixed;
      }
      uint8_t* qrow = qp.q + row * qp.q_stride;
      for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads)
        store_q_chunk<T>(qrow, c, min(kN, p.cols - c * kN), qp.q_vector, quantize_chunk<kQ>(y_of(c), qrule));
    } else if constexpr (std::is_same_v<Y, T>) {
      T* yr = p.y + row * p.y_stride;
      for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) {
        float w[kN];
        weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
        store_normalized(yr, c, p.cols, p.vector_io, p.round_xhat, load_chunk(xr, c, p.cols, p.vector_io), w, r);
      }
    } else if constexpr (sizeof(T) == 4 && sizeof(Y) == 2) {
      // fp32 x, 16-bit y: y = Y(x_hat w'), or Y(T(x_hat) w') with round_xhat, one rounding to Y (the CPU backend's
      // rule); a chunk's 4 columns of y in one 8-byte store where this row of y is 8-byte aligned (store_quad,
      // the same rounding), by element otherwise and for the row's partial last chunk.
      Y* yr = reinterpret_cast<Y*>(p.y) + row * p.y_stride;
      const bool vec = (reinterpret_cast<uintptr_t>(yr) & 7) == 0;
      for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) {
        float w[kN];
        weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
        store_quad(yr, c * kN, p.cols, vec, y_quad(load_chunk(xr, c, p.cols, p.vector_io), r, w, p.round_xhat));
      }
    } else {
      // y = Y(x_hat w'), or Y(T(x_hat) w') with round_xhat: one rounding to Y (the CPU backend's rule).
      Y* yr = reinterpret_cast<Y*>(p.y) + row * p.y_stride;
      for (int c = threadIdx.x; c < p.chunks; c += kCtaThreads) {
        float w[kN];
        weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
        const Chunk<T> x = load_chunk(xr, c, p.cols, p.vector_io);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float xh = x.get(j) * r;
          const float o = (p.round_xhat ? to_float(from_float<T>(xh)) : xh) * w[j];
          if (c * kN + j < p.cols) yr[c * kN + j] = from_float<Y>(o);
        }
      }
    }
  }
}

// ---- kLooped with the fp32 residual stream's add (RMSNORM_FLAG_RESIDUAL_F32) -------------------
// h = float(x) + residual (x 16-bit; residual and h fp32) and y = T(h r w') in one
// launch, where add_kernel and forward_looped_kernel<float, kNone, W, T> took two
// (and read h back from memory in between). The looped band's row: 1024 summing
// threads, thread v adding, storing and summing chunks v, v + 1024, .. of h (4
// columns each), in that order, the row's sum through row_sum<1024, 1>; here run
// by a CTA of kLoopedShareThreads threads, each holding kShares of the summing
// threads (row_sum_shares), so that h, rstd and y are bit for bit those of the
// two launches (and of the backward's recompute, which runs the looped order on
// h), while several rows share an SM. A thread reads each residual chunk before
// it writes the same chunk of h, so h == residual (the stream updated in place)
// is safe; the second pass reads back only the chunks of h the thread itself
// wrote.
template <typename T>
struct AddF32ForwardParams : ForwardParams<float> {
  const T* x16 = nullptr;  // the call's x; ForwardParams::x is h (read back), ::res the residual, ::y y of T
  int64_t x16_stride = 0;
  bool x16_vector = false;  // every x row 8-byte aligned: a chunk's 4 columns of x are one 8-byte load
  bool y_vector = false;    // every y row 8-byte aligned: a chunk's 4 columns of y are one 8-byte store
};

// Chunk `chunk` of the row of h this kernel wrote (0 past cols), read back through L2 (ld.global.cg): coherent with
// the thread's own stores however the compiler would cache a read-only load, which matters where h == residual.
__device__ __forceinline__ Chunk<float> load_h_chunk(const float* row, int chunk, int cols, bool vector_io) {
  const int first = chunk * Chunk<float>::kN;
  if (vector_io && first + Chunk<float>::kN <= cols) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(row + first));
    return as_chunk<float>(make_uint4(__float_as_uint(v.x), __float_as_uint(v.y), __float_as_uint(v.z),
                                      __float_as_uint(v.w)));
  }
  Chunk<float> h = zero_chunk<float>();
#pragma unroll
  for (int j = 0; j < Chunk<float>::kN; ++j)
    if (first + j < cols) h.w[j] = __float_as_uint(__ldcg(row + first + j));
  return h;
}

// Chunks c0, c0 + step, .. (kChunks of them) of row `row` in the held forms (every access a whole vector; rr: the row of
// the residual, or of x where kAdd is false): add_kernel's h = float(x) + residual, or x; 0 past the row's chunks.
// Every load is issued before the first add, which waits on them (one add per chunk after its own loads made nvcc
// issue the next chunk's loads only after it).
// with_loads(j, c) runs beside chunk j's loads (chunk c of the row, c < chunks): the held kernel's w'.
template <bool kAdd, int kChunks, typename T, typename WithLoads>
__device__ __forceinline__ void held_h_chunks(const AddF32ForwardParams<T>& p, int64_t row, const float* rr, int c0,
                                              int step, Chunk<float> (&h)[kChunks], WithLoads&& with_loads) {
  constexpr int kN = Chunk<float>::kN;
  Chunk<T> xq[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = c0 + j * step;
    xq[j] = zero_chunk<T>();
    h[j] = zero_chunk<float>();
    if (c < p.chunks) {
      if constexpr (kAdd) xq[j] = load_quad_whole(p.x16 + row * p.x16_stride, c * kN);
      h[j] = as_chunk<float>(reinterpret_cast<const uint4*>(rr)[c]);
      with_loads(j, c);
    }
  }
  if constexpr (kAdd) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int e = 0; e < kN; e += 2)
        h[j].set2(e, xq[j].get(e) + h[j].get(e), xq[j].get(e + 1) + h[j].get(e + 1));
  }
}

// kAdd false: the same row without the add, fp32 x (p.x) with y of the 16-bit T (RMSNORM_FLAG_Y_DTYPE:
// forward_looped_kernel<float, kNone, W, T>'s rstd and y, bit for bit, at four rows per SM where it ran two); x is
// read back through L1.
// kForm (plan::f32_shares_forward): kHeld and kHeldLateW (a one-pass row whose every access is a whole vector) keep
// x (or h) in registers from its load to y, so no read-back and no element path; kHeld loads w' with x, kHeldLateW
// after the reduction. The same arithmetic in the same order in every form.
// kReadBackVec (plan::f32_readback_vec; kAdd false): kReadBack where every access is a whole vector, with L1
// priorities on x's two reads and each chunk's w' loaded with its read-back.
// kCta < kLoopedShareThreads (plan::f32_shares_cta): a one-pass row of at most kShares kCta chunks, whose CTA holds
// only the summing threads with a chunk.
template <typename T, typename W, bool kAdd = true, plan::F32Forward kForm = plan::F32Forward::kReadBack,
          int kCta = plan::kLoopedShareThreads>
__global__ void __launch_bounds__(kCta, plan::f32_forward_ctas_per_sm(kForm, kCta))
    forward_looped_add_f32_kernel(const AddF32ForwardParams<T> p) {
  constexpr bool kHeld = kForm == plan::F32Forward::kHeld || kForm == plan::F32Forward::kHeldLateW;
  constexpr bool kLateW = kForm == plan::F32Forward::kHeldLateW;
  constexpr bool kVecRow = kForm == plan::F32Forward::kReadBackVec;
  static_assert(kForm != plan::F32Forward::kCluster, "kCluster: forward_f32_cluster_kernel");
  static_assert(kForm != plan::F32Forward::kReadBackWide, "kReadBackWide: forward_f32_wide_kernel");
  static_assert(!(kVecRow && kAdd), "plan: kReadBackVec reads x back through L1's read-only path; h is written here");
  constexpr int kSumThreads = plan::kLoopedThreads;
  constexpr int kShares = plan::kLoopedShares;
  constexpr int kN = Chunk<float>::kN;
  static_assert(kShares * plan::kLoopedShareThreads == kSumThreads,
                "plan: the looped row's summing threads in whole shares");
  constexpr bool kSmallCtaOk = kForm != plan::F32Forward::kHeld && kCta >= plan::kLoopedShareMinThreads &&
                               kCta * kShares < kSumThreads;
  static_assert(kCta == plan::kLoopedShareThreads || kSmallCtaOk,
                "plan: a smaller CTA runs kReadBack's and kHeldLateW's one-pass rows");
  static_assert(kN == 4 && sizeof(T) == 2, "fp32 h chunks of 4 columns, 16-bit x and y");
  struct Shares {  // a thread's shares of the rescaled sum
    float v[kShares];
  };
  __shared__ RowScratch<float, kSumThreads, 1> scratch;
  pdl_enter();
  const int t = static_cast<int>(threadIdx.x);
  int parity = 0;
  // The row's rstd from the shares' sums of squares ss; scaled(s) gives the shares of the rescaled sum (rare path).
  auto shares_rstd = [&](const float (&ss)[kShares], auto&& scaled) {
    return row_rstd(
        row_sum_shares<kSumThreads, kCta, kShares>(ss, scratch, parity), p.cols, p.eps,
        [&](const Shares& v) { return cta_sum_rare_shares<kSumThreads, kCta, kShares>(v.v, scratch); }, scaled);
  };
  // y's chunk c of the row at yr from h's chunk, r and w': forward_looped_kernel<float, kNone, W, T>'s y, x_hat rounded
  // to the norm's input dtype (fp32 here) with round_xhat, then one rounding to T; vec: yr's rows 8-byte aligned.
  auto store_y = [&](T* yr, int c, const Chunk<float>& h, float r, const float (&w)[kN], bool vec) {
    store_quad(yr, c * kN, p.cols, vec, y_quad(h, r, w, p.round_xhat));
  };
  if constexpr (kHeld) {
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, parity ^= 1) {
      const float* rr = (kAdd ? p.res + row * p.res_stride : p.x + row * p.x_stride);
      Chunk<float> h[kShares];
      float w[kShares][kN], ss[kShares];
      // kHeld: every chunk's w' loaded with x before any of them is used (w + offset waits on its load).
      Chunk<W> wraw[kShares];
      held_h_chunks<kAdd>(p, row, rr, t, kCta, h, [&](int k, int c) {
        if constexpr (!kLateW) wraw[k] = weights_vec_raw<W>(p.w, c, p.cols);
      });
      if constexpr (!kLateW)
#pragma unroll
        for (int k = 0; k < kShares; ++k) held_weights(wraw[k], p.w != nullptr, p.w_offset, w[k]);
#pragma unroll
      for (int k = 0; k < kShares; ++k) {
        ss[k] = 0.0f;
        const int c = t + k * kCta;
        if (c < p.chunks) {
          if constexpr (kAdd) store16(p.h + row * p.h_stride + c * kN, h[k]);
          ss[k] = add_squares(ss[k], h[k]);
        }
      }
      const float r = shares_rstd(ss, [&](float s) {
        Shares v;
#pragma unroll
        for (int k = 0; k < kShares; ++k) v.v[k] = t + k * kCta < p.chunks ? add_scaled_squares(0.0f, h[k], s) : 0.0f;
        return v;
      });
      if (p.rstd != nullptr && t == 0) p.rstd[row] = r;
      T* yr = reinterpret_cast<T*>(p.y) + row * p.y_stride;
      // kLateW: kWGroup chunks' w' loads before the first of their y stores. y's stores could alias w for the
      // compiler, which then issued a chunk's w load only after the previous chunk's store (an L2 round trip per
      // chunk). An fp32 weight's chunks four at a time spilled at 40 registers, so two.
      constexpr int kWGroup = !kLateW ? kShares : sizeof(W) == 2 ? kShares : 2;
#pragma unroll
      for (int k0 = 0; k0 < kShares; k0 += kWGroup) {
        if constexpr (kLateW) {
          Chunk<W> wraw[kWGroup];
          weights_vec_raw_n<W>(p.w, t + k0 * kCta, kCta, p.chunks, p.cols, wraw);
#pragma unroll
          for (int k = 0; k < kWGroup; ++k) held_weights(wraw[k], p.w != nullptr, p.w_offset, w[k0 + k]);
        }
#pragma unroll
        for (int k = k0; k < k0 + kWGroup; ++k) {
          const int c = t + k * kCta;
          if (c < p.chunks) store_quad_whole(yr, c * kN, y_quad(h[k], r, w[k], p.round_xhat));
        }
      }
    }
  } else {
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, parity ^= 1) {
      const T* xr = kAdd ? p.x16 + row * p.x16_stride : nullptr;
      const float* hr = p.x + row * p.x_stride;  // the same row of h, read back (kAdd false: x)
      const float* rr = kAdd ? p.res + row * p.res_stride : hr;
      float* hw = kAdd ? p.h + row * p.h_stride : nullptr;
      auto read_back = [&](int c) {
        if constexpr (kAdd)
          return load_h_chunk(hr, c, p.cols, p.vector_io);
        else if constexpr (kVecRow)
          return as_chunk<float>(load16_hint<L1Hint::kL1Drop>(hr + c * kN));
        else
          return load_chunk_hint<L1Hint::kL1Drop>(hr, c, p.cols, p.vector_io);
      };
      float ss[kShares];
#pragma unroll
      for (int k = 0; k < kShares; ++k) ss[k] = 0.0f;
      // D <= 4096: the row is one pass of the summing threads, and a thread's chunks for y (t, t + kCta, ..) are its
      // shares' chunks: their w' is prefetched into L1 with x and the residual, so that y does not wait on DRAM for it
      // after the reduction (h or w' held in registers for y spilled at 64 registers).
      const bool one_pass = p.chunks <= kSumThreads;
      // Share k: summing thread t + k kCta, whose chunks are c0 + t + k kCta for c0 = 0, 1024, ..
      for (int c0 = 0; c0 < p.chunks; c0 += kSumThreads) {
        Chunk<T> xq[kShares];
        Chunk<float> res[kShares];
#pragma unroll
        for (int k = 0; k < kShares; ++k) {
          const int c = c0 + t + k * kCta;
          xq[k] = zero_chunk<T>();
          res[k] = zero_chunk<float>();
          if (c < p.chunks) {
            if constexpr (kAdd) xq[k] = load_quad(xr, c * kN, p.cols, p.x16_vector);
            // x (kAdd false) is read again for y: kept in L1 before the weight's lines and the read-back's.
            if constexpr (kAdd)
              res[k] = load_chunk(rr, c, p.cols, p.vector_io);
            else if constexpr (kVecRow)
              res[k] = as_chunk<float>(load16_hint<L1Hint::kL1Keep>(rr + c * kN));
            else
              res[k] = load_chunk_hint<L1Hint::kL1Keep>(rr, c, p.cols, p.vector_io);
            if (one_pass && p.w != nullptr) prefetch_l1(reinterpret_cast<const W*>(p.w) + c * kN);
          }
        }
#pragma unroll
        for (int k = 0; k < kShares; ++k) {
          const int c = c0 + t + k * kCta;
          if (c < p.chunks) {
            Chunk<float> h = res[k];
            if constexpr (kAdd) {
              // add_kernel's h = float(x) + residual; past cols both read as 0, so h is +0 there and adds nothing.
#pragma unroll
              for (int j = 0; j < kN; j += 2)
                h.set2(j, xq[k].get(j) + res[k].get(j), xq[k].get(j + 1) + res[k].get(j + 1));
              store_chunk(hw, c, p.cols, p.vector_io, h);
            }
            ss[k] = add_squares(ss[k], h);
          }
        }
      }
      const float r = shares_rstd(ss, [&](float s) {
        Shares v;
#pragma unroll
        for (int k = 0; k < kShares; ++k) {
          v.v[k] = 0.0f;
          for (int c = t + k * kCta; c < p.chunks; c += kSumThreads) v.v[k] = add_scaled_squares(v.v[k], read_back(c), s);
        }
        return v;
      });
      if (p.rstd != nullptr && t == 0) p.rstd[row] = r;
      T* yr = reinterpret_cast<T*>(p.y) + row * p.y_stride;
      auto emit_y = [&](int c, const Chunk<float>& h) {
        float w[kN];
        weights_any<W>(p.w, c, p.cols, p.vector_io, p.w_offset, w);
        store_y(yr, c, h, r, w, p.y_vector);
      };
      // A pass's kShares chunks of h read back at once: a thread waits for L1 / L2 once per pass, not once per chunk
      // (y's stores could alias the loads for the compiler, which then kept them in order).
      // kVecRow: each chunk's w' loaded with its read-back too, before the first y store (the stores could alias w
      // for the compiler, which then issued each chunk's w load after the previous chunk's store).
      for (int c0 = 0; c0 < p.chunks; c0 += kSumThreads) {
        Chunk<float> hs[kShares];
        Chunk<W> wv[kVecRow ? kShares : 1];
#pragma unroll
        for (int k = 0; k < kShares; ++k) {
          const int c = c0 + t + k * kCta;
          hs[k] = c < p.chunks ? read_back(c) : zero_chunk<float>();
          if constexpr (kVecRow) wv[k] = c < p.chunks ? weights_vec_raw<W>(p.w, c, p.cols) : zero_chunk<W>();
        }
#pragma unroll
        for (int k = 0; k < kShares; ++k) {
          const int c = c0 + t + k * kCta;
          if (c >= p.chunks) continue;
          if constexpr (kVecRow) {
            float w[kN];
            held_weights(wv[k], p.w != nullptr, p.w_offset, w);
            store_quad_whole(yr, c * kN, y_quad(hs[k], r, w, p.round_xhat));
          } else {
            emit_y(c, hs[k]);
          }
        }
      }
    }
  }
}

// ---- fp32 x with a 16-bit y on rows of three or four passes, read back (plan::F32Forward::kReadBackWide) -----------
// One row per CTA of kLoopedThreads threads, thread t being summing thread t with chunks t + j kLoopedThreads for the
// kPasses passes j (plan::f32_wide_passes; every pass but the last lies in the row, which D 8193..16384 and whole
// vectors give). All kPasses loads of x are issued before the first add, kept in L1 (evict_last), and read back for y
// kRbGroup passes at a time with their w' (three at once at three passes, two and two at four); the row's address
// is held once and the passes are fixed offsets from it. The thread adds its chunks' squares in pass order and the
// CTA sums the 1024 shares as forward_looped_add_f32_kernel's kReadBack does (row_sum_shares), so rstd and y are its
// bits. Holding the chunks to y instead (no read-back) lost at four passes on an H100 (4096 x 16384 1.047x the time
// of the earlier read-back form with loops around its groups, this one 0.989x; docs/fusions.md, "Rows of three and
// four passes").
template <typename T, typename W, int kPasses>
__global__ void __launch_bounds__(plan::kLoopedThreads,
                                  plan::f32_forward_ctas_per_sm(plan::F32Forward::kReadBackWide, plan::kLoopedThreads))
    forward_f32_wide_kernel(const AddF32ForwardParams<T> p) {
  constexpr int kCta = plan::kLoopedThreads;
  constexpr int kN = Chunk<float>::kN;
  constexpr int kStep = kCta * kN;  // floats (and y elements) between a thread's passes
  constexpr int kRbGroup = kPasses == 3 ? 3 : 2;
  static_assert(kPasses == 3 || kPasses == 4, "plan: f32_wide_passes");
  static_assert(kCta == plan::f32_shares_cta(0, plan::F32Forward::kReadBackWide), "plan: kReadBackWide's CTA");
  static_assert(kN == 4 && sizeof(T) == 2, "fp32 x chunks of 4 columns, a 16-bit y");
  struct Shares {  // the thread's share of the rescaled sum
    float v[1];
  };
  __shared__ RowScratch<float, kCta, 1> scratch;
  pdl_enter();
  const int t = static_cast<int>(threadIdx.x);
  int parity = 0;
  const bool last_in = t + (kPasses - 1) * kCta < p.chunks;  // the last pass's chunk
  auto in_row = [&](int j) { return j < kPasses - 1 || last_in; };
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, parity ^= 1) {
    const float* xr = held_address(p.x + row * p.x_stride + t * kN);
    float ss[1] = {0.0f};
    {
      Chunk<float> h[kPasses];
#pragma unroll
      for (int j = 0; j < kPasses; ++j)
        h[j] = in_row(j) ? as_chunk<float>(load16_hint<L1Hint::kL1Keep>(xr + j * kStep)) : zero_chunk<float>();
#pragma unroll
      for (int j = 0; j < kPasses; ++j)
        if (in_row(j)) ss[0] = add_squares(ss[0], h[j]);
    }
    const float r = row_rstd(
        row_sum_shares<kCta, kCta, 1>(ss, scratch, parity), p.cols, p.eps,
        [&](const Shares& v) { return cta_sum_rare_shares<kCta, kCta, 1>(v.v, scratch); },
        [&](float s) {
          Shares v{{0.0f}};
#pragma unroll
          for (int j = 0; j < kPasses; ++j)
            if (in_row(j))
              v.v[0] = add_scaled_squares(v.v[0], as_chunk<float>(load16_hint<L1Hint::kL1Keep>(xr + j * kStep)), s);
          return v;
        });
    if (p.rstd != nullptr && t == 0) p.rstd[row] = r;
    T* yr = held_address(reinterpret_cast<T*>(p.y) + row * p.y_stride + t * kN);
#pragma unroll
    for (int j0 = 0; j0 < kPasses; j0 += kRbGroup) {
      Chunk<W> wraw[kRbGroup];
      Chunk<float> hb[kRbGroup];
#pragma unroll
      for (int j = 0; j < kRbGroup; ++j) {
        const bool in = j0 + j < kPasses && in_row(j0 + j);
        hb[j] = in ? as_chunk<float>(load16_hint<L1Hint::kL1Drop>(xr + (j0 + j) * kStep)) : zero_chunk<float>();
        wraw[j] = in ? weights_vec_raw<W>(p.w, t + (j0 + j) * kCta, p.cols) : zero_chunk<W>();
      }
#pragma unroll
      for (int j = 0; j < kRbGroup; ++j) {
        if (j0 + j >= kPasses || !in_row(j0 + j)) continue;
        float w[kN];
        held_weights(wraw[j], p.w != nullptr, p.w_offset, w);
        store_quad_whole(yr + (j0 + j) * kStep, 0, y_quad(hb[j], r, w, p.round_xhat));
      }
    }
  }
}

// ---- the fp32 forms' rows of 1025..4096 chunks held across a cluster (plan::F32Forward::kCluster) ---------------
// forward_looped_add_f32_kernel's row (kAdd: the fp32 residual stream's h and y; else fp32 x with a 16-bit y) where
// a summing thread has more than one chunk: a cluster of kLoopedShares CTAs of kLoopedShareThreads per row, thread t of
// CTA q being summing thread v = q kLoopedShareThreads + t. It issues every load of its chunks v, v + 1024, ..
// (kPasses at most) before the first add (held_h_chunks) and holds them to y, sums their squares in that order, and
// its warp's butterfly sum goes to every CTA of the cluster (ClusterWarpSums), which adds the 32 warp sums in warp
// order: row_sum<1024, 1>'s bits, so rstd, h and y are the other forms' (and the backward's recompute). No read-back
// of x or h; w' loaded after the reduction, a group of chunks' loads before their y stores.
// Every access is a whole vector (plan::f32_cluster_vec). One row per cluster, clusters walking rows past the grid.
template <typename T, typename W, bool kAdd, int kPasses>
__global__ void __launch_bounds__(plan::kLoopedShareThreads, plan::f32_cluster_ctas_per_sm(kPasses))
    forward_f32_cluster_kernel(const AddF32ForwardParams<T> p) {
  constexpr int kCta = plan::kLoopedShareThreads;
  constexpr int kSumThreads = plan::kLoopedThreads;
  constexpr int kCluster = plan::kLoopedShares;
  constexpr int kN = Chunk<float>::kN;
  static_assert(kCluster * kCta == kSumThreads, "plan: a cluster's CTAs are the looped row's summing threads");
  static_assert(kPasses == 2 || kPasses == plan::kF32ClusterMaxPasses, "plan: f32_cluster_passes");
  static_assert(kN == 4 && sizeof(T) == 2, "fp32 h chunks of 4 columns, 16-bit x and y");
  __shared__ ClusterWarpSums<kSumThreads / 32, kCta / 32> sums;
  sums.init();
  cluster_sync();  // the mbarriers are initialized before any push
  pdl_enter();
  const unsigned rank = cluster_rank();
  const int v = static_cast<int>(rank) * kCta + static_cast<int>(threadIdx.x);  // the summing thread
  const int64_t clusters = gridDim.x / kCluster;
  int64_t k = 0;  // this cluster's exchanges so far (one per row; two on the rescaled path)
  // The row's sum of the shares v: each thread's butterfly over its warp, then every warp's in warp order.
  auto cluster_row_sum = [&](float share) {
    const float s = group_sum<32>(share);
    sums.push(k, rank, s);
    return sums.wait_sum(k++);
  };
  for (int64_t row = blockIdx.x / kCluster; row < p.rows; row += clusters) {
    const float* rr = kAdd ? p.res + row * p.res_stride : p.x + row * p.x_stride;
    Chunk<float> h[kPasses];
    held_h_chunks<kAdd>(p, row, rr, v, kSumThreads, h, [](int, int) {});
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int c = v + j * kSumThreads;
      if (c < p.chunks) {
        if constexpr (kAdd) store16(p.h + row * p.h_stride + c * kN, h[j]);
        ss = add_squares(ss, h[j]);
      }
    }
    const float r = row_rstd(cluster_row_sum(ss), p.cols, p.eps, cluster_row_sum, [&](float s) {
      float sc = 0.0f;
#pragma unroll
      for (int j = 0; j < kPasses; ++j)
        if (v + j * kSumThreads < p.chunks) sc = add_scaled_squares(sc, h[j], s);
      return sc;
    });
    if (p.rstd != nullptr && v == 0) p.rstd[row] = r;
    T* yr = reinterpret_cast<T*>(p.y) + row * p.y_stride;
    // kWGroup chunks' w' loads before the first of their y stores (kHeldLateW's reason); an fp32 weight's four
    // chunks at once spilled at 40 registers, so two.
    constexpr int kWGroup = sizeof(W) == 2 ? kPasses : 2;
#pragma unroll
    for (int j0 = 0; j0 < kPasses; j0 += kWGroup) {
      Chunk<W> wraw[kWGroup];
      weights_vec_raw_n<W>(p.w, v + j0 * kSumThreads, kSumThreads, p.chunks, p.cols, wraw);
#pragma unroll
      for (int j = 0; j < kWGroup; ++j) {
        const int c = v + (j0 + j) * kSumThreads;
        if (c < p.chunks) {
          float w[kN];
          held_weights(wraw[j], p.w != nullptr, p.w_offset, w);
          store_quad_whole(yr, c * kN, y_quad(h[j0 + j], r, w, p.round_xhat));
        }
      }
    }
  }
  // No cluster barrier at the end: a CTA's last wait saw every push into it land (ClusterWarpSums).
}

// ---- launch ------------------------------------------------------------------------------------

// The residual add alone, where the forward that follows is not the fused
// rows kernel (plan::add_fused): h = R(x + res) element by element, any
// alignment, the geometry from plan::add_launch. R: the residual's and h's
// dtype (T, or float for the fp32 residual stream). Each element is read
// before it is written by the same thread, so h == x and h == res are safe.
template <typename T, typename R = T>
__global__ void __launch_bounds__(plan::kAddThreads) add_kernel(const T* x, int64_t x_stride, const R* res,
                                                                 int64_t res_stride, R* h, int64_t h_stride,
                                                                 int64_t rows, int cols) {
  pdl_enter();
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_stride;
    const R* rr = res + row * res_stride;
    R* hr = h + row * h_stride;
    // 64-bit: cols may come within kAddThreads of 2^31.
    for (int64_t j = threadIdx.x; j < cols; j += plan::kAddThreads)
      hr[j] = from_float<R>(to_float(xr[j]) + to_float(rr[j]));
  }
}

template <typename T>
ForwardParams<T> forward_params(const ForwardArgs& a, const plan::Launch& l) {
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
  p.w_offset = a.weight_offset ? 1.0f : -0.0f;  // w + -0 == w for every w, -0 included (w + +0 is +0 there)
  p.round_xhat = a.round_xhat;
  p.vector_io = l.io == plan::Io::kVector;
  p.stages = l.stages;
  p.groups_per_cta = l.groups_per_cta;
  p.res = static_cast<const T*>(a.residual);
  p.res_stride = a.residual_stride;
  p.h = static_cast<T*>(a.h);
  p.h_stride = a.h_stride;
  return p;
}

// The unfused residual add: add_kernel writes h, then `forward` runs on h as x (the plain or the quantized
// forward, which reads h once more). R: the residual's and h's dtype.
template <typename T, typename R = T, typename Forward>
rmsnorm_status_t add_then_forward(const ForwardArgs& a, const plan::Device& dev, bool pdl, cudaStream_t stream,
                                  Forward&& forward) {
  const plan::Launch al = plan::add_launch(a.rows, dev);
  const rmsnorm_status_t st =
      launch_kernel("add", add_kernel<T, R>, al.grid, dim3(plan::kAddThreads), 1, 0, pdl, stream,
                    static_cast<const T*>(a.x), a.x_stride, static_cast<const R*>(a.residual), a.residual_stride,
                    static_cast<R*>(a.h), a.h_stride, a.rows, static_cast<int>(a.cols));
  if (st != RMSNORM_STATUS_SUCCESS) return st;
  ForwardArgs b = a;
  b.x = a.h;
  b.x_stride = a.h_stride;
  b.residual = nullptr;
  b.h = nullptr;
  return forward(b);
}

// forward_looped_add_f32_kernel in the plan's form on its CTA (plan::looped_f32_shares_launch): kHeld on 256
// threads; kReadBack and kHeldLateW on 256 or, for a one-pass row of at most 4 * 128 (4 * 64) chunks, on 128 (64).
template <typename T, typename W, bool kAdd, plan::F32Forward kForm>
rmsnorm_status_t launch_f32_shares_on(const plan::Launch& l, bool pdl, cudaStream_t stream,
                                      const AddF32ForwardParams<T>& p) {
  constexpr int kFull = plan::kLoopedShareThreads;
  if constexpr (kForm == plan::F32Forward::kHeld) {
    return launch_planned(forward_looped_add_f32_kernel<T, W, kAdd, kForm>, kFull, l, pdl, stream, p);
  } else {
    if (l.row.cta_threads < kFull && int64_t{l.row.cta_threads} * plan::kLoopedShares < l.row.chunks)
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan",
                  "forward_looped_add_f32_kernel: the row's chunks exceed its CTA's shares");
    switch (l.row.cta_threads) {
      case 64:
        return launch_planned(forward_looped_add_f32_kernel<T, W, kAdd, kForm, 64>, 64, l, pdl, stream, p);
      case 128:
        return launch_planned(forward_looped_add_f32_kernel<T, W, kAdd, kForm, 128>, 128, l, pdl, stream, p);
      default:
        return launch_planned(forward_looped_add_f32_kernel<T, W, kAdd, kForm>, kFull, l, pdl, stream, p);
    }
  }
}

template <typename T, typename W, bool kAdd>
rmsnorm_status_t launch_f32_shares(const plan::Launch& l, plan::F32Forward form, bool pdl, cudaStream_t stream,
                                   const AddF32ForwardParams<T>& p) {
  switch (form) {
    case plan::F32Forward::kCluster:
      if (l.row.cluster != plan::kLoopedShares || l.row.chunks_per_thread != plan::f32_cluster_passes(l.row.chunks) ||
          l.row.chunks > int64_t{l.row.chunks_per_thread} * plan::kLoopedThreads)
        return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "forward_f32_cluster_kernel: the row does not fit its cluster");
      return l.row.chunks_per_thread == 2
                 ? launch_planned(forward_f32_cluster_kernel<T, W, kAdd, 2>, plan::kLoopedShareThreads, l, pdl, stream, p)
                 : launch_planned(forward_f32_cluster_kernel<T, W, kAdd, plan::kF32ClusterMaxPasses>,
                                  plan::kLoopedShareThreads, l, pdl, stream, p);
    case plan::F32Forward::kHeld:
      return launch_f32_shares_on<T, W, kAdd, plan::F32Forward::kHeld>(l, pdl, stream, p);
    case plan::F32Forward::kHeldLateW:
      return launch_f32_shares_on<T, W, kAdd, plan::F32Forward::kHeldLateW>(l, pdl, stream, p);
    case plan::F32Forward::kReadBackVec:
      if constexpr (kAdd)
        return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "kReadBackVec with the add (f32_y_dtype_forward only)");
      else
        return launch_planned(forward_looped_add_f32_kernel<T, W, false, plan::F32Forward::kReadBackVec>,
                              plan::kLoopedShareThreads, l, pdl, stream, p);
    case plan::F32Forward::kReadBackWide:
      if constexpr (kAdd)
        return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "kReadBackWide with the add (f32_y_dtype_forward only)");
      else if (l.row.cta_threads != plan::kLoopedThreads || l.row.chunks_per_thread != plan::f32_wide_passes(l.row.chunks) ||
               l.row.chunks <= int64_t{l.row.chunks_per_thread - 1} * plan::kLoopedThreads ||
               l.row.chunks > int64_t{l.row.chunks_per_thread} * plan::kLoopedThreads)
        return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "forward_f32_wide_kernel: the row is not its passes");
      else if (l.row.chunks_per_thread == 3)
        return launch_planned(forward_f32_wide_kernel<T, W, 3>, plan::kLoopedThreads, l, pdl, stream, p);
      else
        return launch_planned(forward_f32_wide_kernel<T, W, 4>, plan::kLoopedThreads, l, pdl, stream, p);
    default:
      return launch_f32_shares_on<T, W, kAdd, plan::F32Forward::kReadBack>(l, pdl, stream, p);
  }
}

// The looped kernel with x of X, the weight of W and y of Y (plan.hpp: the
// mixed-dtype forms run in the looped band at every D). The I/O path is x's
// (and the weight's where it is of X); the other operands go by element.
template <typename X, typename W, typename Y>
rmsnorm_status_t launch_looped_as(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  constexpr int kEs = static_cast<int>(sizeof(X));
  const plan::Io io = std::is_same_v<W, X> ? plan::io_of({{a.x, a.x_stride}, {a.weight, 0}}, kEs)
                                           : plan::io_of({{a.x, a.x_stride}}, kEs);
  if constexpr (std::is_same_v<X, float> && sizeof(Y) == 2) {
    const bool y_vector = quad_rows(a.y, a.y_stride);
    const bool quads = y_vector && (std::is_same_v<W, float> || quad_rows(a.weight, 0));
    const plan::F32Forward form = plan::f32_y_dtype_forward(a.rows, a.cols, io, quads, dev);
    if (form != plan::F32Forward::kReadBack || plan::y_dtype_forward_in_shares(a.cols)) {
      // The looped row in shares (forward_looped_add_f32_kernel without the add, or forward_f32_cluster_kernel):
      // the same rstd and y.
      const plan::Launch l = plan::looped_f32_shares_launch(a.rows, a.cols, io, form, dev);
      AddF32ForwardParams<Y> p;
      static_cast<ForwardParams<float>&>(p) = forward_params<float>(a, l);
      p.y_vector = y_vector;
      return launch_f32_shares<Y, W, false>(l, form, a.pdl && dev.sm90_code, stream, p);
    }
  }
  const plan::Launch l = plan::looped_forward_launch(a.rows, a.cols, kEs, io, dev);
  const ForwardParams<X> p = forward_params<X>(a, l);
  return launch_planned(forward_looped_kernel<X, QuantKind::kNone, W, Y>, plan::kLoopedThreads, l,
                        a.pdl && dev.sm90_code, stream, p);
}

// The fp32 residual stream's forward (forward_looped_add_f32_kernel): the looped band's plan for fp32 rows of h
// (the I/O path of h, the residual and an fp32 weight; x and y take 8-byte accesses where their rows allow).
template <typename T, typename W>
rmsnorm_status_t launch_looped_add_f32(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  constexpr int kEs = static_cast<int>(sizeof(float));
  const plan::Io io = std::is_same_v<W, float>
                          ? plan::io_of({{a.h, a.h_stride}, {a.residual, a.residual_stride}, {a.weight, 0}}, kEs)
                          : plan::io_of({{a.h, a.h_stride}, {a.residual, a.residual_stride}}, kEs);
  const bool x16_vector = quad_rows(a.x, a.x_stride);
  const bool y_vector = quad_rows(a.y, a.y_stride);
  const bool quads = x16_vector && y_vector && (std::is_same_v<W, float> || quad_rows(a.weight, 0));
  const plan::F32Forward form = plan::f32_shares_forward(a.rows, a.cols, io, quads, dev);
  const plan::Launch l = plan::looped_f32_shares_launch(a.rows, a.cols, io, form, dev);
  ForwardArgs b = a;
  b.x = a.h;  // ForwardParams::x: h, read back by the second pass
  b.x_stride = a.h_stride;
  AddF32ForwardParams<T> p;
  static_cast<ForwardParams<float>&>(p) = forward_params<float>(b, l);
  p.x16 = static_cast<const T*>(a.x);
  p.x16_stride = a.x_stride;
  p.x16_vector = x16_vector;
  p.y_vector = y_vector;
  return launch_f32_shares<T, W, true>(l, form, a.pdl && dev.sm90_code, stream, p);
}

// y in another dtype than x's (RMSNORM_FLAG_Y_DTYPE), or the fp32 residual
// stream (RMSNORM_FLAG_RESIDUAL_F32: h = float(x) + residual in float and
// the forward of h with y in x's dtype T and the weight in T, or fp32, in one
// launch: launch_looped_add_f32).
template <typename T>
rmsnorm_status_t launch_forward_mixed(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  if (a.residual_f32) {
    if constexpr (std::is_same_v<T, float>) {
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "dtype", "RMSNORM_FLAG_RESIDUAL_F32 with fp32 x");  // api.cpp: none
    } else {
      return a.weight_f32 ? launch_looped_add_f32<T, float>(a, dev, stream) : launch_looped_add_f32<T, T>(a, dev, stream);
    }
  }
  return dispatch_dtype(y_dtype_of(a), [&](auto ytag) -> rmsnorm_status_t {
    using Y = decltype(ytag);
    if constexpr (std::is_same_v<Y, T>) {
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "dtype", "no mixed forward for equal dtypes");  // launch_forward's
    } else {
      if (a.weight_f32) return launch_looped_as<T, float, Y>(a, dev, stream);
      // RMSNORM_FLAG_WEIGHT_Y_DTYPE: fp32 x with the weight in the 16-bit Y.
      if constexpr (std::is_same_v<T, float>)
        if (weight_dtype_of(a) == y_dtype_of(a)) return launch_looped_as<T, Y, Y>(a, dev, stream);
      return launch_looped_as<T, T, Y>(a, dev, stream);
    }
  });
}

template <typename T>
rmsnorm_status_t launch_forward(const ForwardArgs& a, const plan::Device& dev, cudaStream_t stream) {
  if (y_dtype_of(a) != a.dtype || a.residual_f32) return launch_forward_mixed<T>(a, dev, stream);
  constexpr int kEs = static_cast<int>(sizeof(T));
  const bool add = a.residual != nullptr;
  const plan::Io io = add ? plan::io_of({{a.x, a.x_stride},
                                         {a.residual, a.residual_stride},
                                         {a.h, a.h_stride},
                                         {a.y, a.y_stride},
                                         {a.weight, 0}},
                                        kEs)
                          : plan::forward_io({a.x, a.x_stride}, {a.y, a.y_stride}, a.weight, kEs);
  // An fp32 weight with 16-bit x: the rows band's kernels with the weight read as fp32, else the looped
  // kernel's fp32-weight form (plan::weight_f32_forward_launch).
  const plan::Launch l = a.weight_f32 ? plan::weight_f32_forward_launch(a.rows, a.cols, kEs, io, dev)
                                      : plan::forward_launch(a.rows, a.cols, kEs, io, dev);
  const bool pdl = a.pdl && dev.sm90_code;
  if (add && !plan::add_fused(l)) {
    // The add alone, then the plain forward of h (reading h once more).
    return add_then_forward<T>(a, dev, pdl, stream,
                               [&](const ForwardArgs& b) { return launch_forward<T>(b, dev, stream); });
  }
  const ForwardParams<T> p = forward_params<T>(a, l);
  // The exact-rows kernel's y form. Rounding x_hat to fp32 changes nothing, so fp32 x's round_xhat is the plain
  // or the offset form (the general kernel's rounded form adds the offset, which is -0 where there is none).
  const bool offset = a.weight != nullptr && a.weight_offset;
  const bool round = a.round_xhat && !std::is_same_v<T, float>;
  const ExactForm exact = !plan::forward_rows_exact(l, a.rows, a.cols, kEs) ? ExactForm::kNone
                          : round                                                   ? ExactForm::kRound
                          : offset                                                  ? ExactForm::kOffset
                                                                                    : ExactForm::kPlain;
  auto launch = [&](auto kernel, int cta_threads) { return launch_planned(kernel, cta_threads, l, pdl, stream, p); };
  using plan::Kernel;
  switch (l.kernel) {
    case Kernel::kForwardRowsPaired:
      if (a.weight_f32) break;  // plan::weight_f32_forward_launch: never paired
      return dispatch_rows<static_cast<int>(sizeof(T))>(l.row.threads_per_row, l.row.chunks_per_thread, [&](auto tpr, auto cpt) {
        constexpr int kTpr = decltype(tpr)::value;
        constexpr int kCpt = decltype(cpt)::value;
        PairedForwardParams<T> pp;
        static_cast<ForwardParams<T>&>(pp) = p;
        pp.order = plan::row_class_order(p.rows, p.x_stride * kEs);
        auto kernel = plan::paired_whole_rows(l.io, a.cols, kEs, kTpr) ? forward_rows_paired_kernel<T, kTpr, kCpt, false>
                                                                        : forward_rows_paired_kernel<T, kTpr, kCpt, true>;
        return launch_planned(kernel, plan::forward_cta_threads(kTpr), l, pdl, stream, pp);
      });
    case Kernel::kForwardRows:
    case Kernel::kForwardRowsElement:
      return dispatch_rows<static_cast<int>(sizeof(T))>(l.row.threads_per_row, l.row.chunks_per_thread, [&](auto tpr, auto cpt) -> rmsnorm_status_t {
        constexpr int kTpr = decltype(tpr)::value;
        constexpr int kCpt = decltype(cpt)::value;
        constexpr int kCta = plan::forward_cta_threads(kTpr);
        // W: the weight's dtype (fp32 with 16-bit x: RMSNORM_FLAG_WEIGHT_F32).
        auto rows_kernels = [&](auto wtag) -> rmsnorm_status_t {
          using W = decltype(wtag);
          if (l.kernel != Kernel::kForwardRows) return launch(forward_kernel<T, kTpr, kCpt, false, false, W>, kCta);
          const bool partial = a.cols % Chunk<T>::kN != 0;
          using E = ExactForm;
          // The add forward: its plain form with the weight in x's dtype.
          if constexpr (std::is_same_v<W, T>)
            if (add && exact == E::kPlain)
              return launch(
                  forward_rows_direct_kernel<T, kTpr, kCpt, false, true, QuantKind::kNone, T, kTpr, E::kPlain>, kCta);
          if (add)
            return partial ? launch(forward_rows_direct_kernel<T, kTpr, kCpt, true, true, QuantKind::kNone, W>, kCta)
                           : launch(forward_rows_direct_kernel<T, kTpr, kCpt, false, true, QuantKind::kNone, W>, kCta);
          if (exact == E::kPlain)
            return launch(
                forward_rows_direct_kernel<T, kTpr, kCpt, false, false, QuantKind::kNone, W, kTpr, E::kPlain>, kCta);
          // The rounded and offset forms with the weight in x's dtype (the fp32 weight's keep the general kernel).
          if constexpr (std::is_same_v<W, T>) {
            if (exact == E::kOffset)
              return launch(
                  forward_rows_direct_kernel<T, kTpr, kCpt, false, false, QuantKind::kNone, T, kTpr, E::kOffset>, kCta);
            if constexpr (!std::is_same_v<T, float>)
              if (exact == E::kRound)
                return launch(
                    forward_rows_direct_kernel<T, kTpr, kCpt, false, false, QuantKind::kNone, T, kTpr, E::kRound>,
                    kCta);
          }
          return partial ? launch(forward_rows_direct_kernel<T, kTpr, kCpt, true, false, QuantKind::kNone, W>, kCta)
                         : launch(forward_rows_direct_kernel<T, kTpr, kCpt, false, false, QuantKind::kNone, W>, kCta);
        };
        return dispatch_weight<T>(a.weight_f32, rows_kernels);
      });
    case Kernel::kForwardCluster:
    case Kernel::kForwardClusterElement: {
      // W: the weight's dtype (fp32 with 16-bit x: RMSNORM_FLAG_WEIGHT_F32).
      auto cluster_kernels = [&](auto wtag) -> rmsnorm_status_t {
        using W = decltype(wtag);
        return l.kernel == Kernel::kForwardCluster
                   ? launch(forward_kernel<T, plan::kClusterTpr, plan::kMaxChunksPerThread, true, true, W>, plan::kClusterTpr)
                   : launch(forward_kernel<T, plan::kClusterTpr, plan::kMaxChunksPerThread, true, false, W>, plan::kClusterTpr);
      };
      return dispatch_weight<T>(a.weight_f32, cluster_kernels);
    }
    case Kernel::kForwardLooped:
      return a.weight_f32 ? launch(forward_looped_kernel<T, QuantKind::kNone, float>, plan::kLoopedThreads)
                          : launch(forward_looped_kernel<T>, plan::kLoopedThreads);
    default: break;
  }
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", std::string("no forward launch for ") + plan::kernel_name(l.kernel));
}

// rmsnorm_forward_quant: fused into the rows band's 16-byte forward where q's
// rows are aligned to a chunk's bytes as well (plan::quant_fused), else the looped
// kernel with plan::quant_launch's geometry. With a residual
// (rmsnorm_add_forward_quant) the fused kernel also adds and stores h; elsewhere
// add_kernel writes h first and the quantized forward reads it.
template <typename T>
rmsnorm_status_t launch_forward_quant(const ForwardArgs& a, const QuantArgs& qa, const plan::Device& dev,
                                      cudaStream_t stream) {
  constexpr int kEs = static_cast<int>(sizeof(T));
  const bool add = a.residual != nullptr;
  const plan::Io io =
      add ? plan::io_of({{a.x, a.x_stride}, {a.residual, a.residual_stride}, {a.h, a.h_stride}, {a.weight, 0}}, kEs)
          : plan::io_of({{a.x, a.x_stride}, {a.weight, 0}}, kEs);
  const bool q_aligned = plan::q_rows_aligned(qa.q, qa.q_stride, kEs);
  const bool blocks = qa.block_cols > 0;
  const int block_chunks = blocks ? qa.block_cols / Chunk<T>::kN : 0;
  // An fp32 weight: never fused (the looped kernel's fp32-weight form).
  const plan::Launch l =
      plan::quant_launch(a.rows, a.cols, kEs, io, q_aligned && !a.weight_f32, dev, block_chunks);
  const bool pdl_add = a.pdl && dev.sm90_code;
  if (add && l.kernel != plan::Kernel::kForwardRows) {
    return add_then_forward<T>(a, dev, pdl_add, stream,
                               [&](const ForwardArgs& b) { return launch_forward_quant<T>(b, qa, dev, stream); });
  }
  QuantForwardParams<T> p;
  static_cast<ForwardParams<T>&>(p) = forward_params<T>(a, l);
  p.quant.q = static_cast<uint8_t*>(qa.q);
  p.quant.q_stride = qa.q_stride;
  p.quant.scale = qa.scale;
  p.quant.row_scales = qa.row_scales;
  p.quant.scale_ub = qa.scale_ub;
  p.quant.fp8 = qa.fp8;
  p.quant.per_row = qa.per_row;
  p.quant.q_vector = q_aligned;
  if (blocks) {
    // block_cols is 64 or 128 (the API's rule) and kN 4 or 8: 8 to 32 chunks, a power of two.
    int shift = 0;
    while ((1 << shift) < block_chunks) ++shift;
    if ((1 << shift) != block_chunks || block_chunks > 32 ||
        (l.kernel == plan::Kernel::kForwardRows && l.row.threads_per_row % block_chunks != 0))
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "block scales: " + std::to_string(block_chunks) +
                                                             " chunks per block do not fit the launch");
    p.quant.block_shift = shift;
    p.quant.scales_row_stride = qa.scales_row_stride;
    p.quant.scales_block_stride = qa.scales_block_stride;
  }
  const bool pdl = a.pdl && dev.sm90_code;
  auto launch = [&](auto kernel, int cta_threads) { return launch_planned(kernel, cta_threads, l, pdl, stream, p); };
  if (l.kernel == plan::Kernel::kForwardLooped)
    return dispatch_quant_kind(qa.fp8, qa.per_row, blocks, [&](auto kind) {
      constexpr QuantKind kQ = decltype(kind)::value;
      return a.weight_f32 ? launch(forward_looped_kernel<T, kQ, float>, plan::kLoopedThreads)
                          : launch(forward_looped_kernel<T, kQ>, plan::kLoopedThreads);
    });
  if (l.kernel != plan::Kernel::kForwardRows)
    return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", std::string("no quantized forward for ") + plan::kernel_name(l.kernel));
  return dispatch_quant_kind(qa.fp8, qa.per_row, blocks, [&](auto kind) -> rmsnorm_status_t {
    constexpr QuantKind kQ = decltype(kind)::value;
    if (l.sum_tpr > 0) {
      // plan::quant_sum_pairs: rows of kFewChunksTpr threads of 2 chunks as half the threads of 4.
      constexpr int kSum = plan::kFewChunksTpr, kTpr = kSum / 2, kCpt = plan::kMaxChunksPerThread;
      constexpr int kCta = plan::forward_cta_threads(kTpr);
      if (l.sum_tpr == kSum && l.row.threads_per_row == kTpr && l.row.chunks_per_thread == kCpt) {
        const bool partial = a.cols % Chunk<T>::kN != 0;
        if (add)
          return partial ? launch(forward_rows_direct_kernel<T, kTpr, kCpt, true, true, kQ, T, kSum>, kCta)
                         : launch(forward_rows_direct_kernel<T, kTpr, kCpt, false, true, kQ, T, kSum>, kCta);
        return partial ? launch(forward_rows_direct_kernel<T, kTpr, kCpt, true, false, kQ, T, kSum>, kCta)
                       : launch(forward_rows_direct_kernel<T, kTpr, kCpt, false, false, kQ, T, kSum>, kCta);
      }
      return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "quant_sum_pairs: no kernel for this geometry or kind");
    }
    return dispatch_rows<static_cast<int>(sizeof(T))>(l.row.threads_per_row, l.row.chunks_per_thread, [&](auto tpr, auto cpt) -> rmsnorm_status_t {
      constexpr int kTpr = decltype(tpr)::value;
      constexpr int kCpt = decltype(cpt)::value;
      constexpr int kCta = plan::forward_cta_threads(kTpr);
      // No block kernels where a row's threads cannot hold the smallest block (64 columns): the plan never
      // fuses them there (checked above).
      if constexpr (quant_per_block(kQ) && kTpr < 64 / Chunk<T>::kN) {
        return fail(RMSNORM_STATUS_INTERNAL_ERROR, "plan", "block scales: no fused kernel at this row geometry");
      } else {
      if (add)
        return a.cols % Chunk<T>::kN != 0 ? launch(forward_rows_direct_kernel<T, kTpr, kCpt, true, true, kQ>, kCta)
                                          : launch(forward_rows_direct_kernel<T, kTpr, kCpt, false, true, kQ>, kCta);
      return a.cols % Chunk<T>::kN != 0 ? launch(forward_rows_direct_kernel<T, kTpr, kCpt, true, false, kQ>, kCta)
                                        : launch(forward_rows_direct_kernel<T, kTpr, kCpt, false, false, kQ>, kCta);
      }
    });
  });
}

}  // namespace rmsnorm::cuda
