/* The driver of a fused attention kernel (gemm.h: attention_run): blocks of
 * q's rows against blocks of k's and v's rows, over kiln's thread pool.
 *
 * A task owns consecutive blocks of BR rows of one matrix of the batch
 * (the whole matrix when the batch alone gives every thread tasks): it
 * packs kᵀ and v once, as it first needs each block. For each block of
 * rows it packs those rows of q, then for each block of columns of the
 * scores multiplies into a block of scores (in L1 and L2, never the whole
 * [m, n]), computes x over it, folds it into the rows' running maximum and
 * sum, and adds weights @ v to the rows' output sums, which end divided by
 * the rows' sums. Blocks whose weights are all 0 (masked, as a causal mask
 * masks the blocks past the diagonal) skip the second product. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "codegen_llvm/gemm.h"
#include "core/core.h"

/* Rows of q per task: tiles of mr. */
enum { BR_TILES = 4 };

/* Below this many multiply-adds attention runs on one thread. */
#define ATTENTION_SMALL (1 << 21)

typedef struct {
    const attention_code *c;
    const kg_matmul_args *args; /* [0] q @ kᵀ, [1] weights @ v */
    const char *q, *kt, *v;
    char *out;
    void *const *buffers;
    const int64_t *symbols;
    int64_t br, bc, blocks; /* rows and columns of a block; blocks of rows per matrix */
    int64_t per_task;       /* blocks of rows a task takes */
    int64_t ld_o;           /* v's columns, whole tiles */
    _Atomic bool failed;
} job;

typedef struct {
    char *qp, *kp, *vp, *s, *p, *o, *max, *sum;
    char *raw;
    size_t bytes;
} scratch;

static int64_t round_up(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}

/* One allocation carved into 64-byte aligned pieces. */
static bool scratch_alloc(const job *j, scratch *s)
{
    const gemm_code *g = &j->c->gemm;
    int64_t d = j->args[0].k > 0 ? j->args[0].k : 1, size = g->size;
    int64_t n = round_up(j->args[0].n, j->bc);
    int64_t sizes[8] = {j->br * d, d * n, n * j->ld_o, j->br * j->bc, j->br * j->bc, j->br * j->ld_o, j->br, j->br};
    int64_t total = 0;
    for (int i = 0; i < 8; i++)
        total += round_up(sizes[i] * size, 64);
    s->bytes = (size_t)total;
    char *base = gemm_aligned_block(&s->raw, s->bytes);
    if (!base)
        return false;
    memset(base, 0, s->bytes); /* the panels' padding rows are read, their products never stored */
    char **at[8] = {&s->qp, &s->kp, &s->vp, &s->s, &s->p, &s->o, &s->max, &s->sum};
    for (int i = 0; i < 8; i++) {
        *at[i] = base;
        base += round_up(sizes[i] * size, 64);
    }
    return true;
}

/* The micro-kernel over every tile of a rows x cols block: acc (leading
 * dimension ld) = ap @ bp over kc steps, plus acc's values with GEMM_LOAD. */
static void block_product(const gemm_code *g, int64_t rows, int64_t cols, int64_t kc, const char *ap, const char *bp,
                          char *acc, int64_t ld, int64_t mode)
{
    gemm_tile t = {.m_rem = g->mr, .n_rem = g->nr}; /* whole tiles: the kernel multiplies no less */
    for (int64_t jr = 0; jr < cols; jr += g->nr)
        for (int64_t ir = 0; ir < rows; ir += g->mr)
            g->kernel(kc, ap + ir * kc * g->size, bp + jr * kc * g->size, acc + (ir * ld + jr) * g->size, ld, mode, &t);
}

static void fill(char *p, int64_t n, int size, double value)
{
    for (int64_t i = 0; i < n; i++) {
        if (size == 8)
            ((double *)p)[i] = value;
        else
            ((float *)p)[i] = (float)value;
    }
}

/* out's rows [row0, row0 + rows): the output sums over the rows' sums. */
static void finish(const job *j, const scratch *s, int64_t row0, int64_t rows)
{
    int64_t n = j->args[1].n;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < n; c++) {
            int64_t from = r * j->ld_o + c, to = (row0 + r) * n + c;
            if (j->c->gemm.size == 8)
                ((double *)j->out)[to] = ((double *)s->o)[from] / ((double *)s->sum)[r];
            else
                ((float *)j->out)[to] = ((float *)s->o)[from] / ((float *)s->sum)[r];
        }
    }
}

/* Rows [i0, i0 + rows) of matrix z, whose blocks of kᵀ and v before
 * *packed are packed in s; *packed moves on as more are. */
static void rows_block(const job *j, const scratch *s, int64_t z, int64_t i0, int64_t rows, int64_t *packed)
{
    const gemm_code *g = &j->c->gemm;
    const kg_matmul_args *a = &j->args[0], *b = &j->args[1];
    int64_t size = g->size, d = a->k, dv = b->n;
    int64_t q_z = gemm_batch_offset(a->a_batch_strides, a, z), k_z = gemm_batch_offset(a->b_batch_strides, a, z);
    int64_t v_z = gemm_batch_offset(b->b_batch_strides, b, z);
    if (d > 0)
        g->pack_a(j->q + (q_z + i0 * a->a_row) * size, a->a_row, a->a_col, rows, d, s->qp);
    fill(s->max, rows, g->size, -INFINITY);
    fill(s->sum, rows, g->size, 0);
    memset(s->o, 0, (size_t)(j->br * j->ld_o * size));
    for (int64_t j0 = 0; j0 < a->n; j0 += j->bc) {
        int64_t cols = a->n - j0 < j->bc ? a->n - j0 : j->bc;
        char *kp = s->kp + j0 * d * size, *vp = s->vp + j0 * j->ld_o * size;
        if (d > 0 && j0 >= *packed)
            g->pack_b(j->kt + (k_z + j0 * a->b_col) * size, a->b_row, a->b_col, d, cols, kp);
        block_product(g, rows, cols, d, s->qp, kp, s->s, j->bc, 0);
        j->c->scores(s->s, rows, cols, z * a->m + i0, j0, j->buffers, j->symbols);
        if (j0 >= *packed) {
            g->pack_b(j->v + (v_z + j0 * b->b_row) * size, b->b_row, b->b_col, cols, dv, vp);
            *packed = j0 + cols;
        }
        if (j->c->online(s->s, rows, cols, s->max, s->sum, s->o, dv, j->ld_o, s->p))
            block_product(g, rows, dv, cols, s->p, vp, s->o, j->ld_o, GEMM_LOAD);
    }
    finish(j, s, z * a->m + i0, rows);
}

static void run_tasks(void *ctx, int64_t begin, int64_t end)
{
    job *j = ctx;
    scratch s = {0};
    if (!scratch_alloc(j, &s)) {
        atomic_store(&j->failed, true);
        return;
    }
    int64_t parts = (j->blocks + j->per_task - 1) / j->per_task, m = j->args[0].m;
    for (int64_t t = begin; t < end; t++) {
        int64_t z = t / parts, first = t % parts * j->per_task, packed = 0;
        for (int64_t b = first; b < first + j->per_task && b < j->blocks; b++)
            rows_block(j, &s, z, b * j->br, m - b * j->br < j->br ? m - b * j->br : j->br, &packed);
    }
    core_free(s.raw, s.bytes + 64);
}

int attention_run(const attention_code *c, const kg_matmul_args *args, const void *q, const void *kt,
                  const void *v, void *out, void *const *buffers, const int64_t *symbols, char *err,
                  size_t err_size)
{
    const kg_matmul_args *a = &args[0];
    int64_t dv = args[1].n;
    if (a->batch <= 0 || a->m <= 0 || dv <= 0)
        return 0;
    if (a->n == 0) { /* weights of no columns: a product of zeros */
        memset(out, 0, (size_t)(a->batch * a->m * dv * c->gemm.size));
        return 0;
    }
    const gemm_code *g = &c->gemm;
    job j = {.c = c, .args = args, .q = q, .kt = kt, .v = v, .out = out, .buffers = buffers, .symbols = symbols,
             .br = BR_TILES * g->mr, .bc = (int64_t)ATTENTION_BLOCK_TILES * g->nr, .ld_o = round_up(dv, g->nr)};
    if (a->m < j.br)
        j.br = round_up(a->m, g->mr);
    j.blocks = (a->m + j.br - 1) / j.br;
    double work = (double)a->batch * (double)a->m * (double)a->n * (double)(a->k + dv);
    int64_t threads = work < ATTENTION_SMALL ? 1 : core_threads();
    /* Parts of each matrix: a few tasks a thread, for balance. */
    int64_t parts = a->batch >= 4 * threads ? 1 : (4 * threads + a->batch - 1) / a->batch;
    j.per_task = (j.blocks + parts - 1) / parts;
    int64_t tasks = a->batch * ((j.blocks + j.per_task - 1) / j.per_task);
    core_parallel_for(tasks, threads > 1 ? 1 : tasks, run_tasks, &j);
    if (atomic_load(&j.failed)) {
        snprintf(err, err_size, "out of memory for attention's blocks");
        return -1;
    }
    return 0;
}
