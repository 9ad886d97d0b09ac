/* Eager tensors on CUDA: moving them between devices, and running each op
 * through the shape-generic kernels of the kernel IR (ir/kernel.h), one per
 * op and dtypes, made once by the compile-or-load service (src/kernels) and
 * kept in the cache like any kernel.
 *
 * An op's operands must all be on one device; a CPU 0-d tensor (or the
 * scalar of a *_scalar form) goes with a CUDA tensor as a value passed to the
 * kernel, as PyTorch allows. */
#include <pthread.h>
#include <string.h>

#include "eager/internal.h"
#include "kernels/kernels.h"

enum { KERNEL_SLOTS = 1024 };

/* -- Kernels by request ----------------------------------------------------- */

/* Requests seen in this process and their loaded kernels: finding one is a
 * hash and a compare, not naming it again. Bounded: there are only so many
 * ops and dtypes; past KERNEL_SLOTS a request is served by the service's own
 * table. The lock is held only to look and to insert, never across a
 * compile. */
static struct {
    pthread_mutex_t lock;
    kg_kernel request[KERNEL_SLOTS];
    kg_code code[KERNEL_SLOTS];
} kernels = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uint32_t request_hash(const kg_kernel *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

kg_kernel cuda_request(kg_kind kind, ir_op op, int n_in)
{
    kg_kernel k;
    memset(&k, 0, sizeof k);
    k.kind = kind;
    k.op = op;
    k.n_in = n_in;
    return k;
}

/* Under the lock: k's slot, or the empty one it would take (-1: full). */
static int slot_of(const kg_kernel *k)
{
    uint32_t at = request_hash(k) % KERNEL_SLOTS;
    for (int probe = 0; probe < KERNEL_SLOTS; probe++, at = (at + 1) % KERNEL_SLOTS)
        if (!kernels.code[at].module || !memcmp(&kernels.request[at], k, sizeof *k))
            return (int)at;
    return -1;
}

int cuda_kernel(const char *fn, const kg_kernel *k, kg_code *code)
{
    pthread_mutex_lock(&kernels.lock);
    int at = slot_of(k);
    bool found = at >= 0 && kernels.code[at].module;
    if (found)
        *code = kernels.code[at];
    pthread_mutex_unlock(&kernels.lock);
    if (found)
        return 0;
    char err[4096];
    int status = kernels_generic(KILN_CUDA, k, code, err, sizeof err);
    if (status < 0)
        return core_fail(status == KERNELS_REQUIRED_MISSING ? CORE_STATE : CORE_DEVICE, fn,
                         "no CUDA kernel for %s on %s: %s", ir_ops[k->op].name, kiln_dtype_name(k->compute), err);
    pthread_mutex_lock(&kernels.lock);
    if ((at = slot_of(k)) >= 0 && !kernels.code[at].module) {
        kernels.request[at] = *k;
        kernels.code[at] = *code;
    }
    pthread_mutex_unlock(&kernels.lock);
    return 0;
}

int cuda_launch(const char *fn, const kg_code *code, const unsigned grid[3], void **params)
{
    char err[512];
    if (device_launch(code->module, grid, (unsigned)code->threads, params, err, sizeof err) < 0)
        return core_fail(CORE_DEVICE, fn, "%s", err);
    return 0;
}

const unsigned *cuda_grid_over(unsigned grid[3], const kg_code *code, int64_t items)
{
    grid[0] = device_grid((items + code->threads - 1) / code->threads);
    grid[1] = grid[2] = 1;
    return grid;
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
static void collapse(kg_ew_args *a, int n_in, int ndim, const int64_t *shape)
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

static void args_of(kg_ew_args *a, int n_in, const kiln_tensor *const *in, const kiln_tensor *out)
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
    kg_kernel k = cuda_request(KG_ELEMENTWISE, op, n_in);
    for (int i = 0; i < n_in; i++)
        k.in[i] = in[i]->dtype;
    k.compute = op == OP_CAST ? out->dtype : in_dt[n_in - 1];
    k.out = out->dtype;
    kg_code code;
    if (cuda_kernel(fn, &k, &code) < 0)
        return -CORE_DEVICE;
    kg_ew_args args;
    args_of(&args, n_in, in, out);
    void *pointers[1 + KG_EW_INPUTS] = {eager_data(out)};
    for (int i = 0; i < n_in; i++)
        pointers[1 + i] = is_scalar(in[i]) ? NULL : eager_data(in[i]);
    void *params[2 + KG_EW_INPUTS] = {&args};
    for (int i = 0; i <= KG_EW_INPUTS; i++)
        params[1 + i] = &pointers[i];
    unsigned grid[3];
    return cuda_launch(fn, &code, cuda_grid_over(grid, &code, out->numel), params);
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
    kg_kernel k = cuda_request(KG_REDUCE, op, 1);
    k.in[0] = in->dtype;
    k.compute = compute;
    k.acc = op == OP_ARGMAX || op == OP_ARGMIN ? KILN_I64
            : op == OP_MAX || op == OP_MIN      ? compute
            : compute == KILN_I64 && op != OP_MEAN ? KILN_I64 : KILN_F64;
    k.out = out->dtype;
    kg_code code;
    int status = cuda_kernel(fn, &k, &code) < 0 ? -CORE_DEVICE : 0;
    if (status == 0) {
        kg_reduce_args args = {outer, n, inner};
        void *pointers[2] = {eager_data(out), eager_data(in)};
        void *params[3] = {&args, &pointers[0], &pointers[1]};
        unsigned grid[3] = {device_grid(outer), 1, 1}; /* a block per output row */
        status = cuda_launch(fn, &code, inner == 1 ? grid : cuda_grid_over(grid, &code, outer * inner), params);
    }
    kiln_release(staged);
    return status;
}

/* -- Matrix products -------------------------------------------------------- */

int cuda_matmul(const char *fn, const kg_matmul_args *args, kiln_dtype dt, const kiln_tensor *a,
                const kiln_tensor *b, kiln_tensor *out)
{
    if (out->numel == 0)
        return 0;
    kg_kernel k = cuda_request(KG_MATMUL, OP_MATMUL, 2);
    k.in[0] = k.in[1] = k.compute = k.acc = k.out = dt;
    kg_code code;
    if (cuda_kernel(fn, &k, &code) < 0)
        return -CORE_DEVICE;
    kg_matmul_args copy = *args;
    void *pointers[3] = {eager_data(out), eager_data(a), eager_data(b)};
    void *params[4] = {&copy, &pointers[0], &pointers[1], &pointers[2]};
    unsigned grid[3];
    kg_matmul_grid(args, code.tile_m, code.tile_n, grid);
    return cuda_launch(fn, &code, grid, params);
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
                 : device == KILN_CPU ? device_download(out->storage->data, eager_data(t), bytes, err, sizeof err)
                                      : device_upload(eager_data(out), eager_data(t), bytes, err, sizeof err);
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
    if (device_start(why, sizeof why) == 0)
        return 1;
    core_fail(CORE_DEVICE, "kiln_cuda_available", "%s", why);
    return 0;
}

int kiln_cuda_memory_stats(kiln_cuda_memory *out)
{
    if (!out)
        return core_fail_null_arg("kiln_cuda_memory_stats", "out");
    char why[512];
    if (device_start(why, sizeof why) < 0)
        return core_fail(CORE_DEVICE, "kiln_cuda_memory_stats", "%s", why);
    *out = device_memory();
    return 0;
}

void kiln_cuda_empty_cache(void)
{
    device_empty_cache();
}

int kiln_cuda_synchronize(void)
{
    char why[512];
    if (device_synchronize(why, sizeof why) < 0)
        return core_fail(CORE_DEVICE, "kiln_cuda_synchronize", "%s", why);
    return 0;
}

const char *kiln_cuda_device_name(void)
{
    return kiln_cuda_available() ? device_name() : NULL;
}

/* -- Fused kernels of traced graphs ----------------------------------------- */

kiln_tensor *eager_empty(const char *fn, kiln_device device, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return tensor_new_on(fn, device, dt, ndim, shape);
}
