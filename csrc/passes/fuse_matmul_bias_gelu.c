/* fuse_matmul_bias_gelu.c — one GEMM with the bias and the GELU in its epilogue (pass
 * "matmul_bias_gelu"):
 *
 *   BiasGelu(MatMul(x, W), b)  -> MatMulBiasGelu(x, W, b)   (what bias_gelu leaves of MatMul + Add + Gelu)
 *   Gelu(MatMulBias(x, W, b))  -> MatMulBiasGelu(x, W, b)   (what matmul_add_bias leaves when bias_gelu is off)
 *   Gelu(Reshape(..Reshape(MatMulBias(x, W, b))))  -> Reshape(..Reshape(MatMulBiasGelu(x, W, b)))
 *       (HF's Conv1D, GPT-2's: a 2-D Gemm between views; the GELU is elementwise, so it runs on
 *       the GEMM's output before the views, and the Gelu's readers read the last view)
 *
 * Runs after bias_gelu and matmul_add_bias. W must be provably 2-D (or a Transpose(1,0) of a
 * 2-D one, folded as transB) as for MatMulBias; the product must be read by the GELU alone.
 * On CUDA the whole node is one cuBLASLt call (CUBLASLT_EPILOGUE_GELU_AUX_BIAS, tanh GELU);
 * on CPU it saves the separate elementwise node's pass over memory when no gradient is taken
 * and otherwise costs the same. The backward is GeluGrad(dy, z) + MatMulBiasGrad. */
#include "passes/fuse_match.h"

/* The live ortmod-domain producer of v if v is read once. */
static om_node *single_ortmod(om_graph *g, const int *uses, int v, om_op_id op) {
    om_node *n = fm_producer(g, v);
    return fm_is(n, op) && uses[v] == 1 ? n : NULL;
}

/* Inputs of the fused node for GELU node k, or 0 when the pattern does not apply. */
static int match(om_graph *g, const int *uses, om_node *ge, int in[3], int *tb) {
    if (fm_is(ge, om_op_bias_gelu_id)) {
        om_node *mm = fm_single(g, uses, ge->in[0], om_op_matmul_id);
        if (!mm) return 0;
        int w = fm_matrix_weight(g, mm->in[1], tb), x = mm->in[0], b = ge->in[1];
        if (w < 0 || x < 0 || !fm_is_vector(g, b)) return 0;
        if (fm_dtype(g, x) != fm_dtype(g, b) || fm_dtype(g, w) != fm_dtype(g, b)) return 0;
        in[0] = x, in[1] = w, in[2] = b;
        mm->dead = 1;
        return 1;
    }
    if (fm_is(ge, om_op_gelu_id)) {
        om_node *mb = single_ortmod(g, uses, ge->in[0], om_op_matmul_bias_id);
        if (!mb || mb->n_in < 3) return 0;
        *tb = om_attr_int(mb, "transB", 0) != 0;
        in[0] = mb->in[0], in[1] = mb->in[1], in[2] = mb->in[2];
        mb->dead = 1;
        return 1;
    }
    return 0;
}

/* Gelu(Reshape*(MatMulBias)), every link read once: the MatMulBias becomes the MatMulBiasGelu (its
 * output value now holds the GELU's result, which the views pass on unchanged), the Gelu's
 * readers read the last view. Returns 1 when it rewrote. */
static int through_views(om_pass_ctx *c, const int *uses, om_node *ge, om_status **st) {
    om_graph *g = c->g;
    if (!fm_is(ge, om_op_gelu_id)) return 0;
    int v = ge->in[0], views = 0;
    for (om_node *r; (r = fm_single(g, uses, v, om_op_reshape_id)) != NULL; views++) v = r->in[0];
    om_node *mb = views ? single_ortmod(g, uses, v, om_op_matmul_bias_id) : NULL;
    if (!mb || mb->n_in < 3 || ge->out[0] < 0) return 0;
    char approx[16];
    snprintf(approx, sizeof approx, "%s", om_attr_string(ge, "approximate", "none"));
    const int mi = fm_index(g, mb), tb = om_attr_int(mb, "transB", 0) != 0;
    int in[3] = {mb->in[0], mb->in[1], mb->in[2]}, out[1] = {mb->out[0]};
    const int y = ge->out[0], last = ge->in[0];
    if ((*st = fm_rewrite(c, mi, om_op_matmul_bias_gelu_id, in, 3, out, 1))) return 1;   /* clears attrs */
    if (tb && (*st = om_node_set_int(g, mi, "transB", 1))) return 1;
    if (strcmp(approx, "none") != 0 && (*st = om_node_set_string(g, mi, "approximate", approx))) return 1;
    ge->dead = 1;
    om_graph_replace_uses(g, y, last);
    return 1;
}

om_status *om_pass_matmul_bias_gelu(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in matmul_bias_gelu");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *ge = &g->nodes[k];
        if (through_views(c, uses, ge, &st)) continue;
        char approx[16];
        /* read before match() marks nodes dead: the rewrite clears the GELU node's attributes */
        snprintf(approx, sizeof approx, "%s", ge->dead ? "" : om_attr_string(ge, "approximate", "none"));
        if (ge->dead || ge->n_out < 1 || ge->out[0] < 0) continue;
        int in[3], tb = 0, out[1] = {ge->out[0]};
        if (!match(g, uses, ge, in, &tb)) continue;
        if ((st = fm_rewrite(c, k, om_op_matmul_bias_gelu_id, in, 3, out, 1))) break;
        if (tb) st = om_node_set_int(g, k, "transB", 1);
        if (!st && strcmp(approx, "none") != 0) st = om_node_set_string(g, k, "approximate", approx);
    }
    free(uses);
    return st;
}
