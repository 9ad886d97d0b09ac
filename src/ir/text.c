/* The canonical text of a graph, its parser, and Graphviz output.
 *
 *   kiln-graph 1
 *   %0 = input 0 : f32[4,8]
 *   %1 = const 0.5 : f64[]
 *   %2 = mul %0 %1 : f32[4,8]
 *   %3 = sum %2 axis=1 keepdim=0 : f32[4]
 *   %4 = input 1 : f32[s0,2*s0]
 *   output %3
 *   writeback 0 %2
 *
 * A symbolic size prints as its polynomial in the symbols s0..s7.
 * Printing is deterministic (the cache hashes it) and parsing what was printed
 * gives a graph that prints the same text again. Constants print with 17
 * significant digits, which strtod reads back exactly. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "ir/internal.h"

/* -- Printing -------------------------------------------------------------- */

static void put_type(strbuf *t, const ir_graph *g, const ir_node *n)
{
    strbuf_put(t, "%s[", ir_dtype_names[n->dtype]);
    for (int d = 0; d < n->ndim; d++) {
        strbuf_put(t, d ? "," : "");
        ir_size_put(t, &g->sizes, n->shape[d]);
    }
    strbuf_put(t, "]");
}

static void put_axis(strbuf *t, int axis)
{
    if (axis == KILN_ALL)
        strbuf_put(t, " axis=all");
    else
        strbuf_put(t, " axis=%d", axis);
}

static void put_params(strbuf *t, const ir_node *n)
{
    const ir_params *p = &n->params;
    switch (ir_ops[n->op].kind) {
    case KIND_SOURCE:
        if (n->op == OP_CONST)
            strbuf_put(t, " %.17g%s", p->value, p->scalar ? " scalar" : "");
        else
            strbuf_put(t, " %lld", (long long)p->index);
        return;
    case KIND_REDUCTION:
        put_axis(t, p->axis);
        strbuf_put(t, " keepdim=%d", p->keepdim);
        return;
    case KIND_LINE:
    case KIND_INDEX:
        put_axis(t, p->axis);
        if (n->op == OP_TOPK)
            strbuf_put(t, " k=%lld largest=%d", (long long)p->index, p->keepdim);
        return;
    default:
        break;
    }
    if (n->op == OP_SLICE) {
        put_axis(t, p->axis);
        strbuf_put(t, " start=%lld step=%lld", (long long)p->start, (long long)p->step);
    } else if (n->op == OP_CONCAT) {
        put_axis(t, p->axis);
    } else if (n->op == OP_CONV2D) {
        strbuf_put(t, " conv=");
        for (int i = 0; i < IR_CONV_PARAMS; i++)
            strbuf_put(t, i ? ",%d" : "%d", p->perm[i]);
    } else if (n->op == OP_PERMUTE) {
        strbuf_put(t, " perm=");
        for (int d = 0; d < n->ndim; d++)
            strbuf_put(t, d ? ",%d" : "%d", p->perm[d]);
    }
}

char *ir_to_text(const ir_graph *g)
{
    strbuf t = {0};
    strbuf_put(&t, "kiln-graph 1\n");
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        strbuf_put(&t, "%%%u = %s", r, ir_ops[n->op].name);
        for (uint32_t i = 0; i < n->n_operands; i++)
            strbuf_put(&t, " %%%u", ir_operands(g, n)[i]);
        put_params(&t, n);
        strbuf_put(&t, " : ");
        put_type(&t, g, n);
        strbuf_put(&t, "\n");
    }
    strbuf_put(&t, "output");
    for (int i = 0; i < g->n_outputs; i++)
        strbuf_put(&t, " %%%u", g->outputs[i]);
    strbuf_put(&t, "\n");
    for (int i = 0; i < g->n_writebacks; i++)
        strbuf_put(&t, "writeback %lld %%%u\n", (long long)g->writebacks[i].capture, g->writebacks[i].value);
    return strbuf_finish(&t);
}

char *ir_to_dot(const ir_graph *g, const char *name)
{
    strbuf t = {0};
    strbuf_put(&t, "digraph \"%s\" {\n  node [shape=box, fontname=monospace];\n", name ? name : "kiln");
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *n = &g->nodes[r];
        strbuf_put(&t, "  n%u [label=\"%%%u %s", r, r, ir_ops[n->op].name);
        put_params(&t, n);
        strbuf_put(&t, "\\n");
        put_type(&t, g, n);
        strbuf_put(&t, "\"%s];\n", ir_ops[n->op].kind == KIND_SOURCE ? ", style=rounded" : "");
        for (uint32_t i = 0; i < n->n_operands; i++)
            strbuf_put(&t, "  n%u -> n%u;\n", ir_operands(g, n)[i], r);
    }
    for (int i = 0; i < g->n_outputs; i++)
        strbuf_put(&t, "  out%d [label=\"output %d\", shape=plaintext];\n  n%u -> out%d;\n", i, i,
            g->outputs[i], i);
    for (int i = 0; i < g->n_writebacks; i++)
        strbuf_put(&t, "  wb%d [label=\"writeback capture %lld\", shape=plaintext];\n  n%u -> wb%d;\n", i,
            (long long)g->writebacks[i].capture, g->writebacks[i].value, i);
    strbuf_put(&t, "}\n");
    return strbuf_finish(&t);
}

/* -- Parsing --------------------------------------------------------------- */

typedef struct {
    const char *p;   /* the rest of the current line */
    bool overlong;   /* a word did not fit its buffer */
    int line;
    char *err;
    size_t err_size;
} parser;

static int fail(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser *ps, const char *fmt, ...)
{
    int n = snprintf(ps->err, ps->err_size, "line %d: ", ps->line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < ps->err_size)
        vsnprintf(ps->err + n, ps->err_size - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* The next space-separated word of the line into buf; false at the line's end. */
static bool word(parser *ps, char *buf, size_t size)
{
    while (*ps->p == ' ')
        ps->p++;
    size_t n = 0;
    while (*ps->p && *ps->p != ' ' && *ps->p != '\n') {
        if (n + 1 < size)
            buf[n++] = *ps->p;
        else
            ps->overlong = true;
        ps->p++;
    }
    buf[n] = '\0';
    return n > 0;
}

static bool parse_int(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_ref(const char *s, ir_ref limit, ir_ref *out)
{
    int64_t v;
    if (s[0] != '%' || !isdigit((unsigned char)s[1]) || !parse_int(s + 1, &v) || v < 0 ||
        v >= (int64_t)limit)
        return false;
    *out = (ir_ref)v;
    return true;
}

/* A term of a size: "3", "s0", "2*s0*s1". */
static bool parse_term(const char *s, const char *end, ir_term *term)
{
    memset(term, 0, sizeof *term);
    term->coef = 1;
    while (s < end) {
        const char *stop = memchr(s, '*', (size_t)(end - s));
        stop = stop ? stop : end;
        char *after;
        errno = 0;
        if (*s == 's') {
            long symbol = strtol(s + 1, &after, 10);
            if (after != stop || s + 1 == stop || symbol < 0 || symbol >= IR_MAX_SYMBOLS ||
                term->exp[symbol] == UINT8_MAX)
                return false;
            term->exp[symbol]++;
        } else {
            long long factor = strtoll(s, &after, 10);
            if (after != stop || s == stop || errno ||
                __builtin_mul_overflow(term->coef, factor, &term->coef))
                return false;
        }
        s = stop == end ? end : stop + 1;
        if (stop != end && s == end)
            return false;
    }
    return true;
}

/* A size: a number, or a polynomial kept in sizes. */
static bool parse_size(const char *s, const char *end, ir_sizes *sizes, int64_t *size)
{
    ir_poly p;
    memset(&p, 0, sizeof p);
    int64_t total = 0;
    while (s < end) {
        const char *stop = memchr(s, '+', (size_t)(end - s));
        stop = stop ? stop : end;
        if (p.n == IR_POLY_TERMS || !parse_term(s, stop, &p.terms[p.n]))
            return false;
        total = ir_size_add(sizes, total, ir_size_of(sizes, &(ir_poly){.n = 1, .terms = {p.terms[p.n]}}));
        p.n++;
        s = stop == end ? end : stop + 1;
        if (stop != end && s == end)
            return false;
    }
    *size = total;
    return p.n > 0 && total != IR_SIZE_NONE && (total >= 0 || ir_size_symbols(sizes, total));
}

static int parse_type(parser *ps, ir_graph *g, const char *s, ir_node *n)
{
    const char *open = strchr(s, '[');
    size_t len = open ? (size_t)(open - s) : 0;
    n->dtype = (kiln_dtype)-1;
    for (int d = 0; d < 5; d++)
        if (len == strlen(ir_dtype_names[d]) && !strncmp(s, ir_dtype_names[d], len))
            n->dtype = (kiln_dtype)d;
    if ((int)n->dtype < 0)
        return fail(ps, "bad type \"%s\"", s);
    const char *p = open + 1;
    n->ndim = 0;
    while (*p != ']') {
        const char *end = p + strcspn(p, ",]");
        if (!*end || n->ndim == KILN_MAX_DIMS || !parse_size(p, end, &g->sizes, &n->shape[n->ndim]))
            return fail(ps, "bad shape in \"%s\"", s);
        n->ndim++;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == ']')
            return fail(ps, "bad shape in \"%s\"", s);
    }
    if (p[1])
        return fail(ps, "text after the shape in \"%s\"", s);
    return 0;
}

static int parse_axis(parser *ps, const char *v, ir_params *p)
{
    int64_t axis;
    if (!strcmp(v, "all")) {
        p->axis = KILN_ALL;
        return 0;
    }
    if (!parse_int(v, &axis) || axis < -KILN_MAX_DIMS || axis >= KILN_MAX_DIMS)
        return fail(ps, "bad axis \"%s\"", v);
    p->axis = (int32_t)axis;
    return 0;
}

static int parse_perm(parser *ps, const char *v, ir_params *p)
{
    int d = 0;
    for (const char *s = v; *s; d++) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || d == KILN_MAX_DIMS || x < 0 || x >= KILN_MAX_DIMS || (*end && *end != ','))
            return fail(ps, "bad perm \"%s\"", v);
        p->perm[d] = (int32_t)x;
        s = *end ? end + 1 : end;
    }
    return 0;
}

/* A convolution's IR_CONV_PARAMS numbers, each in [0, 2^31). */
static int parse_conv(parser *ps, const char *v, ir_params *p)
{
    int i = 0;
    for (const char *s = v; *s; i++) {
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (end == s || i == IR_CONV_PARAMS || errno || x < 0 || x > INT32_MAX || (*end && *end != ','))
            return fail(ps, "bad conv \"%s\"", v);
        p->perm[i] = (int32_t)x;
        s = *end ? end + 1 : end;
    }
    return i == IR_CONV_PARAMS ? 0 : fail(ps, "bad conv \"%s\"", v);
}

static int parse_param(parser *ps, const char *w, ir_params *p)
{
    const char *eq = strchr(w, '=');
    if (!eq)
        return fail(ps, "expected key=value, got \"%s\"", w);
    size_t klen = (size_t)(eq - w);
    const char *v = eq + 1;
    int64_t x;
    if (klen == 4 && !strncmp(w, "axis", 4))
        return parse_axis(ps, v, p);
    if (klen == 4 && !strncmp(w, "perm", 4))
        return parse_perm(ps, v, p);
    if (klen == 4 && !strncmp(w, "conv", 4))
        return parse_conv(ps, v, p);
    if (!parse_int(v, &x))
        return fail(ps, "bad value in \"%s\"", w);
    if ((klen == 7 && !strncmp(w, "keepdim", 7)) || (klen == 7 && !strncmp(w, "largest", 7))) {
        if (x != 0 && x != 1)
            return fail(ps, "bad value in \"%s\"", w);
        p->keepdim = (int32_t)x;
    } else if (klen == 1 && w[0] == 'k' && x >= 0)
        p->index = x;
    else if (klen == 5 && !strncmp(w, "start", 5))
        p->start = x;
    else if (klen == 4 && !strncmp(w, "step", 4))
        p->step = x;
    else
        return fail(ps, "unknown parameter \"%s\"", w);
    return 0;
}

static int parse_source_param(parser *ps, ir_op op, const char *w, ir_params *p)
{
    if (op == OP_CONST && !strcmp(w, "scalar")) {
        p->scalar = 1;
        return 0;
    }
    if (op == OP_CONST) {
        char *end;
        p->value = strtod(w, &end);
        return end != w && !*end ? 0 : fail(ps, "bad constant \"%s\"", w);
    }
    bool random = ir_ops[op].flags & FLAG_RANDOM; /* a seed: any 64 bits */
    if (!parse_int(w, &p->index) || (!random && (p->index < 0 || p->index >= INT32_MAX)))
        return fail(ps, "bad %s number \"%s\"", ir_ops[op].name, w);
    return 0;
}

static int find_op(const char *name)
{
    for (int op = 0; op < OP__COUNT; op++)
        if (!strcmp(ir_ops[op].name, name) && ir_ops[op].kind != KIND_ASSIGN)
            return op;
    return -1;
}

enum { WORD = 256, MAX_OPERANDS = 1024 };

static int parse_node(parser *ps, ir_graph *g, const char *first)
{
    char w[WORD];
    ir_ref expect;
    if (!parse_ref(first, g->count + 1, &expect) || expect != g->count)
        return fail(ps, "expected node %%%u, got \"%s\"", g->count, first);
    if (!word(ps, w, sizeof w) || strcmp(w, "="))
        return fail(ps, "expected \"=\"");
    if (!word(ps, w, sizeof w))
        return fail(ps, "expected an op");
    int op = find_op(w);
    if (op < 0)
        return fail(ps, "unknown op \"%s\"", w);
    ir_node n = {0};
    ir_ref operands[MAX_OPERANDS];
    int count = 0;
    bool typed = false;
    while (word(ps, w, sizeof w)) {
        if (!strcmp(w, ":")) {
            if (!word(ps, w, sizeof w) || parse_type(ps, g, w, &n) < 0)
                return ps->err[0] ? -1 : fail(ps, "expected a type after \":\"");
            typed = true;
            break;
        }
        if (w[0] == '%') {
            if (count == MAX_OPERANDS || !parse_ref(w, g->count, &operands[count]))
                return fail(ps, "bad operand \"%s\" (operands must name earlier nodes)", w);
            count++;
        } else if (ir_ops[op].kind == KIND_SOURCE) {
            if (parse_source_param(ps, (ir_op)op, w, &n.params) < 0)
                return -1;
        } else if (parse_param(ps, w, &n.params) < 0) {
            return -1;
        }
    }
    if (!typed)
        return fail(ps, "missing \": type\"");
    if (word(ps, w, sizeof w))
        return fail(ps, "text after the type: \"%s\"", w);
    ir_ref r = ir_emit(g, (ir_op)op, n.dtype, n.ndim, n.shape, count, operands, &n.params);
    if (r == IR_NONE)
        return fail(ps, "out of memory");
    if (r != expect)
        return fail(ps, "node %%%u repeats node %%%u", expect, r);
    return 0;
}

static int parse_outputs(parser *ps, ir_graph *g)
{
    char w[WORD];
    while (word(ps, w, sizeof w)) {
        ir_ref r;
        if (!parse_ref(w, g->count, &r))
            return fail(ps, "bad output \"%s\"", w);
        if (ir_add_output(g, r) < 0)
            return fail(ps, "out of memory");
    }
    return 0;
}

static int parse_writeback(parser *ps, ir_graph *g)
{
    char w[WORD];
    int64_t capture;
    ir_ref r;
    if (!word(ps, w, sizeof w) || !parse_int(w, &capture) || capture < 0 || capture >= INT32_MAX)
        return fail(ps, "bad writeback capture \"%s\"", w);
    if (!word(ps, w, sizeof w) || !parse_ref(w, g->count, &r))
        return fail(ps, "bad writeback value \"%s\"", w);
    if (word(ps, w, sizeof w))
        return fail(ps, "text after the writeback: \"%s\"", w);
    return ir_add_writeback(g, capture, r) < 0 ? fail(ps, "out of memory") : 0;
}

static int parse_line(parser *ps, ir_graph *g, bool *outputs_seen)
{
    char w[WORD];
    if (!word(ps, w, sizeof w))
        return fail(ps, "empty line");
    if (w[0] == '%') {
        if (*outputs_seen)
            return fail(ps, "node after the output line");
        return parse_node(ps, g, w);
    }
    if (!strcmp(w, "output")) {
        if (*outputs_seen)
            return fail(ps, "second output line");
        *outputs_seen = true;
        return parse_outputs(ps, g);
    }
    if (!strcmp(w, "writeback") && *outputs_seen)
        return parse_writeback(ps, g);
    return fail(ps, "unexpected \"%s\"", w);
}

ir_graph *ir_parse(const char *src, char *err, size_t err_size)
{
    parser ps = {.p = src, .line = 1, .err = err, .err_size = err_size};
    err[0] = '\0';
    if (!src || strncmp(src, "kiln-graph 1\n", 13)) {
        fail(&ps, "expected the header \"kiln-graph 1\"");
        return NULL;
    }
    ir_graph *g = ir_graph_new();
    if (!g) {
        fail(&ps, "out of memory");
        return NULL;
    }
    bool outputs_seen = false;
    const char *line = src + 13;
    while (*line) {
        ps.line++;
        ps.p = line;
        if (parse_line(&ps, g, &outputs_seen) < 0)
            goto fail;
        if (ps.overlong) {
            fail(&ps, "a word is too long");
            goto fail;
        }
        const char *end = strchr(line, '\n');
        if (!end) {
            fail(&ps, "the last line has no newline (truncated text?)");
            goto fail;
        }
        if (ps.p != end) {
            fail(&ps, "unexpected text at the end of the line");
            goto fail;
        }
        line = end + 1;
    }
    if (!outputs_seen) {
        fail(&ps, "no output line (truncated text?)");
        goto fail;
    }
    for (int i = 0; i < g->sizes.n; i++)
        for (int s = 0; s < IR_MAX_SYMBOLS; s++)
            if (ir_size_symbols(&g->sizes, -1 - i) & (1u << s) && s >= g->n_symbols)
                g->n_symbols = s + 1;
    if (ir_verify(g, err, err_size) < 0)
        goto fail;
    return g;
fail:
    ir_graph_free(g);
    return NULL;
}
