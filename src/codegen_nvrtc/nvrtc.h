/* The CUDA backend's code generator: kernels of the kernel IR as CUDA C,
 * compiled by NVRTC into CUBIN and PTX. NVRTC and the CUDA driver are opened
 * with dlopen, so one build of kiln runs with or without them. What other
 * modules may use of src/codegen_nvrtc. */
#ifndef KILN_CODEGEN_NVRTC_H
#define KILN_CODEGEN_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#include "ir/kernel.h"
#include "kiln/kiln.h"

/* Threads per block of a fused kernel, a multiple of the warp. An
 * elementwise kernel loops grid-stride over its elements, a kernel with
 * reductions over its rows, a block per row: any grid works. */
enum { NVRTC_BLOCK = 256 };

/* "sm_<major><minor>" of a "cuda:sm_XX" target name checked against what
 * NVRTC can compile for, into arch; -1 with the reason in err. */
int nvrtc_target(const char *name, char *arch, size_t arch_size, char *err, size_t err_size);
/* "NVRTC <major>.<minor>", or NULL with the reason in err (no NVRTC). */
const char *nvrtc_toolchain(char *err, size_t err_size);
/* A hash of the code generator's sources: changes when its code may. */
const char *nvrtc_codegen_version(void);

/* Compiles k for arch into an object whose entry point is symbol: CUBIN then
 * PTX (docs/cache-format.md), malloc'd into *object. Its parameters are the
 * kernel's buffers, each 16-byte aligned (contiguous f32 rows are read and
 * written as float4): a caller stages a buffer that is not. source, if not NULL,
 * receives the CUDA C (malloc'd). 0, or -1 with the reason (NVRTC's log
 * included) in err. Safe from several threads at once. */
int nvrtc_compile_object(const kx_kernel *k, const char *symbol, const char *arch, char **source, void **object,
                         size_t *size, char *err, size_t err_size);

/* Compiles CUDA C source whose kernel is symbol, as nvrtc_compile_object. */
int nvrtc_compile_source(const char *source, const char *symbol, const char *arch, void **object, size_t *size,
                         char *err, size_t err_size);

/* -- Eager kernels (eager.c): shape-generic, one per op and dtypes --------- *
 * Sizes and strides are arguments, so one compiled kernel serves every
 * shape. Each argument struct below is passed by value as the kernel's first
 * parameter and has the same layout in C and in the generated CUDA C
 * (declared there under the same name). Every kernel is launched with
 * NVRTC_EAGER_BLOCK threads a block and loops grid-stride, so any grid works. */

enum { NVRTC_EAGER_BLOCK = 256, NVRTC_EW_INPUTS = 3 };

/* out[i] = op(in0[i], in1[i], in2[i]) over the collapsed iteration space
 * shape[0..ndim); element i's offset in an operand is the sum over d of its
 * coordinate times the operand's stride (elements; 0 along broadcast axes).
 * An input whose bit is set in scalar_mask is the value whose bytes, in the
 * input's dtype, begin scalar_bits[k] (its pointer is NULL): bits, not a
 * double, so that an i64 beyond 2^53 goes over exactly. contiguous: every
 * operand that is read and the output have offset i. */
typedef struct {
    long long numel;
    long long shape[KILN_MAX_DIMS];
    long long out_strides[KILN_MAX_DIMS];
    long long in_strides[NVRTC_EW_INPUTS][KILN_MAX_DIMS];
    unsigned long long scalar_bits[NVRTC_EW_INPUTS];
    int ndim;
    int contiguous;
    int scalar_mask;
    int unused;
} nvrtc_ew_args;

/* A reduction of a contiguous input seen as [outer, n, inner] into a
 * contiguous output [outer, inner]. */
typedef struct {
    long long outer, n, inner;
} nvrtc_reduce_args;

/* C[batch, m, n] = A[batch, m, k] @ B[batch, k, n], C contiguous. The batch
 * index runs over batch_shape[0..batch_ndim) (row-major); A's and B's batch
 * strides are 0 along a broadcast batch axis. Within a matrix, element (r, c)
 * of A is at r * a_row + c * a_col, of B at r * b_row + c * b_col. */
typedef struct {
    long long batch, m, n, k;
    long long batch_shape[KILN_MAX_DIMS];
    long long a_batch_strides[KILN_MAX_DIMS], b_batch_strides[KILN_MAX_DIMS];
    long long a_row, a_col, b_row, b_col;
    int batch_ndim;
    int unused;
} nvrtc_matmul_args;

typedef enum {
    NVRTC_EAGER_ELEMENTWISE, /* op of the table, or OP_CAST: a copy converting in[0] to out */
    NVRTC_EAGER_REDUCE,      /* OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_ARGMAX */
    NVRTC_EAGER_MATMUL,
} nvrtc_eager_kind;

/* Which eager kernel: its kind, op and dtypes.
 * ELEMENTWISE: kernel(nvrtc_ew_args, out *, const in0 *, const in1 *, const in2 *);
 *   n_in inputs of dtypes in[], each converted to compute before the op
 *   (for OP_WHERE in[0] is the bool condition, not converted), the op's
 *   result converted to out. Unused input pointers are NULL.
 * REDUCE: kernel(nvrtc_reduce_args, out *, const in0 *); the input converted
 *   to compute (f32, f64 or i64), accumulated in acc (f64 or i64 for SUM, f64
 *   for MEAN, compute for MAX and MIN, i64 for ARGMAX: the first maximum, a NaN
 *   counting as the maximum), a mean divided by n in f64, stored as out.
 *   Grid: one block per output row when inner == 1, else a thread per output.
 * MATMUL: kernel(nvrtc_matmul_args, out *, const in0 *, const in1 *), all of
 *   dtype compute; integers wrap. Grid (ceil(n / tile), ceil(m / tile),
 *   batch or less) of nvrtc_matmul_tile()'s sizes. */
typedef struct {
    nvrtc_eager_kind kind;
    ir_op op;
    int n_in;
    kiln_dtype in[NVRTC_EW_INPUTS];
    kiln_dtype compute, acc, out;
} nvrtc_eager_kernel;

/* The kernel's CUDA C, malloc'd, and its extern "C" name (unique to k) in
 * name; NULL with the reason in err. */
char *nvrtc_eager_source(const nvrtc_eager_kernel *k, char *name, size_t name_size, char *err, size_t err_size);

/* Whether a kernel can take the f32 product of batch matrices of m x n as
 * its buffer product_buffer, computed in place of being read (the kernel's
 * matmul_product): an elementwise kernel over [batch * m, n] reading the
 * product through one contiguous view. */
bool nvrtc_matmul_epilogue_fits(const kx_kernel *epilogue, int product_buffer, int64_t m, int64_t n, int64_t batch);

/* The output tile a matmul kernel's block computes (rows and columns) and its
 * threads a block, for the launch. */
void nvrtc_matmul_tile(kiln_dtype dt, int *tile_m, int *tile_n, int *threads);

/* Whether the CUDA driver can be opened and its device 0 started; why not
 * in err ("no CUDA driver: ..." or "no CUDA device: ..."). */
bool nvrtc_driver_available(char *err, size_t err_size);

/* -- The device (driver.c) --------------------------------------------------- *
 * Device 0 through its primary context and one stream, into which every
 * launch and copy goes in call order. Device memory is a void * holding the
 * device address. Each call returns 0, or -1 with the driver's reason in err;
 * each starts the driver on first use. */

int cuda_start(char *err, size_t err_size);
/* The started device's "sm_XX", name and multiprocessor count. */
const char *cuda_arch(void);
const char *cuda_device_name(void);
int cuda_multiprocessors(void);
/* Copies to the device return once src may be reused; copies to the host
 * once dst holds the data (after all work queued before). */
int cuda_copy_to_device(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int cuda_copy_to_host(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int cuda_copy_on_device(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int cuda_memset(void *dst, int byte, size_t bytes, char *err, size_t err_size);
/* Waits for all queued work; reports an error a kernel raised. */
int cuda_synchronize(char *err, size_t err_size);

/* A loaded kernel: the object of nvrtc_compile_object or _source. */
typedef struct cuda_module cuda_module;
cuda_module *cuda_load(const void *object, size_t size, const char *symbol, char *err, size_t err_size);
void cuda_unload(cuda_module *m);
/* Queues m on grid (x, y, z) of block threads; params as cuLaunchKernel's. */
int cuda_launch(const cuda_module *m, const unsigned grid[3], unsigned block, void **params, char *err,
                size_t err_size);

/* The driver's own cuMemAlloc and cuMemFree, for the allocator. */
int cuda_device_alloc(void **p, size_t bytes, bool *out_of_memory, char *err, size_t err_size);
void cuda_device_free(void *p);

/* -- Device memory (allocator.c): a caching allocator ------------------------ */

/* At least bytes of device memory; *granted is the block's size, to pass
 * back to cuda_free. NULL with the reason in err. */
void *cuda_alloc(size_t bytes, size_t *granted, char *err, size_t err_size);
void cuda_free(void *at, size_t granted);
/* Returns every cached block to the driver. */
void cuda_empty_cache(void);
kiln_cuda_memory cuda_memory(void);

#endif
