/* Cache entries on disk.
 *
 * An entry file: a fixed header (magic, format version, metadata length, key,
 * payload length, SHA-256 of metadata and payload), the metadata as text
 * lines, then the payload. Integers are little-endian. A reader checks all of
 * it before the payload is used, so a truncated, bit-flipped or foreign file
 * is rejected and removed, never loaded. Writers write a temporary file in
 * the same directory and rename it into place: a killed writer leaves only a
 * temporary file, and racing writers of one key each install a whole entry.
 * Last use is the file's modification time, refreshed on each hit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"

static const char MAGIC[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '\n'};

enum {
    HEADER_BYTES = 8 + 4 + 4 + CACHE_KEY_BYTES + 8 + CACHE_KEY_BYTES,
    META_MAX = 8192,
    STALE_TEMP_SECONDS = 3600,
};
static const int64_t DEFAULT_MAX_BYTES = INT64_C(1) << 30;

/* -- Configuration --------------------------------------------------------- */

void cache_dir_of_root(const char *root, char *dir, size_t size)
{
    snprintf(dir, size, "%.1000s/%d", root, CACHE_FORMAT_VERSION);
}

void cache_config_from_env(cache_config *c)
{
    *c = (cache_config){.mode = CACHE_ON, .max_bytes = DEFAULT_MAX_BYTES};
    const char *mode = getenv("KILN_CACHE");
    static const char *const names[] = {"off", "on", "readonly", "require"};
    if (mode && *mode) {
        int found = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(mode, names[i]))
                found = i;
        if (found < 0)
            snprintf(c->problem, sizeof c->problem, "KILN_CACHE=%.64s is not off, on, readonly or require; using on",
                     mode);
        else
            c->mode = (cache_mode)found;
    }
    const char *max = getenv("KILN_CACHE_MAX_BYTES");
    if (max && *max) {
        char *end;
        long long v = strtoll(max, &end, 10);
        if (*end || v < 0)
            snprintf(c->problem, sizeof c->problem, "KILN_CACHE_MAX_BYTES=%.64s is not a byte count; using %lld",
                     max, (long long)DEFAULT_MAX_BYTES);
        else
            c->max_bytes = v;
    }
    char root[CACHE_PATH_MAX];
    const char *dir = getenv("KILN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (dir && *dir)
        snprintf(root, sizeof root, "%s", dir);
    else if (xdg && *xdg)
        snprintf(root, sizeof root, "%s/kiln", xdg);
    else
        snprintf(root, sizeof root, "%s/.cache/kiln", home && *home ? home : "/tmp");
    cache_dir_of_root(root, c->dir, sizeof c->dir);
}

/* -- Encoding -------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int meta_text(const cache_meta *m, char *out, size_t size)
{
    return snprintf(out, size, "backend=%s\ntarget=%s\nsymbol=%s\nfunction=%s\nsignature=%s\ncreated=%lld\n",
                    m->backend, m->target, m->symbol, m->function, m->signature, (long long)m->created);
}

/* Copies value (up to the end of its line) into field; false when too long. */
static bool take_field(const char *value, size_t len, char *field, size_t size)
{
    if (len >= size)
        return false;
    memcpy(field, value, len);
    field[len] = '\0';
    return true;
}

static bool parse_meta(const char *text, size_t n, cache_meta *m)
{
    *m = (cache_meta){0};
    int seen = 0;
    for (const char *line = text, *end = text + n; line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line)), *eq = memchr(line, '=', (size_t)(end - line));
        if (!nl || !eq || eq > nl)
            return false;
        size_t key = (size_t)(eq - line), len = (size_t)(nl - eq - 1);
        const char *v = eq + 1;
        bool ok = true;
        if (key == 7 && !memcmp(line, "backend", 7))
            ok = take_field(v, len, m->backend, sizeof m->backend), seen |= 1;
        else if (key == 6 && !memcmp(line, "target", 6))
            ok = take_field(v, len, m->target, sizeof m->target), seen |= 2;
        else if (key == 6 && !memcmp(line, "symbol", 6))
            ok = take_field(v, len, m->symbol, sizeof m->symbol), seen |= 4;
        else if (key == 8 && !memcmp(line, "function", 8))
            ok = take_field(v, len, m->function, sizeof m->function);
        else if (key == 9 && !memcmp(line, "signature", 9))
            ok = take_field(v, len, m->signature, sizeof m->signature);
        else if (key == 7 && !memcmp(line, "created", 7)) {
            char number[24];
            ok = take_field(v, len, number, sizeof number);
            m->created = ok ? strtoll(number, NULL, 10) : 0;
        }
        if (!ok)
            return false;
        line = nl + 1;
    }
    return seen == 7;
}

void cache_entry_free(cache_entry *e)
{
    free(e->payload);
    e->payload = NULL;
}

void *cache_entry_encode(const cache_entry *e, size_t *size)
{
    char meta[META_MAX];
    int meta_len = meta_text(&e->meta, meta, sizeof meta);
    if (meta_len < 0 || meta_len >= META_MAX)
        return NULL;
    *size = HEADER_BYTES + (size_t)meta_len + e->payload_bytes;
    uint8_t *out = malloc(*size);
    if (!out)
        return NULL;
    memcpy(out, MAGIC, 8);
    put_u32(out + 8, CACHE_FORMAT_VERSION);
    put_u32(out + 12, (uint32_t)meta_len);
    memcpy(out + 16, e->key.bytes, CACHE_KEY_BYTES);
    put_u64(out + 16 + CACHE_KEY_BYTES, e->payload_bytes);
    memcpy(out + HEADER_BYTES, meta, (size_t)meta_len);
    memcpy(out + HEADER_BYTES + meta_len, e->payload, e->payload_bytes);
    cache_key sum;
    cache_hash(out + HEADER_BYTES, (size_t)meta_len + e->payload_bytes, &sum);
    memcpy(out + 24 + CACHE_KEY_BYTES, sum.bytes, CACHE_KEY_BYTES);
    return out;
}

int cache_entry_decode(const void *bytes, size_t size, const cache_key *expect, cache_entry *e, char *why,
                       size_t why_size)
{
    const uint8_t *p = bytes;
    *e = (cache_entry){0};
    if (size == 0) {
        snprintf(why, why_size, "it is empty");
        return -1;
    }
    if (size < HEADER_BYTES) {
        snprintf(why, why_size, "it is %zu bytes, shorter than a header", size);
        return -1;
    }
    if (memcmp(p, MAGIC, 8)) {
        snprintf(why, why_size, "it does not start with kiln's magic");
        return -1;
    }
    uint32_t version = get_u32(p + 8), meta_len = get_u32(p + 12);
    uint64_t payload = get_u64(p + 16 + CACHE_KEY_BYTES);
    if (version != CACHE_FORMAT_VERSION) {
        snprintf(why, why_size, "it has format version %u, not %d", version, CACHE_FORMAT_VERSION);
        return -1;
    }
    if (meta_len > META_MAX || payload > size || HEADER_BYTES + meta_len + payload != size) {
        snprintf(why, why_size, "it is %zu bytes, but its header says %llu", size,
                 (unsigned long long)(HEADER_BYTES + (uint64_t)meta_len + payload));
        return -1;
    }
    memcpy(e->key.bytes, p + 16, CACHE_KEY_BYTES);
    if (expect && memcmp(expect->bytes, e->key.bytes, CACHE_KEY_BYTES)) {
        snprintf(why, why_size, "it holds another key");
        return -1;
    }
    cache_key sum;
    cache_hash(p + HEADER_BYTES, meta_len + payload, &sum);
    if (memcmp(sum.bytes, p + 24 + CACHE_KEY_BYTES, CACHE_KEY_BYTES)) {
        snprintf(why, why_size, "its checksum does not match its contents");
        return -1;
    }
    if (!parse_meta((const char *)p + HEADER_BYTES, meta_len, &e->meta)) {
        snprintf(why, why_size, "its metadata is malformed");
        return -1;
    }
    e->payload_bytes = payload;
    e->payload = malloc(payload ? payload : 1);
    if (!e->payload) {
        snprintf(why, why_size, "out of memory reading it");
        return -1;
    }
    memcpy(e->payload, p + HEADER_BYTES + meta_len, payload);
    return 0;
}

/* -- Files ----------------------------------------------------------------- */

void cache_entry_path(const char *dir, const cache_key *key, char *path, size_t size)
{
    char hex[CACHE_HEX_CHARS + 1];
    cache_key_hex(key, hex);
    snprintf(path, size, "%s/%s.kiln", dir, hex);
}

static int read_fd(int fd, void **bytes, size_t *size)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -1;
    *size = (size_t)st.st_size;
    *bytes = malloc(*size ? *size : 1);
    if (!*bytes)
        return -1;
    size_t done = 0;
    while (done < *size) {
        ssize_t got = read(fd, (char *)*bytes + done, *size - done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        done += (size_t)got;
    }
    *size = done; /* shorter if the file shrank: the decoder rejects it */
    return 0;
}

int cache_read_file(const char *path, void **bytes, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int status = read_fd(fd, bytes, size);
    int saved = errno;
    close(fd);
    errno = saved;
    return status;
}

/* Removes path only if it is still the file fd reads: another process may
 * have renamed a sound entry into place meanwhile. */
static void remove_if_same(const char *path, int fd)
{
    struct stat open_st, path_st;
    if (fstat(fd, &open_st) == 0 && stat(path, &path_st) == 0 && open_st.st_ino == path_st.st_ino &&
        open_st.st_dev == path_st.st_dev)
        unlink(path);
}

/* Whether e is what the reader expects (backend, target, symbol), or why not. */
static bool as_expected(const cache_entry *e, const cache_meta *expect, char *why, size_t why_size)
{
    if (!expect || (!strcmp(e->meta.backend, expect->backend) && !strcmp(e->meta.target, expect->target) &&
                    !strcmp(e->meta.symbol, expect->symbol)))
        return true;
    snprintf(why, why_size, "it was built for another backend, target or entry point");
    return false;
}

int cache_read(const char *dir, const cache_key *key, const cache_meta *expect, bool writable, cache_entry *e,
               char *why, size_t why_size)
{
    char path[CACHE_PATH_MAX + 80];
    cache_entry_path(dir, key, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return CACHE_ABSENT;
        snprintf(why, why_size, "cannot open %s: %s", path, strerror(errno));
        return CACHE_UNREADABLE;
    }
    void *bytes = NULL;
    size_t size = 0;
    int status = CACHE_FOUND;
    char reason[256];
    if (read_fd(fd, &bytes, &size) < 0) {
        snprintf(why, why_size, "cannot read %s: %s", path, strerror(errno));
        status = CACHE_UNREADABLE;
    } else if (cache_entry_decode(bytes, size, key, e, reason, sizeof reason) < 0 ||
               (!as_expected(e, expect, reason, sizeof reason) && (cache_entry_free(e), true))) {
        snprintf(why, why_size, "%s: %s", path, reason);
        if (writable)
            remove_if_same(path, fd);
        status = CACHE_DAMAGED;
    } else if (writable) {
        futimens(fd, NULL); /* last use, for eviction */
    }
    free(bytes);
    close(fd);
    return status;
}

/* mkdir -p with mode 0700 for what it creates. */
static int make_dirs(const char *dir)
{
    char path[CACHE_PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0700) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(path, 0700) < 0 && errno != EEXIST ? -1 : 0;
}

static int write_all(int fd, const void *bytes, size_t size)
{
    for (size_t done = 0; done < size;) {
        ssize_t put = write(fd, (const char *)bytes + done, size - done);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0) {
            if (put == 0)
                errno = ENOSPC;
            return -1;
        }
        done += (size_t)put;
    }
    return 0;
}

int cache_write(const char *dir, const cache_entry *e, char *why, size_t why_size)
{
    size_t size;
    void *bytes = cache_entry_encode(e, &size);
    if (!bytes) {
        errno = ENOMEM;
        snprintf(why, why_size, "out of memory encoding an entry");
        return -1;
    }
    char temp[CACHE_PATH_MAX + 80], path[CACHE_PATH_MAX + 80];
    static unsigned counter;
    snprintf(temp, sizeof temp, "%s/.tmp-%ld-%u-%lx", dir, (long)getpid(),
             __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED), (unsigned long)time(NULL));
    cache_entry_path(dir, &e->key, path, sizeof path);
    int fd = make_dirs(dir) < 0 ? -1 : open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int status = fd < 0 ? -1 : write_all(fd, bytes, size);
    int saved = errno;
    if (fd >= 0 && close(fd) < 0 && status == 0) {
        status = -1;
        saved = errno;
    }
    if (status == 0 && rename(temp, path) < 0) {
        status = -1;
        saved = errno;
    }
    if (status < 0) {
        if (fd >= 0)
            unlink(temp);
        snprintf(why, why_size, "cannot write %s: %s", fd < 0 ? dir : path, strerror(saved));
    }
    free(bytes);
    errno = saved;
    return status;
}

/* -- Listing and eviction -------------------------------------------------- */

static int newest_first(const void *a, const void *b)
{
    const cache_file *x = a, *y = b;
    return x->last_use != y->last_use ? (x->last_use < y->last_use ? 1 : -1) : strcmp(x->name, y->name);
}

int cache_list(const char *dir, cache_file **files, int *n)
{
    *files = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int cap = 0;
    for (struct dirent *ent; (ent = readdir(d));) {
        size_t len = strlen(ent->d_name);
        if (len < 6 || strcmp(ent->d_name + len - 5, ".kiln") || len >= sizeof(*files)->name)
            continue;
        char path[CACHE_PATH_MAX + 300];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (stat(path, &st) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            cache_file *grown = realloc(*files, (size_t)cap * sizeof *grown);
            if (!grown) {
                closedir(d);
                free(*files);
                *files = NULL;
                errno = ENOMEM;
                return -1;
            }
            *files = grown;
        }
        cache_file *f = &(*files)[(*n)++];
        *f = (cache_file){.bytes = st.st_size, .last_use = st.st_mtime};
        snprintf(f->name, sizeof f->name, "%s", ent->d_name);
        char hex[CACHE_HEX_CHARS + 1];
        snprintf(hex, sizeof hex, "%.*s", (int)(len - 5), ent->d_name);
        f->keyed = len - 5 == CACHE_HEX_CHARS && cache_key_parse(hex, &f->key);
    }
    closedir(d);
    if (*n > 1)
        qsort(*files, (size_t)*n, sizeof **files, newest_first);
    return 0;
}

static void remove_stale_temps(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *ent; d && (ent = readdir(d));) {
        char path[CACHE_PATH_MAX + 300];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        if (!strncmp(ent->d_name, ".tmp-", 5) && stat(path, &st) == 0 &&
            st.st_mtime < time(NULL) - STALE_TEMP_SECONDS)
            unlink(path);
    }
    if (d)
        closedir(d);
}

int cache_evict(const char *dir, int64_t max_bytes, int64_t *kept)
{
    remove_stale_temps(dir);
    cache_file *files;
    int n, removed = 0;
    if (kept)
        *kept = -1;
    if (cache_list(dir, &files, &n) < 0)
        return 0;
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += files[i].bytes;
    for (int i = n - 1; i >= 0 && total > max_bytes; i--) {
        char path[CACHE_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        if (unlink(path) == 0 || errno == ENOENT) {
            total -= files[i].bytes;
            removed++;
        }
    }
    free(files);
    if (kept)
        *kept = total;
    return removed;
}

/* -- Hit and miss counts --------------------------------------------------- */

static void parse_counts(const char *text, int64_t *hits, int64_t *misses)
{
    long long h = 0, m = 0;
    if (sscanf(text, "hits %lld\nmisses %lld", &h, &m) == 2 && h >= 0 && m >= 0) {
        *hits = h;
        *misses = m;
    }
}

void cache_count(const char *dir, int64_t hits, int64_t misses)
{
    char path[CACHE_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/stats", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_EX) == 0) {
        char text[128] = "";
        ssize_t got = pread(fd, text, sizeof text - 1, 0);
        int64_t h = 0, m = 0;
        if (got > 0) {
            text[got] = '\0';
            parse_counts(text, &h, &m);
        }
        int len = snprintf(text, sizeof text, "hits %lld\nmisses %lld\n", (long long)(h + hits),
                           (long long)(m + misses));
        if (pwrite(fd, text, (size_t)len, 0) == len)
            (void)ftruncate(fd, len);
        flock(fd, LOCK_UN);
    }
    close(fd);
}

void cache_counts_read(const char *dir, int64_t *hits, int64_t *misses)
{
    char path[CACHE_PATH_MAX + 16], text[128] = "";
    snprintf(path, sizeof path, "%s/stats", dir);
    *hits = *misses = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    fclose(f);
    parse_counts(text, hits, misses);
}
