/* fuse_bias_dropout_residual.c — Dropout(x + b) + residual -> BiasDropout(x, b, residual)
 * (pass "bias_dropout_residual"), ORT's BiasDropout.
 *
 * Either the bias (a rank-1 parameter or constant) or the residual may be missing, not
 * both: GPT-2's c_proj -> Dropout -> Add(residual) fuses without a bias. The mask is
 * produced (and saved for backward) as Dropout produces it, from om_rand_uniform(seed, i)
 * over the same flat index i. A Dropout whose mask output is read by the model is left
 * alone. The residual must have x's shape (checked at plan time). */
#include "passes/fuse_match.h"

om_status *om_pass_bias_dropout_residual(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in bias_dropout_residual");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *dr = &g->nodes[k];
        if (!fm_is(dr, om_op_dropout_id)) continue;
        if (dr->n_out > 1 && dr->out[1] >= 0 && uses[dr->out[1]] > 0) continue;
        int x = dr->in[0], b = -1, r = -1;
        if (x < 0 || dr->out[0] < 0) continue;
        om_node *add = fm_single(g, uses, x, om_op_add_id);
        if (add && add->n_in == 2) {
            int side = fm_is_vector(g, add->in[1]) ? 1 : fm_is_vector(g, add->in[0]) ? 0 : -1;
            if (side >= 0 && add->in[1 - side] >= 0 && fm_dtype(g, add->in[side]) == fm_dtype(g, x)) {
                b = add->in[side];
                x = add->in[1 - side];
            } else {
                add = NULL;
            }
        } else {
            add = NULL;
        }
        om_node *radd = fm_sole_consumer(g, uses, dr->out[0]);
        if (!fm_is(radd, om_op_add_id) || radd->n_in != 2 || radd->out[0] < 0) radd = NULL;
        if (radd) {
            r = fm_other(radd, dr->out[0]);
            /* a vector residual would broadcast: not this pattern */
            if (r < 0 || r == dr->out[0] || fm_rank(g, r) == 1 || fm_rank(g, r) == 0) radd = NULL, r = -1;
        }
        if (b < 0 && r < 0) continue;
        int ratio = dr->n_in > 1 ? dr->in[1] : -1, tm = dr->n_in > 2 ? dr->in[2] : -1;
        int in[5] = {x, b, r, ratio, tm};
        int n_in = tm >= 0 ? 5 : ratio >= 0 ? 4 : 3;
        om_node *last = radd ? radd : dr;
        int out[1] = {last->out[0]};
        if (add) add->dead = 1;
        if (radd) dr->dead = 1;
        if ((st = fm_rewrite(c, fm_index(g, last), om_op_bias_dropout_id, in, n_in, out, 1))) break;
    }
    free(uses);
    return st;
}
