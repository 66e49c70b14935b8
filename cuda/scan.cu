// scan.cu — scan.c's ops on the CUDA provider: CumSum, GatherElements / GatherElementsGrad and
// ScatterElements.
//
// CumSum scans a row per block (the common last-axis case) or a column per thread. GatherElements
// and ScatterElements walk the indices one thread each; ScatterElements without reduction lets the
// last index (in row-major order) win a duplicated target, as the CPU's sequential loop does.
//
// Shape-like inputs (CumSum's axis) are read from the host copies the planner keeps; indices are
// data and are never read by the host: an index out of range contributes 0 (gathers) or nothing
// (scatters) on the GPU, where the CPU reports it. Indices that are a constant are range checked
// at plan time by scan.c's shape rules, which every plan runs: those are refused here too.
#include "common.cuh"

// ---- CumSum -----------------------------------------------------------------------------------------

// x, y are (outer, N, inner): one thread per (outer, inner) column walking N
template <typename Ti, typename To, typename Acc>
__global__ void cumsum_cols_kernel(To *y, const Ti *x, int64_t outer, int64_t N, int64_t inner, int excl, int rev) {
    GRID_STRIDE(c, outer * inner) {
        const int64_t o = c / inner, j = c - o * inner;
        Acc a = 0;
        for (int64_t s = 0; s < N; s++) {
            const int64_t at = (o * N + (rev ? N - 1 - s : s)) * inner + j;
            const Acc v = (Acc)ld(x[at]);
            if (excl) { y[at] = st<To>(a); a += v; }
            else { a += v; y[at] = st<To>(a); }
        }
    }
}

// x, y are (rows, N) (inner 1): one block per row, a block-wide scan over chunks of blockDim elements
template <typename Ti, typename To, typename Acc>
__global__ void cumsum_rows_kernel(To *y, const Ti *x, int64_t rows, int64_t N, int excl, int rev) {
    __shared__ Acc warp_tot[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const Ti *xr = x + r * N;
        To *yr = y + r * N;
        Acc carry = 0;
        for (int64_t base = 0; base < N; base += blockDim.x) {
            const int64_t k = base + threadIdx.x, at = rev ? N - 1 - k : k;
            const Acc v = k < N ? (Acc)ld(xr[at]) : (Acc)0;
            Acc s = v;   // inclusive scan within the warp
            for (int o = 1; o < 32; o <<= 1) {
                const Acc t = __shfl_up_sync(0xffffffffu, s, o);
                if (lane >= o) s += t;
            }
            if (lane == 31) warp_tot[w] = s;
            __syncthreads();
            if (w == 0) {   // scan of the warp totals
                Acc t = lane < nw ? warp_tot[lane] : (Acc)0;
                for (int o = 1; o < 32; o <<= 1) {
                    const Acc u = __shfl_up_sync(0xffffffffu, t, o);
                    if (lane >= o) t += u;
                }
                warp_tot[lane] = t;
            }
            __syncthreads();
            const Acc before = carry + (w ? warp_tot[w - 1] : (Acc)0);
            Acc ex = __shfl_up_sync(0xffffffffu, s, 1);
            if (lane == 0) ex = 0;
            if (k < N) yr[at] = st<To>(excl ? before + ex : before + s);
            carry += warp_tot[nw - 1];
            __syncthreads();
        }
    }
}

template <typename Ti, typename To, typename Acc>
static void cumsum_launch(To *y, const Ti *x, int64_t outer, int64_t N, int64_t inner, int excl, int rev, cudaStream_t s) {
    if (inner == 1)
        cumsum_rows_kernel<Ti, To, Acc><<<(unsigned)(outer < 65535 * 16 ? outer : 65535 * 16), 256, 0, s>>>(y, x, outer,
                                                                                                          N, excl, rev);
    else
        cumsum_cols_kernel<Ti, To, Acc><<<grid_for(outer * inner), OMC_THREADS, 0, s>>>(y, x, outer, N, inner, excl, rev);
}

// CumSum(x, axis; exclusive, reverse); bool/uint8/int8 sum into int64 (torch's promotion, as scan.c)
om_status *cumsum_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0];
    if (X->rank < 1) return OMC_ERR(OM_INVALID_ARGUMENT, "CumSum node '%s': x must have rank >= 1", omc_node_name(ctx));
    int64_t av[1] = {0};
    const om_dtype adt = ctx->in[1].dtype;
    if (adt != OM_I64 && adt != OM_I32) return omc_err_dtype(ctx, 1, adt);
    if (numel(&ctx->in[1]) != 1)
        return OMC_ERR(OM_INVALID_ARGUMENT, "CumSum node '%s': axis must be a scalar", omc_node_name(ctx));
    if (host_ints(ctx, x, 1, av, 1) != 1)
        return OMC_ERR(OM_INVALID_ARGUMENT, "CumSum node '%s': axis must be known at plan time", omc_node_name(ctx));
    const int axis = norm_axis(av[0], X->rank);
    if (axis < 0)
        return OMC_ERR(OM_INVALID_ARGUMENT, "CumSum node '%s': axis %lld is out of range for rank %d", omc_node_name(ctx),
                       (long long)av[0], X->rank);
    const int excl = attr_i(ctx, "exclusive", 0) != 0, rev = attr_i(ctx, "reverse", 0) != 0;
    const int64_t N = X->dims[axis], outer = dims_prod(X->dims, 0, axis), inner = dims_prod(X->dims, axis + 1, X->rank);
    if (!N || !outer || !inner) return NULL;
    void *y = ctx->out[0].data;
    const cudaStream_t s = stream_of(x);
    switch (X->dtype) {
    case OM_BOOL:
    case OM_U8: cumsum_launch<uint8_t, int64_t, int64_t>((int64_t *)y, (const uint8_t *)X->data, outer, N, inner, excl, rev, s); break;
    case OM_I8: cumsum_launch<int8_t, int64_t, int64_t>((int64_t *)y, (const int8_t *)X->data, outer, N, inner, excl, rev, s); break;
    default:
        OMC_DISPATCH_ARITH(X->dtype, ctx, 0, {
            cumsum_launch<T, T, A>((T *)y, (const T *)X->data, outer, N, inner, excl, rev, s);
        });
    }
    return omc_launched(ctx);
}

// ---- GatherElements / GatherElementsGrad / ScatterElements ---------------------------------------------

// Position p of indices (row-major over idims) addresses data at the same coordinates with the
// axis coordinate replaced by the (wrapped) index; indices may be smaller than data off the axis.
struct elem_walk {
    int rank, axis;
    int64_t N;                       // data's size along the axis
    int64_t idims[OM_MAX_RANK];      // indices dims
    int64_t dstride[OM_MAX_RANK];    // data strides
};

// data_like: data (or dx, whose shape is data's); ind: indices (input ind_i). The checks of scan.c
// that need no index values.
static om_status *elem_walk_init(const om_kernel_ctx *ctx, const om_tensor *data_like, int ind_i, elem_walk *w) {
    const om_tensor *ind = &ctx->in[ind_i];
    if (ind->dtype != OM_I64 && ind->dtype != OM_I32) return omc_err_dtype(ctx, ind_i, ind->dtype);
    if (ind->rank != data_like->rank || data_like->rank < 1)
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': indices (rank %d) must have the rank of data (rank %d >= 1)",
                       omc_op_name(ctx), omc_node_name(ctx), ind->rank, data_like->rank);
    const int64_t axis_attr = attr_i(ctx, "axis", 0);
    const int axis = norm_axis(axis_attr, data_like->rank);
    if (axis < 0)
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': axis %lld is out of range for rank %d", omc_op_name(ctx),
                       omc_node_name(ctx), (long long)axis_attr, data_like->rank);
    memset(w, 0, sizeof *w);
    w->rank = ind->rank;
    w->axis = axis;
    w->N = data_like->dims[axis];
    int64_t s = 1;
    for (int i = w->rank - 1; i >= 0; i--) {
        if (i != axis && ind->dims[i] > data_like->dims[i])
            return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': indices dim %d (%lld) exceeds data's (%lld)",
                           omc_op_name(ctx), omc_node_name(ctx), i, (long long)ind->dims[i],
                           (long long)data_like->dims[i]);
        w->idims[i] = ind->dims[i];
        w->dstride[i] = s;
        s *= data_like->dims[i];
    }
    return NULL;
}

// data offset for indices position p holding index iv, or -1 when iv is out of range
__device__ __forceinline__ int64_t elem_off(const elem_walk &w, int64_t p, int64_t iv) {
    if (iv < 0) iv += w.N;
    if (iv < 0 || iv >= w.N) return -1;
    int64_t off = iv * w.dstride[w.axis];
    for (int d = w.rank - 1; d >= 0; d--) {
        const int64_t q = p / w.idims[d];
        if (d != w.axis) off += (p - q * w.idims[d]) * w.dstride[d];
        p = q;
    }
    return off;
}

#define OMC_DISPATCH_INDEX(dt, ctx, i, ...)                                                  \
    switch (dt) {                                                                             \
    case OM_I64: { typedef int64_t I; __VA_ARGS__; } break;                                   \
    case OM_I32: { typedef int32_t I; __VA_ARGS__; } break;                                   \
    default: return omc_err_dtype((ctx), (i), (dt));                                          \
    }

// data is (d0..), indices and y are (i0..): y[p] = data[p with p[axis] = indices[p]]
template <typename U, typename I>
__global__ void gather_elements_kernel(U *y, const U *data, const I *idx, elem_walk w, int64_t K) {
    GRID_STRIDE(p, K) {
        const int64_t off = elem_off(w, p, (int64_t)idx[p]);
        y[p] = off >= 0 ? data[off] : (U)0;
    }
}

om_status *gather_elements_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *ind = &ctx->in[1];
    elem_walk w;
    OMC_TRY(elem_walk_init(ctx, X, 1, &w));
    const int64_t K = numel(ind);
    if (!K) return NULL;
    OMC_DISPATCH_SIZE(dtype_size(X->dtype), ctx, {
        OMC_DISPATCH_INDEX(ind->dtype, ctx, 1, {
            gather_elements_kernel<U, I><<<grid_for(K), OMC_THREADS, 0, stream_of(x)>>>(
                (U *)ctx->out[0].data, (const U *)X->data, (const I *)ind->data, w, K);
        });
    });
    return omc_launched(ctx);
}

// dy and indices are (i0..), dx is Shape(data) from zero in dy's math type (omc_scatter):
// dx[p with p[axis] = indices[p]] += dy[p]
template <typename T, typename I>
__global__ void gather_elements_grad_kernel(typename acc<T>::t *dx, const T *dy, const I *idx, elem_walk w,
                                            int64_t K) {
    GRID_STRIDE(p, K) {
        const int64_t off = elem_off(w, p, (int64_t)idx[p]);
        if (off >= 0) atomic_acc(&dx[off], ld(dy[p]));
    }
}

// GatherElementsGrad(dy, Shape(data), indices; axis) -> dx
om_status *gather_elements_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dY = &ctx->in[0], *ind = &ctx->in[2], *dX = &ctx->out[0];
    elem_walk w;
    OMC_TRY(elem_walk_init(ctx, dX, 2, &w));
    if (!om_dtype_in(dY->dtype, OM_DT_ARITH)) return omc_err_dtype(ctx, 0, dY->dtype);
    if (!om_dtype_in(ind->dtype, OM_DT_INDEX)) return omc_err_dtype(ctx, 2, ind->dtype);
    omc_scatter sc;
    OMC_TRY(omc_scatter_start(ctx, x, dY->dtype, dX->data, numel(dX), NULL, &sc));
    const int64_t K = numel(ind);
    if (!K) return omc_scatter_finish(ctx, x, &sc, NULL);
    OMC_DISPATCH_ARITH(dY->dtype, ctx, 0, {
        OMC_DISPATCH_INDEX(ind->dtype, ctx, 2, {
            gather_elements_grad_kernel<T, I><<<grid_for(K), OMC_THREADS, 0, stream_of(x)>>>(
                (A *)sc.acc, (const T *)dY->data, (const I *)ind->data, w, K);
        });
    });
    return omc_scatter_finish(ctx, x, &sc, omc_launched(ctx));
}

// reduction none, pass 1: each target remembers the last position p (row-major) that writes it
template <typename I>
__global__ void scatter_claim_kernel(long long *winner, const I *idx, elem_walk w, int64_t K) {
    GRID_STRIDE(p, K) {
        const int64_t off = elem_off(w, p, (int64_t)idx[p]);
        if (off >= 0) atomicMax(&winner[off], (long long)p);
    }
}

// pass 2: the winner writes its update
template <typename U, typename I>
__global__ void scatter_write_kernel(U *y, const U *upd, const long long *winner, const I *idx, elem_walk w, int64_t K) {
    GRID_STRIDE(p, K) {
        const int64_t off = elem_off(w, p, (int64_t)idx[p]);
        if (off >= 0 && winner[off] == (long long)p) y[off] = upd[p];
    }
}

// reduction add: y[target] += updates[p] (y starts as data, in its math type: omc_scatter)
template <typename T, typename I>
__global__ void scatter_add_kernel(typename acc<T>::t *y, const T *upd, const I *idx, elem_walk w, int64_t K) {
    GRID_STRIDE(p, K) {
        const int64_t off = elem_off(w, p, (int64_t)idx[p]);
        if (off >= 0) atomic_acc(&y[off], ld(upd[p]));
    }
}

// ScatterElements(data, indices, updates; axis, reduction none|add): data and y are (d0..),
// indices and updates are (i0..)
om_status *scatter_elements_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *ind = &ctx->in[1], *upd = &ctx->in[2], *Y = &ctx->out[0];
    const char *red = attr_s(ctx, "reduction", "none");
    const int add = !strcmp(red, "add");
    if (!add && strcmp(red, "none")) return omc_err_unsupported(ctx, "reduction other than none or add");
    if (upd->dtype != X->dtype) return omc_err_dtype(ctx, 2, upd->dtype);
    int same = upd->rank == ind->rank;
    for (int d = 0; same && d < ind->rank; d++) same = upd->dims[d] == ind->dims[d];
    if (!same)
        return OMC_ERR(OM_INVALID_ARGUMENT, "ScatterElements node '%s': updates must have the shape of indices",
                       omc_node_name(ctx));
    elem_walk w;
    OMC_TRY(elem_walk_init(ctx, X, 1, &w));
    OMC_TRY(copy_d2d(Y->data, X->data, nbytes(X), x));
    const int64_t K = numel(ind);
    if (!K) return NULL;
    if (add) {
        if (!om_dtype_in(X->dtype, OM_DT_ARITH)) return omc_err_dtype(ctx, 0, X->dtype);
        if (!om_dtype_in(ind->dtype, OM_DT_INDEX)) return omc_err_dtype(ctx, 1, ind->dtype);
        omc_scatter sc;
        OMC_TRY(omc_scatter_start(ctx, x, X->dtype, Y->data, numel(X), Y->data, &sc));
        OMC_DISPATCH_ARITH(X->dtype, ctx, 0, {
            OMC_DISPATCH_INDEX(ind->dtype, ctx, 1, {
                scatter_add_kernel<T, I><<<grid_for(K), OMC_THREADS, 0, stream_of(x)>>>(
                    (A *)sc.acc, (const T *)upd->data, (const I *)ind->data, w, K);
            });
        });
        return omc_scatter_finish(ctx, x, &sc, omc_launched(ctx));
    }
    long long *winner = NULL;
    OMC_TRY(omc_temp_alloc(x, sizeof(long long) * (size_t)numel(X), (void **)&winner));
    om_status *st = omc_cuda(cudaMemsetAsync(winner, 0xff, sizeof(long long) * (size_t)numel(X), stream_of(x)),
                             "cudaMemsetAsync");   // every target starts at -1: no writer
    if (!st) {
        switch (ind->dtype) {
        case OM_I64: scatter_claim_kernel<int64_t><<<grid_for(K), OMC_THREADS, 0, stream_of(x)>>>(
                         winner, (const int64_t *)ind->data, w, K); break;
        default: scatter_claim_kernel<int32_t><<<grid_for(K), OMC_THREADS, 0, stream_of(x)>>>(
                     winner, (const int32_t *)ind->data, w, K); break;
        }
        st = omc_launched(ctx);
    }
    if (!st) {
        switch (dtype_size(X->dtype)) {
#define SCATTER_WRITE(U)                                                                                          \
    if (ind->dtype == OM_I64)                                                                                     \
        scatter_write_kernel<U, int64_t><<<grid_for(K), OMC_THREADS, 0, stream_of(x)>>>(                          \
            (U *)Y->data, (const U *)upd->data, winner, (const int64_t *)ind->data, w, K);                        \
    else                                                                                                          \
        scatter_write_kernel<U, int32_t><<<grid_for(K), OMC_THREADS, 0, stream_of(x)>>>(                          \
            (U *)Y->data, (const U *)upd->data, winner, (const int32_t *)ind->data, w, K);
        case 1: SCATTER_WRITE(uint8_t) break;
        case 2: SCATTER_WRITE(uint16_t) break;
        case 4: SCATTER_WRITE(uint32_t) break;
        case 8: SCATTER_WRITE(uint64_t) break;
        default: st = omc_err_unsupported(ctx, "element size"); break;
#undef SCATTER_WRITE
        }
        if (!st) st = omc_launched(ctx);
    }
    omc_temp_free(x, winner);
    return st;
}
