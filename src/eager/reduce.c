/* Reductions over one axis or all: sum, mean, max, min, argmax, prod, argmin.
 *
 * The input is made contiguous and seen as [outer, R, inner], R the reduced
 * extent. Rows (inner == 1) reduce with vector accumulators; columns
 * (inner > 1) accumulate whole rows elementwise. Integers and bools reduce as
 * i64, but their means sum in f64, where nothing wraps. Float sums and
 * products accumulate in f64; max and min propagate NaN, and argmax and
 * argmin take the first NaN as the maximum or minimum, as PyTorch does. */
#include <math.h>
#include <string.h>

#include "eager/isa.h"

enum { LANES = 16, TILE = 512, WORK_GRAIN = 64 * 1024, PIECES_PER_THREAD = 4, MAX_PIECES = 1024 };

/* -- Typed loops ----------------------------------------------------------- */

/* One macro instance per work dtype T with its sum accumulator S. */
#define REDUCE_LOOPS(T, S, IS_FLOAT)                                             \
    static S row_sum_##T(const T *x, int64_t n)                                  \
    {                                                                            \
        S s = 0;                                                                 \
        _Pragma("omp simd reduction(+:s)") for (int64_t i = 0; i < n; i++)       \
            s += (S)x[i];                                                        \
        return s;                                                                \
    }                                                                            \
    static S row_prod_##T(const T *x, int64_t n)                                 \
    {                                                                            \
        S s = 1;                                                                 \
        for (int64_t i = 0; i < n; i++)                                          \
            s *= (S)x[i];                                                        \
        return s;                                                                \
    }                                                                            \
    static T row_extreme_##T(const T *x, int64_t n, bool want_max)               \
    {                                                                            \
        T acc[LANES];                                                            \
        for (int j = 0; j < LANES; j++) acc[j] = x[0];                           \
        int64_t i = 0;                                                           \
        if (want_max)                                                            \
            for (; i + LANES <= n; i += LANES)                                   \
                for (int j = 0; j < LANES; j++) acc[j] = BETTER_MAX(x[i + j], acc[j]); \
        else                                                                     \
            for (; i + LANES <= n; i += LANES)                                   \
                for (int j = 0; j < LANES; j++) acc[j] = BETTER_MIN(x[i + j], acc[j]); \
        T m = acc[0];                                                            \
        for (int j = 1; j < LANES; j++)                                          \
            m = want_max ? BETTER_MAX(acc[j], m) : BETTER_MIN(acc[j], m);        \
        for (; i < n; i++)                                                       \
            m = want_max ? BETTER_MAX(x[i], m) : BETTER_MIN(x[i], m);            \
        return m;                                                                \
    }                                                                            \
    static int64_t row_arg_##T(const T *x, int64_t n, bool want_max)             \
    {                                                                            \
        int64_t best = 0;                                                        \
        for (int64_t i = 0; i < n; i++) {                                        \
            if (IS_FLOAT && x[i] != x[i])                                        \
                return i;                                                        \
            if (want_max ? x[i] > x[best] : x[i] < x[best])                      \
                best = i;                                                        \
        }                                                                        \
        return best;                                                             \
    }                                                                            \
    static void col_sum_##T(const T *x, int64_t rows, int64_t stride, int64_t n, S *acc) \
    {                                                                            \
        for (int64_t i = 0; i < n; i++) acc[i] = 0;                              \
        for (int64_t r = 0; r < rows; r++)                                       \
            for (int64_t i = 0; i < n; i++) acc[i] += (S)x[r * stride + i];      \
    }                                                                            \
    static void col_prod_##T(const T *x, int64_t rows, int64_t stride, int64_t n, S *acc) \
    {                                                                            \
        for (int64_t i = 0; i < n; i++) acc[i] = 1;                              \
        for (int64_t r = 0; r < rows; r++)                                       \
            for (int64_t i = 0; i < n; i++) acc[i] *= (S)x[r * stride + i];      \
    }                                                                            \
    static void col_extreme_##T(const T *x, int64_t rows, int64_t stride, int64_t n, \
                                T *acc, bool want_max)                           \
    {                                                                            \
        memcpy(acc, x, (size_t)n * sizeof(T));                                   \
        for (int64_t r = 1; r < rows; r++) {                                     \
            const T *row = x + r * stride;                                       \
            if (want_max)                                                        \
                for (int64_t i = 0; i < n; i++) acc[i] = BETTER_MAX(row[i], acc[i]); \
            else                                                                 \
                for (int64_t i = 0; i < n; i++) acc[i] = BETTER_MIN(row[i], acc[i]); \
        }                                                                        \
    }                                                                            \
    static void col_arg_##T(const T *x, int64_t rows, int64_t stride, int64_t n, \
                            int64_t *idx, bool want_max)                         \
    {                                                                            \
        T best[TILE];                                                            \
        memcpy(best, x, (size_t)n * sizeof(T));                                  \
        for (int64_t i = 0; i < n; i++) idx[i] = 0;                              \
        for (int64_t r = 1; r < rows; r++) {                                     \
            const T *row = x + r * stride;                                       \
            for (int64_t i = 0; i < n; i++) {                                    \
                bool better = want_max ? row[i] > best[i] : row[i] < best[i];    \
                bool take = better || (row[i] != row[i] && best[i] == best[i]);  \
                best[i] = take ? row[i] : best[i];                               \
                idx[i] = take ? r : idx[i];                                      \
            }                                                                    \
        }                                                                        \
    }

/* v replaces acc when larger (smaller) or NaN; a NaN acc stays. */
#define BETTER_MAX(v, acc) (((v) > (acc) || (v) != (v)) ? (v) : (acc))
#define BETTER_MIN(v, acc) (((v) < (acc) || (v) != (v)) ? (v) : (acc))

typedef float f32;
typedef double f64;
typedef int64_t i64;
REDUCE_LOOPS(f32, double, true)
REDUCE_LOOPS(f64, double, true)
REDUCE_LOOPS(i64, uint64_t, false)

/* -- Plan ------------------------------------------------------------------ */

typedef struct {
    ir_op op;
    kiln_dtype work;   /* F32, F64 or I64: the dtype the loops read */
    const char *in;    /* contiguous [outer, R, inner] */
    int64_t outer, rows, inner, tiles;
    char *acc;         /* [outer, inner] of the accumulator dtype */
} reduce_plan;

/* The accumulator dtype: sums in f64 or i64, extremes in the work dtype. */
static bool is_arg(ir_op op)
{
    return op == OP_ARGMAX || op == OP_ARGMIN;
}

static kiln_dtype acc_dtype(ir_op op, kiln_dtype work)
{
    if (is_arg(op))
        return KILN_I64;
    if (op == OP_SUM || op == OP_MEAN || op == OP_PROD)
        return work == KILN_I64 ? KILN_I64 : KILN_F64;
    return work;
}

#define DISPATCH_ROW(T, S)                                                         \
    do {                                                                           \
        const T *x = (const T *)p->in + o * p->rows;                               \
        if (is_arg(p->op))                                                         \
            ((int64_t *)p->acc)[o] = row_arg_##T(x, p->rows, p->op == OP_ARGMAX);  \
        else if (p->op == OP_MAX || p->op == OP_MIN)                               \
            ((T *)p->acc)[o] = row_extreme_##T(x, p->rows, p->op == OP_MAX);       \
        else if (p->op == OP_PROD)                                                 \
            ((S *)p->acc)[o] = row_prod_##T(x, p->rows);                           \
        else                                                                       \
            ((S *)p->acc)[o] = row_sum_##T(x, p->rows);                            \
    } while (0)

void ISA_NAME(reduce_rows)(void *ctx, int64_t begin, int64_t end)
{
    const reduce_plan *p = ctx;
    for (int64_t o = begin; o < end; o++) {
        switch (p->work) {
        case KILN_F32: DISPATCH_ROW(f32, double); break;
        case KILN_F64: DISPATCH_ROW(f64, double); break;
        default: DISPATCH_ROW(i64, uint64_t); break;
        }
    }
}

#define DISPATCH_TILE(T, S)                                                        \
    do {                                                                           \
        const T *x = (const T *)p->in + o * p->rows * p->inner + i0;               \
        int64_t at = o * p->inner + i0;                                            \
        if (is_arg(p->op))                                                         \
            col_arg_##T(x, p->rows, p->inner, n, (int64_t *)p->acc + at, p->op == OP_ARGMAX); \
        else if (p->op == OP_MAX || p->op == OP_MIN)                               \
            col_extreme_##T(x, p->rows, p->inner, n, (T *)p->acc + at, p->op == OP_MAX); \
        else if (p->op == OP_PROD)                                                 \
            col_prod_##T(x, p->rows, p->inner, n, (S *)p->acc + at);               \
        else                                                                       \
            col_sum_##T(x, p->rows, p->inner, n, (S *)p->acc + at);                \
    } while (0)

void ISA_NAME(reduce_tiles)(void *ctx, int64_t begin, int64_t end)
{
    const reduce_plan *p = ctx;
    for (int64_t t = begin; t < end; t++) {
        int64_t o = t / p->tiles, i0 = t % p->tiles * TILE;
        int64_t n = p->inner - i0 < TILE ? p->inner - i0 : TILE;
        switch (p->work) {
        case KILN_F32: DISPATCH_TILE(f32, double); break;
        case KILN_F64: DISPATCH_TILE(f64, double); break;
        default: DISPATCH_TILE(i64, uint64_t); break;
        }
    }
}

#ifndef EAGER_ISA_VARIANT /* the rest is compiled once (isa.h) */

/* A full reduction of one long row splits it into a column of pieces: the
 * pieces reduce in parallel as rows, then the partial results reduce again. */
static bool split_long_row(reduce_plan *p)
{
    int threads = core_threads();
    if (p->outer != 1 || p->inner != 1 || threads == 1 || p->rows < 2 * WORK_GRAIN || is_arg(p->op))
        return false;
    int64_t pieces = threads * PIECES_PER_THREAD < MAX_PIECES ? threads * PIECES_PER_THREAD : MAX_PIECES;
    while (p->rows % pieces)
        pieces--;
    if (pieces < 2)
        return false;
    p->outer = pieces;
    p->rows /= pieces;
    return true;
}

static void run(reduce_plan *p)
{
    if (p->inner == 1) {
        int64_t grain = WORK_GRAIN / p->rows;
        core_parallel_for(p->outer, grain, eager_isa_current()->reduce_rows, p);
        return;
    }
    p->tiles = (p->inner + TILE - 1) / TILE;
    int64_t grain = WORK_GRAIN / (p->rows * TILE);
    core_parallel_for(p->outer * p->tiles, grain, eager_isa_current()->reduce_tiles, p);
}

/* -- Public ---------------------------------------------------------------- */

static void output_shape(const kiln_tensor *a, int axis, bool keepdim, int *ndim, int64_t *shape)
{
    int n = 0;
    for (int d = 0; d < a->ndim; d++) {
        bool reduced = axis == KILN_ALL || d == axis;
        if (!reduced)
            shape[n++] = a->shape[d];
        else if (keepdim)
            shape[n++] = 1;
    }
    *ndim = n;
}

/* Reduces the partial results of split_long_row (already in acc) once more. */
static void finish_split(reduce_plan *p, kiln_dtype acc_dt)
{
    reduce_plan again = *p;
    again.work = acc_dt;
    again.in = p->acc;
    again.rows = p->outer;
    again.outer = 1;
    if (again.op == OP_MEAN)
        again.op = OP_SUM;
    union { double f; int64_t i; float f32; } partial;
    again.acc = (char *)&partial;
    run(&again);
    memcpy(p->acc, &partial, eager_dtype_size(acc_dt));
}

/* Means from sums, in place: the accumulator becomes f64. */
static void sums_to_means(char *acc, kiln_dtype acc_dt, int64_t n, int64_t count)
{
    for (int64_t i = 0; i < n; i++) {
        double mean;
        if (acc_dt == KILN_I64) {
            int64_t sum;
            memcpy(&sum, acc + 8 * i, 8);
            mean = (double)sum / (double)count;
        } else {
            memcpy(&mean, acc + 8 * i, 8);
            mean /= (double)count;
        }
        memcpy(acc + 8 * i, &mean, 8);
    }
}

static void outer_inner(const kiln_tensor *a, int axis, int64_t *outer, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; axis != KILN_ALL && d < a->ndim; d++) {
        if (d < axis)
            *outer *= a->shape[d];
        if (d > axis)
            *inner *= a->shape[d];
    }
}

static kiln_tensor *reduce_cuda(ir_op op, const char *fn, kiln_tensor *a, int axis, kiln_dtype result, int ndim,
                                const int64_t *shape)
{
    kiln_tensor *out = tensor_new_on(fn, KILN_CUDA, result, ndim, shape);
    int64_t outer, inner;
    outer_inner(a, axis, &outer, &inner);
    int64_t n = axis == KILN_ALL ? a->numel : a->shape[axis];
    if (out && cuda_reduce(fn, op, a, outer, n, inner, out) < 0)
        out = tensor_drop(out);
    return tensor_own(out);
}

static kiln_tensor *(*const one_axis[OP__COUNT])(kiln_tensor *, int, bool) = {
#define OP_REDUCE(N, n, flags, rule) [OP_##N] = kiln_##n,
#define OP(N, n, arity, kind, flags, rule)
#include "ir/ops.def"
};

static kiln_tensor *reduce_value(ir_op op, const char *fn, kiln_tensor *a, int axis, bool keepdim)
{
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0)
        return NULL;
    if (eager_is_axes(axis) && !is_arg(op))
        return eager_reduce_axes(fn, one_axis[op], a, axis, keepdim);
    if (eager_is_axes(axis)) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "takes one axis or KILN_ALL, not a set of axes (operand %s)", describe(d, a));
        return NULL;
    }
    if (axis != KILN_ALL && a->ndim == 0 && (axis == 0 || axis == -1))
        axis = KILN_ALL;
    if (axis != KILN_ALL && check_axis(fn, axis, a, 0, &axis) < 0)
        return NULL;
    kiln_dtype result = (kiln_dtype)ir_result_dtype(ir_ops[op].rule, a->dtype);
    int64_t rows = axis == KILN_ALL ? a->numel : a->shape[axis];
    if (rows == 0 && op != OP_SUM && op != OP_MEAN && op != OP_PROD) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "cannot reduce an empty axis of %s", describe(d, a));
        return NULL;
    }
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    output_shape(a, axis, keepdim, &ndim, shape);
    if (recording()) {
        ir_params params = {.axis = axis, .keepdim = keepdim};
        return record_op(fn, op, 1, &a, &params, result, ndim, shape);
    }

    if (a->device == KILN_CUDA)
        return reduce_cuda(op, fn, a, axis, result, ndim, shape);
    kiln_dtype work = ir_dtype_is_float(a->dtype) ? a->dtype : op == OP_MEAN ? KILN_F64 : KILN_I64;
    kiln_dtype acc_dt = acc_dtype(op, work);
    kiln_tensor *in = a->dtype == work && eager_is_contiguous(a) ? kiln_retain(a)
                                                                 : copy_as(fn, a, work);
    kiln_tensor *out = tensor_new(fn, result, ndim, shape);
    int64_t outer, inner;
    outer_inner(a, axis, &outer, &inner);
    kiln_tensor *acc = NULL;
    if (in && out)
        acc = tensor_new(fn, acc_dt, 1, (int64_t[]){out->numel > MAX_PIECES ? out->numel : MAX_PIECES});
    if (!acc) {
        kiln_release(in);
        return tensor_drop(out);
    }
    reduce_plan plan = {op, work, eager_data(in), outer, rows, inner, 0, eager_data(acc)};
    if (rows == 0) { /* sums of nothing are 0, products 1 */
        memset(plan.acc, 0, (size_t)out->numel * eager_dtype_size(acc_dt));
        for (int64_t i = 0; op == OP_PROD && i < out->numel; i++) {
            if (acc_dt == KILN_I64)
                ((int64_t *)plan.acc)[i] = 1;
            else
                ((double *)plan.acc)[i] = 1;
        }
    } else if (split_long_row(&plan)) {
        run(&plan);
        finish_split(&plan, acc_dt);
    } else {
        run(&plan);
    }
    if (op == OP_MEAN) {
        sums_to_means(plan.acc, acc_dt, out->numel, rows);
        acc_dt = KILN_F64;
    }
    convert(out->storage->data, result, plan.acc, acc_dt, out->numel, 1);
    kiln_release(acc);
    kiln_release(in);
    return tensor_own(out);
}

/* The reduction, with its gradient record where it needs one (a 0-d
 * operand's axis 0 or -1 is every axis, as reduce_value takes it; a set of
 * axes is reduced one at a time, each recording its own). */
static kiln_tensor *reduce(ir_op op, const char *fn, kiln_tensor *a, int axis, bool keepdim)
{
    kiln_tensor *out = reduce_value(op, fn, a, axis, keepdim);
    if (!out || eager_is_axes(axis))
        return out;
    if (a->ndim == 0)
        axis = KILN_ALL;
    else if (axis < 0 && axis != KILN_ALL)
        axis += a->ndim;
    ir_params params = {.axis = axis, .keepdim = keepdim};
    return grad_track(op, 1, &a, &params, out);
}

#define OP_REDUCE(N, n, flags, rule)                                  \
    kiln_tensor *kiln_##n(kiln_tensor *a, int axis, bool keepdim)     \
    {                                                                 \
        return reduce(OP_##N, "kiln_" #n, a, axis, keepdim);          \
    }
#define OP(N, n, arity, kind, flags, rule)
#include "ir/ops.def"

#endif
