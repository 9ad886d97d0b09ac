/* Bundles: cache entries packed into one file to ship.
 *
 * Layout (docs/cache-format.md): magic, version, entry count, a text
 * manifest, the entries as their own files' bytes each behind its length, and
 * a SHA-256 of everything before it. Unpacking checks the whole bundle and
 * every entry before returning any, so an importer installs all or nothing;
 * reading one checks the lengths it declares against its size first. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "core/core.h"

static const char MAGIC[8] = {'K', 'I', 'L', 'N', 'B', 'N', 'D', 'L'};

enum { BUNDLE_VERSION = 1, FIXED_BYTES = 8 + 4 + 4 + 8 };

typedef struct {
    uint8_t *bytes;
    size_t size, cap;
} buffer;

static bool append(buffer *b, const void *data, size_t n)
{
    if (b->size + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->size + n)
            cap *= 2;
        uint8_t *grown = realloc(b->bytes, cap);
        if (!grown)
            return false;
        b->bytes = grown;
        b->cap = cap;
    }
    memcpy(b->bytes + b->size, data, n);
    b->size += n;
    return true;
}

static bool append_u64(buffer *b, uint64_t v)
{
    uint8_t p[8];
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return append(b, p, 8);
}

static uint64_t get_u64(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void manifest_line(const cache_entry *e, size_t bytes, char *line, size_t size)
{
    char hex[CACHE_HEX_CHARS + 1];
    cache_key_hex(&e->key, hex);
    snprintf(line, size, "%s\t%zu\t%s\t%s\t%s\t%s\n", hex, bytes, e->meta.backend, e->meta.target,
             e->meta.function, e->meta.signature);
}

void *cache_bundle_pack(const char *dir, const cache_key *keys, int n, size_t *size, char *why, size_t why_size)
{
    buffer manifest = {0}, body = {0}, out = {0};
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        char path[CACHE_PATH_MAX + 80], hex[CACHE_HEX_CHARS + 1], line[8192];
        cache_entry_path(dir, &keys[i], path, sizeof path);
        cache_key_hex(&keys[i], hex);
        void *bytes = NULL;
        size_t len = 0;
        cache_entry e;
        int found = cache_entry_read(path, &keys[i], &bytes, &len, line, sizeof line);
        if (found == CACHE_ABSENT)
            snprintf(line, sizeof line, "%s does not exist", path);
        if (found != CACHE_FOUND) {
            snprintf(why, why_size, "entry %s: %.400s", hex, line);
            ok = false;
        } else if (cache_entry_decode(bytes, len, &keys[i], &e, line, sizeof line) < 0) {
            snprintf(why, why_size, "entry %s is damaged: %.400s", hex, line);
            ok = false;
        } else {
            manifest_line(&e, len, line, sizeof line);
            cache_entry_free(&e);
            ok = append(&manifest, line, strlen(line)) && append_u64(&body, len) && append(&body, bytes, len);
            if (!ok)
                snprintf(why, why_size, "out of memory");
        }
        free(bytes);
    }
    uint8_t header[FIXED_BYTES];
    memcpy(header, MAGIC, 8);
    for (int i = 0; i < 4; i++) {
        header[8 + i] = (uint8_t)(BUNDLE_VERSION >> (8 * i));
        header[12 + i] = (uint8_t)((uint32_t)n >> (8 * i));
    }
    for (int i = 0; i < 8; i++)
        header[16 + i] = (uint8_t)((uint64_t)manifest.size >> (8 * i));
    if (ok && !(append(&out, header, sizeof header) && append(&out, manifest.bytes, manifest.size) &&
                append(&out, body.bytes, body.size))) {
        snprintf(why, why_size, "out of memory");
        ok = false;
    }
    cache_key sum;
    if (ok) {
        cache_hash(out.bytes, out.size, &sum);
        ok = append(&out, sum.bytes, CACHE_KEY_BYTES);
    }
    free(manifest.bytes);
    free(body.bytes);
    if (!ok) {
        free(out.bytes);
        return NULL;
    }
    *size = out.size;
    return out.bytes;
}

/* The manifest's next line: its key and entry size, and the line itself;
 * false when malformed. */
static bool manifest_entry(const char **at, const char *end, cache_key *key, uint64_t *bytes, const char **line,
                           size_t *line_len)
{
    const char *nl = memchr(*at, '\n', (size_t)(end - *at));
    char hex[CACHE_HEX_CHARS + 1];
    if (!nl || nl - *at < CACHE_HEX_CHARS + 2 || (*at)[CACHE_HEX_CHARS] != '\t')
        return false;
    memcpy(hex, *at, CACHE_HEX_CHARS);
    hex[CACHE_HEX_CHARS] = '\0';
    char *stop;
    unsigned long long n = strtoull(*at + CACHE_HEX_CHARS + 1, &stop, 10);
    *line = *at;
    *line_len = (size_t)(nl + 1 - *at);
    *at = nl + 1;
    *bytes = n;
    return cache_key_parse(hex, key) && stop <= nl && *stop == '\t';
}

/* Whether a manifest line says what the entry it lists says of itself. */
static bool line_matches(const char *line, size_t len, const cache_entry *e, size_t bytes)
{
    char want[8192];
    manifest_line(e, bytes, want, sizeof want);
    return strlen(want) == len && !memcmp(want, line, len);
}

int cache_bundle_unpack(const void *data, size_t size, cache_entry **entries, int *n_entries, char *why,
                        size_t why_size)
{
    const uint8_t *p = data;
    *entries = NULL;
    *n_entries = 0;
    if (size < FIXED_BYTES + CACHE_KEY_BYTES || memcmp(p, MAGIC, 8)) {
        snprintf(why, why_size, "it is not a kiln bundle");
        return -1;
    }
    uint64_t version = get_u64(p + 8, 4), n = get_u64(p + 12, 4), manifest = get_u64(p + 16, 8);
    cache_key sum;
    cache_hash(p, size - CACHE_KEY_BYTES, &sum);
    if (version != BUNDLE_VERSION) {
        snprintf(why, why_size, "it has bundle version %llu, not %d", (unsigned long long)version, BUNDLE_VERSION);
        return -1;
    }
    if (memcmp(sum.bytes, p + size - CACHE_KEY_BYTES, CACHE_KEY_BYTES)) {
        snprintf(why, why_size, "its checksum does not match: it is truncated or damaged");
        return -1;
    }
    if (manifest > size - FIXED_BYTES - CACHE_KEY_BYTES || n > size / (8 + CACHE_KEY_BYTES)) {
        snprintf(why, why_size, "its manifest does not fit in it");
        return -1;
    }
    cache_entry *out = calloc(n ? n : 1, sizeof *out);
    if (!out) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    const char *line = (const char *)p + FIXED_BYTES, *manifest_end = line + manifest;
    const uint8_t *at = p + FIXED_BYTES + manifest, *end = p + size - CACHE_KEY_BYTES;
    uint64_t i = 0;
    for (; i < n; i++) {
        cache_key key;
        uint64_t bytes;
        char hex[CACHE_HEX_CHARS + 1] = "?", reason[512];
        const char *listed_line;
        size_t listed_len;
        bool listed = manifest_entry(&line, manifest_end, &key, &bytes, &listed_line, &listed_len);
        if (listed)
            cache_key_hex(&key, hex);
        if (!listed || end - at < 8 || get_u64(at, 8) != bytes || bytes > (uint64_t)(end - at - 8)) {
            snprintf(why, why_size, "entry %llu (%s) does not match the manifest", (unsigned long long)i, hex);
            break;
        }
        if (cache_entry_decode(at + 8, bytes, &key, &out[i], reason, sizeof reason) < 0) {
            snprintf(why, why_size, "entry %llu (%s) is damaged: %s", (unsigned long long)i, hex, reason);
            break;
        }
        if (!line_matches(listed_line, listed_len, &out[i], bytes)) {
            cache_entry_free(&out[i]);
            snprintf(why, why_size, "entry %llu (%s) is not what the manifest says", (unsigned long long)i, hex);
            break;
        }
        at += 8 + bytes;
    }
    if (i == n && (at != end || line != manifest_end)) {
        snprintf(why, why_size, "it holds more than its manifest lists");
        i = n + 1;
    }
    if (i != n) {
        for (uint64_t j = 0; j < n && j < i; j++)
            cache_entry_free(&out[j]);
        free(out);
        return -1;
    }
    *entries = out;
    *n_entries = (int)n;
    return 0;
}

/* The size the header and manifest read from fd declare for the whole
 * bundle (file_size bytes): 0 with *declared, or -1 with why. */
static int declared_size(int fd, uint64_t file_size, uint64_t *declared, char *why, size_t why_size)
{
    uint8_t header[FIXED_BYTES];
    ssize_t got = core_pread_full(fd, header, sizeof header, 0);
    if (got < 0) {
        snprintf(why, why_size, "cannot read it: %s", strerror(errno));
        return -1;
    }
    if (got < FIXED_BYTES || file_size < FIXED_BYTES + CACHE_KEY_BYTES || memcmp(header, MAGIC, 8)) {
        snprintf(why, why_size, "it is not a kiln bundle");
        return -1;
    }
    uint64_t version = get_u64(header + 8, 4), n = get_u64(header + 12, 4), manifest = get_u64(header + 16, 8);
    if (version != BUNDLE_VERSION) {
        snprintf(why, why_size, "it has bundle version %llu, not %d", (unsigned long long)version, BUNDLE_VERSION);
        return -1;
    }
    /* Each manifest line holds at least a key, a tab and a newline. */
    if (manifest > file_size - FIXED_BYTES - CACHE_KEY_BYTES || n > manifest / (CACHE_HEX_CHARS + 2)) {
        snprintf(why, why_size, "its manifest does not fit in it");
        return -1;
    }
    char *text = malloc(manifest ? manifest : 1);
    if (!text || core_pread_full(fd, text, manifest, FIXED_BYTES) != (ssize_t)manifest) {
        snprintf(why, why_size, text ? "cannot read its manifest" : "out of memory");
        free(text);
        return -1;
    }
    *declared = FIXED_BYTES + manifest + CACHE_KEY_BYTES;
    const char *at = text, *end = text + manifest;
    bool ok = true;
    for (uint64_t i = 0; ok && i < n; i++) {
        cache_key key;
        uint64_t bytes;
        const char *line;
        size_t len;
        ok = manifest_entry(&at, end, &key, &bytes, &line, &len) && bytes <= file_size &&
             (*declared += 8 + bytes) <= file_size;
    }
    free(text);
    if (!ok || *declared != file_size) {
        snprintf(why, why_size, "it is %llu bytes, and its manifest does not account for them",
                 (unsigned long long)file_size);
        return -1;
    }
    return 0;
}

int cache_bundle_read(const char *path, void **bytes, size_t *size, char *why, size_t why_size)
{
    *bytes = NULL;
    struct stat st;
    int fd = core_open_regular(path, &st);
    if (fd < 0) {
        if (st.st_mode)
            snprintf(why, why_size, "it is %s, not a bundle", core_file_kind(st.st_mode));
        else
            snprintf(why, why_size, "cannot open it: %s", strerror(errno));
        return -1;
    }
    uint64_t declared;
    int status = declared_size(fd, (uint64_t)st.st_size, &declared, why, why_size);
    if (status == 0 && !(*bytes = malloc(declared))) {
        snprintf(why, why_size, "out of memory for its %llu bytes", (unsigned long long)declared);
        status = -1;
    }
    if (status == 0 && core_pread_full(fd, *bytes, declared, 0) != (ssize_t)declared) {
        snprintf(why, why_size, "cannot read it whole");
        status = -1;
    }
    if (status == 0)
        *size = declared;
    else {
        free(*bytes);
        *bytes = NULL;
    }
    close(fd);
    return status;
}
