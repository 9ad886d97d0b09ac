/* Lowering: a graph split into fusion groups, each one kernel of the kernel IR.
 *
 * A node is materialized (gets a buffer) when it is a source, an output or a
 * writeback, when an op the kernels do not cover needs it (matmul, concat,
 * argmax, reductions over other axes than the last, integer pow), or when
 * fusing it failed. Every other node is computed inside the kernel of each
 * materialized node that uses it: elementwise ops inline, movement ops become
 * index arithmetic (an affine map from the kernel's index to the node's), and
 * a reduction over the last axis becomes a per-row pass of its consumer's
 * kernel when the consumer walks the same rows. So gelu, softmax and layer
 * norm are one kernel each, and a matmul's bias and activation one more.
 *
 * Why it ends: each failed attempt materializes one more node and starts
 * over; there are finitely many nodes. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/kernel.h"
#include "ir/strbuf.h"

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
    kx_kernel *k;
    ir_ref root;
    int root_ndim;
    int64_t root_shape[KX_MAX_DIMS];
    ir_ref *buffers; /* graph node per kernel buffer */
    int n_buffers, buffers_cap;
    memo_entry *memo;
    int n_memo, memo_cap;
    ir_ref failed;   /* a node that must be materialized first, or IR_NONE */
    bool too_many_buffers; /* a load found the kernel full */
    bool nomem;
    bool split_sums;       /* the backend sums a row in many partial sums */
} builder;

/* -- Growing arrays -------------------------------------------------------- */

static bool grow(void **items, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return true;
    int n = *cap ? *cap * 2 : 8;
    while (n < need)
        n *= 2;
    void *p = realloc(*items, (size_t)n * size);
    if (!p)
        return false;
    *items = p;
    *cap = n;
    return true;
}

static int add_expr(builder *b, kx_expr e)
{
    if (!grow((void **)&b->k->exprs, &b->k->exprs_cap, b->k->n_exprs + 1, sizeof e)) {
        b->nomem = true;
        return -1;
    }
    b->k->exprs[b->k->n_exprs] = e;
    return b->k->n_exprs++;
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
    if (!grow((void **)&b->buffers, &b->buffers_cap, b->n_buffers + 1, sizeof node)) {
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

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t step = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = step;
        step *= shape[d] > 1 ? shape[d] : 1;
    }
}

/* A load of buffer node through m, the buffer laid out with strides. */
static int load(builder *b, ir_ref node, const imap *m, const int64_t *strides)
{
    int buffer = add_buffer(b, node);
    if (buffer < 0)
        return -1;
    if (!grow((void **)&b->k->views, &b->k->views_cap, b->k->n_views + 1, sizeof(kx_view))) {
        b->nomem = true;
        return -1;
    }
    kx_view v = {.buffer = buffer, .dtype = b->g->nodes[node].dtype};
    int64_t kernel_strides[KX_MAX_DIMS] = {0};
    for (int j = 0; j < m->ndim; j++) {
        v.offset += strides[j] * m->bias[j];
        if (m->src[j] >= 0)
            kernel_strides[m->src[j]] += strides[j] * m->coef[j];
    }
    for (int i = 0; i + 1 < b->root_ndim; i++)
        v.outer_strides[i] = kernel_strides[i];
    v.inner_stride = b->root_ndim ? kernel_strides[b->root_ndim - 1] : 0;
    b->k->views[b->k->n_views] = v;
    return add_expr(b, (kx_expr){.kind = KX_LOAD, .dtype = v.dtype, .view = b->k->n_views++});
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

static int build_movement(builder *b, ir_ref node, const ir_node *n, const imap *m)
{
    ir_ref operand = ir_operands(b->g, n)[0];
    const ir_node *o = &b->g->nodes[operand];
    imap om = *m;
    switch (n->op) {
    case OP_RESHAPE:
        if (b->mat[operand]) { /* a buffer is contiguous: the reshape's own strides address it */
            int64_t strides[KX_MAX_DIMS];
            contiguous_strides(n->ndim, n->shape, strides);
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
    (void)node;
    return build(b, operand, &om);
}

enum { ROW_F32_SUM = 4096 };

/* A reduction inside the kernel: only when the kernel walks its input's rows. */
static int build_reduction(builder *b, ir_ref node, const ir_node *n, const imap *m)
{
    ir_ref input = ir_operands(b->g, n)[0];
    const ir_node *in = &b->g->nodes[input];
    bool rows_match = b->root_ndim == in->ndim && !memcmp(b->root_shape, in->shape, (size_t)in->ndim * sizeof *in->shape);
    for (int j = 0; rows_match && j < n->ndim; j++) {
        bool reduced_axis = n->params.keepdim && j == n->ndim - 1;
        rows_match = reduced_axis ? m->src[j] < 0 && m->bias[j] == 0
                                  : m->src[j] == j && m->coef[j] == 1 && m->bias[j] == 0;
    }
    if (!rows_match) {
        b->failed = node;
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
                          in->ndim > 0 && in->shape[in->ndim - 1] <= ROW_F32_SUM;
    kiln_dtype acc = !ir_dtype_is_float(in->dtype) ? (n->op == OP_MEAN ? KILN_F64 : KILN_I64)
                     : sums && !positive_terms     ? KILN_F64
                                                   : in->dtype;
    int e = cast(b, build(b, input, &whole), acc);
    if (e < 0)
        return -1;
    kx_kernel *k = b->k;
    if (!grow((void **)&k->reductions, &k->reductions_cap, k->n_reductions + 1, sizeof(kx_reduction))) {
        b->nomem = true;
        return -1;
    }
    k->reductions[k->n_reductions] = (kx_reduction){n->op, e, acc};
    kiln_dtype value = n->op == OP_MEAN ? KILN_F64 : acc; /* a mean divides in f64 */
    int row = add_expr(b, (kx_expr){.kind = KX_ROW, .dtype = value, .row = k->n_reductions++});
    return cast(b, row, n->dtype);
}

static bool same_map(const imap *a, const imap *b)
{
    return a->ndim == b->ndim && !memcmp(a->src, b->src, (size_t)a->ndim * sizeof *a->src) &&
           !memcmp(a->coef, b->coef, (size_t)a->ndim * sizeof *a->coef) &&
           !memcmp(a->bias, b->bias, (size_t)a->ndim * sizeof *a->bias);
}

static int build(builder *b, ir_ref node, const imap *m)
{
    for (int i = 0; i < b->n_memo; i++)
        if (b->memo[i].node == node && same_map(&b->memo[i].map, m))
            return b->memo[i].expr;
    const ir_node *n = &b->g->nodes[node];
    int e;
    if (b->mat[node] && node != b->root) {
        int64_t strides[KX_MAX_DIMS];
        contiguous_strides(n->ndim, n->shape, strides);
        e = load(b, node, m, strides);
    } else if (n->op == OP_CONST) {
        e = add_expr(b, (kx_expr){.kind = KX_CONST, .dtype = n->dtype, .value = n->params.value});
    } else {
        switch (ir_ops[n->op].kind) {
        case KIND_ELEMENTWISE: e = build_elementwise(b, n, m); break;
        case KIND_MOVEMENT: e = build_movement(b, node, n, m); break;
        case KIND_REDUCTION: e = build_reduction(b, node, n, m); break;
        default: b->failed = node; e = -1; break;
        }
    }
    if (e < 0) {
        /* A kernel out of buffers splits at the deepest node computed in it. */
        if (b->too_many_buffers && b->failed == IR_NONE && !b->mat[node] && n->op != OP_CONST)
            b->failed = node;
        return -1;
    }
    if (!grow((void **)&b->memo, &b->memo_cap, b->n_memo + 1, sizeof *b->memo)) {
        b->nomem = true;
        return -1;
    }
    b->memo[b->n_memo++] = (memo_entry){node, *m, e};
    return e;
}

/* -- Kernels --------------------------------------------------------------- */

void kx_kernel_free(kx_kernel *k)
{
    if (!k)
        return;
    free(k->exprs);
    free(k->views);
    free(k->reductions);
    free(k->stores);
    free(k->row_stores);
    free(k);
}

static void set_space(kx_kernel *k, int ndim, const int64_t *shape)
{
    k->n_outer = ndim > 0 ? ndim - 1 : 0;
    k->rows = 1;
    for (int d = 0; d < k->n_outer; d++) {
        k->outer[d] = shape[d];
        k->rows *= shape[d];
    }
    k->cols = ndim > 0 ? shape[ndim - 1] : 1;
}

/* e OP row where the last reduction folds e (or e converted): its pass can
 * store e, and the store pass apply OP without computing e again. */
static void stage_store(kx_kernel *k)
{
    if (k->n_stores != 1 || k->n_reductions == 0)
        return;
    kx_store *st = &k->stores[0];
    const kx_expr *s = &k->exprs[st->expr];
    if (s->kind != KX_OP || (s->op != OP_DIV && s->op != OP_MUL && s->op != OP_SUB && s->op != OP_ADD) ||
        !ir_dtype_is_float(s->dtype) || k->views[st->view].dtype != s->dtype || k->views[st->view].inner_stride != 1)
        return;
    int value = s->args[0], row = s->args[1];
    const kx_expr *r = &k->exprs[row];
    if (r->kind == KX_CAST)
        r = &k->exprs[r->args[0]];
    int last = k->n_reductions - 1, folded = k->reductions[last].expr;
    if (k->exprs[folded].kind == KX_CAST)
        folded = k->exprs[folded].args[0];
    if (r->kind != KX_ROW || r->row != last || folded != value || k->exprs[value].dtype != s->dtype)
        return;
    st->staged = true;
    st->stage_value = value;
    st->stage_row = row;
    st->stage_op = s->op;
}

/* An elementwise kernel over few long rows splits each row into pieces, so
 * that rows (what threads share) are many: [rows, cols] becomes
 * [rows, cols/piece, piece] for a piece that divides cols. */
static void split_long_rows(kx_kernel *k)
{
    enum { MIN_ROWS = 64, PIECE = 8192, MIN_PIECE = 1024 };
    if (k->n_reductions || k->n_row_stores || k->rows >= MIN_ROWS || k->cols < 2 * PIECE ||
        k->n_outer == KX_MAX_DIMS)
        return;
    int64_t piece = PIECE;
    while (piece >= MIN_PIECE && k->cols % piece)
        piece /= 2;
    if (piece < MIN_PIECE)
        return;
    k->outer[k->n_outer] = k->cols / piece;
    for (int v = 0; v < k->n_views; v++)
        k->views[v].outer_strides[k->n_outer] = k->views[v].inner_stride * piece;
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

/* A staged store's row is in cache when the store pass writes it: a
 * non-temporal store would evict it (softmax 4096x4096: 17 ms against 12). */
static bool streams(const kx_kernel *k)
{
    int64_t bytes = 0;
    for (int s = 0; s < k->n_stores; s++) {
        const kx_view *v = &k->views[k->stores[s].view];
        if (v->inner_stride != 1 || k->stores[s].staged)
            return false;
        bytes += k->rows * k->cols * (int64_t)ir_dtype_size(v->dtype);
    }
    return bytes >= KX_STREAM_BYTES;
}

/* The kernel computing root; NULL with b->failed set when a node must be
 * materialized first, or b->nomem. */
static kx_kernel *build_kernel(builder *b, ir_ref root)
{
    const ir_node *n = &b->g->nodes[root];
    bool reduces = ir_ops[n->op].kind == KIND_REDUCTION;
    const ir_node *space = reduces ? &b->g->nodes[ir_operands(b->g, n)[0]] : n;
    b->k = calloc(1, sizeof *b->k);
    if (!b->k) {
        b->nomem = true;
        return NULL;
    }
    b->root = root;
    b->root_ndim = space->ndim;
    memcpy(b->root_shape, space->shape, (size_t)space->ndim * sizeof *space->shape);
    set_space(b->k, space->ndim, space->shape);
    b->n_buffers = b->n_memo = 0;
    b->failed = IR_NONE;
    b->too_many_buffers = false;
    imap whole = identity_map(space->ndim);
    int e;
    if (reduces) { /* the reduction's own rows: build it as if a consumer used it */
        imap rows = identity_map(n->ndim);
        if (n->params.keepdim)
            rows.src[n->ndim - 1] = -1, rows.coef[n->ndim - 1] = 0;
        e = build(b, root, &rows);
    } else {
        e = build(b, root, &whole);
    }
    int out = e < 0 ? -1 : add_buffer(b, root);
    kx_kernel *k = b->k;
    bool stored = out >= 0 && (reduces ? grow((void **)&k->row_stores, &k->row_stores_cap, 1, sizeof(kx_row_store))
                                       : grow((void **)&k->views, &k->views_cap, k->n_views + 1, sizeof(kx_view)) &&
                                             grow((void **)&k->stores, &k->stores_cap, 1, sizeof(kx_store)));
    if (!stored) {
        b->nomem |= b->failed == IR_NONE;
        kx_kernel_free(k);
        return NULL;
    }
    if (reduces) {
        k->row_stores[k->n_row_stores++] = (kx_row_store){out, k->n_reductions - 1, n->dtype};
    } else {
        int64_t strides[KX_MAX_DIMS];
        contiguous_strides(n->ndim, n->shape, strides);
        kx_view v = {.buffer = out, .dtype = n->dtype};
        for (int d = 0; d + 1 < n->ndim; d++)
            v.outer_strides[d] = strides[d];
        v.inner_stride = n->ndim ? strides[n->ndim - 1] : 0;
        k->views[k->n_views] = v;
        k->stores[k->n_stores++] = (kx_store){.view = k->n_views++, .expr = cast(b, e, n->dtype)};
    }
    k->n_buffers = b->n_buffers;
    k->in_place = -1;
    k->matmul_product = -1;
    k->transcendental = transcendental(k);
    split_long_rows(k);
    stage_store(k);
    k->streams = streams(k);
    return k;
}

/* -- Which nodes get buffers ----------------------------------------------- */

static bool runs_eagerly(const ir_graph *g, const ir_node *n)
{
    switch (ir_ops[n->op].kind) {
    case KIND_MATMUL: return true;
    case KIND_MOVEMENT: return n->op == OP_CONCAT;
    case KIND_REDUCTION: {
        const ir_node *in = &g->nodes[ir_operands(g, n)[0]];
        return n->op == OP_ARGMAX || n->params.axis == KILN_ALL || n->params.axis != in->ndim - 1;
    }
    case KIND_ELEMENTWISE: return n->op == OP_POW && !ir_dtype_is_float(n->dtype);
    default: return false;
    }
}

static bool is_view(const ir_node *n)
{
    return ir_ops[n->op].kind == KIND_MOVEMENT && n->op != OP_CONCAT;
}

/* An operand of an eager op: a view of a buffer is taken eagerly (a
 * transposed weight reaches BLAS as a transposed view, not a copy). */
static void mark_eager_operand(const ir_graph *g, bool *mat, bool *view, ir_ref r)
{
    mat[r] = true;
    if (!is_view(&g->nodes[r]))
        return;
    view[r] = true;
    mark_eager_operand(g, mat, view, ir_operands(g, &g->nodes[r])[0]);
}

static void mark_materialized(const ir_graph *g, bool *mat, bool *view)
{
    for (ir_ref r = g->count; r-- > 0;) { /* users first: views they take are marked before */
        const ir_node *n = &g->nodes[r];
        bool eager = runs_eagerly(g, n) || view[r];
        mat[r] |= (ir_ops[n->op].kind == KIND_SOURCE && n->op != OP_CONST) || eager;
        for (uint32_t i = 0; eager && i < n->n_operands; i++)
            mark_eager_operand(g, mat, view, ir_operands(g, n)[i]);
    }
    for (int i = 0; i < g->n_outputs; i++)
        mat[g->outputs[i]] = true;
    for (int i = 0; i < g->n_writebacks; i++)
        mat[g->writebacks[i].value] = true;
}

/* -- The whole graph ------------------------------------------------------- */

void lowered_free(lowered *l)
{
    for (int i = 0; i < l->n_steps; i++) {
        kx_kernel_free(l->steps[i].kernel);
        free(l->steps[i].buffers);
    }
    free(l->steps);
    free(l->materialized);
    memset(l, 0, sizeof *l);
}

/* One attempt: a step per materialized node. IR_NONE on success, or the node
 * to materialize before trying again. */
static ir_ref try_lower(builder *b, lowered *out)
{
    const ir_graph *g = b->g;
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        if (!b->mat[r] || ir_ops[n->op].kind == KIND_SOURCE)
            continue;
        lower_step step = {.node = r};
        if (!runs_eagerly(g, n) && !b->eager_view[r]) {
            step.kernel = build_kernel(b, r);
            if (!step.kernel)
                return b->nomem ? r : b->failed;
            step.buffers = malloc((size_t)b->n_buffers * sizeof *step.buffers);
            if (!step.buffers) {
                kx_kernel_free(step.kernel);
                b->nomem = true;
                return r;
            }
            memcpy(step.buffers, b->buffers, (size_t)b->n_buffers * sizeof *b->buffers);
            step.n_inputs = b->n_buffers - 1;
            step.n_outputs = 1;
        }
        lower_step *steps = realloc(out->steps, (size_t)(out->n_steps + 1) * sizeof *steps);
        if (!steps) {
            kx_kernel_free(step.kernel);
            free(step.buffers);
            b->nomem = true;
            return r;
        }
        out->steps = steps;
        out->steps[out->n_steps++] = step;
    }
    return IR_NONE;
}

int lower_graph(const ir_graph *g, const lower_options *o, lowered *out)
{
    memset(out, 0, sizeof *out);
    builder b = {.g = g, .split_sums = o->split_sums};
    b.mat = calloc(g->count ? g->count : 1, sizeof *b.mat);
    b.eager_view = calloc(g->count ? g->count : 1, sizeof *b.eager_view);
    if (!b.mat || !b.eager_view) {
        free(b.mat);
        free(b.eager_view);
        return -1;
    }
    mark_materialized(g, b.mat, b.eager_view);
    for (;;) {
        ir_ref again = try_lower(&b, out);
        if (again == IR_NONE || b.nomem)
            break;
        lowered_free(out);
        if (b.mat[again]) { /* no progress possible: a bug, not user input */
            b.nomem = true;
            break;
        }
        b.mat[again] = true;
    }
    free(b.buffers);
    free(b.memo);
    free(b.eager_view);
    if (b.nomem) {
        lowered_free(out);
        free(b.mat);
        return -1;
    }
    out->materialized = b.mat;
    return 0;
}

/* -- Text ------------------------------------------------------------------ */

char *kx_to_text(const kx_kernel *k)
{
    strbuf t = {0};
    strbuf_put(&t, "kernel rows=%lld cols=%lld outer=[", (long long)k->rows, (long long)k->cols);
    for (int d = 0; d < k->n_outer; d++)
        strbuf_put(&t, d ? ",%lld" : "%lld", (long long)k->outer[d]);
    strbuf_put(&t, "] buffers=%d", k->n_buffers);
    if (k->in_place >= 0)
        strbuf_put(&t, " in_place=b%d", k->in_place);
    if (k->matmul_product >= 0)
        strbuf_put(&t, " matmul_product=b%d", k->matmul_product);
    if (k->streams)
        strbuf_put(&t, " streams");
    strbuf_put(&t, "\n");
    for (int i = 0; i < k->n_views; i++) {
        const kx_view *v = &k->views[i];
        strbuf_put(&t, "view %d = b%d %s offset=%lld strides=[", i, v->buffer, ir_dtype_names[v->dtype],
                  (long long)v->offset);
        for (int d = 0; d < k->n_outer; d++)
            strbuf_put(&t, "%lld,", (long long)v->outer_strides[d]);
        strbuf_put(&t, "%lld]\n", (long long)v->inner_stride);
    }
    for (int i = 0; i < k->n_exprs; i++) {
        const kx_expr *e = &k->exprs[i];
        strbuf_put(&t, "e%d = ", i);
        switch (e->kind) {
        case KX_LOAD: strbuf_put(&t, "load view%d", e->view); break;
        case KX_CONST: strbuf_put(&t, "const %.17g", e->value); break;
        case KX_ROW: strbuf_put(&t, "row r%d", e->row); break;
        case KX_CAST: strbuf_put(&t, "cast e%d", e->args[0]); break;
        case KX_OP:
            strbuf_put(&t, "%s", ir_ops[e->op].name);
            for (int a = 0; a < 3 && e->args[a] >= 0; a++)
                strbuf_put(&t, " e%d", e->args[a]);
            break;
        }
        strbuf_put(&t, " : %s\n", ir_dtype_names[e->dtype]);
    }
    for (int i = 0; i < k->n_reductions; i++)
        strbuf_put(&t, "r%d = %s e%d : %s\n", i, ir_ops[k->reductions[i].op].name,
                  k->reductions[i].expr, ir_dtype_names[k->reductions[i].dtype]);
    for (int i = 0; i < k->n_stores; i++) {
        const kx_store *s = &k->stores[i];
        strbuf_put(&t, "store view%d e%d", s->view, s->expr);
        if (s->staged)
            strbuf_put(&t, " staged e%d %s e%d", s->stage_value, ir_ops[s->stage_op].name, s->stage_row);
        strbuf_put(&t, "\n");
    }
    for (int i = 0; i < k->n_row_stores; i++)
        strbuf_put(&t, "store_row b%d r%d : %s\n", k->row_stores[i].buffer, k->row_stores[i].row,
                  ir_dtype_names[k->row_stores[i].dtype]);
    return strbuf_finish(&t);
}
