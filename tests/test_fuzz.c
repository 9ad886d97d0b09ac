/* Mutated .npy and .safetensors files: the readers load them or fail with an
 * error, and never crash or leak (run under ASan, UBSan and valgrind in CI).
 * The seeds are the io suite's files and the small corpus below; the
 * mutations are deterministic, so a failure reproduces. */
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include "test_common.h"

enum { MAX_FILE = 4096, MAX_SEEDS = 64, MUTATIONS = 1000 };

typedef struct {
    unsigned char bytes[MAX_FILE];
    size_t len;
} file;

static file seeds[MAX_SEEDS];
static int n_seeds;
/* The readers' input lives in memory: a file in /tmp rewritten 100,000
 * times would wait on the disk (ext4 flushes a truncated file on close). */
static int input_fd = -1;
static char path[64];

/* Hand-written edge cases, valid and not, for the mutations to start from. */
static const struct {
    const char *bytes;
    size_t len;
} corpus[] = {
#define BYTES(s) {s, sizeof s - 1}
    BYTES("\x93NUMPY\x01\x00\x3c\x00{'descr':'<i8','fortran_order':True,'shape':(2L,1L)}      \n"
          "\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0"),
    BYTES("\x93NUMPY\x02\x00\x40\x00\x00\x00{'shape': (3,), 'descr': '|b1', 'fortran_order': False}"
          "          \n\x00\x01\x02"),
    BYTES("\x93NUMPY\x01\x00\x36\x00{'descr': '>f4', 'fortran_order': False, 'shape': ()}\n\x3f\x80\0\0"),
    BYTES("\x10\0\0\0\0\0\0\0{\"__metadata__\":{}}"),
    BYTES("\x08\0\0\0\0\0\0\0{}      "),
    BYTES("\x48\0\0\0\0\0\0\0{\"\\u00e9\\ud83d\\ude00\\n\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[0,3]}} "
          "      \x00\x01\x02"),
    BYTES("\x40\0\0\0\0\0\0\0{\"x\":{\"data_offsets\":[0,16],\"shape\":[2],\"dtype\":\"F64\"}}        "
          "\0\0\0\0\0\0\xf0\x3f\0\0\0\0\0\0\0\x40"),
#undef BYTES
};

/* -- Seeds ----------------------------------------------------------------- */

static void add_seed(const void *bytes, size_t len)
{
    ck_assert_int_lt(n_seeds, MAX_SEEDS);
    ck_assert_int_le(len, MAX_FILE);
    memcpy(seeds[n_seeds].bytes, bytes, len);
    seeds[n_seeds++].len = len;
}

static void add_seed_file(const char *name)
{
    FILE *f = fopen(name, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", name);
    unsigned char bytes[MAX_FILE];
    size_t len = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    add_seed(bytes, len);
}

static void load_seeds(void)
{
    const char *data = getenv("KILN_TEST_DATA");
    char dir[512], name[1024];
    snprintf(dir, sizeof dir, "%s/npy", data ? data : "tests/data");
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "cannot read %s", dir);
    for (struct dirent *e; (e = readdir(d));) {
        if (!strstr(e->d_name, ".npy"))
            continue;
        snprintf(name, sizeof name, "%s/%s", dir, e->d_name);
        add_seed_file(name);
    }
    closedir(d);
    snprintf(name, sizeof name, "%s/tensors.safetensors", data ? data : "tests/data");
    add_seed_file(name);
    for (size_t i = 0; i < sizeof corpus / sizeof *corpus; i++)
        add_seed(corpus[i].bytes, corpus[i].len);
}

/* -- Running the readers ----------------------------------------------------- */

typedef struct {
    int64_t loaded, refused;
} tally;

/* Both readers on f: each loads or reports its own error. */
static void run_readers(const file *f, tally *t)
{
    ck_assert_int_eq(ftruncate(input_fd, 0), 0);
    ck_assert_int_eq(pwrite(input_fd, f->bytes, f->len, 0), (ssize_t)f->len);

    kiln_clear_error();
    kiln_tensor *x = kiln_load_npy(path);
    if (x) {
        t->loaded++;
        kiln_release(x);
    } else {
        t->refused++;
        ck_assert_msg(!strncmp(kiln_last_error(), "kiln_load_npy: ", 15), "npy: %s", kiln_last_error());
    }
    static const char *const names[] = {"weight", "ids"};
    for (int pass = 0; pass < 2; pass++) {
        kiln_named_tensor *ts = NULL;
        kiln_clear_error();
        int n = kiln_load_safetensors(path, pass ? names : NULL, 2, &ts);
        if (n >= 0) {
            t->loaded++;
            kiln_free_named_tensors(ts, n);
            continue;
        }
        t->refused++;
        ck_assert_msg(!ts && !strncmp(kiln_last_error(), "kiln_load_safetensors: ", 23), "safetensors: %s",
                      kiln_last_error());
    }
}

/* -- Mutations --------------------------------------------------------------- */

static uint64_t next(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static void mutate_once(file *f, uint64_t *rng)
{
    static const unsigned char interesting[] = {0, 1, 0x7f, 0x80, 0xff, '0', '9', ' ', '{', '}', '[', ']', '(',
                                                ')', '"', '\'', ',', ':', '\\', '-', 'L', '\n'};
    size_t at = f->len ? next(rng) % f->len : 0;
    size_t span = 1 + next(rng) % 16;
    switch (next(rng) % 7) {
    case 0: /* a bit */
        if (f->len)
            f->bytes[at] ^= (unsigned char)(1u << next(rng) % 8);
        break;
    case 1: /* a byte that means something to the parsers */
        if (f->len)
            f->bytes[at] = interesting[next(rng) % sizeof interesting];
        break;
    case 2: /* a length field: npy's at 8, safetensors' at 0 */
        for (size_t i = next(rng) % 2 ? 8 : 0, n = 1 + next(rng) % 4; n-- && i < f->len; i++)
            f->bytes[i] = (unsigned char)next(rng);
        break;
    case 3: /* bytes removed */
        span = at + span > f->len ? f->len - at : span;
        memmove(f->bytes + at, f->bytes + at + span, f->len - at - span);
        f->len -= span;
        break;
    case 4: /* bytes repeated */
        span = at + span > f->len ? f->len - at : span;
        span = f->len + span > MAX_FILE ? 0 : span;
        memmove(f->bytes + at + span, f->bytes + at, f->len - at);
        f->len += span;
        break;
    case 5: /* cut short */
        f->len = at;
        break;
    default: { /* a piece of another seed */
        const file *other = &seeds[next(rng) % (uint64_t)n_seeds];
        size_t from = other->len ? next(rng) % other->len : 0;
        span = from + span > other->len ? other->len - from : span;
        span = at + span > MAX_FILE ? MAX_FILE - at : span;
        memcpy(f->bytes + at, other->bytes + from, span);
        f->len = at + span > f->len ? at + span : f->len;
    }
    }
}

START_TEST(test_truncated_files)
{
    tally t = {0, 0};
    int64_t live = kiln_live_tensors();
    int step = UNDER_VALGRIND() ? 13 : 1;
    for (int s = 0; s < n_seeds; s++) {
        file f = seeds[s];
        for (size_t len = 0; len <= seeds[s].len; len += (size_t)step) {
            f.len = len;
            run_readers(&f, &t);
        }
    }
    ck_assert_int_gt(t.loaded, 0);
    ck_assert_int_gt(t.refused, 0);
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

START_TEST(test_mutated_files)
{
    tally t = {0, 0};
    int64_t live = kiln_live_tensors();
    int mutations = UNDER_VALGRIND() ? MUTATIONS / 20 : MUTATIONS;
    for (int s = 0; s < n_seeds; s++) {
        uint64_t rng = 0x9e3779b97f4a7c15u * (uint64_t)(s + 1);
        for (int m = 0; m < mutations; m++) {
            file f = seeds[s];
            for (int k = 1 + (int)(next(&rng) % 4); k > 0; k--)
                mutate_once(&f, &rng);
            run_readers(&f, &t);
        }
    }
    ck_assert_int_gt(t.loaded, 0);
    ck_assert_int_gt(t.refused, 0);
    ck_assert_int_eq(kiln_live_tensors(), live);
}
END_TEST

static void setup(void)
{
    input_fd = memfd_create("kiln-fuzz-input", MFD_CLOEXEC);
    ck_assert_int_ge(input_fd, 0);
    snprintf(path, sizeof path, "/proc/self/fd/%d", input_fd);
    n_seeds = 0;
    load_seeds();
}

static void teardown(void)
{
    close(input_fd);
}

static Suite *fuzz_suite(void)
{
    Suite *s = suite_create("fuzz");
    TCase *tc = tcase_create("readers");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_truncated_files);
    tcase_add_test(tc, test_mutated_files);
    suite_add_tcase(s, tc);
    return s;
}

KILN_TEST_MAIN(fuzz_suite)
