// Copy probe (diagnostic, not a test): how close do SM copy kernels of a few
// shapes get to cudaMemcpyAsync D2D at 32-512 MiB copied (read + write counted)?
// Strategies: grid-stride persistent, one CTA per 16/32 KiB tile, the tile with
// an L2 evict-first load policy, and TMA bulk copies through shared memory
// (sm_90). Each size rotates over enough buffers (>= 1.5 GiB) that sources
// are out of L2; median of 40 event-timed calls. Results are not checked: the
// bulk kernel assumes sizes that are multiples of 16 KiB (all here are).
//   build/rmsnorm_copy_probe          (results: docs/performance.md, "Why the bandwidth targets are missed")
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void __launch_bounds__(256) k_stride(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n) {
  const size_t st = size_t{gridDim.x} * blockDim.x;
  size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + 3 * st < n; i += 4 * st) {
    uint4 a = s[i], b = s[i + st], c = s[i + 2 * st], e = s[i + 3 * st];
    d[i] = a; d[i + st] = b; d[i + 2 * st] = c; d[i + 3 * st] = e;
  }
  for (; i < n; i += st) d[i] = s[i];
}
// one CTA per tile of T*4 uint4 (contiguous), non-persistent: hardware balances the tail
template <int T>
__global__ void __launch_bounds__(T) k_tile(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n) {
  size_t base = size_t{blockIdx.x} * T * 4 + threadIdx.x;
  uint4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) if (base + k * T < n) v[k] = s[base + k * T];
#pragma unroll
  for (int k = 0; k < 4; ++k) if (base + k * T < n) d[base + k * T] = v[k];
}
// same with cache hints: loads evict_first / no L1 allocate, stores default
template <int T>
__global__ void __launch_bounds__(T) k_tile_hint(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n) {
  size_t base = size_t{blockIdx.x} * T * 4 + threadIdx.x;
  uint4 v[4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#pragma unroll
  for (int k = 0; k < 4; ++k) if (base + k * T < n) {
    const uint4* p = s + base + k * T;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(p), "l"(pol));
  }
#else
#pragma unroll
  for (int k = 0; k < 4; ++k) if (base + k * T < n) v[k] = s[base + k * T];
#endif
#pragma unroll
  for (int k = 0; k < 4; ++k) if (base + k * T < n) d[base + k * T] = v[k];
}
// TMA bulk: persistent, 1 CTA/SM-ish, stages of CH bytes: global->smem (mbarrier), smem->global (bulk group)
constexpr int CH = 16384, NST = 8;
__device__ __forceinline__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__global__ void __launch_bounds__(32) k_bulk(const char* __restrict__ s, char* __restrict__ d, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) uint64_t bar[NST];
  const size_t nch = bytes / CH;
  if (threadIdx.x != 0) return;
  for (int k = 0; k < NST; ++k) asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(sa(&bar[k])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  uint32_t phase[NST] = {};
  size_t c0 = blockIdx.x;
  auto issue = [&](size_t c, int k) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(sa(&bar[k])), "r"(CH));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(sa(sm + k * CH)), "l"(s + c * CH), "r"(CH), "r"(sa(&bar[k])) : "memory");
  };
  int k = 0;
  for (int j = 0; j < NST; ++j) { size_t c = c0 + size_t(j) * gridDim.x; if (c < nch) issue(c, j); }
  for (size_t c = c0; c < nch; c += gridDim.x) {
    // wait stage k
    asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" :: "r"(sa(&bar[k])), "r"(phase[k]));
    phase[k] ^= 1;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(d + c * CH), "r"(sa(sm + k * CH)), "r"(CH) : "memory");
    asm volatile("cp.async.bulk.commit_group;");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // smem k free again
    size_t cn = c + size_t(NST) * gridDim.x;
    if (cn < nch) issue(cn, k);
    k = (k + 1) % NST;
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cudaEvent_t e0[64], e1[64];
  for (int i = 0; i < 64; ++i) { CK(cudaEventCreate(&e0[i])); CK(cudaEventCreate(&e1[i])); }
  CK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, NST * CH));
  int occ_bulk = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_bulk, k_bulk, 32, NST * CH));
  printf("bulk occupancy %d CTA/SM\n", occ_bulk);
  for (size_t mib : {32, 64, 128, 256, 512}) {
    size_t bytes = mib << 20; size_t n = bytes / 16;
    int sets = std::max<int>(2, int((size_t(1536) << 20) / bytes) + 1);
    std::vector<char*> S(sets), D(sets);
    for (int k = 0; k < sets; ++k) { CK(cudaMalloc(&S[k], bytes)); CK(cudaMalloc(&D[k], bytes)); CK(cudaMemset(S[k], 1, bytes)); }
    auto run = [&](const char* name, auto launch) -> int {
      for (int r = 0; r < 2 * sets; ++r) launch(r);
      CK(cudaStreamSynchronize(st));
      const int reps = 40; std::vector<float> t;
      for (int rr = 0; rr < reps; rr += 20) {
        for (int r = 0; r < 20; ++r) { CK(cudaEventRecord(e0[r], st)); launch(rr + r); CK(cudaEventRecord(e1[r], st)); }
        CK(cudaStreamSynchronize(st));
        for (int r = 0; r < 20; ++r) { float ms; CK(cudaEventElapsedTime(&ms, e0[r], e1[r])); t.push_back(ms * 1e3f); }
      }
      CK(cudaGetLastError());
      std::sort(t.begin(), t.end());
      printf("%4zu MiB copied  %-28s median %8.2f us  %7.1f GB/s (min %7.2f)\n", mib, name, t[t.size() / 2], 2.0 * bytes / t[t.size() / 2] / 1e3, t[0]);
      return 0;
    };
    run("memcpy", [&](int r) { cudaMemcpyAsync(D[r % sets], S[r % sets], bytes, cudaMemcpyDeviceToDevice, st); });
    run("stride sm*8x256", [&](int r) { k_stride<<<sms * 8, 256, 0, st>>>((const uint4*)S[r % sets], (uint4*)D[r % sets], n); });
    run("stride sm*4x256", [&](int r) { k_stride<<<sms * 4, 256, 0, st>>>((const uint4*)S[r % sets], (uint4*)D[r % sets], n); });
    run("tile256x4 nonpersistent", [&](int r) { k_tile<256><<<(n + 1023) / 1024, 256, 0, st>>>((const uint4*)S[r % sets], (uint4*)D[r % sets], n); });
    run("tile512x4 nonpersistent", [&](int r) { k_tile<512><<<(n + 2047) / 2048, 512, 0, st>>>((const uint4*)S[r % sets], (uint4*)D[r % sets], n); });
    run("tile256x4 evict_first", [&](int r) { k_tile_hint<256><<<(n + 1023) / 1024, 256, 0, st>>>((const uint4*)S[r % sets], (uint4*)D[r % sets], n); });
    run("bulk 16K x8 stages, sm*1", [&](int r) { k_bulk<<<sms, 32, NST * CH, st>>>(S[r % sets], D[r % sets], bytes); });
    if (occ_bulk >= 2) run("bulk 16K x8 stages, sm*occ", [&](int r) { k_bulk<<<sms * occ_bulk, 32, NST * CH, st>>>(S[r % sets], D[r % sets], bytes); });
    for (int k = 0; k < sets; ++k) { CK(cudaFree(S[k])); CK(cudaFree(D[k])); }
  }
  return 0;
}
