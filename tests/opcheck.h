/* Checking an op against a naive f64 reference the test writes: inputs in
 * several memory layouts, and the op run eagerly, through the interpreter
 * and compiled (LLVM on the CPU; NVRTC with KILN_TEST_DEVICE=cuda, where
 * the inputs move to CUDA first), each result held to the reference. */
#ifndef KILN_TESTS_OPCHECK_H
#define KILN_TESTS_OPCHECK_H

#include "test_common.h"

#define OC_COUNT(a) ((int)(sizeof(a) / sizeof *(a)))
enum { OC_MAX_ELEMS = 4096, OC_MAX_INPUTS = 16 };

/* -- Shapes and values ------------------------------------------------------- */

static inline int64_t oc_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

static inline void oc_unravel(int64_t i, int ndim, const int64_t *shape, int64_t *idx)
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

static inline int64_t oc_ravel(int ndim, const int64_t *shape, const int64_t *idx)
{
    int64_t i = 0;
    for (int d = 0; d < ndim; d++)
        i = i * shape[d] + idx[d];
    return i;
}

/* Index idx of an out_ndim-d result read from an operand of (ndim, shape)
 * that broadcasts to it: the operand's row-major index. */
static inline int64_t oc_broadcast_index(int out_ndim, const int64_t *idx, int ndim, const int64_t *shape)
{
    int64_t i = 0;
    for (int d = 0; d < ndim; d++)
        i = i * shape[d] + (shape[d] == 1 ? 0 : idx[d + out_ndim - ndim]);
    return i;
}

static inline bool oc_is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64;
}

/* x as dt holds it: f32 rounding, integers wrapped, bools 0 or 1. */
static inline double oc_round(kiln_dtype dt, double x)
{
    switch (dt) {
    case KILN_F32: return (float)x;
    case KILN_I32: return (double)(int32_t)(uint32_t)(uint64_t)(int64_t)x;
    case KILN_I64: return (double)(int64_t)x;
    case KILN_BOOL: return x != 0;
    default: return x;
    }
}

static inline void oc_put(kiln_dtype dt, void *p, int64_t i, double x)
{
    switch (dt) {
    case KILN_F32: ((float *)p)[i] = (float)x; break;
    case KILN_F64: ((double *)p)[i] = x; break;
    case KILN_I32: ((int32_t *)p)[i] = (int32_t)x; break;
    case KILN_I64: ((int64_t *)p)[i] = (int64_t)x; break;
    case KILN_BOOL: ((uint8_t *)p)[i] = x != 0; break;
    }
}

/* -- Layouts ------------------------------------------------------------------ */

/* How an input sits in memory; every layout shows the same logical values. */
typedef enum { OC_CONTIG, OC_TRANSPOSED, OC_STEP2, OC_REVERSED, OC_BROADCAST, OC_LAYOUTS } oc_layout;
static const char *const oc_layout_names[] = {"contiguous", "transposed", "step-2 slice", "step -2 slice",
                                              "broadcast"};

/* A tensor of logical shape (ndim, shape) holding v, laid out as lay: the
 * values go into a base tensor (transposed, with gaps, or one slice) and
 * lay's view of it is returned, owned by the scope. BROADCAST needs v
 * constant along axis 0. Unused slots of the base hold 99, which shows. */
static inline kiln_tensor *oc_tensor(kiln_dtype dt, oc_layout lay, int ndim, const int64_t *shape, const double *v)
{
    int last = ndim - 1;
    int64_t base_shape[KILN_MAX_DIMS];
    if (ndim == 0)
        lay = OC_CONTIG;
    for (int d = 0; d < ndim; d++)
        base_shape[d] = shape[d];
    if (lay == OC_TRANSPOSED) {
        base_shape[0] = shape[last];
        base_shape[last] = shape[0];
    } else if (lay == OC_STEP2) {
        base_shape[last] = 2 * shape[last] + 1;
    } else if (lay == OC_REVERSED) {
        base_shape[0] = 2 * shape[0];
    } else if (lay == OC_BROADCAST) {
        base_shape[0] = 1;
    }
    int64_t base_n = oc_numel(ndim, base_shape), n = oc_numel(ndim, shape);
    void *buf = malloc((size_t)(base_n ? base_n : 1) * 8);
    for (int64_t j = 0; j < base_n; j++)
        oc_put(dt, buf, j, 99);
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[KILN_MAX_DIMS] = {0};
        oc_unravel(i, ndim, shape, idx);
        if (lay == OC_TRANSPOSED) {
            int64_t first = idx[0];
            idx[0] = idx[last];
            idx[last] = first;
        } else if (lay == OC_STEP2) {
            idx[last] = 1 + 2 * idx[last];
        } else if (lay == OC_REVERSED) {
            idx[0] = 2 * shape[0] - 1 - 2 * idx[0];
        } else if (lay == OC_BROADCAST) {
            idx[0] = 0;
        }
        oc_put(dt, buf, oc_ravel(ndim, base_shape, idx), v[i]);
    }
    kiln_tensor *base = kiln_from_data(dt, ndim, base_shape, buf);
    free(buf);
    switch (lay) {
    case OC_TRANSPOSED: return kiln_transpose(base, 0, -1);
    case OC_STEP2: return kiln_slice(base, -1, 1, base_shape[last], 2);
    case OC_REVERSED: return kiln_slice(base, 0, -1, -base_shape[0] - 1, -2);
    case OC_BROADCAST: return kiln_expand(base, ndim, shape);
    default: return base;
    }
}

/* splitmix64: inputs the same on every machine. */
static inline uint64_t oc_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* A value of dt in [lo, hi]: whole numbers for integers, 0 or 1 for bool. */
static inline double oc_draw(kiln_dtype dt, double lo, double hi, uint64_t *s)
{
    double u = (double)(oc_next(s) >> 11) * 0x1p-53;
    if (dt == KILN_BOOL)
        return u < 0.5;
    if (!oc_is_float(dt))
        return ceil(lo) + floor(u * (floor(hi) - ceil(lo) + 1));
    return oc_round(dt, lo + (hi - lo) * u);
}

/* An input: its values (row-major) and its tensor in some layout. */
typedef struct {
    kiln_tensor *t;
    kiln_dtype dt;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t numel;
    double v[OC_MAX_ELEMS];
    char desc[128]; /* "i32 transposed [4,1,3]" */
} oc_operand;

static inline const char *oc_shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    int used = snprintf(buf, size, "[");
    for (int d = 0; d < ndim; d++)
        used += snprintf(buf + used, size - (size_t)used, d ? ",%lld" : "%lld", (long long)shape[d]);
    snprintf(buf + used, size - (size_t)used, "]");
    return buf;
}

/* Fills op with values from [lo, hi] (seeded; a BROADCAST operand repeats
 * along axis 0) and makes its tensor in layout lay. */
static inline void oc_operand_init(oc_operand *op, kiln_dtype dt, oc_layout lay, int ndim, const int64_t *shape,
                                   double lo, double hi, uint64_t seed)
{
    if (ndim == 0 || (lay == OC_BROADCAST && shape[0] == 0))
        lay = OC_CONTIG;
    op->dt = dt;
    op->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        op->shape[d] = shape[d];
    op->numel = oc_numel(ndim, shape);
    ck_assert(op->numel <= OC_MAX_ELEMS);
    int64_t period = lay == OC_BROADCAST ? op->numel / shape[0] : op->numel;
    uint64_t state = seed * 7919 + 17;
    for (int64_t i = 0; i < op->numel; i++)
        op->v[i] = i < period ? oc_draw(dt, lo, hi, &state) : op->v[i % period];
    char sh[96];
    snprintf(op->desc, sizeof op->desc, "%s %s %s", kiln_dtype_name(dt), oc_layout_names[lay],
             oc_shape_str(sh, sizeof sh, ndim, shape));
    op->t = oc_tensor(dt, lay, ndim, shape, op->v);
    ck_assert_msg(op->t != NULL, "building %s: %s", op->desc, kiln_last_error());
}

/* -- Running in every mode ------------------------------------------------------ */

typedef kiln_tensor *(*oc_fn)(kiln_tensor *const *in, const void *ctx);

/* How close a float must be: |got - want| <= rel |want| + abs; zero_sign:
 * a zero must have the reference's sign. Integers and bools are exact. */
typedef struct {
    double rel, abs;
    bool zero_sign;
} oc_tol;

/* Whether case i of a loop runs: every one, or every eighth under valgrind,
 * where each compile takes seconds. */
static inline bool oc_sampled(int i)
{
    return !UNDER_VALGRIND() || i % 8 == 0;
}

/* Where inputs go: KILN_TEST_DEVICE=cuda runs every check on CUDA. */
static inline kiln_device oc_device(void)
{
    const char *d = getenv("KILN_TEST_DEVICE");
    return d && !strcmp(d, "cuda") ? KILN_CUDA : KILN_CPU;
}

typedef struct {
    oc_fn fn;
    const void *ctx;
} oc_body_ctx;

static inline int oc_body(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    const oc_body_ctx *b = user;
    out[0] = b->fn(in, b->ctx);
    return out[0] ? 0 : -1;
}

/* fn on in as a marked function run by backend (strict: no eager fallback);
 * NULL with kiln's error when the call fails. */
static inline kiln_tensor *oc_traced(oc_fn fn, const void *ctx, int n, kiln_tensor *const *in, kiln_backend backend)
{
    oc_body_ctx b = {fn, ctx};
    kiln_jit_options o = kiln_jit_defaults();
    o.backend = backend;
    o.strict = true;
    kiln_fn *f = kiln_jit("opcheck", oc_body, n, 1, &b, &o);
    kiln_tensor *out = NULL;
    int status = kiln_call(f, in, &out);
    kiln_fn_free(f);
    return status == 0 ? out : NULL;
}

/* The counters of a traced call of fn on in (kiln_fn_stats) into s; false
 * where it is interpreted (a build without a code generator). */
static inline bool oc_call_stats(oc_fn fn, const void *ctx, int n, kiln_tensor *const *in, kiln_fn_stats_t *s)
{
    oc_body_ctx b = {fn, ctx};
    kiln_fn *f = kiln_jit("kernels", oc_body, n, 1, &b, NULL);
    kiln_tensor *out = NULL;
    ck_assert_msg(kiln_call(f, in, &out) == 0, "%s", kiln_last_error());
    kiln_fn_stats(f, s);
    bool compiled = strcmp(kiln_fn_backend(f), "interp") != 0;
    kiln_fn_free(f);
    kiln_release(out);
    return compiled;
}

/* The kernels a traced call of fn on in launches (kiln_fn_stats), or -1
 * where it is interpreted (a build without a code generator). */
static inline int oc_kernels(oc_fn fn, const void *ctx, int n, kiln_tensor *const *in)
{
    kiln_fn_stats_t s;
    return oc_call_stats(fn, ctx, n, in, &s) ? s.kernels : -1;
}

/* The steps of a traced call of fn on in that the eager ops run (a product
 * left out of every kernel, say), or -1 where it is interpreted: its steps
 * but its kernels, each counted once as compiled, loaded or shared. */
static inline int oc_eager_steps(oc_fn fn, const void *ctx, int n, kiln_tensor *const *in)
{
    kiln_fn_stats_t s;
    if (!oc_call_stats(fn, ctx, n, in, &s))
        return -1;
    return s.kernels - (int)(s.kernels_compiled + s.kernels_from_disk + s.kernels_shared);
}

static inline bool oc_close(double got, double want, kiln_dtype dt, oc_tol tol)
{
    if (!oc_is_float(dt) || isinf(want))
        return got == want;
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (tol.zero_sign && want == 0 && got == 0)
        return signbit(want) == signbit(got);
    return fabs(got - want) <= tol.rel * fabs(want) + tol.abs;
}

/* got has dtype dt, shape (ndim, shape) and values want (row-major). */
static inline void oc_compare(kiln_tensor *got, kiln_dtype dt, int ndim, const int64_t *shape, const double *want,
                              oc_tol tol, const char *what, const char *mode)
{
    ck_assert_msg(got != NULL, "%s %s: failed: %s", what, mode, kiln_last_error());
    ck_assert_msg(kiln_dtype_of(got) == dt, "%s %s: dtype %s, want %s", what, mode,
                  kiln_dtype_name(kiln_dtype_of(got)), kiln_dtype_name(dt));
    char a[96], b[96];
    bool same = kiln_ndim(got) == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = kiln_shape(got)[d] == shape[d];
    ck_assert_msg(same, "%s %s: shape %s, want %s", what, mode,
                  oc_shape_str(a, sizeof a, kiln_ndim(got), kiln_shape(got)), oc_shape_str(b, sizeof b, ndim, shape));
    double *g = test_values(got);
    int64_t n = oc_numel(ndim, shape), i = 0;
    while (i < n && oc_close(g[i], want[i], dt, tol))
        i++;
    double bad = i < n ? g[i] : 0;
    free(g);
    ck_assert_msg(i == n, "%s %s: element %lld is %.17g, want %.17g", what, mode, (long long)i, bad,
                  i < n ? want[i] : 0);
}

/* in[0..n) on oc_device(), into moved (owned by the scope). */
static inline void oc_move(const char *what, int n, kiln_tensor *const *in, kiln_tensor **moved)
{
    ck_assert(n <= OC_MAX_INPUTS);
    for (int i = 0; i < n; i++) {
        moved[i] = oc_device() == KILN_CPU ? in[i] : kiln_to_device(in[i], KILN_CUDA);
        ck_assert_msg(moved[i] != NULL, "%s: moving input %d: %s", what, i, kiln_last_error());
    }
}

/* Whether this check compiles: under valgrind, where an LLVM compile takes
 * seconds, one check in four does (the compiled code is still checked for
 * memory errors, at a quarter of the cost); elsewhere every one. */
static inline bool oc_compiles(void)
{
    static int checks;
    return !UNDER_VALGRIND() || checks++ % 4 == 0;
}

/* fn on in (n tensors, on the CPU) eagerly, interpreted and compiled, each
 * on oc_device(), against the reference (dt, ndim, shape, want). */
static inline void oc_check(const char *what, oc_fn fn, const void *ctx, int n, kiln_tensor *const *in, kiln_dtype dt,
                            int ndim, const int64_t *shape, const double *want, oc_tol tol)
{
    kiln_scope_begin();
    kiln_tensor *moved[OC_MAX_INPUTS];
    oc_move(what, n, in, moved);
    oc_compare(fn(moved, ctx), dt, ndim, shape, want, tol, what, "eagerly");
    oc_compare(oc_traced(fn, ctx, n, moved, KILN_BACKEND_INTERP), dt, ndim, shape, want, tol, what, "interpreted");
    if (oc_compiles())
        oc_compare(oc_traced(fn, ctx, n, moved, KILN_BACKEND_AUTO), dt, ndim, shape, want, tol, what, "compiled");
    kiln_scope_end();
}

/* fn on in (moved to oc_device()) fails in every mode with an error
 * containing needle. */
static inline void oc_check_error(const char *what, oc_fn fn, const void *ctx, int n, kiln_tensor *const *in,
                                  const char *needle)
{
    kiln_scope_begin();
    kiln_tensor *moved[OC_MAX_INPUTS];
    oc_move(what, n, in, moved);
    for (int mode = 0; mode < 3; mode++) {
        kiln_clear_error();
        kiln_tensor *got = mode == 0 ? fn(moved, ctx)
                                     : oc_traced(fn, ctx, n, moved, mode == 1 ? KILN_BACKEND_INTERP : KILN_BACKEND_AUTO);
        ck_assert_msg(got == NULL, "%s (mode %d): no error", what, mode);
        ck_assert_msg(strstr(kiln_last_error(), needle) != NULL, "%s (mode %d): error \"%s\" lacks \"%s\"", what,
                      mode, kiln_last_error(), needle);
    }
    kiln_scope_end();
}

#endif
