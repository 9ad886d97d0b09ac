/* The gradient of each op, once, written with kiln ops (so that backward
 * passes trace and fuse), in one table keyed by op: adding an op's gradient
 * is one rule and one row. Formulas follow PyTorch's derivatives.yaml,
 * including its choices at kinks (abs and relu at 0 give 0, ties of
 * maximum/minimum split the gradient, max/min share it among equal maxima). */
#include <math.h>
#include <string.h>

#include "eager/grad.h"

#define A(n) ((n)->in[0].saved)
#define B(n) ((n)->in[1].saved)

/* 0 when every operand that needs a gradient got one (the ops set the error otherwise). */
static int done(const grad_node *n, kiln_tensor **gin)
{
    for (int i = 0; i < n->n_in; i++)
        if (grad_needed(n, i) && !gin[i])
            return -1;
    return 0;
}

/* cond ? g : 0, or cond ? 0 : g. */
static kiln_tensor *masked(kiln_tensor *cond, kiln_tensor *g, bool keep_where_true)
{
    kiln_tensor *zero = grad_scalar(0);
    return keep_where_true ? kiln_where(cond, g, zero) : kiln_where(cond, zero, g);
}

/* -- Elementwise ------------------------------------------------------------ */

static int add_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    (void)n;
    gin[0] = gin[1] = g;
    return 0;
}

static int sub_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = g;
    if (grad_needed(n, 1))
        gin[1] = kiln_neg(g);
    return done(n, gin);
}

static int mul_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    if (grad_needed(n, 0))
        gin[0] = kiln_mul(g, B(n));
    if (grad_needed(n, 1))
        gin[1] = kiln_mul(g, A(n));
    return done(n, gin);
}

static int div_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    if (grad_needed(n, 0))
        gin[0] = kiln_div(g, B(n));
    if (grad_needed(n, 1))
        gin[1] = kiln_neg(kiln_div(kiln_mul(g, n->out), B(n)));
    return done(n, gin);
}

static int pow_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *a = A(n), *b = B(n);
    if (grad_needed(n, 0)) { /* b a^(b-1), 0 where b == 0 */
        kiln_tensor *d = kiln_mul(b, kiln_pow(a, kiln_sub_scalar(b, 1)));
        gin[0] = masked(kiln_eq(b, grad_scalar(0)), kiln_mul(g, d), false);
    }
    if (grad_needed(n, 1)) { /* a^b log a, 0 where a == 0 and b >= 0 */
        kiln_tensor *zero = grad_scalar(0);
        kiln_tensor *flat = kiln_mul(kiln_eq(a, zero), kiln_ge(b, zero));
        gin[1] = masked(flat, kiln_mul(g, kiln_mul(n->out, kiln_log(a))), false);
    }
    return done(n, gin);
}

/* maximum (sign 1) and minimum (-1): to the operand that won, halved on ties. */
static int extremum_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin, bool maximum)
{
    kiln_tensor *a = A(n), *b = B(n);
    kiln_tensor *shared = kiln_where(kiln_eq(a, b), kiln_mul_scalar(g, 0.5), g);
    if (grad_needed(n, 0))
        gin[0] = masked(maximum ? kiln_lt(a, b) : kiln_gt(a, b), shared, false);
    if (grad_needed(n, 1))
        gin[1] = masked(maximum ? kiln_gt(a, b) : kiln_lt(a, b), shared, false);
    return done(n, gin);
}

static int maximum_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    return extremum_grad(n, g, gin, true);
}

static int minimum_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    return extremum_grad(n, g, gin, false);
}

static int where_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    if (grad_needed(n, 1))
        gin[1] = masked(A(n), g, true);
    if (grad_needed(n, 2))
        gin[2] = masked(A(n), g, false);
    return done(n, gin);
}

static int neg_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_neg(g);
    return done(n, gin);
}

static int abs_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *zero = grad_scalar(0);
    kiln_tensor *sign = kiln_sub(kiln_cast(kiln_gt(A(n), zero), g->dtype), kiln_cast(kiln_lt(A(n), zero), g->dtype));
    gin[0] = kiln_mul(g, sign);
    return done(n, gin);
}

static int exp_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_mul(g, n->out);
    return done(n, gin);
}

static int log_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_div(g, A(n));
    return done(n, gin);
}

static int sqrt_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_div(g, kiln_mul_scalar(n->out, 2));
    return done(n, gin);
}

static int rsqrt_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *cube = kiln_mul(kiln_mul(n->out, n->out), n->out);
    gin[0] = kiln_mul(g, kiln_mul_scalar(cube, -0.5));
    return done(n, gin);
}

static int tanh_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *slope = kiln_add_scalar(kiln_neg(kiln_mul(n->out, n->out)), 1);
    gin[0] = kiln_mul(g, slope);
    return done(n, gin);
}

static int sigmoid_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *slope = kiln_mul(n->out, kiln_add_scalar(kiln_neg(n->out), 1));
    gin[0] = kiln_mul(g, slope);
    return done(n, gin);
}

static int relu_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = masked(kiln_gt(A(n), grad_scalar(0)), g, true);
    return done(n, gin);
}

static int sin_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_mul(g, kiln_cos(A(n)));
    return done(n, gin);
}

static int cos_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_mul(g, kiln_neg(kiln_sin(A(n))));
    return done(n, gin);
}

static int erf_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *bell = kiln_exp(kiln_neg(kiln_mul(A(n), A(n))));
    gin[0] = kiln_mul(g, kiln_mul_scalar(bell, 2 / sqrt(M_PI)));
    return done(n, gin);
}

/* floor, ceil, round, trunc, floor_divide: zero almost everywhere. */
static int no_flow(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    (void)n, (void)g, (void)gin;
    return 0;
}

static int log1p_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_div(g, kiln_add_scalar(A(n), 1));
    return done(n, gin);
}

static int expm1_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_mul(g, kiln_add_scalar(n->out, 1));
    return done(n, gin);
}

static int log2_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_div(g, kiln_mul_scalar(A(n), M_LN2));
    return done(n, gin);
}

static int tan_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_mul(g, kiln_add_scalar(kiln_mul(n->out, n->out), 1));
    return done(n, gin);
}

static int atan_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_div(g, kiln_add_scalar(kiln_mul(A(n), A(n)), 1));
    return done(n, gin);
}

static int remainder_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = g;
    if (grad_needed(n, 1))
        gin[1] = kiln_neg(kiln_mul(g, kiln_floor_divide(A(n), B(n))));
    return done(n, gin);
}

static int atan2_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *a = A(n), *b = B(n);
    kiln_tensor *r2 = kiln_add(kiln_mul(a, a), kiln_mul(b, b));
    if (grad_needed(n, 0))
        gin[0] = kiln_mul(g, kiln_div(b, r2));
    if (grad_needed(n, 1))
        gin[1] = kiln_mul(g, kiln_div(kiln_neg(a), r2));
    return done(n, gin);
}

/* cast, contiguous, expand: the engine converts and sums to the operand. */
static int identity_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    (void)n;
    gin[0] = g;
    return 0;
}

/* -- Reductions ------------------------------------------------------------- */

/* g, a reduction's gradient, broadcast back over the reduced operand. */
static kiln_tensor *unreduced(const grad_node *n, kiln_tensor *g)
{
    const grad_input *in = &n->in[0];
    if (n->params.axis == KILN_ALL) {
        int64_t ones[KILN_MAX_DIMS];
        for (int d = 0; d < in->ndim; d++)
            ones[d] = 1;
        g = kiln_reshape(g, in->ndim, ones);
    } else if (!n->params.keepdim) {
        g = kiln_unsqueeze(g, n->params.axis);
    }
    return g ? kiln_expand(g, in->ndim, in->shape) : NULL;
}

static int sum_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = unreduced(n, g);
    return done(n, gin);
}

static int mean_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    const grad_input *in = &n->in[0];
    double count = 1;
    for (int d = 0; d < in->ndim; d++)
        if (n->params.axis == KILN_ALL || d == n->params.axis)
            count *= (double)in->shape[d];
    gin[0] = unreduced(n, kiln_div_scalar(g, count));
    return done(n, gin);
}

/* max, min: shared among the elements equal to the result. */
static int extreme_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *hit = kiln_cast(kiln_eq(A(n), unreduced(n, n->out)), g->dtype);
    int axis = n->params.axis;
    kiln_tensor *count = hit ? kiln_sum(hit, axis, n->params.keepdim) : NULL;
    gin[0] = kiln_mul(hit, unreduced(n, kiln_div(g, count)));
    return done(n, gin);
}

/* prod: the product of the other elements of x's slice, as PyTorch's
 * prod_backward gives it: out / x in a slice without zeros; in a slice with
 * one zero, the product of the rest at the zero and 0 elsewhere; 0 in a
 * slice with more. Written without branches on the values, so it traces. */
static int prod_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *x = A(n), *zero = grad_scalar(0);
    int axis = n->params.axis;
    bool keepdim = n->params.keepdim;
    kiln_tensor *is_zero = kiln_eq(x, zero);
    kiln_tensor *zeros = kiln_sum(is_zero, axis, keepdim);
    kiln_tensor *rest = kiln_prod(kiln_where(is_zero, grad_scalar(1), x), axis, keepdim);
    kiln_tensor *lone_zero = kiln_logical_and(is_zero, unreduced(n, kiln_eq(zeros, grad_scalar(1))));
    kiln_tensor *with_zeros = kiln_where(lone_zero, unreduced(n, rest), zero);
    kiln_tensor *others = kiln_where(unreduced(n, kiln_eq(zeros, zero)), kiln_div(unreduced(n, n->out), x), with_zeros);
    gin[0] = kiln_mul(unreduced(n, g), others);
    return done(n, gin);
}

/* -- Movement --------------------------------------------------------------- */

static int reshape_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_reshape(g, n->in[0].ndim, n->in[0].shape);
    return done(n, gin);
}

static int permute_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int inverse[KILN_MAX_DIMS];
    for (int d = 0; d < n->in[0].ndim; d++)
        inverse[n->params.perm[d]] = d;
    gin[0] = kiln_permute(g, inverse);
    return done(n, gin);
}

/* g with count - 1 zeros after each element along axis (its last element
 * keeps none): a step-count slice's gradient before padding. */
static kiln_tensor *spread(kiln_tensor *g, int axis, int64_t count)
{
    int64_t shape[KILN_MAX_DIMS + 1];
    memcpy(shape, g->shape, (size_t)(axis + 1) * sizeof *shape);
    shape[axis + 1] = count - 1;
    memcpy(shape + axis + 2, g->shape + axis + 1, (size_t)(g->ndim - axis - 1) * sizeof *shape);
    kiln_tensor *parts[2] = {kiln_unsqueeze(g, axis + 1), grad_full(g, g->ndim + 1, shape, 0)};
    kiln_tensor *woven = kiln_concat(parts, 2, axis + 1);
    memcpy(shape, g->shape, (size_t)g->ndim * sizeof *shape);
    int64_t len = g->shape[axis];
    shape[axis] = len * count;
    woven = woven ? kiln_reshape(woven, g->ndim, shape) : NULL;
    return woven ? kiln_slice(woven, axis, 0, (len - 1) * count + 1, 1) : NULL;
}

/* g between before and after zeros along axis. */
static kiln_tensor *padded(kiln_tensor *g, int axis, int64_t before, int64_t after)
{
    kiln_tensor *parts[3];
    int n = 0;
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, g->shape, (size_t)g->ndim * sizeof *shape);
    if (before > 0) {
        shape[axis] = before;
        parts[n++] = grad_full(g, g->ndim, shape, 0);
    }
    parts[n++] = g;
    if (after > 0) {
        shape[axis] = after;
        parts[n++] = grad_full(g, g->ndim, shape, 0);
    }
    return n == 1 ? g : kiln_concat(parts, n, axis);
}

static int slice_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    const grad_input *in = &n->in[0];
    int axis = n->params.axis;
    int64_t len = g->shape[axis], start = n->params.start, step = n->params.step;
    if (len == 0) {
        gin[0] = grad_full(g, in->ndim, in->shape, 0);
        return done(n, gin);
    }
    if (step < 0) { /* the same elements walked forward */
        g = kiln_slice(g, axis, len - 1, INT64_MIN, -1);
        start += (len - 1) * step;
        step = -step;
    }
    if (g && step > 1 && len > 1)
        g = spread(g, axis, step);
    gin[0] = g ? padded(g, axis, start, in->shape[axis] - start - g->shape[axis]) : NULL;
    return done(n, gin);
}

static int concat_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int axis = n->params.axis;
    int64_t at = 0;
    for (int i = 0; i < n->n_in; i++) {
        int64_t len = n->in[i].shape[axis];
        if (grad_needed(n, i))
            gin[i] = kiln_slice(g, axis, at, at + len, 1);
        at += len;
    }
    return done(n, gin);
}

/* The running sums of g taken from the end: g reversed, summed, reversed. */
static int cumsum_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int axis = n->params.axis;
    int64_t len = g->shape[axis];
    kiln_tensor *back = kiln_slice(g, axis, len - 1, INT64_MIN, -1);
    back = back ? kiln_cumsum(back, axis) : NULL;
    gin[0] = back ? kiln_slice(back, axis, len - 1, INT64_MIN, -1) : NULL;
    return done(n, gin);
}

/* gather, index_select: g added back where each element came from. */
static int gather_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    const grad_input *a = &n->in[0];
    gin[0] = kiln_scatter_add(grad_full(g, a->ndim, a->shape, 0), n->params.axis, B(n), g);
    return done(n, gin);
}

static int index_select_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    const grad_input *a = &n->in[0];
    int axis = n->params.axis;
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < g->ndim; d++)
        shape[d] = d == axis ? g->shape[d] : 1;
    kiln_tensor *index = kiln_expand(kiln_reshape(B(n), g->ndim, shape), g->ndim, g->shape);
    gin[0] = kiln_scatter_add(grad_full(g, a->ndim, a->shape, 0), axis, index, g);
    return done(n, gin);
}

/* a: g; src: g at the index positions, zero past the index's extent. */
static int scatter_add_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = g;
    if (!grad_needed(n, 2))
        return done(n, gin);
    const grad_input *src = &n->in[2];
    kiln_tensor *picked = kiln_gather(g, n->params.axis, B(n));
    for (int d = 0; picked && d < src->ndim; d++)
        picked = padded(picked, d, 0, src->shape[d] - picked->shape[d]);
    gin[2] = picked;
    return done(n, gin);
}

/* -- Matmul ----------------------------------------------------------------- *
 * A 1-d operand is a row (a) or a column (b) whose axis the result lacks:
 * the gradients are those of the 2-d product, that axis squeezed again. */

/* The gradient of a matrix b broadcast over a's batch: the batch folded
 * into the rows, aᵀ @ g as one product with the batch in its inner
 * dimension, instead of a product per batch element summed after (which
 * wrote [batch, k, n] and read it back: train_gpt's logits weight took
 * 100 MB and an eager sum). */
static kiln_tensor *folded_weight_grad(kiln_tensor *a, kiln_tensor *g)
{
    int64_t m = 1; /* not -1: a batch of 0 would leave it undetermined */
    for (int d = 0; d + 1 < a->ndim; d++)
        m *= a->shape[d];
    kiln_tensor *rows = kiln_reshape(a, 2, (int64_t[]){m, a->shape[a->ndim - 1]});
    return kiln_matmul(kiln_transpose(rows, 0, 1), kiln_reshape(g, 2, (int64_t[]){m, g->shape[g->ndim - 1]}));
}

static int matmul_grad(const grad_node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *a = A(n), *b = B(n);
    bool row = a->ndim == 1, column = b->ndim == 1;
    kiln_tensor *a2 = row ? kiln_unsqueeze(a, 0) : a;
    kiln_tensor *b2 = column ? kiln_unsqueeze(b, 1) : b;
    kiln_tensor *g2 = g;
    if (row && column)
        g2 = kiln_reshape(g, 2, (int64_t[]){1, 1});
    else if (row)
        g2 = kiln_unsqueeze(g, -2);
    else if (column)
        g2 = kiln_unsqueeze(g, -1);
    if (grad_needed(n, 0)) {
        gin[0] = kiln_matmul(g2, kiln_transpose(b2, -1, -2));
        gin[0] = row && gin[0] ? kiln_squeeze(gin[0], -2) : gin[0];
    }
    if (grad_needed(n, 1)) {
        gin[1] = b2->ndim == 2 && a2->ndim > 2 ? folded_weight_grad(a2, g2)
                                               : kiln_matmul(kiln_transpose(a2, -1, -2), g2);
        gin[1] = column && gin[1] ? kiln_squeeze(gin[1], -1) : gin[1];
    }
    return done(n, gin);
}

/* -- The table --------------------------------------------------------------- */

#define IN0 GRAD_SAVE_IN(0)
#define IN1 GRAD_SAVE_IN(1)
#define OUT GRAD_SAVE_OUT

const grad_rule grad_rules[OP__COUNT] = {
    [OP_ADD] = {add_grad, 0},
    [OP_SUB] = {sub_grad, 0},
    [OP_MUL] = {mul_grad, IN0 | IN1},
    [OP_DIV] = {div_grad, IN1 | OUT},
    [OP_POW] = {pow_grad, IN0 | IN1 | OUT},
    [OP_MAXIMUM] = {maximum_grad, IN0 | IN1},
    [OP_MINIMUM] = {minimum_grad, IN0 | IN1},
    [OP_WHERE] = {where_grad, IN0},
    [OP_NEG] = {neg_grad, 0},
    [OP_ABS] = {abs_grad, IN0},
    [OP_EXP] = {exp_grad, OUT},
    [OP_LOG] = {log_grad, IN0},
    [OP_SQRT] = {sqrt_grad, OUT},
    [OP_RSQRT] = {rsqrt_grad, OUT},
    [OP_TANH] = {tanh_grad, OUT},
    [OP_SIGMOID] = {sigmoid_grad, OUT},
    [OP_RELU] = {relu_grad, IN0},
    [OP_SIN] = {sin_grad, IN0},
    [OP_COS] = {cos_grad, IN0},
    [OP_ERF] = {erf_grad, IN0},
    [OP_CAST] = {identity_grad, 0},
    [OP_SUM] = {sum_grad, 0},
    [OP_MEAN] = {mean_grad, 0},
    [OP_MAX] = {extreme_grad, IN0 | OUT},
    [OP_MIN] = {extreme_grad, IN0 | OUT},
    [OP_RESHAPE] = {reshape_grad, 0},
    [OP_PERMUTE] = {permute_grad, 0},
    [OP_EXPAND] = {identity_grad, 0},
    [OP_SLICE] = {slice_grad, 0},
    [OP_CONCAT] = {concat_grad, 0},
    [OP_CONTIGUOUS] = {identity_grad, 0},
    [OP_MATMUL] = {matmul_grad, IN0 | IN1},
    [OP_REMAINDER] = {remainder_grad, IN0 | IN1},
    [OP_FLOOR_DIVIDE] = {no_flow, 0},
    [OP_ATAN2] = {atan2_grad, IN0 | IN1},
    [OP_FLOOR] = {no_flow, 0},
    [OP_CEIL] = {no_flow, 0},
    [OP_ROUND] = {no_flow, 0},
    [OP_TRUNC] = {no_flow, 0},
    [OP_LOG1P] = {log1p_grad, IN0},
    [OP_EXPM1] = {expm1_grad, OUT},
    [OP_LOG2] = {log2_grad, IN0},
    [OP_TAN] = {tan_grad, OUT},
    [OP_ATAN] = {atan_grad, IN0},
    [OP_CUMSUM] = {cumsum_grad, 0},
    [OP_GATHER] = {gather_grad, IN1},
    [OP_INDEX_SELECT] = {index_select_grad, IN1},
    [OP_SCATTER_ADD] = {scatter_add_grad, IN1},
    [OP_PROD] = {prod_grad, IN0 | OUT},
};
