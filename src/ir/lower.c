/* Lowering: a graph split into fusion groups, each one kernel of the kernel IR.
 *
 * A node is materialized (gets a buffer) when it is a source, an output or a
 * writeback, when an op the kernels do not cover needs it (matmul, concat,
 * argmax, reductions over other axes than the last), or when
 * fusing it failed. Every other node is computed inside the kernel of each
 * materialized node that uses it: elementwise ops inline, movement ops become
 * index arithmetic (an affine map from the kernel's index to the node's), and
 * a reduction over the last axis becomes a per-row pass of its consumer's
 * kernel when the consumer walks the same rows. So gelu, softmax and layer
 * norm are one kernel each, and a matmul's bias and activation one more.
 * Each materialized node becomes a step of the plan (ir/plan.c decides the
 * rest).
 *
 * Why it ends: each failed attempt materializes one more node and starts
 * over; there are finitely many nodes. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ir/internal.h"

/* node index[j] = bias[j] + coef[j] * kernel index[src[j]] (src -1: bias only). */
typedef struct {
    int ndim;
    int src[KX_MAX_DIMS];
    int64_t coef[KX_MAX_DIMS];
    int64_t bias[KX_MAX_DIMS];
} imap;

typedef struct {
    ir_ref node;
    imap map;
    int expr;
} memo_entry;

typedef struct {
    const ir_graph *g;
    bool *mat;
    bool *eager_view; /* a view taken eagerly for an eager op */
    bool *climbed;    /* a reduction whose failure a row epilogue above it took (row_epilogue_of_failed) */
    uint32_t *uses;   /* per node: the nodes, outputs and writebacks reading it */
    kx_kernel *k;
    ir_ref root;
    int root_ndim;
    int64_t root_shape[KX_MAX_DIMS];
    ir_ref *buffers; /* graph node per kernel buffer */
    int n_buffers, buffers_cap;
    memo_entry *memo;
    int n_memo, memo_cap;
    ir_ref failed;   /* a node that must be materialized first, or IR_NONE */
    ir_ref other_rows; /* a reduction over other rows than the kernel's, that failed, or IR_NONE */
    bool too_many_buffers; /* a load found the kernel full */
    bool nomem;
    bool unsized;          /* a size of the kernel is not a polynomial that fits */
    bool split_sums;       /* the backend sums a row in many partial sums */
    /* Inside a padding's tensor (build_padding): the bounds its loads take,
     * their fill, and the tensor, materialized when more than views of a
     * buffer lie under it. */
    kx_bound bounds[KX_MAX_BOUNDS];
    int n_bounds;
    double fill;
    ir_ref padded;
} builder;

/* -- Expressions and buffers ---------------------------------------------- */

static int add_expr(builder *b, kx_expr e)
{
    int at = kx_add_expr(b->k, e);
    b->nomem |= at < 0;
    return at;
}

static int add_buffer(builder *b, ir_ref node)
{
    for (int i = 0; i < b->n_buffers; i++)
        if (b->buffers[i] == node)
            return i;
    if (b->n_buffers >= KX_MAX_BUFFERS - 1 && node != b->root) { /* one slot stays for the output */
        b->too_many_buffers = true;
        return -1;
    }
    if (!ir_grow((void **)&b->buffers, &b->buffers_cap, b->n_buffers + 1, sizeof node)) {
        b->nomem = true;
        return -1;
    }
    b->buffers[b->n_buffers] = node;
    return b->n_buffers++;
}

/* -- Views and maps -------------------------------------------------------- */

static imap identity_map(int ndim)
{
    imap m = {.ndim = ndim};
    for (int j = 0; j < ndim; j++) {
        m.src[j] = j;
        m.coef[j] = 1;
    }
    return m;
}

/* The map into an operand of shape (ndim, shape) broadcast to the node's shape. */
static imap broadcast_map(const imap *m, int ndim, const int64_t *shape)
{
    imap o = {.ndim = ndim};
    int lead = m->ndim - ndim;
    for (int d = 0; d < ndim; d++) {
        bool broadcast = shape[d] == 1;
        o.src[d] = broadcast ? -1 : m->src[d + lead];
        o.coef[d] = broadcast ? 0 : m->coef[d + lead];
        o.bias[d] = broadcast ? 0 : m->bias[d + lead];
    }
    return o;
}

/* -- Sizes of the kernel ----------------------------------------------------- *
 * Offsets and strides are sizes of the kernel's table (ir.h): products and
 * sums of the buffers' sizes (symbolic, perhaps) and the maps' integers. On
 * concrete values they wrap as the index arithmetic of an empty slice may
 * (its indices are never used); symbolic ones that do not fit fail the
 * lowering. */

static int64_t size_of_int(builder *b, int64_t v)
{
    if (v >= 0)
        return v;
    ir_poly p = {.n = 1, .terms = {{.coef = v}}};
    int64_t size = ir_size_of(&b->k->sizes, &p);
    b->unsized |= size == IR_SIZE_NONE;
    return size == IR_SIZE_NONE ? 0 : size;
}

static int64_t checked(builder *b, int64_t size)
{
    b->unsized |= size == IR_SIZE_NONE;
    return size == IR_SIZE_NONE ? 0 : size;
}

/* size * factor, factor an integer of a map. */
static int64_t size_times(builder *b, int64_t size, int64_t factor)
{
    if (size >= 0)
        return size_of_int(b, (int64_t)((uint64_t)size * (uint64_t)factor));
    return checked(b, ir_size_mul(&b->k->sizes, size, size_of_int(b, factor)));
}

static int64_t size_plus(builder *b, int64_t x, int64_t y)
{
    if (x >= 0 && y >= 0)
        return size_of_int(b, (int64_t)((uint64_t)x + (uint64_t)y));
    return checked(b, ir_size_add(&b->k->sizes, x, y));
}

static void contiguous_strides(builder *b, int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t step = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = step;
        if (shape[d] > 1 || shape[d] < 0) /* symbolic sizes are 2 or more */
            step = checked(b, ir_size_mul(&b->k->sizes, step, shape[d]));
    }
}

/* A load of buffer node through m, the buffer laid out with strides. */
static int load(builder *b, ir_ref node, const imap *m, const int64_t *strides)
{
    int buffer = add_buffer(b, node);
    if (buffer < 0)
        return -1;
    kx_view v = {.buffer = buffer, .dtype = b->g->nodes[node].dtype};
    int64_t kernel_strides[KX_MAX_DIMS] = {0};
    for (int j = 0; j < m->ndim; j++) {
        v.offset = size_plus(b, v.offset, size_times(b, strides[j], m->bias[j]));
        if (m->src[j] >= 0)
            kernel_strides[m->src[j]] = size_plus(b, kernel_strides[m->src[j]], size_times(b, strides[j], m->coef[j]));
    }
    for (int i = 0; i + 1 < b->root_ndim; i++)
        v.outer_strides[i] = kernel_strides[i];
    v.inner_stride = b->root_ndim ? kernel_strides[b->root_ndim - 1] : 0;
    v.n_bounds = b->n_bounds;
    memcpy(v.bounds, b->bounds, sizeof v.bounds);
    v.fill = b->fill;
    int view = kx_add_view(b->k, v);
    if (view < 0) {
        b->nomem = true;
        return -1;
    }
    return add_expr(b, (kx_expr){.kind = KX_LOAD, .dtype = v.dtype, .view = view});
}

/* -- Expressions ----------------------------------------------------------- */

static int build(builder *b, ir_ref node, const imap *m);

static int cast(builder *b, int e, kiln_dtype dt)
{
    if (e < 0 || b->k->exprs[e].dtype == dt)
        return e;
    return add_expr(b, (kx_expr){.kind = KX_CAST, .dtype = dt, .args = {e, -1, -1}});
}

static ir_rank_class rank_class(const ir_node *n)
{
    return n->op == OP_CONST && n->params.scalar ? IR_SCALAR : n->ndim == 0 ? IR_ZERO_DIM : IR_DIMS;
}

/* The dtype op computes in, given its operands (see the rules of ir.h). */
static kiln_dtype compute_dtype(const ir_graph *g, const ir_node *n)
{
    const ir_ref *ops = ir_operands(g, n);
    if (ir_ops[n->op].rule != RULE_COMPARE)
        return n->dtype;
    const ir_node *a = &g->nodes[ops[0]], *c = &g->nodes[ops[1]];
    return ir_promote(a->dtype, rank_class(a), c->dtype, rank_class(c));
}

static int build_elementwise(builder *b, const ir_node *n, const imap *m)
{
    const ir_ref *ops = ir_operands(b->g, n);
    int args[3] = {-1, -1, -1};
    kiln_dtype compute = compute_dtype(b->g, n);
    for (uint32_t i = 0; i < n->n_operands; i++) {
        const ir_node *o = &b->g->nodes[ops[i]];
        imap om = broadcast_map(m, o->ndim, o->shape);
        kiln_dtype want = n->op == OP_WHERE && i == 0 ? KILN_BOOL : compute;
        args[i] = cast(b, build(b, ops[i], &om), want);
        if (args[i] < 0) {
            /* Out of buffers at a leaf of this node: an operand subtree built
             * before it gets a kernel of its own. */
            for (uint32_t j = 0; j < i && b->too_many_buffers && b->failed == IR_NONE; j++)
                if (!b->mat[ops[j]] && b->g->nodes[ops[j]].op != OP_CONST)
                    b->failed = ops[j];
            return -1;
        }
    }
    if (n->op == OP_CAST)
        return args[0];
    return add_expr(b, (kx_expr){.kind = KX_OP, .dtype = n->dtype, .op = n->op,
                                 .args = {args[0], args[1], args[2]}});
}

/* Unit-dimension reshapes map index to index; others only over a buffer. */
static bool reshape_map(const ir_node *n, const ir_node *o, const imap *m, imap *om)
{
    om->ndim = o->ndim;
    int j = 0;
    for (int d = 0; d < o->ndim; d++) {
        if (o->shape[d] == 1) {
            om->src[d] = -1, om->coef[d] = 0, om->bias[d] = 0;
            continue;
        }
        while (j < n->ndim && n->shape[j] == 1)
            j++;
        if (j == n->ndim || n->shape[j] != o->shape[d])
            return false;
        om->src[d] = m->src[j], om->coef[d] = m->coef[j], om->bias[d] = m->bias[j];
        j++;
    }
    for (; j < n->ndim; j++)
        if (n->shape[j] != 1)
            return false;
    return true;
}

/* -- Padding ----------------------------------------------------------------- *
 * A constant pad is a concat of a tensor between constants (kiln_pad's, the
 * pools' and convolutions' windows): its kernel reads the tensor's buffer
 * through views bounded to where the kernel's index falls on the tensor,
 * and the constant elsewhere, so that the padded copy is never made. */

/* Whether v is a value of dtype dt (a cast would not change it). */
static bool exact_in(kiln_dtype dt, double v)
{
    switch (dt) {
    case KILN_F32: return v != v || isinf(v) || (fabs(v) <= FLT_MAX && (double)(float)v == v);
    case KILN_F64: return true;
    case KILN_I32: return v >= INT32_MIN && v <= INT32_MAX && v == (double)(int32_t)v;
    case KILN_I64: return v >= -0x1p63 && v < 0x1p63 && v == (double)(int64_t)v;
    default: return v == 0 || v == 1;
    }
}

/* Whether r is a constant broadcast (expanded, reshaped, cast from a
 * const) of dtype dt; its value into *value. */
static bool constant_value(const ir_graph *g, ir_ref r, kiln_dtype dt, double *value)
{
    const ir_node *n = &g->nodes[r];
    while (n->op == OP_EXPAND || n->op == OP_RESHAPE || (n->op == OP_CAST && n->ndim == 0))
        n = &g->nodes[ir_operands(g, n)[0]];
    *value = n->params.value;
    return n->op == OP_CONST && g->nodes[r].dtype == dt && exact_in(dt, *value);
}

static bool same_value(double a, double b)
{
    return a == b || (a != a && b != b);
}

/* Whether concat n is a padding: of concrete sizes below 2^31, one tensor
 * of its dtype between parts of one constant value (into *fill), the
 * tensor's index into *data and its first index along the axis into *lo. */
static bool padding(const ir_graph *g, const ir_node *n, int *data, int64_t *lo, double *fill)
{
    const ir_ref *parts = ir_operands(g, n);
    int found = -1;
    int64_t at = 0;
    bool filled = false;
    for (int d = 0; d < n->ndim; d++)
        if (n->shape[d] < 0 || n->shape[d] > INT32_MAX)
            return false;
    for (uint32_t i = 0; i < n->n_operands; i++) {
        double v;
        if (constant_value(g, parts[i], n->dtype, &v)) {
            if (filled && !same_value(v, *fill))
                return false;
            *fill = v, filled = true;
        } else if (found >= 0 || g->nodes[parts[i]].dtype != n->dtype) {
            return false;
        } else {
            found = (int)i, *lo = at;
        }
        at += g->nodes[parts[i]].shape[n->params.axis];
    }
    *data = found;
    return found >= 0 && filled;
}

static int64_t floor_div(int64_t a, int64_t d)
{
    int64_t q = a / d;
    return q - (a % d != 0 && (a < 0) != (d < 0));
}

/* The kernel indices k in [0, extent) where bias + coef k lies in [lo, hi)
 * (coef != 0): [*from, *to), perhaps empty. */
static void indices_within(int64_t bias, int64_t coef, int64_t lo, int64_t hi, int64_t extent, int64_t *from,
                           int64_t *to)
{
    if (coef > 0) {
        *from = -floor_div(bias - lo, coef);
        *to = -floor_div(bias - hi, coef);
    } else {
        *from = floor_div(hi - bias, coef) + 1;
        *to = floor_div(lo - bias, coef) + 1;
    }
    *from = *from < 0 ? 0 : *from;
    *to = *to > extent ? extent : *to;
}

/* The tensor of padding node (data its operand index, from lo on its
 * axis) built through m within bound, or the fill where nothing is. */
static int build_padded(builder *b, ir_ref node, const imap *m, int data, int64_t lo, double fill, kx_bound bound)
{
    const ir_node *n = &b->g->nodes[node];
    ir_ref tensor = ir_operands(b->g, n)[data];
    if (bound.lo >= bound.hi)
        return add_expr(b, (kx_expr){.kind = KX_CONST, .dtype = n->dtype, .value = fill});
    if ((b->n_bounds && !same_value(fill, b->fill)) || b->n_bounds == KX_MAX_BOUNDS) {
        b->failed = node;
        return -1;
    }
    imap tm = *m;
    tm.bias[n->params.axis] -= lo;
    bool whole = bound.dim < 0 || (bound.lo == 0 && bound.hi == b->root_shape[bound.dim]);
    ir_ref outer = b->padded;
    b->padded = tensor;
    b->fill = fill;
    if (!whole)
        b->bounds[b->n_bounds++] = bound;
    int e = build(b, tensor, &tm);
    b->n_bounds -= !whole;
    b->padded = outer;
    return e;
}

/* Padding node n through m: its tensor where the kernel's index falls on
 * it, its constant elsewhere. */
static int build_padding(builder *b, ir_ref node, const ir_node *n, const imap *m)
{
    int data = -1;
    int64_t lo = 0;
    double fill = 0;
    padding(b->g, n, &data, &lo, &fill);
    int a = n->params.axis, src = m->src[a];
    int64_t bias = m->bias[a], coef = m->coef[a], hi = lo + b->g->nodes[ir_operands(b->g, n)[data]].shape[a];
    kx_bound bound = {.dim = -1, .lo = 0, .hi = 1};
    if (src < 0 || coef == 0) {
        bound.hi = bias >= lo && bias < hi;
    } else if (b->root_shape[src] < 0 || coef < -INT32_MAX || coef > INT32_MAX || bias < -INT32_MAX ||
               bias > INT32_MAX) {
        b->failed = node; /* its own kernel reads it whole */
        return -1;
    } else {
        bound.dim = src;
        indices_within(bias, coef, lo, hi, b->root_shape[src], &bound.lo, &bound.hi);
    }
    return build_padded(b, node, m, data, lo, fill, bound);
}

static int build_movement(builder *b, ir_ref node, const ir_node *n, const imap *m)
{
    if (n->op == OP_CONCAT)
        return build_padding(b, node, n, m);
    ir_ref operand = ir_operands(b->g, n)[0];
    const ir_node *o = &b->g->nodes[operand];
    imap om = *m;
    switch (n->op) {
    case OP_RESHAPE:
        if (b->mat[operand]) { /* a buffer is contiguous: the reshape's own strides address it */
            int64_t strides[KX_MAX_DIMS];
            contiguous_strides(b, n->ndim, n->shape, strides);
            return load(b, operand, m, strides);
        }
        if (!reshape_map(n, o, m, &om)) {
            b->failed = operand;
            return -1;
        }
        break;
    case OP_PERMUTE:
        for (int j = 0; j < n->ndim; j++) {
            int d = n->params.perm[j];
            om.src[d] = m->src[j], om.coef[d] = m->coef[j], om.bias[d] = m->bias[j];
        }
        break;
    case OP_EXPAND:
        om = broadcast_map(m, o->ndim, o->shape);
        break;
    case OP_SLICE: {
        /* Wrapping: an empty slice keeps its start and step as given (a step
         * of INT64_MAX, say), and its indices are never used. */
        int a = n->params.axis;
        uint64_t step = (uint64_t)n->params.step;
        om.bias[a] = (int64_t)((uint64_t)n->params.start + step * (uint64_t)m->bias[a]);
        om.coef[a] = (int64_t)(step * (uint64_t)m->coef[a]);
        break;
    }
    default: /* contiguous: the same values */
        break;
    }
    return build(b, operand, &om);
}

enum { ROW_F32_SUM = 4096, MAX_FUSED_DEPTH = 256 };

/* A reduction inside the kernel: only when the kernel walks its input's rows. */
static int build_reduction(builder *b, ir_ref node, const ir_node *n, const imap *m)
{
    ir_ref input = ir_operands(b->g, n)[0];
    const ir_node *in = &b->g->nodes[input];
    bool rows_match = b->root_ndim == in->ndim && !memcmp(b->root_shape, in->shape, (size_t)in->ndim * sizeof *in->shape);
    for (int j = 0; rows_match && j < n->ndim; j++) {
        bool reduced_axis = n->params.keepdim && j == n->ndim - 1;
        /* an axis of 1 maps to its one index, and reads as broadcast */
        bool one = in->shape[j] == 1 && m->bias[j] == 0;
        rows_match = reduced_axis ? m->src[j] < 0 && m->bias[j] == 0
                                  : one || (m->src[j] == j && m->coef[j] == 1 && m->bias[j] == 0);
    }
    if (!rows_match) {
        b->failed = node;
        b->other_rows = b->uses[node] == 1 && !b->climbed[node] ? node : IR_NONE;
        return -1;
    }
    imap whole = identity_map(in->ndim);
    /* As eager: float sums in f64 (cancellation in f32 loses whole values),
     * integers in i64 but their means in f64 (where no sum wraps), extremes
     * in the input's dtype. A sum of exponentials
     * over a short row is the exception where the backend splits the row into
     * partial sums (vectorized lanes, threads): its terms are positive, so
     * nothing cancels, and partial sums of at most ROW_F32_SUM / 8 terms keep
     * it within 2^-15 of the exact sum, while f64 costs softmax 1.7x. Not a
     * mean: its sum may pass FLT_MAX where the mean does not. */
    bool sums = n->op == OP_SUM || n->op == OP_MEAN;
    bool positive_terms = b->split_sums && n->op == OP_SUM && in->op == OP_EXP && in->dtype == KILN_F32 &&
                          in->ndim > 0 && in->shape[in->ndim - 1] >= 0 && in->shape[in->ndim - 1] <= ROW_F32_SUM;
    kiln_dtype acc = !ir_dtype_is_float(in->dtype) ? (n->op == OP_MEAN ? KILN_F64 : KILN_I64)
                     : sums && !positive_terms     ? KILN_F64
                                                   : in->dtype;
    int e = cast(b, build(b, input, &whole), acc);
    if (e < 0)
        return -1;
    kx_kernel *k = b->k;
    if (!ir_grow((void **)&k->reductions, &k->reductions_cap, k->n_reductions + 1, sizeof(kx_reduction))) {
        b->nomem = true;
        return -1;
    }
    kiln_dtype value = n->op == OP_MEAN ? KILN_F64 : acc; /* a mean divides in f64 */
    k->reductions[k->n_reductions] = (kx_reduction){n->op, e, acc, value, kx_reduction_identity(n->op, acc)};
    int row = add_expr(b, (kx_expr){.kind = KX_ROW, .dtype = value, .row = k->n_reductions++});
    return cast(b, row, n->dtype);
}

/* Whether gather node n picks one element of each line along its operand's
 * last axis (index [..., 1], the operand's other sizes): a kernel walking
 * the operand's rows, or the gather's, reads it with a KX_GATHER. */
static bool row_pick(const ir_graph *g, const ir_node *n)
{
    const ir_node *a = &g->nodes[ir_operands(g, n)[0]];
    int last = a->ndim - 1;
    if (n->op != OP_GATHER || last < 0 || n->params.axis != last || n->shape[last] != 1)
        return false;
    return !memcmp(n->shape, a->shape, (size_t)last * sizeof *n->shape);
}

/* Gather node n through m: its index built here, its operand's buffer read
 * at that column of the row. The gathered value must be the same along the
 * kernel's columns (which the operand's last axis then walks), else n
 * gets a buffer of its own (a kernel over its rows, where it is). */
static int build_gather(builder *b, ir_ref node, const ir_node *n, const imap *m)
{
    ir_ref data = ir_operands(b->g, n)[0], index = ir_operands(b->g, n)[1];
    const ir_node *a = &b->g->nodes[data];
    int last = a->ndim - 1, inner = b->root_ndim - 1;
    bool constant_along_row = inner >= 0 && m->bias[last] == 0;
    for (int j = 0; j < last; j++)
        constant_along_row &= m->src[j] != inner;
    if (!row_pick(b->g, n) || !constant_along_row || !b->mat[data]) {
        b->failed = !b->mat[data] ? data : node;
        return -1;
    }
    int at = cast(b, build(b, index, m), KILN_I64);
    imap column = *m;
    column.src[last] = inner, column.coef[last] = 1;
    int64_t strides[KX_MAX_DIMS];
    contiguous_strides(b, a->ndim, a->shape, strides);
    int e = at < 0 ? -1 : load(b, data, &column, strides);
    if (e < 0)
        return -1;
    kx_expr *x = &b->k->exprs[e];
    x->kind = KX_GATHER, x->args[0] = at, x->args[1] = x->args[2] = -1, x->size = a->shape[last], x->axis = last;
    return e;
}

static bool same_map(const imap *a, const imap *b)
{
    return a->ndim == b->ndim && !memcmp(a->src, b->src, (size_t)a->ndim * sizeof *a->src) &&
           !memcmp(a->coef, b->coef, (size_t)a->ndim * sizeof *a->coef) &&
           !memcmp(a->bias, b->bias, (size_t)a->ndim * sizeof *a->bias);
}

/* Whether node, under a padding, is more than views of a buffer: the
 * padding's tensor is then materialized, and read bounded. */
static bool computed_under_padding(const builder *b, ir_ref node)
{
    const ir_node *n = &b->g->nodes[node];
    return b->n_bounds && !(b->mat[node] && node != b->root) && ir_ops[n->op].kind != KIND_MOVEMENT;
}

static const ir_node *epilogue_reduction(const builder *b, ir_ref root, ir_ref r);

/* Whether node, elementwise, is a row epilogue of the reduction that failed
 * to build in this kernel (over other rows than the kernel's): the
 * reduction then gets a kernel of its own with the outermost such node as
 * its epilogue, rather than its value alone (the max and the sum of a
 * softmax's pieces, long_rows.c, one kernel reading each piece once).
 * Climbing stops at the first node that is not one. A reduction read by more
 * than one node, or failing again once an epilogue took it (read through
 * another branch above that node), is materialized itself, so that no two
 * kernels compute it. */
static bool row_epilogue_of_failed(builder *b, ir_ref node)
{
    if (b->other_rows == IR_NONE || node == b->other_rows)
        return false;
    const ir_node *n = &b->g->nodes[node], *r = &b->g->nodes[b->other_rows];
    bool epilogue = node != b->root && !b->mat[node] && ir_ops[n->op].kind == KIND_ELEMENTWISE &&
                    n->ndim == r->ndim && !memcmp(n->shape, r->shape, (size_t)n->ndim * sizeof *n->shape) &&
                    epilogue_reduction(b, node, node) == r;
    if (epilogue)
        b->climbed[b->other_rows] = true;
    else
        b->other_rows = IR_NONE;
    return epilogue;
}

static int build(builder *b, ir_ref node, const imap *m)
{
    /* a load's bounds are not in the memo's key: under a padding nothing is shared */
    for (int i = 0; i < b->n_memo && !b->n_bounds; i++)
        if (b->memo[i].node == node && same_map(&b->memo[i].map, m))
            return b->memo[i].expr;
    const ir_node *n = &b->g->nodes[node];
    int e;
    if (computed_under_padding(b, node)) {
        b->failed = b->padded;
        return -1;
    }
    if (b->mat[node] && node != b->root) {
        int64_t strides[KX_MAX_DIMS];
        contiguous_strides(b, n->ndim, n->shape, strides);
        e = load(b, node, m, strides);
    } else if (n->op == OP_CONST) {
        e = add_expr(b, (kx_expr){.kind = KX_CONST, .dtype = n->dtype, .value = n->params.value});
    } else {
        switch (ir_ops[n->op].kind) {
        case KIND_ELEMENTWISE: e = build_elementwise(b, n, m); break;
        case KIND_MOVEMENT: e = build_movement(b, node, n, m); break;
        case KIND_REDUCTION: e = build_reduction(b, node, n, m); break;
        case KIND_INDEX: e = build_gather(b, node, n, m); break;
        default: b->failed = node; e = -1; break;
        }
    }
    if (e < 0) {
        /* A kernel out of buffers splits at the deepest node computed in it. */
        if (b->too_many_buffers && b->failed == IR_NONE && !b->mat[node] && n->op != OP_CONST)
            b->failed = node;
        if (row_epilogue_of_failed(b, node))
            b->failed = node;
        return -1;
    }
    if (b->n_bounds)
        return e;
    if (!ir_grow((void **)&b->memo, &b->memo_cap, b->n_memo + 1, sizeof *b->memo)) {
        b->nomem = true;
        return -1;
    }
    b->memo[b->n_memo++] = (memo_entry){node, *m, e};
    return e;
}

/* -- Kernels --------------------------------------------------------------- */

/* e OP row where the last reduction folds e (or e converted): its pass
 * stores e, and the store pass only applies OP to what it reads back, without
 * computing e again (softmax's exp). false when out of memory. */
static bool stage_store(kx_kernel *k)
{
    if (k->n_stores != 1 || k->n_reductions == 0)
        return true;
    kx_store st = k->stores[0];
    const kx_expr s = k->exprs[st.expr];
    const kx_view *v = &k->views[st.view];
    if (s.kind != KX_OP || (s.op != OP_DIV && s.op != OP_MUL && s.op != OP_SUB && s.op != OP_ADD) ||
        !ir_dtype_is_float(s.dtype) || v->dtype != s.dtype || v->inner_stride != 1)
        return true;
    int value = s.args[0], row = s.args[1];
    const kx_expr *r = &k->exprs[row];
    if (r->kind == KX_CAST)
        r = &k->exprs[r->args[0]];
    int last = k->n_reductions - 1, folded = k->reductions[last].expr;
    if (k->exprs[folded].kind == KX_CAST)
        folded = k->exprs[folded].args[0];
    if (r->kind != KX_ROW || r->row != last || folded != value || k->exprs[value].dtype != s.dtype)
        return true;
    int stored = kx_add_expr(k, (kx_expr){.kind = KX_LOAD, .dtype = s.dtype, .view = st.view});
    int applied = stored < 0 ? -1 : kx_add_expr(k, (kx_expr){.kind = KX_OP, .dtype = s.dtype, .op = s.op,
                                                                 .args = {stored, row, -1}});
    if (applied < 0 || kx_add_store(k, (kx_store){.view = st.view, .expr = applied, .pass = KX_STORE_PASS}) < 0)
        return false;
    k->stores[0] = (kx_store){.view = st.view, .expr = value, .pass = kx_reduction_pass(last)};
    return true;
}

/* An elementwise kernel over few long rows splits each row into pieces, so
 * that rows (what threads share) are many: [rows, cols] becomes
 * [rows, cols/piece, piece] for a piece that divides cols (ir_row_piece). */
static void split_long_rows(builder *b)
{
    kx_kernel *k = b->k;
    enum { MIN_ROWS = 64, PIECE = 8192, MIN_PIECE = 1024 };
    if (k->n_reductions || k->n_row_stores || k->rows < 0 || k->cols < 0 || k->rows >= MIN_ROWS ||
        k->cols < 2 * PIECE || k->n_outer == KX_MAX_DIMS || kx_rows_fixed(k))
        return;
    int64_t piece = ir_row_piece(k->cols, PIECE, MIN_PIECE);
    if (!piece)
        return;
    k->outer[k->n_outer] = k->cols / piece;
    for (int v = 0; v < k->n_views; v++)
        k->views[v].outer_strides[k->n_outer] = size_times(b, k->views[v].inner_stride, piece);
    k->n_outer++;
    k->rows *= k->cols / piece;
    k->cols = piece;
}

static bool transcendental(const kx_kernel *k)
{
    for (int i = 0; i < k->n_exprs; i++)
        if (k->exprs[i].kind == KX_OP && (ir_ops[k->exprs[i].op].flags & FLAG_TRANSCENDENTAL))
            return true;
    return false;
}

/* The output store of a kernel computing node n into buffer out: a row
 * store of a reduction's value, or of a row epilogue's, else a store along
 * the row. */
static bool store_output(builder *b, const ir_node *n, int out, int e, bool epilogue)
{
    kx_kernel *k = b->k;
    if (ir_ops[n->op].kind == KIND_REDUCTION || epilogue) {
        int last = k->n_reductions - 1, value = epilogue ? cast(b, e, n->dtype) : -1;
        if (value < (epilogue ? 0 : -1) || !ir_grow((void **)&k->row_stores, &k->row_stores_cap, 1, sizeof(kx_row_store)))
            return false;
        kiln_dtype from = epilogue ? n->dtype : k->reductions[last].result;
        k->row_stores[k->n_row_stores++] = (kx_row_store){out, epilogue ? -1 : last, from, n->dtype, value};
        return true;
    }
    int64_t strides[KX_MAX_DIMS];
    contiguous_strides(b, n->ndim, n->shape, strides);
    kx_view v = {.buffer = out, .dtype = n->dtype};
    for (int d = 0; d + 1 < n->ndim; d++)
        v.outer_strides[d] = strides[d];
    v.inner_stride = n->ndim ? strides[n->ndim - 1] : 0;
    int view = kx_add_view(k, v), value = cast(b, e, n->dtype);
    return view >= 0 && value >= 0 && kx_add_store(k, (kx_store){.view = view, .expr = value, .pass = KX_STORE_PASS}) >= 0;
}

/* A reduction over the last axis whose result has root's shape, reached
 * from root through elementwise nodes its kernel computes, or NULL. Root is
 * then a row epilogue: its kernel walks the reduction's rows and stores
 * root's value once a row (logsumexp's log(sum) + max, a loss per row). */
static const ir_node *epilogue_reduction(const builder *b, ir_ref root, ir_ref r)
{
    const ir_node *n = &b->g->nodes[r], *top = &b->g->nodes[root];
    if (r != root && b->mat[r])
        return NULL;
    if (ir_ops[n->op].kind == KIND_REDUCTION) {
        const ir_node *in = &b->g->nodes[ir_operands(b->g, n)[0]];
        bool last_axis = in->ndim > 0 && n->params.axis == in->ndim - 1;
        bool same = n->ndim == top->ndim && !memcmp(n->shape, top->shape, (size_t)n->ndim * sizeof *n->shape);
        return last_axis && same ? n : NULL;
    }
    if (ir_ops[n->op].kind != KIND_ELEMENTWISE)
        return NULL;
    for (uint32_t i = 0; i < n->n_operands; i++) {
        const ir_node *found = epilogue_reduction(b, root, ir_operands(b->g, n)[i]);
        if (found)
            return found;
    }
    return NULL;
}

/* The value under node's reshapes that its kernel computes: a reshape
 * stores its operand's row-major bytes, so the kernel computes the operand
 * straight into the reshape's buffer instead of copying it after. */
static ir_ref reshaped_value(const builder *b, ir_ref node)
{
    while (b->g->nodes[node].op == OP_RESHAPE) {
        ir_ref o = ir_operands(b->g, &b->g->nodes[node])[0];
        if (b->mat[o] || ir_ops[b->g->nodes[o].op].kind == KIND_SOURCE)
            break;
        node = o;
    }
    return node;
}

/* The kernel computing node; NULL with b->failed set when a node must be
 * materialized first, or b->nomem. */
static kx_kernel *build_kernel(builder *b, ir_ref node)
{
    ir_ref root = reshaped_value(b, node);
    const ir_node *n = &b->g->nodes[root];
    bool reduces = ir_ops[n->op].kind == KIND_REDUCTION;
    const ir_node *rows_of = reduces ? n : ir_ops[n->op].kind == KIND_ELEMENTWISE ? epilogue_reduction(b, root, root)
                                                                                  : NULL;
    const ir_node *space = rows_of ? &b->g->nodes[ir_operands(b->g, rows_of)[0]] : n;
    if (!(b->k = kx_kernel_new(&b->g->sizes, space->ndim, space->shape))) {
        b->nomem = true;
        return NULL;
    }
    b->root = root;
    b->root_ndim = space->ndim;
    memcpy(b->root_shape, space->shape, (size_t)space->ndim * sizeof *space->shape);
    b->n_buffers = b->n_memo = 0;
    b->failed = b->other_rows = IR_NONE;
    b->too_many_buffers = false;
    /* A reduction (or its epilogue) is built on its own rows, as if a
     * consumer used it. */
    imap map = identity_map(rows_of ? n->ndim : space->ndim);
    if (rows_of && rows_of->params.keepdim)
        map.src[n->ndim - 1] = -1, map.coef[n->ndim - 1] = 0;
    int e = build(b, root, &map);
    b->root = node; /* its buffer, the output, always has a slot */
    int out = e < 0 ? -1 : add_buffer(b, node);
    kx_kernel *k = b->k;
    if (out < 0 || !store_output(b, n, out, e, rows_of && !reduces) || b->unsized) {
        b->nomem |= b->failed == IR_NONE && !b->unsized;
        kx_kernel_free(k);
        return NULL;
    }
    k->n_buffers = b->n_buffers;
    for (int i = 0; i < b->n_buffers; i++)
        k->buffer_dtypes[i] = b->g->nodes[b->buffers[i]].dtype;
    k->transcendental = transcendental(k);
    split_long_rows(b);
    if (!stage_store(k)) {
        b->nomem = true;
        kx_kernel_free(k);
        return NULL;
    }
    return k;
}

/* A copy of node r's value: its buffer (0), read row-major, stored as it is
 * into a second buffer of r's (1). The planner computes a product into
 * buffer 0, so the copy is that product's kernel with nothing applied. */
kx_kernel *ir_lower_copy(const ir_graph *g, ir_ref r, bool *nomem)
{
    const ir_node *n = &g->nodes[r];
    builder b = {.g = g, .root = r, .root_ndim = n->ndim};
    memcpy(b.root_shape, n->shape, (size_t)n->ndim * sizeof *n->shape);
    b.k = kx_kernel_new(&g->sizes, n->ndim, n->shape);
    if (!b.k) {
        *nomem = true;
        return NULL;
    }
    int64_t strides[KX_MAX_DIMS];
    imap map = identity_map(n->ndim);
    contiguous_strides(&b, n->ndim, n->shape, strides);
    int e = load(&b, r, &map, strides);
    bool stored = e >= 0 && store_output(&b, n, 1, e, false) && !b.unsized;
    free(b.buffers);
    *nomem = !stored && !b.unsized;
    if (!stored) {
        kx_kernel_free(b.k);
        return NULL;
    }
    b.k->n_buffers = 2;
    b.k->buffer_dtypes[0] = b.k->buffer_dtypes[1] = n->dtype;
    return b.k;
}

/* -- Which nodes get buffers ----------------------------------------------- */

static bool runs_eagerly(const ir_graph *g, const ir_node *n)
{
    if (ir_ops[n->op].flags & FLAG_UNFUSED)
        return true;
    switch (ir_ops[n->op].kind) {
    case KIND_INDEX: return !row_pick(g, n);
    case KIND_MATMUL: return true;
    case KIND_MOVEMENT: {
        int data;
        int64_t lo;
        double fill;
        return n->op == OP_CONCAT && !padding(g, n, &data, &lo, &fill);
    }
    case KIND_REDUCTION: {
        const ir_node *in = &g->nodes[ir_operands(g, n)[0]];
        return n->op == OP_ARGMAX || n->params.axis == KILN_ALL || n->params.axis != in->ndim - 1;
    }
    default: return false;
    }
}

static bool is_view(const ir_node *n)
{
    return ir_ops[n->op].kind == KIND_MOVEMENT && n->op != OP_CONCAT;
}

/* Users first, so that a view an eager op takes is marked before the loop
 * reaches it: an operand of an eager op is materialized, and a view of a
 * buffer is taken eagerly (a transposed weight reaches BLAS as a transposed
 * view, not a copy), its own operand then treated as an eager op's. */
static void mark_materialized(const ir_graph *g, bool *mat, bool *view)
{
    for (ir_ref r = g->count; r-- > 0;) {
        const ir_node *n = &g->nodes[r];
        bool eager = runs_eagerly(g, n) || view[r];
        mat[r] |= (ir_ops[n->op].kind == KIND_SOURCE && n->op != OP_CONST) || eager;
        for (uint32_t i = 0; eager && i < n->n_operands; i++) {
            ir_ref o = ir_operands(g, n)[i];
            mat[o] = true;
            view[o] |= is_view(&g->nodes[o]);
        }
    }
    for (int i = 0; i < g->n_outputs; i++)
        mat[g->outputs[i]] = true;
    for (int i = 0; i < g->n_writebacks; i++)
        mat[g->writebacks[i].value] = true;
}

/* Materializes every node more than MAX_FUSED_DEPTH ops from a buffer along
 * its operands, so that building a kernel (and compiling it) never recurses
 * deeper: a chain of 100,000 ops becomes kernels of MAX_FUSED_DEPTH. */
static bool bound_depth(const ir_graph *g, bool *mat)
{
    uint16_t *depth = calloc(g->count ? g->count : 1, sizeof *depth);
    if (!depth)
        return false;
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        int deepest = 0;
        for (uint32_t i = 0; i < n->n_operands; i++) {
            ir_ref o = ir_operands(g, n)[i];
            deepest = !mat[o] && depth[o] > deepest ? depth[o] : deepest;
        }
        depth[r] = (uint16_t)(deepest + 1);
        if (depth[r] > MAX_FUSED_DEPTH)
            mat[r] = true;
        if (mat[r])
            depth[r] = 0;
    }
    free(depth);
    return true;
}

/* -- The whole graph ------------------------------------------------------- */

static void free_steps(ir_plan *plan)
{
    for (int i = 0; i < plan->n_steps; i++) {
        kx_kernel_free(plan->steps[i].kernel);
        free(plan->steps[i].buffers);
    }
    free(plan->steps);
    plan->steps = NULL;
    plan->n_steps = 0;
}

static bool add_step(builder *b, ir_plan *plan, plan_step step)
{
    plan_step *steps = realloc(plan->steps, (size_t)(plan->n_steps + 1) * sizeof *steps);
    if (!steps) {
        kx_kernel_free(step.kernel);
        free(step.buffers);
        b->nomem = true;
        return false;
    }
    plan->steps = steps;
    plan->steps[plan->n_steps++] = step;
    return true;
}

/* One attempt: a step per materialized node. IR_NONE on success, or the node
 * to materialize before trying again. */
static ir_ref try_lower(builder *b, ir_plan *plan)
{
    const ir_graph *g = b->g;
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        if (!b->mat[r] || ir_ops[n->op].kind == KIND_SOURCE)
            continue;
        plan_step step = {.node = r, .reuses = IR_NONE, .product = IR_NONE, .blocked_with = -1};
        if (!runs_eagerly(g, n) && !b->eager_view[r]) {
            if (!(step.kernel = build_kernel(b, r)))
                return b->nomem || b->unsized ? r : b->failed;
            if (!(step.buffers = malloc((size_t)b->n_buffers * sizeof *step.buffers))) {
                kx_kernel_free(step.kernel);
                b->nomem = true;
                return r;
            }
            memcpy(step.buffers, b->buffers, (size_t)b->n_buffers * sizeof *b->buffers);
            step.n_inputs = b->n_buffers - 1;
            step.n_outputs = 1;
        }
        if (!add_step(b, plan, step))
            return r;
    }
    return IR_NONE;
}

int ir_lower(const ir_graph *g, bool split_sums, ir_plan *plan, char *err, size_t err_size)
{
    builder b = {.g = g, .split_sums = split_sums};
    size_t count = g->count ? g->count : 1;
    b.mat = calloc(count, sizeof *b.mat);
    b.eager_view = calloc(count, sizeof *b.eager_view);
    b.climbed = calloc(count, sizeof *b.climbed);
    b.uses = ir_count_uses(g);
    int status = b.mat && b.eager_view && b.climbed && b.uses ? 0 : -CORE_NOMEM;
    if (status == 0)
        mark_materialized(g, b.mat, b.eager_view);
    if (status == 0 && !bound_depth(g, b.mat))
        status = -CORE_NOMEM;
    while (status == 0) {
        ir_ref again = try_lower(&b, plan);
        if (b.nomem)
            status = -CORE_NOMEM;
        if (b.unsized) {
            snprintf(err, err_size, "the sizes of the kernel of %s node %u do not fit polynomials",
                     ir_ops[g->nodes[again].op].name, again);
            status = core_internal("kiln_call", "%s", err);
        }
        if (again == IR_NONE || status < 0)
            break;
        free_steps(plan);
        if (b.mat[again]) {
            snprintf(err, err_size, "lowering cannot progress: %s node %u is materialized already",
                     ir_ops[g->nodes[again].op].name, again);
            status = core_internal("kiln_call", "%s", err);
            break;
        }
        b.mat[again] = true;
    }
    free(b.buffers);
    free(b.memo);
    free(b.eager_view);
    free(b.climbed);
    free(b.uses);
    if (status < 0) {
        free_steps(plan);
        free(b.mat);
        return status;
    }
    plan->materialized = b.mat;
    return 0;
}
