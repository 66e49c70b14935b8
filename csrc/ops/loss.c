/* loss.c — classification losses: SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss and
 * their backward ops. Semantics match PyTorch's F.cross_entropy / F.nll_loss: ignored
 * targets contribute nothing, and "mean" divides by the summed weights of the targets that
 * are not ignored (the count when there are no weights; NaN when every target is ignored).
 *
 * Exports:
 *   om_op_softmax_cross_entropy_loss       SoftmaxCrossEntropyLoss
 *   om_op_softmax_cross_entropy_loss_grad  SoftmaxCrossEntropyLossGrad    (domain ortmod)
 *   om_op_nll_loss                         NegativeLogLikelihoodLoss
 *   om_op_nll_loss_grad                    NegativeLogLikelihoodLossGrad  (domain ortmod)
 *
 * Layout: scores/log-probs are viewed as (N, C, S), S = prod(d1..dk); labels as (N, S).
 * The forward never materializes probabilities: it keeps log_prob (when that output is
 * present, which the gradient rule arranges) and the backward turns it into
 * softmax - onehot on the fly.
 *
 *   SoftmaxCrossEntropyLossGrad(dloss, log_prob, labels, weights?; reduction, ignore_index)
 *       -> dscores = (exp(log_prob) - onehot(label)) * w[label] * scale
 *   NegativeLogLikelihoodLossGrad(dloss, target, input_shape, weight?; reduction, ignore_index)
 *       -> dinput = -onehot(target) * w[target] * scale
 *   scale: dloss (sum), dloss / sum(w) (mean), dloss[n, s] (none).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/broadcast.h"
#include "ops/vecmath.h"
#include "ops/op.h"

#define LS_CHUNK 64

/* float32: the vectorizable exp of vecmath.h (about 1.5 ulp); float64: libm */
#define EXP_T(x) _Generic((x), float: exp_f32, default: exp)(x)
/* the gradient's exp(log_prob) is libm's to the bit (exp_f32_libm): parity tests that train several
 * steps through BatchNorm amplify exp_f32's last-bit differences beyond their tolerance */
#define EXP_G(x) _Generic((x), float: exp_f32_libm, default: exp)(x)
#define LOG_T(x) _Generic((x), float: logf, default: log)(x)

#define LS_DISPATCH(dt, node, ...)                                              \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    default: return om_err_dtype((node), 0, (dt));                              \
    }

/* Parallel loop with a sum reduction of two doubles (OpenMP when the build enables it). */
#ifdef _OPENMP
#define LS_PRAGMA_(x) _Pragma(#x)
#define LS_PARALLEL_SUM2(cond, a, b) LS_PRAGMA_(omp parallel for schedule(static) reduction(+ : a, b) if (cond))
#else
#define LS_PARALLEL_SUM2(cond, a, b)
#endif

enum { RED_NONE, RED_SUM, RED_MEAN };

static const char *node_name(const om_node *n) { return n->name ? n->name : ""; }

typedef struct loss_attrs {
    int reduction;
    int has_ignore;
    int64_t ignore;
} loss_attrs;

static om_status *loss_attrs_read(const om_node *n, loss_attrs *a) {
    const char *r = om_attr_string(n, "reduction", "mean");
    if (strcmp(r, "mean") == 0) a->reduction = RED_MEAN;
    else if (strcmp(r, "sum") == 0) a->reduction = RED_SUM;
    else if (strcmp(r, "none") == 0) a->reduction = RED_NONE;
    else return om_error(OM_UNSUPPORTED_OP, "%s node '%s': unknown reduction '%s' (mean, sum or none)",
                         n->op->name, node_name(n), r);
    a->has_ignore = om_attr_find(n, "ignore_index") != NULL;
    a->ignore = om_attr_int(n, "ignore_index", 0);
    return NULL;
}

static inline int64_t label_at(const om_tensor *t, int64_t i) {
    return t->dtype == OM_I64 ? ((const int64_t *)t->data)[i] : (int64_t)((const int32_t *)t->data)[i];
}

/* Shapes: x (N, C, d1..dk) float, labels (N, d1..dk) int32/int64, weights (C) float. */
typedef struct loss_geom {
    int64_t N, C, S;
} loss_geom;

static om_status *loss_geometry(const om_node *n, const om_tensor *x, const om_tensor *lab, const om_tensor *w,
                                loss_geom *g) {
    char bx[160], bl[160];
    OM_TRY(om_check_float(n, x, 0, OM_UNDEFINED));   /* fp16/bf16 scores too: loss and log_prob in their dtype */
    OM_TRY(om_check_dtype(n, lab, 1, OM_DT_INDEX));
    int ok = x->rank >= 2 && lab->rank == x->rank - 1 && lab->dims[0] == x->dims[0];
    for (int i = 1; ok && i < lab->rank; i++) ok = lab->dims[i] == x->dims[i + 1];
    if (!ok) {
        om_shape_str(x, bx, sizeof bx);
        om_shape_str(lab, bl, sizeof bl);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': expected input (N, C, d1..dk) and target (N, d1..dk), "
                        "got %s and %s", n->op->name, node_name(n), bx, bl);
    }
    g->N = x->dims[0];
    g->C = x->dims[1];
    g->S = 1;
    for (int i = 2; i < x->rank; i++) g->S *= x->dims[i];
    if (w && w->dtype != OM_UNDEFINED) {
        OM_TRY(om_check_float(n, w, 2, x->dtype));
        if (w->rank != 1 || w->dims[0] != g->C) {
            om_shape_str(w, bx, sizeof bx);
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': weights must have shape (%lld), got %s",
                            n->op->name, node_name(n), (long long)g->C, bx);
        }
    }
    return NULL;
}

/* Every label must be in [0, C) or equal ignore_index; checked before the (parallel)
 * kernels so that they need no error path. */
static om_status *check_labels(const om_node *n, const om_tensor *lab, const loss_attrs *a, int64_t C) {
    const int64_t cnt = om_tensor_numel(lab);
    for (int64_t i = 0; i < cnt; i++) {
        int64_t l = label_at(lab, i);
        if (a->has_ignore && l == a->ignore) continue;
        if (l < 0 || l >= C) {
            if (a->has_ignore)
                return om_error(OM_RUNTIME, "%s node '%s': label %lld at flat index %lld is out of range [0, %lld) "
                                "and is not ignore_index (%lld)", n->op->name, node_name(n), (long long)l,
                                (long long)i, (long long)C, (long long)a->ignore);
            return om_error(OM_RUNTIME, "%s node '%s': label %lld at flat index %lld is out of range [0, %lld)",
                            n->op->name, node_name(n), (long long)l, (long long)i, (long long)C);
        }
    }
    return NULL;
}

static const om_tensor *opt_in(const om_kernel_ctx *ctx, int i) {
    return ctx->n_in > i && ctx->in[i].dtype != OM_UNDEFINED ? &ctx->in[i] : NULL;
}

/* loss: (N, d1..dk) for "none", a scalar otherwise. */
static void set_loss_shape(om_tensor *out, const om_tensor *lab, om_dtype dt, int reduction) {
    if (reduction == RED_NONE) {
        om_set_shape(out, lab, dt);
    } else {
        out->dtype = dt;
        out->rank = 0;
    }
}

/* ---- SoftmaxCrossEntropyLoss ------------------------------------------------------ */

static om_status *sce_infer(om_kernel_ctx *ctx) {
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    OM_TRY(loss_attrs_read(ctx->node, &a));
    OM_TRY(loss_geometry(ctx->node, &ctx->in[0], &ctx->in[1], opt_in(ctx, 2), &g));
    set_loss_shape(&ctx->out[0], &ctx->in[1], ctx->in[0].dtype, a.reduction);
    if (ctx->n_out > 1) om_set_shape(&ctx->out[1], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

typedef struct sce_args {
    const void *x, *w, *dl;
    const om_tensor *lab;
    void *loss, *lp;
    int64_t N, C, S, ign;
    int has_ign, red;
    double base;
    double *part;           /* per range: loss sum, weight sum */
} sce_args;

/* work items: (row i, chunk of LS_CHUNK positions of S) pairs; grain ~OM_GRAIN elements */
static int64_t sce_grain(int64_t C, int64_t S) {
    const int64_t per = C * (S < LS_CHUNK ? S : LS_CHUNK);
    return per >= OM_GRAIN ? 1 : OM_GRAIN / (per ? per : 1);
}

#define SCE_FWD_WORKER(name, TT)                                                                          \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                                    \
        typedef TT T;                                                                                     \
        const sce_args *c = c_;                                                                           \
        const int64_t C = c->C, S = c->S, ign = c->ign;                                                   \
        const int has_ign = c->has_ign, red = c->red;                                                     \
        const om_tensor *lab = c->lab;                                                                    \
        const T *xp = c->x, *wp = c->w;                                                                   \
        T *lossp = c->loss, *lpp = c->lp;                                                                 \
        const int64_t nch = (S + LS_CHUNK - 1) / LS_CHUNK;                                                \
        double tot = 0, wsum = 0;                                                                         \
        for (int64_t t = lo; t < hi; t++) {                                                         \
            const int64_t i = t / nch, s0 = (t % nch) * LS_CHUNK;                                   \
            const int64_t w = S - s0 < LS_CHUNK ? S - s0 : LS_CHUNK;                                \
            /* lp may be x's own buffer (in place, set below): the loss reads x first */             \
            const T *xr = xp + i * C * S + s0;                                                      \
            T mx[LS_CHUNK], ls[LS_CHUNK]; /* log p = (x - mx) - ls, as eager: exact near the max */ \
            if (S == 1) {                                                                           \
                /* contiguous row: the common (N, C) case */                                        \
                /* 16 lanes: -O3 vectorizes the max, exp and sum (a serial chain would not) */ \
                T ml[16], sl[16], m = -INFINITY, sum = 0;                                          \
                int64_t c0 = 0;                                                                    \
                for (int j = 0; j < 16; j++) { ml[j] = -INFINITY; sl[j] = 0; }                      \
                for (; c0 + 16 <= C; c0 += 16)                                                     \
                    for (int j = 0; j < 16; j++) ml[j] = xr[c0 + j] > ml[j] ? xr[c0 + j] : ml[j];   \
                for (int64_t c = c0; c < C; c++) m = xr[c] > m ? xr[c] : m;                        \
                for (int j = 0; j < 16; j++) m = ml[j] > m ? ml[j] : m;                            \
                if (m == -INFINITY) m = 0;                                                         \
                for (c0 = 0; c0 + 16 <= C; c0 += 16)                                               \
                    for (int j = 0; j < 16; j++) sl[j] += EXP_T(xr[c0 + j] - m);                   \
                for (int64_t c = c0; c < C; c++) sum += EXP_T(xr[c] - m);                          \
                for (int j = 0; j < 16; j++) sum += sl[j];                                         \
                mx[0] = m, ls[0] = LOG_T(sum);                                                      \
            } else {                                                                                \
                T m[LS_CHUNK], sum[LS_CHUNK];                                                       \
                for (int64_t j = 0; j < w; j++) { m[j] = -INFINITY; sum[j] = 0; }                   \
                for (int64_t c = 0; c < C; c++)                                                     \
                    for (int64_t j = 0; j < w; j++) m[j] = xr[c * S + j] > m[j] ? xr[c * S + j] : m[j];\
                for (int64_t j = 0; j < w; j++) m[j] = m[j] == -INFINITY ? 0 : m[j];                \
                for (int64_t c = 0; c < C; c++)                                                     \
                    for (int64_t j = 0; j < w; j++) sum[j] += EXP_T(xr[c * S + j] - m[j]);          \
                for (int64_t j = 0; j < w; j++) mx[j] = m[j], ls[j] = LOG_T(sum[j]);                \
            }                                                                                       \
            for (int64_t j = 0; j < w; j++) {                                                       \
                const int64_t pos = i * S + s0 + j, l = label_at(lab, pos);                         \
                if (has_ign && l == ign) {                                                          \
                    if (red == RED_NONE) lossp[pos] = 0;                                            \
                    continue;                                                                       \
                }                                                                                   \
                const T wl = wp ? wp[l] : (T)1;                                                     \
                const T li = -wl * ((xr[l * S + j] - mx[j]) - ls[j]);                               \
                if (red == RED_NONE) lossp[pos] = li;                                               \
                else { tot += li; wsum += wl; }                                                     \
            }                                                                                       \
            if (lpp) {                                                                              \
                T *lr = lpp + i * C * S + s0;                                                       \
                if (S == 1) { /* one unit-stride loop: the nest below would run its inner loop once */ \
                    const T m0 = mx[0], l0 = ls[0];                                                 \
                    for (int64_t c = 0; c < C; c++) lr[c] = (xr[c] - m0) - l0;                      \
                } else {                                                                            \
                    for (int64_t c = 0; c < C; c++)                                                 \
                        for (int64_t j = 0; j < w; j++) lr[c * S + j] = (xr[c * S + j] - mx[j]) - ls[j]; \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        c->part[2 * om_pool_range_id()] = tot;                                                            \
        c->part[2 * om_pool_range_id() + 1] = wsum;                                                       \
    }
SCE_FWD_WORKER(sce_fwd_f32, float)
SCE_FWD_WORKER(sce_fwd_f64, double)

// scores, log_prob are (N, C, S); labels (N, S); weights (C); loss () or (N, S)
static om_status *sce_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    OM_TRY(loss_attrs_read(n, &a));
    const om_tensor *x = &ctx->in[0], *lab = &ctx->in[1], *wt = opt_in(ctx, 2);
    OM_TRY(loss_geometry(n, x, lab, wt, &g));
    OM_TRY(check_labels(n, lab, &a, g.C));
    const int64_t N = g.N, C = g.C, S = g.S;
    const int has_ign = a.has_ignore, red = a.reduction;
    const int64_t ign = a.ignore;
    const int64_t nch = (S + LS_CHUNK - 1) / LS_CHUNK;
    const int64_t grain = sce_grain(C, S);
    const int R = om_pool_ranges(N * nch, grain);
    double part_stack[2 * 64], *part = R <= 64 ? part_stack : malloc(sizeof(double) * 2 * (size_t)R);
    if (!part) return om_error(OM_OUT_OF_MEMORY, "out of memory");
    for (int r = 0; r < 2 * R; r++) part[r] = 0;
    sce_args sa = {.x = x->data, .w = wt ? wt->data : NULL, .lab = lab, .loss = ctx->out[0].data,
                   .lp = ctx->n_out > 1 ? ctx->out[1].data : NULL, .N = N, .C = C, .S = S, .ign = ign,
                   .has_ign = has_ign, .red = red, .part = part};
    if (x->dtype == OM_F32) om_pool_run(N * nch, R, sce_fwd_f32, &sa);
    else if (x->dtype == OM_F64) om_pool_run(N * nch, R, sce_fwd_f64, &sa);
    else { if (part != part_stack) free(part); return om_err_dtype(n, 0, x->dtype); }
    double tot = 0, wsum = 0;   /* partials in range order: the same sum on any thread count's schedule */
    for (int r = 0; r < R; r++) { tot += part[2 * r]; wsum += part[2 * r + 1]; }
    if (part != part_stack) free(part);
    LS_DISPATCH(x->dtype, n, {
        T *lossp = ctx->out[0].data;
        if (red == RED_SUM) lossp[0] = (T)tot;
        else if (red == RED_MEAN) lossp[0] = (T)(tot / wsum);   /* 0/0 = NaN, as PyTorch */
    });
    return NULL;
}

/* Copies reduction and ignore_index of forward node fwd onto the last emitted node. */
static om_status *copy_loss_attrs(om_grad_ctx *c, const char *reduction, int has_ignore, int64_t ignore) {
    OM_TRY(om_node_set_string(c->g, om_emit_last(c), "reduction", reduction));
    if (has_ignore) om_emit_attr_int(c, "ignore_index", ignore);
    return NULL;
}

static om_status *sce_grad(om_grad_ctx *c) {
    const int node = c->node;
    const om_node *n = &c->g->nodes[node];
    if (!c->need_dx[0]) return NULL;
    const int labels = n->in[1], weights = n->n_in > 2 ? n->in[2] : -1;
    const int dloss = c->dy[0], dlogp = n->n_out > 1 ? c->dy[1] : -1;
    char reduction[16];
    snprintf(reduction, sizeof reduction, "%s", om_attr_string(n, "reduction", "mean"));
    const int has_ignore = om_attr_find(n, "ignore_index") != NULL;
    const int64_t ignore = om_attr_int(n, "ignore_index", 0);
    const om_dtype dt = c->g->values[n->in[0]].dtype;
    if (dloss < 0 && dlogp < 0) return NULL;
    /* keep log_prob: the backward rebuilds softmax from it (n may move: not used below) */
    const int logp = om_node_ensure_output(c->g, node, 1, dt);
    if (logp < 0)
        return om_grad_fail(c, om_error(OM_INTERNAL, "SoftmaxCrossEntropyLoss: cannot add the log_prob output"));
    int acc = -1;
    if (dloss >= 0) {
        int in[4] = {dloss, logp, labels, weights};
        acc = om_emit(c, om_op_softmax_cross_entropy_loss_grad_id, in, weights >= 0 ? 4 : 3);
        if (acc < 0) return NULL;
        om_status *st = copy_loss_attrs(c, reduction, has_ignore, ignore);
        if (st) return om_grad_fail(c, st);
    }
    if (dlogp >= 0) {
        /* log_prob is also used downstream: add its LogSoftmax gradient over C */
        int v = om_emit2(c, om_op_log_softmax_grad_id, dlogp, logp);
        if (v < 0) return NULL;
        om_emit_attr_int(c, "axis", 1);
        acc = acc < 0 ? v : om_emit2(c, om_op_add_id, acc, v);
        if (acc < 0) return NULL;
    }
    c->dx[0] = acc;
    return NULL;
}

static om_status *sce_grad_infer(om_kernel_ctx *ctx) {
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    const om_node *n = ctx->node;
    OM_TRY(loss_attrs_read(n, &a));
    OM_TRY(loss_geometry(n, &ctx->in[1], &ctx->in[2], opt_in(ctx, 3), &g));
    if (ctx->in[0].dtype != ctx->in[1].dtype) return om_err_dtype(n, 0, ctx->in[0].dtype);
    int64_t want = a.reduction == RED_NONE ? g.N * g.S : 1;
    if (om_tensor_numel(&ctx->in[0]) != want)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dloss has %lld elements, expected %lld", n->op->name,
                        node_name(n), (long long)om_tensor_numel(&ctx->in[0]), (long long)want);
    om_set_shape(&ctx->out[0], &ctx->in[1], ctx->in[1].dtype);
    return NULL;
}

/* Per-position scale of the gradient: reads labels/weights to get sum(w) for "mean". */
static double mean_denominator(const om_tensor *lab, const void *wp, om_dtype dt, const loss_attrs *a) {
    const int64_t cnt = om_tensor_numel(lab);
    double wsum = 0;
    for (int64_t i = 0; i < cnt; i++) {
        int64_t l = label_at(lab, i);
        if (a->has_ignore && l == a->ignore) continue;
        wsum += !wp ? 1.0 : dt == OM_F32 ? ((const float *)wp)[l] : ((const double *)wp)[l];
    }
    return wsum;
}

#define SCE_GRAD_WORKER(name, TT)                                                                         \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                                    \
        typedef TT T;                                                                                     \
        const sce_args *c = c_;                                                                           \
        const int64_t C = c->C, S = c->S, ign = c->ign;                                                   \
        const int has_ign = c->has_ign, red = c->red;                                                     \
        const om_tensor *lab = c->lab;                                                                    \
        const T *lpp = c->x, *wp = c->w, *dl = c->dl;                                                     \
        T *dxp = c->loss;                                                                                 \
        const T base = (T)c->base;                                                                        \
        const int64_t nch = (S + LS_CHUNK - 1) / LS_CHUNK;                                                \
        for (int64_t t = lo; t < hi; t++) {                                                         \
            const int64_t i = t / nch, s0 = (t % nch) * LS_CHUNK;                                   \
            const int64_t w = S - s0 < LS_CHUNK ? S - s0 : LS_CHUNK;                                \
            T coef[LS_CHUNK];                                                                       \
            int64_t lj[LS_CHUNK];                                                                   \
            for (int64_t j = 0; j < w; j++) {                                                       \
                const int64_t pos = i * S + s0 + j, l = label_at(lab, pos);                         \
                const int ignored = has_ign && l == ign;                                            \
                lj[j] = ignored ? -1 : l;                                                           \
                coef[j] = ignored ? (T)0 : (wp ? wp[l] : (T)1) * (red == RED_NONE ? dl[pos] : base);\
            }                                                                                       \
            const T *lr = lpp + i * C * S + s0; /* dr may be lr's own buffer (in place) */          \
            T *dr = dxp + i * C * S + s0;                                                           \
            if (S == 1) {                                                                           \
                const T k = coef[0];                                                                \
                for (int64_t c = 0; c < C; c++) dr[c] = EXP_G(lr[c]) * k;                           \
            } else {                                                                                \
                for (int64_t c = 0; c < C; c++)                                                     \
                    for (int64_t j = 0; j < w; j++) dr[c * S + j] = EXP_G(lr[c * S + j]) * coef[j]; \
            }                                                                                       \
            for (int64_t j = 0; j < w; j++)                                                         \
                if (lj[j] >= 0) dr[lj[j] * S + j] -= coef[j];                                       \
        }                                                                                           \
    }
SCE_GRAD_WORKER(sce_grad_f32, float)
SCE_GRAD_WORKER(sce_grad_f64, double)

// dloss () or (N, S); log_prob, dscores (N, C, S); labels (N, S); weights (C)
static om_status *sce_grad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    OM_TRY(loss_attrs_read(n, &a));
    const om_tensor *lp = &ctx->in[1], *lab = &ctx->in[2], *wt = opt_in(ctx, 3);
    OM_TRY(loss_geometry(n, lp, lab, wt, &g));
    OM_TRY(check_labels(n, lab, &a, g.C));
    const int64_t N = g.N, C = g.C, S = g.S;
    const int has_ign = a.has_ignore, red = a.reduction;
    const int64_t ign = a.ignore;
    const double denom = red == RED_MEAN ? mean_denominator(lab, wt ? wt->data : NULL, lp->dtype, &a) : 1.0;
    const int64_t nch = (S + LS_CHUNK - 1) / LS_CHUNK;
    if (lp->dtype != OM_F32 && lp->dtype != OM_F64) return om_err_dtype(n, 0, lp->dtype);
    sce_args sa = {.x = lp->data, .w = wt ? wt->data : NULL, .dl = ctx->in[0].data, .lab = lab,
                   .loss = ctx->out[0].data, .N = N, .C = C, .S = S, .ign = ign, .has_ign = has_ign, .red = red};
    if (red != RED_NONE)
        sa.base = lp->dtype == OM_F32 ? (double)(float)(((const float *)ctx->in[0].data)[0] / denom)
                                      : ((const double *)ctx->in[0].data)[0] / denom;
    om_pool_for(N * nch, sce_grain(C, S), lp->dtype == OM_F32 ? sce_grad_f32 : sce_grad_f64, &sa);
    return NULL;
}

/* ---- NegativeLogLikelihoodLoss ---------------------------------------------------- */

static om_status *nll_infer(om_kernel_ctx *ctx) {
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    OM_TRY(loss_attrs_read(ctx->node, &a));
    OM_TRY(loss_geometry(ctx->node, &ctx->in[0], &ctx->in[1], opt_in(ctx, 2), &g));
    set_loss_shape(&ctx->out[0], &ctx->in[1], ctx->in[0].dtype, a.reduction);
    return NULL;
}

// input is (N, C, S) log-probs; target (N, S); weight (C); loss () or (N, S)
static om_status *nll_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    OM_TRY(loss_attrs_read(n, &a));
    const om_tensor *x = &ctx->in[0], *lab = &ctx->in[1], *wt = opt_in(ctx, 2);
    OM_TRY(loss_geometry(n, x, lab, wt, &g));
    OM_TRY(check_labels(n, lab, &a, g.C));
    const int64_t N = g.N, C = g.C, S = g.S;
    LS_DISPATCH(x->dtype, n, {
        const T *xp = x->data, *wp = wt ? wt->data : NULL;
        T *lossp = ctx->out[0].data;
        double tot = 0, wsum = 0;
        for (int64_t i = 0; i < N; i++) {
            for (int64_t s = 0; s < S; s++) {
                const int64_t pos = i * S + s, l = label_at(lab, pos);
                if (a.has_ignore && l == a.ignore) {
                    if (a.reduction == RED_NONE) lossp[pos] = 0;
                    continue;
                }
                const T wl = wp ? wp[l] : (T)1;
                const T li = -wl * xp[(i * C + l) * S + s];
                if (a.reduction == RED_NONE) lossp[pos] = li;
                else { tot += li; wsum += wl; }
            }
        }
        if (a.reduction == RED_SUM) lossp[0] = (T)tot;
        else if (a.reduction == RED_MEAN) lossp[0] = (T)(tot / wsum);
    });
    return NULL;
}

static om_status *nll_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    if (!c->need_dx[0] || c->dy[0] < 0) return NULL;
    const int x = n->in[0], target = n->in[1], weight = n->n_in > 2 ? n->in[2] : -1, dloss = c->dy[0];
    char reduction[16];
    snprintf(reduction, sizeof reduction, "%s", om_attr_string(n, "reduction", "mean"));
    const int has_ignore = om_attr_find(n, "ignore_index") != NULL;
    const int64_t ignore = om_attr_int(n, "ignore_index", 0);
    /* only x's shape is needed: x itself is not kept for the backward */
    int shape = om_emit_shape(c, x);
    if (shape < 0) return NULL;
    int in[4] = {dloss, target, shape, weight};
    int v = om_emit(c, om_op_nll_loss_grad_id, in, weight >= 0 ? 4 : 3);
    if (v < 0) return NULL;
    om_status *st = copy_loss_attrs(c, reduction, has_ignore, ignore);
    if (st) return om_grad_fail(c, st);
    c->dx[0] = v;
    return NULL;
}

/* NegativeLogLikelihoodLossGrad(dloss, target, input_shape, weight?) -> dinput */
static om_status *nll_grad_geometry(om_kernel_ctx *ctx, loss_attrs *a, loss_geom *g, om_tensor *xs) {
    const om_node *n = ctx->node;
    OM_TRY(loss_attrs_read(n, a));
    const om_tensor *shp = &ctx->in[2];
    if (!shp->data)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': the input shape must be known at plan time",
                        n->op->name, node_name(n));
    memset(xs, 0, sizeof(*xs));
    xs->dtype = ctx->in[0].dtype;
    xs->rank = om_read_ints(shp, xs->dims, OM_MAX_RANK);
    if (xs->rank < 0)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': bad input shape", n->op->name, node_name(n));
    OM_TRY(loss_geometry(n, xs, &ctx->in[1], opt_in(ctx, 3), g));
    int64_t want = a->reduction == RED_NONE ? g->N * g->S : 1;
    if (om_tensor_numel(&ctx->in[0]) != want)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dloss has %lld elements, expected %lld", n->op->name,
                        node_name(n), (long long)om_tensor_numel(&ctx->in[0]), (long long)want);
    return NULL;
}

static om_status *nll_grad_infer(om_kernel_ctx *ctx) {
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    om_tensor xs;
    OM_TRY(nll_grad_geometry(ctx, &a, &g, &xs));
    om_set_shape(&ctx->out[0], &xs, ctx->in[0].dtype);
    return NULL;
}

// dloss () or (N, S); target (N, S); weight (C); dinput (N, C, S)
static om_status *nll_grad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    loss_attrs a;
    loss_geom g = {0, 0, 0};
    om_tensor xs;
    OM_TRY(nll_grad_geometry(ctx, &a, &g, &xs));
    const om_tensor *lab = &ctx->in[1], *wt = opt_in(ctx, 3);
    OM_TRY(check_labels(n, lab, &a, g.C));
    const int64_t C = g.C, S = g.S, cnt = g.N * g.S;
    const double denom = a.reduction == RED_MEAN ? mean_denominator(lab, wt ? wt->data : NULL, xs.dtype, &a) : 1.0;
    memset(ctx->out[0].data, 0, om_tensor_nbytes(&ctx->out[0]));
    LS_DISPATCH(ctx->in[0].dtype, n, {
        const T *dl = ctx->in[0].data, *wp = wt ? wt->data : NULL;
        T *dxp = ctx->out[0].data;
        const T base = a.reduction == RED_NONE ? (T)0 : (T)(dl[0] / denom);
        for (int64_t pos = 0; pos < cnt; pos++) {
            const int64_t l = label_at(lab, pos);
            if (a.has_ignore && l == a.ignore) continue;
            const int64_t i = pos / S, s = pos % S;
            const T k = a.reduction == RED_NONE ? dl[pos] : base;
            dxp[(i * C + l) * S + s] = -(wp ? wp[l] : (T)1) * k;
        }
    });
    return NULL;
}

/* ---- the defs --------------------------------------------------------------------- */

const om_op_def om_op_softmax_cross_entropy_loss = {
    .name = "SoftmaxCrossEntropyLoss", .domain = "", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 2,
    /* log_prob takes the scores' bytes when nothing else reads them (the logits of a language model) */
    .flags = OM_OP_INPLACE, .inplace_in = 0, .inplace_out = 1,
    .infer = sce_infer, .grad = sce_grad, .cpu = sce_cpu, .diff_inputs = 0x1,
    .attrs = "ignore_index:int reduction:string=mean|sum|none",
};

const om_op_def om_op_softmax_cross_entropy_loss_grad = {
    .name = "SoftmaxCrossEntropyLossGrad", .domain = "ortmod", .min_in = 3, .max_in = 4, .min_out = 1, .max_out = 1,
    /* dscores takes the stashed log_prob's bytes: the forward's (N, C, S) buffer serves three times */
    .flags = OM_OP_INPLACE, .inplace_in = 1, .inplace_out = 0,
    .infer = sce_grad_infer, .grad = NULL, .cpu = sce_grad_cpu, .diff_inputs = 0,
    .attrs = "ignore_index:int reduction:string=mean|sum|none",
};

const om_op_def om_op_nll_loss = {
    .name = "NegativeLogLikelihoodLoss", .domain = "", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = nll_infer, .grad = nll_grad, .cpu = nll_cpu, .diff_inputs = 0x1,
    .attrs = "ignore_index:int reduction:string=mean|sum|none",
};

const om_op_def om_op_nll_loss_grad = {
    .name = "NegativeLogLikelihoodLossGrad", .domain = "ortmod", .min_in = 3, .max_in = 4, .min_out = 1, .max_out = 1,
    .infer = nll_grad_infer, .grad = NULL, .cpu = nll_grad_cpu, .diff_inputs = 0,
    .attrs = "ignore_index:int reduction:string=mean|sum|none",
};
