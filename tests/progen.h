/* progen: seeded random kiln programs for differential tests of the backends.
 *
 *   progen_program *p = progen_new(seed, NULL);
 *   kiln_tensor *in[PROGEN_MAX_INPUTS], *out[PROGEN_MAX_OUTPUTS];
 *   for (int i = 0; i < progen_n_inputs(p); i++)
 *       in[i] = progen_make_input(p, i, seed + i);
 *   progen_run(p, in, out);                               // eagerly
 *   kiln_fn *f = kiln_jit("progen", progen_body, progen_n_inputs(p),
 *                         progen_n_outputs(p), p, &opts); // traced
 *   kiln_call(f, in, out);
 *
 * A program is a list of instructions over a value table: values 0 ..
 * n_inputs-1 are the inputs, and instruction i defines value n_inputs + i. The
 * generator tracks each value's dtype and shape (and whether an integer value
 * is known not to be negative) and only emits calls that kiln.h defines, so
 * that a failing call or a result of the wrong dtype or shape is a finding.
 * Every instruction is one public kiln call (the indexing ops' indices are
 * another value taken modulo the axis's extent, with kiln_remainder, so
 * that they are in range), and progen_run makes exactly those calls, so it
 * runs the same on eager tensors and on tracers.
 *
 * Tensors the program creates (kiln_full, kiln_rand, ...) are eager even in a
 * traced body, so a marked function captures them. kiln_assign writes only to
 * such a tensor, and only where eager and traced runs must agree: before
 * anything has read it (a captured tensor keeps what the last call assigned)
 * and while no view of it exists (a view taken before an assignment would
 * see the new values eagerly). An assign instruction's value is its dst.
 *
 * Everything is derived from the seed with a counter-based generator: the
 * same seed and options give the same program and listing on any machine. */
#ifndef KILN_TESTS_PROGEN_H
#define KILN_TESTS_PROGEN_H

#include <stdbool.h>
#include <stdint.h>

#include <kiln/kiln.h>

/* The public ops a program may call, each named after its kiln_<name>. */
#define PROGEN_OPS(_)                                                                  \
    _(ADD, add) _(SUB, sub) _(MUL, mul) _(DIV, div) _(POW, pow)                        \
    _(MAXIMUM, maximum) _(MINIMUM, minimum)                                            \
    _(ADD_SCALAR, add_scalar) _(SUB_SCALAR, sub_scalar) _(MUL_SCALAR, mul_scalar)      \
    _(DIV_SCALAR, div_scalar) _(POW_SCALAR, pow_scalar)                                \
    _(MAXIMUM_SCALAR, maximum_scalar) _(MINIMUM_SCALAR, minimum_scalar)                \
    _(EQ, eq) _(NE, ne) _(LT, lt) _(LE, le) _(GT, gt) _(GE, ge) _(WHERE, where)        \
    _(NEG, neg) _(ABS, abs) _(EXP, exp) _(LOG, log) _(SQRT, sqrt) _(RSQRT, rsqrt)      \
    _(TANH, tanh) _(SIGMOID, sigmoid) _(RELU, relu) _(SIN, sin) _(COS, cos)            \
    _(ERF, erf) _(CAST, cast)                                                          \
    _(SUM, sum) _(MEAN, mean) _(MAX, max) _(MIN, min) _(ARGMAX, argmax)                \
    _(RESHAPE, reshape) _(PERMUTE, permute) _(TRANSPOSE, transpose)                    \
    _(EXPAND, expand) _(SLICE, slice) _(CONCAT, concat) _(SQUEEZE, squeeze)            \
    _(UNSQUEEZE, unsqueeze) _(CONTIGUOUS, contiguous)                                  \
    _(MATMUL, matmul)                                                                  \
    _(SOFTMAX, softmax) _(LOG_SOFTMAX, log_softmax) _(LAYER_NORM, layer_norm)          \
    _(GELU, gelu) _(SILU, silu)                                                        \
    _(FULL, full) _(ZEROS, zeros) _(ONES, ones) _(ARANGE, arange) _(RAND, rand)        \
    _(RANDN, randn) _(SCALAR, scalar) _(FROM_DATA, from_data)                        \
    _(ASSIGN, assign)                                                                  \
    _(FLOOR, floor) _(CEIL, ceil) _(ROUND, round) _(TRUNC, trunc) _(LOG1P, log1p)      \
    _(EXPM1, expm1) _(LOG2, log2) _(TAN, tan) _(ATAN, atan) _(SIGN, sign)              \
    _(RECIPROCAL, reciprocal) _(ISNAN, isnan) _(ISINF, isinf)                          \
    _(LOGICAL_NOT, logical_not) _(GELU_ERF, gelu_erf) _(SOFTPLUS, softplus)            \
    _(REMAINDER, remainder) _(FLOOR_DIVIDE, floor_divide) _(ATAN2, atan2)              \
    _(LOGICAL_AND, logical_and) _(LOGICAL_OR, logical_or) _(LOGICAL_XOR, logical_xor)  \
    _(CLAMP, clamp) _(PROD, prod) _(ARGMIN, argmin) _(ANY, any) _(ALL, all)            \
    _(VAR, var) _(STD, std) _(LOGSUMEXP, logsumexp) _(CUMSUM, cumsum) _(TOPK, topk)    \
    _(SORT, sort) _(GATHER, gather) _(INDEX_SELECT, index_select)                      \
    _(EMBEDDING, embedding) _(SCATTER_ADD, scatter_add) _(MASKED_FILL, masked_fill)    \
    _(STACK, stack) _(SPLIT, split) _(FLIP, flip) _(PAD, pad) _(TRIL, tril)            \
    _(TRIU, triu) _(REPEAT, repeat) _(EYE, eye) _(LINSPACE, linspace)                  \
    _(ZEROS_LIKE, zeros_like) _(ONES_LIKE, ones_like) _(FULL_LIKE, full_like)          \
    _(BATCH_NORM, batch_norm) _(GROUP_NORM, group_norm) _(RMS_NORM, rms_norm)          \
    _(LAYER_NORM_AXES, layer_norm_axes) _(CROSS_ENTROPY, cross_entropy)                \
    _(NLL_LOSS, nll_loss) _(MSE_LOSS, mse_loss) _(DROPOUT, dropout)

typedef enum {
#define PROGEN_ENUM(N, n) PROGEN_##N,
    PROGEN_OPS(PROGEN_ENUM)
#undef PROGEN_ENUM
    PROGEN_OP_COUNT
} progen_op;

/* A set of ops, a bit each (a GCC and Clang extension: more than 64 ops). */
__extension__ typedef unsigned __int128 progen_mask;
#define PROGEN_OP_BIT(op) ((progen_mask)1 << (op))
/* The ops that make tensors (on the CPU) rather than take them: programs
 * over another device's inputs leave them out. */
#define PROGEN_MAKING_OPS                                                                                     \
    (PROGEN_OP_BIT(PROGEN_FULL) | PROGEN_OP_BIT(PROGEN_ZEROS) | PROGEN_OP_BIT(PROGEN_ONES) |                  \
     PROGEN_OP_BIT(PROGEN_ARANGE) | PROGEN_OP_BIT(PROGEN_RAND) | PROGEN_OP_BIT(PROGEN_RANDN) |                \
     PROGEN_OP_BIT(PROGEN_SCALAR) | PROGEN_OP_BIT(PROGEN_FROM_DATA) | PROGEN_OP_BIT(PROGEN_ASSIGN) |              \
     PROGEN_OP_BIT(PROGEN_EYE) | PROGEN_OP_BIT(PROGEN_LINSPACE))
#define PROGEN_ALL_OPS (PROGEN_OP_BIT(PROGEN_OP_COUNT) - 1)
#define PROGEN_DTYPE_BIT(dt) (1u << (dt))

enum {
    PROGEN_MAX_INPUTS = 8,
    PROGEN_MAX_OUTPUTS = 3,
};

/* What progen_new may generate. Fields left 0 take the default in brackets. */
typedef struct {
    int min_ops, max_ops;  /* instructions in a program [5, 50] */
    int max_inputs;        /* 1 to PROGEN_MAX_INPUTS inputs [4] */
    unsigned dtypes;       /* PROGEN_DTYPE_BIT()s every value's dtype is one of [all five] */
    int max_rank;          /* inputs have rank 0..max_rank, at most 4 [4]; values grow to 6 */
    int64_t max_dim;       /* inputs' sizes are 1..max_dim [7] */
    int64_t max_numel;     /* elements in any one value [4096] */
    progen_mask ops;       /* PROGEN_OP_BIT()s of the ops to use [all] */
    unsigned matmul_weight; /* how often a matmul is tried, against 1 to 3 for each other op [4]: products
                               with elementwise ops before and after them */
} progen_options;

typedef struct progen_program progen_program;

/* A new program for seed; opt NULL means every default. NULL when out of
 * memory or when the options leave nothing to generate. Free with progen_free. */
progen_program *progen_new(uint64_t seed, const progen_options *opt);
void progen_free(progen_program *p);

int progen_n_inputs(const progen_program *p);
int progen_n_outputs(const progen_program *p);
/* Whether p draws random values: traced, each call draws new ones, and
 * only the first call's equal eager's (whose seeds are fixed; a program
 * with dropout sets the global generator to its seed when it starts). */
bool progen_draws_random(const progen_program *p);
int progen_n_instrs(const progen_program *p);
/* The op of instruction i (helpers the generator inserted included). */
progen_op progen_instr_op(const progen_program *p, int i);
/* "kiln_add", ... */
const char *progen_op_name(progen_op op);
/* The signature of input i, for kiln_fn_precompile. */
kiln_spec progen_input_spec(const progen_program *p, int i);

/* A new tensor (a new reference, as kiln's creation functions return) for
 * input i, its values drawn from seed in ranges suited to its dtype: small
 * floats with a rare zero, infinity or NaN, small integers (never negative
 * where the program relies on it), random bools; now and then a tensor
 * mostly of zeros of both signs, or of integer extremes. Inputs now and then
 * have an empty axis. */
kiln_tensor *progen_make_input(const progen_program *p, int i, uint64_t seed);

/* Runs the program on in (borrowed), writing progen_n_outputs new references
 * to out, owned like any op's result (by the innermost scope, if one is open).
 * Intermediate values are released before it returns. Works on eager tensors
 * and, inside a marked function's body, on tracers. Returns 0, or -1 with
 * out all NULL when a call fails or gives a dtype or shape other than kiln.h
 * promises; progen_last_error says which. */
int progen_run(const progen_program *p, kiln_tensor *const *in, kiln_tensor **out);
/* progen_run as a kiln_body: user is the program. */
int progen_body(kiln_tensor *const *in, kiln_tensor **out, void *user);
/* Why the last progen_run on this thread failed, or "". */
const char *progen_last_error(void);

/* The program as C-like source, one kiln call per line with the value's dtype
 * and shape, malloc'd (free it). */
char *progen_describe(const progen_program *p);

/* A new program computing only output k of p, keeping the instructions it
 * depends on and all of p's inputs (so p's input tensors still fit). */
progen_program *progen_only_output(const progen_program *p, int k);

/* -- References --------------------------------------------------------------
 * Programs of one call whose output PyTorch 1.13 gives (Python's list
 * slicing for kiln_slice's negative steps), written down by hand: signed
 * zeros, integer extremes, empty axes, 0-d softmax, composites of integers. */

/* How many there are. */
int progen_n_references(void);
/* Runs reference i on its inputs moved to device, eagerly (opts NULL) or as a
 * marked function with opts, and compares its output with PyTorch's: the
 * same dtype and shape, integers and bools equal, floats NaN for NaN and
 * zeros with their sign, other floats within rel. 0, or -1 with
 * progen_last_error saying which call, what PyTorch gives and where it
 * differs. */
int progen_check_reference(int i, const kiln_jit_options *opts, kiln_device device, double rel);

#endif
