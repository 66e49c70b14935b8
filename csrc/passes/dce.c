/* dce.c — dead code elimination: a node none of whose outputs is read (by a live node or
 * as a graph output) goes. In the joint graph the gradients are outputs too. */
#include "passes/pass.h"

#include <stdlib.h>

om_status *om_pass_dce(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in dce");
    if (c->stage == OM_PASS_JOINT && g->grad_of_input)
        for (int i = 0; i < g->n_inputs; i++)
            if (g->grad_of_input[i] >= 0) uses[g->grad_of_input[i]]++;
    for (int k = g->n_nodes - 1; k >= 0; k--) {
        om_node *n = &g->nodes[k];
        if (n->dead) continue;
        int used = 0;
        for (int j = 0; j < n->n_out && !used; j++) used = n->out[j] >= 0 && uses[n->out[j]] > 0;
        if (used) continue;
        n->dead = 1;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0) uses[n->in[i]]--;
        om_pass_fired(c, n->name);
    }
    free(uses);
    return NULL;
}
