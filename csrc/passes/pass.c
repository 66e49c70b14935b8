/* pass.c — the pass list and the pass manager. */
#include "passes/pass.h"

#include <stdio.h>
#include <stdlib.h>

/* Order matters: folding exposes equal subexpressions; fusions see a clean graph; dead
 * code goes last. */
static const om_pass passes[] = {
    {"constant_folding", OM_PASS_FORWARD, om_pass_constant_folding},
    {"cse", OM_PASS_FORWARD | OM_PASS_JOINT, om_pass_cse},
    /* fusions: gelu before bias_gelu (Add + written-out GELU -> BiasGelu); attention and
     * bias_gelu before matmul_add_bias (they claim their Adds first); matmul_add_bias
     * before bias_dropout_residual (MatMul + Add -> Dropout -> Add: both fire);
     * matmul_bias_gelu after both bias_gelu and matmul_add_bias (it takes either's result);
     * swiglu and rotary_embedding claim only Mul/Sigmoid and Add/Mul/Slice/Concat/Neg chains
     * that no other fusion matches */
    {"gelu", OM_PASS_FORWARD, om_pass_gelu},
    {"layer_norm", OM_PASS_FORWARD, om_pass_layer_norm},
    {"swiglu", OM_PASS_FORWARD, om_pass_swiglu},
    {"rotary_embedding", OM_PASS_FORWARD, om_pass_rotary_embedding},
    {"batch_norm_relu", OM_PASS_FORWARD, om_pass_batch_norm_relu},
    {"softmax_cross_entropy", OM_PASS_FORWARD, om_pass_softmax_cross_entropy},
    {"attention", OM_PASS_FORWARD, om_pass_attention},
    {"bias_gelu", OM_PASS_FORWARD, om_pass_bias_gelu},
    {"matmul_add_bias", OM_PASS_FORWARD, om_pass_matmul_add_bias},
    {"matmul_bias_gelu", OM_PASS_FORWARD, om_pass_matmul_bias_gelu},
    {"bias_dropout_residual", OM_PASS_FORWARD, om_pass_bias_dropout_residual},
    {"transpose_matmul", OM_PASS_FORWARD, om_pass_transpose_matmul},
    {"eliminate_identity", OM_PASS_FORWARD, om_pass_eliminate_identity},
    /* backward fusions (the joint graph) */
    {"matmul_grad_gelu", OM_PASS_JOINT, om_pass_matmul_grad_gelu},
    {"dce", OM_PASS_FORWARD | OM_PASS_JOINT, om_pass_dce},
};

/* disabled: om_options.disable_passes, names already checked by the options (ortmod_options.h). */
static int pass_disabled(const char *disabled, const char *name) {
    size_t n = strlen(name);
    for (const char *p = disabled; *p;) {
        while (*p == ',' || *p == ' ') p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ') e++;
        size_t len = (size_t)(e - p);
        if ((len == n && strncmp(p, name, n) == 0) || (len == 3 && strncmp(p, "all", 3) == 0)) return 1;
        p = e;
    }
    return 0;
}

int om_pass_known(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++)
        if (strlen(passes[i].name) == len && strncmp(passes[i].name, name, len) == 0) return 1;
    return 0;
}

void om_pass_list(char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof passes / sizeof passes[0] && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", passes[i].name);
}

void om_pass_fired(om_pass_ctx *c, const char *node_name) {
    c->fired++;
    size_t used = strlen(c->sites);
    if (used + strlen(node_name) + 8 >= sizeof c->sites) return;
    snprintf(c->sites + used, sizeof c->sites - used, "%s\"%s\"", used ? ", " : "", node_name);
}

static void log_append(om_pass_log *log, const char *s) {
    size_t n = strlen(s);
    if (log->len + n + 2 > log->cap) {
        size_t cap = (log->cap ? log->cap * 2 : 1024) + n;
        char *t = realloc(log->text, cap);
        if (!t) return;
        log->text = t;
        log->cap = cap;
    }
    memcpy(log->text + log->len, s, n + 1);
    log->len += n;
}

static int live_nodes(const om_graph *g) {
    int n = 0;
    for (int k = 0; k < g->n_nodes; k++) n += !g->nodes[k].dead;
    return n;
}

om_status *om_run_passes(om_graph *g, int stage, const char *disabled, om_pass_log *log) {
    for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++) {
        const om_pass *p = &passes[i];
        if (!(p->stages & (unsigned)stage) || pass_disabled(disabled, p->name)) continue;
        om_pass_ctx *c = calloc(1, sizeof *c);
        if (!c) return om_error(OM_OUT_OF_MEMORY, "out of memory in passes");
        c->g = g;
        c->stage = stage;
        int before = live_nodes(g);
        om_status *st = p->run(c);
        if (!st) st = om_graph_compact(g);
        if (st) {
            free(c);
            return om_error_context(st, "pass '%s'", p->name);
        }
        if (log) {
            char head[256];
            snprintf(head, sizeof head, "%s{\"pass\": \"%s\", \"stage\": \"%s\", \"before\": %d, \"after\": %d, \"fired\": %d, \"sites\": [",
                     log->len ? ", " : "", p->name, stage == OM_PASS_FORWARD ? "forward" : "joint", before, g->n_nodes, c->fired);
            log_append(log, head);
            log_append(log, c->sites);
            log_append(log, "]}");
        }
        free(c);
    }
    return NULL;
}

void om_pass_log_free(om_pass_log *log) {
    free(log->text);
    memset(log, 0, sizeof *log);
}
