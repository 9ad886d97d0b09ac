/* Graph nodes run with the eager ops: the op table expanded into calls. */
#include "eager/internal.h"

typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);
typedef kiln_tensor *(*unary_fn)(kiln_tensor *);
typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, bool);

static const binary_fn binary_fns[OP__COUNT] = {
#define OP_BINARY(N, n, flags, rule) [OP_##N] = kiln_##n,
#define OP(N, n, arity, kind, flags, rule)
#include "ir/ops.def"
};

static const unary_fn unary_fns[OP__COUNT] = {
#define OP_UNARY(N, n, flags, rule) [OP_##N] = kiln_##n,
#define OP(N, n, arity, kind, flags, rule)
#include "ir/ops.def"
};

static const reduce_fn reduce_fns[OP__COUNT] = {
#define OP_REDUCE(N, n, flags, rule) [OP_##N] = kiln_##n,
#define OP(N, n, arity, kind, flags, rule)
#include "ir/ops.def"
};

/* The stop that makes kiln_slice take len elements from start by step. */
static int64_t slice_stop(const ir_node *n)
{
    int64_t len = n->shape[n->params.axis], start = n->params.start, step = n->params.step;
    /* One element: any stop one past start will do, and step may be huge. */
    int64_t stop = len == 0 ? start : len == 1 ? start + (step > 0 ? 1 : -1) : start + len * step;
    return stop < 0 ? INT64_MIN : stop; /* a negative stop would count from the end */
}

static kiln_tensor *dispatch_movement(const ir_node *n, kiln_tensor *const *in)
{
    switch (n->op) {
    case OP_RESHAPE: return kiln_reshape(in[0], n->ndim, n->shape);
    case OP_EXPAND: return kiln_expand(in[0], n->ndim, n->shape);
    case OP_PERMUTE: return kiln_permute(in[0], n->params.perm);
    case OP_SLICE: return kiln_slice(in[0], n->params.axis, n->params.start, slice_stop(n), n->params.step);
    case OP_CONCAT: return kiln_concat(in, (int)n->n_operands, n->params.axis);
    case OP_CONTIGUOUS: return kiln_contiguous(in[0]);
    default: break;
    }
    core_fail(CORE_STATE, "kiln_call", "op %s cannot run here", ir_ops[n->op].name);
    return NULL;
}

static kiln_tensor *dispatch(const ir_node *n, kiln_tensor *const *in)
{
    if (binary_fns[n->op])
        return binary_fns[n->op](in[0], in[1]);
    if (unary_fns[n->op])
        return unary_fns[n->op](in[0]);
    if (reduce_fns[n->op])
        return reduce_fns[n->op](in[0], n->params.axis, n->params.keepdim);
    switch (n->op) {
    case OP_WHERE: return kiln_where(in[0], in[1], in[2]);
    case OP_CAST: return kiln_cast(in[0], n->dtype);
    case OP_MATMUL: return kiln_matmul(in[0], in[1]);
    case OP_CONV2D: return eager_conv2d_node(n, in[0], in[1]);
    case OP_CUMSUM: return kiln_cumsum(in[0], n->params.axis);
    case OP_TOPK: return eager_topk_indices(n, in[0]);
    case OP_GATHER: return kiln_gather(in[0], n->params.axis, in[1]);
    case OP_INDEX_SELECT: return kiln_index_select(in[0], n->params.axis, in[1]);
    case OP_SCATTER_ADD: return kiln_scatter_add(in[0], n->params.axis, in[1], in[2]);
    default: return dispatch_movement(n, in);
    }
}

kiln_tensor *eager_dispatch(const ir_node *node, kiln_tensor *const *operands)
{
    kiln_no_grad_begin(); /* a graph's nodes run for their values only */
    kiln_tensor *t = dispatch(node, operands);
    kiln_no_grad_end();
    eager_disown(t);
    return t;
}

/* -- Constant folding ------------------------------------------------------ */

int eager_eval_const(const ir_node *node, const double *values, const kiln_dtype *dtypes, double *out)
{
    kiln_tensor *operands[3] = {NULL, NULL, NULL};
    int status = -1;
    kiln_scope_begin();
    for (uint32_t i = 0; i < node->n_operands; i++)
        if (!(operands[i] = kiln_full(dtypes[i], 0, NULL, values[i])))
            goto done;
    kiln_tensor *t = eager_dispatch(node, operands);
    if (!t)
        goto done;
    int64_t exact;
    *out = kiln_item(t);
    /* An i64 beyond 2^53 may have no exact double: leave such a node unfolded. */
    bool inexact = node->dtype == KILN_I64 && (kiln_copy_to_host(t, &exact, sizeof exact) < 0 ||
                                               exact > (INT64_C(1) << 53) || exact < -(INT64_C(1) << 53));
    status = inexact ? -1 : 0;
    kiln_release(t);
done:
    kiln_scope_end();
    kiln_clear_error();
    return status;
}
