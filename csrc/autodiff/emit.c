/* emit.c — the helpers gradient rules use to add backward nodes (see ops/op.h). */
#include "autodiff/emit_ctx.h"

#include <stdio.h>
#include <stdlib.h>

om_status *om_grad_fail(om_grad_ctx *c, om_status *st) {
    om_grad_state *s = (om_grad_state *)c;
    if (st && !s->status) s->status = st;
    else if (st && st != s->status) om_status_free(st);
    return s->status;
}

int om_emit_node(om_grad_ctx *c, om_op_id op_id, const int *in, int n_in, int *out, int n_out,
                 int *node_id) {
    om_grad_state *s = (om_grad_state *)c;
    om_graph *g = c->g;
    if (s->status) return -1;
    const om_op_def *op = om_op_get(op_id);
    if (!op) {
        om_grad_fail(c, om_error(OM_INTERNAL, "gradient of node '%s' emitted op id %d, which is not in the op table",
                                 g->nodes[c->node].name, (int)op_id));
        return -1;
    }
    const char *op_type = op->name;
    for (int i = 0; i < n_in; i++)
        if (in[i] < -1 || in[i] >= g->n_values) {
            om_grad_fail(c, om_error(OM_INTERNAL, "gradient of node '%s' emitted %s with an invalid input",
                                     g->nodes[c->node].name, op_type));
            return -1;
        }
    char name[256];
    snprintf(name, sizeof name, "%s_grad/%s_%d", g->nodes[c->node].name, op_type, g->n_nodes);
    int ids[16];
    if (n_out > 16) n_out = 16;
    for (int j = 0; j < n_out; j++) {
        ids[j] = om_graph_add_value(g, NULL, OM_UNDEFINED);
        if (ids[j] < 0) {
            om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"));
            return -1;
        }
    }
    int id;
    om_status *st = om_graph_add_op(g, op_id, name, in, n_in, ids, n_out, &id);
    if (st) {
        om_grad_fail(c, om_error_context(st, "gradient of node '%s'", g->nodes[c->node].name));
        return -1;
    }
    om_node *n = &g->nodes[id];
    n->backward = 1;
    for (int j = 0; j < n_out; j++) {
        om_dtype dt = n->op->dtype ? n->op->dtype(g, n, j) : (n_in && in[0] >= 0 ? g->values[in[0]].dtype : OM_UNDEFINED);
        g->values[ids[j]].dtype = dt;
        if (out) out[j] = ids[j];
    }
    s->last = id;
    if (node_id) *node_id = id;
    return ids[0];
}

int om_emit_partial(om_grad_ctx *c, om_op_id op, const int *in, int n_in, int *out, int n_out, const int *want) {
    int id = -1;
    if (om_emit_node(c, op, in, n_in, out, n_out, &id) < 0) return -1;
    om_node *n = &c->g->nodes[id];
    for (int j = 0; j < n_out; j++)
        if (!want[j]) {
            c->g->values[n->out[j]].producer = -1;
            n->out[j] = -1;
            out[j] = -1;
        }
    return id;
}

int om_emit(om_grad_ctx *c, om_op_id op, const int *in, int n_in) {
    return om_emit_node(c, op, in, n_in, NULL, 1, NULL);
}

int om_emit1(om_grad_ctx *c, om_op_id op, int a) { return om_emit(c, op, &a, 1); }

int om_emit2(om_grad_ctx *c, om_op_id op, int a, int b) {
    int in[2] = {a, b};
    return om_emit(c, op, in, 2);
}

int om_emit_last(const om_grad_ctx *c) { return ((const om_grad_state *)c)->last; }

/* Attributes can change an output's dtype (Cast's "to"): the rule runs again after each. */
static void retype_last(om_grad_ctx *c) {
    om_grad_state *s = (om_grad_state *)c;
    if (s->status || s->last < 0) return;
    om_node *n = &c->g->nodes[s->last];
    if (!n->op->dtype) return;
    for (int j = 0; j < n->n_out; j++)
        if (n->out[j] >= 0) {
            om_dtype dt = n->op->dtype(c->g, n, j);
            if (dt != OM_UNDEFINED) c->g->values[n->out[j]].dtype = dt;
        }
}

void om_emit_attr_int(om_grad_ctx *c, const char *name, int64_t v) {
    om_grad_state *s = (om_grad_state *)c;
    if (!s->status && s->last >= 0) om_grad_fail(c, om_node_set_int(c->g, s->last, name, v));
    retype_last(c);
}

void om_emit_attr_string(om_grad_ctx *c, const char *name, const char *v) {
    om_grad_state *s = (om_grad_state *)c;
    if (!s->status && s->last >= 0) om_grad_fail(c, om_node_set_string(c->g, s->last, name, v));
    retype_last(c);
}

void om_emit_attr_ints(om_grad_ctx *c, const char *name, const int64_t *v, int n) {
    om_grad_state *s = (om_grad_state *)c;
    if (!s->status && s->last >= 0) om_grad_fail(c, om_node_set_ints(c->g, s->last, name, v, n));
    retype_last(c);
}

void om_emit_attr_float(om_grad_ctx *c, const char *name, float v) {
    om_grad_state *s = (om_grad_state *)c;
    if (!s->status && s->last >= 0) om_grad_fail(c, om_node_set_float(c->g, s->last, name, v));
    retype_last(c);
}

int om_emit_shape(om_grad_ctx *c, int x) { return om_emit1(c, om_op_shape_id, x); }

int om_emit_sum_to(om_grad_ctx *c, int dy, int x) {
    int shape = om_emit_shape(c, x);
    if (shape < 0) return -1;
    int r = om_emit2(c, om_op_sum_to_shape_id, dy, shape);
    return r;
}

int om_emit_scalar(om_grad_ctx *c, om_dtype dt, double v) {
    om_grad_state *s = (om_grad_state *)c;
    if (s->status) return -1;
    int id = om_graph_add_value(c->g, NULL, dt);
    om_tensor *t = id >= 0 ? calloc(1, sizeof *t) : NULL;
    if (t) t->data = om_alloc(8);
    if (!t || !t->data) {
        free(t);
        om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"));
        return -1;
    }
    t->dtype = dt;
    t->rank = 0;
    /* in the value's own dtype (fp16/bf16 rounded to nearest even), so that the node it
     * feeds sees operands of one dtype */
    if (om_scalar_set(dt, t->data, v)) {
        om_free(t->data);
        free(t);
        om_grad_fail(c, om_error(OM_INTERNAL, "om_emit_scalar: unsupported dtype %s", om_dtype_name(dt)));
        return -1;
    }
    c->g->values[id].constant = t;
    return id;
}
