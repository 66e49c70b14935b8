/* rewrite.c — in-place graph surgery for the passes (see ir.h). */
#include "graph/ir.h"
#include "ops/op.h"

#include <stdlib.h>

int *om_graph_use_counts(const om_graph *g) {
    int *uses = calloc((size_t)g->n_values + 1, sizeof(int));
    if (!uses) return NULL;
    for (int k = 0; k < g->n_nodes; k++) {
        const om_node *n = &g->nodes[k];
        if (n->dead) continue;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0) uses[n->in[i]]++;
    }
    for (int i = 0; i < g->n_outputs; i++) uses[g->outputs[i]]++;
    return uses;
}

void om_graph_replace_uses(om_graph *g, int from, int to) {
    for (int k = 0; k < g->n_nodes; k++) {
        om_node *n = &g->nodes[k];
        if (n->dead) continue;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == from) n->in[i] = to;
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == from) g->outputs[i] = to;
    for (int i = 0; g->grad_of_input && i < g->n_inputs; i++)
        if (g->grad_of_input[i] == from) g->grad_of_input[i] = to;
}

static void clear_attrs(om_node *n) {
    for (int a = 0; a < n->n_attr; a++) {
        free(n->attr[a].name);
        free(n->attr[a].s);
        free(n->attr[a].ints);
        free(n->attr[a].floats);
        for (int k = 0; n->attr[a].strs && k < n->attr[a].n; k++) free(n->attr[a].strs[k]);
        free(n->attr[a].strs);
        om_free(n->attr[a].t.data);
    }
    free(n->attr);
    n->attr = NULL;
    n->n_attr = 0;
}

om_status *om_graph_replace_node(om_graph *g, int idx, om_op_id op_id, const int *in, int n_in, const int *out,
                                 int n_out) {
    const om_op_def *op = om_op_get(op_id);
    if (!op) return om_error(OM_INTERNAL, "rewrite to op id %d, which is not in the op table", (int)op_id);
    om_node *n = &g->nodes[idx];
    /* padded with -1 to the op's arity, as om_graph_add_node does */
    const int cap_in = om_node_slots(n_in, op->max_in), cap_out = om_node_slots(n_out, op->max_out);
    int *ni = malloc(sizeof(int) * (size_t)(cap_in + 1)), *no = malloc(sizeof(int) * (size_t)(cap_out + 1));
    if (!ni || !no) { free(ni); free(no); return om_error(OM_OUT_OF_MEMORY, "out of memory in a pass"); }
    for (int i = 0; i < cap_in; i++) ni[i] = i < n_in ? in[i] : -1;
    for (int j = 0; j < cap_out; j++) no[j] = j < n_out ? out[j] : -1;
    free(n->in);
    free(n->out);
    clear_attrs(n);
    n->in = ni;
    n->out = no;
    n->n_in = n_in;
    n->n_out = n_out;
    n->op = op;
    n->op_id = op_id;
    n->dead = 0;
    for (int j = 0; j < n_out; j++)
        if (out[j] >= 0) g->values[out[j]].producer = idx;
    return NULL;
}

om_status *om_graph_compact(om_graph *g) {
    int *remap = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    if (!remap) return om_error(OM_OUT_OF_MEMORY, "out of memory in a pass");
    int m = 0, fwd = 0;
    for (int k = 0; k < g->n_nodes; k++) {
        om_node *n = &g->nodes[k];
        if (n->dead) {
            remap[k] = -1;
            free(n->name);
            free(n->in);
            free(n->out);
            clear_attrs(n);
            continue;
        }
        remap[k] = m;
        if (k < g->n_fwd_nodes) fwd++;
        if (m != k) g->nodes[m] = *n;
        m++;
    }
    if (g->n_fwd_nodes) g->n_fwd_nodes = fwd;
    g->n_nodes = m;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].producer >= 0) g->values[v].producer = remap[g->values[v].producer];
    for (int k = 0; k < g->n_nodes; k++)   /* producers must point at live nodes */
        for (int j = 0; j < g->nodes[k].n_out; j++)
            if (g->nodes[k].out[j] >= 0) g->values[g->nodes[k].out[j]].producer = k;
    free(remap);
    /* constants that nothing reads any more are dropped from export and planning */
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in a pass");
    for (int v = 0; v < g->n_values; v++) {
        om_value *val = &g->values[v];
        if (val->constant && !uses[v] && val->is_input < 0) {
            om_free(val->constant->data);
            free(val->constant);
            val->constant = NULL;
        }
    }
    free(uses);
    return NULL;
}

int om_value_constants_equal(const om_graph *g, int a, int b) {
    const om_tensor *x = g->values[a].constant, *y = g->values[b].constant;
    if (!x || !y || x->dtype != y->dtype || !om_shape_equal(x, y)) return 0;
    return memcmp(x->data, y->data, om_tensor_nbytes(x)) == 0;
}
