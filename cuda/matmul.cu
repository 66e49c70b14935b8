// matmul.cu — matmul.c's ops on cuBLAS: MatMul, FusedMatMul, MatMulGrad, Gemm; and the GEMM
// plumbing the other GEMM ops share (omc_gemm, and gemm.cuh's cuBLASLt epilogues, which fused.cu's
// MatMulBias, MatMulBiasGrad and MatMulBiasGelu run on). Row-major products are computed as their
// column-major transposes (Y^T = op(B)^T op(A)^T), so no operand is ever copied or transposed.
// fp16/bf16 accumulate in fp32 (CUBLAS_COMPUTE_32F); fp32 stays exact fp32 (no TF32, as
// torch's default); fp64 computes in fp64. MatMulBias adds its bias in cuBLASLt's epilogue
// (falling back to bias-then-GEMM with beta = 1 where Lt finds no algorithm), MatMulBiasGelu its
// bias and tanh GELU.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <pthread.h>

#include "common.cuh"
#include "gemm.cuh"
#include "ops/matmul_geom.h"

// ---- cuBLAS plumbing -------------------------------------------------------------------------

static om_status *blas_err(const om_kernel_ctx *ctx, cublasStatus_t s, const char *what) {
    return OMC_ERR(OM_RUNTIME, "node '%s' (%s): %s failed (cuBLAS status %d)", omc_node_name(ctx), omc_op_name(ctx),
                   what, (int)s);
}

static int blas_types(om_dtype dt, cudaDataType *t, cublasComputeType_t *ct) {
    switch (dt) {
    case OM_F32: *t = CUDA_R_32F; *ct = CUBLAS_COMPUTE_32F; return 0;
    case OM_F16: *t = CUDA_R_16F; *ct = CUBLAS_COMPUTE_32F; return 0;
    case OM_BF16: *t = CUDA_R_16BF; *ct = CUBLAS_COMPUTE_32F; return 0;
    case OM_F64: *t = CUDA_R_64F; *ct = CUBLAS_COMPUTE_64F; return 0;
    default: return -1;
    }
}

// Row-major, batched: O[b] = alpha op(P[b]) op(Q[b]) + beta O[b] for b < batch, where
// op(P) is (M,K), op(Q) is (K,N), O is (M,N); strides in elements (0 = shared operand).
// o_f32: O is fp32 while P and Q are dt (fp16/bf16 products accumulated across calls).
static om_status *gemm_rm_to(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tp, int tq, int64_t M,
                             int64_t N, int64_t K, double alpha, const void *P, int64_t sP, const void *Q, int64_t sQ,
                             double beta, void *O, int64_t sO, int64_t batch, int o_f32) {
    if (M == 0 || N == 0 || batch == 0) return NULL;
    cudaDataType t;
    cublasComputeType_t ct;
    if (blas_types(dt, &t, &ct)) return omc_err_dtype(ctx, 0, dt);
    const cudaDataType to = o_f32 ? CUDA_R_32F : t;
    size_t es = o_f32 ? sizeof(float) : dtype_size(dt);
    if (K == 0) {   // a product over nothing: beta O (only beta 0 and 1 occur)
        if (beta == 0)
            for (int64_t b = 0; b < batch; b++)
                OMC_TRY(omc_cuda(cudaMemsetAsync((char *)O + (size_t)(b * sO) * es, 0, (size_t)(M * N) * es, stream_of(x)),
                                 "cudaMemsetAsync"));
        return NULL;
    }
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX)
        return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s' (%s): GEMM dims exceed cuBLAS's int range", omc_node_name(ctx),
                       omc_op_name(ctx));
    float af = (float)alpha, bf = (float)beta;
    const void *pa = dt == OM_F64 ? (const void *)&alpha : (const void *)&af;
    const void *pb = dt == OM_F64 ? (const void *)&beta : (const void *)&bf;
    int lda = (int)(tp ? M : K), ldb = (int)(tq ? K : N), ldc = (int)N;
    cublasHandle_t h = (cublasHandle_t)x->cublas;
    cublasOperation_t oq = tq ? CUBLAS_OP_T : CUBLAS_OP_N, op = tp ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (batch == 1)
        s = cublasGemmEx(h, oq, op, (int)N, (int)M, (int)K, pa, Q, t, ldb, P, t, lda, pb, O, to, ldc, ct,
                         CUBLAS_GEMM_DEFAULT);
    else
        s = cublasGemmStridedBatchedEx(h, oq, op, (int)N, (int)M, (int)K, pa, Q, t, ldb, sQ, P, t, lda, sP, pb, O, to,
                                       ldc, sO, (int)batch, ct, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return blas_err(ctx, s, "cublasGemmEx");
    return NULL;
}

static om_status *gemm_rm(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tp, int tq, int64_t M,
                          int64_t N, int64_t K, double alpha, const void *P, int64_t sP, const void *Q, int64_t sQ,
                          double beta, void *O, int64_t sO, int64_t batch) {
    return gemm_rm_to(ctx, x, dt, tp, tq, M, N, K, alpha, P, sP, Q, sQ, beta, O, sO, batch, 0);
}

// ---- cuBLASLt with a bias epilogue -------------------------------------------------------------
// y(M,N) = x(M,K) op(W) + bias(N), row-major. As column-major: y^T (N,M) = op(W)^T x^T, and
// the epilogue's bias runs along the rows of y^T, i.e. per output column of y.
// With CUBLASLT_EPILOGUE_GELU_BIAS y = gelu_tanh(x op(W) + bias); GELU_AUX_BIAS also writes the
// pre-activation into aux (same layout as y: leading dimension N, which Lt wants divisible by 8).

struct lt_key { int dt, tb; int64_t M, N, K; int epi; };
struct lt_entry { lt_key k; int ok; cublasLtMatmulAlgo_t algo; };
#define LT_CACHE 256
static lt_entry lt_cache[LT_CACHE];
static int lt_n;
static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;

om_status *omc_gemm_epilogue(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tb, int64_t M,
                             int64_t N, int64_t K, const void *X, const void *W, const void *bias, void *Y,
                             cublasLtEpilogue_t epi, void *aux, int *done) {
    *done = 0;
    (void)ctx;   // failures here are not errors: the caller takes the plain GEMM path
    cudaDataType t;
    cublasComputeType_t ct;
    if (blas_types(dt, &t, &ct) || dt == OM_F64) return NULL;   // fp64: the plain path
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || K == 0) return NULL;
    // Lt wants 16-byte aligned pointers for the fast kernels; otherwise take the plain path
    if (((uintptr_t)X | (uintptr_t)W | (uintptr_t)Y | (uintptr_t)bias | (uintptr_t)aux) & 15) return NULL;
    if (aux && N % 8) return NULL;   // the aux leading dimension must be a multiple of 8
    cublasLtHandle_t lt = (cublasLtHandle_t)x->cublaslt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    lt_key key;
    memset(&key, 0, sizeof key);   // compared with memcmp: the padding must be zero too
    key.dt = (int)dt, key.tb = tb, key.M = M, key.N = N, key.K = K, key.epi = (int)epi;
    lt_entry *hit = NULL;
    if (cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return NULL;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cudaDataType bias_t = t;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof bias_t);
    if (aux) {
        int64_t aux_ld = N;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    }
    // A = W as column-major: W (K,N) row-major is (N,K) col-major; W (N,K) row-major with transB is (K,N)
    if (tb) cublasLtMatrixLayoutCreate(&la, t, (uint64_t)K, (uint64_t)N, K);
    else cublasLtMatrixLayoutCreate(&la, t, (uint64_t)N, (uint64_t)K, N);
    cublasLtMatrixLayoutCreate(&lb, t, (uint64_t)K, (uint64_t)M, K);   // x (M,K) row-major = (K,M) col-major
    cublasLtMatrixLayoutCreate(&lc, t, (uint64_t)N, (uint64_t)M, N);
    pthread_mutex_lock(&lt_lock);
    for (int i = 0; i < lt_n; i++)
        if (!memcmp(&lt_cache[i].k, &key, sizeof key)) { hit = &lt_cache[i]; break; }
    if (!hit) {
        cublasLtMatmulHeuristicResult_t res;
        int n = 0;
        size_t ws = x->workspace_size;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &n);
        lt_entry e;
        memset(&e, 0, sizeof e);
        e.k = key;
        e.ok = s == CUBLAS_STATUS_SUCCESS && n > 0;
        if (e.ok) e.algo = res.algo;
        if (lt_n < LT_CACHE) { lt_cache[lt_n] = e; hit = &lt_cache[lt_n++]; }
        else { lt_cache[0] = e; hit = &lt_cache[0]; }
    }
    lt_entry e = *hit;
    pthread_mutex_unlock(&lt_lock);
    if (e.ok) {
        float one = 1.0f, zero = 0.0f;
        cublasStatus_t s = cublasLtMatmul(lt, op, &one, W, la, X, lb, &zero, Y, lc, Y, lc, &e.algo, x->workspace,
                                          x->workspace_size, stream_of(x));
        if (s == CUBLAS_STATUS_SUCCESS) *done = 1;   // otherwise the caller takes the plain path
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    return NULL;
}

// y is (rows, cols); y[i, j] = beta * c[(i * sm + j * sn)] — the bias written before a beta=1 GEMM
template <typename T>
__global__ void broadcast_rows_kernel(T *y, const T *c, int64_t rows, int64_t cols, int64_t sm, int64_t sn, float beta) {
    GRID_STRIDE(i, rows * cols) {
        int64_t r = i / cols, j = i - r * cols;
        y[i] = st<T>((typename acc<T>::t)beta * ld(c[r * sm + j * sn]));
    }
}

om_status *omc_fill_bias(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *y, const void *c,
                         int64_t rows, int64_t cols, int64_t sm, int64_t sn, double beta) {
    if (rows * cols == 0) return NULL;
    OMC_DISPATCH_FLOAT(dt, ctx, 0, {
        broadcast_rows_kernel<T><<<grid_for(rows * cols), OMC_THREADS, 0, stream_of(x)>>>((T *)y, (const T *)c, rows,
                                                                                          cols, sm, sn, (float)beta);
    });
    return omc_launched(ctx);
}

// ---- numpy matmul geometry (as matmul.c) ---------------------------------------------------------

typedef om_mm_geom mm_geom;   /* csrc/ops/matmul_geom.h, shared with the CPU kernels */

static om_status *mm_geometry(const om_kernel_ctx *ctx, int ra, const int64_t *a, int rb, const int64_t *b, int ta,
                              int tb, mm_geom *g) {
    int rc = om_mm_geometry(ra, a, rb, b, ta, tb, g);
    if (rc == OM_MM_BAD_RANK)
        return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s' (%s): operands must have rank >= 1", omc_node_name(ctx),
                       omc_op_name(ctx));
    if (rc != OM_MM_OK)
        return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s' (%s): operand shapes do not multiply", omc_node_name(ctx),
                       omc_op_name(ctx));
    return NULL;
}

struct bgemm {
    int64_t Mo, No, Ko;
    int tp, tq;
    const void *P, *Q;
    void *O;
    const int64_t *p_str, *q_str, *o_str;
};


// O[o] (+)= alpha op(P[p]) op(Q[q]) over the broadcast batch; O reduced where o_str is 0.
static om_status *bgemm_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, const mm_geom *g,
                            const bgemm *m, double alpha) {
    const size_t es = dtype_size(dt);
    const int64_t psz = m->Mo * m->Ko, qsz = m->Ko * m->No, osz = m->Mo * m->No;
    if (g->nbatch == 1)
        return gemm_rm(ctx, x, dt, m->tp, m->tq, m->Mo, m->No, m->Ko, alpha, m->P, 0, m->Q, 0, 0.0, m->O, 0, 1);
    int64_t on = 1;
    for (int i = 0; i < g->nb; i++) on *= m->o_str[i] ? g->batch[i] : 1;
    if (g->nbatch == 0)
        return omc_cuda(cudaMemsetAsync(m->O, 0, (size_t)(on * osz) * es, stream_of(x)), "cudaMemsetAsync");
    int o_full = om_mm_batch_is_contiguous(g, m->o_str, osz), o_reduced = om_mm_batch_is_broadcast(g, m->o_str);
    int p_c = om_mm_batch_is_contiguous(g, m->p_str, psz), q_c = om_mm_batch_is_contiguous(g, m->q_str, qsz);
    int p_b = om_mm_batch_is_broadcast(g, m->p_str), q_b = om_mm_batch_is_broadcast(g, m->q_str);
    // stacked rows against a shared Q: one tall GEMM
    if (!m->tp && o_full && p_c && q_b)
        return gemm_rm(ctx, x, dt, 0, m->tq, g->nbatch * m->Mo, m->No, m->Ko, alpha, m->P, 0, m->Q, 0, 0.0, m->O, 0, 1);
    // sum over the batch of P^T Q with both stacked: one GEMM with inner dim batch*Ko
    if (m->tp && !m->tq && o_reduced && p_c && q_c)
        return gemm_rm(ctx, x, dt, 1, 0, m->Mo, m->No, g->nbatch * m->Ko, alpha, m->P, 0, m->Q, 0, 0.0, m->O, 0, 1);
    // one strided-batched call when every operand is stacked or shared over the whole batch
    if (o_full && (p_c || p_b) && (q_c || q_b))
        return gemm_rm(ctx, x, dt, m->tp, m->tq, m->Mo, m->No, m->Ko, alpha, m->P, p_b ? 0 : psz, m->Q, q_b ? 0 : qsz,
                       0.0, m->O, osz, g->nbatch);
    // general: batched over the innermost batch dim, looped over the others (output full),
    // or one GEMM per batch index accumulating into a reduced output — fp16/bf16 accumulate
    // into an fp32 temporary (each GEMM would round its partial sum otherwise), rounded once
    int last = g->nb - 1;
    while (last > 0 && g->batch[last] == 1) last--;
    double beta = 0.0;
    const int acc32 = !o_full && om_dtype_is_half(dt);
    void *O = m->O;
    const size_t oes = acc32 ? sizeof(float) : es;
    if (!o_full) {
        if (acc32) OMC_TRY(omc_temp_alloc(x, sizeof(float) * (size_t)(on * osz), &O));
        om_status *st = omc_cuda(cudaMemsetAsync(O, 0, (size_t)(on * osz) * oes, stream_of(x)), "cudaMemsetAsync");
        if (st) {
            if (acc32) omc_temp_free(x, O);
            return st;
        }
        beta = 1.0;
    }
    int64_t inner = o_full ? g->batch[last] : 1;
    int64_t idx[OM_MAX_RANK] = {0};
    int64_t po = 0, qo = 0, oo = 0;
    om_status *st = NULL;
    for (int64_t t = 0; t < g->nbatch && !st; t += inner) {
        st = gemm_rm_to(ctx, x, dt, m->tp, m->tq, m->Mo, m->No, m->Ko, alpha, (const char *)m->P + po * es,
                        o_full ? m->p_str[last] : 0, (const char *)m->Q + qo * es, o_full ? m->q_str[last] : 0, beta,
                        (char *)O + oo * oes, o_full ? m->o_str[last] : 0, inner, acc32);
        for (int d = (o_full ? last - 1 : g->nb - 1); d >= 0; d--) {
            po += m->p_str[d]; qo += m->q_str[d]; oo += m->o_str[d];
            if (++idx[d] < g->batch[d]) break;
            po -= idx[d] * m->p_str[d]; qo -= idx[d] * m->q_str[d]; oo -= idx[d] * m->o_str[d];
            idx[d] = 0;
        }
    }
    if (acc32) {
        if (!st) {
            int64_t n = on * osz;
            OMC_DISPATCH_FLOAT(dt, ctx, 0, {
                omc_round_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)m->O, (const A *)O, n);
            });
            st = omc_launched(ctx);
        }
        omc_temp_free(x, O);
    }
    return st;
}

// ---- MatMul / FusedMatMul -------------------------------------------------------------------------

// A is (batch..., M, K) (or (K) / transposed), B is (batch..., K, N), Y is (batch..., M, N)
om_status *matmul_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *a = &ctx->in[0], *b = &ctx->in[1];
    int fused = !strcmp(omc_op_name(ctx), "FusedMatMul");
    int ta = fused && attr_i(ctx, "transA", 0) != 0, tb = fused && attr_i(ctx, "transB", 0) != 0;
    double alpha = fused ? attr_f(ctx, "alpha", 1.0f) : 1.0;
    if (b->dtype != a->dtype) return omc_err_dtype(ctx, 1, b->dtype);
    mm_geom g;
    OMC_TRY(mm_geometry(ctx, a->rank, a->dims, b->rank, b->dims, ta, tb, &g));
    bgemm m = {g.M, g.N, g.K, g.ta, g.tb, a->data, b->data, ctx->out[0].data, g.a_str, g.b_str, g.y_str};
    return bgemm_run(ctx, x, a->dtype, &g, &m, alpha);
}

// MatMulGrad(dY, other, Shape(x); input, transA, transB, alpha) -> dx, batch dims where x was
// broadcast summed (see matmul.c for the four cases)
om_status *matmul_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int which = (int)attr_i(ctx, "input", 0);
    int ta = attr_i(ctx, "transA", 0) != 0, tb = attr_i(ctx, "transB", 0) != 0;
    double alpha = attr_f(ctx, "alpha", 1.0f);
    const om_tensor *dy = &ctx->in[0], *other = &ctx->in[1];
    int64_t xd[OM_MAX_RANK];
    int xr = host_ints(ctx, x, 2, xd, OM_MAX_RANK);
    if (xr < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "MatMulGrad node '%s': the operand shape must be known at plan time",
                               omc_node_name(ctx));
    mm_geom g;
    if (which == 0) OMC_TRY(mm_geometry(ctx, xr, xd, other->rank, other->dims, ta, tb, &g));
    else OMC_TRY(mm_geometry(ctx, other->rank, other->dims, xr, xd, ta, tb, &g));
    const int64_t M = g.M, N = g.N, K = g.K;
    void *dx = ctx->out[0].data;
    bgemm m;
    if (which == 0) {
        if (!g.ta) m = (bgemm){M, K, N, 0, !g.tb, dy->data, other->data, dx, g.y_str, g.b_str, g.a_str};
        else m = (bgemm){K, M, N, g.tb, 1, other->data, dy->data, dx, g.b_str, g.y_str, g.a_str};
    } else {
        if (!g.tb) m = (bgemm){K, N, M, !g.ta, 0, other->data, dy->data, dx, g.a_str, g.y_str, g.b_str};
        else m = (bgemm){N, K, M, 1, g.ta, dy->data, other->data, dx, g.y_str, g.a_str, g.b_str};
    }
    return bgemm_run(ctx, x, dy->dtype, &g, &m, alpha);
}

// ---- Gemm ---------------------------------------------------------------------------------------------

// A is (M,K) or (K,M), B is (K,N) or (N,K), C broadcasts to (M,N), Y is (M,N)
om_status *gemm_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *a = &ctx->in[0], *b = &ctx->in[1];
    int ta = attr_i(ctx, "transA", 0) != 0, tb = attr_i(ctx, "transB", 0) != 0;
    double alpha = attr_f(ctx, "alpha", 1.0f), beta = attr_f(ctx, "beta", 1.0f);
    if (a->rank != 2 || b->rank != 2) return omc_err_unsupported(ctx, "Gemm operands must be 2-D");
    int64_t M = ta ? a->dims[1] : a->dims[0], K = ta ? a->dims[0] : a->dims[1], N = tb ? b->dims[0] : b->dims[1];
    const om_tensor *c = present(ctx, 2) ? &ctx->in[2] : NULL;
    om_dtype dt = a->dtype;
    void *y = ctx->out[0].data;
    if (c && beta != 0.0 && M > 0 && N > 0) {
        int64_t cm = c->rank == 2 ? c->dims[0] : 1, cn = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
        if (!ta && alpha == 1.0 && beta == 1.0 && cm == 1 && cn == N) {   // a bias row: the Lt epilogue
            int done = 0;
            OMC_TRY(omc_gemm_epilogue(ctx, x, dt, tb, M, N, K, a->data, b->data, c->data, y, CUBLASLT_EPILOGUE_BIAS,
                                     NULL, &done));
            if (done) return NULL;
        }
        OMC_TRY(omc_fill_bias(ctx, x, dt, y, c->data, M, N, cm == 1 ? 0 : cn, cn == 1 ? 0 : 1, beta));
        return gemm_rm(ctx, x, dt, ta, tb, M, N, K, alpha, a->data, 0, b->data, 0, 1.0, y, 0, 1);
    }
    return gemm_rm(ctx, x, dt, ta, tb, M, N, K, alpha, a->data, 0, b->data, 0, 0.0, y, 0, 1);
}

// ---- shared with fused.cu, rnn.cu ------------------------------------------------------------------

// db (N) = column sums of dy (M, N), or db[0] = the sum of everything: reduce.cu's reduction
// (fp32 accumulation, split over row chunks when there are few columns)
om_status *omc_column_sum(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *db, const void *dy,
                          int64_t M, int64_t N, int to_scalar) {
    om_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.rank = 2;
    t.dims[0] = M;
    t.dims[1] = N;
    const uint8_t axes[2] = {1, (uint8_t)(to_scalar ? 1 : 0)};
    return omc_reduce(ctx, x, 0 /* RED_SUM */, &t, dy, axes, db, 1.0);
}

// Exposed for other files (Einsum, attention): row-major batched GEMM.
om_status *omc_gemm(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tp, int tq, int64_t M, int64_t N,
                    int64_t K, double alpha, const void *P, int64_t sP, const void *Q, int64_t sQ, double beta, void *O,
                    int64_t sO, int64_t batch) {
    return gemm_rm(ctx, x, dt, tp, tq, M, N, K, alpha, P, sP, Q, sQ, beta, O, sO, batch);
}

// The same with O in fp32 while P and Q are fp16/bf16: a product summed over several calls
// (beta 1) is rounded once, by the caller, at the end.
om_status *omc_gemm_f32_out(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tp, int tq, int64_t M,
                            int64_t N, int64_t K, double alpha, const void *P, int64_t sP, const void *Q, int64_t sQ,
                            double beta, float *O, int64_t sO, int64_t batch) {
    return gemm_rm_to(ctx, x, dt, tp, tq, M, N, K, alpha, P, sP, Q, sQ, beta, O, sO, batch, 1);
}
