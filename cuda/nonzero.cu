// nonzero.cu — nonzero.c's ops on the CUDA provider: OneHot. NonZero has no kernel (a HOST_OP):
// the executor refuses a graph with a data-dependent size on CUDA by name (csrc/exec/engine.c).
#include "common.cuh"

// y is (outer, depth, inner); idx is (outer, inner), negative wrapping; vals = [off, on]. An index
// out of range leaves its row all off (ONNX's rule; the CPU kernel raises, which a kernel here
// cannot without a synchronization).
template <typename U, typename I>
__global__ void one_hot_kernel(U *y, const I *idx, const U *vals, int64_t outer, int64_t depth, int64_t inner) {
    GRID_STRIDE(i, outer * depth * inner) {
        int64_t r = i % inner, t = i / inner, k = t % depth, o = t / depth;
        int64_t v = (int64_t)idx[o * inner + r];
        if (v < 0) v += depth;
        y[i] = v == k ? vals[1] : vals[0];
    }
}

om_status *one_hot_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *ind = &ctx->in[0], *vals = &ctx->in[2], *out = &ctx->out[0];
    int axis = norm_axis(attr_i(ctx, "axis", -1), out->rank);
    if (axis < 0) return OMC_ERR(OM_INVALID_ARGUMENT, "OneHot node '%s': axis out of range", omc_node_name(ctx));
    int64_t outer = dims_prod(out->dims, 0, axis), depth = out->dims[axis];
    int64_t inner = dims_prod(out->dims, axis + 1, out->rank), n = outer * depth * inner;
    if (!n) return NULL;
    OMC_DISPATCH_SIZE(dtype_size(vals->dtype), ctx, {
        if (ind->dtype == OM_I64)
            one_hot_kernel<U, int64_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (U *)out->data, (const int64_t *)ind->data, (const U *)vals->data, outer, depth, inner);
        else if (ind->dtype == OM_I32)
            one_hot_kernel<U, int32_t><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                (U *)out->data, (const int32_t *)ind->data, (const U *)vals->data, outer, depth, inner);
        else return omc_err_dtype(ctx, 0, ind->dtype);
    });
    return omc_launched(ctx);
}
