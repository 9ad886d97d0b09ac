/* The artifact cache: keys, entry files, and whole processes sharing a cache.
 *
 * Most tests run tests/cache_helper (the standard workloads, traced and
 * checked against eager) as separate processes over a cache directory of
 * their own, and tools/kiln-cache on it; the helper's tolerance is in its
 * header. Runs that must not write are made as the user nobody when the
 * tests run as root, since root writes through permission bits. */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "test_common.h"
#include "../bench/workloads.h"

extern char **environ;

enum { MAX_WORKLOADS = 16, OUTPUT_MAX = 1 << 16 };

typedef struct {
    char name[32];
    long long compiles, disk_hits, compiled, from_disk, shared;
    unsigned long long hash;
} helper_line;

typedef struct {
    int status;              /* exit status, or 128 + signal */
    long max_rss_kb;         /* the child's peak resident memory */
    char out[OUTPUT_MAX], err[OUTPUT_MAX];
    helper_line lines[MAX_WORKLOADS];
    int n_lines;
} run_result;

typedef struct {
    bool as_nobody;          /* when root: drop to nobody so permissions hold */
    long file_size_limit;    /* RLIMIT_FSIZE in bytes, 0 for none */
    int kill_after_us;       /* SIGKILL the child after this long, 0 for never */
    unsigned alarm_s;        /* the child dies of SIGALRM after this long, 0 for never */
} run_options;

/* -- Processes ------------------------------------------------------------- */

static const char *program(const char *variable)
{
    const char *path = getenv(variable);
    ck_assert_msg(path && *path, "%s is not set (meson test sets it)", variable);
    return path;
}

/* Whether the environment string var assigns the variable that extra
 * ("NAME=value" or "NAME") names. */
static bool same_variable(const char *var, const char *extra)
{
    size_t name = strcspn(extra, "=");
    return !strncmp(var, extra, name) && var[name] == '=';
}

/* environ with the assignments in extra (NULL-terminated) added or replaced;
 * a bare "NAME" in extra removes NAME. */
static char **environment_with(const char *const *extra)
{
    int n = 0, k = 0;
    while (environ[n])
        n++;
    while (extra[k])
        k++;
    char **env = calloc((size_t)(n + k + 1), sizeof *env);
    int used = 0;
    for (int i = 0; i < n; i++) {
        bool replaced = false;
        for (int j = 0; j < k; j++)
            replaced |= same_variable(environ[i], extra[j]);
        if (!replaced)
            env[used++] = environ[i];
    }
    for (int j = 0; j < k; j++)
        if (strchr(extra[j], '='))
            env[used++] = (char *)extra[j];
    return env;
}

static void read_into(const char *path, char *buf)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, OUTPUT_MAX - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    unlink(path);
}

static void parse_lines(run_result *r)
{
    r->n_lines = 0;
    for (char *line = r->out; *line && r->n_lines < MAX_WORKLOADS;) {
        helper_line *l = &r->lines[r->n_lines];
        if (sscanf(line, "%31s compiles=%lld disk_hits=%lld compiled=%lld from_disk=%lld shared=%lld hash=%llx",
                   l->name, &l->compiles, &l->disk_hits, &l->compiled, &l->from_disk, &l->shared, &l->hash) == 7)
            r->n_lines++;
        char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : line + strlen(line);
    }
}

/* Runs argv with extra environment; its output and exit status in r. */
static void run(const char *const *argv, const char *const *extra, const run_options *o, run_result *r)
{
    char out_path[] = "/tmp/kiln-cache-out-XXXXXX", err_path[] = "/tmp/kiln-cache-err-XXXXXX";
    int out = mkstemp(out_path), err = mkstemp(err_path);
    ck_assert(out >= 0 && err >= 0);
    /* A file size limit would cut the output files too: output goes through
     * pipes then (what the helper prints fits in their buffers). */
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (o && o->file_size_limit) {
        ck_assert(pipe(out_pipe) == 0 && pipe(err_pipe) == 0);
        fcntl(out_pipe[1], F_SETPIPE_SZ, OUTPUT_MAX);
        fcntl(err_pipe[1], F_SETPIPE_SZ, OUTPUT_MAX);
    }
    char **env = environment_with(extra);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(out_pipe[1] >= 0 ? out_pipe[1] : out, STDOUT_FILENO);
        dup2(err_pipe[1] >= 0 ? err_pipe[1] : err, STDERR_FILENO);
        if (o && o->file_size_limit) {
            struct rlimit limit = {(rlim_t)o->file_size_limit, (rlim_t)o->file_size_limit};
            setrlimit(RLIMIT_FSIZE, &limit);
        }
        if (o && o->alarm_s)
            alarm(o->alarm_s);
        if (o && o->as_nobody && geteuid() == 0 && (setgid(65534) < 0 || setuid(65534) < 0))
            _exit(125);
        execve(argv[0], (char *const *)argv, env);
        _exit(126);
    }
    if (o && o->kill_after_us) {
        usleep((useconds_t)o->kill_after_us);
        kill(pid, SIGKILL);
    }
    int status;
    struct rusage usage;
    ck_assert_int_eq(wait4(pid, &status, 0, &usage), pid);
    r->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r->max_rss_kb = usage.ru_maxrss;
    free(env);
    close(out);
    close(err);
    read_into(out_path, r->out);
    read_into(err_path, r->err);
    if (out_pipe[0] >= 0) {
        close(out_pipe[1]);
        close(err_pipe[1]);
        ssize_t got_out = read(out_pipe[0], r->out, OUTPUT_MAX - 1), got_err = read(err_pipe[0], r->err, OUTPUT_MAX - 1);
        r->out[got_out > 0 ? got_out : 0] = '\0';
        r->err[got_err > 0 ? got_err : 0] = '\0';
        close(out_pipe[0]);
        close(err_pipe[0]);
    }
    parse_lines(r);
}

/* The helper with args, in the environment with extra. */
static void helper_with(const char *const *extra, const char *const *args, const run_options *o, run_result *r)
{
    const char *argv[16] = {program("KILN_TEST_CACHE_HELPER")};
    for (int i = 0; args && args[i]; i++)
        argv[i + 1] = args[i];
    run(argv, extra, o, r);
}

/* The helper over cache root dir (KILN_CACHE=on unless mode says otherwise). */
static void helper(const char *root, const char *mode, const char *const *args, const run_options *o,
                   run_result *r)
{
    char dir_var[CACHE_PATH_MAX + 32], mode_var[64];
    snprintf(dir_var, sizeof dir_var, "KILN_CACHE_DIR=%s", root);
    snprintf(mode_var, sizeof mode_var, "KILN_CACHE=%s", mode ? mode : "on");
    helper_with((const char *[]){dir_var, mode_var, NULL}, args, o, r);
}

/* kiln-cache --dir root args... */
static void tool(const char *root, const char *const *args, const run_options *o, run_result *r)
{
    const char *argv[16] = {program("KILN_TEST_CACHE_TOOL"), "--dir", root};
    for (int i = 0; args[i]; i++)
        argv[i + 3] = args[i];
    const char *extra[] = {NULL};
    run(argv, extra, o, r);
}

static const helper_line *line_of(const run_result *r, const char *name)
{
    for (int i = 0; i < r->n_lines; i++)
        if (!strcmp(r->lines[i].name, name))
            return &r->lines[i];
    ck_abort_msg("no line for %s in:\n%s\nstderr:\n%s", name, r->out, r->err);
    return NULL;
}

static int occurrences(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

static void read_text(const char *path, char *text, size_t size)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "cannot read %s", path);
    text[fread(text, 1, size - 1, f)] = '\0';
    fclose(f);
}

static bool is_regular(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Files in dir whose names start with prefix. */
static int files_starting(const char *dir, const char *prefix)
{
    char cmd[CACHE_PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "ls -a '%s' 2>/dev/null | grep -c '^%s'", dir, prefix);
    FILE *p = popen(cmd, "r");
    int n = 0;
    ck_assert(p && fscanf(p, "%d", &n) == 1);
    pclose(p);
    return n;
}

#define ck_assert_ran(r, want_lines)                                                                   \
    ck_assert_msg((r)->status == 0 && (r)->n_lines == (want_lines),                                    \
                  "exit %d, %d lines (want %d)\nstdout:\n%s\nstderr:\n%s", (r)->status, (r)->n_lines, \
                  (want_lines), (r)->out, (r)->err)

/* -- Directories ----------------------------------------------------------- */

typedef struct {
    char root[64];
    char dir[128]; /* root/<format version> */
} cache_dir;

static void make_cache_dir(cache_dir *c)
{
    snprintf(c->root, sizeof c->root, "/tmp/kiln-cache-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(c->root));
    ck_assert_int_eq(cache_dir_of_root(c->root, c->dir, sizeof c->dir), 0);
}

static void remove_cache_dir(const cache_dir *c)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w %s 2>/dev/null; rm -rf %s", c->root, c->root);
    ck_assert_int_eq(system(cmd), 0);
}

/* When root: c becomes nobody's, for runs as nobody (kiln uses only a
 * cache directory of its own user's). */
static void give_to_nobody(const cache_dir *c)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chown -R 65534:65534 %s", c->root);
    if (geteuid() == 0)
        ck_assert_int_eq(system(cmd), 0);
}

/* The entries of c, most recently used first; n of them. */
static cache_file *entries(const cache_dir *c, int *n)
{
    cache_file *files = NULL;
    if (cache_list(c->dir, &files, n) < 0)
        *n = 0;
    return files;
}

static void entry_path(const cache_dir *c, const cache_file *f, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", c->dir, f->name);
}

/* Every entry file of c decodes whole. */
static void assert_all_sound(const cache_dir *c)
{
    int n;
    cache_file *files = entries(c, &n);
    for (int i = 0; i < n; i++) {
        char why[512];
        cache_entry e;
        int found = cache_read(c->dir, &files[i].key, NULL, false, &e, why, sizeof why);
        ck_assert_msg(found != CACHE_DAMAGED, "%s", why); /* absent: removed meanwhile */
        if (found == CACHE_FOUND)
            cache_entry_free(&e);
    }
    free(files);
}

/* A clean cache of the given workloads; the first run's result in first. */
static void fill(const cache_dir *c, const char *const *args, run_result *first)
{
    helper(c->root, "on", args, NULL, first);
}

/* -- Keys and entries ------------------------------------------------------ */

START_TEST(test_key_changes_with_every_component)
{
    cache_component c[3] = {{"kernel", "e0 = load view0"}, {"target", "x86_64 cpu=znver3"}, {"options", "opt=2"}};
    cache_key base, hashes[3], other;
    cache_key_of(c, 3, &base, hashes);
    for (int i = 0; i < 3; i++) {
        cache_component changed[3] = {c[0], c[1], c[2]};
        changed[i].text = "something else";
        cache_key_of(changed, 3, &other, NULL);
        ck_assert_msg(memcmp(base.bytes, other.bytes, CACHE_KEY_BYTES), "component %d is not in the key", i);
        cache_key own;
        cache_hash(c[i].text, strlen(c[i].text), &own);
        ck_assert(!memcmp(own.bytes, hashes[i].bytes, CACHE_KEY_BYTES));
    }
    cache_component renamed[3] = {{"kernels", c[0].text}, c[1], c[2]};
    cache_key_of(renamed, 3, &other, NULL);
    ck_assert(memcmp(base.bytes, other.bytes, CACHE_KEY_BYTES));
    char hex[CACHE_HEX_CHARS + 1];
    cache_key_hex(&base, hex);
    ck_assert(cache_key_parse(hex, &other) && !memcmp(base.bytes, other.bytes, CACHE_KEY_BYTES));
    hex[5] = 'g';
    ck_assert(!cache_key_parse(hex, &other));
    ck_assert(!cache_key_parse("abc", &other));
}
END_TEST

static cache_entry sample_entry(void)
{
    cache_entry e = {.payload = strdup("object code"), .payload_bytes = 11};
    cache_hash("k", 1, &e.key);
    snprintf(e.meta.backend, sizeof e.meta.backend, "llvm");
    snprintf(e.meta.target, sizeof e.meta.target, "x86_64 cpu=znver3 features=+avx2");
    snprintf(e.meta.symbol, sizeof e.meta.symbol, "kiln_k");
    snprintf(e.meta.function, sizeof e.meta.function, "gelu");
    snprintf(e.meta.signature, sizeof e.meta.signature, "f32[4]");
    return e;
}

/* Every prefix, every single-bit flip and a wrong key are rejected. */
START_TEST(test_entry_rejects_every_damage)
{
    cache_entry e = sample_entry(), d;
    size_t size;
    uint8_t *bytes = cache_entry_encode(&e, &size);
    char why[256];
    ck_assert_int_eq(cache_entry_decode(bytes, size, &e.key, &d, why, sizeof why), 0);
    ck_assert_str_eq(d.meta.function, "gelu");
    ck_assert(d.payload_bytes == 11 && !memcmp(d.payload, "object code", 11));
    cache_entry_free(&d);
    for (size_t cut = 0; cut < size; cut++)
        ck_assert_msg(cache_entry_decode(bytes, cut, &e.key, &d, why, sizeof why) < 0, "%zu bytes loaded", cut);
    for (size_t bit = 0; bit < 8 * size; bit++) {
        bytes[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        ck_assert_msg(cache_entry_decode(bytes, size, &e.key, &d, why, sizeof why) < 0, "bit %zu flipped loaded",
                      bit);
        bytes[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    cache_key other;
    cache_hash("other", 5, &other);
    ck_assert_int_lt(cache_entry_decode(bytes, size, &other, &d, why, sizeof why), 0);
    ck_assert_ptr_nonnull(strstr(why, "another key"));
    free(bytes);
    cache_entry_free(&e);
}
END_TEST

/* -- Processes sharing a cache --------------------------------------------- */

START_TEST(test_second_process_compiles_nothing)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result first, second;
    fill(&c, NULL, &first);
    ck_assert_ran(&first, workload_kernels_count);
    helper(c.root, "on", NULL, NULL, &second);
    ck_assert_ran(&second, workload_kernels_count);
    for (int i = 0; i < workload_kernels_count; i++) {
        const helper_line *a = &first.lines[i], *b = line_of(&second, a->name);
        ck_assert_msg(a->compiled > 0 && a->from_disk == 0 && a->compiles == 1, "%s first: %s", a->name, first.out);
        ck_assert_msg(b->compiled == 0 && b->from_disk == a->compiled && b->disk_hits == 1 && b->compiles == 0,
                      "%s second:\n%s", a->name, second.out);
        ck_assert_msg(a->hash == b->hash, "%s: results differ", a->name);
    }
    static run_result stat;
    tool(c.root, (const char *[]){"stat", NULL}, NULL, &stat);
    long long hits = -1, misses = -1;
    const char *h = strstr(stat.out, "hits"), *m = strstr(stat.out, "misses");
    ck_assert(h && m && sscanf(h, "hits %lld", &hits) == 1 && sscanf(m, "misses %lld", &misses) == 1);
    ck_assert_int_eq(hits, misses);
    ck_assert_int_gt(hits, 0);
    remove_cache_dir(&c);
}
END_TEST

START_TEST(test_log_names_each_key_component_on_a_miss)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    char dir_var[128];
    snprintf(dir_var, sizeof dir_var, "KILN_CACHE_DIR=%s", c.root);
    const char *argv[] = {program("KILN_TEST_CACHE_HELPER"), "gelu", NULL};
    run(argv, (const char *[]){dir_var, "KILN_CACHE=on", "KILN_LOG=1", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    const char *miss = strstr(r.err, "misses the cache");
    ck_assert_msg(miss, "%s", r.err);
    const char *names[] = {"kernel=", "backend=", "target=", "format=", "codegen=", "toolchain=", "options="};
    for (int i = 0; i < 7; i++)
        ck_assert_msg(strstr(miss, names[i]), "the miss does not show %s:\n%s", names[i], r.err);
    run(argv, (const char *[]){dir_var, "KILN_CACHE=on", "KILN_LOG=1", NULL}, NULL, &r);
    ck_assert_msg(strstr(r.err, "loaded from the disk cache") && !strstr(r.err, "misses"), "%s", r.err);
    remove_cache_dir(&c);
}
END_TEST

typedef void (*damage_fn)(const char *path, const cache_dir *c);

static void truncate_half(const char *path, const cache_dir *c)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(truncate(path, st.st_size / 2), 0);
}

static void make_empty(const char *path, const cache_dir *c)
{
    ck_assert_int_eq(truncate(path, 0), 0);
}

static void flip_bit(const char *path, const cache_dir *c)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    int fd = open(path, O_RDWR);
    off_t at = (off_t)(rand() % st.st_size);
    unsigned char byte;
    ck_assert_int_eq(pread(fd, &byte, 1, at), 1);
    byte ^= (unsigned char)(1u << (rand() % 8));
    ck_assert_int_eq(pwrite(fd, &byte, 1, at), 1);
    close(fd);
}

static void overwrite_at(const char *path, off_t at, const void *bytes, size_t n)
{
    int fd = open(path, O_RDWR);
    ck_assert_int_eq(pwrite(fd, bytes, n, at), (ssize_t)n);
    close(fd);
}

static void wrong_magic(const char *path, const cache_dir *c)
{
    overwrite_at(path, 0, "ELF!", 4);
}

static void wrong_version(const char *path, const cache_dir *c)
{
    overwrite_at(path, 8, (const unsigned char[]){CACHE_FORMAT_VERSION + 1, 0, 0, 0}, 4);
}

/* Another entry's whole file under this entry's name. */
static void wrong_key(const char *path, const cache_dir *c)
{
    int n;
    cache_file *files = entries(c, &n);
    for (int i = 0; i < n; i++) {
        char other[256];
        entry_path(c, &files[i], other, sizeof other);
        if (strcmp(other, path)) {
            char cmd[600];
            snprintf(cmd, sizeof cmd, "cp %s %s", other, path);
            ck_assert_int_eq(system(cmd), 0);
            break;
        }
    }
    free(files);
}

/* A sound entry, with a right checksum, built for another CPU but filed
 * under this entry's key: what a buggy or hostile writer could leave. */
static void other_cpu(const char *path, const cache_dir *c)
{
    cache_dir other;
    make_cache_dir(&other);
    static run_result r;
    helper(other.root, "on", (const char *[]){"--precompile", "cpu:skylake-avx512", "gelu", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0, "%s", r.err);
    int n;
    cache_file *files = entries(&other, &n);
    ck_assert_int_eq(n, 1);
    char from[256], why[256];
    entry_path(&other, &files[0], from, sizeof from);
    void *bytes;
    size_t size;
    cache_entry e;
    ck_assert_int_eq(cache_read_file(from, &bytes, &size), 0);
    ck_assert_int_eq(cache_entry_decode(bytes, size, NULL, &e, why, sizeof why), 0);
    ck_assert_ptr_nonnull(strstr(e.meta.target, "skylake-avx512"));
    free(bytes);
    void *victim;
    cache_entry here;
    ck_assert_int_eq(cache_read_file(path, &victim, &size), 0);
    ck_assert_int_eq(cache_entry_decode(victim, size, NULL, &here, why, sizeof why), 0);
    e.key = here.key;
    snprintf(e.meta.symbol, sizeof e.meta.symbol, "%s", here.meta.symbol);
    void *forged = cache_entry_encode(&e, &size);
    FILE *f = fopen(path, "wb");
    ck_assert(f && fwrite(forged, 1, size, f) == size && fclose(f) == 0);
    free(forged);
    free(victim);
    cache_entry_free(&e);
    cache_entry_free(&here);
    free(files);
    remove_cache_dir(&other);
}

static const struct {
    const char *name;
    damage_fn damage;
} damages[] = {
    {"truncated", truncate_half}, {"zero-length", make_empty}, {"bit-flipped", flip_bit},
    {"wrong magic", wrong_magic}, {"wrong version", wrong_version}, {"wrong key", wrong_key},
    {"built for another CPU", other_cpu},
};

/* Each kind of damage is reported once, the entry removed and compiled again,
 * and the result right; the cache is sound afterwards. */
START_TEST(test_damaged_entries_cost_time_not_answers)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result clean, damaged, after;
    const char *args[] = {"gelu", "softmax", NULL};
    fill(&c, args, &clean);
    ck_assert_ran(&clean, 2);
    int n;
    cache_file *files = entries(&c, &n);
    ck_assert_int_eq(n, 2);
    char path[256];
    entry_path(&c, &files[_i % n], path, sizeof path);
    srand((unsigned)_i + 1);
    damages[_i].damage(path, &c);
    helper(c.root, "on", args, NULL, &damaged);
    ck_assert_ran(&damaged, 2);
    ck_assert_msg(occurrences(damaged.err, "damaged cache entry") == 1, "%s: reported %d times:\n%s",
                  damages[_i].name, occurrences(damaged.err, "damaged cache entry"), damaged.err);
    long long compiled = line_of(&damaged, "gelu")->compiled + line_of(&damaged, "softmax")->compiled;
    ck_assert_msg(compiled == 1, "%s: %lld kernels compiled again", damages[_i].name, compiled);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(clean.lines[i].hash == line_of(&damaged, clean.lines[i].name)->hash, "%s: %s differs",
                      damages[_i].name, clean.lines[i].name);
    assert_all_sound(&c);
    helper(c.root, "on", args, NULL, &after);
    ck_assert_ran(&after, 2);
    ck_assert_msg(!strstr(after.err, "damaged"), "%s", after.err);
    free(files);
    remove_cache_dir(&c);
}
END_TEST

/* A writer killed at any moment leaves no entry that loads wrong: every
 * entry file is whole, and a later run is right and leaves a sound cache. */
START_TEST(test_killed_writers_leave_nothing_that_loads)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r, clean;
    cache_dir reference;
    make_cache_dir(&reference);
    fill(&reference, NULL, &clean);
    ck_assert_ran(&clean, workload_kernels_count);
    remove_cache_dir(&reference);
    srand(7);
    for (int round = 0; round < 12; round++) {
        run_options kill_it = {.kill_after_us = 1000 + rand() % 240000};
        helper(c.root, "on", NULL, &kill_it, &r);
        assert_all_sound(&c);
    }
    helper(c.root, "on", NULL, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    for (int i = 0; i < workload_kernels_count; i++)
        ck_assert_msg(clean.lines[i].hash == line_of(&r, clean.lines[i].name)->hash, "%s differs",
                      clean.lines[i].name);
    ck_assert_msg(!strstr(r.err, "damaged"), "%s", r.err);
    tool(c.root, (const char *[]){"verify", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0, "%s", r.out);
    remove_cache_dir(&c);
}
END_TEST

/* Four processes fill one cache at once, with overlapping kernels. */
START_TEST(test_four_processes_fill_one_cache)
{
    cache_dir c;
    make_cache_dir(&c);
    char dir_var[128];
    snprintf(dir_var, sizeof dir_var, "KILN_CACHE_DIR=%s", c.root);
    char **env = environment_with((const char *[]){dir_var, "KILN_CACHE=on", NULL});
    const char *sets[4][5] = {{"gelu", "softmax", "mlp", NULL},
                              {"softmax", "layernorm", "gelu", NULL},
                              {"mlp", "attention", "tiny", NULL},
                              {"tiny", "gelu", "layernorm", "attention", NULL}};
    pid_t pids[4];
    for (int p = 0; p < 4; p++) {
        const char *argv[6] = {program("KILN_TEST_CACHE_HELPER")};
        for (int i = 0; sets[p][i]; i++)
            argv[i + 1] = sets[p][i];
        pids[p] = fork();
        ck_assert_int_ge(pids[p], 0);
        if (pids[p] == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, STDOUT_FILENO);
            execve(argv[0], (char *const *)argv, env);
            _exit(126);
        }
    }
    for (int p = 0; p < 4; p++) {
        int status;
        ck_assert_int_eq(waitpid(pids[p], &status, 0), pids[p]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d failed", p);
    }
    free(env);
    static run_result r;
    tool(c.root, (const char *[]){"verify", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0 && strstr(r.out, " 0 damaged"), "%s", r.out);
    helper(c.root, "require", (const char *[]){"gelu", "softmax", "layernorm", "mlp", "attention", "tiny", NULL},
           NULL, &r);
    ck_assert_ran(&r, 6);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(r.lines[i].compiled, 0);
    remove_cache_dir(&c);
}
END_TEST

/* -- Modes, read-only and full disks --------------------------------------- */

START_TEST(test_require_names_the_missing_kernel)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    helper(c.root, "require", (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "KILN_CACHE=require") && strstr(r.err, "kernel 0 of 'gelu'") &&
                      strstr(r.err, "f32["),
                  "%s", r.err);
    int n;
    free(entries(&c, &n));
    ck_assert_int_eq(n, 0);
    remove_cache_dir(&c);
}
END_TEST

/* Every file of c, with its size and modification time, as one text. */
static void snapshot(const cache_dir *c, char *out, size_t size)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cd %s && find . -exec stat -c '%%n %%s %%Y' {} + | sort", c->root);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    pclose(p);
}

/* off writes nothing; readonly loads hits and compiles around a damaged
 * entry, touching no file: no removal, no last-use update, no counts. */
START_TEST(test_off_and_readonly_modes_write_nothing)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r, clean;
    static char before[OUTPUT_MAX], after[OUTPUT_MAX];
    helper(c.root, "off", (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    snapshot(&c, before, sizeof before);
    ck_assert_msg(!strstr(before, "./1"), "KILN_CACHE=off wrote:\n%s", before);
    const char *args[] = {"gelu", "softmax", NULL};
    fill(&c, args, &clean);
    ck_assert_ran(&clean, 2);
    int n;
    cache_file *files = entries(&c, &n);
    ck_assert_int_eq(n, 2);
    char path[256];
    entry_path(&c, &files[0], path, sizeof path);
    truncate_half(path, &c);
    free(files);
    struct timespec old[2] = {{.tv_sec = 1000}, {.tv_sec = 1000}};
    files = entries(&c, &n);
    for (int i = 0; i < n; i++) {
        entry_path(&c, &files[i], path, sizeof path);
        ck_assert_int_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    }
    free(files);
    snapshot(&c, before, sizeof before);
    helper(c.root, "readonly", args, NULL, &r);
    ck_assert_ran(&r, 2);
    ck_assert_int_eq(line_of(&r, "gelu")->compiled + line_of(&r, "softmax")->compiled, 1);
    ck_assert_int_eq(line_of(&r, "gelu")->from_disk + line_of(&r, "softmax")->from_disk, 1);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(line_of(&r, clean.lines[i].name)->hash, clean.lines[i].hash);
    ck_assert_msg(occurrences(r.err, "damaged cache entry") == 1 && !strstr(r.err, "removed"), "%s", r.err);
    snapshot(&c, after, sizeof after);
    ck_assert_msg(!strcmp(before, after), "readonly changed the cache:\n%s\nbecame\n%s", before, after);
    remove_cache_dir(&c);
}
END_TEST

/* A cache directory nobody may write: hits load, misses compile, one warning. */
START_TEST(test_readonly_directory_works_with_one_warning)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result first, r;
    const char *args[] = {"gelu", "softmax", "layernorm", NULL};
    run_options nobody = {.as_nobody = true};
    give_to_nobody(&c);
    helper(c.root, "on", (const char *[]){"gelu", NULL}, &nobody, &first);
    ck_assert_ran(&first, 1);
    give_to_nobody(&c);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R a-w %s", c.root);
    ck_assert_int_eq(system(cmd), 0);
    helper(c.root, "on", args, &nobody, &r);
    ck_assert_ran(&r, 3);
    ck_assert_int_eq(line_of(&r, "gelu")->from_disk, first.lines[0].compiled);
    ck_assert_int_eq(line_of(&r, "gelu")->hash, first.lines[0].hash);
    ck_assert_int_gt(line_of(&r, "softmax")->compiled, 0);
    ck_assert_msg(occurrences(r.err, "warning") == 1 && strstr(r.err, "read-only"), "%s", r.err);
    int n;
    free(entries(&c, &n));
    ck_assert_int_eq(n, 1);
    remove_cache_dir(&c);
}
END_TEST

/* A file size limit (ulimit -f, whose SIGXFSZ kills by default) is a full
 * disk: one warning, results right, no temporary file left; and kiln-cache
 * export fails with a message. */
START_TEST(test_full_disk_works_with_one_warning)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    run_options full = {.file_size_limit = 256};
    helper(c.root, "on", NULL, &full, &r);
    ck_assert_ran(&r, workload_kernels_count);
    ck_assert_msg(occurrences(r.err, "warning") == 1 && strstr(r.err, "disk is full"), "%s", r.err);
    int n;
    free(entries(&c, &n));
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(files_starting(c.dir, ".tmp-"), 0);
    fill(&c, (const char *[]){"gelu", NULL}, &r);
    ck_assert_ran(&r, 1);
    char bundle[128];
    snprintf(bundle, sizeof bundle, "%s/b.kbundle", c.root);
    tool(c.root, (const char *[]){"export", bundle, "--all", NULL}, &full, &r);
    ck_assert_msg(r.status == 1 && strstr(r.err, "File too large"), "exit %d: %s", r.status, r.err);
    ck_assert_int_eq(files_starting(c.root, "b.kbundle"), 0);
    ck_assert_int_eq(files_starting(c.root, ".tmp-"), 0);
    remove_cache_dir(&c);
}
END_TEST

START_TEST(test_size_cap_evicts_least_recently_used)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    fill(&c, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    int n;
    cache_file *files = entries(&c, &n);
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += files[i].bytes;
    /* Age every entry but one, which must then survive a prune to its own size. */
    for (int i = 0; i < n; i++) {
        char path[256];
        entry_path(&c, &files[i], path, sizeof path);
        struct timespec times[2] = {{.tv_sec = 1000 + (i == n / 2) * 1000000}, {.tv_sec = 1000 + (i == n / 2) * 1000000}};
        ck_assert_int_eq(utimensat(AT_FDCWD, path, times, 0), 0);
    }
    char keep[sizeof files[0].name], max[32];
    snprintf(keep, sizeof keep, "%s", files[n / 2].name);
    snprintf(max, sizeof max, "%lld", (long long)files[n / 2].bytes);
    tool(c.root, (const char *[]){"prune", "--max-bytes", max, NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 0);
    free(files);
    files = entries(&c, &n);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(files[0].name, keep);
    free(files);
    /* And kiln itself keeps under KILN_CACHE_MAX_BYTES as it writes. */
    char dir_var[128], cap[64];
    snprintf(dir_var, sizeof dir_var, "KILN_CACHE_DIR=%s", c.root);
    snprintf(cap, sizeof cap, "KILN_CACHE_MAX_BYTES=%lld", (long long)(total / 2));
    const char *argv[] = {program("KILN_TEST_CACHE_HELPER"), NULL};
    run(argv, (const char *[]){dir_var, "KILN_CACHE=on", cap, NULL}, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    files = entries(&c, &n);
    int64_t now = 0;
    for (int i = 0; i < n; i++)
        now += files[i].bytes;
    ck_assert_msg(now <= total / 2 && n > 0, "%lld bytes in %d entries, cap %lld", (long long)now, n,
                  (long long)(total / 2));
    free(files);
    remove_cache_dir(&c);
}
END_TEST

/* -- Cross-CPU precompiles ------------------------------------------------- */

START_TEST(test_other_cpu_entries_are_never_loaded_here)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    helper(c.root, "on", (const char *[]){"--precompile", "cpu:skylake-avx512", NULL}, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    int n;
    free(entries(&c, &n));
    ck_assert_int_gt(n, 0);
    tool(c.root, (const char *[]){"ls", NULL}, NULL, &r);
    ck_assert_int_eq(occurrences(r.out, "skylake-avx512"), n);
    ck_assert_ptr_nonnull(strstr(r.out, "gelu (f32["));
    helper(c.root, "on", NULL, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    for (int i = 0; i < workload_kernels_count; i++)
        ck_assert_msg(r.lines[i].from_disk == 0 && r.lines[i].compiled > 0, "%s", r.out);
    /* Precompiling again finds the entries there. */
    helper(c.root, "on", (const char *[]){"--precompile", "cpu:skylake-avx512", "gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    ck_assert_int_eq(r.lines[0].compiled, 0);
    ck_assert_int_gt(r.lines[0].from_disk, 0);
    remove_cache_dir(&c);
}
END_TEST

/* A build machine compiling for this machine's exact target (what
 * kiln-cache target prints) makes the entries this machine's host loads. */
START_TEST(test_precompile_for_a_named_machine_serves_its_host)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    tool(c.root, (const char *[]){"target", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0 && !strncmp(r.out, "cpu:", 4), "%s%s", r.out, r.err);
    static char target[OUTPUT_MAX];
    snprintf(target, sizeof target, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    helper(c.root, "on", (const char *[]){"--precompile", target, NULL}, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    helper(c.root, "require", NULL, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    for (int i = 0; i < workload_kernels_count; i++)
        ck_assert_msg(r.lines[i].compiled == 0 && r.lines[i].from_disk > 0, "%s", r.out);
    remove_cache_dir(&c);
}
END_TEST

/* host ("cpu:NAME:features") with every feature of 256- and 512-bit vectors
 * turned off into out: a machine of 128-bit vectors that this host can run. */
static void narrower(const char *host, char *out, size_t size)
{
    static const char *const wide[] = {"avx", "evex512", "fma", "f16c", "vaes", "vpclmulqdq", "sha512", "sm3",
                                       "sm4", "xop", "amx"};
    const char *features = strchr(host + 4, ':') + 1;
    size_t used = (size_t)snprintf(out, size, "%.*s", (int)(features - host), host);
    char copy[OUTPUT_MAX], *save = NULL;
    snprintf(copy, sizeof copy, "%s", features);
    for (char *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        bool off = false;
        for (size_t i = 0; i < sizeof wide / sizeof *wide; i++)
            off |= f[0] == '+' && !strncmp(f + 1, wide[i], strlen(wide[i]));
        used += (size_t)snprintf(out + used, size - used, "%s%c%s", used > (size_t)(features - host) ? "," : "",
                                 off ? '-' : f[0], f + 1);
        ck_assert_uint_lt(used, size);
    }
}

/* Kernels precompiled for a narrower machine than the host (its vectors 128
 * bits wide) come from the disk cache in a process that runs that machine's
 * code (KILN_CPU_TARGET): nothing compiled, and the host's own target finds
 * none of them; a target with a feature the host lacks is refused. */
START_TEST(test_precompile_for_a_narrower_machine_runs_here)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    tool(c.root, (const char *[]){"target", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0 && !strncmp(r.out, "cpu:", 4) && strchr(r.out + 4, ':'), "%s%s", r.out, r.err);
    static char host[OUTPUT_MAX], narrow[OUTPUT_MAX], dir_var[CACHE_PATH_MAX + 32], target_var[OUTPUT_MAX + 32];
    snprintf(host, sizeof host, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    narrower(host, narrow, sizeof narrow);
    ck_assert_msg(strstr(narrow, "-avx"), "%s", narrow);
    helper(c.root, "on", (const char *[]){"--precompile", narrow, NULL}, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    snprintf(dir_var, sizeof dir_var, "KILN_CACHE_DIR=%s", c.root);
    snprintf(target_var, sizeof target_var, "KILN_CPU_TARGET=%s", narrow);
    helper_with((const char *[]){dir_var, "KILN_CACHE=require", target_var, NULL}, NULL, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    for (int i = 0; i < workload_kernels_count; i++)
        ck_assert_msg(r.lines[i].compiled == 0 && r.lines[i].from_disk > 0, "%s", r.out);
    helper(c.root, "require", NULL, NULL, &r);
    ck_assert_msg(r.status != 0 && strstr(r.err, "KILN_CACHE=require"), "%s%s", r.out, r.err);
    snprintf(target_var, sizeof target_var, "KILN_CPU_TARGET=%.*s+no-such-feature", (int)(strchr(host + 4, ':') + 1 - host),
             host);
    helper_with((const char *[]){dir_var, "KILN_CACHE=require", target_var, NULL}, NULL, NULL, &r);
    ck_assert_msg(strstr(r.err, "compiling failed (KILN_CPU_TARGET: this host's CPU lacks no-such-feature)"),
                  "%s%s", r.out, r.err); /* and interprets, as for any failed compile */
    remove_cache_dir(&c);
}
END_TEST

START_TEST(test_precompile_rejects_bad_targets)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    run_options full = {.file_size_limit = 256};
    helper(c.root, "on", (const char *[]){"--precompile", "cpu:skylake-avx512", "gelu", NULL}, &full, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "kiln_fn_precompile") && strstr(r.err, "cannot write"), "%s", r.err);
    helper(c.root, "on", (const char *[]){"--precompile", "cpu:znver3:+avx2,-avx2", "gelu", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "avx2 twice"), "%s", r.err);
    helper(c.root, "on", (const char *[]){"--precompile", "cpu:no-such-cpu", "gelu", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "kiln_fn_precompile") && strstr(r.err, "no-such-cpu"), "%s", r.err);
    helper(c.root, "on", (const char *[]){"--precompile", "cpu:znver3:+avx2,+no-such-feature", "gelu", NULL}, NULL,
           &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "no-such-feature"), "%s", r.err);
    helper(c.root, "off", (const char *[]){"--precompile", "cpu:znver4", "gelu", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "KILN_CACHE=off"), "%s", r.err);
    helper(c.root, "on", (const char *[]){"--precompile", "gpu:0", "gelu", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "gpu:0"), "%s", r.err);
    remove_cache_dir(&c);
}
END_TEST

/* -- Bundles --------------------------------------------------------------- */

START_TEST(test_bundle_ships_a_complete_cache)
{
    cache_dir from, to;
    make_cache_dir(&from);
    make_cache_dir(&to);
    static run_result clean, r;
    fill(&from, NULL, &clean);
    ck_assert_ran(&clean, workload_kernels_count);
    char bundle[128];
    snprintf(bundle, sizeof bundle, "%s/all.kbundle", from.root);
    tool(from.root, (const char *[]){"export", bundle, "--all", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0, "%s", r.err);
    tool(to.root, (const char *[]){"import", bundle, NULL}, NULL, &r);
    ck_assert_msg(r.status == 0, "%s", r.err);
    helper(to.root, "require", NULL, NULL, &r);
    ck_assert_ran(&r, workload_kernels_count);
    for (int i = 0; i < workload_kernels_count; i++) {
        ck_assert_int_eq(r.lines[i].compiled, 0);
        ck_assert_int_eq(r.lines[i].hash, line_of(&clean, r.lines[i].name)->hash);
    }
    /* One chosen entry, by key prefix. */
    int n;
    cache_file *files = entries(&from, &n);
    char one[128], prefix[17];
    snprintf(one, sizeof one, "%s/one.kbundle", from.root);
    snprintf(prefix, sizeof prefix, "%.16s", files[0].name);
    tool(from.root, (const char *[]){"export", one, prefix, NULL}, NULL, &r);
    ck_assert_msg(r.status == 0 && strstr(r.out, "exported 1 entries"), "%s%s", r.out, r.err);
    free(files);
    remove_cache_dir(&from);
    remove_cache_dir(&to);
}
END_TEST

/* A bundle whose one entry is bad (its own checksum wrong, the bundle's
 * recomputed) is rejected whole, naming that entry; so is a truncated one. */
START_TEST(test_bundle_with_a_bad_entry_is_rejected_whole)
{
    cache_dir from, to;
    make_cache_dir(&from);
    make_cache_dir(&to);
    static run_result r;
    fill(&from, (const char *[]){"gelu", "softmax", "layernorm", NULL}, &r);
    ck_assert_ran(&r, 3);
    char bundle[128];
    snprintf(bundle, sizeof bundle, "%s/b.kbundle", from.root);
    tool(from.root, (const char *[]){"export", bundle, "--all", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 0);
    void *bytes;
    size_t size;
    ck_assert_int_eq(cache_read_file(bundle, &bytes, &size), 0);
    uint8_t *b = bytes;
    b[size - CACHE_KEY_BYTES - 20] ^= 0x40; /* inside the last entry's payload */
    cache_key sum;
    cache_hash(b, size - CACHE_KEY_BYTES, &sum);
    memcpy(b + size - CACHE_KEY_BYTES, sum.bytes, CACHE_KEY_BYTES);
    FILE *f = fopen(bundle, "wb");
    ck_assert(f && fwrite(b, 1, size, f) == size && fclose(f) == 0);
    tool(to.root, (const char *[]){"import", bundle, NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "rejected") && strstr(r.err, "entry 2 (") && strstr(r.err, "damaged"), "%s",
                  r.err);
    int n;
    free(entries(&to, &n));
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(truncate(bundle, (off_t)size / 2), 0);
    tool(to.root, (const char *[]){"import", bundle, NULL}, NULL, &r);
    ck_assert_msg(r.status == 1 && strstr(r.err, "rejected"), "%s", r.err);
    free(entries(&to, &n));
    ck_assert_int_eq(n, 0);
    free(bytes);
    remove_cache_dir(&from);
    remove_cache_dir(&to);
}
END_TEST

START_TEST(test_import_into_readonly_directory_errors)
{
    cache_dir from, to;
    make_cache_dir(&from);
    make_cache_dir(&to);
    static run_result r;
    fill(&from, (const char *[]){"gelu", NULL}, &r);
    ck_assert_ran(&r, 1);
    char bundle[128], cmd[256];
    snprintf(bundle, sizeof bundle, "%s/b.kbundle", from.root);
    tool(from.root, (const char *[]){"export", bundle, "--all", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 0);
    give_to_nobody(&from);
    snprintf(cmd, sizeof cmd, "chmod a-w %s", to.root);
    ck_assert_int_eq(system(cmd), 0);
    run_options nobody = {.as_nobody = true};
    tool(to.root, (const char *[]){"import", bundle, NULL}, &nobody, &r);
    ck_assert_int_eq(r.status, 1);
    ck_assert_msg(strstr(r.err, "cannot write") && strstr(r.err, "Permission denied"), "%s", r.err);
    remove_cache_dir(&from);
    remove_cache_dir(&to);
}
END_TEST

/* -- In one process --------------------------------------------------------- */

static int scaled_tanh(kiln_tensor *const *in, kiln_tensor **out, void *user)
{
    out[0] = kiln_tanh(kiln_mul_scalar(in[0], 0.5));
    return out[0] ? 0 : -1;
}

/* Two functions that make the same kernel share it. */
START_TEST(test_functions_share_kernels_in_a_process)
{
    kiln_tensor *x = kiln_arange(0, 1000, 1, KILN_F32), *a, *b;
    kiln_fn *f = kiln_jit("first", scaled_tanh, 1, 1, NULL, NULL), *g = kiln_jit("second", scaled_tanh, 1, 1, NULL, NULL);
    ck_assert_int_eq(kiln_call(f, &x, &a), 0);
    ck_assert_int_eq(kiln_call(g, &x, &b), 0);
    kiln_fn_free(f);
    kiln_fn_stats_t s;
    ck_assert_int_eq(kiln_fn_stats(g, &s), 0);
    if (strcmp(kiln_fn_backend(g), "llvm") == 0) {
        ck_assert_int_eq(s.kernels_compiled, 0);
        ck_assert_int_eq(s.kernels_shared, 1);
    }
    float va[1000], vb[1000];
    ck_assert_int_eq(kiln_copy_to_host(a, va, sizeof va), 0);
    ck_assert_int_eq(kiln_copy_to_host(b, vb, sizeof vb), 0);
    ck_assert(!memcmp(va, vb, sizeof va));
    kiln_fn_free(g);
    kiln_release(a);
    kiln_release(b);
    kiln_release(x);
}
END_TEST

/* opt_level and fast_math are in the key: functions that differ only in
 * them share no kernel. */
START_TEST(test_options_are_in_the_key)
{
    kiln_tensor *x = kiln_arange(0, 1000, 1, KILN_F32), *out[3];
    kiln_jit_options o[3] = {kiln_jit_defaults(), kiln_jit_defaults(), kiln_jit_defaults()};
    o[1].opt_level = 3;
    o[2].fast_math = true;
    kiln_fn *f[3];
    for (int i = 0; i < 3; i++) {
        f[i] = kiln_jit("options", scaled_tanh, 1, 1, NULL, &o[i]);
        ck_assert_int_eq(kiln_call(f[i], &x, &out[i]), 0);
        kiln_fn_stats_t s;
        ck_assert_int_eq(kiln_fn_stats(f[i], &s), 0);
        if (strcmp(kiln_fn_backend(f[i]), "llvm") == 0)
            ck_assert_msg(s.kernels_compiled == 1 && s.kernels_shared == 0, "options %d shared a kernel", i);
    }
    for (int i = 0; i < 3; i++) {
        kiln_fn_free(f[i]);
        kiln_release(out[i]);
    }
    kiln_release(x);
}
END_TEST

typedef struct {
    kiln_tensor *x;
    float want[1000];
    int failures;
} churn_state;

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Marks, calls and frees one body over and over for two seconds: kernels
 * are loaded, shared and unloaded while other threads do the same. */
static void *churn(void *arg)
{
    churn_state *c = arg;
    double end = seconds() + 2;
    for (int i = 0; i < 20 || seconds() < end; i++) {
        kiln_fn *f = kiln_jit("churn", scaled_tanh, 1, 1, NULL, NULL);
        kiln_tensor *out = NULL;
        float got[1000];
        bool ok = kiln_call(f, &c->x, &out) == 0 && !strcmp(kiln_fn_backend(f), "llvm") &&
                  kiln_copy_to_host(out, got, sizeof got) == 0 && !memcmp(got, c->want, sizeof got);
        __atomic_add_fetch(&c->failures, !ok, __ATOMIC_RELAXED);
        kiln_release(out);
        kiln_fn_free(f);
    }
    return NULL;
}

/* Threads loading, sharing and unloading one kernel from one disk cache: every
 * call compiled and right, and the entry left sound. */
START_TEST(test_threads_share_and_unload_kernels)
{
    cache_dir c;
    make_cache_dir(&c);
    setenv("KILN_CACHE_DIR", c.root, 1);
    setenv("KILN_CACHE", "on", 1);
    static churn_state state;
    state.x = kiln_arange(0, 1000, 1, KILN_F32);
    kiln_fn *f = kiln_jit("churn", scaled_tanh, 1, 1, NULL, NULL);
    kiln_tensor *want;
    ck_assert_int_eq(kiln_call(f, &state.x, &want), 0);
    ck_assert_int_eq(kiln_copy_to_host(want, state.want, sizeof state.want), 0);
    kiln_release(want);
    kiln_fn_free(f);
    pthread_t threads[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&threads[i], NULL, churn, &state), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    ck_assert_int_eq(state.failures, 0);
    int n;
    free(entries(&c, &n));
    ck_assert_int_eq(n, 1);
    assert_all_sound(&c);
    kiln_release(state.x);
    setenv("KILN_CACHE", "off", 1);
    remove_cache_dir(&c);
}
END_TEST

/* -- Hostile and careless files -------------------------------------------- */

static const struct {
    const char *name;
    const char *path;      /* made untrusted, under the cache root (or HOME) */
    unsigned mode;         /* chmod'd to it, unless 0 */
    bool other_owner;      /* chown'd to nobody (root only) */
    bool under_home;       /* the cache is HOME's default, $HOME/.cache/kiln */
    const char *why;       /* in the warning */
} untrusted[] = {
    {"the cache directory, writable by others", "1", 0707, false, false, "writable by others"},
    {"the cache directory, writable by its group", "1", 0770, false, false, "writable by its group"},
    {"KILN_CACHE_DIR itself, writable by others", "", 0703, false, false, "writable by others"},
    {"a directory between HOME and the cache, writable by all", ".cache", 0777, false, true,
     "writable by its group and others"},
    {"the cache directory, another user's", "1", 0, true, false, "owned by user 65534"},
};

/* Code from a directory that others can change is never loaded: the disk
 * cache is off, with one warning saying why, and nothing is written. */
START_TEST(test_untrusted_directories_are_not_used)
{
    if (untrusted[_i].other_owner && geteuid() != 0) {
        printf("skipped: %s: needs root to give a directory to another user\n", untrusted[_i].name);
        return;
    }
    cache_dir c;
    make_cache_dir(&c);
    char env_dir[CACHE_PATH_MAX], path[CACHE_PATH_MAX];
    const char *env[6] = {env_dir, "KILN_CACHE=on", NULL};
    if (untrusted[_i].under_home) {
        snprintf(env_dir, sizeof env_dir, "HOME=%s", c.root);
        env[2] = "KILN_CACHE_DIR";
        env[3] = "XDG_CACHE_HOME";
    } else {
        snprintf(env_dir, sizeof env_dir, "KILN_CACHE_DIR=%s", c.root);
    }
    const char *args[] = {"gelu", "softmax", NULL};
    static run_result clean, r;
    static char before[OUTPUT_MAX], after[OUTPUT_MAX];
    helper_with(env, args, NULL, &clean);
    ck_assert_ran(&clean, 2);
    ck_assert_msg(!strstr(clean.err, "warning"), "%s", clean.err);
    snprintf(path, sizeof path, "%s%s%s", c.root, *untrusted[_i].path ? "/" : "", untrusted[_i].path);
    if (untrusted[_i].mode)
        ck_assert_int_eq(chmod(path, untrusted[_i].mode), 0);
    if (untrusted[_i].other_owner)
        ck_assert_int_eq(chown(path, 65534, 65534), 0);
    snapshot(&c, before, sizeof before);
    helper_with(env, args, NULL, &r);
    ck_assert_ran(&r, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(r.lines[i].from_disk == 0 && r.lines[i].compiled > 0, "%s: loaded from the disk:\n%s",
                      untrusted[_i].name, r.out);
        ck_assert_int_eq(r.lines[i].hash, line_of(&clean, r.lines[i].name)->hash);
    }
    ck_assert_msg(occurrences(r.err, "warning") == 1 && occurrences(r.err, "not using the disk cache") == 1 &&
                      strstr(r.err, path) && strstr(r.err, untrusted[_i].why),
                  "%s:\n%s", untrusted[_i].name, r.err);
    snapshot(&c, after, sizeof after);
    ck_assert_msg(!strcmp(before, after), "%s: the cache changed:\n%s\nbecame\n%s", untrusted[_i].name, before,
                  after);
    remove_cache_dir(&c);
}
END_TEST

/* No HOME (nor KILN_CACHE_DIR or XDG_CACHE_HOME): no disk cache, rather
 * than a shared one in /tmp that another user could have made first. */
START_TEST(test_no_home_means_no_disk_cache)
{
    static run_result r;
    const char *homes[] = {"HOME", "HOME="};
    for (int i = 0; i < 2; i++) {
        const char *env[] = {homes[i], "KILN_CACHE_DIR", "XDG_CACHE_HOME", "KILN_CACHE=on", NULL};
        for (int run_ = 0; run_ < 2; run_++) {
            helper_with(env, (const char *[]){"gelu", "softmax", NULL}, NULL, &r);
            ck_assert_ran(&r, 2);
            ck_assert_msg(r.lines[0].from_disk == 0 && r.lines[1].from_disk == 0, "%s", r.out);
            ck_assert_msg(occurrences(r.err, "warning") == 1 && strstr(r.err, "HOME is not set"), "%s", r.err);
        }
    }
}
END_TEST

/* A cache directory that does not exist yet, in a directory where others
 * could make it (/tmp): read-only mode, which does not make it, does not
 * use it. Mode on makes it private first, and uses it. */
START_TEST(test_missing_directory_others_could_make)
{
    char root[64], var[96];
    snprintf(root, sizeof root, "/tmp/kiln-cache-missing-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    ck_assert_int_eq(rmdir(root), 0);
    snprintf(var, sizeof var, "KILN_CACHE_DIR=%s", root);
    static run_result r;
    helper_with((const char *[]){var, "KILN_CACHE=readonly", NULL}, (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    ck_assert_msg(occurrences(r.err, "warning") == 1 && strstr(r.err, "does not exist, and others can create it"),
                  "%s", r.err);
    helper_with((const char *[]){var, "KILN_CACHE=on", NULL}, (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    ck_assert_msg(!strstr(r.err, "warning"), "%s", r.err);
    helper_with((const char *[]){var, "KILN_CACHE=readonly", NULL}, (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    ck_assert_msg(r.lines[0].from_disk > 0 && !strstr(r.err, "warning"), "%s%s", r.out, r.err);
    struct stat st;
    ck_assert_int_eq(stat(root, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);
    cache_dir c;
    snprintf(c.root, sizeof c.root, "%s", root);
    remove_cache_dir(&c);
}
END_TEST

/* Links planted where kiln writes (the stats file, a dump, the temporary
 * file of an export) are replaced, never written through. */
START_TEST(test_planted_links_are_never_followed)
{
    cache_dir c;
    make_cache_dir(&c);
    char victim[128], stats[160], dumps[128], dump[192], bundle[128], text[256];
    snprintf(victim, sizeof victim, "%s/victim", c.root);
    write_text(victim, "precious\n");
    static run_result r;
    fill(&c, (const char *[]){"gelu", NULL}, &r);
    ck_assert_ran(&r, 1);
    snprintf(stats, sizeof stats, "%s/stats", c.dir);
    ck_assert_int_eq(unlink(stats), 0);
    ck_assert_int_eq(symlink(victim, stats), 0);
    helper(c.root, "on", (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    read_text(victim, text, sizeof text);
    ck_assert_msg(!strcmp(text, "precious\n"), "the stats file wrote through a link: %s", text);
    ck_assert(is_regular(stats));
    read_text(stats, text, sizeof text);
    ck_assert_msg(strstr(text, "hits 1"), "%s", text);

    snprintf(dumps, sizeof dumps, "%s/dumps", c.root);
    ck_assert_int_eq(mkdir(dumps, 0700), 0);
    snprintf(dump, sizeof dump, "%s/gelu.0.graph-before.txt", dumps);
    ck_assert_int_eq(symlink(victim, dump), 0);
    char dump_var[160];
    snprintf(dump_var, sizeof dump_var, "KILN_DUMP_DIR=%s", dumps);
    helper_with((const char *[]){"KILN_CACHE=off", "KILN_DUMP=graph", dump_var, NULL}, (const char *[]){"gelu", NULL},
                NULL, &r);
    ck_assert_ran(&r, 1);
    read_text(victim, text, sizeof text);
    ck_assert_msg(!strcmp(text, "precious\n"), "a dump wrote through a link: %s", text);
    ck_assert(is_regular(dump));

    /* An export's temporary file was <file>.tmp-<pid>: links for the pids
     * that come next. */
    snprintf(bundle, sizeof bundle, "%s/b.kbundle", c.root);
    char last[32] = "";
    read_text("/proc/sys/kernel/ns_last_pid", last, sizeof last);
    long next = atol(last) + 1;
    for (long pid = next; pid < next + 400; pid++) {
        char link[192];
        snprintf(link, sizeof link, "%s.tmp-%ld", bundle, pid);
        ck_assert_int_eq(symlink(victim, link), 0);
    }
    tool(c.root, (const char *[]){"export", bundle, "--all", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0, "%s", r.err);
    read_text(victim, text, sizeof text);
    ck_assert_msg(!strcmp(text, "precious\n"), "an export wrote through a link");
    ck_assert(is_regular(bundle));
    remove_cache_dir(&c);
}
END_TEST

/* A FIFO (or a directory) named like an entry is never waited on, and
 * kiln-cache reports it. */
START_TEST(test_fifos_are_reported_never_waited_on)
{
    cache_dir c;
    make_cache_dir(&c);
    static run_result clean, r;
    fill(&c, (const char *[]){"gelu", NULL}, &clean);
    ck_assert_ran(&clean, 1);
    int n;
    cache_file *files = entries(&c, &n);
    ck_assert_int_eq(n, 1);
    char path[256], fifo[256], directory[256];
    entry_path(&c, &files[0], path, sizeof path);
    free(files);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    run_options bounded = {.alarm_s = 120};
    helper(c.root, "on", (const char *[]){"gelu", NULL}, &bounded, &r);
    ck_assert_ran(&r, 1);
    ck_assert_int_eq(r.lines[0].hash, clean.lines[0].hash);
    ck_assert_msg(occurrences(r.err, "is a FIFO") == 1, "%s", r.err);
    ck_assert_msg(is_regular(path), "the entry was not compiled again in the FIFO's place");

    snprintf(fifo, sizeof fifo, "%s/%064d.kiln", c.dir, 0);
    snprintf(directory, sizeof directory, "%s/%063d1.kiln", c.dir, 0);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(mkdir(directory, 0700), 0);
    tool(c.root, (const char *[]){"verify", NULL}, &bounded, &r);
    ck_assert_msg(r.status == 1 && occurrences(r.out, "is a FIFO") == 1 && occurrences(r.out, "is a directory") == 1 &&
                      strstr(r.out, "2 unreadable"),
                  "exit %d\n%s%s", r.status, r.out, r.err);
    tool(c.root, (const char *[]){"ls", NULL}, &bounded, &r);
    ck_assert_msg(r.status == 0 && occurrences(r.out, "is a FIFO") == 1 && occurrences(r.out, "is a directory") == 1,
                  "exit %d\n%s%s", r.status, r.out, r.err);
    tool(c.root, (const char *[]){"prune", "--max-bytes", "0", NULL}, &bounded, &r);
    ck_assert_msg(r.status == 0 && strstr(r.err, "is a FIFO") && strstr(r.err, "is a directory") &&
                      strstr(r.out, "removed 1 entries"),
                  "exit %d\n%s%s", r.status, r.out, r.err);
    struct stat st;
    ck_assert(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
    remove_cache_dir(&c);
}
END_TEST

/* A file's header is checked against its size before anything else is
 * read: a huge file named like an entry or given as a bundle costs neither
 * its size in memory nor the time to read it. */
START_TEST(test_huge_files_are_not_read_whole)
{
    const off_t huge = (off_t)256 << 20;
    const long small_kb = 128 << 10; /* half of it */
    /* A child's peak memory includes what it had before exec, as a fork of
     * this process: under valgrind, valgrind's own. */
    const bool measures_parent = UNDER_VALGRIND();
    cache_dir c;
    make_cache_dir(&c);
    static run_result r;
    fill(&c, (const char *[]){"gelu", NULL}, &r);
    ck_assert_ran(&r, 1);
    char bundle[128], sparse[256], grown[128], zeros[128];
    snprintf(bundle, sizeof bundle, "%s/b.kbundle", c.root);
    tool(c.root, (const char *[]){"export", bundle, "--all", NULL}, NULL, &r);
    ck_assert_msg(r.status == 0, "%s", r.err);
    int n;
    cache_file *files = entries(&c, &n);
    ck_assert_int_eq(n, 1);
    char entry[256];
    entry_path(&c, &files[0], entry, sizeof entry);
    free(files);
    /* A sparse file of zeros, and a sound entry grown to the same size. */
    snprintf(sparse, sizeof sparse, "%s/%064d.kiln", c.dir, 0);
    write_text(sparse, "");
    ck_assert_int_eq(truncate(sparse, huge), 0);
    ck_assert_int_eq(truncate(entry, huge), 0);
    tool(c.root, (const char *[]){"verify", NULL}, NULL, &r);
    ck_assert_msg(r.status == 1 && strstr(r.out, "2 damaged"), "%s%s", r.out, r.err);
    ck_assert_msg(r.max_rss_kb < small_kb || measures_parent, "verify took %ld KiB", r.max_rss_kb);
    /* Bundles likewise: one of zeros, and a sound one grown. */
    snprintf(zeros, sizeof zeros, "%s/zeros.kbundle", c.root);
    write_text(zeros, "");
    ck_assert_int_eq(truncate(zeros, huge), 0);
    snprintf(grown, sizeof grown, "%s/grown.kbundle", c.root);
    char cmd[320];
    snprintf(cmd, sizeof cmd, "cp %s %s", bundle, grown);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(truncate(grown, huge), 0);
    const char *bad[] = {zeros, grown};
    for (int i = 0; i < 2; i++) {
        cache_dir to;
        make_cache_dir(&to);
        tool(to.root, (const char *[]){"import", bad[i], NULL}, NULL, &r);
        ck_assert_msg(r.status == 1 && strstr(r.err, "rejected"), "%s", r.err);
        ck_assert_msg(r.max_rss_kb < small_kb || measures_parent, "import of %s took %ld KiB", bad[i],
                      r.max_rss_kb);
        remove_cache_dir(&to);
    }
    remove_cache_dir(&c);
}
END_TEST

/* Metadata from a bundle is shown with its control characters escaped, and
 * so are names. */
START_TEST(test_ls_escapes_what_entries_say)
{
    cache_dir c;
    make_cache_dir(&c);
    cache_entry e = sample_entry();
    snprintf(e.meta.function, sizeof e.meta.function, "evil\x1b]0;owned\x07");
    snprintf(e.meta.signature, sizeof e.meta.signature, "f32[4]\x1b[2J\x9b");
    char why[256];
    ck_assert_msg(cache_write(c.dir, &e, why, sizeof why) == 0, "%s", why);
    cache_entry_free(&e);
    char odd[160];
    snprintf(odd, sizeof odd, "%s/\x1b[31m.kiln", c.dir);
    write_text(odd, "");
    static run_result r;
    tool(c.root, (const char *[]){"ls", NULL}, NULL, &r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_msg(!strpbrk(r.out, "\x1b\x07\x9b"), "raw control characters in:\n%s", r.out);
    ck_assert_msg(strstr(r.out, "evil\\x1b]0;owned\\x07 (f32[4]\\x1b[2J\\x9b)") && strstr(r.out, "\\x1b[31m.kiln"),
                  "%s", r.out);
    remove_cache_dir(&c);
}
END_TEST

/* The longest prefix of root padded with "/." (and one more "/" when
 * needed) to exactly length characters. */
static void padded(const char *root, size_t length, char *out, size_t size)
{
    ck_assert(length < size);
    snprintf(out, size, "%s%s", root, (length - strlen(root)) % 2 ? "/" : "");
    while (strlen(out) < length)
        strcat(out, "/.");
}

/* Paths longer than kiln keeps are refused with a message; they were cut
 * short, and entries or dumps went to the directory the cut named. */
START_TEST(test_long_paths_are_refused)
{
    cache_dir c;
    make_cache_dir(&c);
    static char long_dir[2048], var[2100];
    static run_result r;
    padded(c.root, 1000, long_dir, sizeof long_dir);
    strcat(long_dir, "/beyond-the-cut-and-past-the-limit-of-1021");
    snprintf(var, sizeof var, "KILN_CACHE_DIR=%s", long_dir);
    helper_with((const char *[]){var, "KILN_CACHE=on", NULL}, (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    ck_assert_msg(occurrences(r.err, "warning") == 1 && strstr(r.err, "KILN_CACHE_DIR is 1042 characters long"),
                  "%s", r.err);
    ck_assert_msg(access(c.dir, F_OK) < 0, "entries went to %s", c.dir);

    padded(c.root, 511, long_dir, sizeof long_dir);
    strcat(long_dir, "/missing");
    snprintf(var, sizeof var, "KILN_DUMP_DIR=%s", long_dir);
    helper_with((const char *[]){var, "KILN_DUMP=graph", "KILN_CACHE=off", NULL}, (const char *[]){"gelu", NULL}, NULL,
                &r);
    ck_assert_ran(&r, 1);
    ck_assert_msg(strstr(r.err, "KILN_DUMP_DIR is 519 characters long"), "%s", r.err);
    ck_assert_msg(files_starting(c.root, "gelu") == 0, "dumps went to %s", c.root);
    remove_cache_dir(&c);
}
END_TEST

/* KILN_PROFILE=1 times each step of a call on stderr; without it, nothing. */
START_TEST(test_profile_names_each_step)
{
    static run_result r;
    helper_with((const char *[]){"KILN_CACHE=off", "KILN_PROFILE=1", NULL}, (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    const char *line = strstr(r.err, "kiln profile: step ");
    ck_assert_msg(line && strstr(line, " kernel ") && strstr(line, " us\n") && strstr(r.err, "] eager "), "%s", r.err);
    helper_with((const char *[]){"KILN_CACHE=off", NULL}, (const char *[]){"gelu", NULL}, NULL, &r);
    ck_assert_ran(&r, 1);
    ck_assert_msg(!strstr(r.err, "kiln profile"), "%s", r.err);
}
END_TEST

static Suite *cache_suite(void)
{
    Suite *s = suite_create("cache");
    TCase *keys = tcase_create("keys");
    tcase_add_test(keys, test_key_changes_with_every_component);
    tcase_add_test(keys, test_entry_rejects_every_damage);
    tcase_add_test(keys, test_functions_share_kernels_in_a_process);
    tcase_add_test(keys, test_options_are_in_the_key);
    tcase_add_test(keys, test_threads_share_and_unload_kernels);
    suite_add_tcase(s, keys);
    TCase *processes = tcase_create("processes");
    tcase_set_timeout(processes, 300);
    tcase_add_test(processes, test_second_process_compiles_nothing);
    tcase_add_test(processes, test_log_names_each_key_component_on_a_miss);
    tcase_add_loop_test(processes, test_damaged_entries_cost_time_not_answers, 0,
                        (int)(sizeof damages / sizeof *damages));
    tcase_add_test(processes, test_killed_writers_leave_nothing_that_loads);
    tcase_add_test(processes, test_four_processes_fill_one_cache);
    tcase_add_test(processes, test_require_names_the_missing_kernel);
    tcase_add_test(processes, test_off_and_readonly_modes_write_nothing);
    tcase_add_loop_test(processes, test_untrusted_directories_are_not_used, 0,
                        (int)(sizeof untrusted / sizeof *untrusted));
    tcase_add_test(processes, test_no_home_means_no_disk_cache);
    tcase_add_test(processes, test_missing_directory_others_could_make);
    tcase_add_test(processes, test_planted_links_are_never_followed);
    tcase_add_test(processes, test_fifos_are_reported_never_waited_on);
    tcase_add_test(processes, test_huge_files_are_not_read_whole);
    tcase_add_test(processes, test_ls_escapes_what_entries_say);
    tcase_add_test(processes, test_long_paths_are_refused);
    tcase_add_test(processes, test_readonly_directory_works_with_one_warning);
    tcase_add_test(processes, test_full_disk_works_with_one_warning);
    tcase_add_test(processes, test_size_cap_evicts_least_recently_used);
    tcase_add_test(processes, test_other_cpu_entries_are_never_loaded_here);
    tcase_add_test(processes, test_precompile_for_a_named_machine_serves_its_host);
    tcase_add_test(processes, test_precompile_for_a_narrower_machine_runs_here);
    tcase_add_test(processes, test_precompile_rejects_bad_targets);
    tcase_add_test(processes, test_bundle_ships_a_complete_cache);
    tcase_add_test(processes, test_bundle_with_a_bad_entry_is_rejected_whole);
    tcase_add_test(processes, test_import_into_readonly_directory_errors);
    tcase_add_test(processes, test_profile_names_each_step);
    suite_add_tcase(s, processes);
    return s;
}

KILN_TEST_MAIN(cache_suite)
