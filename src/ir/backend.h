/* What a code generator offers the rest of kiln: one table of functions per
 * backend (ggml's ggml_backend_i), which the compile-or-load service, the
 * planner and the executor call through. Nothing outside a code generator
 * names LLVM or NVRTC; the cache stores the bytes compile makes. */
#ifndef KILN_IR_BACKEND_H
#define KILN_IR_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "ir/kernel.h"

/* Where code is made for. Targets live as long as the process. */
typedef struct kx_target {
    const struct kx_backend *backend;
    const char *name;  /* canonical: "cpu:<name>:<features>", "cuda:sm_90" */
    const char *id;    /* what identifies the code made for it: a cache key component */
    bool runs_here;    /* its code loads and runs in this process (the host CPU, this GPU) */
} kx_target;

/* Loaded code of a fused kernel, the backend's own. */
typedef struct kx_code kx_code;

/* The text of a compiled kernel at the stages a backend has (LLVM IR before
 * and after optimisation; CUDA C), for KILN_DUMP. */
typedef void (*kx_dump_fn)(void *ctx, const char *stage, const char *text);

typedef struct {
    int opt_level;              /* 0..3 */
    kx_kernel_options kernel;   /* the plan's choices for this kernel */
    kx_dump_fn dump;            /* NULL: no dumps */
    void *dump_ctx;
} kx_compile_options;

enum { KX_LAUNCH_BAD_INDEX = -2 };

/* A product's left operand whose values the caller knows unchanged while
 * key is (a captured tensor's storage and version: kiln_assign and a
 * traced writeback move the version): the backend may keep it in *slot as
 * its code reads it (packed), from one launch of a step to the next, and
 * must not use what it kept once the key or the operand's layout differ.
 * The slot is the caller's, one per step, NULL at first, shared by the
 * threads that launch the step at once, and ended with forget. */
typedef struct {
    uint64_t key[2];
    _Atomic(void *) *slot;
} kx_constant;

typedef struct kx_backend {
    const char *name;     /* "llvm", "nvrtc": the cache key's backend component */
    kiln_device device;   /* where its code runs */
    /* Whether a target name is one of its ("host", "cpu:...", "cuda:..."). */
    bool (*accepts)(const char *name);
    /* The target called name, or this process's own device when name is
     * NULL; NULL with why in err. */
    const kx_target *(*target)(const char *name, char *err, size_t err_size);
    /* A hash of the code generator's sources, and the toolchain's version
     * ("LLVM 19.1.7", "NVRTC 13.0"; NULL with why when it is missing). */
    const char *(*codegen_version)(void);
    const char *(*toolchain)(char *err, size_t err_size);

    /* What the planner may ask of it. */
    int split_sums_at;        /* opt_level from which it sums a row in partial sums (vector lanes, threads) */
    int64_t stream_bytes;     /* kernels storing this much stream (kx_kernel_options); 0: never */
    bool runs_row_ranges;     /* launch runs any range of rows: a product's epilogue block by block */
    int64_t product_block_bytes; /* with runs_row_ranges: a block of a product that stays in its caches */
    bool conv_products;       /* computes a conv2d node as a product (kx_conv) with its epilogue */
    /* Whether it compiles k (with a product: whether it fuses that
     * epilogue); why not in why. */
    bool (*supports)(const kx_kernel *k, char *why, size_t why_size);

    /* Compiles k into *object (malloc'd), whose entry point is symbol. 0, or
     * -1 with why in err. Safe from several threads at once. */
    int (*compile)(const kx_kernel *k, const char *symbol, const kx_target *t, const kx_compile_options *o,
                   void **object, size_t *size, char *err, size_t err_size);
    /* Loads object (borrowed) for this process, with the launch geometry the
     * generator chose for k; NULL with why. */
    kx_code *(*load)(const kx_kernel *k, const void *object, size_t size, const char *symbol, char *err,
                     size_t err_size);
    /* Runs rows [begin, end) of the kernel (all of them unless
     * runs_row_ranges) over buffers (inputs, then outputs) for the symbols'
     * values (IR_MAX_SYMBOLS of them); product lays out the operands of k's
     * product, which follow the buffers, or is NULL; an attention kernel's
     * are two, the scores' (q, kᵀ) and the weights' (their stand-in, v),
     * and q, kᵀ and v follow the buffers. 0, or -1 with why; or
     * KX_LAUNCH_BAD_INDEX with the gather's error (kx_bad_index_text) when
     * a kx_indexed kernel met an index out of range. constant: NULL, or
     * how the product's left operand may be kept packed. */
    int (*launch)(const kx_code *code, void *const *buffers, const kg_matmul_args *product, const int64_t *symbols,
                  const kx_constant *constant, int64_t begin, int64_t end, char *err, size_t err_size);
    void (*unload)(kx_code *code);
    /* Frees what a launch kept in a kx_constant's slot (NULL: nothing);
     * NULL when it keeps nothing. */
    void (*forget)(void *kept);

    /* Optional (NULL when it has none): the shape-generic kernels of eager
     * ops, as compile and load above. A loaded one stays for the process. */
    int (*compile_generic)(const kg_kernel *k, const char *symbol, const kx_target *t, kx_dump_fn dump,
                           void *dump_ctx, void **object, size_t *size, char *err, size_t err_size);
    int (*load_generic)(const kg_kernel *k, const void *object, size_t size, const char *symbol, kg_code *code,
                        char *err, size_t err_size);
    /* Optional, a CPU backend's: runs a loaded MATMUL generic kernel here,
     * out = a @ b as args lays them out (out contiguous), over kiln's
     * threads. 0, or -1 with why (out of memory). */
    int (*host_matmul)(const kg_code *code, const kg_matmul_args *args, void *out, const void *a, const void *b,
                       char *err, size_t err_size);
} kx_backend;

#endif
