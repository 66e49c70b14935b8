// scatter.cu — the targets of scatter-adds (common.cuh's omc_scatter): GatherGrad,
// GatherElementsGrad, ScatterElements(add), PadGrad and MaxPoolGrad add through them.
#include "common.cuh"

// dst (n, fp32) = src (n, T): the starting values of a half scatter, widened once
template <typename T>
__global__ void widen_kernel(float *dst, const T *src, int64_t n) {
    GRID_STRIDE(i, n) dst[i] = ld(src[i]);
}

om_status *omc_scatter_start(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *out, int64_t n,
                             const void *init, omc_scatter *s) {
    *s = omc_scatter{out, out, n, dt};
    const size_t es = dtype_size(dt);
    if (!om_dtype_is_half(dt)) {
        if (!n || init == out) return NULL;
        if (!init) return omc_cuda(cudaMemsetAsync(out, 0, (size_t)n * es, stream_of(x)), "cudaMemsetAsync");
        return omc_cuda(cudaMemcpyAsync(out, init, (size_t)n * es, cudaMemcpyDeviceToDevice, stream_of(x)),
                        "cudaMemcpyAsync");
    }
    s->acc = NULL;
    if (!n) return NULL;
    OMC_TRY(omc_temp_alloc(x, sizeof(float) * (size_t)n, &s->acc));
    om_status *st = NULL;
    if (!init) {
        st = omc_cuda(cudaMemsetAsync(s->acc, 0, sizeof(float) * (size_t)n, stream_of(x)), "cudaMemsetAsync");
    } else if (dt == OM_F16) {
        widen_kernel<__half><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((float *)s->acc, (const __half *)init, n);
        st = omc_launched(ctx);
    } else {
        widen_kernel<__nv_bfloat16><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((float *)s->acc,
                                                                                   (const __nv_bfloat16 *)init, n);
        st = omc_launched(ctx);
    }
    if (st) {
        omc_temp_free(x, s->acc);
        s->acc = NULL;
    }
    return st;
}

om_status *omc_scatter_finish(const om_kernel_ctx *ctx, const om_cuda_exec *x, omc_scatter *s, om_status *st) {
    if (s->acc == s->out || !s->acc) return st;
    if (!st) {
        if (s->dt == OM_F16)
            omc_round_kernel<__half><<<grid_for(s->n), OMC_THREADS, 0, stream_of(x)>>>((__half *)s->out,
                                                                                      (const float *)s->acc, s->n);
        else
            omc_round_kernel<__nv_bfloat16><<<grid_for(s->n), OMC_THREADS, 0, stream_of(x)>>>(
                (__nv_bfloat16 *)s->out, (const float *)s->acc, s->n);
        st = omc_launched(ctx);
    }
    omc_temp_free(x, s->acc);
    s->acc = NULL;
    return st;
}
