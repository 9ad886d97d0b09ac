/* kiln: eager tensors in C, compiled on request. The whole public API.
 *
 *   kiln_scope_begin();
 *   int64_t shape[2] = {2, 3};
 *   kiln_tensor *x = kiln_randn(2, shape, 42);
 *   kiln_tensor *y = kiln_keep(kiln_add(kiln_mul(x, x), kiln_exp(x)));
 *   kiln_scope_end();                  // releases x and the temporaries
 *   if (!y) fprintf(stderr, "%s\n", kiln_last_error());
 *   kiln_print(y);
 *   kiln_release(y);
 *
 * Conventions:
 * - One rule for every tensor kiln hands out (an op's result, kiln_call's
 *   outputs, a loaded file): it is a new reference. Inside a scope that
 *   reference belongs to the scope: kiln_scope_end() releases it unless
 *   kiln_keep() moved it out. Outside any scope the caller owns it and calls
 *   kiln_release(). Releasing a tensor a scope owns before the scope ends is
 *   allowed: its last reference released takes it out of the scope.
 * - Failure returns NULL or a negative int and sets a thread-local message,
 *   read with kiln_last_error(), naming the function, the operands' shapes and
 *   dtypes and what was wrong; it stays pending until a call succeeds (returns
 *   a tensor, 0 or a value), which clears it as kiln_clear_error() does.
 *   Messages never nest. A NULL operand is an error, never a crash; while an
 *   error is pending it keeps that error, so a nested expression reports the
 *   first thing that went wrong: kiln_add(kiln_mul(a, b), c) reports
 *   kiln_mul's. (C leaves the order of a call's arguments open: a sibling
 *   argument that succeeds after the failing one clears its error first.) An
 *   optional operand's NULL (kiln_layer_norm's gamma and beta) means none.
 * - Broadcasting follows numpy. Type promotion follows PyTorch: bool < i32 <
 *   i64 < f32 < f64, and a 0-d tensor counts only when it raises the category
 *   (an f32 0-d tensor times an f64 tensor stays f64; times an i32 tensor
 *   gives f32). Scalars act as Python numbers do in PyTorch (see *_scalar).
 * - Axes may be negative, counting from the end.
 * - A tensor has at most 2^59 elements, and an empty one's nonzero sizes
 *   multiply to at most 2^59 too: a larger shape, given or computed (by
 *   broadcasting, expand, reshape, concat or matmul, eagerly or traced), is
 *   an error naming the function and its operands, never a wrapped size.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KILN_BUILDING) && defined(__GNUC__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

typedef struct kiln_tensor kiln_tensor;
typedef struct kiln_fn kiln_fn;
typedef enum { KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL } kiln_dtype;
typedef enum { KILN_CPU, KILN_CUDA } kiln_device;
typedef enum {
    KILN_BACKEND_AUTO,
    KILN_BACKEND_LLVM,
    KILN_BACKEND_NVRTC,
    KILN_BACKEND_INTERP
} kiln_backend;

#define KILN_ALL INT_MIN  /* axis: reduce (or squeeze) over every axis */
#define KILN_MAX_DIMS 8   /* the most dimensions a tensor may have */

/* -- Version --------------------------------------------------------------- */

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"

/* The version of the library running, "major.minor.patch"; KILN_VERSION_STRING
 * is the one the program was compiled against. */
KILN_API const char *kiln_version(void);
/* The instruction set the eager kernels run at, chosen once at start-up:
 * "x86-64", "x86-64-v2", "x86-64-v3" or "x86-64-v4", the best this CPU runs
 * ("x86-64-v3-zen" and "x86-64-v4-zen": the same tuned for AMD's Zen, on
 * AMD CPUs), or another this CPU runs named by KILN_ISA; "native" in a
 * -Dnative=true build. */
KILN_API const char *kiln_eager_isa(void);

/* -- Errors and ownership ------------------------------------------------- */

/* The message of the last error on this thread, or "" if there is none. */
KILN_API const char *kiln_last_error(void);
/* Forgets this thread's pending error (as any call that succeeds does), so the
 * next NULL operand reports itself. */
KILN_API void kiln_clear_error(void);
/* Adds a reference to t and returns t (NULL stays NULL). */
KILN_API kiln_tensor *kiln_retain(kiln_tensor *t);
/* Drops one reference; the tensor is freed with its last one (and leaves the
 * scope that owned it). NULL is ignored. Releasing a tensor that is already
 * dead is an error in debug builds, whose headers of released tensors stay
 * poisoned a while; undefined behaviour otherwise. */
KILN_API void kiln_release(kiln_tensor *t);
/* Opens a scope: tensors returned until the matching kiln_scope_end belong to it. */
KILN_API void kiln_scope_begin(void);
/* Closes the innermost scope, releasing every tensor it owns. */
KILN_API void kiln_scope_end(void);
/* Moves t out of the innermost scope to the enclosing one (or to the caller if
 * none) and returns t. A tensor the scope does not own is returned unchanged. */
KILN_API kiln_tensor *kiln_keep(kiln_tensor *t);
/* Tensors alive in this process, all threads (for leak checks). */
KILN_API int64_t kiln_live_tensors(void);
/* Bytes of tensor storage alive in this process, all threads. */
KILN_API int64_t kiln_live_bytes(void);
/* The most kiln_live_bytes has been since the last reset (or the start). */
KILN_API int64_t kiln_peak_live_bytes(void);
/* Starts a new high-water mark at the current live bytes. */
KILN_API void kiln_reset_peak_live_bytes(void);

/* -- Creation and data ----------------------------------------------------- */

/* A new contiguous tensor holding a copy of data (row-major, numel elements). */
KILN_API kiln_tensor *kiln_from_data(kiln_dtype dt, int ndim, const int64_t *shape, const void *data);
/* A new tensor whose contents are unspecified. */
KILN_API kiln_tensor *kiln_empty(kiln_dtype dt, int ndim, const int64_t *shape);
/* A new tensor of zeros. */
KILN_API kiln_tensor *kiln_zeros(kiln_dtype dt, int ndim, const int64_t *shape);
/* A new tensor of ones. */
KILN_API kiln_tensor *kiln_ones(kiln_dtype dt, int ndim, const int64_t *shape);
/* A new tensor filled with value converted to dt (as kiln_cast converts). */
KILN_API kiln_tensor *kiln_full(kiln_dtype dt, int ndim, const int64_t *shape, double value);
/* start, start+step, ... while before stop (numpy.arange); step may be negative, not 0. */
KILN_API kiln_tensor *kiln_arange(double start, double stop, double step, kiln_dtype dt);
/* f32 uniform in [0,1), the same values for the same seed on any thread count. */
KILN_API kiln_tensor *kiln_rand(int ndim, const int64_t *shape, uint64_t seed);
/* f32 standard normal, the same values for the same seed on any thread count. */
KILN_API kiln_tensor *kiln_randn(int ndim, const int64_t *shape, uint64_t seed);
/* A 0-d f32 tensor. */
KILN_API kiln_tensor *kiln_scalar(double value);
/* The global generator that kiln_dropout draws from: Philox4x32-10, counter
 * based, a seed and an offset in 32-bit words that each draw advances (by
 * its element count rounded up to 4). The same seed and offset give the
 * same values on the CPU and on CUDA, eagerly and traced; a traced call
 * draws what the body run eagerly from the same state would. (PyTorch's own
 * Philox layout differs: the masks are not torch's.) manual_seed sets the
 * seed and offset 0; set_rng_state rounds the offset up to a whole block. */
KILN_API void kiln_manual_seed(uint64_t seed);
KILN_API void kiln_rng_state(uint64_t *seed, uint64_t *offset);
KILN_API void kiln_set_rng_state(uint64_t seed, uint64_t offset);
/* steps values from start to end, both included (torch.linspace: the first
 * half counted from start, the rest from end); one step gives start. */
KILN_API kiln_tensor *kiln_linspace(double start, double end, int64_t steps, kiln_dtype dt);
/* [n, m] with ones on the diagonal, zeros elsewhere. */
KILN_API kiln_tensor *kiln_eye(kiln_dtype dt, int64_t n, int64_t m);
/* New tensors of a's dtype, shape and device: zeros, ones, value (converted
 * as kiln_cast converts), unspecified. Inside a marked body they are
 * constants of the trace (empty_like's zeros), not captured tensors. */
KILN_API kiln_tensor *kiln_zeros_like(kiln_tensor *a);
KILN_API kiln_tensor *kiln_ones_like(kiln_tensor *a);
KILN_API kiln_tensor *kiln_full_like(kiln_tensor *a, double value);
KILN_API kiln_tensor *kiln_empty_like(kiln_tensor *a);
/* Number of dimensions, or -1 for NULL. */
KILN_API int kiln_ndim(const kiln_tensor *t);
/* The shape (kiln_ndim entries), borrowed from t; NULL for NULL. */
KILN_API const int64_t *kiln_shape(const kiln_tensor *t);
/* The strides in elements (kiln_ndim entries), borrowed from t; NULL for NULL. */
KILN_API const int64_t *kiln_strides(const kiln_tensor *t);
/* Number of elements, or -1 for NULL. */
KILN_API int64_t kiln_numel(const kiln_tensor *t);
/* The element type; KILN_F32 for NULL (check kiln_ndim first if unsure). */
KILN_API kiln_dtype kiln_dtype_of(const kiln_tensor *t);
/* Bytes per element of dt, or 0 for a value outside kiln_dtype. */
KILN_API size_t kiln_dtype_size(kiln_dtype dt);
/* "f32", "f64", "i32", "i64", "bool", or "?" for a value outside kiln_dtype. */
KILN_API const char *kiln_dtype_name(kiln_dtype dt);
/* The device holding the data; KILN_CPU for NULL. */
KILN_API kiln_device kiln_device_of(const kiln_tensor *t);
/* True when two tensors are views of one storage. */
KILN_API bool kiln_shares_storage(const kiln_tensor *a, const kiln_tensor *b);
/* Copies t, row-major and contiguous, into dst; nbytes must be at least
 * kiln_numel(t) * kiln_dtype_size(dtype). Returns 0 or a negative error. */
KILN_API int kiln_copy_to_host(const kiln_tensor *t, void *dst, size_t nbytes);
/* The value of a one-element tensor as a double; NaN and an error otherwise. */
KILN_API double kiln_item(const kiln_tensor *t);
/* t on device d: t itself (a new reference) if already there, else a copy. */
KILN_API kiln_tensor *kiln_to_device(kiln_tensor *t, kiln_device d);

/* CUDA device memory, counted by kiln's caching allocator. */
typedef struct {
    int64_t in_use_bytes;      /* in blocks held by tensors and plans */
    int64_t peak_in_use_bytes;
    int64_t cached_bytes;      /* in freed blocks kept for reuse */
    int64_t device_allocs;     /* cuMemAlloc calls */
    int64_t device_frees;      /* cuMemFree calls */
    int64_t reuses;            /* requests served from the cached blocks */
} kiln_cuda_memory;

/* 1 when CUDA tensors can be made here; 0 with the reason as the error
 * ("no CUDA driver: ...", "no CUDA device: ..."). */
KILN_API int kiln_cuda_available(void);
/* CUDA device 0's name ("NVIDIA H200"), borrowed; NULL with the reason as the error without one. */
KILN_API const char *kiln_cuda_device_name(void);
/* The allocator's counters into *out; 0, or negative when CUDA is not available. */
KILN_API int kiln_cuda_memory_stats(kiln_cuda_memory *out);
/* Returns the allocator's cached blocks to the driver. */
KILN_API void kiln_cuda_empty_cache(void);
/* Waits until all queued CUDA work is done; 0, or negative with the error a kernel raised. */
KILN_API int kiln_cuda_synchronize(void);
/* Prints t to stdout as PyTorch prints a tensor: rows wrapped at 80
 * columns, the middle of tensors over 1000 elements elided. 0, or negative
 * with the error set. */
KILN_API int kiln_print(const kiln_tensor *t);
/* The same, to f. */
KILN_API int kiln_fprint(FILE *f, const kiln_tensor *t);
/* t itself (a new reference) if row-major contiguous, else a contiguous copy. */
KILN_API kiln_tensor *kiln_contiguous(kiln_tensor *t);

/* -- Files ----------------------------------------------------------------- */

/* The array in a numpy .npy file (versions 1.0 to 3.0; C or Fortran order;
 * any byte order) of dtype f4, f8, i4, i8 or b1, as a new contiguous tensor.
 * A file kiln cannot read is an error naming the byte where it went wrong;
 * so is a path that is not a regular file (a FIFO is never waited on). */
KILN_API kiln_tensor *kiln_load_npy(const char *path);
/* Writes t (any layout or device) to path as numpy 1.24's np.save would: a
 * version 1.0 header, C order, little-endian. 0, or negative with the error
 * set. The file is written whole under a new name in path's directory and
 * renamed into place, so a failed save leaves what was at path as it was; a
 * file replaced keeps its permissions (less the umask), not its owner or
 * hard links; a link at path is replaced, not written through; a FIFO or
 * device there is refused. */
KILN_API int kiln_save_npy(const char *path, const kiln_tensor *t);

/* A tensor and its name, as kiln_load_safetensors returns them. */
typedef struct {
    const char *name;    /* owned by the array */
    kiln_tensor *tensor; /* a reference owned by the array, not by a scope */
} kiln_named_tensor;

/* Loads tensors from a .safetensors file: the n named in names, in that
 * order, or every tensor in the file's order when names is NULL (n is then
 * ignored). The file is mapped and only those tensors are copied out; the
 * header is checked whole (offsets in bounds, sizes matching shapes, no
 * overlaps or holes). Dtypes F32, F64, I32, I64 and BOOL load as such.
 * Returns the number of tensors and sets *out to a new array of them (free
 * it with kiln_free_named_tensors; kiln_retain a tensor to keep it longer);
 * on failure *out is NULL and the error names the tensor or the byte (or
 * that path is not a regular file: a FIFO is never waited on). */
KILN_API int kiln_load_safetensors(const char *path, const char *const *names, int n,
                                   kiln_named_tensor **out);
/* Releases the n tensors of ts and frees the array (NULL is ignored). */
KILN_API void kiln_free_named_tensors(kiln_named_tensor *ts, int n);

/* -- Elementwise ops ------------------------------------------------------- */
/* Binary ops broadcast and promote their operands. Arithmetic on two bools:
 * add is or, mul is and; sub and pow refuse bool. div is true division (ints
 * give f32). Integer overflow wraps. maximum and minimum propagate NaN and,
 * of two equal operands (-0.0 and +0.0), give the first, eagerly, traced and
 * compiled alike: PyTorch 1.13's rule on the CPU for small tensors and 0-d
 * or scalar operands (its vector loop, on the bulk of a large tensor, gives
 * the second). */

KILN_API kiln_tensor *kiln_add(kiln_tensor *a, kiln_tensor *b);     /* a + b */
KILN_API kiln_tensor *kiln_sub(kiln_tensor *a, kiln_tensor *b);     /* a - b */
KILN_API kiln_tensor *kiln_mul(kiln_tensor *a, kiln_tensor *b);     /* a * b */
KILN_API kiln_tensor *kiln_div(kiln_tensor *a, kiln_tensor *b);     /* a / b */
KILN_API kiln_tensor *kiln_pow(kiln_tensor *a, kiln_tensor *b);     /* a ** b */
KILN_API kiln_tensor *kiln_maximum(kiln_tensor *a, kiln_tensor *b); /* max(a, b) */
KILN_API kiln_tensor *kiln_minimum(kiln_tensor *a, kiln_tensor *b); /* min(a, b) */
/* The same ops with a scalar b: floats keep their dtype; integers keep theirs
 * when b is a whole number and become f32 otherwise; bools become i64 with a
 * whole number. -0.0 is not a whole number (only a Python float has its
 * sign): kiln_div_scalar(i32 [3], -0.0) is f32 [-inf]. */
KILN_API kiln_tensor *kiln_add_scalar(kiln_tensor *a, double b);
KILN_API kiln_tensor *kiln_sub_scalar(kiln_tensor *a, double b);
KILN_API kiln_tensor *kiln_mul_scalar(kiln_tensor *a, double b);
KILN_API kiln_tensor *kiln_div_scalar(kiln_tensor *a, double b);
KILN_API kiln_tensor *kiln_pow_scalar(kiln_tensor *a, double b);
KILN_API kiln_tensor *kiln_maximum_scalar(kiln_tensor *a, double b);
KILN_API kiln_tensor *kiln_minimum_scalar(kiln_tensor *a, double b);
/* Python's %, as PyTorch's remainder: the result takes b's sign. Floats:
 * fmod(a, b) moved into b's sign; integers refuse bool. */
KILN_API kiln_tensor *kiln_remainder(kiln_tensor *a, kiln_tensor *b);
/* Python's //, as PyTorch 1.13's floor_divide (floats: a / b for b = 0).
 * Where kiln differs: an integer divisor of 0 gives 0 from both (numpy's
 * answer; PyTorch raises), and INT_MIN // -1 wraps to INT_MIN (PyTorch
 * crashes), eagerly, traced and on CUDA alike. */
KILN_API kiln_tensor *kiln_floor_divide(kiln_tensor *a, kiln_tensor *b);
/* The angle of the point (b, a) in (-pi, pi]; integers give f32. */
KILN_API kiln_tensor *kiln_atan2(kiln_tensor *a, kiln_tensor *b);
/* minimum(maximum(a, lo), hi), promoting as the *_scalar forms do (so an
 * integer tensor with a fractional or infinite bound gives f32, as in
 * PyTorch); lo > hi gives hi, a NaN bound gives NaN. A whole bound outside
 * an i32 a's range is an error (PyTorch's overflow error), never wrapped. */
KILN_API kiln_tensor *kiln_clamp(kiln_tensor *a, double lo, double hi);
/* Logical ops on the truth of any dtype (nonzero, NaN included, is true),
 * broadcast, giving bool. */
KILN_API kiln_tensor *kiln_logical_and(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_logical_or(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_logical_xor(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_logical_not(kiln_tensor *a);

/* Comparisons of the promoted operands, giving KILN_BOOL. */
KILN_API kiln_tensor *kiln_eq(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_ne(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_lt(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_le(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_gt(kiln_tensor *a, kiln_tensor *b);
KILN_API kiln_tensor *kiln_ge(kiln_tensor *a, kiln_tensor *b);
/* cond ? a : b elementwise; cond must be KILN_BOOL; all three broadcast. */
KILN_API kiln_tensor *kiln_where(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b);

/* Unary ops. neg, abs and relu keep the dtype and refuse bool; the others
 * compute in floating point (integers and bools give f32). exp, log, erf, sin
 * and cos are within 1 ulp of the correctly rounded result, sigmoid within 3,
 * tanh within 3.5 (SLEEF's vector functions). Compiled f32 code has its own:
 * exp and log within 1 ulp, sigmoid and erf 2, tanh 6.5 (a rational). It
 * also computes some compositions in forms exact in real arithmetic with
 * fewer transcendentals and no overflow or cancellation: tanh(log(1+exp x))
 * (mish), log(1+exp x), log(sigmoid x), exp(log x), log(exp x),
 * 1-sigmoid x; each within 4 ulp
 * where the exponentials inside are normal floats (the written forms lose
 * every digit somewhere). The interpreter computes them as written. */
KILN_API kiln_tensor *kiln_neg(kiln_tensor *a);
KILN_API kiln_tensor *kiln_abs(kiln_tensor *a);
KILN_API kiln_tensor *kiln_exp(kiln_tensor *a);
KILN_API kiln_tensor *kiln_log(kiln_tensor *a);
KILN_API kiln_tensor *kiln_sqrt(kiln_tensor *a);
KILN_API kiln_tensor *kiln_rsqrt(kiln_tensor *a);   /* 1 / sqrt(a) */
KILN_API kiln_tensor *kiln_tanh(kiln_tensor *a);
KILN_API kiln_tensor *kiln_sigmoid(kiln_tensor *a); /* 1 / (1 + exp(-a)) */
KILN_API kiln_tensor *kiln_relu(kiln_tensor *a);    /* a < 0 ? +0 : a, so -0 and NaN stay (PyTorch's) */
KILN_API kiln_tensor *kiln_sin(kiln_tensor *a);
KILN_API kiln_tensor *kiln_cos(kiln_tensor *a);
KILN_API kiln_tensor *kiln_erf(kiln_tensor *a);
/* floor, ceil, round (halves to even, as PyTorch's) and trunc keep the dtype,
 * integers unchanged, and refuse bool. */
KILN_API kiln_tensor *kiln_floor(kiln_tensor *a);
KILN_API kiln_tensor *kiln_ceil(kiln_tensor *a);
KILN_API kiln_tensor *kiln_round(kiln_tensor *a);
KILN_API kiln_tensor *kiln_trunc(kiln_tensor *a);
/* Floating point as exp is (integers and bools give f32); SLEEF's 1-ulp
 * functions eagerly; compiled f32 code has log1p, expm1, log2 and atan
 * within 3 ulp (vectorized) and libm's tan. */
KILN_API kiln_tensor *kiln_log1p(kiln_tensor *a);   /* log(1 + a), exact for tiny a */
KILN_API kiln_tensor *kiln_expm1(kiln_tensor *a);   /* exp(a) - 1, exact for tiny a */
KILN_API kiln_tensor *kiln_log2(kiln_tensor *a);
KILN_API kiln_tensor *kiln_tan(kiln_tensor *a);
KILN_API kiln_tensor *kiln_atan(kiln_tensor *a);
/* -1, 0 or 1 in a's dtype (0 for NaN and -0); a bool stays itself. */
KILN_API kiln_tensor *kiln_sign(kiln_tensor *a);
/* 1 / a: integers and bools give f32. */
KILN_API kiln_tensor *kiln_reciprocal(kiln_tensor *a);
/* True where a is NaN, or infinite; never for integers and bools. */
KILN_API kiln_tensor *kiln_isnan(kiln_tensor *a);
KILN_API kiln_tensor *kiln_isinf(kiln_tensor *a);
/* a converted to dt: floats to integers truncate toward zero and saturate,
 * NaN gives 0; anything nonzero becomes true. */
KILN_API kiln_tensor *kiln_cast(kiln_tensor *a, kiln_dtype dt);

/* -- Reductions ------------------------------------------------------------ */
/* Over one axis, every axis with KILN_ALL, or several with KILN_AXES (below);
 * keepdim keeps reduced axes as 1.
 * sum of integers or bools gives i64 (wrapping); mean of them gives f32,
 * summed in f64 so that nothing wraps; f32 sums accumulate in f64 (compiled
 * code keeps a sum of exponentials over a row of at most 4096 in f32 partial
 * sums, within 2^-15). max and min propagate NaN and refuse empty axes. */

KILN_API kiln_tensor *kiln_sum(kiln_tensor *a, int axis, bool keepdim);
KILN_API kiln_tensor *kiln_mean(kiln_tensor *a, int axis, bool keepdim);
KILN_API kiln_tensor *kiln_max(kiln_tensor *a, int axis, bool keepdim);
KILN_API kiln_tensor *kiln_min(kiln_tensor *a, int axis, bool keepdim);
/* Index (i64) of the first maximum; a NaN counts as the maximum. */
KILN_API kiln_tensor *kiln_argmax(kiln_tensor *a, int axis, bool keepdim);
/* Index (i64) of the first minimum; a NaN counts as the minimum (PyTorch's). */
KILN_API kiln_tensor *kiln_argmin(kiln_tensor *a, int axis, bool keepdim);
/* Product; as sum for dtypes (integers and bools give i64, wrapping), f32
 * accumulated in f64; 1 over an empty axis. */
KILN_API kiln_tensor *kiln_prod(kiln_tensor *a, int axis, bool keepdim);
/* Whether any (all) elements are nonzero (NaN counts), giving bool; false
 * (true) over an empty axis. */
KILN_API kiln_tensor *kiln_any(kiln_tensor *a, int axis, bool keepdim);
KILN_API kiln_tensor *kiln_all(kiln_tensor *a, int axis, bool keepdim);
/* The variance of floats: squared deviations from the mean summed and
 * divided by max(0, n - correction) (1: Bessel's, PyTorch's default; 0: the
 * population's), so a single element with correction 1 gives NaN. Integers
 * are refused, as in PyTorch. std is its square root. */
KILN_API kiln_tensor *kiln_var(kiln_tensor *a, int axis, int64_t correction, bool keepdim);
KILN_API kiln_tensor *kiln_std(kiln_tensor *a, int axis, int64_t correction, bool keepdim);
/* Both at once, as torch.var_mean: writes new references to *var and *mean
 * (batch statistics for training: axis KILN_AXES(0, 2, 3) of NCHW). 0, or
 * negative with both NULL. */
KILN_API int kiln_var_mean(kiln_tensor *a, int axis, int64_t correction, bool keepdim, kiln_tensor **var,
                           kiln_tensor **mean);
/* log(sum(exp(a))) computed stably (a row of -inf gives -inf); integers give
 * f32, an empty axis -inf. */
KILN_API kiln_tensor *kiln_logsumexp(kiln_tensor *a, int axis, bool keepdim);

/* Several axes at once, for every reduction but argmax and argmin:
 * kiln_sum(x, KILN_AXES(0, 2, 3), true). One to eight axes, each in [-8, 7]
 * (another is an error naming the function). They are moved last and merged,
 * so a traced reduction over trailing axes fuses like one over the last. */
#define KILN_AXES_FLAG 0x40000000
#define KILN_AXES(...) (KILN_AXES_FLAG | KILN_AXES_BITS_(__VA_ARGS__, 99, 99, 99, 99, 99, 99, 99, 99))
#define KILN_AXES_BITS_(a, b, c, d, e, f, g, h, ...)                                                \
    (KILN_AXIS_BIT_(a) | KILN_AXIS_BIT_(b) | KILN_AXIS_BIT_(c) | KILN_AXIS_BIT_(d) | KILN_AXIS_BIT_(e) | \
     KILN_AXIS_BIT_(f) | KILN_AXIS_BIT_(g) | KILN_AXIS_BIT_(h))
#define KILN_AXIS_BIT_(a) ((a) == 99 ? 0 : (a) < -8 || (a) > 7 ? 1 << 16 : 1 << ((a) & 15))

/* -- Movement: views where possible, no copy ------------------------------- */

/* A view with the new shape when the strides allow it, else a copy; one entry
 * may be -1 and is inferred. */
KILN_API kiln_tensor *kiln_reshape(kiln_tensor *a, int ndim, const int64_t *shape);
/* Axes reordered: output axis i is input axis perm[i]. A view. */
KILN_API kiln_tensor *kiln_permute(kiln_tensor *a, const int *perm);
/* Two axes swapped. A view. */
KILN_API kiln_tensor *kiln_transpose(kiln_tensor *a, int axis0, int axis1);
/* Broadcast to shape (numpy's broadcast_to; -1 keeps a size). A view. */
KILN_API kiln_tensor *kiln_expand(kiln_tensor *a, int ndim, const int64_t *shape);
/* Python's a[start:stop:step] along axis: negative indices count from the
 * end, bounds clamp, step may be negative but not 0. A view. */
KILN_API kiln_tensor *kiln_slice(kiln_tensor *a, int axis, int64_t start, int64_t stop, int64_t step);
/* The n tensors joined along axis (a copy); dtypes promote. */
KILN_API kiln_tensor *kiln_concat(kiln_tensor *const *ts, int n, int axis);
/* Removes axis, which must have size 1; KILN_ALL removes every size-1 axis. A view. */
KILN_API kiln_tensor *kiln_squeeze(kiln_tensor *a, int axis);
/* Inserts a size-1 axis at position axis (-1 appends). A view. */
KILN_API kiln_tensor *kiln_unsqueeze(kiln_tensor *a, int axis);
/* The n tensors (equal shapes) joined along a new axis at position axis. */
KILN_API kiln_tensor *kiln_stack(kiln_tensor *const *ts, int n, int axis);
/* Views of a along axis in pieces of size (the last may be smaller; an empty
 * axis is one empty piece), new references into out[0..max_out): the
 * number of pieces, or negative (more than max_out is an error). */
KILN_API int kiln_split(kiln_tensor *a, int64_t size, int axis, kiln_tensor **out, int max_out);
/* Views of a along axis in n pieces of the given sizes (summing to its
 * extent) into out[0..n): n, or negative. */
KILN_API int kiln_split_sizes(kiln_tensor *a, int n, const int64_t *sizes, int axis, kiln_tensor **out);
/* a reversed along axis, or several (KILN_AXES); a view, where PyTorch's
 * flip copies. */
KILN_API kiln_tensor *kiln_flip(kiln_tensor *a, int axis);
typedef enum { KILN_PAD_CONSTANT, KILN_PAD_REFLECT } kiln_pad_mode;
/* torch.nn.functional.pad: n pads in (before, after) pairs from the last
 * axis backwards. CONSTANT fills with value (a negative pad crops);
 * REFLECT mirrors a about its edges, each pad 0 or in [1, extent). */
KILN_API kiln_tensor *kiln_pad(kiln_tensor *a, int n, const int64_t *pads, kiln_pad_mode mode, double value);
/* a's elements on and below (tril) or above (triu) diagonal of its last two
 * axes (0 the main one, positive above it), zeros elsewhere. */
KILN_API kiln_tensor *kiln_tril(kiln_tensor *a, int64_t diagonal);
KILN_API kiln_tensor *kiln_triu(kiln_tensor *a, int64_t diagonal);
/* a tiled reps[i] times along each axis; n >= a's rank, leading counts add
 * axes (torch.Tensor.repeat). A copy, but a view where every count is 1. */
KILN_API kiln_tensor *kiln_repeat(kiln_tensor *a, int n, const int64_t *reps);

/* -- Along an axis, and by indices ------------------------------------------ */

/* Running sums along axis: integers and bools give i64 (wrapping), f32
 * accumulates in f64. A 0-d tensor takes axis 0 or -1. */
KILN_API kiln_tensor *kiln_cumsum(kiln_tensor *a, int axis);
/* The k largest (largest) or smallest elements along axis, in order, into
 * new references *values and *indices (i64). NaN counts above every number;
 * ties come lowest index first (PyTorch leaves their order open). 0, or
 * negative with both NULL (k outside [0, extent] included). */
KILN_API int kiln_topk(kiln_tensor *a, int64_t k, int axis, bool largest, kiln_tensor **values,
                       kiln_tensor **indices);
/* Every element along axis in order (ascending, or descending), stable:
 * equal elements keep their order; NaN last ascending, first descending. */
KILN_API int kiln_sort(kiln_tensor *a, int axis, bool descending, kiln_tensor **values, kiln_tensor **indices);
/* Indices are i32 or i64 on a's device; a negative index counts from the end
 * of its axis. An index out of range is an error naming it and the axis,
 * eagerly and when a traced call runs (indexing is never fused, so the check
 * always runs): never a read out of bounds. */
/* torch.gather: out[i][j] = a[index[i][j]][j] for axis 0; index has a's rank
 * and sizes no larger than a's off the axis; the result has index's shape. */
KILN_API kiln_tensor *kiln_gather(kiln_tensor *a, int axis, kiln_tensor *index);
/* a's slices at the positions of index (0-d or 1-d) along axis. */
KILN_API kiln_tensor *kiln_index_select(kiln_tensor *a, int axis, kiln_tensor *index);
/* Rows of weight [vocabulary, dimension] for ids of any shape: [..., dimension]. */
KILN_API kiln_tensor *kiln_embedding(kiln_tensor *weight, kiln_tensor *ids);
/* A copy of a with src added at index along axis (torch.scatter_add, out of
 * place: the gradient of gather): index has the rank of a and src, fits in
 * src, and in a off the axis; src has a's dtype (not bool). Repeated indices
 * add up (in any order on CUDA). */
KILN_API kiln_tensor *kiln_scatter_add(kiln_tensor *a, int axis, kiln_tensor *index, kiln_tensor *src);
/* a with value (converted to a's dtype as kiln_cast converts) where mask
 * (bool, broadcasting to a's shape) is true. */
KILN_API kiln_tensor *kiln_masked_fill(kiln_tensor *a, kiln_tensor *mask, double value);

/* -- Linear algebra -------------------------------------------------------- */

/* numpy.matmul: 1-d operands are promoted and the added axis removed after;
 * batch axes broadcast. Floats on the CPU run on kiln_matmul_engine()'s
 * GEMM, integers in exact loops (wrapping), CUDA tensors on kiln's kernels. */
KILN_API kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b);
/* The engine of f32 and f64 CPU products: "kiln" (kiln's own GEMM, compiled
 * by the LLVM backend for this CPU, any strides, whole batches at once) or
 * "openblas". Decided once per process: KILN_MATMUL=kiln or =openblas says;
 * otherwise "kiln" where this build has the LLVM backend and OpenBLAS's
 * kernels for the core it picked (openblas_get_corename) use narrower
 * vectors than this CPU has (AVX-512 CPUs it runs with its Prescott or
 * Haswell kernels), else "openblas". A product whose GEMM kiln cannot make
 * (KILN_CACHE=require without it) runs on OpenBLAS. Traced products fused
 * with their epilogue always run on kiln's GEMM. */
KILN_API const char *kiln_matmul_engine(void);

/* -- Composites, built from the ops above ---------------------------------- */
/* Integer and bool operands are converted to f32 first (PyTorch's x.float()),
 * so nothing is computed in an integer dtype. */

/* exp(a) / sum(exp(a)) along axis. Over an empty axis the result is empty;
 * a 0-d tensor takes axis 0 or -1 (as kiln_sum does) and gives 1. */
KILN_API kiln_tensor *kiln_softmax(kiln_tensor *a, int axis);
/* log(softmax(a, axis)), computed stably; 0 for a 0-d tensor. */
KILN_API kiln_tensor *kiln_log_softmax(kiln_tensor *a, int axis);
/* Normalizes over the last axis; gamma and beta broadcast against x. Either
 * may be NULL for none. */
KILN_API kiln_tensor *kiln_layer_norm(kiln_tensor *x, kiln_tensor *gamma, kiln_tensor *beta, double eps);
/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
KILN_API kiln_tensor *kiln_gelu(kiln_tensor *a);
/* x * sigmoid(x) */
KILN_API kiln_tensor *kiln_silu(kiln_tensor *a);
/* Normalizes over the last k axes (torch's layer_norm with normalized_shape
 * of x's last k sizes); gamma and beta (or NULL) broadcast to those axes. */
KILN_API kiln_tensor *kiln_layer_norm_axes(kiln_tensor *x, int k, kiln_tensor *gamma, kiln_tensor *beta,
                                           double eps);
/* Inference batch norm over axis 1 of x [N, C, ...] with running statistics
 * mean and var [C]: (x - mean) / sqrt(var + eps) * gamma + beta, gamma and
 * beta [C] or NULL. (Training statistics: kiln_var_mean over KILN_AXES(0, 2, 3).) */
KILN_API kiln_tensor *kiln_batch_norm(kiln_tensor *x, kiln_tensor *mean, kiln_tensor *var, kiln_tensor *gamma,
                                      kiln_tensor *beta, double eps);
/* Normalizes x [N, C, ...] over each of groups equal groups of its channels
 * (and the axes after them), then gamma and beta [C] (or NULL) per channel. */
KILN_API kiln_tensor *kiln_group_norm(kiln_tensor *x, int64_t groups, kiln_tensor *gamma, kiln_tensor *beta,
                                      double eps);
/* x / sqrt(mean(x^2) + eps) over the last axis, times gamma (or NULL). */
KILN_API kiln_tensor *kiln_rms_norm(kiln_tensor *x, kiln_tensor *gamma, double eps);
/* The mean over the batch of -log softmax(logits)[label]: logits [N, C] (or
 * [C] with a 0-d label), labels [N] of i64 (or i32), classes in [0, C).
 * kiln_cross_entropy_ex adds PyTorch's ignore_index (rows with that label
 * count for nothing; the mean is over the others, NaN if none) and
 * label_smoothing in [0, 1]; kiln_cross_entropy is ignore_index -100 and no
 * smoothing. A label out of range is an error naming it eagerly; traced (or
 * on CUDA) it fails the call as an index out of range of the gather that
 * picks it (a negative label shown moved down by C): traced, that gather is
 * a checked read inside the row kernel, which reads nothing out of range. */
KILN_API kiln_tensor *kiln_cross_entropy(kiln_tensor *logits, kiln_tensor *labels);
KILN_API kiln_tensor *kiln_cross_entropy_ex(kiln_tensor *logits, kiln_tensor *labels, int64_t ignore_index,
                                            double label_smoothing);
/* The mean over the batch of -log_probs[label] (log_probs [N, C] as
 * cross_entropy's logits), rows labeled ignore_index left out. */
KILN_API kiln_tensor *kiln_nll_loss(kiln_tensor *log_probs, kiln_tensor *labels, int64_t ignore_index);
/* mean((a - b)^2) over every element of the broadcast; integers give f32. */
KILN_API kiln_tensor *kiln_mse_loss(kiln_tensor *a, kiln_tensor *b);
/* Training (and p > 0): x times a mask of the global generator's that keeps
 * each element with probability 1 - p, scaled by 1 / (1 - p) (a dropped NaN
 * or infinity gives NaN, as in PyTorch). Traced, each call draws a new
 * mask. Otherwise x itself (a new reference). Floats only; p in [0, 1]. */
KILN_API kiln_tensor *kiln_dropout(kiln_tensor *x, double p, bool training);
/* Convolution and pooling over NCHW x [N, C, H, W] (or unbatched [C, H, W]),
 * as torch.nn.functional's. Zeros in the params mean the defaults: stride
 * 1, padding 0, dilation 1, groups 1. */
typedef struct {
    int64_t stride[2], padding[2], dilation[2], groups;
} kiln_conv2d_params;
/* Cross-correlation of x with w [O, C / groups, KH, KW] plus bias [O] (or
 * NULL); p NULL: the defaults. Floats only (x and w may differ: they
 * promote, where PyTorch wants one dtype). Traced on the CPU backend: an
 * implicit GEMM (depthwise: a direct kernel) with its epilogue fused; else
 * depthwise ones sum the taps elementwise, others are one batched product
 * per group over the windows' columns (a buffer of C KH KW OH OW per image). */
KILN_API kiln_tensor *kiln_conv2d(kiln_tensor *x, kiln_tensor *w, kiln_tensor *bias, const kiln_conv2d_params *p);
/* kernel >= 1, stride (zeros: the kernel's), padding at most half the
 * kernel; ceil_mode rounds the output size up (a last window starting in
 * the right padding dropped); count_include_pad counts the padding in an
 * average's divisor (never ceil mode's overhang past it). */
typedef struct {
    int64_t kernel[2], stride[2], padding[2];
    bool ceil_mode, count_include_pad;
} kiln_pool2d_params;
/* Window maxima (NaN wins); numbers of any dtype, not bool. */
KILN_API kiln_tensor *kiln_max_pool2d(kiln_tensor *x, const kiln_pool2d_params *p);
/* Window means; integers become f32 first (PyTorch divides integers). */
KILN_API kiln_tensor *kiln_avg_pool2d(kiln_tensor *x, const kiln_pool2d_params *p);
/* Means over out_h x out_w windows, window i of an axis of n spanning
 * [floor(i n / out), ceil((i + 1) n / out)); 1x1 is global pooling. Each
 * output size is 1 to 65536. */
KILN_API kiln_tensor *kiln_adaptive_avg_pool2d(kiln_tensor *x, int64_t out_h, int64_t out_w);
/* 0.5 x (1 + erf(x / sqrt 2)): PyTorch's exact GELU. */
KILN_API kiln_tensor *kiln_gelu_erf(kiln_tensor *a);
/* log(1 + exp(beta x)) / beta, and x itself where beta x > threshold
 * (PyTorch's defaults are beta 1, threshold 20). */
KILN_API kiln_tensor *kiln_softplus(kiln_tensor *a, double beta, double threshold);

/* -- In place -------------------------------------------------------------- */

/* Writes src, broadcast to dst's shape and converted to dst's dtype, into dst
 * (and so into every view of its storage). Returns 0 or a negative error. */
KILN_API int kiln_assign(kiln_tensor *dst, kiln_tensor *src);

/* -- Gradients ------------------------------------------------------------- *
 * Reverse mode over a tape, as PyTorch's autograd: ops on tensors that need
 * gradients remember how to differentiate themselves, and kiln_backward walks
 * that record from a loss to the leaves. The backward pass is made of kiln
 * ops, so inside a marked function it traces, fuses and compiles like the
 * forward one. Gradients accumulate across backward calls until cleared. The
 * record stays while the tensors computed lives (kiln_backward may be called
 * on it again, as PyTorch's retain_graph=True). Inside a marked body,
 * gradients belong to that trace: they start from none and are not kept after
 * the call (use them there, in an optimizer step, or return them). */

/* Makes float leaf t record the ops applied to it (on) or stop (off). */
KILN_API int kiln_requires_grad(kiln_tensor *t, bool on);
/* Whether gradients flow to t: a leaf marked with kiln_requires_grad, or a
 * result computed from one while gradients were recorded. */
KILN_API bool kiln_needs_grad(const kiln_tensor *t);
/* Accumulates d loss / d leaf into every leaf loss depends on; loss is a 0-d
 * float tensor. 0 or a negative error. */
KILN_API int kiln_backward(kiln_tensor *loss);
/* The same from n outputs, grads[i] (outputs[i]'s shape) seeding outputs[i];
 * grads or grads[i] NULL seeds a 0-d output with 1. */
KILN_API int kiln_backward_with(kiln_tensor *const *outputs, kiln_tensor *const *grads, int n);
/* Leaf t's accumulated gradient: a new reference to it (kiln_backward makes
 * a new one each time, it never writes into one handed out); NULL, and a
 * message, when there is none yet. */
KILN_API kiln_tensor *kiln_grad(kiln_tensor *t);
/* Clears t's gradient (as PyTorch's set_to_none): the next kiln_backward
 * starts it afresh. */
KILN_API int kiln_zero_grad(kiln_tensor *t);
/* t's values without its record: a new tensor sharing t's data that needs no
 * gradient. */
KILN_API kiln_tensor *kiln_detach(kiln_tensor *t);
/* Between these calls (which nest) this thread's ops record no gradients. */
KILN_API void kiln_no_grad_begin(void);
KILN_API void kiln_no_grad_end(void);

/* Optimizers over n float leaves (retained) that step with their gradients;
 * written with kiln ops and kiln_assign, so that a step inside a marked body
 * traces and writes the parameters back on every call. The learning rate is
 * a 0-d tensor that every step reads: kiln_optimizer_set_lr never retraces.
 * kiln_sgd follows torch.optim.SGD (dampening 0), kiln_adamw torch.optim.AdamW. */
typedef struct kiln_optimizer kiln_optimizer;
KILN_API kiln_optimizer *kiln_sgd(kiln_tensor *const *params, int n, double lr, double momentum,
                                  double weight_decay, bool nesterov);
KILN_API kiln_optimizer *kiln_adamw(kiln_tensor *const *params, int n, double lr, double beta1,
                                    double beta2, double eps, double weight_decay);
/* Updates every parameter that has a gradient; parameters without are left. */
KILN_API int kiln_optimizer_step(kiln_optimizer *o);
/* kiln_zero_grad of every parameter. */
KILN_API int kiln_optimizer_zero_grad(kiln_optimizer *o);
KILN_API int kiln_optimizer_set_lr(kiln_optimizer *o, double lr);
/* The optimizer's state, for checkpoints (kiln_save_npy each, kiln_assign to
 * restore): count, and tensor i borrowed; per parameter in order its buffers
 * (SGD with momentum: the momentum; AdamW: exp_avg then exp_avg_sq), then
 * AdamW's step count, beta1 ** step and beta2 ** step, then the learning rate. */
KILN_API int kiln_optimizer_state_count(const kiln_optimizer *o);
KILN_API kiln_tensor *kiln_optimizer_state(const kiln_optimizer *o, int i);
KILN_API void kiln_optimizer_free(kiln_optimizer *o);
/* Scales the gradients of the n params so that their global L2 norm is at
 * most max_norm (torch.nn.utils.clip_grad_norm_); returns the norm before,
 * a new 0-d tensor. Traces inside marked bodies. */
KILN_API kiln_tensor *kiln_clip_grad_norm(kiln_tensor *const *params, int n, double max_norm);

/* -- Marked functions ------------------------------------------------------ *
 * kiln_jit marks a body for compilation; kiln_call traces it once per input
 * signature (dtype, shape and device of each input) into a graph, optimises
 * the graph and runs it. Inside the body, ops on the inputs record instead of
 * computing; eager tensors the body uses without receiving them are captured
 * by reference (a later kiln_assign to them is seen), and kiln_assign to a
 * captured tensor is written back on every call. Every call returns fresh
 * output tensors.
 *
 * Reading a traced value (kiln_item, kiln_copy_to_host) breaks the graph:
 * the ops before the read are compiled and run on the call's data, the read
 * gives the body the real value, and tracing goes on after it in a new
 * segment. Later calls run the segments without the body: after each read,
 * the segment traced for the value the read gives now (the bytes read, so a
 * bool read from a comparison is a branch taken, an integer a loop's trip
 * count). A value no trace has seen traces a new path, so the body runs
 * once per distinct path (up to retrace_limit paths per signature), and C
 * side effects in the body (a printf) happen only when it runs. Writebacks
 * happen once the whole call is known. Strict mode makes a read an error;
 * kiln_where selects values without a read. KILN_LOG=1 names each read that
 * broke a trace and the ops traced before it.
 *
 * What the body reads from C is frozen at trace time: a double passed to a
 * *_scalar op, a seed, a loop bound, a shape (but see kiln_dynamic). A
 * number that changes between calls goes in a tensor: an input, or a
 * captured 0-d tensor updated with kiln_assign, which every call reads
 * afresh without retracing:
 *
 *   kiln_tensor *lr = kiln_scalar(0.1);   // used by the body: captured
 *   ... body: kiln_sub(w, kiln_mul(lr, grad)) ...
 *   kiln_assign(lr, kiln_scalar(0.05));   // the next call uses 0.05
 *
 * kiln_rand and kiln_randn inside a body are ops of the trace: each call
 * draws new values (the first what eager draws for the seed), the same
 * sequence for the same seed in every process.
 *
 * Compiled kernels are cached in the process and on disk. Environment:
 * KILN_JIT=0 (run bodies eagerly), KILN_LOG=1, KILN_DUMP=graph,kernels,llvm,cuda
 * into KILN_DUMP_DIR, KILN_CACHE=off|on|readonly|require, KILN_CACHE_DIR
 * (default $XDG_CACHE_HOME/kiln, else ~/.cache/kiln), KILN_CACHE_MAX_BYTES
 * (default 1 GiB), KILN_THREADS. KILN_CPU_TARGET=cpu:<this CPU>:<features>
 * compiles and loads kernels for that machine instead of the host's own (the
 * host's CPU with features turned off, such as its widest vectors: a feature
 * the host lacks is refused), so kernels precompiled for it run here;
 * kiln_host_target then names it. The cache holds native code kiln runs: keep
 * its directory private.
 *
 * Compiled CPU row kernels divide by a row's value (softmax's sum) by
 * multiplying by its reciprocal, taken once a row, where each such divisor's
 * magnitude is in [2^-126, 2^126] (f64: [2^-1022, 2^1022]): at most an ulp
 * from the quotient; other rows divide. A compiled softmax, log_softmax or
 * log-sum-exp over one row of 16384 or more elements, split into pieces of
 * 1024 to 4096 (a length that divides the row), is shifted by the largest
 * of its pieces' log-sum-exps rather than by its max, and sums each piece's
 * exponentials apart: the same value in real arithmetic, within the error
 * of a sum of 4096 exponentials in f32 of eager's. */

/* Computes out[0..n_out) from in[0..n_in); returns 0, or nonzero on failure.
 * Outputs are any tensors the body made or received. */
typedef int (*kiln_body)(kiln_tensor *const *in, kiln_tensor **out, void *user);

/* Dynamic shapes: which input dimensions a specialization keeps symbolic,
 * so that one trace and one compile serve every size of them.
 * KILN_DYNAMIC_AUTO: a dimension whose size changes between calls is traced
 * again as symbolic (after the first call, which is specialized to its
 * sizes), and those of dynamic_dims from the start. KILN_DYNAMIC_MARKED: only
 * dynamic_dims, and the axes kiln_mark_dynamic marks on a precompiled spec.
 * KILN_DYNAMIC_NEVER: every size is specialized. Sizes 0 and 1 are always
 * specialized (broadcasting depends on them), and so is a dimension whose
 * size the body reads (kiln_shape, kiln_numel), or that an op needs fixed (a
 * reshape to fixed sizes: pass -1 for the one that varies; an expand: -1
 * keeps a size; a slice of part of it; broadcasting against a fixed size; a
 * kiln_assign to a captured tensor). Symbolic sizes the ops make equal
 * become one symbol. A call runs a specialization whose guards it passes:
 * the same dtypes, ranks and devices, the fixed sizes equal, each symbol's
 * dimensions equal and at least 2; else it traces anew. KILN_LOG=1 says
 * what became of each dimension, and why. */
typedef enum { KILN_DYNAMIC_AUTO, KILN_DYNAMIC_NEVER, KILN_DYNAMIC_MARKED } kiln_dynamic;

typedef struct {
    kiln_backend backend; /* default KILN_BACKEND_AUTO */
    int opt_level;        /* 0 runs no graph passes; 1..3 run them; default 2 */
    bool strict;          /* errors instead of eager fallback */
    bool no_cache;        /* skip the disk cache (kernels are still shared in the process) */
    int retrace_limit;    /* signatures traced before falling back; 0: default 8 */
    bool fast_math;       /* allow rewrites that are not exact in IEEE arithmetic */
    kiln_dynamic dynamic; /* default (zero) KILN_DYNAMIC_AUTO */
    /* NULL, or n_in masks (copied): bit d of dynamic_dims[i] keeps axis d of
     * input i symbolic from the first call (not under KILN_DYNAMIC_NEVER). */
    const uint32_t *dynamic_dims;
} kiln_jit_options;

/* Specializations are counted once each: as compiles when code was
 * generated for them (or they are interpreted), as disk hits when their
 * kernels were loaded from the disk cache without compiling. Calls that find
 * their specialization ready are memory hits. */
typedef struct {
    int64_t traces, compiles, memory_hits, disk_hits, eager_fallbacks;
    double compile_ms;    /* total spent tracing, optimising and compiling */
    int kernels;          /* launched by a call of the last specialization: its fused kernels and
                             the eager ops it runs (a matmul, ...); KILN_LOG=1 says how many are fused */
    int64_t peak_bytes;   /* of the last specialization's memory plan */
    int64_t kernels_compiled;  /* by the code generator, for f */
    int64_t kernels_from_disk; /* loaded from the disk cache */
    int64_t kernels_shared;    /* already loaded in this process, by f or another function */
    int64_t eager_peak_bytes;  /* the same body run eagerly, estimated from its graph: every
                                  value it makes held until it returns, as in kiln_call's scope */
    int products_in_blocks;    /* CPU matrix products of the last specialization computed a block of
                                  rows at a time, their epilogue kernel run on each block in cache */
    int64_t symbolic;          /* specializations with symbolic sizes (see kiln_dynamic) */
    int64_t guard_failures;    /* calls no specialization's guards let through, though one had their
                                  dtypes, ranks and devices: each traced anew (or ran eagerly) */
    int64_t graph_breaks;      /* reads of traced values that split a trace into segments */
    int64_t segments;          /* the segments f keeps, over every specialization and path (a
                                  trace that never broke is one) */
} kiln_fn_stats_t;

typedef struct {
    kiln_dtype dtype;
    int ndim;
    int64_t shape[8];
    kiln_device device;
    uint32_t dynamic;     /* bit d: axis d is symbolic (kiln_mark_dynamic); shape[d] an example size */
} kiln_spec;

/* Marks axis (negative counts from the end) of spec symbolic, for
 * kiln_fn_precompile: the specialization it makes serves every size of that
 * axis (see kiln_dynamic). 0, or an error for a bad axis. */
KILN_API int kiln_mark_dynamic(kiln_spec *spec, int axis);

/* t's signature as kiln_fn_precompile takes it: dtype, shape and device;
 * zeros for NULL. */
KILN_API kiln_spec kiln_spec_of(const kiln_tensor *t);
/* The default options: AUTO backend, opt_level 2, retrace_limit 8. */
KILN_API kiln_jit_options kiln_jit_defaults(void);
/* Marks body (n_in inputs, n_out outputs, user passed through) for
 * compilation; opts NULL means defaults. Free with kiln_fn_free. */
KILN_API kiln_fn *kiln_jit(const char *name, kiln_body body, int n_in, int n_out, void *user,
                           const kiln_jit_options *opts);
/* Runs f on in, writing n_out new references to out, owned as any op's result
 * (by the innermost open scope, else by the caller). Returns 0 or a negative
 * error; on error out is left NULL. */
KILN_API int kiln_call(kiln_fn *f, kiln_tensor *const *in, kiln_tensor **out);
KILN_API void kiln_fn_free(kiln_fn *f);
/* Copies f's counters into s. */
KILN_API int kiln_fn_stats(const kiln_fn *f, kiln_fn_stats_t *s);
/* Traces and prepares f for the input signature in (n_in specs) without
 * running it. target: "host" (ready to run here); or, compiled into the disk
 * cache only (KILN_CACHE=on), for shipping: "cpu:<LLVM CPU name>" (e.g.
 * "cpu:skylake-avx512", the CPU's own features), "cpu:<name>:<features>" as
 * kiln_host_target names a machine, or "cuda:sm_XX" (the fused kernels as
 * CUBIN and PTX by NVRTC; needs NVRTC, not a GPU). */
KILN_API int kiln_fn_precompile(kiln_fn *f, const kiln_spec *in, const char *target);
/* This machine's CPU as a target, "cpu:<LLVM name>:<sorted LLVM feature
 * list>": entries precompiled for it on any machine are the ones this
 * machine's "host" loads. Borrowed; NULL (error set) without LLVM. */
KILN_API const char *kiln_host_target(void);
/* "llvm" when f's last specialization runs kernels compiled for the CPU,
 * "nvrtc" when for CUDA, "interp" when it is interpreted, NULL before the
 * first trace. */
KILN_API const char *kiln_fn_backend(const kiln_fn *f);
/* The canonical text of the optimised graph of f's last specialization,
 * malloc'd (free it), or NULL when f has none. */
KILN_API char *kiln_fn_graph_text(const kiln_fn *f);

/* f's input and output counts into *n_in and *n_out (either may be NULL). */
KILN_API int kiln_fn_arity(const kiln_fn *f, int *n_in, int *n_out);
/* The name of f's input (output false) or output i, borrowed from f: an ONNX
 * model's value names, "input_<i>" and "output_<i>" for kiln_jit's. NULL with
 * the error set for i out of range. */
KILN_API const char *kiln_fn_io_name(const kiln_fn *f, bool output, int i);

/* -- ONNX ------------------------------------------------------------------ *
 * Needs a build with protobuf-c (meson -Donnx); without it both calls fail
 * saying so. */

/* The ONNX model at path (default-domain opsets 1 to 17) as a marked function
 * (opts as kiln_jit's) whose inputs are the graph's inputs that no initializer
 * gives and whose outputs are the graph's outputs, in the model's order
 * (kiln_fn_arity, kiln_fn_io_name). Initializers become captured constants;
 * nodes computed from constants and shapes alone (Shape, ConstantOfShape, the
 * arithmetic on them) are folded when traced, so the graph holds only what
 * depends on the inputs, each size specialized from the first call. NULL with
 * an error naming the node and its op for an operator, attribute or dtype kiln
 * does not support, and the byte or value for a malformed file. */
KILN_API kiln_fn *kiln_onnx_load(const char *path, const kiln_jit_options *opts);
/* Writes the optimised graph of f traced for in (f's input count of specs,
 * fixed sizes) to path as an ONNX model (opset 17) that onnx.checker accepts:
 * captured tensors become initializers, inputs and outputs keep
 * kiln_fn_io_name's names. 0, or negative with the error set (a body that
 * writes back into captures or draws random values has no ONNX form). The
 * file is written as kiln_save_npy writes (under a new name, renamed); a
 * FIFO or device at path is refused. */
KILN_API int kiln_onnx_export(kiln_fn *f, const kiln_spec *in, const char *path);

/* -- One-line marking ------------------------------------------------------ *
 * KILN_COMPILE(gelu_fast, gelu, 1) at file scope defines
 *
 *     kiln_tensor *gelu_fast(kiln_tensor *x);   gelu(x), traced once per input signature
 *     kiln_fn *gelu_fast_fn(void);              its marked function (kiln_fn_stats,
 *                                               kiln_fn_precompile, kiln_fn_backend)
 *
 * fn must be a function of n kiln_tensor * (1 <= n <= 8) that returns a new
 * kiln_tensor *; another type or arity does not compile. gelu_fast returns a
 * new reference, or NULL with the error set. The marked function is made by
 * the first call of either, belongs to kiln (never kiln_fn_free it) and is
 * freed at exit, so leak checks at exit find none of it. */

/* The marked function in *slot, made on first use (by one thread) as
 * kiln_jit(name, body, n_in, 1, NULL, NULL) and freed at exit; NULL with the
 * error set if it cannot be made. For KILN_COMPILE. */
KILN_API kiln_fn *kiln_jit_slot(kiln_fn **slot, const char *name, kiln_body body, int n_in);

#define KILN_COMPILE(name, fn, n)                                                      \
    KILN_CHECK_TYPE_(name, fn, n)                                                      \
    static int name##_body_(kiln_tensor *const *in_, kiln_tensor **out_, void *user_)  \
    {                                                                                  \
        (void)user_;                                                                   \
        out_[0] = fn(KILN_IN_##n);                                                     \
        return out_[0] ? 0 : -1;                                                       \
    }                                                                                  \
    kiln_fn *name##_fn(void);                                                          \
    kiln_fn *name##_fn(void)                                                           \
    {                                                                                  \
        static kiln_fn *slot_;                                                         \
        return kiln_jit_slot(&slot_, #fn, name##_body_, n);                            \
    }                                                                                  \
    kiln_tensor *name(KILN_PARAMS_##n);                                                \
    kiln_tensor *name(KILN_PARAMS_##n)                                                 \
    {                                                                                  \
        kiln_tensor *in_[] = {KILN_ARGS_##n}, *out_ = NULL;                            \
        kiln_fn *f_ = name##_fn();                                                     \
        return f_ && kiln_call(f_, in_, &out_) == 0 ? out_ : NULL;                     \
    }

/* fn's type, checked where the compiler can say why; elsewhere the call in
 * the body still refuses another arity. */
#if defined(__cplusplus) || !defined(__GNUC__)
#define KILN_CHECK_TYPE_(name, fn, n)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define KILN_CHECK_TYPE_(name, fn, n)                                                  \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&(fn)), kiln_tensor *(*)(KILN_TYPES_##n)), \
                   "KILN_COMPILE(" #name ", " #fn ", " #n "): " #fn                   \
                   " must take " #n " kiln_tensor * and return kiln_tensor *");
#else
#define KILN_CHECK_TYPE_(name, fn, n)                                                  \
    typedef char name##_needs_##fn##_of_##n##_tensors_                                 \
        [__builtin_types_compatible_p(__typeof__(&(fn)), kiln_tensor *(*)(KILN_TYPES_##n)) ? 1 : -1];
#endif

#define KILN_TYPES_1 kiln_tensor *
#define KILN_TYPES_2 KILN_TYPES_1, kiln_tensor *
#define KILN_TYPES_3 KILN_TYPES_2, kiln_tensor *
#define KILN_TYPES_4 KILN_TYPES_3, kiln_tensor *
#define KILN_TYPES_5 KILN_TYPES_4, kiln_tensor *
#define KILN_TYPES_6 KILN_TYPES_5, kiln_tensor *
#define KILN_TYPES_7 KILN_TYPES_6, kiln_tensor *
#define KILN_TYPES_8 KILN_TYPES_7, kiln_tensor *
#define KILN_PARAMS_1 kiln_tensor *a0_
#define KILN_PARAMS_2 KILN_PARAMS_1, kiln_tensor *a1_
#define KILN_PARAMS_3 KILN_PARAMS_2, kiln_tensor *a2_
#define KILN_PARAMS_4 KILN_PARAMS_3, kiln_tensor *a3_
#define KILN_PARAMS_5 KILN_PARAMS_4, kiln_tensor *a4_
#define KILN_PARAMS_6 KILN_PARAMS_5, kiln_tensor *a5_
#define KILN_PARAMS_7 KILN_PARAMS_6, kiln_tensor *a6_
#define KILN_PARAMS_8 KILN_PARAMS_7, kiln_tensor *a7_
#define KILN_ARGS_1 a0_
#define KILN_ARGS_2 KILN_ARGS_1, a1_
#define KILN_ARGS_3 KILN_ARGS_2, a2_
#define KILN_ARGS_4 KILN_ARGS_3, a3_
#define KILN_ARGS_5 KILN_ARGS_4, a4_
#define KILN_ARGS_6 KILN_ARGS_5, a5_
#define KILN_ARGS_7 KILN_ARGS_6, a6_
#define KILN_ARGS_8 KILN_ARGS_7, a7_
#define KILN_IN_1 in_[0]
#define KILN_IN_2 KILN_IN_1, in_[1]
#define KILN_IN_3 KILN_IN_2, in_[2]
#define KILN_IN_4 KILN_IN_3, in_[3]
#define KILN_IN_5 KILN_IN_4, in_[4]
#define KILN_IN_6 KILN_IN_5, in_[5]
#define KILN_IN_7 KILN_IN_6, in_[6]
#define KILN_IN_8 KILN_IN_7, in_[7]

#ifdef __cplusplus
}
#endif

#endif
