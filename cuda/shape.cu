// shape.cu — shape.c's ops on the CUDA provider, the data-moving glue: views that the
// planner did not alias, Transpose, Gather/GatherGrad, Concat/ConcatGrad, Slice/SliceGrad,
// Expand, Split/SplitGrad, Shape/Size. Everything moves whole elements, so kernels are written
// per element size. Shape-like inputs (Slice's starts, a Concat's shapes) are read from the
// host copies the planner keeps (known at plan time). Constant, ConstantOfShape and Range
// always fold at plan time (their output shape depends on their input data), so they need no
// kernel.
#include "common.cuh"
#include "ops/slice_geom.h"

// ---- a strided copy: y dense over dims; x offset = base + sum idx[d] * xs[d] (xs may be 0) ---------

struct strided {
    int n;
    int64_t dims[OM_MAX_RANK], xs[OM_MAX_RANK];
    int64_t base;
};

__device__ __forceinline__ int64_t strided_off(const strided &s, int64_t i) {
    int64_t off = s.base;
    for (int d = s.n - 1; d >= 0 && i; d--) {
        int64_t q = i / s.dims[d];
        off += (i - q * s.dims[d]) * s.xs[d];
        i = q;
    }
    return off;
}

// y (n) = x[strided]; scatter: x[strided] = y
template <typename U>
__global__ void strided_copy_kernel(U *y, const U *x, strided s, int64_t n) {
    GRID_STRIDE(i, n) y[i] = x[strided_off(s, i)];
}
template <typename U>
__global__ void strided_scatter_kernel(U *x, const U *y, strided s, int64_t n) {
    GRID_STRIDE(i, n) x[strided_off(s, i)] = y[i];
}

// drops size-1 dims and merges dims that stay contiguous in x
static void strided_simplify(strided *s) {
    strided t;
    memset(&t, 0, sizeof t);
    t.base = s->base;
    for (int d = 0; d < s->n; d++) {
        if (s->dims[d] == 1) continue;
        if (t.n > 0 && t.xs[t.n - 1] == s->xs[d] * s->dims[d]) {
            t.dims[t.n - 1] *= s->dims[d];
            t.xs[t.n - 1] = s->xs[d];
            continue;
        }
        t.dims[t.n] = s->dims[d];
        t.xs[t.n] = s->xs[d];
        t.n++;
    }
    *s = t;
}

static om_status *strided_run(const om_kernel_ctx *ctx, const om_cuda_exec *x, size_t es, void *dst, const void *src,
                              strided s, int scatter) {
    int64_t n = 1;
    for (int d = 0; d < s.n; d++) n *= s.dims[d];
    if (!n) return NULL;
    strided_simplify(&s);
    if (s.n == 1 && s.xs[0] == 1)   // one contiguous run
        return copy_d2d(scatter ? (char *)dst + s.base * es : dst, scatter ? src : (const char *)src + s.base * es,
                        (size_t)n * es, x);
    if (s.n == 0) return copy_d2d(scatter ? (char *)dst + s.base * es : dst, scatter ? src : (const char *)src + s.base * es, es, x);
    OMC_DISPATCH_SIZE(es, ctx, {
        if (scatter) strided_scatter_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)dst, (const U *)src, s, n);
        else strided_copy_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)dst, (const U *)src, s, n);
    });
    return omc_launched(ctx);
}

// ---- views (Reshape, Flatten, Squeeze, Unsqueeze): a copy when the planner did not alias ---------

om_status *view_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    if (!ctx->out[0].data) return NULL;
    return copy_d2d(ctx->out[0].data, ctx->in[0].data, nbytes(&ctx->in[0]), x);
}

// ---- Shape / Size (normally folded at plan time) -----------------------------------------------------

struct small_ints { int64_t v[OM_MAX_RANK]; };
__global__ void write_ints_kernel(int64_t *y, small_ints v, int n) {
    if (threadIdx.x < (unsigned)n) y[threadIdx.x] = v.v[threadIdx.x];
}
om_status *shape_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    int rank = ctx->in[0].rank;
    int64_t s = attr_i(ctx, "start", 0), e = attr_i(ctx, "end", rank);
    if (s < 0) s += rank;
    if (e < 0) e += rank;
    s = s < 0 ? 0 : s > rank ? rank : s;
    e = e < 0 ? 0 : e > rank ? rank : e;
    small_ints v;
    int n = 0;
    for (int64_t i = s; i < e; i++) v.v[n++] = ctx->in[0].dims[i];
    if (!n) return NULL;
    write_ints_kernel<<<1, 32, 0, stream_of(x)>>>((int64_t *)ctx->out[0].data, v, n);
    return omc_launched(ctx);
}
om_status *size_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    small_ints v;
    v.v[0] = numel(&ctx->in[0]);
    write_ints_kernel<<<1, 32, 0, stream_of(x)>>>((int64_t *)ctx->out[0].data, v, 1);
    return omc_launched(ctx);
}

// ---- Transpose ------------------------------------------------------------------------------------

// x is (d0..dr-1), y is (d_perm0..d_perm r-1): y[i] = x[permuted index]
om_status *transpose_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    int r = in->rank, perm[OM_MAX_RANK];
    const int64_t *p;
    int k = attr_is(ctx, "perm", &p);
    for (int i = 0; i < r; i++) perm[i] = k < 0 ? r - 1 - i : (int)p[i];
    if (k >= 0 && k != r) return omc_err_unsupported(ctx, "perm of the wrong length");
    int64_t xs[OM_MAX_RANK];
    dense_strides(r, in->dims, xs);
    strided s;
    memset(&s, 0, sizeof s);
    s.n = r;
    for (int i = 0; i < r; i++) { s.dims[i] = in->dims[perm[i]]; s.xs[i] = xs[perm[i]]; }
    return strided_run(ctx, x, dtype_size(in->dtype), ctx->out[0].data, in->data, s, 0);
}

// ---- Expand: x right-aligned against y, size-1 dims repeat (stride 0) ---------------------------------

om_status *expand_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0], *out = &ctx->out[0];
    int R = out->rank;
    int64_t xd[OM_MAX_RANK], xs[OM_MAX_RANK];
    for (int i = 0; i < R; i++) xd[i] = i < R - in->rank ? 1 : in->dims[i - (R - in->rank)];
    dense_strides(R, xd, xs);
    strided s;
    memset(&s, 0, sizeof s);
    s.n = R;
    for (int i = 0; i < R; i++) { s.dims[i] = out->dims[i]; s.xs[i] = xd[i] == 1 ? 0 : xs[i]; }
    return strided_run(ctx, x, dtype_size(in->dtype), out->data, in->data, s, 0);
}

// ---- Gather / GatherGrad ----------------------------------------------------------------------------

// x is (outer, N, inner), idx (K) int32/int64 (negative wraps), y is (outer, K, inner). Constant indices
// were range checked at plan time (shape.c's gather_infer); data ones cannot be without a synchronization.
template <typename U, typename I>
__global__ void gather_kernel(U *y, const U *x_, const I *idx, int64_t outer, int64_t N, int64_t K, int64_t inner) {
    GRID_STRIDE(i, outer * K * inner) {
        int64_t j = i % inner, t = i / inner, k = t % K, o = t / K;
        int64_t r = (int64_t)idx[k];
        if (r < 0) r += N;
        y[i] = (r >= 0 && r < N) ? x_[(o * N + r) * inner + j] : (U)0;   // out of range: 0 (the CPU raises)
    }
}

om_status *gather_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0], *ind = &ctx->in[1];
    int axis = norm_axis(attr_i(ctx, "axis", 0), in->rank);
    if (axis < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "Gather node '%s': axis out of range", omc_node_name(ctx));
    int64_t outer = dims_prod(in->dims, 0, axis), N = in->dims[axis], inner = dims_prod(in->dims, axis + 1, in->rank), K = numel(ind);
    int64_t n = outer * K * inner;
    if (!n) return NULL;
    OMC_DISPATCH_SIZE(dtype_size(in->dtype), ctx, {
        if (ind->dtype == OM_I64)
            gather_kernel<U, int64_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (U *)ctx->out[0].data, (const U *)in->data, (const int64_t *)ind->data, outer, N, K, inner);
        else if (ind->dtype == OM_I32)
            gather_kernel<U, int32_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (U *)ctx->out[0].data, (const U *)in->data, (const int32_t *)ind->data, outer, N, K, inner);
        else return omc_err_dtype(ctx, 1, ind->dtype);
    });
    return omc_launched(ctx);
}

// dy is (outer, K, inner), acc is (outer, N, inner) from zero in dy's math type (omc_scatter):
// acc[o, idx[k], :] += dy[o, k, :]
template <typename T, typename I>
__global__ void gather_grad_kernel(typename acc<T>::t *acc_, const T *dy, const I *idx, int64_t outer, int64_t N,
                                   int64_t K, int64_t inner) {
    GRID_STRIDE(i, outer * K * inner) {
        int64_t j = i % inner, t = i / inner, k = t % K, o = t / K;
        int64_t r = (int64_t)idx[k];
        if (r < 0) r += N;
        if (r >= 0 && r < N) atomic_acc(&acc_[(o * N + r) * inner + j], ld(dy[i]));
    }
}

om_status *gather_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dy = &ctx->in[0], *ind = &ctx->in[2], *dx = &ctx->out[0];
    int axis = norm_axis(attr_i(ctx, "axis", 0), dx->rank);
    if (axis < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "GatherGrad node '%s': axis out of range", omc_node_name(ctx));
    if (ind->dtype != OM_I64 && ind->dtype != OM_I32) return omc_err_dtype(ctx, 2, ind->dtype);
    if (!om_dtype_is_float(dy->dtype)) return omc_err_dtype(ctx, 0, dy->dtype);
    int64_t outer = dims_prod(dx->dims, 0, axis), N = dx->dims[axis], inner = dims_prod(dx->dims, axis + 1, dx->rank), K = numel(ind);
    const int64_t n = outer * K * inner;
    omc_scatter sc;
    OMC_TRY(omc_scatter_start(ctx, x, dy->dtype, dx->data, numel(dx), NULL, &sc));
    if (n && sc.n) {
        OMC_DISPATCH_FLOAT(dy->dtype, ctx, 0, {
            if (ind->dtype == OM_I64)
                gather_grad_kernel<T, int64_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                    (A *)sc.acc, (const T *)dy->data, (const int64_t *)ind->data, outer, N, K, inner);
            else
                gather_grad_kernel<T, int32_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                    (A *)sc.acc, (const T *)dy->data, (const int32_t *)ind->data, outer, N, K, inner);
        });
    }
    return omc_scatter_finish(ctx, x, &sc, n && sc.n ? omc_launched(ctx) : NULL);
}

// ---- Concat / ConcatGrad / Split / SplitGrad: (outer, chunk) blocks, one 2-D copy each ----------

static om_status *copy_2d(const om_cuda_exec *x, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t rows) {
    if (!width || !rows) return NULL;
    return omc_cuda(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream_of(x)),
                    "cudaMemcpy2DAsync");
}

// x_k are (outer, n_k, inner), y is (outer, sum n_k, inner)
om_status *concat_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *y = &ctx->out[0];
    int axis = norm_axis(attr_i(ctx, "axis", 0), y->rank);
    if (axis < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "Concat node '%s': axis out of range", omc_node_name(ctx));
    size_t es = dtype_size(y->dtype);
    int64_t outer = dims_prod(y->dims, 0, axis), inner_b = dims_prod(y->dims, axis + 1, y->rank) * (int64_t)es;
    int64_t row_b = y->dims[axis] * inner_b, off = 0;
    for (int k = 0; k < ctx->n_in; k++) {
        if (!present(ctx, k)) continue;
        int64_t chunk = ctx->in[k].dims[axis] * inner_b;
        OMC_TRY(copy_2d(x, (char *)y->data + off, (size_t)row_b, ctx->in[k].data, (size_t)chunk, (size_t)chunk, (size_t)outer));
        off += chunk;
    }
    return NULL;
}

// ConcatGrad(dy, Shape(x_0), ..., Shape(x_n-1); axis, index): dy is (outer, sum n_k, inner), dx (outer, n_index, inner)
om_status *concat_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dy = &ctx->in[0], *dx = &ctx->out[0];
    int index = (int)attr_i(ctx, "index", 0);
    int axis = norm_axis(attr_i(ctx, "axis", 0), dy->rank);
    if (axis < 0 || index < 0 || index >= ctx->n_in - 1) return omc_err_unsupported(ctx, "axis or index");
    int64_t before = 0;
    for (int i = 0; i < index; i++) {
        int64_t d[OM_MAX_RANK];
        if (host_ints(ctx, x, 1 + i, d, OM_MAX_RANK) <= axis) return omc_err_unsupported(ctx, "shapes not known at plan time");
        before += d[axis];
    }
    size_t es = dtype_size(dy->dtype);
    int64_t inner_b = dims_prod(dy->dims, axis + 1, dy->rank) * (int64_t)es, outer = dims_prod(dy->dims, 0, axis);
    int64_t chunk = dx->dims[axis] * inner_b, stride = dy->dims[axis] * inner_b;
    return copy_2d(x, dx->data, (size_t)chunk, (const char *)dy->data + before * inner_b, (size_t)stride, (size_t)chunk,
                   (size_t)outer);
}

// sizes along axis: the split input (known at plan time), the split attribute, or equal chunks
static om_status *split_sizes(const om_kernel_ctx *ctx, const om_cuda_exec *x, int split_input, int64_t dim, int n,
                              int64_t *sizes) {
    const int64_t *av;
    int na;
    if (split_input >= 0 && present(ctx, split_input)) {
        int64_t v[64];
        if (n > 64 || host_ints(ctx, x, split_input, v, 64) != n) return omc_err_unsupported(ctx, "split sizes");
        for (int j = 0; j < n; j++) sizes[j] = v[j];
    } else if ((na = attr_is(ctx, "split", &av)) >= 0) {
        if (na != n) return omc_err_unsupported(ctx, "split sizes");
        for (int j = 0; j < n; j++) sizes[j] = av[j];
    } else {
        int64_t chunk = (dim + n - 1) / n;
        for (int j = 0; j < n; j++) {
            int64_t left = dim - j * chunk;
            sizes[j] = left < 0 ? 0 : left < chunk ? left : chunk;
        }
    }
    return NULL;
}

// x is (outer, sum n_j, inner), y_j is (outer, n_j, inner)
om_status *split_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    int axis = norm_axis(attr_i(ctx, "axis", 0), in->rank);
    int n = ctx->n_out;
    if (axis < 0 || n > 64) return omc_err_unsupported(ctx, "axis or more than 64 outputs");
    int64_t sizes[64];
    OMC_TRY(split_sizes(ctx, x, 1, in->dims[axis], n, sizes));
    size_t es = dtype_size(in->dtype);
    int64_t inner_b = dims_prod(in->dims, axis + 1, in->rank) * (int64_t)es, outer = dims_prod(in->dims, 0, axis);
    int64_t row_b = in->dims[axis] * inner_b, off = 0;
    for (int j = 0; j < n; j++) {
        int64_t chunk = sizes[j] * inner_b;
        if (wanted(ctx, j))
            OMC_TRY(copy_2d(x, ctx->out[j].data, (size_t)chunk, (const char *)in->data + off, (size_t)row_b, (size_t)chunk,
                            (size_t)outer));
        off += chunk;
    }
    return NULL;
}

// SplitGrad(Shape(x), split?, dy_0..dy_n-1): dy_j (outer, n_j, inner) -> dx (outer, sum n_j, inner), zeros for absent dy_j
om_status *split_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dx = &ctx->out[0];
    int axis = norm_axis(attr_i(ctx, "axis", 0), dx->rank);
    int n = ctx->n_in - 2;
    if (axis < 0 || n > 64) return omc_err_unsupported(ctx, "axis or more than 64 parts");
    int64_t sizes[64];
    OMC_TRY(split_sizes(ctx, x, 1, dx->dims[axis], n, sizes));
    size_t es = dtype_size(dx->dtype);
    int64_t inner_b = dims_prod(dx->dims, axis + 1, dx->rank) * (int64_t)es, outer = dims_prod(dx->dims, 0, axis);
    int64_t row_b = dx->dims[axis] * inner_b, off = 0;
    for (int j = 0; j < n; j++) {
        int64_t chunk = sizes[j] * inner_b;
        if (present(ctx, 2 + j))
            OMC_TRY(copy_2d(x, (char *)dx->data + off, (size_t)row_b, ctx->in[2 + j].data, (size_t)chunk, (size_t)chunk,
                            (size_t)outer));
        else if (chunk && outer)
            OMC_TRY(omc_cuda(cudaMemset2DAsync((char *)dx->data + off, (size_t)row_b, 0, (size_t)chunk, (size_t)outer,
                                               stream_of(x)), "cudaMemset2DAsync"));
        off += chunk;
    }
    return NULL;
}

// ---- Slice / SliceGrad ----------------------------------------------------------------------------------

struct slice_params { int64_t start[OM_MAX_RANK], step[OM_MAX_RANK], count[OM_MAX_RANK]; };

// starts = in[first], ends, axes?, steps? (known at plan time), clamped as ONNX says
static om_status *slice_params_get(const om_kernel_ctx *ctx, const om_cuda_exec *x, int first, int rank,
                                   const int64_t *dims, slice_params *sp) {
    for (int a = 0; a < rank; a++) { sp->start[a] = 0; sp->step[a] = 1; sp->count[a] = dims[a]; }
    int64_t st[OM_MAX_RANK], en[OM_MAX_RANK], ax[OM_MAX_RANK], sp_[OM_MAX_RANK];
    int ns = host_ints(ctx, x, first, st, OM_MAX_RANK), ne = host_ints(ctx, x, first + 1, en, OM_MAX_RANK);
    if (ns < 0 || ne != ns) return omc_err_unsupported(ctx, "starts/ends that are not known at plan time");
    int has_axes = present(ctx, first + 2), has_steps = present(ctx, first + 3);
    if (has_axes && host_ints(ctx, x, first + 2, ax, OM_MAX_RANK) != ns) return omc_err_unsupported(ctx, "axes");
    if (has_steps && host_ints(ctx, x, first + 3, sp_, OM_MAX_RANK) != ns) return omc_err_unsupported(ctx, "steps");
    for (int i = 0; i < ns; i++) {
        int a = norm_axis(has_axes ? ax[i] : i, rank);
        if (a < 0) return omc_err_unsupported(ctx, "axis out of range");
        int64_t step = has_steps ? sp_[i] : 1, d = dims[a], s = st[i], e = en[i];
        if (step == 0) return omc_err_unsupported(ctx, "step 0");
        sp->count[a] = om_slice_axis(s, e, step, d, &sp->start[a]);
        sp->step[a] = sp->count[a] > 1 ? step : 1;   /* as on the CPU: a step of INT64_MAX * stride overflows */
    }
    return NULL;
}

static strided slice_walk(int rank, const int64_t *dims, const slice_params *sp) {
    int64_t xs[OM_MAX_RANK];
    dense_strides(rank, dims, xs);
    strided s;
    memset(&s, 0, sizeof s);
    s.n = rank;
    for (int a = 0; a < rank; a++) {
        s.dims[a] = sp->count[a];
        s.xs[a] = sp->step[a] * xs[a];
        s.base += sp->start[a] * xs[a];
    }
    return s;
}

// x is (d0..), y is (count0..)
om_status *slice_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *in = &ctx->in[0];
    slice_params sp;
    OMC_TRY(slice_params_get(ctx, x, 1, in->rank, in->dims, &sp));
    return strided_run(ctx, x, dtype_size(in->dtype), ctx->out[0].data, in->data, slice_walk(in->rank, in->dims, &sp), 0);
}

// SliceGrad(dy, Shape(x), starts, ends, axes?, steps?): zeros with dy scattered into the slice
om_status *slice_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dx = &ctx->out[0];
    slice_params sp;
    OMC_TRY(slice_params_get(ctx, x, 2, dx->rank, dx->dims, &sp));
    OMC_TRY(omc_cuda(cudaMemsetAsync(dx->data, 0, nbytes(dx), stream_of(x)), "cudaMemsetAsync"));
    return strided_run(ctx, x, dtype_size(dx->dtype), dx->data, ctx->in[0].data, slice_walk(dx->rank, dx->dims, &sp), 1);
}
