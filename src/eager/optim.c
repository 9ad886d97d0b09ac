/* Optimizers (SGD with momentum and Nesterov, AdamW) and clipping by global
 * norm, written with kiln ops and kiln_assign: inside a marked body a step
 * traces, and the parameters and state are written back on every call. The
 * learning rate and AdamW's step count are 0-d tensors, so that changing
 * them is a new value, not a new trace. */
#include <math.h>
#include <stdlib.h>

#include "eager/internal.h"

typedef enum { OPT_SGD, OPT_ADAMW } opt_kind;

struct kiln_optimizer {
    opt_kind kind;
    int n;
    kiln_tensor **params;  /* retained */
    int per_param;         /* buffers per parameter */
    int n_state;
    kiln_tensor **state;   /* retained: the buffers of each parameter, then AdamW's counters, then lr */
    kiln_tensor *lr;       /* the last of state */
    kiln_tensor *step;     /* AdamW's count of steps, in state */
    /* AdamW's beta1 ** step and beta2 ** step, in state: kept by multiplying,
     * as a traced step fuses these 0-d values into every element's work,
     * where a power (an exp) would cost a libm call per element. */
    kiln_tensor *power1, *power2;
    double momentum, weight_decay, beta1, beta2, eps;
    bool nesterov;
};

/* -- Making one ------------------------------------------------------------- */

static int check_params(const char *fn, kiln_tensor *const *params, int n)
{
    if (recording())
        return core_fail(CORE_STATE, fn, "an optimizer's state must outlive a call: make it outside marked functions");
    if (!params)
        return core_fail_null_arg(fn, "params");
    if (n < 1)
        return core_fail(CORE_VALUE, fn, "needs at least one parameter, got %d", n);
    for (int i = 0; i < n; i++) {
        char what[32], d[DESCRIBE_MAX];
        snprintf(what, sizeof what, "params[%d]", i);
        if (check_operands(fn, 1, &params[i], (const char *const[]){what}) < 0)
            return -1;
        if (!ir_dtype_is_float(params[i]->dtype) || params[i]->grad_fn)
            return core_fail(CORE_VALUE, fn, "%s %s is not a float leaf", what, describe(d, params[i]));
        if (params[i]->device != params[0]->device)
            return core_fail(CORE_DEVICE, fn, "params[0] and %s are on different devices", what);
        for (int j = 0; j < i; j++) /* it would take two steps a call */
            if (params[j] == params[i])
                return core_fail(CORE_VALUE, fn, "params[%d] and %s are the same tensor", j, what);
    }
    return 0;
}

static int check_hyper(const char *fn, const char *name, double v, double lo, double hi)
{
    if (!(v >= lo && v <= hi))
        return core_fail(CORE_VALUE, fn, "%s %g is outside [%g, %g]", name, v, lo, hi);
    return 0;
}

/* A new unowned 0-d f64 tensor of value on device. */
static kiln_tensor *counter(kiln_device device, double value)
{
    kiln_tensor *t = kiln_to_device(kiln_full(KILN_F64, 0, NULL, value), device);
    eager_disown(t);
    return t;
}

/* A new unowned tensor of zeros like p. */
static kiln_tensor *zeros_like(const kiln_tensor *p)
{
    kiln_tensor *t = kiln_to_device(kiln_zeros(p->dtype, p->ndim, p->shape), p->device);
    eager_disown(t);
    return t;
}

void kiln_optimizer_free(kiln_optimizer *o)
{
    if (!o)
        return;
    for (int i = 0; o->params && i < o->n; i++)
        eager_unhold(o->params[i]);
    for (int i = 0; o->state && i < o->n_state; i++)
        kiln_release(o->state[i]);
    free(o->params);
    free(o->state);
    free(o);
}

static kiln_optimizer *optimizer_new(const char *fn, opt_kind kind, kiln_tensor *const *params, int n,
                                     int per_param, double lr)
{
    kiln_optimizer *o = calloc(1, sizeof *o);
    int extra = kind == OPT_ADAMW ? 4 : 1;
    if (o) {
        o->kind = kind;
        o->params = calloc((size_t)n, sizeof *o->params);
        o->state = calloc((size_t)(n * per_param + extra), sizeof *o->state);
    }
    if (!o || !o->params || !o->state) {
        kiln_optimizer_free(o);
        core_fail(CORE_NOMEM, fn, "out of memory");
        return NULL;
    }
    kiln_scope_begin();
    for (; o->n < n; o->n++)
        o->params[o->n] = eager_hold(params[o->n]);
    bool made = true;
    for (int i = 0; i < n * per_param; i++)
        made &= (o->state[o->n_state++] = zeros_like(params[i / per_param])) != NULL;
    if (kind == OPT_ADAMW) {
        made &= (o->step = o->state[o->n_state++] = counter(params[0]->device, 0)) != NULL;
        made &= (o->power1 = o->state[o->n_state++] = counter(params[0]->device, 1)) != NULL;
        made &= (o->power2 = o->state[o->n_state++] = counter(params[0]->device, 1)) != NULL;
    }
    made &= (o->lr = o->state[o->n_state++] = counter(params[0]->device, lr)) != NULL;
    kiln_scope_end();
    o->per_param = per_param;
    if (!made) {
        kiln_optimizer_free(o);
        return NULL;
    }
    core_succeeded();
    return o;
}

kiln_optimizer *kiln_sgd(kiln_tensor *const *params, int n, double lr, double momentum, double weight_decay,
                         bool nesterov)
{
    const char *fn = "kiln_sgd";
    if (check_params(fn, params, n) < 0 || check_hyper(fn, "lr", lr, 0, INFINITY) < 0 ||
        check_hyper(fn, "momentum", momentum, 0, INFINITY) < 0 ||
        check_hyper(fn, "weight_decay", weight_decay, 0, INFINITY) < 0)
        return NULL;
    if (nesterov && momentum <= 0) {
        core_fail(CORE_VALUE, fn, "Nesterov momentum needs a momentum above 0");
        return NULL;
    }
    kiln_optimizer *o = optimizer_new(fn, OPT_SGD, params, n, momentum > 0 ? 1 : 0, lr);
    if (o) {
        o->momentum = momentum;
        o->weight_decay = weight_decay;
        o->nesterov = nesterov;
    }
    return o;
}

kiln_optimizer *kiln_adamw(kiln_tensor *const *params, int n, double lr, double beta1, double beta2, double eps,
                           double weight_decay)
{
    const char *fn = "kiln_adamw";
    if (check_params(fn, params, n) < 0 || check_hyper(fn, "lr", lr, 0, INFINITY) < 0 ||
        check_hyper(fn, "beta1", beta1, 0, nextafter(1, 0)) < 0 ||
        check_hyper(fn, "beta2", beta2, 0, nextafter(1, 0)) < 0 || check_hyper(fn, "eps", eps, 0, INFINITY) < 0 ||
        check_hyper(fn, "weight_decay", weight_decay, 0, INFINITY) < 0)
        return NULL;
    kiln_optimizer *o = optimizer_new(fn, OPT_ADAMW, params, n, 2, lr);
    if (o) {
        o->beta1 = beta1;
        o->beta2 = beta2;
        o->eps = eps;
        o->weight_decay = weight_decay;
    }
    return o;
}

/* -- Steps ------------------------------------------------------------------- */

/* torch.optim.SGD's update of parameter i with gradient g. */
static int sgd_update(kiln_optimizer *o, int i, kiln_tensor *g)
{
    kiln_tensor *p = o->params[i];
    if (o->weight_decay > 0)
        g = kiln_add(g, kiln_mul_scalar(p, o->weight_decay));
    if (o->momentum > 0) {
        kiln_tensor *buf = o->state[i];
        kiln_tensor *next = kiln_add(kiln_mul_scalar(buf, o->momentum), g);
        if (!next || kiln_assign(buf, next) < 0)
            return -1;
        g = o->nesterov ? kiln_add(g, kiln_mul_scalar(next, o->momentum)) : next;
    }
    return g ? kiln_assign(p, kiln_sub(p, kiln_mul(g, o->lr))) : -1;
}

/* torch.optim.AdamW's update of parameter i with gradient g, the bias
 * corrections given (0-d). */
static int adamw_update(kiln_optimizer *o, int i, kiln_tensor *g, kiln_tensor *correct1, kiln_tensor *correct2)
{
    kiln_tensor *p = o->params[i], *m = o->state[2 * i], *v = o->state[2 * i + 1];
    kiln_tensor *decayed = p;
    if (o->weight_decay > 0)
        decayed = kiln_mul(p, kiln_add_scalar(kiln_mul_scalar(o->lr, -o->weight_decay), 1));
    kiln_tensor *m_next = kiln_add(kiln_mul_scalar(m, o->beta1), kiln_mul_scalar(g, 1 - o->beta1));
    kiln_tensor *v_next = kiln_add(kiln_mul_scalar(v, o->beta2), kiln_mul_scalar(kiln_mul(g, g), 1 - o->beta2));
    if (!m_next || !v_next || kiln_assign(m, m_next) < 0 || kiln_assign(v, v_next) < 0)
        return -1;
    kiln_tensor *denom = kiln_add_scalar(kiln_div(kiln_sqrt(v_next), kiln_sqrt(correct2)), o->eps);
    kiln_tensor *step = kiln_mul(kiln_div(m_next, denom), kiln_div(o->lr, correct1));
    return kiln_assign(p, kiln_sub(decayed, step));
}

/* power *= beta (assigned), and 1 - the new power: a bias correction, 0-d. */
static kiln_tensor *correction(kiln_tensor *power, double beta)
{
    kiln_tensor *next = kiln_mul_scalar(power, beta);
    if (!next || kiln_assign(power, next) < 0)
        return NULL;
    return kiln_add_scalar(kiln_neg(next), 1);
}

static int adamw_step(kiln_optimizer *o)
{
    bool any = false;
    for (int i = 0; i < o->n; i++)
        any |= grad_peek(o->params[i]) != NULL;
    if (!any)
        return 0;
    kiln_tensor *step = kiln_add_scalar(o->step, 1);
    if (!step || kiln_assign(o->step, step) < 0)
        return -1;
    kiln_tensor *correct1 = correction(o->power1, o->beta1), *correct2 = correction(o->power2, o->beta2);
    int status = correct1 && correct2 ? 0 : -1;
    for (int i = 0; status == 0 && i < o->n; i++) {
        kiln_tensor *g = grad_peek(o->params[i]);
        kiln_scope_begin(); /* one parameter's temporaries at a time */
        if (g)
            status = adamw_update(o, i, g, correct1, correct2);
        kiln_scope_end();
    }
    return status;
}

static int sgd_step(kiln_optimizer *o)
{
    int status = 0;
    for (int i = 0; status == 0 && i < o->n; i++) {
        kiln_tensor *g = grad_peek(o->params[i]);
        kiln_scope_begin();
        if (g)
            status = sgd_update(o, i, g);
        kiln_scope_end();
    }
    return status;
}

static int check_optimizer(const char *fn, const kiln_optimizer *o)
{
    if (!o)
        return core_fail_null_arg(fn, "o");
    for (int i = 0; i < o->n; i++)
        if (!eager_alive(o->params[i]))
            return core_fail(CORE_STATE, fn, "params[%d] was released too many times", i);
    return 0;
}

/* Runs a step's ops in a scope of their own, recording no gradients; a
 * failing op's message is reported under fn. */
int kiln_optimizer_step(kiln_optimizer *o)
{
    const char *fn = "kiln_optimizer_step";
    if (check_optimizer(fn, o) < 0)
        return -1;
    kiln_no_grad_begin();
    kiln_scope_begin();
    int status = o->kind == OPT_ADAMW ? adamw_step(o) : sgd_step(o);
    kiln_scope_end();
    kiln_no_grad_end();
    if (status < 0) {
        char inner[1024];
        snprintf(inner, sizeof inner, "%s", kiln_last_error());
        return core_fail(CORE_VALUE, fn, "%s", inner);
    }
    core_succeeded();
    return 0;
}

int kiln_optimizer_zero_grad(kiln_optimizer *o)
{
    if (check_optimizer("kiln_optimizer_zero_grad", o) < 0)
        return -1;
    for (int i = 0; i < o->n; i++)
        if (kiln_zero_grad(o->params[i]) < 0)
            return -1;
    return 0;
}

int kiln_optimizer_set_lr(kiln_optimizer *o, double lr)
{
    const char *fn = "kiln_optimizer_set_lr";
    if (check_optimizer(fn, o) < 0 || check_hyper(fn, "lr", lr, 0, INFINITY) < 0)
        return -1;
    kiln_tensor *value = eager_scalar_literal(KILN_F64, lr);
    int status = value ? kiln_assign(o->lr, value) : -1;
    kiln_release(value);
    return status;
}

int kiln_optimizer_state_count(const kiln_optimizer *o)
{
    return check_optimizer("kiln_optimizer_state_count", o) < 0 ? -1 : o->n_state;
}

kiln_tensor *kiln_optimizer_state(const kiln_optimizer *o, int i)
{
    const char *fn = "kiln_optimizer_state";
    if (check_optimizer(fn, o) < 0)
        return NULL;
    if (i < 0 || i >= o->n_state) {
        core_fail(CORE_VALUE, fn, "state %d is outside 0..%d", i, o->n_state - 1);
        return NULL;
    }
    return o->state[i];
}

/* -- Clipping ------------------------------------------------------------------ */

static kiln_tensor *global_norm(kiln_tensor *const *params, int n)
{
    kiln_tensor *total = NULL;
    for (int i = 0; i < n; i++) {
        kiln_tensor *g = grad_peek(params[i]);
        if (!g)
            continue;
        kiln_tensor *squares = kiln_sum(kiln_mul(g, g), KILN_ALL, false);
        total = total ? kiln_add(total, squares) : squares;
        if (!total)
            return NULL;
    }
    return total ? kiln_sqrt(total) : tensor_own(eager_scalar_literal(KILN_F32, 0));
}

kiln_tensor *kiln_clip_grad_norm(kiln_tensor *const *params, int n, double max_norm)
{
    const char *fn = "kiln_clip_grad_norm";
    if (!params || n < 1) {
        core_fail(CORE_VALUE, fn, "needs at least one parameter (params %s, n %d)", params ? "given" : "NULL", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (check_operands(fn, 1, &params[i], (const char *const[]){"a parameter"}) < 0)
            return NULL;
    if (check_hyper(fn, "max_norm", max_norm, 0, INFINITY) < 0)
        return NULL;
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *norm = global_norm(params, n);
    kiln_tensor *inverse = norm ? kiln_pow_scalar(kiln_add_scalar(norm, 1e-6), -1) : NULL;
    kiln_tensor *scale = inverse ? kiln_minimum_scalar(kiln_mul_scalar(inverse, max_norm), 1) : NULL;
    int status = scale ? 0 : -1;
    for (int i = 0; status == 0 && i < n; i++) {
        kiln_tensor *g = grad_peek(params[i]);
        kiln_tensor *scaled = g ? kiln_mul(g, scale) : NULL;
        if (g)
            status = scaled ? grad_replace(params[i], scaled) : -1;
    }
    kiln_keep(status == 0 ? norm : NULL);
    kiln_scope_end();
    kiln_no_grad_end();
    return status == 0 ? norm : NULL;
}
