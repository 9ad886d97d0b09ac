/* A model file mapped, and unpacked without copying its weights: protobuf-c
 * copies every bytes field it unpacks, so it is given a skeleton of the file
 * (everything but the initializers' raw data, a few hundred KB for a 100 MB
 * model) and the raw data are read from the mapping, copied once, into
 * tensors.
 *
 * The skeleton is the file rewritten along one path: ModelProto.graph (7),
 * GraphProto.initializer (5), TensorProto.raw_data (9), the last dropped and
 * the lengths of the messages holding it re-encoded; every other field is
 * copied as it is. A file that does not parse along that path, or has its
 * graph in more than one piece (protobuf merges them), is unpacked whole, so
 * that protobuf-c judges it and says what is wrong. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/onnx.h"

enum { MODEL, GRAPH, TENSOR };
/* per level, the field that leads one level down */
static const uint32_t path_field[] = {[MODEL] = 7, [GRAPH] = 5, [TENSOR] = 9};
enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

typedef struct {
    uint8_t *out;     /* NULL while sizes are measured */
    size_t at;
    ProtobufCBinaryData *raw; /* per initializer, in the order they come */
    size_t n_raw, cap_raw;
    int graphs;
} skeleton;

/* -- The wire format --------------------------------------------------------- */

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* The bytes of one field's value after its tag, checked to lie within end. */
static bool field_value(const uint8_t **p, const uint8_t *end, uint32_t wire, const uint8_t **value, size_t *len)
{
    uint64_t n = 0;
    const uint8_t *start = *p;
    if (wire == WIRE_VARINT && !read_varint(p, end, &n))
        return false;
    if (wire == WIRE_FIXED64 || wire == WIRE_FIXED32)
        n = wire == WIRE_FIXED64 ? 8 : 4;
    else if (wire == WIRE_BYTES) {
        if (!read_varint(p, end, &n))
            return false;
        start = *p;
    } else if (wire != WIRE_VARINT)
        return false; /* groups: not in onnx.proto */
    if (wire != WIRE_VARINT) {
        if (n > (uint64_t)(end - *p))
            return false;
        *p += n;
    }
    *value = start;
    *len = (size_t)(*p - start);
    return true;
}

static void emit(skeleton *s, const void *bytes, size_t n)
{
    if (s->out)
        memcpy(s->out + s->at, bytes, n);
    s->at += n;
}

static void emit_varint(skeleton *s, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    for (; v >= 0x80; v >>= 7)
        b[n++] = (uint8_t)(v | 0x80);
    b[n++] = (uint8_t)v;
    emit(s, b, n);
}

/* -- The skeleton -------------------------------------------------------------- */

/* The current initializer's raw data (the last given wins, as in protobuf). */
static void note_raw(skeleton *s, const uint8_t *data, size_t len)
{
    if (s->out)
        s->raw[s->n_raw - 1] = (ProtobufCBinaryData){.len = len, .data = (uint8_t *)data};
}

/* One more initializer, its raw data absent until a raw_data field is met. */
static bool next_initializer(skeleton *s)
{
    if (!s->out)
        return true;
    if (s->n_raw == s->cap_raw) {
        size_t cap = s->cap_raw ? 2 * s->cap_raw : 64;
        ProtobufCBinaryData *raw = realloc(s->raw, cap * sizeof *raw);
        if (!raw)
            return false;
        s->raw = raw;
        s->cap_raw = cap;
    }
    s->raw[s->n_raw++] = (ProtobufCBinaryData){0};
    return true;
}

/* Emits the message at level in [p, end) without the raw data (false where it
 * does not parse). */
static bool strip(skeleton *s, const uint8_t *p, const uint8_t *end, int level)
{
    while (p < end) {
        const uint8_t *field = p, *value;
        uint64_t tag;
        size_t len;
        if (!read_varint(&p, end, &tag) || !field_value(&p, end, (uint32_t)(tag & 7), &value, &len))
            return false;
        bool on_path = tag >> 3 == path_field[level] && (tag & 7) == WIRE_BYTES;
        if (!on_path) {
            emit(s, field, (size_t)(p - field));
            continue;
        }
        if (level == TENSOR) {
            note_raw(s, value, len);
            continue;
        }
        if (level == MODEL && ++s->graphs > 1)
            return false;
        if (level == GRAPH && !next_initializer(s))
            return false;
        /* the nested message's stripped length first, measured without writing */
        skeleton measure = {.graphs = 0};
        if (!strip(&measure, value, value + len, level + 1))
            return false;
        emit_varint(s, tag);
        emit_varint(s, measure.at);
        if (!strip(s, value, value + len, level + 1))
            return false;
    }
    return true;
}

/* -- Mapping and unpacking -------------------------------------------------------- */

static int map_file(const char *fn, const char *path, onnx_mapped *mf)
{
    struct stat st;
    int fd = core_open_regular_for(fn, path, &st);
    if (fd < 0)
        return core_error_status();
    /* protobuf messages are at most 2 GiB */
    if (st.st_size > INT32_MAX) {
        close(fd);
        return core_fail(CORE_FORMAT, fn, "'%s' is %lld bytes, more than a protobuf message may be (2 GiB)", path,
                         (long long)st.st_size);
    }
    mf->size = (size_t)st.st_size;
    mf->map = mf->size ? mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0) : NULL;
    int saved = errno;
    close(fd);
    if (mf->map == MAP_FAILED) {
        mf->map = NULL;
        return core_fail(CORE_IO, fn, "cannot map '%s': %s", path, strerror(saved));
    }
    return 0;
}

/* The skeleton unpacked, the raw data noted; false where the file must be
 * unpacked whole. */
static bool unpack_skeleton(onnx_mapped *mf)
{
    const uint8_t *bytes = mf->map, *end = bytes + mf->size;
    skeleton measure = {0}, s = {0};
    if (!strip(&measure, bytes, end, MODEL) || !(s.out = malloc(measure.at + 1)))
        return false;
    bool ok = strip(&s, bytes, end, MODEL);
    if (ok)
        mf->proto = onnx__model_proto__unpack(NULL, s.at, s.out);
    free(s.out);
    /* the initializers protobuf-c saw must be those noted, one for one */
    if (mf->proto && (!mf->proto->graph || mf->proto->graph->n_initializer != s.n_raw)) {
        onnx__model_proto__free_unpacked(mf->proto, NULL);
        mf->proto = NULL;
    }
    if (!mf->proto) {
        free(s.raw);
        return false;
    }
    mf->raw = s.raw;
    return true;
}

int onnx_map_model(const char *fn, const char *path, onnx_mapped *mf)
{
    memset(mf, 0, sizeof *mf);
    double start = core_now_ms();
    if (map_file(fn, path, mf) < 0)
        return core_error_status();
    mf->map_ms = core_now_ms() - start;
    start = core_now_ms();
    if (!unpack_skeleton(mf))
        mf->proto = onnx__model_proto__unpack(NULL, mf->size, mf->map ? mf->map : (const uint8_t *)"");
    mf->unpack_ms = core_now_ms() - start;
    if (mf->proto)
        return 0;
    onnx_unmap_model(mf);
    return core_fail(CORE_FORMAT, fn, "'%s' is not a serialized ONNX model (truncated, or not protobuf, or a field "
                     "of the wrong type)", path);
}

const ProtobufCBinaryData *onnx_mapped_raw(const onnx_mapped *mf, size_t initializer)
{
    return mf->raw && mf->raw[initializer].data ? &mf->raw[initializer] : NULL;
}

void onnx_unmap_model(onnx_mapped *mf)
{
    if (mf->map)
        munmap(mf->map, mf->size);
    free(mf->raw);
    mf->map = NULL;
    mf->raw = NULL;
}
