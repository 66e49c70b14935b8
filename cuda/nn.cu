// nn.cu — Softmax, LogSoftmax, LayerNormalization and their backward ops (nn.c).
//
// Softmax views x as (outer, D, inner), D the softmax axis: with inner == 1 (the usual last
// axis) one block per row; otherwise one thread per (outer, inner) column. LayerNorm views x
// as (N, D) with one block per row (two passes over the row: mean, then the centred variance,
// as the CPU kernel). Parameter gradients are column sums over N done in two stages (partial
// sums per chunk of rows, then a sum over chunks) so that every SM has work.
#include <math.h>

#include "common.cuh"

// ---- softmax geometry (as nn.c, including the opset < 13 "coerce to 2-D" rule) ----------------------

struct sm_geom { int64_t outer, D, inner; };

static om_status *sm_geometry(const om_kernel_ctx *ctx, const om_tensor *t, sm_geom *s) {
    int64_t axis;
    int coerce;
    if (!strcmp(ctx->node->op->domain, "ortmod")) {
        axis = attr_i(ctx, "axis", -1);
        coerce = (int)attr_i(ctx, "coerce2d", 0);
    } else {
        int legacy = ctx->g && ctx->g->opset > 0 && ctx->g->opset < 13;
        axis = attr_i(ctx, "axis", legacy ? 1 : -1);
        coerce = legacy;
    }
    s->outer = s->D = s->inner = 1;
    if (t->rank == 0) return NULL;
    int ax = norm_axis(axis, t->rank);
    if (ax < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': axis out of range", omc_node_name(ctx));
    for (int i = 0; i < ax; i++) s->outer *= t->dims[i];
    s->D = t->dims[ax];
    for (int i = ax + 1; i < t->rank; i++) s->inner *= t->dims[i];
    if (coerce) { s->D *= s->inner; s->inner = 1; }
    return NULL;
}

// x, y are (rows, D): one block per row; log: y = x - max - log(sum exp)
template <typename T>
__global__ void softmax_rows_kernel(T *y, const T *x, int64_t rows, int64_t D, int log_) {
    typedef typename acc<T>::t A;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * D;
        T *yr = y + r * D;
        A m = -INFINITY;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) { A v = ld(xr[d]); m = v > m ? v : m; }
        m = block_max(m);
        A s = 0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += exp(ld(xr[d]) - m);
        s = block_sum(s);
        if (log_) {
            A ls = log(s);
            for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] = st<T>(ld(xr[d]) - m - ls);
        } else {
            A is = (A)1 / s;
            for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] = st<T>(exp(ld(xr[d]) - m) * is);
        }
    }
}

// x, y are (outer, D, inner): one thread per (outer, inner) column
template <typename T>
__global__ void softmax_cols_kernel(T *y, const T *x, sm_geom g, int log_) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(c, g.outer * g.inner) {
        int64_t o = c / g.inner, i = c - o * g.inner;
        const T *xc = x + o * g.D * g.inner + i;
        T *yc = y + o * g.D * g.inner + i;
        A m = -INFINITY, s = 0;
        for (int64_t d = 0; d < g.D; d++) { A v = ld(xc[d * g.inner]); m = v > m ? v : m; }
        for (int64_t d = 0; d < g.D; d++) s += exp(ld(xc[d * g.inner]) - m);
        A ls = log(s), is = (A)1 / s;
        for (int64_t d = 0; d < g.D; d++) {
            A v = ld(xc[d * g.inner]) - m;
            yc[d * g.inner] = st<T>(log_ ? v - ls : exp(v) * is);
        }
    }
}

static unsigned row_blocks(int64_t rows) { return (unsigned)(rows < 65535 * 16 ? (rows > 0 ? rows : 1) : 65535 * 16); }
static int row_threads(int64_t D) { return D >= 1024 ? 1024 : D >= 512 ? 512 : D >= 256 ? 256 : D >= 128 ? 128 : 64; }

static om_status *softmax_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, int log_) {
    sm_geom g;
    OMC_TRY(sm_geometry(ctx, &ctx->in[0], &g));
    if (!g.outer || !g.D || !g.inner) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        if (g.inner == 1)
            softmax_rows_kernel<T><<<row_blocks(g.outer), row_threads(g.D), 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, g.outer, g.D, log_);
        else
            softmax_cols_kernel<T><<<grid_for(g.outer * g.inner), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, g, log_);
    });
    return omc_launched(ctx);
}
om_status *softmax_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return softmax_run(ctx, x, 0); }
om_status *log_softmax_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return softmax_run(ctx, x, 1); }

// dy, y, dx are (rows, D): softmax dx = y (dy - sum(dy y)); log-softmax dx = dy - exp(y) sum(dy)
template <typename T>
__global__ void softmax_grad_rows_kernel(T *dx, const T *dy, const T *y, int64_t rows, int64_t D, int log_) {
    typedef typename acc<T>::t A;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *g = dy + r * D, *yr = y + r * D;
        T *o = dx + r * D;
        A s = 0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += log_ ? ld(g[d]) : ld(g[d]) * ld(yr[d]);
        s = block_sum(s);
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
            o[d] = st<T>(log_ ? ld(g[d]) - exp(ld(yr[d])) * s : ld(yr[d]) * (ld(g[d]) - s));
    }
}

// the same over (outer, D, inner) columns
template <typename T>
__global__ void softmax_grad_cols_kernel(T *dx, const T *dy, const T *y, sm_geom g, int log_) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(c, g.outer * g.inner) {
        int64_t o = c / g.inner, i = c - o * g.inner, base = o * g.D * g.inner + i;
        A s = 0;
        for (int64_t d = 0; d < g.D; d++) {
            int64_t k = base + d * g.inner;
            s += log_ ? ld(dy[k]) : ld(dy[k]) * ld(y[k]);
        }
        for (int64_t d = 0; d < g.D; d++) {
            int64_t k = base + d * g.inner;
            dx[k] = st<T>(log_ ? ld(dy[k]) - exp(ld(y[k])) * s : ld(y[k]) * (ld(dy[k]) - s));
        }
    }
}

static om_status *softmax_grad_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, int log_) {
    sm_geom g;
    OMC_TRY(sm_geometry(ctx, &ctx->in[0], &g));
    if (!g.outer || !g.D || !g.inner) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        if (g.inner == 1)
            softmax_grad_rows_kernel<T><<<row_blocks(g.outer), row_threads(g.D), 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const T *)ctx->in[1].data, g.outer, g.D, log_);
        else
            softmax_grad_cols_kernel<T><<<grid_for(g.outer * g.inner), OMC_THREADS, 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const T *)ctx->in[1].data, g, log_);
    });
    return omc_launched(ctx);
}
om_status *softmax_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return softmax_grad_run(ctx, x, 0); }
om_status *log_softmax_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return softmax_grad_run(ctx, x, 1); }

// ---- LayerNormalization ---------------------------------------------------------------------------------

// statistics are stored in their tensor's dtype (float for half inputs per the dtype rule, or x's)
template <typename S, typename A> __device__ __forceinline__ void st_stat(void *p, int64_t i, om_dtype dt, A v) {
    switch (dt) {
    case OM_F64: ((double *)p)[i] = (double)v; break;
    case OM_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case OM_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v); break;
    default: ((float *)p)[i] = (float)v; break;
    }
}
__device__ __forceinline__ double ld_stat(const void *p, int64_t i, om_dtype dt) {
    switch (dt) {
    case OM_F64: return ((const double *)p)[i];
    case OM_F16: return __half2float(((const __half *)p)[i]);
    case OM_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static om_status *ln_geometry(const om_kernel_ctx *ctx, const om_tensor *t, int64_t *N, int64_t *D) {
    if (t->rank == 0) return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': X must have rank >= 1", omc_node_name(ctx));
    int axis = norm_axis(attr_i(ctx, "axis", -1), t->rank);
    if (axis < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': axis out of range", omc_node_name(ctx));
    *N = *D = 1;
    for (int i = 0; i < axis; i++) *N *= t->dims[i];
    for (int i = axis; i < t->rank; i++) *D *= t->dims[i];
    return NULL;
}

// x, y are (N, D); scale, bias are (D); mean, inv are (N) (either may be NULL)
template <typename T>
__global__ void layer_norm_kernel(T *y, void *mean, void *inv, om_dtype sdt, const T *x, const T *scale, const T *bias,
                                  int64_t N, int64_t D, float eps) {
    typedef typename acc<T>::t A;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const T *xr = x + r * D;
        T *yr = y + r * D;
        A s = 0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += ld(xr[d]);
        A m = block_sum(s) / (A)D;
        A ss = 0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) { A c = ld(xr[d]) - m; ss += c * c; }
        A iv = (A)1 / sqrt(block_sum(ss) / (A)D + (A)eps);
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            A v = (ld(xr[d]) - m) * iv * ld(scale[d]);
            if (bias) v += ld(bias[d]);
            yr[d] = st<T>(v);
        }
        if (threadIdx.x == 0) {
            if (mean) st_stat<T, A>(mean, r, sdt, m);
            if (inv) st_stat<T, A>(inv, r, sdt, iv);
        }
    }
}

// Scale/B in float32 under a half X (eager's mixed-type layer_norm, from CPU autocast) runs on the
// CPU; CUDA autocast casts layer_norm's input to float32 itself, so it does not meet one.
static const char *LN_MIXED = "float32 Scale/B with a half-precision X (mixed-type layer_norm: it runs on the CPU)";

om_status *layer_norm_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    if (ctx->in[1].dtype != in->dtype) return omc_err_unsupported(ctx, LN_MIXED);
    int64_t N = 0, D = 0;
    OMC_TRY(ln_geometry(ctx, in, &N, &D));
    if (!N || !D) return NULL;
    float eps = attr_f(ctx, "epsilon", 1e-5f);
    void *mean = wanted(ctx, 1) ? ctx->out[1].data : NULL, *inv = wanted(ctx, 2) ? ctx->out[2].data : NULL;
    om_dtype sdt = mean ? ctx->out[1].dtype : inv ? ctx->out[2].dtype : in->dtype;
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 0, {
        layer_norm_kernel<T><<<row_blocks(N), row_threads(D), 0, stream_of(x)>>>(
            (T *)ctx->out[0].data, mean, inv, sdt, (const T *)in->data, (const T *)ctx->in[1].data,
            present(ctx, 2) ? (const T *)ctx->in[2].data : NULL, N, D, eps);
    });
    return omc_launched(ctx);
}

// dy, x, dx are (N, D); scale (D); mean, inv, dmean?, dinv? (N):
//   dx = inv (g - mean_D(g) - xhat mean_D(g xhat)) + (dmean - dinv inv^3 (x - m)) / D, g = dy scale
template <typename T>
__global__ void layer_norm_dx_kernel(T *dx, const T *dy, const T *x, const T *scale, const void *mean, const void *inv,
                                     const void *dmean, const void *dinv, om_dtype sdt, int64_t N, int64_t D) {
    typedef typename acc<T>::t A;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const T *g = dy + r * D, *xr = x + r * D;
        T *o = dx + r * D;
        A m = (A)ld_stat(mean, r, sdt), iv = (A)ld_stat(inv, r, sdt);
        A s1 = 0, s2 = 0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            A gs = ld(g[d]) * ld(scale[d]);
            s1 += gs;
            s2 += gs * ((ld(xr[d]) - m) * iv);
        }
        A a = block_sum(s1) / (A)D;
        A b = block_sum(s2) / (A)D;
        A km = dmean ? (A)ld_stat(dmean, r, sdt) / (A)D : (A)0;
        A ki = dinv ? (A)ld_stat(dinv, r, sdt) * iv * iv * iv / (A)D : (A)0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            A xc = ld(xr[d]) - m;
            o[d] = st<T>(iv * (ld(g[d]) * ld(scale[d]) - a - xc * iv * b) + km - ki * xc);
        }
    }
}

// stage 1 of dscale/dbias: partial column sums over a chunk of rows, in T's math type (fp32 for
// fp16/bf16/fp32, fp64 for fp64). grid (ceil(D/32), chunks), block (32, 8)
template <typename T>
__global__ void layer_norm_dparam_partial(typename acc<T>::t *pds, typename acc<T>::t *pdb, const T *dy, const T *x,
                                          const void *mean, const void *inv, om_dtype sdt, int64_t N, int64_t D,
                                          int64_t rows_per) {
    typedef typename acc<T>::t A;
    __shared__ A sh_s[8][33], sh_b[8][33];
    int64_t d = (int64_t)blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * rows_per, r1 = r0 + rows_per < N ? r0 + rows_per : N;
    A s = 0, b = 0;
    if (d < D)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            A g = ld(dy[r * D + d]);
            s += g * (A)(((double)ld(x[r * D + d]) - ld_stat(mean, r, sdt)) * ld_stat(inv, r, sdt));
            b += g;
        }
    sh_s[threadIdx.y][threadIdx.x] = s;
    sh_b[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && d < D) {
        for (int k = 1; k < 8; k++) { s += sh_s[k][threadIdx.x]; b += sh_b[k][threadIdx.x]; }
        pds[blockIdx.y * D + d] = s;
        pdb[blockIdx.y * D + d] = b;
    }
}

// stage 2: sum the chunks; dscale, dbias are (D) (either may be NULL)
template <typename T>
__global__ void layer_norm_dparam_final(T *ds, T *db, const typename acc<T>::t *pds, const typename acc<T>::t *pdb,
                                        int64_t chunks, int64_t D) {
    GRID_STRIDE(d, D) {
        typename acc<T>::t s = 0, b = 0;
        for (int64_t c = 0; c < chunks; c++) { s += pds[c * D + d]; b += pdb[c * D + d]; }
        if (ds) ds[d] = st<T>(s);
        if (db) db[d] = st<T>(b);
    }
}

om_status *layer_norm_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[1];
    if (ctx->in[2].dtype != in->dtype) return omc_err_unsupported(ctx, LN_MIXED);
    int64_t N = 0, D = 0;
    OMC_TRY(ln_geometry(ctx, in, &N, &D));
    if (!N || !D) return NULL;
    om_dtype sdt = ctx->in[3].dtype;
    const void *dmean = present(ctx, 5) ? ctx->in[5].data : NULL, *dinv = present(ctx, 6) ? ctx->in[6].data : NULL;
    void *ds = wanted(ctx, 1) ? ctx->out[1].data : NULL, *db = wanted(ctx, 2) ? ctx->out[2].data : NULL;
    int64_t chunks = (N + 255) / 256;
    if (chunks > 128) chunks = 128;
    int64_t rows_per = (N + chunks - 1) / chunks;
    void *part = NULL;   // the partial sums, in the math type
    size_t acc_size = in->dtype == OM_F64 ? sizeof(double) : sizeof(float);
    if (ds || db) OMC_TRY(omc_temp_alloc(x, acc_size * (size_t)(2 * chunks * D), &part));
    OMC_DISPATCH_FLOAT(in->dtype, ctx, 1, {
        if (wanted(ctx, 0))
            layer_norm_dx_kernel<T><<<row_blocks(N), row_threads(D), 0, stream_of(x)>>>(
                (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const T *)in->data, (const T *)ctx->in[2].data,
                ctx->in[3].data, ctx->in[4].data, dmean, dinv, sdt, N, D);
        if (part) {
            A *pa = (A *)part;
            layer_norm_dparam_partial<T><<<dim3((unsigned)((D + 31) / 32), (unsigned)chunks), dim3(32, 8), 0, stream_of(x)>>>(
                pa, pa + chunks * D, (const T *)ctx->in[0].data, (const T *)in->data, ctx->in[3].data,
                ctx->in[4].data, sdt, N, D, rows_per);
            layer_norm_dparam_final<T><<<grid_for(D), OMC_THREADS, 0, stream_of(x)>>>((T *)ds, (T *)db, pa,
                                                                                      pa + chunks * D, chunks, D);
        }
    });
    om_status *st = omc_launched(ctx);
    if (part) omc_temp_free(x, part);
    return st;
}
