/* fuse_bias_gelu.c — Gelu(x + b) -> BiasGelu(x, b) (pass "bias_gelu"), either approximation.
 *
 * b must be a rank-1 parameter or constant. Runs before matmul_add_bias, so that
 * MatMul + Add + Gelu becomes MatMul + BiasGelu (ORT's split): the bias is added inside the
 * elementwise GELU pass instead of in the GEMM, the backward is one BiasGeluGrad producing
 * dx and the bias gradient together, and the GEMM's gradient stays two plain products.
 * The other order (MatMulBias + Gelu) has the same node count but a separate GeluGrad and
 * a GEMM-side column sum: no gain. */
#include "passes/fuse_match.h"

om_status *om_pass_bias_gelu(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in bias_gelu");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *ge = &g->nodes[k];
        if (!fm_is(ge, om_op_gelu_id) || ge->out[0] < 0) continue;
        om_node *add = fm_single(g, uses, ge->in[0], om_op_add_id);
        if (!add || add->n_in != 2) continue;
        int side = fm_is_vector(g, add->in[1]) ? 1 : fm_is_vector(g, add->in[0]) ? 0 : -1;
        if (side < 0) continue;
        int x = add->in[1 - side], b = add->in[side];
        if (x < 0 || fm_dtype(g, x) != fm_dtype(g, b)) continue;
        char approx[16];
        snprintf(approx, sizeof approx, "%s", om_attr_string(ge, "approximate", "none"));
        int in[2] = {x, b}, out[1] = {ge->out[0]};
        add->dead = 1;
        if ((st = fm_rewrite(c, k, om_op_bias_gelu_id, in, 2, out, 1))) break;
        if (strcmp(approx, "none") != 0) st = om_node_set_string(g, k, "approximate", approx);
    }
    free(uses);
    return st;
}
