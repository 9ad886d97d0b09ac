/* Plumbing every module uses: errors, memory, the thread pool, environment options, files. */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <kiln/kiln.h>

/* Internal invariants, never user input: reports file and line, then aborts. */
#define KILN_ASSERT(cond)                                                     \
    do {                                                                      \
        if (!(cond)) core_assert_failed(__FILE__, __LINE__, #cond);           \
    } while (0)
_Noreturn void core_assert_failed(const char *file, int line, const char *cond);

/* -- Errors ---------------------------------------------------------------- */

typedef enum {
#define STATUS(name, text) CORE_##name,
#include "core/status.def"
#undef STATUS
} core_status;

/* What status means, from status.def. */
const char *core_status_text(core_status status);
/* Sets this thread's error to "fn: <what status means>"; returns -status. */
int core_fail_status(core_status status, const char *fn);
/* Sets this thread's error to "fn: <printf of fmt>" and returns -status. */
int core_fail(core_status status, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reports a NULL operand named what, unless an earlier error is pending (it
 * most likely produced the NULL). Returns -CORE_NULL_ARG. */
int core_fail_null(const char *fn, const char *what);
/* True while an error is pending (set and not cleared since). */
bool core_error_pending(void);
/* The pending error's status as a negative int, or -CORE_STATE when none
 * is pending (a caller that got a failure but finds no error). */
int core_error_status(void);
/* An internal invariant failed: in debug builds an assertion stops at once
 * (file and line); release builds set fn's error, CORE_INTERNAL, saying what
 * broke, and return -CORE_INTERNAL. Never for user input. */
#ifdef NDEBUG
#define core_internal(fn, ...) core_fail(CORE_INTERNAL, fn, "internal error: " __VA_ARGS__)
#else
#define core_internal(fn, ...) (core_internal_report(__FILE__, __LINE__, fn, __VA_ARGS__), -CORE_INTERNAL)
#endif
_Noreturn void core_internal_report(const char *file, int line, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A call succeeded: this thread's error is cleared, as kiln_clear_error()
 * does, unless the call is a step of another one still running. */
void core_succeeded(void);
/* Bracket the steps of a call made of other calls (a composite): while they
 * run, a step's success leaves an error pending, so that the step that
 * failed first is still the one reported even if a sibling succeeds after it. */
void core_steps_begin(void);
void core_steps_end(void);
/* Reports a NULL argument that is not a tensor operand (a shape, a buffer):
 * no earlier error can explain it. Returns -CORE_NULL_ARG. */
int core_fail_null_arg(const char *fn, const char *what);

/* Writes "[3,4]" (or "[]") into buf; returns buf. */
#define CORE_SHAPE_STR_MAX (KILN_MAX_DIMS * 21 + 3)
char *core_shape_str(char buf[CORE_SHAPE_STR_MAX], int ndim, const int64_t *shape);

/* -- Memory ---------------------------------------------------------------- */

/* a + b for byte counts (nonnegative), INT64_MAX when the sum passes it: a
 * plan of values too large to allocate together is still counted without
 * overflow (and then fails to allocate). */
static inline int64_t core_bytes_add(int64_t a, int64_t b)
{
    return b > INT64_MAX - a ? INT64_MAX : a + b;
}

/* 64-byte aligned (16 below 1 KiB), or NULL (with no error set) when out of memory. Large blocks
 * come from a bounded cache of freed ones, sparing the page faults of fresh
 * mappings. */
void *core_alloc(size_t bytes);
/* Frees a block from core_alloc; bytes must be the size it was allocated with. */
void core_free(void *p, size_t bytes);
/* The cache's bound in bytes (0 when freed blocks are not kept), and the
 * bytes it holds now. */
int64_t core_alloc_cache_limit(void);
int64_t core_alloc_cached_bytes(void);
/* How many freed small blocks of bytes' size class this thread keeps. */
int core_alloc_small_kept(size_t bytes);
/* Fault injection for tests: after n more successful allocations every
 * allocation fails; n < 0 turns it off. */
void core_alloc_fail_after(int64_t n);

/* -- Thread pool ----------------------------------------------------------- */

typedef void (*core_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Runs fn over [0, n) in chunks of at least grain, split across the pool's
 * threads (KILN_THREADS, default the number of cores). Falls back to the
 * calling thread for small n or when the pool is busy with another caller. */
void core_parallel_for(int64_t n, int64_t grain, core_range_fn fn, void *ctx);
/* Runs fn over [0, n) in blocks of block, each thread of the pool claiming
 * one block at a time: a thread that starts late or loses its core leaves
 * its blocks to the others. */
void core_parallel_blocks(int64_t n, int64_t block, core_range_fn fn, void *ctx);
/* Threads the pool uses, the caller included. */
int core_threads(void);

/* -- Time ------------------------------------------------------------------ */

/* Milliseconds on a monotonic clock. */
double core_now_ms(void);

/* -- Strings -------------------------------------------------------------- */

/* A growing string for printers and generated code. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed; /* out of memory: later puts do nothing */
} strbuf;

/* Appends printf-style text. */
void strbuf_put(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The text (malloc'd, the caller frees it), or NULL if memory ran out. */
char *strbuf_finish(strbuf *b);

/* -- Environment ----------------------------------------------------------- */

/* An integer environment variable, or fallback when unset or malformed. */
int64_t core_env_int(const char *name, int64_t fallback);

/* -- Files ----------------------------------------------------------------- */

/* Writes size bytes to path atomically and safely: into a new file in path's
 * directory, ".tmp-<pid>-<n>-<random>", created exclusively (never through a
 * planted link) with mode (less the umask), then renamed over path, which
 * replaces a link there rather than following it. More bytes than
 * RLIMIT_FSIZE allows fail with EFBIG before anything is created (writing
 * them would raise SIGXFSZ). 0, or -1 with errno and nothing left behind. */
int core_write_file(const char *path, const void *bytes, size_t size, mode_t mode);
/* core_write_file of n parts, one after the other. */
int core_write_parts(const char *path, int n, const void *const *parts, const size_t *sizes, mode_t mode);
/* fn's error, and -1, unless path is absent, a file or a link: what
 * core_write_* would replace with a file there (a device, a FIFO), which a
 * user's path (kiln_save_npy's, an export's) never names on purpose. */
int core_check_writable(const char *fn, const char *path);
/* Opens path for reading only if it is a regular file, never blocking on a
 * FIFO or a device: the descriptor with *st filled, or -1 with errno and
 * st->st_mode 0 when it cannot be opened, else the mode of what is there. */
int core_open_regular(const char *path, struct stat *st);
/* core_open_regular, failing with fn's error naming path and what it is. */
int core_open_regular_for(const char *fn, const char *path, struct stat *st);
/* What mode is, for messages: "a FIFO", "a directory", ... */
const char *core_file_kind(mode_t mode);
/* Reads up to size bytes at offset at, retrying short reads: the bytes read
 * (fewer only at the end of the file), or -1 with errno. */
ssize_t core_pread_full(int fd, void *buf, size_t size, off_t at);

#endif
