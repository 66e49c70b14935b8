/* conv.c — convolution: Conv (1-D, 2-D and 3-D; strides, pads and auto_pad, dilations,
 * groups) and its two backward ops.
 *
 * Exports:
 *   om_op_conv          Conv                         (X, W, B?) -> Y
 *   om_op_conv_grad_x   ConvGradX  (domain ortmod)   (dY, W, Shape(X)) -> dX
 *   om_op_conv_grad_w   ConvGradW  (domain ortmod)   (dY, X?, Shape(W)) -> dW, dB?
 *
 * Every product is one BLAS GEMM per (image, group), in the im2col layout:
 *   col   (Cg*KS, OS)  = im2col(x[n, group])         KS = kernel size, OS = output size
 *   y     (Mg, OS)     = W_g (Mg, Cg*KS) @ col
 *   dcol  (Cg*KS, OS)  = W_g^T @ dy[n, group]         then dx = col2im(dcol)
 *   dW_g (Mg, Cg*KS) += dy[n, group] @ col^T          (beta = 1 accumulates over the batch)
 * A 1x1 kernel with stride 1 and no padding needs no im2col: x itself is the column matrix.
 * ConvGradX reads only W and the shape of X, so X is kept for backward only when W's gradient
 * is wanted. The backward ops carry the forward node's attributes (copied by the rule).
 */
#include <cblas.h>
#include <stdlib.h>

#include "ops/broadcast.h"
#include "ops/spatial.h"

#define CONV_DISPATCH(dt, node, ...)                                            \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    default: return om_err_dtype((node), 0, (dt));                              \
    }

/* Row-major C(M,N) = A(M,K) op B(K,N) (+ beta C); ta/tb transpose the stored matrices. */
static void gemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                     float beta, float *C) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, 1.0f, A, ta ? (int)M : (int)K, B, tb ? (int)K : (int)N, beta, C, (int)N);
}
static void gemm_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, const double *A, const double *B,
                     double beta, double *C) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, 1.0, A, ta ? (int)M : (int)K, B, tb ? (int)K : (int)N, beta, C, (int)N);
}
#define GEMM_T(T) _Generic((T)0, float: gemm_f32, default: gemm_f64)

static int window_trivial(const om_window *w) {
    for (int i = 0; i < OM_SP; i++)
        if (w->k[i] != 1 || w->s[i] != 1 || w->pb[i] || w->pe[i]) return 0;
    return 1;
}

/* im2col / col2im. ADD = 0: col[r][o] = x[tap(r, o)] (0 in the padding);
 * ADD = 1: x[tap(r, o)] += col[r][o] (col2im; x must be zeroed first).
 * x is (C, ID, IH, IW), col is (C*KD*KH*KW, OD*OH*OW). Rows of one channel touch only
 * that channel, so channels run in parallel (col2im too). */
#define IM2COL(T, ADD, xp, colp, C_, w)                                                          \
    do {                                                                                         \
        const om_window *w_ = (w);                                                               \
        const int64_t KD = w_->k[0], KH = w_->k[1], KW = w_->k[2];                               \
        const int64_t ID = w_->in[0], IH = w_->in[1], IW = w_->in[2];                            \
        const int64_t OD = w_->out[0], OH = w_->out[1], OW = w_->out[2];                         \
        const int64_t OS = OD * OH * OW, KS = KD * KH * KW;                                      \
        OM_PARALLEL_FOR((C_) * KS * OS > OM_CHUNK)                                               \
        for (int64_t c = 0; c < (C_); c++) {                                                     \
            for (int64_t kk = 0; kk < KS; kk++) {                                                \
                const int64_t kd = kk / (KH * KW), kh = (kk / KW) % KH, kw = kk % KW;            \
                T *colr = (colp) + (c * KS + kk) * OS;                                           \
                T *xc = (T *)(xp) + c * ID * IH * IW;                                            \
                const int64_t offw = kw * w_->d[2] - w_->pb[2], sw = w_->s[2];                   \
                int64_t lo, hi;                                                                  \
                om_window_valid(IW, sw, offw, OW, &lo, &hi);                                     \
                for (int64_t od = 0; od < OD; od++) {                                            \
                    const int64_t id = od * w_->s[0] - w_->pb[0] + kd * w_->d[0];                \
                    for (int64_t oh = 0; oh < OH; oh++) {                                        \
                        T *restrict dst = colr + (od * OH + oh) * OW;                            \
                        const int64_t ih = oh * w_->s[1] - w_->pb[1] + kh * w_->d[1];            \
                        if (id < 0 || id >= ID || ih < 0 || ih >= IH) {                          \
                            if (!(ADD)) for (int64_t ow = 0; ow < OW; ow++) dst[ow] = 0;         \
                            continue;                                                            \
                        }                                                                        \
                        T *restrict src = xc + (id * IH + ih) * IW;                              \
                        if (ADD) {                                                               \
                            if (sw == 1) for (int64_t ow = lo; ow < hi; ow++) src[ow + offw] += dst[ow]; \
                            else for (int64_t ow = lo; ow < hi; ow++) src[ow * sw + offw] += dst[ow]; \
                        } else {                                                                 \
                            for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0;                     \
                            if (sw == 1) for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow + offw]; \
                            else for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * sw + offw]; \
                            for (int64_t ow = hi; ow < OW; ow++) dst[ow] = 0;                    \
                        }                                                                        \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    } while (0)

/* ---- geometry ----------------------------------------------------------------------- */

typedef struct conv_geom {
    om_window w;
    int64_t M, G, Cg, Mg, KS, IS, OS;
} conv_geom;

/* x dims (xr, xd) and w dims (wr, wd): checks channels/groups and fills g. */
static om_status *conv_geometry(const om_node *n, int xr, const int64_t *xd, int wr, const int64_t *wd,
                                conv_geom *g) {
    if (wr != xr || xr < 3)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X has rank %d and W rank %d (they must match, >= 3)",
                        n->op->name, om_sp_name(n), xr, wr);
    OM_TRY(om_window_init(n, xr, xd, wd + 2, 0, &g->w));
    g->G = om_attr_int(n, "group", 1);
    g->M = wd[0];
    if (g->G < 1 || xd[1] % g->G || g->M % g->G || wd[1] * g->G != xd[1])
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X has %lld channels, W is (%lld, %lld, ...) with "
                        "group %lld: need C == W.dims[1] * group and M divisible by group", n->op->name,
                        om_sp_name(n), (long long)xd[1], (long long)wd[0], (long long)wd[1], (long long)g->G);
    g->Cg = wd[1];
    g->Mg = g->M / g->G;
    g->KS = om_window_k_size(&g->w);
    g->IS = om_window_in_size(&g->w);
    g->OS = om_window_out_size(&g->w);
    return NULL;
}

static om_status *float_in(const om_node *n, const om_tensor *t, int i, om_dtype want) {
    if ((t->dtype != OM_F32 && t->dtype != OM_F64) || (want && t->dtype != want)) return om_err_dtype(n, i, t->dtype);
    return NULL;
}

/* A shape input known at plan time (Shape(X) folded) into dims; returns its rank. */
static om_status *shape_input(const om_node *n, const om_tensor *t, int i, int64_t *dims, int *rank) {
    *rank = om_read_ints(t, dims, OM_MAX_RANK);
    if (*rank < 0)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d must be a shape known at plan time",
                        n->op->name, om_sp_name(n), i);
    return NULL;
}

static om_status *check_dy(const om_node *n, const om_tensor *dy, const conv_geom *g) {
    om_tensor want = {0};
    om_window_out_shape(&g->w, g->M, dy->dtype, &want);
    if (!om_shape_equal(dy, &want)) {
        char a[128], b[128];
        om_shape_str(dy, a, sizeof a);
        om_shape_str(&want, b, sizeof b);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dY is %s, expected %s", n->op->name, om_sp_name(n), a, b);
    }
    return NULL;
}

/* ---- Conv --------------------------------------------------------------------------- */

static om_status *conv_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0], *w = &ctx->in[1];
    conv_geom g;
    OM_TRY(float_in(n, x, 0, 0));
    OM_TRY(float_in(n, w, 1, x->dtype));
    OM_TRY(conv_geometry(n, x->rank, x->dims, w->rank, w->dims, &g));
    if (ctx->n_in > 2 && ctx->in[2].dtype != OM_UNDEFINED) {
        OM_TRY(float_in(n, &ctx->in[2], 2, x->dtype));
        if (om_tensor_numel(&ctx->in[2]) != g.M)
            return om_error(OM_INVALID_ARGUMENT, "Conv node '%s': B must have %lld elements", om_sp_name(n),
                            (long long)g.M);
    }
    om_window_out_shape(&g.w, g.M, x->dtype, &ctx->out[0]);
    return NULL;
}

// x is (N, C, *S), w is (M, C/G, *K), b is (M), y is (N, M, *O)
static om_status *conv_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0], *w = &ctx->in[1];
    const int has_b = ctx->n_in > 2 && ctx->in[2].dtype != OM_UNDEFINED;
    conv_geom g;
    OM_TRY(conv_geometry(n, x->rank, x->dims, w->rank, w->dims, &g));
    const int trivial = window_trivial(&g.w);
    const int64_t CK = g.Cg * g.KS;
    CONV_DISPATCH(x->dtype, n, {
        const T *xp = x->data, *wp = w->data, *bp = has_b ? ctx->in[2].data : NULL;
        T *yp = ctx->out[0].data;
        T *col = trivial ? NULL : om_alloc((size_t)(CK * g.OS) * sizeof(T));
        if (!trivial && !col) return om_error(OM_OUT_OF_MEMORY, "Conv node '%s': no memory for im2col", om_sp_name(n));
        for (int64_t b = 0; b < g.w.N; b++) {
            for (int64_t gi = 0; gi < g.G; gi++) {
                const T *xg = xp + (b * g.w.C + gi * g.Cg) * g.IS;
                if (!trivial) IM2COL(T, 0, xg, col, g.Cg, &g.w);
                T *yg = yp + (b * g.M + gi * g.Mg) * g.OS;
                GEMM_T(T)(0, 0, g.Mg, g.OS, CK, wp + gi * g.Mg * CK, trivial ? xg : col, 0, yg);
            }
            if (bp) {
                T *yb = yp + b * g.M * g.OS;
                OM_PARALLEL_FOR(g.M * g.OS > OM_CHUNK)
                for (int64_t m = 0; m < g.M; m++) {
                    T *restrict yr = yb + m * g.OS;
                    const T bv = bp[m];
                    for (int64_t o = 0; o < g.OS; o++) yr[o] += bv;
                }
            }
        }
        om_free(col);
    });
    return NULL;
}

static om_status *conv_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int x = n->in[0], w = n->in[1], has_b = n->n_in > 2 && n->in[2] >= 0;
    const int dy = c->dy[0];
    if (dy < 0) return NULL;
    if (c->need_dx[0]) {
        int in[3] = {dy, w, -1};
        if ((in[2] = om_emit_shape(c, x)) < 0) return NULL;
        int v = om_emit(c, "ConvGradX", in, 3);
        if (v < 0) return NULL;
        om_copy_attrs(c, c->node);
        c->dx[0] = v;
    }
    const int need_w = c->need_dx[1], need_b = has_b && c->need_dx[2];
    if (need_w || need_b) {
        /* without dW the kernel needs no X: pass none so that X is not kept for backward */
        int in[3] = {dy, need_w ? x : -1, -1}, out[2] = {-1, -1};
        if ((in[2] = om_emit_shape(c, w)) < 0) return NULL;
        if (om_emit_node(c, "ConvGradW", in, 3, out, need_b ? 2 : 1, NULL) < 0) return NULL;
        om_copy_attrs(c, c->node);
        if (need_w) c->dx[1] = out[0];
        if (need_b) c->dx[2] = out[1];
    }
    return NULL;
}

/* ---- ConvGradX(dY, W, Shape(X)) -> dX --------------------------------------------------- */

static om_status *conv_grad_x_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *w = &ctx->in[1];
    int64_t xd[OM_MAX_RANK];
    int xr;
    conv_geom g;
    OM_TRY(float_in(n, dy, 0, 0));
    OM_TRY(float_in(n, w, 1, dy->dtype));
    OM_TRY(shape_input(n, &ctx->in[2], 2, xd, &xr));
    OM_TRY(conv_geometry(n, xr, xd, w->rank, w->dims, &g));
    OM_TRY(check_dy(n, dy, &g));
    ctx->out[0].dtype = dy->dtype;
    ctx->out[0].rank = xr;
    memcpy(ctx->out[0].dims, xd, sizeof(int64_t) * (size_t)xr);
    return NULL;
}

// dy is (N, M, *O), w is (M, C/G, *K), dx is (N, C, *S)
static om_status *conv_grad_x_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *w = &ctx->in[1];
    om_tensor *dx = &ctx->out[0];
    conv_geom g;
    OM_TRY(conv_geometry(n, dx->rank, dx->dims, w->rank, w->dims, &g));
    const int trivial = window_trivial(&g.w);
    const int64_t CK = g.Cg * g.KS;
    CONV_DISPATCH(dy->dtype, n, {
        const T *dyp = dy->data, *wp = w->data;
        T *dxp = dx->data;
        T *col = trivial ? NULL : om_alloc((size_t)(CK * g.OS) * sizeof(T));
        if (!trivial && !col) return om_error(OM_OUT_OF_MEMORY, "ConvGradX node '%s': no memory", om_sp_name(n));
        if (!trivial) memset(dxp, 0, (size_t)om_tensor_numel(dx) * sizeof(T));
        for (int64_t b = 0; b < g.w.N; b++)
            for (int64_t gi = 0; gi < g.G; gi++) {
                T *dxg = dxp + (b * g.w.C + gi * g.Cg) * g.IS;
                const T *dyg = dyp + (b * g.M + gi * g.Mg) * g.OS;
                /* dcol (CK, OS) = W_g^T (CK, Mg) @ dy_g (Mg, OS); trivial: dcol is dx itself */
                GEMM_T(T)(1, 0, CK, g.OS, g.Mg, wp + gi * g.Mg * CK, dyg, 0, trivial ? dxg : col);
                if (!trivial) IM2COL(T, 1, dxg, col, g.Cg, &g.w);
            }
        om_free(col);
    });
    return NULL;
}

/* ---- ConvGradW(dY, X?, Shape(W)) -> dW, dB? ------------------------------------------- */

static om_status *conv_grad_w_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *x = &ctx->in[1];
    int64_t wd[OM_MAX_RANK];
    int wr;
    conv_geom g;
    OM_TRY(float_in(n, dy, 0, 0));
    OM_TRY(shape_input(n, &ctx->in[2], 2, wd, &wr));
    if (x->dtype != OM_UNDEFINED) {
        OM_TRY(float_in(n, x, 1, dy->dtype));
        OM_TRY(conv_geometry(n, x->rank, x->dims, wr, wd, &g));
        OM_TRY(check_dy(n, dy, &g));
    } else if (dy->rank < 3 || dy->dims[1] != wd[0]) {
        return om_error(OM_INVALID_ARGUMENT, "ConvGradW node '%s': dY does not match W", om_sp_name(n));
    }
    ctx->out[0].dtype = dy->dtype;
    ctx->out[0].rank = wr;
    memcpy(ctx->out[0].dims, wd, sizeof(int64_t) * (size_t)wr);
    if (ctx->n_out > 1) {
        ctx->out[1].dtype = dy->dtype;
        ctx->out[1].rank = 1;
        ctx->out[1].dims[0] = wd[0];
    }
    return NULL;
}

// dy is (N, M, *O), x is (N, C, *S), dw is (M, C/G, *K), db is (M)
static om_status *conv_grad_w_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *x = &ctx->in[1];
    om_tensor *dw = &ctx->out[0];
    CONV_DISPATCH(dy->dtype, n, {
        const T *dyp = dy->data;
        if (x->dtype == OM_UNDEFINED) {
            if (dw->data) memset(dw->data, 0, (size_t)om_tensor_numel(dw) * sizeof(T));
        } else if (dw->data) {
            conv_geom g;
            OM_TRY(conv_geometry(n, x->rank, x->dims, dw->rank, dw->dims, &g));
            const int trivial = window_trivial(&g.w);
            const int64_t CK = g.Cg * g.KS;
            const T *xp = x->data;
            T *dwp = dw->data;
            T *col = trivial ? NULL : om_alloc((size_t)(CK * g.OS) * sizeof(T));
            if (!trivial && !col) return om_error(OM_OUT_OF_MEMORY, "ConvGradW node '%s': no memory", om_sp_name(n));
            for (int64_t b = 0; b < g.w.N; b++)
                for (int64_t gi = 0; gi < g.G; gi++) {
                    const T *xg = xp + (b * g.w.C + gi * g.Cg) * g.IS;
                    if (!trivial) IM2COL(T, 0, xg, col, g.Cg, &g.w);
                    /* dW_g (Mg, CK) += dy_g (Mg, OS) @ col^T (OS, CK) */
                    GEMM_T(T)(0, 1, g.Mg, CK, g.OS, dyp + (b * g.M + gi * g.Mg) * g.OS, trivial ? xg : col,
                              b ? 1 : 0, dwp + gi * g.Mg * CK);
                }
            om_free(col);
        }
        if (ctx->n_out > 1 && ctx->out[1].data) {
            const int64_t N = dy->dims[0], M = dy->dims[1], OS = N > 0 && M > 0 ? om_tensor_numel(dy) / (N * M) : 0;
            T *dbp = ctx->out[1].data;
            OM_PARALLEL_FOR(N * M * OS > OM_CHUNK)
            for (int64_t m = 0; m < M; m++) {
                double acc = 0;
                for (int64_t b = 0; b < N; b++) {
                    const T *restrict r = dyp + (b * M + m) * OS;
                    T s = 0;
                    for (int64_t o = 0; o < OS; o++) s += r[o];
                    acc += s;
                }
                dbp[m] = (T)acc;
            }
        }
    });
    return NULL;
}

const om_op_def om_op_conv = {
    .name = "Conv", .domain = "", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = conv_infer, .grad = conv_grad, .cpu = conv_cpu, .diff_inputs = 0x7,
};

const om_op_def om_op_conv_grad_x = {
    .name = "ConvGradX", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = conv_grad_x_infer, .cpu = conv_grad_x_cpu,
};

const om_op_def om_op_conv_grad_w = {
    .name = "ConvGradW", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 2,
    .infer = conv_grad_w_infer, .cpu = conv_grad_w_cpu,
};
