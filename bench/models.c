/* ResNet-50, GPT-2 blocks and a small CNN with kiln ops. One walk through each model
 * both makes its parameters (with no input: kiln's ops pass NULL through,
 * so only the parameters come out) and runs it, so the order of the
 * parameters is the order of the forward pass, which bench/models.py
 * follows. */
#include "models.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    model_params *m;
    int next;     /* the next parameter to read, or the count made */
    bool making;  /* make each parameter rather than read it */
    bool failed;  /* making one failed */
    uint64_t seed;
} walk;

/* The next parameter, of shape: made as scale * N(0, 1) + offset (scale *
 * U[0, 1) + offset when uniform), or read. NULL when out of parameters. */
static kiln_tensor *param(walk *w, int ndim, const int64_t *shape, double scale, double offset, bool uniform)
{
    if (!w->making)
        return w->next < w->m->n ? w->m->p[w->next++] : NULL;
    if (w->m->n == w->m->cap) {
        int cap = w->m->cap ? 2 * w->m->cap : 64;
        kiln_tensor **p = realloc(w->m->p, (size_t)cap * sizeof *p);
        if (!p) {
            w->failed = true;
            return NULL;
        }
        w->m->p = p, w->m->cap = cap;
    }
    uint64_t seed = w->seed + (uint64_t)w->m->n * 7919;
    kiln_tensor *r = uniform ? kiln_rand(ndim, shape, seed) : kiln_randn(ndim, shape, seed);
    kiln_tensor *t = kiln_add_scalar(kiln_mul_scalar(r, scale), offset);
    if (!t) {
        w->failed = true;
        return NULL;
    }
    w->m->p[w->m->n++] = kiln_retain(t);
    return t;
}

void model_free(model_params *m)
{
    for (int i = 0; i < m->n; i++)
        kiln_release(m->p[i]);
    free(m->p);
    *m = (model_params){0};
}

typedef kiln_tensor *(*walker)(walk *, const void *, kiln_tensor *);

/* Walks forward with no input, making m's parameters from seed: 0, or -1
 * (then none are kept). */
static int make(model_params *m, uint64_t seed, walker forward, const void *c)
{
    *m = (model_params){0};
    walk w = {m, 0, true, false, seed};
    kiln_scope_begin();
    forward(&w, c, NULL);
    kiln_scope_end();
    if (!w.failed) {
        kiln_clear_error(); /* the ops on no input failed; the parameters did not */
        return 0;
    }
    model_free(m);
    return -1;
}

/* Walks forward over x with m's parameters. */
static kiln_tensor *run(const model_params *m, walker forward, const void *c, kiln_tensor *x)
{
    walk w = {(model_params *)m, 0, false, false, 0};
    return forward(&w, c, x);
}

/* -- ResNet-50 ------------------------------------------------------------------ */

enum { EXPANSION = 4 };
static const double BN_EPS = 1e-5;

/* Inference batch norm over c channels: gamma, beta, running mean, var. */
static kiln_tensor *bn(walk *w, kiln_tensor *x, int64_t c)
{
    kiln_tensor *gamma = param(w, 1, &c, 0.1, 1, false), *beta = param(w, 1, &c, 0.1, 0, false);
    kiln_tensor *mean = param(w, 1, &c, 0.1, 0, false), *var = param(w, 1, &c, 0.5, 0.75, true);
    return kiln_batch_norm(x, mean, var, gamma, beta, BN_EPS);
}

/* A k x k convolution (no bias, padding k / 2) and its batch norm. */
static kiln_tensor *conv_bn(walk *w, kiln_tensor *x, int64_t in, int64_t out, int64_t k, int64_t stride, bool relu)
{
    kiln_tensor *weights = param(w, 4, (int64_t[]){out, in, k, k}, sqrt(2.0 / (double)(in * k * k)), 0, false);
    kiln_conv2d_params p = {{stride, stride}, {k / 2, k / 2}, {1, 1}, 1};
    kiln_tensor *y = bn(w, kiln_conv2d(x, weights, NULL, &p), out);
    return relu ? kiln_relu(y) : y;
}

/* torchvision's Bottleneck (stride on the 3x3 convolution), its
 * temporaries released as it returns. */
static kiln_tensor *bottleneck(walk *w, kiln_tensor *x, int64_t in, int64_t width, int64_t stride)
{
    kiln_scope_begin();
    kiln_tensor *y = conv_bn(w, x, in, width, 1, 1, true);
    y = conv_bn(w, y, width, width, 3, stride, true);
    y = conv_bn(w, y, width, width * EXPANSION, 1, 1, false);
    bool project = stride != 1 || in != width * EXPANSION;
    kiln_tensor *shortcut = project ? conv_bn(w, x, in, width * EXPANSION, 1, stride, false) : x;
    kiln_tensor *out = kiln_keep(kiln_relu(kiln_add(y, shortcut)));
    kiln_scope_end();
    return out;
}

static kiln_tensor *resnet_walk(walk *w, const void *config, kiln_tensor *x)
{
    const resnet_config *c = config;
    kiln_tensor *y = conv_bn(w, x, 3, c->width, 7, 2, true);
    y = kiln_max_pool2d(y, &(kiln_pool2d_params){.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
    int64_t in = c->width;
    for (int stage = 0; stage < 4; stage++) {
        int64_t width = c->width << stage;
        for (int b = 0; b < c->blocks[stage]; b++) {
            y = bottleneck(w, y, in, width, b == 0 && stage > 0 ? 2 : 1);
            in = width * EXPANSION;
        }
    }
    kiln_tensor *features = kiln_reshape(kiln_adaptive_avg_pool2d(y, 1, 1), 2, (int64_t[]){-1, in});
    kiln_tensor *fc = param(w, 2, (int64_t[]){c->classes, in}, 1 / sqrt((double)in), 0, false);
    kiln_tensor *bias = param(w, 1, &c->classes, 0.01, 0, false);
    return kiln_add(kiln_matmul(features, kiln_transpose(fc, 0, 1)), bias);
}

int resnet_make(const resnet_config *c, uint64_t seed, model_params *m)
{
    return make(m, seed, resnet_walk, c);
}

kiln_tensor *resnet_forward(const resnet_config *c, const model_params *m, kiln_tensor *x)
{
    return run(m, resnet_walk, c, x);
}

/* -- GPT-2 ---------------------------------------------------------------------- */

static const double LN_EPS = 1e-5;

/* x @ W + b, W [in, out]. */
static kiln_tensor *linear(walk *w, kiln_tensor *x, int64_t in, int64_t out)
{
    kiln_tensor *weights = param(w, 2, (int64_t[]){in, out}, 1 / sqrt((double)in), 0, false);
    return kiln_add(kiln_matmul(x, weights), param(w, 1, &out, 0.02, 0, false));
}

static kiln_tensor *layer_norm(walk *w, kiln_tensor *x, int64_t d)
{
    kiln_tensor *gamma = param(w, 1, &d, 0.1, 1, false);
    return kiln_layer_norm(x, gamma, param(w, 1, &d, 0.1, 0, false), LN_EPS);
}

/* [B, T, D] as [B, heads, T, D / heads]. */
static kiln_tensor *heads(kiln_tensor *x, int64_t b, int64_t t, const gpt_config *c)
{
    return kiln_transpose(kiln_reshape(x, 4, (int64_t[]){b, t, c->heads, c->dim / c->heads}), 1, 2);
}

/* Causal self-attention: each position attends to itself and before. */
static kiln_tensor *attention(walk *w, kiln_tensor *x, int64_t b, int64_t t, const gpt_config *c, kiln_tensor *future)
{
    int64_t d = c->dim;
    kiln_tensor *qkv = linear(w, x, d, 3 * d);
    kiln_tensor *q = heads(kiln_slice(qkv, 2, 0, d, 1), b, t, c), *k = heads(kiln_slice(qkv, 2, d, 2 * d, 1), b, t, c);
    kiln_tensor *v = heads(kiln_slice(qkv, 2, 2 * d, 3 * d, 1), b, t, c);
    kiln_tensor *scores = kiln_mul_scalar(kiln_matmul(q, kiln_transpose(k, -2, -1)), 1 / sqrt((double)(d / c->heads)));
    kiln_tensor *weights = kiln_softmax(kiln_masked_fill(scores, future, -INFINITY), -1);
    kiln_tensor *joined = kiln_reshape(kiln_transpose(kiln_matmul(weights, v), 1, 2), 3, (int64_t[]){b, t, d});
    return linear(w, joined, d, d);
}

static kiln_tensor *gpt_walk(walk *w, const void *config, kiln_tensor *ids)
{
    const gpt_config *c = config;
    int64_t b = ids ? kiln_shape(ids)[0] : 1, t = ids ? kiln_shape(ids)[1] : c->seq, d = c->dim;
    kiln_tensor *wte = param(w, 2, (int64_t[]){c->vocab, d}, 0.02, 0, false);
    kiln_tensor *wpe = param(w, 2, (int64_t[]){c->seq, d}, 0.01, 0, false);
    kiln_tensor *x = kiln_add(kiln_embedding(wte, ids), kiln_slice(wpe, 0, 0, t, 1));
    kiln_tensor *future = kiln_triu(kiln_ones(KILN_BOOL, 2, (int64_t[]){t, t}), 1);
    for (int64_t l = 0; l < c->layers; l++) {
        kiln_scope_begin();
        x = kiln_add(x, attention(w, layer_norm(w, x, d), b, t, c, future));
        kiln_tensor *h = kiln_gelu(linear(w, layer_norm(w, x, d), d, 4 * d));
        x = kiln_keep(kiln_add(x, linear(w, h, 4 * d, d)));
        kiln_scope_end();
    }
    return kiln_matmul(layer_norm(w, x, d), kiln_transpose(wte, 0, 1));
}

int gpt_make(const gpt_config *c, uint64_t seed, model_params *m)
{
    return make(m, seed, gpt_walk, c);
}

kiln_tensor *gpt_forward(const gpt_config *c, const model_params *m, kiln_tensor *ids)
{
    return run(m, gpt_walk, c, ids);
}

/* -- A small CNN, for training ---------------------------------------------------- */

/* Batch norm as in training: the batch's own statistics over N, H and W,
 * then gamma and beta. */
static kiln_tensor *bn_batch(walk *w, kiln_tensor *x, int64_t c)
{
    kiln_tensor *gamma = param(w, 1, &c, 0.1, 1, false), *beta = param(w, 1, &c, 0.1, 0, false);
    kiln_tensor *var = NULL, *mean = NULL;
    kiln_var_mean(x, KILN_AXES(0, 2, 3), 0, false, &var, &mean);
    return kiln_batch_norm(x, mean, var, gamma, beta, BN_EPS);
}

static kiln_tensor *cnn_walk(walk *w, const void *config, kiln_tensor *x)
{
    const cnn_config *c = config;
    int64_t in = 3;
    for (int stage = 0; stage < CNN_STAGES; stage++) {
        int64_t out = c->width << stage;
        kiln_tensor *weights = param(w, 4, (int64_t[]){out, in, 3, 3}, sqrt(2.0 / (double)(in * 9)), 0, false);
        kiln_conv2d_params p = {{1, 1}, {1, 1}, {1, 1}, 1};
        x = kiln_relu(bn_batch(w, kiln_conv2d(x, weights, NULL, &p), out));
        if (stage + 1 < CNN_STAGES)
            x = kiln_max_pool2d(x, &(kiln_pool2d_params){.kernel = {2, 2}});
        in = out;
    }
    kiln_tensor *features = kiln_reshape(kiln_adaptive_avg_pool2d(x, 1, 1), 2, (int64_t[]){-1, in});
    kiln_tensor *fc = param(w, 2, (int64_t[]){in, c->classes}, 1 / sqrt((double)in), 0, false);
    return kiln_add(kiln_matmul(features, fc), param(w, 1, &c->classes, 0.01, 0, false));
}

int cnn_make(const cnn_config *c, uint64_t seed, model_params *m)
{
    return make(m, seed, cnn_walk, c);
}

kiln_tensor *cnn_forward(const cnn_config *c, const model_params *m, kiln_tensor *x)
{
    return run(m, cnn_walk, c, x);
}
