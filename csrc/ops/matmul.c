/* matmul.c — matrix products: MatMul, Gemm, FusedMatMul and the backward-only MatMulGrad.
 *
 * Exports:
 *   om_op_matmul          MatMul                         numpy semantics (1-D operands, batch broadcast)
 *   om_op_gemm            Gemm                           alpha * op(A) op(B) + beta * C
 *   om_op_fused_matmul    FusedMatMul   (domain ortmod)  alpha * op(A) op(B), batched, op = optional transpose
 *   om_op_matmul_grad     MatMulGrad    (domain ortmod)  dA or dB of MatMul/FusedMatMul, batch dims reduced
 *
 * Every product goes to BLAS (cblas_sgemm / cblas_dgemm); a batched product is a loop of
 * GEMMs over the broadcast batch, or a single GEMM when the batch folds into a matrix dim
 * (x(B,T,K) @ w(K,N): one (B*T,K)x(K,N) GEMM; and for its weight gradient one
 * (K,B*T)x(B*T,N) GEMM that does the batch reduction inside BLAS).
 *
 * Why MatMulGrad instead of FusedMatMul + SumToShape: value ranks are unknown when the
 * gradient rule runs, so a rule cannot tell whether an operand was 1-D (numpy promotes it
 * and then drops the dim) nor where the broadcast batch dims are. MatMulGrad receives the
 * differentiated operand's shape (Shape(x): folded at plan time, x itself is not kept) and
 * the other operand, works out the geometry at plan time and accumulates broadcast batch
 * slices with beta = 1, so no batch-sized intermediate is ever materialized.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/threadpool.h"
#include "ops/gemm.h"
#include "ops/op.h"
#include "ops/matmul_geom.h"

/* ---- geometry --------------------------------------------------------------------- */

typedef om_mm_geom mm_geom;   /* ops/matmul_geom.h */

static void dims_str(int rank, const int64_t *d, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "(");
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)d[i]);
    if (k < n) snprintf(buf + k, n - k, ")");
}

/* Geometry of alpha * op(A) op(B) with numpy matmul rules for A (ra dims a) and B. */
static om_status *mm_geometry(const om_node *n, int ra, const int64_t *a, int rb, const int64_t *b,
                              int ta, int tb, mm_geom *g) {
    char sa[160], sb[160];
    int rc = om_mm_geometry(ra, a, rb, b, ta, tb, g);
    if (rc != OM_MM_OK) {
        dims_str(ra, a, sa, sizeof sa);
        dims_str(rb, b, sb, sizeof sb);
        if (rc == OM_MM_BAD_RANK)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': operands must have rank >= 1, got %s and %s",
                            n->op->name, n->name ? n->name : "", sa, sb);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': shapes %s%s and %s%s do not multiply",
                        n->op->name, n->name ? n->name : "", sa, ta ? "^T" : "", sb, tb ? "^T" : "");
    }
    if (g->M > INT32_MAX || g->N > INT32_MAX || g->K > INT32_MAX)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': matrix dims exceed the BLAS int range",
                        n->op->name, n->name ? n->name : "");
    return NULL;
}

/* ---- batched GEMM over a broadcast batch ------------------------------------------ */

typedef struct bgemm {
    int Mo, No, Ko;
    int tp, tq;
    const void *P, *Q;
    void *O;
    const int64_t *p_str, *q_str, *o_str;   /* per batch dim, elements */
} bgemm;

static void gemm1(om_dtype dt, int tp, int tq, int M, int N, int K, double alpha, const void *P,
                  const void *Q, double beta, void *O) {
    om_gemm(dt, tp, tq, M, N, K, alpha, P, tp ? M : K, Q, tq ? K : N, beta, O, N);
}


/* Element offsets of batch index t (row-major over g->batch) in P, Q and O. */
static void batch_offsets(const mm_geom *g, const bgemm *m, int64_t t, int64_t *po, int64_t *qo, int64_t *oo) {
    *po = *qo = *oo = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        const int64_t i = t % g->batch[d];
        t /= g->batch[d];
        *po += i * m->p_str[d];
        *qo += i * m->q_str[d];
        *oo += i * m->o_str[d];
    }
}

typedef struct bgemm_batch {
    om_dtype dt;
    const mm_geom *g;
    const bgemm *m;
    double alpha;
    size_t es;
} bgemm_batch;

static void bgemm_batch_range(void *ctx, int64_t lo, int64_t hi) {
    const bgemm_batch *j = ctx;
    const bgemm *m = j->m;
    for (int64_t t = lo; t < hi; t++) {
        int64_t po, qo, oo;
        batch_offsets(j->g, m, t, &po, &qo, &oo);
        gemm1(j->dt, m->tp, m->tq, m->Mo, m->No, m->Ko, j->alpha, (const char *)m->P + po * j->es,
              (const char *)m->Q + qo * j->es, 0.0, (char *)m->O + oo * j->es);
    }
}

/* O[o] (+)= alpha * op(P[p]) op(Q[q]) for every batch index; O reduced where o_str is 0. */
static void bgemm_run(om_dtype dt, const mm_geom *g, const bgemm *m, double alpha) {
    const size_t es = om_dtype_size(dt);
    const int64_t psz = (int64_t)m->Mo * m->Ko, qsz = (int64_t)m->Ko * m->No, osz = (int64_t)m->Mo * m->No;
    if (g->nbatch == 1) {
        gemm1(dt, m->tp, m->tq, m->Mo, m->No, m->Ko, alpha, m->P, m->Q, 0.0, m->O);
        return;
    }
    if (g->nbatch == 0) {
        /* empty batch: a reduced output is a sum over nothing */
        int64_t on = 1;
        for (int i = 0; i < g->nb; i++) on *= m->o_str[i] ? g->batch[i] : 1;
        memset(m->O, 0, (size_t)(on * osz) * es);
        return;
    }
    int o_full = om_mm_batch_is_contiguous(g, m->o_str, osz);
    int o_reduced = om_mm_batch_is_broadcast(g, m->o_str);
    /* (batch..., Mo, Ko) rows stacked against a shared Q: one tall GEMM */
    if (!m->tp && o_full && g->nbatch * m->Mo <= INT32_MAX && om_mm_batch_is_contiguous(g, m->p_str, psz) && om_mm_batch_is_broadcast(g, m->q_str)) {
        gemm1(dt, 0, m->tq, (int)(g->nbatch * m->Mo), m->No, m->Ko, alpha, m->P, m->Q, 0.0, m->O);
        return;
    }
    /* sum over the batch of P^T Q with both stacked: one GEMM with inner dim batch*Ko */
    if (m->tp && !m->tq && o_reduced && g->nbatch * m->Ko <= INT32_MAX && om_mm_batch_is_contiguous(g, m->p_str, psz) &&
        om_mm_batch_is_contiguous(g, m->q_str, qsz)) {
        gemm1(dt, 1, 0, m->Mo, m->No, (int)(g->nbatch * m->Ko), alpha, m->P, m->Q, 0.0, m->O);
        return;
    }
    /* general: one GEMM per batch index; reduced outputs accumulate (beta = 1) */
    double beta = 0.0;
    if (!o_full) {
        int64_t on = 1;
        for (int i = 0; i < g->nb; i++) on *= m->o_str[i] ? g->batch[i] : 1;
        memset(m->O, 0, (size_t)(on * osz) * es);
        beta = 1.0;
    }
    /* every product writes its own output: many, or small, products are shared out whole
     * (each then runs single-threaded); a few big ones run in turn, each shared out */
    if (o_full && (g->nbatch >= 2 * om_get_num_threads() || (int64_t)m->Mo * m->No * m->Ko < ((int64_t)1 << 20))) {
        bgemm_batch job = {dt, g, m, alpha, es};
        om_pool_for(g->nbatch, 1, bgemm_batch_range, &job);
        return;
    }
    for (int64_t t = 0; t < g->nbatch; t++) {
        int64_t po, qo, oo;
        batch_offsets(g, m, t, &po, &qo, &oo);
        gemm1(dt, m->tp, m->tq, m->Mo, m->No, m->Ko, alpha, (const char *)m->P + po * es,
              (const char *)m->Q + qo * es, beta, (char *)m->O + oo * es);
    }
}

/* ---- MatMul / FusedMatMul --------------------------------------------------------- */

static void mm_trans(const om_node *n, int *ta, int *tb, double *alpha) {
    int fused = n->op_id == om_op_fused_matmul_id;
    *ta = fused ? (int)om_attr_int(n, "transA", 0) != 0 : 0;
    *tb = fused ? (int)om_attr_int(n, "transB", 0) != 0 : 0;
    *alpha = fused ? om_attr_float(n, "alpha", 1.0f) : 1.0;
}

static om_status *matmul_infer(om_kernel_ctx *ctx) {
    const om_tensor *a = &ctx->in[0], *b = &ctx->in[1];
    int ta, tb;
    double alpha;
    mm_trans(ctx->node, &ta, &tb, &alpha);
    OM_TRY(om_check_float(ctx->node, a, 0, OM_UNDEFINED));
    OM_TRY(om_check_float(ctx->node, b, 1, a->dtype));
    mm_geom g;
    OM_TRY(mm_geometry(ctx->node, a->rank, a->dims, b->rank, b->dims, ta, tb, &g));
    om_tensor *y = &ctx->out[0];
    y->dtype = a->dtype;
    y->rank = g.y_rank;
    memcpy(y->dims, g.y_dims, sizeof(int64_t) * (size_t)g.y_rank);
    return NULL;
}

// A is (batch..., M, K) (or (K) / transposed), B is (batch..., K, N), Y is (batch..., M, N)
static om_status *matmul_cpu(om_kernel_ctx *ctx) {
    const om_tensor *a = &ctx->in[0], *b = &ctx->in[1];
    int ta, tb;
    double alpha;
    mm_trans(ctx->node, &ta, &tb, &alpha);
    OM_TRY(om_check_float(ctx->node, a, 0, OM_UNDEFINED));
    OM_TRY(om_check_float(ctx->node, b, 1, a->dtype));
    mm_geom g;
    OM_TRY(mm_geometry(ctx->node, a->rank, a->dims, b->rank, b->dims, ta, tb, &g));
    bgemm m = {(int)g.M, (int)g.N, (int)g.K, g.ta, g.tb, a->data, b->data, ctx->out[0].data,
               g.a_str, g.b_str, g.y_str};
    bgemm_run(a->dtype, &g, &m, alpha);
    return NULL;
}

static om_status *matmul_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    int a = n->in[0], b = n->in[1], dy = c->dy[0];
    int ta, tb;
    double alpha;
    mm_trans(n, &ta, &tb, &alpha);
    if (dy < 0) return NULL;
    for (int i = 0; i < 2; i++) {
        if (!c->need_dx[i]) continue;
        int x = i == 0 ? a : b, other = i == 0 ? b : a;
        int shape = om_emit_shape(c, x);
        if (shape < 0) return NULL;
        int in[3] = {dy, other, shape};
        int v = om_emit(c, om_op_matmul_grad_id, in, 3);
        if (v < 0) return NULL;
        om_emit_attr_int(c, "input", i);
        if (ta) om_emit_attr_int(c, "transA", 1);
        if (tb) om_emit_attr_int(c, "transB", 1);
        if (alpha != 1.0) om_emit_attr_float(c, "alpha", (float)alpha);
        c->dx[i] = v;
    }
    return NULL;
}

/* ---- MatMulGrad(dY, other, x_shape; input, transA, transB, alpha) ----------------- */

static om_status *mmgrad_geometry(om_kernel_ctx *ctx, mm_geom *g, int *which, int64_t *xd, int *xr) {
    const om_node *n = ctx->node;
    const om_tensor *dy = &ctx->in[0], *other = &ctx->in[1], *shp = &ctx->in[2];
    *which = (int)om_attr_int(n, "input", 0);
    int ta = om_attr_int(n, "transA", 0) != 0, tb = om_attr_int(n, "transB", 0) != 0;
    if (*which != 0 && *which != 1) return om_err_unsupported(n, "attribute input must be 0 or 1");
    OM_TRY(om_check_float(n, dy, 0, OM_UNDEFINED));
    OM_TRY(om_check_float(n, other, 1, dy->dtype));
    if (!shp->data)
        return om_error(OM_INVALID_ARGUMENT, "MatMulGrad node '%s': the operand shape must be known at plan time",
                        n->name ? n->name : "");
    *xr = om_read_ints(shp, xd, OM_MAX_RANK);
    if (*xr < 0)
        return om_error(OM_INVALID_ARGUMENT, "MatMulGrad node '%s': bad operand shape input", n->name ? n->name : "");
    if (*which == 0) OM_TRY(mm_geometry(n, *xr, xd, other->rank, other->dims, ta, tb, g));
    else OM_TRY(mm_geometry(n, other->rank, other->dims, *xr, xd, ta, tb, g));
    int64_t ny = 1, ndy = om_tensor_numel(dy);
    for (int i = 0; i < g->y_rank; i++) ny *= g->y_dims[i];
    if (ny != ndy)
        return om_error(OM_INVALID_ARGUMENT, "MatMulGrad node '%s': dY has %lld elements, the product has %lld",
                        n->name ? n->name : "", (long long)ndy, (long long)ny);
    return NULL;
}

static om_status *mmgrad_infer(om_kernel_ctx *ctx) {
    mm_geom g;
    int which = 0, xr = 0;
    int64_t xd[OM_MAX_RANK];
    OM_TRY(mmgrad_geometry(ctx, &g, &which, xd, &xr));
    om_tensor *o = &ctx->out[0];
    o->dtype = ctx->in[0].dtype;
    o->rank = xr;
    memcpy(o->dims, xd, sizeof(int64_t) * (size_t)xr);
    return NULL;
}

/* Y = alpha op(A) op(B); dY is (batch..., M, N).
 *   dA:  transA=0: alpha dY op(B)^T   (M,K)     transA=1: alpha op(B) dY^T   (K,M)
 *   dB:  transB=0: alpha op(A)^T dY   (K,N)     transB=1: alpha dY^T op(A)   (N,K)
 * with op(B)^T = B read with trans !transB, and so on. Batch dims where x was broadcast
 * are summed (its batch strides are 0 there). */
static om_status *mmgrad_cpu(om_kernel_ctx *ctx) {
    mm_geom g;
    int which = 0, xr = 0;
    int64_t xd[OM_MAX_RANK];
    OM_TRY(mmgrad_geometry(ctx, &g, &which, xd, &xr));
    const void *dy = ctx->in[0].data, *other = ctx->in[1].data;
    void *dx = ctx->out[0].data;
    double alpha = om_attr_float(ctx->node, "alpha", 1.0f);
    const int M = (int)g.M, N = (int)g.N, K = (int)g.K;
    bgemm m;
    if (which == 0) {
        if (!g.ta) m = (bgemm){M, K, N, 0, !g.tb, dy, other, dx, g.y_str, g.b_str, g.a_str};
        else m = (bgemm){K, M, N, g.tb, 1, other, dy, dx, g.b_str, g.y_str, g.a_str};
    } else {
        if (!g.tb) m = (bgemm){K, N, M, !g.ta, 0, other, dy, dx, g.a_str, g.y_str, g.b_str};
        else m = (bgemm){N, K, M, 1, g.ta, dy, other, dx, g.y_str, g.a_str, g.b_str};
    }
    bgemm_run(ctx->in[0].dtype, &g, &m, alpha);
    return NULL;
}

/* ---- Gemm ------------------------------------------------------------------------- */

static om_status *gemm_dims(om_kernel_ctx *ctx, int64_t *M, int64_t *N, int64_t *K) {
    const om_node *n = ctx->node;
    const om_tensor *a = &ctx->in[0], *b = &ctx->in[1];
    int ta = om_attr_int(n, "transA", 0) != 0, tb = om_attr_int(n, "transB", 0) != 0;
    OM_TRY(om_check_float(n, a, 0, OM_UNDEFINED));
    OM_TRY(om_check_float(n, b, 1, a->dtype));
    char sa[160], sb[160];
    dims_str(a->rank, a->dims, sa, sizeof sa);
    dims_str(b->rank, b->dims, sb, sizeof sb);
    if (a->rank != 2 || b->rank != 2)
        return om_error(OM_INVALID_ARGUMENT, "Gemm node '%s': A and B must be 2-D, got %s and %s",
                        n->name ? n->name : "", sa, sb);
    *M = ta ? a->dims[1] : a->dims[0];
    *K = ta ? a->dims[0] : a->dims[1];
    int64_t kb = tb ? b->dims[1] : b->dims[0];
    *N = tb ? b->dims[0] : b->dims[1];
    if (kb != *K)
        return om_error(OM_INVALID_ARGUMENT, "Gemm node '%s': shapes %s%s and %s%s do not multiply",
                        n->name ? n->name : "", sa, ta ? "^T" : "", sb, tb ? "^T" : "");
    if (*M > INT32_MAX || *N > INT32_MAX || *K > INT32_MAX)
        return om_error(OM_INVALID_ARGUMENT, "Gemm node '%s': dims exceed the BLAS int range", n->name ? n->name : "");
    const om_tensor *c = ctx->n_in > 2 ? &ctx->in[2] : NULL;
    if (c && c->dtype != OM_UNDEFINED) {
        OM_TRY(om_check_float(n, c, 2, a->dtype));
        int ok = c->rank <= 2;
        int64_t cm = c->rank == 2 ? c->dims[0] : 1, cn = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
        ok = ok && (cm == 1 || cm == *M) && (cn == 1 || cn == *N);
        if (!ok) {
            dims_str(c->rank, c->dims, sa, sizeof sa);
            return om_error(OM_INVALID_ARGUMENT, "Gemm node '%s': C of shape %s does not broadcast to (%lld, %lld)",
                            n->name ? n->name : "", sa, (long long)*M, (long long)*N);
        }
    }
    return NULL;
}

static om_status *gemm_infer(om_kernel_ctx *ctx) {
    int64_t M, N, K;
    OM_TRY(gemm_dims(ctx, &M, &N, &K));
    om_tensor *y = &ctx->out[0];
    y->dtype = ctx->in[0].dtype;
    y->rank = 2;
    y->dims[0] = M;
    y->dims[1] = N;
    return NULL;
}

// A is (M,K) or (K,M), B is (K,N) or (N,K), C broadcasts to (M,N), Y is (M,N)
static om_status *gemm_cpu(om_kernel_ctx *ctx) {
    int64_t M, N, K;
    OM_TRY(gemm_dims(ctx, &M, &N, &K));
    const om_node *n = ctx->node;
    int ta = om_attr_int(n, "transA", 0) != 0, tb = om_attr_int(n, "transB", 0) != 0;
    double alpha = om_attr_float(n, "alpha", 1.0f), beta = om_attr_float(n, "beta", 1.0f);
    const om_tensor *c = ctx->n_in > 2 && ctx->in[2].dtype != OM_UNDEFINED ? &ctx->in[2] : NULL;
    om_dtype dt = ctx->in[0].dtype;
    double gbeta = 0.0;
    if (c && beta != 0.0 && M > 0 && N > 0) {
        /* Y = beta * C broadcast, then GEMM accumulates into it */
        int64_t cm = c->rank == 2 ? c->dims[0] : 1, cn = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
        int64_t sm = cm == 1 ? 0 : cn, sn = cn == 1 ? 0 : 1;
        OM_DISPATCH_FLOAT(dt, n, {
            const T *restrict cp = c->data;
            T *restrict y = ctx->out[0].data;
            const T bt = (T)beta;
            for (int64_t i = 0; i < M; i++) {
                const T *restrict cr = cp + i * sm;
                T *restrict yr = y + i * N;
                if (sn) for (int64_t j = 0; j < N; j++) yr[j] = bt * cr[j];
                else for (int64_t j = 0; j < N; j++) yr[j] = bt * cr[0];
            }
        });
        gbeta = 1.0;
    }
    gemm1(dt, ta, tb, (int)M, (int)N, (int)K, alpha, ctx->in[0].data, ctx->in[1].data, gbeta, ctx->out[0].data);
    return NULL;
}

/* Y = alpha op(A) op(B) + beta C:
 *   dA = alpha dY op(B)^T  (transA=0)  or  alpha op(B) dY^T  (transA=1)
 *   dB = alpha op(A)^T dY  (transB=0)  or  alpha dY^T op(A)  (transB=1)
 *   dC = sum_to(beta dY, C)                                                        */
static om_status *gemm_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    int a = n->in[0], b = n->in[1], cc = n->n_in > 2 ? n->in[2] : -1, dy = c->dy[0];
    int ta = om_attr_int(n, "transA", 0) != 0, tb = om_attr_int(n, "transB", 0) != 0;
    float alpha = om_attr_float(n, "alpha", 1.0f), beta = om_attr_float(n, "beta", 1.0f);
    om_dtype dt = c->g->values[n->out[0]].dtype;
    if (dy < 0) return NULL;
    if (c->need_dx[0]) {
        int v = !ta ? om_emit2(c, om_op_gemm_id, dy, b) : om_emit2(c, om_op_gemm_id, b, dy);
        if (v < 0) return NULL;
        om_emit_attr_int(c, "transA", !ta ? 0 : tb);
        om_emit_attr_int(c, "transB", !ta ? !tb : 1);
        om_emit_attr_float(c, "alpha", alpha);
        c->dx[0] = v;
    }
    if (c->need_dx[1]) {
        int v = !tb ? om_emit2(c, om_op_gemm_id, a, dy) : om_emit2(c, om_op_gemm_id, dy, a);
        if (v < 0) return NULL;
        om_emit_attr_int(c, "transA", !tb ? !ta : 1);
        om_emit_attr_int(c, "transB", !tb ? 0 : ta);
        om_emit_attr_float(c, "alpha", alpha);
        c->dx[1] = v;
    }
    if (cc >= 0 && c->need_dx[2]) {
        int g = dy;
        if (beta != 1.0f) {
            int s = om_emit_scalar(c, dt, beta);
            if (s < 0) return NULL;
            g = om_emit2(c, om_op_mul_id, dy, s);
            if (g < 0) return NULL;
        }
        int v = om_emit_sum_to(c, g, cc);
        if (v < 0) return NULL;
        c->dx[2] = v;
    }
    return NULL;
}

/* ---- the defs --------------------------------------------------------------------- */

const om_op_def om_op_matmul = {
    .name = "MatMul", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = matmul_infer, .grad = matmul_grad, .cpu = matmul_cpu, .diff_inputs = 0x3,
};

const om_op_def om_op_fused_matmul = {
    .name = "FusedMatMul", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .infer = matmul_infer, .grad = matmul_grad, .cpu = matmul_cpu, .diff_inputs = 0x3,
    .attrs = "alpha:float transA:int transB:int transBatchA:int=0 transBatchB:int=0",
};

const om_op_def om_op_matmul_grad = {
    .name = "MatMulGrad", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = mmgrad_infer, .grad = NULL, .cpu = mmgrad_cpu, .diff_inputs = 0,
    .attrs = "alpha:float input:int transA:int transB:int",
};

const om_op_def om_op_gemm = {
    .name = "Gemm", .domain = "", .min_in = 2, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = gemm_infer, .grad = gemm_grad, .cpu = gemm_cpu, .diff_inputs = 0x7,
    .attrs = "alpha:float beta:float transA:int transB:int",
};
