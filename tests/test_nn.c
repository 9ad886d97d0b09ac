/* Normalisation and losses of issue 19 (batch_norm, group_norm, rms_norm,
 * layer_norm over the last k axes; cross_entropy with ignore_index and
 * label smoothing, nll_loss, mse_loss) against naive f64 references, in
 * every mode (opcheck.h), with PyTorch 1.13's values for a few; each norm
 * and the per-row loss read their rows in one kernel when traced. */
#include "opcheck.h"

static const oc_tol CLOSE_F32 = {2e-5, 2e-6, false}, CLOSE_F64 = {1e-12, 1e-13, false};

static oc_tol close_for(kiln_dtype dt)
{
    return dt == KILN_F64 ? CLOSE_F64 : CLOSE_F32;
}

typedef struct {
    double eps;
    int64_t groups, ignore;
    int k;
    double smoothing;
    bool affine;
} params;

/* -- batch_norm ------------------------------------------------------------------ */

static kiln_tensor *apply_batch_norm(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_batch_norm(in[0], in[1], in[2], p->affine ? in[3] : NULL, p->affine ? in[4] : NULL, p->eps);
}

START_TEST(test_batch_norm)
{
    static const struct {
        int ndim;
        int64_t shape[4];
    } shapes[] = {{4, {2, 3, 4, 5}}, {2, {5, 3}}, {3, {0, 3, 2}}, {4, {1, 3, 1, 1}}};
    static const kiln_dtype dtypes[] = {KILN_F32, KILN_F64, KILN_I32};
    for (int s = 0; s < OC_COUNT(shapes); s++) {
        for (int d = 0; d < OC_COUNT(dtypes); d++) {
            if (!oc_sampled(s * OC_COUNT(dtypes) + d))
                continue;
            oc_operand x, mean, var, gamma, beta;
            kiln_dtype out = oc_is_float(dtypes[d]) ? dtypes[d] : KILN_F32;
            oc_operand_init(&x, dtypes[d], (oc_layout)((s + d) % OC_LAYOUTS), shapes[s].ndim, shapes[s].shape, -5, 5,
                            (uint64_t)(s + d));
            int64_t c = 3;
            kiln_dtype pdt = out;
            oc_operand_init(&mean, pdt, OC_CONTIG, 1, &c, -1, 1, 1);
            oc_operand_init(&var, pdt, OC_STEP2, 1, &c, 0.5, 2, 2);
            oc_operand_init(&gamma, pdt, OC_CONTIG, 1, &c, -2, 2, 3);
            oc_operand_init(&beta, pdt, OC_CONTIG, 1, &c, -2, 2, 4);
            for (int affine = 0; affine < 2; affine++) {
                params p = {.eps = 1e-3, .affine = affine};
                double want[OC_MAX_ELEMS];
                for (int64_t i = 0; i < x.numel; i++) {
                    int64_t idx[4];
                    oc_unravel(i, x.ndim, x.shape, idx);
                    int64_t ch = idx[1];
                    double y = (x.v[i] - mean.v[ch]) / sqrt(var.v[ch] + p.eps);
                    want[i] = affine ? y * gamma.v[ch] + beta.v[ch] : y;
                }
                kiln_tensor *in[5] = {x.t, mean.t, var.t, gamma.t, beta.t};
                oc_check(x.desc, apply_batch_norm, &p, 5, in, out, x.ndim, x.shape, want, close_for(out));
            }
        }
    }
    kiln_tensor *x = kiln_ones(KILN_F32, 3, (int64_t[]){2, 3, 4}), *c3 = kiln_ones(KILN_F32, 1, (int64_t[]){3});
    ck_assert_ptr_null(kiln_batch_norm(x, kiln_ones(KILN_F32, 1, (int64_t[]){4}), c3, NULL, NULL, 1e-5));
    ck_assert_kiln_error("kiln_batch_norm", "mean", "3 channels");
    ck_assert_ptr_null(kiln_batch_norm(kiln_ones(KILN_F32, 1, (int64_t[]){3}), c3, c3, NULL, NULL, 1e-5));
    ck_assert_kiln_error("kiln_batch_norm", "channel axis");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_batch_norm(x, c3, NULL, NULL, NULL, 1e-5));
    ck_assert_kiln_error("kiln_batch_norm", "var");
}
END_TEST

/* -- group_norm, rms_norm, layer_norm_axes -------------------------------------- */

/* Normalizes v[0..n) (its mean and biased variance) into out. */
static void normalize_ref(const double *v, int64_t n, double eps, double *out)
{
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++)
        mean += v[i] / (double)n;
    for (int64_t i = 0; i < n; i++)
        var += (v[i] - mean) * (v[i] - mean) / (double)n;
    for (int64_t i = 0; i < n; i++)
        out[i] = (v[i] - mean) / sqrt(var + eps);
}

static kiln_tensor *apply_group_norm(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_group_norm(in[0], p->groups, p->affine ? in[1] : NULL, p->affine ? in[2] : NULL, p->eps);
}

START_TEST(test_group_norm)
{
    static const struct {
        int ndim;
        int64_t shape[4], groups;
    } cases[] = {{4, {2, 6, 3, 2}, 3}, {4, {2, 6, 3, 2}, 6}, {3, {1, 4, 5}, 1}, {2, {3, 4}, 2}, {3, {0, 4, 2}, 2}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        for (int d = 0; d < 2; d++) {
            if (!oc_sampled(c * 2 + d + 1))
                continue;
            kiln_dtype dt = d ? KILN_F64 : KILN_F32;
            oc_operand x, gamma, beta;
            oc_operand_init(&x, dt, (oc_layout)((c + d) % OC_LAYOUTS), cases[c].ndim, cases[c].shape, -3, 3, (uint64_t)c);
            int64_t ch = cases[c].shape[1], g = cases[c].groups, per = x.numel / (x.shape[0] ? x.shape[0] : 1) / g;
            oc_operand_init(&gamma, dt, OC_CONTIG, 1, &ch, -2, 2, 5);
            oc_operand_init(&beta, dt, OC_CONTIG, 1, &ch, -2, 2, 6);
            params p = {.eps = 1e-5, .groups = g, .affine = c % 2 == 0};
            double want[OC_MAX_ELEMS];
            for (int64_t start = 0; start < x.numel; start += per)
                normalize_ref(x.v + start, per, p.eps, want + start);
            int64_t spatial = per * g / ch;
            for (int64_t i = 0; p.affine && i < x.numel; i++) {
                int64_t k = i / spatial % ch;
                want[i] = want[i] * gamma.v[k] + beta.v[k];
            }
            kiln_tensor *in[3] = {x.t, gamma.t, beta.t};
            oc_check(x.desc, apply_group_norm, &p, 3, in, dt, x.ndim, x.shape, want, close_for(dt));
        }
    }
    ck_assert_ptr_null(kiln_group_norm(kiln_ones(KILN_F32, 3, (int64_t[]){2, 6, 3}), 4, NULL, NULL, 1e-5));
    ck_assert_kiln_error("kiln_group_norm", "4 equal groups");
}
END_TEST

static kiln_tensor *apply_rms_norm(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_rms_norm(in[0], p->affine ? in[1] : NULL, p->eps);
}

static kiln_tensor *apply_layer_norm_axes(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_layer_norm_axes(in[0], p->k, p->affine ? in[1] : NULL, p->affine ? in[2] : NULL, p->eps);
}

START_TEST(test_rms_and_layer_norm)
{
    static const kiln_dtype dtypes[] = {KILN_F32, KILN_F64, KILN_I64};
    for (int d = 0; d < OC_COUNT(dtypes); d++) {
        if (!oc_sampled(d))
            continue;
        kiln_dtype out = oc_is_float(dtypes[d]) ? dtypes[d] : KILN_F32;
        oc_operand x, gamma, beta;
        oc_operand_init(&x, dtypes[d], (oc_layout)(d + 1), 3, (int64_t[]){2, 3, 4}, -4, 4, (uint64_t)d);
        oc_operand_init(&gamma, out, OC_CONTIG, 1, (int64_t[]){4}, -2, 2, 7);
        for (int affine = 0; affine < 2; affine++) {
            params p = {.eps = 1e-4, .affine = affine};
            double want[24];
            for (int64_t r = 0; r < 6; r++) {
                double ms = 0;
                for (int j = 0; j < 4; j++)
                    ms += x.v[r * 4 + j] * x.v[r * 4 + j] / 4;
                for (int j = 0; j < 4; j++)
                    want[r * 4 + j] = x.v[r * 4 + j] / sqrt(ms + p.eps) * (affine ? gamma.v[j] : 1);
            }
            kiln_tensor *in[2] = {x.t, gamma.t};
            oc_check(x.desc, apply_rms_norm, &p, 2, in, out, 3, x.shape, want, close_for(out));
        }
        /* over the last two axes; gamma [3, 4], beta [4] broadcasting to them */
        oc_operand_init(&gamma, out, OC_TRANSPOSED, 2, (int64_t[]){3, 4}, -2, 2, 8);
        oc_operand_init(&beta, out, OC_CONTIG, 1, (int64_t[]){4}, -2, 2, 9);
        for (int k = 1; k <= 3; k++) {
            params p = {.eps = 1e-5, .k = k, .affine = k == 2};
            int64_t per = k == 1 ? 4 : k == 2 ? 12 : 24;
            double want[24];
            for (int64_t start = 0; start < 24; start += per)
                normalize_ref(x.v + start, per, p.eps, want + start);
            for (int i = 0; p.affine && i < 24; i++)
                want[i] = want[i] * gamma.v[i % 12] + beta.v[i % 4];
            kiln_tensor *in[3] = {x.t, gamma.t, beta.t};
            oc_check(x.desc, apply_layer_norm_axes, &p, 3, in, out, 3, x.shape, want, close_for(out));
        }
    }
    ck_assert_ptr_null(kiln_layer_norm_axes(kiln_ones(KILN_F32, 2, (int64_t[]){2, 3}), 3, NULL, NULL, 1e-5));
    ck_assert_kiln_error("kiln_layer_norm_axes", "last 3 axes");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_rms_norm(NULL, NULL, 1e-5));
    ck_assert_kiln_error("kiln_rms_norm", "operand a");
}
END_TEST

/* -- Losses -------------------------------------------------------------------- */

static kiln_tensor *apply_cross_entropy(kiln_tensor *const *in, const void *ctx)
{
    const params *p = ctx;
    return kiln_cross_entropy_ex(in[0], in[1], p->ignore, p->smoothing);
}

static kiln_tensor *apply_nll(kiln_tensor *const *in, const void *ctx)
{
    return kiln_nll_loss(in[0], in[1], ((const params *)ctx)->ignore);
}

/* The mean over rows not labeled ignore of -((1 - s) logp[label] + s mean(logp)). */
static double cross_entropy_ref(const double *x, const double *labels, int64_t n, int64_t c, int64_t ignore,
                                double smoothing, bool log_probs_given)
{
    double total = 0;
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        if ((int64_t)labels[i] == ignore)
            continue;
        const double *row = x + i * c;
        double m = -INFINITY, s = 0, mean = 0;
        for (int64_t j = 0; j < c; j++)
            m = row[j] > m ? row[j] : m;
        for (int64_t j = 0; j < c; j++) {
            s += exp(row[j] - m);
            mean += row[j] / (double)c;
        }
        double lse = log_probs_given ? 0 : log(s) + m;
        total += (1 - smoothing) * (lse - row[(int64_t)labels[i]]) + smoothing * (lse - mean);
        kept++;
    }
    return total / (double)kept;
}

START_TEST(test_cross_entropy)
{
    static const struct {
        int64_t n, c, ignore;
        double smoothing;
    } cases[] = {{4, 5, -100, 0}, {6, 3, 1, 0},  {5, 7, -100, 0.1},         {3, 4, 2, 0.25},
                 {1, 9, -100, 0}, {2, 2, 0, 0}, {3, 4, -100, 0}, {5, 3, INT64_C(1) << 32, 0}};
    for (int k = 0; k < OC_COUNT(cases); k++) {
        for (int d = 0; d < 3; d++) {
            if (!oc_sampled(k * 3 + d))
                continue;
            kiln_dtype dt = d == 1 ? KILN_F64 : d == 2 ? KILN_I32 : KILN_F32, out = d == 1 ? KILN_F64 : KILN_F32;
            int64_t n = cases[k].n, c = cases[k].c;
            oc_operand x, labels;
            oc_operand_init(&x, dt, (oc_layout)((k + d) % OC_LAYOUTS), 2, (int64_t[]){n, c}, -4, 4, (uint64_t)k);
            oc_operand_init(&labels, d == 2 ? KILN_I32 : KILN_I64, OC_CONTIG, 1, &n, 0, (double)c - 1, (uint64_t)(k + 3));
            if (k % 2 == 0) /* an ignored row */
                labels.v[0] = (double)cases[k].ignore;
            if (cases[k].ignore > INT32_MAX) /* ignores none: wrapped to i32, it would drop label 0 */
                labels.v[n - 1] = 0;
            labels.t = oc_tensor(labels.dt, OC_CONTIG, 1, &n, labels.v);
            params p = {.ignore = cases[k].ignore, .smoothing = cases[k].smoothing};
            double want = oc_round(out, cross_entropy_ref(x.v, labels.v, n, c, p.ignore, p.smoothing, false));
            kiln_tensor *in[2] = {x.t, labels.t};
            char what[300];
            snprintf(what, sizeof what, "cross_entropy(%s, %s)", x.desc, labels.desc);
            oc_check(what, apply_cross_entropy, &p, 2, in, out, 0, NULL, &want, close_for(out));
            if (cases[k].smoothing == 0) { /* nll_loss of the same numbers, taken as log-probabilities */
                want = oc_round(out, cross_entropy_ref(x.v, labels.v, n, c, p.ignore, 0, true));
                oc_check(what, apply_nll, &p, 2, in, out, 0, NULL, &want, close_for(out));
            }
        }
    }
}
END_TEST

/* PyTorch 1.13's values for torch.manual_seed(0); x = torch.randn(4, 5). */
START_TEST(test_cross_entropy_pytorch)
{
    const double x[] = {-1.1258398294448853, -1.152360200881958, -0.2505785822868347, -0.4338788092136383,
                        0.5988394618034363, -1.5550950765609741, -0.3413603901863098, 1.85300612449646,
                        0.46809640526771545, -0.1577124446630478, 1.4436601400375366, 0.26604941487312317,
                        1.3893661499023438, 1.586334228515625, 0.946298360824585, -0.843676745891571,
                        0.9318265914916992, 1.2590092420578003, 2.0049805641174316, 0.05373690277338028};
    kiln_tensor *logits = oc_tensor(KILN_F32, OC_CONTIG, 2, (int64_t[]){4, 5}, x);
    const double y1[] = {1, -100, 4, 0}, y2[] = {1, 3, 4, 0};
    kiln_tensor *l1 = oc_tensor(KILN_I64, OC_CONTIG, 1, (int64_t[]){4}, y1);
    kiln_tensor *l2 = oc_tensor(KILN_I64, OC_CONTIG, 1, (int64_t[]){4}, y2);
    ck_assert(fabs(kiln_item(kiln_cross_entropy(logits, l1)) - 2.649197578430176) < 2e-6);
    ck_assert(fabs(kiln_item(kiln_cross_entropy_ex(logits, l2, -100, 0.2)) - 2.340752601623535) < 2e-6);
    ck_assert(fabs(kiln_item(kiln_cross_entropy_ex(logits, l2, 4, 0.3)) - 2.444077968597412) < 2e-6);
    const double y3[] = {1, 2, 4, 0};
    kiln_tensor *logp = kiln_log_softmax(logits, 1);
    ck_assert(fabs(kiln_item(kiln_nll_loss(logp, oc_tensor(KILN_I64, OC_CONTIG, 1, (int64_t[]){4}, y3), -100)) -
                   2.0930142402648926) < 2e-6);
    const double none[] = {-100, -100, -100, -100};
    ck_assert(isnan(kiln_item(kiln_cross_entropy(logits, oc_tensor(KILN_I64, OC_CONTIG, 1, (int64_t[]){4}, none)))));
    /* unbatched: [C] logits and a 0-d label */
    const double five[] = {4};
    double one = kiln_item(kiln_cross_entropy(kiln_slice(kiln_reshape(logits, 1, (int64_t[]){20}), 0, 0, 5, 1),
                                              oc_tensor(KILN_I64, OC_CONTIG, 0, NULL, five)));
    ck_assert(fabs(one - 0.7586995363235474) < 2e-6);
}
END_TEST

static kiln_tensor *apply_mse(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_mse_loss(in[0], in[1]);
}

START_TEST(test_mse_loss)
{
    static const kiln_dtype dtypes[][2] = {{KILN_F32, KILN_F32}, {KILN_F64, KILN_F32}, {KILN_I32, KILN_I64}};
    for (int d = 0; d < OC_COUNT(dtypes); d++) {
        if (!oc_sampled(d))
            continue;
        oc_operand a, b;
        oc_operand_init(&a, dtypes[d][0], (oc_layout)d, 2, (int64_t[]){3, 4}, -3, 3, (uint64_t)d);
        oc_operand_init(&b, dtypes[d][1], OC_CONTIG, 1, (int64_t[]){4}, -3, 3, (uint64_t)d + 9);
        double sum = 0;
        for (int i = 0; i < 12; i++)
            sum += (a.v[i] - b.v[i % 4]) * (a.v[i] - b.v[i % 4]);
        kiln_dtype out = d == 1 ? KILN_F64 : KILN_F32;
        double want = oc_round(out, sum / 12);
        kiln_tensor *in[2] = {a.t, b.t};
        oc_check(a.desc, apply_mse, NULL, 2, in, out, 0, NULL, &want, close_for(out));
    }
    kiln_tensor *a = kiln_ones(KILN_F32, 1, (int64_t[]){0});
    ck_assert(isnan(kiln_item(kiln_mse_loss(a, a))));
}
END_TEST

START_TEST(test_loss_errors)
{
    kiln_tensor *x = kiln_zeros(KILN_F32, 2, (int64_t[]){3, 4});
    const double bad[] = {0, 4, 1}, negative[] = {0, -1, 2};
    params p = {.ignore = -100};
    for (int i = 0; i < 2; i++) {
        kiln_tensor *labels = oc_tensor(KILN_I64, OC_CONTIG, 1, (int64_t[]){3}, i ? negative : bad);
        kiln_tensor *in[2] = {x, labels};
        /* eagerly the label is named; traced (and on CUDA) the gather's index */
        if (oc_device() == KILN_CPU) {
            ck_assert_ptr_null(kiln_cross_entropy(x, labels));
            ck_assert_kiln_error("kiln_cross_entropy", i ? "label -1 at [1]" : "label 4 at [1]", "4 classes");
        }
        oc_check_error("cross_entropy", apply_cross_entropy, &p, 2, in, "out of range");
        oc_check_error("nll_loss", apply_nll, &p, 2, in, "out of range");
    }
    ck_assert_ptr_null(kiln_cross_entropy(x, kiln_zeros(KILN_F32, 1, (int64_t[]){3})));
    ck_assert_kiln_error("kiln_cross_entropy", "i64 or i32");
    ck_assert_ptr_null(kiln_cross_entropy(x, kiln_zeros(KILN_I64, 1, (int64_t[]){2})));
    ck_assert_kiln_error("kiln_cross_entropy", "[N, C] and [N]");
    ck_assert_ptr_null(kiln_cross_entropy_ex(x, kiln_zeros(KILN_I64, 1, (int64_t[]){3}), -100, 1.5));
    ck_assert_kiln_error("kiln_cross_entropy", "smoothing 1.5");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_mse_loss(x, NULL));
    ck_assert_kiln_error("kiln_mse_loss", "operand b");
}
END_TEST

/* Traced, the norms are one kernel each, and cross_entropy's rows are read
 * by one kernel, which picks each row's label's logit itself (a checked
 * gather in the kernel): beside it only the batch's small sums run. */
static kiln_tensor *rms_body(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_rms_norm(in[0], in[1], 1e-5);
}

static kiln_tensor *layer_axes_body(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_layer_norm_axes(in[0], 2, NULL, NULL, 1e-5);
}

static kiln_tensor *cross_entropy_body(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_cross_entropy_ex(in[0], in[2], -100, 0.1);
}

START_TEST(test_fusion)
{
    kiln_tensor *in[3] = {kiln_randn(2, (int64_t[]){64, 32}, 1), kiln_randn(1, (int64_t[]){32}, 2),
                          kiln_remainder(kiln_arange(0, 64, 1, KILN_I64), kiln_full(KILN_I64, 0, NULL, 32))};
    int k = oc_kernels(rms_body, NULL, 2, in);
    ck_assert_msg(k == 1 || k == -1, "rms_norm: %d kernels", k);
    kiln_tensor *x3 = kiln_randn(3, (int64_t[]){4, 8, 16}, 3);
    k = oc_kernels(layer_axes_body, NULL, 1, &x3);
    ck_assert_msg(k == 1 || k == -1, "layer_norm_axes: %d kernels", k);
    /* the row kernel (its reductions, the label's logit, the row's loss);
     * over the batch the kept rows, the two sums (eager, over every element)
     * and their quotient */
    k = oc_kernels(cross_entropy_body, NULL, 3, in);
    ck_assert_msg(k == 5 || k == -1, "cross_entropy: %d kernels", k);
    params p = {.ignore = -100};
    kiln_tensor *pair[2] = {in[0], in[2]};
    k = oc_kernels(apply_nll, &p, 2, pair);
    ck_assert_msg(k == 5 || k == -1, "nll_loss: %d kernels", k);
}
END_TEST

/* fn on in compiled (strict) on oc_device(), against fn eagerly there. */
static void check_traced_loss(const char *what, oc_fn fn, const params *p, kiln_tensor *logits, kiln_tensor *labels)
{
    kiln_scope_begin();
    kiln_tensor *moved[2];
    oc_move(what, 2, (kiln_tensor *[]){logits, labels}, moved);
    double want = kiln_item(fn(moved, p));
    kiln_tensor *got = oc_traced(fn, p, 2, moved, KILN_BACKEND_AUTO);
    ck_assert_msg(got != NULL, "%s: %s", what, kiln_last_error());
    double g = kiln_item(got);
    ck_assert_msg(isnan(want) ? isnan(g) : fabs(g - want) <= 1e-5 * fabs(want) + 1e-6, "%s: %.9g, eagerly %.9g",
                  what, g, want);
    kiln_scope_end();
}

/* Labels [n] of dtype dt, class 7i % c, row at labeled label (none: -1). */
static kiln_tensor *labels_of(kiln_dtype dt, int64_t n, int64_t c, int64_t at, int64_t label)
{
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = i == at ? (double)label : (double)((i * 7) % c);
    kiln_tensor *t = oc_tensor(dt, OC_CONTIG, 1, &n, v);
    free(v);
    return t;
}

/* Traced cross_entropy and nll_loss (the label's logit a checked gather in
 * the row kernel) against eager: batches of 0, 1 and many rows, ignored
 * rows, smoothing, i32 and i64 labels, logits transposed or strided. */
START_TEST(test_loss_traced)
{
    static const struct {
        int64_t n, c;
        double smoothing;
        bool ignored, i32;
        oc_layout layout;
    } cases[] = {{37, 11, 0, true, false, OC_CONTIG}, {1, 5, 0.2, false, true, OC_CONTIG},
                 {0, 5, 0, false, false, OC_CONTIG},  {9, 6, 0.1, true, true, OC_TRANSPOSED},
                 {5, 3, 0, true, false, OC_STEP2}};
    for (int k = 0; k < OC_COUNT(cases); k++) {
        if (!oc_sampled(k * 3))
            continue;
        int64_t n = cases[k].n, c = cases[k].c;
        oc_operand x;
        oc_operand_init(&x, KILN_F32, cases[k].layout, 2, (int64_t[]){n, c}, -4, 4, (uint64_t)k + 40);
        kiln_tensor *labels = labels_of(cases[k].i32 ? KILN_I32 : KILN_I64, n, c, cases[k].ignored ? 0 : -1, 2);
        params p = {.ignore = cases[k].ignored ? 2 : -100, .smoothing = cases[k].smoothing};
        char what[64];
        snprintf(what, sizeof what, "cross_entropy case %d", k);
        check_traced_loss(what, apply_cross_entropy, &p, x.t, labels);
        snprintf(what, sizeof what, "nll_loss case %d", k);
        check_traced_loss(what, apply_nll, &p, x.t, labels);
    }
}
END_TEST

static kiln_tensor *pick_body(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_gather(in[0], 1, in[1]);
}

/* y - y[label] along each row of y = 2x: the pick read in every element's
 * loop, from a value that dies there (so never written over in place). */
static kiln_tensor *centered_body(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    kiln_tensor *y = kiln_mul_scalar(in[0], 2);
    return kiln_sub(y, kiln_gather(y, 1, in[1]));
}

/* A label out of range fails the compiled call (CPU and CUDA) with the
 * gather's error naming the index as picked (a negative label moved down by
 * C), wherever its row is; kiln_gather's own negative indices count from
 * the end, and one below -C fails too; a pick read along the row. */
START_TEST(test_loss_traced_errors)
{
    enum { N = 301, C = 4 };
    kiln_tensor *x = kiln_randn(2, (int64_t[]){N, C}, 7);
    static const struct {
        int64_t at, label;
        const char *needle;
    } bad[] = {{N - 1, 4, "index 4 is out of range for axis 1 of size 4"},
               {1, -1, "index -5 is out of range for axis 1 of size 4"}};
    params p = {.ignore = -100};
    for (int b = 0; b < OC_COUNT(bad); b++) {
        if (!oc_sampled(b))
            continue;
        kiln_tensor *labels = labels_of(KILN_I64, N, C, bad[b].at, bad[b].label);
        kiln_scope_begin();
        kiln_tensor *moved[2];
        oc_move("labels", 2, (kiln_tensor *[]){x, labels}, moved);
        for (int f = 0; f < 2; f++) {
            kiln_clear_error();
            ck_assert_ptr_null(oc_traced(f ? apply_nll : apply_cross_entropy, &p, 2, moved, KILN_BACKEND_AUTO));
            ck_assert_msg(strstr(kiln_last_error(), bad[b].needle), "label %lld: %s", (long long)bad[b].label,
                          kiln_last_error());
        }
        kiln_scope_end();
    }
    const double idx[] = {-1, 3, -4, 0}, too_low[] = {0, -5, 1, 2};
    kiln_tensor *small = kiln_randn(2, (int64_t[]){4, C}, 8);
    kiln_tensor *in[2] = {small, oc_tensor(KILN_I64, OC_CONTIG, 2, (int64_t[]){4, 1}, idx)};
    double *v = test_values(small), want[4];
    for (int i = 0; i < 4; i++)
        want[i] = v[i * C + ((int64_t)idx[i] + C) % C];
    oc_check("gather of one per row", pick_body, NULL, 2, in, KILN_F32, 2, (int64_t[]){4, 1}, want, CLOSE_F32);
    double centered[4 * C];
    for (int i = 0; i < 4 * C; i++)
        centered[i] = 2 * v[i] - 2 * want[i / C];
    free(v);
    oc_check("row minus its pick", centered_body, NULL, 2, in, KILN_F32, 2, (int64_t[]){4, C}, centered, CLOSE_F32);
    in[1] = oc_tensor(KILN_I64, OC_CONTIG, 2, (int64_t[]){4, 1}, too_low);
    oc_check_error("gather of one per row", pick_body, NULL, 2, in, "index -5");
}
END_TEST

/* -- Dropout ------------------------------------------------------------------------- */

/* Random123's known answer for Philox4x32-10 with key and counter 0:
 * 0x6627e8d5 0xe169c58d 0xbc57ac4c 0x9b00dbd8, so uniform values 0.399,
 * 0.881, 0.736, 0.606 (the top 24 bits): the masks of 4 ones at the
 * generator's start under seed 0 keep the elements below 1 - p. */
START_TEST(test_dropout_known_answer)
{
    static const struct {
        double p, want[4];
    } cases[] = {{0.5, {2, 0, 0, 0}}, {0.3, {1 / 0.7, 0, 0, 1 / 0.7}}, {0.2, {1.25, 0, 1.25, 1.25}}};
    for (int c = 0; c < OC_COUNT(cases); c++) {
        kiln_manual_seed(0);
        kiln_tensor *ones = kiln_ones(KILN_F64, 1, (int64_t[]){4});
        if (oc_device() == KILN_CUDA)
            ones = kiln_to_device(ones, KILN_CUDA);
        double *got = test_values(kiln_dropout(ones, cases[c].p, true));
        for (int i = 0; i < 4; i++)
            ck_assert_msg(got[i] == cases[c].want[i], "p %g: element %d is %g, want %g", cases[c].p, i, got[i],
                          cases[c].want[i]);
        free(got);
    }
}
END_TEST

/* Each element is dropped (0) or kept and scaled, about 1 - p of them kept;
 * a NaN stays NaN either way; the offset moves by the draw's whole blocks;
 * the same state draws the same mask. */
START_TEST(test_dropout_values)
{
    enum { N = 1203 };
    oc_operand x;
    oc_operand_init(&x, KILN_F32, OC_STEP2, 2, (int64_t[]){3, 401}, -3, 3, 5);
    x.v[7] = NAN;
    x.t = oc_tensor(KILN_F32, OC_STEP2, 2, x.shape, x.v);
    kiln_tensor *xd = oc_device() == KILN_CUDA ? kiln_to_device(x.t, KILN_CUDA) : x.t;
    kiln_set_rng_state(42, 17);
    uint64_t seed, offset;
    kiln_rng_state(&seed, &offset);
    ck_assert(seed == 42 && offset == 20);
    double *a = test_values(kiln_dropout(xd, 0.25, true));
    kiln_rng_state(NULL, &offset);
    ck_assert_int_eq(offset, 20 + 1204);
    int kept = 0;
    float scale = (float)(1 / 0.75);
    for (int i = 0; i < N; i++) {
        if (isnan(x.v[i])) {
            ck_assert(isnan(a[i]));
            continue;
        }
        ck_assert_msg(a[i] == 0 || a[i] == (float)((float)x.v[i] * scale), "element %d: %g of %g", i, a[i], x.v[i]);
        kept += a[i] != 0;
    }
    ck_assert_msg(kept > 0.7 * N && kept < 0.8 * N, "%d of %d kept at p 0.25", kept, N);
    kiln_set_rng_state(42, 17);
    double *b = test_values(kiln_dropout(xd, 0.25, true));
    for (int i = 0; i < N; i++)
        ck_assert(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])));
    free(a);
    free(b);
    if (oc_device() == KILN_CUDA) { /* the CPU draws what CUDA drew */
        kiln_set_rng_state(42, 17);
        double *cpu = test_values(kiln_dropout(x.t, 0.25, true));
        kiln_set_rng_state(42, 17);
        double *gpu = test_values(kiln_dropout(xd, 0.25, true));
        for (int i = 0; i < N; i++)
            ck_assert_msg(cpu[i] == gpu[i] || (isnan(cpu[i]) && isnan(gpu[i])), "element %d: CPU %g, CUDA %g", i,
                          cpu[i], gpu[i]);
        free(cpu);
        free(gpu);
    }
}
END_TEST

static kiln_tensor *twice_dropped(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    return kiln_add(kiln_dropout(in[0], 0.5, true), kiln_dropout(kiln_mul_scalar(in[0], 10), 0.2, true));
}

/* A traced call draws what the body run eagerly from the same state draws,
 * a new mask each call, on the interpreter and compiled alike. */
START_TEST(test_dropout_traced)
{
    kiln_tensor *x = kiln_randn(2, (int64_t[]){5, 7}, 3);
    if (oc_device() == KILN_CUDA)
        x = kiln_to_device(x, KILN_CUDA);
    double *eager[2];
    kiln_set_rng_state(9, 0);
    for (int c = 0; c < 2; c++)
        eager[c] = test_values(twice_dropped(&x, NULL));
    for (int backend = 0; backend < 2; backend++) {
        oc_body_ctx b = {twice_dropped, NULL};
        kiln_jit_options o = kiln_jit_defaults();
        o.backend = backend ? KILN_BACKEND_AUTO : KILN_BACKEND_INTERP;
        o.strict = true;
        kiln_fn *f = kiln_jit("dropout", oc_body, 1, 1, &b, &o);
        kiln_set_rng_state(9, 0);
        for (int c = 0; c < 2; c++) {
            kiln_tensor *out;
            ck_assert_msg(kiln_call(f, &x, &out) == 0, "%s", kiln_last_error());
            double *got = test_values(out);
            for (int i = 0; i < 35; i++)
                ck_assert_msg(got[i] == eager[c][i], "backend %d call %d element %d: %g, eager %g", backend, c, i,
                              got[i], eager[c][i]);
            free(got);
        }
        kiln_fn_free(f);
    }
    bool differ = false;
    for (int i = 0; i < 35; i++)
        differ |= eager[0][i] != eager[1][i];
    ck_assert_msg(differ, "two calls drew the same masks");
    free(eager[0]);
    free(eager[1]);
}
END_TEST

/* With dynamic shapes a draw keeps the size it was traced at (the words a
 * call takes are counted then): a new batch size specializes again, and
 * every call still draws what eager draws from the same state. */
START_TEST(test_dropout_dynamic)
{
    oc_body_ctx b = {twice_dropped, NULL};
    kiln_fn *f = kiln_jit("dropout_dynamic", oc_body, 1, 1, &b, NULL);
    for (int64_t rows = 2; rows <= (UNDER_VALGRIND() ? 3 : 5); rows++) { /* each size compiles */
        kiln_tensor *x = kiln_randn(2, (int64_t[]){rows, 7}, (uint64_t)rows);
        if (oc_device() == KILN_CUDA)
            x = kiln_to_device(x, KILN_CUDA);
        kiln_set_rng_state(3, 8);
        double *want = test_values(twice_dropped(&x, NULL));
        kiln_set_rng_state(3, 8);
        kiln_tensor *out;
        ck_assert_msg(kiln_call(f, &x, &out) == 0, "%s", kiln_last_error());
        double *got = test_values(out);
        for (int64_t i = 0; i < rows * 7; i++)
            ck_assert_msg(got[i] == want[i], "%lld rows, element %lld: %g, eager %g", (long long)rows, (long long)i,
                          got[i], want[i]);
        free(got);
        free(want);
    }
    kiln_fn_free(f);
}
END_TEST

START_TEST(test_dropout_edges)
{
    const double v[] = {1, NAN, -INFINITY, 2};
    kiln_tensor *x = oc_tensor(KILN_F32, OC_CONTIG, 1, (int64_t[]){4}, v);
    kiln_tensor *same = kiln_dropout(x, 0.5, false);
    ck_assert(same == x);
    ck_assert(kiln_dropout(x, 0, true) == x);
    double *z = test_values(kiln_dropout(x, 1, true));
    ck_assert(z[0] == 0 && isnan(z[1]) && isnan(z[2]) && z[3] == 0 && !signbit(z[0]));
    free(z);
    ck_assert_ptr_null(kiln_dropout(x, 1.5, true));
    ck_assert_kiln_error("kiln_dropout", "p 1.5");
    ck_assert_ptr_null(kiln_dropout(kiln_ones(KILN_I32, 1, (int64_t[]){2}), 0.5, true));
    ck_assert_kiln_error("kiln_dropout", "floating point");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_dropout(NULL, 0.5, true));
    ck_assert_kiln_error("kiln_dropout", "operand a");
}
END_TEST

static Suite *nn_suite(void)
{
    Suite *s = suite_create("nn");
    TCase *tc = tcase_create("nn");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_batch_norm);
    tcase_add_test(tc, test_group_norm);
    tcase_add_test(tc, test_rms_and_layer_norm);
    tcase_add_test(tc, test_cross_entropy);
    tcase_add_test(tc, test_cross_entropy_pytorch);
    tcase_add_test(tc, test_mse_loss);
    tcase_add_test(tc, test_loss_errors);
    tcase_add_test(tc, test_fusion);
    tcase_add_test(tc, test_loss_traced);
    tcase_add_test(tc, test_loss_traced_errors);
    tcase_add_test(tc, test_dropout_known_answer);
    tcase_add_test(tc, test_dropout_values);
    tcase_add_test(tc, test_dropout_traced);
    tcase_add_test(tc, test_dropout_dynamic);
    tcase_add_test(tc, test_dropout_edges);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(nn_suite)
