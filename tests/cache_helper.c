/* A program the cache tests run as a separate process: it runs standard
 * workloads traced (LLVM backend, the disk cache as the environment sets it),
 * checks each against eager, and prints one line per workload:
 *
 *   <name> compiles=<n> disk_hits=<n> compiled=<n> from_disk=<n> shared=<n> hash=<fnv of the output>
 *
 * Tolerance: |traced - eager| <= 1e-4 * |eager| + 1e-4, as test_llvm's
 * workloads. Exit 0 when every workload ran and matched; 1 otherwise, with
 * kiln's error on stderr.
 *
 *   cache_helper [--precompile TARGET] [WORKLOAD...]   (default: gelu to tiny)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/workloads.h"

static uint64_t fnv1a(const void *bytes, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)bytes)[i]) * 1099511628211ull;
    return h;
}

/* Whether got matches want within the tolerance; *hash gets got's bytes' hash. */
static bool matches(kiln_tensor *got, kiln_tensor *want, uint64_t *hash)
{
    int64_t n = kiln_numel(want);
    float *a = malloc((size_t)n * sizeof *a + 1), *b = malloc((size_t)n * sizeof *b + 1);
    bool ok = a && b && kiln_numel(got) == n && kiln_copy_to_host(got, a, (size_t)n * sizeof *a) == 0 &&
              kiln_copy_to_host(want, b, (size_t)n * sizeof *b) == 0;
    for (int64_t i = 0; ok && i < n; i++)
        ok = fabsf(a[i] - b[i]) <= 1e-4f * fabsf(b[i]) + 1e-4f || (isnan(a[i]) && isnan(b[i]));
    if (ok)
        *hash = fnv1a(a, (size_t)n * sizeof *a);
    free(a);
    free(b);
    return ok;
}

static bool run(const workload *w, const char *precompile)
{
    kiln_tensor *in[WORKLOAD_MAX_INPUTS] = {NULL}, *got = NULL, *want[2] = {NULL};
    workload_state state = {0};
    if (w->setup(WORKLOAD_QUICK, in, &state) < 0)
        return false;
    kiln_fn *f = kiln_jit(w->name, w->body, w->n_in, 1, &state, NULL);
    bool ok = f != NULL;
    uint64_t hash = 0;
    if (ok && precompile) {
        kiln_spec specs[WORKLOAD_MAX_INPUTS];
        for (int i = 0; i < w->n_in; i++)
            specs[i] = kiln_spec_of(in[i]);
        ok = kiln_fn_precompile(f, specs, precompile) == 0;
    } else if (ok) {
        ok = kiln_call(f, in, &got) == 0;
        kiln_scope_begin();
        ok = ok && w->body(in, want, &state) == 0 && matches(got, want[0], &hash);
        kiln_scope_end();
    }
    kiln_fn_stats_t s = {0};
    if (f)
        kiln_fn_stats(f, &s);
    if (ok)
        printf("%s compiles=%lld disk_hits=%lld compiled=%lld from_disk=%lld shared=%lld hash=%016llx\n", w->name,
               (long long)s.compiles, (long long)s.disk_hits, (long long)s.kernels_compiled,
               (long long)s.kernels_from_disk, (long long)s.kernels_shared, (unsigned long long)hash);
    else
        fprintf(stderr, "cache_helper: %s failed: %s\n", w->name, kiln_last_error());
    kiln_release(got);
    kiln_fn_free(f);
    workload_free(w, in, &state);
    return ok;
}

int main(int argc, char **argv)
{
    const char *precompile = NULL;
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--precompile")) {
        precompile = argv[2];
        first = 3;
    }
    bool ok = true;
    for (int i = 0; i < workload_kernels_count && first == argc; i++)
        ok = run(&workloads[i], precompile) && ok;
    for (int i = first; i < argc; i++) {
        const workload *w = workload_find(argv[i]);
        if (!w)
            fprintf(stderr, "cache_helper: no workload %s\n", argv[i]);
        ok = w && run(w, precompile) && ok;
    }
    fflush(stdout);
    return ok ? 0 : 1;
}
