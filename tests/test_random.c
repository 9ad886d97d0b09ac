/* Random programs run eagerly and traced (INTERP, with and without graph
 * passes), compared bit for bit.
 *
 * KILN_PROGEN_COUNT sets how many programs (default 300; 20000 makes a long
 * run) and KILN_PROGEN_SEED the first seed (default 1). A failure prints the
 * seed, the program, the first differing element and the program cut down to
 * the failing output. */
#include <inttypes.h>
#include <stdarg.h>
#include <time.h>

#include "progen.h"
#include "test_common.h"

enum {
    DEFAULT_COUNT = 300,
    DEFAULT_SEED = 1,
    COVERAGE_MIN_PROGRAMS = 300, /* the default run: every op must appear in it */
    MAX_REPORTS = 10,            /* programs whose failure is printed in full */
    WHY_MAX = 2048,
};

static uint64_t env_u64(const char *name, uint64_t fallback)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return fallback;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    return *end ? fallback : (uint64_t)v;
}

static uint64_t program_count(void)
{
    return env_u64("KILN_PROGEN_COUNT", DEFAULT_COUNT);
}

static uint64_t first_seed(void)
{
    return env_u64("KILN_PROGEN_SEED", DEFAULT_SEED);
}

/* Input i of the program for seed: its values depend on both. */
static uint64_t input_seed(uint64_t seed, int i)
{
    return seed * 1000003u + (uint64_t)i;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* -- Values on the host ---------------------------------------------------- */

typedef struct {
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t numel;
    unsigned char *bytes;
} host_value;

/* t's dtype, shape and row-major bytes; false (why set) when they cannot be read. */
static bool to_host(const kiln_tensor *t, host_value *h, char *why, size_t size)
{
    *h = (host_value){.dtype = kiln_dtype_of(t), .ndim = kiln_ndim(t), .numel = kiln_numel(t)};
    memcpy(h->shape, kiln_shape(t), (size_t)h->ndim * sizeof *h->shape);
    size_t nbytes = (size_t)h->numel * kiln_dtype_size(h->dtype);
    h->bytes = malloc(nbytes ? nbytes : 1);
    if (h->bytes && kiln_copy_to_host(t, h->bytes, nbytes) == 0)
        return true;
    snprintf(why, size, "kiln_copy_to_host failed: %s", kiln_last_error());
    free(h->bytes);
    h->bytes = NULL;
    return false;
}

static void host_free(host_value *h)
{
    free(h->bytes);
    h->bytes = NULL;
}

static void format_type(char *buf, size_t size, const host_value *h)
{
    int n = snprintf(buf, size, "%s[", kiln_dtype_name(h->dtype));
    for (int d = 0; d < h->ndim && n > 0 && (size_t)n < size; d++)
        n += snprintf(buf + n, size - (size_t)n, "%s%" PRId64, d ? "," : "", h->shape[d]);
    if (n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, "]");
}

/* Element i as a number and, for floats, its bits. */
static void format_element(char *buf, size_t size, const host_value *h, int64_t i)
{
    const unsigned char *at = h->bytes + (size_t)i * kiln_dtype_size(h->dtype);
    switch (h->dtype) {
    case KILN_F32: {
        float f;
        uint32_t bits;
        memcpy(&f, at, 4);
        memcpy(&bits, at, 4);
        snprintf(buf, size, "%.9g (0x%08" PRIx32 ")", (double)f, bits);
        break;
    }
    case KILN_F64: {
        double f;
        uint64_t bits;
        memcpy(&f, at, 8);
        memcpy(&bits, at, 8);
        snprintf(buf, size, "%.17g (0x%016" PRIx64 ")", f, bits);
        break;
    }
    case KILN_I32: {
        int32_t v;
        memcpy(&v, at, 4);
        snprintf(buf, size, "%" PRId32, v);
        break;
    }
    case KILN_I64: {
        int64_t v;
        memcpy(&v, at, 8);
        snprintf(buf, size, "%" PRId64, v);
        break;
    }
    case KILN_BOOL: snprintf(buf, size, "%u", (unsigned)*at); break;
    }
}

/* Both elements are NaNs: IEEE 754 leaves a NaN's sign and payload open
 * (libm's pow(NaN, 1) may flip the sign where x**1 -> x keeps it). */
static bool both_nan(kiln_dtype dt, const unsigned char *a, const unsigned char *b)
{
    if (dt == KILN_F32) {
        float x, y;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        return isnan(x) && isnan(y);
    }
    if (dt == KILN_F64) {
        double x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        return isnan(x) && isnan(y);
    }
    return false;
}

/* Whether got equals want bit for bit, any NaN matching any NaN; why says where not. */
static bool same_value(const host_value *want, const host_value *got, char *why, size_t size)
{
    char a[128], b[128];
    format_type(a, sizeof a, want);
    format_type(b, sizeof b, got);
    if (strcmp(a, b) != 0) {
        snprintf(why, size, "eager gave %s, traced %s", a, b);
        return false;
    }
    size_t elem = kiln_dtype_size(want->dtype);
    for (int64_t i = 0; i < want->numel; i++) {
        const unsigned char *w = (const unsigned char *)want->bytes + (size_t)i * elem;
        const unsigned char *g = (const unsigned char *)got->bytes + (size_t)i * elem;
        if (!memcmp(w, g, elem) || both_nan(want->dtype, w, g))
            continue;
        char index[128] = "", x[64], y[64];
        int n = 0;
        for (int d = 0; d < want->ndim; d++) {
            int64_t stride = 1;
            for (int e = d + 1; e < want->ndim; e++)
                stride *= want->shape[e];
            n += snprintf(index + n, sizeof index - (size_t)n, "%s%" PRId64, d ? "," : "",
                          i / stride % want->shape[d]);
        }
        format_element(x, sizeof x, want, i);
        format_element(y, sizeof y, got, i);
        snprintf(why, size, "%s element %" PRId64 " [%s]: eager %s, traced %s", a, i, index, x, y);
        return false;
    }
    return true;
}

/* -- One program, eager against traced ------------------------------------- */

typedef struct {
    host_value want[PROGEN_MAX_OUTPUTS]; /* the eager outputs */
    int bad_output;                      /* the first output that differed, or -1 */
    char why[WHY_MAX];
} verdict;

static bool verdict_fail(verdict *v, int output, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool verdict_fail(verdict *v, int output, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->why, sizeof v->why, fmt, ap);
    va_end(ap);
    v->bad_output = output;
    return false;
}

static bool run_eager(const progen_program *p, kiln_tensor *const *in, verdict *v)
{
    kiln_tensor *out[PROGEN_MAX_OUTPUTS];
    bool ok = true;
    kiln_scope_begin();
    kiln_clear_error();
    if (progen_run(p, in, out) != 0)
        ok = verdict_fail(v, -1, "eager run failed: %s", progen_last_error());
    for (int k = 0; ok && k < progen_n_outputs(p); k++)
        if (!to_host(out[k], &v->want[k], v->why, sizeof v->why))
            ok = verdict_fail(v, k, "eager out[%d]: %s", k, v->why);
    kiln_scope_end();
    return ok;
}

/* Calls a fresh marked function calls times, after kiln_fn_precompile if
 * asked, and compares its outputs with the eager ones. It must trace once;
 * every call but a first one that traced must be a memory hit. */
static bool run_traced(const progen_program *p, kiln_tensor *const *in, int opt_level, int calls,
                       bool precompile, verdict *v)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    o.opt_level = opt_level;
    o.strict = true;
    o.no_cache = true;
    int n_out = progen_n_outputs(p);
    kiln_fn *f = kiln_jit("progen", progen_body, progen_n_inputs(p), n_out, (void *)p, &o);
    if (!f)
        return verdict_fail(v, -1, "kiln_jit failed: %s", kiln_last_error());
    bool ok = true;
    if (precompile) {
        kiln_spec specs[PROGEN_MAX_INPUTS];
        for (int i = 0; i < progen_n_inputs(p); i++)
            specs[i] = progen_input_spec(p, i);
        if (kiln_fn_precompile(f, specs, "host") != 0)
            ok = verdict_fail(v, -1, "opt_level %d: kiln_fn_precompile failed: %s%s%s", opt_level,
                              kiln_last_error(), progen_last_error()[0] ? " / progen: " : "",
                              progen_last_error());
    }
    int hits = calls - (precompile ? 0 : 1);
    /* A program that draws random values draws new ones each call: the
     * first call's are eager's, the others' only of its dtypes and shapes. */
    int compared = progen_draws_random(p) ? 1 : calls;
    for (int c = 0; ok && c < calls; c++) {
        kiln_tensor *out[PROGEN_MAX_OUTPUTS];
        kiln_scope_begin();
        kiln_clear_error();
        if (kiln_call(f, in, out) != 0)
            ok = verdict_fail(v, -1, "opt_level %d, call %d: kiln_call failed: %s%s%s", opt_level, c + 1,
                      kiln_last_error(), progen_last_error()[0] ? " / progen: " : "",
                      progen_last_error());
        for (int k = 0; ok && k < n_out; k++) {
            host_value got;
            char why[WHY_MAX];
            if (!to_host(out[k], &got, why, sizeof why))
                ok = verdict_fail(v, k, "opt_level %d, call %d, out[%d]: %s", opt_level, c + 1, k, why);
            else if (c < compared && !same_value(&v->want[k], &got, why, sizeof why))
                ok = verdict_fail(v, k, "opt_level %d, call %d, out[%d]: %s", opt_level, c + 1, k, why);
            host_free(&got);
        }
        kiln_scope_end();
    }
    kiln_fn_stats_t s;
    if (ok && kiln_fn_stats(f, &s) == 0 &&
        (s.traces != 1 || s.compiles != 1 || s.memory_hits != hits || s.eager_fallbacks != 0))
        ok = verdict_fail(v, -1,
                          "opt_level %d: after %d calls%s, %" PRId64 " traces, %" PRId64
                          " compiles, %" PRId64 " memory hits, %" PRId64
                          " eager fallbacks (want 1, 1, %d, 0)",
                          opt_level, calls, precompile ? " and a precompile" : "", s.traces,
                          s.compiles, s.memory_hits, s.eager_fallbacks, hits);
    kiln_fn_free(f);
    return ok;
}

/* Runs p eagerly and traced on in; true when every output agrees. */
static bool differential(const progen_program *p, kiln_tensor *const *in, verdict *v)
{
    *v = (verdict){.bad_output = -1};
    bool ok = run_eager(p, in, v) && run_traced(p, in, 2, 2, false, v) &&
              run_traced(p, in, 0, 1, true, v);
    for (int k = 0; k < PROGEN_MAX_OUTPUTS; k++)
        host_free(&v->want[k]);
    return ok;
}

static void print_listing(const progen_program *p)
{
    char *text = progen_describe(p);
    fprintf(stderr, "%s", text ? text : "(no listing: out of memory)\n");
    free(text);
}

/* Prints the failure of p: the whole program, then the failing output alone
 * and whether that smaller program still fails. */
static void report(const progen_program *p, kiln_tensor *const *in, const verdict *v)
{
    fprintf(stderr, "\n=== random program failed: %s\n", v->why);
    print_listing(p);
    if (v->bad_output < 0 || progen_n_outputs(p) == 1)
        return;
    progen_program *q = progen_only_output(p, v->bad_output);
    if (!q)
        return;
    verdict again;
    bool still = !differential(q, in, &again);
    fprintf(stderr, "--- out[%d] alone %s\n", v->bad_output,
            still ? "fails too:" : "passes; the failure needs the other outputs");
    if (still) {
        fprintf(stderr, "    %s\n", again.why);
        print_listing(q);
    }
    progen_free(q);
}

/* Generates, runs and compares the program of seed; false (reported while
 * *reports lasts) when anything differs, fails or leaks. */
static bool check_seed(uint64_t seed, int *reports)
{
    progen_program *p = progen_new(seed, NULL);
    ck_assert_msg(p != NULL, "progen_new(%" PRIu64 ") failed", seed);
    int64_t live = kiln_live_tensors();
    kiln_tensor *in[PROGEN_MAX_INPUTS];
    verdict v;
    kiln_scope_begin();
    for (int i = 0; i < progen_n_inputs(p); i++)
        in[i] = progen_make_input(p, i, input_seed(seed, i));
    bool ok = differential(p, in, &v);
    if (!ok && (*reports)++ < MAX_REPORTS)
        report(p, in, &v);
    else if (!ok)
        fprintf(stderr, "=== random program with seed %" PRIu64 " failed: %s\n", seed, v.why);
    kiln_scope_end();
    if (ok && kiln_live_tensors() != live) {
        ok = false;
        if ((*reports)++ < MAX_REPORTS) {
            fprintf(stderr, "\n=== random program leaked %" PRId64 " tensors\n",
                    kiln_live_tensors() - live);
            print_listing(p);
        }
    }
    progen_free(p);
    return ok;
}

/* -- Tests ----------------------------------------------------------------- */

START_TEST(test_eager_matches_traced)
{
    uint64_t count = program_count(), seed0 = first_seed();
    int64_t live = kiln_live_tensors();
    int reports = 0;
    uint64_t failed = 0, first_failed = 0;
    double start = now_s();
    kiln_scope_begin();
    for (uint64_t s = seed0; s < seed0 + count; s++) {
        if (!check_seed(s, &reports) && failed++ == 0)
            first_failed = s;
    }
    kiln_scope_end();
    printf("random: %" PRIu64 " programs from seed %" PRIu64 " in %.2f s, %" PRIu64 " failed\n",
           count, seed0, now_s() - start, failed);
    fflush(stdout);
    ck_assert_msg(failed == 0,
                  "%" PRIu64 " of %" PRIu64 " random programs failed, the first with seed %" PRIu64
                  " (rerun one with KILN_PROGEN_SEED=<seed> KILN_PROGEN_COUNT=1)",
                  failed, count, first_failed);
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

START_TEST(test_generator_is_deterministic)
{
    int64_t live = kiln_live_tensors();
    kiln_scope_begin();
    for (uint64_t s = first_seed(); s < first_seed() + 50; s++) {
        progen_program *a = progen_new(s, NULL), *b = progen_new(s, NULL), *c = progen_new(s + 1, NULL);
        char *ta = progen_describe(a), *tb = progen_describe(b), *tc = progen_describe(c);
        ck_assert_str_eq(ta, tb);
        /* past the first line, which names the seed */
        ck_assert_str_ne(strchr(ta, '\n'), strchr(tc, '\n'));
        for (int i = 0; i < progen_n_inputs(a); i++) {
            kiln_tensor *x = progen_make_input(a, i, s), *y = progen_make_input(b, i, s);
            size_t n = (size_t)kiln_numel(x) * kiln_dtype_size(kiln_dtype_of(x));
            unsigned char *bx = malloc(n + 1), *by = malloc(n + 1);
            ck_assert_int_eq(kiln_copy_to_host(x, bx, n), 0);
            ck_assert_int_eq(kiln_copy_to_host(y, by, n), 0);
            ck_assert_msg(!memcmp(bx, by, n), "seed %" PRIu64 " input %d differs", s, i);
            free(bx);
            free(by);
        }
        free(ta);
        free(tb);
        free(tc);
        progen_free(a);
        progen_free(b);
        progen_free(c);
    }
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

START_TEST(test_programs_cover_every_op)
{
    uint64_t count = program_count() > COVERAGE_MIN_PROGRAMS ? program_count() : COVERAGE_MIN_PROGRAMS;
    int64_t uses[PROGEN_OP_COUNT] = {0};
    int64_t instrs = 0, live = kiln_live_tensors();
    kiln_scope_begin();
    for (uint64_t s = first_seed(); s < first_seed() + count; s++) {
        progen_program *p = progen_new(s, NULL);
        ck_assert_ptr_nonnull(p);
        ck_assert_int_ge(progen_n_instrs(p), 5);
        ck_assert_int_le(progen_n_instrs(p), 50);
        ck_assert_int_ge(progen_n_outputs(p), 1);
        ck_assert_int_le(progen_n_outputs(p), PROGEN_MAX_OUTPUTS);
        for (int i = 0; i < progen_n_instrs(p); i++)
            uses[progen_instr_op(p, i)]++;
        instrs += progen_n_instrs(p);
        progen_free(p);
    }
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), live);
    int missing = 0;
    for (int op = 0; op < PROGEN_OP_COUNT; op++) {
        if (uses[op] == 0) {
            fprintf(stderr, "random: %s never appears in %" PRIu64 " programs\n",
                    progen_op_name((progen_op)op), count);
            missing++;
        }
    }
    ck_assert_msg(missing == 0, "%d of %d ops never appear in %" PRIu64 " programs (%" PRId64
                  " instructions)", missing, PROGEN_OP_COUNT, count, instrs);
}
END_TEST

/* Options narrow what is generated, and narrowed programs still agree. */
START_TEST(test_options_are_respected)
{
    int64_t live = kiln_live_tensors();
    progen_options o = {
        .min_ops = 3,
        .max_ops = 8,
        .max_inputs = 2,
        .dtypes = PROGEN_DTYPE_BIT(KILN_F32),
        .max_rank = 2,
        .max_dim = 3,
        .max_numel = 64,
        .ops = PROGEN_OP_BIT(PROGEN_ADD) | PROGEN_OP_BIT(PROGEN_MATMUL) | PROGEN_OP_BIT(PROGEN_SUM) |
               PROGEN_OP_BIT(PROGEN_RESHAPE) | PROGEN_OP_BIT(PROGEN_SOFTMAX) |
               PROGEN_OP_BIT(PROGEN_TRANSPOSE),
    };
    int reports = 0;
    kiln_scope_begin();
    for (uint64_t s = first_seed(); s < first_seed() + 100; s++) {
        progen_program *p = progen_new(s, &o);
        ck_assert_ptr_nonnull(p);
        ck_assert_int_ge(progen_n_instrs(p), 3);
        ck_assert_int_le(progen_n_instrs(p), 8);
        ck_assert_int_le(progen_n_inputs(p), 2);
        for (int i = 0; i < progen_n_inputs(p); i++) {
            kiln_spec spec = progen_input_spec(p, i);
            ck_assert_int_eq(spec.dtype, KILN_F32);
            ck_assert_int_le(spec.ndim, 2);
            for (int d = 0; d < spec.ndim; d++)
                ck_assert_int_le(spec.shape[d], 3);
        }
        for (int i = 0; i < progen_n_instrs(p); i++)
            ck_assert(o.ops & PROGEN_OP_BIT(progen_instr_op(p, i)));
        kiln_scope_begin();
        kiln_tensor *in[PROGEN_MAX_INPUTS], *out[PROGEN_MAX_OUTPUTS];
        for (int i = 0; i < progen_n_inputs(p); i++)
            in[i] = progen_make_input(p, i, s);
        ck_assert_msg(progen_run(p, in, out) == 0, "%s", progen_last_error());
        for (int k = 0; k < progen_n_outputs(p); k++) {
            ck_assert_int_eq(kiln_dtype_of(out[k]), KILN_F32);
            ck_assert_int_le(kiln_numel(out[k]), 64);
        }
        verdict v;
        if (!differential(p, in, &v)) {
            if (reports++ < MAX_REPORTS)
                report(p, in, &v);
        }
        kiln_scope_end();
        progen_free(p);
    }
    kiln_scope_end();
    ck_assert_msg(reports == 0, "%d narrowed programs failed", reports);
    /* Options that leave nothing to generate are refused. */
    progen_options none = {.dtypes = PROGEN_DTYPE_BIT(KILN_BOOL), .ops = PROGEN_OP_BIT(PROGEN_SOFTMAX)};
    ck_assert_ptr_null(progen_new(1, &none));
    progen_options bad = {.min_ops = 9, .max_ops = 4};
    ck_assert_ptr_null(progen_new(1, &bad));
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

/* progen's references: PyTorch's values for signed zeros, integer
 * extremes, empty axes and 0-d softmax, eagerly and interpreted. */
START_TEST(test_references_match_pytorch)
{
    int64_t live = kiln_live_tensors();
    kiln_jit_options interp = kiln_jit_defaults(), unoptimised;
    interp.backend = KILN_BACKEND_INTERP;
    interp.strict = true;
    unoptimised = interp;
    unoptimised.opt_level = 0;
    const kiln_jit_options *ways[3] = {NULL, &interp, &unoptimised};
    for (int i = 0; i < progen_n_references(); i++)
        for (int w = 0; w < 3; w++)
            ck_assert_msg(progen_check_reference(i, ways[w], KILN_CPU, 1e-6) == 0, "%s: %s",
                          w ? "interpreted" : "eager", progen_last_error());
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

/* progen_only_output keeps what one output needs, and computes the same value. */
START_TEST(test_only_output_matches)
{
    int64_t live = kiln_live_tensors();
    kiln_scope_begin();
    for (uint64_t s = first_seed(); s < first_seed() + 50; s++) {
        progen_program *p = progen_new(s, NULL);
        ck_assert_ptr_nonnull(p);
        kiln_scope_begin();
        kiln_tensor *in[PROGEN_MAX_INPUTS], *out[PROGEN_MAX_OUTPUTS], *alone;
        for (int i = 0; i < progen_n_inputs(p); i++)
            in[i] = progen_make_input(p, i, s);
        ck_assert_msg(progen_run(p, in, out) == 0, "seed %" PRIu64 ": %s", s, progen_last_error());
        for (int k = 0; k < progen_n_outputs(p); k++) {
            progen_program *q = progen_only_output(p, k);
            ck_assert_ptr_nonnull(q);
            ck_assert_int_eq(progen_n_outputs(q), 1);
            ck_assert_int_le(progen_n_instrs(q), progen_n_instrs(p));
            ck_assert_msg(progen_run(q, in, &alone) == 0, "seed %" PRIu64 ": %s", s, progen_last_error());
            host_value a, b;
            char why[WHY_MAX];
            ck_assert(to_host(out[k], &a, why, sizeof why));
            ck_assert(to_host(alone, &b, why, sizeof why));
            ck_assert_msg(same_value(&a, &b, why, sizeof why), "seed %" PRIu64 " out[%d]: %s", s, k, why);
            host_free(&a);
            host_free(&b);
            progen_free(q);
        }
        kiln_scope_end();
        progen_free(p);
    }
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

static Suite *random_suite(void)
{
    Suite *s = suite_create("random");
    TCase *generator = tcase_create("generator");
    tcase_add_test(generator, test_generator_is_deterministic);
    tcase_add_test(generator, test_programs_cover_every_op);
    tcase_add_test(generator, test_options_are_respected);
    tcase_add_test(generator, test_only_output_matches);
    tcase_add_test(generator, test_references_match_pytorch);
    tcase_set_timeout(generator, 600);
    suite_add_tcase(s, generator);
    TCase *differential_tc = tcase_create("differential");
    tcase_add_test(differential_tc, test_eager_matches_traced);
    tcase_set_timeout(differential_tc, 24 * 3600); /* KILN_PROGEN_COUNT may ask for a long run */
    suite_add_tcase(s, differential_tc);
    return s;
}

KILN_TEST_MAIN(random_suite)
