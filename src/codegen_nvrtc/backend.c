/* The NVRTC backend's table: CUDA targets, support, compiling by NVRTC, and
 * loading and launching through the device runtime (src/device). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_nvrtc/internal.h"
#include "device/device.h"

struct kx_code {
    device_module *module;
    bool product;          /* launched as a matmul, its epilogue applied to each tile */
    nvrtc_layout layout;   /* else: a block per row or a thread per item */
    ir_poly rows, cols;    /* the kernel's, in the symbols */
    int n_buffers;
    bool indexed;          /* kx_indexed: it takes the bad words after its symbols */
};

/* What a fused kernel's last parameter, kiln_symbols, holds. */
typedef struct {
    long long s[IR_MAX_SYMBOLS];
} symbols_arg;

/* A GPU architecture code is compiled for. */
typedef struct arch_target {
    kx_target base;
    char name[32], arch[16];
    struct arch_target *next;
} arch_target;

static struct {
    pthread_mutex_t lock;
    arch_target *targets;
} targets = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool accepts(const char *name)
{
    return !strncmp(name, "cuda:", 5);
}

/* The target of arch, made once. */
static const kx_target *target_of(const char *arch, char *err, size_t err_size)
{
    pthread_mutex_lock(&targets.lock);
    arch_target *t = targets.targets;
    while (t && strcmp(t->arch, arch))
        t = t->next;
    if (!t && (t = calloc(1, sizeof *t))) {
        char ignored[512];
        snprintf(t->arch, sizeof t->arch, "%s", arch);
        snprintf(t->name, sizeof t->name, "cuda:%s", arch);
        bool here = device_start(ignored, sizeof ignored) == 0 && !strcmp(device_arch(), arch);
        t->base = (kx_target){&nvrtc_backend, t->name, t->arch, here};
        t->next = targets.targets;
        targets.targets = t;
    }
    pthread_mutex_unlock(&targets.lock);
    if (!t)
        snprintf(err, err_size, "out of memory");
    return t ? &t->base : NULL;
}

static const kx_target *target(const char *name, char *err, size_t err_size)
{
    char own[32], arch[16];
    if (!name) { /* this process's GPU */
        if (device_start(err, err_size) < 0)
            return NULL;
        snprintf(own, sizeof own, "cuda:%s", device_arch());
        name = own;
    }
    if (nvrtc_target(name, arch, sizeof arch, err, err_size) < 0)
        return NULL;
    return target_of(arch, err, err_size);
}

static int compile(const kx_kernel *k, const char *symbol, const kx_target *t, const kx_compile_options *o,
                   void **object, size_t *size, char *err, size_t err_size)
{
    char *source = NULL;
    int status = nvrtc_compile_object(k, symbol, t->id, o->dump ? &source : NULL, object, size, err, err_size);
    if (source)
        o->dump(o->dump_ctx, "cuda", source);
    free(source);
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
    if (!(c->module = nvrtc_load(object, size, symbol, err, err_size))) {
        free(c);
        return NULL;
    }
    c->product = k->product >= 0;
    c->layout = nvrtc_layout_of(k);
    ir_size_poly(&k->sizes, k->rows, &c->rows);
    ir_size_poly(&k->sizes, k->cols, &c->cols);
    c->n_buffers = k->n_buffers;
    c->indexed = kx_indexed(k);
    return c;
}

/* A fused product: (args, A, B, buffers...) on the matmul's grid. */
static int launch_product(const kx_code *code, void *const *buffers, const kg_matmul_args *product, char *err,
                          size_t err_size)
{
    int n_buffers = code->n_buffers;
    kg_matmul_args args = *product;
    void *params[3 + KX_MAX_BUFFERS] = {&args, (void *)&buffers[n_buffers], (void *)&buffers[n_buffers + 1]};
    for (int i = 0; i < n_buffers; i++)
        params[3 + i] = (void *)&buffers[i];
    int tile_m, tile_n, threads;
    unsigned grid[3];
    nvrtc_matmul_tile(KILN_F32, &tile_m, &tile_n, &threads);
    kg_matmul_grid(&args, tile_m, tile_n, grid);
    return device_launch(code->module, grid, (unsigned)threads, params, err, err_size);
}

/* A kx_indexed kernel's launch: KX_LAUNCH_BAD_INDEX with the gather's error
 * when its bad words flag one. */
static int launch_checked(const kx_code *code, const unsigned grid[3], void **params, char *err, size_t err_size)
{
    int64_t bad[KX_BAD_WORDS] = {0};
    int status = device_launch_flagged(code->module, grid, NVRTC_BLOCK, params, code->n_buffers + 1, bad, KX_BAD_WORDS,
                                       err, err_size);
    if (status < 0 || !bad[KX_BAD_FLAG])
        return status;
    kx_bad_index_text(bad, err, err_size);
    return KX_LAUNCH_BAD_INDEX;
}

/* Every launch strides over its rows or elements, so any grid computes the
 * whole kernel: one as large as fills the device (device_grid). */
static int launch(const kx_code *code, void *const *buffers, const kg_matmul_args *product, const int64_t *symbols,
                  const kx_constant *constant, int64_t begin, int64_t end, char *err, size_t err_size)
{
    (void)constant, (void)begin, (void)end;
    if (code->product)
        return launch_product(code, buffers, product, err, err_size);
    const nvrtc_layout *l = &code->layout;
    int64_t items = nvrtc_items(l, ir_poly_eval(&code->rows, symbols), ir_poly_eval(&code->cols, symbols));
    if (items == 0)
        return 0;
    symbols_arg sz;
    for (int s = 0; s < IR_MAX_SYMBOLS; s++)
        sz.s[s] = symbols[s];
    void *params[KX_MAX_BUFFERS + 2];
    for (int b = 0; b < code->n_buffers; b++)
        params[b] = (void *)&buffers[b];
    params[code->n_buffers] = &sz;
    int64_t blocks = l->per_row ? items : (items + NVRTC_BLOCK - 1) / NVRTC_BLOCK;
    unsigned grid[3] = {device_grid(blocks), 1, 1};
    if (code->indexed)
        return launch_checked(code, grid, params, err, err_size);
    return device_launch(code->module, grid, NVRTC_BLOCK, params, err, err_size);
}

static void unload(kx_code *code)
{
    if (!code)
        return;
    device_unload(code->module);
    free(code);
}

static int compile_generic(const kg_kernel *k, const char *symbol, const kx_target *t, kx_dump_fn dump,
                           void *dump_ctx, void **object, size_t *size, char *err, size_t err_size)
{
    char name[256];
    char *source = nvrtc_eager_source(k, name, sizeof name, err, err_size);
    if (!source)
        return -1;
    if (dump)
        dump(dump_ctx, "cuda", source);
    int status = nvrtc_compile_source(source, symbol, t->id, object, size, err, err_size);
    free(source);
    return status;
}

static int load_generic(const kg_kernel *k, const void *object, size_t size, const char *symbol, kg_code *code,
                        char *err, size_t err_size)
{
    *code = (kg_code){.threads = KG_BLOCK};
    if (k->kind == KG_MATMUL)
        nvrtc_matmul_tile(k->compute, &code->tile_m, &code->tile_n, &code->threads);
    code->module = nvrtc_load(object, size, symbol, err, err_size);
    return code->module ? 0 : -1;
}

const kx_backend nvrtc_backend = {
    .name = "nvrtc",
    .device = KILN_CUDA,
    .accepts = accepts,
    .target = target,
    .codegen_version = nvrtc_codegen_version,
    .toolchain = nvrtc_toolchain,
    .split_sums_at = 0, /* a block's threads each sum a part of the row */
    .stream_bytes = 0,
    .runs_row_ranges = false,
    .supports = nvrtc_supports,
    .compile = compile,
    .load = load,
    .launch = launch,
    .unload = unload,
    .compile_generic = compile_generic,
    .load_generic = load_generic,
};
