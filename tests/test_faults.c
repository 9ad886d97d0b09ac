/* Out-of-memory paths: every allocation of an expression fails in turn.
 *
 * Links kiln's modules statically to reach core_alloc_fail_after, the
 * failing-allocator hook (SQLite's and Lua's way of testing these paths). */
#include "test_common.h"

#include "core/core.h"

/* Work touching every kind of op: creation, broadcasting, reductions,
 * movement, matmul, composites, concat and scopes. */
static kiln_tensor *workload(void)
{
    int64_t shape[2] = {8, 16}, wshape[2] = {16, 4}, big = 1 << 20;
    kiln_scope_begin();
    kiln_tensor *x = kiln_randn(2, shape, 1);
    kiln_tensor *w = kiln_rand(2, wshape, 2);
    kiln_tensor *h = kiln_gelu(kiln_matmul(x, w));
    kiln_tensor *s = kiln_softmax(kiln_transpose(h, 0, 1), -1);
    kiln_tensor *parts[2] = {s, kiln_layer_norm(s, NULL, NULL, 1e-5)};
    kiln_tensor *joined = kiln_concat(parts, 2, 0);
    kiln_tensor *large = kiln_sum(kiln_exp(kiln_full(KILN_F32, 1, &big, 0.5)), KILN_ALL, false);
    kiln_tensor *out = kiln_keep(kiln_add(kiln_sum(joined, KILN_ALL, false), large));
    kiln_scope_end();
    return out;
}

/* Every allocation of fn's work failing in turn: each reported, none leaking. */
static void fail_each_allocation(kiln_tensor *(*fn)(void), int at_least)
{
    kiln_tensor *reference = fn();
    ck_assert_ptr_nonnull(reference);
    double expected = kiln_item(reference);
    kiln_release(reference);
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    int failures = 0;
    for (int64_t n = 0;; n++) {
        kiln_clear_error();
        core_alloc_fail_after(n);
        kiln_tensor *out = fn();
        core_alloc_fail_after(-1);
        ck_assert_msg(kiln_live_tensors() == tensors + (out != NULL), "leak after %lld allocations (%s) %lld",
                      (long long)n, kiln_last_error(), (long long)(kiln_live_tensors() - tensors));
        ck_assert_int_eq(kiln_live_bytes(), bytes + (out ? 4 : 0));
        if (out) {
            ck_assert_double_eq_tol(kiln_item(out), expected, 1e-3 * fabs(expected));
            kiln_release(out);
            break;
        }
        ck_assert_msg(strstr(kiln_last_error(), "out of memory"), "after %lld allocations: \"%s\"",
                      (long long)n, kiln_last_error());
        failures++;
    }
    ck_assert_int_gt(failures, at_least);
}

START_TEST(test_every_allocation_failure_is_reported_and_leaks_nothing)
{
    fail_each_allocation(workload, 50);
}
END_TEST

/* A training step: a forward pass on a leaf, its gradient, an SGD step
 * with momentum; the new weights summed. */
static kiln_tensor *training(void)
{
    kiln_scope_begin();
    kiln_tensor *w = kiln_randn(2, (int64_t[]){4, 3}, 3), *x = kiln_randn(2, (int64_t[]){5, 4}, 4);
    kiln_optimizer *opt = NULL;
    kiln_tensor *out = NULL;
    if (!x || !w || kiln_requires_grad(w, true) < 0) /* a success clears the error of a failure before it */
        goto done;
    kiln_tensor *loss = kiln_sum(kiln_softmax(kiln_tanh(kiln_matmul(x, w)), -1), 0, false);
    if (!loss || kiln_backward(kiln_mean(loss, KILN_ALL, false)) < 0)
        goto done;
    if (!(opt = kiln_sgd(&w, 1, 0.1, 0.9, 0.01, true)) || kiln_optimizer_step(opt) < 0)
        goto done;
    kiln_no_grad_begin(); /* a result with a record would keep w alive */
    out = kiln_keep(kiln_add(kiln_sum(w, KILN_ALL, false), kiln_sum(kiln_grad(w), KILN_ALL, false)));
    kiln_no_grad_end();
done:
    kiln_optimizer_free(opt);
    kiln_scope_end();
    return out;
}

START_TEST(test_training_step_allocation_failures)
{
    fail_each_allocation(training, 50);
}
END_TEST

/* A compiled product of one row (a classifier's shape; GEMM's row path,
 * its scratch from kiln's allocator), called with inputs made anew. */
static kiln_fn *row_fn;

static int row_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_relu(kiln_matmul(in[0], in[1]));
    return 0;
}

static kiln_tensor *one_row_product(void)
{
    kiln_scope_begin();
    kiln_tensor *in[2] = {kiln_randn(2, (int64_t[]){1, 300}, 5), kiln_randn(2, (int64_t[]){300, 1000}, 6)};
    kiln_tensor *y = NULL, *out = NULL;
    if (in[0] && in[1] && kiln_call(row_fn, in, &y) == 0)
        out = kiln_keep(kiln_sum(y, KILN_ALL, false));
    kiln_scope_end();
    return out;
}

START_TEST(test_compiled_row_product_allocation_failures)
{
    row_fn = kiln_jit("one_row_product", row_body, 2, 1, NULL, NULL);
    ck_assert_ptr_nonnull(row_fn);
    fail_each_allocation(one_row_product, 3);
    kiln_fn_free(row_fn);
}
END_TEST

/* A compiled convolution of captured filters: a function made, called
 * twice (the second call reuses what the first kept, such as its packed
 * filters) and freed, under every failure; the traced body's failures run
 * the convolution eagerly. */
static int conv_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const kiln_conv2d_params same = {{1, 1}, {1, 1}, {1, 1}, 1};
    out[0] = kiln_relu(kiln_conv2d(in[0], (kiln_tensor *)user, NULL, &same));
    return out[0] ? 0 : -1;
}

static kiln_tensor *captured_conv(void)
{
    kiln_scope_begin();
    kiln_tensor *w = kiln_randn(4, (int64_t[]){8, 4, 3, 3}, 7), *x = kiln_randn(4, (int64_t[]){1, 4, 6, 6}, 8);
    kiln_tensor *y = NULL, *out = NULL;
    kiln_fn *f = w && x ? kiln_jit("captured_conv", conv_body, 1, 1, w, NULL) : NULL;
    if (f && kiln_call(f, &x, &y) == 0 && kiln_call(f, &x, &y) == 0)
        out = kiln_keep(kiln_sum(y, KILN_ALL, false));
    kiln_fn_free(f);
    kiln_scope_end();
    return out;
}

START_TEST(test_captured_conv_allocation_failures)
{
    fail_each_allocation(captured_conv, 3);
}
END_TEST

/* The same product transposed (its filters kept as B's panels): a failure
 * to pack them runs it as called or is reported, and nothing leaks. */
START_TEST(test_turned_conv_allocation_failures)
{
    setenv("KILN_GEMM_TURN", "1", 1);
    fail_each_allocation(captured_conv, 3);
    unsetenv("KILN_GEMM_TURN");
}
END_TEST

static Suite *faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = tcase_create("out of memory");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_allocation_failure_is_reported_and_leaks_nothing);
    tcase_add_test(tc, test_training_step_allocation_failures);
    tcase_add_test(tc, test_compiled_row_product_allocation_failures);
    tcase_add_test(tc, test_captured_conv_allocation_failures);
    tcase_add_test(tc, test_turned_conv_allocation_failures);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(faults_suite)
