/* autodiff.c — reverse-mode differentiation, graph to graph.
 *
 * Walks the forward nodes in reverse. By then every consumer of a node's outputs has been
 * visited, so the gradient contributions to each output are complete: they are summed
 * (Add nodes) into one dy and handed to the op's gradient rule, which emits backward
 * nodes and reports one dx per input. Only values on a path from a grad input to an
 * output get gradients.
 */
#include "autodiff/emit_ctx.h"

#include <stdio.h>
#include <stdlib.h>

/* Input i of op can carry a gradient. diff_inputs' bits name inputs 0..31; ~0u (variadic ops:
 * Concat, PythonOp) means every input, however many, so input 40 of a 40-way Concat gets its
 * gradient instead of none. */
static int input_differentiable(const om_op_def *op, int i) {
    if (op->diff_inputs == ~0u) return 1;
    return i < 32 && (op->diff_inputs >> i & 1u);
}

typedef struct contrib {   /* gradient contributions to one value, summed lazily */
    int *ids;
    int n, cap;
} contrib;

static om_status *add_contrib(contrib *c, int v) {
    if (om_grow((void **)&c->ids, &c->cap, c->n, sizeof(int))) return om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff");
    c->ids[c->n++] = v;
    return NULL;
}

/* Sums the contributions with a balanced tree of Add nodes; -1 when there are none. */
static int sum_contribs(om_grad_state *s, contrib *c) {
    if (c->n == 0) return -1;
    while (c->n > 1) {
        int m = 0;
        for (int i = 0; i + 1 < c->n; i += 2) c->ids[m++] = om_emit2(&s->ctx, om_op_add_id, c->ids[i], c->ids[i + 1]);
        if (c->n % 2) c->ids[m++] = c->ids[c->n - 1];
        c->n = m;
        if (s->status) return -1;
    }
    return c->ids[0];
}

om_status *om_autodiff(om_graph *g, const bool *grad_inputs) {
    om_status *st = NULL;
    int n_fwd = g->n_nodes;
    g->n_fwd_nodes = n_fwd;
    free(g->grad_of_output);
    free(g->grad_of_input);
    g->grad_of_output = malloc(sizeof(int) * (size_t)(g->n_outputs + 1));
    g->grad_of_input = malloc(sizeof(int) * (size_t)(g->n_inputs + 1));
    if (!g->grad_of_output || !g->grad_of_input) return om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff");
    for (int i = 0; i < g->n_outputs; i++) g->grad_of_output[i] = -1;
    for (int i = 0; i < g->n_inputs; i++) g->grad_of_input[i] = -1;

    int nv0 = g->n_values;
    char *requires = calloc((size_t)nv0 + 1, 1);   /* depends on a grad input through differentiable edges */
    contrib *contribs = calloc((size_t)nv0 + 1, sizeof(contrib));
    if (!requires || !contribs) { st = om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"); goto done; }

    int any = 0;
    for (int i = 0; grad_inputs && i < g->n_inputs; i++) {
        int v = g->inputs[i];
        if (!grad_inputs[i]) continue;
        if (!om_dtype_is_float(g->values[v].dtype)) {
            st = om_error(OM_INVALID_ARGUMENT, "input '%s' has dtype %s and cannot require a gradient",
                          g->values[v].name, om_dtype_name(g->values[v].dtype));
            goto done;
        }
        requires[v] = 1;
        any = 1;
    }
    if (!any) goto done;
    for (int k = 0; k < n_fwd; k++) {
        const om_node *n = &g->nodes[k];
        int flows = 0;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0 && requires[n->in[i]] && input_differentiable(n->op, i)) flows = 1;
        if (!flows) continue;
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0 && om_dtype_is_float(g->values[n->out[j]].dtype)) requires[n->out[j]] = 1;
    }

    /* Seeds: one backward-graph input per differentiable output. */
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        if (!requires[v]) continue;
        char name[300];
        snprintf(name, sizeof name, "%s_grad", g->values[v].name);
        int gv = om_graph_add_value(g, name, g->values[v].dtype);
        if (gv < 0) { st = om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"); goto done; }
        g->grad_of_output[i] = gv;
        g->values[gv].rank_hint = g->values[v].rank_hint;
        if ((st = add_contrib(&contribs[v], gv))) goto done;
    }

    om_grad_state s = {.status = NULL, .last = -1};
    s.ctx.g = g;
    for (int k = n_fwd - 1; k >= 0; k--) {
        const om_node *n = &g->nodes[k];
        int n_in = n->n_in, n_out = n->n_out;
        /* every slot set, past n_in/n_out too: a rule reads its op's optional inputs by
         * position (need_dx[2] of a BiasDropout imported with two inputs) */
        int dy[64], need[64], dx[64];
        for (int i = 0; i < 64; i++) dy[i] = -1, need[i] = 0, dx[i] = -1;
        int any_dy = 0, any_need = 0;
        if (n_in > 64 || n_out > 64) { st = om_error(OM_UNSUPPORTED_OP, "node '%s' has too many inputs for autodiff", n->name); goto done; }
        for (int j = 0; j < n_out; j++) {
            int v = g->nodes[k].out[j];
            dy[j] = v >= 0 && v < nv0 ? sum_contribs(&s, &contribs[v]) : -1;
            if (s.status) break;
            any_dy |= dy[j] >= 0;
        }
        if (s.status) { st = s.status; goto done; }
        if (!any_dy) continue;
        n = &g->nodes[k];
        for (int i = 0; i < n_in; i++) {
            int v = n->in[i];
            need[i] = v >= 0 && requires[v] && input_differentiable(n->op, i);
            any_need |= need[i];
            dx[i] = -1;
        }
        if (!any_need) continue;
        if (!n->op->grad) {
            st = om_error(OM_NO_GRADIENT, "op '%s' (node '%s') has no gradient rule, but a gradient must flow through it",
                          n->op->name, n->name);
            goto done;
        }
        s.ctx.node = k;
        s.ctx.dy = dy;
        s.ctx.need_dx = need;
        s.ctx.dx = dx;
        om_status *rs = n->op->grad(&s.ctx);
        if (rs || s.status) {
            st = rs ? rs : s.status;
            if (rs && s.status && rs != s.status) om_status_free(s.status);
            st = om_error_context(st, "gradient of %s node '%s'", g->nodes[k].op->name, g->nodes[k].name);
            goto done;
        }
        n = &g->nodes[k];
        for (int i = 0; i < n_in; i++) {
            if (dx[i] < 0 || !need[i]) continue;
            if ((st = add_contrib(&contribs[n->in[i]], dx[i]))) goto done;
        }
    }
    for (int i = 0; i < g->n_inputs; i++) {
        int v = g->inputs[i];
        if (!grad_inputs[i]) continue;
        g->grad_of_input[i] = sum_contribs(&s, &contribs[v]);
        if (s.status) { st = s.status; goto done; }
        if (g->grad_of_input[i] >= 0 && g->values[g->grad_of_input[i]].rank_hint < 0)
            g->values[g->grad_of_input[i]].rank_hint = g->values[v].rank_hint;
    }
done:
    if (contribs)
        for (int i = 0; i < nv0; i++) free(contribs[i].ids);
    free(contribs);
    free(requires);
    return st;
}
