/* Convolution and pooling over NCHW, written with the table's ops so that
 * they run on every device and trace: conv2d as windows of the padded input
 * (strided slices) stacked into columns and one batched product per group,
 * depthwise convolution and the pools as sums (or maxima) of the windows,
 * elementwise. A trace on the CPU records a convolution as one conv2d node
 * instead, which the CPU backend computes with its epilogue fused, as an
 * implicit GEMM (no column buffer) or, depthwise, directly (no padding
 * buffer), and the interpreter and eager steps as the composite. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eager/internal.h"

/* -- Shapes ---------------------------------------------------------------------- */

/* The output extent of a window of k taps dilated by d, stepping s over an
 * extent padded by p on each side (ceil_mode: PyTorch's rounding up, where
 * a last window must start inside the input or its left padding); -1 when
 * no window fits. */
static int64_t windows(int64_t extent, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode)
{
    if (k > INT32_MAX) /* (an empty weight may be that wide) */
        return -1;
    int64_t span = d * (k - 1) + 1, room = extent + 2 * p - span;
    if (room < 0)
        return -1;
    int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
    if (ceil_mode && (out - 1) * s >= extent + p)
        out--;
    return out;
}

/* x [N, C, H, W], or [C, H, W] as a batch of 1: its sizes as
 * [N, C, H, W] in shape; fn's error otherwise. */
static int batched(const char *fn, const kiln_tensor *x, int64_t shape[4])
{
    char d[DESCRIBE_MAX];
    if (!x)
        return core_fail_null(fn, "x");
    if (x->ndim != 3 && x->ndim != 4)
        return core_fail(CORE_SHAPE, fn, "x %s must be [N, C, H, W] or [C, H, W]", describe(d, x));
    shape[0] = 1;
    memcpy(shape + 4 - x->ndim, x->shape, (size_t)x->ndim * sizeof *shape);
    return 0;
}

/* The windows' tap (i, j) of xp (padded): [N, C, oh, ow]. */
static kiln_tensor *tap(kiln_tensor *xp, int64_t i, int64_t j, const int64_t *stride, const int64_t *dilation,
                        int64_t oh, int64_t ow)
{
    int64_t h0 = i * dilation[0], w0 = j * dilation[1];
    kiln_tensor *rows = kiln_slice(xp, 2, h0, h0 + (oh - 1) * stride[0] + 1, stride[0]);
    return kiln_slice(rows, 3, w0, w0 + (ow - 1) * stride[1] + 1, stride[1]);
}

/* x padded by pad[0] above and below, pad[1] left and right, and extra[]
 * more below and right, with value. */
static kiln_tensor *padded(kiln_tensor *x, const int64_t *pad, const int64_t *extra, double value)
{
    int64_t pads[4] = {pad[1], pad[1] + extra[1], pad[0], pad[0] + extra[0]};
    if (!pads[0] && !pads[1] && !pads[2] && !pads[3])
        return x;
    return kiln_pad(x, 4, pads, KILN_PAD_CONSTANT, value);
}

/* Every tap of xp's windows (of kernel, undilated) folded by op (kiln_add,
 * kiln_maximum): [N, C, oh, ow]. */
static kiln_tensor *taps_folded(kiln_tensor *xp, const int64_t *kernel, const int64_t *stride, int64_t oh, int64_t ow,
                                kiln_tensor *(*op)(kiln_tensor *, kiln_tensor *))
{
    const int64_t undilated[2] = {1, 1};
    kiln_tensor *acc = NULL;
    for (int64_t i = 0; i < kernel[0]; i++)
        for (int64_t j = 0; j < kernel[1]; j++) {
            kiln_tensor *t = tap(xp, i, j, stride, undilated, oh, ow);
            acc = acc ? op(acc, t) : t;
        }
    return acc;
}

/* -- conv2d ---------------------------------------------------------------------- */

typedef struct {
    int64_t stride[2], padding[2], dilation[2], groups;
} conv_params;

/* Whether a window parameter is one kiln's size arithmetic takes without
 * overflow. */
static bool in_range(int64_t v)
{
    return v >= 0 && v <= INT32_MAX;
}

/* p with its zeros made defaults; fn's error when a value is out of range. */
static int resolve_conv(const char *fn, const kiln_conv2d_params *p, conv_params *c)
{
    kiln_conv2d_params zero = {{0, 0}, {0, 0}, {0, 0}, 0};
    p = p ? p : &zero;
    for (int a = 0; a < 2; a++) {
        if (!in_range(p->stride[a]) || !in_range(p->padding[a]) || !in_range(p->dilation[a]))
            return core_fail(CORE_VALUE, fn, "stride %lld, padding %lld and dilation %lld of axis %d must be in [0, 2^31)",
                             (long long)p->stride[a], (long long)p->padding[a], (long long)p->dilation[a], a + 2);
        c->stride[a] = p->stride[a] ? p->stride[a] : 1;
        c->padding[a] = p->padding[a];
        c->dilation[a] = p->dilation[a] ? p->dilation[a] : 1;
    }
    if (p->groups < 0)
        return core_fail(CORE_VALUE, fn, "groups %lld cannot be negative", (long long)p->groups);
    c->groups = p->groups ? p->groups : 1;
    return 0;
}

/* x [N, C, H, W], w [O, C / groups, KH, KW], bias [O] or NULL; the output
 * size into out (N, O, OH, OW). */
static int check_conv(const char *fn, const kiln_tensor *x, const int64_t xs[4], const kiln_tensor *w,
                      const kiln_tensor *bias, const conv_params *c, int64_t out[4])
{
    char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
    if (!w)
        return core_fail_null(fn, "w");
    if (!ir_dtype_is_float(x->dtype) || !ir_dtype_is_float(w->dtype))
        return core_fail(CORE_DTYPE, fn, "x %s and w %s must be floating point", describe(a, x), describe(b, w));
    int64_t ch = xs[1], o = w->ndim == 4 ? w->shape[0] : 0;
    if (w->ndim != 4 || ch % c->groups || o % c->groups || w->shape[1] * c->groups != ch)
        return core_fail(CORE_SHAPE, fn, "w %s must be [O, C / groups, KH, KW] for x %s in %lld groups (O too a multiple of groups)",
                         describe(b, w), describe(a, x), (long long)c->groups);
    if (bias && (bias->ndim != 1 || bias->shape[0] != o))
        return core_fail(CORE_SHAPE, fn, "bias %s must be [%lld], one per output channel", describe(a, bias),
                         (long long)o);
    out[0] = xs[0], out[1] = o;
    for (int d = 0; d < 2; d++) {
        out[2 + d] = windows(xs[2 + d], w->shape[2 + d], c->stride[d], c->padding[d], c->dilation[d], false);
        if (out[2 + d] < 1 || w->shape[2 + d] < 1)
            return core_fail(CORE_SHAPE, fn, "kernel %s (dilation %lld) does not fit x %s padded by %lld on axis %d",
                             describe(b, w), (long long)c->dilation[d], describe(a, x), (long long)c->padding[d], 2 + d);
    }
    return 0;
}

/* Each group's channels times its filters, every tap stacked as columns:
 * [G, O/G, C/G KH KW] @ [N, G, C/G KH KW, OH OW]. 1x1 windows of stride 1
 * are x itself. */
static kiln_tensor *conv_product(kiln_tensor *xp, kiln_tensor *w, const conv_params *c, const int64_t out[4])
{
    int64_t n = out[0], ch = xp->shape[1], g = c->groups, kh = w->shape[2], kw = w->shape[3], l = out[2] * out[3];
    int64_t k = ch / g * kh * kw;
    kiln_tensor *cols = xp;
    if (kh * kw > 1 || c->stride[0] > 1 || c->stride[1] > 1) {
        kiln_tensor **taps = malloc((size_t)(kh * kw) * sizeof *taps);
        if (!taps)
            return NULL;
        for (int64_t i = 0; i < kh * kw; i++)
            taps[i] = tap(xp, i / kw, i % kw, c->stride, c->dilation, out[2], out[3]);
        cols = kiln_stack(taps, (int)(kh * kw), 2); /* [N, C, KH KW, OH, OW] */
        free(taps);
    }
    cols = kiln_reshape(cols, 4, (int64_t[]){n, g, k, l});
    kiln_tensor *filters = kiln_reshape(w, 3, (int64_t[]){g, out[1] / g, k});
    return kiln_reshape(kiln_matmul(filters, cols), 4, out);
}

/* Groups of one input channel each (depthwise): output channel o is input
 * channel o / m's taps times w[o]'s, summed: elementwise, fused traced. */
static kiln_tensor *conv_depthwise(kiln_tensor *xp, kiln_tensor *w, const conv_params *c, const int64_t out[4])
{
    int64_t ch = xp->shape[1], m = out[1] / ch, kh = w->shape[2], kw = w->shape[3];
    kiln_tensor *taps = kiln_reshape(w, 3, (int64_t[]){ch, m, kh * kw});
    kiln_tensor *sum = NULL;
    for (int64_t i = 0; i < kh * kw; i++) {
        kiln_tensor *t = kiln_unsqueeze(tap(xp, i / kw, i % kw, c->stride, c->dilation, out[2], out[3]), 2);
        kiln_tensor *f = kiln_reshape(kiln_slice(taps, 2, i, i + 1, 1), 4, (int64_t[]){ch, m, 1, 1});
        kiln_tensor *term = kiln_mul(t, f); /* [N, C, m, OH, OW] */
        sum = sum ? kiln_add(sum, term) : term;
    }
    return kiln_reshape(sum, 4, out);
}

/* y [N, C, H, W] without its batch axis when x [C, H, W] had none. */
static kiln_tensor *unbatch(kiln_tensor *y, const kiln_tensor *x)
{
    return x->ndim == 3 ? kiln_squeeze(y, 0) : y;
}

/* x4 [N, C, H, W] convolved with w, without bias, of the table's ops. */
static kiln_tensor *conv_composite(kiln_tensor *x4, kiln_tensor *w, const conv_params *c, const int64_t out[4])
{
    kiln_tensor *xp = x4 ? padded(x4, c->padding, (int64_t[]){0, 0}, 0) : NULL;
    if (!xp) /* out of memory: the op that failed said so */
        return NULL;
    return x4->shape[1] == c->groups && out[1] > 0 ? conv_depthwise(xp, w, c, out) : conv_product(xp, w, c, out);
}

/* Whether a trace records x4 (*) w as one conv2d node, which the CPU
 * backend computes with its epilogue, as an implicit GEMM or, depthwise,
 * directly (and the interpreter as conv_composite): on the CPU, of one
 * float dtype, without gradients (whose rules are the composite's ops'),
 * not 1x1 of stride 1 (a plain product), nor depthwise with a column
 * stride (its composite's fused windows were faster: 144x56x56, stride 2,
 * 2 threads, 0.33 ms against 0.51-0.59). */
static bool records_node(kiln_tensor *x4, kiln_tensor *w, const conv_params *c)
{
    bool strided_depthwise = x4->shape[1] == c->groups && c->stride[1] > 1;
    bool plain = w->shape[2] * w->shape[3] == 1 && c->stride[0] == 1 && c->stride[1] == 1 && !c->padding[0] &&
                 !c->padding[1];
    return recording() && x4->device == KILN_CPU && x4->dtype == w->dtype && !plain && !strided_depthwise &&
           !grad_wanted(2, (kiln_tensor *[]){x4, w});
}

static kiln_tensor *conv_node(kiln_tensor *x4, kiln_tensor *w, const conv_params *c, const int64_t out[4])
{
    ir_params params = {0};
    for (int d = 0; d < 2; d++) {
        params.perm[IR_CONV_STRIDE + d] = (int32_t)c->stride[d];
        params.perm[IR_CONV_PADDING + d] = (int32_t)c->padding[d];
        params.perm[IR_CONV_DILATION + d] = (int32_t)c->dilation[d];
    }
    params.perm[IR_CONV_GROUPS] = (int32_t)c->groups;
    return record_op("kiln_conv2d", OP_CONV2D, 2, (kiln_tensor *[]){x4, w}, &params, x4->dtype, 4, out);
}

kiln_tensor *eager_conv2d_node(const ir_node *n, kiln_tensor *x, kiln_tensor *w)
{
    const int32_t *p = n->params.perm;
    conv_params c = {.groups = p[IR_CONV_GROUPS]};
    for (int d = 0; d < 2; d++) {
        c.stride[d] = p[IR_CONV_STRIDE + d];
        c.padding[d] = p[IR_CONV_PADDING + d];
        c.dilation[d] = p[IR_CONV_DILATION + d];
    }
    int64_t out[4] = {x->shape[0], n->shape[1], n->shape[2], n->shape[3]};
    composite_begin();
    return composite_end("kiln_conv2d", conv_composite(x, w, &c, out));
}

int eager_conv_args(const char *fn, const ir_node *n, kiln_tensor *x, kiln_tensor *w, kg_matmul_args *args,
                    void *operands[2], kiln_tensor **staged)
{
    char a[DESCRIBE_MAX], b[DESCRIBE_MAX];
    if (x->device != KILN_CPU || w->device != KILN_CPU)
        return core_fail(CORE_DEVICE, fn, "a convolution's x %s and w %s must be on the CPU", describe(a, x),
                         describe(b, w));
    if (!eager_is_contiguous(w) && !(w = *staged = eager_copy(fn, w)))
        return -CORE_NOMEM;
    int64_t g = n->params.perm[IR_CONV_GROUPS], o = w->shape[0] / g, k = w->shape[1] * w->shape[2] * w->shape[3];
    *args = (kg_matmul_args){.batch = x->shape[0] * g, .m = o, .n = n->shape[2] * n->shape[3], .k = k,
                             .batch_shape = {x->shape[0], g}, .a_batch_strides = {0, o * k},
                             .b_batch_strides = {x->strides[0], w->shape[1] * x->strides[1]},
                             .a_row = k, .a_col = 1, .b_row = x->strides[2], .b_col = x->strides[3], .batch_ndim = 2};
    operands[0] = eager_data(w);
    operands[1] = eager_data(x);
    return 0;
}

kiln_tensor *kiln_conv2d(kiln_tensor *x, kiln_tensor *w, kiln_tensor *bias, const kiln_conv2d_params *p)
{
    const char *fn = "kiln_conv2d";
    conv_params c = {{1, 1}, {0, 0}, {1, 1}, 1};
    int64_t xs[4], out[4];
    if (batched(fn, x, xs) < 0 || resolve_conv(fn, p, &c) < 0 ||
        check_conv(fn, x, xs, w, bias, &c, out) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *x4 = kiln_reshape(x, 4, xs);
    kiln_tensor *y = x4 && records_node(x4, w, &c) ? conv_node(x4, w, &c, out) : conv_composite(x4, w, &c, out);
    if (bias)
        y = kiln_add(y, kiln_reshape(bias, 3, (int64_t[]){out[1], 1, 1}));
    return composite_end(fn, unbatch(y, x));
}

/* -- Pooling --------------------------------------------------------------------- */

/* A pool's windows: kernel, stride (zeros: the kernel), padding (at most
 * half the kernel, as PyTorch asks), and the output size (N, C, OH, OW)
 * and the padding past the input that ceil mode's last windows reach. */
typedef struct {
    int64_t kernel[2], stride[2], padding[2], extra[2], out[4];
} pool_shape;

static int check_pool(const char *fn, const kiln_tensor *x, const int64_t xs[4], const kiln_pool2d_params *p,
                      pool_shape *s)
{
    char d[DESCRIBE_MAX];
    if (!p)
        return core_fail_null(fn, "params");
    if (x->dtype == KILN_BOOL)
        return core_fail(CORE_DTYPE, fn, "x %s: pooling takes numbers", describe(d, x));
    s->out[0] = xs[0], s->out[1] = xs[1];
    for (int a = 0; a < 2; a++) {
        int64_t k = p->kernel[a], st = p->stride[a] ? p->stride[a] : k, pad = p->padding[a];
        if (k < 1 || !in_range(k) || st < 1 || !in_range(st) || pad < 0 || pad > k / 2)
            return core_fail(CORE_VALUE, fn,
                             "axis %d: kernel %lld, stride %lld, padding %lld (need kernel and stride below 2^31, kernel >= 1, stride >= 0, 0 <= padding <= kernel / 2)",
                             a + 2, (long long)k, (long long)p->stride[a], (long long)pad);
        int64_t o = windows(xs[2 + a], k, st, pad, 1, p->ceil_mode);
        if (o < 1)
            return core_fail(CORE_SHAPE, fn, "a %lld-wide window does not fit axis %d of x %s padded by %lld",
                             (long long)k, a + 2, describe(d, x), (long long)pad);
        int64_t reach = (o - 1) * st + k - (xs[2 + a] + 2 * pad);
        s->kernel[a] = k, s->stride[a] = st, s->padding[a] = pad, s->out[2 + a] = o;
        s->extra[a] = reach > 0 ? reach : 0;
    }
    return 0;
}

/* The lowest value of x's dtype, which no window's maximum can be below. */
static double lowest(kiln_dtype dt)
{
    switch (dt) {
    case KILN_I32: return (double)INT32_MIN;
    case KILN_I64: return (double)INT64_MIN;
    default: return -INFINITY;
    }
}

typedef enum { POOL_MAX, POOL_AVG } pool_kind;

static kiln_tensor *pool(const char *fn, pool_kind kind, kiln_tensor *x, const kiln_pool2d_params *p)
{
    int64_t xs[4];
    pool_shape s;
    if (batched(fn, x, xs) < 0 || check_pool(fn, x, xs, p, &s) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *x4 = kiln_reshape(x, 4, xs);
    if (kind == POOL_MAX) {
        kiln_tensor *xp = padded(x4, s.padding, s.extra, lowest(x->dtype));
        kiln_tensor *m = taps_folded(xp, s.kernel, s.stride, s.out[2], s.out[3], kiln_maximum);
        return composite_end(fn, unbatch(kiln_contiguous(m), x));
    }
    kiln_tensor *f = composite_float(x4);
    if (!f)
        return composite_end(fn, NULL);
    kiln_tensor *sum = taps_folded(padded(f, s.padding, s.extra, 0), s.kernel, s.stride, s.out[2], s.out[3], kiln_add);
    /* each window's divisor: its taps on the input, or on the padding too
     * (count_include_pad), never those of ceil mode's overhang */
    kiln_tensor *in = eager_filled(fn, f->dtype, 4, (int64_t[]){1, 1, xs[2], xs[3]}, 1, f->device);
    kiln_tensor *counted = padded(padded(in, s.padding, (int64_t[]){0, 0}, p->count_include_pad), (int64_t[]){0, 0},
                                  s.extra, 0);
    kiln_tensor *count = taps_folded(counted, s.kernel, s.stride, s.out[2], s.out[3], kiln_add);
    return composite_end(fn, unbatch(kiln_div(sum, count), x));
}

kiln_tensor *kiln_max_pool2d(kiln_tensor *x, const kiln_pool2d_params *p)
{
    return pool("kiln_max_pool2d", POOL_MAX, x, p);
}

kiln_tensor *kiln_avg_pool2d(kiln_tensor *x, const kiln_pool2d_params *p)
{
    return pool("kiln_avg_pool2d", POOL_AVG, x, p);
}

/* x's means over the adaptive windows along axis (2 or 3) into out pieces:
 * window i spans [floor(i n / out), ceil((i + 1) n / out)). A piece is an
 * op (a node when traced): out is at most ADAPTIVE_MAX_OUT, where 2^31
 * pieces would run for hours, and n below INT64_MAX / out (an empty x's
 * axis may be longer than any tensor's), so that (i + 1) n does not wrap. */
enum { ADAPTIVE_MAX_OUT = 1 << 16 };

static kiln_tensor *adaptive_mean(kiln_tensor *x, int axis, int64_t out)
{
    if (!x)
        return NULL;
    int64_t n = x->shape[axis];
    if (out == n)
        return x;
    if (out == 1)
        return kiln_mean(x, axis, true);
    kiln_tensor **pieces = malloc((size_t)out * sizeof *pieces);
    if (!pieces) {
        core_fail_status(CORE_NOMEM, "kiln_adaptive_avg_pool2d");
        return NULL;
    }
    for (int64_t i = 0; i < out; i++) {
        int64_t start = i * n / out, stop = ((i + 1) * n + out - 1) / out;
        pieces[i] = kiln_mean(kiln_slice(x, axis, start, stop, 1), axis, true);
    }
    kiln_tensor *joined = kiln_concat(pieces, (int)out, axis);
    free(pieces);
    return joined;
}

kiln_tensor *kiln_adaptive_avg_pool2d(kiln_tensor *x, int64_t out_h, int64_t out_w)
{
    const char *fn = "kiln_adaptive_avg_pool2d";
    int64_t xs[4];
    if (batched(fn, x, xs) < 0)
        return NULL;
    char d[DESCRIBE_MAX];
    bool sizes = out_h >= 1 && out_w >= 1 && out_h <= ADAPTIVE_MAX_OUT && out_w <= ADAPTIVE_MAX_OUT;
    if (!sizes || xs[2] < 1 || xs[3] < 1 || xs[2] >= INT64_MAX / out_h || xs[3] >= INT64_MAX / out_w) {
        core_fail(CORE_SHAPE, fn, "cannot pool x %s to %lldx%lld (both sizes from 1 to %d, the input's height and "
                  "width from 1 to below INT64_MAX over them)", describe(d, x), (long long)out_h, (long long)out_w,
                  ADAPTIVE_MAX_OUT);
        return NULL;
    }
    composite_begin();
    kiln_tensor *f = composite_float(kiln_reshape(x, 4, xs));
    kiln_tensor *y = out_h == 1 && out_w == 1 ? kiln_mean(f, KILN_AXES(2, 3), true)
                                              : adaptive_mean(adaptive_mean(f, 2, out_h), 3, out_w);
    return composite_end(fn, unbatch(kiln_contiguous(y), x));
}
