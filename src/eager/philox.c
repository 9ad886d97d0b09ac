/* The global random generator and dropout: Philox4x32-10 (Salmon et al.,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11), counter based, so
 * that element i of a draw at offset o is a function of (seed, o + i) alone:
 * the same on the CPU and on CUDA, on any thread count, eagerly and traced.
 *
 * The generator is a seed and an offset, in 32-bit words. Each draw takes
 * the next words (its element count rounded up to 4) and advances the
 * offset. A traced call reserves the words of all its draws at once, in the
 * order the body made them, so that it draws what running the body eagerly
 * from the same state would. */
#include <stdatomic.h>
#include <string.h>

#include "eager/internal.h"

enum { DEFAULT_SEED = 0x6b696c6e, PHILOX_ROUNDS = 10 };

static struct {
    _Atomic uint64_t seed, offset;
} generator = {DEFAULT_SEED, 0};

/* -- Philox4x32-10 ---------------------------------------------------------- */

/* The 4 words of block counter under key seed. */
static void philox(uint64_t seed, uint64_t counter, uint32_t out[4])
{
    uint32_t c[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < PHILOX_ROUNDS; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t next[4] = {(uint32_t)(p1 >> 32) ^ c[1] ^ k0, (uint32_t)p1, (uint32_t)(p0 >> 32) ^ c[3] ^ k1,
                            (uint32_t)p0};
        memcpy(c, next, sizeof c);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    memcpy(out, c, sizeof c);
}

typedef struct {
    uint64_t seed, offset; /* offset: words, a multiple of 4 */
    float *out;
    int64_t n;
} uniform_job;

/* Blocks [begin, end) of 4 elements: word w of the draw is (w >> 8) 2^-24. */
static void uniform_blocks(void *ctx, int64_t begin, int64_t end)
{
    const uniform_job *j = ctx;
    for (int64_t b = begin; b < end; b++) {
        uint32_t words[4];
        philox(j->seed, j->offset / 4 + (uint64_t)b, words);
        for (int64_t k = 0; k < 4 && 4 * b + k < j->n; k++)
            j->out[4 * b + k] = (float)(words[k] >> 8) * 0x1p-24f;
    }
}

/* The words a draw of n elements takes. */
static uint64_t words_of(int64_t n)
{
    return ((uint64_t)n + 3) / 4 * 4;
}

/* A new unowned f32 tensor of the generator's uniform values at offset. */
static kiln_tensor *uniform(const char *fn, int ndim, const int64_t *shape, uint64_t seed, uint64_t offset,
                            kiln_device device)
{
    kiln_tensor *t = tensor_new_on(fn, device, KILN_F32, ndim, shape);
    if (!t || t->numel == 0)
        return t;
    if (device == KILN_CUDA) {
        kg_kernel k = cuda_request(KG_RANDOM, OP_UNIFORM, 1);
        k.in[0] = k.compute = k.acc = k.out = KILN_F32;
        kg_code code;
        kg_random_args args = {t->numel, seed, offset};
        void *out = eager_data(t), *params[2] = {&args, &out};
        unsigned grid[3];
        if (cuda_kernel(fn, &k, &code) < 0 || cuda_launch(fn, &code, cuda_grid_over(grid, &code, (t->numel + 3) / 4),
                                                          params) < 0)
            return tensor_drop(t);
        return t;
    }
    uniform_job job = {seed, offset, (float *)eager_data(t), t->numel};
    core_parallel_for((t->numel + 3) / 4, 16 * 1024, uniform_blocks, &job);
    return t;
}

/* -- The generator ----------------------------------------------------------------- */

void kiln_manual_seed(uint64_t seed)
{
    atomic_store(&generator.seed, seed);
    atomic_store(&generator.offset, 0);
}

void kiln_rng_state(uint64_t *seed, uint64_t *offset)
{
    if (seed)
        *seed = atomic_load(&generator.seed);
    if (offset)
        *offset = atomic_load(&generator.offset);
}

void kiln_set_rng_state(uint64_t seed, uint64_t offset)
{
    atomic_store(&generator.seed, seed);
    atomic_store(&generator.offset, words_of((int64_t)offset)); /* draws start on whole blocks */
}

uint64_t eager_rng_reserve(const ir_graph *g)
{
    uint64_t words = 0;
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        uint64_t end = n->op == OP_UNIFORM ? (uint64_t)n->params.index + words_of(ir_node_numel(n)) : 0;
        words = end > words ? end : words;
    }
    return words ? atomic_fetch_add(&generator.offset, words) : atomic_load(&generator.offset);
}

kiln_tensor *eager_uniform(const ir_node *n, uint64_t base, kiln_device device)
{
    return uniform("kiln_dropout", n->ndim, n->shape, atomic_load(&generator.seed),
                   base + (uint64_t)n->params.index, device);
}

/* The generator's next uniform values of shape (ndim, shape) on device:
 * drawn now eagerly; traced, a node drawing at its place in each call. */
static kiln_tensor *draw(const char *fn, int ndim, const int64_t *shape, kiln_device device)
{
    int64_t numel;
    if (check_shape(fn, ndim, shape, &numel) < 0)
        return NULL;
    if (recording()) {
        eager_trace *trace = eager_active_trace();
        ir_params params = {.index = (int64_t)trace->random_words};
        trace->random_words += words_of(numel);
        return record_op(fn, OP_UNIFORM, 0, NULL, &params, KILN_F32, ndim, shape);
    }
    uint64_t offset = atomic_fetch_add(&generator.offset, words_of(numel));
    return tensor_own(uniform(fn, ndim, shape, atomic_load(&generator.seed), offset, device));
}

/* -- Dropout ---------------------------------------------------------------------- */

kiln_tensor *kiln_dropout(kiln_tensor *x, double p, bool training)
{
    const char *fn = "kiln_dropout";
    if (!composite_check(fn, x, 0, false))
        return NULL;
    char d[DESCRIBE_MAX];
    if (!(p >= 0 && p <= 1)) {
        core_fail(CORE_VALUE, fn, "p %g is not a probability (operand %s)", p, describe(d, x));
        return NULL;
    }
    if (!ir_dtype_is_float(x->dtype)) {
        core_fail(CORE_DTYPE, fn, "%s is not floating point", describe(d, x));
        return NULL;
    }
    if (!training || p == 0)
        return tensor_own(kiln_retain(x));
    composite_begin();
    /* PyTorch's x * (bernoulli(1 - p) / (1 - p)): a dropped NaN stays NaN */
    kiln_tensor *u = draw(fn, x->ndim, x->shape, x->device);
    kiln_tensor *keep = eager_scalar_op(OP_LT, fn, u, 1 - p, false);
    kiln_tensor *scale = eager_filled(fn, x->dtype, 0, NULL, p < 1 ? 1 / (1 - p) : 0, x->device);
    kiln_tensor *zero = eager_filled(fn, x->dtype, 0, NULL, 0, x->device);
    return composite_end(fn, kiln_mul(x, kiln_where(keep, scale, zero)));
}
