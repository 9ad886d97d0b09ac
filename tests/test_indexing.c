/* Ops by indices and along an axis (issue 19): gather, index_select,
 * embedding, scatter_add, masked_fill, cumsum, topk and sort, against naive
 * f64 references: i32 and i64 indices, negative ones, every value dtype,
 * non-contiguous operands, empty and size-1 axes, 0-d tensors; every error,
 * an index out of range included, eagerly, interpreted and compiled (a
 * traced call reports it too: never a read out of bounds). */
#include "opcheck.h"

static const kiln_dtype DTYPES[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64, KILN_BOOL};
static const oc_tol EXACTLY = {0, 0, true};

typedef struct {
    int axis;
    int64_t k;
    bool flag;
    double value;
} params;

/* An index tensor of shape (ndim, shape) and dtype dt with values in
 * [-size, size) (negative ones count from the end), seeded. */
static void make_index(oc_operand *op, kiln_dtype dt, int ndim, const int64_t *shape, int64_t size, uint64_t seed)
{
    oc_operand_init(op, dt, (oc_layout)(seed % OC_LAYOUTS), ndim, shape, (double)-size, (double)size - 1, seed);
}

static int64_t resolve(double v, int64_t size)
{
    return v < 0 ? (int64_t)v + size : (int64_t)v;
}

/* -- gather --------------------------------------------------------------------- */

static kiln_tensor *apply_gather(kiln_tensor *const *in, const void *ctx)
{
    return kiln_gather(in[0], ((const params *)ctx)->axis, in[1]);
}

START_TEST(test_gather)
{
    static const struct {
        int ndim;
        int64_t a[3], index[3];
        int axis;
    } cases[] = {
        {2, {3, 4}, {2, 4}, 0},  {2, {3, 4}, {3, 6}, 1}, {3, {2, 3, 4}, {2, 2, 3}, -1},
        {3, {2, 3, 4}, {1, 3, 4}, 1}, {2, {3, 4}, {0, 2}, 0}, {1, {5}, {7}, 0},
        {2, {3, 1}, {3, 1}, 1}, {0, {0}, {0}, 0},
    };
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            kiln_dtype dt = DTYPES[d];
            int nd = cases[c].ndim, axis = cases[c].axis < 0 ? cases[c].axis + nd : cases[c].axis;
            oc_operand a, index;
            oc_operand_init(&a, dt, (oc_layout)((c + d) % OC_LAYOUTS), nd, cases[c].a, -9, 9, (uint64_t)(c * 7 + d));
            int64_t size = nd ? cases[c].a[axis] : 1;
            make_index(&index, d % 2 ? KILN_I32 : KILN_I64, nd, cases[c].index, size, (uint64_t)(c * 5 + d));
            double want[OC_MAX_ELEMS];
            for (int64_t i = 0; i < index.numel; i++) {
                int64_t idx[KILN_MAX_DIMS];
                oc_unravel(i, nd, index.shape, idx);
                if (nd)
                    idx[axis] = resolve(index.v[i], size);
                want[i] = a.v[oc_ravel(nd, a.shape, idx)];
            }
            char what[300];
            snprintf(what, sizeof what, "gather(%s, %d, %s)", a.desc, cases[c].axis, index.desc);
            params p = {cases[c].axis, 0, false, 0};
            kiln_tensor *in[2] = {a.t, index.t};
            oc_check(what, apply_gather, &p, 2, in, dt, nd, index.shape, want, EXACTLY);
        }
    }
}
END_TEST

/* -- index_select and embedding -------------------------------------------------- */

static kiln_tensor *apply_index_select(kiln_tensor *const *in, const void *ctx)
{
    return kiln_index_select(in[0], ((const params *)ctx)->axis, in[1]);
}

static kiln_tensor *apply_embedding(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_embedding(in[0], in[1]);
}

START_TEST(test_index_select)
{
    static const struct {
        int ndim;
        int64_t a[3];
        int axis;
        int index_ndim;
        int64_t n;
    } cases[] = {{2, {5, 3}, 0, 1, 7}, {3, {2, 4, 3}, 1, 1, 2}, {3, {2, 4, 3}, -1, 1, 0}, {2, {4, 6}, 1, 0, 1},
                 {1, {6}, 0, 1, 6}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            int nd = cases[c].ndim, axis = cases[c].axis < 0 ? cases[c].axis + nd : cases[c].axis;
            oc_operand a, index;
            oc_operand_init(&a, DTYPES[d], (oc_layout)((c + d) % OC_LAYOUTS), nd, cases[c].a, -9, 9,
                            (uint64_t)(c * 3 + d));
            int64_t size = cases[c].a[axis];
            make_index(&index, d % 2 ? KILN_I64 : KILN_I32, cases[c].index_ndim, &cases[c].n, size, (uint64_t)(c + d));
            int64_t shape[3];
            memcpy(shape, cases[c].a, sizeof shape);
            shape[axis] = index.numel;
            double want[OC_MAX_ELEMS];
            for (int64_t i = 0; i < oc_numel(nd, shape); i++) {
                int64_t idx[KILN_MAX_DIMS];
                oc_unravel(i, nd, shape, idx);
                idx[axis] = resolve(index.v[idx[axis]], size);
                want[i] = a.v[oc_ravel(nd, a.shape, idx)];
            }
            char what[300];
            snprintf(what, sizeof what, "index_select(%s, %d, %s)", a.desc, cases[c].axis, index.desc);
            params p = {cases[c].axis, 0, false, 0};
            kiln_tensor *in[2] = {a.t, index.t};
            oc_check(what, apply_index_select, &p, 2, in, DTYPES[d], nd, shape, want, EXACTLY);
        }
    }
}
END_TEST

START_TEST(test_embedding)
{
    oc_operand w, ids;
    oc_operand_init(&w, KILN_F32, OC_TRANSPOSED, 2, (int64_t[]){11, 6}, -1, 1, 3);
    for (int s = 0; s < 3; s++) {
        static const struct {
            int ndim;
            int64_t shape[3];
        } ids_shapes[] = {{2, {3, 4}}, {0, {0}}, {3, {2, 0, 2}}};
        make_index(&ids, s == 1 ? KILN_I32 : KILN_I64, ids_shapes[s].ndim, ids_shapes[s].shape, 11, (uint64_t)s);
        int64_t shape[4];
        memcpy(shape, ids_shapes[s].shape, sizeof ids_shapes[s].shape);
        shape[ids.ndim] = 6;
        double want[OC_MAX_ELEMS];
        for (int64_t i = 0; i < ids.numel; i++)
            for (int j = 0; j < 6; j++)
                want[i * 6 + j] = w.v[resolve(ids.v[i], 11) * 6 + j];
        kiln_tensor *in[2] = {w.t, ids.t};
        oc_check(ids.desc, apply_embedding, NULL, 2, in, KILN_F32, ids.ndim + 1, shape, want, EXACTLY);
    }
}
END_TEST

/* The embedding lookup of the issue copies rows: the table is read in
 * place, not copied first, and the result is contiguous. */
START_TEST(test_embedding_reads_rows_in_place)
{
    kiln_tensor *table = kiln_reshape(kiln_arange(0, 5000 * 768, 1, KILN_F32), 2, (int64_t[]){5000, 768});
    kiln_tensor *ids = kiln_arange(0, 256 * 19, 19, KILN_I64);
    int64_t live = kiln_live_bytes(), rows_bytes = 256 * 768 * 4;
    kiln_reset_peak_live_bytes();
    kiln_tensor *rows = kiln_embedding(table, ids);
    ck_assert_ptr_nonnull(rows);
    ck_assert_int_le(kiln_peak_live_bytes() - live, 2 * rows_bytes);
    float got[768], want[768];
    kiln_copy_to_host(kiln_slice(rows, 0, 100, 101, 1), got, sizeof got);
    kiln_copy_to_host(kiln_slice(table, 0, 1900, 1901, 1), want, sizeof want);
    ck_assert(!memcmp(got, want, sizeof got));
}
END_TEST

/* index_select of contiguous data along a middle axis, large enough that
 * its rows are copied in blocks (index.c ROWS_PARALLEL_BYTES) that start
 * inside an outer slice, with negative indices: every row as the index says. */
START_TEST(test_index_select_rows_in_blocks)
{
    enum { OUTER = 3, SIZE = 3000, INNER = 64, N = 3001 };
    kiln_tensor *a = kiln_reshape(kiln_arange(0, OUTER * SIZE * INNER, 1, KILN_F32), 3,
                                  (int64_t[]){OUTER, SIZE, INNER});
    static int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)((i * 7919) % SIZE) - (i % 2 ? SIZE : 0);
    kiln_tensor *rows = kiln_index_select(a, 1, kiln_from_data(KILN_I32, 1, (int64_t[]){N}, ids));
    ck_assert_msg(rows, "%s", kiln_last_error());
    static float got[OUTER * N * INNER];
    ck_assert_int_eq(kiln_copy_to_host(rows, got, sizeof got), 0);
    for (int o = 0; o < OUTER; o++)
        for (int i = 0; i < N; i++) {
            int64_t v = ids[i] < 0 ? ids[i] + SIZE : ids[i];
            for (int e = 0; e < INNER; e += INNER - 1)
                ck_assert_msg(got[((int64_t)o * N + i) * INNER + e] == (float)((o * SIZE + v) * INNER + e),
                              "row %d of slice %d element %d", i, o, e);
        }
}
END_TEST

/* -- scatter_add ------------------------------------------------------------------- */

static kiln_tensor *apply_scatter(kiln_tensor *const *in, const void *ctx)
{
    return kiln_scatter_add(in[0], ((const params *)ctx)->axis, in[1], in[2]);
}

START_TEST(test_scatter_add)
{
    static const struct {
        int ndim;
        int64_t a[3], index[3], src[3];
        int axis;
    } cases[] = {{2, {3, 4}, {5, 4}, {5, 4}, 0}, {2, {3, 4}, {3, 6}, {3, 7}, 1}, {3, {2, 3, 4}, {2, 2, 3}, {2, 3, 3}, -1},
                 {2, {3, 4}, {0, 4}, {1, 4}, 0}, {1, {4}, {9}, {9}, 0}, {0, {0}, {0}, {0}, 0}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < 4; d++) {
            kiln_dtype dt = DTYPES[d];
            int nd = cases[c].ndim, axis = cases[c].axis < 0 ? cases[c].axis + nd : cases[c].axis;
            oc_operand a, index, src;
            oc_operand_init(&a, dt, (oc_layout)((c + d) % OC_LAYOUTS), nd, cases[c].a, -9, 9, (uint64_t)(c + d));
            oc_operand_init(&src, dt, (oc_layout)((c + d + 1) % OC_LAYOUTS), nd, cases[c].src, -9, 9, (uint64_t)(c * d));
            int64_t size = nd ? cases[c].a[axis] : 1; /* a 0-d tensor is one row along axis 0, as in PyTorch */
            make_index(&index, d % 2 ? KILN_I32 : KILN_I64, nd, cases[c].index, size, (uint64_t)(c * 11 + d));
            double want[OC_MAX_ELEMS];
            memcpy(want, a.v, (size_t)a.numel * sizeof *want);
            for (int64_t i = 0; i < index.numel; i++) {
                int64_t idx[KILN_MAX_DIMS];
                oc_unravel(i, nd, index.shape, idx);
                double v = src.v[oc_ravel(nd, src.shape, idx)];
                idx[axis] = resolve(index.v[i], size);
                want[oc_ravel(nd, a.shape, idx)] += v;
            }
            for (int64_t i = 0; i < a.numel; i++)
                want[i] = oc_round(dt, want[i]);
            char what[600];
            snprintf(what, sizeof what, "scatter_add(%s, %d, %s, %s)", a.desc, cases[c].axis, index.desc, src.desc);
            params p = {cases[c].axis, 0, false, 0};
            kiln_tensor *in[3] = {a.t, index.t, src.t};
            oc_check(what, apply_scatter, &p, 3, in, dt, nd, a.shape, want, (oc_tol){1e-6, 1e-6, false});
        }
    }
}
END_TEST

/* An embedding's gradient: rows of src added at row indices expanded along
 * the last axis (stride 0, one value a row), repeated rows adding up; a bad
 * index in a later row is named at its position. */
START_TEST(test_scatter_add_expanded_rows)
{
    const double ids[] = {1, -1, 1}, bad_ids[] = {0, 2, 7};
    kiln_tensor *src = kiln_reshape(kiln_arange(0, 12, 1, KILN_F32), 2, (int64_t[]){3, 4});
    kiln_tensor *base = kiln_ones(KILN_F32, 2, (int64_t[]){5, 4});
    kiln_tensor *index = kiln_expand(oc_tensor(KILN_I64, OC_CONTIG, 2, (int64_t[]){3, 1}, ids), 2, (int64_t[]){3, 4});
    float got[20], want[20];
    for (int i = 0; i < 20; i++)
        want[i] = 1 + (i / 4 == 1 ? (float)(i % 4) + (float)(8 + i % 4) : i / 4 == 4 ? (float)(4 + i % 4) : 0);
    ck_assert_int_eq(kiln_copy_to_host(kiln_scatter_add(base, 0, index, src), got, sizeof got), 0);
    ck_assert(!memcmp(got, want, sizeof got));
    index = kiln_expand(oc_tensor(KILN_I64, OC_CONTIG, 2, (int64_t[]){3, 1}, bad_ids), 2, (int64_t[]){3, 4});
    ck_assert_ptr_null(kiln_scatter_add(base, 0, index, src));
    ck_assert_kiln_error("kiln_scatter_add", "index 7 at [2,0]");
}
END_TEST

/* -- masked_fill ------------------------------------------------------------------- */

static kiln_tensor *apply_masked_fill(kiln_tensor *const *in, const void *ctx)
{
    return kiln_masked_fill(in[0], in[1], ((const params *)ctx)->value);
}

START_TEST(test_masked_fill)
{
    static const double values[] = {-INFINITY, 2.5, 0, NAN};
    for (int d = 0; d < OC_COUNT(DTYPES); d++) {
        for (int m = 0; m < 2; m++) {
            oc_operand a, mask;
            oc_operand_init(&a, DTYPES[d], (oc_layout)(d % OC_LAYOUTS), 3, (int64_t[]){2, 3, 4}, -5, 5, (uint64_t)d);
            /* the mask broadcasts: a causal [3, 4] one, or a whole [2, 3, 4] one */
            oc_operand_init(&mask, KILN_BOOL, OC_STEP2, m ? 3 : 2, m ? (int64_t[]){2, 3, 4} : (int64_t[]){3, 4}, 0, 1,
                            (uint64_t)(d + 7));
            params p = {0, 0, false, values[d % OC_COUNT(values)]};
            double fill = oc_round(DTYPES[d], oc_is_float(DTYPES[d]) || !isnan(p.value) ? p.value : 0);
            if (!oc_is_float(DTYPES[d]) && isinf(p.value))
                fill = DTYPES[d] == KILN_I32 ? INT32_MIN : DTYPES[d] == KILN_BOOL ? 1 : -0x1p63;
            double want[24];
            for (int i = 0; i < 24; i++)
                want[i] = mask.v[m ? i : i % 12] ? fill : a.v[i];
            kiln_tensor *in[2] = {a.t, mask.t};
            oc_check(a.desc, apply_masked_fill, &p, 2, in, DTYPES[d], 3, a.shape, want, EXACTLY);
        }
    }
}
END_TEST

/* -- cumsum ------------------------------------------------------------------------ */

static kiln_tensor *apply_cumsum(kiln_tensor *const *in, const void *ctx)
{
    return kiln_cumsum(in[0], ((const params *)ctx)->axis);
}

START_TEST(test_cumsum)
{
    static const struct {
        int ndim;
        int64_t shape[3];
        int axis;
    } cases[] = {{2, {3, 5}, 1}, {3, {2, 4, 3}, 1}, {3, {2, 4, 3}, 0}, {2, {0, 3}, 0}, {2, {4, 1}, -1}, {0, {0}, 0},
                 {1, {700}, 0}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            kiln_dtype dt = DTYPES[d], out = oc_is_float(dt) ? dt : KILN_I64;
            int nd = cases[c].ndim, axis = cases[c].axis < 0 ? cases[c].axis + nd : cases[c].axis;
            oc_operand a;
            oc_operand_init(&a, dt, (oc_layout)((c + d) % OC_LAYOUTS), nd, cases[c].shape, -9, 9, (uint64_t)(c + d));
            double want[OC_MAX_ELEMS];
            for (int64_t i = 0; i < a.numel; i++) {
                int64_t idx[KILN_MAX_DIMS];
                oc_unravel(i, nd, a.shape, idx);
                double s = 0;
                int64_t upto = nd ? idx[axis] : 0;
                for (int64_t r = 0; r <= upto; r++) {
                    if (nd)
                        idx[axis] = r;
                    s += a.v[oc_ravel(nd, a.shape, idx)];
                }
                want[i] = oc_round(out, s);
            }
            params p = {cases[c].axis, 0, false, 0};
            oc_check(a.desc, apply_cumsum, &p, 1, &a.t, out, nd, a.shape, want, (oc_tol){1e-6, 1e-5, false});
        }
    }
}
END_TEST

/* Integer running sums wrap in i64, as sums do. */
START_TEST(test_cumsum_wraps)
{
    const double v[] = {0x1p62, 0x1p62, 0x1p62, 5};
    int64_t n = 4;
    kiln_tensor *a = oc_tensor(KILN_I64, OC_CONTIG, 1, &n, v);
    const double want[] = {0x1p62, 0x1p63 * -1, -0x1p62, -0x1p62 + 5};
    params p = {0, 0, false, 0};
    oc_check("wrapping cumsum", apply_cumsum, &p, 1, &a, KILN_I64, 1, &n, want, EXACTLY);
}
END_TEST

/* -- topk and sort ----------------------------------------------------------------- */

/* x before y in topk's order: NaN above every number, ties to the lower index. */
static bool ref_before(double x, int64_t i, double y, int64_t j, bool largest)
{
    int order = isnan(x) || isnan(y) ? (int)isnan(x) - (int)isnan(y) : (x > y) - (x < y);
    if (order)
        return largest ? order > 0 : order < 0;
    return i < j;
}

static kiln_tensor *apply_topk(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    kiln_tensor *values, *indices;
    int status = p->k < 0 ? kiln_sort(in[0], p->axis, p->flag, &values, &indices)
                          : kiln_topk(in[0], p->k, p->axis, p->flag, &values, &indices);
    return status < 0 ? NULL : in[1] ? indices : values; /* in[1] non-NULL: the indices are wanted */
}

static kiln_tensor *apply_topk_values(kiln_tensor *const *in, const void *ctx)
{
    kiln_tensor *both[2] = {in[0], NULL};
    return apply_topk(both, ctx);
}

static kiln_tensor *apply_topk_indices(kiln_tensor *const *in, const void *ctx)
{
    kiln_tensor *both[2] = {in[0], in[0]};
    return apply_topk(both, ctx);
}

START_TEST(test_topk_sort)
{
    static const struct {
        int ndim;
        int64_t shape[3];
        int axis;
        int64_t k; /* -1: sort */
    } cases[] = {{2, {3, 7}, 1, 3}, {2, {3, 7}, 1, -1}, {3, {2, 5, 3}, 1, 5}, {3, {2, 5, 3}, 0, -1},
                 {2, {4, 0}, 1, 0}, {2, {4, 9}, -1, 1}, {1, {300}, 0, -1}, {0, {0}, 0, 1}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < OC_COUNT(DTYPES); d++) {
            kiln_dtype dt = DTYPES[d];
            int nd = cases[c].ndim, axis = cases[c].axis < 0 ? cases[c].axis + nd : cases[c].axis;
            oc_operand a;
            /* few distinct values, so that ties happen; a NaN now and then */
            oc_operand_init(&a, dt, (oc_layout)((c + d) % OC_LAYOUTS), nd, cases[c].shape, -3, 3, (uint64_t)(c + d));
            for (int64_t i = 0; oc_is_float(dt) && i < a.numel; i++)
                a.v[i] = i % 5 == 3 ? NAN : round(a.v[i]);
            a.t = oc_tensor(dt, OC_CONTIG, nd, a.shape, a.v);
            int64_t n = nd ? a.shape[axis] : 1, k = cases[c].k < 0 ? n : cases[c].k;
            int64_t shape[3];
            memcpy(shape, a.shape, sizeof shape);
            if (nd)
                shape[axis] = k;
            double values[OC_MAX_ELEMS], indices[OC_MAX_ELEMS];
            for (int64_t o = 0; o < oc_numel(nd, shape); o++) {
                int64_t idx[KILN_MAX_DIMS], line[512];
                oc_unravel(o, nd, shape, idx);
                for (int64_t r = 0; r < n; r++) /* insertion sort of the line's indices */
                    for (int64_t s = (line[r] = r, r); s > 0; s--) {
                        int64_t at[KILN_MAX_DIMS], bt[KILN_MAX_DIMS];
                        memcpy(at, idx, sizeof at);
                        memcpy(bt, idx, sizeof bt);
                        if (nd)
                            at[axis] = line[s], bt[axis] = line[s - 1];
                        if (!ref_before(a.v[oc_ravel(nd, a.shape, at)], line[s], a.v[oc_ravel(nd, a.shape, bt)],
                                        line[s - 1], d % 2 == 0))
                            break;
                        int64_t t = line[s];
                        line[s] = line[s - 1];
                        line[s - 1] = t;
                    }
                int64_t r = nd ? idx[axis] : 0;
                if (nd)
                    idx[axis] = line[r];
                indices[o] = (double)line[r];
                values[o] = a.v[oc_ravel(nd, a.shape, idx)];
            }
            params p = {cases[c].axis, cases[c].k, d % 2 == 0, 0};
            char what[200];
            snprintf(what, sizeof what, "%s(%s, k %lld, %s)", cases[c].k < 0 ? "sort" : "topk", a.desc,
                     (long long)cases[c].k, p.flag ? "largest" : "smallest");
            oc_check(what, apply_topk_values, &p, 1, &a.t, dt, nd, shape, values, EXACTLY);
            oc_check(what, apply_topk_indices, &p, 1, &a.t, KILN_I64, nd, shape, indices, EXACTLY);
        }
    }
}
END_TEST

/* -- Errors -------------------------------------------------------------------------- */

/* An index out of range fails the call, eagerly and traced, naming it. */
START_TEST(test_out_of_range)
{
    kiln_tensor *a = kiln_ones(KILN_F32, 2, (int64_t[]){3, 4});
    const double bad[] = {0, 4, 1}, negative[] = {-5, 0, 0};
    for (int i = 0; i < 2; i++) {
        kiln_tensor *idx = oc_tensor(i ? KILN_I32 : KILN_I64, OC_CONTIG, 1, (int64_t[]){3}, i ? negative : bad);
        params p = {1, 0, false, 0};
        kiln_tensor *in[2] = {a, idx};
        oc_check_error("index_select", apply_index_select, &p, 2, in, i ? "index -5" : "index 4");
        oc_check_error("index_select axis", apply_index_select, &p, 2, in, "out of range for axis 1 of size 4");
        kiln_tensor *ids = kiln_reshape(idx, 2, (int64_t[]){1, 3});
        kiln_tensor *gin[2] = {a, ids};
        oc_check_error("gather", apply_gather, &p, 2, gin, "out of range");
        kiln_tensor *sin[3] = {a, ids, kiln_ones(KILN_F32, 2, (int64_t[]){1, 3})};
        oc_check_error("scatter_add", apply_scatter, &p, 3, sin, "out of range");
        kiln_tensor *ein[2] = {kiln_ones(KILN_F32, 2, (int64_t[]){4, 2}), ids};
        oc_check_error("embedding", apply_embedding, &p, 2, ein, "out of range");
    }
}
END_TEST

START_TEST(test_refusals)
{
    kiln_tensor *a = kiln_ones(KILN_F32, 2, (int64_t[]){3, 4});
    kiln_tensor *fi = kiln_zeros(KILN_F32, 2, (int64_t[]){3, 4}), *ii = kiln_zeros(KILN_I64, 2, (int64_t[]){3, 4});
    kiln_tensor *values = NULL, *indices = NULL;
    kiln_clear_error();
    ck_assert_ptr_null(kiln_gather(NULL, 0, ii));
    ck_assert_kiln_error("kiln_gather", "operand a");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_gather(a, 0, NULL));
    ck_assert_kiln_error("kiln_gather", "index");
    ck_assert_ptr_null(kiln_gather(a, 0, fi));
    ck_assert_kiln_error("kiln_gather", "i32 or i64", "f32");
    ck_assert_ptr_null(kiln_gather(a, 2, ii));
    ck_assert_kiln_error("kiln_gather", "axis");
    ck_assert_ptr_null(kiln_gather(a, 0, kiln_zeros(KILN_I64, 1, (int64_t[]){3})));
    ck_assert_kiln_error("kiln_gather", "rank");
    ck_assert_ptr_null(kiln_gather(a, 0, kiln_zeros(KILN_I64, 2, (int64_t[]){1, 5})));
    ck_assert_kiln_error("kiln_gather", "no larger");
    ck_assert_ptr_null(kiln_index_select(a, 0, ii));
    ck_assert_kiln_error("kiln_index_select", "0-d or 1-d");
    ck_assert_ptr_null(kiln_embedding(kiln_ones(KILN_F32, 1, (int64_t[]){3}), ii));
    ck_assert_kiln_error("kiln_embedding", "2-d");
    ck_assert_ptr_null(kiln_scatter_add(a, 0, ii, kiln_ones(KILN_F64, 2, (int64_t[]){3, 4})));
    ck_assert_kiln_error("kiln_scatter_add", "dtype");
    ck_assert_ptr_null(kiln_scatter_add(a, 0, ii, kiln_ones(KILN_F32, 2, (int64_t[]){2, 4})));
    ck_assert_kiln_error("kiln_scatter_add", "fit");
    kiln_tensor *b = kiln_ones(KILN_BOOL, 1, (int64_t[]){2});
    ck_assert_ptr_null(kiln_scatter_add(b, 0, kiln_zeros(KILN_I64, 1, (int64_t[]){2}), b));
    ck_assert_kiln_error("kiln_scatter_add", "bool");
    ck_assert_ptr_null(kiln_masked_fill(a, fi, 0));
    ck_assert_kiln_error("kiln_masked_fill", "bool");
    ck_assert_ptr_null(kiln_masked_fill(a, kiln_ones(KILN_BOOL, 2, (int64_t[]){2, 4}), 0));
    ck_assert_kiln_error("kiln_masked_fill", "[2,4]");
    ck_assert_ptr_null(kiln_cumsum(a, 2));
    ck_assert_kiln_error("kiln_cumsum", "axis");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_cumsum(NULL, 0));
    ck_assert_kiln_error("kiln_cumsum", "operand a");
    ck_assert_int_lt(kiln_topk(a, 5, 1, true, &values, &indices), 0);
    ck_assert_kiln_error("kiln_topk", "k 5", "[3,4] f32");
    ck_assert_ptr_null(values);
    ck_assert_ptr_null(indices);
    ck_assert_int_lt(kiln_topk(a, -1, 1, true, &values, &indices), 0);
    ck_assert_kiln_error("kiln_topk", "k -1");
    ck_assert_int_lt(kiln_sort(a, 1, true, NULL, &indices), 0);
    ck_assert_kiln_error("kiln_sort", "values");
    ck_assert_int_lt(kiln_sort(a, 3, true, &values, &indices), 0);
    ck_assert_kiln_error("kiln_sort", "axis");
}
END_TEST

static Suite *indexing_suite(void)
{
    Suite *s = suite_create("indexing");
    TCase *tc = tcase_create("indexing");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_gather);
    tcase_add_test(tc, test_index_select);
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_scatter_add);
    tcase_add_test(tc, test_scatter_add_expanded_rows);
    tcase_add_test(tc, test_masked_fill);
    tcase_add_test(tc, test_cumsum);
    tcase_add_test(tc, test_cumsum_wraps);
    tcase_add_test(tc, test_topk_sort);
    tcase_add_test(tc, test_out_of_range);
    tcase_add_test(tc, test_refusals);
    if (oc_device() == KILN_CPU) /* a CPU table */
        tcase_add_test(tc, test_embedding_reads_rows_in_place);
    if (oc_device() == KILN_CPU) /* the CPU's copy in blocks */
        tcase_add_test(tc, test_index_select_rows_in_blocks);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(indexing_suite)
