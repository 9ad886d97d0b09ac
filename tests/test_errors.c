/* Bad input to every public function: each call fails cleanly (NULL, NaN or a
 * negative status, never a crash) and its message names the function and what
 * was wrong: the operands' shapes, the axis or the dtype. */
#include "test_common.h"

#include <ctype.h>

/* -- Helpers --------------------------------------------------------------- */

/* The number of entries in a literal shape list. */
#define NDIM_OF(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
/* A literal shape, as the (ndim, shape) argument pair kiln takes. */
#define SHAPE(...) NDIM_OF(__VA_ARGS__), (const int64_t[]){__VA_ARGS__}
/* A zero-filled tensor of dtype dt and the listed shape, owned by the scope. */
#define T(dt, ...) make(dt, SHAPE(__VA_ARGS__))

static kiln_tensor *make(kiln_dtype dt, int ndim, const int64_t *shape)
{
    kiln_tensor *t = kiln_zeros(dt, ndim, shape);
    ck_assert_msg(t != NULL, "kiln_zeros failed: %s", kiln_last_error());
    return t;
}

/* True when haystack contains needle, ignoring case ("NULL", "null"). */
static bool contains_ci(const char *haystack, const char *needle)
{
    size_t n = strlen(needle);
    for (; *haystack; haystack++) {
        size_t i = 0;
        while (i < n && tolower((unsigned char)haystack[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return true;
    }
    return false;
}

/* Each check clears the pending error first: a NULL operand keeps an earlier
 * error, so without the clear we could be reading a previous call's message. */

/* call must return NULL with a message containing every needle. */
#define EXPECT_NULL(call, ...)                                          \
    do {                                                                \
        kiln_clear_error();                                             \
        ck_assert_msg((call) == NULL, "%s should fail", #call);         \
        ck_assert_kiln_error(__VA_ARGS__);                              \
    } while (0)

/* call must return a negative status with a message containing every needle. */
#define EXPECT_NEG(call, ...)                                           \
    do {                                                                \
        kiln_clear_error();                                             \
        int rc_ = (call);                                               \
        ck_assert_msg(rc_ < 0, "%s returned %d, not an error", #call, rc_); \
        ck_assert_kiln_error(__VA_ARGS__);                              \
    } while (0)

/* The message must say that an argument was NULL. */
#define ck_assert_says_null()                                           \
    ck_assert_msg(contains_ci(kiln_last_error(), "null"),               \
                  "error \"%s\" does not mention NULL", kiln_last_error())

/* call, given a NULL argument, must return NULL and say so, naming fn. */
#define EXPECT_NULL_ARG(call, fn)                                       \
    do {                                                                \
        EXPECT_NULL(call, fn);                                          \
        ck_assert_says_null();                                          \
    } while (0)

/* Every test body runs in a scope and must leave no tensor alive, so error
 * paths that forget to free what they allocated show up here as well as
 * under LSan and valgrind. */
static int64_t live_at_start;

static void open_scope(void)
{
    live_at_start = kiln_live_tensors();
    kiln_scope_begin();
}

static void close_scope(void)
{
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), live_at_start);
}

/* -- Error state ----------------------------------------------------------- */

/* Composite ops whose first op fails (operands that do not broadcast, an
 * affine operand that does not fit) fail with that op's error, never go on
 * with NULL (a crash) or without the operand; a whole clamp bound outside
 * i32 is refused rather than wrapped. */
START_TEST(test_composite_operand_errors)
{
    open_scope();
    EXPECT_NULL(kiln_mse_loss(T(KILN_F32, 3, 4), T(KILN_F32, 3)), "kiln_mse_loss", "[3,4]", "[3]");
    kiln_tensor *x = T(KILN_F32, 2, 3, 4);
    EXPECT_NULL(kiln_layer_norm_axes(x, 2, T(KILN_F32, 4, 3), NULL, 1e-5), "kiln_layer_norm_axes", "[4,3]");
    EXPECT_NULL(kiln_layer_norm_axes(x, 2, NULL, T(KILN_F32, 2, 3, 4), 1e-5), "kiln_layer_norm_axes", "[2,3,4]");
    EXPECT_NULL(kiln_clamp(T(KILN_I32, 4), -3e9, 3e9), "kiln_clamp", "-3000000000", "i32");
    EXPECT_NULL(kiln_clamp(T(KILN_I32, 4), 0, 3e9), "kiln_clamp", "3000000000", "i32");
    ck_assert_ptr_nonnull(kiln_clamp(T(KILN_I64, 4), -3e9, 3e9));
    ck_assert_ptr_nonnull(kiln_clamp(T(KILN_I32, 4), -3e9 - 0.5, 3e9 + 0.5)); /* fractional: promotes to f32 */
    close_scope();
}
END_TEST

START_TEST(test_clear_error_empties_message)
{
    open_scope();
    kiln_add(T(KILN_F32, 3, 4), T(KILN_F32, 5));
    ck_assert_str_ne(kiln_last_error(), "");
    kiln_clear_error();
    ck_assert_ptr_nonnull(kiln_last_error());
    ck_assert_str_eq(kiln_last_error(), "");
    close_scope();
}
END_TEST

/* The example: the message has the function and both shapes. */
START_TEST(test_message_format_example)
{
    open_scope();
    EXPECT_NULL(kiln_add(T(KILN_F32, 3, 4), T(KILN_F32, 5)), "kiln_add", "[3,4]", "[5]");
    close_scope();
}
END_TEST

/* A nested expression reports its first failure, not the NULL it produced. */
START_TEST(test_null_propagation_keeps_first_error)
{
    open_scope();
    kiln_tensor *a = T(KILN_F32, 3, 4), *b = T(KILN_F32, 5), *c = T(KILN_F32, 3, 4);
    kiln_clear_error();
    ck_assert_ptr_null(kiln_add(kiln_mul(a, b), c));
    ck_assert_kiln_error("kiln_mul", "[3,4]", "[5]");
    ck_assert_msg(strstr(kiln_last_error(), "kiln_add") == NULL,
                  "kiln_add overwrote the first error: \"%s\"", kiln_last_error());

    /* Deeper, and through functions that return an int or a double. */
    kiln_clear_error();
    ck_assert_ptr_null(kiln_exp(kiln_sum(kiln_add(kiln_mul(a, b), c), 0, false)));
    ck_assert_kiln_error("kiln_mul", "[3,4]", "[5]");
    kiln_clear_error();
    ck_assert_int_lt(kiln_assign(c, kiln_mul(a, b)), 0);
    ck_assert_kiln_error("kiln_mul", "[3,4]", "[5]");
    kiln_clear_error();
    ck_assert(isnan(kiln_item(kiln_mul(a, b))));
    ck_assert_kiln_error("kiln_mul", "[3,4]", "[5]");
    close_scope();
}
END_TEST

/* Once the error is cleared, a NULL operand reports itself. */
START_TEST(test_null_operand_after_clear)
{
    open_scope();
    kiln_add(T(KILN_F32, 3, 4), T(KILN_F32, 5));
    kiln_clear_error();
    ck_assert_ptr_null(kiln_add(NULL, T(KILN_F32, 3, 4)));
    ck_assert_kiln_error("kiln_add");
    ck_assert_says_null();
    close_scope();
}
END_TEST

/* A handled error poisons nothing: the next call that succeeds clears it, so
 * a NULL operand then reports itself, and an optional NULL (layer_norm's
 * gamma and beta) means none even while an error is pending. */
START_TEST(test_success_clears_a_handled_error)
{
    open_scope();
    kiln_tensor *x = T(KILN_F32, 3, 4), *bad = T(KILN_F32, 5);
    ck_assert_ptr_null(kiln_add(x, bad));
    ck_assert_msg(kiln_layer_norm(x, NULL, NULL, 1e-5) != NULL, "%s", kiln_last_error());
    ck_assert_str_eq(kiln_last_error(), "");

    ck_assert_ptr_null(kiln_matmul(x, bad));
    ck_assert_ptr_nonnull(kiln_exp(x));
    ck_assert_str_eq(kiln_last_error(), "");
    ck_assert_ptr_null(kiln_neg(NULL));
    ck_assert_kiln_error("kiln_neg: operand a is NULL");

    /* An int or a double returned is a success too. */
    float buf[12];
    ck_assert_ptr_null(kiln_matmul(x, bad));
    ck_assert_int_eq(kiln_copy_to_host(x, buf, sizeof buf), 0);
    ck_assert_str_eq(kiln_last_error(), "");
    ck_assert_ptr_null(kiln_matmul(x, bad));
    ck_assert_int_eq(kiln_assign(x, kiln_scalar(1)), 0);
    ck_assert_str_eq(kiln_last_error(), "");
    close_scope();
}
END_TEST

/* The same failure gives the same message every time: none nests another. */
START_TEST(test_messages_never_nest)
{
    open_scope();
    kiln_tensor *x = T(KILN_F32, 3, 4), *bad = T(KILN_F32, 5);
    ck_assert_ptr_null(kiln_layer_norm(x, bad, NULL, 1e-5));
    char first[1024];
    snprintf(first, sizeof first, "%s", kiln_last_error());
    for (int i = 0; i < 3; i++) {
        ck_assert_ptr_null(kiln_layer_norm(x, bad, NULL, 1e-5));
        ck_assert_str_eq(kiln_last_error(), first);
        ck_assert_ptr_null(kiln_layer_norm(NULL, NULL, NULL, 1e-5));
        ck_assert_str_eq(kiln_last_error(), first); /* the NULL keeps the pending error */
    }
    close_scope();
}
END_TEST

/* -- Queries, ownership and scopes ----------------------------------------- */

START_TEST(test_queries_of_null)
{
    ck_assert_int_eq(kiln_ndim(NULL), -1);
    ck_assert_ptr_null(kiln_shape(NULL));
    ck_assert_ptr_null(kiln_strides(NULL));
    ck_assert_int_eq(kiln_numel(NULL), -1);
    ck_assert_int_eq(kiln_dtype_of(NULL), KILN_F32);
    ck_assert_int_eq(kiln_device_of(NULL), KILN_CPU);
    ck_assert(!kiln_shares_storage(NULL, NULL));
    open_scope();
    kiln_tensor *t = T(KILN_F32, 2);
    ck_assert(!kiln_shares_storage(t, NULL));
    ck_assert(!kiln_shares_storage(NULL, t));
    close_scope();
}
END_TEST

START_TEST(test_dtype_queries_out_of_range)
{
    ck_assert_uint_eq(kiln_dtype_size((kiln_dtype)99), 0);
    ck_assert_uint_eq(kiln_dtype_size((kiln_dtype)-1), 0);
    ck_assert_str_eq(kiln_dtype_name((kiln_dtype)99), "?");
    ck_assert_str_eq(kiln_dtype_name((kiln_dtype)-1), "?");
}
END_TEST

START_TEST(test_ownership_of_null)
{
    int64_t live = kiln_live_tensors();
    ck_assert_ptr_null(kiln_retain(NULL));
    kiln_release(NULL);
    kiln_scope_begin();
    ck_assert_ptr_null(kiln_keep(NULL));
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

/* A stray kiln_scope_end is a user mistake: it must not crash, and scopes
 * must keep working afterwards. */
START_TEST(test_unbalanced_scope_end)
{
    int64_t live = kiln_live_tensors();
    kiln_scope_end();
    kiln_scope_begin();
    T(KILN_F32, 4);
    ck_assert_int_eq(kiln_live_tensors(), live + 1);
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

/* -- Creation -------------------------------------------------------------- */

/* The creation functions that take a shape, with one signature for the table. */
static const double zero_data[16];
static kiln_tensor *make_empty(int n, const int64_t *s) { return kiln_empty(KILN_F32, n, s); }
static kiln_tensor *make_zeros(int n, const int64_t *s) { return kiln_zeros(KILN_F32, n, s); }
static kiln_tensor *make_ones(int n, const int64_t *s) { return kiln_ones(KILN_F32, n, s); }
static kiln_tensor *make_full(int n, const int64_t *s) { return kiln_full(KILN_F32, n, s, 1.0); }
static kiln_tensor *make_rand(int n, const int64_t *s) { return kiln_rand(n, s, 1); }
static kiln_tensor *make_randn(int n, const int64_t *s) { return kiln_randn(n, s, 1); }
static kiln_tensor *make_data(int n, const int64_t *s) { return kiln_from_data(KILN_F64, n, s, zero_data); }

static const struct {
    const char *name;
    kiln_tensor *(*fn)(int ndim, const int64_t *shape);
} creators[] = {
    {"kiln_empty", make_empty}, {"kiln_zeros", make_zeros}, {"kiln_ones", make_ones},
    {"kiln_full", make_full},   {"kiln_rand", make_rand},   {"kiln_randn", make_randn},
    {"kiln_from_data", make_data},
};

START_TEST(test_creation_bad_shape)
{
    const char *name = creators[_i].name;
    kiln_tensor *(*fn)(int, const int64_t *) = creators[_i].fn;
    open_scope();
    EXPECT_NULL_ARG(fn(2, NULL), name);
    /* One dimension more than KILN_MAX_DIMS, each of size 1. */
    EXPECT_NULL(fn(SHAPE(1, 1, 1, 1, 1, 1, 1, 1, 1)), name, "9");
    EXPECT_NULL(fn(-1, (const int64_t[]){2}), name, "-1");
    EXPECT_NULL(fn(SHAPE(3, -2)), name, "-2");
    /* 2^40 * 2^40 elements overflow int64: must be caught, not wrapped. */
    EXPECT_NULL(fn(SHAPE(INT64_C(1) << 40, INT64_C(1) << 40)), name);
    close_scope();
}
END_TEST

START_TEST(test_creation_bad_dtype)
{
    open_scope();
    const int64_t shape[] = {2, 2};
    EXPECT_NULL(kiln_zeros((kiln_dtype)99, 2, shape), "kiln_zeros");
    EXPECT_NULL(kiln_zeros((kiln_dtype)-1, 2, shape), "kiln_zeros");
    EXPECT_NULL(kiln_empty((kiln_dtype)99, 2, shape), "kiln_empty");
    EXPECT_NULL(kiln_ones((kiln_dtype)99, 2, shape), "kiln_ones");
    EXPECT_NULL(kiln_full((kiln_dtype)99, 2, shape, 1.0), "kiln_full");
    EXPECT_NULL(kiln_from_data((kiln_dtype)99, 2, shape, zero_data), "kiln_from_data");
    EXPECT_NULL(kiln_arange(0, 4, 1, (kiln_dtype)99), "kiln_arange");
    close_scope();
}
END_TEST

START_TEST(test_from_data_null_data)
{
    open_scope();
    EXPECT_NULL_ARG(kiln_from_data(KILN_F32, SHAPE(3, 4), NULL), "kiln_from_data");
    close_scope();
}
END_TEST

START_TEST(test_arange_bad_range)
{
    open_scope();
    EXPECT_NULL(kiln_arange(0, 10, 0, KILN_F32), "kiln_arange", "step");
    /* No finite number of elements: an error, not a giant allocation. */
    EXPECT_NULL(kiln_arange(0, INFINITY, 1, KILN_F32), "kiln_arange");
    EXPECT_NULL(kiln_arange(NAN, 10, 1, KILN_F32), "kiln_arange");
    EXPECT_NULL(kiln_arange(0, 10, NAN, KILN_F32), "kiln_arange");
    close_scope();
}
END_TEST

/* -- Data access ----------------------------------------------------------- */

START_TEST(test_copy_to_host_errors)
{
    open_scope();
    float buf[12];
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NEG(kiln_copy_to_host(NULL, buf, sizeof buf), "kiln_copy_to_host");
    ck_assert_says_null();
    EXPECT_NEG(kiln_copy_to_host(t, NULL, sizeof buf), "kiln_copy_to_host");
    ck_assert_says_null();
    /* One byte short of 12 floats. */
    EXPECT_NEG(kiln_copy_to_host(t, buf, sizeof buf - 1), "kiln_copy_to_host", "[3,4]");
    EXPECT_NEG(kiln_copy_to_host(t, buf, 0), "kiln_copy_to_host", "[3,4]");
    close_scope();
}
END_TEST

START_TEST(test_item_errors)
{
    open_scope();
    kiln_clear_error();
    ck_assert(isnan(kiln_item(T(KILN_F32, 3, 4))));
    ck_assert_kiln_error("kiln_item", "[3,4]");
    kiln_clear_error();
    ck_assert(isnan(kiln_item(T(KILN_I64, 0))));
    ck_assert_kiln_error("kiln_item", "[0]");
    kiln_clear_error();
    ck_assert(isnan(kiln_item(NULL)));
    ck_assert_kiln_error("kiln_item");
    ck_assert_says_null();
    close_scope();
}
END_TEST

START_TEST(test_to_device_errors)
{
    open_scope();
    EXPECT_NULL_ARG(kiln_to_device(NULL, KILN_CPU), "kiln_to_device");
    EXPECT_NULL(kiln_to_device(T(KILN_F32, 2), (kiln_device)7), "kiln_to_device");
    close_scope();
}
END_TEST

/* This build has no CUDA, so the copy fails with a message saying why; a
 * build with a GPU may succeed instead, and then the copy must be on it. */
START_TEST(test_to_device_cuda)
{
    open_scope();
    kiln_clear_error();
    kiln_tensor *g = kiln_to_device(T(KILN_F32, 3, 4), KILN_CUDA);
    if (g)
        ck_assert_int_eq(kiln_device_of(g), KILN_CUDA);
    else
        ck_assert_kiln_error("kiln_to_device", "CUDA");
    close_scope();
}
END_TEST

START_TEST(test_print_and_contiguous_null)
{
    open_scope();
    EXPECT_NEG(kiln_print(NULL), "kiln_print");
    ck_assert_says_null();
    EXPECT_NULL_ARG(kiln_contiguous(NULL), "kiln_contiguous");
    close_scope();
}
END_TEST

/* -- Elementwise ----------------------------------------------------------- */

static const struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *);
} binary_ops[] = {
    {"kiln_add", kiln_add}, {"kiln_sub", kiln_sub}, {"kiln_mul", kiln_mul},
    {"kiln_div", kiln_div}, {"kiln_pow", kiln_pow}, {"kiln_maximum", kiln_maximum},
    {"kiln_minimum", kiln_minimum}, {"kiln_eq", kiln_eq}, {"kiln_ne", kiln_ne},
    {"kiln_lt", kiln_lt}, {"kiln_le", kiln_le}, {"kiln_gt", kiln_gt},
    {"kiln_ge", kiln_ge}, {"kiln_matmul", kiln_matmul},
};

START_TEST(test_binary_null_operand)
{
    const char *name = binary_ops[_i].name;
    kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *) = binary_ops[_i].fn;
    open_scope();
    kiln_tensor *a = T(KILN_F32, 3, 3);
    EXPECT_NULL_ARG(fn(NULL, a), name);
    EXPECT_NULL_ARG(fn(a, NULL), name);
    EXPECT_NULL_ARG(fn(NULL, NULL), name);
    close_scope();
}
END_TEST

/* The elementwise binary ops (the table without matmul). */
#define N_ELEMENTWISE_BINARY (sizeof binary_ops / sizeof *binary_ops - 1)

START_TEST(test_binary_shapes_do_not_broadcast)
{
    const char *name = binary_ops[_i].name;
    kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *) = binary_ops[_i].fn;
    open_scope();
    EXPECT_NULL(fn(T(KILN_F32, 3, 4), T(KILN_F32, 5)), name, "[3,4]", "[5]");
    EXPECT_NULL(fn(T(KILN_I32, 2, 3), T(KILN_F64, 3, 2)), name, "[2,3]", "[3,2]");
    EXPECT_NULL(fn(T(KILN_F32, 0), T(KILN_F32, 2)), name, "[0]", "[2]");
    close_scope();
}
END_TEST

/* sub and pow refuse two bools (add and mul mean or and and). */
START_TEST(test_sub_pow_refuse_bool)
{
    open_scope();
    kiln_tensor *p = T(KILN_BOOL, 4), *q = T(KILN_BOOL, 4);
    EXPECT_NULL(kiln_sub(p, q), "kiln_sub", "bool");
    EXPECT_NULL(kiln_pow(p, q), "kiln_pow", "bool");
    close_scope();
}
END_TEST

static const struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *, double);
} scalar_ops[] = {
    {"kiln_add_scalar", kiln_add_scalar}, {"kiln_sub_scalar", kiln_sub_scalar},
    {"kiln_mul_scalar", kiln_mul_scalar}, {"kiln_div_scalar", kiln_div_scalar},
    {"kiln_pow_scalar", kiln_pow_scalar}, {"kiln_maximum_scalar", kiln_maximum_scalar},
    {"kiln_minimum_scalar", kiln_minimum_scalar},
};

START_TEST(test_scalar_null_operand)
{
    open_scope();
    EXPECT_NULL_ARG(scalar_ops[_i].fn(NULL, 2.0), scalar_ops[_i].name);
    close_scope();
}
END_TEST

START_TEST(test_where_null_operand)
{
    open_scope();
    kiln_tensor *c = T(KILN_BOOL, 4), *a = T(KILN_F32, 4);
    EXPECT_NULL_ARG(kiln_where(NULL, a, a), "kiln_where");
    EXPECT_NULL_ARG(kiln_where(c, NULL, a), "kiln_where");
    EXPECT_NULL_ARG(kiln_where(c, a, NULL), "kiln_where");
    close_scope();
}
END_TEST

START_TEST(test_where_cond_not_bool)
{
    open_scope();
    kiln_tensor *a = T(KILN_F32, 4);
    EXPECT_NULL(kiln_where(T(KILN_F32, 4), a, a), "kiln_where", "f32", "bool");
    EXPECT_NULL(kiln_where(T(KILN_I32, 4), a, a), "kiln_where", "i32", "bool");
    close_scope();
}
END_TEST

/* Any one of the three operands can be the odd one out. */
START_TEST(test_where_shapes_do_not_broadcast)
{
    open_scope();
    kiln_tensor *c = T(KILN_BOOL, 3, 4), *a = T(KILN_F32, 3, 4);
    EXPECT_NULL(kiln_where(c, T(KILN_F32, 5), a), "kiln_where", "[3,4]", "[5]");
    EXPECT_NULL(kiln_where(c, a, T(KILN_F32, 2, 4)), "kiln_where", "[3,4]", "[2,4]");
    EXPECT_NULL(kiln_where(T(KILN_BOOL, 7), a, a), "kiln_where", "[7]", "[3,4]");
    close_scope();
}
END_TEST

static const struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *);
} unary_ops[] = {
    {"kiln_neg", kiln_neg},   {"kiln_abs", kiln_abs},       {"kiln_relu", kiln_relu},
    {"kiln_exp", kiln_exp},   {"kiln_log", kiln_log},       {"kiln_sqrt", kiln_sqrt},
    {"kiln_rsqrt", kiln_rsqrt}, {"kiln_tanh", kiln_tanh},   {"kiln_sigmoid", kiln_sigmoid},
    {"kiln_sin", kiln_sin},   {"kiln_cos", kiln_cos},       {"kiln_erf", kiln_erf},
    {"kiln_gelu", kiln_gelu}, {"kiln_silu", kiln_silu},
};

START_TEST(test_unary_null_operand)
{
    open_scope();
    EXPECT_NULL_ARG(unary_ops[_i].fn(NULL), unary_ops[_i].name);
    close_scope();
}
END_TEST

/* neg, abs and relu keep the dtype and so refuse bool (the first three rows). */
START_TEST(test_unary_refuses_bool)
{
    open_scope();
    EXPECT_NULL(unary_ops[_i].fn(T(KILN_BOOL, 2, 2)), unary_ops[_i].name, "bool");
    close_scope();
}
END_TEST

START_TEST(test_cast_errors)
{
    open_scope();
    EXPECT_NULL_ARG(kiln_cast(NULL, KILN_F64), "kiln_cast");
    EXPECT_NULL(kiln_cast(T(KILN_F32, 2), (kiln_dtype)99), "kiln_cast");
    EXPECT_NULL(kiln_cast(T(KILN_F32, 2), (kiln_dtype)-1), "kiln_cast");
    close_scope();
}
END_TEST

/* -- Reductions ------------------------------------------------------------ */

static const struct {
    const char *name;
    kiln_tensor *(*fn)(kiln_tensor *, int, bool);
} reductions[] = {
    {"kiln_sum", kiln_sum}, {"kiln_mean", kiln_mean}, {"kiln_max", kiln_max},
    {"kiln_min", kiln_min}, {"kiln_argmax", kiln_argmax},
};

START_TEST(test_reduction_bad_axis)
{
    const char *name = reductions[_i].name;
    kiln_tensor *(*fn)(kiln_tensor *, int, bool) = reductions[_i].fn;
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(fn(NULL, 0, false), name);
    EXPECT_NULL(fn(t, 7, false), name, "[3,4]", "7");
    EXPECT_NULL(fn(t, -9, true), name, "[3,4]", "-9");
    /* A 0-d tensor has no axis 3; its shape prints as []. */
    EXPECT_NULL(fn(kiln_scalar(1.0), 3, false), name, "[]", "3");
    close_scope();
}
END_TEST

/* An op of one axis given a set (KILN_AXES) says so, rather than print the
 * set's bits as an axis; an op that fails inside itself (max over a set of
 * axes reduces them merged) names itself once. */
START_TEST(test_axis_set_where_one_axis)
{
    open_scope();
    kiln_tensor *values = NULL, *indices = NULL;
    EXPECT_NULL(kiln_cumsum(T(KILN_F32, 2, 3), KILN_AXES(0, 1)), "kiln_cumsum", "KILN_AXES", "[2,3] f32");
    EXPECT_NEG(kiln_topk(T(KILN_F32, 2, 3), 1, KILN_AXES(0, 1), false, &values, &indices), "kiln_topk", "KILN_AXES");
    EXPECT_NULL(kiln_max(T(KILN_F32, 2, 0, 4), KILN_AXES(1, 2), false), "kiln_max", "empty axis");
    ck_assert_msg(!strstr(kiln_last_error(), "kiln_max: kiln_max"), "\"%s\" names kiln_max twice", kiln_last_error());
    close_scope();
}
END_TEST

/* max and min refuse empty axes; an empty result over a non-empty axis is fine. */
START_TEST(test_max_min_empty_axis)
{
    open_scope();
    kiln_tensor *rows0 = T(KILN_F32, 0, 3), *cols0 = T(KILN_I32, 3, 0);
    EXPECT_NULL(kiln_max(rows0, 0, false), "kiln_max", "[0,3]");
    EXPECT_NULL(kiln_min(rows0, 0, true), "kiln_min", "[0,3]");
    EXPECT_NULL(kiln_max(cols0, -1, false), "kiln_max", "[3,0]");
    EXPECT_NULL(kiln_min(cols0, KILN_ALL, false), "kiln_min", "[3,0]");
    kiln_tensor *ok = kiln_max(rows0, 1, false);
    ck_assert_msg(ok != NULL, "max over a size-3 axis failed: %s", kiln_last_error());
    ck_assert_int_eq(kiln_ndim(ok), 1);
    ck_assert_int_eq(kiln_shape(ok)[0], 0);
    close_scope();
}
END_TEST

/* -- Movement -------------------------------------------------------------- */

START_TEST(test_reshape_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(kiln_reshape(NULL, SHAPE(12)), "kiln_reshape");
    EXPECT_NULL_ARG(kiln_reshape(t, 2, NULL), "kiln_reshape");
    EXPECT_NULL(kiln_reshape(t, SHAPE(5, 3)), "kiln_reshape", "[3,4]", "[5,3]");
    EXPECT_NULL(kiln_reshape(t, SHAPE(-1, -1)), "kiln_reshape", "[3,4]", "-1");
    EXPECT_NULL(kiln_reshape(t, SHAPE(-2, -6)), "kiln_reshape", "[3,4]");
    EXPECT_NULL(kiln_reshape(t, SHAPE(-1, 5)), "kiln_reshape", "[3,4]");
    EXPECT_NULL(kiln_reshape(t, SHAPE(12, 1, 1, 1, 1, 1, 1, 1, 1)), "kiln_reshape", "9");
    EXPECT_NULL(kiln_reshape(t, -1, (const int64_t[]){12}), "kiln_reshape", "-1");
    /* -1 beside a 0 could be any size. */
    EXPECT_NULL(kiln_reshape(T(KILN_F32, 0, 4), SHAPE(0, -1)), "kiln_reshape", "[0,4]");
    close_scope();
}
END_TEST

START_TEST(test_permute_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(kiln_permute(NULL, (const int[]){1, 0}), "kiln_permute");
    EXPECT_NULL_ARG(kiln_permute(t, NULL), "kiln_permute");
    EXPECT_NULL(kiln_permute(t, (const int[]){0, 0}), "kiln_permute", "[3,4]");
    EXPECT_NULL(kiln_permute(t, (const int[]){1, -3}), "kiln_permute", "[3,4]");
    EXPECT_NULL(kiln_permute(t, (const int[]){0, 2}), "kiln_permute", "[3,4]");
    /* -1 is axis 1, so this repeats it. */
    EXPECT_NULL(kiln_permute(t, (const int[]){1, -1}), "kiln_permute", "[3,4]");
    close_scope();
}
END_TEST

START_TEST(test_transpose_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(kiln_transpose(NULL, 0, 1), "kiln_transpose");
    EXPECT_NULL(kiln_transpose(t, 5, 0), "kiln_transpose", "[3,4]", "5");
    EXPECT_NULL(kiln_transpose(t, 0, -7), "kiln_transpose", "[3,4]", "-7");
    close_scope();
}
END_TEST

START_TEST(test_expand_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 2, 3);
    EXPECT_NULL_ARG(kiln_expand(NULL, SHAPE(2, 3)), "kiln_expand");
    EXPECT_NULL_ARG(kiln_expand(t, 2, NULL), "kiln_expand");
    EXPECT_NULL(kiln_expand(t, SHAPE(4, 3)), "kiln_expand", "[2,3]", "[4,3]");
    /* broadcast_to cannot drop dimensions. */
    EXPECT_NULL(kiln_expand(t, SHAPE(3)), "kiln_expand", "[2,3]", "[3]");
    /* -1 keeps a size, and a new leading axis has none to keep. */
    EXPECT_NULL(kiln_expand(T(KILN_F32, 3), SHAPE(-1, 3)), "kiln_expand", "[3]");
    EXPECT_NULL(kiln_expand(t, SHAPE(1, 1, 1, 1, 1, 1, 1, 2, 3)), "kiln_expand", "9");
    EXPECT_NULL(kiln_expand(t, -1, (const int64_t[]){3}), "kiln_expand", "-1");
    close_scope();
}
END_TEST

START_TEST(test_slice_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(kiln_slice(NULL, 0, 0, 1, 1), "kiln_slice");
    EXPECT_NULL(kiln_slice(t, 0, 0, 3, 0), "kiln_slice", "step");
    EXPECT_NULL(kiln_slice(t, 5, 0, 1, 1), "kiln_slice", "[3,4]", "5");
    EXPECT_NULL(kiln_slice(t, -3, 0, 1, 1), "kiln_slice", "[3,4]", "-3");
    close_scope();
}
END_TEST

START_TEST(test_concat_errors)
{
    open_scope();
    kiln_tensor *a = T(KILN_F32, 2, 3);
    EXPECT_NULL_ARG(kiln_concat(NULL, 2, 0), "kiln_concat");
    /* With no tensors there is no dtype or shape to give the result. */
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){a}, 0, 0), "kiln_concat");
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){a}, -1, 0), "kiln_concat");
    EXPECT_NULL_ARG(kiln_concat((kiln_tensor *const[]){a, NULL}, 2, 0), "kiln_concat");
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){a, T(KILN_F32, 2, 4)}, 2, 0),
                "kiln_concat", "[2,3]", "[2,4]");
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){a, a, T(KILN_F32, 3)}, 3, 0),
                "kiln_concat", "[2,3]", "[3]");
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){a, a}, 2, 5), "kiln_concat", "[2,3]", "5");
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){a, a}, 2, -3), "kiln_concat", "[2,3]", "-3");
    /* 0-d tensors have no axis to join along. */
    kiln_tensor *s = kiln_scalar(1.0);
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){s, s}, 2, 0), "kiln_concat", "[]");
    close_scope();
}
END_TEST

START_TEST(test_squeeze_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(kiln_squeeze(NULL, 0), "kiln_squeeze");
    EXPECT_NULL(kiln_squeeze(t, 0), "kiln_squeeze", "[3,4]");
    EXPECT_NULL(kiln_squeeze(t, -1), "kiln_squeeze", "[3,4]");
    EXPECT_NULL(kiln_squeeze(t, 5), "kiln_squeeze", "[3,4]", "5");
    close_scope();
}
END_TEST

START_TEST(test_unsqueeze_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(kiln_unsqueeze(NULL, 0), "kiln_unsqueeze");
    /* The result has 3 axes, so positions -3..2 are valid. */
    EXPECT_NULL(kiln_unsqueeze(t, 5), "kiln_unsqueeze", "[3,4]", "5");
    EXPECT_NULL(kiln_unsqueeze(t, -4), "kiln_unsqueeze", "[3,4]", "-4");
    /* An 8-d tensor cannot gain a ninth axis. */
    kiln_tensor *full = T(KILN_F32, 1, 1, 1, 1, 1, 1, 1, 1);
    EXPECT_NULL(kiln_unsqueeze(full, 0), "kiln_unsqueeze", "[1,1,1,1,1,1,1,1]");
    close_scope();
}
END_TEST

/* -- Linear algebra -------------------------------------------------------- */

START_TEST(test_matmul_errors)
{
    open_scope();
    EXPECT_NULL(kiln_matmul(T(KILN_F32, 3, 4), T(KILN_F32, 5, 6)), "kiln_matmul", "[3,4]", "[5,6]");
    EXPECT_NULL(kiln_matmul(T(KILN_F32, 3), T(KILN_F32, 4)), "kiln_matmul", "[3]", "[4]");
    EXPECT_NULL(kiln_matmul(T(KILN_F64, 2, 3, 4), T(KILN_F64, 3, 4, 5)),
                "kiln_matmul", "[2,3,4]", "[3,4,5]");
    EXPECT_NULL(kiln_matmul(T(KILN_BOOL, 2, 2), T(KILN_BOOL, 2, 2)), "kiln_matmul", "bool");
    /* numpy.matmul refuses 0-d operands. */
    EXPECT_NULL(kiln_matmul(kiln_scalar(2.0), T(KILN_F32, 2, 2)), "kiln_matmul", "[]");
    close_scope();
}
END_TEST

/* -- Composites ------------------------------------------------------------ */

START_TEST(test_softmax_errors)
{
    open_scope();
    kiln_tensor *t = T(KILN_F32, 3, 4);
    EXPECT_NULL_ARG(kiln_softmax(NULL, 0), "kiln_softmax");
    EXPECT_NULL_ARG(kiln_log_softmax(NULL, 0), "kiln_log_softmax");
    EXPECT_NULL(kiln_softmax(t, 5), "kiln_softmax", "[3,4]", "5");
    EXPECT_NULL(kiln_log_softmax(t, -3), "kiln_log_softmax", "[3,4]", "-3");
    close_scope();
}
END_TEST

/* Composites are built from other ops, but the message must still name the
 * function the user called. */
START_TEST(test_layer_norm_errors)
{
    open_scope();
    kiln_tensor *x = T(KILN_F32, 3, 4), *bad = T(KILN_F32, 5);
    EXPECT_NULL_ARG(kiln_layer_norm(NULL, NULL, NULL, 1e-5), "kiln_layer_norm");
    EXPECT_NULL(kiln_layer_norm(x, bad, NULL, 1e-5), "kiln_layer_norm", "[3,4]", "[5]");
    EXPECT_NULL(kiln_layer_norm(x, NULL, bad, 1e-5), "kiln_layer_norm", "[3,4]", "[5]");
    /* gamma and beta may be NULL: that is not an error. */
    kiln_clear_error();
    ck_assert_msg(kiln_layer_norm(x, NULL, NULL, 1e-5) != NULL, "%s", kiln_last_error());
    close_scope();
}
END_TEST

/* -- In place -------------------------------------------------------------- */

START_TEST(test_assign_errors)
{
    open_scope();
    kiln_tensor *dst = T(KILN_F32, 3, 4);
    EXPECT_NEG(kiln_assign(NULL, dst), "kiln_assign");
    ck_assert_says_null();
    EXPECT_NEG(kiln_assign(dst, NULL), "kiln_assign");
    ck_assert_says_null();
    EXPECT_NEG(kiln_assign(dst, T(KILN_F32, 5)), "kiln_assign", "[3,4]", "[5]");
    /* src broadcasts to dst's shape, never the other way round. */
    EXPECT_NEG(kiln_assign(T(KILN_F32, 4), dst), "kiln_assign", "[4]", "[3,4]");
    close_scope();
}
END_TEST

/* -- Shape arithmetic ------------------------------------------------------ */

/* A zero broadcast to shape: a view of any size, holding one element. */
static kiln_tensor *zero_view(int ndim, const int64_t *shape)
{
    const int64_t ones[KILN_MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 1};
    kiln_tensor *t = kiln_expand(make(KILN_F32, ndim, ones), ndim, shape);
    ck_assert_msg(t != NULL, "%s", kiln_last_error());
    return t;
}
#define VIEW(...) zero_view(SHAPE(__VA_ARGS__))
#define P58 (INT64_C(1) << 58)
#define P40 (INT64_C(1) << 40)

/* 64 parts of 2^58 elements sum to 2^64, which wrapped to an empty result
 * that the parts were then copied into. */
START_TEST(test_concat_size_overflow)
{
    open_scope();
    kiln_tensor *part = VIEW(P58), *parts[64];
    for (int i = 0; i < 64; i++)
        parts[i] = part;
    EXPECT_NULL(kiln_concat(parts, 64, 0), "kiln_concat", "[288230376151711744] f32", "2^59");
    kiln_tensor *rows = VIEW(2, P58);
    EXPECT_NULL(kiln_concat((kiln_tensor *const[]){rows, rows, rows}, 3, 1), "kiln_concat",
                "[2,288230376151711744] f32", "axis 1", "2^59");
    close_scope();
}
END_TEST

/* Sizes near INT64_MAX: errors (or, for a split, one piece), never a
 * signed overflow or a run of 2^31 steps. */
START_TEST(test_operator_size_overflow)
{
    open_scope();
    kiln_tensor *pieces[4];
    ck_assert_int_eq(kiln_split(T(KILN_F32, 5, 3), INT64_MAX, 0, pieces, 4), 1);
    ck_assert_int_eq(kiln_shape(pieces[0])[0], 5);
    kiln_release(pieces[0]);
    const int64_t huge[2] = {INT64_MAX, INT64_MAX};
    EXPECT_NULL(kiln_pad(T(KILN_F32, 2, 3), 2, huge, KILN_PAD_CONSTANT, 0), "kiln_pad", "[2,3] f32", "2^59");
    EXPECT_NULL(kiln_repeat(T(KILN_F32, 2, 3), 2, huge), "kiln_repeat", "[2,3] f32", "2^59");
    EXPECT_NULL(kiln_repeat(T(KILN_F32, 0, 3), 2, huge), "kiln_repeat", "[0,3] f32", "2^59");
    EXPECT_NULL(kiln_adaptive_avg_pool2d(T(KILN_F32, 1, 1, 5, 5), INT32_MAX, 1), "kiln_adaptive_avg_pool2d",
                "2147483647x1", "65536");
    EXPECT_NULL(kiln_adaptive_avg_pool2d(T(KILN_F32, 0, 1, INT64_C(1) << 50, 5), 65536, 7), "kiln_adaptive_avg_pool2d",
                "[0,1,1125899906842624,5]");
    close_scope();
}
END_TEST

START_TEST(test_expand_size_overflow)
{
    open_scope();
    EXPECT_NULL(kiln_expand(T(KILN_F32, 1), SHAPE(1 << 30, 1 << 30, 1 << 30)), "kiln_expand", "[1] ",
                "[1073741824,1073741824,1073741824]", "2^59");
    /* An empty shape's other sizes are bounded too: its strides multiply them. */
    EXPECT_NULL(kiln_expand(T(KILN_F32, 1, 1, 1), SHAPE(0, P40, P40)), "kiln_expand", "2^59");
    EXPECT_NULL(kiln_empty(KILN_F32, SHAPE(0, P40, P40)), "kiln_empty", "[0,1099511627776,1099511627776]");
    close_scope();
}
END_TEST

START_TEST(test_broadcast_size_overflow)
{
    open_scope();
    kiln_tensor *col = VIEW(P40, 1), *row = VIEW(1, P40);
    EXPECT_NULL(kiln_add(col, row), "kiln_add", "[1099511627776,1] and [1,1099511627776]", "2^59");
    EXPECT_NULL(kiln_where(T(KILN_BOOL, 1), col, row), "kiln_where", "[1,1099511627776]", "2^59");
    close_scope();
}
END_TEST

START_TEST(test_matmul_size_overflow)
{
    open_scope();
    EXPECT_NULL(kiln_matmul(VIEW(P40, 1), VIEW(1, P40)), "kiln_matmul", "[1099511627776,1] f32",
                "[1,1099511627776] f32", "2^59");
    /* The batch axes broadcast to 2^80 matrices, each empty. */
    EXPECT_NULL(kiln_matmul(VIEW(P40, 1, 0, 1), VIEW(1, P40, 1, 5)), "kiln_matmul", "[1099511627776,1,0,1] f32",
                "[1,1099511627776,1,5] f32", "2^59");
    close_scope();
}
END_TEST

/* -- Suite ----------------------------------------------------------------- */

#define COUNT(table) ((int)(sizeof table / sizeof *table))

static Suite *errors_suite(void)
{
    Suite *s = suite_create("errors");

    TCase *state = tcase_create("state");
    tcase_add_test(state, test_clear_error_empties_message);
    tcase_add_test(state, test_message_format_example);
    tcase_add_test(state, test_null_propagation_keeps_first_error);
    tcase_add_test(state, test_null_operand_after_clear);
    tcase_add_test(state, test_success_clears_a_handled_error);
    tcase_add_test(state, test_messages_never_nest);
    suite_add_tcase(s, state);

    TCase *basics = tcase_create("queries");
    tcase_add_test(basics, test_queries_of_null);
    tcase_add_test(basics, test_dtype_queries_out_of_range);
    tcase_add_test(basics, test_ownership_of_null);
    tcase_add_test(basics, test_unbalanced_scope_end);
    suite_add_tcase(s, basics);

    TCase *creation = tcase_create("creation");
    tcase_add_loop_test(creation, test_creation_bad_shape, 0, COUNT(creators));
    tcase_add_test(creation, test_creation_bad_dtype);
    tcase_add_test(creation, test_from_data_null_data);
    tcase_add_test(creation, test_arange_bad_range);
    suite_add_tcase(s, creation);

    TCase *data = tcase_create("data");
    tcase_add_test(data, test_copy_to_host_errors);
    tcase_add_test(data, test_item_errors);
    tcase_add_test(data, test_to_device_errors);
    tcase_add_test(data, test_to_device_cuda);
    tcase_add_test(data, test_print_and_contiguous_null);
    suite_add_tcase(s, data);

    TCase *elementwise = tcase_create("elementwise");
    tcase_add_loop_test(elementwise, test_binary_null_operand, 0, COUNT(binary_ops));
    tcase_add_loop_test(elementwise, test_binary_shapes_do_not_broadcast, 0,
                        (int)N_ELEMENTWISE_BINARY);
    tcase_add_test(elementwise, test_sub_pow_refuse_bool);
    tcase_add_loop_test(elementwise, test_scalar_null_operand, 0, COUNT(scalar_ops));
    tcase_add_test(elementwise, test_where_null_operand);
    tcase_add_test(elementwise, test_where_cond_not_bool);
    tcase_add_test(elementwise, test_where_shapes_do_not_broadcast);
    tcase_add_loop_test(elementwise, test_unary_null_operand, 0, COUNT(unary_ops));
    tcase_add_loop_test(elementwise, test_unary_refuses_bool, 0, 3);
    tcase_add_test(elementwise, test_cast_errors);
    suite_add_tcase(s, elementwise);

    TCase *reduce = tcase_create("reductions");
    tcase_add_loop_test(reduce, test_reduction_bad_axis, 0, COUNT(reductions));
    tcase_add_test(reduce, test_max_min_empty_axis);
    tcase_add_test(reduce, test_axis_set_where_one_axis);
    suite_add_tcase(s, reduce);

    TCase *movement = tcase_create("movement");
    tcase_add_test(movement, test_reshape_errors);
    tcase_add_test(movement, test_permute_errors);
    tcase_add_test(movement, test_transpose_errors);
    tcase_add_test(movement, test_expand_errors);
    tcase_add_test(movement, test_slice_errors);
    tcase_add_test(movement, test_concat_errors);
    tcase_add_test(movement, test_squeeze_errors);
    tcase_add_test(movement, test_unsqueeze_errors);
    suite_add_tcase(s, movement);

    TCase *overflow = tcase_create("shape arithmetic");
    tcase_add_test(overflow, test_concat_size_overflow);
    tcase_add_test(overflow, test_operator_size_overflow);
    tcase_add_test(overflow, test_expand_size_overflow);
    tcase_add_test(overflow, test_broadcast_size_overflow);
    tcase_add_test(overflow, test_matmul_size_overflow);
    suite_add_tcase(s, overflow);

    TCase *other = tcase_create("other");
    tcase_add_test(other, test_matmul_errors);
    tcase_add_test(other, test_softmax_errors);
    tcase_add_test(other, test_layer_norm_errors);
    tcase_add_test(other, test_composite_operand_errors);
    tcase_add_test(other, test_assign_errors);
    suite_add_tcase(s, other);

    return s;
}

KILN_TEST_MAIN(errors_suite)
