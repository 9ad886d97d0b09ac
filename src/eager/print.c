/* kiln_print and kiln_fprint: PyTorch's layout, rows wrapped at 80 columns
 * and the middle of large tensors elided, as torch/_tensor_str.py does. */
#include <math.h>
#include <string.h>

#include "eager/internal.h"
#include "core/core.h"

enum { SUMMARY_THRESHOLD = 1000, EDGE = 3, LINE_WIDTH = 80, INDENT = sizeof "tensor(" - 1 };

/* How every element prints: PyTorch's _Formatter. */
typedef struct {
    const kiln_tensor *t;
    bool summarize;
    bool floating;
    bool int_mode;   /* floats that are all whole numbers print as "2." */
    bool sci_mode;   /* floats: %e rather than %f */
    int width;       /* of the widest element, the nonzero finite ones for floats */
    double max_abs, min_abs; /* of the nonzero finite elements */
    bool any_finite;
} printer;

/* An element, as f64 for floats and exactly as i64 for integers and bools. */
typedef struct {
    double f;
    int64_t i;
} element_value;

static element_value element(const kiln_tensor *t, const int64_t *index)
{
    int64_t offset = 0;
    for (int d = 0; d < t->ndim; d++)
        offset += index[d] * t->strides[d];
    const char *at = (char *)t->storage->data + (t->offset + offset) * (int64_t)eager_dtype_size(t->dtype);
    element_value v = {0, 0};
    if (ir_dtype_is_float(t->dtype))
        convert(&v.f, KILN_F64, at, t->dtype, 1, 1);
    else
        convert(&v.i, KILN_I64, at, t->dtype, 1, 1);
    return v;
}

/* The element's text without padding. */
static int format(const printer *p, char *buf, size_t size, element_value e)
{
    double v = e.f;
    if (p->t->dtype == KILN_BOOL)
        return snprintf(buf, size, "%s", e.i ? "True" : "False");
    if (!p->floating)
        return snprintf(buf, size, "%lld", (long long)e.i);
    if (isnan(v)) /* C would say "-nan" for some */
        return snprintf(buf, size, "nan");
    if (p->sci_mode)
        return snprintf(buf, size, "%.4e", v);
    if (p->int_mode)
        return snprintf(buf, size, isinf(v) ? "%.0f" : "%.0f.", v);
    return snprintf(buf, size, "%.4f", v);
}

/* Calls visit on every printed element (the summarized ones only). */
static void each_shown(printer *p, int d, int64_t *index, void (*visit)(printer *, element_value))
{
    if (d == p->t->ndim) {
        visit(p, element(p->t, index));
        return;
    }
    int64_t n = p->t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        if (p->summarize && n > 2 * EDGE && i == EDGE)
            i = n - EDGE;
        index[d] = i;
        each_shown(p, d + 1, index, visit);
    }
}

static void measure_range(printer *p, element_value e)
{
    double a = fabs(e.f);
    if (!isfinite(e.f) || a == 0)
        return;
    p->int_mode &= e.f == ceil(e.f);
    p->max_abs = p->any_finite && p->max_abs > a ? p->max_abs : a;
    p->min_abs = p->any_finite && p->min_abs < a ? p->min_abs : a;
    p->any_finite = true;
}

static void measure_width(printer *p, element_value e)
{
    if (p->floating && (!isfinite(e.f) || e.f == 0))
        return;
    char buf[64];
    int w = format(p, buf, sizeof buf, e);
    p->width = w > p->width ? w : p->width;
}

static void measure(printer *p)
{
    int64_t index[KILN_MAX_DIMS] = {0};
    if (p->floating) {
        each_shown(p, 0, index, measure_range);
        bool wide = p->any_finite && (p->max_abs / p->min_abs > 1000.0 || p->max_abs > 1.0e8);
        p->sci_mode = wide || (!p->int_mode && p->any_finite && p->min_abs < 1.0e-4);
    }
    each_shown(p, 0, index, measure_width);
}

/* -- Layout ---------------------------------------------------------------- */

static void put_element(const printer *p, strbuf *out, const int64_t *index)
{
    char buf[64];
    int w = format(p, buf, sizeof buf, element(p->t, index));
    strbuf_put(out, "%*s%s", w < p->width ? p->width - w : 0, "", buf);
}

/* The last axis: as many elements as fit in a line of LINE_WIDTH after the
 * indent, each counted as its width and ", ". */
static void put_vector(const printer *p, strbuf *out, int64_t *index, int indent)
{
    int d = p->t->ndim - 1;
    int64_t n = p->t->shape[d];
    int64_t per_line = (LINE_WIDTH - indent) / (p->width + 2);
    per_line = per_line < 1 ? 1 : per_line;
    bool elide = p->summarize && n > 2 * EDGE;
    int64_t shown = elide ? 2 * EDGE + 1 : n; /* the "..." counts as one */
    strbuf_put(out, "[");
    for (int64_t k = 0; k < shown; k++) {
        if (k && k % per_line)
            strbuf_put(out, ", ");
        else if (k)
            strbuf_put(out, ",\n%*s", indent + 1, "");
        if (elide && k == EDGE) {
            strbuf_put(out, " ...");
            continue;
        }
        index[d] = elide && k > EDGE ? n - (shown - k) : k;
        put_element(p, out, index);
    }
    strbuf_put(out, "]");
}

static void put_axis(const printer *p, strbuf *out, int d, int64_t *index, int indent)
{
    if (d == p->t->ndim - 1) {
        put_vector(p, out, index, indent);
        return;
    }
    int64_t n = p->t->shape[d];
    strbuf_put(out, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i)
            strbuf_put(out, ",%.*s%*s", p->t->ndim - d - 1, "\n\n\n\n\n\n\n\n", indent + 1, "");
        if (p->summarize && n > 2 * EDGE && i == EDGE) {
            strbuf_put(out, "...");
            i = n - EDGE - 1;
            continue;
        }
        index[d] = i;
        put_axis(p, out, d + 1, index, indent + 1);
    }
    strbuf_put(out, "]");
}

/* Appends ", suffix", or ",\n" and the suffix indented when the line would
 * pass LINE_WIDTH (PyTorch's _add_suffixes, which counts two more). */
static void put_suffix(strbuf *out, const char *suffix)
{
    if (out->failed)
        return;
    const char *line = out->data ? out->data : "";
    const char *nl = strrchr(line, '\n');
    size_t last_line = nl ? strlen(nl) + 1 : out->len + 2;
    if (last_line + strlen(suffix) + 2 > LINE_WIDTH)
        strbuf_put(out, ",\n%*s%s", (int)INDENT, "", suffix);
    else
        strbuf_put(out, ", %s", suffix);
}

/* "size=(2, 0)", or "size=(0,)" as Python writes a 1-tuple. */
static void put_size(strbuf *out, const kiln_tensor *t)
{
    char size[CORE_SHAPE_STR_MAX + 16] = "size=(";
    for (int d = 0; d < t->ndim; d++) {
        size_t used = strlen(size);
        snprintf(size + used, sizeof size - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    }
    strcat(size, t->ndim == 1 ? ",)" : ")");
    put_suffix(out, size);
}

/* The text of a CPU tensor's values; device, when not NULL, is said as
 * PyTorch says it. */
static void put_tensor(strbuf *out, const kiln_tensor *t, const char *device)
{
    printer p = {.t = t, .summarize = t->numel > SUMMARY_THRESHOLD, .floating = ir_dtype_is_float(t->dtype),
                 .int_mode = true, .width = 1};
    int64_t index[KILN_MAX_DIMS] = {0};
    strbuf_put(out, "tensor(");
    if (t->numel == 0) {
        strbuf_put(out, "[]");
        if (t->ndim != 1)
            put_size(out, t);
    } else if (t->ndim == 0) {
        measure(&p);
        put_element(&p, out, index);
    } else {
        measure(&p);
        put_axis(&p, out, 0, index, INDENT);
    }
    /* As in PyTorch, dtypes that the values already imply go unsaid. */
    bool implied = t->dtype == KILN_F32 || (t->numel > 0 && (t->dtype == KILN_I64 || t->dtype == KILN_BOOL));
    char suffix[64];
    if (device) {
        snprintf(suffix, sizeof suffix, "device='%s'", device);
        put_suffix(out, suffix);
    }
    if (!implied) {
        snprintf(suffix, sizeof suffix, "dtype=%s", kiln_dtype_name(t->dtype));
        put_suffix(out, suffix);
    }
    strbuf_put(out, ")\n");
}

/* -- Public ---------------------------------------------------------------- */

static int write_text(const char *fn, FILE *f, strbuf *text)
{
    char *s = strbuf_finish(text);
    if (!s)
        return core_fail(CORE_NOMEM, fn, "out of memory formatting the tensor");
    bool written = fputs(s, f) >= 0 && fflush(f) == 0;
    free(s);
    if (!written)
        return core_fail(CORE_VALUE, fn, "cannot write to the stream");
    core_succeeded();
    return 0;
}

static int print_to(const char *fn, FILE *f, const kiln_tensor *t)
{
    if (!t)
        return core_fail_null(fn, "tensor");
    if (!f)
        return core_fail_null_arg(fn, "f");
    strbuf text = {0};
    if (t->trace) { /* as jax prints its tracers: no values to show */
        char d[DESCRIBE_MAX];
        strbuf_put(&text, "tracer(%s, traced in '%s')\n", describe(d, t), t->trace->name);
        return write_text(fn, f, &text);
    }
    if (t->device == KILN_CPU) {
        put_tensor(&text, t, NULL);
        return write_text(fn, f, &text);
    }
    kiln_tensor *host = cuda_to_host(fn, t);
    if (!host)
        return -CORE_DEVICE;
    put_tensor(&text, host, "cuda:0");
    kiln_release(host);
    return write_text(fn, f, &text);
}

int kiln_print(const kiln_tensor *t)
{
    return print_to("kiln_print", stdout, t);
}

int kiln_fprint(FILE *f, const kiln_tensor *t)
{
    return print_to("kiln_fprint", f, t);
}
