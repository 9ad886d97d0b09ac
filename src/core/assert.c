/* Broken internal invariants: reported with file and line, then abort. Apart
 * from error.c, so that a module's tests linking core statically beside
 * libkiln do not take a second copy of kiln's error state with it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"

_Noreturn void core_assert_failed(const char *file, int line, const char *cond)
{
    fprintf(stderr, "kiln: internal error at %s:%d: %s\n", file, line, cond);
    abort();
}

_Noreturn void core_internal_report(const char *file, int line, const char *fn, const char *fmt, ...)
{
    fprintf(stderr, "kiln: internal error at %s:%d in %s: ", file, line, fn);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
