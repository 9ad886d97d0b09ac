/* Eager tensors on CUDA: moving them between devices, and running each op
 * through the shape-generic kernels of src/codegen_nvrtc, one per op and
 * dtypes, compiled once by NVRTC and kept in the cache like any kernel.
 *
 * An op's operands must all be on one device; a CPU 0-d tensor (or the
 * scalar of a *_scalar form) goes with a CUDA tensor as a value passed to the
 * kernel, as PyTorch allows. */
#include <pthread.h>
#include <string.h>

#ifdef KILN_HAVE_LLVM
#include "cache/cache.h"
#endif
#include "eager/internal.h"
#include "ir/kernel.h"

enum { KERNEL_SLOTS = 1024, GRID_PER_SM = 32, GRID_Z_MAX = 65535 }; /* GRID_Z_MAX: also y's limit */

/* -- Kernels by request ----------------------------------------------------- */

/* Requests seen in this process and their loaded kernels: finding one is a
 * hash and a compare, not generating its source again. Bounded: there are
 * only so many ops and dtypes; past KERNEL_SLOTS a request is served by the
 * cache's own table. */
static struct {
    pthread_mutex_t lock;
    nvrtc_eager_kernel request[KERNEL_SLOTS];
    cuda_module *module[KERNEL_SLOTS];
} kernels = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint32_t request_hash(const nvrtc_eager_kernel *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

/* The kernel of source through the cache; a build without the cache (it
 * comes with LLVM) compiles it each process. */
static cuda_module *load_source(const char *source, const char *name, char *err, size_t err_size)
{
    cuda_module *module = NULL;
#ifdef KILN_HAVE_LLVM
    if (cache_cuda_source(source, name, &module, err, err_size) < 0)
        return NULL;
#else
    char target[32], arch[16];
    void *object = NULL;
    size_t size = 0;
    if (cuda_start(err, err_size) == 0 && snprintf(target, sizeof target, "cuda:%s", cuda_arch()) > 0 &&
        nvrtc_target(target, arch, sizeof arch, err, err_size) == 0 &&
        nvrtc_compile_source(source, name, arch, &object, &size, err, err_size) == 0)
        module = cuda_load(object, size, name, err, err_size);
    free(object);
#endif
    return module;
}

static cuda_module *compile_request(const char *fn, const nvrtc_eager_kernel *k)
{
    char name[128], err[4096];
    char *source = nvrtc_eager_source(k, name, sizeof name, err, sizeof err);
    cuda_module *module = source ? load_source(source, name, err, sizeof err) : NULL;
    free(source);
    if (!module)
        core_fail(CORE_DEVICE, fn, "no CUDA kernel for %s on %s: %s", ir_ops[k->op].name, kiln_dtype_name(k->compute),
                  err);
    return module;
}

/* A request, zeroed throughout: the whole struct is the key. */
static nvrtc_eager_kernel request(nvrtc_eager_kind kind, ir_op op, int n_in)
{
    nvrtc_eager_kernel k;
    memset(&k, 0, sizeof k);
    k.kind = kind;
    k.op = op;
    k.n_in = n_in;
    return k;
}

static cuda_module *kernel_for_request(const char *fn, const nvrtc_eager_kernel *k)
{
    uint32_t at = request_hash(k) % KERNEL_SLOTS;
    pthread_mutex_lock(&kernels.lock);
    for (int probe = 0; probe < KERNEL_SLOTS; probe++, at = (at + 1) % KERNEL_SLOTS) {
        if (!kernels.module[at])
            break;
        if (!memcmp(&kernels.request[at], k, sizeof *k)) {
            cuda_module *found = kernels.module[at];
            pthread_mutex_unlock(&kernels.lock);
            return found;
        }
    }
    cuda_module *module = compile_request(fn, k);
    if (module && !kernels.module[at]) {
        kernels.request[at] = *k;
        kernels.module[at] = module;
    }
    pthread_mutex_unlock(&kernels.lock);
    return module;
}

static int launch(const char *fn, const cuda_module *m, const unsigned grid[3], unsigned block, void **params)
{
    char err[512];
    if (cuda_launch(m, grid, block, params, err, sizeof err) < 0)
        return core_fail(CORE_DEVICE, fn, "%s", err);
    return 0;
}

static unsigned grid_for(int64_t items)
{
    int64_t cap = (int64_t)cuda_multiprocessors() * GRID_PER_SM;
    int64_t blocks = (items + NVRTC_EAGER_BLOCK - 1) / NVRTC_EAGER_BLOCK;
    if (blocks > cap)
        blocks = cap;
    return blocks < 1 ? 1 : (unsigned)blocks;
}

/* -- Devices of operands ---------------------------------------------------- */

/* A CPU value that goes with CUDA operands as a kernel argument. */
static bool is_scalar(const kiln_tensor *t)
{
    return t->device == KILN_CPU && t->ndim == 0;
}

int cuda_operands_device(const char *fn, int n, const kiln_tensor *const *in, kiln_device *device)
{
    *device = KILN_CPU;
    for (int k = 0; k < n; k++)
        if (in[k]->device == KILN_CUDA)
            *device = KILN_CUDA;
    if (*device == KILN_CPU)
        return 0;
    for (int k = 0; k < n; k++) {
        if (in[k]->device == KILN_CUDA || is_scalar(in[k]))
            continue;
        char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
        const kiln_tensor *other = in[k == 0 ? 1 : 0];
        for (int j = 0; j < n; j++)
            if (in[j]->device == KILN_CUDA)
                other = in[j];
        return core_fail(CORE_DEVICE, fn, "operands are on different devices: %s on the CPU, %s on CUDA "
                         "(move one with kiln_to_device)", describe(a, in[k]), describe(b, other));
    }
    return 0;
}

/* -- Elementwise ------------------------------------------------------------ */

static bool strides_contiguous(int ndim, const int64_t *shape, const int64_t *strides)
{
    int64_t step = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] != 1 && strides[d] != step)
            return false;
        step *= shape[d];
    }
    return true;
}

/* Drops size-1 axes and merges neighbours every operand walks as one. */
static void collapse(nvrtc_ew_args *a, int n_in, int ndim, const int64_t *shape)
{
    int out = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        bool merge = out > 0 && a->out_strides[out - 1] == a->out_strides[d] * shape[d];
        for (int k = 0; k < n_in && merge; k++)
            merge = a->in_strides[k][out - 1] == a->in_strides[k][d] * shape[d];
        int to = merge ? out - 1 : out++;
        a->shape[to] = merge ? a->shape[to] * shape[d] : shape[d];
        a->out_strides[to] = a->out_strides[d];
        for (int k = 0; k < n_in; k++)
            a->in_strides[k][to] = a->in_strides[k][d];
    }
    a->ndim = out;
}

static void args_of(nvrtc_ew_args *a, int n_in, const kiln_tensor *const *in, const kiln_tensor *out)
{
    memset(a, 0, sizeof *a);
    a->numel = out->numel;
    for (int d = 0; d < out->ndim; d++)
        a->out_strides[d] = out->strides[d];
    for (int k = 0; k < n_in; k++) {
        if (is_scalar(in[k])) {
            a->scalar_mask |= 1 << k;
            memcpy(&a->scalar_bits[k], eager_data(in[k]), eager_dtype_size(in[k]->dtype));
            continue;
        }
        int64_t strides[KILN_MAX_DIMS];
        broadcast_strides(in[k], out->ndim, out->shape, strides);
        for (int d = 0; d < out->ndim; d++)
            a->in_strides[k][d] = strides[d];
    }
    collapse(a, n_in, out->ndim, out->shape);
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++)
        shape[d] = a->shape[d];
    bool contiguous = true;
    for (int k = -1; k < n_in && contiguous; k++) {
        if (k >= 0 && (a->scalar_mask >> k & 1))
            continue;
        for (int d = 0; d < a->ndim; d++)
            strides[d] = k < 0 ? a->out_strides[d] : a->in_strides[k][d];
        contiguous = strides_contiguous(a->ndim, shape, strides);
    }
    a->contiguous = contiguous;
}

int cuda_elementwise(const char *fn, ir_op op, int n_in, const kiln_tensor *const *in, const kiln_dtype *in_dt,
                     kiln_tensor *out)
{
    if (out->numel == 0)
        return 0;
    nvrtc_eager_kernel k = request(NVRTC_EAGER_ELEMENTWISE, op, n_in);
    for (int i = 0; i < n_in; i++)
        k.in[i] = in[i]->dtype;
    k.compute = op == OP_CAST ? out->dtype : in_dt[n_in - 1];
    k.out = out->dtype;
    cuda_module *m = kernel_for_request(fn, &k);
    if (!m)
        return -CORE_DEVICE;
    nvrtc_ew_args args;
    args_of(&args, n_in, in, out);
    void *pointers[1 + NVRTC_EW_INPUTS] = {eager_data(out)};
    for (int i = 0; i < n_in; i++)
        pointers[1 + i] = is_scalar(in[i]) ? NULL : eager_data(in[i]);
    void *params[2 + NVRTC_EW_INPUTS] = {&args};
    for (int i = 0; i <= NVRTC_EW_INPUTS; i++)
        params[1 + i] = &pointers[i];
    return launch(fn, m, (unsigned[3]){grid_for(out->numel), 1, 1}, NVRTC_EAGER_BLOCK, params);
}

/* -- Reductions ------------------------------------------------------------- */

int cuda_reduce(const char *fn, ir_op op, const kiln_tensor *in, int64_t outer, int64_t n, int64_t inner,
                kiln_tensor *out)
{
    kiln_dtype compute = ir_dtype_is_float(in->dtype) ? in->dtype : KILN_I64;
    kiln_tensor *staged = NULL;
    if (!eager_is_contiguous(in)) {
        if (!(staged = copy_as(fn, in, in->dtype)))
            return -CORE_NOMEM;
        in = staged;
    }
    nvrtc_eager_kernel k = request(NVRTC_EAGER_REDUCE, op, 1);
    k.in[0] = in->dtype;
    k.compute = compute;
    k.acc = op == OP_ARGMAX ? KILN_I64 : op == OP_MAX || op == OP_MIN ? compute
                                        : compute == KILN_I64 && op == OP_SUM ? KILN_I64 : KILN_F64;
    k.out = out->dtype;
    cuda_module *m = kernel_for_request(fn, &k);
    int status = -CORE_DEVICE;
    if (m) {
        nvrtc_reduce_args args = {outer, n, inner};
        void *pointers[2] = {eager_data(out), eager_data(in)};
        void *params[3] = {&args, &pointers[0], &pointers[1]};
        unsigned blocks = inner == 1 ? (unsigned)(outer < GRID_Z_MAX ? outer : GRID_Z_MAX) : grid_for(outer * inner);
        status = launch(fn, m, (unsigned[3]){blocks ? blocks : 1, 1, 1}, NVRTC_EAGER_BLOCK, params);
    }
    kiln_release(staged);
    return status;
}

/* -- Matrix products -------------------------------------------------------- */

/* A tile per block; the kernel loops over tiles and batches past its grid,
 * so y and z are capped. */
static void matmul_shape(const nvrtc_matmul_args *args, kiln_dtype dt, unsigned grid[3], unsigned *threads)
{
    int tile_m, tile_n, block;
    nvrtc_matmul_tile(dt, &tile_m, &tile_n, &block);
    int64_t tiles_m = (args->m + tile_m - 1) / tile_m;
    grid[0] = (unsigned)((args->n + tile_n - 1) / tile_n);
    grid[1] = (unsigned)(tiles_m < GRID_Z_MAX ? tiles_m : GRID_Z_MAX);
    grid[2] = (unsigned)(args->batch < GRID_Z_MAX ? args->batch : GRID_Z_MAX);
    *threads = (unsigned)block;
}

int cuda_matmul(const char *fn, const nvrtc_matmul_args *args, kiln_dtype dt, const kiln_tensor *a,
                const kiln_tensor *b, kiln_tensor *out)
{
    if (out->numel == 0)
        return 0;
    nvrtc_eager_kernel k = request(NVRTC_EAGER_MATMUL, OP_MATMUL, 2);
    k.in[0] = k.in[1] = k.compute = k.acc = k.out = dt;
    cuda_module *m = kernel_for_request(fn, &k);
    if (!m)
        return -CORE_DEVICE;
    nvrtc_matmul_args copy = *args;
    void *pointers[3] = {eager_data(out), eager_data(a), eager_data(b)};
    void *params[4] = {&copy, &pointers[0], &pointers[1], &pointers[2]};
    unsigned grid[3], threads;
    matmul_shape(args, dt, grid, &threads);
    return launch(fn, m, grid, threads, params);
}

/* -- Moving between devices ------------------------------------------------- */

/* A new contiguous copy of t on device (the other one than t's). */
static kiln_tensor *moved(const char *fn, const kiln_tensor *t, kiln_device device)
{
    kiln_tensor *staged = NULL;
    if (!eager_is_contiguous(t)) {
        if (!(staged = copy_as(fn, t, t->dtype)))
            return NULL;
        t = staged;
    }
    kiln_tensor *out = tensor_new_on(fn, device, t->dtype, t->ndim, t->shape);
    size_t bytes = (size_t)t->numel * eager_dtype_size(t->dtype);
    char err[512];
    int status = !out ? -1
                 : device == KILN_CPU ? cuda_copy_to_host(out->storage->data, eager_data(t), bytes, err, sizeof err)
                                      : cuda_copy_to_device(eager_data(out), eager_data(t), bytes, err, sizeof err);
    if (out && status < 0) {
        core_fail(CORE_DEVICE, fn, "%s", err);
        out = tensor_drop(out);
    }
    kiln_release(staged);
    return out;
}

kiln_tensor *cuda_to_host(const char *fn, const kiln_tensor *t)
{
    return moved(fn, t, KILN_CPU);
}

kiln_tensor *cuda_from_host(const char *fn, const kiln_tensor *t)
{
    return moved(fn, t, KILN_CUDA);
}

/* -- Public ----------------------------------------------------------------- */

int kiln_cuda_available(void)
{
    char why[512];
    if (cuda_start(why, sizeof why) == 0)
        return 1;
    core_fail(CORE_DEVICE, "kiln_cuda_available", "%s", why);
    return 0;
}

int kiln_cuda_memory_stats(kiln_cuda_memory *out)
{
    if (!out)
        return core_fail_null_arg("kiln_cuda_memory_stats", "out");
    char why[512];
    if (cuda_start(why, sizeof why) < 0)
        return core_fail(CORE_DEVICE, "kiln_cuda_memory_stats", "%s", why);
    *out = cuda_memory();
    return 0;
}

void kiln_cuda_empty_cache(void)
{
    cuda_empty_cache();
}

int kiln_cuda_synchronize(void)
{
    char why[512];
    if (cuda_synchronize(why, sizeof why) < 0)
        return core_fail(CORE_DEVICE, "kiln_cuda_synchronize", "%s", why);
    return 0;
}

const char *kiln_cuda_device_name(void)
{
    return kiln_cuda_available() ? cuda_device_name() : NULL;
}

/* -- Fused kernels of traced graphs ----------------------------------------- */

kiln_tensor *eager_empty(const char *fn, kiln_device device, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return tensor_new_on(fn, device, dt, ndim, shape);
}

int eager_cuda_kernel(const char *fn, const void *module, const kx_kernel *k, void *const *buffers)
{
    void *params[KX_MAX_BUFFERS];
    for (int b = 0; b < k->n_buffers; b++)
        params[b] = (void *)&buffers[b];
    bool rows = k->n_reductions > 0 || k->n_row_stores > 0;
    unsigned blocks = rows ? (unsigned)(k->rows < (1 << 20) ? k->rows : 1 << 20) : grid_for(k->rows * k->cols);
    if (k->rows * k->cols == 0 && !rows)
        return 0;
    return launch(fn, module, (unsigned[3]){blocks ? blocks : 1, 1, 1}, NVRTC_BLOCK, params);
}

int eager_cuda_matmul_kernel(const char *fn, const void *module, const kx_kernel *k, const kiln_tensor *a,
                             const kiln_tensor *b, void *const *buffers)
{
    nvrtc_matmul_args args;
    if (eager_matmul_args(fn, a, b, &args) < 0)
        return -CORE_SHAPE;
    void *operands[2] = {eager_data(a), eager_data(b)};
    void *params[3 + KX_MAX_BUFFERS] = {&args, &operands[0], &operands[1]};
    for (int i = 0; i < k->n_buffers; i++)
        params[3 + i] = (void *)&buffers[i];
    unsigned grid[3], threads;
    matmul_shape(&args, KILN_F32, grid, &threads);
    return launch(fn, module, grid, threads, params);
}
