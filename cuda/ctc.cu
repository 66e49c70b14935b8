// ctc.cu — CTCLoss and CTCLossGrad (csrc/ops/ctc.c): the same recursions as the CPU kernels,
// in the input's dtype (float32 or float64; eager has no half CTC kernel and the shape rule
// refuses it). One block per sample runs alpha (forward) and beta (backward) over the states s
// of the extended target, one thread per s, a loop over t with a barrier per step; the
// gradient takes one block per (sample, t), one thread per label c, which collects
// alpha*beta over the states of label c in the CPU's order (s descending).
//
// Lengths and labels live on the device: the shape rule checked them at plan time when they are
// constants; otherwise a sample with a length or label the CPU provider refuses gets a NaN loss
// and NaN gradients here (reported without a synchronization it cannot be), never a read
// outside its tensors.
#include <math.h>

#include "common.cuh"

struct ctc_dims {
    int64_t T, N, C, S, L, blank;   // S: padded width, or the concatenated targets' length
    int concat;
};

__device__ __forceinline__ float ctc_exp(float v) { return expf(v); }
__device__ __forceinline__ double ctc_exp(double v) { return exp(v); }
__device__ __forceinline__ float ctc_log(float v) { return logf(v); }
__device__ __forceinline__ double ctc_log(double v) { return log(v); }

__device__ __forceinline__ int64_t ctc_int(const void *p, int is64, int64_t i) {
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

struct ctc_ints {
    const void *tg, *il, *tl;
    int tg64, il64, tl64;
    const int64_t *count;   // with a targets mask: how many targets it selected (device), else NULL
};

// Sample b's offset into the targets, or -1 when its lengths or labels are not valid.
__device__ int64_t ctc_offset(const ctc_ints &in, const ctc_dims &d, int64_t b) {
    const int64_t il = ctc_int(in.il, in.il64, b), tl = ctc_int(in.tl, in.tl64, b);
    if (il < 0 || il > d.T || tl < 0) return -1;
    int64_t off = b * d.S;
    if (d.concat) {   // eager refuses the call unless the lengths add up to the targets' count
        const int64_t M = in.count ? *in.count : d.S;
        int64_t total = 0;
        off = -1;
        for (int64_t k = 0; k < d.N; k++) {
            const int64_t v = ctc_int(in.tl, in.tl64, k);
            if (v < 0 || v > M - total) return -1;
            if (k == b) off = total;
            total += v;
        }
        if (total != M) return -1;
    } else if (tl > d.S) {
        return -1;
    }
    for (int64_t i = 0; i < tl; i++) {
        const int64_t l = ctc_int(in.tg, in.tg64, off + i);
        if (l < 0 || l >= d.C) return -1;
    }
    return off;
}

__device__ __forceinline__ int64_t ctc_prime(const ctc_ints &in, const ctc_dims &d, int64_t off, int64_t s) {
    return s % 2 == 0 ? d.blank : ctc_int(in.tg, in.tg64, off + s / 2);
}

// targets, mask (any shape, numel n): flat = targets[mask] in row-major order, *count = its length.
// One thread: the targets of a CTC batch are few (a block-wide scan is not worth it here).
__global__ void ctc_compact_kernel(ctc_ints in, const uint8_t *mask, int64_t n, int64_t *flat, int64_t *count) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (mask[i]) flat[k++] = ctc_int(in.tg, in.tg64, i);
    *count = k;
}

// offs (N): each sample's target offset, or -1 (ctc_offset)
__global__ void ctc_offsets_kernel(ctc_ints in, ctc_dims d, int64_t *offs) {
    GRID_STRIDE(b, d.N) offs[b] = ctc_offset(in, d, b);
}

// eq (8): the negative log likelihood from sample b's log_alpha (N, T, L)
template <typename T>
__device__ T ctc_nll(const T *la, const ctc_dims &d, int64_t b, int64_t il, int64_t tl) {
    const T neginf = -INFINITY;
    if (il == 0) {
        T ll = tl == 0 ? (T)0 : neginf;
        return -ll;
    }
    const T *row = la + (b * d.T + il - 1) * d.L;
    if (tl == 0) return -row[0];
    T l1 = row[tl * 2], l2 = row[tl * 2 - 1];
    T m = l1 > l2 ? l1 : l2;
    m = m == neginf ? (T)0 : m;
    return -(ctc_log(ctc_exp(l1 - m) + ctc_exp(l2 - m)) + m);
}

// log_probs (T, N, C); log_alpha (N, T, L); loss (N); off (N): each sample's target offset or -1.
// One block per sample, threads over the states s.
template <typename T>
__global__ void ctc_alpha_kernel(const T *lp, ctc_ints in, ctc_dims d, int zero_inf, T *loss, T *la) {
    const T neginf = -INFINITY;
    const int64_t b = blockIdx.x;
    __shared__ int64_t sh_off;
    if (threadIdx.x == 0) sh_off = ctc_offset(in, d, b);
    T *a = la + b * d.T * d.L;
    for (int64_t k = threadIdx.x; k < d.T * d.L; k += blockDim.x) a[k] = neginf;
    __syncthreads();
    const int64_t off = sh_off;
    if (off < 0) {
        if (threadIdx.x == 0) loss[b] = (T)NAN;
        return;
    }
    const int64_t il = ctc_int(in.il, in.il64, b), tl = ctc_int(in.tl, in.tl64, b);
    const T *lpb = lp + b * d.C;   // lpb[t * N * C + c]
    if (il > 0 && threadIdx.x == 0) {
        a[0] = lpb[d.blank];
        if (tl > 0) a[1] = lpb[ctc_prime(in, d, off, 1)];
    }
    for (int64_t t = 1; t < il; t++) {
        __syncthreads();
        const T *prev = a + (t - 1) * d.L;
        for (int64_t s = threadIdx.x; s < 2 * tl + 1; s += blockDim.x) {
            const int64_t cp = ctc_prime(in, d, off, s);
            T la1 = prev[s], lamax = la1, la2, la3;
            if (s > 0) {
                la2 = prev[s - 1];
                if (la2 > lamax) lamax = la2;
            } else {
                la2 = neginf;
            }
            if (s > 1 && ctc_prime(in, d, off, s - 2) != cp) {
                la3 = prev[s - 2];
                if (la3 > lamax) lamax = la3;
            } else {
                la3 = neginf;
            }
            if (lamax == neginf) lamax = 0;
            a[t * d.L + s] = ctc_log(ctc_exp(la1 - lamax) + ctc_exp(la2 - lamax) + ctc_exp(la3 - lamax)) + lamax +
                             lpb[t * d.N * d.C + cp];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        T nll = ctc_nll(la, d, b, il, tl);
        if (zero_inf && nll == (T)INFINITY) nll = 0;
        loss[b] = nll;
    }
}

// log_probs (T, N, C); log_beta (N, T, L), eq (10)-(11). One block per sample.
template <typename T>
__global__ void ctc_beta_kernel(const T *lp, ctc_ints in, ctc_dims d, T *lbeta, const int64_t *offs) {
    const T neginf = -INFINITY;
    const int64_t b = blockIdx.x;
    T *bt = lbeta + b * d.T * d.L;
    for (int64_t k = threadIdx.x; k < d.T * d.L; k += blockDim.x) bt[k] = neginf;
    __syncthreads();
    const int64_t off = offs[b];
    if (off < 0) return;
    const int64_t il = ctc_int(in.il, in.il64, b), tl = ctc_int(in.tl, in.tl64, b);
    if (il == 0) return;
    const T *lpb = lp + b * d.C;
    if (threadIdx.x == 0) {
        bt[(il - 1) * d.L + 2 * tl] = lpb[(il - 1) * d.N * d.C + d.blank];
        if (tl > 0) bt[(il - 1) * d.L + 2 * tl - 1] = lpb[(il - 1) * d.N * d.C + ctc_prime(in, d, off, 2 * tl - 1)];
    }
    for (int64_t t = il - 2; t >= 0; t--) {
        __syncthreads();
        const T *next = bt + (t + 1) * d.L;
        for (int64_t s = threadIdx.x; s < 2 * tl + 1; s += blockDim.x) {
            const int64_t cp = ctc_prime(in, d, off, s);
            T lb1 = next[s], lbmax = lb1, lb2, lb3;
            if (s < 2 * tl) {
                lb2 = next[s + 1];
                if (lb2 > lbmax) lbmax = lb2;
            } else {
                lb2 = neginf;
            }
            if (s < 2 * tl - 1 && ctc_prime(in, d, off, s + 2) != cp) {
                lb3 = next[s + 2];
                if (lb3 > lbmax) lbmax = lb3;
            } else {
                lb3 = neginf;
            }
            if (lbmax == neginf) lbmax = 0;
            bt[t * d.L + s] = ctc_log(ctc_exp(lb1 - lbmax) + ctc_exp(lb2 - lbmax) + ctc_exp(lb3 - lbmax)) + lbmax +
                              lpb[t * d.N * d.C + cp];
        }
    }
}

// dloss (N); log_probs, dlog_probs (T, N, C); log_alpha, log_beta (N, T, L), eq (16) and eager's
// grad = (exp(lp) - exp(log(sum alpha beta) + nll - lp)) * dloss. One block per (sample, t).
template <typename T>
__global__ void ctc_grad_kernel(const T *dl, const T *lp, ctc_ints in, ctc_dims d, int zero_inf, const T *la,
                                const T *lbeta, const int64_t *offs, T *dlp) {
    const T neginf = -INFINITY;
    for (int64_t bt = blockIdx.x; bt < d.N * d.T; bt += gridDim.x) {
        const int64_t b = bt / d.T, t = bt - b * d.T;
        const int64_t off = offs[b];
        T *out = dlp + (t * d.N + b) * d.C;
        if (off < 0) {
            for (int64_t c = threadIdx.x; c < d.C; c += blockDim.x) out[c] = (T)NAN;
            continue;
        }
        const int64_t il = ctc_int(in.il, in.il64, b), tl = ctc_int(in.tl, in.tl64, b);
        const T nll = ctc_nll(la, d, b, il, tl);
        if ((zero_inf && nll == (T)INFINITY) || t >= il) {
            for (int64_t c = threadIdx.x; c < d.C; c += blockDim.x) out[c] = 0;
            continue;
        }
        const T *ar = la + (b * d.T + t) * d.L, *br = lbeta + (b * d.T + t) * d.L;
        const T *lpr = lp + (t * d.N + b) * d.C;
        const T g = dl[b];
        for (int64_t c = threadIdx.x; c < d.C; c += blockDim.x) {
            T lcab = neginf;
            if (t == il - 1) {   // beta's first row: two states, assigned (as the CPU does)
                if (c == d.blank) lcab = ar[2 * tl] + br[2 * tl];
                if (tl > 0 && ctc_prime(in, d, off, 2 * tl - 1) == c) lcab = ar[2 * tl - 1] + br[2 * tl - 1];
            } else {
                for (int64_t s = 2 * tl; s >= 0; s--) {
                    if (ctc_prime(in, d, off, s) != c) continue;
                    const T lab = ar[s] + br[s];
                    if (lcab == neginf) {
                        lcab = lab;
                    } else {
                        const T mx = lcab > lab ? lcab : lab;
                        lcab = ctc_log(ctc_exp(lcab - mx) + ctc_exp(lab - mx)) + mx;
                    }
                }
            }
            const T l = lpr[c];
            out[c] = (ctc_exp(l) - ctc_exp(lcab + nll - l)) * g;
        }
    }
}

// log_probs (T, N, C) or (T, C); targets (N, S) or (S); lengths (N); the dims of a node
static om_status *ctc_dims_of(const om_kernel_ctx *ctx, int in0, int mask_in, ctc_dims *d, ctc_ints *ints) {
    const om_tensor *lp = &ctx->in[in0], *tg = &ctx->in[in0 + 1], *il = &ctx->in[in0 + 2], *tl = &ctx->in[in0 + 3];
    if (lp->rank != 2 && lp->rank != 3) return omc_err_unsupported(ctx, "log_probs rank");
    if (lp->dtype != OM_F32 && lp->dtype != OM_F64) return omc_err_dtype(ctx, in0, lp->dtype);
    for (int i = 1; i < 4; i++) {
        om_dtype dt = ctx->in[in0 + i].dtype;
        if (dt != OM_I32 && dt != OM_I64) return omc_err_dtype(ctx, in0 + i, dt);
    }
    d->T = lp->dims[0];
    d->N = lp->rank == 3 ? lp->dims[1] : 1;
    d->C = lp->dims[lp->rank - 1];
    const int masked = present(ctx, mask_in);
    if (masked && ctx->in[mask_in].dtype != OM_BOOL) return omc_err_dtype(ctx, mask_in, ctx->in[mask_in].dtype);
    d->concat = masked || tg->rank == 1;
    d->S = masked ? numel(tg) : d->concat ? tg->dims[0] : tg->dims[1];
    d->L = 2 * d->S + 1;
    d->blank = attr_i(ctx, "blank", 0);
    if (d->blank < 0 || d->blank >= d->C) return omc_err_unsupported(ctx, "blank outside the label range");
    if (numel(il) != d->N || numel(tl) != d->N) return omc_err_unsupported(ctx, "lengths");
    ints->tg = tg->data;
    ints->il = il->data;
    ints->tl = tl->data;
    ints->tg64 = tg->dtype == OM_I64;
    ints->il64 = il->dtype == OM_I64;
    ints->tl64 = tl->dtype == OM_I64;
    ints->count = NULL;
    return NULL;
}

// With a targets mask: compacts the targets into tmp (numel + 1 int64: the targets, then their
// count) and points ints at them.
static void ctc_compact(const om_kernel_ctx *ctx, const om_cuda_exec *x, int tg_in, int mask_in, int64_t *tmp,
                        ctc_ints *ints) {
    const int64_t n = numel(&ctx->in[tg_in]);
    ctc_compact_kernel<<<1, 1, 0, stream_of(x)>>>(*ints, (const uint8_t *)ctx->in[mask_in].data, n, tmp, tmp + n);
    ints->tg = tmp;
    ints->tg64 = 1;
    ints->count = tmp + n;
}

static int ctc_threads(int64_t L) { return L > 512 ? 1024 : L > 128 ? 256 : 128; }

om_status *ctc_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    ctc_dims d;
    ctc_ints in;
    OMC_TRY(ctc_dims_of(ctx, 0, 4, &d, &in));
    if (d.N == 0) return NULL;
    const int zero_inf = attr_i(ctx, "zero_infinity", 0) != 0;
    const size_t esz = dtype_size(ctx->in[0].dtype);
    const int masked = present(ctx, 4);
    const size_t la_bytes = wanted(ctx, 1) ? 0 : (esz * (size_t)(d.N * d.T * d.L) + 7) / 8 * 8;
    const size_t flat_bytes = masked ? sizeof(int64_t) * (size_t)(d.S + 1) : 0;
    void *la = wanted(ctx, 1) ? ctx->out[1].data : NULL;
    char *tmp = NULL;
    if (la_bytes + flat_bytes) OMC_TRY(omc_temp_alloc(x, la_bytes + flat_bytes, (void **)&tmp));
    if (!la) la = tmp;
    if (masked) ctc_compact(ctx, x, 1, 4, (int64_t *)(tmp + la_bytes), &in);
    switch (ctx->in[0].dtype) {
    case OM_F32:
        ctc_alpha_kernel<float><<<(unsigned)d.N, ctc_threads(d.L), 0, stream_of(x)>>>(
            (const float *)ctx->in[0].data, in, d, zero_inf, (float *)ctx->out[0].data, (float *)la);
        break;
    default:
        ctc_alpha_kernel<double><<<(unsigned)d.N, ctc_threads(d.L), 0, stream_of(x)>>>(
            (const double *)ctx->in[0].data, in, d, zero_inf, (double *)ctx->out[0].data, (double *)la);
        break;
    }
    om_status *st = omc_launched(ctx);
    if (tmp) omc_temp_free(x, tmp);
    return st;
}

// dloss (N) or (); log_probs, dlog_probs (T, N, C) or (T, C); log_alpha (N, T, L)
om_status *ctc_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    ctc_dims d;
    ctc_ints in;
    OMC_TRY(ctc_dims_of(ctx, 1, 6, &d, &in));
    if (d.N == 0 || d.T == 0) return NULL;
    const int masked = present(ctx, 6);
    const int zero_inf = attr_i(ctx, "zero_infinity", 0) != 0;
    const size_t esz = dtype_size(ctx->in[1].dtype);
    const size_t beta_bytes = (esz * (size_t)(d.N * d.T * d.L) + 7) / 8 * 8;
    char *tmp = NULL;
    // log_beta (N, T, L), the N target offsets, then the compacted targets and their count
    const size_t flat_n = masked ? (size_t)(d.S + 1) : 0;
    OMC_TRY(omc_temp_alloc(x, beta_bytes + sizeof(int64_t) * ((size_t)d.N + flat_n), (void **)&tmp));
    int64_t *offs = (int64_t *)(tmp + beta_bytes);
    if (masked) ctc_compact(ctx, x, 2, 6, offs + d.N, &in);
    const int threads = ctc_threads(d.L), cthreads = d.C >= 256 ? 256 : 64;
    const unsigned blocks_bt = grid_for(d.N * d.T, 1);
    ctc_offsets_kernel<<<grid_for(d.N), OMC_THREADS, 0, stream_of(x)>>>(in, d, offs);
#define CTC_GRAD_LAUNCH(TT)                                                                                        \
    {                                                                                                              \
        typedef TT T;                                                                                              \
        ctc_beta_kernel<T><<<(unsigned)d.N, threads, 0, stream_of(x)>>>((const T *)ctx->in[1].data, in, d,         \
                                                                        (T *)tmp, offs);                           \
        ctc_grad_kernel<T><<<blocks_bt, cthreads, 0, stream_of(x)>>>(                                              \
            (const T *)ctx->in[0].data, (const T *)ctx->in[1].data, in, d, zero_inf, (const T *)ctx->in[5].data,   \
            (const T *)tmp, offs, (T *)ctx->out[0].data);                                                          \
    }
    if (ctx->in[1].dtype == OM_F32) CTC_GRAD_LAUNCH(float)
    else CTC_GRAD_LAUNCH(double)
#undef CTC_GRAD_LAUNCH
    om_status *st = omc_launched(ctx);
    omc_temp_free(x, tmp);
    return st;
}
