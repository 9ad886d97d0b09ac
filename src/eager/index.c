/* Indexing by tensors of indices: gather, index_select, scatter_add (ops of
 * the table, run by these loops or their CUDA kernels in every plan), and
 * embedding and masked_fill written with them.
 *
 * Indices are i32 or i64; a negative one counts from the end of its axis.
 * An index out of range is an error naming it, its position and the axis,
 * eagerly and when a traced call runs the op (which it always does through
 * these ops): never a silent read out of bounds. On the CPU indices are
 * checked before anything is read; a CUDA kernel clamps a bad index (reads
 * nothing for it), flags the first one, and the op reports it when the
 * kernel is done. */
#include <string.h>

#include "eager/internal.h"

/* -- Checks ---------------------------------------------------------------- */

static int check_index_dtype(const char *fn, const kiln_tensor *index)
{
    if (index->dtype == KILN_I32 || index->dtype == KILN_I64)
        return 0;
    char d[DESCRIBE_MAX];
    return core_fail(CORE_DTYPE, fn, "index %s must be i32 or i64", describe(d, index));
}

static int check_same_device(const char *fn, const kiln_tensor *a, const kiln_tensor *b)
{
    if (a->device == b->device)
        return 0;
    char x[DESCRIBE_MAX], y[DESCRIBE_MAX];
    return core_fail(CORE_DEVICE, fn, "operands are on different devices: %s and %s (move one with kiln_to_device)",
                     describe(x, a), describe(y, b));
}

/* The axis of a (a 0-d tensor takes 0 or -1); its extent, 1 for 0-d. */
static int index_axis(const char *fn, const kiln_tensor *a, int axis, int *resolved)
{
    if (a->ndim == 0 && (axis == 0 || axis == -1)) {
        *resolved = 0;
        return 0;
    }
    return check_axis(fn, axis, a, 0, resolved);
}

static int64_t extent(const kiln_tensor *a, int axis)
{
    return a->ndim ? a->shape[axis] : 1;
}

/* The index's rows and their length: a 0-d index is one row of one. */
static int64_t index_row_length(const kiln_tensor *index)
{
    return index->ndim ? index->shape[index->ndim - 1] : 1;
}

static int64_t index_value(const char *p, kiln_dtype dt, int64_t off)
{
    return dt == KILN_I64 ? ((const int64_t *)p)[off] : ((const int32_t *)p)[off];
}

/* index's value at row-major position i (any layout), i < its numel; the
 * first axis takes no division, so a 1-d index (an embedding's) takes none. */
static int64_t index_at(const kiln_tensor *index, int64_t i)
{
    int64_t off = 0;
    for (int d = index->ndim - 1; d > 0; d--) {
        off += i % index->shape[d] * index->strides[d];
        i /= index->shape[d];
    }
    off += index->ndim ? i * index->strides[0] : 0;
    return index_value(eager_data(index), index->dtype, off);
}

/* fn's error for the index value given at row-major position at of index. */
static int fail_out_of_range(const char *fn, const kiln_tensor *index, int64_t at, int64_t given, int axis,
                             int64_t size)
{
    int64_t idx[KILN_MAX_DIMS];
    char where[CORE_SHAPE_STR_MAX], d[DESCRIBE_MAX];
    for (int k = index->ndim - 1; k >= 0; k--) {
        idx[k] = at % index->shape[k];
        at /= index->shape[k];
    }
    return core_fail(CORE_VALUE, fn, "index %lld at %s of index %s is out of range for axis %d of size %lld",
                     (long long)given, core_shape_str(where, index->ndim, idx), describe(d, index), axis,
                     (long long)size);
}

/* A row-major walk over the rows of a shape (its axes but the last), with
 * the offset of the current row in up to three layouts stepped as an
 * odometer rather than divided out of a position per element. */
typedef struct {
    int n_outer, n_layouts;
    const int64_t *shape;
    const int64_t *strides[3];
    int64_t c[KILN_MAX_DIMS];
    int64_t at[3];
} row_walk;

static void row_walk_next(row_walk *w)
{
    for (int d = w->n_outer - 1; d >= 0; d--) {
        for (int l = 0; l < w->n_layouts; l++)
            w->at[l] += w->strides[l][d];
        if (++w->c[d] < w->shape[d])
            return;
        for (int l = 0; l < w->n_layouts; l++)
            w->at[l] -= w->c[d] * w->strides[l][d];
        w->c[d] = 0;
    }
}

/* Checks every index of a CPU index tensor against an axis of size: 0, or
 * fn's error naming the first one out of range. A row read at stride 0 (an
 * index expanded along its last axis) holds one value, checked once. */
static int check_indices(const char *fn, const kiln_tensor *index, int axis, int64_t size)
{
    int64_t len = index_row_length(index), step = index->ndim ? index->strides[index->ndim - 1] : 0;
    if (index->numel == 0)
        return 0;
    row_walk w = {.n_outer = index->ndim ? index->ndim - 1 : 0, .n_layouts = 1, .shape = index->shape,
                  .strides = {index->strides}};
    const char *p = eager_data(index);
    for (int64_t row = 0; row < index->numel / len; row++, row_walk_next(&w))
        for (int64_t j = 0; j < (step ? len : 1); j++) {
            int64_t v = index_value(p, index->dtype, w.at[0] + j * step);
            if (v < -size || v >= size)
                return fail_out_of_range(fn, index, row * len + j, v, axis, size);
        }
    return 0;
}

/* -- CUDA ------------------------------------------------------------------- */

/* Launches generic indexing kernel k over args with its three pointers,
 * then reads the flag its bad indices raise: 0, or fn's error. */
static int cuda_indexing(const char *fn, const kg_kernel *k, kg_index_args *args, void *out, const void *in0,
                         const void *in1, const kiln_tensor *index)
{
    kg_code code;
    if (args->numel == 0)
        return 0;
    if (cuda_kernel(fn, k, &code) < 0)
        return -CORE_DEVICE;
    char err[512];
    void *pointers[3] = {out, (void *)in0, (void *)in1};
    void *params[5] = {args, &pointers[0], &pointers[1], &pointers[2], NULL}; /* [4]: the bad words */
    unsigned grid[3];
    int64_t bad[KG_BAD_WORDS] = {0};
    if (device_launch_flagged(code.module, cuda_grid_over(grid, &code, args->numel), (unsigned)code.threads, params, 4,
                              bad, KG_BAD_WORDS, err, sizeof err) < 0)
        return core_fail(strstr(err, "out of memory") ? CORE_NOMEM : CORE_DEVICE, fn, "%s", err);
    if (!bad[KG_BAD_FLAG])
        return 0;
    char d[DESCRIBE_MAX];
    return core_fail(CORE_VALUE, fn, "index %lld of index %s is out of range for axis %d of size %lld",
                     (long long)bad[KG_BAD_INDEX], describe(d, index), args->axis, (long long)args->axis_size);
}

/* The args of an indexing kernel over index's shape (a gather's result:
 * out contiguous): data strides, index strides, src strides (or none). */
static void index_args(kg_index_args *args, const kiln_tensor *index, const int64_t *data_strides,
                       const int64_t *index_strides, const int64_t *src_strides, int axis, int64_t axis_size)
{
    memset(args, 0, sizeof *args);
    args->numel = index->numel;
    args->axis_size = axis_size;
    args->ndim = index->ndim;
    args->axis = axis;
    for (int d = 0; d < index->ndim; d++) {
        args->shape[d] = index->shape[d];
        args->data_strides[d] = data_strides[d];
        args->index_strides[d] = index_strides[d];
        args->src_strides[d] = src_strides ? src_strides[d] : 0;
    }
}

/* -- gather and index_select --------------------------------------------- */

/* out (contiguous, over the positions of index's shape ndim, shape) gets
 * data's element at each position with axis replaced by the index there;
 * index_strides address the index (0 off the axis for index_select). */
typedef struct {
    const kiln_tensor *data, *index;
    int ndim, axis;
    const int64_t *shape, *index_strides;
    char *out;
} gather_job;

static void gather_range(void *ctx, int64_t begin, int64_t end)
{
    const gather_job *j = ctx;
    size_t size = eager_dtype_size(j->data->dtype);
    int64_t axis_size = extent(j->data, j->axis);
    const char *data = eager_data(j->data), *index = eager_data(j->index);
    for (int64_t i = begin; i < end; i++) {
        int64_t rest = i, off = 0, at = 0;
        for (int d = j->ndim - 1; d >= 0; d--) {
            int64_t c = rest % j->shape[d];
            rest /= j->shape[d];
            off += d == j->axis ? 0 : c * j->data->strides[d];
            at += c * j->index_strides[d];
        }
        int64_t v = j->index->dtype == KILN_I64 ? ((const int64_t *)index)[at] : ((const int32_t *)index)[at];
        v += v < 0 ? axis_size : 0;
        off += j->data->ndim ? v * j->data->strides[j->axis] : 0;
        memcpy(j->out + i * (int64_t)size, data + off * (int64_t)size, size);
    }
}

/* Rows are copied in blocks of about ROWS_BLOCK_BYTES claimed by whichever
 * thread is free (core_parallel_blocks), from ROWS_PARALLEL_BYTES in all:
 * below that, waking a worker costs more than its half of the copy saves.
 * An embedding's 768 KiB of rows (GPT-2's 256 tokens) is split in four:
 * on two threads it took 0.55-0.91 of a one-thread memcpy of its rows,
 * where in one block it took 1.02-1.15. */
#define ROWS_BLOCK_BYTES (192 << 10)
#define ROWS_PARALLEL_BYTES (512 << 10)

/* index_select of contiguous data on the CPU: whole blocks of the elements
 * after the axis copied at once (an embedding's rows), outer * n of them. */
typedef struct {
    const char *data;
    const kiln_tensor *index;
    int64_t n, axis_size, block; /* block: bytes after the axis */
    char *out;
} rows_job;

static void copy_rows(void *ctx, int64_t begin, int64_t end)
{
    const rows_job *j = ctx;
    int64_t o = begin / j->n, k = begin % j->n; /* row r is index k of outer slice o */
    for (int64_t r = begin; r < end; r++) {
        int64_t v = index_at(j->index, k);
        v += v < 0 ? j->axis_size : 0;
        memcpy(j->out + r * j->block, j->data + (o * j->axis_size + v) * j->block, (size_t)j->block);
        if (++k == j->n) {
            k = 0;
            o++;
        }
    }
}

/* A new unowned tensor: data gathered along axis over (ndim, shape) by
 * index read through index_strides; its indices checked already (CPU). */
static kiln_tensor *gathered(const char *fn, const kiln_tensor *data, const kiln_tensor *index, int axis, int ndim,
                             const int64_t *shape, const int64_t *index_strides)
{
    kiln_tensor *out = tensor_new_on(fn, data->device, data->dtype, ndim, shape);
    if (!out || out->numel == 0)
        return out;
    if (data->device == KILN_CUDA) {
        kg_kernel k = cuda_request(KG_INDEX, OP_GATHER, 2);
        k.in[0] = k.compute = k.out = data->dtype;
        k.in[1] = index->dtype;
        kg_index_args args;
        index_args(&args, out, data->strides, index_strides, NULL, axis, extent(data, axis));
        if (cuda_indexing(fn, &k, &args, eager_data(out), eager_data(data), eager_data(index), index) < 0)
            return tensor_drop(out);
        return out;
    }
    if (ndim == data->ndim && ndim > 0 && index->ndim <= 1 && eager_is_contiguous(data)) { /* index_select */
        int64_t outer = 1, block = (int64_t)eager_dtype_size(data->dtype);
        for (int d = 0; d < ndim; d++) {
            outer *= d < axis ? shape[d] : 1;
            block *= d > axis ? shape[d] : 1;
        }
        rows_job rows = {eager_data(data), index, shape[axis], data->shape[axis], block, eager_data(out)};
        int64_t n = outer * shape[axis], rows_per_block = 1 + ROWS_BLOCK_BYTES / block;
        core_parallel_blocks(n, n * block < ROWS_PARALLEL_BYTES ? n : rows_per_block, copy_rows, &rows);
        return out;
    }
    gather_job job = {data, index, ndim, axis, shape, index_strides, eager_data(out)};
    core_parallel_for(out->numel, 32 * 1024, gather_range, &job);
    return out;
}

static kiln_tensor *gather_value(kiln_tensor *a, int axis, kiln_tensor *index)
{
    const char *fn = "kiln_gather";
    kiln_tensor *operands[2] = {a, index};
    if (check_operands(fn, 2, operands, (const char *const[]){"operand a", "index"}) < 0 ||
        check_index_dtype(fn, index) < 0 || index_axis(fn, a, axis, &axis) < 0 || check_same_device(fn, a, index) < 0)
        return NULL;
    char x[DESCRIBE_MAX], y[DESCRIBE_MAX];
    bool fits = index->ndim == a->ndim;
    for (int d = 0; fits && d < a->ndim; d++)
        fits = d == axis || index->shape[d] <= a->shape[d];
    if (!fits) {
        core_fail(CORE_SHAPE, fn, "index %s must have the rank of %s and no larger size off axis %d",
                  describe(y, index), describe(x, a), axis);
        return NULL;
    }
    if (recording()) {
        ir_params params = {.axis = axis};
        return record_op(fn, OP_GATHER, 2, operands, &params, a->dtype, index->ndim, index->shape);
    }
    if (index->device == KILN_CPU && check_indices(fn, index, axis, extent(a, axis)) < 0)
        return NULL;
    return tensor_own(gathered(fn, a, index, axis, index->ndim, index->shape, index->strides));
}

static kiln_tensor *index_select_value(kiln_tensor *a, int axis, kiln_tensor *index)
{
    const char *fn = "kiln_index_select";
    kiln_tensor *operands[2] = {a, index};
    if (check_operands(fn, 2, operands, (const char *const[]){"operand a", "index"}) < 0 ||
        check_index_dtype(fn, index) < 0 || index_axis(fn, a, axis, &axis) < 0 || check_same_device(fn, a, index) < 0)
        return NULL;
    if (index->ndim > 1) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "index %s must be 0-d or 1-d", describe(d, index));
        return NULL;
    }
    int64_t n = index->numel, shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS] = {0};
    for (int d = 0; d < a->ndim; d++)
        shape[d] = d == axis ? n : a->shape[d];
    if (recording()) {
        ir_params params = {.axis = axis};
        operands[1] = index->ndim ? index : kiln_reshape(index, 1, &n);
        return operands[1] ? record_op(fn, OP_INDEX_SELECT, 2, operands, &params, a->dtype, a->ndim, shape) : NULL;
    }
    if (index->device == KILN_CPU && check_indices(fn, index, axis, extent(a, axis)) < 0)
        return NULL;
    strides[axis] = index->ndim ? index->strides[0] : 0;
    return tensor_own(gathered(fn, a, index, axis, a->ndim, shape, strides));
}

/* -- scatter_add ------------------------------------------------------------- */

/* out[off] += src[from] in out's dtype (integers wrap). */
static void add_at(char *o, const char *s, int64_t off, int64_t from, kiln_dtype dt)
{
    switch (dt) {
    case KILN_F32: ((float *)o)[off] += ((const float *)s)[from]; break;
    case KILN_F64: ((double *)o)[off] += ((const double *)s)[from]; break;
    case KILN_I32: ((uint32_t *)o)[off] += ((const uint32_t *)s)[from]; break;
    default: ((uint64_t *)o)[off] += ((const uint64_t *)s)[from]; break;
    }
}

/* out (contiguous, a copy of a) gets src added at each index position,
 * sequentially in the index's row-major order: repeated indices add up the
 * same way every time. The index is walked a row at a time, offsets stepped
 * along, since dividing each position's coordinates out cost more than its
 * add. index is not empty (the caller returns first). */
static void scatter_cpu(kiln_tensor *out, const kiln_tensor *index, const kiln_tensor *src, int axis)
{
    int64_t axis_size = extent(out, axis), len = index_row_length(index);
    int last = index->ndim - 1;
    int64_t out_strides[KILN_MAX_DIMS]; /* out's along the index's axes, the indexed one read from the index */
    memcpy(out_strides, out->strides, (size_t)out->ndim * sizeof *out_strides);
    if (out->ndim)
        out_strides[axis] = 0;
    int64_t out_step = last >= 0 ? out_strides[last] : 0, src_step = last >= 0 ? src->strides[last] : 0;
    int64_t index_step = last >= 0 ? index->strides[last] : 0, axis_stride = out->ndim ? out->strides[axis] : 0;
    row_walk w = {.n_outer = last > 0 ? last : 0, .n_layouts = 3, .shape = index->shape,
                  .strides = {out_strides, index->strides, src->strides}};
    char *o = eager_data(out);
    const char *s = eager_data(src), *ix = eager_data(index);
    for (int64_t row = 0; row < index->numel / len; row++, row_walk_next(&w))
        for (int64_t j = 0; j < len; j++) {
            int64_t v = index_value(ix, index->dtype, w.at[1] + j * index_step);
            v += v < 0 ? axis_size : 0;
            add_at(o, s, w.at[0] + j * out_step + v * axis_stride, w.at[2] + j * src_step, out->dtype);
        }
}

static int check_scatter(const char *fn, const kiln_tensor *a, int axis, const kiln_tensor *index,
                         const kiln_tensor *src)
{
    char x[DESCRIBE_MAX], y[DESCRIBE_MAX], z[DESCRIBE_MAX];
    if (a->dtype == KILN_BOOL || src->dtype != a->dtype)
        return core_fail(CORE_DTYPE, fn, "src %s must have the dtype of %s, and not bool", describe(z, src),
                         describe(x, a));
    bool fits = index->ndim == a->ndim && src->ndim == a->ndim;
    for (int d = 0; fits && d < a->ndim; d++)
        fits = index->shape[d] <= src->shape[d] && (d == axis || index->shape[d] <= a->shape[d]);
    if (!fits)
        return core_fail(CORE_SHAPE, fn, "index %s must have the rank of %s and src %s and fit in src, and in a "
                         "off axis %d", describe(y, index), describe(x, a), describe(z, src), axis);
    return 0;
}

static kiln_tensor *scatter_add_value(kiln_tensor *a, int axis, kiln_tensor *index, kiln_tensor *src)
{
    const char *fn = "kiln_scatter_add";
    kiln_tensor *operands[3] = {a, index, src};
    if (check_operands(fn, 3, operands, (const char *const[]){"operand a", "index", "src"}) < 0 ||
        check_index_dtype(fn, index) < 0 || index_axis(fn, a, axis, &axis) < 0 || check_same_device(fn, a, index) < 0 ||
        check_same_device(fn, a, src) < 0 || check_scatter(fn, a, axis, index, src) < 0)
        return NULL;
    if (recording()) {
        ir_params params = {.axis = axis};
        return record_op(fn, OP_SCATTER_ADD, 3, operands, &params, a->dtype, a->ndim, a->shape);
    }
    if (index->device == KILN_CPU && check_indices(fn, index, axis, extent(a, axis)) < 0)
        return NULL;
    kiln_tensor *out = copy_as(fn, a, a->dtype);
    if (!out || index->numel == 0)
        return tensor_own(out);
    if (a->device == KILN_CPU) {
        scatter_cpu(out, index, src, axis);
        return tensor_own(out);
    }
    kg_kernel k = cuda_request(KG_INDEX, OP_SCATTER_ADD, 2);
    k.in[0] = index->dtype;
    k.in[1] = k.compute = k.out = a->dtype;
    kg_index_args args;
    index_args(&args, index, out->strides, index->strides, src->strides, axis, extent(a, axis));
    if (cuda_indexing(fn, &k, &args, eager_data(out), eager_data(index), eager_data(src), index) < 0)
        out = tensor_drop(out);
    return tensor_own(out);
}

/* -- Composites --------------------------------------------------------------- */

kiln_tensor *kiln_embedding(kiln_tensor *weight, kiln_tensor *ids)
{
    const char *fn = "kiln_embedding";
    kiln_tensor *operands[2] = {weight, ids};
    if (check_operands(fn, 2, operands, (const char *const[]){"weight", "ids"}) < 0)
        return NULL;
    if (weight->ndim != 2 || ids->ndim >= KILN_MAX_DIMS) {
        char w[DESCRIBE_MAX], d[DESCRIBE_MAX];
        core_fail(CORE_SHAPE, fn, "weight %s must be 2-d [vocabulary, dimension], ids %s of fewer than %d axes",
                  describe(w, weight), describe(d, ids), KILN_MAX_DIMS);
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], all = -1;
    memcpy(shape, ids->shape, (size_t)ids->ndim * sizeof *shape);
    shape[ids->ndim] = weight->shape[1];
    composite_begin();
    kiln_tensor *rows = kiln_index_select(weight, 0, kiln_reshape(ids, 1, &all));
    return composite_end(fn, kiln_reshape(rows, ids->ndim + 1, shape));
}

kiln_tensor *kiln_masked_fill(kiln_tensor *a, kiln_tensor *mask, double value)
{
    const char *fn = "kiln_masked_fill";
    kiln_tensor *operands[2] = {a, mask};
    if (check_operands(fn, 2, operands, (const char *const[]){"operand a", "mask"}) < 0)
        return NULL;
    if (mask->dtype != KILN_BOOL) {
        char d[DESCRIBE_MAX];
        core_fail(CORE_DTYPE, fn, "mask %s must be bool", describe(d, mask));
        return NULL;
    }
    if (check_broadcasts_to(fn, mask, a) < 0)
        return NULL;
    composite_begin();
    kiln_tensor *fill = eager_filled(fn, a->dtype, 0, NULL, value, a->device);
    return composite_end(fn, kiln_where(mask, fill, a));
}

/* -- With gradient records ------------------------------------------------------ */

/* The op's result (out) with its record, the axis resolved as the op did. */
static kiln_tensor *tracked(ir_op op, int n, kiln_tensor *const *in, int axis, kiln_tensor *out)
{
    if (!out)
        return NULL;
    ir_params params = {.axis = axis < 0 ? axis + (in[0]->ndim ? in[0]->ndim : 1) : axis};
    return grad_track(op, n, in, &params, out);
}

kiln_tensor *kiln_gather(kiln_tensor *a, int axis, kiln_tensor *index)
{
    return tracked(OP_GATHER, 2, (kiln_tensor *[]){a, index}, axis, gather_value(a, axis, index));
}

kiln_tensor *kiln_index_select(kiln_tensor *a, int axis, kiln_tensor *index)
{
    return tracked(OP_INDEX_SELECT, 2, (kiln_tensor *[]){a, index}, axis, index_select_value(a, axis, index));
}

kiln_tensor *kiln_scatter_add(kiln_tensor *a, int axis, kiln_tensor *index, kiln_tensor *src)
{
    return tracked(OP_SCATTER_ADD, 3, (kiln_tensor *[]){a, index, src}, axis, scatter_add_value(a, axis, index, src));
}
