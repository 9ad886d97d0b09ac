/* The verifier: a graph is well formed when its nodes are in topological
 * order, each op has its arity and parameters, and every node's dtype and
 * shape are what the op table's rules give for its operands. Passes must keep
 * all of this; debug builds verify after each one. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

typedef struct {
    const ir_graph *g;
    ir_ref r;
    char *err;
    size_t err_size;
    ir_sizes scratch; /* g's sizes, and the sums and products the checks make */
} checker;

static int bad(checker *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(checker *c, const char *fmt, ...)
{
    int n = snprintf(c->err, c->err_size, "node %%%u (%s): ", c->r,
                     c->r < c->g->count ? ir_ops[c->g->nodes[c->r].op].name : "?");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < c->err_size)
        vsnprintf(c->err + n, c->err_size - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static const ir_node *operand(const checker *c, int i)
{
    const ir_node *n = &c->g->nodes[c->r];
    return &c->g->nodes[ir_operands(c->g, n)[i]];
}

static bool same_shape(int ndim, const int64_t *shape, const ir_node *n)
{
    return ndim == n->ndim && !memcmp(shape, n->shape, (size_t)ndim * sizeof *shape);
}

/* numpy broadcasting of the node's operands; false when they do not broadcast. */
static bool broadcast(const checker *c, int first, int count, int *ndim, int64_t *shape)
{
    *ndim = 0;
    for (int i = first; i < first + count; i++)
        *ndim = operand(c, i)->ndim > *ndim ? operand(c, i)->ndim : *ndim;
    for (int d = 0; d < *ndim; d++) {
        shape[d] = 1;
        for (int i = first; i < first + count; i++) {
            const ir_node *o = operand(c, i);
            int k = d - (*ndim - o->ndim);
            if (k < 0 || o->shape[k] == 1)
                continue;
            if (shape[d] != 1 && shape[d] != o->shape[k])
                return false;
            shape[d] = o->shape[k];
        }
    }
    return true;
}

static ir_rank_class rank_class(const ir_node *n)
{
    return n->op == OP_CONST && n->params.scalar ? IR_SCALAR : n->ndim == 0 ? IR_ZERO_DIM : IR_DIMS;
}

static kiln_dtype promote2(const ir_node *a, const ir_node *b)
{
    return ir_promote(a->dtype, rank_class(a), b->dtype, rank_class(b));
}

static int check_elementwise(checker *c, const ir_node *n)
{
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    if (!broadcast(c, 0, (int)n->n_operands, &ndim, shape) || !same_shape(ndim, shape, n))
        return bad(c, "shape is not the broadcast of the operands");
    int want;
    if (n->op == OP_CAST)
        return 0;
    if (n->op == OP_WHERE) {
        if (operand(c, 0)->dtype != KILN_BOOL)
            return bad(c, "cond is not bool");
        want = promote2(operand(c, 1), operand(c, 2));
    } else if (n->n_operands == 2) {
        want = ir_result_dtype(ir_ops[n->op].rule, promote2(operand(c, 0), operand(c, 1)));
    } else {
        want = ir_result_dtype(ir_ops[n->op].rule, operand(c, 0)->dtype);
    }
    return want == (int)n->dtype ? 0 : bad(c, "dtype disagrees with the op's rule");
}

static int check_reduction(checker *c, const ir_node *n)
{
    const ir_node *a = operand(c, 0);
    int axis = n->params.axis;
    if (axis != KILN_ALL && (axis < 0 || axis >= a->ndim))
        return bad(c, "axis %d out of range", axis);
    int ndim = 0;
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) {
        bool reduced = axis == KILN_ALL || d == axis;
        if (!reduced || n->params.keepdim)
            shape[ndim++] = reduced ? 1 : a->shape[d];
    }
    if (!same_shape(ndim, shape, n))
        return bad(c, "shape is not the operand's with the axis reduced");
    return ir_result_dtype(ir_ops[n->op].rule, a->dtype) == (int)n->dtype
               ? 0 : bad(c, "dtype disagrees with the op's rule");
}

static int check_permute(checker *c, const ir_node *n, const ir_node *a)
{
    bool used[KILN_MAX_DIMS] = {false};
    for (int d = 0; d < n->ndim; d++) {
        int p = n->params.perm[d];
        if (p < 0 || p >= a->ndim || used[p] || n->shape[d] != a->shape[p])
            return bad(c, "bad permutation");
        used[p] = true;
    }
    return 0;
}

static int check_slice(checker *c, const ir_node *n, const ir_node *a)
{
    int axis = n->params.axis;
    if (axis < 0 || axis >= a->ndim)
        return bad(c, "axis %d out of range", axis);
    int64_t len = n->shape[axis], size = a->shape[axis], start = n->params.start, step = n->params.step;
    if (size < 0 && (len != size || start != 0 || step != 1))
        return bad(c, "a symbolic axis is sliced other than whole");
    if (step == 0)
        return bad(c, "bad step");
    int64_t reach = step > 0 ? size - 1 - start : start; /* room along the step's direction */
    uint64_t magnitude = step > 0 ? (uint64_t)step : 0 - (uint64_t)step; /* INT64_MIN's too */
    if (size >= 0 && len > 0 && (start < 0 || start >= size || (uint64_t)(len - 1) > (uint64_t)reach / magnitude))
        return bad(c, "slice leaves the axis");
    for (int d = 0; d < a->ndim; d++)
        if (d != axis && n->shape[d] != a->shape[d])
            return bad(c, "slice changes another axis");
    return 0;
}

static int check_concat(checker *c, const ir_node *n)
{
    int axis = n->params.axis;
    const ir_node *a = operand(c, 0);
    if (axis < 0 || axis >= a->ndim || n->ndim != a->ndim)
        return bad(c, "axis %d out of range, or rank changed", axis);
    int64_t total = 0;
    kiln_dtype dt = a->dtype;
    for (uint32_t i = 0; i < n->n_operands; i++) {
        const ir_node *o = operand(c, (int)i);
        if (o->ndim != a->ndim)
            return bad(c, "operands differ in rank");
        for (int d = 0; d < a->ndim; d++)
            if (d != axis && o->shape[d] != n->shape[d])
                return bad(c, "operands differ off the axis");
        total = ir_size_add(&c->scratch, total, o->shape[axis]);
        if (total == IR_SIZE_NONE || (total >= 0 && n->shape[axis] >= 0 && total > n->shape[axis]))
            return bad(c, "shape or dtype is not the operands' join");
        dt = ir_promote(dt, IR_DIMS, o->dtype, IR_DIMS);
    }
    if (total != n->shape[axis] || dt != n->dtype)
        return bad(c, "shape or dtype is not the operands' join");
    return 0;
}

static int check_movement(checker *c, const ir_node *n)
{
    const ir_node *a = operand(c, 0);
    if (n->op != OP_CONCAT && n->dtype != a->dtype)
        return bad(c, "movement changed the dtype");
    switch (n->op) {
    case OP_RESHAPE:
        return ir_shape_product(&c->scratch, n->ndim, n->shape) == ir_shape_product(&c->scratch, a->ndim, a->shape)
                   ? 0 : bad(c, "reshape changes the element count");
    case OP_CONTIGUOUS:
        return same_shape(a->ndim, a->shape, n) ? 0 : bad(c, "contiguous changes the shape");
    case OP_PERMUTE:
        return n->ndim == a->ndim ? check_permute(c, n, a) : bad(c, "permute changes the rank");
    case OP_EXPAND:
        for (int d = 0; d < n->ndim; d++) {
            int k = d - (n->ndim - a->ndim);
            if (k >= 0 && a->shape[k] != 1 && a->shape[k] != n->shape[d])
                return bad(c, "expand does not broadcast");
        }
        return n->ndim >= a->ndim ? 0 : bad(c, "expand drops dimensions");
    case OP_SLICE:
        return n->ndim == a->ndim ? check_slice(c, n, a) : bad(c, "slice changes the rank");
    default:
        return check_concat(c, n);
    }
}

/* cumsum keeps its operand's shape; topk's axis has k of the operand's. */
static int check_line(checker *c, const ir_node *n)
{
    const ir_node *a = operand(c, 0);
    int axis = n->params.axis;
    if (axis < 0 || axis >= a->ndim || n->ndim != a->ndim)
        return bad(c, "axis %d out of range, or rank changed", axis);
    for (int d = 0; d < a->ndim; d++)
        if (d != axis && n->shape[d] != a->shape[d])
            return bad(c, "shape differs off the axis");
    if (n->op == OP_TOPK && (n->params.index != n->shape[axis] || n->params.index > a->shape[axis]))
        return bad(c, "k is not the axis's size, or more than the operand's");
    if (n->op == OP_CUMSUM && n->shape[axis] != a->shape[axis])
        return bad(c, "cumsum changes the axis");
    return ir_result_dtype(ir_ops[n->op].rule, a->dtype) == (int)n->dtype ? 0 : bad(c, "dtype disagrees");
}

/* The result has a's dtype; gather the index's shape, index_select a's
 * with the index's length on the axis, scatter_add a's. */
static int check_index(checker *c, const ir_node *n)
{
    const ir_node *a = operand(c, 0), *index = operand(c, 1);
    int axis = n->params.axis;
    if (a->ndim == 0 ? axis != 0 : axis < 0 || axis >= a->ndim)
        return bad(c, "axis %d out of range", axis);
    if (index->dtype != KILN_I32 && index->dtype != KILN_I64)
        return bad(c, "indices are not i32 or i64");
    if (n->dtype != a->dtype)
        return bad(c, "dtype is not the operand's");
    if (n->op == OP_GATHER)
        return same_shape(index->ndim, index->shape, n) ? 0 : bad(c, "shape is not the index's");
    if (n->op == OP_SCATTER_ADD)
        return same_shape(a->ndim, a->shape, n) && operand(c, 2)->dtype == a->dtype
                   ? 0 : bad(c, "shape or src's dtype is not the operand's");
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++)
        shape[d] = d == axis ? index->shape[0] : a->shape[d];
    return index->ndim == 1 && same_shape(a->ndim, shape, n) ? 0 : bad(c, "shape is not the selection's");
}

static int check_matmul(checker *c, const ir_node *n)
{
    const ir_node *a = operand(c, 0), *b = operand(c, 1);
    if (a->ndim == 0 || b->ndim == 0)
        return bad(c, "0-d operand");
    int64_t k1 = a->shape[a->ndim - 1], k2 = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
    if (k1 != k2)
        return bad(c, "inner dimensions differ");
    int na = a->ndim > 2 ? a->ndim - 2 : 0, nb = b->ndim > 2 ? b->ndim - 2 : 0;
    int batch = na > nb ? na : nb, ndim = 0;
    int64_t shape[KILN_MAX_DIMS + 2];
    for (int d = 0; d < batch; d++) {
        int ka = d - (batch - na), kb = d - (batch - nb);
        int64_t sa = ka < 0 ? 1 : a->shape[ka], sb = kb < 0 ? 1 : b->shape[kb];
        if (sa != sb && sa != 1 && sb != 1)
            return bad(c, "batch dimensions do not broadcast");
        shape[ndim++] = sa == 1 ? sb : sa;
    }
    if (a->ndim > 1)
        shape[ndim++] = a->shape[a->ndim - 2];
    if (b->ndim > 1)
        shape[ndim++] = b->shape[b->ndim - 1];
    if (ndim > KILN_MAX_DIMS || !same_shape(ndim, shape, n))
        return bad(c, "shape is not the product's");
    kiln_dtype dt = ir_promote(a->dtype, IR_DIMS, b->dtype, IR_DIMS);
    return ir_result_dtype(RULE_MATMUL, dt) == (int)n->dtype ? 0 : bad(c, "dtype disagrees");
}

/* x [N, C, H, W] and w [O, C / groups, KH, KW] of the node's dtype, into
 * [N, O, OH, OW] by its window (ir_conv_extent; sizes other than N
 * concrete). */
static int check_conv(checker *c, const ir_node *n)
{
    const ir_node *x = operand(c, 0), *w = operand(c, 1);
    const int32_t *p = n->params.perm;
    if (x->ndim != 4 || w->ndim != 4 || n->ndim != 4 || x->dtype != n->dtype || w->dtype != n->dtype ||
        !ir_dtype_is_float(n->dtype))
        return bad(c, "a convolution takes [N,C,H,W] and [O,C/groups,KH,KW] floats of its dtype");
    if (p[IR_CONV_GROUPS] < 1 || p[IR_CONV_STRIDE] < 1 || p[IR_CONV_STRIDE + 1] < 1 || p[IR_CONV_DILATION] < 1 ||
        p[IR_CONV_DILATION + 1] < 1 || p[IR_CONV_PADDING] < 0 || p[IR_CONV_PADDING + 1] < 0)
        return bad(c, "bad convolution window");
    for (int d = 1; d < 4; d++)
        if (x->shape[d] < 0 || w->shape[d] < 0)
            return bad(c, "a convolution's sizes but the batch are concrete");
    int64_t g = p[IR_CONV_GROUPS], shape[4] = {x->shape[0], w->shape[0], 0, 0};
    if (w->shape[0] < 0 || w->shape[0] % g || w->shape[1] * g != x->shape[1])
        return bad(c, "channels do not match the groups");
    for (int d = 0; d < 2; d++)
        shape[2 + d] = ir_conv_extent(x->shape[2 + d], w->shape[2 + d], p[IR_CONV_STRIDE + d], p[IR_CONV_PADDING + d],
                                      p[IR_CONV_DILATION + d]);
    return same_shape(4, shape, n) ? 0 : bad(c, "shape is not the convolution's");
}

/* The parameters op reads; the others must be zero, so that equal nodes
 * print equal text. */
static ir_params used_params(const ir_node *n)
{
    ir_params used = {0};
    const ir_params *p = &n->params;
    switch (ir_ops[n->op].kind) {
    case KIND_SOURCE:
        used.index = n->op == OP_CONST ? 0 : p->index;
        used.value = n->op == OP_CONST ? p->value : 0;
        used.scalar = n->op == OP_CONST ? p->scalar : 0;
        return used;
    case KIND_REDUCTION:
        used.axis = p->axis;
        used.keepdim = p->keepdim;
        return used;
    case KIND_LINE:
    case KIND_INDEX:
        used.axis = p->axis;
        used.index = n->op == OP_TOPK ? p->index : 0;
        used.keepdim = n->op == OP_TOPK ? p->keepdim : 0;
        return used;
    default:
        break;
    }
    if (n->op == OP_SLICE || n->op == OP_CONCAT)
        used.axis = p->axis;
    if (n->op == OP_SLICE) {
        used.start = p->start;
        used.step = p->step;
    }
    if (n->op == OP_PERMUTE)
        memcpy(used.perm, p->perm, (size_t)n->ndim * sizeof *p->perm);
    if (n->op == OP_CONV2D)
        memcpy(used.perm, p->perm, IR_CONV_PARAMS * sizeof *p->perm);
    return used;
}

static int check_node(checker *c)
{
    const ir_node *n = &c->g->nodes[c->r];
    if ((unsigned)n->op >= OP__COUNT || (unsigned)n->dtype > KILN_BOOL || n->ndim < 0 ||
        n->ndim > KILN_MAX_DIMS)
        return bad(c, "bad op, dtype or rank");
    ir_poly p;
    int64_t numel, concrete[KILN_MAX_DIMS];
    for (int d = 0; d < n->ndim; d++) {
        if (!ir_size_poly(&c->g->sizes, n->shape[d], &p) || (n->shape[d] < 0 && !ir_size_symbols(&c->g->sizes, n->shape[d])))
            return bad(c, "negative size");
        concrete[d] = n->shape[d] < 0 ? 2 : n->shape[d]; /* symbols are 2 or more */
    }
    if (!ir_shape_numel(n->ndim, concrete, &numel))
        return bad(c, "too many elements");
    ir_params used = used_params(n);
    if (memcmp(&used, &n->params, sizeof used))
        return bad(c, "a parameter the op does not use is set");
    int arity = ir_ops[n->op].arity;
    if (arity >= 0 ? n->n_operands != (uint32_t)arity : n->n_operands == 0)
        return bad(c, "%u operands", n->n_operands);
    for (uint32_t i = 0; i < n->n_operands; i++)
        if (ir_operands(c->g, n)[i] >= c->r)
            return bad(c, "operand %%%u does not come before its user", ir_operands(c->g, n)[i]);
    switch (ir_ops[n->op].kind) {
    case KIND_SOURCE:
        if (n->op == OP_CONST && n->ndim != 0)
            return bad(c, "a constant must be 0-d");
        if (ir_ops[n->op].flags & FLAG_RANDOM)
            return n->dtype == KILN_F32 ? 0 : bad(c, "random values are f32");
        return n->params.index >= 0 ? 0 : bad(c, "negative index");
    case KIND_ELEMENTWISE: return check_elementwise(c, n);
    case KIND_REDUCTION: return check_reduction(c, n);
    case KIND_MOVEMENT: return check_movement(c, n);
    case KIND_MATMUL: return n->op == OP_CONV2D ? check_conv(c, n) : check_matmul(c, n);
    case KIND_LINE: return check_line(c, n);
    case KIND_INDEX: return check_index(c, n);
    case KIND_ASSIGN: return bad(c, "assign is not a graph node (writebacks are)");
    }
    return 0;
}

int ir_verify(const ir_graph *g, char *err, size_t err_size)
{
    checker c = {g, 0, err, err_size, {0}};
    if (ir_sizes_copy(&c.scratch, &g->sizes) < 0)
        return snprintf(err, err_size, "out of memory verifying"), -1;
    for (c.r = 0; c.r < g->count; c.r++) {
        if (check_node(&c) < 0) {
            ir_sizes_free(&c.scratch);
            return -1;
        }
    }
    ir_sizes_free(&c.scratch);
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] >= g->count)
            return snprintf(err, err_size, "output %d names no node", i), -1;
    for (int i = 0; i < g->n_writebacks; i++)
        if (g->writebacks[i].value >= g->count)
            return snprintf(err, err_size, "writeback %d names no node", i), -1;
    return 0;
}
