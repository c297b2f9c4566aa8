// GPU tests of the mixed-dtype forms of the CUDA backend (the looped kernels'
// forms at every D): y in another dtype than x's (RMSNORM_FLAG_Y_DTYPE) and
// the fp32 residual stream with 16-bit x (RMSNORM_FLAG_RESIDUAL_F32). Skipped,
// with a message, when no CUDA device is present (CI).
//
// Every case: fresh random inputs with rows of very different scales, outputs
// poisoned with NaN bytes (so is the padding between rows, checked untouched
// afterwards), shared memory poisoned before the launch, every element checked
// against the float64 reference, the worst one printed; y and h exactly by
// their rules (y from the rstd the call returned, h one fp32 add).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "rmsnorm/rmsnorm.h"
#include "rmsnorm/rmsnorm.hpp"
#include "harness/cuda.hpp"
#include "rmsnorm_reference.hpp"
#include "test_util.hpp"
#include "cuda_poison.cuh"
#include "plan.hpp"

namespace rmsnorm::test {
namespace {

#define CUDA_OK(call) ASSERT_EQ(cudaSuccess, (call)) << #call << ": " << cudaGetErrorString(cudaGetLastError())

class CudaMixed : public ::testing::Test {
 protected:
  void SetUp() override {
    if (rmsnorm_cuda_available() != 1) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
  }
};

using harness::DeviceBuffer;

// A host matrix's whole storage (row padding included) on the device, and back.
struct DeviceCopy {
  DeviceBuffer buf;
  int64_t offset_bytes = 0;
  explicit DeviceCopy(const HostMatrix& m) : buf(m.span_bytes()), offset_bytes(m.offset * int64_t(m.esize())) {
    RMSNORM_HARNESS_CUDA(cudaMemcpy(buf.get(), m.storage.data(), buf.bytes(), cudaMemcpyHostToDevice));
  }
  void* data() const { return buf.as<unsigned char>() + offset_bytes; }
  void download(HostMatrix* m) const {
    RMSNORM_HARNESS_CUDA(cudaMemcpy(m->storage.data(), buf.get(), buf.bytes(), cudaMemcpyDeviceToHost));
  }
};

struct MixedCase {
  int32_t x_dtype = RMSNORM_DTYPE_BF16;
  int32_t y_dtype = RMSNORM_DTYPE_BF16;  // gy's too
  bool residual_f32 = false;             // then y_dtype is x's and h, g_h, gx are fp32
  bool weight_f32 = false;
  bool weight_y = false;  // fp32 x: the weight in y's 16-bit dtype (RMSNORM_FLAG_WEIGHT_Y_DTYPE)
  bool weight = true;
  bool weight_offset = false;
  bool round_xhat = false;
  bool padded = false;  // base + 1 element, row stride cols + 3
  bool weight_misaligned = false;  // the weight at base + 1 element (its dtype's alignment only)
  bool h_in_place = false;         // residual_f32: h written over the residual (the stream updated in place)
  bool gx_x = false;               // residual_f32: rmsnorm_add_backward_x, x's gradient in x's dtype as well
  int64_t rows = 0, cols = 0;
  int32_t gw_mode = RMSNORM_GW_STORE;
};

std::string describe(const MixedCase& c) {
  return std::string(dtype_name(c.x_dtype)) + " x, " + dtype_name(c.y_dtype) + " y" +
         (c.residual_f32 ? ", fp32 residual stream" : "") + (c.weight_f32 ? ", fp32 weight" : "") + (c.weight_y ? ", weight in y's dtype" : "") +
         (c.weight ? "" : ", no weight") + (c.weight_offset ? ", offset" : "") + (c.round_xhat ? ", round_xhat" : "") +
         (c.padded ? ", base + 1, padded" : "") + (c.weight_misaligned ? ", weight at base + 1" : "") +
         (c.h_in_place ? ", h over the residual" : "") + (c.gx_x ? ", gx_x" : "") + ", " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
         ", gw mode " + std::to_string(c.gw_mode);
}

int64_t stride_of(const MixedCase& c) { return c.padded ? c.cols + 3 : c.cols; }
int64_t offset_of(const MixedCase& c) { return c.padded ? 1 : 0; }
HostMatrix matrix(const MixedCase& c, int32_t dt) { return HostMatrix(dt, c.rows, c.cols, stride_of(c), offset_of(c)); }
int32_t weight_dtype(const MixedCase& c) { return c.weight_f32 ? RMSNORM_DTYPE_F32 : c.weight_y ? c.y_dtype : c.x_dtype; }
// The dtype the norm reads (x's, or the fp32 residual stream's h).
int32_t norm_dtype(const MixedCase& c) { return c.residual_f32 ? RMSNORM_DTYPE_F32 : c.x_dtype; }

rmsnorm_problem_t problem_of(const MixedCase& c) {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = c.rows;
  p.cols = c.cols;
  p.dtype = c.x_dtype;
  p.flags = (c.weight_offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0u) | (c.round_xhat ? RMSNORM_FLAG_ROUND_XHAT : 0u) |
            (c.weight_f32 ? RMSNORM_FLAG_WEIGHT_F32 : 0u) | (c.residual_f32 ? RMSNORM_FLAG_RESIDUAL_F32 : 0u) |
            (c.weight_y ? RMSNORM_FLAG_WEIGHT_Y_DTYPE : 0u) |
            (c.y_dtype != c.x_dtype ? RMSNORM_FLAG_Y_DTYPE(c.y_dtype) : 0u);
  return p;
}

reference::Options ref_options(const MixedCase& c) {
  reference::Options o;
  o.eps = 1e-5;
  o.weight_offset = c.weight_offset;
  return o;
}

// w' of column k as the kernels compute it: fp32 w (+ 1 with the offset), or 1 without a weight.
float w_prime(const MixedCase& c, const HostMatrix& w, int64_t k) {
  return c.weight ? static_cast<float>(w.get(0, k)) + (c.weight_offset ? 1.0f : -0.0f) : 1.0f;  // w + -0 == w
}

void check_mixed(const MixedCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const int32_t nd = norm_dtype(c), wd = weight_dtype(c), gw_dt = c.gw_mode == RMSNORM_GW_STORE_F32 ? RMSNORM_DTYPE_F32 : wd;
  HostMatrix x = matrix(c, c.x_dtype), res = matrix(c, RMSNORM_DTYPE_F32),
             w(wd, 1, c.cols, c.cols, c.weight_misaligned ? 1 : 0), gy = matrix(c, c.y_dtype),
             gh = matrix(c, RMSNORM_DTYPE_F32);
  fill_random(x, rng, harness::hetero_row_scale);
  fill_random(res, rng, harness::hetero_row_scale);
  fill_random(w, rng);
  fill_random(gy, rng);
  fill_random(gh, rng);
  HostMatrix y = matrix(c, c.y_dtype), h = matrix(c, RMSNORM_DTYPE_F32), gx = matrix(c, nd), gw(gw_dt, 1, c.cols);
  std::vector<float> rstd(static_cast<size_t>(c.rows), NAN);
  DeviceCopy dx(x), dres(res), dw(w), dgy(gy), dgh(gh), dy(y), dh(h), dgx(gx), dgw(gw);
  DeviceBuffer rstd_buf(rstd.size() * 4 + 4);
  float* drstd = rstd_buf.as<float>();
  CUDA_OK(cudaMemset(drstd, 0xFF, rstd_buf.bytes()));
  const rmsnorm_problem_t p = problem_of(c);
  const rmsnorm_backend_t b = rmsnorm_backend_cuda(-1, nullptr);
  poison_shared_memory();
  const int64_t s = stride_of(c);
  const rmsnorm_status_t fst =
      c.residual_f32 ? rmsnorm_add_forward(&p, dx.data(), s, dres.data(), s, c.weight ? dw.data() : nullptr,
                                           c.h_in_place ? dres.data() : dh.data(), s, dy.data(), s, drstd, &b)
                     : rmsnorm_forward(&p, dx.data(), s, c.weight ? dw.data() : nullptr, dy.data(), s, drstd, &b);
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, fst) << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  dy.download(&y);
  if (c.h_in_place)
    dres.download(&h);  // h's storage is the residual's (padding included), so h is checked there
  else
    dh.download(&h);
  CUDA_OK(cudaMemcpy(rstd.data(), drstd, rstd.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(padding_untouched("y", y));

  // The norm's input: x, or h = float(x) + residual (one fp32 add, so exactly this).
  HostMatrix in = c.residual_f32 ? matrix(c, RMSNORM_DTYPE_F32) : x;
  if (c.residual_f32) {
    EXPECT_TRUE(padding_untouched("h", h));
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.cols; ++k) {
        const float want = static_cast<float>(x.get(r, k)) + static_cast<float>(res.get(r, k));
        ASSERT_EQ(static_cast<float>(h.get(r, k)), want) << "h at row " << r << " col " << k;
        in.set(r, k, want);
      }
  }
  const std::vector<double> ind = in.to_double(), wdd = w.to_double(), gyd = gy.to_double();
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<double> yr(n), rr(static_cast<size_t>(c.rows));
  reference::forward(c.rows, c.cols, ind.data(), c.weight ? wdd.data() : nullptr, ref_options(c), yr.data(), rr.data(),
                     nullptr);
  EXPECT_TRUE(check_vector("rstd", c.rows, [&](int64_t r) { return double(rstd[r]); }, rr,
                           [&](int64_t r) { return rstd_tol(rr[r], c.cols); }));
  EXPECT_TRUE(check_matrix("y", y, yr, [&](int64_t r, int64_t k) {
    const double xh = ind[r * c.cols + k] * rr[r];
    // With round_xhat, x_hat rounds to the norm's input dtype (not y's): half an ulp of it, times |w'|, on top.
    const double extra = c.round_xhat ? ulp(nd, xh) * std::fabs(w_prime(c, w, k)) : 0.0;
    return y_tol(c.y_dtype, yr[r * c.cols + k], c.cols) + extra;
  }));
  // Exactly: y = Y(x_hat w') with x_hat = in * rstd in fp32 (rounded to the norm's input dtype with round_xhat).
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k) {
      float xh = static_cast<float>(in.get(r, k)) * rstd[r];
      if (c.round_xhat) xh = static_cast<float>(round_to(nd, xh));
      const double want = round_to(c.y_dtype, static_cast<double>(xh * w_prime(c, w, k)));
      ASSERT_EQ(y.get(r, k), want) << "y at row " << r << " col " << k << " (from the rstd returned)";
    }
  if (::testing::Test::HasFailure()) return;

  // Backward, rstd given (the reference's, rounded to fp32), gw in the weight's dtype or fp32.
  std::vector<float> rstd_in(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) rstd_in[r] = static_cast<float>(rr[r]);
  CUDA_OK(cudaMemcpy(drstd, rstd_in.data(), rstd_in.size() * 4, cudaMemcpyHostToDevice));
  const int32_t mode = c.weight ? c.gw_mode : RMSNORM_GW_NONE;
  size_t ws_bytes = 0;
  ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, mode, &b, &ws_bytes)) << rmsnorm_last_error();
  DeviceBuffer ws_buf(ws_bytes);
  void* ws = ws_buf.get();
  if (ws_bytes > 0) CUDA_OK(cudaMemset(ws, 0xFF, ws_bytes));
  DeviceCopy din(in);
  poison_shared_memory();
  void* gw_ptr = mode == RMSNORM_GW_NONE ? nullptr : dgw.data();
  HostMatrix gxx = matrix(c, c.x_dtype);  // x's gradient with gx_x (NaN-poisoned)
  DeviceCopy dgxx(gxx);
  const rmsnorm_status_t bst =
      c.gx_x         ? rmsnorm_add_backward_x(&p, din.data(), s, c.weight ? dw.data() : nullptr, dgy.data(), s, drstd,
                                              dgh.data(), s, dgx.data(), s, dgxx.data(), s, gw_ptr, mode, ws, ws_bytes,
                                              &b)
      : c.residual_f32 ? rmsnorm_add_backward(&p, din.data(), s, c.weight ? dw.data() : nullptr, dgy.data(), s, drstd,
                                            dgh.data(), s, dgx.data(), s, gw_ptr, mode, ws, ws_bytes, &b)
                     : rmsnorm_backward(&p, dx.data(), s, c.weight ? dw.data() : nullptr, dgy.data(), s, drstd,
                                        dgx.data(), s, gw_ptr, mode, ws, ws_bytes, &b);
  EXPECT_EQ(RMSNORM_STATUS_SUCCESS, bst) << rmsnorm_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  if (bst != RMSNORM_STATUS_SUCCESS) return;
  dgx.download(&gx);
  dgw.download(&gw);
  EXPECT_TRUE(padding_untouched("gx", gx));
  if (c.gx_x) {
    // Each element gx rounded to x's dtype by the harness (round to nearest even), bit for bit.
    dgxx.download(&gxx);
    EXPECT_TRUE(padding_untouched("gx_x", gxx));
    HostMatrix want = matrix(c, c.x_dtype);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.cols; ++k) {
        want.set(r, k, gx.get(r, k));
        const auto* got_p = static_cast<const unsigned char*>(gxx.data()) + gxx.index(r, k) * 2;
        const auto* want_p = static_cast<const unsigned char*>(want.data()) + want.index(r, k) * 2;
        ASSERT_EQ(0, std::memcmp(got_p, want_p, 2))
            << "gx_x(" << r << ", " << k << ") = " << gxx.get(r, k) << ", gx " << gx.get(r, k) << " rounds to "
            << want.get(r, k);
      }
  }
  std::vector<double> gxr(n), gwr(static_cast<size_t>(c.cols)), gxs(n), gws(static_cast<size_t>(c.cols));
  reference::backward(c.rows, c.cols, ind.data(), c.weight ? wdd.data() : nullptr, gyd.data(), ref_options(c),
                      gxr.data(), gwr.data(), gxs.data(), gws.data());
  const std::vector<double> ghd = gh.to_double();
  if (c.residual_f32)  // gx = gx of the norm + g_h, one more fp32 rounding
    for (size_t i = 0; i < n; ++i) gxr[i] += ghd[i];
  EXPECT_TRUE(check_matrix("gx", gx, gxr, [&](int64_t r, int64_t k) {
    const size_t i = static_cast<size_t>(r * c.cols + k);
    return gx_tol(nd, gxr[i], gxs[i], c.cols) + (c.residual_f32 ? ulp(RMSNORM_DTYPE_F32, gxr[i]) : 0.0);
  }));
  if (mode == RMSNORM_GW_NONE) return;
  EXPECT_TRUE(check_vector("gw", c.cols, [&](int64_t k) { return gw.get(0, k); }, gwr,
                           [&](int64_t k) { return gw_tol(gw_dt, gwr[k], gws[k], c.rows, c.cols); }));
}

// Case i of a sweep: the options rotate with i (no weight every 5th, the offset every 3rd, x_hat rounding every
// 4th, an fp32 weight with 16-bit x every 3rd, gw in the weight's dtype or fp32 alternately).
MixedCase sweep_case(int32_t xd, int32_t yd, bool residual_f32, int64_t d, bool padded, int i) {
  MixedCase c;
  c.x_dtype = xd;
  c.y_dtype = yd;
  c.residual_f32 = residual_f32;
  c.cols = d;
  c.rows = d > 8192 ? 5 : 37;
  c.padded = padded;
  c.weight = i % 5 != 4;
  c.weight_offset = i % 3 == 1;
  c.round_xhat = i % 4 == 2;
  c.weight_f32 = xd != RMSNORM_DTYPE_F32 && i % 3 == 2;
  c.weight_y = xd == RMSNORM_DTYPE_F32 && yd != RMSNORM_DTYPE_F32 && i % 3 != 0;
  c.gw_mode = i % 2 == 0 ? RMSNORM_GW_STORE : RMSNORM_GW_STORE_F32;
  c.gx_x = residual_f32 && i % 4 < 2;  // with both gw modes
  return c;
}

// RMSNORM_FLAG_Y_DTYPE on CUDA: every pair of dtypes, D from one element to the looped band's sizes, aligned and
// misaligned, with and without a weight, the Gemma offset, x_hat rounding and an fp32 weight.
TEST_F(CudaMixed, YDtype) {
  std::mt19937_64 rng(101);
  const int32_t dts[] = {RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16};
  int i = 0;
  for (int32_t xd : dts)
    for (int32_t yd : dts) {
      if (xd == yd) continue;
      for (int64_t d : {1, 33, 1000, 2047, 2048, 4096, 40000, 40003})  // 40003: the looped kernel's partial last chunk
        for (bool padded : {false, true}) {
          check_mixed(sweep_case(xd, yd, false, d, padded, i++), rng);
          if (HasFatalFailure() || HasFailure()) return;
        }
    }
}

// RMSNORM_FLAG_RESIDUAL_F32 on CUDA: h = float(x) + residual exactly, y and rstd of h, gx = gx of the norm + g_h in
// fp32, gw in the weight's dtype (16-bit or fp32).
TEST_F(CudaMixed, ResidualF32) {
  std::mt19937_64 rng(102);
  int i = 0;
  for (int32_t xd : {RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16})
    for (int64_t d : {1, 33, 1000, 2047, 2048, 4096, 40000})
      for (bool padded : {false, true}) {
        check_mixed(sweep_case(xd, xd, true, d, padded, i++), rng);
        if (HasFatalFailure() || HasFailure()) return;
      }
}

// The fp32 residual stream updated in place (h == residual, the one overlap rmsnorm_add_forward allows with
// RMSNORM_FLAG_RESIDUAL_F32): the fused kernel reads each residual chunk before it writes that chunk of h, and reads
// h back for y. A read that missed the store would give y of the residual instead of h, which the exact check of y
// from the returned rstd catches.
TEST_F(CudaMixed, ResidualF32InPlace) {
  std::mt19937_64 rng(105);
  int i = 0;
  for (int32_t xd : {RMSNORM_DTYPE_F16, RMSNORM_DTYPE_BF16})
    for (int64_t d : {33, 2048, 4096, 40000})
      for (bool padded : {false, true}) {
        MixedCase c = sweep_case(xd, xd, true, d, padded, i++);
        c.h_in_place = true;
        check_mixed(c, rng);
        if (HasFatalFailure() || HasFailure()) return;
      }
}

// More rows than the backward's grid (2 CTAs per SM) for the forms of fp32 x in the looped row in shares (fp32 x
// with a 16-bit y, the fp32 residual stream): each CTA walks several rows, keeping its gw partial across them (in
// registers at D <= 4096, above in shared memory at 2..4 passes), with the row parity of its scratch alternating;
// D = 6001, a partial last chunk there. D = 6000, 12000 and 16384 with whole vectors (padded or not): fp32 x with a
// bf16 y at D = 6000 in kReadBackVec, at 8196, 12000, 12292 and 16384 in kReadBackWide (8196 and 12292: a last pass of
// one chunk, at 3 and 4 passes), and with an f16 y at 8196, 12000 and 16384; the backward's clusters
// (backward_f32_cluster_kernel, 2 and 4 chunks per thread) walk several rows each, their gw sums in registers and
// their exchange slots reused.
TEST_F(CudaMixed, Fp32FormsManyRowsPerCta) {
  std::mt19937_64 rng(106);
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int i = 0;
  for (bool residual : {false, true})
    for (int64_t d : {1000, 2048, 4096, 4100, 6000, 6001, 8196, 12000, 12292, 16384})
      for (bool padded : {false, true}) {
        MixedCase c = residual ? sweep_case(RMSNORM_DTYPE_BF16, RMSNORM_DTYPE_BF16, true, d, padded, i++)
                               : sweep_case(RMSNORM_DTYPE_F32, RMSNORM_DTYPE_BF16, false, d, padded, i++);
        c.rows = !residual && !padded && d > 8192 ? plan::kF32WideMinRowsPerSm * sms : 600;  // kReadBackWide's rows
        check_mixed(c, rng);
        if (HasFatalFailure() || HasFailure()) return;
      }
  // kReadBackWide with an f16 y at 3 and 4 passes, the weight in fp32 and in f16 (the instance with the most spilled
  // registers: 4 bytes at 3 passes, 20 at 4).
  for (int64_t d : {8196, 12000, 16384})
    for (bool weight_y : {false, true}) {
      MixedCase c = sweep_case(RMSNORM_DTYPE_F32, RMSNORM_DTYPE_F16, false, d, false, i++);
      c.weight = true;
      c.weight_y = weight_y;
      c.rows = plan::kF32WideMinRowsPerSm * sms;
      check_mixed(c, rng);
      if (HasFatalFailure() || HasFailure()) return;
    }
}

// Batch invariance across the plan's kernels for fp32 x (fp32 x with a bf16 y, and the fp32 residual stream): a row's
// y, h and rstd are the same bits from the forms of the forward (plan::f32_shares_forward): kHeld (a one-pass
// row whose every access is a whole vector, at most one wave of rows: `few`), kHeldLateW (the same past that wave:
// `many`) and kReadBack (a weight aligned to its dtype only), the last two on CTAs of 64, 128 and 256 threads at
// D = 1000, 2048 and 4096 (plan::f32_shares_cta); kCluster (D = 5000 .. 16384, whole vectors: `few`, and the
// residual stream's `many` at 3 or 4 chunks per thread, D = 12000 and 16384) against kReadBack (the residual
// stream's `many` at D = 5000 and 8192, and the weight misaligned), and for fp32 x with a bf16 y against
// kReadBackVec (`many` at D = 5000 and 8192), kReadBackWide (`many` at 12000 and 16384) and, with the weight
// misaligned, kReadBack or past D = 8192 the 1024-thread looped kernel;
// and its gx and gw the same from the backward with and without its element paths (the same weight aligned or not:
// past D = 4096 the cluster backward against the shares kernel's passes, one row per partial in both).
TEST_F(CudaMixed, Fp32FormsHeldAndGenericKernelsAgree) {
  std::mt19937_64 rng(107);
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t many = plan::kF32WideMinRowsPerSm * sms + 1, few = 5;  // kReadBackWide's rows
  const rmsnorm_backend_t b = rmsnorm_backend_cuda(-1, nullptr);
  for (int form : {0, 1, 2})  // fp32 x with a bf16 y and an fp32 weight, the same with a bf16 weight, the stream
    for (int64_t d : {1000, 2048, 4096, 5000, 8192, 12000, 16384}) {
      const bool residual = form == 2;
      SCOPED_TRACE(std::string(residual ? "fp32 residual stream" : form == 1 ? "fp32 x, bf16 y and weight" : "fp32 x, bf16 y") +
                   ", D " + std::to_string(d));
      MixedCase c;
      c.x_dtype = residual ? RMSNORM_DTYPE_BF16 : RMSNORM_DTYPE_F32;
      c.y_dtype = RMSNORM_DTYPE_BF16;
      c.residual_f32 = residual;
      c.weight_y = form == 1;
      c.rows = many;
      c.cols = d;
      const int32_t wd = weight_dtype(c), nd = norm_dtype(c);
      HostMatrix x = matrix(c, c.x_dtype), res = matrix(c, RMSNORM_DTYPE_F32), w(wd, 1, d, d, 0),
                 wm(wd, 1, d, d, 1), gy = matrix(c, RMSNORM_DTYPE_BF16);
      fill_random(x, rng, harness::hetero_row_scale);
      fill_random(res, rng, harness::hetero_row_scale);
      fill_random(w, rng);
      for (int64_t k = 0; k < d; ++k) wm.set(0, k, w.get(0, k));
      fill_random(gy, rng);
      HostMatrix gh = matrix(c, RMSNORM_DTYPE_F32);  // the residual stream's backward: the gradient along it
      fill_random(gh, rng);
      DeviceCopy dx(x), dres(res), dw(w), dwm(wm), dgy(gy), dgh(gh);
      rmsnorm_problem_t p = problem_of(c);
      // Forward of `rows` rows with the weight w_ptr: y, h (residual) and rstd on the host.
      struct Out {
        HostMatrix y, h;
        std::vector<float> rstd;
      };
      auto forward = [&](int64_t rows, const void* w_ptr) {
        MixedCase r = c;
        r.rows = rows;
        Out o{matrix(r, RMSNORM_DTYPE_BF16), matrix(r, RMSNORM_DTYPE_F32), std::vector<float>(size_t(rows), NAN)};
        DeviceCopy dy(o.y), dh(o.h);
        DeviceBuffer drs(size_t(rows) * 4);
        p.rows = rows;
        poison_shared_memory();
        const rmsnorm_status_t st =
            residual ? rmsnorm_add_forward(&p, dx.data(), d, dres.data(), d, w_ptr, dh.data(), d, dy.data(), d,
                                           drs.as<float>(), &b)
                     : rmsnorm_forward(&p, dx.data(), d, w_ptr, dy.data(), d, drs.as<float>(), &b);
        EXPECT_EQ(RMSNORM_STATUS_SUCCESS, st) << rmsnorm_last_error();
        EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
        dy.download(&o.y);
        dh.download(&o.h);
        EXPECT_EQ(cudaSuccess, cudaMemcpy(o.rstd.data(), drs.get(), size_t(rows) * 4, cudaMemcpyDeviceToHost));
        return o;
      };
      const Out all = forward(many, dw.data()), held = forward(few, dw.data()), generic = forward(few, dwm.data());
      ASSERT_FALSE(HasFailure());
      for (const Out* o : {&held, &generic})
        for (int64_t r = 0; r < few; ++r) {
          ASSERT_EQ(0, std::memcmp(&o->rstd[r], &all.rstd[r], 4)) << "rstd of row " << r;
          for (int64_t k = 0; k < d; ++k) {
            ASSERT_EQ(0, std::memcmp(static_cast<const char*>(o->y.data()) + o->y.index(r, k) * 2,
                                     static_cast<const char*>(all.y.data()) + all.y.index(r, k) * 2, 2))
                << "y at row " << r << " col " << k
                << (o == &held ? (d > 4096 ? " (kCluster, few rows)" : " (kHeld)") : " (weight misaligned: read back)")
                << (d > 4096 ? " against the same row among many (kReadBackVec, kReadBackWide, kReadBack or kCluster)"
                             : " against kHeldLateW");
            if (residual) ASSERT_EQ(o->h.get(r, k), all.h.get(r, k)) << "h at row " << r << " col " << k;
          }
        }
      // Backward of the first rows, rstd given (the forward's), with the weight aligned and at base + 1 element.
      HostMatrix in = residual ? all.h : x;
      DeviceCopy din(in), drstd_in(HostMatrix(RMSNORM_DTYPE_F32, 1, many, many, 0));
      ASSERT_EQ(cudaSuccess, cudaMemcpy(drstd_in.data(), all.rstd.data(), size_t(many) * 4, cudaMemcpyHostToDevice));
      auto backward = [&](const void* w_ptr, HostMatrix* gx, HostMatrix* gw) {
        p.rows = few;
        size_t ws_bytes = 0;
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE_F32, &b, &ws_bytes));
        DeviceBuffer ws(ws_bytes);
        DeviceCopy dgx(*gx), dgw(*gw);
        poison_shared_memory();
        const rmsnorm_status_t st =
            residual ? rmsnorm_add_backward(&p, din.data(), d, w_ptr, dgy.data(), d, static_cast<const float*>(drstd_in.data()),
                                            dgh.data(), d, dgx.data(), d, dgw.data(), RMSNORM_GW_STORE_F32, ws.get(),
                                            ws_bytes, &b)
                     : rmsnorm_backward(&p, din.data(), d, w_ptr, dgy.data(), d, static_cast<const float*>(drstd_in.data()), dgx.data(),
                                        d, dgw.data(), RMSNORM_GW_STORE_F32, ws.get(), ws_bytes, &b);
        ASSERT_EQ(RMSNORM_STATUS_SUCCESS, st) << rmsnorm_last_error();
        ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
        dgx.download(gx);
        dgw.download(gw);
      };
      MixedCase r = c;
      r.rows = few;
      HostMatrix gx_v = matrix(r, nd), gx_e = matrix(r, nd), gw_v(RMSNORM_DTYPE_F32, 1, d), gw_e(RMSNORM_DTYPE_F32, 1, d);
      backward(dw.data(), &gx_v, &gw_v);
      backward(dwm.data(), &gx_e, &gw_e);
      ASSERT_FALSE(HasFailure());
      EXPECT_EQ(0, std::memcmp(gx_v.data(), gx_e.data(), gx_v.data_bytes())) << "gx, weight aligned or not";
      EXPECT_EQ(0, std::memcmp(gw_v.data(), gw_e.data(), gw_v.data_bytes())) << "gw, weight aligned or not";
    }
}

// A weight aligned to its dtype only, with every other operand's rows 16-byte aligned: the 16-byte paths must not
// read it by vectors (every mixed form, forward and backward; the fp32 weight alone in the rows band too).
TEST_F(CudaMixed, MisalignedWeight) {
  std::mt19937_64 rng(104);
  for (int64_t d : {1000, 4096, 40000})
    for (int form = 0; form < 5; ++form) {
      MixedCase c;
      c.x_dtype = form == 1 || form == 4 ? RMSNORM_DTYPE_F32 : RMSNORM_DTYPE_BF16;
      c.y_dtype = form == 0 ? RMSNORM_DTYPE_F32 : form == 1 || form == 4 ? RMSNORM_DTYPE_BF16 : c.x_dtype;
      c.residual_f32 = form == 2;
      c.weight_f32 = form == 2 || form == 3;
      c.weight_y = form == 4;  // a bf16 weight at 2-byte alignment with fp32 x
      c.cols = d;
      c.rows = 5;
      c.weight_misaligned = true;
      c.gw_mode = RMSNORM_GW_STORE_F32;
      check_mixed(c, rng);
      if (HasFatalFailure() || HasFailure()) return;
    }
}

// On CUDA the mixed forms take the looped kernels, whose workspace differs from the plain backward's: the C++
// query, given the dtypes, asks for the flags' workspace (at 1 x 4096 the plain backward writes gw directly and
// needs none; the looped one needs a partial row).
TEST_F(CudaMixed, CppWorkspaceQueryNamesTheDtypes) {
  using B = rmsnorm::bfloat16;
  const rmsnorm::Backend be = rmsnorm::Backend::cuda();
  auto c_query = [&](int32_t dt, uint32_t flags, int64_t rows) {
    rmsnorm_problem_t p = rmsnorm_problem_default();
    p.rows = rows;
    p.cols = 4096;
    p.dtype = dt;
    p.flags = flags;
    size_t bytes = 0;
    EXPECT_EQ(RMSNORM_STATUS_SUCCESS, rmsnorm_backward_workspace_size(&p, RMSNORM_GW_STORE, &be.c(), &bytes))
        << rmsnorm_last_error();
    return bytes;
  };
  for (int64_t rows : {1, 5000}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const size_t plain = rmsnorm::backward_workspace_size_or_throw<B>(rows, 4096, rmsnorm::GwMode::kStore, be);
    EXPECT_EQ(plain, c_query(RMSNORM_DTYPE_BF16, 0, rows));
    EXPECT_EQ((rmsnorm::backward_workspace_size_or_throw<B, float>(rows, 4096, rmsnorm::GwMode::kStore, be)),
              c_query(RMSNORM_DTYPE_BF16, RMSNORM_FLAG_Y_DTYPE(RMSNORM_DTYPE_F32), rows));
    EXPECT_EQ((rmsnorm::backward_workspace_size_or_throw<B, B, float>(rows, 4096, rmsnorm::GwMode::kStore, be)),
              c_query(RMSNORM_DTYPE_BF16, RMSNORM_FLAG_WEIGHT_F32, rows));
    EXPECT_EQ((rmsnorm::backward_workspace_size_or_throw<B, B, B, float>(rows, 4096, rmsnorm::GwMode::kStore, be)),
              c_query(RMSNORM_DTYPE_BF16, RMSNORM_FLAG_RESIDUAL_F32, rows));
    if (rows == 1) {
      EXPECT_EQ(plain, 0u);
      EXPECT_GT((rmsnorm::backward_workspace_size_or_throw<B, float>(rows, 4096, rmsnorm::GwMode::kStore, be)), 0u);
    }
  }
}

// The mixed kernels under compute-sanitizer (scripts/gpu_check.sh runs '*Sanitizer*'): small cases of each form,
// aligned and misaligned, checked as above.
class CudaMixedSanitizer : public CudaMixed {};

// D = 1000 and 4096 with more rows than one wave of the held forward's CTAs: the forward's kHeldLateW
// (plan::f32_shares_forward) on 64 and 256 threads; 3 rows: kHeld, or kReadBack where a row is not whole vectors;
// D = 6000, 10000 and 14000: kCluster (2, 3 and 4 chunks per thread) where every access is a whole vector; D = 8192,
// 12000 and 16384 with more rows than two per SM: fp32 x with a bf16 y in kReadBackVec and, at 8 rows per SM,
// kReadBackWide (3 and 4 passes; plan::f32_y_dtype_forward), the residual stream in kReadBack and kCluster;
// where a row is not whole vectors (padded), the backward's shares kernel at 2..4 passes with its gw partial in
// shared memory (plan::f32_shares_gw_smem), over 3 CTAs or 2 per SM.
TEST_F(CudaMixedSanitizer, YDtypeAndResidualF32Kernels) {
  std::mt19937_64 rng(103);
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int64_t d : {33, 1000, 1999, 4096, 6000, 8192, 10000, 12000, 14000, 16384, 40000})
    for (bool padded : {false, true})
      for (int form = 0; form < 3; ++form) {
        MixedCase c;
        c.x_dtype = form == 1 ? RMSNORM_DTYPE_F32 : RMSNORM_DTYPE_BF16;
        c.y_dtype = form == 0 ? RMSNORM_DTYPE_F32 : RMSNORM_DTYPE_BF16;
        c.residual_f32 = form == 2;
        c.weight_f32 = form == 2 && padded;
        c.weight_y = form == 1 && d != 33;
        c.gx_x = form == 2 && d != 1000;
        c.cols = d;
        // kReadBackWide (fp32 x, bf16 y, whole vectors) from 8 rows per SM; the padded forms' backward there runs
        // the shares kernel at 3 and 4 passes, its gw partial in shared memory (plan::f32_shares_gw_smem).
        const bool wide = (d == 12000 || d == 16384) && form == 1 && !padded;
        c.rows = wide                                                         ? plan::kF32WideMinRowsPerSm * sms
                 : d == 1000 || d == 4096 || d == 8192 || d == 12000 || d == 16384 ? 2 * int64_t{sms} + 1
                                                                               : 3;
        c.padded = padded;
        c.gw_mode = padded ? RMSNORM_GW_STORE_F32 : RMSNORM_GW_STORE;
        check_mixed(c, rng);
        if (HasFatalFailure() || HasFailure()) return;
      }
}

}  // namespace
}  // namespace rmsnorm::test
