/* Guards, segments, and the tree of segments a specialization grows, one
 * branch per value a read gave. See internal.h. */
#include <stdlib.h>
#include <string.h>

#include "trace/internal.h"

bool guards_pass(const guard *guards, int n, const kiln_spec *sig, int64_t *symbols)
{
    memset(symbols, 0, IR_MAX_SYMBOLS * sizeof *symbols);
    for (int i = 0; i < n; i++) {
        const guard *g = &guards[i];
        if (g->dtype != sig[i].dtype || g->ndim != sig[i].ndim || g->device != sig[i].device)
            return false;
        for (int d = 0; d < g->ndim; d++) {
            int64_t want = g->dims[d], size = sig[i].shape[d];
            int64_t *symbol = want < 0 ? &symbols[-1 - want] : NULL;
            if (want >= 0 ? size != want : *symbol ? size != *symbol : size < 2)
                return false;
            if (symbol)
                *symbol = size;
        }
    }
    return true;
}

void guards_of(const ir_graph *g, int n, const kiln_spec *sig, guard *guards)
{
    for (int i = 0; i < n; i++) {
        guards[i] = (guard){sig[i].dtype, sig[i].device, sig[i].ndim, {0}};
        memcpy(guards[i].dims, sig[i].shape, sizeof guards[i].dims);
    }
    for (ir_ref r = 0; r < g->count; r++) {
        const ir_node *node = &g->nodes[r];
        for (int d = 0; node->op == OP_INPUT && node->params.index < n && d < node->ndim; d++)
            if (node->shape[d] < 0)
                guards[node->params.index].dims[d] = -1 - ir_size_as_symbol(&g->sizes, node->shape[d]);
    }
}

segment *segment_new(executable *x, guard *guards, int n_inputs, bool last)
{
    segment *s = calloc(1, sizeof *s);
    if (!s) {
        exec_free(x);
        free(guards);
        return NULL;
    }
    *s = (segment){.exec = x, .guards = guards, .n_inputs = n_inputs, .last = last};
    return s;
}

static void free_one(segment *s)
{
    exec_free(s->exec);
    free(s->guards);
    for (int i = 0; i < s->n_branches; i++)
        free(s->branches[i].key);
    free(s->branches);
    free(s);
}

void segment_free_tree(segment *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_branches; i++)
        segment_free_tree(s->branches[i].next);
    free_one(s);
}

void *segment_key(const kiln_tensor *value, size_t *size)
{
    *size = (size_t)kiln_numel(value) * kiln_dtype_size(kiln_dtype_of(value));
    void *key = malloc(*size ? *size : 1);
    if (!key) {
        core_fail(CORE_NOMEM, "kiln_call", "out of memory reading a traced value");
        return NULL;
    }
    if (kiln_copy_to_host(value, key, *size) < 0) {
        free(key);
        return NULL;
    }
    return key;
}

int segment_branch(segment *s, void *key, size_t size, segment *next)
{
    branch *grown = realloc(s->branches, ((size_t)s->n_branches + 1) * sizeof *grown);
    if (!grown)
        return -1;
    s->branches = grown;
    s->branches[s->n_branches++] = (branch){key, size, next};
    return 0;
}

segment *segment_follow(const segment *s, const void *key, size_t size)
{
    for (int i = 0; i < s->n_branches; i++)
        if (s->branches[i].size == size && !memcmp(s->branches[i].key, key, size))
            return s->branches[i].next;
    return NULL;
}

int segment_merge(segment *root, segment *path)
{
    int freed = 0;
    while (!path->last) {
        const branch *b = &path->branches[0];
        segment *shared = segment_follow(root, b->key, b->size);
        if (!shared) { /* the rest is new: it hangs from root */
            segment *rest = b->next;
            void *key = b->key;
            size_t size = b->size;
            path->n_branches = 0;
            if (segment_branch(root, key, size, rest) < 0) {
                free(key);
                segment_free_tree(rest);
            }
            free_one(path);
            return freed + 1;
        }
        segment *next = b->next;
        free(b->key);
        path->n_branches = 0;
        free_one(path);
        freed++;
        root = shared, path = next;
    }
    free_one(path); /* the whole path was there already */
    return freed + 1;
}

int segment_paths(const segment *root)
{
    if (root->last)
        return 1;
    int n = 0;
    for (int i = 0; i < root->n_branches; i++)
        n += segment_paths(root->branches[i].next);
    return n;
}
