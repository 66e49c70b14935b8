/* recompute.c — see recompute.h. Clones of forward nodes are placed just before their
 * first backward consumer (their own recomputed inputs before them), so liveness keeps
 * only one stretch of recomputed activations alive at a time. */
#include "plan/recompute.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct rc_state {
    om_graph *g;
    int nf;                /* forward nodes */
    char *recompute;       /* per forward node: cloned into the backward */
    int *clone_of_value;   /* per value: its recomputed twin, or -1 */
    int *clone_node;       /* per forward node: index of its clone in the new order, or -1 */
    om_node *order;        /* the new backward part */
    int n_order, cap_order;
} rc_state;

static om_status *copy_attrs(om_node *dst, const om_node *src) {
    dst->attr = calloc((size_t)src->n_attr + 1, sizeof(om_attr));
    if (!dst->attr) return om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
    dst->n_attr = src->n_attr;
    for (int a = 0; a < src->n_attr; a++) {
        const om_attr *s = &src->attr[a];
        om_attr *d = &dst->attr[a];
        *d = *s;
        d->name = om_strdup(s->name);
        d->s = om_strdup(s->s);
        d->ints = NULL;
        d->floats = NULL;
        d->strs = NULL;
        d->t.data = NULL;
        if (s->ints) {
            d->ints = malloc(sizeof(int64_t) * (size_t)(s->n + 1));
            if (d->ints) memcpy(d->ints, s->ints, sizeof(int64_t) * (size_t)s->n);
        }
        if (s->floats) {
            d->floats = malloc(sizeof(float) * (size_t)(s->n + 1));
            if (d->floats) memcpy(d->floats, s->floats, sizeof(float) * (size_t)s->n);
        }
        if (s->strs) {   /* (n strings; d->n = 0 until all are copied, for the caller's cleanup) */
            d->n = 0;
            d->strs = calloc((size_t)s->n + 1, sizeof(char *));
            for (int k = 0; d->strs && k < s->n; k++) {
                if (!(d->strs[k] = om_strdup(s->strs[k]))) return om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
                d->n = k + 1;
            }
            if (!d->strs) return om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
        }
        if (s->type == OM_ATTR_TENSOR && s->t.data) {
            d->t.data = om_alloc(om_tensor_nbytes(&s->t));
            if (d->t.data) memcpy(d->t.data, s->t.data, om_tensor_nbytes(&s->t));
        }
        if (!d->name || (s->s && !d->s) || (s->ints && !d->ints) || (s->floats && !d->floats) ||
            (s->type == OM_ATTR_TENSOR && s->t.data && !d->t.data))
            return om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
    }
    return NULL;
}

static om_status *push(rc_state *s, om_node n) {
    if (om_grow((void **)&s->order, &s->cap_order, s->n_order, sizeof(om_node)))
        return om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
    s->order[s->n_order++] = n;
    return NULL;
}

/* Emits the clone of forward node k (after the clones of its recomputed inputs). */
static om_status *emit_clone(rc_state *s, int k) {
    if (s->clone_node[k] >= 0) return NULL;
    om_graph *g = s->g;
    const om_node *src = &g->nodes[k];
    for (int i = 0; i < src->n_in; i++) {
        int v = src->in[i];
        if (v >= 0 && g->values[v].producer >= 0 && s->recompute[g->values[v].producer])
            OM_TRY(emit_clone(s, g->values[v].producer));
    }
    src = &g->nodes[k];
    om_node n;
    memset(&n, 0, sizeof n);
    n.op = src->op;
    n.op_id = src->op_id;
    n.backward = 1;
    char name[512];
    snprintf(name, sizeof name, "%s/recompute", src->name);
    n.name = om_strdup(name);
    n.n_in = src->n_in;
    n.n_out = src->n_out;
    n.in = malloc(sizeof(int) * (size_t)(n.n_in + 1));
    n.out = malloc(sizeof(int) * (size_t)(n.n_out + 1));
    if (!n.name || !n.in || !n.out) return om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
    for (int i = 0; i < n.n_in; i++) {
        int v = src->in[i];
        n.in[i] = v >= 0 && s->clone_of_value[v] >= 0 ? s->clone_of_value[v] : v;
    }
    OM_TRY(copy_attrs(&n, src));
    for (int j = 0; j < n.n_out; j++) {
        int v = g->nodes[k].out[j];
        if (v < 0) { n.out[j] = -1; continue; }
        char vn[512];
        snprintf(vn, sizeof vn, "%s/recompute", g->values[v].name);
        int c = om_graph_add_value(g, vn, g->values[v].dtype);
        if (c < 0) return om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
        g->values[c].rank_hint = g->values[v].rank_hint;
        n.out[j] = c;
        s->clone_of_value[v] = c;
    }
    s->clone_node[k] = s->nf + s->n_order;
    return push(s, n);
}

om_status *om_recompute(om_graph *g, int level, int *n_recomputed) {
    *n_recomputed = 0;
    if (level <= 0 || g->n_fwd_nodes == 0 || g->n_fwd_nodes == g->n_nodes) return NULL;
    om_status *st = NULL;
    rc_state s = {.g = g, .nf = g->n_fwd_nodes};
    int nv = g->n_values;
    int *bwd_uses = calloc((size_t)nv + 1, sizeof(int));
    char *boundary = calloc((size_t)nv + 1, 1);
    s.recompute = calloc((size_t)s.nf + 1, 1);
    s.clone_node = malloc(sizeof(int) * ((size_t)s.nf + 1));
    /* clones add values; size for the worst case of every forward output cloned */
    int max_values = nv + 1;
    for (int k = 0; k < s.nf; k++) max_values += g->nodes[k].n_out;
    s.clone_of_value = malloc(sizeof(int) * (size_t)max_values);
    if (!bwd_uses || !boundary || !s.recompute || !s.clone_node || !s.clone_of_value) {
        st = om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
        goto done;
    }
    for (int v = 0; v < max_values; v++) s.clone_of_value[v] = -1;
    for (int k = 0; k < s.nf; k++) s.clone_node[k] = -1;
    for (int k = s.nf; k < g->n_nodes; k++)
        for (int i = 0; i < g->nodes[k].n_in; i++)
            if (g->nodes[k].in[i] >= 0) bwd_uses[g->nodes[k].in[i]]++;

    if (level == 1) {
        /* a cheap node whose inputs the backward reads anyway: its outputs need no stash */
        for (int k = 0; k < s.nf; k++) {
            const om_node *n = &g->nodes[k];
            if (!om_op_cheap(n->op_id) || (n->op->flags & OM_OP_RANDOM)) continue;
            int used = 0, inputs_kept = 1;
            for (int j = 0; j < n->n_out; j++) used |= n->out[j] >= 0 && bwd_uses[n->out[j]] > 0;
            for (int i = 0; i < n->n_in; i++) {
                int v = n->in[i];
                if (v < 0 || g->values[v].constant || g->values[v].is_input >= 0 || g->values[v].producer < 0) continue;
                if (bwd_uses[v] == 0) inputs_kept = 0;
            }
            if (used && inputs_kept) s.recompute[k] = 1;
        }
    } else {
        /* boundaries: what a layer-by-layer recompute keeps */
        for (int k = 0; k < s.nf; k++) {
            const om_node *n = &g->nodes[k];
            if (n->op->flags & OM_OP_RANDOM)
                for (int j = 0; j < n->n_out; j++)
                    if (n->out[j] >= 0) boundary[n->out[j]] = 1;
            if ((n->op_id == om_op_layer_norm_id || n->op_id == om_op_simplified_layer_norm_id) &&
                n->n_in > 0 && n->in[0] >= 0)
                boundary[n->in[0]] = 1;
        }
        for (int k = 0; k < s.nf; k++) {
            const om_node *n = &g->nodes[k];
            if (n->op->flags & (OM_OP_RANDOM | OM_OP_SHAPE_ONLY)) continue;
            int b = 0;
            for (int j = 0; j < n->n_out; j++) b |= n->out[j] >= 0 && boundary[n->out[j]];
            if (!b) s.recompute[k] = 1;
        }
        /* only worth it where some output is read by the backward (or feeds such a clone) */
        char *needed = calloc((size_t)nv + 1, 1);
        if (!needed) { st = om_error(OM_OUT_OF_MEMORY, "out of memory in recompute"); goto done; }
        for (int v = 0; v < nv; v++) needed[v] = bwd_uses[v] > 0;
        for (int k = s.nf - 1; k >= 0; k--) {
            const om_node *n = &g->nodes[k];
            if (!s.recompute[k]) continue;
            int any = 0;
            for (int j = 0; j < n->n_out; j++) any |= n->out[j] >= 0 && needed[n->out[j]];
            if (!any) { s.recompute[k] = 0; continue; }
            for (int i = 0; i < n->n_in; i++)
                if (n->in[i] >= 0) needed[n->in[i]] = 1;
        }
        free(needed);
    }

    int any = 0;
    for (int k = 0; k < s.nf; k++) any |= s.recompute[k];
    if (!any) goto done;

    /* The new backward: each original backward node, preceded by the clones it reads. */
    for (int k = s.nf; k < g->n_nodes; k++) {
        for (int i = 0; i < g->nodes[k].n_in; i++) {
            int v = g->nodes[k].in[i];
            if (v < 0 || v >= nv || g->values[v].producer < 0 || g->values[v].producer >= s.nf) continue;
            int p = g->values[v].producer;
            if (!s.recompute[p]) continue;
            if ((st = emit_clone(&s, p))) goto done;
            g->nodes[k].in[i] = s.clone_of_value[v];
        }
        if ((st = push(&s, g->nodes[k]))) goto done;
    }
    int n_clones = s.n_order - (g->n_nodes - s.nf);
    int total = s.nf + s.n_order;
    if (om_grow((void **)&g->nodes, &g->cap_nodes, total, sizeof(om_node))) {
        st = om_error(OM_OUT_OF_MEMORY, "out of memory in recompute");
        goto done;
    }
    memcpy(g->nodes + s.nf, s.order, sizeof(om_node) * (size_t)s.n_order);
    g->n_nodes = total;
    for (int k = 0; k < g->n_nodes; k++)
        for (int j = 0; j < g->nodes[k].n_out; j++)
            if (g->nodes[k].out[j] >= 0) g->values[g->nodes[k].out[j]].producer = k;
    *n_recomputed = n_clones;
    free(s.order);
    s.order = NULL;
done:
    if (st && s.order) {   /* clones not yet in the graph: free them (originals are still owned by g) */
        for (int i = 0; i < s.n_order; i++)
            if (strstr(s.order[i].name, "/recompute")) {
                free(s.order[i].name);
                free(s.order[i].in);
                free(s.order[i].out);
            }
    }
    free(s.order);
    free(bwd_uses);
    free(boundary);
    free(s.recompute);
    free(s.clone_node);
    free(s.clone_of_value);
    return st;
}
