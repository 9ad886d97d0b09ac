/* The compiled-artifact cache: keys, entries on disk, bundles, and the kernels
 * loaded in this process. What other modules may use of src/cache.
 *
 * A key is a SHA-256 over named components (the kernel's canonical text, the
 * backend, the target, versions, options): anything that changes generated
 * code belongs in it. An entry is one file, <dir>/<format>/<key>.kiln, with a
 * header that lets a reader reject anything damaged before using it. */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    CACHE_KEY_BYTES = 32,
    CACHE_HEX_CHARS = 2 * CACHE_KEY_BYTES,
    CACHE_FORMAT_VERSION = 1,
    CACHE_PATH_MAX = 1024,
};

typedef struct {
    uint8_t bytes[CACHE_KEY_BYTES];
} cache_key;

typedef struct {
    const char *name;
    const char *text;
} cache_component;

/* -- key.c ----------------------------------------------------------------- */

/* The SHA-256 of n bytes. */
void cache_hash(const void *data, size_t n, cache_key *out);
/* The key of n components: the hash of each component's name and hash, in
 * order. hashes (n of them, may be NULL) receives each component's own. */
void cache_key_of(const cache_component *c, int n, cache_key *key, cache_key *hashes);
/* Lower-case hex; hex holds CACHE_HEX_CHARS + 1. */
void cache_key_hex(const cache_key *k, char *hex);
/* Parses a full hex key; false when s is not one. */
bool cache_key_parse(const char *s, cache_key *k);

/* -- store.c: entries on disk ---------------------------------------------- */

/* What an entry says about itself: checked on load, listed by kiln-cache. */
typedef struct {
    char backend[16];     /* "llvm" */
    char target[4400];    /* the backend's target id */
    char symbol[96];      /* the entry point in the object code */
    char function[64];    /* the marked function that first produced it */
    char signature[512];  /* and its input signature */
    int64_t created;      /* seconds since the epoch */
} cache_meta;

typedef struct {
    cache_key key;
    cache_meta meta;
    void *payload;        /* malloc'd object code */
    size_t payload_bytes;
} cache_entry;

typedef enum { CACHE_OFF, CACHE_ON, CACHE_READONLY, CACHE_REQUIRE } cache_mode;

typedef struct {
    cache_mode mode;
    char dir[CACHE_PATH_MAX]; /* $KILN_CACHE_DIR/<format version>; "" when off */
    int64_t max_bytes;
    char problem[CACHE_PATH_MAX + 512]; /* malformed variables, an untrusted directory; or "" */
} cache_config;

/* The cache as the environment sets it: KILN_CACHE, KILN_CACHE_DIR (else
 * $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln), KILN_CACHE_MAX_BYTES. In
 * mode on, creates the directory (0700) so that no one else can first. Mode
 * is off, with the reason in problem, when there is no such directory (no
 * HOME, a path too long) or cache_dir_trusted refuses it. */
void cache_config_from_env(cache_config *c);
/* Only the mode and max_bytes the variables set (dir ""), touching nothing. */
void cache_settings_from_env(cache_config *c);
/* The cache root the environment names, and its anchor: the directory the
 * variable that names it holds (KILN_CACHE_DIR, XDG_CACHE_HOME or HOME),
 * both of size bytes. -1 with why when none is set or it is too long. */
int cache_root_from_env(char *root, char *anchor, size_t size, char *why, size_t why_size);
/* The directory of format-version entries under a cache root; -1 when it
 * does not fit in size. */
int cache_dir_of_root(const char *root, char *dir, size_t size);
/* Whether kiln may load code from dir: dir and every directory above it up
 * to anchor (a prefix of dir) that exist are directories owned by the
 * effective user and writable by neither group nor others, and if anchor does
 * not exist, no one else can create it. why says why not. */
bool cache_dir_trusted(const char *anchor, const char *dir, char *why, size_t why_size);

void cache_entry_free(cache_entry *e);
/* Encodes e as an entry file's bytes, malloc'd; NULL when out of memory. */
void *cache_entry_encode(const cache_entry *e, size_t *size);
/* Decodes and checks an entry file's bytes (header, lengths, checksum, and
 * the key when expect is not NULL): 0, or -1 with the reason in why. */
int cache_entry_decode(const void *bytes, size_t size, const cache_key *expect, cache_entry *e, char *why,
                       size_t why_size);

/* The path of key's entry in dir. */
void cache_entry_path(const char *dir, const cache_key *key, char *path, size_t size);
enum { CACHE_FOUND = 1, CACHE_ABSENT = 0, CACHE_DAMAGED = -1, CACHE_UNREADABLE = -2 };

/* Reads the entry file at path, its header first: only when that header
 * (and the key, when expect is not NULL) matches the file's size are the
 * bytes it declares read, into malloc'd *bytes (checksum not yet checked).
 * CACHE_FOUND, CACHE_ABSENT, CACHE_DAMAGED or CACHE_UNREADABLE (a FIFO or
 * other file that is not regular is never waited on) with why. */
int cache_entry_read(const char *path, const cache_key *expect, void **bytes, size_t *size, char *why,
                     size_t why_size);
/* Reads key's entry, checking it against expect (backend, target and symbol;
 * NULL checks none): CACHE_FOUND (sound), CACHE_ABSENT, CACHE_DAMAGED (why
 * says how) or CACHE_UNREADABLE (why says why). Unless writable is false, a
 * hit refreshes the entry's last use and a damaged file is removed, if it is
 * still the one read. */
int cache_read(const char *dir, const cache_key *key, const cache_meta *expect, bool writable, cache_entry *e,
               char *why, size_t why_size);
/* Installs e atomically (core_write_file), creating dir 0700 if needed. 0,
 * or -1 with errno kept and the reason in why. */
int cache_write(const char *dir, const cache_entry *e, char *why, size_t why_size);
/* Removes least recently used entries until dir holds at most max_bytes, and
 * temporary files that writers left behind long ago; files that are not
 * regular are left alone. Entries removed; *kept (when not NULL) the bytes
 * of entries left, -1 when dir cannot be listed. */
int cache_evict(const char *dir, int64_t max_bytes, int64_t *kept);

typedef struct {
    char name[CACHE_HEX_CHARS + 8];
    cache_key key;        /* from the name; zero when the name is not a key */
    bool keyed;
    int64_t bytes;
    int64_t last_use;     /* seconds since the epoch */
    unsigned mode;        /* st_mode: files named like entries that are not regular are listed, to be reported */
} cache_file;

/* The files in dir named like entries, most recently used first, malloc'd
 * (free it). -1 when dir cannot be read (errno kept). */
int cache_list(const char *dir, cache_file **files, int *n);
/* Reads a whole regular file into malloc'd memory; -1 with errno on failure
 * (EINVAL when it is not a regular file). */
int cache_read_file(const char *path, void **bytes, size_t *size);

/* Counts disk hits and misses across processes, in dir's "stats" file
 * (replaced whole, under a lock on dir). */
void cache_count(const char *dir, int64_t hits, int64_t misses);
/* The counts so far (0 when none). */
void cache_counts_read(const char *dir, int64_t *hits, int64_t *misses);

/* -- bundle.c: entries packed to ship (docs/bundle-format.md) ------------- */

/* Packs the n entries of dir named by keys, each checked, into malloc'd
 * bundle bytes; NULL with the reason (naming the entry) in why. */
void *cache_bundle_pack(const char *dir, const cache_key *keys, int n, size_t *size, char *why, size_t why_size);
/* Reads a bundle file: its header and manifest first, and the rest only if
 * the lengths they declare add up to the file's size. 0 with *bytes
 * malloc'd, or -1 with why. */
int cache_bundle_read(const char *path, void **bytes, size_t *size, char *why, size_t why_size);
/* Checks a whole bundle and decodes every entry: 0 with *entries malloc'd
 * (free each, then the array), or -1 with why naming the first bad entry and
 * nothing returned. */
int cache_bundle_unpack(const void *bytes, size_t size, cache_entry **entries, int *n, char *why,
                        size_t why_size);

#endif
