// reduce.cu — reductions over a set of axes (ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/
// LogSumExp, and SumToShape and the bias gradients through omc_reduce), their gradients
// ReduceGrad / ReduceMinMaxGrad / ReduceValueGrad, and ArgMax / ArgMin.
//
// A reduction is split, on the host, into kept dims (the output, in order) and reduced dims,
// each with x's strides, size-1 dims dropped and neighbours merged. One thread per output
// walks the reduced set (coalesced when the kept dims are innermost: reducing leading axes),
// or one block per output when the innermost axis is reduced (a row sum).
#include <math.h>

#include "common.cuh"

enum { RED_SUM = 0, RED_MEAN, RED_MAX, RED_MIN, RED_PROD, RED_L1, RED_L2, RED_SUMSQ };

struct walk {          // an odometer over some of x's dims
    int n;
    int64_t dims[OM_MAX_RANK], str[OM_MAX_RANK];
};
struct red_geom {
    walk kept, red;
    int64_t n_out, n_red;
};

__device__ __forceinline__ int64_t walk_off(const walk &w, int64_t i) {
    int64_t off = 0;
    for (int d = w.n - 1; d >= 0 && i; d--) {
        int64_t q = i / w.dims[d];
        off += (i - q * w.dims[d]) * w.str[d];
        i = q;
    }
    return off;
}

static void red_geometry(int rank, const int64_t *dims, const uint8_t *red, red_geom *g) {
    memset(g, 0, sizeof *g);
    int64_t str[OM_MAX_RANK], s = 1;
    for (int d = rank - 1; d >= 0; d--) { str[d] = s; s *= dims[d]; }
    g->n_out = g->n_red = 1;
    int last = -1;   // kind of the previous kept dim appended: 0 kept, 1 reduced
    for (int d = 0; d < rank; d++) {
        if (dims[d] == 1) continue;
        walk *w = red[d] ? &g->red : &g->kept;
        int kind = red[d] ? 1 : 0;
        if (red[d]) g->n_red *= dims[d];
        else g->n_out *= dims[d];
        if (last == kind && w->n > 0 && w->str[w->n - 1] == str[d] * dims[d]) {   // contiguous with the previous: merge
            w->dims[w->n - 1] *= dims[d];
            w->str[w->n - 1] = str[d];
        } else {
            w->dims[w->n] = dims[d];
            w->str[w->n] = str[d];
            w->n++;
        }
        last = kind;
    }
}

template <typename A, int KIND> __device__ __forceinline__ A red_init() {
    return KIND == RED_MAX ? (A)-INFINITY : KIND == RED_MIN ? (A)INFINITY : KIND == RED_PROD ? (A)1 : (A)0;
}
template <> __device__ __forceinline__ int64_t red_init<int64_t, RED_MAX>() { return INT64_MIN; }
template <> __device__ __forceinline__ int64_t red_init<int64_t, RED_MIN>() { return INT64_MAX; }
template <> __device__ __forceinline__ int32_t red_init<int32_t, RED_MAX>() { return INT32_MIN; }
template <> __device__ __forceinline__ int32_t red_init<int32_t, RED_MIN>() { return INT32_MAX; }

template <typename A> __device__ __forceinline__ A quiet_nan() { return (A)NAN; }
template <> __device__ __forceinline__ int64_t quiet_nan<int64_t>() { return 0; }   // (integers have no NaN)
template <> __device__ __forceinline__ int32_t quiet_nan<int32_t>() { return 0; }

template <typename A, int KIND> __device__ __forceinline__ A red_step(A acc, A v) {
    switch (KIND) {
    case RED_MAX: return (v != v || v > acc) ? v : acc;
    case RED_MIN: return (v != v || v < acc) ? v : acc;
    case RED_PROD: return acc * v;
    case RED_L1: return acc + (v < 0 ? -v : v);   // keeps NaN
    case RED_L2: case RED_SUMSQ: return acc + v * v;
    default: return acc + v;
    }
}

// x is any shape; y (n_out) = reduce over the reduced set; one thread per output
template <typename T, typename R, int KIND>
__global__ void reduce_thread_kernel(T *y, const T *x, red_geom g, double scale) {
    GRID_STRIDE(o, g.n_out) {
        int64_t base = walk_off(g.kept, o);
        R acc = red_init<R, KIND>();
        for (int64_t r = 0; r < g.n_red; r++) acc = red_step<R, KIND>(acc, (R)ld(x[base + walk_off(g.red, r)]));
        if (KIND == RED_MEAN) acc = (R)(acc * (R)scale);
        if (KIND == RED_L2) acc = (R)sqrt(acc);
        y[o] = st<T>(acc);
    }
}

// the same with one block per output (innermost axis reduced): threads stride the reduced set
template <typename T, typename R, int KIND>
__global__ void reduce_block_kernel(T *y, const T *x, red_geom g, double scale) {
    for (int64_t o = blockIdx.x; o < g.n_out; o += gridDim.x) {
        int64_t base = walk_off(g.kept, o);
        R acc = red_init<R, KIND>();
        for (int64_t r = threadIdx.x; r < g.n_red; r += blockDim.x)
            acc = red_step<R, KIND>(acc, (R)ld(x[base + walk_off(g.red, r)]));
        if (KIND == RED_MAX || KIND == RED_MIN) {
            // block_max compares, and a comparison with NaN is false: a NaN would be lost between
            // threads (the CPU and torch propagate it), so NaNs are counted on their own
            const int nan = acc != acc;
            R v = nan ? red_init<R, RED_MAX>() : KIND == RED_MAX ? acc : -acc;
            v = block_max(v);
            acc = KIND == RED_MAX ? v : -v;
            if (block_sum((R)nan) > 0) acc = quiet_nan<R>();
        }
        else if (KIND == RED_PROD) {   // rare: finish serially through shared memory
            __shared__ R sh[1024];
            sh[threadIdx.x] = acc;
            __syncthreads();
            if (threadIdx.x == 0)
                for (unsigned k = 1; k < blockDim.x; k++) acc *= sh[k];
            __syncthreads();
        } else acc = block_sum(acc);
        if (threadIdx.x == 0) {
            if (KIND == RED_MEAN) acc = (R)(acc * (R)scale);
            if (KIND == RED_L2) acc = (R)sqrt(acc);
            y[o] = st<T>(acc);
        }
    }
}

// A sum over leading axes with few outputs (bias gradients: (rows, N) -> N) gives one thread
// per output too little parallelism: the reduced set is split into chunks, a block (32, 8)
// sums 32 neighbouring outputs over one chunk into part (chunks, n_out), then a second pass
// adds the chunks. R is the accumulator (fp32 for fp16/bf16/fp32).
template <typename T, typename R>
__global__ void reduce_split_kernel(R *part, const T *x, red_geom g, int64_t rows_per) {
    __shared__ R sh[8][33];
    int64_t o = (int64_t)blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * rows_per, r1 = r0 + rows_per < g.n_red ? r0 + rows_per : g.n_red;
    R acc = 0;
    if (o < g.n_out) {
        int64_t base = walk_off(g.kept, o);
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += (R)ld(x[base + walk_off(g.red, r)]);
    }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < g.n_out) {
        for (int k = 1; k < 8; k++) acc += sh[k][threadIdx.x];
        part[(int64_t)blockIdx.y * g.n_out + o] = acc;
    }
}

template <typename T, typename R>
__global__ void reduce_split_final(T *y, const R *part, int64_t chunks, int64_t n_out, double scale, int mean) {
    GRID_STRIDE(o, n_out) {
        R acc = 0;
        for (int64_t c = 0; c < chunks; c++) acc += part[c * n_out + o];
        if (mean) acc = (R)(acc * (R)scale);
        y[o] = st<T>(acc);
    }
}

// Chunks for the split sum (0: not worth it): enough blocks to fill the GPU, chunks of >= 64.
static int64_t split_chunks(const red_geom &g, int kind) {
    if ((kind != RED_SUM && kind != RED_MEAN) || g.n_red < 256 || g.n_out >= 65536) return 0;
    if (g.red.n > 0 && g.red.str[g.red.n - 1] == 1) return 0;   // contiguous rows: the block-per-row kernel
    int64_t blocks_x = (g.n_out + 31) / 32, want = (512 + blocks_x - 1) / blocks_x, most = g.n_red / 64;
    int64_t chunks = want < most ? want : most;
    return chunks > 1 ? (chunks < 1024 ? chunks : 1024) : 0;
}

template <typename T, typename R>
static om_status *reduce_split(const om_kernel_ctx *ctx, const om_cuda_exec *x, const red_geom &g, int64_t chunks,
                               T *y, const T *src, double scale, int mean) {
    R *part = NULL;
    OMC_TRY(omc_temp_alloc(x, sizeof(R) * (size_t)(chunks * g.n_out), (void **)&part));
    int64_t rows_per = (g.n_red + chunks - 1) / chunks;
    reduce_split_kernel<T, R><<<dim3((unsigned)((g.n_out + 31) / 32), (unsigned)chunks), dim3(32, 8), 0, stream_of(x)>>>(
        part, src, g, rows_per);
    reduce_split_final<T, R><<<grid_for(g.n_out), OMC_THREADS, 0, stream_of(x)>>>(y, part, chunks, g.n_out, scale, mean);
    om_status *st = omc_launched(ctx);
    omc_temp_free(x, part);
    return st;
}

template <typename T, typename R, int KIND>
static void reduce_launch(const red_geom &g, T *y, const T *x, double scale, cudaStream_t s) {
    int row = g.red.n > 0 && g.red.str[g.red.n - 1] == 1 && g.n_red >= 64;
    if (row) {
        int64_t blocks = g.n_out < 65535 * 8 ? g.n_out : 65535 * 8;
        reduce_block_kernel<T, R, KIND><<<(unsigned)blocks, 256, 0, s>>>(y, x, g, scale);
    } else {
        reduce_thread_kernel<T, R, KIND><<<grid_for(g.n_out), OMC_THREADS, 0, s>>>(y, x, g, scale);
    }
}

// Reduces in (data src, in's dims) over the axes flagged in reduce_axis into dst (n_out values).
// kind: RED_*; scale multiplies a mean (1/n; ints divide).
om_status *omc_reduce(const om_kernel_ctx *ctx, const om_cuda_exec *x, int kind, const om_tensor *in, const void *src,
                      const uint8_t *reduce_axis, void *dst, double scale) {
    red_geom g;
    red_geometry(in->rank, in->dims, reduce_axis, &g);
    if (g.n_out == 0) return NULL;
    if (numel(in) == 0) g.n_red = 0;   // an empty set reduces to the identity
    cudaStream_t s = stream_of(x);
    int64_t chunks = split_chunks(g, kind);
    if (chunks) {
        const int mean = kind == RED_MEAN;
#define RED_SPLIT(T, R) return reduce_split<T, R>(ctx, x, g, chunks, (T *)dst, (const T *)src, scale, mean)
        switch (in->dtype) {
        case OM_F32: RED_SPLIT(float, float);
        case OM_F16: RED_SPLIT(__half, float);
        case OM_BF16: RED_SPLIT(__nv_bfloat16, float);
        case OM_F64: RED_SPLIT(double, double);
        default: break;   // integers: one thread per output
        }
#undef RED_SPLIT
    }
#define RED_KINDS(T, R)                                                                   \
    switch (kind) {                                                                       \
    case RED_SUM: reduce_launch<T, R, RED_SUM>(g, (T *)dst, (const T *)src, scale, s); break;   \
    case RED_MEAN: reduce_launch<T, R, RED_MEAN>(g, (T *)dst, (const T *)src, scale, s); break; \
    case RED_MAX: reduce_launch<T, R, RED_MAX>(g, (T *)dst, (const T *)src, scale, s); break;   \
    case RED_MIN: reduce_launch<T, R, RED_MIN>(g, (T *)dst, (const T *)src, scale, s); break;   \
    case RED_L1: reduce_launch<T, R, RED_L1>(g, (T *)dst, (const T *)src, scale, s); break;     \
    case RED_L2: reduce_launch<T, R, RED_L2>(g, (T *)dst, (const T *)src, scale, s); break;     \
    case RED_SUMSQ: reduce_launch<T, R, RED_SUMSQ>(g, (T *)dst, (const T *)src, scale, s); break; \
    default: reduce_launch<T, R, RED_PROD>(g, (T *)dst, (const T *)src, scale, s); break;       \
    }
    switch (in->dtype) {
    case OM_F32: RED_KINDS(float, float); break;
    case OM_F16: RED_KINDS(__half, float); break;
    case OM_BF16: RED_KINDS(__nv_bfloat16, float); break;
    case OM_F64: RED_KINDS(double, double); break;
    case OM_I64: RED_KINDS(int64_t, int64_t); break;
    case OM_I32: RED_KINDS(int32_t, int64_t); break;
    default: return omc_err_dtype(ctx, 0, in->dtype);
    }
#undef RED_KINDS
    return omc_launched(ctx);
}

// axes from input axes_input (known at plan time) or the "axes" attribute, as reduce.c
static om_status *reduce_mask(const om_kernel_ctx *ctx, const om_cuda_exec *x, int axes_input, int rank, uint8_t *red) {
    int64_t axes[OM_MAX_RANK];
    int count = 0;
    if (present(ctx, axes_input)) {
        if (numel(&ctx->in[axes_input]) > 0) {
            count = host_ints(ctx, x, axes_input, axes, OM_MAX_RANK);
            if (count < 0) return omc_err_unsupported(ctx, "axes that are not known at plan time");
        }
    } else {
        const int64_t *v;
        int k = attr_is(ctx, "axes", &v);
        if (k > OM_MAX_RANK) return omc_err_unsupported(ctx, "more axes than dims");
        for (int i = 0; i < k; i++) axes[i] = v[i];
        count = k > 0 ? k : 0;
    }
    for (int i = 0; i < rank; i++) red[i] = 0;
    if (count == 0) {
        if (!attr_i(ctx, "noop_with_empty_axes", 0))
            for (int i = 0; i < rank; i++) red[i] = 1;
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        int a = norm_axis(axes[i], rank);
        if (a < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': axis %lld out of range", omc_node_name(ctx), (long long)axes[i]);
        if (rank) red[a] = 1;
    }
    return NULL;
}

static om_status *reduce_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, int kind) {
    const om_tensor *in = &ctx->in[0];
    uint8_t red[OM_MAX_RANK];
    OMC_TRY(reduce_mask(ctx, x, 1, in->rank, red));
    int64_t n_red = 1;
    for (int d = 0; d < in->rank; d++)
        if (red[d]) n_red *= in->dims[d];
    return omc_reduce(ctx, x, kind, in, in->data, red, ctx->out[0].data, n_red ? 1.0 / (double)n_red : 1.0);
}
om_status *reduce_sum_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return reduce_run(ctx, x, RED_SUM); }
om_status *reduce_mean_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return reduce_run(ctx, x, RED_MEAN); }
om_status *reduce_max_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return reduce_run(ctx, x, RED_MAX); }
om_status *reduce_min_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return reduce_run(ctx, x, RED_MIN); }
om_status *reduce_prod_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return reduce_run(ctx, x, RED_PROD); }
// L1, L2, SumSquare: float dtypes, summed in fp32 (fp64 for fp64) as reduce.c and torch's norms
static om_status *reduce_float_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, int kind) {
    om_dtype dt = ctx->in[0].dtype;
    if (dt != OM_F32 && dt != OM_F64 && dt != OM_F16 && dt != OM_BF16) return omc_err_dtype(ctx, 0, dt);
    return reduce_run(ctx, x, kind);
}
om_status *reduce_l1_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return reduce_float_run(ctx, x, RED_L1); }
om_status *reduce_l2_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return reduce_float_run(ctx, x, RED_L2); }
om_status *reduce_sum_square_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    return reduce_float_run(ctx, x, RED_SUMSQ);
}

// ReduceLogSumExp as reduce.c (torch.logsumexp): m = max (NaN wins), an infinite m taken as 0,
// then log(sum exp(x - m)) + m. One thread per output, or one block per output when the
// innermost axis is reduced; two passes over the reduced set either way.
template <typename A> __device__ __forceinline__ A lse_shift(A m) { return isinf(m) ? (A)0 : m; }

template <typename T>
__global__ void lse_thread_kernel(T *y, const T *x, red_geom g) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(o, g.n_out) {
        int64_t base = walk_off(g.kept, o);
        A m = -INFINITY;
        for (int64_t r = 0; r < g.n_red; r++) m = red_step<A, RED_MAX>(m, ld(x[base + walk_off(g.red, r)]));
        m = lse_shift(m);
        A s = 0;
        for (int64_t r = 0; r < g.n_red; r++) s += exp(ld(x[base + walk_off(g.red, r)]) - m);
        y[o] = st<T>((A)(log(s) + m));
    }
}

template <typename T>
__global__ void lse_block_kernel(T *y, const T *x, red_geom g) {
    typedef typename acc<T>::t A;
    for (int64_t o = blockIdx.x; o < g.n_out; o += gridDim.x) {
        int64_t base = walk_off(g.kept, o);
        A m = -INFINITY;
        for (int64_t r = threadIdx.x; r < g.n_red; r += blockDim.x)
            m = red_step<A, RED_MAX>(m, ld(x[base + walk_off(g.red, r)]));
        // block_max drops NaN through its comparisons: count NaNs separately
        const int nan = m != m;
        m = block_max(nan ? (A)-INFINITY : m);
        m = block_sum((A)nan) > 0 ? quiet_nan<A>() : lse_shift(m);
        A s = 0;
        for (int64_t r = threadIdx.x; r < g.n_red; r += blockDim.x) s += exp(ld(x[base + walk_off(g.red, r)]) - m);
        s = block_sum(s);
        if (threadIdx.x == 0) y[o] = st<T>((A)(log(s) + m));
        __syncthreads();
    }
}

om_status *reduce_log_sum_exp_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    uint8_t red[OM_MAX_RANK];
    OMC_TRY(reduce_mask(ctx, x, 1, in->rank, red));
    red_geom g;
    red_geometry(in->rank, in->dims, red, &g);
    if (g.n_out == 0) return NULL;
    if (numel(in) == 0) g.n_red = 0;   // log(0) + 0 = -inf, as torch
    const int row = g.red.n > 0 && g.red.str[g.red.n - 1] == 1 && g.n_red >= 64;
    const unsigned blocks = (unsigned)(g.n_out < 65535 * 8 ? g.n_out : 65535 * 8);
    switch (in->dtype) {
#define LSE_LAUNCH(T)                                                                                     \
    if (row) lse_block_kernel<T><<<blocks, 256, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)in->data, g); \
    else lse_thread_kernel<T><<<grid_for(g.n_out), OMC_THREADS, 0, stream_of(x)>>>((T *)ctx->out[0].data, (const T *)in->data, g); \
    break;
    case OM_F32: LSE_LAUNCH(float)
    case OM_F64: LSE_LAUNCH(double)
    case OM_F16: LSE_LAUNCH(__half)
    case OM_BF16: LSE_LAUNCH(__nv_bfloat16)
#undef LSE_LAUNCH
    default: return omc_err_dtype(ctx, 0, in->dtype);
    }
    return omc_launched(ctx);
}

// ---- ReduceGrad(dy, Shape(x), axes?): dx = broadcast(dy) (* 1/n for a mean) ---------------------

// dx is (n); dy is dx's shape with the reduced dims removed: dy index = the kept digits of i.
// scale (1/n of a mean) comes as a double: fp64 gradients need it unrounded.
template <typename T>
__global__ void reduce_grad_kernel(T *dx, const T *dy, walk w, int64_t n, double scale) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) dx[i] = st<T>(ld(dy[walk_off(w, i)]) * (A)scale);
}

// a walk over dx's dims giving the dy offset: stride 0 on reduced dims
static void grad_walk(int rank, const int64_t *dims, const uint8_t *red, walk *w) {
    memset(w, 0, sizeof *w);
    int64_t s = 1;
    int64_t str[OM_MAX_RANK];
    for (int d = rank - 1; d >= 0; d--) {
        str[d] = red[d] ? 0 : s;
        if (!red[d]) s *= dims[d];
    }
    for (int d = 0; d < rank; d++) {
        w->dims[w->n] = dims[d];
        w->str[w->n] = str[d];
        w->n++;
    }
}

om_status *reduce_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dx = &ctx->out[0];
    uint8_t red[OM_MAX_RANK];
    OMC_TRY(reduce_mask(ctx, x, 2, dx->rank, red));
    int64_t n = numel(dx), n_red = 1;
    for (int d = 0; d < dx->rank; d++)
        if (red[d]) n_red *= dx->dims[d];
    if (!n) return NULL;
    double scale = attr_i(ctx, "mean", 0) ? 1.0 / (double)n_red : 1.0;
    walk w;
    grad_walk(dx->rank, dx->dims, red, &w);
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        reduce_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)dx->data, (const T *)ctx->in[0].data, w, n, scale);
    });
    return omc_launched(ctx);
}

// ReduceMinMaxGrad(dy, Shape(x), x, y, axes?): dy routed to the elements equal to the extremum,
// ties share it equally. One thread per output: counts its ties, then writes its slice of dx.
template <typename T>
__global__ void minmax_grad_kernel(T *dx, const T *dy, const T *x_, const T *y_, red_geom g) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(o, g.n_out) {
        int64_t base = walk_off(g.kept, o);
        A yv = ld(y_[o]);
        int64_t count = 0;
        for (int64_t r = 0; r < g.n_red; r++) {
            A v = ld(x_[base + walk_off(g.red, r)]);
            count += v == yv || (v != v && yv != yv);
        }
        A share = count ? ld(dy[o]) / (A)count : (A)0;
        for (int64_t r = 0; r < g.n_red; r++) {
            int64_t off = base + walk_off(g.red, r);
            A v = ld(x_[off]);
            dx[off] = (v == yv || (v != v && yv != yv)) ? st<T>(share) : st<T>((A)0);
        }
    }
}

om_status *reduce_min_max_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dx = &ctx->out[0];
    uint8_t red[OM_MAX_RANK];
    OMC_TRY(reduce_mask(ctx, x, 4, dx->rank, red));
    if (!numel(dx)) return NULL;
    red_geom g;
    red_geometry(dx->rank, dx->dims, red, &g);
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        minmax_grad_kernel<T><<<grid_for(g.n_out), OMC_THREADS, 0, stream_of(x)>>>(
            (T *)dx->data, (const T *)ctx->in[0].data, (const T *)ctx->in[2].data, (const T *)ctx->in[3].data, g);
    });
    return omc_launched(ctx);
}

// ReduceValueGrad(dy, Shape(x), x, y, axes?; reduction): the gradients of L1, L2, SumSquare and
// LogSumExp, with reduce.c's formulas (torch's). One thread per dx element; dy and y are read
// through the walk that gives the output offset of an element of x.
enum { VG_L1, VG_L2, VG_SUMSQ, VG_LSE };

template <typename T>
__global__ void value_grad_kernel(T *dx, const T *dy, const T *x_, const T *y_, walk w, int64_t n, int kind) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, n) {
        const int64_t o = walk_off(w, i);
        const A xv = ld(x_[i]), yv = ld(y_[o]), g = ld(dy[o]);
        A d;
        switch (kind) {
        case VG_L1: d = (xv > 0 ? (A)1 : xv < 0 ? (A)-1 : (A)0) * g; break;
        case VG_L2: d = g * (yv == 0 ? (A)0 : xv / yv); break;
        case VG_SUMSQ: d = g * (xv + xv); break;
        default: d = g * exp(xv - yv); break;
        }
        dx[i] = st<T>(d);
    }
}

om_status *reduce_value_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dx = &ctx->out[0];
    uint8_t red[OM_MAX_RANK];
    OMC_TRY(reduce_mask(ctx, x, 4, dx->rank, red));
    const char *r = attr_s(ctx, "reduction", "");
    int kind = !strcmp(r, "ReduceL1") ? VG_L1 : !strcmp(r, "ReduceL2") ? VG_L2 : !strcmp(r, "ReduceSumSquare") ? VG_SUMSQ
               : !strcmp(r, "ReduceLogSumExp") ? VG_LSE : -1;
    if (kind < 0) return omc_err_unsupported(ctx, "this reduction");
    int64_t n = numel(dx);
    if (!n) return NULL;
    walk w;
    grad_walk(dx->rank, dx->dims, red, &w);
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, {
        value_grad_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
            (T *)dx->data, (const T *)ctx->in[0].data, (const T *)ctx->in[2].data, (const T *)ctx->in[3].data, w, n, kind);
    });
    return omc_launched(ctx);
}

// ArgMax / ArgMin (reduce.c's rule: first extremum, last with select_last_index, NaN wins).
// x is (outer, n, inner) around the axis, y (outer, inner) int64: one thread per output.
template <typename A>
__device__ __forceinline__ bool arg_better(A v, A b, int is_max, int last) {
    if (b != b) return last && v != v;
    if (v != v) return true;
    return is_max ? (last ? v >= b : v > b) : (last ? v <= b : v < b);
}
template <typename T>
__global__ void arg_kernel(int64_t *y, const T *x, int64_t outer, int64_t n, int64_t inner, int is_max, int last) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(o, outer * inner) {
        const T *p = x + (o / inner) * n * inner + o % inner;
        A b = ld(p[0]);
        int64_t best = 0;
        for (int64_t k = 1; k < n; k++) {
            A v = ld(p[k * inner]);
            if (arg_better(v, b, is_max, last)) { b = v; best = k; }
        }
        y[o] = best;
    }
}

static om_status *arg_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, int is_max) {
    const om_tensor *X = &ctx->in[0];
    const int axis = X->rank ? norm_axis(attr_i(ctx, "axis", 0), X->rank) : 0;
    int64_t outer = 1, n = 1, inner = 1;
    for (int i = 0; i < X->rank; i++) {
        if (i < axis) outer *= X->dims[i];
        else if (i == axis) n = X->dims[i];
        else inner *= X->dims[i];
    }
    if (!outer || !inner) return NULL;
    const int last = attr_i(ctx, "select_last_index", 0) != 0;
    OMC_DISPATCH_ARITH(X->dtype, ctx, 0, {
        arg_kernel<T><<<grid_for(outer * inner), OMC_THREADS, 0, stream_of(x)>>>(
            (int64_t *)ctx->out[0].data, (const T *)X->data, outer, n, inner, is_max, last);
    });
    return omc_launched(ctx);
}
om_status *arg_max_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return arg_run(ctx, x, 1); }
om_status *arg_min_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return arg_run(ctx, x, 0); }
