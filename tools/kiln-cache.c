/* kiln-cache: inspect, check, trim, pack and unpack a kiln cache.
 *
 *   kiln-cache [--dir ROOT] ls | stat | verify | prune --max-bytes N |
 *              export FILE [--all | KEY...] | import FILE | target
 *   kiln-cache --help | --version
 *
 * ROOT defaults to what kiln itself uses (KILN_CACHE_DIR, else
 * $XDG_CACHE_HOME/kiln, else ~/.cache/kiln). Exit status: 0, 1 when verify
 * finds damage or a command fails, 2 on bad usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <kiln/kiln.h>

#include "cache/cache.h"

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

/* Reads and checks one listed file, changing nothing; 0, or -1 with why. */
static int check_file(const char *dir, const cache_file *f, cache_entry *e, char *why, size_t size)
{
    if (!f->keyed) {
        snprintf(why, size, "%.300s/%s: its name is not a key", dir, f->name);
        return -1;
    }
    return cache_read(dir, &f->key, NULL, false, e, why, size) == CACHE_FOUND ? 0 : -1;
}

static int cmd_ls(const char *dir)
{
    cache_file *files;
    int n;
    if (list_or_fail(dir, &files, &n) < 0)
        return 1;
    printf("%-16s  %-7s %-28s %10s  %-19s  %s\n", "KEY", "BACKEND", "TARGET", "BYTES", "LAST USE", "FUNCTION (SIGNATURE)");
    for (int i = 0; i < n; i++) {
        cache_entry e;
        char why[512], when[32];
        struct tm tm;
        time_t t = (time_t)files[i].last_use;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
        if (check_file(dir, &files[i], &e, why, sizeof why) < 0) {
            printf("%-16.16s  damaged: %s\n", files[i].name, why);
            continue;
        }
        char target[29];
        const char *cpu = strstr(e.meta.target, "cpu=");
        snprintf(target, sizeof target, "%.*s", (int)strcspn(cpu ? cpu + 4 : e.meta.target, " "),
                 cpu ? cpu + 4 : e.meta.target);
        printf("%-16.16s  %-7s %-28s %10lld  %-19s  %s (%s)\n", files[i].name, e.meta.backend, target,
               (long long)files[i].bytes, when, e.meta.function, e.meta.signature);
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
    for (int i = 0; i < n; i++)
        bytes += files[i].bytes;
    cache_counts_read(dir, &hits, &misses);
    cache_config config;
    cache_config_from_env(&config);
    printf("directory  %s\nentries    %d\nbytes      %lld\nlimit      %lld\nhits       %lld\nmisses     %lld\n",
           dir, n, (long long)bytes, (long long)config.max_bytes, (long long)hits, (long long)misses);
    free(files);
    return 0;
}

static int cmd_verify(const char *dir)
{
    cache_file *files;
    int n, bad = 0;
    if (list_or_fail(dir, &files, &n) < 0)
        return 1;
    for (int i = 0; i < n; i++) {
        cache_entry e;
        char why[512];
        if (check_file(dir, &files[i], &e, why, sizeof why) < 0) {
            printf("damaged  %s\n", why);
            bad++;
        } else {
            cache_entry_free(&e);
        }
    }
    printf("%d entries, %d damaged\n", n, bad);
    free(files);
    return bad ? 1 : 0;
}

static int cmd_prune(const char *dir, int argc, char **argv)
{
    char *end = NULL;
    long long max = argc == 2 && !strcmp(argv[0], "--max-bytes") ? strtoll(argv[1], &end, 10) : -1;
    if (!end || *end || max < 0)
        return usage("prune takes --max-bytes N");
    printf("removed %d entries\n", cache_evict(dir, max));
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
        if (files[i].keyed)
            (*keys)[(*n)++] = files[i].key;
    free(files);
    return status;
}

static int write_file(const char *path, const void *bytes, size_t size)
{
    char temp[CACHE_PATH_MAX + 32];
    snprintf(temp, sizeof temp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(temp, "wb");
    bool ok = f && fwrite(bytes, 1, size, f) == size;
    ok = f && fclose(f) == 0 && ok;
    if (ok && rename(temp, path) == 0)
        return 0;
    int saved = errno;
    if (f)
        remove(temp);
    errno = saved;
    return -1;
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
    int status = write_file(argv[0], bundle, size);
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
    if (cache_read_file(argv[0], &bytes, &size) < 0) {
        fprintf(stderr, "kiln-cache: import: cannot read %s: %s\n", argv[0], strerror(errno));
        return 1;
    }
    cache_entry *entries;
    int n;
    char why[1024];
    int status = cache_bundle_unpack(bytes, size, &entries, &n, why, sizeof why);
    free(bytes);
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

int main(int argc, char **argv)
{
    char dir[CACHE_PATH_MAX];
    cache_config config;
    cache_config_from_env(&config);
    snprintf(dir, sizeof dir, "%s", config.dir);
    int a = 1;
    if (a + 1 < argc && !strcmp(argv[a], "--dir")) {
        cache_dir_of_root(argv[a + 1], dir, sizeof dir);
        a += 2;
    }
    if (a >= argc)
        return usage("no command");
    const char *cmd = argv[a++];
    int rest = argc - a;
    char **args = argv + a;
    if (!strcmp(cmd, "ls") && !rest)
        return cmd_ls(dir);
    if (!strcmp(cmd, "stat") && !rest)
        return cmd_stat(dir);
    if (!strcmp(cmd, "verify") && !rest)
        return cmd_verify(dir);
    if (!strcmp(cmd, "prune"))
        return cmd_prune(dir, rest, args);
    if (!strcmp(cmd, "export"))
        return cmd_export(dir, rest, args);
    if (!strcmp(cmd, "import"))
        return cmd_import(dir, rest, args);
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
    return usage("unknown command or arguments");
}
