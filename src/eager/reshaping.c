/* Movement written with the movement ops: stack, split, flip, pad, repeat,
 * and tril and triu (a mask from two ranges). Views where the result is
 * one (split, flip), else as few copies as concat and reshape make. */
#include <string.h>

#include "eager/internal.h"

kiln_tensor *kiln_stack(kiln_tensor *const *ts, int n, int axis)
{
    const char *fn = "kiln_stack";
    if (!ts || n < 1) {
        core_fail(CORE_VALUE, fn, "needs at least one tensor (got %d)", ts ? n : 0);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!ts[i]) {
            core_fail_null(fn, "a tensor");
            return NULL;
        }
        bool same = ts[i]->ndim == ts[0]->ndim;
        for (int d = 0; same && d < ts[0]->ndim; d++)
            same = ts[i]->shape[d] == ts[0]->shape[d];
        if (!same) {
            char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
            core_fail(CORE_SHAPE, fn, "tensors 0 and %d differ in shape: %s and %s", i, describe(a, ts[0]),
                      describe(b, ts[i]));
            return NULL;
        }
    }
    int resolved;
    if (check_axis(fn, axis, ts[0], 1, &resolved) < 0)
        return NULL;
    kiln_tensor **parts = malloc((size_t)n * sizeof *parts);
    if (!parts) {
        core_fail_status(CORE_NOMEM, fn);
        return NULL;
    }
    composite_begin();
    for (int i = 0; i < n; i++)
        parts[i] = kiln_unsqueeze(ts[i], resolved);
    kiln_tensor *r = composite_end(fn, kiln_concat(parts, n, resolved));
    free(parts);
    return r;
}

/* -- split ---------------------------------------------------------------------- */

/* Views of a along axis (resolved) of the n sizes, into out; sizes sum to
 * the axis's extent. */
static int split_views(const char *fn, kiln_tensor *a, int axis, int n, const int64_t *sizes, kiln_tensor **out)
{
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        out[i] = kiln_slice(a, axis, start, start + sizes[i], 1);
        start += sizes[i];
        if (!out[i]) {
            for (int j = 0; j < i; j++)
                out[j] = (kiln_release(out[j]), NULL);
            return core_fail(CORE_VALUE, fn, "%s", kiln_last_error());
        }
    }
    core_succeeded();
    return n;
}

int kiln_split_sizes(kiln_tensor *a, int n, const int64_t *sizes, int axis, kiln_tensor **out)
{
    const char *fn = "kiln_split_sizes";
    if (!out || !sizes)
        return core_fail_null_arg(fn, !out ? "out" : "sizes");
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0 || check_axis(fn, axis, a, 0, &axis) < 0)
        return core_error_status();
    int64_t total = 0;
    bool sound = n > 0;
    for (int i = 0; i < n && sound; i++) {
        sound = sizes[i] >= 0 && sizes[i] <= a->shape[axis] - total;
        total += sound ? sizes[i] : 0;
    }
    if (!sound || total != a->shape[axis]) {
        char d[DESCRIBE_MAX];
        return core_fail(CORE_SHAPE, fn, "%d sizes must be at least 0 and add up to %lld, the extent of axis %d of %s",
                         n, (long long)a->shape[axis], axis, describe(d, a));
    }
    return split_views(fn, a, axis, n, sizes, out);
}

int kiln_split(kiln_tensor *a, int64_t size, int axis, kiln_tensor **out, int max_out)
{
    const char *fn = "kiln_split";
    if (!out)
        return core_fail_null_arg(fn, "out");
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0 || check_axis(fn, axis, a, 0, &axis) < 0)
        return core_error_status();
    int64_t extent = a->shape[axis];
    /* an empty axis is one empty piece, as in PyTorch */
    int64_t n = size <= 0 ? -1 : size >= extent ? 1 : (extent + size - 1) / size;
    char d[DESCRIBE_MAX];
    if (n < 0 || n > max_out)
        return core_fail(CORE_VALUE, fn, "pieces of %lld along axis %d of %s: %s", (long long)size, axis,
                         describe(d, a), n < 0 ? "the size must be positive" : "more than max_out");
    int64_t one = extent, *sizes = n > 1 ? malloc((size_t)n * sizeof *sizes) : &one;
    if (!sizes)
        return core_fail_status(CORE_NOMEM, fn);
    for (int64_t i = 0; i < n; i++)
        sizes[i] = extent - i * size < size ? extent - i * size : size;
    int status = split_views(fn, a, axis, (int)n, sizes, out);
    if (sizes != &one)
        free(sizes);
    return status;
}

/* -- flip ---------------------------------------------------------------------------- */

kiln_tensor *kiln_flip(kiln_tensor *a, int axis)
{
    const char *fn = "kiln_flip";
    bool flipped[KILN_MAX_DIMS];
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0 ||
        eager_reduced_axes(fn, a, axis, flipped) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *r = a;
    for (int d = 0; d < a->ndim && r; d++)
        if (flipped[d])
            r = kiln_slice(r, d, -1, INT64_MIN, -1);
    return composite_end(fn, r == a ? kiln_reshape(a, a->ndim, a->shape) : r);
}

/* -- pad ----------------------------------------------------------------------------- */

/* a with before and after elements added along axis: constant value, or
 * the reflection of a about its edges (without the edge). */
static kiln_tensor *pad_axis(const char *fn, kiln_tensor *a, int axis, int64_t before, int64_t after,
                             kiln_pad_mode mode, double value)
{
    if (before < 0 || after < 0) /* cropping: only the constant mode takes it */
        a = kiln_slice(a, axis, before < 0 ? -before : 0, after < 0 ? a->shape[axis] + after : a->shape[axis], 1);
    before = before > 0 ? before : 0;
    after = after > 0 ? after : 0;
    if (!a || (before == 0 && after == 0))
        return a;
    int64_t n = a->shape[axis], stop = n - 2 - after; /* a negative stop would count from the end */
    kiln_tensor *parts[3];
    int k = 0;
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, a->shape, sizeof shape);
    for (int side = 0; side < 2; side++) {
        int64_t width = side ? after : before;
        if (side)
            parts[k++] = a;
        if (width == 0)
            continue;
        shape[axis] = width;
        if (mode == KILN_PAD_CONSTANT)
            parts[k++] = eager_filled(fn, a->dtype, a->ndim, shape, value, a->device);
        else if (side)
            parts[k++] = kiln_slice(a, axis, n - 2, stop < 0 ? INT64_MIN : stop, -1);
        else
            parts[k++] = kiln_slice(a, axis, before, 0, -1);
    }
    return kiln_concat(parts, k, axis);
}

static int check_pad(const char *fn, const kiln_tensor *a, int n, const int64_t *pads, kiln_pad_mode mode)
{
    char d[DESCRIBE_MAX];
    if (n < 0 || n % 2 || n / 2 > a->ndim)
        return core_fail(CORE_VALUE, fn, "%d pads: need before and after pairs for at most the %d axes of %s", n,
                         a->ndim, describe(d, a));
    if (mode != KILN_PAD_CONSTANT && mode != KILN_PAD_REFLECT)
        return core_fail(CORE_VALUE, fn, "mode %d is not a kiln_pad_mode", (int)mode);
    for (int i = 0; i < n; i++) {
        int64_t extent = a->shape[a->ndim - 1 - i / 2];
        bool fits = mode == KILN_PAD_CONSTANT ? pads[i] >= -extent : pads[i] == 0 || (pads[i] > 0 && pads[i] < extent);
        if (!fits || pads[i] > IR_MAX_NUMEL)
            return core_fail(CORE_VALUE, fn, "pad %lld of axis %d of %s: %s", (long long)pads[i],
                             a->ndim - 1 - i / 2, describe(d, a),
                             pads[i] > IR_MAX_NUMEL      ? "more than 2^59 elements"
                             : mode == KILN_PAD_CONSTANT ? "crops more than the axis has"
                                                         : "reflect pads must be at least 0 and less than the axis");
    }
    if (mode == KILN_PAD_CONSTANT)
        for (int i = 0; i + 1 < n; i += 2)
            if (pads[i] + pads[i + 1] < -a->shape[a->ndim - 1 - i / 2])
                return core_fail(CORE_VALUE, fn, "pads %lld and %lld crop more than axis %d of %s has",
                                 (long long)pads[i], (long long)pads[i + 1], a->ndim - 1 - i / 2, describe(d, a));
    return 0;
}

kiln_tensor *kiln_pad(kiln_tensor *a, int n, const int64_t *pads, kiln_pad_mode mode, double value)
{
    const char *fn = "kiln_pad";
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0)
        return NULL;
    if (!pads && n > 0) {
        core_fail_null_arg(fn, "pads");
        return NULL;
    }
    if (check_pad(fn, a, n, pads, mode) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *r = a;
    for (int i = 0; i + 1 < n && r; i += 2)
        r = pad_axis(fn, r, a->ndim - 1 - i / 2, pads[i], pads[i + 1], mode, value);
    return composite_end(fn, r == a ? kiln_reshape(a, a->ndim, a->shape) : r);
}

/* -- tril, triu ------------------------------------------------------------------------ */

/* 0, 1, ..., n - 1 (i64) on a's device: running sums of ones, so that it is
 * made on the device the values are on when traced too (a tracer's device
 * is its call's). */
static kiln_tensor *positions(const char *fn, const kiln_tensor *a, int64_t n)
{
    return kiln_sub_scalar(kiln_cumsum(eager_filled(fn, KILN_I64, 1, &n, 1, a->device), 0), 1);
}

/* a where its last two axes' column - row is at most (lower) or at least
 * (upper) diagonal, else 0. */
static kiln_tensor *triangle(const char *fn, kiln_tensor *a, int64_t diagonal, bool lower)
{
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0)
        return NULL;
    if (a->ndim < 2) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "%s has fewer than 2 axes", describe(d, a));
        return NULL;
    }
    int64_t rows = a->shape[a->ndim - 2], cols = a->shape[a->ndim - 1];
    composite_begin();
    kiln_tensor *r = positions(fn, a, rows), *c = positions(fn, a, cols);
    kiln_tensor *offset = kiln_sub(kiln_reshape(c, 2, (int64_t[]){1, cols}), kiln_reshape(r, 2, (int64_t[]){rows, 1}));
    kiln_tensor *keep = eager_scalar_op(lower ? OP_LE : OP_GE, fn, offset, (double)diagonal, false);
    kiln_tensor *zero = eager_filled(fn, a->dtype, 0, NULL, 0, a->device);
    return composite_end(fn, kiln_where(keep, a, zero));
}

kiln_tensor *kiln_tril(kiln_tensor *a, int64_t diagonal)
{
    return triangle("kiln_tril", a, diagonal, true);
}

kiln_tensor *kiln_triu(kiln_tensor *a, int64_t diagonal)
{
    return triangle("kiln_triu", a, diagonal, false);
}

/* -- repeat ---------------------------------------------------------------------------- */

/* a tiled reps[i] times along each axis (n >= a's rank; leading reps add
 * axes): a size-1 axis inserted before each repeated axis, expanded to the
 * count and merged with it. */
kiln_tensor *kiln_repeat(kiln_tensor *a, int n, const int64_t *reps)
{
    const char *fn = "kiln_repeat";
    if (check_operands(fn, 1, &a, (const char *const[]){"operand a"}) < 0)
        return NULL;
    char d[DESCRIBE_MAX];
    bool sound = reps && n >= a->ndim && n <= KILN_MAX_DIMS;
    int lead = n - a->ndim, grown = 0;
    for (int i = 0; sound && i < n; i++) {
        sound = reps[i] >= 0;
        grown += i >= lead && reps[i] != 1;
    }
    if (!sound) {
        core_fail(CORE_VALUE, fn, "%d repeats for %s: need one per axis (at most %d), none negative", n,
                  describe(d, a), KILN_MAX_DIMS);
        return NULL;
    }
    if (n + grown > KILN_MAX_DIMS) {
        core_fail(CORE_SHAPE, fn, "repeating %d axes of %s needs more than %d dimensions", grown, describe(d, a),
                  KILN_MAX_DIMS);
        return NULL;
    }
    int64_t split[KILN_MAX_DIMS], expanded[KILN_MAX_DIMS], final[KILN_MAX_DIMS];
    int m = 0;
    for (int i = 0; i < n; i++) {
        int64_t size = i < lead ? 1 : a->shape[i - lead];
        if (size > 0 && reps[i] > IR_MAX_NUMEL / size) {
            core_fail(CORE_SHAPE, fn, "%s repeated %lld times along axis %d of the result: more than 2^59 elements",
                      describe(d, a), (long long)reps[i], i);
            return NULL;
        }
        final[i] = size * reps[i];
        if (i >= lead && reps[i] != 1) {
            split[m] = 1;
            expanded[m++] = reps[i];
        }
        split[m] = size;
        expanded[m++] = i < lead ? reps[i] : size;
    }
    composite_begin();
    kiln_tensor *r = kiln_expand(kiln_reshape(a, m, split), m, expanded);
    return composite_end(fn, kiln_contiguous(kiln_reshape(r, n, final)));
}
