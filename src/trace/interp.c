/* The node-by-node interpreter: one graph node run with the eager ops on its
 * operands' values. The INTERP backend runs a whole graph so (the reference
 * every compiled backend is checked against); a compiled plan runs the nodes
 * its kernels leave to eager (matmul through BLAS, concat, ...) so. */
#include <stdlib.h>

#include "trace/trace.h"

enum { MAX_STACK_OPERANDS = 16 };

kiln_tensor **interp_consts(const ir_graph *g, kiln_device device)
{
    kiln_tensor **consts = calloc(g->count ? g->count : 1, sizeof *consts);
    if (!consts)
        core_fail_status(CORE_NOMEM, "kiln_call");
    for (ir_ref r = 0; consts && r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        if (n->op != OP_CONST)
            continue;
        kiln_tensor *t = n->params.scalar ? eager_scalar_literal(n->dtype, n->params.value)
                                          : kiln_full(n->dtype, 0, NULL, n->params.value);
        eager_disown(t);
        if (t && device == KILN_CUDA) { /* folded constants are expanded and fed to ops like any value */
            kiln_tensor *moved = kiln_to_device(t, KILN_CUDA);
            eager_disown(moved);
            if (moved)
                moved->literal = t->literal;
            kiln_release(t);
            t = moved;
        }
        consts[r] = t;
        if (!t) {
            interp_consts_free(g, consts);
            return NULL;
        }
    }
    return consts;
}

void interp_consts_free(const ir_graph *g, kiln_tensor **consts)
{
    for (ir_ref r = 0; consts && r < g->count; r++)
        kiln_release(consts[r]);
    free(consts);
}

kiln_tensor *interp_source(const ir_graph *g, ir_ref r, const interp_sources *s)
{
    const ir_node *n = &g->nodes[r];
    switch (n->op) {
    case OP_INPUT: return s->inputs[n->params.index];
    case OP_CAPTURE: return s->captures[n->params.index];
    case OP_CONST: return s->consts[r];
    default: return NULL;
    }
}

kiln_tensor *interp_node(const ir_graph *g, ir_ref r, const interp_sources *s, kiln_tensor *const *values)
{
    const ir_node *n = &g->nodes[r];
    if (ir_ops[n->op].flags & FLAG_RANDOM)
        return eager_random(n, s->stream, s->rng_base, s->device);
    kiln_tensor *stack[MAX_STACK_OPERANDS] = {NULL};
    kiln_tensor **operands = n->n_operands <= MAX_STACK_OPERANDS ? stack : malloc(n->n_operands * sizeof *operands);
    if (!operands) {
        core_fail_status(CORE_NOMEM, "kiln_call");
        return NULL;
    }
    for (uint32_t i = 0; i < n->n_operands; i++)
        operands[i] = values[ir_operands(g, n)[i]];
    ir_node concrete = *n; /* a reshape's or expand's target, say, in this call's sizes */
    kiln_tensor *t = NULL;
    if (!ir_shape_symbolic(n->ndim, n->shape) || ir_shape_eval(&g->sizes, n->ndim, n->shape, s->symbols, concrete.shape))
        t = eager_dispatch(&concrete, operands);
    else
        (void)core_internal("kiln_call", "node %u's shape does not evaluate for this call's sizes", r);
    if (operands != stack)
        free(operands);
    return t;
}
