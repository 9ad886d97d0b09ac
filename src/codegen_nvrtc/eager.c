/* Shape-generic CUDA kernels for eager ops: one per op and dtypes, with sizes
 * and strides as arguments (the ABI is in ir/kernel.h).
 *
 * They compute what src/eager computes on the CPU: inputs converted to the
 * compute dtype as kiln_cast converts, the op of expr.c, its result converted
 * to the output. A reduction sums in f64 or i64 (in another order than the
 * CPU: float sums may differ in the last bits) and keeps extremes as
 * (value, index) pairs, so that ties and NaNs resolve to the first of them
 * whatever order the threads meet them in: argmax's first maximum or first
 * NaN, and for max and min the first of equal -0 and +0, which is what
 * eager's sequential folds keep (its 16-lane row folds on rows of 16 or more
 * may keep another zero). */
#include <stdio.h>
#include <stdlib.h>

#include "codegen_nvrtc/internal.h"

/* -- Elementwise ----------------------------------------------------------- */

static void declare_ew_args(strbuf *s)
{
    strbuf_put(s,
               "struct kg_ew_args {\n"
               "    long long numel;\n"
               "    long long shape[%d];\n"
               "    long long out_strides[%d];\n"
               "    long long in_strides[%d][%d];\n"
               "    unsigned long long scalar_bits[%d];\n"
               "    int ndim;\n"
               "    int contiguous;\n"
               "    int scalar_mask;\n"
               "    int unused;\n"
               "};\n"
               "static_assert(sizeof(kg_ew_args) == %zu, \"kg_ew_args as ir/kernel.h has it\");\n\n",
               KILN_MAX_DIMS, KILN_MAX_DIMS, KG_EW_INPUTS, KILN_MAX_DIMS, KG_EW_INPUTS,
               sizeof(kg_ew_args));
}

/* The dtype input i is converted to before the op: where's condition stays
 * bool, and a cast converts its input straight to the output, as eager's
 * copies do. */
static kiln_dtype operand_dtype(const kg_kernel *k, int i)
{
    if (k->op == OP_CAST || (k->op == OP_WHERE && i == 0))
        return k->in[i];
    return k->compute;
}

/* Element i's offsets in the output (o) and each input (o<k>): i itself when
 * contiguous, else its coordinates over shape dotted with the strides. */
static void ew_offsets(strbuf *s, int n_in)
{
    strbuf_put(s, "        long long o = i");
    for (int k = 0; k < n_in; k++)
        strbuf_put(s, ", o%d = i", k);
    strbuf_put(s, ";\n"
                  "        if (!args.contiguous) {\n"
                  "            long long rest = i;\n"
                  "            o = 0;\n");
    for (int k = 0; k < n_in; k++)
        strbuf_put(s, "            o%d = 0;\n", k);
    strbuf_put(s, "            for (int d = args.ndim - 1; d >= 0; d--) {\n"
                  "                long long c = rest %% args.shape[d];\n"
                  "                rest /= args.shape[d];\n"
                  "                o += c * args.out_strides[d];\n");
    for (int k = 0; k < n_in; k++)
        strbuf_put(s, "                o%d += c * args.in_strides[%d][d];\n", k, k);
    strbuf_put(s, "            }\n"
                  "        }\n");
}

/* s<i>: input i's scalar, read from its bits as its own dtype. Unused when
 * not a scalar. */
static void ew_scalar(strbuf *s, const kg_kernel *k, int i)
{
    static const char *const from_bits[] = {
        [KILN_F32] = "__int_as_float((int)%s)", [KILN_F64] = "__longlong_as_double((long long)%s)",
        [KILN_I32] = "(int)%s", [KILN_I64] = "(long long)%s", [KILN_BOOL] = "(unsigned char)%s"};
    char bits[32];
    snprintf(bits, sizeof bits, "args.scalar_bits[%d]", i);
    strbuf_put(s, "    const %s s%d = ", nvrtc_ctype(k->in[i]), i);
    strbuf_put(s, from_bits[k->in[i]], bits);
    strbuf_put(s, ";\n");
}

/* x<i>: input i of the element, in its operand dtype. */
static void ew_input(strbuf *s, const kg_kernel *k, int i)
{
    kiln_dtype to = operand_dtype(k, i);
    char load[40], scalar[16];
    snprintf(load, sizeof load, "in%d[o%d]", i, i);
    snprintf(scalar, sizeof scalar, "s%d", i);
    strbuf_put(s, "        %s x%d = (args.scalar_mask >> %d) & 1 ? ", nvrtc_ctype(to), i, i);
    nvrtc_convert(s, scalar, k->in[i], to);
    strbuf_put(s, " : ");
    nvrtc_convert(s, load, k->in[i], to);
    strbuf_put(s, ";\n");
}

/* The body's value r and its dtype; false when the op has no CUDA form. */
static bool ew_value(strbuf *s, const kg_kernel *k, kiln_dtype *dt)
{
    if (k->op == OP_CAST) {
        *dt = operand_dtype(k, 0);
        strbuf_put(s, "        %s r = x0;\n", nvrtc_ctype(*dt));
        return true;
    }
    *dt = ir_ops[k->op].rule == RULE_COMPARE ? KILN_BOOL : k->compute;
    strbuf_put(s, "        %s r = ", nvrtc_ctype(*dt));
    bool known = nvrtc_op(s, k->op, k->compute, "x0", k->n_in > 1 ? "x1" : NULL, k->n_in > 2 ? "x2" : NULL);
    strbuf_put(s, ";\n");
    return known;
}

static bool elementwise(strbuf *s, const kg_kernel *k, const char *name, char *err, size_t err_size)
{
    declare_ew_args(s);
    strbuf_put(s, "extern \"C\" __global__ void __launch_bounds__(%d) %s(kg_ew_args args, %s *__restrict__ out",
               KG_BLOCK, name, nvrtc_ctype(k->out));
    for (int i = 0; i < KG_EW_INPUTS; i++)
        strbuf_put(s, ", const %s *__restrict__ in%d", i < k->n_in ? nvrtc_ctype(k->in[i]) : "void", i);
    strbuf_put(s, ")\n{\n");
    for (int i = 0; i < k->n_in; i++)
        ew_scalar(s, k, i);
    strbuf_put(s, "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < args.numel;\n"
                  "         i += (long long)gridDim.x * blockDim.x) {\n");
    ew_offsets(s, k->n_in);
    for (int i = 0; i < k->n_in; i++)
        ew_input(s, k, i);
    kiln_dtype dt;
    if (!ew_value(s, k, &dt)) {
        char what[128];
        kg_describe(k, what, sizeof what);
        snprintf(err, err_size, "no eager kernel for %s: %s on %s is not in the CUDA backend", what,
                 ir_ops[k->op].name, ir_dtype_names[k->compute]);
        return false;
    }
    strbuf_put(s, "        out[o] = ");
    nvrtc_convert(s, "r", dt, k->out);
    strbuf_put(s, ";\n"
                  "    }\n"
                  "}\n");
    return true;
}

/* -- Reductions ------------------------------------------------------------ */

static bool is_extreme(ir_op op)
{
    return op == OP_MAX || op == OP_MIN || op == OP_ARGMAX || op == OP_ARGMIN;
}

static void declare_reduce_args(strbuf *s)
{
    strbuf_put(s,
               "struct kg_reduce_args {\n"
               "    long long outer, n, inner;\n"
               "};\n"
               "static_assert(sizeof(kg_reduce_args) == %zu, \"kg_reduce_args as ir/kernel.h has it\");\n\n",
               sizeof(kg_reduce_args));
}

/* Whether (v, i) goes before (best, at) in the order an extreme takes the
 * first of: NaN above every number, then by value, ties to the lower index.
 * An empty state (the identity at index LLONG_MAX) goes after every element. */
static void declare_precedes(strbuf *s, const kg_kernel *k)
{
    const char *t = nvrtc_ctype(k->compute), *beats = k->op == OP_MIN || k->op == OP_ARGMIN ? "<" : ">";
    strbuf_put(s,
               "static __device__ bool kiln_precedes(%s v, long long i, %s best, long long at) {\n"
               "    if (v != v) return best == best || i < at;\n"
               "    return best == best && (v %s best || (v == best && i < at));\n"
               "}\n\n",
               t, t, beats);
}

/* The per-thread state set empty (declared with it when declare): acc for
 * sums, (best, at) for extremes. */
static void reduce_empty(strbuf *s, const kg_kernel *k, const char *indent, bool declare)
{
    if (!is_extreme(k->op)) {
        strbuf_put(s, "%s%s%sacc = ", indent, declare ? nvrtc_ctype(k->acc) : "", declare ? " " : "");
        nvrtc_reduction_init(s, k->op == OP_PROD ? OP_PROD : OP_SUM, k->acc);
        strbuf_put(s, ";\n");
        return;
    }
    strbuf_put(s, "%s%s%sbest = ", indent, declare ? nvrtc_ctype(k->compute) : "", declare ? " " : "");
    nvrtc_reduction_init(s, k->op == OP_MIN || k->op == OP_ARGMIN ? OP_MIN : OP_MAX, k->compute);
    strbuf_put(s, ";\n%s%sat = 9223372036854775807LL;\n", indent, declare ? "long long " : "");
}

/* Folds the input element load, at index, into the state. */
static void reduce_element(strbuf *s, const kg_kernel *k, const char *indent, const char *load,
                           const char *index)
{
    strbuf_put(s, "%s%s v = ", indent, nvrtc_ctype(k->compute));
    nvrtc_convert(s, load, k->in[0], k->compute);
    strbuf_put(s, ";\n");
    if (is_extreme(k->op)) {
        strbuf_put(s, "%sif (kiln_precedes(v, %s, best, at)) { best = v; at = %s; }\n", indent, index, index);
        return;
    }
    strbuf_put(s, "%s%s w = ", indent, nvrtc_ctype(k->acc));
    nvrtc_convert(s, "v", k->compute, k->acc);
    strbuf_put(s, ";\n%s", indent);
    nvrtc_fold(s, k->op == OP_PROD ? OP_PROD : OP_SUM, k->acc, "acc", "w");
}

/* Folds the state of the thread d lanes up into this one's, for d = 16 .. 1. */
static void reduce_shuffle(strbuf *s, const kg_kernel *k, const char *indent)
{
    strbuf_put(s, "%sfor (int d = 16; d > 0; d /= 2) {\n", indent);
    if (is_extreme(k->op)) {
        strbuf_put(s,
                   "%s    %s ov = kiln_shfl(best, d);\n"
                   "%s    long long oi = kiln_shfl(at, d);\n"
                   "%s    if (kiln_precedes(ov, oi, best, at)) { best = ov; at = oi; }\n",
                   indent, nvrtc_ctype(k->compute), indent, indent);
    } else {
        strbuf_put(s, "%s    %s other = kiln_shfl(acc, d);\n%s    ", indent, nvrtc_ctype(k->acc), indent);
        nvrtc_fold(s, k->op == OP_PROD ? OP_PROD : OP_SUM, k->acc, "acc", "other");
    }
    strbuf_put(s, "%s}\n", indent);
}

/* Stores the state's result at out[at_out]. */
static void reduce_store(strbuf *s, const kg_kernel *k, const char *indent, const char *at_out)
{
    strbuf_put(s, "%sout[%s] = ", indent, at_out);
    switch (k->op) {
    case OP_MEAN: nvrtc_convert(s, "((double)acc / (double)args.n)", KILN_F64, k->out); break;
    case OP_ARGMAX:
    case OP_ARGMIN: nvrtc_convert(s, "at", KILN_I64, k->out); break;
    case OP_MAX:
    case OP_MIN: nvrtc_convert(s, "best", k->compute, k->out); break;
    default: nvrtc_convert(s, "acc", k->acc, k->out); break;
    }
    strbuf_put(s, ";\n");
}

/* inner == 1: a block per row. Its threads stride over the row and fold
 * their states by warp shuffles, then warp 0 folds the warps' states, passed
 * through shared memory. */
static void reduce_rows(strbuf *s, const kg_kernel *k)
{
    bool extreme = is_extreme(k->op);
    const char *state = extreme ? "best" : "acc";
    strbuf_put(s, "    if (args.inner == 1) {\n"
                  "        __shared__ %s part[%d];\n",
               nvrtc_ctype(extreme ? k->compute : k->acc), KG_BLOCK / 32);
    if (extreme)
        strbuf_put(s, "        __shared__ long long part_at[%d];\n", KG_BLOCK / 32);
    strbuf_put(s, "        for (long long row = blockIdx.x; row < args.outer; row += gridDim.x) {\n"
                  "            const %s *x = in0 + row * args.n;\n",
               nvrtc_ctype(k->in[0]));
    reduce_empty(s, k, "            ", true);
    strbuf_put(s, "            for (long long r = threadIdx.x; r < args.n; r += blockDim.x) {\n");
    reduce_element(s, k, "                ", "x[r]", "r");
    strbuf_put(s, "            }\n");
    reduce_shuffle(s, k, "            ");
    strbuf_put(s, "            if ((threadIdx.x & 31) == 0) {\n"
                  "                part[threadIdx.x / 32] = %s;\n",
               state);
    if (extreme)
        strbuf_put(s, "                part_at[threadIdx.x / 32] = at;\n");
    strbuf_put(s, "            }\n"
                  "            __syncthreads();\n"
                  "            if (threadIdx.x < 32) {\n"
                  "                if (threadIdx.x < blockDim.x / 32) {\n"
                  "                    %s = part[threadIdx.x];\n",
               state);
    if (extreme)
        strbuf_put(s, "                    at = part_at[threadIdx.x];\n");
    strbuf_put(s, "                } else {\n");
    reduce_empty(s, k, "                    ", false);
    strbuf_put(s, "                }\n");
    reduce_shuffle(s, k, "                ");
    strbuf_put(s, "                if (threadIdx.x == 0)\n");
    reduce_store(s, k, "                    ", "row");
    strbuf_put(s, "            }\n"
                  "            __syncthreads(); /* part is read before the next row writes it */\n"
                  "        }\n"
                  "        return;\n"
                  "    }\n");
}

/* inner > 1: a thread per output, walking its column of the [n, inner] slab
 * in order; neighbouring threads read neighbouring elements. */
static void reduce_columns(strbuf *s, const kg_kernel *k)
{
    strbuf_put(s, "    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                  "         t < args.outer * args.inner; t += (long long)gridDim.x * blockDim.x) {\n"
                  "        const %s *x = in0 + t / args.inner * args.n * args.inner + t %% args.inner;\n",
               nvrtc_ctype(k->in[0]));
    reduce_empty(s, k, "        ", true);
    strbuf_put(s, "        for (long long r = 0; r < args.n; r++) {\n");
    reduce_element(s, k, "            ", "x[r * args.inner]", "r");
    strbuf_put(s, "        }\n");
    reduce_store(s, k, "        ", "t");
    strbuf_put(s, "    }\n");
}

static bool reduce(strbuf *s, const kg_kernel *k, const char *name, char *err, size_t err_size)
{
    declare_reduce_args(s);
    if (is_extreme(k->op))
        declare_precedes(s, k);
    strbuf_put(s,
               "extern \"C\" __global__ void __launch_bounds__(%d) %s(kg_reduce_args args, %s *__restrict__ out, "
               "const %s *__restrict__ in0)\n{\n",
               KG_BLOCK, name, nvrtc_ctype(k->out), nvrtc_ctype(k->in[0]));
    reduce_rows(s, k);
    reduce_columns(s, k);
    strbuf_put(s, "}\n");
    return true;
}

/* -- The entry point ------------------------------------------------------- */

char *nvrtc_eager_source(const kg_kernel *k, char *name, size_t name_size, char *err, size_t err_size)
{
    if (kg_check(k, err, err_size) < 0 || kg_name(k, name, name_size, err, err_size) < 0)
        return NULL;
    if (k->kind == KG_MATMUL)
        return nvrtc_matmul_source(k, name, err, err_size);
    if (k->kind >= KG_SCAN)
        return nvrtc_lines_source(k, name, err, err_size);
    strbuf s = {0};
    strbuf_put(&s, "%s\n", NVRTC_PRELUDE);
    bool made = k->kind == KG_ELEMENTWISE ? elementwise(&s, k, name, err, err_size)
                                                   : reduce(&s, k, name, err, err_size);
    char *text = strbuf_finish(&s);
    if (made && !text)
        snprintf(err, err_size, "out of memory");
    if (!made) {
        free(text);
        return NULL;
    }
    return text;
}
