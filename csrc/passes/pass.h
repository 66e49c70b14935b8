/* pass.h — graph transformations that run between import and planning.
 *
 * A pass rewrites the graph in place (graph/rewrite.c) and notes what it did in the
 * report. Passes run on the forward graph before autodiff (stage OM_PASS_FORWARD) and
 * some again on the joint forward+backward graph (OM_PASS_JOINT). Every pass can be
 * switched off by name: ORTMOD_DISABLE_PASSES=cse,bias_gelu (or "all"; om_options.disable_passes).
 *
 * Adding a pass: one file in passes/, one line in the pass list in passes/pass.c.
 */
#ifndef OM_PASS_H
#define OM_PASS_H
#include "ops/op.h"

enum { OM_PASS_FORWARD = 1, OM_PASS_JOINT = 2 };

typedef struct om_pass_log {      /* what the passes did, for explain() and the logs */
    char *text;                   /* JSON array of {"pass", "stage", "before", "after", "fired": [...]} */
    size_t len, cap;
} om_pass_log;

typedef struct om_pass_ctx {
    om_graph *g;
    int stage;
    int fired;                    /* the pass counts its rewrites here */
    char sites[4096];             /* ", "-separated node names where it fired (truncated) */
} om_pass_ctx;

typedef struct om_pass {
    const char *name;
    unsigned stages;              /* OM_PASS_FORWARD | OM_PASS_JOINT */
    om_status *(*run)(om_pass_ctx *c);
} om_pass;

/* Records that the pass fired at node name (for the report). */
void om_pass_fired(om_pass_ctx *c, const char *node_name);

/* Runs the passes of the stage, in order, but those named in disabled (om_options.disable_passes:
 * names separated by ',' or ' ', or "all"); appends to log. */
om_status *om_run_passes(om_graph *g, int stage, const char *disabled, om_pass_log *log);
void om_pass_log_free(om_pass_log *log);
/* 1 when the first len characters of name are a pass's name (for the options' checks). */
int om_pass_known(const char *name, size_t len);
/* The passes' names, ", "-separated, into buf (truncated to cap). */
void om_pass_list(char *buf, size_t cap);

/* The passes (one file each). */
om_status *om_pass_constant_folding(om_pass_ctx *c);
om_status *om_pass_cse(om_pass_ctx *c);
om_status *om_pass_eliminate_identity(om_pass_ctx *c);
om_status *om_pass_transpose_matmul(om_pass_ctx *c);
om_status *om_pass_dce(om_pass_ctx *c);
/* fusions (fuse_*.c) */
om_status *om_pass_gelu(om_pass_ctx *c);
om_status *om_pass_layer_norm(om_pass_ctx *c);
om_status *om_pass_batch_norm_relu(om_pass_ctx *c);
om_status *om_pass_softmax_cross_entropy(om_pass_ctx *c);
om_status *om_pass_attention(om_pass_ctx *c);
om_status *om_pass_bias_gelu(om_pass_ctx *c);
om_status *om_pass_matmul_add_bias(om_pass_ctx *c);
om_status *om_pass_matmul_bias_gelu(om_pass_ctx *c);
om_status *om_pass_matmul_grad_gelu(om_pass_ctx *c);
om_status *om_pass_bias_dropout_residual(om_pass_ctx *c);
om_status *om_pass_swiglu(om_pass_ctx *c);
om_status *om_pass_rotary_embedding(om_pass_ctx *c);
#endif
