/* Symbolic shapes: a traced graph, whose sizes are the traced call's, made
 * to serve every size of the input dimensions asked to vary.
 *
 * Each such dimension (of size 2 or more: 0 and 1 decide broadcasting) gets
 * a symbol, and every node's shape is derived again from its operands' by
 * its op's rule: broadcasting and matmul's inner size make sizes equal,
 * concat adds them, a reshape's -1 divides the element count. A rule that
 * needs a symbolic size to equal another symbol unites the two; one that
 * needs it to equal a number (broadcast against a fixed size, a reshape to
 * a fixed shape, a slice of part of the axis, a writeback to a captured
 * tensor) specializes it: the dimension keeps its traced size. So does any
 * dimension whose size the body read (kiln_shape, kiln_numel), since the C
 * code may have used it in ways no graph shows. Each change starts the
 * derivation over; there are at most IR_MAX_SYMBOLS symbols to unite or
 * specialize, so it ends. What remains holds for every size of the
 * symbols, and the caller guards a call on exactly what the result's input
 * nodes say: fixed sizes equal, symbols at least 2, a symbol's dimensions
 * equal.
 *
 * The derivation checks itself: every shape it derives must give back the
 * traced shape at the traced sizes, or the symbols involved are
 * specialized. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/internal.h"

enum { MAX_CANDIDATES = 64, WHY = 200 };

typedef struct {
    int input, axis;
    int64_t traced;      /* its size in the traced call */
    int parent;          /* union-find: its class's representative is the root */
    bool specialized;
    char why[WHY];       /* why it was specialized, or which it equals */
} candidate;

typedef struct {
    const ir_graph *g;
    const bool *shape_read;
    candidate c[MAX_CANDIDATES];
    int n;
    int symbol_of[MAX_CANDIDATES]; /* per root: its symbol, or -1 */
    int root_of[IR_MAX_SYMBOLS];   /* per symbol: its root */
    int n_symbols;
    int64_t traced_at[IR_MAX_SYMBOLS];
    ir_sizes sizes;
    int64_t (*shape)[KILN_MAX_DIMS]; /* per node: its derived shape */
    /* A conflict ends a derivation: the symbols to specialize and why, or
     * two to unite. */
    unsigned specialize;
    int unite[2];
    char why[WHY];
} deriver;

static int root(deriver *d, int c)
{
    while (d->c[c].parent != c)
        c = d->c[c].parent;
    return c;
}

/* -- Conflicts -------------------------------------------------------------- */

static bool specialize(deriver *d, unsigned symbols, ir_ref r, const char *why)
{
    if (!d->specialize)
        snprintf(d->why, sizeof d->why, "%s (op %u, %s)", why, r, ir_ops[d->g->nodes[r].op].name);
    d->specialize |= symbols;
    return false;
}

static unsigned symbols_of(deriver *d, int64_t size)
{
    return ir_size_symbols(&d->sizes, size);
}


/* Whether sizes a and b may be one size: equal, or two symbols to unite. */
static bool unify(deriver *d, int64_t a, int64_t b, ir_ref r, const char *why)
{
    if (a == b)
        return true;
    int sa = ir_size_as_symbol(&d->sizes, a), sb = ir_size_as_symbol(&d->sizes, b);
    if (sa >= 0 && sb >= 0) {
        d->unite[0] = sa, d->unite[1] = sb;
        return false;
    }
    return specialize(d, symbols_of(d, a) | symbols_of(d, b), r, why);
}

static int64_t sized(deriver *d, int64_t size, unsigned involved, ir_ref r)
{
    if (size == IR_SIZE_NONE)
        specialize(d, involved, r, "its sizes grow past what a polynomial holds");
    return size;
}

/* -- Rules ------------------------------------------------------------------ */

static const int64_t *shape_of(deriver *d, ir_ref r)
{
    return d->shape[r];
}

/* Broadcasting: per dimension, the operands' sizes other than 1 agree. */
static bool broadcast_rule(deriver *d, ir_ref r, const ir_node *n, int64_t *out)
{
    const ir_ref *ops = ir_operands(d->g, n);
    for (int j = 0; j < n->ndim; j++) {
        out[j] = 1;
        for (uint32_t i = 0; i < n->n_operands; i++) {
            const ir_node *o = &d->g->nodes[ops[i]];
            int k = j - (n->ndim - o->ndim);
            int64_t size = k < 0 ? 1 : shape_of(d, ops[i])[k];
            if (size == 1)
                continue;
            if (out[j] != 1 && !unify(d, out[j], size, r, "a symbolic size meets a fixed one in broadcasting"))
                return false;
            out[j] = size;
        }
    }
    return true;
}

static bool reduction_rule(deriver *d, const ir_node *n, const int64_t *a, int a_ndim, int64_t *out)
{
    int j = 0;
    for (int k = 0; k < a_ndim; k++) {
        bool reduced = n->params.axis == KILN_ALL || n->params.axis == k;
        if (!reduced)
            out[j++] = a[k];
        else if (n->params.keepdim)
            out[j++] = 1;
    }
    (void)d;
    return true;
}

static int64_t product(deriver *d, int ndim, const int64_t *shape, ir_ref r)
{
    unsigned involved = 0;
    for (int k = 0; k < ndim; k++)
        involved |= symbols_of(d, shape[k]);
    return sized(d, ir_shape_product(&d->sizes, ndim, shape), involved, r);
}

static bool reshape_rule(deriver *d, ir_ref r, const ir_node *n, const int64_t *a, int a_ndim, int64_t *out)
{
    int inferred = -1;
    for (int j = 0; j < n->ndim; j++) {
        int32_t from = n->params.perm[j];
        out[j] = n->shape[j];
        if (from == IR_SIZE_INFERRED)
            inferred = j;
        else if (from >= IR_SIZE_FROM)
            out[j] = a[from - IR_SIZE_FROM];
    }
    int64_t count = product(d, a_ndim, a, r);
    if (count == IR_SIZE_NONE)
        return false;
    if (inferred >= 0) {
        out[inferred] = 1;
        int64_t known = product(d, n->ndim, out, r);
        if (known == IR_SIZE_NONE)
            return false;
        out[inferred] = ir_size_div(&d->sizes, count, known);
        if (out[inferred] == IR_SIZE_NONE)
            return specialize(d, symbols_of(d, count) | symbols_of(d, known), r,
                              "a reshape's -1 is not a polynomial of the symbolic sizes");
    }
    int64_t total = product(d, n->ndim, out, r);
    return total != IR_SIZE_NONE &&
           (total == count ||
            specialize(d, symbols_of(d, count) | symbols_of(d, total), r,
                       "a reshape to a fixed shape (pass -1 for the size that varies)"));
}

static bool expand_rule(deriver *d, ir_ref r, const ir_node *n, const int64_t *a, int a_ndim, int64_t *out)
{
    for (int j = 0; j < n->ndim; j++) {
        int k = j - (n->ndim - a_ndim);
        int32_t from = n->params.perm[j];
        out[j] = from >= IR_SIZE_FROM ? a[from - IR_SIZE_FROM] : n->shape[j];
        if (from < IR_SIZE_FROM && k >= 0 && a[k] < 0)
            return specialize(d, symbols_of(d, a[k]), r, "an expand to a fixed size (pass -1 to keep a size)");
    }
    return true;
}

static bool slice_rule(deriver *d, ir_ref r, const ir_node *n, const int64_t *a, int64_t *out)
{
    int axis = n->params.axis;
    const ir_node *traced_a = &d->g->nodes[ir_operands(d->g, n)[0]];
    memcpy(out, a, (size_t)n->ndim * sizeof *out);
    if (a[axis] >= 0) {
        out[axis] = n->shape[axis];
        return true;
    }
    bool whole = n->params.start == 0 && n->params.step == 1 && n->shape[axis] == traced_a->shape[axis];
    return whole || specialize(d, symbols_of(d, a[axis]), r, "a slice of part of a symbolic axis");
}

static bool concat_rule(deriver *d, ir_ref r, const ir_node *n, int64_t *out)
{
    const ir_ref *ops = ir_operands(d->g, n);
    int axis = n->params.axis;
    memcpy(out, shape_of(d, ops[0]), (size_t)n->ndim * sizeof *out);
    unsigned involved = symbols_of(d, out[axis]);
    for (uint32_t i = 1; i < n->n_operands; i++) {
        const int64_t *o = shape_of(d, ops[i]);
        for (int j = 0; j < n->ndim; j++) {
            if (j == axis) {
                involved |= symbols_of(d, o[j]);
                if ((out[j] = sized(d, ir_size_add(&d->sizes, out[j], o[j]), involved, r)) == IR_SIZE_NONE)
                    return false;
            } else if (!unify(d, out[j], o[j], r, "concatenated tensors differ off the axis")) {
                return false;
            }
        }
    }
    return true;
}

static bool matmul_rule(deriver *d, ir_ref r, const ir_node *n, int64_t *out)
{
    const ir_ref *ops = ir_operands(d->g, n);
    const ir_node *an = &d->g->nodes[ops[0]], *bn = &d->g->nodes[ops[1]];
    const int64_t *a = shape_of(d, ops[0]), *b = shape_of(d, ops[1]);
    int64_t k2 = bn->ndim == 1 ? b[0] : b[bn->ndim - 2];
    if (!unify(d, a[an->ndim - 1], k2, r, "a matmul's inner sizes"))
        return false;
    int na = an->ndim > 2 ? an->ndim - 2 : 0, nb = bn->ndim > 2 ? bn->ndim - 2 : 0;
    int batch = na > nb ? na : nb, j = 0;
    for (int k = 0; k < batch; k++) {
        int ka = k - (batch - na), kb = k - (batch - nb);
        int64_t sa = ka < 0 ? 1 : a[ka], sb = kb < 0 ? 1 : b[kb];
        if (sa != 1 && sb != 1 && !unify(d, sa, sb, r, "a matmul's batch sizes"))
            return false;
        out[j++] = sa == 1 ? sb : sa;
    }
    if (an->ndim > 1)
        out[j++] = a[an->ndim - 2];
    if (bn->ndim > 1)
        out[j++] = b[bn->ndim - 1];
    return true;
}

/* A convolution keeps its input's batch; the rest are its traced sizes,
 * from concrete sizes of the input. */
static bool conv_rule(deriver *d, ir_ref r, const ir_node *n, int64_t *out)
{
    const int64_t *x = shape_of(d, ir_operands(d->g, n)[0]);
    unsigned involved = symbols_of(d, x[1]) | symbols_of(d, x[2]) | symbols_of(d, x[3]);
    if (involved)
        return specialize(d, involved, r, "a convolution's windows");
    out[0] = x[0];
    return true;
}

/* cumsum keeps its operand's sizes; top-k takes k along a fixed axis. */
static bool line_rule(deriver *d, ir_ref r, const ir_node *n, const int64_t *a, int64_t *out)
{
    int axis = n->params.axis;
    memcpy(out, a, (size_t)n->ndim * sizeof *out);
    if (n->op != OP_TOPK)
        return true;
    out[axis] = n->shape[axis];
    return a[axis] >= 0 || specialize(d, symbols_of(d, a[axis]), r, "a top-k along a symbolic axis");
}

/* gather has its index's sizes, index_select the operand's with the
 * index's length on the axis, scatter_add the operand's. */
static bool index_rule(deriver *d, const ir_node *n, int64_t *out)
{
    const ir_ref *ops = ir_operands(d->g, n);
    const int64_t *a = shape_of(d, ops[0]), *index = shape_of(d, ops[1]);
    memcpy(out, n->op == OP_GATHER ? index : a, (size_t)n->ndim * sizeof *out);
    if (n->op == OP_INDEX_SELECT)
        out[n->params.axis] = index[0];
    return true;
}

/* Input i's dimension k: its class's symbol, or its traced size. */
static int64_t input_size(deriver *d, int64_t i, int k, int64_t traced)
{
    for (int c = 0; c < d->n; c++)
        if (d->c[c].input == i && d->c[c].axis == k && !d->c[root(d, c)].specialized)
            return ir_size_symbol(&d->sizes, d->symbol_of[root(d, c)]);
    return traced;
}

static bool derive_node(deriver *d, ir_ref r)
{
    const ir_node *n = &d->g->nodes[r];
    int64_t *out = d->shape[r];
    const ir_ref *ops = ir_operands(d->g, n);
    const ir_node *a = n->n_operands ? &d->g->nodes[ops[0]] : NULL;
    const int64_t *as = a ? shape_of(d, ops[0]) : NULL;
    memcpy(out, n->shape, (size_t)n->ndim * sizeof *out);
    switch (ir_ops[n->op].kind) {
    case KIND_SOURCE:
        for (int k = 0; n->op == OP_INPUT && k < n->ndim; k++)
            out[k] = input_size(d, n->params.index, k, n->shape[k]);
        return true;
    case KIND_ELEMENTWISE: return broadcast_rule(d, r, n, out);
    case KIND_REDUCTION: return reduction_rule(d, n, as, a->ndim, out);
    case KIND_MATMUL: return n->op == OP_CONV2D ? conv_rule(d, r, n, out) : matmul_rule(d, r, n, out);
    case KIND_ASSIGN: return true;
    case KIND_LINE: return line_rule(d, r, n, as, out);
    case KIND_INDEX: return index_rule(d, n, out);
    case KIND_MOVEMENT: break;
    }
    switch (n->op) {
    case OP_RESHAPE: return reshape_rule(d, r, n, as, a->ndim, out);
    case OP_EXPAND: return expand_rule(d, r, n, as, a->ndim, out);
    case OP_SLICE: return slice_rule(d, r, n, as, out);
    case OP_CONCAT: return concat_rule(d, r, n, out);
    case OP_PERMUTE:
        for (int j = 0; j < n->ndim; j++)
            out[j] = as[n->params.perm[j]];
        return true;
    default: /* contiguous */
        memcpy(out, as, (size_t)n->ndim * sizeof *out);
        return true;
    }
}

/* Node r's derived shape gives back its traced one at the traced sizes. */
static bool checks_out(deriver *d, ir_ref r)
{
    const ir_node *n = &d->g->nodes[r];
    for (int k = 0; k < n->ndim; k++)
        if (ir_size_eval(&d->sizes, d->shape[r][k], d->traced_at) != n->shape[k])
            return specialize(d, symbols_of(d, d->shape[r][k]), r, "its shape rule disagrees with the trace");
    return true;
}

/* The symbols of node r's shape: the body read it. */
static bool not_read(deriver *d, ir_ref r)
{
    const ir_node *n = &d->g->nodes[r];
    unsigned read = 0;
    for (int k = 0; d->shape_read && d->shape_read[r] && k < n->ndim; k++)
        read |= symbols_of(d, d->shape[r][k]);
    return !read || specialize(d, read, r, "the body read this value's shape (kiln_shape, kiln_numel)");
}

static bool written_back_whole(deriver *d)
{
    for (int w = 0; w < d->g->n_writebacks; w++) {
        ir_ref r = d->g->writebacks[w].value;
        unsigned symbolic = 0;
        for (int k = 0; k < d->g->nodes[r].ndim; k++)
            symbolic |= symbols_of(d, d->shape[r][k]);
        if (symbolic)
            return specialize(d, symbolic, r, "it is written back to a captured tensor of fixed shape");
    }
    return true;
}

/* -- The derivation --------------------------------------------------------- */

static void number_symbols(deriver *d)
{
    d->n_symbols = 0;
    for (int c = 0; c < d->n; c++)
        d->symbol_of[c] = -1;
    for (int c = 0; c < d->n; c++) {
        int top = root(d, c);
        if (d->c[top].specialized || d->symbol_of[top] >= 0)
            continue;
        if (d->n_symbols == IR_MAX_SYMBOLS) {
            d->c[top].specialized = true;
            snprintf(d->c[top].why, WHY, "kiln keeps at most %d symbols", IR_MAX_SYMBOLS);
            continue;
        }
        d->root_of[d->n_symbols] = top;
        d->traced_at[d->n_symbols] = d->c[top].traced;
        d->symbol_of[top] = d->n_symbols++;
    }
}

/* One derivation over the whole graph; false at the first conflict. */
static bool derive(deriver *d)
{
    ir_sizes_free(&d->sizes);
    d->specialize = 0;
    d->unite[0] = d->unite[1] = -1;
    number_symbols(d);
    for (ir_ref r = 0; r < d->g->count; r++)
        if (!derive_node(d, r) || !checks_out(d, r) || !not_read(d, r))
            return false;
    return written_back_whole(d);
}

/* Applies the conflict derive stopped at; false when it names nothing to
 * change (out of memory, or a graph no rule explains). */
static bool resolve(deriver *d)
{
    if (d->unite[0] >= 0) {
        int keep = d->root_of[d->unite[0]], gone = d->root_of[d->unite[1]];
        if (gone < keep) {
            int t = keep;
            keep = gone, gone = t;
        }
        d->c[gone].parent = keep;
        return true;
    }
    for (int s = 0; s < d->n_symbols; s++) {
        if (!(d->specialize & (1u << s)))
            continue;
        candidate *top = &d->c[d->root_of[s]];
        top->specialized = true;
        snprintf(top->why, WHY, "%s", d->why);
    }
    return d->specialize != 0;
}

static void add_candidates(deriver *d, const uint32_t *dynamic)
{
    for (ir_ref r = 0; r < d->g->count; r++) {
        const ir_node *n = &d->g->nodes[r];
        for (int k = 0; n->op == OP_INPUT && dynamic && k < n->ndim; k++) {
            if (!(dynamic[n->params.index] & (1u << k)) || n->shape[k] < 2 || d->n == MAX_CANDIDATES)
                continue;
            d->c[d->n] = (candidate){(int)n->params.index, k, n->shape[k], d->n, false, ""};
            d->n++;
        }
    }
}

/* -- The result ------------------------------------------------------------ */

static void report(deriver *d, strbuf *log)
{
    for (int c = 0; c < d->n; c++) {
        const candidate *x = &d->c[c];
        int top = root(d, c);
        strbuf_put(log, "input %d axis %d (size %lld) ", x->input, x->axis, (long long)x->traced);
        if (d->c[top].specialized)
            strbuf_put(log, "stays fixed: %s\n", d->c[top].why);
        else if (top != c)
            strbuf_put(log, "is s%d, the size of input %d axis %d\n", d->symbol_of[top], d->c[top].input,
                       d->c[top].axis);
        else
            strbuf_put(log, "is symbolic: s%d\n", d->symbol_of[top]);
    }
}

static ir_params unannotated(const ir_node *n)
{
    ir_params p = n->params;
    if (n->op == OP_RESHAPE || n->op == OP_EXPAND)
        memset(p.perm, 0, sizeof p.perm);
    return p;
}

static ir_graph *emit(deriver *d)
{
    const ir_graph *g = d->g;
    ir_graph *out = ir_graph_new();
    ir_ref *map = malloc((g->count ? g->count : 1) * sizeof *map);
    ir_ref *operands = malloc(((size_t)g->n_operands + 1) * sizeof *operands);
    bool ok = out && map && operands && ir_sizes_copy(&out->sizes, &d->sizes) == 0;
    for (ir_ref r = 0; ok && r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        for (uint32_t i = 0; i < n->n_operands; i++)
            operands[i] = map[ir_operands(g, n)[i]];
        ir_params params = unannotated(n);
        map[r] = ir_emit(out, n->op, n->dtype, n->ndim, d->shape[r], (int)n->n_operands, operands, &params);
        ok = map[r] != IR_NONE;
    }
    for (int i = 0; ok && i < g->n_outputs; i++)
        ok = ir_add_output(out, map[g->outputs[i]]) == 0;
    for (int i = 0; ok && i < g->n_writebacks; i++)
        ok = ir_add_writeback(out, g->writebacks[i].capture, map[g->writebacks[i].value]) == 0;
    free(map);
    free(operands);
    if (!ok) {
        ir_graph_free(out);
        return NULL;
    }
    out->n_inputs = g->n_inputs;
    out->n_captures = g->n_captures;
    out->n_symbols = d->n_symbols;
    memcpy(out->traced_at, d->traced_at, sizeof out->traced_at);
    return out;
}

ir_graph *ir_symbolize(const ir_graph *traced, const uint32_t *dynamic, const bool *shape_read, char **log)
{
    deriver d = {.g = traced, .shape_read = shape_read};
    *log = NULL;
    add_candidates(&d, dynamic);
    d.shape = malloc((traced->count ? traced->count : 1) * sizeof *d.shape);
    ir_graph *out = NULL;
    bool derived = false;
    if (d.shape)
        while (!(derived = derive(&d)) && resolve(&d))
            continue;
    if (derived)
        out = emit(&d);
    strbuf text = {0};
    report(&d, &text);
    *log = strbuf_finish(&text);
    free(d.shape);
    ir_sizes_free(&d.sizes);
    return out;
}
