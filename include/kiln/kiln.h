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
 * A file kiln cannot read is an error naming the byte where it went wrong. */
KILN_API kiln_tensor *kiln_load_npy(const char *path);
/* Writes t (any layout or device) to path as numpy 1.24's np.save would: a
 * version 1.0 header, C order, little-endian. 0, or negative with the error
 * set (a partly written file is removed). */
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
 * on failure *out is NULL and the error names the tensor or the byte. */
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
/* a converted to dt: floats to integers truncate toward zero and saturate,
 * NaN gives 0; anything nonzero becomes true. */
KILN_API kiln_tensor *kiln_cast(kiln_tensor *a, kiln_dtype dt);

/* -- Reductions ------------------------------------------------------------ */
/* Over one axis, or every axis with KILN_ALL; keepdim keeps reduced axes as 1.
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

/* -- Linear algebra -------------------------------------------------------- */

/* numpy.matmul: 1-d operands are promoted and the added axis removed after;
 * batch axes broadcast. OpenBLAS for floats, exact loops for integers. */
KILN_API kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b);

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

/* -- In place -------------------------------------------------------------- */

/* Writes src, broadcast to dst's shape and converted to dst's dtype, into dst
 * (and so into every view of its storage). Returns 0 or a negative error. */
KILN_API int kiln_assign(kiln_tensor *dst, kiln_tensor *src);

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
 * (default 1 GiB), KILN_THREADS. The cache holds native code kiln runs: keep
 * its directory private. */

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
