/* kiln-cache: inspect, check, trim, pack and unpack a kiln cache.
 *
 *   kiln-cache [--dir ROOT] ls | stat | verify | prune --max-bytes N |
 *              export FILE [--all | KEY...] | import FILE | target
 *   kiln-cache --help | --version
 *
 * ROOT defaults to what kiln itself uses (KILN_CACHE_DIR, else
 * $XDG_CACHE_HOME/kiln, else ~/.cache/kiln). Exit status: 0, 1 when verify
 * finds damage or a command fails, 2 on bad usage. What entries and their
 * names say is printed with control characters escaped: anyone may have
 * made a bundle. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <kiln/kiln.h>

#include "cache/cache.h"
#include "core/core.h"

static const char USAGE[] =
    "usage: kiln-cache [--dir ROOT] COMMAND\n"
    "       kiln-cache --help | --version\n"
    "  ls                         entries: key, backend, target, size, last use, function and signature\n"
    "  stat                       entries, bytes, disk hits and misses\n"
    "  verify                     check every entry; exit 1 if any is damaged\n"
    "  prune --max-bytes N        remove least recently used entries down to N bytes\n"
    "  export FILE [--all|KEY...] pack entries (all, or those whose keys start with KEY) into a bundle\n"
    "  import FILE                check every entry of a bundle, then install them all\n"
    "  target                     this machine as a kiln_fn_precompile target, to build its entries elsewhere\n";

static int usage(const char *why)
{
    fprintf(stderr, "kiln-cache: %s\n%s", why, USAGE);
    return 2;
}

static int list_or_fail(const char *dir, cache_file **files, int *n)
{
    if (cache_list(dir, files, n) == 0)
        return 0;
    if (errno == ENOENT) {
        *files = NULL;
        *n = 0;
        return 0;
    }
    fprintf(stderr, "kiln-cache: cannot read %s: %s\n", dir, strerror(errno));
    return -1;
}

/* text with every byte outside printable ASCII, and the backslash, written
 * as \xHH into out (cut short, never inside an escape, when out is small). */
static const char *shown(const char *text, char *out, size_t size)
{
    size_t used = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        bool plain = *p >= 0x20 && *p < 0x7f && *p != '\\';
        if (used + (plain ? 1 : 4) >= size)
            break;
        if (plain)
            out[used++] = (char)*p;
        else
            used += (size_t)snprintf(out + used, size - used, "\\x%02x", *p);
    }
    out[used] = '\0';
    return out;
}

enum { SHOWN_MAX = 4 * 4400 + 1 };

/* Reads and checks one listed file, changing nothing: CACHE_FOUND, or
 * CACHE_DAMAGED or CACHE_UNREADABLE with why. */
static int check_file(const char *dir, const cache_file *f, cache_entry *e, char *why, size_t size)
{
    if (!f->keyed) {
        snprintf(why, size, "%.300s/%s: its name is not a key", dir, f->name);
        return CACHE_DAMAGED;
    }
    int found = cache_read(dir, &f->key, NULL, false, e, why, size);
    if (found == CACHE_ABSENT) /* removed since it was listed */
        snprintf(why, size, "%.300s/%s: removed meanwhile", dir, f->name);
    return found == CACHE_ABSENT ? CACHE_UNREADABLE : found;
}

static int cmd_ls(const char *dir)
{
    cache_file *files;
    int n;
    if (list_or_fail(dir, &files, &n) < 0)
        return 1;
    printf("%-16s  %-7s %-28s %10s  %-19s  %s\n", "KEY", "BACKEND", "TARGET", "BYTES", "LAST USE", "FUNCTION (SIGNATURE)");
    static char name[SHOWN_MAX], backend[SHOWN_MAX], target[SHOWN_MAX], function[SHOWN_MAX], signature[SHOWN_MAX];
    for (int i = 0; i < n; i++) {
        cache_entry e;
        char why[1024], when[32];
        struct tm tm;
        time_t t = (time_t)files[i].last_use;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
        shown(files[i].name, name, 17);
        int found = check_file(dir, &files[i], &e, why, sizeof why);
        if (found != CACHE_FOUND) {
            printf("%-16s  %s: %s\n", name, found == CACHE_DAMAGED ? "damaged" : "unreadable",
                   shown(why, signature, sizeof signature));
            continue;
        }
        char cut[29];
        const char *cpu = strstr(e.meta.target, "cpu=");
        snprintf(cut, sizeof cut, "%.*s", (int)strcspn(cpu ? cpu + 4 : e.meta.target, " "),
                 cpu ? cpu + 4 : e.meta.target);
        printf("%-16s  %-7s %-28s %10lld  %-19s  %s (%s)\n", name, shown(e.meta.backend, backend, sizeof backend),
               shown(cut, target, sizeof target), (long long)files[i].bytes, when,
               shown(e.meta.function, function, sizeof function), shown(e.meta.signature, signature, sizeof signature));
        cache_entry_free(&e);
    }
    free(files);
    return 0;
}

static int cmd_stat(const char *dir)
{
    cache_file *files;
    int n;
    if (list_or_fail(dir, &files, &n) < 0)
        return 1;
    int64_t bytes = 0, hits, misses;
    int entries = 0;
    for (int i = 0; i < n; i++) {
        bytes += files[i].bytes;
        entries += S_ISREG(files[i].mode);
    }
    cache_counts_read(dir, &hits, &misses);
    cache_config config;
    cache_settings_from_env(&config);
    static char shown_dir[SHOWN_MAX];
    printf("directory  %s\nentries    %d\nbytes      %lld\nlimit      %lld\nhits       %lld\nmisses     %lld\n",
           shown(dir, shown_dir, sizeof shown_dir), entries, (long long)bytes, (long long)config.max_bytes,
           (long long)hits, (long long)misses);
    if (n > entries)
        printf("other      %d files named like entries that are not regular files\n", n - entries);
    free(files);
    return 0;
}

static int cmd_verify(const char *dir)
{
    cache_file *files;
    int n, bad = 0;
    if (list_or_fail(dir, &files, &n) < 0)
        return 1;
    int unreadable = 0;
    static char text[SHOWN_MAX];
    for (int i = 0; i < n; i++) {
        cache_entry e;
        char why[1024];
        int found = check_file(dir, &files[i], &e, why, sizeof why);
        if (found == CACHE_FOUND)
            cache_entry_free(&e);
        else
            printf("%-10s %s\n", found == CACHE_DAMAGED ? "damaged" : "unreadable", shown(why, text, sizeof text));
        bad += found == CACHE_DAMAGED;
        unreadable += found == CACHE_UNREADABLE;
    }
    printf("%d entries, %d damaged, %d unreadable\n", n, bad, unreadable);
    bad += unreadable;
    free(files);
    return bad ? 1 : 0;
}

/* Says which files named like entries are not regular files (a FIFO, a
 * directory): nothing kiln wrote, and never read as entries. */
static void report_irregular(const char *dir, const char *what_then)
{
    cache_file *files;
    int n;
    if (cache_list(dir, &files, &n) < 0)
        return;
    static char name[SHOWN_MAX];
    for (int i = 0; i < n; i++)
        if (!S_ISREG(files[i].mode))
            fprintf(stderr, "kiln-cache: %s is %s, not an entry file; %s\n", shown(files[i].name, name, sizeof name),
                    core_file_kind(files[i].mode), what_then);
    free(files);
}

static int cmd_prune(const char *dir, int argc, char **argv)
{
    char *end = NULL;
    long long max = argc == 2 && !strcmp(argv[0], "--max-bytes") ? strtoll(argv[1], &end, 10) : -1;
    if (!end || *end || max < 0)
        return usage("prune takes --max-bytes N");
    report_irregular(dir, "left alone");
    printf("removed %d entries\n", cache_evict(dir, max, NULL));
    return 0;
}

/* The keys of the entries to export: all, or those whose names start with the prefixes. */
static int chosen_keys(const char *dir, int argc, char **argv, cache_key **keys, int *n)
{
    cache_file *files;
    int count;
    if (list_or_fail(dir, &files, &count) < 0)
        return -1;
    *keys = calloc((size_t)count + 1, sizeof **keys);
    *n = 0;
    bool all = argc == 1 && !strcmp(argv[0], "--all");
    int status = *keys ? 0 : -1;
    for (int a = 0; status == 0 && !all && a < argc; a++) {
        int matches = 0;
        for (int i = 0; i < count; i++)
            if (files[i].keyed && !strncmp(files[i].name, argv[a], strlen(argv[a])) && strlen(argv[a]) >= 4) {
                (*keys)[(*n)++] = files[i].key;
                matches++;
            }
        if (matches != 1) {
            fprintf(stderr, "kiln-cache: export: key %s matches %d entries (need one)\n", argv[a], matches);
            status = -1;
        }
    }
    for (int i = 0; status == 0 && all && i < count; i++)
        if (files[i].keyed && S_ISREG(files[i].mode))
            (*keys)[(*n)++] = files[i].key;
    if (all)
        report_irregular(dir, "not exported");
    free(files);
    return status;
}

static int cmd_export(const char *dir, int argc, char **argv)
{
    if (argc < 2)
        return usage("export takes FILE and --all or keys");
    cache_key *keys = NULL;
    int n;
    if (chosen_keys(dir, argc - 1, argv + 1, &keys, &n) < 0) {
        free(keys);
        return 1;
    }
    char why[1024];
    size_t size;
    void *bundle = cache_bundle_pack(dir, keys, n, &size, why, sizeof why);
    free(keys);
    if (!bundle) {
        fprintf(stderr, "kiln-cache: export: %s\n", why);
        return 1;
    }
    int status = core_write_file(argv[0], bundle, size, 0666);
    if (status < 0)
        fprintf(stderr, "kiln-cache: export: cannot write %s: %s\n", argv[0], strerror(errno));
    else
        printf("exported %d entries (%zu bytes) to %s\n", n, size, argv[0]);
    free(bundle);
    return status < 0 ? 1 : 0;
}

static int cmd_import(const char *dir, int argc, char **argv)
{
    if (argc != 1)
        return usage("import takes FILE");
    void *bytes;
    size_t size;
    cache_entry *entries;
    int n;
    char why[1024];
    int status = cache_bundle_read(argv[0], &bytes, &size, why, sizeof why);
    if (status == 0) {
        status = cache_bundle_unpack(bytes, size, &entries, &n, why, sizeof why);
        free(bytes);
    }
    if (status < 0) {
        fprintf(stderr, "kiln-cache: import: %s rejected, nothing installed: %s\n", argv[0], why);
        return 1;
    }
    int installed = 0;
    for (int i = 0; i < n && status == 0; i++) {
        if ((status = cache_write(dir, &entries[i], why, sizeof why)) < 0)
            fprintf(stderr, "kiln-cache: import: %s\n", why);
        else
            installed++;
    }
    for (int i = 0; i < n; i++)
        cache_entry_free(&entries[i]);
    free(entries);
    printf("installed %d of %d entries into %s\n", installed, n, dir);
    return status < 0 ? 1 : 0;
}

/* The cache directory to work on (under --dir ROOT, else the one the
 * environment names) and its anchor (see cache_dir_trusted): 0, or -1
 * after saying why there is none. */
static int cache_dir_of(const char *given, char *dir, char *anchor, size_t size)
{
    char root[CACHE_PATH_MAX], why[CACHE_PATH_MAX + 128] = "";
    if (!given && cache_root_from_env(root, anchor, size, why, sizeof why) < 0) {
        fprintf(stderr, "kiln-cache: no cache directory: %s; name one with --dir ROOT\n", why);
        return -1;
    }
    if (given)
        snprintf(anchor, size, "%s", given);
    if (cache_dir_of_root(given ? given : root, dir, size) < 0) {
        fprintf(stderr, "kiln-cache: the cache directory under %.200s... is too long\n", given ? given : root);
        return -1;
    }
    return 0;
}

/* Says so when kiln would not load what dir holds. */
static void note_untrusted(const char *dir, const char *anchor)
{
    char why[CACHE_PATH_MAX + 128];
    static char text[SHOWN_MAX];
    if (!cache_dir_trusted(anchor, dir, why, sizeof why))
        fprintf(stderr, "kiln-cache: note: kiln does not load code from this directory: %s\n",
                shown(why, text, sizeof text));
}

int main(int argc, char **argv)
{
    int a = 1;
    const char *given = NULL;
    if (a + 1 < argc && !strcmp(argv[a], "--dir")) {
        given = argv[a + 1];
        a += 2;
    }
    if (a >= argc)
        return usage("no command");
    const char *cmd = argv[a++];
    int rest = argc - a;
    char **args = argv + a;
    if (!strcmp(cmd, "target") && !rest) {
        const char *target = kiln_host_target();
        if (!target)
            fprintf(stderr, "kiln-cache: %s\n", kiln_last_error());
        else
            printf("%s\n", target);
        return target ? 0 : 1;
    }
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("kiln-cache %s (libkiln %s, cache format %d)\n", KILN_VERSION_STRING, kiln_version(),
               CACHE_FORMAT_VERSION);
        return 0;
    }
    char dir[CACHE_PATH_MAX], anchor[CACHE_PATH_MAX];
    if (cache_dir_of(given, dir, anchor, sizeof dir) < 0)
        return 1;
    int status = 2;
    if (!strcmp(cmd, "ls") && !rest)
        status = cmd_ls(dir);
    else if (!strcmp(cmd, "stat") && !rest)
        status = cmd_stat(dir);
    else if (!strcmp(cmd, "verify") && !rest)
        status = cmd_verify(dir);
    else if (!strcmp(cmd, "prune"))
        return cmd_prune(dir, rest, args);
    else if (!strcmp(cmd, "export"))
        return cmd_export(dir, rest, args);
    else if (!strcmp(cmd, "import"))
        status = cmd_import(dir, rest, args);
    else
        return usage("unknown command or arguments");
    if (status != 2)
        note_untrusted(dir, anchor);
    return status;
}
