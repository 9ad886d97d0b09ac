/* The clock and the statistics kiln-bench's parts share. */
#ifndef KILN_BENCH_TIMING_H
#define KILN_BENCH_TIMING_H

#include <math.h>
#include <stdlib.h>
#include <time.h>

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v (n values), sorting v. */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The q-quantile of v (n values; the smallest value at or above that
 * fraction), sorting v. */
static inline double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    int at = (int)ceil(q * n) - 1;
    return v[at < 0 ? 0 : at >= n ? n - 1 : at];
}

#endif
