/* op_util.h — the small helpers every op family needs, written once: optional inputs, errors
 * that name the node, Dropout's parameters. The CUDA provider's twins (which read inputs that
 * live on the device) are in cuda/common.cuh. */
#ifndef OM_OP_UTIL_H
#define OM_OP_UTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"

/* 1 when optional input i was given: an absent one has dtype OM_UNDEFINED. */
static inline int om_in_present(const om_kernel_ctx *ctx, int i) {
    return i < ctx->n_in && ctx->in[i].dtype != OM_UNDEFINED;
}

/* An error that names the node and its op: "<Op> node '<name>': <message>". */
static inline om_status *om_node_error(const om_node *n, om_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline om_status *om_node_error(const om_node *n, om_code code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return om_error(code, "%s node '%s': %s", n && n->op ? n->op->name : "?", n && n->name ? n->name : "?", msg);
}

/* A node's name for messages ("" for an unnamed one). */
static inline const char *om_node_name(const om_node *n) { return n && n->name ? n->name : ""; }

/* Index tensors are int64 or int32 (ONNX's Gather/Scatter/TopK/CTC lengths); element i as int64. */
static inline int om_is_index_dtype(om_dtype dt) { return dt == OM_I64 || dt == OM_I32; }
static inline int64_t om_index_at(const om_tensor *t, int64_t i) {
    return t->dtype == OM_I64 ? ((const int64_t *)t->data)[i] : (int64_t)((const int32_t *)t->data)[i];
}

/* ScatterND's and ScatterElements' `reduction`: 0 none, 1 add, -1 another (refused by their shape rules). */
static inline int om_scatter_reduction(const om_node *n) {
    const char *r = om_attr_string(n, "reduction", "none");
    return strcmp(r, "none") == 0 ? 0 : strcmp(r, "add") == 0 ? 1 : -1;
}

/* A scatter's gradient for its data input (ops/gather_nd.c): dy with the places the scatter wrote
 * zeroed; -1 when an emit failed (the error is in c). */
int om_emit_scatter_blanked(om_grad_ctx *c, om_op_id scatter, int dy, int ind, int upd);

/* Dropout's ratio (default 0.5) and training mode (default off) from the optional inputs at ri
 * and ti (Dropout, DropoutGrad, BiasDropout and its gradient place them differently); *scale is
 * what kept elements are multiplied by, 0 for ratio 1, which drops everything. */
om_status *om_dropout_params(const om_kernel_ctx *ctx, int ri, int ti, double *ratio, int *training, double *scale);

#endif
