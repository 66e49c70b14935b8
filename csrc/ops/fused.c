/* fused.c — ops the fusion passes (passes/fuse_*.c) rewrite patterns into, with their
 * fused backward ops. All in domain "ortmod".
 *
 * Exports:
 *   om_op_matmul_bias           MatMulBias          (x, W, b; transB) -> x op(W) + b
 *   om_op_matmul_bias_grad      MatMulBiasGrad      (dy, x?, W?, x_shape, W_shape, b_shape, gelu_x?; transB,
 *                                                   approximate) -> (dx?, dW?, db?)
 *                                                   with gelu_x (x = gelu(gelu_x) in the forward, pass
 *                                                   matmul_grad_gelu), dx is GeluGrad(dy op(W)^T, gelu_x)
 *   om_op_bias_gelu             BiasGelu            (x, b; approximate) -> gelu(x + b)
 *   om_op_bias_gelu_grad        BiasGeluGrad        (dy, x, b; approximate) -> (dx?, db?)
 *   om_op_matmul_bias_gelu      MatMulBiasGelu      (x, W, b; transB, approximate) -> (y, z?)
 *                                                   z = x op(W) + b, y = gelu(z); backward: GeluGrad(dy, z)
 *                                                   then MatMulBiasGrad
 *   om_op_bias_dropout          BiasDropout         (x, b?, residual?, ratio?, training_mode?) -> (y, mask?)
 *                                                   y = dropout(x + b) + residual
 *   om_op_bias_dropout_grad     BiasDropoutGrad     (dy, mask, ratio?, training_mode?, b_shape?) -> (dx?, db?)
 *   om_op_simplified_layer_norm SimplifiedLayerNormalization  (x, scale; axis=-1, epsilon) -> (y, inv_rms?)
 *                                                   RMSNorm: x / sqrt(mean(x^2) + eps) * scale
 *   om_op_simplified_layer_norm_grad SimplifiedLayerNormalizationGrad (dy, x, scale, inv_rms) -> (dx?, dscale?)
 *
 * Fused backward ops take optional outputs: the gradient rule emits every output and
 * detaches those no input needs (out = -1), so a kernel computes only what is wanted.
 * Bias gradients are the column sums of the gradient, computed in the same pass over it.
 *
 * BiasGelu, BiasDropout and their gradients are OM_OP_INPLACE: each element of input 0 is
 * read before the same element of output 0 is written.
 *
 * Every bias here broadcasts over the last dim only: the passes fuse only when the bias is
 * a rank-1 parameter or constant, and the shape rules check its length at plan time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/broadcast.h"
#include "ops/op_util.h"
#include "ops/gelu.h"
#include "ops/gemm.h"
#include "ops/op.h"
#include "ops/rowsum.h"
#include "ops/vecmath.h"
#include "core/threadpool.h"

/* ---- helpers ---------------------------------------------------------------------- */

static int wanted(const om_kernel_ctx *ctx, int j) { return j < ctx->n_out && ctx->out[j].data != NULL; }

static om_status *read_shape(const om_kernel_ctx *ctx, int i, om_tensor *like, om_dtype dt) {
    int64_t d[OM_MAX_RANK];
    int r = om_in_present(ctx, i) ? om_read_ints(&ctx->in[i], d, OM_MAX_RANK) : -1;
    if (r < 0)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d must be a shape known at plan time",
                        ctx->node->op->name, ctx->node->name, i);
    memset(like, 0, sizeof *like);
    like->dtype = dt;
    like->rank = r;
    memcpy(like->dims, d, sizeof(int64_t) * (size_t)r);
    return om_check_shape_data(ctx->node, i, d, r, dt);
}

/* The length a last-dim bias must have: n, or 1 (broadcast). Rank <= 1 after leading 1s. */
static om_status *check_bias(const om_node *n, const om_tensor *b, int i, int64_t cols) {
    int64_t numel = om_tensor_numel(b);
    int lead_ones = 1;
    for (int d = 0; d + 1 < b->rank; d++) lead_ones &= b->dims[d] == 1;
    if (!lead_ones || (numel != cols && numel != 1)) {
        char s[128];
        om_shape_str(b, s, sizeof s);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': bias (input %d) of shape %s does not broadcast over a "
                        "last dim of %lld (the fused pattern needs a per-column bias)", n->op->name, n->name, i, s,
                        (long long)cols);
    }
    return NULL;
}

static void gemm(om_dtype dt, int ta, int tb, int M, int N, int K, const void *A, int lda, const void *B, int ldb,
                 double beta, void *C) {
    om_gemm(dt, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, N);
}

/* ---- MatMulBias ------------------------------------------------------------------- */

static om_status *mmb_dims(const om_kernel_ctx *ctx, int64_t *M, int64_t *N, int64_t *K) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0], *w = &ctx->in[1], *b = &ctx->in[2];
    int tb = om_attr_int(n, "transB", 0) != 0;
    OM_TRY(om_check_float(n, x, 0, OM_UNDEFINED));
    OM_TRY(om_check_float(n, w, 1, x->dtype));
    OM_TRY(om_check_float(n, b, 2, x->dtype));
    if (x->rank < 1 || w->rank != 2 || (tb ? w->dims[1] : w->dims[0]) != x->dims[x->rank - 1]) {
        char sx[128], sw[128];   /* formatted for the error only: this runs on every call */
        om_shape_str(x, sx, sizeof sx);
        om_shape_str(w, sw, sizeof sw);
        if (x->rank < 1 || w->rank != 2)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': x %s must have rank >= 1 and W %s rank 2",
                            n->op->name, n->name, sx, sw);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': shapes %s and %s%s do not multiply", n->op->name, n->name,
                        sx, sw, tb ? "^T" : "");
    }
    *K = x->dims[x->rank - 1];
    *N = tb ? w->dims[0] : w->dims[1];
    *M = *K ? om_tensor_numel(x) / *K : 0;
    if (*K == 0) {
        *M = 1;
        for (int d = 0; d + 1 < x->rank; d++) *M *= x->dims[d];
    }
    if (*M > INT32_MAX || *N > INT32_MAX || *K > INT32_MAX)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dims exceed the BLAS int range", n->op->name, n->name);
    return check_bias(n, b, 2, *N);
}

static om_status *mmb_infer(om_kernel_ctx *ctx) {
    int64_t M = 0, N = 0, K = 0;
    OM_TRY(mmb_dims(ctx, &M, &N, &K));
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    y->dtype = x->dtype;
    y->rank = x->rank;
    memcpy(y->dims, x->dims, sizeof(int64_t) * (size_t)x->rank);
    y->dims[x->rank - 1] = N;
    return NULL;
}

// x is (M, K) (leading dims flattened), W is (K, N) or (N, K) with transB, b is (N) or (1); y is (M, N)
/* y rows [lo, hi) = the bias (a row of N, or one value when bstep is 0) */
typedef struct bias_fill_job {
    om_dtype dt;
    const void *b;
    void *y;
    int64_t N, bstep;
} bias_fill_job;

static void bias_fill_rows(void *c, int64_t lo, int64_t hi) {
    const bias_fill_job *f = c;
    const size_t es = om_dtype_size(f->dt), row = (size_t)f->N * es;
    char *y = f->y;
    for (int64_t i = lo; i < hi; i++) {
        char *yr = y + (size_t)i * row;
        if (f->bstep) { memcpy(yr, f->b, row); continue; }
        if (f->dt == OM_F32) for (int64_t j = 0; j < f->N; j++) ((float *)yr)[j] = *(const float *)f->b;
        else for (int64_t j = 0; j < f->N; j++) ((double *)yr)[j] = *(const double *)f->b;
    }
}

static om_status *mmb_cpu(om_kernel_ctx *ctx) {
    int64_t M = 0, N = 0, K = 0;
    OM_TRY(mmb_dims(ctx, &M, &N, &K));
    int tb = om_attr_int(ctx->node, "transB", 0) != 0;
    const om_tensor *b = &ctx->in[2];
    const int64_t bstep = om_tensor_numel(b) == 1 ? 0 : 1;
    /* the bias is written into y first and the GEMM accumulates onto it (beta = 1): one
     * pass over the output, no separate broadcast-add kernel */
    if (ctx->in[0].dtype != OM_F32 && ctx->in[0].dtype != OM_F64) return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    bias_fill_job f = {.dt = ctx->in[0].dtype, .b = b->data, .y = ctx->out[0].data, .N = N, .bstep = bstep};
    om_pool_for(M, OM_GRAIN / (N ? N : 1) + 1, bias_fill_rows, &f);
    gemm(ctx->in[0].dtype, 0, tb, (int)M, (int)N, (int)K, ctx->in[0].data, (int)K, ctx->in[1].data, tb ? (int)K : (int)N,
         1.0, ctx->out[0].data);
    return NULL;
}

/* dx, dW, db of y = x op(W) + b from dy (only those the node's need_dx asks for), as one
 * MatMulBiasGrad: the backward of MatMulBias, and of MatMulBiasGelu once dy is through the GELU. */
static om_status *emit_matmul_bias_grad(om_grad_ctx *c, int dy, int x, int w, int b, int tb) {
    int xs = om_emit_shape(c, x), ws = om_emit_shape(c, w), bs = om_emit_shape(c, b);
    if (xs < 0 || ws < 0 || bs < 0) return NULL;
    int in[6] = {dy, c->need_dx[1] ? x : -1, c->need_dx[0] ? w : -1, xs, ws, bs};
    int out[3], want[3] = {c->need_dx[0], c->need_dx[1], c->need_dx[2]};
    if (om_emit_partial(c, om_op_matmul_bias_grad_id, in, 6, out, 3, want) < 0) return NULL;
    if (tb) om_emit_attr_int(c, "transB", 1);
    for (int i = 0; i < 3; i++) c->dx[i] = out[i];
    return NULL;
}

static om_status *mmb_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    int x = f->in[0], w = f->in[1], b = f->in[2], dy = c->dy[0];
    int tb = om_attr_int(f, "transB", 0) != 0;
    if (dy < 0) return NULL;
    return emit_matmul_bias_grad(c, dy, x, w, b, tb);
}

static int gelu_tanh_mode(const om_node *n);
static void gelu_grad_in_place(om_dtype dt, void *g, const void *x, int64_t n, int tanh_mode);

static om_status *mmbg_dims(om_kernel_ctx *ctx, om_tensor *xs, om_tensor *ws, om_tensor *bs, int64_t *M, int64_t *N,
                            int64_t *K) {
    const om_node *n = ctx->node;
    int tb = om_attr_int(n, "transB", 0) != 0;
    om_dtype dt = ctx->in[0].dtype;
    OM_TRY(om_check_float(n, &ctx->in[0], 0, OM_UNDEFINED));
    OM_TRY(read_shape(ctx, 3, xs, dt));
    OM_TRY(read_shape(ctx, 4, ws, dt));
    OM_TRY(read_shape(ctx, 5, bs, dt));
    if (xs->rank < 1 || ws->rank != 2)
        return om_error(OM_INVALID_ARGUMENT, "MatMulBiasGrad node '%s': bad operand ranks", n->name);
    *K = xs->dims[xs->rank - 1];
    *N = tb ? ws->dims[0] : ws->dims[1];
    *M = 1;
    for (int d = 0; d + 1 < xs->rank; d++) *M *= xs->dims[d];
    if (om_tensor_numel(&ctx->in[0]) != *M * *N)
        return om_error(OM_INVALID_ARGUMENT, "MatMulBiasGrad node '%s': dY has %lld elements, expected %lld", n->name,
                        (long long)om_tensor_numel(&ctx->in[0]), (long long)(*M * *N));
    if (om_in_present(ctx, 1)) OM_TRY(om_check_float(n, &ctx->in[1], 1, dt));
    if (om_in_present(ctx, 2)) OM_TRY(om_check_float(n, &ctx->in[2], 2, dt));
    if (om_in_present(ctx, 6)) {
        OM_TRY(om_check_float(n, &ctx->in[6], 6, dt));
        if (om_tensor_numel(&ctx->in[6]) != *M * *K)
            return om_error(OM_INVALID_ARGUMENT, "MatMulBiasGrad node '%s': gelu_x has %lld elements, expected %lld",
                            n->name, (long long)om_tensor_numel(&ctx->in[6]), (long long)(*M * *K));
        if (gelu_tanh_mode(n) < 0) return om_err_unsupported(n, "approximate must be \"none\" or \"tanh\"");
    }
    return NULL;
}


static om_status *mmbg_infer(om_kernel_ctx *ctx) {
    om_tensor xs, ws, bs;
    int64_t M = 0, N = 0, K = 0;
    OM_TRY(mmbg_dims(ctx, &xs, &ws, &bs, &M, &N, &K));
    if (ctx->n_out > 0) ctx->out[0] = xs;
    if (ctx->n_out > 1) ctx->out[1] = ws;
    if (ctx->n_out > 2) ctx->out[2] = bs;
    return NULL;
}

// dy is (M, N), x is (M, K), W is (K, N) or (N, K); dx (M, K), dW like W, db (N) or (1)
static om_status *mmbg_cpu(om_kernel_ctx *ctx) {
    om_tensor xs, ws, bs;
    int64_t M = 0, N = 0, K = 0;
    OM_TRY(mmbg_dims(ctx, &xs, &ws, &bs, &M, &N, &K));
    const om_node *n = ctx->node;
    int tb = om_attr_int(n, "transB", 0) != 0;
    om_dtype dt = ctx->in[0].dtype;
    const void *dy = ctx->in[0].data;
    if (wanted(ctx, 0)) {
        if (!om_in_present(ctx, 2)) return om_error(OM_INTERNAL, "MatMulBiasGrad node '%s': dx wanted without W", n->name);
        /* dx = dy op(W)^T: W (K,N) read transposed, or W (N,K) read as is */
        gemm(dt, 0, !tb, (int)M, (int)K, (int)N, dy, (int)N, ctx->in[2].data, tb ? (int)K : (int)N, 0.0,
             ctx->out[0].data);
        if (om_in_present(ctx, 6)) gelu_grad_in_place(dt, ctx->out[0].data, ctx->in[6].data, M * K, gelu_tanh_mode(n));
    }
    if (wanted(ctx, 1)) {
        if (!om_in_present(ctx, 1)) return om_error(OM_INTERNAL, "MatMulBiasGrad node '%s': dW wanted without x", n->name);
        /* the batch reduction happens inside the GEMM's inner dimension M */
        if (!tb) gemm(dt, 1, 0, (int)K, (int)N, (int)M, ctx->in[1].data, (int)K, dy, (int)N, 0.0, ctx->out[1].data);
        else gemm(dt, 1, 0, (int)N, (int)K, (int)M, dy, (int)N, ctx->in[1].data, (int)K, 0.0, ctx->out[1].data);
    }
    if (wanted(ctx, 2)) {
        int64_t nb = om_tensor_numel(&bs);
        if (nb == N) return om_sum_rows(dt, M, N, dy, ctx->out[2].data);
        OM_DISPATCH_FLOAT(dt, n, {
            const T *restrict g = dy;
            T s = 0;   /* one bias value for every column */
            for (int64_t i = 0; i < M * N; i++) s += g[i];
            *(T *)ctx->out[2].data = s;
        });
    }
    return NULL;
}

/* ---- BiasGelu --------------------------------------------------------------------- */


static int gelu_tanh_mode(const om_node *n) {
    const char *a = om_attr_string(n, "approximate", "none");
    return strcmp(a, "tanh") == 0 ? 1 : strcmp(a, "none") == 0 ? 0 : -1;
}

/* g *= gelu'(x) over n values, on the pool: MatMulBiasGrad's dx when it carries the GELU's gradient */
typedef struct gelu_grad_job {
    om_dtype dt;
    void *g;
    const void *x;
    int tanh_mode;
} gelu_grad_job;

OM_VEC_CLONES static void gelu_grad_range(void *c, int64_t lo, int64_t hi) {
    const gelu_grad_job *j = c;
    if (j->dt == OM_F32) {
        float *restrict g = (float *)j->g + lo;
        const float *restrict x = (const float *)j->x + lo;
        if (j->tanh_mode) for (int64_t i = 0; i < hi - lo; i++) g[i] *= gelu_tanh_deriv_f32(x[i]);
        else for (int64_t i = 0; i < hi - lo; i++) g[i] *= gelu_erf_deriv_f32(x[i]);
    } else {
        double *g = (double *)j->g;
        const double *x = j->x;
        for (int64_t i = lo; i < hi; i++) g[i] *= j->tanh_mode ? gelu_tanh_deriv_f64(x[i]) : gelu_erf_deriv_f64(x[i]);
    }
}

static void gelu_grad_in_place(om_dtype dt, void *g, const void *x, int64_t n, int tanh_mode) {
    gelu_grad_job j = {.dt = dt, .g = g, .x = x, .tanh_mode = tanh_mode};
    om_pool_for(n, OM_GRAIN, gelu_grad_range, &j);
}

static om_status *bias_rows(const om_kernel_ctx *ctx, int xi, int bi, int64_t *rows, int64_t *cols) {
    const om_tensor *x = &ctx->in[xi], *b = &ctx->in[bi];
    OM_TRY(om_check_float(ctx->node, x, xi, OM_UNDEFINED));
    OM_TRY(om_check_float(ctx->node, b, bi, x->dtype));
    if (x->rank < 1) return om_error(OM_INVALID_ARGUMENT, "%s node '%s': x must have rank >= 1", ctx->node->op->name,
                                     ctx->node->name);
    *cols = x->dims[x->rank - 1];
    *rows = *cols ? om_tensor_numel(x) / *cols : 0;
    return check_bias(ctx->node, b, bi, *cols);
}

static om_status *bias_gelu_infer(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    if (gelu_tanh_mode(ctx->node) < 0) return om_err_unsupported(ctx->node, "approximate must be \"none\" or \"tanh\"");
    OM_TRY(bias_rows(ctx, 0, 1, &rows, &cols));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

/* float32 BiasGelu / BiasGeluGrad rows on the thread pool, with the vectorizable tanh/erf/exp
 * of vecmath.h (libm's calls stop the loop from vectorizing and dominated GPT-2 steps). */
typedef struct bias_gelu_rows {
    const float *x, *b, *dy;
    float *y, *dx;
    float *z;   /* BiasGelu forward: x + b kept here too when not NULL (may be x) */
    int64_t cols, bs;
    int tanh_mode;
} bias_gelu_rows;

/* Rows in chunks of columns; a bias of one value (bs 0) is spread into tmp first, so every
 * loop has unit stride and vectorizes. */
#define GELU_ROW_CHUNK 1024   /* columns per pass when the bias is one value */

/* y = gelu(v) over n values */
static inline void gelu_f32_chunk(const float *restrict v, float *restrict y, int64_t n, int tanh_mode) {
    if (tanh_mode)
        for (int64_t j = 0; j < n; j++)
            y[j] = 0.5f * v[j] * (1.0f + tanh_f32((float)GELU_K0 * (v[j] + (float)GELU_K1 * v[j] * v[j] * v[j])));
    else
        for (int64_t j = 0; j < n; j++) y[j] = 0.5f * v[j] * (1.0f + erf_f32(v[j] * (float)INV_SQRT2));
}

OM_VEC_CLONES static void bias_gelu_f32_range(void *c, int64_t lo, int64_t hi) {
    const bias_gelu_rows *a = c;
    const int64_t cols = a->cols;
    float tmp[GELU_ROW_CHUNK];
    for (int64_t i = lo; i < hi; i++) {
        for (int64_t j0 = 0; j0 < cols; j0 += GELU_ROW_CHUNK) {
            const int64_t n = cols - j0 < GELU_ROW_CHUNK ? cols - j0 : GELU_ROW_CHUNK;
            const float *restrict xr = a->x + i * cols + j0;
            float *restrict yr = a->y + i * cols + j0;
            const float *restrict br = a->bs ? a->b + j0 : tmp;
            if (!a->bs) for (int64_t j = 0; j < n; j++) tmp[j] = a->b[0];
            if (a->z) {   /* z = x + b (in place when z is x), then y = gelu(z) while the chunk is in cache */
                float *zr = a->z + i * cols + j0;
                for (int64_t j = 0; j < n; j++) zr[j] = a->x[i * cols + j0 + j] + br[j];
                gelu_f32_chunk(zr, yr, n, a->tanh_mode);
                continue;
            }
            if (a->tanh_mode)
                for (int64_t j = 0; j < n; j++) {
                    const float v = xr[j] + br[j];
                    yr[j] = 0.5f * v * (1.0f + tanh_f32((float)GELU_K0 * (v + (float)GELU_K1 * v * v * v)));
                }
            else
                for (int64_t j = 0; j < n; j++) {
                    const float v = xr[j] + br[j];
                    yr[j] = 0.5f * v * (1.0f + erf_f32(v * (float)INV_SQRT2));
                }
        }
    }
}

OM_VEC_CLONES static void bias_gelu_grad_f32_range(void *c, int64_t lo, int64_t hi) {
    const bias_gelu_rows *a = c;
    const int64_t cols = a->cols;
    float tmp[GELU_ROW_CHUNK];
    for (int64_t i = lo; i < hi; i++) {
        for (int64_t j0 = 0; j0 < cols; j0 += GELU_ROW_CHUNK) {
            const int64_t n = cols - j0 < GELU_ROW_CHUNK ? cols - j0 : GELU_ROW_CHUNK;
            const float *restrict xr = a->x + i * cols + j0, *restrict dyr = a->dy + i * cols + j0;
            float *restrict dxr = a->dx + i * cols + j0;
            const float *restrict br = a->bs ? a->b + j0 : tmp;
            if (!a->bs) for (int64_t j = 0; j < n; j++) tmp[j] = a->b[0];
            if (a->tanh_mode)
                for (int64_t j = 0; j < n; j++) {
                    const float v = xr[j] + br[j];
                    const float t = tanh_f32((float)GELU_K0 * (v + (float)GELU_K1 * v * v * v));
                    dxr[j] = dyr[j] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * (float)GELU_K0 *
                                                               (1.0f + 3.0f * (float)GELU_K1 * v * v));
                }
            else
                for (int64_t j = 0; j < n; j++) {
                    const float v = xr[j] + br[j];
                    dxr[j] = dyr[j] * (0.5f * (1.0f + erf_f32(v * (float)INV_SQRT2)) +
                                       v * (float)INV_SQRT_2PI * exp_f32(-0.5f * v * v));
                }
        }
    }
}

/* y = gelu(x + b) over (rows, cols); b has cols values (bs 1) or one (bs 0). y may be x.
 * z, when not NULL, receives x + b (z may be x, not y). */
static om_status *bias_gelu_run(const om_node *node, om_dtype dt, const void *x, const void *b, int64_t bs, void *z,
                                void *y, int64_t rows, int64_t cols, int tanh_mode) {
    if (dt == OM_F32 && cols > 0) {
        bias_gelu_rows a = {.x = x, .b = b, .y = y, .z = z, .cols = cols, .bs = bs, .tanh_mode = tanh_mode};
        om_pool_for(rows, OM_GRAIN / cols + 1, bias_gelu_f32_range, &a);
        return NULL;
    }
    OM_DISPATCH_FLOAT(dt, node, {
        const T *xp = x;
        const T *bp = b;
        T *yp = y;
        T *zp = z;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                const T v = xp[i * cols + j] + bp[j * bs];
                if (zp) zp[i * cols + j] = v;
                yp[i * cols + j] = tanh_mode ? (T)0.5 * v * ((T)1 + tanh((T)GELU_K0 * (v + (T)GELU_K1 * v * v * v)))
                                             : (T)0.5 * v * ((T)1 + erf(v * (T)INV_SQRT2));
            }
    });
    return NULL;
}

// x is (rows, cols), b is (cols) or (1); y like x
static om_status *bias_gelu_cpu(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(bias_rows(ctx, 0, 1, &rows, &cols));
    const int64_t bs = om_tensor_numel(&ctx->in[1]) == 1 ? 0 : 1;
    return bias_gelu_run(ctx->node, ctx->in[0].dtype, ctx->in[0].data, ctx->in[1].data, bs, NULL, ctx->out[0].data,
                         rows, cols, gelu_tanh_mode(ctx->node));
}

static om_status *bias_gelu_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    int x = f->in[0], b = f->in[1], dy = c->dy[0];
    int tanh_mode = gelu_tanh_mode(f);
    if (dy < 0) return NULL;
    int in[3] = {dy, x, b}, out[2], want[2] = {c->need_dx[0], c->need_dx[1]};
    if (om_emit_partial(c, om_op_bias_gelu_grad_id, in, 3, out, 2, want) < 0) return NULL;
    if (tanh_mode == 1) om_grad_fail(c, om_node_set_string(c->g, om_emit_last(c), "approximate", "tanh"));
    c->dx[0] = out[0];
    c->dx[1] = out[1];
    return NULL;
}

static om_status *bias_gelu_grad_infer(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    OM_TRY(bias_rows(ctx, 1, 2, &rows, &cols));
    if (om_tensor_numel(&ctx->in[0]) != rows * cols)
        return om_error(OM_INVALID_ARGUMENT, "BiasGeluGrad node '%s': dy and x differ in size", ctx->node->name);
    om_set_shape(&ctx->out[0], &ctx->in[1], ctx->in[1].dtype);
    if (ctx->n_out > 1) om_set_shape(&ctx->out[1], &ctx->in[2], ctx->in[2].dtype);
    return NULL;
}

// dy, x are (rows, cols), b is (cols) or (1); dx like x, db like b = column sums of dx
static om_status *bias_gelu_grad_cpu(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(bias_rows(ctx, 1, 2, &rows, &cols));
    const int tanh_mode = gelu_tanh_mode(ctx->node);
    const int64_t bs = om_tensor_numel(&ctx->in[2]) == 1 ? 0 : 1;
    const int want_dx = wanted(ctx, 0), want_db = wanted(ctx, 1);
    if (ctx->in[1].dtype == OM_F32 && want_dx && cols > 0) {
        /* dx in parallel rows, then db as column sums of dx (rows in order: deterministic) */
        bias_gelu_rows a = {.x = ctx->in[1].data, .b = ctx->in[2].data, .dy = ctx->in[0].data,
                            .dx = ctx->out[0].data, .cols = cols, .bs = bs, .tanh_mode = tanh_mode};
        om_pool_for(rows, OM_GRAIN / cols + 1, bias_gelu_grad_f32_range, &a);
        if (want_db) {
            float *restrict dbp = ctx->out[1].data;
            const float *restrict dxp = ctx->out[0].data;
            if (bs) {
                for (int64_t j = 0; j < cols; j++) dbp[j] = 0;
                for (int64_t i = 0; i < rows; i++)
                    for (int64_t j = 0; j < cols; j++) dbp[j] += dxp[i * cols + j];
            } else {
                double acc = 0;
                for (int64_t i = 0; i < rows * cols; i++) acc += dxp[i];
                dbp[0] = (float)acc;
            }
        }
        return NULL;
    }
    OM_DISPATCH_FLOAT(ctx->in[1].dtype, ctx->node, {
        const T *restrict dyp = ctx->in[0].data;
        const T *restrict xp = ctx->in[1].data;
        const T *restrict bp = ctx->in[2].data;
        T *restrict dxp = want_dx ? (T *)ctx->out[0].data : NULL;
        T *restrict dbp = want_db ? (T *)ctx->out[1].data : NULL;
        if (dbp) for (int64_t j = 0; j < (bs ? cols : 1); j++) dbp[j] = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                const T v = xp[i * cols + j] + bp[j * bs];
                T d;
                if (tanh_mode) {
                    /* d/dv 0.5 v (1 + tanh(u)), u = k0 (v + k1 v^3) */
                    const T t = tanh((T)GELU_K0 * (v + (T)GELU_K1 * v * v * v));
                    d = (T)0.5 * ((T)1 + t) +
                        (T)0.5 * v * ((T)1 - t * t) * (T)GELU_K0 * ((T)1 + (T)3 * (T)GELU_K1 * v * v);
                } else {
                    d = (T)0.5 * ((T)1 + erf(v * (T)INV_SQRT2)) + v * (T)INV_SQRT_2PI * exp((T)-0.5 * v * v);
                }
                const T g = dyp[i * cols + j] * d;
                if (dxp) dxp[i * cols + j] = g;
                if (dbp) dbp[j * bs] += g;
            }
    });
    return NULL;
}

/* ---- MatMulBiasGelu --------------------------------------------------------------- */

/* y = gelu(x op(W) + b); output 1, when it exists, is the pre-activation z = x op(W) + b,
 * which the gradient rule asks for (om_node_ensure_output) and GeluGrad reads. The GEMM
 * writes z (or y when there is no z) and one pass over it adds the bias and applies the GELU
 * (BiasGelu's vectorized rows): the same memory traffic as MatMul + BiasGelu, one node. */
static om_status *mmbg_fwd_infer(om_kernel_ctx *ctx) {
    if (gelu_tanh_mode(ctx->node) < 0) return om_err_unsupported(ctx->node, "approximate must be \"none\" or \"tanh\"");
    OM_TRY(mmb_infer(ctx));
    if (ctx->n_out > 1) om_set_shape(&ctx->out[1], &ctx->out[0], ctx->out[0].dtype);
    return NULL;
}

// x is (M, K) (leading dims flattened), W is (K, N) or (N, K) with transB, b is (N) or (1); y, z are (M, N)
static om_status *mmbg_fwd_cpu(om_kernel_ctx *ctx) {
    int64_t M = 0, N = 0, K = 0;
    OM_TRY(mmb_dims(ctx, &M, &N, &K));
    const om_node *n = ctx->node;
    const int tb = om_attr_int(n, "transB", 0) != 0, tanh_mode = gelu_tanh_mode(n);
    const om_dtype dt = ctx->in[0].dtype;
    if (dt != OM_F32 && dt != OM_F64) return om_err_dtype(n, 0, dt);
    const void *x = ctx->in[0].data, *w = ctx->in[1].data, *b = ctx->in[2].data;
    const int64_t bs = om_tensor_numel(&ctx->in[2]) == 1 ? 0 : 1;
    void *y = ctx->out[0].data, *z = wanted(ctx, 1) ? ctx->out[1].data : NULL;
    void *p = z ? z : y;   /* the product's buffer */
    gemm(dt, 0, tb, (int)M, (int)N, (int)K, x, (int)K, w, tb ? (int)K : (int)N, 0.0, p);
    return bias_gelu_run(n, dt, p, b, bs, z, y, M, N, tanh_mode);
}

/* dz = GeluGrad(dy, z), then MatMulBiasGrad(dz) gives dx, dW and db (the column sums of dz):
 * the composition of existing backward ops, no new one. */
static om_status *mmbg_fwd_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    const int x = f->in[0], w = f->in[1], b = f->in[2], dy = c->dy[0];
    const int tb = om_attr_int(f, "transB", 0) != 0, tanh_mode = gelu_tanh_mode(f) == 1;
    /* z read by the graph too (a model output, say) brings its own gradient, added to dz */
    const int dz_direct = f->n_out > 1 && f->out[1] >= 0 ? c->dy[1] : -1;
    if (dy < 0 && dz_direct < 0) return NULL;
    int dz = dz_direct;
    if (dy >= 0) {
        int z = om_node_ensure_output(c->g, c->node, 1, c->g->values[x].dtype);
        if (z < 0) return om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"));
        int g = om_emit2(c, om_op_gelu_grad_id, dy, z);
        if (g < 0) return NULL;
        if (tanh_mode) om_grad_fail(c, om_node_set_string(c->g, om_emit_last(c), "approximate", "tanh"));
        dz = dz_direct < 0 ? g : om_emit2(c, om_op_add_id, g, dz_direct);
        if (dz < 0) return NULL;
    }
    return emit_matmul_bias_grad(c, dz, x, w, b, tb);
}

/* ---- BiasDropout ------------------------------------------------------------------ */

static om_dtype bias_dropout_dtype(const om_graph *g, const om_node *n, int j) {
    return j == 1 ? OM_BOOL : g->values[n->in[0]].dtype;
}

static om_status *bias_dropout_check(const om_kernel_ctx *ctx, int64_t *rows, int64_t *cols) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    OM_TRY(om_check_float(n, x, 0, OM_UNDEFINED));
    *cols = x->rank ? x->dims[x->rank - 1] : 1;
    *rows = *cols ? om_tensor_numel(x) / *cols : 0;
    if (om_in_present(ctx, 1)) {
        OM_TRY(om_check_float(n, &ctx->in[1], 1, x->dtype));
        OM_TRY(check_bias(n, &ctx->in[1], 1, *cols));
    }
    if (om_in_present(ctx, 2)) {
        const om_tensor *r = &ctx->in[2];
        OM_TRY(om_check_float(n, r, 2, x->dtype));
        int ok = r->rank <= x->rank;
        for (int d = 0; ok && d < r->rank; d++) {
            int64_t e = r->dims[r->rank - 1 - d], f = x->dims[x->rank - 1 - d];
            ok = e == f || e == 1;
        }
        if (!ok) {
            char a[128], b[128];
            om_shape_str(x, a, sizeof a);
            om_shape_str(r, b, sizeof b);
            return om_error(OM_INVALID_ARGUMENT, "BiasDropout node '%s': the residual %s must broadcast to x %s "
                            "without growing it", n->name, b, a);
        }
    }
    if (om_in_present(ctx, 4) && ctx->in[4].dtype != OM_BOOL) return om_err_dtype(n, 4, ctx->in[4].dtype);
    return NULL;
}

static om_status *bias_dropout_infer(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(bias_dropout_check(ctx, &rows, &cols));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    if (ctx->n_out > 1) om_set_shape(&ctx->out[1], &ctx->in[0], OM_BOOL);
    return NULL;
}

/* Offset in r (broadcast to x's shape) of x's flat index k: the slow path for a residual
 * smaller than x. */
static int64_t res_offset(const om_tensor *x, const om_tensor *r, int64_t k) {
    int64_t off = 0, stride = 1;
    for (int d = 0; d < x->rank; d++) {
        int dx = x->rank - 1 - d, dr = r->rank - 1 - d;
        int64_t i = k % x->dims[dx];
        k /= x->dims[dx];
        if (dr < 0) continue;
        if (r->dims[dr] != 1) off += i * stride;
        stride *= r->dims[dr];
    }
    return off;
}

// x, y, mask are (rows, cols); residual like x (or broadcast to it); b is (cols) or (1)
/* BiasDropout and its gradient, rows on the pool. The mask depends on (seed, element) only,
 * so any split of the rows draws the same one. */
typedef struct bias_dropout_job {
    const om_kernel_ctx *ctx;
    const void *x, *b, *r;      /* forward: x, bias?, residual?; backward: dy in x */
    void *y;                    /* forward: y; backward: dx */
    uint8_t *mask;
    int64_t cols, bs;
    int drop, rsame;
    float ratio;
    uint64_t seed;
    double scale;
} bias_dropout_job;

#define BIAS_DROPOUT_RANGE(name, T)                                                           \
    static void name(void *c, int64_t lo, int64_t hi) {                                       \
        const bias_dropout_job *j = c;                                                        \
        const T *restrict xp = j->x, *restrict bp = j->b, *restrict rp = j->r;                \
        T *restrict yp = j->y;                                                                \
        const T s = (T)j->scale;                                                              \
        const int64_t cols = j->cols;                                                         \
        for (int64_t i = lo; i < hi; i++)                                                     \
            for (int64_t jj = 0; jj < cols; jj++) {                                           \
                const int64_t k = i * cols + jj;                                              \
                T v = xp[k] + (bp ? bp[jj * j->bs] : (T)0);                                   \
                if (j->drop) {                                                                \
                    const int keep = om_rand_uniform(j->seed, (uint64_t)k) >= j->ratio;       \
                    if (j->mask) j->mask[k] = (uint8_t)keep;                                  \
                    v = keep ? v * s : (T)0;                                                  \
                } else if (j->mask) {                                                         \
                    j->mask[k] = 1;                                                           \
                }                                                                             \
                yp[k] = rp ? v + rp[j->rsame ? k : res_offset(&j->ctx->in[0], &j->ctx->in[2], k)] : v; \
            }                                                                                 \
    }                                                                                         \
    OM_VEC_CLONES static void name##_grad(void *c, int64_t lo, int64_t hi) {                  \
        const bias_dropout_job *j = c;                                                        \
        const T *restrict g = j->x;                                                           \
        const uint8_t *restrict m = j->mask;                                                  \
        T *restrict dx = j->y;                                                                \
        const T s = (T)j->scale;                                                              \
        const int64_t n0 = lo * j->cols, n1 = hi * j->cols;                                   \
        if (m) for (int64_t k = n0; k < n1; k++) dx[k] = m[k] ? g[k] * s : (T)0;              \
        else for (int64_t k = n0; k < n1; k++) dx[k] = g[k];                                  \
    }
BIAS_DROPOUT_RANGE(bias_dropout_f32, float)
BIAS_DROPOUT_RANGE(bias_dropout_f64, double)

static om_status *bias_dropout_cpu(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(bias_dropout_check(ctx, &rows, &cols));
    double ratio, scale;
    int training;
    OM_TRY(om_dropout_params(ctx, 3, 4, &ratio, &training, &scale));
    const om_tensor *x = &ctx->in[0];
    if (x->dtype != OM_F32 && x->dtype != OM_F64) return om_err_dtype(ctx->node, 0, x->dtype);
    bias_dropout_job j = {
        .ctx = ctx, .x = x->data, .b = om_in_present(ctx, 1) ? ctx->in[1].data : NULL,
        .r = om_in_present(ctx, 2) ? ctx->in[2].data : NULL, .y = ctx->out[0].data,
        .mask = wanted(ctx, 1) ? (uint8_t *)ctx->out[1].data : NULL, .cols = cols,
        .bs = om_in_present(ctx, 1) && om_tensor_numel(&ctx->in[1]) != 1 ? 1 : 0, .drop = training && ratio > 0.0,
        .rsame = !om_in_present(ctx, 2) || om_shape_equal(&ctx->in[2], x), .ratio = (float)ratio, .seed = ctx->seed,
        .scale = scale};
    om_pool_for(rows, OM_GRAIN / (cols ? cols : 1) + 1, x->dtype == OM_F32 ? bias_dropout_f32 : bias_dropout_f64, &j);
    return NULL;
}

/* y = dropout(x + b) + r:  dx = dy * mask * scale,  db = column sums of dx,  dr = dy. */
static om_status *bias_dropout_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    int b = f->n_in > 1 ? f->in[1] : -1, ratio = f->n_in > 3 ? f->in[3] : -1, tm = f->n_in > 4 ? f->in[4] : -1;
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    /* a residual of x's shape gets dy as is (SumToShape of equal shapes is a copy) */
    if (c->need_dx[2] && (c->dx[2] = om_emit_sum_to(c, dy, f->in[2])) < 0) return NULL;
    f = &c->g->nodes[c->node];
    if (!c->need_dx[0] && !c->need_dx[1]) return NULL;
    int mask = tm >= 0 ? om_node_ensure_output(c->g, c->node, 1, OM_BOOL) : -1;
    if (tm >= 0 && mask < 0)
        return om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "node '%s': cannot add the BiasDropout mask output",
                                        c->g->nodes[c->node].name));
    int bshape = -1;
    if (b >= 0 && c->need_dx[1] && (bshape = om_emit_shape(c, b)) < 0) return NULL;
    int in[5] = {dy, mask, ratio, tm, bshape}, out[2], want[2] = {c->need_dx[0], c->need_dx[1] && b >= 0};
    if (om_emit_partial(c, om_op_bias_dropout_grad_id, in, 5, out, 2, want) < 0) return NULL;
    c->dx[0] = out[0];
    c->dx[1] = out[1];
    return NULL;
}

static om_status *bias_dropout_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    OM_TRY(om_check_float(n, &ctx->in[0], 0, OM_UNDEFINED));
    if (om_in_present(ctx, 1)) {
        if (ctx->in[1].dtype != OM_BOOL) return om_err_dtype(n, 1, ctx->in[1].dtype);
        if (om_tensor_numel(&ctx->in[1]) != om_tensor_numel(&ctx->in[0]))
            return om_error(OM_INVALID_ARGUMENT, "BiasDropoutGrad node '%s': mask and dy differ in size", n->name);
    }
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    if (ctx->n_out > 1 && om_in_present(ctx, 4)) {
        OM_TRY(read_shape(ctx, 4, &ctx->out[1], ctx->in[0].dtype));
        const om_tensor *dy = &ctx->in[0];
        OM_TRY(check_bias(n, &ctx->out[1], 4, dy->rank ? dy->dims[dy->rank - 1] : 1));
    }
    return NULL;
}

// dy, mask, dx are (rows, cols); db is (cols) or (1)
static om_status *bias_dropout_grad_cpu(om_kernel_ctx *ctx) {
    double ratio, kept_scale;
    int training;
    OM_TRY(om_dropout_params(ctx, 2, 3, &ratio, &training, &kept_scale));
    const om_tensor *dy = &ctx->in[0];
    const int64_t cols = dy->rank ? dy->dims[dy->rank - 1] : 1, rows = cols ? om_tensor_numel(dy) / cols : 0;
    const int use_mask = training && om_in_present(ctx, 1);
    const int want_dx = wanted(ctx, 0), want_db = wanted(ctx, 1);
    const int64_t bs = want_db && om_tensor_numel(&ctx->out[1]) != 1 ? 1 : 0;
    const double scale = training ? kept_scale : 1.0;
    if (want_dx && (dy->dtype == OM_F32 || dy->dtype == OM_F64)) {
        /* dx on the pool, then db as the row sums of dx */
        bias_dropout_job j = {.ctx = ctx, .x = dy->data, .y = ctx->out[0].data,
                              .mask = use_mask ? (uint8_t *)ctx->in[1].data : NULL, .cols = cols, .scale = scale};
        om_pool_for(rows, OM_GRAIN / (cols ? cols : 1) + 1,
                    dy->dtype == OM_F32 ? bias_dropout_f32_grad : bias_dropout_f64_grad, &j);
        if (!want_db) return NULL;
        if (bs) return om_sum_rows(dy->dtype, rows, cols, ctx->out[0].data, ctx->out[1].data);
    }
    OM_DISPATCH_FLOAT(dy->dtype, ctx->node, {
        const T *restrict g = dy->data;
        const uint8_t *restrict m = use_mask ? (const uint8_t *)ctx->in[1].data : NULL;
        T *restrict dx = want_dx ? (T *)ctx->out[0].data : NULL;
        T *restrict db = want_db ? (T *)ctx->out[1].data : NULL;
        const T s = (T)scale;
        if (db) for (int64_t j = 0; j < (bs ? cols : 1); j++) db[j] = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                const int64_t k = i * cols + j;
                const T v = dx ? dx[k] : m ? (m[k] ? g[k] * s : (T)0) : g[k];   /* dx: done above */
                if (db) db[j * bs] += v;
            }
    });
    return NULL;
}

/* ---- SimplifiedLayerNormalization (RMSNorm) ---------------------------------------- */

static om_status *sln_dims(const om_kernel_ctx *ctx, int xi, int si, int64_t *rows, int64_t *cols) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[xi], *s = &ctx->in[si];
    OM_TRY(om_check_float(n, x, xi, OM_UNDEFINED));
    OM_TRY(om_check_float(n, s, si, x->dtype));
    int axis;
    OM_TRY(om_norm_axis(n, om_attr_int(n, "axis", -1), x->rank, &axis));
    if (axis != x->rank - 1) return om_err_unsupported(n, "only the last axis is normalized");
    *cols = x->dims[x->rank - 1];
    *rows = *cols ? om_tensor_numel(x) / *cols : 0;
    if (om_tensor_numel(s) != *cols) {
        char a[128];
        om_shape_str(s, a, sizeof a);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': scale %s must have %lld elements", n->op->name, n->name, a,
                        (long long)*cols);
    }
    return NULL;
}

/* inv_rms is kept in the statistics dtype (fp32 for fp16/bf16 x), as LayerNorm's InvStdDev. */
static om_dtype sln_dtype(const om_graph *g, const om_node *n, int j) {
    om_dtype x = g->values[n->in[0]].dtype;
    return j == 1 ? om_dtype_stat(x) : x;
}

static om_status *sln_infer(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(sln_dims(ctx, 0, 1, &rows, &cols));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    if (ctx->n_out > 1) {
        om_set_shape(&ctx->out[1], &ctx->in[0], om_dtype_stat(ctx->in[0].dtype));
        ctx->out[1].dims[ctx->out[1].rank - 1] = 1;
    }
    return NULL;
}

// x is (rows, cols), scale (cols); y like x, inv_rms (rows, 1)
static om_status *sln_cpu(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(sln_dims(ctx, 0, 1, &rows, &cols));
    const double eps = om_attr_real(ctx->node, "epsilon", 1e-5);
    OM_DISPATCH_FLOAT(ctx->in[0].dtype, ctx->node, {
        const T *restrict xp = ctx->in[0].data;
        const T *restrict sp = ctx->in[1].data;
        T *restrict yp = ctx->out[0].data;
        T *restrict ip = wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL;
        for (int64_t i = 0; i < rows; i++) {
            const T *restrict xr = xp + i * cols;
            T ss = 0;
            for (int64_t j = 0; j < cols; j++) ss += xr[j] * xr[j];
            const T inv = (T)1 / sqrt(ss / (T)cols + (T)eps);
            if (ip) ip[i] = inv;
            for (int64_t j = 0; j < cols; j++) yp[i * cols + j] = xr[j] * inv * sp[j];
        }
    });
    return NULL;
}

static om_status *sln_grad(om_grad_ctx *c) {
    int x = c->g->nodes[c->node].in[0], s = c->g->nodes[c->node].in[1], dy = c->dy[0];
    if (dy < 0) return NULL;
    int inv = om_node_ensure_output(c->g, c->node, 1, om_dtype_stat(c->g->values[x].dtype));
    if (inv < 0) return om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"));
    int in[4] = {dy, x, s, inv}, out[2], want[2] = {c->need_dx[0], c->need_dx[1]};
    if (om_emit_partial(c, om_op_simplified_layer_norm_grad_id, in, 4, out, 2, want) < 0) return NULL;
    c->dx[0] = out[0];
    c->dx[1] = out[1];
    return NULL;
}

static om_status *sln_grad_infer(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(sln_dims(ctx, 1, 2, &rows, &cols));
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, ctx->in[1].dtype));
    OM_TRY(om_check_float(ctx->node, &ctx->in[3], 3, om_dtype_stat(ctx->in[1].dtype)));
    if (om_tensor_numel(&ctx->in[0]) != rows * cols || om_tensor_numel(&ctx->in[3]) != rows)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dy / inv_rms sizes do not match x", ctx->node->op->name,
                        ctx->node->name);
    om_set_shape(&ctx->out[0], &ctx->in[1], ctx->in[1].dtype);
    if (ctx->n_out > 1) om_set_shape(&ctx->out[1], &ctx->in[2], ctx->in[2].dtype);
    return NULL;
}

/* y = x r s with r = (mean(x^2) + eps)^-1/2:
 *   dx_j = r (g_j s_j) - x_j r^3 / cols * sum_k (g_k s_k x_k),   ds_j = sum_rows g_j x_j r */
// dy, x are (rows, cols), scale (cols), inv_rms (rows)
static om_status *sln_grad_cpu(om_kernel_ctx *ctx) {
    int64_t rows = 0, cols = 0;
    OM_TRY(sln_dims(ctx, 1, 2, &rows, &cols));
    const int want_dx = wanted(ctx, 0), want_ds = wanted(ctx, 1);
    OM_DISPATCH_FLOAT(ctx->in[1].dtype, ctx->node, {
        const T *restrict g = ctx->in[0].data;
        const T *restrict xp = ctx->in[1].data;
        const T *restrict sp = ctx->in[2].data;
        const T *restrict ip = ctx->in[3].data;
        T *restrict dx = want_dx ? (T *)ctx->out[0].data : NULL;
        T *restrict ds = want_ds ? (T *)ctx->out[1].data : NULL;
        if (ds) for (int64_t j = 0; j < cols; j++) ds[j] = 0;
        for (int64_t i = 0; i < rows; i++) {
            const T *restrict gr = g + i * cols;
            const T *restrict xr = xp + i * cols;
            const T r = ip[i];
            if (ds) for (int64_t j = 0; j < cols; j++) ds[j] += gr[j] * xr[j] * r;
            if (!dx) continue;
            T dot = 0;
            for (int64_t j = 0; j < cols; j++) dot += gr[j] * sp[j] * xr[j];
            const T c3 = r * r * r * dot / (T)cols;
            for (int64_t j = 0; j < cols; j++) dx[i * cols + j] = r * gr[j] * sp[j] - xr[j] * c3;
        }
    });
    return NULL;
}

/* ---- the defs --------------------------------------------------------------------- */

const om_op_def om_op_matmul_bias = {
    .name = "MatMulBias", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = mmb_infer, .grad = mmb_grad, .cpu = mmb_cpu, .diff_inputs = 0x7,
    .attrs = "transB:int",
};
const om_op_def om_op_matmul_bias_grad = {
    .name = "MatMulBiasGrad", .domain = "ortmod", .min_in = 6, .max_in = 7, .min_out = 1, .max_out = 3,
    .infer = mmbg_infer, .cpu = mmbg_cpu,
    .attrs = "approximate:string=none|tanh transB:int",
};
const om_op_def om_op_bias_gelu = {
    .name = "BiasGelu", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_INPLACE, .infer = bias_gelu_infer, .grad = bias_gelu_grad, .cpu = bias_gelu_cpu, .diff_inputs = 0x3,
    .attrs = "approximate:string=none|tanh",
};
const om_op_def om_op_bias_gelu_grad = {
    .name = "BiasGeluGrad", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 2,
    .flags = OM_OP_INPLACE, .infer = bias_gelu_grad_infer, .cpu = bias_gelu_grad_cpu,
    .attrs = "approximate:string=none|tanh",
};
const om_op_def om_op_matmul_bias_gelu = {
    .name = "MatMulBiasGelu", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 2,
    .infer = mmbg_fwd_infer, .grad = mmbg_fwd_grad, .cpu = mmbg_fwd_cpu, .diff_inputs = 0x7,
    .attrs = "approximate:string=none|tanh transB:int",
};
const om_op_def om_op_bias_dropout = {
    .name = "BiasDropout", .domain = "ortmod", .min_in = 1, .max_in = 5, .min_out = 1, .max_out = 2,
    .flags = OM_OP_RANDOM | OM_OP_INPLACE, .dtype = bias_dropout_dtype, .infer = bias_dropout_infer, .grad = bias_dropout_grad,
    .cpu = bias_dropout_cpu, .diff_inputs = 0x7,
};
const om_op_def om_op_bias_dropout_grad = {
    .name = "BiasDropoutGrad", .domain = "ortmod", .min_in = 1, .max_in = 5, .min_out = 1, .max_out = 2,
    .flags = OM_OP_INPLACE, .infer = bias_dropout_grad_infer, .cpu = bias_dropout_grad_cpu,
};
const om_op_def om_op_simplified_layer_norm = {
    .name = "SimplifiedLayerNormalization", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 2,
    .dtype = sln_dtype, .infer = sln_infer, .grad = sln_grad, .cpu = sln_cpu, .diff_inputs = 0x3,
    .attrs = "axis:int epsilon:float stash_type:int=1",
};
const om_op_def om_op_simplified_layer_norm_grad = {
    .name = "SimplifiedLayerNormalizationGrad", .domain = "ortmod", .min_in = 4, .max_in = 4, .min_out = 1,
    .max_out = 2, .infer = sln_grad_infer, .cpu = sln_grad_cpu,
    .attrs = "axis:int",
};
