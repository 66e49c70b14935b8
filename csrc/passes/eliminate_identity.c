/* eliminate_identity.c — removes nodes that return their input unchanged: Identity, Cast to
 * the dtype the value already has, Concat of a single input, and Dropout that cannot drop
 * (ratio 0, or training_mode false) whose mask nobody reads. Exports emit all of these
 * (GPT-2 from transformers carries eight same-dtype Casts). A node whose output is a graph
 * output stays, so that outputs keep their names. */
#include "passes/fuse_match.h"

/* 1 when constant value v is a scalar equal to x (fm_const_scalar reads any float/int/bool) */
static int const_scalar_is(const om_graph *g, int v, double x) {
    double got;
    return fm_const_scalar(g, v, &got) && got == x;
}

static int passthrough(const om_graph *g, const om_node *n) {
    const om_op_id op = n->op_id;
    if (op == om_op_identity_id) return 1;
    if (op == om_op_cast_id)
        return n->in[0] >= 0 && om_attr_int(n, "to", 0) == (int64_t)g->values[n->in[0]].dtype;
    if (op == om_op_concat_id) return n->n_in == 1;
    if (op == om_op_dropout_id) {
        int ratio = n->n_in > 1 ? n->in[1] : -1, mode = n->n_in > 2 ? n->in[2] : -1;
        int no_training = mode < 0 || const_scalar_is(g, mode, 0);
        int zero_ratio = ratio >= 0 && const_scalar_is(g, ratio, 0);
        return no_training || zero_ratio;
    }
    return 0;
}

om_status *om_pass_eliminate_identity(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in eliminate_identity");
    char *is_output = calloc((size_t)g->n_values + 1, 1);
    if (!is_output) { free(uses); return om_error(OM_OUT_OF_MEMORY, "out of memory in eliminate_identity"); }
    for (int i = 0; i < g->n_outputs; i++) is_output[g->outputs[i]] = 1;
    for (int k = 0; k < g->n_nodes; k++) {
        om_node *n = &g->nodes[k];
        if (n->dead || n->n_in < 1 || n->in[0] < 0 || n->out[0] < 0 || is_output[n->out[0]]) continue;
        if (n->op_id == om_op_dropout_id && n->n_out > 1 && n->out[1] >= 0 && uses[n->out[1]] > 0) continue;
        if (!passthrough(g, n)) continue;
        om_graph_replace_uses(g, n->out[0], n->in[0]);
        n->dead = 1;
        om_pass_fired(c, n->name);
    }
    free(uses);
    free(is_output);
    return NULL;
}
