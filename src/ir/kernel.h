/* The kernel IR: one loop nest per fusion group, backend-neutral.
 *
 * A kernel runs over rows (the product of its outer dimensions) and, in each
 * row, over an inner axis of cols elements. It first runs its reductions, each
 * a loop over the row folding an expression into one value per row (later
 * reductions may use earlier ones), then one loop storing expressions into its
 * outputs, and then stores row values. An elementwise kernel has no
 * reductions; softmax has two (max, then the sum of exponentials) and stores
 * once. Every buffer is addressed through a view: an offset and a stride per
 * outer dimension and for the inner axis, in elements. */
#ifndef KILN_IR_KERNEL_H
#define KILN_IR_KERNEL_H

#include "ir/ir.h"

/* A kernel storing at least KX_STREAM_BYTES writes around the caches: its
 * output would push everything else out of them before anything reads it. */
enum { KX_MAX_DIMS = KILN_MAX_DIMS, KX_MAX_BUFFERS = 64, KX_STREAM_BYTES = 32 << 20 };

typedef enum {
    KX_LOAD,   /* an element of a view */
    KX_CONST,  /* a constant */
    KX_ROW,    /* a reduction's value for this row (a mean's in f64) */
    KX_CAST,   /* an operand converted to dtype */
    KX_OP,     /* an elementwise op of the ir op table, in its compute dtype */
} kx_kind;

typedef struct {
    kx_kind kind;
    kiln_dtype dtype;  /* of the value */
    ir_op op;          /* KX_OP */
    int args[3];       /* KX_OP, KX_CAST: earlier expressions, already in the compute dtype */
    int view;          /* KX_LOAD */
    int row;           /* KX_ROW: which reduction */
    double value;      /* KX_CONST */
} kx_expr;

typedef struct {
    int buffer;                       /* index into the kernel's buffers */
    kiln_dtype dtype;
    int64_t offset;
    int64_t outer_strides[KX_MAX_DIMS];
    int64_t inner_stride;
} kx_view;

typedef struct {
    ir_op op;      /* OP_SUM, OP_MEAN, OP_MAX, OP_MIN */
    int expr;      /* the value folded over the row, in the accumulator's dtype */
    kiln_dtype dtype; /* the accumulator's: f64 or i64 for sums, else the input's */
} kx_reduction;

typedef struct {
    int view;      /* where: an output's view */
    int expr;      /* what */
    /* Staged (softmax's e / sum(e)): the last reduction's pass also stores
     * stage_value, and the store pass only applies stage_op with stage_row,
     * reading the row back from cache instead of computing it again. */
    bool staged;
    int stage_value, stage_row;
    ir_op stage_op;
} kx_store;

typedef struct {
    int buffer;    /* a contiguous output of one element per row */
    int row;       /* which reduction's value */
    kiln_dtype dtype; /* the output's */
} kx_row_store;

typedef struct kx_kernel {
    int n_outer;
    int64_t outer[KX_MAX_DIMS]; /* the outer dimensions; rows is their product */
    int64_t rows, cols;
    int n_buffers;              /* inputs and outputs, in the order the caller passes them */
    kx_expr *exprs;
    int n_exprs, exprs_cap;
    kx_view *views;
    int n_views, views_cap;
    kx_reduction *reductions;
    int n_reductions, reductions_cap;
    kx_store *stores;
    int n_stores, stores_cap;
    kx_row_store *row_stores;
    int n_row_stores, row_stores_cap;
    bool transcendental;        /* costly per element: worth threads sooner */
    /* Its stores run along rows (inner stride 1), are not staged, and are
     * KX_STREAM_BYTES or more: the CPU backend makes them non-temporal
     * where their buffers are aligned. Not for an epilogue run on a product
     * block by block, which rewrites lines still in cache. */
    bool streams;
    /* An input buffer the output overwrites, or -1: the kernel then reads
     * that input through the output's buffer, which holds its values. */
    int in_place;
    /* CUDA only: an input buffer that is the f32 matrix product of two
     * operands the kernel takes first, computed in registers tile by tile
     * and never stored, or -1 (codegen_nvrtc/matmul.c's epilogue). */
    int matmul_product;
} kx_kernel;

/* Compiled code of a kernel, whatever the backend: runs rows [begin, end)
 * over its buffers (inputs then outputs). */
typedef void (*kx_kernel_fn)(void *const *buffers, int64_t begin, int64_t end);

void kx_kernel_free(kx_kernel *k);
/* The canonical text of k (a cache key component), malloc'd. */
char *kx_to_text(const kx_kernel *k);

/* -- Lowering a graph ------------------------------------------------------- */

/* One step of a lowered graph: a kernel, or a node run by the eager ops. */
typedef struct {
    kx_kernel *kernel;      /* NULL: run node eagerly */
    ir_ref node;            /* the eager node, or the kernel's first output */
    ir_ref *buffers;        /* the kernel's buffers as graph nodes (inputs, then outputs) */
    int n_inputs, n_outputs;
} lower_step;

typedef struct {
    lower_step *steps;
    int n_steps;
    bool *materialized;     /* per graph node: a buffer exists at run time */
} lowered;

typedef struct {
    /* The backend sums a row in many partial sums (vector lanes, threads),
     * so a sum of f32 exponentials over a short row may stay in f32. */
    bool split_sums;
} lower_options;

/* Splits g into fusion groups, each a kernel, and the nodes run eagerly
 * (matmul, reductions over other axes, concat, ...). 0, or -1 when out of
 * memory. */
int lower_graph(const ir_graph *g, const lower_options *o, lowered *out);
void lowered_free(lowered *l);

#endif
