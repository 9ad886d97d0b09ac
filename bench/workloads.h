/* The standard workloads of DESIGN.md, written once with kiln ops: kiln-bench
 * times them, the examples and tests run them. Each comes in three sizes. */
#ifndef KILN_BENCH_WORKLOADS_H
#define KILN_BENCH_WORKLOADS_H

#include <kiln/kiln.h>

#include "models.h"

enum { WORKLOAD_MAX_INPUTS = 3, WORKLOAD_MAX_WEIGHTS = 4 };

enum { WORKLOAD_MAX_GEMMS = 64 };

/* A matrix product a workload cannot do without: count times m x k by k x n. */
typedef struct {
    int64_t count, m, k, n;
} workload_gemm;

/* One workload's data at one size. */
typedef struct {
    kiln_tensor *weights[WORKLOAD_MAX_WEIGHTS]; /* captured by the body; NULL when unused */
    double bytes;  /* the least bytes a run must read and write, 0 if not memory-bound */
    workload_gemm gemms[WORKLOAD_MAX_GEMMS];    /* its products, timed alone as its compute limit */
    int n_gemms;
    model_params model;   /* a model's parameters (resnet50, gpt), captured */
    const void *config;   /* its resnet_config or gpt_config */
    char size[64]; /* the size, for people */
    kiln_optimizer *optimizer; /* a training workload's, over the weights (or the model's); else NULL */
    bool sgd;                  /* its optimizer is SGD with momentum, not AdamW */
} workload_state;

/* QUICK: milliseconds on a CPU, for CI and tests; FULL: a CPU benchmark's;
 * GPU: big enough that a GPU's launches and transfers do not dominate. */
typedef enum { WORKLOAD_QUICK, WORKLOAD_FULL, WORKLOAD_GPU } workload_size;

typedef struct {
    const char *name;
    const char *what;
    int n_in;
    kiln_body body; /* user is the workload_state */
    /* Makes the inputs (new references, on the CPU) and the state at size;
     * 0 or -1 with kiln's error set. */
    int (*setup)(workload_size size, kiln_tensor **in, workload_state *state);
} workload;

/* The standard workloads, workloads[0..workload_count): tests and examples
 * run every one of these. */
extern const workload workloads[];
extern const int workload_count;
/* The first workload_kernels_count of them (gelu to tiny) are single
 * kernels' worth of work; the models after them compile dozens, which the
 * cache suite's processes need not. */
extern const int workload_kernels_count;
/* One f32 matrix product, [n,n] @ [n,n] (8192 at GPU size): not a standard
 * workload; kiln-bench times it on CUDA, and on a CPU when named. */
extern const workload workload_matmul;

/* Training steps (issue: autograd), not standard either (each call changes
 * its weights), each with its output the loss before the step: train_mlp
 * (the mlp, cross-entropy against one-hot labels, backward, AdamW),
 * train_gpt (GPT-2 blocks on next tokens, AdamW) and train_cnn (the CNN of
 * models.h on labels, SGD with momentum). */
extern const workload workload_trainings[];
extern const int workload_training_count;

/* The workload called name, matmul and the training steps included, or NULL. */
const workload *workload_find(const char *name);
/* Copies of what a call of w changes in state (a training workload's
 * weights and optimizer state) into saved, at most WORKLOAD_MAX_SAVED; how
 * many, or -1 with kiln's error set. workload_restore puts them back and
 * releases them, so that two runs can start from the same weights. */
enum { WORKLOAD_MAX_SAVED = 512 };
int workload_save(const workload_state *state, kiln_tensor **saved);
int workload_restore(workload_state *state, kiln_tensor **saved, int n);
/* Moves the inputs and the state's weights to device d, releasing the copies
 * they leave; 0, or -1 with kiln's error set (some may have moved). */
int workload_to_device(const workload *w, kiln_tensor **in, workload_state *state, kiln_device d);
/* Releases the inputs and the state's weights. */
void workload_free(const workload *w, kiln_tensor **in, workload_state *state);

#endif
