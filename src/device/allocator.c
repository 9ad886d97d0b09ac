/* Device memory through a caching allocator, as PyTorch's: cuMemAlloc and
 * cuMemFree synchronise the device and cost tens of microseconds, so a freed
 * block is kept and handed to a later request it fits.
 *
 * Sizes are rounded (512 bytes below 1 MiB, 1 MiB above) so that requests
 * for nearly equal sizes share blocks; a request takes the smallest cached
 * block at least its size and at most twice it. Reuse needs no wait: all
 * work goes into one stream (driver.c), so whatever a later kernel writes into
 * a reused block comes after every earlier use of it. The cache is bounded
 * (KILN_CUDA_CACHE_MAX_BYTES, default 4 GiB): a block that would pass the
 * bound goes back to the driver. When the device is out of memory, the cache
 * is emptied and the request tried again. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"
#include "device/internal.h"

enum { SMALL = 1 << 20, SMALL_ROUND = 512, LARGE_ROUND = 1 << 20 };
#define DEFAULT_MAX_CACHED (4LL << 30)

typedef struct block {
    void *at;
    size_t bytes;
    struct block *next;
} block;

static struct {
    pthread_mutex_t lock;
    block *cached; /* ascending by size */
    kiln_cuda_memory stats;
    int64_t max_cached;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .max_cached = -1};

static size_t rounded(size_t bytes)
{
    size_t step = bytes < SMALL ? SMALL_ROUND : LARGE_ROUND;
    if (bytes == 0)
        return SMALL_ROUND;
    return (bytes + step - 1) / step * step;
}

/* Under the lock: the best cached block for bytes, taken off the list. */
static block *take_cached(size_t bytes)
{
    for (block **at = &pool.cached; *at; at = &(*at)->next) {
        if ((*at)->bytes < bytes)
            continue;
        if ((*at)->bytes > 2 * bytes)
            return NULL;
        block *b = *at;
        *at = b->next;
        return b;
    }
    return NULL;
}

/* Under the lock: every cached block back to the driver, once the work
 * queued before (which may still use them) is done. */
static void release_cached(void)
{
    char ignored[512];
    if (pool.cached)
        device_synchronize(ignored, sizeof ignored);
    while (pool.cached) {
        block *b = pool.cached;
        pool.cached = b->next;
        driver_free(b->at);
        pool.stats.cached_bytes -= (int64_t)b->bytes;
        pool.stats.device_frees++;
        free(b);
    }
}

static void count_in_use(int64_t bytes)
{
    pool.stats.in_use_bytes += bytes;
    if (pool.stats.in_use_bytes > pool.stats.peak_in_use_bytes)
        pool.stats.peak_in_use_bytes = pool.stats.in_use_bytes;
}

void *device_alloc(size_t bytes, size_t *granted, char *err, size_t err_size)
{
    if (device_start(err, err_size) < 0)
        return NULL;
    size_t size = rounded(bytes);
    void *at = NULL;
    pthread_mutex_lock(&pool.lock);
    block *b = take_cached(size);
    if (b) {
        at = b->at;
        size = b->bytes;
        pool.stats.cached_bytes -= (int64_t)size;
        pool.stats.reuses++;
        free(b);
    } else {
        bool out_of_memory = false;
        int status = driver_alloc(&at, size, &out_of_memory, err, err_size);
        if (status < 0 && out_of_memory && pool.cached) {
            release_cached();
            status = driver_alloc(&at, size, &out_of_memory, err, err_size);
        }
        if (status == 0)
            pool.stats.device_allocs++;
        else
            at = NULL;
    }
    if (at)
        count_in_use((int64_t)size);
    pthread_mutex_unlock(&pool.lock);
    *granted = at ? size : 0;
    return at;
}

static int64_t max_cached(void)
{
    if (pool.max_cached < 0)
        pool.max_cached = core_env_int("KILN_CUDA_CACHE_MAX_BYTES", DEFAULT_MAX_CACHED);
    return pool.max_cached;
}

void device_free(void *at, size_t granted)
{
    if (!at)
        return;
    pthread_mutex_lock(&pool.lock);
    pool.stats.in_use_bytes -= (int64_t)granted;
    block *b = NULL;
    if (pool.stats.cached_bytes + (int64_t)granted <= max_cached())
        b = malloc(sizeof *b);
    if (!b) {
        driver_free(at);
        pool.stats.device_frees++;
        pthread_mutex_unlock(&pool.lock);
        return;
    }
    *b = (block){at, granted, NULL};
    block **pos = &pool.cached;
    while (*pos && (*pos)->bytes < granted)
        pos = &(*pos)->next;
    b->next = *pos;
    *pos = b;
    pool.stats.cached_bytes += (int64_t)granted;
    pthread_mutex_unlock(&pool.lock);
}

void device_empty_cache(void)
{
    pthread_mutex_lock(&pool.lock);
    release_cached();
    pthread_mutex_unlock(&pool.lock);
}

kiln_cuda_memory device_memory(void)
{
    pthread_mutex_lock(&pool.lock);
    kiln_cuda_memory stats = pool.stats;
    pthread_mutex_unlock(&pool.lock);
    return stats;
}
