/* One-line marking: the marked functions that KILN_COMPILE keeps, freed at exit. */
#include <pthread.h>

#include "trace/trace.h"

/* Every slot filled so far, emptied at exit. */
typedef struct marked {
    kiln_fn **slot;
    struct marked *next;
} marked;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static marked *filled;
static bool freed_at_exit;

/* Registered by the first KILN_COMPILE to run: a program that checks for
 * leaks at exit, or runs under valgrind, finds nothing of them alive. */
static void free_marked(void)
{
    pthread_mutex_lock(&lock);
    while (filled) {
        marked *m = filled;
        filled = m->next;
        kiln_fn_free(*m->slot);
        __atomic_store_n(m->slot, NULL, __ATOMIC_RELEASE);
        free(m);
    }
    pthread_mutex_unlock(&lock);
}

/* Makes the marked function for *slot under the lock. */
static kiln_fn *fill(kiln_fn **slot, const char *name, kiln_body body, int n_in)
{
    marked *m = malloc(sizeof *m);
    if (!m) {
        core_fail(CORE_NOMEM, "kiln_jit_slot", "out of memory marking '%s'", name ? name : "?");
        return NULL;
    }
    kiln_fn *f = kiln_jit(name, body, n_in, 1, NULL, NULL);
    if (!f || (!freed_at_exit && atexit(free_marked) != 0)) {
        if (f)
            core_fail(CORE_NOMEM, "kiln_jit_slot", "cannot register '%s' to be freed at exit", name ? name : "?");
        kiln_fn_free(f);
        free(m);
        return NULL;
    }
    freed_at_exit = true;
    *m = (marked){slot, filled};
    filled = m;
    __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    return f;
}

kiln_fn *kiln_jit_slot(kiln_fn **slot, const char *name, kiln_body body, int n_in)
{
    if (!slot || !body) {
        core_fail_null_arg("kiln_jit_slot", !slot ? "slot" : "body");
        return NULL;
    }
    kiln_fn *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (f)
        return f;
    pthread_mutex_lock(&lock);
    f = *slot ? *slot : fill(slot, name, body, n_in);
    pthread_mutex_unlock(&lock);
    return f;
}
