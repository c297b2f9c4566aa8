// CPU backend, also the oracle the CUDA results are compared against.
//
// Maths (rmsnorm.h), all in fp32, per row of D = cols elements:
//   w'    = w, 1 + w (weight_offset) or 1 (no weight); materialised once per
//           call as a float vector, so the no-weight case multiplies by an
//           exact 1 and shares the code path
//   ss    = sum(x^2)                        r = 1 / sqrt(ss / D + eps)
//           (rows whose ss overflows, or underflows with a tiny eps, are
//           summed again scaled by a power of two: common/scaled_rms.hpp)
//   y     = Y((x * r) * w')                 or Y(T(x * r) * w') with round_xhat
//           (Y = y's dtype: T, or RMSNORM_FLAG_Y_DTYPE's; gy is read in Y)
//   s     = sum(x * (w' * gy))              c = (r * s) / D  (= mean(x_hat w' gy))
//           (x scaled by rms_dot_scale(r) where r is far from 1)
//   gx    = T(r * ((w' * gy) - (x * r) * c))
//   gw[j] = sum over rows of gy * (x * r)
//
// Every fp32 row sum (ss, s) uses sum8(): a row of up to kSumBlock (4096)
// terms goes term j to accumulator j % 8 in increasing j, the accumulators
// combined as ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)). Eight
// independent chains let the compiler vectorise without reassociating. A
// longer row is cut at a multiple of kSumBlock, the first part holding
// ceil(full blocks / 2) blocks, each part summed by the same rule and the two
// sums added: pairwise over blocks, so the rounding error grows with
// log2(D / 4096) rather than with D / 8 (one chain of 512K terms at D = 4M).
// Backward recomputes r with the same function as forward, so it is bitwise
// the rstd forward returns.
//
// Work split (static; no result depends on the number of threads):
//   forward, and backward without gw: contiguous row ranges per thread.
//   backward with gw: the rows are cut into P = gw_partials(rows) fixed
//     contiguous ranges [p*rows/P, (p+1)*rows/P); partial p is a float vector
//     of cols in the caller's workspace, summing its rows in order. Threads own
//     tiles (partial, column range); the column split only matters for speed,
//     since every element of a partial sees the same rows in the same order.
//     A final pass over column ranges adds partials 0..P-1 in order and writes
//     gw per GwMode. gx is written in the same tiles, each element after the
//     tile has read gy there, so gx == gy (in place) is safe.
//
// 16-bit rows are widened, and 16-bit outputs stored, a block of columns at a
// time through the bulk conversions of cpu/convert.hpp (F16C / AVX2 where the
// CPU has them), with the scalar conversions' bits.
//
// All heap scratch (w', widened 16-bit rows, per-row statistics) is allocated
// by the calling thread before anything is written, so running out of host
// memory returns an error with the outputs untouched and workers never throw;
// the conversion blocks are small arrays on the workers' stacks.
#include "cpu/cpu_backend.hpp"
#include "common/quant.hpp"
#include "cpu/convert.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/half.hpp"
#include "common/scaled_rms.hpp"
#include "common/parallel.hpp"
#include "error.hpp"

namespace rmsnorm::cpu {
namespace {

template <DType>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using T = float;
  static float load(float v) { return v; }
  static float store(float f) { return f; }
  static void load_n(const float* s, int64_t n, float* d) { std::copy(s, s + n, d); }
  static void store_n(const float* s, int64_t n, float* d) { std::copy(s, s + n, d); }
};
template <>
struct Elem<DType::kF16> {
  using T = uint16_t;
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float f) { return float_to_half(f); }
  static void load_n(const uint16_t* s, int64_t n, float* d) { f16_to_float_n(s, n, d); }
  static void store_n(const float* s, int64_t n, uint16_t* d) { float_to_f16_n(s, n, d); }
};
template <>
struct Elem<DType::kBF16> {
  using T = uint16_t;
  static float load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(float f) { return float_to_bf16(f); }
  static void load_n(const uint16_t* s, int64_t n, float* d) { bf16_to_float_n(s, n, d); }
  static void store_n(const float* s, int64_t n, uint16_t* d) { float_to_bf16_n(s, n, d); }
};

template <typename F>
void dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kF16: f(std::integral_constant<DType, DType::kF16>{}); return;
    case DType::kBF16: f(std::integral_constant<DType, DType::kBF16>{}); return;
    case DType::kF32: f(std::integral_constant<DType, DType::kF32>{}); return;
  }
}

// Per-thread float buffers of `len` each, `per_thread` of them, carved out of
// one allocation made by the caller.
class Scratch {
 public:
  Scratch(int threads, int per_thread, int64_t len)
      : per_thread_(per_thread), len_(len),
        buf_(static_cast<size_t>(threads) * static_cast<size_t>(per_thread) * static_cast<size_t>(len)) {}
  float* get(int thread, int which) {
    return buf_.data() + (static_cast<int64_t>(thread) * per_thread_ + which) * len_;
  }

 private:
  int64_t per_thread_, len_;
  std::vector<float> buf_;
};

// op folded over term(0..n) in sum8's order: 8 independent chains from +0,
// then combined pairwise.
template <typename Term, typename Op>
inline float fold8(int64_t n, Term term, Op op) {
  float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) a[k] = op(a[k], term(j + k));
  for (int k = 0; j + k < n; ++k) a[k] = op(a[k], term(j + k));
  return op(op(op(a[0], a[1]), op(a[2], a[3])), op(op(a[4], a[5]), op(a[6], a[7])));
}

inline constexpr int64_t kSumBlock = 4096;

// The sum of term(begin..end) by the rule at the top of this file.
template <typename Term>
float sum_blocks(int64_t begin, int64_t end, const Term& term) {
  const int64_t n = end - begin;
  if (n <= kSumBlock) {
    return fold8(n, [&term, begin](int64_t j) { return term(begin + j); }, [](float a, float b) { return a + b; });
  }
  const int64_t mid = begin + (n / kSumBlock + 1) / 2 * kSumBlock;
  return sum_blocks(begin, mid, term) + sum_blocks(mid, end, term);
}

template <typename Term>
inline float sum8(int64_t n, Term term) {
  return sum_blocks(0, n, term);
}

// cols <= plan::kMaxCols, so the int conversions below are exact.
inline float row_rstd(const float* x, int64_t cols, float eps) {
  const float ss = sum8(cols, [x](int64_t j) { return x[j] * x[j]; });
  if (!rms_needs_rescale(ss, eps)) return rms_from_sum(ss, static_cast<int>(cols), eps);
  const float s = rms_rescale_factor(ss);
  const float ss2 = sum8(cols, [x, s](int64_t j) {
    const float v = x[j] * s;
    return v * v;
  });
  return rms_from_scaled(ss2, s, static_cast<int>(cols), eps);
}

// One expression shared by both backward paths, so they agree bitwise.
inline float gx_of(float x, float wg, float r, float c) { return r * (wg - (x * r) * c); }

// 16-bit rows are widened into scratch (len n); fp32 rows are read in place.
template <DType dt>
const float* widen(const typename Elem<dt>::T* src, int64_t n, float* scratch) {
  if constexpr (dt == DType::kF32) {
    (void)n;
    (void)scratch;
    return src;
  } else {
    Elem<dt>::load_n(src, n, scratch);
    return scratch;
  }
}

// out[j] = d(value(j)) for j in [0, n). fp32 is stored in the loop; 16-bit
// rows go a block at a time through a float buffer on the stack and the bulk
// conversion (F16C / AVX2 where the CPU has them: the scalar f16 conversion
// does not vectorise, and the compiler's bf16 loop is SSE2 only). The bits are
// those of the scalar conversions either way.
inline constexpr int64_t kConvertBlock = 256;

template <DType d, typename Value>
void store_row(typename Elem<d>::T* out, int64_t n, Value value) {
  if constexpr (d == DType::kF32) {
    for (int64_t j = 0; j < n; ++j) out[j] = value(j);
  } else {
    float buf[kConvertBlock];
    for (int64_t j0 = 0; j0 < n; j0 += kConvertBlock) {
      const int64_t m = std::min(kConvertBlock, n - j0);
      for (int64_t k = 0; k < m; ++k) buf[k] = value(j0 + k);
      Elem<d>::store_n(buf, m, out + j0);
    }
  }
}

// buf[0, m) (m <= kConvertBlock) rounded to d and back: the value d stores.
template <DType d>
void round_block(float* buf, int64_t m) {
  if constexpr (d != DType::kF32) {
    typename Elem<d>::T t[kConvertBlock];
    Elem<d>::store_n(buf, m, t);
    Elem<d>::load_n(t, m, buf);
  }
}

// gx[j] = d(value(j)); with the residual stream's gradient gh (rmsnorm_add_backward):
// d(float(d(value(j))) + float(gh[j])), gx rounded, then added in fp32 and rounded
// once more (autograd's accumulation). A block of gh is read before that block of gx
// is written, so gx == gh is safe.
template <DType d, typename Value>
void store_gx(typename Elem<d>::T* gx, const typename Elem<d>::T* gh, int64_t n, Value value) {
  if (gh == nullptr) {
    store_row<d>(gx, n, value);
    return;
  }
  float buf[kConvertBlock], hb[kConvertBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kConvertBlock) {
    const int64_t m = std::min(kConvertBlock, n - j0);
    for (int64_t k = 0; k < m; ++k) buf[k] = value(j0 + k);
    round_block<d>(buf, m);
    const float* hf = widen<d>(gh + j0, m, hb);
    for (int64_t k = 0; k < m; ++k) buf[k] += hf[k];
    Elem<d>::store_n(buf, m, gx + j0);
  }
}

// Scratch row length a worker needs: none when fp32 rows are read in place.
constexpr int64_t widen_len(DType dt, int64_t cols) { return dt == DType::kF32 ? 0 : cols; }

std::vector<float> weight_prime(const void* weight, DType dt, int64_t cols, bool offset) {
  std::vector<float> wp(static_cast<size_t>(cols), 1.0f);
  if (weight == nullptr) return wp;
  dispatch_dtype(dt, [&](auto tag) {
    constexpr DType d = decltype(tag)::value;
    const auto* w = static_cast<const typename Elem<d>::T*>(weight);
    for (int64_t j = 0; j < cols; ++j) {
      const float v = Elem<d>::load(w[j]);
      wp[static_cast<size_t>(j)] = offset ? 1.0f + v : v;
    }
  });
  return wp;
}

// The residual add: h[j] = T(x[j] + residual[j]) written, and its value as
// stored widened into scratch, a block of columns at a time (16-bit through
// the bulk conversions). A block of x and of the residual is read before that
// block of h is written, so h == x and h == residual are safe.
// With residual_f32 (RMSNORM_FLAG_RESIDUAL_F32) residual and h are float: h = float(x) + residual.
template <DType dt>
const float* add_rows_into(const ForwardArgs& a, int64_t i, float* scratch) {
  using T = typename Elem<dt>::T;
  const T* x = static_cast<const T*>(a.x) + i * a.x_stride;
  float xb[kConvertBlock];
  for (int64_t j0 = 0; j0 < a.cols; j0 += kConvertBlock) {
    const int64_t m = std::min(kConvertBlock, a.cols - j0);
    const float* xf = widen<dt>(x + j0, m, xb);
    float* v = scratch + j0;
    if (a.residual_f32) {
      const float* res = static_cast<const float*>(a.residual) + i * a.residual_stride + j0;
      for (int64_t k = 0; k < m; ++k) v[k] = xf[k] + res[k];
      std::copy(v, v + m, static_cast<float*>(a.h) + i * a.h_stride + j0);
    } else {
      const float* rf = widen<dt>(static_cast<const T*>(a.residual) + i * a.residual_stride + j0, m, v);
      for (int64_t k = 0; k < m; ++k) v[k] = xf[k] + rf[k];
      T* h = static_cast<T*>(a.h) + i * a.h_stride + j0;
      Elem<dt>::store_n(v, m, h);
      if constexpr (dt != DType::kF32) Elem<dt>::load_n(h, m, v);  // h's value as stored
    }
  }
  return scratch;
}

// y in ydt (RMSNORM_FLAG_Y_DTYPE; x's dtype without it): one rounding, to ydt.
template <DType dt, DType ydt = dt>
void forward_rows(const ForwardArgs& a, const float* wp, float* scratch, int64_t i0, int64_t i1) {
  using T = typename Elem<dt>::T;
  using Y = typename Elem<ydt>::T;
  const int64_t cols = a.cols;
  for (int64_t i = i0; i < i1; ++i) {
    // The whole row is read (widened or summed) before y is written, and y[j]
    // is written only after x[j] was read, so y == x is safe.
    const float* x = a.residual != nullptr ? add_rows_into<dt>(a, i, scratch)
                                           : widen<dt>(static_cast<const T*>(a.x) + i * a.x_stride, cols, scratch);
    Y* y = static_cast<Y*>(a.y) + i * a.y_stride;
    const float r = row_rstd(x, cols, a.eps);
    if (a.rstd != nullptr) a.rstd[i] = r;
    // round_xhat rounds x_hat to the norm's input dtype: x's, or with an fp32 residual stream h's (float: no
    // rounding, so the plain formula).
    if (a.round_xhat && !a.residual_f32) {
      float xh[kConvertBlock];
      for (int64_t j0 = 0; j0 < cols; j0 += kConvertBlock) {
        const int64_t m = std::min(kConvertBlock, cols - j0);
        for (int64_t k = 0; k < m; ++k) xh[k] = x[j0 + k] * r;
        round_block<dt>(xh, m);  // x_hat rounded to x's dtype
        store_row<ydt>(y + j0, m, [&xh, w = wp + j0](int64_t k) { return xh[k] * w[k]; });
      }
    } else {
      store_row<ydt>(y, cols, [x, r, wp](int64_t j) { return (x[j] * r) * wp[j]; });
    }
  }
}

// Row statistics for backward: r and c = mean(x_hat * w' * gy).
struct RowStats {
  float r, c;
};

inline RowStats row_stats(const BackwardArgs& a, const float* x, const float* gy, const float* wp, int64_t i) {
  const float r = a.rstd != nullptr ? a.rstd[i] : row_rstd(x, a.cols, a.eps);
  const float t = rms_dot_scale(r);
  if (t == 1.0f) {
    const float s = sum8(a.cols, [=](int64_t j) { return x[j] * (wp[j] * gy[j]); });
    return {r, (r * s) / static_cast<float>(a.cols)};
  }
  const float s = sum8(a.cols, [=](int64_t j) { return (x[j] * t) * (wp[j] * gy[j]); });
  return {r, ((r / t) * s) / static_cast<float>(a.cols)};
}

// Backward rows [i0, i1) without gw; with stats != nullptr only the row
// statistics are computed (for the column-split gw path) and gx is not written.
// gy in gdt (the forward's y dtype), x and gx in dt.
template <DType dt, DType gdt>
void backward_rows(const BackwardArgs& a, const float* wp, RowStats* stats, float* xs, float* gs, int64_t i0,
                   int64_t i1) {
  using T = typename Elem<dt>::T;
  using G = typename Elem<gdt>::T;
  const int64_t cols = a.cols;
  for (int64_t i = i0; i < i1; ++i) {
    const float* x = widen<dt>(static_cast<const T*>(a.x) + i * a.x_stride, cols, xs);
    const float* gy = widen<gdt>(static_cast<const G*>(a.gy) + i * a.gy_stride, cols, gs);
    const RowStats st = row_stats(a, x, gy, wp, i);
    if (stats != nullptr) {
      stats[i] = st;
      continue;
    }
    T* gx = static_cast<T*>(a.gx) + i * a.gx_stride;
    const T* gh = a.g_h != nullptr ? static_cast<const T*>(a.g_h) + i * a.g_h_stride : nullptr;
    store_gx<dt>(gx, gh, cols, [x, gy, wp, st](int64_t j) { return gx_of(x[j], wp[j] * gy[j], st.r, st.c); });
  }
}

// max |y[j]| over [0, n), NaN ignored (fmaxf's rule, as a select: fmaxf is a
// library call here), in fold8's chains so that the loop is not one
// latency-bound chain; a maximum does not depend on the order.
inline float abs_max(const float* y, int64_t n) {
  return fold8(n, [y](int64_t j) { return std::fabs(y[j]); }, [](float m, float v) { return v > m ? v : m; });
}

// Partial p's first row, the fixed partition gw's summation order is defined on.
inline int64_t partial_begin(int64_t p, int64_t rows, int64_t parts) { return p * rows / parts; }

// One tile: rows of partial p, columns [c0, c1). stats holds every row's
// (r, c) when the columns are split; with a tile spanning the whole row
// (stats == nullptr) they are computed here, from the same row data.
template <DType dt, DType gdt>
void gw_tile(const BackwardArgs& a, const float* wp, const RowStats* stats, int64_t p, int64_t parts, int64_t c0,
             int64_t c1, float* xs, float* gs) {
  using T = typename Elem<dt>::T;
  using G = typename Elem<gdt>::T;
  const int64_t n = c1 - c0;
  float* acc = static_cast<float*>(a.workspace) + p * a.cols + c0;
  std::fill(acc, acc + n, 0.0f);
  const int64_t i0 = partial_begin(p, a.rows, parts), i1 = partial_begin(p + 1, a.rows, parts);
  for (int64_t i = i0; i < i1; ++i) {
    const float* x = widen<dt>(static_cast<const T*>(a.x) + i * a.x_stride + c0, n, xs);
    const float* gy = widen<gdt>(static_cast<const G*>(a.gy) + i * a.gy_stride + c0, n, gs);
    const RowStats st = stats != nullptr ? stats[i] : row_stats(a, x, gy, wp, i);
    T* gx = static_cast<T*>(a.gx) + i * a.gx_stride + c0;
    const T* gh = a.g_h != nullptr ? static_cast<const T*>(a.g_h) + i * a.g_h_stride + c0 : nullptr;
    const float* w = wp + c0;
    for (int64_t j = 0; j < n; ++j) acc[j] += gy[j] * (x[j] * st.r);
    store_gx<dt>(gx, gh, n, [x, gy, w, st](int64_t j) { return gx_of(x[j], w[j] * gy[j], st.r, st.c); });
  }
}

// gw in the weight's dtype wdt (the _F32 modes: float).
template <DType wdt>
void write_gw(const BackwardArgs& a, int64_t parts, int64_t c0, int64_t c1) {
  constexpr DType dt = wdt;
  using T = typename Elem<dt>::T;
  const float* ws = static_cast<const float*>(a.workspace);
  for (int64_t j = c0; j < c1; ++j) {
    float s = ws[j];
    for (int64_t p = 1; p < parts; ++p) s += ws[p * a.cols + j];
    switch (a.gw_mode) {
      case GwMode::kStore: static_cast<T*>(a.gw)[j] = Elem<dt>::store(s); break;
      case GwMode::kStoreF32: static_cast<float*>(a.gw)[j] = s; break;
      case GwMode::kAccumulate: {
        T* g = static_cast<T*>(a.gw) + j;
        *g = Elem<dt>::store(Elem<dt>::load(*g) + s);
        break;
      }
      case GwMode::kAccumulateF32: static_cast<float*>(a.gw)[j] += s; break;
      case GwMode::kNone: break;
    }
  }
}

template <DType dt, DType gdt>
void backward_gw(const BackwardArgs& a, const float* wp, int num_threads) {
  const int64_t rows = a.rows, cols = a.cols, elems = rows * cols;
  const int64_t parts = gw_partials(rows);

  // With fewer partials than threads, columns are split too; then each row's
  // (r, c) must be known before any tile of it runs, so they are computed
  // first. That needs parts < threads, i.e. rows < threads * kGwRowsPerPartial,
  // which keeps the statistics buffer small.
  const int max_threads = threads_for(num_threads, elems, elems);
  int64_t col_chunks = 1;
  if (parts < max_threads) col_chunks = std::min((max_threads + parts - 1) / parts, std::max<int64_t>(1, cols / 64));
  const int64_t tiles = parts * col_chunks;
  const int stat_threads = col_chunks > 1 ? threads_for(num_threads, rows, elems) : 1;
  const int tile_threads = threads_for(num_threads, tiles, elems);

  std::vector<RowStats> stats(col_chunks > 1 ? static_cast<size_t>(rows) : 0);
  Scratch scratch(std::max(stat_threads, tile_threads), 2, std::max(widen_len(dt, cols), widen_len(gdt, cols)));

  if (col_chunks > 1) {
    parallel_for(rows, stat_threads, [&](int t, int64_t i0, int64_t i1) {
      backward_rows<dt, gdt>(a, wp, stats.data(), scratch.get(t, 0), scratch.get(t, 1), i0, i1);
    });
  }
  parallel_for(tiles, tile_threads, [&](int t, int64_t t0, int64_t t1) {
    for (int64_t k = t0; k < t1; ++k) {
      const int64_t p = k / col_chunks, chunk = k % col_chunks;
      const int64_t c0 = chunk * cols / col_chunks, c1 = (chunk + 1) * cols / col_chunks;
      gw_tile<dt, gdt>(a, wp, stats.empty() ? nullptr : stats.data(), p, parts, c0, c1, scratch.get(t, 0),
                       scratch.get(t, 1));
    }
  });
  dispatch_dtype(weight_dtype_of(a), [&](auto wtag) {
    constexpr DType wdt = decltype(wtag)::value;
    parallel_for(cols, threads_for(num_threads, cols, parts * cols),
                 [&](int, int64_t c0, int64_t c1) { write_gw<wdt>(a, parts, c0, c1); });
  });
}

rmsnorm_status_t out_of_memory() {
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "cpu backend", "out of host memory for scratch buffers");
}

}  // namespace

int64_t gw_partials(int64_t rows) {
  if (rows <= 0) return 0;
  // rows / k rounded up, without rows + k - 1 (rows may be near INT64_MAX here: the workspace query takes any rows).
  return std::min(rows / kGwRowsPerPartial + (rows % kGwRowsPerPartial != 0), kMaxGwPartials);
}

size_t backward_workspace_bytes(int64_t rows, int64_t cols, GwMode mode) {
  if (mode == GwMode::kNone) return 0;
  return static_cast<size_t>(gw_partials(rows)) * static_cast<size_t>(cols) * sizeof(float);
}

rmsnorm_status_t forward(const ForwardArgs& a, int num_threads) {
  if (a.rows <= 0) return RMSNORM_STATUS_SUCCESS;
  try {
    const std::vector<float> wp = weight_prime(a.weight, weight_dtype_of(a), a.cols, a.weight_offset);
    const int threads = threads_for(num_threads, a.rows, a.rows * a.cols);
    // The residual add widens h into scratch at every dtype.
    Scratch scratch(threads, 1, a.residual != nullptr ? a.cols : widen_len(a.dtype, a.cols));
    dispatch_dtype(a.dtype, [&](auto tag) {
      constexpr DType dt = decltype(tag)::value;
      dispatch_dtype(y_dtype_of(a), [&](auto ytag) {
        constexpr DType ydt = decltype(ytag)::value;
        parallel_for(a.rows, threads, [&](int t, int64_t i0, int64_t i1) {
          forward_rows<dt, ydt>(a, wp.data(), scratch.get(t, 0), i0, i1);
        });
      });
    });
  } catch (const std::bad_alloc&) {
    return out_of_memory();
  }
  return RMSNORM_STATUS_SUCCESS;
}

rmsnorm_status_t forward_quant(const ForwardArgs& a, const QuantArgs& qa, int num_threads) {
  if (a.rows <= 0) return RMSNORM_STATUS_SUCCESS;
  try {
    const std::vector<float> wp = weight_prime(a.weight, weight_dtype_of(a), a.cols, a.weight_offset);
    const int threads = threads_for(num_threads, a.rows, a.rows * a.cols);
    // The widened row, y of the row as forward stores it, and (16-bit) y widened.
    Scratch scratch(threads, a.dtype == DType::kF32 ? 2 : 3, a.cols);
    const float inv_scale = qa.per_row ? 0.0f : 1.0f / *qa.scale;
    dispatch_dtype(a.dtype, [&](auto tag) {
      constexpr DType dt = decltype(tag)::value;
      using T = typename Elem<dt>::T;
      const size_t es = dtype_size(dt);
      parallel_for(a.rows, threads, [&](int t, int64_t i0, int64_t i1) {
        float* yf = scratch.get(t, 1);
        // y in T, one row at a time, by the forward itself.
        static_assert(sizeof(T) <= sizeof(float), "a row of T fits the float scratch");
        T* yt = reinterpret_cast<T*>(yf);
        for (int64_t i = i0; i < i1; ++i) {
          ForwardArgs b = a;
          b.rows = 1;
          b.x = static_cast<const char*>(a.x) + static_cast<size_t>(i * a.x_stride) * es;
          b.y = yt;
          b.y_stride = a.cols;
          b.rstd = a.rstd != nullptr ? a.rstd + i : nullptr;
          if (a.residual != nullptr) {  // rmsnorm_add_forward_quant: this row's h first
            b.residual = static_cast<const char*>(a.residual) + static_cast<size_t>(i * a.residual_stride) * es;
            b.h = static_cast<char*>(a.h) + static_cast<size_t>(i * a.h_stride) * es;
          }
          forward_rows<dt>(b, wp.data(), scratch.get(t, 0), 0, 1);
          const float* yw = widen<dt>(yt, a.cols, dt == DType::kF32 ? nullptr : scratch.get(t, 2));  // y as stored
          unsigned char* qr = static_cast<unsigned char*>(qa.q) + i * qa.q_stride;
          // Per row: one block of all the columns; block scales: each block of block_cols columns alone.
          const int64_t bc = qa.block_cols > 0 ? qa.block_cols : a.cols;
          for (int64_t b = 0, j0 = 0; j0 < a.cols; ++b, j0 += bc) {
            const int64_t j1 = std::min(a.cols, j0 + bc);
            float s = 0.0f, mul = inv_scale;
            if (qa.per_row) {
              s = quant::row_scale(abs_max(yw + j0, j1 - j0), qa.scale_ub, qa.fp8);
              if (qa.block_cols > 0)
                qa.row_scales[i * qa.scales_row_stride + b * qa.scales_block_stride] = s;
              else
                qa.row_scales[i] = s;
              mul = 1.0f / s;
            }
            // One loop per rule, each free of branches and calls.
            if (qa.fp8 && qa.per_row) {
              for (int64_t j = j0; j < j1; ++j) qr[j] = quant::fp8_e4m3_saturated(yw[j] / s);
            } else if (qa.fp8) {
              for (int64_t j = j0; j < j1; ++j) qr[j] = quant::fp8_e4m3_saturated(yw[j] * mul);
            } else {
              for (int64_t j = j0; j < j1; ++j) qr[j] = static_cast<unsigned char>(quant::int8_saturated(yw[j] * mul));
            }
          }
        }
      });
    });
  } catch (const std::bad_alloc&) {
    return out_of_memory();
  }
  return RMSNORM_STATUS_SUCCESS;
}

rmsnorm_status_t backward(const BackwardArgs& a, int num_threads) {
  if (a.rows <= 0) {
    // An empty sum: store modes write zeros, accumulate modes leave gw as is.
    if (a.gw_mode == GwMode::kStoreF32) {
      std::fill_n(static_cast<float*>(a.gw), a.cols, 0.0f);
    } else if (a.gw_mode == GwMode::kStore) {
      std::memset(a.gw, 0, static_cast<size_t>(a.cols) * dtype_size(weight_dtype_of(a)));  // +0: all-zero bits
    }
    return RMSNORM_STATUS_SUCCESS;
  }
  try {
    const std::vector<float> wp = weight_prime(a.weight, weight_dtype_of(a), a.cols, a.weight_offset);
    dispatch_dtype(a.dtype, [&](auto tag) {
      constexpr DType dt = decltype(tag)::value;
      dispatch_dtype(y_dtype_of(a), [&](auto gtag) {
        constexpr DType gdt = decltype(gtag)::value;
        if (a.gw_mode != GwMode::kNone) {
          backward_gw<dt, gdt>(a, wp.data(), num_threads);
          return;
        }
        const int threads = threads_for(num_threads, a.rows, a.rows * a.cols);
        Scratch scratch(threads, 2, std::max(widen_len(dt, a.cols), widen_len(gdt, a.cols)));
        parallel_for(a.rows, threads, [&](int t, int64_t i0, int64_t i1) {
          backward_rows<dt, gdt>(a, wp.data(), nullptr, scratch.get(t, 0), scratch.get(t, 1), i0, i1);
        });
      });
      // rmsnorm_add_backward_x: x's gradient, gx rounded to gy's dtype (a pass over gx once it is complete).
      if (a.gx_x != nullptr) {
        dispatch_dtype(y_dtype_of(a), [&](auto gtag) {
          constexpr DType gdt = decltype(gtag)::value;
          using T = typename Elem<dt>::T;
          using G = typename Elem<gdt>::T;
          const int threads = threads_for(num_threads, a.rows, a.rows * a.cols);
          Scratch scratch(threads, 1, widen_len(dt, a.cols));
          parallel_for(a.rows, threads, [&](int t, int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
              const float* g = widen<dt>(static_cast<const T*>(a.gx) + i * a.gx_stride, a.cols, scratch.get(t, 0));
              Elem<gdt>::store_n(g, a.cols, static_cast<G*>(a.gx_x) + i * a.gx_x_stride);
            }
          });
        });
      }
    });
  } catch (const std::bad_alloc&) {
    return out_of_memory();
  }
  return RMSNORM_STATUS_SUCCESS;
}

}  // namespace rmsnorm::cpu
