/* The monotonic clock kiln times its own work with (compiles, logs). */
#include <time.h>

#include "core/core.h"

double core_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
