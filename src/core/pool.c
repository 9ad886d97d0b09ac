/* A fixed pool of worker threads for data-parallel loops.
 *
 * One job at a time: the caller publishes (fn, ctx, chunks), wakes the workers
 * and works on chunks itself; chunks are claimed from an atomic word that
 * holds the job's number beside the next chunk, so a worker still looping
 * from the last job, however late it runs, can never take a chunk of the
 * next one as the last one's: a chunk claimed is the current job's, which
 * cannot end before it is done. A caller that finds the pool busy (another
 * user thread is running a job) runs its loop alone rather than waiting.
 *
 * A traced call runs its kernels as dozens of jobs a few microseconds apart.
 * Waking a sleeping thread costs a futex call each way, and on a virtual
 * machine an idle virtual CPU halts and takes tens of microseconds to come
 * back, so a worker watches for the next job, and the caller for the last
 * chunk, for KILN_SPIN_US (default SPIN_US) before sleeping on the
 * condition, as OpenMP's runtimes and OpenBLAS do; 0 sleeps at once, as
 * OMP_WAIT_POLICY=passive does, for programs that share their cores.
 *
 * Linux may wake a sleeping thread on its waker's CPU when it knows of no
 * cache that the two CPUs share (virtual CPUs that list none, as on many
 * VMs): a woken worker then queues behind its caller while another CPU
 * idles, and the whole job runs on one CPU (layer norm 8192x1024 at the
 * speed of one thread, job after job, once the worker's last CPU is the
 * caller's). So a worker that wakes on the caller's CPU moves itself to the
 * others, and a caller whose workers have not started after its first
 * chunk yields once, for a worker queued behind it to run and move. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/core.h"

enum { MAX_THREADS = 256 };

/* How long a thread watches before it sleeps: longer than the gaps between
 * a traced call's kernels, short enough that an idle program's threads
 * soon leave the CPUs to others. */
enum { SPIN_US = 200, MAX_SPIN_US = 1000000 };

static struct {
    pthread_once_t once;
    pthread_mutex_t busy;          /* held by the caller running a job */
    pthread_mutex_t lock;          /* guards generation, stop and the wait */
    pthread_cond_t wake, done;
    int threads;                   /* the caller included */
    double spin_ms;                /* how long a thread watches (KILN_SPIN_US) */
    pthread_t workers[MAX_THREADS];
    _Atomic uint64_t generation; /* written under lock; read unlocked while spinning */
    bool stop;
    int caller_cpu;                /* where the job's caller published it */
    core_range_fn fn;
    void *ctx;
    int64_t n, chunk_size;
    _Atomic uint64_t bound; /* the job's number << 32 | its chunk count */
    _Atomic uint64_t claim; /* the job's number << 32 | the next chunk to claim */
    _Atomic int64_t chunks_left;
    _Atomic int started; /* workers that have taken up the job */
} pool = {
    .once = PTHREAD_ONCE_INIT,
    .busy = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
};

enum { CHUNK_BITS = 32 };
static const uint64_t CHUNK_MASK = (UINT64_C(1) << CHUNK_BITS) - 1;

/* The chunks of the job that claim names not yet claimed; 0 where bound is
 * another job's (claim is a finished job's, or a job is being published). */
static int64_t unclaimed(uint64_t claim, uint64_t bound)
{
    if (claim >> CHUNK_BITS != bound >> CHUNK_BITS || (claim & CHUNK_MASK) >= (bound & CHUNK_MASK))
        return 0;
    return (int64_t)((bound & CHUNK_MASK) - (claim & CHUNK_MASK));
}

/* Claims the current job's next chunk, if any. A chunk claimed is the job's
 * and not yet run, so the job, its fields included, lasts until it is done. */
static bool claim_chunk(int64_t *chunk)
{
    uint64_t claim = atomic_load(&pool.claim);
    while (unclaimed(claim, atomic_load(&pool.bound)) > 0) {
        if (atomic_compare_exchange_weak(&pool.claim, &claim, claim + 1)) {
            *chunk = (int64_t)(claim & CHUNK_MASK);
            return true;
        }
    }
    return false;
}

/* Runs chunks until none is left; the caller, after its first, yields once
 * where no worker has started and at least two chunks remain. */
static void run_chunks(bool caller)
{
    int64_t c;
    for (bool first = caller; claim_chunk(&c); first = false) {
        int64_t begin = c * pool.chunk_size;
        int64_t end = begin + pool.chunk_size < pool.n ? begin + pool.chunk_size : pool.n;
        pool.fn(pool.ctx, begin, end);
        if (atomic_fetch_sub(&pool.chunks_left, 1) == 1) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
        if (first && atomic_load(&pool.started) == 0 &&
            unclaimed(atomic_load(&pool.claim), atomic_load(&pool.bound)) >= 2)
            sched_yield();
    }
}

/* Moves the calling worker off cpu, its caller's, to another it may use,
 * then gives it back the CPUs it had (it stays where it was moved): those
 * the program or its user last allowed it. */
static void leave_cpu(int cpu)
{
    cpu_set_t allowed;
    if (cpu < 0 || sched_getcpu() != cpu || sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
        CPU_COUNT(&allowed) < 2)
        return;
    cpu_set_t others = allowed;
    CPU_CLR(cpu, &others);
    if (sched_setaffinity(0, sizeof others, &others) == 0)
        sched_setaffinity(0, sizeof allowed, &allowed);
}

static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

static bool new_job(uint64_t seen)
{
    return atomic_load_explicit(&pool.generation, memory_order_acquire) != seen;
}

static bool job_done(uint64_t unused)
{
    (void)unused;
    return atomic_load(&pool.chunks_left) <= 0;
}

/* Watches ready(arg) for up to spin_ms, yielding the CPU every 64 looks
 * to any thread that waits for it: on a machine
 * shared with other work, a watching thread must not delay the one it
 * waits for. */
static void spin_until(bool (*ready)(uint64_t), uint64_t arg)
{
    if (pool.spin_ms <= 0)
        return;
    double until = core_now_ms() + pool.spin_ms;
    for (unsigned i = 1; !ready(arg); i++) {
        relax();
        if (i % 64)
            continue;
        if (core_now_ms() > until)
            return;
        sched_yield();
    }
}

static void *worker_main(void *arg)
{
    uint64_t seen = 0;
    for (;;) {
        spin_until(new_job, seen);
        pthread_mutex_lock(&pool.lock);
        while (pool.generation == seen && !pool.stop)
            pthread_cond_wait(&pool.wake, &pool.lock);
        bool stop = pool.stop;
        seen = pool.generation;
        int caller_cpu = pool.caller_cpu;
        pthread_mutex_unlock(&pool.lock);
        if (stop)
            return arg;
        atomic_fetch_add(&pool.started, 1);
        leave_cpu(caller_cpu);
        run_chunks(false);
    }
}

static void pool_start(void)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t want = core_env_int("KILN_THREADS", cores > 0 ? cores : 1);
    pool.threads = want < 1 ? 1 : want > MAX_THREADS ? MAX_THREADS : (int)want;
    int64_t spin_us = core_env_int("KILN_SPIN_US", SPIN_US);
    if (spin_us > MAX_SPIN_US)
        spin_us = MAX_SPIN_US;
    pool.spin_ms = spin_us > 0 ? spin_us / 1e3 : 0;
    for (int i = 1; i < pool.threads; i++) {
        if (pthread_create(&pool.workers[i], NULL, worker_main, NULL) != 0) {
            pool.threads = i;
            break;
        }
    }
}

__attribute__((destructor)) static void pool_stop(void)
{
    if (pool.threads <= 1)
        return;
    pthread_mutex_lock(&pool.lock);
    pool.stop = true;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    for (int i = 1; i < pool.threads; i++)
        pthread_join(pool.workers[i], NULL);
    pool.threads = 1;
}

int core_threads(void)
{
    pthread_once(&pool.once, pool_start);
    return pool.threads;
}

/* Publishes fn over [0, n) in chunks of chunk_size, claimed one at a time
 * by the caller and the workers, and waits for the last; the caller runs it
 * alone when another caller's job holds the pool. */
static void run_job(int64_t n, int64_t chunk_size, core_range_fn fn, void *ctx)
{
    if (pthread_mutex_trylock(&pool.busy) != 0) {
        fn(ctx, 0, n);
        return;
    }
    int64_t chunks = (n + chunk_size - 1) / chunk_size;
    /* The claim counts chunks in 32 bits: past that, larger ones (still a
     * whole number of the blocks asked for). */
    while ((uint64_t)chunks > CHUNK_MASK) {
        chunk_size *= 2;
        chunks = (n + chunk_size - 1) / chunk_size;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.chunk_size = chunk_size;
    uint64_t job = (atomic_load(&pool.generation) + 1) << CHUNK_BITS;
    atomic_store(&pool.chunks_left, chunks);
    atomic_store(&pool.started, 0);
    atomic_store(&pool.bound, job | (uint64_t)chunks);
    atomic_store(&pool.claim, job); /* last: opens the job to late workers */
    pthread_mutex_lock(&pool.lock);
    pool.caller_cpu = sched_getcpu();
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    run_chunks(true);
    spin_until(job_done, 0);
    pthread_mutex_lock(&pool.lock);
    while (atomic_load(&pool.chunks_left) > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.busy);
}

void core_parallel_for(int64_t n, int64_t grain, core_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int threads = core_threads();
    int64_t chunks = n / grain < threads ? n / grain : threads;
    if (chunks <= 1) {
        fn(ctx, 0, n);
        return;
    }
    run_job(n, (n + chunks - 1) / chunks, fn, ctx);
}

void core_parallel_blocks(int64_t n, int64_t block, core_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (block < 1)
        block = 1;
    if (n <= block || core_threads() == 1) {
        fn(ctx, 0, n);
        return;
    }
    run_job(n, block, fn, ctx);
}
