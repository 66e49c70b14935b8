/* constant_folding.c — evaluates nodes whose inputs are all constants, once, at compile
 * time. Trainable parameters are graph inputs, never constants, so they are never folded.
 * Random ops are left alone; so are results above a size cap (folding must not bloat).
 * fp16/bf16 arithmetic folds through fp32 (om_cpu_fold). */
#include "passes/pass.h"

#include <stdlib.h>

#define FOLD_MAX_BYTES ((size_t)16 << 20)

om_status *om_pass_constant_folding(om_pass_ctx *c) {
    om_graph *g = c->g;
    om_tensor in[64], out[64];
    for (int k = 0; k < g->n_nodes; k++) {
        om_node *n = &g->nodes[k];
        if (n->dead || (n->op->flags & OM_OP_RANDOM) || n->n_in > 64 || n->n_out > 64) continue;
        int all_const = 1;
        for (int i = 0; i < n->n_in && all_const; i++)
            if (n->in[i] >= 0 && !g->values[n->in[i]].constant) all_const = 0;
        if (!all_const) continue;
        for (int i = 0; i < n->n_in; i++) {
            if (n->in[i] < 0) memset(&in[i], 0, sizeof in[i]);
            else in[i] = *g->values[n->in[i]].constant;
        }
        for (int j = 0; j < n->n_out; j++) {
            memset(&out[j], 0, sizeof out[j]);
            if (n->out[j] >= 0) out[j].dtype = g->values[n->out[j]].dtype;
        }
        om_kernel_ctx kc = {.g = g, .node = n, .n_in = n->n_in, .n_out = n->n_out, .in = in, .out = out};
        om_status *st = n->op->infer(&kc);
        if (st) return om_error_context(st, "%s node '%s'", n->op->name, n->name);
        size_t total = 0;
        for (int j = 0; j < n->n_out; j++) {
            size_t nb = 0;
            if (om_shape_size(out[j].dims, out[j].rank, om_dtype_size(out[j].dtype), NULL, &nb) != 0)
                return om_error(OM_INVALID_MODEL, "%s node '%s': output %d would be larger than a tensor can be",
                                n->op->name, n->name, j);
            if (total <= FOLD_MAX_BYTES)   /* saturates at FOLD_MAX_BYTES + 1: no wrap */
                total = nb > FOLD_MAX_BYTES - total ? FOLD_MAX_BYTES + 1 : total + nb;
        }
        if (total > FOLD_MAX_BYTES) continue;

        int ok = 1;
        for (int j = 0; j < n->n_out; j++) {
            out[j].data = n->out[j] >= 0 ? om_alloc(om_tensor_nbytes(&out[j])) : NULL;
            if (n->out[j] >= 0 && !out[j].data) ok = 0;
        }
        if (ok) st = om_cpu_fold(&kc);   /* fp16/bf16 math through fp32 (ops/fold.c) */
        if (!ok || st) {
            for (int j = 0; j < n->n_out; j++) om_free(out[j].data);
            if (st) return om_error_context(st, "%s node '%s'", n->op->name, n->name);
            return om_error(OM_OUT_OF_MEMORY, "out of memory folding node '%s'", n->name);
        }
        for (int j = 0; j < n->n_out; j++) {
            int v = n->out[j];
            if (v < 0) continue;
            om_tensor *t = malloc(sizeof *t);
            if (!t) { om_free(out[j].data); return om_error(OM_OUT_OF_MEMORY, "out of memory"); }
            *t = out[j];
            g->values[v].constant = t;
            g->values[v].dtype = t->dtype;
            g->values[v].producer = -1;
        }
        n->dead = 1;
        om_pass_fired(c, n->name);
    }
    return NULL;
}
