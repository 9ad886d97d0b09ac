/* kiln_print: PyTorch's layout, eliding the middle of large tensors. */
#include <math.h>
#include <string.h>

#include "eager/internal.h"

enum { SUMMARY_THRESHOLD = 1000, EDGE = 3 };

typedef struct {
    const kiln_tensor *t;
    bool summarize;
    bool scientific; /* floats: %e rather than %f */
    bool integral;   /* floats that are all whole numbers print as "2." */
    int width;       /* of the widest element */
    double max_abs, min_abs_nonzero;
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

static int format(const printer *p, char *buf, size_t size, element_value e)
{
    double v = e.f;
    switch (p->t->dtype) {
    case KILN_BOOL: return snprintf(buf, size, "%s", e.i ? "True" : "False");
    case KILN_I32:
    case KILN_I64: return snprintf(buf, size, "%lld", (long long)e.i);
    default: break;
    }
    if (isnan(v))
        return snprintf(buf, size, "nan");
    if (isinf(v))
        return snprintf(buf, size, v > 0 ? "inf" : "-inf");
    if (p->integral)
        return snprintf(buf, size, "%.0f.", v);
    return snprintf(buf, size, p->scientific ? "%.4e" : "%.4f", v);
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
    double v = e.f;
    if (!isfinite(v))
        return;
    p->integral &= v == trunc(v);
    double a = fabs(v);
    p->max_abs = a > p->max_abs ? a : p->max_abs;
    if (a > 0 && a < p->min_abs_nonzero)
        p->min_abs_nonzero = a;
}

static void measure_width(printer *p, element_value v)
{
    char buf[64];
    int w = format(p, buf, sizeof buf, v);
    p->width = w > p->width ? w : p->width;
}

static void print_rec(const printer *p, int d, int64_t *index, int indent)
{
    if (d == p->t->ndim) {
        char buf[64];
        format(p, buf, sizeof buf, element(p->t, index));
        printf("%*s", p->width, buf);
        return;
    }
    int64_t n = p->t->shape[d];
    putchar('[');
    for (int64_t i = 0; i < n; i++) {
        if (i) {
            putchar(',');
            if (d == p->t->ndim - 1)
                putchar(' ');
            else
                printf("%.*s%*s", p->t->ndim - d - 1, "\n\n\n\n\n\n\n\n", indent + 1, "");
        }
        if (p->summarize && n > 2 * EDGE && i == EDGE) {
            printf("...");
            i = n - EDGE - 1;
            continue;
        }
        index[d] = i;
        print_rec(p, d + 1, index, indent + 1);
    }
    putchar(']');
}

static int print_values(const kiln_tensor *t, const char *device);

int kiln_print(const kiln_tensor *t)
{
    if (!t)
        return core_fail_null("kiln_print", "tensor");
    if (t->trace) { /* as jax prints its tracers: no values to show */
        char d[DESCRIBE_MAX];
        printf("tracer(%s, traced in '%s')\n", describe(d, t), t->trace->name);
        return 0;
    }
    if (t->device == KILN_CPU)
        return print_values(t, NULL);
    kiln_tensor *host = cuda_to_host("kiln_print", t);
    int status = host ? print_values(host, "cuda:0") : -CORE_DEVICE;
    kiln_release(host);
    return status;
}

/* Prints a CPU tensor's values; device, when not NULL, is said as PyTorch says it. */
static int print_values(const kiln_tensor *t, const char *device)
{
    printer p = {t, t->numel > SUMMARY_THRESHOLD, false, true, 0, 0, INFINITY};
    int64_t index[KILN_MAX_DIMS] = {0};
    if (t->numel == 0) {
        printf("tensor([], size=(");
        for (int d = 0; d < t->ndim; d++)
            printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
        printf("%s), dtype=%s", t->ndim == 1 ? "," : "", kiln_dtype_name(t->dtype));
        printf(device ? ", device='%s')\n" : ")\n", device);
        return 0;
    }
    if (ir_dtype_is_float(t->dtype)) {
        each_shown(&p, 0, index, measure_range);
        p.scientific = p.max_abs >= 1e8 || p.min_abs_nonzero < 1e-4;
        p.integral &= p.max_abs < 1e8;
    }
    each_shown(&p, 0, index, measure_width);
    printf("tensor(");
    print_rec(&p, 0, index, (int)strlen("tensor("));
    /* As in PyTorch, dtypes that the values already imply go unsaid. */
    if (t->dtype == KILN_F64 || t->dtype == KILN_I32)
        printf(", dtype=%s", kiln_dtype_name(t->dtype));
    if (device)
        printf(", device='%s'", device);
    printf(")\n");
    return fflush(stdout) == 0 ? 0 : core_fail(CORE_VALUE, "kiln_print", "cannot write to stdout");
}
