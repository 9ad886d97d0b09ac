/* numpy broadcasting: shapes aligned at the right, sizes equal or 1. */
#include <string.h>

#include "eager/internal.h"

/* "shapes [3,4] and [5]" for the n operands. */
static char *shapes_text(char text[4 * CORE_SHAPE_STR_MAX + 32], int n, const kiln_tensor *const *ts)
{
    strcpy(text, "shapes ");
    for (int i = 0; i < n; i++) {
        char buf[CORE_SHAPE_STR_MAX];
        if (i)
            strcat(text, i == n - 1 ? " and " : ", ");
        strcat(text, core_shape_str(buf, ts[i]->ndim, ts[i]->shape));
    }
    return text;
}

int broadcast_shapes(const char *fn, int n, const kiln_tensor *const *ts, int *ndim, int64_t *shape)
{
    char text[4 * CORE_SHAPE_STR_MAX + 32];
    int out_ndim = 0;
    for (int i = 0; i < n; i++)
        out_ndim = ts[i]->ndim > out_ndim ? ts[i]->ndim : out_ndim;
    for (int d = 0; d < out_ndim; d++) {
        int64_t size = 1;
        for (int i = 0; i < n; i++) {
            int k = d - (out_ndim - ts[i]->ndim);
            if (k < 0 || ts[i]->shape[k] == 1)
                continue;
            if (size != 1 && size != ts[i]->shape[k])
                return core_fail(CORE_SHAPE, fn, "%s do not broadcast", shapes_text(text, n, ts));
            size = ts[i]->shape[k];
        }
        shape[d] = size;
    }
    *ndim = out_ndim;
    int64_t numel;
    if (ir_shape_numel(out_ndim, shape, &numel))
        return 0;
    char buf[CORE_SHAPE_STR_MAX];
    return core_fail(CORE_SHAPE, fn, "%s broadcast to %s, more than 2^59 elements", shapes_text(text, n, ts),
                     core_shape_str(buf, out_ndim, shape));
}

void broadcast_strides(const kiln_tensor *t, int ndim, const int64_t *shape, int64_t *strides)
{
    for (int d = 0; d < ndim; d++) {
        int k = d - (ndim - t->ndim);
        strides[d] = k < 0 || (t->shape[k] == 1 && shape[d] != 1) ? 0 : t->strides[k];
    }
}
