// attention.cu — FusedAttention / FusedAttentionGrad (attention.c) on cuBLAS with the scores
// materialized in fp32: S = scale Q K^T (+ mask, causal), a row softmax that keeps lse per
// row, dropout keep(i) = uniform(seed, i) >= ratio on the flat (batch..., L, S) index as the
// CPU draws it, then O = P V. The backward recomputes P from lse:
//   dV = Pd^T dO, dPd = dO V^T, dS = P (dPd keep/(1-ratio) - rowsum(dO O)), dQ = scale dS K,
//   dK = scale dS^T Q.
// Memory is O(batch L S) per call (temporary, from the pool). fp16/bf16 calls with head dims up to
// 128 go to flash.cu instead, whose tensor-core kernels never materialize S. Needs: scale factors and the dropout
// ratio known at plan time, Q/K/V each stacked or shared over the batch, or K/V shared by the
// inner batch dims (multi-query: one K/V per group of heads). A mask gradient takes the
// materialized path.
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention.cuh"

// attention_geom.h (the shapes and their checks, shared with attention.c) reports errors, formats
// shapes and reads attributes through the engine's names, mapped here onto the host table and a
// local formatter (as conv.cu does for spatial.h); dtypes are named by number, as omc_err_dtype does
static void omc_shape_str(const om_tensor *t, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->rank && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)t->dims[i]);
    if (used < n) snprintf(buf + used, n - used, "] dtype %d", (int)t->dtype);
}
#define om_error(...) g_host.error(__VA_ARGS__)
#define om_attr_int(n, name, d) g_host.attr_int((n), (name), (d))
#define om_attr_float(n, name, d) g_host.attr_float((n), (name), (d))
#define om_shape_str(t, buf, n) omc_shape_str((t), (buf), (n))
#include "ops/attention_geom.h"

// the shared geometry, and how the strided-batched GEMMs read each operand
struct attn_geom : om_attn_geom {
    int64_t q_bs, k_bs, v_bs;        // batch strides over the flattened batch (0 = shared)
    int64_t kv_inner;                // K and V shared by this many consecutive batch items (1: none)
};

// stride over the flattened batch: mat when stacked, 0 when shared, -1 otherwise
static int64_t flat_stride(const om_tensor *t, const attn_geom *g, int64_t mat) {
    int br = t->rank - 2, all_one = 1, same = br == g->nb;
    for (int i = 0; i < br; i++) all_one &= t->dims[i] == 1;
    if (all_one) return 0;
    for (int i = 0; same && i < br; i++) same = t->dims[i] == g->batch[i];
    return same ? mat : -1;
}

// K or V stacked over the outer batch dims and shared (size 1) over the inner ones, as multi-query
// and grouped attention pass them (B, 1, S, D) against Q's (B, H, L, D): the number of batch items
// that share one matrix, or 0 when t is not of that form
static int64_t inner_shared(const om_tensor *t, const attn_geom *g) {
    int br = t->rank - 2, p = g->nb;
    int64_t inner = 1;
    while (p > 0) {
        int j = p - 1 - (g->nb - br);
        if ((j >= 0 ? t->dims[j] : 1) != 1) break;
        inner *= g->batch[--p];
    }
    for (int i = 0; i < p; i++) {
        int j = i - (g->nb - br);
        if (j < 0 || t->dims[j] != g->batch[i]) return 0;
    }
    return p > 0 && inner > 1 ? inner : 0;
}

static om_status *attn_geometry(const om_kernel_ctx *ctx, const om_cuda_exec *x, int q, int mi, int f, int r, int tm,
                                attn_geom *g) {
    const om_tensor *Q = &ctx->in[q], *K = &ctx->in[q + 1], *V = &ctx->in[q + 2];
    memset(g, 0, sizeof *g);
    OMC_TRY(om_attn_shapes(ctx->node, Q, K, V, present(ctx, mi) ? &ctx->in[mi] : NULL, g));
    g->q_bs = flat_stride(Q, g, g->L * g->D);
    g->k_bs = flat_stride(K, g, g->S * g->D);
    g->v_bs = flat_stride(V, g, g->S * g->Dv);
    g->kv_inner = 1;
    if ((g->k_bs < 0 || g->v_bs < 0) && g->q_bs == g->L * g->D) {
        // the GEMMs take each group of kv_inner batch items as one matrix of kv_inner*L rows
        int64_t ik = inner_shared(K, g), iv = inner_shared(V, g);
        if (ik && ik == iv) g->kv_inner = ik, g->k_bs = g->S * g->D, g->v_bs = g->S * g->Dv;
    }
    if (g->q_bs < 0 || g->k_bs < 0 || g->v_bs < 0)
        return omc_err_unsupported(ctx, "Q, K or V broadcast over part of the batch");
    const int inv = om_attn_scale(ctx->node, g);
    for (int i = 0; i < 3; i++) {
        if (!present(ctx, f + i)) continue;
        double v;
        if (host_scalar(ctx, x, f + i, &v)) return omc_err_unsupported(ctx, "a scale factor that is not known at plan time");
        om_attn_factor(g, inv, i, v);
    }
    if (present(ctx, tm)) {
        double t = 1, ratio = 0.5;
        if (host_scalar(ctx, x, tm, &t)) return omc_err_unsupported(ctx, "a training_mode that is not known at plan time");
        if (present(ctx, r) && host_scalar(ctx, x, r, &ratio))
            return omc_err_unsupported(ctx, "a dropout ratio that is not known at plan time");
        OMC_TRY(om_attn_dropout(ctx->node, g, t != 0, ratio));
    }
    return NULL;
}

static int blas_type(om_dtype dt, cudaDataType *t) {
    switch (dt) {
    case OM_F32: *t = CUDA_R_32F; return 0;
    case OM_F16: *t = CUDA_R_16F; return 0;
    case OM_BF16: *t = CUDA_R_16BF; return 0;
    case OM_F64: *t = CUDA_R_64F; return 0;
    default: return -1;
    }
}

// Row-major batched C(M,N) = alpha op(A)(M,K) op(B)(K,N) + beta C with A, B of type ab and C of type ct
static om_status *bgemm(const om_kernel_ctx *ctx, const om_cuda_exec *x, cudaDataType ab, cudaDataType ctp, int ta, int tb,
                        int64_t M, int64_t N, int64_t K, double alpha, const void *A, int64_t sA, const void *B, int64_t sB,
                        double beta, void *C, int64_t sC, int64_t batch) {
    if (!M || !N || !batch) return NULL;
    int dbl = ab == CUDA_R_64F;
    float af = (float)alpha, bf = (float)beta;
    const void *pa = dbl ? (const void *)&alpha : (const void *)&af, *pb = dbl ? (const void *)&beta : (const void *)&bf;
    int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N);
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        (cublasHandle_t)x->cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K,
        pa, B, ab, ldb, sB, A, ab, lda, sA, pb, C, ctp, (int)N, sC, (int)batch, dbl ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return OMC_ERR(OM_RUNTIME, "node '%s' (%s): cublasGemmStridedBatchedEx failed (status %d)", omc_node_name(ctx),
                       omc_op_name(ctx), (int)s);
    return NULL;
}

// S (nbatch, L, S) fp32 scores -> P (T, dropout applied) and lse (nbatch, L) fp32; one block per row
template <typename T>
__global__ void attn_softmax_kernel(T *P, float *lse, const float *Sc, const T *mask, soft_args a, const int64_t *seedp) {
    uint64_t seed = seedp ? (uint64_t)*seedp : 0;
    int64_t rows = 1;
    for (int d = 0; d < a.nb; d++) rows *= a.batch[d];
    rows *= a.L;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t t = row / a.L, i = row - t * a.L;
        int64_t mb = mask ? mask_base(a, t) : 0;
        const float *sr = Sc + row * a.S;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < a.S; j += blockDim.x) m = fmaxf(m, logit(a, sr[j], mask, mb, i, j));
        m = block_max(m);
        float sum = 0;
        if (m != -INFINITY)
            for (int64_t j = threadIdx.x; j < a.S; j += blockDim.x) sum += expf(logit(a, sr[j], mask, mb, i, j) - m);
        sum = block_sum(sum);
        float l = m + logf(sum);   // fully masked rows: -inf + log 0 = -inf (P = NaN, or 0 with nan_to_zero)
        T *pr = P + row * a.S;
        for (int64_t j = threadIdx.x; j < a.S; j += blockDim.x) {
            float p = expf(logit(a, sr[j], mask, mb, i, j) - l);
            if (p != p && a.nan_to_zero) p = 0;
            if (a.dropout) p = rand_uniform(seed, (uint64_t)(row * a.S + j)) >= a.ratio ? p * a.dscale : 0.0f;
            pr[j] = st<T>((typename acc<T>::t)p);
        }
        if (lse && threadIdx.x == 0) lse[row] = l;
    }
}

__global__ void write_seed_kernel(int64_t *p, uint64_t seed) { *p = (int64_t)seed; }

static soft_args soft_of(const attn_geom &g) {
    soft_args a;
    memset(&a, 0, sizeof a);
    a.L = g.L; a.S = g.S; a.nb = g.nb;
    for (int i = 0; i < g.nb; i++) { a.batch[i] = g.batch[i]; a.m_str[i] = g.m_str[i]; }
    a.m_row = g.m_row; a.m_col = g.m_col;
    a.causal = g.causal; a.nan_to_zero = g.nan_to_zero; a.dropout = g.dropout;
    a.scale = (float)g.scale; a.ratio = (float)g.ratio; a.dscale = g.ratio < 1.0 ? (float)(1.0 / (1.0 - g.ratio)) : 0.0f;
    return a;
}

// The flash kernels (flash.cu) take fp16/bf16 with head dims up to FLASH_MAX_D; the cuBLAS path
// with materialized scores takes the rest, and every call when the engine's options say so
// (ORTMOD_CUDA_ATTENTION=materialized; asked per call, so that a benchmark or a test can compare
// the two in one process).
static int use_flash(om_dtype dt, const attn_geom &g, flash_args *f) {
    if (g_host.attention_materialized()) return 0;
    if (g.kv_inner != 1) return 0;   // (flash reads one K/V matrix per batch item)
    if ((dt != OM_F16 && dt != OM_BF16) || g.D > FLASH_MAX_D || g.Dv > FLASH_MAX_D || g.nbatch > 65535) return 0;
    memset(f, 0, sizeof *f);
    f->a = soft_of(g);
    f->B = g.nbatch; f->D = g.D; f->Dv = g.Dv;
    f->q_bs = g.q_bs; f->k_bs = g.k_bs; f->v_bs = g.v_bs;
    f->kt = g.kt;
    return 1;
}

static unsigned rows_grid(int64_t rows) { return (unsigned)(rows < 65535 * 16 ? (rows > 0 ? rows : 1) : 65535 * 16); }

// Q (batch..., L, D), K (batch..., S, D) or K^T, V (batch..., S, Dv), mask -> (L, S); O (batch..., L, Dv), lse, seed
om_status *attention_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    attn_geom g;
    OMC_TRY(attn_geometry(ctx, x, 0, 3, 4, 7, 8, &g));
    om_dtype dt = ctx->in[0].dtype;
    cudaDataType t;
    if (blas_type(dt, &t) || dt == OM_F64) return omc_err_dtype(ctx, 0, dt);
    // lse is fp32 for every dtype taken here (attention.c's dtype rule: the statistics dtype)
    if (wanted(ctx, 1) && ctx->out[1].dtype != OM_F32) return omc_err_unsupported(ctx, "an lse output that is not float32");
    int64_t B = g.nbatch, L = g.L, S = g.S;
    if (wanted(ctx, 2)) {
        write_seed_kernel<<<1, 1, 0, stream_of(x)>>>((int64_t *)ctx->out[2].data, ctx->seed);
        OMC_TRY(omc_launched(ctx));
    }
    if (!B || !L) return NULL;
    flash_args f;
    if (use_flash(dt, g, &f)) {
        const int64_t *seedp = NULL;
        int64_t *dseed = NULL;
        if (g.dropout) {   // as below: the forward's seed on the device
            if (wanted(ctx, 2)) seedp = (const int64_t *)ctx->out[2].data;
            else {
                OMC_TRY(omc_temp_alloc(x, 8, (void **)&dseed));
                write_seed_kernel<<<1, 1, 0, stream_of(x)>>>(dseed, ctx->seed);
                seedp = dseed;
            }
        }
        om_status *st = flash_forward(ctx, x, dt, &f, ctx->in[0].data, ctx->in[1].data, ctx->in[2].data,
                                      g.has_mask ? ctx->in[3].data : NULL, seedp, ctx->out[0].data,
                                      wanted(ctx, 1) ? (float *)ctx->out[1].data : NULL);
        if (dseed) omc_temp_free(x, dseed);
        return st;
    }
    size_t es = dtype_size(dt);
    float *Sc = NULL;
    void *P = NULL;
    OMC_TRY(omc_temp_alloc(x, sizeof(float) * (size_t)(B * L * S), (void **)&Sc));
    om_status *st = omc_temp_alloc(x, es * (size_t)(B * L * S), &P);
    // K and V shared by kv_inner consecutive batch items: those items' queries are one matrix
    const int64_t fi = g.kv_inner, Bf = B / fi, Lf = L * fi;
    if (!st)   // S = Q K^T (K^T given when k_transposed)
        st = bgemm(ctx, x, t, CUDA_R_32F, 0, !g.kt, Lf, S, g.D, 1.0, ctx->in[0].data, g.q_bs * fi, ctx->in[1].data, g.k_bs,
                   0.0, Sc, Lf * S, Bf);
    if (!st) {
        soft_args a = soft_of(g);
        const int64_t *seedp = NULL;
        int64_t *dseed = NULL;
        if (g.dropout) {   // the forward's seed, on the device (the stash keeps it for the backward)
            if (wanted(ctx, 2)) seedp = (const int64_t *)ctx->out[2].data;
            else if (!(st = omc_temp_alloc(x, 8, (void **)&dseed))) {
                write_seed_kernel<<<1, 1, 0, stream_of(x)>>>(dseed, ctx->seed);
                seedp = dseed;
            }
        }
        if (!st) {
            OMC_DISPATCH_FLOAT(dt, ctx, 0, {
                attn_softmax_kernel<T><<<rows_grid(B * L), 256, 0, stream_of(x)>>>(
                    (T *)P, wanted(ctx, 1) ? (float *)ctx->out[1].data : NULL, Sc,
                    g.has_mask ? (const T *)ctx->in[3].data : NULL, a, seedp);
            });
            st = omc_launched(ctx);
        }
        if (dseed) omc_temp_free(x, dseed);
    }
    if (!st)   // O = P V
        st = bgemm(ctx, x, t, t, 0, 0, Lf, g.Dv, S, 1.0, P, Lf * S, ctx->in[2].data, g.v_bs, 0.0, ctx->out[0].data,
                   Lf * g.Dv, Bf);
    omc_temp_free(x, Sc);
    if (P) omc_temp_free(x, P);
    return st;
}

// recompute P (fp32, in place over the scores) from lse; Pd = P keep dscale (T); one block per row
template <typename T>
__global__ void attn_recompute_kernel(float *Sc, T *Pd, const float *lse, const T *mask, soft_args a, const int64_t *seedp) {
    uint64_t seed = seedp ? (uint64_t)*seedp : 0;
    int64_t rows = a.L;
    for (int d = 0; d < a.nb; d++) rows *= a.batch[d];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t t = row / a.L, i = row - t * a.L;
        int64_t mb = mask ? mask_base(a, t) : 0;
        float l = lse[row];
        float *sr = Sc + row * a.S;
        for (int64_t j = threadIdx.x; j < a.S; j += blockDim.x) {
            float p = expf(logit(a, sr[j], mask, mb, i, j) - l);
            if (p != p) p = 0;
            sr[j] = p;
            float k = a.dropout ? (rand_uniform(seed, (uint64_t)(row * a.S + j)) >= a.ratio ? a.dscale : 0.0f) : 1.0f;
            Pd[row * a.S + j] = st<T>((typename acc<T>::t)(p * k));
        }
    }
}

// Di = rowsum(dO * O) per row (nbatch*L rows of Dv)
template <typename T>
__global__ void attn_rowdot_kernel(float *Di, const T *dO, const T *O, int64_t rows, int64_t Dv) {
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        float s = 0;
        for (int64_t j = threadIdx.x; j < Dv; j += blockDim.x) s += (float)ld(dO[row * Dv + j]) * (float)ld(O[row * Dv + j]);
        s = block_sum(s);
        if (threadIdx.x == 0) Di[row] = s;
    }
}

// dS = P (dPd keep dscale - Di), written as T for the dQ / dK products
template <typename T>
__global__ void attn_ds_kernel(T *dS, const float *P, const float *dPd, const float *Di, soft_args a, const int64_t *seedp,
                               int64_t n) {
    uint64_t seed = seedp ? (uint64_t)*seedp : 0;
    GRID_STRIDE(k, n) {
        int64_t row = k / a.S;
        float kp = a.dropout ? (rand_uniform(seed, (uint64_t)k) >= a.ratio ? a.dscale : 0.0f) : 1.0f;
        dS[k] = st<T>((typename acc<T>::t)(P[k] * (dPd[k] * kp - Di[row])));
    }
}

// dmask += dS, summed over the dims the mask is broadcast along (a relative-position bias shared by
// the batch, T5's and Swin's): fp32 atomics into the mask-sized accumulator of an omc_scatter
__global__ void attn_dmask_kernel(float *acc, const float *P, const float *dPd, const float *Di, soft_args a,
                                  const int64_t *seedp, int64_t n) {
    uint64_t seed = seedp ? (uint64_t)*seedp : 0;
    GRID_STRIDE(k, n) {
        int64_t row = k / a.S, j = k % a.S, t = row / a.L, i = row % a.L;
        float kp = a.dropout ? (rand_uniform(seed, (uint64_t)k) >= a.ratio ? a.dscale : 0.0f) : 1.0f;
        atomic_acc(acc + mask_base(a, t) + i * a.m_row + j * a.m_col, P[k] * (dPd[k] * kp - Di[row]));
    }
}

// FusedAttentionGrad(dO, Q, K, V, O, lse, mask?, f0?, f1?, f2?, ratio?, training_mode?, seed?) -> (dQ?, dK?, dV?, dmask?)
om_status *attention_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    attn_geom g;
    OMC_TRY(attn_geometry(ctx, x, 1, 6, 7, 10, 11, &g));
    const int want_dmask = wanted(ctx, 3) && g.has_mask;
    if (want_dmask && ctx->out[3].dtype == OM_F64) return omc_err_dtype(ctx, 6, ctx->out[3].dtype);
    om_dtype dt = ctx->in[1].dtype;
    cudaDataType t;
    if (blas_type(dt, &t) || dt == OM_F64) return omc_err_dtype(ctx, 1, dt);
    if (ctx->in[5].dtype != OM_F32) return omc_err_dtype(ctx, 5, ctx->in[5].dtype);
    int64_t B = g.nbatch, L = g.L, S = g.S, D = g.D, Dv = g.Dv;
    if (!B || !L) {   // no query: K and V got no gradient (zeros, as on the CPU)
        for (int j = 1; j <= 2; j++)
            if (wanted(ctx, j))
                OMC_TRY(omc_cuda(cudaMemsetAsync(ctx->out[j].data, 0, nbytes(&ctx->out[j]), stream_of(x)),
                                 "cudaMemsetAsync"));
        return NULL;
    }
    // a batch stride of 0 is a shared operand, unless the operand is empty (its stride is 0 too)
    if ((wanted(ctx, 1) && g.k_bs == 0 && B > 1 && S * D) || (wanted(ctx, 2) && g.v_bs == 0 && B > 1 && S * Dv) ||
        (wanted(ctx, 0) && g.q_bs == 0 && B > 1 && L * D))
        return omc_err_unsupported(ctx, "gradients of Q, K or V shared over the batch");
    const void *dO = ctx->in[0].data, *Q = ctx->in[1].data, *K = ctx->in[2].data, *V = ctx->in[3].data;
    const int64_t *seedp = g.dropout && present(ctx, 12) ? (const int64_t *)ctx->in[12].data : NULL;
    if (g.dropout && !seedp) return OMC_ERR(OM_INTERNAL, "FusedAttentionGrad node '%s': the dropout seed is missing", omc_node_name(ctx));
    flash_args f;
    if (!want_dmask && use_flash(dt, g, &f)) {   // (flash never materializes dS, which dmask sums)
        float *Di = NULL;
        OMC_TRY(omc_temp_alloc(x, sizeof(float) * (size_t)(B * L), (void **)&Di));
        OMC_DISPATCH_FLOAT(dt, ctx, 1, {
            attn_rowdot_kernel<T><<<rows_grid(B * L), 128, 0, stream_of(x)>>>(Di, (const T *)dO,
                                                                               (const T *)ctx->in[4].data, B * L, Dv);
        });
        om_status *st = omc_launched(ctx);
        if (!st)
            st = flash_backward(ctx, x, dt, &f, dO, Q, K, V, g.has_mask ? ctx->in[6].data : NULL, seedp,
                                (const float *)ctx->in[5].data, Di, wanted(ctx, 0) ? ctx->out[0].data : NULL,
                                wanted(ctx, 1) ? ctx->out[1].data : NULL, wanted(ctx, 2) ? ctx->out[2].data : NULL);
        omc_temp_free(x, Di);
        return st;
    }
    size_t es = dtype_size(dt), nls = (size_t)(B * L * S);
    float *Sc = NULL, *dPd = NULL, *Di = NULL;
    void *Pd = NULL;
    om_status *st = omc_temp_alloc(x, sizeof(float) * nls, (void **)&Sc);
    if (!st) st = omc_temp_alloc(x, sizeof(float) * nls, (void **)&dPd);
    if (!st) st = omc_temp_alloc(x, sizeof(float) * (size_t)(B * L), (void **)&Di);
    if (!st) st = omc_temp_alloc(x, es * nls, &Pd);
    soft_args a = soft_of(g);
    const int64_t fi = g.kv_inner, Bf = B / fi, Lf = L * fi;   // as in the forward
    if (!st) st = bgemm(ctx, x, t, CUDA_R_32F, 0, !g.kt, Lf, S, D, 1.0, Q, g.q_bs * fi, K, g.k_bs, 0.0, Sc, Lf * S, Bf);
    if (!st) {
        OMC_DISPATCH_FLOAT(dt, ctx, 1, {
            attn_recompute_kernel<T><<<rows_grid(B * L), 256, 0, stream_of(x)>>>(
                Sc, (T *)Pd, (const float *)ctx->in[5].data, g.has_mask ? (const T *)ctx->in[6].data : NULL, a, seedp);
            attn_rowdot_kernel<T><<<rows_grid(B * L), 128, 0, stream_of(x)>>>(Di, (const T *)dO, (const T *)ctx->in[4].data,
                                                                               B * L, Dv);
        });
        st = omc_launched(ctx);
    }
    // dV = Pd^T dO: (S, L) x (L, Dv)
    if (!st && wanted(ctx, 2))
        st = bgemm(ctx, x, t, t, 1, 0, S, Dv, Lf, 1.0, Pd, Lf * S, dO, Lf * Dv, 0.0, ctx->out[2].data, S * Dv, Bf);
    // dPd = dO V^T: (L, Dv) x (Dv, S), fp32
    if (!st) st = bgemm(ctx, x, t, CUDA_R_32F, 0, 1, Lf, S, Dv, 1.0, dO, Lf * Dv, V, g.v_bs, 0.0, dPd, Lf * S, Bf);
    if (!st) {   // dS into Pd's buffer (Pd is no longer needed)
        OMC_DISPATCH_FLOAT(dt, ctx, 1, {
            attn_ds_kernel<T><<<grid_for((int64_t)nls), OMC_THREADS, 0, stream_of(x)>>>((T *)Pd, Sc, dPd, Di, a, seedp,
                                                                                          (int64_t)nls);
        });
        st = omc_launched(ctx);
    }
    if (!st && want_dmask) {   // from P (Sc, fp32) before anything overwrites it
        omc_scatter sc;
        st = omc_scatter_start(ctx, x, ctx->out[3].dtype, ctx->out[3].data, numel(&ctx->out[3]), NULL, &sc);
        if (!st) {
            attn_dmask_kernel<<<grid_for((int64_t)nls), OMC_THREADS, 0, stream_of(x)>>>((float *)sc.acc, Sc, dPd, Di, a,
                                                                                      seedp, (int64_t)nls);
            st = omc_launched(ctx);
        }
        st = omc_scatter_finish(ctx, x, &sc, st);
    }
    // dQ = scale dS K: (L, S) x (S, D) — K^T (D, S) read transposed when k_transposed
    if (!st && wanted(ctx, 0))
        st = bgemm(ctx, x, t, t, 0, g.kt, Lf, D, S, g.scale, Pd, Lf * S, K, g.k_bs, 0.0, ctx->out[0].data, Lf * D, Bf);
    // dK = scale dS^T Q: (S, L) x (L, D); with k_transposed dK^T = scale Q^T dS: (D, L) x (L, S)
    if (!st && wanted(ctx, 1)) {
        if (!g.kt)
            st = bgemm(ctx, x, t, t, 1, 0, S, D, Lf, g.scale, Pd, Lf * S, Q, g.q_bs * fi, 0.0, ctx->out[1].data, S * D, Bf);
        else
            st = bgemm(ctx, x, t, t, 1, 0, D, S, Lf, g.scale, Q, g.q_bs * fi, Pd, Lf * S, 0.0, ctx->out[1].data, S * D, Bf);
    }
    if (Sc) omc_temp_free(x, Sc);
    if (dPd) omc_temp_free(x, dPd);
    if (Di) omc_temp_free(x, Di);
    if (Pd) omc_temp_free(x, Pd);
    return st;
}
