// common.cuh — what every CUDA kernel file uses: dtypes, loads/stores with fp32 math,
// broadcast indexing, launch helpers, error reporting through the engine (om_cuda_host).
//
// Conventions (llm.c style): one file per op family; every kernel starts with a shape
// comment; the host function of an op is `static om_status *<op>_cuda(ctx, x)` and each
// file ends with its table of (op name, domain, kernel) that provider.cu collects.
// Math is done in float (double for float64 tensors): fp16/bf16 are storage types only,
// loaded to float and rounded once on store.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "exec/cuda_provider.h"

// ---- the engine's functions (set by init) -------------------------------------------------
extern om_cuda_host g_host;

#define OMC_ERR(code, ...) g_host.error((code), __VA_ARGS__)
#define OMC_TRY(expr)                        \
    do {                                     \
        om_status *omc_st_ = (expr);         \
        if (omc_st_) return omc_st_;         \
    } while (0)

static inline const char *omc_node_name(const om_kernel_ctx *ctx) {
    return ctx->node && ctx->node->name ? ctx->node->name : "?";
}
static inline const char *omc_op_name(const om_kernel_ctx *ctx) {
    return ctx->node && ctx->node->op ? ctx->node->op->name : "?";
}
static inline om_status *omc_err_dtype(const om_kernel_ctx *ctx, int i, om_dtype dt) {
    return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s' (%s): input %d has dtype %d, which the CUDA kernel does not take",
                   omc_node_name(ctx), omc_op_name(ctx), i, (int)dt);
}
static inline om_status *omc_err_unsupported(const om_kernel_ctx *ctx, const char *what) {
    return OMC_ERR(OM_UNSUPPORTED_OP, "node '%s' (%s): unsupported on CUDA: %s", omc_node_name(ctx),
                   omc_op_name(ctx), what);
}
// After a launch: reports a launch failure (bad configuration, no kernel image for the GPU).
static inline om_status *omc_launched(const om_kernel_ctx *ctx) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return NULL;
    return OMC_ERR(OM_RUNTIME, "node '%s' (%s): CUDA launch failed: %s", omc_node_name(ctx), omc_op_name(ctx),
                   cudaGetErrorString(e));
}
static inline om_status *omc_cuda(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return NULL;
    return OMC_ERR(OM_RUNTIME, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

static inline int64_t attr_i(const om_kernel_ctx *ctx, const char *name, int64_t d) { return g_host.attr_int(ctx->node, name, d); }
static inline float attr_f(const om_kernel_ctx *ctx, const char *name, float d) { return g_host.attr_float(ctx->node, name, d); }
// A float attribute as the number written into it (0.9, not 0.899999976), as om_attr_real
// (a default with a short decimal, like 1e-5, comes back as itself).
static inline double attr_real(const om_kernel_ctx *ctx, const char *name, double d) {
    return om_float_decimal(attr_f(ctx, name, (float)d));
}
static inline const char *attr_s(const om_kernel_ctx *ctx, const char *name, const char *d) { return g_host.attr_string(ctx->node, name, d); }
static inline int attr_is(const om_kernel_ctx *ctx, const char *name, const int64_t **v) { return g_host.attr_ints(ctx->node, name, v); }
static inline int attr_ss(const om_kernel_ctx *ctx, const char *name, const char *const **v) { return g_host.attr_strings(ctx->node, name, v); }

// ---- tensors -------------------------------------------------------------------------------
static inline int64_t numel(const om_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}
// str = the row-major strides of dims
static inline void dense_strides(int rank, const int64_t *dims, int64_t *str) {
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) { str[d] = s; s *= dims[d]; }
}
// d[from] * ... * d[to - 1]
static inline int64_t dims_prod(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}
static inline size_t dtype_size(om_dtype d) {
    switch (d) {
    case OM_F64: case OM_I64: return 8;
    case OM_F32: case OM_I32: return 4;
    case OM_F16: case OM_BF16: return 2;
    case OM_I8: case OM_U8: case OM_BOOL: return 1;
    default: return 0;
    }
}
static inline size_t nbytes(const om_tensor *t) { return (size_t)numel(t) * dtype_size(t->dtype); }
static inline int present(const om_kernel_ctx *ctx, int i) { return i < ctx->n_in && ctx->in[i].dtype != OM_UNDEFINED; }
static inline int wanted(const om_kernel_ctx *ctx, int j) { return j < ctx->n_out && ctx->out[j].data != NULL; }
static inline cudaStream_t stream_of(const om_cuda_exec *x) { return (cudaStream_t)x->stream; }

// A host copy of input i known at plan time (Slice's starts, a ratio), as int64 values.
// Returns the count, or -1 when not known at plan time / not an integer tensor.
static inline int host_ints(const om_kernel_ctx *ctx, const om_cuda_exec *x, int i, int64_t *vals, int max) {
    if (!present(ctx, i) || !x->in_host || !x->in_host[i]) return -1;
    const om_tensor *t = &ctx->in[i];
    int64_t n = numel(t);
    if (n > max) return -1;
    for (int64_t k = 0; k < n; k++) {
        if (t->dtype == OM_I64) vals[k] = ((const int64_t *)x->in_host[i])[k];
        else if (t->dtype == OM_I32) vals[k] = ((const int32_t *)x->in_host[i])[k];
        else return -1;
    }
    return (int)n;
}
// A scalar float input known at plan time (dropout ratio); 0 on success.
static inline int host_scalar(const om_kernel_ctx *ctx, const om_cuda_exec *x, int i, double *v) {
    if (!present(ctx, i) || !x->in_host || !x->in_host[i] || numel(&ctx->in[i]) != 1) return -1;
    const void *p = x->in_host[i];
    switch (ctx->in[i].dtype) {
    case OM_F32: *v = *(const float *)p; return 0;
    case OM_F64: *v = *(const double *)p; return 0;
    case OM_F16: *v = __half2float(*(const __half *)p); return 0;
    case OM_BF16: *v = __bfloat162float(*(const __nv_bfloat16 *)p); return 0;
    case OM_BOOL: case OM_U8: *v = *(const uint8_t *)p; return 0;
    case OM_I64: *v = (double)*(const int64_t *)p; return 0;
    case OM_I32: *v = *(const int32_t *)p; return 0;
    default: return -1;
    }
}
// ratio (default 0.5) and training (default off) from inputs known at plan time (the exporter's
// constants); a ratio computed at run time is not supported on CUDA. Dropout, DropoutGrad, BiasDropout
// and its gradient share it (the CPU's twin: om_dropout_params, csrc/ops/op_util.h); *scale is what kept
// elements are multiplied by, 0 for ratio 1.
static inline om_status *omc_dropout_params(const om_kernel_ctx *ctx, const om_cuda_exec *x, int ri, int ti,
                                           double *ratio, int *training, double *scale) {
    *ratio = 0.5;
    *training = 0;
    if (present(ctx, ri) && host_scalar(ctx, x, ri, ratio))
        return omc_err_unsupported(ctx, "a dropout ratio that is not known at plan time");
    if (present(ctx, ti)) {
        double t;
        if (host_scalar(ctx, x, ti, &t)) return omc_err_unsupported(ctx, "a training_mode that is not known at plan time");
        *training = t != 0;
    }
    if (*training && !(*ratio >= 0.0 && *ratio <= 1.0))
        return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s': dropout ratio %g is outside [0, 1]", omc_node_name(ctx), *ratio);
    *scale = *ratio < 1.0 ? 1.0 / (1.0 - *ratio) : 0.0;
    return NULL;
}

static inline int norm_axis(int64_t axis, int rank) {
    int64_t a = axis < 0 ? axis + rank : axis;
    return a < 0 || a >= (rank > 0 ? rank : 1) ? -1 : (int)a;
}

// ---- element types: load to the math type, store with one rounding ---------------------------
template <typename T> struct acc { typedef float t; };
template <> struct acc<double> { typedef double t; };
template <> struct acc<int32_t> { typedef int32_t t; };
template <> struct acc<int64_t> { typedef int64_t t; };

template <typename T> __device__ __forceinline__ typename acc<T>::t ld(T v) { return (typename acc<T>::t)v; }
template <> __device__ __forceinline__ float ld<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T, typename A> __device__ __forceinline__ T st(A v) { return (T)v; }
template <> __device__ __forceinline__ __half st<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16, float>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half st<__half, double>(double v) { return __float2half_rn((float)v); }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16, double>(double v) { return __float2bfloat16_rn((float)v); }

// Any numeric type to/from double (Cast and generic paths).
template <typename T> __device__ __forceinline__ double to_f64(T v) { return (double)v; }
template <> __device__ __forceinline__ double to_f64<__half>(__half v) { return (double)__half2float(v); }
template <> __device__ __forceinline__ double to_f64<__nv_bfloat16>(__nv_bfloat16 v) { return (double)__bfloat162float(v); }

// dst (n) = src rounded once to T, src in T's math type: the last step of a result that many
// additions reach (scatter-adds, GEMMs accumulated over a batch), summed in fp32 for fp16/bf16.
template <typename T>
__global__ void omc_round_kernel(T *dst, const typename acc<T>::t *src, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = st<T>(src[i]);
}

// Dispatch on a float dtype: BODY sees T (storage) and A (math type). Every kernel written
// against ld()/st() and A takes fp16 and bf16 through this one macro (fp32 math, one rounding).
#define OMC_DISPATCH_FLOAT(dt, ctx, i, ...)                                          \
    switch (dt) {                                                                     \
    case OM_F32: { typedef float T; typedef float A; __VA_ARGS__; } break;                   \
    case OM_F16: { typedef __half T; typedef float A; __VA_ARGS__; } break;                  \
    case OM_BF16: { typedef __nv_bfloat16 T; typedef float A; __VA_ARGS__; } break;          \
    case OM_F64: { typedef double T; typedef double A; __VA_ARGS__; } break;                 \
    default: return omc_err_dtype((ctx), (i), (dt));                                  \
    }
// Floats and the integer types shape arithmetic uses.
#define OMC_DISPATCH_ARITH(dt, ctx, i, ...)                                          \
    switch (dt) {                                                                     \
    case OM_F32: { typedef float T; typedef float A; __VA_ARGS__; } break;                   \
    case OM_F16: { typedef __half T; typedef float A; __VA_ARGS__; } break;                  \
    case OM_BF16: { typedef __nv_bfloat16 T; typedef float A; __VA_ARGS__; } break;          \
    case OM_F64: { typedef double T; typedef double A; __VA_ARGS__; } break;                 \
    case OM_I32: { typedef int32_t T; typedef int32_t A; __VA_ARGS__; } break;               \
    case OM_I64: { typedef int64_t T; typedef int64_t A; __VA_ARGS__; } break;               \
    default: return omc_err_dtype((ctx), (i), (dt));                                  \
    }
// Every dtype the engine has, for comparisons and casts.
#define OMC_DISPATCH_ALL(dt, ctx, i, ...)                                            \
    switch (dt) {                                                                     \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                                    \
    case OM_F16: { typedef __half T; __VA_ARGS__; } break;                                   \
    case OM_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break;                           \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                                   \
    case OM_I32: { typedef int32_t T; __VA_ARGS__; } break;                                  \
    case OM_I64: { typedef int64_t T; __VA_ARGS__; } break;                                  \
    case OM_I8: { typedef int8_t T; __VA_ARGS__; } break;                                    \
    case OM_U8: { typedef uint8_t T; __VA_ARGS__; } break;                                   \
    case OM_BOOL: { typedef uint8_t T; __VA_ARGS__; } break;                                 \
    default: return omc_err_dtype((ctx), (i), (dt));                                  \
    }
// By element size only (data movement: Transpose, Gather, Concat, Where).
#define OMC_DISPATCH_SIZE(es, ctx, ...)                                              \
    switch (es) {                                                                     \
    case 1: { typedef uint8_t U; __VA_ARGS__; } break;                                       \
    case 2: { typedef uint16_t U; __VA_ARGS__; } break;                                      \
    case 4: { typedef uint32_t U; __VA_ARGS__; } break;                                      \
    case 8: { typedef uint64_t U; __VA_ARGS__; } break;                                      \
    default: return omc_err_unsupported((ctx), "element size");                       \
    }

// ---- launch ------------------------------------------------------------------------------------
#define OMC_THREADS 256
static inline unsigned grid_for(int64_t n, int threads = OMC_THREADS) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 32) b = 65535LL * 32;   // grid-stride loops cover the rest
    return (unsigned)b;
}
// one block per channel for per-channel statistics (dB, BatchNorm), at most 65535 (the kernels
// stride over the rest)
static inline unsigned channel_blocks(int64_t C) { return (unsigned)(C < 65535 ? (C > 0 ? C : 1) : 65535); }
#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// ---- broadcast indexing --------------------------------------------------------------------------
// Up to 4 operands right-aligned against an iteration shape; per operand, element strides
// (0 along broadcast dims). Dims of size 1 are dropped and mergeable neighbours merged on
// the host, so most ops index with one or two divisions.
#define OMC_MAX_OPS 4
struct bcast {
    int rank;
    int64_t dims[OM_MAX_RANK];
    int64_t str[OMC_MAX_OPS][OM_MAX_RANK];
    int contiguous[OMC_MAX_OPS];   // operand k walks exactly like the iteration space
};
// space: the iteration shape (usually the output). Returns 0, or -1 if an operand does not
// broadcast to it.
int bcast_init(bcast *b, const om_tensor *space, const om_tensor *const *ops, int n_ops);

__device__ __forceinline__ int64_t bcast_off(const bcast &b, int k, int64_t i) {
    if (b.contiguous[k]) return i;
    int64_t off = 0;
    for (int d = b.rank - 1; d >= 0 && i; d--) {
        int64_t q = i / b.dims[d];
        off += (i - q * b.dims[d]) * b.str[k][d];
        i = q;
    }
    return off;
}

// ---- random numbers: core.c's splitmix64, so CPU and GPU draw the same masks -------------------
__device__ __forceinline__ uint64_t rand_u64(uint64_t seed, uint64_t index) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ float rand_uniform(uint64_t seed, uint64_t index) {
    return (float)(rand_u64(seed, index) >> 40) * (1.0f / 16777216.0f);
}

// ---- reductions within a block -------------------------------------------------------------------
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) { A w = __shfl_xor_sync(0xffffffffu, v, o); v = w > v ? w : v; }
    return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
template <typename A> __device__ A block_sum(A v) {
    __shared__ A sh[32];
    v = warp_sum(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (A)0;
    return warp_sum(v);
}
template <typename A> __device__ A block_max(A v) {
    __shared__ A sh[32];
    v = warp_max(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : sh[0];   // a duplicate is neutral for max
    return warp_max(v);
}

// ---- scatter-adds: many additions that may meet in one element (scatter.cu) --------------------
// Kernels add into the target in the output's math type A with atomic_acc. fp32, fp64 and the
// integers accumulate in the output itself; fp16/bf16 accumulate in an fp32 buffer that
// omc_scatter_finish rounds into the output once: a half atomicAdd rounds at every addition (an
// embedding row reached by many tokens drifts), and sm < 80 has no bf16 atomicAdd at all.
__device__ __forceinline__ void atomic_acc(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_acc(double *p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_acc(int32_t *p, int32_t v) { atomicAdd((int *)p, (int)v); }
__device__ __forceinline__ void atomic_acc(int64_t *p, int64_t v) {
    atomicAdd((unsigned long long *)p, (unsigned long long)v);   // two's complement: the same bits
}
struct omc_scatter {
    void *acc;    // where kernels add: out itself, or the fp32 buffer
    void *out;
    int64_t n;
    om_dtype dt;
};
// Starts a scatter into out (n elements of dt) from zeros (init NULL) or from init (n elements of
// dt; may be out itself).
om_status *omc_scatter_start(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *out, int64_t n,
                             const void *init, omc_scatter *s);
// Rounds the fp32 buffer into out (fp16/bf16) and frees it. st is the status of the launches in
// between: the buffer is freed either way and the first error is returned.
om_status *omc_scatter_finish(const om_kernel_ctx *ctx, const om_cuda_exec *x, omc_scatter *s, om_status *st);

// ---- the provider's own (provider.cu) ----------------------------------------------------------
// counts a call that blocks the host (om_cuda_sync_count)
void omc_count_blocking_call(void);
// the optimizer passes (optim.cu): cuda_provider.h's adam_step, grads_copy_scaled, grads_check_and_norm
om_status *omc_adam_step(int device, void *stream, const om_adam_consts *c, int n, om_tensor *params,
                         const om_tensor *grads, om_tensor *exp_avg, om_tensor *exp_avg_sq);
om_status *omc_grads_copy_scaled(int device, void *stream, int n, const om_tensor *src, om_tensor *dst, float factor);
om_status *omc_grads_check_and_norm(int device, void *stream, int n, const om_tensor *grads, int *found_inf,
                                    double *sq_sum);

// ---- temporary device memory (provider.cu): stream-ordered, from the provider's pool -------------
om_status *omc_temp_alloc(const om_cuda_exec *x, size_t n, void **out);
void omc_temp_free(const om_cuda_exec *x, void *p);

// ---- shared helpers (matmul.cu, reduce.cu, fused.cu) ----------------------------------------------
om_status *omc_gemm(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tp, int tq, int64_t M, int64_t N,
                    int64_t K, double alpha, const void *P, int64_t sP, const void *Q, int64_t sQ, double beta, void *O,
                    int64_t sO, int64_t batch);
om_status *omc_gemm_f32_out(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tp, int tq, int64_t M,
                            int64_t N, int64_t K, double alpha, const void *P, int64_t sP, const void *Q, int64_t sQ,
                            double beta, float *O, int64_t sO, int64_t batch);
// y = gelu(src) elementwise over n values (y may be src); tanh_mode picks the approximation (fused.cu)
om_status *omc_gelu(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *y, const void *src, int64_t n,
                    int tanh_mode);
// g = g * gelu'(src) elementwise over n values (fused.cu)
om_status *omc_gelu_grad_in_place(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *g, const void *src,
                                  int64_t n, int tanh_mode);
// db (N) = column sums of dy (M, N); to_scalar: db[0] = sum of everything
om_status *omc_column_sum(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *db, const void *dy,
                          int64_t M, int64_t N, int to_scalar);
om_status *omc_reduce(const om_kernel_ctx *ctx, const om_cuda_exec *x, int kind, const om_tensor *in, const void *src,
                      const uint8_t *reduce_axis, void *dst, double scale);

// Copies bytes on the stream (device to device); the common "output is the input" case.
static inline om_status *copy_d2d(void *dst, const void *src, size_t n, const om_cuda_exec *x) {
    if (dst == src || n == 0) return NULL;
    return omc_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_of(x)), "cudaMemcpyAsync");
}
