/* Files and printing: .npy against numpy's files, .safetensors against a
 * scripted file, kiln_fprint against PyTorch's text (tests/data/make_*.py). */
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_common.h"

static char data_dir[512];

static const char *data_path(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", data_dir, name);
    return path;
}

#define tmp_path test_tmp_path
#define write_all test_write_file

/* The whole of a file, malloc'd; its size in *size. */
static char *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *bytes = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(bytes, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return bytes;
}

/* -- .npy ------------------------------------------------------------------ */

/* Element i of every numpy fixture (make_npy.py's value()). */
static double npy_value(kiln_dtype dt, int64_t i)
{
    switch (dt) {
    case KILN_F32:
    case KILN_F64: return (double)(i - 7) * 0.375;
    case KILN_I32: return (double)(i - 7) * 100003;
    case KILN_I64: return (double)(i - 7) * 0x1p40 + 5;
    default: return i % 3 == 0;
    }
}

static kiln_tensor *npy_expected(kiln_dtype dt, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    double *values = malloc((size_t)(n ? n : 1) * sizeof *values);
    for (int64_t i = 0; i < n; i++)
        values[i] = npy_value(dt, i);
    kiln_tensor *t = kiln_cast(kiln_from_data(KILN_F64, ndim, shape, values), dt);
    free(values);
    return t;
}

static const struct {
    const char *code;
    kiln_dtype dtype;
} npy_types[] = {{"f4", KILN_F32}, {"f8", KILN_F64}, {"i4", KILN_I32}, {"i8", KILN_I64}, {"b1", KILN_BOOL}};

static void assert_loads(const char *name, kiln_dtype dt, int ndim, const int64_t *shape)
{
    kiln_tensor *got = kiln_load_npy(data_path(name));
    ck_assert_msg(got != NULL, "%s: %s", name, kiln_last_error());
    assert_close(got, npy_expected(dt, ndim, shape), 0, 0, name);
}

START_TEST(test_npy_every_dtype_and_order)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof *npy_types; i++) {
        char name[32];
        kiln_dtype dt = npy_types[i].dtype;
        snprintf(name, sizeof name, "npy/%s_C.npy", npy_types[i].code);
        assert_loads(name, dt, 3, (int64_t[]){2, 3, 4});
        snprintf(name, sizeof name, "npy/%s_F.npy", npy_types[i].code);
        assert_loads(name, dt, 3, (int64_t[]){2, 3, 4});
        snprintf(name, sizeof name, "npy/%s_v2.npy", npy_types[i].code);
        assert_loads(name, dt, 2, (int64_t[]){3, 5});
    }
}
END_TEST

START_TEST(test_npy_versions_byte_orders_and_shapes)
{
    assert_loads("npy/f4_v3.npy", KILN_F32, 1, (int64_t[]){4});
    assert_loads("npy/f8_big.npy", KILN_F64, 2, (int64_t[]){2, 3});
    assert_loads("npy/i4_big_F.npy", KILN_I32, 2, (int64_t[]){3, 4});
    assert_loads("npy/i8_big_v2.npy", KILN_I64, 1, (int64_t[]){5});
    assert_loads("npy/f8_0d.npy", KILN_F64, 0, NULL);
    assert_loads("npy/i8_empty.npy", KILN_I64, 2, (int64_t[]){0, 3});
    assert_loads("npy/f4_empty.npy", KILN_F32, 1, (int64_t[]){0});
    assert_loads("npy/b1_1d.npy", KILN_BOOL, 1, (int64_t[]){7});
    assert_loads("npy/f4_8d_F.npy", KILN_F32, 8, (int64_t[]){1, 2, 1, 2, 3, 2, 1, 2});
}
END_TEST

START_TEST(test_npy_special_values_keep_their_bits)
{
    const float want[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-45f, 3.4028235e38f};
    float got[6];
    kiln_tensor *t = kiln_load_npy(data_path("npy/f4_special.npy"));
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(kiln_copy_to_host(t, got, sizeof got), 0);
    ck_assert(isnan(got[0]));
    ck_assert_mem_eq(got + 1, want + 1, sizeof got - sizeof *got);
}
END_TEST

/* What kiln writes is byte for byte what numpy's np.save wrote. */
START_TEST(test_npy_save_writes_numpy_bytes)
{
    static const struct {
        const char *name;
        kiln_dtype dtype;
        int ndim;
        int64_t shape[3];
    } files[] = {{"npy/f4_C.npy", KILN_F32, 3, {2, 3, 4}}, {"npy/f8_C.npy", KILN_F64, 3, {2, 3, 4}},
                 {"npy/i4_C.npy", KILN_I32, 3, {2, 3, 4}}, {"npy/i8_C.npy", KILN_I64, 3, {2, 3, 4}},
                 {"npy/b1_C.npy", KILN_BOOL, 3, {2, 3, 4}}, {"npy/f8_0d.npy", KILN_F64, 0, {0}},
                 {"npy/i8_empty.npy", KILN_I64, 2, {0, 3}}, {"npy/f4_empty.npy", KILN_F32, 1, {0}},
                 {"npy/b1_1d.npy", KILN_BOOL, 1, {7}}};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        kiln_tensor *t = npy_expected(files[i].dtype, files[i].ndim, files[i].shape);
        ck_assert_int_eq(kiln_save_npy(tmp_path("saved.npy"), t), 0);
        size_t want_size, got_size;
        char *want = read_all(data_path(files[i].name), &want_size), *got = read_all(tmp_path("saved.npy"), &got_size);
        ck_assert_msg(got_size == want_size && !memcmp(got, want, want_size), "%s: kiln wrote other bytes",
                      files[i].name);
        free(want);
        free(got);
    }
}
END_TEST

/* A view saves its logical elements, row-major; every dtype loads back. */
START_TEST(test_npy_round_trips)
{
    for (size_t i = 0; i < sizeof npy_types / sizeof *npy_types; i++) {
        kiln_tensor *t = npy_expected(npy_types[i].dtype, 3, (int64_t[]){4, 5, 6});
        kiln_tensor *view = kiln_slice(kiln_transpose(t, 0, 2), 1, 4, 0, -2);
        ck_assert_int_eq(kiln_save_npy(tmp_path("view.npy"), view), 0);
        assert_close(kiln_load_npy(tmp_path("view.npy")), view, 0, 0, npy_types[i].code);
    }
}
END_TEST

/* A header of the given text after the magic, version 1.0, then data. */
static void write_npy(const char *path, const char *header, const void *data, size_t n)
{
    char bytes[1024] = "\x93NUMPY\x01";
    size_t len = strlen(header);
    bytes[8] = (char)(len & 0xff);
    bytes[9] = (char)(len >> 8);
    memcpy(bytes + 10, header, len);
    memcpy(bytes + 10 + len, data, n);
    write_all(path, bytes, 10 + len + n);
}

/* Each malformed file fails with the byte where reading stopped. */
START_TEST(test_npy_malformed_files_name_the_byte)
{
    static const struct {
        const char *header;
        size_t data;
        const char *byte, *what;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8, NULL, NULL},
        {"{'descr':'<i8','fortran_order':True,'shape':(2L,1)}", 16, NULL, NULL},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }\n", 4, "byte 20", "f4, f8, i4, i8, b1"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 7, "byte 75", "file ends in the data (7 of 8"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 9, "byte 76", "bytes after the data"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }\n", 8, "byte 44", "True or False"},
        {"{'descr': '<f4', 'shape': (2,), }\n", 8, "byte 43", "lacks"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "byte 27", "repeated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,), }\n", 8, "byte 63", "expected a dimension"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", 4, "byte 77", "8 dimensions"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 0, "byte 61", "too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,) } x", 8, "byte 67", "after the dict"},
        {"['descr']", 0, "byte 10", "expected '{'"},
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000000,), }\n", 8, "byte 91",
         "file ends in the data (8 of 8000000000000000 bytes)"},
    };
    const char zeros[16] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_npy(tmp_path("bad.npy"), cases[i].header, zeros, cases[i].data);
        kiln_clear_error();
        kiln_tensor *t = kiln_load_npy(tmp_path("bad.npy"));
        if (!cases[i].byte) {
            ck_assert_msg(t != NULL, "case %zu: %s", i, kiln_last_error());
            continue;
        }
        ck_assert_msg(t == NULL, "case %zu loaded", i);
        ck_assert_kiln_error("kiln_load_npy", "bad.npy", cases[i].byte, cases[i].what);
    }
}
END_TEST

START_TEST(test_npy_preamble_errors)
{
    write_all(tmp_path("bad.npy"), "PK\x03\x04", 4);
    ck_assert_ptr_null(kiln_load_npy(tmp_path("bad.npy")));
    ck_assert_kiln_error("kiln_load_npy", "byte 0", "magic");
    write_all(tmp_path("bad.npy"), "\x93NUMPY\x04\x00\x10\x00", 10);
    ck_assert_ptr_null(kiln_load_npy(tmp_path("bad.npy")));
    ck_assert_kiln_error("byte 6", "version");
    write_all(tmp_path("bad.npy"), "\x93NUMPY\x01\x00\x40\x00{'descr'", 17);
    ck_assert_ptr_null(kiln_load_npy(tmp_path("bad.npy")));
    ck_assert_kiln_error("byte 17", "file ends in the header");
    ck_assert_ptr_null(kiln_load_npy(tmp_path("missing.npy")));
    ck_assert_kiln_error("kiln_load_npy", "missing.npy", "No such file");
    ck_assert_ptr_null(kiln_load_npy(NULL));
    ck_assert_kiln_error("kiln_load_npy", "path");
    ck_assert_int_lt(kiln_save_npy(tmp_path("no/such/dir.npy"), kiln_ones(KILN_F32, 1, (int64_t[]){2})), 0);
    ck_assert_kiln_error("kiln_save_npy", "no/such/dir.npy");
    kiln_clear_error();
    ck_assert_int_lt(kiln_save_npy(tmp_path("x.npy"), NULL), 0);
    ck_assert_kiln_error("kiln_save_npy", "NULL");
}
END_TEST

/* Reading a FIFO would block forever, and writing would put a file in its
 * place (or in a device's): both refused, naming what is there. A save that
 * fails (past RLIMIT_FSIZE) leaves the file it would have replaced as it
 * was, where it once truncated and then removed it. A save that succeeds
 * clears an earlier error, as every call that succeeds does. */
START_TEST(test_files_that_are_not_files)
{
    kiln_tensor *t = kiln_ones(KILN_F32, 1, (int64_t[]){100000});
    ck_assert_int_eq(mkfifo(tmp_path("fifo"), 0600), 0);
    ck_assert_ptr_null(kiln_load_npy(tmp_path("fifo")));
    ck_assert_kiln_error("kiln_load_npy", "fifo", "a FIFO");
    kiln_named_tensor *named = NULL;
    ck_assert_int_lt(kiln_load_safetensors(tmp_path("fifo"), NULL, 0, &named), 0);
    ck_assert_kiln_error("kiln_load_safetensors", "fifo", "a FIFO");
    ck_assert_int_lt(kiln_save_npy(tmp_path("fifo"), t), 0);
    ck_assert_kiln_error("kiln_save_npy", "fifo", "a FIFO");
    struct stat st;
    ck_assert(stat(tmp_path("fifo"), &st) == 0 && S_ISFIFO(st.st_mode));

    ck_assert_int_eq(kiln_save_npy(tmp_path("kept.npy"), kiln_ones(KILN_F32, 1, (int64_t[]){3})), 0);
    struct rlimit old, small = {4096, 4096};
    getrlimit(RLIMIT_FSIZE, &old);
    small.rlim_max = old.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    int status = kiln_save_npy(tmp_path("kept.npy"), t);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    ck_assert_int_lt(status, 0);
    ck_assert_kiln_error("kiln_save_npy", "kept.npy");
    kiln_tensor *kept = kiln_load_npy(tmp_path("kept.npy"));
    ck_assert_msg(kept && kiln_numel(kept) == 3, "the old file is gone: %s", kiln_last_error());

    kiln_add(NULL, NULL);
    ck_assert_int_eq(kiln_save_npy(tmp_path("kept.npy"), t), 0);
    ck_assert_str_eq(kiln_last_error(), "");
    kiln_add(NULL, NULL);
    kiln_named_tensor *all = NULL;
    int n = kiln_load_safetensors(data_path("tensors.safetensors"), (const char *[]){"weight"}, 1, &all);
    ck_assert_int_eq(n, 1);
    kiln_free_named_tensors(all, n);
    ck_assert_str_eq(kiln_last_error(), "");
    kiln_add(NULL, NULL);
    FILE *sink = fopen("/dev/null", "w");
    ck_assert_int_eq(kiln_fprint(sink, kept), 0);
    fclose(sink);
    ck_assert_str_eq(kiln_last_error(), "");
    kiln_add(NULL, NULL);
    kiln_spec spec = {KILN_F32, 2, {3, 4}, KILN_CPU, 0};
    ck_assert_int_eq(kiln_mark_dynamic(&spec, 1), 0);
    ck_assert_str_eq(kiln_last_error(), "");
}
END_TEST

/* -- .safetensors ----------------------------------------------------------- */

/* Element i of make_safetensors.py's tensors. */
static double st_value(kiln_dtype dt, int64_t i)
{
    switch (dt) {
    case KILN_F32:
    case KILN_F64: return (double)(i - 2) * 0.5;
    case KILN_I32: return (double)(i - 2) * 100003;
    case KILN_I64: return 0x1p40 + 5;
    default: return i % 2 == 1;
    }
}

static void assert_st_tensor(const kiln_named_tensor *t, const char *name, kiln_dtype dt, int ndim,
                             const int64_t *shape)
{
    ck_assert_str_eq(t->name, name);
    ck_assert_int_eq(kiln_dtype_of(t->tensor), dt);
    ck_assert_int_eq(kiln_ndim(t->tensor), ndim);
    for (int d = 0; d < ndim; d++)
        ck_assert_int_eq(kiln_shape(t->tensor)[d], shape[d]);
    double *got = test_values(t->tensor);
    for (int64_t i = 0; i < kiln_numel(t->tensor); i++)
        ck_assert_msg(got[i] == st_value(dt, i), "%s[%lld] is %g", name, (long long)i, got[i]);
    free(got);
}

START_TEST(test_safetensors_by_name)
{
    const char *names[] = {"mask", "na\xc3\xafve \"name\"\n", "weight", "step", "ids", "bias", "empty"};
    kiln_named_tensor *ts;
    int n = kiln_load_safetensors(data_path("tensors.safetensors"), names, 7, &ts);
    ck_assert_msg(n == 7, "%d: %s", n, kiln_last_error());
    assert_st_tensor(&ts[0], "mask", KILN_BOOL, 1, (int64_t[]){5});
    assert_st_tensor(&ts[1], names[1], KILN_F32, 1, (int64_t[]){1});
    assert_st_tensor(&ts[2], "weight", KILN_F32, 2, (int64_t[]){2, 3});
    assert_st_tensor(&ts[3], "step", KILN_I64, 0, NULL);
    assert_st_tensor(&ts[4], "ids", KILN_I32, 3, (int64_t[]){3, 1, 2});
    assert_st_tensor(&ts[5], "bias", KILN_F64, 1, (int64_t[]){4});
    assert_st_tensor(&ts[6], "empty", KILN_F32, 2, (int64_t[]){0, 4});
    kiln_free_named_tensors(ts, n);
}
END_TEST

/* All of them, in the file's order: the F16 one is refused, naming it. */
START_TEST(test_safetensors_all_and_refusals)
{
    kiln_named_tensor *ts = (kiln_named_tensor *)1;
    ck_assert_int_lt(kiln_load_safetensors(data_path("tensors.safetensors"), NULL, 0, &ts), 0);
    ck_assert_ptr_null(ts);
    ck_assert_kiln_error("kiln_load_safetensors", "\"half\"", "F16");
    const char *missing[] = {"weight", "nothing"};
    ck_assert_int_lt(kiln_load_safetensors(data_path("tensors.safetensors"), missing, 2, &ts), 0);
    ck_assert_kiln_error("no tensor \"nothing\"");
    ck_assert_int_lt(kiln_load_safetensors(data_path("missing.safetensors"), NULL, 0, &ts), 0);
    ck_assert_kiln_error("cannot open", "missing.safetensors");
    ck_assert_int_lt(kiln_load_safetensors(NULL, NULL, 0, &ts), 0);
    ck_assert_kiln_error("path");
}
END_TEST

/* A file of the given header (padded to 8) and n bytes of data. */
static void write_safetensors(const char *path, const char *header, size_t data)
{
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    char *bytes = calloc(1, 8 + padded + data);
    for (int i = 0; i < 8; i++)
        bytes[i] = (char)(padded >> (8 * i));
    memset(bytes + 8, ' ', padded);
    memcpy(bytes + 8, header, len);
    write_all(path, bytes, 8 + padded + data);
    free(bytes);
}

START_TEST(test_safetensors_malformed_headers)
{
    static const struct {
        const char *header;
        size_t data;
        const char *what, *where;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"__metadata__\":{\"k\":\"v\"}}", 8, NULL, NULL},
        {"{}", 0, NULL, NULL},
        {"[]", 0, "must start with '{'", "byte 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "expected ',' or '}'", "byte 64"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype", "byte 22"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "do not hold its shape", "\"a\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlaps", "\"b\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "leaves a hole", "\"a\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover 4 bytes", "has 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "named twice", "\"a\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4, "unknown", "\"extra\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "needs dtype, shape and data_offsets", "byte 13"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero", "byte 37"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative", "byte 37"},
        {"{\"a\\q\":{}}", 0, "unknown escape", "byte 11"},
        {"{\"\\ud800\":{}}", 0, "surrogate", "byte 10"},
        {"{\"\xc3\x28\":{}}", 0, "not UTF-8", "byte 10"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "expected a string", "byte 29"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "too many", "byte 53"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_named_tensor *ts = NULL;
        write_safetensors(tmp_path("bad.safetensors"), cases[i].header, cases[i].data);
        kiln_clear_error();
        int n = kiln_load_safetensors(tmp_path("bad.safetensors"), NULL, 0, &ts);
        if (!cases[i].what) {
            ck_assert_msg(n >= 0, "case %zu: %s", i, kiln_last_error());
            kiln_free_named_tensors(ts, n);
            continue;
        }
        ck_assert_msg(n < 0 && !ts, "case %zu loaded", i);
        ck_assert_kiln_error("kiln_load_safetensors", "bad.safetensors", cases[i].what, cases[i].where);
    }
}
END_TEST

/* Names decode JSON's escapes to UTF-8: 2, 3 and 4 bytes (a surrogate pair). */
START_TEST(test_safetensors_names_decode_escapes)
{
    write_safetensors(tmp_path("names.safetensors"),
                      "{\"\\u00e9\\u20ac\\ud83d\\ude00\\/\\t\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[0,1]}}", 1);
    kiln_named_tensor *ts;
    ck_assert_int_eq(kiln_load_safetensors(tmp_path("names.safetensors"), NULL, 0, &ts), 1);
    ck_assert_str_eq(ts[0].name, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/\t");
    kiln_free_named_tensors(ts, 1);
}
END_TEST

START_TEST(test_safetensors_header_length)
{
    kiln_named_tensor *ts;
    write_all(tmp_path("short.safetensors"), "\x02\0\0", 3);
    ck_assert_int_lt(kiln_load_safetensors(tmp_path("short.safetensors"), NULL, 0, &ts), 0);
    ck_assert_kiln_error("byte 0", "too short");
    write_all(tmp_path("long.safetensors"), "\xff\0\0\0\0\0\0\0{}", 10);
    ck_assert_int_lt(kiln_load_safetensors(tmp_path("long.safetensors"), NULL, 0, &ts), 0);
    ck_assert_kiln_error("byte 0", "header length 255");
}
END_TEST

/* -- Printing -------------------------------------------------------------- */

/* Element i of make_print.py's cases, before the dtype's conversion. */
static double print_value(const char *formula, int64_t i, double scale, double shift)
{
    static const double special[] = {NAN, INFINITY, -INFINITY, -0.0, 0.5, 1e-5};
    double f = !strcmp(formula, "iota") ? (double)i : !strcmp(formula, "sin") ? sin(0.7 * (double)i) : special[i % 6];
    return (f + shift) * scale;
}

static kiln_tensor *print_case(const char *line)
{
    char dtype[8], shape_text[64], formula[16];
    double scale, shift;
    ck_assert_int_eq(sscanf(line, "case %7s %63s %15s %lf %lf", dtype, shape_text, formula, &scale, &shift), 5);
    int64_t shape[KILN_MAX_DIMS], n = 1;
    int ndim = 0;
    for (char *p = shape_text; *p != '-' && *p; p += *p == ',') {
        shape[ndim] = strtoll(p, &p, 10);
        n *= shape[ndim++];
    }
    kiln_dtype dt = KILN_F32;
    while (strcmp(kiln_dtype_name(dt), dtype))
        dt++;
    double *values = malloc((size_t)(n ? n : 1) * sizeof *values);
    for (int64_t i = 0; i < n; i++) {
        double v = print_value(formula, i, scale, shift);
        values[i] = dt == KILN_I32 || dt == KILN_I64 ? trunc(v) : dt == KILN_BOOL ? v != 0 : v;
    }
    kiln_tensor *t = kiln_cast(kiln_from_data(KILN_F64, ndim, shape, values), dt);
    free(values);
    return t;
}

/* Each of PyTorch's texts, from kiln_fprint of the same tensor. */
START_TEST(test_fprint_matches_pytorch)
{
    size_t size;
    char *cases = read_all(data_path("print.txt"), &size);
    cases[size] = '\0';
    int checked = 0;
    for (char *at = strstr(cases, "case "); at; checked++) {
        char *text = strchr(at, '\n') + 1, *next = strstr(text, "\ncase ");
        size_t want_len = next ? (size_t)(next + 1 - text) : strlen(text);
        FILE *out = tmpfile();
        ck_assert_int_eq(kiln_fprint(out, print_case(at)), 0);
        char got[65536];
        rewind(out);
        size_t got_len = fread(got, 1, sizeof got, out);
        fclose(out);
        ck_assert_msg(got_len == want_len && !memcmp(got, text, want_len), "%.*s\nkiln printed:\n%.*s\nPyTorch:\n%.*s",
                      (int)(strchr(at, '\n') - at), at, (int)got_len, got, (int)want_len, text);
        at = next ? next + 1 : NULL;
    }
    ck_assert_int_ge(checked, 20);
    free(cases);
}
END_TEST

START_TEST(test_fprint_errors)
{
    ck_assert_int_lt(kiln_fprint(stdout, NULL), 0);
    ck_assert_kiln_error("kiln_fprint", "tensor");
    ck_assert_int_lt(kiln_fprint(NULL, kiln_scalar(1)), 0);
    ck_assert_kiln_error("kiln_fprint", "f");
    FILE *closed = fopen("/dev/full", "w");
    if (closed) { /* writes to /dev/full fail */
        ck_assert_int_lt(kiln_fprint(closed, kiln_scalar(1)), 0);
        ck_assert_kiln_error("kiln_fprint", "cannot write");
        fclose(closed);
    }
}
END_TEST

static void setup(void)
{
    test_scoped_setup();
    test_tmp_setup("kiln-io");
}

static void teardown(void)
{
    test_tmp_teardown();
    test_scoped_teardown();
}

static Suite *io_suite(void)
{
    Suite *s = suite_create("io");
    TCase *npy = tcase_create("npy");
    tcase_add_checked_fixture(npy, setup, teardown);
    tcase_add_test(npy, test_npy_every_dtype_and_order);
    tcase_add_test(npy, test_npy_versions_byte_orders_and_shapes);
    tcase_add_test(npy, test_npy_special_values_keep_their_bits);
    tcase_add_test(npy, test_npy_save_writes_numpy_bytes);
    tcase_add_test(npy, test_npy_round_trips);
    tcase_add_test(npy, test_npy_malformed_files_name_the_byte);
    tcase_add_test(npy, test_npy_preamble_errors);
    tcase_add_test(npy, test_files_that_are_not_files);
    suite_add_tcase(s, npy);
    TCase *st = tcase_create("safetensors");
    tcase_add_checked_fixture(st, setup, teardown);
    tcase_add_test(st, test_safetensors_by_name);
    tcase_add_test(st, test_safetensors_all_and_refusals);
    tcase_add_test(st, test_safetensors_malformed_headers);
    tcase_add_test(st, test_safetensors_names_decode_escapes);
    tcase_add_test(st, test_safetensors_header_length);
    suite_add_tcase(s, st);
    TCase *print = tcase_create("print");
    tcase_add_checked_fixture(print, setup, teardown);
    tcase_add_test(print, test_fprint_matches_pytorch);
    tcase_add_test(print, test_fprint_errors);
    suite_add_tcase(s, print);
    return s;
}

int main(void)
{
    const char *dir = getenv("KILN_TEST_DATA");
    snprintf(data_dir, sizeof data_dir, "%s", dir ? dir : "tests/data");
    return test_run_suite(io_suite()) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
