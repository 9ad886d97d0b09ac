/* The driver of a generated matrix product: BLIS's loops around the
 * micro-kernel, with block sizes from the host's caches, split across
 * kiln's thread pool.
 *
 * For each block of NC columns, a thread packs B's K x NC panel once, a
 * micro-panel at a time as the first block of rows reaches it (into one
 * micro-panel's room when there is one block of rows); for each
 * block of MC rows it packs A's MC x KC block, for each KC step along k,
 * and runs the micro-kernel over the block's tiles, each B panel (KC x NR,
 * in L1) against every A panel (in L2). Sums over more than one KC
 * step meet in a scratch block of partial sums (MC x NC); the last step
 * stores the product or runs the epilogue on it, so the tile is written
 * once.
 *
 * Threads: the product is split into independent tasks, whole matrices of
 * a batch or parts of one, so a task never waits for another and the pool
 * may run them in any order, or all on the caller when it is busy. A part
 * packs its own panels; the split is the one that packs least again. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "codegen_llvm/gemm.h"
#include "codegen_llvm/llvm.h"
#include "core/core.h"

/* Below this many multiply-adds a product runs on one thread, unless its
 * B has at least GEMM_LARGE_B elements: a product of few rows is the
 * packing of its B (a classifier's 1 x 2048 by 2048 x 1000 has 2M
 * multiply-adds and 8 MB of B, which the threads read in parts). */
#define GEMM_SMALL (1 << 21)
#define GEMM_LARGE_B (1 << 18)
/* The most bytes of a convolution's B its threads pack together at once
 * (an odd batch split over rows packs all its images'). */
#define SHARED_B_MAX (16 << 20)

typedef struct {
    int64_t mc, kc, nc;
} blocking;

typedef struct {
    const gemm_code *g;
    const kg_matmul_args *args; /* the product the loops run: orig, or its transpose */
    const kg_matmul_args *orig; /* the product as called */
    bool transposed;            /* args is Cᵀ = Bᵀ Aᵀ (transposes()) */
    const char *a, *b;
    char *out;
    void *const *buffers;
    const int64_t *symbols;
    const kx_conv *conv; /* or NULL: B is a matrix */
    conv_source source;  /* a convolution's: what its B is packed from */
    char *shared_b;      /* or NULL: each matrix's B packed whole, by all threads before the parts run */
    const struct kept_a *kept; /* or NULL: A packed by each part, block by block */
    blocking bl;
    int64_t tm, tn;   /* parts of each matrix's rows and columns */
    int64_t rows_part, cols_part;
    _Atomic bool failed;
} job;

static int64_t round_up(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}

static int64_t clamp(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static int64_t cache_bytes(int name, int64_t fallback)
{
    long bytes = sysconf(name);
    return bytes > 0 ? bytes : fallback;
}

/* KC: a B micro-panel (KC x NR) fills L1, the A values and the tile
 * streaming past it (sgemm 2048^3 on AVX-512: 0.86 of OpenBLAS's SkylakeX
 * kernels against 0.74 with half of L1, which doubles the passes over the
 * partial sums); MC: an A block (MC x KC) half of L2; NC: the packed B
 * (K x NC) a few MiB, less than L3 holds. */
static blocking block_sizes(const gemm_code *g, int64_t k)
{
    int64_t l1 = cache_bytes(_SC_LEVEL1_DCACHE_SIZE, 32 << 10), l2 = cache_bytes(_SC_LEVEL2_CACHE_SIZE, 256 << 10);
    int64_t l3 = cache_bytes(_SC_LEVEL3_CACHE_SIZE, 8 << 20);
    blocking b;
    b.kc = clamp(core_env_int("KILN_GEMM_KC", clamp(l1 / (g->nr * g->size) / 8 * 8, 64, 1024)), 1, 1 << 16);
    b.mc = clamp(l2 / 2 / (b.kc * g->size) / g->mr * g->mr, g->mr, 4096 / g->mr * g->mr);
    b.mc = clamp(core_env_int("KILN_GEMM_MC", b.mc) / g->mr * g->mr, g->mr, 1 << 16);
    int64_t budget = clamp(l3 / 4, 1 << 20, 8 << 20);
    b.nc = clamp(budget / ((k > 0 ? k : 1) * g->size) / g->nr * g->nr, g->nr, 4096 / g->nr * g->nr);
    b.nc = clamp(core_env_int("KILN_GEMM_NC", b.nc) / g->nr * g->nr, g->nr, 1 << 16);
    return b;
}

/* -- One task: a part of one matrix ------------------------------------------------ */

typedef struct {
    char *ap, *bp, *acc;
    char *turned; /* a transposed product's block of sums, turned back (ld_turned apart) */
    char *raw[4]; /* as allocated, for core_free */
    int64_t ld_acc, ld_turned;
    bool one_panel; /* bp holds one micro-panel of B, packed just before its tiles, which alone use it */
} scratch;

int64_t gemm_batch_offset(const long long *strides, const kg_matmul_args *a, int64_t z)
{
    int64_t offset = 0;
    for (int d = a->batch_ndim - 1; d >= 0; d--) {
        offset += z % a->batch_shape[d] * strides[d];
        z /= a->batch_shape[d];
    }
    return offset;
}

/* Columns [col, col + cols) of matrix z's B, its rows [pc, pc + kc), into
 * one micro-panel: a convolution's through its window. */
static void pack_micro_panel(const job *j, int64_t z, int64_t col, int64_t cols, int64_t pc, int64_t kc, char *bp)
{
    const kg_matmul_args *a = j->args;
    int64_t size = j->g->size;
    if (j->conv)
        conv_pack_b(j->conv, &j->source, j->orig, z, col, cols, pc, kc, j->g->nr, (int)size, bp);
    else
        j->g->pack_b(j->b + (gemm_batch_offset(a->b_batch_strides, a, z) + pc * a->b_row + col * a->b_col) * size,
                     a->b_row, a->b_col, kc, cols, bp);
}

/* Prefetches into L2 the lines of matrix z's B, rows [pc, pc + kc) and
 * columns [col, col + cols), that pack_b will copy next: B's rows (a
 * column-major B's columns) lie across memory, one stream each, more than
 * the hardware follows, so the packing otherwise waits on a miss a line
 * while no multiply-add runs. Only for a B contiguous along its rows or its
 * columns (a convolution's windows are not), and never for a transposed
 * product, whose B is packed before its parts run. */
static void prefetch_micro_panel(const job *j, int64_t z, int64_t col, int64_t cols, int64_t pc, int64_t kc)
{
    const kg_matmul_args *a = j->args;
    int64_t size = j->g->size, lines = 64 / size;
    if (j->conv || j->transposed || (a->b_col != 1 && a->b_row != 1) || kc <= 0)
        return;
    bool along_rows = a->b_col == 1; /* each of B's rows holds cols contiguous values */
    int64_t count = along_rows ? kc : cols, span = along_rows ? cols : kc, stride = along_rows ? a->b_row : a->b_col;
    const char *first = j->b + (gemm_batch_offset(a->b_batch_strides, a, z) + pc * a->b_row + col * a->b_col) * size;
    for (int64_t i = 0; i < count; i++) {
        const char *line = first + i * stride * size;
        for (int64_t e = 0; e < span; e += lines)
            __builtin_prefetch(line + e * size, 0, 2);
        __builtin_prefetch(line + (span - 1) * size, 0, 2);
    }
}

/* The tiles of rows [ic, ic + mc) and columns [jc, jc + nc) of matrix z, A
 * block packed for k from pc on; pack: B's micro-panels are packed for k
 * from pc on just before their tiles use them (the next one's lines
 * prefetched meanwhile), else they are packed already. */
static void tiles(const job *j, const scratch *s, int64_t z, int64_t ic, int64_t mc, int64_t jc, int64_t nc,
                  int64_t pc, int64_t kc, int64_t mode, bool pack)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->args;
    int64_t size = g->size;
    KILN_ASSERT(pack || kc == 0 || !s->one_panel); /* one panel's room holds no panel packed before */
    for (int64_t jr = 0; jr < nc; jr += g->nr) {
        char *bp = s->one_panel ? s->bp : s->bp + (jr * a->k + pc * g->nr) * size;
        if (pack)
            pack_micro_panel(j, z, jc + jr, nc - jr < g->nr ? nc - jr : g->nr, pc, kc, bp);
        int64_t next = jr + g->nr;
        if (pack && next < nc)
            prefetch_micro_panel(j, z, jc + next, nc - next < g->nr ? nc - next : g->nr, pc, kc);
        for (int64_t ir = 0; ir < mc; ir += g->mr) {
            int64_t row = z * a->m + ic + ir;
            gemm_tile t = {.m_rem = mc - ir < g->mr ? mc - ir : g->mr, .n_rem = nc - jr < g->nr ? nc - jr : g->nr,
                           .row0 = row, .col0 = jc + jr, .ld_out = a->n, .buffers = j->buffers,
                           .symbols = j->symbols};
            if (j->out && !j->transposed)
                t.out = j->out + (row * a->n + jc + jr) * size;
            g->kernel(kc, s->ap + ir * kc * size, bp, s->acc + (ir * s->ld_acc + jr) * size, s->ld_acc, mode, &t);
        }
    }
}

/* A matrix's packed B, all its columns. */
static int64_t shared_b_bytes(const job *j)
{
    return j->args->k * round_up(j->args->n, j->g->nr) * j->g->size;
}

/* -- A constant A, kept packed from call to call (kx_constant) ----------------- */

/* All of A packed as part() packs it a block at a time: for each step of k
 * from pc (kc steps, fewer in the last), the panels of all rows (m rounded
 * up to mr), so that rows from ic are at pc * rows + ic * kc elements. It
 * is A's for the key and the layout it was packed from. */
typedef struct kept_a {
    uint64_t key[2];
    const char *a;
    bool as_b; /* packed as a transposed product's B (Aᵀ): panels of nr columns, each all of k */
    int64_t m, k, a_row, a_col, kc, size;
    int64_t mr; /* rows of A a panel holds: the micro-kernel's mr, or its nr where as_b */
    size_t bytes;
    char *raw, *panels;
} kept_a;

static char *kept_panels(const kept_a *p, int64_t ic, int64_t pc, int64_t kc)
{
    return p->panels + (pc * round_up(p->m, p->mr) + ic * kc) * p->size;
}

static bool kept_fits(const kept_a *p, const kept_a *want)
{
    return p->key[0] == want->key[0] && p->key[1] == want->key[1] && p->a == want->a && p->as_b == want->as_b &&
           p->m == want->m && p->k == want->k && p->a_row == want->a_row && p->a_col == want->a_col &&
           p->kc == want->kc && p->mr == want->mr && p->size == want->size;
}

void gemm_forget(void *kept)
{
    kept_a *p = kept;
    if (!p)
        return;
    core_free(p->raw, p->bytes + 64);
    core_free(p, sizeof *p);
}

typedef struct {
    const gemm_code *g;
    kept_a *p;
    int64_t mc, row_blocks;
} kept_packing;

/* Tasks [begin, end): panels of Aᵀ's columns (A's rows), as tiles() reads
 * a B packed whole. */
static void pack_kept_b(const kept_packing *w, int64_t begin, int64_t end)
{
    kept_a *p = w->p;
    for (int64_t t = begin; t < end; t++) {
        int64_t row = t * p->mr, rows = p->m - row < p->mr ? p->m - row : p->mr;
        w->g->pack_b(p->a + row * p->a_row * p->size, p->a_col, p->a_row, p->k, rows,
                     p->panels + row * p->k * p->size);
    }
}

/* Tasks [begin, end): block of rows t % row_blocks at step t / row_blocks. */
static void pack_kept(void *ctx, int64_t begin, int64_t end)
{
    const kept_packing *w = ctx;
    kept_a *p = w->p;
    if (p->as_b) {
        pack_kept_b(w, begin, end);
        return;
    }
    for (int64_t t = begin; t < end; t++) {
        int64_t pc = t / w->row_blocks * p->kc, ic = t % w->row_blocks * w->mc;
        int64_t kc = p->k - pc < p->kc ? p->k - pc : p->kc, mc = p->m - ic < w->mc ? p->m - ic : w->mc;
        w->g->pack_a(p->a + (ic * p->a_row + pc * p->a_col) * p->size, p->a_row, p->a_col, mc, kc,
                     kept_panels(p, ic, pc, kc));
    }
}

/* Whether the job's A is one constant matrix for the whole batch that the
 * blocked loops pack. */
static bool keeps_a(const job *j, const kx_constant *constant)
{
    const kg_matmul_args *a = j->args;
    if (!constant || !constant->slot || j->g->prologue || a->k <= 0)
        return false;
    for (int d = 0; d < a->batch_ndim; d++)
        if (a->batch_shape[d] > 1 && a->a_batch_strides[d] != 0)
            return false;
    return true;
}

/* The slot's packed A if it is this call's, else A packed anew (into the
 * slot's block when it is as large), taken out of the slot for the call;
 * NULL when out of memory (the parts pack A then; a product that would run
 * transposed runs as called). */
static kept_a *take_kept(const job *j, const kx_constant *constant)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->orig;
    int panel = j->transposed ? g->nr : g->mr; /* rows of A a panel holds */
    kept_a want = {.key = {constant->key[0], constant->key[1]}, .a = j->a, .as_b = j->transposed, .m = a->m,
                   .k = a->k, .a_row = a->a_row, .a_col = a->a_col, .kc = j->transposed ? a->k : j->bl.kc,
                   .mr = panel, .size = g->size, .bytes = (size_t)(round_up(a->m, panel) * a->k * g->size)};
    kept_a *p = atomic_exchange(constant->slot, NULL);
    if (p && kept_fits(p, &want))
        return p;
    if (p && p->bytes != want.bytes)
        gemm_forget(p), p = NULL;
    if (!p && (p = core_alloc(sizeof *p)) && !(want.panels = gemm_aligned_block(&want.raw, want.bytes)))
        core_free(p, sizeof *p), p = NULL;
    if (!p)
        return NULL;
    if (!want.panels)
        want.raw = p->raw, want.panels = p->panels;
    *p = want;
    int64_t rows_per_task = p->as_b ? panel : j->bl.mc;
    kept_packing w = {g, p, j->bl.mc, (a->m + rows_per_task - 1) / rows_per_task};
    int64_t tasks = w.row_blocks * ((a->k + p->kc - 1) / p->kc);
    core_parallel_for(tasks, 1, pack_kept, &w);
    return p;
}

/* Back into the slot, unless another call put its own there meanwhile. */
static void keep(const kx_constant *constant, kept_a *p)
{
    void *empty = NULL;
    if (!atomic_compare_exchange_strong(constant->slot, &empty, p))
        gemm_forget(p);
}

/* Element (r, c) of rows x cols at from (ld_from apart) to (c, r) of to,
 * for elements of type T, in blocks of 8 x 8 that stay in L1. */
#define TURN(T, name)                                                                                                  \
    static void name(const T *from, int64_t ld_from, int64_t rows, int64_t cols, T *to, int64_t ld_to)             \
    {                                                                                                                  \
        enum { BLOCK = 8 };                                                                                            \
        for (int64_t r0 = 0; r0 < rows; r0 += BLOCK)                                                                   \
            for (int64_t c0 = 0; c0 < cols; c0 += BLOCK) {                                                             \
                int64_t r1 = r0 + BLOCK < rows ? r0 + BLOCK : rows, c1 = c0 + BLOCK < cols ? c0 + BLOCK : cols;        \
                for (int64_t c = c0; c < c1; c++)                                                                      \
                    for (int64_t r = r0; r < r1; r++)                                                                  \
                        to[c * ld_to + r] = from[r * ld_from + c];                                                     \
            }                                                                                                          \
    }

TURN(float, turn_f32)
TURN(double, turn_f64)

/* A transposed product's complete sums of pixels [ic, ic + mc) by output
 * channels [jc, jc + nc), turned back, to the micro-kernel over no steps of
 * k for its store or epilogue, as the product's rows (channels) and
 * columns (pixels). */
static void finish_turned(const job *j, const scratch *s, int64_t z, int64_t ic, int64_t mc, int64_t jc, int64_t nc)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *o = j->orig;
    if (g->size == 4)
        turn_f32((const float *)s->acc, s->ld_acc, mc, nc, (float *)s->turned, s->ld_turned);
    else
        turn_f64((const double *)s->acc, s->ld_acc, mc, nc, (double *)s->turned, s->ld_turned);
    for (int64_t r = 0; r < nc; r += g->mr) {
        int64_t row = z * o->m + jc + r;
        gemm_tile t = {.m_rem = nc - r < g->mr ? nc - r : g->mr, .row0 = row, .col0 = ic, .ld_out = o->n,
                       .buffers = j->buffers, .symbols = j->symbols};
        if (j->out)
            t.out = j->out + (row * o->n + ic) * g->size;
        gemm_finish_tiles(g, s->turned + r * s->ld_turned * g->size, s->ld_turned, mc, t);
    }
}

/* Rows [ic, ic + mc) of a transposed product's A for k from pc (kc steps):
 * columns of the product's B (a convolution's through its window), packed
 * in panels of mr. */
static void pack_turned_a(const job *j, const scratch *s, int64_t z, int64_t ic, int64_t mc, int64_t pc, int64_t kc)
{
    const kg_matmul_args *o = j->orig;
    int64_t size = j->g->size;
    if (j->conv)
        conv_pack_b(j->conv, &j->source, o, z, ic, mc, pc, kc, j->g->mr, (int)size, s->ap);
    else
        j->g->pack_a(j->b + (gemm_batch_offset(o->b_batch_strides, o, z) + ic * o->b_col + pc * o->b_row) * size,
                     o->b_col, o->b_row, mc, kc, s->ap);
}

/* Rows [m0, m1) by columns [n0, n1) of matrix z. B is packed by the first
 * block of rows, each micro-panel as its tiles come to it: they read it
 * from L1 rather than from L3 after the whole K x NC panel, which is most
 * of B's cost where A has few rows (a convolution's too: 64 channels at
 * 56x56 packed 3.6 MiB a thread before its first tile). */
static void part(const job *j, const scratch *s, int64_t z, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->args;
    int64_t size = g->size;
    int64_t a_z = gemm_batch_offset(a->a_batch_strides, a, z);
    scratch own = *s;
    s = &own;
    for (int64_t jc = n0; jc < n1; jc += j->bl.nc) {
        int64_t nc = n1 - jc < j->bl.nc ? n1 - jc : j->bl.nc;
        if (j->shared_b) /* packed already, panel by panel; a transposed product's for every matrix */
            own.bp = j->shared_b + (j->transposed ? 0 : z * shared_b_bytes(j)) + jc * a->k * size;
        for (int64_t ic = m0; ic < m1; ic += j->bl.mc) {
            int64_t mc = m1 - ic < j->bl.mc ? m1 - ic : j->bl.mc;
            int64_t pc = 0;
            do {
                int64_t kc = a->k - pc < j->bl.kc ? a->k - pc : j->bl.kc;
                int64_t mode = (pc > 0 ? GEMM_LOAD : 0) | (pc + kc >= a->k && !j->transposed ? GEMM_FINAL : 0);
                if (kc > 0 && j->transposed)
                    pack_turned_a(j, s, z, ic, mc, pc, kc);
                else if (kc > 0 && j->kept)
                    own.ap = kept_panels(j->kept, ic, pc, kc);
                else if (kc > 0 && g->prologue)
                    g->prologue(s->ap, z * a->m + ic, mc, pc, kc, j->buffers, j->symbols);
                else if (kc > 0)
                    g->pack_a(j->a + (a_z + ic * a->a_row + pc * a->a_col) * size, a->a_row, a->a_col, mc, kc, s->ap);
                tiles(j, s, z, ic, mc, jc, nc, pc, kc, mode, ic == m0 && !j->shared_b && kc > 0);
                pc += kc;
            } while (pc < a->k);
            if (j->transposed)
                finish_turned(j, s, z, ic, mc, jc, nc);
        }
    }
}

/* 64-byte aligned: the kernel loads whole vectors of the B panel aligned. */
char *gemm_aligned_block(char **raw, size_t bytes)
{
    *raw = core_alloc(bytes + 64);
    return *raw ? *raw + (64 - (uintptr_t)*raw % 64) % 64 : NULL;
}

/* A part of one block of rows uses each micro-panel of a matrix B once,
 * right after packing it: one panel's room, which stays in L1 and L2,
 * rather than K x NC of them streaming through memory (products of 256
 * rows, as the mlp's, took 2-5% less time). */
static bool packs_one_panel(const job *j)
{
    return !j->shared_b && j->rows_part <= j->bl.mc;
}

static bool scratch_alloc(const job *j, scratch *s, size_t sizes[4])
{
    const gemm_code *g = j->g;
    /* no larger than a part: a small product packs into small blocks */
    int64_t mc = round_up(j->bl.mc < j->rows_part ? j->bl.mc : j->rows_part, g->mr);
    int64_t nc = round_up(j->bl.nc < j->cols_part ? j->bl.nc : j->cols_part, g->nr);
    int64_t kc = j->args->k < j->bl.kc ? j->args->k : j->bl.kc;
    s->one_panel = packs_one_panel(j);
    sizes[0] = (size_t)(mc * (kc > 0 ? kc : 1) * g->size);
    int64_t k = j->args->k > 0 ? j->args->k : 1;
    if (j->shared_b)
        sizes[1] = 64;
    else if (s->one_panel)
        sizes[1] = (size_t)((kc > 0 ? kc : 1) * g->nr * g->size);
    else
        sizes[1] = (size_t)(k * nc * g->size);
    sizes[2] = j->args->k > j->bl.kc || j->transposed ? (size_t)(mc * nc * g->size) : 0;
    /* the turned sums: whole tiles of channels (rows) by pixels (columns) */
    s->ld_turned = round_up(mc, g->nr);
    sizes[3] = j->transposed ? (size_t)(round_up(nc, g->mr) * s->ld_turned * g->size) : 0;
    s->ld_acc = nc;
    s->ap = gemm_aligned_block(&s->raw[0], sizes[0]);
    s->bp = gemm_aligned_block(&s->raw[1], sizes[1]);
    s->acc = sizes[2] ? gemm_aligned_block(&s->raw[2], sizes[2]) : NULL;
    s->turned = sizes[3] ? gemm_aligned_block(&s->raw[3], sizes[3]) : NULL;
    if (s->turned) /* the micro-kernel loads whole tiles: the lanes past a block's pixels are defined */
        memset(s->turned, 0, sizes[3]);
    return s->ap && s->bp && (s->acc || !sizes[2]) && (s->turned || !sizes[3]);
}

static void scratch_free(scratch *s, const size_t sizes[4])
{
    for (int i = 0; i < 4; i++)
        if (s->raw[i])
            core_free(s->raw[i], sizes[i] + 64);
}

static void run_tasks(void *ctx, int64_t begin, int64_t end)
{
    job *j = ctx;
    scratch s = {0};
    size_t sizes[4];
    if (!scratch_alloc(j, &s, sizes)) {
        atomic_store(&j->failed, true);
        scratch_free(&s, sizes);
        return;
    }
    const kg_matmul_args *a = j->args;
    int64_t parts = j->tm * j->tn;
    for (int64_t t = begin; t < end; t++) {
        int64_t z = t / parts, i = t % parts / j->tn, c = t % j->tn;
        int64_t m0 = i * j->rows_part, n0 = c * j->cols_part;
        int64_t m1 = m0 + j->rows_part < a->m ? m0 + j->rows_part : a->m;
        int64_t n1 = n0 + j->cols_part < a->n ? n0 + j->cols_part : a->n;
        if (m0 < m1 && n0 < n1)
            part(j, &s, z, m0, m1, n0, n1);
    }
    scratch_free(&s, sizes);
}

/* -- Splitting across threads ------------------------------------------------------- */

/* Elements a part of rows x cols packs: its A once per block of columns,
 * its B once. */
static double packed(const job *j, int64_t rows, int64_t cols)
{
    double k = (double)j->args->k;
    return (double)rows * k * (double)((cols + j->bl.nc - 1) / j->bl.nc) + k * (double)cols;
}

/* Each matrix in s parts, tm x tn, the split that packs least. */
static void split(job *j, int64_t s)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->args;
    int64_t row_tiles = (a->m + g->mr - 1) / g->mr, col_tiles = (a->n + g->nr - 1) / g->nr;
    double best = -1;
    for (int64_t tm = 1; tm <= s; tm++) {
        if (s % tm || tm > row_tiles || s / tm > col_tiles)
            continue;
        int64_t rows = (row_tiles + tm - 1) / tm * g->mr, cols = (col_tiles + s / tm - 1) / (s / tm) * g->nr;
        double cost = packed(j, rows, cols);
        if (best < 0 || cost < best) {
            best = cost;
            j->tm = tm;
            j->tn = s / tm;
            j->rows_part = rows;
            j->cols_part = cols;
        }
    }
}

/* B panels [begin, end) of all matrices of a convolution, into shared_b. */
static void pack_shared(void *ctx, int64_t begin, int64_t end)
{
    job *j = ctx;
    const kg_matmul_args *a = j->args;
    int64_t panels = (a->n + j->g->nr - 1) / j->g->nr;
    for (int64_t t = begin; t < end; t++) {
        int64_t z = t / panels, col = t % panels * j->g->nr;
        conv_pack_b(j->conv, &j->source, a, z, col, a->n - col < j->g->nr ? a->n - col : j->g->nr, 0, a->k,
                    j->g->nr, (int)j->g->size, j->shared_b + z * shared_b_bytes(j) + col * a->k * j->g->size);
    }
}

/* A convolution split over rows would have each part pack the same B
 * through the window, which costs as much as a tenth of its products (the
 * index map's runs are short where images are small): the threads pack it
 * once together first, when it is one block of columns and not too large.
 * 0, or -1 when out of memory. */
static int pack_b_once(job *j, char **raw, size_t *bytes)
{
    *raw = NULL;
    if (!j->conv || j->tm == 1 || j->args->k <= 0 || round_up(j->args->n, j->g->nr) > j->bl.nc ||
        j->args->batch * shared_b_bytes(j) > SHARED_B_MAX)
        return 0;
    *bytes = (size_t)(j->args->batch * shared_b_bytes(j));
    j->shared_b = gemm_aligned_block(raw, *bytes);
    if (!j->shared_b)
        return -1;
    int64_t panels = (j->args->n + j->g->nr - 1) / j->g->nr;
    core_parallel_for(j->args->batch * panels, 1, pack_shared, j);
    return 0;
}

/* -- One row per matrix ------------------------------------------------------------ */

/* A product of one row (a classifier's 1 x 2048 by 2048 x 1000) is the read
 * of its B: packed, B would be read, written and read again for a tile of
 * which one row in mr is used. Its row is taken whole instead, and B's
 * columns read where they lie, dot products where a column lies along k (a
 * transposed B), else rows of B scaled and added; the micro-kernel over no
 * steps of k then stores each tile or runs the epilogue on it. */

/* out[j] = sum over i < k of a[i] b[i * b_row + j * b_col], j < cols, for
 * elements of type T; a contiguous. Sixteen partial sums a column keep a dot
 * product's adds independent, so they vectorize. */
#define ROW_PRODUCT(T, name)                                                                                            \
    static void name(const T *a, const T *b, int64_t b_row, int64_t b_col, int64_t k, int64_t cols, T *out)         \
    {                                                                                                                  \
        enum { LANES = 16 };                                                                                           \
        if (b_row == 1) {                                                                                              \
            for (int64_t j = 0; j < cols; j++) {                                                                       \
                const T *col = b + j * b_col;                                                                          \
                T part[LANES] = {0}, sum = 0;                                                                          \
                int64_t i = 0;                                                                                         \
                for (; i + LANES <= k; i += LANES)                                                                     \
                    for (int l = 0; l < LANES; l++)                                                                    \
                        part[l] += a[i + l] * col[i + l];                                                              \
                for (; i < k; i++)                                                                                     \
                    sum += a[i] * col[i];                                                                              \
                for (int l = 0; l < LANES; l++)                                                                        \
                    sum += part[l];                                                                                    \
                out[j] = sum;                                                                                          \
            }                                                                                                          \
            return;                                                                                                    \
        }                                                                                                              \
        memset(out, 0, (size_t)cols * sizeof(T));                                                                      \
        for (int64_t i = 0; i < k; i++) {                                                                              \
            const T *row = b + i * b_row, x = a[i];                                                                    \
            if (b_col == 1)                                                                                            \
                for (int64_t j = 0; j < cols; j++)                                                                     \
                    out[j] += x * row[j];                                                                              \
            else                                                                                                       \
                for (int64_t j = 0; j < cols; j++)                                                                     \
                    out[j] += x * row[j * b_col];                                                                      \
        }                                                                                                              \
    }

ROW_PRODUCT(float, row_product_f32)
ROW_PRODUCT(double, row_product_f64)

/* Matrix z's row of A, contiguous: where it lies, or copied into row
 * through panel (pack_a or the prologue packs mr rows: the row is every
 * mr-th value). */
static const char *take_row(const job *j, int64_t z, char *panel, char *row)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->args;
    int64_t size = g->size;
    const char *at = j->a + gemm_batch_offset(a->a_batch_strides, a, z) * size;
    if (!g->prologue && a->a_col == 1)
        return at;
    if (g->prologue)
        g->prologue(panel, z, 1, 0, a->k, j->buffers, j->symbols);
    else
        g->pack_a(at, a->a_row, a->a_col, 1, a->k, panel);
    for (int64_t i = 0; i < a->k; i++)
        memcpy(row + i * size, panel + i * g->mr * size, (size_t)size);
    return row;
}

/* Row-path scratch: the panel pack_a fills, the row, and mr rows of sums
 * for ROW_CHUNK columns (the micro-kernel reads whole tiles). */
enum { ROW_CHUNK_TILES = 16 };

static void row_chunk(const job *j, int64_t z, int64_t n0, int64_t cols, const char *row, char *sums)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->args;
    int64_t size = g->size;
    const char *b = j->b + (gemm_batch_offset(a->b_batch_strides, a, z) + n0 * a->b_col) * size;
    if (size == 4)
        row_product_f32((const float *)row, (const float *)b, a->b_row, a->b_col, a->k, cols, (float *)sums);
    else
        row_product_f64((const double *)row, (const double *)b, a->b_row, a->b_col, a->k, cols, (double *)sums);
    gemm_tile t = {.m_rem = 1, .row0 = z, .col0 = n0, .ld_out = a->n, .buffers = j->buffers, .symbols = j->symbols};
    if (j->out)
        t.out = j->out + (z * a->n + n0) * size;
    gemm_finish_tiles(g, sums, ROW_CHUNK_TILES * g->nr, cols, t);
}

/* Chunks [begin, end) of all matrices' rows, chunks_per_row of each. */
static void run_row_chunks(void *ctx, int64_t begin, int64_t end)
{
    job *j = ctx;
    const kg_matmul_args *a = j->args;
    int64_t size = j->g->size, mr = j->g->mr, chunk = ROW_CHUNK_TILES * j->g->nr, per_row = j->tn;
    size_t bytes[3] = {(size_t)(mr * a->k * size), (size_t)(a->k * size), (size_t)(mr * chunk * size)};
    char *raw[3] = {NULL}, *at[3];
    bool ok = true;
    for (int i = 0; i < 3; i++)
        ok = (at[i] = gemm_aligned_block(&raw[i], bytes[i])) && ok;
    if (ok)
        memset(at[2], 0, bytes[2]);
    const char *row = NULL;
    for (int64_t t = begin, taken = -1; t < end && ok; t++) {
        int64_t z = t / per_row, n0 = t % per_row * chunk;
        if (z != taken)
            row = take_row(j, taken = z, at[0], at[1]);
        row_chunk(j, z, n0, a->n - n0 < chunk ? a->n - n0 : chunk, row, at[2]);
    }
    if (!ok)
        atomic_store(&j->failed, true);
    for (int i = 0; i < 3; i++)
        if (raw[i])
            core_free(raw[i], bytes[i] + 64);
}

/* The product of one row per matrix, in chunks of columns claimed by the
 * pool's threads a few at a time. 0, or -1 (out of memory). */
static int run_rows(const gemm_code *g, const kg_matmul_args *args, const void *a, const void *b, void *out,
                    void *const *buffers, const int64_t *symbols, int64_t threads)
{
    job j = {.g = g, .args = args, .a = a, .b = b, .out = out, .buffers = buffers, .symbols = symbols, .tm = 1};
    int64_t chunk = ROW_CHUNK_TILES * g->nr;
    j.tn = (args->n + chunk - 1) / chunk;
    int64_t tasks = args->batch * j.tn, block = tasks / (4 * threads);
    if (threads == 1)
        run_row_chunks(&j, 0, tasks);
    else
        core_parallel_blocks(tasks, block > 0 ? block : 1, run_row_chunks, &j);
    return atomic_load(&j.failed) ? -1 : 0;
}

void gemm_finish_tiles(const gemm_code *g, char *acc, int64_t ld, int64_t n, gemm_tile t)
{
    char *out = t.out;
    int64_t col0 = t.col0;
    for (int64_t jr = 0; jr < n; jr += g->nr) {
        t.n_rem = n - jr < g->nr ? n - jr : g->nr;
        t.col0 = col0 + jr;
        t.out = out ? out + jr * g->size : NULL;
        g->kernel(0, acc, acc, acc + jr * g->size, ld, GEMM_LOAD | GEMM_FINAL, &t);
    }
}

int gemm_run(const gemm_code *g, const kg_matmul_args *args, const void *a, const void *b, void *out,
             void *const *buffers, const int64_t *symbols, char *err, size_t err_size)
{
    return gemm_run_conv(g, NULL, args, a, b, out, buffers, symbols, NULL, err, err_size);
}

/* A batch of products sharing one B whose A rows follow each other in
 * memory from matrix to matrix (x [4,128,768] @ W, and its gradient g @ Wᵀ)
 * is one product of batch * m rows: the rows, counted over the batch, are
 * the same rows of the output and of a fused kernel's epilogue, but B is
 * packed once instead of once per matrix, and the blocks of rows are as
 * tall as the cache allows rather than m (train_gpt's 128). */
static kg_matmul_args fold_batch(const kg_matmul_args *args)
{
    kg_matmul_args f = *args;
    int64_t step = args->m * args->a_row;
    for (int d = args->batch_ndim - 1; d >= 0; d--) {
        if (args->batch_shape[d] == 1)
            continue;
        if (args->b_batch_strides[d] != 0 || args->a_batch_strides[d] != step)
            return f;
        step *= args->batch_shape[d];
    }
    f.m = args->batch * args->m;
    f.batch = 1;
    f.batch_ndim = 0;
    return f;
}

/* -- A product over few columns, transposed --------------------------------------- *
 * The micro-kernel's tile is wide (on AVX-512, f32: 14 rows by 32 columns,
 * a last tile of one vector of columns or of 8 rows running alone), so a
 * convolution over a 7x7 image, its 49 pixels as columns, runs tiles of 32
 * and 17: 77% of the multiply-adds issued are used. Cᵀ = Bᵀ Aᵀ has the
 * pixels as rows (49 = 3 x 14 + 7: 98%) and the output channels as
 * columns; its B, the filters Aᵀ, is packed once and kept where A would be
 * (kx_constant), its A packed from B's columns (a convolution's through the
 * window), and each block of sums is turned back before the store or the
 * epilogue, which see the product as called. Each element's sum runs over k
 * in the same blocks and order as before: the results are the same. */

enum { LONG_K = 1024 };

/* Columns (or rows) a k step of tiles issues along an axis of n, tiles of
 * tile where a last part of at most cut runs alone. */
static int64_t issued(int64_t n, int64_t tile, int64_t cut)
{
    int64_t rem = n % tile;
    return n / tile * tile + (rem == 0 ? 0 : rem <= cut ? cut : tile);
}

/* Whether the transposed product issues an eighth fewer multiply-adds,
 * which pays for turning each block of sums back, or fewer over a long k
 * (a 3x3 over 256 channels at 14x14, 196 pixels: 94%, measured 0.82 of the
 * time), where that turn is cheap beside each sum and the filters, packed
 * already, save packing B through the window. KILN_GEMM_TURN=1 takes it and
 * 0 never does, where A is kept (tests). */
static bool transposes(const job *j, const kx_constant *constant)
{
    const gemm_code *g = j->g;
    const kg_matmul_args *a = j->args;
    if (!keeps_a(j, constant))
        return false;
    int64_t forced = core_env_int("KILN_GEMM_TURN", -1);
    if (forced >= 0)
        return forced > 0;
    int64_t short_rows = g->mr > GEMM_SHORT_ROWS ? GEMM_SHORT_ROWS : g->mr;
    double plain = (double)issued(a->m, g->mr, short_rows) * (double)issued(a->n, g->nr, g->lanes);
    double turned = (double)issued(a->n, g->mr, short_rows) * (double)issued(a->m, g->nr, g->lanes);
    return 8 * turned < 7 * plain || (turned < plain && a->k >= LONG_K);
}

/* The job turned into Cᵀ = Bᵀ Aᵀ (its args now turned) with the filters
 * packed as its B, or the job as it was and NULL where they could not be
 * packed (out of memory): the plain product runs then. */
static kept_a *take_turned(job *j, kg_matmul_args *turned, const kx_constant *constant)
{
    const kg_matmul_args *args = j->args;
    j->transposed = true;
    kept_a *kept = take_kept(j, constant);
    if (!kept) {
        j->transposed = false;
        return NULL;
    }
    turned->m = args->n;
    turned->n = args->m;
    j->args = turned;
    j->rows_part = turned->m;
    j->cols_part = turned->n;
    return kept;
}

int gemm_run_conv(const gemm_code *g, const kx_conv *c, const kg_matmul_args *args, const void *a, const void *b,
                  void *out, void *const *buffers, const int64_t *symbols, const kx_constant *constant, char *err,
                  size_t err_size)
{
    if (args->batch <= 0 || args->m <= 0 || args->n <= 0)
        return 0;
    kg_matmul_args folded = c ? *args : fold_batch(args);
    args = &folded;
    job j = {.g = g, .args = args, .orig = args, .a = a, .b = b, .out = out, .buffers = buffers, .symbols = symbols,
             .conv = c, .bl = block_sizes(g, args->k), .tm = 1, .tn = 1, .rows_part = args->m, .cols_part = args->n};
    double work = (double)args->batch * (double)args->m * (double)args->n * (double)(args->k > 0 ? args->k : 1);
    bool large_b = (double)args->k * (double)args->n >= GEMM_LARGE_B;
    int64_t threads = work < GEMM_SMALL && !large_b ? 1 : core_threads(), s = 1;
    if (args->m == 1 && !c) {
        if (run_rows(g, args, a, b, out, buffers, symbols, threads) == 0)
            return 0;
        snprintf(err, err_size, "out of memory for a matrix product's row");
        return -1;
    }
    kg_matmul_args turned = *args;
    kept_a *kept = transposes(&j, constant) ? take_turned(&j, &turned, constant) : NULL;
    while (args->batch * s % threads) /* parts of each matrix, so that every thread has as many */
        s++;
    if (s > 1)
        split(&j, s);
    char *source_raw = NULL, *shared_raw = NULL;
    size_t source_bytes = 0, shared_bytes = 0;
    if (c && conv_prepare(c, args, b, (int)g->size, &j.source, &source_raw, &source_bytes) < 0)
        atomic_store(&j.failed, true);
    if (!atomic_load(&j.failed) && !j.transposed && pack_b_once(&j, &shared_raw, &shared_bytes) < 0)
        atomic_store(&j.failed, true);
    if (j.transposed)
        j.shared_b = kept->panels;
    else if (!atomic_load(&j.failed) && keeps_a(&j, constant))
        j.kept = kept = take_kept(&j, constant);
    int64_t tasks = args->batch * j.tm * j.tn;
    if (!atomic_load(&j.failed))
        core_parallel_for(tasks, threads > 1 ? 1 : tasks, run_tasks, &j);
    if (kept)
        keep(constant, kept);
    if (shared_raw)
        core_free(shared_raw, shared_bytes + 64);
    if (source_raw)
        core_free(source_raw, source_bytes + 64);
    if (atomic_load(&j.failed)) {
        snprintf(err, err_size, "out of memory for a matrix product's packed panels");
        return -1;
    }
    return 0;
}

llvm_code *gemm_load(const void *object, size_t size, const char *symbol, const char *const *extra, int n_extra,
                     void **extra_at, gemm_code *g, char *err, size_t err_size)
{
    enum { MAX = 8 };
    const char *suffixes[MAX] = {GEMM_PACK_A, GEMM_PACK_B, GEMM_KERNEL, GEMM_GEOMETRY};
    char names[MAX][160];
    const char *list[MAX];
    int n = 4 + n_extra;
    KILN_ASSERT(n <= MAX);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "%s%s", symbol, i < 4 ? suffixes[i] : extra[i - 4]);
        list[i] = names[i];
    }
    void *at[MAX] = {NULL};
    llvm_code *code = llvm_load_symbols(object, size, list, n, at, err, err_size);
    if (!code)
        return NULL;
    const int32_t *geometry = at[3];
    *g = (gemm_code){.pack_a = (gemm_pack_fn)(uintptr_t)at[0], .pack_b = (gemm_pack_fn)(uintptr_t)at[1],
                     .kernel = (gemm_kernel_fn)(uintptr_t)at[2], .mr = geometry[0], .nr = geometry[1],
                     .lanes = geometry[2], .size = geometry[3]};
    for (int i = 0; i < n_extra; i++)
        extra_at[i] = at[4 + i];
    return code;
}
