/* KILN_COMPILE: one to eight inputs, its kiln_fn, and nothing of it alive at exit. */
#include <unistd.h>

#include "test_common.h"

static kiln_tensor *randn(int64_t rows, int64_t cols, uint64_t seed)
{
    return kiln_randn(2, (int64_t[]){rows, cols}, seed);
}

static kiln_tensor *gelu_plus(kiln_tensor *x, kiln_tensor *y)
{
    return kiln_add(kiln_gelu(x), y);
}
KILN_COMPILE(gelu_plus_compiled, gelu_plus, 2)

static kiln_tensor *one(kiln_tensor *a)
{
    return kiln_mul_scalar(a, 3);
}
KILN_COMPILE(one_compiled, one, 1)

/* a0 - a1 + a2 - ... over n >= 2 inputs: each counts, in its place. */
static kiln_tensor *alternating(int n, kiln_tensor *const *a)
{
    kiln_tensor *sum = a[0];
    for (int i = 1; i < n; i++)
        sum = i % 2 ? kiln_sub(sum, a[i]) : kiln_add(sum, a[i]);
    return sum;
}

static kiln_tensor *eight(kiln_tensor *a0, kiln_tensor *a1, kiln_tensor *a2, kiln_tensor *a3, kiln_tensor *a4,
                          kiln_tensor *a5, kiln_tensor *a6, kiln_tensor *a7)
{
    return alternating(8, (kiln_tensor *[]){a0, a1, a2, a3, a4, a5, a6, a7});
}
KILN_COMPILE(eight_compiled, eight, 8)

static kiln_tensor *seven(kiln_tensor *a0, kiln_tensor *a1, kiln_tensor *a2, kiln_tensor *a3, kiln_tensor *a4,
                          kiln_tensor *a5, kiln_tensor *a6)
{
    return alternating(7, (kiln_tensor *[]){a0, a1, a2, a3, a4, a5, a6});
}
KILN_COMPILE(seven_compiled, seven, 7)

START_TEST(test_compiled_matches_eager)
{
    kiln_tensor *x = randn(3, 5, 4), *y = kiln_randn(1, (int64_t[]){5}, 5);
    /* The default backend compiles: its tanh is within 6.5 ulp, eager's 3.5. */
    for (int i = 0; i < 3; i++)
        assert_close(gelu_plus_compiled(x, y), gelu_plus(x, y), 2e-6, 1e-6, "KILN_COMPILE");
    assert_close(one_compiled(x), one(x), 0, 0, "one input");
}
END_TEST

START_TEST(test_seven_and_eight_inputs)
{
    kiln_tensor *in[8];
    for (int i = 0; i < 8; i++)
        in[i] = randn(4, 3, 10 + (uint64_t)i);
    assert_close(eight_compiled(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7]),
                 eight(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7]), 1e-6, 1e-6, "eight inputs");
    assert_close(seven_compiled(in[0], in[1], in[2], in[3], in[4], in[5], in[6]),
                 seven(in[0], in[1], in[2], in[3], in[4], in[5], in[6]), 1e-6, 1e-6, "seven inputs");
}
END_TEST

START_TEST(test_fn_reaches_the_marked_function)
{
    kiln_fn *f = one_compiled_fn();
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_eq(one_compiled_fn(), f);
    kiln_fn_stats_t before, after;
    ck_assert_int_eq(kiln_fn_stats(f, &before), 0);
    /* A rank no call had before: under CK_FORK=no the earlier tests' shapes
     * already made both axes of the 2-d signature symbolic. */
    kiln_tensor *x = kiln_randn(3, (int64_t[]){2, 7, 2}, 1);
    ck_assert_ptr_nonnull(one_compiled(x));
    ck_assert_ptr_nonnull(one_compiled(x));
    ck_assert_int_eq(kiln_fn_stats(f, &after), 0); /* a new signature, traced once */
    ck_assert_int_eq(after.traces - before.traces, 1);
    ck_assert_int_eq(after.memory_hits - before.memory_hits, 1);
    kiln_spec spec = kiln_spec_of(kiln_randn(1, (int64_t[]){9}, 2));
    ck_assert_int_eq(kiln_fn_precompile(f, &spec, "host"), 0);
    ck_assert_int_eq(kiln_fn_stats(f, &before), 0);
    ck_assert_int_eq(before.traces - after.traces, 1);
}
END_TEST

START_TEST(test_failures_are_errors)
{
    ck_assert_ptr_null(one_compiled(NULL));
    ck_assert_kiln_error("kiln_call", "NULL");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_jit_slot(NULL, "f", NULL, 1));
    ck_assert_kiln_error("kiln_jit_slot", "slot");
}
END_TEST

/* Each test in a scope; what the marked functions keep (their plans'
 * constants) is counted at exit, not here. */
static void scope_setup(void)
{
    kiln_clear_error();
    kiln_scope_begin();
}

static Suite *marking_suite(void)
{
    Suite *s = suite_create("marking");
    TCase *tc = tcase_create("marking");
    tcase_add_checked_fixture(tc, scope_setup, kiln_scope_end);
    tcase_add_test(tc, test_compiled_matches_eager);
    tcase_add_test(tc, test_seven_and_eight_inputs);
    tcase_add_test(tc, test_fn_reaches_the_marked_function);
    tcase_add_test(tc, test_failures_are_errors);
    suite_add_tcase(s, tc);
    return s;
}

/* Registered before any KILN_COMPILE runs, so it runs after kiln frees them. */
static void nothing_alive_at_exit(void)
{
    if (kiln_live_tensors() == 0)
        return;
    fprintf(stderr, "marking: %lld tensors alive at exit\n", (long long)kiln_live_tensors());
    _exit(EXIT_FAILURE);
}

int main(void)
{
    atexit(nothing_alive_at_exit);
    /* Here, not only in the suite's forked children: the marked functions
     * that this process keeps at exit. */
    kiln_scope_begin();
    kiln_tensor *x = randn(2, 3, 7);
    bool ran = gelu_plus_compiled(x, x) && one_compiled(x);
    kiln_scope_end();
    if (!ran) {
        fprintf(stderr, "marking: %s\n", kiln_last_error());
        return EXIT_FAILURE;
    }
    return test_run_suite(marking_suite()) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
