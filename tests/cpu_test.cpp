// CPU backend (rmsnorm::cpu::forward / backward, called directly with the
// internal argument structs) against the float64 reference.
//
// Tolerances (every element is checked; the worst one is printed):
//   y       ulp(T, ref) + acc_rel(D) * |ref|, ref = unrounded float64 y. One
//           rounding to T (half an ulp; a whole ulp also covers a ref just
//           below a power of two whose result rounds up onto it), plus the
//           fp32 error of r (a D-term sum, a divide, a sqrt) and of two
//           products, all relative to |y|.
//   y with round_xhat  ulp(T, x_hat) * |w'| + ulp(T, y) + acc_rel(D) * |y|:
//           the extra rounding of x_hat to T, scaled by w', then the final one.
//   rstd    acc_rel(D) * rstd_ref: a D-term fp32 sum, then divide/add/sqrt.
//   gx      ulp(T, ref) + acc_rel(D) * gx_scale. The fp32 terms r * w' gy and
//           r * x_hat * c each carry the relative errors of r and of the
//           D-term sum s; gx_scale bounds their magnitudes (it includes
//           mean|x_hat w' gy|, the scale of s's rounding), so cancellation in
//           gx cannot make a correct result fail.
//   gw      ulp(T_gw, ref) + (acc_rel(D) + acc_rel(rows)) * gw_scale. Each term
//           gy * x_hat inherits r's error (acc_rel(D)); the sum over rows is a
//           chain of fp32 adds. Its worst case grows linearly with rows, but
//           the rounding errors are bounded, roughly independent and zero-mean,
//           so the accumulated error grows like sqrt(rows): with partial sums
//           of size up to gw_scale, an error of sqrt(rows) * 2^-24 * gw_scale
//           is about one standard deviation for same-sign terms (less for
//           mixed signs), and acc_rel(rows) allows 4 sqrt(rows) + 8 units.
//           The fixed partition into partials of 256 rows only shortens the
//           chains. TEST(CpuGw, LargeRows) exercises it at 65536+ rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "args.hpp"
#include "common/scaled_rms.hpp"
#include "cpu/cpu_backend.hpp"
#include "rmsnorm_reference.hpp"
#include "test_util.hpp"

namespace rmsnorm::test {
namespace {

enum class WeightKind { kNone, kPlain, kOffset };

const int32_t kDtypes[] = {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16};
const GwMode kGwModes[] = {GwMode::kNone, GwMode::kStore, GwMode::kStoreF32, GwMode::kAccumulate,
                           GwMode::kAccumulateF32};

const char* gw_name(GwMode m) {
  switch (m) {
    case GwMode::kNone: return "none";
    case GwMode::kStore: return "store";
    case GwMode::kStoreF32: return "store_f32";
    case GwMode::kAccumulate: return "accumulate";
    case GwMode::kAccumulateF32: return "accumulate_f32";
  }
  return "?";
}

struct Case {
  int64_t rows = 3, cols = 1;
  int32_t dtype = RMSNORM_DTYPE_F32;
  WeightKind weight = WeightKind::kPlain;
  bool strided = false;     // row strides > cols and base offsets (misaligned for wider types)
  bool use_rstd = false;    // forward writes rstd and backward reads it, else backward recomputes it
  bool round_xhat = false;  // forward only
  GwMode gw = GwMode::kNone;
  int threads = 1;
  float eps = 1e-5f;
};

std::string describe(const Case& c) {
  std::ostringstream os;
  os << c.rows << "x" << c.cols << " " << dtype_name(c.dtype) << " weight="
     << (c.weight == WeightKind::kNone ? "none" : c.weight == WeightKind::kPlain ? "plain" : "offset")
     << " strided=" << c.strided << " rstd=" << c.use_rstd << " round_xhat=" << c.round_xhat << " gw=" << gw_name(c.gw)
     << " threads=" << c.threads << " eps=" << c.eps;
  return os.str();
}

// Distinct strides and offsets per operand, so that mixing up two operands'
// layouts is caught.
struct Layout {
  int64_t stride, offset;
};
Layout layout(const Case& c, int operand) {
  if (!c.strided) return {c.cols, 0};
  static const Layout pads[] = {{3, 1}, {5, 3}, {1, 2}, {7, 1}};  // x, y, gy, gx
  return {c.cols + pads[operand].stride, pads[operand].offset};
}
enum Operand { kX = 0, kY = 1, kGy = 2, kGx = 3 };

int32_t gw_dtype(const Case& c) { return gw_is_f32(c.gw) ? RMSNORM_DTYPE_F32 : c.dtype; }

struct Inputs {
  HostMatrix x, gy, w, gw_init;
};

double unit_scale(int64_t) { return 1.0; }

template <typename Scale = double (*)(int64_t)>
Inputs make_inputs(const Case& c, std::mt19937_64& rng, Scale scale = unit_scale) {
  Inputs in;
  const Layout lx = layout(c, kX), lg = layout(c, kGy);
  in.x = HostMatrix(c.dtype, c.rows, c.cols, lx.stride, lx.offset);
  in.gy = HostMatrix(c.dtype, c.rows, c.cols, lg.stride, lg.offset);
  in.w = HostMatrix(c.dtype, 1, c.cols);
  in.gw_init = HostMatrix(gw_dtype(c), 1, c.cols);
  fill_random(in.x, rng, scale);
  fill_random(in.gy, rng);
  fill_random(in.w, rng);
  fill_random(in.gw_init, rng);
  return in;
}

const void* weight_ptr(const Case& c, const Inputs& in) { return c.weight == WeightKind::kNone ? nullptr : in.w.data(); }

struct RefForward {
  std::vector<double> y, rstd, xhat, wprime;
};

RefForward ref_forward(const Case& c, const HostMatrix& x, const HostMatrix& w) {
  RefForward r;
  const std::vector<double> xd = x.to_double(), wd = w.to_double();
  r.y.resize(xd.size());
  r.xhat.resize(xd.size());
  r.rstd.resize(static_cast<size_t>(c.rows));
  reference::Options opt;
  opt.eps = c.eps;  // the float eps the backend sees, exactly
  opt.weight_offset = c.weight == WeightKind::kOffset;
  reference::forward(c.rows, c.cols, xd.data(), c.weight == WeightKind::kNone ? nullptr : wd.data(), opt, r.y.data(),
                     r.rstd.data(), r.xhat.data());
  r.wprime.resize(static_cast<size_t>(c.cols));
  for (int64_t j = 0; j < c.cols; ++j)
    r.wprime[j] = c.weight == WeightKind::kNone ? 1.0 : c.weight == WeightKind::kOffset ? 1.0 + wd[j] : wd[j];
  return r;
}

void expect_forward(const Case& c, const HostMatrix& x_orig, const HostMatrix& w, const HostMatrix& y,
                    const std::vector<float>& rstd) {
  const RefForward ref = ref_forward(c, x_orig, w);
  const int32_t dt = c.dtype;
  if (c.round_xhat) {
    EXPECT_TRUE(check_matrix("y (round_xhat)", y, ref.y, [&](int64_t r, int64_t j) {
      return y_round_xhat_tol(dt, ref.y[r * c.cols + j], ref.xhat[r * c.cols + j], ref.wprime[j], c.cols);
    }));
  } else {
    EXPECT_TRUE(check_matrix("y", y, ref.y, [&](int64_t r, int64_t j) {
      return y_tol(dt, ref.y[r * c.cols + j], c.cols);
    }));
  }
  if (c.use_rstd) {
    EXPECT_TRUE(check_vector(
        "rstd", c.rows, [&](int64_t i) { return static_cast<double>(rstd[i]); }, ref.rstd,
        [&](int64_t i) { return rstd_tol(ref.rstd[i], c.cols); }));
  }
}

// Runs forward into a fresh poisoned y (and rstd when c.use_rstd); returns rstd.
std::vector<float> run_forward(const Case& c, const Inputs& in, HostMatrix& y) {
  const Layout ly = layout(c, kY);
  y = HostMatrix(c.dtype, c.rows, c.cols, ly.stride, ly.offset);
  y.poison();
  std::vector<float> rstd(static_cast<size_t>(c.rows) + 1, std::numeric_limits<float>::quiet_NaN());
  ForwardArgs a;
  a.rows = c.rows;
  a.cols = c.cols;
  a.dtype = static_cast<DType>(c.dtype);
  a.eps = c.eps;
  a.weight_offset = c.weight == WeightKind::kOffset;
  a.round_xhat = c.round_xhat;
  a.x = in.x.data();
  a.x_stride = in.x.stride;
  a.weight = weight_ptr(c, in);
  a.y = y.data();
  a.y_stride = y.stride;
  a.rstd = c.use_rstd ? rstd.data() : nullptr;
  EXPECT_EQ(cpu::forward(a, c.threads), RMSNORM_STATUS_SUCCESS);
  EXPECT_TRUE(padding_untouched("y", y));
  if (c.use_rstd) {
    EXPECT_TRUE(std::isnan(rstd[static_cast<size_t>(c.rows)])) << "rstd written past rows";
  }
  return rstd;
}

struct BackwardOut {
  HostMatrix gx, gw;
};

BackwardArgs backward_args(const Case& c, const Inputs& in, const float* rstd) {
  BackwardArgs a;
  a.rows = c.rows;
  a.cols = c.cols;
  a.dtype = static_cast<DType>(c.dtype);
  a.eps = c.eps;
  a.weight_offset = c.weight == WeightKind::kOffset;
  a.x = in.x.data();
  a.x_stride = in.x.stride;
  a.weight = weight_ptr(c, in);
  a.gy = in.gy.data();
  a.gy_stride = in.gy.stride;
  a.rstd = c.use_rstd ? rstd : nullptr;
  a.gw_mode = c.gw;
  return a;
}

// Runs backward into a fresh poisoned gx and gw (gw starts as in.gw_init for
// the accumulate modes), with a NaN-poisoned workspace of the queried size.
BackwardOut run_backward(const Case& c, const Inputs& in, const float* rstd) {
  BackwardOut out;
  const Layout lg = layout(c, kGx);
  out.gx = HostMatrix(c.dtype, c.rows, c.cols, lg.stride, lg.offset);
  out.gx.poison();
  out.gw = gw_accumulates(c.gw) ? in.gw_init : HostMatrix(gw_dtype(c), 1, c.cols);
  const size_t bytes = cpu::backward_workspace_bytes(c.rows, c.cols, c.gw);
  std::vector<float> ws(bytes / sizeof(float), std::numeric_limits<float>::quiet_NaN());
  BackwardArgs a = backward_args(c, in, rstd);
  a.gx = out.gx.data();
  a.gx_stride = out.gx.stride;
  a.gw = c.gw == GwMode::kNone ? nullptr : out.gw.data();
  a.workspace = ws.empty() ? nullptr : ws.data();
  a.workspace_bytes = bytes;
  EXPECT_EQ(cpu::backward(a, c.threads), RMSNORM_STATUS_SUCCESS);
  EXPECT_TRUE(padding_untouched("gx", out.gx));
  return out;
}

void expect_backward(const Case& c, const HostMatrix& x, const HostMatrix& gy_orig, const HostMatrix& w,
                     const HostMatrix& gw_init, const HostMatrix& gx, const HostMatrix& gw) {
  const std::vector<double> xd = x.to_double(), gyd = gy_orig.to_double(), wd = w.to_double();
  const size_t n = xd.size(), m = static_cast<size_t>(c.cols);
  std::vector<double> gx_ref(n), gx_scale(n), gw_ref(m), gw_scale(m);
  reference::Options opt;
  opt.eps = c.eps;
  opt.weight_offset = c.weight == WeightKind::kOffset;
  reference::backward(c.rows, c.cols, xd.data(), c.weight == WeightKind::kNone ? nullptr : wd.data(), gyd.data(), opt,
                      gx_ref.data(), gw_ref.data(), gx_scale.data(), gw_scale.data());
  EXPECT_TRUE(check_matrix("gx", gx, gx_ref, [&](int64_t r, int64_t j) {
    const size_t k = static_cast<size_t>(r * c.cols + j);
    return gx_tol(c.dtype, gx_ref[k], gx_scale[k], c.cols);
  }));
  if (c.gw == GwMode::kNone) return;
  if (gw_accumulates(c.gw))
    for (int64_t j = 0; j < c.cols; ++j) gw_ref[j] += gw_init.get(0, j);
  const int32_t gdt = gw_dtype(c);
  EXPECT_TRUE(check_vector(
      "gw", c.cols, [&](int64_t j) { return gw.get(0, j); }, gw_ref,
      [&](int64_t j) { return gw_tol(gdt, gw_ref[j], gw_scale[j], c.rows, c.cols); }));
}

// Forward and backward of one case on fresh random inputs, both checked.
template <typename Scale = double (*)(int64_t)>
void run_case(const Case& c, std::mt19937_64& rng, Scale scale = unit_scale) {
  SCOPED_TRACE(describe(c));
  const Inputs in = make_inputs(c, rng, scale);
  HostMatrix y;
  const std::vector<float> rstd = run_forward(c, in, y);
  expect_forward(c, in.x, in.w, y, rstd);
  const BackwardOut out = run_backward(c, in, rstd.data());
  expect_backward(c, in.x, in.gy, in.w, in.gw_init, out.gx, out.gw);
}

// ---- coverage of D ------------------------------------------------------------------------

// Options for a sweep case, rotating with k = cols + 37 * dtype index through a
// mixed radix (weight 3, strided 2, rstd 2, round_xhat 2, gw 5): every
// combination recurs every 120 values of k, so each dtype meets each one
// about nine times over 1..1100, without the cost of the full product.
Case rotated_case(int64_t rows, int64_t cols, int dtype_index) {
  const int64_t k = cols + 37 * dtype_index;
  Case c;
  c.rows = rows;
  c.cols = cols;
  c.dtype = kDtypes[dtype_index];
  c.weight = static_cast<WeightKind>(k % 3);
  c.strided = (k / 3) % 2 != 0;
  c.use_rstd = (k / 6) % 2 != 0;
  c.round_xhat = (k / 12) % 2 != 0;
  c.gw = c.weight == WeightKind::kNone ? GwMode::kNone : kGwModes[(k / 24) % 5];
  c.threads = 1 + static_cast<int>(k % 3);
  return c;
}

class CpuSweep : public ::testing::TestWithParam<int> {};

// Every D in 1..1100 at 3 rows (an odd count), for each dtype.
TEST_P(CpuSweep, EveryColsTo1100) {
  std::mt19937_64 rng(1000 + GetParam());
  for (int64_t cols = 1; cols <= 1100; ++cols) {
    run_case(rotated_case(3, cols, GetParam()), rng);
    if (HasFailure()) return;  // one failing D says enough; keep the log readable
  }
}

// Large D, including primes (8191, 12289) and 3584, 7168 (common model widths
// that are not powers of two). Rows stay few; from D = 65536 on, 3 threads
// take the column split of the gw tiles (one gw partial, more threads than
// partials); below that the work is too small to be given to threads.
TEST_P(CpuSweep, LargeCols) {
  std::mt19937_64 rng(2000 + GetParam());
  for (int64_t cols : {3584, 4096, 7168, 8191, 12289, 16384, 65536, 262144}) {
    for (int variant = 0; variant < 2; ++variant) {
      Case c = rotated_case(cols >= 65536 ? 2 : 3, cols, GetParam());
      c.threads = 3;
      if (variant == 1) {  // the other half of the options
        c.strided = !c.strided;
        c.use_rstd = !c.use_rstd;
        c.round_xhat = !c.round_xhat;
        c.weight = WeightKind::kOffset;
        c.gw = kGwModes[1 + (cols / 7) % 4];
      }
      run_case(c, rng);
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuSweep, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(dtype_name(kDtypes[info.param]));
                         });

// The full product of options at representative D, chosen for the CPU code
// paths: the sum8 tail only (1, 2, 7), the 8-wide body only (8, 32, 64, 128,
// 256, 512, 1024), body + tail (9, 31, 33, 127, 129, 255, 257, 513, 1031), and
// the power-of-two band edges the CUDA dispatch is built around, so the oracle
// is known good exactly where the GPU is most likely to be wrong. 5 rows.
class CpuProduct : public ::testing::TestWithParam<int64_t> {};

TEST_P(CpuProduct, AllOptions) {
  const int64_t cols = GetParam();
  std::mt19937_64 rng(3000 + static_cast<uint64_t>(cols));
  for (int d = 0; d < 3; ++d)
    for (WeightKind wk : {WeightKind::kNone, WeightKind::kPlain, WeightKind::kOffset})
      for (GwMode gw : kGwModes) {
        if (wk == WeightKind::kNone && gw != GwMode::kNone) continue;
        for (int bits = 0; bits < 8; ++bits) {
          Case c;
          c.rows = 5;
          c.cols = cols;
          c.dtype = kDtypes[d];
          c.weight = wk;
          c.gw = gw;
          c.strided = bits & 1;
          c.use_rstd = bits & 2;
          c.round_xhat = bits & 4;
          run_case(c, rng);
          if (HasFailure()) return;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Cols, CpuProduct,
                         ::testing::Values(1, 2, 7, 8, 9, 31, 32, 33, 64, 127, 128, 129, 255, 256, 257, 512, 513, 1024,
                                           1031),
                         [](const ::testing::TestParamInfo<int64_t>& info) { return std::to_string(info.param); });

// ---- semantics -----------------------------------------------------------------------------

// Neighbouring rows scaled from 1e-3 to 1e3: a row normalised with another
// row's statistics is off by orders of magnitude. Row counts around the gw
// partial size (256), with threads, so rows cross thread and partial borders.
TEST(CpuSemantics, HeterogeneousRows) {
  std::mt19937_64 rng(41);
  const double scales[] = {1e-3, 1e3, 1.0, 1e-2, 1e2, 3e-3, 3e2};
  auto scale = [&](int64_t r) { return scales[r % 7]; };
  for (int d = 0; d < 3; ++d)
    for (int64_t rows : {1, 7, 255, 257, 600})
      for (int64_t cols : {64, 320, 1000}) {
        Case c;
        c.rows = rows;
        c.cols = cols;
        c.dtype = kDtypes[d];
        c.use_rstd = rows % 2 == 1;
        c.gw = rows % 2 == 1 ? GwMode::kStoreF32 : GwMode::kStore;
        c.threads = 3;
        run_case(c, rng, scale);
      }
}

TEST(CpuSemantics, AllZeroRowsGiveZero) {
  std::mt19937_64 rng(42);
  for (int d = 0; d < 3; ++d)
    for (int64_t cols : {1, 8, 33, 1000}) {
      Case c;
      c.rows = 6;
      c.cols = cols;
      c.dtype = kDtypes[d];
      c.use_rstd = true;
      c.gw = GwMode::kStoreF32;
      SCOPED_TRACE(describe(c));
      Inputs in = make_inputs(c, rng);
      for (int64_t r : {1, 4, 5})
        for (int64_t j = 0; j < cols; ++j) in.x.set(r, j, 0.0);
      HostMatrix y;
      const std::vector<float> rstd = run_forward(c, in, y);
      for (int64_t r : {1, 4, 5}) {
        for (int64_t j = 0; j < cols; ++j) ASSERT_EQ(y.get(r, j), 0.0) << "row " << r << " col " << j;
        EXPECT_FLOAT_EQ(rstd[static_cast<size_t>(r)], static_cast<float>(1.0 / std::sqrt(double{c.eps})));
      }
      expect_forward(c, in.x, in.w, y, rstd);
      const BackwardOut out = run_backward(c, in, rstd.data());
      expect_backward(c, in.x, in.gy, in.w, in.gw_init, out.gx, out.gw);
    }
}

// A forward case of one dtype, weight kind and rounding (the semantics tests' loops).
Case forward_case(int32_t dtype, WeightKind wk, bool round_xhat, int64_t rows, int64_t cols) {
  Case c;
  c.rows = rows;
  c.cols = cols;
  c.dtype = dtype;
  c.weight = wk;
  c.round_xhat = round_xhat;
  return c;
}

// w' = w exactly: a -0 weight gives y = x r (-0), whose sign is the opposite of x's; 1 + (-1) = +0 with the
// offset gives x's sign. The CUDA backend's Cuda.ForwardSignedZeroWeights asks the same of every kernel.
TEST(CpuSemantics, SignedZeroWeights) {
  std::mt19937_64 rng(48);
  for (int d = 0; d < 3; ++d)
    for (WeightKind wk : {WeightKind::kPlain, WeightKind::kOffset})
      for (bool round_xhat : {false, true}) {
        const Case c = forward_case(kDtypes[d], wk, round_xhat, 3, 37);
        SCOPED_TRACE(describe(c));
        Inputs in = make_inputs(c, rng);
        const bool offset = wk == WeightKind::kOffset;
        for (int64_t j = 0; j < c.cols; j += 2) in.w.set(0, j, offset ? -1.0 : (j % 4 == 0 ? -0.0 : 0.0));
        for (int64_t j = 0; j < c.cols; ++j) in.x.set(2, j, j % 3 == 0 ? -0.0 : 0.0);
        HostMatrix y;
        run_forward(c, in, y);
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t j = 0; j < c.cols; j += 2) {
            const bool w_neg = !offset && j % 4 == 0;
            const bool want_neg = std::signbit(in.x.get(r, j)) != w_neg;
            const double v = y.get(r, j);
            ASSERT_TRUE(v == 0.0 && std::signbit(v) == want_neg)
                << "row " << r << " col " << j << ": y = " << v << ", x = " << in.x.get(r, j) << ", w = "
                << in.w.get(0, j) << "; want " << (want_neg ? "-0" : "+0");
          }
      }
}

// One value per row far above the rest: its square dominates the sum, the
// other entries normalise to tiny values. Chosen so that the squares stay
// finite in fp32 (1e15^2 = 1e30) and, for f16, the value fits (3e4).
TEST(CpuSemantics, OneHugeValuePerRow) {
  std::mt19937_64 rng(43);
  for (int d = 0; d < 3; ++d)
    for (int64_t cols : {2, 17, 512, 4099}) {
      Case c;
      c.rows = 5;
      c.cols = cols;
      c.dtype = kDtypes[d];
      c.use_rstd = true;
      c.gw = GwMode::kStoreF32;
      SCOPED_TRACE(describe(c));
      Inputs in = make_inputs(c, rng);
      const double huge = c.dtype == RMSNORM_DTYPE_F16 ? 3e4 : 1e15;
      for (int64_t r = 0; r < c.rows; ++r) in.x.set(r, (r * 7) % cols, r % 2 ? -huge : huge);
      HostMatrix y;
      const std::vector<float> rstd = run_forward(c, in, y);
      expect_forward(c, in.x, in.w, y, rstd);
      const BackwardOut out = run_backward(c, in, rstd.data());
      expect_backward(c, in.x, in.gy, in.w, in.gw_init, out.gx, out.gw);
    }
}

TEST(CpuSemantics, ZeroEpsWithNonZeroRows) {
  std::mt19937_64 rng(44);
  for (int d = 0; d < 3; ++d)
    for (int64_t cols : {1, 5, 64, 777}) {
      Case c;
      c.rows = 4;
      c.cols = cols;
      c.dtype = kDtypes[d];
      c.eps = 0.0f;
      c.use_rstd = cols % 2 == 1;
      c.weight = WeightKind::kOffset;
      c.gw = GwMode::kAccumulateF32;
      run_case(c, rng, [](int64_t r) { return r % 2 ? 1e-2 : 10.0; });
    }
}

// f16 inputs near 65504: their squares (~4e9) overflow f16 but not fp32.
TEST(CpuSemantics, F16NearMaxDoesNotOverflow) {
  std::mt19937_64 rng(45);
  std::uniform_real_distribution<double> mag(60000.0, 65504.0);
  for (int64_t cols : {1, 8, 100, 4096}) {
    for (bool round_xhat : {false, true}) {
      Case c;
      c.rows = 3;
      c.cols = cols;
      c.dtype = RMSNORM_DTYPE_F16;
      c.use_rstd = true;
      c.round_xhat = round_xhat;
      c.gw = GwMode::kStore;
      SCOPED_TRACE(describe(c));
      Inputs in = make_inputs(c, rng);
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t j = 0; j < cols; ++j) in.x.set(r, j, (j + r) % 3 ? mag(rng) : -mag(rng));
      HostMatrix y;
      const std::vector<float> rstd = run_forward(c, in, y);
      for (int64_t r = 0; r < c.rows; ++r) EXPECT_GT(rstd[static_cast<size_t>(r)], 0.0f);
      expect_forward(c, in.x, in.w, y, rstd);
      const BackwardOut out = run_backward(c, in, rstd.data());
      expect_backward(c, in.x, in.gy, in.w, in.gw_init, out.gx, out.gw);
    }
  }
}

// The fp32 contract is exact given the r forward reports: y == T((x * r) * w')
// and, with round_xhat, y == T(T(x * r) * w') bit for bit (products only, so
// no contraction can blur it). The tolerance checks above cannot tell the two
// modes apart (both are within an ulp); this can.
TEST(CpuSemantics, ForwardIsExactGivenRstd) {
  std::mt19937_64 rng(53);
  for (int d = 0; d < 3; ++d)
    for (WeightKind wk : {WeightKind::kNone, WeightKind::kPlain, WeightKind::kOffset})
      for (bool round_xhat : {false, true}) {
        Case c = forward_case(kDtypes[d], wk, round_xhat, 4, 1000);
        c.use_rstd = true;
        SCOPED_TRACE(describe(c));
        const Inputs in = make_inputs(c, rng);
        HostMatrix y;
        const std::vector<float> rstd = run_forward(c, in, y);
        int64_t differ_from_other_mode = 0;
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t j = 0; j < c.cols; ++j) {
            const float w = static_cast<float>(in.w.get(0, j));
            const float wp = wk == WeightKind::kNone ? 1.0f : wk == WeightKind::kOffset ? 1.0f + w : w;
            const float xh = static_cast<float>(in.x.get(r, j)) * rstd[static_cast<size_t>(r)];
            const double plain = round_to(c.dtype, xh * wp);
            const double rounded = round_to(c.dtype, static_cast<float>(round_to(c.dtype, xh)) * wp);
            const double want = round_xhat ? rounded : plain;
            if (plain != rounded) ++differ_from_other_mode;
            ASSERT_EQ(y.get(r, j), want) << "row " << r << " col " << j;
          }
        // At 16-bit with a weight, the double rounding changes a good share of
        // the results, so the check above did separate the modes.
        if (c.dtype != RMSNORM_DTYPE_F32 && wk != WeightKind::kNone) {
          EXPECT_GT(differ_from_other_mode, 50);
        }
      }
}

// ---- range: rows whose squares leave fp32 ------------------------------------------------------

TEST(CpuRange, RescalePredicateAndFactors) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float flt_max = std::numeric_limits<float>::max();
  EXPECT_TRUE(rms_needs_rescale(inf, 0.0f));
  EXPECT_TRUE(rms_needs_rescale(inf, 1.0f));
  EXPECT_FALSE(rms_needs_rescale(flt_max, 0.0f));
  EXPECT_FALSE(rms_needs_rescale(nan, 0.0f));
  EXPECT_FALSE(rms_needs_rescale(0x1p-64f, 0.0f));
  EXPECT_TRUE(rms_needs_rescale(std::nextafter(0x1p-64f, 0.0f), 0.0f));
  EXPECT_TRUE(rms_needs_rescale(0.0f, std::nextafter(0x1p-40f, 0.0f)));
  EXPECT_FALSE(rms_needs_rescale(0.0f, 0x1p-40f));
  EXPECT_FALSE(rms_needs_rescale(1.0f, 0.0f));
  EXPECT_EQ(rms_rescale_factor(inf), 0x1p-80f);
  EXPECT_EQ(rms_rescale_factor(0.0f), 0x1p80f);
  EXPECT_EQ(rms_dot_scale(1.0f), 1.0f);
  EXPECT_EQ(rms_dot_scale(0x1p-64f), 1.0f);
  EXPECT_EQ(rms_dot_scale(0x1p64f), 1.0f);
  EXPECT_EQ(rms_dot_scale(std::nextafter(0x1p-64f, 0.0f)), 0x1p-80f);
  EXPECT_EQ(rms_dot_scale(std::nextafter(0x1p64f, inf)), 0x1p80f);
  // Where nothing under- or overflows, the rescaled formula is the plain one,
  // bit for bit: scaling by powers of two is exact.
  struct Exact {
    float ss, eps, s;
  };
  for (Exact e : {Exact{1e-30f, 0.0f, 0x1p80f}, Exact{1e-25f, 1e-20f, 0x1p80f}, Exact{3e-20f, 1e-12f, 0x1p80f},
                  Exact{1e30f, 0.0f, 0x1p-80f}, Exact{1e25f, 1e12f, 0x1p-80f}})
    for (int cols : {1, 7, 4096})
      EXPECT_EQ(float_bits(rms_from_scaled(e.ss * e.s * e.s, e.s, cols, e.eps)),
                float_bits(rms_from_sum(e.ss, cols, e.eps)))
          << e.ss << " " << e.eps << " " << cols;
}

// Rows of |x| in [lo, hi] with random signs: the plain fp32 sum of squares
// overflows (huge) or underflows (tiny). The reference computes in double,
// which holds both. Extreme rows alternate with ordinary rows scaled 1e-3
// and 1e3, so a row normalised with a neighbour's statistics, or an
// ordinary row pushed through the rescaled path wrongly, fails too.
struct RangeKind {
  int32_t dtype;
  double lo, hi;
  float eps;
  const char* what;
};

void set_extreme_rows(const Case& c, const RangeKind& k, std::mt19937_64& rng, Inputs* in) {
  std::uniform_real_distribution<double> mag(k.lo, k.hi);
  for (int64_t r = 0; r < c.rows; r += 3)
    for (int64_t j = 0; j < c.cols; ++j) in->x.set(r, j, (rng() & 1 ? 1.0 : -1.0) * mag(rng));
}

double range_row_scale(int64_t r) { return r % 3 == 1 ? 1e-3 : 1e3; }

const RangeKind kRangeKinds[] = {
    {RMSNORM_DTYPE_BF16, 5e19, 2e20, 1e-5f, "bf16 ~1e20"},
    {RMSNORM_DTYPE_F32, 5e19, 2e20, 1e-5f, "f32 ~1e20"},
    {RMSNORM_DTYPE_F32, 1e38, 3.4e38, 1e-5f, "f32 ~3e38"},
    {RMSNORM_DTYPE_BF16, 1e38, 3.3e38, 1e-6f, "bf16 ~3e38"},
    {RMSNORM_DTYPE_F32, 5e-26, 2e-25, 0.0f, "f32 ~1e-25, eps 0"},
    {RMSNORM_DTYPE_BF16, 5e-26, 2e-25, 0.0f, "bf16 ~1e-25, eps 0"},
    {RMSNORM_DTYPE_F32, 0x1p-100, 0x1p-99, 0.0f, "f32 ~2^-100, eps 0"},
    {RMSNORM_DTYPE_F32, 5e-26, 2e-25, 1e-30f, "f32 ~1e-25, eps 1e-30"},
};

TEST(CpuRange, HugeAndTinyRowsForwardAndBackward) {
  std::mt19937_64 rng(60);
  for (const RangeKind& k : kRangeKinds)
    for (int64_t cols : {1, 7, 64, 1000, 4099})
      for (int64_t rows : {1, 7}) {
        Case c;
        c.rows = rows;
        c.cols = cols;
        c.dtype = k.dtype;
        c.eps = k.eps;
        c.threads = 2;
        c.weight = cols % 2 ? WeightKind::kOffset : WeightKind::kPlain;
        c.strided = rows == 7;
        c.gw = cols % 2 ? GwMode::kStoreF32 : GwMode::kStore;
        for (bool use_rstd : {true, false}) {  // backward with the forward's rstd, and recomputing it
          c.use_rstd = use_rstd;
          SCOPED_TRACE(std::string(k.what) + ": " + describe(c));
          Inputs in = make_inputs(c, rng, range_row_scale);
          set_extreme_rows(c, k, rng, &in);
          HostMatrix y;
          const std::vector<float> rstd = run_forward(c, in, y);
          expect_forward(c, in.x, in.w, y, rstd);
          const BackwardOut out = run_backward(c, in, rstd.data());
          expect_backward(c, in.x, in.gy, in.w, in.gw_init, out.gx, out.gw);
          if (HasFailure()) return;
        }
      }
}

// The rstd of rows on both paths is what backward recomputes, bit for bit.
TEST(CpuRange, RecomputedRstdMatchesForwardBitwise) {
  std::mt19937_64 rng(61);
  for (const RangeKind& k : kRangeKinds) {
    Case c;
    c.rows = 9;
    c.cols = 333;
    c.dtype = k.dtype;
    c.eps = k.eps;
    c.gw = GwMode::kStoreF32;
    c.use_rstd = true;
    SCOPED_TRACE(k.what);
    Inputs in = make_inputs(c, rng, range_row_scale);
    set_extreme_rows(c, k, rng, &in);
    HostMatrix y;
    const std::vector<float> rstd = run_forward(c, in, y);
    const BackwardOut with = run_backward(c, in, rstd.data());
    c.use_rstd = false;
    const BackwardOut without = run_backward(c, in, nullptr);
    EXPECT_TRUE(with.gx.storage == without.gx.storage);
    EXPECT_TRUE(with.gw.storage == without.gw.storage);
  }
}

// On ordinary rows (every fp32 sum of squares normal) r, and backward's c,
// are the plain expressions in the documented sum8 order (top of
// cpu_backend.cpp), bit for bit: rstd = 1 / sqrt(ss / D + eps) and
// gx = T(r * (w'gy - (x * r) * c)) with c = (r * sum(x * w'gy)) / D.
// The documented order: eight chains over a row of up to 4096 terms; a longer one cut at a multiple of 4096 (the
// first part ceil(full blocks / 2) blocks), its parts summed alike and added.
float sum8_order(int64_t begin, int64_t end, const std::function<float(int64_t)>& term) {
  if (end - begin > 4096) {
    const int64_t mid = begin + ((end - begin) / 4096 + 1) / 2 * 4096;
    return sum8_order(begin, mid, term) + sum8_order(mid, end, term);
  }
  float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t j = begin; j < end; ++j) a[(j - begin) % 8] += term(j);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

TEST(CpuRange, OrdinaryRowsKeepThePlainFormulaBitwise) {
  std::mt19937_64 rng(62);
  const double scales[] = {1e-3, 1e3, 1.0, 1e-2, 1e2, 3e-3, 3e2};
  auto scale = [&](int64_t r) { return scales[r % 7]; };
  for (int d = 0; d < 3; ++d)
    for (int64_t cols : {1, 7, 8, 9, 64, 1000, 4096, 4099, 12289, 20000})
      for (float eps : {1e-5f, 0.0f, 1e-12f}) {
        Case c;
        c.rows = 7;
        c.cols = cols;
        c.dtype = kDtypes[d];
        c.eps = eps;
        c.use_rstd = true;
        c.weight = WeightKind::kOffset;
        SCOPED_TRACE(describe(c));
        const Inputs in = make_inputs(c, rng, scale);
        HostMatrix y;
        const std::vector<float> rstd = run_forward(c, in, y);
        Case recompute = c;
        recompute.use_rstd = false;
        const BackwardOut out = run_backward(recompute, in, nullptr);
        for (int64_t r = 0; r < c.rows; ++r) {
          auto x = [&](int64_t j) { return static_cast<float>(in.x.get(r, j)); };
          auto wg = [&](int64_t j) {
            return (1.0f + static_cast<float>(in.w.get(0, j))) * static_cast<float>(in.gy.get(r, j));
          };
          const float ss = sum8_order(0, cols, [&](int64_t j) { return x(j) * x(j); });
          ASSERT_TRUE(std::isnormal(ss)) << "row " << r << ": not an ordinary row";
          const float want_r = 1.0f / std::sqrt(ss / static_cast<float>(cols) + eps);
          ASSERT_EQ(float_bits(rstd[static_cast<size_t>(r)]), float_bits(want_r)) << "rstd of row " << r;
          const float s = sum8_order(0, cols, [&](int64_t j) { return x(j) * wg(j); });
          const float cc = (want_r * s) / static_cast<float>(cols);
          for (int64_t j = 0; j < cols; ++j)
            ASSERT_EQ(out.gx.get(r, j), round_to(c.dtype, want_r * (wg(j) - (x(j) * want_r) * cc)))
                << "gx row " << r << " col " << j;
        }
      }
}

// Long rows keep r to a few ulps: the row sum adds 4096-term blocks pairwise (a single eight-chain sum over 2^21
// terms was 30-60 ulps off at fp32).
TEST(CpuRange, LongRowsKeepRAccurate) {
  std::mt19937_64 rng(63);
  for (int64_t cols : {int64_t{4097}, int64_t{65537}, int64_t{300000}, int64_t{1} << 21}) {
    Case c;
    c.rows = 2;
    c.cols = cols;
    c.dtype = RMSNORM_DTYPE_F32;
    c.eps = 0.0f;
    c.use_rstd = true;
    SCOPED_TRACE(describe(c));
    const Inputs in = make_inputs(c, rng);
    HostMatrix y;
    const std::vector<float> rstd = run_forward(c, in, y);
    for (int64_t r = 0; r < c.rows; ++r) {
      double ss = 0.0;
      for (int64_t j = 0; j < cols; ++j) ss += in.x.get(r, j) * in.x.get(r, j);
      const double want = 1.0 / std::sqrt(ss / static_cast<double>(cols));
      const double rel = std::fabs(rstd[static_cast<size_t>(r)] - want) / want;
      EXPECT_LT(rel, 4 * 0x1p-24) << "row " << r << ": rstd " << rstd[static_cast<size_t>(r)] << ", float64 " << want;
    }
  }
}

// ---- in-place --------------------------------------------------------------------------------

TEST(CpuInPlace, ForwardYEqualsX) {
  std::mt19937_64 rng(46);
  for (int d = 0; d < 3; ++d)
    for (int64_t cols : {1, 9, 64, 1000, 5000})
      for (bool round_xhat : {false, true}) {
        Case c;
        c.rows = 37;
        c.cols = cols;
        c.dtype = kDtypes[d];
        c.strided = cols % 2 == 0;
        c.round_xhat = round_xhat;
        c.use_rstd = true;
        c.threads = 3;
        SCOPED_TRACE(describe(c));
        Inputs in = make_inputs(c, rng);
        const HostMatrix x_orig = in.x;
        std::vector<float> rstd(static_cast<size_t>(c.rows));
        ForwardArgs a;
        a.rows = c.rows;
        a.cols = c.cols;
        a.dtype = static_cast<DType>(c.dtype);
        a.eps = c.eps;
        a.round_xhat = round_xhat;
        a.x = in.x.data();
        a.x_stride = in.x.stride;
        a.weight = in.w.data();
        a.y = in.x.data();
        a.y_stride = in.x.stride;
        a.rstd = rstd.data();
        ASSERT_EQ(cpu::forward(a, c.threads), RMSNORM_STATUS_SUCCESS);
        expect_forward(c, x_orig, in.w, in.x, rstd);
      }
}

// gx == gy, for every gw mode; rows/threads chosen to take both gw paths
// (tiles spanning whole rows, and rows split into column ranges).
TEST(CpuInPlace, BackwardGxEqualsGy) {
  std::mt19937_64 rng(47);
  for (int d = 0; d < 3; ++d)
    for (GwMode gw : kGwModes)
      for (int64_t rows : {3, 700}) {
        Case c;
        c.rows = rows;
        c.cols = rows == 3 ? 40000 : 300;
        c.dtype = kDtypes[d];
        c.strided = true;
        c.use_rstd = gw == GwMode::kStore;
        c.gw = gw;
        c.threads = 3;
        SCOPED_TRACE(describe(c));
        Inputs in = make_inputs(c, rng);
        const HostMatrix gy_orig = in.gy;
        std::vector<float> rstd;
        if (c.use_rstd) {
          HostMatrix y;
          rstd = run_forward(c, in, y);
        }
        HostMatrix gw_out = gw_accumulates(gw) ? in.gw_init : HostMatrix(gw_dtype(c), 1, c.cols);
        const size_t bytes = cpu::backward_workspace_bytes(c.rows, c.cols, gw);
        std::vector<float> ws(bytes / sizeof(float), std::numeric_limits<float>::quiet_NaN());
        BackwardArgs a = backward_args(c, in, rstd.data());
        a.gx = in.gy.data();
        a.gx_stride = in.gy.stride;
        a.gw = gw == GwMode::kNone ? nullptr : gw_out.data();
        a.workspace = ws.empty() ? nullptr : ws.data();
        a.workspace_bytes = bytes;
        ASSERT_EQ(cpu::backward(a, c.threads), RMSNORM_STATUS_SUCCESS);
        expect_backward(c, in.x, gy_orig, in.w, in.gw_init, in.gy, gw_out);
      }
}

// ---- gw ----------------------------------------------------------------------------------------

TEST(CpuGw, Partition) {
  EXPECT_EQ(cpu::gw_partials(0), 0);
  EXPECT_EQ(cpu::gw_partials(1), 1);
  EXPECT_EQ(cpu::gw_partials(cpu::kGwRowsPerPartial), 1);
  EXPECT_EQ(cpu::gw_partials(cpu::kGwRowsPerPartial + 1), 2);
  EXPECT_EQ(cpu::gw_partials(cpu::kGwRowsPerPartial * cpu::kMaxGwPartials), cpu::kMaxGwPartials);
  EXPECT_EQ(cpu::gw_partials(int64_t{1} << 40), cpu::kMaxGwPartials);
  EXPECT_EQ(cpu::backward_workspace_bytes(1000, 64, GwMode::kNone), 0u);
  for (GwMode m : {GwMode::kStore, GwMode::kStoreF32, GwMode::kAccumulate, GwMode::kAccumulateF32})
    EXPECT_EQ(cpu::backward_workspace_bytes(1000, 64, m), 4u * 64u * 4u);
  EXPECT_EQ(cpu::backward_workspace_bytes(0, 64, GwMode::kStore), 0u);
}

// The documented summation order, bit for bit: partial p sums rows
// [p*rows/P, (p+1)*rows/P) in order, in fp32, with x_hat = x * r (r as forward
// reports it); gw adds the partials in order. 1000 rows -> 4 partials of
// 250; 70001 rows -> 256 partials of 273 or 274 rows.
TEST(CpuGw, SummationOrderIsTheDocumentedOne) {
  std::mt19937_64 rng(54);
  for (int64_t rows : {1, 1000, 70001})
    for (int threads : {1, 3}) {
      Case c;
      c.rows = rows;
      c.cols = 37;
      c.dtype = RMSNORM_DTYPE_BF16;
      c.gw = GwMode::kStoreF32;
      c.use_rstd = true;
      c.threads = threads;
      SCOPED_TRACE(describe(c));
      const Inputs in = make_inputs(c, rng);
      HostMatrix y;
      const std::vector<float> rstd = run_forward(c, in, y);
      const BackwardOut out = run_backward(c, in, rstd.data());
      const int64_t parts = cpu::gw_partials(rows);
      for (int64_t j = 0; j < c.cols; ++j) {
        float total = 0.0f;
        for (int64_t p = 0; p < parts; ++p) {
          float acc = 0.0f;
          for (int64_t i = p * rows / parts; i < (p + 1) * rows / parts; ++i) {
            const float xh = static_cast<float>(in.x.get(i, j)) * rstd[static_cast<size_t>(i)];
            acc += static_cast<float>(in.gy.get(i, j)) * xh;
          }
          total = p == 0 ? acc : total + acc;
        }
        ASSERT_EQ(out.gw.get(0, j), static_cast<double>(total)) << "col " << j;
      }
    }
}

// >= 65536 rows, where a naive fp32 chain would lose digits; the bound grows
// with sqrt(rows) (see the top of this file). 100003 rows: more than 65535,
// a prime count, so the 256 partials are uneven.
TEST(CpuGw, LargeRows) {
  std::mt19937_64 rng(48);
  for (int32_t dt : {RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16})
    for (GwMode gw : {GwMode::kStore, GwMode::kStoreF32, GwMode::kAccumulateF32}) {
      Case c;
      c.rows = dt == RMSNORM_DTYPE_F16 ? 100003 : 65536;
      c.cols = 64;
      c.dtype = dt;
      c.gw = gw;
      c.weight = gw == GwMode::kStore ? WeightKind::kPlain : WeightKind::kOffset;
      c.threads = 0;  // all hardware threads
      run_case(c, rng);
    }
}

// Same-sign terms: gy * x_hat > 0 everywhere, so the partial sums grow
// linearly and the rounding of the long chain is at its largest.
TEST(CpuGw, LargeRowsSameSign) {
  std::mt19937_64 rng(49);
  Case c;
  c.rows = 70000;
  c.cols = 16;
  c.dtype = RMSNORM_DTYPE_F32;
  c.gw = GwMode::kStoreF32;
  c.threads = 0;
  Inputs in = make_inputs(c, rng);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t j = 0; j < c.cols; ++j) in.gy.set(r, j, in.x.get(r, j) > 0 ? 0.75 : -0.75);
  HostMatrix y;
  const std::vector<float> rstd = run_forward(c, in, y);
  const BackwardOut out = run_backward(c, in, rstd.data());
  expect_backward(c, in.x, in.gy, in.w, in.gw_init, out.gx, out.gw);
}

// ---- determinism -----------------------------------------------------------------------------

// Bitwise identical y, rstd, gx and gw for any thread count (and on repeats),
// on shapes that take each work split: many partials (70000 rows), fewer
// partials than threads (1000 rows -> 4 partials, columns split), a single
// partial with a long row, a plain row split (gw none), and enough
// partials x cols (3 x 22000) for the final partial sum to run on threads
// too (that one only at bf16 with gw store_f32, for time; an fp32 gw shows
// any change of summation order, a 16-bit one mostly rounds it away).
TEST(CpuThreads, BitwiseIdenticalForAnyThreadCount) {
  struct Shape {
    int64_t rows, cols;
  };
  std::mt19937_64 rng(50);
  for (Shape s : {Shape{70000, 16}, Shape{1000, 300}, Shape{5, 20000}, Shape{513, 777}, Shape{513, 22000}})
    for (int d = 0; d < 3; ++d)
      for (GwMode gw : {GwMode::kNone, GwMode::kStore, GwMode::kStoreF32, GwMode::kAccumulateF32}) {
        if (s.cols == 22000 && (kDtypes[d] != RMSNORM_DTYPE_BF16 || gw != GwMode::kStoreF32)) continue;
        if (gw == GwMode::kStoreF32 && s.cols != 22000) continue;
        Case c;
        c.rows = s.rows;
        c.cols = s.cols;
        c.dtype = kDtypes[d];
        c.gw = gw;
        c.strided = true;
        c.use_rstd = gw == GwMode::kStore;
        c.weight = WeightKind::kOffset;
        SCOPED_TRACE(describe(c));
        const Inputs in = make_inputs(c, rng);
        std::vector<unsigned char> y0, gx0, gw0;
        std::vector<float> rstd0;
        for (int threads : {1, 2, 3, 7, 7}) {
          c.threads = threads;
          HostMatrix y;
          const std::vector<float> rstd = run_forward(c, in, y);
          const BackwardOut out = run_backward(c, in, rstd.data());
          if (threads == 1) {
            y0 = y.storage;
            gx0 = out.gx.storage;
            gw0 = out.gw.storage;
            rstd0 = rstd;
            expect_backward(c, in.x, in.gy, in.w, in.gw_init, out.gx, out.gw);
            continue;
          }
          EXPECT_TRUE(y.storage == y0) << "y differs with " << threads << " threads";
          EXPECT_EQ(std::memcmp(rstd.data(), rstd0.data(), rstd.size() * sizeof(float)), 0)
              << "rstd differs with " << threads << " threads";
          EXPECT_TRUE(out.gx.storage == gx0) << "gx differs with " << threads << " threads";
          EXPECT_TRUE(out.gw.storage == gw0) << "gw differs with " << threads << " threads";
        }
      }
}

// rstd passed to backward is the one forward computed; recomputing must give
// bitwise the same gx and gw.
TEST(CpuThreads, RecomputedRstdMatchesForwardBitwise) {
  std::mt19937_64 rng(51);
  for (int d = 0; d < 3; ++d) {
    Case c;
    c.rows = 300;
    c.cols = 1031;
    c.dtype = kDtypes[d];
    c.gw = GwMode::kStoreF32;
    c.use_rstd = true;
    c.threads = 2;
    const Inputs in = make_inputs(c, rng);
    HostMatrix y;
    const std::vector<float> rstd = run_forward(c, in, y);
    const BackwardOut with = run_backward(c, in, rstd.data());
    c.use_rstd = false;
    const BackwardOut without = run_backward(c, in, nullptr);
    EXPECT_TRUE(with.gx.storage == without.gx.storage) << dtype_name(c.dtype);
    EXPECT_TRUE(with.gw.storage == without.gw.storage) << dtype_name(c.dtype);
  }
}

// ---- rows == 0 --------------------------------------------------------------------------------

TEST(CpuEmpty, ZeroRowsIsANoOp) {
  for (int32_t dt : kDtypes) {
    const int64_t cols = 17;
    HostMatrix x(dt, 0, cols), y(dt, 0, cols), w(dt, 1, cols);
    std::mt19937_64 rng(52);
    fill_random(w, rng);
    ForwardArgs fa;
    fa.cols = cols;
    fa.dtype = static_cast<DType>(dt);
    fa.x = x.data();
    fa.x_stride = cols;
    fa.weight = w.data();
    fa.y = y.data();
    fa.y_stride = cols;
    float rstd_guard = std::numeric_limits<float>::quiet_NaN();
    fa.rstd = &rstd_guard;
    EXPECT_EQ(cpu::forward(fa, 2), RMSNORM_STATUS_SUCCESS);
    EXPECT_TRUE(padding_untouched("y", y));
    EXPECT_TRUE(std::isnan(rstd_guard));

    for (GwMode gw : kGwModes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " gw=" + gw_name(gw));
      HostMatrix gx(dt, 0, cols);
      HostMatrix gwm(gw_is_f32(gw) ? RMSNORM_DTYPE_F32 : dt, 1, cols);
      fill_random(gwm, rng);
      const HostMatrix gw_before = gwm;
      EXPECT_EQ(cpu::backward_workspace_bytes(0, cols, gw), 0u);
      BackwardArgs ba;
      ba.cols = cols;
      ba.dtype = static_cast<DType>(dt);
      ba.x = x.data();
      ba.x_stride = cols;
      ba.weight = w.data();
      ba.gy = x.data();
      ba.gy_stride = cols;
      ba.gx = gx.data();
      ba.gx_stride = cols;
      ba.gw = gw == GwMode::kNone ? nullptr : gwm.data();
      ba.gw_mode = gw;
      EXPECT_EQ(cpu::backward(ba, 2), RMSNORM_STATUS_SUCCESS);
      EXPECT_TRUE(padding_untouched("gx", gx));
      if (gw == GwMode::kStore || gw == GwMode::kStoreF32) {
        for (int64_t j = 0; j < cols; ++j) {
          EXPECT_EQ(gwm.get(0, j), 0.0);  // an empty sum
          EXPECT_FALSE(std::signbit(gwm.get(0, j)));
        }
      } else {
        EXPECT_TRUE(gwm.storage == gw_before.storage);
      }
    }
  }
}

}  // namespace
}  // namespace rmsnorm::test
