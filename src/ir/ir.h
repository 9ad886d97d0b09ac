/* The op table and the dtype rules every module shares. */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <kiln/kiln.h>

typedef enum {
#define OP(N, n, arity, kind, flags, rule) OP_##N,
#include "ir/ops.def"
    OP__COUNT
} ir_op;

typedef enum {
    KIND_SOURCE,
    KIND_ELEMENTWISE,
    KIND_REDUCTION,
    KIND_MOVEMENT,
    KIND_MATMUL,
    KIND_ASSIGN,
    KIND_LINE,  /* a result line along an axis from the operand's line there */
    KIND_INDEX, /* elements picked or placed by a tensor of indices */
} ir_kind;

enum {
    FLAG_0 = 0,
    FLAG_COMMUTATIVE = 1,
    FLAG_SIDE_EFFECT = 2,
    FLAG_TRANSCENDENTAL = 4, /* costly per element: worth threads sooner */
    FLAG_RANDOM = 8,         /* a source of random values, drawn afresh each call */
    FLAG_UNFUSED = 16,       /* run by its eager op in every plan, never inside a fused kernel */
};

/* How an op's result dtype follows from its operands' dtypes. */
typedef enum {
    RULE_ARITH,        /* the promoted dtype */
    RULE_ARITH_NOBOOL, /* the promoted dtype; bool refused */
    RULE_TRUEDIV,      /* the promoted dtype, integers and bool to f32 */
    RULE_COMPARE,      /* bool, computed in the promoted dtype */
    RULE_WHERE,        /* the promotion of the two values; cond must be bool */
    RULE_SIGNED,       /* the operand's dtype; bool refused */
    RULE_FLOAT,        /* the operand's dtype if floating, else f32 */
    RULE_PARAM,        /* the dtype the op is given */
    RULE_SUM,          /* floats keep theirs, integers and bool give i64 */
    RULE_MEAN,         /* floats keep theirs, integers and bool give f32 */
    RULE_SAME,         /* the operand's dtype */
    RULE_INDEX,        /* i64 */
    RULE_PROMOTE,      /* the promotion of every operand */
    RULE_MATMUL,       /* the promoted dtype; bool refused */
} ir_dtype_rule;

typedef struct {
    const char *name;
    int arity;
    ir_kind kind;
    int flags;
    ir_dtype_rule rule;
} ir_op_info;

extern const ir_op_info ir_ops[OP__COUNT];

/* "f32", "f64", "i32", "i64", "bool": the names kiln prints and parses. */
extern const char *const ir_dtype_names[KILN_BOOL + 1];

static inline bool ir_dtype_is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64;
}

/* Bytes per element. */
static inline size_t ir_dtype_size(kiln_dtype dt)
{
    return dt == KILN_F64 || dt == KILN_I64 ? 8 : dt == KILN_BOOL ? 1 : 4;
}

/* How much an operand's dtype counts in promotion, as in PyTorch: tensors
 * with dimensions first, then 0-d tensors, then scalars (the *_scalar forms). */
typedef enum { IR_SCALAR, IR_ZERO_DIM, IR_DIMS } ir_rank_class;

/* The dtype two operands compute in. Within a class the wider dtype wins. A
 * lower class counts only when its category (bool < integer < float) is
 * higher: a 0-d tensor then brings its own dtype, a scalar the category's
 * default (i64 or f32). */
kiln_dtype ir_promote(kiln_dtype a, ir_rank_class a_class, kiln_dtype b, ir_rank_class b_class);

/* The result dtype of rule applied to the promoted operand dtype, or -1 when
 * the rule refuses it. */
int ir_result_dtype(ir_dtype_rule rule, kiln_dtype promoted);

/* -- Graphs ---------------------------------------------------------------- */

/* A node's index in its graph. Operands always precede their users. */
typedef uint32_t ir_ref;
#define IR_NONE UINT32_MAX

/* The parameters an op needs beyond its operands, zeroed where unused so that
 * nodes compare with memcmp. */
typedef struct {
    int64_t index;  /* input, capture: which one; rand, randn: the seed's bits; topk: k */
    double value;   /* const */
    int64_t start;  /* slice: first index taken */
    int64_t step;   /* slice */
    int32_t axis;   /* reductions, slice, concat; KILN_ALL for every axis */
    int32_t keepdim; /* reductions; topk: largest first (else smallest) */
    int32_t scalar; /* const: promotes as a scalar, not as a 0-d tensor */
    int32_t perm[KILN_MAX_DIMS]; /* permute; conv2d: its IR_CONV_* parameters */
    int32_t zero;   /* always 0: fills what would be padding, which memcmp reads */
} ir_params;
_Static_assert(sizeof(ir_params) == 80, "ir_params must have no padding");

/* Where a conv2d node keeps its window in ir_params.perm (each below 2^31):
 * stride, padding and dilation of axes 2 and 3, then groups. */
enum {
    IR_CONV_STRIDE = 0,
    IR_CONV_PADDING = 2,
    IR_CONV_DILATION = 4,
    IR_CONV_GROUPS = 6,
    IR_CONV_PARAMS = 7,
};
/* The windows of k taps dilated by d, stepping s over an extent padded by p
 * on each side; 0 or less when none fits. */
static inline int64_t ir_conv_extent(int64_t extent, int64_t k, int64_t s, int64_t p, int64_t d)
{
    int64_t room = extent + 2 * p - (d * (k - 1) + 1);
    return room < 0 ? 0 : room / s + 1;
}

/* -- Sizes ----------------------------------------------------------------- *
 * A dimension of a node's shape is a concrete size (>= 0) or a symbolic one
 * (< 0): a polynomial with integer coefficients in the graph's symbols
 * s0..s7, the sizes of input dimensions that vary between calls. The graph
 * keeps each polynomial once, so shapes still compare with memcmp. */
enum { IR_MAX_SYMBOLS = 8, IR_POLY_TERMS = 8 };
#define IR_SIZE_NONE INT64_MIN /* a size that cannot be kept symbolic */

typedef struct {
    int64_t coef;
    uint8_t exp[IR_MAX_SYMBOLS]; /* the power of each symbol */
} ir_term;
_Static_assert(sizeof(((ir_term *)0)->exp) == sizeof(uint64_t), "ir_poly_eval reads a term's powers as one word");

typedef struct {
    int n;
    ir_term terms[IR_POLY_TERMS]; /* sorted by exponents, highest first; no zero coefficient */
} ir_poly;

/* The polynomials sizes of a graph (or a kernel) name: size -1 - i is
 * polys[i]. Each polynomial is kept once, so equal sizes are equal numbers. */
typedef struct {
    ir_poly *polys;
    int n, cap;
} ir_sizes;

typedef struct {
    ir_op op;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];   /* concrete sizes, or symbolic ones (see above) */
    uint32_t first_operand, n_operands; /* into ir_graph.operands */
    ir_params params;
    uint32_t hash_next; /* chains nodes of one hash bucket, IR_NONE ends */
} ir_node;

typedef struct {
    int64_t capture; /* which capture receives the value */
    ir_ref value;
} ir_writeback;

/* A traced function: nodes in one array in topological order, hash-consed at
 * emit time so that equal nodes are one node. */
typedef struct {
    ir_node *nodes;
    uint32_t count, cap;
    ir_ref *operands;
    uint32_t n_operands, operands_cap;
    uint32_t *buckets; /* power of two; node refs, IR_NONE when empty */
    uint32_t n_buckets;
    ir_ref *outputs;
    int n_outputs, outputs_cap;
    ir_writeback *writebacks;
    int n_writebacks, writebacks_cap;
    int n_inputs, n_captures;
    ir_sizes sizes;     /* the symbolic sizes its shapes name */
    int n_symbols;      /* s0..s(n_symbols-1) */
    int64_t traced_at[IR_MAX_SYMBOLS]; /* the symbols' values when it was traced */
} ir_graph;

/* A new empty graph, or NULL when out of memory. */
ir_graph *ir_graph_new(void);
void ir_graph_free(ir_graph *g);
/* The node (op, dtype, shape, operands, params), reusing an equal node when
 * there is one; IR_NONE when out of memory. params may be NULL (all zero).
 * operands must not point into g: appending may move g's arrays. */
ir_ref ir_emit(ir_graph *g, ir_op op, kiln_dtype dt, int ndim, const int64_t *shape,
               int n_operands, const ir_ref *operands, const ir_params *params);
int ir_add_output(ir_graph *g, ir_ref r);
int ir_add_writeback(ir_graph *g, int64_t capture, ir_ref value);
static inline const ir_ref *ir_operands(const ir_graph *g, const ir_node *n)
{
    return g->operands + n->first_operand;
}
/* The most elements a tensor may have. It also bounds the product of the
 * nonzero sizes of an empty shape, so that every partial product of a
 * checked shape's sizes, in elements or in bytes, fits in int64. */
#define IR_MAX_NUMEL (INT64_C(1) << 59)
/* True when no size is negative and the nonzero sizes multiply to at most
 * IR_MAX_NUMEL: shapes of tensors and nodes always are. The element count in
 * *numel. */
bool ir_shape_numel(int ndim, const int64_t *shape, int64_t *numel);
/* A node's element count (its shape is checked: see ir_shape_numel). */
int64_t ir_node_numel(const ir_node *n);
/* Nodes that launch a kernel when run: not sources (random ones aside: they
 * fill a buffer), not views. */
bool ir_node_computes(const ir_node *n);

/* -- Symbolic sizes (size.c) ------------------------------------------------ *
 * Sizes are int64: >= 0 concrete, else a handle into a table of polynomials;
 * IR_SIZE_NONE says a result did not fit (more terms than a polynomial
 * holds, an overflow, a division that is not exact). */

/* size's polynomial (a constant for a concrete size); false for a handle not in t. */
bool ir_size_poly(const ir_sizes *t, int64_t size, ir_poly *p);
/* p as a size: concrete when a constant >= 0, else its entry in t (made
 * once; a kernel keeps its negative strides there); IR_SIZE_NONE when out of
 * memory. */
int64_t ir_size_of(ir_sizes *t, const ir_poly *p);
/* Symbol s as a size. */
int64_t ir_size_symbol(ir_sizes *t, int symbol);
/* a + b, a * b, a / b (exact: b concrete, or a monomial dividing every term). */
int64_t ir_size_add(ir_sizes *t, int64_t a, int64_t b);
int64_t ir_size_mul(ir_sizes *t, int64_t a, int64_t b);
int64_t ir_size_div(ir_sizes *t, int64_t a, int64_t b);
/* size of table from as a size of table to. */
int64_t ir_size_moved(ir_sizes *to, const ir_sizes *from, int64_t size);
/* p's value for the symbols' values; IR_SIZE_NONE when it overflows. */
int64_t ir_poly_eval(const ir_poly *p, const int64_t *symbols);
/* size's value for the symbols' values; IR_SIZE_NONE when it overflows or
 * is negative. */
int64_t ir_size_eval(const ir_sizes *t, int64_t size, const int64_t *symbols);
/* The symbol size is, or -1 when it is not a lone symbol. */
int ir_size_as_symbol(const ir_sizes *t, int64_t size);
/* A bit per symbol that size names. */
unsigned ir_size_symbols(const ir_sizes *t, int64_t size);
/* The shape's sizes for the symbols' values; false when one does not fit. */
bool ir_shape_eval(const ir_sizes *t, int ndim, const int64_t *shape, const int64_t *symbols, int64_t *out);
/* Whether a shape has a symbolic dimension. */
bool ir_shape_symbolic(int ndim, const int64_t *shape);
/* The product of a shape's sizes, as a size of t. */
int64_t ir_shape_product(ir_sizes *t, int ndim, const int64_t *shape);
/* to becomes a copy of from; -1 when out of memory (to stays). */
int ir_sizes_copy(ir_sizes *to, const ir_sizes *from);
void ir_sizes_free(ir_sizes *t);

/* -- Symbolic shapes (symbolic.c) ------------------------------------------- */

/* While tracing, a reshape's or expand's params.perm says where each size of
 * the result came from: a number the body passed (IR_SIZE_GIVEN, 0),
 * reshape's -1 (IR_SIZE_INFERRED), or IR_SIZE_FROM + k: the operand's size k
 * (squeeze, unsqueeze, expand's -1). ir_symbolize reads and clears it. */
enum { IR_SIZE_GIVEN = 0, IR_SIZE_INFERRED = 1, IR_SIZE_FROM = 2 };

/* traced with the dimensions of dynamic (per input, a bit per axis) made
 * symbolic where every op allows it and the body did not read their sizes
 * (shape_read: per node, or NULL): a new graph whose input nodes say the
 * guards (see symbolic.c). *log (malloc'd) says what became of each
 * dimension asked for. NULL when out of memory, or when no shape rule
 * explains the graph. */
ir_graph *ir_symbolize(const ir_graph *traced, const uint32_t *dynamic, const bool *shape_read, char **log);

/* -- Text and pictures ----------------------------------------------------- */

/* The canonical text of g (the cache hashes it), malloc'd; NULL when out of memory. */
char *ir_to_text(const ir_graph *g);
/* Parses canonical text; on failure returns NULL and writes why (with the
 * line number) into err. */
ir_graph *ir_parse(const char *text, char *err, size_t err_size);
/* Graphviz dot of g, malloc'd. */
char *ir_to_dot(const ir_graph *g, const char *name);

/* -- Checks and passes ----------------------------------------------------- */

/* 0 when g is well formed (order, arity, dtypes and shapes agree with the op
 * table's rules), else -1 with the reason in err. */
int ir_verify(const ir_graph *g, char *err, size_t err_size);

/* Computes op on constant operands for folding: 0 and the result in *out, or
 * -1 when it cannot (the node then stays). */
typedef int (*ir_eval_fn)(const ir_node *node, const double *operands,
                          const kiln_dtype *operand_dtypes, double *out);

typedef struct {
    ir_eval_fn eval;   /* NULL: no constant folding */
    bool fast_math;    /* allow rewrites that are not exact in IEEE arithmetic */
    bool verify;       /* run ir_verify after every pass */
    bool transcendental; /* rewrite compositions of transcendentals (rewrite.c) */
    bool transpose_products; /* (a @ b)ᵀ as bᵀ @ aᵀ (passes.c): rounds as the product's code does */
    bool long_rows;      /* a lone long row's softmax in pieces, online (long_rows.c) */
} ir_pass_options;

/* Constant folding, algebraic simplification, common subexpressions and dead
 * code, repeated until nothing changes. Replaces *g; 0 or -1 (out of memory,
 * or a verifier failure described in err). */
int ir_optimize(ir_graph **g, const ir_pass_options *opt, char *err, size_t err_size);
/* The single passes, for tests: each replaces *g and returns the number of
 * rewrites it made, or -1 when out of memory. */
int ir_pass_fold(ir_graph **g, ir_eval_fn eval);
int ir_pass_simplify(ir_graph **g, bool fast_math);
int ir_pass_dce(ir_graph **g);
/* rewrite.c: compositions of transcendentals in cheaper or more accurate
 * forms, within the errors kiln.h states rather than bit for bit. */
int ir_pass_transcendental(ir_graph **g);
/* passes.c: a product read only transposed computed as bᵀ @ aᵀ. */
int ir_pass_transpose_products(ir_graph **g);
/* long_rows.c: softmax, log_softmax and log-sum-exp of a lone long row in
 * the two-pass online form over pieces, within the generated code's
 * rounding. */
int ir_pass_long_rows(ir_graph **g);

#endif
