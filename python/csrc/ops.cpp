// PyTorch operators over the library's C ABI (include/rmsnorm/rmsnorm.h), built on the LibTorch stable ABI so that
// one build runs on every PyTorch release from TORCH_TARGET_VERSION on.
//
//   rmsnorm::forward(Tensor x, Tensor? weight, float eps, int flags) -> (Tensor y, Tensor rstd)
//   rmsnorm::forward_inference(Tensor x, Tensor? weight, float eps, int flags) -> Tensor y   (no rstd)
//   rmsnorm::backward(Tensor gy, Tensor x, Tensor? weight, Tensor rstd, int flags, ScalarType? gw_dtype)
//       -> (Tensor gx, Tensor? gw)
//
// The last dim is the normalized one (the Python layer flattens several normalized dims into one). The schemas are
// functional: outputs are new tensors, so compiled graphs need no auto-functionalization. y and gx are contiguous;
// rstd is fp32 with x's leading shape. gw is computed only when gw_dtype is given (x's dtype, or float32 for an fp32
// gradient of a 16-bit weight), with fp32 accumulation over all rows and one rounding.
//
// Operands whose leading dims form rows of one stride (a contiguous tensor, the q or k slice of a packed qkv) are
// passed to the library as they are, with that row stride; anything else (a transposed view, a last dim that is not
// contiguous, an expanded gradient) is copied once into a contiguous tensor first.
//
// Everything here is in the stable ABI: the current CUDA stream comes from the stable C shim
// (aoti_torch_get_current_cuda_stream; the C++ wrapper Stream::nativeHandle() needs PyTorch 2.13), and outputs and
// the workspace (a uint8 tensor) come from the shim's aoti_torch_empty_strided (new_tensor), i.e. from PyTorch's
// caching allocator on the current stream of x's device. No device guard: every allocation names its device, and the library makes x's device current for its
// own call (a guard measured about 0.3 us per call on the H200 machine, within run-to-run noise).
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <rmsnorm/rmsnorm.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

// Errors become RuntimeError in Python. A plain throw keeps the message to what the user needs (STD_TORCH_CHECK
// prefixes the C++ function, file and line).
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  ((os << args), ...);
  throw std::runtime_error(os.str());
}

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Double: return "float64";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Bool: return "bool";
    default: return "an unsupported dtype";
  }
}

int32_t library_dtype(ScalarType t, const char* op, const char* arg) {
  switch (t) {
    case ScalarType::Float: return RMSNORM_DTYPE_F32;
    case ScalarType::Half: return RMSNORM_DTYPE_F16;
    case ScalarType::BFloat16: return RMSNORM_DTYPE_BF16;
    default: fail(op, ": ", arg, " has dtype ", dtype_name(t), "; supported: float32, float16, bfloat16");
  }
}

void check_status(rmsnorm_status_t s, const char* op) {
  if (s != RMSNORM_STATUS_SUCCESS) fail(op, ": ", rmsnorm_status_string(s), ": ", rmsnorm_last_error());
}

std::string shape_string(const Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

std::vector<int64_t> leading_shape(const Tensor& t) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) s.push_back(t.size(i));
  return s;
}

std::vector<int64_t> full_shape(const Tensor& t) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < t.dim(); ++i) s.push_back(t.size(i));
  return s;
}

// The AOTI dtype code of a ScalarType the ops allocate.
int32_t aoti_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return aoti_torch_dtype_float32();
    case ScalarType::Half: return aoti_torch_dtype_float16();
    case ScalarType::BFloat16: return aoti_torch_dtype_bfloat16();
    case ScalarType::Byte: return aoti_torch_dtype_uint8();
    case ScalarType::Char: return aoti_torch_dtype_int8();
    case ScalarType::Float8_e4m3fn: return aoti_torch_dtype_float8_e4m3fn();
    default: fail("rmsnorm: internal error: no allocation of dtype ", dtype_name(t));
  }
}

// A new contiguous tensor on `like`'s device, from PyTorch's allocator (the caching allocator on CUDA, on the
// current stream). Through the C shim's aoti_torch_empty_strided rather than torch::stable::empty, which looks
// aten::empty up by name and calls it boxed on every call.
// With `strides`, that layout (which must be a dense permutation of shape) instead of the contiguous one.
Tensor new_tensor(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like,
                  const std::vector<int64_t>* layout = nullptr) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i] > 1 ? shape[i] : 1;
  }
  if (layout != nullptr) strides = *layout;
  const int32_t device_type = like.is_cuda() ? aoti_torch_device_type_cuda() : aoti_torch_device_type_cpu();
  AtenTensorHandle h = nullptr;
  // The stable check carries the allocator's own message ("CUDA out of memory. Tried to allocate ...") where the
  // headers have it; the header-only one names the call alone.
#ifdef STABLE_TORCH_ERROR_CODE_CHECK
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(shape.size()), shape.data(),
                                                         strides.data(), aoti_dtype(dtype), device_type,
                                                         like.get_device_index(), &h));
#else
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(shape.size()), shape.data(), strides.data(),
                                                  aoti_dtype(dtype), device_type, like.get_device_index(), &h));
#endif
  return Tensor(h);
}

// A view of t's storage with another shape and strides (from t's first element).
Tensor view_of(const Tensor& t, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  AtenTensorHandle h = nullptr;
#ifdef STABLE_TORCH_ERROR_CODE_CHECK
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(t.get(), static_cast<int64_t>(shape.size()), shape.data(),
                                                               strides.data(), 0, &h));
#else
  TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(t.get(), static_cast<int64_t>(shape.size()), shape.data(),
                                                        strides.data(), 0, &h));
#endif
  return Tensor(h);
}

// t as a rows x cols matrix (cols = the last dim) with one row stride, copied once when its layout has none.
struct Rows {
  Tensor t;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
};

Rows as_rows(const Tensor& t) {
  Rows r{t, 1, t.size(t.dim() - 1), 0};
  const int64_t nd = t.dim();
  for (int64_t i = 0; i + 1 < nd; ++i) r.rows *= t.size(i);
  r.stride = r.cols;  // any stride >= cols is valid for a single row
  bool ok = r.cols == 1 || t.stride(nd - 1) == 1;
  int64_t next = -1;  // the stride the next outer non-trivial dim must have
  for (int64_t i = nd - 2; i >= 0 && ok; --i) {
    if (t.size(i) == 1) continue;
    if (next < 0) {
      r.stride = t.stride(i);
    } else if (t.stride(i) != next) {
      ok = false;
    }
    next = t.stride(i) * t.size(i);
  }
  // Rows that overlap (stride < cols, as in an expanded tensor) are not a matrix the library accepts.
  if (!ok || r.stride < r.cols) {
    r.t = torch::stable::contiguous(t);
    r.stride = r.cols;
  }
  return r;
}

bool is_16bit(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16; }

// A weight as a contiguous vector of cols elements on x's device, of x's dtype, float32 with a 16-bit x
// (RMSNORM_FLAG_WEIGHT_F32), or of y's 16-bit dtype y_type with a float32 x (RMSNORM_FLAG_WEIGHT_Y_DTYPE; y_type is
// x's where the op has no other y).
Tensor checked_weight(const Tensor& w, const Tensor& x, int64_t cols, const char* op, ScalarType y_type) {
  if (w.dim() != 1 || w.size(0) != cols) {
    fail(op, ": weight has shape ", shape_string(w), ", expected [", cols, "] (the last dim of x)");
  }
  const bool f32_weight = w.scalar_type() == ScalarType::Float && is_16bit(x.scalar_type());
  const bool y_weight =
      x.scalar_type() == ScalarType::Float && is_16bit(y_type) && w.scalar_type() == y_type;
  if (w.scalar_type() != x.scalar_type() && !f32_weight && !y_weight) {
    fail(op, ": weight has dtype ", dtype_name(w.scalar_type()), " but x has ", dtype_name(x.scalar_type()),
         "; the weight must have x's dtype, be float32 with a float16 or bfloat16 x, or have y's float16 or "
         "bfloat16 dtype with a float32 x");
  }
  if (w.is_cuda() != x.is_cuda() || w.get_device_index() != x.get_device_index()) {
    fail(op, ": weight is on another device than x");
  }
  return w.stride(0) == 1 ? w : torch::stable::contiguous(w);
}

// The op's flags: RMSNORM_FLAG_* bits, but not RMSNORM_FLAG_WEIGHT_F32, which the ops set from the weight's dtype
// (weight_f32_flag): passed with a weight of x's dtype it would make the library read and write twice the weight's
// bytes.
void check_flags(int64_t flags, const char* op) {
  if (flags < 0 || flags > UINT32_MAX) fail(op, ": flags ", flags, " is not a set of RMSNORM_FLAG_* bits");
  if ((flags & RMSNORM_FLAG_WEIGHT_F32) != 0)
    fail(op, ": flags must not include RMSNORM_FLAG_WEIGHT_F32 (16); it follows from the weight's dtype");
  if ((flags & RMSNORM_FLAG_RESIDUAL_F32) != 0)
    fail(op, ": flags must not include RMSNORM_FLAG_RESIDUAL_F32 (1024); it follows from the residual's dtype");
  if ((flags & RMSNORM_FLAG_WEIGHT_Y_DTYPE) != 0)
    fail(op, ": flags must not include RMSNORM_FLAG_WEIGHT_Y_DTYPE (2048); it follows from the weight's dtype");
}

// The flag a checked weight of another dtype than x's needs: RMSNORM_FLAG_WEIGHT_F32 (fp32, x 16-bit) or
// RMSNORM_FLAG_WEIGHT_Y_DTYPE (16-bit, x fp32).
uint32_t weight_flags(const std::optional<Tensor>& w, const Tensor& x) {
  if (!w || w->scalar_type() == x.scalar_type()) return 0u;
  return w->scalar_type() == ScalarType::Float ? RMSNORM_FLAG_WEIGHT_F32 : RMSNORM_FLAG_WEIGHT_Y_DTYPE;
}

// y's (and gy's) dtype: x's, or the one RMSNORM_FLAG_Y_DTYPE in the op's flags names.
ScalarType y_scalar_type(int64_t flags, const Tensor& x) {
  switch ((static_cast<uint32_t>(flags) & RMSNORM_FLAG_Y_DTYPE_MASK) >> 8) {
    case RMSNORM_DTYPE_F32 + 1: return ScalarType::Float;
    case RMSNORM_DTYPE_F16 + 1: return ScalarType::Half;
    case RMSNORM_DTYPE_BF16 + 1: return ScalarType::BFloat16;
    default: return x.scalar_type();
  }
}

void check_same_device(const Tensor& t, const Tensor& x, const char* op, const char* arg) {
  if (t.is_cuda() != x.is_cuda() || t.get_device_index() != x.get_device_index()) {
    fail(op, ": ", arg, " is on another device than x");
  }
}

// The library backend for x's device: the CPU backend with PyTorch's intra-op thread count, or the CUDA backend on
// the current stream of x's device.
rmsnorm_backend_t backend_for(const Tensor& x, const char* op) {
  if (x.is_cpu()) return rmsnorm_backend_cpu(static_cast<int32_t>(torch::stable::get_num_threads()));
  if (!x.is_cuda()) fail(op, ": x is on a device that is neither CPU nor CUDA");
#ifdef RMSNORM_TORCH_CUDA
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(x.get_device_index(), &stream));
  return rmsnorm_backend_cuda(x.get_device_index(), stream);
#else
  fail(op, ": x is a CUDA tensor, but this build of rmsnorm has no CUDA backend (it was built without nvcc, with "
           "a PyTorch without CUDA, or with RMSNORM_ENABLE_CUDA=OFF)");
#endif
}

void check_floating_input(const Tensor& x, const char* op) {
  if (x.dim() < 1) fail(op, ": x must have at least one dimension");
  if (x.size(x.dim() - 1) < 1) fail(op, ": the last dim of x has size 0");
}

// The library's eps rule (a finite float32 >= 0), for the calls that return before they reach it (no rows), so that
// an eps refused with rows is refused without them too.
void check_eps(double eps, const char* op) {
  const float e = static_cast<float>(eps);
  if (!std::isfinite(e) || e < 0.0f) fail(op, ": eps must be finite and >= 0 as a float32 (got ", eps, ")");
}

// y, and rstd where with_rstd (the inference form skips its allocation and its store).
std::tuple<Tensor, std::optional<Tensor>> forward_impl(const Tensor& x, const std::optional<Tensor>& weight, double eps,
                                                       int64_t flags, bool with_rstd, const char* op) {
  check_floating_input(x, op);
  const int32_t dtype = library_dtype(x.scalar_type(), op, "x");
  check_flags(flags, op);
  check_eps(eps, op);
  const Rows xr = as_rows(x);
  std::optional<Tensor> w;
  if (weight.has_value()) w = checked_weight(*weight, x, xr.cols, op, y_scalar_type(flags, x));

  // No device guard: new_tensor allocates on x's device, and the library makes x's device current for its own call.
  Tensor y = new_tensor(full_shape(x), y_scalar_type(flags, x), x);
  std::optional<Tensor> rstd;
  if (with_rstd) rstd = new_tensor(leading_shape(x), ScalarType::Float, x);
  if (xr.rows == 0) return {y, rstd};

  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = xr.rows;
  p.cols = xr.cols;
  p.dtype = dtype;
  // Every operand is a tensor on x's device (checked above, or allocated here), so the library's per-operand
  // memory-space queries are skipped (rmsnorm.h, RMSNORM_FLAG_TRUSTED_MEMORY).
  p.flags = static_cast<uint32_t>(flags) | RMSNORM_FLAG_TRUSTED_MEMORY | weight_flags(w, x);
  p.eps = static_cast<float>(eps);
  const rmsnorm_backend_t be = backend_for(x, op);
  check_status(rmsnorm_forward(&p, xr.t.data_ptr(), xr.stride, w ? w->data_ptr() : nullptr, y.data_ptr(), xr.cols,
                               rstd ? static_cast<float*>(rstd->data_ptr()) : nullptr, &be),
               op);
  return {y, rstd};
}

std::tuple<Tensor, Tensor> forward(Tensor x, std::optional<Tensor> weight, double eps, int64_t flags) {
  auto [y, rstd] = forward_impl(x, weight, eps, flags, true, "rmsnorm.forward");
  return {y, *rstd};
}

// The forward for inference: y alone, no rstd allocated or written (the eager no-grad path).
Tensor forward_inference(Tensor x, std::optional<Tensor> weight, double eps, int64_t flags) {
  return std::get<0>(forward_impl(x, weight, eps, flags, false, "rmsnorm.forward_inference"));
}

// The backward, and with g_h the residual-add backward (gx = T(T(gx_norm) + g_h)).
// gx_x (add_backward_x): also x's gradient of the fp32 residual stream, gx rounded to gy's dtype, in the same pass.
std::tuple<Tensor, std::optional<Tensor>> backward_impl(const Tensor& gy, const Tensor& x,
                                                        const std::optional<Tensor>& weight, const Tensor& rstd,
                                                        int64_t flags, std::optional<ScalarType> gw_dtype,
                                                        const std::optional<Tensor>& g_h, const char* op,
                                                        std::optional<Tensor>* gx_x = nullptr) {
  check_floating_input(x, op);
  // The fp32 residual stream's backward (RMSNORM_FLAG_RESIDUAL_F32): h (x here), g_h and gx are float32, gy and the
  // weight 16-bit; the problem's dtype is gy's.
  const bool residual_f32 = g_h.has_value() && x.scalar_type() == ScalarType::Float && is_16bit(gy.scalar_type());
  if (gx_x != nullptr && !residual_f32) {
    fail(op, ": x's gradient in its own dtype is the fp32 residual stream's (float32 h and g_h, 16-bit gy); got h ",
         dtype_name(x.scalar_type()), " and gy ", dtype_name(gy.scalar_type()));
  }
  const Tensor& t_ref = residual_f32 ? gy : x;  // the tensor of the problem's dtype
  const int32_t dtype = library_dtype(t_ref.scalar_type(), op, residual_f32 ? "gy" : "x");
  check_flags(flags, op);
  const ScalarType gy_type = residual_f32 ? gy.scalar_type() : y_scalar_type(flags, x);
  if (gy.scalar_type() != gy_type) {
    fail(op, ": gy has dtype ", dtype_name(gy.scalar_type()), " but y has ", dtype_name(gy_type),
         gy_type == x.scalar_type() ? " (x's)" : " (the flags' RMSNORM_FLAG_Y_DTYPE)");
  }
  if (full_shape(gy) != full_shape(x)) {
    fail(op, ": gy has shape ", shape_string(gy), " but x has ", shape_string(x));
  }
  check_same_device(gy, x, op, "gy");
  if (rstd.scalar_type() != ScalarType::Float) fail(op, ": rstd must be float32, got ", dtype_name(rstd.scalar_type()));
  if (full_shape(rstd) != leading_shape(x)) {
    fail(op, ": rstd has shape ", shape_string(rstd), ", expected x's shape without its last dim");
  }
  check_same_device(rstd, x, op, "rstd");
  if (g_h.has_value()) {
    if (g_h->scalar_type() != x.scalar_type()) {
      fail(op, ": g_h has dtype ", dtype_name(g_h->scalar_type()), " but h has ", dtype_name(x.scalar_type()));
    }
    if (full_shape(*g_h) != full_shape(x)) fail(op, ": g_h has shape ", shape_string(*g_h), " but h has ", shape_string(x));
    check_same_device(*g_h, x, op, "g_h");
  }
  const Rows xr = as_rows(x);
  const Rows gyr = as_rows(gy);
  std::optional<Rows> ghr;
  if (g_h.has_value()) ghr = as_rows(*g_h);
  const Tensor r = rstd.is_contiguous() ? rstd : torch::stable::contiguous(rstd);
  std::optional<Tensor> w;
  if (weight.has_value()) w = checked_weight(*weight, t_ref, xr.cols, op, gy_type);

  int32_t gw_mode = RMSNORM_GW_NONE;
  if (gw_dtype.has_value()) {
    if (!w) fail(op, ": gw_dtype is given but there is no weight");
    if (*gw_dtype == ScalarType::Float) {
      gw_mode = RMSNORM_GW_STORE_F32;
    } else if (*gw_dtype == w->scalar_type()) {
      gw_mode = RMSNORM_GW_STORE;
    } else {
      fail(op, ": gw_dtype must be the weight's dtype or float32, got ", dtype_name(*gw_dtype));
    }
  }

  Tensor gx = new_tensor(full_shape(x), x.scalar_type(), x);
  if (gx_x != nullptr) *gx_x = new_tensor(full_shape(x), gy.scalar_type(), x);
  std::optional<Tensor> gw;
  if (gw_mode != RMSNORM_GW_NONE) gw = new_tensor({xr.cols}, *gw_dtype, x);
  if (xr.rows == 0) {
    if (gw) torch::stable::zero_(*gw);  // the empty sum
    return {gx, gw};
  }

  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = xr.rows;
  p.cols = xr.cols;
  p.dtype = dtype;
  p.flags = static_cast<uint32_t>(flags) | RMSNORM_FLAG_TRUSTED_MEMORY | weight_flags(w, t_ref) |  // as in forward
            (residual_f32 ? RMSNORM_FLAG_RESIDUAL_F32 : 0u);
  const rmsnorm_backend_t be = backend_for(x, op);
  size_t ws_bytes = 0;
  check_status(rmsnorm_backward_workspace_size(&p, gw_mode, &be, &ws_bytes), op);
  // Released when this call returns; the caching allocator keeps the block for later work on this stream, so the
  // kernel that is still running may use it.
  std::optional<Tensor> ws;
  if (ws_bytes > 0) {
    ws = new_tensor({static_cast<int64_t>(ws_bytes)}, ScalarType::Byte, x);
  }
  if (gx_x != nullptr) {
    check_status(rmsnorm_add_backward_x(&p, xr.t.data_ptr(), xr.stride, w ? w->data_ptr() : nullptr, gyr.t.data_ptr(),
                                        gyr.stride, static_cast<const float*>(r.data_ptr()), ghr->t.data_ptr(),
                                        ghr->stride, gx.data_ptr(), xr.cols, (*gx_x)->data_ptr(), xr.cols,
                                        gw ? gw->data_ptr() : nullptr, gw_mode, ws ? ws->data_ptr() : nullptr,
                                        ws_bytes, &be),
                 op);
  } else if (ghr) {
    check_status(rmsnorm_add_backward(&p, xr.t.data_ptr(), xr.stride, w ? w->data_ptr() : nullptr, gyr.t.data_ptr(),
                                      gyr.stride, static_cast<const float*>(r.data_ptr()), ghr->t.data_ptr(),
                                      ghr->stride, gx.data_ptr(), xr.cols, gw ? gw->data_ptr() : nullptr, gw_mode,
                                      ws ? ws->data_ptr() : nullptr, ws_bytes, &be),
                 op);
  } else {
    check_status(rmsnorm_backward(&p, xr.t.data_ptr(), xr.stride, w ? w->data_ptr() : nullptr, gyr.t.data_ptr(),
                                  gyr.stride, static_cast<const float*>(r.data_ptr()), gx.data_ptr(), xr.cols,
                                  gw ? gw->data_ptr() : nullptr, gw_mode, ws ? ws->data_ptr() : nullptr, ws_bytes, &be),
                 op);
  }
  return {gx, gw};
}

std::tuple<Tensor, std::optional<Tensor>> backward(Tensor gy, Tensor x, std::optional<Tensor> weight, Tensor rstd,
                                                   int64_t flags, std::optional<ScalarType> gw_dtype) {
  return backward_impl(gy, x, weight, rstd, flags, gw_dtype, std::nullopt, "rmsnorm.backward");
}

// The residual-add backward: gx (of both x and residual) and gw, given gy, the gradient g_h reaching h along the
// residual stream, and the forward's h and rstd.
std::tuple<Tensor, std::optional<Tensor>> add_backward(Tensor gy, Tensor g_h, Tensor h, std::optional<Tensor> weight,
                                                       Tensor rstd, int64_t flags, std::optional<ScalarType> gw_dtype) {
  return backward_impl(gy, h, weight, rstd, flags, gw_dtype, g_h, "rmsnorm.add_backward");
}

// The fp32 residual stream's add_backward with x's gradient as well: (gx, gx rounded to gy's dtype, gw), one pass.
std::tuple<Tensor, Tensor, std::optional<Tensor>> add_backward_x(Tensor gy, Tensor g_h, Tensor h,
                                                                 std::optional<Tensor> weight, Tensor rstd,
                                                                 int64_t flags, std::optional<ScalarType> gw_dtype) {
  std::optional<Tensor> gx_x;
  auto [gx, gw] = backward_impl(gy, h, weight, rstd, flags, gw_dtype, g_h, "rmsnorm.add_backward_x", &gx_x);
  return {gx, *gx_x, gw};
}

// q = quant(y) (fp8 e4m3fn or int8, rmsnorm_forward_quant): with `scale` (a one-element fp32 tensor) the static
// rule, else per-row scales, returned (fp32, x's leading shape; empty with a static scale), bounded by scale_ub.
// With a residual (add_forward_quant): h = T(x + residual) is returned as well, and q is forward_quant of h.
//
// With group_size > 0 (forward_block_quant, add_forward_block_quant: rmsnorm_forward_block_quant) one scale per
// block of group_size (64 or 128) columns of a row instead: scales has x's leading shape and a last dim of
// nb = ceil(D / group_size), row-major (contiguous), or with column_major_scales the transposed storage (the
// contiguous (nb, rows...) tensor with its first dim moved last: for 2-D x the .t() of an (nb, rows) tensor, stride
// (1, rows)), the MN-major layout of fp8 GEMMs with 1 x 128 scaling. scales_alignment > 1 (column-major only) rounds
// that block stride up to a multiple of it, the storage holding every padded column (4: each block's column starts
// on 16 bytes, as TMA loads of the scales want). scale is then absent (block scales are dynamic).
std::tuple<Tensor, Tensor, std::optional<Tensor>> quant_impl(const Tensor& x, const std::optional<Tensor>& residual,
                                                             const std::optional<Tensor>& weight, double eps,
                                                             int64_t flags, ScalarType out_dtype,
                                                             const std::optional<Tensor>& scale,
                                                             const std::optional<Tensor>& scale_ub, const char* op,
                                                             int64_t group_size = 0,
                                                             bool column_major_scales = false,
                                                             int64_t scales_alignment = 1) {
  const bool blocks = group_size > 0;  // checked by the block ops
  if (scales_alignment < 1 || scales_alignment > 1024)
    fail(op, ": scales_alignment must be in 1..1024, got ", scales_alignment);
  if (scales_alignment != 1 && !column_major_scales)
    fail(op, ": scales_alignment pads column-major scales; it needs column_major_scales");
  check_floating_input(x, op);
  const int32_t dtype = library_dtype(x.scalar_type(), op, "x");
  if (residual.has_value()) {
    if (residual->scalar_type() != x.scalar_type()) {
      fail(op, ": residual has dtype ", dtype_name(residual->scalar_type()), " but x has ",
           dtype_name(x.scalar_type()));
    }
    if (full_shape(*residual) != full_shape(x)) {
      fail(op, ": residual has shape ", shape_string(*residual), " but x has ", shape_string(x));
    }
    check_same_device(*residual, x, op, "residual");
  }
  check_flags(flags, op);
  int32_t kind = 0;
  if (out_dtype == ScalarType::Float8_e4m3fn) {
    kind = RMSNORM_QUANT_FP8_E4M3;
  } else if (out_dtype == ScalarType::Char) {
    kind = RMSNORM_QUANT_INT8;
  } else {
    fail(op, ": out_dtype must be float8_e4m3fn or int8, got ", dtype_name(out_dtype));
  }
  for (const std::optional<Tensor>* t : {&scale, &scale_ub}) {
    if (!t->has_value()) continue;
    if ((*t)->scalar_type() != ScalarType::Float || (*t)->numel() != 1)
      fail(op, ": ", t == &scale ? "scale" : "scale_ub", " must be a one-element float32 tensor");
    check_same_device(**t, x, op, t == &scale ? "scale" : "scale_ub");
  }
  const Rows xr = as_rows(x);
  std::optional<Rows> rr;
  std::optional<Tensor> h;
  if (residual.has_value()) {
    rr = as_rows(*residual);
    h = new_tensor(full_shape(x), x.scalar_type(), x);
  }
  std::optional<Tensor> w;
  if (weight.has_value()) w = checked_weight(*weight, x, xr.cols, op, x.scalar_type());
  Tensor q = new_tensor(full_shape(x), out_dtype, x);
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = xr.rows;
  p.cols = xr.cols;
  p.dtype = dtype;
  p.flags = static_cast<uint32_t>(flags) | RMSNORM_FLAG_TRUSTED_MEMORY | weight_flags(w, x);  // as in forward
  p.eps = static_cast<float>(eps);
  if (blocks) {
    const int64_t nb = (xr.cols + group_size - 1) / group_size;
    std::vector<int64_t> shape = leading_shape(x);
    shape.push_back(nb);
    // Column-major: the leading dims contiguous among themselves (the innermost at stride 1), the block dim
    // outermost at stride rows, as new_tensor's strides of the (nb, rows...) shape with nb moved last.
    std::vector<int64_t> strides(shape.size());
    int64_t st = 1;
    for (size_t i = shape.size() - 1; i-- > 0;) {
      strides[i] = st;
      st *= shape[i] > 1 ? shape[i] : 1;
    }
    strides.back() = (st + scales_alignment - 1) / scales_alignment * scales_alignment;
    // Padded, the storage is a contiguous (nb, padded rows) tensor, so that the last column's padding is there too.
    Tensor scales = scales_alignment > 1
                        ? view_of(new_tensor({nb, strides.back()}, ScalarType::Float, x), shape, strides)
                        : new_tensor(shape, ScalarType::Float, x, column_major_scales ? &strides : nullptr);
    rmsnorm_block_quant_t bq;
    bq.kind = kind;
    bq.block_cols = static_cast<int32_t>(group_size);
    bq.scales = static_cast<float*>(scales.data_ptr());
    // The strides of a row and of a block, read off the tensor: a row is its innermost leading dim (all of them
    // are dense, so that is the stride of the flattened rows); 1-D x has one row.
    bq.scales_block_stride = scales.stride(scales.dim() - 1);
    bq.scales_row_stride = scales.dim() >= 2 ? scales.stride(scales.dim() - 2) : (column_major_scales ? 1 : nb);
    bq.scale_ub = scale_ub.has_value() ? static_cast<const float*>(scale_ub->data_ptr()) : nullptr;
    const rmsnorm_backend_t be = backend_for(x, op);
    if (rr) {
      check_status(rmsnorm_add_forward_block_quant(&p, xr.t.data_ptr(), xr.stride, rr->t.data_ptr(), rr->stride,
                                                   w ? w->data_ptr() : nullptr, h->data_ptr(), xr.cols, &bq,
                                                   q.data_ptr(), xr.cols, nullptr, &be),
                   op);
    } else {
      check_status(rmsnorm_forward_block_quant(&p, xr.t.data_ptr(), xr.stride, w ? w->data_ptr() : nullptr, &bq,
                                               q.data_ptr(), xr.cols, nullptr, &be),
                   op);
    }
    return {q, scales, h};
  }
  Tensor scales = new_tensor(scale.has_value() ? std::vector<int64_t>{0} : leading_shape(x), ScalarType::Float, x);
  rmsnorm_quant_t qt;
  qt.kind = kind;
  qt.scale_mode = scale.has_value() ? RMSNORM_QUANT_STATIC : RMSNORM_QUANT_PER_ROW;
  qt.scale = scale.has_value() ? static_cast<const float*>(scale->data_ptr()) : nullptr;
  qt.row_scales = scale.has_value() ? nullptr : static_cast<float*>(scales.data_ptr());
  qt.scale_ub = scale_ub.has_value() ? static_cast<const float*>(scale_ub->data_ptr()) : nullptr;
  const rmsnorm_backend_t be = backend_for(x, op);
  if (rr) {
    check_status(rmsnorm_add_forward_quant(&p, xr.t.data_ptr(), xr.stride, rr->t.data_ptr(), rr->stride,
                                           w ? w->data_ptr() : nullptr, h->data_ptr(), xr.cols, &qt, q.data_ptr(),
                                           xr.cols, nullptr, &be),
                 op);
  } else {
    check_status(rmsnorm_forward_quant(&p, xr.t.data_ptr(), xr.stride, w ? w->data_ptr() : nullptr, &qt,
                                       q.data_ptr(), xr.cols, nullptr, &be),
                 op);
  }
  return {q, scales, h};
}

std::tuple<Tensor, Tensor> forward_quant(Tensor x, std::optional<Tensor> weight, double eps, int64_t flags,
                                         ScalarType out_dtype, std::optional<Tensor> scale,
                                         std::optional<Tensor> scale_ub) {
  auto [q, scales, h] = quant_impl(x, std::nullopt, weight, eps, flags, out_dtype, scale, scale_ub,
                                   "rmsnorm.forward_quant");
  return {q, scales};
}

// h = T(x + residual), then q = forward_quant of h: (q, scales, h).
std::tuple<Tensor, Tensor, Tensor> add_forward_quant(Tensor x, Tensor residual, std::optional<Tensor> weight,
                                                     double eps, int64_t flags, ScalarType out_dtype,
                                                     std::optional<Tensor> scale, std::optional<Tensor> scale_ub) {
  auto [q, scales, h] = quant_impl(x, residual, weight, eps, flags, out_dtype, scale, scale_ub,
                                   "rmsnorm.add_forward_quant");
  return {q, scales, *h};
}

// The block ops' group_size: 64 or 128 (quant_impl takes 0 for the per-row and static forms).
void check_group_size(int64_t group_size, const char* op) {
  if (group_size != 64 && group_size != 128) fail(op, ": group_size must be 64 or 128, got ", group_size);
}

// q with block scales (rmsnorm_forward_block_quant): (q, scales), scales (x's leading shape, nb) as quant_impl says.
std::tuple<Tensor, Tensor> forward_block_quant(Tensor x, std::optional<Tensor> weight, double eps, int64_t flags,
                                               ScalarType out_dtype, int64_t group_size, bool column_major_scales,
                                               std::optional<Tensor> scale_ub, int64_t scales_alignment) {
  check_group_size(group_size, "rmsnorm.forward_block_quant");
  auto [q, scales, h] = quant_impl(x, std::nullopt, weight, eps, flags, out_dtype, std::nullopt, scale_ub,
                                   "rmsnorm.forward_block_quant", group_size, column_major_scales, scales_alignment);
  return {q, scales};
}

// h = T(x + residual), then q = forward_block_quant of h: (q, scales, h).
std::tuple<Tensor, Tensor, Tensor> add_forward_block_quant(Tensor x, Tensor residual, std::optional<Tensor> weight,
                                                           double eps, int64_t flags, ScalarType out_dtype,
                                                           int64_t group_size, bool column_major_scales,
                                                           std::optional<Tensor> scale_ub, int64_t scales_alignment) {
  check_group_size(group_size, "rmsnorm.add_forward_block_quant");
  auto [q, scales, h] = quant_impl(x, residual, weight, eps, flags, out_dtype, std::nullopt, scale_ub,
                                   "rmsnorm.add_forward_block_quant", group_size, column_major_scales,
                                   scales_alignment);
  return {q, scales, *h};
}

// h = T(x + residual), y = rms_norm(h) * w', and rstd: new contiguous tensors.
std::tuple<Tensor, Tensor, Tensor> add_forward(Tensor x, Tensor residual, std::optional<Tensor> weight, double eps,
                                               int64_t flags) {
  const char* op = "rmsnorm.add_forward";
  check_floating_input(x, op);
  const int32_t dtype = library_dtype(x.scalar_type(), op, "x");
  // An fp32 residual stream with 16-bit x (RMSNORM_FLAG_RESIDUAL_F32): residual and h are float32.
  const bool residual_f32 = residual.scalar_type() == ScalarType::Float && x.scalar_type() != ScalarType::Float;
  if (residual.scalar_type() != x.scalar_type() && !residual_f32) {
    fail(op, ": residual has dtype ", dtype_name(residual.scalar_type()), " but x has ", dtype_name(x.scalar_type()),
         "; the residual must have x's dtype, or be float32 with a float16 or bfloat16 x");
  }
  if (full_shape(residual) != full_shape(x)) {
    fail(op, ": residual has shape ", shape_string(residual), " but x has ", shape_string(x));
  }
  check_same_device(residual, x, op, "residual");
  check_flags(flags, op);
  check_eps(eps, op);
  const Rows xr = as_rows(x);
  const Rows rr = as_rows(residual);
  std::optional<Tensor> w;
  if (weight.has_value()) w = checked_weight(*weight, x, xr.cols, op, x.scalar_type());
  Tensor h = new_tensor(full_shape(x), residual.scalar_type(), x);
  Tensor y = new_tensor(full_shape(x), x.scalar_type(), x);
  Tensor rstd = new_tensor(leading_shape(x), ScalarType::Float, x);
  if (xr.rows == 0) return {y, h, rstd};
  rmsnorm_problem_t p = rmsnorm_problem_default();
  p.rows = xr.rows;
  p.cols = xr.cols;
  p.dtype = dtype;
  p.flags = static_cast<uint32_t>(flags) | RMSNORM_FLAG_TRUSTED_MEMORY | weight_flags(w, x) |  // as in forward
            (residual_f32 ? RMSNORM_FLAG_RESIDUAL_F32 : 0u);
  p.eps = static_cast<float>(eps);
  const rmsnorm_backend_t be = backend_for(x, op);
  check_status(rmsnorm_add_forward(&p, xr.t.data_ptr(), xr.stride, rr.t.data_ptr(), rr.stride,
                                   w ? w->data_ptr() : nullptr, h.data_ptr(), xr.cols, y.data_ptr(), xr.cols,
                                   static_cast<float*>(rstd.data_ptr()), &be),
               op);
  return {y, h, rstd};
}

}  // namespace

STABLE_TORCH_LIBRARY(rmsnorm, m) {
  m.def("forward(Tensor x, Tensor? weight, float eps, int flags) -> (Tensor y, Tensor rstd)");
  m.def("forward_inference(Tensor x, Tensor? weight, float eps, int flags) -> Tensor y");
  m.def("add_forward(Tensor x, Tensor residual, Tensor? weight, float eps, int flags) -> (Tensor y, Tensor h, Tensor rstd)");
  m.def(
      "forward_quant(Tensor x, Tensor? weight, float eps, int flags, ScalarType out_dtype, Tensor? scale, "
      "Tensor? scale_ub) -> (Tensor q, Tensor scales)");
  m.def(
      "add_forward_quant(Tensor x, Tensor residual, Tensor? weight, float eps, int flags, ScalarType out_dtype, "
      "Tensor? scale, Tensor? scale_ub) -> (Tensor q, Tensor scales, Tensor h)");
  m.def(
      "forward_block_quant(Tensor x, Tensor? weight, float eps, int flags, ScalarType out_dtype, int group_size, "
      "bool column_major_scales, Tensor? scale_ub, int scales_alignment=1) -> (Tensor q, Tensor scales)");
  m.def(
      "add_forward_block_quant(Tensor x, Tensor residual, Tensor? weight, float eps, int flags, "
      "ScalarType out_dtype, int group_size, bool column_major_scales, Tensor? scale_ub, int scales_alignment=1) -> "
      "(Tensor q, Tensor scales, Tensor h)");
  m.def(
      "add_backward(Tensor gy, Tensor g_h, Tensor h, Tensor? weight, Tensor rstd, int flags, ScalarType? gw_dtype) -> "
      "(Tensor gx, Tensor? gw)");
  m.def(
      "add_backward_x(Tensor gy, Tensor g_h, Tensor h, Tensor? weight, Tensor rstd, int flags, "
      "ScalarType? gw_dtype) -> (Tensor gx, Tensor gx_x, Tensor? gw)");
  m.def(
      "backward(Tensor gy, Tensor x, Tensor? weight, Tensor rstd, int flags, ScalarType? gw_dtype) -> "
      "(Tensor gx, Tensor? gw)");
}

// CUDA is registered in every build so that a CUDA tensor gets this build's own error (no CUDA backend) rather
// than the dispatcher's "no kernel".
STABLE_TORCH_LIBRARY_IMPL(rmsnorm, CPU, m) {
  m.impl("forward", TORCH_BOX(&forward));
  m.impl("forward_inference", TORCH_BOX(&forward_inference));
  m.impl("backward", TORCH_BOX(&backward));
  m.impl("add_forward", TORCH_BOX(&add_forward));
  m.impl("add_backward", TORCH_BOX(&add_backward));
  m.impl("add_backward_x", TORCH_BOX(&add_backward_x));
  m.impl("forward_quant", TORCH_BOX(&forward_quant));
  m.impl("add_forward_quant", TORCH_BOX(&add_forward_quant));
  m.impl("forward_block_quant", TORCH_BOX(&forward_block_quant));
  m.impl("add_forward_block_quant", TORCH_BOX(&add_forward_block_quant));
}

STABLE_TORCH_LIBRARY_IMPL(rmsnorm, CUDA, m) {
  m.impl("forward", TORCH_BOX(&forward));
  m.impl("forward_inference", TORCH_BOX(&forward_inference));
  m.impl("backward", TORCH_BOX(&backward));
  m.impl("add_forward", TORCH_BOX(&add_forward));
  m.impl("add_backward", TORCH_BOX(&add_backward));
  m.impl("add_backward_x", TORCH_BOX(&add_backward_x));
  m.impl("forward_quant", TORCH_BOX(&forward_quant));
  m.impl("add_forward_quant", TORCH_BOX(&add_forward_quant));
  m.impl("forward_block_quant", TORCH_BOX(&forward_block_quant));
  m.impl("add_forward_block_quant", TORCH_BOX(&add_forward_block_quant));
}
