/* Softmax over a lone long row in the two-pass online form, in pieces that
 * threads share.
 *
 * A kernel's rows are what threads (or CUDA blocks) share, and a row's
 * reductions are loops over it: a softmax of one row of 2^24 floats ran on
 * one thread, in three passes over the row (its max; the exponentials,
 * stored and summed; the quotients), each from memory once the row
 * outgrows the caches. Where x - max(x) over one long row reaches only a
 * softmax, a log_softmax or a log-sum-exp (log(sum(exp(x - m))) + m), the
 * row takes the online form instead, which any shift c gives the same
 * value: exp(x - c) / S, x - c - log(S), log(S) + c, for S the sum of
 * exp(x - c). Each piece of the row (a length dividing it, 1024 to 4096)
 * gets its max mp and the sum sp of exp(x - mp), kept as one value, its
 * log-sum-exp l = mp + log(sp): one kernel over the pieces (lower.c makes
 * l its row epilogue), reading x once, each piece rereading itself from
 * L1. The row's shift c is the max of its pieces' l (at least x's max, and
 * within log(piece) of it), and S the sum of exp(l - c). The quotients are
 * then an elementwise kernel over a long row, which lower.c splits into
 * pieces too: x read twice, the output written once, both passes shared by
 * the threads.
 *
 * Accuracy: l and what is made of it are in f64, so that a row of large
 * values loses nothing to l's rounding; c is rounded to x's dtype before S
 * is taken against it, so x - c is the same difference in both; the pieces'
 * sp are sums of at most 4096 exponentials, as a short row's softmax sums
 * (lower.c). A piece all -inf (a masked block of a causal row) takes its
 * shift as the lowest finite value, so it sums exp(-inf) = 0 where
 * -inf - -inf would have made the row NaN; a row all -inf, or with a NaN
 * or +inf, is NaN, as it is eagerly.
 *
 * Exact in real arithmetic, not bit for bit, so the pass runs only where
 * ir_pass_options asks. What it preserves: each node's dtype and shape. Why
 * it ends: the forms it emits reduce the pieces (rows of at most 4096) and
 * the pieces' values (a row at least 1024 times shorter than x's, which a
 * log-sum-exp of f64 rewrites again only where it is itself long). */
#include <float.h>

#include "ir/internal.h"

/* A lone row of at least LONG_ROW is split. Two rows or more measured
 * slower split than in three passes a thread (softmax, 2 threads: 2 rows of
 * 2^20 1.17 ms against 0.85, 32 of 100,000 0.89 against 0.69), the online
 * form computing each exponential twice, and the choice does not depend on
 * the machine's threads, so that kernels precompiled on one machine are
 * the ones another looks up. One row: 2^14 0.006 ms against 0.010, 10^5
 * 0.031 against 0.060, 2^24 5.5 against 13.2. */
enum { LONG_ROW = 16384, MIN_PIECE = 1024, MAX_PIECE = 4096 /* lower.c's ROW_F32_SUM: sums of f32 */ };

/* The length of the pieces that x's row splits into, or 0 where x is not
 * one long row of f32 or f64 of concrete sizes. */
static int64_t piece_of(const ir_node *x)
{
    if ((x->dtype != KILN_F32 && x->dtype != KILN_F64) || x->ndim == 0 || x->ndim == KILN_MAX_DIMS ||
        ir_shape_symbolic(x->ndim, x->shape))
        return 0;
    int64_t cols = x->shape[x->ndim - 1];
    if (cols < LONG_ROW || ir_node_numel(x) != cols)
        return 0;
    return ir_row_piece(cols, MAX_PIECE, MIN_PIECE);
}

/* -- Matching, in the old graph --------------------------------------------- */

/* x less its max over its last axis and what is made of it: m = max(x),
 * d = x - m, e = exp(d), s = sum(e), l = log(s), IR_NONE where the graph
 * has none; reached only by these and by the three forms' roots (closed). */
typedef struct {
    ir_ref x, m, d, e, s, l;
    bool closed;
} shifted_exp;

static bool last_axis_kept(const ir_graph *in, const ir_node *r)
{
    const ir_node *a = &in->nodes[ir_operands(in, r)[0]];
    return a->ndim > 0 && r->params.axis == a->ndim - 1 && r->params.keepdim;
}

static bool operands_are(const ir_graph *in, const ir_node *n, ir_op op, ir_ref a, ir_ref b)
{
    return n->op == op && ir_operands(in, n)[0] == a && ir_operands(in, n)[1] == b;
}

/* Whether node u is a root of the three forms over f. */
static bool root_of(const ir_graph *in, const ir_node *u, const shifted_exp *f)
{
    if (operands_are(in, u, OP_DIV, f->e, f->s))
        return true;
    return f->l != IR_NONE && (operands_are(in, u, OP_SUB, f->d, f->l) || operands_are(in, u, OP_ADD, f->l, f->m) ||
                               operands_are(in, u, OP_ADD, f->m, f->l));
}

/* Whether node u, reading a node of f, is the chain's next or a root. */
static bool read_as_chain(const ir_graph *in, ir_ref u, const shifted_exp *f)
{
    return u == f->d || u == f->e || u == f->s || u == f->l || root_of(in, &in->nodes[u], f);
}

static bool in_family(ir_ref r, const shifted_exp *f)
{
    return r == f->m || r == f->d || r == f->e || r == f->s || r == f->l; /* r is a node: never IR_NONE */
}

/* Finds e, s and l after d, and whether nothing else reads the family (from
 * m on): no other node, no output, no product reading a softmax (attention,
 * which plan.c runs as one kernel with its own online softmax). */
static void find_chain(const ir_graph *in, shifted_exp *f)
{
    f->e = f->s = f->l = IR_NONE;
    f->closed = true;
    for (ir_ref u = f->m + 1; u < in->count; u++) {
        const ir_node *n = &in->nodes[u];
        const ir_ref *ops = ir_operands(in, n);
        if (n->op == OP_EXP && ops[0] == f->d)
            f->e = u;
        else if (n->op == OP_SUM && ops[0] == f->e && f->e != IR_NONE && last_axis_kept(in, n))
            f->s = u;
        else if (n->op == OP_LOG && ops[0] == f->s && f->s != IR_NONE)
            f->l = u;
        for (uint32_t i = 0; i < n->n_operands; i++) {
            bool softmax_read = n->op == OP_MATMUL && root_of(in, &in->nodes[ops[i]], f);
            f->closed &= !softmax_read && (!in_family(ops[i], f) || read_as_chain(in, u, f));
        }
    }
    for (int i = 0; i < in->n_outputs; i++)
        f->closed &= !in_family(in->outputs[i], f);
    for (int i = 0; i < in->n_writebacks; i++)
        f->closed &= !in_family(in->writebacks[i].value, f);
}

/* The family of node d where it is x - max(x) over x's last axis, x one
 * long row (piece_of), its chain reaching a sum at least (every form has
 * one), and closed. */
static bool family_of(const ir_graph *in, ir_ref d, shifted_exp *f)
{
    const ir_node *n = &in->nodes[d];
    if (n->op != OP_SUB)
        return false;
    *f = (shifted_exp){.x = ir_operands(in, n)[0], .m = ir_operands(in, n)[1], .d = d};
    const ir_node *m = &in->nodes[f->m];
    if (m->op != OP_MAX || ir_operands(in, m)[0] != f->x || !last_axis_kept(in, m) || !piece_of(&in->nodes[f->x]))
        return false;
    find_chain(in, f);
    return f->s != IR_NONE && f->closed;
}

/* The operand of r (a node of the new graph) along path: the new graph's
 * nodes mirror the old ones there, the pass rewriting only roots. */
static ir_ref follow(const ir_graph *g, ir_ref r, int steps, const int *path)
{
    for (int i = 0; i < steps; i++)
        r = ir_operands(g, &g->nodes[r])[path[i]];
    return r;
}

/* -- Building, in the new graph ------------------------------------------- */

static ir_ref emit(ir_graph *g, ir_op op, kiln_dtype dt, ir_ref a, ir_ref b, const ir_params *p)
{
    if (a == IR_NONE || b == IR_NONE)
        return IR_NONE;
    ir_node like = g->nodes[a]; /* ir_emit may move g's nodes */
    ir_ref ops[2] = {a, b};
    return ir_emit(g, op, dt, like.ndim, like.shape, ir_ops[op].arity, ops, p);
}

/* op of a and b (which broadcasts to a), or of a alone, shaped as a. */
static ir_ref binary(ir_graph *g, ir_op op, ir_ref a, ir_ref b)
{
    return a == IR_NONE ? IR_NONE : emit(g, op, g->nodes[a].dtype, a, b, NULL);
}

static ir_ref unary(ir_graph *g, ir_op op, ir_ref a)
{
    return binary(g, op, a, a);
}

static ir_ref cast(ir_graph *g, ir_ref a, kiln_dtype dt)
{
    return a == IR_NONE || g->nodes[a].dtype == dt ? a : emit(g, OP_CAST, dt, a, a, NULL);
}

/* op over a's last axis, kept as an axis of 1. */
static ir_ref reduce(ir_graph *g, ir_op op, ir_ref a)
{
    if (a == IR_NONE)
        return IR_NONE;
    ir_node n = g->nodes[a];
    n.shape[n.ndim - 1] = 1;
    ir_params p = {.axis = n.ndim - 1, .keepdim = 1};
    return ir_emit(g, op, n.dtype, n.ndim, n.shape, 1, &a, &p);
}

static ir_ref reshape(ir_graph *g, ir_ref a, int ndim, const int64_t *shape)
{
    return a == IR_NONE ? IR_NONE : ir_emit(g, OP_RESHAPE, g->nodes[a].dtype, ndim, shape, 1, &a, NULL);
}

static ir_ref lowest_finite(ir_graph *g, kiln_dtype dt)
{
    ir_params p = {.value = dt == KILN_F64 ? -DBL_MAX : -FLT_MAX};
    return ir_emit(g, OP_CONST, dt, 0, NULL, 0, NULL, &p);
}


/* The shift c and sum S of x's rows (see the top), in x's dtype, kept as
 * an axis of 1; false where x's rows are not split. */
static bool online(ir_graph *g, ir_ref x, ir_ref *shift, ir_ref *sum)
{
    ir_node n = g->nodes[x];
    int64_t piece = piece_of(&n);
    if (!piece)
        return false;
    n.shape[n.ndim - 1] /= piece;
    n.shape[n.ndim] = piece;
    /* one emit a statement: the nodes' order is the graph's text */
    ir_ref pieces = reshape(g, x, n.ndim + 1, n.shape);
    ir_ref piece_max = reduce(g, OP_MAX, pieces);
    ir_ref lowest = lowest_finite(g, n.dtype);
    ir_ref piece_shift = binary(g, OP_MAXIMUM, piece_max, lowest);
    ir_ref piece_sum = reduce(g, OP_SUM, unary(g, OP_EXP, binary(g, OP_SUB, pieces, piece_shift)));
    ir_ref log_sum = unary(g, OP_LOG, cast(g, piece_sum, KILN_F64));
    ir_ref piece_lse = binary(g, OP_ADD, cast(g, piece_shift, KILN_F64), log_sum);
    ir_ref lse = reshape(g, piece_lse, n.ndim, n.shape); /* [..., pieces] */
    *shift = cast(g, reduce(g, OP_MAX, lse), n.dtype);
    ir_ref scaled = unary(g, OP_EXP, binary(g, OP_SUB, lse, cast(g, *shift, KILN_F64)));
    *sum = cast(g, reduce(g, OP_SUM, scaled), n.dtype);
    return *shift != IR_NONE && *sum != IR_NONE;
}

/* exp(d) / sum(exp(d)): exp(x - c) / S. */
static ir_ref softmax(ir_graph *g, const ir_graph *in, const ir_node *n, const ir_ref *ops)
{
    const ir_node *e = &in->nodes[ir_operands(in, n)[0]];
    shifted_exp f;
    ir_ref shift, sum;
    if (e->op != OP_EXP || !family_of(in, ir_operands(in, e)[0], &f) || f.s != ir_operands(in, n)[1])
        return IR_NONE;
    ir_ref x = follow(g, ops[0], 2, (const int[]){0, 0});
    if (!online(g, x, &shift, &sum))
        return IR_NONE;
    return binary(g, OP_DIV, unary(g, OP_EXP, binary(g, OP_SUB, x, shift)), sum);
}

/* d - log(sum(exp(d))): x - c - log(S). */
static ir_ref log_softmax(ir_graph *g, const ir_graph *in, const ir_node *n, const ir_ref *ops)
{
    shifted_exp f;
    ir_ref shift, sum;
    if (!family_of(in, ir_operands(in, n)[0], &f) || f.l != ir_operands(in, n)[1])
        return IR_NONE;
    ir_ref x = follow(g, ops[0], 1, (const int[]){0});
    if (!online(g, x, &shift, &sum))
        return IR_NONE;
    ir_ref shifted = binary(g, OP_SUB, x, shift);
    return binary(g, OP_SUB, shifted, unary(g, OP_LOG, sum));
}

/* The d of log(sum(exp(d))) at node l, or IR_NONE. */
static ir_ref log_sum_exp_arg(const ir_graph *in, ir_ref l)
{
    const ir_node *n = &in->nodes[l];
    if (n->op != OP_LOG)
        return IR_NONE;
    const ir_node *s = &in->nodes[ir_operands(in, n)[0]];
    if (s->op != OP_SUM)
        return IR_NONE;
    const ir_node *e = &in->nodes[ir_operands(in, s)[0]];
    return e->op == OP_EXP ? ir_operands(in, e)[0] : IR_NONE;
}

/* log(sum(exp(x - m))) + m (either order), m x's max: log(S) + c. */
static ir_ref log_sum_exp(ir_graph *g, const ir_graph *in, const ir_node *n, const ir_ref *ops)
{
    for (int i = 0; i < 2; i++) {
        ir_ref m = ir_operands(in, n)[i], l = ir_operands(in, n)[1 - i], d = log_sum_exp_arg(in, l), shift, sum;
        shifted_exp f;
        if (d == IR_NONE || !family_of(in, d, &f) || f.l != l || f.m != m)
            continue;
        ir_ref x = follow(g, ops[i], 1, (const int[]){0});
        if (!online(g, x, &shift, &sum))
            return IR_NONE;
        return binary(g, OP_ADD, unary(g, OP_LOG, sum), shift);
    }
    return IR_NONE;
}

static ir_ref split_rows(ir_graph *g, const ir_node *n, const ir_ref *ops, void *ctx)
{
    switch (n->op) {
    case OP_DIV: return softmax(g, ctx, n, ops);
    case OP_SUB: return log_softmax(g, ctx, n, ops);
    case OP_ADD: return log_sum_exp(g, ctx, n, ops);
    default: return IR_NONE;
    }
}

int ir_pass_long_rows(ir_graph **g)
{
    int changes = 0;
    ir_graph *next = ir_rebuild(*g, NULL, split_rows, *g, &changes);
    return ir_replace(g, next, changes);
}
