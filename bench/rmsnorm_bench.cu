// rmsnorm benchmark: forward, VJP (backward with the forward's rstd) and
// backward recomputing rstd over the BRIEF's shape list, the fused backward
// against the two-pass design it replaces, the slow paths (misaligned base,
// D % 8 != 0), and decode shapes by CUDA graph replay. A tool, not a test:
// targets are printed next to the numbers (PASS/MISS) and recorded in JSON,
// never asserted (exit code 0 on MISS; nonzero only when a call fails).
//
// Napkin math (the minimal bytes every number is measured against):
//   forward  read x, write y:            2 * rows * D * esize  + D * esize (w)
//   VJP      read x, gy, write gx:       3 * rows * D * esize  + 2 * D * esize (w, gw)
//   (rstd, 4 * rows bytes, is left out: it is not part of the minimal traffic.)
//   8192x4096 f16: forward 128 MiB, VJP 192 MiB; at the ~4.27 TB/s copy
//   ceiling that is ~31 us and ~47 us, hence the 52 us VJP target.
//
// Method (../shared/BRIEF.md "Performance: how it is judged"):
//   - ceiling = device-to-device cudaMemcpyAsync of a 1 GiB buffer, counted as
//     read + write, median of 20, measured in this run (again at the end, to
//     show drift);
//   - every operand filled with random normals by a hash generator (never
//     zeros: they can run faster and hide unwritten outputs);
//   - k copies of the operands, k = ceil(max(200 MiB, 3 x L2) / forward
//     bytes), used round-robin so that no call finds its inputs in L2;
//   - warm-up (>= max(k, 8) calls and >= 30 ms), then each call bracketed by
//     its own pair of CUDA events; median, p10, p90 of >= 50 calls. The timed
//     calls are queued behind a short spin kernel, so the host (argument
//     checks, launches) runs ahead of the GPU and no event pair can contain
//     host time; a second batch, one event pair around all calls, gives the
//     back-to-back time per call ("b2b", gaps between kernels included);
//   - decode shapes: N = 20 calls captured in one CUDA graph, replayed; per
//     call = replay time / N (launch overhead is what decode pays);
//   - the library through its public C ABI on a non-blocking stream, the
//     workspace allocated once per shape outside timing.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"
#include "cuda/element.cuh"  // from_float: the library's own float -> T rounding
#include "two_pass.hpp"
#include "rmsnorm/rmsnorm.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Options, results, failure
// ---------------------------------------------------------------------------------------------

struct Options {
  int reps = 100;
  int copy_reps = 20;
  double warm_ms = 30.0;
  bool quick = false;
  bool extra = true;  // shapes beyond the BRIEF's list (see kShapes)
  std::string json;
  std::string shapes;  // substring filter on "ROWSxCOLS dtype"
  std::string commit;
  std::vector<std::string> custom;  // --shape ROWSxCOLS:DTYPE[:offset], repeatable: these instead of the list
};

struct Stats {
  int reps = 0;
  double median = std::numeric_limits<double>::quiet_NaN();  // microseconds
  double p10 = median, p90 = median, min = median, mean = median;
  double b2b = median;  // per call, one event pair around `reps` back-to-back calls (0 calls: NaN)
  // Host time to queue one call (argument checks + launches). When queueing
  // all calls took longer than the head start, the GPU may have waited on the
  // host inside an event pair: host_bound flags numbers that can be too high.
  double host_us = median;
  bool host_bound = false;
};

struct Target {
  bool has = false;
  std::string label;   // "fwd >= 95% of copy (D >= 4096)"
  std::string metric;  // "pct_copy", "us", "speedup"
  bool at_most = false;
  double value = 0;
  double measured = 0;
  bool pass = false;
  bool small = false;  // % target on < 256 MiB of data: reported, but outside the BRIEF's rule
};

struct CaseResult {
  std::string group;    // default, extra, slow_path, decode
  std::string op;       // forward, vjp, backward_recompute, vjp_two_pass, decode_forward, decode_vjp
  std::string variant;  // aligned, base+1elem
  int64_t rows = 0, cols = 0;
  std::string dtype;
  double bytes = 0;  // minimal bytes per call
  int sets = 0;      // operand sets rotated
  bool graph = false;
  int calls_per_graph = 0;
  Stats st;
  double gbps = std::numeric_limits<double>::quiet_NaN(), pct = gbps;
  double extra_bytes = -1;  // workspace (fused) or temporary (two-pass); -1: n/a
  double vs_aligned = 0;    // time / time of the aligned case of the same op (slow paths)
  std::string vs_aligned_case;  // which case that is ("8192x4096")
  std::string check;        // host re-computation of two rows: "ok", "mismatch ...", "" (not checked)
  std::string error;        // set when the case could not run (graph capture refused, ...)
  std::vector<Target> targets;
};

struct Comparison {
  int64_t rows = 0, cols = 0;
  std::string dtype;
  double fused_us = 0, two_pass_us = 0, speedup = 0;
  double fused_gbps = 0, two_pass_gbps = 0;
  double fused_extra_bytes = 0, two_pass_extra_bytes = 0;
  std::string error;
  Target target;
};

struct Meta {
  std::string gpu, pci_bus_id, date_utc, commit, smi_clocks;
  int sm_count = 0, cc_major = 0, cc_minor = 0, driver = 0, runtime = 0;
  int sm_clock_khz = 0, mem_clock_khz = 0, bus_width_bits = 0;
  size_t l2_bytes = 0, total_mem = 0;
  double copy_gbps = 0, copy_gbps_end = 0;
  Stats copy_st, copy_st_end;
  double rotation_bytes = 0;
  // stream_copy_kernel: {bytes copied, GB/s}
  std::vector<std::pair<double, double>> kernel_copy;
  // cudaMemcpyAsync D2D at the same sizes: {bytes copied, GB/s}
  std::vector<std::pair<double, double>> memcpy_by_size;
};

Options g_opt;
Meta g_meta;
std::vector<CaseResult> g_cases;
std::vector<Comparison> g_comparisons;

void write_json(const std::string& fatal_error);

// The benchmark is a tool: on the first failing call it says which one and
// why, writes what it has measured so far (so a long run is not lost), and
// exits nonzero.
[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "rmsnorm_bench: FATAL: %s\n", msg.c_str());
  std::fflush(stdout);
  if (!g_opt.json.empty()) write_json(msg);
  std::exit(1);
}

void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    die(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorName(e) + ": " +
        cudaGetErrorString(e));
}
#define RMSNORM_BENCH_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)

void check_status(rmsnorm_status_t st, const char* what) {
  if (st != RMSNORM_STATUS_SUCCESS)
    die(std::string(what) + " returned " + rmsnorm_status_string(st) + ": " + rmsnorm_last_error());
}

// ---------------------------------------------------------------------------------------------
// Device memory and random fill
// ---------------------------------------------------------------------------------------------

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) RMSNORM_BENCH_CUDA(cudaMalloc(&p_, bytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);  // nothing useful to do with an error in a destructor
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// mean + scale * N(0, 1) per element, Box-Muller over a counter hash: fresh,
// reproducible per seed, no cuRAND dependency. u1 is in (0, 1], so log never
// sees 0; a zero draw has probability ~0, so outputs are never all zeros.
template <typename T>
__global__ void fill_normal_kernel(T* p, size_t n, uint64_t seed, float mean, float scale) {
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint64_t h = splitmix64(seed * 0xD1B54A32D192ED03ull + i);
    const float u1 = static_cast<float>((h >> 40) + 1) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((h >> 16) & 0xFFFFFFull) * (1.0f / 16777216.0f);
    const float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    p[i] = rmsnorm::cuda::from_float<T>(mean + scale * z);
  }
}

uint64_t g_seed = 0x5EED;

void fill_normal(const DeviceBuffer& b, rmsnorm_dtype_t dtype, float mean, float scale, cudaStream_t s) {
  const size_t esize = rmsnorm_dtype_size(dtype);
  const size_t n = b.bytes() / esize;
  if (n == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 132 * 16));
  const uint64_t seed = g_seed++;
  switch (dtype) {
    case RMSNORM_DTYPE_F32:
      fill_normal_kernel<float><<<grid, 256, 0, s>>>(static_cast<float*>(b.get()), n, seed, mean, scale);
      break;
    case RMSNORM_DTYPE_F16:
      fill_normal_kernel<__half><<<grid, 256, 0, s>>>(static_cast<__half*>(b.get()), n, seed, mean, scale);
      break;
    case RMSNORM_DTYPE_BF16:
      fill_normal_kernel<__nv_bfloat16>
          <<<grid, 256, 0, s>>>(static_cast<__nv_bfloat16*>(b.get()), n, seed, mean, scale);
      break;
  }
  RMSNORM_BENCH_CUDA(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------

// Keeps the GPU busy for `ns` nanoseconds (one thread, sleeping), so that the
// host can queue a whole timed batch before the GPU reaches it.
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// Head start for `calls` queued calls: 25 us of host work per call is far
// more than the API's checks and launches take; at least 1 ms, at most 50 ms.
// Returns its length in milliseconds.
double head_start(cudaStream_t s, int calls) {
  const double us = std::min(50000.0, std::max(1000.0, 25.0 * calls));
  spin_kernel<<<1, 1, 0, s>>>(static_cast<unsigned long long>(us * 1e3));
  RMSNORM_BENCH_CUDA(cudaGetLastError());
  return us / 1e3;
}

double wall_ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Linear interpolation between order statistics.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

Stats summarize(std::vector<double> us) {
  Stats s;
  s.reps = static_cast<int>(us.size());
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.median = quantile(us, 0.5);
  s.p10 = quantile(us, 0.1);
  s.p90 = quantile(us, 0.9);
  s.min = us.front();
  double sum = 0;
  for (double v : us) sum += v;
  s.mean = sum / static_cast<double>(us.size());
  return s;
}

// Event pairs, created once and reused so that event creation stays out of
// every timed region.
class EventPool {
 public:
  void ensure(size_t pairs) {
    while (start_.size() < pairs) {
      cudaEvent_t a, b;
      RMSNORM_BENCH_CUDA(cudaEventCreate(&a));
      RMSNORM_BENCH_CUDA(cudaEventCreate(&b));
      start_.push_back(a);
      stop_.push_back(b);
    }
  }
  cudaEvent_t start(size_t i) const { return start_[i]; }
  cudaEvent_t stop(size_t i) const { return stop_[i]; }
  std::vector<double> elapsed_us(size_t n) const {
    std::vector<double> us(n);
    for (size_t i = 0; i < n; ++i) {
      float ms = 0;
      RMSNORM_BENCH_CUDA(cudaEventElapsedTime(&ms, start_[i], stop_[i]));
      us[i] = 1e3 * static_cast<double>(ms);
    }
    return us;
  }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};
EventPool g_events;

// Warm-up, then each call between its own two events. call(set) returns a
// status; any failure ends the benchmark. Per-call events (rather than one
// pair around a batch) keep host-side gaps between calls out of the numbers
// while still counting everything between one call's first and last kernel.
template <typename Call>
Stats time_stream(cudaStream_t s, int reps, int nsets, const char* what, Call&& call) {
  int next = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int batch = std::max(nsets, 8);
  do {
    for (int j = 0; j < batch; ++j) check_status(call(next++ % nsets), what);
    RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  } while (wall_ms_since(t0) < g_opt.warm_ms && next < 20000);
  g_events.ensure(static_cast<size_t>(reps) + 1);
  const double lead_ms = head_start(s, reps);
  const auto q0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.start(static_cast<size_t>(r)), s));
    check_status(call(next++ % nsets), what);
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.stop(static_cast<size_t>(r)), s));
  }
  const double queue_ms = wall_ms_since(q0);
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  Stats st = summarize(g_events.elapsed_us(static_cast<size_t>(reps)));
  st.host_us = 1e3 * queue_ms / reps;
  st.host_bound = queue_ms > lead_ms;
  // Back-to-back: the same calls with no events between them.
  const size_t b = static_cast<size_t>(reps);
  head_start(s, reps);
  RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.start(b), s));
  for (int r = 0; r < reps; ++r) check_status(call(next++ % nsets), what);
  RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.stop(b), s));
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  float ms = 0;
  RMSNORM_BENCH_CUDA(cudaEventElapsedTime(&ms, g_events.start(b), g_events.stop(b)));
  st.b2b = 1e3 * static_cast<double>(ms) / reps;
  return st;
}

// `calls` calls (call(j) for j < calls) captured into one graph and replayed;
// per call = replay time / calls. A capture the library refuses is reported
// in *error (a property of the library worth seeing), not fatal.
template <typename Call>
Stats time_graph(cudaStream_t s, int reps, int calls, Call&& call, std::string* error) {
  cudaGraph_t graph = nullptr;
  // Global mode: the strictest, and what torch.cuda.graph uses by default.
  RMSNORM_BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  rmsnorm_status_t st = RMSNORM_STATUS_SUCCESS;
  std::string why;
  for (int j = 0; j < calls && st == RMSNORM_STATUS_SUCCESS; ++j) {
    st = call(j);
    if (st != RMSNORM_STATUS_SUCCESS) why = std::string(rmsnorm_status_string(st)) + ": " + rmsnorm_last_error();
  }
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (st != RMSNORM_STATUS_SUCCESS || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // capture errors are not sticky; clear the last-error slot
    *error = "graph capture failed: " + (why.empty() ? std::string(cudaGetErrorString(end)) : why);
    return Stats{};
  }
  cudaGraphExec_t exec = nullptr;
  RMSNORM_BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  RMSNORM_BENCH_CUDA(cudaGraphUpload(exec, s));
  const auto t0 = std::chrono::steady_clock::now();
  int warm = 0;
  do {
    RMSNORM_BENCH_CUDA(cudaGraphLaunch(exec, s));
    RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  } while (++warm < 10 || wall_ms_since(t0) < g_opt.warm_ms);
  g_events.ensure(static_cast<size_t>(reps));
  head_start(s, reps);
  for (int r = 0; r < reps; ++r) {
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.start(static_cast<size_t>(r)), s));
    RMSNORM_BENCH_CUDA(cudaGraphLaunch(exec, s));
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.stop(static_cast<size_t>(r)), s));
  }
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  std::vector<double> us = g_events.elapsed_us(static_cast<size_t>(reps));
  for (double& v : us) v /= calls;
  RMSNORM_BENCH_CUDA(cudaGraphExecDestroy(exec));
  RMSNORM_BENCH_CUDA(cudaGraphDestroy(graph));
  return summarize(std::move(us));
}

// Device-to-device copy of 1 GiB, read + write bytes: the ceiling.
Stats measure_copy(cudaStream_t s, double* gbps) {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer src(bytes), dst(bytes);
  fill_normal(src, RMSNORM_DTYPE_F32, 0.0f, 1.0f, s);
  for (int i = 0; i < 3; ++i) RMSNORM_BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  const int reps = g_opt.copy_reps;
  g_events.ensure(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.start(static_cast<size_t>(r)), s));
    RMSNORM_BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.stop(static_cast<size_t>(r)), s));
  }
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  Stats st = summarize(g_events.elapsed_us(static_cast<size_t>(reps)));
  *gbps = 2.0 * static_cast<double>(bytes) / st.median / 1e3;
  return st;
}

// A plain SM-driven stream copy (uint4, 4 independent loads in flight per
// thread, grid-stride, 2048 threads per SM): what a simple kernel that reads
// and writes each byte once reaches, at the data sizes of the cases. A
// diagnostic next to the cudaMemcpy ceiling, not a target.
__global__ void __launch_bounds__(256) stream_copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                         size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// GB/s (read + write) of stream_copy_kernel (or, with use_memcpy, of
// cudaMemcpyAsync D2D) copying `bytes`, rotating over enough buffers that each
// call's source is out of L2; median of the reps. The memcpy at a case's own
// data size says how much of the 1 GiB ceiling a copy itself reaches there.
double measure_kernel_copy(cudaStream_t s, size_t bytes, bool use_memcpy) {
  const int sets = std::max<int>(2, static_cast<int>((size_t{512} << 20) / bytes) + 1);
  std::vector<DeviceBuffer> src, dst;
  for (int k = 0; k < sets; ++k) {
    src.emplace_back(bytes);
    dst.emplace_back(bytes);
    fill_normal(src.back(), RMSNORM_DTYPE_F32, 0.0f, 1.0f, s);
  }
  const size_t n = bytes / sizeof(uint4);
  const int grid = g_meta.sm_count * 8;
  auto launch = [&](int k) {
    if (use_memcpy) {
      RMSNORM_BENCH_CUDA(
          cudaMemcpyAsync(dst[k % sets].get(), src[k % sets].get(), bytes, cudaMemcpyDeviceToDevice, s));
      return;
    }
    stream_copy_kernel<<<grid, 256, 0, s>>>(static_cast<const uint4*>(src[k % sets].get()),
                                            static_cast<uint4*>(dst[k % sets].get()), n);
  };
  for (int k = 0; k < 2 * sets; ++k) launch(k);
  RMSNORM_BENCH_CUDA(cudaGetLastError());
  // 30 reps: with 10, two runs disagreed by up to 8 points at 128-256 MiB moved.
  const int reps = std::max(g_opt.copy_reps, 30);
  g_events.ensure(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.start(static_cast<size_t>(r)), s));
    launch(r);
    RMSNORM_BENCH_CUDA(cudaEventRecord(g_events.stop(static_cast<size_t>(r)), s));
  }
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(s));
  const Stats st = summarize(g_events.elapsed_us(static_cast<size_t>(reps)));
  return 2.0 * static_cast<double>(bytes) / st.median / 1e3;
}

// ---------------------------------------------------------------------------------------------
// Host-side sanity check of two rows (first and last of set 0): a kernel that
// is fast because it is wrong must not produce a PASS. Not a test: a normwise
// comparison against double at a loose tolerance.
// ---------------------------------------------------------------------------------------------

float host_to_float(const unsigned char* p, rmsnorm_dtype_t dtype) {
  if (dtype == RMSNORM_DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (dtype == RMSNORM_DTYPE_BF16) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  float mag;
  if (exp == 0)
    mag = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    mag = man != 0 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    mag = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign != 0 ? -mag : mag;
}

std::vector<double> read_row(const void* base, int64_t row, int64_t stride, int64_t cols, rmsnorm_dtype_t dtype) {
  const size_t esize = rmsnorm_dtype_size(dtype);
  std::vector<unsigned char> raw(static_cast<size_t>(cols) * esize);
  const auto* src = static_cast<const unsigned char*>(base) + static_cast<size_t>(row * stride) * esize;
  RMSNORM_BENCH_CUDA(cudaMemcpy(raw.data(), src, raw.size(), cudaMemcpyDeviceToHost));
  std::vector<double> v(static_cast<size_t>(cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = host_to_float(raw.data() + i * esize, dtype);
  return v;
}

double check_tolerance(rmsnorm_dtype_t dtype) {
  // Normwise (max |err| / max |ref|); a few units of the output dtype's
  // rounding, loose enough for gx's cancellation, tight enough to catch a
  // wrong normalizer or unwritten output.
  return dtype == RMSNORM_DTYPE_F32 ? 1e-4 : dtype == RMSNORM_DTYPE_F16 ? 5e-3 : 3e-2;
}

// out is y (forward) or gx (backward, gy given).
std::string check_rows(bool backward, int64_t rows, int64_t cols, rmsnorm_dtype_t dtype, float eps, const void* x,
                       const void* gy, const void* w, const void* out, int64_t stride) {
  const std::vector<double> wv = read_row(w, 0, cols, cols, dtype);
  double worst = 0;
  for (int64_t row : {int64_t{0}, rows - 1}) {
    const std::vector<double> xv = read_row(x, row, stride, cols, dtype);
    const std::vector<double> ov = read_row(out, row, stride, cols, dtype);
    double ss = 0;
    for (double v : xv) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    std::vector<double> ref(static_cast<size_t>(cols));
    if (!backward) {
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = xv[i] * r * wv[i];
    } else {
      const std::vector<double> gv = read_row(gy, row, stride, cols, dtype);
      double dot = 0;
      for (size_t i = 0; i < ref.size(); ++i) dot += xv[i] * r * wv[i] * gv[i];
      const double mean = dot / static_cast<double>(cols);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = r * (wv[i] * gv[i] - xv[i] * r * mean);
    }
    double err = 0, mag = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double e = std::fabs(ov[i] - ref[i]);
      err = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(err, e);
      mag = std::max(mag, std::fabs(ref[i]));
    }
    worst = std::max(worst, mag > 0 ? err / mag : err);
  }
  if (worst <= check_tolerance(dtype)) return "ok";
  char buf[96];
  std::snprintf(buf, sizeof buf, "mismatch: normwise error %.3g > %.3g", worst, check_tolerance(dtype));
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Targets (../shared/BRIEF.md), reported not asserted
// ---------------------------------------------------------------------------------------------

constexpr double kTargetDataBytes = 256.0 * 1024 * 1024;  // % targets hold at >= 256 MiB of data

Target pct_target(const CaseResult& c) {
  Target t;
  const int64_t d = c.cols;
  const bool fwd = c.op == "forward";
  const bool vjp = c.op == "vjp";
  if (fwd) {
    if (d >= 4096) t.value = 95, t.label = "fwd >= 95% copy (D >= 4096)";
    else if (d >= 1024) t.value = 92, t.label = "fwd >= 92% copy (1024 <= D < 4096)";
    else if (d >= 128 && d <= 512) t.value = 88, t.label = "fwd >= 88% copy (D in 128..512)";
    else return t;
  } else if (vjp) {
    if (d >= 1024) t.value = 90, t.label = "VJP >= 90% copy (D >= 1024)";
    else if (d >= 128 && d <= 512) t.value = 85, t.label = "VJP >= 85% copy (D in 128..512)";
    else return t;
  } else {
    return t;
  }
  t.has = true;
  t.metric = "pct_copy";
  t.measured = c.pct;
  t.pass = c.pct >= t.value;
  t.small = c.bytes < kTargetDataBytes;
  return t;
}

Target us_target(const std::string& label, double limit, double measured) {
  Target t;
  t.has = true;
  t.label = label;
  t.metric = "us";
  t.at_most = true;
  t.value = limit;
  t.measured = measured;
  t.pass = std::isfinite(measured) && measured <= limit;
  return t;
}

std::string verdict(const Target& t) {
  if (!t.has) return "";
  std::string v = t.pass ? "PASS" : "MISS";
  if (t.small) v += " (small)";
  return v;
}

// ---------------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------------

const char* dtype_name(rmsnorm_dtype_t d) {
  return d == RMSNORM_DTYPE_F32 ? "f32" : d == RMSNORM_DTYPE_F16 ? "f16" : "bf16";
}

void print_header() {
  std::printf("\n%-20s %-13s %-5s %-14s %10s %19s %9s %9s %7s  %s\n", "case", "shape", "dtype", "variant", "us(med)",
              "p10..p90", "b2b us", "GB/s", "%copy", "target");
  std::printf("%s\n", std::string(141, '-').c_str());
}

void print_case(const CaseResult& c) {
  char shape[40];
  std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(c.rows), static_cast<long long>(c.cols));
  if (!c.error.empty()) {
    std::printf("%-20s %-13s %-5s %-14s  ERROR: %s\n", c.op.c_str(), shape, c.dtype.c_str(), c.variant.c_str(),
                c.error.c_str());
    return;
  }
  char range[40];
  std::snprintf(range, sizeof range, "%.2f..%.2f", c.st.p10, c.st.p90);
  std::string note;
  for (const Target& t : c.targets) note += (note.empty() ? "" : "; ") + t.label + ": " + verdict(t);
  if (c.vs_aligned > 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%.2fx the time of aligned ", note.empty() ? "" : "; ", c.vs_aligned);
    note += buf + c.vs_aligned_case;
  }
  if (!c.check.empty() && c.check != "ok") note += "; CHECK " + c.check;
  if (c.st.host_bound) note += "; HOST-BOUND: queueing outran the head start, times may include host work";
  char b2b[24] = "-";  // graph cases have no back-to-back batch
  if (std::isfinite(c.st.b2b)) std::snprintf(b2b, sizeof b2b, "%.2f", c.st.b2b);
  std::printf("%-20s %-13s %-5s %-14s %10.2f %19s %9s %9.1f %6.1f%%  %s\n", c.op.c_str(), shape, c.dtype.c_str(),
              c.variant.c_str(), c.st.median, range, b2b, c.gbps, c.pct, note.c_str());
  std::fflush(stdout);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          o += buf;
        } else {
          o += ch;
        }
    }
  }
  return o;
}
std::string js(const std::string& s) { return "\"" + json_escape(s) + "\""; }
std::string jn(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}
std::string jb(bool b) { return b ? "true" : "false"; }

std::string json_stats(const Stats& s) {
  return "{\"reps\": " + std::to_string(s.reps) + ", \"median_us\": " + jn(s.median) + ", \"p10_us\": " + jn(s.p10) +
         ", \"p90_us\": " + jn(s.p90) + ", \"min_us\": " + jn(s.min) + ", \"mean_us\": " + jn(s.mean) +
         ", \"b2b_us\": " + jn(s.b2b) + ", \"host_us_per_call\": " + jn(s.host_us) + ", \"host_bound\": " +
         jb(s.host_bound) + "}";
}

std::string json_target(const Target& t) {
  if (!t.has) return "null";
  return "{\"label\": " + js(t.label) + ", \"metric\": " + js(t.metric) + ", \"op\": " + js(t.at_most ? "<=" : ">=") +
         ", \"value\": " + jn(t.value) + ", \"measured\": " + jn(t.measured) + ", \"pass\": " + jb(t.pass) +
         ", \"small\": " + jb(t.small) + ", \"verdict\": " + js(verdict(t)) + "}";
}

void write_json(const std::string& fatal_error) {
  std::FILE* f = std::fopen(g_opt.json.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "rmsnorm_bench: cannot write %s\n", g_opt.json.c_str());
    return;
  }
  const Meta& m = g_meta;
  std::string s = "{\n";
  s += "  \"tool\": \"rmsnorm_bench\",\n";
  s += "  \"library_version\": \"" + std::to_string(RMSNORM_VERSION_MAJOR) + "." +
       std::to_string(RMSNORM_VERSION_MINOR) + "." + std::to_string(RMSNORM_VERSION_PATCH) + "\",\n";
  s += "  \"date_utc\": " + js(m.date_utc) + ",\n";
  s += "  \"commit\": " + js(m.commit) + ",\n";
  s += "  \"gpu\": {\"name\": " + js(m.gpu) + ", \"pci_bus_id\": " + js(m.pci_bus_id) +
       ", \"sm_count\": " + std::to_string(m.sm_count) + ", \"compute_capability\": \"" +
       std::to_string(m.cc_major) + "." + std::to_string(m.cc_minor) + "\", \"l2_bytes\": " + jn(static_cast<double>(m.l2_bytes)) +
       ", \"memory_bytes\": " + jn(static_cast<double>(m.total_mem)) + ", \"max_sm_clock_khz\": " +
       std::to_string(m.sm_clock_khz) + ", \"max_mem_clock_khz\": " + std::to_string(m.mem_clock_khz) +
       ", \"bus_width_bits\": " + std::to_string(m.bus_width_bits) + ", \"nvidia_smi_clocks\": " + js(m.smi_clocks) +
       "},\n";
  s += "  \"driver_version\": " + std::to_string(m.driver) + ",\n";
  s += "  \"runtime_version\": " + std::to_string(m.runtime) + ",\n";
  s += "  \"method\": {\"timing\": \"CUDA events around each call, queued behind a spin kernel, after warm-up; "
       "median/p10/p90; b2b = one event pair around all calls\", "
       "\"reps\": " + std::to_string(g_opt.reps) + ", \"quick\": " + jb(g_opt.quick) +
       ", \"rotation_min_bytes\": " + jn(m.rotation_bytes) +
       ", \"fill\": \"random normal (hash Box-Muller), w ~ N(1, 0.25)\", \"eps\": 1e-05, "
       "\"decode\": \"20 calls per CUDA graph, per call = replay / 20\", "
       "\"bytes\": \"forward 2*rows*D*esize + D*esize; vjp 3*rows*D*esize + 2*D*esize\", "
       "\"small_rule_bytes\": " + jn(kTargetDataBytes) + "},\n";
  s += "  \"copy\": {\"bytes_per_copy\": " + jn(2.0 * (1 << 30)) + ", \"gbps\": " + jn(m.copy_gbps) +
       ", \"stats\": " + json_stats(m.copy_st) + ", \"gbps_end\": " + jn(m.copy_gbps_end) +
       ", \"stats_end\": " + json_stats(m.copy_st_end) + "},\n";
  s += "  \"kernel_copy\": [";
  for (size_t i = 0; i < m.kernel_copy.size(); ++i)
    s += std::string(i ? ", " : "") + "{\"bytes_copied\": " + jn(m.kernel_copy[i].first) +
         ", \"gbps\": " + jn(m.kernel_copy[i].second) + "}";
  s += "],\n  \"memcpy_by_size\": [";
  for (size_t i = 0; i < m.memcpy_by_size.size(); ++i)
    s += std::string(i ? ", " : "") + "{\"bytes_copied\": " + jn(m.memcpy_by_size[i].first) +
         ", \"gbps\": " + jn(m.memcpy_by_size[i].second) + "}";
  s += "],\n";
  s += "  \"cases\": [";
  for (size_t i = 0; i < g_cases.size(); ++i) {
    const CaseResult& c = g_cases[i];
    s += i ? ",\n    " : "\n    ";
    s += "{\"group\": " + js(c.group) + ", \"op\": " + js(c.op) + ", \"variant\": " + js(c.variant) +
         ", \"rows\": " + std::to_string(c.rows) + ", \"cols\": " + std::to_string(c.cols) + ", \"dtype\": " +
         js(c.dtype) + ", \"bytes\": " + jn(c.bytes) + ", \"sets\": " + std::to_string(c.sets) +
         ", \"graph\": " + jb(c.graph) + ", \"calls_per_graph\": " + std::to_string(c.calls_per_graph) +
         ", \"us\": " + jn(c.st.median) + ", \"stats\": " + json_stats(c.st) + ", \"gbps\": " + jn(c.gbps) +
         ", \"pct_copy\": " + jn(c.pct) + ", \"extra_device_bytes\": " + jn(c.extra_bytes) +
         ", \"vs_aligned\": " + jn(c.vs_aligned > 0 ? c.vs_aligned : std::nan("")) +
         ", \"vs_aligned_case\": " + js(c.vs_aligned_case) + ", \"check\": " + js(c.check) +
         ", \"error\": " + js(c.error) + ", \"targets\": [";
    for (size_t j = 0; j < c.targets.size(); ++j) s += (j ? ", " : "") + json_target(c.targets[j]);
    s += "]}";
  }
  s += "\n  ],\n  \"fused_vs_two_pass\": [";
  for (size_t i = 0; i < g_comparisons.size(); ++i) {
    const Comparison& c = g_comparisons[i];
    s += i ? ",\n    " : "\n    ";
    s += "{\"rows\": " + std::to_string(c.rows) + ", \"cols\": " + std::to_string(c.cols) + ", \"dtype\": " +
         js(c.dtype) + ", \"fused_us\": " + jn(c.fused_us) + ", \"two_pass_us\": " + jn(c.two_pass_us) +
         ", \"speedup\": " + jn(c.speedup) + ", \"fused_gbps\": " + jn(c.fused_gbps) + ", \"two_pass_gbps\": " +
         jn(c.two_pass_gbps) + ", \"fused_extra_device_bytes\": " + jn(c.fused_extra_bytes) +
         ", \"two_pass_extra_device_bytes\": " + jn(c.two_pass_extra_bytes) + ", \"error\": " + js(c.error) +
         ", \"target\": " + json_target(c.target) + "}";
  }
  s += "\n  ],\n  \"fatal_error\": " + (fatal_error.empty() ? std::string("null") : js(fatal_error)) + "\n}\n";
  std::fputs(s.c_str(), f);
  std::fclose(f);
  std::printf("\nwrote %s\n", g_opt.json.c_str());
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

constexpr float kEps = 1e-5f;

struct Shape {
  int64_t rows, cols;
  rmsnorm_dtype_t dtype;
  const char* group;
  int64_t offset_elems;  // base of x, y, gy, gx moved by this many elements (misaligned)
  bool two_pass;         // also time the two-pass backward here
};

// The BRIEF's / issues' default list, then "extra" shapes: the default list
// has no case at >= 256 MiB (the size the % targets are stated for) for D in
// 128..512, none in 1024 <= D < 4096, and the seed shape's forward moves only
// 128 MiB; these fill those gaps. Then the slow paths. Decode shapes run last.
const Shape kShapes[] = {
    {8192, 4096, RMSNORM_DTYPE_F16, "default", 0, true},
    {8192, 4096, RMSNORM_DTYPE_BF16, "default", 0, false},
    {8192, 4096, RMSNORM_DTYPE_F32, "default", 0, false},
    {32768, 512, RMSNORM_DTYPE_BF16, "default", 0, false},
    {32768, 384, RMSNORM_DTYPE_F16, "default", 0, false},
    {131072, 128, RMSNORM_DTYPE_BF16, "default", 0, false},
    {16384, 7168, RMSNORM_DTYPE_BF16, "default", 0, true},
    {4096, 16384, RMSNORM_DTYPE_BF16, "default", 0, false},
    {1024, 65536, RMSNORM_DTYPE_BF16, "default", 0, false},
    {1024, 262144, RMSNORM_DTYPE_BF16, "default", 0, false},
    {16384, 4096, RMSNORM_DTYPE_F16, "extra", 0, false},
    {131072, 1024, RMSNORM_DTYPE_BF16, "extra", 0, false},
    {262144, 512, RMSNORM_DTYPE_BF16, "extra", 0, false},
    {524288, 384, RMSNORM_DTYPE_F16, "extra", 0, false},
    {1048576, 128, RMSNORM_DTYPE_BF16, "extra", 0, false},
    {8192, 4096, RMSNORM_DTYPE_BF16, "slow_path", 1, false},
    {8192, 4095, RMSNORM_DTYPE_BF16, "slow_path", 0, false},
};

struct DecodeShape {
  int64_t rows, cols;
  rmsnorm_dtype_t dtype;
};
const DecodeShape kDecode[] = {{1, 4096, RMSNORM_DTYPE_BF16}, {128, 4096, RMSNORM_DTYPE_BF16}};
constexpr int kGraphCalls = 20;

std::string shape_label(int64_t rows, int64_t cols, rmsnorm_dtype_t dtype) {
  return std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(dtype);
}

// --shape ROWSxCOLS:DTYPE[:offset] (e.g. 32768x4096:f16, 8192x4096:bf16:offset): a case of group "custom",
// aligned, or with every operand's base moved by one element (an odd COLS gives misaligned rows either way).
Shape parse_shape(const std::string& spec) {
  long long r = 0, c = 0;
  char dt[8] = {}, layout[16] = {};
  const int n = std::sscanf(spec.c_str(), "%lldx%lld:%7[a-z0-9]:%15s", &r, &c, dt, layout);
  if (n < 3 || r < 1 || c < 1)
    die("--shape: expected ROWSxCOLS:DTYPE[:offset] (DTYPE f32, f16 or bf16), got '" + spec + "'");
  const std::string d = dt, l = n == 4 ? layout : "";
  if (d != "f32" && d != "f16" && d != "bf16") die("--shape: unknown dtype in '" + spec + "'");
  if (!l.empty() && l != "offset") die("--shape: unknown layout '" + l + "' (only offset)");
  const rmsnorm_dtype_t dtype = d == "f32" ? RMSNORM_DTYPE_F32 : d == "f16" ? RMSNORM_DTYPE_F16 : RMSNORM_DTYPE_BF16;
  return Shape{r, c, dtype, "custom", l == "offset" ? 1 : 0, false};
}

bool selected(int64_t rows, int64_t cols, rmsnorm_dtype_t dtype, const char* group) {
  if (!g_opt.extra && std::string(group) == "extra") return false;
  if (g_opt.shapes.empty()) return true;
  return (shape_label(rows, cols, dtype) + " " + group).find(g_opt.shapes) != std::string::npos;
}

// One set of operands: the matrices of one call; rotated so that no call
// finds its inputs in L2.
struct OperandSet {
  DeviceBuffer x, gy, out, rstd;
};

double median_of(const std::string& op, int64_t rows, int64_t cols, const std::string& dtype, const std::string& variant) {
  for (const CaseResult& c : g_cases)
    if (c.op == op && c.rows == rows && c.cols == cols && c.dtype == dtype && c.variant == variant && c.error.empty())
      return c.st.median;
  return 0;
}

void finish_case(CaseResult& c) {
  c.gbps = c.bytes / c.st.median / 1e3;
  c.pct = 100.0 * c.gbps / g_meta.copy_gbps;
  const Target pct = pct_target(c);
  if (pct.has) c.targets.push_back(pct);
  if (c.group == "slow_path") {
    // Next to the aligned case of the same op: base+1elem against 8192x4096,
    // 8192x4095 against 8192x4096 (cols rounded up to a 16-byte multiple).
    const int64_t aligned_cols = (c.cols + 7) / 8 * 8;
    const double base = median_of(c.op, c.rows, aligned_cols, c.dtype, "aligned");
    if (base > 0) {
      c.vs_aligned = c.st.median / base;
      c.vs_aligned_case = std::to_string(c.rows) + "x" + std::to_string(aligned_cols);
    }
  }
  print_case(c);
  g_cases.push_back(c);
}

void run_shape(const Shape& sh, cudaStream_t stream, const rmsnorm_backend_t& be) {
  const size_t esize = rmsnorm_dtype_size(sh.dtype);
  const int64_t stride = sh.cols;
  const size_t elems = static_cast<size_t>(sh.rows) * static_cast<size_t>(stride) + static_cast<size_t>(sh.offset_elems);
  const double fwd_bytes = static_cast<double>(2 * sh.rows * sh.cols * static_cast<int64_t>(esize) + sh.cols * static_cast<int64_t>(esize));
  const double vjp_bytes =
      static_cast<double>(3 * sh.rows * sh.cols * static_cast<int64_t>(esize) + 2 * sh.cols * static_cast<int64_t>(esize));

  rmsnorm_problem_t prob = rmsnorm_problem_default();
  prob.rows = sh.rows;
  prob.cols = sh.cols;
  prob.dtype = sh.dtype;
  prob.eps = kEps;

  // Rotation depth from the forward's bytes (the smaller of the two), capped
  // by free device memory (keep half of it free for the workspace and temps).
  const size_t set_bytes = 3 * elems * esize + static_cast<size_t>(sh.rows) * sizeof(float);
  size_t free_mem = 0, total_mem = 0;
  RMSNORM_BENCH_CUDA(cudaMemGetInfo(&free_mem, &total_mem));
  int k = static_cast<int>(std::ceil(g_meta.rotation_bytes / fwd_bytes));
  k = std::max(1, std::min(k, 1024));
  const int k_mem = static_cast<int>(static_cast<double>(free_mem) * 0.5 / static_cast<double>(set_bytes));
  if (k_mem < 1) die("not enough device memory for " + shape_label(sh.rows, sh.cols, sh.dtype));
  if (k > k_mem) {
    std::printf("note: %s rotates %d sets, not %d (device memory)\n", shape_label(sh.rows, sh.cols, sh.dtype).c_str(), k_mem, k);
    k = k_mem;
  }

  std::vector<OperandSet> sets(static_cast<size_t>(k));
  for (OperandSet& s : sets) {
    s.x = DeviceBuffer(elems * esize);
    s.gy = DeviceBuffer(elems * esize);
    s.out = DeviceBuffer(elems * esize);
    s.rstd = DeviceBuffer(static_cast<size_t>(sh.rows) * sizeof(float));
    fill_normal(s.x, sh.dtype, 0.0f, 1.0f, stream);
    fill_normal(s.gy, sh.dtype, 0.0f, 1.0f, stream);
    fill_normal(s.out, sh.dtype, 0.0f, 1.0f, stream);
  }
  DeviceBuffer w(static_cast<size_t>(sh.cols) * esize), gw(static_cast<size_t>(sh.cols) * esize);
  fill_normal(w, sh.dtype, 1.0f, 0.25f, stream);
  size_t ws_bytes = 0;
  check_status(rmsnorm_backward_workspace_size(&prob, RMSNORM_GW_STORE, &be, &ws_bytes), "rmsnorm_backward_workspace_size");
  DeviceBuffer ws(ws_bytes);
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(stream));

  auto at = [&](const DeviceBuffer& b) -> char* { return static_cast<char*>(b.get()) + sh.offset_elems * esize; };
  // base+Nelem: every row start off 16 bytes; unaligned_rows: the first row
  // aligned, the others not (D * esize % 16 != 0). Both take the element path.
  const std::string variant = sh.offset_elems != 0                              ? "base+" + std::to_string(sh.offset_elems) + "elem"
                              : (sh.cols * static_cast<int64_t>(esize)) % 16 != 0 ? "unaligned_rows"
                                                                                  : "aligned";

  CaseResult base;
  base.group = sh.group;
  base.variant = variant;
  base.rows = sh.rows;
  base.cols = sh.cols;
  base.dtype = dtype_name(sh.dtype);
  base.sets = k;

  // Forward, inference style (no rstd output).
  {
    CaseResult c = base;
    c.op = "forward";
    c.bytes = fwd_bytes;
    c.st = time_stream(stream, g_opt.reps, k, "rmsnorm_forward", [&](int i) {
      const OperandSet& s = sets[static_cast<size_t>(i)];
      return rmsnorm_forward(&prob, at(s.x), stride, w.get(), at(s.out), stride, nullptr, &be);
    });
    // Warm-up ran every set at least once, so set 0 holds its own y.
    c.check = check_rows(false, sh.rows, sh.cols, sh.dtype, kEps, at(sets[0].x), nullptr, w.get(), at(sets[0].out), stride);
    finish_case(c);
  }
  // The saved rstd of a training forward, produced outside timing.
  for (OperandSet& s : sets)
    check_status(rmsnorm_forward(&prob, at(s.x), stride, w.get(), at(s.out), stride, static_cast<float*>(s.rstd.get()), &be),
                 "rmsnorm_forward (rstd)");
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(stream));

  auto backward = [&](int i, bool with_rstd) {
    const OperandSet& s = sets[static_cast<size_t>(i)];
    return rmsnorm_backward(&prob, at(s.x), stride, w.get(), at(s.gy), stride,
                            with_rstd ? static_cast<const float*>(s.rstd.get()) : nullptr, at(s.out), stride, gw.get(),
                            RMSNORM_GW_STORE, ws.get(), ws_bytes, &be);
  };
  CaseResult vjp = base;
  vjp.op = "vjp";
  vjp.bytes = vjp_bytes;
  vjp.extra_bytes = static_cast<double>(ws_bytes);
  vjp.st = time_stream(stream, g_opt.reps, k, "rmsnorm_backward", [&](int i) { return backward(i, true); });
  vjp.check = check_rows(true, sh.rows, sh.cols, sh.dtype, kEps, at(sets[0].x), at(sets[0].gy), w.get(), at(sets[0].out), stride);
  if (sh.rows == 8192 && sh.cols == 4096 && sh.dtype == RMSNORM_DTYPE_F16 && sh.offset_elems == 0)
    vjp.targets.push_back(us_target("8192x4096 f16 VJP <= 52 us", 52.0, vjp.st.median));
  finish_case(vjp);

  {
    CaseResult c = base;
    c.op = "backward_recompute";
    c.bytes = vjp_bytes;
    c.extra_bytes = static_cast<double>(ws_bytes);
    c.st = time_stream(stream, g_opt.reps, k, "rmsnorm_backward (no rstd)", [&](int i) { return backward(i, false); });
    finish_case(c);
  }

  if (sh.two_pass) {
    Comparison cmp;
    cmp.rows = sh.rows;
    cmp.cols = sh.cols;
    cmp.dtype = dtype_name(sh.dtype);
    cmp.fused_us = vjp.st.median;
    cmp.fused_gbps = vjp_bytes / vjp.st.median / 1e3;
    cmp.fused_extra_bytes = static_cast<double>(ws_bytes);
    const auto dt = static_cast<rmsnorm::DType>(sh.dtype);
    const size_t temp_bytes = rmsnorm::bench::two_pass_temp_bytes(sh.rows, sh.cols, dt);
    cmp.two_pass_extra_bytes = static_cast<double>(temp_bytes);
    DeviceBuffer temp(temp_bytes);
    auto two_pass = [&](int i) {
      const OperandSet& s = sets[static_cast<size_t>(i)];
      rmsnorm::BackwardArgs a;
      a.rows = sh.rows;
      a.cols = sh.cols;
      a.dtype = dt;
      a.eps = kEps;
      a.x = at(s.x);
      a.x_stride = stride;
      a.weight = w.get();
      a.gy = at(s.gy);
      a.gy_stride = stride;
      a.rstd = static_cast<const float*>(s.rstd.get());
      a.gx = at(s.out);
      a.gx_stride = stride;
      a.gw = gw.get();
      a.gw_mode = rmsnorm::GwMode::kStore;
      return rmsnorm::bench::backward_two_pass(a, temp.get(), stream);
    };
    CaseResult c = base;
    c.op = "vjp_two_pass";
    c.bytes = vjp_bytes;  // the same minimal bytes: the temporary's traffic is the waste being measured
    c.extra_bytes = static_cast<double>(temp_bytes);
    c.st = time_stream(stream, g_opt.reps, k, "backward_two_pass", two_pass);
    finish_case(c);
    cmp.two_pass_us = c.st.median;
    cmp.two_pass_gbps = c.gbps;
    cmp.speedup = cmp.two_pass_us / cmp.fused_us;
    if (sh.rows == 8192 && sh.cols == 4096 && sh.dtype == RMSNORM_DTYPE_F16) {
      Target t;
      t.has = true;
      t.label = "fused >= 1.4x faster than two-pass (8192x4096 f16)";
      t.metric = "speedup";
      t.value = 1.4;
      t.measured = cmp.speedup;
      t.pass = cmp.speedup >= 1.4;
      cmp.target = t;
    }
    std::printf("%-20s %-13s fused %.2f us (extra %.1f MiB) vs two-pass %.2f us (extra %.1f MiB): %.2fx%s\n",
                "fused vs two-pass", shape_label(sh.rows, sh.cols, sh.dtype).c_str(), cmp.fused_us,
                cmp.fused_extra_bytes / (1 << 20), cmp.two_pass_us, cmp.two_pass_extra_bytes / (1 << 20), cmp.speedup,
                cmp.target.has ? ("  " + cmp.target.label + ": " + verdict(cmp.target)).c_str() : "");
    g_comparisons.push_back(cmp);
  }
}

void run_decode(const DecodeShape& sh, cudaStream_t stream, const rmsnorm_backend_t& be) {
  const size_t esize = rmsnorm_dtype_size(sh.dtype);
  const size_t elems = static_cast<size_t>(sh.rows * sh.cols);
  rmsnorm_problem_t prob = rmsnorm_problem_default();
  prob.rows = sh.rows;
  prob.cols = sh.cols;
  prob.dtype = sh.dtype;
  prob.eps = kEps;
  // One operand set per captured call. These fit in L2, as a decode step's
  // activations (just written by the previous layer) do in practice.
  std::vector<OperandSet> sets(kGraphCalls);
  for (OperandSet& s : sets) {
    s.x = DeviceBuffer(elems * esize);
    s.gy = DeviceBuffer(elems * esize);
    s.out = DeviceBuffer(elems * esize);
    s.rstd = DeviceBuffer(static_cast<size_t>(sh.rows) * sizeof(float));
    fill_normal(s.x, sh.dtype, 0.0f, 1.0f, stream);
    fill_normal(s.gy, sh.dtype, 0.0f, 1.0f, stream);
  }
  DeviceBuffer w(static_cast<size_t>(sh.cols) * esize), gw(static_cast<size_t>(sh.cols) * esize);
  fill_normal(w, sh.dtype, 1.0f, 0.25f, stream);
  size_t ws_bytes = 0;
  check_status(rmsnorm_backward_workspace_size(&prob, RMSNORM_GW_STORE, &be, &ws_bytes), "rmsnorm_backward_workspace_size");
  DeviceBuffer ws(ws_bytes);
  // Eager calls first: the rstd the VJP reads, and any one-time setup in the
  // library (attributes, device queries) kept out of the capture.
  for (OperandSet& s : sets) {
    check_status(rmsnorm_forward(&prob, s.x.get(), sh.cols, w.get(), s.out.get(), sh.cols, static_cast<float*>(s.rstd.get()), &be),
                 "rmsnorm_forward");
    check_status(rmsnorm_backward(&prob, s.x.get(), sh.cols, w.get(), s.gy.get(), sh.cols, static_cast<const float*>(s.rstd.get()),
                                  s.out.get(), sh.cols, gw.get(), RMSNORM_GW_STORE, ws.get(), ws_bytes, &be),
                 "rmsnorm_backward");
  }
  RMSNORM_BENCH_CUDA(cudaStreamSynchronize(stream));

  const int replays = std::max(g_opt.reps, 50);
  // Default launches (programmatic dependent launch on sm_90), then plain
  // launches (RMSNORM_FLAG_NO_PDL) for comparison.
  rmsnorm_problem_t plain = prob;
  plain.flags |= RMSNORM_FLAG_NO_PDL;
  for (int k = 0; k < 4; ++k) {
    const int dir = k % 2;
    const bool pdl = k < 2;
    const rmsnorm_problem_t& pr = pdl ? prob : plain;
    CaseResult c;
    c.group = "decode";
    c.op = dir == 0 ? "decode_forward" : "decode_vjp";
    c.variant = pdl ? "aligned" : "aligned_no_pdl";
    c.rows = sh.rows;
    c.cols = sh.cols;
    c.dtype = dtype_name(sh.dtype);
    c.sets = kGraphCalls;
    c.graph = true;
    c.calls_per_graph = kGraphCalls;
    const size_t vec_bytes = static_cast<size_t>(sh.cols) * esize;
    c.bytes = static_cast<double>(dir == 0 ? 2 * elems * esize + vec_bytes : 3 * elems * esize + 2 * vec_bytes);
    if (dir == 1) c.extra_bytes = static_cast<double>(ws_bytes);
    c.st = time_graph(
        stream, replays, kGraphCalls,
        [&](int j) {
          const OperandSet& s = sets[static_cast<size_t>(j)];
          if (dir == 0) return rmsnorm_forward(&pr, s.x.get(), sh.cols, w.get(), s.out.get(), sh.cols, nullptr, &be);
          return rmsnorm_backward(&pr, s.x.get(), sh.cols, w.get(), s.gy.get(), sh.cols,
                                  static_cast<const float*>(s.rstd.get()), s.out.get(), sh.cols, gw.get(), RMSNORM_GW_STORE,
                                  ws.get(), ws_bytes, &be);
        },
        &c.error);
    if (pdl && sh.rows == 1 && sh.cols == 4096)
      c.targets.push_back(dir == 0 ? us_target("1x4096 fwd <= 3 us per graph call", 3.0, c.st.median)
                                   : us_target("1x4096 VJP <= 5 us per graph call", 5.0, c.st.median));
    if (!c.error.empty()) {
      print_case(c);
      g_cases.push_back(c);
      continue;
    }
    finish_case(c);
  }
}

// ---------------------------------------------------------------------------------------------
// Metadata
// ---------------------------------------------------------------------------------------------

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Current clocks as nvidia-smi reports them right after the runs (the CUDA
// runtime exposes only peak clocks); "unavailable" where there is none.
std::string smi_clocks(const std::string& pci) {
  const std::string cmd = "nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,"
                          "temperature.gpu --format=csv,noheader -i " + pci + " 2>/dev/null";
  std::FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "unavailable";
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (rc != 0 || out.empty()) return "unavailable";
  return "sm, mem, max sm, max mem, power, temp: " + out;
}

void fill_meta(int device) {
  cudaDeviceProp prop{};
  RMSNORM_BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  g_meta.gpu = prop.name;
  g_meta.sm_count = prop.multiProcessorCount;
  g_meta.cc_major = prop.major;
  g_meta.cc_minor = prop.minor;
  g_meta.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  g_meta.total_mem = prop.totalGlobalMem;
  char pci[32] = {0};
  RMSNORM_BENCH_CUDA(cudaDeviceGetPCIBusId(pci, sizeof pci, device));
  g_meta.pci_bus_id = pci;
  RMSNORM_BENCH_CUDA(cudaDeviceGetAttribute(&g_meta.sm_clock_khz, cudaDevAttrClockRate, device));
  RMSNORM_BENCH_CUDA(cudaDeviceGetAttribute(&g_meta.mem_clock_khz, cudaDevAttrMemoryClockRate, device));
  RMSNORM_BENCH_CUDA(cudaDeviceGetAttribute(&g_meta.bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  RMSNORM_BENCH_CUDA(cudaDriverGetVersion(&g_meta.driver));
  RMSNORM_BENCH_CUDA(cudaRuntimeGetVersion(&g_meta.runtime));
  g_meta.date_utc = utc_now();
  g_meta.commit = g_opt.commit;
  // Rotate at least ~3.3x L2 (200 MiB on a 60 MB L2), more on a larger L2.
  g_meta.rotation_bytes = std::max(200.0 * 1024 * 1024, 3.0 * static_cast<double>(g_meta.l2_bytes));
}

void print_targets_summary() {
  std::printf("\nTargets (../shared/BRIEF.md; reported, not asserted; \"(small)\": under 256 MiB of data, "
              "where the %% targets are not stated)\n");
  int pass = 0, miss = 0, miss_small = 0;
  auto line = [&](const std::string& what, const Target& t) {
    if (!t.has) return;
    (t.pass ? pass : miss) += 1;
    if (!t.pass && t.small) ++miss_small;
    std::printf("  %-5s %-52s %-28s measured %.3g\n", t.pass ? "PASS" : "MISS", t.label.c_str(),
                (what + (t.small ? " (small)" : "")).c_str(), t.measured);
  };
  for (const CaseResult& c : g_cases) {
    const std::string what = c.op + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " + c.dtype +
                             (c.variant == "aligned" ? "" : " " + c.variant);
    for (const Target& t : c.targets) line(what, t);
  }
  for (const Comparison& c : g_comparisons) line("fused/two-pass", c.target);
  std::printf("  %d PASS, %d MISS (%d of the MISSes on (small) data)\n", pass, miss, miss_small);
}

void usage() {
  std::printf(
      "rmsnorm_bench: RMSNorm forward / VJP / two-pass / decode timings against the copy ceiling\n"
      "  --reps N        timed calls per case (default 100; >= 50 for numbers you report)\n"
      "  --quick         20 reps, 5 copy reps, short warm-up, default shapes only (smoke run)\n"
      "  --shapes S      only shapes whose \"ROWSxCOLS dtype group\" contains S (e.g. 4096, bf16, extra)\n"
      "  --shape RxC:T[:offset]  time this shape instead of the list (e.g. 32768x4096:f16,\n"
      "                  8192x4096:bf16:offset for bases one element off; repeatable; no decode)\n"
      "  --no-extra      skip the extra large-data shapes\n"
      "  --json FILE     write every number and the run's metadata to FILE\n"
      "  --commit STR    commit recorded in the JSON (default: $RMSNORM_COMMIT, else \"unknown\")\n");
}

void parse(int argc, char** argv) {
  bool reps_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--reps") {
      g_opt.reps = std::atoi(value().c_str());
      reps_given = true;
      if (g_opt.reps < 1) die("--reps must be >= 1");
    } else if (a == "--quick") {
      g_opt.quick = true;
    } else if (a == "--json") {
      g_opt.json = value();
    } else if (a == "--shapes") {
      g_opt.shapes = value();
    } else if (a == "--shape") {
      g_opt.custom.push_back(value());
      parse_shape(g_opt.custom.back());  // a bad spec fails here, before any device work
    } else if (a == "--no-extra") {
      g_opt.extra = false;
    } else if (a == "--commit") {
      g_opt.commit = value();
    } else if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else {
      usage();
      die("unknown option " + a);
    }
  }
  if (g_opt.quick) {
    if (!reps_given) g_opt.reps = 20;
    g_opt.copy_reps = 5;
    g_opt.warm_ms = 5;
    g_opt.extra = false;
  }
  if (g_opt.commit.empty()) {
    const char* env = std::getenv("RMSNORM_COMMIT");
    g_opt.commit = env != nullptr && *env != '\0' ? env : "unknown";
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe (tee): a killed run still shows its last case.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  parse(argc, argv);
  if (rmsnorm_cuda_available() == 0) {
    std::printf("rmsnorm_bench: no CUDA device (or the library was built without CUDA); nothing to measure\n");
    g_meta.date_utc = utc_now();
    g_meta.commit = g_opt.commit;
    if (!g_opt.json.empty()) write_json("no CUDA device");
    return 0;
  }
  int device = 0;
  RMSNORM_BENCH_CUDA(cudaGetDevice(&device));
  fill_meta(device);
  cudaStream_t stream = nullptr;
  RMSNORM_BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const rmsnorm_backend_t be = rmsnorm_backend_cuda(-1, stream);

  std::printf("rmsnorm_bench  %s  %s  SMs %d  L2 %.0f MB  driver %d  runtime %d  commit %s\n", g_meta.gpu.c_str(),
              g_meta.pci_bus_id.c_str(), g_meta.sm_count, static_cast<double>(g_meta.l2_bytes) / 1e6, g_meta.driver,
              g_meta.runtime, g_meta.commit.c_str());
  std::printf("reps %d%s; operands rotated over >= %.0f MiB; random normal data; eps %g\n", g_opt.reps,
              g_opt.quick ? " (quick: not for reporting)" : "", g_meta.rotation_bytes / (1 << 20), static_cast<double>(kEps));

  g_meta.copy_st = measure_copy(stream, &g_meta.copy_gbps);
  std::printf("copy ceiling: D2D cudaMemcpyAsync 1 GiB, read+write, median of %d: %.1f us -> %.1f GB/s\n",
              g_meta.copy_st.reps, g_meta.copy_st.median, g_meta.copy_gbps);

  for (size_t mib : {size_t{64}, size_t{128}, size_t{256}, size_t{1024}}) {
    const double gbps = measure_kernel_copy(stream, mib << 20, false);
    const double mgbps = measure_kernel_copy(stream, mib << 20, true);
    g_meta.kernel_copy.emplace_back(static_cast<double>(mib << 20), gbps);
    g_meta.memcpy_by_size.emplace_back(static_cast<double>(mib << 20), mgbps);
    std::printf("copy of %zu MiB (diagnostic; %zu MiB moved): plain kernel %.1f GB/s = %.1f%%, cudaMemcpyAsync "
                "%.1f GB/s = %.1f%% of the ceiling\n",
                mib, 2 * mib, gbps, 100.0 * gbps / g_meta.copy_gbps, mgbps, 100.0 * mgbps / g_meta.copy_gbps);
  }

  print_header();
  if (!g_opt.custom.empty()) {
    for (const std::string& spec : g_opt.custom) run_shape(parse_shape(spec), stream, be);
  } else {
    for (const Shape& sh : kShapes)
      if (selected(sh.rows, sh.cols, sh.dtype, sh.group)) run_shape(sh, stream, be);
    for (const DecodeShape& sh : kDecode)
      if (selected(sh.rows, sh.cols, sh.dtype, "decode")) run_decode(sh, stream, be);
  }

  g_meta.copy_st_end = measure_copy(stream, &g_meta.copy_gbps_end);
  std::printf("\ncopy ceiling again at the end: %.1f GB/s (start %.1f GB/s, drift %+.1f%%)\n", g_meta.copy_gbps_end,
              g_meta.copy_gbps, 100.0 * (g_meta.copy_gbps_end / g_meta.copy_gbps - 1.0));
  g_meta.smi_clocks = smi_clocks(g_meta.pci_bus_id);
  std::printf("clocks after the runs (nvidia-smi): %s\n", g_meta.smi_clocks.c_str());
  print_targets_summary();
  if (!g_opt.json.empty()) write_json("");
  RMSNORM_BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}
