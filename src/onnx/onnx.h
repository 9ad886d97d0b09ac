/* ONNX models as marked functions: what the files of src/onnx share, and
 * what tests and tools may use of the module. */
#ifndef KILN_ONNX_H
#define KILN_ONNX_H

#include <pthread.h>

#include "onnx.pb-c.h"
#include "trace/trace.h"

/* The ONNX element types kiln has (FLOAT, DOUBLE, INT32, INT64, BOOL). */
bool onnx_kiln_dtype(int32_t onnx_type, kiln_dtype *dt);
int32_t onnx_type_of(kiln_dtype dt);
/* ONNX's name of an element type ("FLOAT16"), for messages. */
const char *onnx_type_name(int32_t onnx_type);

/* The whole of the regular file at path (malloc'd, *size bytes), or NULL with
 * fn's error set. */
uint8_t *onnx_read_file(const char *fn, const char *path, size_t *size);
/* A model file mapped and unpacked (mapped.c): proto, which the caller takes
 * over, and the initializers' raw data, which stay in the mapping. */
typedef struct {
    void *map;
    size_t size;
    Onnx__ModelProto *proto;
    ProtobufCBinaryData *raw; /* per initializer of proto's graph, or NULL */
    double map_ms, unpack_ms;
} onnx_mapped;

/* Maps the model at path and unpacks it; 0, or negative with fn's error. */
int onnx_map_model(const char *fn, const char *path, onnx_mapped *mf);
/* The raw data of initializer i held in the mapping (borrowed, valid until
 * onnx_unmap_model), or NULL where its TensorProto holds its values. */
const ProtobufCBinaryData *onnx_mapped_raw(const onnx_mapped *mf, size_t i);
/* Unmaps the file; the proto is not freed. */
void onnx_unmap_model(onnx_mapped *mf);

/* The floats initializer tp (raw data raw, mapped) takes in a block shared
 * by the model's float weights, or 0 where it is made alone. */
size_t onnx_arena_floats(const Onnx__TensorProto *tp, const ProtobufCBinaryData *raw);
/* tp's values copied into arena (a 1-d float tensor) at element at, as a new
 * view of it that no scope owns; NULL with fn's error naming what. */
kiln_tensor *onnx_arena_tensor(const char *fn, const char *what, kiln_tensor *arena, int64_t at,
                               const Onnx__TensorProto *tp, const ProtobufCBinaryData *raw);
/* tp's values as a new tensor that no scope owns, or NULL with fn's error
 * naming what (a value's name) and what is wrong with it. raw, where not
 * NULL, is tp's raw data held apart from it (borrowed). */
kiln_tensor *onnx_tensor_to_kiln(const char *fn, const char *what, const Onnx__TensorProto *tp,
                                 const ProtobufCBinaryData *raw);
/* A serialized TensorProto file (the backend tests' input_0.pb) as a tensor
 * that no scope owns, or NULL with the error set. */
kiln_tensor *onnx_load_tensor_file(const char *path);
/* tp (zeroed first) holding t's values as raw data (tp->raw_data.data
 * malloc'd) and name (borrowed). 0, or negative with fn's error. */
int onnx_tensor_from_kiln(const char *fn, Onnx__TensorProto *tp, const kiln_tensor *t, char *name);

/* Where the time of this thread's last kiln_onnx_load went, for kiln-onnx
 * bench: mapping the file, unpacking it, making the initializers tensors,
 * and checking and ordering the graph. */
typedef struct {
    double map_ms, unpack_ms, tensors_ms, graph_ms;
} onnx_load_times;
onnx_load_times onnx_last_load_times(void);

/* The signatures the model kiln_onnx_load made f from declares for its
 * inputs (those no initializer gives), at most max of them, into specs: a
 * symbolic or missing size becomes batch when it is the first, else 1;
 * batch > 0 also replaces every first size. How many, or negative with the
 * error set. */
int onnx_declared_inputs(const kiln_fn *f, kiln_spec *specs, int max, int64_t batch);

/* -- The model being loaded, and the ops ------------------------------------ */

typedef struct onnx_op onnx_op;

/* The most operands or results a node may have. */
enum { ONNX_MAX_OPERANDS = 64 };

/* A node, its operands and results as indices into the model's values (-1:
 * an optional one left out). */
typedef struct {
    const Onnx__NodeProto *proto;
    const onnx_op *op;
    int *in, n_in;
    int *out, n_out;
} onnx_node;

typedef struct {
    char name[64];          /* of the marked function, for messages */
    Onnx__ModelProto *proto;
    int opset;              /* of the default domain */
    int n_values;
    const char **value_names; /* borrowed from proto */
    kiln_tensor **constants;  /* per value: an initializer's tensor, else NULL */
    kiln_tensor **cuda_constants; /* the same on CUDA, moved at the first call with CUDA inputs */
    pthread_mutex_t lock;     /* guards cuda_constants */
    onnx_node *nodes;         /* in an order where operands come first */
    int n_nodes;
    int *inputs, n_inputs;    /* the marked function's, as values */
    int *outputs, n_outputs;
    int *last_use;            /* per value: the last node reading it, or -1 */
} onnx_model;

/* What an op's handler gets: its operands (NULL for an optional one left
 * out), whether each is known (computed from constants alone: its values may
 * be read), and room for its results, which it fills with new references
 * owned by the current scope. */
typedef struct {
    const onnx_model *m;
    const onnx_node *node;
    kiln_tensor **in;
    const bool *known;
    kiln_tensor **out;
} onnx_call;

struct onnx_op {
    const char *name;
    int (*run)(onnx_call *c);
    int min_in, max_in, min_out, max_out;
    const char *attrs; /* the attributes it reads, each followed by a space */
    bool shape_only;   /* its results depend on its operands' shapes alone (Shape): constants */
};

/* The device t's values are on; a tracer's is its trace's (where the
 * call's inputs are). */
kiln_device onnx_device_of(const kiln_tensor *t);

/* The op named op_type in the default domain, or NULL. */
const onnx_op *onnx_find_op(const char *op_type);

/* Fails the node of c with "kiln_onnx: 'model': node 'name' (Op): ...". */
int onnx_fail(const onnx_call *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same for node at load time, with fn. */
int onnx_fail_node(const char *fn, const onnx_model *m, const onnx_node *node, int status, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The attribute named name of c's node, or NULL. */
const Onnx__AttributeProto *onnx_attr(const onnx_call *c, const char *name);

#endif
