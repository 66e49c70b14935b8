// fused_llama.cu — fused_llama.c's ops on the GPU: SwiGLU and FusedRotary with their backward
// ops, one thread per output element, the math in fp32 for fp16/bf16 (rounded once on store) and
// fp64 for fp64. The formulas are the CPU kernels', term for term (fused_llama.c says why they are
// the unfused graph's).
#include <math.h>

#include "common.cuh"

template <typename A> __device__ __forceinline__ A swiglu_sigmoid(A v) {   // elementwise.cu's sigmoid_
    A e = exp(-(v < 0 ? -v : v));
    A s = (A)1 / ((A)1 + e);
    return v >= 0 ? s : e * s;
}

// ---- SwiGLU ---------------------------------------------------------------------------------------

// y, gate, up broadcast to y (n elements): y = (g sigmoid(g)) u
template <typename T> __global__ void swiglu_kernel(T *y, const T *g, const T *u, bcast p, int64_t n) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        A gv = ld(g[bcast_off(p, 1, i)]), uv = ld(u[bcast_off(p, 2, i)]);
        y[i] = st<T>((gv * swiglu_sigmoid(gv)) * uv);
    }
}

om_status *swiglu_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *ops[3] = {&ctx->out[0], &ctx->in[0], &ctx->in[1]};
    bcast p;
    if (bcast_init(&p, &ctx->out[0], ops, 3))
        return OMC_ERR(OM_INVALID_ARGUMENT, "SwiGLU node '%s': gate and up do not broadcast", omc_node_name(ctx));
    int64_t n = numel(&ctx->out[0]);
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        swiglu_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)ctx->in[0].data,
                                                                         (const T *)ctx->in[1].data, p, n);
    });
    return omc_launched(ctx);
}

// dy (n elements), gate and up broadcast into it; dg, du of dy's shape or NULL (dg may be dy: each
// element is read before it is written):
//   t = dy u, dg = t s + ((t g) s)(1 - s), du = dy (g s), s = sigmoid(g)
template <typename T>
__global__ void swiglu_grad_kernel(T *dg, T *du, const T *dy, const T *g, const T *u, bcast p, int64_t n) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        A gv = ld(g[bcast_off(p, 1, i)]), uv = ld(u[bcast_off(p, 2, i)]), d = ld(dy[i]);
        A s = swiglu_sigmoid(gv), t = d * uv;
        A a = t * s, b = ((t * gv) * s) * ((A)1 - s), v = d * (gv * s);
        if (dg) dg[i] = st<T>(a + b);
        if (du) du[i] = st<T>(v);
    }
}

om_status *swiglu_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *ops[3] = {&ctx->in[0], &ctx->in[1], &ctx->in[2]};
    bcast p;
    if (bcast_init(&p, &ctx->in[0], ops, 3))
        return OMC_ERR(OM_INVALID_ARGUMENT, "SwiGLUGrad node '%s': gate and up do not broadcast into dy",
                       omc_node_name(ctx));
    int64_t n = numel(&ctx->in[0]);
    if (!n || (!wanted(ctx, 0) && !wanted(ctx, 1))) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        swiglu_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            wanted(ctx, 0) ? (T *)ctx->out[0].data : NULL, wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL,
            (const T *)ctx->in[0].data, (const T *)ctx->in[1].data, (const T *)ctx->in[2].data, p, n);
    });
    return omc_launched(ctx);
}

// ---- FusedRotary ------------------------------------------------------------------------------

// rows of d along x's last dim, split s (m = d - s); cos and sin broadcast into x (plan p: operands
// cos, sin over x's shape)
struct rope_geo {
    int64_t d, s;
};

// The shape rule checked the bounds (fused_llama.c's rope_geometry); here they are read again and
// clamped the same way.
static om_status *rope_setup(const om_kernel_ctx *ctx, const om_cuda_exec *x, int xi, rope_geo *r, bcast *p) {
    const om_tensor *t = &ctx->in[xi];
    if (t->rank < 1) return omc_err_unsupported(ctx, "x of rank 0");
    int64_t split, end;
    if (host_ints(ctx, x, 3, &split, 1) != 1 || host_ints(ctx, x, 4, &end, 1) != 1)
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': rotate_half's bounds must be integers known at plan time",
                       omc_op_name(ctx), omc_node_name(ctx));
    int64_t d = t->dims[t->rank - 1];
    if (split < 0) split += d;
    split = split < 0 ? 0 : split > d ? d : split;
    if (end < 0) end += d;
    end = end < 0 ? 0 : end > d ? d : end;
    if (split + (end > split ? end - split : 0) != d)
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': rotate_half's slices do not cover the last dim",
                       omc_op_name(ctx), omc_node_name(ctx));
    r->d = d;
    r->s = split;
    const om_tensor *ops[2] = {&ctx->in[1], &ctx->in[2]};
    if (bcast_init(p, t, ops, 2))
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': cos and sin do not broadcast into x", omc_op_name(ctx),
                       omc_node_name(ctx));
    return NULL;
}

// x, y (n elements, rows of d): y_k = x_k c_k + rot(x)_k sn_k,
//   rot(x)_k = -x_{s+k} (k < d - s), x_{k-(d-s)} (k >= d - s)
template <typename T>
__global__ void rope_kernel(T *y, const T *x, const T *c, const T *sn, bcast p, rope_geo r, int64_t n) {
    typedef typename acc<T>::t A;
    const int64_t m = r.d - r.s;
    GRID_STRIDE(i, n) {
        int64_t k = i % r.d, row0 = i - k;
        A rot = k < m ? -ld(x[row0 + r.s + k]) : ld(x[row0 + k - m]);
        y[i] = st<T>(ld(x[i]) * ld(c[bcast_off(p, 0, i)]) + rot * ld(sn[bcast_off(p, 1, i)]));
    }
}

om_status *fused_rotary_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    rope_geo r;
    bcast p;
    OMC_TRY(rope_setup(ctx, x, 0, &r, &p));
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        rope_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)ctx->in[0].data,
                                                                       (const T *)ctx->in[1].data, (const T *)ctx->in[2].data,
                                                                       p, r, n);
    });
    return omc_launched(ctx);
}

// dy (n elements, rows of d); dx, dc, ds of dy's shape, or NULL; x read for dc and ds:
//   dx_k = dy_k c_k + dy_{k+m} sn_{k+m} (k < s), dy_k c_k - dy_{k-s} sn_{k-s} (k >= s)
//   dc_k = dy_k x_k, ds_k = dy_k rot(x)_k
template <typename T>
__global__ void rope_grad_kernel(T *dx, T *dc, T *ds, const T *dy, const T *x, const T *c, const T *sn, bcast p,
                                 rope_geo r, int64_t n) {
    typedef typename acc<T>::t A;
    const int64_t m = r.d - r.s;
    GRID_STRIDE(i, n) {
        int64_t k = i % r.d, row0 = i - k;
        A g = ld(dy[i]);
        if (dx) {
            int64_t q = k < r.s ? row0 + k + m : row0 + k - r.s;
            A t = ld(dy[q]) * ld(sn[bcast_off(p, 1, q)]);
            dx[i] = st<T>(g * ld(c[bcast_off(p, 0, i)]) + (k < r.s ? t : -t));
        }
        if (dc) dc[i] = st<T>(g * ld(x[i]));
        if (ds) ds[i] = st<T>(g * (k < m ? -ld(x[row0 + r.s + k]) : ld(x[row0 + k - m])));
    }
}

om_status *fused_rotary_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    rope_geo r;
    bcast p;
    OMC_TRY(rope_setup(ctx, x, 0, &r, &p));
    int64_t n = numel(&ctx->in[0]);
    int want_x = wanted(ctx, 1) || wanted(ctx, 2);
    if (want_x && !present(ctx, 5))
        return OMC_ERR(OM_INVALID_ARGUMENT, "FusedRotaryGrad node '%s': cos's or sin's gradient needs x (input 5)",
                       omc_node_name(ctx));
    if (!n || (!wanted(ctx, 0) && !want_x)) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        rope_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            wanted(ctx, 0) ? (T *)ctx->out[0].data : NULL, wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL,
            wanted(ctx, 2) ? (T *)ctx->out[2].data : NULL, (const T *)ctx->in[0].data,
            want_x ? (const T *)ctx->in[5].data : NULL, (const T *)ctx->in[1].data, (const T *)ctx->in[2].data, p, r, n);
    });
    return omc_launched(ctx);
}
