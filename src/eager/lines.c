/* Ops along one axis, line by line: cumsum, and topk and sort (the indices
 * of a line in order, the values gathered by them). Each is an op of the
 * table run by these eager loops (or their CUDA kernels) in every plan.
 *
 * The input is seen as [outer, n, inner], n the axis's extent. cumsum
 * accumulates floats in f64 and integers in wrapping i64; top-k orders by
 * value with NaN above every number and ties to the lower index, a stable
 * merge sort of each line's indices. */
#include <string.h>

#include "eager/internal.h"

/* The extents around axis of a: before, along, after it. */
static void line_extents(const kiln_tensor *a, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = *inner = 1;
    *n = a->ndim ? a->shape[axis] : 1;
    for (int d = 0; d < a->ndim; d++) {
        if (d < axis)
            *outer *= a->shape[d];
        if (d > axis)
            *inner *= a->shape[d];
    }
}

/* Resolves axis of a; a 0-d tensor takes 0 or -1, as its one line. */
static int line_axis(const char *fn, const kiln_tensor *a, int axis, int *resolved)
{
    if (a->ndim == 0 && (axis == 0 || axis == -1)) {
        *resolved = 0;
        return 0;
    }
    return check_axis(fn, axis, a, 0, resolved);
}

/* -- cumsum ------------------------------------------------------------------- */

typedef struct {
    char *data; /* [outer, n, inner] of f64 or i64, scanned in place */
    bool is_int;
    int64_t n, inner;
} scan_job;

static void scan_lines(void *ctx, int64_t begin, int64_t end)
{
    const scan_job *j = ctx;
    for (int64_t o = begin; o < end; o++) {
        for (int64_t r = 1; r < j->n; r++) {
            int64_t at = (o * j->n + r) * j->inner, prev = at - j->inner;
            if (j->is_int) {
                uint64_t *x = (uint64_t *)j->data; /* unsigned: sums wrap */
                for (int64_t i = 0; i < j->inner; i++)
                    x[at + i] += x[prev + i];
            } else {
                double *x = (double *)j->data;
                for (int64_t i = 0; i < j->inner; i++)
                    x[at + i] += x[prev + i];
            }
        }
    }
}

static kiln_tensor *cumsum_cuda(const char *fn, kiln_tensor *a, int axis, kiln_dtype dt)
{
    kiln_tensor *in = eager_is_contiguous(a) ? kiln_retain(a) : copy_as(fn, a, a->dtype);
    kiln_tensor *out = in ? tensor_new_on(fn, KILN_CUDA, dt, a->ndim, a->shape) : NULL;
    kg_kernel k = cuda_request(KG_SCAN, OP_CUMSUM, 1);
    k.in[0] = a->dtype;
    k.compute = ir_dtype_is_float(a->dtype) ? a->dtype : KILN_I64;
    k.acc = ir_dtype_is_float(a->dtype) ? KILN_F64 : KILN_I64;
    k.out = dt;
    kg_code code;
    if (out && out->numel && cuda_kernel(fn, &k, &code) == 0) {
        int64_t outer, n, inner;
        line_extents(a, axis, &outer, &n, &inner);
        kg_reduce_args args = {outer, n, inner};
        void *pointers[2] = {eager_data(out), eager_data(in)};
        void *params[3] = {&args, &pointers[0], &pointers[1]};
        unsigned grid[3] = {device_grid(args.outer * args.inner), 1, 1};
        if (cuda_launch(fn, &code, grid, params) < 0)
            out = tensor_drop(out);
    } else if (out && out->numel) {
        out = tensor_drop(out);
    }
    kiln_release(in);
    return out;
}

static kiln_tensor *cumsum_value(kiln_tensor *a, int axis)
{
    const char *fn = "kiln_cumsum";
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0 || line_axis(fn, a, axis, &axis) < 0)
        return NULL;
    kiln_dtype dt = (kiln_dtype)ir_result_dtype(RULE_SUM, a->dtype);
    if (a->ndim == 0)
        return kiln_cast(a, dt);
    if (recording()) {
        ir_params params = {.axis = axis};
        return record_op(fn, OP_CUMSUM, 1, &a, &params, dt, a->ndim, a->shape);
    }
    if (a->device == KILN_CUDA)
        return tensor_own(cumsum_cuda(fn, a, axis, dt));
    bool is_int = !ir_dtype_is_float(a->dtype);
    kiln_tensor *acc = copy_as(fn, a, is_int ? KILN_I64 : KILN_F64);
    kiln_tensor *out = acc ? tensor_new(fn, dt, a->ndim, a->shape) : NULL;
    if (out) {
        int64_t outer;
        scan_job job = {eager_data(acc), is_int, 0, 0};
        line_extents(a, axis, &outer, &job.n, &job.inner);
        core_parallel_for(outer, 1 + 64 * 1024 / (job.n * job.inner + 1), scan_lines, &job);
        convert(out->storage->data, dt, job.data, acc->dtype, out->numel, 1);
    }
    kiln_release(acc);
    return tensor_own(out);
}

/* The running sums, with their gradient record where they need one. */
kiln_tensor *kiln_cumsum(kiln_tensor *a, int axis)
{
    kiln_tensor *out = cumsum_value(a, axis);
    ir_params params = {.axis = out && axis < 0 ? axis + a->ndim : axis};
    return out && a->ndim > 0 ? grad_track(OP_CUMSUM, 1, &a, &params, out) : out;
}

/* -- top-k ------------------------------------------------------------------- */

typedef struct {
    const char *data; /* [outer, n, inner] of dtype */
    kiln_dtype dtype;
    int64_t n, inner, k;
    bool largest;
    int64_t *out;     /* [outer, k, inner] */
    _Atomic bool failed; /* a worker ran out of memory */
} topk_job;

/* -1, 0, 1 as x < y, x == y, x > y, NaN above every number and equal to NaN. */
static int order_f64(double x, double y)
{
    if (x != x || y != y)
        return (x != x) - (y != y);
    return (x > y) - (x < y);
}

static int order_i64(int64_t x, int64_t y)
{
    return (x > y) - (x < y);
}

/* Whether element i of the line goes before element j. */
static bool before(const topk_job *j, const double *f, const int64_t *l, int64_t a, int64_t b)
{
    int order = f ? order_f64(f[a], f[b]) : order_i64(l[a], l[b]);
    if (order)
        return j->largest ? order > 0 : order < 0;
    return a < b;
}

/* A stable merge sort of idx[0..n) by before(), through tmp. */
static void merge_sort(const topk_job *j, const double *f, const int64_t *l, int64_t *idx, int64_t *tmp, int64_t n)
{
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t a = lo, b = mid, t = lo;
            while (a < mid && b < hi)
                tmp[t++] = before(j, f, l, idx[b], idx[a]) ? idx[b++] : idx[a++];
            while (a < mid)
                tmp[t++] = idx[a++];
            while (b < hi)
                tmp[t++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

static void topk_lines(void *ctx, int64_t begin, int64_t end)
{
    topk_job *j = ctx;
    bool exact_i64 = j->dtype == KILN_I64; /* beyond 2^53 a double would tie different values */
    int64_t n = j->n ? j->n : 1;
    int64_t *idx = malloc((size_t)n * 2 * sizeof *idx);
    void *values = malloc((size_t)n * 8);
    if (!idx || !values) {
        j->failed = true;
        goto done;
    }
    strided line = {(char *)j->data, j->dtype, 1, &j->n, &j->inner};
    for (int64_t ln = begin; ln < end; ln++) {
        int64_t o = ln / j->inner, i = ln % j->inner;
        line.base = (char *)j->data + (o * j->n * j->inner + i) * (int64_t)eager_dtype_size(j->dtype);
        strided_gather(values, exact_i64 ? KILN_I64 : KILN_F64, &line, 0, j->n);
        for (int64_t r = 0; r < j->n; r++)
            idx[r] = r;
        merge_sort(j, exact_i64 ? NULL : values, exact_i64 ? values : NULL, idx, idx + n, j->n);
        for (int64_t r = 0; r < j->k; r++)
            j->out[(o * j->k + r) * j->inner + i] = idx[r];
    }
done:
    free(idx);
    free(values);
}

static kiln_tensor *topk_cuda(const char *fn, const kiln_tensor *in, const topk_job *j, int64_t outer,
                              kiln_tensor *out)
{
    int64_t padded = 1;
    while (padded < j->n)
        padded *= 2;
    int64_t lines = outer * j->inner;
    kiln_tensor *scratch = tensor_new_on(fn, KILN_CUDA, KILN_I64, 1, (int64_t[]){lines * padded});
    kg_kernel k = cuda_request(KG_TOPK, OP_TOPK, 1);
    k.in[0] = k.compute = in->dtype;
    k.acc = k.out = KILN_I64;
    kg_code code;
    int status = scratch && cuda_kernel(fn, &k, &code) == 0 ? 0 : -1;
    if (status == 0) {
        kg_topk_args args = {outer, j->n, j->inner, j->k, padded, j->largest, 0};
        void *pointers[3] = {eager_data(out), eager_data(in), eager_data(scratch)};
        void *params[4] = {&args, &pointers[0], &pointers[1], &pointers[2]};
        unsigned grid[3] = {device_grid(lines), 1, 1};
        status = cuda_launch(fn, &code, grid, params);
    }
    kiln_release(scratch);
    return status == 0 ? out : tensor_drop(out);
}

/* The i64 indices of the k first of each line of a along axis (resolved). */
static kiln_tensor *topk_indices(const char *fn, kiln_tensor *a, int64_t k, int axis, bool largest)
{
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    shape[axis] = k;
    if (recording()) {
        ir_params params = {.axis = axis, .index = k, .keepdim = largest};
        return record_op(fn, OP_TOPK, 1, &a, &params, KILN_I64, a->ndim, shape);
    }
    kiln_tensor *in = eager_is_contiguous(a) ? kiln_retain(a) : copy_as(fn, a, a->dtype);
    kiln_tensor *out = in ? tensor_new_on(fn, a->device, KILN_I64, a->ndim, shape) : NULL;
    int64_t outer;
    topk_job job = {in ? eager_data(in) : NULL, a->dtype, 0, 0, k, largest, out ? (int64_t *)eager_data(out) : NULL,
                    false};
    line_extents(a, axis, &outer, &job.n, &job.inner);
    if (out && out->numel && a->device == KILN_CUDA)
        out = topk_cuda(fn, in, &job, outer, out);
    else if (out && out->numel)
        core_parallel_for(outer * job.inner, 1 + 4096 / (job.n + 1), topk_lines, &job);
    if (out && job.failed) {
        core_fail(CORE_NOMEM, fn, "out of memory sorting lines of %lld elements", (long long)job.n);
        out = tensor_drop(out);
    }
    kiln_release(in);
    return tensor_own(out);
}

/* topk and sort: the indices, then the values gathered by them. */
static int ordered(const char *fn, kiln_tensor *a, int64_t k, bool all, int axis, bool largest,
                   kiln_tensor **values, kiln_tensor **indices)
{
    if (!values || !indices)
        return core_fail_null_arg(fn, !values ? "values" : "indices");
    *values = *indices = NULL;
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0 || line_axis(fn, a, axis, &axis) < 0)
        return core_error_status();
    int64_t n = a->ndim ? a->shape[axis] : 1;
    if (all)
        k = n;
    if (k < 0 || k > n || (a->ndim == 0 && k != 1)) {
        char d[DESCRIBE_MAX];
        return core_fail(CORE_VALUE, fn, "k %lld is not in [0, %lld], the extent of axis %d of %s", (long long)k,
                         (long long)n, axis, describe(d, a));
    }
    composite_begin();
    kiln_tensor *idx = a->ndim == 0 ? eager_filled(fn, KILN_I64, 0, NULL, 0, a->device)
                                    : topk_indices(fn, a, k, axis, largest);
    kiln_tensor *v = idx ? kiln_keep(kiln_gather(a, axis, idx)) : NULL;
    if (!(*indices = composite_end(fn, v ? idx : NULL))) {
        kiln_release(v);
        return core_error_status();
    }
    *values = v;
    return 0;
}

int kiln_topk(kiln_tensor *a, int64_t k, int axis, bool largest, kiln_tensor **values, kiln_tensor **indices)
{
    return ordered("kiln_topk", a, k, false, axis, largest, values, indices);
}

int kiln_sort(kiln_tensor *a, int axis, bool descending, kiln_tensor **values, kiln_tensor **indices)
{
    return ordered("kiln_sort", a, 0, true, axis, descending, values, indices);
}

kiln_tensor *eager_topk_indices(const ir_node *n, kiln_tensor *a)
{
    return topk_indices("kiln_topk", a, n->params.index, n->params.axis, n->params.keepdim);
}
