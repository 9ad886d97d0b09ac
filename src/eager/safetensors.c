/* kiln_load_safetensors: named tensors out of a mapped .safetensors file.
 *
 * The format (huggingface/safetensors): an 8-byte little-endian header
 * length N, N bytes of JSON, then the data. The JSON is one object mapping
 * each tensor's name to {"dtype": "F32", "shape": [2, 3], "data_offsets":
 * [begin, end]} (offsets into the data), and "__metadata__" to an object of
 * strings. The parser below reads exactly that much JSON, strictly: the
 * header is checked whole before anything is copied, and every error names
 * the byte where it was found. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eager/internal.h"

enum { HEADER_MAX = 100 * 1000 * 1000, NAME_MAX_BYTES = 4096 };

typedef struct {
    const char *code;
    int size;       /* bytes per element */
    int dtype;      /* kiln's, or -1 when kiln has none */
} st_dtype;

static const st_dtype dtypes[] = {
    {"F32", 4, KILN_F32}, {"F64", 8, KILN_F64}, {"I32", 4, KILN_I32}, {"I64", 8, KILN_I64},
    {"BOOL", 1, KILN_BOOL}, {"F16", 2, -1}, {"BF16", 2, -1}, {"I8", 1, -1}, {"U8", 1, -1},
    {"I16", 2, -1}, {"U16", 2, -1}, {"U32", 4, -1}, {"U64", 8, -1}, {"F8_E4M3", 1, -1},
    {"F8_E5M2", 1, -1},
};

/* One tensor of the header. */
typedef struct {
    char *name;
    const st_dtype *dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    uint64_t begin, end; /* into the data */
    long at;             /* where its entry starts in the file, for messages */
} entry;

typedef struct {
    const char *fn, *path;
    const unsigned char *text; /* the JSON header */
    size_t len, at;
    entry *entries;
    int n, cap;
} parser;

static int fail_at(const parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(const parser *p, size_t at, const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return core_fail(CORE_FORMAT, p->fn, "'%s': byte %zu: %s", p->path, 8 + at, what);
}

/* -- JSON, as much as the header has --------------------------------------- */

static void skip_space(parser *p)
{
    while (p->at < p->len && strchr(" \t\n\r", p->text[p->at]) && p->text[p->at])
        p->at++;
}

static bool take(parser *p, char ch)
{
    skip_space(p);
    if (p->at >= p->len || p->text[p->at] != ch)
        return false;
    p->at++;
    return true;
}

static int expect(parser *p, char ch, const char *what)
{
    return take(p, ch) ? 0 : fail_at(p, p->at, "expected %s", what);
}

/* The UTF-8 length of the sequence at s (at most n bytes), 0 if invalid:
 * overlong forms, surrogates and code points past U+10FFFF are refused. */
static int utf8_length(const unsigned char *s, size_t n)
{
    int len;
    uint32_t cp;
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] < 0xe0)
        len = 2, cp = s[0] & 0x1fu;
    else if (s[0] >= 0xe0 && s[0] < 0xf0)
        len = 3, cp = s[0] & 0x0fu;
    else if (s[0] >= 0xf0 && s[0] < 0xf5)
        len = 4, cp = s[0] & 0x07u;
    else
        return 0;
    if ((size_t)len > n)
        return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
        return 0;
    return len;
}

/* cp as UTF-8 into out; the bytes written. */
static int utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    int len = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[] = {0, 0, 0xc0, 0xe0, 0xf0};
    for (int i = len - 1; i > 0; i--, cp >>= 6)
        out[i] = (char)(0x80 | (cp & 0x3f));
    out[0] = (char)(lead[len] | cp);
    return len;
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int hex4(parser *p, uint32_t *out)
{
    *out = 0;
    for (int i = 0; i < 4; i++, p->at++) {
        int v = p->at < p->len ? hex_value(p->text[p->at]) : -1;
        if (v < 0)
            return fail_at(p, p->at, "expected four hex digits after \\u");
        *out = *out << 4 | (uint32_t)v;
    }
    return 0;
}

/* \uXXXX (with its low surrogate when it is a high one) as UTF-8 into out;
 * the bytes written. */
static int unicode_escape(parser *p, char *out)
{
    size_t start = p->at - 2;
    uint32_t cp, low;
    if (hex4(p, &cp) < 0)
        return -1;
    if (cp >= 0xdc00 && cp < 0xe000)
        return fail_at(p, start, "a low surrogate alone");
    if (cp >= 0xd800 && cp < 0xdc00) {
        if (p->at + 2 > p->len || p->text[p->at] != '\\' || p->text[p->at + 1] != 'u')
            return fail_at(p, start, "a high surrogate without its low one");
        p->at += 2;
        if (hex4(p, &low) < 0)
            return -1;
        if (low < 0xdc00 || low >= 0xe000)
            return fail_at(p, start, "a high surrogate without its low one");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
    }
    return utf8_encode(cp, out);
}

/* The character a one-letter escape stands for, or -1. */
static int plain_escape(unsigned char c)
{
    switch (c) {
    case '"':
    case '\\':
    case '/': return c;
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return -1;
    }
}

/* The escape at p->at (its backslash) as UTF-8 into chunk; its length. */
static int read_escape(parser *p, char *chunk)
{
    if (p->at + 1 >= p->len)
        return fail_at(p, p->at, "a string without its closing quote");
    unsigned char c = p->text[p->at + 1];
    p->at += 2;
    if (c == 'u')
        return unicode_escape(p, chunk);
    if (plain_escape(c) < 0)
        return fail_at(p, p->at - 2, "an unknown escape");
    chunk[0] = (char)plain_escape(c);
    return 1;
}

/* A string, decoded, into out (size bytes, NUL-terminated). */
static int read_string(parser *p, char *out, size_t size)
{
    if (expect(p, '"', "a string") < 0)
        return -1;
    size_t n = 0, start = p->at - 1;
    while (p->at < p->len && p->text[p->at] != '"') {
        char chunk[4];
        int len;
        if (p->text[p->at] < 0x20)
            return fail_at(p, p->at, "a control character in a string");
        if (p->text[p->at] == '\\') {
            len = read_escape(p, chunk);
        } else if ((len = utf8_length(p->text + p->at, p->len - p->at))) {
            memcpy(chunk, p->text + p->at, (size_t)len);
            p->at += (size_t)len;
        } else {
            return fail_at(p, p->at, "a string that is not UTF-8");
        }
        if (len < 0)
            return -1;
        if (n + (size_t)len >= size)
            return fail_at(p, start, "a string too long");
        memcpy(out + n, chunk, (size_t)len);
        n += (size_t)len;
    }
    if (p->at >= p->len)
        return fail_at(p, start, "a string without its closing quote");
    p->at++;
    out[n] = '\0';
    return 0;
}

/* A non-negative integer that fits in 63 bits. */
static int read_count(parser *p, uint64_t *out)
{
    skip_space(p);
    size_t start = p->at;
    uint64_t v = 0;
    while (p->at < p->len && p->text[p->at] >= '0' && p->text[p->at] <= '9') {
        if (v > (UINT64_C(1) << 62) / 5 || (p->at > start && v == 0))
            return fail_at(p, start, "a number too large or with a leading zero");
        v = v * 10 + (uint64_t)(p->text[p->at++] - '0');
    }
    if (p->at == start)
        return fail_at(p, start, "expected a non-negative integer");
    *out = v;
    return 0;
}

/* [n, ...] of at most max entries; their count into *count. */
static int read_counts(parser *p, uint64_t *out, int max, int *count, const char *what)
{
    if (expect(p, '[', what) < 0)
        return -1;
    *count = 0;
    if (take(p, ']'))
        return 0;
    do {
        if (*count == max)
            return fail_at(p, p->at, "too many entries in %s", what);
        if (read_count(p, &out[(*count)++]) < 0)
            return -1;
    } while (take(p, ','));
    return expect(p, ']', "',' or ']'");
}

/* -- The header ------------------------------------------------------------ */

/* "__metadata__": an object of strings, checked and dropped. */
static int read_metadata(parser *p)
{
    char text[NAME_MAX_BYTES];
    if (expect(p, '{', "the metadata object") < 0)
        return -1;
    if (take(p, '}'))
        return 0;
    do {
        if (read_string(p, text, sizeof text) < 0 || expect(p, ':', "':'") < 0 ||
            read_string(p, text, sizeof text) < 0)
            return -1;
    } while (take(p, ','));
    return expect(p, '}', "',' or '}'");
}

static int read_dtype(parser *p, entry *e)
{
    char code[16];
    size_t at = p->at;
    if (read_string(p, code, sizeof code) < 0)
        return -1;
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (!strcmp(code, dtypes[i].code))
            return e->dtype = &dtypes[i], 0;
    return fail_at(p, at, "unknown dtype \"%s\"", code);
}

/* One of an entry's three fields, each once. */
static int read_field(parser *p, entry *e, unsigned *seen)
{
    char key[16];
    size_t at = p->at;
    if (read_string(p, key, sizeof key) < 0 || expect(p, ':', "':'") < 0)
        return -1;
    uint64_t values[KILN_MAX_DIMS];
    int count;
    if (!strcmp(key, "dtype") && !(*seen & 1)) {
        *seen |= 1;
        return read_dtype(p, e);
    }
    if (!strcmp(key, "shape") && !(*seen & 2)) {
        *seen |= 2;
        if (read_counts(p, values, KILN_MAX_DIMS, &e->ndim, "the shape") < 0)
            return -1;
        for (int d = 0; d < e->ndim; d++)
            e->shape[d] = (int64_t)values[d];
        return 0;
    }
    if (!strcmp(key, "data_offsets") && !(*seen & 4)) {
        *seen |= 4;
        if (read_counts(p, values, 2, &count, "data_offsets") < 0)
            return -1;
        e->begin = values[0], e->end = values[1];
        return count == 2 ? 0 : fail_at(p, at, "data_offsets needs two numbers");
    }
    return fail_at(p, at, "unknown or repeated key \"%s\"", key);
}

static int read_entry(parser *p, entry *e)
{
    unsigned seen = 0;
    size_t at = p->at;
    if (expect(p, '{', "a tensor's object") < 0)
        return -1;
    if (!take(p, '}')) {
        do {
            if (read_field(p, e, &seen) < 0)
                return -1;
        } while (take(p, ','));
        if (expect(p, '}', "',' or '}'") < 0)
            return -1;
    }
    return seen == 7 ? 0 : fail_at(p, at, "a tensor needs dtype, shape and data_offsets");
}

static entry *new_entry(parser *p)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        entry *grown = realloc(p->entries, (size_t)cap * sizeof *grown);
        if (!grown)
            return NULL;
        p->entries = grown;
        p->cap = cap;
    }
    entry *e = &p->entries[p->n];
    memset(e, 0, sizeof *e);
    return e;
}

/* One "name": value pair of the top-level object. */
static int read_member(parser *p)
{
    char name[NAME_MAX_BYTES];
    size_t at = p->at;
    if (read_string(p, name, sizeof name) < 0 || expect(p, ':', "':'") < 0)
        return -1;
    if (!strcmp(name, "__metadata__"))
        return read_metadata(p);
    entry *e = new_entry(p);
    if (!e || !(e->name = strdup(name)))
        return core_fail(CORE_NOMEM, p->fn, "'%s': out of memory reading the header", p->path);
    p->n++;
    skip_space(p);
    e->at = 8 + (long)at;
    return read_entry(p, e);
}

static int parse(parser *p)
{
    if (p->len == 0 || p->text[0] != '{')
        return fail_at(p, 0, "the header must start with '{'");
    p->at = 1;
    if (!take(p, '}')) {
        do {
            if (read_member(p) < 0)
                return -1;
        } while (take(p, ','));
        if (expect(p, '}', "',' or '}'") < 0)
            return -1;
    }
    skip_space(p); /* the writer pads with spaces to a multiple of 8 */
    return p->at == p->len ? 0 : fail_at(p, p->at, "text after the header's object");
}

/* -- Checks across tensors -------------------------------------------------- */

static int by_begin(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static int fail_entry(const parser *p, const entry *e, const char *what)
{
    return core_fail(CORE_FORMAT, p->fn, "'%s': tensor \"%.200s\" (byte %ld): %s", p->path, e->name, e->at, what);
}

/* qsort, which must not see the NULL array of a header with no tensors. */
static void sort_entries(parser *p, int (*cmp)(const void *, const void *))
{
    if (p->n)
        qsort(p->entries, (size_t)p->n, sizeof *p->entries, cmp);
}

/* Sizes match shapes, and the tensors tile the data exactly. */
static int check_layout(parser *p, uint64_t data_len)
{
    sort_entries(p, by_begin);
    uint64_t covered = 0;
    for (int i = 0; i < p->n; i++) {
        const entry *e = &p->entries[i];
        uint64_t bytes = (uint64_t)e->dtype->size;
        for (int d = 0; d < e->ndim; d++)
            bytes = e->shape[d] && bytes > (UINT64_C(1) << 62) / (uint64_t)e->shape[d] ? UINT64_MAX
                                                                                     : bytes * (uint64_t)e->shape[d];
        if (e->end < e->begin || e->end - e->begin != bytes)
            return fail_entry(p, e, "data_offsets do not hold its shape and dtype");
        if (e->begin != covered)
            return fail_entry(p, e, e->begin < covered ? "overlaps the tensor before it" : "leaves a hole before it");
        covered = e->end;
    }
    if (covered != data_len) {
        char why[96];
        snprintf(why, sizeof why, "the tensors cover %llu bytes of data, the file has %llu",
                 (unsigned long long)covered, (unsigned long long)data_len);
        return core_fail(CORE_FORMAT, p->fn, "'%s': %s", p->path, why);
    }
    sort_entries(p, by_name);
    for (int i = 1; i < p->n; i++)
        if (!strcmp(p->entries[i - 1].name, p->entries[i].name))
            return fail_entry(p, &p->entries[i], "named twice");
    return 0;
}

/* -- Loading ---------------------------------------------------------------- */

static kiln_tensor *copy_out(const parser *p, const entry *e, const unsigned char *data)
{
    if (e->dtype->dtype < 0) {
        char why[64];
        snprintf(why, sizeof why, "dtype %s is none of kiln's (F32, F64, I32, I64, BOOL)", e->dtype->code);
        fail_entry(p, e, why);
        return NULL;
    }
    kiln_tensor *t = tensor_new(p->fn, (kiln_dtype)e->dtype->dtype, e->ndim, e->shape);
    if (!t || !t->numel)
        return t;
    if (t->dtype == KILN_BOOL) /* any nonzero byte is true, stored as 1 */
        convert(t->storage->data, KILN_BOOL, data + e->begin, KILN_BOOL, t->numel, 1);
    else
        memcpy(t->storage->data, data + e->begin, e->end - e->begin);
    return t;
}

static const entry *find(const parser *p, const char *name)
{
    entry key = {.name = (char *)name};
    if (!p->n)
        return NULL;
    return bsearch(&key, p->entries, (size_t)p->n, sizeof *p->entries, by_name);
}

/* The i-th tensor asked for into *t; 0 or the error. */
static int load_one(const parser *p, const unsigned char *data, const char *const *names, int i,
                    kiln_named_tensor *t)
{
    if (names && !names[i])
        return core_fail_null_arg(p->fn, "names[i]");
    const entry *e = names ? find(p, names[i]) : &p->entries[i];
    if (!e)
        return core_fail(CORE_VALUE, p->fn, "'%s' has no tensor \"%.200s\"", p->path, names[i]);
    if (!(t->name = strdup(e->name)))
        return core_fail(CORE_NOMEM, p->fn, "out of memory");
    t->tensor = copy_out(p, e, data);
    return t->tensor ? 0 : -CORE_FORMAT;
}

/* The n tensors asked for (all, in the file's order, when names is NULL). */
static int load(parser *p, const unsigned char *data, const char *const *names, int n, kiln_named_tensor **out)
{
    if (!names) {
        sort_entries(p, by_begin);
        n = p->n;
    }
    kiln_named_tensor *ts = calloc((size_t)(n ? n : 1), sizeof *ts);
    if (!ts)
        return core_fail(CORE_NOMEM, p->fn, "out of memory");
    for (int i = 0; i < n; i++) {
        int status = load_one(p, data, names, i, &ts[i]);
        if (status < 0) {
            kiln_free_named_tensors(ts, i + 1);
            return status;
        }
    }
    *out = ts;
    return n;
}

/* The header length, checked against the file's size. */
static int header_length(const parser *p, const unsigned char *map, size_t size, uint64_t *len)
{
    if (size < 8)
        return core_fail(CORE_FORMAT, p->fn, "'%s': byte 0: %zu bytes, too short for a header length", p->path, size);
    *len = 0;
    for (int i = 7; i >= 0; i--)
        *len = *len << 8 | map[i];
    if (*len > HEADER_MAX || *len > size - 8)
        return core_fail(CORE_FORMAT, p->fn, "'%s': byte 0: header length %llu, past the file's %zu bytes or 100 MB",
                         p->path, (unsigned long long)*len, size);
    return 0;
}

static int load_mapped(parser *p, const unsigned char *map, size_t size, const char *const *names, int n,
                       kiln_named_tensor **out)
{
    uint64_t len = 0;
    if (header_length(p, map, size, &len) < 0)
        return -CORE_FORMAT;
    p->text = map + 8;
    p->len = (size_t)len;
    if (parse(p) < 0 || check_layout(p, size - 8 - len) < 0)
        return core_error_pending() ? -CORE_FORMAT : -CORE_NOMEM;
    return load(p, map + 8 + len, names, n, out);
}

int kiln_load_safetensors(const char *path, const char *const *names, int n, kiln_named_tensor **out)
{
    parser p = {.fn = "kiln_load_safetensors", .path = path};
    if (!path || !out)
        return core_fail_null_arg(p.fn, !path ? "path" : "out");
    *out = NULL;
    if (names && n < 0)
        return core_fail(CORE_VALUE, p.fn, "n is %d", n);
    struct stat st;
    int fd = core_open_regular_for(p.fn, path, &st);
    if (fd < 0)
        return core_error_status();
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (map == MAP_FAILED)
        return core_fail(CORE_IO, p.fn, "cannot map '%s': %s", path, strerror(errno));
    int status = load_mapped(&p, map, size, names, n, out);
    if (map)
        munmap(map, size);
    if (status >= 0) /* the count of tensors */
        core_succeeded();
    for (int i = 0; i < p.n; i++)
        free(p.entries[i].name);
    free(p.entries);
    return status;
}

void kiln_free_named_tensors(kiln_named_tensor *ts, int n)
{
    if (!ts)
        return;
    for (int i = 0; i < n; i++) {
        free((char *)ts[i].name);
        kiln_release(ts[i].tensor);
    }
    free(ts);
}
