/* Shared helpers for kiln's Check suites: suite runner, tensor builders, comparisons. */
#ifndef KILN_TEST_COMMON_H
#define KILN_TEST_COMMON_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kiln/kiln.h>

/* Whether the test runs under valgrind (which makes large work slow). */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define UNDER_VALGRIND() RUNNING_ON_VALGRIND
#endif
#endif
#ifndef UNDER_VALGRIND
#define UNDER_VALGRIND() 0
#endif

/* Whether this is an AddressSanitizer build (GCC says __SANITIZE_ADDRESS__,
 * clang __has_feature): there, dense numeric sweeps check memory, not
 * accuracy, and may thin out. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Runs suite s; the number of its tests that failed. */
static inline int test_run_suite(Suite *s)
{
    SRunner *runner = srunner_create(s);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed;
}

/* A test case that repeats, over more targets or more inputs, what the
 * suite's other cases already cover. The README's test command runs it;
 * CI's slow runs (sanitizers, valgrind, the build without LLVM) leave it
 * out with CK_EXCLUDE_TAGS=exhaustive. */
static inline TCase *test_exhaustive_case(const char *name, double timeout)
{
    TCase *tc = tcase_create(name);
    tcase_set_tags(tc, "exhaustive");
    tcase_set_timeout(tc, timeout);
    return tc;
}

/* main() for a test program made of one suite. */
#define KILN_TEST_MAIN(make_suite)                                   \
    int main(void)                                                   \
    {                                                                \
        return test_run_suite(make_suite()) == 0 ? EXIT_SUCCESS : EXIT_FAILURE; \
    }

/* The float of bit pattern u, and the reverse. */
static inline float test_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t test_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The error of got in ulps of the float nearest want, want being the exact
 * value to double precision; INFINITY for a wrong special value (NaN for a
 * number or the reverse, a wrong infinity, a zero of the wrong sign). An
 * infinity that stands for a finite result counts as 2^128, one ulp past
 * FLT_MAX. */
static inline double test_ulp_error(float got, double want)
{
    float wantf = (float)want;
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got) ? 0 : INFINITY;
    if (isinf(wantf) && got == wantf)
        return 0;
    if (isinf(want))
        return INFINITY;
    if (wantf == 0 && got == 0)
        return signbit(wantf) == signbit(got) ? 0 : INFINITY;
    double g = isinf(got) ? copysign(0x1p128, got) : got;
    int e = 128;
    if (!isinf(wantf))
        frexpf(wantf, &e);
    double ulp = ldexp(1.0, (e < -125 ? -125 : e) - 24);
    return fabs(g - want) / ulp;
}

/* Asserts that a kiln call failed with a message containing each needle. */
#define ck_assert_kiln_error(...)                                          \
    do {                                                                   \
        const char *needles_[] = {__VA_ARGS__};                            \
        const char *msg_ = kiln_last_error();                              \
        for (size_t i_ = 0; i_ < sizeof needles_ / sizeof *needles_; i_++) \
            ck_assert_msg(strstr(msg_, needles_[i_]) != NULL,              \
                          "error \"%s\" lacks \"%s\"", msg_, needles_[i_]); \
    } while (0)

/* A checked fixture: each test runs in a scope, with no error pending, and
 * must leave as many live tensors as it found. */
static int64_t test_live_at_start;

static inline void test_scoped_setup(void)
{
    kiln_clear_error();
    test_live_at_start = kiln_live_tensors();
    kiln_scope_begin();
}

static inline void test_scoped_teardown(void)
{
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), test_live_at_start);
}

/* A private temporary directory for each test, made by test_tmp_setup and
 * removed with what it holds by test_tmp_teardown. */
static char test_tmp_dir[64];

static inline void test_tmp_setup(const char *prefix)
{
    snprintf(test_tmp_dir, sizeof test_tmp_dir, "/tmp/%s-XXXXXX", prefix);
    ck_assert_ptr_nonnull(mkdtemp(test_tmp_dir));
}

static inline void test_tmp_teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", test_tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* name in the test's temporary directory (a static buffer). */
static inline const char *test_tmp_path(const char *name)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", test_tmp_dir, name);
    return path;
}

static inline void test_write_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* A contiguous tensor copied out as doubles; the caller frees the array. */
static inline double *test_values(const kiln_tensor *t)
{
    int64_t n = kiln_numel(t);
    size_t size = kiln_dtype_size(kiln_dtype_of(t));
    void *raw = malloc((size_t)(n ? n : 1) * size);
    double *out = malloc((size_t)(n ? n : 1) * sizeof *out);
    ck_assert_int_eq(kiln_copy_to_host(t, raw, (size_t)n * size), 0);
    for (int64_t i = 0; i < n; i++) {
        switch (kiln_dtype_of(t)) {
        case KILN_F32: out[i] = ((float *)raw)[i]; break;
        case KILN_F64: out[i] = ((double *)raw)[i]; break;
        case KILN_I32: out[i] = ((int32_t *)raw)[i]; break;
        case KILN_I64: out[i] = (double)((int64_t *)raw)[i]; break;
        case KILN_BOOL: out[i] = ((uint8_t *)raw)[i]; break;
        }
    }
    free(raw);
    return out;
}

/* got exists and has want's dtype and shape. */
static inline void assert_same_kind(kiln_tensor *got, kiln_tensor *want, const char *what)
{
    ck_assert_msg(got && want, "%s: missing result (%s)", what, kiln_last_error());
    ck_assert_msg(kiln_dtype_of(got) == kiln_dtype_of(want), "%s: dtype %s, eager %s", what,
                  kiln_dtype_name(kiln_dtype_of(got)), kiln_dtype_name(kiln_dtype_of(want)));
    ck_assert_msg(kiln_ndim(got) == kiln_ndim(want), "%s: %d dimensions, eager %d", what, kiln_ndim(got),
                  kiln_ndim(want));
    for (int d = 0; d < kiln_ndim(got); d++)
        ck_assert_msg(kiln_shape(got)[d] == kiln_shape(want)[d], "%s: size %lld in dimension %d, eager %lld", what,
                      (long long)kiln_shape(got)[d], d, (long long)kiln_shape(want)[d]);
}

/* g within tolerance of w; NaN matches NaN, infinities and exact dtypes
 * match only themselves. */
static inline bool test_value_close(double g, double w, double rel, double abs_tol, bool exact)
{
    if (isnan(w) && isnan(g))
        return true;
    if (isinf(w) || exact)
        return g == w;
    return fabs(g - w) <= rel * fabs(w) + abs_tol;
}

/* got within tolerance of want (same dtype and shape); NaN matches NaN.
 * One assertion for the whole tensor: each of Check's is a system call. */
static inline void assert_close(kiln_tensor *got, kiln_tensor *want, double rel, double abs_tol, const char *what)
{
    assert_same_kind(got, want, what);
    double *g = test_values(got), *w = test_values(want);
    bool exact = kiln_dtype_of(want) != KILN_F32 && kiln_dtype_of(want) != KILN_F64;
    int64_t n = kiln_numel(want), i = 0;
    while (i < n && test_value_close(g[i], w[i], rel, abs_tol, exact))
        i++;
    double bad_got = i < n ? g[i] : 0, bad_want = i < n ? w[i] : 0;
    free(g);
    free(w);
    ck_assert_msg(i == n, "%s: element %lld is %.9g, eager %.9g", what, (long long)i, bad_got, bad_want);
}

#endif
