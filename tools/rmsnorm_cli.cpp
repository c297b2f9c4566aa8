// rmsnorm: the classic measurement of RMSNorm forward and backward.
//
// With no arguments: x and the cotangent gy of 8192 x 4096 f16, w of 4096,
// eps 1e-5, random inputs (never zeros; rows scaled by 2^-4 .. 2^4 so that a
// row normalized with a neighbour's statistics cannot pass).
//   1. Correctness guard: y, and gx and gw of L = sum(rms_norm(x, w) * gy),
//      from the library against the float64 reference (reference/), every
//      element, with tolerances of the same form as the tests
//      (tests/test_util.hpp). A failure prints the worst element and exits 1.
//   2. Median times after warm-up: forward, grad (forward with rstd +
//      backward) and VJP (backward with rstd given), with effective GB/s over
//      the minimal bytes:
//        forward: read x, write y, read w          = 2 n D + D elements
//        VJP:     read x, gy, write gx; w, gw       = 3 n D + 2 D elements
//        grad:    the sum of both                   = 5 n D + 3 D elements
//      On CUDA also the device-to-device copy (the bandwidth ceiling, read +
//      write) and the two-pass backward (src/cuda/two_pass.hpp), the design
//      the fused backward replaces, as a grad call and as a VJP, with the
//      extra memory each needs.
//
// GPU timing: one stream, a CUDA event before and after every call, the
// median over the calls. Input sets are rotated so that the data touched
// between two uses of one set exceeds the L2 (60 MB on the H200), else the
// numbers would measure L2, not HBM.
//
// The CLI may exit on an error (the library never does): every CUDA call and
// every library status is checked, printed and turned into exit code 1.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/half.hpp"
#include "rmsnorm/rmsnorm.h"
#include "rmsnorm_reference.hpp"

#if defined(RMSNORM_WITH_CUDA)
#include <cuda_runtime.h>

#include "args.hpp"
#include "two_pass.hpp"
#endif

namespace {

// ---- errors -----------------------------------------------------------------------------------

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "rmsnorm: error: %s\n", msg.c_str());
  std::exit(1);
}

void lib_check(rmsnorm_status_t s, const char* what) {
  if (s != RMSNORM_STATUS_SUCCESS)
    die(std::string(what) + " failed: " + rmsnorm_status_string(s) + ": " + rmsnorm_last_error());
}

#if defined(RMSNORM_WITH_CUDA)
void cuda_check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess)
    die(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + expr + ": " + cudaGetErrorName(e) +
        " (" + cudaGetErrorString(e) + ")");
}
#define CUDA_CHECK(expr) cuda_check((expr), #expr, __FILE__, __LINE__)
#endif

// ---- progress on stderr for steps that take a while ---------------------------------------------

// Says what is running only when a step passes 2 s, so that short runs stay quiet.
class Progress {
 public:
  explicit Progress(std::string what)
      : what_(std::move(what)), start_(std::chrono::steady_clock::now()), waiter_([this] { wait(); }) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() {
    {
      std::lock_guard<std::mutex> lk(m_);
      done_ = true;
    }
    cv_.notify_all();
    waiter_.join();
    if (printed_) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      std::fprintf(stderr, "  %s: done in %.1f s\n", what_.c_str(), s);
    }
  }

 private:
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    if (!cv_.wait_for(lk, std::chrono::seconds(2), [this] { return done_; })) {
      std::fprintf(stderr, "  %s...\n", what_.c_str());
      printed_ = true;
    }
  }
  std::string what_;
  std::chrono::steady_clock::time_point start_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  bool printed_ = false;
  std::thread waiter_;  // last: starts after everything it reads exists
};

// ---- options --------------------------------------------------------------------------------------

struct Config {
  int64_t rows = 8192;
  int64_t cols = 4096;
  int32_t dtype = RMSNORM_DTYPE_F16;
  std::string backend = "auto";
  int reps = -1;  // -1: 100 on the GPU, 5 on the CPU
  float eps = 1e-5f;
  int threads = 0;
  uint64_t seed = 20240611;
  std::string json;
};

const char* kUsage =
    "usage: rmsnorm [options]\n"
    "\n"
    "Checks RMSNorm forward/backward against a float64 reference, then times them.\n"
    "Default: 8192 x 4096 f16, eps 1e-5, on the GPU when one is usable, else on the CPU.\n"
    "\n"
    "  --rows N            rows (default 8192)\n"
    "  --cols N            columns, D (default 4096)\n"
    "  --dtype T           f32 | f16 | bf16 (default f16)\n"
    "  --backend B         auto | cpu | cuda (default auto: cuda when available)\n"
    "  --reps N            timed repetitions per measurement (default 100 on GPU, 5 on CPU)\n"
    "  --eps E             epsilon, finite and >= 0 (default 1e-5)\n"
    "  --threads N         CPU backend threads, 0 = all (default 0)\n"
    "  --seed N            random seed (default 20240611)\n"
    "  --json FILE         also write every result as JSON\n"
    "  --help              this text\n"
    "\n"
    "Exit status: 0 on success, 1 when the check fails or an error occurs, 2 on bad usage.\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "rmsnorm: %s\n(see rmsnorm --help)\n", msg.c_str());
  std::exit(2);
}

int64_t parse_int(const std::string& opt, const std::string& v, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi)
    usage_error(opt + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v +
                "'");
  return x;
}

Config parse_args(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], v;
    const size_t eq = a.find('=');
    const bool inline_value = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      v = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return v;
      if (i + 1 >= argc) usage_error(a + ": missing value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--rows") {
      c.rows = parse_int(a, value(), 1, int64_t{1} << 40);
    } else if (a == "--cols") {
      c.cols = parse_int(a, value(), 1, int64_t{1} << 30);
    } else if (a == "--dtype") {
      const std::string d = value();
      if (d == "f32") c.dtype = RMSNORM_DTYPE_F32;
      else if (d == "f16") c.dtype = RMSNORM_DTYPE_F16;
      else if (d == "bf16") c.dtype = RMSNORM_DTYPE_BF16;
      else usage_error("--dtype: expected f32, f16 or bf16, got '" + d + "'");
    } else if (a == "--backend") {
      c.backend = value();
      if (c.backend != "auto" && c.backend != "cpu" && c.backend != "cuda")
        usage_error("--backend: expected auto, cpu or cuda, got '" + c.backend + "'");
    } else if (a == "--reps") {
      c.reps = static_cast<int>(parse_int(a, value(), 1, 1000000));
    } else if (a == "--eps") {
      const std::string e = value();
      char* end = nullptr;
      const float f = std::strtof(e.c_str(), &end);
      if (e.empty() || *end != '\0' || !std::isfinite(f) || f < 0.0f)
        usage_error("--eps: expected a finite number >= 0, got '" + e + "'");
      c.eps = f;
    } else if (a == "--threads") {
      c.threads = static_cast<int>(parse_int(a, value(), 0, 4096));
    } else if (a == "--seed") {
      c.seed = static_cast<uint64_t>(parse_int(a, value(), 0, INT64_MAX));
    } else if (a == "--json") {
      c.json = value();
      if (c.json.empty()) usage_error("--json: empty file name");
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  const double bytes = static_cast<double>(c.rows) * static_cast<double>(c.cols) * (c.dtype == RMSNORM_DTYPE_F32 ? 4 : 2);
  if (bytes > 64.0 * (1ull << 30)) usage_error("rows x cols is too large (over 64 GiB per tensor)");
  return c;
}

const char* dtype_name(int32_t dt) {
  return dt == RMSNORM_DTYPE_F32 ? "f32" : dt == RMSNORM_DTYPE_F16 ? "f16" : "bf16";
}

// ---- host tensors -----------------------------------------------------------------------------------

// Contiguous elements of one dtype, read and written as float.
struct HostTensor {
  int32_t dtype = RMSNORM_DTYPE_F32;
  size_t n = 0;
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(int32_t dt, size_t count) : dtype(dt), n(count), bytes(count * rmsnorm_dtype_size(dt)) {}
  size_t esize() const { return rmsnorm_dtype_size(dtype); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  double get(size_t i) const {
    if (dtype == RMSNORM_DTYPE_F32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return dtype == RMSNORM_DTYPE_F16 ? rmsnorm::half_to_float(h) : rmsnorm::bf16_to_float(h);
  }
  void set(size_t i, float v) {
    if (dtype == RMSNORM_DTYPE_F32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      return;
    }
    const uint16_t h = dtype == RMSNORM_DTYPE_F16 ? rmsnorm::float_to_half(v) : rmsnorm::float_to_bf16(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  // 0xFF bytes are NaN in every dtype: an element the library fails to write shows.
  void poison() { std::fill(bytes.begin(), bytes.end(), static_cast<unsigned char>(0xFF)); }
};

int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Runs f(begin, end) over [0, n) split into contiguous ranges, one per thread.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(hardware_threads(), n));
  std::vector<std::thread> pool;
  for (int64_t k = 0; k < t; ++k) pool.emplace_back([&, k] { f(n * k / t, n * (k + 1) / t); });
  for (auto& th : pool) th.join();
}

// splitmix64: each row has its own stream, so the data do not depend on the
// number of threads that generate it.
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double uniform01(uint64_t& s) { return (static_cast<double>(splitmix(s) >> 11) + 0.5) * 0x1.0p-53; }
double normal(uint64_t& s) {
  const double u1 = uniform01(s);  // two statements: the order of draws must not depend on the compiler
  const double u2 = uniform01(s);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// N(0,1) * scale(row) rounded to the dtype; a value that would round to zero
// becomes 0.5 * scale.
void fill_random(HostTensor& t, int64_t rows, int64_t cols, uint64_t seed, double (*scale)(int64_t)) {
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint64_t s = seed * 0x100000001B3ull + static_cast<uint64_t>(r);
      const double k = scale(r);
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        t.set(i, static_cast<float>(normal(s) * k));
        if (t.get(i) == 0.0) t.set(i, static_cast<float>(0.5 * k));
      }
    }
  });
}

double row_scale(int64_t r) { return std::ldexp(1.0, static_cast<int>((r * 5) % 9) - 4); }
double unit_scale(int64_t) { return 1.0; }

// ---- tolerances (same form as tests/test_util.hpp) -----------------------------------------------

int mantissa_bits(int32_t dt) { return dt == RMSNORM_DTYPE_F32 ? 23 : dt == RMSNORM_DTYPE_F16 ? 10 : 7; }

// Spacing of dtype's numbers at |v|.
double ulp(int32_t dt, double v) {
  const int min_exp = dt == RMSNORM_DTYPE_F16 ? -14 : -126;
  const double a = std::fabs(v);
  int e = a > 0 ? static_cast<int>(std::floor(std::log2(a))) : min_exp;
  e = std::max(e, min_exp);
  return std::ldexp(1.0, e - mantissa_bits(dt));
}

// Relative error of an fp32 sum of n terms: a few units of 2^-24 plus a term
// that grows like sqrt(n) (rounding errors of random sign).
double acc_rel(int64_t n) { return std::ldexp(8.0 + 4.0 * std::sqrt(static_cast<double>(n)), -24); }

// Worst element of one compared output.
struct Check {
  std::string name;
  bool vector = false;  // gw: one row, report the column only
  int64_t count = 0, bad = 0, row = -1, col = -1;
  double ratio = -1.0, got = 0.0, expected = 0.0, tol = 0.0;

  void add(int64_t r, int64_t c, double g, double e, double t) {
    ++count;
    double q = std::isfinite(g) ? (t > 0 ? std::fabs(g - e) / t : (g == e ? 0.0 : INFINITY)) : INFINITY;
    if (std::isnan(q)) q = INFINITY;
    if (!(q <= 1.0)) ++bad;
    if (row < 0 || q > ratio) {
      ratio = q;
      row = r;
      col = c;
      got = g;
      expected = e;
      tol = t;
    }
  }
  void merge(const Check& o) {
    count += o.count;
    bad += o.bad;
    if (o.row >= 0 && (row < 0 || o.ratio > ratio || (o.ratio == ratio && o.row < row))) {
      ratio = o.ratio;
      row = o.row;
      col = o.col;
      got = o.got;
      expected = o.expected;
      tol = o.tol;
    }
  }
  bool passed() const { return bad == 0; }
  void print_failure() const {
    const std::string where =
        vector ? "col " + std::to_string(col) : "row " + std::to_string(row) + " col " + std::to_string(col);
    std::fprintf(stderr,
                 "rmsnorm: CHECK FAILED: %s: %" PRId64 " of %" PRId64
                 " elements out of tolerance; worst at %s: got %.9g expected %.9g tol %.3g (err/tol %.3g)\n",
                 name.c_str(), bad, count, where.c_str(), got, expected, tol, ratio);
  }
};

// Library outputs to check against the reference. Rows of y and gx are
// matrices; gw entries are vectors of cols with their own tolerance form.
struct Outputs {
  const HostTensor* y = nullptr;
  std::vector<std::pair<std::string, const HostTensor*>> gx;  // name, values
  struct Gw {
    std::string name;
    const HostTensor* values;
    int32_t dtype;      // the dtype gw was stored in
    double term_round;  // relative rounding of each row's term before the sum (two-pass temp), else 0
  };
  std::vector<Gw> gw;
};

// Compares every element of y, gx and gw with the float64 reference, in row
// chunks (the reference of 8192 x 4096 in one piece would take > 1 GB).
std::vector<Check> check_against_reference(const HostTensor& x, const HostTensor& w, const HostTensor& gy, int64_t rows,
                                           int64_t cols, float eps, const Outputs& out) {
  const int32_t dt = x.dtype;
  std::vector<double> wd(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) wd[c] = w.get(static_cast<size_t>(c));
  rmsnorm::reference::Options opt;
  opt.eps = static_cast<double>(eps);

  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 16) / cols);
  const int64_t chunks = (rows + chunk - 1) / chunk;
  const int nthreads = static_cast<int>(std::min<int64_t>(hardware_threads(), chunks));
  const size_t ngx = out.gx.size();
  struct Partial {
    Check y;
    std::vector<Check> gx;
    std::vector<double> gw, gw_scale;
  };
  std::vector<Partial> parts(static_cast<size_t>(nthreads));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < nthreads; ++t) {
    pool.emplace_back([&, t] {
      Partial& p = parts[static_cast<size_t>(t)];
      p.gx.resize(ngx);
      p.gw.assign(static_cast<size_t>(cols), 0.0);
      p.gw_scale.assign(static_cast<size_t>(cols), 0.0);
      const size_t cap = static_cast<size_t>(chunk * cols);
      std::vector<double> xd(cap), gyd(cap), yr(cap), gxr(cap), gxs(cap), rr(static_cast<size_t>(chunk));
      std::vector<double> gwc(static_cast<size_t>(cols)), gwsc(static_cast<size_t>(cols));
      for (int64_t k = next++; k < chunks; k = next++) {
        const int64_t r0 = k * chunk, n = std::min(chunk, rows - r0);
        const size_t base = static_cast<size_t>(r0 * cols);
        for (size_t i = 0; i < static_cast<size_t>(n * cols); ++i) {
          xd[i] = x.get(base + i);
          gyd[i] = gy.get(base + i);
        }
        rmsnorm::reference::forward(n, cols, xd.data(), wd.data(), opt, yr.data(), rr.data(), nullptr);
        rmsnorm::reference::backward(n, cols, xd.data(), wd.data(), gyd.data(), opt, gxr.data(), gwc.data(),
                                     gxs.data(), gwsc.data());
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const size_t i = static_cast<size_t>(r * cols + c);
            if (out.y != nullptr) {
              const double e = yr[i];
              p.y.add(r0 + r, c, out.y->get(base + i), e, ulp(dt, e) + std::fabs(e) * acc_rel(cols));
            }
            const double e = gxr[i];
            const double tol = ulp(dt, e) + 2.0 * gxs[i] * acc_rel(cols);
            for (size_t g = 0; g < ngx; ++g) p.gx[g].add(r0 + r, c, out.gx[g].second->get(base + i), e, tol);
          }
        }
        for (int64_t c = 0; c < cols; ++c) {
          p.gw[c] += gwc[c];
          p.gw_scale[c] += gwsc[c];
        }
      }
    });
  }
  for (auto& th : pool) th.join();

  std::vector<Check> result;
  Check y;
  y.name = "y (forward)";
  std::vector<Check> gx(ngx);
  std::vector<double> gw(static_cast<size_t>(cols), 0.0), gw_scale(static_cast<size_t>(cols), 0.0);
  for (size_t g = 0; g < ngx; ++g) gx[g].name = out.gx[g].first;
  for (const Partial& p : parts) {
    y.merge(p.y);
    for (size_t g = 0; g < ngx; ++g) gx[g].merge(p.gx[g]);
    for (int64_t c = 0; c < cols; ++c) {
      gw[c] += p.gw[c];
      gw_scale[c] += p.gw_scale[c];
    }
  }
  if (out.y != nullptr) result.push_back(y);
  for (auto& g : gx) result.push_back(g);
  // gw: each term gy * x_hat carries the relative error of the fp32 rstd
  // (acc_rel(cols)), the column sum over rows adds acc_rel(rows), both
  // relative to sum |term| (gw_scale) because the terms cancel.
  for (const auto& g : out.gw) {
    Check ch;
    ch.name = g.name;
    ch.vector = true;
    for (int64_t c = 0; c < cols; ++c) {
      const double e = gw[c];
      const double t = ulp(g.dtype, e) + gw_scale[c] * (acc_rel(rows) + acc_rel(cols) + g.term_round);
      ch.add(0, c, g.values->get(static_cast<size_t>(c)), e, t);
    }
    result.push_back(ch);
  }
  return result;
}

// ---- timing -----------------------------------------------------------------------------------------

struct Timing {
  std::string name;
  double median_us = 0, min_us = 0;
  double bytes = 0;  // minimal bytes moved (see the header comment)
  bool has = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Timing time_cpu(const std::string& name, double bytes, int reps, const std::function<void()>& call) {
  Progress progress("timing " + name + " on the CPU");
  call();  // warm-up: page faults, thread start
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  Timing t;
  t.name = name;
  t.median_us = median(us);
  t.min_us = *std::min_element(us.begin(), us.end());
  t.bytes = bytes;
  t.has = true;
  return t;
}

double gbps(const Timing& t) { return t.has && t.median_us > 0 ? t.bytes / (t.median_us * 1e3) : 0.0; }

// ---- JSON ---------------------------------------------------------------------------------------------

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// ---- the run ------------------------------------------------------------------------------------------

struct Report {
  std::string backend, device;
  int sms = 0, threads = 0, input_sets = 1, reps = 0;
  int cuda_runtime = 0, cuda_driver = 0;
  std::vector<Check> checks;
  std::vector<Timing> timings;  // forward, grad, vjp, [copy, vjp_two_pass]
  double fused_workspace_bytes = 0, two_pass_temp_bytes = 0;
  std::string two_pass_note;
};

const Timing* find(const Report& r, const std::string& name) {
  for (const Timing& t : r.timings)
    if (t.name == name && t.has) return &t;
  return nullptr;
}

void write_json(const Config& cfg, const Report& rep, bool passed) {
  std::FILE* f = std::fopen(cfg.json.c_str(), "w");
  if (f == nullptr) die("--json: cannot open '" + cfg.json + "' for writing: " + std::strerror(errno));
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const Timing* copy = find(rep, "copy");
  std::string s = "{\n";
  s += "  \"tool\": \"rmsnorm\",\n";
  s += "  \"version\": \"" + std::to_string(RMSNORM_VERSION_MAJOR) + "." + std::to_string(RMSNORM_VERSION_MINOR) + "." +
       std::to_string(RMSNORM_VERSION_PATCH) + "\",\n";
  s += "  \"date\": \"" + std::string(date) + "\",\n";
  s += "  \"backend\": " + json_string(rep.backend) + ",\n";
  s += "  \"device\": " + json_string(rep.device) + ",\n";
  if (rep.backend == "cuda") {
    s += "  \"sms\": " + std::to_string(rep.sms) + ",\n";
    s += "  \"cuda_runtime\": " + std::to_string(rep.cuda_runtime) + ",\n";
    s += "  \"cuda_driver\": " + std::to_string(rep.cuda_driver) + ",\n";
  } else {
    s += "  \"threads\": " + std::to_string(rep.threads) + ",\n";
  }
  s += "  \"rows\": " + std::to_string(cfg.rows) + ",\n";
  s += "  \"cols\": " + std::to_string(cfg.cols) + ",\n";
  s += "  \"dtype\": \"" + std::string(dtype_name(cfg.dtype)) + "\",\n";
  s += "  \"eps\": " + json_number(cfg.eps) + ",\n";
  s += "  \"seed\": " + std::to_string(cfg.seed) + ",\n";
  s += "  \"reps\": " + std::to_string(rep.reps) + ",\n";
  s += "  \"input_sets\": " + std::to_string(rep.input_sets) + ",\n";
  s += "  \"check\": {\"passed\": " + std::string(passed ? "true" : "false") + ", \"items\": [";
  for (size_t i = 0; i < rep.checks.size(); ++i) {
    const Check& c = rep.checks[i];
    s += std::string(i ? ", " : "") + "\n    {\"name\": " + json_string(c.name) + ", \"elements\": " +
         std::to_string(c.count) + ", \"bad\": " + std::to_string(c.bad) + ", \"worst_err_over_tol\": " +
         json_number(c.ratio) + ", \"worst_row\": " + (c.vector ? std::string("null") : std::to_string(c.row)) +
         ", \"worst_col\": " +
         std::to_string(c.col) + "}";
  }
  s += "]},\n";
  s += "  \"results\": [";
  bool first = true;
  for (const Timing& t : rep.timings) {
    if (!t.has) continue;
    s += std::string(first ? "" : ",") + "\n    {\"name\": " + json_string(t.name) + ", \"median_us\": " +
         json_number(t.median_us) + ", \"min_us\": " + json_number(t.min_us) + ", \"bytes\": " + json_number(t.bytes) +
         ", \"gb_per_s\": " + json_number(gbps(t)) + ", \"pct_of_copy\": " +
         (copy != nullptr && t.name != "copy" ? json_number(100.0 * gbps(t) / gbps(*copy)) : std::string("null")) + "}";
    first = false;
  }
  s += "\n  ]";
  if (rep.backend == "cuda") {
    const Timing* fused = find(rep, "vjp");
    const Timing* two = find(rep, "vjp_two_pass");
    s += ",\n  \"backward_extra_memory_bytes\": {\"fused_workspace\": " + json_number(rep.fused_workspace_bytes) +
         ", \"two_pass_temp\": " + json_number(rep.two_pass_temp_bytes) + "}";
    s += ",\n  \"two_pass_over_fused_time\": " +
         (fused && two ? json_number(two->median_us / fused->median_us) : std::string("null"));
    const Timing* grad = find(rep, "grad");
    const Timing* grad_two = find(rep, "grad_two_pass");
    s += ",\n  \"two_pass_over_fused_grad_time\": " +
         (grad && grad_two ? json_number(grad_two->median_us / grad->median_us) : std::string("null"));
    if (!rep.two_pass_note.empty()) s += ",\n  \"two_pass_note\": " + json_string(rep.two_pass_note);
  }
  s += "\n}\n";
  const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  if (std::fclose(f) != 0 || !ok) die("--json: writing '" + cfg.json + "' failed");
}

void print_checks(const std::vector<Check>& checks) {
  std::printf("check vs float64 reference (every element, worst err/tol):");
  for (const Check& c : checks) std::printf("\n  %-28s %.3f%s", c.name.c_str(), c.ratio, c.passed() ? "" : "  FAIL");
  std::printf("\n");
}

void print_timings(const Report& rep) {
  const Timing* copy = find(rep, "copy");
  std::printf("\n%-24s %12s %12s %10s %8s\n", "", "median us", "min us", "GB/s", copy ? "% copy" : "");
  for (const Timing& t : rep.timings) {
    if (!t.has) continue;
    std::printf("%-24s %12.2f %12.2f %10.1f", t.name.c_str(), t.median_us, t.min_us, gbps(t));
    if (copy != nullptr && t.name != "copy") std::printf(" %7.1f%%", 100.0 * gbps(t) / gbps(*copy));
    std::printf("\n");
  }
}

// Everything both backends share: inputs, dimensions, gw buffers on the host.
struct Problem {
  Config cfg;
  rmsnorm_problem_t p{};
  size_t esize = 0, elems = 0;
  HostTensor x, gy, w;
  double fwd_bytes = 0, vjp_bytes = 0;
};

Problem make_problem(const Config& cfg) {
  Problem pr;
  pr.cfg = cfg;
  pr.p = rmsnorm_problem_default();
  pr.p.rows = cfg.rows;
  pr.p.cols = cfg.cols;
  pr.p.dtype = cfg.dtype;
  pr.p.eps = cfg.eps;
  pr.esize = rmsnorm_dtype_size(cfg.dtype);
  pr.elems = static_cast<size_t>(cfg.rows) * static_cast<size_t>(cfg.cols);
  const double nd = static_cast<double>(pr.elems), d = static_cast<double>(cfg.cols), e = static_cast<double>(pr.esize);
  pr.fwd_bytes = (2 * nd + d) * e;
  pr.vjp_bytes = (3 * nd + 2 * d) * e;
  Progress progress("generating random inputs");
  pr.x = HostTensor(cfg.dtype, pr.elems);
  pr.gy = HostTensor(cfg.dtype, pr.elems);
  pr.w = HostTensor(cfg.dtype, static_cast<size_t>(cfg.cols));
  fill_random(pr.x, cfg.rows, cfg.cols, cfg.seed, row_scale);
  fill_random(pr.gy, cfg.rows, cfg.cols, cfg.seed + 1, unit_scale);
  // w' near 1 as in a trained model, never 0.
  uint64_t s = cfg.seed + 2;
  for (size_t c = 0; c < pr.w.n; ++c) {
    pr.w.set(c, static_cast<float>(1.0 + 0.25 * normal(s)));
    if (pr.w.get(c) == 0.0) pr.w.set(c, 0.5f);
  }
  return pr;
}

bool run_checks(Problem& pr, const Outputs& out, Report& rep) {
  {
    Progress progress("computing the float64 reference and comparing");
    rep.checks = check_against_reference(pr.x, pr.w, pr.gy, pr.cfg.rows, pr.cfg.cols, pr.cfg.eps, out);
  }
  print_checks(rep.checks);
  bool ok = true;
  for (const Check& c : rep.checks) {
    if (!c.passed()) {
      c.print_failure();
      ok = false;
    }
  }
  return ok;
}

// ---- CPU ------------------------------------------------------------------------------------------------

int run_cpu(const Config& cfg) {
  Report rep;
  rep.backend = "cpu";
  rep.threads = cfg.threads > 0 ? cfg.threads : hardware_threads();
  rep.device = "host";
  rep.reps = cfg.reps > 0 ? cfg.reps : 5;
  std::printf("backend: cpu (%d threads)\n", rep.threads);
  Problem pr = make_problem(cfg);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(cfg.threads);
  const int64_t rows = cfg.rows, cols = cfg.cols;

  size_t ws_bytes = 0, ws_f32 = 0;
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE, &be, &ws_bytes), "workspace query");
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE_F32, &be, &ws_f32), "workspace query");
  std::vector<double> ws(std::max(ws_bytes, ws_f32) / sizeof(double) + 2);  // 16-byte aligned

  HostTensor y(cfg.dtype, pr.elems), gx(cfg.dtype, pr.elems), gx2(cfg.dtype, pr.elems);
  HostTensor gw32(RMSNORM_DTYPE_F32, static_cast<size_t>(cols)), gw(cfg.dtype, static_cast<size_t>(cols));
  std::vector<float> rstd(static_cast<size_t>(rows));
  y.poison();
  gx.poison();
  gx2.poison();
  gw32.poison();
  gw.poison();
  {
    Progress progress("running the library on the CPU");
    lib_check(rmsnorm_forward(&pr.p, pr.x.data(), cols, pr.w.data(), y.data(), cols, rstd.data(), &be), "forward");
    lib_check(rmsnorm_backward(&pr.p, pr.x.data(), cols, pr.w.data(), pr.gy.data(), cols, rstd.data(), gx.data(), cols,
                               gw32.data(), RMSNORM_GW_STORE_F32, ws.data(), ws.size() * sizeof(double), &be),
              "backward (gw f32)");
    lib_check(rmsnorm_backward(&pr.p, pr.x.data(), cols, pr.w.data(), pr.gy.data(), cols, nullptr, gx2.data(), cols,
                               gw.data(), RMSNORM_GW_STORE, ws.data(), ws.size() * sizeof(double), &be),
              "backward (gw in dtype, rstd recomputed)");
  }
  Outputs out;
  out.y = &y;
  out.gx.push_back({"gx", &gx});
  out.gx.push_back({"gx (rstd recomputed)", &gx2});
  out.gw.push_back({"gw (f32)", &gw32, RMSNORM_DTYPE_F32, 0.0});
  out.gw.push_back({std::string("gw (") + dtype_name(cfg.dtype) + ")", &gw, cfg.dtype, 0.0});
  if (!run_checks(pr, out, rep)) {
    if (!cfg.json.empty()) write_json(cfg, rep, false);
    return 1;
  }

  const size_t wsb = ws.size() * sizeof(double);
  auto fwd = [&] {
    lib_check(rmsnorm_forward(&pr.p, pr.x.data(), cols, pr.w.data(), y.data(), cols, nullptr, &be), "forward");
  };
  auto vjp = [&] {
    lib_check(rmsnorm_backward(&pr.p, pr.x.data(), cols, pr.w.data(), pr.gy.data(), cols, rstd.data(), gx.data(), cols,
                               gw.data(), RMSNORM_GW_STORE, ws.data(), wsb, &be),
              "backward");
  };
  auto grad = [&] {
    lib_check(rmsnorm_forward(&pr.p, pr.x.data(), cols, pr.w.data(), y.data(), cols, rstd.data(), &be), "forward");
    vjp();
  };
  std::printf("timing: median of %d after 1 warm-up, steady_clock per call\n", rep.reps);
  rep.timings.push_back(time_cpu("forward", pr.fwd_bytes, rep.reps, fwd));
  rep.timings.push_back(time_cpu("grad", pr.fwd_bytes + pr.vjp_bytes, rep.reps, grad));
  rep.timings.push_back(time_cpu("vjp", pr.vjp_bytes, rep.reps, vjp));
  print_timings(rep);
  if (!cfg.json.empty()) write_json(cfg, rep, true);
  return 0;
}

// ---- CUDA -----------------------------------------------------------------------------------------------

#if defined(RMSNORM_WITH_CUDA)

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n > 0) CUDA_CHECK(cudaMalloc(&p, n));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer() {
    if (p != nullptr) cudaFree(p);  // teardown: an error here has nothing left to corrupt
  }
  template <class T = void>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// One rotated copy of the row-sized operands.
struct DeviceSet {
  DeviceBuffer x, gy, y, gx, rstd;
};

void to_host(HostTensor& h, const DeviceBuffer& d) {
  CUDA_CHECK(cudaMemcpy(h.data(), d.p, h.bytes.size(), cudaMemcpyDeviceToHost));
}

// Times `call(set)` with an event before and after each call on `stream`.
Timing time_cuda(const std::string& name, double bytes, int reps, int sets, cudaStream_t stream,
                 const std::function<void(int)>& call) {
  Progress progress("timing " + name);
  const int warm = std::max(5, sets);
  for (int i = 0; i < warm; ++i) call(i % sets);
  std::vector<cudaEvent_t> ev(static_cast<size_t>(reps) + 1);
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  CUDA_CHECK(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < reps; ++i) {
    call(i % sets);
    CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(i) + 1], stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]));
    us.push_back(1e3 * ms);
  }
  for (auto& e : ev) CUDA_CHECK(cudaEventDestroy(e));
  Timing t;
  t.name = name;
  t.median_us = median(us);
  t.min_us = *std::min_element(us.begin(), us.end());
  t.bytes = bytes;
  t.has = true;
  return t;
}

rmsnorm::BackwardArgs two_pass_args(const Problem& pr, const DeviceSet& s, const void* w, void* gw) {
  rmsnorm::BackwardArgs a;
  a.rows = pr.cfg.rows;
  a.cols = pr.cfg.cols;
  a.dtype = static_cast<rmsnorm::DType>(pr.cfg.dtype);
  a.eps = pr.cfg.eps;
  a.x = s.x.p;
  a.x_stride = pr.cfg.cols;
  a.weight = w;
  a.gy = s.gy.p;
  a.gy_stride = pr.cfg.cols;
  a.rstd = s.rstd.as<float>();
  a.gx = s.gx.p;
  a.gx_stride = pr.cfg.cols;
  a.gw = gw;
  a.gw_mode = rmsnorm::GwMode::kStore;
  return a;
}

int run_cuda(const Config& cfg) {
  Report rep;
  rep.backend = "cuda";
  rep.reps = cfg.reps > 0 ? cfg.reps : 100;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  CUDA_CHECK(cudaRuntimeGetVersion(&rep.cuda_runtime));
  CUDA_CHECK(cudaDriverGetVersion(&rep.cuda_driver));
  rep.device = prop.name;
  rep.sms = prop.multiProcessorCount;
  std::printf("backend: cuda (%s, %d SMs, device %d)\n", prop.name, prop.multiProcessorCount, dev);
  if (cfg.threads != 0) std::printf("note: --threads applies to the CPU backend only\n");

  Problem pr = make_problem(cfg);
  const int64_t rows = cfg.rows, cols = cfg.cols;
  const size_t mat = pr.elems * pr.esize, vec = static_cast<size_t>(cols) * pr.esize;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const rmsnorm_backend_t be = rmsnorm_backend_cuda(dev, stream);

  // Rotation: enough sets that one round touches >= 256 MiB, at most 64 sets
  // and half of the free memory.
  const size_t set_bytes = 4 * mat + static_cast<size_t>(rows) * sizeof(float);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t want = (size_t{256} << 20) / set_bytes + 1;
  const size_t fit = std::max<size_t>(1, free_b / 2 / set_bytes);
  rep.input_sets = static_cast<int>(std::min<size_t>({want, fit, 64}));
  if (set_bytes > free_b) die("not enough device memory for one input set");

  size_t ws_store = 0, ws_f32 = 0;
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE, &be, &ws_store), "workspace query");
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE_F32, &be, &ws_f32), "workspace query");
  rep.fused_workspace_bytes = static_cast<double>(ws_store);
  DeviceBuffer ws(std::max(ws_store, ws_f32));
  DeviceBuffer w(vec), gw(vec), gw32(static_cast<size_t>(cols) * 4);

  std::vector<DeviceSet> sets;
  {
    Progress progress("allocating and filling " + std::to_string(rep.input_sets) + " input sets on the device");
    for (int i = 0; i < rep.input_sets; ++i) {
      DeviceSet s;
      s.x = DeviceBuffer(mat);
      s.gy = DeviceBuffer(mat);
      s.y = DeviceBuffer(mat);
      s.gx = DeviceBuffer(mat);
      s.rstd = DeviceBuffer(static_cast<size_t>(rows) * sizeof(float));
      if (i == 0) {
        CUDA_CHECK(cudaMemcpy(s.x.p, pr.x.data(), mat, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(s.gy.p, pr.gy.data(), mat, cudaMemcpyHostToDevice));
      } else {
        CUDA_CHECK(cudaMemcpy(s.x.p, sets[0].x.p, mat, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaMemcpy(s.gy.p, sets[0].gy.p, mat, cudaMemcpyDeviceToDevice));
      }
      // NaN everywhere an output goes: anything left unwritten fails the check.
      CUDA_CHECK(cudaMemset(s.y.p, 0xFF, mat));
      CUDA_CHECK(cudaMemset(s.gx.p, 0xFF, mat));
      CUDA_CHECK(cudaMemset(s.rstd.p, 0xFF, s.rstd.bytes));
      sets.push_back(std::move(s));
    }
    CUDA_CHECK(cudaMemcpy(w.p, pr.w.data(), vec, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(gw.p, 0xFF, vec));
    CUDA_CHECK(cudaMemset(gw32.p, 0xFF, gw32.bytes));
    // The set-up above ran on the legacy default stream, which a non-blocking
    // stream does not wait for; everything below runs on `stream`.
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  // ---- correctness guard on set 0 ----
  const DeviceSet& s0 = sets[0];
  HostTensor y(cfg.dtype, pr.elems), gx(cfg.dtype, pr.elems), gx2(cfg.dtype, pr.elems), gx_tp(cfg.dtype, pr.elems);
  HostTensor gw32_h(RMSNORM_DTYPE_F32, static_cast<size_t>(cols)), gw_h(cfg.dtype, static_cast<size_t>(cols));
  HostTensor gw_tp(cfg.dtype, static_cast<size_t>(cols));
  bool two_pass_ok = false;
  size_t temp_bytes = rmsnorm::bench::two_pass_temp_bytes(rows, cols, static_cast<rmsnorm::DType>(cfg.dtype));
  rep.two_pass_temp_bytes = static_cast<double>(temp_bytes);
  DeviceBuffer temp;
  {
    Progress progress("running the library on the GPU");
    lib_check(rmsnorm_forward(&pr.p, s0.x.p, cols, w.p, s0.y.p, cols, s0.rstd.as<float>(), &be), "forward");
    lib_check(rmsnorm_backward(&pr.p, s0.x.p, cols, w.p, s0.gy.p, cols, s0.rstd.as<float>(), s0.gx.p, cols, gw32.p,
                               RMSNORM_GW_STORE_F32, ws.p, ws.bytes, &be),
              "backward (gw f32)");
    CUDA_CHECK(cudaStreamSynchronize(stream));
    to_host(y, s0.y);
    to_host(gx, s0.gx);
    to_host(gw32_h, gw32);
    CUDA_CHECK(cudaMemsetAsync(s0.gx.p, 0xFF, mat, stream));
    lib_check(rmsnorm_backward(&pr.p, s0.x.p, cols, w.p, s0.gy.p, cols, nullptr, s0.gx.p, cols, gw.p, RMSNORM_GW_STORE,
                               ws.p, ws.bytes, &be),
              "backward (gw in dtype, rstd recomputed)");
    CUDA_CHECK(cudaStreamSynchronize(stream));
    to_host(gx2, s0.gx);
    to_host(gw_h, gw);

    // The two-pass variant is checked too: a wrong baseline would make the
    // comparison meaningless.
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (temp_bytes + (size_t{64} << 20) < free_b) {
      temp = DeviceBuffer(temp_bytes);
      CUDA_CHECK(cudaMemsetAsync(s0.gx.p, 0xFF, mat, stream));
      CUDA_CHECK(cudaMemsetAsync(gw.p, 0xFF, vec, stream));
      const rmsnorm_status_t st =
          rmsnorm::bench::backward_two_pass(two_pass_args(pr, s0, w.p, gw.p), temp.p, stream);
      if (st == RMSNORM_STATUS_SUCCESS) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        to_host(gx_tp, s0.gx);
        to_host(gw_tp, gw);
        two_pass_ok = true;
      } else {
        rep.two_pass_note = std::string("not run: ") + rmsnorm_status_string(st) + ": " + rmsnorm_last_error();
      }
    } else {
      rep.two_pass_note = "not run: its temporary does not fit in device memory";
    }
    CUDA_CHECK(cudaGetLastError());
  }
  if (!rep.two_pass_note.empty()) std::printf("two-pass backward %s\n", rep.two_pass_note.c_str());

  Outputs out;
  out.y = &y;
  out.gx.push_back({"gx", &gx});
  out.gx.push_back({"gx (rstd recomputed)", &gx2});
  out.gw.push_back({"gw (f32)", &gw32_h, RMSNORM_DTYPE_F32, 0.0});
  out.gw.push_back({std::string("gw (") + dtype_name(cfg.dtype) + ")", &gw_h, cfg.dtype, 0.0});
  if (two_pass_ok) {
    out.gx.push_back({"gx (two-pass)", &gx_tp});
    // Its temporary rounds every row's term to the dtype before the sum.
    out.gw.push_back({std::string("gw (two-pass, ") + dtype_name(cfg.dtype) + ")", &gw_tp, cfg.dtype,
                      std::ldexp(1.0, -mantissa_bits(cfg.dtype) - 1)});
  }
  if (!run_checks(pr, out, rep)) {
    if (!cfg.json.empty()) write_json(cfg, rep, false);
    return 1;
  }

  // ---- timing ----
  const int nsets = rep.input_sets;
  std::printf("timing: median of %d per-call event timings after warm-up, %d input set(s) rotated (%.1f MiB each)\n",
              rep.reps, nsets, static_cast<double>(set_bytes) / (1 << 20));
  const double copy_bytes = 2.0 * static_cast<double>(mat);
  rep.timings.push_back(time_cuda("copy", copy_bytes, rep.reps, nsets, stream, [&](int i) {
    CUDA_CHECK(cudaMemcpyAsync(sets[static_cast<size_t>(i)].y.p, sets[static_cast<size_t>(i)].x.p, mat,
                               cudaMemcpyDeviceToDevice, stream));
  }));
  auto fwd = [&](int i, bool with_rstd) {
    const DeviceSet& s = sets[static_cast<size_t>(i)];
    lib_check(rmsnorm_forward(&pr.p, s.x.p, cols, w.p, s.y.p, cols, with_rstd ? s.rstd.as<float>() : nullptr, &be),
              "forward");
  };
  auto vjp = [&](int i) {
    const DeviceSet& s = sets[static_cast<size_t>(i)];
    lib_check(rmsnorm_backward(&pr.p, s.x.p, cols, w.p, s.gy.p, cols, s.rstd.as<float>(), s.gx.p, cols, gw.p,
                               RMSNORM_GW_STORE, ws.p, ws.bytes, &be),
              "backward");
  };
  // rstd of every set, for the VJP-only runs.
  for (int i = 0; i < nsets; ++i) fwd(i, true);
  rep.timings.push_back(time_cuda("forward", pr.fwd_bytes, rep.reps, nsets, stream, [&](int i) { fwd(i, false); }));
  rep.timings.push_back(time_cuda("grad", pr.fwd_bytes + pr.vjp_bytes, rep.reps, nsets, stream, [&](int i) {
    fwd(i, true);
    vjp(i);
  }));
  rep.timings.push_back(time_cuda("vjp", pr.vjp_bytes, rep.reps, nsets, stream, vjp));
  if (two_pass_ok) {
    auto vjp_two_pass = [&](int i) {
      lib_check(rmsnorm::bench::backward_two_pass(two_pass_args(pr, sets[static_cast<size_t>(i)], w.p, gw.p), temp.p,
                                                 stream),
                "two-pass backward");
    };
    rep.timings.push_back(time_cuda("grad_two_pass", pr.fwd_bytes + pr.vjp_bytes, rep.reps, nsets, stream, [&](int i) {
      fwd(i, true);
      vjp_two_pass(i);
    }));
    rep.timings.push_back(time_cuda("vjp_two_pass", pr.vjp_bytes, rep.reps, nsets, stream, vjp_two_pass));
  }
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaStreamSynchronize(stream));
  print_timings(rep);
  const Timing* fused = find(rep, "vjp");
  const Timing* two = find(rep, "vjp_two_pass");
  std::printf("\nbackward extra device memory: fused workspace %.2f MiB, two-pass temporary %.2f MiB\n",
              rep.fused_workspace_bytes / (1 << 20), rep.two_pass_temp_bytes / (1 << 20));
  if (fused && two) std::printf("two-pass / fused VJP time: %.2fx\n", two->median_us / fused->median_us);
  const Timing* grad = find(rep, "grad");
  const Timing* grad_two = find(rep, "grad_two_pass");
  if (grad && grad_two)
    std::printf("two-pass / fused grad time: %.2fx\n", grad_two->median_us / grad->median_us);
  sets.clear();
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (!cfg.json.empty()) write_json(cfg, rep, true);
  return 0;
}

#endif  // RMSNORM_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  const Config cfg = parse_args(argc, argv);
  std::printf("rmsnorm %d.%d.%d: %" PRId64 " x %" PRId64 " %s, eps %g\n", RMSNORM_VERSION_MAJOR,
              RMSNORM_VERSION_MINOR, RMSNORM_VERSION_PATCH, cfg.rows, cfg.cols, dtype_name(cfg.dtype),
              static_cast<double>(cfg.eps));
  const bool cuda = rmsnorm_cuda_available() != 0;
  if (cfg.backend == "cuda" && !cuda)
    die("--backend cuda: the CUDA backend is not available (built without CUDA, or no usable GPU)");
  if (cuda && cfg.backend != "cpu") {
#if defined(RMSNORM_WITH_CUDA)
    return run_cuda(cfg);
#else
    die("the library reports CUDA but this CLI was built without it; rebuild both together");
#endif
  }
  return run_cpu(cfg);
}
