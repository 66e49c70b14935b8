// selftest.cu — kernels that prove the CUDA emulator's checks fire (compiled into the emulated
// provider next to cuda/*.cu; tests/cuda_emu/harness.py calls emu_selftest and emu_convert
// through ctypes). Each broken kernel has one GPU bug the emulator claims to catch; the correct
// one uses barriers and shuffles and must give the right answer, so a checker that rejects
// everything fails too.
#include <cuda_runtime.h>
#include <mma.h>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

using namespace nvcuda;

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

// ---- wmma (mma.h) -------------------------------------------------------------------------------

// One warp, tile by tile: D (32 x 32) = 2 (A (32 x 48) B (48 x 32) + C0), A and B in the layouts
// LA / LB (row-major A: lda 48, column-major: 32; row-major B: ldb 32, column-major: 48), C0 and
// D row- or column-major (acc_col, ld 32); no C0: the accumulator starts from fill_fragment(0).
// A's tiles go through __shared__ memory (__align__(32)), B's are read from device memory.
// rowsum (32 x 16, row-major): A's row sums in every column (A times a fill_fragment(1) matrix_b).
template <typename T, typename LA, typename LB>
__global__ void wmma_gemm(const T *A, const T *B, const float *C0, float *D, float *rowsum, int acc_col) {
    __shared__ __align__(32) T a_tile[16 * 16];
    // (g++ happens to align a static array this large to 32 bytes anyway: that __align__ is
    // honoured shows in the declared alignment)
    static_assert(__alignof__(a_tile) == 32, "__align__(32) must align a __shared__ array");
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    const unsigned lda = a_row ? 48 : 32, ldb = b_row ? 32 : 48;
    int lane = threadIdx.x;
    wmma::layout_t acc_layout = acc_col ? wmma::mem_col_major : wmma::mem_row_major;
    for (int ti = 0; ti < 2; ti++)
        for (int tj = 0; tj < 2; tj++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            size_t at = acc_col ? (size_t)tj * 16 * 32 + ti * 16 : (size_t)ti * 16 * 32 + tj * 16;
            if (C0) wmma::load_matrix_sync(acc, C0 + at, 32, acc_layout);
            else wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < 3; kk++) {
                const T *a_src = a_row ? A + ti * 16 * 48 + kk * 16 : A + kk * 16 * 32 + ti * 16;
                for (int e = lane; e < 256; e += 32) a_tile[e] = a_src[(e / 16) * lda + e % 16];   // same layout, ld 16
                __syncwarp();
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
                wmma::load_matrix_sync(a, a_tile, 16);
                wmma::load_matrix_sync(b, b_row ? B + kk * 16 * 32 + tj * 16 : B + tj * 16 * 48 + kk * 16, ldb);
                wmma::mma_sync(acc, a, b, acc);
                __syncwarp();   // before the next a_tile
            }
            for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= 2.0f;   // the same on every lane
            wmma::store_matrix_sync(D + at, acc, 32, acc_layout);
        }
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> ones;
    wmma::fill_fragment(ones, 1.0f);
    for (int ti = 0; ti < 2; ti++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < 3; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
            wmma::load_matrix_sync(a, a_row ? A + ti * 16 * 48 + kk * 16 : A + kk * 16 * 32 + ti * 16, lda);
            wmma::mma_sync(acc, a, ones, acc);
        }
        wmma::store_matrix_sync(rowsum + ti * 16 * 16, acc, 16, wmma::mem_row_major);
    }
}

template <typename T>
static int launch_wmma_gemm(int layouts, const void *A, const void *B, const float *C0, float *D, float *rowsum,
                            int acc_col) {
    const T *a = (const T *)A, *b = (const T *)B;
    switch (layouts) {
    case 0: wmma_gemm<T, wmma::row_major, wmma::col_major><<<1, 32>>>(a, b, C0, D, rowsum, acc_col); break;
    case 1: wmma_gemm<T, wmma::col_major, wmma::col_major><<<1, 32>>>(a, b, C0, D, rowsum, acc_col); break;
    case 2: wmma_gemm<T, wmma::row_major, wmma::row_major><<<1, 32>>>(a, b, C0, D, rowsum, acc_col); break;
    default: wmma_gemm<T, wmma::col_major, wmma::row_major><<<1, 32>>>(a, b, C0, D, rowsum, acc_col); break;
    }
    return cudaGetLastError();
}

// Device memory whose address is 16 (mod 32) on the host, as the emulator may hand out (it
// aligns allocations to 16 bytes only): wmma's alignment check must go by the offset in the
// allocation, which a GPU aligns to 256 bytes. NULL if the address is not so.
static void *malloc_16_mod_32(size_t n) {
    void *p = NULL;
    cudaMalloc(&p, (n + 31) / 32 * 32 + 16);   // the emulator puts the end of an allocation at a page end
    if ((uintptr_t)p % 32 != 16) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

// The correct wmma kernel on host arrays: kind 0 fp16, 1 bf16 (a and b: 16-bit patterns);
// layouts bit 0: A column-major, bit 1: B row-major, bit 2: C0 and D column-major in device
// memory. a: 32 x 48 row-major, b: 48 x 32 column-major (b[j * 48 + k] = B(k, j)), c: 32 x 32
// row-major or NULL; d (32 x 32) and rowsum (32 x 16) row-major. Returns the launch's error, -3
// if device memory did not come 16 (mod 32).
EMU_EXPORT int emu_selftest_wmma(int kind, int layouts, const unsigned short *a, const unsigned short *b,
                                 const float *c, float *d, float *rowsum) {
    bool a_col = layouts & 1, b_row = layouts & 2, acc_col = layouts & 4;
    static unsigned short ha[32 * 48], hb[48 * 32];
    static float hc[32 * 32], hd[32 * 32];
    for (int i = 0; i < 32; i++)
        for (int k = 0; k < 48; k++) ha[a_col ? k * 32 + i : i * 48 + k] = a[i * 48 + k];
    for (int k = 0; k < 48; k++)
        for (int j = 0; j < 32; j++) hb[b_row ? k * 32 + j : j * 48 + k] = b[j * 48 + k];
    if (c)
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < 32; j++) hc[acc_col ? j * 32 + i : i * 32 + j] = c[i * 32 + j];
    void *dA = malloc_16_mod_32(sizeof ha), *dB = malloc_16_mod_32(sizeof hb);
    float *dC = (float *)malloc_16_mod_32(sizeof hc), *dD = (float *)malloc_16_mod_32(sizeof hd);
    float *dR = (float *)malloc_16_mod_32(32 * 16 * sizeof(float));
    int rc = -3;
    if (dA && dB && dC && dD && dR) {
        cudaMemcpy(dA, ha, sizeof ha, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, hb, sizeof hb, cudaMemcpyHostToDevice);
        cudaMemcpy(dC, hc, sizeof hc, cudaMemcpyHostToDevice);
        rc = kind ? launch_wmma_gemm<__nv_bfloat16>(layouts & 3, dA, dB, c ? dC : NULL, dD, dR, acc_col)
                  : launch_wmma_gemm<__half>(layouts & 3, dA, dB, c ? dC : NULL, dD, dR, acc_col);
        cudaMemcpy(hd, dD, sizeof hd, cudaMemcpyDeviceToHost);
        cudaMemcpy(rowsum, dR, 32 * 16 * sizeof(float), cudaMemcpyDeviceToHost);
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < 32; j++) d[i * 32 + j] = hd[acc_col ? j * 32 + i : i * 32 + j];
    }
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dD);
    cudaFree(dR);
    return rc;
}

// One wmma bug each (h: device memory of at least 512 __half values, out: 256 floats):
// 0: a pointer 16 bytes off 32-byte alignment   1: ldm 20 for 16-bit elements (not a multiple of 8)
// 2: half the warp calls load_matrix_sync (the other half returns)
// 3: half the warp calls it while the other half is at a __syncwarp
// 4: a lane-dependent element-wise operation on a fragment, then store_matrix_sync
// 5: a __shared__ pointer off 32-byte alignment   6: called by a warp of 16 lanes (a block of 16)
__global__ void wmma_broken(const __half *h, float *out, int which) {
    __shared__ __align__(32) float s[16 * 16 + 8];
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 1.0f);
    int lane = threadIdx.x & 31;
    switch (which) {
    case 0: wmma::load_matrix_sync(a, h + 8, 16); break;
    case 1: wmma::load_matrix_sync(a, h, 20); break;
    case 2:
        if (lane < 16) wmma::load_matrix_sync(a, h, 16);
        break;
    case 3:
        if (lane < 16) wmma::load_matrix_sync(a, h, 16);
        else __syncwarp();
        break;
    case 4:
        acc.x[0] = (float)lane;
        wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
        break;
    case 5: wmma::store_matrix_sync(s + 4, acc, 16, wmma::mem_row_major); break;
    default: wmma::load_matrix_sync(a, h, 16); break;
    }
}

// Runs broken kernel `which`; returns the error the launch (or the copy) reported, 0 if none.
// 0: a correct reduction (returns 0 and the right sum, or -1 for a wrong sum)
// 1: write one past the end   2: barrier after an early return   3: full mask in a partial warp
// 4: read freed memory        5: a copy running past the end of an allocation
// 6/7: how many threads read a stale value without / with the barrier (not an error: a race)
// 8..14: wmma_broken's bug which - 8 (8: misaligned pointer, 9: bad ldm, 10: half the warp
// returns, 11: half the warp at a __syncwarp, 12: lane-dependent fragment, 13: misaligned
// __shared__ pointer, 14: a warp of 16 lanes)
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
    case 8: case 9: case 10: case 11: case 12: case 13: case 14:
        wmma_broken<<<1, which == 14 ? 16 : 32>>>((const __half *)a, a + 256, which - 8);
        rc = cudaGetLastError();
        break;
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
