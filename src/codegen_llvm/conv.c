/* Packing a convolution's B panels straight from its input (implicit GEMM):
 * element (c kh kw, oh ow) of an image's B is x[c, oh sh - ph + kh dh,
 * ow sw - pw + kw dw], zero in the padding, so no column buffer exists.
 *
 * A strided window whose taps read each element of x several times
 * (prepares: the stem's 7x7/2) is first read into a copy of each image
 * (conv_prepare): its padding written as zeros and each stride's phases
 * apart (rows and columns of one remainder modulo the stride together), so
 * that every tap reads a contiguous run of the copy with no test of its
 * bounds. Packing from x itself gathers a strided tap's run an element
 * at a time: 40% of the stem's time (perf, branch s8-19b). The copy costs
 * one pass over the image; other windows are packed from x. */
#include <string.h>

#include "codegen_llvm/gemm.h"
#include "core/core.h"

enum { MAX_NR = 64 };

/* Whether packing reads a copy of x: a strided window whose taps read each
 * element of x four times or more (kh kw / (sh sw): the stem's 7x7/2,
 * 12), where packing from x gathers each tap's run an element at a time.
 * A 3x3/2 reads it 2.25 times, and its copy cost more than it saved: at
 * batch 16 ResNet-50's stride-2 3x3s took 32.8 -> 43.1 and 30.1 -> 34.4 ms
 * with one (branch s8-19b); a 3x3/1's runs are copies already, and its
 * copy gained nothing measurable at 56x56, batch 1. */
static bool prepares(const kx_conv *c)
{
    bool strided = c->stride[0] > 1 || c->stride[1] > 1;
    return strided && c->kh * c->kw >= 4 * c->stride[0] * c->stride[1];
}

static int64_t out_height(const kx_conv *c, const kg_matmul_args *args)
{
    return args->n / c->out_width;
}

/* The copy's phase planes: rows and columns enough for every tap's run. */
static int64_t phase_rows(const kx_conv *c, const kg_matmul_args *args)
{
    return out_height(c, args) + (c->kh - 1) * c->dilation[0] / c->stride[0];
}

static int64_t phase_cols(const kx_conv *c)
{
    return c->out_width + (c->kw - 1) * c->dilation[1] / c->stride[1];
}

/* Elements of one matrix's (image and group's) copy: per channel, the
 * stride's phases, each phase_rows x phase_cols. */
static int64_t prepared_elems(const kx_conv *c, const kg_matmul_args *args)
{
    return c->channels * c->stride[0] * c->stride[1] * phase_rows(c, args) * phase_cols(c);
}

/* x's: kx_conv's groups' batch stride is channels channel strides (none
 * is read where there are no channels: the product's k is 0). */
static int64_t channel_stride(const kx_conv *c, const kg_matmul_args *args)
{
    return c->channels ? args->b_batch_strides[1] / c->channels : 0;
}

/* The source's geometry, x its pointer (the copy's to be). */
static conv_source source_of(const kx_conv *c, const kg_matmul_args *args, const char *x)
{
    if (prepares(c)) {
        int64_t rows = phase_rows(c, args), cols = phase_cols(c);
        return (conv_source){.x = x, .prepared = true, .s_c = c->stride[0] * c->stride[1] * rows * cols,
                             .s_p = rows * cols, .s_h = cols, .s_w = 1, .z = prepared_elems(c, args)};
    }
    return (conv_source){.x = x, .s_c = channel_stride(c, args), .s_h = args->b_row, .s_w = args->b_col};
}

/* -- The copy ------------------------------------------------------------------ */

typedef struct {
    const kx_conv *c;
    const kg_matmul_args *args;
    const char *x;
    conv_source to;
    int size;
} preparing;

/* Of len columns t whose input column is w0 + t sw, those inside x, [*lo,
 * *hi), lo <= hi <= len: the rest read the padding. */
static void inside_columns(int64_t w0, int64_t sw, int64_t width, int64_t len, int64_t *lo, int64_t *hi)
{
    *hi = w0 < width ? (width - 1 - w0) / sw + 1 : 0;
    if (*hi > len)
        *hi = len;
    *lo = w0 < 0 ? (sw - 1 - w0) / sw : 0;
    if (*lo > *hi)
        *lo = *hi;
}

/* Phase plane (p, q) of channel ch of one matrix: element (r, t) is x at
 * row r sh + p - ph and column t sw + q - pw, zero outside x. The columns
 * inside x are the same in every row: found once, they are a gather
 * without a test (a constant stride 2, the stem's, the compiler
 * vectorizes), where a test per element made the copy a tenth of the
 * stem's time (perf, batch 4). */
#define PREPARE_PLANE(T, name)                                                                                          \
    static void name(const preparing *w, const T *x, int64_t p, int64_t q, T *dst)                                   \
    {                                                                                                                  \
        const kx_conv *c = w->c;                                                                                       \
        int64_t rows = phase_rows(c, w->args), cols = phase_cols(c), s_h = w->args->b_row, s_w = w->args->b_col;     \
        int64_t sw = c->stride[1], w0 = q - c->padding[1], lo, hi;                                                    \
        inside_columns(w0, sw, c->width, cols, &lo, &hi);                                                              \
        for (int64_t r = 0; r < rows; r++, dst += cols) {                                                              \
            int64_t h = r * c->stride[0] + p - c->padding[0];                                                          \
            if (h < 0 || h >= c->height) {                                                                             \
                memset(dst, 0, (size_t)cols * sizeof(T));                                                              \
                continue;                                                                                              \
            }                                                                                                          \
            const T *row = x + h * s_h;                                                                                \
            memset(dst, 0, (size_t)lo * sizeof(T));                                                                    \
            if (sw == 2 && s_w == 1)                                                                                   \
                for (int64_t t = lo; t < hi; t++)                                                                      \
                    dst[t] = row[2 * t + w0];                                                                          \
            else                                                                                                       \
                for (int64_t t = lo; t < hi; t++)                                                                      \
                    dst[t] = row[(t * sw + w0) * s_w];                                                                 \
            memset(dst + hi, 0, (size_t)(cols - hi) * sizeof(T));                                                      \
        }                                                                                                              \
    }

PREPARE_PLANE(float, prepare_plane_f32)
PREPARE_PLANE(double, prepare_plane_f64)

/* Channels [begin, end) of all matrices, counted over the batch. */
static void prepare_channels(void *ctx, int64_t begin, int64_t end)
{
    const preparing *w = ctx;
    const kx_conv *c = w->c;
    for (int64_t t = begin; t < end; t++) {
        int64_t z = t / c->channels, ch = t % c->channels;
        const char *from = w->x + (gemm_batch_offset(w->args->b_batch_strides, w->args, z) + ch * channel_stride(c, w->args)) * w->size;
        for (int64_t p = 0; p < c->stride[0]; p++)
            for (int64_t q = 0; q < c->stride[1]; q++) {
                char *dst = (char *)w->to.x + (z * w->to.z + ch * w->to.s_c + (p * c->stride[1] + q) * w->to.s_p) * w->size;
                if (w->size == 4)
                    prepare_plane_f32(w, (const float *)from, p, q, (float *)dst);
                else
                    prepare_plane_f64(w, (const double *)from, p, q, (double *)dst);
            }
    }
}

int conv_prepare(const kx_conv *c, const kg_matmul_args *args, const char *x, int size, conv_source *source,
                 char **raw, size_t *bytes)
{
    *raw = NULL;
    *source = source_of(c, args, x);
    if (!source->prepared)
        return 0;
    *bytes = (size_t)(args->batch * source->z * size);
    source->x = gemm_aligned_block(raw, *bytes);
    if (!source->x)
        return -1;
    preparing w = {c, args, x, *source, size};
    core_parallel_for(args->batch * c->channels, 1, prepare_channels, &w);
    return 0;
}

/* -- Packing ------------------------------------------------------------------- */

/* A panel's columns as runs along one output row each: run r covers
 * columns [start[r], start[r + 1]) of the panel, from output row oh[r] and
 * column ow[r]. Columns past the product's last are no run: they pack
 * zeros. */
typedef struct {
    int runs, used;
    int start[MAX_NR + 1];
    int64_t oh[MAX_NR], ow[MAX_NR];
} panel_runs;

static void runs_of(const kx_conv *c, int64_t col0, int used, panel_runs *p)
{
    p->runs = 0;
    p->used = used;
    for (int j = 0; j < used;) {
        int64_t col = col0 + j, oh = col / c->out_width, ow = col % c->out_width;
        int64_t len = c->out_width - ow < used - j ? c->out_width - ow : used - j;
        p->start[p->runs] = j;
        p->oh[p->runs] = oh;
        p->ow[p->runs] = ow;
        p->runs++;
        j += (int)len;
    }
    p->start[p->runs] = used;
}

/* Tap (i, j)'s first element in the copy: in its phase plane. */
static int64_t tap_at(const kx_conv *c, const conv_source *s, int64_t i, int64_t j)
{
    int64_t dh = i * c->dilation[0], dw = j * c->dilation[1], sh = c->stride[0], sw = c->stride[1];
    return (dh % sh * sw + dw % sw) * s->s_p + dh / sh * s->s_h + dw / sw;
}

/* A panel's packing as steps that are the same for every channel: zeros
 * zeros, then count elements of the channel's plane from `from` on, one
 * stride apart. Where each run of each channel and tap derived its bounds
 * and called memcpy, or tested each element at a border, packing took a
 * tenth of ResNet-50's traced time (perf); the geometry is now derived
 * once a panel and each channel only copies. */
typedef struct {
    int32_t zeros, count;
    int64_t from;
} pack_step;

enum { MAX_STEPS = 512 };

/* The steps of a block of taps, tap t0 + i's from first[i] on; pending:
 * zeros not yet given a step. */
typedef struct {
    int steps, pending;
    int first[MAX_STEPS + 1];
    pack_step step[MAX_STEPS];
} pack_plan;

static void plan_copy(pack_plan *p, int64_t from, int64_t count)
{
    p->step[p->steps++] = (pack_step){p->pending, (int32_t)count, from};
    p->pending = 0;
}

/* Run r of tap (i, j) from x: the columns whose taps fall inside x are a
 * copy, zeros on either side of it (the padding), all zeros where the
 * tap's row is outside x. */
static void plan_run_from_x(const kx_conv *c, const conv_source *s, const panel_runs *p, int r, int64_t i, int64_t j,
                            pack_plan *plan)
{
    int64_t len = p->start[r + 1] - p->start[r], sw = c->stride[1];
    int64_t h = p->oh[r] * c->stride[0] - c->padding[0] + i * c->dilation[0];
    int64_t w0 = p->ow[r] * sw - c->padding[1] + j * c->dilation[1];
    int64_t lo, hi;
    inside_columns(w0, sw, c->width, len, &lo, &hi);
    if (h < 0 || h >= c->height || lo >= hi) {
        plan->pending += (int)len;
        return;
    }
    plan->pending += (int)lo;
    plan_copy(plan, h * s->s_h + (w0 + lo * sw) * s->s_w, hi - lo);
    plan->pending += (int)(len - hi);
}

/* Taps from t0 on, as many as the plan holds, with nr - used zeros after
 * each (the columns past the product's last); returns the tap after the
 * last. Each tap's steps are its own, so that a block of k packs part of
 * a channel's taps. The copy's runs are whole: every tap lies inside it. */
static int64_t plan_taps(const kx_conv *c, const conv_source *s, const panel_runs *p, int nr, int64_t t0,
                         pack_plan *plan)
{
    int64_t t = t0, i = t0 / c->kw, j = t0 % c->kw;
    plan->steps = plan->pending = 0;
    for (; t < c->kh * c->kw && plan->steps + p->runs < MAX_STEPS; t++) {
        int64_t at = s->prepared ? tap_at(c, s, i, j) : 0;
        plan->first[t - t0] = plan->steps;
        for (int r = 0; r < p->runs; r++)
            if (s->prepared)
                plan_copy(plan, at + p->oh[r] * s->s_h + p->ow[r], p->start[r + 1] - p->start[r]);
            else
                plan_run_from_x(c, s, p, r, i, j, plan);
        plan->pending += nr - p->used;
        if (plan->pending)
            plan_copy(plan, 0, 0);
        if (++j == c->kw) {
            j = 0;
            i++;
        }
    }
    plan->first[t - t0] = plan->steps;
    return t;
}

/* n bytes (a multiple of 4) as two overlapping moves of a fixed size,
 * which the compiler makes vector moves: a run is at most nr (32 f32)
 * long, often 7 or 14, where a call to memcpy or memset costs more than
 * the run. */
static inline void copy_bytes(char *d, const char *s, size_t n)
{
    if (n > 128) {
        memcpy(d, s, n);
    } else if (n >= 64) {
        memcpy(d, s, 64);
        memcpy(d + n - 64, s + n - 64, 64);
    } else if (n >= 32) {
        memcpy(d, s, 32);
        memcpy(d + n - 32, s + n - 32, 32);
    } else if (n >= 16) {
        memcpy(d, s, 16);
        memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        memcpy(d, s, 8);
        memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        memcpy(d, s, 4);
    }
}

static inline void zero_bytes(char *d, size_t n)
{
    static const char zeros[128];
    if (n > sizeof zeros)
        memset(d, 0, n);
    else
        copy_bytes(d, zeros, n);
}

/* Steps [k0, k1) of a plan for one channel, elements of type T from its
 * plane, stride apart (a constant 2 the compiler vectorizes: stride-2
 * windows). */
#define PACK_STEPS(T, name)                                                                                            \
    static void name(const pack_plan *plan, int k0, int k1, const T *plane, int64_t stride, T *dst)                 \
    {                                                                                                                  \
        for (int k = k0; k < k1; k++) {                                                                                \
            const pack_step *st = &plan->step[k];                                                                      \
            const T *from = plane + st->from;                                                                          \
            if (st->zeros) {                                                                                           \
                zero_bytes((char *)dst, (size_t)st->zeros * sizeof(T));                                                \
                dst += st->zeros;                                                                                      \
            }                                                                                                          \
            if (stride == 1)                                                                                           \
                copy_bytes((char *)dst, (const char *)from, (size_t)st->count * sizeof(T));                            \
            else if (stride == 2)                                                                                      \
                for (int l = 0; l < st->count; l++)                                                                    \
                    dst[l] = from[2 * l];                                                                              \
            else                                                                                                       \
                for (int l = 0; l < st->count; l++)                                                                    \
                    dst[l] = from[l * stride];                                                                         \
            dst += st->count;                                                                                          \
        }                                                                                                              \
    }

PACK_STEPS(float, pack_steps_f32)
PACK_STEPS(double, pack_steps_f64)

/* Rows [k0, k1) of one B panel (nr values each) from s, x at the matrix's
 * first element: a block of taps of every channel at a time. */
static void pack_panel(const kx_conv *c, const conv_source *s, const panel_runs *p, const char *x, int64_t k0,
                       int64_t k1, int nr, int size, char *dst)
{
    pack_plan plan;
    int64_t taps = c->kh * c->kw, stride = s->prepared ? 1 : c->stride[1] * s->s_w;
    for (int64_t t0 = 0, t1; t0 < taps; t0 = t1) {
        t1 = plan_taps(c, s, p, nr, t0, &plan);
        for (int64_t ch = k0 / taps; ch * taps < k1; ch++) {
            int64_t from = ch * taps + t0 > k0 ? ch * taps + t0 : k0, to = ch * taps + t1 < k1 ? ch * taps + t1 : k1;
            if (from >= to)
                continue;
            int a = plan.first[from - ch * taps - t0], b = plan.first[to - ch * taps - t0];
            char *out = dst + (from - k0) * nr * size;
            if (size == 4)
                pack_steps_f32(&plan, a, b, (const float *)x + ch * s->s_c, stride, (float *)out);
            else
                pack_steps_f64(&plan, a, b, (const double *)x + ch * s->s_c, stride, (double *)out);
        }
    }
}

void conv_pack_b(const kx_conv *c, const conv_source *s, const kg_matmul_args *args, int64_t z, int64_t col0,
                 int64_t cols, int64_t k0, int64_t kc, int nr, int size, char *dst)
{
    const char *x = s->x + (s->prepared ? z * s->z : gemm_batch_offset(args->b_batch_strides, args, z)) * size;
    panel_runs p;
    KILN_ASSERT(nr <= MAX_NR);
    for (int64_t at = 0; at < cols; at += nr, dst += kc * nr * size) {
        runs_of(c, col0 + at, cols - at < nr ? (int)(cols - at) : nr, &p);
        pack_panel(c, s, &p, x, k0, k0 + kc, nr, size, dst);
    }
}
