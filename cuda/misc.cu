// misc.cu — misc.c's ops on the CUDA provider: the comparisons and logic (Less .. Xor, Not, IsNaN,
// IsInf) and the activations (LeakyRelu .. Celu, ActivationGrad), which run through
// elementwise.cu's pointwise kernels (pointwise.cuh); Clip / ClipGrad / HardTanh; Pad / PadGrad;
// Einsum; Tile / TileGrad and Trilu.
//
// Pad is one thread per output element (the source index per dim: pad_geom.h's om_pad_src); its
// backward gathers in constant mode (each input element has one source) and scatter-adds with
// atomics in reflect/edge/wrap mode. Einsum runs the CPU's plan: operands gathered into
// (batch, I, K) and (batch, K, J), one strided-batched cuBLAS GEMM, the product gathered into the
// output's label order — a gather is skipped when the operand already has that layout.
//
// Shape-like inputs (Pad's pads and axes) are read from the host copies the planner keeps.
#include "common.cuh"
#include "pointwise.cuh"

// ---- comparisons and logic (elementwise.cu's omc_compare) ------------------------------------------

#define COMPARE(name, op) \
    om_status *name(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return omc_compare(ctx, x, op); }
COMPARE(less_cuda, C_LT)
COMPARE(greater_cuda, C_GT)
COMPARE(less_equal_cuda, C_LE)
COMPARE(greater_equal_cuda, C_GE)
COMPARE(and_cuda, L_AND)
COMPARE(or_cuda, L_OR)
COMPARE(xor_cuda, L_XOR)

// x, y are (n) bool
__global__ void not_kernel(uint8_t *y, const uint8_t *x, int64_t n) { GRID_STRIDE(i, n) y[i] = !x[i]; }
om_status *not_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    not_kernel<<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((uint8_t *)ctx->out[0].data, (const uint8_t *)ctx->in[0].data, n);
    return omc_launched(ctx);
}

// x is (n) float, y is (n) bool: mode 0 IsNaN, 1 IsInf (pos/neg selected)
template <typename T>
__global__ void classify_kernel(uint8_t *y, const T *x, int64_t n, int mode, int pos, int neg) {
    GRID_STRIDE(i, n) {
        double v = to_f64(x[i]);
        y[i] = mode == 0 ? v != v : ((pos && v == INFINITY) || (neg && v == -INFINITY));
    }
}
static om_status *classify_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, int mode) {
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    int pos = attr_i(ctx, "detect_positive", 1) != 0, neg = attr_i(ctx, "detect_negative", 1) != 0;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        classify_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((uint8_t *)ctx->out[0].data,
                                                                          (const T *)ctx->in[0].data, n, mode, pos, neg);
    });
    return omc_launched(ctx);
}
om_status *is_nan_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return classify_run(ctx, x, 0); }
om_status *is_inf_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return classify_run(ctx, x, 1); }

// ---- activations (elementwise.cu's omc_unary and omc_grad2) -------------------------------------------

static int act_kind(const char *name) {
    static const char *const names[] = {"LeakyRelu", "Softplus", "Elu", "Selu", "HardSigmoid", "HardSwish", "Mish", "Softsign",
                                        "Celu"};
    for (int i = 0; i < 9; i++)
        if (!strcmp(names[i], name)) return U_LEAKY + i;
    return -1;
}
static act_params act_read(const om_kernel_ctx *ctx, int kind) {
    static const float dflt_alpha[] = {0.01f, 0, 1.0f, 1.67326319217681884765625f, 0.2f, 0, 0, 0, 1.0f};
    act_params p;
    p.a = attr_f(ctx, "alpha", dflt_alpha[kind - U_LEAKY]);
    p.b = attr_f(ctx, "beta", 0.5f);
    p.g = attr_f(ctx, "gamma", 1.05070102214813232421875f);
    return p;
}

om_status *activation_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int k = act_kind(omc_op_name(ctx));
    if (k < 0) return omc_err_unsupported(ctx, "activation");
    return omc_unary(ctx, x, k, act_read(ctx, k));
}

om_status *activation_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int k = act_kind(attr_s(ctx, "activation", ""));
    if (k < 0) return omc_err_unsupported(ctx, "activation");
    return omc_grad2(ctx, x, G_ACT, k, act_read(ctx, k));
}

// ---- Clip / ClipGrad: bounds are device scalars (absent: unbounded) ------------------------------

// x, y are (n); lo, hi point to one element each or are NULL
template <typename T>
__global__ void clip_kernel(T *y, const T *x, const T *lo, const T *hi, int64_t n) {
    typedef typename acc<T>::t A;
    A l = lo ? ld(*lo) : (A)0, h = hi ? ld(*hi) : (A)0;
    GRID_STRIDE(i, n) {
        A v = ld(x[i]);
        if (lo) v = v < l ? l : v;
        if (hi) v = v > h ? h : v;
        y[i] = st<T>(v);
    }
}
om_status *clip_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    OMC_DISPATCH_ARITH(ctx->in[0].dtype, ctx, 0, {
        clip_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            (T *)ctx->out[0].data, (const T *)ctx->in[0].data, present(ctx, 1) ? (const T *)ctx->in[1].data : NULL,
            present(ctx, 2) ? (const T *)ctx->in[2].data : NULL, n);
    });
    return omc_launched(ctx);
}

// dy, x, dx are (n): dx = dy where lo <= x <= hi; exclusive (HardTanh's): 0 where x <= lo or
// x >= hi, else dy (NaN passes)
template <typename T>
__global__ void clip_grad_kernel(T *dx, const T *dy, const T *x_, const T *lo, const T *hi, int64_t n, int exclusive) {
    typedef typename acc<T>::t A;
    A l = lo ? ld(*lo) : (A)-INFINITY, h = hi ? ld(*hi) : (A)INFINITY;
    GRID_STRIDE(i, n) {
        A v = ld(x_[i]);
        bool pass = exclusive ? !(v <= l || v >= h) : (v >= l && v <= h);
        dx[i] = pass ? dy[i] : st<T>((A)0);
    }
}
om_status *clip_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int64_t n = numel(&ctx->in[0]);
    if (!n) return NULL;
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        clip_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            (T *)ctx->out[0].data, (const T *)ctx->in[0].data, (const T *)ctx->in[1].data,
            present(ctx, 2) ? (const T *)ctx->in[2].data : NULL, present(ctx, 3) ? (const T *)ctx->in[3].data : NULL, n,
            attr_i(ctx, "exclusive", 0) != 0);
    });
    return omc_launched(ctx);
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
om_status *pad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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
om_status *pad_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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
om_status *einsum_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
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

// ---- Tile / TileGrad -------------------------------------------------------------------------------------------

struct tile_geom { int n; int64_t ydims[OM_MAX_RANK], xdims[OM_MAX_RANK], xstr[OM_MAX_RANK]; };

// y (n) = x[idx mod xdims]: y's dims are x's times the repeats
template <typename U>
__global__ void tile_kernel(U *y, const U *x_, tile_geom g, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t t = i, off = 0;
        for (int d = g.n - 1; d >= 0; d--) {
            int64_t q = t / g.ydims[d], r = t - q * g.ydims[d];
            off += (r % g.xdims[d]) * g.xstr[d];
            t = q;
        }
        y[i] = x_[off];
    }
}

om_status *tile_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0], *out = &ctx->out[0];
    tile_geom g;
    memset(&g, 0, sizeof g);
    g.n = in->rank;
    dense_strides(in->rank, in->dims, g.xstr);
    for (int d = 0; d < in->rank; d++) { g.ydims[d] = out->dims[d]; g.xdims[d] = in->dims[d] ? in->dims[d] : 1; }
    int64_t n = numel(out);
    if (!n) return NULL;
    OMC_DISPATCH_SIZE(dtype_size(in->dtype), ctx, {
        tile_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)out->data, (const U *)in->data, g, n);
    });
    return omc_launched(ctx);
}

// TileGrad(dy, Shape(x)): dx = sum over the tiles. dy viewed as (r0, x0, r1, x1, ...), reduced over the r's
om_status *tile_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dy = &ctx->in[0], *dx = &ctx->out[0];
    int r = dx->rank;
    if (2 * r > OM_MAX_RANK) {
        // more than 4 dims: reduce one axis pair at a time is not implemented
        return omc_err_unsupported(ctx, "TileGrad of rank > 4");
    }
    om_tensor v;
    memset(&v, 0, sizeof v);
    v.dtype = dy->dtype;
    v.rank = 2 * r;
    uint8_t red[OM_MAX_RANK];
    for (int d = 0; d < r; d++) {
        int64_t xd = dx->dims[d];
        v.dims[2 * d] = xd ? dy->dims[d] / xd : 0;
        v.dims[2 * d + 1] = xd;
        red[2 * d] = 1;
        red[2 * d + 1] = 0;
    }
    return omc_reduce(ctx, x, 0, &v, dy->data, red, dx->data, 1.0);
}

// ---- Trilu: x is (batch, R, C); keeps j - i >= k (upper) or j - i <= k (lower) ---------------------

template <typename U>
__global__ void trilu_kernel(U *y, const U *x_, int64_t n, int64_t R, int64_t C, int64_t k, int upper) {
    GRID_STRIDE(t, n) {
        int64_t j = t % C, i = (t / C) % R;
        int keep = upper ? j - i >= k : j - i <= k;
        y[t] = keep ? x_[t] : (U)0;
    }
}

om_status *trilu_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    if (in->rank < 2) return omc_err_unsupported(ctx, "rank < 2");
    int64_t k = 0;
    if (present(ctx, 1)) {
        int64_t v[1] = {0};
        if (host_ints(ctx, x, 1, v, 1) != 1) return omc_err_unsupported(ctx, "k that is not known at plan time");
        k = v[0];
    }
    int upper = attr_i(ctx, "upper", 1) != 0;
    int64_t n = numel(in), R = in->dims[in->rank - 2], C = in->dims[in->rank - 1];
    if (!n) return NULL;
    OMC_DISPATCH_SIZE(dtype_size(in->dtype), ctx, {
        trilu_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)ctx->out[0].data, (const U *)in->data, n, R, C,
                                                                       k, upper);
    });
    return omc_launched(ctx);
}
