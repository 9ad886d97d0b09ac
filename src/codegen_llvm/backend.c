/* The LLVM backend's table: targets, support, compiling, loading, and
 * launching a kernel's rows across kiln's thread pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_llvm/internal.h"
#include "core/core.h"

/* Rows per pool task: enough elements that a task outweighs its dispatch,
 * fewer where each element costs a transcendental function. */
enum { TASK_ELEMENTS = 32768, TASK_ELEMENTS_TRANSCENDENTAL = 4096 };

/* A kernel a store of at least this many bytes streams (kx_kernel_options). */
#define STREAM_BYTES (32 << 20)

struct kx_code {
    llvm_code *code;
    llvm_kernel_fn fn;
    int64_t work;  /* elements a pool task takes at least */
    ir_poly cols;  /* the kernel's row length */
};

static bool accepts(const char *name)
{
    return !strcmp(name, "host") || !strncmp(name, "cpu:", 4);
}

static const kx_target *target(const char *name, char *err, size_t err_size)
{
    const llvm_target *t = llvm_target_get(name ? name : "host", err, err_size);
    return t ? llvm_target_of(t) : NULL;
}

static const char *toolchain(char *err, size_t err_size)
{
    (void)err, (void)err_size;
    return llvm_toolchain();
}

static bool supports(const kx_kernel *k, char *why, size_t why_size)
{
    if (k->product < 0)
        return true;
    snprintf(why, why_size, "a product computed inside its epilogue's kernel is not in the LLVM backend");
    return false;
}

static int compile(const kx_kernel *k, const char *symbol, const kx_target *t, const kx_compile_options *o,
                   void **object, size_t *size, char *err, size_t err_size)
{
    const llvm_target *named = llvm_target_from(t);
    char *before = NULL, *after = NULL;
    llvm_options lo = {o->opt_level, o->kernel.stream_stores, o->dump ? &before : NULL, o->dump ? &after : NULL};
    int status = llvm_compile_object(k, symbol, named, &lo, object, size, err, err_size);
    if (before)
        o->dump(o->dump_ctx, "llvm-before", before);
    if (after)
        o->dump(o->dump_ctx, "llvm-after", after);
    free(before);
    free(after);
    return status;
}

static kx_code *load(const kx_kernel *k, const void *object, size_t size, const char *symbol, char *err,
                     size_t err_size)
{
    kx_code *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    if (!(c->code = llvm_load(object, size, symbol, &c->fn, err, err_size))) {
        free(c);
        return NULL;
    }
    c->work = k->transcendental ? TASK_ELEMENTS_TRANSCENDENTAL : TASK_ELEMENTS;
    ir_size_poly(&k->sizes, k->cols, &c->cols);
    return c;
}

typedef struct {
    const kx_code *code;
    void *const *buffers;
    const int64_t *symbols;
    int64_t first_row;
} rows_call;

static void run_rows(void *ctx, int64_t begin, int64_t end)
{
    const rows_call *c = ctx;
    c->code->fn(c->buffers, c->first_row + begin, c->first_row + end, c->symbols);
}

static int launch(const kx_code *code, void *const *buffers, const kg_matmul_args *product, const int64_t *symbols,
                  int64_t begin, int64_t end, char *err, size_t err_size)
{
    (void)product, (void)err, (void)err_size;
    rows_call call = {code, buffers, symbols, begin};
    int64_t cols = ir_poly_eval(&code->cols, symbols);
    core_parallel_for(end - begin, cols > 0 ? code->work / cols : code->work, run_rows, &call);
    return 0;
}

static void unload(kx_code *code)
{
    if (!code)
        return;
    llvm_code_free(code->code);
    free(code);
}

const kx_backend llvm_backend = {
    .name = "llvm",
    .device = KILN_CPU,
    .accepts = accepts,
    .target = target,
    .codegen_version = llvm_codegen_version,
    .toolchain = toolchain,
    .split_sums_at = 2, /* LLVM vectorizes from O2 */
    .stream_bytes = STREAM_BYTES,
    .runs_row_ranges = true,
    .product_block_bytes = STREAM_BYTES / 4, /* 8 MiB: in a server CPU's L2 and L3 with room to spare */
    .supports = supports,
    .compile = compile,
    .load = load,
    .launch = launch,
    .unload = unload,
};
