/* fuse_transpose_matmul.c — MatMul(Transpose(A), Transpose(B)) where a Transpose swaps the
 * last two axes → FusedMatMul with transA/transB: the GEMM reads the operand transposed
 * instead of a materialized copy. nn.Linear without a fused bias exports exactly this
 * (Transpose(W) → MatMul); the copy would otherwise also be stashed for backward.
 * The Transpose stays when something else reads it (DCE drops it otherwise). */
#include "passes/fuse_match.h"

/* 1 when n is a Transpose that swaps the last two axes of a value of known rank. */
static int swaps_last_two(const om_graph *g, const om_node *t) {
    if (!fm_is(t, om_op_transpose_id) || t->in[0] < 0) return 0;
    const int64_t *perm;
    int np = om_attr_ints(t, "perm", &perm);
    if (np < 0) return fm_rank(g, t->in[0]) == 2;   /* default perm reverses the axes: a swap only for rank 2 */
    if (np < 2) return 0;
    for (int i = 0; i < np - 2; i++)
        if (perm[i] != i) return 0;
    return perm[np - 2] == np - 1 && perm[np - 1] == np - 2;
}

om_status *om_pass_transpose_matmul(om_pass_ctx *c) {
    om_graph *g = c->g;
    for (int k = 0; k < g->n_nodes; k++) {
        om_node *n = &g->nodes[k];
        if (!fm_is(n, om_op_matmul_id) || n->n_in != 2 || n->in[0] < 0 || n->in[1] < 0) continue;
        om_node *ta = fm_producer(g, n->in[0]), *tb = fm_producer(g, n->in[1]);
        int fa = swaps_last_two(g, ta), fb = swaps_last_two(g, tb);
        if (!fa && !fb) continue;
        int in[2] = {fa ? ta->in[0] : n->in[0], fb ? tb->in[0] : n->in[1]};
        int out[1] = {n->out[0]};
        OM_TRY(om_graph_replace_node(g, k, om_op_fused_matmul_id, in, 2, out, 1));
        OM_TRY(om_node_set_int(g, k, "transA", fa));
        OM_TRY(om_node_set_int(g, k, "transB", fb));
        OM_TRY(om_node_set_float(g, k, "alpha", 1.0f));
        om_pass_fired(c, g->nodes[k].name);
    }
    return NULL;
}
