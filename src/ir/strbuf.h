/* A growing string for the printers of src/ir (graph text, dot, kernel text). */
#ifndef KILN_IR_STRBUF_H
#define KILN_IR_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *data;
    size_t len, cap;
    bool failed; /* out of memory: later puts do nothing */
} strbuf;

/* Appends printf-style text. */
void strbuf_put(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text (malloc'd, the caller frees it), or NULL if memory ran out. */
char *strbuf_finish(strbuf *b);

#endif
