/* Composite ops written with the public ops, so that they trace and fuse. */
#include <math.h>
#include <string.h>

#include "eager/internal.h"

void composite_begin(void)
{
    kiln_scope_begin();
    core_steps_begin();
}

/* fn's error with the inner op's message, which names fn already where a
 * step was fn itself (kiln_max over several axes, kiln_pad's own copy). */
kiln_tensor *composite_end(const char *fn, kiln_tensor *result)
{
    core_steps_end();
    if (!result) {
        char inner[1024];
        size_t named = strlen(fn);
        const char *text = kiln_last_error();
        bool names_fn = !strncmp(text, fn, named) && !strncmp(text + named, ": ", 2);
        snprintf(inner, sizeof inner, "%s", names_fn ? text + named + 2 : text);
        kiln_scope_end();
        core_fail(CORE_VALUE, fn, "%s", inner);
        return NULL;
    }
    kiln_keep(result);
    kiln_scope_end();
    core_succeeded();
    return result;
}

bool composite_check(const char *fn, const kiln_tensor *a, int axis, bool need_axis)
{
    if (!a) {
        core_fail_null(fn, "operand a");
        return false;
    }
    int resolved;
    return !need_axis || check_axis(fn, axis, a, 0, &resolved) == 0;
}

bool composite_check_pair(const char *fn, const kiln_tensor *a, const kiln_tensor *b)
{
    if (!composite_check(fn, a, 0, false))
        return false;
    if (!b)
        core_fail_null(fn, "operand b");
    return b != NULL;
}

/* softmax's operand and axis: a 0-d tensor takes axis 0 or -1, as kiln_sum does. */
static bool check_softmax(const char *fn, const kiln_tensor *a, int axis)
{
    bool zero_dim_axis = a && a->ndim == 0 && (axis == 0 || axis == -1);
    return composite_check(fn, a, axis, !zero_dim_axis);
}

kiln_tensor *composite_float(kiln_tensor *a)
{
    return !a || ir_dtype_is_float(a->dtype) ? a : kiln_cast(a, KILN_F32);
}

/* x less its maximum along axis, so that exp cannot overflow; an empty axis
 * has no maximum, and its softmax no element to shift. The shift changes
 * no result, so its gradient is zero: it is not recorded. */
static kiln_tensor *shifted(kiln_tensor *x, int axis)
{
    if (!x)
        return NULL;
    int64_t extent = x->ndim == 0 ? 1 : x->shape[axis < 0 ? axis + x->ndim : axis];
    if (extent == 0)
        return x;
    kiln_no_grad_begin();
    kiln_tensor *max = kiln_max(x, axis, true);
    kiln_no_grad_end();
    return kiln_sub(x, max);
}

kiln_tensor *kiln_softmax(kiln_tensor *a, int axis)
{
    if (!check_softmax("kiln_softmax", a, axis))
        return NULL;
    composite_begin();
    kiln_tensor *e = kiln_exp(shifted(composite_float(a), axis));
    return composite_end("kiln_softmax", kiln_div(e, kiln_sum(e, axis, true)));
}

kiln_tensor *kiln_log_softmax(kiln_tensor *a, int axis)
{
    if (!check_softmax("kiln_log_softmax", a, axis))
        return NULL;
    composite_begin();
    kiln_tensor *x = shifted(composite_float(a), axis);
    kiln_tensor *log_sum = kiln_log(kiln_sum(kiln_exp(x), axis, true));
    return composite_end("kiln_log_softmax", kiln_sub(x, log_sum));
}

kiln_tensor *kiln_layer_norm(kiln_tensor *x, kiln_tensor *gamma, kiln_tensor *beta, double eps)
{
    const char *fn = "kiln_layer_norm";
    if (!composite_check(fn, x, -1, true))
        return NULL;
    composite_begin();
    x = composite_float(x);
    kiln_tensor *centered = kiln_sub(x, kiln_mean(x, -1, true));
    kiln_tensor *var = kiln_mean(kiln_mul(centered, centered), -1, true);
    kiln_tensor *y = kiln_mul(centered, kiln_rsqrt(kiln_add_scalar(var, eps)));
    if (gamma)
        y = kiln_mul(y, gamma);
    if (beta)
        y = kiln_add(y, beta);
    return composite_end(fn, y);
}

kiln_tensor *kiln_gelu(kiln_tensor *a)
{
    if (!composite_check("kiln_gelu", a, 0, false))
        return NULL;
    composite_begin();
    a = composite_float(a);
    /* The tanh's argument c (x + k x^3) as x (c + ck x^2): three products
     * where that form has four, which is what bounds a compiled GELU on a
     * core with AVX-512 (the tanh's rational takes ten more); one rounding
     * fewer, too. Eager and compiled code compute the same form. */
    double c = sqrt(2 / M_PI);
    kiln_tensor *inner = kiln_mul(a, kiln_add_scalar(kiln_mul_scalar(kiln_mul(a, a), c * 0.044715), c));
    kiln_tensor *gate = kiln_add_scalar(kiln_tanh(inner), 1);
    return composite_end("kiln_gelu", kiln_mul(kiln_mul_scalar(a, 0.5), gate));
}

kiln_tensor *kiln_silu(kiln_tensor *a)
{
    if (!composite_check("kiln_silu", a, 0, false))
        return NULL;
    composite_begin();
    a = composite_float(a);
    return composite_end("kiln_silu", kiln_mul(a, kiln_sigmoid(a)));
}
