/* Tensor lifetime: storage, reference counts, scopes, accessors and checks. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "eager/internal.h"

static _Atomic int64_t live_tensors, live_bytes, peak_bytes;

/* -- Storage --------------------------------------------------------------- */

/* Small storages share one block with their header: one allocation per tensor. */
enum { HEADER = 64, INLINE_LIMIT = 1 << 20 };

static eager_storage *storage_new(size_t nbytes)
{
    eager_storage *s;
    if (nbytes + HEADER < INLINE_LIMIT) {
        s = core_alloc(HEADER + nbytes);
        if (!s)
            return NULL;
        s->data = (char *)s + HEADER;
    } else {
        s = core_alloc(sizeof *s);
        if (!s)
            return NULL;
        s->data = core_alloc(nbytes);
        if (!s->data) {
            core_free(s, sizeof *s);
            return NULL;
        }
    }
    atomic_init(&s->refs, 1);
    atomic_init(&s->version, 0);
    s->device = KILN_CPU;
    s->nbytes = nbytes;
    int64_t now = atomic_fetch_add_explicit(&live_bytes, (int64_t)nbytes, memory_order_relaxed) + (int64_t)nbytes;
    int64_t peak = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak(&peak_bytes, &peak, now))
        ;
    return s;
}

/* Device memory from the CUDA allocator; its header on the host. NULL with
 * the reason in why. */
static eager_storage *storage_new_cuda(size_t nbytes, char *why, size_t why_size)
{
    eager_storage *s = core_alloc(sizeof *s);
    if (!s) {
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    if (!(s->data = device_alloc(nbytes, &s->device_bytes, why, why_size))) {
        core_free(s, sizeof *s);
        return NULL;
    }
    atomic_init(&s->refs, 1);
    atomic_init(&s->version, 0);
    s->device = KILN_CUDA;
    s->nbytes = nbytes;
    return s;
}

static void storage_release(eager_storage *s)
{
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (s->device == KILN_CUDA) {
        device_free(s->data, s->device_bytes);
        core_free(s, sizeof *s);
        return;
    }
    atomic_fetch_sub_explicit(&live_bytes, (int64_t)s->nbytes, memory_order_relaxed);
    if (s->nbytes + HEADER < INLINE_LIMIT) {
        core_free(s, HEADER + s->nbytes);
        return;
    }
    core_free(s->data, s->nbytes);
    core_free(s, sizeof *s);
}

/* -- Tensors --------------------------------------------------------------- */

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t step = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = step;
        step *= shape[i] > 1 ? shape[i] : 1;
    }
}

static kiln_tensor *tensor_alloc(kiln_dtype dt, int ndim, const int64_t *shape, int64_t numel)
{
    kiln_tensor *t = core_alloc(sizeof *t);
    if (!t)
        return NULL;
    t->magic = TENSOR_ALIVE;
    atomic_init(&t->refs, 1);
    atomic_init(&t->scoped, 0);
    atomic_init(&t->held, 0);
    t->dtype = dt;
    t->device = KILN_CPU;
    t->ndim = ndim;
    t->numel = numel;
    t->offset = 0;
    if (ndim)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->storage = NULL;
    t->literal = false;
    t->born_in_trace = false;
    t->trace = NULL;
    t->node = 0;
    t->requires_grad = false;
    t->grad_fn = NULL;
    t->grad = NULL;
    atomic_fetch_add_explicit(&live_tensors, 1, memory_order_relaxed);
    return t;
}

kiln_tensor *tensor_new(const char *fn, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return tensor_new_on(fn, KILN_CPU, dt, ndim, shape);
}

kiln_tensor *tensor_new_on(const char *fn, kiln_device device, kiln_dtype dt, int ndim, const int64_t *shape)
{
    int64_t numel;
    if (check_dtype(fn, dt) < 0 || check_shape(fn, ndim, shape, &numel) < 0)
        return NULL;
    char why[512];
    why[0] = '\0'; /* not the whole buffer: this is every op's and every call's allocation */
    kiln_tensor *t = tensor_alloc(dt, ndim, shape, numel);
    if (!t)
        goto fail;
    contiguous_strides(ndim, shape, t->strides);
    t->device = device;
    size_t nbytes = (size_t)numel * eager_dtype_size(dt);
    t->storage = device == KILN_CUDA ? storage_new_cuda(nbytes, why, sizeof why) : storage_new(nbytes);
    if (!t->storage)
        goto fail;
    t->born_in_trace = recording();
    return t;
fail:
    tensor_drop(t);
    char buf[CORE_SHAPE_STR_MAX];
    core_shape_str(buf, ndim, shape);
    if (device == KILN_CUDA)
        core_fail(!why[0] || strstr(why, "out of memory") ? CORE_NOMEM : CORE_DEVICE, fn,
                  "cannot allocate %s %s on CUDA: %s", buf, kiln_dtype_name(dt), why[0] ? why : "out of memory");
    else
        core_fail(CORE_NOMEM, fn, "out of memory allocating %s %s", buf, kiln_dtype_name(dt));
    return NULL;
}

kiln_tensor *tensor_new_meta(kiln_dtype dt, int ndim, const int64_t *shape)
{
    int64_t numel = 0;
    bool checked = ir_shape_numel(ndim, shape, &numel); /* by record_op, or a real tensor's */
    KILN_ASSERT(checked);
    kiln_tensor *t = tensor_alloc(dt, ndim, shape, numel);
    if (t)
        contiguous_strides(ndim, shape, t->strides);
    return t;
}

kiln_tensor *tensor_view(const char *fn, const kiln_tensor *base, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset)
{
    int64_t numel;
    if (check_shape(fn, ndim, shape, &numel) < 0)
        return NULL;
    kiln_tensor *t = tensor_alloc(base->dtype, ndim, shape, numel);
    if (!t) {
        core_fail_status(CORE_NOMEM, fn);
        return NULL;
    }
    t->device = base->device;
    if (ndim)
        memcpy(t->strides, strides, (size_t)ndim * sizeof *strides);
    t->offset = offset;
    t->born_in_trace = base->born_in_trace;
    t->storage = base->storage;
    atomic_fetch_add_explicit(&t->storage->refs, 1, memory_order_relaxed);
    return t;
}

kiln_tensor *tensor_drop(kiln_tensor *t)
{
    kiln_release(t);
    return NULL;
}

/* Released tensors' headers that debug builds keep, poisoned, before freeing
 * them: a release (or use) of one of them is reported. */
enum { QUARANTINE = 4096 };

#ifndef NDEBUG
static struct {
    pthread_mutex_t lock;
    kiln_tensor *held[QUARANTINE];
    int next;
} quarantine = {.lock = PTHREAD_MUTEX_INITIALIZER};
#endif

static void header_free(kiln_tensor *t)
{
    t->magic = TENSOR_DEAD;
#ifndef NDEBUG
    pthread_mutex_lock(&quarantine.lock);
    kiln_tensor *oldest = quarantine.held[quarantine.next];
    quarantine.held[quarantine.next] = t;
    quarantine.next = (quarantine.next + 1) % QUARANTINE;
    pthread_mutex_unlock(&quarantine.lock);
    t = oldest;
    if (!t)
        return;
#endif
    core_free(t, sizeof *t);
}

static int dead_tensor(const char *fn)
{
    return core_fail(CORE_STATE, fn, "the tensor was released already: a release too many, or one a scope "
                     "released when it ended");
}

kiln_tensor *kiln_retain(kiln_tensor *t)
{
    if (t && !eager_alive(t)) {
        dead_tensor("kiln_retain");
        return NULL;
    }
    if (t)
        atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

/* Drops one reference, freeing t with its last one. */
static void release(kiln_tensor *t)
{
    if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (t->storage)
        storage_release(t->storage);
    grad_forget(t);
    if (t->trace) {
        t->trace->forget(t->trace, t);
        eager_trace_release(t->trace);
    }
    atomic_fetch_sub_explicit(&live_tensors, 1, memory_order_relaxed);
    header_free(t);
}

static void scope_forget(kiln_tensor *t);

/* Whether t may be released: not NULL, and alive (else fn's error). */
static bool releasable(const kiln_tensor *t, const char *fn)
{
    if (t && !eager_alive(t))
        dead_tensor(fn);
    return t && eager_alive(t);
}

void kiln_release(kiln_tensor *t)
{
    if (!releasable(t, "kiln_release"))
        return;
    /* Every reference left but kiln's own is a scope's (kiln_cast to the
     * same dtype gave a scope a second one): the one released is a scope's,
     * released early. */
    if (atomic_load(&t->scoped) >= atomic_load(&t->refs) - atomic_load(&t->held))
        scope_forget(t);
    release(t);
}

kiln_tensor *eager_hold(kiln_tensor *t)
{
    if (!kiln_retain(t))
        return NULL;
    atomic_fetch_add_explicit(&t->held, 1, memory_order_relaxed);
    return t;
}

void eager_unhold(kiln_tensor *t)
{
    if (!releasable(t, "kiln_release"))
        return;
    atomic_fetch_sub_explicit(&t->held, 1, memory_order_relaxed);
    release(t);
}

int64_t kiln_live_tensors(void)
{
    return atomic_load(&live_tensors);
}

int64_t kiln_live_bytes(void)
{
    return atomic_load(&live_bytes);
}

int64_t kiln_peak_live_bytes(void)
{
    return atomic_load(&peak_bytes);
}

void kiln_reset_peak_live_bytes(void)
{
    atomic_store(&peak_bytes, atomic_load(&live_bytes));
}

bool eager_is_contiguous(const kiln_tensor *t)
{
    if (t->numel == 0)
        return true;
    int64_t step = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != step)
            return false;
        step *= t->shape[i];
    }
    return true;
}

/* -- Scopes ---------------------------------------------------------------- */

typedef struct {
    kiln_tensor **items;
    int count, cap;
} scope;

/* This thread's open scopes; freed with the thread by a key destructor. */
typedef struct {
    scope *levels;
    int depth, cap;
} scope_stack;

static _Thread_local scope_stack *stack;
/* Scopes that kiln_scope_begin could not open: their ends must not close
 * the scope around them. */
static _Thread_local int failed_begins;
static pthread_key_t stack_key;
static pthread_once_t stack_key_once = PTHREAD_ONCE_INIT;

/* Empties slot i of sc; its tensor stays referenced by whoever takes it. */
static kiln_tensor *scope_take(scope *sc, int i)
{
    kiln_tensor *t = sc->items[i];
    sc->items[i] = NULL;
    if (t)
        atomic_fetch_sub_explicit(&t->scoped, 1, memory_order_relaxed);
    return t;
}

/* Releases what sc holds, newest first. */
static void scope_release_all(scope *sc)
{
    for (int i = sc->count - 1; i >= 0; i--) {
        kiln_tensor *t = scope_take(sc, i);
        if (t && eager_alive(t))
            release(t);
        else if (t)
            dead_tensor("kiln_scope_end");
    }
    sc->count = 0;
}

/* At thread exit: releases what scopes left open still own, then the stack. */
static void stack_free(void *p)
{
    scope_stack *s = p;
    for (int d = s->depth - 1; d >= 0; d--)
        scope_release_all(&s->levels[d]);
    for (int i = 0; i < s->cap; i++)
        free(s->levels[i].items);
    free(s->levels);
    free(s);
}

static void stack_key_create(void)
{
    pthread_key_create(&stack_key, stack_free);
}

static scope_stack *stack_get(void)
{
    if (stack)
        return stack;
    pthread_once(&stack_key_once, stack_key_create);
    stack = calloc(1, sizeof *stack);
    if (stack)
        pthread_setspecific(stack_key, stack);
    return stack;
}

static bool scope_push(scope *sc, kiln_tensor *t)
{
    if (sc->count == sc->cap) {
        int cap = sc->cap ? 2 * sc->cap : 64;
        kiln_tensor **items = realloc(sc->items, (size_t)cap * sizeof *items);
        if (!items)
            return false;
        sc->items = items;
        sc->cap = cap;
    }
    sc->items[sc->count++] = t;
    atomic_fetch_add_explicit(&t->scoped, 1, memory_order_relaxed);
    return true;
}

kiln_tensor *tensor_own(kiln_tensor *t)
{
    if (!t)
        return NULL;
    core_succeeded(); /* every op's result comes through here */
    if (!stack || stack->depth == 0)
        return t;
    scope *sc = &stack->levels[stack->depth - 1];
    if (!scope_push(sc, t)) {
        kiln_release(t);
        core_fail(CORE_NOMEM, "kiln_scope_begin", "out of memory recording a tensor in a scope");
        return NULL;
    }
    return t;
}

void kiln_scope_begin(void)
{
    scope_stack *s = stack_get();
    if (!s) {
        failed_begins++;
        core_fail_status(CORE_NOMEM, "kiln_scope_begin");
        return;
    }
    if (s->depth == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        scope *levels = realloc(s->levels, (size_t)cap * sizeof *levels);
        if (!levels) {
            failed_begins++;
            core_fail_status(CORE_NOMEM, "kiln_scope_begin");
            return;
        }
        memset(levels + s->cap, 0, (size_t)(cap - s->cap) * sizeof *levels);
        s->levels = levels;
        s->cap = cap;
    }
    s->levels[s->depth++].count = 0;
}

void kiln_scope_end(void)
{
    if (failed_begins > 0) {
        failed_begins--;
        return;
    }
    if (!stack || stack->depth == 0) {
        core_fail(CORE_STATE, "kiln_scope_end", "no scope is open");
        return;
    }
    scope_release_all(&stack->levels[--stack->depth]);
}

/* Finds t among the innermost scope's references, newest first: the tensor
 * kept or disowned is nearly always the one made last. (Tensors carry no
 * slot of their own: one tensor may sit in the scopes of several threads.) */
static int scope_find(const scope *sc, const kiln_tensor *t)
{
    for (int i = sc->count - 1; i >= 0; i--)
        if (sc->items[i] == t)
            return i;
    return -1;
}

kiln_tensor *eager_own(kiln_tensor *t)
{
    return tensor_own(t);
}

void eager_disown(kiln_tensor *t)
{
    if (!t || !stack || stack->depth == 0)
        return;
    scope *sc = &stack->levels[stack->depth - 1];
    int slot = scope_find(sc, t);
    if (slot >= 0)
        scope_take(sc, slot);
}

/* Takes t out of the innermost of this thread's scopes that holds it. */
static void scope_forget(kiln_tensor *t)
{
    for (int d = stack ? stack->depth - 1 : -1; d >= 0; d--) {
        int slot = scope_find(&stack->levels[d], t);
        if (slot >= 0) {
            scope_take(&stack->levels[d], slot);
            return;
        }
    }
}

kiln_tensor *kiln_keep(kiln_tensor *t)
{
    if (!t || !stack || stack->depth == 0)
        return t;
    scope *sc = &stack->levels[stack->depth - 1];
    int slot = scope_find(sc, t);
    if (slot < 0)
        return t;
    scope_take(sc, slot);
    if (stack->depth >= 2 && !scope_push(&stack->levels[stack->depth - 2], t))
        core_fail(CORE_NOMEM, "kiln_keep", "out of memory: the tensor now belongs to the caller");
    return t;
}

/* -- Checks and accessors -------------------------------------------------- */

int check_dtype(const char *fn, kiln_dtype dt)
{
    if ((unsigned)dt > KILN_BOOL)
        return core_fail(CORE_DTYPE, fn, "dtype %d is not a kiln_dtype", (int)dt);
    return 0;
}

int check_shape(const char *fn, int ndim, const int64_t *shape, int64_t *numel)
{
    if (ndim < 0 || ndim > KILN_MAX_DIMS)
        return core_fail(CORE_SHAPE, fn, "ndim %d is outside 0..%d", ndim, KILN_MAX_DIMS);
    if (ndim > 0 && !shape)
        return core_fail_null_arg(fn, "shape");
    if (ir_shape_numel(ndim, shape, numel))
        return 0;
    char buf[CORE_SHAPE_STR_MAX];
    core_shape_str(buf, ndim, shape);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return core_fail(CORE_SHAPE, fn, "shape %s has a negative size", buf);
    return core_fail(CORE_SHAPE, fn, "shape %s has too many elements (more than 2^59)", buf);
}

int check_axis(const char *fn, int axis, const kiln_tensor *t, int extra, int *resolved)
{
    char d[DESCRIBE_MAX];
    int ndim = t->ndim + extra;
    if (axis == KILN_ALL)
        return core_fail(CORE_AXIS, fn, "axis KILN_ALL is not accepted here (operand %s)",
                         describe(d, t));
    if (eager_is_axes(axis))
        return core_fail(CORE_AXIS, fn, "a set of axes (KILN_AXES) is not accepted here (operand %s)",
                         describe(d, t));
    if (axis < -ndim || axis >= ndim)
        return core_fail(CORE_AXIS, fn, "axis %d is out of range for %s", axis, describe(d, t));
    *resolved = axis < 0 ? axis + ndim : axis;
    return 0;
}

char *describe(char buf[DESCRIBE_MAX], const kiln_tensor *t)
{
    core_shape_str(buf, t->ndim, t->shape);
    strcat(buf, " ");
    strcat(buf, kiln_dtype_name(t->dtype));
    return buf;
}

size_t kiln_dtype_size(kiln_dtype dt)
{
    return (unsigned)dt > KILN_BOOL ? 0 : eager_dtype_size(dt);
}

const char *kiln_dtype_name(kiln_dtype dt)
{
    return (unsigned)dt > KILN_BOOL ? "?" : ir_dtype_names[dt];
}

int kiln_ndim(const kiln_tensor *t)
{
    return t ? t->ndim : -1;
}

const int64_t *kiln_shape(const kiln_tensor *t)
{
    eager_note_shape_read(t);
    return t ? t->shape : NULL;
}

const int64_t *kiln_strides(const kiln_tensor *t)
{
    eager_note_shape_read(t);
    return t ? t->strides : NULL;
}

int64_t kiln_numel(const kiln_tensor *t)
{
    eager_note_shape_read(t);
    return t ? t->numel : -1;
}

kiln_dtype kiln_dtype_of(const kiln_tensor *t)
{
    return t ? t->dtype : KILN_F32;
}

kiln_device kiln_device_of(const kiln_tensor *t)
{
    return t ? t->device : KILN_CPU;
}

bool kiln_shares_storage(const kiln_tensor *a, const kiln_tensor *b)
{
    return a && b && a->storage && a->storage == b->storage;
}
