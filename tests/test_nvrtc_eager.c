/* The shape-generic eager CUDA kernels on a machine without a GPU: of every
 * dtype combination eager can ask of an elementwise op or reduction, a set
 * covering all their conversions and ops is rendered as CUDA C and compiled
 * by NVRTC for sm_90 (a kernel of each op for sm_80 too); bad requests are
 * refused with the op and dtypes named. Running the kernels needs a GPU: not
 * here. Exits 77 (skipped) where NVRTC is missing. */
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>

#include "codegen_nvrtc/internal.h"
#include "ir/ir.h"
#include "test_common.h"

enum { MAX_KERNELS = 1024, NAME_MAX_LEN = 160, WORKERS = 2 };

typedef struct {
    kg_kernel k[MAX_KERNELS];
    int n;
} kernel_set;

static bool same_kernel(const kg_kernel *a, const kg_kernel *b)
{
    return a->kind == b->kind && a->op == b->op && a->n_in == b->n_in && a->compute == b->compute &&
           a->acc == b->acc && a->out == b->out && !memcmp(a->in, b->in, sizeof a->in);
}

/* Adds k once; unused inputs zeroed so that equal requests compare equal. */
static void add_kernel(kernel_set *set, kg_kernel k)
{
    for (int i = k.n_in; i < KG_EW_INPUTS; i++)
        k.in[i] = KILN_F32;
    for (int i = 0; i < set->n; i++)
        if (same_kernel(&set->k[i], &k))
            return;
    ck_assert_int_lt(set->n, MAX_KERNELS);
    set->k[set->n++] = k;
}

static kg_kernel ew(ir_op op, int n_in, const kiln_dtype *in, kiln_dtype compute, kiln_dtype out)
{
    kg_kernel k = {KG_ELEMENTWISE, op, n_in, {KILN_F32, KILN_F32, KILN_F32}, compute, compute, out};
    memcpy(k.in, in, (size_t)n_in * sizeof *in);
    return k;
}

static kg_kernel reduction(ir_op op, kiln_dtype in)
{
    kiln_dtype compute = ir_dtype_is_float(in) ? in : KILN_I64;
    kiln_dtype acc = op == OP_ARGMAX || op == OP_ARGMIN ? KILN_I64
                   : op == OP_SUM || op == OP_PROD ? (compute == KILN_I64 ? KILN_I64 : KILN_F64)
                   : op == OP_MEAN ? KILN_F64 /* an integer mean's sum must not wrap */
                   : compute;
    return (kg_kernel){KG_REDUCE, op, 1, {in}, compute, acc,
                                (kiln_dtype)ir_result_dtype(ir_ops[op].rule, in)};
}

/* An operand as eager may see it: a dtype and how it counts in promotion.
 * Scalars (the *_scalar forms' second operand) come as f64, i64 or f32. */
typedef struct {
    kiln_dtype dt;
    ir_rank_class rank;
} operand;

static int operands(operand *out, bool scalars)
{
    int n = 0;
    for (int dt = KILN_F32; dt <= KILN_BOOL; dt++) {
        out[n++] = (operand){(kiln_dtype)dt, IR_DIMS};
        out[n++] = (operand){(kiln_dtype)dt, IR_ZERO_DIM};
    }
    if (scalars) {
        out[n++] = (operand){KILN_F64, IR_SCALAR};
        out[n++] = (operand){KILN_I64, IR_SCALAR};
        out[n++] = (operand){KILN_F32, IR_SCALAR};
    }
    return n;
}

/* Binary ops as elementwise.c's binary() picks dtypes: comparisons compute
 * in the promoted dtype, the rest in the result's. */
static void add_binary(kernel_set *set, ir_op op)
{
    operand a[16], b[16];
    int na = operands(a, false), nb = operands(b, true);
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++) {
            kiln_dtype promoted = ir_promote(a[i].dt, a[i].rank, b[j].dt, b[j].rank);
            int result = ir_result_dtype(ir_ops[op].rule, promoted);
            if (result < 0)
                continue;
            kiln_dtype compute = ir_ops[op].rule == RULE_COMPARE ? promoted : (kiln_dtype)result;
            add_kernel(set, ew(op, 2, (kiln_dtype[]){a[i].dt, b[j].dt}, compute, (kiln_dtype)result));
        }
}

static void add_where(kernel_set *set)
{
    operand a[16];
    int n = operands(a, false);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            kiln_dtype dt = ir_promote(a[i].dt, a[i].rank, a[j].dt, a[j].rank);
            add_kernel(set, ew(OP_WHERE, 3, (kiln_dtype[]){KILN_BOOL, a[i].dt, a[j].dt}, dt, dt));
        }
}

/* Everything eager's elementwise ops, casts and reductions can ask for. */
static void all_kernels(kernel_set *set)
{
    set->n = 0;
#define OP(N, n, arity, kind, flags, rule)                                                                \
    if (KIND_##kind == KIND_ELEMENTWISE && arity == 2)                                                    \
        add_binary(set, OP_##N);                                                                          \
    if (KIND_##kind == KIND_ELEMENTWISE && arity == 1 && OP_##N != OP_CAST)                               \
        for (int dt = KILN_F32; dt <= KILN_BOOL; dt++) {                                                  \
            int result = ir_result_dtype(RULE_##rule, (kiln_dtype)dt);                                    \
            if (result >= 0)                                                                              \
                add_kernel(set, ew(OP_##N, 1, (kiln_dtype[]){(kiln_dtype)dt}, (kiln_dtype)result,         \
                                   (kiln_dtype)result));                                                  \
        }                                                                                                 \
    if (KIND_##kind == KIND_REDUCTION)                                                                    \
        for (int dt = KILN_F32; dt <= KILN_BOOL; dt++)                                                    \
            add_kernel(set, reduction(OP_##N, (kiln_dtype)dt));
#include "ir/ops.def"
    add_where(set);
    for (int from = KILN_F32; from <= KILN_BOOL; from++)
        for (int to = KILN_F32; to <= KILN_BOOL; to++)
            add_kernel(set, ew(OP_CAST, 1, (kiln_dtype[]){(kiln_dtype)from}, (kiln_dtype)from, (kiln_dtype)to));
}

/* The dtype input i is converted to in k. */
static kiln_dtype operand_of(const kg_kernel *k, int i)
{
    return k->op == OP_WHERE && i == 0 ? KILN_BOOL : k->op == OP_CAST ? k->out : k->compute;
}

/* A kernel's code is its inputs' conversions, the op in the compute dtype
 * and the result's conversion: all of them, with NVRTC at ~0.1-0.3 s a
 * program, is too slow a test. Covering them is enough: every kernel of a
 * unary op, a cast, where or a reduction; a binary op's kernels whose inputs
 * are already in the compute dtype; and every mixed-input kernel of one op
 * of each dtype rule. */
static void covering_kernels(const kernel_set *all, kernel_set *some)
{
    bool rule_seen[RULE_MATMUL + 1] = {false}, representative[OP__COUNT] = {false};
    for (int op = 0; op < OP__COUNT; op++)
        if (ir_ops[op].kind == KIND_ELEMENTWISE && ir_ops[op].arity == 2 && !rule_seen[ir_ops[op].rule])
            rule_seen[ir_ops[op].rule] = representative[op] = true;
    some->n = 0;
    for (int i = 0; i < all->n; i++) {
        const kg_kernel *k = &all->k[i];
        bool same = true;
        for (int j = 0; j < k->n_in; j++)
            same = same && k->in[j] == operand_of(k, j);
        if (k->kind != KG_ELEMENTWISE || k->n_in != 2 || representative[k->op] || same)
            add_kernel(some, *k);
    }
}

/* Whether every piece of every kernel of all is in some kernel of some: each
 * (op, compute, out) and each input's (position, dtype, operand dtype). */
static bool covers(const kernel_set *some, const kernel_set *all)
{
    static bool op_seen[3][OP__COUNT][5][5], input_seen[3][3][5][5];
    memset(op_seen, 0, sizeof op_seen);
    memset(input_seen, 0, sizeof input_seen);
    for (int i = 0; i < some->n; i++) {
        const kg_kernel *k = &some->k[i];
        op_seen[k->kind][k->op][k->compute][k->out] = true;
        for (int j = 0; j < k->n_in; j++)
            input_seen[k->kind][j][k->in[j]][operand_of(k, j)] = true;
    }
    for (int i = 0; i < all->n; i++) {
        const kg_kernel *k = &all->k[i];
        if (!op_seen[k->kind][k->op][k->compute][k->out])
            return false;
        for (int j = 0; j < k->n_in; j++)
            if (!input_seen[k->kind][j][k->in[j]][operand_of(k, j)])
                return false;
    }
    return true;
}

/* -- Compiling, two threads at a time --------------------------------------- */

typedef struct {
    const kg_kernel *k;
    const char *arch;
    char name[NAME_MAX_LEN];
    char *source;
    bool compiled, has_entry;
    char err[2048];
} job;

typedef struct {
    job *jobs;
    int n;
    atomic_int next;
} queue;

static void run_job(job *j)
{
    j->source = nvrtc_eager_source(j->k, j->name, sizeof j->name, j->err, sizeof j->err);
    if (!j->source)
        return;
    void *object;
    size_t size;
    if (nvrtc_compile_source(j->source, j->name, j->arch, &object, &size, j->err, sizeof j->err) < 0)
        return;
    j->compiled = true;
    /* The object is the CUBIN's length, the CUBIN, then the PTX. */
    const unsigned char *p = object;
    uint64_t cubin = 0;
    for (int b = 0; b < 8; b++)
        cubin |= (uint64_t)p[b] << (8 * b);
    char entry[NAME_MAX_LEN + 16];
    snprintf(entry, sizeof entry, ".entry %s(", j->name);
    j->has_entry = 8 + cubin < size && memmem(p + 8 + cubin, size - 8 - cubin, entry, strlen(entry));
    free(object);
}

static void *worker(void *arg)
{
    queue *q = arg;
    for (int i; (i = atomic_fetch_add(&q->next, 1)) < q->n;)
        run_job(&q->jobs[i]);
    return NULL;
}

static void compile_all(job *jobs, int n)
{
    queue q = {jobs, n, 0};
    pthread_t threads[WORKERS];
    for (int t = 0; t < WORKERS; t++)
        ck_assert_int_eq(pthread_create(&threads[t], NULL, worker, &q), 0);
    for (int t = 0; t < WORKERS; t++)
        pthread_join(threads[t], NULL);
}

static bool is_identifier(const char *s)
{
    if (!isalpha((unsigned char)*s) && *s != '_')
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_')
            return false;
    return true;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(((const job *)a)->name, ((const job *)b)->name);
}

/* Compiles each kernel of set for arch and checks the sources, names and PTX. */
static void check_compiles(const kernel_set *set, const char *arch)
{
    job *jobs = calloc((size_t)set->n, sizeof *jobs);
    for (int i = 0; i < set->n; i++)
        jobs[i] = (job){.k = &set->k[i], .arch = arch};
    compile_all(jobs, set->n);
    for (int i = 0; i < set->n; i++) {
        job *j = &jobs[i];
        ck_assert_msg(j->source, "kernel %d (op %s): %s", i, ir_ops[j->k->op].name, j->err);
        ck_assert_msg(j->compiled, "%s for %s: %s\n%s", j->name, arch, j->err, j->source);
        ck_assert_msg(j->has_entry, "%s: the PTX lacks its entry", j->name);
        ck_assert_msg(!strncmp(j->source, NVRTC_PRELUDE, strlen(NVRTC_PRELUDE)), "%s: no prelude first", j->name);
        ck_assert_msg(is_identifier(j->name), "\"%s\" is not an identifier", j->name);
        free(j->source);
    }
    qsort(jobs, (size_t)set->n, sizeof *jobs, compare_names);
    for (int i = 1; i < set->n; i++)
        ck_assert_msg(strcmp(jobs[i - 1].name, jobs[i].name), "two kernels named %s", jobs[i].name);
    free(jobs);
}

START_TEST(test_every_eager_kernel_compiles_for_sm_90)
{
    static kernel_set all, some;
    all_kernels(&all);
    bool ew_op[OP__COUNT] = {false}, reduce_op[OP__COUNT] = {false};
    for (int i = 0; i < all.n; i++)
        (all.k[i].kind == KG_REDUCE ? reduce_op : ew_op)[all.k[i].op] = true;
    for (int op = 0; op < OP__COUNT; op++) {
        ck_assert_msg(ew_op[op] == (ir_ops[op].kind == KIND_ELEMENTWISE), "%s", ir_ops[op].name);
        ck_assert_msg(reduce_op[op] == (ir_ops[op].kind == KIND_REDUCTION), "%s", ir_ops[op].name);
    }
    covering_kernels(&all, &some);
    ck_assert(covers(&some, &all));
    printf("compiling %d of eager's %d kernels for sm_90\n", some.n, all.n);
    check_compiles(&some, "sm_90");
}
END_TEST

/* The first kernel of each op, and the reductions of f32 and i32. */
START_TEST(test_a_kernel_of_each_op_compiles_for_sm_80)
{
    static kernel_set all, some;
    all_kernels(&all);
    some.n = 0;
    bool seen[OP__COUNT] = {false};
    for (int i = 0; i < all.n; i++) {
        const kg_kernel *k = &all.k[i];
        bool reduced = k->kind == KG_REDUCE && (k->in[0] == KILN_F32 || k->in[0] == KILN_I32);
        if (reduced || !seen[k->op])
            add_kernel(&some, *k);
        seen[k->op] = true;
    }
    printf("compiling %d eager kernels for sm_80\n", some.n);
    check_compiles(&some, "sm_80");
}
END_TEST

/* -- The source's contract -------------------------------------------------- */

static char *source_of(kg_kernel k, char *name)
{
    char err[256];
    char *text = nvrtc_eager_source(&k, name, NAME_MAX_LEN, err, sizeof err);
    ck_assert_msg(text, "%s", err);
    return text;
}

START_TEST(test_sources_follow_the_abi)
{
    char name[NAME_MAX_LEN], again[NAME_MAX_LEN];
    kg_kernel add = ew(OP_ADD, 2, (kiln_dtype[]){KILN_I32, KILN_F32}, KILN_F32, KILN_F32);
    char *text = source_of(add, name);
    ck_assert_str_eq(name, "kiln_eager_ew_add_in_i32_f32_compute_f32_acc_f32_out_f32");
    ck_assert_ptr_nonnull(strstr(text, "struct kg_ew_args {"));
    ck_assert_ptr_nonnull(strstr(text, "(kg_ew_args args, float *__restrict__ out, const int *__restrict__ in0, "
                                       "const float *__restrict__ in1, const void *__restrict__ in2)"));
    ck_assert_ptr_nonnull(strstr(text, "__launch_bounds__(256)"));
    /* The same request, the same kernel. */
    char *same = source_of(add, again);
    ck_assert_str_eq(name, again);
    ck_assert_str_eq(text, same);
    free(same);
    free(text);
    /* Only the inputs that exist count: unused slots do not change the kernel. */
    kg_kernel neg = ew(OP_NEG, 1, (kiln_dtype[]){KILN_F64}, KILN_F64, KILN_F64);
    text = source_of(neg, name);
    neg.in[1] = KILN_BOOL;
    same = source_of(neg, again);
    ck_assert_str_eq(name, again);
    ck_assert_str_eq(text, same);
    free(same);
    free(text);
    /* Reductions: the args struct, the output then the input. */
    text = source_of(reduction(OP_ARGMAX, KILN_I32), name);
    ck_assert_str_eq(name, "kiln_eager_reduce_argmax_in_i32_compute_i64_acc_i64_out_i64");
    ck_assert_ptr_nonnull(strstr(text, "struct kg_reduce_args {"));
    ck_assert_ptr_nonnull(
        strstr(text, "(kg_reduce_args args, long long *__restrict__ out, const int *__restrict__ in0)"));
    ck_assert_ptr_nonnull(strstr(text, "__shfl_down_sync"));
    free(text);
    /* Matrix products are named here and written by matmul.c. */
    kg_kernel mm = {KG_MATMUL, OP_MATMUL, 2, {KILN_F64, KILN_F64}, KILN_F64, KILN_F64, KILN_F64};
    text = source_of(mm, name);
    ck_assert_str_eq(name, "kiln_eager_matmul_matmul_in_f64_f64_compute_f64_acc_f64_out_f64");
    ck_assert_ptr_nonnull(strstr(text, name));
    free(text);
}
END_TEST

/* -- Refusals ----------------------------------------------------------------- */

static void check_refused(kg_kernel k, size_t name_size, const char *a, const char *b)
{
    char name[NAME_MAX_LEN], err[256] = "";
    ck_assert_ptr_null(nvrtc_eager_source(&k, name, name_size, err, sizeof err));
    ck_assert_msg(strstr(err, a) && strstr(err, b), "\"%s\" lacks \"%s\" or \"%s\"", err, a, b);
}

START_TEST(test_bad_requests_are_refused)
{
    kiln_dtype f32x2[] = {KILN_F32, KILN_F32};
    check_refused(ew(OP_SUM, 1, f32x2, KILN_F32, KILN_F32), NAME_MAX_LEN, "sum(f32) in f32 to f32",
                  "not elementwise");
    check_refused(ew(OP_MATMUL, 2, f32x2, KILN_F32, KILN_F32), NAME_MAX_LEN, "matmul(f32, f32)", "not elementwise");
    check_refused(ew(OP_ADD, 1, f32x2, KILN_F32, KILN_F32), NAME_MAX_LEN, "add(f32)", "takes 2 inputs");
    check_refused(ew(OP_EXP, 1, (kiln_dtype[]){KILN_I32}, KILN_I32, KILN_I32), NAME_MAX_LEN, "exp(i32) in i32",
                  "not in the CUDA backend");
    check_refused(ew(OP_DIV, 2, (kiln_dtype[]){KILN_I64, KILN_I64}, KILN_I64, KILN_I64), NAME_MAX_LEN,
                  "div(i64, i64) in i64", "not in the CUDA backend");
    check_refused(ew(OP_SUB, 2, (kiln_dtype[]){KILN_BOOL, KILN_BOOL}, KILN_BOOL, KILN_BOOL), NAME_MAX_LEN,
                  "sub(bool, bool)", "refuses bool");
    check_refused(ew(OP_NEG, 1, (kiln_dtype[]){KILN_BOOL}, KILN_BOOL, KILN_BOOL), NAME_MAX_LEN, "neg(bool)",
                  "refuses bool");
    check_refused(ew(OP_WHERE, 3, (kiln_dtype[]){KILN_F32, KILN_F32, KILN_F32}, KILN_F32, KILN_F32), NAME_MAX_LEN,
                  "where(f32, f32, f32)", "condition must be bool");
    /* Out of range: no aborts, no reads past the tables. */
    kg_kernel k = ew(OP_ADD, 2, f32x2, KILN_F32, KILN_F32);
    k.n_in = 0;
    check_refused(k, NAME_MAX_LEN, "add", "0 inputs");
    k.n_in = 4;
    check_refused(k, NAME_MAX_LEN, "add", "4 inputs");
    k = ew(OP_ADD, 2, f32x2, KILN_F32, (kiln_dtype)9);
    check_refused(k, NAME_MAX_LEN, "add", "not one of kiln's");
    k = ew(OP_ADD, 2, f32x2, KILN_F32, KILN_F32);
    k.op = (ir_op)OP__COUNT;
    check_refused(k, NAME_MAX_LEN, "unknown op", "");
    k = ew(OP_ADD, 2, f32x2, KILN_F32, KILN_F32);
    k.kind = (kg_kind)7;
    check_refused(k, NAME_MAX_LEN, "unknown kind 7", "");
    check_refused(ew(OP_ADD, 2, f32x2, KILN_F32, KILN_F32), 16, "name", "16 bytes");
    /* Reductions. */
    kg_kernel r = reduction(OP_SUM, KILN_F32);
    r.op = OP_ADD;
    check_refused(r, NAME_MAX_LEN, "add(f32)", "not sum, mean, max, min, argmax, prod or argmin");
    r = reduction(OP_MAX, KILN_I32);
    r.compute = r.acc = KILN_I32;
    check_refused(r, NAME_MAX_LEN, "max(i32) in i32", "f32, f64 or i64");
    r = reduction(OP_SUM, KILN_F32);
    r.acc = KILN_F32;
    check_refused(r, NAME_MAX_LEN, "sum(f32)", "accumulates in f64, not f32");
    r = reduction(OP_MEAN, KILN_I64);
    r.acc = KILN_I64;
    check_refused(r, NAME_MAX_LEN, "mean(i64)", "accumulates in f64, not i64");
    r = reduction(OP_MEAN, KILN_F64);
    r.n_in = 2;
    check_refused(r, NAME_MAX_LEN, "mean(f64, f32)", "takes 1 input");
}
END_TEST

static Suite *nvrtc_eager_suite(void)
{
    Suite *s = suite_create("nvrtc_eager");
    TCase *tc = tcase_create("nvrtc_eager");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_sources_follow_the_abi);
    tcase_add_test(tc, test_bad_requests_are_refused);
    tcase_add_test(tc, test_a_kernel_of_each_op_compiles_for_sm_80);
    suite_add_tcase(s, tc);
    TCase *every_kernel = test_exhaustive_case("every kernel", 600);
    tcase_add_test(every_kernel, test_every_eager_kernel_compiles_for_sm_90);
    suite_add_tcase(s, every_kernel);
    return s;
}

int main(void)
{
    char err[512];
    if (!nvrtc_toolchain(err, sizeof err)) {
        printf("skipped: %s\n", err);
        return 77;
    }
    int failed = test_run_suite(nvrtc_eager_suite());
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
