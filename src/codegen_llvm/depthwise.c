/* Depthwise convolutions computed directly (gemm.h says how), their
 * epilogue run by the product's micro-kernel on each register tile. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "codegen_llvm/gemm.h"
#include "core/core.h"

/* Pixels a block spans at most, unless one output row is longer: its sums
 * (mr rows of them) stay in L1 until the epilogue reads them. */
enum { BLOCK_COLS = 512 };

/* Below this many multiply-adds the convolution runs on one thread. */
#define DEPTHWISE_SMALL (1 << 18)

typedef void (*step_fn)(void *out, const void *plane, int64_t s_h, int64_t s_w, const void *w, int64_t oh0,
                        int64_t oh1);

typedef struct {
    const gemm_code *g;
    step_fn step;
    const kg_matmul_args *args;
    const char *a, *x;
    void *const *buffers;
    const int64_t *symbols;
    int64_t rows, out_height, out_width, oh_blocks, block_oh;
    _Atomic bool failed;
} job;

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Product rows [r0, r0 + m_rem), output rows [oh0, oh1): each channel's
 * rows into acc (leading dimension ld), then each tile through the
 * epilogue. */
static void block(const job *j, char *acc, int64_t ld, int64_t r0, int64_t m_rem, int64_t oh0, int64_t oh1)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->args;
    int64_t size = g->size;
    for (int64_t i = 0; i < m_rem; i++) {
        int64_t r = r0 + i, z = r / a->m;
        const char *w = j->a + (gemm_batch_offset(a->a_batch_strides, a, z) + r % a->m * a->a_row) * size;
        const char *plane = j->x + gemm_batch_offset(a->b_batch_strides, a, z) * size;
        j->step(acc + i * ld * size, plane, a->b_row, a->b_col, w, oh0, oh1);
    }
    int64_t c0 = oh0 * j->out_width, n = (oh1 - oh0) * j->out_width;
    gemm_finish_tiles(g, acc, ld, n, (gemm_tile){.m_rem = m_rem, .row0 = r0, .col0 = c0, .buffers = j->buffers,
                                                 .symbols = j->symbols});
}

static void run_blocks(void *ctx, int64_t begin, int64_t end)
{
    job *j = ctx;
    const gemm_code *g = j->g;
    int64_t ld = ceil_div(j->block_oh * j->out_width, g->nr) * g->nr;
    size_t bytes = (size_t)(g->mr * ld * g->size);
    char *raw, *acc = gemm_aligned_block(&raw, bytes);
    if (!acc) {
        atomic_store(&j->failed, true);
        return;
    }
    memset(acc, 0, bytes); /* the tiles' rows and columns past the product's are read, never stored */
    for (int64_t b = begin; b < end; b++) {
        int64_t r0 = b / j->oh_blocks * g->mr, oh0 = b % j->oh_blocks * j->block_oh;
        int64_t m_rem = j->rows - r0 < g->mr ? j->rows - r0 : g->mr;
        int64_t oh1 = oh0 + j->block_oh < j->out_height ? oh0 + j->block_oh : j->out_height;
        block(j, acc, ld, r0, m_rem, oh0, oh1);
    }
    core_free(raw, bytes + 64);
}

int depthwise_run(const gemm_code *g, const void *step, const kx_conv *c, const kg_matmul_args *args, const void *a,
                  const void *x, void *const *buffers, const int64_t *symbols, char *err, size_t err_size)
{
    int64_t rows = args->batch * args->m;
    if (rows <= 0 || args->n <= 0)
        return 0;
    int64_t out_height = args->n / c->out_width, block_oh = BLOCK_COLS / c->out_width;
    block_oh = block_oh < 1 ? 1 : block_oh < out_height ? block_oh : out_height;
    job j = {.g = g, .step = (step_fn)(uintptr_t)step, .args = args, .a = a, .x = x, .buffers = buffers,
             .symbols = symbols, .rows = rows, .out_height = out_height, .out_width = c->out_width,
             .oh_blocks = ceil_div(out_height, block_oh), .block_oh = block_oh};
    int64_t blocks = ceil_div(rows, g->mr) * j.oh_blocks;
    double work = (double)rows * (double)args->n * (double)(args->k > 0 ? args->k : 1);
    core_parallel_for(blocks, work < DEPTHWISE_SMALL ? blocks : 1, run_blocks, &j);
    if (atomic_load(&j.failed)) {
        snprintf(err, err_size, "out of memory for a depthwise convolution's sums");
        return -1;
    }
    return 0;
}
