// pool.cu — pool.c's ops on the CUDA provider: MaxPool / AveragePool / GlobalAveragePool /
// GlobalMaxPool and their backward ops. The windows are spatial.h's, as on the CPU.
//
// AveragePoolGrad and GlobalPoolGrad are gathers (each input element sums the outputs whose
// window holds it), so they need no atomics and no zero fill; MaxPoolGrad scatters through the
// saved argmax with atomics. Elementwise passes are grid-stride loops.
#include <math.h>

#include "common.cuh"

// spatial.h (window geometry: kernel, strides, dilations, pads, auto_pad, ceil_mode, shared with
// conv.c and pool.c) calls the engine's attribute and error functions. The provider reaches the
// engine only through om_cuda_host (the extension's symbols are hidden), so this file maps those
// names onto the host table: both providers resolve a window with the same code.
#define om_error(...) g_host.error(__VA_ARGS__)
#define om_attr_int(n, name, d) g_host.attr_int((n), (name), (d))
#define om_attr_ints(n, name, v) g_host.attr_ints((n), (name), (v))
#define om_attr_string(n, name, d) g_host.attr_string((n), (name), (d))
#include "ops/spatial.h"
#include "window.cuh"

// ---- MaxPool / MaxPoolGrad --------------------------------------------------------------------------

static om_status *pool_window(const om_kernel_ctx *ctx, int xr, const int64_t *xd, om_window *w) {
    return om_window_init(ctx->node, xr, xd, NULL, (int)attr_i(ctx, "ceil_mode", 0), w);
}

// x is (P, *S) planes, y and idx are (P, *O); idx is ONNX's flat index into x (-1: no tap inside).
// NaN wins a window, the first one found stays (as pool.c).
template <typename T>
__global__ void max_pool_kernel(T *y, int64_t *idx, const T *x, om_window w, int64_t P) {
    typedef typename acc<T>::t A;
    const int64_t OS = w.out[0] * w.out[1] * w.out[2], IS = w.in[0] * w.in[1] * w.in[2];
    GRID_STRIDE(i, P * OS) {
        const int64_t p = i / OS;
        int64_t od, oh, ow;
        out_coords(w, i - p * OS, &od, &oh, &ow);
        const T *xc = x + p * IS;
        A best = -INFINITY;
        int64_t bi = -1;
        for_taps_in(w, od, oh, ow, [&](int64_t at) {
            const A v = ld(xc[at]);
            if (bi < 0 || v > best || v != v) {   // eager's rule: a later NaN wins
                best = v;
                bi = at;
            }
        });
        y[i] = st<T>(best);
        if (idx) idx[i] = bi < 0 ? -1 : p * IS + bi;
    }
}

om_status *max_pool_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0];
    om_window w;
    OMC_TRY(pool_window(ctx, X->rank, X->dims, &w));
    if (attr_i(ctx, "storage_order", 0) != 0) return omc_err_unsupported(ctx, "storage_order = 1 (column-major indices)");
    const int64_t P = w.N * w.C, n = P * om_window_out_size(&w);
    if (!n) return NULL;
    int64_t *idx = wanted(ctx, 1) ? (int64_t *)ctx->out[1].data : NULL;
    OMC_DISPATCH_FLOAT(X->dtype, ctx, 0, {
        max_pool_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, idx, (const T *)X->data,
                                                                          w, P);
    });
    return omc_launched(ctx);
}

// dy, idx are (P, OS), dx is (P, IS) from zero in dy's math type (omc_scatter): dx[idx] += dy. An index outside its plane (only a
// corrupted Indices tensor has one) contributes nothing: the CPU reports it, the GPU cannot without
// a synchronization.
template <typename T>
__global__ void max_pool_grad_kernel(typename acc<T>::t *dx, const T *dy, const int64_t *idx, int64_t P, int64_t IS, int64_t OS) {
    GRID_STRIDE(i, P * OS) {
        const int64_t p = i / OS, at = idx[i] - p * IS;
        if (at >= 0 && at < IS) atomic_acc(&dx[p * IS + at], ld(dy[i]));
    }
}

// MaxPoolGrad(dY, Indices, Shape(X)) -> dX
om_status *max_pool_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dY = &ctx->in[0], *dX = &ctx->out[0];
    if (ctx->in[1].dtype != OM_I64) return omc_err_dtype(ctx, 1, ctx->in[1].dtype);
    if (dX->rank < 2) return omc_err_unsupported(ctx, "dX of rank < 2");
    const int64_t P = dX->dims[0] * dX->dims[1];
    const int64_t IS = P ? numel(dX) / P : 0, OS = P ? numel(dY) / P : 0;
    if (!om_dtype_is_float(dY->dtype)) return omc_err_dtype(ctx, 0, dY->dtype);
    omc_scatter sc;
    OMC_TRY(omc_scatter_start(ctx, x, dY->dtype, dX->data, numel(dX), NULL, &sc));
    if (!P || !OS || !IS) return omc_scatter_finish(ctx, x, &sc, NULL);
    OMC_DISPATCH_FLOAT(dY->dtype, ctx, 0, {
        max_pool_grad_kernel<T><<<grid_for(P * OS), OMC_THREADS, 0, stream_of(x)>>>(
            (A *)sc.acc, (const T *)dY->data, (const int64_t *)ctx->in[1].data, P, IS, OS);
    });
    return omc_scatter_finish(ctx, x, &sc, omc_launched(ctx));
}

// ---- AveragePool / AveragePoolGrad ------------------------------------------------------------------

// The divisor of output position (od, oh, ow): taps inside the input, or (count_include_pad) taps
// inside the padded input — PyTorch's rule, as pool.c.
__device__ __forceinline__ int64_t avg_divisor(const om_window &w, int incl, int64_t od, int64_t oh, int64_t ow) {
    const int64_t o[OM_SP] = {od, oh, ow};
    int64_t div = 1;
    for (int i = 0; i < OM_SP; i++) {
        const int64_t lo = incl ? -w.pb[i] : 0, hi = incl ? w.in[i] + w.pe[i] : w.in[i];
        int64_t cnt = 0;
        for (int64_t k = 0; k < w.k[i]; k++) {
            const int64_t pos = o[i] * w.s[i] - w.pb[i] + k * w.d[i];
            cnt += pos >= lo && pos < hi;
        }
        div *= cnt;
    }
    return div;
}

// x is (P, *S), y is (P, *O)
template <typename T>
__global__ void average_pool_kernel(T *y, const T *x, om_window w, int incl, int64_t P) {
    typedef typename acc<T>::t A;
    const int64_t OS = w.out[0] * w.out[1] * w.out[2], IS = w.in[0] * w.in[1] * w.in[2];
    GRID_STRIDE(i, P * OS) {
        const int64_t p = i / OS;
        int64_t od, oh, ow;
        out_coords(w, i - p * OS, &od, &oh, &ow);
        const T *xc = x + p * IS;
        A s = 0;
        for_taps_in(w, od, oh, ow, [&](int64_t at) { s += ld(xc[at]); });
        const int64_t div = avg_divisor(w, incl, od, oh, ow);
        y[i] = st<T>(div > 0 ? s / (A)div : (A)0);
    }
}

om_status *average_pool_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0];
    om_window w;
    OMC_TRY(pool_window(ctx, X->rank, X->dims, &w));
    const int incl = attr_i(ctx, "count_include_pad", 0) != 0;
    const int64_t P = w.N * w.C, n = P * om_window_out_size(&w);
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(X->dtype, ctx, 0, {
        average_pool_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)X->data,
                                                                              w, incl, P);
    });
    return omc_launched(ctx);
}

// dy is (P, *O), dx is (P, *S): each input position sums dy / divisor over the windows that hold it
template <typename T>
__global__ void average_pool_grad_kernel(T *dx, const T *dy, om_window w, int incl, int64_t P) {
    typedef typename acc<T>::t A;
    const int64_t OS = w.out[0] * w.out[1] * w.out[2], IS = w.in[0] * w.in[1] * w.in[2];
    GRID_STRIDE(i, P * IS) {
        const int64_t s = i % IS, p = i / IS;
        const int64_t iw = s % w.in[2], ih = (s / w.in[2]) % w.in[1], id = s / (w.in[2] * w.in[1]);
        const T *g = dy + p * OS;
        A sum = 0;
        for_windows_of(w, id, ih, iw, [&](int64_t, int64_t od, int64_t oh, int64_t ow) {
            const int64_t div = avg_divisor(w, incl, od, oh, ow);
            if (div > 0) sum += ld(g[(od * w.out[1] + oh) * w.out[2] + ow]) / (A)div;
        });
        dx[i] = st<T>(sum);
    }
}

// AveragePoolGrad(dY, Shape(X)) -> dX
om_status *average_pool_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dX = &ctx->out[0];
    om_window w;
    OMC_TRY(pool_window(ctx, dX->rank, dX->dims, &w));
    const int incl = attr_i(ctx, "count_include_pad", 0) != 0;
    const int64_t P = w.N * w.C, n = P * om_window_in_size(&w);
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(dX->dtype, ctx, 0, {
        average_pool_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)dX->data,
                                                                                   (const T *)ctx->in[0].data, w, incl, P);
    });
    return omc_launched(ctx);
}

// ---- GlobalAveragePool / GlobalMaxPool / GlobalPoolGrad: one warp per (n, c) plane ------------------

// max that keeps a NaN: once either side is NaN the result is (as pool.c's running max)
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) { return a != a ? a : b != b ? b : b > a ? b : a; }

// x is (P, S), y is (P)
template <typename T>
__global__ void global_pool_kernel(T *y, const T *x, int64_t P, int64_t S, int is_max) {
    typedef typename acc<T>::t A;
    const int lane = threadIdx.x & 31;
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t p = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; p < P; p += warps) {
        const T *r = x + p * S;
        if (is_max) {
            A m = -INFINITY;
            for (int64_t i = lane; i < S; i += 32) m = nan_max(m, ld(r[i]));
            for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (lane == 0) y[p] = st<T>(m);
        } else {
            A s = 0;
            for (int64_t i = lane; i < S; i += 32) s += ld(r[i]);
            s = warp_sum(s);
            if (lane == 0) y[p] = st<T>(S ? s / (A)S : (A)0);
        }
    }
}

om_status *global_pool_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0];
    if (X->rank < 2) return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': X must have rank >= 2", omc_op_name(ctx),
                                    omc_node_name(ctx));
    const int is_max = !strcmp(omc_op_name(ctx), "GlobalMaxPool");
    const int64_t P = X->dims[0] * X->dims[1], S = P ? numel(X) / P : 0;
    if (!P) return NULL;
    OMC_DISPATCH_FLOAT(X->dtype, ctx, 0, {
        global_pool_kernel<T><<<grid_for(P * 32), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data,
                                                                                  (const T *)X->data, P, S, is_max);
    });
    return omc_launched(ctx);
}

// dy is (P); x (P, S) and y (P) for the max (else NULL); dx is (P, S). Max: dy goes to the first
// position equal to the max (a NaN max: the first NaN), as PyTorch's max reduction; average: dy / S.
template <typename T>
__global__ void global_pool_grad_kernel(T *dx, const T *dy, const T *x, const T *y, int64_t P, int64_t S) {
    typedef typename acc<T>::t A;
    const int lane = threadIdx.x & 31;
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t p = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; p < P; p += warps) {
        const A g = ld(dy[p]);
        T *d = dx + p * S;
        if (x) {
            const A m = ld(y[p]);
            int64_t at = INT64_MAX;
            for (int64_t i = lane; i < S; i += 32) {
                const A v = ld(x[p * S + i]);
                if (v == m || (m != m && v != v)) { at = i; break; }
            }
            for (int o = 16; o > 0; o >>= 1) {
                const int64_t other = __shfl_xor_sync(0xffffffffu, at, o);
                at = other < at ? other : at;
            }
            for (int64_t i = lane; i < S; i += 32) d[i] = st<T>(i == at ? g : (A)0);
        } else {
            const A v = S ? g / (A)S : (A)0;
            for (int64_t i = lane; i < S; i += 32) d[i] = st<T>(v);
        }
    }
}

// GlobalPoolGrad(dY, X?, Y?, Shape(X)) -> dX
om_status *global_pool_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dX = &ctx->out[0];
    if (dX->rank < 2) return omc_err_unsupported(ctx, "dX of rank < 2");
    const int is_max = present(ctx, 1);
    if (is_max && !present(ctx, 2)) return OMC_ERR(OM_INVALID_ARGUMENT, "GlobalPoolGrad node '%s': X given without Y",
                                                   omc_node_name(ctx));
    const int64_t P = dX->dims[0] * dX->dims[1], S = P ? numel(dX) / P : 0;
    if (!P || !S) return NULL;
    OMC_DISPATCH_FLOAT(dX->dtype, ctx, 0, {
        global_pool_grad_kernel<T><<<grid_for(P * 32), OMC_THREADS, 0, stream_of(x)>>>(
            (T *)dX->data, (const T *)ctx->in[0].data, is_max ? (const T *)ctx->in[1].data : NULL,
            is_max ? (const T *)ctx->in[2].data : NULL, P, S);
    });
    return omc_launched(ctx);
}
