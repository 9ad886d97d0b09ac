/* Two real models written with kiln ops, at any size: torchvision's
 * ResNet-50 (bottleneck blocks, inference batch norm) and a GPT-2 block
 * stack; and a small CNN for training (batch norm on the batch's
 * statistics). Their parameters come in a fixed order that bench/models.py
 * (PyTorch) follows too, so that both run on the same weights. */
#ifndef KILN_BENCH_MODELS_H
#define KILN_BENCH_MODELS_H

#include <kiln/kiln.h>

typedef struct {
    int blocks[4];        /* bottlenecks per stage: 3, 4, 6, 3 for ResNet-50 */
    int64_t width;        /* the first stage's width: 64 */
    int64_t classes;      /* 1000 */
} resnet_config;

typedef struct {
    int64_t vocab, seq, dim, heads, layers; /* GPT-2 small: 50257, 1024, 768, 12, 12 */
} gpt_config;

/* CNN_STAGES of 3x3 convolution (width, 2 width, 4 width channels), batch
 * norm and ReLU, 2x2 max pools between them, a global average pool and a
 * linear layer to classes. */
enum { CNN_STAGES = 3 };
typedef struct {
    int64_t width, classes;
} cnn_config;

/* A model's parameters, new references in the order the forward pass uses
 * them; model_free releases them. */
typedef struct {
    kiln_tensor **p;
    int n, cap;
} model_params;

/* Random parameters (fan-in scaled normals, batch norm statistics near
 * 0 and 1) from seed; 0, or -1 with kiln's error set. */
int resnet_make(const resnet_config *c, uint64_t seed, model_params *m);
int gpt_make(const gpt_config *c, uint64_t seed, model_params *m);
int cnn_make(const cnn_config *c, uint64_t seed, model_params *m);
/* Logits: [N, classes] of x [N, 3, H, W]; [B, T, vocab] of ids [B, T]
 * (i64, T at most seq). NULL with kiln's error set on failure. */
kiln_tensor *resnet_forward(const resnet_config *c, const model_params *m, kiln_tensor *x);
kiln_tensor *gpt_forward(const gpt_config *c, const model_params *m, kiln_tensor *ids);
/* Logits [N, classes] of x [N, 3, H, W]. */
kiln_tensor *cnn_forward(const cnn_config *c, const model_params *m, kiln_tensor *x);
void model_free(model_params *m);

#endif
