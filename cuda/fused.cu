// fused.cu — the fusion passes' ops (fused.c): BiasGelu, BiasDropout (dropout(x + b) + residual,
// the Dropout RNG stream), SimplifiedLayerNormalization (RMSNorm), MatMulBias and MatMulBiasGelu
// (GEMMs with the bias and GELU in cuBLASLt's epilogue: gemm.cuh) and their backward ops. Bias
// gradients are column sums of the computed dx, read back after it is written (these ops run in
// place: dx may be dy's buffer).
#include <math.h>

#include "common.cuh"
#include "gelu.cuh"
#include "gemm.cuh"

static int gelu_tanh_mode(const om_kernel_ctx *ctx) {
    const char *a = attr_s(ctx, "approximate", "none");
    return !strcmp(a, "tanh") ? 1 : !strcmp(a, "none") ? 0 : -1;
}

// x, y are (rows, cols), b is (cols) or (1): y = gelu(x + b)
template <typename T>
__global__ void bias_gelu_kernel(T *y, const T *x, const T *b, int64_t n, int64_t cols, int bstep, int tanh_mode) {
    GRID_STRIDE(i, n) {
        y[i] = st<T>(gelu_of(ld(x[i]) + ld(b[bstep ? i % cols : 0]), tanh_mode));
    }
}

// y = gelu(x) over n elements (y may be x): MatMulBiasGelu's GELU after its GEMM
template <typename T> __global__ void gelu_kernel(T *y, const T *x, int64_t n, int tanh_mode) {
    GRID_STRIDE(i, n) {
        y[i] = st<T>(gelu_of(ld(x[i]), tanh_mode));
    }
}

om_status *omc_gelu(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *y, const void *src, int64_t n,
                    int tanh_mode) {
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(dt, ctx, 0, {
        gelu_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)y, (const T *)src, n, tanh_mode);
    });
    return omc_launched(ctx);
}

// g = g * gelu'(x) over n elements, in place: MatMulBiasGrad's dx when it carries the GELU's
// gradient and cuBLASLt's DGELU epilogue did not take the GEMM
template <typename T> __global__ void gelu_grad_in_place_kernel(T *g, const T *x, int64_t n, int tanh_mode) {
    GRID_STRIDE(i, n) g[i] = st<T>(ld(g[i]) * gelu_deriv(ld(x[i]), tanh_mode));
}

om_status *omc_gelu_grad_in_place(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *g, const void *src,
                                  int64_t n, int tanh_mode) {
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(dt, ctx, 0, {
        gelu_grad_in_place_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)g, (const T *)src, n, tanh_mode);
    });
    return omc_launched(ctx);
}

om_status *bias_gelu_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    int m = gelu_tanh_mode(ctx);
    if (m < 0) return omc_err_unsupported(ctx, "approximate must be \"none\" or \"tanh\"");
    int64_t n = numel(in), cols = in->rank ? in->dims[in->rank - 1] : 1;
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 0, {
        bias_gelu_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)in->data,
                                                                           (const T *)ctx->in[1].data, n, cols,
                                                                           numel(&ctx->in[1]) != 1, m);
    });
    return omc_launched(ctx);
}

// dy, x are (rows, cols), b (cols) or (1): g = dy * gelu'(x + b) into out (dx, or a temporary for db)
template <typename T>
__global__ void bias_gelu_grad_kernel(T *g_out, const T *dy, const T *x, const T *b, int64_t n, int64_t cols, int bstep,
                                      int tanh_mode) {
    GRID_STRIDE(i, n) {
        g_out[i] = st<T>(ld(dy[i]) * gelu_deriv(ld(x[i]) + ld(b[bstep ? i % cols : 0]), tanh_mode));
    }
}

om_status *bias_gelu_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[1];
    int m = gelu_tanh_mode(ctx);
    if (m < 0) return omc_err_unsupported(ctx, "approximate must be \"none\" or \"tanh\"");
    int64_t n = numel(in), cols = in->rank ? in->dims[in->rank - 1] : 1;
    if (!n) return NULL;
    int64_t nb = numel(&ctx->in[2]);
    void *g = wanted(ctx, 0) ? ctx->out[0].data : NULL;
    void *tmp = NULL;
    if (!g && wanted(ctx, 1)) { OMC_TRY(omc_temp_alloc(x, nbytes(in), &tmp)); g = tmp; }
    if (!g) return NULL;
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 1, {
        bias_gelu_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            (T *)g, (const T *)ctx->in[0].data, (const T *)in->data, (const T *)ctx->in[2].data, n, cols, nb != 1, m);
    });
    om_status *st = omc_launched(ctx);
    if (!st && wanted(ctx, 1)) st = omc_column_sum(ctx, x, in->dtype, ctx->out[1].data, g, n / cols, cols, nb == 1);
    if (tmp) omc_temp_free(x, tmp);
    return st;
}

// ---- BiasDropout ------------------------------------------------------------------------------------

// x, y, mask are (n) = (rows, cols); b (cols) or (1) or NULL; residual broadcast into x (rstr walk) or NULL
struct res_walk { int n; int64_t dims[OM_MAX_RANK], str[OM_MAX_RANK]; int same; };

__device__ __forceinline__ int64_t res_off(const res_walk &w, int64_t k) {
    if (w.same) return k;
    int64_t off = 0;
    for (int d = w.n - 1; d >= 0 && k; d--) {
        int64_t q = k / w.dims[d];
        off += (k - q * w.dims[d]) * w.str[d];
        k = q;
    }
    return off;
}

template <typename T>
__global__ void bias_dropout_kernel(T *y, uint8_t *mask, const T *x_, const T *b, const T *res, res_walk rw, int64_t n,
                                   int64_t cols, int bstep, int drop, uint64_t seed, float ratio, float scale) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, n) {
        A v = ld(x_[k]) + (b ? ld(b[bstep ? k % cols : 0]) : (A)0);
        if (drop) {
            int keep = rand_uniform(seed, (uint64_t)k) >= ratio;
            if (mask) mask[k] = (uint8_t)keep;
            v = keep ? v * (A)scale : (A)0;
        } else if (mask) {
            mask[k] = 1;
        }
        if (res) v += ld(res[res_off(rw, k)]);
        y[k] = st<T>(v);
    }
}

om_status *bias_dropout_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    double ratio, kept_scale;
    int training;
    OMC_TRY(omc_dropout_params(ctx, x, 3, 4, &ratio, &training, &kept_scale));
    int64_t n = numel(in), cols = in->rank ? in->dims[in->rank - 1] : 1;
    if (!n) return NULL;
    res_walk rw;
    memset(&rw, 0, sizeof rw);
    rw.same = 1;
    if (present(ctx, 2) && numel(&ctx->in[2]) != n) {   // residual smaller than x: broadcast walk
        const om_tensor *r = &ctx->in[2];
        rw.same = 0;
        rw.n = in->rank;
        int64_t s = 1;
        for (int d = in->rank - 1; d >= 0; d--) {
            int dr = d - (in->rank - r->rank);
            int64_t rd = dr >= 0 ? r->dims[dr] : 1;
            rw.dims[d] = in->dims[d];
            rw.str[d] = rd == 1 ? 0 : s;
            s *= rd;
        }
    }
    int drop = training && ratio > 0.0;
    float scale = (float)kept_scale;
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 0, {
        bias_dropout_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            (T *)ctx->out[0].data, wanted(ctx, 1) ? (uint8_t *)ctx->out[1].data : NULL, (const T *)in->data,
            present(ctx, 1) ? (const T *)ctx->in[1].data : NULL, present(ctx, 2) ? (const T *)ctx->in[2].data : NULL, rw,
            n, cols, present(ctx, 1) && numel(&ctx->in[1]) != 1, drop, ctx->seed, (float)ratio, scale);
    });
    return omc_launched(ctx);
}

// dy, mask, dx are (n): dx = mask ? dy * scale : 0 (no mask: dy)
template <typename T>
__global__ void bias_dropout_grad_kernel(T *dx, const T *dy, const uint8_t *mask, int64_t n, float scale) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, n) dx[k] = mask ? (mask[k] ? st<T>(ld(dy[k]) * (A)scale) : st<T>((A)0)) : dy[k];
}

// BiasDropoutGrad(dy, mask?, ratio?, training_mode?, Shape(b)?) -> (dx?, db?)
om_status *bias_dropout_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dy = &ctx->in[0];
    double ratio, kept_scale;
    int training;
    OMC_TRY(omc_dropout_params(ctx, x, 2, 3, &ratio, &training, &kept_scale));
    int64_t n = numel(dy), cols = dy->rank ? dy->dims[dy->rank - 1] : 1;
    if (!n) return NULL;
    const uint8_t *mask = training && present(ctx, 1) ? (const uint8_t *)ctx->in[1].data : NULL;
    float scale = training ? (float)kept_scale : 1.0f;
    void *g = wanted(ctx, 0) ? ctx->out[0].data : NULL, *tmp = NULL;
    if (!g && wanted(ctx, 1)) { OMC_TRY(omc_temp_alloc(x, nbytes(dy), &tmp)); g = tmp; }
    if (!g) return NULL;
    OMC_DISPATCH_FLOAT(dy->dtype, ctx, 0, {
        bias_dropout_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)g, (const T *)dy->data, mask, n, scale);
    });
    om_status *st = omc_launched(ctx);
    if (!st && wanted(ctx, 1))
        st = omc_column_sum(ctx, x, dy->dtype, ctx->out[1].data, g, n / cols, cols, numel(&ctx->out[1]) == 1);
    if (tmp) omc_temp_free(x, tmp);
    return st;
}

// ---- SimplifiedLayerNormalization (RMSNorm over the last axis) --------------------------------------

// x, y are (rows, cols), scale (cols), inv_rms (rows) or NULL in the math type A (fp32 for
// fp16/bf16: fused.c's statistics dtype); one block per row
template <typename T>
__global__ void rms_norm_kernel(T *y, typename acc<T>::t *inv_out, const T *x, const T *scale, int64_t rows, int64_t cols, float eps) {
    typedef typename acc<T>::t A;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * cols;
        A ss = 0;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) { A v = ld(xr[j]); ss += v * v; }
        A inv = (A)1 / sqrt(block_sum(ss) / (A)cols + (A)eps);
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) y[r * cols + j] = st<T>(ld(xr[j]) * inv * ld(scale[j]));
        if (inv_out && threadIdx.x == 0) inv_out[r] = inv;
    }
}

static unsigned rows_grid(int64_t rows) { return (unsigned)(rows < 65535 * 16 ? (rows > 0 ? rows : 1) : 65535 * 16); }
static int cols_threads(int64_t c) { return c >= 1024 ? 1024 : c >= 256 ? 256 : 64; }

om_status *rms_norm_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    if (norm_axis(attr_i(ctx, "axis", -1), in->rank) != in->rank - 1) return omc_err_unsupported(ctx, "only the last axis");
    int64_t cols = in->dims[in->rank - 1], rows = cols ? numel(in) / cols : 0;
    if (!rows) return NULL;
    float eps = attr_f(ctx, "epsilon", 1e-5f);
    if (wanted(ctx, 1) && ctx->out[1].dtype != om_dtype_stat(in->dtype)) return omc_err_unsupported(ctx, "inv_rms dtype");
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 0, {
        rms_norm_kernel<T><<<rows_grid(rows), cols_threads(cols), 0, stream_of(x)>>>(
            (T *)ctx->out[0].data, wanted(ctx, 1) ? (A *)ctx->out[1].data : NULL, (const T *)in->data,
            (const T *)ctx->in[1].data, rows, cols, eps);
    });
    return omc_launched(ctx);
}

// dy, x, dx are (rows, cols); scale (cols); inv_rms (rows):
//   dx_j = r g_j s_j - x_j r^3 / cols * sum_k g_k s_k x_k
template <typename T>
__global__ void rms_norm_dx_kernel(T *dx, const T *dy, const T *x, const T *scale, const typename acc<T>::t *inv, int64_t rows,
                                   int64_t cols) {
    typedef typename acc<T>::t A;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *g = dy + r * cols, *xr = x + r * cols;
        A rr = inv[r], dot = 0;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += ld(g[j]) * ld(scale[j]) * ld(xr[j]);
        A c3 = rr * rr * rr * block_sum(dot) / (A)cols;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
            dx[r * cols + j] = st<T>(rr * ld(g[j]) * ld(scale[j]) - ld(xr[j]) * c3);
    }
}

// ds_j = sum_rows g_j x_j r — one thread per column (coalesced across columns)
template <typename T>
__global__ void rms_norm_ds_kernel(T *ds, const T *dy, const T *x, const typename acc<T>::t *inv, int64_t rows, int64_t cols) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(j, cols) {
        A s = 0;
        for (int64_t r = 0; r < rows; r++) s += ld(dy[r * cols + j]) * ld(x[r * cols + j]) * inv[r];
        ds[j] = st<T>(s);
    }
}

om_status *rms_norm_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[1];
    if (ctx->in[3].dtype != om_dtype_stat(in->dtype)) return omc_err_dtype(ctx, 3, ctx->in[3].dtype);
    int64_t cols = in->dims[in->rank - 1], rows = cols ? numel(in) / cols : 0;
    if (!rows) return NULL;
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 1, {
        // ds first: dx may overwrite dy
        if (wanted(ctx, 1))
            rms_norm_ds_kernel<T><<<grid_for(cols), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[1].data, (const T *)ctx->in[0].data, (const T *)in->data, (const A *)ctx->in[3].data, rows, cols);
        if (wanted(ctx, 0))
            rms_norm_dx_kernel<T><<<rows_grid(rows), cols_threads(cols), 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const T *)in->data, (const T *)ctx->in[2].data,
                (const A *)ctx->in[3].data, rows, cols);
    });
    return omc_launched(ctx);
}

// ---- MatMulBias / MatMulBiasGelu / MatMulBiasGrad: matmul.cu's GEMMs and epilogues -------------------

// x is (M, K) (leading dims flattened), W is (K, N) or (N, K) with transB, b is (N) or (1); y is (M, N)
om_status *matmul_bias_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *W = &ctx->in[1], *b = &ctx->in[2];
    int tb = attr_i(ctx, "transB", 0) != 0;
    int64_t K = X->dims[X->rank - 1], N = tb ? W->dims[0] : W->dims[1], M = 1;
    for (int d = 0; d + 1 < X->rank; d++) M *= X->dims[d];
    om_dtype dt = X->dtype;
    int64_t nb = numel(b);
    if (nb == N && M > 0 && N > 0) {
        int done = 0;
        OMC_TRY(omc_gemm_epilogue(ctx, x, dt, tb, M, N, K, X->data, W->data, b->data, ctx->out[0].data,
                                 CUBLASLT_EPILOGUE_BIAS, NULL, &done));
        if (done) return NULL;
    }
    OMC_TRY(omc_fill_bias(ctx, x, dt, ctx->out[0].data, b->data, M, N, 0, nb == 1 ? 0 : 1, 1.0));
    return omc_gemm(ctx, x, dt, 0, tb, M, N, K, 1.0, X->data, 0, W->data, 0, 1.0, ctx->out[0].data, 0, 1);
}

// MatMulBiasGelu: y = gelu(x op(W) + b), output 1 (when the backward wants it) z = x op(W) + b.
// approximate="tanh" is one cuBLASLt call: CUBLASLT_EPILOGUE_GELU_AUX_BIAS (GELU_BIAS without z)
// — cuBLASLt's GELU epilogue is the tanh approximation. approximate="none" (erf), and any shape
// Lt declines, compute z with MatMulBias's path (Lt's BIAS epilogue) and then run the GELU as
// one elementwise pass (omc_gelu); without z that pass runs in place on y.
om_status *matmul_bias_gelu_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *W = &ctx->in[1], *b = &ctx->in[2];
    int tb = attr_i(ctx, "transB", 0) != 0;
    const char *approx = attr_s(ctx, "approximate", "none");
    int tanh_mode = !strcmp(approx, "tanh");
    if (!tanh_mode && strcmp(approx, "none")) return omc_err_unsupported(ctx, "approximate must be \"none\" or \"tanh\"");
    int64_t K = X->dims[X->rank - 1], N = tb ? W->dims[0] : W->dims[1], M = 1;
    for (int d = 0; d + 1 < X->rank; d++) M *= X->dims[d];
    om_dtype dt = X->dtype;
    int64_t nb = numel(b);
    void *y = ctx->out[0].data, *z = wanted(ctx, 1) ? ctx->out[1].data : NULL;
    if (M == 0 || N == 0) return NULL;
    if (tanh_mode && nb == N) {
        int done = 0;
        OMC_TRY(omc_gemm_epilogue(ctx, x, dt, tb, M, N, K, X->data, W->data, b->data, y,
                                 z ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS, z, &done));
        if (done) return NULL;
    }
    void *pre = z ? z : y;   // the pre-activation's buffer
    int done = 0;
    if (nb == N)
        OMC_TRY(omc_gemm_epilogue(ctx, x, dt, tb, M, N, K, X->data, W->data, b->data, pre, CUBLASLT_EPILOGUE_BIAS, NULL,
                                 &done));
    if (!done) {
        OMC_TRY(omc_fill_bias(ctx, x, dt, pre, b->data, M, N, 0, nb == 1 ? 0 : 1, 1.0));
        OMC_TRY(omc_gemm(ctx, x, dt, 0, tb, M, N, K, 1.0, X->data, 0, W->data, 0, 1.0, pre, 0, 1));
    }
    return omc_gelu(ctx, x, dt, y, pre, M * N, tanh_mode);
}

// dy is (M, N), x is (M, K), W is (K, N) or (N, K); dx (M, K), dW like W, db (N) or (1)
om_status *matmul_bias_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int tb = attr_i(ctx, "transB", 0) != 0;
    int64_t xs[OM_MAX_RANK], ws[OM_MAX_RANK], bs[OM_MAX_RANK];
    int xr = host_ints(ctx, x, 3, xs, OM_MAX_RANK), wr = host_ints(ctx, x, 4, ws, OM_MAX_RANK);
    int br = host_ints(ctx, x, 5, bs, OM_MAX_RANK);
    if (xr < 1 || wr != 2 || br < 0)
        return OMC_ERR(OM_INVALID_ARGUMENT, "MatMulBiasGrad node '%s': operand shapes must be known at plan time",
                       omc_node_name(ctx));
    int64_t K = xs[xr - 1], N = tb ? ws[0] : ws[1], M = 1, nb = 1;
    for (int d = 0; d + 1 < xr; d++) M *= xs[d];
    for (int d = 0; d < br; d++) nb *= bs[d];
    om_dtype dt = ctx->in[0].dtype;
    const void *dy = ctx->in[0].data;
    if (wanted(ctx, 0)) {   // dx = dy op(W)^T
        if (!present(ctx, 2)) return OMC_ERR(OM_INTERNAL, "MatMulBiasGrad node '%s': dx wanted without W", omc_node_name(ctx));
        const void *gx = present(ctx, 6) ? ctx->in[6].data : NULL;   // gelu_x: dx becomes GeluGrad(dx, gelu_x)
        const char *approx = attr_s(ctx, "approximate", "none");
        const int tanh_mode = !strcmp(approx, "tanh");
        if (gx && !tanh_mode && strcmp(approx, "none"))
            return omc_err_unsupported(ctx, "approximate must be \"none\" or \"tanh\"");
        if (gx && ctx->in[6].dtype != dt) return omc_err_dtype(ctx, 6, ctx->in[6].dtype);
        int done = 0;
        // the tanh GELU's gradient in cuBLASLt's epilogue (DGELU reads gelu_x as its aux input):
        // dx = dy op(W)^T is y = x op(W') with x = dy (M, N) and W' = W read with !transB
        if (gx && tanh_mode)
            OMC_TRY(omc_gemm_epilogue(ctx, x, dt, !tb, M, K, N, dy, ctx->in[2].data, NULL, ctx->out[0].data,
                                     CUBLASLT_EPILOGUE_DGELU, (void *)gx, &done));
        if (!done) {
            OMC_TRY(omc_gemm(ctx, x, dt, 0, !tb, M, K, N, 1.0, dy, 0, ctx->in[2].data, 0, 0.0, ctx->out[0].data, 0, 1));
            if (gx) OMC_TRY(omc_gelu_grad_in_place(ctx, x, dt, ctx->out[0].data, gx, M * K, tanh_mode));
        }
    }
    if (wanted(ctx, 1)) {   // dW: the batch reduction happens inside the GEMM's inner dim M
        if (!present(ctx, 1)) return OMC_ERR(OM_INTERNAL, "MatMulBiasGrad node '%s': dW wanted without x", omc_node_name(ctx));
        if (!tb) OMC_TRY(omc_gemm(ctx, x, dt, 1, 0, K, N, M, 1.0, ctx->in[1].data, 0, dy, 0, 0.0, ctx->out[1].data, 0, 1));
        else OMC_TRY(omc_gemm(ctx, x, dt, 1, 0, N, K, M, 1.0, dy, 0, ctx->in[1].data, 0, 0.0, ctx->out[1].data, 0, 1));
    }
    if (wanted(ctx, 2)) OMC_TRY(omc_column_sum(ctx, x, dt, ctx->out[2].data, dy, M, N, nb != N));
    return NULL;
}
