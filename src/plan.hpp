// Launch plan: the one place that decides each kernel's geometry. A pure
// function of (rows, cols, element size, I/O path, device properties,
// direction) that returns one `Launch` per call: which kernel, its band,
// threads per row, row slots, cluster, grid, pipeline stages, shared memory,
// and for the backward the gw partials, workspace and finalize grid. The
// launchers (src/cuda/forward.cuh, backward.cuh) read it and decide nothing;
// the kernel templates read the same constexpr functions, with static_asserts
// tying the two. Reasons for the constants: docs/performance.md.
//
// Dispatch table (plan_test's DispatchTableMatchesThePlanner checks it
// against the planner for every D in 1..2^20, both I/O paths, both
// directions, sm_90 with clusters of 16 and of 8, and sm_80):
//
//   band      D, 16-bit        D, fp32          Io::kVector (all rows 16-byte   Io::kElement (any other alignment)
//                                               aligned)
//   kRows     1..16384         1..8192          kForwardRows (one row group    kForwardRowsElement (y in aligned
//                                               per CTA, no stages) /          16-byte blocks; kForwardRowsPaired
//                                                                              where x and y share one offset
//                                                                              in every row: Io) /
//                                                                              kBackwardRowsShifted
//                                               kBackwardRows (kBackwardRows-
//                                               Direct, no stages, where no
//                                               CTA has a second row group;
//                                               kBackwardRowsDecode where
//                                               every row fits one CTA of
//                                               max(tpr, 32) threads)
//             cpt = 2 for 13..16, 49..64 and 257..512 chunks (D 97..128, 385..512, 2049..4096 at 16-bit),
//             and at fp32 769..1024 chunks (D 3073..4096), else 4;
//             tpr = smallest power of two >= ceil(ceil(D / vec) / cpt) (cpt 4: 1..64, 256, 512; cpt 2: 8, 32, 256,
//             and 512 at fp32);
//             D = tpr x cpt x vec (the powers of two 32..16384, fp32 16..8192): kForwardRows's exact instances
//             (forward_rows_exact): the plain y, the weight offset's and the rounded x_hat's (w in x's dtype),
//             and the residual add's plain y;
//             CTA = max(tpr, 256) fwd / max(tpr, 512) bwd threads   (each row's aligned blocks staged, gx in
//                                                                    aligned blocks where tpr <= 32, or where
//                                                                    every operand shares one offset in every
//                                                                    row: backward_paired_rows)
//   kCluster  16385..131072    8193..65536      kForwardCluster /              kForwardClusterElement /
//             (..262144 and ..131072 where the  kBackwardCluster (st.async     kBackwardClusterElement
//             device co-schedules clusters of   exchange, cp.async stages)     (element loads into registers)
//             16, as the H200 does; else 8)
//   kLooped   above that; pre-sm_90 above kRows  kForwardLooped / kBackwardLooped (x read twice; both paths)
//
//   vec = 16 / sizeof(T) (8 at 16-bit, 4 at fp32); cluster = smallest power
//   of two with cluster * 512 * 4 * vec >= D. The backward adds
//   kFinalize (finalize_gw_kernel) after the main kernel when it has more
//   than one gw partial; with one partial the main kernel writes gw.
//
// Work split. A row of D elements is cut into chunks of one 16-byte vector
// (vec elements; the last chunk may be partial). A row is owned by
// `threads_per_row` threads of one CTA, or of each CTA of a cluster of
// `cluster` CTAs. Thread g (0 <= g < G = threads_per_row * cluster, CTA rank
// major) owns chunks g, g + G, g + 2G, ..., at most chunks_per_thread of
// them (cpt: 2 in the rows band at 13..16, 49..64 and 257..512 chunks, and
// at fp32 769..1024, else 4), held in registers, so x (and gy) is read from
// DRAM once. The band and cpt are chosen from the chunk count and the element
// size alone, identical for forward and backward.
//
// Reduction of a row: each thread adds its elements in order (one running
// sum), an xor butterfly over the lanes of each warp of the row, the row's
// warp sums in warp order, then the cluster's CTA sums in rank order. The
// order depends on D alone (never on the number of rows, the row's position,
// or alignment), so results are batch-invariant, and backward's recomputed
// rstd is bitwise the forward's (same geometry, same code).
//
// The rows-band forward with 16-byte I/O takes one row group per CTA, the
// row in registers, and leaves the balancing to the hardware's CTA scheduler.
// The other kernels are persistent: each CTA (or cluster) walks row groups
// unit, unit + units, ... (the rows-band forward's element path may instead
// give each CTA one group, or a tile of consecutive groups). With 16-byte I/O
// the cluster-band forward and the backward kernels have each thread copy
// its own chunks of the next `stages - 1` row groups into its own
// shared-memory slots with cp.async while it works on the current group (a
// per-thread pipeline: no barrier guards a stage, since only the copying
// thread reads it), so the bytes in flight per SM are bounded by shared
// memory rather than by registers. With element I/O the rows-band backward
// stages each row's aligned 16-byte blocks the same way, a chunk then reading
// a neighbour's block too (after the row slot's barrier;
// shifted_stage_bytes); the forward and the cluster-band backward load
// elements into registers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#if defined(__CUDACC__)
#define RMSNORM_HD __host__ __device__
#else
#define RMSNORM_HD
#endif

namespace rmsnorm::plan {

enum class Band : int { kRows = 0, kCluster = 1, kLooped = 2 };

// kVector: every row start of every operand is 16-byte aligned (and so is
// the weight): whole chunks move as single 16-byte loads and stores.
// kElement: anything else.
// The forward's x and y may also be paired (forward_io): each row of x at the
// same offset in its 16-byte block as the same row of y, the weight 16-byte
// aligned or none; kPaired: one offset for every row, kPairedRows: the offset
// changes from row to row (odd row strides). The rows-band forward runs
// kForwardRowsPaired with both (with kPairedRows it takes the rows of one
// offset after another). The plain backward's kPaired (backward_io: x, gy, gx
// and g_h at one offset, every row) runs the shifted rows kernel with that
// offset a constant where backward_paired_rows. Every other kernel treats
// them as kElement.
enum class Io : int { kVector = 0, kElement = 1, kPaired = 2, kPairedRows = 3 };

enum class Direction : int { kForward = 0, kBackward = 1 };

// The main kernel of a launch (see the table above).
enum class Kernel : int {
  kForwardRows,
  kForwardRowsElement,
  kForwardRowsPaired,
  kForwardCluster,
  kForwardClusterElement,
  kForwardLooped,
  kBackwardRows,
  kBackwardRowsShifted,
  kBackwardRowsDirect,
  kBackwardRowsDecode,
  kBackwardRowsSplit,
  kBackwardCluster,
  kBackwardClusterElement,
  kBackwardLooped,
};

inline constexpr int kChunkBytes = 16;
// Kernels index within a row in 32 bits.
inline constexpr int64_t kMaxCols = (int64_t{1} << 31) - 64;
inline constexpr int kWarp = 32;
inline constexpr int kMaxThreadsPerSm = 2048;  // sm_80 and sm_90
// Chunks per thread (docs/performance.md, "Chunks per thread"): every band
// holds kMaxChunksPerThread, except the rows band's rows that 2 chunks per
// thread spread over 256 threads (chunks in (256, 512]: D 2049..4096 at
// 16-bit, 1025..2048 at fp32), or over 8 or 32 threads that all hold two
// (chunks in (3/2 tpr, 2 tpr]: D 97..128 and 385..512 at 16-bit, 49..64 and
// 193..256 at fp32). At 257..512 chunks 4 chunks would mean 128 threads per
// row; there, and at the small D, 2 chunks give a shorter dependent chain per
// thread, twice the threads per row (a warp's loads cover whole 128-byte lines
// of a row from 8 threads up), and in the forward 1536 threads per SM instead
// of 1024. Where half of 8 or 32 threads would hold one chunk (D = 384: 48
// chunks over 32 threads) 4 chunks over 16 threads, 3 each, were faster; 2
// chunks at every D <= 4096 lost in the D = 1024 forward. A function of D
// alone, so the summation order stays batch-invariant and the same in both
// directions. fp32 rows of 769..1024 chunks (D 3073..4096) take 512 threads of
// 2 chunks as well (kFewChunksTprF32): the fp32 8192 x 4096 VJP took 0.905x
// the time of 1024 threads of 4 chunks (docs/performance.md, "Chunks per thread").
inline constexpr int kMaxChunksPerThread = 4;
inline constexpr int kFewChunksPerThread = 2;
inline constexpr int kFewChunksTpr = 256;     // the largest threads per row with kFewChunksPerThread at 16-bit
inline constexpr int kFewChunksTprF32 = 512;  // the largest at fp32
RMSNORM_HD constexpr bool few_chunks_tpr(int tpr, int esize) {
  return tpr == 8 || tpr == 32 || tpr == kFewChunksTpr || (esize == 4 && tpr == kFewChunksTprF32);
}
RMSNORM_HD constexpr int rows_chunks_per_thread(int64_t chunks, int esize) {
  // The threads per row at 2 chunks: the smallest power of two >= ceil(chunks / 2).
  int64_t tpr = 1;
  while (tpr * kFewChunksPerThread < chunks) tpr *= 2;
  if (tpr > kFewChunksTprF32 || !few_chunks_tpr(static_cast<int>(tpr), esize)) return kMaxChunksPerThread;
  // Every one of the row's threads holds two chunks (more than 3/4 of 2 tpr), except at 257..512 chunks.
  const bool few = tpr == kFewChunksTpr || 2 * chunks > 3 * tpr;
  return few ? kFewChunksPerThread : kMaxChunksPerThread;
}
inline constexpr int kMaxRowsTpr = 512;  // kRows: threads per row (one CTA)
inline constexpr int kClusterTpr = 512;  // kCluster: threads per CTA (one row slot)
inline constexpr int kMaxPortableCluster = 8;
inline constexpr int kMaxCluster = 16;  // non-portable; used where the device can co-schedule it
inline constexpr int kLoopedThreads = 1024;
// The kernels of fp32 x in the looped band's geometry (the fp32 residual stream's forward and backward, and fp32 x
// with a 16-bit y: forward_looped_add_f32_kernel, backward_looped_shares_kernel): the row of kLoopedThreads
// summing threads, run by CTAs of kLoopedShareThreads threads that each hold kLoopedThreads / kLoopedShareThreads
// of them (row_sum_shares: the same sum, bit for bit), so that several rows share an SM where the 1024-thread CTA
// fitted two (forward) or one (backward) (docs/fusions.md, "The residual stream in fp32").
inline constexpr int kLoopedShareThreads = 256;
inline constexpr int kLoopedShareHeldCtasPerSm = 2;  // F32Forward::kHeld (below)
inline constexpr int kLoopedShareCtasPerSm = 4;  // <= 64 registers (60): x and the residual of 4 chunks in flight; 5 or 6 spilled
inline constexpr int kLoopedShares = kLoopedThreads / kLoopedShareThreads;  // summing threads per thread
// The forward of the fp32 forms in shares (forward_looped_add_f32_kernel's kForm), chosen by f32_shares_forward:
// - kReadBack: any row; after the reduction a thread reads its chunks of x (or h) back for y, through L1 or L2.
// - kHeld: a one-pass row whose every access is a whole vector (f32_shares_vec), at most one wave of its CTAs
//   (f32_shares_held_rows): x (or h) and w' stay in registers from their load to y, on kLoopedShareThreads threads
//   at kLoopedShareHeldCtasPerSm per SM (72 registers with the add, 95-96 without): the rows are latency-bound,
//   and the weight's load overlaps x's.
// - kHeldLateW: the same rows past that wave: x (or h) held, w' loaded after the reduction (from L1 / L2: every row
//   reads it), at kLoopedShareLateThreadsPerSm threads per SM (40 registers). H100, 8192 x 4096 fp32 x with a bf16
//   y: 70.3 us against the read-back kernel's 74.0 (ncu: 85% of DRAM peak against 79%, no read-back through L2);
//   at 1 and 128 rows it lost to kHeld (3.71 us against 3.23 and 4.61 against 4.32; docs/fusions.md).
// - kCluster: a row of more than one pass whose every access is a whole vector (f32_cluster_vec: D 4097..16384),
//   held across a cluster of kLoopedShares CTAs of kLoopedShareThreads (forward_f32_cluster_kernel), one row per
//   cluster: thread t of the cluster's CTA q is summing thread q kLoopedShareThreads + t and holds its chunks
//   (f32_cluster_passes of them) from their load to y; the warp sums go to every CTA of the cluster, which adds them
//   in warp order, so no read-back; w' loaded after the reduction. At 3-4 passes (D 8193..16384) for any rows; at 2
//   (D 4097..8192) for at most one row per SM (f32_cluster_max_rows), where it lost to kReadBack past that (H100:
//   1 x 8192 fp32 x with a bf16 y 6.96 -> 3.60 us, 128 x 8192 8.10 -> 5.89, 264 x 8192 9.26 -> 9.86, 16384 x 7168
//   238 -> 292; 4096 x 16384 173.6 -> 150.5, the residual stream's forward there 327.7 -> 280.8). Persistent
//   clusters lost everywhere (docs/fusions.md, "Rows past one pass held across a cluster").
// - kReadBackVec: kReadBack's row of fp32 x with a 16-bit y (no add) where every access is a whole vector and the
//   row is two passes (f32_readback_vec: D 4097..8192): no element paths; x's first read kept in L1 (evict_last), its
//   read-back the last use (evict_first), each chunk's w' loaded with its read-back, before the first y store.
// - kReadBackWide: fp32 x with a 16-bit y (no add) on rows of three or four passes of whole vectors (f32_readback_wide:
//   D 8193..16384) from kF32WideMinRowsPerSm rows per SM, one row per CTA of kLoopedThreads threads (one summing
//   thread each, two CTAs per SM) with f32_wide_passes(chunks) chunks (chunks_per_thread), all loaded before the
//   first add and kept in L1, read back for y three or two passes at a time (forward_f32_wide_kernel).
enum class F32Forward { kReadBack, kHeld, kHeldLateW, kCluster, kReadBackVec, kReadBackWide };
// kReadBack and kHeldLateW on a one-pass row of at most kLoopedShares * 128 chunks (D <= 2048) run on a CTA of 128
// threads (64 at D <= 1024) holding the row's first 4 * 128 (4 * 64) summing threads, the only ones with a chunk, at
// the same threads per SM: where 256 threads held a row of 512 chunks, half their shares were empty and a CTA had
// half the bytes in flight that its threads could hold (docs/fusions.md, "Small CTAs for short fp32 rows"). kHeld
// keeps kLoopedShareThreads.
inline constexpr int kLoopedShareMinThreads = 64;
inline constexpr int kLoopedShareThreadsPerSm = kLoopedShareCtasPerSm * kLoopedShareThreads;
inline constexpr int kLoopedShareLateThreadsPerSm = 1536;  // kHeldLateW: 40 registers; at 2048 (32) ptxas spilled
RMSNORM_HD constexpr int f32_shares_cta(int64_t chunks, F32Forward form) {
  if (form == F32Forward::kReadBackWide) return kLoopedThreads;
  if (form == F32Forward::kHeld || form == F32Forward::kCluster) return kLoopedShareThreads;
  int cta = kLoopedShareMinThreads;
  while (cta < kLoopedShareThreads && int64_t{cta} * kLoopedShares < chunks) cta *= 2;
  return cta;
}
// The CTAs per SM that forward_looped_add_f32_kernel's launch bound asks for (kCluster: f32_cluster_ctas_per_sm).
RMSNORM_HD constexpr int f32_forward_ctas_per_sm(F32Forward form, int cta) {
  return form == F32Forward::kHeld           ? kLoopedShareHeldCtasPerSm
         : form == F32Forward::kHeldLateW     ? kLoopedShareLateThreadsPerSm / cta
         : form == F32Forward::kReadBackWide ? kMaxThreadsPerSm / cta
                                              : kLoopedShareThreadsPerSm / cta;
}
// kCluster: the chunks a summing thread holds (its passes over the row): 2 up to 2 kLoopedThreads chunks (D <= 8192),
// else kF32ClusterMaxPasses (D <= 16384); and the kernel's launch bound: 2048 threads per SM at 2 (32 registers, no
// spills), kLoopedShareLateThreadsPerSm at 4 (40 registers).
inline constexpr int kF32ClusterMaxPasses = 4;
RMSNORM_HD constexpr int f32_cluster_passes(int64_t chunks) {
  return chunks <= 2 * int64_t{kLoopedThreads} ? 2 : kF32ClusterMaxPasses;
}
RMSNORM_HD constexpr int f32_cluster_ctas_per_sm(int passes) {
  return (passes == 2 ? kMaxThreadsPerSm : kLoopedShareLateThreadsPerSm) / kLoopedShareThreads;
}
inline constexpr int kLoopedCtasPerSm = 2;  // backward: two partial rows per SM
// backward_f32_cluster_kernel's launch bound (f32_cluster_backward_launch): a thread holds x, gy, g_h, w' and the gw
// sums of its chunks across its rows, at 2 passes in 64 registers (4 CTAs per SM), at 4 in 128 (2 per SM).
RMSNORM_HD constexpr int f32_cluster_backward_ctas_per_sm(int passes) { return passes == 2 ? 4 : 2; }
RMSNORM_HD constexpr int f32_cluster_backward_index(int passes) { return passes == 2 ? 0 : 1; }
// Forward: CTAs of >= 256 threads, 1024 threads per SM with 4 chunks per
// thread (64 registers hold a thread's x and w' chunks without spilling),
// 1536 with 2 (40 registers) (docs/performance.md, "Forward CTA size").
inline constexpr int kForwardMinCtaThreads = 256;
inline constexpr int kForwardThreadsPerSm = 1024;
inline constexpr int kForwardFewThreadsPerSm = 1536;
// Backward: one 512-thread CTA per SM (128 registers per thread: x, gy and
// the prefetched x and gy; the fp32 gw sums live in registers). The
// workspace holds one fp32 partial row per CTA (or cluster), so it is at
// most SMs * D * 4 bytes (docs/performance.md, "Backward CTA size").
inline constexpr int kBackwardCtaThreads = 512;
inline constexpr int kBackwardCtasPerSm = 1;

RMSNORM_HD constexpr int vec_elems(int esize) { return kChunkBytes / esize; }
// kForwardRowsPaired's whole-row form (forward_rows_paired_kernel<..., kPartial = false>: the row's head and
// tail as a few aligned accesses, the tail's loads in a branch the warp votes on): D a multiple of the chunk
// width, and every warp's rows at one offset, so that its lanes take the same offset's code together: one offset
// for every row (kPaired), or a warp within one row (threads_per_row >= 32; kPairedRows, offsets changing row by
// row). Otherwise the form with element paths, which at 8192 x 4096 bf16 with a row stride of 4097 took 63.6-64.0
// us against this form's 53.5-53.7 (docs/performance.md, "Misaligned forward: what the odd row length costs").
inline bool paired_whole_rows(Io io, int64_t cols, int esize, int threads_per_row) {
  const bool one_offset_per_warp = io == Io::kPaired || (io == Io::kPairedRows && threads_per_row >= kWarp);
  return one_offset_per_warp && cols % vec_elems(esize) == 0;
}

// The element form's y of a row's head and tail by span (forward_rows_paired_kernel<..., kPartial = true>):
// where every row of the instance holds more than two chunks (threads per row >= 2; Plan.PairedEdgeSpans checks
// it at every D), so the head is whole and the tail ends inside chunk `blocks` + 1. At 2 chunks per thread it took
// 0.93-0.95x the element form's time at 32768 x 511 bf16 (32 threads per row), 131072 x 127 (8) and 262144 x 511,
// at 4 chunks (one copy of the tail code) 0.87-0.92x at D = 255..1023 16-bit (2..32 threads per row). With more
// threads per row it first lost (1.02-1.03x at 8192 x 4095 bf16, 256 x 2, where it spilled); since the row order
// takes no registers (RowClassOrder) it compiles without spills at 64..512 threads per row, where the element
// form spills 160-176 bytes (ptxas -v, sm_90), and is taken there too (docs/performance.md, "Misaligned forward:
// what the odd row length costs"). With one thread per row the element path stays (the span form spilled
// 150-1300 bytes).
RMSNORM_HD constexpr bool paired_edge_spans(int threads_per_row) {
  return threads_per_row >= 2;
}

RMSNORM_HD constexpr int64_t chunks_of(int64_t cols, int esize) {
  return (cols + vec_elems(esize) - 1) / vec_elems(esize);
}
RMSNORM_HD constexpr int forward_cta_threads(int tpr) {
  return tpr > kForwardMinCtaThreads ? tpr : kForwardMinCtaThreads;
}
// The fp32 rows of 512 threads of 2 chunks: 4 CTAs of 512 threads per SM (32 registers) in the 16-byte direct
// kernel (kForwardRows, the quantized forwards included); at 1536 threads per SM that forward was 1.023x slower than
// 1024 threads of 4 chunks, at 2048 it is level (0.997x). The misaligned kernels (kForwardRowsPaired, the element
// path) hold two blocks per chunk or element paths and spilled at 32 registers (the paired one 192 bytes: 8192 x
// 4096 f32 base + 1 element forward 113.5 us, against 77.4 with 256 threads of 4 chunks): 1536 threads per SM there
// (the paired kernel 40 registers without spills, the element path spills 12 bytes; measured at 8192 x 4096 base + 1
// element 85.95 us, 99.81 at 1024, 113.20 at 2048; 8192 x 4095 89.04, 103.71, 97.87).
inline constexpr int kForwardWideThreadsPerSm = 2048;
RMSNORM_HD constexpr int forward_threads_per_sm(int tpr, int cpt, Kernel kernel) {
  return cpt != kFewChunksPerThread                              ? kForwardThreadsPerSm
         : tpr == kFewChunksTprF32 && kernel == Kernel::kForwardRows ? kForwardWideThreadsPerSm
                                                                     : kForwardFewThreadsPerSm;
}
RMSNORM_HD constexpr int forward_ctas_per_sm(int tpr, int cpt, Kernel kernel) {
  return forward_threads_per_sm(tpr, cpt, kernel) / forward_cta_threads(tpr);
}
RMSNORM_HD constexpr int backward_cta_threads(int tpr) { return tpr > kBackwardCtaThreads ? tpr : kBackwardCtaThreads; }
// kBackwardRowsDecode: the direct backward where all the rows fit in one CTA of
// max(tpr, 32) threads (one row, or at tpr < 32 up to 32 / tpr rows): no
// empty row slots in the barriers and the gw slot sum, which at one row in a
// 512-thread CTA were the largest stall (docs/performance.md, "Decode").
RMSNORM_HD constexpr int backward_decode_cta_threads(int tpr) { return tpr > kWarp ? tpr : kWarp; }
RMSNORM_HD constexpr int warps_per_row(int tpr) { return tpr > kWarp ? tpr / kWarp : 1; }
// Thread t of a CTA works on row slot t / tpr, as lane t % tpr of that row.
RMSNORM_HD constexpr int row_slot(int thread, int tpr) { return thread / tpr; }
// Scratch entry where warp w of row slot s leaves its partial (tpr > 32);
// two buffers (by row parity) so that one barrier per row suffices.
RMSNORM_HD constexpr int scratch_index(int parity, int slot, int warp_in_row, int tpr, int slots) {
  return (parity * slots + slot) * warps_per_row(tpr) + warp_in_row;
}
// Named barrier of a row slot (0 = the whole CTA when it holds one slot).
// Hardware has 16 (0..15); slots > 1 only for tpr in 64..256, at most 8 slots.
RMSNORM_HD constexpr int slot_barrier_id(int slot, int slots) { return slots == 1 ? 0 : 1 + slot; }

// Element-I/O forward: y written in aligned 16-byte blocks. A row whose first
// byte lies `offset_bytes` past a 16-byte boundary has store_head_cols
// columns before its first boundary, then store_blocks whole blocks of vec
// columns (block k: columns head + k vec ..; the owner of chunk k writes it),
// then a tail of fewer than vec columns (the owner of the last chunk writes
// it, and the owner of chunk 0 the head, by element).
RMSNORM_HD constexpr int store_head_cols(int offset_bytes, int esize) {
  return ((kChunkBytes - offset_bytes % kChunkBytes) % kChunkBytes) / esize;
}
// I: cols' type (int64_t on the host; the paired forward passes uint32_t, where the division is a shift, the int64
// form having cost a 64-bit signed division per offset in every row's prologue).
template <typename I>
RMSNORM_HD constexpr I store_blocks(I cols, int head, int esize) {
  return cols > static_cast<I>(head) ? (cols - static_cast<I>(head)) / static_cast<I>(vec_elems(esize)) : I{0};
}

// Division by a divisor fixed for a launch, as a multiply and a shift (Granlund and Montgomery, "Division by
// Invariant Integers using Multiplication", 1994, theorem 4.2 with N = 31): for 1 <= d < 2^31, l = ceil(log2 d)
// and m = ceil(2^(31 + l) / d), n / d = (n m) >> (31 + l) for every 0 <= n < 2^31. m < 2^32 (d > 2^(l - 1), or
// d = 1 and m = 2^31), so n m is one 32 x 32 -> 64-bit multiply. The paired forward divides by the class sizes of
// its row order in every row (RowClassOrder below); as an integer division that was about 60 instructions per row
// and thread.
struct Divider {
  uint32_t m = 1u << 31;
  uint32_t shift = 31;  // 31 + l
};
RMSNORM_HD constexpr Divider make_divider(uint32_t d) {
  uint32_t l = 0;
  while (l < 31 && (1u << l) < d) ++l;
  Divider v;
  v.shift = 31 + l;
  v.m = static_cast<uint32_t>(((uint64_t{1} << v.shift) + d - 1) / d);
  return v;
}
RMSNORM_HD constexpr uint32_t divide(uint32_t n, const Divider& v) {
  return static_cast<uint32_t>((static_cast<uint64_t>(n) * v.m) >> v.shift);
}

// The paired forward's row order where row offsets change row by row (plan::Io::kPairedRows): a row's offset in
// its 16-byte block repeats every `period` rows (period = 16 / gcd(the row stride in bytes mod 16, 16)), so rows
// k, k + period, .. share offset class k; position j of the order runs through class 0's rows, then class 1's, ...
// (classes k < rem hold q + 1 rows, the others q; rows = q period + rem). The CTAs that run at once then take one
// or two offsets' code, not all of them (docs/performance.md, "Misaligned forward: the offset as a constant").
// Set up on the host for each launch (the kernel's parameters); row_at maps a position to its row.
struct RowClassOrder {
  bool classes = false;  // false: rows in order (a row stride of whole 16-byte blocks, or rows >= 2^31)
  uint32_t period_log2 = 0;
  uint32_t q = 0;
  uint32_t big = 0;  // rem (q + 1): the positions of the classes of q + 1 rows
  uint32_t rem = 0;
  Divider by_big;    // q + 1
  Divider by_small;  // q (1 where q = 0: no position then reaches it)
};
RMSNORM_HD constexpr RowClassOrder row_class_order(int64_t rows, int64_t row_stride_bytes) {
  RowClassOrder o;
  const int s = static_cast<int>(row_stride_bytes & (kChunkBytes - 1));
  if (s == 0 || rows <= 0 || rows > 0x7fffffff) return o;
  int tz = 0;
  while (((s >> tz) & 1) == 0) ++tz;
  o.classes = true;
  o.period_log2 = static_cast<uint32_t>(4 - tz);  // period = 16 >> tz
  const uint32_t r = static_cast<uint32_t>(rows);
  o.q = r >> o.period_log2;
  o.rem = r & ((1u << o.period_log2) - 1u);
  o.big = o.rem * (o.q + 1u);
  o.by_big = make_divider(o.q + 1u);
  o.by_small = make_divider(o.q > 0 ? o.q : 1u);
  return o;
}
// The row at position j of the order (j itself where the order keeps rows in order or j >= rows: a group's empty
// slots).
RMSNORM_HD constexpr int64_t row_at(const RowClassOrder& o, int64_t j, int64_t rows) {
  if (!o.classes || j >= rows) return j;
  const uint32_t jj = static_cast<uint32_t>(j);
  uint32_t k = 0, i = 0;
  if (jj < o.big) {
    k = divide(jj, o.by_big);
    i = jj - k * (o.q + 1u);
  } else {
    const uint32_t t = divide(jj - o.big, o.by_small);
    k = o.rem + t;
    i = jj - o.big - t * o.q;
  }
  return static_cast<int64_t>(k) + (static_cast<int64_t>(i) << o.period_log2);
}

// cp.async pipeline depth (row groups staged per thread, the current one
// included): as many as fit, at most kMaxStages (docs/performance.md,
// "Pipeline depth").
inline constexpr int kMaxStages = 3;
// Shared memory of one stage: every thread's cpt chunks of each operand
// (forward x; backward x and gy), uint4 [operand][chunk it][thread].
RMSNORM_HD constexpr size_t stage_bytes(int cta_threads, int operands, int cpt) {
  return static_cast<size_t>(cta_threads) * cpt * kChunkBytes * operands;
}
// Rows-band backward with element I/O (misaligned operands): each row's
// aligned 16-byte blocks are staged instead (block v = bytes [16 v, 16 v + 16)
// from the row's first byte rounded down to 16; v = 0..chunks): thread t of a
// slot copies blocks it * tpr + t into the same slots as the aligned layout,
// the slot's block v = cpt * tpr (when a row fills every chunk) into one
// extra entry per slot; a chunk is then its own block and the next (a
// neighbour's, after a barrier) shifted by the row's misalignment.
// uint4 [operand][cpt][thread] then [operand's extra][slots].
RMSNORM_HD constexpr size_t shifted_stage_bytes(int cta_threads, int slots, int operands, int cpt) {
  return static_cast<size_t>(cta_threads * cpt + slots) * kChunkBytes * operands;
}

// The backward's end-of-kernel sum of the gw partials of a CTA's row slots:
// a table of fp32 entries, one per (chunk it, element j) row and CTA thread.
// Thread t writes its sums down column t; then element e = (it, l, j) of a
// row slot (j fastest) is read at rows it * vec + j, columns s * tpr + l.
// A warp's read covers vec values of j and 32 / vec of l: with rows of
// `cta_threads` floats (a multiple of 32) every j fell in one bank (an 8-way
// conflict at 16-bit), so rows are padded by 32 / vec floats, which puts
// (j, l) in bank (j * 32 / vec + l) % 32: all 32 distinct (docs/performance.md,
// "gw slot sum").
RMSNORM_HD constexpr int combine_stride(int cta_threads, int esize) { return cta_threads + kWarp / vec_elems(esize); }
RMSNORM_HD constexpr int combine_index(int it, int j, int thread, int cta_threads, int esize) {
  return (it * vec_elems(esize) + j) * combine_stride(cta_threads, esize) + thread;
}
// Its size in bytes; none with one slot (the thread's sums are the CTA's).
RMSNORM_HD constexpr size_t combine_smem_of(int cta_threads, int tpr, int esize, int cpt) {
  return cta_threads / tpr == 1
             ? 0
             : sizeof(float) * static_cast<size_t>(combine_stride(cta_threads, esize)) * cpt * vec_elems(esize);
}
RMSNORM_HD constexpr size_t backward_combine_smem(int tpr, int esize, int cpt) {
  return combine_smem_of(backward_cta_threads(tpr), tpr, esize, cpt);
}
RMSNORM_HD constexpr size_t backward_decode_combine_smem(int tpr, int esize, int cpt) {
  return combine_smem_of(backward_decode_cta_threads(tpr), tpr, esize, cpt);
}

struct Device {
  int sm_count = 132;
  int cc_major = 9;
  size_t max_smem_optin = 227 * 1024;  // per CTA, bytes
  size_t smem_per_sm = 228 * 1024;     // per SM, bytes
  int max_cluster = 8;                 // largest cluster of kClusterTpr-thread CTAs the device co-schedules, it and
                                       // every smaller size, for both cluster kernels
  bool sm90_code = false;              // the kernels carry compute_90 code (programmatic dependent launch)
  // Clusters of 2, 4, 8, 16 CTAs (index log2 - 1) the device runs at once
  // with the forward / backward cluster kernels (cudaOccupancyMaxActiveClusters);
  // 0: unknown, the grid is sized from the SM count alone.
  int forward_active_clusters[4] = {0, 0, 0, 0};
  int backward_active_clusters[4] = {0, 0, 0, 0};
  // Clusters of kLoopedShares CTAs of backward_f32_cluster_kernel the device runs at once, at 2 and at
  // kF32ClusterMaxPasses passes (f32_cluster_backward_index); 0: unknown (from the SM count and the launch bound).
  int f32_backward_active_clusters[2] = {0, 0};
  // The fp32 forms' cluster kernels run here (false where cudaOccupancyMaxActiveClusters gives 0 clusters of
  // kLoopedShares CTAs of backward_f32_cluster_kernel at either pass count): f32_cluster_vec then holds nowhere.
  bool f32_clusters = true;
};

// Index of a cluster size in Device::*_active_clusters (2 -> 0 ... 16 -> 3).
RMSNORM_HD constexpr int cluster_index(int cluster) {
  return cluster <= 2 ? 0 : cluster <= 4 ? 1 : cluster <= 8 ? 2 : 3;
}

// Geometry of one row: the same for every row of a call, and for both I/O
// paths (so alignment never changes a reduction).
struct RowPlan {
  Band band = Band::kRows;
  int esize = 2;
  int vec = 8;                // elements per chunk
  int64_t chunks = 0;         // per row
  int threads_per_row = 1;    // per CTA
  int chunks_per_thread = 0;  // rows_chunks_per_thread (kRows), kMaxChunksPerThread (kCluster); per pass step (kLooped)
  int cluster = 1;            // CTAs per row
  int cta_threads = 128;      // threads per CTA
  int rows_per_cta = 1;       // row slots per CTA
};

// Row geometry for a direction (the backward's CTAs are larger).
RowPlan row_plan(int64_t cols, int esize, Direction direction, const Device& dev);

// Whether elems elements of esize bytes span a whole number of 16-byte chunks. In unsigned arithmetic: a row stride
// may be as large as int64 allows where there is one row (only rows - 1 strides must fit an extent), and 2^64 is a
// multiple of 16, so the wrapped product has the true product's remainder (for a negative difference of strides
// too).
inline bool whole_chunks(int64_t elems, int esize) {
  return static_cast<uint64_t>(elems) * static_cast<uint64_t>(esize) % kChunkBytes == 0;
}

// 16-byte I/O needs every row start of every operand 16-byte aligned; a null
// operand (no weight) does not count.
inline bool rows_aligned16(const void* p, int64_t stride, int esize) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % kChunkBytes == 0 && whole_chunks(stride, esize));
}

// The I/O path of a call: kVector when every operand's rows start on 16
// bytes (the launchers pass each operand's pointer and row stride).
struct RowsOperand {
  const void* data;
  int64_t stride;  // elements; 0 for a vector
};
inline Io io_of(std::initializer_list<RowsOperand> operands, int esize) {
  for (const RowsOperand& o : operands)
    if (!rows_aligned16(o.data, o.stride, esize)) return Io::kElement;
  return Io::kVector;
}
// The plain forward's I/O path (x, y and the weight; plan.hpp's Io).
inline Io forward_io(RowsOperand x, RowsOperand y, const void* w, int esize) {
  const Io io = io_of({x, y, {w, 0}}, esize);
  if (io == Io::kVector || !rows_aligned16(w, 0, esize)) return io;
  const auto xo = reinterpret_cast<uintptr_t>(x.data) % kChunkBytes;
  const auto yo = reinterpret_cast<uintptr_t>(y.data) % kChunkBytes;
  if (xo != yo || xo % static_cast<uintptr_t>(esize) != 0 || !whole_chunks(x.stride - y.stride, esize))
    return Io::kElement;
  return whole_chunks(x.stride, esize) ? Io::kPaired : Io::kPairedRows;
}

// The plain backward's I/O path (x, gy, gx, g_h where given, and the weight). kPaired: every row of every
// operand at one offset in its 16-byte block (each base at that offset, a multiple of the element size; each
// row stride a whole number of 16-byte blocks), the weight 16-byte aligned or none. The rows band's shifted
// kernel then takes the offset as a constant where D is also a multiple of the chunk width
// (backward_rows_paired); every other kernel treats kPaired as kElement.
inline Io backward_io(std::initializer_list<RowsOperand> rows, const void* w, int esize) {
  if (!rows_aligned16(w, 0, esize)) return Io::kElement;
  const Io io = io_of(rows, esize);
  if (io == Io::kVector) return io;
  const void* first = nullptr;
  for (const RowsOperand& o : rows) {
    if (o.data == nullptr) continue;
    if (first == nullptr) first = o.data;
    const auto off = reinterpret_cast<uintptr_t>(o.data) % kChunkBytes;
    if (off != reinterpret_cast<uintptr_t>(first) % kChunkBytes || off % static_cast<uintptr_t>(esize) != 0 ||
        !whole_chunks(o.stride, esize))
      return Io::kElement;
  }
  return Io::kPaired;
}
// Where backward_rows_paired's offset is a template parameter of the kernel (one kernel per offset, chosen on the
// host) rather than a switch inside it: the 16-bit 4-chunk kernels at 64 threads per row (D 1025..2048). With the
// seven offsets' loops in one kernel they spilled (ptxas, sm_90: bf16 420 bytes, f16 300); one offset alone
// compiles without spills. Every other shifted kernel holds the switch (the 16-bit 4-chunk ones at 2..32 threads per
// row spill 16 bytes with it: backward_paired_barrier).
RMSNORM_HD constexpr bool backward_paired_per_offset(int tpr, int cpt, int esize) {
  return esize == 2 && cpt == kMaxChunksPerThread && tpr == 64;
}
// Whether the paired path's held weights go through an empty asm at each use (PairedWeights::held): ptxas hoisted
// their conversions out of the row loop and spilled the fp32 forms at f16 with 4 chunks per thread (380 and 716
// bytes at 256 and 512 threads per row); with 4 chunks and at most 32 threads per row bf16 spilled 24-40 bytes
// without it and 16 with it (f16 16 with it); at bf16 with 512 threads per row the barrier itself cost 16 bytes.
RMSNORM_HD constexpr bool backward_paired_barrier(int tpr, int cpt, bool f16) {
  return cpt == kMaxChunksPerThread && (f16 || tpr <= 32);
}
// backward_rows_paired's condition: kPaired and D a multiple of the chunk width.
inline bool backward_paired_rows(Io io, int64_t cols, int esize) {
  return io == Io::kPaired && cols % vec_elems(esize) == 0;
}

// The grid of the persistent forward kernels (the cluster band and the rows
// band's element path): persistent (the CTAs that fit at once) or one CTA
// per row group where a CTA holds many short rows and there are many groups
// per resident CTA (docs/performance.md, "Forward grid"). The rows band's
// 16-byte path always takes one group per CTA. The grid never changes a
// row's reduction.
inline constexpr int kOneGroupMinRowsPerCta = 8;
inline constexpr int64_t kOneGroupMinGroupsPerCta = 8;
inline bool forward_one_group_per_cta(const RowPlan& row, int64_t groups, int64_t resident_ctas) {
  return row.band == Band::kRows && row.rows_per_cta >= kOneGroupMinRowsPerCta &&
         groups >= kOneGroupMinGroupsPerCta * resident_ctas;
}

// Rows band's element path outside the one-group rule, with many groups:
// each CTA takes a tile of kForwardTileGroups consecutive row groups, and the hardware's CTA
// scheduler balances the SMs, where there are at least kForwardTileMinWaves
// tiles per resident CTA; else the persistent grid (docs/performance.md,
// "Forward tiles").
inline constexpr int64_t kForwardTileGroups = 4;
inline constexpr int64_t kForwardTileMinWaves = 6;

// The finalize kernel's geometry: 32 columns x finalize_lanes(count) partial
// lanes per CTA; each lane loads its partials kFinalizeBatch at a time, so
// that they are in flight together (docs/performance.md, "Finalize").
inline constexpr int kFinalizeCols = 32;
inline constexpr int kFinalizeMaxLanes = 32;
inline constexpr int kFinalizeBatch = 4;
RMSNORM_HD constexpr int finalize_lanes(int64_t partials) { return partials >= 64 ? 32 : 8; }

// Everything a call launches.
struct Launch {
  Direction direction = Direction::kForward;
  Io io = Io::kVector;
  Kernel kernel = Kernel::kForwardRows;
  RowPlan row;
  int64_t grid = 0;            // CTAs of the main kernel (a multiple of row.cluster)
  int64_t groups_per_cta = 0;  // forward rows band: > 0: CTA u takes groups [u n, u n + n); 0: grid-stride walk
  int sum_tpr = 0;             // forward rows band: > 0: each thread sums as two of a row of sum_tpr (quant_sum_pairs)
  int stages = 1;              // cp.async pipeline depth (1: no lookahead, or no pipeline)
  size_t smem = 0;             // dynamic shared memory of the main kernel, bytes
  // Backward only.
  bool with_gw = false;
  int64_t partials = 0;        // fp32 gw partial rows (one per CTA or cluster)
  bool direct_gw = false;      // one partial: the main kernel writes gw itself
  size_t workspace = 0;        // bytes (0 without gw, with direct_gw, or without rows)
  bool finalize = false;       // finalize_gw_kernel runs after the main kernel
  int64_t finalize_grid = 0;   // its CTAs (kFinalizeCols columns each)
  int finalize_lanes = 0;      // its partial lanes (threadIdx.y)
};

Launch forward_launch(int64_t rows, int64_t cols, int esize, Io io, const Device& dev);

// kBackwardRowsSplit: a backward with few rows and rstd given, where the finalize after the direct
// kernel costs about as much as the rows (decode: 128 x 4096). The same kernel's CTAs split two ways: the first
// `partials` (the direct kernel's grid) are its row groups and compute gx alone; the last split_gw_ctas each take
// split_gw_chunks_per_cta chunks of columns over every row (x, gy and rstd: the row sums are not needed where
// rstd is given) and write those columns of gw, adding the terms in exactly the order of the direct kernel's
// partials (each CTA's row slots in slot order) and of finalize_gw_kernel (its lanes, batches and butterfly), so
// every bit of gw is the two-kernel path's. One launch, no workspace. gx and gw are read from x and gy by
// different CTAs at once, so gx may not overwrite gy (the launcher takes this plan only where gx != gy).
// At 128 x 4096 bf16 it took 0.81x the direct kernel and finalize's time per graph call (docs/performance.md).
inline constexpr int kSplitMaxRowsPerThread = 8;  // rows a gw thread reads: slots x its partials
inline constexpr int kSplitMaxSlots = 4;           // a partial's rows, held by a gw thread at once (registers)
RMSNORM_HD constexpr int split_gw_chunks_per_cta(int cta_threads, int lanes) { return cta_threads / lanes; }
RMSNORM_HD constexpr int64_t split_gw_ctas(int64_t chunks, int cta_threads, int lanes) {
  return (chunks + split_gw_chunks_per_cta(cta_threads, lanes) - 1) / split_gw_chunks_per_cta(cta_threads, lanes);
}
// The lanes' sums of a CTA's columns, each lane's row padded by one float (the finalize's layout).
RMSNORM_HD constexpr size_t split_gw_smem(int cta_threads, int lanes, int esize) {
  return static_cast<size_t>(lanes) * (split_gw_chunks_per_cta(cta_threads, lanes) * vec_elems(esize) + 1) *
         sizeof(float);
}
// `direct`: a backward_launch (or weight_f32_backward_launch) of `rows` rows; returns it as kBackwardRowsSplit
// where it is a kBackwardRowsDirect with gw and more than one partial of at most kSplitMaxSlots row slots, a gw
// thread reads at most kSplitMaxRowsPerThread rows, and the row groups and the gw CTAs together fit one CTA per
// SM; else `direct`.
Launch split_backward_launch(const Launch& direct, int64_t rows, const Device& dev);

// The rows band's 16-byte forward where D is the row's threads times their chunks times the chunk width (so
// every chunk of every thread lies in the row: the band's powers of two) and the grid is the row groups (below
// kMaxGrid): forward_rows_direct_kernel<..., kExact> then needs no chunk guard and no row loop. The same chunks,
// sums and order as the kernel without it: the bits do not change.
inline bool forward_rows_exact(const Launch& l, int64_t rows, int64_t cols, int esize) {
  return l.kernel == Kernel::kForwardRows &&
         cols == int64_t{l.row.threads_per_row} * l.row.chunks_per_thread * vec_elems(esize) &&
         l.grid * int64_t{l.row.rows_per_cta} >= rows;
}

// Residual add (rmsnorm_add_forward). The rows band's 16-byte forward fuses
// it (forward_rows_direct_kernel<..., kAdd>): each thread adds, stores h and
// normalizes its own chunks. Every other kernel of a forward_launch (asked
// with the I/O path of x, residual, h, y and w together) runs after
// add_kernel has written h, and reads h as its x: the add costs one more
// read of h there.
inline bool add_fused(const Launch& forward) { return forward.kernel == Kernel::kForwardRows; }
// add_kernel: one row per CTA of kAddThreads threads (a grid-stride walk
// past kAddMaxCtasPerSm CTAs per SM), element by element at any alignment.
inline constexpr int kAddThreads = 256;
inline constexpr int kAddMaxCtasPerSm = 8;
Launch add_launch(int64_t rows, const Device& dev);
// RMSNORM_FLAG_RESIDUAL_F32's forward, and that of fp32 x with a 16-bit y (RMSNORM_FLAG_Y_DTYPE): the looped
// band's row plan on the fp32 h or x (chunks of 4 columns; sum_tpr = kLoopedThreads, the summing threads) on CTAs
// of f32_shares_cta(chunks, form) threads, one row per CTA up to kMaxGrid (forward_looped_add_f32_kernel<...,
// form>; form: f32_shares_forward, below); kCluster: one row per cluster of kLoopedShares such CTAs up to kMaxGrid
// CTAs, chunks_per_thread its passes (f32_cluster_passes; forward_f32_cluster_kernel).
Launch looped_f32_shares_launch(int64_t rows, int64_t cols, Io io, F32Forward form, const Device& dev);
// forward_looped_add_f32_kernel<..., kHeld or kHeldLateW> and backward_looped_shares_kernel<..., kVec>: a one-pass
// row (chunks <= kLoopedThreads, D % 4 == 0) whose every access is a whole vector (io kVector: h, the residual, x
// and gx of fp32 and an fp32 weight 16-byte aligned rows; `quads`: the 16-bit x, y, gy, gx_x and weight 8-byte
// aligned). The backward then runs without its element paths at every row count; the forward is kHeld for at most
// one wave of kHeld's CTAs (f32_shares_held_rows), kHeldLateW past it (F32Forward, above: kHeld's two CTAs per SM
// took 107.3 us against the read-back kernel's 69.7 at 8192 x 4096 fp32 x with a bf16 y on an H200).
// Every access of the fp32 forms' row a whole vector (as above), at any length; the forms below add their passes.
inline bool f32_whole_vectors(int64_t cols, Io io, bool quads) { return io == Io::kVector && quads && cols % 4 == 0; }
inline bool f32_shares_vec(int64_t cols, Io io, bool quads) {
  return f32_whole_vectors(cols, io, quads) && cols / 4 <= kLoopedThreads;
}
inline int64_t f32_shares_held_rows(const Device& dev) { return int64_t{dev.sm_count} * kLoopedShareHeldCtasPerSm; }
// F32Forward::kCluster's rows: more than one pass of whole vectors (as f32_shares_vec), at most kF32ClusterMaxPasses,
// on a device that co-schedules clusters of kLoopedShares CTAs (max_cluster is 1 without sm_90 code) of these
// kernels (Device::f32_clusters); at 2 passes, at most f32_cluster_max_rows of them.
inline bool f32_cluster_vec(int64_t cols, Io io, bool quads, const Device& dev) {
  return f32_whole_vectors(cols, io, quads) && cols / 4 > kLoopedThreads &&
         cols / 4 <= int64_t{kF32ClusterMaxPasses} * kLoopedThreads && dev.max_cluster >= kLoopedShares &&
         dev.f32_clusters;
}
inline int64_t f32_cluster_max_rows(int64_t chunks, const Device& dev) {
  return f32_cluster_passes(chunks) == 2 ? int64_t{dev.sm_count} : INT64_MAX;
}
inline F32Forward f32_shares_forward(int64_t rows, int64_t cols, Io io, bool quads, const Device& dev) {
  if (f32_cluster_vec(cols, io, quads, dev) && rows <= f32_cluster_max_rows((cols + 3) / 4, dev))
    return F32Forward::kCluster;
  if (!f32_shares_vec(cols, io, quads)) return F32Forward::kReadBack;
  return rows <= f32_shares_held_rows(dev) ? F32Forward::kHeld : F32Forward::kHeldLateW;
}
// F32Forward::kReadBackVec's rows: two passes of whole vectors (io kVector, quads, D % 4 == 0, D 4097..8192). H100,
// fp32 x with a bf16 y, time against kReadBack's (L2 flushed, same bits): 0.83-0.97 with a bf16 weight, 0.82-0.98
// with an fp32 one but for 8192 x 5120 (1.018). At three and four passes the same form on 256 threads took
// 0.99-1.22x the cluster kernel's time (docs/fusions.md, "fp32 x with a bf16 y against Inductor's kernel").
inline bool f32_readback_vec(int64_t cols, Io io, bool quads) {
  return f32_whole_vectors(cols, io, quads) && cols / 4 > kLoopedThreads && cols / 4 <= 2 * int64_t{kLoopedThreads};
}
// F32Forward::kReadBackWide's rows: three or four passes of whole vectors (f32_whole_vectors, D 8193..16384) from
// kF32WideMinRowsPerSm rows per SM; fewer rows keep the cluster kernel, whose row spans four SMs. A thread loads its
// f32_wide_passes chunks at once (16 of its 32 registers at four) for the sum, then reads them back in groups. Where
// the device runs no fp32 clusters (Ampere, f32_clusters false) it takes these rows from the 1024-thread looped
// kernel instead: not measured there. The threshold comes from the first read-back form (H100, fp32 x with a bf16
// (fp32) weight and bf16 y, against the cluster kernel, C ABI, 256 MiB written before each call, median of 20, two
// rounds, same bits):
// 8192 x 10240 0.847 (0.900), 8192 x 12288 0.881 (0.901), 4096 x 12288 0.912 (0.919), 1056 x 12000 0.936 (0.977),
// 4096 x 14336 0.973 (0.971), 4096 x 16384 0.960 (0.974), 2048 x 16384 0.980 (0.990); below 8 rows per SM it lost:
// 1024 x 16384 1.015 (1.015), 528 x 16384 1.020 (1.008), 265 x 16384 1.082 (1.061): a last round of rows on few
// SMs, each row on one CTA, where the cluster kernel spreads it over four.
inline constexpr int64_t kF32WideMinRowsPerSm = 8;
RMSNORM_HD constexpr int f32_wide_passes(int64_t chunks) { return chunks <= 3 * int64_t{kLoopedThreads} ? 3 : 4; }
inline bool f32_readback_wide(int64_t rows, int64_t cols, Io io, bool quads, const Device& dev) {
  return f32_whole_vectors(cols, io, quads) && cols / 4 > 2 * int64_t{kLoopedThreads} &&
         cols / 4 <= 4 * int64_t{kLoopedThreads} && rows >= kF32WideMinRowsPerSm * dev.sm_count;
}
// The form of fp32 x with a 16-bit y (no add): f32_shares_forward's, with kReadBackVec for its read-back rows where
// f32_readback_vec holds, and kReadBackWide where f32_readback_wide does. The residual stream's add keeps
// f32_shares_forward's (its read-back is of h, which the kernel wrote: an L2 read, not L1's read-only path).
inline F32Forward f32_y_dtype_forward(int64_t rows, int64_t cols, Io io, bool quads, const Device& dev) {
  if (f32_readback_wide(rows, cols, io, quads, dev)) return F32Forward::kReadBackWide;
  const F32Forward form = f32_shares_forward(rows, cols, io, quads, dev);
  return form == F32Forward::kReadBack && f32_readback_vec(cols, io, quads) ? F32Forward::kReadBackVec : form;
}
// The backward of those rows (fp32 x with a 16-bit gy, the residual stream's g_h or not) where f32_cluster_vec
// holds: mixed_backward_launch's plan `shares` moved onto backward_f32_cluster_kernel. A cluster of kLoopedShares
// CTAs of kLoopedShareThreads per row, thread t of CTA q summing thread q kLoopedShareThreads + t with its
// f32_cluster_passes chunks (chunks_per_thread) held from their load to gx, the gw sums of its columns in registers
// across the cluster's rows; persistent clusters, as many as run at once (Device::f32_backward_active_clusters) up
// to the rows, one gw partial each (one cluster: gw written directly). No read-back of x or gy and no partial in
// memory per row, which the shares kernel's multi-pass rows pay. The sums as that kernel's (row_sum<1024, 1>'s
// order), so rstd, gx and, where the partials coincide (rows <= clusters), gw have its bits. The workspace is at
// most the shares plan's (clusters <= its CTAs), which the workspace query (no pointers) returns.
Launch f32_cluster_backward_launch(const Launch& shares, int64_t rows, int64_t cols, const Device& dev);
// Where the backward takes it: f32_cluster_vec's rows, at 2 passes (D <= 8192) either at most
// kF32ClusterBackwardRowsPerSm rows per SM or more than kF32ClusterBackwardFullChunks chunks. A 2-pass thread holds
// at most 2 chunks (4 CTAs per SM): where the second pass is short an SM holds fewer bytes in flight than the shares
// kernel's passes (2 CTAs of 256 threads x 4 chunks), and past a few rows per cluster that lost (H100, the residual
// stream's forward and backward: 32768 x 4100 1516 -> 1716 us, 16384 x 6144 1090 -> 1135, 8192 x 7168 648 -> 655,
// 16384 x 7168 1270 -> 1293), where rows past 7/8 of two passes won (4096 x 8192 394 -> 379, 16384 x 8192 1500 ->
// 1482) and so did few rows at any fill (1 x 4100 14.1 -> 6.4, 528 x 6144 51.3 -> 44.3). At 3-4 passes it won at
// every shape measured (4096 x 8200 418 -> 365, 8192 x 12000 1320 -> 960, 4096 x 16384 950 -> 640).
inline constexpr int64_t kF32ClusterBackwardRowsPerSm = 4;
inline constexpr int64_t kF32ClusterBackwardFullChunks = 7 * 2 * int64_t{kLoopedThreads} / 8;
inline int64_t f32_cluster_backward_max_rows(int64_t chunks, const Device& dev) {
  return f32_cluster_passes(chunks) == 2 && chunks <= kF32ClusterBackwardFullChunks
             ? kF32ClusterBackwardRowsPerSm * dev.sm_count
             : INT64_MAX;
}
inline bool f32_cluster_backward(int64_t rows, int64_t cols, Io io, bool quads, const Device& dev) {
  return f32_cluster_vec(cols, io, quads, dev) && rows <= f32_cluster_backward_max_rows((cols + 3) / 4, dev);
}
// fp32 x with a 16-bit y takes the held forms wherever f32_shares_forward gives them, and kReadBack up to
// kYDtypeSharesMaxChunks chunks (D <= 8192); longer rows read back take the 1024-thread
// looped kernel (looped_forward_launch: two rows per SM, each read back from L1), which took 0.72x the shares' time at
// 4096 x 16384 and 0.81x at 2048 x 32768, where four rows per SM read back from L2 (H100; at 16384 x 7168 the
// shares took 0.69x its time).
inline constexpr int64_t kYDtypeSharesMaxChunks = 2 * int64_t{kLoopedThreads};
inline bool y_dtype_forward_in_shares(int64_t cols) { return (cols + 3) / 4 <= kYDtypeSharesMaxChunks; }
// Quantized output (rmsnorm_forward_quant). Where the forward is the rows
// band's 16-byte kernel and q's rows are aligned to a chunk's q bytes
// (q_rows_aligned: 8 bytes at 16-bit, 4 at fp32), that kernel
// quantizes its y in registers (forward_rows_direct_kernel<..., kQuant>):
// rstd and y are bit for bit rmsnorm_forward's. Everywhere else (misaligned
// operands, the cluster and looped bands) forward_looped_kernel<..., kQuant>
// runs with the looped band's geometry: one row per CTA of kLoopedThreads,
// one CTA per row up to kMaxGrid; its rstd is summed in that kernel's order,
// which in the cluster band and the rows band's element path is not
// rmsnorm_forward's, so rstd (and y) may differ from it in the last bits.
inline bool q_rows_aligned(const void* q, int64_t stride, int esize) {
  const int n = vec_elems(esize);
  return reinterpret_cast<uintptr_t>(q) % n == 0 && stride % n == 0;
}
// Block scales (block_chunks > 0: a block's columns / vec_elems(esize)): fused only where a row's threads hold
// a whole number of blocks at each chunk index (threads_per_row a multiple of block_chunks), so that a block's
// chunks are consecutive lanes of one warp; elsewhere the looped kernel.
inline bool quant_fused(const Launch& forward, bool q_aligned, int block_chunks = 0) {
  return forward.kernel == Kernel::kForwardRows && q_aligned &&
         (block_chunks <= 1 || forward.row.threads_per_row % block_chunks == 0);
}
// The fused quantized forward of rows of kFewChunksTpr threads of 2 chunks (16-bit D 2049..4096, fp32 D
// 1025..2048), every kind, with rows enough that the CTAs fill the GPU several times over: half the
// threads per row with 4 chunks each, every thread summing the squares as two of the kFewChunksTpr-thread row do
// (its chunks it = 0, 2 as thread pos, it = 1, 3 as thread pos + tpr) and the two shares through that row's
// butterfly and warp order (row_sum_pairs), so rstd and every q keep their bits. The quantized epilogue is
// issue-bound and half of what a thread issues per row is per row, not per element (docs/fusions.md). Fewer rows
// (decode) keep the 2-chunk row: its dependent chain is half as long. Block scales: the half row's threads still
// hold whole blocks (block_chunks <= 32 divides kFewChunksTpr / 2), and a thread's four chunk indices share one
// scale computation (block_absmax_all).
inline constexpr int64_t kQuantSumPairsMinRows = 1024;
inline bool quant_sum_pairs(const Launch& l, int64_t rows, int block_chunks) {
  return l.kernel == Kernel::kForwardRows && (block_chunks <= 1 || (kFewChunksTpr / 2) % block_chunks == 0) &&
         l.row.threads_per_row == kFewChunksTpr && l.row.chunks_per_thread == kFewChunksPerThread &&
         rows >= kQuantSumPairsMinRows;
}
Launch quant_launch(int64_t rows, int64_t cols, int esize, Io io, bool q_aligned, const Device& dev,
                    int block_chunks = 0);
// The looped band's geometry at any D: one row per CTA of kLoopedThreads (the
// forward: one CTA per row up to kMaxGrid; the backward: kLoopedCtasPerSm CTAs
// per SM, a gw partial each). The quantized forward's fallback, the mixed
// forms (another y or gy dtype, the fp32 residual stream) at every D. The
// backward of fp32 x (its gy 16-bit) runs that row in shares (sum_tpr =
// kLoopedThreads summing threads on CTAs of kLoopedShareThreads:
// backward_looped_shares_kernel), on the same grid and partials; where its rows are more than one pass and it
// writes a partial (not direct_gw), the CTA keeps that partial in dynamic shared memory (Launch::smem:
// f32_shares_gw_smem) and writes it to its workspace row once, at the end.
Launch looped_forward_launch(int64_t rows, int64_t cols, int esize, Io io, const Device& dev);
Launch mixed_backward_launch(int64_t rows, int64_t cols, int esize, Io io, bool with_gw, const Device& dev);
// backward_looped_shares_kernel's gw partial in shared memory: one float per column of the row's whole chunks, for
// rows of more than one pass (chunks > kLoopedThreads) up to kF32SharesGwSmemMaxChunks chunks (64 KiB), with a
// partial (with_gw, not direct_gw), where kLoopedCtasPerSm CTAs of it fit an SM with kF32SharesSmemReserve bytes
// each beside it (the runtime's share, and 1 KiB for the kernel's static scratch of 512 bytes; an SM of 100 KiB, as
// sm_86 has, keeps the workspace path past D = 12288); 0 otherwise (the partial read and written in the workspace
// row per row).
// The sums are the same, in the same order: only where they are kept changes.
inline constexpr size_t kRuntimeSmemPerCta = 1024;  // the runtime's own shared memory per CTA
inline constexpr int64_t kF32SharesGwSmemMaxChunks = 4 * int64_t{kLoopedThreads};
inline constexpr size_t kF32SharesSmemReserve = kRuntimeSmemPerCta + 1024;
inline size_t f32_shares_gw_smem(int64_t chunks, bool with_gw, bool direct_gw, const Device& dev) {
  const size_t bytes = static_cast<size_t>(chunks) * 4 * sizeof(float);
  return with_gw && !direct_gw && chunks > kLoopedThreads && chunks <= kF32SharesGwSmemMaxChunks &&
                 bytes <= dev.max_smem_optin && (bytes + kF32SharesSmemReserve) * kLoopedCtasPerSm <= dev.smem_per_sm
             ? bytes
             : 0;
}
// An fp32 weight with 16-bit x (RMSNORM_FLAG_WEIGHT_F32; x, y and gy in x's
// dtype; with or without the residual): the plain call's plan, whose kernels
// read the weight as fp32 (rstd summed as in the plain call; the backward's
// recomputed rstd is the forward's). Its looped band's kernels are the mixed
// forms' (looped_forward_launch / mixed_backward_launch). io includes the
// weight (16-byte aligned: the rows band's direct kernels read its chunks as
// kN / 4 16-byte vectors).
Launch weight_f32_forward_launch(int64_t rows, int64_t cols, int esize, Io io, const Device& dev);
Launch weight_f32_backward_launch(int64_t rows, int64_t cols, int esize, Io io, bool with_gw, const Device& dev);
// with_gw: a gw mode other than none. The workspace does not depend on io
// (the workspace query knows no pointers).
Launch backward_launch(int64_t rows, int64_t cols, int esize, Io io, bool with_gw, const Device& dev);

const char* kernel_name(Kernel k);

}  // namespace rmsnorm::plan
