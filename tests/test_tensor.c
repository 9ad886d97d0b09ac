/* Tensors themselves: accessors, views that share storage, contiguity,
 * reference counts and scopes, printing, and thread safety. */
#include "test_common.h"

#include <pthread.h>
#include <unistd.h>

/* -- Helpers --------------------------------------------------------------- */

/* The number of entries in a literal shape list. */
#define NDIM_OF(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
/* A literal shape, as the (ndim, shape) argument pair kiln takes. */
#define SHAPE(...) NDIM_OF(__VA_ARGS__), (const int64_t[]){__VA_ARGS__}
/* 0, 1, 2, ... in dtype dt with the listed shape. */
#define IOTA(dt, ...) iota(dt, SHAPE(__VA_ARGS__))

/* Fails the test with kiln's message when t is NULL; returns t. */
static kiln_tensor *ok(kiln_tensor *t)
{
    ck_assert_msg(t != NULL, "kiln failed: %s", kiln_last_error());
    return t;
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

static kiln_tensor *iota(kiln_dtype dt, int ndim, const int64_t *shape)
{
    kiln_tensor *flat = ok(kiln_arange(0, (double)numel_of(ndim, shape), 1, dt));
    return ok(kiln_reshape(flat, ndim, shape));
}

/* Asserts t's values, read row-major through kiln_copy_to_host, equal want.
 * (Frees before asserting, so a failure leaks nothing under CK_FORK=no.) */
static void ck_assert_values(const kiln_tensor *t, const double *want, int64_t n)
{
    ck_assert_int_eq(kiln_numel(t), n);
    double *got = test_values(t);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (got[i] != want[i])
            bad = i;
    double got_bad = bad >= 0 ? got[bad] : 0;
    free(got);
    ck_assert_msg(bad < 0, "element %lld: got %g, want %g", (long long)bad, got_bad,
                  bad >= 0 ? want[bad] : 0);
}

/* Asserts that got, an array of ndim entries (a shape or strides), holds the
 * listed values. */
#define ck_assert_int64s(got, ndim, ...)                                      \
    do {                                                                      \
        const int64_t want_[] = {__VA_ARGS__};                                \
        ck_assert_int_eq((ndim), (int)(sizeof want_ / sizeof *want_));        \
        for (size_t k_ = 0; k_ < sizeof want_ / sizeof *want_; k_++)          \
            ck_assert_msg((got)[k_] == want_[k_], "entry %zu: got %lld, want %lld", \
                          k_, (long long)(got)[k_], (long long)want_[k_]);    \
    } while (0)
#define ck_assert_shape(t, ...) ck_assert_int64s(kiln_shape(t), kiln_ndim(t), __VA_ARGS__)
#define ck_assert_strides(t, ...) ck_assert_int64s(kiln_strides(t), kiln_ndim(t), __VA_ARGS__)

/* Asserts that view shares base's storage and that making it allocated no
 * storage: the byte counter is still where it was before the view. */
static void ck_assert_view_of(const kiln_tensor *view, const kiln_tensor *base, int64_t bytes_before)
{
    ck_assert_ptr_nonnull(view);
    ck_assert(kiln_shares_storage(view, base));
    ck_assert(kiln_shares_storage(base, view));
    ck_assert_int_eq(kiln_live_bytes(), bytes_before);
}

/* Writes 100, 101, ... into t in its row-major order, through kiln_assign. */
static void write_through(kiln_tensor *t)
{
    kiln_tensor *src = ok(kiln_add_scalar(iota(KILN_F64, kiln_ndim(t), kiln_shape(t)), 100));
    ck_assert_msg(kiln_assign(t, src) == 0, "kiln_assign: %s", kiln_last_error());
}

/* Every test that uses a scope must leave the tensor and byte counters where
 * they started: nothing leaks, views included. */
static int64_t tensors_at_start, bytes_at_start;

static void open_scope(void)
{
    tensors_at_start = kiln_live_tensors();
    bytes_at_start = kiln_live_bytes();
    kiln_scope_begin();
}

static void close_scope(void)
{
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), tensors_at_start);
    ck_assert_int_eq(kiln_live_bytes(), bytes_at_start);
}

/* -- Accessors ------------------------------------------------------------- */

START_TEST(test_accessors_of_contiguous_tensor)
{
    open_scope();
    kiln_tensor *t = ok(kiln_zeros(KILN_F64, SHAPE(2, 3, 4)));
    ck_assert_int_eq(kiln_ndim(t), 3);
    ck_assert_shape(t, 2, 3, 4);
    ck_assert_strides(t, 12, 4, 1);
    ck_assert_int_eq(kiln_numel(t), 24);
    ck_assert_int_eq(kiln_dtype_of(t), KILN_F64);
    ck_assert_int_eq(kiln_device_of(t), KILN_CPU);
    close_scope();
}
END_TEST

START_TEST(test_accessors_of_0d_and_empty)
{
    open_scope();
    kiln_tensor *s = ok(kiln_scalar(2.5));
    ck_assert_int_eq(kiln_ndim(s), 0);
    ck_assert_int_eq(kiln_numel(s), 1);
    ck_assert_int_eq(kiln_dtype_of(s), KILN_F32);
    ck_assert_double_eq(kiln_item(s), 2.5);

    kiln_tensor *e = ok(kiln_zeros(KILN_I32, SHAPE(0, 3)));
    ck_assert_shape(e, 0, 3);
    ck_assert_int_eq(kiln_numel(e), 0);
    int32_t unused[1];
    ck_assert_int_eq(kiln_copy_to_host(e, unused, 0), 0); /* nothing to copy, and enough room */
    close_scope();
}
END_TEST

START_TEST(test_dtype_sizes_and_names)
{
    const kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL};
    const size_t sizes[] = {4, 8, 4, 8, 1};
    const char *names[] = {"f32", "f64", "i32", "i64", "bool"};
    for (int i = 0; i < 5; i++) {
        ck_assert_uint_eq(kiln_dtype_size(dts[i]), sizes[i]);
        ck_assert_str_eq(kiln_dtype_name(dts[i]), names[i]);
    }
}
END_TEST

/* from_data copies: changing the caller's array afterwards changes nothing. */
START_TEST(test_from_data_copies)
{
    open_scope();
    int32_t data[] = {1, -2, 3, 4, 5, 6};
    kiln_tensor *t = ok(kiln_from_data(KILN_I32, SHAPE(2, 3), data));
    data[0] = 99;
    ck_assert_values(t, (const double[]){1, -2, 3, 4, 5, 6}, 6);

    bool flags[] = {true, false, true};
    kiln_tensor *b = ok(kiln_from_data(KILN_BOOL, SHAPE(3), flags));
    ck_assert_int_eq(kiln_dtype_of(b), KILN_BOOL);
    ck_assert_values(b, (const double[]){1, 0, 1}, 3);
    close_scope();
}
END_TEST

START_TEST(test_creation_values)
{
    open_scope();
    ck_assert_values(ok(kiln_ones(KILN_I64, SHAPE(2, 2))), (const double[]){1, 1, 1, 1}, 4);
    /* full converts as kiln_cast does: toward zero. */
    ck_assert_values(ok(kiln_full(KILN_I32, SHAPE(3), -2.9)), (const double[]){-2, -2, -2}, 3);
    ck_assert_values(ok(kiln_arange(0, 1, 0.25, KILN_F64)), (const double[]){0, 0.25, 0.5, 0.75}, 4);
    ck_assert_values(ok(kiln_arange(5, 0, -2, KILN_I64)), (const double[]){5, 3, 1}, 3);
    ck_assert_int_eq(kiln_numel(ok(kiln_arange(0, 5, -1, KILN_F32))), 0);
    close_scope();
}
END_TEST

/* rand is in [0,1), repeats for a seed, and differs between seeds. */
START_TEST(test_rand_is_seeded)
{
    open_scope();
    kiln_tensor *a = ok(kiln_rand(SHAPE(1000), 7)), *b = ok(kiln_rand(SHAPE(1000), 7));
    kiln_tensor *c = ok(kiln_rand(SHAPE(1000), 8));
    double *va = test_values(a), *vb = test_values(b), *vc = test_values(c);
    int out_of_range = 0, differ_same_seed = 0, same_other_seed = 0;
    for (int i = 0; i < 1000; i++) {
        out_of_range += !(va[i] >= 0 && va[i] < 1);
        differ_same_seed += va[i] != vb[i];
        same_other_seed += va[i] == vc[i];
    }
    free(va), free(vb), free(vc);
    ck_assert_int_eq(out_of_range, 0);
    ck_assert_int_eq(differ_same_seed, 0);
    ck_assert_int_lt(same_other_seed, 10);
    close_scope();
}
END_TEST

START_TEST(test_item_of_one_element)
{
    open_scope();
    ck_assert_double_eq(kiln_item(ok(kiln_full(KILN_I64, SHAPE(1, 1), 42))), 42);
    ck_assert_double_eq(kiln_item(ok(kiln_full(KILN_BOOL, SHAPE(1), 3))), 1);
    close_scope();
}
END_TEST

/* to_device onto the device t is already on gives t itself, not a copy. */
START_TEST(test_to_device_same_device_is_same_tensor)
{
    open_scope();
    kiln_tensor *t = IOTA(KILN_F32, 4);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *same = ok(kiln_to_device(t, KILN_CPU));
    ck_assert_ptr_eq(same, t);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
    close_scope();
}
END_TEST

/* -- Views share storage and copy nothing ---------------------------------- */

START_TEST(test_reshape_of_contiguous_is_view)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 2, 6);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *v = kiln_reshape(base, SHAPE(3, 4));
    ck_assert_view_of(v, base, bytes);
    ck_assert_shape(v, 3, 4);
    ck_assert_strides(v, 4, 1);

    kiln_tensor *inferred = kiln_reshape(base, SHAPE(-1, 3));
    ck_assert_view_of(inferred, base, bytes);
    ck_assert_shape(inferred, 4, 3);

    /* Row-major order is unchanged, so base reads back 100..111 in order. */
    write_through(v);
    double want[12];
    for (int i = 0; i < 12; i++)
        want[i] = 100 + i;
    ck_assert_values(base, want, 12);
    close_scope();
}
END_TEST

/* permute {2,0,1}: view[i,j,k] is base[j,k,i]. */
START_TEST(test_permute_is_view)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 2, 3, 4);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *v = kiln_permute(base, (const int[]){2, 0, 1});
    ck_assert_view_of(v, base, bytes);
    ck_assert_shape(v, 4, 2, 3);
    ck_assert_strides(v, 1, 12, 4);

    double want[24], want_base[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) {
                want[i * 6 + j * 3 + k] = j * 12 + k * 4 + i;
                want_base[j * 12 + k * 4 + i] = 100 + i * 6 + j * 3 + k;
            }
    ck_assert_values(v, want, 24);
    write_through(v);
    ck_assert_values(base, want_base, 24);
    close_scope();
}
END_TEST

START_TEST(test_transpose_is_view)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_I64, 3, 4);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *v = kiln_transpose(base, -1, 0);
    ck_assert_view_of(v, base, bytes);
    ck_assert_shape(v, 4, 3);
    ck_assert_strides(v, 1, 4);
    ck_assert_values(v, (const double[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, 12);

    write_through(v); /* v[i,j] = 100 + 3i + j lands in base[j,i] */
    ck_assert_values(base, (const double[]){100, 103, 106, 109, 101, 104, 107, 110,
                                            102, 105, 108, 111}, 12);
    close_scope();
}
END_TEST

/* Broadcast axes get stride 0; writing the base shows through the view (an
 * expanded view aliases elements, so it is the base we write). */
START_TEST(test_expand_is_view_with_zero_strides)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 3, 1);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *v = kiln_expand(base, SHAPE(2, 3, 4));
    ck_assert_view_of(v, base, bytes);
    ck_assert_shape(v, 2, 3, 4);
    ck_assert_strides(v, 0, 1, 0);

    kiln_tensor *kept = kiln_expand(base, SHAPE(-1, 4)); /* -1 keeps the 3 */
    ck_assert_view_of(kept, base, bytes);
    ck_assert_shape(kept, 3, 4);
    ck_assert_strides(kept, 1, 0);

    write_through(base);
    double want[24];
    for (int i = 0; i < 24; i++)
        want[i] = 100 + (i / 4) % 3;
    ck_assert_values(v, want, 24);
    close_scope();
}
END_TEST

START_TEST(test_slice_is_view)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F64, 4, 5);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *odd_cols = kiln_slice(base, 1, 1, 5, 2); /* base[:, 1:5:2] */
    ck_assert_view_of(odd_cols, base, bytes);
    ck_assert_shape(odd_cols, 4, 2);
    ck_assert_strides(odd_cols, 5, 2);
    ck_assert_values(odd_cols, (const double[]){1, 3, 6, 8, 11, 13, 16, 18}, 8);

    write_through(odd_cols); /* only columns 1 and 3 change */
    ck_assert_values(base, (const double[]){0, 100, 2, 101, 4, 5, 102, 7, 103, 9,
                                            10, 104, 12, 105, 14, 15, 106, 17, 107, 19}, 20);
    close_scope();
}
END_TEST

/* Python's a[-1:-5:-1] on 4 rows is every row backwards: a negative stride. */
START_TEST(test_slice_negative_step_and_clamping)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_I32, 4, 2);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *rev = kiln_slice(base, 0, -1, -5, -1);
    ck_assert_view_of(rev, base, bytes);
    ck_assert_shape(rev, 4, 2);
    ck_assert_strides(rev, -2, 1);
    ck_assert_values(rev, (const double[]){6, 7, 4, 5, 2, 3, 0, 1}, 8);

    /* Out-of-range bounds clamp, as in Python. */
    kiln_tensor *all = ok(kiln_slice(base, -1, -100, 100, 1));
    ck_assert_shape(all, 4, 2);
    kiln_tensor *none = ok(kiln_slice(base, 0, 3, 1, 1));
    ck_assert_shape(none, 0, 2);

    /* a[::-2**63] in Python: the last row alone. */
    kiln_tensor *last = ok(kiln_slice(base, 0, -1, INT64_MIN, INT64_MIN));
    ck_assert_shape(last, 1, 2);
    ck_assert_values(last, (const double[]){6, 7}, 2);
    ck_assert_shape(ok(kiln_slice(base, 0, 0, 4, INT64_MIN)), 0, 2);
    close_scope();
}
END_TEST

START_TEST(test_squeeze_is_view)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 3, 1, 4);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *v = kiln_squeeze(base, -2);
    ck_assert_view_of(v, base, bytes);
    ck_assert_shape(v, 3, 4);
    ck_assert_strides(v, 4, 1);

    kiln_tensor *ones = IOTA(KILN_F32, 1, 3, 1);
    kiln_tensor *all = ok(kiln_squeeze(ones, KILN_ALL));
    ck_assert(kiln_shares_storage(all, ones));
    ck_assert_shape(all, 3);

    write_through(v);
    double want[12];
    for (int i = 0; i < 12; i++)
        want[i] = 100 + i;
    ck_assert_values(base, want, 12);
    close_scope();
}
END_TEST

START_TEST(test_unsqueeze_is_view)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 3, 4);
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *front = kiln_unsqueeze(base, 0);
    ck_assert_view_of(front, base, bytes);
    ck_assert_shape(front, 1, 3, 4);
    kiln_tensor *mid = kiln_unsqueeze(base, 1);
    ck_assert_view_of(mid, base, bytes);
    ck_assert_shape(mid, 3, 1, 4);
    kiln_tensor *back = kiln_unsqueeze(base, -1); /* -1 appends */
    ck_assert_view_of(back, base, bytes);
    ck_assert_shape(back, 3, 4, 1);

    write_through(mid);
    double want[12];
    for (int i = 0; i < 12; i++)
        want[i] = 100 + i;
    ck_assert_values(base, want, 12);
    close_scope();
}
END_TEST

/* -- Contiguity ------------------------------------------------------------ */

START_TEST(test_contiguous_of_contiguous_is_same_tensor)
{
    open_scope();
    kiln_tensor *t = IOTA(KILN_F32, 4, 5);
    int64_t bytes = kiln_live_bytes();
    ck_assert_ptr_eq(ok(kiln_contiguous(t)), t);
    /* A run of whole rows is row-major contiguous too. */
    kiln_tensor *rows = ok(kiln_slice(t, 0, 1, 3, 1));
    ck_assert_ptr_eq(ok(kiln_contiguous(rows)), rows);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
    close_scope();
}
END_TEST

START_TEST(test_contiguous_of_strided_is_copy)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 3, 4);
    kiln_tensor *t = ok(kiln_transpose(base, 0, 1));
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *c = ok(kiln_contiguous(t));
    ck_assert(!kiln_shares_storage(c, base));
    ck_assert_int_ge(kiln_live_bytes(), bytes + 12 * 4);
    ck_assert_shape(c, 4, 3);
    ck_assert_strides(c, 3, 1);
    ck_assert_values(c, (const double[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, 12);

    kiln_tensor *wide = ok(kiln_contiguous(ok(kiln_expand(IOTA(KILN_I32, 3), SHAPE(2, 3)))));
    ck_assert_strides(wide, 3, 1);
    ck_assert_values(wide, (const double[]){0, 1, 2, 0, 1, 2}, 6);
    close_scope();
}
END_TEST

/* base is [3,4]; its transpose t is [4,3] with strides {1,4}. Splitting t's
 * first axis needs no copy (numpy views too): strides {2,1,4}. */
START_TEST(test_reshape_of_transpose_splitting_an_axis_is_view)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 3, 4);
    kiln_tensor *t = ok(kiln_transpose(base, 0, 1));
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *v = kiln_reshape(t, SHAPE(2, 2, 3));
    ck_assert_view_of(v, base, bytes);
    ck_assert_strides(v, 2, 1, 4);
    ck_assert_values(v, (const double[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, 12);

    kiln_tensor *with_one = kiln_reshape(t, SHAPE(4, 1, 3));
    ck_assert_view_of(with_one, base, bytes);
    close_scope();
}
END_TEST

/* Flattening a transpose cannot be expressed with strides: a copy. */
START_TEST(test_reshape_of_transpose_flattening_copies)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 3, 4);
    kiln_tensor *t = ok(kiln_transpose(base, 0, 1));
    kiln_tensor *flat = ok(kiln_reshape(t, SHAPE(12)));
    ck_assert(!kiln_shares_storage(flat, base));
    ck_assert_values(flat, (const double[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, 12);

    /* The copy is independent: writing it leaves base alone. */
    write_through(flat);
    ck_assert_values(base, (const double[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 12);
    close_scope();
}
END_TEST

/* Columns 0:3 of a [4,6] tensor: rows can be split (a view) but not merged. */
START_TEST(test_reshape_of_column_slice)
{
    open_scope();
    kiln_tensor *base = IOTA(KILN_F32, 4, 6);
    kiln_tensor *cols = ok(kiln_slice(base, 1, 0, 3, 1));
    int64_t bytes = kiln_live_bytes();
    kiln_tensor *split = kiln_reshape(cols, SHAPE(2, 2, 3));
    ck_assert_view_of(split, base, bytes);
    ck_assert_strides(split, 12, 6, 1);

    kiln_tensor *flat = ok(kiln_reshape(cols, SHAPE(-1)));
    ck_assert(!kiln_shares_storage(flat, base));
    ck_assert_values(flat, (const double[]){0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20}, 12);

    write_through(split); /* lands in base's first three columns only */
    double want[24];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 6; c++)
            want[r * 6 + c] = c < 3 ? 100 + r * 3 + c : r * 6 + c;
    ck_assert_values(base, want, 24);
    close_scope();
}
END_TEST

/* -- Reference counts ------------------------------------------------------ */

START_TEST(test_retain_release_counts)
{
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    kiln_tensor *t = ok(kiln_zeros(KILN_F64, SHAPE(10)));
    ck_assert_int_eq(kiln_live_tensors(), tensors + 1);
    ck_assert_int_ge(kiln_live_bytes(), bytes + 80);

    ck_assert_ptr_eq(kiln_retain(t), t);
    kiln_release(t); /* one reference left: still usable */
    ck_assert_int_eq(kiln_live_tensors(), tensors + 1);
    ck_assert_int_eq(kiln_numel(t), 10);
    ck_assert_values(t, (const double[]){0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 10);

    kiln_release(t);
    ck_assert_int_eq(kiln_live_tensors(), tensors);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
}
END_TEST

/* A view keeps its storage alive after the base's last reference is gone. */
START_TEST(test_view_outlives_released_base)
{
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    kiln_tensor *flat = ok(kiln_arange(0, 20, 1, KILN_F32));
    kiln_tensor *base = ok(kiln_reshape(flat, SHAPE(4, 5)));
    kiln_release(flat);
    kiln_tensor *v = ok(kiln_slice(base, 0, 2, 4, 1));
    kiln_release(base);
    ck_assert_int_gt(kiln_live_bytes(), bytes);
    /* Churn the allocator so freed storage would likely be overwritten. */
    kiln_tensor *junk = ok(kiln_full(KILN_F32, SHAPE(4, 5), -1));
    ck_assert_values(v, (const double[]){10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 10);
    kiln_release(junk);
    kiln_release(v);
    ck_assert_int_eq(kiln_live_tensors(), tensors);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
}
END_TEST

/* -- Scopes ---------------------------------------------------------------- */

START_TEST(test_scope_releases_what_it_made)
{
    open_scope();
    kiln_tensor *x = IOTA(KILN_F32, 8);
    ok(kiln_add(kiln_mul(x, x), kiln_exp(x)));
    ok(kiln_transpose(IOTA(KILN_I64, 2, 3), 0, 1));
    ck_assert_int_gt(kiln_live_tensors(), tensors_at_start);
    close_scope();
}
END_TEST

/* keep moves a tensor one scope out: it survives the inner end, not the outer. */
START_TEST(test_keep_moves_to_enclosing_scope)
{
    open_scope();
    int64_t tensors = kiln_live_tensors();
    kiln_scope_begin();
    kiln_tensor *t = IOTA(KILN_F32, 3);
    ck_assert_ptr_eq(kiln_keep(t), t);
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), tensors + 1);
    ck_assert_values(t, (const double[]){0, 1, 2}, 3);
    close_scope();
}
END_TEST

/* Kept at each level, a tensor reaches the caller, who releases it. */
START_TEST(test_keep_through_nested_scopes_to_caller)
{
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    kiln_tensor *t;
    kiln_scope_begin();
    kiln_scope_begin();
    t = kiln_keep(kiln_mul_scalar(IOTA(KILN_F64, 3), 2));
    kiln_scope_end();
    kiln_keep(t);
    kiln_scope_end();
    ck_assert_values(t, (const double[]){0, 2, 4}, 3);
    kiln_release(t);
    ck_assert_int_eq(kiln_live_tensors(), tensors);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
}
END_TEST

/* The caller's tensors and extra references are not the scope's to release. */
START_TEST(test_scope_leaves_unowned_references)
{
    int64_t tensors = kiln_live_tensors();
    kiln_tensor *mine = ok(kiln_ones(KILN_F32, SHAPE(2)));
    kiln_tensor *retained;
    kiln_scope_begin();
    ck_assert_ptr_eq(kiln_keep(mine), mine); /* not owned by the scope: unchanged */
    retained = kiln_retain(ok(kiln_zeros(KILN_I32, SHAPE(2))));
    kiln_scope_end();
    ck_assert_values(mine, (const double[]){1, 1}, 2);
    ck_assert_values(retained, (const double[]){0, 0}, 2);
    kiln_release(mine);
    kiln_release(retained);
    ck_assert_int_eq(kiln_live_tensors(), tensors);
}
END_TEST

/* A kept view survives the scope that released its base. */
START_TEST(test_kept_view_of_scoped_base)
{
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    kiln_scope_begin();
    kiln_tensor *v = kiln_keep(ok(kiln_transpose(IOTA(KILN_I32, 2, 2), 0, 1)));
    kiln_scope_end();
    ck_assert_values(v, (const double[]){0, 2, 1, 3}, 4);
    kiln_release(v);
    ck_assert_int_eq(kiln_live_tensors(), tensors);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
}
END_TEST

static int negate(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    (void)user;
    out[0] = kiln_neg(in[0]);
    return out[0] ? 0 : -1;
}

/* One rule for every tensor handed out, kiln_call's outputs included: a
 * scope owns it, and releasing it before the scope ends takes it out of the
 * scope (it used to be released twice, corrupting the heap later). */
START_TEST(test_release_inside_a_scope_takes_it_out)
{
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = KILN_BACKEND_INTERP;
    kiln_fn *f = kiln_jit("negate", negate, 1, 1, NULL, &o);
    kiln_scope_begin();
    kiln_tensor *x = IOTA(KILN_F32, 3), *y, *sum = ok(kiln_add(x, x));
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(kiln_call(f, &x, &y), 0);
        kiln_release(y);
    }
    kiln_tensor *kept = kiln_retain(sum); /* two references: the scope's and this one */
    kiln_release(kept);                   /* this one; the scope's stays */
    kiln_release(sum);                    /* the last: the scope lets go of it */
    kiln_scope_end();
    kiln_clear_error();
    kiln_fn_free(f);
    ck_assert_str_eq(kiln_last_error(), "");
    ck_assert_int_eq(kiln_live_tensors(), tensors);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
}
END_TEST

/* A cast to the same dtype gives the scope a second reference to one
 * tensor: releasing both early leaves the scope nothing to release twice. */
START_TEST(test_release_both_scope_references)
{
    int64_t tensors = kiln_live_tensors();
    kiln_scope_begin();
    kiln_tensor *x = IOTA(KILN_F64, 3), *y = ok(kiln_cast(x, KILN_F64));
    ck_assert_ptr_eq(x, y);
    kiln_release(y);
    kiln_release(x);
    kiln_scope_end();
    ck_assert_int_eq(kiln_live_tensors(), tensors);
}
END_TEST

/* Debug builds keep released headers poisoned for a while: a release too
 * many is an error with a message, not heap corruption. */
START_TEST(test_release_of_a_dead_tensor_is_an_error)
{
#ifdef NDEBUG
    return; /* release builds free headers at once: a second release is undefined */
#else
    kiln_tensor *t = ok(kiln_ones(KILN_F32, SHAPE(2)));
    kiln_release(t);
    kiln_clear_error();
    kiln_release(t);
    ck_assert_kiln_error("kiln_release", "released already");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_add(t, t));
    ck_assert_kiln_error("kiln_add", "released already");
    kiln_scope_begin();
    kiln_tensor *owned = ok(kiln_zeros(KILN_F32, SHAPE(2)));
    kiln_retain(owned);
    kiln_release(owned);
    kiln_release(owned); /* the scope's reference, taken out of the scope */
    kiln_clear_error();
    kiln_scope_end();
    ck_assert_str_eq(kiln_last_error(), "");
#endif
}
END_TEST

/* The requirement, verbatim: "10^5 nested-expression evaluations
 * inside scopes leave the live tensor and byte counters where they started". */
START_TEST(test_many_scoped_expressions_leave_counters)
{
    kiln_tensor *x = ok(kiln_from_data(KILN_F32, SHAPE(4), (const float[]){0, 0.5f, 1, 2}));
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    for (int i = 0; i < 100000; i++) {
        kiln_scope_begin();
        kiln_tensor *y = kiln_add(kiln_mul(x, x), kiln_exp(x));
        if (!y)
            ck_abort_msg("iteration %d: %s", i, kiln_last_error());
        if (i == 0)
            ck_assert_double_eq_tol(kiln_item(kiln_slice(y, 0, 3, 4, 1)), 4 + exp(2.0), 1e-4);
        kiln_scope_end();
    }
    ck_assert_int_eq(kiln_live_tensors(), tensors);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
    kiln_release(x);
}
END_TEST

/* -- Printing -------------------------------------------------------------- */

/* Runs kiln_print(t) with stdout sent to a temporary file; returns
 * kiln_print's result and stores the start of what it printed in text. */
static int print_to_buffer(const kiln_tensor *t, char *text, size_t size)
{
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    ck_assert_int_ge(saved, 0);
    dup2(fileno(tmp), STDOUT_FILENO);
    int rc = kiln_print(t);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);

    rewind(tmp);
    size_t used = fread(text, 1, size - 1, tmp);
    text[used] = '\0';
    fclose(tmp);
    return rc;
}

/* Room for everything these tests print: elided tensors stay short. */
#define PRINT_MAX 8192

/* Prints t and asserts success and that the text contains each needle. */
#define ck_assert_prints(t, ...)                                              \
    do {                                                                      \
        char text_[PRINT_MAX];                                                \
        ck_assert_int_eq(print_to_buffer((t), text_, sizeof text_), 0);       \
        const char *needles_[] = {__VA_ARGS__};                               \
        for (size_t i_ = 0; i_ < sizeof needles_ / sizeof *needles_; i_++)    \
            ck_assert_msg(strstr(text_, needles_[i_]) != NULL,                \
                          "printed \"%s\" lacks \"%s\"", text_, needles_[i_]); \
    } while (0)

/* PyTorch prints whole floats as "0." and others with four decimals:
 * tensor([[0., 1., 2.],\n        [3., 4., 5.]]) and tensor([0.0000, 0.2500]). */
START_TEST(test_print_f32)
{
    open_scope();
    ck_assert_prints(IOTA(KILN_F32, 2, 3), "tensor(", "[0., 1., 2.]", "[3., 4., 5.]");
    ck_assert_prints(ok(kiln_arange(0, 0.5, 0.25, KILN_F32)), "tensor([0.0000, 0.2500])");
    close_scope();
}
END_TEST

/* Like PyTorch, the default dtypes (f32, i64, bool) print no dtype suffix
 * and the others do. */
START_TEST(test_print_dtype_suffix)
{
    open_scope();
    ck_assert_prints(ok(kiln_arange(1, 3, 1, KILN_I32)), "tensor([1, 2], dtype=");
    const kiln_dtype defaults[] = {KILN_F32, KILN_I64, KILN_BOOL};
    for (int i = 0; i < 3; i++) {
        char text[PRINT_MAX];
        ck_assert_int_eq(print_to_buffer(ok(kiln_ones(defaults[i], SHAPE(2))), text, sizeof text), 0);
        ck_assert_msg(!strstr(text, "dtype"), "%s printed \"%s\"", kiln_dtype_name(defaults[i]), text);
    }
    close_scope();
}
END_TEST

START_TEST(test_print_i64_and_bool)
{
    open_scope();
    ck_assert_prints(ok(kiln_arange(1, 4, 1, KILN_I64)), "tensor([1, 2, 3])");
    bool flags[] = {true, false};
    ck_assert_prints(ok(kiln_from_data(KILN_BOOL, SHAPE(2), flags)), "True", "False");
    close_scope();
}
END_TEST

/* A view prints in its logical order, not its storage order. */
START_TEST(test_print_transposed_view)
{
    open_scope();
    ck_assert_prints(ok(kiln_transpose(IOTA(KILN_I64, 2, 2), 0, 1)), "[0, 2]", "[1, 3]");
    close_scope();
}
END_TEST

START_TEST(test_print_0d_and_empty)
{
    open_scope();
    char text[PRINT_MAX];
    ck_assert_int_eq(print_to_buffer(ok(kiln_scalar(2.5)), text, sizeof text), 0);
    ck_assert_msg(strstr(text, "tensor(2.5") && !strchr(text, '['), "0-d printed \"%s\"", text);
    ck_assert_prints(ok(kiln_zeros(KILN_F32, SHAPE(0))), "tensor([]");
    close_scope();
}
END_TEST

/* Large tensors elide their middle: the ends print, the middle does not. */
START_TEST(test_print_large_elides)
{
    open_scope();
    char text[PRINT_MAX];
    ck_assert_int_eq(print_to_buffer(ok(kiln_arange(0, 10000, 1, KILN_I64)), text, sizeof text), 0);
    ck_assert_msg(strstr(text, "...") && strstr(text, "9999") && strstr(text, " 1,"),
                  "printed \"%s\"", text);
    ck_assert_msg(!strstr(text, "5000"), "middle not elided: \"%s\"", text);
    ck_assert_prints(IOTA(KILN_F32, 100, 100), "...");
    close_scope();
}
END_TEST

/* -- Threads --------------------------------------------------------------- */

typedef struct {
    char seen_at_start[256]; /* kiln_last_error() when the thread began */
    char own_error[256];     /* the message after its own failing call */
} error_probe;

static void *provoke_error(void *arg)
{
    error_probe *p = arg;
    snprintf(p->seen_at_start, sizeof p->seen_at_start, "%s", kiln_last_error());
    kiln_tensor *a = kiln_zeros(KILN_F32, SHAPE(2, 3));
    kiln_tensor *b = kiln_zeros(KILN_F32, SHAPE(4, 5));
    kiln_tensor *r = kiln_matmul(a, b);
    snprintf(p->own_error, sizeof p->own_error, "%s", kiln_last_error());
    kiln_release(r);
    kiln_release(a);
    kiln_release(b);
    return NULL;
}

START_TEST(test_errors_are_thread_local)
{
    kiln_tensor *a = ok(kiln_zeros(KILN_F32, SHAPE(3, 4)));
    kiln_tensor *b = ok(kiln_zeros(KILN_F32, SHAPE(5)));
    kiln_clear_error();
    ck_assert_ptr_null(kiln_add(a, b));

    error_probe probe = {{0}, {0}};
    pthread_t thread;
    ck_assert_int_eq(pthread_create(&thread, NULL, provoke_error, &probe), 0);
    pthread_join(thread, NULL);

    ck_assert_str_eq(probe.seen_at_start, "");
    ck_assert_msg(strstr(probe.own_error, "kiln_matmul"), "thread saw \"%s\"", probe.own_error);
    ck_assert_kiln_error("kiln_add", "[3,4]", "[5]");
    ck_assert_msg(!strstr(kiln_last_error(), "kiln_matmul"), "main saw \"%s\"", kiln_last_error());
    kiln_release(a);
    kiln_release(b);
}
END_TEST

typedef struct {
    int id;
    int failures;
    char first_failure[256];
} worker;

static void note_failure(worker *w, const char *what, double got, double want)
{
    if (w->failures++ == 0)
        snprintf(w->first_failure, sizeof w->first_failure, "thread %d, %s: got %.17g, want %.17g (%s)",
                 w->id, what, got, want, kiln_last_error());
}

/* sum(x*x + x) over 64 doubles, checked against the same sum in C. */
static void check_small_expression(worker *w, int iter)
{
    double data[64], want = 0;
    for (int i = 0; i < 64; i++) {
        data[i] = w->id * 1000 + iter + i;
        want += data[i] * data[i] + data[i];
    }
    kiln_tensor *x = kiln_from_data(KILN_F64, SHAPE(64), data);
    kiln_tensor *sq = kiln_mul(x, x), *y = kiln_add(sq, x), *s = kiln_sum(y, KILN_ALL, false);
    double got = kiln_item(s);
    if (got != want)
        note_failure(w, "sum(x*x + x)", got, want);
    kiln_release(s), kiln_release(y), kiln_release(sq), kiln_release(x);
}

/* An integer matmul checked entry by entry against loops in C. */
static void check_matmul(worker *w, int iter)
{
    int32_t a[6 * 5], b[5 * 4];
    for (int i = 0; i < 30; i++)
        a[i] = (i * 7 + iter + w->id) % 11 - 5;
    for (int i = 0; i < 20; i++)
        b[i] = (i * 3 + iter) % 9 - 4;
    kiln_tensor *ta = kiln_from_data(KILN_I32, SHAPE(6, 5), a);
    kiln_tensor *tb = kiln_from_data(KILN_I32, SHAPE(5, 4), b);
    kiln_tensor *c = kiln_matmul(ta, tb);
    int32_t got[24] = {0};
    if (kiln_copy_to_host(c, got, sizeof got) != 0)
        note_failure(w, "matmul copy", 0, 0);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) {
            int32_t want = 0;
            for (int k = 0; k < 5; k++)
                want += a[i * 5 + k] * b[k * 4 + j];
            if (got[i * 4 + j] != want)
                note_failure(w, "matmul", got[i * 4 + j], want);
        }
    kiln_release(c), kiln_release(tb), kiln_release(ta);
}

/* A 2^18-element op, large enough to want the thread pool while the other
 * thread may hold it. */
static void check_large_op(worker *w)
{
    kiln_tensor *x = kiln_full(KILN_F32, SHAPE(1 << 18), w->id + 1);
    kiln_tensor *y = kiln_mul_scalar(x, 2), *s = kiln_sum(y, KILN_ALL, false);
    double want = 2.0 * (w->id + 1) * (1 << 18);
    double got = kiln_item(s);
    if (got != want)
        note_failure(w, "sum(2x) of 2^18", got, want);
    kiln_release(s), kiln_release(y), kiln_release(x);
}

static void *run_worker(void *arg)
{
    worker *w = arg;
    for (int iter = 0; iter < 200; iter++) {
        check_small_expression(w, iter);
        check_matmul(w, iter);
        if (iter % 20 == 0)
            check_large_op(w);
    }
    return NULL;
}

/* Two threads computing on their own tensors at once get right answers. */
START_TEST(test_concurrent_ops_on_two_threads)
{
    int64_t tensors = kiln_live_tensors(), bytes = kiln_live_bytes();
    worker workers[2] = {{.id = 1}, {.id = 2}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&threads[i], NULL, run_worker, &workers[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(workers[i].failures == 0, "%d failures, first: %s",
                      workers[i].failures, workers[i].first_failure);
    ck_assert_int_eq(kiln_live_tensors(), tensors);
    ck_assert_int_eq(kiln_live_bytes(), bytes);
}
END_TEST

/* -- Large ops through the thread pool ------------------------------------- */

#define LARGE_N (1 << 20)
#define PIECE 1000 /* not a multiple of any vector width, so pieces misalign */

/* Host copies of large tensors; static so that a failing assertion, which
 * jumps out of the test, leaves nothing allocated. */
static float host_a[LARGE_N], host_b[LARGE_N], host_c[LARGE_N];

typedef kiln_tensor *(*elementwise_fn)(kiln_tensor *x, kiln_tensor *y);

static kiln_tensor *mul_add(kiln_tensor *x, kiln_tensor *y) { return kiln_add(kiln_mul(x, y), y); }
static kiln_tensor *exp_only(kiln_tensor *x, kiln_tensor *y) { (void)y; return kiln_exp(x); }

/* Asserts f over 2^20 elements at once equals, bit for bit, f applied piece
 * by piece to slices small enough to run on one thread: the split must not
 * show in the results. */
static void ck_assert_same_in_pieces(elementwise_fn f)
{
    kiln_tensor *x = ok(kiln_rand(SHAPE(LARGE_N), 1)), *y = ok(kiln_rand(SHAPE(LARGE_N), 2));
    float *whole = host_a, *pieces = host_b;
    ck_assert_int_eq(kiln_copy_to_host(ok(f(x, y)), whole, sizeof host_a), 0);
    for (int64_t off = 0; off < LARGE_N; off += PIECE) {
        int64_t end = off + PIECE < LARGE_N ? off + PIECE : LARGE_N;
        kiln_scope_begin();
        kiln_tensor *p = ok(f(kiln_slice(x, 0, off, end, 1), kiln_slice(y, 0, off, end, 1)));
        ck_assert_int_eq(kiln_copy_to_host(p, pieces + off, (size_t)(end - off) * sizeof(float)), 0);
        kiln_scope_end();
    }
    for (int64_t i = 0; i < LARGE_N; i++)
        if (memcmp(&pieces[i], &whole[i], sizeof(float)) != 0)
            ck_abort_msg("element %lld: whole %.9g, in pieces %.9g", (long long)i, whole[i], pieces[i]);
}

START_TEST(test_large_arithmetic_matches_pieces)
{
    open_scope();
    ck_assert_same_in_pieces(mul_add);
    close_scope();
}
END_TEST

START_TEST(test_large_exp_matches_pieces)
{
    open_scope();
    ck_assert_same_in_pieces(exp_only);
    close_scope();
}
END_TEST

/* A large op on a transposed (strided) operand, checked against C. */
START_TEST(test_large_strided_op_matches_c)
{
    open_scope();
    enum { N = 1024 }; /* N * N == LARGE_N */
    kiln_tensor *a = ok(kiln_rand(SHAPE(N, N), 3)), *b = ok(kiln_rand(SHAPE(N, N), 4));
    ck_assert_int_eq(kiln_copy_to_host(a, host_a, sizeof host_a), 0);
    ck_assert_int_eq(kiln_copy_to_host(b, host_b, sizeof host_b), 0);
    kiln_tensor *c = ok(kiln_sub(ok(kiln_transpose(a, 0, 1)), b));
    ck_assert_int_eq(kiln_copy_to_host(c, host_c, sizeof host_c), 0);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            float want = host_a[j * N + i] - host_b[i * N + j];
            if (host_c[i * N + j] != want)
                ck_abort_msg("[%d,%d]: got %.9g, want %.9g", i, j, host_c[i * N + j], want);
        }
    close_scope();
}
END_TEST

/* f32 sums accumulate in f64: the total matches C's f64 sum to f32 rounding. */
START_TEST(test_large_sum_matches_c)
{
    open_scope();
    kiln_tensor *x = ok(kiln_rand(SHAPE(LARGE_N), 5));
    ck_assert_int_eq(kiln_copy_to_host(x, host_a, sizeof host_a), 0);
    double want = 0;
    for (int64_t i = 0; i < LARGE_N; i++)
        want += host_a[i];
    ck_assert_double_eq_tol(kiln_item(ok(kiln_sum(x, KILN_ALL, false))), want, want * 1e-7);
    close_scope();
}
END_TEST

/* -- Suite ----------------------------------------------------------------- */

static Suite *tensor_suite(void)
{
    Suite *s = suite_create("tensor");

    TCase *basics = tcase_create("basics");
    tcase_add_test(basics, test_accessors_of_contiguous_tensor);
    tcase_add_test(basics, test_accessors_of_0d_and_empty);
    tcase_add_test(basics, test_dtype_sizes_and_names);
    tcase_add_test(basics, test_from_data_copies);
    tcase_add_test(basics, test_creation_values);
    tcase_add_test(basics, test_rand_is_seeded);
    tcase_add_test(basics, test_item_of_one_element);
    tcase_add_test(basics, test_to_device_same_device_is_same_tensor);
    suite_add_tcase(s, basics);

    TCase *views = tcase_create("views");
    tcase_add_test(views, test_reshape_of_contiguous_is_view);
    tcase_add_test(views, test_permute_is_view);
    tcase_add_test(views, test_transpose_is_view);
    tcase_add_test(views, test_expand_is_view_with_zero_strides);
    tcase_add_test(views, test_slice_is_view);
    tcase_add_test(views, test_slice_negative_step_and_clamping);
    tcase_add_test(views, test_squeeze_is_view);
    tcase_add_test(views, test_unsqueeze_is_view);
    tcase_add_test(views, test_contiguous_of_contiguous_is_same_tensor);
    tcase_add_test(views, test_contiguous_of_strided_is_copy);
    tcase_add_test(views, test_reshape_of_transpose_splitting_an_axis_is_view);
    tcase_add_test(views, test_reshape_of_transpose_flattening_copies);
    tcase_add_test(views, test_reshape_of_column_slice);
    suite_add_tcase(s, views);

    TCase *ownership = tcase_create("ownership");
    tcase_set_timeout(ownership, 120); /* 10^5 scoped expressions, maybe under valgrind */
    tcase_add_test(ownership, test_retain_release_counts);
    tcase_add_test(ownership, test_view_outlives_released_base);
    tcase_add_test(ownership, test_scope_releases_what_it_made);
    tcase_add_test(ownership, test_keep_moves_to_enclosing_scope);
    tcase_add_test(ownership, test_keep_through_nested_scopes_to_caller);
    tcase_add_test(ownership, test_scope_leaves_unowned_references);
    tcase_add_test(ownership, test_kept_view_of_scoped_base);
    tcase_add_test(ownership, test_many_scoped_expressions_leave_counters);
    tcase_add_test(ownership, test_release_inside_a_scope_takes_it_out);
    tcase_add_test(ownership, test_release_both_scope_references);
    tcase_add_test(ownership, test_release_of_a_dead_tensor_is_an_error);
    suite_add_tcase(s, ownership);

    TCase *print = tcase_create("print");
    tcase_add_test(print, test_print_f32);
    tcase_add_test(print, test_print_dtype_suffix);
    tcase_add_test(print, test_print_i64_and_bool);
    tcase_add_test(print, test_print_transposed_view);
    tcase_add_test(print, test_print_0d_and_empty);
    tcase_add_test(print, test_print_large_elides);
    suite_add_tcase(s, print);

    TCase *threads = tcase_create("threads");
    tcase_set_timeout(threads, 120);
    tcase_add_test(threads, test_errors_are_thread_local);
    tcase_add_test(threads, test_concurrent_ops_on_two_threads);
    tcase_add_test(threads, test_large_arithmetic_matches_pieces);
    tcase_add_test(threads, test_large_exp_matches_pieces);
    tcase_add_test(threads, test_large_strided_op_matches_c);
    tcase_add_test(threads, test_large_sum_matches_c);
    suite_add_tcase(s, threads);

    return s;
}

KILN_TEST_MAIN(tensor_suite)
