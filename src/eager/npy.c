/* kiln_load_npy and kiln_save_npy: numpy's .npy files, versions 1.0 to 3.0.
 *
 * A file is the magic "\x93NUMPY", a version, the length of a header that is
 * a Python dict literal ({'descr': '<f4', 'fortran_order': False, 'shape':
 * (3, 4), }, padded with spaces to a multiple of 64 bytes and ended by a
 * newline), then the elements. The reader is strict: anything it does not
 * understand is an error naming the byte where it stopped, never a guess. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eager/internal.h"

enum {
    MAGIC_LEN = 6,
    HEADER_MAX = 1 << 20, /* numpy reads at most 10000 bytes unless told otherwise */
    ALIGN = 64,
};
static const char MAGIC[MAGIC_LEN] = "\x93NUMPY";

/* What the header says. */
typedef struct {
    kiln_dtype dtype;
    bool big_endian, fortran_order;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    bool has_descr, has_order, has_shape;
} npy_header;

/* A reader's place in the file, for messages. */
typedef struct {
    const char *fn, *path;
    const char *text; /* the header dict, NUL-terminated */
    size_t at;        /* into text */
    long base;        /* text's offset in the file */
} cursor;

static int fail_at(const cursor *c, long offset, const char *what)
{
    return core_fail(CORE_FORMAT, c->fn, "'%s': byte %ld: %s", c->path, offset, what);
}

static int fail_here(const cursor *c, const char *what)
{
    return fail_at(c, c->base + (long)c->at, what);
}

/* -- The header dict ------------------------------------------------------- */

static void skip_space(cursor *c)
{
    while (c->text[c->at] == ' ' || c->text[c->at] == '\t')
        c->at++;
}

/* Consumes ch (after spaces) if it is next. */
static bool take(cursor *c, char ch)
{
    skip_space(c);
    if (c->text[c->at] != ch)
        return false;
    c->at++;
    return true;
}

/* A quoted string without escapes into out. */
static int read_string(cursor *c, char *out, size_t size)
{
    skip_space(c);
    char quote = c->text[c->at];
    if (quote != '\'' && quote != '"')
        return fail_here(c, "expected a quoted string");
    size_t start = ++c->at, n = 0;
    while (c->text[c->at] && c->text[c->at] != quote && c->text[c->at] != '\\')
        c->at++, n++;
    if (c->text[c->at] != quote)
        return fail_here(c, "unterminated or escaped string");
    if (n >= size)
        return fail_at(c, c->base + (long)start, "string too long");
    memcpy(out, c->text + start, n);
    out[n] = '\0';
    c->at++;
    return 0;
}

static int read_word(cursor *c, const char *word)
{
    skip_space(c);
    size_t n = strlen(word);
    if (strncmp(c->text + c->at, word, n))
        return -1;
    c->at += n;
    return 0;
}

static int read_bool(cursor *c, bool *out)
{
    if (read_word(c, "True") == 0)
        return *out = true, 0;
    if (read_word(c, "False") == 0)
        return *out = false, 0;
    return fail_here(c, "expected True or False");
}

/* A non-negative integer (Python 2's numpy wrote a trailing L). */
static int read_size(cursor *c, int64_t *out)
{
    skip_space(c);
    size_t start = c->at;
    int64_t v = 0;
    while (c->text[c->at] >= '0' && c->text[c->at] <= '9') {
        if (v > (INT64_MAX - 9) / 10)
            return fail_at(c, c->base + (long)start, "dimension too large");
        v = v * 10 + (c->text[c->at++] - '0');
    }
    if (c->at == start)
        return fail_here(c, "expected a dimension");
    take(c, 'L');
    *out = v;
    return 0;
}

/* (), (n,) or (n, m, ...). */
static int read_shape(cursor *c, npy_header *h)
{
    if (!take(c, '('))
        return fail_here(c, "expected the shape, a tuple");
    h->ndim = 0;
    while (!take(c, ')')) {
        if (h->ndim == KILN_MAX_DIMS)
            return fail_here(c, "more than 8 dimensions");
        if (read_size(c, &h->shape[h->ndim++]) < 0)
            return -CORE_FORMAT;
        if (!take(c, ',') && (skip_space(c), c->text[c->at] != ')'))
            return fail_here(c, "expected ',' or ')' in the shape");
    }
    return 0;
}

/* '<f4', '>i8', '|b1': byte order, then kiln's five types. */
static int parse_descr(cursor *c, const char *descr, long at, npy_header *h)
{
    static const struct {
        const char *code;
        kiln_dtype dtype;
    } types[] = {{"f4", KILN_F32}, {"f8", KILN_F64}, {"i4", KILN_I32}, {"i8", KILN_I64}, {"b1", KILN_BOOL}};
    char order = descr[0];
    if (!strchr("<>|=", order) || !order)
        return fail_at(c, at, "descr must start with a byte order: <, >, | or =");
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        if (strcmp(descr + 1, types[i].code))
            continue;
        h->dtype = types[i].dtype;
        h->big_endian = order == '>' && types[i].dtype != KILN_BOOL;
        return 0;
    }
    char why[96];
    snprintf(why, sizeof why, "dtype '%.16s' is none of kiln's: f4, f8, i4, i8, b1", descr);
    return fail_at(c, at, why);
}

static int read_entry(cursor *c, npy_header *h)
{
    char key[32], descr[32];
    long key_at = c->base + (long)c->at;
    if (read_string(c, key, sizeof key) < 0)
        return -CORE_FORMAT;
    if (!take(c, ':'))
        return fail_here(c, "expected ':' after a key");
    if (!strcmp(key, "descr") && !h->has_descr) {
        h->has_descr = true;
        skip_space(c);
        long at = c->base + (long)c->at;
        return read_string(c, descr, sizeof descr) < 0 ? -CORE_FORMAT : parse_descr(c, descr, at, h);
    }
    if (!strcmp(key, "fortran_order") && !h->has_order) {
        h->has_order = true;
        return read_bool(c, &h->fortran_order);
    }
    if (!strcmp(key, "shape") && !h->has_shape) {
        h->has_shape = true;
        return read_shape(c, h);
    }
    return fail_at(c, key_at, "unknown or repeated key (descr, fortran_order and shape, once each)");
}

static int parse_dict(cursor *c, npy_header *h)
{
    if (!take(c, '{'))
        return fail_here(c, "expected '{'");
    while (!take(c, '}')) {
        if (read_entry(c, h) < 0)
            return -CORE_FORMAT;
        if (!take(c, ',') && (skip_space(c), c->text[c->at] != '}'))
            return fail_here(c, "expected ',' or '}'");
    }
    skip_space(c);
    if (c->text[c->at] != '\n' && c->text[c->at] != '\0')
        return fail_here(c, "unexpected text after the dict");
    if (!h->has_descr || !h->has_order || !h->has_shape)
        return fail_here(c, "the header lacks descr, fortran_order or shape");
    return 0;
}

/* -- Reading --------------------------------------------------------------- */

static uint32_t little(const unsigned char *b, int n)
{
    uint32_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/* Magic, version and header length; the header dict into *text (malloc'd). */
static int read_preamble(FILE *f, cursor *c, char **text)
{
    unsigned char pre[12];
    size_t got = fread(pre, 1, MAGIC_LEN + 2, f);
    if (got < MAGIC_LEN || memcmp(pre, MAGIC, MAGIC_LEN))
        return fail_at(c, 0, "not a .npy file (no \\x93NUMPY magic)");
    if (got < MAGIC_LEN + 2 || pre[6] < 1 || pre[6] > 3 || pre[7] != 0)
        return fail_at(c, 6, "version must be 1.0, 2.0 or 3.0");
    int len_bytes = pre[6] == 1 ? 2 : 4;
    if (fread(pre + 8, 1, (size_t)len_bytes, f) != (size_t)len_bytes)
        return fail_at(c, 8, "file ends in the header length");
    uint32_t len = little(pre + 8, len_bytes);
    c->base = 8 + len_bytes;
    if (len > HEADER_MAX)
        return fail_at(c, 8, "header longer than 1 MiB");
    *text = malloc((size_t)len + 1);
    if (!*text)
        return core_fail(CORE_NOMEM, c->fn, "'%s': out of memory reading the header", c->path);
    got = fread(*text, 1, len, f);
    (*text)[got] = '\0';
    if (got < len)
        return fail_at(c, c->base + (long)got, "file ends in the header");
    if (memchr(*text, '\0', len))
        return fail_at(c, c->base + (long)((char *)memchr(*text, '\0', len) - *text), "NUL byte in the header");
    return 0;
}

static void swap_bytes(char *data, int64_t n, size_t size)
{
    for (int64_t i = 0; i < n; i++) {
        char *e = data + i * (int64_t)size;
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            char t = e[a];
            e[a] = e[b];
            e[b] = t;
        }
    }
}

/* Whether a regular file holds the data its header promises, checked
 * before anything is allocated for it: a damaged shape must not ask for
 * terabytes. */
static int check_data_size(FILE *f, cursor *c, const npy_header *h)
{
    struct stat st;
    long at = ftell(f);
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || at < 0)
        return 0;
    uint64_t need = eager_dtype_size(h->dtype), have = (uint64_t)st.st_size - (uint64_t)at;
    for (int d = 0; d < h->ndim; d++)
        need = h->shape[d] && need > UINT64_MAX / (uint64_t)h->shape[d] ? UINT64_MAX : need * (uint64_t)h->shape[d];
    if (need <= have)
        return 0;
    char why[128];
    snprintf(why, sizeof why, "file ends in the data (%llu of %llu bytes)", (unsigned long long)have,
             (unsigned long long)need);
    return fail_at(c, (long)st.st_size, why);
}

/* A Fortran-order tensor is read as its transpose, then copied row-major. */
static kiln_tensor *read_elements(FILE *f, cursor *c, const npy_header *h)
{
    if (check_data_size(f, c, h) < 0)
        return NULL;
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < h->ndim; d++)
        shape[d] = h->fortran_order ? h->shape[h->ndim - 1 - d] : h->shape[d];
    kiln_tensor *t = tensor_new(c->fn, h->dtype, h->ndim, shape);
    if (!t)
        return NULL;
    size_t size = eager_dtype_size(h->dtype), need = (size_t)t->numel * size;
    size_t got = need ? fread(t->storage->data, 1, need, f) : 0;
    if (got < need) {
        char why[96];
        snprintf(why, sizeof why, "file ends in the data (%zu of %zu bytes)", got, need);
        fail_at(c, ftell(f), why);
        return tensor_drop(t);
    }
    if (fgetc(f) != EOF) {
        fail_at(c, ftell(f) - 1, "bytes after the data");
        return tensor_drop(t);
    }
    if (h->big_endian)
        swap_bytes(t->storage->data, t->numel, size);
    if (h->dtype == KILN_BOOL) /* any nonzero byte is true, stored as 1 */
        convert(t->storage->data, KILN_BOOL, t->storage->data, KILN_BOOL, t->numel, 1);
    if (!h->fortran_order || h->ndim < 2)
        return t;
    int64_t strides[KILN_MAX_DIMS];
    for (int d = 0; d < h->ndim; d++)
        strides[d] = t->strides[h->ndim - 1 - d];
    kiln_tensor *view = tensor_view(c->fn, t, h->ndim, h->shape, strides, 0);
    kiln_tensor *out = view ? copy_as(c->fn, view, h->dtype) : NULL;
    kiln_release(view);
    kiln_release(t);
    return out;
}

kiln_tensor *kiln_load_npy(const char *path)
{
    cursor c = {.fn = "kiln_load_npy", .path = path};
    if (!path) {
        core_fail_null_arg(c.fn, "path");
        return NULL;
    }
    struct stat st;
    int fd = core_open_regular_for(c.fn, path, &st);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        if (fd >= 0) {
            core_fail(CORE_IO, c.fn, "cannot open '%s': %s", path, strerror(errno));
            close(fd);
        }
        return NULL;
    }
    char *text = NULL;
    npy_header h = {0};
    kiln_tensor *t = NULL;
    if (read_preamble(f, &c, &text) == 0) {
        c.text = text;
        if (parse_dict(&c, &h) == 0)
            t = read_elements(f, &c, &h);
    }
    free(text);
    fclose(f);
    return tensor_own(t);
}

/* -- Writing --------------------------------------------------------------- */

/* numpy's own header for t, byte for byte as numpy 1.24 writes it: version
 * 1.0, room for the first axis to grow to 21 digits, padded with spaces so
 * that the data starts at a multiple of 64. */
static int format_header(const kiln_tensor *t, char *out, size_t size)
{
    static const char *const descr[] = {[KILN_F32] = "<f4", [KILN_F64] = "<f8", [KILN_I32] = "<i4",
                                        [KILN_I64] = "<i8", [KILN_BOOL] = "|b1"};
    enum { GROWTH_DIGITS = 21 };
    char shape[CORE_SHAPE_STR_MAX + 8] = "";
    for (int d = 0; d < t->ndim; d++) {
        size_t used = strlen(shape);
        snprintf(shape + used, sizeof shape - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    }
    int n = snprintf(out + 10, size - 10, "{'descr': '%s', 'fortran_order': False, 'shape': (%s%s), }",
                     descr[t->dtype], shape, t->ndim == 1 ? "," : "");
    if (t->ndim > 0)
        n += snprintf(out + 10 + n, size - 10 - (size_t)n, "%*s",
                      GROWTH_DIGITS - snprintf(NULL, 0, "%lld", (long long)t->shape[0]), "");
    int pad = ALIGN - (10 + n + 1) % ALIGN;
    memset(out + 10 + n, ' ', (size_t)pad);
    int len = n + pad + 1;
    out[10 + len - 1] = '\n';
    memcpy(out, MAGIC, MAGIC_LEN);
    out[6] = 1;
    out[7] = 0;
    out[8] = (char)(len & 0xff);
    out[9] = (char)(len >> 8);
    return 10 + len;
}

/* t's elements, row-major: t itself when it is a contiguous CPU tensor, else
 * a copy. A new reference. */
static kiln_tensor *host_contiguous(const char *fn, const kiln_tensor *t)
{
    if (t->device == KILN_CUDA)
        return cuda_to_host(fn, t);
    if (eager_is_contiguous(t))
        return kiln_retain((kiln_tensor *)t);
    return copy_as(fn, t, t->dtype);
}

int kiln_save_npy(const char *path, const kiln_tensor *t)
{
    const char *fn = "kiln_save_npy";
    if (!t)
        return core_fail_null(fn, "tensor");
    if (!path)
        return core_fail_null_arg(fn, "path");
    if (t->trace)
        return fail_read_tracer(fn, t);
    if (core_check_writable(fn, path) < 0)
        return core_error_status();
    char header[512];
    int header_len = format_header(t, header, sizeof header);
    kiln_tensor *data = host_contiguous(fn, t);
    if (!data)
        return core_error_pending() ? -CORE_DEVICE : -CORE_NOMEM;
    /* written whole under a fresh name and renamed: a failed save leaves
     * what was at path as it was */
    const void *parts[2] = {header, eager_data(data)};
    size_t sizes[2] = {(size_t)header_len, (size_t)data->numel * eager_dtype_size(data->dtype)};
    struct stat st; /* a file replaced keeps its permissions (a 0600 one stays private) */
    mode_t mode = lstat(path, &st) == 0 && S_ISREG(st.st_mode) ? st.st_mode & 07777 : 0666;
    int status = core_write_parts(path, 2, parts, sizes, mode) < 0
                     ? core_fail(CORE_IO, fn, "cannot write '%s': %s", path, strerror(errno))
                     : 0;
    kiln_release(data);
    if (status == 0)
        core_succeeded();
    return status;
}
