/* A growing string: the printers of graphs and kernels, generated CUDA C. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"

void strbuf_put(strbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->data && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
}

char *strbuf_finish(strbuf *b)
{
    if (b->failed || !b->data) {
        free(b->data);
        return NULL;
    }
    return b->data;
}
