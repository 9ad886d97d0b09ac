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
 * what the body reads later, but is not written back.
 *
 * Where the body reads a traced value and the owner allows it, the trace
 * breaks: the graph so far, whose outputs are the value read and every value
 * the rest of the body may still use (the live tracers, the captures'
 * assigned values), goes to the owner, which runs it on real data and gives
 * back the value read. Tracing then goes on in a new graph whose inputs are
 * those values: every live tracer is rebound to its input. Writebacks wait
 * for the last graph, so that nothing is written before the whole call is
 * known. */
#include <stdio.h>
#include <string.h>

#include "trace/trace.h"

typedef struct {
    kiln_tensor *tensor; /* retained */
    ir_ref value;        /* the node holding its current value in the graph, or IR_NONE */
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
    kiln_tensor **tracers; /* the live tracers: each knows its slot */
    int n_tracers, tracers_cap;
    recorder_break_fn on_break; /* NULL: a read fails the trace */
    void *break_ctx;
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

/* Capture i's node in the current graph, made when it has none. */
static ir_ref capture_node(recorder *rec, int i)
{
    capture *c = &rec->captures[i];
    if (c->value == IR_NONE) {
        ir_params params = {.index = i};
        c->value = ir_emit(rec->graph, OP_CAPTURE, c->tensor->dtype, c->tensor->ndim, c->tensor->shape, 0, NULL,
                           &params);
    }
    return c->value;
}

static int capture_index(recorder *rec, kiln_tensor *t)
{
    for (int i = 0; i < rec->n_captures; i++)
        if (rec->captures[i].tensor == t)
            return capture_node(rec, i) == IR_NONE ? -1 : i;
    if (rec->n_captures == rec->cap) {
        int cap = rec->cap ? 2 * rec->cap : 8;
        capture *grown = realloc(rec->captures, (size_t)cap * sizeof *grown);
        if (!grown)
            return -1;
        rec->captures = grown;
        rec->cap = cap;
    }
    rec->captures[rec->n_captures] = (capture){eager_hold(t), IR_NONE, false, 0};
    if (capture_node(rec, rec->n_captures) == IR_NONE) {
        eager_unhold(t);
        return -1;
    }
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

/* -- Tracers ----------------------------------------------------------------- */

/* A new tracer for node, on the list of live ones; NULL with the error set. */
static kiln_tensor *new_tracer(recorder *rec, ir_ref node, kiln_dtype dt, int ndim, const int64_t *shape)
{
    if (rec->n_tracers == rec->tracers_cap) {
        int cap = rec->tracers_cap ? 2 * rec->tracers_cap : 64;
        kiln_tensor **grown = realloc(rec->tracers, (size_t)cap * sizeof *grown);
        if (!grown) {
            core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", rec->base.name);
            return NULL;
        }
        rec->tracers = grown;
        rec->tracers_cap = cap;
    }
    kiln_tensor *t = eager_tracer_new(&rec->base, node, dt, ndim, shape);
    if (t) {
        t->tracer_slot = rec->n_tracers;
        rec->tracers[rec->n_tracers++] = t;
    }
    return t;
}

static void forget(eager_trace *trace, kiln_tensor *t)
{
    recorder *rec = (recorder *)trace;
    kiln_tensor *moved = rec->tracers[--rec->n_tracers];
    rec->tracers[t->tracer_slot] = moved;
    moved->tracer_slot = t->tracer_slot;
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
    return new_tracer(rec, node, dt, ndim, shape);
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

/* -- Graph breaks ------------------------------------------------------------ */

/* Adds node as a carried output of the current graph (after the first, the
 * value read) unless it is one already. */
static int carry(ir_graph *g, ir_ref node)
{
    for (int i = 1; i < g->n_outputs; i++)
        if (g->outputs[i] == node)
            return 0;
    return ir_add_output(g, node);
}

/* The outputs of the graph ending at a read of node: node, then what the
 * rest of the body may use. 0 or -1 (out of memory). */
static int carried_outputs(recorder *rec, ir_ref node)
{
    ir_graph *g = rec->graph;
    int status = ir_add_output(g, node);
    for (int i = 0; status == 0 && i < rec->n_tracers; i++)
        status = carry(g, rec->tracers[i]->node);
    for (int i = 0; status == 0 && i < rec->n_captures; i++)
        if (rec->captures[i].assigned && rec->captures[i].value != IR_NONE)
            status = carry(g, rec->captures[i].value);
    return status;
}

/* A new graph whose inputs are the old one's outputs after the first: every
 * live tracer and assigned capture moves to its input. */
static int start_segment(recorder *rec)
{
    const ir_graph *old = rec->graph;
    ir_graph *g = ir_graph_new();
    ir_ref *moved = calloc(old->count ? old->count : 1, sizeof *moved);
    int status = g && moved ? 0 : -1;
    for (int i = 1; status == 0 && i < old->n_outputs; i++) {
        const ir_node *n = &old->nodes[old->outputs[i]];
        ir_params params = {.index = i - 1};
        moved[old->outputs[i]] = ir_emit(g, OP_INPUT, n->dtype, n->ndim, n->shape, 0, NULL, &params);
        status = moved[old->outputs[i]] == IR_NONE ? -1 : 0;
    }
    if (status < 0) {
        ir_graph_free(g);
        free(moved);
        return -1;
    }
    for (int i = 0; i < rec->n_tracers; i++)
        rec->tracers[i]->node = moved[rec->tracers[i]->node];
    for (int i = 0; i < rec->n_captures; i++) {
        capture *c = &rec->captures[i];
        c->value = c->assigned && c->value != IR_NONE ? moved[c->value] : IR_NONE;
        c->assigned_at = 0;
    }
    free(moved);
    ir_graph_free(rec->graph);
    rec->graph = g;
    rec->n_shape_reads = 0;
    return 0;
}

static kiln_tensor *read(eager_trace *trace, const kiln_tensor *t, const char *fn)
{
    recorder *rec = (recorder *)trace;
    if (!rec->on_break || rec->failure[0]) {
        read_values(trace, fn);
        return NULL;
    }
    bool *shape_read = NULL;
    kiln_tensor **captures = malloc((size_t)(rec->n_captures ? rec->n_captures : 1) * sizeof *captures);
    int status = captures && carried_outputs(rec, t->node) == 0 &&
                 (shape_read = recorder_shape_reads(rec, rec->graph)) ? 0 : -1;
    for (int i = 0; status == 0 && i < rec->n_captures; i++)
        captures[i] = rec->captures[i].tensor;
    kiln_tensor *value = status == 0 ? rec->on_break(rec->break_ctx, rec->graph, captures, rec->n_captures,
                                                     shape_read, fn) : NULL;
    free(captures);
    free(shape_read);
    if (status < 0)
        core_fail(CORE_NOMEM, fn, "out of memory tracing '%s'", trace->name);
    if (value && start_segment(rec) < 0) {
        kiln_release(value);
        value = NULL;
        core_fail(CORE_NOMEM, fn, "out of memory tracing '%s'", trace->name);
    }
    if (!value)
        fail_trace(rec, "%s", kiln_last_error());
    return value;
}

static void destroy(eager_trace *trace)
{
    recorder *rec = (recorder *)trace;
    free(rec->shape_reads);
    free(rec->tracers);
    for (int i = 0; i < rec->n_captures; i++)
        eager_unhold(rec->captures[i].tensor);
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
    rec->base.read = read;
    rec->base.forget = forget;
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
    if (spec->device == KILN_CUDA)
        rec->base.device = KILN_CUDA;
    return new_tracer(rec, node, spec->dtype, spec->ndim, spec->shape);
}

void recorder_set_break(recorder *rec, recorder_break_fn on_break, void *ctx)
{
    rec->on_break = on_break;
    rec->break_ctx = ctx;
}

void recorder_activate(recorder *rec)
{
    eager_trace_activate(rec ? &rec->base : NULL);
}

void recorder_finish(recorder *rec)
{
    eager_trace_activate(NULL);
    eager_trace_finish(&rec->base);
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
