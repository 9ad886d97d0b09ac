/* The elementwise engine: broadcasting, promotion, blocking and threads.
 *
 * Every elementwise op is one contiguous kernel (kernels.c) applied to blocks
 * of the output. An operand that is contiguous in the compute dtype is read in
 * place; a broadcast single element is expanded into a block once; any other
 * operand is gathered, converted, into a small buffer that stays in L1. The
 * output is written in place unless it is a strided view (kiln_assign), which
 * gets a scatter. Large outputs are split across the thread pool. */
#include <math.h>
#include <string.h>

#include "eager/internal.h"

enum {
    BLOCK = 1024,            /* elements per block: 8 KiB at most per buffer */
    MAX_OPERANDS = 3,
    GRAIN = 32 * 1024,       /* elements per thread, cheap ops */
    GRAIN_COSTLY = 4 * 1024, /* elements per thread, transcendental ops */
};

typedef struct {
    ew_kernel kernel; /* NULL: a plain copy into the output's dtype */
    int n_in;
    int ndim; /* of the collapsed iteration space */
    int64_t shape[KILN_MAX_DIMS];
    int64_t numel;
    strided in[MAX_OPERANDS];
    int64_t in_strides[MAX_OPERANDS][KILN_MAX_DIMS];
    kiln_dtype in_dt[MAX_OPERANDS]; /* the dtype the kernel reads */
    bool in_direct[MAX_OPERANDS];   /* contiguous in that dtype: read in place */
    bool in_constant[MAX_OPERANDS]; /* one element broadcast everywhere */
    strided out;
    int64_t out_strides[KILN_MAX_DIMS];
    bool out_direct;
} ew_plan;

/* -- Planning -------------------------------------------------------------- */

static bool strides_contiguous(int ndim, const int64_t *shape, const int64_t *strides)
{
    int64_t step = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (strides[i] != step)
            return false;
        step *= shape[i];
    }
    return true;
}

static bool strides_zero(int ndim, const int64_t *strides)
{
    for (int i = 0; i < ndim; i++)
        if (strides[i])
            return false;
    return true;
}

/* Drops size-1 axes and merges neighbours that every operand walks as one. */
static void collapse(ew_plan *p, int ndim, const int64_t *shape)
{
    int64_t *all[MAX_OPERANDS + 1];
    int n = p->n_in + 1;
    for (int k = 0; k < p->n_in; k++)
        all[k] = p->in_strides[k];
    all[p->n_in] = p->out_strides;
    int out = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1)
            continue;
        bool merge = out > 0;
        for (int k = 0; k < n && merge; k++)
            merge = all[k][out - 1] == all[k][d] * shape[d];
        if (merge) {
            p->shape[out - 1] *= shape[d];
            for (int k = 0; k < n; k++)
                all[k][out - 1] = all[k][d];
            continue;
        }
        p->shape[out] = shape[d];
        for (int k = 0; k < n; k++)
            all[k][out] = all[k][d];
        out++;
    }
    p->ndim = out;
}

static void plan_build(ew_plan *p, ew_kernel kernel, int n_in, const kiln_tensor *const *in,
                       const kiln_dtype *in_dt, kiln_tensor *out)
{
    p->kernel = kernel;
    p->n_in = n_in;
    p->numel = out->numel;
    for (int k = 0; k < n_in; k++)
        broadcast_strides(in[k], out->ndim, out->shape, p->in_strides[k]);
    memcpy(p->out_strides, out->strides, sizeof out->strides);
    collapse(p, out->ndim, out->shape);
    for (int k = 0; k < n_in; k++) {
        p->in[k] = (strided){eager_data(in[k]), in[k]->dtype, p->ndim, p->shape, p->in_strides[k]};
        p->in_dt[k] = in_dt[k];
        p->in_constant[k] = strides_zero(p->ndim, p->in_strides[k]);
        p->in_direct[k] = in[k]->dtype == in_dt[k] &&
                          strides_contiguous(p->ndim, p->shape, p->in_strides[k]);
    }
    p->out = (strided){eager_data(out), out->dtype, p->ndim, p->shape, p->out_strides};
    p->out_direct = strides_contiguous(p->ndim, p->shape, p->out_strides);
}

/* -- Running --------------------------------------------------------------- */

static bool all_direct(const ew_plan *p)
{
    for (int k = 0; k < p->n_in; k++)
        if (!p->in_direct[k])
            return false;
    return p->out_direct;
}

static void run_direct(const ew_plan *p, int64_t begin, int64_t end)
{
    const void *ins[MAX_OPERANDS];
    for (int k = 0; k < p->n_in; k++)
        ins[k] = p->in[k].base + begin * (int64_t)eager_dtype_size(p->in_dt[k]);
    char *out = p->out.base + begin * (int64_t)eager_dtype_size(p->out.dtype);
    if (p->kernel)
        p->kernel(end - begin, out, ins);
    else
        memcpy(out, ins[0], (size_t)(end - begin) * eager_dtype_size(p->out.dtype));
}

static void run_blocks(void *ctx, int64_t begin, int64_t end)
{
    const ew_plan *p = ctx;
    if (all_direct(p)) {
        run_direct(p, begin, end);
        return;
    }
    _Alignas(64) char bufs[MAX_OPERANDS][BLOCK * 8];
    _Alignas(64) char out_buf[BLOCK * 8];
    const void *ins[MAX_OPERANDS];
    size_t out_size = eager_dtype_size(p->out.dtype);
    int64_t filled = end - begin < BLOCK ? end - begin : BLOCK;
    for (int k = 0; k < p->n_in; k++)
        if (p->in_constant[k] && !p->in_direct[k])
            convert(bufs[k], p->in_dt[k], p->in[k].base, p->in[k].dtype, filled, 0);

    for (int64_t start = begin; start < end; start += BLOCK) {
        int64_t n = end - start < BLOCK ? end - start : BLOCK;
        char *out = p->out_direct ? p->out.base + start * (int64_t)out_size : out_buf;
        for (int k = 0; k < p->n_in; k++) {
            size_t size = eager_dtype_size(p->in_dt[k]);
            if (p->in_direct[k]) {
                ins[k] = p->in[k].base + start * (int64_t)size;
            } else if (p->in_constant[k]) {
                ins[k] = bufs[k];
            } else {
                /* A copy gathers straight into its destination. */
                void *dst = p->kernel ? (void *)bufs[k] : (void *)out;
                strided_gather(dst, p->in_dt[k], &p->in[k], start, n);
                ins[k] = dst;
            }
        }
        if (p->kernel)
            p->kernel(n, out, ins);
        else if (ins[0] != out)
            memcpy(out, ins[0], (size_t)n * out_size);
        if (!p->out_direct)
            strided_scatter(&p->out, out_buf, start, n);
    }
}

static void run_plan(const ew_plan *p, bool costly)
{
    core_parallel_for(p->numel, costly ? GRAIN_COSTLY : GRAIN, run_blocks, (void *)p);
}

/* Applies op (kernel on the CPU; OP_CAST and no kernel: a copy) to the
 * broadcast operands into out (borrowed, fully written), on out's device.
 * 0, or fn's error from the device. */
static int apply_into(const char *fn, ir_op op, ew_kernel kernel, bool costly, int n_in,
                      const kiln_tensor *const *in, const kiln_dtype *in_dt, kiln_tensor *out)
{
    if (out->device == KILN_CUDA)
        return cuda_elementwise(fn, op, n_in, in, in_dt, out);
    ew_plan plan;
    plan_build(&plan, kernel, n_in, in, in_dt, out);
    run_plan(&plan, costly);
    return 0;
}

static bool same_layout(const kiln_tensor *a, const kiln_tensor *b)
{
    return a->ndim == b->ndim && !memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape);
}

/* The common small case without a plan: each operand contiguous in the
 * output's shape and the compute dtype, or a single element. False when the
 * operands do not fit it. */
static bool apply_small(ew_kernel kernel, int n_in, const kiln_tensor *const *in,
                        const kiln_dtype *in_dt, kiln_tensor *out)
{
    _Alignas(64) char constants[MAX_OPERANDS][BLOCK * 8];
    const void *ins[MAX_OPERANDS];
    int64_t fill = out->numel < BLOCK ? out->numel : BLOCK;
    bool blocked = false;
    for (int k = 0; k < n_in; k++) {
        if (in[k]->dtype == in_dt[k] && same_layout(in[k], out) && eager_is_contiguous(in[k])) {
            ins[k] = eager_data(in[k]);
        } else if (in[k]->numel == 1) {
            convert(constants[k], in_dt[k], eager_data(in[k]), in[k]->dtype, fill, 0);
            ins[k] = constants[k];
            blocked = true;
        } else {
            return false;
        }
    }
    int64_t step = blocked ? BLOCK : out->numel; /* a constant fills one block */
    size_t out_size = eager_dtype_size(out->dtype);
    for (int64_t start = 0; start < out->numel; start += step) {
        int64_t n = out->numel - start < step ? out->numel - start : step;
        const void *block_ins[MAX_OPERANDS];
        for (int k = 0; k < n_in; k++)
            block_ins[k] = ins[k] == constants[k] ? ins[k]
                         : (const char *)ins[k] + start * (int64_t)eager_dtype_size(in_dt[k]);
        kernel(n, (char *)out->storage->data + start * (int64_t)out_size, block_ins);
    }
    return true;
}

/* A new tensor: op over the broadcast of n_in operands, on their device.
 * Unowned. */
static kiln_tensor *apply(const char *fn, ir_op op, bool costly, int n_in, const kiln_tensor *const *in,
                          const kiln_dtype *in_dt, kiln_dtype out_dt)
{
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    kiln_device device;
    if (broadcast_shapes(fn, n_in, in, &ndim, shape) < 0 || cuda_operands_device(fn, n_in, in, &device) < 0)
        return NULL;
    kiln_tensor *out = tensor_new_on(fn, device, out_dt, ndim, shape);
    if (!out)
        return NULL;
    ew_kernel kernel = device == KILN_CPU ? kernel_for(op, in_dt[n_in - 1]) : NULL;
    if (device == KILN_CPU && out->numel < GRAIN && apply_small(kernel, n_in, in, in_dt, out))
        return out;
    if (apply_into(fn, op, kernel, costly, n_in, in, in_dt, out) < 0)
        return tensor_drop(out);
    return out;
}

/* -- Copies ---------------------------------------------------------------- */

int check_broadcasts_to(const char *fn, const kiln_tensor *src, const kiln_tensor *dst)
{
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    const kiln_tensor *pair[2] = {dst, src};
    if (broadcast_shapes(fn, 2, pair, &ndim, shape) < 0)
        return -CORE_SHAPE;
    if (ndim != dst->ndim || memcmp(shape, dst->shape, (size_t)ndim * sizeof *shape)) {
        char a[CORE_SHAPE_STR_MAX], b[CORE_SHAPE_STR_MAX];
        return core_fail(CORE_SHAPE, fn, "source shape %s does not broadcast to destination %s",
                         core_shape_str(a, src->ndim, src->shape),
                         core_shape_str(b, dst->ndim, dst->shape));
    }
    return 0;
}

int copy_into(const char *fn, kiln_tensor *dst, const kiln_tensor *src)
{
    int status = check_broadcasts_to(fn, src, dst);
    if (status < 0)
        return status;
    kiln_tensor *staged = NULL;
    if (src->storage == dst->storage) { /* overlapping views: read everything first */
        staged = copy_as(fn, src, src->dtype);
    } else if (src->device != dst->device && src->device == KILN_CPU && src->ndim > 0) {
        staged = cuda_from_host(fn, src);
    } else if (src->device != dst->device && src->device == KILN_CUDA) {
        staged = cuda_to_host(fn, src);
    } else {
        return apply_into(fn, OP_CAST, NULL, false, 1, &src, &dst->dtype, dst);
    }
    if (!staged)
        return core_error_pending() ? -CORE_DEVICE : -CORE_NOMEM;
    status = apply_into(fn, OP_CAST, NULL, false, 1, (const kiln_tensor *const[]){staged}, &dst->dtype, dst);
    kiln_release(staged);
    return status;
}

kiln_tensor *copy_as(const char *fn, const kiln_tensor *src, kiln_dtype dt)
{
    kiln_tensor *out = tensor_new_on(fn, src->device, dt, src->ndim, src->shape);
    if (out && apply_into(fn, OP_CAST, NULL, false, 1, &src, &dt, out) < 0)
        return tensor_drop(out);
    return out;
}

kiln_tensor *eager_copy(const char *fn, const kiln_tensor *t)
{
    return copy_as(fn, t, t->dtype);
}

/* -- Public ops ------------------------------------------------------------ */

static kiln_tensor *fail_dtype(const char *fn, int n, const kiln_tensor *const *ts, const char *what)
{
    char d[MAX_OPERANDS][DESCRIBE_MAX];
    if (n == 1)
        core_fail(CORE_DTYPE, fn, "%s (operand %s)", what, describe(d[0], ts[0]));
    else
        core_fail(CORE_DTYPE, fn, "%s (operands %s and %s)", what, describe(d[0], ts[0]),
                  describe(d[1], ts[1]));
    return NULL;
}

static const char *const operand_names[] = {"operand a", "operand b", "operand c"};

/* Records an elementwise op of n operands with result dtype dt. */
static kiln_tensor *record_elementwise(const char *fn, ir_op op, int n, kiln_tensor *const *in,
                                       kiln_dtype dt)
{
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    if (broadcast_shapes(fn, n, (const kiln_tensor *const *)in, &ndim, shape) < 0)
        return NULL;
    return record_op(fn, op, n, in, NULL, dt, ndim, shape);
}

static kiln_tensor *binary_value(ir_op op, const char *fn, kiln_tensor *a, kiln_tensor *b)
{
    kiln_tensor *operands[2] = {a, b};
    if (check_operands(fn, 2, operands, operand_names) < 0)
        return NULL;
    const kiln_tensor *in[2] = {a, b};
    kiln_dtype promoted = ir_promote(a->dtype, rank_class(a), b->dtype, rank_class(b));
    int result = ir_result_dtype(ir_ops[op].rule, promoted);
    if (result < 0)
        return fail_dtype(fn, 2, in, "bool operands are not supported");
    if (recording())
        return record_elementwise(fn, op, 2, operands, (kiln_dtype)result);
    kiln_dtype compute = ir_ops[op].rule == RULE_COMPARE ? promoted : (kiln_dtype)result;
    kiln_dtype in_dt[2] = {compute, compute};
    return tensor_own(apply(fn, op, ir_ops[op].flags & FLAG_TRANSCENDENTAL, 2, in, in_dt, (kiln_dtype)result));
}

/* The op's result, with its gradient record where it needs one. */
static kiln_tensor *binary(ir_op op, const char *fn, kiln_tensor *a, kiln_tensor *b)
{
    return grad_track(op, 2, (kiln_tensor *[]){a, b}, NULL, binary_value(op, fn, a, b));
}

static kiln_tensor *unary_value(ir_op op, const char *fn, kiln_tensor *a)
{
    if (check_operands(fn, 1, &a, operand_names) < 0)
        return NULL;
    const kiln_tensor *in[1] = {a};
    int result = ir_result_dtype(ir_ops[op].rule, a->dtype);
    if (result < 0)
        return fail_dtype(fn, 1, in, "bool is not supported");
    if (recording())
        return record_op(fn, op, 1, &a, NULL, (kiln_dtype)result, a->ndim, a->shape);
    kiln_dtype compute = (kiln_dtype)result;
    return tensor_own(apply(fn, op, ir_ops[op].flags & FLAG_TRANSCENDENTAL, 1, in, &compute, compute));
}

static kiln_tensor *unary(ir_op op, const char *fn, kiln_tensor *a)
{
    return grad_track(op, 1, &a, NULL, unary_value(op, fn, a));
}

#define OP_BINARY(N, n, flags, rule)                                  \
    kiln_tensor *kiln_##n(kiln_tensor *a, kiln_tensor *b)             \
    {                                                                 \
        return binary(OP_##N, "kiln_" #n, a, b);                      \
    }
#define OP_UNARY(N, n, flags, rule)                                   \
    kiln_tensor *kiln_##n(kiln_tensor *a)                             \
    {                                                                 \
        return unary(OP_##N, "kiln_" #n, a);                          \
    }
#define OP(N, n, arity, kind, flags, rule)
#include "ir/ops.def"

/* A 0-d operand on the stack: scalar forms allocate nothing but the result.
 * As with Python numbers in PyTorch, a float tensor keeps its dtype (the
 * scalar is an f64), a whole number is an i64 (keeping an integer tensor's
 * dtype), and any other number makes an integer tensor f32. -0.0 is not
 * whole: only a Python float has that sign (x / -0.0 is -inf for x > 0). */
typedef struct {
    kiln_tensor tensor;
    eager_storage storage;
    union { double f64; float f32; int64_t i64; } value;
} stack_scalar;

static kiln_tensor *stack_scalar_init(stack_scalar *s, kiln_dtype dt, double value)
{
    memset(&s->tensor, 0, sizeof s->tensor);
    s->tensor.magic = TENSOR_ALIVE;
    s->tensor.literal = true;
    s->tensor.dtype = dt;
    s->tensor.numel = 1;
    s->tensor.storage = &s->storage;
    s->storage.data = &s->value;
    s->storage.nbytes = sizeof s->value;
    if (dt == KILN_I64)
        s->value.i64 = (int64_t)value;
    else if (dt == KILN_F32)
        s->value.f32 = (float)value;
    else
        s->value.f64 = value;
    return &s->tensor;
}

static kiln_tensor *scalar_for(stack_scalar *s, const kiln_tensor *a, double value)
{
    bool whole = value > -0x1p63 && value < 0x1p63 && value == (double)(int64_t)value &&
                 !(value == 0 && signbit(value));
    kiln_dtype dt = ir_dtype_is_float(a->dtype) ? KILN_F64 : whole ? KILN_I64 : KILN_F32;
    return stack_scalar_init(s, dt, value);
}

#define SCALAR_FORM(n)                                                         \
    kiln_tensor *kiln_##n##_scalar(kiln_tensor *a, double b)                   \
    {                                                                          \
        if (!a) {                                                              \
            core_fail_null("kiln_" #n "_scalar", "operand a");                 \
            return NULL;                                                       \
        }                                                                      \
        stack_scalar s;                                                        \
        return binary(OP_##n##_ID, "kiln_" #n "_scalar", a, scalar_for(&s, a, b)); \
    }
#define OP_add_ID OP_ADD
#define OP_sub_ID OP_SUB
#define OP_mul_ID OP_MUL
#define OP_div_ID OP_DIV
#define OP_pow_ID OP_POW
#define OP_maximum_ID OP_MAXIMUM
#define OP_minimum_ID OP_MINIMUM
SCALAR_FORM(add)
SCALAR_FORM(sub)
SCALAR_FORM(mul)
SCALAR_FORM(div)
SCALAR_FORM(pow)
SCALAR_FORM(maximum)
SCALAR_FORM(minimum)

kiln_tensor *eager_scalar_op(ir_op op, const char *fn, kiln_tensor *a, double value, bool scalar_first)
{
    if (!a) {
        core_fail_null(fn, "operand a");
        return NULL;
    }
    stack_scalar s;
    kiln_tensor *b = scalar_for(&s, a, value);
    return scalar_first ? binary(op, fn, b, a) : binary(op, fn, a, b);
}

kiln_tensor *kiln_where(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b)
{
    const char *fn = "kiln_where";
    kiln_tensor *operands[3] = {cond, a, b};
    if (check_operands(fn, 3, operands, (const char *const[]){"cond", "operand a", "operand b"}) < 0)
        return NULL;
    if (cond->dtype != KILN_BOOL) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_DTYPE, fn, "cond must be bool, got %s", describe(d, cond));
        return NULL;
    }
    kiln_dtype dt = ir_promote(a->dtype, rank_class(a), b->dtype, rank_class(b));
    if (recording())
        return grad_track(OP_WHERE, 3, operands, NULL, record_elementwise(fn, OP_WHERE, 3, operands, dt));
    const kiln_tensor *in[3] = {cond, a, b};
    kiln_dtype in_dt[3] = {KILN_BOOL, dt, dt};
    return grad_track(OP_WHERE, 3, operands, NULL, tensor_own(apply(fn, OP_WHERE, false, 3, in, in_dt, dt)));
}

kiln_tensor *kiln_cast(kiln_tensor *a, kiln_dtype dt)
{
    if (check_operands("kiln_cast", 1, &a, operand_names) < 0 || check_dtype("kiln_cast", dt) < 0)
        return NULL;
    if (a->dtype == dt)
        return tensor_own(kiln_retain(a));
    if (recording())
        return grad_track(OP_CAST, 1, &a, NULL, record_op("kiln_cast", OP_CAST, 1, &a, NULL, dt, a->ndim, a->shape));
    return grad_track(OP_CAST, 1, &a, NULL, tensor_own(copy_as("kiln_cast", a, dt)));
}

kiln_tensor *kiln_contiguous(kiln_tensor *a)
{
    if (check_operands("kiln_contiguous", 1, &a, operand_names) < 0)
        return NULL;
    if (recording() || eager_is_contiguous(a)) /* traced values have no layout */
        return tensor_own(kiln_retain(a));
    return grad_track(OP_CONTIGUOUS, 1, &a, NULL, tensor_own(copy_as("kiln_contiguous", a, a->dtype)));
}

int kiln_assign(kiln_tensor *dst, kiln_tensor *src)
{
    kiln_tensor *operands[2] = {dst, src};
    int status = check_operands("kiln_assign", 2, operands, (const char *const[]){"dst", "src"});
    if (status < 0)
        return status;
    for (int d = 0; d < dst->ndim; d++) {
        if (dst->strides[d] == 0 && dst->shape[d] > 1) {
            char buf[DESCRIBE_MAX];
            return core_fail(CORE_VALUE, "kiln_assign",
                             "dst %s is a broadcast view: several elements share memory",
                             describe(buf, dst));
        }
    }
    if ((status = check_broadcasts_to("kiln_assign", src, dst)) < 0 || (status = grad_check_assign(dst, src)) < 0)
        return status;
    if (recording()) {
        status = eager_active_trace()->record_assign(eager_active_trace(), dst, src);
    } else if ((status = copy_into("kiln_assign", dst, src)) == 0) {
        atomic_fetch_add_explicit(&dst->storage->version, 1, memory_order_relaxed);
    }
    if (status == 0)
        core_succeeded();
    return status;
}

/* -- Fills and copies to plain memory -------------------------------------- */

int fill_value(kiln_tensor *dst, double value)
{
    stack_scalar s;
    const kiln_tensor *in = stack_scalar_init(&s, KILN_F64, value);
    return apply_into("kiln_full", OP_CAST, NULL, false, 1, &in, &dst->dtype, dst);
}

void copy_to_memory(void *dst, const kiln_tensor *src)
{
    size_t size = eager_dtype_size(src->dtype);
    if ((uintptr_t)dst % size) { /* the kernels store whole elements: stage it */
        kiln_tensor *staged = copy_as("kiln_copy_to_host", src, src->dtype);
        if (staged)
            memcpy(dst, staged->storage->data, (size_t)src->numel * size);
        kiln_release(staged);
        return;
    }
    kiln_tensor wrap = *src;
    eager_storage storage = {.data = dst, .nbytes = (size_t)src->numel * eager_dtype_size(src->dtype)};
    wrap.storage = &storage;
    wrap.offset = 0;
    int64_t step = 1;
    for (int i = src->ndim - 1; i >= 0; i--) {
        wrap.strides[i] = step;
        step *= src->shape[i];
    }
    apply_into("kiln_copy_to_host", OP_CAST, NULL, false, 1, &src, &src->dtype, &wrap);
}
