/* The recorder: the active trace that turns the body's ops into graph nodes.
 *
 * Operands become nodes on first use: tracers already are; scalar literals
 * become constants; any other eager tensor is captured by reference (one
 * capture per tensor, retained, read afresh on every call). kiln_assign to a
 * captured tensor becomes a writeback, and later reads of that tensor in the
 * body see the assigned value. A body that then reads another view of the
 * same storage, or a traced view taken before the assignment, would see
 * different values eagerly and traced, so the trace fails instead. A tensor
 * the body made itself is a temporary of each call: assigning to it changes
 * what the body reads later, but is not written back. */
#include <stdio.h>
#include <string.h>

#include "trace/trace.h"

typedef struct {
    kiln_tensor *tensor; /* retained */
    ir_ref value;        /* the node holding its current value in the body */
    bool assigned;
    ir_ref assigned_at;  /* graph size at the last assignment: older views are stale */
} capture;

struct recorder {
    eager_trace base; /* first: the eager hooks see this */
    ir_graph *graph;
    capture *captures;
    int n_captures, cap;
    ir_ref *shape_reads; /* nodes whose shapes the body read */
    int n_shape_reads, shape_reads_cap;
    char failure[512]; /* empty while the trace is usable */
};

static void fail_trace(recorder *rec, const char *fmt, const char *detail)
{
    if (!rec->failure[0])
        snprintf(rec->failure, sizeof rec->failure, fmt, detail);
}

/* -- Operands -------------------------------------------------------------- */

static bool shares_assigned_storage(const recorder *rec, const kiln_tensor *t)
{
    for (int i = 0; i < rec->n_captures; i++)
        if (rec->captures[i].assigned && rec->captures[i].tensor != t &&
            kiln_shares_storage(rec->captures[i].tensor, t))
            return true;
    return false;
}

static int capture_index(recorder *rec, kiln_tensor *t)
{
    for (int i = 0; i < rec->n_captures; i++)
        if (rec->captures[i].tensor == t)
            return i;
    if (rec->n_captures == rec->cap) {
        int cap = rec->cap ? 2 * rec->cap : 8;
        capture *grown = realloc(rec->captures, (size_t)cap * sizeof *grown);
        if (!grown)
            return -1;
        rec->captures = grown;
        rec->cap = cap;
    }
    ir_params params = {.index = rec->n_captures};
    ir_ref node = ir_emit(rec->graph, OP_CAPTURE, t->dtype, t->ndim, t->shape, 0, NULL, &params);
    if (node == IR_NONE)
        return -1;
    rec->captures[rec->n_captures] = (capture){kiln_retain(t), node, false, 0};
    return rec->n_captures++;
}

/* A traced view (a chain of movement nodes) of a capture assigned after the
 * view was taken: eagerly the view would show the new values. */
static bool stale_view(const recorder *rec, ir_ref node)
{
    ir_ref start = node;
    const ir_graph *g = rec->graph;
    while (ir_ops[g->nodes[node].op].kind == KIND_MOVEMENT && g->nodes[node].op != OP_CONCAT)
        node = ir_operands(g, &g->nodes[node])[0];
    if (g->nodes[node].op != OP_CAPTURE || node == start)
        return false;
    const kiln_tensor *base = rec->captures[g->nodes[node].params.index].tensor;
    for (int i = 0; i < rec->n_captures; i++)
        if (rec->captures[i].assigned && rec->captures[i].assigned_at > start &&
            kiln_shares_storage(rec->captures[i].tensor, base))
            return true;
    return false;
}

/* The node standing for operand t, or IR_NONE with an error set. */
static ir_ref operand_node(recorder *rec, kiln_tensor *t)
{
    if (t->trace) {
        if (stale_view(rec, t->node))
            fail_trace(rec, "'%s' reads a view taken before the tensor it views was assigned: "
                            "traced code would not see the assignment; take the view after it",
                       rec->base.name);
        return t->node;
    }
    if (t->literal) { /* a scalar operand: i64 (whole), f32 or f64, see elementwise.c */
        ir_params params = {.scalar = 1};
        const void *v = t->storage->data;
        params.value = t->dtype == KILN_I64 ? (double)*(const int64_t *)v
                     : t->dtype == KILN_F32 ? *(const float *)v : *(const double *)v;
        return ir_emit(rec->graph, OP_CONST, t->dtype, 0, NULL, 0, NULL, &params);
    }
    if (shares_assigned_storage(rec, t))
        fail_trace(rec, "'%s' reads a view of a tensor it assigned earlier: traced code would "
                        "see the value from before the assignment; assign to the tensor it reads",
                   rec->base.name);
    int i = capture_index(rec, t);
    return i < 0 ? IR_NONE : rec->captures[i].value;
}

/* -- The eager hooks ------------------------------------------------------- */

static kiln_tensor *record(eager_trace *trace, ir_op op, int n_in, kiln_tensor *const *in,
                           const ir_params *params, kiln_dtype dt, int ndim, const int64_t *shape)
{
    recorder *rec = (recorder *)trace;
    ir_ref stack_refs[8] = {0}, *refs = n_in <= 8 ? stack_refs : malloc((size_t)n_in * sizeof *refs);
    ir_ref node = refs ? 0 : IR_NONE;
    for (int i = 0; refs && i < n_in && node != IR_NONE; i++)
        node = refs[i] = operand_node(rec, in[i]);
    if (node != IR_NONE)
        node = ir_emit(rec->graph, op, dt, ndim, shape, n_in, refs, params);
    if (refs != stack_refs)
        free(refs);
    if (node == IR_NONE) {
        core_fail(CORE_NOMEM, ir_ops[op].name, "out of memory tracing '%s'", trace->name);
        return NULL;
    }
    return eager_tracer_new(trace, node, dt, ndim, shape);
}

/* value converted and broadcast to t's dtype and shape, as kiln_assign does. */
static ir_ref conformed(recorder *rec, ir_ref value, const kiln_tensor *t)
{
    const ir_node *v = &rec->graph->nodes[value];
    if (v->dtype != t->dtype)
        value = ir_emit(rec->graph, OP_CAST, t->dtype, v->ndim, v->shape, 1, &value, NULL);
    if (value == IR_NONE)
        return IR_NONE;
    v = &rec->graph->nodes[value];
    bool same = v->ndim == t->ndim && !memcmp(v->shape, t->shape, (size_t)t->ndim * sizeof *t->shape);
    return same ? value : ir_emit(rec->graph, OP_EXPAND, t->dtype, t->ndim, t->shape, 1, &value, NULL);
}

static int record_assign(eager_trace *trace, kiln_tensor *dst, kiln_tensor *src)
{
    recorder *rec = (recorder *)trace;
    if (dst->trace) { /* eagerly this could write through a view: never drop it silently */
        fail_trace(rec, "kiln_assign to a value traced in '%s' (an input, or a view taken in the "
                        "body): only tensors from outside the body can be assigned; return the new "
                        "value instead",
                   trace->name);
        return core_fail(CORE_STATE, "kiln_assign",
                         "dst is a value traced in '%s': only tensors from outside the body "
                         "(captured) can be assigned; return the new value instead",
                         trace->name);
    }
    ir_ref value = operand_node(rec, src);
    int i = value == IR_NONE ? -1 : capture_index(rec, dst);
    if (i >= 0)
        value = conformed(rec, value, dst);
    if (i < 0 || value == IR_NONE)
        return core_fail(CORE_NOMEM, "kiln_assign", "out of memory tracing '%s'", trace->name);
    rec->captures[i].value = value;
    rec->captures[i].assigned = true;
    rec->captures[i].assigned_at = rec->graph->count;
    return 0;
}

static void read_values(eager_trace *trace, const char *fn)
{
    fail_trace((recorder *)trace,
               "%s read the values of a traced tensor: data-dependent control flow cannot be "
               "traced; select values with kiln_where, or read them outside the marked function",
               fn);
}

static void read_shape(eager_trace *trace, ir_ref node)
{
    recorder *rec = (recorder *)trace;
    if (rec->n_shape_reads == rec->shape_reads_cap) {
        int cap = rec->shape_reads_cap ? 2 * rec->shape_reads_cap : 16;
        ir_ref *grown = realloc(rec->shape_reads, (size_t)cap * sizeof *grown);
        if (!grown) { /* the sizes it read could then vary: no trace at all is safe */
            fail_trace(rec, "%s ran out of memory noting a shape read", trace->name);
            return;
        }
        rec->shape_reads = grown;
        rec->shape_reads_cap = cap;
    }
    rec->shape_reads[rec->n_shape_reads++] = node;
}

static void destroy(eager_trace *trace)
{
    recorder *rec = (recorder *)trace;
    free(rec->shape_reads);
    for (int i = 0; i < rec->n_captures; i++)
        kiln_release(rec->captures[i].tensor);
    free(rec->captures);
    ir_graph_free(rec->graph);
    free(rec);
}

/* -- Life of a trace ------------------------------------------------------- */

recorder *recorder_new(const char *fn_name)
{
    recorder *rec = calloc(1, sizeof *rec);
    if (!rec)
        return NULL;
    rec->graph = ir_graph_new();
    if (!rec->graph) {
        free(rec);
        return NULL;
    }
    atomic_init(&rec->base.refs, 1);
    snprintf(rec->base.name, sizeof rec->base.name, "%s", fn_name);
    rec->base.record = record;
    rec->base.record_assign = record_assign;
    rec->base.read_values = read_values;
    rec->base.read_shape = read_shape;
    rec->base.destroy = destroy;
    return rec;
}

kiln_tensor *recorder_input(recorder *rec, int i, const kiln_spec *spec)
{
    ir_params params = {.index = i};
    ir_ref node = ir_emit(rec->graph, OP_INPUT, spec->dtype, spec->ndim, spec->shape, 0, NULL, &params);
    if (node == IR_NONE) {
        core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", rec->base.name);
        return NULL;
    }
    return eager_tracer_new(&rec->base, node, spec->dtype, spec->ndim, spec->shape);
}

void recorder_activate(recorder *rec)
{
    eager_trace_activate(rec ? &rec->base : NULL);
}

void recorder_finish(recorder *rec)
{
    eager_trace_activate(NULL);
    rec->base.finished = true;
}

int recorder_output(recorder *rec, kiln_tensor *t)
{
    ir_ref node = operand_node(rec, t);
    if (node == IR_NONE || ir_add_output(rec->graph, node) < 0)
        return core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", rec->base.name);
    return 0;
}

const char *recorder_failure(const recorder *rec)
{
    return rec->failure[0] ? rec->failure : NULL;
}

bool *recorder_shape_reads(const recorder *rec, const ir_graph *g)
{
    bool *read = calloc(g->count ? g->count : 1, sizeof *read);
    for (int i = 0; read && i < rec->n_shape_reads; i++)
        read[rec->shape_reads[i]] = true;
    return read;
}

ir_graph *recorder_take_graph(recorder *rec, kiln_tensor ***captures, int *n_captures)
{
    for (int i = 0; i < rec->n_captures; i++)
        if (rec->captures[i].assigned && !rec->captures[i].tensor->born_in_trace &&
            ir_add_writeback(rec->graph, i, rec->captures[i].value) < 0)
            return NULL;
    kiln_tensor **taken = malloc((size_t)(rec->n_captures ? rec->n_captures : 1) * sizeof *taken);
    if (!taken)
        return NULL;
    for (int i = 0; i < rec->n_captures; i++)
        taken[i] = rec->captures[i].tensor;
    *captures = taken;
    *n_captures = rec->n_captures;
    rec->n_captures = 0;
    ir_graph *g = rec->graph;
    rec->graph = NULL;
    return g;
}

void recorder_release(recorder *rec)
{
    eager_trace_release(&rec->base);
}
