/* Creating tensors and reading them back: from data, constants, ranges, random. */
#include <math.h>
#include <string.h>

#include "eager/internal.h"

kiln_tensor *kiln_empty(kiln_dtype dt, int ndim, const int64_t *shape)
{
    return tensor_own(tensor_new("kiln_empty", dt, ndim, shape));
}

static kiln_tensor *filled(const char *fn, kiln_dtype dt, int ndim, const int64_t *shape, double v)
{
    kiln_tensor *t = tensor_new(fn, dt, ndim, shape);
    if (t)
        fill_value(t, v);
    return tensor_own(t);
}

kiln_tensor *kiln_zeros(kiln_dtype dt, int ndim, const int64_t *shape)
{
    return filled("kiln_zeros", dt, ndim, shape, 0);
}

kiln_tensor *kiln_ones(kiln_dtype dt, int ndim, const int64_t *shape)
{
    return filled("kiln_ones", dt, ndim, shape, 1);
}

kiln_tensor *kiln_full(kiln_dtype dt, int ndim, const int64_t *shape, double value)
{
    return filled("kiln_full", dt, ndim, shape, value);
}

kiln_tensor *eager_scalar_literal(kiln_dtype dt, double value)
{
    kiln_tensor *t = tensor_new("kiln_call", dt, 0, NULL);
    if (t) {
        fill_value(t, value);
        t->literal = true;
    }
    return t;
}

kiln_tensor *kiln_scalar(double value)
{
    return filled("kiln_scalar", KILN_F32, 0, NULL, value);
}

kiln_tensor *kiln_from_data(kiln_dtype dt, int ndim, const int64_t *shape, const void *data)
{
    kiln_tensor *t = tensor_new("kiln_from_data", dt, ndim, shape);
    if (!t)
        return NULL;
    if (!data && t->numel > 0) {
        core_fail_null_arg("kiln_from_data", "data");
        return tensor_drop(t);
    }
    if (dt == KILN_BOOL) /* any nonzero byte is true, stored as 1 */
        convert(t->storage->data, KILN_BOOL, data, KILN_BOOL, t->numel, 1);
    else if (t->numel)
        memcpy(t->storage->data, data, (size_t)t->numel * eager_dtype_size(dt));
    return tensor_own(t);
}

/* -- Ranges ---------------------------------------------------------------- */

typedef struct {
    double start, step;
    kiln_tensor *out;
} range_job;

static void range_fill(void *ctx, int64_t begin, int64_t end)
{
    const range_job *j = ctx;
    enum { CHUNK = 256 };
    double values[CHUNK];
    size_t size = eager_dtype_size(j->out->dtype);
    for (int64_t i = begin; i < end; i += CHUNK) {
        int64_t n = end - i < CHUNK ? end - i : CHUNK;
        for (int64_t k = 0; k < n; k++)
            values[k] = j->start + (double)(i + k) * j->step;
        convert((char *)j->out->storage->data + i * (int64_t)size, j->out->dtype, values, KILN_F64, n, 1);
    }
}

kiln_tensor *kiln_arange(double start, double stop, double step, kiln_dtype dt)
{
    const char *fn = "kiln_arange";
    if (check_dtype(fn, dt) < 0)
        return NULL;
    if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step)) {
        core_fail(CORE_VALUE, fn, "start %g, stop %g, step %g: need finite values and a nonzero step",
                  start, stop, step);
        return NULL;
    }
    double count = ceil((stop - start) / step);
    if (count > (double)(INT64_C(1) << 40)) {
        core_fail(CORE_VALUE, fn, "start %g, stop %g, step %g give too many elements", start, stop, step);
        return NULL;
    }
    int64_t n = count > 0 ? (int64_t)count : 0;
    kiln_tensor *t = tensor_new(fn, dt, 1, &n);
    if (!t)
        return NULL;
    range_job job = {start, step, t};
    core_parallel_for(n, 64 * 1024, range_fill, &job);
    return tensor_own(t);
}

/* PyTorch's linspace: start + i step for the first half, end - (steps - 1 - i)
 * step for the rest, so both ends come out exact; f32 in f32 arithmetic, as
 * PyTorch computes it. */
typedef struct {
    double start, end;
    kiln_tensor *out;
} linspace_job;

static double linspace_at(const linspace_job *j, int64_t i)
{
    int64_t n = j->out->numel;
    if (j->out->dtype == KILN_F32) {
        float start = (float)j->start, end = (float)j->end, step = (end - start) / (float)(n > 1 ? n - 1 : 1);
        return i < n / 2 ? start + step * (float)i : end - step * (float)(n - 1 - i);
    }
    double step = (j->end - j->start) / (double)(n > 1 ? n - 1 : 1);
    return i < n / 2 ? j->start + step * (double)i : j->end - step * (double)(n - 1 - i);
}

static void linspace_fill(void *ctx, int64_t begin, int64_t end)
{
    const linspace_job *j = ctx;
    enum { CHUNK = 256 };
    double values[CHUNK];
    size_t size = eager_dtype_size(j->out->dtype);
    for (int64_t i = begin; i < end; i += CHUNK) {
        int64_t count = end - i < CHUNK ? end - i : CHUNK;
        for (int64_t k = 0; k < count; k++)
            values[k] = linspace_at(j, i + k);
        convert((char *)j->out->storage->data + i * (int64_t)size, j->out->dtype, values, KILN_F64, count, 1);
    }
}

kiln_tensor *kiln_linspace(double start, double end, int64_t steps, kiln_dtype dt)
{
    const char *fn = "kiln_linspace";
    if (check_dtype(fn, dt) < 0)
        return NULL;
    if (steps < 0 || !isfinite(start) || !isfinite(end)) {
        core_fail(CORE_VALUE, fn, "start %g, end %g, %lld steps: need finite ends and steps >= 0", start, end,
                  (long long)steps);
        return NULL;
    }
    kiln_tensor *t = tensor_new(fn, dt, 1, &steps);
    if (!t)
        return NULL;
    linspace_job job = {start, steps == 1 ? start : end, t}; /* one step gives start */
    core_parallel_for(steps, 64 * 1024, linspace_fill, &job);
    return tensor_own(t);
}

kiln_tensor *kiln_eye(kiln_dtype dt, int64_t n, int64_t m)
{
    kiln_tensor *t = tensor_new("kiln_eye", dt, 2, (int64_t[]){n, m});
    if (!t)
        return NULL;
    fill_value(t, 0);
    double one = 1;
    size_t size = eager_dtype_size(dt);
    for (int64_t i = 0; i < n && i < m; i++)
        convert((char *)t->storage->data + (i * m + i) * (int64_t)size, dt, &one, KILN_F64, 1, 1);
    return tensor_own(t);
}

/* -- Like another ---------------------------------------------------------------- */

static kiln_tensor *like(const char *fn, kiln_tensor *a, double value)
{
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0)
        return NULL;
    return eager_filled(fn, a->dtype, a->ndim, a->shape, value, a->device);
}

kiln_tensor *kiln_zeros_like(kiln_tensor *a)
{
    return like("kiln_zeros_like", a, 0);
}

kiln_tensor *kiln_ones_like(kiln_tensor *a)
{
    return like("kiln_ones_like", a, 1);
}

kiln_tensor *kiln_full_like(kiln_tensor *a, double value)
{
    return like("kiln_full_like", a, value);
}

kiln_tensor *kiln_empty_like(kiln_tensor *a)
{
    if (check_operands("kiln_empty_like", 1, &a, (const char *const[]){"operand a"}) < 0)
        return NULL;
    if (recording()) /* a traced value has no memory to leave uninitialized */
        return like("kiln_empty_like", a, 0);
    return tensor_own(tensor_new_on("kiln_empty_like", a->device, a->dtype, a->ndim, a->shape));
}

/* -- Random ---------------------------------------------------------------- */

/* Counter-based: element i's value depends on (seed, i) only, so any thread
 * split gives the same tensor. */
static uint64_t mix(uint64_t seed, uint64_t i)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    uint64_t seed;
    float *out;
    int64_t n;
} random_job;

static void uniform_fill(void *ctx, int64_t begin, int64_t end)
{
    const random_job *j = ctx;
    for (int64_t i = begin; i < end; i++)
        j->out[i] = (float)(mix(j->seed, (uint64_t)i) >> 40) * 0x1p-24f;
}

/* Box-Muller over pairs: pair p fills elements 2p and 2p+1. */
static void normal_fill(void *ctx, int64_t begin, int64_t end)
{
    const random_job *j = ctx;
    for (int64_t p = begin; p < end; p++) {
        double u1 = (double)((mix(j->seed, 2 * (uint64_t)p) >> 11) + 1) * 0x1p-53;
        double u2 = (double)(mix(j->seed, 2 * (uint64_t)p + 1) >> 11) * 0x1p-53;
        double r = sqrt(-2 * log(u1)), theta = 2 * M_PI * u2;
        j->out[2 * p] = (float)(r * cos(theta));
        if (2 * p + 1 < j->n)
            j->out[2 * p + 1] = (float)(r * sin(theta));
    }
}

/* A new unowned tensor of random values. */
static kiln_tensor *random_tensor(const char *fn, int ndim, const int64_t *shape, uint64_t seed, bool normal)
{
    kiln_tensor *t = tensor_new(fn, KILN_F32, ndim, shape);
    if (!t)
        return NULL;
    random_job job = {seed, t->storage->data, t->numel};
    if (normal)
        core_parallel_for((t->numel + 1) / 2, 16 * 1024, normal_fill, &job);
    else
        core_parallel_for(t->numel, 64 * 1024, uniform_fill, &job);
    return t;
}

/* Inside a marked body, random values are a node of the trace, drawn
 * afresh on every call (eager_random), not a constant of its first call. */
static kiln_tensor *random_op(ir_op op, int ndim, const int64_t *shape, uint64_t seed)
{
    const char *fn = op == OP_RANDN ? "kiln_randn" : "kiln_rand";
    int64_t numel;
    if (!recording())
        return tensor_own(random_tensor(fn, ndim, shape, seed, op == OP_RANDN));
    if (check_shape(fn, ndim, shape, &numel) < 0)
        return NULL;
    ir_params params = {.index = (int64_t)seed};
    return record_op(fn, op, 0, NULL, &params, KILN_F32, ndim, shape);
}

kiln_tensor *kiln_rand(int ndim, const int64_t *shape, uint64_t seed)
{
    return random_op(OP_RAND, ndim, shape, seed);
}

kiln_tensor *kiln_randn(int ndim, const int64_t *shape, uint64_t seed)
{
    return random_op(OP_RANDN, ndim, shape, seed);
}

kiln_tensor *eager_random(const ir_node *n, uint64_t stream, uint64_t rng_base, kiln_device device)
{
    if (n->op == OP_UNIFORM)
        return eager_uniform(n, rng_base, device);
    uint64_t seed = (uint64_t)n->params.index;
    if (stream > 0) /* the first call draws what eager draws for the seed */
        seed = mix(seed, stream ^ 0xD1B54A32D192ED03ull);
    kiln_tensor *t = random_tensor(ir_ops[n->op].name, n->ndim, n->shape, seed, n->op == OP_RANDN);
    if (!t || device == KILN_CPU)
        return t;
    kiln_tensor *moved = kiln_to_device(t, device);
    eager_disown(moved);
    kiln_release(t);
    return moved;
}

/* -- Reading back ---------------------------------------------------------- */

int kiln_copy_to_host(const kiln_tensor *t, void *dst, size_t nbytes)
{
    const char *fn = "kiln_copy_to_host";
    if (!t)
        return core_fail_null(fn, "tensor");
    size_t need = (size_t)t->numel * eager_dtype_size(t->dtype);
    if (!dst && need)
        return core_fail_null_arg(fn, "dst");
    if (nbytes < need) {
        char d[DESCRIBE_MAX];
        return core_fail(CORE_VALUE, fn, "%s needs %zu bytes, dst has %zu", describe(d, t), need, nbytes);
    }
    if (t->trace) { /* the trace breaks here, or fails */
        kiln_tensor *real = read_tracer(fn, t);
        int status = real ? kiln_copy_to_host(real, dst, nbytes) : core_error_status();
        kiln_release(real);
        return status;
    }
    if (need && t->device == KILN_CPU) {
        copy_to_memory(dst, t);
    } else if (need) {
        kiln_tensor *host = cuda_to_host(fn, t);
        if (!host)
            return -CORE_DEVICE;
        memcpy(dst, host->storage->data, need);
        kiln_release(host);
    }
    core_succeeded();
    return 0;
}

double kiln_item(const kiln_tensor *t)
{
    if (!t) {
        core_fail_null("kiln_item", "tensor");
        return NAN;
    }
    if (t->trace && (t->trace != eager_active_trace() || t->trace->finished)) {
        fail_read_tracer("kiln_item", t);
        return NAN;
    }
    if (t->numel != 1) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, "kiln_item", "%s has %lld elements, not 1", describe(d, t),
                  (long long)t->numel);
        return NAN;
    }
    if (t->trace) { /* the trace breaks here, or fails */
        kiln_tensor *real = read_tracer("kiln_item", t);
        double value = real ? kiln_item(real) : NAN;
        kiln_release(real);
        return value;
    }
    double value = NAN;
    if (t->device == KILN_CPU) {
        convert(&value, KILN_F64, eager_data(t), t->dtype, 1, 1);
    } else {
        kiln_tensor *host = cuda_to_host("kiln_item", t);
        if (!host)
            return value;
        convert(&value, KILN_F64, host->storage->data, t->dtype, 1, 1);
        kiln_release(host);
    }
    core_succeeded();
    return value;
}

kiln_tensor *kiln_to_device(kiln_tensor *t, kiln_device d)
{
    const char *fn = "kiln_to_device";
    if (check_operands(fn, 1, &t, (const char *const[]){"tensor"}) < 0)
        return NULL;
    if (d != KILN_CPU && d != KILN_CUDA) {
        core_fail(CORE_DEVICE, fn, "device %d is not a kiln_device", (int)d);
        return NULL;
    }
    if (d == t->device)
        return tensor_own(kiln_retain(t));
    if (t->trace) {
        fail_read_tracer(fn, t);
        return NULL;
    }
    return tensor_own(d == KILN_CUDA ? cuda_from_host(fn, t) : cuda_to_host(fn, t));
}
