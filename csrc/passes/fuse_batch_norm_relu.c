/* fuse_batch_norm_relu.c — Relu(BatchNormalization(x, ...)) -> BatchNormRelu(x, ...) (pass
 * "batch_norm_relu"), in training mode (the running-stat outputs kept) or inference mode.
 *
 * The BatchNormalization's Y must be read by the Relu alone (not by another node, not a graph
 * output). The fused node takes the BatchNormalization's index, name, inputs, attributes and
 * outputs 1.. (running mean and var, where the export has them), and the Relu's output as its
 * Y: readers of the running statistics may sit between the two nodes, and every reader of the
 * Relu's output comes after both. Its kernel stores Relu(y) in the same pass that computes y,
 * and its gradient, BatchNormReluGrad, applies ReluGrad's mask while the BatchNorm backward
 * reads dY: one pass over the activations less forward and one backward (ResNet's conv ->
 * BN -> ReLU), the same numbers bit for bit (ops/norm.c). */
#include "passes/fuse_match.h"

om_status *om_pass_batch_norm_relu(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in batch_norm_relu");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *relu = &g->nodes[k];
        if (!fm_is(relu, om_op_relu_id) || relu->n_in != 1 || relu->out[0] < 0) continue;
        om_node *bn = fm_single(g, uses, relu->in[0], om_op_batch_norm_id);
        if (!bn || bn->n_in != 5 || bn->n_out < 1 || bn->out[0] != relu->in[0]) continue;
        int ok = 1;
        for (int i = 0; i < 5; i++) ok &= bn->in[i] >= 0;
        if (!ok || fm_dtype(g, bn->in[0]) != fm_dtype(g, relu->out[0])) continue;
        /* the attributes as written (floats as float32, absent ones stay absent) */
        const om_attr *eps = om_attr_find(bn, "epsilon"), *mom = om_attr_find(bn, "momentum"),
                      *tm = om_attr_find(bn, "training_mode");
        const int has_eps = eps && eps->type == OM_ATTR_FLOAT, has_mom = mom && mom->type == OM_ATTR_FLOAT,
                  has_tm = tm && tm->type == OM_ATTR_INT;
        const float eps_v = has_eps ? eps->f : 0, mom_v = has_mom ? mom->f : 0;
        const int64_t tm_v = has_tm ? tm->i : 0;
        if ((eps && !has_eps) || (mom && !has_mom) || (tm && !has_tm)) continue;   /* refused later, by name */
        int in[5], out[5];
        for (int i = 0; i < 5; i++) in[i] = bn->in[i];
        const int n_out = bn->n_out < 5 ? bn->n_out : 5;
        for (int j = 0; j < n_out; j++) out[j] = bn->out[j];
        out[0] = relu->out[0];
        const int at = fm_index(g, bn);
        relu->dead = 1;
        /* the value Y was is read by nothing now (its reader is dead), and produced by nothing */
        g->values[bn->out[0]].producer = -1;
        if ((st = fm_rewrite(c, at, om_op_batch_norm_relu_id, in, 5, out, n_out))) break;
        if (has_eps) st = om_node_set_float(g, at, "epsilon", eps_v);
        if (!st && has_mom) st = om_node_set_float(g, at, "momentum", mom_v);
        if (!st && has_tm) st = om_node_set_int(g, at, "training_mode", tm_v);
    }
    free(uses);
    return st;
}
