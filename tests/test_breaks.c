/* Graph breaks: bodies that read traced values run as segments, a new path
 * traced per new value read; each call equals eager, and the body runs once
 * per distinct path. */
#include "test_common.h"

static int body_runs;

static int64_t stat_of(kiln_fn *f, size_t offset)
{
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    return *(const int64_t *)((const char *)&s + offset);
}
#define STAT(f, field) stat_of(f, offsetof(kiln_fn_stats_t, field))

/* Backends the tests run under: the interpreter and compiled kernels. */
static kiln_jit_options backend(int i)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = i == 0 ? KILN_BACKEND_INTERP : KILN_BACKEND_AUTO;
    return o;
}

/* f against its body run eagerly on x; f's body runs at most once. */
static void check_call(kiln_fn *f, kiln_body body, int n_out, kiln_tensor *const *in, const char *what)
{
    kiln_tensor *got[4], *want[4];
    ck_assert_msg(kiln_call(f, in, got) == 0, "%s: %s", what, kiln_last_error());
    int runs = body_runs;
    ck_assert_int_eq(body(in, want, NULL), 0);
    body_runs = runs;
    for (int k = 0; k < n_out; k++)
        assert_close(got[k], want[k], 1e-5, 1e-6, what);
}

/* -- One branch --------------------------------------------------------------- */

static int one_branch(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    body_runs++;
    kiln_tensor *h = kiln_tanh(kiln_mul_scalar(in[0], 2.0));
    kiln_tensor *positive = kiln_gt(kiln_mean(h, KILN_ALL, false), kiln_scalar(0));
    if (kiln_item(positive))
        out[0] = kiln_exp(h);
    else
        out[0] = kiln_neg(kiln_relu(in[0]));
    /* Values computed before the read, the value read among them, used after it. */
    out[1] = kiln_add(kiln_sum(h, -1, false), kiln_cast(positive, KILN_F32));
    return 0;
}

static kiln_tensor *filled(double v, int64_t n)
{
    kiln_tensor *x = kiln_arange(0, (double)n, 1, KILN_F32);
    return kiln_add_scalar(kiln_mul_scalar(x, 0.01), v);
}

START_TEST(test_one_branch)
{
    kiln_jit_options o = backend(_i);
    kiln_fn *f = kiln_jit("one_branch", one_branch, 1, 2, NULL, &o);
    body_runs = 0;
    double values[] = {1, -1, 2, -3, 0.5, -0.5};
    for (int i = 0; i < 6; i++) {
        kiln_tensor *x = filled(values[i], 8);
        check_call(f, one_branch, 2, &x, "one branch");
    }
    ck_assert_int_eq(body_runs, 2); /* once per branch */
    ck_assert_int_eq(STAT(f, traces), 2);
    ck_assert_int_eq(STAT(f, graph_breaks), 2);
    ck_assert_int_eq(STAT(f, segments), 3); /* the shared first segment is compiled twice, kept once */
    ck_assert_int_eq(STAT(f, eager_fallbacks), 0);
    kiln_fn_free(f);
}
END_TEST

/* -- Three branches, one after the other ------------------------------------- */

static int three_branches(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    body_runs++;
    kiln_tensor *x = in[0];
    for (int k = 0; k < 3; k++) {
        kiln_tensor *probe = kiln_slice(x, 0, k, k + 1, 1);
        if (kiln_item(kiln_gt(kiln_sum(probe, KILN_ALL, false), kiln_scalar(0))))
            x = kiln_add_scalar(kiln_mul_scalar(x, 0.5), (double)k);
        else
            x = kiln_sub_scalar(kiln_tanh(x), 1.0);
    }
    out[0] = x;
    return 0;
}

START_TEST(test_three_branches)
{
    kiln_jit_options o = backend(_i);
    kiln_fn *f = kiln_jit("three", three_branches, 1, 1, NULL, &o);
    body_runs = 0;
    /* Signs of the first three elements choose; later ones follow from them. */
    float signs[][3] = {{1, 1, 1}, {-1, 1, 1}, {1, -1, 1}, {1, 1, 1}, {-1, 1, 1}, {-1, -1, -1}};
    int paths = 0;
    for (int i = 0; i < 6; i++) {
        float data[4] = {signs[i][0] * 3, signs[i][1] * 5, signs[i][2] * 9, 0.25f};
        kiln_tensor *x = kiln_from_data(KILN_F32, 1, (int64_t[]){4}, data);
        int runs = body_runs;
        check_call(f, three_branches, 1, &x, "three branches");
        paths += body_runs > runs;
    }
    ck_assert_int_eq(body_runs, paths);
    ck_assert_int_lt(paths, 6); /* repeated inputs took a path already traced */
    ck_assert_int_eq(STAT(f, traces), paths);
    ck_assert_int_eq(STAT(f, graph_breaks), 3 * paths);
    kiln_fn_free(f);
}
END_TEST

/* -- A loop whose trip count is data ------------------------------------------ */

static int data_loop(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    body_runs++;
    int64_t n = (int64_t)kiln_item(kiln_sum(in[1], KILN_ALL, false));
    kiln_tensor *x = in[0];
    for (int64_t k = 0; k < n; k++)
        x = kiln_add_scalar(kiln_tanh(x), 0.1);
    out[0] = x;
    return 0;
}

START_TEST(test_loop_count_read_from_data)
{
    kiln_jit_options o = backend(_i);
    kiln_fn *f = kiln_jit("loop", data_loop, 2, 1, NULL, &o);
    body_runs = 0;
    int32_t counts[] = {3, 0, 5, 3, 0, 1};
    for (int i = 0; i < 6; i++) {
        kiln_tensor *in[2] = {filled(0.5, 16), kiln_full(KILN_I32, 1, (int64_t[]){1}, counts[i])};
        check_call(f, data_loop, 1, in, "a data-dependent loop");
    }
    ck_assert_int_eq(body_runs, 4); /* counts 3, 0, 5, 1 */
    kiln_fn_free(f);
}
END_TEST

/* -- A read only printed ------------------------------------------------------ */

static char printed[64];

static int prints_mean(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    body_runs++;
    kiln_tensor *h = kiln_mul(in[0], in[0]);
    snprintf(printed, sizeof printed, "mean %.3f", kiln_item(kiln_mean(h, KILN_ALL, false)));
    out[0] = kiln_sqrt(h);
    return 0;
}

/* The value read is the path's key: the same input runs without the body;
 * a new value traces again (the body prints it). */
START_TEST(test_a_read_only_printed)
{
    kiln_jit_options o = backend(_i);
    kiln_fn *f = kiln_jit("prints", prints_mean, 1, 1, NULL, &o);
    body_runs = 0;
    kiln_tensor *a = filled(1, 8), *b = filled(2, 8);
    check_call(f, prints_mean, 1, &a, "printed");
    ck_assert_str_eq(printed, "mean 1.072");
    check_call(f, prints_mean, 1, &a, "printed again");
    check_call(f, prints_mean, 1, &b, "another value");
    check_call(f, prints_mean, 1, &b, "that value again");
    ck_assert_int_eq(body_runs, 2);
    kiln_fn_free(f);
}
END_TEST

/* -- Reads into host memory, writebacks, symbolic sizes ------------------------ */

static kiln_tensor *total;

static int host_read_and_assign(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    body_runs++;
    kiln_assign(total, kiln_add(total, kiln_sum(in[0], KILN_ALL, false)));
    float first[2];
    if (kiln_copy_to_host(kiln_slice(in[0], 0, 0, 2, 1), first, sizeof first) < 0)
        return -1;
    kiln_tensor *t = kiln_mul_scalar(total, first[0] > first[1] ? 2.0 : -1.0); /* the assigned value, read */
    out[0] = kiln_add(in[0], t);
    return 0;
}

/* The assignment before the read is seen after it, and written once per call. */
START_TEST(test_host_reads_and_writebacks)
{
    total = kiln_zeros(KILN_F32, 0, NULL);
    kiln_jit_options o = backend(_i);
    kiln_fn *f = kiln_jit("host_read", host_read_and_assign, 1, 1, NULL, &o);
    body_runs = 0;
    double expect_total = 0;
    float rows[][3] = {{2, 1, 0}, {1, 2, 0}, {3, 1, 1}, {0, 5, 1}};
    for (int i = 0; i < 4; i++) {
        kiln_tensor *x = kiln_from_data(KILN_F32, 1, (int64_t[]){3}, rows[i]), *got;
        ck_assert_int_eq(kiln_call(f, &x, &got), 0);
        expect_total += rows[i][0] + rows[i][1] + rows[i][2];
        double scale = rows[i][0] > rows[i][1] ? 2.0 : -1.0;
        ck_assert_double_eq_tol(kiln_item(total), expect_total, 1e-9);
        float values[3];
        kiln_copy_to_host(got, values, sizeof values);
        for (int k = 0; k < 3; k++)
            ck_assert_double_eq_tol(values[k], rows[i][k] + scale * expect_total, 1e-5);
    }
    ck_assert_int_eq(body_runs, 4); /* the bytes read differ each time */
    kiln_fn_free(f);
    kiln_release(total);
}
END_TEST

static int batch_branch(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    body_runs++;
    kiln_tensor *s = kiln_softmax(in[0], -1);
    if (kiln_item(kiln_gt(kiln_max(in[0], KILN_ALL, false), kiln_scalar(1))))
        out[0] = kiln_mul(s, in[0]);
    else
        out[0] = kiln_sub(s, in[0]);
    return 0;
}

/* A symbolic batch through a branch: every segment serves every size. */
START_TEST(test_breaks_with_a_symbolic_batch)
{
    kiln_jit_options o = backend(_i);
    uint32_t dims[1] = {0x1};
    o.dynamic_dims = dims;
    kiln_fn *f = kiln_jit("batch_branch", batch_branch, 1, 1, NULL, &o);
    body_runs = 0;
    for (int64_t n = 2; n < 10; n++) {
        kiln_tensor *x = kiln_mul_scalar(kiln_randn(2, (int64_t[]){n, 5}, (uint64_t)n), n % 2 ? 3.0 : 0.1);
        check_call(f, batch_branch, 1, &x, "a branch over a symbolic batch");
    }
    ck_assert_int_eq(body_runs, 2);
    ck_assert_int_eq(STAT(f, symbolic), 1);
    kiln_fn_free(f);
}
END_TEST

/* Strict mode: a read is an error, as before breaks. */
START_TEST(test_strict_mode_still_fails)
{
    kiln_jit_options o = backend(_i);
    o.strict = true;
    kiln_fn *f = kiln_jit("strict_reads", one_branch, 1, 2, NULL, &o);
    kiln_tensor *x = filled(1, 4), *out[2] = {NULL, NULL};
    ck_assert_int_lt(kiln_call(f, &x, out), 0);
    ck_assert_kiln_error("kiln_call", "kiln_item", "data-dependent control flow");
    ck_assert_ptr_null(out[0]);
    ck_assert_int_eq(STAT(f, graph_breaks), 0);
    kiln_fn_free(f);
}
END_TEST

/* Precompiling has no data to read: a body that reads cannot be
 * precompiled, and says why. */
START_TEST(test_precompiling_past_a_read_fails)
{
    kiln_fn *f = kiln_jit("precompiled_reads", one_branch, 1, 2, NULL, NULL);
    kiln_spec spec = {.dtype = KILN_F32, .ndim = 1, .shape = {4}, .device = KILN_CPU};
    ck_assert_int_lt(kiln_fn_precompile(f, &spec, "host"), 0);
    ck_assert_kiln_error("kiln_item", "data-dependent");
    kiln_fn_free(f);
}
END_TEST

static Suite *breaks_suite(void)
{
    Suite *s = suite_create("breaks");
    TCase *tc = tcase_create("breaks");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_add_loop_test(tc, test_one_branch, 0, 2);
    tcase_add_loop_test(tc, test_three_branches, 0, 2);
    tcase_add_loop_test(tc, test_loop_count_read_from_data, 0, 2);
    tcase_add_loop_test(tc, test_a_read_only_printed, 0, 2);
    tcase_add_loop_test(tc, test_host_reads_and_writebacks, 0, 2);
    tcase_add_loop_test(tc, test_breaks_with_a_symbolic_batch, 0, 2);
    tcase_add_loop_test(tc, test_strict_mode_still_fails, 0, 2);
    tcase_add_test(tc, test_precompiling_past_a_read_fails);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(breaks_suite)
