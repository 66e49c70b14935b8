// provider.cu — the CUDA execution provider's entry point: om_cuda_provider_get() and the
// vtable behind it (device memory, copies, cuBLAS handles, the kernel registry).
//
// Memory: run-time buffers (outputs, gradients, the stash) come from one cudaMemPool per
// device with an unlimited release threshold, so freed blocks are cached and reused in stream
// order (cudaMallocFromPoolAsync / cudaFreeAsync: no host synchronization). Plan-lifetime
// buffers (uploaded constants) are plain cudaMalloc'd at plan time.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <pthread.h>
#include <stdio.h>

#include "common.cuh"

om_cuda_host g_host;

#define MAX_DEVICES 64
#define LT_WORKSPACE (32u << 20)

struct device_state {
    int ready;
    cudaMemPool_t pool;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace;
};
static device_state devices[MAX_DEVICES];
// calls that block the host: every cudaMalloc, cudaFree, cudaMemcpy and handle creation the
// provider makes (plan time and a device's first use only). The GPU benchmark reports it per
// step; the CPU emulator counts the same calls independently and checks the two agree
// (tests/cuda_emu/models.py), so nothing blocking goes uncounted here.
static uint64_t sync_calls;
static void count_blocking_call(void) { __atomic_add_fetch(&sync_calls, 1, __ATOMIC_RELAXED); }
static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;

static om_status *device_ready(int dev, device_state **out) {
    if (dev < 0 || dev >= MAX_DEVICES) return OMC_ERR(OM_INVALID_ARGUMENT, "CUDA device %d is out of range", dev);
    device_state *d = &devices[dev];
    *out = d;
    if (__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE)) return NULL;
    pthread_mutex_lock(&devices_lock);
    om_status *st = NULL;
    if (!d->ready) {
        int prev = 0;
        cudaGetDevice(&prev);
        st = omc_cuda(cudaSetDevice(dev), "cudaSetDevice");
        if (!st) {
            cudaMemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = cudaMemAllocationTypePinned;
            props.handleTypes = cudaMemHandleTypeNone;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = dev;
            st = omc_cuda(cudaMemPoolCreate(&d->pool, &props), "cudaMemPoolCreate");
        }
        if (!st) {
            uint64_t keep = UINT64_MAX;   // cache everything: the pool never returns memory on its own
            st = omc_cuda(cudaMemPoolSetAttribute(d->pool, cudaMemPoolAttrReleaseThreshold, &keep),
                          "cudaMemPoolSetAttribute");
        }
        if (!st) {   // the handles allocate device memory: counted as blocking
            count_blocking_call();
            if (cublasCreate(&d->blas) != CUBLAS_STATUS_SUCCESS)
                st = OMC_ERR(OM_RUNTIME, "cublasCreate failed on CUDA device %d", dev);
        }
        if (!st) {
            count_blocking_call();
            if (cublasLtCreate(&d->lt) != CUBLAS_STATUS_SUCCESS)
                st = OMC_ERR(OM_RUNTIME, "cublasLtCreate failed on CUDA device %d", dev);
        }
        if (!st) {
            count_blocking_call();
            st = omc_cuda(cudaMalloc(&d->workspace, LT_WORKSPACE), "cudaMalloc (cuBLASLt workspace)");
        }
        if (!st) __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
        cudaSetDevice(prev);
    }
    pthread_mutex_unlock(&devices_lock);
    return st;
}

// Runs with dev current, restoring the caller's device (torch keeps its own current device).
struct device_guard {
    int prev, changed;
    explicit device_guard(int dev) : prev(0), changed(0) {
        cudaGetDevice(&prev);
        if (prev != dev) { cudaSetDevice(dev); changed = 1; }
    }
    ~device_guard() { if (changed) cudaSetDevice(prev); }
};

static om_status *p_init(const om_cuda_host *host) {
    g_host = *host;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return OMC_ERR(OM_RUNTIME, "no usable CUDA driver or device: %s", cudaGetErrorString(e));
    if (n == 0) return OMC_ERR(OM_RUNTIME, "no CUDA device");
    return NULL;
}

static om_status *p_alloc(int dev, size_t n, void *stream, void **out) {
    device_state *d;
    OMC_TRY(device_ready(dev, &d));
    device_guard gd(dev);
    cudaError_t e = cudaMallocFromPoolAsync(out, n ? n : 1, d->pool, (cudaStream_t)stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return OMC_ERR(e == cudaErrorMemoryAllocation ? OM_OUT_OF_MEMORY : OM_RUNTIME,
                       "CUDA allocation of %zu bytes on device %d failed: %s", n, dev, cudaGetErrorString(e));
    }
    return NULL;
}

static void p_free(int dev, void *p, void *stream) {
    if (!p) return;
    device_guard gd(dev);
    if (cudaFreeAsync(p, (cudaStream_t)stream) != cudaSuccess) cudaGetLastError();   // e.g. at process exit
}

static om_status *p_alloc_static(int dev, size_t n, void **out) {
    device_state *d;
    OMC_TRY(device_ready(dev, &d));
    device_guard gd(dev);
    count_blocking_call();
    cudaError_t e = cudaMalloc(out, n ? n : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return OMC_ERR(e == cudaErrorMemoryAllocation ? OM_OUT_OF_MEMORY : OM_RUNTIME,
                       "CUDA allocation of %zu bytes on device %d failed: %s", n, dev, cudaGetErrorString(e));
    }
    return NULL;
}

static void p_free_static(int dev, void *p) {
    if (!p) return;
    device_guard gd(dev);
    count_blocking_call();
    if (cudaFree(p) != cudaSuccess) cudaGetLastError();
}

static cudaMemcpyKind kind_of(om_cuda_copy k) {
    return k == OM_COPY_H2D ? cudaMemcpyHostToDevice : k == OM_COPY_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

static om_status *p_memcpy_async(int dev, void *dst, const void *src, size_t n, om_cuda_copy kind, void *stream) {
    if (!n) return NULL;
    device_guard gd(dev);
    return omc_cuda(cudaMemcpyAsync(dst, src, n, kind_of(kind), (cudaStream_t)stream), "cudaMemcpyAsync");
}

static om_status *p_memset_async(int dev, void *dst, int v, size_t n, void *stream) {
    if (!n) return NULL;
    device_guard gd(dev);
    return omc_cuda(cudaMemsetAsync(dst, v, n, (cudaStream_t)stream), "cudaMemsetAsync");
}

static om_status *p_memcpy_sync(int dev, void *dst, const void *src, size_t n, om_cuda_copy kind) {
    if (!n) return NULL;
    device_guard gd(dev);
    count_blocking_call();
    return omc_cuda(cudaMemcpy(dst, src, n, kind_of(kind)), "cudaMemcpy");
}

static om_status *p_exec_for(int dev, void *stream, om_cuda_exec *x) {
    device_state *d;
    OMC_TRY(device_ready(dev, &d));
    // kernels launch on the current device: the engine runs with dev current for the program
    int cur = 0;
    cudaGetDevice(&cur);
    if (cur != dev) OMC_TRY(omc_cuda(cudaSetDevice(dev), "cudaSetDevice"));
    if (cublasSetStream(d->blas, (cudaStream_t)stream) != CUBLAS_STATUS_SUCCESS)
        return OMC_ERR(OM_RUNTIME, "cublasSetStream failed");
    x->device = dev;
    x->stream = stream;
    x->cublas = d->blas;
    x->cublaslt = d->lt;
    x->workspace = d->workspace;
    x->workspace_size = LT_WORKSPACE;
    return NULL;
}

void omc_count_blocking_call(void) { count_blocking_call(); }

// ---- the optimizer passes (optim.cu), with the caller's current device restored after --------

static om_status *p_adam_step(int dev, void *stream, const om_adam_consts *c, int n, om_tensor *params,
                              const om_tensor *grads, om_tensor *exp_avg, om_tensor *exp_avg_sq) {
    device_state *d;
    OMC_TRY(device_ready(dev, &d));   // (the pool for temporaries; the passes use no cuBLAS)
    device_guard gd(dev);
    return omc_adam_step(dev, stream, c, n, params, grads, exp_avg, exp_avg_sq);
}
static om_status *p_grads_copy_scaled(int dev, void *stream, int n, const om_tensor *src, om_tensor *dst,
                                      float factor) {
    device_state *d;
    OMC_TRY(device_ready(dev, &d));
    device_guard gd(dev);
    return omc_grads_copy_scaled(dev, stream, n, src, dst, factor);
}
static om_status *p_grads_check_and_norm(int dev, void *stream, int n, const om_tensor *grads, int *found_inf,
                                         double *sq_sum) {
    device_state *d;
    OMC_TRY(device_ready(dev, &d));
    device_guard gd(dev);
    return omc_grads_check_and_norm(dev, stream, n, grads, found_inf, sq_sum);
}

// ---- temporary device memory for kernels (common.cuh): the run's pool, ordered on its stream ----

om_status *omc_temp_alloc(const om_cuda_exec *x, size_t n, void **out) { return p_alloc(x->device, n, x->stream, out); }
void omc_temp_free(const om_cuda_exec *x, void *p) { p_free(x->device, p, x->stream); }

// ---- broadcast plans (common.cuh) ------------------------------------------------------------

int bcast_init(bcast *b, const om_tensor *space, const om_tensor *const *ops, int n_ops) {
    int r = space->rank;
    int64_t str[OMC_MAX_OPS][OM_MAX_RANK];
    for (int k = 0; k < n_ops; k++) {
        const om_tensor *t = ops[k];
        if (t->rank > r) return -1;
        int64_t s = 1;
        for (int d = r - 1; d >= 0; d--) {
            int j = d - (r - t->rank);
            int64_t td = j >= 0 ? t->dims[j] : 1;
            if (td != space->dims[d] && td != 1) return -1;
            str[k][d] = td == 1 ? 0 : s;
            s *= td;
        }
    }
    // drop size-1 dims, merge a dim into the next inner one when every operand allows it
    memset(b, 0, sizeof *b);
    int n = 0;
    for (int d = 0; d < r; d++) {
        if (space->dims[d] == 1) continue;
        if (n > 0) {
            int merge = 1;
            for (int k = 0; k < n_ops && merge; k++)
                merge = str[k][d - 0] * space->dims[d] == b->str[k][n - 1] ||
                        (str[k][d] == 0 && b->str[k][n - 1] == 0);
            if (merge) {
                // outer dim (n-1) and this one become one dim of the product size
                b->dims[n - 1] *= space->dims[d];
                for (int k = 0; k < n_ops; k++) b->str[k][n - 1] = str[k][d];
                continue;
            }
        }
        b->dims[n] = space->dims[d];
        for (int k = 0; k < n_ops; k++) b->str[k][n] = str[k][d];
        n++;
    }
    b->rank = n;
    for (int k = 0; k < n_ops; k++) {
        int64_t s = 1;
        int c = 1;
        for (int d = n - 1; d >= 0; d--) {
            if (b->str[k][d] != s) c = 0;
            s *= b->dims[d];
        }
        b->contiguous[k] = c;
    }
    return 0;
}

// ---- the kernel registry -----------------------------------------------------------------------
// Expanded from the engine's op list (csrc/ops/op_list.h): every OP there names its kernel, a
// function of cuda/<family>.cu declared here, so a missing one is an undefined symbol and the
// library (linked --no-undefined) does not build. HOST_OPs have no kernel, by design.
#include "ops/op_list.h"

#define OMC_KERNEL_DECLARE(sym, name, domain, fn) om_status *fn(const om_kernel_ctx *ctx, const om_cuda_exec *x);
#define OMC_NO_KERNEL(sym, name, domain, why)
OM_OP_LIST(OMC_KERNEL_DECLARE, OMC_NO_KERNEL)

struct omc_kernel_entry {
    const char *name;
    const char *domain;
    om_cuda_kernel_fn fn;
};
#define OMC_KERNEL_ENTRY(sym, name, domain, fn) {name, domain, fn},
static const omc_kernel_entry kernels[] = {OM_OP_LIST(OMC_KERNEL_ENTRY, OMC_NO_KERNEL)};

static om_cuda_kernel_fn p_find_kernel(const char *name, const char *domain) {
    if (!domain) domain = "";
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (!strcmp(kernels[i].name, name) && !strcmp(kernels[i].domain, domain)) return kernels[i].fn;
    return NULL;
}

#define OMC_KERNEL_NAME(sym, name, domain, fn) name,
static const char *const kernel_names[] = {OM_OP_LIST(OMC_KERNEL_NAME, OMC_NO_KERNEL) NULL};
static const char *const *p_kernel_names(void) { return kernel_names; }

static const om_cuda_provider provider = {
    OM_CUDA_ABI, p_init, p_alloc, p_free, p_alloc_static, p_free_static, p_memcpy_async, p_memset_async,
    p_memcpy_sync, p_exec_for, p_find_kernel, p_kernel_names, p_adam_step, p_grads_copy_scaled,
    p_grads_check_and_norm,
};

extern "C" __attribute__((visibility("default"))) const om_cuda_provider *om_cuda_provider_get(void) {
    return &provider;
}

// How many host-blocking CUDA calls the provider made so far (see sync_calls).
extern "C" __attribute__((visibility("default"))) uint64_t om_cuda_sync_count(void) {
    return __atomic_load_n(&sync_calls, __ATOMIC_RELAXED);
}
