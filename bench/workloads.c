/* The standard workloads (f32): gelu, softmax, layernorm, mlp, attention,
 * tiny, mish, rmsnorm, silu; and matmul, which kiln-bench alone runs.
 *
 * GPU sizes: gelu 2^28 and softmax 16384x16384 (1 GiB each, far past the
 * H200's 60 MB L2), layer norm 16384x4096 (256 MiB), the mlp of a 4096-token
 * batch through a 2048 -> 8192 -> 2048 layer (275 GFLOP), attention over
 * 8x16 heads of 2048 tokens by 64 (137 GFLOP; its scores take 2 GiB), and
 * matmul 8192^3 (1.1 TFLOP); mish and silu as gelu, rmsnorm as layer norm. */
#include "workloads.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* -- Bodies ---------------------------------------------------------------- */

static int gelu_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_gelu(in[0]);
    return out[0] ? 0 : -1;
}

static int softmax_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}

static int layernorm_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const workload_state *s = user;
    out[0] = kiln_layer_norm(in[0], s->weights[0], s->weights[1], 1e-5);
    return out[0] ? 0 : -1;
}

/* x@W1+b1 -> gelu -> @W2+b2 */
static int mlp_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *const *w = ((const workload_state *)user)->weights;
    kiln_tensor *h = kiln_gelu(kiln_add(kiln_matmul(in[0], w[0]), w[1]));
    out[0] = kiln_add(kiln_matmul(h, w[2]), w[3]);
    return out[0] ? 0 : -1;
}

/* softmax(q@kᵀ/√d)@v */
static int attention_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *q = in[0], *k = in[1], *v = in[2];
    double scale = 1 / sqrt((double)kiln_shape(q)[kiln_ndim(q) - 1]);
    kiln_tensor *scores = kiln_mul_scalar(kiln_matmul(q, kiln_transpose(k, -2, -1)), scale);
    out[0] = kiln_matmul(kiln_softmax(scores, -1), v);
    return out[0] ? 0 : -1;
}

static int matmul_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_matmul(in[0], in[1]);
    return out[0] ? 0 : -1;
}

/* Ten x*1.0001+0.5 steps: what dispatch costs. */
static int tiny_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *x = in[0];
    for (int i = 0; i < 10; i++)
        x = kiln_add_scalar(kiln_mul_scalar(x, 1.0001), 0.5);
    out[0] = x;
    return x ? 0 : -1;
}

/* mish as people write it: x * tanh(softplus(x)), three transcendentals in a chain. */
static int mish_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *x = in[0];
    out[0] = kiln_mul(x, kiln_tanh(kiln_log(kiln_add_scalar(kiln_exp(x), 1))));
    return out[0] ? 0 : -1;
}

/* x * rsqrt(mean(x^2) + eps) * gamma over the last axis (LLaMA's RMSNorm). */
static int rmsnorm_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const workload_state *s = user;
    kiln_tensor *x = in[0];
    kiln_tensor *scale = kiln_rsqrt(kiln_add_scalar(kiln_mean(kiln_mul(x, x), -1, true), 1e-6));
    out[0] = kiln_mul(kiln_mul(x, scale), s->weights[0]);
    return out[0] ? 0 : -1;
}

static int silu_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_silu(in[0]);
    return out[0] ? 0 : -1;
}

/* -- Data ------------------------------------------------------------------ */

/* A new f32 tensor of normal values times scale. */
static kiln_tensor *normal(int ndim, const int64_t *shape, uint64_t seed, double scale)
{
    if (scale == 1)
        return kiln_randn(ndim, shape, seed);
    kiln_scope_begin();
    kiln_tensor *t = kiln_keep(kiln_mul_scalar(kiln_randn(ndim, shape, seed), scale));
    kiln_scope_end();
    return t;
}

static int all_made(kiln_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        if (!ts[i])
            return -1;
    return 0;
}

static int gelu_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    static const int log2_n[] = {16, 24, 28};
    int64_t n = INT64_C(1) << log2_n[size];
    in[0] = normal(1, &n, 1, 1);
    s->bytes = 8.0 * (double)n;
    snprintf(s->size, sizeof s->size, "2^%d", log2_n[size]);
    return all_made(in, 1);
}

static int softmax_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    static const int64_t side[] = {256, 4096, 16384};
    int64_t shape[2] = {side[size], side[size]};
    in[0] = normal(2, shape, 2, 1);
    s->bytes = 8.0 * (double)(shape[0] * shape[1]);
    snprintf(s->size, sizeof s->size, "%lldx%lld", (long long)shape[0], (long long)shape[1]);
    return all_made(in, 1);
}

/* layernorm's and rmsnorm's rows x columns */
static const int64_t norm_shapes[][2] = {{256, 128}, {8192, 1024}, {16384, 4096}};

static int layernorm_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    const int64_t *shape = norm_shapes[size];
    in[0] = normal(2, shape, 3, 1);
    s->weights[0] = normal(1, shape + 1, 4, 1);
    s->weights[1] = normal(1, shape + 1, 5, 1);
    s->bytes = 8.0 * (double)(shape[0] * shape[1]) + 8.0 * (double)shape[1];
    snprintf(s->size, sizeof s->size, "%lldx%lld", (long long)shape[0], (long long)shape[1]);
    return all_made(in, 1) | all_made(s->weights, 2);
}

static int rmsnorm_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    const int64_t *shape = norm_shapes[size];
    in[0] = normal(2, shape, 18, 1);
    s->weights[0] = normal(1, shape + 1, 19, 1);
    s->bytes = 8.0 * (double)(shape[0] * shape[1]) + 4.0 * (double)shape[1];
    snprintf(s->size, sizeof s->size, "%lldx%lld", (long long)shape[0], (long long)shape[1]);
    return all_made(in, 1) | all_made(s->weights, 1);
}

static int mlp_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    static const int64_t dims[][3] = {{32, 64, 256}, {256, 1024, 4096}, {4096, 2048, 8192}}; /* m, k, h */
    int64_t m = dims[size][0], k = dims[size][1], h = dims[size][2];
    in[0] = normal(2, (int64_t[]){m, k}, 6, 1);
    s->weights[0] = normal(2, (int64_t[]){k, h}, 7, 1 / sqrt((double)k));
    s->weights[1] = normal(1, &h, 8, 0.1);
    s->weights[2] = normal(2, (int64_t[]){h, k}, 9, 1 / sqrt((double)h));
    s->weights[3] = normal(1, &k, 10, 0.1);
    s->gemms[0] = (workload_gemm){1, m, k, h};
    s->gemms[1] = (workload_gemm){1, m, h, k};
    s->n_gemms = 2;
    snprintf(s->size, sizeof s->size, "%lldx%lld, %lldx%lld", (long long)m, (long long)k, (long long)k,
             (long long)h);
    return all_made(in, 1) | all_made(s->weights, 4);
}

static int attention_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    static const int64_t shapes[][4] = {{2, 2, 32, 16}, {8, 8, 256, 64}, {8, 16, 2048, 64}};
    const int64_t *shape = shapes[size];
    for (int i = 0; i < 3; i++)
        in[i] = normal(4, shape, 11 + (uint64_t)i, 1);
    int64_t heads = shape[0] * shape[1], seq = shape[2], dim = shape[3];
    s->gemms[0] = (workload_gemm){heads, seq, dim, seq}; /* q @ kᵀ */
    s->gemms[1] = (workload_gemm){heads, seq, seq, dim}; /* weights @ v */
    s->n_gemms = 2;
    s->bytes = 4.0 * 4.0 * (double)(heads * seq * dim); /* q, k, v in, the result out */
    snprintf(s->size, sizeof s->size, "%lldx%lldx%lldx%lld", (long long)shape[0], (long long)shape[1],
             (long long)shape[2], (long long)shape[3]);
    return all_made(in, 3);
}

static int tiny_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    int64_t n = 64;
    in[0] = normal(1, &n, 14, 1);
    snprintf(s->size, sizeof s->size, "64");
    return all_made(in, 1);
}

static int matmul_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    static const int64_t side[] = {128, 2048, 8192};
    int64_t n = side[size];
    in[0] = normal(2, (int64_t[]){n, n}, 15, 1);
    in[1] = normal(2, (int64_t[]){n, n}, 16, 1 / sqrt((double)n));
    s->gemms[0] = (workload_gemm){1, n, n, n};
    s->n_gemms = 1;
    s->bytes = 3.0 * 4.0 * (double)(n * n);
    snprintf(s->size, sizeof s->size, "%lld^3", (long long)n);
    return all_made(in, 2);
}

const workload workloads[] = {
    {"gelu", "tanh-form GELU", 1, gelu_body, gelu_setup},
    {"softmax", "row softmax", 1, softmax_body, softmax_setup},
    {"layernorm", "layer norm over the last axis, with gamma and beta", 1, layernorm_body, layernorm_setup},
    {"mlp", "x@W1+b1 -> gelu -> @W2+b2", 1, mlp_body, mlp_setup},
    {"attention", "softmax(q@k^T/sqrt(d))@v", 3, attention_body, attention_setup},
    {"tiny", "ten x*1.0001+0.5 steps (dispatch overhead)", 1, tiny_body, tiny_setup},
    {"mish", "x*tanh(log(1+exp(x)))", 1, mish_body, gelu_setup},
    {"rmsnorm", "x*rsqrt(mean(x*x)+1e-6)*gamma over the last axis", 1, rmsnorm_body, rmsnorm_setup},
    {"silu", "x*sigmoid(x)", 1, silu_body, gelu_setup},
};
const int workload_count = (int)(sizeof workloads / sizeof *workloads);
const workload workload_matmul = {"matmul", "f32 [n,n] @ [n,n]", 2, matmul_body, matmul_setup};

const workload *workload_find(const char *name)
{
    for (int i = 0; i < workload_count; i++)
        if (!strcmp(workloads[i].name, name))
            return &workloads[i];
    return strcmp(workload_matmul.name, name) ? NULL : &workload_matmul;
}

/* *t on d; the tensor it leaves is released. */
static int move(kiln_tensor **t, kiln_device d)
{
    if (!*t)
        return 0;
    kiln_tensor *moved = kiln_to_device(*t, d);
    if (!moved)
        return -1;
    kiln_release(*t);
    *t = moved;
    return 0;
}

int workload_to_device(const workload *w, kiln_tensor **in, workload_state *state, kiln_device d)
{
    for (int i = 0; i < w->n_in; i++)
        if (move(&in[i], d) < 0)
            return -1;
    for (int i = 0; i < WORKLOAD_MAX_WEIGHTS; i++)
        if (move(&state->weights[i], d) < 0)
            return -1;
    return 0;
}

void workload_free(const workload *w, kiln_tensor **in, workload_state *state)
{
    for (int i = 0; i < w->n_in; i++)
        kiln_release(in[i]);
    for (int i = 0; i < WORKLOAD_MAX_WEIGHTS; i++)
        kiln_release(state->weights[i]);
}
