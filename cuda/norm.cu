// norm.cu — norm.c's ops on the CUDA provider: BatchNormalization and BatchNormalizationGrad, and
// their ReLU-fused forms BatchNormRelu and BatchNormReluGrad (the same kernels with a relu flag:
// Relu applied to each stored Y, ReluGrad's mask applied to each dY read).
// Per-channel statistics use one block per channel; elementwise passes are grid-stride loops.
#include <math.h>

#include "common.cuh"

// ---- BatchNormalization / BatchNormalizationGrad -------------------------------------------------------

static om_status *bn_geometry(const om_kernel_ctx *ctx, const om_tensor *t, int64_t *N, int64_t *C, int64_t *S) {
    if (t->rank < 2)
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': X must have rank >= 2 (N, C, ...)", omc_op_name(ctx),
                       omc_node_name(ctx));
    *N = t->dims[0];
    *C = t->dims[1];
    *S = 1;
    for (int i = 2; i < t->rank; i++) *S *= t->dims[i];
    return NULL;
}

static om_status *bn_check_vec(const om_kernel_ctx *ctx, int i, om_dtype dt, int64_t C) {
    if (ctx->in[i].dtype != dt) return omc_err_dtype(ctx, i, ctx->in[i].dtype);
    if (numel(&ctx->in[i]) != C)
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': input %d must have %lld elements (the channels of X)",
                       omc_op_name(ctx), omc_node_name(ctx), i, (long long)C);
    return NULL;
}

// x is (N, C, S); scale, bias, mean, var and the optional outputs are (C); coef (C, 3) receives
// y = (x - m) a + b per channel (centred first, as norm.c: x a - mean a cancels where
// |mean| >> std; m is the mean rounded to A, b takes what that rounding left out). Training: the batch mean and biased variance in two passes in double
// (as norm.c), running = input * momentum + batch * (1 - momentum) with the unbiased variance.
// One block per channel.
template <typename T>
__global__ void bn_stats_kernel(typename acc<T>::t *coef, T *rmean, T *rvar, T *smean, T *sinv, const T *x,
                                const T *scale, const T *bias, const T *in_mean, const T *in_var, int64_t N, int64_t C,
                                int64_t S, double eps, double mom, int train) {
    typedef typename acc<T>::t A;
    const int64_t cnt = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        double mean, var;
        if (train) {
            double s = 0;
            for (int64_t i = threadIdx.x; i < cnt; i += blockDim.x) {
                const int64_t n = i / S, k = i - n * S;
                s += (double)ld(x[(n * C + c) * S + k]);
            }
            s = block_sum(s);
            mean = cnt ? s / (double)cnt : 0.0;
            double ss = 0;
            for (int64_t i = threadIdx.x; i < cnt; i += blockDim.x) {
                const int64_t n = i / S, k = i - n * S;
                const double v = (double)ld(x[(n * C + c) * S + k]) - mean;
                ss += v * v;
            }
            ss = block_sum(ss);
            var = cnt ? ss / (double)cnt : 0.0;
        } else {
            mean = to_f64(in_mean[c]);
            var = to_f64(in_var[c]);
        }
        if (threadIdx.x == 0) {
            const double inv = 1.0 / sqrt(var + eps), sc = to_f64(scale[c]);
            const A m = (A)mean;
            coef[3 * c] = (A)(inv * sc);
            coef[3 * c + 1] = (A)(to_f64(bias[c]) - (mean - (double)m) * inv * sc);
            coef[3 * c + 2] = m;
            if (train && cnt) {   // an empty batch leaves them as they were, as eager does
                const double uvar = cnt > 1 ? var * (double)cnt / (double)(cnt - 1) : var;
                if (rmean) rmean[c] = st<T>((A)(to_f64(in_mean[c]) * mom + mean * (1 - mom)));
                if (rvar) rvar[c] = st<T>((A)(to_f64(in_var[c]) * mom + uvar * (1 - mom)));
            } else {
                if (rmean) rmean[c] = in_mean[c];
                if (rvar) rvar[c] = in_var[c];
            }
            if (smean) smean[c] = st<T>((A)mean);
            if (sinv) sinv[c] = st<T>((A)inv);
        }
    }
}

// x, y are (N, C, S): y = (x - m[c]) a[c] + b[c]; relu: then Relu on the stored value, as the
// unfused relu_cuda does on the rounded Y (a half value that rounds to -0 stays -0, NaN stays)
template <typename T>
__global__ void bn_apply_kernel(T *y, const T *x, const typename acc<T>::t *coef, int64_t C, int64_t S, int64_t n,
                                int relu) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        const A *k = coef + 3 * ((i / S) % C);
        const T r = st<T>((ld(x[i]) - k[2]) * k[0] + k[1]);
        y[i] = relu && ld(r) < 0 ? st<T>((A)0) : r;
    }
}

// BatchNormalization(X, scale, B, mean, var) -> Y, running_mean?, running_var?, saved_mean?, saved_invstd?
// BatchNormRelu: the same, Y = Relu(Y)
static om_status *bn_forward(const om_kernel_ctx *ctx, const om_cuda_exec *x, int relu) {
    const om_tensor *X = &ctx->in[0];
    int64_t N = 0, C = 0, S = 0;
    OMC_TRY(bn_geometry(ctx, X, &N, &C, &S));
    for (int i = 1; i < 5; i++) OMC_TRY(bn_check_vec(ctx, i, X->dtype, C));
    if (!C) return NULL;
    const double eps = attr_real(ctx, "epsilon", 1e-5), mom = attr_real(ctx, "momentum", 0.9);
    const int train = attr_i(ctx, "training_mode", 0) != 0;
    const int64_t n = numel(X);
    om_status *st = NULL;
    OMC_DISPATCH_FLOAT(X->dtype, ctx, 0, {
        A *coef = NULL;
        OMC_TRY(omc_temp_alloc(x, sizeof(A) * (size_t)(3 * C), (void **)&coef));
        T *outs[4];
        for (int j = 0; j < 4; j++) outs[j] = wanted(ctx, 1 + j) ? (T *)ctx->out[1 + j].data : NULL;
        bn_stats_kernel<T><<<channel_blocks(C), 256, 0, stream_of(x)>>>(
            coef, outs[0], outs[1], outs[2], outs[3], (const T *)X->data, (const T *)ctx->in[1].data,
            (const T *)ctx->in[2].data, (const T *)ctx->in[3].data, (const T *)ctx->in[4].data, N, C, S, eps, mom, train);
        if (n) bn_apply_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data,
                                                                                 (const T *)X->data, coef, C, S, n,
                                                                                 relu);
        st = omc_launched(ctx);
        omc_temp_free(x, coef);
    });
    return st;
}

om_status *batch_norm_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return bn_forward(ctx, x, 0); }
om_status *batch_norm_relu_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return bn_forward(ctx, x, 1); }

// dy, x are (N, C, S); scale, mean, stat (training: invstd, else var) are (C). Per channel, with
// xhat = (x - mean) invstd: dB = sum dy, dScale = sum dy xhat (written when wanted), and
// coef (C, 4) = (k, a, bq, mean) for dx = k (dy - a - (x - mean) bq): training k = scale invstd,
// a = dB / cnt, bq = dScale / cnt * invstd; inference a = bq = 0. One block per channel. yr (the
// Relu'd Y of BatchNormRelu, or NULL): dy is read through ReluGrad's mask, y <= 0 ? 0 : dy.
template <typename T>
__global__ void bn_grad_stats_kernel(typename acc<T>::t *coef, T *dscale, T *dbias, const T *dy, const T *yr, const T *x,
                                     const T *scale, const T *meanp, const T *statp, int64_t N, int64_t C, int64_t S,
                                     double eps, int train) {
    typedef typename acc<T>::t A;
    const int64_t cnt = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        const A m = ld(meanp[c]);
        const A inv = train ? ld(statp[c]) : (A)(1.0 / sqrt(to_f64(statp[c]) + eps));
        double sdy = 0, sdyx = 0;
        for (int64_t i = threadIdx.x; i < cnt; i += blockDim.x) {
            const int64_t n = i / S, k = i - n * S, at = (n * C + c) * S + k;
            const double g = yr && ld(yr[at]) <= 0 ? 0.0 : (double)ld(dy[at]);
            sdy += g;
            sdyx += g * (double)(ld(x[at]) - m);
        }
        sdy = block_sum(sdy);
        sdyx = block_sum(sdyx) * (double)inv;
        if (threadIdx.x == 0) {
            if (dscale) dscale[c] = st<T>((A)sdyx);
            if (dbias) dbias[c] = st<T>((A)sdy);
            coef[4 * c] = ld(scale[c]) * inv;
            coef[4 * c + 1] = train && cnt ? (A)(sdy / (double)cnt) : (A)0;
            coef[4 * c + 2] = train && cnt ? (A)(sdyx / (double)cnt) * inv : (A)0;
            coef[4 * c + 3] = m;
        }
    }
}

template <typename T>
__global__ void bn_grad_apply_kernel(T *dx, const T *dy, const T *yr, const T *x, const typename acc<T>::t *coef,
                                     int64_t C, int64_t S, int64_t n) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        const A *k = coef + 4 * ((i / S) % C);
        const A g = yr && ld(yr[i]) <= 0 ? (A)0 : ld(dy[i]);
        dx[i] = st<T>(k[0] * (g - k[1] - (ld(x[i]) - k[3]) * k[2]));
    }
}

// BatchNormalizationGrad(dY, X, scale, mean, invstd|var) -> dX, dScale, dB
// BatchNormReluGrad(dY, Y, X, scale, mean, invstd|var): the same through Y's ReLU mask
static om_status *bn_backward(const om_kernel_ctx *ctx, const om_cuda_exec *x, int relu) {
    const int o = relu ? 1 : 0;
    const om_tensor *dY = &ctx->in[0], *X = &ctx->in[1 + o];
    int64_t N = 0, C = 0, S = 0;
    if (X->dtype != dY->dtype) return omc_err_dtype(ctx, 1 + o, X->dtype);
    if (relu && ctx->in[1].dtype != dY->dtype) return omc_err_dtype(ctx, 1, ctx->in[1].dtype);
    OMC_TRY(bn_geometry(ctx, X, &N, &C, &S));
    for (int i = 2 + o; i < 5 + o; i++) OMC_TRY(bn_check_vec(ctx, i, X->dtype, C));
    if (!C) return NULL;
    const int train = attr_i(ctx, "training_mode", 0) != 0;
    const double eps = attr_real(ctx, "epsilon", 1e-5);
    const int64_t n = numel(X);
    om_status *st = NULL;
    OMC_DISPATCH_FLOAT(X->dtype, ctx, 0, {
        A *coef = NULL;
        OMC_TRY(omc_temp_alloc(x, sizeof(A) * (size_t)(4 * C), (void **)&coef));
        const T *yr = relu ? (const T *)ctx->in[1].data : NULL;
        bn_grad_stats_kernel<T><<<channel_blocks(C), 256, 0, stream_of(x)>>>(
            coef, wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL, wanted(ctx, 2) ? (T *)ctx->out[2].data : NULL,
            (const T *)dY->data, yr, (const T *)X->data, (const T *)ctx->in[2 + o].data,
            (const T *)ctx->in[3 + o].data, (const T *)ctx->in[4 + o].data, N, C, S, eps, train);
        if (n && wanted(ctx, 0))
            bn_grad_apply_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)dY->data, yr, (const T *)X->data, coef, C, S, n);
        st = omc_launched(ctx);
        omc_temp_free(x, coef);
    });
    return st;
}

om_status *batch_norm_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return bn_backward(ctx, x, 0); }
om_status *batch_norm_relu_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    return bn_backward(ctx, x, 1);
}
