/* cse.c — common subexpression elimination: two deterministic nodes of the same op, with
 * the same inputs and the same attributes, compute the same thing; keep the first.
 * Equal small constants are merged first so that "x * 0.5" twice is found too. */
#include "passes/pass.h"

#include <stdlib.h>

static int attrs_equal(const om_node *a, const om_node *b) {
    if (a->n_attr != b->n_attr) return 0;
    for (int i = 0; i < a->n_attr; i++) {
        const om_attr *x = &a->attr[i], *y = om_attr_find(b, a->attr[i].name);
        if (!y || x->type != y->type) return 0;
        switch (x->type) {
        case OM_ATTR_INT: if (x->i != y->i) return 0; break;
        case OM_ATTR_FLOAT: if (memcmp(&x->f, &y->f, sizeof x->f)) return 0; break;
        case OM_ATTR_STRING: if (strcmp(x->s, y->s)) return 0; break;
        case OM_ATTR_INTS: if (x->n != y->n || memcmp(x->ints, y->ints, sizeof(int64_t) * (size_t)x->n)) return 0; break;
        case OM_ATTR_FLOATS: if (x->n != y->n || memcmp(x->floats, y->floats, sizeof(float) * (size_t)x->n)) return 0; break;
        case OM_ATTR_STRINGS:
            if (x->n != y->n) return 0;
            for (int k = 0; k < x->n; k++)
                if (strcmp(x->strs[k], y->strs[k])) return 0;
            break;
        case OM_ATTR_TENSOR:
            if (x->t.dtype != y->t.dtype || !om_shape_equal(&x->t, &y->t) ||
                memcmp(x->t.data, y->t.data, om_tensor_nbytes(&x->t)))
                return 0;
            break;
        }
    }
    return 1;
}

static int same_node(const om_node *a, const om_node *b) {
    if (a->op != b->op || a->n_in != b->n_in || a->n_out != b->n_out) return 0;
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i] != b->in[i]) return 0;
    for (int j = 0; j < a->n_out; j++)   /* an optional output present in one only: differ */
        if ((a->out[j] < 0) != (b->out[j] < 0)) return 0;
    return attrs_equal(a, b);
}

#define SMALL_CONST_BYTES 256

om_status *om_pass_cse(om_pass_ctx *c) {
    om_graph *g = c->g;
    /* 1. merge equal small constants (not graph inputs) */
    int *consts = malloc(sizeof(int) * (size_t)(g->n_values + 1));
    if (!consts) return om_error(OM_OUT_OF_MEMORY, "out of memory in cse");
    int nc = 0;
    for (int v = 0; v < g->n_values; v++) {
        const om_tensor *t = g->values[v].constant;
        if (!t || om_tensor_nbytes(t) > SMALL_CONST_BYTES) continue;
        int merged = 0;
        for (int i = 0; i < nc && !merged; i++)
            if (om_value_constants_equal(g, consts[i], v)) {
                om_graph_replace_uses(g, v, consts[i]);
                merged = 1;
            }
        if (!merged) consts[nc++] = v;
    }
    free(consts);
    /* 2. merge equal nodes; bucket by op and first input to keep it near linear */
    enum { BUCKETS = 4096 };
    int *head = malloc(sizeof(int) * BUCKETS), *next = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    if (!head || !next) { free(head); free(next); return om_error(OM_OUT_OF_MEMORY, "out of memory in cse"); }
    for (int b = 0; b < BUCKETS; b++) head[b] = -1;
    for (int k = 0; k < g->n_nodes; k++) {
        om_node *n = &g->nodes[k];
        next[k] = -1;
        if (n->dead || (n->op->flags & OM_OP_RANDOM)) continue;
        uintptr_t h = (uintptr_t)n->op * 31u + (uintptr_t)(n->n_in ? n->in[0] + 1 : 0) * 131u +
                      (uintptr_t)(n->n_in > 1 ? n->in[1] + 1 : 0);
        int b = (int)(h % BUCKETS);
        int found = -1;
        for (int m = head[b]; m >= 0 && found < 0; m = next[m])
            if (same_node(&g->nodes[m], n)) found = m;
        if (found < 0) {
            next[k] = head[b];
            head[b] = k;
            continue;
        }
        /* keep the earlier node (it dominates: same inputs, earlier in topological order) */
        const om_node *keep = &g->nodes[found];
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0) om_graph_replace_uses(g, n->out[j], keep->out[j]);
        n->dead = 1;
        om_pass_fired(c, n->name);
    }
    free(head);
    free(next);
    return NULL;
}
