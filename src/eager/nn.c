/* Normalisation and losses written with the table's ops, so that they trace
 * and fuse: batch_norm (inference), group_norm, rms_norm, layer_norm over
 * the last k axes; cross_entropy, nll_loss and mse_loss.
 *
 * Each one that reads rows reads them in one kernel when traced: a norm
 * over the last axis is its reductions and the scaled row in one pass, and
 * cross_entropy's per-row loss (log-sum-exp, the label's logit picked by a
 * gather, which the kernel reads itself with a checked load, label
 * smoothing's mean) is a row epilogue of one kernel over the logits; the
 * batch mean is a small reduction after it. */
#include <string.h>

#include "eager/internal.h"

/* -- Checks ------------------------------------------------------------------- */

/* An optional per-channel operand: NULL, or 1-d of size c. */
static bool check_channels(const char *fn, const char *name, const kiln_tensor *t, int64_t c, bool optional)
{
    if (!t && optional)
        return true;
    if (!t) {
        core_fail_null(fn, name);
        return false;
    }
    if (t->ndim == 1 && t->shape[0] == c)
        return true;
    char d[DESCRIBE_MAX];
    core_fail(CORE_SHAPE, fn, "%s %s must be 1-d of the %lld channels", name, describe(d, t), (long long)c);
    return false;
}

/* t [c] as [c, 1, ..., 1] to broadcast over axis 1 of an ndim-d tensor. */
static kiln_tensor *per_channel(kiln_tensor *t, int ndim)
{
    int64_t shape[KILN_MAX_DIMS];
    shape[0] = t->shape[0];
    for (int d = 1; d < ndim - 1; d++)
        shape[d] = 1;
    return kiln_reshape(t, ndim - 1, shape);
}

/* -- Norms -------------------------------------------------------------------- */

kiln_tensor *kiln_batch_norm(kiln_tensor *x, kiln_tensor *mean, kiln_tensor *var, kiln_tensor *gamma,
                             kiln_tensor *beta, double eps)
{
    const char *fn = "kiln_batch_norm";
    if (!composite_check(fn, x, 0, false))
        return NULL;
    if (x->ndim < 2) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "x %s needs a batch and a channel axis", describe(d, x));
        return NULL;
    }
    int64_t c = x->shape[1];
    if (!check_channels(fn, "mean", mean, c, false) || !check_channels(fn, "var", var, c, false) ||
        !check_channels(fn, "gamma", gamma, c, true) || !check_channels(fn, "beta", beta, c, true))
        return NULL;
    composite_begin();
    /* (x - mean) * scale + beta: the [C] factors first, then one pass over x */
    kiln_tensor *scale = kiln_rsqrt(kiln_add_scalar(composite_float(var), eps));
    if (gamma)
        scale = kiln_mul(scale, gamma);
    kiln_tensor *y = kiln_mul(kiln_sub(composite_float(x), per_channel(mean, x->ndim)), per_channel(scale, x->ndim));
    if (beta)
        y = kiln_add(y, per_channel(beta, x->ndim));
    return composite_end(fn, y);
}

/* x normalized over its last axis: (x - mean) / sqrt(var + eps), var biased. */
static kiln_tensor *normalized(kiln_tensor *x, double eps)
{
    kiln_tensor *centered = kiln_sub(x, kiln_mean(x, -1, true));
    kiln_tensor *var = kiln_mean(kiln_mul(centered, centered), -1, true);
    return kiln_mul(centered, kiln_rsqrt(kiln_add_scalar(var, eps)));
}

kiln_tensor *kiln_group_norm(kiln_tensor *x, int64_t groups, kiln_tensor *gamma, kiln_tensor *beta, double eps)
{
    const char *fn = "kiln_group_norm";
    if (!composite_check(fn, x, 0, false))
        return NULL;
    char d[DESCRIBE_MAX];
    if (x->ndim < 2 || groups < 1 || x->shape[1] % groups) {
        core_fail(CORE_SHAPE, fn, "x %s needs a batch and a channel axis, its channels in %lld equal groups",
                  describe(d, x), (long long)groups);
        return NULL;
    }
    if (!check_channels(fn, "gamma", gamma, x->shape[1], true) || !check_channels(fn, "beta", beta, x->shape[1], true))
        return NULL;
    composite_begin();
    int64_t grouped[3] = {x->shape[0], groups, -1};
    if (x->shape[0] * groups == 0) /* an empty batch: -1 cannot be inferred */
        grouped[2] = 0;
    kiln_tensor *y = normalized(kiln_reshape(composite_float(x), 3, grouped), eps);
    y = kiln_reshape(y, x->ndim, x->shape);
    if (gamma)
        y = kiln_mul(y, per_channel(gamma, x->ndim));
    if (beta)
        y = kiln_add(y, per_channel(beta, x->ndim));
    return composite_end(fn, y);
}

kiln_tensor *kiln_rms_norm(kiln_tensor *x, kiln_tensor *gamma, double eps)
{
    const char *fn = "kiln_rms_norm";
    if (!composite_check(fn, x, -1, true))
        return NULL;
    composite_begin();
    kiln_tensor *f = composite_float(x);
    kiln_tensor *ms = kiln_mean(kiln_mul(f, f), -1, true);
    kiln_tensor *y = kiln_mul(f, kiln_rsqrt(kiln_add_scalar(ms, eps)));
    return composite_end(fn, gamma ? kiln_mul(y, gamma) : y);
}

/* An affine operand of layer_norm_axes seen in the merged space: broadcast
 * to the normalized shape, then flattened. */
static kiln_tensor *flat_affine(kiln_tensor *t, int k, const int64_t *normalized_shape, int64_t size)
{
    return t ? kiln_reshape(kiln_expand(t, k, normalized_shape), 1, &size) : NULL;
}

kiln_tensor *kiln_layer_norm_axes(kiln_tensor *x, int k, kiln_tensor *gamma, kiln_tensor *beta, double eps)
{
    const char *fn = "kiln_layer_norm_axes";
    if (!composite_check(fn, x, 0, false))
        return NULL;
    if (k < 1 || k > x->ndim) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "cannot normalize the last %d axes of %s", k, describe(d, x));
        return NULL;
    }
    const int64_t *last = x->shape + x->ndim - k;
    int64_t merged[KILN_MAX_DIMS], size = 1;
    for (int d = 0; d < k; d++)
        size *= last[d];
    memcpy(merged, x->shape, sizeof merged);
    merged[x->ndim - k] = size;
    composite_begin();
    /* The normalized axes merged into one: a layer norm over the last axis,
     * one kernel when traced. A gamma or beta that does not broadcast to
     * them fails (as NULL, kiln_layer_norm would read it as none). */
    kiln_tensor *g = flat_affine(gamma, k, last, size), *b = flat_affine(beta, k, last, size);
    kiln_tensor *y = (gamma && !g) || (beta && !b)
                         ? NULL
                         : kiln_layer_norm(kiln_reshape(x, x->ndim - k + 1, merged), g, b, eps);
    return composite_end(fn, kiln_reshape(y, x->ndim, x->shape));
}

/* -- Losses ------------------------------------------------------------------- */

/* logits [N, C] (a [C] one as [1, C]) and labels [N] (0-d) of i32 or i64. */
static bool check_classes(const char *fn, kiln_tensor *logits, kiln_tensor *labels)
{
    kiln_tensor *operands[2] = {logits, labels};
    if (check_operands(fn, 2, operands, (const char *const[]){"logits", "labels"}) < 0)
        return false;
    char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
    bool batched = logits->ndim == 2 && labels->ndim == 1 && labels->shape[0] == logits->shape[0];
    bool single = logits->ndim == 1 && labels->ndim == 0;
    if (!batched && !single)
        core_fail(CORE_SHAPE, fn, "logits %s and labels %s: need [N, C] and [N], or [C] and []", describe(a, logits),
                  describe(b, labels));
    else if (labels->dtype != KILN_I64 && labels->dtype != KILN_I32)
        core_fail(CORE_DTYPE, fn, "labels %s must be i64 or i32", describe(b, labels));
    else
        return true;
    return false;
}

/* Eagerly on the CPU, every label is ignore_index or a class: fn's error
 * naming the first that is not. (Traced or on CUDA, the gather checks.) */
static int check_labels(const char *fn, const kiln_tensor *labels, int64_t classes, int64_t ignore_index)
{
    if (recording() || labels->device != KILN_CPU)
        return 0;
    kiln_tensor *l = copy_as(fn, labels, KILN_I64);
    if (!l)
        return core_error_status();
    const int64_t *v = (const int64_t *)eager_data(l);
    for (int64_t i = 0; i < l->numel; i++) {
        if (v[i] == ignore_index || (v[i] >= 0 && v[i] < classes))
            continue;
        int64_t at = v[i];
        kiln_release(l);
        return core_fail(CORE_VALUE, fn, "label %lld at [%lld] is out of range for %lld classes", (long long)at,
                         (long long)i, (long long)classes);
    }
    kiln_release(l);
    return 0;
}

/* The rows' picked entries x[i, labels[i]] as [N, 1] by gather (which
 * fails on a label out of range: a negative one is moved below -C so that
 * it is out of range too), with ignored labels reading class 0. */
static kiln_tensor *picked(const char *fn, kiln_tensor *x, kiln_tensor *labels, int64_t ignore_index)
{
    int64_t n = x->shape[0], c = x->shape[1], column[2] = {n, 1};
    kiln_tensor *zero = eager_filled(fn, labels->dtype, 0, NULL, 0, labels->device);
    kiln_tensor *shifted = kiln_where(eager_scalar_op(OP_LT, fn, labels, 0, false),
                                      kiln_sub_scalar(labels, (double)c), labels);
    kiln_tensor *index = kiln_where(eager_scalar_op(OP_EQ, fn, labels, (double)ignore_index, false), zero, shifted);
    return kiln_gather(x, 1, kiln_reshape(index, 2, column));
}

/* The mean of per-row losses [N, 1] over the rows whose label is not
 * ignore_index (NaN when there are none, as in PyTorch). */
static kiln_tensor *mean_over_labels(const char *fn, kiln_tensor *losses, kiln_tensor *labels, int64_t ignore_index)
{
    int64_t column[2] = {labels->shape[0], 1};
    kiln_tensor *kept = kiln_reshape(eager_scalar_op(OP_NE, fn, labels, (double)ignore_index, false), 2, column);
    kiln_tensor *zero = eager_filled(fn, losses ? losses->dtype : KILN_F32, 0, NULL, 0, labels->device);
    kiln_tensor *total = kiln_sum(kiln_where(kept, losses, zero), KILN_ALL, false);
    return kiln_div(total, kiln_sum(kept, KILN_ALL, false));
}

/* Runs loss on the batched form of a [C] / [] pair, with labels that
 * ignore_index compares with exactly: i32 labels are compared in their
 * dtype, to which an ignore_index outside it would wrap (2^32 to 0). */
static void batched(kiln_tensor **logits, kiln_tensor **labels, int64_t ignore_index)
{
    if ((*labels)->dtype == KILN_I32 && (ignore_index < INT32_MIN || ignore_index > INT32_MAX))
        *labels = kiln_cast(*labels, KILN_I64);
    if ((*logits)->ndim == 2)
        return;
    int64_t row[2] = {1, (*logits)->shape[0]}, one = 1;
    *logits = kiln_reshape(*logits, 2, row);
    *labels = kiln_reshape(*labels, 1, &one);
}

static kiln_tensor *cross_entropy(const char *fn, kiln_tensor *logits, kiln_tensor *labels, int64_t ignore_index,
                                  double label_smoothing)
{
    if (!check_classes(fn, logits, labels))
        return NULL;
    if (!(label_smoothing >= 0 && label_smoothing <= 1)) {
        core_fail(CORE_VALUE, fn, "label smoothing %g is not in [0, 1]", label_smoothing);
        return NULL;
    }
    if (check_labels(fn, labels, logits->shape[logits->ndim - 1], ignore_index) < 0)
        return NULL;
    composite_begin();
    batched(&logits, &labels, ignore_index);
    if (!logits || !labels)
        return composite_end(fn, NULL);
    kiln_tensor *x = composite_float(logits);
    /* log-sum-exp shifted by the row's maximum, as log_softmax is */
    kiln_tensor *m = kiln_max(x, -1, true);
    kiln_tensor *lse = kiln_add(kiln_log(kiln_sum(kiln_exp(kiln_sub(x, m)), -1, true)), m);
    kiln_tensor *loss = kiln_sub(lse, picked(fn, x, labels, ignore_index));
    if (label_smoothing > 0) { /* the uniform target's share: lse - mean(x) */
        kiln_tensor *smooth = kiln_sub(lse, kiln_mean(x, -1, true));
        loss = kiln_add(kiln_mul_scalar(loss, 1 - label_smoothing), kiln_mul_scalar(smooth, label_smoothing));
    }
    return composite_end(fn, mean_over_labels(fn, loss, labels, ignore_index));
}

kiln_tensor *kiln_cross_entropy_ex(kiln_tensor *logits, kiln_tensor *labels, int64_t ignore_index,
                                   double label_smoothing)
{
    return cross_entropy("kiln_cross_entropy_ex", logits, labels, ignore_index, label_smoothing);
}

kiln_tensor *kiln_cross_entropy(kiln_tensor *logits, kiln_tensor *labels)
{
    return cross_entropy("kiln_cross_entropy", logits, labels, -100, 0);
}

kiln_tensor *kiln_nll_loss(kiln_tensor *log_probs, kiln_tensor *labels, int64_t ignore_index)
{
    const char *fn = "kiln_nll_loss";
    if (!check_classes(fn, log_probs, labels) ||
        check_labels(fn, labels, log_probs->shape[log_probs->ndim - 1], ignore_index) < 0)
        return NULL;
    composite_begin();
    batched(&log_probs, &labels, ignore_index);
    if (!log_probs || !labels)
        return composite_end(fn, NULL);
    kiln_tensor *x = composite_float(log_probs);
    return composite_end(fn, mean_over_labels(fn, kiln_neg(picked(fn, x, labels, ignore_index)), labels, ignore_index));
}

kiln_tensor *kiln_mse_loss(kiln_tensor *a, kiln_tensor *b)
{
    const char *fn = "kiln_mse_loss";
    if (!composite_check_pair(fn, a, b))
        return NULL;
    composite_begin();
    kiln_tensor *d = composite_float(kiln_sub(composite_float(a), b));
    return composite_end(fn, kiln_mean(kiln_mul(d, d), KILN_ALL, false));
}
