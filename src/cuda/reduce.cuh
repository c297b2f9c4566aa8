// Row reductions: lanes (xor butterfly), a row slot's warps (shared
// scratch, one barrier per row), a cluster's CTAs (distributed shared
// memory). The order of every sum depends on the row geometry alone.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "plan.hpp"

namespace rmsnorm::cuda {

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

// row_sum<kSumTpr, ...>'s sum where each thread of a kTpr = kSumTpr / 2 thread slot holds the shares of two of the
// kSumTpr threads, pos (.x) and pos + kTpr (.y) (plan::quant_sum_pairs): the same butterfly within each warp of 32,
// both at once, then the kSumTpr row's warp sums in its warp order (thread pos + kTpr's warp is kTpr / 32 after
// pos's), so the total has the same bits.
template <int kSumTpr, int kTpr, int kSlots>
__device__ __forceinline__ float row_sum_pairs(float2 v, RowScratch<float, kSumTpr, kSlots>& scratch, int parity) {
  static_assert(kSumTpr == 2 * kTpr && kTpr % 32 == 0, "two shares per thread, rows of whole warps");
  constexpr int kWarps = plan::warps_per_row(kTpr);
  v = group_sum<32>(v);
  const int slot = plan::row_slot(threadIdx.x, kTpr);
  const int warp_in_row = (threadIdx.x % kTpr) / 32;
  if (threadIdx.x % 32 == 0) {
    scratch.v[plan::scratch_index(parity, slot, warp_in_row, kSumTpr, kSlots)] = v.x;
    scratch.v[plan::scratch_index(parity, slot, warp_in_row + kWarps, kSumTpr, kSlots)] = v.y;
  }
  slot_sync<kTpr, kSlots>(slot);
  const float* s = &scratch.v[plan::scratch_index(parity, slot, 0, kSumTpr, kSlots)];
  float total = s[0];
#pragma unroll
  for (int w = 1; w < 2 * kWarps; ++w) total = add(total, s[w]);
  return total;
}

// row_sum<kSumTpr, 1>'s sum where a CTA of kCta threads holds the shares of kShares of the kSumTpr threads each:
// share k of thread t is summing thread t + k kCta's. Its warp is t / 32 + k kCta / 32 with the same lanes, so each
// share goes through that warp's butterfly (all kShares at once) and lands in its scratch entry, and the warp sums
// are added in warp order: the total has row_sum's bits. A CTA that holds only the first kCta kShares summing
// threads (the others hold no chunk of the row: plan::f32_shares_cta) adds +0 once for the rest, which is what
// adding their zero warp sums gives, bit for bit (x + 0 + 0 == x + 0 for every x, -0 included).
// V: float (the forward's sum of squares) or float2 (the backward's two sums; .x in the forward's order).
template <int kSumTpr, int kCta, int kShares, typename V>
__device__ __forceinline__ V row_sum_shares(const V (&v)[kShares], RowScratch<V, kSumTpr, 1>& scratch, int parity) {
  static_assert(kCta * kShares <= kSumTpr && kSumTpr % (kCta * kShares) == 0 && kCta % 32 == 0,
                "shares of whole warps, a whole fraction of the summing threads");
  constexpr int kWarps = kCta / 32;
  constexpr int kHeldWarps = kCta * kShares / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  V u[kShares];
#pragma unroll
  for (int k = 0; k < kShares; ++k) u[k] = v[k];
#pragma unroll
  for (int off = 1; off < 32; off <<= 1)
#pragma unroll
    for (int k = 0; k < kShares; ++k) u[k] = add(u[k], shfl_xor(u[k], off));
  if (threadIdx.x % 32 == 0)
#pragma unroll
    for (int k = 0; k < kShares; ++k) scratch.v[plan::scratch_index(parity, 0, warp + k * kWarps, kSumTpr, 1)] = u[k];
  __syncthreads();
  const V* s = &scratch.v[plan::scratch_index(parity, 0, 0, kSumTpr, 1)];
  V total = s[0];
#pragma unroll
  for (int w = 1; w < kHeldWarps; ++w) total = add(total, s[w]);
  if constexpr (kHeldWarps < kSumTpr / 32) total = add(total, V{});
  return total;
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

// Sum over a CTA of kCtaThreads threads (one row slot), result in every thread.
template <int kCtaThreads>
__device__ __forceinline__ float2 cta_sum(float2 v, RowScratch<float2, kCtaThreads, 1>& scratch, int parity) {
  return row_sum<kCtaThreads, 1>(v, scratch, parity);
}

// Distributed shared memory and the mbarriers of the cluster exchanges: a shared address as a u32, mapped to
// another CTA of the cluster; st.async of one value there, completing its bytes of the receiving mbarrier's
// transaction count; and the mbarriers' init, arrive with expect_tx, and wait on a phase.
namespace dsmem {
__device__ __forceinline__ unsigned smem_u32(const void* ptr) {
  return static_cast<unsigned>(__cvta_generic_to_shared(ptr));
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned map_rank(unsigned addr, unsigned rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
__device__ __forceinline__ void store_async(unsigned dst, float v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(dst), "f"(v),
               "r"(bar)
               : "memory");
}
__device__ __forceinline__ void store_async(unsigned dst, float2 v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(dst),
               "f"(v.x), "f"(v.y), "r"(bar)
               : "memory");
}
// Thread 0: `n` mbarriers of arrival count 1, made visible to the cluster's async proxy (the caller then passes a
// cluster barrier before any push).
__device__ __forceinline__ void init_bars(unsigned long long* bar, int n) {
  if (threadIdx.x == 0) {
    for (int d = 0; d < n; ++d) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[d])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
}
// This thread's arrival on its CTA's mbarrier, expecting `bytes` more of transactions in the current phase.
__device__ __forceinline__ void arrive_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Spins until the phase of parity `phase` of this CTA's mbarrier has completed (acquire at cluster scope: the
// values pushed into this CTA are visible after it).
__device__ __forceinline__ void wait_parity(unsigned long long* bar, unsigned phase) {
  unsigned done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(phase)
        : "memory");
  } while (done == 0);
}
#endif
}  // namespace dsmem

// ---- the cluster exchange of the 16-byte-I/O cluster kernels --------------------------------
// A CTA's share of row k's sums is pushed into every CTA of the cluster
// (st.async over distributed shared memory, into slot [k % kDepth][rank]),
// and each push completes the transaction count of the receiving CTA's
// mbarrier for that slot, which its thread 0 armed with expect_tx(n * bytes).
// A CTA waits on its own mbarrier and adds the slots in rank order (the same
// order, so the same bits, in every CTA and as cluster_sum). Why a push
// (docs/performance.md, "Cluster exchange"): with barrier.cluster.arrive.release per row, every thread executed
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
    dsmem::init_bars(bar, kDepth);
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
      if (lane == 0) dsmem::arrive_expect(&bar[d], static_cast<unsigned>(n * sizeof(V)));
      if (lane < n)
        dsmem::store_async(dsmem::map_rank(dsmem::smem_u32(&slot[d][cluster_rank()]), lane), v,
                           dsmem::map_rank(dsmem::smem_u32(&bar[d]), lane));
    }
#else
    slot[k % kDepth][0] = v;
#endif
  }
  // Row k's total over the cluster, in rank order (every thread).
  __device__ __forceinline__ V wait_sum(int64_t k) {
    const int d = static_cast<int>(k % kDepth);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    dsmem::wait_parity(&bar[d], static_cast<unsigned>((k / kDepth) & 1));
    const unsigned n = cluster_size();
    V total = slot[d][0];
    for (unsigned r = 1; r < n; ++r) total = add(total, slot[d][r]);
    return total;
#else
    return slot[d][0];
#endif
  }
};

// The warp sums of a row whose kWarps warps span a cluster (forward_f32_cluster_kernel: row_sum<kWarps * 32, 1>'s
// row, CTA q holding its warps q kCtaWarps ..): exchange k's sum of the row's warp `warp` goes into slot
// [k % kDepth][warp] of every CTA of the cluster (st.async by the warp's lanes 0 .. n - 1, lane r to rank r), whose
// thread 0 armed that slot's mbarrier with expect_tx for all kWarps sums; a CTA waits on its own mbarrier and adds
// the kWarps sums in warp order, row_sum's order, so every CTA gets row_sum's bits.
// Slot reuse, as ClusterExchange: a warp pushes exchange k + 1 only after its wait for k (its lanes meet in the
// next row's butterfly first), which needs every warp's push of k, each issued after that warp's wait for k - 1 and
// its reads of k - 1's slot; so exchange k + 1 lands in slot (k + 1) % kDepth, last used by k + 1 - kDepth <= k - 3,
// after every thread of the receiving CTA read it and waited on its phase. Thread 0 may arm a phase after remote
// pushes for it landed: the phase cannot complete before its one arrival.
// V: float (the forward's sum of squares) or float2 (the backward's two sums, added as two floats).
template <int kWarps, int kCtaWarps, typename V = float>
struct ClusterWarpSums {
  static constexpr int kDepth = 4;
  alignas(8) unsigned long long bar[kDepth];
  V slot[kDepth][kWarps];

  // Thread 0 initializes; the caller then passes a cluster barrier before any push.
  __device__ __forceinline__ void init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    dsmem::init_bars(bar, kDepth);
#endif
  }
  // Exchange k's sum v of this CTA's warp (every thread of the warp holds v; rank: this CTA's in the cluster).
  __device__ __forceinline__ void push(int64_t k, unsigned rank, V v) {
    const int d = static_cast<int>(k % kDepth);
    const int warp = static_cast<int>(rank) * kCtaWarps + static_cast<int>(threadIdx.x / 32);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned lane = threadIdx.x % 32;
    if (threadIdx.x == 0) dsmem::arrive_expect(&bar[d], static_cast<unsigned>(kWarps * sizeof(V)));
    if (lane < cluster_size())
      dsmem::store_async(dsmem::map_rank(dsmem::smem_u32(&slot[d][warp]), lane), v,
                         dsmem::map_rank(dsmem::smem_u32(&bar[d]), lane));
#else
    if (threadIdx.x % 32 == 0) slot[d][warp] = v;  // never launched: plan::f32_cluster_vec needs clusters
#endif
  }
  // Exchange k's row sum (every thread).
  __device__ __forceinline__ V wait_sum(int64_t k) {
    const int d = static_cast<int>(k % kDepth);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    dsmem::wait_parity(&bar[d], static_cast<unsigned>((k / kDepth) & 1));
#else
    __syncthreads();
#endif
    V total = slot[d][0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total = add(total, slot[d][w]);
    return total;
  }
};

}  // namespace rmsnorm::cuda
