/* reduce.c — reductions over a set of axes, and their gradients.
 *
 * Exports (shape.list):
 *   om_op_reduce_sum           ReduceSum
 *   om_op_reduce_mean          ReduceMean
 *   om_op_reduce_max           ReduceMax
 *   om_op_reduce_min           ReduceMin
 *   om_op_reduce_prod          ReduceProd          (no gradient rule)
 *   om_op_reduce_l1            ReduceL1            sum |x|            } float dtypes only; gradients
 *   om_op_reduce_l2            ReduceL2            sqrt(sum x^2)      } by ReduceValueGrad, with
 *   om_op_reduce_sum_square    ReduceSumSquare     sum x^2            } torch's rules at 0, inf, NaN
 *   om_op_reduce_log_sum_exp   ReduceLogSumExp     log sum exp x, max-shifted as torch.logsumexp
 *   om_op_reduce_grad          ReduceGrad          (ortmod) dy broadcast back to Shape(x), / count if mean
 *   om_op_reduce_min_max_grad  ReduceMinMaxGrad    (ortmod) dy routed to the extremal elements, ties share
 *   om_op_reduce_value_grad    ReduceValueGrad     (ortmod) (dy, Shape(x), x, y [, axes]; reduction): the
 *                                                  gradients of L1, L2, SumSquare and LogSumExp
 *   om_op_arg_max              ArgMax              axis, keepdims, select_last_index -> int64
 *   om_op_arg_min              ArgMin              (no gradient: an index)
 *
 * Semantics are opset 18's for all of them (axes as an optional int64 input, attributes
 * keepdims=1 and noop_with_empty_axes=0); the "axes" attribute of older opsets is read
 * when there is no axes input. Axes must be known at plan time. The rules take every float
 * dtype (fp16/bf16 for the CUDA kernels) and int32/int64; the CPU kernels take float32,
 * float64, int32 and int64 (ints appear when shape arithmetic is folded at plan time).
 *
 * Every reduction uses one plan (reduce_plan): the input's dims with size-1 dims dropped
 * and neighbouring dims of the same kind (reduced / kept) merged, so the input is walked
 * once, in memory order, as runs of the innermost group. A run is either reduced to one
 * output element (reducing the last axes: a contiguous sum) or folded elementwise into a
 * row of the output (reducing leading axes: a vectorizable y[j] += x[j]).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/op.h"
#include "ops/op_util.h"

/* ---- the plan ---------------------------------------------------------------------- */

typedef struct reduce_plan {
    int k;                       /* groups after merging (>= 1) */
    int64_t gs[OM_MAX_RANK];     /* group sizes */
    int red[OM_MAX_RANK];        /* 1: group is reduced */
    int64_t ost[OM_MAX_RANK];    /* output element stride of each group (0 when reduced) */
    int64_t outer, inner;        /* runs (product of groups but the last), run length */
    int64_t n_red;               /* elements reduced into each output element */
} reduce_plan;

static void reduce_plan_init(reduce_plan *p, int rank, const int64_t *dims, const int *red) {
    p->k = 0;
    p->n_red = 1;
    for (int i = 0; i < rank; i++) {
        if (red[i]) p->n_red *= dims[i];
        if (dims[i] == 1) continue;
        if (p->k > 0 && p->red[p->k - 1] == red[i]) {
            p->gs[p->k - 1] *= dims[i];
        } else {
            p->gs[p->k] = dims[i];
            p->red[p->k] = red[i];
            p->k++;
        }
    }
    if (p->k == 0) {   /* a single element */
        p->gs[0] = 1;
        p->red[0] = 0;
        p->k = 1;
    }
    int64_t s = 1;
    for (int g = p->k - 1; g >= 0; g--) {
        p->ost[g] = p->red[g] ? 0 : s;
        if (!p->red[g]) s *= p->gs[g];
    }
    p->inner = p->gs[p->k - 1];
    p->outer = 1;
    for (int g = 0; g < p->k - 1; g++) p->outer *= p->gs[g];
}

/* Advances the odometer over the outer groups; returns the new output offset. */
static inline int64_t plan_next(const reduce_plan *p, int64_t *idx, int64_t ooff) {
    for (int g = p->k - 2; g >= 0; g--) {
        ooff += p->ost[g];
        if (++idx[g] < p->gs[g]) return ooff;
        ooff -= p->ost[g] * p->gs[g];
        idx[g] = 0;
    }
    return ooff;
}

/* ---- axes and shapes --------------------------------------------------------------- */

/* The reduced-axes mask of a reduction over rank dims. Axes come from input axes_input
 * (when present; it must be known at plan time), else the "axes" attribute; none or empty
 * means all axes, or none at all when noop_with_empty_axes is set. */
static om_status *reduce_mask(const om_kernel_ctx *ctx, int axes_input, int rank, int *red) {
    const om_node *n = ctx->node;
    int64_t axes[OM_MAX_RANK];
    int count = 0;
    if (axes_input < ctx->n_in && ctx->in[axes_input].dtype != OM_UNDEFINED) {
        const om_tensor *t = &ctx->in[axes_input];
        if (t->dtype != OM_I64 && t->dtype != OM_I32) return om_err_dtype(n, axes_input, t->dtype);
        int64_t k = om_tensor_numel(t);
        if (k > 0 && !t->data)
            return om_node_error(n, OM_UNSUPPORTED_OP, "axes must be known at plan time, but they are computed from run-time data");
        if (k > OM_MAX_RANK) return om_node_error(n, OM_INVALID_ARGUMENT, "%lld axes given", (long long)k);
        count = om_read_ints(t, axes, OM_MAX_RANK);
        if (count < 0) count = 0;
    } else {
        const int64_t *v;
        int k = om_attr_ints(n, "axes", &v);
        if (k > OM_MAX_RANK) return om_node_error(n, OM_INVALID_ARGUMENT, "%d axes given", k);
        for (int i = 0; i < k; i++) axes[i] = v[i];
        count = k > 0 ? k : 0;
    }
    for (int i = 0; i < rank; i++) red[i] = 0;
    if (count == 0) {
        if (!om_attr_int(n, "noop_with_empty_axes", 0))
            for (int i = 0; i < rank; i++) red[i] = 1;
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        int a;
        OM_TRY(om_norm_axis(n, axes[i], rank, &a));
        if (rank == 0) continue;   /* a scalar: axis -1/0 names nothing to reduce */
        red[a] = 1;
    }
    return NULL;
}

static om_status *reduce_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    int red[OM_MAX_RANK];
    OM_TRY(om_check_dtype(ctx->node, x, 0, OM_DT_ARITH));
    OM_TRY(reduce_mask(ctx, 1, x->rank, red));
    const int keep = om_attr_int(ctx->node, "keepdims", 1) != 0;
    y->dtype = x->dtype;
    y->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (!red[i]) y->dims[y->rank++] = x->dims[i];
        else if (keep) y->dims[y->rank++] = 1;
    }
    return NULL;
}

/* ---- forward kernels --------------------------------------------------------------- */

enum { RED_SUM, RED_MEAN, RED_MAX, RED_MIN, RED_PROD, RED_L1, RED_L2, RED_SUMSQ };

/* Per dtype: fold a run into one output element (row) or elementwise into an output row
 * (vec). Sums of a run use 8 partial accumulators so the loop vectorizes without
 * -ffast-math; max/min propagate NaN (as torch does). */
#define DEFINE_FOLDS(T, SFX)                                                                       \
    static void sum_row_##SFX(T *y, const T *restrict x, int64_t n) {                              \
        T acc[8] = {0};                                                                            \
        int64_t j = 0;                                                                             \
        for (; j + 8 <= n; j += 8)                                                                 \
            for (int l = 0; l < 8; l++) acc[l] += x[j + l];                                        \
        T s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));   \
        for (; j < n; j++) s += x[j];                                                              \
        *y += s;                                                                                   \
    }                                                                                              \
    static void sum_vec_##SFX(T *restrict y, const T *restrict x, int64_t n) {                     \
        for (int64_t j = 0; j < n; j++) y[j] += x[j];                                              \
    }                                                                                              \
    /* |x| and x*x summed in T, as torch's norms do in float32 (a norm of 1e20s overflows there \
     * too); |x| as x < 0 ? -x : x keeps NaN */                                                    \
    static void l1_row_##SFX(T *y, const T *restrict x, int64_t n) {                               \
        T acc[8] = {0};                                                                            \
        int64_t j = 0;                                                                             \
        for (; j + 8 <= n; j += 8)                                                                 \
            for (int l = 0; l < 8; l++) acc[l] += x[j + l] < 0 ? -x[j + l] : x[j + l];             \
        T s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));   \
        for (; j < n; j++) s += x[j] < 0 ? -x[j] : x[j];                                           \
        *y += s;                                                                                   \
    }                                                                                              \
    static void l1_vec_##SFX(T *restrict y, const T *restrict x, int64_t n) {                      \
        for (int64_t j = 0; j < n; j++) y[j] += x[j] < 0 ? -x[j] : x[j];                           \
    }                                                                                              \
    static void sq_row_##SFX(T *y, const T *restrict x, int64_t n) {                               \
        T acc[8] = {0};                                                                            \
        int64_t j = 0;                                                                             \
        for (; j + 8 <= n; j += 8)                                                                 \
            for (int l = 0; l < 8; l++) acc[l] += x[j + l] * x[j + l];                             \
        T s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));   \
        for (; j < n; j++) s += x[j] * x[j];                                                       \
        *y += s;                                                                                   \
    }                                                                                              \
    static void sq_vec_##SFX(T *restrict y, const T *restrict x, int64_t n) {                      \
        for (int64_t j = 0; j < n; j++) y[j] += x[j] * x[j];                                       \
    }                                                                                              \
    static void prod_row_##SFX(T *y, const T *restrict x, int64_t n) {                             \
        T s = *y;                                                                                  \
        for (int64_t j = 0; j < n; j++) s *= x[j];                                                 \
        *y = s;                                                                                    \
    }                                                                                              \
    static void prod_vec_##SFX(T *restrict y, const T *restrict x, int64_t n) {                    \
        for (int64_t j = 0; j < n; j++) y[j] *= x[j];                                              \
    }                                                                                              \
    static void max_row_##SFX(T *y, const T *restrict x, int64_t n) {                              \
        T m = *y;                                                                                  \
        for (int64_t j = 0; j < n; j++) m = (x[j] > m || x[j] != x[j]) ? x[j] : m;                 \
        *y = m;                                                                                    \
    }                                                                                              \
    static void max_vec_##SFX(T *restrict y, const T *restrict x, int64_t n) {                     \
        for (int64_t j = 0; j < n; j++) y[j] = (x[j] > y[j] || x[j] != x[j]) ? x[j] : y[j];        \
    }                                                                                              \
    static void min_row_##SFX(T *y, const T *restrict x, int64_t n) {                              \
        T m = *y;                                                                                  \
        for (int64_t j = 0; j < n; j++) m = (x[j] < m || x[j] != x[j]) ? x[j] : m;                 \
        *y = m;                                                                                    \
    }                                                                                              \
    static void min_vec_##SFX(T *restrict y, const T *restrict x, int64_t n) {                     \
        for (int64_t j = 0; j < n; j++) y[j] = (x[j] < y[j] || x[j] != x[j]) ? x[j] : y[j];        \
    }                                                                                              \
    /* y (n_out elements) = reduction of x over the plan's reduced groups */                       \
    static void reduce_##SFX(const reduce_plan *p, int kind, const T *x, T *y, int64_t n_out,      \
                             T lowest, T highest) {                                                \
        void (*row)(T *, const T *, int64_t), (*vec)(T *, const T *, int64_t);                     \
        T init;                                                                                    \
        switch (kind) {                                                                            \
        case RED_MAX: row = max_row_##SFX, vec = max_vec_##SFX, init = lowest; break;              \
        case RED_MIN: row = min_row_##SFX, vec = min_vec_##SFX, init = highest; break;             \
        case RED_PROD: row = prod_row_##SFX, vec = prod_vec_##SFX, init = 1; break;                \
        case RED_L1: row = l1_row_##SFX, vec = l1_vec_##SFX, init = 0; break;                      \
        case RED_L2: case RED_SUMSQ: row = sq_row_##SFX, vec = sq_vec_##SFX, init = 0; break;      \
        default: row = sum_row_##SFX, vec = sum_vec_##SFX, init = 0; break;                        \
        }                                                                                          \
        for (int64_t i = 0; i < n_out; i++) y[i] = init;                                           \
        const int inner_red = p->red[p->k - 1];                                                    \
        int64_t idx[OM_MAX_RANK] = {0}, ooff = 0;                                                  \
        for (int64_t t = 0; t < p->outer; t++) {                                                   \
            if (inner_red) row(y + ooff, x + t * p->inner, p->inner);                              \
            else vec(y + ooff, x + t * p->inner, p->inner);                                        \
            ooff = plan_next(p, idx, ooff);                                                        \
        }                                                                                          \
    }

DEFINE_FOLDS(float, f32)
DEFINE_FOLDS(double, f64)
DEFINE_FOLDS(int32_t, i32)
DEFINE_FOLDS(int64_t, i64)

// x is (d0, ..., dr-1); y has the reduced dims removed (or kept as 1)
static om_status *reduce_run(om_kernel_ctx *ctx, int kind) {
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    int red[OM_MAX_RANK];
    OM_TRY(reduce_mask(ctx, 1, x->rank, red));
    reduce_plan p;
    reduce_plan_init(&p, x->rank, x->dims, red);
    const int64_t n_out = om_tensor_numel(y);
    if (om_tensor_numel(x) == 0) p.outer = 0;   /* reducing an empty set: y = identity */
    switch (x->dtype) {
    case OM_F32: {
        float *yp = y->data;
        reduce_f32(&p, kind, x->data, yp, n_out, -INFINITY, INFINITY);
        if (kind == RED_MEAN)
            for (int64_t i = 0; i < n_out; i++) yp[i] = (float)((double)yp[i] / (double)p.n_red);
        if (kind == RED_L2)
            for (int64_t i = 0; i < n_out; i++) yp[i] = sqrtf(yp[i]);
    } break;
    case OM_F64: {
        double *yp = y->data;
        reduce_f64(&p, kind, x->data, yp, n_out, -INFINITY, INFINITY);
        if (kind == RED_MEAN)
            for (int64_t i = 0; i < n_out; i++) yp[i] /= (double)p.n_red;
        if (kind == RED_L2)
            for (int64_t i = 0; i < n_out; i++) yp[i] = sqrt(yp[i]);
    } break;
    case OM_I32: {
        int32_t *yp = y->data;
        reduce_i32(&p, kind, x->data, yp, n_out, INT32_MIN, INT32_MAX);
        if (kind == RED_MEAN && p.n_red > 0)
            for (int64_t i = 0; i < n_out; i++) yp[i] = (int32_t)(yp[i] / p.n_red);
    } break;
    case OM_I64: {
        int64_t *yp = y->data;
        reduce_i64(&p, kind, x->data, yp, n_out, INT64_MIN, INT64_MAX);
        if (kind == RED_MEAN && p.n_red > 0)
            for (int64_t i = 0; i < n_out; i++) yp[i] /= p.n_red;
    } break;
    default: return om_err_dtype(ctx->node, 0, x->dtype);
    }
    return NULL;
}

static om_status *reduce_sum_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_SUM); }
static om_status *reduce_mean_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_MEAN); }
static om_status *reduce_max_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_MAX); }
static om_status *reduce_min_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_MIN); }
static om_status *reduce_prod_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_PROD); }
static om_status *reduce_l1_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_L1); }
static om_status *reduce_l2_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_L2); }
static om_status *reduce_sum_square_cpu(om_kernel_ctx *ctx) { return reduce_run(ctx, RED_SUMSQ); }

/* The float reductions (L1, L2, SumSquare, LogSumExp): float dtypes only. */
static om_status *reduce_float_infer(om_kernel_ctx *ctx) {
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    return reduce_infer(ctx);
}

/* LogSumExp as torch.logsumexp computes it: m = max (NaN wins), an infinite m taken as 0 (so
 * all -inf gives log 0 = -inf and any +inf gives +inf, never inf - inf), then
 * log(sum exp(x - m)) + m; the sum of exp (each <= 1) in float64. An empty set gives -inf. */
#define DEFINE_LSE(T, SFX)                                                                         \
    static void lse_sum_##SFX(const reduce_plan *p, const T *x, const T *m, double *s) {          \
        const int inner_red = p->red[p->k - 1];                                                    \
        int64_t idx[OM_MAX_RANK] = {0}, ooff = 0;                                                  \
        for (int64_t t = 0; t < p->outer; t++) {                                                   \
            const T *restrict r = x + t * p->inner;                                                \
            if (inner_red) {                                                                       \
                const T mv = m[ooff];                                                              \
                double acc = 0;                                                                    \
                for (int64_t j = 0; j < p->inner; j++) acc += exp((double)(T)(r[j] - mv));         \
                s[ooff] += acc;                                                                    \
            } else {                                                                               \
                for (int64_t j = 0; j < p->inner; j++) s[ooff + j] += exp((double)(T)(r[j] - m[ooff + j])); \
            }                                                                                      \
            ooff = plan_next(p, idx, ooff);                                                        \
        }                                                                                          \
    }
DEFINE_LSE(float, f32)
DEFINE_LSE(double, f64)

// x is (d0, ..., dr-1); y has the reduced dims removed (or kept as 1)
static om_status *reduce_log_sum_exp_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    int red[OM_MAX_RANK];
    OM_TRY(reduce_mask(ctx, 1, x->rank, red));
    reduce_plan p;
    reduce_plan_init(&p, x->rank, x->dims, red);
    const int64_t n_out = om_tensor_numel(y);
    if (om_tensor_numel(x) == 0) p.outer = 0;
    double *s = calloc((size_t)(n_out ? n_out : 1), sizeof *s);
    if (!s) return om_error(OM_OUT_OF_MEMORY, "out of memory in %s", ctx->node->name);
    switch (x->dtype) {
    case OM_F32: {
        float *m = y->data;
        reduce_f32(&p, RED_MAX, x->data, m, n_out, -INFINITY, INFINITY);
        for (int64_t i = 0; i < n_out; i++) if (isinf(m[i])) m[i] = 0;
        lse_sum_f32(&p, x->data, m, s);
        for (int64_t i = 0; i < n_out; i++) m[i] = (float)(log(s[i]) + (double)m[i]);
    } break;
    case OM_F64: {
        double *m = y->data;
        reduce_f64(&p, RED_MAX, x->data, m, n_out, -INFINITY, INFINITY);
        for (int64_t i = 0; i < n_out; i++) if (isinf(m[i])) m[i] = 0;
        lse_sum_f64(&p, x->data, m, s);
        for (int64_t i = 0; i < n_out; i++) m[i] = log(s[i]) + m[i];
    } break;
    default: free(s); return om_err_dtype(ctx->node, 0, x->dtype);
    }
    free(s);
    return NULL;
}

/* ---- gradient rules ---------------------------------------------------------------- */

/* Emits op_type(dy, Shape(x) [, x, y] [, axes]) with the forward's reduction attributes.
 * The axes input sits last: index 2 for ReduceGrad, 4 for ReduceMinMaxGrad. */
static om_status *reduce_grad_common(om_grad_ctx *c, om_op_id op_type, int mean, int with_xy) {
    const om_node *n = &c->g->nodes[c->node];
    const int x = n->in[0], y = n->out[0], axes = n->n_in > 1 ? n->in[1] : -1, dy = c->dy[0];
    const int64_t keep = om_attr_int(n, "keepdims", 1), noop = om_attr_int(n, "noop_with_empty_axes", 0);
    const int64_t *av;
    int64_t attr_axes[OM_MAX_RANK];
    int na = om_attr_ints(n, "axes", &av);   /* copied: n moves as nodes are emitted */
    if (na > OM_MAX_RANK) return om_grad_fail(c, om_node_error(n, OM_INVALID_ARGUMENT, "%d axes given", na));
    for (int i = 0; i < na; i++) attr_axes[i] = av[i];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    int in[5], k = 0;
    in[k++] = dy;
    if ((in[k++] = om_emit_shape(c, x)) < 0) return NULL;
    if (with_xy) {
        in[k++] = x;
        in[k++] = y;
    }
    if (axes >= 0) in[k++] = axes;
    int dx = om_emit(c, op_type, in, k);
    if (dx < 0) return NULL;
    om_emit_attr_int(c, "keepdims", keep);
    om_emit_attr_int(c, "noop_with_empty_axes", noop);
    if (mean) om_emit_attr_int(c, "mean", 1);
    if (axes < 0 && na > 0) om_emit_attr_ints(c, "axes", attr_axes, na);
    c->dx[0] = dx;
    return NULL;
}

static om_status *reduce_sum_grad(om_grad_ctx *c) { return reduce_grad_common(c, om_op_reduce_grad_id, 0, 0); }
static om_status *reduce_mean_grad(om_grad_ctx *c) { return reduce_grad_common(c, om_op_reduce_grad_id, 1, 0); }
static om_status *reduce_min_max_grad(om_grad_ctx *c) { return reduce_grad_common(c, om_op_reduce_min_max_grad_id, 0, 1); }
/* L1, L2, SumSquare, LogSumExp: ReduceValueGrad(dy, Shape(x), x, y [, axes]) with the forward's
 * op name in "reduction" */
static om_status *reduce_value_grad(om_grad_ctx *c) {
    const char *op = c->g->nodes[c->node].op->name;   /* a static string: stays valid */
    OM_TRY(reduce_grad_common(c, om_op_reduce_value_grad_id, 0, 1));
    if (c->dx[0] >= 0) om_emit_attr_string(c, "reduction", op);
    return NULL;
}

/* ---- ReduceGrad: dx = broadcast(dy) (/ n for a mean) ------------------------------- */

static om_status *shape_from_input(om_kernel_ctx *ctx, int i, om_tensor *out, om_dtype dt) {
    const om_tensor *s = &ctx->in[i];
    if (s->dtype != OM_I64) return om_err_dtype(ctx->node, i, s->dtype);
    int64_t k = om_tensor_numel(s);
    if (k > 0 && !s->data) return om_node_error(ctx->node, OM_UNSUPPORTED_OP, "shape input %d must be known at plan time", i);
    if (k > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "rank %lld exceeds %d", (long long)k, OM_MAX_RANK);
    out->dtype = dt;
    out->rank = (int)k;
    for (int j = 0; j < (int)k; j++) out->dims[j] = ((const int64_t *)s->data)[j];
    return om_check_shape_data(ctx->node, i, out->dims, out->rank, dt);   /* before reduce_plan_init multiplies */
}

static om_status *reduce_grad_infer(om_kernel_ctx *ctx) {
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    OM_TRY(shape_from_input(ctx, 1, &ctx->out[0], ctx->in[0].dtype));
    int red[OM_MAX_RANK];
    OM_TRY(reduce_mask(ctx, 2, ctx->out[0].rank, red));
    reduce_plan p;
    reduce_plan_init(&p, ctx->out[0].rank, ctx->out[0].dims, red);
    int64_t n_out = 1;
    for (int i = 0; i < ctx->out[0].rank; i++) n_out *= red[i] ? 1 : ctx->out[0].dims[i];
    if (om_tensor_numel(&ctx->in[0]) != n_out)
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "dy has %lld elements, the reduction has %lld",
                          (long long)om_tensor_numel(&ctx->in[0]), (long long)n_out);
    return NULL;
}

/* dy keeps its linear layout whether or not the reduced dims were kept (they are 1), so
 * keepdims needs no work here. */
#define DEFINE_BCAST(T, SFX)                                                                       \
    static void reduce_grad_##SFX(const reduce_plan *p, const T *restrict dy, T *restrict dx,     \
                                  T scale) {                                                       \
        const int inner_red = p->red[p->k - 1];                                                    \
        const int64_t n = p->inner;                                                                \
        int64_t idx[OM_MAX_RANK] = {0}, ooff = 0;                                                  \
        for (int64_t t = 0; t < p->outer; t++) {                                                   \
            T *restrict d = dx + t * n;                                                            \
            if (inner_red) {                                                                       \
                const T v = dy[ooff] * scale;                                                      \
                for (int64_t j = 0; j < n; j++) d[j] = v;                                          \
            } else {                                                                               \
                const T *restrict s = dy + ooff;                                                   \
                for (int64_t j = 0; j < n; j++) d[j] = s[j] * scale;                               \
            }                                                                                      \
            ooff = plan_next(p, idx, ooff);                                                        \
        }                                                                                          \
    }

DEFINE_BCAST(float, f32)
DEFINE_BCAST(double, f64)

// dy is the reduction's output, dx is Shape(x)
static om_status *reduce_grad_cpu(om_kernel_ctx *ctx) {
    om_tensor *dx = &ctx->out[0];
    int red[OM_MAX_RANK];
    OM_TRY(reduce_mask(ctx, 2, dx->rank, red));
    reduce_plan p;
    reduce_plan_init(&p, dx->rank, dx->dims, red);
    if (om_tensor_numel(dx) == 0) return NULL;
    const double scale = om_attr_int(ctx->node, "mean", 0) ? 1.0 / (double)p.n_red : 1.0;
    switch (ctx->in[0].dtype) {
    case OM_F32: reduce_grad_f32(&p, ctx->in[0].data, dx->data, (float)scale); break;
    case OM_F64: reduce_grad_f64(&p, ctx->in[0].data, dx->data, scale); break;
    default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    }
    return NULL;
}

/* ---- ReduceMinMaxGrad: dx = (x == y) * dy / (number of ties) ----------------------- */

static om_status *reduce_min_max_grad_infer(om_kernel_ctx *ctx) {
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    for (int i = 2; i < 4; i++) OM_TRY(om_check_float(ctx->node, &ctx->in[i], i, ctx->in[0].dtype));
    OM_TRY(shape_from_input(ctx, 1, &ctx->out[0], ctx->in[0].dtype));
    int red[OM_MAX_RANK];
    return reduce_mask(ctx, 4, ctx->out[0].rank, red);
}

// dy, y are the reduction's output (n_out elements), x and dx are (d0, ..., dr-1)
static om_status *reduce_min_max_grad_cpu(om_kernel_ctx *ctx) {
    om_tensor *dx = &ctx->out[0];
    int red[OM_MAX_RANK];
    OM_TRY(reduce_mask(ctx, 4, dx->rank, red));
    reduce_plan p;
    reduce_plan_init(&p, dx->rank, dx->dims, red);
    const int64_t n_out = om_tensor_numel(&ctx->in[3]);
    if (om_tensor_numel(dx) == 0) return NULL;
    /* ties share the gradient equally (torch.amax's rule): count them first */
    double *count = calloc((size_t)(n_out ? n_out : 1), sizeof *count);
    if (!count) return om_error(OM_OUT_OF_MEMORY, "out of memory in %s", ctx->node->name);
    OM_DISPATCH_FLOAT(ctx->in[0].dtype, ctx->node, {
        const T *dy = ctx->in[0].data;
        const T *x = ctx->in[2].data;
        const T *y = ctx->in[3].data;
        T *d = dx->data;
        for (int pass = 0; pass < 2; pass++) {
            int64_t idx[OM_MAX_RANK] = {0};
            int64_t ooff = 0;
            for (int64_t t = 0; t < p.outer; t++) {
                const int64_t base = t * p.inner;
                const int step = !p.red[p.k - 1];   /* output advances with the run when kept */
                for (int64_t j = 0; j < p.inner; j++) {
                    const int64_t o = ooff + j * step;
                    const int hit = x[base + j] == y[o] || (x[base + j] != x[base + j] && y[o] != y[o]);
                    if (pass == 0) count[o] += hit;
                    else d[base + j] = hit ? (T)(dy[o] / count[o]) : (T)0;
                }
                ooff = plan_next(&p, idx, ooff);
            }
        }
    });
    free(count);
    return NULL;
}

/* ---- ReduceValueGrad: dx from dy, x and y, elementwise ------------------------------
 * torch's formulas (FunctionsManual.cpp), in torch's order of operations:
 *   ReduceL1         dx = sgn(x) * dy          sgn(NaN) = 0, as torch.sgn
 *   ReduceL2         dx = dy * (x / y), 0 where y == 0 (norm_backward's subgradient at 0)
 *   ReduceSumSquare  dx = dy * (x + x)
 *   ReduceLogSumExp  dx = dy * exp(x - y)      (logsumexp_backward) */

enum { VG_L1, VG_L2, VG_SUMSQ, VG_LSE };

static int value_grad_kind(const om_node *n) {
    /* "reduction" names the forward op, as its ONNX name (the attribute is exported) */
    const char *r = om_attr_string(n, "reduction", "");
    if (strcmp(r, om_op_get(om_op_reduce_l1_id)->name) == 0) return VG_L1;
    if (strcmp(r, om_op_get(om_op_reduce_l2_id)->name) == 0) return VG_L2;
    if (strcmp(r, om_op_get(om_op_reduce_sum_square_id)->name) == 0) return VG_SUMSQ;
    if (strcmp(r, om_op_get(om_op_reduce_log_sum_exp_id)->name) == 0) return VG_LSE;
    return -1;
}

static om_status *reduce_value_grad_infer(om_kernel_ctx *ctx) {
    if (value_grad_kind(ctx->node) < 0)
        return om_node_error(ctx->node, OM_UNSUPPORTED_OP, "reduction '%s' has no gradient here",
                          om_attr_string(ctx->node, "reduction", ""));
    return reduce_min_max_grad_infer(ctx);
}

#define VALUE_GRAD(T, kind, xv, yv, g)                                                           \
    ((kind) == VG_L1    ? (T)(((xv) > 0 ? (T)1 : (xv) < 0 ? (T)-1 : (T)0) * (g))                 \
     : (kind) == VG_L2  ? (T)((g) * ((yv) == 0 ? (T)0 : (T)((xv) / (yv))))                       \
     : (kind) == VG_SUMSQ ? (T)((g) * (T)((xv) + (xv)))                                           \
                        : (T)((g) * (T)exp((double)(T)((xv) - (yv)))))

// dy, y are the reduction's output (n_out elements), x and dx are (d0, ..., dr-1)
static om_status *reduce_value_grad_cpu(om_kernel_ctx *ctx) {
    om_tensor *dx = &ctx->out[0];
    int red[OM_MAX_RANK];
    OM_TRY(reduce_mask(ctx, 4, dx->rank, red));
    reduce_plan p;
    reduce_plan_init(&p, dx->rank, dx->dims, red);
    if (om_tensor_numel(dx) == 0) return NULL;
    const int kind = value_grad_kind(ctx->node);
    OM_DISPATCH_FLOAT(ctx->in[0].dtype, ctx->node, {
        const T *dy = ctx->in[0].data;
        const T *x = ctx->in[2].data;
        const T *y = ctx->in[3].data;
        T *d = dx->data;
        int64_t idx[OM_MAX_RANK] = {0};
        int64_t ooff = 0;
        const int step = !p.red[p.k - 1];   /* output advances with the run when kept */
        for (int64_t t = 0; t < p.outer; t++) {
            const int64_t base = t * p.inner;
            for (int64_t j = 0; j < p.inner; j++) {
                const int64_t o = ooff + j * step;
                d[base + j] = VALUE_GRAD(T, kind, x[base + j], y[o], dy[o]);
            }
            ooff = plan_next(&p, idx, ooff);
        }
    });
    return NULL;
}

/* ---- ArgMax / ArgMin ------------------------------------------------------------------
 * The index of the first extremum along one axis (the last with select_last_index), as
 * torch.argmax and torch.max(dim) give it. NaN is the extremum, as in torch: the first NaN
 * wins, and no number after a NaN displaces it. */

static om_status *arg_axis(const om_kernel_ctx *ctx, int *axis) {
    const om_tensor *x = &ctx->in[0];
    if (x->rank == 0) { *axis = 0; return NULL; }
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x->rank, axis));
    if (x->dims[*axis] == 0)
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "axis %d is empty: an empty axis has no extremum", *axis);
    return NULL;
}

static om_status *arg_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    int axis;
    OM_TRY(om_check_dtype(ctx->node, x, 0, OM_DT_ARITH));
    OM_TRY(arg_axis(ctx, &axis));
    const int keep = om_attr_int(ctx->node, "keepdims", 1) != 0;
    y->dtype = OM_I64;
    y->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (i != axis) y->dims[y->rank++] = x->dims[i];
        else if (keep) y->dims[y->rank++] = 1;
    }
    return NULL;
}

/* does v displace the current extremum b? (max: is_max 1; last: select_last_index) */
#define ARG_BETTER(v, b, is_max, last)                                                 \
    ((b) != (b) ? (last) && (v) != (v)                                                 \
                : (v) != (v) || ((is_max) ? ((last) ? (v) >= (b) : (v) > (b))          \
                                          : ((last) ? (v) <= (b) : (v) < (b))))

// x is (outer, n, inner) around the axis, y is (outer, inner) int64
static om_status *arg_run(om_kernel_ctx *ctx, int is_max) {
    const om_tensor *x = &ctx->in[0];
    int axis;
    OM_TRY(arg_axis(ctx, &axis));
    const int last = om_attr_int(ctx->node, "select_last_index", 0) != 0;
    int64_t outer = 1, n = 1, inner = 1;
    for (int i = 0; i < x->rank; i++) {
        if (i < axis) outer *= x->dims[i];
        else if (i == axis) n = x->dims[i];
        else inner *= x->dims[i];
    }
    int64_t *y = ctx->out[0].data;
#define ARG_LOOP(T)                                                                             \
    {                                                                                          \
        const T *xs = x->data;                                                                 \
        for (int64_t o = 0; o < outer; o++)                                                    \
            for (int64_t i = 0; i < inner; i++) {                                              \
                const T *p = xs + o * n * inner + i;                                           \
                T b = p[0];                                                                    \
                int64_t best = 0;                                                              \
                for (int64_t k = 1; k < n; k++) {                                              \
                    const T v = p[k * inner];                                                  \
                    if (ARG_BETTER(v, b, is_max, last)) { b = v; best = k; }                   \
                }                                                                              \
                y[o * inner + i] = best;                                                       \
            }                                                                                  \
    }
    switch (x->dtype) {
    case OM_F32: ARG_LOOP(float) break;
    case OM_F64: ARG_LOOP(double) break;
    case OM_I32: ARG_LOOP(int32_t) break;
    case OM_I64: ARG_LOOP(int64_t) break;
    default: return om_err_dtype(ctx->node, 0, x->dtype);
    }
#undef ARG_LOOP
    return NULL;
}

static om_status *arg_max_cpu(om_kernel_ctx *ctx) { return arg_run(ctx, 1); }
static om_status *arg_min_cpu(om_kernel_ctx *ctx) { return arg_run(ctx, 0); }

/* ---- the defs ---------------------------------------------------------------------- */

const om_op_def om_op_reduce_sum = {
    .name = "ReduceSum", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_infer, .grad = reduce_sum_grad, .cpu = reduce_sum_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_mean = {
    .name = "ReduceMean", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_infer, .grad = reduce_mean_grad, .cpu = reduce_mean_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_max = {
    .name = "ReduceMax", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_infer, .grad = reduce_min_max_grad, .cpu = reduce_max_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_min = {
    .name = "ReduceMin", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_infer, .grad = reduce_min_max_grad, .cpu = reduce_min_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_prod = {
    .name = "ReduceProd", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_infer, .grad = NULL, .cpu = reduce_prod_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_l1 = {
    .name = "ReduceL1", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_float_infer, .grad = reduce_value_grad, .cpu = reduce_l1_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_l2 = {
    .name = "ReduceL2", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_float_infer, .grad = reduce_value_grad, .cpu = reduce_l2_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_sum_square = {
    .name = "ReduceSumSquare", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_float_infer, .grad = reduce_value_grad, .cpu = reduce_sum_square_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_log_sum_exp = {
    .name = "ReduceLogSumExp", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = reduce_float_infer, .grad = reduce_value_grad, .cpu = reduce_log_sum_exp_cpu, .diff_inputs = 1,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_value_grad = {
    .name = "ReduceValueGrad", .domain = "ortmod", .min_in = 4, .max_in = 5, .min_out = 1, .max_out = 1,
    .infer = reduce_value_grad_infer, .cpu = reduce_value_grad_cpu, .diff_inputs = 0,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int "
             "reduction:string=ReduceL1|ReduceL2|ReduceSumSquare|ReduceLogSumExp",
};
const om_op_def om_op_reduce_grad = {
    .name = "ReduceGrad", .domain = "ortmod", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = reduce_grad_infer, .cpu = reduce_grad_cpu, .diff_inputs = 0,
    .attrs = "axes:ints keepdims:int mean:int noop_with_empty_axes:int",
};
const om_op_def om_op_reduce_min_max_grad = {
    .name = "ReduceMinMaxGrad", .domain = "ortmod", .min_in = 4, .max_in = 5, .min_out = 1, .max_out = 1,
    .infer = reduce_min_max_grad_infer, .cpu = reduce_min_max_grad_cpu, .diff_inputs = 0,
    .attrs = "axes:ints keepdims:int noop_with_empty_axes:int",
};
const om_op_def om_op_arg_max = {
    .name = "ArgMax", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .infer = arg_infer, .cpu = arg_max_cpu, .attrs = "axis:int keepdims:int select_last_index:int",
};
const om_op_def om_op_arg_min = {
    .name = "ArgMin", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .infer = arg_infer, .cpu = arg_min_cpu, .attrs = "axis:int keepdims:int select_last_index:int",
};
