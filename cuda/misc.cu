// misc.cu — the rest of misc.c and scan.c: Pad / PadGrad, Einsum, CumSum, GatherElements /
// GatherElementsGrad and ScatterElements.
//
// Pad is one thread per output element (the source index per dim: pad_geom.h's om_pad_src); its
// backward gathers in constant mode (each input element has one source) and scatter-adds with
// atomics in reflect/edge/wrap mode. Einsum runs the CPU's plan: operands gathered into
// (batch, I, K) and (batch, K, J), one strided-batched cuBLAS GEMM, the product gathered into the
// output's label order — a gather is skipped when the operand already has that layout. CumSum
// scans a row per block (the common last-axis case) or a column per thread. GatherElements and
// ScatterElements walk the indices one thread each; ScatterElements without reduction lets the
// last index (in row-major order) win a duplicated target, as the CPU's sequential loop does.
//
// Shape-like inputs (Pad's pads and axes, CumSum's axis) are read from the host copies the planner
// keeps; indices are data and are never read by the host: an index out of range contributes 0
// (gathers) or nothing (scatters) on the GPU, where the CPU reports it.
#include "common.cuh"


static int64_t dims_prod(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}

// ---- Pad / PadGrad ---------------------------------------------------------------------------------

// pad_geom, om_pad_geometry and om_pad_src come from ops/pad_geom.h, shared with misc.c; it reports
// errors and reads the mode through the engine's names, mapped here onto the host table (as
// conv.cu does for spatial.h)
#define om_error(...) g_host.error(__VA_ARGS__)
#define om_attr_string(n, name, d) g_host.attr_string((n), (name), (d))
#include "ops/pad_geom.h"
#undef om_error
#undef om_attr_string

// pads (2 * n_axes values) = input pads_i, axes = input 3 (optional; Pad and PadGrad both keep it
// there), both known at plan time; x dims (r, xd). Checks as misc.c.
static om_status *pad_geometry(const om_kernel_ctx *ctx, const om_cuda_exec *x, int r, const int64_t *xd, int pads_i,
                               pad_geom *g) {
    int64_t pads[2 * OM_MAX_RANK], axes[OM_MAX_RANK];
    const int np = host_ints(ctx, x, pads_i, pads, 2 * OM_MAX_RANK);
    if (np < 0)
        return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': input %d must be int64 values known at plan time (at most %d)",
                       omc_op_name(ctx), omc_node_name(ctx), pads_i, 2 * OM_MAX_RANK);
    int na = r;
    if (present(ctx, 3)) {
        na = host_ints(ctx, x, 3, axes, OM_MAX_RANK);
        if (na < 0)
            return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': input 3 must be int64 values known at plan time "
                           "(at most %d)", omc_op_name(ctx), omc_node_name(ctx), OM_MAX_RANK);
        for (int i = 0; i < na; i++) {
            const int a = norm_axis(axes[i], r);
            if (a < 0)
                return OMC_ERR(OM_INVALID_ARGUMENT, "%s node '%s': axis %lld is out of range for rank %d",
                               omc_op_name(ctx), omc_node_name(ctx), (long long)axes[i], r);
            axes[i] = a;
        }
    } else {
        for (int i = 0; i < r; i++) axes[i] = i;
    }
    return om_pad_geometry(ctx->node, r, xd, pads, np, axes, na, g);
}

// The input offset feeding output element i, or -1 when it lies in constant padding.
__device__ __forceinline__ int64_t pad_source(const pad_geom &g, int64_t i) {
    int64_t off = 0, xs = 1;
    int inside = 1;
    for (int d = g.rank - 1; d >= 0; d--) {
        const int64_t q = i / g.out[d], o = i - q * g.out[d];
        i = q;
        const int64_t s = om_pad_src(g.mode, o, g.pb[d], g.in[d]);
        if (s < 0) inside = 0;
        off += s * xs;
        xs *= g.in[d];
    }
    return inside ? off : -1;
}

// x is (*S), y is (*S + pads); value: the constant (x's dtype) or NULL for 0
template <typename U>
__global__ void pad_kernel(U *y, const U *x, const U *value, pad_geom g, int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t s = pad_source(g, i);
        y[i] = s >= 0 ? x[s] : value ? *value : (U)0;
    }
}

// Pad(x, pads, value?, axes?; mode)
static om_status *pad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *Y = &ctx->out[0];
    pad_geom g;
    OMC_TRY(pad_geometry(ctx, x, X->rank, X->dims, 1, &g));
    if (present(ctx, 2) && ctx->in[2].dtype != X->dtype) return omc_err_dtype(ctx, 2, ctx->in[2].dtype);
    const int64_t n = numel(Y);
    if (!n) return NULL;
    const void *value = present(ctx, 2) && numel(&ctx->in[2]) > 0 ? ctx->in[2].data : NULL;
    OMC_DISPATCH_SIZE(dtype_size(X->dtype), ctx, {
        pad_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)Y->data, (const U *)X->data,
                                                                     (const U *)value, g, n);
    });
    return omc_launched(ctx);
}

// constant mode: dx (*S) [i] = dy[i + pads] (0 where the pads cropped x)
template <typename U>
__global__ void pad_grad_constant_kernel(U *dx, const U *dy, pad_geom g, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t t = i, off = 0, ys = 1;
        int inside = 1;
        for (int d = g.rank - 1; d >= 0; d--) {
            const int64_t q = t / g.in[d], k = t - q * g.in[d], o = k + g.pb[d];
            t = q;
            if (o < 0 || o >= g.out[d]) inside = 0;
            off += o * ys;
            ys *= g.out[d];
        }
        dx[i] = inside ? dy[off] : (U)0;
    }
}

// reflect / edge / wrap: every dy element adds into the element it was copied from (dx from zero,
// in dy's math type: omc_scatter)
template <typename T>
__global__ void pad_grad_scatter_kernel(typename acc<T>::t *dx, const T *dy, pad_geom g, int64_t n) {
    GRID_STRIDE(i, n) {
        const int64_t s = pad_source(g, i);
        if (s >= 0) atomic_acc(&dx[s], ld(dy[i]));
    }
}

// PadGrad(dy, Shape(x), pads, axes?; mode) -> dx
static om_status *pad_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dY = &ctx->in[0], *dX = &ctx->out[0];
    pad_geom g;
    OMC_TRY(pad_geometry(ctx, x, dX->rank, dX->dims, 2, &g));
    const int64_t nx = numel(dX), ny = numel(dY);
    if (!nx) return NULL;
    if (g.mode == PAD_CONSTANT) {
        OMC_DISPATCH_FLOAT(dX->dtype, ctx, 0, {
            pad_grad_constant_kernel<T><<<grid_for(nx), OMC_THREADS, 0, stream_of(x)>>>((T *)dX->data,
                                                                                        (const T *)dY->data, g, nx);
        });
        return omc_launched(ctx);
    }
    if (!om_dtype_is_float(dX->dtype)) return omc_err_dtype(ctx, 0, dX->dtype);
    omc_scatter sc;
    OMC_TRY(omc_scatter_start(ctx, x, dX->dtype, dX->data, nx, NULL, &sc));
    if (!ny) return omc_scatter_finish(ctx, x, &sc, NULL);
    OMC_DISPATCH_FLOAT(dX->dtype, ctx, 0, {
        pad_grad_scatter_kernel<T><<<grid_for(ny), OMC_THREADS, 0, stream_of(x)>>>((A *)sc.acc, (const T *)dY->data,
                                                                                   g, ny);
    });
    return omc_scatter_finish(ctx, x, &sc, omc_launched(ctx));
}

// ---- Einsum -------------------------------------------------------------------------------------
// Labels as misc.c: letters a-z A-Z are 0..51, the dims an ellipsis stands for get 52..,
// right-aligned across operands (numpy broadcasting). Two operands:
//   batch labels (in A, B and the output) -> the GEMM batch; I (A and output) -> rows;
//   J (B and output) -> columns; K (everything else) -> summed.

// ein_eq, ein_parse, ein_has and ein_strides come from ops/einsum_geom.h, shared with misc.c (errors
// through the host table, as for pad_geom.h above)
#define om_error(...) g_host.error(__VA_ARGS__)
#define om_err_unsupported(n, what)                                                                 \
    g_host.error(OM_UNSUPPORTED_OP, "node '%s' (%s): unsupported on CUDA: %s", ein_node_name(n),     \
                 (n)->op ? (n)->op->name : "?", (what))
#include "ops/einsum_geom.h"
#undef om_error
#undef om_err_unsupported

#define EIN_MAXD (2 * OM_MAX_RANK)   // labels one operand's gather walks: at most every dim of both

// A walk over dims[0..n) that reads src at sum idx[d] * str[d]: the destination is dense.
struct ein_walk {
    int n;
    int64_t dims[EIN_MAXD], str[EIN_MAXD];
};

// true when the walk reads src in order (a dense source needs no gather)
static int ein_walk_dense(int n, const int64_t *dims, const int64_t *str) {
    int64_t a = 1;
    for (int d = n - 1; d >= 0; d--) {
        if (dims[d] != 1 && str[d] != a) return 0;
        a *= dims[d];
    }
    return 1;
}

static ein_walk ein_walk_make(int n, const int64_t *dims, const int64_t *str) {
    ein_walk w;
    memset(&w, 0, sizeof w);
    for (int d = 0; d < n; d++) {   // drop size-1 dims, merge a dim into the previous one when they stay in step
        if (dims[d] == 1) continue;
        if (w.n > 0 && w.str[w.n - 1] == str[d] * dims[d]) {
            w.dims[w.n - 1] *= dims[d];
            w.str[w.n - 1] = str[d];
            continue;
        }
        w.dims[w.n] = dims[d];
        w.str[w.n] = str[d];
        w.n++;
    }
    return w;
}

// dst (n, dense) = src read through the walk
template <typename U>
__global__ void ein_gather_kernel(U *dst, const U *src, ein_walk w, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t t = i, off = 0;
        for (int d = w.n - 1; d >= 0 && t; d--) {
            const int64_t q = t / w.dims[d];
            off += (t - q * w.dims[d]) * w.str[d];
            t = q;
        }
        dst[i] = src[off];
    }
}

static om_status *ein_gather(const om_kernel_ctx *ctx, const om_cuda_exec *x, size_t es, void *dst, const void *src,
                             int n, const int64_t *dims, const int64_t *str) {
    const int64_t total = dims_prod(dims, 0, n);
    if (!total) return NULL;
    const ein_walk w = ein_walk_make(n, dims, str);
    OMC_DISPATCH_SIZE(es, ctx, {
        ein_gather_kernel<U><<<grid_for(total), OMC_THREADS, 0, stream_of(x)>>>((U *)dst, (const U *)src, w, total);
    });
    return omc_launched(ctx);
}

// a is (rows, K): y[r] = sum_k a[r, k] — one warp per row
template <typename T>
__global__ void row_sum_kernel(T *y, const T *a, int64_t rows, int64_t K) {
    typedef typename acc<T>::t A;
    const int lane = threadIdx.x & 31;
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        A s = 0;
        for (int64_t k = lane; k < K; k += 32) s += ld(a[r * K + k]);
        s = warp_sum(s);
        if (lane == 0) y[r] = st<T>(s);
    }
}

// Einsum(A, B?; equation)
static om_status *einsum_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const int nin = ctx->n_in;
    const om_tensor *xs[2] = {&ctx->in[0], nin > 1 ? &ctx->in[1] : NULL};
    if (nin > 1 && xs[1]->dtype != xs[0]->dtype) return omc_err_dtype(ctx, 1, xs[1]->dtype);
    const char *eq = attr_s(ctx, "equation", "");
    ein_eq e;
    OMC_TRY(ein_parse(ctx->node, eq, nin, xs, &e));
    const om_tensor *Y = &ctx->out[0];
    const om_dtype dt = xs[0]->dtype;
    if (dt != OM_F32 && dt != OM_F64 && dt != OM_F16 && dt != OM_BF16) return omc_err_dtype(ctx, 0, dt);
    const size_t es = dtype_size(dt);
    ein_plan P;
    ein_plan_make(&e, xs, &P);
    if (P.na > EIN_MAXD || P.nbb > EIN_MAXD) return omc_err_unsupported(ctx, "Einsum with that many labels");
    const ein_term *B = e.nin > 1 ? &e.in[1] : NULL;
    const int64_t NB = P.NB, NI = P.NI, NJ = P.NJ, NK = P.NK;
    if (!numel(Y)) return NULL;
    const int a_ready = ein_walk_dense(P.na, P.da, P.sa), b_ready = B && ein_walk_dense(P.nbb, P.db, P.sb);
    const int y_direct = ein_walk_dense(e.out.n, P.dout, P.so);   // the product already has the output's layout
    void *ga = NULL, *gb = NULL, *pc = NULL;
    om_status *st = NULL;
    if (!a_ready) st = omc_temp_alloc(x, (size_t)(NB * NI * NK) * es, &ga);
    if (!st && B && !b_ready) st = omc_temp_alloc(x, (size_t)(NB * NK * NJ) * es, &gb);
    if (!st && !y_direct) st = omc_temp_alloc(x, (size_t)(NB * NI * NJ) * es, &pc);
    const void *pa = a_ready ? xs[0]->data : ga, *pb = B ? (b_ready ? xs[1]->data : gb) : NULL;
    void *prod = y_direct ? Y->data : pc;
    if (!st && !a_ready) st = ein_gather(ctx, x, es, ga, xs[0]->data, P.na, P.da, P.sa);
    if (!st && B && !b_ready) st = ein_gather(ctx, x, es, gb, xs[1]->data, P.nbb, P.db, P.sb);
    if (!st && B) {
        st = omc_gemm(ctx, x, dt, 0, 0, NI, NJ, NK, 1.0, pa, NI * NK, pb, NK * NJ, 0.0, prod, NI * NJ, NB);
    } else if (!st) {   // one operand: sum over K
        const int64_t rows = NB * NI;
        OMC_DISPATCH_FLOAT(dt, ctx, 0, {
            row_sum_kernel<T><<<grid_for(rows * 32), OMC_THREADS, 0, stream_of(x)>>>((T *)prod, (const T *)pa, rows, NK);
        });
        st = omc_launched(ctx);
    }
    if (!st && !y_direct) st = ein_gather(ctx, x, es, Y->data, pc, e.out.n, P.dout, P.so);
    if (ga) omc_temp_free(x, ga);
    if (gb) omc_temp_free(x, gb);
    if (pc) omc_temp_free(x, pc);
    return st;
}

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
static om_status *cumsum_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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

static om_status *gather_elements_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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
static om_status *gather_elements_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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
static om_status *scatter_elements_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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

extern const omc_kernel_entry omc_kernels_misc[] = {
    {"Pad", "", pad_cuda},
    {"PadGrad", "ortmod", pad_grad_cuda},
    {"Einsum", "", einsum_cuda},
    {"CumSum", "", cumsum_cuda},
    {"GatherElements", "", gather_elements_cuda},
    {"GatherElementsGrad", "ortmod", gather_elements_grad_cuda},
    {"ScatterElements", "", scatter_elements_cuda},
    OMC_TABLE_END,
};
