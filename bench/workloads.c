/* The standard workloads (f32): gelu, softmax, layernorm, mlp, attention,
 * tiny, mish, rmsnorm, silu, softmax_row, resnet50 (batch 1 and 16) and gpt
 * (bench/models.c); and matmul and the training steps (train_mlp,
 * train_gpt, train_cnn), which kiln-bench alone runs.
 *
 * GPU sizes: gelu 2^28 and softmax 16384x16384 (1 GiB each, far past the
 * H200's 60 MB L2), layer norm 16384x4096 (256 MiB), the mlp of a 4096-token
 * batch through a 2048 -> 8192 -> 2048 layer (275 GFLOP), attention over
 * 8x16 heads of 2048 tokens by 64 (137 GFLOP; its scores take 2 GiB), and
 * matmul 8192^3 (1.1 TFLOP); mish and silu as gelu, rmsnorm as layer norm,
 * softmax_row one row of 2^26. */
#include "workloads.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The end of a training step: loss's gradients and the optimizer's step;
 * the output is the loss before the step. */
static int train_step(const workload_state *s, kiln_tensor *loss, kiln_tensor **out)
{
    if (kiln_backward(loss) < 0 || kiln_optimizer_step(s->optimizer) < 0)
        return -1;
    out[0] = kiln_detach(loss);
    return out[0] ? 0 : -1;
}

/* mlp_body, then -mean(sum(log_softmax(logits) * labels)) against one-hot
 * labels (in[1]), its gradient, and an AdamW step. */
static int train_mlp_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const workload_state *s = user;
    kiln_tensor *logits = NULL;
    if (kiln_optimizer_zero_grad(s->optimizer) < 0 || mlp_body(in, &logits, user) < 0)
        return -1;
    kiln_tensor *picked = kiln_sum(kiln_mul(kiln_log_softmax(logits, -1), in[1]), -1, false);
    return train_step(s, kiln_neg(kiln_mean(picked, KILN_ALL, false)), out);
}

/* GPT blocks on ids in[0] [B, T], cross-entropy against the ids that follow
 * (in[1]), backward, AdamW. */
static int train_gpt_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const workload_state *s = user;
    if (kiln_optimizer_zero_grad(s->optimizer) < 0)
        return -1;
    int64_t vocab = ((const gpt_config *)s->config)->vocab;
    kiln_tensor *logits = kiln_reshape(gpt_forward(s->config, &s->model, in[0]), 2, (int64_t[]){-1, vocab});
    return train_step(s, kiln_cross_entropy(logits, kiln_reshape(in[1], 1, (int64_t[]){-1})), out);
}

/* The CNN on images in[0], cross-entropy against labels in[1], backward,
 * SGD with momentum. */
static int train_cnn_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const workload_state *s = user;
    if (kiln_optimizer_zero_grad(s->optimizer) < 0)
        return -1;
    return train_step(s, kiln_cross_entropy(cnn_forward(s->config, &s->model, in[0]), in[1]), out);
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

static int resnet_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const workload_state *s = user;
    out[0] = resnet_forward(s->config, &s->model, in[0]);
    return out[0] ? 0 : -1;
}

static int gpt_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const workload_state *s = user;
    out[0] = gpt_forward(s->config, &s->model, in[0]);
    return out[0] ? 0 : -1;
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

/* One row, as a language model's logits over its vocabulary at batch 1:
 * what threads share is the row's pieces (ir/long_rows.c). */
static int softmax_row_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    static const int log2_n[] = {14, 20, 26};
    int64_t shape[2] = {1, INT64_C(1) << log2_n[size]};
    in[0] = normal(2, shape, 20, 1);
    s->bytes = 8.0 * (double)shape[1];
    snprintf(s->size, sizeof s->size, "1x2^%d", log2_n[size]);
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

/* The parameters a training step updates: the weights, else the model's. */
static int trained_params(const workload_state *s, kiln_tensor **params)
{
    int n = 0;
    for (int i = 0; i < WORKLOAD_MAX_WEIGHTS && s->weights[i]; i++)
        params[n++] = s->weights[i];
    for (int i = 0; !n && i < s->model.n; i++)
        params[i] = s->model.p[i];
    return n ? n : s->model.n;
}

/* AdamW as PyTorch's defaults have it (the mlp, gpt), or SGD with momentum
 * 0.9 and weight decay 5e-4 (the CNN), over the trained parameters, which
 * need gradients. */
static int train_optimizer(workload_state *s)
{
    kiln_optimizer_free(s->optimizer);
    kiln_tensor *params[WORKLOAD_MAX_SAVED];
    int n = trained_params(s, params);
    for (int i = 0; i < n; i++)
        if (kiln_requires_grad(params[i], true) < 0)
            return -1;
    s->optimizer = s->sgd ? kiln_sgd(params, n, 1e-2, 0.9, 5e-4, false)
                          : kiln_adamw(params, n, 1e-3, 0.9, 0.999, 1e-8, 1e-2);
    return s->optimizer ? 0 : -1;
}

static int train_mlp_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    if (mlp_setup(size, in, s) < 0)
        return -1;
    int64_t m = s->gemms[0].m, k = s->gemms[0].k, h = s->gemms[0].n;
    int64_t *classes = malloc((size_t)m * sizeof *classes);
    if (!classes)
        return -1;
    for (int64_t i = 0; i < m; i++) /* row i's label: class 7i mod k, one-hot */
        classes[i] = i * 7 % k;
    kiln_scope_begin();
    kiln_tensor *labels = kiln_unsqueeze(kiln_from_data(KILN_I64, 1, &m, classes), 1);
    in[1] = kiln_keep(kiln_cast(kiln_eq(labels, kiln_arange(0, (double)k, 1, KILN_I64)), KILN_F32));
    kiln_scope_end();
    free(classes);
    /* the products of the step: the forward two, then dW2, dh and dW1 */
    s->gemms[2] = (workload_gemm){1, h, m, k};
    s->gemms[3] = (workload_gemm){1, m, k, h};
    s->gemms[4] = (workload_gemm){1, k, m, h};
    s->n_gemms = 5;
    return in[1] ? train_optimizer(s) : -1;
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

/* -- The models ------------------------------------------------------------ */

/* Adds count products of m x k by k x n, merged with an equal one. */
static void add_gemm(workload_state *s, int64_t count, int64_t m, int64_t k, int64_t n)
{
    for (int g = 0; g < s->n_gemms; g++)
        if (s->gemms[g].m == m && s->gemms[g].k == k && s->gemms[g].n == n) {
            s->gemms[g].count += count;
            return;
        }
    if (s->n_gemms < WORKLOAD_MAX_GEMMS)
        s->gemms[s->n_gemms++] = (workload_gemm){count, m, k, n};
}

/* A k x k convolution (padding k / 2) of in to out channels over a square
 * image of *side: per image, out x (in k k) by (in k k) x (output pixels). */
static void conv_gemm(workload_state *s, int64_t batch, int64_t in, int64_t out, int64_t k, int64_t stride,
                      int64_t *side)
{
    *side = (*side + 2 * (k / 2) - k) / stride + 1;
    add_gemm(s, batch, out, in * k * k, *side * *side);
}

/* ResNet's convolutions and classifier as products (bench/models.c's walk). */
static void resnet_gemms(workload_state *s, const resnet_config *c, int64_t batch, int64_t image)
{
    int64_t side = image, in = c->width;
    conv_gemm(s, batch, 3, c->width, 7, 2, &side);
    side = (side + 2 - 3) / 2 + 1; /* the max pool */
    for (int stage = 0; stage < 4; stage++)
        for (int b = 0; b < c->blocks[stage]; b++) {
            int64_t width = c->width << stage, stride = b == 0 && stage > 0 ? 2 : 1, inner = side, shortcut = side;
            conv_gemm(s, batch, in, width, 1, 1, &inner);
            conv_gemm(s, batch, width, width, 3, stride, &inner);
            conv_gemm(s, batch, width, 4 * width, 1, 1, &inner);
            if (stride != 1 || in != 4 * width)
                conv_gemm(s, batch, in, 4 * width, 1, stride, &shortcut);
            side = inner, in = 4 * width;
        }
    add_gemm(s, 1, batch, in, c->classes);
}

/* The models (models.c) are linked by kiln-bench and the tests; a program
 * that links this file alone (../shared/anchors' kiln-extra) has every
 * workload that needs none, and a model workload's setup fails there. */
#pragma weak resnet_make
#pragma weak gpt_make
#pragma weak cnn_make
#pragma weak resnet_forward
#pragma weak gpt_forward
#pragma weak cnn_forward
#pragma weak model_free

static bool models_linked(void)
{
    if (resnet_make && gpt_make && cnn_make && resnet_forward && gpt_forward && cnn_forward && model_free)
        return true;
    fprintf(stderr, "this program does not link bench/models.c: no model workloads\n");
    return false;
}

static const resnet_config RESNET50 = {{3, 4, 6, 3}, 64, 1000}, RESNET_QUICK = {{1, 1, 1, 1}, 8, 10};

static int resnet_setup_batch(workload_size size, int64_t batch, kiln_tensor **in, workload_state *s)
{
    const resnet_config *c = size == WORKLOAD_QUICK ? &RESNET_QUICK : &RESNET50;
    int64_t image = size == WORKLOAD_QUICK ? 32 : 224;
    s->config = c;
    if (!models_linked() || resnet_make(c, 17, &s->model) < 0)
        return -1;
    in[0] = normal(4, (int64_t[]){batch, 3, image, image}, 18, 1);
    resnet_gemms(s, c, batch, image);
    snprintf(s->size, sizeof s->size, "%lldx3x%lldx%lld%s", (long long)batch, (long long)image, (long long)image,
             size == WORKLOAD_QUICK ? ", 1 block a stage, width 8" : "");
    return all_made(in, 1);
}

static int resnet_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    return resnet_setup_batch(size, size == WORKLOAD_GPU ? 16 : 1, in, s);
}

static int resnet16_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    return resnet_setup_batch(size, size == WORKLOAD_QUICK ? 2 : 16, in, s);
}

static const gpt_config GPT2 = {50257, 1024, 768, 12, 12}, GPT_QUICK = {256, 32, 64, 4, 2};

static int gpt_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    const gpt_config *c = size == WORKLOAD_QUICK ? &GPT_QUICK : &GPT2;
    int64_t t = size == WORKLOAD_QUICK ? 32 : 256, d = c->dim, dh = d / c->heads, l = c->layers;
    s->config = c;
    if (!models_linked() || gpt_make(c, 19, &s->model) < 0)
        return -1;
    kiln_scope_begin();
    kiln_tensor *u = kiln_mul_scalar(kiln_rand(2, (int64_t[]){1, t}, 20), (double)c->vocab);
    in[0] = kiln_keep(kiln_cast(kiln_floor(u), KILN_I64));
    kiln_scope_end();
    add_gemm(s, l, t, d, 3 * d);        /* q, k and v */
    add_gemm(s, l * c->heads, t, dh, t); /* q @ kᵀ */
    add_gemm(s, l * c->heads, t, t, dh); /* weights @ v */
    add_gemm(s, l, t, d, d);            /* the attention's projection */
    add_gemm(s, l, t, d, 4 * d);
    add_gemm(s, l, t, 4 * d, d);
    add_gemm(s, 1, t, d, c->vocab);     /* the logits */
    snprintf(s->size, sizeof s->size, "%lld blocks, d %lld, %lld heads, seq %lld", (long long)l, (long long)d,
             (long long)c->heads, (long long)t);
    return all_made(in, 1);
}

/* Adds count products of m x k by k x n and their two gradients' products
 * (dA = dC Bᵀ, dB = Aᵀ dC); without the first when A needs none. */
static void add_trained_gemm(workload_state *s, int64_t count, int64_t m, int64_t k, int64_t n, bool grad_a)
{
    add_gemm(s, count, m, k, n);
    if (grad_a)
        add_gemm(s, count, m, n, k);
    add_gemm(s, count, k, m, n);
}

/* GPT-2 small's blocks, 4 of them, at sequence 128 and batch 4, over a
 * vocabulary of 8192 (GPT-2's 50257 would make the logits most of a step). */
static const gpt_config GPT_TRAIN = {8192, 128, 768, 12, 4}, GPT_TRAIN_QUICK = {256, 16, 64, 4, 2};

static int train_gpt_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    bool quick = size == WORKLOAD_QUICK;
    const gpt_config *c = quick ? &GPT_TRAIN_QUICK : &GPT_TRAIN;
    int64_t b = quick ? 2 : 4, t = c->seq, d = c->dim, dh = d / c->heads, l = c->layers, m = b * t;
    s->config = c;
    if (!models_linked() || gpt_make(c, 21, &s->model) < 0)
        return -1;
    kiln_scope_begin();
    kiln_tensor *u = kiln_mul_scalar(kiln_rand(2, (int64_t[]){b, t + 1}, 22), (double)c->vocab);
    kiln_tensor *ids = kiln_cast(kiln_floor(u), KILN_I64);
    in[0] = kiln_keep(kiln_contiguous(kiln_slice(ids, 1, 0, t, 1)));
    in[1] = kiln_keep(kiln_contiguous(kiln_slice(ids, 1, 1, t + 1, 1))); /* the next token of each */
    kiln_scope_end();
    add_trained_gemm(s, l, m, d, 3 * d, true);              /* q, k and v */
    add_trained_gemm(s, l * b * c->heads, t, dh, t, true);  /* q @ kᵀ */
    add_trained_gemm(s, l * b * c->heads, t, t, dh, true);  /* weights @ v */
    add_trained_gemm(s, l, m, d, d, true);                  /* the attention's projection */
    add_trained_gemm(s, l, m, d, 4 * d, true);
    add_trained_gemm(s, l, m, 4 * d, d, true);
    add_trained_gemm(s, 1, m, d, c->vocab, true);           /* the logits */
    snprintf(s->size, sizeof s->size, "%lld blocks, d %lld, seq %lld, batch %lld, vocab %lld", (long long)l,
             (long long)d, (long long)t, (long long)b, (long long)c->vocab);
    return all_made(in, 2) < 0 ? -1 : train_optimizer(s);
}

static const cnn_config CNN_TRAIN = {16, 10}, CNN_TRAIN_QUICK = {4, 10};

static int train_cnn_setup(workload_size size, kiln_tensor **in, workload_state *s)
{
    bool quick = size == WORKLOAD_QUICK;
    const cnn_config *c = quick ? &CNN_TRAIN_QUICK : &CNN_TRAIN;
    int64_t batch = quick ? 4 : 32, image = quick ? 16 : 32, side = image, channels = 3;
    s->config = c;
    s->sgd = true;
    if (!models_linked() || cnn_make(c, 23, &s->model) < 0)
        return -1;
    in[0] = normal(4, (int64_t[]){batch, 3, image, image}, 24, 1);
    int64_t *classes = malloc((size_t)batch * sizeof *classes);
    if (!classes)
        return -1;
    for (int64_t i = 0; i < batch; i++) /* image i's label: class 7i mod classes */
        classes[i] = i * 7 % c->classes;
    in[1] = kiln_from_data(KILN_I64, 1, &batch, classes);
    free(classes);
    for (int stage = 0; stage < CNN_STAGES; stage++) { /* per image: out x (in 9) by (in 9) x pixels */
        int64_t out = c->width << stage;
        add_trained_gemm(s, batch, out, channels * 9, side * side, stage > 0);
        side /= stage + 1 < CNN_STAGES ? 2 : 1;
        channels = out;
    }
    add_trained_gemm(s, 1, batch, channels, c->classes, true);
    snprintf(s->size, sizeof s->size, "%lldx3x%lldx%lld, width %lld", (long long)batch, (long long)image,
             (long long)image, (long long)c->width);
    return all_made(in, 2) < 0 ? -1 : train_optimizer(s);
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
    {"softmax_row", "softmax of one long row", 1, softmax_body, softmax_row_setup},
    {"resnet50", "torchvision's ResNet-50, inference, batch 1", 1, resnet_body, resnet_setup},
    {"resnet50_b16", "torchvision's ResNet-50, inference, batch 16", 1, resnet_body, resnet16_setup},
    {"gpt", "GPT-2 small's 12 blocks, inference, batch 1", 1, gpt_body, gpt_setup},
};
const int workload_count = (int)(sizeof workloads / sizeof *workloads);
const int workload_kernels_count = 6;
const workload workload_matmul = {"matmul", "f32 [n,n] @ [n,n]", 2, matmul_body, matmul_setup};
const workload workload_trainings[] = {
    {"train_mlp", "the mlp, cross-entropy, backward and AdamW", 2, train_mlp_body, train_mlp_setup},
    {"train_gpt", "4 GPT-2 blocks, next-token cross-entropy, backward and AdamW", 2, train_gpt_body,
     train_gpt_setup},
    {"train_cnn", "a CNN (batch norm on the batch), cross-entropy, backward and SGD with momentum", 2,
     train_cnn_body, train_cnn_setup},
};
const int workload_training_count = (int)(sizeof workload_trainings / sizeof *workload_trainings);

const workload *workload_find(const char *name)
{
    for (int i = 0; i < workload_count; i++)
        if (!strcmp(workloads[i].name, name))
            return &workloads[i];
    for (int i = 0; i < workload_training_count; i++)
        if (!strcmp(workload_trainings[i].name, name))
            return &workload_trainings[i];
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
    for (int i = 0; i < state->model.n; i++)
        if (move(&state->model.p[i], d) < 0)
            return -1;
    return state->optimizer ? train_optimizer(state) : 0; /* over the moved weights */
}

/* The tensors a training call changes: the parameters, then the optimizer's state. */
static int changed_by_calls(const workload_state *state, kiln_tensor **ts)
{
    if (!state->optimizer)
        return 0;
    int n = trained_params(state, ts), count = kiln_optimizer_state_count(state->optimizer);
    for (int i = 0; i < count && n < WORKLOAD_MAX_SAVED; i++)
        ts[n++] = kiln_optimizer_state(state->optimizer, i);
    return n;
}

int workload_save(const workload_state *state, kiln_tensor **saved)
{
    kiln_tensor *ts[WORKLOAD_MAX_SAVED];
    int n = changed_by_calls(state, ts);
    int status = 0;
    kiln_no_grad_begin();
    kiln_scope_begin();
    for (int i = 0; i < n; i++)
        status |= (saved[i] = kiln_keep(kiln_add_scalar(ts[i], 0))) ? 0 : -1; /* a copy */
    kiln_scope_end();
    kiln_no_grad_end();
    if (status < 0)
        for (int i = 0; i < n; i++)
            kiln_release(saved[i]);
    return status < 0 ? -1 : n;
}

int workload_restore(workload_state *state, kiln_tensor **saved, int n)
{
    kiln_tensor *ts[WORKLOAD_MAX_SAVED];
    int status = changed_by_calls(state, ts) == n ? 0 : -1;
    kiln_no_grad_begin();
    for (int i = 0; i < n; i++) {
        if (status == 0)
            status = kiln_assign(ts[i], saved[i]);
        kiln_release(saved[i]);
    }
    kiln_no_grad_end();
    return status;
}

void workload_free(const workload *w, kiln_tensor **in, workload_state *state)
{
    for (int i = 0; i < w->n_in; i++)
        kiln_release(in[i]);
    for (int i = 0; i < WORKLOAD_MAX_WEIGHTS; i++)
        kiln_release(state->weights[i]);
    if (model_free)
        model_free(&state->model);
    kiln_optimizer_free(state->optimizer);
    state->optimizer = NULL;
}
