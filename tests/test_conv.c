/* conv2d, max_pool2d, avg_pool2d and adaptive_avg_pool2d of issue 19
 * against naive f64 loops over random strides, paddings, dilations and
 * groups, in every mode (opcheck.h), and their errors. */
#include "opcheck.h"

static const oc_tol CLOSE_F32 = {1e-5, 1e-5, false}, CLOSE_F64 = {1e-12, 1e-12, false};

static oc_tol close_for(kiln_dtype dt)
{
    return dt == KILN_F64 ? CLOSE_F64 : CLOSE_F32;
}

/* A draw in [lo, hi]. */
static int64_t between(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(oc_next(s) % (uint64_t)(hi - lo + 1));
}

/* Cases under valgrind: a few of each, as its compiles are slow. */
static int cases(int n)
{
    return UNDER_VALGRIND() ? n / 12 + 1 : n;
}

/* -- conv2d ---------------------------------------------------------------------- */

typedef struct {
    kiln_conv2d_params p;
    bool bias;
} conv_case;

static kiln_tensor *apply_conv(kiln_tensor *const *in, const void *ctx)
{
    const conv_case *c = ctx;
    return kiln_conv2d(in[0], in[1], c->bias ? in[2] : NULL, &c->p);
}

/* out [N, O, OH, OW] of x [N, C, H, W], w [O, C / g, KH, KW], bias [O]. */
static void conv_ref(const oc_operand *x, const oc_operand *w, const double *bias, const kiln_conv2d_params *p,
                     const int64_t out[4], double *y)
{
    int64_t c = x->shape[1], h = x->shape[2], wd = x->shape[3], g = p->groups;
    int64_t cg = c / g, og = out[1] / g, kh = w->shape[2], kw = w->shape[3];
    for (int64_t i = 0; i < oc_numel(4, out); i++) {
        int64_t at[4];
        oc_unravel(i, 4, out, at);
        double acc = bias ? bias[at[1]] : 0;
        for (int64_t ci = 0; ci < cg; ci++)
            for (int64_t r = 0; r < kh; r++)
                for (int64_t s = 0; s < kw; s++) {
                    int64_t ih = at[2] * p->stride[0] - p->padding[0] + r * p->dilation[0];
                    int64_t iw = at[3] * p->stride[1] - p->padding[1] + s * p->dilation[1];
                    if (ih < 0 || ih >= h || iw < 0 || iw >= wd)
                        continue;
                    int64_t ic = at[1] / og * cg + ci;
                    acc += x->v[((at[0] * c + ic) * h + ih) * wd + iw] * w->v[((at[1] * cg + ci) * kh + r) * kw + s];
                }
        y[i] = acc;
    }
}

/* One convolution of x [N, C, H, W] by w [O, C / groups, KH, KW] checked
 * in every mode; false when its kernel does not fit (then it must fail). */
static void check_conv(kiln_dtype dt, const int64_t xs[4], const int64_t ws[4], conv_case *c, uint64_t seed)
{
    oc_operand x, w, b;
    oc_operand_init(&x, dt, (oc_layout)(seed % OC_LAYOUTS), 4, xs, -1, 1, seed);
    oc_operand_init(&w, dt, (oc_layout)((seed / 5) % OC_LAYOUTS), 4, ws, -1, 1, seed + 1);
    oc_operand_init(&b, dt, OC_CONTIG, 1, ws, -1, 1, seed + 2);
    int64_t out[4] = {xs[0], ws[0]};
    kiln_tensor *in[3] = {x.t, w.t, b.t};
    char what[512];
    snprintf(what, sizeof what, "conv2d(x %s, w %s, stride %lld,%lld padding %lld,%lld dilation %lld,%lld groups %lld%s)",
             x.desc, w.desc, (long long)c->p.stride[0], (long long)c->p.stride[1], (long long)c->p.padding[0],
             (long long)c->p.padding[1], (long long)c->p.dilation[0], (long long)c->p.dilation[1],
             (long long)c->p.groups, c->bias ? ", bias" : "");
    for (int a = 0; a < 2; a++) {
        int64_t room = xs[2 + a] + 2 * c->p.padding[a] - c->p.dilation[a] * (ws[2 + a] - 1) - 1;
        if (room < 0) {
            oc_check_error(what, apply_conv, c, 3, in, "does not fit");
            return;
        }
        out[2 + a] = room / c->p.stride[a] + 1;
    }
    static double want[OC_MAX_ELEMS];
    ck_assert(oc_numel(4, out) <= OC_MAX_ELEMS);
    conv_ref(&x, &w, c->bias ? b.v : NULL, &c->p, out, want);
    oc_check(what, apply_conv, c, 3, in, dt, 4, out, want, close_for(dt));
}

/* Random strides, paddings, dilations and groups (depthwise ones among
 * them), batches of 0 to 2, f32 and f64. */
START_TEST(test_conv2d_random)
{
    uint64_t s = 12345;
    for (int i = 0; i < cases(36); i++) {
        int64_t g = between(&s, 1, 3), cg = i % 4 == 0 ? 1 : between(&s, 1, 3), og = between(&s, 1, 3);
        conv_case c = {{{between(&s, 1, 3), between(&s, 1, 2)},
                        {between(&s, 0, 2), between(&s, 0, 1)},
                        {between(&s, 1, 2), between(&s, 1, 2)},
                        g},
                       i % 3 != 0};
        int64_t xs[4] = {i % 9 == 0 ? 0 : between(&s, 1, 2), g * cg, between(&s, 1, 7), between(&s, 1, 7)};
        int64_t ws[4] = {g * og, cg, between(&s, 1, 3), between(&s, 1, 3)};
        check_conv(i % 2 ? KILN_F64 : KILN_F32, xs, ws, &c, (uint64_t)i);
    }
}
END_TEST

/* A listed convolution, checked in f32 and in f64. */
typedef struct {
    int64_t x[4], w[4];
    conv_case c;
} listed_conv;

static void check_listed(const listed_conv *cases, int n)
{
    for (int i = 0; i < 2 * n; i++) {
        conv_case c = cases[i / 2].c;
        check_conv(i % 2 ? KILN_F64 : KILN_F32, cases[i / 2].x, cases[i / 2].w, &c, (uint64_t)i);
    }
}

/* Strided windows of many taps, whose B is packed from a copy of each
 * image with its padding written and the stride's phases apart (the stem's
 * 7x7/2): odd sizes, padding on one axis or both, a stride on one axis, a
 * dilation with a stride, groups, batches of 1 and 2, f32 and f64; images
 * narrower than the window, one column wide (a phase of padding only). */
START_TEST(test_conv2d_strided_windows)
{
    static const listed_conv cases[] = {
        {{1, 3, 23, 21}, {8, 3, 7, 7}, {{{2, 2}, {3, 3}, {1, 1}, 1}, true}},
        {{2, 3, 8, 3}, {4, 3, 7, 7}, {{{2, 2}, {3, 3}, {1, 1}, 1}, false}},
        {{2, 2, 9, 1}, {3, 2, 5, 5}, {{{2, 2}, {2, 2}, {1, 1}, 1}, true}},
        {{2, 4, 17, 19}, {6, 2, 5, 5}, {{{2, 2}, {2, 1}, {2, 1}, 2}, false}},
        {{2, 3, 11, 9}, {5, 3, 3, 3}, {{{2, 1}, {0, 1}, {1, 2}, 1}, true}},
        {{1, 2, 16, 15}, {3, 2, 4, 5}, {{{1, 2}, {1, 0}, {1, 1}, 1}, true}},
    };
    check_listed(cases, (int)(sizeof cases / sizeof cases[0]));
}
END_TEST

/* B packed from x by steps that hold for every channel: output widths of
 * 1, 7, 14, 16, 17, 31, 32 and 33, whose panels (f32's 32 wide, f64's 16)
 * hold runs of every length class the copy moves differently, padding at
 * both ends and past the window (whole rows and columns of zeros),
 * strides, dilations and groups, batches of 1 and 2, f32 and f64, x in
 * every layout; a 7x7 window over an output two columns wide has more
 * steps than one plan holds (taps in blocks). */
START_TEST(test_conv2d_pack_runs)
{
    static const listed_conv cases[] = {
        {{1, 2, 3, 3}, {3, 2, 3, 3}, {{{1, 1}, {1, 0}, {1, 1}, 1}, false}},
        {{2, 2, 3, 7}, {3, 2, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, true}},
        {{1, 2, 4, 14}, {3, 2, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, false}},
        {{2, 2, 3, 16}, {3, 2, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, true}},
        {{1, 3, 3, 17}, {2, 3, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, false}},
        {{2, 2, 3, 31}, {3, 2, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, true}},
        {{1, 2, 3, 32}, {3, 2, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, false}},
        {{2, 2, 2, 33}, {2, 2, 3, 3}, {{{1, 1}, {2, 2}, {1, 1}, 1}, true}},
        {{1, 2, 5, 63}, {3, 2, 3, 3}, {{{2, 2}, {1, 1}, {1, 1}, 1}, true}},
        {{2, 2, 4, 29}, {3, 2, 3, 3}, {{{1, 2}, {1, 1}, {1, 1}, 1}, false}},
        {{1, 2, 5, 17}, {3, 2, 3, 3}, {{{1, 1}, {2, 2}, {2, 2}, 1}, true}},
        {{2, 4, 3, 15}, {4, 2, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 2}, false}},
        {{1, 2, 3, 20}, {3, 2, 1, 1}, {{{2, 2}, {0, 0}, {1, 1}, 1}, true}},
        {{1, 2, 20, 8}, {3, 2, 7, 7}, {{{1, 1}, {3, 0}, {1, 1}, 1}, true}},
    };
    check_listed(cases, (int)(sizeof cases / sizeof cases[0]));
}
END_TEST

/* B packed a block of k at a time: blocks of 16 rows here, which begin
 * inside a channel's taps; one block of rows (each micro-panel packed
 * just before its tiles) and two (the first block's tiles pack the panels
 * the second reads), from x, strided, and from the stem's copy. */
START_TEST(test_conv2d_pack_blocks_of_k)
{
    static const listed_conv cases[] = {
        {{1, 5, 9, 9}, {8, 5, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, false}},
        {{2, 5, 9, 11}, {20, 5, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, true}},
        {{1, 4, 13, 12}, {6, 4, 3, 3}, {{{2, 2}, {1, 1}, {1, 1}, 1}, true}},
        {{2, 3, 17, 17}, {8, 3, 7, 7}, {{{2, 2}, {3, 3}, {1, 1}, 1}, false}},
    };
    setenv("KILN_GEMM_KC", "16", 1);
    setenv("KILN_GEMM_MC", "14", 1);
    check_listed(cases, (int)(sizeof cases / sizeof cases[0]));
    unsetenv("KILN_GEMM_KC");
    unsetenv("KILN_GEMM_MC");
}
END_TEST

/* A ResNet block's tail: conv2d with bias, inference batch norm, relu of
 * the sum with a residual; in[] x, w, bias, mean, var, gamma, beta, r. */
static kiln_tensor *apply_block(kiln_tensor *const *in, const void *ctx)
{
    kiln_tensor *y = kiln_conv2d(in[0], in[1], in[2], ctx);
    return kiln_relu(kiln_add(kiln_batch_norm(y, in[3], in[4], in[5], in[6], 1e-5), in[7]));
}

/* The block's reference from conv_ref's y (in place). */
static void block_ref(const oc_operand *bn, const oc_operand *r, const int64_t out[4], double *y)
{
    for (int64_t i = 0; i < oc_numel(4, out); i++) {
        int64_t o = i / (out[2] * out[3]) % out[1];
        double v = (y[i] - bn[0].v[o]) / sqrt(bn[1].v[o] + 1e-5) * bn[2].v[o] + bn[3].v[o] + r->v[i];
        y[i] = v < 0 ? 0 : v;
    }
}

/* -- Captured filters: the product kept packed, transposed over few pixels -------- */

/* What a body captures: the filters and the block's bias and batch norm;
 * block: the ResNet tail (bias, batch norm, residual in[1], relu) as the
 * product's epilogue, else the convolution alone, stored by the product. */
typedef struct {
    kiln_tensor *w, *b, *bn[4];
    kiln_conv2d_params p;
    bool block;
} captured_conv;

static int captured_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const captured_conv *c = user;
    kiln_tensor *y = kiln_conv2d(in[0], c->w, c->block ? c->b : NULL, &c->p);
    if (c->block)
        y = kiln_relu(kiln_add(kiln_batch_norm(y, c->bn[0], c->bn[1], c->bn[2], c->bn[3], 1e-5), in[1]));
    out[0] = y;
    return y ? 0 : -1;
}

/* The listed convolution with captured filters, traced, against the naive
 * loop: three times (the second call packs the panels it keeps, the third
 * reads them), as a block and alone, f32 and f64. */
static void check_captured_conv(const listed_conv *l, kiln_dtype dt, uint64_t seed)
{
    static oc_operand x, w, b, bn[4], r;
    int64_t out[4] = {l->x[0], l->w[0]};
    for (int a = 0; a < 2; a++)
        out[2 + a] = (l->x[2 + a] + 2 * l->c.p.padding[a] - (l->w[2 + a] - 1) - 1) / l->c.p.stride[a] + 1;
    oc_operand_init(&x, dt, OC_CONTIG, 4, l->x, -1, 1, seed);
    oc_operand_init(&w, dt, OC_CONTIG, 4, l->w, -1, 1, seed + 1);
    oc_operand_init(&b, dt, OC_CONTIG, 1, l->w, -1, 1, seed + 2);
    for (int i = 0; i < 4; i++)
        oc_operand_init(&bn[i], dt, OC_CONTIG, 1, l->w, i == 1 ? 0.5 : -1, i == 1 ? 2 : 1, seed + 3 + (uint64_t)i);
    oc_operand_init(&r, dt, OC_CONTIG, 4, out, -1, 1, seed + 7);
    static double conv[OC_MAX_ELEMS], block[OC_MAX_ELEMS];
    ck_assert(oc_numel(4, out) <= OC_MAX_ELEMS);
    conv_ref(&x, &w, NULL, &l->c.p, out, conv);
    conv_ref(&x, &w, b.v, &l->c.p, out, block);
    block_ref(bn, &r, out, block);
    for (int as_block = 0; as_block < 2; as_block++) {
        captured_conv c = {w.t, b.t, {bn[0].t, bn[1].t, bn[2].t, bn[3].t}, l->c.p, as_block};
        kiln_fn *f = kiln_jit("captured_conv", captured_body, 2, 1, &c, NULL);
        kiln_tensor *in[2] = {x.t, r.t};
        char what[384];
        for (int call = 0; call < 3; call++) {
            kiln_tensor *got = NULL;
            snprintf(what, sizeof what, "x %s, w %s, stride %lld, %s, call %d", x.desc, w.desc,
                     (long long)l->c.p.stride[0], as_block ? "block" : "alone", call);
            ck_assert_msg(kiln_call(f, in, &got) == 0, "%s: %s", what, kiln_last_error());
            oc_compare(got, dt, 4, out, as_block ? block : conv, close_for(dt), what, "traced, filters captured");
            kiln_release(got);
        }
        kiln_fn_free(f);
    }
}

/* Captured filters over few pixels, by the product as it would choose and
 * by the transposed one (KILN_GEMM_TURN=1: pixels as the rows, the filters'
 * panels kept as B, each block of sums turned back before the store or the
 * epilogue), also in blocks of 16 steps of k, 14 rows and 32 columns:
 * pixels 1, 7, 13, 14, 15 and 49, output channels 5 to 40, batches 1 to 3,
 * 1x1 products and windows, strided, grouped (never transposed). */
START_TEST(test_conv2d_captured_few_pixels)
{
    static const listed_conv cases[] = {
        {{1, 24, 1, 1}, {40, 24, 1, 1}, {{{1, 1}, {0, 0}, {1, 1}, 1}, false}},
        {{2, 13, 7, 1}, {20, 13, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, false}},
        {{3, 6, 13, 1}, {33, 6, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, false}},
        {{1, 8, 4, 14}, {5, 8, 3, 3}, {{{2, 2}, {1, 1}, {1, 1}, 1}, false}},
        {{2, 16, 3, 5}, {40, 16, 1, 1}, {{{1, 1}, {0, 0}, {1, 1}, 1}, false}},
        {{1, 12, 7, 7}, {36, 12, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 1}, false}},
        {{2, 8, 14, 14}, {24, 8, 3, 3}, {{{2, 2}, {1, 1}, {1, 1}, 1}, false}},
        {{3, 4, 7, 7}, {8, 2, 3, 3}, {{{1, 1}, {1, 1}, {1, 1}, 2}, false}},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    const char *turn[3] = {NULL, "1", "1"};
    for (int mode = 0; mode < 3; mode++) {
        if (turn[mode])
            setenv("KILN_GEMM_TURN", turn[mode], 1);
        if (mode == 2) {
            setenv("KILN_GEMM_KC", "16", 1);
            setenv("KILN_GEMM_MC", "14", 1);
            setenv("KILN_GEMM_NC", "32", 1);
        }
        for (int i = 0; i < 2 * n; i++)
            if (oc_sampled(i))
                check_captured_conv(&cases[i / 2], i % 2 ? KILN_F64 : KILN_F32, (uint64_t)(mode * 100 + i));
    }
    unsetenv("KILN_GEMM_TURN");
    unsetenv("KILN_GEMM_KC");
    unsetenv("KILN_GEMM_MC");
    unsetenv("KILN_GEMM_NC");
}
END_TEST

/* fn of in compiled (strict) within the conv tests' tolerance of fn run
 * eagerly (unfused), element by element. */
static void assert_compiled_close(const char *what, oc_fn fn, const void *ctx, int n, kiln_tensor *const *in,
                                  kiln_dtype dt)
{
    kiln_tensor *eager = fn(in, ctx), *compiled = oc_traced(fn, ctx, n, in, KILN_BACKEND_AUTO);
    double *e = test_values(eager);
    oc_compare(compiled, dt, kiln_ndim(eager), kiln_shape(eager), e, close_for(dt), what, "compiled, against unfused");
    free(e);
}

/* A compiled call of fn runs no step eagerly on the CPU, whose code
 * generator computes every convolution as a product (one beside another in
 * an epilogue too), and on_cuda steps on CUDA, whose computes only f32
 * products and no convolution with a window (not 1x1, stride 1, unpadded:
 * a plain product). */
static void assert_eager_steps(const char *what, oc_fn fn, const void *ctx, int n, kiln_tensor *const *in,
                               int on_cuda)
{
    int want = oc_device() == KILN_CUDA ? on_cuda : 0, eager = oc_eager_steps(fn, ctx, n, in);
    ck_assert_msg(eager == -1 || eager == want, "%s: %d steps run eagerly, want %d", what, eager, want);
}

/* One block of x [N, C, H, W] by w [O, C / groups, KH, KW] that fits:
 * against the naive loop in every mode, the compiled call against the
 * eager (unfused) one, and, where the convolution is a product of its own
 * and the build compiles, in one kernel: the product with its epilogue. */
static void check_block(kiln_dtype dt, const int64_t xs[4], const int64_t ws[4], const kiln_conv2d_params *p,
                        uint64_t seed)
{
    int64_t out[4] = {xs[0], ws[0]};
    for (int a = 0; a < 2; a++)
        out[2 + a] = (xs[2 + a] + 2 * p->padding[a] - p->dilation[a] * (ws[2 + a] - 1) - 1) / p->stride[a] + 1;
    static oc_operand x, w, b, bn[4], r;
    oc_operand_init(&x, dt, (oc_layout)(seed % 4), 4, xs, -1, 1, seed);
    oc_operand_init(&w, dt, seed % 3 ? OC_CONTIG : OC_TRANSPOSED, 4, ws, -1, 1, seed + 1);
    oc_operand_init(&b, dt, OC_CONTIG, 1, ws, -1, 1, seed + 2);
    for (int i = 0; i < 4; i++)
        oc_operand_init(&bn[i], dt, OC_CONTIG, 1, ws, i == 1 ? 0.5 : -1, i == 1 ? 2 : 1, seed + 3 + (uint64_t)i);
    oc_operand_init(&r, dt, OC_CONTIG, 4, out, -1, 1, seed + 7);
    kiln_tensor *in[8] = {x.t, w.t, b.t, bn[0].t, bn[1].t, bn[2].t, bn[3].t, r.t};
    char what[512];
    snprintf(what, sizeof what, "block(x %s, w %s, stride %lld,%lld padding %lld,%lld dilation %lld,%lld groups %lld)",
             x.desc, w.desc, (long long)p->stride[0], (long long)p->stride[1], (long long)p->padding[0],
             (long long)p->padding[1], (long long)p->dilation[0], (long long)p->dilation[1], (long long)p->groups);
    static double want[OC_MAX_ELEMS];
    ck_assert(oc_numel(4, out) <= OC_MAX_ELEMS);
    conv_ref(&x, &w, b.v, p, out, want);
    block_ref(bn, &r, out, want);
    oc_check(what, apply_block, p, 8, in, dt, 4, out, want, close_for(dt));
    if (!oc_compiles())
        return;
    kiln_scope_begin();
    assert_compiled_close(what, apply_block, p, 8, in, dt);
    bool plain = ws[2] * ws[3] == 1 && p->stride[0] == 1 && p->stride[1] == 1 && !p->padding[0] && !p->padding[1];
    bool strided_depthwise = xs[1] == p->groups && p->stride[1] > 1; /* the composite: a padding buffer too */
    int kernels = xs[0] > 0 && !plain && !strided_depthwise ? oc_kernels(apply_block, p, 8, in) : -1;
    ck_assert_msg(kernels == -1 || kernels == 1, "%s: %d kernels, want the convolution with its epilogue", what,
                  kernels);
    kiln_scope_end();
}

/* The block over random windows and groups, depthwise ones among them,
 * batches 0 to 2, inputs transposed, strided and reversed, f32 and f64. */
START_TEST(test_conv2d_fused)
{
    uint64_t s = 777;
    for (int i = 0; i < cases(24); i++) {
        int64_t g = between(&s, 1, 2), cg = i % 5 == 0 ? 1 : between(&s, 1, 3), og = between(&s, 1, 3);
        kiln_conv2d_params p = {{between(&s, 1, 2), between(&s, 1, 2)},
                                {between(&s, 0, 2), between(&s, 0, 2)},
                                {between(&s, 1, 2), between(&s, 1, 2)},
                                g};
        int64_t ws[4] = {g * og, cg, between(&s, 1, 3), between(&s, 1, 3)};
        int64_t xs[4] = {i % 7 == 0 ? 0 : between(&s, 1, 2), g * cg, 0, 0};
        for (int a = 0; a < 2; a++) /* big enough for the kernel: the block's fit */
            xs[2 + a] = p.dilation[a] * (ws[2 + a] - 1) + 1 + between(&s, 0, 6) - 2 * p.padding[a];
        xs[2] = xs[2] < 1 ? 1 : xs[2];
        xs[3] = xs[3] < 1 ? 1 : xs[3];
        check_block(i % 2 ? KILN_F64 : KILN_F32, xs, ws, &p, (uint64_t)i * 11);
    }
    /* a 3x3 over 20 channels and 9x9 pixels: panels whole and partial, the
     * padding on every side */
    kiln_conv2d_params same = {{1, 1}, {1, 1}, {1, 1}, 1};
    check_block(KILN_F32, (int64_t[]){1, 20, 9, 9}, (int64_t[]){16, 20, 3, 3}, &same, 5);
    /* no input channels (k = 0): the outputs are relu(shift), from x itself
     * and from the padded copy a stem's window packs from */
    kiln_conv2d_params stem = {{2, 2}, {3, 3}, {1, 1}, 1};
    check_block(KILN_F32, (int64_t[]){1, 0, 9, 9}, (int64_t[]){4, 0, 3, 3}, &same, 6);
    check_block(KILN_F32, (int64_t[]){2, 0, 12, 12}, (int64_t[]){4, 0, 7, 7}, &stem, 7);
}
END_TEST

/* Two products in one epilogue, as a ResNet's downsampling block has:
 * relu(conv 1x1 (x) + conv 3x3 (x)); in[] x, w1, b1, w3, b3. */
static kiln_tensor *apply_pair(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    const kiln_conv2d_params one = {{1, 1}, {0, 0}, {1, 1}, 1}, three = {{1, 1}, {1, 1}, {1, 1}, 1};
    return kiln_relu(kiln_add(kiln_conv2d(in[0], in[1], in[2], &one), kiln_conv2d(in[0], in[3], in[4], &three)));
}

/* Only one of the two products is computed inside the epilogue; the other
 * is stored by a kernel of its own (not run eagerly), and the epilogue
 * reads it as it was planned (its rows). */
START_TEST(test_conv2d_two_products)
{
    static oc_operand x, w1, b1, w3, b3;
    const int64_t xs[4] = {2, 8, 6, 7}, ws1[4] = {12, 8, 1, 1}, ws3[4] = {12, 8, 3, 3}, out[4] = {2, 12, 6, 7};
    oc_operand_init(&x, KILN_F32, OC_CONTIG, 4, xs, -1, 1, 1);
    oc_operand_init(&w1, KILN_F32, OC_CONTIG, 4, ws1, -1, 1, 2);
    oc_operand_init(&b1, KILN_F32, OC_CONTIG, 1, ws1, -1, 1, 3);
    oc_operand_init(&w3, KILN_F32, OC_CONTIG, 4, ws3, -1, 1, 4);
    oc_operand_init(&b3, KILN_F32, OC_CONTIG, 1, ws3, -1, 1, 5);
    static double want[OC_MAX_ELEMS], three[OC_MAX_ELEMS];
    const kiln_conv2d_params one = {{1, 1}, {0, 0}, {1, 1}, 1}, same = {{1, 1}, {1, 1}, {1, 1}, 1};
    conv_ref(&x, &w1, b1.v, &one, out, want);
    conv_ref(&x, &w3, b3.v, &same, out, three);
    for (int64_t i = 0; i < oc_numel(4, out); i++)
        want[i] = want[i] + three[i] < 0 ? 0 : want[i] + three[i];
    kiln_tensor *in[5] = {x.t, w1.t, b1.t, w3.t, b3.t};
    oc_check("relu(conv 1x1 + conv 3x3)", apply_pair, NULL, 5, in, KILN_F32, 4, out, want, CLOSE_F32);
    kiln_tensor *moved[5];
    oc_move("relu(conv 1x1 + conv 3x3)", 5, in, moved);
    assert_eager_steps("relu(conv 1x1 + conv 3x3)", apply_pair, NULL, 5, moved, 1);
}
END_TEST

/* A ResNet projection block: relu(bn(conv 1x1 (relu(conv 3x3, stride
 * (relu(conv 1x1 (x)))))) + bn(conv 1x1, stride (x))), the stride ctx's;
 * in[] x, w1, w3, w1b, wp, then the two batch norms' mean, var, gamma,
 * beta. */
static kiln_tensor *apply_projection(kiln_tensor *const *in, const void *ctx)
{
    int64_t stride = *(const int64_t *)ctx;
    const kiln_conv2d_params one = {{1, 1}, {0, 0}, {1, 1}, 1}, three = {{stride, stride}, {1, 1}, {1, 1}, 1};
    const kiln_conv2d_params project = {{stride, stride}, {0, 0}, {1, 1}, 1};
    kiln_tensor *y = kiln_relu(kiln_conv2d(in[0], in[1], NULL, &one));
    y = kiln_relu(kiln_conv2d(y, in[2], NULL, &three));
    y = kiln_batch_norm(kiln_conv2d(y, in[3], NULL, &one), in[5], in[6], in[7], in[8], 1e-5);
    kiln_tensor *shortcut = kiln_batch_norm(kiln_conv2d(in[0], in[4], NULL, &project), in[9], in[10], in[11], in[12],
                                            1e-5);
    return kiln_relu(kiln_add(y, shortcut));
}

/* The projection block traced (strides 1 and 2, f32 and f64) gives what it
 * gives eagerly, each of its four products compiled where the backend
 * takes them: the shortcut's is added to the branch's inside one kernel,
 * which computes only one of them, and the other is a kernel of its own. */
START_TEST(test_conv2d_projection_block)
{
    for (int c = 0; c < 4; c++) {
        int64_t stride = 1 + c % 2;
        kiln_dtype dt = c < 2 ? KILN_F32 : KILN_F64;
        const int64_t xs[4] = {2, 8, 7, 6}, w1[4] = {4, 8, 1, 1}, w3[4] = {4, 4, 3, 3}, w1b[4] = {16, 4, 1, 1};
        const int64_t wp[4] = {16, 8, 1, 1};
        const int64_t *shapes[5] = {xs, w1, w3, w1b, wp};
        static oc_operand ops[13];
        kiln_tensor *in[13], *moved[13];
        for (int i = 0; i < 13; i++) {
            bool var = i >= 5 && (i - 5) % 4 == 1;
            oc_operand_init(&ops[i], dt, OC_CONTIG, i < 5 ? 4 : 1, i < 5 ? shapes[i] : wp, var ? 0.5 : -1,
                            var ? 2 : 1, (uint64_t)(c * 13 + i));
            in[i] = ops[i].t;
        }
        char what[64];
        snprintf(what, sizeof what, "projection block, stride %lld, %s", (long long)stride,
                 dt == KILN_F32 ? "f32" : "f64");
        kiln_scope_begin();
        oc_move(what, 13, in, moved);
        assert_compiled_close(what, apply_projection, &stride, 13, moved, dt);
        /* on CUDA: every f64 product; of f32 ones the 3x3 and, strided, the shortcut */
        int on_cuda = dt == KILN_F64 ? 4 : (int)stride;
        assert_eager_steps(what, apply_projection, &stride, 13, moved, on_cuda);
        kiln_scope_end();
    }
}
END_TEST

/* relu(x (*) w), w the captured filters (user), padded to keep the size. */
static kiln_tensor *relu_conv(kiln_tensor *x, kiln_tensor *w)
{
    int64_t pad = kiln_shape(w)[2] / 2;
    const kiln_conv2d_params same = {{1, 1}, {pad, pad}, {1, 1}, 1};
    return kiln_relu(kiln_conv2d(x, w, NULL, &same));
}

static int conv_captured(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = relu_conv(in[0], (kiln_tensor *)user);
    return out[0] ? 0 : -1;
}

/* got (traced) within 1e-5 of the largest value of want (eager). */
static void assert_traced_near(kiln_tensor *got, kiln_tensor *want, const char *when)
{
    double diff = kiln_item(kiln_max(kiln_abs(kiln_sub(got, want)), KILN_ALL, false));
    double size = kiln_item(kiln_max(kiln_abs(want), KILN_ALL, false));
    ck_assert_msg(diff <= 1e-5 * size, "%s: traced and eager differ by %g (values up to %g)", when, diff, size);
}

/* f's call on x against relu_conv eager. */
static void check_captured(kiln_fn *f, kiln_tensor *x, kiln_tensor *w, const char *when)
{
    kiln_tensor *got = NULL, *want = relu_conv(x, w);
    ck_assert_msg(kiln_call(f, &x, &got) == 0, "%s: %s", when, kiln_last_error());
    char what[96];
    snprintf(what, sizeof what, "%lldx%lld filters, %s", (long long)kiln_shape(w)[2], (long long)kiln_shape(w)[3],
             when);
    assert_traced_near(got, want, what);
}

/* A compiled convolution keeps its captured filters packed from call to
 * call, in blocks of 14 rows and 16 steps of k here (30 filters of 180 or
 * 20 taps: partial blocks of both), and packs them anew once kiln_assign
 * changed them, the same storage; a 1x1 convolution's product reads them
 * through a view. */
START_TEST(test_conv2d_captured_filters)
{
    setenv("KILN_GEMM_KC", "16", 1);
    setenv("KILN_GEMM_MC", "14", 1);
    for (int64_t k = 1; k <= 3; k += 2) {
        kiln_scope_begin();
        int64_t ws[4] = {30, 20, k, k};
        kiln_tensor *x = kiln_randn(4, (int64_t[]){1, 20, 9, 9}, 1), *w = kiln_randn(4, ws, 2);
        kiln_fn *f = kiln_jit("conv_captured", conv_captured, 1, 1, w, NULL);
        check_captured(f, x, w, "first call");
        check_captured(f, x, w, "second call");
        ck_assert_int_eq(kiln_assign(w, kiln_randn(4, ws, 3)), 0);
        check_captured(f, x, w, "after kiln_assign");
        check_captured(f, x, w, "the call after");
        kiln_fn_free(f);
        kiln_scope_end();
    }
    unsetenv("KILN_GEMM_KC");
    unsetenv("KILN_GEMM_MC");
}
END_TEST

/* relu(w @ x) with w captured (user) and halved in place by the same call,
 * then rows of the product picked by ids (in[1]): a bad id fails the call
 * after the kernel wrote w (the zero terms order the steps so). */
static int product_then_pick(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    kiln_tensor *w = user, *y = kiln_relu(kiln_matmul(w, in[0]));
    kiln_tensor *next = kiln_add(kiln_mul_scalar(w, 0.5), kiln_mul_scalar(kiln_sum(y, KILN_ALL, false), 0.0));
    if (kiln_assign(w, next) < 0)
        return -1;
    out[0] = kiln_index_select(kiln_add(y, kiln_mul_scalar(kiln_sum(next, KILN_ALL, false), 0.0)), 0, in[1]);
    return out[0] ? 0 : -1;
}

/* A call that fails after writing a captured operand in place leaves it
 * changed: the next call reads its values as they are, not the packed copy
 * the product kept of them. */
START_TEST(test_captured_product_after_a_failed_call)
{
    kiln_scope_begin();
    kiln_tensor *w = kiln_randn(2, (int64_t[]){64, 48}, 1), *x = kiln_randn(2, (int64_t[]){48, 40}, 2);
    kiln_tensor *good = kiln_from_data(KILN_I64, 1, (int64_t[]){2}, (int64_t[]){0, 5});
    kiln_tensor *bad = kiln_from_data(KILN_I64, 1, (int64_t[]){2}, (int64_t[]){0, 500});
    kiln_fn *f = kiln_jit("product_then_pick", product_then_pick, 2, 1, w, NULL);
    kiln_tensor *with_good[2] = {x, good}, *with_bad[2] = {x, bad}, *got = NULL;
    ck_assert_int_eq(kiln_call(f, with_good, &got), 0);
    ck_assert_int_lt(kiln_call(f, with_bad, &got), 0);
    kiln_clear_error();
    kiln_tensor *want = kiln_index_select(kiln_relu(kiln_matmul(w, x)), 0, good);
    ck_assert_msg(kiln_call(f, with_good, &got) == 0, "%s", kiln_last_error());
    assert_traced_near(got, want, "after a failed call");
    kiln_fn_free(f);
    kiln_scope_end();
}
END_TEST

/* A reduction over rows of a product is no epilogue of it: its rows stay
 * the kernel's (a 1x1 convolution's means over each image row). */
static kiln_tensor *apply_row_means(kiln_tensor *const *in, const void *ctx)
{
    (void)ctx;
    const kiln_conv2d_params one = {{1, 1}, {0, 0}, {1, 1}, 1};
    return kiln_mean(kiln_relu(kiln_conv2d(in[0], in[1], in[2], &one)), 3, false);
}

START_TEST(test_conv2d_row_means)
{
    static oc_operand x, w, b;
    const int64_t xs[4] = {2, 8, 6, 7}, ws[4] = {12, 8, 1, 1}, out[4] = {2, 12, 6, 7};
    oc_operand_init(&x, KILN_F32, OC_CONTIG, 4, xs, -1, 1, 1);
    oc_operand_init(&w, KILN_F32, OC_CONTIG, 4, ws, -1, 1, 2);
    oc_operand_init(&b, KILN_F32, OC_CONTIG, 1, ws, -1, 1, 3);
    static double y[OC_MAX_ELEMS], want[OC_MAX_ELEMS];
    const kiln_conv2d_params one = {{1, 1}, {0, 0}, {1, 1}, 1};
    conv_ref(&x, &w, b.v, &one, out, y);
    for (int64_t r = 0; r < 2 * 12 * 6; r++) {
        want[r] = 0;
        for (int64_t i = 0; i < 7; i++)
            want[r] += (y[r * 7 + i] < 0 ? 0 : y[r * 7 + i]) / 7;
    }
    kiln_tensor *in[3] = {x.t, w.t, b.t};
    oc_check("mean(relu(conv 1x1), axis 3)", apply_row_means, NULL, 3, in, KILN_F32, 3, (int64_t[]){2, 12, 6}, want,
             CLOSE_F32);
}
END_TEST

/* 1x1 convolutions (plain products), depthwise with a channel multiplier,
 * the defaults (NULL params), an unbatched input, mixed dtypes. */
START_TEST(test_conv2d_forms)
{
    conv_case plain = {{{1, 1}, {0, 0}, {1, 1}, 1}, true};
    check_conv(KILN_F32, (int64_t[]){2, 5, 3, 4}, (int64_t[]){6, 5, 1, 1}, &plain, 1);
    conv_case strided = {{{2, 2}, {0, 0}, {1, 1}, 1}, false};
    check_conv(KILN_F32, (int64_t[]){1, 4, 5, 6}, (int64_t[]){3, 4, 1, 1}, &strided, 2);
    conv_case depthwise = {{{1, 2}, {1, 1}, {1, 1}, 3}, true};
    check_conv(KILN_F32, (int64_t[]){2, 3, 5, 5}, (int64_t[]){6, 1, 3, 3}, &depthwise, 3);
    conv_case wide = {{{1, 1}, {3, 3}, {1, 1}, 1}, true};
    check_conv(KILN_F64, (int64_t[]){1, 2, 4, 4}, (int64_t[]){2, 2, 7, 7}, &wide, 4);

    oc_operand x, w;
    oc_operand_init(&x, KILN_F32, OC_CONTIG, 3, (int64_t[]){2, 4, 4}, -1, 1, 5);
    oc_operand_init(&w, KILN_F64, OC_CONTIG, 4, (int64_t[]){3, 2, 2, 2}, -1, 1, 6);
    kiln_tensor *y = kiln_conv2d(x.t, w.t, NULL, NULL);
    ck_assert_msg(y != NULL, "%s", kiln_last_error());
    ck_assert_int_eq(kiln_ndim(y), 3);
    ck_assert_int_eq(kiln_dtype_of(y), KILN_F64);
    double want[27];
    const kiln_conv2d_params defaults = {{1, 1}, {0, 0}, {1, 1}, 1};
    x.shape[3] = 4, x.shape[2] = 4, x.shape[1] = 2, x.shape[0] = 1;
    conv_ref(&x, &w, NULL, &defaults, (int64_t[]){1, 3, 3, 3}, want);
    double *got = test_values(y);
    for (int i = 0; i < 27; i++)
        ck_assert_msg(fabs(got[i] - want[i]) < 1e-5, "element %d: %g, want %g", i, got[i], want[i]);
    free(got);
}
END_TEST

START_TEST(test_conv2d_errors)
{
    kiln_tensor *x = kiln_ones(KILN_F32, 4, (int64_t[]){1, 4, 5, 5});
    kiln_tensor *w = kiln_ones(KILN_F32, 4, (int64_t[]){2, 4, 3, 3});
    ck_assert_ptr_null(kiln_conv2d(NULL, w, NULL, NULL));
    ck_assert_kiln_error("kiln_conv2d", "x");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_conv2d(x, NULL, NULL, NULL));
    ck_assert_kiln_error("kiln_conv2d", "w");
    ck_assert_ptr_null(kiln_conv2d(kiln_ones(KILN_F32, 2, (int64_t[]){4, 5}), w, NULL, NULL));
    ck_assert_kiln_error("kiln_conv2d", "[N, C, H, W]");
    ck_assert_ptr_null(kiln_conv2d(kiln_ones(KILN_I32, 4, (int64_t[]){1, 4, 5, 5}), w, NULL, NULL));
    ck_assert_kiln_error("kiln_conv2d", "floating point");
    ck_assert_ptr_null(kiln_conv2d(x, w, NULL, &(kiln_conv2d_params){.groups = 2}));
    ck_assert_kiln_error("kiln_conv2d", "2 groups");
    ck_assert_ptr_null(kiln_conv2d(x, kiln_ones(KILN_F32, 4, (int64_t[]){3, 2, 3, 3}), NULL,
                                   &(kiln_conv2d_params){.groups = 2}));
    ck_assert_kiln_error("kiln_conv2d", "multiple of groups");
    ck_assert_ptr_null(kiln_conv2d(x, w, kiln_ones(KILN_F32, 1, (int64_t[]){3}), NULL));
    ck_assert_kiln_error("kiln_conv2d", "bias", "[2]");
    ck_assert_ptr_null(kiln_conv2d(x, w, NULL, &(kiln_conv2d_params){.dilation = {3, 1}}));
    ck_assert_kiln_error("kiln_conv2d", "does not fit", "axis 2");
    ck_assert_ptr_null(kiln_conv2d(x, w, NULL, &(kiln_conv2d_params){.stride = {1, -1}}));
    ck_assert_kiln_error("kiln_conv2d", "[0, 2^31)", "axis 3");
    ck_assert_ptr_null(kiln_conv2d(x, w, NULL, &(kiln_conv2d_params){.dilation = {INT64_MAX, 1}}));
    ck_assert_kiln_error("kiln_conv2d", "dilation 9223372036854775807");
    kiln_tensor *wide = kiln_zeros(KILN_F32, 4, (int64_t[]){0, 4, INT64_C(1) << 40, 1}); /* no elements */
    ck_assert_ptr_null(kiln_conv2d(x, wide, NULL, &(kiln_conv2d_params){.dilation = {1 << 30, 1}}));
    ck_assert_kiln_error("kiln_conv2d", "does not fit");
    ck_assert_ptr_null(kiln_conv2d(x, w, NULL, &(kiln_conv2d_params){.groups = -2}));
    ck_assert_kiln_error("kiln_conv2d", "groups -2");
}
END_TEST

/* -- Pooling --------------------------------------------------------------------- */

typedef struct {
    kiln_pool2d_params p;
    bool max;
} pool_case;

static kiln_tensor *apply_pool(kiln_tensor *const *in, const void *ctx)
{
    const pool_case *c = ctx;
    return c->max ? kiln_max_pool2d(in[0], &c->p) : kiln_avg_pool2d(in[0], &c->p);
}

/* PyTorch's output extent of a pooling window (pooling_output_shape). */
static int64_t pool_extent(int64_t n, int64_t k, int64_t s, int64_t p, bool ceil_mode)
{
    int64_t room = n + 2 * p - k;
    int64_t out = (ceil_mode ? (room + s - 1) / s : room / s) + 1;
    return ceil_mode && (out - 1) * s >= n + p ? out - 1 : out;
}

/* PyTorch's max_pool2d and avg_pool2d loops. */
static void pool_ref(const oc_operand *x, const pool_case *c, const int64_t out[4], double *y)
{
    const kiln_pool2d_params *p = &c->p;
    int64_t h = x->shape[2], w = x->shape[3];
    int64_t sh = p->stride[0] ? p->stride[0] : p->kernel[0], sw = p->stride[1] ? p->stride[1] : p->kernel[1];
    for (int64_t i = 0; i < oc_numel(4, out); i++) {
        int64_t at[4];
        oc_unravel(i, 4, out, at);
        int64_t h0 = at[2] * sh - p->padding[0], w0 = at[3] * sw - p->padding[1];
        int64_t h1 = h0 + p->kernel[0], w1 = w0 + p->kernel[1];
        int64_t h1p = h1 < h + p->padding[0] ? h1 : h + p->padding[0], w1p = w1 < w + p->padding[1] ? w1 : w + p->padding[1];
        double pool_size = (double)((h1p - h0) * (w1p - w0)), acc = c->max ? -INFINITY : 0, n = 0;
        for (int64_t r = h0 < 0 ? 0 : h0; r < (h1 < h ? h1 : h); r++)
            for (int64_t s = w0 < 0 ? 0 : w0; s < (w1 < w ? w1 : w); s++) {
                double v = x->v[((at[0] * x->shape[1] + at[1]) * h + r) * w + s];
                acc = c->max ? (isnan(v) || v > acc || isnan(acc) ? (isnan(acc) ? acc : v) : acc) : acc + v;
                n++;
            }
        y[i] = c->max ? acc : acc / (p->count_include_pad ? pool_size : n);
    }
}

START_TEST(test_pool_random)
{
    uint64_t s = 777;
    for (int i = 0; i < cases(40); i++) {
        pool_case c = {.max = i % 2 == 0};
        for (int a = 0; a < 2; a++) {
            c.p.kernel[a] = between(&s, 1, 4);
            c.p.stride[a] = between(&s, 0, 3);
            c.p.padding[a] = between(&s, 0, c.p.kernel[a] / 2);
        }
        c.p.ceil_mode = i % 4 < 2;
        c.p.count_include_pad = i % 3 == 0;
        int64_t xs[4] = {i % 10 == 0 ? 0 : between(&s, 1, 2), between(&s, 1, 3), between(&s, 1, 8), between(&s, 1, 8)};
        static const kiln_dtype dtypes[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
        kiln_dtype dt = dtypes[i / 2 % 4];
        oc_operand x;
        oc_operand_init(&x, dt, (oc_layout)(i % OC_LAYOUTS), 4, xs, -9, 9, (uint64_t)i);
        if (oc_is_float(dt) && x.numel > 3 && i % 5 == 0) { /* a NaN wins a maximum, spoils a mean */
            x.v[3] = NAN;
            x.t = oc_tensor(dt, (oc_layout)(i % OC_LAYOUTS), 4, xs, x.v);
        }
        char what[400];
        snprintf(what, sizeof what, "%s_pool2d(%s, kernel %lld,%lld stride %lld,%lld padding %lld,%lld%s%s)",
                 c.max ? "max" : "avg", x.desc, (long long)c.p.kernel[0], (long long)c.p.kernel[1],
                 (long long)c.p.stride[0], (long long)c.p.stride[1], (long long)c.p.padding[0],
                 (long long)c.p.padding[1], c.p.ceil_mode ? ", ceil" : "", c.p.count_include_pad ? ", with pad" : "");
        int64_t out[4] = {xs[0], xs[1]};
        bool fits = true;
        for (int a = 0; a < 2; a++) {
            int64_t st = c.p.stride[a] ? c.p.stride[a] : c.p.kernel[a];
            fits &= xs[2 + a] + 2 * c.p.padding[a] >= c.p.kernel[a];
            out[2 + a] = pool_extent(xs[2 + a], c.p.kernel[a], st, c.p.padding[a], c.p.ceil_mode);
        }
        if (!fits) {
            oc_check_error(what, apply_pool, &c, 1, &x.t, "does not fit");
            continue;
        }
        double want[OC_MAX_ELEMS];
        pool_ref(&x, &c, out, want);
        kiln_dtype result = c.max || oc_is_float(dt) ? dt : KILN_F32;
        oc_check(what, apply_pool, &c, 1, &x.t, result, 4, out, want, close_for(result));
    }
}
END_TEST

/* A compiled max pool reads its padding through bounded views of x (no
 * padded copy, no eager step: one kernel) and equals the eager pool
 * exactly: -inf, NaN and signed zeros in x, padding at both ends, ceil
 * mode's overhang, widths off every vector width, non-contiguous x. */
START_TEST(test_max_pool_padding_bounded)
{
    static const kiln_dtype dtypes[] = {KILN_F32, KILN_F64, KILN_I32, KILN_I64};
    static const pool_case cases[] = {
        {{{3, 3}, {2, 2}, {1, 1}, false, false}, true}, {{{3, 3}, {2, 2}, {1, 1}, true, false}, true},
        {{{2, 3}, {1, 2}, {1, 1}, true, false}, true},  {{{3, 2}, {3, 1}, {1, 1}, false, false}, true},
    };
    for (int c = 0; c < OC_COUNT(cases); c++)
        for (int d = 0; d < OC_COUNT(dtypes); d++) {
            int64_t xs[4] = {1 + d % 2, 2 + c % 2, 7 + 2 * c, 17 + 6 * d};
            oc_operand x;
            oc_operand_init(&x, dtypes[d], (oc_layout)((c + d) % OC_BROADCAST), 4, xs, -3, 3, (uint64_t)(c * 5 + d));
            if (oc_is_float(dtypes[d])) {
                x.v[0] = -INFINITY, x.v[x.numel / 2] = NAN, x.v[x.numel - 1] = -0.0, x.v[x.numel - 2] = INFINITY;
                x.t = oc_tensor(dtypes[d], (oc_layout)((c + d) % OC_BROADCAST), 4, xs, x.v);
            }
            char what[200];
            snprintf(what, sizeof what, "max pool case %d of %s", c, x.desc);
            kiln_tensor *eager = apply_pool(&x.t, &cases[c]);
            double *want = test_values(eager);
            kiln_tensor *compiled = oc_traced(apply_pool, &cases[c], 1, &x.t, KILN_BACKEND_AUTO);
            oc_compare(compiled, dtypes[d], 4, kiln_shape(eager), want, (oc_tol){0, 0, true}, what, "compiled");
            free(want);
            int kernels = oc_kernels(apply_pool, &cases[c], 1, &x.t);
            ck_assert_msg(kernels == -1 || kernels == 1, "%s: %d kernels, want 1", what, kernels);
            assert_eager_steps(what, apply_pool, &cases[c], 1, &x.t, 0);
        }
}
END_TEST

/* PyTorch 1.13's values (torch.nn.functional, x = torch.arange(n * n.).reshape(1, 1, n, n)). */
static void check_values(const char *what, kiln_tensor *y, int64_t side, const double *want)
{
    ck_assert_msg(y != NULL, "%s: %s", what, kiln_last_error());
    ck_assert_msg(kiln_shape(y)[2] == side && kiln_shape(y)[3] == side, "%s: %lldx%lld", what,
                  (long long)kiln_shape(y)[2], (long long)kiln_shape(y)[3]);
    double *got = test_values(y);
    for (int i = 0; i < side * side; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= 1e-6 * fabs(want[i]), "%s: element %d is %.9g, want %.9g", what, i,
                      got[i], want[i]);
    free(got);
}

START_TEST(test_pool_pytorch)
{
    kiln_tensor *x5 = kiln_reshape(kiln_arange(0, 25, 1, KILN_F32), 4, (int64_t[]){1, 1, 5, 5});
    kiln_tensor *x6 = kiln_reshape(kiln_arange(0, 36, 1, KILN_F32), 4, (int64_t[]){1, 1, 6, 6});
    /* avg_pool2d(x5, 2, 2, 1, ceil_mode=True, count_include_pad=True), then False */
    const double with_pad[] = {0, 0.75, 1.75, 3.75, 9, 11, 8.75, 19, 21};
    const double without[] = {0, 1.5, 3.5, 7.5, 9, 11, 17.5, 19, 21};
    check_values("avg with pad", kiln_avg_pool2d(x5, &(kiln_pool2d_params){{2, 2}, {2, 2}, {1, 1}, true, true}), 3,
                 with_pad);
    check_values("avg", kiln_avg_pool2d(x5, &(kiln_pool2d_params){{2, 2}, {2, 2}, {1, 1}, true, false}), 3, without);
    /* avg_pool2d(x6, 3, 2, 1, ceil_mode=True, count_include_pad=True): the last windows overhang the padding */
    const double overhang[] = {1.5555555820465088, 3.3333332538604736, 4.666666507720947, 2.6666667461395264,
                               8.333333015441895,  14,                 16,                8.5,
                               16.33333396911621,  26,                 28,                14.5,
                               10.166666984558105, 16,                 17,                8.75};
    check_values("avg overhang", kiln_avg_pool2d(x6, &(kiln_pool2d_params){{3, 3}, {2, 2}, {1, 1}, true, true}), 4,
                 overhang);
    /* max_pool2d(x5, 3, 2, 1, ceil_mode=True) */
    const double max[] = {6, 8, 9, 16, 18, 19, 21, 23, 24};
    check_values("max", kiln_max_pool2d(x5, &(kiln_pool2d_params){{3, 3}, {2, 2}, {1, 1}, true, false}), 3, max);
}
END_TEST

static kiln_tensor *apply_adaptive(kiln_tensor *const *in, const void *ctx)
{
    const int64_t *size = ctx;
    return kiln_adaptive_avg_pool2d(in[0], size[0], size[1]);
}

START_TEST(test_adaptive_avg_pool)
{
    static const struct {
        int64_t x[4], out[2];
    } cases[] = {{{2, 3, 7, 5}, {3, 2}}, {{1, 2, 4, 4}, {1, 1}}, {{2, 1, 5, 6}, {5, 4}}, {{1, 2, 3, 3}, {5, 7}},
                 {{0, 2, 4, 4}, {2, 2}}, {{1, 4, 6, 6}, {6, 1}}};
    for (int k = 0; k < OC_COUNT(cases); k++) {
        if (!oc_sampled(k))
            continue;
        kiln_dtype dt = k % 3 == 2 ? KILN_I32 : k % 2 ? KILN_F64 : KILN_F32;
        oc_operand x;
        oc_operand_init(&x, dt, (oc_layout)(k % OC_LAYOUTS), 4, cases[k].x, -5, 5, (uint64_t)k);
        int64_t out[4] = {cases[k].x[0], cases[k].x[1], cases[k].out[0], cases[k].out[1]};
        int64_t h = cases[k].x[2], w = cases[k].x[3];
        double want[OC_MAX_ELEMS];
        for (int64_t i = 0; i < oc_numel(4, out); i++) {
            int64_t at[4];
            oc_unravel(i, 4, out, at);
            int64_t h0 = at[2] * h / out[2], h1 = ((at[2] + 1) * h + out[2] - 1) / out[2];
            int64_t w0 = at[3] * w / out[3], w1 = ((at[3] + 1) * w + out[3] - 1) / out[3];
            double sum = 0;
            for (int64_t r = h0; r < h1; r++)
                for (int64_t s = w0; s < w1; s++)
                    sum += x.v[((at[0] * out[1] + at[1]) * h + r) * w + s];
            want[i] = sum / (double)((h1 - h0) * (w1 - w0));
        }
        kiln_dtype result = oc_is_float(dt) ? dt : KILN_F32;
        oc_check(x.desc, apply_adaptive, cases[k].out, 1, &x.t, result, 4, out, want, close_for(result));
    }
}
END_TEST

START_TEST(test_pool_errors)
{
    kiln_tensor *x = kiln_ones(KILN_F32, 4, (int64_t[]){1, 2, 5, 5});
    ck_assert_ptr_null(kiln_max_pool2d(x, NULL));
    ck_assert_kiln_error("kiln_max_pool2d", "params");
    ck_assert_ptr_null(kiln_avg_pool2d(x, &(kiln_pool2d_params){.kernel = {2, 2}, .stride = {1, 1}, .padding = {2, 0}}));
    ck_assert_kiln_error("kiln_avg_pool2d", "padding 2", "kernel / 2");
    ck_assert_ptr_null(kiln_max_pool2d(x, &(kiln_pool2d_params){.kernel = {0, 2}}));
    ck_assert_kiln_error("kiln_max_pool2d", "kernel 0");
    ck_assert_ptr_null(kiln_max_pool2d(x, &(kiln_pool2d_params){.kernel = {2, 2}, .stride = {INT64_MAX, 1}}));
    ck_assert_kiln_error("kiln_max_pool2d", "stride 9223372036854775807");
    ck_assert_ptr_null(kiln_max_pool2d(x, &(kiln_pool2d_params){.kernel = {6, 2}}));
    ck_assert_kiln_error("kiln_max_pool2d", "does not fit", "axis 2");
    ck_assert_ptr_null(kiln_max_pool2d(kiln_ones(KILN_BOOL, 4, (int64_t[]){1, 1, 2, 2}),
                                       &(kiln_pool2d_params){.kernel = {2, 2}}));
    ck_assert_kiln_error("kiln_max_pool2d", "numbers");
    kiln_clear_error();
    ck_assert_ptr_null(kiln_avg_pool2d(NULL, &(kiln_pool2d_params){.kernel = {2, 2}}));
    ck_assert_kiln_error("kiln_avg_pool2d", "x");
    ck_assert_ptr_null(kiln_adaptive_avg_pool2d(x, 0, 2));
    ck_assert_kiln_error("kiln_adaptive_avg_pool2d", "0x2");
    ck_assert_ptr_null(kiln_adaptive_avg_pool2d(kiln_ones(KILN_F32, 4, (int64_t[]){1, 1, 0, 2}), 1, 1));
    ck_assert_kiln_error("kiln_adaptive_avg_pool2d", "[1,1,0,2]");
    ck_assert_ptr_null(kiln_adaptive_avg_pool2d(kiln_ones(KILN_F32, 5, (int64_t[]){1, 1, 1, 2, 2}), 1, 1));
    ck_assert_kiln_error("kiln_adaptive_avg_pool2d", "[N, C, H, W]");
}
END_TEST

static Suite *conv_suite(void)
{
    Suite *s = suite_create("conv");
    TCase *tc = tcase_create("conv");
    tcase_add_checked_fixture(tc, test_scoped_setup, test_scoped_teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_conv2d_random);
    tcase_add_test(tc, test_conv2d_strided_windows);
    tcase_add_test(tc, test_conv2d_pack_runs);
    tcase_add_test(tc, test_conv2d_pack_blocks_of_k);
    tcase_add_test(tc, test_conv2d_captured_few_pixels);
    tcase_add_test(tc, test_conv2d_forms);
    tcase_add_test(tc, test_conv2d_fused);
    tcase_add_test(tc, test_conv2d_two_products);
    tcase_add_test(tc, test_conv2d_projection_block);
    tcase_add_test(tc, test_conv2d_captured_filters);
    tcase_add_test(tc, test_captured_product_after_a_failed_call);
    tcase_add_test(tc, test_conv2d_row_means);
    tcase_add_test(tc, test_conv2d_errors);
    tcase_add_test(tc, test_pool_random);
    tcase_add_test(tc, test_pool_pytorch);
    tcase_add_test(tc, test_max_pool_padding_bounded);
    tcase_add_test(tc, test_adaptive_avg_pool);
    tcase_add_test(tc, test_pool_errors);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(conv_suite)
