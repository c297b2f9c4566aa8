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
//   - every operand filled with random normals by the harness's counter-hash
//     generator (harness/random.hpp; never zeros: they can run faster and
//     hide unwritten outputs);
//   - k copies of the operands, k = ceil(max(200 MiB, 3 x L2) / forward
//     bytes), used round-robin so that no call finds its inputs in L2;
//   - warm-up (>= max(k, 8) calls and >= 30 ms), then each call bracketed by
//     its own pair of CUDA events; median, p10, p90 of >= 50 calls. The timed
//     calls are queued behind a short spin kernel, so the host (argument
//     checks, launches) runs ahead of the GPU and no event pair can contain
//     host time; a second batch, one event pair around all calls, gives the
//     back-to-back time per call ("b2b", gaps between kernels included);
//   - decode shapes: N = 20 calls captured in one CUDA graph, replayed; per
//     call = replay time / N (launch overhead is what decode pays); the
//     forward, the VJP and the fp8 quantized forward (static scale and
//     per-row scales, q one byte per element: bytes = x + q + w + scales);
//   - the library through its public C ABI on a non-blocking stream, the
//     workspace allocated once per shape outside timing;
//   - y and gx of the first and last row checked element by element against
//     the float64 reference with the tests' tolerances (harness/), reported
//     next to the times ("CHECK mismatch ..."), never fatal.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"
#include "harness/check.hpp"
#include "harness/cuda.hpp"
#include "harness/host_matrix.hpp"
#include "harness/json.hpp"
#include "harness/random.cuh"
#include "harness/stats.hpp"
#include "rmsnorm/rmsnorm.h"
#include "two_pass.hpp"

namespace {

using rmsnorm::harness::DeviceBuffer;
using rmsnorm::harness::dtype_name;
using rmsnorm::harness::HostMatrix;
using rmsnorm::harness::JsonWriter;

// ---------------------------------------------------------------------------------------------
// Options, results, failure
// ---------------------------------------------------------------------------------------------

constexpr float kEps = 1e-5f;

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
  bool no_pdl = false;  // --no-pdl: every library call with RMSNORM_FLAG_NO_PDL (a diagnostic A/B of PDL)
  bool quant = false;   // --quant: the quantized forwards of every shape too
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
// exits nonzero. A failed CUDA call throws (harness/cuda.hpp) and ends here
// through main.
[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "rmsnorm_bench: FATAL: %s\n", msg.c_str());
  std::fflush(stdout);
  if (!g_opt.json.empty()) write_json(msg);
  std::exit(1);
}

#define RMSNORM_BENCH_CUDA(call) RMSNORM_HARNESS_CUDA(call)

void check_status(rmsnorm_status_t st, const char* what) {
  if (st != RMSNORM_STATUS_SUCCESS)
    die(std::string(what) + " returned " + rmsnorm_status_string(st) + ": " + rmsnorm_last_error());
}

// ---------------------------------------------------------------------------------------------
// Random fill
// ---------------------------------------------------------------------------------------------

uint64_t g_seed = 0x5EED;

// mean + scale * N(0, 1) per element, never zero: the harness's generator
// (harness/random.hpp), run on the device; a fresh seed per buffer.
void fill_normal(const DeviceBuffer& b, rmsnorm_dtype_t dtype, float mean, float scale, cudaStream_t s) {
  RMSNORM_BENCH_CUDA(rmsnorm::harness::fill_normal_device(b.get(), b.bytes() / rmsnorm_dtype_size(dtype), dtype,
                                                          g_seed++, mean, scale, s));
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

Stats summarize(std::vector<double> us) {
  Stats s;
  s.reps = static_cast<int>(us.size());
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.median = rmsnorm::harness::quantile(us, 0.5);
  s.p10 = rmsnorm::harness::quantile(us, 0.1);
  s.p90 = rmsnorm::harness::quantile(us, 0.9);
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
// Host-side check of two rows (first and last of set 0) against the float64
// reference, every element, with the tests' tolerances (harness/): a kernel
// that is fast because it is wrong must not produce a PASS.
// ---------------------------------------------------------------------------------------------

// Rows 0 and rows - 1 (one row when rows == 1) of a device matrix.
HostMatrix download_rows(const void* base, int64_t rows, int64_t stride, int64_t cols, rmsnorm_dtype_t dtype) {
  const int64_t n = rows > 1 ? 2 : 1;
  HostMatrix m(dtype, n, cols);
  const size_t row_bytes = static_cast<size_t>(cols) * m.esize();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t row = k == 0 ? 0 : rows - 1;
    const auto* src = static_cast<const unsigned char*>(base) + static_cast<size_t>(row * stride) * m.esize();
    RMSNORM_BENCH_CUDA(cudaMemcpy(static_cast<unsigned char*>(m.data()) + k * row_bytes, src, row_bytes,
                                  cudaMemcpyDeviceToHost));
  }
  return m;
}

// out is y (forward) or gx (backward, gy given). "ok", or the worst element.
std::string check_rows(bool backward, int64_t rows, int64_t cols, rmsnorm_dtype_t dtype, float eps, const void* x,
                       const void* gy, const void* w, const void* out, int64_t stride) {
  const HostMatrix xr = download_rows(x, rows, stride, cols, dtype), outr = download_rows(out, rows, stride, cols, dtype);
  const HostMatrix wr = download_rows(w, 1, cols, cols, dtype);
  const HostMatrix gyr = backward ? download_rows(gy, rows, stride, cols, dtype) : HostMatrix();
  rmsnorm::harness::Outputs o;
  if (backward) o.gx.push_back({"gx", &outr});
  else o.y = &outr;
  rmsnorm::reference::Options opt;
  opt.eps = static_cast<double>(eps);
  const rmsnorm::harness::CheckResult r =
      rmsnorm::harness::check_against_reference(xr, &wr, backward ? &gyr : nullptr, opt, o).front();
  if (r.worst.passed()) return "ok";
  rmsnorm::harness::Worst worst = r.worst;
  if (worst.row == 1) worst.row = rows - 1;
  return "mismatch: " + worst.describe(r.name, false, " (rows 0 and " + std::to_string(rows - 1) + ")");
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

void json_stats(JsonWriter& j, const Stats& s) {
  j.begin_object(true).field("reps", s.reps).field("median_us", s.median).field("p10_us", s.p10);
  j.field("p90_us", s.p90).field("min_us", s.min).field("mean_us", s.mean).field("b2b_us", s.b2b);
  j.field("host_us_per_call", s.host_us).field("host_bound", s.host_bound).end_object();
}

void json_target(JsonWriter& j, const Target& t) {
  if (!t.has) {
    j.null();
    return;
  }
  j.begin_object(true).field("label", t.label).field("metric", t.metric).field("op", t.at_most ? "<=" : ">=");
  j.field("value", t.value).field("measured", t.measured).field("pass", t.pass).field("small", t.small);
  j.field("verdict", verdict(t)).end_object();
}

void json_copies(JsonWriter& j, const char* name, const std::vector<std::pair<double, double>>& v) {
  j.key(name).begin_array(true);
  for (const auto& [bytes, gbps] : v) j.begin_object().field("bytes_copied", bytes).field("gbps", gbps).end_object();
  j.end_array();
}

void write_json(const std::string& fatal_error) {
  const Meta& m = g_meta;
  JsonWriter j;
  j.begin_object();
  j.field("tool", "rmsnorm_bench");
  j.field("library_version", std::to_string(RMSNORM_VERSION_MAJOR) + "." + std::to_string(RMSNORM_VERSION_MINOR) +
                                 "." + std::to_string(RMSNORM_VERSION_PATCH));
  j.field("date_utc", m.date_utc).field("commit", m.commit);
  j.key("gpu").begin_object(true).field("name", m.gpu).field("pci_bus_id", m.pci_bus_id).field("sm_count", m.sm_count);
  j.field("compute_capability", std::to_string(m.cc_major) + "." + std::to_string(m.cc_minor));
  j.field("l2_bytes", static_cast<double>(m.l2_bytes)).field("memory_bytes", static_cast<double>(m.total_mem));
  j.field("max_sm_clock_khz", m.sm_clock_khz).field("max_mem_clock_khz", m.mem_clock_khz);
  j.field("bus_width_bits", m.bus_width_bits).field("nvidia_smi_clocks", m.smi_clocks).end_object();
  j.field("driver_version", m.driver).field("runtime_version", m.runtime);
  j.key("method").begin_object(true);
  j.field("timing",
          "CUDA events around each call, queued behind a spin kernel, after warm-up; median/p10/p90; b2b = one event "
          "pair around all calls");
  j.field("reps", g_opt.reps).field("quick", g_opt.quick).field("rotation_min_bytes", m.rotation_bytes);
  j.field("no_pdl", g_opt.no_pdl);
  j.field("fill", "random normal (harness counter hash, Box-Muller), w ~ N(1, 0.25)").field("eps", kEps);
  j.field("decode", "20 calls per CUDA graph, per call = replay / 20");
  j.field("bytes", "forward 2*rows*D*esize + D*esize; vjp 3*rows*D*esize + 2*D*esize");
  j.field("check", "rows 0 and rows-1 of set 0 against the float64 reference, every element, tests' tolerances");
  j.field("small_rule_bytes", kTargetDataBytes).end_object();
  j.key("copy").begin_object(true).field("bytes_per_copy", 2.0 * (1 << 30)).field("gbps", m.copy_gbps);
  j.key("stats");
  json_stats(j, m.copy_st);
  j.field("gbps_end", m.copy_gbps_end).key("stats_end");
  json_stats(j, m.copy_st_end);
  j.end_object();
  json_copies(j, "kernel_copy", m.kernel_copy);
  json_copies(j, "memcpy_by_size", m.memcpy_by_size);
  j.key("cases").begin_array();
  for (const CaseResult& c : g_cases) {
    j.begin_object(true).field("group", c.group).field("op", c.op).field("variant", c.variant);
    j.field("rows", c.rows).field("cols", c.cols).field("dtype", c.dtype).field("bytes", c.bytes);
    j.field("sets", c.sets).field("graph", c.graph).field("calls_per_graph", c.calls_per_graph);
    j.field("us", c.st.median).key("stats");
    json_stats(j, c.st);
    j.field("gbps", c.gbps).field("pct_copy", c.pct).field("extra_device_bytes", c.extra_bytes);
    j.field("vs_aligned", c.vs_aligned > 0 ? c.vs_aligned : std::nan("")).field("vs_aligned_case", c.vs_aligned_case);
    j.field("check", c.check).field("error", c.error).key("targets").begin_array();
    for (const Target& t : c.targets) json_target(j, t);
    j.end_array().end_object();
  }
  j.end_array();
  j.key("fused_vs_two_pass").begin_array();
  for (const Comparison& c : g_comparisons) {
    j.begin_object(true).field("rows", c.rows).field("cols", c.cols).field("dtype", c.dtype);
    j.field("fused_us", c.fused_us).field("two_pass_us", c.two_pass_us).field("speedup", c.speedup);
    j.field("fused_gbps", c.fused_gbps).field("two_pass_gbps", c.two_pass_gbps);
    j.field("fused_extra_device_bytes", c.fused_extra_bytes).field("two_pass_extra_device_bytes", c.two_pass_extra_bytes);
    j.field("error", c.error).key("target");
    json_target(j, c.target);
    j.end_object();
  }
  j.end_array();
  if (fatal_error.empty()) j.null_field("fatal_error");
  else j.field("fatal_error", fatal_error);
  j.end_object();
  const std::string err = rmsnorm::harness::write_text_file(g_opt.json, j.str());
  if (!err.empty()) {
    std::fprintf(stderr, "rmsnorm_bench: %s\n", err.c_str());
    return;
  }
  std::printf("\nwrote %s\n", g_opt.json.c_str());
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

struct Shape {
  int64_t rows, cols;
  rmsnorm_dtype_t dtype;
  const char* group;
  int64_t offset_elems;  // base of x, y, gy, gx moved by this many elements (misaligned)
  bool two_pass;         // also time the two-pass backward here
  int64_t pad_elems = 0;  // rows this many elements apart beyond D (a column slice of a wider tensor): misaligned rows
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
    {8192, 4096, RMSNORM_DTYPE_BF16, "slow_path", 0, false, 1},
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

// --shape ROWSxCOLS:DTYPE[:offset|:padded] (e.g. 32768x4096:f16, 8192x4096:bf16:offset): a case of group "custom",
// aligned, with every operand's base moved by one element, or with rows COLS + 1 elements apart (an odd COLS gives
// misaligned rows in every layout).
Shape parse_shape(const std::string& spec) {
  long long r = 0, c = 0;
  char dt[8] = {}, layout[16] = {};
  const int n = std::sscanf(spec.c_str(), "%lldx%lld:%7[a-z0-9]:%15s", &r, &c, dt, layout);
  if (n < 3 || r < 1 || c < 1)
    die("--shape: expected ROWSxCOLS:DTYPE[:offset|:padded] (DTYPE f32, f16 or bf16), got '" + spec + "'");
  const std::string d = dt, l = n == 4 ? layout : "";
  if (d != "f32" && d != "f16" && d != "bf16") die("--shape: unknown dtype in '" + spec + "'");
  if (!l.empty() && l != "offset" && l != "padded") die("--shape: unknown layout '" + l + "' (offset or padded)");
  const rmsnorm_dtype_t dtype = d == "f32" ? RMSNORM_DTYPE_F32 : d == "f16" ? RMSNORM_DTYPE_F16 : RMSNORM_DTYPE_BF16;
  return Shape{r, c, dtype, "custom", l == "offset" ? 1 : 0, false, l == "padded" ? 1 : 0};
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
    // Next to the aligned case of the same op: base+1elem and stride+1elem against 8192x4096, 8192x4095
    // against 8192x4096 (cols rounded up to a 16-byte multiple).
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

// The scale and row-scale buffers of the quantized forwards' cases, and their rmsnorm_quant_t: a static scale of
// 0.05 (read from device memory, as the library reads it), or per-row scales written to `row_scales`.
struct QuantBuffers {
  DeviceBuffer scale, row_scales;
  explicit QuantBuffers(int64_t rows) : scale(sizeof(float)), row_scales(static_cast<size_t>(rows) * sizeof(float)) {
    const float scale_value = 0.05f;
    RMSNORM_BENCH_CUDA(cudaMemcpy(scale.get(), &scale_value, sizeof(float), cudaMemcpyHostToDevice));
    // A copy from pageable memory may return before the value lands; the timed calls run on another stream.
    RMSNORM_BENCH_CUDA(cudaDeviceSynchronize());
  }
  rmsnorm_quant_t quant(rmsnorm_quant_kind_t kind, bool per_row) const {
    rmsnorm_quant_t qt{};
    qt.kind = kind;
    qt.scale_mode = per_row ? RMSNORM_QUANT_PER_ROW : RMSNORM_QUANT_STATIC;
    qt.scale = per_row ? nullptr : static_cast<const float*>(scale.get());
    qt.row_scales = per_row ? static_cast<float*>(row_scales.get()) : nullptr;
    return qt;
  }
};

void run_shape(const Shape& sh, cudaStream_t stream, const rmsnorm_backend_t& be) {
  const size_t esize = rmsnorm_dtype_size(sh.dtype);
  const int64_t stride = sh.cols + sh.pad_elems;
  const size_t elems = static_cast<size_t>(sh.rows) * static_cast<size_t>(stride) + static_cast<size_t>(sh.offset_elems);
  const double fwd_bytes = static_cast<double>(2 * sh.rows * sh.cols * static_cast<int64_t>(esize) + sh.cols * static_cast<int64_t>(esize));
  const double vjp_bytes =
      static_cast<double>(3 * sh.rows * sh.cols * static_cast<int64_t>(esize) + 2 * sh.cols * static_cast<int64_t>(esize));

  rmsnorm_problem_t prob = rmsnorm_problem_default();
  prob.rows = sh.rows;
  prob.cols = sh.cols;
  prob.dtype = sh.dtype;
  prob.eps = kEps;
  if (g_opt.no_pdl) prob.flags |= RMSNORM_FLAG_NO_PDL;

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
  // base+Nelem: every row start off 16 bytes; stride+Nelem: rows D + N elements apart; unaligned_rows: the rows
  // contiguous, the first aligned and the others not (D * esize not a multiple of 16).
  const std::string variant = sh.offset_elems != 0  ? "base+" + std::to_string(sh.offset_elems) + "elem"
                              : sh.pad_elems != 0 ? "stride+" + std::to_string(sh.pad_elems) + "elem"
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
  // The quantized forwards (--quant): x read from the rotated sets, q (1 byte an element) and the per-row scales
  // written into the same set's out and rstd buffers, so that every operand rotates as the plain forward's do.
  // Their correctness is the tests' (Cuda.ForwardQuant and the rest); timing only here.
  if (g_opt.quant) {
    const QuantBuffers qb(sh.rows);
    struct QuantCase {
      const char* op;
      rmsnorm_quant_kind_t kind;
      bool per_row;
    };
    const QuantCase kinds[] = {{"forward_fp8_per_row", RMSNORM_QUANT_FP8_E4M3, true},
                               {"forward_fp8_static", RMSNORM_QUANT_FP8_E4M3, false},
                               {"forward_int8_per_row", RMSNORM_QUANT_INT8, true}};
    for (const QuantCase& qc : kinds) {
      const rmsnorm_quant_t qt = qb.quant(qc.kind, qc.per_row);
      CaseResult c = base;
      c.op = qc.op;
      // x and w read, q and the scales written.
      const int64_t scale_bytes = (qc.per_row ? sh.rows : 1) * static_cast<int64_t>(sizeof(float));
      c.bytes = static_cast<double>(sh.rows * sh.cols * static_cast<int64_t>(esize + 1) +
                                    sh.cols * static_cast<int64_t>(esize) + scale_bytes);
      c.st = time_stream(stream, g_opt.reps, k, qc.op, [&](int i) {
        const OperandSet& s = sets[static_cast<size_t>(i)];
        rmsnorm_quant_t qs = qt;
        if (qc.per_row) qs.row_scales = static_cast<float*>(s.rstd.get());
        return rmsnorm_forward_quant(&prob, at(s.x), stride, w.get(), &qs, s.out.get(), stride, nullptr, &be);
      });
      finish_case(c);
    }
    // 1 x 128 block scales (rmsnorm_forward_block_quant), row-major, each set its own scales matrix (rows x
    // ceil(D / 128) floats: 1/64 of x's bytes at 16-bit, allocated here, outside the memory estimate above).
    const int64_t blocks = (sh.cols + 127) / 128;
    std::vector<DeviceBuffer> block_scales;
    for (int i = 0; i < k; ++i) block_scales.emplace_back(static_cast<size_t>(sh.rows * blocks) * sizeof(float));
    const QuantCase block_kinds[] = {{"forward_fp8_block128", RMSNORM_QUANT_FP8_E4M3, true},
                                     {"forward_int8_block128", RMSNORM_QUANT_INT8, true}};
    for (const QuantCase& qc : block_kinds) {
      CaseResult c = base;
      c.op = qc.op;
      c.bytes = static_cast<double>(sh.rows * sh.cols * static_cast<int64_t>(esize + 1) +
                                    sh.cols * static_cast<int64_t>(esize) +
                                    sh.rows * blocks * static_cast<int64_t>(sizeof(float)));
      c.st = time_stream(stream, g_opt.reps, k, qc.op, [&](int i) {
        const OperandSet& s = sets[static_cast<size_t>(i)];
        const rmsnorm_block_quant_t bq{qc.kind, 128, static_cast<float*>(block_scales[static_cast<size_t>(i)].get()),
                                       blocks, 1, nullptr};
        return rmsnorm_forward_block_quant(&prob, at(s.x), stride, w.get(), &bq, s.out.get(), stride, nullptr, &be);
      });
      finish_case(c);
    }
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
  if (g_opt.no_pdl) prob.flags |= RMSNORM_FLAG_NO_PDL;  // the untimed set-up calls too
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
  // A decode case: per call in a graph of kGraphCalls calls.
  auto decode_case = [&](const char* op, bool pdl) {
    CaseResult c;
    c.group = "decode";
    c.op = op;
    c.variant = pdl ? "aligned" : "aligned_no_pdl";
    c.rows = sh.rows;
    c.cols = sh.cols;
    c.dtype = dtype_name(sh.dtype);
    c.sets = kGraphCalls;
    c.graph = true;
    c.calls_per_graph = kGraphCalls;
    return c;
  };
  // A timed case is printed with its error where the graph could not run, else finished.
  auto record = [&](CaseResult& c) {
    if (!c.error.empty()) {
      print_case(c);
      g_cases.push_back(c);
      return;
    }
    finish_case(c);
  };
  for (int k = 0; k < 4; ++k) {
    const int dir = k % 2;
    const bool pdl = k < 2;
    if (pdl && g_opt.no_pdl) continue;  // --no-pdl: the plain launches only
    const rmsnorm_problem_t& pr = pdl ? prob : plain;
    CaseResult c = decode_case(dir == 0 ? "decode_forward" : "decode_vjp", pdl);
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
    record(c);
  }

  // The quantized forward at decode: fp8 e4m3 with a static scale (its
  // reciprocal is read from device memory, a second DRAM round trip the x
  // loads need not wait for) and with per-row scales. Graph replays as above.
  DeviceBuffer q(elems);
  const QuantBuffers qb(sh.rows);
  for (int k = 0; k < 4; ++k) {
    const bool pdl = k < 2;
    const bool per_row = k % 2 == 1;
    if (pdl && g_opt.no_pdl) continue;
    const rmsnorm_problem_t& pr = pdl ? prob : plain;
    const rmsnorm_quant_t qt = qb.quant(RMSNORM_QUANT_FP8_E4M3, per_row);
    check_status(rmsnorm_forward_quant(&pr, sets[0].x.get(), sh.cols, w.get(), &qt, q.get(), sh.cols, nullptr, &be),
                 "rmsnorm_forward_quant");
    RMSNORM_BENCH_CUDA(cudaStreamSynchronize(stream));
    CaseResult c = decode_case(per_row ? "decode_forward_fp8_per_row" : "decode_forward_fp8_static", pdl);
    c.bytes = static_cast<double>(elems * esize + elems + static_cast<size_t>(sh.cols) * esize +
                                  (per_row ? static_cast<size_t>(sh.rows) * sizeof(float) : sizeof(float)));
    c.st = time_graph(
        stream, replays, kGraphCalls,
        [&](int j) {
          const OperandSet& s = sets[static_cast<size_t>(j)];
          return rmsnorm_forward_quant(&pr, s.x.get(), sh.cols, w.get(), &qt, q.get(), sh.cols, nullptr, &be);
        },
        &c.error);
    record(c);
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
      "  --shape RxC:T[:offset|:padded]  time this shape instead of the list (e.g. 32768x4096:f16,\n"
      "                  8192x4096:bf16:offset for bases one element off, :padded for rows C + 1 elements\n"
      "                  apart; repeatable; no decode)\n"
      "  --no-extra      skip the extra large-data shapes\n"
      "  --no-pdl        launch every call with RMSNORM_FLAG_NO_PDL (diagnostic: a run to set against the default)\n"
      "  --quant         also time each shape's quantized forwards (fp8 per row, fp8 static, int8 per row,\n"
      "                  fp8 and int8 with 1 x 128 block scales)\n"
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
    } else if (a == "--no-pdl") {
      g_opt.no_pdl = true;
    } else if (a == "--quant") {
      g_opt.quant = true;
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

int run(int argc, char** argv) {
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
  std::printf("reps %d%s%s; operands rotated over >= %.0f MiB; random normal data; eps %g\n", g_opt.reps,
              g_opt.quick ? " (quick: not for reporting)" : "",
              g_opt.no_pdl ? " (--no-pdl: every call without PDL; a diagnostic, not for reporting)" : "",
              g_meta.rotation_bytes / (1 << 20), static_cast<double>(kEps));

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

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe (tee): a killed run still shows its last case.
  setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a failed CUDA call or allocation
    die(e.what());
  }
}
