// optim.cu — csrc/optim's multi-tensor passes on CUDA parameters (ortmod.optim.FusedAdam and
// FP16_Optimizer): the Adam/AdamW step, dst = src * factor, and the gradients' inf/NaN check
// with their sum of squares.
//
// Multi-tensor launches, as torch's multi_tensor_apply: up to OPT_TENSORS tensors per launch,
// their pointers, sizes and dtypes in the kernel's parameters (no host->device copy of
// metadata), each tensor cut into OPT_CHUNK-element chunks with one block per chunk; a block
// finds its tensor among the launch's block starts. Math in fp32 on the loaded values (fp16/bf16
// parameters and gradients are converted per element), moments fp32, as adam.c; the step's
// constants come formed from the engine (om_adam_consts), so both providers compute the same
// update (nvcc may contract to FMAs: ulps apart).
#include <math.h>

#include "common.cuh"

#define OPT_TENSORS 24
#define OPT_CHUNK 8192

struct opt_batch {
    int n;
    int block_start[OPT_TENSORS + 1];   // first block of each tensor; [n] = the launch's blocks
    void *a[OPT_TENSORS];               // params (adam), dst (copy), grads (norm)
    const void *b[OPT_TENSORS];         // grads (adam), src (copy)
    float *m[OPT_TENSORS], *v[OPT_TENSORS];
    int64_t numel[OPT_TENSORS];
    unsigned char adt[OPT_TENSORS], bdt[OPT_TENSORS];
};

__device__ __forceinline__ float load_any(const void *p, int dt, int64_t i) {
    switch (dt) {
    case OM_F16: return __half2float(((const __half *)p)[i]);
    case OM_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}
__device__ __forceinline__ void store_any(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case OM_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case OM_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

// This block's tensor and element range [lo, hi)
__device__ __forceinline__ int batch_piece(const opt_batch &B, int64_t *lo, int64_t *hi) {
    int t = 0;
    while (t + 1 < B.n && (int)blockIdx.x >= B.block_start[t + 1]) t++;
    *lo = (int64_t)(blockIdx.x - B.block_start[t]) * OPT_CHUNK;
    *hi = *lo + OPT_CHUNK < B.numel[t] ? *lo + OPT_CHUNK : B.numel[t];
    return t;
}

// adam.c's adam_core, per element (see om_adam_consts for the three modes)
__global__ void adam_kernel(opt_batch B, om_adam_consts c) {
    int64_t lo, hi;
    const int t = batch_piece(B, &lo, &hi);
    void *p = B.a[t];
    const void *g = B.b[t];
    float *m = B.m[t], *v = B.v[t];
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float gi = load_any(g, B.bdt[t], i) * c.inv_scale;
        float pi = load_any(p, B.adt[t], i);
        if (c.mode == 2) {
            pi = pi * c.decay;
            const float mi = m[i] + c.w1 * (gi - m[i]);
            const float vi = v[i] * c.b2 + c.w2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            pi = pi + c.step_size * mi / (sqrtf(vi) / c.bc2_sqrt + c.eps);
        } else {
            if (c.mode == 0) gi = gi + c.wd * pi;
            const float mi = c.b1 * m[i] + c.w1 * gi;
            const float vi = c.b2 * v[i] + c.w2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            pi = pi - c.step_size * mi / (sqrtf(vi) + c.eps);
            if (c.mode == 1) pi = pi - c.decay * pi;
        }
        store_any(p, B.adt[t], i, pi);
    }
}

// a[t] = b[t] * factor (a may be b)
__global__ void copy_scaled_kernel(opt_batch B, float factor) {
    int64_t lo, hi;
    const int t = batch_piece(B, &lo, &hi);
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
        store_any(B.a[t], B.adt[t], i, load_any(B.b[t], B.bdt[t], i) * factor);
}

// *sum += the squares of every element (fp64; inf/NaN propagate into the sum)
__global__ void sq_sum_kernel(opt_batch B, double *sum) {
    int64_t lo, hi;
    const int t = batch_piece(B, &lo, &hi);
    double s = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double x = (double)load_any(B.a[t], B.adt[t], i);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) atomicAdd(sum, s);
}

// Calls launch(batch, blocks) for consecutive groups of up to OPT_TENSORS non-empty tensors.
template <typename F>
static om_status *for_batches(const om_kernel_ctx *ctx, int n, const om_tensor *a, const om_tensor *b, om_tensor *m,
                              om_tensor *v, F launch) {
    opt_batch B;
    memset(&B, 0, sizeof B);
    int blocks = 0;
    for (int k = 0; k <= n; k++) {
        const int64_t numel_k = k < n ? numel(&a[k]) : 0;
        const int64_t chunks = (numel_k + OPT_CHUNK - 1) / OPT_CHUNK;
        if (B.n && (k == n || B.n == OPT_TENSORS || blocks + chunks > INT32_MAX / 2)) {
            B.block_start[B.n] = blocks;
            launch(B, blocks);
            OMC_TRY(omc_launched(ctx));
            memset(&B, 0, sizeof B);
            blocks = 0;
        }
        if (k == n || !numel_k) continue;
        const int t = B.n++;
        B.block_start[t] = blocks;
        B.a[t] = a[k].data;
        B.adt[t] = (unsigned char)a[k].dtype;
        if (b) { B.b[t] = b[k].data; B.bdt[t] = (unsigned char)b[k].dtype; }
        if (m) { B.m[t] = (float *)m[k].data; B.v[t] = (float *)v[k].data; }
        B.numel[t] = numel_k;
        blocks += (int)chunks;
    }
    return NULL;
}

// Errors here have no node: the launch check names the pass instead.
static om_kernel_ctx pass_ctx(const char *what) {
    static om_node nodes[3];
    static const char *names[3] = {"adam_step", "grads_copy_scaled", "grads_check_and_norm"};
    om_kernel_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    for (int i = 0; i < 3; i++)
        if (!strcmp(names[i], what)) { nodes[i].name = (char *)names[i]; ctx.node = &nodes[i]; }
    return ctx;
}

// What the passes need of an exec: the device (current: provider.cu's wrappers set it) and the
// stream for launches and temporary memory. No cuBLAS: the device's handle stays bound to the
// engine's stream.
static om_cuda_exec exec_of(int device, void *stream) {
    om_cuda_exec x;
    memset(&x, 0, sizeof x);
    x.device = device;
    x.stream = stream;
    return x;
}

om_status *omc_adam_step(int device, void *stream, const om_adam_consts *c, int n, om_tensor *params,
                         const om_tensor *grads, om_tensor *exp_avg, om_tensor *exp_avg_sq) {
    const om_cuda_exec x = exec_of(device, stream);
    const om_kernel_ctx ctx = pass_ctx("adam_step");
    const om_adam_consts cc = *c;
    return for_batches(&ctx, n, params, grads, exp_avg, exp_avg_sq, [&](const opt_batch &B, int blocks) {
        adam_kernel<<<blocks, 256, 0, stream_of(&x)>>>(B, cc);
    });
}

om_status *omc_grads_copy_scaled(int device, void *stream, int n, const om_tensor *src, om_tensor *dst, float factor) {
    const om_cuda_exec x = exec_of(device, stream);
    const om_kernel_ctx ctx = pass_ctx("grads_copy_scaled");
    return for_batches(&ctx, n, dst, src, NULL, NULL, [&](const opt_batch &B, int blocks) {
        copy_scaled_kernel<<<blocks, 256, 0, stream_of(&x)>>>(B, factor);
    });
}

om_status *omc_grads_check_and_norm(int device, void *stream, int n, const om_tensor *grads, int *found_inf,
                                    double *sq_sum) {
    const om_cuda_exec x = exec_of(device, stream);
    const om_kernel_ctx ctx = pass_ctx("grads_check_and_norm");
    double *sum = NULL;
    OMC_TRY(omc_temp_alloc(&x, sizeof(double), (void **)&sum));
    om_status *st = omc_cuda(cudaMemsetAsync(sum, 0, sizeof(double), stream_of(&x)), "cudaMemsetAsync");
    if (!st)
        st = for_batches(&ctx, n, grads, NULL, NULL, NULL, [&](const opt_batch &B, int blocks) {
            sq_sum_kernel<<<blocks, 256, 0, stream_of(&x)>>>(B, sum);
        });
    double s = 0.0;
    if (!st) {   // the result goes to the host: the copy and the wait are the two blocking calls
        omc_count_blocking_call();
        st = omc_cuda(cudaMemcpyAsync(&s, sum, sizeof s, cudaMemcpyDeviceToHost, stream_of(&x)), "cudaMemcpyAsync");
        omc_count_blocking_call();
        if (!st) st = omc_cuda(cudaStreamSynchronize(stream_of(&x)), "cudaStreamSynchronize");
    }
    omc_temp_free(&x, sum);
    if (st) return st;
    *found_inf = !isfinite(s);
    *sq_sum = s;
    return NULL;
}
