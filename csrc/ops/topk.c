/* topk.c — selecting and ordering along one axis: TopK, and ortmod's Sort.
 *
 * Exports (topk.list):
 *   om_op_topk   TopK   (X, K; axis, largest, sorted) -> Values, Indices (int64)
 *   om_op_sort   Sort   (ortmod) (X; axis, descending, stable) -> Values, Indices (int64):
 *                       torch.sort / torch.argsort, as ortmod's export rule writes them
 *
 * Order: eager torch's, ties included (sort_order.h): NaN is larger than every number, and
 * equal values come out where torch's CPU kernels leave them, not by lower index first as
 * ONNX's TopK says. torch.sort exports to TopK(k = the axis size) under torch's own rule, but
 * eager torch.sort orders ties differently from torch.topk(k = n) (std::sort against
 * nth_element + std::sort): ortmod's rule (ortmod/_semantics.py) exports it as Sort instead,
 * so each keeps its own order.
 *
 * K must be known at plan time (a constant, or folded from shapes: torch.topk(x, x.size(1)));
 * a K computed from run-time data is refused by name, as is K < 0 or K > the axis size.
 *
 * Gradient (both): dX = GatherElementsGrad(dValues, Shape(X), Indices): dValues scattered back
 * to where each value came from (the indices of a row are distinct), zero elsewhere — what
 * torch's value_selecting_reduction_backward gives. Indices carry no gradient.
 *
 * Kernels: float32, float64, int32, int64 on the CPU (fp16/bf16 on the CUDA provider,
 * cuda/topk.cu); rows are shared out over the pool, each with its own copy of the row and a
 * permutation of it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "ops/op.h"
#include "ops/op_util.h"
#include "ops/sort_order.h"

OM_SORT_ORDER_DEFINE(f32, float, static inline)
OM_SORT_ORDER_DEFINE(f64, double, static inline)
OM_SORT_ORDER_DEFINE(i32, int32_t, static inline)
OM_SORT_ORDER_DEFINE(i64, int64_t, static inline)

/* The axis, and K (TopK) or the axis size (Sort). */
static om_status *select_geometry(const om_kernel_ctx *ctx, int *axis, int64_t *k) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    const int is_topk = n->op_id == om_op_topk_id;
    if (x->rank == 0)
        return om_error(OM_INVALID_ARGUMENT, "the input is a scalar: there is no axis to order along");
    OM_TRY(om_norm_axis(n, om_attr_int(n, "axis", -1), x->rank, axis));
    const int64_t size = x->dims[*axis];
    if (!is_topk) {
        *k = size;
        return NULL;
    }
    const om_tensor *kt = &ctx->in[1];
    if (kt->dtype != OM_I64 && kt->dtype != OM_I32) return om_err_dtype(n, 1, kt->dtype);
    if (om_tensor_numel(kt) != 1)
        return om_error(OM_INVALID_ARGUMENT, "K must hold one value, it holds %lld", (long long)om_tensor_numel(kt));
    if (!kt->data)
        return om_error(OM_UNSUPPORTED_OP, "K is computed from run-time data; ortmod needs K known at plan time "
                        "(a constant, or a number from the input's shape)");
    int64_t kv = 0;
    om_read_ints(kt, &kv, 1);
    if (kv < 0 || kv > size)
        return om_error(OM_INVALID_ARGUMENT, "K = %lld, but axis %d has %lld elements", (long long)kv, *axis,
                        (long long)size);
    *k = kv;
    return NULL;
}

static om_status *select_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    OM_TRY(om_check_dtype(ctx->node, x, 0, OM_DT_ARITH));
    int axis;
    int64_t k;
    OM_TRY(select_geometry(ctx, &axis, &k));
    om_set_shape(&ctx->out[0], x, x->dtype);
    ctx->out[0].dims[axis] = k;
    if (ctx->n_out > 1) {
        om_set_shape(&ctx->out[1], x, OM_I64);
        ctx->out[1].dims[axis] = k;
    }
    return NULL;
}

static om_dtype select_dtype(const om_graph *g, const om_node *n, int out_index) {
    return out_index == 1 ? OM_I64 : g->values[n->in[0]].dtype;
}

/* ---- the kernel ------------------------------------------------------------------------ */

enum { SEL_TOPK, SEL_SORT, SEL_STABLE };

typedef struct select_job {
    const void *x;
    void *values;                /* (outer, k, inner) */
    int64_t *indices;            /* (outer, k, inner), or NULL when not wanted */
    int64_t n, k, inner;         /* x is (outer, n, inner) */
    int mode, desc, sorted;
    om_dtype dt;
    int failed;                  /* a range could not get its scratch */
} select_job;

// x is (outer, n, inner); row r = (o, i) is x[o, :, i], its k selected values go to values[o, :, i]
#define SELECT_ROWS(SFX, T)                                                                      \
    static void select_rows_##SFX(const select_job *j, int64_t lo, int64_t hi, T *row, int64_t *p, \
                                  int64_t *tmp) {                                                \
        const T *x = j->x;                                                                       \
        T *vals = j->values;                                                                     \
        for (int64_t r = lo; r < hi; r++) {                                                      \
            const int64_t o = r / j->inner, i = r % j->inner;                                    \
            const T *src = x + o * j->n * j->inner + i;                                          \
            for (int64_t e = 0; e < j->n; e++) {                                                 \
                row[e] = src[e * j->inner];                                                      \
                p[e] = e;                                                                        \
            }                                                                                    \
            if (j->mode == SEL_TOPK) om_so_topk_##SFX(row, p, j->n, j->k, j->desc, j->sorted);   \
            else if (j->mode == SEL_SORT) om_so_sort_##SFX(row, p, j->n, j->desc);               \
            else om_so_stable_sort_##SFX(row, p, tmp, j->n, j->desc);                            \
            const int64_t dst = o * j->k * j->inner + i;                                         \
            for (int64_t e = 0; e < j->k; e++) {                                                 \
                vals[dst + e * j->inner] = row[p[e]];                                            \
                if (j->indices) j->indices[dst + e * j->inner] = p[e];                           \
            }                                                                                    \
        }                                                                                        \
    }
SELECT_ROWS(f32, float)
SELECT_ROWS(f64, double)
SELECT_ROWS(i32, int32_t)
SELECT_ROWS(i64, int64_t)

static void select_range(void *c, int64_t lo, int64_t hi) {
    select_job *j = c;
    const size_t n = (size_t)j->n;
    char *scratch = malloc(n * (om_dtype_size(j->dt) + 2 * sizeof(int64_t)) + 1);
    if (!scratch) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    int64_t *p = (int64_t *)scratch, *tmp = p + n;
    void *row = tmp + n;
    switch (j->dt) {
    case OM_F32: select_rows_f32(j, lo, hi, row, p, tmp); break;
    case OM_F64: select_rows_f64(j, lo, hi, row, p, tmp); break;
    case OM_I32: select_rows_i32(j, lo, hi, row, p, tmp); break;
    default: select_rows_i64(j, lo, hi, row, p, tmp); break;
    }
    free(scratch);
}

static om_status *select_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    const om_node *n = ctx->node;
    int axis;
    int64_t k;
    OM_TRY(select_geometry(ctx, &axis, &k));
    if (x->dtype != OM_F32 && x->dtype != OM_F64 && x->dtype != OM_I32 && x->dtype != OM_I64)
        return om_err_dtype(n, 0, x->dtype);
    select_job j = {0};
    j.x = x->data;
    j.values = ctx->out[0].data;
    j.indices = ctx->n_out > 1 ? ctx->out[1].data : NULL;
    j.n = x->dims[axis];
    j.k = k;
    j.inner = 1;
    int64_t outer = 1;
    for (int d = 0; d < x->rank; d++) {
        if (d < axis) outer *= x->dims[d];
        else if (d > axis) j.inner *= x->dims[d];
    }
    j.dt = x->dtype;
    if (n->op_id == om_op_topk_id) {
        j.mode = SEL_TOPK;
        j.desc = om_attr_int(n, "largest", 1) != 0;
        j.sorted = om_attr_int(n, "sorted", 1) != 0;
    } else {
        j.mode = om_attr_int(n, "stable", 0) ? SEL_STABLE : SEL_SORT;
        j.desc = om_attr_int(n, "descending", 0) != 0;
    }
    const int64_t rows = outer * j.inner;
    if (k == 0 || rows == 0) return NULL;
    void *values_scratch = NULL;
    if (!j.values) {   /* only Indices wanted (argsort): the values still need somewhere to go */
        values_scratch = j.values = malloc((size_t)(rows * k) * om_dtype_size(x->dtype));
        if (!values_scratch) return om_error(OM_OUT_OF_MEMORY, "out of memory in %s", om_node_name(n));
    }
    om_pool_for(rows, OM_GRAIN / (j.n > 0 ? j.n : 1) + 1, select_range, &j);
    free(values_scratch);
    if (j.failed) return om_error(OM_OUT_OF_MEMORY, "out of memory for a row of %lld in %s", (long long)j.n,
                                  om_node_name(n));
    return NULL;
}

/* ---- gradient ------------------------------------------------------------------------ */

static om_status *select_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    /* read before emitting: the nodes array moves as nodes are added */
    const int x = n->in[0], ind = n->n_out > 1 ? n->out[1] : -1;
    const int64_t axis = om_attr_int(n, "axis", -1);
    if (ind < 0)
        return om_grad_fail(c, om_error(OM_UNSUPPORTED_OP, "%s node '%s': the gradient needs the Indices output",
                                        n->op->name, om_node_name(n)));
    int shp = om_emit_shape(c, x);
    if (shp < 0) return NULL;
    int in[3] = {dy, shp, ind};
    int dx = om_emit(c, om_op_gather_elements_grad_id, in, 3);
    if (dx < 0) return NULL;
    om_emit_attr_int(c, "axis", axis);   /* GatherElementsGrad wraps a negative axis */
    c->dx[0] = dx;
    return NULL;
}

const om_op_def om_op_topk = {
    .name = "TopK", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 2,
    .dtype = select_dtype, .infer = select_infer, .grad = select_grad, .cpu = select_cpu, .diff_inputs = 1,
    .attrs = "axis:int largest:int sorted:int",
};
const om_op_def om_op_sort = {
    .name = "Sort", .domain = "ortmod", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 2,
    .dtype = select_dtype, .infer = select_infer, .grad = select_grad, .cpu = select_cpu, .diff_inputs = 1,
    .attrs = "axis:int descending:int stable:int",
};
