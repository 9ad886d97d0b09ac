/* Movement and creation of issue 19 (stack, split, flip, pad, tril, triu,
 * repeat; eye, linspace, *_like) against naive references, in every dtype
 * and layout, with empty and size-1 axes, eagerly, interpreted and
 * compiled (opcheck.h); PyTorch 1.13's values where they are subtle. */
#include "opcheck.h"

static const kiln_dtype DTYPES[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL};
static const oc_tol EXACTLY = {0, 0, true};

typedef struct {
    int axis, n;
    int64_t values[8];
    int mode;
    double fill;
} params;

/* -- stack -------------------------------------------------------------------- */

static kiln_tensor *apply_stack(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_stack(in, p->n, p->axis);
}

START_TEST(test_stack)
{
    static const struct {
        int ndim;
        int64_t shape[2];
        int axis, n;
    } cases[] = {{2, {2, 3}, 0, 3}, {2, {2, 3}, 1, 2}, {2, {2, 3}, -1, 2}, {1, {0}, 0, 2}, {0, {0}, 0, 3}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            oc_operand parts[3];
            kiln_tensor *in[3];
            for (int i = 0; i < cases[c].n; i++) {
                oc_operand_init(&parts[i], DTYPES[d], (oc_layout)((i + d) % OC_LAYOUTS), cases[c].ndim,
                                cases[c].shape, -9, 9, (uint64_t)(c * 17 + i * 3 + d));
                in[i] = parts[i].t;
            }
            int nd = cases[c].ndim, axis = cases[c].axis < 0 ? cases[c].axis + nd + 1 : cases[c].axis;
            int64_t shape[3];
            for (int k = 0, s = 0; k <= nd; k++)
                shape[k] = k == axis ? cases[c].n : cases[c].shape[s++];
            double want[64];
            for (int64_t i = 0; i < oc_numel(nd + 1, shape); i++) {
                int64_t idx[3] = {0}, src[2] = {0};
                oc_unravel(i, nd + 1, shape, idx);
                for (int k = 0, s = 0; k <= nd; k++)
                    if (k != axis)
                        src[s++] = idx[k];
                want[i] = parts[idx[axis]].v[oc_ravel(nd, cases[c].shape, src)];
            }
            params p = {cases[c].axis, cases[c].n, {0}, 0, 0};
            oc_check(parts[0].desc, apply_stack, &p, cases[c].n, in, DTYPES[d], nd + 1, shape, want, EXACTLY);
        }
    }
}
END_TEST

/* -- split --------------------------------------------------------------------- */

/* Piece p->values[7] of kiln_split (p->mode 0, pieces of values[0]) or of
 * kiln_split_sizes (mode 1, p->n sizes in values). */
static kiln_tensor *apply_split(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    kiln_tensor *out[8];
    int n = p->mode ? kiln_split_sizes(in[0], p->n, p->values, p->axis, out)
                    : kiln_split(in[0], p->values[0], p->axis, out, 8);
    return n > p->values[7] ? out[p->values[7]] : NULL;
}

START_TEST(test_split)
{
    oc_operand a;
    for (int d = 0; d < OC_COUNT(DTYPES); d++) {
        oc_operand_init(&a, DTYPES[d], (oc_layout)(d % OC_LAYOUTS), 2, (int64_t[]){3, 7}, -9, 9, (uint64_t)d);
        static const int64_t sizes[3] = {2, 0, 5};
        for (int mode = 0; mode < 2; mode++) {
            int pieces = mode ? 3 : 3; /* 7 in pieces of 3: 3, 3, 1 */
            int64_t start = 0;
            for (int k = 0; k < pieces; k++) {
                int64_t len = mode ? sizes[k] : (k < 2 ? 3 : 1);
                params p = {-1, 3, {mode ? 2 : 3, 0, 5, 0, 0, 0, 0, k}, mode, 0};
                double want[21];
                for (int64_t i = 0; i < 3 * len; i++)
                    want[i] = a.v[i / len * 7 + start + i % len];
                oc_check(a.desc, apply_split, &p, 1, &a.t, DTYPES[d], 2, (int64_t[]){3, len}, want, EXACTLY);
                start += len;
            }
        }
    }
    kiln_tensor *out[2];
    ck_assert_int_eq(kiln_split(kiln_zeros(KILN_F32, 1, (int64_t[]){0}), 4, 0, out, 2), 1);
    ck_assert_int_eq(kiln_numel(out[0]), 0);
    ck_assert_int_lt(kiln_split(a.t, 2, 1, out, 2), 0);
    ck_assert_kiln_error("kiln_split", "max_out");
    ck_assert_int_lt(kiln_split(a.t, 0, 1, out, 2), 0);
    ck_assert_kiln_error("kiln_split", "positive");
    ck_assert_int_lt(kiln_split_sizes(a.t, 2, (int64_t[]){3, 3}, 1, out), 0);
    ck_assert_kiln_error("kiln_split_sizes", "add up to 7");
    ck_assert_int_lt(kiln_split(a.t, 2, 1, NULL, 2), 0);
    ck_assert_kiln_error("kiln_split", "out");
}
END_TEST

/* -- flip ---------------------------------------------------------------------- */

static kiln_tensor *apply_flip(kiln_tensor *const *in, const void *ctx)
{
    return kiln_flip(in[0], ((const params *)ctx)->axis);
}

START_TEST(test_flip)
{
    static const struct {
        int axis;
        bool mask[3];
    } axes[] = {{0, {1, 0, 0}}, {-1, {0, 0, 1}}, {KILN_AXES(0, 2), {1, 0, 1}}, {KILN_ALL, {1, 1, 1}}};
    static const int64_t shapes[2][3] = {{2, 3, 4}, {2, 0, 1}};
    for (int x = 0; x < OC_COUNT(axes); x++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            oc_operand a;
            oc_operand_init(&a, DTYPES[d], (oc_layout)((x + d) % OC_LAYOUTS), 3, shapes[d % 2], -9, 9, (uint64_t)(x + d));
            double want[24];
            for (int64_t i = 0; i < a.numel; i++) {
                int64_t idx[3];
                oc_unravel(i, 3, a.shape, idx);
                for (int k = 0; k < 3; k++)
                    idx[k] = axes[x].mask[k] ? a.shape[k] - 1 - idx[k] : idx[k];
                want[i] = a.v[oc_ravel(3, a.shape, idx)];
            }
            params p = {axes[x].axis, 0, {0}, 0, 0};
            oc_check(a.desc, apply_flip, &p, 1, &a.t, DTYPES[d], 3, a.shape, want, EXACTLY);
        }
    }
}
END_TEST

/* -- pad ------------------------------------------------------------------------ */

static kiln_tensor *apply_pad(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_pad(in[0], p->n, p->values, (kiln_pad_mode)p->mode, p->fill);
}

/* a's element for an index of the padded result along each axis (pads
 * from the last axis), or NAN for the fill. */
static double padded_value(const oc_operand *a, const int64_t *idx, const params *p)
{
    int64_t src[KILN_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) {
        int from_end = a->ndim - 1 - d;
        int64_t before = from_end * 2 < p->n ? p->values[2 * from_end] : 0, j = idx[d] - before, n = a->shape[d];
        if (p->mode == KILN_PAD_REFLECT)
            j = j < 0 ? -j : j >= n ? 2 * (n - 1) - j : j;
        if (j < 0 || j >= n)
            return NAN;
        src[d] = j;
    }
    return a->v[oc_ravel(a->ndim, a->shape, src)];
}

START_TEST(test_pad)
{
    static const params cases[] = {
        {0, 2, {2, 1}, KILN_PAD_CONSTANT, -1},       {0, 4, {0, 2, 3, 0}, KILN_PAD_CONSTANT, 0.5},
        {0, 4, {-1, 2, 1, -2}, KILN_PAD_CONSTANT, 7}, {0, 2, {2, 3}, KILN_PAD_REFLECT, 0},
        {0, 4, {1, 0, 2, 1}, KILN_PAD_REFLECT, 0},    {0, 0, {0}, KILN_PAD_CONSTANT, 0},
    };
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            oc_operand a;
            oc_operand_init(&a, DTYPES[d], (oc_layout)((c + d) % OC_LAYOUTS), 2, (int64_t[]){3, 4}, -9, 9,
                            (uint64_t)(c + d));
            const params *p = &cases[c];
            int64_t shape[2];
            for (int k = 0; k < 2; k++) {
                int from_end = 1 - k;
                shape[k] = a.shape[k] + (from_end * 2 < p->n ? p->values[2 * from_end] + p->values[2 * from_end + 1] : 0);
            }
            double want[64];
            for (int64_t i = 0; i < oc_numel(2, shape); i++) {
                int64_t idx[2];
                oc_unravel(i, 2, shape, idx);
                double v = padded_value(&a, idx, p);
                want[i] = isnan(v) ? oc_round(DTYPES[d], p->fill) : v;
            }
            char what[160];
            snprintf(what, sizeof what, "pad case %d of %s", c, a.desc);
            oc_check(what, apply_pad, p, 1, &a.t, DTYPES[d], 2, shape, want, EXACTLY);
        }
    }
    kiln_tensor *x = kiln_ones(KILN_F32, 2, (int64_t[]){3, 4});
    ck_assert_ptr_null(kiln_pad(x, 3, (int64_t[]){1, 1, 1}, KILN_PAD_CONSTANT, 0));
    ck_assert_kiln_error("kiln_pad", "pairs");
    ck_assert_ptr_null(kiln_pad(x, 2, (int64_t[]){4, 0}, KILN_PAD_REFLECT, 0));
    ck_assert_kiln_error("kiln_pad", "pad 4 of axis 1", "less than the axis");
    ck_assert_ptr_null(kiln_pad(x, 2, (int64_t[]){-3, -2}, KILN_PAD_CONSTANT, 0));
    ck_assert_kiln_error("kiln_pad", "crop");
    ck_assert_ptr_null(kiln_pad(x, 2, (int64_t[]){1, 1}, (kiln_pad_mode)9, 0));
    ck_assert_kiln_error("kiln_pad", "mode 9");
}
END_TEST

/* A constant pad read by the kernel that uses it, through views of its
 * tensor bounded to where it lies (reversed too, and summed along padded
 * rows); a pad of a pad with its own fill, and a pad of a computed tensor,
 * take a kernel more. */
static kiln_tensor *apply_pad_read(kiln_tensor *const *in, const void *ctx)
{
    int form = *(const int *)ctx;
    kiln_tensor *x = form == 5 ? kiln_abs(in[0]) : in[0];
    kiln_tensor *p = kiln_pad(x, 4, (int64_t[]){2, 1, 1, 3}, KILN_PAD_CONSTANT, -5);
    switch (form) {
    case 0: return kiln_add_scalar(kiln_mul_scalar(p, 2), 1);
    case 1: return kiln_flip(kiln_flip(p, 0), 1);
    case 2: return kiln_sum(p, -1, false);
    case 3: return kiln_pad(p, 2, (int64_t[]){1, 2}, KILN_PAD_CONSTANT, -5);
    case 4: return kiln_pad(p, 2, (int64_t[]){1, 2}, KILN_PAD_CONSTANT, 4);
    default: return kiln_mul_scalar(p, 3);
    }
}

START_TEST(test_pad_read_bounded)
{
    static const int kernels[] = {1, 1, 1, 1, 2, 2};
    static const kiln_dtype dtypes[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
    for (int form = 0; form < OC_COUNT(kernels); form++)
        for (int d = 0; d < OC_COUNT(dtypes); d++) {
            oc_operand a;
            oc_operand_init(&a, dtypes[d], (oc_layout)((form + d) % OC_BROADCAST), 2, (int64_t[]){5, 21}, -9, 9,
                            (uint64_t)(form * 4 + d));
            char what[160];
            snprintf(what, sizeof what, "pad read %d of %s", form, a.desc);
            kiln_tensor *eager = apply_pad_read(&a.t, &form);
            double *want = test_values(eager);
            kiln_tensor *compiled = oc_traced(apply_pad_read, &form, 1, &a.t, KILN_BACKEND_AUTO);
            oc_tol sums = {1e-12, 1e-12, false}; /* in another order */
            oc_compare(compiled, kiln_dtype_of(eager), kiln_ndim(eager), kiln_shape(eager), want,
                       form == 2 ? sums : EXACTLY, what, "compiled");
            free(want);
            int n = oc_kernels(apply_pad_read, &form, 1, &a.t);
            int eager_steps = oc_eager_steps(apply_pad_read, &form, 1, &a.t);
            ck_assert_msg(n == -1 || (n == kernels[form] && eager_steps == 0), "%s: %d kernels (%d eager), want %d",
                          what, n, eager_steps, kernels[form]);
        }
}
END_TEST

/* -- tril, triu ------------------------------------------------------------------- */

static kiln_tensor *apply_triangle(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return p->mode ? kiln_triu(in[0], p->values[0]) : kiln_tril(in[0], p->values[0]);
}

START_TEST(test_tril_triu)
{
    static const int64_t diagonals[] = {0, 1, -1, 5, -4};
    static const int64_t shapes[3][3] = {{3, 4, 0}, {2, 3, 3}, {2, 0, 4}};
    for (int k = 0; k < OC_COUNT(diagonals); k++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            int s = (k + d) % 3, nd = s ? 3 : 2;
            oc_operand a;
            oc_operand_init(&a, DTYPES[d], (oc_layout)((k + d) % OC_LAYOUTS), nd, shapes[s], -9, 9, (uint64_t)(k + d));
            for (int upper = 0; upper < 2; upper++) {
                double want[32];
                for (int64_t i = 0; i < a.numel; i++) {
                    int64_t idx[3];
                    oc_unravel(i, nd, a.shape, idx);
                    int64_t offset = idx[nd - 1] - idx[nd - 2];
                    bool keep = upper ? offset >= diagonals[k] : offset <= diagonals[k];
                    want[i] = keep ? a.v[i] : 0;
                }
                params p = {0, 0, {diagonals[k]}, upper, 0};
                oc_check(a.desc, apply_triangle, &p, 1, &a.t, DTYPES[d], nd, a.shape, want, EXACTLY);
            }
        }
    }
    ck_assert_ptr_null(kiln_tril(kiln_ones(KILN_F32, 1, (int64_t[]){3}), 0));
    ck_assert_kiln_error("kiln_tril", "fewer than 2 axes");
}
END_TEST

/* -- repeat ---------------------------------------------------------------------------- */

static kiln_tensor *apply_repeat(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_repeat(in[0], p->n, p->values);
}

START_TEST(test_repeat)
{
    static const params cases[] = {
        {0, 2, {2, 3}, 0, 0}, {0, 3, {2, 1, 2}, 0, 0}, {0, 2, {1, 1}, 0, 0}, {0, 2, {0, 2}, 0, 0}, {0, 4, {1, 2, 1, 1}, 0, 0},
    };
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            oc_operand a;
            oc_operand_init(&a, DTYPES[d], (oc_layout)((c + d) % OC_LAYOUTS), 2, (int64_t[]){2, 3}, -9, 9, (uint64_t)(c + d));
            const params *p = &cases[c];
            int n = p->n, lead = n - 2;
            int64_t shape[4], base[4];
            for (int k = 0; k < n; k++) {
                base[k] = k < lead ? 1 : a.shape[k - lead];
                shape[k] = base[k] * p->values[k];
            }
            double want[256];
            for (int64_t i = 0; i < oc_numel(n, shape); i++) {
                int64_t idx[4];
                oc_unravel(i, n, shape, idx);
                want[i] = a.v[idx[lead] % base[lead] * 3 + idx[lead + 1] % base[lead + 1]];
            }
            oc_check(a.desc, apply_repeat, p, 1, &a.t, DTYPES[d], n, shape, want, EXACTLY);
        }
    }
    kiln_tensor *x = kiln_ones(KILN_F32, 2, (int64_t[]){2, 3});
    ck_assert_ptr_null(kiln_repeat(x, 1, (int64_t[]){2}));
    ck_assert_kiln_error("kiln_repeat", "one per axis");
    ck_assert_ptr_null(kiln_repeat(x, 2, (int64_t[]){2, -1}));
    ck_assert_kiln_error("kiln_repeat", "negative");
    ck_assert_ptr_null(kiln_repeat(kiln_ones(KILN_F32, 5, (int64_t[]){1, 1, 1, 1, 1}), 5, (int64_t[]){2, 2, 2, 2, 2}));
    ck_assert_kiln_error("kiln_repeat", "dimensions");
}
END_TEST

/* -- Creation ------------------------------------------------------------------------- */

START_TEST(test_eye_linspace)
{
    for (int d = 0; d < OC_COUNT(DTYPES); d++) {
        kiln_tensor *e = kiln_eye(DTYPES[d], 3, 5);
        double *v = test_values(e);
        ck_assert_int_eq(kiln_dtype_of(e), DTYPES[d]);
        for (int i = 0; i < 15; i++)
            ck_assert(v[i] == (i / 5 == i % 5));
        free(v);
    }
    ck_assert_int_eq(kiln_numel(kiln_eye(KILN_F32, 0, 4)), 0);
    ck_assert_ptr_null(kiln_eye(KILN_F32, -1, 4));
    /* PyTorch's scalar formula (its vector loop counts whole vectors from
     * start): f32 in f32, the first half from start, the rest from end */
    float start = -1.3f, end = 2.9f, step = (end - start) / 6;
    double *v = test_values(kiln_linspace(-1.3, 2.9, 7, KILN_F32));
    for (int i = 0; i < 7; i++) {
        float want = i < 3 ? start + step * (float)i : end - step * (float)(6 - i);
        ck_assert_msg(v[i] == want, "linspace[%d] = %.17g, want %.17g", i, v[i], (double)want);
    }
    free(v);
    const double d4[] = {-3.3, -1.8666666666666665, -0.43333333333333335, 1.0}, i5[] = {0, 2, 5, 7, 10};
    v = test_values(kiln_linspace(-3.3, 1, 4, KILN_F64));
    for (int i = 0; i < 4; i++)
        ck_assert(v[i] == d4[i]);
    free(v);
    v = test_values(kiln_linspace(0, 10, 5, KILN_I64));
    for (int i = 0; i < 5; i++)
        ck_assert(v[i] == i5[i]);
    free(v);
    ck_assert(kiln_item(kiln_linspace(4, 9, 1, KILN_F32)) == 4);
    ck_assert_int_eq(kiln_numel(kiln_linspace(4, 9, 0, KILN_F32)), 0);
    ck_assert_ptr_null(kiln_linspace(0, 1, -1, KILN_F32));
    ck_assert_kiln_error("kiln_linspace", "steps");
    ck_assert_ptr_null(kiln_linspace(0, INFINITY, 3, KILN_F32));
    ck_assert_kiln_error("kiln_linspace", "finite");
}
END_TEST

static kiln_tensor *apply_like(kiln_tensor *const *in, const void *ctx)
{
    switch (((const params *)ctx)->mode) {
    case 0: return kiln_zeros_like(in[0]);
    case 1: return kiln_ones_like(in[0]);
    default: return kiln_full_like(in[0], -2.5);
    }
}

START_TEST(test_like)
{
    for (int d = 0; d < OC_COUNT(DTYPES); d++) {
        oc_operand a;
        oc_operand_init(&a, DTYPES[d], OC_TRANSPOSED, 2, (int64_t[]){3, 2}, -9, 9, (uint64_t)d);
        for (int mode = 0; mode < 3; mode++) {
            double want[6], value = mode == 1 ? 1 : mode == 2 ? -2.5 : 0;
            for (int i = 0; i < 6; i++)
                want[i] = oc_round(DTYPES[d], value);
            params p = {0, 0, {0}, mode, 0};
            oc_check(a.desc, apply_like, &p, 1, &a.t, DTYPES[d], 2, a.shape, want, EXACTLY);
        }
        kiln_tensor *e = kiln_empty_like(a.t);
        ck_assert(kiln_dtype_of(e) == DTYPES[d] && kiln_ndim(e) == 2 && kiln_shape(e)[0] == 3 && kiln_shape(e)[1] == 2);
    }
    kiln_clear_error();
    ck_assert_ptr_null(kiln_zeros_like(NULL));
    ck_assert_kiln_error("kiln_zeros_like", "operand a");
}
END_TEST

static Suite *shapes_suite(void)
{
    Suite *s = suite_create("shapes");
    TCase *tc = tcase_create("shapes");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_stack);
    tcase_add_test(tc, test_split);
    tcase_add_test(tc, test_flip);
    tcase_add_test(tc, test_pad);
    tcase_add_test(tc, test_pad_read_bounded);
    tcase_add_test(tc, test_tril_triu);
    tcase_add_test(tc, test_repeat);
    tcase_add_test(tc, test_eye_linspace);
    tcase_add_test(tc, test_like);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(shapes_suite)
