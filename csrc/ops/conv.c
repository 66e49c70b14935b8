/* conv.c — convolution: Conv (1-D, 2-D and 3-D; strides, pads and auto_pad, dilations,
 * groups), its two backward ops, and ConvTranspose.
 *
 * Exports:
 *   om_op_conv            Conv                         (X, W, B?) -> Y
 *   om_op_conv_grad_x     ConvGradX  (domain ortmod)   (dY, W, Shape(X)) -> dX
 *   om_op_conv_grad_w     ConvGradW  (domain ortmod)   (dY, X?, Shape(W)) -> dW, dB?
 *   om_op_conv_transpose  ConvTranspose                (X, W, B?) -> Y
 *
 * ConvTranspose is the input gradient of a convolution (om_window_init_transposed): its
 * forward is ConvGradX's pass with X in dY's place, and its gradients are the other two
 * passes — dX = Conv(dY, W), dW = ConvGradW with the roles of X and dY swapped, dB the sum of
 * dY over the batch and the spatial dims (ReduceSum).
 *
 * Every product is a BLAS GEMM in the im2col layout over a *panel*: a run of output
 * positions of the batch counted image after image (column q = n * OS + o), whole images
 * when they are small (so that the product is wide enough to run at speed), equal parts of
 * one image when it is large (so that the im2col matrix stays in cache). Per group:
 *   col   (Cg*KS, P)  = im2col(x) over the panel's positions   KS = kernel size, OS = output size
 *   y     (Mg, P)     = W_g (Mg, Cg*KS) @ col
 *   dcol  (Cg*KS, P)  = W_g^T @ dy                              then dx += col2im(dcol)
 *   dW_g (Mg, Cg*KS) += dy @ col^T                              (summed over the panels)
 * A panel inside one image reads and writes x, y, dy and dx in place (leading dimension
 * OS); one spanning images goes through a gathered copy. A 1x1 kernel with stride 1 and no
 * padding needs no im2col: x itself is the column matrix. im2col itself either walks the
 * output rows (long rows of a 'same' convolution copy as blocks), copies rows out of a
 * zero-bordered copy of each channel (whole images with short rows or strides: no bounds
 * checks), or reads a table of tap offsets built once per call (parts of large images with
 * short rows or strides).
 *
 * Threads: the batch is cut into ranges of whole images on the engine's pool; each range
 * runs its panels (om_gemm runs single-threaded inside a range) with its own scratch and,
 * for dW, its own partial sum (range 0 writes dW itself, the others are added to it in
 * range order: the result does not depend on which thread ran what). Whole images per
 * range keep col2im's overlapping scatter-adds inside one thread. A batch of one runs on
 * the calling thread, where om_gemm shares each product out over the pool instead.
 * Scratch (im2col matrices, gathered panels, partial sums) is kept per calling thread
 * between calls, so that a training step allocates none once it has run.
 *
 * ConvGradX reads only W and the shape of X, so X is kept for backward only when W's
 * gradient is wanted. The backward ops carry the forward node's attributes (copied by
 * the rule).
 */
#include <pthread.h>
#include <stdlib.h>

#include "ops/broadcast.h"
#include "ops/conv_geom.h"   /* conv_geom, om_conv_geometry, om_convt_geometry: shared with cuda/conv.cu */
#include "ops/gemm.h"
#include "ops/spatial.h"

/* Every float type: fp16/bf16 run on the CUDA provider (the CPU plan refuses them, op.h). */
static om_status *float_in(const om_node *n, const om_tensor *t, int i, om_dtype want) {
    if (!om_dtype_is_float(t->dtype) || (want && t->dtype != want)) return om_err_dtype(n, i, t->dtype);
    return NULL;
}
/* The CPU kernels compute in fp32/fp64 (a CPU plan never hands them fp16/bf16; this is the guard). */
static om_status *cpu_float(const om_node *n, const om_tensor *t, int i) {
    return t->dtype == OM_F32 || t->dtype == OM_F64 ? NULL : om_err_dtype(n, i, t->dtype);
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

/* ---- products and scratch ------------------------------------------------------------ */

/* Row-major C (M x N) = op(A) op(B) + beta C (om_gemm: inside a range of the pool it runs
 * on the calling thread; on the calling thread itself it shares a big product out). */
static void gemm(om_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                 const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    om_gemm(dt, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

/* Per-thread scratch kept between calls, so that a training step allocates no im2col
 * buffer once the largest conv has run (the op interface has no workspace request).
 * It grows to the largest request up to SCRATCH_KEEP; a larger one is allocated for the
 * call only. Freed when the thread exits. */
#define SCRATCH_KEEP ((size_t)64 << 20)
#define SCRATCH_HEAD ((size_t)64)   /* the block's size, kept in front; keeps 64-byte alignment */

static pthread_key_t scratch_key;
static int scratch_key_ok;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_release(void *blk) { om_free(blk); }
static void scratch_key_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_release) == 0; }

/* Returns at least nbytes (64-byte aligned), NULL when out of memory; *own is what the
 * caller must om_free afterwards (NULL for the kept buffer). */
static void *scratch_get(size_t nbytes, void **own) {
    *own = NULL;
    pthread_once(&scratch_once, scratch_key_init);
    if (scratch_key_ok && nbytes <= SCRATCH_KEEP) {
        size_t *blk = pthread_getspecific(scratch_key);
        if (blk && blk[0] >= nbytes) return (char *)blk + SCRATCH_HEAD;
        size_t *grown = om_alloc(SCRATCH_HEAD + nbytes);
        if (!grown) return NULL;
        grown[0] = nbytes;
        if (pthread_setspecific(scratch_key, grown) == 0) {
            om_free(blk);
            return (char *)grown + SCRATCH_HEAD;
        }
        om_free(grown);
    }
    return *own = om_alloc(nbytes ? nbytes : 1);
}

static size_t round_up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---- im2col / col2im ---------------------------------------------------------------- */

/* One kernel tap k = (kd, kh, kw): the input position of output (od, oh, ow) is
 * (od * sD + dd, oh * sH + dh, ow * sW + off); along W it is inside the input for ow in
 * [lo, hi). Tabled once per call: im2col runs once per (segment, channel, tap). */
typedef struct conv_tap {
    int64_t dd, dh, off, lo, hi;
} conv_tap;

static void conv_taps(const conv_geom *g, conv_tap *taps) {
    const om_window *w = &g->w;
    for (int64_t kk = 0; kk < g->KS; kk++) {
        const int64_t kd = kk / (w->k[1] * w->k[2]), kh = (kk / w->k[2]) % w->k[1], kw = kk % w->k[2];
        conv_tap *t = &taps[kk];
        t->dd = kd * w->d[0] - w->pb[0];
        t->dh = kh * w->d[1] - w->pb[1];
        t->off = kw * w->d[2] - w->pb[2];
        om_window_valid(w->in[2], w->s[2], t->off, w->out[2], &t->lo, &t->hi);
    }
}

/* im2col of output positions [o0, o0 + len) of one image into columns [at, at + len) of
 * col (ld columns a row): col[c * KS + k][at + i] = x[c][tap k of position o0 + i], 0 in
 * the padding. add: col2im instead, x[c][tap] += col[...], x zeroed beforehand — unless
 * set_kk >= 0, a tap that lands on every position of x (covering_tap), which then copies
 * first; col's entries for taps in the padding may be overwritten with 0. xg: the image's
 * first channel of the group; Cg channels.
 *
 * This one walks, per (channel, tap) row of col, the output rows (od, oh) in order. Per
 * output row, the positions whose tap falls inside the input ([lo, hi), the same for
 * every row) copy and the others are 0. When output rows are as wide as input rows and
 * both strides along H and W are 1 (a 'same' convolution), the taps of consecutive output
 * rows are consecutive input rows: a run of whole rows is then one contiguous copy (or
 * add), and only the padding columns are fixed up row by row. */
/* Zeroes columns [0, lo) and [hi, OW) of rows [0, rows) of d (row length OW): a column
 * at a time down the rows, so that the usual one or two padding columns cost one short
 * loop each rather than two loop setups per row. */
#define PAD_COLUMNS_ZERO(d, rows, OW, lo, hi)                                                        \
    do {                                                                                             \
        for (int64_t c_ = 0; c_ < (lo); c_++)                                                        \
            for (int64_t r_ = 0; r_ < (rows); r_++) (d)[r_ * (OW) + c_] = 0;                         \
        for (int64_t c_ = (hi); c_ < (OW); c_++)                                                     \
            for (int64_t r_ = 0; r_ < (rows); r_++) (d)[r_ * (OW) + c_] = 0;                         \
    } while (0)

#define DEFINE_IM2COL(T, sfx)                                                                        \
    /* one output row's positions [ow0, ow1); dst[ow] and src[ow] (src NULL: all padding) */       \
    static inline void tap_row_##sfx(int add, T *restrict dst, T *restrict src, int64_t ow0,        \
                                     int64_t ow1, int64_t lo, int64_t hi, int64_t sw) {             \
        const int64_t a = lo > ow0 ? lo : ow0, b0 = hi < ow1 ? hi : ow1, b = b0 > a ? b0 : a;       \
        if (!src) {                                                                                  \
            if (!add) for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] = 0;                            \
        } else if (add) {                                                                            \
            if (sw == 1) for (int64_t ow = a; ow < b; ow++) src[ow] += dst[ow];                      \
            else if (sw == 2) for (int64_t ow = a; ow < b; ow++) src[ow * 2] += dst[ow];             \
            else for (int64_t ow = a; ow < b; ow++) src[ow * sw] += dst[ow];                         \
        } else {                                                                                     \
            for (int64_t ow = ow0; ow < a; ow++) dst[ow] = 0;                                        \
            if (sw == 1) for (int64_t ow = a; ow < b; ow++) dst[ow] = src[ow];                       \
            else if (sw == 2) for (int64_t ow = a; ow < b; ow++) dst[ow] = src[ow * 2];   /* vectorizes */ \
            else for (int64_t ow = a; ow < b; ow++) dst[ow] = src[ow * sw];                          \
            for (int64_t ow = b; ow < ow1; ow++) dst[ow] = 0;                                        \
        }                                                                                            \
    }                                                                                                \
    OM_VEC_CLONES static void im2col_walk_##sfx(const conv_geom *g, const conv_tap *taps, int add,   \
                                                int64_t set_kk, T *xg, T *col, int64_t ld, int64_t at, \
                                                int64_t o0, int64_t len) {                             \
        const om_window *w = &g->w;                                                                  \
        const int64_t ID = w->in[0], IH = w->in[1], IW = w->in[2];                                   \
        const int64_t OH = w->out[1], OW = w->out[2], sw = w->s[2], end = o0 + len;                 \
        const int same_rows = sw == 1 && w->s[1] == 1 && OW == IW;                                   \
        const int64_t r0 = o0 / OW, od0 = r0 / OH, oh0 = r0 - od0 * OH, ow00 = o0 - r0 * OW;        \
        for (int64_t c = 0; c < g->Cg; c++) {                                                        \
            T *xc = xg + c * g->IS;                                                                  \
            if (set_kk >= 0)   /* the tap that lands on every position: x = col, no zeroing first */ \
                memcpy(xc + o0, col + (c * g->KS + set_kk) * ld + at, (size_t)len * sizeof(T));      \
            for (int64_t kk = 0; kk < g->KS; kk++) {                                                 \
                if (kk == set_kk) continue;                                                          \
                const int64_t dd = taps[kk].dd, dh = taps[kk].dh, off = taps[kk].off;                \
                const int64_t lo = taps[kk].lo, hi = taps[kk].hi;                                    \
                T *dst = col + (c * g->KS + kk) * ld + at - o0;   /* dst[o]: position o */          \
                int64_t od = od0, oh = oh0, ow0 = ow00;                                              \
                for (int64_t o = o0; o < end;) {                                                     \
                    const int64_t id = od * w->s[0] + dd;                                            \
                    const int id_in = id >= 0 && id < ID;                                            \
                    T *plane = id_in ? xc + id * IH * IW + off : NULL;   /* + ih * IW + ow */        \
                    if (same_rows && ow0 == 0 && end - o >= OW) {   /* whole rows [oh, oh1) */       \
                        const int64_t oh1 = OH < oh + (end - o) / OW ? OH : oh + (end - o) / OW;     \
                        int64_t v0 = oh > -dh ? oh : -dh, v1 = oh1 < IH - dh ? oh1 : IH - dh;        \
                        if (!id_in || v1 < v0) v1 = v0;   /* rows [v0, v1) read the input */        \
                        if (!add) {                                                                  \
                            for (int64_t q = o; q < o + (v0 - oh) * OW; q++) dst[q] = 0;             \
                            for (int64_t q = o + (v1 - oh) * OW; q < o + (oh1 - oh) * OW; q++) dst[q] = 0; \
                        }                                                                            \
                        if (v0 < v1) {                                                               \
                            T *restrict d = dst + o + (v0 - oh) * OW;   /* row v0, column 0 */       \
                            T *restrict s = plane + (v0 + dh) * IW;                                  \
                            const int64_t n = (v1 - v0 - 1) * OW + hi;                               \
                            if (add) {                                                               \
                                PAD_COLUMNS_ZERO(d, v1 - v0, OW, lo, hi);   /* padding taps add 0 */ \
                                for (int64_t q = lo; q < n; q++) s[q] += d[q];                       \
                            } else {                                                                 \
                                for (int64_t q = lo; q < n; q++) d[q] = s[q];                        \
                                PAD_COLUMNS_ZERO(d, v1 - v0, OW, lo, hi);                            \
                            }                                                                        \
                        }                                                                            \
                        o += (oh1 - oh) * OW;                                                        \
                        oh = oh1;                                                                    \
                    } else {   /* one output row (or the part of it inside the segment) */           \
                        const int64_t ow1 = OW < ow0 + end - o ? OW : ow0 + end - o;                 \
                        const int64_t ih = oh * w->s[1] + dh;                                        \
                        T *src = id_in && ih >= 0 && ih < IH ? plane + ih * IW : NULL;               \
                        tap_row_##sfx(add, dst + o - ow0, src, ow0, ow1, lo, hi, sw);                \
                        o += ow1 - ow0;                                                              \
                        ow0 = 0;                                                                     \
                        oh++;                                                                        \
                    }                                                                                \
                    if (oh == OH) {                                                                  \
                        oh = 0;                                                                      \
                        od++;                                                                        \
                    }                                                                                \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
    }
DEFINE_IM2COL(float, f32)
DEFINE_IM2COL(double, f64)

/* im2col through a table of tap offsets, tbl[k * OS + o] = the offset in the channel's
 * plane of tap k of position o, or -1 in the padding: the same for every channel and
 * image, so it is built once per call, and each (channel, tap) row is then one loop over
 * the segment's positions however short the output rows are (small images, strides). */
#define DEFINE_IM2COL_TABLE(T, sfx)                                                                  \
    OM_VEC_CLONES static void im2col_table_##sfx(const conv_geom *g, const int32_t *tbl, int add,   \
                                                 int64_t set_kk, T *xg, T *col, int64_t ld,          \
                                                 int64_t at, int64_t o0, int64_t len) {              \
        for (int64_t c = 0; c < g->Cg; c++) {                                                        \
            T *restrict xc = xg + c * g->IS;                                                         \
            if (set_kk >= 0)   /* the tap that lands on every position: x = col, no zeroing first */ \
                memcpy(xc + o0, col + (c * g->KS + set_kk) * ld + at, (size_t)len * sizeof(T));      \
            for (int64_t kk = 0; kk < g->KS; kk++) {                                                 \
                if (kk == set_kk) continue;                                                          \
                const int32_t *restrict t = tbl + kk * g->OS + o0;                                   \
                T *restrict d = col + (c * g->KS + kk) * ld + at;                                    \
                if (add) {   /* one tap's positions land on distinct inputs */                       \
                    for (int64_t i = 0; i < len; i++)                                                \
                        if (t[i] >= 0) xc[t[i]] += d[i];                                             \
                } else {                                                                             \
                    for (int64_t i = 0; i < len; i++) {                                              \
                        const int32_t k = t[i];                                                      \
                        const T v = xc[k >= 0 ? k : 0];                                              \
                        d[i] = k >= 0 ? v : 0;                                                       \
                    }                                                                                \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
    }
DEFINE_IM2COL_TABLE(float, f32)
DEFINE_IM2COL_TABLE(double, f64)

/* im2col of a whole image through a zero-bordered copy of each channel (pp, extents
 * PD x PH x PW = (out - 1) * s + (k - 1) * d + 1 per dim, the input at offset pb): every
 * tap of every position then reads pp without a bounds check, so that each (channel, tap)
 * row of col is a run of plain row copies (contiguous, or at the stride along W). The
 * table above reads the same entries with a gather and a branch per element (-1: padding)
 * that GCC left scalar; on the 8- and 4-wide images and the stride-2 windows of a small
 * ResNet it took as long as the product itself.
 * add: col2im instead — pp is zeroed, the taps add into it in tap order (set_kk >= 0: that
 * tap first, as an assignment), and pp's interior is then copied to x: the same additions
 * in the same order as im2col_table's, so the same sums; taps that land in the border add
 * into cells that are dropped, and inputs that no window reads (a stride's tail) get 0.
 * Whole images only (o0 = 0, len = OS): x is written whole. */
#define DEFINE_IM2COL_PADDED(T, sfx)                                                                 \
    /* one (channel, tap) row of col: dst[(od, oh, ow)] = tap[od sD PHW + oh sH PW + ow sW] (add:  */ \
    /* tap[...] += dst[...]; set: =). Always inlined with OW and sW constants for the common      */ \
    /* small widths, so that a row of 4 or 8 is one unrolled vector move: a loop per row was      */ \
    /* mostly its own setup on such rows. */                                                         \
    static inline __attribute__((always_inline)) void pad_tap_##sfx(                                 \
        int add, int set, T *restrict dst, T *restrict tap, int64_t OD, int64_t OH, int64_t sdp,     \
        int64_t shp, const int64_t OW, const int64_t sw) {                                           \
        for (int64_t od = 0; od < OD; od++)                                                          \
            for (int64_t oh = 0; oh < OH; oh++, dst += OW) {                                         \
                T *restrict src = tap + od * sdp + oh * shp;                                         \
                if (!add) for (int64_t ow = 0; ow < OW; ow++) dst[ow] = src[ow * sw];                \
                else if (set) for (int64_t ow = 0; ow < OW; ow++) src[ow * sw] = dst[ow];            \
                else for (int64_t ow = 0; ow < OW; ow++) src[ow * sw] += dst[ow];                    \
            }                                                                                        \
    }                                                                                                \
    OM_VEC_CLONES static void im2col_padded_##sfx(const conv_geom *g, const conv_tap *taps,            \
                                                  const int64_t *P, int add,                         \
                                                  int64_t set_kk, T *xg, T *col, int64_t ld,         \
                                                  int64_t at, T *restrict pp) {                      \
        const om_window *w = &g->w;                                                                  \
        const int64_t IH = w->in[1], IW = w->in[2], PHW = P[1] * P[2], PW = P[2];                     \
        const int64_t OD = w->out[0], OH = w->out[1], OW = w->out[2], sw = w->s[2];                  \
        const int64_t sdp = w->s[0] * PHW, shp = w->s[1] * PW;                                       \
        const int form = (sw == 1 || sw == 2) && (OW == 4 || OW == 8 || OW == 16) ? (int)(sw * 100 + OW) : 0; \
        /* the input rows and columns inside pp: [0, n) along each dim, at + pb */                   \
        int64_t nin[OM_SP];                                                                          \
        for (int i = 0; i < OM_SP; i++) {                                                            \
            nin[i] = P[i] - w->pb[i] < w->in[i] ? P[i] - w->pb[i] : w->in[i];                         \
            if (nin[i] < 0) nin[i] = 0;                                                              \
        }                                                                                            \
        T *restrict inner = pp + w->pb[0] * PHW + w->pb[1] * PW + w->pb[2];   /* input (0, 0, 0) */ \
        for (int64_t c = 0; c < g->Cg; c++) {                                                        \
            T *restrict xc = xg + c * g->IS;                                                         \
            for (int64_t i = 0; i < P[0] * PHW; i++) pp[i] = 0;                                      \
            if (!add)                                                                                \
                for (int64_t id = 0; id < nin[0]; id++)                                              \
                    for (int64_t ih = 0; ih < nin[1]; ih++) {                                        \
                        T *restrict d = inner + id * PHW + ih * PW;                                  \
                        const T *restrict r = xc + (id * IH + ih) * IW;                              \
                        for (int64_t iw = 0; iw < nin[2]; iw++) d[iw] = r[iw];                       \
                    }                                                                                \
            for (int64_t n_ = 0; n_ < g->KS; n_++) {                                                 \
                const int64_t kk = set_kk < 0 ? n_ : n_ == 0 ? set_kk : n_ <= set_kk ? n_ - 1 : n_; \
                const conv_tap *t_ = &taps[kk];   /* its offsets from the input's origin */            \
                T *tap = inner + t_->dd * PHW + t_->dh * PW + t_->off;                               \
                T *dst = col + (c * g->KS + kk) * ld + at;                                           \
                const int set = kk == set_kk;                                                        \
                switch (form) {                                                                      \
                case 104: pad_tap_##sfx(add, set, dst, tap, OD, OH, sdp, shp, 4, 1); break;          \
                case 108: pad_tap_##sfx(add, set, dst, tap, OD, OH, sdp, shp, 8, 1); break;          \
                case 116: pad_tap_##sfx(add, set, dst, tap, OD, OH, sdp, shp, 16, 1); break;         \
                case 204: pad_tap_##sfx(add, set, dst, tap, OD, OH, sdp, shp, 4, 2); break;          \
                case 208: pad_tap_##sfx(add, set, dst, tap, OD, OH, sdp, shp, 8, 2); break;          \
                case 216: pad_tap_##sfx(add, set, dst, tap, OD, OH, sdp, shp, 16, 2); break;         \
                default: pad_tap_##sfx(add, set, dst, tap, OD, OH, sdp, shp, OW, sw); break;         \
                }                                                                                    \
            }                                                                                        \
            if (add) {   /* x = pp's interior; inputs beyond it are read by no window: 0 */          \
                for (int64_t id = 0; id < w->in[0]; id++)                                            \
                    for (int64_t ih = 0; ih < IH; ih++) {                                            \
                        T *restrict xr = xc + (id * IH + ih) * IW;                                   \
                        const T *restrict r = inner + id * PHW + ih * PW;                            \
                        const int64_t m = id < nin[0] && ih < nin[1] ? nin[2] : 0;                   \
                        for (int64_t iw = 0; iw < m; iw++) xr[iw] = r[iw];                           \
                        for (int64_t iw = m; iw < IW; iw++) xr[iw] = 0;                              \
                    }                                                                                \
            }                                                                                        \
        }                                                                                            \
    }
DEFINE_IM2COL_PADDED(float, f32)
DEFINE_IM2COL_PADDED(double, f64)

/* pp's extents for g's window (im2col_padded); returns its elements. */
static int64_t padded_extents(const conv_geom *g, int64_t *P) {
    int64_t n = 1;
    for (int i = 0; i < OM_SP; i++) {
        P[i] = (g->w.out[i] - 1) * g->w.s[i] + (g->w.k[i] - 1) * g->w.d[i] + 1;
        n *= P[i];
    }
    return n;
}

/* Entries of the largest offset table kept (KS * OS int32s); larger ones walk rows. */
#define IM2COL_TABLE_MAX ((int64_t)1 << 16)

/* The table when it pays and fits, in tbl (KS * OS entries), else returns 0. Long rows
 * of a 'same' convolution copy faster as blocks (im2col_walk); below 16 positions a row,
 * or with strides, the table wins (measured on a ResNet's 3x3 convs: 32, 16, 8, 4 wide). */
static int im2col_table_build(const conv_geom *g, const conv_tap *taps, int32_t *tbl) {
    const om_window *w = &g->w;
    const int same_rows = w->s[2] == 1 && w->s[1] == 1 && w->out[2] == w->in[2];
    if ((same_rows && w->out[2] >= 16) || g->KS * g->OS > IM2COL_TABLE_MAX || g->IS > INT32_MAX) return 0;
    for (int64_t kk = 0; kk < g->KS; kk++)
        for (int64_t o = 0; o < g->OS; o++) {
            const int64_t r = o / w->out[2], ow = o - r * w->out[2], od = r / w->out[1], oh = r - od * w->out[1];
            const int64_t id = od * w->s[0] + taps[kk].dd, ih = oh * w->s[1] + taps[kk].dh;
            const int64_t iw = ow * w->s[2] + taps[kk].off;
            const int in = id >= 0 && id < w->in[0] && ih >= 0 && ih < w->in[1] && iw >= 0 && iw < w->in[2];
            tbl[kk * g->OS + o] = in ? (int32_t)((id * w->in[1] + ih) * w->in[2] + iw) : -1;
        }
    return 1;
}

/* rows x len elements from src (ld src_ld) to dst (ld dst_ld) */
static void copy_rows(char *dst, int64_t dst_ld, const char *src, int64_t src_ld, int64_t rows, int64_t len,
                      size_t es) {
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + (size_t)(r * dst_ld) * es, src + (size_t)(r * src_ld) * es, (size_t)len * es);
}

/* ---- the pass over the batch ---------------------------------------------------------- */

enum { PASS_Y, PASS_DX, PASS_DW };

/* A panel's im2col matrix (CK x P) is kept near this size: it is written once and read
 * by the product right after, so it should stay in the core's L2. */
#define PANEL_BYTES ((int64_t)512 << 10)
#define PANEL_MIN_COLS 32
/* The largest zero-bordered channel copy of im2col_padded (one per range); images this
 * large span several panels anyway. */
#define PADDED_MAX_BYTES ((size_t)256 << 10)

typedef struct conv_job {
    int pass, trivial;
    om_dtype dt;
    size_t es;
    conv_geom g;
    int64_t CK;                 /* rows of col: Cg * KS */
    int64_t step;               /* columns per panel: a part of one image, or whole images */
    const char *x, *w, *b, *dy;
    char *y, *dx, *dw;
    const conv_tap *taps;       /* KS of them */
    int64_t cover_kk;           /* dX: a tap whose col2im writes every position of x, or -1 */
    const int32_t *tbl;         /* im2col's offset table (KS x OS), or NULL: walk the rows */
    int padded;                 /* im2col through a zero-bordered copy of each channel (whole images) */
    int64_t pp_dims[OM_SP];     /* its extents */
    size_t pp_off;              /* its place in a range's scratch, from col */
    char *scratch;              /* per range: col (CK x P), pan (Mg x P), dW partial (M x CK), pp */
    size_t col_bytes, pan_bytes, range_bytes;
} conv_job;

/* im2col (add: col2im) of positions [o0, o0 + len) of one image (xg: its group's first
 * channel) into columns [at, at + len) of col. */
static void im2col(const conv_job *j, int add, char *xg, char *col, int64_t ld, int64_t at, int64_t o0, int64_t len) {
    const int64_t set_kk = add ? j->cover_kk : -1;
    if (j->padded) {   /* whole images: o0 = 0, len = OS */
        char *pp = col + j->pp_off;   /* col: the range's scratch */
        (void)o0, (void)len;
        if (j->dt == OM_F32)
            im2col_padded_f32(&j->g, j->taps, j->pp_dims, add, set_kk, (float *)xg, (float *)col, ld, at, (float *)pp);
        else
            im2col_padded_f64(&j->g, j->taps, j->pp_dims, add, set_kk, (double *)xg, (double *)col, ld, at, (double *)pp);
    } else if (j->tbl && j->dt == OM_F32)
        im2col_table_f32(&j->g, j->tbl, add, set_kk, (float *)xg, (float *)col, ld, at, o0, len);
    else if (j->tbl)
        im2col_table_f64(&j->g, j->tbl, add, set_kk, (double *)xg, (double *)col, ld, at, o0, len);
    else if (j->dt == OM_F32)
        im2col_walk_f32(&j->g, j->taps, add, set_kk, (float *)xg, (float *)col, ld, at, o0, len);
    else
        im2col_walk_f64(&j->g, j->taps, add, set_kk, (double *)xg, (double *)col, ld, at, o0, len);
}

/* The columns [q0, q1) of a panel (q = n * OS + o) split at image boundaries: BODY sees
 * the image n_, its positions [o_, o_ + len_) and their first column at_ in the panel. */
#define FOR_SEGMENTS(OS, q0, q1, ...)                                                      \
    for (int64_t q_ = (q0); q_ < (q1);) {                                                  \
        const int64_t n_ = q_ / (OS), o_ = q_ - n_ * (OS);                                 \
        const int64_t len_ = (q1) - q_ < (OS) - o_ ? (q1) - q_ : (OS) - o_, at_ = q_ - (q0); \
        (void)at_;                                                                         \
        __VA_ARGS__;                                                                       \
        q_ += len_;                                                                        \
    }

/* y[n, m, o] += b[m] over the panel's positions */
static void add_bias(const conv_job *j, int64_t q0, int64_t q1) {
    const conv_geom *g = &j->g;
    FOR_SEGMENTS(g->OS, q0, q1, {
        for (int64_t m = 0; m < g->M; m++) {
            char *row = j->y + (size_t)((n_ * g->M + m) * g->OS + o_) * j->es;
            if (j->dt == OM_F32) {
                float *restrict r = (float *)row;
                const float bv = ((const float *)j->b)[m];
                for (int64_t i = 0; i < len_; i++) r[i] += bv;
            } else {
                double *restrict r = (double *)row;
                const double bv = ((const double *)j->b)[m];
                for (int64_t i = 0; i < len_; i++) r[i] += bv;
            }
        }
    });
}

/* One panel, one group. col, pan: this range's scratch; part: its dW partial (first: the
 * range's first panel, which overwrites it). */
static void conv_panel(const conv_job *j, int64_t q0, int64_t q1, int64_t gi, char *col, char *pan, char *part,
                       int first) {
    const conv_geom *g = &j->g;
    const size_t es = j->es;
    const int64_t OS = g->OS, IS = g->IS, C = g->w.C, CK = j->CK, pw = q1 - q0;
    const int64_t n0 = q0 / OS, o0 = q0 - n0 * OS;
    const int single = o0 + pw <= OS;   /* inside one image: read and write the tensors in place */
    const char *wg = j->w + (size_t)(gi * g->Mg * CK) * es;
    /* x's columns (Y, dW): the image itself for a trivial window, else im2col into col */
    const char *xcol = col;
    int64_t ldx = pw;
    if (j->pass != PASS_DX) {
        if (j->trivial && single) {
            xcol = j->x + (size_t)((n0 * C + gi * g->Cg) * IS + o0) * es;
            ldx = IS;
        } else {
            FOR_SEGMENTS(OS, q0, q1, im2col(j, 0, (char *)j->x + (size_t)((n_ * C + gi * g->Cg) * IS) * es, col,
                                            pw, at_, o_, len_));
        }
    }
    /* dy's columns (dX, dW): in place, or gathered into pan */
    const char *dyp = pan;
    int64_t ldy = pw;
    if (j->pass != PASS_Y) {
        if (single) {
            dyp = j->dy + (size_t)((n0 * g->M + gi * g->Mg) * OS + o0) * es;
            ldy = OS;
        } else {
            FOR_SEGMENTS(OS, q0, q1, copy_rows(pan + (size_t)at_ * es, pw,
                                               j->dy + (size_t)((n_ * g->M + gi * g->Mg) * OS + o_) * es, OS, g->Mg,
                                               len_, es));
        }
    }
    switch (j->pass) {
    case PASS_Y:
        if (single) {
            gemm(j->dt, 0, 0, g->Mg, pw, CK, wg, CK, xcol, ldx, 0, j->y + (size_t)((n0 * g->M + gi * g->Mg) * OS + o0) * es,
                 OS);
        } else {
            gemm(j->dt, 0, 0, g->Mg, pw, CK, wg, CK, xcol, ldx, 0, pan, pw);
            FOR_SEGMENTS(OS, q0, q1, copy_rows(j->y + (size_t)((n_ * g->M + gi * g->Mg) * OS + o_) * es, OS,
                                               pan + (size_t)at_ * es, pw, g->Mg, len_, es));
        }
        break;
    case PASS_DW:   /* dW_g (Mg, CK) (+)= dy (Mg, pw) @ col^T */
        gemm(j->dt, 0, 1, g->Mg, CK, pw, dyp, ldy, xcol, ldx, first ? 0 : 1, part + (size_t)(gi * g->Mg * CK) * es, CK);
        break;
    case PASS_DX:   /* dcol (CK, pw) = W_g^T @ dy, then col2im */
        if (j->trivial && single) {
            gemm(j->dt, 1, 0, CK, pw, g->Mg, wg, CK, dyp, ldy, 0,
                 j->dx + (size_t)((n0 * C + gi * g->Cg) * IS + o0) * es, IS);
            break;
        }
        gemm(j->dt, 1, 0, CK, pw, g->Mg, wg, CK, dyp, ldy, 0, col, pw);
        if (j->trivial) {   /* col2im of a 1x1 window is a copy */
            FOR_SEGMENTS(OS, q0, q1, copy_rows(j->dx + (size_t)((n_ * C + gi * g->Cg) * IS + o_) * es, IS,
                                               col + (size_t)at_ * es, pw, g->Cg, len_, es));
        } else {
            FOR_SEGMENTS(OS, q0, q1, im2col(j, 1, j->dx + (size_t)((n_ * C + gi * g->Cg) * IS) * es, col, pw,
                                            at_, o_, len_));
        }
        break;
    }
}

/* Images [lo, hi), panel by panel. */
static void conv_range(void *ctx, int64_t lo, int64_t hi) {
    const conv_job *j = ctx;
    const conv_geom *g = &j->g;
    const int64_t OS = g->OS;
    const int rid = om_pool_range_id();
    char *col = j->scratch + (size_t)rid * j->range_bytes, *pan = col + j->col_bytes, *part = pan + j->pan_bytes;
    if (j->pass == PASS_DW && rid == 0) part = j->dw;   /* range 0 sums straight into dW */
    if (j->pass == PASS_DX && !j->trivial && j->cover_kk < 0 && !j->padded)   /* col2im adds into this range's images */
        memset(j->dx + (size_t)(lo * g->w.C * g->IS) * j->es, 0, (size_t)((hi - lo) * g->w.C * g->IS) * j->es);
    int64_t step = j->step;
    if (step >= OS) {   /* whole images: as many per panel as fit, spread evenly over the panels */
        const int64_t per = step / OS, panels = (hi - lo + per - 1) / per;
        step = (hi - lo + panels - 1) / panels * OS;
    }
    int first = 1;
    for (int64_t q0 = lo * OS, end = hi * OS; q0 < end; first = 0) {
        int64_t q1 = q0 + step < end ? q0 + step : end;
        if (step < OS && q1 > (q0 / OS + 1) * OS) q1 = (q0 / OS + 1) * OS;   /* parts of an image stay in it */
        for (int64_t gi = 0; gi < g->G; gi++) conv_panel(j, q0, q1, gi, col, pan, part, first);
        if (j->pass == PASS_Y && j->b) add_bias(j, q0, q1);
        q0 = q1;
    }
}

/* dw[i] += part_r[i] for r = 1 .. R-1, in that order */
typedef struct dw_sum {
    om_dtype dt;
    char *dw;
    const char *parts;
    size_t range_bytes;
    int R;
} dw_sum;

static void dw_sum_range(void *ctx, int64_t lo, int64_t hi) {
    const dw_sum *s = ctx;
    for (int r = 1; r < s->R; r++) {
        const char *p = s->parts + (size_t)r * s->range_bytes;
        if (s->dt == OM_F32) {
            float *restrict d = (float *)s->dw;
            const float *restrict q = (const float *)p;
            for (int64_t i = lo; i < hi; i++) d[i] += q[i];
        } else {
            double *restrict d = (double *)s->dw;
            const double *restrict q = (const double *)p;
            for (int64_t i = lo; i < hi; i++) d[i] += q[i];
        }
    }
}

/* A tap of a stride-1 window whose output is as large as its input, at offset 0 in every
 * dim (the centre of a 'same' convolution), maps output positions one to one onto input
 * positions: col2im can start each channel with it as a copy instead of zeroing dX and
 * adding. Only when panels hold whole images (the other taps then add into positions of
 * the same panel). Returns the tap, or -1. */
static int64_t covering_tap(const conv_geom *g, const conv_tap *taps) {
    const om_window *w = &g->w;
    for (int i = 0; i < OM_SP; i++)
        if (w->s[i] != 1 || w->out[i] != w->in[i]) return -1;
    for (int64_t kk = 0; kk < g->KS; kk++)
        if (!taps[kk].dd && !taps[kk].dh && !taps[kk].off) return kk;
    return -1;
}

/* Runs one pass over the batch: j filled but for the panel and scratch fields. */
static om_status *conv_run(const om_node *n, conv_job *j) {
    const conv_geom *g = &j->g;
    const int64_t N = g->w.N, OS = g->OS;
    j->es = j->dt == OM_F32 ? sizeof(float) : sizeof(double);
    j->CK = g->Cg * g->KS;
    j->trivial = om_conv_window_trivial(&g->w);
    /* columns per panel: whole images when they are small, else equal parts of one */
    int64_t P = PANEL_BYTES / (j->CK * (int64_t)j->es);
    if (P < PANEL_MIN_COLS) P = PANEL_MIN_COLS;
    if (OS >= P) {
        const int64_t parts = (OS + P - 1) / P;
        j->step = (OS + parts - 1) / parts;
    } else {
        j->step = P / OS * OS;
    }
    j->col_bytes = round_up64((size_t)(j->CK * j->step) * j->es);
    j->pan_bytes = round_up64((size_t)(g->Mg * j->step) * j->es);
    j->range_bytes = j->col_bytes + j->pan_bytes + (j->pass == PASS_DW ? round_up64((size_t)(g->M * j->CK) * j->es) : 0);
    /* Whole images per panel, rows short or strided (where the walk would not copy whole
     * rows as blocks): im2col through a zero-bordered copy of each channel. */
    const om_window *w = &g->w;
    const int same_rows = w->s[2] == 1 && w->s[1] == 1 && w->out[2] == w->in[2];
    const size_t pp_bytes = round_up64((size_t)padded_extents(g, j->pp_dims) * j->es);
    j->padded = j->step >= OS && !(same_rows && w->out[2] >= 16) && pp_bytes <= PADDED_MAX_BYTES;
    if (j->padded) {
        j->pp_off = j->range_bytes;
        j->range_bytes += pp_bytes;
    }
    /* two ranges per thread: a little slack when a thread is preempted, few dW partials */
    int R = om_pool_ranges(N, 1);
    const int cap = 2 * om_get_num_threads();
    if (R > cap) R = cap;
    if (R < 1) R = 1;
    void *own;
    const size_t taps_bytes = round_up64((size_t)g->KS * sizeof(conv_tap));
    const size_t tbl_bytes = g->KS * g->OS <= IM2COL_TABLE_MAX ? round_up64((size_t)(g->KS * g->OS) * sizeof(int32_t)) : 0;
    const size_t need = taps_bytes + tbl_bytes + (size_t)R * j->range_bytes;
    char *mem = scratch_get(need, &own);
    if (!mem)
        return om_error(OM_OUT_OF_MEMORY, "%s node '%s': no memory for %zu bytes of im2col scratch", n->op->name,
                        om_sp_name(n), need);
    conv_taps(g, (conv_tap *)mem);
    j->taps = (const conv_tap *)mem;
    j->cover_kk = j->pass == PASS_DX && j->step >= OS ? covering_tap(g, j->taps) : -1;
    j->tbl = !j->padded && tbl_bytes && im2col_table_build(g, j->taps, (int32_t *)(mem + taps_bytes)) ? (const int32_t *)(mem + taps_bytes)
                                                                                       : NULL;
    j->scratch = mem + taps_bytes + tbl_bytes;
    om_pool_run(N, R, conv_range, j);
    if (j->pass == PASS_DW && R > 1) {
        dw_sum s = {.dt = j->dt, .dw = j->dw, .parts = j->scratch + j->col_bytes + j->pan_bytes,
                    .range_bytes = j->range_bytes, .R = R};
        om_pool_for(g->M * j->CK, OM_GRAIN, dw_sum_range, &s);
    }
    om_free(own);
    return NULL;
}

/* ---- Conv --------------------------------------------------------------------------- */

static om_status *conv_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0], *w = &ctx->in[1];
    conv_geom g;
    OM_TRY(float_in(n, x, 0, 0));
    OM_TRY(float_in(n, w, 1, x->dtype));
    OM_TRY(om_conv_geometry(n, x->rank, x->dims, w->rank, w->dims, &g));
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
    OM_TRY(cpu_float(n, x, 0));
    conv_job j = {.pass = PASS_Y, .dt = x->dtype, .x = x->data, .w = w->data, .b = has_b ? ctx->in[2].data : NULL,
                  .y = ctx->out[0].data};
    OM_TRY(om_conv_geometry(n, x->rank, x->dims, w->rank, w->dims, &j.g));
    if (j.g.w.N * j.g.OS * j.g.M == 0) return NULL;   /* an empty output */
    return conv_run(n, &j);
}

static om_status *conv_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int x = n->in[0], w = n->in[1], has_b = n->n_in > 2 && n->in[2] >= 0;
    const int dy = c->dy[0];
    if (dy < 0) return NULL;
    if (c->need_dx[0]) {
        int in[3] = {dy, w, -1};
        if ((in[2] = om_emit_shape(c, x)) < 0) return NULL;
        int v = om_emit(c, om_op_conv_grad_x_id, in, 3);
        if (v < 0) return NULL;
        om_copy_attrs(c, c->node);
        c->dx[0] = v;
    }
    const int need_w = c->need_dx[1], need_b = has_b && c->need_dx[2];
    if (need_w || need_b) {
        /* without dW the kernel needs no X: pass none so that X is not kept for backward */
        int in[3] = {dy, need_w ? x : -1, -1}, out[2] = {-1, -1};
        if ((in[2] = om_emit_shape(c, w)) < 0) return NULL;
        if (om_emit_node(c, om_op_conv_grad_w_id, in, 3, out, need_b ? 2 : 1, NULL) < 0) return NULL;
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
    OM_TRY(om_conv_geometry(n, xr, xd, w->rank, w->dims, &g));
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
    OM_TRY(cpu_float(n, dy, 0));
    conv_job j = {.pass = PASS_DX, .dt = dy->dtype, .w = w->data, .dy = dy->data, .dx = dx->data};
    OM_TRY(om_conv_geometry(n, dx->rank, dx->dims, w->rank, w->dims, &j.g));
    if (j.g.w.N * j.g.OS * j.g.M == 0) {   /* no output position reads x: its gradient is 0 */
        memset(dx->data, 0, om_tensor_nbytes(dx));
        return NULL;
    }
    return conv_run(n, &j);
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
        OM_TRY(om_conv_geometry(n, x->rank, x->dims, wr, wd, &g));
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

/* dB[m] = sum of dy[n, m, :] over n */
typedef struct db_job {
    om_dtype dt;
    const void *dy;
    void *db;
    int64_t N, M, OS;
} db_job;

#define DEFINE_DB_RANGE(T, sfx)                                                                 \
    OM_VEC_CLONES static void db_range_##sfx(void *ctx, int64_t lo, int64_t hi) {               \
        const db_job *d = ctx;                                                                  \
        for (int64_t m = lo; m < hi; m++) {                                                     \
            double acc = 0;                                                                     \
            for (int64_t b = 0; b < d->N; b++) {                                                \
                const T *restrict r = (const T *)d->dy + (b * d->M + m) * d->OS;                \
                T lane[8] = {0};   /* 8 independent sums: the loop vectorizes without reassociation */ \
                int64_t i = 0;                                                                  \
                for (; i + 8 <= d->OS; i += 8)                                                  \
                    for (int k = 0; k < 8; k++) lane[k] += r[i + k];                            \
                T s = 0;                                                                        \
                for (; i < d->OS; i++) s += r[i];                                               \
                for (int k = 0; k < 8; k++) s += lane[k];                                       \
                acc += s;                                                                       \
            }                                                                                   \
            ((T *)d->db)[m] = (T)acc;                                                           \
        }                                                                                       \
    }
DEFINE_DB_RANGE(float, f32)
DEFINE_DB_RANGE(double, f64)

// dy is (N, M, *O), x is (N, C, *S), dw is (M, C/G, *K), db is (M)
static om_status *conv_grad_w_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *x = &ctx->in[1];
    om_tensor *dw = &ctx->out[0];
    OM_TRY(cpu_float(n, dy, 0));
    if (dw->data && x->dtype == OM_UNDEFINED) {
        memset(dw->data, 0, om_tensor_nbytes(dw));
    } else if (dw->data) {
        conv_job j = {.pass = PASS_DW, .dt = dy->dtype, .x = x->data, .dy = dy->data, .dw = dw->data};
        OM_TRY(om_conv_geometry(n, x->rank, x->dims, dw->rank, dw->dims, &j.g));
        if (j.g.w.N * j.g.OS * j.g.M == 0) memset(dw->data, 0, om_tensor_nbytes(dw));   /* an empty sum */
        else OM_TRY(conv_run(n, &j));
    }
    if (ctx->n_out > 1 && ctx->out[1].data) {
        const int64_t N = dy->dims[0], M = dy->dims[1], OS = N > 0 && M > 0 ? om_tensor_numel(dy) / (N * M) : 0;
        db_job d = {.dt = dy->dtype, .dy = dy->data, .db = ctx->out[1].data, .N = N, .M = M, .OS = OS};
        const int64_t per = N * OS > 0 ? N * OS : 1;
        om_pool_for(M, OM_GRAIN / per + 1, dy->dtype == OM_F32 ? db_range_f32 : db_range_f64, &d);
    }
    return NULL;
}

/* ---- ConvTranspose(X, W, B?) -> Y ------------------------------------------------------- */

static om_status *convt_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0], *w = &ctx->in[1];
    conv_geom g;
    OM_TRY(float_in(n, x, 0, 0));
    OM_TRY(float_in(n, w, 1, x->dtype));
    OM_TRY(om_convt_geometry(n, x->rank, x->dims, w->rank, w->dims, &g));
    if (ctx->n_in > 2 && ctx->in[2].dtype != OM_UNDEFINED) {
        OM_TRY(float_in(n, &ctx->in[2], 2, x->dtype));
        if (om_tensor_numel(&ctx->in[2]) != g.w.C)
            return om_error(OM_INVALID_ARGUMENT, "ConvTranspose node '%s': B must have %lld elements", om_sp_name(n),
                            (long long)g.w.C);
    }
    om_tensor *y = &ctx->out[0];
    y->dtype = x->dtype;
    y->rank = x->rank;
    y->dims[0] = g.w.N;
    y->dims[1] = g.w.C;
    for (int i = 0; i < g.w.nsp; i++) y->dims[2 + i] = g.w.in[OM_SP - g.w.nsp + i];
    return NULL;
}

/* y[n, c, :] += b[c] over rows [lo, hi) of y (N * C rows of S) */
typedef struct bias_rows {
    om_dtype dt;
    char *y;
    const char *b;
    int64_t C, S;
} bias_rows;

static void bias_rows_range(void *ctx, int64_t lo, int64_t hi) {
    const bias_rows *r = ctx;
    for (int64_t row = lo; row < hi; row++) {
        if (r->dt == OM_F32) {
            float *restrict y = (float *)r->y + row * r->S;
            const float bv = ((const float *)r->b)[row % r->C];
            for (int64_t i = 0; i < r->S; i++) y[i] += bv;
        } else {
            double *restrict y = (double *)r->y + row * r->S;
            const double bv = ((const double *)r->b)[row % r->C];
            for (int64_t i = 0; i < r->S; i++) y[i] += bv;
        }
    }
}

// x is (N, C_in, *S), w is (C_in, C_out/G, *K), b is (C_out), y is (N, C_out, *O): ConvGradX's pass, x as dY
static om_status *convt_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0], *w = &ctx->in[1];
    om_tensor *y = &ctx->out[0];
    OM_TRY(cpu_float(n, x, 0));
    conv_job j = {.pass = PASS_DX, .dt = x->dtype, .w = w->data, .dy = x->data, .dx = y->data};
    OM_TRY(om_convt_geometry(n, x->rank, x->dims, w->rank, w->dims, &j.g));
    if (j.g.w.N * j.g.OS * j.g.M == 0) memset(y->data, 0, om_tensor_nbytes(y));   /* no tap reaches y */
    else OM_TRY(conv_run(n, &j));
    if (ctx->n_in > 2 && ctx->in[2].dtype != OM_UNDEFINED && j.g.IS > 0) {
        bias_rows r = {.dt = x->dtype, .y = y->data, .b = ctx->in[2].data, .C = j.g.w.C, .S = j.g.IS};
        om_pool_for(j.g.w.N * j.g.w.C, OM_GRAIN / j.g.IS + 1, bias_rows_range, &r);
    }
    return NULL;
}

/* The spatial rank of ConvTranspose node n, from its attributes or the declared rank of W or
 * X; -1 when none says. */
static int convt_spatial_rank(const om_graph *g, const om_node *n) {
    static const char *const one_per_dim[] = {"kernel_shape", "strides", "dilations", "output_padding"};
    const int64_t *v;
    for (size_t i = 0; i < sizeof one_per_dim / sizeof *one_per_dim; i++) {
        const int k = om_attr_ints(n, one_per_dim[i], &v);
        if (k > 0) return k;
    }
    const int np = om_attr_ints(n, "pads", &v);
    if (np > 0) return np / 2;
    for (int i = 0; i < 2; i++) {
        const om_value *val = &g->values[n->in[i]];
        const int r = val->constant ? val->constant->rank : val->rank_hint;
        if (r >= 3) return r - 2;
    }
    return -1;
}

/* Copies ConvTranspose node `from`'s window attributes onto the last emitted node (a Conv or a
 * ConvGradW) as that convolution's: all but output_padding, auto_pad and pads, then pads =
 * pads (np values; none when np is 0). */
static void convt_copy_attrs(om_grad_ctx *c, int from, const int64_t *pads, int np) {
    const int to = om_emit_last(c);
    if (to < 0) return;
    for (int i = 0; i < c->g->nodes[from].n_attr; i++) {
        const om_attr a = c->g->nodes[from].attr[i];   /* by value: setting may grow arrays */
        if (!strcmp(a.name, "output_padding") || !strcmp(a.name, "auto_pad") || !strcmp(a.name, "pads")) continue;
        om_status *st = NULL;
        if (a.type == OM_ATTR_INT) st = om_node_set_int(c->g, to, a.name, a.i);
        else if (a.type == OM_ATTR_INTS) st = om_node_set_ints(c->g, to, a.name, a.ints, a.n);
        if (st) {
            om_grad_fail(c, st);
            return;
        }
    }
    if (np) om_emit_attr_ints(c, "pads", pads, np);
}

/* dX = Conv(dY, W) and dW = ConvGradW(X in dY's place, dY in X's place, Shape(W)): the
 * convolution of om_window_init_transposed, whose end pads are pad_end - output_padding. A
 * Conv node's pads cannot be negative: where output_padding exceeds pad_end the end pad is 0,
 * which still gives X's extent while output_padding - pad_end < stride. That always holds in
 * torch (output_padding < stride) except where a dilation lets output_padding reach the
 * stride; beyond it the rule refuses, naming the dim (the forward alone runs). dB = ReduceSum
 * of dY over the batch and spatial axes (where the graph does not say the rank: over the batch,
 * then over the flattened rest). */
static om_status *convt_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int x = n->in[0], w = n->in[1], has_b = n->n_in > 2 && n->in[2] >= 0;
    const int dy = c->dy[0];
    if (dy < 0) return NULL;
    const int nsp = convt_spatial_rank(c->g, n);   /* known whenever pads or output_padding are given */
    int64_t pads[2 * OM_SP] = {0};
    int np = 0;
    const int64_t *pd = NULL, *op = NULL, *st = NULL;
    const int valid = !strcmp(om_attr_string(n, "auto_pad", "NOTSET"), "VALID");
    const int known = nsp >= 1 && nsp <= OM_SP;   /* else none of pads, output_padding, strides is given */
    const int has_pads = known && om_attr_ints(n, "pads", &pd) == 2 * nsp && !valid;
    const int has_op = known && om_attr_ints(n, "output_padding", &op) == nsp;
    const int has_st = known && om_attr_ints(n, "strides", &st) == nsp;
    if (has_pads || has_op) {
        np = 2 * nsp;
        for (int i = 0; i < nsp; i++) {
            const int64_t pe = has_pads ? pd[nsp + i] : 0, opad = has_op ? op[i] : 0, s = has_st ? st[i] : 1;
            if (opad - pe >= s)
                return om_grad_fail(c, om_error(OM_UNSUPPORTED_OP, "ConvTranspose node '%s': output_padding %lld "
                                                "exceeds pad_end %lld by stride %lld or more on spatial dim %d: its "
                                                "gradient is not implemented", om_sp_name(n), (long long)opad,
                                                (long long)pe, (long long)s, i));
            pads[i] = has_pads ? pd[i] : 0;
            pads[nsp + i] = pe > opad ? pe - opad : 0;
        }
    }
    if (c->need_dx[0]) {
        int in[2] = {dy, w};
        int v = om_emit(c, om_op_conv_id, in, 2);
        if (v < 0) return NULL;
        convt_copy_attrs(c, c->node, pads, np);
        c->dx[0] = v;
    }
    if (c->need_dx[1]) {
        int in[3] = {x, dy, -1}, out[1] = {-1};
        if ((in[2] = om_emit_shape(c, w)) < 0) return NULL;
        if (om_emit_node(c, om_op_conv_grad_w_id, in, 3, out, 1, NULL) < 0) return NULL;
        convt_copy_attrs(c, c->node, pads, np);
        c->dx[1] = out[0];
    }
    if (has_b && c->need_dx[2]) {
        int v;
        if (known) {   /* one sum over (N, *S) */
            int64_t axes[1 + OM_SP] = {0};
            for (int i = 0; i < nsp; i++) axes[1 + i] = 2 + i;
            if ((v = om_emit1(c, om_op_reduce_sum_id, dy)) < 0) return NULL;
            om_emit_attr_ints(c, "axes", axes, 1 + nsp);
        } else {   /* the rank is not known before planning: over N, then over (C, S...) flattened */
            const int64_t axis0 = 0, axis1 = 1;
            if ((v = om_emit1(c, om_op_reduce_sum_id, dy)) < 0) return NULL;
            om_emit_attr_ints(c, "axes", &axis0, 1);
            om_emit_attr_int(c, "keepdims", 0);
            if ((v = om_emit1(c, om_op_flatten_id, v)) < 0) return NULL;
            om_emit_attr_int(c, "axis", 1);
            if ((v = om_emit1(c, om_op_reduce_sum_id, v)) < 0) return NULL;
            om_emit_attr_ints(c, "axes", &axis1, 1);
        }
        om_emit_attr_int(c, "keepdims", 0);
        c->dx[2] = v;
    }
    return NULL;
}

const om_op_def om_op_conv = {
    .name = "Conv", .domain = "", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = conv_infer, .grad = conv_grad, .cpu = conv_cpu, .diff_inputs = 0x7,
    .attrs = OM_WINDOW_ATTRS " group:int",
};

const om_op_def om_op_conv_grad_x = {
    .name = "ConvGradX", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = conv_grad_x_infer, .cpu = conv_grad_x_cpu,
    .attrs = OM_WINDOW_ATTRS " group:int",
};

const om_op_def om_op_conv_grad_w = {
    .name = "ConvGradW", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 2,
    .infer = conv_grad_w_infer, .cpu = conv_grad_w_cpu,
    .attrs = OM_WINDOW_ATTRS " group:int",
};

const om_op_def om_op_conv_transpose = {
    .name = "ConvTranspose", .domain = "", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = convt_infer, .grad = convt_grad, .cpu = convt_cpu, .diff_inputs = 0x7,
    /* output_shape and the SAME auto_pads are not implemented: refused by name on import */
    .attrs = "auto_pad:string=NOTSET|VALID dilations:ints kernel_shape:ints output_padding:ints pads:ints strides:ints "
             "group:int",
};
