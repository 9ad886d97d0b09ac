/* The LLVM backend against eager: every op, the standard workloads, random
 * programs; how many kernels the workloads fuse into; vectorized code.
 *
 * Tolerances: compiled code may reassociate sums and uses polynomial
 * transcendentals (their own error is asserted in test_llvm_math), so floats
 * compare within |got - want| <= 1e-5 * |want| + 1e-5 for f32 and 1e-12 for
 * f64 elementwise, and 1e-4 (f32) relative for workloads with reductions;
 * integers and bools exactly. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "../bench/workloads.h"
#include "progen.h"
#include "test_common.h"


/* Workloads own their inputs (workload_free releases them): no scope around. */
static void setup_unscoped(void)
{
    kiln_clear_error();
    test_live_at_start = kiln_live_tensors();
}

static void teardown_unscoped(void)
{
    ck_assert_int_eq(kiln_live_tensors(), test_live_at_start);
}

static kiln_jit_options llvm(void)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_LLVM;
    return o;
}


static int64_t kernels_of(const kiln_fn *f)
{
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    return s.kernels;
}

/* -- Ops on awkward layouts ------------------------------------------------ */

typedef kiln_tensor *(*op_case)(kiln_tensor *a, kiln_tensor *b);

#define CASE(name, expr) \
    static kiln_tensor *name(kiln_tensor *a, kiln_tensor *b) { (void)a; (void)b; return expr; }
CASE(c_chain, kiln_add(kiln_mul_scalar(kiln_sub(a, b), 0.5), kiln_div(a, kiln_add_scalar(kiln_abs(b), 1))))
CASE(c_compare_where, kiln_where(kiln_gt(a, b), kiln_maximum(a, b), kiln_minimum(a, b)))
CASE(c_transcendental, kiln_add(kiln_add(kiln_exp(kiln_neg(kiln_abs(a))), kiln_tanh(b)),
                                kiln_add(kiln_sigmoid(a), kiln_erf(b))))
CASE(c_log_sqrt, kiln_add(kiln_log(kiln_add_scalar(kiln_abs(a), 0.5)), kiln_rsqrt(kiln_add_scalar(kiln_abs(b), 1))))
CASE(c_trig_pow, kiln_add(kiln_sin(a), kiln_mul(kiln_cos(b), kiln_pow(kiln_abs(a), kiln_cast(b, KILN_F32)))))
CASE(c_relu_neg, kiln_relu(kiln_neg(kiln_sub(a, b))))
CASE(c_casts, kiln_add(kiln_cast(kiln_cast(a, KILN_I32), KILN_F64), kiln_cast(kiln_gt(a, b), KILN_F32)))
CASE(c_transposed, kiln_add(kiln_transpose(a, 0, 1), kiln_transpose(b, 0, 1)))
CASE(c_broadcast, kiln_mul(a, kiln_slice(b, 0, 0, 1, 1)))
CASE(c_sliced, kiln_add(kiln_slice(a, 1, -1, INT64_MIN, -2), kiln_slice(b, 1, 0, INT64_MAX, 2)))
CASE(c_slice_min_step, kiln_add(kiln_slice(a, 1, -1, INT64_MIN, INT64_MIN), kiln_slice(b, 0, 2, 0, INT64_MIN)))
CASE(c_reshaped, kiln_exp(kiln_reshape(kiln_add(a, b), 2, (const int64_t[]){-1, 3})))
CASE(c_expanded, kiln_add(kiln_expand(kiln_unsqueeze(kiln_sum(a, 0, false), 0), 2, (const int64_t[]){4, 6}), b))
CASE(c_row_sum, kiln_sum(kiln_mul(a, b), -1, false))
CASE(c_row_mean_keep, kiln_sub(a, kiln_mean(a, -1, true)))
CASE(c_row_max_min, kiln_sub(kiln_max(a, -1, true), kiln_min(b, 1, true)))
CASE(c_softmax, kiln_softmax(a, -1))
CASE(c_log_softmax, kiln_log_softmax(b, 1))
CASE(c_layer_norm, kiln_layer_norm(a, kiln_slice(b, 0, 0, 1, 1), kiln_slice(b, 0, 1, 2, 1), 1e-5))
CASE(c_matmul_epilogue, kiln_gelu(kiln_add(kiln_matmul(a, kiln_transpose(b, 0, 1)), kiln_scalar(0.5))))
CASE(c_column_sum, kiln_sum(a, 0, true))
CASE(c_integer, kiln_add(kiln_mul(kiln_cast(a, KILN_I64), kiln_cast(b, KILN_I64)),
                         kiln_cast(kiln_sum(kiln_cast(a, KILN_I32), -1, true), KILN_I64)))
CASE(c_bools, kiln_add(kiln_mul(kiln_gt(a, b), kiln_lt(a, b)), kiln_ge(a, b)))

static const struct {
    const char *name;
    op_case fn;
    double rel; /* f32 tolerance, relative */
} CASES[] = {
    {"chain", c_chain, 1e-6}, {"compare_where", c_compare_where, 0}, {"transcendental", c_transcendental, 4e-6},
    {"log_sqrt", c_log_sqrt, 4e-6}, {"trig_pow", c_trig_pow, 4e-6}, {"relu_neg", c_relu_neg, 0},
    {"casts", c_casts, 0}, {"transposed", c_transposed, 0}, {"broadcast", c_broadcast, 0},
    {"sliced", c_sliced, 0}, {"slice_min_step", c_slice_min_step, 0}, {"reshaped", c_reshaped, 2e-6}, {"expanded", c_expanded, 1e-6},
    {"row_sum", c_row_sum, 1e-5}, {"row_mean_keep", c_row_mean_keep, 1e-5}, {"row_max_min", c_row_max_min, 0},
    {"softmax", c_softmax, 1e-5}, {"log_softmax", c_log_softmax, 1e-5}, {"layer_norm", c_layer_norm, 1e-4},
    {"matmul_epilogue", c_matmul_epilogue, 1e-5}, {"column_sum", c_column_sum, 1e-6}, {"integer", c_integer, 0},
    {"bools", c_bools, 0},
};

static int case_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = CASES[*(const int *)user].fn(in[0], in[1]);
    return out[0] ? 0 : -1;
}

/* Each case on f32 and f64 [4,6] operands whose rows are not a multiple of
 * any vector width. */
START_TEST(test_ops_compiled_match_eager)
{
    int which = _i;
    static const kiln_dtype dtypes[] = {KILN_F32, KILN_F64};
    for (int d = 0; d < 2; d++) {
        kiln_tensor *in[2] = {kiln_cast(kiln_mul_scalar(kiln_randn(2, (int64_t[]){4, 6}, 1), 2), dtypes[d]),
                              kiln_cast(kiln_mul_scalar(kiln_randn(2, (int64_t[]){4, 6}, 2), 2), dtypes[d])};
        kiln_tensor *want = NULL, *got = NULL;
        ck_assert_int_eq(case_body(in, &want, &which), 0);
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit(CASES[which].name, case_body, 2, 1, &which, &o);
        ck_assert_msg(kiln_call(f, in, &got) == 0, "%s: %s", CASES[which].name, kiln_last_error());
        ck_assert_str_eq(kiln_fn_backend(f), "llvm");
        char what[80];
        snprintf(what, sizeof what, "%s on %s", CASES[which].name, kiln_dtype_name(dtypes[d]));
        double rel = dtypes[d] == KILN_F32 ? CASES[which].rel : 1e-12;
        assert_close(got, want, rel, rel, what);
        kiln_fn_free(f);
    }
}
END_TEST

/* -- Workloads ------------------------------------------------------------- */

START_TEST(test_workloads_compiled_match_eager)
{
    const workload *w = &workloads[_i];
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL};
    workload_state state = {0};
    ck_assert_int_eq(w->setup(WORKLOAD_QUICK, in, &state), 0);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, &state, &o);
    kiln_tensor *want = NULL, *got = NULL;
    kiln_scope_begin();
    ck_assert_int_eq(w->body(in, &want, &state), 0);
    ck_assert_msg(kiln_call(f, in, &got) == 0, "%s: %s", w->name, kiln_last_error());
    ck_assert_str_eq(kiln_fn_backend(f), "llvm");
    assert_close(got, want, 1e-4, 1e-5, w->name);
    kiln_scope_end();
    kiln_fn_free(f);
    workload_free(w, in, &state);
}
END_TEST

/* The counts: one kernel for gelu, softmax and layer norm; the mlp's
 * two matmuls and at most two epilogues; a lone row's softmax four (each
 * piece's log-sum-exp, a max and a sum over the pieces', the quotients:
 * the pieces' max and sum in one kernel, ir/lower.c's row epilogue). */
START_TEST(test_workloads_fuse)
{
    static const struct {
        const char *name;
        int kernels;
    } WANT[] = {{"gelu", 1}, {"softmax", 1}, {"layernorm", 1}, {"mlp", 4}, {"tiny", 1}, {"softmax_row", 4}};
    for (size_t i = 0; i < sizeof WANT / sizeof *WANT; i++) {
        const workload *w = workload_find(WANT[i].name);
        kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL}, *out;
        workload_state state = {0};
        ck_assert_int_eq(w->setup(WORKLOAD_QUICK, in, &state), 0);
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, &state, &o);
        ck_assert_int_eq(kiln_call(f, in, &out), 0);
        kiln_release(out);
        ck_assert_msg(kernels_of(f) <= WANT[i].kernels, "%s: %lld kernels, want %d", w->name,
                      (long long)kernels_of(f), WANT[i].kernels);
        kiln_fn_free(f);
        workload_free(w, in, &state);
    }
}
END_TEST

START_TEST(test_traced_mlp_and_attention_peak_below_eager)
{
    const char *names[] = {"mlp", "attention"};
    for (int i = 0; i < 2; i++) {
        const workload *w = workload_find(names[i]);
        kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL}, *out;
        workload_state state = {0};
        ck_assert_int_eq(w->setup(WORKLOAD_QUICK, in, &state), 0);
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, &state, &o);
        ck_assert_int_eq(kiln_call(f, in, &out), 0);
        kiln_release(out);
        int64_t base = kiln_live_bytes();
        kiln_reset_peak_live_bytes();
        kiln_scope_begin();
        ck_assert_int_eq(w->body(in, &out, &state), 0);
        kiln_scope_end();
        int64_t eager = kiln_peak_live_bytes() - base;
        kiln_reset_peak_live_bytes();
        kiln_scope_begin();
        ck_assert_int_eq(kiln_call(f, in, &out), 0);
        kiln_scope_end();
        int64_t traced = kiln_peak_live_bytes() - base;
        ck_assert_msg(traced < eager, "%s: traced peak %lld, eager %lld", w->name, (long long)traced,
                      (long long)eager);
        /* kiln_fn_stats says the same: the plan's peak, and eager's as the
         * graph estimates it (within a fifth of what eager measured). */
        kiln_fn_stats_t s;
        ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
        ck_assert_msg(s.peak_bytes < s.eager_peak_bytes && s.eager_peak_bytes >= eager * 4 / 5 &&
                          s.eager_peak_bytes <= eager * 6 / 5,
                      "%s: stats say traced %lld, eager %lld; eager measured %lld", w->name,
                      (long long)s.peak_bytes, (long long)s.eager_peak_bytes, (long long)eager);
        kiln_fn_free(f);
        workload_free(w, in, &state);
    }
}
END_TEST

/* Softmax sums its exponentials in f32 (positive terms, rows of at most
 * 4096): still within 4e-5 of eager's f64 sums, on rows of wide range. */
static int softmax_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_softmax(in[0], 1);
    return out[0] ? 0 : -1;
}

/* Where f32 partial sums would not be enough, sums stay in f64: a mean of
 * exponentials whose sum passes FLT_MAX, and softmax at opt_level 1, where
 * the row is summed in one sequence (terms below half an ulp of the first
 * would all be lost). */
static int mean_exp_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_mean(kiln_exp(in[0]), 1, false);
    return out[0] ? 0 : -1;
}

START_TEST(test_f32_sums_only_where_they_hold)
{
    kiln_scope_begin();
    kiln_jit_options o = llvm();
    kiln_tensor *big = kiln_full(KILN_F32, 2, (int64_t[]){1, 4}, 88.5), *got;
    kiln_fn *f = kiln_jit("mean_exp", mean_exp_body, 1, 1, NULL, &o);
    ck_assert_int_eq(kiln_call(f, &big, &got), 0);
    assert_close(got, kiln_mean(kiln_exp(big), 1, false), 1e-6, 0, "mean of exp(88.5)");
    kiln_fn_free(f);
    float row[4096];
    row[0] = 0;
    for (int i = 1; i < 4096; i++)
        row[i] = logf(0.99f * 0x1p-24f);
    kiln_tensor *x = kiln_from_data(KILN_F32, 2, (int64_t[]){1, 4096}, row);
    o.opt_level = 1;
    f = kiln_jit("softmax", softmax_body, 1, 1, NULL, &o);
    ck_assert_int_eq(kiln_call(f, &x, &got), 0);
    assert_close(got, kiln_softmax(x, 1), 1e-5, 1e-12, "softmax at opt_level 1");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

START_TEST(test_softmax_f32_sums_stay_close)
{
    kiln_scope_begin();
    kiln_tensor *x = kiln_mul_scalar(kiln_randn(2, (int64_t[]){8, 4096}, 7), 4), *got;
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("softmax", softmax_body, 1, 1, NULL, &o);
    ck_assert_int_eq(kiln_call(f, &x, &got), 0);
    ck_assert_str_eq(kiln_fn_backend(f), "llvm");
    assert_close(got, kiln_softmax(x, 1), 4e-5, 1e-12, "softmax of 4096-wide rows");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* An elementwise kernel whose input dies with it writes over that input: the
 * plan holds one matrix, not two; unless the input is also an output. */
static int matmul_epilogue(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *m = kiln_matmul(in[0], in[1]);
    out[0] = kiln_add_scalar(kiln_mul_scalar(kiln_tanh(m), 2), 1);
    if (user)
        out[1] = m;
    return out[0] ? 0 : -1;
}

START_TEST(test_epilogue_writes_in_place)
{
    kiln_scope_begin();
    kiln_tensor *in[2] = {kiln_randn(2, (int64_t[]){64, 32}, 1), kiln_randn(2, (int64_t[]){32, 48}, 2)};
    kiln_jit_options o = llvm();
    for (int keep = 0; keep < 2; keep++) {
        kiln_tensor *got[2] = {NULL, NULL}, *want[2] = {NULL, NULL};
        kiln_fn *f = kiln_jit("epilogue", matmul_epilogue, 2, 1 + keep, keep ? &o : NULL, &o);
        ck_assert_int_eq(kiln_call(f, in, got), 0);
        ck_assert_int_eq(matmul_epilogue(in, want, keep ? &o : NULL), 0);
        assert_close(got[0], want[0], 1e-5, 1e-5, "epilogue");
        if (keep)
            assert_close(got[1], want[1], 1e-5, 1e-5, "the product, also returned");
        kiln_fn_stats_t s;
        ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
        int64_t matrix = 64 * 48 * 4;
        ck_assert_msg(s.peak_bytes == (keep ? 2 : 1) * matrix, "keep %d: peak %lld", keep, (long long)s.peak_bytes);
        /* And a run does what the plan says. */
        int64_t base = kiln_live_bytes();
        kiln_reset_peak_live_bytes();
        kiln_tensor *again[2] = {NULL, NULL};
        ck_assert_int_eq(kiln_call(f, in, again), 0);
        ck_assert_int_eq(kiln_peak_live_bytes() - base, (keep ? 2 : 1) * matrix);
        kiln_fn_free(f);
    }
    kiln_scope_end();
}
END_TEST

/* -- Random programs ------------------------------------------------------- */

START_TEST(test_random_programs_compiled_match_eager)
{
    int count = (int)(getenv("KILN_PROGEN_COUNT") ? atoi(getenv("KILN_PROGEN_COUNT")) : 150);
    for (int s = 1; s <= count; s++) {
        kiln_scope_begin();
        progen_program *p = progen_new((uint64_t)s, NULL);
        int n_in = progen_n_inputs(p), n_out = progen_n_outputs(p);
        kiln_tensor *in[16], *want[8] = {NULL}, *got[8] = {NULL};
        for (int i = 0; i < n_in; i++)
            in[i] = progen_make_input(p, i, (uint64_t)s * 31 + (uint64_t)i);
        ck_assert_int_eq(progen_run(p, in, want), 0);
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit("random", progen_body, n_in, n_out, p, &o);
        int status = kiln_call(f, in, got);
        char *listing = status == 0 ? NULL : progen_describe(p);
        ck_assert_msg(status == 0, "seed %d: %s\n%s", s, kiln_last_error(), listing ? listing : "");
        ck_assert_str_eq(kiln_fn_backend(f), "llvm");
        for (int i = 0; i < n_out; i++) {
            char what[64];
            snprintf(what, sizeof what, "seed %d out[%d]", s, i);
            assert_close(got[i], want[i], 1e-4, 1e-4, what);
        }
        kiln_fn_free(f);
        progen_free(p);
        kiln_scope_end();
    }
}
END_TEST

/* progen's references (PyTorch's values for signed zeros, integer extremes,
 * empty axes and 0-d softmax), compiled. */
START_TEST(test_references_compiled_match_pytorch)
{
    kiln_jit_options o = llvm();
    o.strict = true;
    for (int i = 0; i < progen_n_references(); i++)
        ck_assert_msg(progen_check_reference(i, &o, KILN_CPU, 1e-6) == 0, "%s", progen_last_error());
}
END_TEST

/* Compiled float sums accumulate in f64, as eager's do: 1e8 + 1 - 1e8 is 1. */
static int cancelling_sums(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_sum(in[0], -1, false);
    out[1] = kiln_mean(in[0], 1, true);
    return out[0] && out[1] ? 0 : -1;
}

START_TEST(test_sums_keep_what_cancels)
{
    float values[3] = {1e8f, 1, -1e8f};
    kiln_tensor *x = kiln_from_data(KILN_F32, 2, (int64_t[]){1, 3}, values), *out[2];
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("cancel", cancelling_sums, 1, 2, NULL, &o);
    ck_assert_int_eq(kiln_call(f, &x, out), 0);
    ck_assert_double_eq(kiln_item(out[0]), 1);
    ck_assert_double_eq_tol(kiln_item(out[1]), 1.0 / 3, 1e-7);
    kiln_fn_free(f);
}
END_TEST

/* Seventy inputs summed: more than one kernel can take, so lowering splits. */
static int sum_many(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *total = in[0];
    for (int i = 1; i < 70; i++)
        total = kiln_add(total, in[i]);
    out[0] = total;
    return total ? 0 : -1;
}

START_TEST(test_kernels_with_too_many_inputs_split)
{
    kiln_tensor *in[70];
    for (int i = 0; i < 70; i++)
        in[i] = kiln_full(KILN_F32, 1, (int64_t[]){5}, i);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("sum_many", sum_many, 70, 1, NULL, &o);
    kiln_tensor *out;
    ck_assert_int_eq(kiln_call(f, in, &out), 0);
    ck_assert_str_eq(kiln_fn_backend(f), "llvm");
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 5 * 69 * 70 / 2);
    ck_assert_int_ge(kernels_of(f), 2);
    kiln_fn_free(f);
}
END_TEST

/* Slices of slices that are empty, with steps that overflow when their
 * index maps are composed (random program 25 on CUDA, under UBSan). */
static int empty_slices(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *empty = kiln_slice(kiln_slice(in[0], 0, -1, -2, INT64_MAX), 0, -2, 0, -3);
    out[0] = kiln_add_scalar(empty, 1);
    return out[0] ? 0 : -1;
}

START_TEST(test_empty_slices_with_huge_steps)
{
    int64_t shapes[2] = {0, 5};
    for (int i = 0; i < 2; i++) {
        kiln_tensor *x = kiln_arange(0, (double)shapes[i], 1, KILN_I64), *out;
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit("empty_slices", empty_slices, 1, 1, NULL, &o);
        ck_assert_msg(kiln_call(f, &x, &out) == 0, "%s", kiln_last_error());
        ck_assert_int_eq(kiln_numel(out), 0);
        ck_assert_int_eq(kiln_dtype_of(out), KILN_I64);
        kiln_fn_free(f);
    }
}
END_TEST

/* -- Threads --------------------------------------------------------------- */

typedef struct {
    int seed, failures;
} compile_job;

/* Marks, compiles and checks a few random programs: threads compile at once. */
static void *compile_programs(void *p)
{
    compile_job *job = p;
    for (int s = job->seed; s < job->seed + 8; s++) {
        kiln_scope_begin();
        progen_program *prog = progen_new((uint64_t)s, NULL);
        kiln_tensor *in[16], *want[8] = {NULL}, *got[8] = {NULL};
        for (int i = 0; i < progen_n_inputs(prog); i++)
            in[i] = progen_make_input(prog, i, (uint64_t)s);
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit("threaded", progen_body, progen_n_inputs(prog), progen_n_outputs(prog), prog, &o);
        if (progen_run(prog, in, want) != 0 || kiln_call(f, in, got) != 0)
            job->failures++;
        for (int i = 0; i < progen_n_outputs(prog) && got[0]; i++)
            job->failures += kiln_dtype_of(got[i]) != kiln_dtype_of(want[i]) ||
                             kiln_numel(got[i]) != kiln_numel(want[i]);
        kiln_fn_free(f);
        progen_free(prog);
        kiln_scope_end();
    }
    return NULL;
}

START_TEST(test_compiles_from_several_threads)
{
    pthread_t threads[3];
    compile_job jobs[3] = {{100, 0}, {200, 0}, {300, 0}};
    for (int i = 0; i < 3; i++)
        pthread_create(&threads[i], NULL, compile_programs, &jobs[i]);
    for (int i = 0; i < 3; i++)
        pthread_join(threads[i], NULL);
    ck_assert_int_eq(jobs[0].failures + jobs[1].failures + jobs[2].failures, 0);
}
END_TEST

/* -- Compiles beside calls ----------------------------------------------------- */

/* A long chain of transcendentals: one kernel that takes LLVM a while.
 * Under valgrind, where LLVM runs some fifty times slower and only the
 * calls' success is checked, a shorter one does. */
static int long_chain(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    kiln_tensor *x = in[0];
    int links = UNDER_VALGRIND() ? 30 : 300;
    for (int i = 0; i < links; i++)
        x = kiln_tanh(kiln_add_scalar(kiln_mul_scalar(x, 1.0001), 0.01 * (i % 7)));
    out[0] = x;
    return x ? 0 : -1;
}

static int plus_one(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_add_scalar(in[0], 1);
    return out[0] ? 0 : -1;
}

typedef struct {
    kiln_fn *f;
    kiln_tensor *x;
    atomic_int compiling; /* 1 while the other thread is inside its kiln_call */
    atomic_int stop;
    int64_t calls_during, failures;
} caller;

/* Calls c->f on c->x until told to stop, counting the calls that finished
 * while the other thread was compiling. */
static void *call_in_loop(void *arg)
{
    caller *c = arg;
    while (!atomic_load(&c->stop)) {
        kiln_tensor *out = NULL;
        c->failures += kiln_call(c->f, &c->x, &out) != 0;
        kiln_release(out);
        c->calls_during += atomic_load(&c->compiling);
    }
    return NULL;
}

/* While one thread compiles a large kernel for fn, another calls compiled
 * code in a loop: calls is the second thread's calls made meanwhile. */
static int64_t calls_during_compile(kiln_fn *fn, kiln_fn *called, kiln_tensor *called_input)
{
    caller c = {.f = called, .x = called_input};
    kiln_tensor *warm = NULL, *big_in = kiln_ones(KILN_F32, 1, (int64_t[]){64}), *big_out = NULL;
    ck_assert_int_eq(kiln_call(called, &called_input, &warm), 0); /* compiled before */
    kiln_release(warm);
    pthread_t thread;
    pthread_create(&thread, NULL, call_in_loop, &c);
    atomic_store(&c.compiling, 1);
    ck_assert_msg(kiln_call(fn, &big_in, &big_out) == 0, "%s", kiln_last_error());
    atomic_store(&c.compiling, 0);
    atomic_store(&c.stop, 1);
    pthread_join(thread, NULL);
    ck_assert_int_eq(c.failures, 0);
    kiln_release(big_in);
    kiln_release(big_out);
    return c.calls_during;
}

/* No lock is held across a compile that calls of compiled code need: calls
 * of another function, and of the same function's other signatures, go on
 * while it runs (a blocked caller would finish at most one call meanwhile).
 * Valgrind runs one thread at a time and, by default, may leave the compiling
 * one running to the end (CI saw it), so there only the calls' success is
 * checked. */
START_TEST(test_calls_go_on_during_a_compile)
{
    int64_t least = UNDER_VALGRIND() ? 0 : 20;
    kiln_jit_options o = llvm();
    o.no_cache = true; /* compiled here, not found on disk */
    kiln_fn *big = kiln_jit("long_chain", long_chain, 1, 1, NULL, &o);
    kiln_fn *small = kiln_jit("plus_one", plus_one, 1, 1, NULL, &o);
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){4});
    int64_t other_function = calls_during_compile(big, small, x);
    kiln_fn_free(big);
    /* The same function, with a signature compiled before. */
    kiln_fn *both = kiln_jit("long_chain", long_chain, 1, 1, NULL, &o);
    kiln_tensor *small_x = kiln_ones(KILN_F32, 1, (int64_t[]){3});
    int64_t same_function = calls_during_compile(both, both, small_x);
    kiln_release(x);
    kiln_release(small_x);
    kiln_fn_free(small);
    kiln_fn_free(both);
    ck_assert_msg(other_function >= least, "%lld calls of another function during the compile",
                  (long long)other_function);
    ck_assert_msg(same_function >= least, "%lld calls of the same function during the compile",
                  (long long)same_function);
}
END_TEST

/* -- Deep graphs ----------------------------------------------------------------- */

/* (x + 0.5) * 0.5, n times: one long chain, whose fixed point is 0.5. */
static int long_affine_chain(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    int n = *(const int *)user;
    kiln_tensor *x = in[0];
    for (int i = 0; i < n; i++)
        x = i % 2 ? kiln_mul_scalar(x, 0.5) : kiln_add_scalar(x, 0.5);
    out[0] = x;
    return x ? 0 : -1;
}

typedef struct {
    int ops, status;
    double mean;
    int64_t kernels, compiled;
    char error[512];
} deep_call;

static void *call_deep_chain(void *arg)
{
    deep_call *c = arg;
    kiln_fn *f = kiln_jit("deep", long_affine_chain, 1, 1, &c->ops, NULL);
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){1000}), *out = NULL;
    if ((c->status = kiln_call(f, &x, &out)) == 0) {
        kiln_tensor *mean = kiln_mean(out, KILN_ALL, false);
        c->mean = kiln_item(mean);
        kiln_release(mean);
        kiln_fn_stats_t s;
        kiln_fn_stats(f, &s);
        c->kernels = s.kernels;
        c->compiled = s.kernels_compiled;
    }
    snprintf(c->error, sizeof c->error, "%s", kiln_last_error());
    kiln_release(out);
    kiln_release(x);
    kiln_fn_free(f);
    return NULL;
}

/* No pass or lowering recurses on graph depth: a chain of 100,000 ops (it
 * used to overflow at 2,000 on a 1 MiB stack, 16,000 on the main thread)
 * traces, compiles and runs on a thread of 1 MiB. Kernels stop at a fused
 * depth of 256, and the chain's identical pieces share their code. */
START_TEST(test_deep_chain_on_a_small_stack)
{
    deep_call c = {.ops = UNDER_VALGRIND() ? 20000 : 100000};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_t thread;
    ck_assert_int_eq(pthread_create(&thread, &attr, call_deep_chain, &c), 0);
    pthread_join(thread, NULL);
    pthread_attr_destroy(&attr);
    ck_assert_msg(c.status == 0, "%s", c.error);
    ck_assert_double_eq_tol(c.mean, 0.5, 1e-6);
    ck_assert_int_ge(c.kernels, c.ops / 256);
    ck_assert_int_le(c.compiled, 4);
}
END_TEST

/* -- Vectorized code ------------------------------------------------------- */

/* The text of the next file of dir (open as d) ending in suffix, or NULL
 * when there is none; the caller frees it. */
static char *next_dumped(DIR *d, const char *dir, const char *suffix)
{
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name), k = strlen(suffix);
        if (n < k || strcmp(e->d_name + n - k, suffix))
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *in = fopen(path, "r");
        char *text = calloc(1, 1 << 22);
        if (in) {
            size_t got = fread(text, 1, (1 << 22) - 1, in);
            text[got] = '\0';
            fclose(in);
        }
        return text;
    }
    return NULL;
}

static char *read_dumped(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    char *text = next_dumped(d, dir, suffix);
    if (d)
        closedir(d);
    return text;
}

/* Compiles body for the LLVM backend with KILN_DUMP=kernels,llvm into dir. */
static kiln_fn *jit_dumping(const char *dir, const char *name, kiln_body body, int n_in, int n_out, void *user)
{
    setenv("KILN_DUMP", "kernels,llvm", 1);
    setenv("KILN_DUMP_DIR", dir, 1);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit(name, body, n_in, n_out, user, &o);
    unsetenv("KILN_DUMP");
    unsetenv("KILN_DUMP_DIR");
    return f;
}

/* The file ending in suffix that a compile dumped into dir, which goes; the
 * caller frees it. */
static char *take_dumped(const char *dir, const char *suffix)
{
    char *text = read_dumped(dir, suffix), cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_msg(text != NULL, "%s has no *%s", dir, suffix);
    return text;
}

/* The first kernel's text when body is compiled for specs on the host,
 * never run; the caller frees it. */
static char *precompiled_kernel(const char *name, kiln_body body, int n_in, void *user, const kiln_spec *specs)
{
    char dir[] = "/tmp/kiln-llvm-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    kiln_fn *f = jit_dumping(dir, name, body, n_in, 1, user);
    ck_assert_msg(kiln_fn_precompile(f, specs, "host") == 0, "%s", kiln_last_error());
    kiln_fn_free(f);
    return take_dumped(dir, "kernel-0.txt");
}

/* What compiling workload name dumps into the file ending in suffix. */
static char *dumped_by(const char *name, const char *suffix)
{
    char dir[] = "/tmp/kiln-llvm-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const workload *w = workload_find(name);
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL}, *out;
    workload_state state = {0};
    ck_assert_int_eq(w->setup(WORKLOAD_QUICK, in, &state), 0);
    kiln_fn *f = jit_dumping(dir, name, w->body, w->n_in, 1, &state);
    ck_assert_int_eq(kiln_call(f, in, &out), 0);
    kiln_release(out);
    kiln_fn_free(f);
    workload_free(w, in, &state);
    return take_dumped(dir, suffix);
}

START_TEST(test_gelu_loop_is_vectorized)
{
    char *after = dumped_by("gelu", "kernel-0.llvm-after.ll"), *kernel = dumped_by("gelu", "kernel-0.txt");
    ck_assert_msg(strstr(after, "x float>"), "the gelu loop has no vector of floats");
    ck_assert_ptr_nonnull(strstr(kernel, "tanh"));
    free(after);
    free(kernel);
}
END_TEST

/* Softmax stores e in its sum's pass and divides in place after: one exp per element. */
START_TEST(test_softmax_computes_exp_once)
{
    char *kernel = dumped_by("softmax", "kernel-0.txt");
    ck_assert_msg(strstr(kernel, " in r1\n"), "softmax's store is not in its sum's pass:\n%s", kernel);
    free(kernel);
}
END_TEST

/* exp(max x - x): its exponent is at least 0, past exp's range here. */
static int exp_from_max_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_exp(kiln_sub(kiln_max(in[0], 1, true), in[0]));
    return out[0] ? 0 : -1;
}

/* The exp of x - max x, at most 0 or NaN, is compiled without exp's clamp
 * at 89 (math_emit_exp_nonpositive); exp(max x - x), which passes 89 and
 * must give inf there, keeps it. */
START_TEST(test_exp_unclamped_only_below_row_max)
{
    char *softmax = dumped_by("softmax", "kernel-0.llvm-before.ll");
    ck_assert_msg(!strstr(softmax, "8.900000e+01"), "softmax's exp clamps its exponent at 89");
    free(softmax);
    kiln_scope_begin();
    const float v[2][4] = {{0, -100, 50, -0.5f}, {NAN, 1, 2, 3}};
    kiln_tensor *x = kiln_from_data(KILN_F32, 2, (int64_t[]){2, 4}, v), *got = NULL;
    char dir[] = "/tmp/kiln-llvm-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    kiln_fn *f = jit_dumping(dir, "exp_from_max", exp_from_max_body, 1, 1, NULL);
    ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
    char *ir = take_dumped(dir, "kernel-0.llvm-before.ll");
    ck_assert_msg(strstr(ir, "8.900000e+01"), "exp(max x - x) lost its clamp at 89");
    free(ir);
    kiln_tensor *want = NULL;
    ck_assert_int_eq(exp_from_max_body(&x, &want, NULL), 0);
    assert_close(got, want, 1e-6, 0, "exp(max x - x)");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* relu(a @ b + bias), plus r where user is non-NULL: a residual, as a
 * ResNet block's last convolution adds. */
static int product_epilogue_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *y = kiln_add(kiln_matmul(in[0], in[1]), in[2]);
    out[0] = kiln_relu(user ? kiln_add(y, in[3]) : y);
    return out[0] ? 0 : -1;
}

/* How many prefetches for reading (rw 0) or writing (rw 1) the function
 * whose name ends in suffix issues in the LLVM IR ir; 0 when there is no
 * such function. */
static int prefetches_in(const char *ir, const char *suffix, int rw)
{
    char define[128], call[64];
    snprintf(define, sizeof define, "%s(", suffix);
    snprintf(call, sizeof call, "i32 %d, i32 3, i32 1)", rw);
    const char *at = strstr(ir, define);
    if (!at)
        return 0;
    const char *end = strstr(at, "\n}\n");
    int n = 0;
    for (const char *p = strstr(at, call); p && p < end; p = strstr(p + 1, call))
        n++;
    return n;
}

/* The epilogue's prefetches, in its entry or its body where that stayed
 * apart. */
static int epilogue_prefetches(const char *ir, int rw)
{
    return prefetches_in(ir, ".epilogue_prefetch", rw) + prefetches_in(ir, ".epilogue_prefetch.body", rw);
}

/* The micro-kernel asks for the lines its epilogue will read and write
 * before its k loop (a residual read from memory would stall each tile):
 * the residual's and the output's, not a bias that every row shares. */
START_TEST(test_product_epilogue_prefetches_what_it_moves)
{
    kiln_scope_begin();
    kiln_tensor *in[4] = {kiln_randn(2, (int64_t[]){40, 24}, 1), kiln_randn(2, (int64_t[]){24, 72}, 2),
                          kiln_randn(1, (int64_t[]){72}, 3), kiln_randn(2, (int64_t[]){40, 72}, 4)};
    for (int residual = 0; residual < 2; residual++) {
        char dir[] = "/tmp/kiln-llvm-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        void *user = residual ? in : NULL;
        kiln_fn *f = jit_dumping(dir, "product_epilogue", product_epilogue_body, residual ? 4 : 3, 1, user);
        kiln_tensor *got = NULL, *want = NULL;
        ck_assert_msg(kiln_call(f, in, &got) == 0, "%s", kiln_last_error());
        char *ir = take_dumped(dir, "kernel-0.llvm-after.ll");
        ck_assert_msg(strstr(ir, ".epilogue_prefetch(ptr %tile"), "the kernel does not prefetch for its epilogue");
        int reads = epilogue_prefetches(ir, 0), writes = epilogue_prefetches(ir, 1);
        ck_assert_msg(residual ? reads > 0 : reads == 0, "residual %d: %d prefetches for reading", residual, reads);
        ck_assert_msg(writes > 0, "residual %d: no prefetch of the output", residual);
        free(ir);
        ck_assert_int_eq(product_epilogue_body(in, &want, user), 0);
        assert_close(got, want, 1e-5, 1e-5, "relu(a @ b + bias [+ r])");
        kiln_fn_free(f);
    }
    kiln_scope_end();
}
END_TEST

/* softmax over the last axis of in[0], or of its transpose where user is
 * non-NULL. */
static int softmax_rows_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_softmax(user ? kiln_transpose(in[0], 0, 1) : in[0], -1);
    return out[0] ? 0 : -1;
}

static int occurrences(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* Softmax's loop of exponentials prefetches the lines of the next row that
 * its max will read (a pass of their own left the core idle on memory), in
 * blocks that the vectorizer still widens; a transposed input (a row's
 * elements 4 apart) and rows past 64 KiB (the next row's lines would be
 * evicted before its max reads them) prefetch none. Rows of 1000: a last
 * block of 232. Under valgrind, where a compile takes seconds, rows of 1000
 * alone. */
START_TEST(test_softmax_prefetches_the_next_row)
{
    static const struct {
        int64_t cols;
        bool transposed;
        bool prefetches;
    } cases[] = {{1000, false, true}, {1000, true, false}, {16384, false, true}, {16385, false, false}};
    kiln_scope_begin();
    for (size_t c = 0; c < (UNDER_VALGRIND() ? 1 : sizeof cases / sizeof *cases); c++) {
        int64_t rows_cols[2] = {4, cases[c].cols}, cols_rows[2] = {cases[c].cols, 4};
        kiln_tensor *x = kiln_randn(2, cases[c].transposed ? cols_rows : rows_cols, 1);
        char dir[] = "/tmp/kiln-llvm-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        void *user = cases[c].transposed ? x : NULL;
        kiln_fn *f = jit_dumping(dir, "softmax_rows", softmax_rows_body, 1, 1, user);
        kiln_tensor *got = NULL, *want = NULL;
        ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
        char *kernel = read_dumped(dir, "kernel-0.txt"), *ir = take_dumped(dir, "kernel-0.llvm-after.ll");
        ck_assert_msg(kernel && strstr(kernel, "r0 = max") && strstr(kernel, "r1 = sum"), "not one row kernel");
        int reads = occurrences(ir, "i32 0, i32 3, i32 1)");
        bool vectors = strstr(ir, "@llvm.vector.reduce.fadd") != NULL; /* the sum's loop widened */
        free(kernel);
        free(ir);
        ck_assert_msg(cases[c].prefetches ? reads >= 16 && vectors : reads == 0,
                      "rows of %lld%s: %d prefetches (want %s), %s widened sum", (long long)cases[c].cols,
                      cases[c].transposed ? " (elements 4 apart)" : "", reads, cases[c].prefetches ? "a block's 16" : "none",
                      vectors ? "a" : "no");
        ck_assert_int_eq(softmax_rows_body(&x, &want, user), 0);
        assert_close(got, want, 1e-6, 1e-12, "softmax rows");
        kiln_fn_free(f);
    }
    kiln_scope_end();
}
END_TEST

/* -- Rows ------------------------------------------------------------------ */

/* Softmax against eager over rows of lengths about the vector widths (16
 * floats with AVX-512), 1024, 4096, 100000 and 1000003, on contiguous and
 * transposed inputs; under valgrind, where a compile takes seconds, 17 and
 * 100000. */
static const struct {
    int64_t cols;
    bool transposed;
} ROW_CASES[] = {
    {1, false},      {7, false},      {7, true},        {15, false},     {16, false},      {17, false},
    {17, true},      {1024, false},   {4096, false},    {4096, true},    {16384, false},   {16385, false},
    {16385, true},   {100000, false}, {100000, true},   {1000003, false}, {1000003, true},
};

START_TEST(test_softmax_rows_match_eager)
{
    int64_t cols = ROW_CASES[_i].cols, shape[2] = {3, cols}, flipped[2] = {cols, 3};
    if (UNDER_VALGRIND() && cols != 17 && cols != 100000)
        return;
    kiln_scope_begin();
    /* Rows 300 apart: a row's max taken from another row (the next row's
     * lines are prefetched in each row's sum) gives inf or 0 sums. */
    const float offsets[3] = {0, 300, -300};
    int64_t across[2] = {3, 1}, along[2] = {1, 3};
    kiln_tensor *x = ROW_CASES[_i].transposed
                         ? kiln_transpose(kiln_add(kiln_mul_scalar(kiln_randn(2, flipped, 41), 8),
                                                   kiln_from_data(KILN_F32, 2, along, offsets)),
                                          0, 1)
                         : kiln_add(kiln_mul_scalar(kiln_randn(2, shape, 41), 8),
                                    kiln_from_data(KILN_F32, 2, across, offsets));
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("softmax_rows", softmax_body, 1, 1, NULL, &o);
    kiln_tensor *got = NULL, *want = kiln_softmax(x, -1);
    ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
    assert_close(got, want, 1e-5, 1e-7, "softmax rows");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* A lone long row's softmax, log_softmax and log-sum-exp (cross entropy's)
 * take the online form (ir/long_rows.c) where a piece length divides the
 * row: 16384 (pieces of 4096), 16385 (of 3277, not a whole number of
 * vectors) and 100000 (of 4000), contiguous and transposed; 1000003, a
 * prime, does not. Against eager, in f32 and f64, rows of LONE_ROW_KINDS:
 * noise, a NaN, a +inf, all -inf, -inf for the first half (whole pieces
 * masked, as a causal row's), a max growing along the row, the max in the
 * last element, pieces 40 apart (a piece's sum scaled by exp(-40 k)).
 * Under valgrind, where a compile takes seconds, 100000 contiguous alone. */
enum { LONE_ROW_KINDS = 8 };
static const struct {
    int64_t cols;
    bool transposed, split;
} LONE_ROWS[] = {
    {16384, false, true},  {16385, false, true},     {16385, true, true},
    {100000, false, true}, {100000, true, true},     {1000003, false, false},
};

static void fill_lone_row(float *v, int64_t cols, int kind)
{
    uint64_t state = 11;
    for (int64_t i = 0; i < cols; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        float noise = (float)((double)(state >> 40) / (double)(1 << 24) * 16 - 8);
        v[i] = kind == 3 || (kind == 4 && i < cols / 2) ? -INFINITY
               : kind == 5                              ? (float)i * 0.001f
               : kind == 7                              ? noise + 40.f * (float)(i / 4000 % 5)
                                                        : noise;
    }
    v[cols * 3 / 10] = kind == 1 ? NAN : v[cols * 3 / 10];
    v[cols * 11 / 20] = kind == 2 ? INFINITY : v[cols * 11 / 20];
    v[cols - 1] = kind == 6 ? 1000 : v[cols - 1];
}

/* in[0] a row [1, cols], or its transpose [cols, 1] where user is non-NULL;
 * in[1] its label. */
static int lone_row_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *x = user ? kiln_transpose(in[0], 0, 1) : in[0];
    out[0] = kiln_softmax(x, -1);
    out[1] = kiln_log_softmax(x, -1);
    out[2] = kiln_cross_entropy(x, in[1]);
    return out[0] && out[1] && out[2] ? 0 : -1;
}

START_TEST(test_lone_long_rows_match_eager)
{
    int64_t cols = LONE_ROWS[_i].cols, shape[2] = {1, cols}, flipped[2] = {cols, 1};
    bool transposed = LONE_ROWS[_i].transposed;
    if (UNDER_VALGRIND() && (cols != 100000 || transposed))
        return;
    float *v = malloc(sizeof(float) * (size_t)cols);
    ck_assert_ptr_nonnull(v);
    for (int d = 0; d < 2; d++) {
        kiln_scope_begin();
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit("lone_row", lone_row_body, 2, 3, transposed ? v : NULL, &o);
        int64_t label = cols / 3;
        for (int kind = 0; kind < (UNDER_VALGRIND() ? 1 : LONE_ROW_KINDS); kind++) {
            fill_lone_row(v, cols, kind);
            kiln_tensor *in[2] = {kiln_cast(kiln_from_data(KILN_F32, 2, transposed ? flipped : shape, v),
                                            d ? KILN_F64 : KILN_F32),
                                  kiln_from_data(KILN_I64, 1, (int64_t[]){1}, &label)};
            kiln_tensor *got[3] = {NULL}, *want[3] = {NULL};
            ck_assert_msg(kiln_call(f, in, got) == 0, "%s", kiln_last_error());
            ck_assert_int_eq(lone_row_body(in, want, transposed ? v : NULL), 0);
            char what[96];
            snprintf(what, sizeof what, "a lone row of %lld%s, kind %d, %s: softmax", (long long)cols,
                     transposed ? " (transposed)" : "", kind, d ? "f64" : "f32");
            assert_close(got[0], want[0], 4e-5, 1e-12, what);
            memcpy(strstr(what, "softmax"), "log_softmax", sizeof "log_softmax");
            assert_close(got[1], want[1], 1e-5, 1e-5, what);
            memcpy(strstr(what, "log_softmax"), "cross_entropy", sizeof "cross_entropy");
            assert_close(got[2], want[2], 1e-5, 1e-5, what);
        }
        char *graph = kiln_fn_graph_text(f);
        ck_assert_ptr_nonnull(graph);
        /* split, the pieces' maxima and their max, the row's max gone: the
         * three forms share one online form */
        int maxima = occurrences(graph, " = max ");
        ck_assert_msg(maxima == (LONE_ROWS[_i].split ? 2 : 1), "a row of %lld%s: %d maxima, want %s:\n%s",
                      (long long)cols, transposed ? " (transposed)" : "", maxima,
                      LONE_ROWS[_i].split ? "2, in pieces" : "1, not split", graph);
        free(graph);
        kiln_fn_free(f);
        kiln_scope_end();
    }
    free(v);
}
END_TEST

/* A row sum s of in[0] [4, 1000] that a kernel over other rows ([3, 4])
 * reads through two branches, transposed: rsqrt(s) and log(s) (user NULL),
 * or u = rsqrt(s) alone and from it log(u) and 2u. */
static int two_branches_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *s = kiln_sum(in[0], -1, true), *u = kiln_rsqrt(s);
    kiln_tensor *a = user ? kiln_log(u) : u, *b = user ? kiln_mul_scalar(u, 2) : kiln_log(s);
    out[0] = kiln_add(kiln_mul(in[1], kiln_transpose(a, 0, 1)), kiln_transpose(b, 0, 1));
    return out[0] ? 0 : -1;
}

/* lower.c's row epilogues never compute one reduction in two kernels: a
 * reduction read by two nodes is stored itself (two kernels, as before row
 * epilogues: the sum, and the consumer computing both branches), and one
 * whose single reader feeds two branches is stored once an epilogue took it
 * (the sum, the first branch's epilogue over it, the consumer). */
START_TEST(test_reduction_read_through_two_branches_is_computed_once)
{
    kiln_scope_begin();
    kiln_tensor *in[2] = {kiln_add_scalar(kiln_abs(kiln_randn(2, (int64_t[]){4, 1000}, 3)), 1),
                          kiln_randn(2, (int64_t[]){3, 4}, 4)};
    for (int branch_above = 0; branch_above < 2; branch_above++) {
        char dir[] = "/tmp/kiln-llvm-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        void *user = branch_above ? in : NULL;
        kiln_fn *f = jit_dumping(dir, "two_branches", two_branches_body, 2, 1, user);
        kiln_tensor *got = NULL, *want = NULL;
        ck_assert_msg(kiln_call(f, in, &got) == 0, "%s", kiln_last_error());
        ck_assert_int_eq(two_branches_body(in, &want, user), 0);
        assert_close(got, want, 1e-5, 1e-6, "two branches of a row sum");
        int sums = 0;
        DIR *d = opendir(dir);
        for (char *kernel; (kernel = next_dumped(d, dir, ".txt"));) {
            sums += strstr(kernel, " = sum ") != NULL;
            free(kernel);
        }
        closedir(d);
        free(take_dumped(dir, "kernel-0.txt"));
        ck_assert_msg(sums == 1 && kernels_of(f) == 2 + branch_above, "%s: %d kernels summing, %lld in all",
                      branch_above ? "one reader, two branches above it" : "two readers", sums,
                      (long long)kernels_of(f));
        kiln_fn_free(f);
    }
    kiln_scope_end();
}
END_TEST

static int norms_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_layer_norm(in[0], in[1], in[2], 1e-5);
    out[1] = kiln_rms_norm(in[0], in[1], 1e-6);
    return out[0] && out[1] ? 0 : -1;
}

/* Layer and RMS norms against eager over ROW_CASES' rows up to 100000, in
 * f32 and f64: rows 1e4 or more apart and from zero, of noise about 1 (a
 * mean taken from another row is off by 1e4; one summed in f32 loses the
 * noise to cancellation). */
START_TEST(test_norm_rows_match_eager)
{
    enum { ROWS = 5 };
    int64_t cols = ROW_CASES[_i].cols, shape[2] = {ROWS, cols}, flipped[2] = {cols, ROWS};
    if (cols > 100000 || (UNDER_VALGRIND() && cols != 17 && cols != 100000))
        return;
    kiln_scope_begin();
    const float offsets[ROWS] = {1e4f, -1e4f, 3e4f, -2e4f, 1.5e4f};
    int64_t across[2] = {ROWS, 1}, along[2] = {1, ROWS};
    kiln_tensor *x = ROW_CASES[_i].transposed
                         ? kiln_transpose(kiln_add(kiln_randn(2, flipped, 43),
                                                   kiln_from_data(KILN_F32, 2, along, offsets)),
                                          0, 1)
                         : kiln_add(kiln_randn(2, shape, 43), kiln_from_data(KILN_F32, 2, across, offsets));
    for (int d = 0; d < 2; d++) {
        kiln_dtype dt = d ? KILN_F64 : KILN_F32;
        kiln_tensor *in[3] = {kiln_cast(x, dt), kiln_cast(kiln_randn(1, &cols, 44), dt),
                              kiln_cast(kiln_randn(1, &cols, 45), dt)};
        kiln_jit_options o = llvm();
        kiln_fn *f = kiln_jit("norm_rows", norms_body, 3, 2, NULL, &o);
        kiln_tensor *got[2] = {NULL, NULL}, *want[2] = {NULL, NULL};
        ck_assert_int_eq(norms_body(in, want, NULL), 0);
        ck_assert_msg(kiln_call(f, in, got) == 0, "%s", kiln_last_error());
        assert_close(got[0], want[0], 1e-5, 1e-5, "layer norm rows");
        assert_close(got[1], want[1], 1e-5, 1e-7, "rms norm rows");
        kiln_fn_free(f);
    }
    kiln_scope_end();
}
END_TEST

/* Softmax rows as eager gives them: a NaN, a +inf, all -inf, -inf for half
 * the row before finite values, a max that grows all along the row, and one
 * in its last element (a row reduced in parts, as an online max and sum
 * would, gets some of these wrong); rows of 4096, whose exponentials its
 * store pass rewrites from cache, and of 16385, in f32 and f64. Not under
 * valgrind, where its compile takes seconds. */
START_TEST(test_softmax_special_rows)
{
    enum { ROWS = 6 };
    const int64_t cols = _i / 2 ? 16385 : 4096;
    if (UNDER_VALGRIND())
        return;
    float *v = malloc(sizeof(float) * ROWS * (size_t)cols);
    ck_assert_ptr_nonnull(v);
    uint64_t state = 7;
    for (int64_t i = 0; i < ROWS * cols; i++) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        v[i] = (float)((double)(state >> 40) / (double)(1 << 24) * 16 - 8);
    }
    v[0 * cols + cols * 3 / 10] = NAN;
    v[1 * cols + cols * 11 / 20] = INFINITY;
    for (int64_t c = 0; c < cols; c++) {
        v[2 * cols + c] = -INFINITY;
        if (c < cols / 2)
            v[3 * cols + c] = -INFINITY;
        v[4 * cols + c] = (float)c * 0.01f;
    }
    v[5 * cols + cols - 1] = 1000;
    kiln_scope_begin();
    int64_t shape[2] = {ROWS, cols};
    kiln_tensor *x = kiln_cast(kiln_from_data(KILN_F32, 2, shape, v), _i % 2 ? KILN_F64 : KILN_F32);
    free(v);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("softmax_rows", softmax_body, 1, 1, NULL, &o);
    kiln_tensor *got = NULL, *want = kiln_softmax(x, -1);
    ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
    assert_close(got, want, 1e-5, 1e-7, "special softmax rows");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* -- Products with their epilogue ------------------------------------------ */

typedef struct {
    const char *name;
    int a_ndim, b_ndim;
    int64_t a_shape[3], b_shape[3];
    bool a_transposed; /* a is made [.., k, m] and transposed */
    bool late_input;   /* the epilogue also reads a mean computed after the product */
} product_case;

static const product_case PRODUCT_CASES[] = {
    {"matrix", 2, 2, {600, 20}, {20, 130}, false, false},
    {"rows not a tile multiple", 2, 2, {555, 7}, {7, 301}, false, false},
    {"batch folded into rows", 3, 2, {3, 200, 20}, {20, 130}, false, false},
    {"batch of products", 3, 3, {3, 200, 20}, {3, 20, 130}, false, false},
    {"transposed a", 2, 2, {600, 20}, {20, 130}, true, false},
    {"epilogue reads a later value", 2, 2, {600, 20}, {20, 130}, false, true},
    {"long inner dimension", 2, 2, {60, 700}, {700, 130}, false, false},
};

static int linear_gelu(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const product_case *c = user;
    kiln_tensor *a = c->a_transposed ? kiln_transpose(in[0], -1, -2) : in[0];
    kiln_tensor *y = kiln_add(kiln_matmul(a, in[1]), in[2]);
    if (c->late_input)
        y = kiln_sub(y, kiln_mean(kiln_mul(in[0], in[0]), -1, true));
    out[0] = kiln_gelu(y);
    return out[0] ? 0 : -1;
}

/* Each product is computed inside its bias-and-gelu kernel (one kernel, two
 * with the mean), never in blocks, and gives what eager gives. */
START_TEST(test_products_fused_match_eager)
{
    const product_case *c = &PRODUCT_CASES[_i];
    int64_t a_shape[3];
    memcpy(a_shape, c->a_shape, sizeof a_shape);
    if (c->a_transposed) {
        a_shape[c->a_ndim - 1] = c->a_shape[c->a_ndim - 2];
        a_shape[c->a_ndim - 2] = c->a_shape[c->a_ndim - 1];
    }
    int64_t n = c->b_shape[c->b_ndim - 1];
    kiln_tensor *in[3] = {kiln_randn(c->a_ndim, a_shape, 1), kiln_mul_scalar(kiln_randn(c->b_ndim, c->b_shape, 2), 0.3),
                          kiln_randn(1, &n, 3)};
    kiln_tensor *want = NULL, *got = NULL;
    ck_assert_int_eq(linear_gelu(in, &want, (void *)c), 0);
    setenv("KILN_PRODUCT_BLOCK_BYTES", "65536", 1);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit(c->name, linear_gelu, 3, 1, (void *)c, &o);
    ck_assert_msg(kiln_call(f, in, &got) == 0, "%s: %s", c->name, kiln_last_error());
    unsetenv("KILN_PRODUCT_BLOCK_BYTES");
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    ck_assert_msg(s.products_in_blocks == 0 && s.kernels == 1 + c->late_input, "%s: %d products in blocks, %d kernels",
                  c->name, s.products_in_blocks, s.kernels);
    assert_close(got, want, 2e-5, 2e-5, c->name);
    kiln_fn_free(f);
}
END_TEST

/* gelu(a @ b + f(c) @ d + bias), f exp or nothing (user): two products
 * into one epilogue. */
static int two_products(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *c = user ? kiln_exp(in[2]) : in[2];
    out[0] = kiln_gelu(kiln_add(kiln_add(kiln_matmul(in[0], in[1]), kiln_matmul(c, in[3])), in[4]));
    return out[0] ? 0 : -1;
}

/* The epilogue computes one product; the other is a kernel of its own,
 * compiled (its exp computed while its left operand is packed), not run
 * eagerly: two kernels, both from the code generator, and what eager gives. */
START_TEST(test_two_products_compiled)
{
    int64_t n = 130;
    kiln_tensor *in[5] = {kiln_randn(2, (int64_t[]){600, 20}, 1),
                          kiln_mul_scalar(kiln_randn(2, (int64_t[]){20, 130}, 2), 0.3),
                          kiln_mul_scalar(kiln_randn(2, (int64_t[]){600, 30}, 3), 0.3),
                          kiln_mul_scalar(kiln_randn(2, (int64_t[]){30, 130}, 4), 0.3), kiln_randn(1, &n, 5)};
    void *exp_left = _i ? (void *)1 : NULL;
    kiln_tensor *want = NULL, *got = NULL;
    ck_assert_int_eq(two_products(in, &want, exp_left), 0);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("two products", two_products, 5, 1, exp_left, &o);
    ck_assert_msg(kiln_call(f, in, &got) == 0, "%s", kiln_last_error());
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    ck_assert_msg(s.kernels == 2 && s.kernels_compiled + s.kernels_from_disk + s.kernels_shared == 2,
                  "%d steps, %lld of them kernels", s.kernels,
                  (long long)(s.kernels_compiled + s.kernels_from_disk + s.kernels_shared));
    assert_close(got, want, 2e-5, 2e-5, _i ? "exp(c) @ d beside a @ b" : "c @ d beside a @ b");
    kiln_fn_free(f);
}
END_TEST

/* -- Attention in one kernel -------------------------------------------------- */

typedef struct {
    const char *name;
    int64_t heads, seq, keys, dim; /* keys 0: seq */
    bool causal, f64;
    bool mask_input; /* the mask is the body's fourth input, not made in it */
} attention_case;

/* Sequences of 1, 7, 256 and 1000 (1000 crosses blocks of every size and
 * ends inside one), heads 1 and 8, dims that are no multiple of a tile; one
 * query against 9 keys, as decoding a token does (one against one key is
 * v itself, and its one-column softmax no row kernel: not fused). */
static const attention_case ATTENTION_CASES[] = {
    {"one query", 1, 1, 9, 16, false, false, false},
    {"one query, causal", 8, 1, 9, 16, true, false, false},
    {"seven, causal", 8, 7, 0, 5, true, false, false},
    {"seven, f64", 1, 7, 0, 33, false, true, false},
    {"256, eight heads", 8, 256, 0, 64, false, false, false},
    {"256, causal, f64", 1, 256, 0, 17, true, true, false},
    {"256, masked by an input", 8, 256, 0, 16, true, false, true},
    {"1000, causal", 1, 1000, 0, 64, true, false, false},
    {"1000, eight heads", 8, 1000, 0, 24, false, false, false},
};

static kiln_tensor *causal_mask(const attention_case *c)
{
    int64_t keys = c->keys ? c->keys : c->seq;
    return kiln_triu(kiln_ones(KILN_BOOL, 2, (int64_t[]){c->seq, keys}), 1);
}

static int causal_mask_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)in;
    out[0] = causal_mask(user);
    return out[0] ? 0 : -1;
}

/* softmax(q @ kᵀ / √d [masked]) @ v, as bench/models.c writes it. */
static int attention_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const attention_case *c = user;
    kiln_tensor *scores = kiln_mul_scalar(kiln_matmul(in[0], kiln_transpose(in[1], -2, -1)), 1 / sqrt((double)c->dim));
    if (c->causal)
        scores = kiln_masked_fill(scores, c->mask_input ? in[3] : causal_mask(c), -INFINITY);
    out[0] = kiln_matmul(kiln_softmax(scores, -1), in[2]);
    return out[0] ? 0 : -1;
}

/* Attention runs as one kernel (with a mask made in the body, the mask's
 * kernels beside it) and gives what the unfused ops give eagerly. */
START_TEST(test_attention_fused_matches_eager)
{
    const attention_case *c = &ATTENTION_CASES[_i];
    if ((SANITIZED && c->seq > 256) || (UNDER_VALGRIND() && c->seq > 7))
        return; /* memory checks: the small cases take every path but the long rows' blocks */
    int64_t keys = c->keys ? c->keys : c->seq;
    int64_t shape[2][4] = {{2, c->heads, c->seq, c->dim}, {2, c->heads, keys, c->dim}}, square[2] = {c->seq, keys};
    kiln_tensor *in[4];
    for (int i = 0; i < 3; i++) {
        in[i] = kiln_randn(4, shape[i > 0], 7 + (uint64_t)i);
        if (c->f64)
            in[i] = kiln_cast(in[i], KILN_F64);
    }
    in[3] = kiln_gt(kiln_rand(2, square, 11), kiln_scalar(0.7)); /* some rows masked but for few */
    kiln_tensor *want = NULL, *got = NULL;
    ck_assert_int_eq(attention_body(in, &want, (void *)c), 0);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("attention", attention_body, 3 + c->mask_input, 1, (void *)c, &o);
    ck_assert_msg(kiln_call(f, in, &got) == 0, "%s: %s", c->name, kiln_last_error());
    /* Unfused: the two products and the softmax. A mask made in the body
     * takes the kernels it takes alone, but its last (its where), which
     * attention's scores compute. */
    int64_t kernels = 1;
    if (c->causal && !c->mask_input) {
        kiln_fn *mask = kiln_jit("mask", causal_mask_body, 1, 1, (void *)c, &o);
        kiln_tensor *made = NULL;
        ck_assert_int_eq(kiln_call(mask, in, &made), 0);
        kernels = kernels_of(mask);
        kiln_release(made);
        kiln_fn_free(mask);
    }
    ck_assert_msg(kernels_of(f) == kernels, "%s: %lld kernels, not %lld", c->name, (long long)kernels_of(f),
                  (long long)kernels);
    assert_close(got, want, c->f64 ? 1e-12 : 1e-5, c->f64 ? 1e-12 : 1e-5, c->name);
    kiln_fn_free(f);
}
END_TEST

/* x with element at (counted row-major) made NaN. */
static kiln_tensor *with_nan(kiln_tensor *x, int64_t at)
{
    int64_t n = kiln_numel(x);
    float *data = malloc((size_t)n * sizeof *data);
    ck_assert_ptr_nonnull(data);
    ck_assert_int_eq(kiln_copy_to_host(x, data, (size_t)n * sizeof *data), 0);
    data[at] = NAN;
    kiln_tensor *t = kiln_from_data(KILN_F32, kiln_ndim(x), kiln_shape(x), data);
    free(data);
    return t;
}

/* A NaN score makes its row's softmax NaN, unfused: the fused row maximum
 * keeps it too (a NaN in q spoils its row, one in k every row of its
 * head), causal or not, rather than taking the other scores' maximum. */
START_TEST(test_attention_nan_scores_propagate)
{
    attention_case c = {"nan", 2, UNDER_VALGRIND() ? 7 : 40, 0, 16, _i == 1, false, true};
    int64_t shape[4] = {2, c.heads, c.seq, c.dim}, row = c.dim;
    kiln_tensor *in[4];
    for (int i = 0; i < 3; i++)
        in[i] = kiln_randn(4, shape, 7 + (uint64_t)i);
    in[3] = causal_mask(&c);
    in[0] = with_nan(in[0], 3 * row + 1);                               /* batch 0, head 0, query 3 */
    in[1] = with_nan(in[1], ((1 * c.heads + 1) * c.seq + 5) * row + 2); /* batch 1, head 1, key 5 */
    kiln_tensor *want = NULL, *got = NULL;
    ck_assert_int_eq(attention_body(in, &want, &c), 0);
    kiln_jit_options o = llvm();
    kiln_fn *f = kiln_jit("attention_nan", attention_body, 3 + c.causal, 1, &c, &o);
    ck_assert_msg(kiln_call(f, in, &got) == 0, "%s", kiln_last_error());
    ck_assert_int_eq(kernels_of(f), 1); /* fused */
    assert_close(got, want, 1e-5, 1e-5, c.causal ? "NaN scores, causal" : "NaN scores");
    kiln_fn_free(f);
}
END_TEST

/* A product of 32 MiB with its epilogue: the tiles are stored as the
 * product makes them, in cache, so its kernel does not stream, though it
 * writes 32 MiB. Compiled only, never run. */
START_TEST(test_fused_epilogues_do_not_stream)
{
    static const product_case c = {"large", 2, 2, {8192, 16}, {16, 1024}, false, false};
    kiln_spec specs[3] = {{.dtype = KILN_F32, .ndim = 2, .shape = {8192, 16}, .device = KILN_CPU},
                          {.dtype = KILN_F32, .ndim = 2, .shape = {16, 1024}, .device = KILN_CPU},
                          {.dtype = KILN_F32, .ndim = 1, .shape = {1024}, .device = KILN_CPU}};
    char *kernel = precompiled_kernel("large_linear_gelu", linear_gelu, 3, (void *)&c, specs);
    ck_assert_msg(strstr(kernel, "inside the kernel") && !strstr(kernel, "stream_stores"), "%s", kernel);
    free(kernel);
}
END_TEST

static int half_plus_one(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_add_scalar(kiln_mul_scalar(in[0], 0.5), 1);
    return out[0] ? 0 : -1;
}

/* Checks x * 0.5 + 1 through f against eager, exactly (x * 0.5 rounds
 * nowhere); under valgrind, 2^23 elements take minutes, so it is only
 * compiled there (llvm_codegen runs small streaming kernels under it). */
static void check_half_plus_one(kiln_fn *f, int64_t n)
{
    if (UNDER_VALGRIND()) {
        kiln_spec spec = {.dtype = KILN_F32, .ndim = 1, .shape = {n}, .device = KILN_CPU};
        ck_assert_msg(kiln_fn_precompile(f, &spec, "host") == 0, "%s", kiln_last_error());
        return;
    }
    kiln_tensor *x = kiln_randn(1, &n, 7), *want = NULL, *got = NULL;
    ck_assert_int_eq(half_plus_one(&x, &want, NULL), 0);
    ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
    assert_close(got, want, 0, 0, "x * 0.5 + 1");
}

/* Writing 32 MiB (the LLVM backend's stream_bytes) or more, a kernel streams
 * its stores around the caches; a little less, it does not. */
START_TEST(test_large_outputs_stream)
{
    static const int64_t sizes[] = {(int64_t)1 << 23, ((int64_t)1 << 23) - 8};
    for (int i = 0; i < 2; i++) {
        char dir[] = "/tmp/kiln-llvm-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        kiln_fn *f = jit_dumping(dir, "half_plus_one", half_plus_one, 1, 1, NULL);
        check_half_plus_one(f, sizes[i]);
        kiln_fn_free(f);
        char *kernel = read_dumped(dir, "kernel-0.txt"), *after = take_dumped(dir, "kernel-0.llvm-after.ll");
        bool large = i == 0;
        ck_assert_msg(kernel && (strstr(kernel, "stream_stores") != NULL) == large, "%lld elements:\n%s",
                      (long long)sizes[i], kernel);
        ck_assert_msg((strstr(after, "!nontemporal") != NULL) == large, "%lld elements: %s non-temporal stores",
                      (long long)sizes[i], large ? "no" : "");
        free(kernel);
        free(after);
    }
}
END_TEST

static int gelu_of(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_gelu(in[0]);
    return out[0] ? 0 : -1;
}

/* A kernel costly per element (its transcendentals: gelu's tanh) stores
 * plainly at 32 MiB, where x * 0.5 + 1 streams (test_large_outputs_stream).
 * Compiled only. */
START_TEST(test_costly_outputs_do_not_stream)
{
    kiln_spec spec = {.dtype = KILN_F32, .ndim = 1, .shape = {(int64_t)1 << 23}, .device = KILN_CPU};
    char *kernel = precompiled_kernel("gelu_of", gelu_of, 1, NULL, &spec);
    ck_assert_msg(strstr(kernel, "tanh") && !strstr(kernel, "stream_stores"), "%s", kernel);
    free(kernel);
}
END_TEST

static int softmax_rows(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_softmax(in[0], -1);
    return out[0] ? 0 : -1;
}

/* Softmax's sum's pass keeps its exponentials for the store pass: a 32 MiB
 * softmax streams its stores where its rows fit a kept row of scratch
 * (kx_kept_view: 4096 floats), from which the store pass writes the output
 * once, and not where they are longer (65536 floats), as non-temporal
 * stores would evict the exponentials kept in the output. Compiled only. */
START_TEST(test_softmax_streams_from_a_kept_row)
{
    const int64_t shapes[2][2] = {{2048, 4096}, {128, 65536}};
    for (int s = 0; s < 2; s++) {
        kiln_spec spec = {.dtype = KILN_F32, .ndim = 2, .shape = {shapes[s][0], shapes[s][1]}, .device = KILN_CPU};
        char *kernel = precompiled_kernel("softmax_rows", softmax_rows, 1, NULL, &spec);
        bool streams = strstr(kernel, "stream_stores") != NULL;
        ck_assert_msg(strstr(kernel, " in r1\n") && streams == (s == 0), "%s", kernel);
        free(kernel);
    }
}
END_TEST

/* A 32 MiB softmax, run: rows of 4096 and of 4100 (rows start unaligned),
 * each kept in a scratch row, the aligned ones streamed from it. Too long
 * under valgrind. */
START_TEST(test_large_softmax_matches_eager)
{
    if (UNDER_VALGRIND())
        return;
    const int64_t widths[] = {4096, 4100};
    static float offsets[2048]; /* rows 300 apart, so that another row's max is wrong */
    for (int r = 0; r < 2048; r++)
        offsets[r] = (float)(r % 3 - 1) * 300;
    for (int w = 0; w < 2; w++) {
        kiln_scope_begin();
        int64_t shape[2] = {2048, widths[w]}, across[2] = {2048, 1};
        kiln_tensor *x = kiln_add(kiln_mul_scalar(kiln_randn(2, shape, 43), 8),
                                  kiln_from_data(KILN_F32, 2, across, offsets));
        char dir[] = "/tmp/kiln-llvm-XXXXXX", kept[64];
        ck_assert_ptr_nonnull(mkdtemp(dir));
        kiln_fn *f = jit_dumping(dir, "softmax_rows", softmax_rows, 1, 1, NULL);
        kiln_tensor *got = NULL;
        ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
        char *ir = take_dumped(dir, "kernel-0.llvm-after.ll");
        snprintf(kept, sizeof kept, "alloca [%lld x float]", (long long)widths[w]);
        ck_assert_msg(strstr(ir, kept), "rows of %lld: no kept row", (long long)widths[w]);
        ck_assert_msg(w || strstr(ir, "!nontemporal"), "rows of 4096: no streamed store");
        free(ir);
        assert_close(got, kiln_softmax(x, -1), 1e-5, 1e-7, "large softmax");
        kiln_fn_free(f);
        kiln_scope_end();
    }
}
END_TEST

static int row_shares(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_div(in[0], kiln_sum(in[0], -1, true));
    return out[0] ? 0 : -1;
}

/* x / sum(x) over rows: the store pass multiplies by the reciprocal of the
 * sum where it is a normal number, and divides in rows where it is not (a
 * subnormal sum, whose reciprocal is inf; one past 2^126, whose reciprocal
 * is subnormal), and in rows of NaN, inf and zero. */
START_TEST(test_row_divisions_take_reciprocals_where_exact)
{
    enum { COLS = 20 };
    const float fills[] = {0.37f, 1e-40f, 1.5e37f, NAN, INFINITY, 0.0f};
    enum { ROWS = sizeof fills / sizeof *fills };
    float data[ROWS][COLS];
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            data[r][c] = r == 0 ? fills[0] * (float)(c + 1) : fills[r];
    data[3][0] = 1; /* a NaN row with numbers */
    kiln_scope_begin();
    int64_t shape[2] = {ROWS, COLS};
    kiln_tensor *x = kiln_from_data(KILN_F32, 2, shape, data), *got = NULL;
    char dir[] = "/tmp/kiln-llvm-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    kiln_fn *f = jit_dumping(dir, "row_shares", row_shares, 1, 1, NULL);
    ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s", kiln_last_error());
    char *ir = take_dumped(dir, "kernel-0.llvm-before.ll");
    ck_assert_msg(strstr(ir, "reciprocal:"), "no reciprocal loop:\n%s", ir);
    free(ir);
    assert_close(got, kiln_div(x, kiln_sum(x, -1, true)), 2e-7, 0, "x / sum(x)");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* Rows of 200 floats that hold a signed zero, a NaN (either sign) or
 * infinities at a lane of the vector loop or of its remainder (column 0,
 * 15, 17, 63, 130 or 199), or only -inf; their maxima and minima as
 * llvm.maximum and llvm.minimum give them: max(-0, +0) is +0 and min -0,
 * and a NaN anywhere makes the row's NaN; in f32 and in f64, at every
 * place a vectorized fold could lose it. */
enum { EXTREME_COLS = 200, EXTREME_KINDS = 6, EXTREME_AT = 6, EXTREME_ROWS = EXTREME_KINDS * EXTREME_AT };

static void extreme_rows(float (*data)[EXTREME_COLS], float *want_max, float *want_min)
{
    static const int at[EXTREME_AT] = {0, 15, 17, 63, 130, 199};
    for (int kind = 0; kind < EXTREME_KINDS; kind++)
        for (int a = 0; a < EXTREME_AT; a++) {
            int r = kind * EXTREME_AT + a;
            float *row = data[r];
            for (int j = 0; j < EXTREME_COLS; j++) /* -0s; +0s; numbers in (-1, 1); -infs */
                row[j] = kind == 0 ? -0.0f : kind == 1 ? 0.0f : kind == 5 ? -INFINITY : (float)((j * 37 % 101) - 50) / 64;
            float odd[EXTREME_KINDS] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY};
            row[at[a]] = odd[kind];
            want_max[r] = kind == 0 || kind == 1 ? 0.0f : kind == 4 ? INFINITY : kind == 5 ? -INFINITY : NAN;
            want_min[r] = kind == 0 || kind == 1 ? -0.0f : kind == 4 ? -50.0f / 64 : kind == 5 ? -INFINITY : NAN;
            if (kind == 4)
                row[(at[a] + 1) % EXTREME_COLS] = -INFINITY, want_min[r] = -INFINITY;
        }
}

static bool same_extreme(float got, float want)
{
    return isnan(want) ? isnan(got) : got == want && signbit(got) == signbit(want);
}

static float extreme_data[EXTREME_ROWS][EXTREME_COLS];

static kiln_tensor *extreme_input(float *want_max, float *want_min)
{
    extreme_rows(extreme_data, want_max, want_min);
    return kiln_from_data(KILN_F32, 2, (int64_t[]){EXTREME_ROWS, EXTREME_COLS}, extreme_data);
}

/* The rows' maxima and minima; with user, reduced in f64 (the rows widened,
 * the results narrowed, both exactly). */
static int row_max_min(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *x = user ? kiln_cast(in[0], KILN_F64) : in[0];
    out[0] = kiln_cast(kiln_max(x, -1, false), KILN_F32);
    out[1] = kiln_cast(kiln_min(x, -1, false), KILN_F32);
    return out[0] && out[1] ? 0 : -1;
}

START_TEST(test_row_max_min_signed_zeros_and_nans)
{
    float want_max[EXTREME_ROWS], want_min[EXTREME_ROWS], gmax[EXTREME_ROWS], gmin[EXTREME_ROWS];
    kiln_scope_begin();
    kiln_tensor *x = extreme_input(want_max, want_min), *got[2] = {NULL, NULL};
    kiln_fn *f = kiln_jit("row_max_min", row_max_min, 1, 2, _i ? &want_max : NULL, NULL);
    ck_assert_msg(kiln_call(f, &x, got) == 0, "%s", kiln_last_error());
    ck_assert_int_eq(kiln_copy_to_host(got[0], gmax, sizeof gmax), 0);
    ck_assert_int_eq(kiln_copy_to_host(got[1], gmin, sizeof gmin), 0);
    for (int r = 0; r < EXTREME_ROWS; r++)
        ck_assert_msg(same_extreme(gmax[r], want_max[r]) && same_extreme(gmin[r], want_min[r]),
                      "row %d: max %g want %g, min %g want %g", r, gmax[r], want_max[r], gmin[r], want_min[r]);
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* x - max x - the sum of y over the row: one kernel, whose sum's loop
 * prefetches the next row's x for its max (prefetches_next). With y zeros,
 * a row's max shows in every element, its NaN and its zero's sign, where
 * softmax's sum of exponentials would hide both. */
static int minus_max_minus_sum(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_sub(kiln_sub(in[0], kiln_max(in[0], -1, true)), kiln_sum(in[1], -1, true));
    return out[0] ? 0 : -1;
}

/* The same rows' maxima in a kernel whose sum prefetches the next row. */
START_TEST(test_row_max_beside_a_prefetching_sum_signed_zeros_and_nans)
{
    float want_max[EXTREME_ROWS], want_min[EXTREME_ROWS];
    static float got[EXTREME_ROWS][EXTREME_COLS];
    kiln_scope_begin();
    kiln_tensor *in[2] = {extreme_input(want_max, want_min), NULL}, *out = NULL;
    in[1] = kiln_zeros(KILN_F32, 2, kiln_shape(in[0]));
    char dir[] = "/tmp/kiln-llvm-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    kiln_fn *f = jit_dumping(dir, "minus_max_minus_sum", minus_max_minus_sum, 2, 1, NULL);
    ck_assert_msg(kiln_call(f, in, &out) == 0, "%s", kiln_last_error());
    char *kernel = take_dumped(dir, "kernel-0.txt");
    ck_assert_msg(strstr(kernel, "r0 = max") && strstr(kernel, "r1 = sum"), "not one row kernel:\n%s", kernel);
    free(kernel);
    ck_assert_int_eq(kiln_copy_to_host(out, got, sizeof got), 0);
    int r = 0, j = 0; /* the first element out, asserted once */
    while (r < EXTREME_ROWS && same_extreme(got[r][j], extreme_data[r][j] - want_max[r] - 0.0f))
        if (++j == EXTREME_COLS)
            r++, j = 0;
    ck_assert_msg(r == EXTREME_ROWS, "row %d, column %d: %g, max %g", r, j, r < EXTREME_ROWS ? got[r][j] : 0.0f,
                  r < EXTREME_ROWS ? want_max[r] : 0.0f);
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* -- Random programs around products ---------------------------------------- */

/* How many files in dir ending in suffix mention needle. */
static int dumps_mentioning(const char *dir, const char *suffix, const char *needle)
{
    DIR *d = opendir(dir);
    int found = 0;
    for (char *text; (text = next_dumped(d, dir, suffix)); free(text))
        found += strstr(text, needle) != NULL;
    if (d)
        closedir(d);
    return found;
}

/* Random float programs in which matmul is tried ten times as often as by
 * default: products with elementwise ops before and after them, which the
 * plan computes inside the product's kernel (epilogues) and while it packs
 * its left operand (prologues). Compiled, they match eager within 1e-4; and
 * the programs fuse some of each (about one in eight an epilogue, one in
 * sixty a prologue). Not under valgrind: a compile takes seconds there, and
 * the gemm suite runs the fused code's C paths under it. */
START_TEST(test_random_products_compiled_match_eager)
{
    if (UNDER_VALGRIND())
        return;
    int count = (int)(getenv("KILN_PROGEN_COUNT") ? atoi(getenv("KILN_PROGEN_COUNT")) : 120);
    /* The ops before floor: elementwise ops, reductions and movement enough
     * around products; the later ones would dilute them. */
    progen_options opt = {.dtypes = PROGEN_DTYPE_BIT(KILN_F32) | PROGEN_DTYPE_BIT(KILN_F64), .matmul_weight = 40,
                          .max_rank = 3, .max_dim = 16, .ops = PROGEN_OP_BIT(PROGEN_FLOOR) - 1};
    int epilogues = 0, prologues = 0;
    for (int s = 1; s <= count; s++) {
        kiln_scope_begin();
        progen_program *p = progen_new(7000 + (uint64_t)s, &opt);
        int n_in = progen_n_inputs(p), n_out = progen_n_outputs(p);
        kiln_tensor *in[16], *want[8] = {NULL}, *got[8] = {NULL};
        for (int i = 0; i < n_in; i++)
            in[i] = progen_make_input(p, i, (uint64_t)s * 37 + (uint64_t)i);
        ck_assert_int_eq(progen_run(p, in, want), 0);
        char dir[] = "/tmp/kiln-products-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        kiln_fn *f = jit_dumping(dir, "random", progen_body, n_in, n_out, p);
        int status = kiln_call(f, in, got);
        char *listing = status == 0 ? NULL : progen_describe(p);
        ck_assert_msg(status == 0, "seed %d: %s\n%s", s, kiln_last_error(), listing ? listing : "");
        for (int i = 0; i < n_out; i++) {
            char what[64];
            snprintf(what, sizeof what, "products seed %d out[%d]", s, i);
            assert_close(got[i], want[i], 1e-4, 1e-4, what);
        }
        epilogues += dumps_mentioning(dir, ".txt", "inside the kernel");
        prologues += dumps_mentioning(dir, ".txt", "prologue of the product's left operand");
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
        kiln_fn_free(f);
        progen_free(p);
        kiln_scope_end();
    }
    printf("llvm: %d random programs fused %d products with their epilogue, %d with a prologue\n", count, epilogues,
           prologues);
    ck_assert_msg(epilogues > 0 && prologues > 0, "%d epilogues and %d prologues fused", epilogues, prologues);
}
END_TEST

static Suite *llvm_suite(void)
{
    Suite *s = suite_create("llvm");
    TCase *ops = tcase_create("ops");
    tcase_add_checked_fixture(ops, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(ops, 120);
    tcase_add_loop_test(ops, test_ops_compiled_match_eager, 0, (int)(sizeof CASES / sizeof *CASES));
    tcase_add_test(ops, test_sums_keep_what_cancels);
    tcase_add_test(ops, test_kernels_with_too_many_inputs_split);
    tcase_add_test(ops, test_empty_slices_with_huge_steps);
    tcase_add_test(ops, test_large_outputs_stream);
    tcase_add_test(ops, test_costly_outputs_do_not_stream);
    tcase_add_test(ops, test_softmax_streams_from_a_kept_row);
    tcase_add_test(ops, test_large_softmax_matches_eager);
    tcase_add_test(ops, test_row_divisions_take_reciprocals_where_exact);
    tcase_add_loop_test(ops, test_row_max_min_signed_zeros_and_nans, 0, 2); /* f32, f64 */
    tcase_add_test(ops, test_row_max_beside_a_prefetching_sum_signed_zeros_and_nans);
    tcase_add_test(ops, test_fused_epilogues_do_not_stream);
    tcase_add_loop_test(ops, test_products_fused_match_eager, 0,
                        (int)(sizeof PRODUCT_CASES / sizeof *PRODUCT_CASES));
    tcase_add_loop_test(ops, test_two_products_compiled, 0, 2);
    tcase_add_loop_test(ops, test_attention_nan_scores_propagate, 0, 2);
    tcase_add_loop_test(ops, test_attention_fused_matches_eager, 0,
                        (int)(sizeof ATTENTION_CASES / sizeof *ATTENTION_CASES));
    suite_add_tcase(s, ops);
    TCase *wl = tcase_create("workloads");
    tcase_add_checked_fixture(wl, setup_unscoped, teardown_unscoped);
    tcase_set_timeout(wl, 300);
    tcase_add_loop_test(wl, test_workloads_compiled_match_eager, 0, workload_count);
    tcase_add_test(wl, test_workloads_fuse);
    tcase_add_test(wl, test_traced_mlp_and_attention_peak_below_eager);
    tcase_add_test(wl, test_softmax_f32_sums_stay_close);
    tcase_add_test(wl, test_f32_sums_only_where_they_hold);
    tcase_add_test(wl, test_epilogue_writes_in_place);
    tcase_add_test(wl, test_gelu_loop_is_vectorized);
    tcase_add_test(wl, test_exp_unclamped_only_below_row_max);
    tcase_add_test(wl, test_product_epilogue_prefetches_what_it_moves);
    tcase_add_test(wl, test_softmax_prefetches_the_next_row);
    tcase_add_test(wl, test_softmax_computes_exp_once);
    tcase_add_loop_test(wl, test_softmax_special_rows, 0, 4); /* 4096 and 16385 columns, f32 and f64 */
    tcase_add_loop_test(wl, test_softmax_rows_match_eager, 0, (int)(sizeof ROW_CASES / sizeof *ROW_CASES));
    tcase_add_loop_test(wl, test_norm_rows_match_eager, 0, (int)(sizeof ROW_CASES / sizeof *ROW_CASES));
    tcase_add_loop_test(wl, test_lone_long_rows_match_eager, 0, (int)(sizeof LONE_ROWS / sizeof *LONE_ROWS));
    tcase_add_test(wl, test_reduction_read_through_two_branches_is_computed_once);
    tcase_add_test(wl, test_calls_go_on_during_a_compile);
    tcase_add_test(wl, test_deep_chain_on_a_small_stack);
    suite_add_tcase(s, wl);
    TCase *random = tcase_create("random");
    tcase_add_checked_fixture(random, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(random, 600);
    tcase_add_test(random, test_random_programs_compiled_match_eager);
    tcase_add_test(random, test_random_products_compiled_match_eager);
    tcase_add_test(random, test_references_compiled_match_pytorch);
    tcase_add_test(random, test_compiles_from_several_threads);
    suite_add_tcase(s, random);
    return s;
}

KILN_TEST_MAIN(llvm_suite)
