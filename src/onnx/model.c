/* kiln_onnx_load: an ONNX model read, checked whole (ops, attributes, dtypes,
 * values defined once and before use, no cycles), and made a marked function
 * whose body runs the nodes as kiln ops. Nodes whose operands are all
 * constants run eagerly even while the body is traced (the trace paused), so
 * Shape, ConstantOfShape and the arithmetic on shapes fold away and their
 * values can be read: Reshape's shape, Slice's bounds. */
#include <stdarg.h>
#include <string.h>

#include "onnx/onnx.h"

enum { MIN_OPSET = 1, MAX_OPSET = 17 };
static const char *const load_fn = "kiln_onnx_load";
static _Thread_local onnx_load_times last_times;

onnx_load_times onnx_last_load_times(void)
{
    return last_times;
}

/* -- Messages ---------------------------------------------------------------- */

static const char *node_name(const onnx_node *node)
{
    return node->proto->name && *node->proto->name ? node->proto->name : "(unnamed)";
}

static int fail_node_v(const char *fn, const onnx_model *m, const onnx_node *node, int status, const char *fmt,
                       va_list ap)
{
    char what[768];
    vsnprintf(what, sizeof what, fmt, ap);
    return core_fail(status, fn, "'%s': node %d '%s' (%s): %s", m->name, (int)(node - m->nodes), node_name(node),
                     node->proto->op_type, what);
}

int onnx_fail_node(const char *fn, const onnx_model *m, const onnx_node *node, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = fail_node_v(fn, m, node, status, fmt, ap);
    va_end(ap);
    return rc;
}

int onnx_fail(const onnx_call *c, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = fail_node_v("kiln_onnx", c->m, c->node, status, fmt, ap);
    va_end(ap);
    return rc;
}

/* -- The model's values by name ----------------------------------------------- */

typedef struct {
    const char **names;
    int *slots; /* value index + 1, 0 empty */
    size_t mask;
    int n, cap;
} name_table;

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211u;
    return h;
}

static int table_init(name_table *t, int cap)
{
    size_t slots = 16;
    while (slots < (size_t)cap * 2)
        slots *= 2;
    t->names = calloc((size_t)cap + 1, sizeof *t->names);
    t->slots = calloc(slots, sizeof *t->slots);
    t->mask = slots - 1;
    t->n = 0;
    t->cap = cap;
    return t->names && t->slots ? 0 : core_fail_status(CORE_NOMEM, load_fn);
}

/* The value named name, or -1; with add, a new one (*added set) when none. */
static int table_find(name_table *t, const char *name, bool add, bool *added)
{
    size_t i = hash_name(name) & t->mask;
    for (; t->slots[i]; i = (i + 1) & t->mask)
        if (!strcmp(t->names[t->slots[i] - 1], name))
            return t->slots[i] - 1;
    if (!add || t->n == t->cap)
        return -1;
    t->names[t->n] = name;
    t->slots[i] = ++t->n;
    if (added)
        *added = true;
    return t->n - 1;
}

/* -- Freeing ------------------------------------------------------------------ */

static void model_free(void *p)
{
    onnx_model *m = p;
    if (!m)
        return;
    for (int i = 0; m->constants && i < m->n_values; i++)
        kiln_release(m->constants[i]);
    for (int i = 0; m->cuda_constants && i < m->n_values; i++)
        kiln_release(m->cuda_constants[i]);
    free(m->cuda_constants);
    pthread_mutex_destroy(&m->lock);
    for (int k = 0; m->nodes && k < m->n_nodes; k++) {
        free(m->nodes[k].in);
        free(m->nodes[k].out);
    }
    free(m->constants);
    free(m->nodes);
    free(m->value_names);
    free(m->inputs);
    free(m->outputs);
    free(m->last_use);
    if (m->proto)
        onnx__model_proto__free_unpacked(m->proto, NULL);
    free(m);
}

/* -- Checking ----------------------------------------------------------------- */

static int check_opset(onnx_model *m)
{
    const Onnx__ModelProto *p = m->proto;
    m->opset = -1;
    for (size_t i = 0; i < p->n_opset_import; i++) {
        const char *domain = p->opset_import[i]->domain;
        if (!domain || !*domain || !strcmp(domain, "ai.onnx"))
            m->opset = (int)p->opset_import[i]->version;
    }
    if (m->opset < 0)
        return core_fail(CORE_FORMAT, load_fn, "'%s': the model imports no opset of the default domain", m->name);
    if (m->opset < MIN_OPSET || m->opset > MAX_OPSET)
        return core_fail(CORE_UNSUPPORTED, load_fn, "'%s': opset %d is not supported (kiln reads %d to %d)", m->name,
                         m->opset, MIN_OPSET, MAX_OPSET);
    return 0;
}

/* A graph input's or output's declared type: a tensor of a dtype kiln has,
 * at most KILN_MAX_DIMS sizes, none negative or past 2^59. */
static int check_value_info(const onnx_model *m, const Onnx__ValueInfoProto *v, const char *role)
{
    const char *name = v->name ? v->name : "";
    if (!v->type)
        return 0;
    if (v->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        return core_fail(CORE_UNSUPPORTED, load_fn, "'%s': %s '%s' is not a tensor (sequences, maps and optionals "
                         "are not supported)", m->name, role, name);
    const Onnx__TypeProto__Tensor *t = v->type->tensor_type;
    kiln_dtype dt;
    if (t->has_elem_type && !onnx_kiln_dtype(t->elem_type, &dt))
        return core_fail(CORE_UNSUPPORTED, load_fn, "'%s': %s '%s' has element type %s; kiln has FLOAT, DOUBLE, "
                         "INT32, INT64 and BOOL", m->name, role, name, onnx_type_name(t->elem_type));
    if (!t->shape)
        return 0;
    if (t->shape->n_dim > KILN_MAX_DIMS)
        return core_fail(CORE_UNSUPPORTED, load_fn, "'%s': %s '%s' has %zu dimensions (kiln has at most %d)", m->name,
                         role, name, t->shape->n_dim, KILN_MAX_DIMS);
    for (size_t d = 0; d < t->shape->n_dim; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = t->shape->dim[d];
        if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
            (dim->dim_value < 0 || dim->dim_value > (INT64_C(1) << 59)))
            return core_fail(CORE_FORMAT, load_fn, "'%s': %s '%s' declares size %lld in dimension %zu", m->name, role,
                             name, (long long)dim->dim_value, d);
    }
    return 0;
}

static int check_attributes(const onnx_model *m, const onnx_node *node)
{
    for (size_t i = 0; i < node->proto->n_attribute; i++) {
        const Onnx__AttributeProto *a = node->proto->attribute[i];
        const char *name = a->name ? a->name : "";
        size_t len = strlen(name);
        const char *at = node->op->attrs;
        bool known = false;
        for (const char *hit; len && (hit = strstr(at, name)); at = hit + 1)
            if ((hit == node->op->attrs || hit[-1] == ' ') && hit[len] == ' ') {
                known = true;
                break;
            }
        if (!known)
            return onnx_fail_node(load_fn, m, node, CORE_UNSUPPORTED, "attribute '%s' is not supported", name);
    }
    return 0;
}

/* The node's op and operand counts, before any value is looked up. */
static int check_node(const onnx_model *m, onnx_node *node)
{
    const Onnx__NodeProto *p = node->proto;
    const char *domain = p->domain ? p->domain : "";
    if (*domain && strcmp(domain, "ai.onnx"))
        return onnx_fail_node(load_fn, m, node, CORE_UNSUPPORTED, "operators of domain '%s' are not supported", domain);
    node->op = onnx_find_op(p->op_type);
    if (!node->op)
        return onnx_fail_node(load_fn, m, node, CORE_UNSUPPORTED, "operator %s is not supported", p->op_type);
    if ((int)p->n_input < node->op->min_in || (int)p->n_input > node->op->max_in)
        return onnx_fail_node(load_fn, m, node, CORE_FORMAT, "%zu operands; %s takes %d to %d", p->n_input,
                              p->op_type, node->op->min_in, node->op->max_in);
    if ((int)p->n_output < node->op->min_out || (int)p->n_output > node->op->max_out)
        return onnx_fail_node(load_fn, m, node, CORE_FORMAT, "%zu results; %s gives %d to %d", p->n_output,
                              p->op_type, node->op->min_out, node->op->max_out);
    return check_attributes(m, node);
}

/* -- Building the model --------------------------------------------------------- */

/* Values: the graph's inputs, its initializers, then each node's results,
 * each defined once. */
/* One block for the float weights the mapping holds (onnx_arena_floats), a
 * new reference; NULL where there are none (or no memory: each is made alone). */
static kiln_tensor *weights_arena(const Onnx__GraphProto *g, const onnx_mapped *mf)
{
    int64_t floats = 0;
    for (size_t i = 0; i < g->n_initializer; i++)
        floats += (int64_t)onnx_arena_floats(g->initializer[i], onnx_mapped_raw(mf, i));
    kiln_tensor *arena = floats ? eager_empty(load_fn, KILN_CPU, KILN_F32, 1, &floats) : NULL;
    if (!arena)
        kiln_clear_error();
    return arena;
}

/* Initializer i as a new tensor no scope owns, in the arena where it fits
 * there (at, in floats, moves past it). */
static kiln_tensor *initializer(const Onnx__GraphProto *g, size_t i, const onnx_mapped *mf, kiln_tensor *arena,
                                int64_t *at)
{
    const char *name = g->initializer[i]->name ? g->initializer[i]->name : "";
    const ProtobufCBinaryData *raw = onnx_mapped_raw(mf, i);
    size_t floats = arena ? onnx_arena_floats(g->initializer[i], raw) : 0;
    if (!floats)
        return onnx_tensor_to_kiln(load_fn, name, g->initializer[i], raw);
    *at += (int64_t)floats;
    return onnx_arena_tensor(load_fn, name, arena, *at - (int64_t)floats, g->initializer[i], raw);
}

static int define_values(onnx_model *m, name_table *t, int *defined_by, const onnx_mapped *mf)
{
    const Onnx__GraphProto *g = m->proto->graph;
    double start = core_now_ms();
    kiln_tensor *arena = weights_arena(g, mf);
    int64_t at = 0;
    for (size_t i = 0; i < g->n_initializer; i++) {
        bool added = false;
        const char *name = g->initializer[i]->name ? g->initializer[i]->name : "";
        int v = table_find(t, name, true, &added);
        if (!added) {
            kiln_release(arena);
            return core_fail(CORE_FORMAT, load_fn, "'%s': initializer '%s' is given twice", m->name, name);
        }
        defined_by[v] = -1;
        if (!(m->constants[v] = initializer(g, i, mf, arena, &at))) {
            kiln_release(arena);
            return core_error_status();
        }
    }
    kiln_release(arena);
    last_times.tensors_ms = core_now_ms() - start;
    for (size_t i = 0; i < g->n_input; i++) {
        const char *name = g->input[i]->name ? g->input[i]->name : "";
        bool added = false;
        int v = table_find(t, name, true, &added);
        if (!added && !m->constants[v])
            return core_fail(CORE_FORMAT, load_fn, "'%s': input '%s' is given twice", m->name, name);
        if (check_value_info(m, g->input[i], "input") < 0)
            return core_error_status();
        if (added) { /* an input an initializer gives (IR version < 4) is a constant */
            defined_by[v] = -1;
            m->inputs[m->n_inputs++] = v;
        }
    }
    for (int k = 0; k < m->n_nodes; k++) {
        onnx_node *node = &m->nodes[k];
        for (int j = 0; j < node->n_out; j++) {
            const char *name = node->proto->output[j];
            if (!name || !*name) {
                node->out[j] = -1;
                continue;
            }
            bool added = false;
            node->out[j] = table_find(t, name, true, &added);
            if (!added)
                return onnx_fail_node(load_fn, m, node, CORE_FORMAT, "result '%s' is already defined", name);
            defined_by[node->out[j]] = k;
        }
    }
    return 0;
}

/* Operands as values; one no input, initializer or node defines is an error. */
static int link_operands(onnx_model *m, name_table *t)
{
    for (int k = 0; k < m->n_nodes; k++) {
        onnx_node *node = &m->nodes[k];
        for (int j = 0; j < node->n_in; j++) {
            const char *name = node->proto->input[j];
            node->in[j] = name && *name ? table_find(t, name, false, NULL) : -1;
            if (name && *name && node->in[j] < 0)
                return onnx_fail_node(load_fn, m, node, CORE_FORMAT, "operand %d '%s' is not defined by any input, "
                                      "initializer or node", j, name);
            if (j < node->op->min_in && node->in[j] < 0)
                return onnx_fail_node(load_fn, m, node, CORE_FORMAT, "operand %d is required but left out", j);
        }
    }
    return 0;
}

/* Orders the nodes so that operands come first (Kahn's algorithm); nodes
 * left over lie on a cycle. */
static int sort_nodes(onnx_model *m, const int *defined_by)
{
    int n = m->n_nodes;
    int *waiting = calloc((size_t)n + 1, sizeof *waiting), *order = malloc(((size_t)n + 1) * sizeof *order);
    int *users_start = calloc((size_t)n + 2, sizeof *users_start), *users = NULL;
    onnx_node *sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    int status = waiting && order && users_start && sorted ? 0 : core_fail_status(CORE_NOMEM, load_fn);
    int edges = 0;
    for (int k = 0; status == 0 && k < n; k++)
        for (int j = 0; j < m->nodes[k].n_in; j++)
            if (m->nodes[k].in[j] >= 0 && defined_by[m->nodes[k].in[j]] >= 0) {
                waiting[k]++;
                users_start[defined_by[m->nodes[k].in[j]] + 1]++;
                edges++;
            }
    if (status == 0 && !(users = malloc(((size_t)edges + 1) * sizeof *users)))
        status = core_fail_status(CORE_NOMEM, load_fn);
    for (int k = 0; status == 0 && k < n; k++)
        users_start[k + 1] += users_start[k];
    int *fill = status == 0 ? calloc((size_t)n + 1, sizeof *fill) : NULL;
    if (status == 0 && !fill)
        status = core_fail_status(CORE_NOMEM, load_fn);
    for (int k = 0; status == 0 && k < n; k++)
        for (int j = 0; j < m->nodes[k].n_in; j++)
            if (m->nodes[k].in[j] >= 0 && defined_by[m->nodes[k].in[j]] >= 0) {
                int from = defined_by[m->nodes[k].in[j]];
                users[users_start[from] + fill[from]++] = k;
            }
    int done = 0;
    for (int k = 0; status == 0 && k < n; k++)
        if (!waiting[k])
            order[done++] = k;
    for (int i = 0; status == 0 && i < done; i++)
        for (int e = users_start[order[i]]; e < users_start[order[i] + 1]; e++)
            if (--waiting[users[e]] == 0)
                order[done++] = users[e];
    if (status == 0 && done < n) {
        int k = 0;
        while (!waiting[k])
            k++;
        status = onnx_fail_node(load_fn, m, &m->nodes[k], CORE_FORMAT, "the nodes form a cycle through this one");
    }
    for (int i = 0; status == 0 && i < n; i++)
        sorted[i] = m->nodes[order[i]];
    if (status == 0) {
        free(m->nodes);
        m->nodes = sorted;
        sorted = NULL;
    }
    free(waiting);
    free(order);
    free(users_start);
    free(users);
    free(fill);
    free(sorted);
    return status;
}

static int link_outputs(onnx_model *m, name_table *t)
{
    const Onnx__GraphProto *g = m->proto->graph;
    for (size_t i = 0; i < g->n_output; i++) {
        const char *name = g->output[i]->name ? g->output[i]->name : "";
        int v = table_find(t, name, false, NULL);
        if (v < 0)
            return core_fail(CORE_FORMAT, load_fn, "'%s': output '%s' is not defined by any input, initializer or "
                             "node", m->name, name);
        if (check_value_info(m, g->output[i], "output") < 0)
            return core_error_status();
        m->outputs[m->n_outputs++] = v;
    }
    for (int v = 0; v < m->n_values; v++)
        m->last_use[v] = -1;
    for (int k = 0; k < m->n_nodes; k++)
        for (int j = 0; j < m->nodes[k].n_in; j++)
            if (m->nodes[k].in[j] >= 0)
                m->last_use[m->nodes[k].in[j]] = k;
    for (int i = 0; i < m->n_outputs; i++)
        m->last_use[m->outputs[i]] = m->n_nodes;
    return 0;
}

static int make_nodes(onnx_model *m)
{
    const Onnx__GraphProto *g = m->proto->graph;
    m->n_nodes = (int)g->n_node;
    m->nodes = calloc((size_t)m->n_nodes + 1, sizeof *m->nodes);
    if (!m->nodes)
        return core_fail_status(CORE_NOMEM, load_fn);
    for (int k = 0; k < m->n_nodes; k++) {
        onnx_node *node = &m->nodes[k];
        node->proto = g->node[k];
        if (!node->proto->op_type)
            return core_fail(CORE_FORMAT, load_fn, "'%s': node %d has no op_type", m->name, k);
        if (check_node(m, node) < 0)
            return core_error_status();
        node->n_in = (int)node->proto->n_input;
        node->n_out = (int)node->proto->n_output;
        node->in = calloc((size_t)node->n_in + 1, sizeof *node->in);
        node->out = calloc((size_t)node->n_out + 1, sizeof *node->out);
        if (!node->in || !node->out)
            return core_fail_status(CORE_NOMEM, load_fn);
    }
    return 0;
}

static int build(onnx_model *m, const onnx_mapped *mf)
{
    const Onnx__GraphProto *g = m->proto->graph;
    if (make_nodes(m) < 0 || check_opset(m) < 0)
        return core_error_status();
    int cap = (int)(g->n_input + g->n_initializer);
    for (int k = 0; k < m->n_nodes; k++)
        cap += m->nodes[k].n_out;
    name_table t = {0};
    int *defined_by = calloc((size_t)cap + 1, sizeof *defined_by);
    m->constants = calloc((size_t)cap + 1, sizeof *m->constants);
    m->inputs = calloc(g->n_input + 1, sizeof *m->inputs);
    m->outputs = calloc(g->n_output + 1, sizeof *m->outputs);
    m->last_use = calloc((size_t)cap + 1, sizeof *m->last_use);
    int status = defined_by && m->constants && m->inputs && m->outputs && m->last_use ? table_init(&t, cap)
                                                                                       : core_fail_status(CORE_NOMEM, load_fn);
    if (status == 0)
        status = define_values(m, &t, defined_by, mf);
    m->n_values = t.n;
    m->value_names = t.names;
    if (status == 0)
        status = link_operands(m, &t);
    if (status == 0)
        status = sort_nodes(m, defined_by);
    if (status == 0)
        status = link_outputs(m, &t);
    if (status == 0 && m->n_outputs == 0)
        status = core_fail(CORE_FORMAT, load_fn, "'%s': the graph has no outputs", m->name);
    free(t.slots);
    free(defined_by);
    return status;
}

/* -- Running it --------------------------------------------------------------- */

/* Known operands of a node on device d that are on the CPU (a Constant
 * node's result, or one computed from constants) are moved there (the trace
 * paused: the copy is a constant too); 0-d ones go with CUDA operands as
 * they are. */
static int move_known(const onnx_node *node, kiln_device d, kiln_tensor **in, const bool *known, kiln_tensor **v)
{
    for (int j = 0; j < node->n_in; j++) {
        if (node->in[j] >= 0)
            in[j] = v[node->in[j]]; /* an operand given twice is moved once */
        if (!in[j] || !known[j] || kiln_device_of(in[j]) == d || kiln_ndim(in[j]) == 0)
            continue;
        eager_trace *trace = eager_active_trace();
        eager_trace_activate(NULL);
        kiln_tensor *moved = kiln_to_device(in[j], d);
        eager_trace_activate(trace);
        if (!moved)
            return core_error_status();
        eager_disown(moved);
        kiln_release(v[node->in[j]]);
        v[node->in[j]] = in[j] = moved;
    }
    return 0;
}

/* Runs node k over values v (references the body owns) for inputs on device
 * d, pausing the trace when every operand is a constant. */
static int run_node(const onnx_model *m, int k, kiln_device d, kiln_tensor **v, bool *known)
{
    const onnx_node *node = &m->nodes[k];
    kiln_tensor *in[ONNX_MAX_OPERANDS] = {NULL}, *out[ONNX_MAX_OPERANDS] = {NULL};
    bool in_known[ONNX_MAX_OPERANDS] = {false}, all_known = true;
    for (int j = 0; j < node->n_in; j++) {
        in[j] = node->in[j] >= 0 ? v[node->in[j]] : NULL;
        in_known[j] = node->in[j] < 0 || known[node->in[j]];
        all_known &= in_known[j];
    }
    onnx_call c = {.m = m, .node = node, .in = in, .known = in_known, .out = out};
    if (!all_known && d != KILN_CPU && move_known(node, d, in, in_known, v) < 0)
        return onnx_fail(&c, -core_error_status(), "moving a constant operand to CUDA: %s", kiln_last_error());
    eager_trace *trace = eager_active_trace();
    /* the trace must still learn that the sizes were read: they become fixed */
    for (int j = 0; node->op->shape_only && j < node->n_in; j++)
        eager_note_shape_read(in[j]);
    all_known |= node->op->shape_only;
    if (all_known)
        eager_trace_activate(NULL);
    kiln_scope_begin();
    int status = node->op->run(&c);
    for (int j = 0; status == 0 && j < node->n_out; j++)
        if (node->out[j] >= 0 && !out[j])
            status = onnx_fail(&c, CORE_INTERNAL, "gave no result %d", j);
    for (int j = 0; status == 0 && j < node->n_out; j++)
        if (node->out[j] >= 0) {
            v[node->out[j]] = kiln_retain(out[j]);
            known[node->out[j]] = all_known;
        }
    if (status < 0 && strncmp(kiln_last_error(), "kiln_onnx", 9)) {
        char why[1024];
        snprintf(why, sizeof why, "%s", kiln_last_error()[0] ? kiln_last_error() : "failed");
        onnx_fail(&c, -status, "%s", why);
    }
    kiln_scope_end();
    if (all_known)
        eager_trace_activate(trace);
    return status < 0 ? status : 0;
}

kiln_device onnx_device_of(const kiln_tensor *t)
{
    return t && t->trace ? t->trace->device : kiln_device_of(t);
}

/* The device of the inputs: CUDA when any is there. */
static kiln_device inputs_device(const onnx_model *m, kiln_tensor *const *in)
{
    for (int i = 0; i < m->n_inputs; i++)
        if (onnx_device_of(in[i]) != KILN_CPU)
            return onnx_device_of(in[i]);
    return KILN_CPU;
}

/* The constants moved to CUDA, as new references no scope owns, the trace
 * paused; NULL with the error set. */
static kiln_tensor **constants_to_cuda(const onnx_model *m)
{
    kiln_tensor **moved = calloc((size_t)m->n_values + 1, sizeof *moved);
    if (!moved) {
        core_fail_status(CORE_NOMEM, "kiln_onnx");
        return NULL;
    }
    eager_trace *trace = eager_active_trace();
    eager_trace_activate(NULL);
    int i = 0;
    for (; i < m->n_values; i++) {
        if (!m->constants[i])
            continue;
        if (!(moved[i] = kiln_to_device(m->constants[i], KILN_CUDA)))
            break;
        eager_disown(moved[i]);
    }
    eager_trace_activate(trace);
    if (i == m->n_values)
        return moved;
    for (int j = 0; j < i; j++)
        kiln_release(moved[j]);
    free(moved);
    return NULL;
}

/* The model's constants on device d, moved there once, by the first call
 * that asks; NULL with the error set. */
static kiln_tensor *const *constants_on(onnx_model *m, kiln_device d)
{
    if (d == KILN_CPU)
        return m->constants;
    pthread_mutex_lock(&m->lock);
    if (!m->cuda_constants)
        m->cuda_constants = constants_to_cuda(m);
    kiln_tensor *const *constants = m->cuda_constants;
    pthread_mutex_unlock(&m->lock);
    return constants;
}

static int run_model(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    onnx_model *m = user;
    kiln_device d = inputs_device(m, in);
    kiln_tensor *const *constants = constants_on(m, d);
    kiln_tensor **v = calloc((size_t)m->n_values + 1, sizeof *v);
    bool *known = calloc((size_t)m->n_values + 1, sizeof *known);
    int status = 0;
    if (!constants)
        status = core_fail(CORE_DEVICE, "kiln_onnx", "'%s': moving the initializers to CUDA: %s", m->name,
                           kiln_last_error());
    else if (!v || !known)
        status = core_fail_status(CORE_NOMEM, "kiln_onnx");
    for (int i = 0; status == 0 && i < m->n_values; i++)
        if (constants[i]) {
            v[i] = kiln_retain(constants[i]);
            known[i] = true;
        }
    for (int i = 0; status == 0 && i < m->n_inputs; i++)
        v[m->inputs[i]] = kiln_retain(in[i]);
    for (int k = 0; status == 0 && k < m->n_nodes; k++) {
        status = run_node(m, k, d, v, known);
        for (int j = 0; j < m->nodes[k].n_in; j++) {
            int value = m->nodes[k].in[j];
            if (value >= 0 && m->last_use[value] == k) {
                kiln_release(v[value]);
                v[value] = NULL;
            }
        }
    }
    for (int i = 0; status == 0 && i < m->n_outputs; i++)
        out[i] = eager_own(kiln_retain(v[m->outputs[i]]));
    for (int i = 0; v && i < m->n_values; i++)
        kiln_release(v[i]);
    free(v);
    free(known);
    return status;
}

/* -- kiln_onnx_load ----------------------------------------------------------- */

static char **io_names(const onnx_model *m)
{
    int n = m->n_inputs + m->n_outputs;
    char **names = calloc((size_t)n + 1, sizeof *names);
    for (int i = 0; names && i < n; i++) {
        int v = i < m->n_inputs ? m->inputs[i] : m->outputs[i - m->n_inputs];
        if (!(names[i] = strdup(m->value_names[v]))) {
            for (int j = 0; j < i; j++)
                free(names[j]);
            free(names);
            return NULL;
        }
    }
    return names;
}

static void name_model(onnx_model *m, const char *path)
{
    const Onnx__GraphProto *g = m->proto ? m->proto->graph : NULL;
    const char *base = strrchr(path, '/');
    const char *name = g && g->name && *g->name ? g->name : base ? base + 1 : path;
    snprintf(m->name, sizeof m->name, "%s", name);
}

kiln_fn *kiln_onnx_load(const char *path, const kiln_jit_options *opts)
{
    if (!path) {
        core_fail_null_arg(load_fn, "path");
        return NULL;
    }
    onnx_mapped mf;
    if (onnx_map_model(load_fn, path, &mf) < 0)
        return NULL;
    onnx_model *m = calloc(1, sizeof *m);
    if (!m) {
        onnx__model_proto__free_unpacked(mf.proto, NULL);
        onnx_unmap_model(&mf);
        core_fail_status(CORE_NOMEM, load_fn);
        return NULL;
    }
    m->proto = mf.proto;
    pthread_mutex_init(&m->lock, NULL);
    name_model(m, path);
    int status = 0;
    if (!m->proto->graph)
        status = core_fail(CORE_FORMAT, load_fn, "'%s' has no graph", path);
    last_times = (onnx_load_times){.map_ms = mf.map_ms, .unpack_ms = mf.unpack_ms};
    double start = core_now_ms();
    if (status == 0)
        status = build(m, &mf);
    last_times.graph_ms = core_now_ms() - start - last_times.tensors_ms;
    onnx_unmap_model(&mf);
    char **names = status == 0 ? io_names(m) : NULL;
    if (status == 0 && !names)
        status = core_fail_status(CORE_NOMEM, load_fn);
    kiln_fn *f = status == 0 ? kiln_jit(m->name, run_model, m->n_inputs, m->n_outputs, m, opts) : NULL;
    if (!f) {
        for (int i = 0; names && i < m->n_inputs + m->n_outputs; i++)
            free(names[i]);
        free(names);
        model_free(m);
        return NULL;
    }
    jit_adopt(f, model_free, names);
    return f;
}

/* -- Declared input shapes, for tools ------------------------------------------------ */

static bool given_by_initializer(const Onnx__GraphProto *g, const char *name)
{
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name))
            return true;
    return false;
}

int onnx_declared_inputs(const kiln_fn *f, kiln_spec *specs, int max, int64_t batch)
{
    const char *fn = "onnx_declared_inputs";
    const onnx_model *m = jit_user(f);
    const Onnx__GraphProto *g = m->proto->graph;
    int n = 0;
    for (size_t i = 0; i < g->n_input; i++) {
        const Onnx__ValueInfoProto *v = g->input[i];
        if (given_by_initializer(g, v->name))
            continue;
        if (n == max || !v->type || !v->type->tensor_type || !v->type->tensor_type->shape)
            return core_fail(CORE_VALUE, fn, "'%s': input '%s' %s", m->name, v->name,
                             n == max ? "is one too many" : "declares no shape");
        const Onnx__TypeProto__Tensor *t = v->type->tensor_type;
        kiln_spec *s = &specs[n++];
        memset(s, 0, sizeof *s);
        onnx_kiln_dtype(t->elem_type, &s->dtype);
        s->ndim = (int)t->shape->n_dim;
        for (int d = 0; d < s->ndim; d++) {
            const Onnx__TensorShapeProto__Dimension *dim = t->shape->dim[d];
            bool fixed = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            s->shape[d] = d == 0 && batch > 0 ? batch : fixed ? dim->dim_value : 1;
        }
    }
    return n;
}
