/* fuse_matmul_add_bias.c — MatMul(x, W) + b -> MatMulBias(x, W, b) (pass "matmul_add_bias").
 *
 * W must be provably 2-D (a parameter or constant; a Transpose(perm 1,0) of one is folded
 * as transB, so nn.Linear on 3-D inputs — Transpose(W) -> MatMul -> Add — is one GEMM
 * with no materialized transpose) and b a rank-1 parameter or constant: then x of any
 * rank >= 1 gives exactly MatMul's output shape. The bias is written into the output and
 * the GEMM accumulates onto it; the gradient is one MatMulBiasGrad node (two GEMMs with the
 * transposes folded into BLAS flags, and the column sums of dY).
 *
 * Gemm(A, B, C) with alpha = beta = 1, no transA and a rank-1 C is the same product:
 * MatMulBias(A, B, C; transB). HF's Conv1D (GPT-2's every linear layer) exports as such a Gemm
 * between two Reshapes; as MatMulBias it takes part in the GELU fusions (matmul_bias_gelu,
 * matmul_grad_gelu) and its gradient is one MatMulBiasGrad instead of three Gemms and a sum. */
#include "passes/fuse_match.h"

om_status *om_pass_matmul_add_bias(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in matmul_add_bias");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *add = &g->nodes[k];
        if (add->dead || add->n_out < 1 || add->out[0] < 0) continue;
        if (fm_is(add, om_op_gemm_id) && add->n_in == 3 && add->in[0] >= 0 && add->in[1] >= 0 && fm_is_vector(g, add->in[2]) &&
            om_attr_float(add, "alpha", 1.0f) == 1.0f && om_attr_float(add, "beta", 1.0f) == 1.0f &&
            om_attr_int(add, "transA", 0) == 0 && fm_dtype(g, add->in[0]) == fm_dtype(g, add->in[2]) &&
            fm_dtype(g, add->in[1]) == fm_dtype(g, add->in[2])) {
            const int tb = om_attr_int(add, "transB", 0) != 0;
            int in[3] = {add->in[0], add->in[1], add->in[2]}, out[1] = {add->out[0]};
            if ((st = fm_rewrite(c, k, om_op_matmul_bias_id, in, 3, out, 1))) break;   /* clears attrs */
            if (tb) st = om_node_set_int(g, k, "transB", 1);
            continue;
        }
        if (!fm_is(add, om_op_add_id) || add->n_in != 2) continue;
        for (int side = 0; side < 2; side++) {
            om_node *mm = fm_single(g, uses, add->in[side], om_op_matmul_id);
            int b = add->in[1 - side];
            if (!mm || !fm_is_vector(g, b)) continue;
            int x = mm->in[0], tb = 0, w = fm_matrix_weight(g, mm->in[1], &tb);
            if (w < 0 || x < 0) continue;
            if (fm_dtype(g, x) != fm_dtype(g, b) || fm_dtype(g, w) != fm_dtype(g, b)) continue;
            int in[3] = {x, w, b}, out[1] = {add->out[0]};
            mm->dead = 1;
            if ((st = fm_rewrite(c, k, om_op_matmul_bias_id, in, 3, out, 1))) break;
            if (tb) st = om_node_set_int(g, k, "transB", 1);
            break;
        }
    }
    free(uses);
    return st;
}
