/* Cache entries on disk.
 *
 * An entry file: a fixed header (magic, format version, metadata length, key,
 * payload length, SHA-256 of metadata and payload), the metadata as text
 * lines, then the payload. Integers are little-endian. A reader checks all of
 * it before the payload is used, so a truncated, bit-flipped or foreign file
 * is rejected and removed, never loaded; its header is checked against the
 * file's size before the rest is read. Writers write a temporary file in the
 * same directory and rename it into place: a killed writer leaves only a
 * temporary file, and racing writers of one key each install a whole entry.
 * Last use is the file's modification time, refreshed on each hit.
 *
 * Entries are native code kiln runs, so the directory they come from, and
 * every directory above it up to the user's home (or the root the user
 * named), must be the user's own and writable by no one else; else the disk
 * cache is not used at all. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "core/core.h"

static const char MAGIC[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '\n'};

enum {
    HEADER_BYTES = 8 + 4 + 4 + CACHE_KEY_BYTES + 8 + CACHE_KEY_BYTES,
    META_MAX = 8192,
    STALE_TEMP_SECONDS = 3600,
};
static const int64_t DEFAULT_MAX_BYTES = INT64_C(1) << 30;

/* -- Configuration --------------------------------------------------------- */

int cache_dir_of_root(const char *root, char *dir, size_t size)
{
    char version[16];
    size_t root_len = strlen(root), len = (size_t)snprintf(version, sizeof version, "/%d", CACHE_FORMAT_VERSION);
    if (root_len + len >= size)
        return -1;
    memcpy(dir, root, root_len);
    memcpy(dir + root_len, version, len + 1);
    return 0;
}

int cache_root_from_env(char *root, char *anchor, size_t size, char *why, size_t why_size)
{
    const char *dir = getenv("KILN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    const char *name = "KILN_CACHE_DIR", *base = dir, *rest = "";
    if (!(dir && *dir)) {
        bool use_xdg = xdg && *xdg;
        name = use_xdg ? "XDG_CACHE_HOME" : "HOME";
        base = use_xdg ? xdg : home;
        rest = use_xdg ? "/kiln" : "/.cache/kiln";
    }
    if (!(base && *base)) {
        snprintf(why, why_size, "HOME is not set, nor is KILN_CACHE_DIR or XDG_CACHE_HOME");
        return -1;
    }
    /* The longest base whose "<base><rest>/<format version>" fits. */
    size_t most = size - 1 - strlen(rest) - 2;
    if (strlen(base) > most) {
        snprintf(why, why_size, "%s is %zu characters long, more than the %zu a cache directory may have", name,
                 strlen(base), most);
        return -1;
    }
    snprintf(anchor, size, "%s", base);
    snprintf(root, size, "%s%s", base, rest);
    return 0;
}

/* Whether what path's status st describes is a directory only the user can
 * change; why says why not. */
static bool private_dir(const char *path, const struct stat *st, char *why, size_t why_size)
{
    unsigned mode = (unsigned)st->st_mode & 07777;
    if (!S_ISDIR(st->st_mode))
        snprintf(why, why_size, "%s is %s, not a directory", path, core_file_kind(st->st_mode));
    else if (st->st_uid != geteuid())
        snprintf(why, why_size, "%s is owned by user %u, not by you (user %u)", path, (unsigned)st->st_uid,
                 (unsigned)geteuid());
    else if (mode & 022)
        snprintf(why, why_size, "%s is writable by %s (mode %04o)", path,
                 (mode & 022) == 022 ? "its group and others" : mode & 020 ? "its group" : "others", mode);
    else
        return true;
    return false;
}

/* path's parent, in place (textually); false when path is "/" or ".". */
static bool to_parent(char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    if (n == 1 && (path[0] == '/' || path[0] == '.'))
        return false;
    while (n > 0 && path[n - 1] != '/')
        n--;
    while (n > 1 && path[n - 1] == '/')
        n--;
    if (n == 0)
        snprintf(path, 2, ".");
    else
        path[n] = '\0';
    return true;
}

/* A missing anchor: whether no one else can create it, in the nearest
 * directory above it that exists (owned by the user or root, and writable
 * by neither its group nor others). */
static bool only_user_can_create(const char *anchor, char *why, size_t why_size)
{
    char path[CACHE_PATH_MAX];
    snprintf(path, sizeof path, "%s", anchor);
    struct stat st;
    while (to_parent(path) && stat(path, &st) < 0 && errno == ENOENT)
        continue;
    if (stat(path, &st) < 0) {
        snprintf(why, why_size, "cannot check %s: %s", path, strerror(errno));
        return false;
    }
    if ((st.st_uid == geteuid() || st.st_uid == 0) && !(st.st_mode & 022))
        return true;
    snprintf(why, why_size, "%s does not exist, and others can create it in %s", anchor, path);
    return false;
}

bool cache_dir_trusted(const char *anchor, const char *dir, char *why, size_t why_size)
{
    char path[CACHE_PATH_MAX];
    size_t end = strlen(anchor);
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path || strncmp(path, anchor, end)) {
        snprintf(why, why_size, "%.200s is not under %.200s", dir, anchor);
        return false;
    }
    /* From the anchor down: a directory that does not exist yet holds nothing
     * to load, and can only be made by whoever can write the one above. */
    for (;;) {
        char next = path[end];
        path[end] = '\0';
        struct stat st;
        if (stat(path, &st) < 0) {
            if (errno == ENOENT)
                return !strcmp(path, anchor) ? only_user_can_create(anchor, why, why_size) : true;
            snprintf(why, why_size, "cannot check %s: %s", path, strerror(errno));
            return false;
        }
        if (!private_dir(path, &st, why, why_size))
            return false;
        if (!next)
            return true;
        path[end] = next;
        while (path[end] == '/')
            end++;
        while (path[end] && path[end] != '/')
            end++;
    }
}

/* Adds a problem to c's list of them. */
static void add_problem(cache_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_problem(cache_config *c, const char *fmt, ...)
{
    size_t used = strlen(c->problem);
    if (used)
        used += (size_t)snprintf(c->problem + used, sizeof c->problem - used, "; ");
    if (used >= sizeof c->problem)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->problem + used, sizeof c->problem - used, fmt, ap);
    va_end(ap);
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

void cache_settings_from_env(cache_config *c)
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
            add_problem(c, "KILN_CACHE=%.64s is not off, on, readonly or require; using on", mode);
        else
            c->mode = (cache_mode)found;
    }
    const char *max = getenv("KILN_CACHE_MAX_BYTES");
    if (max && *max) {
        char *end;
        long long v = strtoll(max, &end, 10);
        if (*end || v < 0)
            add_problem(c, "KILN_CACHE_MAX_BYTES=%.64s is not a byte count; using %lld", max,
                        (long long)DEFAULT_MAX_BYTES);
        else
            c->max_bytes = v;
    }
}

void cache_config_from_env(cache_config *c)
{
    cache_settings_from_env(c);
    if (c->mode == CACHE_OFF)
        return;
    char root[CACHE_PATH_MAX], anchor[CACHE_PATH_MAX], why[CACHE_PATH_MAX + 128];
    if (cache_root_from_env(root, anchor, sizeof root, why, sizeof why) < 0) {
        c->mode = CACHE_OFF;
        add_problem(c, "not using the disk cache: %s", why);
        return;
    }
    cache_dir_of_root(root, c->dir, sizeof c->dir);
    /* Made now, so that no one else can make it first. */
    if (c->mode == CACHE_ON)
        make_dirs(c->dir);
    if (!cache_dir_trusted(anchor, c->dir, why, sizeof why)) {
        c->mode = CACHE_OFF;
        add_problem(c, "not using the disk cache: %s, and whoever can change it could run code as you", why);
    }
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

/* Checks an entry's header (its first have bytes) against the size of the
 * file it starts: magic, version, that the lengths it declares add up to
 * file_size, and the key when expect is not NULL. 0, or -1 with why. */
static int check_header(const uint8_t *p, size_t have, uint64_t file_size, const cache_key *expect, char *why,
                        size_t why_size)
{
    if (file_size == 0) {
        snprintf(why, why_size, "it is empty");
        return -1;
    }
    if (have < HEADER_BYTES || file_size < HEADER_BYTES) {
        snprintf(why, why_size, "it is %llu bytes, shorter than a header", (unsigned long long)file_size);
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
    if (meta_len > META_MAX || payload > file_size || HEADER_BYTES + meta_len + payload != file_size) {
        snprintf(why, why_size, "it is %llu bytes, but its header says %llu", (unsigned long long)file_size,
                 (unsigned long long)(HEADER_BYTES + (uint64_t)meta_len + payload));
        return -1;
    }
    if (expect && memcmp(expect->bytes, p + 16, CACHE_KEY_BYTES)) {
        snprintf(why, why_size, "it holds another key");
        return -1;
    }
    return 0;
}

int cache_entry_decode(const void *bytes, size_t size, const cache_key *expect, cache_entry *e, char *why,
                       size_t why_size)
{
    const uint8_t *p = bytes;
    *e = (cache_entry){0};
    if (check_header(p, size, size, expect, why, why_size) < 0)
        return -1;
    uint32_t meta_len = get_u32(p + 12);
    uint64_t payload = get_u64(p + 16 + CACHE_KEY_BYTES);
    memcpy(e->key.bytes, p + 16, CACHE_KEY_BYTES);
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

/* Reads the rest of the regular file on fd from offset done on (st its
 * status) into the malloc'd *bytes, which holds done bytes: 0, or -1 with
 * errno. Shorter if the file shrank meanwhile: decoders reject that. */
static int read_rest(int fd, const struct stat *st, size_t done, void **bytes, size_t *size)
{
    *size = (size_t)st->st_size;
    void *grown = realloc(*bytes, *size > done ? *size : done + 1);
    if (!grown)
        return -1;
    *bytes = grown;
    ssize_t got = core_pread_full(fd, (char *)*bytes + done, *size > done ? *size - done : 0, (off_t)done);
    if (got < 0)
        return -1;
    *size = done + (size_t)got;
    return 0;
}

int cache_read_file(const char *path, void **bytes, size_t *size)
{
    struct stat st;
    int fd = core_open_regular(path, &st);
    if (fd < 0)
        return -1;
    *bytes = NULL;
    int status = read_rest(fd, &st, 0, bytes, size);
    int saved = errno;
    if (status < 0) {
        free(*bytes);
        *bytes = NULL;
    }
    close(fd);
    errno = saved;
    return status;
}

/* Opens an entry file: CACHE_FOUND with *fd and *st, CACHE_ABSENT, or
 * CACHE_UNREADABLE with why (what is there is no regular file, or cannot be
 * opened). A FIFO or a device is never waited on. */
static int open_entry(const char *path, int *fd, struct stat *st, char *why, size_t why_size)
{
    if ((*fd = core_open_regular(path, st)) >= 0)
        return CACHE_FOUND;
    if (st->st_mode) {
        snprintf(why, why_size, "%s is %s, not an entry file", path, core_file_kind(st->st_mode));
        return CACHE_UNREADABLE;
    }
    if (errno == ENOENT || errno == ENOTDIR)
        return CACHE_ABSENT;
    snprintf(why, why_size, "cannot open %s: %s", path, strerror(errno));
    return CACHE_UNREADABLE;
}

/* Reads the entry file open on fd: its header first, checked against the
 * file's size, then only the bytes that header declares. CACHE_FOUND with
 * *bytes malloc'd (not yet checked beyond the header), CACHE_DAMAGED or
 * CACHE_UNREADABLE with why. */
static int read_entry(int fd, const struct stat *st, const char *path, const cache_key *expect, void **bytes,
                      size_t *size, char *why, size_t why_size)
{
    *bytes = malloc(HEADER_BYTES);
    ssize_t got = *bytes ? core_pread_full(fd, *bytes, HEADER_BYTES, 0) : -1;
    char reason[256];
    int status = CACHE_FOUND;
    if (got < 0) {
        snprintf(why, why_size, "cannot read %s: %s", path, strerror(errno));
        status = CACHE_UNREADABLE;
    } else if (check_header(*bytes, (size_t)got, (uint64_t)st->st_size, expect, reason, sizeof reason) < 0) {
        snprintf(why, why_size, "%s: %s", path, reason);
        status = CACHE_DAMAGED;
    } else if (read_rest(fd, st, (size_t)got, bytes, size) < 0) {
        snprintf(why, why_size, "cannot read %s: %s", path, strerror(errno));
        status = CACHE_UNREADABLE;
    }
    if (status != CACHE_FOUND) {
        free(*bytes);
        *bytes = NULL;
    }
    return status;
}

int cache_entry_read(const char *path, const cache_key *expect, void **bytes, size_t *size, char *why,
                     size_t why_size)
{
    int fd;
    struct stat st;
    *bytes = NULL;
    int status = open_entry(path, &fd, &st, why, why_size);
    if (status != CACHE_FOUND)
        return status;
    status = read_entry(fd, &st, path, expect, bytes, size, why, why_size);
    close(fd);
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
    int fd;
    struct stat st;
    int status = open_entry(path, &fd, &st, why, why_size);
    if (status != CACHE_FOUND)
        return status;
    void *bytes = NULL;
    size_t size = 0;
    char reason[256];
    status = read_entry(fd, &st, path, key, &bytes, &size, why, why_size);
    if (status == CACHE_FOUND && (cache_entry_decode(bytes, size, key, e, reason, sizeof reason) < 0 ||
                                  (!as_expected(e, expect, reason, sizeof reason) && (cache_entry_free(e), true)))) {
        snprintf(why, why_size, "%s: %s", path, reason);
        status = CACHE_DAMAGED;
    }
    if (status == CACHE_DAMAGED && writable)
        remove_if_same(path, fd);
    else if (status == CACHE_FOUND && writable)
        futimens(fd, NULL); /* last use, for eviction */
    free(bytes);
    close(fd);
    return status;
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
    char path[CACHE_PATH_MAX + 80];
    cache_entry_path(dir, &e->key, path, sizeof path);
    bool made = make_dirs(dir) == 0;
    int status = made ? core_write_file(path, bytes, size, 0600) : -1;
    int saved = errno;
    if (status < 0)
        snprintf(why, why_size, "cannot write %s: %s", made ? path : dir, strerror(saved));
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
        if (stat(path, &st) < 0)
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
        bool regular = S_ISREG(st.st_mode);
        *f = (cache_file){.bytes = regular ? st.st_size : 0, .last_use = st.st_mtime, .mode = st.st_mode};
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
        if (!strncmp(ent->d_name, ".tmp-", 5) && lstat(path, &st) == 0 &&
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
        if (S_ISREG(files[i].mode) && (unlink(path) == 0 || errno == ENOENT)) {
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

/* The stats file's text for counts h and m: its length. */
static int counts_text(char *text, size_t size, int64_t h, int64_t m)
{
    return snprintf(text, size, "hits %lld\nmisses %lld\n", (long long)h, (long long)m);
}

/* Adds to the counts in the stats file at path in place: false where that
 * file is not this user's plain regular file (missing, a link planted there,
 * a second name of another file), which is then replaced instead. In place
 * costs a disk hit no file creation and rename. */
static bool count_in_place(const char *path, int64_t hits, int64_t misses)
{
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat st;
    char text[128] = "";
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid()) {
        close(fd);
        return false;
    }
    ssize_t got = core_pread_full(fd, text, sizeof text - 1, 0);
    text[got > 0 ? got : 0] = '\0';
    int64_t h = 0, m = 0;
    parse_counts(text, &h, &m);
    int len = counts_text(text, sizeof text, h + hits, m + misses);
    if (pwrite(fd, text, (size_t)len, 0) == len)
        (void)ftruncate(fd, len);
    close(fd);
    return true;
}

/* Counters are rewritten whole, under a lock on the directory; a stats file
 * that is not a plain file of this user's is replaced, never written
 * through, so a link planted there is replaced too. */
void cache_count(const char *dir, int64_t hits, int64_t misses)
{
    int lock = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock < 0)
        return;
    if (flock(lock, LOCK_EX) == 0) {
        char path[CACHE_PATH_MAX + 16], text[128];
        snprintf(path, sizeof path, "%s/stats", dir);
        if (!count_in_place(path, hits, misses)) {
            int64_t h, m;
            cache_counts_read(dir, &h, &m);
            int len = counts_text(text, sizeof text, h + hits, m + misses);
            (void)core_write_file(path, text, (size_t)len, 0600); /* counts are worth no warning */
        }
        flock(lock, LOCK_UN);
    }
    close(lock);
}

void cache_counts_read(const char *dir, int64_t *hits, int64_t *misses)
{
    char path[CACHE_PATH_MAX + 16], text[128] = "";
    snprintf(path, sizeof path, "%s/stats", dir);
    *hits = *misses = 0;
    struct stat st;
    int fd = core_open_regular(path, &st);
    if (fd < 0)
        return;
    ssize_t got = core_pread_full(fd, text, sizeof text - 1, 0);
    close(fd);
    text[got > 0 ? got : 0] = '\0';
    parse_counts(text, hits, misses);
}
