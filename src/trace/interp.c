/* The INTERP backend: the optimised graph run node by node with the eager
 * kernels. It is the reference every compiled backend is checked against.
 *
 * Each value is released after its last use, so memory follows the graph's
 * liveness. Outputs that share storage with an input, a capture or a constant
 * are copied before writebacks run, so outputs are fresh and hold the values
 * of this call whatever happens to the caller's tensors afterwards. */
#include <stdlib.h>
#include <string.h>

#include "trace/trace.h"

struct interp_plan {
    ir_graph *graph;
    kiln_tensor **captures;
    int n_captures;
    kiln_tensor **consts;  /* per node: the 0-d tensor of a const node */
    uint32_t *last_use;    /* per node: the last node reading it; count for kept ones */
    int kernels;
    int64_t peak_bytes;
};

/* -- Planning -------------------------------------------------------------- */

static void plan_liveness(interp_plan *p)
{
    const ir_graph *g = p->graph;
    for (ir_ref r = 0; r < g->count; r++) {
        p->last_use[r] = r;
        const ir_node *n = &g->nodes[r];
        for (uint32_t i = 0; i < n->n_operands; i++)
            p->last_use[ir_operands(g, n)[i]] = r;
    }
    for (int i = 0; i < g->n_outputs; i++)
        p->last_use[g->outputs[i]] = g->count;
    for (int i = 0; i < g->n_writebacks; i++)
        p->last_use[g->writebacks[i].value] = g->count;
}

/* Peak bytes of computed values alive at once (views and sources cost none). */
static void plan_memory(interp_plan *p)
{
    const ir_graph *g = p->graph;
    int64_t live = 0;
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        if (!ir_node_computes(n))
            continue;
        p->kernels++;
        live += ir_node_numel(n) * (int64_t)kiln_dtype_size(n->dtype);
        p->peak_bytes = live > p->peak_bytes ? live : p->peak_bytes;
        for (uint32_t i = 0; i < n->n_operands; i++) {
            ir_ref o = ir_operands(g, n)[i];
            if (p->last_use[o] == r && ir_node_computes(&g->nodes[o]))
                live -= ir_node_numel(&g->nodes[o]) * (int64_t)kiln_dtype_size(g->nodes[o].dtype);
        }
    }
}

static bool plan_consts(interp_plan *p)
{
    for (ir_ref r = 0; r < p->graph->count; r++) {
        const ir_node *n = &p->graph->nodes[r];
        if (n->op != OP_CONST)
            continue;
        kiln_tensor *t = n->params.scalar ? eager_scalar_literal(n->dtype, n->params.value)
                                          : kiln_full(n->dtype, 0, NULL, n->params.value);
        eager_disown(t);
        if (!t)
            return false;
        p->consts[r] = t;
    }
    return true;
}

interp_plan *interp_plan_new(ir_graph *g, kiln_tensor **captures, int n_captures)
{
    interp_plan *p = calloc(1, sizeof *p);
    size_t count = g->count ? g->count : 1;
    if (p) {
        p->graph = g;
        p->captures = captures;
        p->n_captures = n_captures;
        p->consts = calloc(count, sizeof *p->consts);
        p->last_use = malloc(count * sizeof *p->last_use);
    }
    if (!p || !p->consts || !p->last_use || !plan_consts(p)) {
        if (p)
            interp_plan_free(p);
        else {
            ir_graph_free(g);
            for (int i = 0; i < n_captures; i++)
                kiln_release(captures[i]);
            free(captures);
        }
        core_fail(CORE_NOMEM, "kiln_call", "out of memory planning a graph");
        return NULL;
    }
    plan_liveness(p);
    plan_memory(p);
    return p;
}

void interp_plan_free(interp_plan *p)
{
    if (!p)
        return;
    for (ir_ref r = 0; p->consts && r < p->graph->count; r++)
        kiln_release(p->consts[r]);
    for (int i = 0; i < p->n_captures; i++)
        kiln_release(p->captures[i]);
    free(p->captures);
    free(p->consts);
    free(p->last_use);
    ir_graph_free(p->graph);
    free(p);
}

const ir_graph *interp_graph(const interp_plan *p)
{
    return p->graph;
}

int interp_kernels(const interp_plan *p)
{
    return p->kernels;
}

int64_t interp_peak_bytes(const interp_plan *p)
{
    return p->peak_bytes;
}

/* -- Running --------------------------------------------------------------- */

enum { STACK_VALUES = 128, MAX_STACK_OPERANDS = 16 };

static kiln_tensor *run_node(const interp_plan *p, ir_ref r, kiln_tensor *const *in,
                             kiln_tensor **values)
{
    const ir_node *n = &p->graph->nodes[r];
    switch (n->op) {
    case OP_INPUT: return kiln_retain(in[n->params.index]);
    case OP_CAPTURE: return kiln_retain(p->captures[n->params.index]);
    case OP_CONST: return kiln_retain(p->consts[r]);
    default: break;
    }
    kiln_tensor *stack[MAX_STACK_OPERANDS];
    kiln_tensor **operands = n->n_operands <= MAX_STACK_OPERANDS ? stack
                                                                 : malloc(n->n_operands * sizeof *operands);
    if (!operands)
        return NULL;
    for (uint32_t i = 0; i < n->n_operands; i++)
        operands[i] = values[ir_operands(p->graph, n)[i]];
    kiln_tensor *t = eager_dispatch(n, operands);
    if (operands != stack)
        free(operands);
    return t;
}

static void release_dead_operands(const interp_plan *p, ir_ref r, kiln_tensor **values)
{
    const ir_node *n = &p->graph->nodes[r];
    for (uint32_t i = 0; i < n->n_operands; i++) {
        ir_ref o = ir_operands(p->graph, n)[i];
        if (p->last_use[o] == r && values[o]) {
            kiln_release(values[o]);
            values[o] = NULL;
        }
    }
}

static bool shares_caller_storage(const interp_plan *p, kiln_tensor *const *in, const kiln_tensor *t)
{
    for (int i = 0; i < p->graph->n_inputs; i++)
        if (kiln_shares_storage(in[i], t))
            return true;
    for (int i = 0; i < p->n_captures; i++)
        if (kiln_shares_storage(p->captures[i], t))
            return true;
    for (ir_ref r = 0; r < p->graph->count; r++)
        if (p->consts[r] && kiln_shares_storage(p->consts[r], t))
            return true;
    return false;
}

static int take_outputs(const interp_plan *p, kiln_tensor *const *in, kiln_tensor **values,
                        kiln_tensor **out)
{
    const ir_graph *g = p->graph;
    for (int i = 0; i < g->n_outputs; i++) {
        kiln_tensor *t = values[g->outputs[i]];
        bool shared = shares_caller_storage(p, in, t);
        for (int j = 0; j < i && !shared; j++) /* one value returned twice: two tensors */
            shared = kiln_shares_storage(out[j], t);
        out[i] = shared ? eager_copy("kiln_call", t) : kiln_retain(t);
        if (!out[i]) {
            for (int j = 0; j < i; j++)
                out[j] = (kiln_release(out[j]), NULL);
            return -CORE_NOMEM;
        }
    }
    return 0;
}

static int write_back(const interp_plan *p, kiln_tensor **values)
{
    for (int i = 0; i < p->graph->n_writebacks; i++) {
        const ir_writeback *w = &p->graph->writebacks[i];
        int status = kiln_assign(p->captures[w->capture], values[w->value]);
        if (status < 0)
            return status;
    }
    return 0;
}

int interp_run(const interp_plan *p, kiln_tensor *const *in, kiln_tensor **out)
{
    const ir_graph *g = p->graph;
    kiln_tensor *stack[STACK_VALUES];
    kiln_tensor **values = g->count <= STACK_VALUES ? stack : malloc(g->count * sizeof *values);
    if (!values)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory");
    memset(values, 0, g->count * sizeof *values);
    int status = 0;
    for (ir_ref r = 0; r < g->count && status == 0; r++) {
        values[r] = run_node(p, r, in, values);
        if (!values[r])
            status = -CORE_NOMEM; /* the op has set the message */
        else
            release_dead_operands(p, r, values);
    }
    if (status == 0)
        status = take_outputs(p, in, values, out);
    if (status == 0 && (status = write_back(p, values)) < 0)
        for (int i = 0; i < g->n_outputs; i++)
            out[i] = (kiln_release(out[i]), NULL);
    for (ir_ref r = 0; r < g->count; r++)
        kiln_release(values[r]);
    if (values != stack)
        free(values);
    return status;
}

/* -- Constant folding ------------------------------------------------------ */

int interp_eval_const(const ir_node *node, const double *values, const kiln_dtype *dtypes,
                      double *out)
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
