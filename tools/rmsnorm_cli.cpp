// rmsnorm: the classic measurement of RMSNorm forward and backward.
//
// With no arguments: x and the cotangent gy of 8192 x 4096 f16, w of 4096,
// eps 1e-5, random inputs (never zeros; rows scaled by 2^-4 .. 2^4 so that a
// row normalized with a neighbour's statistics cannot pass).
//   1. Correctness guard: y, and gx and gw of L = sum(rms_norm(x, w) * gy),
//      from the library against the float64 reference (reference/), every
//      element, with the tests' tolerance model (harness/tolerance.hpp). A
//      failure prints the worst element and exits 1.
//   2. Median times after warm-up: forward, grad (forward with rstd +
//      backward) and VJP (backward with rstd given), with effective GB/s over
//      the minimal bytes:
//        forward: read x, write y, read w          = 2 n D + D elements
//        VJP:     read x, gy, write gx; w, gw       = 3 n D + 2 D elements
//        grad:    the sum of both                   = 5 n D + 3 D elements
//      On CUDA also the device-to-device copy (the bandwidth ceiling, read +
//      write) and the two-pass backward (bench/two_pass.hpp), the design the
//      fused backward replaces, as a grad call and as a VJP, with the extra
//      memory each needs. With rows == 0 there is nothing to time: the calls
//      run and gw (the empty sum) is checked.
//
// GPU timing: one stream, a CUDA event before and after every call, the
// median over the calls. Input sets are rotated so that the data touched
// between two uses of one set exceeds the L2 (60 MB on the H200), else the
// numbers would measure L2, not HBM.
//
// The CLI may exit on an error (the library never does): every CUDA call and
// every library status is checked, printed and turned into exit code 1, and
// so is running out of host or device memory.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "common/parallel.hpp"
#include "common/quant.hpp"
#include "harness/check.hpp"
#include "harness/host_matrix.hpp"
#include "harness/json.hpp"
#include "harness/random.hpp"
#include "harness/stats.hpp"
#include "harness/tolerance.hpp"
#include "rmsnorm/rmsnorm.h"

#if defined(RMSNORM_WITH_CUDA)
#include <cuda_runtime.h>

#include "args.hpp"
#include "harness/cuda.hpp"
#include "two_pass.hpp"
#endif

namespace {

using rmsnorm::harness::CheckResult;
using rmsnorm::harness::dtype_name;
using rmsnorm::harness::HostMatrix;
using rmsnorm::harness::JsonWriter;
using rmsnorm::harness::Outputs;

// ---- errors -----------------------------------------------------------------------------------

[[noreturn]] void die(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "rmsnorm: error: %s\n", msg.c_str());
  std::exit(1);
}

void lib_check(rmsnorm_status_t s, const char* what) {
  if (s != RMSNORM_STATUS_SUCCESS)
    die(std::string(what) + " failed: " + rmsnorm_status_string(s) + ": " + rmsnorm_last_error());
}

#if defined(RMSNORM_WITH_CUDA)
#define CUDA_CHECK(expr) RMSNORM_HARNESS_CUDA(expr)
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
  std::string op = "norm";  // norm | add | quant-fp8 | quant-int8
  int group = 0;            // quant: 0 per-row scales, else 64 or 128 (block scales, rmsnorm_forward_block_quant)
  // Mixed dtypes (-1 until parsed: --dtype's): y's and gy's (RMSNORM_FLAG_Y_DTYPE, --op norm), the weight's (f32
  // with 16-bit x: RMSNORM_FLAG_WEIGHT_F32; y's 16-bit with f32 x: RMSNORM_FLAG_WEIGHT_Y_DTYPE), the residual stream's (f32 with 16-bit x: RMSNORM_FLAG_RESIDUAL_F32,
  // --op add).
  int32_t y_dtype = -1, weight_dtype = -1, residual_dtype = -1;
  bool mixed() const { return y_dtype != dtype || weight_dtype != dtype || residual_dtype != dtype; }
};

const char* kUsage =
    "usage: rmsnorm [options]\n"
    "\n"
    "Checks RMSNorm forward/backward against a float64 reference, then times them.\n"
    "Default: 8192 x 4096 f16, eps 1e-5, on the GPU when one is usable, else on the CPU.\n"
    "\n"
    "  --rows N            rows, 0 allowed (default 8192)\n"
    "  --cols N            columns, D (default 4096)\n"
    "  --dtype T           f32 | f16 | bf16 (default f16)\n"
    "  --backend B         auto | cpu | cuda (default auto: cuda when available)\n"
    "  --reps N            timed repetitions per measurement (default 100 on GPU, 5 on CPU)\n"
    "  --eps E             epsilon, finite and >= 0 (default 1e-5)\n"
    "  --threads N         CPU backend threads, 0 = all (default 0)\n"
    "  --seed N            random seed (default 20240611)\n"
    "  --json FILE         also write every result as JSON\n"
    "  --op OP             norm (the forward and backward) | add (residual add + norm forward) |\n"
    "                      quant-fp8 | quant-int8 (forward quantized with per-row scales) (default norm)\n"
    "  --group G           64 | 128: the quant ops with one scale per G columns of a row instead of per row\n"
    "                      (rmsnorm_forward_block_quant, row-major scales)\n"
    "  --y-dtype T         y's and gy's dtype, --op norm (default --dtype's; RMSNORM_FLAG_Y_DTYPE)\n"
    "  --weight-dtype T    the weight's: --dtype's, f32 with f16 / bf16 x (RMSNORM_FLAG_WEIGHT_F32), or\n"
    "                      --y-dtype's f16 / bf16 with f32 x (RMSNORM_FLAG_WEIGHT_Y_DTYPE)\n"
    "  --residual-dtype T  the residual stream's (residual and h), --op add: --dtype's, or f32 with f16 / bf16 x\n"
    "                      (RMSNORM_FLAG_RESIDUAL_F32)\n"
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

int32_t parse_dtype(const std::string& opt, const std::string& d) {
  if (d == "f32") return RMSNORM_DTYPE_F32;
  if (d == "f16") return RMSNORM_DTYPE_F16;
  if (d == "bf16") return RMSNORM_DTYPE_BF16;
  usage_error(opt + ": expected f32, f16 or bf16, got '" + d + "'");
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
      c.rows = parse_int(a, value(), 0, int64_t{1} << 40);
    } else if (a == "--cols") {
      c.cols = parse_int(a, value(), 1, int64_t{1} << 30);
    } else if (a == "--dtype") {
      c.dtype = parse_dtype(a, value());
    } else if (a == "--y-dtype") {
      c.y_dtype = parse_dtype(a, value());
    } else if (a == "--weight-dtype") {
      c.weight_dtype = parse_dtype(a, value());
    } else if (a == "--residual-dtype") {
      c.residual_dtype = parse_dtype(a, value());
    } else if (a == "--backend") {
      c.backend = value();
      if (c.backend != "auto" && c.backend != "cpu" && c.backend != "cuda")
        usage_error("--backend: expected auto, cpu or cuda, got '" + c.backend + "'");
    } else if (a == "--reps") {
      c.reps = static_cast<int>(parse_int(a, value(), 1, 1000000));
    } else if (a == "--eps") {
      const std::string e = value();
      char* end = nullptr;
      errno = 0;
      const float f = std::strtof(e.c_str(), &end);
      if (e.empty() || *end != '\0' || !std::isfinite(f) || f < 0.0f)
        usage_error("--eps: expected a finite number >= 0, got '" + e + "'");
      // strtof returns 0 for a value below the smallest float (ERANGE); a
      // subnormal result is kept.
      if (errno == ERANGE && f == 0.0f)
        usage_error("--eps: '" + e + "' is nonzero but below the smallest float (about 1.4e-45)");
      c.eps = f;
    } else if (a == "--threads") {
      c.threads = static_cast<int>(parse_int(a, value(), 0, 4096));
    } else if (a == "--seed") {
      c.seed = static_cast<uint64_t>(parse_int(a, value(), 0, INT64_MAX));
    } else if (a == "--json") {
      c.json = value();
      if (c.json.empty()) usage_error("--json: empty file name");
    } else if (a == "--group") {
      const std::string g = value();
      if (g != "64" && g != "128") usage_error("--group: expected 64 or 128, got '" + g + "'");
      c.group = std::stoi(g);
    } else if (a == "--op") {
      c.op = value();
      if (c.op != "norm" && c.op != "add" && c.op != "quant-fp8" && c.op != "quant-int8")
        usage_error("--op: expected norm, add, quant-fp8 or quant-int8, got '" + c.op + "'");
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  if (c.y_dtype < 0) c.y_dtype = c.dtype;
  if (c.weight_dtype < 0) c.weight_dtype = c.dtype;
  if (c.residual_dtype < 0) c.residual_dtype = c.dtype;
  if (c.y_dtype != c.dtype && c.op != "norm") usage_error("--y-dtype: only with --op norm");
  if (c.group != 0 && c.op != "quant-fp8" && c.op != "quant-int8")
    usage_error("--group: only with --op quant-fp8 or --op quant-int8, not --op " + c.op);
  const bool weight_y = c.dtype == RMSNORM_DTYPE_F32 && c.y_dtype != RMSNORM_DTYPE_F32 && c.weight_dtype == c.y_dtype;
  if (c.weight_dtype != c.dtype && !(c.weight_dtype == RMSNORM_DTYPE_F32 || weight_y))
    usage_error("--weight-dtype: expected --dtype's, f32 with f16 / bf16 --dtype, or --y-dtype's with f32 --dtype");
  if (c.residual_dtype != c.dtype && (c.residual_dtype != RMSNORM_DTYPE_F32 || c.op != "add"))
    usage_error("--residual-dtype: expected --dtype's, or f32 with --op add");
  const bool any_f32 = c.dtype == RMSNORM_DTYPE_F32 || c.y_dtype == RMSNORM_DTYPE_F32 || c.residual_dtype == RMSNORM_DTYPE_F32;
  const double bytes = static_cast<double>(c.rows) * static_cast<double>(c.cols) * (any_f32 ? 4 : 2);
  if (bytes > 64.0 * (1ull << 30)) usage_error("rows x cols is too large (over 64 GiB per tensor)");
  return c;
}

// ---- timing -----------------------------------------------------------------------------------------

struct Timing {
  std::string name;
  double median_us = 0, min_us = 0;
  double bytes = 0;  // minimal bytes moved (see the header comment)
};

Timing make_timing(const std::string& name, double bytes, const std::vector<double>& us) {
  Timing t;
  t.name = name;
  t.median_us = rmsnorm::harness::median(us);
  t.min_us = *std::min_element(us.begin(), us.end());
  t.bytes = bytes;
  return t;
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
  return make_timing(name, bytes, us);
}

double gbps(const Timing& t) { return t.median_us > 0 ? t.bytes / (t.median_us * 1e3) : 0.0; }

// ---- the report ---------------------------------------------------------------------------------------

struct Report {
  std::string backend, device;
  int sms = 0, threads = 0, backward_threads = 0, input_sets = 1, reps = 0;
  int cuda_runtime = 0, cuda_driver = 0;
  std::vector<CheckResult> checks;
  std::vector<Timing> timings;  // [copy,] forward, grad, vjp, [grad_two_pass, vjp_two_pass]
  double fused_workspace_bytes = 0, two_pass_temp_bytes = 0;
  std::string two_pass_note;
};

const Timing* find(const Report& r, const std::string& name) {
  for (const Timing& t : r.timings)
    if (t.name == name) return &t;
  return nullptr;
}

// Percent of the copy's GB/s, or negative where there is no copy to compare with.
double pct_of_copy(const Report& rep, const Timing& t) {
  const Timing* copy = find(rep, "copy");
  if (copy == nullptr || t.name == "copy" || gbps(*copy) <= 0) return -1;
  return 100.0 * gbps(t) / gbps(*copy);
}

double ratio_of(const Report& rep, const char* num, const char* den) {
  const Timing* a = find(rep, num);
  const Timing* b = find(rep, den);
  return a != nullptr && b != nullptr && b->median_us > 0 ? a->median_us / b->median_us : NAN;
}

void write_json(const Config& cfg, const Report& rep, bool passed) {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  JsonWriter j;
  j.begin_object();
  j.field("tool", "rmsnorm");
  j.field("version", std::to_string(RMSNORM_VERSION_MAJOR) + "." + std::to_string(RMSNORM_VERSION_MINOR) + "." +
                         std::to_string(RMSNORM_VERSION_PATCH));
  j.field("date", date).field("backend", rep.backend).field("device", rep.device);
  if (rep.backend == "cuda") {
    j.field("sms", rep.sms).field("cuda_runtime", rep.cuda_runtime).field("cuda_driver", rep.cuda_driver);
  } else {
    j.field("threads", rep.threads).field("backward_threads", rep.backward_threads);
    j.field("threads_requested", cfg.threads);
  }
  j.field("op", cfg.op);
  if (cfg.group > 0) j.field("group", cfg.group);  // block scales: columns per scale
  else j.null_field("group");                       // per-row scales, or no quantization
  j.field("rows", cfg.rows).field("cols", cfg.cols).field("dtype", dtype_name(cfg.dtype)).field("eps", cfg.eps);
  j.field("y_dtype", dtype_name(cfg.y_dtype)).field("weight_dtype", dtype_name(cfg.weight_dtype));
  j.field("residual_dtype", dtype_name(cfg.residual_dtype));
  j.field("seed", cfg.seed).field("reps", rep.reps).field("input_sets", rep.input_sets);
  j.key("check").begin_object().field("passed", passed).key("items").begin_array();
  for (const CheckResult& c : rep.checks) {
    const bool any = c.worst.count > 0;
    j.begin_object(true).field("name", c.name).field("elements", c.worst.count).field("bad", c.worst.bad);
    if (any) j.field("worst_err_over_tol", c.worst.ratio);
    else j.null_field("worst_err_over_tol");
    if (any && !c.vector) j.field("worst_row", c.worst.row);
    else j.null_field("worst_row");
    if (any) j.field("worst_col", c.worst.col);
    else j.null_field("worst_col");
    j.end_object();
  }
  j.end_array().end_object();
  j.key("results").begin_array();
  for (const Timing& t : rep.timings) {
    j.begin_object(true).field("name", t.name).field("median_us", t.median_us).field("min_us", t.min_us);
    j.field("bytes", t.bytes).field("gb_per_s", gbps(t));
    const double pct = pct_of_copy(rep, t);
    if (pct >= 0) j.field("pct_of_copy", pct);
    else j.null_field("pct_of_copy");
    j.end_object();
  }
  j.end_array();
  if (rep.backend == "cuda") {
    j.key("backward_extra_memory_bytes").begin_object(true);
    j.field("fused_workspace", rep.fused_workspace_bytes).field("two_pass_temp", rep.two_pass_temp_bytes).end_object();
    j.field("two_pass_over_fused_time", ratio_of(rep, "vjp_two_pass", "vjp"));
    j.field("two_pass_over_fused_grad_time", ratio_of(rep, "grad_two_pass", "grad"));
    if (!rep.two_pass_note.empty()) j.field("two_pass_note", rep.two_pass_note);
  }
  j.end_object();
  const std::string err = rmsnorm::harness::write_text_file(cfg.json, j.str());
  if (!err.empty()) die("--json: " + err);
}

void print_checks(const std::vector<CheckResult>& checks) {
  std::printf("check vs float64 reference (every element, worst err/tol):");
  for (const CheckResult& c : checks) {
    if (c.worst.count == 0)
      std::printf("\n  %-28s (no elements)", c.name.c_str());
    else
      std::printf("\n  %-28s %.3f%s", c.name.c_str(), c.worst.ratio, c.worst.passed() ? "" : "  FAIL");
  }
  std::printf("\n");
}

void print_timings(const Report& rep) {
  const bool copy = find(rep, "copy") != nullptr;
  std::printf("\n%-24s %12s %12s %10s %8s\n", "", "median us", "min us", "GB/s", copy ? "% copy" : "");
  for (const Timing& t : rep.timings) {
    std::printf("%-24s %12.2f %12.2f %10.1f", t.name.c_str(), t.median_us, t.min_us, gbps(t));
    const double pct = pct_of_copy(rep, t);
    if (pct >= 0) std::printf(" %7.1f%%", pct);
    std::printf("\n");
  }
}

// ---- the problem --------------------------------------------------------------------------------------

// Everything both backends share: inputs, dimensions, byte counts.
struct Problem {
  Config cfg;
  rmsnorm_problem_t p{};
  size_t esize = 0, elems = 0;
  HostMatrix x, gy, w;
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
  if (cfg.y_dtype != cfg.dtype) pr.p.flags |= RMSNORM_FLAG_Y_DTYPE(cfg.y_dtype);
  if (cfg.weight_dtype != cfg.dtype)
    pr.p.flags |= cfg.weight_dtype == RMSNORM_DTYPE_F32 ? RMSNORM_FLAG_WEIGHT_F32 : RMSNORM_FLAG_WEIGHT_Y_DTYPE;
  if (cfg.residual_dtype != cfg.dtype) pr.p.flags |= RMSNORM_FLAG_RESIDUAL_F32;
  pr.esize = rmsnorm_dtype_size(cfg.dtype);
  pr.elems = static_cast<size_t>(cfg.rows) * static_cast<size_t>(cfg.cols);
  const double nd = static_cast<double>(pr.elems), d = static_cast<double>(cfg.cols), e = static_cast<double>(pr.esize);
  const double ye = static_cast<double>(rmsnorm_dtype_size(cfg.y_dtype)), we = static_cast<double>(rmsnorm_dtype_size(cfg.weight_dtype));
  pr.fwd_bytes = nd * (e + ye) + d * we;          // read x, w; write y
  pr.vjp_bytes = nd * (2 * e + ye) + 2 * d * we;  // read x, gy, w; write gx, gw
  Progress progress("generating random inputs");
  pr.x = HostMatrix(cfg.dtype, cfg.rows, cfg.cols);
  pr.gy = HostMatrix(cfg.y_dtype, cfg.rows, cfg.cols);
  pr.w = HostMatrix(cfg.weight_dtype, 1, cfg.cols);
  rmsnorm::harness::fill_normal(pr.x, cfg.seed, rmsnorm::harness::hetero_row_scale);
  rmsnorm::harness::fill_normal(pr.gy, cfg.seed + 1);
  // w' near 1 as in a trained model, never 0.
  rmsnorm::harness::fill_normal(pr.w, cfg.seed + 2, [](int64_t) { return 0.25; }, 1.0);
  return pr;
}

HostMatrix matrix_like(const Problem& pr) { return HostMatrix(pr.cfg.dtype, pr.cfg.rows, pr.cfg.cols); }
HostMatrix gw_vector(const Problem& pr, int32_t dtype) { return HostMatrix(dtype, 1, pr.cfg.cols); }

// The outputs both backends check: y, gx with rstd given and recomputed, gw
// as fp32 and in the dtype. At f32 both gw are f32 and share one name, so
// they are reported as one line.
Outputs library_outputs(const Problem& pr, const HostMatrix& y, const HostMatrix& gx, const HostMatrix& gx2,
                        const HostMatrix& gw32, const HostMatrix& gw) {
  Outputs out;
  out.y_name = "y (forward)";
  out.y = &y;
  out.gx.push_back({"gx", &gx});
  out.gx.push_back({"gx (rstd recomputed)", &gx2});
  out.gw.push_back({"gw (f32)", &gw32, 0.0});
  out.gw.push_back({std::string("gw (") + dtype_name(pr.cfg.dtype) + ")", &gw, 0.0});
  return out;
}

bool run_checks(const Problem& pr, const Outputs& out, Report& rep) {
  {
    Progress progress("computing the float64 reference and comparing");
    rmsnorm::reference::Options opt;
    opt.eps = static_cast<double>(pr.cfg.eps);
    rep.checks.clear();
    for (CheckResult& c : rmsnorm::harness::check_against_reference(pr.x, &pr.w, &pr.gy, opt, out)) {
      auto same = std::find_if(rep.checks.begin(), rep.checks.end(), [&](const CheckResult& o) { return o.name == c.name; });
      if (same != rep.checks.end()) same->worst.merge(c.worst);
      else rep.checks.push_back(std::move(c));
    }
  }
  print_checks(rep.checks);
  bool ok = true;
  for (const CheckResult& c : rep.checks) {
    if (!c.worst.passed()) {
      std::fprintf(stderr, "rmsnorm: CHECK FAILED: %s\n", c.worst.describe(c.name, c.vector).c_str());
      ok = false;
    }
  }
  return ok;
}

// ---- CPU ------------------------------------------------------------------------------------------------

int run_cpu(const Config& cfg) {
  Report rep;
  rep.backend = "cpu";
  rep.device = "host";
  rep.reps = cfg.reps > 0 ? cfg.reps : 5;
  // The backend's own rule (src/common/parallel.hpp): the forward splits
  // rows, the backward with gw tiles of rows and columns, each thread taking
  // at least kMinElemsPerThread elements.
  const int64_t elems = cfg.rows * cfg.cols;
  rep.threads = rmsnorm::threads_for(cfg.threads, cfg.rows, elems);
  rep.backward_threads = rmsnorm::threads_for(cfg.threads, elems, elems);
  std::string threads = std::to_string(rep.threads) + (rep.threads == 1 ? " thread" : " threads");
  if (rep.backward_threads != rep.threads) threads = "forward " + threads + ", backward up to " + std::to_string(rep.backward_threads);
  if (cfg.threads > std::max(rep.threads, rep.backward_threads))
    threads += "; " + std::to_string(cfg.threads) + " requested, but each thread takes at least " +
               std::to_string(rmsnorm::kMinElemsPerThread) + " elements" + (cfg.rows < cfg.threads ? " and one row" : "");
  std::printf("backend: cpu (%s)\n", threads.c_str());

  Problem pr = make_problem(cfg);
  const rmsnorm_backend_t be = rmsnorm_backend_cpu(cfg.threads);
  const int64_t rows = cfg.rows, cols = cfg.cols;
  size_t ws_bytes = 0, ws_f32 = 0;
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE, &be, &ws_bytes), "workspace query");
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE_F32, &be, &ws_f32), "workspace query");
  std::vector<double> ws(std::max(ws_bytes, ws_f32) / sizeof(double) + 2);  // 16-byte aligned
  const size_t wsb = ws.size() * sizeof(double);

  // Outputs start as NaN (HostMatrix's poison): anything left unwritten fails the check.
  HostMatrix y = matrix_like(pr), gx = matrix_like(pr), gx2 = matrix_like(pr);
  HostMatrix gw32 = gw_vector(pr, RMSNORM_DTYPE_F32), gw = gw_vector(pr, cfg.dtype);
  std::vector<float> rstd(static_cast<size_t>(rows) + 1);
  {
    Progress progress("running the library on the CPU");
    lib_check(rmsnorm_forward(&pr.p, pr.x.data(), cols, pr.w.data(), y.data(), cols, rstd.data(), &be), "forward");
    lib_check(rmsnorm_backward(&pr.p, pr.x.data(), cols, pr.w.data(), pr.gy.data(), cols, rstd.data(), gx.data(), cols,
                               gw32.data(), RMSNORM_GW_STORE_F32, ws.data(), wsb, &be),
              "backward (gw f32)");
    lib_check(rmsnorm_backward(&pr.p, pr.x.data(), cols, pr.w.data(), pr.gy.data(), cols, nullptr, gx2.data(), cols,
                               gw.data(), RMSNORM_GW_STORE, ws.data(), wsb, &be),
              "backward (gw in dtype, rstd recomputed)");
  }
  if (!run_checks(pr, library_outputs(pr, y, gx, gx2, gw32, gw), rep)) {
    if (!cfg.json.empty()) write_json(cfg, rep, false);
    return 1;
  }

  if (rows == 0) {
    std::printf("timing: nothing to time (rows = 0)\n");
  } else {
    auto fwd = [&] {
      lib_check(rmsnorm_forward(&pr.p, pr.x.data(), cols, pr.w.data(), y.data(), cols, nullptr, &be), "forward");
    };
    auto vjp = [&] {
      lib_check(rmsnorm_backward(&pr.p, pr.x.data(), cols, pr.w.data(), pr.gy.data(), cols, rstd.data(), gx.data(),
                                 cols, gw.data(), RMSNORM_GW_STORE, ws.data(), wsb, &be),
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
  }
  if (!cfg.json.empty()) write_json(cfg, rep, true);
  return 0;
}

// ---- CUDA -----------------------------------------------------------------------------------------------

#if defined(RMSNORM_WITH_CUDA)

using rmsnorm::harness::DeviceBuffer;

// One rotated copy of the row-sized operands.
struct DeviceSet {
  DeviceBuffer x, gy, y, gx, rstd;
};

void to_host(HostMatrix& h, const DeviceBuffer& d) {
  if (h.data_bytes() > 0) CUDA_CHECK(cudaMemcpy(h.data(), d.get(), h.data_bytes(), cudaMemcpyDeviceToHost));
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
  return make_timing(name, bytes, us);
}

rmsnorm::BackwardArgs two_pass_args(const Problem& pr, const DeviceSet& s, const void* w, void* gw) {
  rmsnorm::BackwardArgs a;
  a.rows = pr.cfg.rows;
  a.cols = pr.cfg.cols;
  a.dtype = static_cast<rmsnorm::DType>(pr.cfg.dtype);
  a.eps = pr.cfg.eps;
  a.x = s.x.get();
  a.x_stride = pr.cfg.cols;
  a.weight = w;
  a.gy = s.gy.get();
  a.gy_stride = pr.cfg.cols;
  a.rstd = s.rstd.as<float>();
  a.gx = s.gx.get();
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
  // and half of the free memory; one set when there are no rows.
  const size_t set_bytes = 4 * mat + static_cast<size_t>(rows) * sizeof(float);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (set_bytes > free_b) die("not enough device memory for one input set");
  if (set_bytes > 0) {
    const size_t want = (size_t{256} << 20) / set_bytes + 1;
    const size_t fit = std::max<size_t>(1, free_b / 2 / set_bytes);
    rep.input_sets = static_cast<int>(std::min<size_t>({want, fit, 64}));
  }

  size_t ws_store = 0, ws_f32 = 0;
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE, &be, &ws_store), "workspace query");
  lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE_F32, &be, &ws_f32), "workspace query");
  rep.fused_workspace_bytes = static_cast<double>(ws_store);
  DeviceBuffer ws(std::max(ws_store, ws_f32));
  DeviceBuffer w(vec), gw(vec), gw32(static_cast<size_t>(cols) * 4);

  std::vector<DeviceSet> sets;
  {
    Progress progress("allocating and filling " + std::to_string(rep.input_sets) + " input sets on the device");
    auto copy = [&](void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
      if (n > 0) CUDA_CHECK(cudaMemcpy(dst, src, n, kind));
    };
    // NaN everywhere an output goes: anything left unwritten fails the check.
    auto poison = [&](const DeviceBuffer& b) {
      if (b.bytes() > 0) CUDA_CHECK(cudaMemset(b.get(), 0xFF, b.bytes()));
    };
    for (int i = 0; i < rep.input_sets; ++i) {
      DeviceSet s;
      s.x = DeviceBuffer(mat);
      s.gy = DeviceBuffer(mat);
      s.y = DeviceBuffer(mat);
      s.gx = DeviceBuffer(mat);
      s.rstd = DeviceBuffer(static_cast<size_t>(rows) * sizeof(float));
      const bool first = i == 0;
      copy(s.x.get(), first ? pr.x.data() : sets[0].x.get(), mat, first ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
      copy(s.gy.get(), first ? pr.gy.data() : sets[0].gy.get(), mat, first ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
      poison(s.y);
      poison(s.gx);
      poison(s.rstd);
      sets.push_back(std::move(s));
    }
    copy(w.get(), pr.w.data(), vec, cudaMemcpyHostToDevice);
    poison(gw);
    poison(gw32);
    // The set-up above ran on the legacy default stream, which a non-blocking
    // stream does not wait for; everything below runs on `stream`.
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  // ---- correctness guard on set 0 ----
  const DeviceSet& s0 = sets[0];
  HostMatrix y = matrix_like(pr), gx = matrix_like(pr), gx2 = matrix_like(pr), gx_tp = matrix_like(pr);
  HostMatrix gw32_h = gw_vector(pr, RMSNORM_DTYPE_F32), gw_h = gw_vector(pr, cfg.dtype), gw_tp = gw_vector(pr, cfg.dtype);
  bool two_pass_ok = false;
  const size_t temp_bytes = rmsnorm::bench::two_pass_temp_bytes(rows, cols, static_cast<rmsnorm::DType>(cfg.dtype));
  rep.two_pass_temp_bytes = static_cast<double>(temp_bytes);
  DeviceBuffer temp;
  {
    Progress progress("running the library on the GPU");
    lib_check(rmsnorm_forward(&pr.p, s0.x.get(), cols, w.get(), s0.y.get(), cols, s0.rstd.as<float>(), &be), "forward");
    lib_check(rmsnorm_backward(&pr.p, s0.x.get(), cols, w.get(), s0.gy.get(), cols, s0.rstd.as<float>(), s0.gx.get(),
                               cols, gw32.get(), RMSNORM_GW_STORE_F32, ws.get(), ws.bytes(), &be),
              "backward (gw f32)");
    CUDA_CHECK(cudaStreamSynchronize(stream));
    to_host(y, s0.y);
    to_host(gx, s0.gx);
    CUDA_CHECK(cudaMemcpy(gw32_h.data(), gw32.get(), gw32.bytes(), cudaMemcpyDeviceToHost));
    if (mat > 0) CUDA_CHECK(cudaMemsetAsync(s0.gx.get(), 0xFF, mat, stream));
    lib_check(rmsnorm_backward(&pr.p, s0.x.get(), cols, w.get(), s0.gy.get(), cols, nullptr, s0.gx.get(), cols, gw.get(),
                               RMSNORM_GW_STORE, ws.get(), ws.bytes(), &be),
              "backward (gw in dtype, rstd recomputed)");
    CUDA_CHECK(cudaStreamSynchronize(stream));
    to_host(gx2, s0.gx);
    CUDA_CHECK(cudaMemcpy(gw_h.data(), gw.get(), vec, cudaMemcpyDeviceToHost));

    // The two-pass variant is checked too: a wrong baseline would make the
    // comparison meaningless.
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (rows == 0) {
      rep.two_pass_note = "not run: rows == 0";
    } else if (temp_bytes + (size_t{64} << 20) < free_b) {
      temp = DeviceBuffer(temp_bytes);
      CUDA_CHECK(cudaMemsetAsync(s0.gx.get(), 0xFF, mat, stream));
      CUDA_CHECK(cudaMemsetAsync(gw.get(), 0xFF, vec, stream));
      const rmsnorm_status_t st =
          rmsnorm::bench::backward_two_pass(two_pass_args(pr, s0, w.get(), gw.get()), temp.get(), stream);
      if (st == RMSNORM_STATUS_SUCCESS) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        to_host(gx_tp, s0.gx);
        CUDA_CHECK(cudaMemcpy(gw_tp.data(), gw.get(), vec, cudaMemcpyDeviceToHost));
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

  Outputs out = library_outputs(pr, y, gx, gx2, gw32_h, gw_h);
  if (two_pass_ok) {
    out.gx.push_back({"gx (two-pass)", &gx_tp});
    // Its temporary rounds every row's term to the dtype before the sum.
    out.gw.push_back({std::string("gw (two-pass, ") + dtype_name(cfg.dtype) + ")", &gw_tp,
                      rmsnorm::harness::half_ulp_rel(cfg.dtype)});
  }
  if (!run_checks(pr, out, rep)) {
    if (!cfg.json.empty()) write_json(cfg, rep, false);
    return 1;
  }
  if (rows == 0) {
    std::printf("timing: nothing to time (rows = 0)\n");
    sets.clear();
    CUDA_CHECK(cudaStreamDestroy(stream));
    if (!cfg.json.empty()) write_json(cfg, rep, true);
    return 0;
  }

  // ---- timing ----
  const int nsets = rep.input_sets;
  std::printf("timing: median of %d per-call event timings after warm-up, %d input set(s) rotated (%.1f MiB each)\n",
              rep.reps, nsets, static_cast<double>(set_bytes) / (1 << 20));
  auto set = [&](int i) -> const DeviceSet& { return sets[static_cast<size_t>(i)]; };
  rep.timings.push_back(time_cuda("copy", 2.0 * static_cast<double>(mat), rep.reps, nsets, stream, [&](int i) {
    CUDA_CHECK(cudaMemcpyAsync(set(i).y.get(), set(i).x.get(), mat, cudaMemcpyDeviceToDevice, stream));
  }));
  auto fwd = [&](int i, bool with_rstd) {
    const DeviceSet& s = set(i);
    lib_check(rmsnorm_forward(&pr.p, s.x.get(), cols, w.get(), s.y.get(), cols, with_rstd ? s.rstd.as<float>() : nullptr,
                              &be),
              "forward");
  };
  auto vjp = [&](int i) {
    const DeviceSet& s = set(i);
    lib_check(rmsnorm_backward(&pr.p, s.x.get(), cols, w.get(), s.gy.get(), cols, s.rstd.as<float>(), s.gx.get(), cols,
                               gw.get(), RMSNORM_GW_STORE, ws.get(), ws.bytes(), &be),
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
      lib_check(rmsnorm::bench::backward_two_pass(two_pass_args(pr, set(i), w.get(), gw.get()), temp.get(), stream),
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
  std::printf("\nbackward extra device memory: fused workspace %.2f MiB, two-pass temporary %.2f MiB\n",
              rep.fused_workspace_bytes / (1 << 20), rep.two_pass_temp_bytes / (1 << 20));
  const double vjp_ratio = ratio_of(rep, "vjp_two_pass", "vjp"), grad_ratio = ratio_of(rep, "grad_two_pass", "grad");
  if (std::isfinite(vjp_ratio)) std::printf("two-pass / fused VJP time: %.2fx\n", vjp_ratio);
  if (std::isfinite(grad_ratio)) std::printf("two-pass / fused grad time: %.2fx\n", grad_ratio);
  sets.clear();
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (!cfg.json.empty()) write_json(cfg, rep, true);
  return 0;
}

#endif  // RMSNORM_WITH_CUDA

// ---- fused operations (--op add | quant-fp8 | quant-int8) and mixed dtypes, either backend ----------------
//
// norm with --y-dtype / --weight-dtype: the forward and the backward with y, gy, the weight and gw in their
//        dtypes (checked against the float64 reference, each in its own dtype's tolerance).
// add:   h = R(x + residual) and y = rms_norm(h) * w (rmsnorm_add_forward; R the residual stream's dtype, T or
//        f32). Checked: every h exactly by the rule (the sum in fp32, one rounding to R), y against the float64
//        reference of h as stored.
// quant: q = quant(y) with per-row scales (rmsnorm_forward_quant, vLLM's rule: src/common/quant.hpp), rstd
//        written. Checked: rstd against the float64 reference; every scale and every q byte exactly by the rule
//        from y = T(x * rstd * w), the forward's formula for the rstd returned. With --group G: one scale per
//        block of G columns (rmsnorm_forward_block_quant, row-major, row stride nb = ceil(D / G); the last block
//        of a row may be shorter), each block's scale and q bytes checked exactly by the same rule applied to
//        that block alone.
// Timed: the one call, median over --reps after warm-up, bytes as the minimal ones (add: read x, residual, w,
// write h, y; quant: read x, w, write q and the scales, rows * nb * 4 bytes with --group). One input set (no
// rotation): at sizes under the L2 the times are the L2's.

// A buffer on the host or on the device, with copies to and from host memory.
class Buf {
 public:
  Buf(size_t bytes, bool cuda) : cuda_(cuda), bytes_(bytes) {
#if defined(RMSNORM_WITH_CUDA)
    if (cuda) {
      dev_ = rmsnorm::harness::DeviceBuffer(bytes);
      return;
    }
#endif
    host_.assign(bytes + 16, 0);
  }
  void* get() {
#if defined(RMSNORM_WITH_CUDA)
    if (cuda_) return dev_.get();
#endif
    return host_.data();
  }
  void upload(const void* src) {
    if (bytes_ == 0) return;
#if defined(RMSNORM_WITH_CUDA)
    if (cuda_) {
      CUDA_CHECK(cudaMemcpy(dev_.get(), src, bytes_, cudaMemcpyHostToDevice));
      return;
    }
#endif
    std::memcpy(host_.data(), src, bytes_);
  }
  void download(void* dst) {
    if (bytes_ == 0) return;
#if defined(RMSNORM_WITH_CUDA)
    if (cuda_) {
      CUDA_CHECK(cudaMemcpy(dst, dev_.get(), bytes_, cudaMemcpyDeviceToHost));
      return;
    }
#endif
    std::memcpy(dst, host_.data(), bytes_);
  }
  void poison() {  // 0xFF: NaN in every float dtype
#if defined(RMSNORM_WITH_CUDA)
    if (cuda_) {
      if (bytes_ > 0) CUDA_CHECK(cudaMemset(dev_.get(), 0xFF, bytes_));
      return;
    }
#endif
    std::fill(host_.begin(), host_.end(), static_cast<unsigned char>(0xFF));
  }

 private:
  bool cuda_;
  size_t bytes_;
  std::vector<unsigned char> host_;
#if defined(RMSNORM_WITH_CUDA)
  rmsnorm::harness::DeviceBuffer dev_;
#endif
};

int run_fused(const Config& cfg, bool cuda) {
  Report rep;
  rep.backend = cuda ? "cuda" : "cpu";
  rep.device = "host";
  rep.reps = cfg.reps > 0 ? cfg.reps : cuda ? 100 : 5;
  // The backend's rule as in run_cpu; only "norm" runs a backward here.
  rep.threads = rep.backward_threads = rmsnorm::threads_for(cfg.threads, cfg.rows, cfg.rows * cfg.cols);
  if (cfg.op == "norm") rep.backward_threads = rmsnorm::threads_for(cfg.threads, cfg.rows * cfg.cols, cfg.rows * cfg.cols);
  void* stream = nullptr;
#if defined(RMSNORM_WITH_CUDA)
  cudaStream_t cstream = nullptr;
  if (cuda) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    rep.device = prop.name;
    rep.sms = prop.multiProcessorCount;
    CUDA_CHECK(cudaRuntimeGetVersion(&rep.cuda_runtime));
    CUDA_CHECK(cudaDriverGetVersion(&rep.cuda_driver));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cstream, cudaStreamNonBlocking));
    stream = cstream;
  }
#endif
  const rmsnorm_backend_t be = cuda ? rmsnorm_backend_cuda(-1, stream) : rmsnorm_backend_cpu(cfg.threads);
  if (cfg.group > 0)
    std::printf("backend: %s, op %s, group %d (block scales: %" PRId64 " per row)\n", rep.backend.c_str(),
                cfg.op.c_str(), cfg.group, (cfg.cols + cfg.group - 1) / cfg.group);
  else
    std::printf("backend: %s, op %s\n", rep.backend.c_str(), cfg.op.c_str());
  Problem pr = make_problem(cfg);
  const int64_t rows = cfg.rows, cols = cfg.cols;
  const size_t mat = pr.elems * pr.esize, vec = static_cast<size_t>(cols) * rmsnorm_dtype_size(cfg.weight_dtype);
  const size_t rmat = pr.elems * rmsnorm_dtype_size(cfg.residual_dtype);
  const double nd = static_cast<double>(pr.elems), d = static_cast<double>(cols), e = static_cast<double>(pr.esize);
  const double we = static_cast<double>(rmsnorm_dtype_size(cfg.weight_dtype));
  const double re = static_cast<double>(rmsnorm_dtype_size(cfg.residual_dtype));
  Buf x(mat, cuda), w(vec, cuda), rstd(static_cast<size_t>(rows) * 4, cuda);
  x.upload(pr.x.data());
  w.upload(pr.w.data());
  rstd.poison();
  auto sync = [&] {
#if defined(RMSNORM_WITH_CUDA)
    if (cuda) CUDA_CHECK(cudaStreamSynchronize(cstream));
#endif
  };
  // Buf's uploads and poisons run on the legacy default stream, which the library's non-blocking stream does not
  // wait for: every set-up copy and memset has finished before the first call.
  auto settle = [&] {
#if defined(RMSNORM_WITH_CUDA)
    if (cuda) CUDA_CHECK(cudaDeviceSynchronize());
#endif
  };
  auto timed = [&](const std::string& name, double bytes, const std::function<void()>& call) {
#if defined(RMSNORM_WITH_CUDA)
    if (cuda) return time_cuda(name, bytes, rep.reps, 1, cstream, [&](int) { call(); });
#endif
    return time_cpu(name, bytes, rep.reps, call);
  };
  bool ok = true;
  // rstd (downloaded to rh) against the float64 1 / sqrt(mean(m^2) + eps) of each row of m.
  auto rstd_check = [&](const char* name, const HostMatrix& m, const std::vector<float>& rh) {
    CheckResult cr;
    cr.name = name;
    cr.vector = false;
    for (int64_t i = 0; i < rows; ++i) {
      double ss = 0;
      for (int64_t k = 0; k < cols; ++k) ss += m.get(i, k) * m.get(i, k);
      const double r_ref = 1.0 / std::sqrt(ss / static_cast<double>(cols) + static_cast<double>(cfg.eps));
      cr.worst.add(i, 0, rh[static_cast<size_t>(i)], r_ref, rmsnorm::harness::rstd_tol(r_ref, cols));
    }
    return cr;
  };
  auto report = [&](CheckResult c) {
    if (!c.worst.passed()) {
      std::fprintf(stderr, "rmsnorm: CHECK FAILED: %s\n", c.worst.describe(c.name, c.vector).c_str());
      ok = false;
    }
    rep.checks.push_back(std::move(c));
  };

  if (cfg.op == "norm") {
    // Mixed dtypes (main sends the plain norm to run_cpu / run_cuda): y and gy in --y-dtype, the weight and gw in
    // --weight-dtype. Checked: y, gx (rstd given) and gw against the float64 reference, each in its own dtype.
    const size_t ymat = pr.elems * rmsnorm_dtype_size(cfg.y_dtype);
    Buf y(ymat, cuda), gy(ymat, cuda), gx(mat, cuda), gw(vec, cuda);
    gy.upload(pr.gy.data());
    y.poison();
    gx.poison();
    gw.poison();
    size_t wsb = 0;
    lib_check(rmsnorm_backward_workspace_size(&pr.p, RMSNORM_GW_STORE, &be, &wsb), "workspace query");
    Buf ws(wsb, cuda);
    rep.fused_workspace_bytes = static_cast<double>(wsb);
    float* r = static_cast<float*>(rstd.get());
    // The timed forward writes no rstd, as run_cpu's and run_cuda's; the checked one does, for the backward.
    auto fwd = [&](float* out_rstd) {
      lib_check(rmsnorm_forward(&pr.p, x.get(), cols, w.get(), y.get(), cols, out_rstd, &be), "forward");
    };
    auto vjp = [&] {
      lib_check(rmsnorm_backward(&pr.p, x.get(), cols, w.get(), gy.get(), cols, r, gx.get(), cols, gw.get(),
                                 RMSNORM_GW_STORE, wsb > 0 ? ws.get() : nullptr, wsb, &be),
                "backward");
    };
    {
      Progress progress("running the mixed-dtype forward and backward and checking them");
      settle();
      fwd(r);
      vjp();
      sync();
      HostMatrix yh(cfg.y_dtype, rows, cols), gxh = matrix_like(pr), gwh(cfg.weight_dtype, 1, cols);
      y.download(yh.data());
      gx.download(gxh.data());
      gw.download(gwh.data());
      rmsnorm::reference::Options opt;
      opt.eps = static_cast<double>(cfg.eps);
      Outputs out;
      out.y_name = std::string("y (forward, ") + dtype_name(cfg.y_dtype) + ")";
      out.y = &yh;
      out.gx.push_back({"gx", &gxh});
      out.gw.push_back({std::string("gw (") + dtype_name(cfg.weight_dtype) + ")", &gwh, 0.0});
      for (CheckResult& c : rmsnorm::harness::check_against_reference(pr.x, &pr.w, &pr.gy, opt, out))
        report(std::move(c));
    }
    print_checks(rep.checks);
    if (rows == 0) std::printf("timing: nothing to time (rows = 0)\n");
    if (ok && rows > 0) {
      rep.timings.push_back(timed("forward", pr.fwd_bytes, [&] { fwd(nullptr); }));
      rep.timings.push_back(timed("vjp", pr.vjp_bytes, vjp));
    }
  } else if (cfg.op == "add") {
    HostMatrix res(cfg.residual_dtype, rows, cols);
    rmsnorm::harness::fill_normal(res, cfg.seed + 3);
    Buf r(rmat, cuda), h(rmat, cuda), y(mat, cuda);
    r.upload(res.data());
    h.poison();
    y.poison();
    auto call = [&] {
      lib_check(rmsnorm_add_forward(&pr.p, x.get(), cols, r.get(), cols, w.get(), h.get(), cols, y.get(), cols,
                                    static_cast<float*>(rstd.get()), &be),
                "add forward");
    };
    {
      Progress progress("running the residual add and checking it");
      settle();
      call();
      sync();
      HostMatrix hh(cfg.residual_dtype, rows, cols), yh = matrix_like(pr);
      h.download(hh.data());
      y.download(yh.data());
      CheckResult ch;
      ch.name = "h (exact)";
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t k = 0; k < cols; ++k)
          ch.worst.add(i, k, hh.get(i, k),
                       rmsnorm::harness::round_to(cfg.residual_dtype, static_cast<float>(pr.x.get(i, k)) +
                                                                          static_cast<float>(res.get(i, k))),
                       0.0);
      report(std::move(ch));
      rmsnorm::reference::Options opt;
      opt.eps = static_cast<double>(cfg.eps);
      Outputs out;
      out.y_name = "y (forward of h)";
      out.y = &yh;
      for (CheckResult& c : rmsnorm::harness::check_against_reference(hh, &pr.w, nullptr, opt, out))
        report(std::move(c));
      std::vector<float> rh(static_cast<size_t>(rows));
      rstd.download(rh.data());
      report(rstd_check("rstd (of h)", hh, rh));
    }
    print_checks(rep.checks);
    if (rows == 0) std::printf("timing: nothing to time (rows = 0)\n");
    if (ok && rows > 0) rep.timings.push_back(timed("add forward", 2 * nd * (e + re) + d * we, call));
  } else {
    const bool fp8 = cfg.op == "quant-fp8";
    // Per row: one block of all the columns, scales[i]. --group: nb blocks of `group` columns (the last may be
    // shorter), row-major, block b of row i at scales[i * nb + b].
    const bool blocks = cfg.group > 0;
    const int64_t bc = blocks ? cfg.group : cols, nb = blocks ? (cols + bc - 1) / bc : 1;
    const size_t nscales = static_cast<size_t>(rows) * static_cast<size_t>(nb);
    Buf q(pr.elems, cuda), scales(nscales * 4, cuda);
    q.poison();
    scales.poison();
    const int32_t kind = fp8 ? RMSNORM_QUANT_FP8_E4M3 : RMSNORM_QUANT_INT8;
    rmsnorm_quant_t qt{kind, RMSNORM_QUANT_PER_ROW, nullptr, static_cast<float*>(scales.get()), nullptr};
    rmsnorm_block_quant_t bq{kind, cfg.group, static_cast<float*>(scales.get()), nb, 1, nullptr};
    auto call = [&] {
      if (blocks)
        lib_check(rmsnorm_forward_block_quant(&pr.p, x.get(), cols, w.get(), &bq, q.get(), cols,
                                              static_cast<float*>(rstd.get()), &be),
                  "block-quantized forward");
      else
        lib_check(rmsnorm_forward_quant(&pr.p, x.get(), cols, w.get(), &qt, q.get(), cols,
                                        static_cast<float*>(rstd.get()), &be),
                  "quantized forward");
    };
    {
      Progress progress("running the quantized forward and checking it");
      settle();
      call();
      sync();
      std::vector<uint8_t> qh(pr.elems);
      std::vector<float> sh(nscales), rh(static_cast<size_t>(rows));
      q.download(qh.data());
      scales.download(sh.data());
      rstd.download(rh.data());
      report(rstd_check("rstd", pr.x, rh));
      CheckResult cs, cq;
      cs.name = blocks ? "block scales (exact)" : "row scales (exact)";  // col: the block
      cq.name = "q (exact)";
      std::vector<float> yrow(static_cast<size_t>(cols));
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t k = 0; k < cols; ++k) {
          const float xh = static_cast<float>(pr.x.get(i, k)) * rh[static_cast<size_t>(i)];
          yrow[static_cast<size_t>(k)] =
              static_cast<float>(rmsnorm::harness::round_to(cfg.dtype, xh * static_cast<float>(pr.w.get(0, k))));
        }
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t k0 = b * bc, k1 = std::min(cols, k0 + bc);
          float amax = 0.0f;
          for (int64_t k = k0; k < k1; ++k) amax = std::fmax(amax, std::fabs(yrow[static_cast<size_t>(k)]));
          const float s = rmsnorm::quant::row_scale(amax, nullptr, fp8);
          cs.worst.add(i, b, sh[static_cast<size_t>(i * nb + b)], s, 0.0);
          for (int64_t k = k0; k < k1; ++k) {
            const float v = yrow[static_cast<size_t>(k)];
            const int want = fp8 ? rmsnorm::quant::fp8_e4m3_saturated(v / s)
                                 : static_cast<uint8_t>(rmsnorm::quant::int8_saturated(v * (1.0f / s)));
            cq.worst.add(i, k, qh[static_cast<size_t>(i * cols + k)], want, 0.0);
          }
        }
      }
      report(std::move(cs));
      report(std::move(cq));
    }
    print_checks(rep.checks);
    if (rows == 0) std::printf("timing: nothing to time (rows = 0)\n");
    // Read x, w; write q and the scales (one per row, or rows * nb with --group).
    const std::string name = blocks ? cfg.op + " (group " + std::to_string(cfg.group) + ")" : cfg.op;
    if (ok && rows > 0)
      rep.timings.push_back(timed(name, nd * e + nd + 4.0 * static_cast<double>(nscales) + d * we, call));
  }
  if (!rep.timings.empty()) print_timings(rep);
#if defined(RMSNORM_WITH_CUDA)
  if (cuda) CUDA_CHECK(cudaStreamDestroy(cstream));
#endif
  if (!cfg.json.empty()) write_json(cfg, rep, ok);
  return ok ? 0 : 1;
}

// Why a CUDA call is refused: the library's message ("this build has no CUDA
// backend" or "no CUDA device is present"), with the runtime's own error
// where this CLI was built with CUDA (no device, or a missing or too old
// driver).
std::string cuda_unavailable_reason() {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = 1;
  p.cols = 1;
  const rmsnorm_backend_t be = rmsnorm_backend_cuda(-1, nullptr);
  size_t bytes = 0;
  const rmsnorm_status_t s = rmsnorm_backward_workspace_size(&p, RMSNORM_GW_NONE, &be, &bytes);
  std::string why = s == RMSNORM_STATUS_SUCCESS ? "the library reports no usable GPU"
                                                : std::string(rmsnorm_status_string(s)) + ": " + rmsnorm_last_error();
#if defined(RMSNORM_WITH_CUDA)
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why += std::string(" (no GPU or driver visible: cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
           cudaGetErrorString(e) + ")";
    cudaGetLastError();
  }
#else
  why += " (this rmsnorm was configured without the CUDA toolkit)";
#endif
  return why;
}

// The inputs and every downloaded output.
double io_host_bytes(const Config& cfg, bool cuda) {
  const double n = static_cast<double>(cfg.rows) * static_cast<double>(cfg.cols);
  const double e = rmsnorm_dtype_size(cfg.dtype), ye = rmsnorm_dtype_size(cfg.y_dtype);
  const double re = rmsnorm_dtype_size(cfg.residual_dtype);
  if (cfg.op == "norm" && !cfg.mixed()) return n * e * (cuda ? 6 : 5);  // x, gy, y, gx, gx (rstd recomputed) [, gx (two-pass)]
  // run_fused: the inputs (x, gy), and per op its host buffers (on the CPU backend also the library's copies of
  // every operand) and the downloads checked.
  const double in = n * (e + ye);
  if (cfg.op == "norm") return in + n * (ye + e) * (cuda ? 1 : 3);        // y, gx [, x, gy as the library's operands]
  if (cfg.op == "add") return in + n * (2 * re + e) * (cuda ? 1 : 2) + n * e;  // residual, h, y [+ their Bufs], x's Buf
  // q [+ its Buf], x's Buf, and with --group the block scales (4 bytes per group, downloaded [+ their Buf])
  const double scales = cfg.group > 0 ? 4.0 * static_cast<double>(cfg.rows) *
                                            static_cast<double>((cfg.cols + cfg.group - 1) / cfg.group) * (cuda ? 1 : 2)
                                      : 0.0;
  return in + n * (cuda ? 1 : 2) + n * e + scales;
}

// Host bytes the run keeps at its peak: the inputs and outputs, the vectors
// (the weight, both gw and the backward's workspace: about 8 bytes per column
// at few rows), and the float64 reference check's buffers beside them. At one
// row of 2^24 f16 columns this is 106 bytes per column, against a measured
// peak of 118.
double host_bytes(const Config& cfg, bool cuda) {
  const double vectors = static_cast<double>(cfg.cols) * (2.0 * rmsnorm_dtype_size(cfg.dtype) + 4.0 + 8.0);
  return io_host_bytes(cfg, cuda) + vectors +
         static_cast<double>(rmsnorm::harness::check_host_bytes(cfg.rows, cfg.cols));
}

// Physical memory, or 0 where unknown. A run that needs more is refused up
// front: with overcommit the allocations succeed and the kernel kills the
// process later, with no message.
double physical_memory_bytes() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<double>(pages) * static_cast<double>(page);
#endif
  return 0;
}

[[noreturn]] void out_of_host_memory(const Config& cfg, bool cuda, const std::string& detail) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "out of host memory: %" PRId64 " x %" PRId64 " %s keeps about %.1f GiB on the host%s",
                cfg.rows, cfg.cols, dtype_name(cfg.dtype), host_bytes(cfg, cuda) / (1u << 30), detail.c_str());
  die(std::string(buf) + "; try fewer rows or columns");
}

}  // namespace

int main(int argc, char** argv) {
  const Config cfg = parse_args(argc, argv);
  if (!cfg.json.empty()) {
    const std::string err = rmsnorm::harness::json_file_error(cfg.json);
    if (!err.empty()) die("--json: " + err);
  }
  std::printf("rmsnorm %d.%d.%d: %" PRId64 " x %" PRId64 " %s, eps %g\n", RMSNORM_VERSION_MAJOR,
              RMSNORM_VERSION_MINOR, RMSNORM_VERSION_PATCH, cfg.rows, cfg.cols, dtype_name(cfg.dtype),
              static_cast<double>(cfg.eps));
  if (cfg.mixed())
    std::printf("mixed dtypes: y %s, weight %s, residual stream %s\n", dtype_name(cfg.y_dtype),
                dtype_name(cfg.weight_dtype), dtype_name(cfg.residual_dtype));
  const bool cuda = rmsnorm_cuda_available() != 0;
  if (cfg.backend == "cuda" && !cuda) die("--backend cuda: the CUDA backend is not available: " + cuda_unavailable_reason());
  const bool on_gpu = cuda && cfg.backend != "cpu";
  const double phys = physical_memory_bytes();
  if (phys > 0 && host_bytes(cfg, on_gpu) > phys) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", this machine has %.1f GiB", phys / (1u << 30));
    out_of_host_memory(cfg, on_gpu, buf);
  }
  try {
#if !defined(RMSNORM_WITH_CUDA)
    if (on_gpu) die("the library reports CUDA but this CLI was built without it; rebuild both together");
#endif
    if (cfg.op != "norm" || cfg.mixed()) return run_fused(cfg, on_gpu);
    if (on_gpu) {
#if defined(RMSNORM_WITH_CUDA)
      return run_cuda(cfg);
#else
      die("the library reports CUDA but this CLI was built without it; rebuild both together");
#endif
    }
    return run_cpu(cfg);
  } catch (const std::bad_alloc&) {
    out_of_host_memory(cfg, on_gpu, ", and an allocation failed");
  } catch (const std::exception& e) {
    die(e.what());
  }
}
