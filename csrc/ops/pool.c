/* pool.c — pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool and their
 * backward ops.
 *
 * Exports:
 *   om_op_max_pool                 MaxPool                                 X -> Y, Indices?
 *   om_op_max_pool_grad            MaxPoolGrad         (domain ortmod)     (dY, Indices, Shape(X)) -> dX
 *   om_op_average_pool             AveragePool                             X -> Y
 *   om_op_average_pool_grad        AveragePoolGrad     (domain ortmod)     (dY, Shape(X)) -> dX
 *   om_op_global_average_pool      GlobalAveragePool                       X -> Y (N, C, 1, ...)
 *   om_op_global_max_pool          GlobalMaxPool                           X -> Y (N, C, 1, ...)
 *   om_op_global_pool_grad         GlobalPoolGrad      (domain ortmod)     (dY, X?, Y?, Shape(X)) -> dX
 *
 * Windows are 1-D, 2-D or 3-D (spatial.h); pads, auto_pad, dilations and ceil_mode follow
 * ONNX, and the AveragePool divisor follows PyTorch (count_include_pad counts taps inside
 * the padded input, so a ceil_mode window hanging past the end pads is not over-counted).
 * MaxPool's gradient routes dY through the argmax saved by the forward: the rule makes the
 * forward produce Indices (ONNX's flat index into X, storage_order 0), so backward needs
 * neither X nor Y. NaN wins a max window, as in PyTorch.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "ops/broadcast.h"
#include "ops/spatial.h"

static om_dtype max_pool_dtype(const om_graph *g, const om_node *n, int j) {
    return j == 1 ? OM_I64 : g->values[n->in[0]].dtype;
}

/* Every float type: fp16/bf16 run on the CUDA provider (the CPU plan refuses them, op.h). */
static om_status *float_in(const om_node *n, const om_tensor *t, int i) {
    if (!om_dtype_is_float(t->dtype)) return om_err_dtype(n, i, t->dtype);
    return NULL;
}

static om_status *shape_input(const om_node *n, const om_tensor *t, int i, int64_t *dims, int *rank) {
    *rank = om_read_ints(t, dims, OM_MAX_RANK);
    if (*rank < 0)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d must be a shape known at plan time",
                        n->op->name, om_sp_name(n), i);
    return NULL;
}

static om_status *pool_window(const om_node *n, int xr, const int64_t *xd, om_window *w) {
    return om_window_init(n, xr, xd, NULL, (int)om_attr_int(n, "ceil_mode", 0), w);
}

/* Does some window of w have no tap inside the input along some dim? Only a dilated window can
 * (eager keeps the padding at most half the kernel): one that starts in the leading padding
 * and steps over the whole input, or a ceil_mode window past its end. */
static int has_empty_window(const om_window *w) {
    for (int c = 0; c < OM_SP; c++)
        for (int64_t o = 0; o < w->out[c]; o++) {
            int any = 0;
            for (int64_t k = 0; k < w->k[c] && !any; k++) {
                const int64_t pos = o * w->s[c] - w->pb[c] + k * w->d[c];
                any = pos >= 0 && pos < w->in[c];
            }
            if (!any) return 1;
        }
    return 0;
}

static om_status *pool_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    om_window w;
    OM_TRY(float_in(n, x, 0));
    OM_TRY(pool_window(n, x->rank, x->dims, &w));
    if (om_attr_int(n, "storage_order", 0) != 0)
        return om_err_unsupported(n, "storage_order = 1 (column-major indices)");
    /* an empty window's max is -inf, as eager's; but eager's index there is its first tap
     * stepped past the leading padding, a position outside the window (in the next row, or
     * past the plane), and eager's backward adds that window's gradient to it: refused
     * wherever the Indices are made (asked for, or for the gradient) */
    if (n->op_id == om_op_max_pool_id && ctx->n_out > 1 && n->out[1] >= 0 && has_empty_window(&w))
        return om_err_unsupported(n, "a window with no tap inside the input (a dilated kernel stepping over it): "
                                     "eager's index there, and where its gradient goes, lie outside the window");
    om_window_out_shape(&w, w.C, x->dtype, &ctx->out[0]);
    if (ctx->n_out > 1) om_window_out_shape(&w, w.C, OM_I64, &ctx->out[1]);
    return NULL;
}

/* Walks the taps of output position (od, oh, ow) that fall inside the input; BODY sees
 * `int64_t at` (the tap's offset inside the plane). */
#define FOR_TAPS(w, od, oh, ow, ...)                                                           \
    for (int64_t kd_ = 0; kd_ < (w)->k[0]; kd_++) {                                            \
        const int64_t id_ = (od) * (w)->s[0] - (w)->pb[0] + kd_ * (w)->d[0];                   \
        if (id_ < 0 || id_ >= (w)->in[0]) continue;                                            \
        for (int64_t kh_ = 0; kh_ < (w)->k[1]; kh_++) {                                        \
            const int64_t ih_ = (oh) * (w)->s[1] - (w)->pb[1] + kh_ * (w)->d[1];               \
            if (ih_ < 0 || ih_ >= (w)->in[1]) continue;                                        \
            for (int64_t kw_ = 0; kw_ < (w)->k[2]; kw_++) {                                    \
                const int64_t iw_ = (ow) * (w)->s[2] - (w)->pb[2] + kw_ * (w)->d[2];           \
                if (iw_ < 0 || iw_ >= (w)->in[2]) continue;                                    \
                const int64_t at = (id_ * (w)->in[1] + ih_) * (w)->in[2] + iw_;                \
                __VA_ARGS__;                                                                   \
            }                                                                                  \
        }                                                                                      \
    }

/* ---- MaxPool ------------------------------------------------------------------------ */

/* Output positions whose whole window lies inside the input (no padding, no clipping):
 * rows (od, oh) with interior_rows, columns ow in [w_lo, w_hi). Their taps need no
 * bounds checks: tap (kd, kh, kw) sits at base + kd * dD + kh * dH + kw * dW. */
#define POOL_TAPS_TABLED 64

typedef struct pool_interior {
    int64_t w_lo, w_hi;
    int64_t dD, dH, dW;   /* plane offsets between neighbouring taps */
    int ntaps;            /* taps in tap_off: all of the window's, or 0 when it has more */
    int pairs;            /* tabled taps, 2 wide at stride 2 along W, undilated: MAX_ROW_PAIRS */
    int64_t tap_off[POOL_TAPS_TABLED];   /* tap t's offset from the window's first tap */
} pool_interior;

static int64_t interior_first(int64_t s, int64_t pb) { return pb > 0 ? (pb + s - 1) / s : 0; }

static void pool_interior_init(const om_window *w, pool_interior *it) {
    /* ow * s - pb >= 0 and ow * s - pb + (k - 1) * d < in */
    const int64_t last = w->in[2] + w->pb[2] - (w->k[2] - 1) * w->d[2];   /* ow * s < last */
    it->w_lo = interior_first(w->s[2], w->pb[2]);
    it->w_hi = last > 0 ? (last + w->s[2] - 1) / w->s[2] : 0;
    if (it->w_hi > w->out[2]) it->w_hi = w->out[2];
    if (it->w_lo > it->w_hi) it->w_lo = it->w_hi;
    it->dD = w->d[0] * w->in[1] * w->in[2];
    it->dH = w->d[1] * w->in[2];
    it->dW = w->d[2];
    const int64_t ks = om_window_k_size(w);
    it->ntaps = ks <= POOL_TAPS_TABLED ? (int)ks : 0;
    for (int t = 0; t < it->ntaps; t++) {
        const int64_t kd = t / (w->k[1] * w->k[2]), kh = t / w->k[2] % w->k[1], kw = t % w->k[2];
        it->tap_off[t] = kd * it->dD + kh * it->dH + kw * it->dW;
    }
    it->pairs = it->ntaps && w->k[2] == 2 && w->s[2] == 2 && w->d[2] == 1;
}

/* Is row (od, oh) of output positions clear of the padding along D and H? */
static int pool_row_interior(const om_window *w, int64_t od, int64_t oh) {
    const int64_t id = od * w->s[0] - w->pb[0], ih = oh * w->s[1] - w->pb[1];
    return id >= 0 && id + (w->k[0] - 1) * w->d[0] < w->in[0] && ih >= 0 && ih + (w->k[1] - 1) * w->d[1] < w->in[1];
}

typedef struct pool_args {
    om_window w;
    pool_interior it;
    int64_t IS, OS;
    const void *src;   /* x (forward) or dy (backward) */
    void *dst;         /* y or dx */
    int64_t *idx;      /* MaxPool's Indices (NULL when not asked for) */
    const int64_t *in_idx;
    int incl;          /* AveragePool's count_include_pad */
    atomic_int bad;    /* MaxPoolGrad: an index outside its plane */
} pool_args;

/* Planes per range: about OM_GRAIN outputs, at least one plane. */
static int64_t plane_grain(int64_t per_plane) { return per_plane > 0 ? OM_GRAIN / per_plane + 1 : OM_GRAIN; }

/* a's window over the input dims (rank, dims), its interior and plane sizes; returns the planes
 * (N * C) in *P. */
static om_status *pool_setup(const om_node *n, int rank, const int64_t *dims, pool_args *a, int64_t *P) {
    OM_TRY(pool_window(n, rank, dims, &a->w));
    pool_interior_init(&a->w, &a->it);
    a->IS = om_window_in_size(&a->w);
    a->OS = om_window_out_size(&a->w);
    *P = a->w.N * a->w.C;
    return NULL;
}

/* The first tap wins a tie; NaN wins the window, and a later NaN replaces an earlier one:
 * eager's rule, (v > max) || isnan(v), which decides where the gradient goes. */
#define MAX_TAP(T, xc, best, bi, at)                                                           \
    do {                                                                                       \
        const T v_ = (xc)[at];                                                                 \
        if (bi < 0 || v_ > best || v_ != v_) { best = v_; bi = (at); }                         \
    } while (0)

/* One tap over n interior positions of a row, position i reading src[i * S]: the same
 * rule as MAX_TAP, written without branches so that the loop vectorizes (random data
 * mispredicts half of MAX_TAP's branches). at0: the plane offset of src[0]; pIS: the
 * plane's offset in X (Indices are flat over X). */
#define MAX_ROW_PASS(T, S, yr, src, n)                                                         \
    for (int64_t i = 0; i < (n); i++) {                                                        \
        const T v = (src)[i * (S)], b = (yr)[i];                                               \
        const int take = (v > b) | (v != v);                                                \
        (yr)[i] = take ? v : b;                                                                \
    }
/* the same, keeping the winning offset (an int64 Indices entry) */
#define MAX_ROW_PASS_AT(T, S, yr, ir, src, n, at0, pIS)                                        \
    for (int64_t i = 0; i < (n); i++) {                                                        \
        const T v = (src)[i * (S)], b = (yr)[i];                                               \
        const int take = (v > b) | (v != v);                                                \
        (yr)[i] = take ? v : b;                                                                \
        (ir)[i] = take ? (pIS) + (at0) + i * (S) : (ir)[i];                                    \
    }

/* The taps of n interior positions of a row, at stride S: the first tap initializes, the
 * others are MAX_ROW_PASSes. */
#define MAX_ROW_TAPS(T, S, w, it, xc, yr, ir, n, base, pIS)                                    \
    do {                                                                                       \
        if ((ir) && (it)->ntaps) {                                                             \
            MAX_ROW_TAP_IDS(T, S, it, xc, yr, ir, n, base, pIS);                               \
            break;                                                                             \
        }                                                                                      \
        for (int64_t i = 0; i < (n); i++) (yr)[i] = (xc)[(base) + i * (S)];                    \
        if (ir)                                                                                \
            for (int64_t i = 0; i < (n); i++) (ir)[i] = (pIS) + (base) + i * (S);              \
        for (int64_t kd = 0; kd < (w)->k[0]; kd++)                                             \
            for (int64_t kh = 0; kh < (w)->k[1]; kh++)                                         \
                for (int64_t kw = kd || kh ? 0 : 1; kw < (w)->k[2]; kw++) {                    \
                    const int64_t at0 = (base) + kd * (it)->dD + kh * (it)->dH + kw * (it)->dW; \
                    const T *restrict src = (xc) + at0;                                        \
                    if (ir) { MAX_ROW_PASS_AT(T, S, yr, ir, src, n, at0, pIS) }                \
                    else { MAX_ROW_PASS(T, S, yr, src, n) }                                    \
                }                                                                              \
    } while (0)

/* With Indices: the passes keep the winning tap's number, an int32 as wide as a float
 * lane (an int64 offset per lane kept GCC from vectorizing them), and the offsets are
 * written at the end, up to 256 positions at a time. */
#define MAX_ROW_TAP_IDS(T, S, it, xc, yr, ir, n, base, pIS)                                    \
    for (int64_t c0 = 0; c0 < (n); c0 += 256) {                                                \
        int32_t tid[256];                                                                      \
        const int64_t m = (n) - c0 < 256 ? (n) - c0 : 256;                                     \
        T *restrict yc = (yr) + c0;                                                            \
        const T *xb = (xc) + (base) + c0 * (S);                                                \
        for (int64_t i = 0; i < m; i++) {                                                      \
            yc[i] = xb[i * (S)];                                                               \
            tid[i] = 0;                                                                        \
        }                                                                                      \
        for (int32_t t = 1; t < (it)->ntaps; t++) {                                            \
            const T *restrict src = xb + (it)->tap_off[t];                                     \
            for (int64_t i = 0; i < m; i++) {                                                  \
                const T v = src[i * (S)], b = yc[i];                                           \
                const int take = (v > b) | (v != v);                                        \
                yc[i] = take ? v : b;                                                          \
                tid[i] = take ? t : tid[i];                                                    \
            }                                                                                  \
        }                                                                                      \
        for (int64_t i = 0; i < m; i++)                                                        \
            (ir)[c0 + i] = (pIS) + (base) + (c0 + i) * (S) + (it)->tap_off[tid[i]];            \
    }

/* Windows two wide at stride 2 along W, undilated (MaxPool2d(2), the usual downsampling):
 * the two taps of a window row are a pair of neighbouring inputs, and a pass takes both,
 * reading its input row densely. The one-tap passes above read it at stride 2, a load
 * pattern with a gap that GCC peels a vector's worth of positions off for: on the 16-wide
 * rows of a small image every position then ran the scalar, branchy tail (about 6x slower
 * on random data). Same rule and tap order: tap t = 2 * r + kw, r the window row (kd, kh),
 * pairs at tap_off[2 * r] (+ 1). Up to 256 positions at a time, as MAX_ROW_TAP_IDS. */
#define MAX_PAIR_TAKE(T, v, b, t, tid)                                                         \
    do {                                                                                       \
        const int take_ = ((v) > (b)) | ((v) != (v));                                          \
        (b) = take_ ? (v) : (b);                                                               \
        tid = take_ ? (t) : tid;                                                               \
    } while (0)
#define MAX_ROW_PAIRS(T, it, xc, yr, ir, n, base, pIS)                                         \
    for (int64_t c0 = 0; c0 < (n); c0 += 256) {                                                \
        int32_t tid[256];                                                                      \
        const int64_t m = (n) - c0 < 256 ? (n) - c0 : 256;                                     \
        T *restrict yc = (yr) + c0;                                                            \
        const T *restrict xb = (xc) + (base) + c0 * 2;                                         \
        for (int64_t i = 0; i < m; i++) {                                                      \
            T b = xb[2 * i];                                                                   \
            int32_t t_ = 0;                                                                    \
            const T v = xb[2 * i + 1];                                                         \
            MAX_PAIR_TAKE(T, v, b, 1, t_);                                                     \
            yc[i] = b;                                                                         \
            tid[i] = t_;                                                                       \
        }                                                                                      \
        for (int32_t t = 2; t < (it)->ntaps; t += 2) {                                         \
            const T *restrict src = xb + (it)->tap_off[t];                                     \
            for (int64_t i = 0; i < m; i++) {                                                  \
                T b = yc[i];                                                                   \
                int32_t t_ = tid[i];                                                           \
                const T v0 = src[2 * i], v1 = src[2 * i + 1];                                  \
                MAX_PAIR_TAKE(T, v0, b, t, t_);                                                \
                MAX_PAIR_TAKE(T, v1, b, t + 1, t_);                                            \
                yc[i] = b;                                                                     \
                tid[i] = t_;                                                                   \
            }                                                                                  \
        }                                                                                      \
        if (ir)                                                                                \
            for (int64_t i = 0; i < m; i++)                                                    \
                (ir)[c0 + i] = (pIS) + (base) + (c0 + i) * 2 + (it)->tap_off[tid[i]];          \
    }

#define DEFINE_MAX_ROW(T, sfx)                                                                 \
    /* Positions [0, n) of an output row whose windows are interior: yr, ir (NULL: no  */     \
    /* Indices) the row's outputs, base the plane offset of position 0's first tap. */        \
    /* Strides 1 and 2 get loops of their own: a constant stride vectorizes. Cloned per */    \
    /* ISA: called per row from the cloned worker, it would otherwise be built for SSE2. */  \
    OM_VEC_CLONES static void max_row_##sfx(const om_window *w, const pool_interior *it, const T *xc, \
                                     T *restrict yr, int64_t *restrict ir, int64_t n, int64_t base, \
                                     int64_t pIS) {                                            \
        const int64_t s = w->s[2];                                                             \
        if (it->pairs) { MAX_ROW_PAIRS(T, it, xc, yr, ir, n, base, pIS) }                      \
        else if (s == 1) MAX_ROW_TAPS(T, 1, w, it, xc, yr, ir, n, base, pIS);                  \
        else if (s == 2) MAX_ROW_TAPS(T, 2, w, it, xc, yr, ir, n, base, pIS);                  \
        else MAX_ROW_TAPS(T, s, w, it, xc, yr, ir, n, base, pIS);                              \
    }
DEFINE_MAX_ROW(float, f32)
DEFINE_MAX_ROW(double, f64)

/* Walks one plane's output rows (od, oh): BODY sees o_row (the row's first position in
 * the plane's output), and [ilo, ihi), the row's positions whose windows are interior
 * (empty when the row's taps reach into the padding along D or H), with row_base the
 * plane offset of position 0's first tap (meaningful when the range is not empty). */
#define FOR_ROWS(w, it, ...)                                                                   \
    for (int64_t od = 0, o_row = 0; od < (w)->out[0]; od++)                                    \
        for (int64_t oh = 0; oh < (w)->out[1]; oh++, o_row += (w)->out[2]) {                   \
            const int row_in_ = pool_row_interior((w), od, oh);                                \
            const int64_t ilo = row_in_ ? (it)->w_lo : 0, ihi = row_in_ ? (it)->w_hi : 0;      \
            const int64_t row_base = ((od * (w)->s[0] - (w)->pb[0]) * (w)->in[1] +             \
                                      oh * (w)->s[1] - (w)->pb[1]) * (w)->in[2] - (w)->pb[2];  \
            __VA_ARGS__;                                                                       \
        }

#define MAX_POOL_WORKER(name, TT, sfx)                                                         \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                         \
        typedef TT T;                                                                          \
        const pool_args *a = c_;                                                               \
        const om_window *w = &a->w;                                                            \
        const int64_t OW = w->out[2];                                                          \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            const T *xc = (const T *)a->src + p * a->IS;                                       \
            T *yc = (T *)a->dst + p * a->OS;                                                   \
            int64_t *ic = a->idx ? a->idx + p * a->OS : NULL;                                  \
            FOR_ROWS(w, &a->it, {                                                              \
                for (int64_t ow = 0; ow < OW; ow++) {                                          \
                    if (ow == ilo && ilo < ihi) {   /* the interior run, one tap at a time */ \
                        max_row_##sfx(w, &a->it, xc, yc + o_row + ilo, ic ? ic + o_row + ilo : NULL, \
                                      ihi - ilo, row_base + ilo * w->s[2], p * a->IS);         \
                        ow = ihi - 1;                                                          \
                        continue;                                                              \
                    }                                                                          \
                    T best = -INFINITY;                                                        \
                    int64_t bi = -1;                                                           \
                    FOR_TAPS(w, od, oh, ow, MAX_TAP(T, xc, best, bi, at));                     \
                    yc[o_row + ow] = best;                                                     \
                    if (ic) ic[o_row + ow] = bi < 0 ? -1 : p * a->IS + bi;                     \
                }                                                                              \
            });                                                                                \
        }                                                                                      \
    }
MAX_POOL_WORKER(max_pool_f32, float, f32)
MAX_POOL_WORKER(max_pool_f64, double, f64)

// x is (N, C, *S), y and indices are (N, C, *O); planes (n, c) are independent
static om_status *max_pool_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    pool_args a = {.src = x->data, .dst = ctx->out[0].data, .idx = ctx->n_out > 1 ? ctx->out[1].data : NULL};
    int64_t P;
    OM_TRY(pool_setup(n, x->rank, x->dims, &a, &P));
    switch (x->dtype) {
    case OM_F32: om_pool_for(P, plane_grain(a.OS), max_pool_f32, &a); break;
    case OM_F64: om_pool_for(P, plane_grain(a.OS), max_pool_f64, &a); break;
    default: return om_err_dtype(n, 0, x->dtype);
    }
    return NULL;
}

static om_status *max_pool_grad(om_grad_ctx *c) {
    const int node = c->node;
    const int x = c->g->nodes[node].in[0], dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    const int idx = om_node_ensure_output(c->g, node, 1, OM_I64);
    if (idx < 0)
        return om_grad_fail(c, om_error(OM_INTERNAL, "MaxPool node '%s': cannot add the Indices output",
                                        c->g->nodes[node].name));
    int in[3] = {dy, idx, -1};
    if ((in[2] = om_emit_shape(c, x)) < 0) return NULL;
    int v = om_emit(c, om_op_max_pool_grad_id, in, 3);
    if (v < 0) return NULL;
    c->dx[0] = v;
    return NULL;
}

static om_status *max_pool_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    int64_t xd[OM_MAX_RANK];
    int xr;
    OM_TRY(float_in(n, &ctx->in[0], 0));
    if (ctx->in[1].dtype != OM_I64) return om_err_dtype(n, 1, ctx->in[1].dtype);
    if (!om_shape_equal(&ctx->in[0], &ctx->in[1]))
        return om_error(OM_INVALID_ARGUMENT, "MaxPoolGrad node '%s': dY and Indices differ in shape", om_sp_name(n));
    OM_TRY(shape_input(n, &ctx->in[2], 2, xd, &xr));
    if (xr < 2 || ctx->in[0].rank != xr || xd[0] != ctx->in[0].dims[0] || xd[1] != ctx->in[0].dims[1])
        return om_error(OM_INVALID_ARGUMENT, "MaxPoolGrad node '%s': dY does not match X", om_sp_name(n));
    ctx->out[0].dtype = ctx->in[0].dtype;
    ctx->out[0].rank = xr;
    memcpy(ctx->out[0].dims, xd, sizeof(int64_t) * (size_t)xr);
    return NULL;
}

#define MAX_POOL_GRAD_WORKER(name, TT)                                                         \
    static void name(void *c_, int64_t lo, int64_t hi) {                                       \
        typedef TT T;                                                                          \
        pool_args *a = c_;                                                                     \
        const int64_t IS = a->IS, OS = a->OS;                                                  \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            T *dxc = (T *)a->dst + p * IS;                                                     \
            const T *dyc = (const T *)a->src + p * OS;                                         \
            const int64_t *ic = a->in_idx + p * OS;                                            \
            memset(dxc, 0, (size_t)IS * sizeof(T));                                            \
            for (int64_t o = 0; o < OS; o++) {                                                 \
                const int64_t at = ic[o] - p * IS;                                             \
                if (at >= 0 && at < IS) dxc[at] += dyc[o];                                     \
                else if (ic[o] != -1) atomic_store_explicit(&a->bad, 1, memory_order_relaxed); \
            }                                                                                  \
        }                                                                                      \
    }
MAX_POOL_GRAD_WORKER(max_pool_grad_f32, float)
MAX_POOL_GRAD_WORKER(max_pool_grad_f64, double)

// dy, indices are (N, C, *O), dx is (N, C, *S): dx[indices] += dy (indices stay in their plane)
static om_status *max_pool_grad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0];
    om_tensor *dx = &ctx->out[0];
    const int64_t P = dx->dims[0] * dx->dims[1];
    pool_args a = {.src = dy->data, .dst = dx->data, .in_idx = ctx->in[1].data};
    a.IS = P ? om_tensor_numel(dx) / P : 0;
    a.OS = P ? om_tensor_numel(dy) / P : 0;
    atomic_init(&a.bad, 0);
    switch (dy->dtype) {
    case OM_F32: om_pool_for(P, plane_grain(a.OS + a.IS), max_pool_grad_f32, &a); break;
    case OM_F64: om_pool_for(P, plane_grain(a.OS + a.IS), max_pool_grad_f64, &a); break;
    default: return om_err_dtype(n, 0, dy->dtype);
    }
    if (atomic_load(&a.bad))
        return om_error(OM_RUNTIME, "MaxPoolGrad node '%s': an index lies outside its (n, c) plane", om_sp_name(n));
    return NULL;
}

/* ---- AveragePool -------------------------------------------------------------------- */

/* The divisor of output position (od, oh, ow): taps inside the input, or (count_include_pad)
 * taps inside the padded input. */
static inline int64_t avg_divisor(const om_window *w, int incl, int64_t od, int64_t oh, int64_t ow) {
    const int64_t o[OM_SP] = {od, oh, ow};
    int64_t div = 1;
    for (int i = 0; i < OM_SP; i++) {
        const int64_t lo = incl ? -w->pb[i] : 0, hi = incl ? w->in[i] + w->pe[i] : w->in[i];
        int64_t cnt = 0;
        for (int64_t k = 0; k < w->k[i]; k++) {
            const int64_t pos = o[i] * w->s[i] - w->pb[i] + k * w->d[i];
            cnt += pos >= lo && pos < hi;
        }
        div *= cnt;
    }
    return div;
}

/* The taps of a window, in order: BODY sees `toff`, the tap's offset from the first. */
#define FOR_TAP_OFFSETS(w, it, ...)                                                            \
    for (int64_t kd_ = 0; kd_ < (w)->k[0]; kd_++)                                              \
        for (int64_t kh_ = 0; kh_ < (w)->k[1]; kh_++)                                          \
            for (int64_t kw_ = 0; kw_ < (w)->k[2]; kw_++) {                                    \
                const int64_t toff = kd_ * (it)->dD + kh_ * (it)->dH + kw_ * (it)->dW;         \
                __VA_ARGS__;                                                                   \
            }

/* n interior positions of a row at stride S (their divisor is the window's size, taps
 * inside the input or the padded input alike): sums in tap order, as the scalar path. */
#define AVG_ROW_TAPS(T, S, w, it, x0, yr, n, ks)                                               \
    do {                                                                                       \
        for (int64_t i = 0; i < (n); i++) (yr)[i] = 0;                                         \
        FOR_TAP_OFFSETS(w, it, {                                                               \
            const T *restrict src_ = (x0) + toff;                                              \
            for (int64_t i = 0; i < (n); i++) (yr)[i] += src_[i * (S)];                        \
        });                                                                                    \
        for (int64_t i = 0; i < (n); i++) (yr)[i] /= (T)(ks);                                  \
    } while (0)

#define AVG_POOL_WORKER(name, TT)                                                              \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                         \
        typedef TT T;                                                                          \
        const pool_args *a = c_;                                                               \
        const om_window *w = &a->w;                                                            \
        const int64_t OW = w->out[2], s = w->s[2], ks = om_window_k_size(w);                   \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            const T *xc = (const T *)a->src + p * a->IS;                                       \
            T *yc = (T *)a->dst + p * a->OS;                                                   \
            FOR_ROWS(w, &a->it, {                                                              \
                for (int64_t ow = 0; ow < OW; ow++) {                                          \
                    if (ow == ilo && ilo < ihi) {   /* the interior run, one tap at a time */ \
                        const T *x0 = xc + row_base + ilo * s;                                 \
                        T *restrict yr = yc + o_row + ilo;                                     \
                        if (s == 1) AVG_ROW_TAPS(T, 1, w, &a->it, x0, yr, ihi - ilo, ks);      \
                        else if (s == 2) AVG_ROW_TAPS(T, 2, w, &a->it, x0, yr, ihi - ilo, ks); \
                        else AVG_ROW_TAPS(T, s, w, &a->it, x0, yr, ihi - ilo, ks);             \
                        ow = ihi - 1;                                                          \
                        continue;                                                              \
                    }                                                                          \
                    T sum = 0;                                                                 \
                    FOR_TAPS(w, od, oh, ow, sum += xc[at]);                                    \
                    const int64_t div = avg_divisor(w, a->incl, od, oh, ow);                   \
                    yc[o_row + ow] = div > 0 ? sum / (T)div : 0;                               \
                }                                                                              \
            });                                                                                \
        }                                                                                      \
    }
AVG_POOL_WORKER(average_pool_f32, float)
AVG_POOL_WORKER(average_pool_f64, double)

// x is (N, C, *S), y is (N, C, *O)
static om_status *average_pool_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    pool_args a = {.src = x->data, .dst = ctx->out[0].data, .incl = om_attr_int(n, "count_include_pad", 0) != 0};
    int64_t P;
    OM_TRY(pool_setup(n, x->rank, x->dims, &a, &P));
    switch (x->dtype) {
    case OM_F32: om_pool_for(P, plane_grain(a.OS), average_pool_f32, &a); break;
    case OM_F64: om_pool_for(P, plane_grain(a.OS), average_pool_f64, &a); break;
    default: return om_err_dtype(n, 0, x->dtype);
    }
    return NULL;
}

static om_status *average_pool_grad(om_grad_ctx *c) {
    const int x = c->g->nodes[c->node].in[0], dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    int in[2] = {dy, -1};
    if ((in[1] = om_emit_shape(c, x)) < 0) return NULL;
    int v = om_emit(c, om_op_average_pool_grad_id, in, 2);
    if (v < 0) return NULL;
    om_copy_attrs(c, c->node);
    c->dx[0] = v;
    return NULL;
}

static om_status *average_pool_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    int64_t xd[OM_MAX_RANK];
    int xr;
    om_window w;
    OM_TRY(float_in(n, &ctx->in[0], 0));
    OM_TRY(shape_input(n, &ctx->in[1], 1, xd, &xr));
    OM_TRY(pool_window(n, xr, xd, &w));
    om_tensor want = {0};
    om_window_out_shape(&w, w.C, ctx->in[0].dtype, &want);
    if (!om_shape_equal(&want, &ctx->in[0]))
        return om_error(OM_INVALID_ARGUMENT, "AveragePoolGrad node '%s': dY does not match the pooled X", om_sp_name(n));
    ctx->out[0].dtype = ctx->in[0].dtype;
    ctx->out[0].rank = xr;
    memcpy(ctx->out[0].dims, xd, sizeof(int64_t) * (size_t)xr);
    return NULL;
}

/* dx += dy / ks over each tap of n interior positions of a row at stride S (one tap's
 * positions land on distinct inputs). */
#define AVG_ROW_GRAD_TAPS(T, S, w, it, dx0, dyr, n, ks)                                        \
    FOR_TAP_OFFSETS(w, it, {                                                                   \
        T *restrict dst_ = (dx0) + toff;                                                       \
        for (int64_t i = 0; i < (n); i++) dst_[i * (S)] += (dyr)[i] / (T)(ks);                 \
    })

#define AVG_POOL_GRAD_WORKER(name, TT)                                                         \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                         \
        typedef TT T;                                                                          \
        const pool_args *a = c_;                                                               \
        const om_window *w = &a->w;                                                            \
        const int64_t OW = w->out[2], s = w->s[2], ks = om_window_k_size(w);                   \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            T *dxc = (T *)a->dst + p * a->IS;                                                  \
            const T *dyc = (const T *)a->src + p * a->OS;                                      \
            memset(dxc, 0, (size_t)a->IS * sizeof(T));                                         \
            FOR_ROWS(w, &a->it, {                                                              \
                for (int64_t ow = 0; ow < OW; ow++) {                                          \
                    if (ow == ilo && ilo < ihi) {   /* the interior run, one tap at a time */ \
                        T *dx0 = dxc + row_base + ilo * s;                                     \
                        const T *dyr = dyc + o_row + ilo;                                      \
                        if (s == 1) { AVG_ROW_GRAD_TAPS(T, 1, w, &a->it, dx0, dyr, ihi - ilo, ks); } \
                        else if (s == 2) { AVG_ROW_GRAD_TAPS(T, 2, w, &a->it, dx0, dyr, ihi - ilo, ks); } \
                        else { AVG_ROW_GRAD_TAPS(T, s, w, &a->it, dx0, dyr, ihi - ilo, ks); }  \
                        ow = ihi - 1;                                                          \
                        continue;                                                              \
                    }                                                                          \
                    const int64_t div = avg_divisor(w, a->incl, od, oh, ow);                   \
                    if (div <= 0) continue;                                                    \
                    const T g = dyc[o_row + ow] / (T)div;                                      \
                    FOR_TAPS(w, od, oh, ow, dxc[at] += g);                                     \
                }                                                                              \
            });                                                                                \
        }                                                                                      \
    }
AVG_POOL_GRAD_WORKER(average_pool_grad_f32, float)
AVG_POOL_GRAD_WORKER(average_pool_grad_f64, double)

// dy is (N, C, *O), dx is (N, C, *S)
static om_status *average_pool_grad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    om_tensor *dx = &ctx->out[0];
    pool_args a = {.src = ctx->in[0].data, .dst = dx->data, .incl = om_attr_int(n, "count_include_pad", 0) != 0};
    int64_t P;
    OM_TRY(pool_setup(n, dx->rank, dx->dims, &a, &P));
    switch (dx->dtype) {
    case OM_F32: om_pool_for(P, plane_grain(a.OS + a.IS), average_pool_grad_f32, &a); break;
    case OM_F64: om_pool_for(P, plane_grain(a.OS + a.IS), average_pool_grad_f64, &a); break;
    default: return om_err_dtype(n, 0, dx->dtype);
    }
    return NULL;
}

/* ---- GlobalAveragePool / GlobalMaxPool ------------------------------------------------ */

static om_status *global_pool_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    OM_TRY(float_in(n, x, 0));
    if (x->rank < 2)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X must have rank >= 2", n->op->name, om_sp_name(n));
    om_set_shape(&ctx->out[0], x, x->dtype);
    for (int i = 2; i < x->rank; i++) ctx->out[0].dims[i] = 1;
    return NULL;
}

typedef struct global_args {
    const void *x, *y, *dy;
    void *out;
    int64_t S;
    int is_max;
} global_args;

/* Planes [lo, hi): the mean or the max (NaN wins) of each. The sum stays in order: it is
 * a small share of any step, and the model suites compare a few training steps against
 * eager, whose mean this order follows closely. */
#define GLOBAL_POOL_WORKER(name, TT)                                                           \
    static void name(void *c_, int64_t lo, int64_t hi) {                                       \
        typedef TT T;                                                                          \
        const global_args *a = c_;                                                             \
        const int64_t S = a->S;                                                                \
        T *yp = a->out;                                                                        \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            const T *restrict r = (const T *)a->x + p * S;                                     \
            if (a->is_max) {                                                                   \
                T m = -INFINITY;                                                               \
                for (int64_t i = 0; i < S; i++) m = (r[i] > m || r[i] != r[i]) && m == m ? r[i] : m; \
                yp[p] = m;                                                                     \
            } else {                                                                           \
                T s = 0;                                                                       \
                for (int64_t i = 0; i < S; i++) s += r[i];                                     \
                yp[p] = S ? s / (T)S : 0;                                                      \
            }                                                                                  \
        }                                                                                      \
    }
GLOBAL_POOL_WORKER(global_pool_f32, float)
GLOBAL_POOL_WORKER(global_pool_f64, double)

// x is (N, C, S), y is (N, C)
static om_status *global_pool_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    const int64_t P = x->dims[0] * x->dims[1];
    global_args a = {.x = x->data, .out = ctx->out[0].data, .S = P ? om_tensor_numel(x) / P : 0,
                     .is_max = n->op_id == om_op_global_max_pool_id};
    switch (x->dtype) {
    case OM_F32: om_pool_for(P, plane_grain(a.S), global_pool_f32, &a); break;
    case OM_F64: om_pool_for(P, plane_grain(a.S), global_pool_f64, &a); break;
    default: return om_err_dtype(n, 0, x->dtype);
    }
    return NULL;
}

/* GlobalPoolGrad(dY, X?, Y?, Shape(X)): average spreads dY / S; max (X and Y given) routes
 * dY to the first position equal to the max, as PyTorch's max reduction does. */
static om_status *global_pool_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int is_max = n->op_id == om_op_global_max_pool_id;
    const int x = n->in[0], y = n->out[0], dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    int in[4] = {dy, is_max ? x : -1, is_max ? y : -1, -1};
    if ((in[3] = om_emit_shape(c, x)) < 0) return NULL;
    int v = om_emit(c, om_op_global_pool_grad_id, in, 4);
    if (v < 0) return NULL;
    c->dx[0] = v;
    return NULL;
}

static om_status *global_pool_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    int64_t xd[OM_MAX_RANK];
    int xr;
    OM_TRY(float_in(n, &ctx->in[0], 0));
    OM_TRY(shape_input(n, &ctx->in[3], 3, xd, &xr));
    int64_t P = xr >= 2 ? xd[0] * xd[1] : -1;
    if (om_tensor_numel(&ctx->in[0]) != P)
        return om_error(OM_INVALID_ARGUMENT, "GlobalPoolGrad node '%s': dY does not match X", om_sp_name(n));
    ctx->out[0].dtype = ctx->in[0].dtype;
    ctx->out[0].rank = xr;
    memcpy(ctx->out[0].dims, xd, sizeof(int64_t) * (size_t)xr);
    return NULL;
}

#define GLOBAL_POOL_GRAD_WORKER(name, TT)                                                      \
    static void name(void *c_, int64_t lo, int64_t hi) {                                       \
        typedef TT T;                                                                          \
        const global_args *a = c_;                                                             \
        const int64_t S = a->S;                                                                \
        const T *dyp = a->dy;                                                                  \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            T *restrict d = (T *)a->out + p * S;                                               \
            if (a->is_max) {                                                                   \
                const T *r = (const T *)a->x + p * S;                                          \
                const T m = ((const T *)a->y)[p];                                              \
                int64_t at = -1;                                                               \
                for (int64_t i = 0; i < S && at < 0; i++)                                      \
                    if (r[i] == m || (m != m && r[i] != r[i])) at = i;                         \
                for (int64_t i = 0; i < S; i++) d[i] = 0;                                      \
                if (at >= 0) d[at] = dyp[p];                                                   \
            } else {                                                                           \
                const T g = S ? dyp[p] / (T)S : 0;                                             \
                for (int64_t i = 0; i < S; i++) d[i] = g;                                      \
            }                                                                                  \
        }                                                                                      \
    }
GLOBAL_POOL_GRAD_WORKER(global_pool_grad_f32, float)
GLOBAL_POOL_GRAD_WORKER(global_pool_grad_f64, double)

// dy is (N, C), x and dx are (N, C, S)
static om_status *global_pool_grad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    om_tensor *dx = &ctx->out[0];
    const int is_max = ctx->in[1].dtype != OM_UNDEFINED;
    const int64_t P = dx->dims[0] * dx->dims[1];
    global_args a = {.dy = ctx->in[0].data, .x = is_max ? ctx->in[1].data : NULL,
                     .y = is_max ? ctx->in[2].data : NULL, .out = dx->data, .S = P ? om_tensor_numel(dx) / P : 0,
                     .is_max = is_max};
    switch (dx->dtype) {
    case OM_F32: om_pool_for(P, plane_grain(a.S), global_pool_grad_f32, &a); break;
    case OM_F64: om_pool_for(P, plane_grain(a.S), global_pool_grad_f64, &a); break;
    default: return om_err_dtype(n, 0, dx->dtype);
    }
    return NULL;
}

const om_op_def om_op_max_pool = {
    .name = "MaxPool", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 2,
    .dtype = max_pool_dtype, .infer = pool_infer, .grad = max_pool_grad, .cpu = max_pool_cpu, .diff_inputs = 0x1,
    .attrs = OM_WINDOW_ATTRS " ceil_mode:int storage_order:int=0",
};

const om_op_def om_op_max_pool_grad = {
    .name = "MaxPoolGrad", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = max_pool_grad_infer, .cpu = max_pool_grad_cpu,
};

const om_op_def om_op_average_pool = {
    .name = "AveragePool", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .infer = pool_infer, .grad = average_pool_grad, .cpu = average_pool_cpu, .diff_inputs = 0x1,
    .attrs = OM_WINDOW_ATTRS " ceil_mode:int count_include_pad:int",
};

const om_op_def om_op_average_pool_grad = {
    .name = "AveragePoolGrad", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = average_pool_grad_infer, .cpu = average_pool_grad_cpu,
    .attrs = OM_WINDOW_ATTRS " ceil_mode:int count_include_pad:int",
};

const om_op_def om_op_global_average_pool = {
    .name = "GlobalAveragePool", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .infer = global_pool_infer, .grad = global_pool_grad, .cpu = global_pool_cpu, .diff_inputs = 0x1,
};

const om_op_def om_op_global_max_pool = {
    .name = "GlobalMaxPool", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .infer = global_pool_infer, .grad = global_pool_grad, .cpu = global_pool_cpu, .diff_inputs = 0x1,
};

const om_op_def om_op_global_pool_grad = {
    .name = "GlobalPoolGrad", .domain = "ortmod", .min_in = 4, .max_in = 4, .min_out = 1, .max_out = 1,
    .infer = global_pool_grad_infer, .cpu = global_pool_grad_cpu,
};
