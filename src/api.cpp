// The C ABI: argument validation and backend selection, nothing else.
// Every check runs before any memory is touched, so a failing call writes
// nothing; the message names the argument and the reason.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>

#include "args.hpp"
#include "cpu/cpu_backend.hpp"
#include "error.hpp"
#include "plan.hpp"
#include "rmsnorm/rmsnorm.h"
#if defined(RMSNORM_WITH_CUDA)
#include "cuda/cuda_backend.hpp"
#endif

namespace rmsnorm {

namespace {
thread_local std::string g_last_error;
}

void set_last_error(std::string message) { g_last_error = std::move(message); }
void clear_last_error() { g_last_error.clear(); }

rmsnorm_status_t fail(rmsnorm_status_t status, const std::string& what, const std::string& why) {
  set_last_error(what + ": " + why);
  return status;
}

namespace {

constexpr uint32_t kKnownFlags = RMSNORM_FLAG_WEIGHT_OFFSET | RMSNORM_FLAG_ROUND_XHAT | RMSNORM_FLAG_NO_PDL;

std::string num(int64_t v) { return std::to_string(v); }

// Byte extent [begin, end) of an operand plus, for matrices, the row geometry
// used by the exact overlap test of equal-stride matrices.
struct Extent {
  const char* name = "";
  uintptr_t begin = 0;
  uintptr_t end = 0;
  int64_t rows = 1;          // 1 for vectors
  int64_t stride_bytes = 0;  // 0 for vectors
  int64_t row_bytes = 0;     // bytes of one row (or the whole vector)
  bool present() const { return end > begin; }
};

Extent matrix_extent(const char* name, const void* p, int64_t rows, int64_t cols, int64_t stride, size_t esize) {
  Extent e;
  e.name = name;
  if (p == nullptr || rows <= 0) return e;
  e.begin = reinterpret_cast<uintptr_t>(p);
  e.rows = rows;
  e.row_bytes = cols * static_cast<int64_t>(esize);
  // A single row has no stride to speak of: y == x with rows == 1 is the same view whatever the strides.
  e.stride_bytes = rows > 1 ? stride * static_cast<int64_t>(esize) : e.row_bytes;
  e.end = e.begin + static_cast<uintptr_t>((rows - 1) * e.stride_bytes + e.row_bytes);
  return e;
}

Extent vector_extent(const char* name, const void* p, int64_t n, size_t esize) {
  return matrix_extent(name, p, 1, n, n, esize);
}

// True when some byte belongs to both. Equal-stride matrices (interleaved
// views of one buffer, e.g. q and k in a packed qkv tensor) are tested row by
// row; otherwise the byte ranges decide, which is conservative.
bool overlaps(const Extent& a, const Extent& b) {
  if (!a.present() || !b.present()) return false;
  if (a.end <= b.begin || b.end <= a.begin) return false;
  if (a.rows > 1 && b.rows > 1 && a.stride_bytes == b.stride_bytes) {
    const int64_t s = a.stride_bytes;
    const int64_t d = static_cast<int64_t>(b.begin - a.begin);  // two's complement difference
    // Row i of a meets row j of b iff [i*s, i*s + la) meets [d + j*s, d + j*s + lb).
    // Only k = i - j near d / s can work; check the neighbours of the quotient.
    const int64_t q = d >= 0 ? d / s : -((-d + s - 1) / s);
    for (int64_t k = q - 1; k <= q + 1; ++k) {
      if (k <= -b.rows || k >= a.rows) continue;
      const int64_t lo = k * s, hi = lo + a.row_bytes;  // a's row, relative to b's row j = i - k
      if (lo < d + b.row_bytes && d < hi) return true;
    }
    return false;
  }
  return true;
}

bool same_view(const Extent& a, const Extent& b) {
  return a.begin == b.begin && a.stride_bytes == b.stride_bytes && a.end == b.end;
}

rmsnorm_status_t check_overlap(const Extent& out, const Extent& other) {
  if (overlaps(out, other))
    return fail(RMSNORM_STATUS_OVERLAP, out.name, std::string("overlaps ") + other.name);
  return RMSNORM_STATUS_SUCCESS;
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

struct Common {
  DType dtype = DType::kF32;
  size_t esize = 4;
  bool cuda = false;
  int device = -1;
  void* stream = nullptr;
  int threads = 0;
};

#define RMSNORM_TRY(expr)                                          \
  do {                                                             \
    const rmsnorm_status_t rmsnorm_status_ = (expr);               \
    if (rmsnorm_status_ != RMSNORM_STATUS_SUCCESS) return rmsnorm_status_; \
  } while (0)

rmsnorm_status_t check_problem_and_backend(const rmsnorm_problem_t* p, const rmsnorm_backend_t* b, Common* c) {
  if (p == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "problem", "must not be NULL");
  if (b == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "backend", "must not be NULL");
  if (p->dtype != RMSNORM_DTYPE_F32 && p->dtype != RMSNORM_DTYPE_F16 && p->dtype != RMSNORM_DTYPE_BF16)
    return fail(RMSNORM_STATUS_INVALID_DTYPE, "dtype", "unknown dtype " + num(p->dtype));
  if ((p->flags & ~kKnownFlags) != 0)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "flags", "unknown flag bits " + num(p->flags & ~kKnownFlags));
  if (p->rows < 0) return fail(RMSNORM_STATUS_INVALID_SHAPE, "rows", "must be >= 0 (got " + num(p->rows) + ")");
  if (p->cols <= 0) return fail(RMSNORM_STATUS_INVALID_SHAPE, "cols", "must be >= 1 (got " + num(p->cols) + ")");
  if (p->cols > plan::kMaxCols)
    return fail(RMSNORM_STATUS_INVALID_SHAPE, "cols", "must be at most " + num(plan::kMaxCols) + " (got " + num(p->cols) + ")");
  if (!std::isfinite(p->eps) || p->eps < 0.0f) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "must be finite and >= 0 (got %g)", static_cast<double>(p->eps));
    return fail(RMSNORM_STATUS_INVALID_EPS, "eps", buf);
  }
  c->dtype = static_cast<DType>(p->dtype);
  c->esize = rmsnorm_dtype_size(p->dtype);
  if (b->kind == RMSNORM_BACKEND_CPU) {
    if (b->num_threads < 0)
      return fail(RMSNORM_STATUS_INVALID_OPTION, "backend.num_threads", "must be >= 0 (got " + num(b->num_threads) + ")");
    c->cuda = false;
    c->threads = b->num_threads;
    return RMSNORM_STATUS_SUCCESS;
  }
  if (b->kind != RMSNORM_BACKEND_CUDA)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "backend.kind", "unknown backend kind " + num(b->kind));
  if (b->device < -1)
    return fail(RMSNORM_STATUS_INVALID_OPTION, "backend.device", "must be a device ordinal or -1 (got " + num(b->device) + ")");
  c->cuda = true;
  c->stream = b->stream;
#if defined(RMSNORM_WITH_CUDA)
  if (!cuda::available())
    return fail(RMSNORM_STATUS_BACKEND_UNAVAILABLE, "backend.kind", "no CUDA device is present");
  return cuda::resolve_device(b->device, &c->device);
#else
  return fail(RMSNORM_STATUS_BACKEND_UNAVAILABLE, "backend.kind", "this build has no CUDA backend");
#endif
}

// Row stride >= cols, and the operand's extent in bytes fits in int64.
rmsnorm_status_t check_stride(const char* name, int64_t stride, int64_t rows, int64_t cols, size_t esize) {
  if (stride < cols)
    return fail(RMSNORM_STATUS_INVALID_STRIDE, name, num(stride) + " is less than cols (" + num(cols) + ")");
  const int64_t max = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(esize);
  if (rows > 1 && (stride > (max - cols) / (rows - 1)))
    return fail(RMSNORM_STATUS_INVALID_SHAPE, name, "rows * stride overflows the address space");
  return RMSNORM_STATUS_SUCCESS;
}

rmsnorm_status_t check_pointer(const char* name, const void* p, size_t align, const Common& c) {
  if (p == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, name, "must not be NULL");
  if (!aligned(p, align))
    return fail(RMSNORM_STATUS_MISALIGNED, name, "must be aligned to " + num(static_cast<int64_t>(align)) + " bytes");
#if defined(RMSNORM_WITH_CUDA)
  int owner = -1;
  const cuda::MemorySpace space = cuda::memory_space(p, &owner);
  if (!c.cuda && space == cuda::MemorySpace::kDevice)
    return fail(RMSNORM_STATUS_WRONG_MEMORY_SPACE, name, "is device memory, but the backend is CPU");
  if (c.cuda && space == cuda::MemorySpace::kDevice && owner != c.device)
    return fail(RMSNORM_STATUS_WRONG_MEMORY_SPACE, name,
                "is memory of device " + num(owner) + ", but the backend runs on device " + num(c.device));
  if (c.cuda && space == cuda::MemorySpace::kHost)
    return fail(RMSNORM_STATUS_WRONG_MEMORY_SPACE, name, "is pageable host memory, but the backend is CUDA");
#else
  (void)c;
#endif
  return RMSNORM_STATUS_SUCCESS;
}

rmsnorm_status_t check_optional_pointer(const char* name, const void* p, size_t align, const Common& c) {
  return p == nullptr ? RMSNORM_STATUS_SUCCESS : check_pointer(name, p, align, c);
}

int cpu_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace
}  // namespace rmsnorm

using namespace rmsnorm;

extern "C" {

const char* rmsnorm_status_string(rmsnorm_status_t status) {
  switch (status) {
    case RMSNORM_STATUS_SUCCESS: return "RMSNORM_STATUS_SUCCESS";
    case RMSNORM_STATUS_NULL_POINTER: return "RMSNORM_STATUS_NULL_POINTER";
    case RMSNORM_STATUS_INVALID_SHAPE: return "RMSNORM_STATUS_INVALID_SHAPE";
    case RMSNORM_STATUS_INVALID_STRIDE: return "RMSNORM_STATUS_INVALID_STRIDE";
    case RMSNORM_STATUS_INVALID_EPS: return "RMSNORM_STATUS_INVALID_EPS";
    case RMSNORM_STATUS_INVALID_DTYPE: return "RMSNORM_STATUS_INVALID_DTYPE";
    case RMSNORM_STATUS_INVALID_OPTION: return "RMSNORM_STATUS_INVALID_OPTION";
    case RMSNORM_STATUS_MISALIGNED: return "RMSNORM_STATUS_MISALIGNED";
    case RMSNORM_STATUS_WORKSPACE_TOO_SMALL: return "RMSNORM_STATUS_WORKSPACE_TOO_SMALL";
    case RMSNORM_STATUS_OVERLAP: return "RMSNORM_STATUS_OVERLAP";
    case RMSNORM_STATUS_WRONG_MEMORY_SPACE: return "RMSNORM_STATUS_WRONG_MEMORY_SPACE";
    case RMSNORM_STATUS_BACKEND_UNAVAILABLE: return "RMSNORM_STATUS_BACKEND_UNAVAILABLE";
    case RMSNORM_STATUS_CUDA_ERROR: return "RMSNORM_STATUS_CUDA_ERROR";
    case RMSNORM_STATUS_INTERNAL_ERROR: return "RMSNORM_STATUS_INTERNAL_ERROR";
  }
  return "RMSNORM_STATUS_UNKNOWN";
}

const char* rmsnorm_last_error(void) { return g_last_error.c_str(); }

size_t rmsnorm_dtype_size(int32_t dtype) {
  switch (dtype) {
    case RMSNORM_DTYPE_F32: return 4;
    case RMSNORM_DTYPE_F16:
    case RMSNORM_DTYPE_BF16: return 2;
  }
  return 0;
}

int rmsnorm_cuda_available(void) {
#if defined(RMSNORM_WITH_CUDA)
  return cuda::available() ? 1 : 0;
#else
  return 0;
#endif
}

rmsnorm_problem_t rmsnorm_problem_default(void) {
  rmsnorm_problem_t p;
  p.rows = 0;
  p.cols = 0;
  p.dtype = RMSNORM_DTYPE_F32;
  p.flags = 0;
  p.eps = 1e-5f;
  return p;
}

rmsnorm_backend_t rmsnorm_backend_cpu(int32_t num_threads) {
  rmsnorm_backend_t b;
  b.kind = RMSNORM_BACKEND_CPU;
  b.device = -1;
  b.stream = nullptr;
  b.num_threads = num_threads;
  return b;
}

rmsnorm_backend_t rmsnorm_backend_cuda(int32_t device, void* stream) {
  rmsnorm_backend_t b;
  b.kind = RMSNORM_BACKEND_CUDA;
  b.device = device;
  b.stream = stream;
  b.num_threads = 0;
  return b;
}

rmsnorm_status_t rmsnorm_forward(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                 const void* weight, void* y, int64_t y_row_stride, float* rstd,
                                 const rmsnorm_backend_t* backend) {
  clear_last_error();
  Common c;
  RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
  const int64_t rows = problem->rows, cols = problem->cols;
  if (rows == 0) return RMSNORM_STATUS_SUCCESS;
  RMSNORM_TRY(check_pointer("x", x, c.esize, c));
  RMSNORM_TRY(check_pointer("y", y, c.esize, c));
  RMSNORM_TRY(check_optional_pointer("weight", weight, c.esize, c));
  RMSNORM_TRY(check_optional_pointer("rstd", rstd, sizeof(float), c));
  RMSNORM_TRY(check_stride("x_row_stride", x_row_stride, rows, cols, c.esize));
  RMSNORM_TRY(check_stride("y_row_stride", y_row_stride, rows, cols, c.esize));

  const Extent ex = matrix_extent("x", x, rows, cols, x_row_stride, c.esize);
  const Extent ey = matrix_extent("y", y, rows, cols, y_row_stride, c.esize);
  const Extent ew = vector_extent("weight", weight, cols, c.esize);
  const Extent er = vector_extent("rstd", rstd, rows, sizeof(float));
  // y may alias x exactly (in place); any other overlap is rejected.
  if (!same_view(ey, ex) && overlaps(ey, ex))
    return fail(RMSNORM_STATUS_OVERLAP, "y", "overlaps x (only y == x with equal row strides is allowed)");
  RMSNORM_TRY(check_overlap(ey, ew));
  RMSNORM_TRY(check_overlap(er, ex));
  RMSNORM_TRY(check_overlap(er, ew));
  RMSNORM_TRY(check_overlap(er, ey));

  ForwardArgs a;
  a.rows = rows;
  a.cols = cols;
  a.dtype = c.dtype;
  a.eps = problem->eps;
  a.weight_offset = (problem->flags & RMSNORM_FLAG_WEIGHT_OFFSET) != 0;
  a.round_xhat = (problem->flags & RMSNORM_FLAG_ROUND_XHAT) != 0;
  a.pdl = (problem->flags & RMSNORM_FLAG_NO_PDL) == 0;
  a.x = x;
  a.x_stride = x_row_stride;
  a.weight = weight;
  a.y = y;
  a.y_stride = y_row_stride;
  a.rstd = rstd;
  if (!c.cuda) return cpu::forward(a, cpu_threads(c.threads));
#if defined(RMSNORM_WITH_CUDA)
  return cuda::forward(a, c.device, c.stream);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}

static rmsnorm_status_t workspace_size_impl(const rmsnorm_problem_t* problem, int32_t gw_mode, const Common& c,
                                            size_t* bytes) {
  const GwMode mode = static_cast<GwMode>(gw_mode);
  if (!c.cuda) {
    *bytes = cpu::backward_workspace_bytes(problem->rows, problem->cols, mode);
    return RMSNORM_STATUS_SUCCESS;
  }
#if defined(RMSNORM_WITH_CUDA)
  return cuda::backward_workspace_bytes(problem->rows, problem->cols, c.dtype, mode, c.device, bytes);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}

static bool valid_gw_mode(int32_t m) { return m >= RMSNORM_GW_NONE && m <= RMSNORM_GW_ACCUMULATE_F32; }

rmsnorm_status_t rmsnorm_backward_workspace_size(const rmsnorm_problem_t* problem, int32_t gw_mode,
                                                 const rmsnorm_backend_t* backend, size_t* bytes) {
  clear_last_error();
  if (bytes == nullptr) return fail(RMSNORM_STATUS_NULL_POINTER, "bytes", "must not be NULL");
  Common c;
  RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
  if (!valid_gw_mode(gw_mode)) return fail(RMSNORM_STATUS_INVALID_OPTION, "gw_mode", "unknown mode " + num(gw_mode));
  return workspace_size_impl(problem, gw_mode, c, bytes);
}

rmsnorm_status_t rmsnorm_backward(const rmsnorm_problem_t* problem, const void* x, int64_t x_row_stride,
                                  const void* weight, const void* gy, int64_t gy_row_stride, const float* rstd,
                                  void* gx, int64_t gx_row_stride, void* gw, int32_t gw_mode, void* workspace,
                                  size_t workspace_bytes, const rmsnorm_backend_t* backend) {
  clear_last_error();
  Common c;
  RMSNORM_TRY(check_problem_and_backend(problem, backend, &c));
  if (!valid_gw_mode(gw_mode)) return fail(RMSNORM_STATUS_INVALID_OPTION, "gw_mode", "unknown mode " + num(gw_mode));
  const GwMode mode = static_cast<GwMode>(gw_mode);
  const int64_t rows = problem->rows, cols = problem->cols;
  const size_t gw_esize = gw_is_f32(mode) ? sizeof(float) : c.esize;

  if (mode != GwMode::kNone) {
    if (weight == nullptr)
      return fail(RMSNORM_STATUS_NULL_POINTER, "weight", "must not be NULL when gw_mode is not RMSNORM_GW_NONE");
    RMSNORM_TRY(check_pointer("gw", gw, gw_esize, c));
  }
  const bool rows_present = rows > 0;
  if (rows_present) {
    RMSNORM_TRY(check_pointer("x", x, c.esize, c));
    RMSNORM_TRY(check_pointer("gy", gy, c.esize, c));
    RMSNORM_TRY(check_pointer("gx", gx, c.esize, c));
    RMSNORM_TRY(check_optional_pointer("rstd", rstd, sizeof(float), c));
    RMSNORM_TRY(check_stride("x_row_stride", x_row_stride, rows, cols, c.esize));
    RMSNORM_TRY(check_stride("gy_row_stride", gy_row_stride, rows, cols, c.esize));
    RMSNORM_TRY(check_stride("gx_row_stride", gx_row_stride, rows, cols, c.esize));
  }
  RMSNORM_TRY(check_optional_pointer("weight", weight, c.esize, c));

  size_t needed = 0;
  RMSNORM_TRY(workspace_size_impl(problem, gw_mode, c, &needed));
  if (needed > 0) {
    if (workspace == nullptr)
      return fail(RMSNORM_STATUS_NULL_POINTER, "workspace", "must not be NULL (" + std::to_string(needed) +
                                                                 " bytes needed)");
    if (workspace_bytes < needed)
      return fail(RMSNORM_STATUS_WORKSPACE_TOO_SMALL, "workspace",
                  std::to_string(workspace_bytes) + " bytes given, " + std::to_string(needed) + " needed");
    RMSNORM_TRY(check_pointer("workspace", workspace, 16, c));
  }

  const Extent ex = matrix_extent("x", rows_present ? x : nullptr, rows, cols, x_row_stride, c.esize);
  const Extent egy = matrix_extent("gy", rows_present ? gy : nullptr, rows, cols, gy_row_stride, c.esize);
  const Extent egx = matrix_extent("gx", rows_present ? gx : nullptr, rows, cols, gx_row_stride, c.esize);
  const Extent ew = vector_extent("weight", weight, cols, c.esize);
  const Extent er = vector_extent("rstd", rows_present ? rstd : nullptr, rows, sizeof(float));
  const Extent egw = vector_extent("gw", mode != GwMode::kNone ? gw : nullptr, cols, gw_esize);
  const Extent ews = vector_extent("workspace", needed > 0 ? workspace : nullptr, static_cast<int64_t>(needed), 1);
  // gx may alias gy exactly (in place); every other output must be disjoint.
  if (!same_view(egx, egy) && overlaps(egx, egy))
    return fail(RMSNORM_STATUS_OVERLAP, "gx", "overlaps gy (only gx == gy with equal row strides is allowed)");
  for (const Extent* in : {&ex, &ew, &er}) RMSNORM_TRY(check_overlap(egx, *in));
  for (const Extent* other : {&ex, &ew, &er, &egy, &egx}) RMSNORM_TRY(check_overlap(egw, *other));
  for (const Extent* other : {&ex, &ew, &er, &egy, &egx, &egw}) RMSNORM_TRY(check_overlap(ews, *other));

  BackwardArgs a;
  a.rows = rows;
  a.cols = cols;
  a.dtype = c.dtype;
  a.eps = problem->eps;
  a.weight_offset = (problem->flags & RMSNORM_FLAG_WEIGHT_OFFSET) != 0;
  a.pdl = (problem->flags & RMSNORM_FLAG_NO_PDL) == 0;
  a.x = x;
  a.x_stride = x_row_stride;
  a.weight = weight;
  a.gy = gy;
  a.gy_stride = gy_row_stride;
  a.rstd = rstd;
  a.gx = gx;
  a.gx_stride = gx_row_stride;
  a.gw = mode == GwMode::kNone ? nullptr : gw;
  a.gw_mode = mode;
  a.workspace = workspace;
  a.workspace_bytes = workspace_bytes;
  if (!c.cuda) return cpu::backward(a, cpu_threads(c.threads));
#if defined(RMSNORM_WITH_CUDA)
  return cuda::backward(a, c.device, c.stream);
#else
  return fail(RMSNORM_STATUS_INTERNAL_ERROR, "backend", "unreachable");
#endif
}

}  // extern "C"
