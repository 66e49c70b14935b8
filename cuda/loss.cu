// loss.cu — SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss and their backward ops (loss.c).
// Scores/log-probs are (N, C, S), labels (N, S). One block per position (i, s) does the
// log-sum-exp over C; "sum"/"mean" finish with a one-block reduction of the per-position
// losses and weights (no host synchronization: the mean's denominator stays on the device).
// Labels out of range (and not ignore_index) cannot be reported without a synchronization:
// they contribute nothing here, where the CPU provider raises an error.
#include <math.h>

#include "common.cuh"

enum { LR_NONE, LR_SUM, LR_MEAN };

struct loss_attrs { int reduction, has_ignore; int64_t ignore; };
struct loss_geom { int64_t N, C, S; };

static om_status *loss_attrs_read(const om_kernel_ctx *ctx, loss_attrs *a) {
    const char *r = attr_s(ctx, "reduction", "mean");
    if (!strcmp(r, "mean")) a->reduction = LR_MEAN;
    else if (!strcmp(r, "sum")) a->reduction = LR_SUM;
    else if (!strcmp(r, "none")) a->reduction = LR_NONE;
    else return omc_err_unsupported(ctx, "reduction");
    // has_ignore: whether the attribute exists (a sentinel default tells)
    int64_t probe = attr_i(ctx, "ignore_index", INT64_MIN + 7);
    a->has_ignore = probe != INT64_MIN + 7;
    a->ignore = a->has_ignore ? probe : 0;
    return NULL;
}

static loss_geom geom_of(const int64_t *dims, int rank) {
    loss_geom g = {dims[0], dims[1], 1};
    for (int i = 2; i < rank; i++) g.S *= dims[i];
    return g;
}

__device__ __forceinline__ int64_t label_at(const void *lab, int is64, int64_t i) {
    return is64 ? ((const int64_t *)lab)[i] : (int64_t)((const int32_t *)lab)[i];
}

// scores, log_prob are (N, C, S); per position pos = i*S + s: li (loss) and wl (weight) into
// per-position buffers, or the loss output directly for "none". One block per position.
template <typename T>
__global__ void sce_forward_kernel(const T *x, T *logp, const void *lab, int lab64, const T *w, loss_geom g, loss_attrs a,
                                   T *loss_none, float *li_buf, float *wl_buf) {
    typedef typename acc<T>::t A;
    for (int64_t pos = blockIdx.x; pos < g.N * g.S; pos += gridDim.x) {
        int64_t i = pos / g.S, s = pos - i * g.S;
        const T *xr = x + i * g.C * g.S + s;
        // logp may be x's own buffer (in place, loss.c): the label's score is read before the
        // block's first barrier, every log-prob written after its last
        int64_t l = label_at(lab, lab64, pos);
        int skip = (a.has_ignore && l == a.ignore) || l < 0 || l >= g.C;
        A xl = threadIdx.x == 0 && !skip ? ld(xr[l * g.S]) : (A)0;
        A m = -INFINITY;
        for (int64_t c = threadIdx.x; c < g.C; c += blockDim.x) { A v = ld(xr[c * g.S]); m = v > m ? v : m; }
        m = block_max(m);
        if (m == -INFINITY) m = 0;
        A sum = 0;
        for (int64_t c = threadIdx.x; c < g.C; c += blockDim.x) sum += exp(ld(xr[c * g.S]) - m);
        A ls = log(block_sum(sum));   // log p = (x - m) - ls, as eager: exact near the max
        if (logp) {
            T *lr = logp + i * g.C * g.S + s;
            for (int64_t c = threadIdx.x; c < g.C; c += blockDim.x) lr[c * g.S] = st<T>((ld(xr[c * g.S]) - m) - ls);
        }
        if (threadIdx.x == 0) {
            A wl = skip ? (A)0 : w ? ld(w[l]) : (A)1;
            A li = skip ? (A)0 : -wl * ((xl - m) - ls);
            if (loss_none) loss_none[pos] = st<T>(li);
            else { li_buf[pos] = (float)li; wl_buf[pos] = (float)wl; }
        }
    }
}

// one block: loss[0] = sum(li) ("sum") or sum(li) / sum(wl) ("mean"; 0/0 = NaN as PyTorch)
template <typename T>
__global__ void loss_finish_kernel(T *loss, const float *li, const float *wl, int64_t n, int mean) {
    float t = 0, w = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) { t += li[k]; w += wl[k]; }
    t = block_sum(t);
    w = block_sum(w);
    if (threadIdx.x == 0) loss[0] = st<T>((typename acc<T>::t)(mean ? t / w : t));
}

// one block: *den = sum of the weights of the labels that count
template <typename T>
__global__ void weight_sum_kernel(float *den, const void *lab, int lab64, const T *w, loss_geom g, loss_attrs a) {
    float s = 0;
    for (int64_t pos = threadIdx.x; pos < g.N * g.S; pos += blockDim.x) {
        int64_t l = label_at(lab, lab64, pos);
        if ((a.has_ignore && l == a.ignore) || l < 0 || l >= g.C) continue;
        s += w ? (float)ld(w[l]) : 1.0f;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) *den = s;
}

static unsigned pos_blocks(int64_t n) { return (unsigned)(n < 65535 * 16 ? (n > 0 ? n : 1) : 65535 * 16); }
static int c_threads(int64_t C) { return C >= 1024 ? 1024 : C >= 256 ? 256 : 64; }

static om_status *loss_check(const om_kernel_ctx *ctx, const om_tensor *x, const om_tensor *lab) {
    if (x->rank < 2 || lab->rank != x->rank - 1) return omc_err_unsupported(ctx, "loss shapes");
    if (lab->dtype != OM_I64 && lab->dtype != OM_I32) return omc_err_dtype(ctx, 1, lab->dtype);
    return NULL;
}

// scores, log_prob are (N, C, S); labels (N, S); weights (C); loss () or (N, S)
om_status *sce_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    loss_attrs a;
    OMC_TRY(loss_attrs_read(ctx, &a));
    const om_tensor *in = &ctx->in[0], *lab = &ctx->in[1];
    OMC_TRY(loss_check(ctx, in, lab));
    loss_geom g = geom_of(in->dims, in->rank);
    int64_t npos = g.N * g.S;
    float *buf = NULL;
    if (a.reduction != LR_NONE) OMC_TRY(omc_temp_alloc(x, sizeof(float) * (size_t)(2 * npos + 1), (void **)&buf));
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 0, {
        if (npos)
            sce_forward_kernel<T><<<pos_blocks(npos), c_threads(g.C), 0, stream_of(x)>>>(
                (const T *)in->data, wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL, lab->data, lab->dtype == OM_I64,
                present(ctx, 2) ? (const T *)ctx->in[2].data : NULL, g, a,
                a.reduction == LR_NONE ? (T *)ctx->out[0].data : NULL, buf, buf ? buf + npos : NULL);
        if (buf)
            loss_finish_kernel<T><<<1, 1024, 0, stream_of(x)>>>((T *)ctx->out[0].data, buf, buf + npos, npos,
                                                                a.reduction == LR_MEAN);
    });
    om_status *st = omc_launched(ctx);
    if (buf) omc_temp_free(x, buf);
    return st;
}

// dloss () or (N, S); log_prob, dscores (N, C, S); labels (N, S); weights (C):
// dscores = (exp(log_prob) - onehot(label)) * w[label] * scale, one block per position
template <typename T>
__global__ void sce_grad_kernel(T *dx, const T *dl, const T *logp, const void *lab, int lab64, const T *w, loss_geom g,
                                loss_attrs a, const float *den) {
    typedef typename acc<T>::t A;
    for (int64_t pos = blockIdx.x; pos < g.N * g.S; pos += gridDim.x) {
        int64_t i = pos / g.S, s = pos - i * g.S;
        int64_t l = label_at(lab, lab64, pos);
        int skip = (a.has_ignore && l == a.ignore) || l < 0 || l >= g.C;
        A k = a.reduction == LR_NONE ? ld(dl[pos]) : a.reduction == LR_SUM ? ld(dl[0]) : ld(dl[0]) / (A)*den;
        A coef = skip ? (A)0 : (w ? ld(w[l]) : (A)1) * k;
        const T *lr = logp + i * g.C * g.S + s;
        T *dr = dx + i * g.C * g.S + s;
        for (int64_t c = threadIdx.x; c < g.C; c += blockDim.x)
            dr[c * g.S] = st<T>(exp(ld(lr[c * g.S])) * coef - (c == l ? coef : (A)0));
    }
}

om_status *sce_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    loss_attrs a;
    OMC_TRY(loss_attrs_read(ctx, &a));
    const om_tensor *lp = &ctx->in[1], *lab = &ctx->in[2];
    OMC_TRY(loss_check(ctx, lp, lab));
    loss_geom g = geom_of(lp->dims, lp->rank);
    int64_t npos = g.N * g.S;
    if (!npos) return NULL;
    float *den = NULL;
    if (a.reduction == LR_MEAN) OMC_TRY(omc_temp_alloc(x, sizeof(float), (void **)&den));
    OMC_DISPATCH_FLOAT(lp->dtype, ctx, 1, {
        const T *w = present(ctx, 3) ? (const T *)ctx->in[3].data : NULL;
        if (den) weight_sum_kernel<T><<<1, 1024, 0, stream_of(x)>>>(den, lab->data, lab->dtype == OM_I64, w, g, a);
        sce_grad_kernel<T><<<pos_blocks(npos), c_threads(g.C), 0, stream_of(x)>>>(
            (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const T *)lp->data, lab->data, lab->dtype == OM_I64, w,
            g, a, den);
    });
    om_status *st = omc_launched(ctx);
    if (den) omc_temp_free(x, den);
    return st;
}

// input (N, C, S) log-probs; target (N, S); weight (C): per position li = -w[l] x[i, l, s]
template <typename T>
__global__ void nll_forward_kernel(const T *xp, const void *lab, int lab64, const T *w, loss_geom g, loss_attrs a,
                                   T *loss_none, float *li_buf, float *wl_buf) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(pos, g.N * g.S) {
        int64_t i = pos / g.S, s = pos - i * g.S, l = label_at(lab, lab64, pos);
        int skip = (a.has_ignore && l == a.ignore) || l < 0 || l >= g.C;
        A wl = skip ? (A)0 : w ? ld(w[l]) : (A)1;
        A li = skip ? (A)0 : -wl * ld(xp[(i * g.C + l) * g.S + s]);
        if (loss_none) loss_none[pos] = st<T>(li);
        else { li_buf[pos] = (float)li; wl_buf[pos] = (float)wl; }
    }
}

om_status *nll_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    loss_attrs a;
    OMC_TRY(loss_attrs_read(ctx, &a));
    const om_tensor *in = &ctx->in[0], *lab = &ctx->in[1];
    OMC_TRY(loss_check(ctx, in, lab));
    loss_geom g = geom_of(in->dims, in->rank);
    int64_t npos = g.N * g.S;
    float *buf = NULL;
    if (a.reduction != LR_NONE) OMC_TRY(omc_temp_alloc(x, sizeof(float) * (size_t)(2 * npos + 1), (void **)&buf));
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 0, {
        if (npos)
            nll_forward_kernel<T><<<grid_for(npos), OMC_THREADS, 0, stream_of(x)>>>(
                (const T *)in->data, lab->data, lab->dtype == OM_I64, present(ctx, 2) ? (const T *)ctx->in[2].data : NULL,
                g, a, a.reduction == LR_NONE ? (T *)ctx->out[0].data : NULL, buf, buf ? buf + npos : NULL);
        if (buf)
            loss_finish_kernel<T><<<1, 1024, 0, stream_of(x)>>>((T *)ctx->out[0].data, buf, buf + npos, npos,
                                                                a.reduction == LR_MEAN);
    });
    om_status *st = omc_launched(ctx);
    if (buf) omc_temp_free(x, buf);
    return st;
}

// dloss () or (N, S); target (N, S); weight (C); dinput (N, C, S), zeroed first
template <typename T>
__global__ void nll_grad_kernel(T *dx, const T *dl, const void *lab, int lab64, const T *w, loss_geom g, loss_attrs a,
                                const float *den) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(pos, g.N * g.S) {
        int64_t i = pos / g.S, s = pos - i * g.S, l = label_at(lab, lab64, pos);
        if ((a.has_ignore && l == a.ignore) || l < 0 || l >= g.C) continue;
        A k = a.reduction == LR_NONE ? ld(dl[pos]) : a.reduction == LR_SUM ? ld(dl[0]) : ld(dl[0]) / (A)*den;
        dx[(i * g.C + l) * g.S + s] = st<T>(-(w ? ld(w[l]) : (A)1) * k);
    }
}

om_status *nll_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    loss_attrs a;
    OMC_TRY(loss_attrs_read(ctx, &a));
    const om_tensor *lab = &ctx->in[1], *out = &ctx->out[0];
    if (out->rank < 2) return omc_err_unsupported(ctx, "loss shapes");
    loss_geom g = geom_of(out->dims, out->rank);
    OMC_TRY(omc_cuda(cudaMemsetAsync(out->data, 0, nbytes(out), stream_of(x)), "cudaMemsetAsync"));
    int64_t npos = g.N * g.S;
    if (!npos) return NULL;
    float *den = NULL;
    if (a.reduction == LR_MEAN) OMC_TRY(omc_temp_alloc(x, sizeof(float), (void **)&den));
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        const T *w = present(ctx, 3) ? (const T *)ctx->in[3].data : NULL;
        if (den) weight_sum_kernel<T><<<1, 1024, 0, stream_of(x)>>>(den, lab->data, lab->dtype == OM_I64, w, g, a);
        nll_grad_kernel<T><<<grid_for(npos), OMC_THREADS, 0, stream_of(x)>>>((T *)out->data, (const T *)ctx->in[0].data,
                                                                             lab->data, lab->dtype == OM_I64, w, g, a, den);
    });
    om_status *st = omc_launched(ctx);
    if (den) omc_temp_free(x, den);
    return st;
}
