/* fuse_swiglu.c — silu(gate) * up -> SwiGLU(gate, up) (pass "swiglu").
 *
 * torch.onnx writes F.silu(g) as Mul(g, Sigmoid(g)); Llama's MLP (the benchmark's, transformers'
 * Llama, Mistral, Qwen2) multiplies it by the up projection:
 *
 *     Mul(Mul(g, Sigmoid(g)), u)      operands of either Mul in either order
 *
 * The Sigmoid and the inner Mul must be read by the pattern alone (g and u are not touched).
 * Gate and up may broadcast against each other as the Mul does; the fused op's gradient sums
 * back to each shape. Forward: one pass instead of three; backward: one SwiGLUGrad giving both
 * gradients (sigmoid recomputed from g) instead of five elementwise nodes and their sums, and only
 * g and u are kept for it. */
#include "passes/fuse_match.h"

/* If v = Mul(g, Sigmoid(g)) (single-use links), returns g and adds both nodes to dead[]. */
static int silu_input(om_graph *g, const int *uses, int v, om_node **dead, int *nd) {
    om_node *mul = fm_single(g, uses, v, om_op_mul_id);
    if (!mul || mul->n_in != 2) return -1;
    for (int side = 0; side < 2; side++) {
        int x = mul->in[side];
        om_node *sig = fm_single(g, uses, mul->in[1 - side], om_op_sigmoid_id);
        if (x < 0 || !sig || sig->n_in != 1 || sig->in[0] != x) continue;
        dead[(*nd)++] = mul;
        dead[(*nd)++] = sig;
        return x;
    }
    return -1;
}

om_status *om_pass_swiglu(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in swiglu");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *top = &g->nodes[k];
        if (!fm_is(top, om_op_mul_id) || top->n_in != 2 || top->out[0] < 0) continue;
        om_node *dead[2];
        for (int side = 0; side < 2; side++) {
            int nd = 0, up = top->in[1 - side];
            int gate = silu_input(g, uses, top->in[side], dead, &nd);
            if (gate < 0 || up < 0) continue;
            om_dtype dt = fm_dtype(g, gate);
            if (!om_dtype_is_float(dt) || fm_dtype(g, up) != dt) continue;
            for (int i = 0; i < nd; i++) dead[i]->dead = 1;
            int in[2] = {gate, up}, out[1] = {top->out[0]};
            st = fm_rewrite(c, k, om_op_swiglu_id, in, 2, out, 1);
            break;
        }
    }
    free(uses);
    return st;
}
