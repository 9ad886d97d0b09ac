/* Marked functions: traced (INTERP) against eager, specializations, captures,
 * writebacks, fresh outputs, and every error of tracing. */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "test_common.h"


static kiln_jit_options interp(void)
{
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    return o;
}

static kiln_tensor *tensor(kiln_dtype dt, int ndim, const int64_t *shape, uint64_t seed)
{
    kiln_tensor *t = kiln_mul_scalar(kiln_randn(ndim, shape, seed), 3);
    return kiln_cast(t, dt);
}

/* Bitwise equality: same dtype, shape and bytes. */
static void assert_same(kiln_tensor *got, kiln_tensor *want, const char *what)
{
    assert_same_kind(got, want, what);
    size_t n = (size_t)kiln_numel(got) * kiln_dtype_size(kiln_dtype_of(got));
    char *a = malloc(n + 1), *b = malloc(n + 1);
    ck_assert_int_eq(kiln_copy_to_host(got, a, n), 0);
    ck_assert_int_eq(kiln_copy_to_host(want, b, n), 0);
    ck_assert_msg(memcmp(a, b, n) == 0, "%s: traced differs from eager", what);
    free(a);
    free(b);
}

static int64_t count(const kiln_fn *f, int which)
{
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    int64_t values[] = {s.traces, s.compiles, s.memory_hits, s.disk_hits, s.eager_fallbacks};
    return values[which];
}
enum { TRACES, COMPILES, MEMORY_HITS, DISK_HITS, EAGER_FALLBACKS };

/* -- Every op, traced and eager -------------------------------------------- */

typedef kiln_tensor *(*op_case)(kiln_tensor *a, kiln_tensor *b);

#define CASE(name, expr) \
    static kiln_tensor *name(kiln_tensor *a, kiln_tensor *b) { (void)a; (void)b; return expr; }
CASE(c_add, kiln_add(a, b))
CASE(c_sub, kiln_sub(a, b))
CASE(c_mul, kiln_mul(a, b))
CASE(c_div, kiln_div(a, b))
CASE(c_pow, kiln_pow(kiln_abs(a), kiln_cast(b, KILN_F32)))
CASE(c_maximum, kiln_maximum(a, b))
CASE(c_minimum, kiln_minimum(a, b))
CASE(c_add_s, kiln_add_scalar(a, 2.5))
CASE(c_sub_s, kiln_sub_scalar(a, 3))
CASE(c_mul_s, kiln_mul_scalar(a, -1.5))
CASE(c_div_s, kiln_div_scalar(a, 7))
CASE(c_pow_s, kiln_pow_scalar(a, 2))
CASE(c_max_s, kiln_maximum_scalar(a, 0.25))
CASE(c_min_s, kiln_minimum_scalar(a, -0.25))
CASE(c_eq, kiln_eq(a, b))
CASE(c_ne, kiln_ne(a, b))
CASE(c_lt, kiln_lt(a, b))
CASE(c_le, kiln_le(a, b))
CASE(c_gt, kiln_gt(a, b))
CASE(c_ge, kiln_ge(a, b))
CASE(c_where, kiln_where(kiln_gt(a, b), a, b))
CASE(c_neg, kiln_neg(a))
CASE(c_abs, kiln_abs(a))
CASE(c_exp, kiln_exp(a))
CASE(c_log, kiln_log(kiln_abs(a)))
CASE(c_sqrt, kiln_sqrt(kiln_abs(a)))
CASE(c_rsqrt, kiln_rsqrt(kiln_abs(a)))
CASE(c_tanh, kiln_tanh(a))
CASE(c_sigmoid, kiln_sigmoid(a))
CASE(c_relu, kiln_relu(a))
CASE(c_sin, kiln_sin(a))
CASE(c_cos, kiln_cos(a))
CASE(c_erf, kiln_erf(a))
CASE(c_cast_i32, kiln_cast(a, KILN_I32))
CASE(c_cast_bool, kiln_cast(a, KILN_BOOL))
CASE(c_cast_f64, kiln_cast(a, KILN_F64))
CASE(c_sum, kiln_sum(a, 1, false))
CASE(c_sum_all, kiln_sum(a, KILN_ALL, false))
CASE(c_mean, kiln_mean(a, -1, true))
CASE(c_max, kiln_max(a, 0, false))
CASE(c_min, kiln_min(a, KILN_ALL, true))
CASE(c_argmax, kiln_argmax(a, 1, false))
CASE(c_reshape, kiln_reshape(a, 2, (const int64_t[]){-1, 2}))
CASE(c_permute, kiln_permute(a, (const int[]){1, 0}))
CASE(c_transpose, kiln_transpose(a, 0, 1))
CASE(c_expand, kiln_expand(kiln_unsqueeze(a, 0), 3, (const int64_t[]){3, -1, -1}))
CASE(c_slice, kiln_slice(a, 1, -1, INT64_MIN, -2))
/* Python takes a step of -2^63: one element, whose magnitude has no int64. */
CASE(c_slice_min_step, kiln_add(kiln_slice(a, 1, -1, INT64_MIN, INT64_MIN), kiln_slice(b, 0, 2, 0, INT64_MIN)))
CASE(c_concat, kiln_concat((kiln_tensor *[]){a, b, a}, 3, 0))
CASE(c_squeeze, kiln_squeeze(kiln_unsqueeze(a, 1), 1))
CASE(c_contiguous, kiln_contiguous(kiln_transpose(a, 0, 1)))
CASE(c_matmul, kiln_matmul(a, kiln_transpose(b, 0, 1)))
CASE(c_softmax, kiln_softmax(a, -1))
CASE(c_log_softmax, kiln_log_softmax(a, 0))
CASE(c_layer_norm, kiln_layer_norm(a, b, NULL, 1e-5))
CASE(c_gelu, kiln_gelu(a))
CASE(c_silu, kiln_silu(a))

static const struct {
    const char *name;
    op_case fn;
} CASES[] = {
    {"add", c_add}, {"sub", c_sub}, {"mul", c_mul}, {"div", c_div}, {"pow", c_pow},
    {"maximum", c_maximum}, {"minimum", c_minimum}, {"add_scalar", c_add_s},
    {"sub_scalar", c_sub_s}, {"mul_scalar", c_mul_s}, {"div_scalar", c_div_s},
    {"pow_scalar", c_pow_s}, {"maximum_scalar", c_max_s}, {"minimum_scalar", c_min_s},
    {"eq", c_eq}, {"ne", c_ne}, {"lt", c_lt}, {"le", c_le}, {"gt", c_gt}, {"ge", c_ge},
    {"where", c_where}, {"neg", c_neg}, {"abs", c_abs}, {"exp", c_exp}, {"log", c_log},
    {"sqrt", c_sqrt}, {"rsqrt", c_rsqrt}, {"tanh", c_tanh}, {"sigmoid", c_sigmoid},
    {"relu", c_relu}, {"sin", c_sin}, {"cos", c_cos}, {"erf", c_erf},
    {"cast_i32", c_cast_i32}, {"cast_bool", c_cast_bool}, {"cast_f64", c_cast_f64},
    {"sum", c_sum}, {"sum_all", c_sum_all}, {"mean", c_mean}, {"max", c_max}, {"min", c_min},
    {"argmax", c_argmax}, {"reshape", c_reshape}, {"permute", c_permute},
    {"transpose", c_transpose}, {"expand", c_expand}, {"slice", c_slice},
    {"slice_min_step", c_slice_min_step}, {"concat", c_concat},
    {"squeeze", c_squeeze}, {"contiguous", c_contiguous}, {"matmul", c_matmul},
    {"softmax", c_softmax}, {"log_softmax", c_log_softmax}, {"layer_norm", c_layer_norm},
    {"gelu", c_gelu}, {"silu", c_silu},
};

static int find_case(const char *name)
{
    for (int i = 0; i < (int)(sizeof CASES / sizeof *CASES); i++)
        if (!strcmp(CASES[i].name, name))
            return i;
    ck_abort_msg("no case %s", name);
    return -1;
}

static int case_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = CASES[*(const int *)user].fn(in[0], in[1]);
    return out[0] ? 0 : -1;
}

/* Each op on f32, f64 and i32 operands of shape [4,6]: traced bit for bit eager. */
START_TEST(test_every_op_traced_matches_eager)
{
    static const kiln_dtype dtypes[] = {KILN_F32, KILN_F64, KILN_I32};
    const int64_t shape[2] = {4, 6};
    kiln_jit_options o = interp();
    int which = _i;
    for (int d = 0; d < 3; d++) {
        kiln_tensor *in[2] = {tensor(dtypes[d], 2, shape, 1), tensor(dtypes[d], 2, shape, 2)};
        kiln_tensor *eager = NULL;
        case_body(in, &eager, &which);
        kiln_fn *f = kiln_jit(CASES[which].name, case_body, 2, 1, &which, &o);
        kiln_tensor *traced = NULL;
        ck_assert_msg(kiln_call(f, in, &traced) == 0, "%s: %s", CASES[which].name, kiln_last_error());
        char what[64];
        snprintf(what, sizeof what, "%s on %s", CASES[which].name, kiln_dtype_name(dtypes[d]));
        assert_same(traced, eager, what);
        ck_assert_int_eq(count(f, TRACES), 1);
        kiln_fn_free(f);
    }
}
END_TEST

/* -- Specializations ------------------------------------------------------- */

static int add_one(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_add_scalar(in[0], 1);
    return out[0] ? 0 : -1;
}

START_TEST(test_new_signature_retraces_and_old_one_hits)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("add_one", add_one, 1, 1, NULL, &o);
    kiln_tensor *a = kiln_ones(KILN_F32, 1, (int64_t[]){3});
    kiln_tensor *b = kiln_ones(KILN_F32, 1, (int64_t[]){4});
    kiln_tensor *c = kiln_ones(KILN_I32, 1, (int64_t[]){3});
    kiln_tensor *out;
    kiln_tensor *calls[] = {a, b, a, c, a, b};
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(kiln_call(f, &calls[i], &out), 0);
    ck_assert_int_eq(count(f, TRACES), 3);
    ck_assert_int_eq(count(f, MEMORY_HITS), 3);
    ck_assert_int_eq(kiln_dtype_of(out), KILN_F32);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 8);
    kiln_fn_free(f);
}
END_TEST

START_TEST(test_retrace_limit_falls_back_eagerly_or_fails_in_strict_mode)
{
    kiln_jit_options o = interp();
    o.retrace_limit = 2;
    o.dynamic = KILN_DYNAMIC_NEVER; /* every size a signature */
    kiln_fn *f = kiln_jit("shapes", add_one, 1, 1, NULL, &o);
    o.strict = true;
    kiln_fn *strict = kiln_jit("strict_shapes", add_one, 1, 1, NULL, &o);
    kiln_tensor *out;
    for (int64_t n = 1; n <= 3; n++) {
        kiln_tensor *x = kiln_ones(KILN_F32, 1, &n);
        ck_assert_int_eq(kiln_call(f, &x, &out), 0);
        ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 2.0 * (double)n);
        int status = kiln_call(strict, &x, &out);
        ck_assert_int_eq(status < 0, n == 3);
    }
    ck_assert_kiln_error("kiln_call", "retrace limit", "input 0 changed shape", "f32[2]", "f32[3]");
    ck_assert_int_eq(count(f, TRACES), 2);
    ck_assert_int_eq(count(f, EAGER_FALLBACKS), 1);
    ck_assert_int_eq(count(strict, EAGER_FALLBACKS), 0);
    kiln_fn_free(f);
    kiln_fn_free(strict);
}
END_TEST

START_TEST(test_precompile_prepares_without_running)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("pre", add_one, 1, 1, NULL, &o);
    kiln_spec spec = {.dtype = KILN_F64, .ndim = 2, .shape = {2, 3}, .device = KILN_CPU};
    ck_assert_int_eq(kiln_fn_precompile(f, &spec, "host"), 0);
    ck_assert_int_eq(count(f, TRACES), 1);
    kiln_tensor *x = kiln_zeros(KILN_F64, 2, (int64_t[]){2, 3}), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_int_eq(count(f, MEMORY_HITS), 1);
    ck_assert_int_lt(kiln_fn_precompile(f, &spec, "cuda:sm_90"), 0);
    ck_assert_kiln_error("kiln_fn_precompile", "cuda:sm_90");
    spec.ndim = 9;
    ck_assert_int_lt(kiln_fn_precompile(f, &spec, "host"), 0);
    kiln_fn_free(f);
}
END_TEST

/* -- Captures and writebacks ----------------------------------------------- */

static int scale_by_captured(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_mul(in[0], (kiln_tensor *)user);
    return out[0] ? 0 : -1;
}

START_TEST(test_captured_tensor_is_read_by_reference)
{
    kiln_tensor *w = kiln_full(KILN_F32, 1, (int64_t[]){3}, 2);
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("scale", scale_by_captured, 1, 1, w, &o);
    kiln_tensor *x = kiln_arange(1, 4, 1, KILN_F32), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 12);
    ck_assert_int_eq(kiln_assign(w, kiln_scalar(10)), 0);
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 60);
    ck_assert_int_eq(count(f, TRACES), 1);
    kiln_fn_free(f);
}
END_TEST

/* A scope's tensor a function captures, released early inside the scope,
 * leaves the scope: the function's own reference keeps it alive. */
START_TEST(test_captured_tensor_released_early_stays_alive)
{
    kiln_scope_begin();
    kiln_tensor *w = kiln_full(KILN_F32, 1, (int64_t[]){3}, 2);
    kiln_fn *f = kiln_jit("scale", scale_by_captured, 1, 1, w, NULL);
    kiln_tensor *x = kiln_arange(1, 4, 1, KILN_F32), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    kiln_release(w);
    kiln_scope_end();
    ck_assert_str_eq(kiln_last_error(), "");
    x = kiln_arange(1, 4, 1, KILN_F32);
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 12);
    kiln_fn_free(f);
    ck_assert_str_eq(kiln_last_error(), "");
}
END_TEST

/* w += 1, then y = x * w: the body reads the assigned value. */
static int step(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *w = user;
    if (kiln_assign(w, kiln_add_scalar(w, 1)) < 0)
        return -1;
    out[0] = kiln_mul(in[0], w);
    return out[0] ? 0 : -1;
}

START_TEST(test_assign_to_captured_tensor_writes_back_every_call)
{
    kiln_tensor *w_traced = kiln_zeros(KILN_F32, 1, (int64_t[]){2});
    kiln_tensor *w_eager = kiln_zeros(KILN_F32, 1, (int64_t[]){2});
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("step", step, 1, 1, w_traced, &o);
    kiln_tensor *x = kiln_full(KILN_F32, 1, (int64_t[]){2}, 3), *out, *want;
    for (int call = 1; call <= 3; call++) {
        ck_assert_int_eq(kiln_call(f, &x, &out), 0);
        ck_assert_int_eq(step(&x, &want, w_eager), 0);
        assert_same(out, want, "step output");
        assert_same(w_traced, w_eager, "written-back weight");
        ck_assert_double_eq(kiln_item(kiln_max(w_traced, KILN_ALL, false)), call);
    }
    ck_assert_int_eq(count(f, TRACES), 1);
    kiln_fn_free(f);
}
END_TEST

/* An assign's source in another dtype and a broadcast shape is converted as
 * kiln_assign converts. */
static int assign_broadcast(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    int status = kiln_assign((kiln_tensor *)user, in[0]);
    out[0] = kiln_sum((kiln_tensor *)user, KILN_ALL, false);
    return status < 0 || !out[0] ? -1 : 0;
}

START_TEST(test_writeback_converts_and_broadcasts)
{
    kiln_tensor *w = kiln_zeros(KILN_I32, 2, (int64_t[]){2, 3});
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("assign_broadcast", assign_broadcast, 1, 1, w, &o);
    kiln_tensor *x = kiln_arange(0.5, 3, 1, KILN_F64), *out; /* 0.5 1.5 2.5 */
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(out), 6); /* 2 * (0 + 1 + 2) after truncation */
    ck_assert_int_eq(kiln_dtype_of(out), KILN_I64);
    kiln_fn_free(f);
}
END_TEST

/* x plus noise of seed 7, twice with one seed (the same values, as eagerly)
 * and once with seed 8. */
static int noisy(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    int64_t n = kiln_shape(in[0])[0];
    kiln_tensor *a = kiln_randn(1, &n, 7), *b = kiln_randn(1, &n, 7), *c = kiln_rand(1, &n, 8);
    out[0] = kiln_add(in[0], a);
    out[1] = kiln_sub(a, b);
    out[2] = c;
    return out[0] && out[1] && out[2] ? 0 : -1;
}

/* Random ops inside a body are ops of the trace, drawing a new stream each
 * call (they used to be constants of the first call): the first call draws
 * what eager does for the seed, each later call other values, and a new
 * function the same sequence again. */
START_TEST(test_random_ops_draw_afresh_each_call)
{
    int64_t n = 1000;
    kiln_tensor *x = kiln_zeros(KILN_F32, 1, &n), *first[3], *out[3];
    for (int backend = 0; backend < 2; backend++) {
        kiln_jit_options o = backend ? kiln_jit_defaults() : interp();
        kiln_fn *f = kiln_jit("noisy", noisy, 1, 3, NULL, &o), *again = kiln_jit("noisy", noisy, 1, 3, NULL, &o);
        ck_assert_int_eq(kiln_call(f, &x, first), 0);
        assert_same(first[0], kiln_randn(1, &n, 7), "the first call's noise");
        assert_same(first[2], kiln_rand(1, &n, 8), "the first call's uniform values");
        ck_assert_double_eq(kiln_item(kiln_max(kiln_abs(first[1]), KILN_ALL, false)), 0);
        ck_assert_int_eq(kiln_call(f, &x, out), 0);
        ck_assert_double_gt(kiln_item(kiln_max(kiln_abs(kiln_sub(out[0], first[0])), KILN_ALL, false)), 0.1);
        ck_assert_double_eq(kiln_item(kiln_max(kiln_abs(out[1]), KILN_ALL, false)), 0);
        kiln_tensor *second = out[0];
        ck_assert_int_eq(kiln_call(again, &x, out), 0);
        assert_same(out[0], first[0], "a new function's first call");
        ck_assert_int_eq(kiln_call(again, &x, out), 0);
        assert_same(out[0], second, "a new function's second call");
        ck_assert_int_eq(count(f, TRACES), 1);
        kiln_fn_free(f);
        kiln_fn_free(again);
    }
}
END_TEST

/* state = state * 2; out = state + in[0]. */
static int doubles_state(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *state = user;
    if (kiln_assign(state, kiln_mul_scalar(state, 2)) < 0)
        return -1;
    out[0] = kiln_add(state, in[0]);
    return out[0] ? 0 : -1;
}

/* The caller passes the captured state itself as the input: eagerly the
 * input then reads the assigned value (4, 8, 16); traced it read the old
 * one (3, 6, 12). Such calls run eagerly; others stay compiled. */
START_TEST(test_input_aliasing_an_assigned_capture)
{
    for (int backend = 0; backend < 2; backend++) {
        kiln_tensor *state = kiln_ones(KILN_F32, 0, NULL), *other = kiln_ones(KILN_F32, 0, NULL), *out;
        kiln_jit_options o = backend ? kiln_jit_defaults() : interp();
        kiln_fn *f = kiln_jit("doubles_state", doubles_state, 1, 1, state, &o);
        for (int call = 1; call <= 3; call++) {
            ck_assert_int_eq(kiln_call(f, &state, &out), 0);
            ck_assert_double_eq(kiln_item(out), 4 << (call - 1));
        }
        ck_assert_int_eq(count(f, EAGER_FALLBACKS), 3);
        ck_assert_int_eq(kiln_call(f, &other, &out), 0); /* 16 + 1 */
        ck_assert_double_eq(kiln_item(out), 17);
        ck_assert_int_eq(count(f, EAGER_FALLBACKS), 3);
        kiln_fn_free(f);
    }
}
END_TEST

/* b = a; a = c: the first writeback must read a before the second writes it. */
static kiln_tensor *capture_a, *capture_b, *capture_c;

static int chained_assigns(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    if (kiln_assign(capture_b, capture_a) < 0 || kiln_assign(capture_a, capture_c) < 0)
        return -1;
    out[0] = kiln_add(in[0], capture_b);
    return out[0] ? 0 : -1;
}

START_TEST(test_writebacks_read_before_they_write)
{
    capture_a = kiln_full(KILN_F32, 1, (int64_t[]){1}, 1);
    capture_b = kiln_full(KILN_F32, 1, (int64_t[]){1}, 2);
    capture_c = kiln_full(KILN_F32, 1, (int64_t[]){1}, 3);
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("chained", chained_assigns, 1, 1, NULL, &o);
    kiln_tensor *x = kiln_zeros(KILN_F32, 1, (int64_t[]){1}), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(capture_a), 3);
    ck_assert_double_eq(kiln_item(capture_b), 1);
    ck_assert_double_eq(kiln_item(out), 1);
    kiln_fn_free(f);
}
END_TEST

/* A tensor the body makes is new on every call: assigning to it inside the
 * body must not carry its value into the next call. */
static int accumulate_in_temporary(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *acc = kiln_zeros(KILN_F32, 1, (int64_t[]){3});
    out[0] = kiln_add(acc, in[0]);
    return kiln_assign(acc, out[0]) < 0 ? -1 : 0;
}

START_TEST(test_assign_to_a_tensor_made_in_the_body_is_not_written_back)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("temporary", accumulate_in_temporary, 1, 1, NULL, &o);
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){3}), *out, *want;
    for (int call = 0; call < 3; call++) {
        ck_assert_int_eq(kiln_call(f, &x, &out), 0);
        ck_assert_int_eq(accumulate_in_temporary(&x, &want, NULL), 0);
        assert_same(out, want, "a temporary assigned in the body");
    }
    kiln_fn_free(f);
}
END_TEST

/* -- Fresh outputs --------------------------------------------------------- */

typedef enum { IDENTITY, VIEW, CAPTURED, TWICE } alias_kind;

typedef struct {
    alias_kind kind;
    kiln_tensor *captured;
} aliasing_case;

/* Outputs that are, or view, tensors the caller holds. */
static int aliasing(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const aliasing_case *c = user;
    switch (c->kind) {
    case IDENTITY: out[0] = in[0], out[1] = in[0]; break;
    case VIEW: out[0] = kiln_transpose(in[0], 0, 1), out[1] = kiln_reshape(in[0], 1, (int64_t[]){-1}); break;
    case CAPTURED: out[0] = c->captured, out[1] = kiln_squeeze(kiln_unsqueeze(c->captured, 0), 0); break;
    case TWICE: out[0] = out[1] = kiln_add(in[0], in[1]); break;
    }
    return 0;
}

START_TEST(test_outputs_are_fresh_on_every_call)
{
    kiln_tensor *in[2] = {tensor(KILN_F32, 2, (int64_t[]){2, 3}, 1), tensor(KILN_F32, 2, (int64_t[]){2, 3}, 2)};
    aliasing_case c = {(alias_kind)_i, tensor(KILN_F32, 2, (int64_t[]){2, 3}, 3)};
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("aliasing", aliasing, 2, 2, &c, &o);
    kiln_tensor *first[2], *second[2];
    ck_assert_int_eq(kiln_call(f, in, first), 0);
    kiln_tensor *snapshot = kiln_contiguous(kiln_add_scalar(first[0], 0));
    ck_assert_int_eq(kiln_call(f, in, second), 0);
    for (int i = 0; i < 2; i++) {
        ck_assert(!kiln_shares_storage(first[i], in[0]) && !kiln_shares_storage(first[i], in[1]));
        ck_assert(!kiln_shares_storage(first[i], c.captured));
        ck_assert(!kiln_shares_storage(first[i], second[0]) && !kiln_shares_storage(first[i], second[1]));
    }
    ck_assert_int_eq(kiln_assign(in[0], kiln_scalar(7)), 0);
    ck_assert_int_eq(kiln_assign(in[1], kiln_scalar(7)), 0);
    ck_assert_int_eq(kiln_assign(c.captured, kiln_scalar(7)), 0);
    assert_same(first[0], snapshot, "an earlier output after the inputs changed");
    kiln_fn_free(f);
}
END_TEST

/* -- Errors while tracing -------------------------------------------------- */

typedef enum { READ_ITEM, READ_HOST, READ_AND_IGNORE, NULL_OUTPUT, EXTRA_OUTPUT, OP_ERROR,
               ASSIGN_TRACED, READ_ASSIGNED_VIEW, READ_STALE_VIEW, RETURN_ERROR } body_fault;

static kiln_tensor *weight, *weight_view;

static int faulty(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    float buf[6];
    switch (*(body_fault *)user) {
    case READ_ITEM:
        if (kiln_item(kiln_sum(in[0], KILN_ALL, false)) > 0)
            return -1;
        break;
    case READ_HOST: return kiln_copy_to_host(in[0], buf, sizeof buf) < 0 ? -1 : 0;
    case READ_AND_IGNORE: (void)kiln_item(kiln_sum(in[0], KILN_ALL, false)); break;
    case NULL_OUTPUT: out[0] = kiln_neg(in[0]); return 0;
    case EXTRA_OUTPUT: out[2] = in[0]; break;
    case OP_ERROR: out[0] = kiln_add(in[0], kiln_ones(KILN_F32, 1, (int64_t[]){4})); return out[0] ? 0 : -1;
    case ASSIGN_TRACED: return kiln_assign(kiln_neg(in[0]), in[0]) < 0 ? -1 : 0;
    case READ_ASSIGNED_VIEW:
        kiln_assign(weight, kiln_reshape(in[0], 1, (int64_t[]){6}));
        out[0] = kiln_neg(weight_view);
        out[1] = out[0];
        return 0;
    case READ_STALE_VIEW: { /* eagerly, head would show the assignment */
        kiln_tensor *head = kiln_slice(weight, 0, 0, 2, 1);
        kiln_assign(weight, kiln_reshape(in[0], 1, (int64_t[]){6}));
        out[0] = out[1] = kiln_add_scalar(head, 0);
        return 0;
    }
    case RETURN_ERROR: return 42;
    }
    out[0] = in[0];
    out[1] = in[0];
    return 0;
}

START_TEST(test_each_tracing_error_is_distinct)
{
    static const struct {
        body_fault fault;
        const char *needles[2];
    } FAULTS[] = {
        {READ_ITEM, {"data-dependent control flow", "kiln_where"}},
        {READ_HOST, {"kiln_copy_to_host", "data-dependent"}},
        {READ_AND_IGNORE, {"kiln_item", "data-dependent"}},
        {NULL_OUTPUT, {"left out[1] NULL", "faulty"}},
        {EXTRA_OUTPUT, {"wrote out[2]", "past its 2 outputs"}},
        {OP_ERROR, {"kiln_add: shapes [2,3] and [4]", "tracing 'faulty' failed"}},
        {ASSIGN_TRACED, {"kiln_assign", "only tensors from outside the body"}},
        {READ_ASSIGNED_VIEW, {"reads a view of a tensor it assigned", "faulty"}},
        {READ_STALE_VIEW, {"view taken before the tensor it views was assigned", "faulty"}},
        {RETURN_ERROR, {"returned 42", "faulty"}},
    };
    weight = kiln_zeros(KILN_F32, 1, (int64_t[]){6});
    weight_view = kiln_reshape(weight, 2, (int64_t[]){3, 2});
    kiln_jit_options o = interp();
    o.strict = true;
    kiln_tensor *x = kiln_ones(KILN_F32, 2, (int64_t[]){2, 3});
    for (size_t i = 0; i < sizeof FAULTS / sizeof *FAULTS; i++) {
        body_fault fault = FAULTS[i].fault;
        kiln_fn *f = kiln_jit("faulty", faulty, 1, 2, &fault, &o);
        kiln_tensor *out[3] = {NULL, NULL, NULL};
        int64_t live = kiln_live_tensors();
        kiln_clear_error();
        ck_assert_msg(kiln_call(f, &x, out) < 0, "fault %zu traced", i);
        ck_assert_msg(!out[0] && !out[1], "fault %zu left outputs", i);
        ck_assert_kiln_error(FAULTS[i].needles[0], FAULTS[i].needles[1]);
        ck_assert_int_eq(kiln_live_tensors(), live);
        kiln_fn_free(f);
    }
}
END_TEST

/* -- PyTorch's edges ------------------------------------------------------- */

/* Composites of integers, over an empty axis and of a 0-d tensor. */
static int composite_edges(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_gelu(in[0]);
    out[1] = kiln_softmax(in[1], 0);
    out[2] = kiln_log_softmax(in[2], 0);
    out[3] = kiln_log_softmax(in[3], -1);
    return 0;
}

/* Traced and compiled as eagerly, with PyTorch 1.13's values: x.float() first,
 * an empty result, and 1 or 0 for a 0-d tensor. */
START_TEST(test_composite_edges_traced)
{
    const int32_t ints[3] = {46341, 2000, -1291}, ends[2] = {INT32_MIN, INT32_MAX}, three = 3;
    kiln_tensor *in[4] = {kiln_from_data(KILN_I32, 1, (int64_t[]){3}, ints),
                          kiln_from_data(KILN_I32, 1, (int64_t[]){2}, ends),
                          kiln_from_data(KILN_I32, 0, NULL, &three), kiln_zeros(KILN_F64, 2, (int64_t[]){2, 0})};
    static const double want[3][3] = {{46341, 2000, -0.0}, {0, 1}, {0}};
    kiln_jit_options opts[2] = {interp(), kiln_jit_defaults()};
    for (int k = 0; k < 2; k++) {
        kiln_fn *f = kiln_jit("edges", composite_edges, 4, 4, NULL, &opts[k]);
        kiln_tensor *out[4];
        ck_assert_msg(kiln_call(f, in, out) == 0, "%s", kiln_last_error());
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(kiln_dtype_of(out[i]), KILN_F32);
            float got[3];
            ck_assert_int_eq(kiln_copy_to_host(out[i], got, sizeof got), 0);
            for (int64_t e = 0; e < kiln_numel(out[i]); e++)
                ck_assert_msg(got[e] == want[i][e] && !signbit(got[e]) == !signbit(want[i][e]),
                              "output %d element %lld: %g", i, (long long)e, got[e]);
        }
        ck_assert_int_eq(kiln_dtype_of(out[3]), KILN_F64);
        ck_assert_int_eq(kiln_numel(out[3]), 0);
        ck_assert_int_eq(kiln_shape(out[3])[0], 2);
        kiln_fn_free(f);
    }
}
END_TEST

/* Means of integers: whole, by rows and by columns. */
static int integer_means(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_mean(in[0], KILN_ALL, false);
    out[1] = kiln_mean(in[0], 1, false);
    out[2] = kiln_mean(in[0], 0, false);
    return 0;
}

/* They sum in f64 traced and compiled too: 2^62 twice wrapped in i64. */
START_TEST(test_integer_means_do_not_wrap_traced)
{
    kiln_tensor *x = kiln_full(KILN_I64, 2, (int64_t[]){2, 2}, 0x1p62);
    kiln_jit_options opts[2] = {interp(), kiln_jit_defaults()};
    for (int k = 0; k < 2; k++) {
        kiln_fn *f = kiln_jit("means", integer_means, 1, 3, NULL, &opts[k]);
        kiln_tensor *out[3];
        ck_assert_msg(kiln_call(f, &x, out) == 0, "%s", kiln_last_error());
        for (int i = 0; i < 3; i++) {
            float got[2];
            ck_assert_int_eq(kiln_copy_to_host(out[i], got, sizeof got), 0);
            for (int64_t e = 0; e < kiln_numel(out[i]); e++)
                ck_assert_msg(got[e] == 0x1p62f, "%s output %d: %g", kiln_fn_backend(f), i, got[e]);
        }
        kiln_fn_free(f);
    }
}
END_TEST

/* -- Shapes too large ------------------------------------------------------ */

typedef enum { HUGE_CONCAT, HUGE_EXPAND, HUGE_BROADCAST, HUGE_MATMUL } huge_op;

/* One op whose result has more than 2^59 elements, on views of in[0]. */
static int too_large(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const int64_t p58 = INT64_C(1) << 58, p40 = INT64_C(1) << 40;
    kiln_tensor *one = kiln_reshape(in[0], 2, (int64_t[]){1, 1});
    kiln_tensor *col = kiln_expand(one, 2, (int64_t[]){p40, 1}), *row = kiln_expand(one, 2, (int64_t[]){1, p40});
    kiln_tensor *part = kiln_expand(in[0], 1, &p58), *parts[64];
    for (int i = 0; i < 64; i++)
        parts[i] = part;
    switch (*(huge_op *)user) {
    case HUGE_CONCAT: out[0] = kiln_concat(parts, 64, 0); break;
    case HUGE_EXPAND: out[0] = kiln_expand(one, 3, (int64_t[]){1 << 30, 1 << 30, 1 << 30}); break;
    case HUGE_BROADCAST: out[0] = kiln_add(col, row); break;
    case HUGE_MATMUL: out[0] = kiln_matmul(col, row); break;
    }
    return out[0] ? 0 : -1;
}

/* Tracing checks every shape as eager does: a concat whose sizes wrapped
 * once made an empty buffer that the run then copied into. */
START_TEST(test_traced_shapes_too_large_are_the_ops_errors)
{
    static const struct {
        huge_op op;
        const char *needles[2];
    } LARGE[] = {
        {HUGE_CONCAT, {"kiln_concat: ts[0] [288230376151711744] f32", "2^59"}},
        {HUGE_EXPAND, {"kiln_expand: cannot expand [1,1] to [1073741824,1073741824,1073741824]", "2^59"}},
        {HUGE_BROADCAST, {"kiln_add: shapes [1099511627776,1] and [1,1099511627776]", "2^59"}},
        {HUGE_MATMUL, {"kiln_matmul: shapes [1099511627776,1] f32 and [1,1099511627776] f32", "2^59"}},
    };
    kiln_jit_options o = interp();
    o.strict = true;
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){1}), *out = NULL;
    for (size_t i = 0; i < sizeof LARGE / sizeof *LARGE; i++) {
        kiln_fn *f = kiln_jit("too_large", too_large, 1, 1, (void *)&LARGE[i].op, &o);
        kiln_clear_error();
        ck_assert_msg(kiln_call(f, &x, &out) < 0, "case %zu ran", i);
        ck_assert_kiln_error(LARGE[i].needles[0], LARGE[i].needles[1]);
        kiln_fn_free(f);
    }
}
END_TEST

/* Values of 2^61 bytes each: a plan of them is counted without overflow
 * (and would fail to allocate when run). */
static int huge_values(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const int64_t p58 = INT64_C(1) << 58;
    kiln_tensor *b = kiln_add_scalar(kiln_expand(in[0], 1, &p58), 1);
    kiln_tensor *sum = kiln_add(kiln_add(kiln_exp(b), kiln_sin(b)), kiln_add(kiln_cos(b), kiln_tanh(b)));
    out[0] = kiln_sum(sum, KILN_ALL, false);
    return out[0] ? 0 : -1;
}

START_TEST(test_plan_of_values_too_large_to_allocate)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("huge_values", huge_values, 1, 1, NULL, &o);
    kiln_spec spec = {.dtype = KILN_F64, .ndim = 1, .shape = {1}, .device = KILN_CPU};
    ck_assert_int_eq(kiln_fn_precompile(f, &spec, "host"), 0);
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    ck_assert_int_eq(s.peak_bytes, INT64_MAX);
    ck_assert_int_eq(s.eager_peak_bytes, INT64_MAX);
    kiln_fn_free(f);
}
END_TEST

static int occurrences(const char *text, const char *needle)
{
    int n = 0;
    for (const char *at = strstr(text, needle); at; at = strstr(at + 1, needle))
        n++;
    return n;
}

static int fails_silently(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    return 7;
}

/* A failing call's message is its own, traced or run eagerly (after three
 * failed traces): it never embeds the one before. */
START_TEST(test_failed_calls_do_not_nest_messages)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("silent", fails_silently, 1, 1, NULL, &o);
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2}), *out;
    char last[1024] = "";
    for (int i = 0; i < 6; i++) {
        ck_assert_int_lt(kiln_call(f, &x, &out), 0);
        ck_assert_msg(occurrences(kiln_last_error(), "'silent'") == 1, "call %d: %s", i, kiln_last_error());
        if (i >= 4)
            ck_assert_str_eq(kiln_last_error(), last);
        snprintf(last, sizeof last, "%s", kiln_last_error());
    }
    kiln_fn_free(f);
}
END_TEST

/* Code that works eagerly works marked: a call whose trace fails runs the
 * body eagerly at once (it used to fail); after the third failed trace no
 * more are tried. */
static int assigns_temporary(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    kiln_tensor *t = kiln_neg(in[0]); /* eagerly a tensor of its own; traced, a value */
    if (kiln_assign(t, in[0]) < 0)
        return -1;
    out[0] = out[1] = t;
    return 0;
}

START_TEST(test_body_that_keeps_failing_runs_eagerly_loudly)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("assigns", assigns_temporary, 1, 2, NULL, &o);
    kiln_tensor *x = kiln_neg(kiln_ones(KILN_F32, 1, (int64_t[]){2})), *out[2];
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(kiln_call(f, &x, out) == 0, "call %d: %s", i, kiln_last_error());
        ck_assert_str_eq(kiln_last_error(), "");
        assert_same(out[0], x, "an eager call's output");
    }
    ck_assert_int_eq(count(f, EAGER_FALLBACKS), 4);
    ck_assert_int_eq(count(f, TRACES), 3);
    kiln_fn_free(f);
}
END_TEST

/* A failed trace leaves the function usable: the next call traces afresh. */
static int fails_once(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    int *calls = user;
    if ((*calls)++ == 0)
        return -1;
    out[0] = kiln_exp(in[0]);
    return 0;
}

START_TEST(test_failed_trace_then_good_call)
{
    int calls = 0;
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("fails_once", fails_once, 1, 1, &calls, &o);
    kiln_tensor *x = kiln_zeros(KILN_F32, 1, (int64_t[]){3}), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0); /* the trace fails; the body then runs eagerly */
    ck_assert_int_eq(calls, 2);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 3);
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 3);
    ck_assert_int_eq(count(f, TRACES), 2);
    ck_assert_int_eq(count(f, COMPILES), 1);
    kiln_fn_free(f);
}
END_TEST

static kiln_tensor *stash;

static int keeps_tracer(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    stash = kiln_retain(in[0]);
    out[0] = kiln_neg(in[0]);
    return 0;
}

START_TEST(test_tracer_used_after_body_returned)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("keeps_tracer", keeps_tracer, 1, 1, NULL, &o);
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2}), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    kiln_clear_error();
    ck_assert_ptr_null(kiln_add(stash, x));
    ck_assert_kiln_error("kiln_add", "tracer of 'keeps_tracer'", "after its body returned");
    ck_assert(isnan(kiln_item(stash)));
    ck_assert_kiln_error("kiln_item", "cannot read the values");
    ck_assert_int_eq(kiln_print(stash) == 0, 1);
    kiln_release(stash);
    kiln_fn_free(f);
}
END_TEST

/* A body may ask for its own function's state while it is traced: the
 * function's lock is not held then (this used to deadlock). */
static int asks_for_its_stats(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_fn *const *self = user;
    kiln_fn_stats_t s;
    if (kiln_fn_stats(*self, &s) < 0)
        return -1;
    kiln_fn_backend(*self);
    free(kiln_fn_graph_text(*self));
    out[0] = kiln_add_scalar(in[0], (double)s.traces);
    return out[0] ? 0 : -1;
}

START_TEST(test_body_asking_for_its_own_stats)
{
    kiln_fn *f = NULL;
    kiln_jit_options o = interp();
    f = kiln_jit("asks", asks_for_its_stats, 1, 1, &f, &o);
    kiln_tensor *x = kiln_zeros(KILN_F32, 1, (int64_t[]){2}), *out;
    ck_assert_msg(kiln_call(f, &x, &out) == 0, "%s", kiln_last_error());
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 2); /* traces was 1 while tracing */
    ck_assert_int_eq(count(f, TRACES), 1);
    kiln_fn_free(f);
}
END_TEST

/* Traces slowly, and fails to trace inputs of even length (it reads one). */
static int fails_on_even(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    usleep(2000);
    if (kiln_shape(in[0])[0] % 2 == 0 && kiln_item(kiln_sum(in[0], KILN_ALL, false)) > 1e30)
        return -1;
    out[0] = kiln_add_scalar(in[0], 1);
    return out[0] ? 0 : -1;
}

typedef struct {
    kiln_fn *f;
    int64_t first;  /* the lengths this thread calls with */
    int wrong;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    for (int i = 0; i < 12; i++) {
        int64_t n = r->first + i;
        kiln_scope_begin();
        kiln_tensor *x = kiln_zeros(KILN_F32, 1, &n), *out = NULL;
        r->wrong += kiln_call(r->f, &x, &out) != 0 || kiln_shape(out)[0] != n;
        r->wrong += out && kiln_item(kiln_sum(out, KILN_ALL, false)) != (double)n;
        kiln_scope_end();
    }
    return NULL;
}

/* Builds of several signatures in flight at once, some of them failing:
 * each call gets its own signature's result (a failed build used to shift
 * the others' places: wrong shapes, crashes, hangs). */
START_TEST(test_concurrent_builds_with_failures)
{
    kiln_jit_options o = interp();
    o.retrace_limit = 100;
    kiln_fn *f = kiln_jit("fails_on_even", fails_on_even, 1, 1, NULL, &o);
    racer racers[4];
    pthread_t threads[4];
    for (int t = 0; t < 4; t++) {
        racers[t] = (racer){f, 2 + 100 * t, 0}; /* each starts with a failing build, at once */
        pthread_create(&threads[t], NULL, race, &racers[t]);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(threads[t], NULL);
        ck_assert_int_eq(racers[t].wrong, 0);
    }
    kiln_fn_free(f);
}
END_TEST

/* Errors that said something else than what happened. */
START_TEST(test_errors_say_what_happened)
{
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("add_one", add_one, 1, 1, NULL, &o);
    kiln_tensor *arr[1] = {kiln_ones(KILN_F32, 1, (int64_t[]){2})};
    ck_assert_int_lt(kiln_call(f, arr, arr), 0); /* said "in[0] is NULL" */
    ck_assert_kiln_error("kiln_call", "same array");
    ck_assert_ptr_nonnull(arr[0]);
    kiln_fn_free(f);
    kiln_clear_error();
    ck_assert_ptr_null(kiln_jit_slot(NULL, "negated", add_one, 1));
    ck_assert_kiln_error("kiln_jit_slot", "slot");
    o.retrace_limit = INT_MAX; /* said "out of memory": signatures grow as they come */
    o.dynamic = KILN_DYNAMIC_NEVER;
    f = kiln_jit("add_one", add_one, 1, 1, NULL, &o);
    ck_assert_ptr_nonnull(f);
    for (int64_t n = 1; n <= 10; n++) {
        kiln_tensor *x = kiln_ones(KILN_F32, 1, &n), *out;
        ck_assert_msg(kiln_call(f, &x, &out) == 0, "%s", kiln_last_error());
    }
    ck_assert_int_eq(count(f, TRACES), 10);
    if (!kiln_cuda_available()) { /* said "out of memory planning a graph" */
        kiln_spec cuda = {.dtype = KILN_F32, .ndim = 1, .shape = {4}, .device = KILN_CUDA};
        ck_assert_int_lt(kiln_fn_precompile(f, &cuda, "host"), 0);
        ck_assert_kiln_error("kiln_fn_precompile", "CUDA inputs", "no CUDA");
    }
    kiln_fn_free(f);
}
END_TEST

START_TEST(test_bad_arguments)
{
    kiln_jit_options o = interp();
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2}), *out;
    ck_assert_ptr_null(kiln_jit("x", NULL, 1, 1, NULL, &o));
    ck_assert_kiln_error("kiln_jit", "body");
    ck_assert_ptr_null(kiln_jit("x", add_one, -1, 1, NULL, &o));
    ck_assert_kiln_error("kiln_jit", "-1 inputs");
    o.backend = KILN_BACKEND_NVRTC; /* in every build; CUDA's alone */
    kiln_fn *cuda_only = kiln_jit("cuda_only", add_one, 1, 1, NULL, &o);
    ck_assert_ptr_nonnull(cuda_only);
    ck_assert_int_lt(kiln_call(cuda_only, &x, &out), 0);
    ck_assert_kiln_error("'cuda_only' uses the NVRTC backend, which runs on CUDA", "inputs are on the CPU");
    kiln_fn_free(cuda_only);
    o = interp();
    kiln_fn *f = kiln_jit("add_one", add_one, 1, 1, NULL, &o);
    kiln_clear_error();
    ck_assert_int_lt(kiln_call(NULL, &x, &out), 0);
    ck_assert_kiln_error("kiln_call", "f is NULL");
    kiln_clear_error();
    ck_assert_int_lt(kiln_call(f, (kiln_tensor *[]){NULL}, &out), 0);
    ck_assert_kiln_error("kiln_call", "in[0] is NULL");
    ck_assert_int_lt(kiln_call(f, &x, NULL), 0);
    ck_assert_int_lt(kiln_fn_stats(NULL, NULL), 0);
    kiln_fn_free(NULL);
    kiln_fn_free(f);
}
END_TEST

/* -- Modes, marking, nesting, dumps, threads ------------------------------- */

START_TEST(test_jit_off_runs_eagerly)
{
    setenv("KILN_JIT", "0", 1);
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("off", add_one, 1, 1, NULL, &o);
    unsetenv("KILN_JIT");
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2}), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 4);
    ck_assert_int_eq(count(f, TRACES), 0);
    kiln_fn_free(f);
}
END_TEST

static kiln_fn *inner_fn;

static int outer(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *mid;
    if (kiln_call(inner_fn, in, &mid) < 0)
        return -1;
    out[0] = kiln_mul_scalar(mid, 3);
    return 0;
}

START_TEST(test_call_inside_a_traced_body_is_inlined)
{
    kiln_jit_options o = interp();
    inner_fn = kiln_jit("inner", add_one, 1, 1, NULL, &o);
    kiln_fn *f = kiln_jit("outer", outer, 1, 1, NULL, &o);
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2}), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    ck_assert_double_eq(kiln_item(kiln_sum(out, KILN_ALL, false)), 12);
    ck_assert_int_eq(count(inner_fn, TRACES), 0);
    char *text = kiln_fn_graph_text(f);
    ck_assert_ptr_nonnull(strstr(text, "add"));
    free(text);
    kiln_fn_free(f);
    kiln_fn_free(inner_fn);
}
END_TEST

START_TEST(test_dump_writes_graph_before_and_after_passes)
{
    char dir[] = "/tmp/kiln-dump-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    setenv("KILN_DUMP", "graph", 1);
    setenv("KILN_DUMP_DIR", dir, 1);
    kiln_jit_options o = interp();
    kiln_fn *f = kiln_jit("dumped", add_one, 1, 1, NULL, &o);
    unsetenv("KILN_DUMP");
    unsetenv("KILN_DUMP_DIR");
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){2}), *out;
    ck_assert_int_eq(kiln_call(f, &x, &out), 0);
    const char *files[] = {"dumped.0.graph-before.txt", "dumped.0.graph-after.txt",
                           "dumped.0.graph-before.dot", "dumped.0.graph-after.dot"};
    for (int i = 0; i < 4; i++) {
        char path[256], head[16] = "";
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *in = fopen(path, "r");
        ck_assert_msg(in != NULL, "no %s", path);
        ck_assert_ptr_nonnull(fgets(head, sizeof head, in));
        fclose(in);
        ck_assert_ptr_nonnull(strstr(head, i < 2 ? "kiln-graph 1" : "digraph"));
        unlink(path);
    }
    rmdir(dir);
    kiln_fn_free(f);
}
END_TEST

START_TEST(test_stats_describe_the_specialization)
{
    kiln_jit_options o = interp();
    int gelu_case = find_case("gelu");
    kiln_fn *f = kiln_jit("gelu", case_body, 2, 1, &gelu_case, &o);
    kiln_tensor *in[2] = {kiln_ones(KILN_F32, 1, (int64_t[]){1000}), kiln_ones(KILN_F32, 1, (int64_t[]){1000})};
    kiln_tensor *out;
    ck_assert_int_eq(kiln_call(f, in, &out), 0);
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(f, &s), 0);
    ck_assert_int_eq(s.traces, 1);
    ck_assert_int_eq(s.compiles, 1);
    ck_assert_int_ge(s.kernels, 8); /* gelu is 9 elementwise ops eagerly */
    ck_assert_int_ge(s.peak_bytes, 2 * 4000);
    ck_assert(s.compile_ms > 0);
    kiln_fn_free(f);
}
END_TEST

typedef struct {
    kiln_fn *f;
    int failures;
} worker_args;

static void *call_many(void *p)
{
    worker_args *w = p;
    for (int i = 0; i < 200; i++) {
        kiln_scope_begin();
        int64_t n = 1 + i % 4;
        kiln_tensor *x = kiln_full(KILN_F32, 1, &n, i), *out;
        if (kiln_call(w->f, &x, &out) < 0 || kiln_item(kiln_sum(out, KILN_ALL, false)) != (double)n * (i + 1))
            w->failures++;
        kiln_scope_end();
    }
    return NULL;
}

START_TEST(test_calls_from_two_threads)
{
    kiln_jit_options o = interp();
    o.dynamic = KILN_DYNAMIC_NEVER; /* four signatures, whichever thread meets each first */
    kiln_fn *f = kiln_jit("threads", add_one, 1, 1, NULL, &o);
    worker_args args[2] = {{f, 0}, {f, 0}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, call_many, &args[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    ck_assert_int_eq(args[0].failures + args[1].failures, 0);
    ck_assert_int_eq(count(f, TRACES), 4);
    kiln_fn_free(f);
}
END_TEST

static Suite *trace_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *ops = tcase_create("ops");
    tcase_add_checked_fixture(ops, test_scoped_setup, test_scoped_teardown);
    tcase_add_loop_test(ops, test_every_op_traced_matches_eager, 0, (int)(sizeof CASES / sizeof *CASES));
    suite_add_tcase(s, ops);

    TCase *tc = tcase_create("semantics");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_add_test(tc, test_new_signature_retraces_and_old_one_hits);
    tcase_add_test(tc, test_captured_tensor_released_early_stays_alive);
    tcase_add_test(tc, test_retrace_limit_falls_back_eagerly_or_fails_in_strict_mode);
    tcase_add_test(tc, test_precompile_prepares_without_running);
    tcase_add_test(tc, test_captured_tensor_is_read_by_reference);
    tcase_add_test(tc, test_assign_to_captured_tensor_writes_back_every_call);
    tcase_add_test(tc, test_writeback_converts_and_broadcasts);
    tcase_add_test(tc, test_assign_to_a_tensor_made_in_the_body_is_not_written_back);
    tcase_add_test(tc, test_writebacks_read_before_they_write);
    tcase_add_test(tc, test_input_aliasing_an_assigned_capture);
    tcase_add_test(tc, test_random_ops_draw_afresh_each_call);
    tcase_add_loop_test(tc, test_outputs_are_fresh_on_every_call, IDENTITY, TWICE + 1);
    tcase_add_test(tc, test_each_tracing_error_is_distinct);
    tcase_add_test(tc, test_body_that_keeps_failing_runs_eagerly_loudly);
    tcase_add_test(tc, test_failed_trace_then_good_call);
    tcase_add_test(tc, test_tracer_used_after_body_returned);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_body_asking_for_its_own_stats);
    tcase_add_test(tc, test_errors_say_what_happened);
    tcase_add_test(tc, test_concurrent_builds_with_failures);
    tcase_add_test(tc, test_failed_calls_do_not_nest_messages);
    tcase_add_test(tc, test_composite_edges_traced);
    tcase_add_test(tc, test_integer_means_do_not_wrap_traced);
    tcase_add_test(tc, test_traced_shapes_too_large_are_the_ops_errors);
    tcase_add_test(tc, test_plan_of_values_too_large_to_allocate);
    suite_add_tcase(s, tc);

    TCase *modes = tcase_create("modes");
    tcase_add_checked_fixture(modes, test_scoped_setup, test_scoped_teardown);
    tcase_add_test(modes, test_jit_off_runs_eagerly);
    tcase_add_test(modes, test_call_inside_a_traced_body_is_inlined);
    tcase_add_test(modes, test_dump_writes_graph_before_and_after_passes);
    tcase_add_test(modes, test_stats_describe_the_specialization);
    tcase_add_test(modes, test_calls_from_two_threads);
    suite_add_tcase(s, modes);
    return s;
}

KILN_TEST_MAIN(trace_suite)
