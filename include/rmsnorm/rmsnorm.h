/*
 * rmsnorm: RMSNorm forward and backward on CUDA and CPU.
 *
 * C ABI (C99). Every entry point validates all of its arguments before it
 * touches memory: on any failure it returns a status, sets a per-thread
 * message naming the argument and the reason (rmsnorm_last_error), and writes
 * nothing. The one exception is a CUDA error reported by a launch after the
 * first of a call that launches several kernels (the backward's gw finalize
 * after its main kernel; the forward of rows whose alignment changes from row
 * to row, one launch per alignment class; a residual add that runs as its
 * own kernel, writing h, before the norm's): the status is then
 * RMSNORM_STATUS_CUDA_ERROR, and what the kernels before it wrote stays
 * written. Such an error comes from the device (an asynchronous fault of
 * earlier work, say), not from the arguments, which are all validated before
 * the first launch.
 *
 * Maths (per row of length D = cols, all arithmetic in fp32):
 *   w' = w (exactly: a -0 weight gives -0), or 1 + w with RMSNORM_FLAG_WEIGHT_OFFSET, or 1 with weight == NULL
 *   r  = 1 / sqrt(mean(x^2) + eps)       x_hat = x * r
 *   y  = T(x_hat * w')                   one rounding to the output dtype
 *   y  = T(T(x_hat) * w')                with RMSNORM_FLAG_ROUND_XHAT
 *   gx = r * (w' * gy - x_hat * mean(x_hat * w' * gy))
 *   gw = sum over rows of gy * x_hat     fp32 accumulation, one rounding
 *
 * Range: squares are summed in fp32. A row whose sum of squares overflows
 * fp32 (bf16 or f32 values beyond about 1e19), or underflows it while
 * eps < 2^-40, is summed again scaled by an exact power of two (2^-80 or
 * 2^80), and backward's sum of x * w' * gy likewise where r is below 2^-64 or
 * above 2^64. So every finite row whose largest |x| lies in [2^-100,
 * FLT_MAX] gets r (and y, gx, gw) to fp32 accuracy, for any eps up to 2^100;
 * gx and gw also need the backward's fp32 sum of x * w' * gy over the row to
 * stay finite (guaranteed while the row's 2-norm of w' * gy is below about
 * 2^48 where rms(x) is near 2^64, and far beyond that for smaller rows;
 * x near 1e19 with gy near 1e20 overflows it, and gx is then NaN), and
 * gx's accuracy needs that sum's terms x * w' * gy (times 2^80 where r is
 * above 2^64) to be normal floats, not subnormal (x near 2^-63 with gy near
 * 2^-85 gives terms near 2^-148, and gx then has errors up to 1e-2 of its
 * largest element);
 * where the row's rms exceeds 2^126, r and gx (which scales with r) are
 * subnormal floats, with a subnormal's precision. Ordinary rows never take
 * these paths, and f16 rows never need them. The CPU backend does this for
 * every row; the CUDA backend only in its looped band: D above 262144 (16-bit)
 * or 131072 (fp32) on GPUs that co-schedule clusters of 16 CTAs (the H200),
 * above 131072 / 65536 with clusters of 8, above 16384 / 8192 before sm_90.
 * For smaller D the CUDA backend uses the plain fp32 sum, so there a
 * row whose squares overflow gives r = 0 (y = 0, or NaN where |x| is inf),
 * and one whose squares underflow with eps == 0 gives r = inf.
 *
 * Operands are row-major matrices of `rows` x `cols` elements with a row
 * stride in elements (>= cols). Vectors (weight, gw) have `cols` elements,
 * rstd has `rows` floats. All pointers are host pointers for the CPU backend
 * and device pointers for the CUDA backend.
 *
 * In-place use: forward may run with y == x (same row stride); backward may
 * run with gx == gy (same row stride). Any other overlap between an output
 * and another operand is rejected with RMSNORM_STATUS_OVERLAP. The check is
 * exact for matrices of equal row stride (interleaved views of one buffer)
 * and conservative otherwise: operands with different strides, or a vector
 * placed in a matrix's row padding, are rejected when their byte ranges
 * intersect even if no byte is shared.
 */
#ifndef RMSNORM_RMSNORM_H_
#define RMSNORM_RMSNORM_H_

#include <stddef.h>
#include <stdint.h>

/* RMSNORM_API marks the entry points: the only symbols a shared build exports
 * (the library is compiled with hidden visibility). On Windows the library's
 * own sources define RMSNORM_BUILDING (dllexport) and the static library's
 * users RMSNORM_STATIC_DEFINE (neither; CMake sets both); other users of the
 * DLL get dllimport. */
#ifndef RMSNORM_API
#if defined(_WIN32) || defined(__CYGWIN__)
#if defined(RMSNORM_STATIC_DEFINE)
#define RMSNORM_API
#elif defined(RMSNORM_BUILDING)
#define RMSNORM_API __declspec(dllexport)
#else
#define RMSNORM_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define RMSNORM_API __attribute__((visibility("default")))
#else
#define RMSNORM_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define RMSNORM_VERSION_MAJOR 0
#define RMSNORM_VERSION_MINOR 1
#define RMSNORM_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, what rmsnorm_version() returns */
#define RMSNORM_VERSION (RMSNORM_VERSION_MAJOR * 10000 + RMSNORM_VERSION_MINOR * 100 + RMSNORM_VERSION_PATCH)

typedef enum rmsnorm_status {
  RMSNORM_STATUS_SUCCESS = 0,
  RMSNORM_STATUS_NULL_POINTER = 1,        /* a required pointer is NULL */
  RMSNORM_STATUS_INVALID_SHAPE = 2,       /* rows < 0, cols <= 0 or cols > 2^31 - 64; an operand
                                             whose byte extent overflows int64 or runs past the
                                             top of the address space; shapes that disagree */
  RMSNORM_STATUS_INVALID_STRIDE = 3,      /* a row stride < cols */
  RMSNORM_STATUS_INVALID_EPS = 4,         /* eps negative, NaN or infinite */
  RMSNORM_STATUS_INVALID_DTYPE = 5,       /* unknown dtype */
  RMSNORM_STATUS_INVALID_OPTION = 6,      /* unknown flag, gw mode or backend kind; device < -1 (CUDA);
                                             num_threads < 0 (CPU) */
  RMSNORM_STATUS_MISALIGNED = 7,          /* a pointer is not aligned to its element size */
  RMSNORM_STATUS_WORKSPACE_TOO_SMALL = 8, /* workspace smaller than the queried size */
  RMSNORM_STATUS_OVERLAP = 9,             /* an output overlaps another operand */
  RMSNORM_STATUS_WRONG_MEMORY_SPACE = 10, /* device pointer to the CPU backend or the reverse */
  RMSNORM_STATUS_BACKEND_UNAVAILABLE = 11,/* CUDA backend not built, no such device, or one older than sm_80 */
  RMSNORM_STATUS_CUDA_ERROR = 12,         /* a CUDA runtime call failed */
  RMSNORM_STATUS_INTERNAL_ERROR = 13
} rmsnorm_status_t;

typedef enum rmsnorm_dtype {
  RMSNORM_DTYPE_F32 = 0,
  RMSNORM_DTYPE_F16 = 1, /* IEEE binary16 */
  RMSNORM_DTYPE_BF16 = 2 /* bfloat16 */
} rmsnorm_dtype_t;

/* problem.flags */
#define RMSNORM_FLAG_WEIGHT_OFFSET 1u /* w' = 1 + w (Gemma), the 1 added in fp32 */
#define RMSNORM_FLAG_ROUND_XHAT 2u    /* forward: y = T(T(x_hat) * w') (HF Llama style) */
#define RMSNORM_FLAG_NO_PDL 4u        /* CUDA: launch without programmatic dependent launch */
#define RMSNORM_FLAG_TRUSTED_MEMORY 8u /* skip the memory-space check (below) */
#define RMSNORM_FLAG_WEIGHT_F32 16u   /* the weight is fp32 (float*) whatever problem->dtype (below) */
/* y (forward) and gy (backward) in dtype dt, an rmsnorm_dtype_t, whatever problem->dtype (below) */
#define RMSNORM_FLAG_Y_DTYPE(dt) (((uint32_t)(dt) + 1u) << 8)
#define RMSNORM_FLAG_Y_DTYPE_MASK (3u << 8)
#define RMSNORM_FLAG_RESIDUAL_F32 1024u /* the residual stream (residual, h, g_h, gx) in fp32 (below) */
#define RMSNORM_FLAG_WEIGHT_Y_DTYPE 2048u /* fp32 x: the weight (and gw) in y's 16-bit dtype (below) */
/* RMSNORM_FLAG_Y_DTYPE(dt): the output dtype chosen apart from x's (bf16 y
 * from an fp32 residual stream, say). rmsnorm_forward writes y = Y(x_hat * w')
 * (or Y(T(x_hat) * w') with RMSNORM_FLAG_ROUND_XHAT), rounded once to dt = Y;
 * rmsnorm_backward reads gy in Y and writes gx in problem->dtype; rstd and gw
 * are as without the flag (the workspace on CUDA is not: ask
 * rmsnorm_backward_workspace_size with the flag). Bits 8-9 hold dt + 1; 0 (no flag), or
 * dt equal to problem->dtype, is the plain form. y == x (and gx == gy) in place
 * needs equal dtypes; otherwise any overlap is RMSNORM_STATUS_OVERLAP. The
 * fused operations (rmsnorm_add_*, rmsnorm_*_quant) refuse another Y with
 * RMSNORM_STATUS_INVALID_OPTION. CPU backend: forward and backward. CUDA
 * backend: forward and backward through the looped band's kernels at every D
 * (y and gy by element; slower than the plain path below the looped band),
 * so rstd is summed in that kernel's order and may differ from the plain
 * call's in the last bits. */
/* RMSNORM_FLAG_WEIGHT_Y_DTYPE: with RMSNORM_DTYPE_F32 x and
 * RMSNORM_FLAG_Y_DTYPE(dt) of f16 or bf16, the weight is in dt (an fp32
 * residual stream's h normalized with the model's 16-bit weight, as
 * rmsnorm_add_forward takes it with RMSNORM_FLAG_RESIDUAL_F32): w' =
 * float(w) (+ 1), and gw in dt (RMSNORM_GW_STORE, RMSNORM_GW_ACCUMULATE) or
 * fp32 (the _F32 modes). rmsnorm_forward, rmsnorm_backward and the
 * workspace query take it; with 16-bit x, without a 16-bit Y, or with
 * RMSNORM_FLAG_WEIGHT_F32 it is RMSNORM_STATUS_INVALID_OPTION (as it is for
 * the operations that refuse RMSNORM_FLAG_Y_DTYPE). rstd, y and gx are
 * those of the fp32 weight float(w), bit for bit. */
/* RMSNORM_FLAG_WEIGHT_F32: mixed precision, as AMP and FSDP keep master
 * weights: x, y, gy and gx in problem->dtype, the weight in fp32, w' =
 * float(w) (+ 1), and gw in fp32 in every gw mode (RMSNORM_GW_STORE and
 * RMSNORM_GW_ACCUMULATE write the weight's dtype, which is now fp32). With
 * RMSNORM_DTYPE_F32 it changes nothing. The weight must be 4-byte aligned.
 * CPU backend: every operation. CUDA backend: every operation. Below the
 * looped band (D <= 262144 on the H200) the forward, the residual add and
 * the backward run the plain call's kernels with the weight read as fp32
 * (rstd is the plain call's bit for bit); in the looped band, and for the
 * quantized forwards at every D, the looped band's kernels. Forward and
 * backward take the same band, so the backward's recomputed rstd is the
 * forward's. */
/* RMSNORM_FLAG_RESIDUAL_F32: an fp32 residual stream with f16 / bf16 x, for
 * rmsnorm_add_forward and rmsnorm_add_backward. Forward: residual and h are
 * float; h = float(x) + residual (one fp32 add), and y = T(rms_norm(h) * w')
 * from h's fp32 values (y, x and the weight in problem->dtype T;
 * RMSNORM_FLAG_ROUND_XHAT rounds x_hat to h's dtype, fp32, so changes nothing). Backward:
 * h, g_h and gx are float, gy and the weight are in T, gx = gx_norm + g_h in
 * fp32 (residual's gradient; x's is T(gx)), and gw is in the weight's dtype.
 * h may be residual itself (and gx may be g_h); h over x, or gx over gy, is
 * RMSNORM_STATUS_OVERLAP. With RMSNORM_DTYPE_F32 it changes nothing. Both
 * backends; CUDA runs the forward as one looped-band kernel (the add, then the
 * norm of the fp32 h) at every D, and the backward as the looped band's kernel
 * on h. The other operations (the quantized
 * add among them) return RMSNORM_STATUS_INVALID_OPTION. */
/* RMSNORM_FLAG_TRUSTED_MEMORY: the caller vouches that every operand lies in
 * memory the backend can use (for CUDA: memory of the backend's device, or
 * managed or registered host memory; for the CPU backend: host memory), as a
 * framework does that has already checked its tensors' devices. The library
 * then skips the one check that asks the CUDA runtime about each operand
 * (cudaPointerGetAttributes: four per forward call, seven per backward call;
 * 0.3-0.7 us per call in all on an H200 machine), so
 * RMSNORM_STATUS_WRONG_MEMORY_SPACE is never
 * returned and a wrong pointer faults (CUDA: an illegal-address error on the
 * stream; CPU: a crash) instead. Every other check still runs. */
/* Programmatic dependent launch (CUDA, compute capability 9.0+, on unless
 * RMSNORM_FLAG_NO_PDL): each kernel is launched so that it may be scheduled
 * while the previous kernel in the stream is still running, and waits
 * (griddepcontrol.wait) for that kernel to complete and its memory to be
 * visible before it reads or writes any operand. Each kernel also lets the
 * next kernel be scheduled early; a next kernel that opted in to this must
 * itself wait before reading our outputs, as the CUDA programming model
 * requires. Stream order and results are those of plain launches: only the
 * launch latency between consecutive kernels is hidden. Ignored by the CPU
 * backend and on older GPUs. */

typedef enum rmsnorm_backend_kind {
  RMSNORM_BACKEND_CPU = 0,
  RMSNORM_BACKEND_CUDA = 1
} rmsnorm_backend_kind_t;

/* How backward writes the weight gradient. "Weight dtype" is problem.dtype. */
typedef enum rmsnorm_gw_mode {
  RMSNORM_GW_NONE = 0,           /* gx only (no weight, or a frozen weight) */
  RMSNORM_GW_STORE = 1,          /* gw = sum, rounded to the weight dtype */
  RMSNORM_GW_STORE_F32 = 2,      /* gw (float*) = sum */
  RMSNORM_GW_ACCUMULATE = 3,     /* gw = T(float(gw) + sum), weight dtype */
  RMSNORM_GW_ACCUMULATE_F32 = 4  /* gw (float*) += sum */
} rmsnorm_gw_mode_t;

typedef struct rmsnorm_problem {
  int64_t rows;   /* >= 0; 0 writes nothing but gw (see rmsnorm_backward) */
  int64_t cols;   /* D, >= 1 */
  int32_t dtype;  /* rmsnorm_dtype_t of x, y, weight, gy, gx */
  uint32_t flags; /* RMSNORM_FLAG_* */
  float eps;      /* >= 0 and finite */
} rmsnorm_problem_t;

typedef struct rmsnorm_backend {
  int32_t kind;        /* rmsnorm_backend_kind_t */
  int32_t device;      /* CUDA device ordinal, or -1 for the current device;
                          a call makes it current and then restores the
                          thread's device and context, except on a thread
                          whose previous device has no primary context (one
                          that never used CUDA reports device 0): it keeps
                          this device current, so that no context is created
                          on the other */
  void* stream;        /* cudaStream_t of that device (not checked: a stream of
                          another device makes the launch fail, a CUDA error);
                          NULL is the legacy default stream */
  int32_t num_threads; /* CPU worker threads; 0 = all hardware threads */
} rmsnorm_backend_t;

/* Name of a status ("RMSNORM_STATUS_OVERLAP"); never NULL. */
RMSNORM_API const char* rmsnorm_status_string(rmsnorm_status_t status);

/* Message of the last failing call on this thread (argument and reason);
 * "" when the last call succeeded. Valid until the next call on this thread. */
RMSNORM_API const char* rmsnorm_last_error(void);

/* RMSNORM_VERSION of the library as built, so that a program (or an FFI
 * binding, which cannot read the macros) can check at run time that the
 * library it loaded is the one its header describes (before 1.0 any version
 * may change the ABI, so compare the whole number). */
RMSNORM_API int32_t rmsnorm_version(void);

/* Size in bytes of an element of dtype, 0 for an unknown dtype. */
RMSNORM_API size_t rmsnorm_dtype_size(int32_t dtype);

/* 1 when the library was built with the CUDA backend and a CUDA device is
 * present, else 0. */
RMSNORM_API int rmsnorm_cuda_available(void);

/* Defaults: rows 0, cols 0, dtype F32, flags 0, eps 1e-5. */
RMSNORM_API rmsnorm_problem_t rmsnorm_problem_default(void);
RMSNORM_API rmsnorm_backend_t rmsnorm_backend_cpu(int32_t num_threads);
RMSNORM_API rmsnorm_backend_t rmsnorm_backend_cuda(int32_t device, void* stream);

/* y = rms_norm(x) * w'. weight may be NULL (w' = 1); rstd (rows floats) may
 * be NULL. Asynchronous on the CUDA backend (ordered on backend->stream).
 * CUDA: as in rmsnorm_backward, a row of x that does not start on 16 bytes
 * may be read from the aligned 16-byte block holding its first element (the
 * bytes before it are ignored, and must lie in the same allocation: true for
 * any allocation that starts 16-byte aligned). */
RMSNORM_API rmsnorm_status_t rmsnorm_forward(const rmsnorm_problem_t* problem,
                                             const void* x, int64_t x_row_stride,
                                             const void* weight,
                                             void* y, int64_t y_row_stride,
                                             float* rstd,
                                             const rmsnorm_backend_t* backend);

/* Residual add and RMSNorm (pre-norm), in one pass over x and residual:
 *   h = T(x + residual)        (the sum in fp32, rounded once to the dtype)
 *   y = rms_norm(h) * w'       (bit for bit rmsnorm_forward of h as stored)
 *   rstd (optional) of h, as in rmsnorm_forward.
 * x, residual, h and y are rows x cols of problem->dtype, each with its own
 * row stride. h may be residual itself or x itself, and x may be residual
 * itself (the same pointer and row stride: the residual stream updated in
 * place); any other overlap among x, residual and h, and any overlap of y or
 * rstd with another operand, is RMSNORM_STATUS_OVERLAP. Flags, weight and the checks as in
 * rmsnorm_forward. */
RMSNORM_API rmsnorm_status_t rmsnorm_add_forward(const rmsnorm_problem_t* problem,
                                                 const void* x, int64_t x_row_stride,
                                                 const void* residual, int64_t residual_row_stride,
                                                 const void* weight,
                                                 void* h, int64_t h_row_stride,
                                                 void* y, int64_t y_row_stride,
                                                 float* rstd,
                                                 const rmsnorm_backend_t* backend);

/* Quantized output: q = quant(y), y exactly rmsnorm_forward's (in
 * problem->dtype, with its flags; RMSNORM_FLAG_ROUND_XHAT gives vLLM's y).
 *   RMSNORM_QUANT_STATIC:  v = y * (1 / *scale)
 *   RMSNORM_QUANT_PER_ROW: s = max(min(max|y_row|, *scale_ub) / qmax, min_scale),
 *                          written to row_scales (fp32, one per row; y ~ q s);
 *                          fp8: v = y / s; int8: v = y * (1 / s)
 * fp8 e4m3fn: v clamped to [-448, 448] (NaN gives 448), nearest, ties to even.
 * int8: nearest, ties to even, saturated to [-128, 127]; NaN gives 0.
 * qmax 448 (fp8) or 127 (int8); min_scale 1 / (448 * 512) (fp8) or
 * FLT_EPSILON (int8); max|y| ignores NaN; scale_ub (optional) only with fp8
 * per row. These are vLLM's rules (docs/fusions.md). scale and scale_ub are
 * memory of the backend (device memory on CUDA), read by the kernels and not
 * checked: a static scale of 0 makes 1 / scale = inf (nonzero y saturate, y = 0
 * gives NaN: 448 or 0), a negative one flips the signs; scale_ub <= 0 gives
 * min_scale and a NaN scale_ub is ignored (fminf). q: rows x cols bytes with
 * its own row stride. rstd (optional) is written as by rmsnorm_forward, and
 * y is always T(x * rstd * w') (or T(T(x * rstd) * w') with ROUND_XHAT) of
 * the rstd this call computes. CUDA: where rmsnorm_forward would run its
 * rows-band 16-byte kernel (D <= 16384 at 16-bit, 8192 at fp32; every row of
 * x and the weight 16-byte aligned; not with RMSNORM_FLAG_WEIGHT_F32) and q's
 * rows are aligned to 8 bytes (16-bit) or 4 (fp32), that kernel quantizes in
 * registers: rstd and y are bit for bit rmsnorm_forward's. Elsewhere one CTA
 * per row sums in its own order, so rstd may differ from rmsnorm_forward's in
 * the last bits (within the same tolerance). */
typedef enum rmsnorm_quant_kind { RMSNORM_QUANT_FP8_E4M3 = 0, RMSNORM_QUANT_INT8 = 1 } rmsnorm_quant_kind_t;
typedef enum rmsnorm_quant_scale { RMSNORM_QUANT_STATIC = 0, RMSNORM_QUANT_PER_ROW = 1 } rmsnorm_quant_scale_t;
typedef struct rmsnorm_quant {
  int32_t kind;           /* rmsnorm_quant_kind_t */
  int32_t scale_mode;     /* rmsnorm_quant_scale_t */
  const float* scale;     /* STATIC: the scale (one float) */
  float* row_scales;      /* PER_ROW: rows floats, written */
  const float* scale_ub;  /* PER_ROW, fp8: upper bound on max|y| (one float), or NULL */
} rmsnorm_quant_t;

RMSNORM_API rmsnorm_status_t rmsnorm_forward_quant(const rmsnorm_problem_t* problem,
                                                   const void* x, int64_t x_row_stride,
                                                   const void* weight,
                                                   const rmsnorm_quant_t* quant,
                                                   void* q, int64_t q_row_stride,
                                                   float* rstd,
                                                   const rmsnorm_backend_t* backend);

/* The residual add with a quantized output: h = T(x + residual) written to h
 * (as rmsnorm_add_forward: h may be x or residual exactly), then q and the
 * scales exactly as rmsnorm_forward_quant of that h, and rstd (optional).
 * q and the row scales are disjoint from every other operand. */
RMSNORM_API rmsnorm_status_t rmsnorm_add_forward_quant(const rmsnorm_problem_t* problem,
                                                       const void* x, int64_t x_row_stride,
                                                       const void* residual, int64_t residual_row_stride,
                                                       const void* weight,
                                                       void* h, int64_t h_row_stride,
                                                       const rmsnorm_quant_t* quant,
                                                       void* q, int64_t q_row_stride,
                                                       float* rstd,
                                                       const rmsnorm_backend_t* backend);

/* Block scales: one fp32 scale per block of block_cols (64 or 128)
 * consecutive columns of a row, the layout that fp8 GEMMs with 1 x 128 (or
 * 1 x 64) block scaling read. A row has nb = ceil(cols / block_cols) blocks;
 * the last holds cols - (nb - 1) * block_cols columns. Each block gets
 * RMSNORM_QUANT_PER_ROW's rule applied to it alone:
 *   s = max(min(max|y_block|, *scale_ub) / qmax, min_scale),
 *   fp8: v = y / s; int8: v = y * (1 / s); then as rmsnorm_forward_quant
 * (vLLM's rms_norm_per_block_quant rule; docs/fusions.md). y, rstd and every
 * other rule are rmsnorm_forward_quant's. The scale of block b of row r goes
 * to scales[r * scales_row_stride + b * scales_block_stride]: row-major
 * (scales_block_stride == 1, scales_row_stride >= nb) or column-major
 * (scales_row_stride == 1, scales_block_stride >= rows, the transposed
 * layout); any padding is left unwritten; other strides are
 * RMSNORM_STATUS_INVALID_STRIDE. The overlap checks see the scales as that
 * strided matrix: an operand in its padding is refused unless it has the
 * same row stride in bytes (then it is checked row by row, as any two
 * matrices). scale_ub (optional, fp8 only) is one float.
 * CUDA: fused into the same kernel as rmsnorm_forward_quant where a row's
 * threads cover whole blocks (rstd and y then bit for bit rmsnorm_forward's),
 * else the one-CTA-per-row kernel. */
typedef struct rmsnorm_block_quant {
  int32_t kind;                /* rmsnorm_quant_kind_t */
  int32_t block_cols;          /* 64 or 128 */
  float* scales;               /* written: rows x nb floats, strided as above */
  int64_t scales_row_stride;   /* in floats */
  int64_t scales_block_stride; /* in floats */
  const float* scale_ub;       /* fp8: upper bound on a block's max|y| (one float), or NULL */
} rmsnorm_block_quant_t;

RMSNORM_API rmsnorm_status_t rmsnorm_forward_block_quant(const rmsnorm_problem_t* problem,
                                                         const void* x, int64_t x_row_stride,
                                                         const void* weight,
                                                         const rmsnorm_block_quant_t* quant,
                                                         void* q, int64_t q_row_stride,
                                                         float* rstd,
                                                         const rmsnorm_backend_t* backend);

/* The residual add with block scales: h as rmsnorm_add_forward_quant, then q
 * and the scales exactly as rmsnorm_forward_block_quant of that h. */
RMSNORM_API rmsnorm_status_t rmsnorm_add_forward_block_quant(const rmsnorm_problem_t* problem,
                                                             const void* x, int64_t x_row_stride,
                                                             const void* residual, int64_t residual_row_stride,
                                                             const void* weight,
                                                             void* h, int64_t h_row_stride,
                                                             const rmsnorm_block_quant_t* quant,
                                                             void* q, int64_t q_row_stride,
                                                             float* rstd,
                                                             const rmsnorm_backend_t* backend);

/* Workspace that rmsnorm_backward needs for this problem (its flags
 * included: on CUDA RMSNORM_FLAG_WEIGHT_F32, RMSNORM_FLAG_Y_DTYPE and
 * RMSNORM_FLAG_RESIDUAL_F32 take other kernels), gw mode and backend.
 * 0 when gw_mode is RMSNORM_GW_NONE. On CUDA it never exceeds
 * 2 * (multiprocessors) * cols * 4 bytes, whatever the number of rows. */
RMSNORM_API rmsnorm_status_t rmsnorm_backward_workspace_size(const rmsnorm_problem_t* problem,
                                                             int32_t gw_mode,
                                                             const rmsnorm_backend_t* backend,
                                                             size_t* bytes);

/* gx (and gw, per gw_mode) of y = rms_norm(x) * w' given gy = dL/dy.
 * rstd: the forward's rstd, or NULL to recompute it. weight may be NULL only
 * with RMSNORM_GW_NONE. workspace: at least the queried size, 16-byte aligned
 * (may be NULL when that size is 0). Deterministic: the same inputs on the
 * same device give bitwise identical gx and gw. With rows == 0, gw is the
 * empty sum: the store modes write zeros, the accumulate modes leave gw
 * unchanged (bit for bit).
 * CUDA: a row of x or gy that does not start on 16 bytes is read from the
 * aligned 16-byte block holding its first element (the bytes before it are
 * ignored, and must lie in the same allocation: true for any allocation
 * that starts 16-byte aligned). */
RMSNORM_API rmsnorm_status_t rmsnorm_backward(const rmsnorm_problem_t* problem,
                                              const void* x, int64_t x_row_stride,
                                              const void* weight,
                                              const void* gy, int64_t gy_row_stride,
                                              const float* rstd,
                                              void* gx, int64_t gx_row_stride,
                                              void* gw, int32_t gw_mode,
                                              void* workspace, size_t workspace_bytes,
                                              const rmsnorm_backend_t* backend);

/* The backward of rmsnorm_add_forward. h is the forward's h (its x for the
 * norm), g_h (required) the gradient reaching h along the residual stream (from
 * h's other consumer). gx, the gradient of both x and residual:
 *   gx = T(T(gx_norm) + g_h)
 * where T(gx_norm) is bit for bit rmsnorm_backward's gx for h, gy and rstd,
 * and the sum is in fp32, rounded once: what autograd's accumulation of h's
 * two gradients gives. gw and the workspace (rmsnorm_backward_workspace_size)
 * as in rmsnorm_backward. gx may be gy itself or g_h itself (the same pointer
 * and row stride); g_h overlaps no other operand. */
RMSNORM_API rmsnorm_status_t rmsnorm_add_backward(const rmsnorm_problem_t* problem,
                                                  const void* h, int64_t h_row_stride,
                                                  const void* weight,
                                                  const void* gy, int64_t gy_row_stride,
                                                  const float* rstd,
                                                  const void* g_h, int64_t g_h_row_stride,
                                                  void* gx, int64_t gx_row_stride,
                                                  void* gw, int32_t gw_mode,
                                                  void* workspace, size_t workspace_bytes,
                                                  const rmsnorm_backend_t* backend);

/* rmsnorm_add_backward of the fp32 residual stream (RMSNORM_FLAG_RESIDUAL_F32
 * required) that also writes x's gradient in x's dtype T:
 *   gx_x = T(gx)
 * rounded to nearest even, bit for bit what casting gx after
 * rmsnorm_add_backward gives, in the same pass over the rows (one read of gx
 * fewer). gx (float) is the residual's gradient, as in rmsnorm_add_backward,
 * and every other argument and rule is that function's. gx_x (T, rows of
 * gx_x_row_stride elements) overlaps no other operand. With rows == 0 gx_x is
 * not read or written (it may be NULL). */
RMSNORM_API rmsnorm_status_t rmsnorm_add_backward_x(const rmsnorm_problem_t* problem,
                                                    const void* h, int64_t h_row_stride,
                                                    const void* weight,
                                                    const void* gy, int64_t gy_row_stride,
                                                    const float* rstd,
                                                    const void* g_h, int64_t g_h_row_stride,
                                                    void* gx, int64_t gx_row_stride,
                                                    void* gx_x, int64_t gx_x_row_stride,
                                                    void* gw, int32_t gw_mode,
                                                    void* workspace, size_t workspace_bytes,
                                                    const rmsnorm_backend_t* backend);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RMSNORM_RMSNORM_H_ */
