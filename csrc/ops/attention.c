/* attention.c — fused scaled-dot-product attention with a flash-style CPU kernel.
 *
 * Exports:
 *   om_op_fused_attention       FusedAttention      (domain ortmod)
 *       (Q, K, V, mask?, f0?, f1?, f2?, ratio?, training_mode?, causal_shape?) -> (O, lse?, seed?)
 *       O = dropout(softmax(scale * Q K^T + mask [+ causal])) V
 *   om_op_fused_attention_grad  FusedAttentionGrad  (domain ortmod)
 *       (dO, Q, K, V, O, lse, mask?, f0?, f1?, f2?, ratio?, training_mode?, seed?) -> (dQ?, dK?, dV?, dmask?)
 *
 *   Q (batch..., L, D), K (batch..., S, D) — or K^T (batch..., D, S) with k_transposed=1 —,
 *   V (batch..., S, Dv), mask additive, broadcast to (batch..., L, S). Batch dims broadcast
 *   (numpy rules) among Q, K and mask; V's must broadcast to theirs.
 *   Attributes: scale (float, default 1), inv (bit i: factor input f_i divides instead of
 *   multiplies), causal (int: key j > query i masked, top-left aligned as torch's is_causal),
 *   k_transposed (int), nan_to_zero (int: fully masked rows give 0, as the exporter's
 *   IsNaN/Where guard does). The factors f_i are scalars (scale computations the pass found
 *   on Q, K or the scores); the effective scale is scale * prod f_i^(+-1).
 *
 * Forward: per (batch, block of BQ queries) the keys are visited in blocks of BK: a BLAS
 * product gives a BQ x BK tile of scores, an online softmax (running max m, running sum l)
 * rescales the accumulator and a second product adds P V. Memory per task is
 * O(BQ * (BK + Dv)); the full L x S matrix never exists. Saved for backward: lse = m + log l
 * per row (and the dropout seed).
 * Backward (FlashAttention-2): per tile recompute P = exp(S - lse), then
 *   dV += Pd^T dO,  dPd = dO V^T,  dS = P * (dPd * keep * s - rowsum(dO * O)),
 *   dQ += scale dS K,  dK += scale dS^T Q,  dmask += dS (summed over broadcast dims).
 * Dropout draws keep(i) = om_rand_uniform(seed, i) >= ratio with i the flat index in the
 * (batch..., L, S) probabilities, as Dropout on the materialized tensor would.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "ops/attention_geom.h"
#include "ops/op_util.h"
#include "ops/broadcast.h"
#include "ops/gemm.h"
#include "ops/op.h"
#include "ops/vecmath.h"

/* float: the vectorizable exp_f32 (vecmath.h); double: libm */
#define ATTN_EXP(x) _Generic((x), float: exp_f32, default: exp)(x)

#define BQ 64
#define BK 128

/* ---- a row of a score tile ----------------------------------------------------------------
 * The softmax's work between the two products of a tile, one row at a time. float: 16 partial
 * maxima and sums (a serial chain does not vectorize; the lanes combine in a fixed order, so the
 * result does not depend on the thread split), exp_f32, and per-ISA clones (OM_VEC_CLONES):
 * AVX-512 or AVX2 where the CPU has them, without -march=native. double: plain loops, libm. */

/* s[c] += the mask row (mr, or its one value when m_col is 0) */
OM_VEC_CLONES static void row_add_mask_f32(float *restrict s, const float *restrict mr, int64_t m_col, int n) {
    if (m_col) for (int c = 0; c < n; c++) s[c] += mr[c];
    else for (int c = 0; c < n; c++) s[c] += mr[0];
}
static void row_add_mask_f64(double *restrict s, const double *restrict mr, int64_t m_col, int n) {
    if (m_col) for (int c = 0; c < n; c++) s[c] += mr[c];
    else for (int c = 0; c < n; c++) s[c] += mr[0];
}

/* the largest of s[0..n) (NaN ignored, as `s > m ? s : m` does), -inf when none is larger */
OM_VEC_CLONES static float row_max_f32(const float *restrict s, int n) {
    float ml[16], m = -INFINITY;
    int c0 = 0;
    for (int k = 0; k < 16; k++) ml[k] = -INFINITY;
    for (; c0 + 16 <= n; c0 += 16)
        for (int k = 0; k < 16; k++) ml[k] = s[c0 + k] > ml[k] ? s[c0 + k] : ml[k];
    for (int c = c0; c < n; c++) m = s[c] > m ? s[c] : m;
    for (int k = 0; k < 16; k++) m = ml[k] > m ? ml[k] : m;
    return m;
}
static double row_max_f64(const double *restrict s, int n) {
    double m = -INFINITY;
    for (int c = 0; c < n; c++) m = s[c] > m ? s[c] : m;
    return m;
}

/* s[c] = exp(s[c] - m); returns their sum */
OM_VEC_CLONES static float row_exp_sum_f32(float *restrict s, int n, float m) {
    float sl[16], sum = 0;
    int c0 = 0;
    for (int k = 0; k < 16; k++) sl[k] = 0;
    for (; c0 + 16 <= n; c0 += 16)
        for (int k = 0; k < 16; k++) {
            s[c0 + k] = exp_f32(s[c0 + k] - m);
            sl[k] += s[c0 + k];
        }
    for (int c = c0; c < n; c++) {
        s[c] = exp_f32(s[c] - m);
        sum += s[c];
    }
    for (int k = 0; k < 16; k++) sum += sl[k];
    return sum;
}
static double row_exp_sum_f64(double *restrict s, int n, double m) {
    double sum = 0;
    for (int c = 0; c < n; c++) {
        s[c] = exp(s[c] - m);
        sum += s[c];
    }
    return sum;
}

/* s[c] = exp(s[c] - m) */
OM_VEC_CLONES static void row_exp_f32(float *restrict s, int n, float m) {
    for (int c = 0; c < n; c++) s[c] = exp_f32(s[c] - m);
}
static void row_exp_f64(double *restrict s, int n, double m) {
    for (int c = 0; c < n; c++) s[c] = exp(s[c] - m);
}

/* ds[c] = p[c] (ds[c] - d): the softmax's backward without dropout */
OM_VEC_CLONES static void row_softmax_grad_f32(float *restrict ds, const float *restrict p, int n, float d) {
    for (int c = 0; c < n; c++) ds[c] = p[c] * (ds[c] - d);
}
static void row_softmax_grad_f64(double *restrict ds, const double *restrict p, int n, double d) {
    for (int c = 0; c < n; c++) ds[c] = p[c] * (ds[c] - d);
}

#define ROW_ADD_MASK(s, ...) _Generic((s), float *: row_add_mask_f32, default: row_add_mask_f64)(s, __VA_ARGS__)
#define ROW_MAX(s, n) _Generic((s), float *: row_max_f32, default: row_max_f64)(s, n)
#define ROW_EXP_SUM(s, n, m) _Generic((s), float *: row_exp_sum_f32, default: row_exp_sum_f64)(s, n, m)
#define ROW_EXP(s, n, m) _Generic((s), float *: row_exp_f32, default: row_exp_f64)(s, n, m)
#define ROW_SOFTMAX_GRAD(ds, ...) \
    _Generic((ds), float *: row_softmax_grad_f32, default: row_softmax_grad_f64)(ds, __VA_ARGS__)

static int wanted(const om_kernel_ctx *ctx, int j) { return j < ctx->n_out && ctx->out[j].data != NULL; }

/* the geometry and its shape checks: ops/attention_geom.h (shared with cuda/attention.cu) */
typedef om_attn_geom attn_geom;

static om_status *scalar_factor(const om_kernel_ctx *ctx, int i, double *v) {
    const om_tensor *t = &ctx->in[i];
    if (om_tensor_numel(t) != 1) return om_attn_err(ctx->node, "a scale factor must be a scalar, got", t);
    if (!om_dtype_in(t->dtype, OM_DT_ARITH)) return om_err_dtype(ctx->node, i, t->dtype);
    if (!t->data) { *v = 1.0; return NULL; }   /* shape-only pass: the value is read at run time */
    om_scalar_get(t, v);
    return NULL;
}

/* Geometry from Q, K, V, mask at input slots q..; factors at f; dropout at r, t. */
static om_status *attn_geometry(const om_kernel_ctx *ctx, int q, int mi, int f, int r, int tm, attn_geom *g) {
    const om_node *n = ctx->node;
    const om_tensor *Q = &ctx->in[q];
    for (int i = 0; i < 3; i++) OM_TRY(om_check_float(n, &ctx->in[q + i], q + i, i ? Q->dtype : OM_UNDEFINED));
    const om_tensor *M = mi >= 0 && om_in_present(ctx, mi) ? &ctx->in[mi] : NULL;
    if (M && M->dtype != Q->dtype) return om_err_dtype(n, mi, M->dtype);
    OM_TRY(om_attn_shapes(n, Q, &ctx->in[q + 1], &ctx->in[q + 2], M, g));
    const int inv = om_attn_scale(n, g);
    for (int i = 0; i < 3; i++) {
        if (!om_in_present(ctx, f + i)) continue;
        double v;
        OM_TRY(scalar_factor(ctx, f + i, &v));
        om_attn_factor(g, inv, i, v);
    }
    if (om_in_present(ctx, tm)) {
        const om_tensor *t = &ctx->in[tm];
        if (t->dtype != OM_BOOL || om_tensor_numel(t) != 1) return om_attn_err(n, "training_mode must be a bool scalar", t);
        int training = t->data ? *(const uint8_t *)t->data != 0 : 1;
        double ratio = 0.5;
        if (om_in_present(ctx, r)) OM_TRY(scalar_factor(ctx, r, &ratio));
        OM_TRY(om_attn_dropout(n, g, training, ratio));
    }
    return NULL;
}

static void batch_offsets(const attn_geom *g, int64_t t, int64_t *q, int64_t *k, int64_t *v, int64_t *m) {
    *q = *k = *v = *m = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        int64_t i = t % g->batch[d];
        t /= g->batch[d];
        *q += i * g->q_str[d];
        *k += i * g->k_str[d];
        *v += i * g->v_str[d];
        *m += i * g->m_str[d];
    }
}

static void gemm(om_dtype dt, int ta, int tb, int M, int N, int K, double alpha, const void *A, int lda,
                 const void *B, int ldb, double beta, void *C, int ldc) {
    if (K <= 0) return;   /* callers never ask for an empty inner dimension */
    om_gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- shape rules ------------------------------------------------------------------ */

/* lse is kept in the statistics dtype: fp32 for fp16/bf16 attention (exp(s - lse) in the
 * backward needs more than half precision of lse). */
static om_dtype attn_dtype(const om_graph *g, const om_node *n, int j) {
    om_dtype q = g->values[n->in[0]].dtype;
    return j == 2 ? OM_I64 : j == 1 ? om_dtype_stat(q) : q;
}

static om_status *check_causal_shape(const om_kernel_ctx *ctx, int i, const attn_geom *g) {
    if (!om_in_present(ctx, i)) return NULL;
    int64_t d[OM_MAX_RANK];
    int r = om_read_ints(&ctx->in[i], d, OM_MAX_RANK);
    if (r != 2 || d[0] != g->L || d[1] != g->S)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': the causal mask the pattern built is not (L, S) = "
                        "(%lld, %lld); this attention pattern cannot be fused (disable the 'attention' pass)",
                        ctx->node->op->name, ctx->node->name, (long long)g->L, (long long)g->S);
    return NULL;
}

static om_status *attn_infer(om_kernel_ctx *ctx) {
    attn_geom g;
    OM_TRY(attn_geometry(ctx, 0, 3, 4, 7, 8, &g));
    OM_TRY(check_causal_shape(ctx, 9, &g));
    om_tensor *o = &ctx->out[0];
    o->dtype = ctx->in[0].dtype;
    o->rank = g.nb + 2;
    memcpy(o->dims, g.batch, sizeof(int64_t) * (size_t)g.nb);
    o->dims[g.nb] = g.L;
    o->dims[g.nb + 1] = g.Dv;
    if (ctx->n_out > 1) {
        ctx->out[1] = *o;
        ctx->out[1].rank = g.nb + 1;
        ctx->out[1].dtype = om_dtype_stat(o->dtype);
    }
    if (ctx->n_out > 2) {
        memset(&ctx->out[2], 0, sizeof ctx->out[2]);
        ctx->out[2].dtype = OM_I64;
        ctx->out[2].rank = 0;
    }
    return NULL;
}

/* ---- forward ---------------------------------------------------------------------- */

/* Work shared out over the pool: the forward by (batch index, query tile), each writing its
 * own rows of O and lse; the backward by batch index, when no two batch indices share a
 * gradient buffer (broadcast K, V or mask would), else on one thread. */
typedef struct attn_job {
    om_kernel_ctx *ctx;
    const attn_geom *g;
    om_dtype dt;
    uint64_t seed;
    int64_t tiles;          /* query tiles per batch index */
    atomic_int failed;      /* a range found no memory for its scratch */
} attn_job;

#define ATTN_FWD(T)                                                                                          \
    static void attn_fwd_range_##T(void *job, int64_t lo, int64_t hi) {                                      \
        attn_job *j = job;                                                                                   \
        om_kernel_ctx *ctx = j->ctx;                                                                         \
        const attn_geom *g = j->g;                                                                           \
        const om_dtype dt = j->dt;                                                                           \
        const uint64_t seed = j->seed;                                                                       \
        const T *Q = ctx->in[0].data, *K = ctx->in[1].data, *V = ctx->in[2].data;                               \
        const T *M = g->has_mask ? (const T *)ctx->in[3].data : NULL;                                           \
        T *O = ctx->out[0].data;                                                                                \
        T *LSE = wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL;                                                 \
        const int64_t L = g->L, S = g->S, D = g->D, Dv = g->Dv;                                                 \
        const T scale = (T)g->scale, dscale = g->ratio < 1.0 ? (T)(1.0 / (1.0 - g->ratio)) : (T)0;             \
        const float ratio = (float)g->ratio;                                                                    \
        T *buf = malloc(sizeof(T) * (size_t)(BQ * BK + BQ * Dv + 2 * BQ + 1));                                  \
        if (!buf) { atomic_store(&j->failed, 1); return; }                                                   \
        T *Sb = buf, *acc = Sb + BQ * BK, *mrow = acc + BQ * Dv, *lrow = mrow + BQ;                             \
        for (int64_t u = lo; u < hi; u++) {                                                                  \
            const int64_t t = u / j->tiles;                                                                  \
            int64_t qo, ko, vo, mo;                                                                          \
            batch_offsets(g, t, &qo, &ko, &vo, &mo);                                                         \
            {                                                                                                \
                const int64_t i0 = (u % j->tiles) * BQ;                                                      \
                const int bq = (int)(L - i0 < BQ ? L - i0 : BQ);                                                \
                for (int r = 0; r < bq; r++) { mrow[r] = -INFINITY; lrow[r] = 0; }                              \
                memset(acc, 0, sizeof(T) * (size_t)(bq * Dv));                                                  \
                const int64_t j_end = g->causal ? (i0 + bq < S ? i0 + bq : S) : S;                              \
                for (int64_t j0 = 0; j0 < j_end; j0 += BK) {                                                    \
                    const int bk = (int)(j_end - j0 < BK ? j_end - j0 : BK);                                    \
                    /* S tile = scale * Q_blk K_blk^T */                                                        \
                    if (g->kt)                                                                                  \
                        gemm(dt, 0, 0, bq, bk, (int)D, g->scale, Q + qo + i0 * D, (int)D, K + ko + j0, (int)S, 0.0, \
                             Sb, bk);                                                                           \
                    else                                                                                        \
                        gemm(dt, 0, 1, bq, bk, (int)D, g->scale, Q + qo + i0 * D, (int)D, K + ko + j0 * D, (int)D, \
                             0.0, Sb, bk);                                                                      \
                    if (D == 0) memset(Sb, 0, sizeof(T) * (size_t)(bq * bk));                                   \
                    for (int r = 0; r < bq; r++) {                                                              \
                        T *restrict s = Sb + r * bk;                                                            \
                        const int64_t i = i0 + r;                                                               \
                        if (M) ROW_ADD_MASK(s, M + mo + i * g->m_row + j0 * g->m_col, g->m_col, bk);            \
                        /* causal: keys past the query's own are -inf, whose exp is 0 */                        \
                        const int live = g->causal ? (int)(i - j0 + 1 < 0 ? 0 : i - j0 + 1 < bk ? i - j0 + 1 : bk) : bk; \
                        for (int c = live; c < bk; c++) s[c] = 0;                                               \
                        const T mx = ROW_MAX(s, live);                                                          \
                        const T m_new = mx > mrow[r] ? mx : mrow[r];                                            \
                        if (m_new == -INFINITY) { for (int c = 0; c < live; c++) s[c] = 0; continue; }         \
                        const T corr = ATTN_EXP(mrow[r] - m_new);                                                    \
                        const T sum = ROW_EXP_SUM(s, live, m_new);                                              \
                        lrow[r] = lrow[r] * corr + sum;                                                         \
                        mrow[r] = m_new;                                                                        \
                        if (corr != (T)1) { T *restrict a = acc + r * Dv; for (int64_t d = 0; d < Dv; d++) a[d] *= corr; } \
                        if (g->dropout) {                                                                       \
                            const uint64_t base = (uint64_t)((t * L + i) * S + j0);                             \
                            for (int c = 0; c < bk; c++)                                                        \
                                s[c] = om_rand_uniform(seed, base + (uint64_t)c) >= ratio ? s[c] * dscale : (T)0; \
                        }                                                                                       \
                    }                                                                                           \
                    /* acc += P_tile V_blk */                                                                   \
                    gemm(dt, 0, 0, bq, (int)Dv, bk, 1.0, Sb, bk, V + vo + j0 * Dv, (int)Dv, 1.0, acc, (int)Dv);  \
                }                                                                                               \
                for (int r = 0; r < bq; r++) {                                                                  \
                    const int64_t i = i0 + r;                                                                   \
                    T *restrict o = O + (t * L + i) * Dv;                                                       \
                    const T *restrict a = acc + r * Dv;                                                         \
                    const int dead = !(lrow[r] > 0);                                                            \
                    if (dead && g->nan_to_zero) {                                                               \
                        for (int64_t d = 0; d < Dv; d++) o[d] = 0;                                              \
                        if (LSE) LSE[t * L + i] = INFINITY; /* backward: P = exp(s - inf) = 0 */               \
                        continue;                                                                               \
                    }                                                                                           \
                    const T inv = (T)1 / lrow[r];                                                               \
                    for (int64_t d = 0; d < Dv; d++) o[d] = a[d] * inv;                                         \
                    if (LSE) LSE[t * L + i] = mrow[r] + log(lrow[r]);                                           \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        (void)scale;                                                                                         \
        free(buf);                                                                                           \
    }                                                                                                        \
    static om_status *attn_fwd_##T(om_kernel_ctx *ctx, const attn_geom *g, om_dtype dt, uint64_t seed) {     \
        attn_job j = {.ctx = ctx, .g = g, .dt = dt, .seed = seed, .tiles = (g->L + BQ - 1) / BQ};            \
        om_pool_for(g->nbatch * j.tiles, 1, attn_fwd_range_##T, &j);                                         \
        if (atomic_load(&j.failed)) return om_error(OM_OUT_OF_MEMORY, "out of memory in attention");         \
        return NULL;                                                                                         \
    }

ATTN_FWD(float)
ATTN_FWD(double)

// Q (batch..., L, D), K (batch..., S, D), V (batch..., S, Dv), mask -> (L, S); O (batch..., L, Dv), lse (batch..., L)
static om_status *attn_cpu(om_kernel_ctx *ctx) {
    attn_geom g;
    OM_TRY(attn_geometry(ctx, 0, 3, 4, 7, 8, &g));
    uint64_t seed = ctx->seed;
    if (wanted(ctx, 2)) *(int64_t *)ctx->out[2].data = (int64_t)seed;
    if (ctx->in[0].dtype == OM_F32) return attn_fwd_float(ctx, &g, OM_F32, seed);
    if (ctx->in[0].dtype == OM_F64) return attn_fwd_double(ctx, &g, OM_F64, seed);
    return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
}

/* ---- backward --------------------------------------------------------------------- */

static om_status *attn_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    int in_f[10];
    for (int i = 0; i < 10; i++) in_f[i] = i < f->n_in ? f->in[i] : -1;
    int o = f->out[0];
    om_dtype dt = c->g->values[o].dtype;
    int lse = om_node_ensure_output(c->g, c->node, 1, om_dtype_stat(dt));
    int seed = in_f[8] >= 0 ? om_node_ensure_output(c->g, c->node, 2, OM_I64) : -1;
    if (lse < 0 || (in_f[8] >= 0 && seed < 0))
        return om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"));
    int in[13] = {dy, in_f[0], in_f[1], in_f[2], o, lse, in_f[3], in_f[4], in_f[5], in_f[6], in_f[7], in_f[8], seed};
    int out[4], want[4] = {c->need_dx[0], c->need_dx[1], c->need_dx[2], in_f[3] >= 0 && c->need_dx[3]};
    int id = -1;
    if (om_emit_node(c, om_op_fused_attention_grad_id, in, 13, out, 4, &id) < 0) return NULL;
    om_node *n = &c->g->nodes[id];
    for (int j = 0; j < 4; j++)
        if (!want[j]) {
            c->g->values[n->out[j]].producer = -1;
            n->out[j] = -1;
            out[j] = -1;
        }
    f = &c->g->nodes[c->node];
    static const char *ints[] = {"causal", "k_transposed", "inv", "nan_to_zero"};
    for (int i = 0; i < 4; i++) {
        const om_attr *a = om_attr_find(f, ints[i]);
        if (a) om_emit_attr_int(c, ints[i], a->i);
    }
    om_emit_attr_float(c, "scale", om_attr_float(f, "scale", 1.0f));
    for (int i = 0; i < 4; i++) c->dx[i] = out[i];
    return NULL;
}

static om_status *attn_grad_infer(om_kernel_ctx *ctx) {
    attn_geom g;
    OM_TRY(attn_geometry(ctx, 1, 6, 7, 10, 11, &g));
    const om_dtype dt = ctx->in[1].dtype;
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, dt));
    OM_TRY(om_check_float(ctx->node, &ctx->in[4], 4, dt));
    OM_TRY(om_check_float(ctx->node, &ctx->in[5], 5, om_dtype_stat(dt)));
    for (int j = 0; j < 4 && j < ctx->n_out; j++) {
        int src = j < 3 ? 1 + j : 6;
        if (!om_in_present(ctx, src)) continue;
        om_set_shape(&ctx->out[j], &ctx->in[src], ctx->in[src].dtype);
    }
    return NULL;
}

/* 1 when every batch index has its own dK, dV and dMask rows (no broadcast batch dim of a
 * wanted gradient), so batch indices can run on different threads. */
static int bwd_batches_independent(const om_kernel_ctx *ctx, const attn_geom *g) {
    for (int d = 0; d < g->nb; d++) {
        if (g->batch[d] == 1) continue;
        if ((wanted(ctx, 1) && !g->k_str[d]) || (wanted(ctx, 2) && !g->v_str[d]) ||
            (g->has_mask && wanted(ctx, 3) && !g->m_str[d]))
            return 0;
    }
    return 1;
}

#define ATTN_BWD(T)                                                                                          \
    static void attn_bwd_range_##T(void *job, int64_t lo, int64_t hi) {                                      \
        attn_job *j = job;                                                                                   \
        om_kernel_ctx *ctx = j->ctx;                                                                         \
        const attn_geom *g = j->g;                                                                           \
        const om_dtype dt = j->dt;                                                                           \
        const uint64_t seed = j->seed;                                                                       \
        const T *dO = ctx->in[0].data, *Q = ctx->in[1].data, *K = ctx->in[2].data, *V = ctx->in[3].data;        \
        const T *O = ctx->in[4].data, *LSE = ctx->in[5].data;                                                   \
        const T *M = g->has_mask ? (const T *)ctx->in[6].data : NULL;                                           \
        T *dQ = wanted(ctx, 0) ? (T *)ctx->out[0].data : NULL;                                                  \
        T *dK = wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL;                                                  \
        T *dV = wanted(ctx, 2) ? (T *)ctx->out[2].data : NULL;                                                  \
        T *dM = M && wanted(ctx, 3) ? (T *)ctx->out[3].data : NULL;                                             \
        const int64_t L = g->L, S = g->S, D = g->D, Dv = g->Dv;                                                 \
        const T dscale = g->ratio < 1.0 ? (T)(1.0 / (1.0 - g->ratio)) : (T)0;                                   \
        const float ratio = (float)g->ratio;                                                                    \
        T *buf = malloc(sizeof(T) * (size_t)(3 * BQ * BK + BQ + 1));                                           \
        if (!buf) { atomic_store(&j->failed, 1); return; }                                                   \
        T *P = buf, *Pd = P + BQ * BK, *dS = Pd + BQ * BK, *Drow = dS + BQ * BK;                                \
        for (int64_t t = lo; t < hi; t++) {                                                                  \
            int64_t qo, ko, vo, mo;                                                                             \
            batch_offsets(g, t, &qo, &ko, &vo, &mo);                                                            \
            for (int64_t i0 = 0; i0 < L; i0 += BQ) {                                                            \
                const int bq = (int)(L - i0 < BQ ? L - i0 : BQ);                                                \
                for (int r = 0; r < bq; r++) {                                                                  \
                    const T *restrict a = dO + (t * L + i0 + r) * Dv, *restrict b = O + (t * L + i0 + r) * Dv; \
                    T s = 0;                                                                                    \
                    for (int64_t d = 0; d < Dv; d++) s += a[d] * b[d];                                          \
                    Drow[r] = s;                                                                                \
                }                                                                                               \
                const int64_t j_end = g->causal ? (i0 + bq < S ? i0 + bq : S) : S;                              \
                for (int64_t j0 = 0; j0 < j_end; j0 += BK) {                                                    \
                    const int bk = (int)(j_end - j0 < BK ? j_end - j0 : BK);                                    \
                    if (g->kt)                                                                                  \
                        gemm(dt, 0, 0, bq, bk, (int)D, g->scale, Q + qo + i0 * D, (int)D, K + ko + j0, (int)S, 0.0, P, bk); \
                    else                                                                                        \
                        gemm(dt, 0, 1, bq, bk, (int)D, g->scale, Q + qo + i0 * D, (int)D, K + ko + j0 * D, (int)D, 0.0, P, bk); \
                    if (D == 0) memset(P, 0, sizeof(T) * (size_t)(bq * bk));                                    \
                    for (int r = 0; r < bq; r++) {                                                              \
                        T *restrict p = P + r * bk;                                                             \
                        T *restrict pd = Pd + r * bk;                                                           \
                        const int64_t i = i0 + r;                                                               \
                        const T lse = LSE[t * L + i];                                                           \
                        if (M) ROW_ADD_MASK(p, M + mo + i * g->m_row + j0 * g->m_col, g->m_col, bk);            \
                        const int live = g->causal ? (int)(i - j0 + 1 < 0 ? 0 : i - j0 + 1 < bk ? i - j0 + 1 : bk) : bk; \
                        ROW_EXP(p, live, lse);                                                                  \
                        for (int c = live; c < bk; c++) p[c] = 0;                                               \
                        if (g->dropout) {                                                                       \
                            const uint64_t base = (uint64_t)((t * L + i) * S + j0);                             \
                            for (int c = 0; c < bk; c++)                                                        \
                                pd[c] = om_rand_uniform(seed, base + (uint64_t)c) >= ratio ? dscale : (T)0;     \
                        }                                                                                       \
                    }                                                                                           \
                    /* Pd = P * keep * s (Pd holds keep * s so far) */                                          \
                    if (g->dropout) for (int k = 0; k < bq * bk; k++) Pd[k] *= P[k];                            \
                    const T *Pu = g->dropout ? Pd : P;                                                          \
                    const T *dOb = dO + (t * L + i0) * Dv;                                                      \
                    if (dV) gemm(dt, 1, 0, bk, (int)Dv, bq, 1.0, Pu, bk, dOb, (int)Dv, 1.0, dV + vo + j0 * Dv, (int)Dv); \
                    if (!dQ && !dK && !dM) continue;                                                            \
                    /* dS = dO V^T, then through the dropout and the softmax */                                 \
                    gemm(dt, 0, 1, bq, bk, (int)Dv, 1.0, dOb, (int)Dv, V + vo + j0 * Dv, (int)Dv, 0.0, dS, bk);  \
                    if (Dv == 0) memset(dS, 0, sizeof(T) * (size_t)(bq * bk));                                  \
                    for (int r = 0; r < bq; r++) {                                                              \
                        T *restrict ds = dS + r * bk;                                                           \
                        const T *restrict p = P + r * bk;                                                       \
                        const T dr = Drow[r];                                                                   \
                        if (g->dropout) {                                                                       \
                            const T *restrict pd = Pd + r * bk;                                                 \
                            /* keep * s = Pd / P where P != 0; recompute from the stream instead */             \
                            const uint64_t base = (uint64_t)((t * L + i0 + r) * S + j0);                        \
                            for (int c = 0; c < bk; c++) {                                                      \
                                const T k = om_rand_uniform(seed, base + (uint64_t)c) >= ratio ? dscale : (T)0; \
                                ds[c] = p[c] * (ds[c] * k - dr);                                                \
                            }                                                                                   \
                            (void)pd;                                                                           \
                        } else {                                                                                \
                            ROW_SOFTMAX_GRAD(ds, p, bk, dr);                                                    \
                        }                                                                                       \
                        if (dM) {                                                                               \
                            T *restrict mr = dM + mo + (i0 + r) * g->m_row + j0 * g->m_col;                     \
                            if (g->m_col) for (int c = 0; c < bk; c++) mr[c] += ds[c];                          \
                            else for (int c = 0; c < bk; c++) mr[0] += ds[c];                                   \
                        }                                                                                       \
                    }                                                                                           \
                    if (dQ) {                                                                                   \
                        if (g->kt) gemm(dt, 0, 1, bq, (int)D, bk, g->scale, dS, bk, K + ko + j0, (int)S, 1.0, dQ + qo + i0 * D, (int)D); \
                        else gemm(dt, 0, 0, bq, (int)D, bk, g->scale, dS, bk, K + ko + j0 * D, (int)D, 1.0, dQ + qo + i0 * D, (int)D); \
                    }                                                                                           \
                    if (dK) {                                                                                   \
                        if (g->kt) gemm(dt, 1, 0, (int)D, bk, bq, g->scale, Q + qo + i0 * D, (int)D, dS, bk, 1.0, dK + ko + j0, (int)S); \
                        else gemm(dt, 1, 0, bk, (int)D, bq, g->scale, dS, bk, Q + qo + i0 * D, (int)D, 1.0, dK + ko + j0 * D, (int)D); \
                    }                                                                                           \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
        free(buf);                                                                                           \
    }                                                                                                        \
    static om_status *attn_bwd_##T(om_kernel_ctx *ctx, const attn_geom *g, om_dtype dt, uint64_t seed) {     \
        /* outputs accumulate over tiles and over broadcast batch dims: zero them first */                   \
        for (int k = 0; k < 4; k++)                                                                          \
            if (wanted(ctx, k)) memset(ctx->out[k].data, 0, om_tensor_nbytes(&ctx->out[k]));                 \
        attn_job j = {.ctx = ctx, .g = g, .dt = dt, .seed = seed, .tiles = (g->L + BQ - 1) / BQ};            \
        if (bwd_batches_independent(ctx, g)) om_pool_for(g->nbatch, 1, attn_bwd_range_##T, &j);              \
        else attn_bwd_range_##T(&j, 0, g->nbatch);                                                           \
        if (atomic_load(&j.failed)) return om_error(OM_OUT_OF_MEMORY, "out of memory in attention backward"); \
        return NULL;                                                                                         \
    }

ATTN_BWD(float)
ATTN_BWD(double)

static om_status *attn_grad_cpu(om_kernel_ctx *ctx) {
    attn_geom g;
    OM_TRY(attn_geometry(ctx, 1, 6, 7, 10, 11, &g));
    uint64_t seed = 0;
    if (g.dropout) {
        if (!om_in_present(ctx, 12) || ctx->in[12].dtype != OM_I64)
            return om_error(OM_INTERNAL, "FusedAttentionGrad node '%s': the dropout seed is missing", ctx->node->name);
        seed = (uint64_t)*(const int64_t *)ctx->in[12].data;
    }
    if (ctx->in[1].dtype == OM_F32) return attn_bwd_float(ctx, &g, OM_F32, seed);
    if (ctx->in[1].dtype == OM_F64) return attn_bwd_double(ctx, &g, OM_F64, seed);
    return om_err_dtype(ctx->node, 1, ctx->in[1].dtype);
}

const om_op_def om_op_fused_attention = {
    .name = "FusedAttention", .domain = "ortmod", .min_in = 3, .max_in = 10, .min_out = 1, .max_out = 3,
    .flags = OM_OP_RANDOM, .dtype = attn_dtype, .infer = attn_infer, .grad = attn_grad, .cpu = attn_cpu,
    .diff_inputs = 0xF,
    .attrs = "causal:int inv:int k_transposed:int nan_to_zero:int scale:float",
};
const om_op_def om_op_fused_attention_grad = {
    .name = "FusedAttentionGrad", .domain = "ortmod", .min_in = 6, .max_in = 13, .min_out = 1, .max_out = 4,
    .infer = attn_grad_infer, .cpu = attn_grad_cpu,
    .attrs = "causal:int inv:int k_transposed:int nan_to_zero:int scale:float",
};
