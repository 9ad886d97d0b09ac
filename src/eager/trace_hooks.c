/* The eager side of tracing: the active trace, tracer tensors, operand checks. */
#include <string.h>

#include "eager/internal.h"

static _Thread_local eager_trace *active;

void eager_trace_activate(eager_trace *trace)
{
    active = trace;
}

eager_trace *eager_active_trace(void)
{
    return active;
}

bool recording(void)
{
    return active != NULL;
}

void eager_note_shape_read(const kiln_tensor *t)
{
    if (t && t->trace && t->trace == active && !active->finished)
        active->read_shape(active, t->node);
}

void eager_trace_release(eager_trace *trace)
{
    if (atomic_fetch_sub_explicit(&trace->refs, 1, memory_order_acq_rel) == 1)
        trace->destroy(trace);
}

kiln_tensor *eager_tracer_new(eager_trace *trace, ir_ref node, kiln_dtype dt, int ndim,
                              const int64_t *shape)
{
    kiln_tensor *t = tensor_new_meta(dt, ndim, shape);
    if (!t) {
        core_fail(CORE_NOMEM, "kiln_call", "out of memory tracing '%s'", trace->name);
        return NULL;
    }
    atomic_fetch_add_explicit(&trace->refs, 1, memory_order_relaxed);
    t->trace = trace;
    t->node = node;
    return t;
}

int eager_check_operands(const char *fn, int n, kiln_tensor *const *in, const char *const *names)
{
    return check_operands(fn, n, in, names);
}

int check_operands(const char *fn, int n, kiln_tensor *const *in, const char *const *names)
{
    for (int i = 0; i < n; i++) {
        const kiln_tensor *t = in[i];
        if (!t)
            return core_fail_null(fn, names[i]);
        if (!eager_alive(t))
            return core_fail(CORE_STATE, fn, "%s was released already (a release too many, or a tensor its "
                             "scope released when it ended)", names[i]);
        if (!t->trace || (t->trace == active && !t->trace->finished))
            continue;
        if (t->trace->finished)
            return core_fail(CORE_STATE, fn,
                             "%s is a tracer of '%s' used after its body returned: keep only "
                             "the outputs of kiln_call",
                             names[i], t->trace->name);
        return core_fail(CORE_STATE, fn, "%s is a tracer of '%s' used outside its trace",
                         names[i], t->trace->name);
    }
    return 0;
}

kiln_tensor *record_op(const char *fn, ir_op op, int n_in, kiln_tensor *const *in, const ir_params *params,
                       kiln_dtype dt, int ndim, const int64_t *shape)
{
    int64_t numel;
    if (check_shape(fn, ndim, shape, &numel) < 0) /* the ops check what they can name better first */
        return NULL;
    ir_params zero = {0};
    return tensor_own(active->record(active, op, n_in, in, params ? params : &zero, dt, ndim, shape));
}

kiln_tensor *read_tracer(const char *fn, const kiln_tensor *t)
{
    kiln_clear_error();
    kiln_tensor *real = t->trace == active && !active->finished ? active->read(active, t, fn) : NULL;
    if (!real && !kiln_last_error()[0]) /* the trace cannot break: it fails */
        fail_read_tracer(fn, t);
    return real;
}

int fail_read_tracer(const char *fn, const kiln_tensor *t)
{
    if (t->trace == active && !t->trace->finished)
        t->trace->read_values(t->trace, fn);
    char d[DESCRIBE_MAX];
    return core_fail(CORE_STATE, fn,
                     "cannot read the values of %s traced in '%s': data-dependent control flow "
                     "cannot be traced; select values with kiln_where, or read them outside the "
                     "marked function",
                     describe(d, t), t->trace->name);
}
