/* Reductions written with the one-axis ones, so that they trace and fuse:
 * several axes at once (KILN_AXES), any, all, var, std, var_mean and
 * logsumexp. A set of axes is moved to the end and merged into one, so
 * that every reduction over a row (the last axis) fuses with what feeds
 * it; var and logsumexp over the last axis are each one kernel. */
#include <math.h>

#include "eager/internal.h"

typedef kiln_tensor *(*one_axis_fn)(kiln_tensor *a, int axis, bool keepdim);

/* -- Sets of axes ----------------------------------------------------------- */

int eager_reduced_axes(const char *fn, const kiln_tensor *a, int axis, bool *reduced)
{
    for (int d = 0; d < a->ndim; d++)
        reduced[d] = axis == KILN_ALL;
    if (axis == KILN_ALL)
        return 0;
    char buf[DESCRIBE_MAX];
    if (!eager_is_axes(axis)) {
        int resolved;
        if (a->ndim == 0 && (axis == 0 || axis == -1))
            return 0;
        if (check_axis(fn, axis, a, 0, &resolved) < 0)
            return -CORE_SHAPE;
        reduced[resolved] = true;
        return 0;
    }
    if (axis & (1 << 16) || !(axis & 0xffff))
        return core_fail(CORE_SHAPE, fn, "KILN_AXES takes 1 to 8 axes in [-8, 7] (operand %s)", describe(buf, a));
    for (int bit = 0; bit < 16; bit++) {
        if (!(axis >> bit & 1))
            continue;
        int given = bit < 8 ? bit : bit - 16, d = given < 0 ? given + a->ndim : given;
        if (d < 0 || d >= a->ndim)
            return core_fail(CORE_SHAPE, fn, "axis %d is out of range for %s", given, describe(buf, a));
        if (reduced[d])
            return core_fail(CORE_SHAPE, fn, "axis %d appears twice among the axes of %s", d, describe(buf, a));
        reduced[d] = true;
    }
    return 0;
}

/* The elements a reduction over reduced folds into each result. */
static int64_t reduced_count(const kiln_tensor *a, const bool *reduced)
{
    int64_t n = 1;
    for (int d = 0; d < a->ndim; d++)
        n *= reduced[d] ? a->shape[d] : 1;
    return n;
}

/* The axis argument of a one-axis reduction doing the same, or 0 when there
 * is none: several axes. */
static bool one_axis_for(const kiln_tensor *a, const bool *reduced, int *axis)
{
    int count = 0;
    for (int d = 0; d < a->ndim; d++)
        if (reduced[d]) {
            count++;
            *axis = d;
        }
    if (count == a->ndim)
        *axis = KILN_ALL;
    return count <= 1 || count == a->ndim;
}

/* a with the reduced axes moved last, in order, and merged into one. */
static kiln_tensor *merged(kiln_tensor *a, const bool *reduced)
{
    int perm[KILN_MAX_DIMS], n = 0;
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++)
        if (!reduced[d]) {
            shape[n] = a->shape[d];
            perm[n++] = d;
        }
    int kept = n;
    for (int d = 0; d < a->ndim; d++)
        if (reduced[d])
            perm[n++] = d;
    shape[kept] = reduced_count(a, reduced);
    return kiln_reshape(kiln_permute(a, perm), kept + 1, shape);
}

/* The shape of a reduced with keepdim: its reduced axes of size 1. */
static void kept_shape(const kiln_tensor *a, const bool *reduced, int64_t *shape)
{
    for (int d = 0; d < a->ndim; d++)
        shape[d] = reduced[d] ? 1 : a->shape[d];
}

/* one over the reduced axes of a: itself where it takes them as one axis,
 * else over a merged. Inside a composite scope. */
static kiln_tensor *over(one_axis_fn one, kiln_tensor *a, const bool *reduced, bool keepdim)
{
    int axis = KILN_ALL;
    if (one_axis_for(a, reduced, &axis))
        return one(a, axis, keepdim);
    kiln_tensor *r = one(merged(a, reduced), -1, false);
    if (!keepdim)
        return r;
    int64_t shape[KILN_MAX_DIMS];
    kept_shape(a, reduced, shape);
    return kiln_reshape(r, a->ndim, shape);
}

kiln_tensor *eager_reduce_axes(const char *fn, one_axis_fn one, kiln_tensor *a, int axis, bool keepdim)
{
    bool reduced[KILN_MAX_DIMS];
    if (eager_reduced_axes(fn, a, axis, reduced) < 0)
        return NULL;
    composite_begin();
    return composite_end(fn, over(one, a, reduced, keepdim));
}

/* -- Constants of a shape ----------------------------------------------------- */

kiln_tensor *eager_filled(const char *fn, kiln_dtype dt, int ndim, const int64_t *shape, double value,
                          kiln_device device)
{
    if (!recording()) {
        kiln_tensor *t = tensor_new_on(fn, device, dt, ndim, shape);
        if (t && fill_value(t, value) < 0)
            t = tensor_drop(t);
        return tensor_own(t);
    }
    /* Traced: a constant broadcast, which folds into whatever reads it. */
    kiln_tensor *literal = eager_scalar_literal(KILN_F64, value);
    kiln_tensor *t = literal ? kiln_expand(kiln_cast(literal, dt), ndim, shape) : NULL;
    kiln_release(literal);
    return t;
}

/* The shape of a reduced over reduced, keepdim or not. */
static int result_shape(const kiln_tensor *a, const bool *reduced, bool keepdim, int64_t *shape)
{
    int n = 0;
    for (int d = 0; d < a->ndim; d++)
        if (!reduced[d] || keepdim)
            shape[n++] = reduced[d] ? 1 : a->shape[d];
    return n;
}

/* -- any, all ------------------------------------------------------------------ */

/* any is the maximum of the truths, all their minimum; of nothing they are
 * false and true. */
static kiln_tensor *truth_extreme(const char *fn, kiln_tensor *a, int axis, bool keepdim, bool all)
{
    bool reduced[KILN_MAX_DIMS];
    if (!composite_check(fn, a, 0, false) || eager_reduced_axes(fn, a, axis, reduced) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *r;
    if (reduced_count(a, reduced) == 0) {
        int64_t shape[KILN_MAX_DIMS];
        int ndim = result_shape(a, reduced, keepdim, shape);
        r = eager_filled(fn, KILN_BOOL, ndim, shape, all, a->device);
    } else {
        kiln_tensor *truth = eager_scalar_op(OP_NE, fn, a, 0, false);
        r = over(all ? kiln_min : kiln_max, truth, reduced, keepdim);
    }
    return composite_end(fn, r);
}

kiln_tensor *kiln_any(kiln_tensor *a, int axis, bool keepdim)
{
    return truth_extreme("kiln_any", a, axis, keepdim, false);
}

kiln_tensor *kiln_all(kiln_tensor *a, int axis, bool keepdim)
{
    return truth_extreme("kiln_all", a, axis, keepdim, true);
}

/* -- var, std --------------------------------------------------------------- */

/* The variance of x over reduced (keepdim) with its mean; the sum of
 * squared deviations over max(0, n - correction), as PyTorch divides. */
static kiln_tensor *variance(kiln_tensor *x, const bool *reduced, int64_t correction, bool keepdim,
                             kiln_tensor **mean)
{
    *mean = over(kiln_mean, x, reduced, true);
    kiln_tensor *centered = kiln_sub(x, *mean);
    kiln_tensor *squares = over(kiln_sum, kiln_mul(centered, centered), reduced, keepdim);
    double n = (double)reduced_count(x, reduced) - (double)correction;
    return kiln_div_scalar(squares, n > 0 ? n : 0);
}

static bool check_float(const char *fn, const kiln_tensor *a)
{
    if (!composite_check(fn, a, 0, false))
        return false;
    if (ir_dtype_is_float(a->dtype))
        return true;
    char buf[DESCRIBE_MAX];
    core_fail(CORE_DTYPE, fn, "%s is not floating point (cast it first)", describe(buf, a));
    return false;
}

static kiln_tensor *var_or_std(const char *fn, kiln_tensor *a, int axis, int64_t correction, bool keepdim,
                               bool root)
{
    bool reduced[KILN_MAX_DIMS];
    if (!check_float(fn, a) || eager_reduced_axes(fn, a, axis, reduced) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *mean, *var = variance(a, reduced, correction, keepdim, &mean);
    return composite_end(fn, root ? kiln_sqrt(var) : var);
}

kiln_tensor *kiln_var(kiln_tensor *a, int axis, int64_t correction, bool keepdim)
{
    return var_or_std("kiln_var", a, axis, correction, keepdim, false);
}

kiln_tensor *kiln_std(kiln_tensor *a, int axis, int64_t correction, bool keepdim)
{
    return var_or_std("kiln_std", a, axis, correction, keepdim, true);
}

int kiln_var_mean(kiln_tensor *a, int axis, int64_t correction, bool keepdim, kiln_tensor **var,
                  kiln_tensor **mean)
{
    const char *fn = "kiln_var_mean";
    if (!var || !mean)
        return core_fail_null_arg(fn, !var ? "var" : "mean");
    *var = *mean = NULL;
    bool reduced[KILN_MAX_DIMS];
    if (!check_float(fn, a) || eager_reduced_axes(fn, a, axis, reduced) < 0)
        return core_error_status();
    composite_begin();
    kiln_tensor *m, *v = variance(a, reduced, correction, keepdim, &m);
    int64_t shape[KILN_MAX_DIMS];
    int ndim = result_shape(a, reduced, keepdim, shape);
    m = v ? kiln_keep(kiln_reshape(m, ndim, shape)) : NULL; /* kept first: it outlives the scope too */
    if (!(*var = composite_end(fn, m ? v : NULL))) {
        kiln_release(m);
        return core_error_status();
    }
    *mean = m;
    return 0;
}

/* -- logsumexp ---------------------------------------------------------------- */

/* log(sum(exp(a - m))) + m for m the maximum, taken as 0 where it is
 * infinite (PyTorch's rule: a row of -inf gives -inf, one with +inf +inf).
 * Integers and bools give f32; an empty reduction gives -inf. */
kiln_tensor *kiln_logsumexp(kiln_tensor *a, int axis, bool keepdim)
{
    const char *fn = "kiln_logsumexp";
    bool reduced[KILN_MAX_DIMS];
    if (!composite_check(fn, a, 0, false) || eager_reduced_axes(fn, a, axis, reduced) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *x = composite_float(a), *r;
    if (reduced_count(a, reduced) == 0) {
        int64_t shape[KILN_MAX_DIMS];
        int ndim = result_shape(a, reduced, keepdim, shape);
        r = x ? eager_filled(fn, x->dtype, ndim, shape, -INFINITY, a->device) : NULL;
    } else {
        kiln_tensor *m = over(kiln_max, x, reduced, true);
        kiln_tensor *infinite = eager_scalar_op(OP_EQ, fn, kiln_abs(m), INFINITY, false);
        m = kiln_where(infinite, eager_filled(fn, KILN_BOOL, 0, NULL, 0, a->device), m);
        kiln_tensor *sum = over(kiln_sum, kiln_exp(kiln_sub(x, m)), reduced, keepdim);
        int64_t shape[KILN_MAX_DIMS];
        int ndim = result_shape(a, reduced, keepdim, shape);
        r = kiln_add(kiln_log(sum), kiln_reshape(m, ndim, shape));
    }
    return composite_end(fn, r);
}
