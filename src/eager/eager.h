/* Eager tensors: what the other modules may use of them. */
#ifndef KILN_EAGER_H
#define KILN_EAGER_H

#include <stdatomic.h>

#include "core/core.h"
#include "ir/kernel.h"

/* Reference-counted memory that views share. */
typedef struct {
    _Atomic int refs;
    _Atomic unsigned version; /* kiln_assign bumps it: saved values changed under autograd */
    kiln_device device;
    size_t nbytes;
    size_t device_bytes; /* CUDA: the allocator's block size */
    void *data;          /* CUDA: the device address */
} eager_storage;

typedef struct eager_trace eager_trace;

/* A live tensor's header starts with TENSOR_ALIVE; a released one's with
 * TENSOR_DEAD (and debug builds keep it a while before freeing it, so that a
 * release too many is reported, not heap corruption). */
enum { TENSOR_ALIVE = 0x6b696c6e, TENSOR_DEAD = 0x64656164 };

struct kiln_tensor {
    uint32_t magic;
    _Atomic int refs;
    _Atomic int scoped;   /* references that scopes hold (entries in them) */
    _Atomic int held;     /* references kiln's own structures hold (eager_hold) */
    kiln_dtype dtype;
    kiln_device device;
    int ndim;
    int64_t numel;
    int64_t offset; /* in elements, into storage */
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS]; /* in elements; 0 along broadcast axes */
    eager_storage *storage; /* NULL for a tracer */
    bool literal;         /* a scalar operand on the stack: traced as a constant */
    bool born_in_trace;   /* made by the body being traced: a temporary of each call */
    eager_trace *trace;   /* a tracer's trace (it holds a reference), else NULL */
    ir_ref node;          /* a tracer's node in that trace's graph */
    int32_t tracer_slot;  /* a tracer's place in its trace's list of live tracers */
    /* Gradients (autograd.c): a leaf marked by kiln_requires_grad, or the
     * record of the op that computed t (retained); a leaf's gradient (owned). */
    bool requires_grad;
    struct grad_node *grad_fn;
    kiln_tensor *grad;
};

/* Bytes per element. */
static inline size_t eager_dtype_size(kiln_dtype dt)
{
    return ir_dtype_size(dt);
}

/* Address of element 0 of t. */
static inline char *eager_data(const kiln_tensor *t)
{
    return (char *)t->storage->data + t->offset * (int64_t)eager_dtype_size(t->dtype);
}

bool eager_is_contiguous(const kiln_tensor *t);
/* Whether t is a live tensor (not released already); t not NULL. */
static inline bool eager_alive(const kiln_tensor *t)
{
    return t->magic == TENSOR_ALIVE;
}

/* Checks that none of the n operands is NULL or a tracer of another or a
 * finished trace; names[i] names operand i in fn's error. */
int eager_check_operands(const char *fn, int n, kiln_tensor *const *in, const char *const *names);

/* A new unowned 0-d tensor holding value that promotes as a scalar does
 * (the *_scalar forms' operand), for graphs' scalar constants. */
kiln_tensor *eager_scalar_literal(kiln_dtype dt, double value);

/* A new unowned contiguous copy of t, or NULL with fn's error. */
kiln_tensor *eager_copy(const char *fn, const kiln_tensor *t);

/* Hands the new reference t to this thread's innermost scope, if any; returns t. */
kiln_tensor *eager_own(kiln_tensor *t);
/* Removes t from the scope that owns it, if any: the caller owns it now. */
void eager_disown(kiln_tensor *t);
/* A reference kept by kiln itself (a gradient record, a gradient, an
 * optimizer's parameter, a function's capture), which kiln_release never
 * takes for a scope's: a scope's tensor released early then leaves its scope
 * even while kiln holds it. eager_hold returns t (NULL for NULL or a dead
 * tensor); eager_unhold drops such a reference. */
kiln_tensor *eager_hold(kiln_tensor *t);
void eager_unhold(kiln_tensor *t);

/* -- Tracing hooks --------------------------------------------------------- *
 * While a trace is active on a thread, every op called on that thread checks
 * its operands as usual, works out its result's dtype and shape, and then asks
 * the trace to record it instead of computing: the result is a tracer, a
 * tensor with a dtype and a shape but no data. */

struct eager_trace {
    _Atomic int refs;  /* the tracer tensors and the trace's owner */
    bool finished;     /* the body returned: its tracers are dead */
    uint64_t random_words; /* the global generator's words its draws take per call */
    char name[64];     /* the marked function's, for messages */
    kiln_device device; /* where the call's inputs are (CUDA when any is): tracers say CPU */
    /* Returns a new, unowned tracer for op on operands (tracers or eager
     * tensors), or NULL with an error set. */
    kiln_tensor *(*record)(eager_trace *trace, ir_op op, int n_in, kiln_tensor *const *in,
                           const ir_params *params, kiln_dtype dt, int ndim, const int64_t *shape);
    /* kiln_assign(dst, src) inside the body; 0 or a negative error. */
    int (*record_assign)(eager_trace *trace, kiln_tensor *dst, kiln_tensor *src);
    /* Something tried to read a tracer's values: the trace must fail. */
    void (*read_values)(eager_trace *trace, const char *fn);
    /* The body read the shape of the tracer of node (kiln_shape, kiln_numel):
     * the sizes it saw must not vary. */
    void (*read_shape)(eager_trace *trace, ir_ref node);
    /* The body reads the values of tracer t (kiln_item, kiln_copy_to_host):
     * t's value on real data, a new unowned tensor, where the trace breaks
     * there; else NULL, with an error set when breaking failed, none when
     * the trace cannot break (it has failed then, as read_values). */
    kiln_tensor *(*read)(eager_trace *trace, const kiln_tensor *t, const char *fn);
    /* Tracer t of this trace is being freed. */
    void (*forget)(eager_trace *trace, kiln_tensor *t);
    void (*destroy)(eager_trace *trace);
};

/* Tells t's trace, when t is a tracer of the active one, that the body read
 * its shape. */
void eager_note_shape_read(const kiln_tensor *t);
/* Makes trace the active one on this thread (NULL: none). */
void eager_trace_activate(eager_trace *trace);
eager_trace *eager_active_trace(void);
void eager_trace_release(eager_trace *trace);
/* The body of trace returned: its tracers are dead, and the gradients it
 * kept for its leaves are dropped. */
void eager_trace_finish(eager_trace *trace);
/* A new unowned tracer of trace (which gains a reference) for node. */
kiln_tensor *eager_tracer_new(eager_trace *trace, ir_ref node, kiln_dtype dt, int ndim,
                              const int64_t *shape);
/* A new unowned contiguous tensor on device, or NULL with fn's error. */
kiln_tensor *eager_empty(const char *fn, kiln_device device, kiln_dtype dt, int ndim, const int64_t *shape);
/* How the product a @ b lays its operands out for a matmul kernel (the
 * batch, sizes and strides); fn's error when they do not multiply. */
int eager_matmul_args(const char *fn, const kiln_tensor *a, const kiln_tensor *b, kg_matmul_args *args);

/* How conv2d node n's product (kx_conv) lays out x and w: args, and the
 * filters' and the input's data into operands[0..1]; a contiguous copy of
 * w into *staged (the caller releases it) where w is not. fn's error when
 * either is not on the CPU or out of memory. */
int eager_conv_args(const char *fn, const ir_node *n, kiln_tensor *x, kiln_tensor *w, kg_matmul_args *args,
                    void *operands[2], kiln_tensor **staged);

/* Rows [begin, end) of a product just computed, the product seen as
 * [batches * m, n] over data: what an epilogue applies itself to. */
typedef void (*eager_rows_fn)(void *ctx, void *data, int64_t begin, int64_t end);
/* kiln_matmul of CPU floats that computes the product block_rows rows at a
 * time (within each matrix of a batch, or across the batch where it is one
 * GEMM) and calls after on each block while it is still in cache. A new unowned tensor, or NULL with fn's error. Not
 * while recording. */
kiln_tensor *eager_matmul_blocks(const char *fn, kiln_tensor *a, kiln_tensor *b, int64_t block_rows,
                                 eager_rows_fn after, void *ctx);

/* Runs one graph node with the eager ops on its operands' tensors: a new
 * unowned tensor, or NULL with an error set. */
kiln_tensor *eager_dispatch(const ir_node *node, kiln_tensor *const *operands);
/* Random node n's values for call number stream of its graph (the first,
 * 0, draws what kiln_rand(n) or kiln_randn does for its seed; a uniform
 * node draws the global generator's words from rng_base, what
 * eager_rng_reserve gave the call), on device: a new unowned tensor, or
 * NULL with an error set. */
kiln_tensor *eager_random(const ir_node *n, uint64_t stream, uint64_t rng_base, kiln_device device);
/* Takes the global generator's words that a call of g draws (its uniform
 * nodes'), all at once; the offset they start at. */
uint64_t eager_rng_reserve(const ir_graph *g);
/* Constant folding's evaluator (an ir_eval_fn): the eager ops on 0-d
 * tensors, so a folded value is the one eager computes. */
int eager_eval_const(const ir_node *node, const double *values, const kiln_dtype *dtypes, double *out);

#endif
