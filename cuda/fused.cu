// fused.cu — the fusion passes' ops (fused.c): BiasGelu, BiasDropout (dropout(x + b) + residual,
// the Dropout RNG stream), SimplifiedLayerNormalization (RMSNorm) and their backward ops.
// (MatMulBias / MatMulBiasGrad are GEMMs: matmul.cu.) Bias gradients are column sums of the
// computed dx, read back after it is written (these ops run in place: dx may be dy's buffer).
#include <math.h>

#include "common.cuh"
#include "gelu.cuh"


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

// y = gelu(x) over n elements (y may be x): MatMulBiasGelu's GELU after its GEMM (matmul.cu)
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
// gradient and cuBLASLt's DGELU epilogue did not take the GEMM (matmul.cu)
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

static om_status *bias_gelu_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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

static om_status *bias_gelu_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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

static om_status *dropout_params(const om_kernel_ctx *ctx, const om_cuda_exec *x, int ri, int ti, double *ratio,
                                 int *training) {
    *ratio = 0.5;
    *training = 0;
    if (present(ctx, ri) && host_scalar(ctx, x, ri, ratio))
        return omc_err_unsupported(ctx, "a dropout ratio that is not known at plan time");
    if (present(ctx, ti)) {
        double t;
        if (host_scalar(ctx, x, ti, &t)) return omc_err_unsupported(ctx, "a training_mode that is not known at plan time");
        *training = t != 0;
    }
    if (*training && !(*ratio >= 0.0 && *ratio <= 1.0))
        return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': dropout ratio %g is outside [0, 1]", omc_node_name(ctx), *ratio);
    return NULL;
}

static om_status *bias_dropout_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    double ratio;
    int training;
    OMC_TRY(dropout_params(ctx, x, 3, 4, &ratio, &training));
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
    float scale = ratio < 1.0 ? (float)(1.0 / (1.0 - ratio)) : 0.0f;
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
static om_status *bias_dropout_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dy = &ctx->in[0];
    double ratio;
    int training;
    OMC_TRY(dropout_params(ctx, x, 2, 3, &ratio, &training));
    int64_t n = numel(dy), cols = dy->rank ? dy->dims[dy->rank - 1] : 1;
    if (!n) return NULL;
    const uint8_t *mask = training && present(ctx, 1) ? (const uint8_t *)ctx->in[1].data : NULL;
    float scale = !training ? 1.0f : ratio < 1.0 ? (float)(1.0 / (1.0 - ratio)) : 0.0f;
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

static om_status *rms_norm_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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

static om_status *rms_norm_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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

extern const omc_kernel_entry omc_kernels_fused[] = {
    {"BiasGelu", "ortmod", bias_gelu_cuda},
    {"BiasGeluGrad", "ortmod", bias_gelu_grad_cuda},
    {"BiasDropout", "ortmod", bias_dropout_cuda},
    {"BiasDropoutGrad", "ortmod", bias_dropout_grad_cuda},
    {"SimplifiedLayerNormalization", "ortmod", rms_norm_cuda},
    {"SimplifiedLayerNormalizationGrad", "ortmod", rms_norm_grad_cuda},
    OMC_TABLE_END,
};
