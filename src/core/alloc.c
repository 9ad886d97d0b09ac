/* Tensor memory: aligned blocks, with freed large blocks kept in a bounded cache.
 *
 * A fresh mapping costs a page fault per 4 KiB on first touch: for eager ops
 * that is as slow as the op itself. glibc maps blocks above its mmap threshold
 * afresh each time, and hands the top of its heap back when a scope frees a
 * batch of medium blocks, so kiln maps blocks of 64 KiB and more itself and
 * keeps freed ones (up to KILN_CPU_CACHE_BYTES, default 1 GiB) to hand out
 * again for the same rounded size, as PyTorch's CUDA caching allocator does
 * for device memory. A full cache unmaps its least recently freed blocks to
 * keep a new one: blocks of sizes a program no longer uses must not crowd
 * out the ones it does.
 *
 * Small blocks (tensor headers, the storage of small tensors) are made and
 * dropped by every op and every traced call: a short per-thread list per
 * 64-byte class keeps the last few freed, so that most are a pop and a push
 * rather than a trip through malloc and free (a third of the instructions of
 * a traced call on 64 floats). Those blocks are allocated at their class's
 * full size, so that any request of the class fits, and 64-byte aligned, so
 * that the vectors of a small tensor's data never straddle cache lines. A thread's lists are freed
 * when it exits, the main thread's when the library unloads.
 *
 * With KILN_CPU_CACHE_BYTES=0, and in AddressSanitizer builds, every block
 * comes from malloc and goes back to free, so that memory checkers see them. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"

enum {
    ALIGN = 64,
    SMALL_BLOCK = 1024,
    LARGE_BLOCK = 64 << 10,
    SMALL_GRAIN = 64 << 10, /* large blocks round up to it below a huge page */
    HUGE_PAGE = 2 << 20,    /* and to a multiple of it above */
    CACHE_SLOTS = 256,
    CLASS_BYTES = 64,
    CLASSES = SMALL_BLOCK / CLASS_BYTES,
    CLASS_DEPTH = 32,
};

static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    void *ptr[CACHE_SLOTS];  /* oldest first */
    size_t size[CACHE_SLOTS];
    int count;
    size_t bytes;
    int64_t limit;
    bool enabled; /* large blocks are mapped and cached */
} cache = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static pthread_key_t thread_exit; /* its destructor frees the thread's small blocks */

typedef struct small_block {
    struct small_block *next;
} small_block;

static _Thread_local struct {
    small_block *head[CLASSES];
    uint8_t count[CLASSES];
    bool registered; /* with thread_exit */
} small;

static atomic_bool unloading; /* the main thread's lists are gone: small blocks go back to free */

static void small_flush(void *unused)
{
    (void)unused;
    for (int c = 0; c < CLASSES; c++) {
        while (small.head[c]) {
            small_block *b = small.head[c];
            small.head[c] = b->next;
            free(b);
        }
        small.count[c] = 0;
    }
    small.registered = false;
}

__attribute__((destructor)) static void small_flush_at_exit(void)
{
    atomic_store(&unloading, true);
    small_flush(NULL);
}

static int small_class(size_t bytes)
{
    return bytes ? (int)((bytes - 1) / CLASS_BYTES) : 0;
}

static void *small_alloc(size_t bytes)
{
    int c = small_class(bytes);
    small_block *b = small.head[c];
    if (!b) /* aligned as large blocks are: a small tensor's vectors then never straddle cache lines */
        return aligned_alloc(ALIGN, (size_t)(c + 1) * CLASS_BYTES);
    small.head[c] = b->next;
    small.count[c]--;
    return b;
}

static void small_free(void *p, size_t bytes)
{
    int c = small_class(bytes);
    if (small.count[c] == CLASS_DEPTH || atomic_load_explicit(&unloading, memory_order_relaxed)) {
        free(p);
        return;
    }
    if (!small.registered) {
        if (pthread_setspecific(thread_exit, &small) != 0) {
            free(p);
            return;
        }
        small.registered = true;
    }
    small_block *b = p;
    b->next = small.head[c];
    small.head[c] = b;
    small.count[c]++;
}

static void cache_configure(void)
{
    cache.limit = core_env_int("KILN_CPU_CACHE_BYTES", (int64_t)1 << 30);
#if defined(__SANITIZE_ADDRESS__)
    cache.enabled = false;
#else
    cache.enabled = cache.limit > 0;
#endif
    if (cache.enabled && pthread_key_create(&thread_exit, small_flush) != 0)
        cache.enabled = false;
}

static _Atomic int64_t allocations_left = -1;

void core_alloc_fail_after(int64_t n)
{
    atomic_store(&allocations_left, n);
}

/* Counts an allocation down to the injected failure in one step: two
 * threads that both saw one left would both count it, and the failure due
 * would never come. */
static bool injected_failure(void)
{
    int64_t left = atomic_load_explicit(&allocations_left, memory_order_relaxed);
    while (left > 0 && !atomic_compare_exchange_weak(&allocations_left, &left, left - 1))
        ;
    return left == 0;
}

static size_t large_size(size_t bytes)
{
    size_t grain = bytes < HUGE_PAGE ? SMALL_GRAIN : HUGE_PAGE;
    return (bytes + grain - 1) / grain * grain;
}

/* Takes entry i out of the cache, under the lock, keeping the order. */
static void *cache_remove(int i)
{
    void *p = cache.ptr[i];
    cache.bytes -= cache.size[i];
    cache.count--;
    memmove(&cache.ptr[i], &cache.ptr[i + 1], (size_t)(cache.count - i) * sizeof *cache.ptr);
    memmove(&cache.size[i], &cache.size[i + 1], (size_t)(cache.count - i) * sizeof *cache.size);
    return p;
}

/* The most recently freed block of size, or NULL. */
static void *cache_take(size_t size)
{
    void *p = NULL;
    pthread_mutex_lock(&cache.lock);
    for (int i = cache.count - 1; i >= 0 && !p; i--)
        if (cache.size[i] == size)
            p = cache_remove(i);
    pthread_mutex_unlock(&cache.lock);
    return p;
}

/* Keeps p, unmapping the oldest blocks it needs the room of; false when p
 * alone is larger than the cache. */
static bool cache_put(void *p, size_t size)
{
    if ((int64_t)size > cache.limit)
        return false;
    void *evicted[CACHE_SLOTS];
    size_t evicted_size[CACHE_SLOTS];
    int n_evicted = 0;
    pthread_mutex_lock(&cache.lock);
    while (cache.count == CACHE_SLOTS || (int64_t)(cache.bytes + size) > cache.limit) {
        evicted_size[n_evicted] = cache.size[0];
        evicted[n_evicted++] = cache_remove(0);
    }
    cache.ptr[cache.count] = p;
    cache.size[cache.count] = size;
    cache.count++;
    cache.bytes += size;
    pthread_mutex_unlock(&cache.lock);
    for (int i = 0; i < n_evicted; i++)
        munmap(evicted[i], evicted_size[i]);
    return true;
}

void *core_alloc(size_t bytes)
{
    if (injected_failure())
        return NULL;
    /* malloc's per-thread cache makes small blocks cheap; aligned_alloc
     * bypasses it, so only blocks worth aligning pay for it. */
    pthread_once(&cache.once, cache_configure);
    if (bytes <= SMALL_BLOCK)
        return cache.enabled ? small_alloc(bytes) : malloc(bytes ? bytes : 1);
    if (bytes < LARGE_BLOCK || !cache.enabled)
        return aligned_alloc(ALIGN, (bytes + ALIGN - 1) / ALIGN * ALIGN);
    size_t size = large_size(bytes);
    void *p = cache_take(size);
    if (p)
        return p;
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (size >= HUGE_PAGE)
        madvise(p, size, MADV_HUGEPAGE);
    return p;
}

int64_t core_alloc_cache_limit(void)
{
    pthread_once(&cache.once, cache_configure);
    return cache.enabled ? cache.limit : 0;
}

int64_t core_alloc_cached_bytes(void)
{
    pthread_mutex_lock(&cache.lock);
    int64_t bytes = (int64_t)cache.bytes;
    pthread_mutex_unlock(&cache.lock);
    return bytes;
}

int core_alloc_small_kept(size_t bytes)
{
    return small.count[small_class(bytes)];
}

void core_free(void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes <= SMALL_BLOCK && cache.enabled) {
        small_free(p, bytes);
        return;
    }
    if (bytes < LARGE_BLOCK || !cache.enabled) {
        free(p);
        return;
    }
    size_t size = large_size(bytes);
    if (!cache_put(p, size))
        munmap(p, size);
}
