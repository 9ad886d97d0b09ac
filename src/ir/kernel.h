/* The kernel IR: what a code generator compiles, backend-neutral. Three parts:
 * fused kernels (one loop nest per fusion group), the shape-generic kernels
 * of eager ops on a device, and the plan that splits a graph into steps.
 *
 * A fused kernel runs over rows (the product of its outer dimensions) and, in
 * each row, over an inner axis of cols elements. It first runs its
 * reductions, each a loop over the row folding an expression into one value
 * per row (later reductions may use earlier ones), then one loop storing
 * expressions into its outputs, and then stores row values. Every buffer is
 * addressed through a view: an offset and a stride per outer dimension and
 * for the inner axis, in elements; element i of row (o0, o1, ...) of a view
 * is at offset + sum(o_d * outer_strides[d]) + i * inner_stride.
 *
 * Everything a code generator needs is said explicitly: each buffer's dtype,
 * each reduction's starting value and the dtype of its row value, each row
 * store's source dtype, the pass each store runs in. A store may run inside a
 * reduction's loop (softmax's e = exp(x - max) stored while it is summed), and
 * a later load of the same view reads back what that loop stored there, at
 * the same element: code generators keep each element of a row with the
 * thread that stored it. An input written over in place is simply not a
 * buffer: its loads read the output's buffer. How a kernel is compiled
 * (non-temporal stores, say) is not here but in kx_kernel_options.
 *
 * Sizes (rows, cols, the outer dimensions, views' offsets and strides) are
 * ir.h's sizes in the kernel's own table: a symbolic one is a polynomial in
 * the graph's symbols, whose values the launch passes, so that one compiled
 * kernel serves every size; a negative constant (a stride walking backwards)
 * is kept in the table too. Symbolic sizes are at least 2. */
#ifndef KILN_IR_KERNEL_H
#define KILN_IR_KERNEL_H

#include "ir/ir.h"

enum { KX_MAX_DIMS = KILN_MAX_DIMS, KX_MAX_BUFFERS = 64 };

/* A constant of a dtype: f for floats, i for integers and bool. */
typedef struct {
    double f;
    int64_t i;
} kx_value;

typedef enum {
    KX_LOAD,   /* an element of a view */
    KX_CONST,  /* a constant */
    KX_ROW,    /* a reduction's value for this row (a mean's in f64) */
    KX_CAST,   /* an operand converted to dtype */
    KX_OP,     /* an elementwise op of the ir op table, in its compute dtype */
    KX_GATHER, /* an element of a view's row at a column computed in the kernel (checked, see below) */
} kx_kind;

/* KX_GATHER reads element args[0] (an i64 expression; negative counts from
 * the end) of the current row of its view, whose inner stride steps along
 * the gathered axis of length size, whatever the kernel's own columns: a
 * row's label picks its logit. It is always checked: an index out of
 * [-size, size) reads nothing (its value is 0) and flags the launch's bad
 * words, which the launch zeroes before and reports after as the eager
 * gather does (kx_bad_index_text), never a read out of bounds. */
enum { KX_BAD_FLAG, KX_BAD_INDEX, KX_BAD_AXIS, KX_BAD_SIZE, KX_BAD_WORDS };

typedef struct {
    kx_kind kind;
    kiln_dtype dtype;  /* of the value */
    ir_op op;          /* KX_OP */
    int args[3];       /* KX_OP, KX_CAST: earlier expressions, already in the compute dtype */
    int view;          /* KX_LOAD, KX_GATHER */
    int row;           /* KX_ROW: which reduction */
    double value;      /* KX_CONST */
    int64_t size;      /* KX_GATHER: the gathered axis's length, a size (see the top) */
    int axis;          /* KX_GATHER: which axis of the gathered value it is (for messages) */
} kx_expr;

/* A bound of a view: the kernel's index along dim (an outer dimension, or
 * n_outer for the columns) in [lo, hi), concrete. */
typedef struct {
    int dim;
    int64_t lo, hi;
} kx_bound;

enum { KX_MAX_BOUNDS = 4 };

/* A view with bounds is read only where all of them hold; elsewhere its
 * loads are fill and touch no memory: a constant pad's border read with the
 * tensor inside it, never stored (ir/lower.c). Only loads are bounded. */
typedef struct {
    int buffer;                       /* index into the kernel's buffers */
    kiln_dtype dtype;
    int64_t offset;                   /* sizes (see the top) */
    int64_t outer_strides[KX_MAX_DIMS];
    int64_t inner_stride;
    int n_bounds;
    kx_bound bounds[KX_MAX_BOUNDS];
    double fill;                      /* with bounds: the value outside them, in dtype */
} kx_view;

typedef struct {
    ir_op op;          /* OP_SUM, OP_MEAN, OP_MAX, OP_MIN */
    int expr;          /* the value folded over the row, in the accumulator's dtype */
    kiln_dtype dtype;  /* the accumulator's: f64 or i64 for sums, else the input's */
    kiln_dtype result; /* the row value's: f64 for a mean (its sum divided by cols in f64), else dtype */
    kx_value identity; /* where the fold starts: 0, or the lowest (max) or highest (min) value of dtype */
} kx_reduction;

/* The loop a store runs in: the store loop, or a reduction's. */
enum { KX_STORE_PASS = 0 };
static inline int kx_reduction_pass(int reduction)
{
    return reduction + 1;
}

typedef struct {
    int view;      /* where: an output's view */
    int expr;      /* what, converted to the view's dtype */
    int pass;      /* KX_STORE_PASS, or kx_reduction_pass(r): inside reduction r's loop */
} kx_store;

typedef struct {
    int buffer;       /* a contiguous output of one element per row */
    int row;          /* which reduction's value */
    kiln_dtype from;  /* the stored value's dtype (the reduction's result) */
    kiln_dtype dtype; /* the output's */
    /* A row epilogue: the expression stored instead of the reduction's value,
     * made of row values, constants and loads constant along the row
     * (logsumexp's log(sum) + max), of dtype from; -1 for none. */
    int expr;
} kx_row_store;

/* A product that is a convolution (conv2d, without a column buffer): B,
 * [C/groups KH KW, OH OW] per image and group, is read from the input x
 * [N, C, H, W] through the window, padding read as zeros. The launch's
 * kg_matmul_args say: batch [N, groups]; A the filters [O/groups, C/groups
 * KH KW]; B's batch strides x's image stride and groups' channel offset
 * (channels * its channel stride), b_row and b_col x's row and column
 * strides. Concrete sizes, part of the kernel's text; kh 0: no convolution. */
typedef struct {
    int64_t channels;   /* per group */
    int64_t height, width, out_width;
    int64_t kh, kw, stride[2], padding[2], dilation[2];
} kx_conv;

typedef struct kx_kernel {
    ir_sizes sizes;             /* what its symbolic sizes name (see the top) */
    int n_outer;
    int64_t outer[KX_MAX_DIMS]; /* the outer dimensions; rows is their product */
    int64_t rows, cols;
    int n_buffers;              /* inputs and outputs, in the order the caller passes them */
    kiln_dtype buffer_dtypes[KX_MAX_BUFFERS];
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
    /* A buffer that is the matrix product [rows, cols] of two operands of
     * its dtype (f32, f64) passed at launch (kg_matmul_args lays them out),
     * computed inside the kernel and never read from memory; -1 when none.
     * Its one view reads it row-major. */
    int product;
    /* With a product: NULL, or the elementwise kernel over the product's
     * left operand A ([rows of the product, k]) that computes A while it is
     * packed, so A is never stored: it has one store (A's, its view's
     * buffer the product's slot), and its loads read buffers of this
     * kernel (the indices are this kernel's). The launch's layout of A is
     * row-major. Owned by this kernel. */
    struct kx_kernel *prologue;
    kx_conv conv;               /* with a product: how it reads B */
    /* With a product (the scores q @ kᵀ, [rows, cols]): the kernel is
     * attention, softmax(x) @ v over each row, x its one store's expression
     * (the scores scaled and masked) and v a second product operand passed
     * at launch; the store's view is not written, and the output buffer is
     * the contiguous [rows, columns of v]. The softmax is online (a running
     * maximum and sum over blocks of columns), so x is never stored. */
    bool attention;
} kx_kernel;

/* How a kernel is compiled, beyond what it computes (a cache key component). */
typedef struct {
    /* Output stores along rows go around the caches where the outputs are
     * aligned for it: the output would push everything else out of them
     * before anything reads it. */
    bool stream_stores;
} kx_kernel_options;

/* A new empty kernel over rows of shape (ndim, shape), whose symbolic sizes
 * are in sizes (copied: the kernel's own table starts as a copy), or NULL. */
kx_kernel *kx_kernel_new(const ir_sizes *sizes, int ndim, const int64_t *shape);
/* Whether any of k's sizes is symbolic. */
bool kx_symbolic(const kx_kernel *k);
/* Size v of k (a size of its table) for the symbols' values. */
int64_t kx_size(const kx_kernel *k, int64_t v, const int64_t *symbols);
void kx_kernel_free(kx_kernel *k);
/* Appends to k; the index, or -1 when out of memory. */
int kx_add_expr(kx_kernel *k, kx_expr e);
int kx_add_view(kx_kernel *k, kx_view v);
int kx_add_store(kx_kernel *k, kx_store s);
/* The starting value of reduction op folding values of dtype. */
kx_value kx_reduction_identity(ir_op op, kiln_dtype dtype);
/* The canonical text of k (a cache key component), malloc'd. */
char *kx_to_text(const kx_kernel *k);
/* The text of options, "" for the defaults (a cache key component). */
const char *kx_options_text(const kx_kernel_options *o);
/* Whether k has a KX_GATHER: its rows read columns it computes, so its rows
 * and columns keep their meaning (never joined or split), it never writes
 * over an input, and its launch passes the bad words. */
bool kx_indexed(const kx_kernel *k);
/* The error for bad words a launch found flagged (bad[KX_BAD_FLAG] != 0),
 * as the eager gather words it, into err. */
void kx_bad_index_text(const int64_t *bad, char *err, size_t err_size);
/* Whether a view of k has bounds: its rows and columns keep their meaning
 * (never joined or split), as a gather's. */
bool kx_bounded(const kx_kernel *k);
/* Whether k's rows and columns keep their meaning: it gathers or reads a
 * bounded view (kx_indexed, kx_bounded). */
bool kx_rows_fixed(const kx_kernel *k);
/* Whether buffer b is written by k. */
bool kx_writes(const kx_kernel *k, int b);
/* The view through which k keeps a row between its passes (softmax's
 * exponentials: stored in a reduction's pass, read back by the passes
 * after it, and stored over by the store pass), which a kernel compiled to
 * stream its stores may keep in a scratch row of its own: stored in one
 * reduction's pass only, contiguous along the row, the only view of its
 * buffer, which no row store writes; not read up to that pass (an input
 * written over in place) nor by a row store; rows of at most
 * KX_KEPT_ROW_BYTES, concrete; no product, no gather, no bounded view;
 * -1 for none. */
enum { KX_KEPT_ROW_BYTES = 64 << 10 };
int kx_kept_view(const kx_kernel *k);
/* Whether expression e of k loads (or gathers from) view v. */
bool kx_loads_view(const kx_kernel *k, int e, int v);
/* The view through which k reads its product buffer, or -1 when there is
 * not exactly one. */
int kx_product_view(const kx_kernel *k);
/* Why k cannot compute its product (k->product) itself, its stores an
 * elementwise epilogue on tiles of it, or NULL: it reduces rows, writes the
 * product's buffer, or reads the product other than through one view, as a
 * row-major [rows, cols]. Backends add what they compute (the dtypes of
 * that view). */
const char *kx_product_misfit(const kx_kernel *k);
/* Joins k's innermost outer dimension into its rows' columns while they are
 * fewer than cols and every view walks the two as one axis; whether k's
 * columns are then cols. Only n_outer, outer, rows and cols change (the
 * views' strides past n_outer stay, unread), so restoring those undoes it. */
bool kx_join_cols(kx_kernel *k, int64_t cols);

/* -- Shape-generic kernels of eager ops ------------------------------------ *
 * One per op and dtypes, with sizes and strides as arguments, so one
 * compiled kernel serves every shape (CUDA's eager ops run them). Each
 * argument struct below is passed by value as the kernel's first parameter
 * and has the same layout in C and in the generated code (declared there
 * under the same name). Every kernel is launched with KG_BLOCK threads a
 * block and loops grid-stride, so any grid works. */

enum { KG_BLOCK = 256, KG_EW_INPUTS = 3 };

/* out[i] = op(in0[i], in1[i], in2[i]) over the collapsed iteration space
 * shape[0..ndim); element i's offset in an operand is the sum over d of its
 * coordinate times the operand's stride (elements; 0 along broadcast axes).
 * An input whose bit is set in scalar_mask is the value whose bytes, in the
 * input's dtype, begin scalar_bits[k] (its pointer is NULL): bits, not a
 * double, so that an i64 beyond 2^53 goes over exactly. contiguous: every
 * operand that is read and the output have offset i. */
typedef struct {
    long long numel;
    long long shape[KILN_MAX_DIMS];
    long long out_strides[KILN_MAX_DIMS];
    long long in_strides[KG_EW_INPUTS][KILN_MAX_DIMS];
    unsigned long long scalar_bits[KG_EW_INPUTS];
    int ndim;
    int contiguous;
    int scalar_mask;
    int unused;
} kg_ew_args;

/* A reduction of a contiguous input seen as [outer, n, inner] into a
 * contiguous output [outer, inner]. */
typedef struct {
    long long outer, n, inner;
} kg_reduce_args;

/* C[batch, m, n] = A[batch, m, k] @ B[batch, k, n], C contiguous. The batch
 * index runs over batch_shape[0..batch_ndim) (row-major); A's and B's batch
 * strides are 0 along a broadcast batch axis. Within a matrix, element (r, c)
 * of A is at r * a_row + c * a_col, of B at r * b_row + c * b_col. Also how a
 * fused kernel's product operands are laid out (kx_kernel.product). */
typedef struct {
    long long batch, m, n, k;
    long long batch_shape[KILN_MAX_DIMS];
    long long a_batch_strides[KILN_MAX_DIMS], b_batch_strides[KILN_MAX_DIMS];
    long long a_row, a_col, b_row, b_col;
    int batch_ndim;
    int unused;
} kg_matmul_args;

/* Top k of each line of a contiguous input seen as [outer, n, inner]:
 * largest (or smallest) first, NaN above every number, ties to the lower
 * index; padded is n rounded up to a power of two. */
typedef struct {
    long long outer, n, inner, k, padded;
    int largest;
    int unused;
} kg_topk_args;

/* Indexing over the index tensor's shape (ndim, shape; numel elements):
 * element i of it, at coordinates c, reads (gather) or adds to (scatter)
 * the data element at sum(c[d] * data_strides[d]) with c[axis] replaced
 * by the index's value (negative counts from the end of axis_size); src
 * (scatter) is read at sum(c[d] * src_strides[d]). An index out of range
 * is clamped, and the first one met goes to bad[0..1] (flag 1, value). */
typedef struct {
    long long numel, axis_size;
    long long shape[KILN_MAX_DIMS];
    long long data_strides[KILN_MAX_DIMS];
    long long index_strides[KILN_MAX_DIMS];
    long long src_strides[KILN_MAX_DIMS];
    int ndim, axis;
} kg_index_args;

enum { KG_BAD_FLAG, KG_BAD_INDEX, KG_BAD_WORDS };

/* numel f32 uniform values of Philox4x32-10 keyed by seed, from word
 * offset (a multiple of 4): src/eager/philox.c's. */
typedef struct {
    long long numel;
    unsigned long long seed, offset;
} kg_random_args;

typedef enum {
    KG_ELEMENTWISE, /* op of the table, or OP_CAST: a copy converting in[0] to out */
    KG_REDUCE,      /* OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_ARGMAX, OP_PROD, OP_ARGMIN */
    KG_MATMUL,
    KG_SCAN,        /* OP_CUMSUM */
    KG_TOPK,        /* OP_TOPK */
    KG_INDEX,       /* OP_GATHER (index_select too), OP_SCATTER_ADD */
    KG_RANDOM,      /* OP_UNIFORM */
} kg_kind;

/* Which generic kernel: its kind, op and dtypes.
 * ELEMENTWISE: kernel(kg_ew_args, out *, const in0 *, const in1 *, const in2 *);
 *   n_in inputs of dtypes in[], each converted to compute before the op
 *   (for OP_WHERE in[0] is the bool condition, not converted), the op's
 *   result converted to out. Unused input pointers are NULL.
 * REDUCE: kernel(kg_reduce_args, out *, const in0 *); the input converted
 *   to compute (f32, f64 or i64), accumulated in acc (f64 or i64 for SUM and
 *   PROD, f64 for MEAN, compute for MAX and MIN, i64 for ARGMAX and ARGMIN: the
 *   first maximum or minimum, a NaN counting as either), a mean divided by n
 *   in f64, stored as out.
 *   Grid: one block per output row when inner == 1, else a thread per output.
 * MATMUL: kernel(kg_matmul_args, out *, const in0 *, const in1 *), all of
 *   dtype compute; integers wrap. Grid (ceil(n / tile_n), ceil(m / tile_m),
 *   batch or less) of the tile its code reports (kg_code).
 * SCAN: kernel(kg_reduce_args, out *, const in0 *): running sums along the
 *   middle axis of a contiguous [outer, n, inner], accumulated in acc (f64
 *   or i64), stored as out. A block per line.
 * TOPK: kernel(kg_topk_args, long long *out, const in0 *, long long
 *   *scratch): the k indices of each line into out [outer, k, inner]; in0
 *   compared as compute (its dtype); scratch holds outer * inner * padded
 *   indices. A block per line.
 * INDEX: kernel(kg_index_args, out *, const in0 *, const in1 *, long long
 *   *bad): GATHER reads in0 (data, of dtype out) at the indices in1 (i32 or
 *   i64) into the contiguous out of the index's shape; SCATTER_ADD adds
 *   in1 (src, of dtype out) at the indices in0 into out (atomically; bool
 *   refused). A thread per index element. bad: KG_BAD_WORDS zeroed words,
 *   set to 1 and the first bad index given when one is out of range.
 * RANDOM: kernel(kg_random_args, float *out); a thread per 4 elements. */
typedef struct {
    kg_kind kind;
    ir_op op;
    int n_in;
    kiln_dtype in[KG_EW_INPUTS];
    kiln_dtype compute, acc, out;
} kg_kernel;

/* A loaded generic kernel and how to launch it. */
typedef struct {
    void *module;       /* the device runtime's loaded kernel */
    int threads;        /* a block */
    int tile_m, tile_n; /* MATMUL: the output tile a block computes */
} kg_code;

/* The grid of a matmul kernel whose blocks compute tile_m x tile_n tiles of
 * args's product: the tiles, and the batch, with y and z capped at CUDA's
 * limit (the kernels loop over tiles and batches past their grid). */
void kg_matmul_grid(const kg_matmul_args *args, int tile_m, int tile_n, unsigned grid[3]);
/* 0 when k is one of the generic kernels above, else -1 with why in err. */
int kg_check(const kg_kernel *k, char *err, size_t err_size);
/* kiln_eager_<kind>_<op>_in_<dtypes>_compute_<dt>_acc_<dt>_out_<dt>: every
 * field that shapes the code, so that different kernels never share a name;
 * also its canonical text. -1 with why in err when it does not fit. */
int kg_name(const kg_kernel *k, char *name, size_t size, char *err, size_t err_size);
/* "add(i32, f32) in f32 to f32": k for messages. */
void kg_describe(const kg_kernel *k, char *buf, size_t size);

/* -- Lowering and planning a graph ------------------------------------------ */

struct kx_backend;

/* One step of a plan: a fused kernel, or a node run by the eager ops. */
typedef struct {
    kx_kernel *kernel;          /* NULL: run node eagerly */
    ir_ref node;                /* the eager node, or the kernel's output */
    ir_ref *buffers;            /* the kernel's buffers as graph nodes (inputs, then outputs) */
    int n_inputs, n_outputs;
    kx_kernel_options options;
    /* The input value whose storage the output takes over (in place; the
     * kernel reads it through its output), or IR_NONE. */
    ir_ref reuses;
    /* The matmul node computed inside the kernel (kx_kernel.product), whose
     * operands the launch passes, or IR_NONE. */
    ir_ref product;
    /* A product step and its epilogue kernel step run together, a block of
     * block_rows rows of the product at a time (the product's step holds
     * block_rows), or -1. */
    int blocked_with;
    int64_t block_rows;
    /* A kernel's values read when it runs: its input buffers (not a product
     * slot), the value it writes over, its product's operands. */
    ir_ref *uses;
    int n_uses;
} plan_step;

typedef struct {
    const ir_graph *graph;      /* borrowed: it outlives the plan */
    plan_step *steps;
    int n_steps;
    int *step_of;               /* per node: the step computing it, or -1 */
    bool *materialized;         /* per node: its value exists at run time (a source, a view, a buffer) */
    uint32_t *last_use;         /* per node: the last node reading it; count for outputs */
    ir_ref *visit;              /* the nodes a run computes or takes, in order */
    uint32_t n_visit;
    int kernels;                /* steps that make a buffer, eager ones included */
    int64_t peak_bytes;         /* of the values alive at once */
    int products_in_blocks;
} ir_plan;

typedef struct {
    /* The code generator the kernels are for, or NULL: no kernels, every
     * node run by the eager ops (the interpreter). */
    const struct kx_backend *backend;
    int opt_level;             /* the compile's: whether the backend splits sums */
    /* A CPU product is computed in blocks of about this many bytes with its
     * epilogue on each block (0: never). */
    int64_t product_block_bytes;
} plan_options;

/* Plans g: lowering into fusion groups (when o->backend is set), then the
 * decisions the backend's code depends on (a product computed inside its
 * epilogue's kernel, kernels writing over an input, products in blocks,
 * streaming stores), then liveness and the memory plan. Kernels are final
 * when it returns. 0; -CORE_NOMEM; or -CORE_INTERNAL with why in err. */
int ir_plan_make(const ir_graph *g, const plan_options *o, ir_plan *plan, char *err, size_t err_size);
void ir_plan_free(ir_plan *plan);
/* Whether node r gets a buffer of its own when the plan runs (sources and
 * views do not, nor a product computed inside its epilogue). */
bool ir_plan_stores(const ir_plan *p, ir_ref r);
/* The nodes whose values node r reads when the plan runs (a kernel's input
 * buffers, an eager node's operands; none for a node computed inside a
 * kernel). */
const ir_ref *ir_plan_uses(const ir_plan *p, ir_ref r, uint32_t *n);

#endif
