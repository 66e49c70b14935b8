/* ir.c — building and querying the graph IR. */
#include "graph/ir.h"
#include "ops/op.h"

#include <stdio.h>
#include <stdlib.h>

om_graph *om_graph_new(void) { return calloc(1, sizeof(om_graph)); }

static void attr_clear(om_attr *a) {
    free(a->name);
    free(a->s);
    free(a->ints);
    free(a->floats);
    if (a->strs)
        for (int i = 0; i < a->n; i++) free(a->strs[i]);
    free(a->strs);
    om_free(a->t.data);
}

void om_graph_free(om_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_values; i++) {
        free(g->values[i].name);
        if (g->values[i].constant) {
            om_free(g->values[i].constant->data);
            free(g->values[i].constant);
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        om_node *n = &g->nodes[i];
        free(n->name);
        free(n->in);
        free(n->out);
        for (int a = 0; a < n->n_attr; a++) attr_clear(&n->attr[a]);
        free(n->attr);
    }
    free(g->values);
    free(g->nodes);
    free(g->inputs);
    free(g->outputs);
    free(g->grad_of_output);
    free(g->grad_of_input);
    free(g);
}

int om_graph_add_value(om_graph *g, const char *name, om_dtype dtype) {
    if (om_grow((void **)&g->values, &g->cap_values, g->n_values, sizeof(om_value))) return -1;
    int id = g->n_values;
    om_value *v = &g->values[id];
    memset(v, 0, sizeof(*v));
    char buf[32];
    if (!name) {
        snprintf(buf, sizeof buf, "om_v%d", id);
        name = buf;
    }
    v->name = om_strdup(name);
    if (!v->name) return -1;
    v->dtype = dtype;
    v->producer = -1;
    v->is_input = -1;
    v->rank_hint = -1;
    g->n_values++;
    return id;
}

int om_graph_find_value(const om_graph *g, const char *name) {
    for (int i = g->n_values - 1; i >= 0; i--)
        if (strcmp(g->values[i].name, name) == 0) return i;
    return -1;
}

om_status *om_graph_add_node(om_graph *g, const char *op_type, const char *domain, const char *name,
                             const int *in, int n_in, const int *out, int n_out, int *node_id) {
    const om_op_id id = om_op_find_id(op_type, domain ? domain : "");
    if (id == OM_OP_NONE)
        return om_error(OM_UNSUPPORTED_OP, "unsupported op '%s%s%s' (node '%s')",
                        domain && *domain ? domain : "", domain && *domain ? "::" : "", op_type,
                        name ? name : "?");
    return om_graph_add_op(g, id, name, in, n_in, out, n_out, node_id);
}

om_status *om_graph_add_op(om_graph *g, om_op_id op_id, const char *name, const int *in, int n_in, const int *out,
                           int n_out, int *node_id) {
    const om_op_def *op = om_op_get(op_id);
    if (!op) return om_error(OM_INTERNAL, "node '%s': op id %d is not in the op table", name ? name : "?", (int)op_id);
    const char *op_type = op->name;
    if (n_in < op->min_in || n_in > op->max_in || n_out < op->min_out || n_out > op->max_out)
        return om_error(OM_INVALID_MODEL, "node '%s' (%s) has %d inputs and %d outputs; expected %d..%d and %d..%d",
                        name ? name : "?", op_type, n_in, n_out, op->min_in, op->max_in, op->min_out,
                        op->max_out);
    if (om_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes, sizeof(om_node)))
        return om_error(OM_OUT_OF_MEMORY, "out of memory adding node");
    int id = g->n_nodes;
    om_node *n = &g->nodes[id];
    memset(n, 0, sizeof(*n));
    n->op = op;
    n->op_id = op_id;
    char buf[48];
    if (!name || !*name) {
        snprintf(buf, sizeof buf, "%s_%d", op_type, id);
        name = buf;
    }
    n->name = om_strdup(name);
    /* room for every input and output the op can have, the ones not given -1 (absent): rules
     * and kernels read optional ones by position, and an imported node may stop before them */
    const int cap_in = om_node_slots(n_in, op->max_in), cap_out = om_node_slots(n_out, op->max_out);
    n->in = malloc(sizeof(int) * (size_t)(cap_in ? cap_in : 1));
    n->out = malloc(sizeof(int) * (size_t)(cap_out ? cap_out : 1));
    if (!n->name || !n->in || !n->out) return om_error(OM_OUT_OF_MEMORY, "out of memory adding node");
    for (int i = 0; i < cap_in; i++) n->in[i] = i < n_in ? in[i] : -1;
    for (int j = 0; j < cap_out; j++) n->out[j] = j < n_out ? out[j] : -1;
    n->n_in = n_in;
    n->n_out = n_out;
    for (int i = 0; i < n_out; i++)
        if (out[i] >= 0) g->values[out[i]].producer = id;
    g->n_nodes++;
    if (node_id) *node_id = id;
    return NULL;
}

const om_attr *om_attr_find(const om_node *n, const char *name) {
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attr[i].name, name) == 0) return &n->attr[i];
    return NULL;
}

int64_t om_attr_int(const om_node *n, const char *name, int64_t dflt) {
    const om_attr *a = om_attr_find(n, name);
    return a && a->type == OM_ATTR_INT ? a->i : dflt;
}

float om_attr_float(const om_node *n, const char *name, float dflt) {
    const om_attr *a = om_attr_find(n, name);
    if (!a) return dflt;
    if (a->type == OM_ATTR_FLOAT) return a->f;
    if (a->type == OM_ATTR_INT) return (float)a->i;
    return dflt;
}

double om_attr_real(const om_node *n, const char *name, double dflt) {
    const om_attr *a = om_attr_find(n, name);
    if (!a) return dflt;
    if (a->type == OM_ATTR_FLOAT) return om_float_decimal(a->f);
    if (a->type == OM_ATTR_INT) return (double)a->i;
    return dflt;
}

const char *om_attr_string(const om_node *n, const char *name, const char *dflt) {
    const om_attr *a = om_attr_find(n, name);
    return a && a->type == OM_ATTR_STRING && a->s ? a->s : dflt;
}

int om_attr_ints(const om_node *n, const char *name, const int64_t **vals) {
    const om_attr *a = om_attr_find(n, name);
    if (!a || a->type != OM_ATTR_INTS) return -1;
    *vals = a->ints;
    return a->n;
}

int om_attr_strings(const om_node *n, const char *name, const char *const **vals) {
    const om_attr *a = om_attr_find(n, name);
    if (!a || a->type != OM_ATTR_STRINGS) return -1;
    *vals = (const char *const *)a->strs;
    return a->n;
}

/* Returns the attr slot named `name` on node, replacing an existing one. */
static om_attr *attr_slot(om_graph *g, int node, const char *name) {
    om_node *n = &g->nodes[node];
    for (int i = 0; i < n->n_attr; i++)
        if (strcmp(n->attr[i].name, name) == 0) {
            attr_clear(&n->attr[i]);
            memset(&n->attr[i], 0, sizeof(om_attr));
            n->attr[i].name = om_strdup(name);
            return n->attr[i].name ? &n->attr[i] : NULL;
        }
    om_attr *grown = realloc(n->attr, sizeof(om_attr) * (size_t)(n->n_attr + 1));
    if (!grown) return NULL;
    n->attr = grown;
    om_attr *a = &n->attr[n->n_attr];
    memset(a, 0, sizeof(*a));
    a->name = om_strdup(name);
    if (!a->name) return NULL;
    n->n_attr++;
    return a;
}

#define ATTR_OOM om_error(OM_OUT_OF_MEMORY, "out of memory setting attribute")

om_status *om_node_set_int(om_graph *g, int node, const char *name, int64_t v) {
    om_attr *a = attr_slot(g, node, name);
    if (!a) return ATTR_OOM;
    a->type = OM_ATTR_INT;
    a->i = v;
    return NULL;
}

om_status *om_node_set_float(om_graph *g, int node, const char *name, float v) {
    om_attr *a = attr_slot(g, node, name);
    if (!a) return ATTR_OOM;
    a->type = OM_ATTR_FLOAT;
    a->f = v;
    return NULL;
}

om_status *om_node_set_ints(om_graph *g, int node, const char *name, const int64_t *v, int n) {
    om_attr *a = attr_slot(g, node, name);
    if (!a) return ATTR_OOM;
    a->type = OM_ATTR_INTS;
    a->ints = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!a->ints) return ATTR_OOM;
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
    a->n = n;
    return NULL;
}

om_status *om_node_set_string(om_graph *g, int node, const char *name, const char *s) {
    om_attr *a = attr_slot(g, node, name);
    if (!a) return ATTR_OOM;
    a->type = OM_ATTR_STRING;
    a->s = om_strdup(s);
    return a->s ? NULL : ATTR_OOM;
}

om_status *om_node_set_strings(om_graph *g, int node, const char *name, const char *const *s, int n) {
    om_attr *a = attr_slot(g, node, name);
    if (!a) return ATTR_OOM;
    a->type = OM_ATTR_STRINGS;
    a->strs = calloc((size_t)(n ? n : 1), sizeof(char *));
    if (!a->strs) return ATTR_OOM;
    a->n = n;
    for (int i = 0; i < n; i++)
        if (!(a->strs[i] = om_strdup(s[i]))) return ATTR_OOM;
    return NULL;
}

om_status *om_node_set_tensor(om_graph *g, int node, const char *name, const om_tensor *t) {
    om_attr *a = attr_slot(g, node, name);
    if (!a) return ATTR_OOM;
    a->type = OM_ATTR_TENSOR;
    a->t = *t;
    size_t nb = om_tensor_nbytes(t);
    a->t.data = om_alloc(nb);
    if (!a->t.data) return ATTR_OOM;
    if (nb) memcpy(a->t.data, t->data, nb);
    return NULL;
}

int om_node_ensure_output(om_graph *g, int node, int idx, om_dtype dtype) {
    om_node *n = &g->nodes[node];
    if (idx < n->n_out && n->out[idx] >= 0) return n->out[idx];
    if (idx >= n->op->max_out) return -1;
    if (idx >= n->n_out) {
        int *grown = realloc(n->out, sizeof(int) * (size_t)(idx + 1));
        if (!grown) return -1;
        n->out = grown;
        for (int i = n->n_out; i <= idx; i++) n->out[i] = -1;
        n->n_out = idx + 1;
    }
    char name[256];
    snprintf(name, sizeof name, "%s_saved_%d", n->name, idx);
    int v = om_graph_add_value(g, name, dtype);
    if (v < 0) return -1;
    n = &g->nodes[node];   /* values array moved, nodes did not, but stay safe */
    n->out[idx] = v;
    g->values[v].producer = node;
    return v;
}

om_status *om_graph_infer_types(om_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        om_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_out; j++) {
            int v = n->out[j];
            if (v < 0) continue;
            om_dtype dt;
            if (n->op->dtype) dt = n->op->dtype(g, n, j);
            else dt = n->n_in > 0 && n->in[0] >= 0 ? g->values[n->in[0]].dtype : OM_UNDEFINED;
            if (dt != OM_UNDEFINED) g->values[v].dtype = dt;
        }
    }
    return NULL;
}
