/* What the files of src/trace share: guards, and the segments of traces that
 * broke at reads of traced values (path.c). */
#ifndef KILN_TRACE_INTERNAL_H
#define KILN_TRACE_INTERNAL_H

#include "trace/trace.h"

/* What a specialization (or a segment) assumes of one input: its dtype,
 * device and rank, and per axis a fixed size (>= 0) or symbol -1 - size. */
typedef struct {
    kiln_dtype dtype;
    kiln_device device;
    int ndim;
    int64_t dims[KILN_MAX_DIMS];
} guard;

/* Whether n inputs of signature sig pass guards, which then gives the
 * symbols' values (IR_MAX_SYMBOLS of them). */
bool guards_pass(const guard *guards, int n, const kiln_spec *sig, int64_t *symbols);
/* The guards of the n inputs of symbolized graph g traced for sig: what sig
 * says, each symbolic size of g's input nodes a symbol. */
void guards_of(const ir_graph *g, int n, const kiln_spec *sig, guard *guards);

/* -- path.c: segments ----------------------------------------------------------- *
 * A trace that broke at reads is a path of segments: each runs on its inputs
 * (the function's for the first, what the one before carried for the
 * others) and gives the value read then the values it carries on, or, the
 * last one, the function's outputs. A specialization's segments form a tree:
 * after each, one branch per value its read gave (the bytes read, as the
 * body saw them). */

typedef struct segment segment;

typedef struct {
    void *key;          /* the bytes the read gave */
    size_t size;
    segment *next;
} branch;

struct segment {
    executable *exec;
    guard *guards;      /* on its inputs */
    int n_inputs;
    bool last;          /* its outputs are the function's */
    branch *branches;
    int n_branches;
};

/* A new segment owning x and guards (n_inputs of them), or NULL (freeing
 * them) when out of memory. */
segment *segment_new(executable *x, guard *guards, int n_inputs, bool last);
/* Frees s and every segment after it. */
void segment_free_tree(segment *s);
/* The bytes of value (malloc'd, *size of them), or NULL with the error set. */
void *segment_key(const kiln_tensor *value, size_t *size);
/* Adds branch key -> next after s (taking key). -1 when out of memory. */
int segment_branch(segment *s, void *key, size_t size, segment *next);
/* The segment after s for key, or NULL. */
segment *segment_follow(const segment *s, const void *key, size_t size);
/* Joins path (a chain of one branch each, as a trace made it) into the tree
 * at root: its segments that the tree has already (the same keys from the
 * root) are freed, the rest hang from the last shared one. How many it freed. */
int segment_merge(segment *root, segment *path);
/* How many paths the tree at root has. */
int segment_paths(const segment *root);

#endif
