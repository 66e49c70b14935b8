/* fuse_softmax_cross_entropy.c — LogSoftmax(x) -> NegativeLogLikelihoodLoss -> one
 * SoftmaxCrossEntropyLoss, whose kernel never materializes the probabilities (pass
 * "softmax_cross_entropy").
 *
 * The class axis of NLL is 1, so LogSoftmax must normalize axis 1: axis=1, or axis=-1 when
 * x is provably 2-D. When the log-probabilities are read elsewhere too, the fused op
 * produces them as its optional second output and the LogSoftmax still goes. */
#include "passes/fuse_match.h"

om_status *om_pass_softmax_cross_entropy(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in softmax_cross_entropy");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *nll = &g->nodes[k];
        if (!fm_is(nll, om_op_nll_loss_id) || nll->n_in < 2 || nll->in[1] < 0 || nll->out[0] < 0) continue;
        int lp = nll->in[0];
        om_node *ls = fm_producer(g, lp);
        if (!fm_is(ls, om_op_log_softmax_id)) continue;
        int x = ls->in[0];
        if (x < 0) continue;
        int64_t axis = om_attr_int(ls, "axis", g->opset >= 13 ? -1 : 1);
        if (!(axis == 1 || (axis == -1 && fm_rank(g, x) == 2))) continue;
        const char *red = om_attr_string(nll, "reduction", "mean");
        char reduction[16];
        snprintf(reduction, sizeof reduction, "%s", red);
        const om_attr *ii = om_attr_find(nll, "ignore_index");
        int has_ignore = ii != NULL;
        int64_t ignore = has_ignore ? ii->i : 0;
        int in[3] = {x, nll->in[1], nll->n_in > 2 ? nll->in[2] : -1};
        int out[2] = {nll->out[0], uses[lp] > 1 ? lp : -1};
        ls->dead = 1;
        if ((st = fm_rewrite(c, k, om_op_softmax_cross_entropy_loss_id, in, in[2] >= 0 ? 3 : 2, out, out[1] >= 0 ? 2 : 1)))
            break;
        st = om_node_set_string(g, k, "reduction", reduction);
        if (!st && has_ignore) st = om_node_set_int(g, k, "ignore_index", ignore);
    }
    free(uses);
    return st;
}
