/* cuda_provider.h — the interface of the CUDA execution provider: the engine defines it here,
 * the provider's shared object (ortmod/libortmod_cuda.so, built from the .cu files in cuda/)
 * implements it.
 *
 * The split is ggml-backend's (ggml-backend-impl.h): the engine owns the vtable and a backend
 * fills it in, so the engine never includes anything from cuda/, and the provider sees the
 * engine only through this header and the ops/ geometry headers its kernels share with the
 * CPU ones. The .cu files include it as "exec/cuda_provider.h", through the -Icsrc they are
 * built with. The engine's side (loading the library, the device part of a plan) is
 * exec/device.h.
 *
 * The engine loads the shared object with dlopen on the first CUDA tensor it sees and calls
 * its one exported symbol:
 *
 *     const om_cuda_provider *p = om_cuda_provider_get();   // static table, never freed
 *     p->init(&host);                                         // host: engine functions, below
 *     om_cuda_kernel_fn k = p->find_kernel("MatMul", "");     // at plan time: NULL = no kernel
 *     k(&ctx, &exec);                                          // at run time: enqueue on exec.stream
 *
 * Kernels take the CPU kernels' om_kernel_ctx unchanged, with device pointers in
 * ctx->in[i].data / ctx->out[j].data, plus an om_cuda_exec: the stream to enqueue on (the
 * caller's, i.e. torch's current stream), the cuBLAS handles and, per input, a host copy of
 * the data when it was known at plan time (shape-like inputs: Slice's starts, Dropout's ratio).
 * A kernel never synchronizes: errors it can see (bad attributes, dtypes) are returned as a
 * status; launch errors are returned too; data-dependent faults on the device are not.
 *
 * The shared object cannot see the extension's symbols (they are hidden), so everything it
 * needs from the engine (errors, attribute lookups) comes through om_cuda_host at init.
 * Bump OM_CUDA_ABI when either struct changes: the engine refuses a mismatched library.
 */
#ifndef OM_CUDA_PROVIDER_H
#define OM_CUDA_PROVIDER_H

#include "ops/op.h"
#include "exec/optim_provider.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OM_CUDA_ABI 4

typedef struct om_cuda_host {
    int abi;
    om_status *(*error)(om_code code, const char *fmt, ...);
    int64_t (*attr_int)(const om_node *n, const char *name, int64_t dflt);
    float (*attr_float)(const om_node *n, const char *name, float dflt);
    const char *(*attr_string)(const om_node *n, const char *name, const char *dflt);
    int (*attr_ints)(const om_node *n, const char *name, const int64_t **vals);
    int (*attr_strings)(const om_node *n, const char *name, const char *const **vals);   /* ABI 3: RNN's activations */
    /* ABI 4: 1 when attention must take the cuBLAS path with materialized scores (om_options.cuda_attention,
     * ORTMOD_CUDA_ATTENTION); asked per call, so a process can compare the two paths */
    int (*attention_materialized)(void);
} om_cuda_host;

typedef struct om_cuda_exec {
    int device;
    void *stream;                 /* cudaStream_t: the caller's stream (0 = legacy default) */
    void *cublas;                 /* cublasHandle_t bound to stream by the provider */
    void *cublaslt;               /* cublasLtHandle_t */
    void *workspace;              /* for cublasLt; workspace_size bytes */
    size_t workspace_size;
    const void *const *in_host;   /* per input: host data known at plan time, or NULL */
} om_cuda_exec;

typedef om_status *(*om_cuda_kernel_fn)(const om_kernel_ctx *ctx, const om_cuda_exec *x);

typedef enum om_cuda_copy { OM_COPY_H2D = 0, OM_COPY_D2H = 1, OM_COPY_D2D = 2 } om_cuda_copy;

/* om_adam_consts (an Adam step's constants) is in exec/optim_provider.h, included above. */

typedef struct om_cuda_provider {
    int abi;
    /* Once per process; host is copied. Fails when no device or driver is usable. */
    om_status *(*init)(const om_cuda_host *host);
    /* Stream-ordered memory from a caching pool per device (cudaMallocFromPoolAsync on stream). */
    om_status *(*alloc)(int device, size_t nbytes, void *stream, void **out);
    void (*free)(int device, void *p, void *stream);
    /* Plan-lifetime memory (arena, uploaded constants): plain device allocations, synchronous. */
    om_status *(*alloc_static)(int device, size_t nbytes, void **out);
    void (*free_static)(int device, void *p);
    om_status *(*memcpy_async)(int device, void *dst, const void *src, size_t nbytes, om_cuda_copy kind, void *stream);
    om_status *(*memset_async)(int device, void *dst, int value, size_t nbytes, void *stream);
    /* Blocking copy (plan time only: uploading constants). */
    om_status *(*memcpy_sync)(int device, void *dst, const void *src, size_t nbytes, om_cuda_copy kind);
    /* Fills x's handles and workspace for (device, stream). */
    om_status *(*exec_for)(int device, void *stream, om_cuda_exec *x);
    /* The kernel of an op (name and domain as in the op table), or NULL. */
    om_cuda_kernel_fn (*find_kernel)(const char *name, const char *domain);
    /* Names of every op that has a kernel, NULL-terminated (for tests and docs). */
    const char *const *(*kernel_names)(void);
    /* The optimizer passes of csrc/optim over n tensors of one device (ortmod.optim's
     * FusedAdam and FP16_Optimizer on CUDA parameters), enqueued on stream: an Adam step
     * (params f32/f16/bf16, grads any of those, moments f32), dst = src * factor (dst may be
     * src), and the gradients' inf/NaN check with their sum of squares (fp64), which reads its
     * two results back: the one call here that waits for the device. */
    om_status *(*adam_step)(int device, void *stream, const om_adam_consts *c, int n, om_tensor *params,
                            const om_tensor *grads, om_tensor *exp_avg, om_tensor *exp_avg_sq);
    om_status *(*grads_copy_scaled)(int device, void *stream, int n, const om_tensor *src, om_tensor *dst,
                                    float factor);
    om_status *(*grads_check_and_norm)(int device, void *stream, int n, const om_tensor *grads, int *found_inf,
                                       double *sq_sum);
} om_cuda_provider;

typedef const om_cuda_provider *(*om_cuda_provider_get_fn)(void);

#ifdef __cplusplus
}
#endif
#endif
