/* The compile-or-load service (src/kernels), linked statically so that its
 * test hooks are the ones kiln_call uses: eviction on a budget, and one
 * compile of a kernel that several threads ask for at once. */
#include "test_common.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/kernels.h"

enum { PLANTED = 20000, PLANTED_BYTES = 100, STORED = 20 };

static double factor_of(void *user)
{
    return (double)(intptr_t)user;
}

/* x * k for the k in user: a kernel of its own for each k. */
static int scale(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_mul_scalar(in[0], factor_of(user));
    return out[0] ? 0 : -1;
}

/* Entries in dir, and their bytes. */
static int64_t count_entries(const char *dir, int64_t *bytes)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int64_t n = 0;
    *bytes = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".kiln"))
            continue;
        char path[1400];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ck_assert_int_eq(stat(path, &st), 0);
        *bytes += st.st_size;
        n++;
    }
    closedir(d);
    return n;
}

/* Writes n entry-named files of PLANTED_BYTES each into dir. */
static void plant(const char *dir, int n)
{
    char filler[PLANTED_BYTES];
    memset(filler, 'k', sizeof filler);
    for (int i = 0; i < n; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%064x.kiln", dir, i);
        FILE *out = fopen(path, "wb");
        ck_assert_ptr_nonnull(out);
        ck_assert_int_eq(fwrite(filler, 1, sizeof filler, out), sizeof filler);
        fclose(out);
    }
}

/* Compiles one scale kernel per factor in [first, first + n) into the cache. */
static void store_kernels(int first, int n)
{
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){8}), *out;
    for (int k = first; k < first + n; k++) {
        kiln_fn *f = kiln_jit("scale", scale, 1, 1, (void *)(intptr_t)k, NULL);
        ck_assert_msg(kiln_call(f, &x, &out) == 0, "%s", kiln_last_error());
        kiln_fn_stats_t s;
        kiln_fn_stats(f, &s);
        ck_assert_int_eq(s.kernels_compiled, 1);
        kiln_release(out);
        kiln_fn_free(f);
    }
    kiln_release(x);
}

/* A cache of 20,000 entries: storing 20 kernels lists it once, not 20
 * times; a store that passes the cap lists it again and trims it. */
START_TEST(test_eviction_lists_the_directory_on_a_budget)
{
    char root[] = "/tmp/kiln-kernels-XXXXXX", dir[1100];
    ck_assert_ptr_nonnull(mkdtemp(root));
    snprintf(dir, sizeof dir, "%s/1", root);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    plant(dir, PLANTED);
    setenv("KILN_CACHE", "on", 1);
    setenv("KILN_CACHE_DIR", root, 1);
    setenv("KILN_CACHE_MAX_BYTES", "1000000000", 1);
    int64_t scans = kernels_eviction_scans(), bytes;
    store_kernels(2, STORED); /* x * 1 is x: no kernel */
    ck_assert_int_eq(count_entries(dir, &bytes), PLANTED + STORED);
    ck_assert_int_le(kernels_eviction_scans() - scans, 1);

    int64_t cap = bytes - 10 * PLANTED_BYTES; /* the next store passes it */
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)cap);
    setenv("KILN_CACHE_MAX_BYTES", text, 1);
    scans = kernels_eviction_scans();
    store_kernels(STORED + 2, 1);
    ck_assert_int_eq(kernels_eviction_scans() - scans, 1);
    ck_assert_int_le(count_entries(dir, &bytes), PLANTED + STORED);
    ck_assert_int_le(bytes, cap / 8 * 7);
    unsetenv("KILN_CACHE_MAX_BYTES");
    setenv("KILN_CACHE", "off", 1);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

typedef struct {
    pthread_barrier_t *start;
    int64_t compiled, shared;
} asker;

static void *ask(void *arg)
{
    asker *a = arg;
    kiln_tensor *x = kiln_ones(KILN_F32, 1, (int64_t[]){1000}), *out = NULL;
    kiln_fn *f = kiln_jit("scale", scale, 1, 1, (void *)(intptr_t)7, NULL);
    pthread_barrier_wait(a->start);
    if (kiln_call(f, &x, &out) == 0) {
        kiln_fn_stats_t s;
        kiln_fn_stats(f, &s);
        a->compiled = s.kernels_compiled;
        a->shared = s.kernels_shared;
    }
    pthread_barrier_wait(a->start); /* no kernel unloads before every thread has it */
    kiln_release(out);
    kiln_release(x);
    kiln_fn_free(f);
    return NULL;
}

/* Four functions needing one kernel at once: it is compiled once, and the
 * others wait for it (or find it made), while all four hold it. */
START_TEST(test_a_kernel_asked_for_at_once_compiles_once)
{
    enum { THREADS = 4 };
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    asker askers[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        askers[i] = (asker){&start, -1, -1};
        pthread_create(&threads[i], NULL, ask, &askers[i]);
    }
    int64_t compiled = 0, shared = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        ck_assert_int_ge(askers[i].compiled, 0);
        compiled += askers[i].compiled;
        shared += askers[i].shared;
    }
    pthread_barrier_destroy(&start);
    ck_assert_int_eq(compiled, 1);
    ck_assert_int_eq(shared, THREADS - 1);
}
END_TEST

static Suite *kernels_suite(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_eviction_lists_the_directory_on_a_budget);
    tcase_add_test(tc, test_a_kernel_asked_for_at_once_compiles_once);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(kernels_suite)
