/* fuse_matmul_grad_gelu.c — the GELU's gradient rides on the GEMM that produces its input
 * (pass "matmul_grad_gelu", on the joint graph after autodiff):
 *
 *   GeluGrad(MatMulBiasGrad(dy, h, W, ...).dx, z)  ->  MatMulBiasGrad(dy, h, W, ..., gelu_x = z).dx
 *   GeluGrad(Reshape(..Reshape(MatMulBiasGrad.dx)), z)  ->  Reshape(..Reshape(MatMulBiasGrad.dx with gelu_x = z))
 *       (the views between HF Conv1D's GEMMs: GeluGrad is elementwise and z has dx's element
 *       count, so it applies to dx in memory order and the views pass the result on)
 *
 * where h = gelu(z) fed the forward MatMulBias (GPT-2's MLP: MatMulBiasGelu, then the down
 * projection). dh = dy W^T is read by the GeluGrad alone, so it never needs to exist: on CUDA the
 * dx GEMM applies gelu'(z) in its epilogue (cuBLASLt's DGELU, tanh form) and writes dz once; on
 * the CPU one pass over dx follows the GEMM instead of GeluGrad's separate read of dh and z and
 * write of dz. The GeluGrad's readers read the MatMulBiasGrad's dx value instead. */
#include "passes/fuse_match.h"

om_status *om_pass_matmul_grad_gelu(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in matmul_grad_gelu");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *gg = &g->nodes[k];
        if (!fm_is(gg, om_op_gelu_grad_id) || gg->n_in < 2 || gg->out[0] < 0 || gg->in[0] < 0 || gg->in[1] < 0) continue;
        const int z = gg->in[1], last = gg->in[0];
        int dh = last;
        for (om_node *r; (r = fm_single(g, uses, dh, om_op_reshape_id)) != NULL;) dh = r->in[0];
        om_node *mg = fm_producer(g, dh);
        if (!fm_is(mg, om_op_matmul_bias_grad_id) || dh < 0 || mg->out[0] != dh || uses[dh] != 1) continue;
        if (mg->n_in > 6 && mg->in[6] >= 0) continue;   /* carries a GELU already */
        if (fm_dtype(g, z) != fm_dtype(g, dh)) continue;
        int is_input_grad = 0;   /* (a gradient the caller reads: never, for a product's dx) */
        for (int i = 0; g->grad_of_input && i < g->n_inputs; i++) is_input_grad |= g->grad_of_input[i] == dh;
        if (is_input_grad) continue;
        const int mi = fm_index(g, mg);
        int in[7], out[3] = {-1, -1, -1};
        for (int i = 0; i < 6; i++) in[i] = i < mg->n_in ? mg->in[i] : -1;
        in[6] = z;
        for (int j = 0; j < mg->n_out && j < 3; j++) out[j] = mg->out[j];
        const int tb = om_attr_int(mg, "transB", 0) != 0;
        char approx[16];
        snprintf(approx, sizeof approx, "%s", om_attr_string(gg, "approximate", "none"));
        const int dz = gg->out[0];
        if ((st = om_graph_replace_node(g, mi, om_op_matmul_bias_grad_id, in, 7, out, 3))) break;   /* clears attrs */
        if (tb && (st = om_node_set_int(g, mi, "transB", 1))) break;
        if (strcmp(approx, "none") != 0 && (st = om_node_set_string(g, mi, "approximate", approx))) break;
        gg->dead = 1;
        om_graph_replace_uses(g, dz, last);   /* dh now holds dL/dz, and so does the last view of it */
        uses[z]++;
        om_pass_fired(c, g->nodes[mi].name ? g->nodes[mi].name : "?");
    }
    free(uses);
    return st;
}
