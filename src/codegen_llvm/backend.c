/* The LLVM backend's table: targets, support, compiling, loading, and
 * launching a kernel's rows across kiln's thread pool; a kernel with a
 * product, and the eager matmul's generic kernel, run as products
 * (codegen_llvm/gemm.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_llvm/gemm.h"
#include "codegen_llvm/internal.h"
#include "core/core.h"

/* Rows per pool task: enough elements that a task outweighs its dispatch,
 * fewer where each element costs a transcendental function. */
enum { TASK_ELEMENTS = 32768, TASK_ELEMENTS_TRANSCENDENTAL = 4096 };

/* Blocks of rows per thread, claimed one at a time: on a shared machine a
 * thread can lose its core for milliseconds, and with one half of the rows
 * each the call waited for it (softmax 4096x4096 behind Eigen's dynamic
 * split at a load of 4); the other thread now takes its blocks. */
enum { BLOCKS_PER_THREAD = 8 };

/* A kernel a store of at least this many bytes streams (kx_kernel_options). */
#define STREAM_BYTES (32 << 20)

struct kx_code {
    llvm_code *code;
    llvm_kernel_fn fn;
    int64_t work;  /* elements a pool task takes at least */
    ir_poly cols;  /* the kernel's row length */
    bool product;  /* runs as a product with k's epilogue on its tiles */
    bool attention;
    attention_code att; /* a product's: its gemm */
    kx_conv conv;       /* the product's convolution, if it is one */
    void *depthwise;    /* its step, when depthwise (depthwise_run) */
    int n_buffers;
    bool indexed;       /* kx_indexed: its launch passes the bad words */
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

/* Why the prologue pro of a product of dt cannot compute its left operand
 * while it is packed, or NULL. */
static const char *prologue_misfit(const kx_kernel *pro, const kx_kernel *k)
{
    if (pro->n_reductions || pro->n_row_stores || pro->n_stores != 1 || pro->product >= 0)
        return "the left operand's kernel is not one elementwise store";
    if (pro->rows != k->rows || pro->views[pro->stores[0].view].dtype != k->buffer_dtypes[k->product])
        return "the left operand's kernel is not over the product's rows, of its dtype";
    return NULL;
}

/* Why the product of kernel k cannot be computed inside it, or NULL. */
static const char *misfit(const kx_kernel *k)
{
    const char *misfits = kx_product_misfit(k);
    kiln_dtype dt = k->buffer_dtypes[k->product];
    if (!misfits && ((dt != KILN_F32 && dt != KILN_F64) || k->views[kx_product_view(k)].dtype != dt))
        return "the product is not f32 or f64";
    return misfits || !k->prologue ? misfits : prologue_misfit(k->prologue, k);
}

static bool supports(const kx_kernel *k, char *why, size_t why_size)
{
    const char *misfits = k->product >= 0 ? misfit(k) : NULL;
    if (!misfits && k->attention && (k->n_stores != 1 || k->prologue))
        misfits = "attention's scores are not one elementwise store";
    if (misfits)
        snprintf(why, why_size, "cannot fuse the epilogue into the product: %s", misfits);
    return !misfits;
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

/* A product kernel's code: its gemm, and its prologue, depthwise step or
 * attention's functions. */
static llvm_code *load_product(const kx_kernel *k, const void *object, size_t size, const char *symbol,
                               attention_code *a, void **depthwise, char *err, size_t err_size)
{
    static const char *const attention[2] = {GEMM_SCORES, GEMM_ONLINE}, *const prologue[1] = {GEMM_PROLOGUE};
    static const char *const step[1] = {GEMM_DEPTHWISE};
    void *at[2] = {NULL};
    llvm_code *code = k->attention        ? gemm_load(object, size, symbol, attention, 2, at, &a->gemm, err, err_size)
                      : conv_depthwise(&k->conv) ? gemm_load(object, size, symbol, step, 1, depthwise, &a->gemm, err,
                                                             err_size)
                                                 : gemm_load(object, size, symbol, prologue, k->prologue ? 1 : 0, at,
                                                             &a->gemm, err, err_size);
    a->gemm.prologue = k->attention ? NULL : (gemm_prologue_fn)(uintptr_t)at[0];
    a->scores = k->attention ? (attention_scores_fn)(uintptr_t)at[0] : NULL;
    a->online = k->attention ? (attention_online_fn)(uintptr_t)at[1] : NULL;
    return code;
}

static kx_code *load(const kx_kernel *k, const void *object, size_t size, const char *symbol, char *err,
                     size_t err_size)
{
    kx_code *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    c->product = k->product >= 0;
    c->attention = k->attention;
    c->n_buffers = k->n_buffers;
    c->indexed = kx_indexed(k);
    c->conv = k->conv;
    c->code = c->product ? load_product(k, object, size, symbol, &c->att, &c->depthwise, err, err_size)
                         : llvm_load(object, size, symbol, &c->fn, err, err_size);
    if (!c->code) {
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

/* Rows in blocks of grain or more, up to BLOCKS_PER_THREAD a thread. */
static int64_t rows_block(int64_t rows, int64_t grain)
{
    int64_t most = rows / grain, blocks = core_threads() * BLOCKS_PER_THREAD;
    blocks = most < blocks ? most : blocks;
    blocks = blocks < 1 ? 1 : blocks;
    return (rows + blocks - 1) / blocks;
}

/* A kernel with a product runs whole: its operands follow its buffers. */
static int launch(const kx_code *code, void *const *buffers, const kg_matmul_args *product, const int64_t *symbols,
                  const kx_constant *constant, int64_t begin, int64_t end, char *err, size_t err_size)
{
    void *const *operands = buffers + code->n_buffers; /* after the kernel's */
    if (code->attention)
        return attention_run(&code->att, product, operands[0], operands[1], operands[2],
                             buffers[code->n_buffers - 1], buffers, symbols, err, err_size);
    if (code->depthwise)
        return depthwise_run(&code->att.gemm, code->depthwise, &code->conv, product, operands[0], operands[1],
                             buffers, symbols, err, err_size);
    if (code->product)
        return gemm_run_conv(&code->att.gemm, code->conv.kh ? &code->conv : NULL, product, operands[0], operands[1],
                             NULL, buffers, symbols, constant, err, err_size);
    /* a gather's bad words follow the symbols' values (kx_expr) */
    int64_t words[IR_MAX_SYMBOLS + KX_BAD_WORDS] = {0};
    if (code->indexed)
        memcpy(words, symbols, IR_MAX_SYMBOLS * sizeof *words);
    rows_call call = {code, buffers, code->indexed ? words : symbols, begin};
    int64_t cols = ir_poly_eval(&code->cols, symbols), grain = cols > 0 ? code->work / cols : code->work;
    core_parallel_blocks(end - begin, rows_block(end - begin, grain < 1 ? 1 : grain), run_rows, &call);
    if (!words[IR_MAX_SYMBOLS + KX_BAD_FLAG])
        return 0;
    kx_bad_index_text(words + IR_MAX_SYMBOLS, err, err_size);
    return KX_LAUNCH_BAD_INDEX;
}

static void unload(kx_code *code)
{
    if (!code)
        return;
    llvm_code_free(code->code);
    free(code);
}

/* -- The eager matmul's generic kernel ------------------------------------------ */

typedef struct {
    llvm_code *code;
    gemm_code gemm;
} loaded_product;

static const char *generic_misfit(const kg_kernel *k)
{
    if (k->kind != KG_MATMUL)
        return "the LLVM backend makes only the matmul's generic kernel";
    if (k->compute != KILN_F32 && k->compute != KILN_F64)
        return "the LLVM backend's generic matmul is f32 or f64";
    return NULL;
}

static int compile_generic(const kg_kernel *k, const char *symbol, const kx_target *t, kx_dump_fn dump,
                           void *dump_ctx, void **object, size_t *size, char *err, size_t err_size)
{
    const char *misfits = generic_misfit(k);
    if (misfits) {
        snprintf(err, err_size, "%s", misfits);
        return -1;
    }
    char *before = NULL, *after = NULL;
    llvm_options lo = {3, false, dump ? &before : NULL, dump ? &after : NULL};
    int status = llvm_compile_gemm(k->compute, symbol, llvm_target_from(t), &lo, object, size, err, err_size);
    if (before)
        dump(dump_ctx, "llvm-before", before);
    if (after)
        dump(dump_ctx, "llvm-after", after);
    free(before);
    free(after);
    return status;
}

/* The loaded code stays for the process, as every generic kernel does. */
static int load_generic(const kg_kernel *k, const void *object, size_t size, const char *symbol, kg_code *code,
                        char *err, size_t err_size)
{
    const char *misfits = generic_misfit(k);
    loaded_product *p = misfits ? NULL : calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, err_size, "%s", misfits ? misfits : "out of memory");
        return -1;
    }
    if (!(p->code = gemm_load(object, size, symbol, NULL, 0, NULL, &p->gemm, err, err_size))) {
        free(p);
        return -1;
    }
    *code = (kg_code){.module = p, .threads = core_threads(), .tile_m = p->gemm.mr, .tile_n = p->gemm.nr};
    return 0;
}

static int host_matmul(const kg_code *code, const kg_matmul_args *args, void *out, const void *a, const void *b,
                       char *err, size_t err_size)
{
    const loaded_product *p = code->module;
    return gemm_run(&p->gemm, args, a, b, out, NULL, NULL, err, err_size);
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
    .conv_products = true,
    .supports = supports,
    .compile = compile,
    .load = load,
    .launch = launch,
    .unload = unload,
    .forget = gemm_forget,
    .compile_generic = compile_generic,
    .load_generic = load_generic,
    .host_matmul = host_matmul,
};
