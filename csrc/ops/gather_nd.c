/* gather_nd.c — indexing by index tuples: GatherND, ScatterND and GatherND's backward op.
 *
 * Exports:
 *   om_op_gather_nd        GatherND       (data, indices; batch_dims)                 any dtype
 *   om_op_gather_nd_grad   GatherNDGrad   (domain ortmod) (dy, Shape(data), indices; batch_dims)
 *                                         -> dx: dy's slices added into zeros of Shape(data)
 *   om_op_scatter_nd       ScatterND      (data, indices, updates; reduction none|add)
 *
 * Geometry (ops/nd_geom.h): the last dim k of indices is the tuple length; each tuple
 * addresses a slice of data (the dims after the first k, past the batch dims). Tuple entries
 * follow ONNX: negative values wrap, out-of-range values are an error naming the node (every
 * tuple is checked before anything is written).
 *
 * Gradients:
 *   GatherND   d(data) = GatherNDGrad(dy, Shape(data), indices; batch_dims)
 *   ScatterND  d(updates) = GatherND(dy, indices);
 *              d(data) = dy (reduction add) or ScatterND(dy, indices, 0) (none: the
 *              overwritten slices did not reach the output)
 *
 * Duplicated tuples. With reduction add they sum (torch's index_put_(accumulate=True)). With
 * reduction none ONNX leaves the result undefined; the engine lets the last tuple (in row-major
 * order of indices) win, on the CPU (the sequential loop) and on CUDA (claim, then write): that
 * is eager torch's CPU index_put_ under torch.use_deterministic_algorithms and whenever the
 * assignment is small enough to run on one thread (eager's parallel CPU loop lets an arbitrary
 * duplicate win for larger ones, so no other rule matches it better). The gradient rules are
 * eager's for index_put_ too: every duplicated update receives dy of its target, and the target
 * gets none. The exporter emits ScatterND for slice and index assignment
 * (`x[:, 1:] = v`, `x[idx] = v`, transformers' shift of labels into decoder inputs).
 *
 * ScatterND with reduction add computes, so fp16/bf16 data runs on fp32 twins (om_cpu_run),
 * which for reduction none is an exact round trip; integer and bool data run as they are.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"
#include "ops/op_util.h"
#include "ops/nd_geom.h"

/* data_like: data, or the gradient's Shape(data) dims; ind: indices (input ind_i). */
static om_status *nd_init(const om_node *n, const int64_t *dd, int r, const om_tensor *ind, int ind_i, int64_t b,
                          om_nd_geom *g) {
    if (!om_is_index_dtype(ind->dtype)) return om_err_dtype(n, ind_i, ind->dtype);
    const char *why = om_nd_geometry(dd, r, ind->dims, ind->rank, b, g);
    if (why) return om_error(OM_INVALID_ARGUMENT, "%s node '%s': %s", n->op->name, om_node_name(n), why);
    return NULL;
}

/* Every tuple entry in [-dim, dim). The kernels check before writing anything; the shape rules
 * check tuples known at plan time (a constant), so that a CUDA plan, whose kernels cannot report
 * one without a synchronization (an entry out of range reads 0 there), refuses them too. */
static om_status *nd_check_range(const om_node *n, const om_tensor *ind, const om_nd_geom *g) {
    const int64_t rows = g->B * g->R;
    for (int64_t q = 0; q < rows; q++)
        for (int j = 0; j < g->k; j++) {
            const int64_t v = om_index_at(ind, q * g->k + j);
            if (v < -g->dim[j] || v >= g->dim[j])
                return om_error(OM_RUNTIME, "%s node '%s': index %lld (tuple %lld, entry %d) is out of range for a dim "
                                "of size %lld", n->op->name, om_node_name(n), (long long)v, (long long)q, j,
                                (long long)g->dim[j]);
        }
    return NULL;
}

/* The element offset in data of the slice that row q's tuple addresses (range checked). */
static int64_t nd_row_offset(const om_nd_geom *g, const om_tensor *ind, int64_t q) {
    int64_t off = (q / g->R) * g->batch_stride;
    for (int j = 0; j < g->k; j++) {
        int64_t v = om_index_at(ind, q * g->k + j);
        if (v < 0) v += g->dim[j];
        off += v * g->stride[j];
    }
    return off;
}

static int64_t batch_dims_of(const om_node *n) { return om_attr_int(n, "batch_dims", 0); }

/* ---- GatherND ------------------------------------------------------------------------- */

static om_status *gather_nd_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1];
    const int64_t b = batch_dims_of(ctx->node);
    om_nd_geom g = {0};
    OM_TRY(nd_init(ctx->node, x->dims, x->rank, ind, 1, b, &g));
    if (ind->data) OM_TRY(nd_check_range(ctx->node, ind, &g));   /* known at plan time: as the kernel would */
    om_tensor *o = &ctx->out[0];
    o->dtype = x->dtype;
    o->rank = om_nd_rows_shape(x->dims, x->rank, ind->dims, ind->rank, b, g.k, o->dims);
    return NULL;
}

// data is (d0..), indices is (i0.., k), y is (rows, slice): y[q] = data[slice of tuple q]
static om_status *gather_nd_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1];
    om_nd_geom g = {0};
    OM_TRY(nd_init(ctx->node, x->dims, x->rank, ind, 1, batch_dims_of(ctx->node), &g));
    OM_TRY(nd_check_range(ctx->node, ind, &g));
    const size_t es = om_dtype_size(x->dtype), row = (size_t)g.slice * es;
    const char *xp = x->data;
    char *yp = ctx->out[0].data;
    for (int64_t q = 0; q < g.B * g.R; q++) memcpy(yp + (size_t)q * row, xp + (size_t)nd_row_offset(&g, ind, q) * es, row);
    return NULL;
}

static om_status *gather_nd_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    /* read before emitting: the nodes array moves as nodes are added (n would dangle) */
    const int x = n->in[0], ind = n->in[1];
    const int64_t b = batch_dims_of(n);
    int shp = om_emit_shape(c, x);
    if (shp < 0) return NULL;
    int in[3] = {dy, shp, ind};
    int dx = om_emit(c, om_op_gather_nd_grad_id, in, 3);
    if (dx < 0) return NULL;
    om_emit_attr_int(c, "batch_dims", b);
    c->dx[0] = dx;
    return NULL;
}

/* ---- GatherNDGrad ---------------------------------------------------------------------- */

static om_status *gather_nd_grad_infer(om_kernel_ctx *ctx) {
    const om_tensor *dy = &ctx->in[0], *shp = &ctx->in[1], *ind = &ctx->in[2];
    OM_TRY(om_check_float(ctx->node, dy, 0, OM_UNDEFINED));
    if (!om_is_index_dtype(shp->dtype)) return om_err_dtype(ctx->node, 1, shp->dtype);
    if (!shp->data)
        return om_error(OM_INVALID_ARGUMENT, "GatherNDGrad node '%s': the shape must be known at plan time",
                        om_node_name(ctx->node));
    const int64_t r = om_tensor_numel(shp);
    if (r > OM_MAX_RANK)
        return om_error(OM_INVALID_ARGUMENT, "GatherNDGrad node '%s': rank %lld exceeds %d", om_node_name(ctx->node),
                        (long long)r, OM_MAX_RANK);
    om_tensor *o = &ctx->out[0];
    o->dtype = dy->dtype;
    o->rank = (int)r;
    for (int64_t i = 0; i < r; i++) o->dims[i] = om_index_at(shp, i);
    OM_TRY(om_check_shape_data(ctx->node, 1, o->dims, o->rank, o->dtype));
    const int64_t b = batch_dims_of(ctx->node);
    om_nd_geom g = {0};
    OM_TRY(nd_init(ctx->node, o->dims, o->rank, ind, 2, b, &g));
    int64_t rows[OM_MAX_RANK];
    const int rr = om_nd_rows_shape(o->dims, o->rank, ind->dims, ind->rank, b, g.k, rows);
    int same = rr == dy->rank;
    for (int i = 0; same && i < rr; i++) same = rows[i] == dy->dims[i];
    if (!same)
        return om_error(OM_INVALID_ARGUMENT, "GatherNDGrad node '%s': dy does not have GatherND's output shape",
                        om_node_name(ctx->node));
    return NULL;
}

// dy is (rows, slice), indices (i0.., k), dx is Shape(data): dx = 0; dx[slice of tuple q] += dy[q]
static om_status *gather_nd_grad_cpu(om_kernel_ctx *ctx) {
    const om_tensor *dy = &ctx->in[0], *ind = &ctx->in[2];
    om_tensor *dx = &ctx->out[0];
    om_nd_geom g = {0};
    OM_TRY(nd_init(ctx->node, dx->dims, dx->rank, ind, 2, batch_dims_of(ctx->node), &g));
    OM_TRY(nd_check_range(ctx->node, ind, &g));
    memset(dx->data, 0, om_tensor_nbytes(dx));
    OM_DISPATCH_FLOAT(dy->dtype, ctx->node, {
        const T *gp = dy->data;
        T *d = dx->data;
        for (int64_t q = 0; q < g.B * g.R; q++) {
            T *dst = d + nd_row_offset(&g, ind, q);
            const T *src = gp + q * g.slice;
            for (int64_t e = 0; e < g.slice; e++) dst[e] += src[e];
        }
    });
    return NULL;
}

/* dy with the places a scatter (reduction none) wrote zeroed: what reaches its data input, since
 * data's values there were overwritten. The scatter is ScatterND or ScatterElements (the caller
 * sets the latter's axis on the node this emits last). */
int om_emit_scatter_blanked(om_grad_ctx *c, om_op_id scatter, int dy, int ind, int upd) {
    const om_dtype dt = c->g->values[dy].dtype;
    int zero = om_emit_scalar(c, dt, 0.0);
    int shp = zero < 0 ? -1 : om_emit_shape(c, upd);
    int zeros = shp < 0 ? -1 : om_emit2(c, om_op_expand_id, zero, shp);
    if (zeros < 0) return -1;
    int in[3] = {dy, ind, zeros};
    return om_emit(c, scatter, in, 3);
}

/* ---- ScatterND ------------------------------------------------------------------------- */

static om_status *scatter_nd_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1], *u = &ctx->in[2];
    if (om_scatter_reduction(ctx->node) < 0)
        return om_err_unsupported(ctx->node, "reduction other than none or add");
    if (u->dtype != x->dtype) return om_err_dtype(ctx->node, 2, u->dtype);
    om_nd_geom g = {0};
    OM_TRY(nd_init(ctx->node, x->dims, x->rank, ind, 1, 0, &g));
    if (ind->data) OM_TRY(nd_check_range(ctx->node, ind, &g));
    int64_t rows[OM_MAX_RANK];
    const int rr = om_nd_rows_shape(x->dims, x->rank, ind->dims, ind->rank, 0, g.k, rows);
    int same = rr == u->rank;
    for (int i = 0; same && i < rr; i++) same = rows[i] == u->dims[i];
    if (!same)
        return om_error(OM_INVALID_ARGUMENT, "ScatterND node '%s': updates must have the shape indices.shape[:-1] + "
                        "data.shape[k:] (rank %d)", om_node_name(ctx->node), rr);
    om_set_shape(&ctx->out[0], x, x->dtype);
    return NULL;
}

// data and y are (d0..), indices (i0.., k), updates (rows, slice):
// y = data; y[slice of tuple q] = updates[q] (the last duplicate wins) or += updates[q] (add)
static om_status *scatter_nd_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1], *u = &ctx->in[2];
    om_tensor *y = &ctx->out[0];
    const int red = om_scatter_reduction(ctx->node);
    if (red < 0) return om_err_unsupported(ctx->node, "reduction other than none or add");
    om_nd_geom g = {0};
    OM_TRY(nd_init(ctx->node, x->dims, x->rank, ind, 1, 0, &g));
    OM_TRY(nd_check_range(ctx->node, ind, &g));
    if (red == 1 && !om_dtype_in(x->dtype, OM_DT_ARITH)) return om_err_dtype(ctx->node, 0, x->dtype);
    if (y->data != x->data) memcpy(y->data, x->data, om_tensor_nbytes(x));
    const int64_t rows = g.B * g.R;
    if (red == 0) {
        const size_t es = om_dtype_size(x->dtype), row = (size_t)g.slice * es;
        const char *up = u->data;
        char *yp = y->data;
        for (int64_t q = 0; q < rows; q++) memcpy(yp + (size_t)nd_row_offset(&g, ind, q) * es, up + (size_t)q * row, row);
        return NULL;
    }
#define SCATTER_ND_ADD(T)                                                                 \
    {                                                                                     \
        const T *up = u->data;                                                            \
        T *yp = y->data;                                                                  \
        for (int64_t q = 0; q < rows; q++) {                                              \
            T *dst = yp + nd_row_offset(&g, ind, q);                                      \
            const T *src = up + q * g.slice;                                              \
            for (int64_t e = 0; e < g.slice; e++) dst[e] += src[e];                       \
        }                                                                                 \
    }
    switch (x->dtype) {
    case OM_F32: SCATTER_ND_ADD(float) break;
    case OM_F64: SCATTER_ND_ADD(double) break;
    case OM_I32: SCATTER_ND_ADD(int32_t) break;
    case OM_I64: SCATTER_ND_ADD(int64_t) break;
    default: return om_err_dtype(ctx->node, 0, x->dtype);
    }
#undef SCATTER_ND_ADD
    return NULL;
}

static om_status *scatter_nd_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int dy = c->dy[0];
    if (dy < 0) return NULL;
    const int red = om_scatter_reduction(n);
    const int ind = n->in[1], upd = n->in[2];   /* n dangles once a node is emitted */
    if (c->need_dx[2]) {
        int in[2] = {dy, ind};
        int du = om_emit(c, om_op_gather_nd_id, in, 2);
        if (du < 0) return NULL;
        c->dx[2] = du;
    }
    if (c->need_dx[0]) {
        if (red == 1) {
            c->dx[0] = dy;
        } else {
            int dx = om_emit_scatter_blanked(c, om_op_scatter_nd_id, dy, ind, upd);
            if (dx < 0) return NULL;
            c->dx[0] = dx;
        }
    }
    return NULL;
}

/* ---- definitions ----------------------------------------------------------------------- */

const om_op_def om_op_gather_nd = {
    .name = "GatherND", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = gather_nd_infer, .grad = gather_nd_grad, .cpu = gather_nd_cpu,
    .diff_inputs = 1,
    .attrs = "batch_dims:int",
};
const om_op_def om_op_gather_nd_grad = {
    .name = "GatherNDGrad", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = gather_nd_grad_infer, .cpu = gather_nd_grad_cpu,
    .attrs = "batch_dims:int",
};
const om_op_def om_op_scatter_nd = {
    .name = "ScatterND", .domain = "", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = scatter_nd_infer, .grad = scatter_nd_grad, .cpu = scatter_nd_cpu, .diff_inputs = 0x5,
    .attrs = "reduction:string=none|add",
};
