/* ONNX TensorProtos to kiln tensors and back, and reading whole files. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/onnx.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ONNX's raw data is little-endian, as this host must be");

static const struct {
    int32_t onnx;
    kiln_dtype dt;
} dtypes[] = {
    {ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, KILN_F32}, {ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE, KILN_F64},
    {ONNX__TENSOR_PROTO__DATA_TYPE__INT32, KILN_I32}, {ONNX__TENSOR_PROTO__DATA_TYPE__INT64, KILN_I64},
    {ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, KILN_BOOL},
};

bool onnx_kiln_dtype(int32_t onnx_type, kiln_dtype *dt)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].onnx == onnx_type) {
            *dt = dtypes[i].dt;
            return true;
        }
    return false;
}

int32_t onnx_type_of(kiln_dtype dt)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dt == dt)
            return dtypes[i].onnx;
    return ONNX__TENSOR_PROTO__DATA_TYPE__UNDEFINED;
}

const char *onnx_type_name(int32_t onnx_type)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&onnx__tensor_proto__data_type__descriptor, onnx_type);
    return v ? v->name : "an unknown element type";
}

uint8_t *onnx_read_file(const char *fn, const char *path, size_t *size)
{
    struct stat st;
    int fd = core_open_regular_for(fn, path, &st);
    if (fd < 0)
        return NULL;
    /* protobuf messages are at most 2 GiB */
    if (st.st_size > INT32_MAX) {
        close(fd);
        core_fail(CORE_FORMAT, fn, "'%s' is %lld bytes, more than a protobuf message may be (2 GiB)", path,
                  (long long)st.st_size);
        return NULL;
    }
    uint8_t *bytes = malloc((size_t)st.st_size + 1);
    ssize_t got = bytes ? core_pread_full(fd, bytes, (size_t)st.st_size, 0) : -1;
    int saved = errno;
    close(fd);
    if (got != st.st_size) {
        free(bytes);
        if (!bytes)
            core_fail_status(CORE_NOMEM, fn);
        else
            core_fail(CORE_IO, fn, "cannot read '%s': %s", path, got < 0 ? strerror(saved) : "it changed size");
        return NULL;
    }
    *size = (size_t)st.st_size;
    return bytes;
}

/* Where tp's typed values for dt are, and how many. BOOL lives in
 * int32_data, one int32 a value: it alone is converted. */
static const void *typed_values(const Onnx__TensorProto *tp, kiln_dtype dt, size_t *n)
{
    switch (dt) {
    case KILN_F32:
        return *n = tp->n_float_data, tp->float_data;
    case KILN_F64:
        return *n = tp->n_double_data, tp->double_data;
    case KILN_I64:
        return *n = tp->n_int64_data, tp->int64_data;
    default:
        return *n = tp->n_int32_data, tp->int32_data;
    }
}

static kiln_tensor *bools_from_int32(int ndim, const int64_t *shape, const int32_t *values, size_t n)
{
    bool *data = malloc(n ? n : 1);
    if (!data) {
        core_fail_status(CORE_NOMEM, "kiln_onnx");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        data[i] = values[i] != 0;
    kiln_tensor *t = kiln_from_data(KILN_BOOL, ndim, shape, data);
    free(data);
    return t;
}

/* The shape of tp, checked: at most KILN_MAX_DIMS sizes, none negative, at
 * most 2^59 elements. */
static int tensor_shape(const char *fn, const char *what, const Onnx__TensorProto *tp, int64_t *shape, int64_t *numel)
{
    if (tp->n_dims > KILN_MAX_DIMS)
        return core_fail(CORE_UNSUPPORTED, fn, "tensor '%s' has %zu dimensions; kiln tensors have at most %d", what,
                         tp->n_dims, KILN_MAX_DIMS);
    *numel = 1;
    for (size_t d = 0; d < tp->n_dims; d++) {
        shape[d] = tp->dims[d];
        if (shape[d] < 0)
            return core_fail(CORE_FORMAT, fn, "tensor '%s' has size %lld in dimension %zu", what,
                             (long long)shape[d], d);
        if (shape[d] > 0 && *numel > (INT64_C(1) << 59) / shape[d])
            return core_fail(CORE_FORMAT, fn, "tensor '%s' declares more than 2^59 elements", what);
        *numel *= shape[d];
    }
    return 0;
}

kiln_tensor *onnx_tensor_to_kiln(const char *fn, const char *what, const Onnx__TensorProto *tp,
                                 const ProtobufCBinaryData *raw)
{
    kiln_dtype dt;
    if (!onnx_kiln_dtype(tp->data_type, &dt)) {
        core_fail(CORE_UNSUPPORTED, fn, "tensor '%s' has element type %s; kiln has FLOAT, DOUBLE, INT32, INT64 "
                  "and BOOL", what, onnx_type_name(tp->data_type));
        return NULL;
    }
    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        core_fail(CORE_UNSUPPORTED, fn, "tensor '%s' keeps its data in an external file", what);
        return NULL;
    }
    if (tp->segment) {
        core_fail(CORE_UNSUPPORTED, fn, "tensor '%s' is a segment of a larger tensor", what);
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], numel = 0;
    if (tensor_shape(fn, what, tp, shape, &numel) < 0)
        return NULL;
    if (!raw && tp->has_raw_data)
        raw = &tp->raw_data;
    size_t size = kiln_dtype_size(dt), have;
    const void *values = raw ? raw->data : typed_values(tp, dt, &have);
    if (raw)
        have = raw->len / size;
    if ((raw && raw->len % size) || have != (size_t)numel) {
        core_fail(CORE_FORMAT, fn, "tensor '%s' has %lld elements by its shape but %s of %zu%s", what,
                  (long long)numel, raw ? "raw data" : "typed values", raw ? raw->len : have, raw ? " bytes" : "");
        return NULL;
    }
    /* little-endian raw data is the tensor's bytes: one copy, no conversion */
    kiln_tensor *t = dt == KILN_BOOL && !raw ? bools_from_int32((int)tp->n_dims, shape, values, have)
                                             : kiln_from_data(dt, (int)tp->n_dims, shape, values);
    if (t)
        eager_disown(t);
    return t;
}

/* -- The float weights in one block ------------------------------------------ *
 * A model's weights are fresh memory, whose every page the kernel zeroes on
 * first touch: one block of huge pages, each tensor 64 bytes apart, zeroes
 * what the weights need, where a block each pays 4 KiB faults below 2 MiB
 * and a huge page's rounding above (a fifth more for resnet50). */

enum { ARENA_ALIGN = 64 / sizeof(float) };

/* The floats tp takes in the arena (its raw data rounded up to 64 bytes), or
 * 0 where it goes its own way: not raw floats from the mapping, or empty. */
size_t onnx_arena_floats(const Onnx__TensorProto *tp, const ProtobufCBinaryData *raw)
{
    bool external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    if (!raw || tp->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || external || tp->segment ||
        !raw->len || raw->len % sizeof(float))
        return 0;
    return (raw->len / sizeof(float) + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

kiln_tensor *onnx_arena_tensor(const char *fn, const char *what, kiln_tensor *arena, int64_t at,
                               const Onnx__TensorProto *tp, const ProtobufCBinaryData *raw)
{
    int64_t shape[KILN_MAX_DIMS], numel = 0;
    if (tensor_shape(fn, what, tp, shape, &numel) < 0)
        return NULL;
    if ((size_t)numel != raw->len / sizeof(float)) {
        core_fail(CORE_FORMAT, fn, "tensor '%s' has %lld elements by its shape but raw data of %zu bytes", what,
                  (long long)numel, raw->len);
        return NULL;
    }
    memcpy(eager_data(arena) + at * (int64_t)sizeof(float), raw->data, raw->len);
    kiln_scope_begin();
    kiln_tensor *t = kiln_retain(kiln_reshape(kiln_slice(arena, 0, at, at + numel, 1), (int)tp->n_dims, shape));
    kiln_scope_end();
    return t;
}

kiln_tensor *onnx_load_tensor_file(const char *path)
{
    const char *fn = "onnx_load_tensor_file";
    size_t size;
    uint8_t *bytes = onnx_read_file(fn, path, &size);
    if (!bytes)
        return NULL;
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, size, bytes);
    free(bytes);
    if (!tp) {
        core_fail(CORE_FORMAT, fn, "'%s' is not a serialized ONNX TensorProto", path);
        return NULL;
    }
    kiln_tensor *t = onnx_tensor_to_kiln(fn, tp->name && *tp->name ? tp->name : path, tp, NULL);
    onnx__tensor_proto__free_unpacked(tp, NULL);
    return t;
}

int onnx_tensor_from_kiln(const char *fn, Onnx__TensorProto *tp, const kiln_tensor *t, char *name)
{
    onnx__tensor_proto__init(tp);
    int ndim = kiln_ndim(t);
    const int64_t *shape = kiln_shape(t);
    size_t bytes = (size_t)kiln_numel(t) * kiln_dtype_size(kiln_dtype_of(t));
    tp->dims = malloc((size_t)(ndim ? ndim : 1) * sizeof *tp->dims);
    tp->raw_data.data = malloc(bytes ? bytes : 1);
    if (!tp->dims || !tp->raw_data.data) {
        free(tp->dims);
        free(tp->raw_data.data);
        return core_fail_status(CORE_NOMEM, fn);
    }
    tp->n_dims = (size_t)ndim;
    memcpy(tp->dims, shape, (size_t)ndim * sizeof *shape);
    tp->has_data_type = true;
    tp->data_type = onnx_type_of(kiln_dtype_of(t));
    tp->has_raw_data = true;
    tp->raw_data.len = bytes;
    tp->name = name;
    if (kiln_copy_to_host(t, tp->raw_data.data, bytes) < 0) {
        free(tp->dims);
        free(tp->raw_data.data);
        return core_error_status();
    }
    return 0;
}
