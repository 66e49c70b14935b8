// gather_nd.cu — gather_nd.c's ops: GatherND, GatherNDGrad and ScatterND.
//
// The geometry is the CPU's (ops/nd_geom.h). One thread per element of the gathered (or
// scattered) rows: element e of row q reads its tuple, adds its slice offset, and moves or adds
// one element. ScatterND without reduction lets the last tuple (row-major) win a duplicated
// target, as the CPU's sequential loop does: each target slice first remembers the last row that
// writes it (atomicMax), then only that row's threads write. The adds (GatherNDGrad, ScatterND
// add) go through omc_scatter: atomics in the output's math type, fp32 for fp16/bf16, rounded
// once.
//
// Tuples are data and are never read by the host: an entry out of range contributes 0 (GatherND)
// or nothing (the scatters) on the GPU, where the CPU reports it. Tuples that are a constant are
// range checked at plan time by gather_nd.c's shape rules, which every plan runs.
#include "common.cuh"

#include "ops/nd_geom.h"

#define OMC_DISPATCH_INDEX(dt, ctx, i, ...)                                                  \
    switch (dt) {                                                                             \
    case OM_I64: { typedef int64_t I; __VA_ARGS__; } break;                                   \
    case OM_I32: { typedef int32_t I; __VA_ARGS__; } break;                                   \
    default: return omc_err_dtype((ctx), (i), (dt));                                          \
    }

// dims (dd, r) of data (or of Shape(data)), indices input ind_i, batch_dims b
static om_status *nd_init(const om_kernel_ctx *ctx, const int64_t *dd, int r, int ind_i, int64_t b, om_nd_geom *g) {
    const om_tensor *ind = &ctx->in[ind_i];
    if (ind->dtype != OM_I64 && ind->dtype != OM_I32) return omc_err_dtype(ctx, ind_i, ind->dtype);
    const char *why = om_nd_geometry(dd, r, ind->dims, ind->rank, b, g);
    if (why) return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': %s", omc_op_name(ctx), omc_node_name(ctx), why);
    return NULL;
}

// the element offset in data of row q's slice, or -1 when an entry is out of range
template <typename I>
__device__ __forceinline__ int64_t nd_row_off(const om_nd_geom &g, const I *idx, int64_t q) {
    int64_t off = (q / g.R) * g.batch_stride;
    for (int j = 0; j < g.k; j++) {
        int64_t v = (int64_t)idx[q * g.k + j];
        if (v < 0) v += g.dim[j];
        if (v < 0 || v >= g.dim[j]) return -1;
        off += v * g.stride[j];
    }
    return off;
}

// ---- GatherND ----------------------------------------------------------------------------------

// data is (d0..), indices (i0.., k), y is (rows, slice): y[q, e] = data[off(q) + e]
template <typename U, typename I>
__global__ void gather_nd_kernel(U *y, const U *data, const I *idx, om_nd_geom g, int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t q = i / g.slice, off = nd_row_off(g, idx, q);
        y[i] = off >= 0 ? data[off + (i - q * g.slice)] : (U)0;
    }
}

om_status *gather_nd_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *ind = &ctx->in[1];
    om_nd_geom g;
    OMC_TRY(nd_init(ctx, X->dims, X->rank, 1, attr_i(ctx, "batch_dims", 0), &g));
    const int64_t n = g.B * g.R * g.slice;
    if (!n) return NULL;
    OMC_DISPATCH_SIZE(dtype_size(X->dtype), ctx, {
        OMC_DISPATCH_INDEX(ind->dtype, ctx, 1, {
            gather_nd_kernel<U, I><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (U *)ctx->out[0].data, (const U *)X->data, (const I *)ind->data, g, n);
        });
    });
    return omc_launched(ctx);
}

// ---- GatherNDGrad / ScatterND(add) -------------------------------------------------------------

// dst (Shape(data), math type A) [off(q) + e] += src[q, e]
template <typename T, typename I>
__global__ void nd_add_kernel(typename acc<T>::t *dst, const T *src, const I *idx, om_nd_geom g, int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t q = i / g.slice, off = nd_row_off(g, idx, q);
        if (off >= 0) atomic_acc(&dst[off + (i - q * g.slice)], ld(src[i]));
    }
}

// GatherNDGrad(dy, Shape(data), indices; batch_dims) -> dx
om_status *gather_nd_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dY = &ctx->in[0], *ind = &ctx->in[2], *dX = &ctx->out[0];
    om_nd_geom g;
    OMC_TRY(nd_init(ctx, dX->dims, dX->rank, 2, attr_i(ctx, "batch_dims", 0), &g));
    if (!om_dtype_in(dY->dtype, OM_DT_FLOAT)) return omc_err_dtype(ctx, 0, dY->dtype);
    omc_scatter sc;
    OMC_TRY(omc_scatter_start(ctx, x, dY->dtype, dX->data, numel(dX), NULL, &sc));
    const int64_t n = g.B * g.R * g.slice;
    if (!n) return omc_scatter_finish(ctx, x, &sc, NULL);
    OMC_DISPATCH_FLOAT(dY->dtype, ctx, 0, {
        OMC_DISPATCH_INDEX(ind->dtype, ctx, 2, {
            nd_add_kernel<T, I><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (A *)sc.acc, (const T *)dY->data, (const I *)ind->data, g, n);
        });
    });
    return omc_scatter_finish(ctx, x, &sc, omc_launched(ctx));
}

// ---- ScatterND ---------------------------------------------------------------------------------

// reduction none, pass 1: each target slice (offset / slice) remembers the last row that writes it
template <typename I>
__global__ void nd_claim_kernel(long long *winner, const I *idx, om_nd_geom g, int64_t rows) {
    GRID_STRIDE(q, rows) {
        const int64_t off = nd_row_off(g, idx, q);
        if (off >= 0) atomicMax(&winner[off / g.slice], (long long)q);
    }
}

// pass 2: the winner's elements are written
template <typename U, typename I>
__global__ void nd_write_kernel(U *y, const U *upd, const long long *winner, const I *idx, om_nd_geom g, int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t q = i / g.slice, off = nd_row_off(g, idx, q);
        if (off >= 0 && winner[off / g.slice] == (long long)q) y[off + (i - q * g.slice)] = upd[i];
    }
}

// ScatterND(data, indices, updates; reduction none|add): data and y are (d0..), updates (rows, slice)
om_status *scatter_nd_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *ind = &ctx->in[1], *upd = &ctx->in[2], *Y = &ctx->out[0];
    const char *red = attr_s(ctx, "reduction", "none");
    const int add = !strcmp(red, "add");
    if (!add && strcmp(red, "none")) return omc_err_unsupported(ctx, "reduction other than none or add");
    if (upd->dtype != X->dtype) return omc_err_dtype(ctx, 2, upd->dtype);
    om_nd_geom g;
    OMC_TRY(nd_init(ctx, X->dims, X->rank, 1, 0, &g));
    const int64_t rows = g.B * g.R, n = rows * g.slice;
    if (numel(upd) != n)
        return OMC_ERR(OM_INVALID_ARGUMENT, "ScatterND node '%s': updates must have the shape indices.shape[:-1] + "
                       "data.shape[k:]", omc_node_name(ctx));
    if (add) {
        if (!om_dtype_in(X->dtype, OM_DT_ARITH)) return omc_err_dtype(ctx, 0, X->dtype);
        omc_scatter sc;
        OMC_TRY(omc_scatter_start(ctx, x, X->dtype, Y->data, numel(X), X->data, &sc));
        if (!n) return omc_scatter_finish(ctx, x, &sc, NULL);
        OMC_DISPATCH_ARITH(X->dtype, ctx, 0, {
            OMC_DISPATCH_INDEX(ind->dtype, ctx, 1, {
                nd_add_kernel<T, I><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                    (A *)sc.acc, (const T *)upd->data, (const I *)ind->data, g, n);
            });
        });
        return omc_scatter_finish(ctx, x, &sc, omc_launched(ctx));
    }
    OMC_TRY(copy_d2d(Y->data, X->data, nbytes(X), x));
    if (!n) return NULL;
    const int64_t targets = numel(X) / g.slice;
    long long *winner = NULL;
    OMC_TRY(omc_temp_alloc(x, sizeof(long long) * (size_t)targets, (void **)&winner));
    om_status *st = omc_cuda(cudaMemsetAsync(winner, 0xff, sizeof(long long) * (size_t)targets, stream_of(x)),
                             "cudaMemsetAsync");   // every target starts at -1: no writer
    if (!st) {
        if (ind->dtype == OM_I64)
            nd_claim_kernel<int64_t><<<grid_for(rows), OMC_THREADS, 0, stream_of(x)>>>(
                winner, (const int64_t *)ind->data, g, rows);
        else
            nd_claim_kernel<int32_t><<<grid_for(rows), OMC_THREADS, 0, stream_of(x)>>>(
                winner, (const int32_t *)ind->data, g, rows);
        st = omc_launched(ctx);
    }
    if (!st) {
        switch (dtype_size(X->dtype)) {
#define ND_WRITE(U)                                                                                               \
    if (ind->dtype == OM_I64)                                                                                     \
        nd_write_kernel<U, int64_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(                               \
            (U *)Y->data, (const U *)upd->data, winner, (const int64_t *)ind->data, g, n);                        \
    else                                                                                                          \
        nd_write_kernel<U, int32_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(                               \
            (U *)Y->data, (const U *)upd->data, winner, (const int32_t *)ind->data, g, n);
        case 1: ND_WRITE(uint8_t) break;
        case 2: ND_WRITE(uint16_t) break;
        case 4: ND_WRITE(uint32_t) break;
        case 8: ND_WRITE(uint64_t) break;
        default: st = omc_err_unsupported(ctx, "element size"); break;
#undef ND_WRITE
        }
        if (!st) st = omc_launched(ctx);
    }
    omc_temp_free(x, winner);
    return st;
}
