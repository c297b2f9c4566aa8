// Launch plan: the one place that decides each kernel's geometry. A pure
// function of (cols, element size, device properties) and, through
// rows_aligned16 at launch, of alignment: the launch takes the 16-byte vector
// path only where every operand's rows start on 16 bytes, else element I/O
// (BackwardLaunch carries the pipeline depth and shared memory of both; the
// forward's element I/O stages nothing). The geometry (threads per row, row
// slots, chunks per thread) is the same on both paths. The host
// launches from it and the kernel templates read the same constexpr
// functions, with static_asserts tying the two (see src/cuda/*.cuh).
//
// Work split. A row of D elements is cut into chunks of one 16-byte vector
// (vec = 16 / sizeof(T) elements; the last chunk may be partial). A row is
// owned by `threads_per_row` threads of one CTA, or of each CTA of a cluster
// of `cluster` CTAs. Thread g (0 <= g < G = threads_per_row * cluster, CTA
// rank major) owns chunks g, g + G, g + 2G, ..., at most kChunksPerThread (4)
// of them, held in registers, so x (and gy) is read from DRAM once. Bands,
// chosen from the chunk count alone, identical for forward and backward:
//
//   kRows     threads_per_row = smallest power of two in 1..512 that covers
//             the row; rows_per_block = block / tpr row slots per CTA.
//             D <= 16384 (16-bit) or 8192 (fp32).
//   kCluster  512 threads per CTA, `cluster` in {2, 4, 8, 16} CTAs per row
//             (16 where the device co-schedules it); CTA sums are exchanged
//             through distributed shared memory (sm_90 only).
//             D <= 131072 (16-bit) / 65536 (fp32), twice that with 16.
//   kLooped   any D: one CTA walks the row twice (x read twice). Used above
//             the cluster band, and on pre-Hopper GPUs above kRows.
//
// Reduction of a row: each thread adds its elements in order (one running
// sum), an xor butterfly over the lanes of each warp of the row, the row's
// warp sums in warp order, then the cluster's CTA sums in rank order. The
// order depends on D alone (never on the number of rows, the row's position,
// or alignment), so results are batch-invariant, and backward's recomputed
// rstd is bitwise the forward's (same geometry, same code).
//
// Both kernels are persistent: each CTA (or cluster) walks row groups
// unit, unit + units, ... (the rows-band forward may instead give each CTA
// one group, or a tile of consecutive groups: forward_launch). With 16-byte
// I/O each thread copies its own chunks of the next `stages - 1` row groups
// into its own shared-memory slots with cp.async while it works on the
// current group (a per-thread pipeline: no barrier guards a stage, since only
// the copying thread reads it), so the bytes in flight per SM are bounded by
// shared memory rather than by registers. With misaligned operands (element I/O) the rows-band backward
// stages each row's aligned 16-byte blocks the same way, a chunk then reading
// a neighbour's block too (after the row slot's barrier; shifted_stage_bytes);
// the forward and the cluster band load elements into registers.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define RMSNORM_HD __host__ __device__
#else
#define RMSNORM_HD
#endif

namespace rmsnorm::plan {

enum class Band : int { kRows = 0, kCluster = 1, kLooped = 2 };

inline constexpr int kChunkBytes = 16;
// Kernels index within a row in 32 bits.
inline constexpr int64_t kMaxCols = (int64_t{1} << 31) - 64;
inline constexpr int kWarp = 32;
inline constexpr int kMaxThreadsPerSm = 2048;  // sm_80 and sm_90
// 4 chunks (64 bytes) per thread and operand: measured on the H200, one
// 16-byte chunk per thread left the kernels issue-bound on per-row overhead
// (ncu: SM 69% busy, DRAM 45%); 4 amortize the reduction over 4x the bytes.
inline constexpr int kChunksPerThread = 4;
inline constexpr int kMaxRowsTpr = 512;  // kRows: threads per row (one CTA)
inline constexpr int kClusterTpr = 512;  // kCluster: threads per CTA (one row slot)
inline constexpr int kMaxPortableCluster = 8;
inline constexpr int kMaxCluster = 16;  // non-portable; used where the device can co-schedule it
inline constexpr int kLoopedThreads = 1024;
inline constexpr int kLoopedBlocksPerSm = 2;  // backward: two partial rows per SM
// Forward: CTAs of >= 256 threads, 1024 threads per SM, so 64 registers per
// thread hold the current and the prefetched chunks without spilling.
inline constexpr int kForwardMinBlock = 256;
inline constexpr int kForwardThreadsPerSm = 1024;
// Backward: one 512-thread CTA per SM (128 registers per thread: x, gy and
// the prefetched x and gy; the fp32 gw sums live in shared memory). The
// workspace holds one fp32 partial row per CTA (or cluster), so it is at
// most SMs * D * 4 bytes.
inline constexpr int kBackwardBlock = 512;
inline constexpr int kBackwardBlocksPerSm = 1;

RMSNORM_HD constexpr int vec_elems(int esize) { return kChunkBytes / esize; }
RMSNORM_HD constexpr int64_t chunks_of(int64_t cols, int esize) {
  return (cols + vec_elems(esize) - 1) / vec_elems(esize);
}
RMSNORM_HD constexpr int forward_block(int tpr) { return tpr > kForwardMinBlock ? tpr : kForwardMinBlock; }
RMSNORM_HD constexpr int forward_blocks_per_sm(int tpr) { return kForwardThreadsPerSm / forward_block(tpr); }
RMSNORM_HD constexpr int backward_block(int tpr) { return tpr > kBackwardBlock ? tpr : kBackwardBlock; }
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
RMSNORM_HD constexpr int64_t store_blocks(int64_t cols, int head, int esize) {
  return cols > head ? (cols - head) / vec_elems(esize) : 0;
}

// cp.async pipeline depth (row groups staged per thread, the current one
// included): as many as fit, at most kMaxStages.
inline constexpr int kMaxStages = 3;
// Shared memory of one stage: every thread's chunks of each operand
// (forward x; backward x and gy), uint4 [operand][chunk it][thread].
RMSNORM_HD constexpr size_t stage_bytes(int block, int operands) {
  return static_cast<size_t>(block) * kChunksPerThread * kChunkBytes * operands;
}
// Rows-band backward with element I/O (misaligned operands): each row's
// aligned 16-byte blocks are staged instead (block v = bytes [16 v, 16 v + 16)
// from the row's first byte rounded down to 16; v = 0..chunks): thread t of a
// slot copies blocks it * tpr + t into the same slots as the aligned layout,
// the slot's block v = kChunksPerThread * tpr (when a row fills every chunk)
// into one extra entry per slot; a chunk is then its own block and the next
// (a neighbour's, after a barrier) shifted by the row's misalignment.
// uint4 [operand][kChunksPerThread][block] then [operand's extra][slots].
RMSNORM_HD constexpr size_t shifted_stage_bytes(int block, int slots, int operands) {
  return static_cast<size_t>(block * kChunksPerThread + slots) * kChunkBytes * operands;
}

// The backward's end-of-kernel sum of the gw partials of a CTA's row slots:
// a table of fp32 entries, one per (chunk it, element j) row and CTA thread.
// Thread t writes its sums down column t; then element e = (it, l, j) of a
// row slot (j fastest) is read at rows it * vec + j, columns s * tpr + l.
// A warp's read covers vec values of j and 32 / vec of l: with rows of
// `block` floats (a multiple of 32) every j fell in one bank (an 8-way
// conflict at 16-bit), so rows are padded by 32 / vec floats, which puts
// (j, l) in bank (j * 32 / vec + l) % 32: all 32 distinct.
RMSNORM_HD constexpr int combine_stride(int block, int esize) { return block + kWarp / vec_elems(esize); }
RMSNORM_HD constexpr int combine_index(int it, int j, int thread, int block, int esize) {
  return (it * vec_elems(esize) + j) * combine_stride(block, esize) + thread;
}
// Its size in bytes; none with one slot (the thread's sums are the CTA's).
RMSNORM_HD constexpr size_t backward_combine_smem(int tpr, int esize) {
  return backward_block(tpr) / tpr == 1 ? 0
                                        : sizeof(float) * static_cast<size_t>(combine_stride(backward_block(tpr), esize)) *
                                              kChunksPerThread * vec_elems(esize);
}

struct Device {
  int sm_count = 132;
  int cc_major = 9;
  size_t max_smem_optin = 227 * 1024;  // per block, bytes
  size_t smem_per_sm = 228 * 1024;     // per SM, bytes
  int max_cluster = 8;                 // largest cluster of kClusterTpr-thread CTAs the device co-schedules
  bool sm90_code = false;              // the kernels carry compute_90 code (programmatic dependent launch)
  // Clusters of 2, 4, 8, 16 CTAs (index log2 - 1) the device runs at once
  // with the forward / backward cluster kernels (cudaOccupancyMaxActiveClusters);
  // 0: unknown, the grid is sized from the SM count alone.
  int forward_active_clusters[4] = {0, 0, 0, 0};
  int backward_active_clusters[4] = {0, 0, 0, 0};
};

// Index of a cluster size in Device::*_active_clusters (2 -> 0 ... 16 -> 3).
RMSNORM_HD constexpr int cluster_index(int cluster) {
  return cluster <= 2 ? 0 : cluster <= 4 ? 1 : cluster <= 8 ? 2 : 3;
}

struct RowPlan {
  Band band = Band::kRows;
  int esize = 2;
  int vec = 8;                   // elements per chunk
  int64_t chunks = 0;            // per row
  int threads_per_row = 1;       // per CTA
  int chunks_per_thread = 0;     // kChunksPerThread (kRows, kCluster); per pass step for kLooped
  int cluster = 1;               // CTAs per row
  int block = 128;               // threads per CTA
  int rows_per_block = 1;        // row slots per CTA
};

// Row geometry for a direction: `backward` picks the backward CTA size.
RowPlan row_plan(int64_t cols, int esize, bool backward, const Device& dev);

// 16-byte I/O needs every row start of every operand 16-byte aligned.
inline bool rows_aligned16(const void* p, int64_t stride, int esize) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % kChunkBytes == 0 && (stride * esize) % kChunkBytes == 0);
}

// The forward's grid: persistent (the CTAs that fit at once, each prefetching
// its next row group) or one CTA per row group. The second wins where a CTA
// holds many short rows (its w' load is small next to them) and there are many
// groups per resident CTA (the hardware then balances the last wave): on the
// H200 0.90-0.96x the time at 131072x1024, 262144x512, 524288x384 and
// 1048576x128, but 1.01-1.04x at 2048 groups (32768x512, 131072x128) and
// 1.2-1.4x with 2 rows per CTA (D = 4096..7168). The grid never changes a
// row's reduction (batch invariance holds either way).
inline constexpr int kOneGroupMinRowsPerBlock = 8;
inline constexpr int64_t kOneGroupMinGroupsPerCta = 8;
inline bool forward_one_group_per_cta(const RowPlan& row, int64_t groups, int64_t resident_ctas) {
  return row.band == Band::kRows && row.rows_per_block >= kOneGroupMinRowsPerBlock &&
         groups >= kOneGroupMinGroupsPerCta * resident_ctas;
}

// Rows band outside the one-group rule, with many groups: the grid hands
// each CTA a tile of kForwardTileGroups consecutive row groups (w' loaded once
// per tile, the cp.async pipeline running within the tile), and the hardware's
// CTA scheduler balances the SMs, where there are at least
// kForwardTileMinWaves tiles per resident CTA; else the persistent grid.
// Measured on the H200 (bench/results/2026-11-30_h200_eecd5cd_ab_forward_tiles.md),
// persistent time / tiled time with 4-group tiles: 1.003-1.057 at 31 groups
// per resident CTA (D = 2048..16384), 1.023-1.050 at 62, but 0.975-1.016 at
// 15.5 and 0.96-1.00 at 7.8; tiles of 2 groups were 1.08-1.2x slower
// everywhere, of 8 between the two.
inline constexpr int64_t kForwardTileGroups = 4;
inline constexpr int64_t kForwardTileMinWaves = 6;

struct ForwardLaunch {
  RowPlan row;
  int64_t grid = 0;  // CTAs
  int64_t groups_per_cta = 0;  // > 0: CTA u takes row groups [u * n, u * n + n); 0: grid-stride walk
  int stages = 1;    // cp.async pipeline depth (16-byte I/O)
  size_t smem = 0;   // dynamic shared memory with 16-byte I/O, bytes (element I/O: none)
};
ForwardLaunch forward_launch(int64_t rows, int64_t cols, int esize, const Device& dev);

struct BackwardLaunch {
  RowPlan row;
  int64_t grid = 0;       // CTAs (persistent)
  int64_t partials = 0;   // fp32 gw partial rows in the workspace
  int stages = 1;         // cp.async pipeline depth (16-byte I/O)
  size_t smem = 0;        // dynamic shared memory with 16-byte I/O, bytes
  int stages_elementwise = 1;    // ... with element I/O (kRows: shifted_stage_bytes stages; else 1, unused)
  size_t smem_elementwise = 0;  // ... with element I/O (kRows: the stages; at the end, and otherwise, the gw slot sum)
  size_t workspace = 0;   // bytes (0 without gw)
  bool direct_gw = false; // one partial: the main kernel writes gw itself
};
BackwardLaunch backward_launch(int64_t rows, int64_t cols, int esize, bool with_gw, const Device& dev);

// The finalize kernel's geometry: 32 columns x finalize_lanes(count) partial
// lanes per CTA; each lane loads its partials kFinalizeBatch at a time, so
// that they are in flight together. 32 lanes for many partials (the persistent
// grids' SM count: 4096x16384 bf16 VJP 0.92x the time of 8 lanes), 8 for few
// (clusters: 8 lanes were 0.93x the time of 32 at 1024x262144).
inline constexpr int kFinalizeCols = 32;
inline constexpr int kFinalizeMaxLanes = 32;
inline constexpr int kFinalizeBatch = 4;
RMSNORM_HD constexpr int finalize_lanes(int64_t partials) { return partials >= 64 ? 32 : 8; }

}  // namespace rmsnorm::plan
