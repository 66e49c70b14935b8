// selftest.cu — kernels that prove the CUDA emulator's checks fire (compiled into the emulated
// provider next to cuda/*.cu; tests/cuda_emu/harness.py calls emu_selftest and emu_convert
// through ctypes). Each broken kernel has one GPU bug the emulator claims to catch; the correct
// one uses barriers and shuffles and must give the right answer, so a checker that rejects
// everything fails too.
#include <cuda_runtime.h>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

// one element past the end of n
__global__ void write_one_past_the_end(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) p[i] = 1.0f;
}

// half the block returns before a barrier the other half waits at
__global__ void barrier_after_early_return(float *p) {
    if (threadIdx.x >= 16) return;
    __syncthreads();
    p[threadIdx.x] = 0.0f;
}

// launched with 48 threads: the second warp has 16 lanes, the full mask names 16 more
__global__ void full_mask_in_a_partial_warp(float *p) {
    float v = __shfl_xor_sync(0xffffffffu, p[threadIdx.x], 1);
    p[threadIdx.x] = v;
}

__global__ void read_one(const float *p, float *out) { out[threadIdx.x] = p[threadIdx.x]; }

// out[0] = sum of x (n), with barriers, shared memory and shuffles; one block per 256 values
__global__ void block_sums(const float *x, float *partial, int n) {
    __shared__ float warp_sums[8];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) partial[blockIdx.x] = s;
    }
}

// out[t] = thread t-1's value, passed through shared memory; with_barrier 0 omits the
// __syncthreads between the write and the read: threads run in index order would still see
// the values (each reads a lower index, already written), a GPU need not
__global__ void read_left_neighbour(int *out, int base, int with_barrier) {
    __shared__ int slot[64];
    int t = threadIdx.x;
    slot[t] = base + t;
    if (with_barrier) __syncthreads();
    out[t] = t ? slot[t - 1] : base - 1;
}

// Threads of 64 that read a stale neighbour value (0 with the barrier).
static int stale_reads(int with_barrier) {
    static int base = 1000;
    base += 1000;   // what a previous launch left in shared memory never matches
    int *d = NULL, host[64];
    cudaMalloc((void **)&d, sizeof host);
    read_left_neighbour<<<1, 64>>>(d, base, with_barrier);
    int rc = cudaGetLastError();
    cudaMemcpy(host, d, sizeof host, cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (rc) return -1;
    int stale = 0;
    for (int t = 0; t < 64; t++) stale += host[t] != base + t - 1;
    return stale;
}

// Runs broken kernel `which`; returns the error the launch (or the copy) reported, 0 if none.
// 0: a correct reduction (returns 0 and the right sum, or -1 for a wrong sum)
// 1: write one past the end   2: barrier after an early return   3: full mask in a partial warp
// 4: read freed memory        5: a copy running past the end of an allocation
// 6/7: how many threads read a stale value without / with the barrier (not an error: a race)
EMU_EXPORT int emu_selftest(int which) {
    float *a = NULL, *b = NULL;
    cudaMalloc((void **)&a, 1000 * sizeof(float));
    cudaMalloc((void **)&b, 64 * sizeof(float));
    cudaGetLastError();
    int rc = 0;
    switch (which) {
    case 0: {
        float host[1000], partial[4], sum = 0;
        for (int i = 0; i < 1000; i++) host[i] = (float)(i % 7) - 3.0f;
        cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice);
        block_sums<<<4, 256>>>(a, b, 1000);
        rc = cudaGetLastError();
        cudaMemcpy(partial, b, sizeof partial, cudaMemcpyDeviceToHost);
        for (int k = 0; k < 4; k++) sum += partial[k];
        float want = 0;
        for (int i = 0; i < 1000; i++) want += host[i];
        if (!rc && sum != want) rc = -1;
        break;
    }
    case 1: write_one_past_the_end<<<4, 256>>>(a, 1000); rc = cudaGetLastError(); break;
    case 2: barrier_after_early_return<<<1, 32>>>(b); rc = cudaGetLastError(); break;
    case 3: full_mask_in_a_partial_warp<<<1, 48>>>(b); rc = cudaGetLastError(); break;
    case 4:
        cudaFree(a);
        read_one<<<1, 32>>>(a, b);
        a = NULL;
        rc = cudaGetLastError();
        break;
    case 5: rc = cudaMemcpy(b, a, 65 * sizeof(float), cudaMemcpyDeviceToDevice); cudaGetLastError(); break;
    case 6: rc = stale_reads(0); break;
    case 7: rc = stale_reads(1); break;
    default: rc = -2;
    }
    cudaFree(a);
    cudaFree(b);
    return rc;
}

// The half-type conversions the kernels use, for checking against numpy/torch:
// 0: fp16 bits -> float   1: float -> fp16 bits   2: bf16 bits -> float   3: float -> bf16 bits
// 4: double -> fp16 bits  5: double -> bf16 bits  6: fp16 a + b (pairs of bits) -> fp16 bits
EMU_EXPORT void emu_convert(int kind, const void *in, void *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (kind) {
        case 0: ((float *)out)[i] = __half2float(__ushort_as_half(((const unsigned short *)in)[i])); break;
        case 1: ((unsigned short *)out)[i] = __half_as_ushort(__float2half_rn(((const float *)in)[i])); break;
        case 2: ((float *)out)[i] = __bfloat162float(__ushort_as_bfloat16(((const unsigned short *)in)[i])); break;
        case 3: ((unsigned short *)out)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(((const float *)in)[i])); break;
        case 4: ((unsigned short *)out)[i] = __half_as_ushort(__double2half(((const double *)in)[i])); break;
        case 5: ((unsigned short *)out)[i] = __bfloat16_as_ushort(__double2bfloat16(((const double *)in)[i])); break;
        case 6: {
            const unsigned short *p = (const unsigned short *)in + 2 * i;
            ((unsigned short *)out)[i] = __half_as_ushort(__ushort_as_half(p[0]) + __ushort_as_half(p[1]));
            break;
        }
        }
    }
}
