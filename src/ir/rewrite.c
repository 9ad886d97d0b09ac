/* Rewrites of compositions of transcendental functions into forms with fewer
 * of them, or without the overflow and cancellation of the composition.
 *
 * Each rule is exact in real arithmetic; none is exact bit for bit, as the
 * simplifier's are, so the pass runs only when ir_pass_options asks. Each
 * result is within the error kiln.h states for the compiled functions it
 * replaces (tests/test_rewrite_math.c measures every rule over a dense
 * sweep of the floats), and most are more accurate than what they replace:
 *
 *   tanh(log(1 + exp(x)))    t / (t + 2), t = e (e + 2), e = min(exp(x), 2^32)
 *   log(1 + exp(x))          max(x, 0) + log1p(exp(-|x|))  (softplus)
 *   log(sigmoid(x))          -(max(-x, 0) + log1p(exp(-|x|)))
 *   exp(log(x))              x >= 0 ? x + 0 : NaN
 *   log(exp(x))              x + 0
 *   1 - sigmoid(x)           sigmoid(-x)   (also as -sigmoid(x) + 1)
 *   1 / (1 + exp(x))         sigmoid(-x)
 *
 * GELU's tanh form, 0.5x(1 + tanh(u)) = x sigmoid(2u), is left as it is:
 * through one exponential it has no cancellation below x = -3, but kiln's
 * f32 tanh is a rational that costs half its exp (measured on AVX-512: a
 * GELU of 2^24 floats took 2x as long either as x sigmoid(2u) or as
 * x / (1 + exp(-2u))).
 *
 * (x + 0 turns -0 into +0, as the composition does.) Past e = 2^32 the
 * quotient is 1 to double precision; clamping e keeps t finite. There is no
 * log1p op: log1p(u) for u in [0, 1] is Goldberg's log(w) u / (w - 1), w =
 * 1 + u (u itself where w rounds to 1), whose quotient restores the low bits
 * of u that 1 + u drops.
 *
 * What it preserves: each node's dtype and shape; a rule fires only where
 * the operand it builds on has the node's dtype (a float) and shape, so no
 * broadcast or promotion changes meaning.
 *
 * Why it ends: a rule removes the composition it matches and emits none
 * that a rule matches. The softplus rule, the one whose output holds its
 * own pattern (log(1 + exp(-|x|))), skips an exp of -|x|; it runs in a
 * second rebuild after the others, so that tanh(log(1 + exp(x))) meets its
 * own rule first. Each round thus removes compositions, of which a graph has
 * finitely many. */
#include <math.h>
#include <string.h>

#include "ir/internal.h"

/* Past this exp(x), tanh(log(1 + exp(x))) rounds to 1 in f32 and f64. */
#define TANH_SOFTPLUS_CLAMP 0x1p32

/* -- Building ------------------------------------------------------------ */

/* Nodes emitted with the dtype and shape of like (a node of the old graph).
 * IR_NONE (out of memory) in any operand gives IR_NONE. */
static ir_ref konst(ir_graph *g, const ir_node *like, double v)
{
    ir_params p = {.value = v};
    return ir_emit(g, OP_CONST, like->dtype, 0, NULL, 0, NULL, &p);
}

static ir_ref op1(ir_graph *g, const ir_node *like, ir_op op, ir_ref a)
{
    if (a == IR_NONE)
        return IR_NONE;
    return ir_emit(g, op, like->dtype, like->ndim, like->shape, 1, &a, NULL);
}

static ir_ref op2(ir_graph *g, const ir_node *like, ir_op op, ir_ref a, ir_ref b)
{
    ir_ref ops[2] = {a, b};
    if (a == IR_NONE || b == IR_NONE)
        return IR_NONE;
    kiln_dtype dt = ir_ops[op].rule == RULE_COMPARE ? KILN_BOOL : like->dtype;
    return ir_emit(g, op, dt, like->ndim, like->shape, 2, ops, NULL);
}

static ir_ref op2c(ir_graph *g, const ir_node *like, ir_op op, ir_ref a, double c)
{
    return op2(g, like, op, a, konst(g, like, c));
}

/* log1p(exp(-|x|)), accurate where exp(-|x|) is tiny (see the top). */
static ir_ref log1p_exp_neg_abs(ir_graph *g, const ir_node *like, ir_ref x)
{
    ir_ref u = op1(g, like, OP_EXP, op1(g, like, OP_NEG, op1(g, like, OP_ABS, x)));
    ir_ref w = op2c(g, like, OP_ADD, u, 1);
    ir_ref goldberg = op2(g, like, OP_MUL, op1(g, like, OP_LOG, w),
                          op2(g, like, OP_DIV, u, op2c(g, like, OP_SUB, w, 1)));
    ir_ref rounded_away = op2c(g, like, OP_EQ, w, 1);
    if (rounded_away == IR_NONE || goldberg == IR_NONE)
        return IR_NONE;
    ir_ref ops[3] = {rounded_away, u, goldberg};
    return ir_emit(g, OP_WHERE, like->dtype, like->ndim, like->shape, 3, ops, NULL);
}

/* -- Matching ------------------------------------------------------------ */

static bool is_value(const ir_graph *g, ir_ref r, double v)
{
    return g->nodes[r].op == OP_CONST && g->nodes[r].params.value == v;
}

/* r's value has n's dtype and shape. */
static bool fits(const ir_graph *g, ir_ref r, const ir_node *n)
{
    if (r == IR_NONE)
        return false;
    const ir_node *a = &g->nodes[r];
    return a->dtype == n->dtype && a->ndim == n->ndim &&
           !memcmp(a->shape, n->shape, (size_t)n->ndim * sizeof *n->shape);
}

/* x for r = op(x), x shaped and typed like n. */
static ir_ref unary_of(const ir_graph *g, ir_ref r, ir_op op, const ir_node *n)
{
    if (g->nodes[r].op != op)
        return IR_NONE;
    ir_ref x = ir_operands(g, &g->nodes[r])[0];
    return fits(g, x, n) ? x : IR_NONE;
}

/* a for a node r = op(a, c) or op(c, a) (commutative ops) with c == v, of n's dtype. */
static ir_ref with_const(const ir_graph *g, ir_ref r, ir_op op, double v, const ir_node *n)
{
    const ir_node *a = &g->nodes[r];
    if (a->op != op || a->dtype != n->dtype)
        return IR_NONE;
    const ir_ref *ops = ir_operands(g, a);
    if (is_value(g, ops[1], v))
        return ops[0];
    if ((ir_ops[op].flags & FLAG_COMMUTATIVE) && is_value(g, ops[0], v))
        return ops[1];
    return IR_NONE;
}

/* x for r = exp(x) + 1, x shaped and typed like n. */
static ir_ref one_plus_exp(const ir_graph *g, ir_ref r, const ir_node *n)
{
    ir_ref e = with_const(g, r, OP_ADD, 1, n);
    return e == IR_NONE ? IR_NONE : unary_of(g, e, OP_EXP, n);
}

/* -- Rules --------------------------------------------------------------- */

static ir_ref tanh_of_softplus(ir_graph *g, const ir_node *n, ir_ref arg)
{
    ir_ref y = unary_of(g, arg, OP_LOG, n);
    if (y == IR_NONE || one_plus_exp(g, y, n) == IR_NONE)
        return IR_NONE;
    ir_ref e = with_const(g, y, OP_ADD, 1, n);
    e = op2c(g, n, OP_MINIMUM, e, TANH_SOFTPLUS_CLAMP);
    ir_ref t = op2(g, n, OP_MUL, e, op2c(g, n, OP_ADD, e, 2));
    return op2(g, n, OP_DIV, t, op2c(g, n, OP_ADD, t, 2));
}

static ir_ref softplus(ir_graph *g, const ir_node *n, ir_ref arg)
{
    ir_ref x = one_plus_exp(g, arg, n);
    if (x == IR_NONE)
        return IR_NONE;
    ir_ref abs = unary_of(g, x, OP_NEG, n);
    if (abs != IR_NONE && g->nodes[abs].op == OP_ABS) /* the log1p form this emits */
        return IR_NONE;
    return op2(g, n, OP_ADD, op2c(g, n, OP_MAXIMUM, x, 0), log1p_exp_neg_abs(g, n, x));
}

/* -softplus(-x), so that the -0 of x past 104 comes out as it rounds. */
static ir_ref log_sigmoid(ir_graph *g, const ir_node *n, ir_ref arg)
{
    ir_ref x = unary_of(g, arg, OP_SIGMOID, n);
    if (x == IR_NONE)
        return IR_NONE;
    ir_ref softplus_neg = op2(g, n, OP_ADD, op2c(g, n, OP_MAXIMUM, op1(g, n, OP_NEG, x), 0),
                              log1p_exp_neg_abs(g, n, x));
    return op1(g, n, OP_NEG, softplus_neg);
}

static ir_ref exp_of_log(ir_graph *g, const ir_node *n, ir_ref arg)
{
    ir_ref x = unary_of(g, arg, OP_LOG, n);
    if (x == IR_NONE)
        return IR_NONE;
    ir_ref ops[3] = {op2c(g, n, OP_GE, x, 0), op2c(g, n, OP_ADD, x, 0), konst(g, n, NAN)};
    if (ops[0] == IR_NONE || ops[1] == IR_NONE || ops[2] == IR_NONE)
        return IR_NONE;
    return ir_emit(g, OP_WHERE, n->dtype, n->ndim, n->shape, 3, ops, NULL);
}

static ir_ref log_of_exp(ir_graph *g, const ir_node *n, ir_ref arg)
{
    ir_ref x = unary_of(g, arg, OP_EXP, n);
    return x == IR_NONE ? IR_NONE : op2c(g, n, OP_ADD, x, 0);
}

/* 1 - sigmoid(x), -sigmoid(x) + 1 and 1 / (1 + exp(x)): sigmoid(-x). */
static ir_ref sigmoid_of_neg(ir_graph *g, const ir_node *n, const ir_ref *ops)
{
    ir_ref x = IR_NONE, s;
    if (n->op == OP_SUB && is_value(g, ops[0], 1))
        x = unary_of(g, ops[1], OP_SIGMOID, n);
    else if (n->op == OP_DIV && is_value(g, ops[0], 1))
        x = one_plus_exp(g, ops[1], n);
    else if (n->op == OP_ADD && (is_value(g, ops[0], 1) || is_value(g, ops[1], 1)) &&
             (s = unary_of(g, ops[is_value(g, ops[0], 1)], OP_NEG, n)) != IR_NONE)
        x = unary_of(g, s, OP_SIGMOID, n);
    return x == IR_NONE ? IR_NONE : op1(g, n, OP_SIGMOID, op1(g, n, OP_NEG, x));
}

/* -- The pass ------------------------------------------------------------ */

static ir_ref compositions(ir_graph *g, const ir_node *n, const ir_ref *ops, void *ctx)
{
    (void)ctx;
    if (!ir_dtype_is_float(n->dtype))
        return IR_NONE;
    switch (n->op) {
    case OP_TANH: return tanh_of_softplus(g, n, ops[0]);
    case OP_LOG: {
        ir_ref r = log_sigmoid(g, n, ops[0]);
        return r != IR_NONE ? r : log_of_exp(g, n, ops[0]);
    }
    case OP_EXP: return exp_of_log(g, n, ops[0]);
    case OP_ADD:
    case OP_SUB:
    case OP_DIV: return sigmoid_of_neg(g, n, ops);
    default: return IR_NONE;
    }
}

static ir_ref softplus_rule(ir_graph *g, const ir_node *n, const ir_ref *ops, void *ctx)
{
    (void)ctx;
    return n->op == OP_LOG && ir_dtype_is_float(n->dtype) ? softplus(g, n, ops[0]) : IR_NONE;
}

int ir_pass_transcendental(ir_graph **g)
{
    int changes = 0;
    ir_graph *next = ir_rebuild(*g, NULL, compositions, NULL, &changes);
    if (ir_replace(g, next, changes) < 0 || ir_pass_dce(g) < 0)
        return -1;
    next = ir_rebuild(*g, NULL, softplus_rule, NULL, &changes);
    return ir_replace(g, next, changes);
}
