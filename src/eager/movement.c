/* Movement ops: views that share storage (reshape when the strides allow,
 * permute, transpose, expand, slice, squeeze, unsqueeze) and concat. */
#include <string.h>

#include "eager/internal.h"

static const char *const operand_a[] = {"operand a"};

static kiln_tensor *fail_null_arg(const char *fn, const char *what)
{
    core_fail_null_arg(fn, what);
    return NULL;
}

/* -- Reshape --------------------------------------------------------------- */

/* Strides that let shape view a's memory, if any: walks a's dimensions from
 * the innermost, grouping the ones that are contiguous with each other, and
 * requires each group to be split or merged exactly by the new shape. */
static bool view_strides(const kiln_tensor *a, int ndim, const int64_t *shape, int64_t *strides)
{
    if (a->numel == 0 || a->ndim == 0) {
        int64_t step = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            strides[i] = step;
            step *= shape[i] > 1 ? shape[i] : 1;
        }
        return true;
    }
    int view_d = ndim - 1;
    int64_t base_stride = a->strides[a->ndim - 1], group = 1, viewed = 1;
    for (int d = a->ndim - 1; d >= 0; d--) {
        group *= a->shape[d];
        bool group_ends = d == 0 || (a->shape[d - 1] != 1 && a->strides[d - 1] != group * base_stride);
        if (!group_ends)
            continue;
        while (view_d >= 0 && (viewed < group || shape[view_d] == 1)) {
            strides[view_d] = viewed * base_stride;
            viewed *= shape[view_d];
            view_d--;
        }
        if (viewed != group)
            return false;
        if (d > 0) {
            base_stride = a->strides[d - 1];
            group = viewed = 1;
        }
    }
    return view_d == -1;
}

/* Fills in the one -1 of shape; errors name the shapes. */
static int infer_shape(const char *fn, const kiln_tensor *a, int ndim, const int64_t *req, int64_t *shape)
{
    char from[CORE_SHAPE_STR_MAX], to[CORE_SHAPE_STR_MAX];
    core_shape_str(from, a->ndim, a->shape);
    core_shape_str(to, ndim, req);
    int infer = -1;
    int64_t known = 1; /* the product of the sizes given, bounded by a's count */
    bool has_zero = false;
    for (int i = 0; i < ndim; i++) {
        shape[i] = req[i];
        if (req[i] == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (req[i] < 0)
            return core_fail(CORE_SHAPE, fn, "cannot reshape %s to %s: bad size %lld", from, to,
                             (long long)req[i]);
        if (req[i] == 0) {
            has_zero = true;
            continue;
        }
        if (known > a->numel / req[i] && !(a->numel == 0 && known <= (INT64_C(1) << 59) / req[i]))
            return core_fail(CORE_SHAPE, fn, "cannot reshape %s (%lld elements) to %s", from,
                             (long long)a->numel, to);
        known *= req[i];
    }
    if (has_zero)
        known = 0;
    if (infer >= 0) {
        if (known == 0 || a->numel % known)
            return core_fail(CORE_SHAPE, fn, "cannot reshape %s (%lld elements) to %s", from,
                             (long long)a->numel, to);
        shape[infer] = a->numel / known;
        known *= shape[infer];
    }
    if (known != a->numel)
        return core_fail(CORE_SHAPE, fn, "cannot reshape %s (%lld elements) to %s", from,
                         (long long)a->numel, to);
    return 0;
}

kiln_tensor *kiln_reshape(kiln_tensor *a, int ndim, const int64_t *req)
{
    const char *fn = "kiln_reshape";
    if (check_operands(fn, 1, &a, operand_a) < 0)
        return NULL;
    if (ndim < 0 || ndim > KILN_MAX_DIMS) {
        core_fail(CORE_SHAPE, fn, "ndim %d is outside 0..%d", ndim, KILN_MAX_DIMS);
        return NULL;
    }
    if (ndim > 0 && !req)
        return fail_null_arg(fn, "shape");
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    if (infer_shape(fn, a, ndim, req, shape) < 0)
        return NULL;
    if (recording()) { /* the -1 is what a symbolic size can reshape by */
        ir_params params = {0};
        for (int d = 0; d < ndim; d++)
            params.perm[d] = req[d] == -1 ? IR_SIZE_INFERRED : IR_SIZE_GIVEN;
        return grad_track(OP_RESHAPE, 1, &a, NULL, record_op(fn, OP_RESHAPE, 1, &a, &params, a->dtype, ndim, shape));
    }
    if (view_strides(a, ndim, shape, strides))
        return grad_track(OP_RESHAPE, 1, &a, NULL, tensor_own(tensor_view(fn, a, ndim, shape, strides, a->offset)));
    kiln_tensor *copy = copy_as(fn, a, a->dtype);
    if (!copy)
        return NULL;
    view_strides(copy, ndim, shape, strides); /* always fits a contiguous copy */
    kiln_tensor *out = tensor_view(fn, copy, ndim, shape, strides, 0);
    kiln_release(copy);
    return grad_track(OP_RESHAPE, 1, &a, NULL, tensor_own(out));
}

/* -- Axis permutations ----------------------------------------------------- */

kiln_tensor *kiln_permute(kiln_tensor *a, const int *perm)
{
    const char *fn = "kiln_permute";
    if (check_operands(fn, 1, &a, operand_a) < 0)
        return NULL;
    if (!perm && a->ndim > 0)
        return fail_null_arg(fn, "perm");
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    bool used[KILN_MAX_DIMS] = {false};
    ir_params params = {0};
    for (int i = 0; i < a->ndim; i++) {
        int axis;
        if (check_axis(fn, perm[i], a, 0, &axis) < 0)
            return NULL;
        if (used[axis]) {
            char d[DESCRIBE_MAX];
            core_fail(CORE_AXIS, fn, "axis %d appears twice in the permutation of %s", perm[i],
                      describe(d, a));
            return NULL;
        }
        used[axis] = true;
        shape[i] = a->shape[axis];
        strides[i] = a->strides[axis];
        params.perm[i] = axis;
    }
    if (recording())
        return grad_track(OP_PERMUTE, 1, &a, &params, record_op(fn, OP_PERMUTE, 1, &a, &params, a->dtype, a->ndim, shape));
    return grad_track(OP_PERMUTE, 1, &a, &params, tensor_own(tensor_view(fn, a, a->ndim, shape, strides, a->offset)));
}

kiln_tensor *kiln_transpose(kiln_tensor *a, int axis0, int axis1)
{
    const char *fn = "kiln_transpose";
    if (check_operands(fn, 1, &a, operand_a) < 0)
        return NULL;
    int i, j;
    if (check_axis(fn, axis0, a, 0, &i) < 0 || check_axis(fn, axis1, a, 0, &j) < 0)
        return NULL;
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    memcpy(strides, a->strides, sizeof strides);
    shape[i] = a->shape[j], shape[j] = a->shape[i];
    strides[i] = a->strides[j], strides[j] = a->strides[i];
    ir_params params = {0};
    for (int d = 0; d < a->ndim; d++)
        params.perm[d] = d == i ? j : d == j ? i : d;
    if (recording())
        return grad_track(OP_PERMUTE, 1, &a, &params, record_op(fn, OP_PERMUTE, 1, &a, &params, a->dtype, a->ndim, shape));
    return grad_track(OP_PERMUTE, 1, &a, &params, tensor_own(tensor_view(fn, a, a->ndim, shape, strides, a->offset)));
}

/* -- Broadcast, slice, squeeze --------------------------------------------- */

kiln_tensor *kiln_expand(kiln_tensor *a, int ndim, const int64_t *req)
{
    const char *fn = "kiln_expand";
    if (check_operands(fn, 1, &a, operand_a) < 0)
        return NULL;
    if (ndim > 0 && !req)
        return fail_null_arg(fn, "shape");
    char from[CORE_SHAPE_STR_MAX], to[CORE_SHAPE_STR_MAX];
    core_shape_str(from, a->ndim, a->shape);
    if (ndim < 0) {
        core_fail(CORE_SHAPE, fn, "cannot expand %s to ndim %d", from, ndim);
        return NULL;
    }
    if (ndim > KILN_MAX_DIMS) {
        core_fail(CORE_SHAPE, fn, "cannot expand %s to %d dimensions (at most %d)", from, ndim,
                  KILN_MAX_DIMS);
        return NULL;
    }
    if (ndim < a->ndim) {
        core_fail(CORE_SHAPE, fn, "cannot expand %s to %s: fewer dimensions", from,
                  core_shape_str(to, ndim, req));
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    ir_params params = {0};
    int lead = ndim - a->ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t old = d < lead ? 1 : a->shape[d - lead];
        int64_t want = req[d] == -1 && d >= lead ? old : req[d];
        params.perm[d] = req[d] == -1 && d >= lead ? IR_SIZE_FROM + d - lead : IR_SIZE_GIVEN;
        if (want < 0 || (old != 1 && old != want)) {
            core_fail(CORE_SHAPE, fn, "shape %s does not broadcast to %s", from,
                      core_shape_str(to, ndim, req));
            return NULL;
        }
        shape[d] = want;
        strides[d] = old == want && d >= lead ? a->strides[d - lead] : 0;
    }
    int64_t numel;
    if (!ir_shape_numel(ndim, shape, &numel)) {
        core_fail(CORE_SHAPE, fn, "cannot expand %s to %s: more than 2^59 elements", from,
                  core_shape_str(to, ndim, shape));
        return NULL;
    }
    if (recording())
        return grad_track(OP_EXPAND, 1, &a, NULL, record_op(fn, OP_EXPAND, 1, &a, &params, a->dtype, ndim, shape));
    return grad_track(OP_EXPAND, 1, &a, NULL, tensor_own(tensor_view(fn, a, ndim, shape, strides, a->offset)));
}

/* Python's clamping of slice bounds for a size-n axis. */
static int64_t slice_bound(int64_t i, int64_t n, bool forward)
{
    if (i < 0)
        i = i < -n ? -1 : i + n;
    if (forward)
        return i < 0 ? 0 : i > n ? n : i;
    return i > n - 1 ? n - 1 : i;
}

kiln_tensor *kiln_slice(kiln_tensor *a, int axis, int64_t start, int64_t stop, int64_t step)
{
    const char *fn = "kiln_slice";
    if (check_operands(fn, 1, &a, operand_a) < 0)
        return NULL;
    if (check_axis(fn, axis, a, 0, &axis) < 0)
        return NULL;
    if (step == 0) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_VALUE, fn, "step 0 on axis %d of %s: must be nonzero", axis, describe(d, a));
        return NULL;
    }
    int64_t n = a->shape[axis];
    start = slice_bound(start, n, step > 0);
    stop = slice_bound(stop, n, step > 0);
    /* Unsigned: INT64_MIN's magnitude has no int64 (Python takes it). */
    uint64_t magnitude = step > 0 ? (uint64_t)step : 0 - (uint64_t)step;
    int64_t span = step > 0 ? stop - start : start - stop; /* bounds within [-1, n]: no overflow */
    int64_t len = span > 0 ? (int64_t)(((uint64_t)span - 1) / magnitude + 1) : 0;
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    memcpy(strides, a->strides, sizeof strides);
    shape[axis] = len;
    if (len > 1) /* then |step| < n, and the product stays within the storage */
        strides[axis] = a->strides[axis] * step;
    int64_t offset = a->offset + (len ? start * a->strides[axis] : 0);
    ir_params params = {.axis = axis, .start = len ? start : 0, .step = step};
    if (recording())
        return grad_track(OP_SLICE, 1, &a, &params, record_op(fn, OP_SLICE, 1, &a, &params, a->dtype, a->ndim, shape));
    return grad_track(OP_SLICE, 1, &a, &params, tensor_own(tensor_view(fn, a, a->ndim, shape, strides, offset)));
}

kiln_tensor *kiln_squeeze(kiln_tensor *a, int axis)
{
    const char *fn = "kiln_squeeze";
    if (check_operands(fn, 1, &a, operand_a) < 0)
        return NULL;
    if (axis != KILN_ALL) {
        if (check_axis(fn, axis, a, 0, &axis) < 0)
            return NULL;
        if (a->shape[axis] != 1) {
            char d[DESCRIBE_MAX];
            core_fail(CORE_SHAPE, fn, "axis %d of %s has size %lld, not 1", axis, describe(d, a),
                      (long long)a->shape[axis]);
            return NULL;
        }
    }
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    ir_params params = {0};
    int n = 0;
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] == 1 && (axis == KILN_ALL || d == axis))
            continue;
        params.perm[n] = IR_SIZE_FROM + d;
        shape[n] = a->shape[d];
        strides[n++] = a->strides[d];
    }
    if (recording())
        return grad_track(OP_RESHAPE, 1, &a, NULL, record_op(fn, OP_RESHAPE, 1, &a, &params, a->dtype, n, shape));
    return grad_track(OP_RESHAPE, 1, &a, NULL, tensor_own(tensor_view(fn, a, n, shape, strides, a->offset)));
}

kiln_tensor *kiln_unsqueeze(kiln_tensor *a, int axis)
{
    const char *fn = "kiln_unsqueeze";
    if (check_operands(fn, 1, &a, operand_a) < 0)
        return NULL;
    if (check_axis(fn, axis, a, 1, &axis) < 0)
        return NULL;
    if (a->ndim == KILN_MAX_DIMS) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "%s already has %d dimensions", describe(d, a), KILN_MAX_DIMS);
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    ir_params params = {0};
    for (int d = 0, k = 0; d <= a->ndim; d++) {
        if (d == axis) {
            shape[d] = 1;
            strides[d] = k < a->ndim ? a->strides[k] * a->shape[k] : 1;
            continue;
        }
        params.perm[d] = IR_SIZE_FROM + k;
        shape[d] = a->shape[k];
        strides[d] = a->strides[k++];
    }
    if (recording())
        return grad_track(OP_RESHAPE, 1, &a, NULL, record_op(fn, OP_RESHAPE, 1, &a, &params, a->dtype, a->ndim + 1, shape));
    return grad_track(OP_RESHAPE, 1, &a, NULL, tensor_own(tensor_view(fn, a, a->ndim + 1, shape, strides, a->offset)));
}

/* -- Concat ---------------------------------------------------------------- */

static int check_concat(const char *fn, kiln_tensor *const *ts, int n, int axis, int *resolved,
                        kiln_dtype *dt)
{
    if (!ts)
        return core_fail_null_arg(fn, "ts");
    if (n < 1)
        return core_fail(CORE_VALUE, fn, "needs at least one tensor, got %d", n);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "ts[%d]", i);
        if (check_operands(fn, 1, &ts[i], (const char *const[]){what}) < 0)
            return -1;
    }
    if (check_axis(fn, axis, ts[0], 0, resolved) < 0)
        return -CORE_AXIS;
    *dt = ts[0]->dtype;
    for (int i = 1; i < n; i++) {
        bool fits = ts[i]->ndim == ts[0]->ndim;
        for (int d = 0; fits && d < ts[0]->ndim; d++)
            fits = d == *resolved || ts[i]->shape[d] == ts[0]->shape[d];
        if (!fits) {
            char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
            return core_fail(CORE_SHAPE, fn, "ts[0] %s and ts[%d] %s differ off axis %d",
                             describe(a, ts[0]), i, describe(b, ts[i]), *resolved);
        }
        *dt = ir_promote(*dt, IR_DIMS, ts[i]->dtype, IR_DIMS);
    }
    return 0;
}

/* The joined shape; fn's error when it has too many elements. */
static int concat_shape(const char *fn, kiln_tensor *const *ts, int n, int axis, int64_t *shape)
{
    memcpy(shape, ts[0]->shape, (size_t)ts[0]->ndim * sizeof *shape);
    shape[axis] = 0;
    int64_t numel;
    for (int i = 0; i < n; i++) {
        shape[axis] += ts[i]->shape[axis]; /* each at most IR_MAX_NUMEL: no overflow before the check */
        if (!ir_shape_numel(ts[0]->ndim, shape, &numel)) {
            char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
            return core_fail(CORE_SHAPE, fn, "ts[0] %s to ts[%d] %s join along axis %d to more than 2^59 elements",
                             describe(a, ts[0]), i, describe(b, ts[i]), axis);
        }
    }
    return 0;
}

kiln_tensor *kiln_concat(kiln_tensor *const *ts, int n, int axis)
{
    const char *fn = "kiln_concat";
    kiln_dtype dt = KILN_F32;
    if (check_concat(fn, ts, n, axis, &axis, &dt) < 0)
        return NULL;
    int64_t shape[KILN_MAX_DIMS];
    if (concat_shape(fn, ts, n, axis, shape) < 0)
        return NULL;
    ir_params params = {.axis = axis};
    if (recording())
        return grad_track(OP_CONCAT, n, ts, &params, record_op(fn, OP_CONCAT, n, ts, &params, dt, ts[0]->ndim, shape));
    kiln_device device;
    if (cuda_operands_device(fn, n, (const kiln_tensor *const *)ts, &device) < 0)
        return NULL;
    kiln_tensor *out = tensor_new_on(fn, device, dt, ts[0]->ndim, shape);
    if (!out)
        return NULL;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        int64_t part_shape[KILN_MAX_DIMS];
        memcpy(part_shape, shape, sizeof part_shape);
        part_shape[axis] = ts[i]->shape[axis];
        kiln_tensor *part = tensor_view(fn, out, out->ndim, part_shape, out->strides,
                                        at * out->strides[axis]);
        int status = part ? copy_into(fn, part, ts[i]) : -CORE_NOMEM;
        kiln_release(part);
        if (status < 0)
            return tensor_drop(out);
        at += ts[i]->shape[axis];
    }
    return grad_track(OP_CONCAT, n, ts, &params, tensor_own(out));
}
