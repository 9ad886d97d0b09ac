/* Graph passes: constant folding, algebraic simplification, dead code.
 *
 * Every pass rebuilds the graph: nodes are re-emitted in order with their
 * operands renamed, and a pass may answer a node with an existing node
 * instead. Re-emitting hash-conses, so each rebuild also merges common
 * subexpressions that a rewrite exposed.
 *
 * What the passes preserve: the values of the outputs and writebacks, bit for
 * bit. Floating-point rewrites are the exact ones only (x*1, x/1, x-0, x+(-0),
 * x**1, -(-x), max(x,x), ...); x*0, x-x and x+0 for floats are rewritten only
 * with fast_math, since NaN, infinities and -0 make them inexact. A rewrite
 * must also keep the node's dtype and shape: x*1 with x an i32 tensor and 1
 * an f64 constant is a conversion to f64, not x. Three passes run only for
 * compiled graphs and keep values to the generated code's rounding, not bit
 * for bit: the transcendental rewrites, (a @ b)ᵀ computed as bᵀ @ aᵀ (the
 * product's sums in another order of tiles), and a lone long row's softmax
 * in the online form (long_rows.c).
 *
 * Why it ends: folding and simplification only ever replace a node by an
 * operand, a constant or a smaller chain, so each round removes nodes or
 * changes nothing; the product's transpose adds two permutes and a product
 * in place of a product and its permute, and a product it made is read
 * untransposed, so it is not rewritten again; ir_optimize stops at the
 * first round without a change (and after 16 rounds whatever happens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/internal.h"

static ir_ref emit_like(ir_graph *out, const ir_node *n, const ir_ref *operands)
{
    return ir_emit(out, n->op, n->dtype, n->ndim, n->shape, (int)n->n_operands, operands, &n->params);
}

/* A copy of in keeping the nodes marked live (all if live is NULL), each
 * offered to rewrite first. Counts rewrites in *changes. */
ir_graph *ir_rebuild(const ir_graph *in, const bool *live, ir_rewrite_fn rewrite, void *ctx,
                     int *changes)
{
    ir_graph *out = ir_graph_new();
    ir_ref *map = malloc((in->count ? in->count : 1) * sizeof *map);
    ir_ref *operands = NULL;
    uint32_t max_operands = 1;
    for (ir_ref r = 0; r < in->count; r++)
        max_operands = in->nodes[r].n_operands > max_operands ? in->nodes[r].n_operands : max_operands;
    operands = malloc(max_operands * sizeof *operands);
    if (!out || !map || !operands || ir_sizes_copy(&out->sizes, &in->sizes) < 0)
        goto fail;
    out->n_symbols = in->n_symbols;
    memcpy(out->traced_at, in->traced_at, sizeof out->traced_at);
    for (ir_ref r = 0; r < in->count; r++) {
        map[r] = IR_NONE;
        if (live && !live[r])
            continue;
        const ir_node *n = &in->nodes[r];
        for (uint32_t i = 0; i < n->n_operands; i++)
            operands[i] = map[ir_operands(in, n)[i]];
        ir_ref replacement = rewrite ? rewrite(out, n, operands, ctx) : IR_NONE;
        if (replacement != IR_NONE)
            (*changes)++;
        map[r] = replacement != IR_NONE ? replacement : emit_like(out, n, operands);
        if (map[r] == IR_NONE)
            goto fail;
    }
    for (int i = 0; i < in->n_outputs; i++)
        if (ir_add_output(out, map[in->outputs[i]]) < 0)
            goto fail;
    for (int i = 0; i < in->n_writebacks; i++)
        if (ir_add_writeback(out, in->writebacks[i].capture, map[in->writebacks[i].value]) < 0)
            goto fail;
    out->n_inputs = in->n_inputs;
    out->n_captures = in->n_captures > out->n_captures ? in->n_captures : out->n_captures;
    free(map);
    free(operands);
    return out;
fail:
    free(map);
    free(operands);
    ir_graph_free(out);
    return NULL;
}

int ir_replace(ir_graph **g, ir_graph *next, int changes)
{
    if (!next)
        return -1;
    ir_graph_free(*g);
    *g = next;
    return changes;
}

uint32_t *ir_count_uses(const ir_graph *g)
{
    uint32_t *uses = calloc(g->count ? g->count : 1, sizeof *uses);
    if (!uses)
        return NULL;
    for (ir_ref r = 0; r < g->count; r++)
        for (uint32_t i = 0; i < g->nodes[r].n_operands; i++)
            uses[ir_operands(g, &g->nodes[r])[i]]++;
    for (int i = 0; i < g->n_outputs; i++)
        uses[g->outputs[i]]++;
    for (int i = 0; i < g->n_writebacks; i++)
        uses[g->writebacks[i].value]++;
    return uses;
}

/* -- Constant folding ------------------------------------------------------ */

static ir_ref fold(ir_graph *out, const ir_node *n, const ir_ref *operands, void *ctx)
{
    ir_eval_fn eval = (ir_eval_fn)ctx;
    if (ir_ops[n->op].kind != KIND_ELEMENTWISE || n->ndim != 0)
        return IR_NONE;
    double values[3];
    kiln_dtype dtypes[3];
    for (uint32_t i = 0; i < n->n_operands; i++) {
        const ir_node *o = &out->nodes[operands[i]];
        if (o->op != OP_CONST || o->params.scalar) /* the evaluator's 0-d tensors promote otherwise */
            return IR_NONE;
        values[i] = o->params.value;
        dtypes[i] = o->dtype;
    }
    ir_params params = {0};
    if (eval(n, values, dtypes, &params.value) < 0)
        return IR_NONE;
    return ir_emit(out, OP_CONST, n->dtype, 0, NULL, 0, NULL, &params);
}

int ir_pass_fold(ir_graph **g, ir_eval_fn eval)
{
    int changes = 0;
    ir_graph *next = ir_rebuild(*g, NULL, fold, (void *)eval, &changes);
    return ir_replace(g, next, changes);
}

/* -- Algebraic simplification ---------------------------------------------- */

static bool is_const(const ir_graph *g, ir_ref r, double v)
{
    const ir_node *n = &g->nodes[r];
    return n->op == OP_CONST && n->params.value == v;
}

static bool is_negative_zero(const ir_graph *g, ir_ref r)
{
    return is_const(g, r, 0) && __builtin_signbit(g->nodes[r].params.value);
}

/* x can stand for n: same dtype and shape, and x promotes as n does (a scalar
 * constant counts for less than the 0-d tensor it would replace). */
static bool same_type(const ir_node *n, const ir_node *x)
{
    bool scalar = x->op == OP_CONST && x->params.scalar;
    return !scalar && n->dtype == x->dtype && n->ndim == x->ndim &&
           !memcmp(n->shape, x->shape, (size_t)n->ndim * sizeof *n->shape);
}

/* x when replacing n by it keeps n's dtype and shape, else nothing. */
static ir_ref keep(const ir_graph *g, const ir_node *n, ir_ref x)
{
    return same_type(n, &g->nodes[x]) ? x : IR_NONE;
}

/* A tensor of n's dtype and shape filled with v: a constant, broadcast. */
static ir_ref filled(ir_graph *g, const ir_node *n, double v)
{
    ir_params params = {.value = v};
    ir_ref c = ir_emit(g, OP_CONST, n->dtype, 0, NULL, 0, NULL, &params);
    if (c == IR_NONE || n->ndim == 0)
        return c;
    return ir_emit(g, OP_EXPAND, n->dtype, n->ndim, n->shape, 1, &c, NULL);
}

typedef struct {
    bool fast_math;
} simplify_ctx;

/* x op c where c is a constant on either side of a commutative op. */
static ir_ref other_if_const(const ir_graph *g, const ir_node *n, const ir_ref *ops, double v)
{
    if (is_const(g, ops[1], v))
        return ops[0];
    if ((ir_ops[n->op].flags & FLAG_COMMUTATIVE) && is_const(g, ops[0], v))
        return ops[1];
    return IR_NONE;
}

static ir_ref simplify_binary(ir_graph *g, const ir_node *n, const ir_ref *ops, bool fast)
{
    bool exact_ints = !ir_dtype_is_float(n->dtype);
    bool loose = exact_ints || fast;
    ir_ref x;
    switch (n->op) {
    case OP_ADD:
        if ((x = other_if_const(g, n, ops, 0)) != IR_NONE &&
            (loose || is_negative_zero(g, x == ops[0] ? ops[1] : ops[0])))
            return keep(g, n, x);
        return IR_NONE;
    case OP_SUB:
        if (is_const(g, ops[1], 0) && (loose || !is_negative_zero(g, ops[1])))
            return keep(g, n, ops[0]);
        return ops[0] == ops[1] && loose ? filled(g, n, 0) : IR_NONE;
    case OP_MUL:
        if ((x = other_if_const(g, n, ops, 1)) != IR_NONE)
            return keep(g, n, x);
        return loose && other_if_const(g, n, ops, 0) != IR_NONE ? filled(g, n, 0) : IR_NONE;
    case OP_DIV:
    case OP_POW:
        return is_const(g, ops[1], 1) ? keep(g, n, ops[0]) : IR_NONE;
    case OP_MAXIMUM:
    case OP_MINIMUM:
        return ops[0] == ops[1] ? keep(g, n, ops[0]) : IR_NONE;
    case OP_EQ:
    case OP_LE:
    case OP_GE:
    case OP_NE:
    case OP_LT:
    case OP_GT:
        if (ops[0] != ops[1] || (ir_dtype_is_float(g->nodes[ops[0]].dtype) && !fast))
            return IR_NONE;
        return filled(g, n, n->op == OP_EQ || n->op == OP_LE || n->op == OP_GE);
    default:
        return IR_NONE;
    }
}

static bool identity_perm(const ir_node *n)
{
    for (int d = 0; d < n->ndim; d++)
        if (n->params.perm[d] != d)
            return false;
    return true;
}

static ir_ref simplify_movement(ir_graph *g, const ir_node *n, const ir_ref *ops)
{
    const ir_node *a = &g->nodes[ops[0]];
    switch (n->op) {
    case OP_CONTIGUOUS:
        return ops[0]; /* values, not layouts: a copy is its operand */
    case OP_RESHAPE:
        if (a->op == OP_RESHAPE) { /* reshape of reshape: one reshape */
            ir_ref inner = ir_operands(g, a)[0]; /* a copy: ir_emit may move the array */
            return ir_emit(g, OP_RESHAPE, n->dtype, n->ndim, n->shape, 1, &inner, NULL);
        }
        return keep(g, n, ops[0]);
    case OP_EXPAND:
        return keep(g, n, ops[0]);
    case OP_PERMUTE:
        if (identity_perm(n))
            return ops[0];
        if (a->op == OP_PERMUTE) { /* permute of permute: one permute */
            ir_params p = {0};
            for (int d = 0; d < n->ndim; d++)
                p.perm[d] = a->params.perm[n->params.perm[d]];
            ir_ref inner = ir_operands(g, a)[0];
            return ir_emit(g, OP_PERMUTE, n->dtype, n->ndim, n->shape, 1, &inner, &p);
        }
        return IR_NONE;
    case OP_SLICE:
        return n->params.start == 0 && n->params.step == 1 ? keep(g, n, ops[0]) : IR_NONE;
    default:
        return IR_NONE;
    }
}

static ir_ref simplify(ir_graph *g, const ir_node *n, const ir_ref *ops, void *ctx)
{
    const simplify_ctx *c = ctx;
    switch (n->op) {
    case OP_NEG:
        return g->nodes[ops[0]].op == OP_NEG ? keep(g, n, ir_operands(g, &g->nodes[ops[0]])[0]) : IR_NONE;
    case OP_CAST:
        return keep(g, n, ops[0]);
    case OP_WHERE:
        return ops[1] == ops[2] ? keep(g, n, ops[1]) : IR_NONE;
    default:
        break;
    }
    if (ir_ops[n->op].kind == KIND_MOVEMENT && n->op != OP_CONCAT)
        return simplify_movement(g, n, ops);
    if (ir_ops[n->op].kind == KIND_ELEMENTWISE && n->n_operands == 2)
        return simplify_binary(g, n, ops, c->fast_math);
    return IR_NONE;
}

int ir_pass_simplify(ir_graph **g, bool fast_math)
{
    simplify_ctx ctx = {fast_math};
    int changes = 0;
    ir_graph *next = ir_rebuild(*g, NULL, simplify, &ctx, &changes);
    return ir_replace(g, next, changes);
}

/* -- Transposed products --------------------------------------------------- *
 * (a @ b)ᵀ over the last two axes, the product read by nothing else, is
 * computed as bᵀ @ aᵀ, so it comes out in the layout its readers walk: a
 * gradient for a tied or transposed weight (train_gpt's embedding, used as
 * the logits' wteᵀ) is otherwise made as [768, 8192] and read transposed,
 * column by column at a power-of-two stride, by every optimizer kernel of
 * the weight. Both operands are then read transposed, which the products
 * pack at no extra cost. The same sums in the same order of k, but a
 * product's rounding is its code's (blocks, threads), not bit for bit, so
 * the pass runs only where ir_pass_options asks. */

typedef struct {
    const ir_graph *in;
    uint32_t *uses; /* per node of in: operand, output and writeback references */
} transpose_ctx;

/* The axis that axis d of ndim comes from when the last two are swapped. */
static int last_two_swapped(int d, int ndim)
{
    return d == ndim - 2 ? d + 1 : d == ndim - 1 ? d - 1 : d;
}

/* Whether n swaps its last two axes and keeps the others. */
static bool swaps_last_two(const ir_node *n)
{
    if (n->ndim < 2)
        return false;
    for (int d = 0; d < n->ndim; d++)
        if (n->params.perm[d] != last_two_swapped(d, n->ndim))
            return false;
    return true;
}

/* x with its last two axes swapped. */
static ir_ref transposed(ir_graph *g, ir_ref x)
{
    const ir_node *n = &g->nodes[x];
    int ndim = n->ndim;
    int64_t shape[KILN_MAX_DIMS];
    ir_params p = {0};
    for (int d = 0; d < ndim; d++) {
        p.perm[d] = last_two_swapped(d, ndim);
        shape[d] = n->shape[p.perm[d]];
    }
    return ir_emit(g, OP_PERMUTE, n->dtype, ndim, shape, 1, &x, &p);
}

static ir_ref transpose_product(ir_graph *g, const ir_node *n, const ir_ref *ops, void *ctx)
{
    const transpose_ctx *c = ctx;
    if (n->op != OP_PERMUTE || !swaps_last_two(n) || c->uses[ir_operands(c->in, n)[0]] != 1)
        return IR_NONE;
    const ir_node *product = &g->nodes[ops[0]];
    if (product->op != OP_MATMUL)
        return IR_NONE;
    ir_ref a = ir_operands(g, product)[0], b = ir_operands(g, product)[1];
    if (g->nodes[a].ndim < 2 || g->nodes[b].ndim < 2)
        return IR_NONE;
    ir_ref swapped[2] = {transposed(g, b), transposed(g, a)};
    if (swapped[0] == IR_NONE || swapped[1] == IR_NONE)
        return IR_NONE;
    return ir_emit(g, OP_MATMUL, n->dtype, n->ndim, n->shape, 2, swapped, NULL);
}

int ir_pass_transpose_products(ir_graph **g)
{
    const ir_graph *in = *g;
    transpose_ctx ctx = {in, ir_count_uses(in)};
    if (!ctx.uses)
        return -1;
    int changes = 0;
    ir_graph *next = ir_rebuild(in, NULL, transpose_product, &ctx, &changes);
    free(ctx.uses);
    return ir_replace(g, next, changes);
}

/* -- Dead code ------------------------------------------------------------- */

int ir_pass_dce(ir_graph **g)
{
    const ir_graph *in = *g;
    bool *live = calloc(in->count ? in->count : 1, sizeof *live);
    if (!live)
        return -1;
    for (int i = 0; i < in->n_outputs; i++)
        live[in->outputs[i]] = true;
    for (int i = 0; i < in->n_writebacks; i++)
        live[in->writebacks[i].value] = true;
    int dead = 0;
    for (ir_ref r = in->count; r-- > 0;) {
        if (!live[r]) {
            dead++;
            continue;
        }
        const ir_node *n = &in->nodes[r];
        for (uint32_t i = 0; i < n->n_operands; i++)
            live[ir_operands(in, n)[i]] = true;
    }
    int changes = 0;
    ir_graph *next = ir_rebuild(in, live, NULL, NULL, &changes);
    free(live);
    return ir_replace(g, next, dead);
}

/* -- All of them ----------------------------------------------------------- */

/* Counts a pass's rewrites, then verifies *g if asked; false on failure (err says why). */
static bool after_pass(int changes, ir_graph *const *g, const ir_pass_options *opt, int *total,
                       char *err, size_t err_size)
{
    if (changes < 0) {
        snprintf(err, err_size, "out of memory optimising the graph");
        return false;
    }
    *total += changes;
    return !opt->verify || ir_verify(*g, err, err_size) == 0;
}

int ir_optimize(ir_graph **g, const ir_pass_options *opt, char *err, size_t err_size)
{
    enum { MAX_ROUNDS = 16 };
    for (int round = 0; round < MAX_ROUNDS; round++) {
        int changes = 0;
        if (opt->eval && !after_pass(ir_pass_fold(g, opt->eval), g, opt, &changes, err, err_size))
            return -1;
        if (opt->transcendental &&
            !after_pass(ir_pass_transcendental(g), g, opt, &changes, err, err_size))
            return -1;
        if (opt->transpose_products &&
            !after_pass(ir_pass_transpose_products(g), g, opt, &changes, err, err_size))
            return -1;
        if (opt->long_rows && !after_pass(ir_pass_long_rows(g), g, opt, &changes, err, err_size))
            return -1;
        if (!after_pass(ir_pass_simplify(g, opt->fast_math), g, opt, &changes, err, err_size) ||
            !after_pass(ir_pass_dce(g), g, opt, &changes, err, err_size))
            return -1;
        if (changes == 0)
            return 0;
    }
    return 0;
}
