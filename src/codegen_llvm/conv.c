/* Packing a convolution's B panels straight from its input (implicit GEMM):
 * element (c kh kw, oh ow) of an image's B is x[c, oh sh - ph + kh dh,
 * ow sw - pw + kw dw], zero in the padding, so no column buffer exists. */
#include <string.h>

#include "codegen_llvm/gemm.h"
#include "core/core.h"

enum { MAX_NR = 64 };

/* A panel's columns as runs along one output row each: run r covers
 * columns [start[r], start[r + 1]) of the panel, whose first tap reads x
 * at row ih[r] and columns iw[r], iw[r] + stride, ... (perhaps in the
 * padding). Columns past the product's last are no run: they pack zeros. */
typedef struct {
    int runs, used;
    int start[MAX_NR + 1];
    int64_t ih[MAX_NR], iw[MAX_NR];
} panel_runs;

static void runs_of(const kx_conv *c, int64_t col0, int used, panel_runs *p)
{
    p->runs = 0;
    p->used = used;
    for (int j = 0; j < used;) {
        int64_t col = col0 + j, oh = col / c->out_width, ow = col % c->out_width;
        int64_t len = c->out_width - ow < used - j ? c->out_width - ow : used - j;
        p->start[p->runs] = j;
        p->ih[p->runs] = oh * c->stride[0] - c->padding[0];
        p->iw[p->runs] = ow * c->stride[1] - c->padding[1];
        p->runs++;
        j += (int)len;
    }
    p->start[p->runs] = used;
}

/* Packs one B panel (k rows of nr values) of elements of type T: each run
 * whose taps all fall inside x is a strided copy, others test each tap. */
#define PACK_PANEL(T, name)                                                                                             \
    static void name(const kx_conv *c, const panel_runs *p, const T *x, int64_t s_c, int64_t s_h, int64_t s_w,       \
                     int nr, T *dst)                                                                                   \
    {                                                                                                                  \
        int64_t sw = c->stride[1];                                                                                     \
        for (int64_t ch = 0; ch < c->channels; ch++)                                                                   \
            for (int64_t i = 0; i < c->kh; i++)                                                                        \
                for (int64_t j = 0; j < c->kw; j++, dst += nr) {                                                       \
                    int64_t dh = i * c->dilation[0], dw = j * c->dilation[1];                                        \
                    const T *plane = x + ch * s_c;                                                                     \
                    for (int r = 0; r < p->runs; r++) {                                                                \
                        int a = p->start[r], len = p->start[r + 1] - a;                                                \
                        int64_t h = p->ih[r] + dh, w0 = p->iw[r] + dw, w1 = w0 + (len - 1) * sw;                     \
                        T *out = dst + a;                                                                              \
                        if (h < 0 || h >= c->height) {                                                                 \
                            memset(out, 0, (size_t)len * sizeof(T));                                                   \
                            continue;                                                                                  \
                        }                                                                                              \
                        const T *row = plane + h * s_h;                                                                \
                        if (w0 >= 0 && w1 < c->width && sw * s_w == 1) {                                               \
                            memcpy(out, row + w0, (size_t)len * sizeof(T));                                            \
                        } else if (w0 >= 0 && w1 < c->width) {                                                         \
                            for (int l = 0; l < len; l++)                                                              \
                                out[l] = row[(w0 + l * sw) * s_w];                                                     \
                        } else {                                                                                       \
                            for (int l = 0; l < len; l++) {                                                            \
                                int64_t w = w0 + l * sw;                                                               \
                                out[l] = w >= 0 && w < c->width ? row[w * s_w] : (T)0;                                 \
                            }                                                                                          \
                        }                                                                                              \
                    }                                                                                                  \
                    if (p->used < nr)                                                                                  \
                        memset(dst + p->used, 0, (size_t)(nr - p->used) * sizeof(T));                                  \
                }                                                                                                      \
    }

PACK_PANEL(float, pack_panel_f32)
PACK_PANEL(double, pack_panel_f64)

void conv_pack_b(const kx_conv *c, const kg_matmul_args *args, const char *x, int64_t col0, int64_t cols, int nr,
                 int size, char *dst)
{
    /* kx_conv: the groups' batch stride is channels channel strides */
    int64_t s_c = args->b_batch_strides[1] / c->channels, s_h = args->b_row, s_w = args->b_col;
    panel_runs p;
    KILN_ASSERT(nr <= MAX_NR);
    for (int64_t at = 0; at < cols; at += nr, dst += args->k * nr * size) {
        runs_of(c, col0 + at, cols - at < nr ? (int)(cols - at) : nr, &p);
        if (size == 4)
            pack_panel_f32(c, &p, (const float *)x, s_c, s_h, s_w, nr, (float *)dst);
        else
            pack_panel_f64(c, &p, (const double *)x, s_c, s_h, s_w, nr, (double *)dst);
    }
}
