// Launch plan: the one place that decides each kernel's geometry. A pure
// function of (cols, element size, alignment, device properties); the host
// launches from it and the kernel templates read the same constexpr
// functions, with static_asserts tying the two (see src/cuda/*.cuh).
//
// Work split. A row of D elements is cut into chunks of one 16-byte vector
// (kVec = 16 / sizeof(T) elements; the last chunk may be partial). A row is
// owned by `threads_per_row` threads of one CTA, or of each CTA of a cluster
// of `cluster` CTAs. Thread g (0 <= g < threads_per_row * cluster, CTA rank
// major) owns chunks g, g + G, g + 2G, ... (G = threads_per_row * cluster),
// at most `chunks_per_thread` of them, held in registers, so x (and gy) is
// read from DRAM once. Bands, chosen from the chunk count alone:
//
//   kRows     8 elements per thread; threads_per_row = smallest power of
//             two in 1..1024 that covers the row; rows_per_block =
//             block / tpr rows per CTA. Reduction: xor-butterfly inside each
//             aligned group of tpr lanes (tpr <= 32), then one scratch slot
//             per warp of the row (tpr > 32). D <= 8192.
//   kCluster  1024 threads per CTA, 16 elements per thread, `cluster` in
//             {1, 2, 4, 8, 16} CTAs per row (16 where the device
//             co-schedules it); CTA sums are exchanged through distributed
//             shared memory (sm_90; cluster == 1 elsewhere).
//             D <= 131072 (262144 with clusters of 16).
//   kLooped   any D: one CTA walks the row twice (x read twice). Used above
//             the cluster band, and on pre-Hopper GPUs above cluster == 1.
//
// The reduction order of a row depends on the band alone (never on the
// number of rows, the row's position, or alignment): results are
// batch-invariant. (Backward adds x^2 per chunk before adding chunk sums,
// forward keeps one running sum; they agree bitwise only with one chunk per
// thread, so a recomputed rstd may differ from forward's in the last bit.)
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
inline constexpr int kMaxThreadsPerRow = 1024;
inline constexpr int kMaxThreadsPerSm = 2048;  // sm_80 and sm_90
// Elements per thread, whatever the dtype (chunks per thread = elements / vec):
// kRows 8 (one 16-byte chunk at 16-bit, two at fp32), kCluster 16. Chosen
// from the compiler's resource report: at 8 elements, backward holds x, gy,
// w' and the row sums in registers with two 512-thread CTAs per SM and no
// spills; 16 elements at 1024 threads per CTA still fit in 64 registers.
inline constexpr int kRowsElemsPerThread = 8;
inline constexpr int kClusterThreads = 1024;
inline constexpr int kClusterElemsPerThread = 16;
RMSNORM_HD constexpr int rows_chunks_per_thread(size_t esize) {
  return kRowsElemsPerThread / (kChunkBytes / static_cast<int>(esize));
}
RMSNORM_HD constexpr int cluster_chunks_per_thread(size_t esize) {
  return kClusterElemsPerThread / (kChunkBytes / static_cast<int>(esize));
}
inline constexpr int kMaxPortableCluster = 8;
inline constexpr int kMaxCluster = 16;  // non-portable; used where the device can co-schedule it
inline constexpr int kLoopedThreads = 1024;
// Minimum CTA size: forward packs rows into 128-thread CTAs, backward into
// 512-thread CTAs (two per SM) so that the per-CTA gw partials stay few.
inline constexpr int kForwardMinBlock = 128;
inline constexpr int kBackwardMinBlock = 512;
// Backward CTAs per SM for kRows and kLooped: the workspace holds one fp32
// partial row per CTA, so this bounds it by 2 * SMs * D * 4 bytes.
inline constexpr int kBackwardBlocksPerSm = 2;

RMSNORM_HD constexpr int vec_elems(int esize) { return kChunkBytes / esize; }
RMSNORM_HD constexpr int64_t chunks_of(int64_t cols, int esize) {
  return (cols + vec_elems(esize) - 1) / vec_elems(esize);
}
RMSNORM_HD constexpr int forward_block(int tpr) { return tpr > kForwardMinBlock ? tpr : kForwardMinBlock; }
RMSNORM_HD constexpr int backward_block(int tpr) { return tpr > kBackwardMinBlock ? tpr : kBackwardMinBlock; }
RMSNORM_HD constexpr int warps_per_row(int tpr) { return tpr > kWarp ? tpr / kWarp : 1; }
// Thread t of a CTA works on row slot t / tpr, as lane t % tpr of that row.
RMSNORM_HD constexpr int row_slot(int thread, int tpr) { return thread / tpr; }
// Scratch entry where warp w of row slot s leaves its partial (tpr > 32).
RMSNORM_HD constexpr int scratch_index(int slot, int warp_in_row, int tpr) {
  return slot * warps_per_row(tpr) + warp_in_row;
}

// Backward CTAs per SM for kRows (__launch_bounds__ min blocks).
RMSNORM_HD constexpr int backward_blocks_per_sm(int tpr) { return backward_block(tpr) <= kBackwardMinBlock ? 2 : 1; }
// Dynamic shared memory of the backward gw accumulators (fp32 per owned element).
RMSNORM_HD constexpr size_t backward_rows_smem(int tpr) {
  return sizeof(float) * static_cast<size_t>(backward_block(tpr)) * kRowsElemsPerThread;
}
RMSNORM_HD constexpr size_t backward_cluster_smem() {
  return sizeof(float) * static_cast<size_t>(kClusterThreads) * kClusterElemsPerThread;
}

struct Device {
  int sm_count = 132;
  int cc_major = 9;
  size_t max_smem_optin = 227 * 1024;  // per block, bytes
  int max_cluster = 8;                 // largest cluster of 1024-thread CTAs the device co-schedules
};

struct RowPlan {
  Band band = Band::kRows;
  int esize = 2;
  int vec = 8;                   // elements per chunk
  int64_t chunks = 0;            // per row
  int threads_per_row = 1;       // per CTA
  int chunks_per_thread = 0;     // per thread (kRows, kCluster); per pass step for kLooped
  int cluster = 1;               // CTAs per row
  int block = 128;               // threads per CTA
  int rows_per_block = 1;        // row slots per CTA
  bool vector_io = false;        // 16-byte loads/stores (all operands 16-byte aligned rows)
};

// Row geometry for a direction: `backward` picks the backward CTA size.
RowPlan row_plan(int64_t cols, int esize, bool backward, const Device& dev);

// 16-byte I/O needs every row start of every operand 16-byte aligned.
inline bool rows_aligned16(const void* p, int64_t stride, int esize) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % kChunkBytes == 0 && (stride * esize) % kChunkBytes == 0);
}

struct ForwardLaunch {
  RowPlan row;
  int64_t grid = 0;  // CTAs
  size_t smem = 0;   // dynamic shared memory, bytes
};
ForwardLaunch forward_launch(int64_t rows, int64_t cols, int esize, const Device& dev);

struct BackwardLaunch {
  RowPlan row;
  int64_t grid = 0;       // CTAs (persistent)
  int64_t partials = 0;   // fp32 gw partial rows in the workspace
  size_t smem = 0;        // dynamic shared memory, bytes
  size_t workspace = 0;   // bytes (0 without gw)
  bool direct_gw = false; // one partial: the main kernel writes gw itself
};
BackwardLaunch backward_launch(int64_t rows, int64_t cols, int esize, bool with_gw, const Device& dev);

// The finalize kernel's geometry: 32 columns x 8 partial lanes per CTA.
inline constexpr int kFinalizeCols = 32;
inline constexpr int kFinalizeLanes = 8;

}  // namespace rmsnorm::plan
