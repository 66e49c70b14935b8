/* nn.c — normalizations: Softmax, LogSoftmax, LayerNormalization and their backward ops.
 *
 * Exports:
 *   om_op_softmax          Softmax
 *   om_op_log_softmax      LogSoftmax
 *   om_op_softmax_grad     SoftmaxGrad            (domain ortmod)  dx = y * (dy - sum(dy * y))
 *   om_op_log_softmax_grad LogSoftmaxGrad         (domain ortmod)  dx = dy - exp(y) * sum(dy)
 *   om_op_layer_norm       LayerNormalization
 *   om_op_layer_norm_grad  LayerNormalizationGrad (domain ortmod)  dX, dScale, dBias
 *
 * Softmax views x as (outer, D, inner) with D the softmax axis. With inner == 1 (the usual
 * last axis) each row is contiguous; otherwise the kernels walk chunks of up to SM_CHUNK
 * inner positions at once, so the innermost loops stay contiguous and vectorizable.
 * Opset < 13 graphs keep the old "coerce to 2-D" semantics: D = prod(dims[axis:]).
 */
#include <math.h>
#include <stdlib.h>

#include "ops/broadcast.h"
#include "ops/op.h"
#include "ops/vecmath.h"

#define SM_CHUNK 64

/* OM_DISPATCH_FLOAT with a variadic body (kernel bodies contain commas). */
#define NN_DISPATCH(dt, node, ...)                                              \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    default: return om_err_dtype((node), 0, (dt));                              \
    }

/* float32: the vectorizable exp of vecmath.h (about 1.5 ulp); float64: libm */
#define EXP_T(x) _Generic((x), float: exp_f32, default: exp)(x)
#define LOG_T(x) _Generic((x), float: logf, default: log)(x)

static const char *node_name(const om_node *n) { return n->name ? n->name : ""; }

/* ---- softmax geometry ------------------------------------------------------------- */

typedef struct sm_geom {
    int64_t outer, D, inner;
} sm_geom;

/* coerce: 1 for opset < 13 semantics (the softmax runs over the flattened dims[axis:]). */
static om_status *sm_geometry(const om_node *n, const om_tensor *x, int64_t axis, int coerce, sm_geom *s) {
    int rank = x->rank;
    if (rank == 0) {
        s->outer = s->D = s->inner = 1;
        return NULL;
    }
    int ax;
    OM_TRY(om_norm_axis(n, axis, rank, &ax));
    s->outer = 1;
    s->D = 1;
    s->inner = 1;
    for (int i = 0; i < ax; i++) s->outer *= x->dims[i];
    s->D = x->dims[ax];
    for (int i = ax + 1; i < rank; i++) s->inner *= x->dims[i];
    if (coerce) {
        s->D *= s->inner;
        s->inner = 1;
    }
    return NULL;
}

/* Forward nodes: the axis default and coercion depend on the opset. Grad nodes carry both
 * explicitly (attrs axis and coerce2d) so that they do not depend on the graph's opset. */
static void sm_attrs(const om_kernel_ctx *ctx, int64_t *axis, int *coerce) {
    const om_node *n = ctx->node;
    if (strcmp(n->op->domain, "ortmod") == 0) {
        *axis = om_attr_int(n, "axis", -1);
        *coerce = (int)om_attr_int(n, "coerce2d", 0);
    } else {
        int legacy = ctx->g && ctx->g->opset > 0 && ctx->g->opset < 13;
        *axis = om_attr_int(n, "axis", legacy ? 1 : -1);
        *coerce = legacy;
    }
}

static om_status *softmax_infer(om_kernel_ctx *ctx) {
    int64_t axis;
    int coerce;
    sm_geom s;
    sm_attrs(ctx, &axis, &coerce);
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    for (int i = 1; i < ctx->n_in; i++) {
        OM_TRY(om_check_float(ctx->node, &ctx->in[i], i, ctx->in[0].dtype));
        if (!om_shape_equal(&ctx->in[i], &ctx->in[0]))
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d has a different shape than input 0",
                            ctx->node->op->name, node_name(ctx->node), i);
    }
    OM_TRY(sm_geometry(ctx->node, &ctx->in[0], axis, coerce, &s));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

/* Row sum and max in 16 independent lanes: -O3 turns the lane loop into vector adds/maxes
 * (a plain `s += x[d]` is a serial dependency chain it may not reorder). */
#define SM_LANES 16
#define SM_SUM(T, v, n) _Generic((T)0, float: sm_sum_f32, default: sm_sum_f64)((const void *)(v), (n))
#define SM_MAX(T, v, n) _Generic((T)0, float: sm_max_f32, default: sm_max_f64)((const void *)(v), (n))
#define SM_REDUCERS(TT, SUF)                                                                \
    static inline TT sm_sum_##SUF(const void *v_, int64_t n) {                              \
        const TT *restrict v = v_;                                                          \
        TT acc[SM_LANES] = {0};                                                             \
        int64_t d = 0;                                                                      \
        for (; d + SM_LANES <= n; d += SM_LANES)                                            \
            for (int j = 0; j < SM_LANES; j++) acc[j] += v[d + j];                          \
        TT t = 0;                                                                           \
        for (; d < n; d++) t += v[d];                                                       \
        for (int j = 0; j < SM_LANES; j++) t += acc[j];                                     \
        return t;                                                                           \
    }                                                                                       \
    static inline TT sm_max_##SUF(const void *v_, int64_t n) {                              \
        const TT *restrict v = v_;                                                          \
        TT acc[SM_LANES];                                                                   \
        for (int j = 0; j < SM_LANES; j++) acc[j] = -INFINITY;                              \
        int64_t d = 0;                                                                      \
        for (; d + SM_LANES <= n; d += SM_LANES)                                            \
            for (int j = 0; j < SM_LANES; j++) acc[j] = v[d + j] > acc[j] ? v[d + j] : acc[j]; \
        TT m = -INFINITY;                                                                   \
        for (; d < n; d++) m = v[d] > m ? v[d] : m;                                         \
        for (int j = 0; j < SM_LANES; j++) m = acc[j] > m ? acc[j] : m;                     \
        return m;                                                                           \
    }
SM_REDUCERS(float, f32)
SM_REDUCERS(double, f64)

// x, y are (outer, D, inner); softmax over D. LOG selects log-softmax. Runs work items
// [lo_, hi_): rows when inner == 1, else (row, chunk of SM_CHUNK inner positions) pairs.
#define SOFTMAX_KERNEL(T, LOG, xp, yp, s, lo_, hi_)                                         \
    do {                                                                                    \
        const int64_t D_ = (s).D, I_ = (s).inner;                                           \
        if (I_ == 1) {                                                                      \
            for (int64_t o = (lo_); o < (hi_); o++) {                                       \
                const T *restrict x = (xp) + o * D_;                                        \
                T *restrict y = (yp) + o * D_;                                              \
                T m = SM_MAX(T, x, D_);                                                     \
                if (m == -INFINITY) m = 0; /* all -inf: keep exp() finite-arg */            \
                T sum = 0;                                                                  \
                if (LOG) {                                                                  \
                    for (int64_t d = 0; d < D_; d++) y[d] = EXP_T(x[d] - m);                \
                    sum = SM_SUM(T, y, D_);                                                 \
                    const T ls = LOG_T(sum); /* (x - m) - ls, as eager: exact near m */     \
                    for (int64_t d = 0; d < D_; d++) y[d] = (x[d] - m) - ls;                \
                } else {                                                                    \
                    for (int64_t d = 0; d < D_; d++) y[d] = EXP_T(x[d] - m);                \
                    sum = SM_SUM(T, y, D_);                                                 \
                    const T r = (T)1 / sum;                                                 \
                    for (int64_t d = 0; d < D_; d++) y[d] *= r;                             \
                }                                                                           \
            }                                                                               \
        } else {                                                                            \
            const int64_t nch_ = (I_ + SM_CHUNK - 1) / SM_CHUNK;                            \
            for (int64_t t = (lo_); t < (hi_); t++) {                                       \
                const int64_t o = t / nch_, i0 = (t % nch_) * SM_CHUNK;                     \
                const int64_t w = I_ - i0 < SM_CHUNK ? I_ - i0 : SM_CHUNK;                  \
                const T *restrict x = (xp) + o * D_ * I_ + i0;                              \
                T *restrict y = (yp) + o * D_ * I_ + i0;                                    \
                T m[SM_CHUNK], sum[SM_CHUNK];                                               \
                for (int64_t j = 0; j < w; j++) { m[j] = -INFINITY; sum[j] = 0; }           \
                for (int64_t d = 0; d < D_; d++)                                            \
                    for (int64_t j = 0; j < w; j++) m[j] = x[d * I_ + j] > m[j] ? x[d * I_ + j] : m[j]; \
                for (int64_t j = 0; j < w; j++) m[j] = m[j] == -INFINITY ? 0 : m[j];        \
                for (int64_t d = 0; d < D_; d++)                                            \
                    for (int64_t j = 0; j < w; j++) sum[j] += EXP_T(x[d * I_ + j] - m[j]);  \
                if (LOG) {                                                                  \
                    for (int64_t j = 0; j < w; j++) sum[j] = LOG_T(sum[j]);                 \
                    for (int64_t d = 0; d < D_; d++)                                        \
                        for (int64_t j = 0; j < w; j++)                                     \
                            y[d * I_ + j] = (x[d * I_ + j] - m[j]) - sum[j];                \
                } else {                                                                    \
                    for (int64_t j = 0; j < w; j++) sum[j] = (T)1 / sum[j];                 \
                    for (int64_t d = 0; d < D_; d++)                                        \
                        for (int64_t j = 0; j < w; j++)                                     \
                            y[d * I_ + j] = EXP_T(x[d * I_ + j] - m[j]) * sum[j];           \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* Range workers: the kernels above over work items [lo, hi), one per dtype and variant. */
typedef struct sm_args {
    const void *x;      /* x, or dy for the gradients */
    void *y;            /* y, or dx */
    const void *y_in;   /* the forward's y (gradients) */
    sm_geom s;
} sm_args;

static int64_t sm_grain(int64_t per_item) { return per_item >= OM_GRAIN ? 1 : OM_GRAIN / (per_item ? per_item : 1); }

#define SM_WORKER(name, TT, LOG)                                                            \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                      \
        typedef TT T;                                                                       \
        const sm_args *c = c_;                                                              \
        const T *xp = c->x;                                                                 \
        T *yp = c->y;                                                                       \
        SOFTMAX_KERNEL(T, LOG, xp, yp, c->s, lo, hi);                                       \
    }
SM_WORKER(softmax_f32, float, 0)
SM_WORKER(softmax_f64, double, 0)
SM_WORKER(log_softmax_f32, float, 1)
SM_WORKER(log_softmax_f64, double, 1)

static om_status *softmax_run(om_kernel_ctx *ctx, int is_log) {
    int64_t axis;
    int coerce;
    sm_geom s;
    sm_attrs(ctx, &axis, &coerce);
    OM_TRY(sm_geometry(ctx->node, &ctx->in[0], axis, coerce, &s));
    sm_args a = {ctx->in[0].data, ctx->out[0].data, NULL, s};
    const int64_t w = s.inner < SM_CHUNK ? s.inner : SM_CHUNK;
    const int64_t items = s.inner == 1 ? s.outer : s.outer * ((s.inner + SM_CHUNK - 1) / SM_CHUNK);
    const int64_t grain = sm_grain(s.D * w);
    switch (ctx->in[0].dtype) {
    case OM_F32: om_pool_for(items, grain, is_log ? log_softmax_f32 : softmax_f32, &a); break;
    case OM_F64: om_pool_for(items, grain, is_log ? log_softmax_f64 : softmax_f64, &a); break;
    default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    }
    return NULL;
}

static om_status *softmax_cpu(om_kernel_ctx *ctx) { return softmax_run(ctx, 0); }
static om_status *log_softmax_cpu(om_kernel_ctx *ctx) { return softmax_run(ctx, 1); }

/* dx = y * (dy - sum_D(dy * y))  (Softmax)   or   dx = dy - exp(y) * sum_D(dy)  (LogSoftmax) */
static om_status *softmax_grad_rule(om_grad_ctx *c, om_op_id grad_op) {
    const om_node *n = &c->g->nodes[c->node];
    int y = n->out[0], dy = c->dy[0];
    int legacy = c->g->opset > 0 && c->g->opset < 13;
    int64_t axis = om_attr_int(n, "axis", legacy ? 1 : -1);
    if (dy < 0 || !c->need_dx[0]) return NULL;
    int v = om_emit2(c, grad_op, dy, y);
    if (v < 0) return NULL;
    om_emit_attr_int(c, "axis", axis);
    if (legacy) om_emit_attr_int(c, "coerce2d", 1);
    c->dx[0] = v;
    return NULL;
}

static om_status *softmax_grad(om_grad_ctx *c) { return softmax_grad_rule(c, om_op_softmax_grad_id); }
static om_status *log_softmax_grad(om_grad_ctx *c) { return softmax_grad_rule(c, om_op_log_softmax_grad_id); }

// dy, y, dx are (outer, D, inner); the reduction runs over D.
#define SOFTMAX_GRAD_KERNEL(T, LOG, dyp, yp, dxp, s, lo_, hi_)                              \
    do {                                                                                      \
        const int64_t D_ = (s).D, I_ = (s).inner;                                             \
        const int64_t nch_ = (I_ + SM_CHUNK - 1) / SM_CHUNK;                                  \
        for (int64_t t = (lo_); t < (hi_); t++) {                                             \
            const int64_t o = t / nch_, i0 = (t % nch_) * SM_CHUNK;                           \
            const int64_t w = I_ - i0 < SM_CHUNK ? I_ - i0 : SM_CHUNK;                        \
            const T *restrict g = (dyp) + o * D_ * I_ + i0;                                   \
            const T *restrict y = (yp) + o * D_ * I_ + i0;                                    \
            T *restrict dx = (dxp) + o * D_ * I_ + i0;                                        \
            T acc[SM_CHUNK];                                                                  \
            for (int64_t j = 0; j < w; j++) acc[j] = 0;                                       \
            if (w == 1) { /* inner == 1: plain contiguous rows */                            \
                T a = 0;                                                                      \
                if (LOG) for (int64_t d = 0; d < D_; d++) a += g[d * I_];                     \
                else for (int64_t d = 0; d < D_; d++) a += g[d * I_] * y[d * I_];             \
                acc[0] = a;                                                                   \
            } else {                                                                          \
                for (int64_t d = 0; d < D_; d++)                                              \
                    for (int64_t j = 0; j < w; j++)                                           \
                        acc[j] += LOG ? g[d * I_ + j] : g[d * I_ + j] * y[d * I_ + j];        \
            }                                                                                 \
            for (int64_t d = 0; d < D_; d++)                                                  \
                for (int64_t j = 0; j < w; j++)                                               \
                    dx[d * I_ + j] = LOG ? g[d * I_ + j] - EXP_T(y[d * I_ + j]) * acc[j]      \
                                         : y[d * I_ + j] * (g[d * I_ + j] - acc[j]);          \
        }                                                                                     \
    } while (0)

#define SM_GRAD_WORKER(name, TT, LOG)                                                       \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                      \
        typedef TT T;                                                                       \
        const sm_args *c = c_;                                                              \
        const T *dyp = c->x, *yp = c->y_in;                                                 \
        T *dxp = c->y;                                                                      \
        SOFTMAX_GRAD_KERNEL(T, LOG, dyp, yp, dxp, c->s, lo, hi);                            \
    }
SM_GRAD_WORKER(softmax_grad_f32, float, 0)
SM_GRAD_WORKER(softmax_grad_f64, double, 0)
SM_GRAD_WORKER(log_softmax_grad_f32, float, 1)
SM_GRAD_WORKER(log_softmax_grad_f64, double, 1)

static om_status *softmax_grad_run(om_kernel_ctx *ctx, int is_log) {
    int64_t axis;
    int coerce;
    sm_geom s;
    sm_attrs(ctx, &axis, &coerce);
    OM_TRY(sm_geometry(ctx->node, &ctx->in[0], axis, coerce, &s));
    sm_args a = {ctx->in[0].data, ctx->out[0].data, ctx->in[1].data, s};
    const int64_t w = s.inner < SM_CHUNK ? s.inner : SM_CHUNK;
    const int64_t items = s.outer * ((s.inner + SM_CHUNK - 1) / SM_CHUNK);
    const int64_t grain = sm_grain(s.D * w);
    switch (ctx->in[0].dtype) {
    case OM_F32: om_pool_for(items, grain, is_log ? log_softmax_grad_f32 : softmax_grad_f32, &a); break;
    case OM_F64: om_pool_for(items, grain, is_log ? log_softmax_grad_f64 : softmax_grad_f64, &a); break;
    default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    }
    return NULL;
}

static om_status *softmax_grad_cpu(om_kernel_ctx *ctx) { return softmax_grad_run(ctx, 0); }
static om_status *log_softmax_grad_cpu(om_kernel_ctx *ctx) { return softmax_grad_run(ctx, 1); }

/* ---- LayerNormalization ----------------------------------------------------------- */

/* Mean and InvStdDev: the statistics dtype, float32 for float32 and fp16/bf16 inputs (ONNX's
 * default stash_type), float64 for float64. */
static om_dtype ln_dtype(const om_graph *g, const om_node *n, int out_index) {
    om_dtype x = g->values[n->in[0]].dtype;
    return out_index == 0 ? x : om_dtype_stat(x);
}

/* X viewed as (N, D): N = prod(dims[:axis]), D = prod(dims[axis:]). */
static om_status *ln_geometry(const om_node *n, const om_tensor *x, int64_t axis_attr, int *axis,
                              int64_t *N, int64_t *D) {
    if (x->rank == 0)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X must have rank >= 1", n->op->name, node_name(n));
    OM_TRY(om_norm_axis(n, axis_attr, x->rank, axis));
    *N = 1;
    *D = 1;
    for (int i = 0; i < *axis; i++) *N *= x->dims[i];
    for (int i = *axis; i < x->rank; i++) *D *= x->dims[i];
    return NULL;
}

static om_status *ln_check_param(const om_node *n, const om_tensor *p, int i, om_dtype x_dtype, int64_t D) {
    OM_TRY(om_check_float(n, p, i, om_norm_param_dtype(x_dtype, p)));
    if (om_tensor_numel(p) != D) {
        char buf[128];
        om_shape_str(p, buf, sizeof buf);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d has shape %s, expected %lld elements "
                        "(the normalized dims of X)", n->op->name, node_name(n), i, buf, (long long)D);
    }
    return NULL;
}

static om_status *ln_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    int axis = 0;
    int64_t N = 0, D = 0;
    OM_TRY(om_check_float(n, x, 0, OM_UNDEFINED));
    OM_TRY(ln_geometry(n, x, om_attr_int(n, "axis", -1), &axis, &N, &D));
    OM_TRY(ln_check_param(n, &ctx->in[1], 1, x->dtype, D));
    if (ctx->n_in > 2 && ctx->in[2].dtype != OM_UNDEFINED) OM_TRY(ln_check_param(n, &ctx->in[2], 2, x->dtype, D));
    om_set_shape(&ctx->out[0], x, x->dtype);
    for (int j = 1; j < ctx->n_out && j < 3; j++) {
        om_set_shape(&ctx->out[j], x, om_dtype_stat(x->dtype));
        for (int i = axis; i < x->rank; i++) ctx->out[j].dims[i] = 1;
    }
    return NULL;
}

// x, y are (N, D); scale, bias are (D); mean, invstd are (N)
typedef struct ln_args {
    const void *x, *scale, *bias, *dy, *mean_in, *inv_in, *dmean, *dinv;
    void *y, *mean, *inv, *dscale, *dbias;
    int64_t N, D;
    double eps;
} ln_args;

static int64_t ln_grain(int64_t D) { return D >= OM_GRAIN ? 1 : OM_GRAIN / (D ? D : 1); }

/* rows [lo, hi) of the forward */
#define LN_FWD_WORKER(name, TT)                                                             \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                      \
        typedef TT T;                                                                       \
        const ln_args *c = c_;                                                              \
        const int64_t D = c->D;                                                             \
        const T *xp = c->x, *scale = c->scale, *bias = c->bias;                             \
        T *yp = c->y, *meanp = c->mean, *invp = c->inv;                                     \
        for (int64_t r = lo; r < hi; r++) {                                                 \
            const T *restrict xr = xp + r * D;                                              \
            T *restrict yr = yp + r * D;                                                    \
            const T *restrict sc = scale;                                                   \
            /* two passes in double: the variance of large-mean rows stays accurate */     \
            /* (8 double lanes, so that -O3 vectorizes the sums) */                        \
            double l1[8] = {0}, l2[8] = {0}, sum = 0, ss = 0;                               \
            int64_t d8 = 0;                                                                 \
            for (; d8 + 8 <= D; d8 += 8)                                                    \
                for (int j = 0; j < 8; j++) l1[j] += xr[d8 + j];                            \
            for (int64_t d = d8; d < D; d++) sum += xr[d];                                  \
            for (int j = 0; j < 8; j++) sum += l1[j];                                       \
            const double mean = D ? sum / (double)D : 0;                                    \
            for (d8 = 0; d8 + 8 <= D; d8 += 8)                                              \
                for (int j = 0; j < 8; j++) {                                               \
                    const double cd = xr[d8 + j] - mean;                                    \
                    l2[j] += cd * cd;                                                       \
                }                                                                           \
            for (int64_t d = d8; d < D; d++) {                                              \
                const double cd = xr[d] - mean;                                             \
                ss += cd * cd;                                                              \
            }                                                                               \
            for (int j = 0; j < 8; j++) ss += l2[j];                                        \
            const double inv = 1.0 / sqrt((D ? ss / (double)D : 0) + c->eps);               \
            const T m = (T)mean, iv = (T)inv;                                               \
            if (bias) {                                                                     \
                const T *restrict b = bias;                                                 \
                for (int64_t d = 0; d < D; d++) yr[d] = (xr[d] - m) * iv * sc[d] + b[d];    \
            } else {                                                                        \
                for (int64_t d = 0; d < D; d++) yr[d] = (xr[d] - m) * iv * sc[d];           \
            }                                                                               \
            if (meanp) meanp[r] = m;                                                        \
            if (invp) invp[r] = iv;                                                         \
        }                                                                                   \
    }
LN_FWD_WORKER(ln_fwd_f32, float)
LN_FWD_WORKER(ln_fwd_f64, double)

// x, y are (N, D); scale, bias are (D); mean, invstd are (N)
static om_status *ln_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    int axis = 0;
    int64_t N = 0, D = 0;
    OM_TRY(ln_geometry(n, x, om_attr_int(n, "axis", -1), &axis, &N, &D));
    const int has_bias = ctx->n_in > 2 && ctx->in[2].dtype != OM_UNDEFINED;
    ln_args a = {.x = x->data, .scale = ctx->in[1].data, .bias = has_bias ? ctx->in[2].data : NULL,
                 .y = ctx->out[0].data, .mean = ctx->n_out > 1 ? ctx->out[1].data : NULL,
                 .inv = ctx->n_out > 2 ? ctx->out[2].data : NULL, .N = N, .D = D,
                 .eps = om_attr_real(n, "epsilon", 1e-5)};
    switch (x->dtype) {
    case OM_F32: om_pool_for(N, ln_grain(D), ln_fwd_f32, &a); break;
    case OM_F64: om_pool_for(N, ln_grain(D), ln_fwd_f64, &a); break;
    default: return om_err_dtype(n, 0, x->dtype);
    }
    return NULL;
}

static om_status *ln_grad(om_grad_ctx *c) {
    int node = c->node;
    const om_node *n = &c->g->nodes[node];
    int dy = c->dy[0];
    int dmean = n->n_out > 1 ? c->dy[1] : -1, dinv = n->n_out > 2 ? c->dy[2] : -1;
    if (dy < 0 && dmean < 0 && dinv < 0) return NULL;
    if (dy < 0)
        return om_grad_fail(c, om_error(OM_NO_GRADIENT, "LayerNormalization node '%s': a gradient through Mean or "
                                        "InvStdDev without one through Y is not supported", node_name(n)));
    int x = n->in[0], scale = n->in[1], has_bias = n->n_in > 2 && n->in[2] >= 0;
    int64_t axis = om_attr_int(n, "axis", -1);
    om_dtype sdt = ln_dtype(c->g, n, 1);
    /* saved statistics: make the forward produce them (n may move: do not use it after) */
    int mean = om_node_ensure_output(c->g, node, 1, sdt);
    int inv = om_node_ensure_output(c->g, node, 2, sdt);
    if (mean < 0 || inv < 0)
        return om_grad_fail(c, om_error(OM_INTERNAL, "LayerNormalization: cannot add the Mean/InvStdDev outputs"));
    int in[7] = {dy, x, scale, mean, inv, dmean, dinv};
    int n_in = dinv >= 0 ? 7 : dmean >= 0 ? 6 : 5;
    int out[3] = {-1, -1, -1};
    int nid;
    int n_out = has_bias ? 3 : 2;
    if (om_emit_node(c, om_op_layer_norm_grad_id, in, n_in, out, n_out, &nid) < 0) return NULL;
    om_emit_attr_int(c, "axis", axis);
    if (c->need_dx[0]) c->dx[0] = out[0];
    if (c->need_dx[1]) c->dx[1] = out[1];
    if (has_bias && c->need_dx[2]) c->dx[2] = out[2];
    return NULL;
}

/* ---- LayerNormalizationGrad(dY, X, Scale, Mean, InvStdDev, dMean?, dInvStdDev?; axis)
 *      -> dX, dScale, dBias */

/* dX in X's dtype; dScale and dBias in Scale's (float32 for eager's mixed-type layer_norm) */
static om_dtype ln_grad_dtype(const om_graph *g, const om_node *n, int out_index) {
    return g->values[n->in[out_index == 0 ? 0 : 2]].dtype;
}

static om_status *ln_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *x = &ctx->in[1];
    int axis = 0;
    int64_t N = 0, D = 0;
    /* dY, X, Scale in X's dtype; Mean, InvStdDev and their gradients in the statistics dtype */
    const om_dtype sdt = om_dtype_stat(dy->dtype);
    OM_TRY(om_check_float(n, dy, 0, OM_UNDEFINED));
    for (int i = 1; i < 5; i++)
        if (i != 2) OM_TRY(om_check_float(n, &ctx->in[i], i, i < 3 ? dy->dtype : sdt));
    for (int i = 5; i < ctx->n_in; i++) {
        if (ctx->in[i].dtype == OM_UNDEFINED) continue;
        OM_TRY(om_check_float(n, &ctx->in[i], i, sdt));
        if (om_tensor_numel(&ctx->in[i]) != om_tensor_numel(&ctx->in[3]))
            return om_error(OM_INVALID_ARGUMENT, "LayerNormalizationGrad node '%s': input %d must match Mean",
                            node_name(n), i);
    }
    if (!om_shape_equal(dy, x))
        return om_error(OM_INVALID_ARGUMENT, "LayerNormalizationGrad node '%s': dY and X shapes differ", node_name(n));
    OM_TRY(ln_geometry(n, x, om_attr_int(n, "axis", -1), &axis, &N, &D));
    OM_TRY(ln_check_param(n, &ctx->in[2], 2, dy->dtype, D));
    if (om_tensor_numel(&ctx->in[3]) != N || om_tensor_numel(&ctx->in[4]) != N)
        return om_error(OM_INVALID_ARGUMENT, "LayerNormalizationGrad node '%s': Mean/InvStdDev need %lld elements",
                        node_name(n), (long long)N);
    om_set_shape(&ctx->out[0], x, dy->dtype);
    for (int j = 1; j < ctx->n_out; j++) om_set_shape(&ctx->out[j], &ctx->in[2], ctx->in[2].dtype);
    return NULL;
}

/* xhat = (x - mean) * inv, g = dy * scale:
 *   dx = inv * (g - mean_D(g) - xhat * mean_D(g * xhat))
 *          + (dmean - dinvstd * inv^2 * xhat) / D    (when Mean / InvStdDev have gradients)
 *   dscale = sum_N(dy * xhat), dbias = sum_N(dy)                                       */
// dy, x, dx are (N, D); scale, dscale, dbias are (D); mean, inv are (N)
/* rows [lo, hi) of dX */
#define LN_DX_WORKER(name, TT)                                                              \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                      \
        typedef TT T;                                                                       \
        const ln_args *c = c_;                                                              \
        const int64_t D = c->D;                                                             \
        const T *dyp = c->dy, *xp = c->x, *scale = c->scale, *meanp = c->mean_in, *invp = c->inv_in; \
        const T *dmp = c->dmean, *dip = c->dinv;                                            \
        T *dxp = c->y;                                                                      \
        for (int64_t r = lo; r < hi; r++) {                                                 \
            const T *restrict g = dyp + r * D, *restrict xr = xp + r * D, *restrict sc = scale; \
            T *restrict dx = dxp + r * D;                                                   \
            const T m = meanp[r], iv = invp[r];                                             \
            double l1[8] = {0}, l2[8] = {0}, s1 = 0, s2 = 0;   /* 8 lanes: vectorized */   \
            int64_t d8 = 0;                                                                 \
            for (; d8 + 8 <= D; d8 += 8)                                                    \
                for (int j = 0; j < 8; j++) {                                               \
                    const T gs = g[d8 + j] * sc[d8 + j];                                    \
                    l1[j] += gs;                                                            \
                    l2[j] += gs * ((xr[d8 + j] - m) * iv);                                  \
                }                                                                           \
            for (int64_t d = d8; d < D; d++) {                                              \
                const T gs = g[d] * sc[d];                                                  \
                s1 += gs;                                                                   \
                s2 += gs * ((xr[d] - m) * iv);                                              \
            }                                                                               \
            for (int j = 0; j < 8; j++) { s1 += l1[j]; s2 += l2[j]; }                       \
            const T a = (T)(s1 / (double)D), b = (T)(s2 / (double)D);                       \
            for (int64_t d = 0; d < D; d++) dx[d] = iv * (g[d] * sc[d] - a - (xr[d] - m) * iv * b); \
            if (dmp || dip) {                                                               \
                const T km = dmp ? dmp[r] / (T)D : 0, ki = dip ? dip[r] * iv * iv * iv / (T)D : 0; \
                for (int64_t d = 0; d < D; d++) dx[d] += km - ki * (xr[d] - m);             \
            }                                                                               \
        }                                                                                   \
    }
LN_DX_WORKER(ln_dx_f32, float)
LN_DX_WORKER(ln_dx_f64, double)

/* columns [lo, hi) of dScale/dBias: every row adds into the same (D) vectors, so threads
 * split D, and each column still sums its rows in order (results do not depend on threads) */
#define LN_DPARAM_WORKER(name, TT)                                                          \
    OM_VEC_CLONES static void name(void *c_, int64_t d0, int64_t d1) {                      \
        typedef TT T;                                                                       \
        const ln_args *c = c_;                                                              \
        const int64_t D = c->D, N = c->N;                                                   \
        const T *dyp = c->dy, *xp = c->x, *meanp = c->mean_in, *invp = c->inv_in;           \
        T *dsp = c->dscale, *dbp = c->dbias;                                                \
        if (dsp) for (int64_t d = d0; d < d1; d++) dsp[d] = 0;                              \
        if (dbp) for (int64_t d = d0; d < d1; d++) dbp[d] = 0;                              \
        for (int64_t r = 0; r < N; r++) {                                                   \
            const T *restrict g = dyp + r * D, *restrict xr = xp + r * D;                   \
            const T m = meanp[r], iv = invp[r];                                             \
            if (dsp) {                                                                      \
                T *restrict ds = dsp;                                                       \
                for (int64_t d = d0; d < d1; d++) ds[d] += g[d] * ((xr[d] - m) * iv);       \
            }                                                                               \
            if (dbp) {                                                                      \
                T *restrict db = dbp;                                                       \
                for (int64_t d = d0; d < d1; d++) db[d] += g[d];                            \
            }                                                                               \
        }                                                                                   \
    }
LN_DPARAM_WORKER(ln_dparam_f32, float)
LN_DPARAM_WORKER(ln_dparam_f64, double)

/* xhat = (x - mean) * inv, g = dy * scale:
 *   dx = inv * (g - mean_D(g) - xhat * mean_D(g * xhat))
 *          + (dmean - dinvstd * inv^2 * xhat) / D    (when Mean / InvStdDev have gradients)
 *   dscale = sum_N(dy * xhat), dbias = sum_N(dy)                                       */
// dy, x, dx are (N, D); scale, dscale, dbias are (D); mean, inv are (N)
static om_status *ln_grad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[1];
    int axis = 0;
    int64_t N = 0, D = 0;
    OM_TRY(ln_geometry(n, x, om_attr_int(n, "axis", -1), &axis, &N, &D));
    if (x->dtype != OM_F32 && x->dtype != OM_F64) return om_err_dtype(n, 0, x->dtype);
    const int f32 = x->dtype == OM_F32;
    ln_args a = {.dy = ctx->in[0].data, .x = x->data, .scale = ctx->in[2].data, .mean_in = ctx->in[3].data,
                 .inv_in = ctx->in[4].data,
                 .dmean = ctx->n_in > 5 && ctx->in[5].dtype != OM_UNDEFINED ? ctx->in[5].data : NULL,
                 .dinv = ctx->n_in > 6 && ctx->in[6].dtype != OM_UNDEFINED ? ctx->in[6].data : NULL,
                 .y = ctx->out[0].data, .dscale = ctx->n_out > 1 ? ctx->out[1].data : NULL,
                 .dbias = ctx->n_out > 2 ? ctx->out[2].data : NULL, .N = N, .D = D};
    if (a.y) om_pool_for(N, ln_grain(D), f32 ? ln_dx_f32 : ln_dx_f64, &a);
    if (a.dscale || a.dbias) {
        /* column ranges of at least 16 (a cache line of floats), N rows each */
        const int64_t grain = N >= OM_GRAIN / 16 ? 16 : OM_GRAIN / (N ? N : 1);
        om_pool_for(D, grain, f32 ? ln_dparam_f32 : ln_dparam_f64, &a);
    }
    return NULL;
}

/* ---- the defs --------------------------------------------------------------------- */

const om_op_def om_op_softmax = {
    .name = "Softmax", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .infer = softmax_infer, .grad = softmax_grad, .cpu = softmax_cpu, .diff_inputs = 0x1,
    .attrs = "axis:int",
};

const om_op_def om_op_log_softmax = {
    .name = "LogSoftmax", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .infer = softmax_infer, .grad = log_softmax_grad, .cpu = log_softmax_cpu, .diff_inputs = 0x1,
    .attrs = "axis:int",
};

const om_op_def om_op_softmax_grad = {
    .name = "SoftmaxGrad", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = softmax_infer, .grad = NULL, .cpu = softmax_grad_cpu, .diff_inputs = 0,
    .attrs = "axis:int coerce2d:int",
};

const om_op_def om_op_log_softmax_grad = {
    .name = "LogSoftmaxGrad", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = softmax_infer, .grad = NULL, .cpu = log_softmax_grad_cpu, .diff_inputs = 0,
    .attrs = "axis:int coerce2d:int",
};

const om_op_def om_op_layer_norm = {
    .name = "LayerNormalization", .domain = "", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 3,
    .dtype = ln_dtype, .infer = ln_infer, .grad = ln_grad, .cpu = ln_cpu, .diff_inputs = 0x7,
    .attrs = "axis:int epsilon:float stash_type:int=1",
};

const om_op_def om_op_layer_norm_grad = {
    .name = "LayerNormalizationGrad", .domain = "ortmod", .min_in = 5, .max_in = 7, .min_out = 1, .max_out = 3,
    .dtype = ln_grad_dtype, .infer = ln_grad_infer, .grad = NULL, .cpu = ln_grad_cpu, .diff_inputs = 0,
    .attrs = "axis:int",
};
