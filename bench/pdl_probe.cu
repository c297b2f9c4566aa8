// PDL probe (diagnostic, not a test): after the kernel before it ends, when
// does a kernel's work start, launched as a programmatic dependent (it waits
// in griddepcontrol.wait) or plainly? The question behind docs/performance.md,
// "Programmatic dependent launch": bench/torch_ops_bench.py dates a call's
// span from the end of the marker kernel before it, so a dependent's release
// from griddepcontrol.wait falls inside the span while a plain launch's
// latency falls before it. Here the kernels read %globaltimer (ns) themselves:
// a one-CTA marker spins ~20 us and records its end; the probe kernel records
// CTA 0's first instruction and its release from the wait, and the last CTA's
// end. Its work is a copy of the given size, one 256-thread CTA per 16 KiB
// tile (the rows forward's one row group per CTA). Median of 50 calls each.
// Each CTA also records the SM it ran on: "SMs" is how many distinct SMs the
// grid used and "most" the most CTAs one SM ran (medians), which says whether
// a launch spread its CTAs over the GPU or packed them on a few SMs.
//   build/rmsnorm_pdl_probe [MiB ...]      (default: 0 1 64; 0 = one empty CTA)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e = (x);                                                                   \
    if (e != cudaSuccess) {                                                                \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));        \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 4;  // uint4 per thread: 16 KiB per CTA
constexpr unsigned long long kMarkerNs = 20000;
constexpr int kReps = 50;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// t[0]: the marker's end.
__global__ void marker_kernel(unsigned long long* t, unsigned long long spin_ns) {
  const unsigned long long t0 = now_ns();
  while (now_ns() - t0 < spin_ns) {
  }
  t[0] = now_ns();
}

// t[1]: CTA 0's first instruction; t[2]: CTA 0 past griddepcontrol.wait; t[3]: the last CTA's end.
__device__ __forceinline__ unsigned sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

template <bool kPdl>
__global__ void __launch_bounds__(kThreads) probe_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                         size_t n, unsigned long long* t, unsigned* sms) {
  if (blockIdx.x == 0 && threadIdx.x == 0) t[1] = now_ns();
  if (threadIdx.x == 0) sms[blockIdx.x] = sm_id();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kPdl) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (blockIdx.x == 0 && threadIdx.x == 0) t[2] = now_ns();
  const size_t base = size_t{blockIdx.x} * kThreads * kPerThread + threadIdx.x;
  uint4 v[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k)
    if (base + static_cast<size_t>(k) * kThreads < n) v[k] = src[base + static_cast<size_t>(k) * kThreads];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k)
    if (base + static_cast<size_t>(k) * kThreads < n) dst[base + static_cast<size_t>(k) * kThreads] = v[k];
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&t[3], now_ns());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> mibs;
  for (int i = 1; i < argc; ++i) mibs.push_back(std::atof(argv[i]));
  if (mibs.empty()) mibs = {0, 1, 64};
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("PDL probe on %s (sm_%d%d); us after the marker's end, median of %d\n", prop.name, prop.major,
              prop.minor, kReps);
  std::printf("%8s %6s %-10s %14s %14s %14s %6s %6s\n", "MiB", "CTAs", "launch", "first instr", "past wait",
              "last CTA end", "SMs", "most");
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned long long* t = nullptr;
  CK(cudaMalloc(&t, 4 * sizeof(unsigned long long)));
  for (double mib : mibs) {
    const size_t n = static_cast<size_t>(mib * 1024 * 1024) / sizeof(uint4);
    uint4 *src = nullptr, *dst = nullptr;
    CK(cudaMalloc(&src, std::max<size_t>(n, 1) * sizeof(uint4)));
    CK(cudaMalloc(&dst, std::max<size_t>(n, 1) * sizeof(uint4)));
    CK(cudaMemset(src, 1, std::max<size_t>(n, 1) * sizeof(uint4)));
    const size_t per_cta = size_t{kThreads} * kPerThread;
    const unsigned grid = static_cast<unsigned>(std::max<size_t>(1, (n + per_cta - 1) / per_cta));
    unsigned* sms = nullptr;
    CK(cudaMalloc(&sms, grid * sizeof(unsigned)));
    std::vector<unsigned> sm_host(grid);
    for (bool pdl : {false, true}) {
      std::vector<double> first, released, end, used, most;
      for (int r = 0; r < kReps + 5; ++r) {
        CK(cudaMemsetAsync(t, 0, 4 * sizeof(unsigned long long), stream));
        marker_kernel<<<1, 32, 0, stream>>>(t, kMarkerNs);
        CK(cudaGetLastError());
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(kThreads);
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = pdl ? attr : nullptr;
        cfg.numAttrs = pdl ? 1 : 0;
        if (pdl)
          CK(cudaLaunchKernelEx(&cfg, probe_kernel<true>, static_cast<const uint4*>(src), dst, n, t, sms));
        else
          CK(cudaLaunchKernelEx(&cfg, probe_kernel<false>, static_cast<const uint4*>(src), dst, n, t, sms));
        unsigned long long h[4];
        CK(cudaMemcpyAsync(h, t, sizeof h, cudaMemcpyDeviceToHost, stream));
        CK(cudaMemcpyAsync(sm_host.data(), sms, grid * sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        if (r < 5) continue;  // warm-up
        std::vector<int> per_sm(1024, 0);
        for (unsigned s : sm_host) ++per_sm[std::min(s, 1023u)];
        used.push_back(static_cast<double>(std::count_if(per_sm.begin(), per_sm.end(), [](int c) { return c > 0; })));
        most.push_back(*std::max_element(per_sm.begin(), per_sm.end()));
        auto us = [&](unsigned long long x) {
          return (static_cast<double>(static_cast<long long>(x - h[0]))) / 1e3;
        };
        first.push_back(us(h[1]));
        released.push_back(us(h[2]));
        end.push_back(us(h[3]));
      }
      std::printf("%8.1f %6u %-10s %14.2f %14.2f %14.2f %6.0f %6.0f\n", mib, grid, pdl ? "PDL" : "plain",
                  median(first), median(released), median(end), median(used), median(most));
    }
    CK(cudaFree(src));
    CK(cudaFree(dst));
    CK(cudaFree(sms));
  }
  CK(cudaFree(t));
  CK(cudaStreamDestroy(stream));
  return 0;
}
