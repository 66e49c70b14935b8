/* norm.c — batch normalization: BatchNormalization (opset 15, inference and training mode)
 * and its backward op.
 *
 * Exports:
 *   om_op_batch_norm        BatchNormalization                    (X, scale, B, mean, var)
 *                           -> Y, running_mean?, running_var?, saved_mean?, saved_invstd?
 *   om_op_batch_norm_grad   BatchNormalizationGrad (domain ortmod) (dY, X, scale, mean, invstd|var)
 *                           -> dX, dScale, dB
 *   om_op_batch_norm_relu   BatchNormRelu (domain ortmod)          (X, scale, B, mean, var)
 *                           -> Y = Relu(BatchNormalization(...)), running_mean?, ... (as above)
 *   om_op_batch_norm_relu_grad BatchNormReluGrad (domain ortmod)   (dY, Y, X, scale, mean, invstd|var)
 *                           -> dX, dScale, dB
 *
 * BatchNormRelu is what the pass "batch_norm_relu" (passes/fuse_batch_norm_relu.c) makes of a
 * BatchNormalization whose Y only a Relu reads: the same kernel, with the Relu applied as each
 * element is stored (Relu's own rule, v < 0 ? 0 : v: NaN and -0 stay), and a backward that
 * applies ReluGrad's mask (dY where Y > 0 or Y is NaN, else 0) as it reads dY. Both compute
 * exactly what the unfused pair does, bit for bit: the same sums in the same order, over the
 * same masked dY; only the intermediate Y and the ReluGrad output are never written.
 *
 * Training mode (training_mode = 1) follows PyTorch, which is what exports of BatchNorm*d
 * in train() are compared against: Y is normalized with the batch statistics (biased
 * variance), and the running statistics are updated as ONNX writes it,
 *     running = input * momentum + batch * (1 - momentum),
 * with the *unbiased* batch variance for running_var, as torch.nn.BatchNorm does (the ONNX
 * reference implementation uses the biased one; eager parity is what users observe).
 * Outputs 3 and 4 are ortmod's: the batch mean and 1/sqrt(var + eps) saved for the
 * backward (added by the gradient rule via om_node_ensure_output; opset < 14 graphs named
 * outputs 3/4 saved_mean/saved_var, which nothing in an exported training graph reads).
 * running_mean / running_var carry no gradient. epsilon and momentum are read as the numbers
 * the exporter wrote (om_attr_real: 0.9, not float32's 0.899999976), so that float64 models
 * keep float64 statistics.
 *
 * X is viewed as (N, C, S) with S the product of the spatial dims; statistics are per C.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/broadcast.h"
#include "ops/op.h"
#include "ops/op_util.h"

static om_status *bn_geometry(const om_node *n, const om_tensor *x, int64_t *N, int64_t *C, int64_t *S) {
    if (x->rank < 2)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X must have rank >= 2 (N, C, ...)", n->op->name,
                        om_node_name(n));
    *N = x->dims[0];
    *C = x->dims[1];
    *S = 1;
    for (int i = 2; i < x->rank; i++) *S *= x->dims[i];
    return NULL;
}

static om_status *bn_check_vec(const om_node *n, const om_tensor *t, int i, om_dtype dt, int64_t C) {
    if (t->dtype != dt) return om_err_dtype(n, i, t->dtype);
    if (om_tensor_numel(t) != C)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d must have %lld elements (the channels of X)",
                        n->op->name, om_node_name(n), i, (long long)C);
    return NULL;
}

/* Y (dX) in X's dtype; the statistics (the parameters' gradients) in scale's */
static om_dtype bn_dtype(const om_graph *g, const om_node *n, int j) {
    return g->values[n->in[j == 0 ? 0 : 1]].dtype;
}
static om_dtype bn_grad_dtype(const om_graph *g, const om_node *n, int j) {
    return g->values[n->in[j == 0 ? 0 : 2]].dtype;
}

static om_status *bn_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    int64_t N = 0, C = 0, S = 0;
    OM_TRY(om_check_float(n, x, 0, OM_UNDEFINED));
    OM_TRY(bn_geometry(n, x, &N, &C, &S));
    const om_dtype pdt = om_norm_param_dtype(x->dtype, &ctx->in[1]);
    for (int i = 1; i < 5; i++) OM_TRY(bn_check_vec(n, &ctx->in[i], i, pdt, C));
    om_set_shape(&ctx->out[0], x, x->dtype);
    for (int j = 1; j < ctx->n_out; j++) om_set_shape(&ctx->out[j], &ctx->in[1], pdt);
    return NULL;
}

/* ---- vector sums ---------------------------------------------------------------------
 * GCC keeps a float sum in order (no -ffast-math), so `s += r[i]` runs one element at a
 * time. These sum 64 bytes at a time in a GCC vector (16 floats or 8 doubles: independent
 * partial sums), which the workers that inline them lower to each ISA they are built for
 * (OM_VEC_CLONES: one zmm, two ymm or four xmm). A row's sum is in T, rows add up in
 * double. Vectors never cross a call by value (their ABI depends on the ISA). */
typedef float bn_vf32 __attribute__((vector_size(64)));
typedef double bn_vf64 __attribute__((vector_size(64)));

#define BN_ROW_SUMS(T, sfx)                                                                 \
    enum { BN_W_##sfx = 64 / sizeof(T) };                                                   \
    static inline T bn_hsum_##sfx(const bn_v##sfx *v) {                                     \
        T s = 0;                                                                            \
        for (int k = 0; k < BN_W_##sfx; k++) s += (*v)[k];                                  \
        return s;                                                                           \
    }                                                                                       \
    /* sum r[i] */                                                                          \
    static inline T bn_sum_##sfx(const T *restrict r, int64_t n) {                          \
        bn_v##sfx acc = {0}, v;                                                             \
        int64_t i = 0;                                                                      \
        for (; i + BN_W_##sfx <= n; i += BN_W_##sfx) {                                      \
            memcpy(&v, r + i, sizeof v);                                                    \
            acc += v;                                                                       \
        }                                                                                   \
        T s = bn_hsum_##sfx(&acc);                                                          \
        for (; i < n; i++) s += r[i];                                                       \
        return s;                                                                           \
    }                                                                                       \
    /* sum (r[i] - m)^2 */                                                                  \
    static inline T bn_sqdev_##sfx(const T *restrict r, int64_t n, T m) {                   \
        bn_v##sfx acc = {0}, d;                                                             \
        int64_t i = 0;                                                                      \
        for (; i + BN_W_##sfx <= n; i += BN_W_##sfx) {                                      \
            memcpy(&d, r + i, sizeof d);                                                    \
            d -= m;                                                                         \
            acc += d * d;                                                                   \
        }                                                                                   \
        T s = bn_hsum_##sfx(&acc);                                                          \
        for (; i < n; i++) s += (r[i] - m) * (r[i] - m);                                    \
        return s;                                                                           \
    }                                                                                       \
    /* *s1 = sum g[i], *s2 = sum g[i] (r[i] - m) */                                         \
    static inline void bn_dsums_##sfx(const T *restrict g, const T *restrict r, int64_t n, T m, T *s1, T *s2) { \
        bn_v##sfx a1 = {0}, a2 = {0}, gv, rv;                                               \
        int64_t i = 0;                                                                      \
        for (; i + BN_W_##sfx <= n; i += BN_W_##sfx) {                                      \
            memcpy(&gv, g + i, sizeof gv);                                                  \
            memcpy(&rv, r + i, sizeof rv);                                                  \
            a1 += gv;                                                                       \
            a2 += gv * (rv - m);                                                            \
        }                                                                                   \
        T a = bn_hsum_##sfx(&a1), b = bn_hsum_##sfx(&a2);                                   \
        for (; i < n; i++) {                                                                \
            a += g[i];                                                                      \
            b += g[i] * (r[i] - m);                                                         \
        }                                                                                   \
        *s1 = a;                                                                            \
        *s2 = b;                                                                            \
    }
BN_ROW_SUMS(float, f32)
BN_ROW_SUMS(double, f64)

/* bn_dsums over ReluGrad's dY: g[i] where y[i] > 0 or y[i] is NaN, else +0 (elementwise.c's
 * relu_grad_cpu), masked in the vector so that the sums are the unfused ones bit for bit. */
typedef int32_t bn_vi32 __attribute__((vector_size(64)));
typedef int64_t bn_vi64 __attribute__((vector_size(64)));
#define BN_RELU_SUMS(T, sfx, IT)                                                            \
    static inline void bn_dsums_relu_##sfx(const T *restrict g, const T *restrict y, const T *restrict r, \
                                           int64_t n, T m, T *s1, T *s2) {                  \
        bn_v##sfx a1 = {0}, a2 = {0}, gv, yv, rv;                                           \
        const bn_v##sfx zero = {0};                                                         \
        int64_t i = 0;                                                                      \
        for (; i + BN_W_##sfx <= n; i += BN_W_##sfx) {                                      \
            memcpy(&gv, g + i, sizeof gv);                                                  \
            memcpy(&yv, y + i, sizeof yv);                                                  \
            memcpy(&rv, r + i, sizeof rv);                                                  \
            gv = (bn_v##sfx)((IT)gv & ~(IT)(yv <= zero));                                   \
            a1 += gv;                                                                       \
            a2 += gv * (rv - m);                                                            \
        }                                                                                   \
        T a = bn_hsum_##sfx(&a1), b = bn_hsum_##sfx(&a2);                                   \
        for (; i < n; i++) {                                                                \
            const T gi = y[i] <= 0 ? (T)0 : g[i];                                           \
            a += gi;                                                                        \
            b += gi * (r[i] - m);                                                           \
        }                                                                                   \
        *s1 = a;                                                                            \
        *s2 = b;                                                                            \
    }
BN_RELU_SUMS(float, f32, bn_vi32)
BN_RELU_SUMS(double, f64, bn_vi64)

/* ---- BatchNormalization ----------------------------------------------------------------- */

typedef struct bn_args {
    const void *x, *scale, *bias, *in_mean, *in_var;
    void *y, *rmean, *rvar, *smean, *sinv;
    int64_t N, C, S;
    double eps, mom;
    int train;
    /* BatchNormRelu: y = v < relu_below ? 0 : v. -0 for fp32/fp64 (Relu's v < 0); on the fp32
     * twins of a half Y (ops/fold.c rounds y once), minus half the smallest half subnormal:
     * a v in [-that, 0) rounds to -0, which the unfused Relu (run on the rounded Y) keeps */
    double relu_below;
} bn_args;

/* Channels [lo, hi): statistics (training) then y = x * a + b, all passes over one
 * channel back to back so that its N * S values are still in cache for the next. */
#define BN_FWD_WORKER(name, TT, sfx, RELU)                                                  \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                      \
        typedef TT T;                                                                       \
        const bn_args *j = c_;                                                              \
        const int64_t N = j->N, C = j->C, S = j->S, cnt = N * S;                            \
        const T *xp = j->x, *scale = j->scale, *bias = j->bias;                             \
        const T *in_mean = j->in_mean, *in_var = j->in_var;                                 \
        T *yp = j->y, *rmean = j->rmean, *rvar = j->rvar, *smean = j->smean, *sinv = j->sinv; \
        for (int64_t c = lo; c < hi; c++) {                                                 \
            double mean, var;                                                               \
            if (j->train) {                                                                 \
                /* two passes: accurate variance for channels with a large mean */         \
                double sum = 0, ss = 0;                                                     \
                for (int64_t b = 0; b < N; b++) sum += bn_sum_##sfx(xp + (b * C + c) * S, S); \
                mean = cnt ? sum / (double)cnt : 0;                                         \
                for (int64_t b = 0; b < N; b++) ss += bn_sqdev_##sfx(xp + (b * C + c) * S, S, (T)mean); \
                var = cnt ? ss / (double)cnt : 0;                                           \
            } else {                                                                        \
                mean = in_mean[c];                                                          \
                var = in_var[c];                                                            \
            }                                                                               \
            const double inv = 1.0 / sqrt(var + j->eps);                                    \
            /* y = (x - m) a + bb: centred first, as eager does; x a - mean a would cancel  \
             * where |mean| >> std (m is mean in T, bb takes what rounding it left out) */  \
            const T m = (T)mean, a = (T)(inv * scale[c]);                                   \
            const T bb = (T)(bias[c] - (mean - (double)m) * inv * scale[c]);                \
            const T below = (T)j->relu_below;                                               \
            for (int64_t b = 0; b < N; b++) {                                               \
                const T *restrict r = xp + (b * C + c) * S;                                 \
                T *restrict y = yp + (b * C + c) * S;                                       \
                if (RELU)                                                                   \
                    for (int64_t i = 0; i < S; i++) {                                       \
                        const T v = (r[i] - m) * a + bb;                                    \
                        y[i] = v < below ? (T)0 : v;                                        \
                    }                                                                       \
                else                                                                        \
                    for (int64_t i = 0; i < S; i++) y[i] = (r[i] - m) * a + bb;             \
            }                                                                               \
            /* an empty batch leaves the running statistics as they were: eager's batch_norm \
             * returns before updating them */                                             \
            if (j->train && cnt) {                                                          \
                const double uvar = cnt > 1 ? var * (double)cnt / (double)(cnt - 1) : var; \
                if (rmean) rmean[c] = (T)(in_mean[c] * j->mom + mean * (1 - j->mom));       \
                if (rvar) rvar[c] = (T)(in_var[c] * j->mom + uvar * (1 - j->mom));          \
            } else {                                                                        \
                if (rmean) rmean[c] = in_mean[c];                                           \
                if (rvar) rvar[c] = in_var[c];                                              \
            }                                                                               \
            if (smean) smean[c] = (T)mean;                                                  \
            if (sinv) sinv[c] = (T)inv;                                                     \
        }                                                                                   \
    }
BN_FWD_WORKER(bn_fwd_f32, float, f32, 0)
BN_FWD_WORKER(bn_fwd_f64, double, f64, 0)
BN_FWD_WORKER(bn_relu_fwd_f32, float, f32, 1)
BN_FWD_WORKER(bn_relu_fwd_f64, double, f64, 1)

/* Channels per range: about OM_GRAIN elements, at least one channel. */
static int64_t bn_grain(int64_t per_channel) { return per_channel > 0 ? OM_GRAIN / per_channel + 1 : OM_GRAIN; }

/* The dtype node n's output 0 has in the graph: a half Y reaches the kernel as an fp32 twin. */
static om_dtype bn_graph_out_dtype(const om_kernel_ctx *ctx, om_dtype dflt) {
    const om_node *n = ctx->node;
    return ctx->g && n->n_out > 0 && n->out[0] >= 0 ? ctx->g->values[n->out[0]].dtype : dflt;
}

// x, y are (N, C, S); scale, bias, mean, var and the extra outputs are (C)
static om_status *bn_run(om_kernel_ctx *ctx, int relu) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    bn_args a = {.x = x->data, .scale = ctx->in[1].data, .bias = ctx->in[2].data, .in_mean = ctx->in[3].data,
                 .in_var = ctx->in[4].data, .y = ctx->out[0].data,
                 .rmean = ctx->n_out > 1 ? ctx->out[1].data : NULL, .rvar = ctx->n_out > 2 ? ctx->out[2].data : NULL,
                 .smean = ctx->n_out > 3 ? ctx->out[3].data : NULL, .sinv = ctx->n_out > 4 ? ctx->out[4].data : NULL,
                 .eps = om_attr_real(n, "epsilon", 1e-5), .mom = om_attr_real(n, "momentum", 0.9),
                 .train = om_attr_int(n, "training_mode", 0) != 0, .relu_below = -0.0};
    OM_TRY(bn_geometry(n, x, &a.N, &a.C, &a.S));
    if (relu && x->dtype == OM_F32) {
        const om_dtype ydt = bn_graph_out_dtype(ctx, OM_F32);
        if (ydt == OM_F16) a.relu_below = -0x1p-25;   /* fp16's smallest subnormal: 2^-24 */
        if (ydt == OM_BF16) a.relu_below = -0x1p-134;  /* bf16's: 2^-133 */
    }
    void (*fn)(void *, int64_t, int64_t);
    switch (x->dtype) {
    case OM_F32: fn = relu ? bn_relu_fwd_f32 : bn_fwd_f32; break;
    case OM_F64: fn = relu ? bn_relu_fwd_f64 : bn_fwd_f64; break;
    default: return om_err_dtype(n, 0, x->dtype);
    }
    om_pool_for(a.C, bn_grain(a.N * a.S), fn, &a);
    return NULL;
}

static om_status *bn_cpu(om_kernel_ctx *ctx) { return bn_run(ctx, 0); }
static om_status *bn_relu_cpu(om_kernel_ctx *ctx) { return bn_run(ctx, 1); }

/* BatchNormalization: BatchNormalizationGrad(dY, X, scale, mean, invstd|var); BatchNormRelu:
 * BatchNormReluGrad(dY, Y, X, ...), Y its own (Relu'd) output for the mask. */
static om_status *bn_grad_rule(om_grad_ctx *c, int relu) {
    const int node = c->node;
    const om_node *n = &c->g->nodes[node];
    const int dy = c->dy[0];
    if (dy < 0 || !(c->need_dx[0] || c->need_dx[1] || c->need_dx[2])) return NULL;
    const int x = n->in[0], scale = n->in[1], y = n->out[0];
    const int train = om_attr_int(n, "training_mode", 0) != 0;
    const float eps = om_attr_float(n, "epsilon", 1e-5f);
    int stat0 = n->in[3], stat1 = n->in[4];
    if (train) {
        const om_dtype dt = c->g->values[scale].dtype;   /* the statistics' dtype: the parameters' */
        stat0 = om_node_ensure_output(c->g, node, 3, dt);
        stat1 = om_node_ensure_output(c->g, node, 4, dt);
        if (stat0 < 0 || stat1 < 0)
            return om_grad_fail(c, om_error(OM_INTERNAL, "%s node '%s': cannot add the saved mean/invstd outputs",
                                            c->g->nodes[node].op->name, c->g->nodes[node].name));
    }
    int in[6], n_in = 0, out[3] = {-1, -1, -1};
    in[n_in++] = dy;
    if (relu) in[n_in++] = y;
    in[n_in++] = x;
    in[n_in++] = scale;
    in[n_in++] = stat0;
    in[n_in++] = stat1;
    if (om_emit_node(c, relu ? om_op_batch_norm_relu_grad_id : om_op_batch_norm_grad_id, in, n_in, out, 3, NULL) < 0)
        return NULL;
    om_emit_attr_int(c, "training_mode", train);
    om_emit_attr_float(c, "epsilon", eps);
    for (int i = 0; i < 3; i++)
        if (c->need_dx[i]) c->dx[i] = out[i];
    return NULL;
}
static om_status *bn_grad(om_grad_ctx *c) { return bn_grad_rule(c, 0); }
static om_status *bn_relu_grad(om_grad_ctx *c) { return bn_grad_rule(c, 1); }

/* Inputs (dY, [Y,] X, scale, mean, stat): o = 1 for BatchNormReluGrad's Y. */
static om_status *bn_grad_infer_at(om_kernel_ctx *ctx, int o) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *x = &ctx->in[1 + o];
    int64_t N = 0, C = 0, S = 0;
    OM_TRY(om_check_float(n, dy, 0, OM_UNDEFINED));
    if (x->dtype != dy->dtype || !om_shape_equal(dy, x))
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dY and X differ", n->op->name, om_node_name(n));
    if (o && (ctx->in[1].dtype != dy->dtype || !om_shape_equal(dy, &ctx->in[1])))
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dY and Y differ", n->op->name, om_node_name(n));
    OM_TRY(bn_geometry(n, x, &N, &C, &S));
    const om_dtype pdt = om_norm_param_dtype(x->dtype, &ctx->in[2 + o]);
    for (int i = 2 + o; i < 5 + o; i++) OM_TRY(bn_check_vec(n, &ctx->in[i], i, pdt, C));
    om_set_shape(&ctx->out[0], x, x->dtype);
    for (int j = 1; j < ctx->n_out; j++) om_set_shape(&ctx->out[j], &ctx->in[2 + o], pdt);
    return NULL;
}
static om_status *bn_grad_infer(om_kernel_ctx *ctx) { return bn_grad_infer_at(ctx, 0); }
static om_status *bn_relu_grad_infer(om_kernel_ctx *ctx) { return bn_grad_infer_at(ctx, 1); }
static om_dtype bn_relu_grad_dtype(const om_graph *g, const om_node *n, int j) {
    return g->values[n->in[j == 0 ? 0 : 3]].dtype;
}

typedef struct bn_grad_args {
    const void *dy, *y, *x, *scale, *mean, *stat;   /* y: BatchNormReluGrad's mask */
    void *dx, *dscale, *dbias;
    int64_t N, C, S;
    double eps;
    int train;
} bn_grad_args;

/* Channels [lo, hi): the two sums, then dx. RELU: dy masked by ReluGrad's rule as it is read. */
#define BN_GRAD_WORKER(name, TT, sfx, RELU)                                                 \
    OM_VEC_CLONES static void name(void *c_, int64_t lo, int64_t hi) {                      \
        typedef TT T;                                                                       \
        const bn_grad_args *j = c_;                                                         \
        const int64_t N = j->N, C = j->C, S = j->S, cnt = N * S;                            \
        const T *dyp = j->dy, *yp = j->y, *xp = j->x, *scale = j->scale, *meanp = j->mean, *statp = j->stat; \
        T *dxp = j->dx, *dsp = j->dscale, *dbp = j->dbias;                                  \
        for (int64_t c = lo; c < hi; c++) {                                                 \
            const T m = meanp[c];                                                           \
            const T inv = j->train ? statp[c] : (T)(1.0 / sqrt((double)statp[c] + j->eps)); \
            double sdy = 0, sdyx = 0;                                                       \
            for (int64_t b = 0; b < N; b++) {                                               \
                T s1, s2;                                                                   \
                const int64_t at = (b * C + c) * S;                                         \
                if (RELU) bn_dsums_relu_##sfx(dyp + at, yp + at, xp + at, S, m, &s1, &s2);  \
                else bn_dsums_##sfx(dyp + at, xp + at, S, m, &s1, &s2);                     \
                sdy += s1;                                                                  \
                sdyx += s2;                                                                 \
            }                                                                               \
            sdyx *= inv;                                                                    \
            if (dsp) dsp[c] = (T)sdyx;                                                      \
            if (dbp) dbp[c] = (T)sdy;                                                       \
            if (!dxp) continue;                                                             \
            const T k = scale[c] * inv;                                                     \
            const T a = j->train && cnt ? (T)(sdy / (double)cnt) : 0;                       \
            const T bq = j->train && cnt ? (T)(sdyx / (double)cnt) * inv : 0;   /* times (x - mean) = xhat/inv */ \
            for (int64_t b = 0; b < N; b++) {                                               \
                const int64_t at = (b * C + c) * S;                                         \
                const T *restrict g = dyp + at, *restrict r = xp + at;                      \
                T *restrict dx = dxp + at;                                                  \
                if (RELU) {                                                                 \
                    const T *restrict y = yp + at;                                          \
                    for (int64_t i = 0; i < S; i++) {                                       \
                        const T gi = y[i] <= 0 ? (T)0 : g[i];                               \
                        dx[i] = k * (gi - a - (r[i] - m) * bq);                             \
                    }                                                                       \
                } else {                                                                    \
                    for (int64_t i = 0; i < S; i++) dx[i] = k * (g[i] - a - (r[i] - m) * bq); \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    }
BN_GRAD_WORKER(bn_grad_f32, float, f32, 0)
BN_GRAD_WORKER(bn_grad_f64, double, f64, 0)
BN_GRAD_WORKER(bn_relu_grad_f32, float, f32, 1)
BN_GRAD_WORKER(bn_relu_grad_f64, double, f64, 1)

/* Per channel, xhat = (x - mean) * invstd, sums over (N, S):
 *   dB = sum(dy), dScale = sum(dy * xhat)
 *   training:  dx = scale * invstd * (dy - dB / cnt - xhat * dScale / cnt)
 *   inference: dx = scale * invstd * dy   (mean and var are constants)
 * BatchNormReluGrad: the same with dy = (y <= 0 ? 0 : dy).                              */
// dy, [y,] x, dx are (N, C, S); scale, mean, invstd (or var), dscale, dbias are (C)
static om_status *bn_grad_run(om_kernel_ctx *ctx, int relu) {
    const om_node *n = ctx->node;
    const int o = relu ? 1 : 0;
    const om_tensor *x = &ctx->in[1 + o];
    bn_grad_args a = {.dy = ctx->in[0].data, .y = relu ? ctx->in[1].data : NULL, .x = x->data,
                      .scale = ctx->in[2 + o].data, .mean = ctx->in[3 + o].data, .stat = ctx->in[4 + o].data,
                      .dx = ctx->out[0].data,
                      .dscale = ctx->n_out > 1 ? ctx->out[1].data : NULL,
                      .dbias = ctx->n_out > 2 ? ctx->out[2].data : NULL,
                      .eps = om_attr_real(n, "epsilon", 1e-5), .train = om_attr_int(n, "training_mode", 0) != 0};
    OM_TRY(bn_geometry(n, x, &a.N, &a.C, &a.S));
    void (*fn)(void *, int64_t, int64_t);
    switch (x->dtype) {
    case OM_F32: fn = relu ? bn_relu_grad_f32 : bn_grad_f32; break;
    case OM_F64: fn = relu ? bn_relu_grad_f64 : bn_grad_f64; break;
    default: return om_err_dtype(n, 0, x->dtype);
    }
    om_pool_for(a.C, bn_grain(a.N * a.S), fn, &a);
    return NULL;
}
static om_status *bn_grad_cpu(om_kernel_ctx *ctx) { return bn_grad_run(ctx, 0); }
static om_status *bn_relu_grad_cpu(om_kernel_ctx *ctx) { return bn_grad_run(ctx, 1); }

const om_op_def om_op_batch_norm = {
    .name = "BatchNormalization", .domain = "", .min_in = 5, .max_in = 5, .min_out = 1, .max_out = 5,
    .dtype = bn_dtype, .infer = bn_infer, .grad = bn_grad, .cpu = bn_cpu, .diff_inputs = 0x7,
    .attrs = "epsilon:float momentum:float training_mode:int",
};

const om_op_def om_op_batch_norm_grad = {
    .name = "BatchNormalizationGrad", .domain = "ortmod", .min_in = 5, .max_in = 5, .min_out = 1, .max_out = 3,
    .dtype = bn_grad_dtype, .infer = bn_grad_infer, .cpu = bn_grad_cpu,
    .attrs = "epsilon:float training_mode:int",
};

const om_op_def om_op_batch_norm_relu = {
    .name = "BatchNormRelu", .domain = "ortmod", .min_in = 5, .max_in = 5, .min_out = 1, .max_out = 5,
    .dtype = bn_dtype, .infer = bn_infer, .grad = bn_relu_grad, .cpu = bn_relu_cpu, .diff_inputs = 0x7,
    .attrs = "epsilon:float momentum:float training_mode:int",
};

const om_op_def om_op_batch_norm_relu_grad = {
    .name = "BatchNormReluGrad", .domain = "ortmod", .min_in = 6, .max_in = 6, .min_out = 1, .max_out = 3,
    .dtype = bn_relu_grad_dtype, .infer = bn_relu_grad_infer, .cpu = bn_relu_grad_cpu,
    .attrs = "epsilon:float training_mode:int",
};
