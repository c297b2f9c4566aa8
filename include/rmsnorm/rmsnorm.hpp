// rmsnorm: typed C++17 API over the C ABI in rmsnorm.h.
//
// Header-only; every call goes through the same C entry points, so the C
// contract (validation, in-place rules, determinism) holds unchanged. What
// this layer adds is types that make the common mistakes fail to compile or
// fail early:
//   - the element type is a template parameter, so dtype and pointer types
//     cannot disagree (half and bfloat16 are 2-byte storage structs that
//     __half, __nv_bfloat16 or torch data can be reinterpret_cast to);
//   - operands are views that carry their shape, and shapes that disagree
//     (y vs x, weight vs cols, rstd vs rows, gw vs cols) are reported as
//     Status::kInvalidShape naming the operand, before any memory is touched;
//   - the weight gradient is a GradWeight<T> whose element type follows its
//     mode (T for kStore/kAccumulate, float for the F32 modes);
//   - Status is [[nodiscard]]; check() turns a failure into an Error.
//
// Pointers are host pointers for Backend::cpu() and device pointers for
// Backend::cuda(), as in the C API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "rmsnorm/gw_mode.hpp"
#include "rmsnorm/rmsnorm.h"

namespace rmsnorm {

// ---- element types -------------------------------------------------------------------------

// Storage only: no arithmetic, so that nobody mistakes it for a numeric type.
// Layout-compatible with __half / __nv_bfloat16 / at::Half / at::BFloat16.
struct half {
  uint16_t bits;
};
struct bfloat16 {
  uint16_t bits;
};
static_assert(sizeof(half) == 2 && alignof(half) == 2 && std::is_standard_layout<half>::value &&
                  std::is_trivially_copyable<half>::value,
              "rmsnorm::half must be a 2-byte standard-layout type");
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2 && std::is_standard_layout<bfloat16>::value &&
                  std::is_trivially_copyable<bfloat16>::value,
              "rmsnorm::bfloat16 must be a 2-byte standard-layout type");

// dtype_of<T>::value; undefined for any other type, so an unsupported element
// type is a compile error rather than a runtime status.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<rmsnorm_dtype_t, RMSNORM_DTYPE_F32> {};
template <>
struct dtype_of<half> : std::integral_constant<rmsnorm_dtype_t, RMSNORM_DTYPE_F16> {};
template <>
struct dtype_of<bfloat16> : std::integral_constant<rmsnorm_dtype_t, RMSNORM_DTYPE_BF16> {};
template <class T>
struct dtype_of<const T> : dtype_of<T> {};
template <class T>
inline constexpr rmsnorm_dtype_t dtype_of_v = dtype_of<T>::value;

// ---- status and errors ----------------------------------------------------------------------

enum class [[nodiscard]] Status : int32_t {
  kSuccess = RMSNORM_STATUS_SUCCESS,
  kNullPointer = RMSNORM_STATUS_NULL_POINTER,
  kInvalidShape = RMSNORM_STATUS_INVALID_SHAPE,
  kInvalidStride = RMSNORM_STATUS_INVALID_STRIDE,
  kInvalidEps = RMSNORM_STATUS_INVALID_EPS,
  kInvalidDtype = RMSNORM_STATUS_INVALID_DTYPE,
  kInvalidOption = RMSNORM_STATUS_INVALID_OPTION,
  kMisaligned = RMSNORM_STATUS_MISALIGNED,
  kWorkspaceTooSmall = RMSNORM_STATUS_WORKSPACE_TOO_SMALL,
  kOverlap = RMSNORM_STATUS_OVERLAP,
  kWrongMemorySpace = RMSNORM_STATUS_WRONG_MEMORY_SPACE,
  kBackendUnavailable = RMSNORM_STATUS_BACKEND_UNAVAILABLE,
  kCudaError = RMSNORM_STATUS_CUDA_ERROR,
  kInternalError = RMSNORM_STATUS_INTERNAL_ERROR,
};

inline const char* to_string(Status s) noexcept { return rmsnorm_status_string(static_cast<rmsnorm_status_t>(s)); }

namespace detail {

// Failures found by this layer never reach the C library, so rmsnorm_last_error()
// knows nothing of them; they keep their message here. A fixed buffer keeps
// the noexcept functions free of allocation.
struct CppError {
  bool active = false;
  char message[256] = {};
};
inline CppError& cpp_error() noexcept {
  static thread_local CppError e;
  return e;
}
inline void clear_cpp_error() noexcept { cpp_error().active = false; }

// Records the message of a failure found in this layer and returns s. The
// caller formats into the buffer, with a literal format (-Wformat=2 clean).
inline Status fail(Status s) noexcept {
  cpp_error().active = true;
  return s;
}
inline char* message_buffer() noexcept { return cpp_error().message; }
constexpr size_t kMessageBytes = sizeof(CppError::message);

}  // namespace detail

// Message of the last failing call made through this header on this thread,
// whether the C++ layer or the C library rejected it; "" after one that
// succeeded. A C function called directly in between (rmsnorm_forward, ...)
// does not reset a message of this layer: its own message is
// rmsnorm_last_error()'s.
inline const char* last_error() noexcept {
  const detail::CppError& e = detail::cpp_error();
  return e.active ? e.message : rmsnorm_last_error();
}

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message)
      : std::runtime_error(std::string(to_string(status)) + ": " + message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

// Throws Error(s, last_error()) unless s is kSuccess: for the status of a call
// made through this header (last_error() above says why).
inline void check(Status s) {
  if (s != Status::kSuccess) throw Error(s, last_error());
}

// ---- views ------------------------------------------------------------------------------------

// rows x cols elements, row-major, row_stride elements between row starts.
template <class T>
struct MatrixView {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;

  // MatrixView<T> -> MatrixView<const T>, and nothing else: U is deduced
  // from the target type, so the is_same test rejects MatrixView<const Other>.
  template <class U = T, std::enable_if_t<std::is_same<U, T>::value && !std::is_const<U>::value, int> = 0>
  operator MatrixView<const U>() const noexcept {
    return {data, rows, cols, row_stride};
  }
};

inline constexpr int64_t kContiguous = -1;

// row_stride == kContiguous means row_stride = cols. Any other value is kept
// as given (a stride < cols is then rejected by the library, never "fixed").
template <class T>
MatrixView<T> make_matrix(T* data, int64_t rows, int64_t cols, int64_t row_stride = kContiguous) noexcept {
  return {data, rows, cols, row_stride == kContiguous ? cols : row_stride};
}

// size elements. An empty view (data == nullptr, size == 0) means "none"
// where an operand is optional (weight, rstd).
template <class T>
struct VectorView {
  T* data = nullptr;
  int64_t size = 0;

  template <class U = T, std::enable_if_t<std::is_same<U, T>::value && !std::is_const<U>::value, int> = 0>
  operator VectorView<const U>() const noexcept {
    return {data, size};
  }
};

template <class T>
VectorView<T> make_vector(T* data, int64_t size) noexcept {
  return {data, size};
}

// ---- options, backend, gw ------------------------------------------------------------------

struct Options {
  float eps = 1e-5f;
  bool weight_offset = false;  // w' = 1 + w (Gemma)
  bool round_xhat = false;     // forward: y = T(T(x_hat) * w') (HF Llama / MLX)
  bool pdl = true;             // CUDA: programmatic dependent launch (RMSNORM_FLAG_NO_PDL when false)
  bool trusted_memory = false;  // skip the memory-space check (RMSNORM_FLAG_TRUSTED_MEMORY, rmsnorm.h)
};

class Backend {
 public:
  // threads == 0: all hardware threads.
  static Backend cpu(int threads = 0) noexcept { return Backend(rmsnorm_backend_cpu(threads)); }
  // stream is a cudaStream_t (nullptr: the legacy default stream); device -1:
  // the current device.
  static Backend cuda(void* stream = nullptr, int device = -1) noexcept {
    return Backend(rmsnorm_backend_cuda(device, stream));
  }
  static Backend from_c(const rmsnorm_backend_t& b) noexcept { return Backend(b); }

  const rmsnorm_backend_t& c() const noexcept { return b_; }
  bool is_cuda() const noexcept { return b_.kind == RMSNORM_BACKEND_CUDA; }

 private:
  explicit Backend(const rmsnorm_backend_t& b) noexcept : b_(b) {}
  rmsnorm_backend_t b_;
};

// GwMode (rmsnorm/gw_mode.hpp): same values as rmsnorm_gw_mode_t.

// Where backward puts the weight gradient. Built only through the named
// constructors, so the buffer's element type always matches the mode.
// A default-constructed GradWeight is none().
template <class T>
class GradWeight {
 public:
  GradWeight() noexcept = default;
  static GradWeight none() noexcept { return {}; }
  static GradWeight store(VectorView<T> gw) noexcept { return {GwMode::kStore, gw.data, gw.size}; }
  static GradWeight accumulate(VectorView<T> gw) noexcept { return {GwMode::kAccumulate, gw.data, gw.size}; }
  static GradWeight store_f32(VectorView<float> gw) noexcept { return {GwMode::kStoreF32, gw.data, gw.size}; }
  static GradWeight accumulate_f32(VectorView<float> gw) noexcept {
    return {GwMode::kAccumulateF32, gw.data, gw.size};
  }

  GwMode mode() const noexcept { return mode_; }
  void* data() const noexcept { return data_; }
  int64_t size() const noexcept { return size_; }

 private:
  GradWeight(GwMode m, void* d, int64_t n) noexcept : mode_(m), data_(d), size_(n) {}
  GwMode mode_ = GwMode::kNone;
  void* data_ = nullptr;
  int64_t size_ = 0;
};

// Caller-owned scratch for backward, at least backward_workspace_size() bytes,
// 16-byte aligned (device memory on the CUDA backend).
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// ---- entry points ----------------------------------------------------------------------------

namespace detail {

// Keeps an argument out of template deduction, so that T comes from the
// output operand alone and MatrixView<T> converts to MatrixView<const T>.
template <class T>
struct identity {
  using type = T;
};
template <class T>
using nondeduced = typename identity<T>::type;

template <class T>
rmsnorm_problem_t make_problem(int64_t rows, int64_t cols, const Options& opt) noexcept {
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype_of_v<T>;
  p.flags = (opt.weight_offset ? RMSNORM_FLAG_WEIGHT_OFFSET : 0u) | (opt.round_xhat ? RMSNORM_FLAG_ROUND_XHAT : 0u) |
            (opt.pdl ? 0u : RMSNORM_FLAG_NO_PDL) | (opt.trusted_memory ? RMSNORM_FLAG_TRUSTED_MEMORY : 0u);
  p.eps = opt.eps;
  return p;
}

template <class A, class B>
Status check_same_shape(const char* name, const MatrixView<A>& m, const MatrixView<B>& x) noexcept {
  if (m.rows == x.rows && m.cols == x.cols) return Status::kSuccess;
  std::snprintf(message_buffer(), kMessageBytes, "%s: shape %lldx%lld does not match x (%lldx%lld)", name,
                static_cast<long long>(m.rows), static_cast<long long>(m.cols), static_cast<long long>(x.rows),
                static_cast<long long>(x.cols));
  return fail(Status::kInvalidShape);
}

inline Status check_size(const char* name, int64_t size, const char* what, int64_t n) noexcept {
  if (size == n) return Status::kSuccess;
  std::snprintf(message_buffer(), kMessageBytes, "%s: size %lld does not match %s (%lld)", name,
                static_cast<long long>(size), what, static_cast<long long>(n));
  return fail(Status::kInvalidShape);
}

// Optional vector operand: empty means absent; otherwise size must be n.
// data == nullptr with a size is refused rather than read as "absent": it is
// far more likely an unallocated buffer than a request for no weight.
template <class V>
Status check_optional(const char* name, const V& v, int64_t n, const char* what) noexcept {
  if (v.data == nullptr && v.size != 0) {
    std::snprintf(message_buffer(), kMessageBytes, "%s: null data with size %lld (pass an empty view for none)",
                  name, static_cast<long long>(v.size));
    return fail(Status::kNullPointer);
  }
  return v.data == nullptr ? Status::kSuccess : check_size(name, v.size, what, n);
}

// The view checks of forward (y, weight, rstd against x; y_name: the output's name, q for the quantized forms) and
// backward (gy, gx, weight, rstd, gw), shared by every form of them; they clear the C++ error first.
template <class X, class Y, class W>
Status check_forward_views(const MatrixView<X>& x, const W& weight, const MatrixView<Y>& y,
                           const VectorView<float>& rstd, const char* y_name = "y") noexcept {
  clear_cpp_error();
  Status s = check_same_shape(y_name, y, x);
  if (s == Status::kSuccess) s = check_optional("weight", weight, x.cols, "cols");
  if (s == Status::kSuccess) s = check_optional("rstd", rstd, x.rows, "rows");
  return s;
}

template <class X, class G, class W, class GX, class GW>
Status check_backward_views(const MatrixView<X>& x, const W& weight, const MatrixView<G>& gy,
                            const VectorView<const float>& rstd, const MatrixView<GX>& gx, const GW& gw) noexcept {
  clear_cpp_error();
  Status s = check_same_shape("gy", gy, x);
  if (s == Status::kSuccess) s = check_same_shape("gx", gx, x);
  if (s == Status::kSuccess) s = check_optional("weight", weight, x.cols, "cols");
  if (s == Status::kSuccess) s = check_optional("rstd", rstd, x.rows, "rows");
  // A null gw is left to the library, which names it as a null pointer.
  if (s == Status::kSuccess && gw.mode() != GwMode::kNone && gw.data() != nullptr)
    s = check_size("gw", gw.size(), "cols", x.cols);
  return s;
}

// The weight's element type W of a form whose operands are T: T itself, or float with 16-bit T (mixed precision,
// RMSNORM_FLAG_WEIGHT_F32, which weight_flags<T, W>() sets).
template <class T, class W>
inline constexpr bool weight_of_v =
    std::is_same<W, T>::value || (std::is_same<W, float>::value && !std::is_same<T, float>::value);
template <class T, class W>
constexpr uint32_t weight_flags() noexcept {
  return std::is_same<W, T>::value ? 0u : RMSNORM_FLAG_WEIGHT_F32;
}

}  // namespace detail

// y = rms_norm(x) * w'. weight and rstd may be empty views. T is taken from y.
template <class T>
Status forward(detail::nondeduced<MatrixView<const T>> x, detail::nondeduced<VectorView<const T>> weight,
               MatrixView<T> y, VectorView<float> rstd, const Options& opt, const Backend& backend) noexcept {
  static_assert(!std::is_const<T>::value, "y must be writable");
  const Status s = detail::check_forward_views(x, weight, y, rstd);
  if (s != Status::kSuccess) return s;
  const rmsnorm_problem_t p = detail::make_problem<T>(x.rows, x.cols, opt);
  return static_cast<Status>(rmsnorm_forward(&p, x.data, x.row_stride, weight.data, y.data, y.row_stride, rstd.data,
                                             &backend.c()));
}

// h = T(x + residual), y = rms_norm(h) * w' (rmsnorm_add_forward). h may be
// residual or x itself (in place). weight and rstd may be empty views. T is
// taken from y, the residual stream's R (residual, h) from h: R = float with
// 16-bit T is the fp32 residual stream (RMSNORM_FLAG_RESIDUAL_F32: h =
// float(x) + residual; then h may be residual, not x). W, named after R, is the
// weight's type: T, or float with 16-bit T (RMSNORM_FLAG_WEIGHT_F32, as
// forward_mixed): add_forward<T, R, float>.
template <class T, class R, class W = T>
Status add_forward(detail::nondeduced<MatrixView<const T>> x, detail::nondeduced<MatrixView<const R>> residual,
                   detail::nondeduced<VectorView<const W>> weight, MatrixView<R> h, MatrixView<T> y,
                   VectorView<float> rstd, const Options& opt, const Backend& backend) noexcept {
  static_assert(!std::is_const<T>::value, "y must be writable");
  static_assert(std::is_same<R, T>::value || std::is_same<R, float>::value, "the residual stream is T or float");
  static_assert(detail::weight_of_v<T, W>, "the weight is T, or float with 16-bit T");
  detail::clear_cpp_error();
  Status s = detail::check_same_shape("y", y, x);
  if (s == Status::kSuccess) s = detail::check_same_shape("residual", residual, x);
  if (s == Status::kSuccess) s = detail::check_same_shape("h", h, x);
  if (s == Status::kSuccess) s = detail::check_optional("weight", weight, x.cols, "cols");
  if (s == Status::kSuccess) s = detail::check_optional("rstd", rstd, x.rows, "rows");
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<T>(x.rows, x.cols, opt);
  p.flags |= detail::weight_flags<T, W>();
  if (!std::is_same<R, T>::value) p.flags |= RMSNORM_FLAG_RESIDUAL_F32;
  return static_cast<Status>(rmsnorm_add_forward(&p, x.data, x.row_stride, residual.data, residual.row_stride,
                                                 weight.data, h.data, h.row_stride, y.data, y.row_stride, rstd.data,
                                                 &backend.c()));
}

// ---- quantized outputs (rmsnorm_forward_quant, rmsnorm_forward_block_quant) -------------------

enum class QuantKind : int32_t { kFp8E4m3 = RMSNORM_QUANT_FP8_E4M3, kInt8 = RMSNORM_QUANT_INT8 };

// How q is scaled (the rules: rmsnorm.h, docs/fusions.md). Built only through
// the named constructors. Every pointer is memory of the backend (device
// memory on CUDA); scale_ub (fp8 only) may be null.
//   fixed(scale)                     one static scale (one float)
//   per_row(row_scales, scale_ub)    one scale per row, written
//   per_block(block_cols, scales)    one scale per block of 64 or 128 columns: scales is rows x blocks, row-major
//                                    with its row stride (blocks = ceil(cols / block_cols)), written
//   per_block_transposed(block_cols, scales_t)
//                                    the same scales stored column-major: scales_t is blocks x rows with its row
//                                    stride (>= rows), the layout fp8 GEMMs with MN-major block scales read
class QuantScales {
 public:
  static QuantScales fixed(const float* scale) noexcept {
    QuantScales q;
    q.mode_ = Mode::kFixed;
    q.scale_ = scale;
    return q;
  }
  static QuantScales per_row(VectorView<float> row_scales, const float* scale_ub = nullptr) noexcept {
    QuantScales q;
    q.mode_ = Mode::kPerRow;
    q.scales_ = row_scales.data;
    q.rows_ = row_scales.size;
    q.scale_ub_ = scale_ub;
    return q;
  }
  static QuantScales per_block(int block_cols, MatrixView<float> scales, const float* scale_ub = nullptr) noexcept {
    QuantScales q;
    q.mode_ = Mode::kPerBlock;
    q.block_cols_ = block_cols;
    q.scales_ = scales.data;
    q.rows_ = scales.rows;
    q.blocks_ = scales.cols;
    q.row_stride_ = scales.row_stride;
    q.block_stride_ = 1;
    q.scale_ub_ = scale_ub;
    return q;
  }
  static QuantScales per_block_transposed(int block_cols, MatrixView<float> scales_t,
                                          const float* scale_ub = nullptr) noexcept {
    QuantScales q;
    q.mode_ = Mode::kPerBlock;
    q.block_cols_ = block_cols;
    q.scales_ = scales_t.data;
    q.rows_ = scales_t.cols;
    q.blocks_ = scales_t.rows;
    q.row_stride_ = 1;
    q.block_stride_ = scales_t.row_stride;
    q.scale_ub_ = scale_ub;
    return q;
  }

  enum class Mode { kFixed, kPerRow, kPerBlock };
  Mode mode() const noexcept { return mode_; }
  int block_cols() const noexcept { return block_cols_; }
  const float* scale() const noexcept { return scale_; }
  float* scales() const noexcept { return scales_; }
  const float* scale_ub() const noexcept { return scale_ub_; }
  int64_t rows() const noexcept { return rows_; }
  int64_t blocks() const noexcept { return blocks_; }
  int64_t row_stride() const noexcept { return row_stride_; }
  int64_t block_stride() const noexcept { return block_stride_; }

 private:
  QuantScales() noexcept = default;
  Mode mode_ = Mode::kFixed;
  int block_cols_ = 0;
  const float* scale_ = nullptr;
  float* scales_ = nullptr;
  const float* scale_ub_ = nullptr;
  int64_t rows_ = 0, blocks_ = 0, row_stride_ = 0, block_stride_ = 0;
};

namespace detail {

// The scales' shape against x's (per row: rows; per block: rows x ceil(cols / block_cols)). Null scales, a block
// size other than 64 or 128, and x's shape itself are the library's to refuse, naming them: where any of them is
// wrong the block count is not checked here.
template <class X>
Status check_quant_scales(const QuantScales& sc, const MatrixView<X>& x) noexcept {
  if (sc.scales() == nullptr) return Status::kSuccess;
  if (sc.mode() == QuantScales::Mode::kPerRow) return check_size("row_scales", sc.rows(), "rows", x.rows);
  const int64_t bc = sc.block_cols();
  if (sc.mode() != QuantScales::Mode::kPerBlock || (bc != 64 && bc != 128) || x.cols <= 0) return Status::kSuccess;
  Status s = check_size("scales (rows)", sc.rows(), "rows", x.rows);
  if (s == Status::kSuccess)
    s = check_size("scales (blocks)", sc.blocks(), "ceil(cols / block_cols)", x.cols / bc + (x.cols % bc != 0));
  return s;
}

// One call of the C ABI for q's scale rule: the add form (rmsnorm_add_forward_quant / _block_quant, which refuse a
// null residual or h) or the plain one, by the C++ function called, never by which pointers are null.
inline Status quant_call(bool add, const rmsnorm_problem_t& p, const void* x, int64_t x_stride, const void* residual,
                         int64_t residual_stride, const void* weight, void* h, int64_t h_stride, QuantKind kind,
                         const QuantScales& sc, MatrixView<uint8_t> q, float* rstd, const Backend& backend) noexcept {
  if (sc.mode() == QuantScales::Mode::kPerBlock) {
    const rmsnorm_block_quant_t bq{static_cast<int32_t>(kind), sc.block_cols(), sc.scales(), sc.row_stride(),
                                   sc.block_stride(), sc.scale_ub()};
    return static_cast<Status>(
        add ? rmsnorm_add_forward_block_quant(&p, x, x_stride, residual, residual_stride, weight, h, h_stride, &bq,
                                              q.data, q.row_stride, rstd, &backend.c())
            : rmsnorm_forward_block_quant(&p, x, x_stride, weight, &bq, q.data, q.row_stride, rstd, &backend.c()));
  }
  const bool per_row = sc.mode() == QuantScales::Mode::kPerRow;
  const rmsnorm_quant_t qt{static_cast<int32_t>(kind), per_row ? RMSNORM_QUANT_PER_ROW : RMSNORM_QUANT_STATIC,
                           sc.scale(), per_row ? sc.scales() : nullptr, sc.scale_ub()};
  return static_cast<Status>(add ? rmsnorm_add_forward_quant(&p, x, x_stride, residual, residual_stride, weight, h,
                                                             h_stride, &qt, q.data, q.row_stride, rstd, &backend.c())
                                 : rmsnorm_forward_quant(&p, x, x_stride, weight, &qt, q.data, q.row_stride, rstd,
                                                         &backend.c()));
}

}  // namespace detail

// q = quant(y), y exactly forward's (rmsnorm_forward_quant / rmsnorm_forward_block_quant by the scale rule): q is
// a rows x cols matrix of codes, fp8 e4m3fn or int8 by kind. weight and rstd may be empty views.
// The element type is x's (X, or const X); W, the weight's, is it or, with 16-bit x, float (RMSNORM_FLAG_WEIGHT_F32:
// forward_quant<const bfloat16, float>); no other W compiles, so x's memory is never read as another type.
template <class X, class W = std::remove_const_t<X>,
          std::enable_if_t<detail::weight_of_v<std::remove_const_t<X>, W>, int> = 0>
Status forward_quant(MatrixView<X> x, detail::nondeduced<VectorView<const W>> weight, QuantKind kind,
                     const QuantScales& scales, MatrixView<uint8_t> q, VectorView<float> rstd, const Options& opt,
                     const Backend& backend) noexcept {
  Status s = detail::check_forward_views(x, weight, q, rstd, "q");
  if (s == Status::kSuccess) s = detail::check_quant_scales(scales, x);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<std::remove_const_t<X>>(x.rows, x.cols, opt);
  p.flags |= detail::weight_flags<std::remove_const_t<X>, W>();
  return detail::quant_call(false, p, x.data, x.row_stride, nullptr, 0, weight.data, nullptr, 0, kind, scales, q,
                            rstd.data, backend);
}

// h = T(x + residual) (rmsnorm_add_forward_quant / rmsnorm_add_forward_block_quant: h may be x or residual itself),
// then q and the scales as forward_quant of h. T is x's element type, W the weight's as in forward_quant; residual
// and h are required (a view with null data is refused by the library, as in the C ABI).
template <class X, class W = std::remove_const_t<X>,
          std::enable_if_t<detail::weight_of_v<std::remove_const_t<X>, W>, int> = 0>
Status add_forward_quant(MatrixView<X> x, detail::nondeduced<MatrixView<const std::remove_const_t<X>>> residual,
                         detail::nondeduced<VectorView<const W>> weight,
                         detail::nondeduced<MatrixView<std::remove_const_t<X>>> h, QuantKind kind,
                         const QuantScales& scales, MatrixView<uint8_t> q, VectorView<float> rstd, const Options& opt,
                         const Backend& backend) noexcept {
  Status s = detail::check_forward_views(x, weight, q, rstd, "q");
  if (s == Status::kSuccess) s = detail::check_same_shape("residual", residual, x);
  if (s == Status::kSuccess) s = detail::check_same_shape("h", h, x);
  if (s == Status::kSuccess) s = detail::check_quant_scales(scales, x);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<std::remove_const_t<X>>(x.rows, x.cols, opt);
  p.flags |= detail::weight_flags<std::remove_const_t<X>, W>();
  return detail::quant_call(true, p, x.data, x.row_stride, residual.data, residual.row_stride, weight.data, h.data,
                            h.row_stride, kind, scales, q, rstd.data, backend);
}

// Bytes of workspace backward needs for rows x cols of T with this gw mode.
// The mixed-dtype backwards name their other dtypes here too, since on CUDA
// they run other kernels with another workspace: Y, gy's dtype (backward_from<Y,
// T>); W = float, an fp32 weight (backward_mixed<T>), or W = Y with fp32 T
// (backward_f32_from<Y>); R = float, the fp32 residual stream
// (add_backward<float, T>).
template <class T, class Y = T, class W = T, class R = T>
Status backward_workspace_size(int64_t rows, int64_t cols, GwMode mode, const Backend& backend,
                               size_t* bytes) noexcept {
  static_assert(std::is_same<W, T>::value || std::is_same<W, float>::value ||
                    (std::is_same<T, float>::value && std::is_same<W, Y>::value),
                "the weight is T or float, or y's dtype with fp32 x");
  static_assert(std::is_same<R, T>::value || std::is_same<R, float>::value, "the residual stream is T or float");
  detail::clear_cpp_error();
  rmsnorm_problem_t p = detail::make_problem<T>(rows, cols, Options{});
  if (!std::is_same<Y, T>::value) p.flags |= RMSNORM_FLAG_Y_DTYPE(dtype_of_v<Y>);
  if (!std::is_same<W, T>::value) p.flags |= std::is_same<W, float>::value ? RMSNORM_FLAG_WEIGHT_F32 : RMSNORM_FLAG_WEIGHT_Y_DTYPE;
  if (!std::is_same<R, T>::value) p.flags |= RMSNORM_FLAG_RESIDUAL_F32;
  return static_cast<Status>(
      rmsnorm_backward_workspace_size(&p, static_cast<int32_t>(mode), &backend.c(), bytes));
}

template <class T, class Y = T, class W = T, class R = T>
size_t backward_workspace_size_or_throw(int64_t rows, int64_t cols, GwMode mode, const Backend& backend) {
  size_t bytes = 0;
  check(backward_workspace_size<T, Y, W, R>(rows, cols, mode, backend, &bytes));
  return bytes;
}

// gx (and gw, per its mode) given gy = dL/dy. rstd: the forward's, or an
// empty view to recompute it. weight may be empty only with GradWeight::none().
// gx may alias gy exactly (same data and row stride). T is taken from gx.
template <class T>
Status backward(detail::nondeduced<MatrixView<const T>> x, detail::nondeduced<VectorView<const T>> weight,
                detail::nondeduced<MatrixView<const T>> gy, detail::nondeduced<VectorView<const float>> rstd,
                MatrixView<T> gx, detail::nondeduced<GradWeight<T>> gw, Workspace workspace, const Options& opt,
                const Backend& backend) noexcept {
  static_assert(!std::is_const<T>::value, "gx must be writable");
  const Status s = detail::check_backward_views(x, weight, gy, rstd, gx, gw);
  if (s != Status::kSuccess) return s;
  const rmsnorm_problem_t p = detail::make_problem<T>(x.rows, x.cols, opt);
  return static_cast<Status>(rmsnorm_backward(&p, x.data, x.row_stride, weight.data, gy.data, gy.row_stride,
                                              rstd.data, gx.data, gx.row_stride, gw.data(),
                                              static_cast<int32_t>(gw.mode()), workspace.data, workspace.bytes,
                                              &backend.c()));
}

namespace detail {
// The shapes of add_backward's and add_backward_x's views against h (gw's size where it has one).
template <class R, class T, class W>
Status check_add_backward_views(const MatrixView<const R>& h, const VectorView<const W>& weight,
                                const MatrixView<const T>& gy, const VectorView<const float>& rstd,
                                const MatrixView<const R>& g_h, const MatrixView<R>& gx, const GradWeight<W>& gw) noexcept {
  Status s = check_same_shape("gy", gy, h);
  if (s == Status::kSuccess) s = check_same_shape("g_h", g_h, h);
  if (s == Status::kSuccess) s = check_same_shape("gx", gx, h);
  if (s == Status::kSuccess) s = check_optional("weight", weight, h.cols, "cols");
  if (s == Status::kSuccess) s = check_optional("rstd", rstd, h.rows, "rows");
  if (s == Status::kSuccess && gw.mode() != GwMode::kNone && gw.data() != nullptr)
    s = check_size("gw", gw.size(), "cols", h.cols);
  return s;
}
}  // namespace detail

// The backward of add_forward (rmsnorm_add_backward): gx = T(T(gx_norm) + g_h)
// for both x and residual, given h, gy and g_h (h's gradient from its other
// consumer). gx may alias gy or g_h exactly. The residual stream's R (h, g_h,
// gx) is taken from gx, and T (gy, the weight, gw) is R unless named: the fp32
// residual stream is add_backward<float, T> (RMSNORM_FLAG_RESIDUAL_F32; gx is
// then residual's gradient in fp32, and x's is T(gx); its workspace:
// backward_workspace_size<T, T, T, float>). W, the weight's and gw's type, is
// T or, with 16-bit T, float (RMSNORM_FLAG_WEIGHT_F32: add_backward<R, T,
// float>, gw fp32; its workspace: backward_workspace_size<T, T, float, R>).
template <class R, class T = R, class W = T>
Status add_backward(detail::nondeduced<MatrixView<const R>> h, detail::nondeduced<VectorView<const W>> weight,
                    detail::nondeduced<MatrixView<const T>> gy, detail::nondeduced<VectorView<const float>> rstd,
                    detail::nondeduced<MatrixView<const R>> g_h, MatrixView<R> gx,
                    detail::nondeduced<GradWeight<W>> gw, Workspace workspace, const Options& opt,
                    const Backend& backend) noexcept {
  static_assert(!std::is_const<R>::value, "gx must be writable");
  static_assert(std::is_same<R, T>::value || std::is_same<R, float>::value, "the residual stream is T or float");
  static_assert(detail::weight_of_v<T, W>, "the weight is T, or float with 16-bit T");
  detail::clear_cpp_error();
  const Status s = detail::check_add_backward_views<R, T, W>(h, weight, gy, rstd, g_h, gx, gw);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<T>(h.rows, h.cols, opt);
  p.flags |= detail::weight_flags<T, W>();
  if (!std::is_same<R, T>::value) p.flags |= RMSNORM_FLAG_RESIDUAL_F32;
  return static_cast<Status>(rmsnorm_add_backward(&p, h.data, h.row_stride, weight.data, gy.data, gy.row_stride,
                                                  rstd.data, g_h.data, g_h.row_stride, gx.data, gx.row_stride,
                                                  gw.data(), static_cast<int32_t>(gw.mode()), workspace.data,
                                                  workspace.bytes, &backend.c()));
}

// The fp32 residual stream's backward writing x's gradient as well (rmsnorm_add_backward_x): add_backward<float, T,
// W> and gx_x = T(gx), x's dtype, in the same pass. gx_x overlaps no other operand.
template <class T, class W = T>
Status add_backward_x(MatrixView<const float> h, detail::nondeduced<VectorView<const W>> weight,
                      detail::nondeduced<MatrixView<const T>> gy, VectorView<const float> rstd,
                      MatrixView<const float> g_h, MatrixView<float> gx, MatrixView<T> gx_x,
                      detail::nondeduced<GradWeight<W>> gw, Workspace workspace, const Options& opt,
                      const Backend& backend) noexcept {
  static_assert(!std::is_same<T, float>::value, "x of the fp32 residual stream is 16-bit");
  static_assert(detail::weight_of_v<T, W>, "the weight is T, or float");
  detail::clear_cpp_error();
  Status s = detail::check_add_backward_views<float, T, W>(h, weight, gy, rstd, g_h, gx, gw);
  if (s == Status::kSuccess) s = detail::check_same_shape("gx_x", gx_x, h);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<T>(h.rows, h.cols, opt);
  p.flags |= RMSNORM_FLAG_RESIDUAL_F32 | detail::weight_flags<T, W>();
  return static_cast<Status>(rmsnorm_add_backward_x(&p, h.data, h.row_stride, weight.data, gy.data, gy.row_stride,
                                                    rstd.data, g_h.data, g_h.row_stride, gx.data, gx.row_stride,
                                                    gx_x.data, gx_x.row_stride, gw.data(),
                                                    static_cast<int32_t>(gw.mode()), workspace.data, workspace.bytes,
                                                    &backend.c()));
}

// y in another dtype Y than x's T (RMSNORM_FLAG_Y_DTYPE): y = Y(x_hat * w'),
// rounded once (bf16 y from fp32 x, say); the backward reads gy in Y and
// writes gx in T, gw in the weight's T. The weight has x's dtype. Its
// workspace: backward_workspace_size<T, Y>.
template <class Y, class X>
Status forward_to(MatrixView<X> x, detail::nondeduced<VectorView<const std::remove_const_t<X>>> weight, MatrixView<Y> y,
                  VectorView<float> rstd, const Options& opt, const Backend& backend) noexcept {
  using T = std::remove_const_t<X>;
  static_assert(!std::is_const<Y>::value, "y must be writable");
  const Status s = detail::check_forward_views(x, weight, y, rstd);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<T>(x.rows, x.cols, opt);
  p.flags |= RMSNORM_FLAG_Y_DTYPE(dtype_of_v<Y>);
  return static_cast<Status>(rmsnorm_forward(&p, x.data, x.row_stride, weight.data, y.data, y.row_stride, rstd.data,
                                             &backend.c()));
}

template <class Y, class T>
Status backward_from(detail::nondeduced<MatrixView<const T>> x, detail::nondeduced<VectorView<const T>> weight,
                     MatrixView<const Y> gy, detail::nondeduced<VectorView<const float>> rstd, MatrixView<T> gx,
                     detail::nondeduced<GradWeight<T>> gw, Workspace workspace, const Options& opt,
                     const Backend& backend) noexcept {
  static_assert(!std::is_const<T>::value, "gx must be writable");
  const Status s = detail::check_backward_views(x, weight, gy, rstd, gx, gw);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<T>(x.rows, x.cols, opt);
  p.flags |= RMSNORM_FLAG_Y_DTYPE(dtype_of_v<Y>);
  return static_cast<Status>(rmsnorm_backward(&p, x.data, x.row_stride, weight.data, gy.data, gy.row_stride,
                                              rstd.data, gx.data, gx.row_stride, gw.data(),
                                              static_cast<int32_t>(gw.mode()), workspace.data, workspace.bytes,
                                              &backend.c()));
}

// fp32 x with y, gy and the weight in a 16-bit Y (RMSNORM_FLAG_Y_DTYPE and
// RMSNORM_FLAG_WEIGHT_Y_DTYPE): an fp32 residual stream's h normalized with the
// model's 16-bit weight. gx is fp32, gw in Y (store / accumulate) or fp32
// (store_f32 / accumulate_f32). Its workspace: backward_workspace_size<float, Y, Y>.
template <class Y>
Status forward_f32_to(MatrixView<const float> x, VectorView<const Y> weight, MatrixView<Y> y, VectorView<float> rstd,
                      const Options& opt, const Backend& backend) noexcept {
  static_assert(!std::is_const<Y>::value && !std::is_same<Y, float>::value, "y of a 16-bit dtype");
  const Status s = detail::check_forward_views(x, weight, y, rstd);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<float>(x.rows, x.cols, opt);
  p.flags |= RMSNORM_FLAG_Y_DTYPE(dtype_of_v<Y>) | RMSNORM_FLAG_WEIGHT_Y_DTYPE;
  return static_cast<Status>(rmsnorm_forward(&p, x.data, x.row_stride, weight.data, y.data, y.row_stride, rstd.data,
                                             &backend.c()));
}

template <class Y>
Status backward_f32_from(MatrixView<const float> x, VectorView<const Y> weight, MatrixView<const Y> gy,
                         VectorView<const float> rstd, MatrixView<float> gx, GradWeight<Y> gw, Workspace workspace,
                         const Options& opt, const Backend& backend) noexcept {
  static_assert(!std::is_same<Y, float>::value, "gy of a 16-bit dtype");
  const Status s = detail::check_backward_views(x, weight, gy, rstd, gx, gw);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<float>(x.rows, x.cols, opt);
  p.flags |= RMSNORM_FLAG_Y_DTYPE(dtype_of_v<Y>) | RMSNORM_FLAG_WEIGHT_Y_DTYPE;
  return static_cast<Status>(rmsnorm_backward(&p, x.data, x.row_stride, weight.data, gy.data, gy.row_stride,
                                              rstd.data, gx.data, gx.row_stride, gw.data(),
                                              static_cast<int32_t>(gw.mode()), workspace.data, workspace.bytes,
                                              &backend.c()));
}

// Mixed precision (RMSNORM_FLAG_WEIGHT_F32): an fp32 weight with 16-bit x, y,
// gy and gx, as AMP and FSDP keep master weights; gw is fp32 (any GradWeight
// mode). Named apart from forward/backward so that an empty weight view ({})
// stays unambiguous there. Its workspace: backward_workspace_size<T, T, float>.
template <class T>
Status forward_mixed(detail::nondeduced<MatrixView<const T>> x, VectorView<const float> weight, MatrixView<T> y,
                     VectorView<float> rstd, const Options& opt, const Backend& backend) noexcept {
  static_assert(!std::is_const<T>::value, "y must be writable");
  static_assert(!std::is_same<T, float>::value, "fp32 x takes forward()");
  const Status s = detail::check_forward_views(x, weight, y, rstd);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<T>(x.rows, x.cols, opt);
  p.flags |= RMSNORM_FLAG_WEIGHT_F32;
  return static_cast<Status>(rmsnorm_forward(&p, x.data, x.row_stride, weight.data, y.data, y.row_stride, rstd.data,
                                             &backend.c()));
}

template <class T>
Status backward_mixed(detail::nondeduced<MatrixView<const T>> x, VectorView<const float> weight,
                      detail::nondeduced<MatrixView<const T>> gy, VectorView<const float> rstd, MatrixView<T> gx,
                      GradWeight<float> gw, Workspace workspace, const Options& opt, const Backend& backend) noexcept {
  static_assert(!std::is_const<T>::value, "gx must be writable");
  static_assert(!std::is_same<T, float>::value, "fp32 x takes backward()");
  const Status s = detail::check_backward_views(x, weight, gy, rstd, gx, gw);
  if (s != Status::kSuccess) return s;
  rmsnorm_problem_t p = detail::make_problem<T>(x.rows, x.cols, opt);
  p.flags |= RMSNORM_FLAG_WEIGHT_F32;
  return static_cast<Status>(rmsnorm_backward(&p, x.data, x.row_stride, weight.data, gy.data, gy.row_stride,
                                              rstd.data, gx.data, gx.row_stride, gw.data(),
                                              static_cast<int32_t>(gw.mode()), workspace.data, workspace.bytes,
                                              &backend.c()));
}

// Throwing forms: the same calls, with check() applied.
template <class T>
void forward_or_throw(detail::nondeduced<MatrixView<const T>> x, detail::nondeduced<VectorView<const T>> weight,
                      MatrixView<T> y, VectorView<float> rstd, const Options& opt, const Backend& backend) {
  check(forward<T>(x, weight, y, rstd, opt, backend));
}

template <class T>
void backward_or_throw(detail::nondeduced<MatrixView<const T>> x, detail::nondeduced<VectorView<const T>> weight,
                       detail::nondeduced<MatrixView<const T>> gy, detail::nondeduced<VectorView<const float>> rstd,
                       MatrixView<T> gx, detail::nondeduced<GradWeight<T>> gw, Workspace workspace,
                       const Options& opt, const Backend& backend) {
  check(backward<T>(x, weight, gy, rstd, gx, gw, workspace, opt, backend));
}

inline bool cuda_available() noexcept { return rmsnorm_cuda_available() != 0; }

}  // namespace rmsnorm
