/* backward_variants.c — a plan's backward programs for calls where some output gradients are
 * absent (plan/backward_variants.h says what a variant is). */
#include "plan/backward_variants.h"

#include <stdlib.h>

void om_plan_free_variants(om_plan *p) {
    for (om_bwd_variant *v = p->variants, *next; v; v = next) {
        next = v->next;
        free(v->prog);
        free(v->zero_grad);
        free(v);
    }
    p->variants = NULL;
}

om_status *om_plan_backward_variant(const om_graph *g, om_plan *p, const char *absent, const om_bwd_variant **out) {
    *out = NULL;
    /* the key is a mask of the outputs that have a gradient; past 64 outputs there is none */
    if (g->n_outputs > 64) return NULL;
    uint64_t present = 0;
    int all_present = 1;
    for (int i = 0; i < g->n_outputs; i++) {
        if (p->seed_of_output[i] < 0) continue;
        if (absent[i]) all_present = 0;
        else present |= (uint64_t)1 << i;
    }
    if (all_present) return NULL;
    for (om_bwd_variant *v = p->variants; v; v = v->next)
        if (v->present == present) { *out = v; return NULL; }
    int nv = p->n_values;
    char *seedlike = calloc((size_t)nv + 1, 1), *zero = calloc((size_t)nv + 1, 1), *read = calloc((size_t)nv + 1, 1);
    om_bwd_variant *var = calloc(1, sizeof *var);
    if (var) {
        var->prog = malloc(sizeof(int) * ((size_t)p->n_bwd_prog + 1));
        var->zero_grad = calloc((size_t)g->n_inputs + 1, 1);
    }
    if (!seedlike || !zero || !read || !var || !var->prog || !var->zero_grad) {
        free(seedlike); free(zero); free(read);
        if (var) { free(var->prog); free(var->zero_grad); free(var); }
        return om_error(OM_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int sv = p->seed_of_output[i];
        if (sv < 0) continue;
        seedlike[sv] = 1;
        zero[sv] = (char)(absent[i] != 0);
    }
    char *skip = calloc((size_t)p->n_bwd_prog + 1, 1);
    if (!skip) { free(seedlike); free(zero); free(read); free(var->prog); free(var->zero_grad); free(var); return om_error(OM_OUT_OF_MEMORY, "out of memory"); }
    for (int s = 0; s < p->n_bwd_prog; s++) {
        const om_node *n = &g->nodes[p->bwd_prog[s]];
        int any_seed = 0, all_zero = 1;
        for (int i = 0; i < n->n_in; i++) {
            int v = n->in[i];
            if (v < 0) continue;
            while (p->storage[v] == OM_ST_ALIAS && !seedlike[v]) v = p->alias_of[v];
            if (!seedlike[n->in[i]] && !seedlike[v]) continue;
            any_seed = 1;
            if (!zero[n->in[i]] && !zero[v]) all_zero = 0;
        }
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0 && any_seed) {
                seedlike[n->out[j]] = 1;
                zero[n->out[j]] = (char)all_zero;
            }
        skip[s] = (char)(any_seed && all_zero);
    }
    /* which zero values a running node (or the result) still reads */
    for (int s = 0; s < p->n_bwd_prog; s++) {
        const om_node *n = &g->nodes[p->bwd_prog[s]];
        if (skip[s]) continue;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0) read[n->in[i]] = 1;
    }
    for (int i = 0; i < g->n_inputs; i++) {
        int v = g->grad_of_input[i];
        if (v >= 0 && zero[v]) var->zero_grad[i] = 1;
    }
    for (int s = 0; s < p->n_bwd_prog; s++) {
        const om_node *n = &g->nodes[p->bwd_prog[s]];
        if (!skip[s]) { var->prog[var->n_prog++] = p->bwd_prog[s]; continue; }
        int needed = 0;
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0 && read[n->out[j]]) needed = 1;
        /* aliases of a skipped output read later also need the bytes: zero-fill then too */
        for (int v = 0; v < nv && !needed; v++)
            if (read[v] && p->storage[v] == OM_ST_ALIAS)
                for (int j = 0; j < n->n_out; j++) {
                    int r = v;
                    while (p->storage[r] == OM_ST_ALIAS) r = p->alias_of[r];
                    if (r == n->out[j]) needed = 1;
                }
        if (needed) var->prog[var->n_prog++] = -(p->bwd_prog[s] + 1);
    }
    free(skip); free(seedlike); free(zero); free(read);
    var->present = present;
    var->next = p->variants;
    p->variants = var;
    *out = var;
    return NULL;
}

