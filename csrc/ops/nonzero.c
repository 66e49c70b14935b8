/* nonzero.c — the op whose output size is a value, NonZero, and OneHot (routing masks).
 *
 * Exports:
 *   om_op_one_hot   OneHot    (below)
 *   om_op_nonzero   NonZero   (X) -> int64 [rank(X), count]: the indices of X's nonzero elements,
 *                             one column per element, in row-major order (torch.nonzero
 *                             transposed, which the exporters undo with a Transpose)
 *
 * Its output's extent `count` depends on X's values, not its shape: no shape rule can give it
 * at plan time. It is the engine's one OM_OP_DATA_DEPENDENT op: the planner cuts the plan at
 * it (plan/plan.h: segments), the executor runs count() on X once the nodes before it ran,
 * and the rest of the graph is planned with that count known (ctx->extent in the shape rule
 * below). x[mask], masked_select and torch.where(cond) export through it.
 *
 * Elements are nonzero as eager's `!= 0` says: -0.0 is zero, NaN is not; fp16/bf16 by their
 * bits (any bit but the sign). No gradient: indices are integers (what consumes them, GatherND,
 * ScatterND, Gather, carries the gradient).
 *
 * CUDA: a HOST_OP (op_list.h): the executor refuses a data-dependent graph on CUDA by name
 * (exec/engine.c) before anything runs.
 */
#include <string.h>

#include "ops/op.h"

static const char *nm(const om_node *n) { return n && n->name ? n->name : "?"; }

static om_dtype dtype_i64(const om_graph *g, const om_node *n, int k) {
    (void)g; (void)n; (void)k;
    return OM_I64;
}

/* 1 when element i of t is nonzero. */
static inline int nz_at(const om_tensor *t, int64_t i) {
    switch (t->dtype) {
        case OM_F32: return ((const float *)t->data)[i] != 0.0f;
        case OM_F64: return ((const double *)t->data)[i] != 0.0;
        case OM_I64: return ((const int64_t *)t->data)[i] != 0;
        case OM_I32: return ((const int32_t *)t->data)[i] != 0;
        case OM_F16:
        case OM_BF16: return (((const uint16_t *)t->data)[i] & 0x7fff) != 0;
        default: return ((const uint8_t *)t->data)[i] != 0;   /* bool, uint8, int8 */
    }
}

static om_status *check_dtype(const om_node *n, om_dtype dt) {
    switch (dt) {
        case OM_F32: case OM_F64: case OM_I64: case OM_I32: case OM_F16: case OM_BF16: case OM_BOOL: case OM_U8:
        case OM_I8: return NULL;
        default: return om_err_dtype(n, 0, dt);
    }
}

static om_status *nonzero_count(om_kernel_ctx *ctx, int64_t *extent) {
    const om_tensor *x = &ctx->in[0];
    OM_TRY(check_dtype(ctx->node, x->dtype));
    int64_t n = om_tensor_numel(x), c = 0;
    for (int64_t i = 0; i < n; i++) c += nz_at(x, i);
    *extent = c;
    return NULL;
}

static om_status *nonzero_infer(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx->node, ctx->in[0].dtype));
    if (ctx->extent < 0)   /* the planner asks only once count() gave it: a bug otherwise */
        return om_error(OM_INTERNAL, "NonZero node '%s': planned before its count was known", nm(ctx->node));
    ctx->out[0].dtype = OM_I64;
    ctx->out[0].rank = 2;
    ctx->out[0].dims[0] = ctx->in[0].rank;
    ctx->out[0].dims[1] = ctx->extent;
    return NULL;
}

/* Writes the indices of the nonzero elements; the count must be the one planned for (the
 * input is the one count() read, unchanged: a mismatch is an engine bug, refused). */
static om_status *nonzero_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    const int r = x->rank;
    const int64_t n = om_tensor_numel(x), cap = y->dims[1];
    int64_t *out = y->data, idx[OM_MAX_RANK] = {0}, c = 0;
    for (int64_t i = 0; i < n; i++) {
        if (nz_at(x, i)) {
            if (c < cap)
                for (int d = 0; d < r; d++) out[d * cap + c] = idx[d];
            c++;
        }
        for (int d = r - 1; d >= 0; d--) {   /* row-major multi-index of element i + 1 */
            if (++idx[d] < x->dims[d]) break;
            idx[d] = 0;
        }
    }
    if (c != cap)
        return om_error(OM_INTERNAL, "NonZero node '%s': found %lld nonzero elements, planned for %lld", nm(ctx->node),
                        (long long)c, (long long)cap);
    return NULL;
}

const om_op_def om_op_nonzero = {
    .name = "NonZero", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    /* RANDOM: never folded or merged by value (its size is not a shape rule's) */
    .flags = OM_OP_DATA_DEPENDENT | OM_OP_RANDOM | OM_OP_ANY_DTYPE,
    .dtype = dtype_i64, .infer = nonzero_infer, .cpu = nonzero_cpu, .count = nonzero_count, .diff_inputs = 0,
};

/* ---- OneHot ------------------------------------------------------------------------------
 *   om_op_one_hot   OneHot   (indices, depth, values; axis) -> values' dtype, indices' shape with
 *                            a new axis of size depth: values[1] where the index is, values[0]
 *                            elsewhere (torch.nn.functional.one_hot; Mixtral's expert mask)
 * depth must be known at plan time (a constant); negative indices count from depth, as ONNX
 * says; an index outside [-depth, depth) is an error naming the node (eager's one_hot raises).
 * It sits beside NonZero because its users feed NonZero (routing masks). No gradient rule: the
 * values are the exporter's constants; one that needed a gradient is refused by name. */

static om_status *one_hot_dtype_check(const om_node *n, const om_tensor *ind, const om_tensor *depth) {
    if (ind->dtype != OM_I64 && ind->dtype != OM_I32) return om_err_dtype(n, 0, ind->dtype);
    if (!depth->data) return om_err_unsupported(n, "a depth computed at run time (it must be a constant)");
    return NULL;
}

static om_status *one_hot_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *ind = &ctx->in[0], *depth = &ctx->in[1], *vals = &ctx->in[2];
    OM_TRY(one_hot_dtype_check(n, ind, depth));
    int64_t d[1];
    if (om_tensor_numel(depth) != 1 || om_read_ints(depth, d, 1) != 1 || d[0] < 1)
        return om_error(OM_INVALID_ARGUMENT, "OneHot node '%s': depth must be one positive integer", nm(n));
    if (om_tensor_numel(vals) != 2)
        return om_error(OM_INVALID_ARGUMENT, "OneHot node '%s': values must hold [off, on]", nm(n));
    if (ind->rank + 1 > OM_MAX_RANK) return om_err_unsupported(n, "an output rank above the engine's limit");
    int axis;
    OM_TRY(om_norm_axis(n, om_attr_int(n, "axis", -1), ind->rank + 1, &axis));
    om_tensor *y = &ctx->out[0];
    y->dtype = vals->dtype;
    y->rank = ind->rank + 1;
    for (int i = 0, s = 0; i < y->rank; i++) y->dims[i] = i == axis ? d[0] : ind->dims[s++];
    return NULL;
}

static om_status *one_hot_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *ind = &ctx->in[0], *vals = &ctx->in[2];
    om_tensor *y = &ctx->out[0];
    int axis;
    OM_TRY(om_norm_axis(n, om_attr_int(n, "axis", -1), y->rank, &axis));
    const int64_t depth = y->dims[axis], m = om_tensor_numel(ind);
    int64_t inner = 1;
    for (int i = axis + 1; i < y->rank; i++) inner *= y->dims[i];
    const size_t es = om_dtype_size(y->dtype);
    const char *off = vals->data, *on = (const char *)vals->data + es;
    char *out = y->data;
    for (int64_t i = 0; i < m; i++) {   /* check every index first: nothing written on an error */
        int64_t k = ind->dtype == OM_I64 ? ((const int64_t *)ind->data)[i] : ((const int32_t *)ind->data)[i];
        if (k < -depth || k >= depth)
            return om_error(OM_RUNTIME, "OneHot node '%s': index %lld is outside [%lld, %lld)", nm(n), (long long)k,
                            (long long)-depth, (long long)depth);
    }
    const int64_t total = om_tensor_numel(y);
    for (int64_t e = 0; e < total; e++) memcpy(out + e * es, off, es);
    for (int64_t i = 0; i < m; i++) {   /* index i = (outer o, inner r) of indices' shape */
        int64_t k = ind->dtype == OM_I64 ? ((const int64_t *)ind->data)[i] : ((const int32_t *)ind->data)[i];
        if (k < 0) k += depth;
        const int64_t o = i / inner, r = i % inner;
        memcpy(out + ((o * depth + k) * inner + r) * es, on, es);
    }
    return NULL;
}

static om_dtype one_hot_dtype(const om_graph *g, const om_node *n, int k) {
    (void)k;
    return n->n_in > 2 && n->in[2] >= 0 ? g->values[n->in[2]].dtype : OM_UNDEFINED;
}

const om_op_def om_op_one_hot = {
    .name = "OneHot", .domain = "", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .dtype = one_hot_dtype, .infer = one_hot_infer, .cpu = one_hot_cpu,
    .diff_inputs = 1u << 2, .attrs = "axis:int",
};
