/* Dynamic shapes: random programs over a symbolic batch and sequence checked
 * against eager at many sizes, the rules that keep a size symbolic or fix it,
 * guards, and symbolic specializations precompiled and loaded from disk. */
#include <unistd.h>

#include "dynprog.h"
#include "test_common.h"

static int64_t stat(kiln_fn *f, size_t offset)
{
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    return *(const int64_t *)((const char *)&s + offset);
}
#define STAT(f, field) stat(f, offsetof(kiln_fn_stats_t, field))

/* Tolerances: fused kernels and eager sum in different orders, in f32 (and
 * rows of f32 sums in f64 on one side only). */
#define REL 1e-4
#define ABS 1e-5

enum { PROGRAMS = 40, SIZES = 10 };

/* Program k at its ten sizes: T runs through k*10 .. k*10+9 (mod 45, from 2),
 * so that over the programs every row length hits every remainder of every
 * vector width up to 32; B through 2..6. */
START_TEST(test_random_programs_equal_eager_at_every_size)
{
    dynprog *p = dynprog_new((uint64_t)_i + 1, KILN_CPU);
    kiln_jit_options o = kiln_jit_defaults();
    o.dynamic_dims = DYNPROG_DIMS;
    kiln_fn *f = kiln_jit("dyn_program", dynprog_body, 3, 2, p, &o);
    for (int s = 0; s < SIZES; s++) {
        kiln_scope_begin();
        int64_t b = 2 + (_i + s) % 5, t = 2 + (_i * SIZES + s) % 45;
        kiln_tensor *in[3], *got[2], *want[2];
        dynprog_inputs(p, b, t, (uint64_t)(_i * 100 + s), in);
        ck_assert_msg(kiln_call(f, in, got) == 0, "program %d at B=%lld T=%lld: %s", _i, (long long)b,
                      (long long)t, kiln_last_error());
        ck_assert_int_eq(dynprog_body(in, want, p), 0);
        char what[64];
        for (int k = 0; k < 2; k++) {
            snprintf(what, sizeof what, "program %d output %d at B=%lld T=%lld", _i, k, (long long)b, (long long)t);
            assert_close(got[k], want[k], REL, ABS, what);
        }
        kiln_scope_end();
    }
    /* One trace, whose sizes all stayed symbolic, served every size. */
    ck_assert_int_eq(STAT(f, traces), 1);
    ck_assert_int_eq(STAT(f, symbolic), 1);
    ck_assert_int_eq(STAT(f, memory_hits), SIZES - 1);
    kiln_fn_free(f);
    dynprog_free(p);
}
END_TEST

/* A batch of 1 fails the guard (symbols are 2 or more): it is traced anew,
 * with the batch fixed, and the symbolic specialization still serves the
 * others. */
START_TEST(test_a_size_becoming_one_retraces)
{
    dynprog *p = dynprog_new(7, KILN_CPU);
    kiln_jit_options o = kiln_jit_defaults();
    o.dynamic_dims = DYNPROG_DIMS;
    kiln_fn *f = kiln_jit("dyn_one", dynprog_body, 3, 2, p, &o);
    int64_t sizes[][2] = {{3, 5}, {1, 5}, {4, 1}, {1, 1}, {6, 9}, {1, 7}};
    for (int s = 0; s < 6; s++) {
        kiln_scope_begin();
        kiln_tensor *in[3], *got[2], *want[2];
        dynprog_inputs(p, sizes[s][0], sizes[s][1], (uint64_t)s, in);
        ck_assert_int_eq(kiln_call(f, in, got), 0);
        ck_assert_int_eq(dynprog_body(in, want, p), 0);
        for (int k = 0; k < 2; k++)
            assert_close(got[k], want[k], REL, ABS, "a size of 1");
        kiln_scope_end();
    }
    /* [3,5] symbolic; [1,5] B fixed; [4,1] T fixed; [1,1] both; [6,9] hits
     * the first; [1,7] hits the second. */
    ck_assert_int_eq(STAT(f, traces), 4);
    ck_assert_int_eq(STAT(f, guard_failures), 3);
    kiln_fn_free(f);
    dynprog_free(p);
}
END_TEST

/* -- Which sizes stay symbolic --------------------------------------------- */

typedef kiln_tensor *(*unary_body)(kiln_tensor *x);

static int unary_wrapper(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = ((unary_body)(uintptr_t)user)(in[0]);
    return out[0] ? 0 : -1;
}

/* Calls body over x of shapes [n, 6] for n = 2..9 with axis 0 dynamic
 * from the first call; asserts eager's result each time and how many
 * traces that took. */
static void check_sizes(unary_body body, int64_t traces, const char *what)
{
    kiln_jit_options o = kiln_jit_defaults();
    uint32_t dims[1] = {0x1};
    o.dynamic_dims = dims;
    kiln_fn *f = kiln_jit(what, unary_wrapper, 1, 1, (void *)(uintptr_t)body, &o);
    for (int64_t n = 2; n <= 9; n++) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_randn(2, (int64_t[]){n, 6}, (uint64_t)n), *got;
        ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s: %s", what, kiln_last_error());
        assert_close(got, body(x), REL, ABS, what);
        kiln_scope_end();
    }
    ck_assert_msg(STAT(f, traces) == traces, "%s: %lld traces, not %lld", what, (long long)STAT(f, traces),
                  (long long)traces);
    kiln_fn_free(f);
}

static kiln_tensor *reshape_minus_one(kiln_tensor *x)
{
    return kiln_sum(kiln_reshape(x, 3, (int64_t[]){-1, 2, 3}), 1, false); /* [2n, 3] */
}

static kiln_tensor *reshape_fixed(kiln_tensor *x)
{
    const int64_t *shape = kiln_shape(x); /* read: the body's C sees the size */
    return kiln_reshape(x, 2, (int64_t[]){shape[0] * 2, 3});
}

static kiln_tensor *broadcast_fixed(kiln_tensor *x)
{
    kiln_tensor *row = kiln_ones(KILN_F32, 2, (int64_t[]){1, 6}); /* broadcasts: stays symbolic */
    return kiln_add(kiln_mul(x, row), kiln_ones(KILN_F32, 1, (int64_t[]){6}));
}

static kiln_tensor *expand_keep(kiln_tensor *x)
{
    kiln_tensor *col = kiln_sum(x, 1, true); /* [n, 1] */
    return kiln_mul(kiln_expand(col, 2, (int64_t[]){-1, 6}), x);
}

static kiln_tensor *slice_part(kiln_tensor *x)
{
    return kiln_slice(x, 0, 1, INT64_MAX, 1);
}

static kiln_tensor *concat_rows(kiln_tensor *x)
{
    return kiln_concat((kiln_tensor *[]){x, kiln_neg(x)}, 2, 0);
}

static kiln_tensor *product_rows(kiln_tensor *x)
{
    return kiln_matmul(kiln_transpose(x, 0, 1), x); /* [6, 6]: the symbol is summed over */
}

START_TEST(test_reshapes_and_broadcasts_with_symbols)
{
    check_sizes(reshape_minus_one, 1, "a reshape with -1");
    check_sizes(broadcast_fixed, 1, "broadcasts of fixed rows");
    check_sizes(expand_keep, 1, "an expand keeping a size");
    check_sizes(concat_rows, 1, "a concat along the symbol");
    check_sizes(product_rows, 1, "a product over the symbol");
    /* These need the size fixed: a trace per size. */
    check_sizes(reshape_fixed, 8, "a reshape to sizes the body computed");
    check_sizes(slice_part, 8, "a slice of part of the symbolic axis");
}
END_TEST

static int two_inputs_add(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_add(in[0], in[1]);
    return 0;
}

/* x + y with both axes 0 dynamic: broadcasting makes them one symbol, and
 * the guard then checks they are equal. */
START_TEST(test_sizes_the_ops_make_equal_become_one_symbol)
{
    kiln_jit_options o = kiln_jit_defaults();
    uint32_t dims[2] = {0x1, 0x1};
    o.dynamic_dims = dims;
    kiln_fn *f = kiln_jit("united", two_inputs_add, 2, 1, NULL, &o);
    for (int64_t n = 2; n < 6; n++) {
        kiln_tensor *in[2] = {kiln_full(KILN_F32, 2, (int64_t[]){n, 3}, 1), kiln_full(KILN_F32, 2, (int64_t[]){n, 3}, 2)};
        kiln_tensor *out;
        ck_assert_int_eq(kiln_call(f, in, &out), 0);
        ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 9.0 * (double)n);
    }
    ck_assert_int_eq(STAT(f, traces), 1);
    /* Sizes the symbol does not allow: y broadcast from 1 is another trace. */
    kiln_tensor *in[2] = {kiln_full(KILN_F32, 2, (int64_t[]){4, 3}, 1), kiln_full(KILN_F32, 2, (int64_t[]){1, 3}, 2)};
    kiln_tensor *out;
    ck_assert_int_eq(kiln_call(f, in, &out), 0);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 36.0);
    ck_assert_int_eq(STAT(f, traces), 2);
    kiln_fn_free(f);
}
END_TEST

static kiln_tensor *scale_rows(kiln_tensor *x)
{
    return kiln_softmax(kiln_mul_scalar(x, 2.0), -1);
}

/* AUTO specializes the first call, makes a changed size symbolic, and
 * compiles its kernels once for every later size; NEVER traces each size;
 * MARKED without marks behaves as NEVER. */
START_TEST(test_modes)
{
    kiln_dynamic modes[3] = {KILN_DYNAMIC_AUTO, KILN_DYNAMIC_NEVER, KILN_DYNAMIC_MARKED};
    int64_t traces[3] = {2, 6, 6};
    for (int m = 0; m < 3; m++) {
        kiln_jit_options o = kiln_jit_defaults();
        o.dynamic = modes[m];
        kiln_fn *f = kiln_jit("modes", unary_wrapper, 1, 1, (void *)(uintptr_t)scale_rows, &o);
        for (int64_t n = 2; n < 8; n++) {
            kiln_scope_begin();
            kiln_tensor *x = kiln_randn(2, (int64_t[]){n, 5}, (uint64_t)n), *got;
            ck_assert_int_eq(kiln_call(f, &x, &got), 0);
            assert_close(got, scale_rows(x), REL, ABS, "modes");
            kiln_scope_end();
        }
        ck_assert_int_eq(STAT(f, traces), traces[m]);
        ck_assert_int_eq(STAT(f, symbolic), m == 0);
        kiln_fn_free(f);
    }
}
END_TEST

static kiln_tensor *counter;

static int count_into_capture(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    kiln_assign(counter, kiln_add(counter, kiln_sum(in[0], KILN_ALL, false)));
    out[0] = kiln_relu(in[0]);
    return 0;
}

/* A writeback of a fixed shape does not stop an unrelated size being
 * symbolic, and the assignment happens on each call. */
START_TEST(test_writebacks_beside_symbols)
{
    counter = kiln_zeros(KILN_F32, 0, NULL);
    kiln_jit_options o = kiln_jit_defaults();
    uint32_t dims[1] = {0x1};
    o.dynamic_dims = dims;
    kiln_fn *f = kiln_jit("writes", count_into_capture, 1, 1, NULL, &o);
    double total = 0;
    for (int64_t n = 2; n < 7; n++) {
        kiln_tensor *x = kiln_full(KILN_F32, 1, &n, 0.5), *out;
        ck_assert_int_eq(kiln_call(f, &x, &out), 0);
        total += 0.5 * (double)n;
    }
    ck_assert_double_eq(kiln_item(counter), total);
    ck_assert_int_eq(STAT(f, traces), 1);
    kiln_fn_free(f);
    kiln_release(counter);
}
END_TEST

START_TEST(test_bad_marks_are_errors)
{
    kiln_spec spec = {.dtype = KILN_F32, .ndim = 2, .shape = {4, 5}, .device = KILN_CPU};
    ck_assert_int_lt(kiln_mark_dynamic(NULL, 0), 0);
    ck_assert_kiln_error("kiln_mark_dynamic", "spec");
    ck_assert_int_lt(kiln_mark_dynamic(&spec, 2), 0);
    ck_assert_kiln_error("kiln_mark_dynamic", "axis 2");
    ck_assert_int_eq(kiln_mark_dynamic(&spec, -1), 0);
    ck_assert_uint_eq(spec.dynamic, 0x2);
    kiln_jit_options o = kiln_jit_defaults();
    o.dynamic = (kiln_dynamic)7;
    ck_assert_ptr_null(kiln_jit("bad", two_inputs_add, 2, 1, NULL, &o));
    ck_assert_kiln_error("kiln_jit", "dynamic 7");
    kiln_fn *f = kiln_jit("marks", two_inputs_add, 2, 1, NULL, NULL);
    kiln_spec specs[2] = {spec, spec};
    specs[1].dynamic = 0x4; /* past its rank */
    ck_assert_int_lt(kiln_fn_precompile(f, specs, "host"), 0);
    ck_assert_kiln_error("kiln_fn_precompile", "spec 1", "past");
    kiln_fn_free(f);
}
END_TEST

/* -- Precompiled, and loaded from disk elsewhere ---------------------------- */

static kiln_tensor *mlp(kiln_tensor *x)
{
    static kiln_tensor *w;
    if (!w)
        w = kiln_keep(kiln_mul_scalar(kiln_randn(2, (int64_t[]){16, 24}, 3), 0.25));
    return kiln_softmax(kiln_gelu(kiln_matmul(x, w)), -1);
}

/* Precompiles mlp for a symbolic batch; then, for serve, calls it with
 * sizes it never saw. Prints "compiled <n> from_disk <n>". */
static int precompile_and_serve(bool serve)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.dynamic = KILN_DYNAMIC_MARKED;
    kiln_fn *f = kiln_jit("served", unary_wrapper, 1, 1, (void *)(uintptr_t)mlp, &o);
    kiln_spec spec = {.dtype = KILN_F32, .ndim = 2, .shape = {8, 16}, .device = KILN_CPU};
    if (kiln_mark_dynamic(&spec, 0) < 0 || kiln_fn_precompile(f, &spec, "host") < 0)
        return fprintf(stderr, "%s\n", kiln_last_error()), 1;
    for (int64_t n = 3; serve && n < 40; n += 7) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_randn(2, (int64_t[]){n, 16}, (uint64_t)n), *got;
        if (kiln_call(f, &x, &got) < 0)
            return fprintf(stderr, "%s\n", kiln_last_error()), 1;
        kiln_tensor *diff = kiln_max(kiln_abs(kiln_sub(got, mlp(x))), KILN_ALL, false);
        if (kiln_item(diff) > 1e-5)
            return fprintf(stderr, "differs by %g at %lld\n", kiln_item(diff), (long long)n), 1;
        kiln_scope_end();
    }
    kiln_fn_stats_t s;
    kiln_fn_stats(f, &s);
    printf("compiled %lld from_disk %lld traces %lld\n", (long long)s.kernels_compiled,
           (long long)s.kernels_from_disk, (long long)s.traces);
    kiln_fn_free(f);
    return 0;
}

/* The output of this program run again with argument arg and the cache dir. */
static void run_self(const char *arg, const char *dir, char *out, size_t size)
{
    /* readlink, not /proc/<pid>/exe: under valgrind that names valgrind's tool. */
    char self[512], command[1024];
    ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(length, 0);
    self[length] = '\0';
    snprintf(command, sizeof command, "KILN_CACHE=on KILN_CACHE_DIR='%s' '%s' %s", dir, self, arg);
    FILE *p = popen(command, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    ck_assert_int_eq(pclose(p), 0);
}

START_TEST(test_precompiled_symbolic_specialization_serves_new_sizes_from_disk)
{
    char dir[] = "/tmp/kiln-dynamic-XXXXXX", out[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    run_self("precompile", dir, out, sizeof out);
    long long compiled, from_disk, traces;
    ck_assert_int_eq(sscanf(out, "compiled %lld from_disk %lld traces %lld", &compiled, &from_disk, &traces), 3);
    ck_assert_int_gt(compiled, 0);
    run_self("serve", dir, out, sizeof out);
    ck_assert_int_eq(sscanf(out, "compiled %lld from_disk %lld traces %lld", &compiled, &from_disk, &traces), 3);
    ck_assert_msg(compiled == 0 && from_disk > 0 && traces == 1, "a fresh process: %s", out);
    char command[1100];
    snprintf(command, sizeof command, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(command), 0);
}
END_TEST

static Suite *dynamic_suite(void)
{
    Suite *s = suite_create("dynamic");
    TCase *programs = tcase_create("programs");
    tcase_set_timeout(programs, 600);
    tcase_add_checked_fixture(programs, test_scoped_setup, test_scoped_teardown);
    tcase_add_loop_test(programs, test_random_programs_equal_eager_at_every_size, 0,
                        UNDER_VALGRIND() ? 3 : PROGRAMS);
    tcase_add_test(programs, test_a_size_becoming_one_retraces);
    suite_add_tcase(s, programs);
    TCase *rules = tcase_create("rules");
    tcase_set_timeout(rules, 300);
    tcase_add_checked_fixture(rules, test_scoped_setup, test_scoped_teardown);
    tcase_add_test(rules, test_reshapes_and_broadcasts_with_symbols);
    tcase_add_test(rules, test_sizes_the_ops_make_equal_become_one_symbol);
    tcase_add_test(rules, test_modes);
    tcase_add_test(rules, test_writebacks_beside_symbols);
    tcase_add_test(rules, test_bad_marks_are_errors);
    suite_add_tcase(s, rules);
    TCase *disk = tcase_create("disk");
    tcase_set_timeout(disk, 300);
    tcase_add_test(disk, test_precompiled_symbolic_specialization_serves_new_sizes_from_disk);
    suite_add_tcase(s, disk);
    return s;
}

int main(int argc, char **argv)
{
    if (argc == 2)
        return precompile_and_serve(!strcmp(argv[1], "serve"));
    return test_run_suite(dynamic_suite()) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
