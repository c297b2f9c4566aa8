// GPU tests of the CUDA backend against the float64 reference (and the CPU
// backend). Skipped, with a message, when no CUDA device is present (CI).
//
// Every check: fresh random inputs (never zeros), outputs and workspace
// poisoned with NaN bytes, a kernel that fills shared memory with NaN run
// just before the launch under test (stale shared memory), every element
// compared, the worst one printed. Sizes are chosen per dispatch band
// (plan.hpp): kRows D <= 16384 at 16-bit / 8192 at fp32 (tpr 1..512),
// kCluster above that up to 131072 / 65536 (twice that with clusters of
// 16), kLooped above.
#include <cuda.h>  // green-context types; the functions come through cudaGetDriverEntryPointByVersion
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <string>
#include <thread>
#include <utility>
#include <random>
#include <vector>

#include "common/quant.hpp"
#include "cuda/cuda_backend.hpp"
#include "plan.hpp"
#include "rmsnorm/rmsnorm.h"
#include "rmsnorm_reference.hpp"
#include "test_util.hpp"
#include "cuda_poison.cuh"

namespace rmsnorm::test {
namespace {

#define CUDA_OK(call) ASSERT_EQ(cudaSuccess, (call)) << #call << ": " << cudaGetErrorString(cudaGetLastError())

bool gpu_present() { return rmsnorm_cuda_available() == 1; }

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
  }
};
using CudaSanitizer = Cuda;  // small shapes over every band, run under compute-sanitizer

// ---- device memory ----------------------------------------------------------------------------

// One device arena per process, bump-allocated per check and reset after,
// so the sweeps do not pay cudaMalloc per case.
class Arena {
 public:
  static Arena& get() {
    static Arena a;
    return a;
  }
  void* alloc(size_t bytes) {
    bytes = (bytes + 255) / 256 * 256;
    if (used_ + bytes > cap_) grow(used_ + bytes);
    void* p = static_cast<char*>(base_) + used_;
    used_ += bytes;
    return p;
  }
  // Ends a case: blocks outgrown during it are freed only now, since the
  // case's earlier allocations still live in them.
  void reset() {
    for (void* p : retired_) cudaFree(p);
    retired_.clear();
    used_ = 0;
  }

 private:
  void grow(size_t need) {
    if (base_ != nullptr) retired_.push_back(base_);
    cap_ = std::max(need, cap_ * 2 + (size_t{256} << 20));
    if (cudaMalloc(&base_, cap_) != cudaSuccess) {
      base_ = nullptr;
      cap_ = 0;
      throw std::runtime_error("cudaMalloc failed");
    }
    used_ = 0;
  }
  void* base_ = nullptr;
  size_t cap_ = 0, used_ = 0;
  std::vector<void*> retired_;
};

// A device copy of a HostMatrix's whole storage (offset and poison included).
// upload waits for the copy to land: a cudaMemcpy from pageable memory may
// return before its DMA completes, and only the legacy default stream is
// ordered after it, not the non-blocking streams of the graph and green-context
// tests (the graph test once saw gx differ between its eager run and the
// replays, only gx, the last upload before that eager run).
struct Dev {
  void* base = nullptr;
  size_t bytes = 0;
  int64_t offset_bytes = 0;
  void* data() const { return static_cast<char*>(base) + offset_bytes; }
};

Dev upload(const HostMatrix& m) {
  Dev d;
  d.bytes = m.storage.size();
  d.base = Arena::get().alloc(d.bytes);
  d.offset_bytes = m.offset * static_cast<int64_t>(m.esize());
  if (cudaMemcpy(d.base, m.storage.data(), d.bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess)
    throw std::runtime_error("upload failed");
  return d;
}

void download(const Dev& d, HostMatrix& m) {
  if (cudaMemcpy(m.storage.data(), d.base, d.bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    throw std::runtime_error("download failed");
}

rmsnorm_backend_t cuda_backend() { return rmsnorm_backend_cuda(-1, nullptr); }

// ---- cases --------------------------------------------------------------------------------------

enum class Layout { kAligned, kOffset, kPadded };

struct Case {
  int32_t dtype = RMSNORM_DTYPE_BF16;
  int64_t rows = 3, cols = 64;
  Layout layout = Layout::kAligned;
  bool weight = true;
  bool weight_offset = false;
  bool round_xhat = false;
  bool with_rstd = true;  // forward writes rstd; backward reads it
  bool hetero = false;    // neighbouring rows scaled 1e-3 .. 1e3
  float eps = 1e-5f;
  int32_t gw_mode = RMSNORM_GW_STORE;
  bool compare_cpu = false;
  bool weight_f32 = false;  // RMSNORM_FLAG_WEIGHT_F32: Inputs::w is then an fp32 matrix
  int q_layout = -1;        // the quantized output's Layout; -1: x's
};

std::string describe(const Case& c) {
  std::ostringstream os;
  os << dtype_name(c.dtype) << " " << c.rows << "x" << c.cols << " layout "
     << (c.layout == Layout::kAligned ? "aligned" : c.layout == Layout::kOffset ? "offset+1" : "padded")
     << (c.weight ? " weight" : " no-weight") << (c.weight_offset ? " +1" : "") << (c.round_xhat ? " round" : "")
     << (c.weight_f32 ? " weight-f32" : "") << (c.with_rstd ? " rstd" : "") << (c.hetero ? " hetero" : "") << " eps " << c.eps << " gw_mode " << c.gw_mode;
  return os.str();
}

int64_t stride_of(const Case& c) { return c.layout == Layout::kPadded ? c.cols + 1 + c.cols % 7 : c.cols; }
int64_t offset_of(const Case& c) { return c.layout == Layout::kOffset ? 1 : 0; }

double row_scale(const Case& c, int64_t r) {
  static const double kScales[] = {1e-3, 1e3, 1.0, 3e-2, 30.0, 1e-1, 5e2};
  return c.hetero ? kScales[r % 7] : 1.0;
}

reference::Options ref_options(const Case& c) {
  reference::Options o;
  o.eps = static_cast<double>(c.eps);
  o.weight_offset = c.weight_offset;
  return o;
}

rmsnorm_problem_t problem_of(const Case& c) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = c.rows;
  p.cols = c.cols;
  p.dtype = c.dtype;
  p.eps = c.eps;
  p.flags = (c.weight_offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0u) | (c.round_xhat ? RMSNORM_FLAG_ROUND_XHAT : 0u) |
            (c.weight_f32 ? RMSNORM_FLAG_WEIGHT_F32 : 0u);
  return p;
}

struct Inputs {
  HostMatrix x, w, gy;
};

Inputs make_inputs(const Case& c, std::mt19937_64& rng) {
  Inputs in;
  in.x = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
  fill_random(in.x, rng, [&](int64_t r) { return row_scale(c, r); });
  in.w = HostMatrix(c.weight_f32 ? RMSNORM_DTYPE_F32 : c.dtype, 1, c.cols, c.cols, offset_of(c));
  fill_random(in.w, rng);
  in.gy = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
  fill_random(in.gy, rng);
  return in;
}

// Forward on the GPU; returns y and rstd (host copies).
void gpu_forward(const Case& c, const Inputs& in, HostMatrix* y, std::vector<float>* rstd) {
  Arena::get().reset();
  *y = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));  // NaN-poisoned
  const Dev dx = upload(in.x), dw = upload(in.w), dy = upload(*y);
  float* drstd = nullptr;
  if (c.with_rstd) {
    drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
    ASSERT_EQ(cudaSuccess, cudaMemset(drstd, 0xFF, static_cast<size_t>(c.rows) * 4));
  }
  poison_shared_memory();
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t b = cuda_backend();
  const rmsnorm_status_t st =
      rmsnorm_forward(&p, dx.data(), stride_of(c), c.weight ? dw.data() : nullptr, dy.data(), stride_of(c), drstd, &b);
  ASSERT_EQ(st, RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  download(dy, *y);
  EXPECT_TRUE(padding_untouched("y", *y));
  rstd->assign(static_cast<size_t>(c.rows), NAN);
  if (c.with_rstd) CUDA_OK(cudaMemcpy(rstd->data(), drstd, static_cast<size_t>(c.rows) * 4, cudaMemcpyDeviceToHost));
}

void check_forward(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const Inputs in = make_inputs(c, rng);
  HostMatrix y;
  std::vector<float> rstd;
  gpu_forward(c, in, &y, &rstd);
  if (::testing::Test::HasFatalFailure()) return;

  const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<double> yr(n), xh(n), rr(static_cast<size_t>(c.rows));
  reference::forward(c.rows, c.cols, xd.data(), c.weight ? wd.data() : nullptr, ref_options(c), yr.data(), rr.data(),
                     xh.data());
  auto wprime = [&](int64_t col) { return c.weight ? wd[col] + (c.weight_offset ? 1.0 : 0.0) : 1.0; };
  if (c.round_xhat) {
    std::vector<double> ref2(n);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.cols; ++k)
        ref2[r * c.cols + k] = round_to(c.dtype, round_to(c.dtype, xh[r * c.cols + k]) * wprime(k));
    EXPECT_TRUE(check_matrix("y (round_xhat)", y, ref2, [&](int64_t r, int64_t k) {
      return y_round_xhat_tol(c.dtype, ref2[r * c.cols + k], xh[r * c.cols + k], wprime(k), c.cols);
    }));
  } else {
    EXPECT_TRUE(check_matrix("y", y, yr, [&](int64_t r, int64_t k) { return y_tol(c.dtype, yr[r * c.cols + k], c.cols); }));
  }
  if (c.with_rstd)
    EXPECT_TRUE(check_vector(
        "rstd", c.rows, [&](int64_t r) { return static_cast<double>(rstd[r]); }, rr,
        [&](int64_t r) { return rstd_tol(rr[r], c.cols); }));

  if (c.compare_cpu) {
    HostMatrix ycpu(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
    const rmsnorm_problem_t p = problem_of(c);
    const rmsnorm_backend_t cpu = rmsnorm_backend_cpu(0);
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, in.x.data(), stride_of(c), c.weight ? in.w.data() : nullptr,
                                                      ycpu.data(), stride_of(c), nullptr, &cpu));
    const std::vector<double> yc = ycpu.to_double();
    // Both sit within the reference tolerance, so they agree within twice it.
    EXPECT_TRUE(check_matrix("y vs CPU backend", y, yc, [&](int64_t r, int64_t k) {
      return 2 * (c.round_xhat ? y_round_xhat_tol(c.dtype, yr[r * c.cols + k], xh[r * c.cols + k], wprime(k), c.cols)
                               : y_tol(c.dtype, yr[r * c.cols + k], c.cols));
    }));
  }
}

struct BackwardOut {
  HostMatrix gx;
  std::vector<double> gw;      // as stored (converted to double)
  std::vector<double> gw_old;  // accumulate modes: the initial gw
};

// gw's dtype: fp32 in the _F32 modes, and in every mode with an fp32 weight (RMSNORM_FLAG_WEIGHT_F32: the
// weight's dtype).
bool gw_in_f32(const Case& c) {
  return c.weight_f32 || c.gw_mode == RMSNORM_GW_STORE_F32 || c.gw_mode == RMSNORM_GW_ACCUMULATE_F32;
}

// Where gx goes: its own buffer, over g_h, or over gy (the in-place forms rmsnorm_add_backward allows).
enum class GxOver { kNone, kGh, kGy };

// g_h: rmsnorm_add_backward with that residual gradient (its layout c's), gx written over it or over gy where
// `over` says.
void gpu_backward(const Case& c, const Inputs& in, const std::vector<float>& rstd, BackwardOut* out,
                  std::mt19937_64& rng, const HostMatrix* g_h = nullptr, GxOver over = GxOver::kNone) {
  Arena::get().reset();
  out->gx = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
  const Dev dx = upload(in.x), dw = upload(in.w), dgy = upload(in.gy);
  const Dev dgh = g_h != nullptr ? upload(*g_h) : Dev{};
  const Dev dgx = over == GxOver::kGh ? dgh : over == GxOver::kGy ? dgy : upload(out->gx);
  const bool f32 = gw_in_f32(c);
  const bool accumulate = c.gw_mode == RMSNORM_GW_ACCUMULATE || c.gw_mode == RMSNORM_GW_ACCUMULATE_F32;
  HostMatrix gw(f32 ? RMSNORM_DTYPE_F32 : c.dtype, 1, c.cols);
  if (accumulate) fill_random(gw, rng);
  out->gw_old = gw.to_double();
  const Dev dgw = upload(gw);
  float* drstd = nullptr;
  if (c.with_rstd) {
    drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
    CUDA_OK(cudaMemcpy(drstd, rstd.data(), static_cast<size_t>(c.rows) * 4, cudaMemcpyHostToDevice));
  }
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t b = cuda_backend();
  const int32_t mode = c.weight ? c.gw_mode : RMSNORM_GW_NONE;
  size_t ws_bytes = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, mode, &b, &ws_bytes)) << rmsnorm_last_error();
  void* ws = ws_bytes > 0 ? Arena::get().alloc(ws_bytes) : nullptr;
  if (ws != nullptr) CUDA_OK(cudaMemset(ws, 0xFF, ws_bytes));
  poison_shared_memory();
  const rmsnorm_status_t st =
      g_h == nullptr
          ? rmsnorm_backward(&p, dx.data(), stride_of(c), c.weight ? dw.data() : nullptr, dgy.data(), stride_of(c),
                             drstd, dgx.data(), stride_of(c), mode == RMSNORM_GW_NONE ? nullptr : dgw.data(), mode, ws,
                             ws_bytes, &b)
          : rmsnorm_add_backward(&p, dx.data(), stride_of(c), c.weight ? dw.data() : nullptr, dgy.data(),
                                 stride_of(c), drstd, dgh.data(), stride_of(c), dgx.data(), stride_of(c),
                                 mode == RMSNORM_GW_NONE ? nullptr : dgw.data(), mode, ws, ws_bytes, &b);
  ASSERT_EQ(st, RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  download(dgx, out->gx);
  download(dgw, gw);
  EXPECT_TRUE(padding_untouched("gx", out->gx));
  EXPECT_TRUE(padding_untouched("gw (the slack after it)", gw));
  out->gw = gw.to_double();
}

void expect_backward_matches_reference(const Case& c, const Inputs& in, const BackwardOut& out,
                                       const BackwardOut* cpu = nullptr);

// The CPU backend's gx and gw for the same inputs, rstd and gw mode (the
// accumulate modes start from the GPU call's initial gw).
void cpu_backward(const Case& c, const Inputs& in, const std::vector<float>& rstd, const BackwardOut& gpu,
                  BackwardOut* out) {
  out->gx = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));  // NaN-poisoned
  const bool f32 = gw_in_f32(c);
  HostMatrix gw(f32 ? RMSNORM_DTYPE_F32 : c.dtype, 1, c.cols);
  for (int64_t k = 0; k < c.cols; ++k) gw.set(0, k, gpu.gw_old[k]);
  out->gw_old = gpu.gw_old;
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t cpu = rmsnorm_backend_cpu(0);
  const int32_t mode = c.weight ? c.gw_mode : RMSNORM_GW_NONE;
  size_t ws_bytes = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, mode, &cpu, &ws_bytes)) << rmsnorm_last_error();
  std::vector<unsigned char> ws(ws_bytes + 1);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_backward(&p, in.x.data(), stride_of(c), c.weight ? in.w.data() : nullptr, in.gy.data(),
                             stride_of(c), c.with_rstd ? rstd.data() : nullptr, out->gx.data(), stride_of(c),
                             mode == RMSNORM_GW_NONE ? nullptr : gw.data(), mode, ws_bytes > 0 ? ws.data() : nullptr,
                             ws_bytes, &cpu))
      << rmsnorm_last_error();
  out->gw = gw.to_double();
}

void check_backward(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const Inputs in = make_inputs(c, rng);
  const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double(), gyd = in.gy.to_double();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<double> rr(static_cast<size_t>(c.rows)), yr(n);
  reference::forward(c.rows, c.cols, xd.data(), c.weight ? wd.data() : nullptr, ref_options(c), yr.data(), rr.data(),
                     nullptr);
  std::vector<float> rstd(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) rstd[r] = static_cast<float>(rr[r]);

  BackwardOut out;
  gpu_backward(c, in, rstd, &out, rng);
  if (::testing::Test::HasFatalFailure()) return;
  if (!c.compare_cpu) return expect_backward_matches_reference(c, in, out);
  BackwardOut cpu;
  cpu_backward(c, in, rstd, out, &cpu);
  if (::testing::Test::HasFatalFailure()) return;
  expect_backward_matches_reference(c, in, out, &cpu);
}

// gx and gw of `out` (computed from `in`) against the float64 reference;
// with `cpu`, also against the CPU backend's: both sit within the reference
// tolerance, so they agree within twice it.
void expect_backward_matches_reference(const Case& c, const Inputs& in, const BackwardOut& out,
                                       const BackwardOut* cpu) {
  const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double(), gyd = in.gy.to_double();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<double> gxr(n), gwr(static_cast<size_t>(c.cols)), gxs(n), gws(static_cast<size_t>(c.cols));
  reference::backward(c.rows, c.cols, xd.data(), c.weight ? wd.data() : nullptr, gyd.data(), ref_options(c), gxr.data(),
                      gwr.data(), gxs.data(), gws.data());
  // rstd given as float: its rounding (2^-24 relative) is inside acc_rel.
  auto gx_bound = [&](int64_t r, int64_t k) {
    return gx_tol(c.dtype, gxr[r * c.cols + k], gxs[r * c.cols + k], c.cols);
  };
  EXPECT_TRUE(check_matrix("gx", out.gx, gxr, gx_bound));
  if (cpu != nullptr)
    EXPECT_TRUE(check_matrix("gx vs CPU backend", out.gx, cpu->gx.to_double(),
                             [&](int64_t r, int64_t k) { return 2 * gx_bound(r, k); }));
  if (!c.weight || c.gw_mode == RMSNORM_GW_NONE) return;
  const bool f32 = gw_in_f32(c);
  const bool accumulate = c.gw_mode == RMSNORM_GW_ACCUMULATE || c.gw_mode == RMSNORM_GW_ACCUMULATE_F32;
  const int32_t out_dtype = f32 ? RMSNORM_DTYPE_F32 : c.dtype;
  std::vector<double> expect(static_cast<size_t>(c.cols));
  for (int64_t k = 0; k < c.cols; ++k) expect[k] = gwr[k] + (accumulate ? out.gw_old[k] : 0.0);
  // fp32 sums over rows (partials, then partial rows in order): error grows
  // like sqrt(rows) relative to sum|gy x_hat|, plus x_hat's own error; the
  // accumulate modes add one fp32 rounding of the old value.
  auto gw_bound = [&](int64_t k) {
    return gw_tol(out_dtype, expect[k], gws[k], c.rows, c.cols) +
           (accumulate ? ulp(RMSNORM_DTYPE_F32, out.gw_old[k]) : 0.0);
  };
  EXPECT_TRUE(check_vector("gw", c.cols, [&](int64_t k) { return out.gw[k]; }, expect, gw_bound));
  if (cpu != nullptr)
    EXPECT_TRUE(check_vector(
        "gw vs CPU backend", c.cols, [&](int64_t k) { return out.gw[k]; }, cpu->gw,
        [&](int64_t k) { return 2 * gw_bound(k); }));
}

// ---- forward --------------------------------------------------------------------------------------

const int32_t kDtypes[] = {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16};

// Every D in 1..8192 (the kRows band: every threads-per-row value up to 256
// at 16-bit and 512 at fp32, every partial-chunk tail; 16-bit tpr 512 is in
// the large-D tests) x dtype x {aligned, base + 1 element, padded stride},
// one test per (dtype, layout) so that ctest runs them in parallel.
// Rows rotate through {1, 2, 3, 7}; every 64th D runs 300 rows and is also
// compared with the CPU backend; weight / no weight and rstd / none
// alternate; backward alternates gw in dtype and fp32.
class CudaSweep : public ::testing::TestWithParam<std::tuple<int32_t, Layout>> {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
  }
  Case case_for(int64_t d) const {
    Case c;
    c.dtype = std::get<0>(GetParam());
    c.layout = std::get<1>(GetParam());
    c.cols = d;
    c.rows = d % 64 == 0 ? 300 : std::array<int64_t, 4>{1, 2, 3, 7}[(d + static_cast<int>(c.layout)) % 4];
    c.weight = (d + c.dtype) % 5 != 0;
    c.with_rstd = d % 2 == 0;
    c.gw_mode = (d % 3 == 0) ? RMSNORM_GW_STORE_F32 : RMSNORM_GW_STORE;
    c.compare_cpu = d % 64 == 0;
    return c;
  }
};

TEST_P(CudaSweep, ForwardEveryDUpTo8192) {
  std::mt19937_64 rng(1 + std::get<0>(GetParam()));
  for (int64_t d = 1; d <= 8192; ++d) {
    check_forward(case_for(d), rng);
    if (HasFailure()) return;
  }
}

TEST_P(CudaSweep, BackwardEveryDUpTo8192) {
  std::mt19937_64 rng(5 + std::get<0>(GetParam()));
  for (int64_t d = 1; d <= 8192; ++d) {
    check_backward(case_for(d), rng);
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndLayouts, CudaSweep,
                         ::testing::Combine(::testing::Values(RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16),
                                            ::testing::Values(Layout::kAligned, Layout::kOffset, Layout::kPadded)));

// Large D: the top of kRows, every cluster size, the looped band; primes.
TEST_F(Cuda, ForwardLargeD) {
  std::mt19937_64 rng(2);
  for (int64_t d : {3584, 7168, 8191, 12287, 12288, 16384, 32768, 65521, 65536, 131071, 131072, 262144, 262147}) {
    for (int32_t dt : kDtypes) {
      for (Layout lay : {Layout::kAligned, Layout::kOffset}) {
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.layout = lay;
        c.rows = d > 100000 ? 3 : 5;
        c.compare_cpu = true;
        check_forward(c, rng);
        if (HasFailure()) return;
      }
    }
  }
}

// One representative D per band and per threads-per-row value.
const int64_t kBandDs[] = {1, 8, 31, 33, 64, 128, 384, 512, 1000, 2048, 3584, 4096, 8192, 8200, 40000, 140000, 300000};

TEST_F(Cuda, ForwardSemantics) {
  std::mt19937_64 rng(3);
  for (int64_t d : kBandDs) {
    for (int32_t dt : kDtypes) {
      Case c;
      c.dtype = dt;
      c.cols = d;
      c.rows = 9;
      c.hetero = true;  // a row normalized by a neighbour's sum fails at once
      check_forward(c, rng);
      c.hetero = false;
      c.weight_offset = true;
      check_forward(c, rng);
      c.round_xhat = true;
      check_forward(c, rng);
      c.weight = false;
      c.weight_offset = false;
      check_forward(c, rng);
      c.weight = true;
      c.round_xhat = false;
      c.eps = 0.0f;
      check_forward(c, rng);
      if (HasFailure()) return;
    }
  }
}

// Hand-made rows: all zeros (-> 0, never NaN), one huge value, fp16 values
// near 65504 whose squares overflow fp16 but not fp32.
TEST_F(Cuda, ForwardSpecialRows) {
  for (int64_t d : {8, 64, 384, 4096, 40000}) {
    for (int32_t dt : kDtypes) {
      Case c;
      c.dtype = dt;
      c.cols = d;
      c.rows = 3;
      Inputs in;
      in.x = HostMatrix(dt, 3, d);
      in.w = HostMatrix(dt, 1, d);
      for (int64_t k = 0; k < d; ++k) {
        in.x.set(0, k, 0.0);
        in.x.set(1, k, k == d / 2 ? 30000.0 : 0.25);
        in.x.set(2, k, (k % 2 ? -1 : 1) * 60000.0);
        in.w.set(0, k, 0.5 + (k % 5) * 0.25);
      }
      SCOPED_TRACE(describe(c));
      HostMatrix y;
      std::vector<float> rstd;
      gpu_forward(c, in, &y, &rstd);
      ASSERT_FALSE(HasFatalFailure());
      const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double();
      std::vector<double> yr(static_cast<size_t>(3 * d));
      reference::forward(3, d, xd.data(), wd.data(), ref_options(c), yr.data(), nullptr, nullptr);
      for (int64_t k = 0; k < d; ++k) ASSERT_EQ(y.get(0, k), 0.0) << "all-zero row must give 0 at " << k;
      EXPECT_TRUE(check_matrix("y special", y, yr, [&](int64_t r, int64_t k) {
        return y_tol(dt, yr[r * d + k], d);
      }));
    }
  }
}

// A zero weight keeps its sign: w' = w (and 1 + w with the offset), so y = x r w' is -0 or +0 by the signs of x
// and w', as on the CPU backend. Every forward kernel: the rows band's 16-byte and element paths, the cluster
// band, the looped band; with and without the offset (w = -1 there gives w' = +0), x_hat rounded or not.
TEST_F(Cuda, ForwardSignedZeroWeights) {
  std::mt19937_64 rng(58);
  for (int64_t d : {64, 4096, 4099, 40000, 300000})
    for (int32_t dt : kDtypes)
      for (Layout lay : {Layout::kAligned, Layout::kOffset})
        for (int variant = 0; variant < 3; ++variant) {
          Case c;
          c.dtype = dt;
          c.cols = d;
          c.rows = 3;
          c.layout = lay;
          c.weight_offset = variant >= 1;
          c.round_xhat = variant == 2;
          SCOPED_TRACE(describe(c));
          Inputs in = make_inputs(c, rng);
          // w' = -0 (no offset) or +0 (offset) at k % 4 == 0, +0 at k % 4 == 1 (both forms).
          for (int64_t k = 0; k < d; k += 4) {
            in.w.set(0, k, c.weight_offset ? -1.0 : -0.0);
            if (k + 1 < d) in.w.set(0, k + 1, c.weight_offset ? -1.0 : 0.0);
          }
          for (int64_t k = 0; k < d; ++k) in.x.set(2, k, k % 8 < 4 ? -0.0 : 0.0);  // zero x of both signs too
          HostMatrix y;
          std::vector<float> rstd;
          gpu_forward(c, in, &y, &rstd);
          ASSERT_FALSE(HasFatalFailure());
          for (int64_t r = 0; r < c.rows; ++r)
            for (int64_t k = 0; k < d; ++k) {
              if (k % 4 >= 2) continue;
              const bool w_neg = !c.weight_offset && k % 4 == 0;  // w' = -0
              const bool want_neg = std::signbit(in.x.get(r, k)) != w_neg;
              const double v = y.get(r, k);
              ASSERT_TRUE(v == 0.0 && std::signbit(v) == want_neg)
                  << "row " << r << " col " << k << ": y = " << v << " (signbit " << std::signbit(v) << "), x = "
                  << in.x.get(r, k) << ", w = " << in.w.get(0, k) << "; want " << (want_neg ? "-0" : "+0");
            }
        }
}

// Bitwise batch invariance: a row's y and rstd do not depend on how many
// rows share the call or where the row sits.
// Row `pos` of a big batch, computed again alone and as the middle row of a
// batch of 3: rstd and y bitwise equal.
void check_batch_invariance(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const int64_t big = c.rows, d = c.cols;
  const int32_t dt = c.dtype;
  Inputs in;  // x and w (the forward reads no gy)
  in.x = HostMatrix(dt, big, d, stride_of(c), offset_of(c));
  if (big * d > (int64_t{1} << 24))
    fill_hashed(in.x, rng);
  else
    fill_random(in.x, rng, [&](int64_t r) { return row_scale(c, r); });
  in.w = HostMatrix(dt, 1, d, d, offset_of(c));
  fill_random(in.w, rng);
  HostMatrix y_big;
  std::vector<float> r_big;
  gpu_forward(c, in, &y_big, &r_big);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int64_t pos : {int64_t{0}, big / 2, big - 1}) {
    for (int64_t batch : {int64_t{1}, int64_t{3}}) {
      Case cs = c;
      cs.rows = batch;
      Inputs sub;
      sub.w = in.w;
      sub.x = HostMatrix(dt, batch, d);
      fill_random(sub.x, rng);
      const int64_t at = batch == 1 ? 0 : 1;
      for (int64_t k = 0; k < d; ++k) sub.x.set(at, k, in.x.get(pos, k));
      HostMatrix y_small;
      std::vector<float> r_small;
      gpu_forward(cs, sub, &y_small, &r_small);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      ASSERT_EQ(0, std::memcmp(&r_small[at], &r_big[pos], 4)) << "rstd differs, row " << pos << " batch " << batch;
      for (int64_t k = 0; k < d; ++k)
        ASSERT_EQ(y_small.get(at, k), y_big.get(pos, k)) << "y differs, row " << pos << " batch " << batch << " col " << k;
    }
  }
}

TEST_F(Cuda, ForwardBatchInvariance) {
  std::mt19937_64 rng(4);
  for (int64_t d : kBandDs) {
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32}) {
      Case c;
      c.dtype = dt;
      c.cols = d;
      c.rows = std::max<int64_t>(2048, std::min<int64_t>(4099, (int64_t{1} << 26) / d));  // thousands in every band
      check_batch_invariance(c, rng);
      ASSERT_FALSE(HasFatalFailure());
    }
  }
}

// Plan inputs for computing a test's expectations: the current device's SM
// count, the rest at plan::Device's defaults (sm_90).
plan::Device current_plan_device() {
  int dev = 0, sms = 0;
  EXPECT_EQ(cudaSuccess, cudaGetDevice(&dev));
  EXPECT_EQ(cudaSuccess, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  plan::Device pd;
  pd.sm_count = sms;
  return pd;
}

// The same where the big batch takes the element-I/O forward's other grid,
// one CTA per row group (plan::forward_one_group_per_cta: many short rows),
// while the batches of 1 and 3 stay persistent (the 16-byte forward takes one
// group per CTA at every batch, so misaligned rows are what has two grids).
// The plan is asked first, so that the test cannot pass by testing the
// persistent grid twice.
TEST_F(Cuda, ForwardBatchInvarianceOneGroupPerCta) {
  const plan::Device pd = current_plan_device();
  std::mt19937_64 rng(5);
  for (int64_t d : {int64_t{128}, int64_t{1024}}) {  // 64 and 8 rows per CTA
    const plan::RowPlan row = plan::forward_launch(1, d, 2, plan::Io::kElement, pd).row;
    const int64_t resident = int64_t{pd.sm_count} * plan::forward_ctas_per_sm(row.threads_per_row, row.chunks_per_thread,
                                                                                 plan::Kernel::kForwardRowsElement) / row.cluster;
    Case c;
    c.dtype = RMSNORM_DTYPE_BF16;
    c.cols = d;
    c.layout = Layout::kOffset;
    c.rows = plan::kOneGroupMinGroupsPerCta * resident * row.rows_per_cta + 5;  // + a part group
    const plan::Launch l = plan::forward_launch(c.rows, d, 2, plan::Io::kElement, pd);
    const int64_t groups = (c.rows + l.row.rows_per_cta - 1) / l.row.rows_per_cta;
    ASSERT_TRUE(plan::forward_one_group_per_cta(l.row, groups, resident)) << "D " << d;
    ASSERT_EQ(l.grid, groups) << "D " << d;
    ASSERT_FALSE(plan::forward_one_group_per_cta(plan::forward_launch(3, d, 2, plan::Io::kElement, pd).row, 1, resident));
    check_batch_invariance(c, rng);
    ASSERT_FALSE(HasFatalFailure());
  }
}

// The rows-band element-I/O forward's tiled grid (plan::Launch::groups_per_cta):
// a last tile with fewer groups and a last group with fewer rows, checked
// against the reference, and batch-invariant against a lone row.
TEST_F(Cuda, ForwardTiledGrid) {
  const plan::Device pd = current_plan_device();
  std::mt19937_64 rng(51);
  const std::pair<int64_t, int32_t> shapes[] = {
      {4096, RMSNORM_DTYPE_BF16}, {8192, RMSNORM_DTYPE_F32}, {2000, RMSNORM_DTYPE_F16}};
  for (const auto& [d, dt] : shapes) {
    const int esize = dt == RMSNORM_DTYPE_F32 ? 4 : 2;
    const plan::RowPlan row = plan::forward_launch(1, d, esize, plan::Io::kElement, pd).row;
    const int64_t resident = int64_t{pd.sm_count} * plan::forward_ctas_per_sm(row.threads_per_row, row.chunks_per_thread,
                                                                                 plan::Kernel::kForwardRowsElement);
    Case c;
    c.dtype = dt;
    c.cols = d;
    c.layout = Layout::kOffset;  // element I/O: the 16-byte path takes one group per CTA, never tiles
    // kForwardTileMinWaves tiles per resident CTA and a part tile; the last group part-filled where it holds
    // several rows.
    c.rows = (resident * plan::kForwardTileMinWaves * plan::kForwardTileGroups + plan::kForwardTileGroups / 2) *
                 row.rows_per_cta +
             1;
    const plan::Launch l = plan::forward_launch(c.rows, d, esize, plan::Io::kElement, pd);
    ASSERT_GT(l.groups_per_cta, 0) << "D " << d;
    check_forward(c, rng);
    ASSERT_FALSE(HasFatalFailure());
    check_batch_invariance(c, rng);
    ASSERT_FALSE(HasFatalFailure());
  }
}

// ---- backward ---------------------------------------------------------------------------------------

TEST_F(Cuda, BackwardLargeD) {
  std::mt19937_64 rng(6);
  for (int64_t d : {3584, 7168, 8191, 12288, 16384, 32768, 65521, 65536, 131071, 131072, 262144, 262147}) {
    for (int32_t dt : kDtypes) {
      for (Layout lay : {Layout::kAligned, Layout::kOffset}) {
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.layout = lay;
        c.rows = d > 100000 ? 3 : 37;  // 37 rows: several rows per persistent cluster
        c.compare_cpu = true;
        check_backward(c, rng);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_F(Cuda, BackwardSemanticsAndGwModes) {
  std::mt19937_64 rng(7);
  for (int64_t d : kBandDs) {
    for (int32_t dt : kDtypes) {
      Case c;
      c.dtype = dt;
      c.cols = d;
      c.rows = d > 10000 ? 40 : 300;  // several rows per CTA (or cluster) in every band
      c.hetero = true;
      c.compare_cpu = true;
      for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE,
                           RMSNORM_GW_ACCUMULATE_F32}) {
        c.gw_mode = mode;
        c.with_rstd = mode % 2 == 0;
        check_backward(c, rng);
      }
      c.hetero = false;
      c.weight_offset = true;
      check_backward(c, rng);
      c.weight = false;
      check_backward(c, rng);
      c.weight = true;
      // A single CTA writes gw directly; in the rows band's 16-byte path the decode form (one CTA of
      // max(tpr, 32) threads: at D <= 256 (16-bit) two rows share it).
      for (int64_t rows : {1, 2}) {
        for (int32_t mode : {RMSNORM_GW_STORE, RMSNORM_GW_ACCUMULATE_F32}) {
          c.rows = rows;
          c.gw_mode = mode;
          check_backward(c, rng);
        }
      }
      if (HasFailure()) return;
    }
  }
}

// 20 repeats give bitwise identical gx and gw (no atomics, fixed orders).
TEST_F(Cuda, BackwardIsDeterministic) {
  std::mt19937_64 rng(8);
  for (int64_t d : {64, 384, 4096, 40000, 300000}) {
    Case c;
    c.dtype = RMSNORM_DTYPE_BF16;
    c.cols = d;
    c.rows = d > 100000 ? 40 : 2000;
    c.with_rstd = false;
    c.gw_mode = RMSNORM_GW_STORE_F32;
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c, rng);
    BackwardOut first;
    std::vector<float> none;
    gpu_backward(c, in, none, &first, rng);
    ASSERT_FALSE(HasFatalFailure());
    for (int rep = 0; rep < 19; ++rep) {
      BackwardOut again;
      gpu_backward(c, in, none, &again, rng);
      ASSERT_FALSE(HasFatalFailure());
      ASSERT_EQ(0, std::memcmp(first.gx.storage.data(), again.gx.storage.data(), first.gx.storage.size()))
          << "gx differs on repeat " << rep;
      ASSERT_EQ(first.gw, again.gw) << "gw differs on repeat " << rep;
    }
  }
}

// The operands of a residual-add case on the device: x and w (make_inputs), a residual, and h's own buffer, with
// h_want = T(fp32(x) + fp32(residual)) by the rule. `over` says where the op writes h: 0 its own buffer, 1 over
// the residual, 2 over x.
struct AddOperands {
  Inputs in;
  HostMatrix res, h, h_want;
  Dev dx, dres, dw, dh;
  void* h_ptr(int over) const { return over == 1 ? dres.data() : over == 2 ? dx.data() : dh.data(); }
};

AddOperands make_add_operands(const Case& c, std::mt19937_64& rng) {
  AddOperands a;
  a.in = make_inputs(c, rng);
  a.res = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
  fill_random(a.res, rng, [&](int64_t r) { return 4.0 * row_scale(c, r + 1); });
  a.h_want = HostMatrix(c.dtype, c.rows, c.cols);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k)
      a.h_want.set(r, k, static_cast<float>(a.in.x.get(r, k)) + static_cast<float>(a.res.get(r, k)));
  a.h = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
  a.dx = upload(a.in.x);
  a.dres = upload(a.res);
  a.dw = upload(a.in.w);
  a.dh = upload(a.h);
  return a;
}

// h as the op stored it (where `over` says), every element checked against h_want.
void download_checked_h(const Case& c, const AddOperands& a, int over, HostMatrix* h_got) {
  *h_got = over == 1 ? a.res : over == 2 ? a.in.x : a.h;
  download(over == 1 ? a.dres : over == 2 ? a.dx : a.dh, *h_got);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k)
      ASSERT_EQ(h_got->get(r, k), a.h_want.get(r, k)) << "h at row " << r << " col " << k;
}

// rmsnorm_add_forward in every band, layout and dtype: h exactly T(fp32(x) + fp32(res)) (computed here from the
// stored inputs), and y and rstd bit for bit what rmsnorm_forward gives for that h on this device (the fused rows
// kernel reduces in the plain kernels' order; elsewhere the forward of h runs after the add). The plan is asked
// which path each case takes, so that both are seen. Then h written over residual and over x: the same bits.
void check_add_forward(const Case& c, int over, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c) + (over == 1 ? " h == residual" : over == 2 ? " h == x" : ""));
  Arena::get().reset();
  const AddOperands a = make_add_operands(c, rng);
  HostMatrix y(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
  const Dev dy = upload(y);
  float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
  CUDA_OK(cudaMemset(drstd, 0xFF, static_cast<size_t>(c.rows) * 4));
  poison_shared_memory();
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t b = cuda_backend();
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward(&p, a.dx.data(), stride_of(c), a.dres.data(), stride_of(c),
                                                         c.weight ? a.dw.data() : nullptr, a.h_ptr(over), stride_of(c),
                                                         dy.data(), stride_of(c), drstd, &b))
      << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  download(dy, y);
  std::vector<float> rstd(static_cast<size_t>(c.rows));
  CUDA_OK(cudaMemcpy(rstd.data(), drstd, rstd.size() * 4, cudaMemcpyDeviceToHost));
  HostMatrix h_got;
  download_checked_h(c, a, over, &h_got);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_TRUE(padding_untouched("y", y));
  EXPECT_TRUE(padding_untouched("h", h_got));
  // The plain forward of h as stored.
  Case plain = c;
  plain.with_rstd = true;
  Inputs hin;
  hin.x = h_got;
  hin.w = a.in.w;
  HostMatrix y_plain;
  std::vector<float> rstd_plain;
  gpu_forward(plain, hin, &y_plain, &rstd_plain);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int64_t r = 0; r < c.rows; ++r) {
    ASSERT_EQ(0, std::memcmp(&rstd[r], &rstd_plain[r], 4)) << "rstd differs, row " << r;
    const size_t es = y.esize();
    for (int64_t k = 0; k < c.cols; ++k)
      ASSERT_EQ(0, std::memcmp(static_cast<const char*>(y.data()) + y.index(r, k) * es,
                               static_cast<const char*>(y_plain.data()) + y_plain.index(r, k) * es, es))
          << "y differs from the forward of h, row " << r << " col " << k << ": " << y.get(r, k) << " vs "
          << y_plain.get(r, k);
  }
}

TEST_F(Cuda, AddForward) {
  std::mt19937_64 rng(41);
  const plan::Device pd = current_plan_device();
  int fused = 0, unfused = 0;
  // kBandDs, plus 22 and 4099: with the padded layout their rows are 16-byte aligned with a partial last chunk (the
  // fused kernel's kPartial form).
  std::vector<int64_t> ds(std::begin(kBandDs), std::end(kBandDs));
  ds.push_back(22);
  ds.push_back(4099);
  for (int64_t d : ds) {
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16}) {
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded}) {
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.layout = lay;
        c.rows = d > 100000 ? 3 : d > 8192 ? 17 : 300;
        c.weight = (d + dt) % 4 != 0;
        c.hetero = true;
        const int esize = dt == RMSNORM_DTYPE_F32 ? 4 : 2;
        const plan::Io io = lay != Layout::kOffset && (stride_of(c) * esize) % 16 == 0 ? plan::Io::kVector
                                                                                          : plan::Io::kElement;
        (plan::add_fused(plan::forward_launch(c.rows, d, esize, io, pd)) ? fused : unfused)++;
        check_add_forward(c, 0, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
  EXPECT_GT(fused, 0);
  EXPECT_GT(unfused, 0);
  // An fp32 weight (RMSNORM_FLAG_WEIGHT_F32): y and rstd the fp32-weight forward's of h, bit for bit, on the fused
  // rows kernel and the unfused paths, h over the residual too.
  fused = unfused = 0;
  for (int64_t d : {1, 22, 33, 1000, 4096, 4099, 16384, 40000})
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F16})
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded})
        for (int over : {0, 1}) {
          Case c;
          c.dtype = dt;
          c.cols = d;
          c.layout = lay;
          c.rows = d > 8192 ? 17 : 300;
          c.weight_offset = d % 2 == 1;
          c.hetero = true;
          c.weight_f32 = true;
          const plan::Io io = lay != Layout::kOffset && (stride_of(c) * 2) % 16 == 0 ? plan::Io::kVector
                                                                                      : plan::Io::kElement;
          (plan::add_fused(plan::weight_f32_forward_launch(c.rows, d, 2, io, pd)) ? fused : unfused)++;
          check_add_forward(c, over, rng);
          if (HasFatalFailure()) return;
        }
  EXPECT_GT(fused, 0);
  EXPECT_GT(unfused, 0);
  for (int over : {1, 2}) {
    for (int64_t d : {64, 4096, 40000}) {
      for (Layout lay : {Layout::kAligned, Layout::kOffset}) {
        Case c;
        c.cols = d;
        c.layout = lay;
        c.rows = 33;
        check_add_forward(c, over, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// rmsnorm_add_backward of one case: gx exactly T(T(gx_norm) + g_h), where T(gx_norm) is this device's
// rmsnorm_backward gx, and gw bit for bit its gw; gx written over g_h or over gy where `over` says.
void check_add_backward(const Case& c, GxOver over, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c) + (over == GxOver::kGh ? " gx == g_h" : over == GxOver::kGy ? " gx == gy" : ""));
  const Inputs in = make_inputs(c, rng);
  HostMatrix gh(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
  fill_random(gh, rng, [&](int64_t r) { return 0.25 * row_scale(c, r); });
  BackwardOut plain, fused;
  gpu_backward(c, in, {}, &plain, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  gpu_backward(c, in, {}, &fused, rng, &gh, over);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  HostMatrix want(c.dtype, c.rows, c.cols);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k)
      want.set(r, k, static_cast<float>(plain.gx.get(r, k)) + static_cast<float>(gh.get(r, k)));
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k) {
      const double g = fused.gx.get(r, k), e = want.get(r, k);
      ASSERT_EQ(0, std::memcmp(&g, &e, sizeof(double))) << "gx at row " << r << " col " << k << ": " << g << " vs "
                                                         << e;
    }
  ASSERT_EQ(plain.gw, fused.gw) << "gw differs from rmsnorm_backward's";
}

// rmsnorm_add_backward in every band, layout and dtype, and in place over g_h and over gy (at D 33, 4096 and
// 40000; 300000 too over gy: the looped band).
TEST_F(Cuda, AddBackward) {
  std::mt19937_64 rng(42);
  std::vector<int64_t> ds(std::begin(kBandDs), std::end(kBandDs));
  ds.push_back(22);  // padded: aligned rows, a partial last chunk
  ds.push_back(4099);
  for (int64_t d : ds) {
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16}) {
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded}) {
        for (GxOver over : {GxOver::kNone, GxOver::kGh, GxOver::kGy}) {
          if (over != GxOver::kNone && d != 4096 && d != 33 && d != 40000 && !(over == GxOver::kGy && d == 300000))
            continue;
          Case c;
          c.dtype = dt;
          c.cols = d;
          c.layout = lay;
          c.rows = d > 100000 ? 3 : d > 8192 ? 17 : 300;
          c.with_rstd = false;
          c.gw_mode = (d + dt) % 2 == 0 ? RMSNORM_GW_STORE_F32 : RMSNORM_GW_STORE;
          check_add_backward(c, over, rng);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// ---- quantized output (rmsnorm_forward_quant) ---------------------------------------------------

struct QuantSpec {
  int32_t kind = RMSNORM_QUANT_FP8_E4M3;
  int32_t mode = RMSNORM_QUANT_PER_ROW;
  bool ub = false;  // fp8 per row: scale_ub = 0.5
};
constexpr float kStaticScale = 0.037f;
constexpr float kScaleUb = 0.5f;
constexpr uint8_t kQPoison = 0xAB;

std::string describe(const QuantSpec& q) {
  return std::string(q.kind == RMSNORM_QUANT_FP8_E4M3 ? " fp8" : " int8") +
         (q.mode == RMSNORM_QUANT_STATIC ? " static" : " per-row") + (q.ub ? " ub" : "");
}

// q's layout for a case: rows on 16 bytes (aligned), or on 8 bytes with padding past cols (padded: enough for a
// chunk's q bytes), or 1 byte in with an odd stride (offset: never aligned to a chunk's q bytes).
Layout q_layout(const Case& c) { return c.q_layout < 0 ? c.layout : static_cast<Layout>(c.q_layout); }
int64_t q_stride_of(const Case& c) {
  const Layout l = q_layout(c);
  return l == Layout::kOffset ? c.cols + 3 : l == Layout::kPadded ? (c.cols + 7) / 8 * 8 + 8 : (c.cols + 15) / 16 * 16;
}

struct QuantOut {
  std::vector<uint8_t> q;  // rows x q_stride_of(c), from q's first byte
  std::vector<float> scales, rstd;
};

void gpu_forward_quant(const Case& c, const Inputs& in, const QuantSpec& qs, QuantOut* out) {
  Arena::get().reset();
  const int64_t qstride = q_stride_of(c);
  const int64_t qoff = q_layout(c) == Layout::kOffset ? 1 : 0;
  const size_t qbytes = static_cast<size_t>(c.rows * qstride);
  const Dev dx = upload(in.x), dw = upload(in.w);
  uint8_t* dq = static_cast<uint8_t*>(Arena::get().alloc(qbytes + 16));
  float* dscales = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
  float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
  float* dconst = static_cast<float*>(Arena::get().alloc(16));
  const float consts[2] = {kStaticScale, kScaleUb};
  CUDA_OK(cudaMemset(dq, kQPoison, qbytes + 16));
  CUDA_OK(cudaMemset(dscales, 0xFF, static_cast<size_t>(c.rows) * 4));
  CUDA_OK(cudaMemset(drstd, 0xFF, static_cast<size_t>(c.rows) * 4));
  CUDA_OK(cudaMemcpy(dconst, consts, sizeof(consts), cudaMemcpyHostToDevice));
  poison_shared_memory();
  rmsnorm_quant_t qt;
  qt.kind = qs.kind;
  qt.scale_mode = qs.mode;
  qt.scale = qs.mode == RMSNORM_QUANT_STATIC ? dconst : nullptr;
  qt.row_scales = qs.mode == RMSNORM_QUANT_PER_ROW ? dscales : nullptr;
  qt.scale_ub = qs.ub ? dconst + 1 : nullptr;
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t b = cuda_backend();
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward_quant(&p, dx.data(), stride_of(c), c.weight ? dw.data() : nullptr,
                                                           &qt, dq + qoff, qstride, drstd, &b))
      << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> all(qbytes + 16);
  CUDA_OK(cudaMemcpy(all.data(), dq, all.size(), cudaMemcpyDeviceToHost));
  ASSERT_EQ(all[0], qoff == 1 ? kQPoison : all[0]) << "q written before its first byte";
  out->q.assign(all.begin() + qoff, all.begin() + qoff + static_cast<int64_t>(qbytes));
  for (size_t i = qoff + qbytes; i < all.size(); ++i) ASSERT_EQ(all[i], kQPoison) << "q written past its end";
  out->scales.assign(static_cast<size_t>(c.rows), NAN);
  out->rstd.assign(static_cast<size_t>(c.rows), NAN);
  CUDA_OK(cudaMemcpy(out->scales.data(), dscales, out->scales.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(out->rstd.data(), drstd, out->rstd.size() * 4, cudaMemcpyDeviceToHost));
}

// q and the row scales by the documented rule (src/common/quant.hpp, whose fp8 encoder the CPU tests check against
// a brute-force oracle) from y, given as y(row, col) in fp32; the row padding of q untouched.
template <typename YFn>
void expect_quant_rule(const Case& c, const QuantSpec& qs, const QuantOut& out, YFn&& y) {
  const bool fp8 = qs.kind == RMSNORM_QUANT_FP8_E4M3;
  const int64_t qstride = q_stride_of(c);
  for (int64_t r = 0; r < c.rows; ++r) {
    float s = 0.0f, mul = 1.0f / kStaticScale;
    if (qs.mode == RMSNORM_QUANT_PER_ROW) {
      float amax = 0.0f;
      for (int64_t k = 0; k < c.cols; ++k) amax = std::fmax(amax, std::fabs(y(r, k)));
      s = quant::row_scale(amax, qs.ub ? &kScaleUb : nullptr, fp8);
      mul = 1.0f / s;
      ASSERT_EQ(0, std::memcmp(&out.scales[r], &s, 4)) << "scale of row " << r << ": " << out.scales[r] << " vs " << s;
    }
    for (int64_t k = 0; k < c.cols; ++k) {
      const float yv = y(r, k);
      const float v = qs.mode == RMSNORM_QUANT_PER_ROW && fp8 ? yv / s : yv * mul;
      const uint8_t want = fp8 ? quant::fp8_e4m3_saturated(v) : static_cast<uint8_t>(quant::int8_saturated(v));
      const uint8_t got = out.q[static_cast<size_t>(r * qstride + k)];
      ASSERT_EQ(int(got), int(want)) << "q at row " << r << " col " << k << ": y " << yv << " v " << v;
    }
    for (int64_t k = c.cols; k < qstride; ++k)
      ASSERT_EQ(out.q[static_cast<size_t>(r * qstride + k)], kQPoison) << "q padding written, row " << r << " col " << k;
  }
}

// y(row, col) as every forward kernel computes it from x, w' and the row's rstd r: T(x r w'), or T(T(x r) w').
struct YFromRstd {
  const Case& c;
  const Inputs& in;
  const std::vector<float>& rstd;
  float operator()(int64_t r, int64_t k) const {
    const float wp = c.weight ? static_cast<float>(in.w.get(0, k)) + (c.weight_offset ? 1.0f : -0.0f) : 1.0f;  // w + -0 == w
    const float xh = static_cast<float>(in.x.get(r, k)) * rstd[static_cast<size_t>(r)];
    const float v = c.round_xhat ? static_cast<float>(round_to(c.dtype, xh)) * wp : xh * wp;
    return static_cast<float>(round_to(c.dtype, v));
  }
};

// rstd against the float64 reference's, within its tolerance.
void expect_rstd_near_reference(const Case& c, const Inputs& in, const std::vector<float>& rstd) {
  const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<double> yr(n), xh(n), rr(static_cast<size_t>(c.rows));
  reference::forward(c.rows, c.cols, xd.data(), c.weight ? wd.data() : nullptr, ref_options(c), yr.data(), rr.data(),
                     xh.data());
  EXPECT_TRUE(check_vector(
      "rstd", c.rows, [&](int64_t r) { return static_cast<double>(rstd[r]); }, rr,
      [&](int64_t r) { return rstd_tol(rr[r], c.cols); }));
}

// The I/O path the plan sees for a case's x: 16-byte vectors where every row is 16-byte aligned.
plan::Io io_of_case(const Case& c) {
  const int esize = c.dtype == RMSNORM_DTYPE_F32 ? 4 : 2;
  return c.layout != Layout::kOffset && (stride_of(c) * esize) % 16 == 0 ? plan::Io::kVector : plan::Io::kElement;
}

// A fused quantized call against rmsnorm_forward of the same inputs: rstd bit for bit, and `rule` (the q and scale
// check) applied to rmsnorm_forward's y, given as y(row, col).
template <typename Rule>
void expect_fused_is_the_forwards(const Case& c, const Inputs& in, const std::vector<float>& rstd_got, Rule&& rule) {
  HostMatrix y;
  std::vector<float> rstd;
  Case f = c;
  f.with_rstd = true;
  gpu_forward(f, in, &y, &rstd);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(0, std::memcmp(rstd.data(), rstd_got.data(), rstd.size() * 4)) << "rstd differs from rmsnorm_forward's";
  rule([&](int64_t r, int64_t k) { return static_cast<float>(y.get(r, k)); });
}

// One case: rstd within the reference's tolerance; q and the scales by the rule from y computed from that rstd;
// where the plan fuses the quantization into the rows forward (asked first), rstd bit for bit rmsnorm_forward's and
// q the rule applied to rmsnorm_forward's y. Returns whether it was fused.
bool check_forward_quant(const Case& c, const QuantSpec& qs, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c) + describe(qs));
  Inputs in = make_inputs(c, rng);
  if (c.rows > 2)
    for (int64_t k = 0; k < c.cols; ++k) in.x.set(2, k, 0.0);  // an all-zero row: the smallest scale
  QuantOut out;
  gpu_forward_quant(c, in, qs, &out);
  if (::testing::Test::HasFatalFailure()) return false;
  expect_rstd_near_reference(c, in, out.rstd);
  expect_quant_rule(c, qs, out, YFromRstd{c, in, out.rstd});
  if (::testing::Test::HasFatalFailure()) return false;
  const int esize = c.dtype == RMSNORM_DTYPE_F32 ? 4 : 2;
  const plan::Io io = io_of_case(c);
  const bool fused = plan::quant_fused(plan::forward_launch(c.rows, c.cols, esize, io, current_plan_device()),
                                       q_layout(c) != Layout::kOffset);
  if (fused)
    expect_fused_is_the_forwards(c, in, out.rstd, [&](const auto& y) { expect_quant_rule(c, qs, out, y); });
  return fused;
}

const QuantSpec kQuantSpecs[] = {{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_STATIC, false},
                                 {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, false},
                                 {RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, true},
                                 {RMSNORM_QUANT_INT8, RMSNORM_QUANT_STATIC, false},
                                 {RMSNORM_QUANT_INT8, RMSNORM_QUANT_PER_ROW, false}};

// Every band, layout and dtype, both kinds and scale modes; weight, Gemma offset and round_xhat varied with the
// case; both the fused and the looped path seen.
TEST_F(Cuda, ForwardQuant) {
  std::mt19937_64 rng(43);
  std::vector<int64_t> ds(std::begin(kBandDs), std::end(kBandDs));
  ds.push_back(22);  // padded: aligned rows, a partial last chunk
  ds.push_back(4099);
  int fused = 0, looped = 0, k = 0;
  for (int64_t d : ds)
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16})
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded})
        for (const QuantSpec& qs : kQuantSpecs) {
          Case c;
          c.dtype = dt;
          c.cols = d;
          c.layout = lay;
          c.rows = d > 100000 ? 3 : d > 8192 ? 17 : 300;
          c.hetero = true;
          c.weight = k % 5 != 4;
          c.weight_offset = k % 7 == 3;
          c.round_xhat = k % 3 == 1;
          ++k;
          (check_forward_quant(c, qs, rng) ? fused : looped)++;
          if (HasFatalFailure()) return;
        }
  // q's alignment apart from x's: x 16-byte aligned with q 1 byte in (the looped kernel with vector x loads and byte
  // stores of q), and x misaligned with q aligned.
  for (int64_t d : {8, 64, 4096, 4099, 40000})
    for (int pair = 0; pair < 2; ++pair) {
      Case c;
      c.cols = d;
      c.rows = d > 8192 ? 17 : 300;
      c.hetero = true;
      c.layout = pair == 0 ? Layout::kAligned : Layout::kOffset;
      c.q_layout = static_cast<int>(pair == 0 ? Layout::kOffset : Layout::kAligned);
      for (const QuantSpec& qs : {kQuantSpecs[1], kQuantSpecs[3]}) {
        EXPECT_FALSE(check_forward_quant(c, qs, rng)) << "fused although q or x is misaligned";
        if (HasFatalFailure()) return;
      }
    }
  EXPECT_GT(fused, 0);
  EXPECT_GT(looped, 0);
}

// plan::quant_sum_pairs' rows (16-bit D 2049..4096, fp32 1025..2048, rows >= kQuantSumPairsMinRows): whole and
// partial last chunks, padded rows, an odd row count; case k varies the weight, its offset and x_hat's rounding.
struct PairCase { int64_t d; int32_t dtype; Layout layout; };
const PairCase kPairCases[] = {{4096, RMSNORM_DTYPE_BF16, Layout::kAligned}, {4096, RMSNORM_DTYPE_F16, Layout::kAligned},
                               {2056, RMSNORM_DTYPE_BF16, Layout::kAligned}, {4095, RMSNORM_DTYPE_BF16, Layout::kPadded},
                               {2048, RMSNORM_DTYPE_F32, Layout::kAligned},  {1030, RMSNORM_DTYPE_F32, Layout::kPadded}};
Case pair_case(const PairCase& pc, int k) {
  Case c;
  c.dtype = pc.dtype;
  c.cols = pc.d;
  c.layout = pc.layout;
  c.rows = plan::kQuantSumPairsMinRows + 77;
  c.hetero = true;
  c.weight = k % 5 != 4;
  c.weight_offset = k % 7 == 3;
  c.round_xhat = k % 3 == 1;
  return c;
}

// The fused quantized forward where each thread sums as two threads of the plain forward's row (plan::quant_sum_pairs:
// rows of 256 threads x 2 chunks, rows >= kQuantSumPairsMinRows): rstd bit for bit rmsnorm_forward's and q by the
// rule from its y (check_forward_quant), every kind, whole and partial last chunks, an odd row count (the last
// CTA's second slot empty); the plan is asked first, so the case is seen to take that path.
TEST_F(Cuda, ForwardQuantSumPairs) {
  std::mt19937_64 rng(53);
  int k = 0;
  for (const PairCase& pc : kPairCases)
    for (const QuantSpec& qs : kQuantSpecs) {
      const Case c = pair_case(pc, k++);
      const int esize = pc.dtype == RMSNORM_DTYPE_F32 ? 4 : 2;
      const plan::Launch l = plan::quant_launch(c.rows, c.cols, esize, io_of_case(c), true, current_plan_device());
      ASSERT_EQ(l.sum_tpr, plan::kFewChunksTpr) << describe(c);
      ASSERT_TRUE(check_forward_quant(c, qs, rng)) << "not fused";
      if (HasFatalFailure()) return;
    }
}

// h = T(x + residual) by the rule (over: 0 h apart, 1 h over the residual, 2 h over x); q, the scales and rstd
// bit for bit rmsnorm_forward_quant's of that h.
void check_add_forward_quant(const Case& c, int over, const QuantSpec& qs, std::mt19937_64& rng) {
  Arena::get().reset();
  const AddOperands a = make_add_operands(c, rng);
  const int64_t qstride = q_stride_of(c), qoff = c.layout == Layout::kOffset ? 1 : 0;
  const size_t qbytes = static_cast<size_t>(c.rows * qstride);
  uint8_t* dq = static_cast<uint8_t*>(Arena::get().alloc(qbytes + 16));
  float* dscales = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
  float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
  float* dconst = static_cast<float*>(Arena::get().alloc(16));
  const float consts[2] = {kStaticScale, kScaleUb};
  CUDA_OK(cudaMemcpy(dconst, consts, sizeof(consts), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dq, kQPoison, qbytes + 16));
  CUDA_OK(cudaMemset(dscales, 0xFF, static_cast<size_t>(c.rows) * 4));
  CUDA_OK(cudaMemset(drstd, 0xFF, static_cast<size_t>(c.rows) * 4));
  poison_shared_memory();
  rmsnorm_quant_t qt{qs.kind, qs.mode, qs.mode == RMSNORM_QUANT_STATIC ? dconst : nullptr,
                     qs.mode == RMSNORM_QUANT_PER_ROW ? dscales : nullptr, qs.ub ? dconst + 1 : nullptr};
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t b = cuda_backend();
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_add_forward_quant(&p, a.dx.data(), stride_of(c), a.dres.data(), stride_of(c),
                                      c.weight ? a.dw.data() : nullptr, a.h_ptr(over), stride_of(c), &qt, dq + qoff,
                                      qstride, drstd, &b))
      << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  QuantOut got;
  got.q.resize(qbytes);
  got.scales.assign(static_cast<size_t>(c.rows), NAN);
  got.rstd.assign(static_cast<size_t>(c.rows), NAN);
  CUDA_OK(cudaMemcpy(got.q.data(), dq + qoff, qbytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got.scales.data(), dscales, got.scales.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got.rstd.data(), drstd, got.rstd.size() * 4, cudaMemcpyDeviceToHost));
  HostMatrix h_got;
  download_checked_h(c, a, over, &h_got);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  Inputs hin;
  hin.x = h_got;
  hin.w = a.in.w;
  QuantOut want;
  gpu_forward_quant(c, hin, qs, &want);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_EQ(0, std::memcmp(got.rstd.data(), want.rstd.data(), got.rstd.size() * 4)) << "rstd";
  if (qs.mode == RMSNORM_QUANT_PER_ROW)
    ASSERT_EQ(0, std::memcmp(got.scales.data(), want.scales.data(), got.scales.size() * 4)) << "scales";
  for (size_t i = 0; i < got.q.size(); ++i)
    ASSERT_EQ(int(got.q[i]), int(want.q[i])) << "q byte " << i << " (row " << i / qstride << ")";
}

// rmsnorm_add_forward_quant: h exactly by the rule, and q, the row scales and rstd bit for bit this device's
// rmsnorm_forward_quant of that h (fused: the rows kernel adds, stores h and quantizes; elsewhere add_kernel writes h
// and the quantized forward reads it), in every band and layout, h in its own buffer, over residual and over x.
TEST_F(Cuda, AddForwardQuant) {
  std::mt19937_64 rng(47);
  std::vector<int64_t> ds(std::begin(kBandDs), std::end(kBandDs));
  ds.push_back(4099);
  for (int64_t d : ds)
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32})
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded})
        for (int over : {0, 1, 2}) {
          if (over != 0 && d != 64 && d != 4096 && d != 40000) continue;
          Case c;
          c.dtype = dt;
          c.cols = d;
          c.layout = lay;
          c.rows = d > 100000 ? 3 : d > 8192 ? 17 : 300;
          c.hetero = true;
          const QuantSpec qs = kQuantSpecs[(d + over) % 5];
          SCOPED_TRACE(describe(c) + describe(qs) + " over " + std::to_string(over));
          check_add_forward_quant(c, over, qs, rng);
          if (HasFatalFailure()) return;
        }
  // Rows enough for plan::quant_sum_pairs (Cuda.ForwardQuantSumPairs checks that path against rmsnorm_forward):
  // whole chunks, a partial last chunk, fp32.
  for (int over : {0, 1, 2}) {
    Case c;
    c.cols = over == 0 ? 4096 : over == 1 ? 4095 : 2048;
    c.layout = over == 1 ? Layout::kPadded : Layout::kAligned;
    c.dtype = over == 2 ? RMSNORM_DTYPE_F32 : RMSNORM_DTYPE_BF16;
    c.rows = plan::kQuantSumPairsMinRows + 77;
    c.hetero = true;
    const QuantSpec qs = kQuantSpecs[over + 1];
    SCOPED_TRACE(describe(c) + describe(qs) + " over " + std::to_string(over));
    check_add_forward_quant(c, over, qs, rng);
    if (HasFatalFailure()) return;
  }
}

// One fp32-weight case: y against float64 and exactly T(x * rstd * w') of the returned rstd; gx and gw against
// float64.
void check_weight_f32(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c) + " weight f32");
  Inputs in = make_inputs(c, rng);
  in.w = HostMatrix(RMSNORM_DTYPE_F32, 1, c.cols, c.cols, offset_of(c));
  fill_random(in.w, rng);
  HostMatrix y;
  std::vector<float> rstd;
  gpu_forward(c, in, &y, &rstd);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<double> yr(n), rr(static_cast<size_t>(c.rows));
  reference::forward(c.rows, c.cols, xd.data(), wd.data(), ref_options(c), yr.data(), rr.data(), nullptr);
  EXPECT_TRUE(check_matrix("y", y, yr, [&](int64_t r, int64_t k) { return y_tol(c.dtype, yr[r * c.cols + k], c.cols); }));
  const YFromRstd want{c, in, rstd};
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k)
      ASSERT_EQ(static_cast<float>(y.get(r, k)), want(r, k)) << "y at row " << r << " col " << k;
  BackwardOut out;
  gpu_backward(c, in, rstd, &out, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  expect_backward_matches_reference(c, in, out);
}

// RMSNORM_FLAG_WEIGHT_F32 (an fp32 weight with 16-bit x: in the rows and cluster bands the plain call's kernels with
// the weight read as fp32, in the looped band the looped kernels' fp32-weight forms): y against float64 with the
// fp32 weight's values, and exactly T(x * rstd * w') of the rstd returned; gx and gw (fp32) against float64; every
// band's D, aligned, misaligned and padded (D = 22 and 4099: padded rows that stay 16-byte aligned, a partial last
// chunk), with and without the Gemma offset. Below the looped band rstd is the plain call's, bit for bit.
TEST_F(Cuda, WeightF32) {
  std::mt19937_64 rng(46);
  for (int64_t d : {1, 22, 33, 1000, 4096, 4099, 40000, 300000})
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F16})
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded}) {
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.layout = lay;
        c.rows = d > 100000 ? 3 : d > 8192 ? 17 : 300;
        c.hetero = true;
        c.weight_f32 = true;
        c.weight_offset = d % 2 == 1;
        c.gw_mode = d % 3 == 0 ? RMSNORM_GW_ACCUMULATE_F32 : RMSNORM_GW_STORE_F32;
        check_weight_f32(c, rng);
        if (HasFailure()) return;
        // Below the looped band (16-byte rows or not: the arena's bases are 256-byte aligned): rstd as the plain
        // forward's (no weight).
        const plan::Io io = offset_of(c) == 0 && stride_of(c) * 2 % 16 == 0 ? plan::Io::kVector : plan::Io::kElement;
        if (plan::weight_f32_forward_launch(c.rows, c.cols, 2, io, current_plan_device()).row.band !=
            plan::Band::kLooped) {
          SCOPED_TRACE(describe(c) + " weight f32 against the plain call's rstd");
          Inputs in = make_inputs(c, rng);
          in.w = HostMatrix(RMSNORM_DTYPE_F32, 1, c.cols, c.cols, 0);
          fill_random(in.w, rng);
          HostMatrix y32, y16;
          std::vector<float> r32, r16;
          gpu_forward(c, in, &y32, &r32);
          Case plain = c;
          plain.weight_f32 = false;
          plain.weight = false;
          gpu_forward(plain, in, &y16, &r16);
          ASSERT_FALSE(HasFatalFailure());
          for (int64_t r = 0; r < c.rows; ++r)
            ASSERT_EQ(0, std::memcmp(&r32[r], &r16[r], 4))
                << "rstd at row " << r << ": " << r32[r] << " against " << r16[r];
        }
      }
}

// A NaN in a row makes all its y NaN: max|y| ignores them, so the scale is the smallest, and q is 448 (fp8: the
// clamp maps NaN there) or 0 (int8); on the fused and the looped path.
TEST_F(Cuda, ForwardQuantNanRow) {
  std::mt19937_64 rng(44);
  for (Layout lay : {Layout::kAligned, Layout::kOffset})
    for (const QuantSpec& qs : kQuantSpecs) {
      Case c;
      c.cols = 64;
      c.rows = 4;
      c.layout = lay;
      SCOPED_TRACE(describe(c) + describe(qs));
      Inputs in = make_inputs(c, rng);
      in.x.set(1, 3, NAN);
      QuantOut out;
      gpu_forward_quant(c, in, qs, &out);
      ASSERT_FALSE(HasFatalFailure());
      const bool fp8 = qs.kind == RMSNORM_QUANT_FP8_E4M3;
      if (qs.mode == RMSNORM_QUANT_PER_ROW) EXPECT_EQ(out.scales[1], fp8 ? 1.0f / (448.0f * 512.0f) : FLT_EPSILON);
      for (int64_t k = 0; k < c.cols; ++k)
        ASSERT_EQ(int(out.q[static_cast<size_t>(q_stride_of(c) + k)]), fp8 ? 0x7E : 0) << "col " << k;
      expect_quant_rule(c, qs, out, YFromRstd{c, in, out.rstd});
    }
}

// Row `pos` of in as a batch of one, in the same layout (the weight shared).
Inputs row_alone(const Case& c, const Inputs& in, int64_t pos) {
  Inputs one;
  one.x = HostMatrix(c.dtype, 1, c.cols, stride_of(c), offset_of(c));
  for (int64_t k = 0; k < c.cols; ++k) one.x.set(0, k, in.x.get(pos, k));
  one.w = in.w;
  return one;
}

// q, the row scales and rstd of a row are the same bits alone as in a batch, on both paths.
TEST_F(Cuda, ForwardQuantBatchInvariance) {
  std::mt19937_64 rng(45);
  for (int64_t d : {64, 4096, 4099, 40000, 300000})
    for (Layout lay : {Layout::kAligned, Layout::kOffset}) {
      Case c;
      c.cols = d;
      c.layout = lay;
      c.rows = d > 100000 ? 5 : 2000;
      c.hetero = true;
      const QuantSpec qs{RMSNORM_QUANT_FP8_E4M3, RMSNORM_QUANT_PER_ROW, false};
      SCOPED_TRACE(describe(c));
      const Inputs in = make_inputs(c, rng);
      QuantOut big;
      gpu_forward_quant(c, in, qs, &big);
      ASSERT_FALSE(HasFatalFailure());
      const int64_t qs_big = q_stride_of(c);
      for (int64_t pos : {int64_t{0}, c.rows / 2, c.rows - 1}) {
        Case one = c;
        one.rows = 1;
        const Inputs in1 = row_alone(c, in, pos);
        QuantOut small;
        gpu_forward_quant(one, in1, qs, &small);
        ASSERT_FALSE(HasFatalFailure());
        ASSERT_EQ(0, std::memcmp(&small.rstd[0], &big.rstd[pos], 4)) << "rstd, row " << pos;
        ASSERT_EQ(0, std::memcmp(&small.scales[0], &big.scales[pos], 4)) << "scale, row " << pos;
        ASSERT_EQ(0, std::memcmp(small.q.data(), big.q.data() + pos * qs_big, static_cast<size_t>(d))) << "q, row " << pos;
      }
    }
}

// ---- block scales (rmsnorm_forward_block_quant) -------------------------------------------------

struct BlockSpec {
  int32_t kind = RMSNORM_QUANT_FP8_E4M3;
  int block_cols = 128;
  bool col_major = false;  // the scales transposed (row stride 1)
  bool ub = false;         // fp8: scale_ub = kScaleUb
};
std::string describe(const BlockSpec& b) {
  return std::string(b.kind == RMSNORM_QUANT_FP8_E4M3 ? " fp8" : " int8") + " block " + std::to_string(b.block_cols) +
         (b.col_major ? " column-major" : " row-major") + (b.ub ? " ub" : "");
}
const BlockSpec kBlockSpecs[] = {{RMSNORM_QUANT_FP8_E4M3, 128, false, false}, {RMSNORM_QUANT_INT8, 64, true, false},
                                 {RMSNORM_QUANT_FP8_E4M3, 64, false, true},   {RMSNORM_QUANT_INT8, 128, false, false},
                                 {RMSNORM_QUANT_FP8_E4M3, 128, true, true},   {RMSNORM_QUANT_INT8, 64, false, false},
                                 {RMSNORM_QUANT_FP8_E4M3, 64, true, false},   {RMSNORM_QUANT_INT8, 128, true, false}};

// The scales matrix: row-major with a padding float after each row, or column-major with one after each block's
// column, so that a write to the padding shows.
int64_t blocks_of(const Case& c, const BlockSpec& b) { return (c.cols + b.block_cols - 1) / b.block_cols; }
int64_t scales_row_stride(const Case& c, const BlockSpec& b) { return b.col_major ? 1 : blocks_of(c, b) + 1; }
int64_t scales_block_stride(const Case& c, const BlockSpec& b) { return b.col_major ? c.rows + 1 : 1; }
size_t scales_len(const Case& c, const BlockSpec& b) {
  return static_cast<size_t>(b.col_major ? blocks_of(c, b) * (c.rows + 1) : c.rows * (blocks_of(c, b) + 1));
}

// One call of the plain form (dres null) or the add form (h at dh) on device operands; q, the whole scales buffer
// and rstd downloaded, q's bytes before and past it checked unwritten.
void run_block_quant(const Case& c, const BlockSpec& bs, const void* dx, const void* dres, void* dh, const void* dw,
                     QuantOut* out) {
  const int64_t qstride = q_stride_of(c);
  const int64_t qoff = q_layout(c) == Layout::kOffset ? 1 : 0;
  const size_t qbytes = static_cast<size_t>(c.rows * qstride);
  const size_t ns = scales_len(c, bs);
  uint8_t* dq = static_cast<uint8_t*>(Arena::get().alloc(qbytes + 16));
  float* dscales = static_cast<float*>(Arena::get().alloc(ns * 4 + 4));
  float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4 + 4));
  float* dub = static_cast<float*>(Arena::get().alloc(16));
  CUDA_OK(cudaMemcpy(dub, &kScaleUb, 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dq, kQPoison, qbytes + 16));
  CUDA_OK(cudaMemset(dscales, 0xFF, ns * 4));
  CUDA_OK(cudaMemset(drstd, 0xFF, static_cast<size_t>(c.rows) * 4));
  poison_shared_memory();
  const rmsnorm_block_quant_t bq{bs.kind, bs.block_cols, dscales, scales_row_stride(c, bs), scales_block_stride(c, bs),
                                 bs.ub ? dub : nullptr};
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t b = cuda_backend();
  const void* w = c.weight ? dw : nullptr;
  if (dres == nullptr) {
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_forward_block_quant(&p, dx, stride_of(c), w, &bq, dq + qoff, qstride, drstd, &b))
        << rmsnorm_last_error();
  } else {
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_add_forward_block_quant(&p, dx, stride_of(c), dres, stride_of(c), w, dh,
                                                                      stride_of(c), &bq, dq + qoff, qstride, drstd, &b))
        << rmsnorm_last_error();
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> all(qbytes + 16);
  CUDA_OK(cudaMemcpy(all.data(), dq, all.size(), cudaMemcpyDeviceToHost));
  ASSERT_EQ(all[0], qoff == 1 ? kQPoison : all[0]) << "q written before its first byte";
  out->q.assign(all.begin() + qoff, all.begin() + qoff + static_cast<int64_t>(qbytes));
  for (size_t i = qoff + qbytes; i < all.size(); ++i) ASSERT_EQ(all[i], kQPoison) << "q written past its end";
  out->scales.assign(ns, 0.0f);
  out->rstd.assign(static_cast<size_t>(c.rows), NAN);
  CUDA_OK(cudaMemcpy(out->scales.data(), dscales, ns * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(out->rstd.data(), drstd, out->rstd.size() * 4, cudaMemcpyDeviceToHost));
}

void gpu_forward_block_quant(const Case& c, const Inputs& in, const BlockSpec& bs, QuantOut* out) {
  Arena::get().reset();
  const Dev dx = upload(in.x), dw = upload(in.w);
  run_block_quant(c, bs, dx.data(), nullptr, nullptr, dw.data(), out);
}

// Every scale at its address and every q byte by the rule (src/common/quant.hpp: each block the per-row rule
// alone) from y(row, col); the padding of q and of the scales matrix unwritten.
template <typename YFn>
void expect_block_rule(const Case& c, const BlockSpec& bs, const QuantOut& out, YFn&& y) {
  const bool fp8 = bs.kind == RMSNORM_QUANT_FP8_E4M3;
  const int64_t qstride = q_stride_of(c), nb = blocks_of(c, bs);
  const int64_t rs = scales_row_stride(c, bs), bst = scales_block_stride(c, bs);
  std::vector<char> addressed(out.scales.size(), 0);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = b * bs.block_cols, k1 = std::min<int64_t>(c.cols, k0 + bs.block_cols);
      float amax = 0.0f;
      for (int64_t k = k0; k < k1; ++k) amax = std::fmax(amax, std::fabs(y(r, k)));
      const float s = quant::row_scale(amax, bs.ub ? &kScaleUb : nullptr, fp8);
      const size_t at = static_cast<size_t>(r * rs + b * bst);
      addressed[at] = 1;
      ASSERT_EQ(0, std::memcmp(&out.scales[at], &s, 4))
          << "scale of row " << r << " block " << b << ": " << out.scales[at] << " vs " << s;
      const float mul = 1.0f / s;
      for (int64_t k = k0; k < k1; ++k) {
        const float yv = y(r, k);
        const float v = fp8 ? yv / s : yv * mul;
        const uint8_t want = fp8 ? quant::fp8_e4m3_saturated(v) : static_cast<uint8_t>(quant::int8_saturated(v));
        const uint8_t got = out.q[static_cast<size_t>(r * qstride + k)];
        ASSERT_EQ(int(got), int(want)) << "q at row " << r << " col " << k << " (block " << b << "): y " << yv
                                       << " v " << v;
      }
    }
    for (int64_t k = c.cols; k < qstride; ++k)
      ASSERT_EQ(out.q[static_cast<size_t>(r * qstride + k)], kQPoison) << "q padding written, row " << r << " col " << k;
  }
  for (size_t i = 0; i < out.scales.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &out.scales[i], 4);
    if (!addressed[i]) ASSERT_EQ(bits, 0xFFFFFFFFu) << "scales padding written at " << i;
  }
}

// Whether the plan fuses this case (asked of the planner, so that the test counts what it ran).
bool block_quant_fused(const Case& c, const BlockSpec& bs) {
  const int esize = c.dtype == RMSNORM_DTYPE_F32 ? 4 : 2;
  const plan::Io io = io_of_case(c);
  return !c.weight_f32 &&
         plan::quant_fused(plan::forward_launch(c.rows, c.cols, esize, io, current_plan_device()),
                           q_layout(c) != Layout::kOffset, bs.block_cols / plan::vec_elems(esize));
}

// One case: rstd within the reference's tolerance, q and the scales by the rule from y computed from that rstd;
// fused, rstd bit for bit rmsnorm_forward's and q the rule applied to its y. Row 2 is all zero (the smallest
// scale), row 3's first block 1000x the rest, row 4's second block zero. Returns whether it was fused.
bool check_forward_block_quant(const Case& c, const BlockSpec& bs, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c) + describe(bs));
  Inputs in = make_inputs(c, rng);
  for (int64_t k = 0; k < c.cols; ++k) {
    if (c.rows > 2) in.x.set(2, k, 0.0);
    if (c.rows > 3 && k < bs.block_cols) in.x.set(3, k, static_cast<double>(in.x.get(3, k)) * 1000.0);
    if (c.rows > 4 && k >= bs.block_cols && k < 2 * bs.block_cols) in.x.set(4, k, 0.0);
  }
  QuantOut out;
  gpu_forward_block_quant(c, in, bs, &out);
  if (::testing::Test::HasFatalFailure()) return false;
  expect_rstd_near_reference(c, in, out.rstd);
  expect_block_rule(c, bs, out, YFromRstd{c, in, out.rstd});
  if (::testing::Test::HasFatalFailure()) return false;
  const bool fused = block_quant_fused(c, bs);
  if (fused)
    expect_fused_is_the_forwards(c, in, out.rstd, [&](const auto& y) { expect_block_rule(c, bs, out, y); });
  return fused;
}

// Every band, layout and dtype, both kinds, block sizes and scale layouts, scale_ub; D a multiple of the block
// or not (a partial last block, a partial last chunk); q's alignment apart from x's; an fp32 weight (the looped
// kernel's form). Both the fused and the looped kernels are seen.
TEST_F(Cuda, ForwardBlockQuant) {
  std::mt19937_64 rng(53);
  std::vector<int64_t> ds(std::begin(kBandDs), std::end(kBandDs));
  // 100 and 120: blocks of 64 columns over 8 threads of 2 chunks per row.
  for (int64_t d : {100, 120, 129, 134, 200, 256, 261, 4099, 16384}) ds.push_back(d);
  int fused = 0, looped = 0, k = 0;
  for (int64_t d : ds)
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16})
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded}) {
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.layout = lay;
        c.rows = d > 100000 ? 5 : d > 8192 ? 17 : 300;
        c.hetero = true;
        c.weight = k % 5 != 4;
        c.weight_offset = k % 7 == 3;
        c.round_xhat = k % 3 == 1;
        const BlockSpec bs = kBlockSpecs[k % 8];
        ++k;
        (check_forward_block_quant(c, bs, rng) ? fused : looped)++;
        if (HasFatalFailure()) return;
      }
  for (int64_t d : {64, 1000, 4096, 4099})
    for (int pair = 0; pair < 3; ++pair) {
      Case c;
      c.cols = d;
      c.rows = 300;
      c.hetero = true;
      if (pair == 2) {
        c.weight_f32 = true;
      } else {
        c.layout = pair == 0 ? Layout::kAligned : Layout::kOffset;
        c.q_layout = static_cast<int>(pair == 0 ? Layout::kOffset : Layout::kAligned);
      }
      for (const BlockSpec& bs : {kBlockSpecs[0], kBlockSpecs[1]}) {
        EXPECT_FALSE(check_forward_block_quant(c, bs, rng)) << "fused although q or x is misaligned, or w is fp32";
        if (HasFatalFailure()) return;
      }
    }
  EXPECT_GT(fused, 0);
  EXPECT_GT(looped, 0);
}

// Rows whose y overflow, and signed zeros: the kernels' correction-only quotient runs only for rows (and blocks) whose
// quotients are all finite (QuantRow::finite), and every other row takes the guarded form. Column 5's weight is
// 3e38, so y there is +-inf where |x r| > 1.13 and finite but huge elsewhere: max|y| = inf gives s = inf without
// scale_ub (finite y / inf = +-0, inf / inf = NaN -> 448) and y / s past FLT_MAX with it (+-inf -> +-448). Row 1's
// column 5 is large and positive, row 2's negative (y = +inf and -inf); row 3 is zeros of both signs (y = -0 where
// x = -0 and w > 0: e4m3 code 0x80). Every q and scale by the documented rule (true division for fp8 per row),
// on the fused and looped paths, per-row and block scales.
TEST_F(Cuda, ForwardQuantOverflowAndSignedZeros) {
  std::mt19937_64 rng(57);
  // 6 rows, and at 4096 bf16 also rows enough for plan::quant_sum_pairs (128 threads of 4 chunks).
  for (int64_t rows : {int64_t{6}, plan::kQuantSumPairsMinRows + 77})
    for (int64_t d : {64, 4096, 4099})
      for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32})
        for (Layout lay : {Layout::kAligned, Layout::kOffset}) {
          if (rows > 6 && (d != 4096 || dt != RMSNORM_DTYPE_BF16 || lay != Layout::kAligned)) continue;
          Case c;
          c.dtype = dt;
          c.cols = d;
          c.rows = rows;
          c.layout = lay;
          c.weight = true;
          Inputs in = make_inputs(c, rng);
          for (int64_t k = 0; k < c.cols; ++k) {
            in.x.set(3, k, k % 2 == 0 ? -0.0 : 0.0);
            in.w.set(0, k, k == 5 ? 3e38 : std::fabs(static_cast<double>(in.w.get(0, k))) + 0.25);
          }
          in.x.set(1, 5, 50.0);
          in.x.set(2, 5, -50.0);
          for (const QuantSpec& qs : kQuantSpecs) {
            SCOPED_TRACE(describe(c) + describe(qs));
            QuantOut out;
            gpu_forward_quant(c, in, qs, &out);
            ASSERT_FALSE(HasFatalFailure());
            expect_quant_rule(c, qs, out, YFromRstd{c, in, out.rstd});
            ASSERT_FALSE(HasFatalFailure());
            if (qs.kind == RMSNORM_QUANT_FP8_E4M3)
              for (int64_t k = 0; k < c.cols; k += 2)
                ASSERT_EQ(int(out.q[static_cast<size_t>(3 * q_stride_of(c) + k)]), 0x80) << "-0 at col " << k;
          }
          for (const BlockSpec& bs : kBlockSpecs) {
            SCOPED_TRACE(describe(c) + describe(bs));
            QuantOut out;
            gpu_forward_block_quant(c, in, bs, &out);
            ASSERT_FALSE(HasFatalFailure());
            expect_block_rule(c, bs, out, YFromRstd{c, in, out.rstd});
            ASSERT_FALSE(HasFatalFailure());
          }
        }
}

// Block scales where each thread sums as two threads of the plain forward's row (plan::quant_sum_pairs: 128
// threads of 4 chunks, a thread's four blocks' scales from one block_absmax_all): every scale and q byte by the
// rule, rstd and q bit for bit rmsnorm_forward's (check_forward_block_quant), every block size and scale layout,
// whole and partial last chunks and blocks, an odd row count; the plan is asked first, so the case is seen to take
// that path.
TEST_F(Cuda, ForwardBlockQuantSumPairs) {
  std::mt19937_64 rng(56);
  int k = 0;
  for (const PairCase& pc : kPairCases)
    for (int n = 0; n < 2; ++n) {
      const Case c = pair_case(pc, k);
      const BlockSpec bs = kBlockSpecs[k++ % 8];
      const int esize = pc.dtype == RMSNORM_DTYPE_F32 ? 4 : 2;
      const plan::Launch l = plan::quant_launch(c.rows, c.cols, esize, io_of_case(c), true, current_plan_device(),
                                                bs.block_cols / plan::vec_elems(esize));
      ASSERT_EQ(l.sum_tpr, plan::kFewChunksTpr) << describe(c) << describe(bs);
      ASSERT_TRUE(check_forward_block_quant(c, bs, rng)) << "not fused";
      if (HasFatalFailure()) return;
    }
}

// rmsnorm_add_forward_block_quant: h exactly by the rule, and q, every scale and rstd bit for bit this device's
// rmsnorm_forward_block_quant of that h, h in its own buffer, over the residual and over x.
TEST_F(Cuda, AddForwardBlockQuant) {
  std::mt19937_64 rng(54);
  struct ACase { int64_t d; int32_t dtype; Layout layout; int64_t rows; };
  std::vector<ACase> cases;
  for (int64_t d : {64, 200, 4096, 4099, 40000})
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32})
      for (Layout lay : {Layout::kAligned, Layout::kOffset, Layout::kPadded})
        cases.push_back({d, dt, lay, d > 8192 ? 17 : 300});
  // Rows enough for plan::quant_sum_pairs: whole and partial last chunks at 16-bit, fp32.
  const int64_t pair_rows = plan::kQuantSumPairsMinRows + 77;
  cases.push_back({4096, RMSNORM_DTYPE_BF16, Layout::kAligned, pair_rows});
  cases.push_back({4095, RMSNORM_DTYPE_BF16, Layout::kPadded, pair_rows});
  cases.push_back({2048, RMSNORM_DTYPE_F32, Layout::kAligned, pair_rows});
  int k = 0;
  for (const ACase& ac : cases)
    for (int over : {0, 1, 2}) {
      Case c;
      c.dtype = ac.dtype;
      c.cols = ac.d;
      c.layout = ac.layout;
      c.rows = ac.rows;
      c.hetero = true;
      const BlockSpec bs = kBlockSpecs[k++ % 8];
      SCOPED_TRACE(describe(c) + describe(bs) + " over " + std::to_string(over));
      Arena::get().reset();
      const AddOperands a = make_add_operands(c, rng);
      QuantOut got;
      run_block_quant(c, bs, a.dx.data(), a.dres.data(), a.h_ptr(over), a.dw.data(), &got);
      ASSERT_FALSE(HasFatalFailure());
      HostMatrix h_got;
      download_checked_h(c, a, over, &h_got);
      ASSERT_FALSE(HasFatalFailure());
      Inputs hin;
      hin.x = h_got;
      hin.w = a.in.w;
      QuantOut want;
      gpu_forward_block_quant(c, hin, bs, &want);
      ASSERT_FALSE(HasFatalFailure());
      ASSERT_EQ(0, std::memcmp(got.rstd.data(), want.rstd.data(), got.rstd.size() * 4)) << "rstd";
      ASSERT_EQ(0, std::memcmp(got.scales.data(), want.scales.data(), got.scales.size() * 4)) << "scales";
      for (size_t i = 0; i < got.q.size(); ++i)
        ASSERT_EQ(int(got.q[i]), int(want.q[i])) << "q byte " << i << " (row " << i / q_stride_of(c) << ")";
    }
}

// A row's q, block scales and rstd are the same bits alone as in a batch of thousands (fused and looped D).
TEST_F(Cuda, ForwardBlockQuantBatchInvariance) {
  std::mt19937_64 rng(55);
  for (int64_t d : {200, 4096, 4099, 40000})
    for (Layout lay : {Layout::kAligned, Layout::kOffset}) {
      Case c;
      c.cols = d;
      c.layout = lay;
      c.rows = d > 8192 ? 40 : 2000;
      c.hetero = true;
      const BlockSpec bs{RMSNORM_QUANT_FP8_E4M3, 128, false, false};
      SCOPED_TRACE(describe(c));
      const Inputs in = make_inputs(c, rng);
      QuantOut big;
      gpu_forward_block_quant(c, in, bs, &big);
      ASSERT_FALSE(HasFatalFailure());
      const int64_t q_big = q_stride_of(c), nb = blocks_of(c, bs), rs_big = scales_row_stride(c, bs);
      for (int64_t pos : {int64_t{0}, c.rows / 2, c.rows - 1}) {
        Case one = c;
        one.rows = 1;
        const Inputs in1 = row_alone(c, in, pos);
        QuantOut small;
        gpu_forward_block_quant(one, in1, bs, &small);
        ASSERT_FALSE(HasFatalFailure());
        ASSERT_EQ(0, std::memcmp(&small.rstd[0], &big.rstd[pos], 4)) << "rstd, row " << pos;
        ASSERT_EQ(0, std::memcmp(small.scales.data(), big.scales.data() + pos * rs_big, static_cast<size_t>(nb) * 4))
            << "scales, row " << pos;
        ASSERT_EQ(0, std::memcmp(small.q.data(), big.q.data() + pos * q_big, static_cast<size_t>(d))) << "q, row " << pos;
      }
    }
}

// gx of a row is the same bits in a batch of 1 or 3 as in a batch of
// thousands: in the rows band's 16-byte path the small batches take
// backward_rows_direct_kernel (no CTA has a second row group) and the big
// one the pipelined backward_kernel (asked of the plan first, so that the
// test cannot pass by running one kernel twice), D a multiple of the chunk
// width or not; in the other bands both run the same kernel.
TEST_F(Cuda, BackwardBatchInvariance) {
  std::mt19937_64 rng(21);
  const plan::Device pd = current_plan_device();
  // 22 and 4099 with the padded layout: 16-byte aligned rows (the padded
  // stride is a multiple of 8 elements) whose last chunk is partial.
  for (int64_t d : {1, 8, 22, 33, 384, 1000, 4096, 4099, 8192, 40000}) {
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32}) {
      Case c;
      c.dtype = dt;
      c.cols = d;
      const int esize = dt == RMSNORM_DTYPE_F32 ? 4 : 2;
      // Rows band: two row groups for every CTA of the big batch.
      const int64_t slots =
          plan::backward_launch(int64_t{1} << 20, d, esize, plan::Io::kVector, true, pd).row.rows_per_cta;
      c.rows = d <= 8192 ? std::max<int64_t>(3000, 2 * slots * pd.sm_count + 5) : 300;
      c.layout = d == 22 || d == 4099 ? Layout::kPadded : Layout::kAligned;
      c.with_rstd = false;
      c.gw_mode = RMSNORM_GW_STORE_F32;
      SCOPED_TRACE(describe(c));
      const plan::Io io = (stride_of(c) * esize) % 16 == 0 ? plan::Io::kVector : plan::Io::kElement;
      if (d == 22 || d == 4099) ASSERT_EQ(io, plan::Io::kVector);
      if (d <= 8192 && io == plan::Io::kVector) {
        ASSERT_EQ(plan::backward_launch(c.rows, d, esize, io, true, pd).kernel, plan::Kernel::kBackwardRows);
        const plan::Kernel small = plan::backward_launch(3, d, esize, io, true, pd).kernel;
        ASSERT_TRUE(small == plan::Kernel::kBackwardRowsDirect || small == plan::Kernel::kBackwardRowsDecode);
      }
      const Inputs in = make_inputs(c, rng);
      BackwardOut big;
      gpu_backward(c, in, {}, &big, rng);
      ASSERT_FALSE(HasFatalFailure());
      for (int64_t pos : {int64_t{0}, c.rows / 2, c.rows - 1}) {
        for (int64_t batch : {int64_t{1}, int64_t{3}}) {
          Case cs = c;
          cs.rows = batch;
          Inputs sub = make_inputs(cs, rng);
          sub.w = in.w;
          const int64_t at = batch == 1 ? 0 : 1;
          for (int64_t k = 0; k < d; ++k) {
            sub.x.set(at, k, in.x.get(pos, k));
            sub.gy.set(at, k, in.gy.get(pos, k));
          }
          BackwardOut small;
          gpu_backward(cs, sub, {}, &small, rng);
          ASSERT_FALSE(HasFatalFailure());
          for (int64_t k = 0; k < d; ++k)
            ASSERT_EQ(small.gx.get(at, k), big.gx.get(pos, k))
                << "gx differs, row " << pos << " batch " << batch << " col " << k;
        }
      }
    }
  }
}

// Whether the aligned backward of c's shape, gw wanted and rstd given, takes gw by column CTAs on this device
// (plan::split_backward_launch; the launcher also needs gx != gy, as every test case here has).
bool takes_split_plan(const Case& c) {
  const int esize = c.dtype == RMSNORM_DTYPE_F32 ? 4 : 2;
  const plan::Device pd = current_plan_device();
  const plan::Io io = plan::Io::kVector;
  const plan::Launch b = c.weight_f32 ? plan::weight_f32_backward_launch(c.rows, c.cols, esize, io, true, pd)
                                      : plan::backward_launch(c.rows, c.cols, esize, io, true, pd);
  return plan::split_backward_launch(b, c.rows, pd).kernel == plan::Kernel::kBackwardRowsSplit;
}

// Forward and backward share one row geometry and one summation order
// (plan.hpp), so the backward's recomputed rstd is the forward's bit for bit:
// backward without rstd gives the same gx and gw as backward with the
// forward's rstd, in every band and dtype, aligned or not, and with an fp32
// weight (RMSNORM_FLAG_WEIGHT_F32: the rows and cluster bands' kernels read
// it as fp32, the looped band's fp32-weight forms above; forward and backward
// alike). With the forward's rstd and few rows the rows band runs gw by
// column CTAs (plan::Kernel::kBackwardRowsSplit), without it the direct kernel
// and the finalize: gw must be the same bits (D 4096, 12288 and 16384 at
// 16-bit, 4096 at fp32 take the split plan at 37 rows; counted below).
TEST_F(Cuda, RecomputedRstdIsTheForwardsBitwise) {
  std::mt19937_64 rng(15);
  int split = 0;
  for (int64_t d : {1, 33, 384, 1000, 4096, 12288, 16384, 40000, 140000, 300000}) {
    for (int32_t dt : kDtypes) {
      for (Layout lay : {Layout::kAligned, Layout::kOffset})
      for (bool wf32 : {false, true}) {
        if (wf32 && dt == RMSNORM_DTYPE_F32) continue;
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.layout = lay;
        c.rows = d > 100000 ? 3 : 37;
        c.with_rstd = true;
        c.gw_mode = RMSNORM_GW_STORE_F32;
        c.weight_f32 = wf32;
        SCOPED_TRACE(describe(c));
        const Inputs in = make_inputs(c, rng);
        HostMatrix y;
        std::vector<float> rstd;
        gpu_forward(c, in, &y, &rstd);
        ASSERT_FALSE(HasFatalFailure());
        BackwardOut given, recomputed;
        gpu_backward(c, in, rstd, &given, rng);
        ASSERT_FALSE(HasFatalFailure());
        Case r = c;
        r.with_rstd = false;
        gpu_backward(r, in, {}, &recomputed, rng);
        ASSERT_FALSE(HasFatalFailure());
        ASSERT_EQ(0, std::memcmp(given.gx.storage.data(), recomputed.gx.storage.data(), given.gx.storage.size()))
            << "gx with the forward's rstd differs from gx with rstd recomputed";
        ASSERT_EQ(given.gw, recomputed.gw) << "gw differs";
        if (lay == Layout::kAligned && takes_split_plan(c)) ++split;
      }
    }
  }
  EXPECT_GE(split, 8) << "cases with gw by column CTAs";
}

// gw by column CTAs (plan::Kernel::kBackwardRowsSplit) in every gw mode, against the float64 reference and the
// CPU backend: the split kernel writes gw itself (no finalize), so each mode's store, and the accumulation into
// the gw already there, goes through it; with an fp32 weight too. On the H200 the split plan is taken at D = 4096
// and 8192 for these row counts (but fp32 at 128 rows); D = 1000 (more row slots per CTA than the plan allows)
// keeps the direct kernel and the finalize. Counted below, so that a plan change that stops taking it fails here.
TEST_F(Cuda, SplitBackwardGwModes) {
  std::mt19937_64 rng(23);
  int split = 0;
  for (int64_t d : {1000, 4096, 8192}) {
    for (int32_t dt : kDtypes) {
      for (int64_t rows : {5, 37, 128}) {
        for (int32_t mode :
             {RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE, RMSNORM_GW_ACCUMULATE_F32}) {
          for (bool wf32 : {false, true}) {
            if (wf32 && dt == RMSNORM_DTYPE_F32) continue;
            Case c;
            c.dtype = dt;
            c.cols = d;
            c.rows = rows;
            c.with_rstd = true;
            c.gw_mode = mode;
            c.weight_f32 = wf32;
            c.compare_cpu = true;
            check_backward(c, rng);
            if (HasFailure()) return;
            if (takes_split_plan(c)) ++split;
          }
        }
      }
    }
  }
  EXPECT_GE(split, 16) << "cases with gw by column CTAs";
}

// gw over 1M rows, fp32 output: normwise relative error <= 1e-5 before any
// rounding to a 16-bit dtype; and bf16 gw at 131072 x 128 within 2.5e-3
// normwise (a 16-bit column sum would be near 1.4e-2).
TEST_F(Cuda, GwAccuracyManyRows) {
  std::mt19937_64 rng(9);
  struct Shape {
    int64_t rows, cols;
    int32_t dt, mode;
    double bound;
  };
  for (const Shape s : {Shape{1 << 20, 128, RMSNORM_DTYPE_BF16, RMSNORM_GW_STORE_F32, 1e-5},
                        Shape{131072, 128, RMSNORM_DTYPE_BF16, RMSNORM_GW_STORE, 2.5e-3},
                        Shape{1 << 20, 64, RMSNORM_DTYPE_F32, RMSNORM_GW_STORE_F32, 1e-5}}) {
    Case c;
    c.dtype = s.dt;
    c.rows = s.rows;
    c.cols = s.cols;
    c.gw_mode = s.mode;
    c.with_rstd = false;
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c, rng);
    BackwardOut out;
    gpu_backward(c, in, {}, &out, rng);
    ASSERT_FALSE(HasFatalFailure());
    const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double(), gyd = in.gy.to_double();
    std::vector<double> gx(static_cast<size_t>(c.rows * c.cols)), gw(static_cast<size_t>(c.cols));
    reference::backward(c.rows, c.cols, xd.data(), wd.data(), gyd.data(), ref_options(c), gx.data(), gw.data(), nullptr,
                        nullptr);
    double num = 0, den = 0;
    for (int64_t k = 0; k < c.cols; ++k) {
      num += (out.gw[k] - gw[k]) * (out.gw[k] - gw[k]);
      den += gw[k] * gw[k];
    }
    const double rel = std::sqrt(num / den);
    std::printf("gw %lldx%lld %s mode %d: normwise relative error %.3g (bound %.3g)\n", static_cast<long long>(c.rows),
                static_cast<long long>(c.cols), dtype_name(c.dtype), c.gw_mode, rel, s.bound);
    EXPECT_LE(rel, s.bound);
  }
}

// rows * D > 2^31 (and rows > 65535): identical rows, so every output row
// must equal row 0 bitwise (batch invariance), and row 0 matches the reference.
TEST_F(Cuda, MoreThan2To31Elements) {
  const int64_t d = 4096, rows = (int64_t{1} << 31) / d + 3;
  const int32_t dt = RMSNORM_DTYPE_BF16;
  const size_t row_bytes = static_cast<size_t>(d) * 2, bytes = row_bytes * static_cast<size_t>(rows);
  std::mt19937_64 rng(10);
  HostMatrix xrow(dt, 1, d), gyrow(dt, 1, d), w(dt, 1, d);
  fill_random(xrow, rng);
  fill_random(gyrow, rng);
  fill_random(w, rng);
  void *x, *y, *gy, *gx, *dw, *gw, *ws;
  CUDA_OK(cudaMalloc(&x, bytes));
  CUDA_OK(cudaMalloc(&y, bytes));
  CUDA_OK(cudaMalloc(&gy, bytes));
  CUDA_OK(cudaMalloc(&gx, bytes));
  CUDA_OK(cudaMalloc(&dw, row_bytes));
  CUDA_OK(cudaMalloc(&gw, static_cast<size_t>(d) * 4));
  CUDA_OK(cudaMemcpy(dw, w.data(), row_bytes, cudaMemcpyHostToDevice));
  // Replicate one row by doubling copies.
  for (auto [dst, src] : {std::pair<void*, const void*>{x, xrow.data()}, {gy, gyrow.data()}}) {
    CUDA_OK(cudaMemcpy(dst, src, row_bytes, cudaMemcpyHostToDevice));
    for (int64_t have = 1; have < rows; have *= 2) {
      const int64_t n = std::min(have, rows - have);
      CUDA_OK(cudaMemcpy(static_cast<char*>(dst) + have * row_bytes, dst, n * row_bytes, cudaMemcpyDeviceToDevice));
    }
  }
  CUDA_OK(cudaMemset(y, 0xFF, bytes));
  CUDA_OK(cudaMemset(gx, 0xFF, bytes));
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = rows;
  p.cols = d;
  p.dtype = dt;
  const rmsnorm_backend_t b = cuda_backend();
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, x, d, dw, y, d, nullptr, &b)) << rmsnorm_last_error();
  size_t ws_bytes = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE_F32, &b, &ws_bytes));
  CUDA_OK(cudaMalloc(&ws, ws_bytes));
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward(&p, x, d, dw, gy, d, nullptr, gx, d, gw, RMSNORM_GW_STORE_F32, ws,
                                                     ws_bytes, &b))
      << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<unsigned char> host(bytes);
  std::vector<double> xd = xrow.to_double(), wd = w.to_double(), gyd = gyrow.to_double();
  std::vector<double> yr(static_cast<size_t>(d)), gxr(static_cast<size_t>(d)), gwr(static_cast<size_t>(d)),
      gxs(static_cast<size_t>(d)), gws(static_cast<size_t>(d));
  reference::forward(1, d, xd.data(), wd.data(), reference::Options{}, yr.data(), nullptr, nullptr);
  reference::backward(1, d, xd.data(), wd.data(), gyd.data(), reference::Options{}, gxr.data(), gwr.data(), gxs.data(),
                      gws.data());
  for (const auto& item : {std::tuple<void*, std::vector<double>*, const char*>{y, &yr, "y"}, {gx, &gxr, "gx"}}) {
    void* dev = std::get<0>(item);
    const std::vector<double>* ref = std::get<1>(item);
    const char* name = std::get<2>(item);
    CUDA_OK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost));
    HostMatrix row0(dt, 1, d);
    std::memcpy(row0.data(), host.data(), row_bytes);
    EXPECT_TRUE(check_matrix(name, row0, *ref, [&](int64_t, int64_t k) {
      const double v = (*ref)[k];
      return ulp(dt, v) + acc_rel(d) * (name[0] == 'y' ? std::fabs(v) : gxs[k]);
    }));
    for (int64_t r = 1; r < rows; ++r)
      ASSERT_EQ(0, std::memcmp(host.data(), host.data() + r * row_bytes, row_bytes)) << name << " row " << r;
  }
  std::vector<float> gwh(static_cast<size_t>(d));
  CUDA_OK(cudaMemcpy(gwh.data(), gw, static_cast<size_t>(d) * 4, cudaMemcpyDeviceToHost));
  std::vector<double> expect(static_cast<size_t>(d));
  for (int64_t k = 0; k < d; ++k) expect[k] = gwr[k] * static_cast<double>(rows);
  EXPECT_TRUE(check_vector(
      "gw", d, [&](int64_t k) { return static_cast<double>(gwh[k]); }, expect,
      [&](int64_t k) { return (acc_rel(d) + acc_rel(rows)) * gws[k] * static_cast<double>(rows); }));
  for (void* ptr : {x, y, gy, gx, dw, gw, ws}) cudaFree(ptr);
}

// A case of kBandDs's D: 300 rows, 5 in the cluster and looped bands.
Case band_case(int64_t d) {
  Case c;
  c.cols = d;
  c.rows = d > 10000 ? 5 : 300;
  return c;
}

// The bits of y, rstd, gx and gw do not depend on where the operands sit:
// the same values with every row 16-byte aligned, one element off, and at an
// odd row stride (the misalignment changing from row to row) give the same
// results in every band. Batch invariance at odd strides rests on this, and
// each misaligned path computes its outputs in its own grouping.
TEST_F(Cuda, AlignmentDoesNotChangeBits) {
  std::mt19937_64 rng(53);
  auto copy_values = [](const HostMatrix& from, HostMatrix& to) {
    for (int64_t r = 0; r < from.rows; ++r)
      for (int64_t k = 0; k < from.cols; ++k) to.set(r, k, from.get(r, k));
  };
  for (int64_t d : {int64_t{33}, int64_t{128}, int64_t{512}, int64_t{1000}, int64_t{4095}, int64_t{4096},
                    int64_t{8200}, int64_t{20000}, int64_t{300000}}) {
    // The y forms (plain, weight offset, offset and rounded x_hat) where the aligned operands take the exact-rows
    // instances (the powers of two), against the element path's general kernel.
    const int forms = (d & (d - 1)) == 0 ? 3 : 1;
    for (int form = 0; form < forms; ++form) {
      for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32}) {
        Case a;
        a.dtype = dt;
        a.cols = d;
        a.rows = d > 10000 ? 9 : 37;
        a.gw_mode = RMSNORM_GW_STORE_F32;
        a.weight_offset = form >= 1;
        a.round_xhat = form == 2;
        const Inputs in_a = make_inputs(a, rng);
        HostMatrix y_a;
        std::vector<float> r_a;
        gpu_forward(a, in_a, &y_a, &r_a);
        ASSERT_FALSE(HasFatalFailure());
        BackwardOut b_a;
        gpu_backward(a, in_a, r_a, &b_a, rng);
        ASSERT_FALSE(HasFatalFailure());
        for (Layout lay : {Layout::kOffset, Layout::kPadded}) {
          Case o = a;
          o.layout = lay;
          SCOPED_TRACE(describe(o));
          Inputs in_o;
          in_o.x = HostMatrix(dt, o.rows, d, stride_of(o), offset_of(o));
          in_o.gy = HostMatrix(dt, o.rows, d, stride_of(o), offset_of(o));
          in_o.w = HostMatrix(dt, 1, d, d, offset_of(o));
          copy_values(in_a.x, in_o.x);
          copy_values(in_a.gy, in_o.gy);
          copy_values(in_a.w, in_o.w);
          HostMatrix y_o;
          std::vector<float> r_o;
          gpu_forward(o, in_o, &y_o, &r_o);
          ASSERT_FALSE(HasFatalFailure());
          BackwardOut b_o;
          gpu_backward(o, in_o, r_o, &b_o, rng);
          ASSERT_FALSE(HasFatalFailure());
          ASSERT_EQ(0, std::memcmp(r_a.data(), r_o.data(), r_a.size() * sizeof(float))) << "rstd differs";
          for (int64_t r = 0; r < o.rows; ++r)
            for (int64_t k = 0; k < d; ++k) {
              ASSERT_EQ(y_a.get(r, k), y_o.get(r, k)) << "y differs, row " << r << " col " << k;
              ASSERT_EQ(b_a.gx.get(r, k), b_o.gx.get(r, k)) << "gx differs, row " << r << " col " << k;
            }
          ASSERT_EQ(b_a.gw, b_o.gw) << "gw differs";
        }
      }
    }
  }
}

// y's float64 reference for a's inputs and its per-element tolerance. With
// round_xhat, y is T(T(x_hat) w'): the reference rounds the same way and the
// tolerance allows for x_hat that lie at a rounding boundary (as in
// check_forward).
struct ForwardExpected {
  int32_t dtype;
  int64_t cols;
  bool round_xhat;
  std::vector<double> y, xh, wprime;
  double tol(int64_t r, int64_t k) const {
    const size_t i = static_cast<size_t>(r * cols + k);
    return round_xhat ? y_round_xhat_tol(dtype, y[i], xh[i], wprime[static_cast<size_t>(k)], cols)
                      : y_tol(dtype, y[i], cols);
  }
};
ForwardExpected forward_expected(const Case& a, const Inputs& in) {
  const int64_t d = a.cols;
  const std::vector<double> xd = in.x.to_double(), wd = in.w.to_double();
  const size_t n = static_cast<size_t>(a.rows * d);
  ForwardExpected e{a.dtype, d, a.round_xhat, std::vector<double>(n), std::vector<double>(n),
                    std::vector<double>(static_cast<size_t>(d))};
  std::vector<double> rr(static_cast<size_t>(a.rows));
  reference::forward(a.rows, d, xd.data(), a.weight ? wd.data() : nullptr, ref_options(a), e.y.data(), rr.data(),
                     e.xh.data());
  for (int64_t k = 0; k < d; ++k) e.wprime[k] = a.weight ? wd[k] + (a.weight_offset ? 1.0 : 0.0) : 1.0;
  if (a.round_xhat)
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t k = 0; k < d; ++k)
        e.y[r * d + k] = round_to(a.dtype, round_to(a.dtype, e.xh[r * d + k]) * e.wprime[k]);
  return e;
}

// x, y and w each at their own offset and row stride: the element-I/O
// forward holds x of y's aligned blocks only where a row's x and y start at
// the same offset in their 16-byte blocks, and loads windows otherwise. Every
// pairing of offsets (0..7 elements past a 16-byte boundary; strides that keep
// one offset for every row or move it row by row, so that rows of one warp
// differ at small D), with and without a weight, with the Gemma offset and the
// rounded x_hat, gives y within the float64 reference's tolerance and bit for
// bit the y and rstd of the aligned call.
TEST_F(Cuda, ForwardOperandsAtDifferentOffsets) {
  std::mt19937_64 rng(61);
  struct Layouts {
    int64_t x_off, y_off, w_off, x_pad, y_pad;
  };
  const Layouts kLayouts[] = {{1, 0, 0, 0, 0}, {0, 1, 0, 0, 0}, {1, 1, 0, 0, 0}, {1, 3, 2, 0, 0}, {2, 1, 1, 8, 0},
                              {3, 3, 3, 1, 1}, {1, 1, 1, 1, 9}, {0, 0, 1, 3, 3}, {2, 2, 0, 0, 0}, {3, 3, 0, 1, 1},
                              {4, 4, 0, 0, 8}, {5, 5, 0, 0, 0}, {6, 6, 0, 5, 5}, {7, 7, 0, 3, 3}, {0, 0, 0, 1, 1},
                              {1, 1, 0, 2, 2}};
  struct Options {
    bool weight, weight_offset, round_xhat;
  };
  const Options kOptions[] = {{true, false, false}, {false, false, false}, {true, true, true}};
  for (int64_t d : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{17}, int64_t{33}, int64_t{1000},
                    int64_t{2048}, int64_t{4095}, int64_t{4096}, int64_t{16383}, int64_t{40000}}) {
    for (int32_t dt : kDtypes) {
      for (const Options& o : kOptions) {
        Case a;
        a.dtype = dt;
        a.cols = d;
        a.rows = d > 10000 ? 5 : 37;
        a.with_rstd = true;
        a.hetero = true;
        a.weight = o.weight;
        a.weight_offset = o.weight_offset;
        a.round_xhat = o.round_xhat;
        const Inputs in_a = make_inputs(a, rng);
        HostMatrix y_a;
        std::vector<float> r_a;
        gpu_forward(a, in_a, &y_a, &r_a);
        ASSERT_FALSE(HasFatalFailure());
        const ForwardExpected want = forward_expected(a, in_a);
        auto tol = [&](int64_t r, int64_t k) { return want.tol(r, k); };
        for (const Layouts& l : kLayouts) {
          SCOPED_TRACE(describe(a) + ": x +" + std::to_string(l.x_off) + " stride +" + std::to_string(l.x_pad) +
                       ", y +" + std::to_string(l.y_off) + " stride +" + std::to_string(l.y_pad) + ", w +" +
                       std::to_string(l.w_off));
          HostMatrix x(dt, a.rows, d, d + l.x_pad, l.x_off), w(dt, 1, d, d, l.w_off);
          for (int64_t r = 0; r < a.rows; ++r)
            for (int64_t k = 0; k < d; ++k) x.set(r, k, in_a.x.get(r, k));
          for (int64_t k = 0; k < d; ++k) w.set(0, k, in_a.w.get(0, k));
          HostMatrix y(dt, a.rows, d, d + l.y_pad, l.y_off);  // NaN-poisoned
          Arena::get().reset();
          const Dev dx = upload(x), dw = upload(w), dy = upload(y);
          float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(a.rows) * 4 + 4));
          ASSERT_EQ(cudaSuccess, cudaMemset(drstd, 0xFF, static_cast<size_t>(a.rows) * 4));
          poison_shared_memory();
          const rmsnorm_problem_t p = problem_of(a);
          const rmsnorm_backend_t b = cuda_backend();
          ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, dx.data(), x.stride, a.weight ? dw.data() : nullptr,
                                                            dy.data(), y.stride, drstd, &b))
              << rmsnorm_last_error();
          CUDA_OK(cudaDeviceSynchronize());
          download(dy, y);
          std::vector<float> r_o(static_cast<size_t>(a.rows));
          CUDA_OK(cudaMemcpy(r_o.data(), drstd, static_cast<size_t>(a.rows) * 4, cudaMemcpyDeviceToHost));
          EXPECT_TRUE(check_matrix("y", y, want.y, tol));
          ASSERT_EQ(0, std::memcmp(r_a.data(), r_o.data(), r_a.size() * sizeof(float))) << "rstd differs";
          for (int64_t r = 0; r < a.rows; ++r)
            for (int64_t k = 0; k < d; ++k)
              ASSERT_EQ(y_a.get(r, k), y.get(r, k)) << "y differs from the aligned call's, row " << r << " col " << k;
        }
      }
    }
  }
}

// The paired forward (plan::Io::kPaired: x and y at one offset `off` elements
// past a 16-byte boundary in every row, the weight aligned or none): y within
// the float64 reference's tolerance and bit for bit the y and rstd of the same
// values in contiguous rows, and in place (y == x) the same y. Checks that the
// call is planned as kForwardRowsPaired where the row is in the rows band.
void check_paired_forward(int32_t dt, int64_t d, int64_t rows, int64_t off, const Case& opts, std::mt19937_64& rng) {
  Case a = opts;
  a.dtype = dt;
  a.cols = d;
  a.rows = rows;
  a.with_rstd = true;
  a.hetero = true;
  SCOPED_TRACE(describe(a) + ": x and y +" + std::to_string(off));
  const Inputs in_a = make_inputs(a, rng);
  HostMatrix y_a;
  std::vector<float> r_a;
  gpu_forward(a, in_a, &y_a, &r_a);
  if (::testing::Test::HasFatalFailure()) return;
  const ForwardExpected want = forward_expected(a, in_a);
  auto tol = [&](int64_t r, int64_t k) { return want.tol(r, k); };
  const int esize = dt == RMSNORM_DTYPE_F32 ? 4 : 2;
  const int64_t vec = 16 / esize;
  // A row stride of whole 16-byte blocks (one more block at some D): every row at the same offset.
  const int64_t stride = (d + vec - 1) / vec * vec + (d % 3 == 0 ? vec : 0);
  HostMatrix x(dt, rows, d, stride, off), w(dt, 1, d, d, 0), y(dt, rows, d, stride, off);  // y NaN-poisoned
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < d; ++k) x.set(r, k, in_a.x.get(r, k));
  for (int64_t k = 0; k < d; ++k) w.set(0, k, in_a.w.get(0, k));
  Arena::get().reset();
  const Dev dx = upload(x), dw = upload(w), dy = upload(y);
  const void* wp = a.weight ? dw.data() : nullptr;
  const plan::Io io = plan::forward_io({dx.data(), x.stride}, {dy.data(), y.stride}, wp, esize);
  ASSERT_EQ(io, plan::Io::kPaired);
  const plan::Launch l = plan::forward_launch(rows, d, esize, io, current_plan_device());
  if (l.row.band == plan::Band::kRows) {
    ASSERT_EQ(l.kernel, plan::Kernel::kForwardRowsPaired);
  }
  float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(rows) * 4 + 4));
  ASSERT_EQ(cudaSuccess, cudaMemset(drstd, 0xFF, static_cast<size_t>(rows) * 4));
  poison_shared_memory();
  const rmsnorm_problem_t p = problem_of(a);
  const rmsnorm_backend_t b = cuda_backend();
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
            rmsnorm_forward(&p, dx.data(), x.stride, wp, dy.data(), y.stride, drstd, &b))
      << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  download(dy, y);
  std::vector<float> r_o(static_cast<size_t>(rows));
  CUDA_OK(cudaMemcpy(r_o.data(), drstd, static_cast<size_t>(rows) * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(check_matrix("y", y, want.y, tol));
  ASSERT_EQ(0, std::memcmp(r_a.data(), r_o.data(), r_a.size() * sizeof(float))) << "rstd differs";
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < d; ++k)
      ASSERT_EQ(y_a.get(r, k), y.get(r, k)) << "y differs from the contiguous call's, row " << r << " col " << k;
  // In place (y == x): the same bits.
  const Dev dxy = upload(x);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, dxy.data(), x.stride, wp, dxy.data(), x.stride, nullptr, &b))
      << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  HostMatrix yin = x;
  download(dxy, yin);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < d; ++k)
      ASSERT_EQ(y.get(r, k), yin.get(r, k)) << "y in place differs, row " << r << " col " << k;
}

// Every D of the rows band's small and middle sizes, and the band's top, at
// every offset in turn (D picks it), with a weight, without one, and with
// the Gemma offset and the rounded x_hat: the paired kernel's head (the
// columns before the first boundary), blocks and tail (a row shorter than
// its head included) at each offset.
TEST_F(Cuda, PairedForwardEveryD) {
  std::mt19937_64 rng(67);
  std::vector<int64_t> ds;
  for (int64_t d = 1; d <= 2100; ++d) ds.push_back(d);
  for (int64_t d : {4095, 4096, 4097, 7168, 8191, 8192, 8200, 12288, 16383, 16384, 16385}) ds.push_back(d);
  for (int64_t d : ds)
    for (int32_t dt : kDtypes) {
      const int64_t vec = dt == RMSNORM_DTYPE_F32 ? 4 : 8;
      Case opts;
      opts.weight = d % 5 != 0;
      opts.weight_offset = d % 7 == 0;
      opts.round_xhat = d % 7 == 0;
      check_paired_forward(dt, d, d > 8192 ? 5 : 1 + d % 11, 1 + d % (vec - 1), opts, rng);
      if (HasFailure()) return;
    }
}

// The backward with x, gy and gx (and g_h) at offset `off` elements in every row and the weight aligned
// (plan::Io::kPaired: the shifted kernel takes the offset as a constant where plan::backward_paired_rows):
// gx and gw bitwise those of the same call on aligned contiguous copies, which is checked against the float64
// reference (with g_h: against the plain backward's gx plus g_h, check_add_backward's rule); in place
// (gx == gy, or gx == g_h) the same bits again.
void check_paired_backward(int32_t dt, int64_t d, int64_t rows, int64_t off, const Case& opts, bool add,
                           std::mt19937_64& rng) {
  Case a = opts;
  a.dtype = dt;
  a.cols = d;
  a.rows = rows;
  a.hetero = true;
  SCOPED_TRACE(describe(a) + ": x, gy, gx" + (add ? ", g_h" : "") + " +" + std::to_string(off));
  const Inputs in = make_inputs(a, rng);
  std::vector<double> rr(static_cast<size_t>(rows)), yr(static_cast<size_t>(rows * d));
  reference::forward(rows, d, in.x.to_double().data(), a.weight ? in.w.to_double().data() : nullptr, ref_options(a),
                     yr.data(), rr.data(), nullptr);
  std::vector<float> rstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) rstd[r] = static_cast<float>(rr[r]);
  HostMatrix gh(dt, rows, d);
  fill_random(gh, rng, [&](int64_t r) { return 0.25 * row_scale(a, r); });
  BackwardOut want;
  gpu_backward(a, in, rstd, &want, rng, add ? &gh : nullptr);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  if (add) {
    BackwardOut plain;
    gpu_backward(a, in, rstd, &plain, rng);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    expect_backward_matches_reference(a, in, plain);
    HostMatrix sum(dt, rows, d);  // gx = T(T(gx of the norm) + g_h)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < d; ++k) {
        sum.set(r, k, static_cast<float>(plain.gx.get(r, k)) + static_cast<float>(gh.get(r, k)));
        ASSERT_EQ(want.gx.get(r, k), sum.get(r, k)) << "aligned gx with g_h, row " << r << " col " << k;
      }
  } else {
    expect_backward_matches_reference(a, in, want);
  }
  ASSERT_FALSE(::testing::Test::HasFailure());
  const int esize = dt == RMSNORM_DTYPE_F32 ? 4 : 2;
  const int64_t vec = 16 / esize;
  const int64_t stride = (d + vec - 1) / vec * vec + (d % 3 == 0 ? vec : 0);  // whole 16-byte blocks
  HostMatrix x(dt, rows, d, stride, off), gy(dt, rows, d, stride, off), ghm(dt, rows, d, stride, off),
      gx(dt, rows, d, stride, off), w(dt, 1, d, d, 0);  // gx NaN-poisoned
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < d; ++k) {
      x.set(r, k, in.x.get(r, k));
      gy.set(r, k, in.gy.get(r, k));
      ghm.set(r, k, gh.get(r, k));
    }
  for (int64_t k = 0; k < d; ++k) w.set(0, k, in.w.get(0, k));
  const bool f32 = gw_in_f32(a);
  const int32_t mode = a.weight ? a.gw_mode : RMSNORM_GW_NONE;
  const rmsnorm_problem_t p = problem_of(a);
  const rmsnorm_backend_t b = cuda_backend();
  size_t ws_bytes = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, mode, &b, &ws_bytes)) << rmsnorm_last_error();
  // in_place 0: gx on its own; 1: gx over gy (plain) or over g_h (add).
  for (int in_place = 0; in_place < 2; ++in_place) {
    SCOPED_TRACE(in_place ? (add ? "gx == g_h" : "gx == gy") : "gx on its own");
    Arena::get().reset();
    const Dev dx = upload(x), dgy = upload(gy), dgh = upload(ghm), dw = upload(w), dgx0 = upload(gx);
    const Dev& dgx = in_place ? (add ? dgh : dgy) : dgx0;
    HostMatrix gwm(f32 ? RMSNORM_DTYPE_F32 : dt, 1, d);
    const Dev dgw = upload(gwm);
    void* ws = ws_bytes > 0 ? Arena::get().alloc(ws_bytes) : nullptr;
    if (ws != nullptr) CUDA_OK(cudaMemset(ws, 0xFF, ws_bytes));
    float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(rows) * 4 + 4));
    CUDA_OK(cudaMemcpy(drstd, rstd.data(), static_cast<size_t>(rows) * 4, cudaMemcpyHostToDevice));
    const float* rp = a.with_rstd ? drstd : nullptr;
    const void* wp = a.weight ? dw.data() : nullptr;
    const plan::Io io = plan::backward_io(
        {{dx.data(), stride}, {dgy.data(), stride}, {dgx.data(), stride}, {add ? dgh.data() : nullptr, stride}}, wp,
        esize);
    ASSERT_EQ(io, plan::Io::kPaired);
    poison_shared_memory();
    const rmsnorm_status_t st =
        add ? rmsnorm_add_backward(&p, dx.data(), stride, wp, dgy.data(), stride, rp, dgh.data(), stride, dgx.data(),
                                   stride, mode == RMSNORM_GW_NONE ? nullptr : dgw.data(), mode, ws, ws_bytes, &b)
            : rmsnorm_backward(&p, dx.data(), stride, wp, dgy.data(), stride, rp, dgx.data(), stride,
                               mode == RMSNORM_GW_NONE ? nullptr : dgw.data(), mode, ws, ws_bytes, &b);
    ASSERT_EQ(st, RMSNORM_STATUS_SUCCESS) << rmsnorm_last_error();
    CUDA_OK(cudaDeviceSynchronize());
    HostMatrix got = gx;
    download(dgx, got);
    download(dgw, gwm);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < d; ++k) {
        const double g = got.get(r, k), e = want.gx.get(r, k);
        ASSERT_EQ(0, std::memcmp(&g, &e, sizeof(double)))
            << "gx differs from the aligned call's, row " << r << " col " << k << ": " << g << " vs " << e;
      }
    if (mode != RMSNORM_GW_NONE) ASSERT_EQ(gwm.to_double(), want.gw) << "gw differs from the aligned call's";
  }
}

// Every D up to 2100 and the rows band's larger sizes, at every offset in turn (D picks it), with and without
// a weight, the Gemma offset, rstd given or recomputed, gw in the dtype or fp32, and g_h on every third D.
TEST_F(Cuda, PairedBackwardEveryD) {
  std::mt19937_64 rng(73);
  std::vector<int64_t> ds;
  for (int64_t d = 4; d <= 2100; d += 4) ds.push_back(d);
  for (int64_t d : {4096, 7168, 8192, 12288, 16384}) ds.push_back(d);
  for (int64_t d : ds)
    for (int32_t dt : kDtypes) {
      const int64_t vec = dt == RMSNORM_DTYPE_F32 ? 4 : 8;
      if (d % vec != 0) continue;
      Case opts;
      opts.weight = d % 5 != 0;
      opts.weight_offset = d % 7 == 0;
      opts.with_rstd = d % 3 != 1;
      opts.gw_mode = d % 16 == 0 ? RMSNORM_GW_STORE_F32 : RMSNORM_GW_STORE;
      const int64_t rows = d > 8192 ? 5 : d % 64 == 0 ? 300 : 1 + d % 11;
      check_paired_backward(dt, d, rows, 1 + (d / vec) % (vec - 1), opts, d % 3 == 0, rng);
      if (HasFailure()) return;
    }
}

// In place: forward with y == x and backward with gx == gy give the same
// bits as out of place, in every band, with aligned rows and with every row
// one element off alignment (the element-I/O kernels, whose forward reloads
// x while it writes y).
TEST_F(Cuda, InPlace) {
  std::mt19937_64 rng(14);
  for (int64_t d : kBandDs) for (Layout layout : {Layout::kAligned, Layout::kOffset}) {
    Case c = band_case(d);
    c.layout = layout;
    c.with_rstd = false;
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c, rng);
    HostMatrix y;
    std::vector<float> rstd;
    gpu_forward(c, in, &y, &rstd);
    ASSERT_FALSE(HasFatalFailure());
    Arena::get().reset();
    const Dev dx = upload(in.x);
    const Dev dw = upload(in.w);
    const rmsnorm_problem_t p = problem_of(c);
    const rmsnorm_backend_t b = cuda_backend();
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, dx.data(), c.cols, dw.data(), dx.data(), c.cols, nullptr, &b))
        << rmsnorm_last_error();
    HostMatrix yin = in.x;
    download(dx, yin);
    ASSERT_EQ(0, std::memcmp(y.storage.data(), yin.storage.data(), y.storage.size())) << "forward in place differs";

    std::vector<float> none;
    BackwardOut out;
    c.gw_mode = RMSNORM_GW_NONE;
    gpu_backward(c, in, none, &out, rng);
    ASSERT_FALSE(HasFatalFailure());
    Arena::get().reset();
    const Dev ex = upload(in.x), ew = upload(in.w), egy = upload(in.gy);
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
              rmsnorm_backward(&p, ex.data(), c.cols, ew.data(), egy.data(), c.cols, nullptr, egy.data(), c.cols, nullptr,
                               RMSNORM_GW_NONE, nullptr, 0, &b))
        << rmsnorm_last_error();
    HostMatrix gxin = in.gy;
    download(egy, gxin);
    ASSERT_EQ(0, std::memcmp(out.gx.storage.data(), gxin.storage.data(), out.gx.storage.size()))
        << "backward in place differs";
  }
}

// Copies n bytes after a delay, having first let the next kernel in the
// stream be scheduled (sm_90): a programmatic dependent that touched its
// operands before waiting for this kernel would read the old contents.
__global__ void late_copy_kernel(const unsigned char* src, unsigned char* dst, size_t n, unsigned long long delay_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < delay_ns);
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
}

// Programmatic dependent launch (the default): x is written by a kernel that
// lets ours be scheduled at once and writes 200 us later; the forward then
// the backward (gy = the forward's y, rstd from the forward) run back to back
// with no synchronization. Bitwise equal to plain launches with a
// synchronization after each step, in every band.
TEST_F(Cuda, ProgrammaticLaunchWaitsForThePreviousKernel) {
  std::mt19937_64 rng(16);
  for (int64_t d : kBandDs) {
    Case c = band_case(d);
    c.gw_mode = RMSNORM_GW_STORE_F32;
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c, rng);
    struct Result {
      HostMatrix y, gx;
      std::vector<float> rstd, gw;
    };
    auto run = [&](bool chained, Result* r) {
      Arena::get().reset();
      r->y = HostMatrix(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));  // NaN-poisoned
      r->gx = r->y;
      const HostMatrix poisoned_x = r->y;
      const Dev src = upload(in.x), dx = upload(poisoned_x), dw = upload(in.w), dy = upload(r->y), dgx = upload(r->gx);
      float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4));
      float* dgw = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.cols) * 4));
      rmsnorm_problem_t p = problem_of(c);
      if (!chained) p.flags |= RMSNORM_FLAG_NO_PDL;
      const rmsnorm_backend_t b = cuda_backend();
      size_t ws_bytes = 0;
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, c.gw_mode, &b, &ws_bytes));
      void* ws = ws_bytes > 0 ? Arena::get().alloc(ws_bytes) : nullptr;
      CUDA_OK(cudaDeviceSynchronize());
      if (chained) {
        late_copy_kernel<<<8, 256>>>(static_cast<const unsigned char*>(src.base), static_cast<unsigned char*>(dx.base),
                                     src.bytes, 200000ull);
        CUDA_OK(cudaGetLastError());
      } else {
        CUDA_OK(cudaMemcpy(dx.base, src.base, src.bytes, cudaMemcpyDeviceToDevice));
      }
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                rmsnorm_forward(&p, dx.data(), stride_of(c), dw.data(), dy.data(), stride_of(c), drstd, &b))
          << rmsnorm_last_error();
      if (!chained) CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                rmsnorm_backward(&p, dx.data(), stride_of(c), dw.data(), dy.data(), stride_of(c), drstd, dgx.data(),
                                 stride_of(c), dgw, c.gw_mode, ws, ws_bytes, &b))
          << rmsnorm_last_error();
      CUDA_OK(cudaDeviceSynchronize());
      download(dy, r->y);
      download(dgx, r->gx);
      r->rstd.resize(static_cast<size_t>(c.rows));
      r->gw.resize(static_cast<size_t>(c.cols));
      CUDA_OK(cudaMemcpy(r->rstd.data(), drstd, r->rstd.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(r->gw.data(), dgw, r->gw.size() * 4, cudaMemcpyDeviceToHost));
    };
    Result plain, chained;
    run(false, &plain);
    ASSERT_FALSE(HasFatalFailure());
    run(true, &chained);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(0, std::memcmp(plain.y.storage.data(), chained.y.storage.data(), plain.y.storage.size())) << "y differs";
    ASSERT_EQ(0, std::memcmp(plain.rstd.data(), chained.rstd.data(), plain.rstd.size() * 4)) << "rstd differs";
    ASSERT_EQ(0, std::memcmp(plain.gx.storage.data(), chained.gx.storage.data(), plain.gx.storage.size()))
        << "gx differs";
    ASSERT_EQ(0, std::memcmp(plain.gw.data(), chained.gw.data(), plain.gw.size() * 4)) << "gw differs";
  }
}

// Forward then backward captured in a CUDA graph (global capture mode, as
// torch.cuda.graph uses) and replayed: bitwise the eager results, in every
// band and for 1 and many rows (gw written by the main kernel, or by the
// finalize kernel as a programmatic dependent), up to 16384 x 4096.
// Outputs are poisoned before each replay.
// Where two device copies of a matrix laid out like `layout` (its whole
// storage, offset and slack included) differ: the count of differing
// elements, the first one's row, column and both values (poison: the NaN
// fill), or the first differing byte outside the elements.
std::string bytes_diff(const HostMatrix& layout, const std::vector<unsigned char>& a,
                       const std::vector<unsigned char>& b) {
  if (a.size() != b.size() || a.size() != layout.storage.size()) return "sizes differ";
  HostMatrix ma = layout, mb = layout;
  ma.storage = a;
  mb.storage = b;
  int64_t count = 0, first_r = -1, first_c = -1;
  for (int64_t r = 0; r < layout.rows; ++r)
    for (int64_t k = 0; k < layout.cols; ++k) {
      const size_t at = static_cast<size_t>((layout.offset + r * layout.stride + k) * layout.esize());
      if (std::memcmp(&a[at], &b[at], static_cast<size_t>(layout.esize())) == 0) continue;
      if (count++ == 0) {
        first_r = r;
        first_c = k;
      }
    }
  std::ostringstream os;
  if (count == 0) {
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]) {
        os << "no element differs; byte " << i << " of the storage does (outside the rows)";
        break;
      }
    return os.str();
  }
  os << count << " elements differ, the first at row " << first_r << " col " << first_c << ": " << ma.get(first_r, first_c)
     << " vs " << mb.get(first_r, first_c);
  return os.str();
}

TEST_F(Cuda, GraphCaptureReplaysBitwise) {
  std::mt19937_64 rng(17);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int64_t d : {int64_t{128}, int64_t{4096}, int64_t{40000}, int64_t{300000}}) {
    // 4096: also 16384 rows (128 MiB of bf16 x).
    for (int64_t rows : {int64_t{1}, d > 10000 ? int64_t{40} : int64_t{3000}, d == 4096 ? int64_t{16384} : int64_t{0}}) {
      if (rows == 0) continue;
      Case c;
      c.cols = d;
      c.rows = rows;
      c.gw_mode = RMSNORM_GW_STORE_F32;
      SCOPED_TRACE(describe(c));
      const Inputs in = make_inputs(c, rng);
      Arena::get().reset();
      const Dev dx = upload(in.x), dw = upload(in.w), dgy = upload(in.gy);
      const HostMatrix poison(c.dtype, c.rows, c.cols, stride_of(c), offset_of(c));
      const Dev dy = upload(poison), dgx = upload(poison);
      float* drstd = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.rows) * 4));
      float* dgw = static_cast<float*>(Arena::get().alloc(static_cast<size_t>(c.cols) * 4));
      const rmsnorm_problem_t p = problem_of(c);
      const rmsnorm_backend_t b = rmsnorm_backend_cuda(-1, stream);
      size_t ws_bytes = 0;
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, c.gw_mode, &b, &ws_bytes));
      void* ws = ws_bytes > 0 ? Arena::get().alloc(ws_bytes) : nullptr;
      auto calls = [&]() {
        EXPECT_EQ(RMSNORM_STATUS_SUCCESS,
                  rmsnorm_forward(&p, dx.data(), stride_of(c), dw.data(), dy.data(), stride_of(c), drstd, &b))
            << rmsnorm_last_error();
        EXPECT_EQ(RMSNORM_STATUS_SUCCESS,
                  rmsnorm_backward(&p, dx.data(), stride_of(c), dw.data(), dgy.data(), stride_of(c), drstd, dgx.data(),
                                   stride_of(c), dgw, c.gw_mode, ws, ws_bytes, &b))
            << rmsnorm_last_error();
      };
      auto poison_outputs = [&]() {
        CUDA_OK(cudaMemsetAsync(dy.base, 0xFF, dy.bytes, stream));
        CUDA_OK(cudaMemsetAsync(dgx.base, 0xFF, dgx.bytes, stream));
        CUDA_OK(cudaMemsetAsync(drstd, 0xFF, static_cast<size_t>(c.rows) * 4, stream));
        CUDA_OK(cudaMemsetAsync(dgw, 0xFF, static_cast<size_t>(c.cols) * 4, stream));
        if (ws != nullptr) CUDA_OK(cudaMemsetAsync(ws, 0xFF, ws_bytes, stream));
      };
      struct Out {
        std::vector<unsigned char> y, gx;
        std::vector<float> rstd, gw;
      };
      auto fetch = [&](Out* o) {
        CUDA_OK(cudaStreamSynchronize(stream));
        o->y.resize(dy.bytes);
        o->gx.resize(dgx.bytes);
        o->rstd.resize(static_cast<size_t>(c.rows));
        o->gw.resize(static_cast<size_t>(c.cols));
        CUDA_OK(cudaMemcpy(o->y.data(), dy.base, dy.bytes, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(o->gx.data(), dgx.base, dgx.bytes, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(o->rstd.data(), drstd, o->rstd.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(o->gw.data(), dgw, o->gw.size() * 4, cudaMemcpyDeviceToHost));
      };
      Out eager;
      poison_outputs();
      calls();
      ASSERT_FALSE(HasFailure());
      fetch(&eager);
      ASSERT_FALSE(HasFatalFailure());
      // The eager run overwrote the poison (the other tests check its values).
      for (float v : eager.rstd) ASSERT_TRUE(std::isfinite(v)) << "eager rstd left poisoned";
      for (float v : eager.gw) ASSERT_TRUE(std::isfinite(v)) << "eager gw left poisoned";

      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      calls();
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      ASSERT_FALSE(HasFailure());
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int rep = 0; rep < 3; ++rep) {
        poison_outputs();
        CUDA_OK(cudaGraphLaunch(exec, stream));
        Out replay;
        fetch(&replay);
        ASSERT_FALSE(HasFatalFailure());
        EXPECT_TRUE(replay.y == eager.y) << "y differs, replay " << rep << ": " << bytes_diff(poison, eager.y, replay.y);
        EXPECT_TRUE(replay.gx == eager.gx) << "gx differs, replay " << rep << ": "
                                           << bytes_diff(poison, eager.gx, replay.gx);
        EXPECT_EQ(0, std::memcmp(replay.rstd.data(), eager.rstd.data(), eager.rstd.size() * 4)) << "rstd, replay " << rep;
        EXPECT_EQ(0, std::memcmp(replay.gw.data(), eager.gw.data(), eager.gw.size() * 4)) << "gw, replay " << rep;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      if (HasFailure()) break;
    }
  }
  cudaStreamDestroy(stream);
}

// ---- a context with fewer SMs than the device ----------------------------------------------------

// Driver entry points, resolved through the runtime: the test binary does
// not link libcuda, so that it loads (and skips) where no driver is installed.
template <typename Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, CUDA_VERSION, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(fn);
}

// A green context of 16 SMs, while the device attribute (and so the plan)
// still says 132: the persistent grids are sized for more CTAs, and the
// cluster band for more co-scheduled clusters, than the context runs at once.
// Nothing may rely on them being co-resident. In every band the backward
// (rstd recomputed) must give bitwise the primary context's gx and gw, leave
// no error behind, and match the float64 reference.
TEST_F(Cuda, BackwardOnAContextWithFewerSms) {
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using GetResource = CUresult (*)(CUdevice, CUdevResource*, CUdevResourceType);
  using Split = CUresult (*)(CUdevResource*, unsigned*, const CUdevResource*, CUdevResource*, unsigned, unsigned);
  using GenerateDesc = CUresult (*)(CUdevResourceDesc*, CUdevResource*, unsigned);
  using GreenCreate = CUresult (*)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned);
  using GreenToCtx = CUresult (*)(CUcontext*, CUgreenCtx);
  using GreenDestroy = CUresult (*)(CUgreenCtx);
  using CtxGet = CUresult (*)(CUcontext*);
  using CtxSet = CUresult (*)(CUcontext);
  const auto device_get = driver_entry<DeviceGet>("cuDeviceGet");
  const auto get_resource = driver_entry<GetResource>("cuDeviceGetDevResource");
  const auto split = driver_entry<Split>("cuDevSmResourceSplitByCount");
  const auto generate_desc = driver_entry<GenerateDesc>("cuDevResourceGenerateDesc");
  const auto green_create = driver_entry<GreenCreate>("cuGreenCtxCreate");
  const auto green_to_ctx = driver_entry<GreenToCtx>("cuCtxFromGreenCtx");
  const auto green_destroy = driver_entry<GreenDestroy>("cuGreenCtxDestroy");
  const auto ctx_get = driver_entry<CtxGet>("cuCtxGetCurrent");
  const auto ctx_set = driver_entry<CtxSet>("cuCtxSetCurrent");
  if (!device_get || !get_resource || !split || !generate_desc || !green_create || !green_to_ctx || !green_destroy ||
      !ctx_get || !ctx_set)
    GTEST_SKIP() << "the driver has no green contexts";

  int ordinal = 0;
  CUDA_OK(cudaGetDevice(&ordinal));
  int device_sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, ordinal));
  CUdevice dev = 0;
  ASSERT_EQ(CUDA_SUCCESS, device_get(&dev, ordinal));
  CUdevResource all = {}, part = {}, rest = {};
  ASSERT_EQ(CUDA_SUCCESS, get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  unsigned groups = 1;
  ASSERT_EQ(CUDA_SUCCESS, split(&part, &groups, &all, &rest, 0, 16));
  ASSERT_EQ(1u, groups);
  ASSERT_LT(static_cast<int>(part.sm.smCount) * 2, device_sms) << "too few SMs on this device for the test";
  CUdevResourceDesc desc = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, generate_desc(&desc, &part, 1));
  CUgreenCtx green = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, green_create(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext green_ctx = nullptr, primary = nullptr;
  ASSERT_EQ(CUDA_SUCCESS, green_to_ctx(&green_ctx, green));
  ASSERT_EQ(CUDA_SUCCESS, ctx_get(&primary));

  std::mt19937_64 rng(23);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{3000, 4096}, {64, 65536}, {6, 300000}}) {
    Case c;
    c.dtype = RMSNORM_DTYPE_BF16;
    c.rows = rows;
    c.cols = cols;
    c.with_rstd = false;
    c.gw_mode = RMSNORM_GW_STORE_F32;
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c, rng);

    // In the green context, with its own allocations.
    BackwardOut green_out;
    green_out.gx = HostMatrix(c.dtype, c.rows, c.cols);
    green_out.gw.assign(static_cast<size_t>(c.cols), NAN);
    cudaError_t left = cudaSuccess;
    [&] {
      ASSERT_EQ(CUDA_SUCCESS, ctx_set(green_ctx));
      const size_t bytes = in.x.storage.size();
      void *dx = nullptr, *dw = nullptr, *dgy = nullptr, *dgx = nullptr, *dgw = nullptr, *ws = nullptr;
      const rmsnorm_problem_t p = problem_of(c);
      const rmsnorm_backend_t b = cuda_backend();
      size_t ws_bytes = 0;
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, c.gw_mode, &b, &ws_bytes));
      CUDA_OK(cudaMalloc(&dx, bytes));
      CUDA_OK(cudaMalloc(&dgy, bytes));
      CUDA_OK(cudaMalloc(&dgx, bytes));
      CUDA_OK(cudaMalloc(&dw, in.w.storage.size()));
      CUDA_OK(cudaMalloc(&dgw, static_cast<size_t>(c.cols) * 4));
      CUDA_OK(cudaMalloc(&ws, ws_bytes + 16));
      CUDA_OK(cudaMemcpy(dx, in.x.storage.data(), bytes, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(dgy, in.gy.storage.data(), bytes, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(dw, in.w.storage.data(), in.w.storage.size(), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(dgx, 0xFF, bytes));
      CUDA_OK(cudaMemset(dgw, 0xFF, static_cast<size_t>(c.cols) * 4));
      CUDA_OK(cudaMemset(ws, 0xFF, ws_bytes + 16));
      EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward(&p, dx, c.cols, dw, dgy, c.cols, nullptr, dgx, c.cols, dgw,
                                                         c.gw_mode, ws, ws_bytes, &b))
          << rmsnorm_last_error();
      CUDA_OK(cudaDeviceSynchronize());
      left = cudaGetLastError();
      std::vector<float> gw(static_cast<size_t>(c.cols));
      CUDA_OK(cudaMemcpy(green_out.gx.storage.data(), dgx, bytes, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(gw.data(), dgw, gw.size() * 4, cudaMemcpyDeviceToHost));
      for (size_t k = 0; k < gw.size(); ++k) green_out.gw[k] = gw[k];
      for (void* ptr : {dx, dw, dgy, dgx, dgw, ws}) cudaFree(ptr);
    }();
    ASSERT_EQ(CUDA_SUCCESS, ctx_set(primary));
    if (HasFailure()) break;
    EXPECT_EQ(cudaSuccess, left) << "an error was left behind: " << cudaGetErrorName(left);

    BackwardOut primary_out;
    gpu_backward(c, in, {}, &primary_out, rng);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(0, std::memcmp(primary_out.gx.storage.data(), green_out.gx.storage.data(), green_out.gx.storage.size()))
        << "gx differs between the primary and the green context";
    EXPECT_EQ(primary_out.gw, green_out.gw) << "gw differs between the primary and the green context";
    expect_backward_matches_reference(c, in, green_out);
  }
  green_destroy(green);
}

// The library makes backend.device current for a call and gives the thread
// back its own: a thread that never used CUDA (it reports device 0) must not
// be left with a context created on device 0 (every process of a job that
// calls the library for its own GPU would hold one there), and a thread with
// device 0's context current gets that device and context back. Two GPUs.
using DeviceGetFn = CUresult (*)(CUdevice*, int);
using PrimaryStateFn = CUresult (*)(CUdevice, unsigned*, int*);
using CtxGetFn = CUresult (*)(CUcontext*);

// 1 where `ordinal`'s primary context exists, 0 where not, -1 if unknown.
int primary_active(int ordinal) {
  const auto device_get = driver_entry<DeviceGetFn>("cuDeviceGet");
  const auto primary_state = driver_entry<PrimaryStateFn>("cuDevicePrimaryCtxGetState");
  CUdevice dev = 0;
  unsigned flags = 0;
  int on = -1;
  if (device_get == nullptr || primary_state == nullptr || device_get(&dev, ordinal) != CUDA_SUCCESS ||
      primary_state(dev, &flags, &on) != CUDA_SUCCESS)
    return -1;
  return on;
}

// Device 1's x (kRows x kD fp32 ones) and y, allocated from a thread of their
// own so that the calling thread does not make device 1 current.
constexpr int64_t kOtherRows = 4, kOtherD = 256;
constexpr size_t kOtherBytes = size_t{kOtherRows} * kOtherD * 4;
cudaError_t other_device_buffers(void** x, void** y) {
  cudaError_t setup = cudaSuccess;
  std::thread([&] {
    const std::vector<float> ones(static_cast<size_t>(kOtherRows * kOtherD), 1.0f);
    for (cudaError_t e : {cudaSetDevice(1), cudaMalloc(x, kOtherBytes), cudaMalloc(y, kOtherBytes),
                          cudaMemcpy(*x, ones.data(), kOtherBytes, cudaMemcpyHostToDevice)})
      if (setup == cudaSuccess) setup = e;
  }).join();
  return setup;
}

rmsnorm_status_t forward_on_device_1(const void* x, void* y) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = kOtherRows;
  p.cols = kOtherD;
  const rmsnorm_backend_t b = rmsnorm_backend_cuda(1, nullptr);
  return rmsnorm_forward(&p, x, kOtherD, nullptr, y, kOtherD, nullptr, &b);
}

// The first half in a process of its own (gtest re-runs the binary for this
// test alone): device 0 has no context there before the call, whatever the
// other tests of a whole-binary run did. Exit codes name what went wrong.
[[noreturn]] void call_from_a_thread_without_context() {
  void *x = nullptr, *y = nullptr;
  if (other_device_buffers(&x, &y) != cudaSuccess) std::_Exit(2);
  if (primary_active(0) != 0) std::_Exit(3);  // device 0 had a context before the call
  rmsnorm_status_t st = RMSNORM_STATUS_INTERNAL_ERROR;
  int after = -1;
  std::thread([&] {
    st = forward_on_device_1(x, y);
    cudaGetDevice(&after);
  }).join();
  if (st != RMSNORM_STATUS_SUCCESS) std::_Exit(4);
  if (primary_active(0) != 0) std::_Exit(5);  // the call left a context on device 0
  if (after != 1) std::_Exit(6);              // such a thread keeps the call's device current
  std::vector<float> out(static_cast<size_t>(kOtherRows * kOtherD), -1.0f);
  cudaError_t copy = cudaSuccess;
  std::thread([&] {
    copy = cudaSetDevice(1);
    if (copy == cudaSuccess) copy = cudaMemcpy(out.data(), y, kOtherBytes, cudaMemcpyDeviceToHost);
  }).join();
  if (copy != cudaSuccess) std::_Exit(7);
  for (float v : out)
    if (std::fabs(v - 1.0 / std::sqrt(1.0 + 1e-5)) > 1e-6) std::_Exit(8);  // x = 1, no weight
  std::_Exit(0);
}

TEST_F(Cuda, AnotherDeviceLeavesTheCallersContext) {
  int n = 0;
  CUDA_OK(cudaGetDeviceCount(&n));
  if (n < 2) GTEST_SKIP() << "needs two GPUs (" << n << " present)";
  const auto ctx_get = driver_entry<CtxGetFn>("cuCtxGetCurrent");
  ASSERT_NE(ctx_get, nullptr);
  ASSERT_NE(primary_active(0), -1);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(call_from_a_thread_without_context(), ::testing::ExitedWithCode(0), "")
      << "2 setup, 3 device 0 had a context before, 4 the call failed, 5 the call left a context on device 0, "
         "6 the thread is not on device 1, 7 the copy failed, 8 wrong y";

  // A thread with device 0's context current gets device 0 and that context back.
  void *x = nullptr, *y = nullptr;
  ASSERT_EQ(cudaSuccess, other_device_buffers(&x, &y));
  CUcontext before = nullptr, restored = nullptr;
  rmsnorm_status_t st = RMSNORM_STATUS_INTERNAL_ERROR;
  int after = -1;
  std::thread([&] {
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess || ctx_get(&before) != CUDA_SUCCESS) return;
    st = forward_on_device_1(x, y);
    cudaGetDevice(&after);
    ctx_get(&restored);
  }).join();
  ASSERT_NE(nullptr, before);
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS, st);
  EXPECT_EQ(0, after);
  EXPECT_EQ(before, restored);
  std::thread([&] {
    cudaSetDevice(1);
    cudaDeviceSynchronize();
    cudaFree(x);
    cudaFree(y);
  }).join();
}

// Host memory handed to the CUDA backend and device memory handed to the CPU
// backend are refused, nothing written.
// rows == 0 on the GPU. Forward and backward write nothing but gw: the store
// modes write the empty sum, zeros; the accumulate modes leave gw bit for bit
// (its NaN poison would change under + 0). Every band's D.
TEST_F(Cuda, ZeroRowsWriteNothing) {
  for (int64_t d : kBandDs) {
    for (int32_t dt : {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_BF16}) {
      SCOPED_TRACE(testing::Message() << "D " << d << " dtype " << dt);
      Arena::get().reset();
      rmsnorm_problem_t p = rmsnorm_problem_default();
      p.rows = 0;
      p.cols = d;
      p.dtype = dt;
      const rmsnorm_backend_t b = cuda_backend();
      // One row of poisoned storage behind every row operand: what a bad
      // launch would write first.
      const HostMatrix row(dt, 1, d), wf32(RMSNORM_DTYPE_F32, 1, d);
      const Dev x = upload(row), w = upload(row), y = upload(row), gy = upload(row), gx = upload(row);
      const Dev rstd = upload(wf32);
      auto unchanged = [&](const Dev& dv, const HostMatrix& m) {
        HostMatrix back = m;
        download(dv, back);
        return back.storage == m.storage;
      };
      ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, x.data(), d, w.data(), y.data(), d,
                                                        static_cast<float*>(rstd.data()), &b))
          << rmsnorm_last_error();
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_TRUE(unchanged(y, row)) << "forward wrote y";
      EXPECT_TRUE(unchanged(rstd, wf32)) << "forward wrote rstd";
      for (int32_t mode : {RMSNORM_GW_NONE, RMSNORM_GW_STORE, RMSNORM_GW_STORE_F32, RMSNORM_GW_ACCUMULATE,
                           RMSNORM_GW_ACCUMULATE_F32}) {
        SCOPED_TRACE(testing::Message() << "gw mode " << mode);
        const bool f32 = mode == RMSNORM_GW_STORE_F32 || mode == RMSNORM_GW_ACCUMULATE_F32;
        const HostMatrix gw_host(f32 ? RMSNORM_DTYPE_F32 : dt, 1, d);
        const Dev gw = upload(gw_host);
        size_t ws_bytes = 0;
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, mode, &b, &ws_bytes));
        void* ws = ws_bytes > 0 ? Arena::get().alloc(ws_bytes) : nullptr;
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS,
                  rmsnorm_backward(&p, x.data(), d, w.data(), gy.data(), d, nullptr, gx.data(), d,
                                   mode == RMSNORM_GW_NONE ? nullptr : gw.data(), mode, ws, ws_bytes, &b))
            << rmsnorm_last_error();
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_TRUE(unchanged(gx, row)) << "backward wrote gx";
        HostMatrix gw_back = gw_host;
        download(gw, gw_back);
        bool zero = true;
        for (int64_t k = 0; k < d; ++k) zero = zero && gw_back.get(0, k) == 0.0;
        const bool store = mode == RMSNORM_GW_STORE || mode == RMSNORM_GW_STORE_F32;
        if (store)
          EXPECT_TRUE(zero) << "gw (store modes) must be zeros";
        else
          EXPECT_TRUE(gw_back.storage == gw_host.storage) << "gw changed (none / accumulate modes)";
      }
    }
  }
}

TEST_F(Cuda, WrongMemorySpace) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = 2;
  p.cols = 8;
  std::vector<float> hx(16, 1.0f), hy(16, 7.0f);
  float* dx = nullptr;
  CUDA_OK(cudaMalloc(&dx, 64));
  const rmsnorm_backend_t gpu = cuda_backend(), cpu = rmsnorm_backend_cpu(1);
  EXPECT_EQ(RMSNORM_STATUS_WRONG_MEMORY_SPACE, rmsnorm_forward(&p, hx.data(), 8, nullptr, dx, 8, nullptr, &gpu));
  EXPECT_NE(std::string(rmsnorm_last_error()).find("x"), std::string::npos);
  EXPECT_EQ(RMSNORM_STATUS_WRONG_MEMORY_SPACE, rmsnorm_forward(&p, dx, 8, nullptr, hy.data(), 8, nullptr, &cpu));
  for (float v : hy) EXPECT_EQ(v, 7.0f);
  // RMSNORM_FLAG_TRUSTED_MEMORY skips the check; with operands in the right
  // place the result is the same.
  float* dy = nullptr;
  CUDA_OK(cudaMalloc(&dy, 128));
  CUDA_OK(cudaMemcpy(dx, hx.data(), 64, cudaMemcpyHostToDevice));
  std::vector<float> y_plain(16, 0.0f), y_trusted(16, 1.0f);
  p.rows = 2;
  p.cols = 8;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, dx, 8, nullptr, dy, 8, nullptr, &gpu)) << rmsnorm_last_error();
  CUDA_OK(cudaMemcpy(y_plain.data(), dy, 64, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemset(dy, 0xff, 64));
  p.flags = RMSNORM_FLAG_TRUSTED_MEMORY;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_forward(&p, dx, 8, nullptr, dy, 8, nullptr, &gpu)) << rmsnorm_last_error();
  CUDA_OK(cudaMemcpy(y_trusted.data(), dy, 64, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(y_plain.data(), y_trusted.data(), 64));
  for (float v : y_plain) EXPECT_NEAR(v, 1.0 / std::sqrt(1.0 + 1e-5), 1e-6);  // x = 1, no weight
  cudaFree(dy);
  cudaFree(dx);
}

// ---- under compute-sanitizer: every band, small -------------------------------------------------

// Plans for a GPU whose shared memory holds one cp.async stage of a case's
// kernels but not two: 100 KiB per SM and 99 KiB per CTA (the sm_86 / sm_89
// class) for rows of 4 chunks per thread (64 KiB backward stages), 60 / 59 KiB
// for the rows of 2 (32 KiB stages). So every pipeline
// has a single stage: the kernels' `stages < 2` branches, which the H200's own
// plans never take. The kernels are the real ones; only the plan's
// shared-memory budget is cut.
struct OneStagePlans {
  OneStagePlans(size_t per_sm, size_t per_block) { cuda::testing::limit_shared_memory(per_sm, per_block); }
  ~OneStagePlans() { cuda::testing::limit_shared_memory(0, 0); }
  OneStagePlans(const OneStagePlans&) = delete;
  OneStagePlans& operator=(const OneStagePlans&) = delete;
};

using ShapeCase = std::tuple<int64_t, int32_t, int64_t, Layout>;  // D, dtype, rows, layout

// Forward, then backward with an fp32 gw, of one shape.
void check_shape_case(const ShapeCase& sc, std::mt19937_64& rng) {
  const auto& [d, dt, rows, layout] = sc;
  Case c;
  c.dtype = dt;
  c.cols = d;
  c.rows = rows;
  c.layout = layout;
  check_forward(c, rng);
  c.gw_mode = RMSNORM_GW_STORE_F32;
  check_backward(c, rng);
}

// Forward and backward of each case under OneStagePlans, after checking that
// the plan of its band has one stage there.
void check_one_stage_cases(std::initializer_list<ShapeCase> cases, std::mt19937_64& rng) {
  for (const ShapeCase& sc : cases) {
    const auto& [d, dt, rows, layout] = sc;
    const int esize = dt == RMSNORM_DTYPE_F32 ? 4 : 2;
    plan::Device pd = current_plan_device();
    const bool few = plan::row_plan(d, esize, plan::Direction::kBackward, pd).chunks_per_thread ==
                     plan::kFewChunksPerThread;
    pd.smem_per_sm = (few ? 60 : 100) * size_t{1024};
    pd.max_smem_optin = pd.smem_per_sm - 1024;
    const OneStagePlans limit(pd.smem_per_sm, pd.max_smem_optin);
    const plan::Launch f = plan::forward_launch(rows, d, esize, plan::Io::kVector, pd);
    const plan::Launch b = plan::backward_launch(rows, d, esize, plan::Io::kVector, true, pd);
    const plan::Launch e = plan::backward_launch(rows, d, esize, plan::Io::kElement, true, pd);
    ASSERT_NE(f.row.band, plan::Band::kLooped) << "D " << d;
    ASSERT_EQ(f.stages, 1) << "D " << d;
    ASSERT_EQ(b.stages, 1) << "D " << d;
    if (b.row.band == plan::Band::kRows) ASSERT_EQ(e.stages, 1) << "D " << d;
    // The single stage fits that device.
    ASSERT_LE(f.smem, pd.max_smem_optin) << "D " << d;
    ASSERT_LE(b.smem, pd.max_smem_optin) << "D " << d;
    ASSERT_LE(e.smem, pd.max_smem_optin) << "D " << d;
    check_shape_case(sc, rng);
    if (::testing::Test::HasFailure()) return;
  }
}

// Every band with 16-byte I/O and with misaligned rows (the backward's staged
// aligned blocks), with rows enough that each CTA (cluster) reuses its stage.
TEST_F(Cuda, OneStagePipelines) {
  std::mt19937_64 rng(52);
  check_one_stage_cases({{1000, RMSNORM_DTYPE_F32, 3000, Layout::kAligned},
                         {1000, RMSNORM_DTYPE_F32, 3000, Layout::kOffset},
                         {4096, RMSNORM_DTYPE_BF16, 1200, Layout::kAligned},
                         {4096, RMSNORM_DTYPE_F16, 1200, Layout::kPadded},
                         {4096, RMSNORM_DTYPE_F32, 700, Layout::kAligned},
                         {33, RMSNORM_DTYPE_BF16, 60000, Layout::kPadded},
                         {8192, RMSNORM_DTYPE_F32, 700, Layout::kAligned},
                         {20000, RMSNORM_DTYPE_BF16, 300, Layout::kAligned},
                         {20000, RMSNORM_DTYPE_F32, 200, Layout::kAligned},
                         {70000, RMSNORM_DTYPE_BF16, 100, Layout::kAligned}},
                        rng);
}

// Two threads run the backward's one kernel under two plans that give it
// different dynamic shared memory: D = 1024 bf16 on a 100 KiB-per-SM GPU takes
// 66048 bytes with gw and 65536 without. The limit is a function attribute
// shared by both threads, so one thread's smaller limit must not land between
// the other's set and launch (that launch fails). Every call must succeed, and
// each thread's last gx and gw must be bit for bit those of a call made alone.
TEST_F(Cuda, ConcurrentPlansOfOneKernel) {
  plan::Device pd = current_plan_device();
  pd.smem_per_sm = 100 * size_t{1024};
  pd.max_smem_optin = 99 * size_t{1024};
  const OneStagePlans limit(pd.smem_per_sm, pd.max_smem_optin);
  constexpr int64_t kRows = 8192, kD = 1024;  // rows enough for the kBackwardRows plan (fewer take the direct kernel)
  const plan::Launch with_gw = plan::backward_launch(kRows, kD, 2, plan::Io::kVector, true, pd);
  const plan::Launch no_gw = plan::backward_launch(kRows, kD, 2, plan::Io::kVector, false, pd);
  ASSERT_EQ(with_gw.kernel, plan::Kernel::kBackwardRows);
  ASSERT_EQ(no_gw.kernel, plan::Kernel::kBackwardRows);
  ASSERT_EQ(with_gw.row.threads_per_row, no_gw.row.threads_per_row);
  ASSERT_EQ(with_gw.row.chunks_per_thread, no_gw.row.chunks_per_thread);
  ASSERT_NE(with_gw.smem, no_gw.smem);
  ASSERT_GT(std::min(with_gw.smem, no_gw.smem), size_t{48 * 1024});

  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = kRows;
  p.cols = kD;
  p.dtype = RMSNORM_DTYPE_BF16;
  const size_t n = size_t{kRows} * kD;
  std::mt19937_64 rng(91);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<uint16_t> host(n + kD);
  for (uint16_t& v : host) v = float_to_bf16(u(rng));

  struct Side {
    int32_t gw_mode;
    cudaStream_t stream = nullptr;
    void *x = nullptr, *gy = nullptr, *w = nullptr, *gx = nullptr, *gw = nullptr, *ws = nullptr;
    size_t ws_bytes = 0;
    std::vector<uint16_t> gx_alone, gw_alone;
    rmsnorm_status_t first_failure = RMSNORM_STATUS_SUCCESS;
    std::string message;
  };
  Side sides[2];
  sides[0].gw_mode = RMSNORM_GW_STORE;
  sides[1].gw_mode = RMSNORM_GW_NONE;
  auto call = [&](Side& s) {
    const rmsnorm_backend_t b = rmsnorm_backend_cuda(device, s.stream);
    return rmsnorm_backward(&p, s.x, kD, s.w, s.gy, kD, nullptr, s.gx, kD, s.gw_mode == RMSNORM_GW_NONE ? nullptr : s.gw,
                            s.gw_mode, s.ws, s.ws_bytes, &b);
  };
  for (Side& s : sides) {
    CUDA_OK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    for (void** q : {&s.x, &s.gy, &s.gx}) CUDA_OK(cudaMalloc(q, n * 2));
    CUDA_OK(cudaMalloc(&s.w, kD * 2));
    CUDA_OK(cudaMalloc(&s.gw, kD * 2));
    CUDA_OK(cudaMemcpy(s.x, host.data(), n * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(s.gy, host.data() + kD, n * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(s.w, host.data() + n, kD * 2, cudaMemcpyHostToDevice));
    const rmsnorm_backend_t b = rmsnorm_backend_cuda(device, s.stream);
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, s.gw_mode, &b, &s.ws_bytes));
    if (s.ws_bytes > 0) CUDA_OK(cudaMalloc(&s.ws, s.ws_bytes));
    ASSERT_EQ(RMSNORM_STATUS_SUCCESS, call(s)) << rmsnorm_last_error();
    CUDA_OK(cudaStreamSynchronize(s.stream));
    s.gx_alone.resize(n);
    s.gw_alone.resize(kD);
    CUDA_OK(cudaMemcpy(s.gx_alone.data(), s.gx, n * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(s.gw_alone.data(), s.gw, kD * 2, cudaMemcpyDeviceToHost));
  }
  auto loop = [&](Side& s) {
    for (int i = 0; i < 2000 && s.first_failure == RMSNORM_STATUS_SUCCESS; ++i) {
      const rmsnorm_status_t st = call(s);
      if (st != RMSNORM_STATUS_SUCCESS) {
        s.first_failure = st;
        s.message = rmsnorm_last_error();
      }
      if (i % 64 == 63) cudaStreamSynchronize(s.stream);  // bounds the queue, keeps the threads interleaved
    }
    cudaStreamSynchronize(s.stream);
  };
  std::thread other(loop, std::ref(sides[1]));
  loop(sides[0]);
  other.join();
  for (Side& s : sides) {
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS, s.first_failure) << "gw mode " << s.gw_mode << ": " << s.message;
    std::vector<uint16_t> gx(n), gw(kD);
    CUDA_OK(cudaMemcpy(gx.data(), s.gx, n * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(gw.data(), s.gw, kD * 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, std::memcmp(gx.data(), s.gx_alone.data(), n * 2)) << "gw mode " << s.gw_mode;
    if (s.gw_mode != RMSNORM_GW_NONE) EXPECT_EQ(0, std::memcmp(gw.data(), s.gw_alone.data(), kD * 2));
    for (void* q : {s.x, s.gy, s.w, s.gx, s.gw, s.ws}) cudaFree(q);
    cudaStreamDestroy(s.stream);
  }
}

void sanitizer_cases(std::initializer_list<int64_t> ds, std::mt19937_64& rng) {
  for (int64_t d : ds) {
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32}) {
      for (int64_t rows : {int64_t{1}, int64_t{5}}) {
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.rows = rows;
        c.layout = d % 2 ? Layout::kOffset : Layout::kAligned;
        check_forward(c, rng);
        c.gw_mode = rows == 1 ? RMSNORM_GW_ACCUMULATE : RMSNORM_GW_STORE;
        check_backward(c, rng);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST_F(CudaSanitizer, RowsBand) {
  std::mt19937_64 rng(11);
  sanitizer_cases({1, 8, 33, 64, 384, 1000, 4096, 8192, 16384}, rng);
}

// The paired forward (x and y at one offset, the weight aligned) at each
// offset, with a row that is shorter than its head, a tail, and a row of whole
// blocks; in place too (y == x: the block stores overwrite x that the
// neighbouring chunks read before the row's reduction).
TEST_F(CudaSanitizer, PairedForward) {
  std::mt19937_64 rng(71);
  for (int64_t d : {3, 33, 1000, 4096, 8200})
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32}) {
      const int64_t vec = dt == RMSNORM_DTYPE_F32 ? 4 : 8;
      for (int64_t off = 1; off < vec; off += 2) {
        Case opts;
        opts.weight = off != 3;
        check_paired_forward(dt, d, 6, off, opts, rng);
        if (HasFailure()) return;
      }
    }
}

// Odd D in contiguous rows (the offsets change row by row: plan::Io::kPairedRows, the paired forward's element
// form with the head and tail by span, plan::paired_edge_spans) at each geometry from 64 threads per row up: bf16
// 64 x 4, 256 x 2, 256 x 4 and 512 x 4 threads x chunks, fp32 64 x 4, 256 x 2, 256 x 4, 512 x 2 and 512 x 4; rows
// enough for every offset class, base + 1 too (Layout::kOffset).
TEST_F(CudaSanitizer, PairedRowsForwardWideRows) {
  std::mt19937_64 rng(83);
  for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32}) {
    const std::vector<int64_t> ds = dt == RMSNORM_DTYPE_BF16 ? std::vector<int64_t>{2047, 4095, 7167, 12287}
                                                             : std::vector<int64_t>{1023, 2047, 3071, 4095, 8191};
    for (int64_t d : ds)
      for (Layout lay : {Layout::kAligned, Layout::kOffset}) {
        Case c;
        c.dtype = dt;
        c.cols = d;
        c.rows = 37;
        c.layout = lay;
        c.weight = d % 3 != 0;
        check_forward(c, rng);
        if (HasFailure()) return;
      }
  }
}

// The paired backward (x, gy, gx and g_h at one offset, the weight aligned) at each offset, in place too, with
// rows enough that CTAs walk several row groups (the stages reused): D = 64 (tpr 8 at 16-bit), 512, 2048 (bf16
// only: tpr 64, 8 row slots per CTA, a kernel per offset), 4096 (2 chunks per thread) and 7168 (4 at 16-bit, tpr
// 256).
TEST_F(CudaSanitizer, PairedBackward) {
  std::mt19937_64 rng(79);
  for (int64_t d : {64, 512, 2048, 4096, 7168})
    for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32}) {
      if (d == 2048 && dt == RMSNORM_DTYPE_F32) continue;
      const int64_t vec = dt == RMSNORM_DTYPE_F32 ? 4 : 8;
      for (int64_t off = 1; off < vec; off += 2) {
        Case opts;
        opts.weight = off != 3;
        const int64_t rows = d == 2048 ? 2 * 8 * 132 + 5 : d > 1000 ? 3 * 132 + 5 : 40 * 132;
        check_paired_backward(dt, d, rows, off, opts, off == 1, rng);
        if (HasFailure()) return;
      }
    }
}

// Enough rows that every persistent CTA (cluster) walks at least three row
// groups, so the double-buffered scratch and exchange slots, and the
// cp.async stages, are reused (the aligned rows-band forward takes one group
// per CTA and walks only past 2^24 groups: these cases check it, and the
// backward, under the sanitizers at many CTAs): D = 1000 fp32 (tpr 64: 4 forward / 8
// backward slots per CTA, named barriers), D = 4096 bf16 (tpr 256) and fp32
// (tpr 512, 2 chunks per thread), D = 20000 bf16 (clusters of 2); and misaligned, where the backward stages
// each row's aligned blocks and a chunk reads a neighbour's block: D = 1000
// fp32 at base + 1 element, D = 4096 bf16 with an odd row stride (the
// misalignment changes from row to row), D = 33 bf16 (tpr 2: 256 slots per
// CTA, warp barriers) and D = 32 bf16 (tpr 1: a row's last block in the
// slot's extra entry) with odd strides.
TEST_F(CudaSanitizer, PersistentReuse) {
  std::mt19937_64 rng(14);
  const ShapeCase cases[] = {
      {1000, RMSNORM_DTYPE_F32, 6400, Layout::kAligned},    {4096, RMSNORM_DTYPE_BF16, 1600, Layout::kAligned},
      {20000, RMSNORM_DTYPE_BF16, 400, Layout::kAligned},   {1000, RMSNORM_DTYPE_F32, 6400, Layout::kOffset},
      {4096, RMSNORM_DTYPE_BF16, 1600, Layout::kPadded},    {33, RMSNORM_DTYPE_BF16, 120000, Layout::kPadded},
      {32, RMSNORM_DTYPE_BF16, 210000, Layout::kPadded},    {4096, RMSNORM_DTYPE_F32, 800, Layout::kAligned}};
  for (const ShapeCase& sc : cases) {
    check_shape_case(sc, rng);
    if (HasFailure()) return;
  }
}

// One-stage pipelines (OneStagePlans): a stage refilled right after it is read.
TEST_F(CudaSanitizer, OneStagePipelines) {
  std::mt19937_64 rng(15);
  check_one_stage_cases({{1000, RMSNORM_DTYPE_F32, 2000, Layout::kOffset},
                         {4096, RMSNORM_DTYPE_BF16, 700, Layout::kAligned},
                         {4096, RMSNORM_DTYPE_BF16, 700, Layout::kPadded},
                         {20000, RMSNORM_DTYPE_BF16, 100, Layout::kAligned}},
                        rng);
}

TEST_F(CudaSanitizer, ClusterBand) {
  std::mt19937_64 rng(12);
  sanitizer_cases({20000, 70000}, rng);
}

TEST_F(CudaSanitizer, LoopedBand) {
  std::mt19937_64 rng(13);
  sanitizer_cases({300000}, rng);
}

// The quantized forward under the sanitizers: the fused rows kernel (whole and partial chunks; at D = 4096 with
// rows enough for plan::quant_sum_pairs too) and the looped kernel (misaligned, cluster and looped bands), per-row
// and static scales.
TEST_F(CudaSanitizer, QuantKernels) {
  std::mt19937_64 rng(17);
  struct QCase { int64_t d; int32_t dtype; int64_t rows; Layout layout; };
  const QCase cases[] = {{4096, RMSNORM_DTYPE_BF16, 300, Layout::kAligned}, {22, RMSNORM_DTYPE_F16, 700, Layout::kPadded},
                         {1000, RMSNORM_DTYPE_F32, 200, Layout::kOffset},   {33, RMSNORM_DTYPE_BF16, 500, Layout::kPadded},
                         {20000, RMSNORM_DTYPE_BF16, 17, Layout::kAligned}, {300000, RMSNORM_DTYPE_BF16, 2, Layout::kAligned},
                         {4096, RMSNORM_DTYPE_BF16, plan::kQuantSumPairsMinRows + 77, Layout::kAligned}};
  for (const QCase& q : cases)
    for (const QuantSpec& qs : {kQuantSpecs[1], kQuantSpecs[3]}) {
      Case c;
      c.dtype = q.dtype;
      c.cols = q.d;
      c.rows = q.rows;
      c.layout = q.layout;
      c.hetero = true;
      check_forward_quant(c, qs, rng);
      if (HasFatalFailure()) return;
    }
}

// The block-scale kernels under the sanitizers: fused (both scale layouts, a partial last block and chunk, rows
// enough for plan::quant_sum_pairs) and looped (misaligned x, the cluster band's D, an fp32 weight).
TEST_F(CudaSanitizer, BlockQuantKernels) {
  std::mt19937_64 rng(18);
  struct BCase { int64_t d; int32_t dtype; int64_t rows; Layout layout; int spec; bool weight_f32; };
  const BCase cases[] = {{4096, RMSNORM_DTYPE_BF16, 300, Layout::kAligned, 0, false},
                         {4096, RMSNORM_DTYPE_BF16, 300, Layout::kAligned, 1, false},
                         {261, RMSNORM_DTYPE_F16, 500, Layout::kPadded, 2, false},
                         {1000, RMSNORM_DTYPE_F32, 200, Layout::kOffset, 3, false},
                         {20000, RMSNORM_DTYPE_BF16, 17, Layout::kAligned, 4, false},
                         {1000, RMSNORM_DTYPE_BF16, 100, Layout::kAligned, 5, true},
                         {4095, RMSNORM_DTYPE_BF16, plan::kQuantSumPairsMinRows + 77, Layout::kPadded, 6, false}};
  for (const BCase& b : cases) {
    Case c;
    c.dtype = b.dtype;
    c.cols = b.d;
    c.rows = b.rows;
    c.layout = b.layout;
    c.hetero = true;
    c.weight_f32 = b.weight_f32;
    check_forward_block_quant(c, kBlockSpecs[b.spec], rng);
    if (HasFatalFailure()) return;
  }
}

// The residual-add kernels under the sanitizers: the fused rows-band forward (aligned, a partial chunk), add_kernel
// before the plain forward (misaligned, cluster band), and the backward's plus-g_h store in every backward kernel,
// in place over the residual, over g_h and over gy.
TEST_F(CudaSanitizer, AddKernels) {
  std::mt19937_64 rng(16);
  struct AddCase { int64_t d; int32_t dtype; int64_t rows; Layout layout; int over; };
  const AddCase cases[] = {{4096, RMSNORM_DTYPE_BF16, 300, Layout::kAligned, 0},
                           {4096, RMSNORM_DTYPE_BF16, 3, Layout::kAligned, 2},
                           {22, RMSNORM_DTYPE_F16, 700, Layout::kPadded, 1},
                           {1000, RMSNORM_DTYPE_F32, 200, Layout::kOffset, 0},
                           {33, RMSNORM_DTYPE_BF16, 500, Layout::kPadded, 2},
                           {20000, RMSNORM_DTYPE_BF16, 17, Layout::kAligned, 1},
                           {300000, RMSNORM_DTYPE_BF16, 2, Layout::kAligned, 0}};
  for (const AddCase& a : cases) {
    Case c;
    c.dtype = a.dtype;
    c.cols = a.d;
    c.rows = a.rows;
    c.layout = a.layout;
    c.hetero = true;
    check_add_forward(c, a.over, rng);
    if (HasFatalFailure()) return;
    c.with_rstd = false;
    c.gw_mode = a.rows == 3 ? RMSNORM_GW_STORE : RMSNORM_GW_STORE_F32;
    check_add_backward(c, a.over == 0 ? GxOver::kNone : a.over == 1 ? GxOver::kGh : GxOver::kGy, rng);
    if (HasFatalFailure()) return;
  }
}

// The fp32-weight kernels (the rows and cluster bands' with the weight read as fp32: direct, element path,
// persistent backward 16-byte and shifted, cluster 16-byte and element; the looped forward and backward with the
// fp32 loader) under the sanitizers, over the rows, cluster and looped bands' D, misaligned too; and the fused add + quantized forward (the rows kernel, and
// add_kernel before the looped quantized forward), in place over the residual.
TEST_F(CudaSanitizer, WeightF32AndAddQuantKernels) {
  std::mt19937_64 rng(18);
  struct WCase { int64_t d; int32_t dtype; int64_t rows; Layout layout; };
  const WCase wcases[] = {{33, RMSNORM_DTYPE_BF16, 40, Layout::kOffset},
                          {4096, RMSNORM_DTYPE_F16, 20, Layout::kAligned},
                          {1000, RMSNORM_DTYPE_BF16, 3000, Layout::kAligned},
                          {1000, RMSNORM_DTYPE_F16, 3000, Layout::kOffset},
                          {22, RMSNORM_DTYPE_BF16, 700, Layout::kPadded},
                          {20000, RMSNORM_DTYPE_BF16, 5, Layout::kOffset},
                          {40000, RMSNORM_DTYPE_F16, 5, Layout::kAligned},
                          {300000, RMSNORM_DTYPE_BF16, 2, Layout::kAligned}};
  for (const WCase& w : wcases) {
    Case c;
    c.dtype = w.dtype;
    c.cols = w.d;
    c.rows = w.rows;
    c.layout = w.layout;
    c.hetero = true;
    c.weight_f32 = true;
    c.gw_mode = w.d == 4096 ? RMSNORM_GW_ACCUMULATE_F32 : RMSNORM_GW_STORE_F32;
    check_weight_f32(c, rng);
    if (HasFatalFailure()) return;
  }
  // The fused add forward with an fp32 weight (the rows kernel), in place over the residual.
  for (int64_t d : {4096, 22}) {
    Case c;
    c.cols = d;
    c.rows = 300;
    c.layout = d == 22 ? Layout::kPadded : Layout::kAligned;
    c.hetero = true;
    c.weight_f32 = true;
    check_add_forward(c, 1, rng);
    if (HasFatalFailure()) return;
  }
  struct ACase { int64_t d; int32_t dtype; int64_t rows; Layout layout; int over; };
  const ACase acases[] = {{4096, RMSNORM_DTYPE_BF16, 300, Layout::kAligned, 1},
                          {22, RMSNORM_DTYPE_F16, 700, Layout::kPadded, 0},
                          {1000, RMSNORM_DTYPE_F32, 200, Layout::kOffset, 2},
                          {20000, RMSNORM_DTYPE_BF16, 17, Layout::kAligned, 1}};
  for (const ACase& q : acases)
    for (const QuantSpec& qs : {kQuantSpecs[1], kQuantSpecs[3]}) {
      Case c;
      c.dtype = q.dtype;
      c.cols = q.d;
      c.rows = q.rows;
      c.layout = q.layout;
      c.hetero = true;
      SCOPED_TRACE(describe(c) + describe(qs));
      check_add_forward_quant(c, q.over, qs, rng);
      if (HasFatalFailure()) return;
    }
}

}  // namespace
}  // namespace rmsnorm::test
