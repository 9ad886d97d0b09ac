/* dynprog: random programs over a symbolic batch and sequence ([B, T, C]
 * values), for the dynamic-shape tests on every backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dynprog.h"

/* A value's shape is a list of dimensions, each B, T or a fixed size, so that
 * one program runs at any (B, T). Every op the generator emits keeps B and T
 * symbolic by the rules of kiln.h's kiln_dynamic: broadcasting between values
 * that share them, -1 in reshapes, whole-axis reductions, products with
 * fixed weights, attention over T. */

enum { DIM_B = -1, DIM_T = -2, MAX_VALUES = 48, MAX_INSTRS = 40 };

typedef struct {
    int ndim;
    int64_t dims[4];
} vshape;

typedef enum {
    I_UNARY, I_BINARY, I_PARAM, I_REDUCE, I_REDUCE_BATCH, I_SOFTMAX, I_LAYER_NORM, I_FLATTEN, I_UNSQUEEZE,
    I_SQUEEZE, I_TRANSPOSE, I_LINEAR, I_ATTENTION, I_CONCAT, I_SLICE, I_KINDS
} ikind;

typedef struct {
    ikind kind;
    int a, b, c; /* operand values */
    int which;   /* op variant */
} instr;

struct dynprog {
    int64_t C;
    kiln_tensor *gamma, *w_in, *w_out, *bias; /* captured: [C], [C, 2C], [2C, C], [2C] */
    vshape shapes[MAX_VALUES];
    instr code[MAX_INSTRS];
    int n_code, n_values, out[2];
};
typedef dynprog program;

static uint64_t next(uint64_t *state)
{
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return *state >> 33;
}

static int pick(uint64_t *state, int n)
{
    return (int)(next(state) % (uint64_t)n);
}

static bool same_shape(const vshape *a, const vshape *b)
{
    return a->ndim == b->ndim && !memcmp(a->dims, b->dims, (size_t)a->ndim * sizeof *a->dims);
}

/* b broadcasts against a giving a's shape. */
static bool broadcasts_into(const vshape *b, const vshape *a)
{
    if (b->ndim > a->ndim)
        return false;
    for (int k = 1; k <= b->ndim; k++) {
        int64_t x = a->dims[a->ndim - k], y = b->dims[b->ndim - k];
        if (y != x && y != 1)
            return false;
    }
    return true;
}

static int last(const vshape *s)
{
    return s->ndim ? (int)s->dims[s->ndim - 1] : 0;
}

/* A value among the first n whose shape satisfies ok with a, or -1. */
static int find_value(const program *p, uint64_t *state, int a, bool (*ok)(const vshape *, const vshape *))
{
    int start = pick(state, p->n_values);
    for (int k = 0; k < p->n_values; k++) {
        int v = (start + k) % p->n_values;
        if (v != a && ok(&p->shapes[v], &p->shapes[a]))
            return v;
    }
    return -1;
}

/* The shape instruction i gives, or false when it does not apply. */
static bool plan_instr(program *p, instr *in, uint64_t *state, vshape *out)
{
    const vshape *a = &p->shapes[in->a];
    *out = *a;
    switch (in->kind) {
    case I_UNARY:
        in->which = pick(state, 7);
        return true;
    case I_BINARY:
        in->which = pick(state, 4);
        return (in->b = find_value(p, state, in->a, broadcasts_into)) >= 0;
    case I_PARAM:
        in->which = pick(state, 2);
        return last(a) == p->C;
    case I_REDUCE:
        in->which = pick(state, 3);
        out->dims[a->ndim - 1] = 1;
        return a->ndim >= 2;
    case I_REDUCE_BATCH:
        if (a->ndim < 2 || a->dims[0] != DIM_B)
            return false;
        out->ndim--;
        memmove(out->dims, out->dims + 1, (size_t)out->ndim * sizeof *out->dims);
        return true;
    case I_SOFTMAX:
        return a->ndim >= 1;
    case I_LAYER_NORM:
        return last(a) == p->C;
    case I_FLATTEN: /* [B, T, X] -> [-1, X] */
        if (a->ndim != 3 || a->dims[2] < 0)
            return false;
        out->ndim = 2;
        out->dims[0] = DIM_B * 10; /* B*T: no other value's first dimension */
        out->dims[1] = a->dims[2];
        return true;
    case I_UNSQUEEZE:
        if (a->ndim >= 4)
            return false;
        memmove(out->dims + 2, out->dims + 1, (size_t)(a->ndim - 1) * sizeof *out->dims);
        out->dims[1] = 1;
        out->ndim++;
        return a->ndim >= 1;
    case I_SQUEEZE:
        if (a->ndim < 2 || a->dims[1] != 1)
            return false;
        memmove(out->dims + 1, out->dims + 2, (size_t)(a->ndim - 2) * sizeof *out->dims);
        out->ndim--;
        return true;
    case I_TRANSPOSE:
        if (a->ndim < 2)
            return false;
        out->dims[a->ndim - 1] = a->dims[a->ndim - 2];
        out->dims[a->ndim - 2] = a->dims[a->ndim - 1];
        return true;
    case I_LINEAR:
        in->which = pick(state, 2);
        if (last(a) != (in->which ? 2 * p->C : p->C))
            return false;
        out->dims[a->ndim - 1] = in->which ? p->C : 2 * p->C;
        return true;
    case I_ATTENTION:
        if (a->ndim != 3 || a->dims[0] != DIM_B || a->dims[1] != DIM_T || a->dims[2] < 0)
            return false;
        in->b = find_value(p, state, in->a, (bool (*)(const vshape *, const vshape *))same_shape);
        in->c = find_value(p, state, in->a, (bool (*)(const vshape *, const vshape *))same_shape);
        return in->b >= 0 && in->c >= 0;
    case I_CONCAT:
        if (a->ndim < 1 || a->dims[a->ndim - 1] < 0)
            return false;
        in->b = find_value(p, state, in->a, (bool (*)(const vshape *, const vshape *))same_shape);
        out->dims[a->ndim - 1] *= 2;
        return in->b >= 0;
    case I_SLICE:
        if (a->ndim < 1 || a->dims[a->ndim - 1] < 2)
            return false;
        out->dims[a->ndim - 1] = (a->dims[a->ndim - 1] + 1) / 2;
        return true;
    case I_KINDS: break;
    }
    return false;
}

static kiln_tensor *param(int64_t seed, int ndim, const int64_t *shape, kiln_device device)
{
    kiln_scope_begin();
    kiln_tensor *t = kiln_keep(kiln_to_device(kiln_mul_scalar(kiln_randn(ndim, shape, (uint64_t)seed), 0.5), device));
    kiln_scope_end();
    return t;
}

program *dynprog_new(uint64_t seed, kiln_device device)
{
    program *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    uint64_t state = seed * 2654435761ULL + 1;
    p->C = 2 + pick(&state, 11);
    int64_t c = p->C, c2 = 2 * p->C;
    p->gamma = param((int64_t)seed, 1, &c, device);
    p->w_in = param((int64_t)seed + 1, 2, (int64_t[]){c, c2}, device);
    p->w_out = param((int64_t)seed + 2, 2, (int64_t[]){c2, c}, device);
    p->bias = param((int64_t)seed + 3, 1, &c2, device);
    p->shapes[0] = (vshape){3, {DIM_B, DIM_T, c}};
    p->shapes[1] = (vshape){3, {DIM_B, DIM_T, c}};
    p->shapes[2] = (vshape){2, {DIM_T, c}};
    p->n_values = 3;
    int want = 8 + pick(&state, MAX_INSTRS - 8);
    for (int tries = 0; p->n_code < want && tries < 2000; tries++) {
        instr in = {.kind = (ikind)pick(&state, I_KINDS), .a = pick(&state, p->n_values), .b = -1, .c = -1};
        vshape out;
        if (!plan_instr(p, &in, &state, &out))
            continue;
        p->code[p->n_code++] = in;
        p->shapes[p->n_values++] = out;
    }
    p->out[0] = p->n_values - 1;
    p->out[1] = 3 + pick(&state, p->n_values - 3);
    return p;
}

void dynprog_free(program *p)
{
    if (!p)
        return;
    kiln_release(p->gamma);
    kiln_release(p->w_in);
    kiln_release(p->w_out);
    kiln_release(p->bias);
    free(p);
}

static kiln_tensor *unary(kiln_tensor *a, int which)
{
    switch (which) {
    case 0: return kiln_tanh(a);
    case 1: return kiln_sigmoid(a);
    case 2: return kiln_relu(a);
    case 3: return kiln_sin(a);
    case 4: return kiln_mul_scalar(a, 0.5);
    case 5: return kiln_gelu(a);
    default: return kiln_exp(kiln_tanh(a));
    }
}

static kiln_tensor *binary(kiln_tensor *a, kiln_tensor *b, int which)
{
    switch (which) {
    case 0: return kiln_add(a, b);
    case 1: return kiln_sub(a, b);
    case 2: return kiln_mul(a, b);
    default: return kiln_maximum(a, b);
    }
}

static kiln_tensor *attention(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v, int64_t c)
{
    kiln_tensor *scores = kiln_mul_scalar(kiln_matmul(q, kiln_transpose(k, 1, 2)), 1.0 / sqrt((double)c));
    return kiln_matmul(kiln_softmax(scores, -1), v);
}

static kiln_tensor *run_instr(const program *p, const instr *in, kiln_tensor *const *v)
{
    kiln_tensor *a = v[in->a];
    int nd = kiln_ndim(a);
    switch (in->kind) {
    case I_UNARY: return unary(a, in->which);
    case I_BINARY: return binary(a, v[in->b], in->which);
    case I_PARAM: return in->which ? kiln_mul(a, p->gamma) : kiln_add(a, p->gamma);
    case I_REDUCE:
        return in->which == 0 ? kiln_sum(a, -1, true) : in->which == 1 ? kiln_mean(a, -1, true) : kiln_max(a, -1, true);
    case I_REDUCE_BATCH: return kiln_mean(a, 0, false);
    case I_SOFTMAX: return kiln_softmax(a, -1);
    case I_LAYER_NORM: return kiln_layer_norm(a, p->gamma, NULL, 1e-5);
    case I_FLATTEN: return kiln_reshape(a, 2, (int64_t[]){-1, p->shapes[in->a].dims[2]});
    case I_UNSQUEEZE: return kiln_unsqueeze(a, 1);
    case I_SQUEEZE: return kiln_squeeze(a, 1);
    case I_TRANSPOSE: return kiln_transpose(a, nd - 2, nd - 1);
    case I_LINEAR: return in->which ? kiln_matmul(a, p->w_out) : kiln_add(kiln_matmul(a, p->w_in), p->bias);
    case I_ATTENTION: return attention(a, v[in->b], v[in->c], p->C);
    case I_CONCAT: return kiln_concat((kiln_tensor *[]){a, v[in->b]}, 2, -1);
    case I_SLICE: return kiln_slice(a, -1, 0, (p->shapes[in->a].dims[nd - 1] + 1) / 2, 1);
    case I_KINDS: break;
    }
    return NULL;
}

int dynprog_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const program *p = user;
    kiln_tensor *v[MAX_VALUES] = {in[0], in[1], in[2]};
    for (int i = 0; i < p->n_code; i++)
        if (!(v[3 + i] = run_instr(p, &p->code[i], v)))
            return -1;
    out[0] = v[p->out[0]];
    out[1] = v[p->out[1]];
    return 0;
}

void dynprog_inputs(const program *p, int64_t b, int64_t t, uint64_t seed, kiln_tensor **in)
{
    in[0] = kiln_randn(3, (int64_t[]){b, t, p->C}, seed);
    in[1] = kiln_randn(3, (int64_t[]){b, t, p->C}, seed + 1);
    in[2] = kiln_randn(2, (int64_t[]){t, p->C}, seed + 2);
}

const uint32_t DYNPROG_DIMS[DYNPROG_INPUTS] = {0x3, 0x3, 0x1};

