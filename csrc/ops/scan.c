/* scan.c — prefix sums and element-wise indexing along an axis: CumSum, GatherElements,
 * ScatterElements, and their backward ops.
 *
 * Exports (scan.list):
 *   om_op_cumsum                 CumSum               (x, axis; exclusive, reverse)   f32 f64 i32 i64; bool/u8/i8 -> i64
 *   om_op_gather_elements        GatherElements       (data, indices; axis)           any dtype
 *   om_op_gather_elements_grad   GatherElementsGrad   (domain ortmod) (dy, Shape(data), indices; axis)
 *                                                     -> dx: dy scatter-added into zeros of Shape(data)
 *   om_op_scatter_elements       ScatterElements      (data, indices, updates; axis, reduction none|add)
 *
 * Gradients:
 *   CumSum          dx = CumSum(dy, axis; exclusive, !reverse)   (the transpose of a prefix
 *                   sum is the suffix sum, with the same exclusivity)
 *   GatherElements  d(data) = GatherElementsGrad(dy, Shape(data), indices)
 *   ScatterElements d(updates) = GatherElements(dy, indices);
 *                   d(data) = dy (reduction add) or ScatterElements(dy, indices, 0) (none:
 *                   the overwritten positions did not reach the output)
 *
 * GPT-2 exports without attention_mask compute position ids with CumSum on int64; BERT
 * without token_type_ids takes its buffered type ids with GatherElements on int64: both
 * kernels therefore handle integer data (and the planner folds them when inputs are known).
 * torch.cumsum of a bool (or 8-bit int) tensor gives int64, and the TorchScript exporter
 * emits CumSum on the bool tensor as it is (GPT-2's position ids from a mask): CumSum
 * follows torch there, with an int64 output (ONNX itself has no bool CumSum).
 * Indices follow ONNX: negative values wrap, out-of-range values are an error naming the
 * node; indices may be smaller than data off the axis (torch.gather semantics).
 */
#include <stdio.h>
#include <stdlib.h>

#include "ops/op.h"
#include "ops/op_util.h"

#define SCAN_ARITH(dt, node, i, ...)                                            \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    case OM_I32: { typedef int32_t T; __VA_ARGS__; } break;                     \
    case OM_I64: { typedef int64_t T; __VA_ARGS__; } break;                     \
    default: return om_err_dtype((node), (i), (dt));                            \
    }

static int64_t dims_prod(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}

/* ---- CumSum ------------------------------------------------------------------------- */

/* The axis input: a scalar (or 1-element) int tensor; needs data (always there at run time). */
static om_status *cumsum_axis(const om_kernel_ctx *ctx, int *axis) {
    const om_tensor *a = &ctx->in[1], *x = &ctx->in[0];
    if (!om_is_index_dtype(a->dtype)) return om_err_dtype(ctx->node, 1, a->dtype);
    if (om_tensor_numel(a) != 1)
        return om_error(OM_INVALID_ARGUMENT, "CumSum node '%s': axis must be a scalar", om_node_name(ctx->node));
    if (!a->data)
        return om_error(OM_INVALID_ARGUMENT, "CumSum node '%s': axis must be known at plan time",
                        om_node_name(ctx->node));
    return om_norm_axis(ctx->node, om_index_at(a, 0), x->rank, axis);
}

static int small_int(om_dtype dt) { return dt == OM_BOOL || dt == OM_U8 || dt == OM_I8; }

static om_dtype cumsum_dtype(const om_graph *g, const om_node *n, int out_index) {
    const om_dtype dt = n->in[0] >= 0 ? g->values[n->in[0]].dtype : OM_UNDEFINED;
    return small_int(dt) ? OM_I64 : dt;
}

static om_status *cumsum_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    if (x->rank < 1) return om_error(OM_INVALID_ARGUMENT, "CumSum node '%s': x must have rank >= 1",
                                     om_node_name(ctx->node));
    if (!om_dtype_is_float(x->dtype) && !om_is_index_dtype(x->dtype) && !small_int(x->dtype))
        return om_err_dtype(ctx->node, 0, x->dtype);
    if (!om_is_index_dtype(ctx->in[1].dtype)) return om_err_dtype(ctx->node, 1, ctx->in[1].dtype);
    if (ctx->in[1].data) {
        int axis;
        OM_TRY(cumsum_axis(ctx, &axis));
    }
    om_set_shape(&ctx->out[0], x, small_int(x->dtype) ? OM_I64 : x->dtype);
    return NULL;
}

/* The running sum walks the axis one row of `inner` elements at a time, so the inner loop
 * is a contiguous vector add (acc += x_row; y_row = acc, or y_row = acc first when exclusive). */
// x, y are (outer, N, inner); the sum runs over N
static om_status *cumsum_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    int axis;
    OM_TRY(cumsum_axis(ctx, &axis));
    const int excl = om_attr_int(ctx->node, "exclusive", 0) != 0;
    const int rev = om_attr_int(ctx->node, "reverse", 0) != 0;
    const int64_t N = x->dims[axis], outer = dims_prod(x->dims, 0, axis);
    const int64_t inner = dims_prod(x->dims, axis + 1, x->rank);
    if (small_int(x->dtype)) {
        /* bool/uint8/int8 summed into int64 (torch's promotion); not a hot path */
        int64_t *yp = ctx->out[0].data;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                int64_t acc = 0;
                for (int64_t s = 0; s < N; s++) {
                    const int64_t k = (rev ? N - 1 - s : s), at = (o * N + k) * inner + j;
                    const int64_t v = x->dtype == OM_I8 ? ((const int8_t *)x->data)[at] : ((const uint8_t *)x->data)[at];
                    if (excl) { yp[at] = acc; acc += v; } else { acc += v; yp[at] = acc; }
                }
            }
        return NULL;
    }
    SCAN_ARITH(x->dtype, ctx->node, 0, {
        const T *xp = x->data;
        T *yp = ctx->out[0].data;
        T *acc = calloc((size_t)(inner ? inner : 1), sizeof(T));
        if (!acc) return om_error(OM_OUT_OF_MEMORY, "CumSum node '%s': out of memory", om_node_name(ctx->node));
        for (int64_t o = 0; o < outer; o++) {
            memset(acc, 0, (size_t)inner * sizeof(T));
            for (int64_t s = 0; s < N; s++) {
                const int64_t k = rev ? N - 1 - s : s;
                const T *restrict xr = xp + (o * N + k) * inner;
                T *restrict yr = yp + (o * N + k) * inner;
                T *restrict a = acc;
                if (excl) {
                    for (int64_t j = 0; j < inner; j++) { yr[j] = a[j]; a[j] += xr[j]; }
                } else {
                    for (int64_t j = 0; j < inner; j++) { a[j] += xr[j]; yr[j] = a[j]; }
                }
            }
        }
        free(acc);
    });
    return NULL;
}

static om_status *cumsum_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    const int64_t excl = om_attr_int(n, "exclusive", 0) != 0, rev = om_attr_int(n, "reverse", 0) != 0;
    int in[2] = {dy, n->in[1]};
    int dx = om_emit(c, om_op_cumsum_id, in, 2);
    if (dx < 0) return NULL;
    om_emit_attr_int(c, "exclusive", excl);
    om_emit_attr_int(c, "reverse", !rev);
    c->dx[0] = dx;
    return NULL;
}

/* ---- element-wise indexing along an axis -------------------------------------------- */

/* Walks every position p of `indices` (row-major) and calls BODY with `p` and `off`, the
 * element offset in a tensor of dims `d` (strides from d) of the same coordinates with the
 * axis coordinate replaced by the (wrapped) index. Checks the range first. */
typedef struct walk {
    int rank, axis;
    int64_t K, N;                 /* indices count, size of data's axis */
    int64_t idims[OM_MAX_RANK];   /* indices dims */
    int64_t dstride[OM_MAX_RANK]; /* data strides */
} walk;

static om_status *walk_init(const om_node *n, const om_tensor *data_like, const om_tensor *ind, walk *w) {
    if (!om_is_index_dtype(ind->dtype)) return om_err_dtype(n, 1, ind->dtype);
    if (ind->rank != data_like->rank || data_like->rank < 1)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': indices (rank %d) must have the rank of data (rank %d >= 1)",
                        n->op->name, om_node_name(n), ind->rank, data_like->rank);
    int axis;
    OM_TRY(om_norm_axis(n, om_attr_int(n, "axis", 0), data_like->rank, &axis));
    w->rank = ind->rank;
    w->axis = axis;
    w->K = om_tensor_numel(ind);
    w->N = data_like->dims[axis];
    int64_t s = 1;
    for (int i = w->rank - 1; i >= 0; i--) {
        if (i != axis && ind->dims[i] > data_like->dims[i])
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': indices dim %d (%lld) exceeds data's (%lld)",
                            n->op->name, om_node_name(n), i, (long long)ind->dims[i], (long long)data_like->dims[i]);
        w->idims[i] = ind->dims[i];
        w->dstride[i] = s;
        s *= data_like->dims[i];
    }
    for (int64_t p = 0; p < w->K; p++) {
        int64_t v = om_index_at(ind, p);
        if (v < -w->N || v >= w->N)
            return om_error(OM_RUNTIME, "%s node '%s': index %lld (at position %lld) is out of range for axis %d of size %lld",
                            n->op->name, om_node_name(n), (long long)v, (long long)p, axis, (long long)w->N);
    }
    return NULL;
}

/* Indices known at plan time (a constant) are range checked by the shape rule, which every plan
 * runs: a CUDA plan, whose kernels cannot report an index without a synchronization (an index
 * out of range reads 0 there), refuses them as the CPU kernel would. */
static om_status *check_known_indices(const om_node *n, const om_tensor *data_like, const om_tensor *ind) {
    if (!ind->data) return NULL;
    walk w;
    return walk_init(n, data_like, ind, &w);
}

/* base = data offset of the current coordinates without the axis term */
#define WALK(w, ind, BODY)                                                              \
    do {                                                                                \
        int64_t coord_[OM_MAX_RANK] = {0}, base_ = 0;                                   \
        for (int64_t p = 0; p < (w).K; p++) {                                           \
            int64_t iv_ = om_index_at((ind), p);                                             \
            if (iv_ < 0) iv_ += (w).N;                                                  \
            const int64_t off = base_ + iv_ * (w).dstride[(w).axis];                    \
            BODY;                                                                       \
            for (int d_ = (w).rank - 1; d_ >= 0; d_--) {                                \
                coord_[d_]++;                                                           \
                if (d_ != (w).axis) base_ += (w).dstride[d_];                           \
                if (coord_[d_] < (w).idims[d_]) break;                                  \
                if (d_ != (w).axis) base_ -= coord_[d_] * (w).dstride[d_];              \
                coord_[d_] = 0;                                                         \
            }                                                                           \
        }                                                                               \
    } while (0)

/* Element copy by size: GatherElements and ScatterElements(none) move any dtype. */
#define BY_SIZE(sz, node, ...)                                                  \
    switch (sz) {                                                               \
    case 1: { typedef uint8_t E; __VA_ARGS__; } break;                          \
    case 2: { typedef uint16_t E; __VA_ARGS__; } break;                         \
    case 4: { typedef uint32_t E; __VA_ARGS__; } break;                         \
    case 8: { typedef uint64_t E; __VA_ARGS__; } break;                         \
    default: return om_err_dtype((node), 0, OM_UNDEFINED);                      \
    }

static om_status *gather_elements_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1];
    if (!om_is_index_dtype(ind->dtype)) return om_err_dtype(ctx->node, 1, ind->dtype);
    if (ind->rank != x->rank || x->rank < 1)
        return om_error(OM_INVALID_ARGUMENT, "GatherElements node '%s': indices (rank %d) must have the rank of data "
                        "(rank %d >= 1)", om_node_name(ctx->node), ind->rank, x->rank);
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x->rank, &axis));
    OM_TRY(check_known_indices(ctx->node, x, ind));
    om_set_shape(&ctx->out[0], ind, x->dtype);
    return NULL;
}

// data is (d0..dr), indices and y are (i0..ir): y[p] = data[p with p[axis] = indices[p]]
static om_status *gather_elements_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1];
    walk w;
    OM_TRY(walk_init(ctx->node, x, ind, &w));
    BY_SIZE(om_dtype_size(x->dtype), ctx->node, {
        const E *xp = x->data;
        E *yp = ctx->out[0].data;
        WALK(w, ind, yp[p] = xp[off]);
    });
    return NULL;
}

static om_status *gather_elements_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    /* read before emitting: the nodes array moves as nodes are added (n would dangle) */
    const int x = n->in[0], ind = n->in[1];
    const int64_t axis = om_attr_int(n, "axis", 0);
    int shp = om_emit_shape(c, x);
    if (shp < 0) return NULL;
    int in[3] = {dy, shp, ind};
    int dx = om_emit(c, om_op_gather_elements_grad_id, in, 3);
    if (dx < 0) return NULL;
    om_emit_attr_int(c, "axis", axis);
    c->dx[0] = dx;
    return NULL;
}

static om_status *gather_elements_grad_infer(om_kernel_ctx *ctx) {
    const om_tensor *shp = &ctx->in[1];
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    if (!om_is_index_dtype(shp->dtype)) return om_err_dtype(ctx->node, 1, shp->dtype);
    if (!shp->data)
        return om_error(OM_INVALID_ARGUMENT, "GatherElementsGrad node '%s': the shape must be known at plan time",
                        om_node_name(ctx->node));
    const int64_t k = om_tensor_numel(shp);
    if (k > OM_MAX_RANK)
        return om_error(OM_INVALID_ARGUMENT, "GatherElementsGrad node '%s': rank %lld exceeds %d",
                        om_node_name(ctx->node),
                        (long long)k, OM_MAX_RANK);
    om_tensor *o = &ctx->out[0];
    o->dtype = ctx->in[0].dtype;
    o->rank = (int)k;
    for (int64_t i = 0; i < k; i++) o->dims[i] = om_index_at(shp, i);
    return om_check_shape_data(ctx->node, 1, o->dims, o->rank, o->dtype);
}

// dy and indices are (i0..ir), dx is Shape(data): dx = 0; dx[p with p[axis] = indices[p]] += dy[p]
static om_status *gather_elements_grad_cpu(om_kernel_ctx *ctx) {
    const om_tensor *dy = &ctx->in[0], *ind = &ctx->in[2];
    om_tensor *dx = &ctx->out[0];
    walk w;
    OM_TRY(walk_init(ctx->node, dx, ind, &w));
    memset(dx->data, 0, om_tensor_nbytes(dx));
    SCAN_ARITH(dy->dtype, ctx->node, 0, {
        const T *g = dy->data;
        T *d = dx->data;
        WALK(w, ind, d[off] += g[p]);
    });
    return NULL;
}

/* ---- ScatterElements ----------------------------------------------------------------- */

static om_status *scatter_elements_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1], *u = &ctx->in[2];
    if (om_scatter_reduction(ctx->node) < 0)
        return om_err_unsupported(ctx->node, "reduction other than none or add");
    if (!om_is_index_dtype(ind->dtype)) return om_err_dtype(ctx->node, 1, ind->dtype);
    if (u->dtype != x->dtype) return om_err_dtype(ctx->node, 2, u->dtype);
    if (!om_shape_equal(ind, u))
        return om_error(OM_INVALID_ARGUMENT, "ScatterElements node '%s': updates must have the shape of indices",
                        om_node_name(ctx->node));
    if (ind->rank != x->rank || x->rank < 1)
        return om_error(OM_INVALID_ARGUMENT, "ScatterElements node '%s': indices (rank %d) must have the rank of data "
                        "(rank %d >= 1)", om_node_name(ctx->node), ind->rank, x->rank);
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x->rank, &axis));
    OM_TRY(check_known_indices(ctx->node, x, ind));
    om_set_shape(&ctx->out[0], x, x->dtype);
    return NULL;
}

// data and y are (d0..dr), indices and updates are (i0..ir): y = data; y[p with p[axis] = indices[p]] (+)= updates[p]
static om_status *scatter_elements_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1], *u = &ctx->in[2];
    om_tensor *y = &ctx->out[0];
    const int red = om_scatter_reduction(ctx->node);
    if (red < 0) return om_err_unsupported(ctx->node, "reduction other than none or add");
    walk w;
    OM_TRY(walk_init(ctx->node, x, ind, &w));
    if (y->data != x->data) memcpy(y->data, x->data, om_tensor_nbytes(x));
    if (red == 0) {
        BY_SIZE(om_dtype_size(x->dtype), ctx->node, {
            const E *up = u->data;
            E *yp = y->data;
            WALK(w, ind, yp[off] = up[p]);
        });
    } else {
        SCAN_ARITH(x->dtype, ctx->node, 0, {
            const T *up = u->data;
            T *yp = y->data;
            WALK(w, ind, yp[off] += up[p]);
        });
    }
    return NULL;
}

static om_status *scatter_elements_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int dy = c->dy[0];
    if (dy < 0) return NULL;
    const int red = om_scatter_reduction(n);
    const int64_t axis = om_attr_int(n, "axis", 0);
    const int ind = n->in[1], upd = n->in[2];   /* n dangles once a node is emitted */
    if (c->need_dx[2]) {
        int in[2] = {dy, ind};
        int du = om_emit(c, om_op_gather_elements_id, in, 2);
        if (du < 0) return NULL;
        om_emit_attr_int(c, "axis", axis);
        c->dx[2] = du;
    }
    if (c->need_dx[0]) {
        if (red == 1) {
            c->dx[0] = dy;
        } else {
            int dx = om_emit_scatter_blanked(c, om_op_scatter_elements_id, dy, ind, upd);
            if (dx < 0) return NULL;
            om_emit_attr_int(c, "axis", axis);
            c->dx[0] = dx;
        }
    }
    return NULL;
}

/* ---- definitions ----------------------------------------------------------------------- */

const om_op_def om_op_cumsum = {
    .name = "CumSum", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .dtype = cumsum_dtype, .infer = cumsum_infer, .grad = cumsum_grad, .cpu = cumsum_cpu, .diff_inputs = 1,
    .attrs = "exclusive:int reverse:int",
};
const om_op_def om_op_gather_elements = {
    .name = "GatherElements", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = gather_elements_infer, .grad = gather_elements_grad, .cpu = gather_elements_cpu,
    .diff_inputs = 1,
    .attrs = "axis:int",
};
const om_op_def om_op_gather_elements_grad = {
    .name = "GatherElementsGrad", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = gather_elements_grad_infer, .cpu = gather_elements_grad_cpu,
    .attrs = "axis:int",
};
const om_op_def om_op_scatter_elements = {
    .name = "ScatterElements", .domain = "", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = scatter_elements_infer, .grad = scatter_elements_grad, .cpu = scatter_elements_cpu, .diff_inputs = 0x5,
    .attrs = "axis:int reduction:string=none|add",
};
