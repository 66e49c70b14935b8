// emu.h — the CUDA execution model on the CPU, force-included (g++ -include) before every
// cuda/*.cu file that tests/cuda_emu/build.py compiles as C++. Part of the CUDA emulator that
// runs the real CUDA provider on a machine without a GPU (tests/test_cuda_emulated.py).
//
// What a kernel sees: threadIdx/blockIdx/blockDim/gridDim, __syncthreads, the warp shuffles,
// atomics and __shared__ memory. A launch `k<<<grid, block, shmem, stream>>>(args)` is rewritten
// by preprocess.py into emu_launch("k", grid, block, shmem, stream, [=] { k(args); }); emu.cpp
// runs its blocks one after another (in a shuffled order) and each block's threads as fibers
// on the launching thread, switching at every barrier or shuffle (in a shuffled order too), so
// __syncthreads and the *_sync shuffles are real rendezvous, checked for what a GPU leaves
// undefined (a barrier some threads never reach, a shuffle mask naming a lane that is absent).
//
// Limits (see also emu.cpp): threads of a block run one at a time between synchronization
// points, so a data race shows only when the shuffled order happens to expose it; blocks never
// run concurrently; __shared__ variables are function statics (they keep the previous block's
// values instead of being undefined); host math (expf, erff, ...) and no FMA contraction
// instead of CUDA's libdevice and nvcc's fused multiply-adds (results differ by ulps).
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
using std::max;
using std::min;

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) uint4 {   // CUDA's 16-byte vector (one 128-bit load or store)
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
// Set by the scheduler before it switches to a thread (all fibers of a launch run on the
// host thread that launched it).
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
static const int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict
// (GCC's attribute, not alignas: it may stand anywhere among the decl-specifiers, as CUDA's
// `__shared__ __align__(32) T buf[n]` or `struct __align__(16) S` put it)
#define __align__(n) __attribute__((aligned(n)))

typedef struct emu_stream *cudaStream_t;

// Runs body(arg) as every thread of every block of the grid; errors (a bad configuration, a
// deadlocked barrier, an invalid memory access) become cudaGetLastError()'s.
void emu_launch_impl(const char *kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                     void (*body)(void *), void *arg);
template <class F>
inline void emu_launch(const char *kernel, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, F f) {
    emu_launch_impl(kernel, grid, block, shmem, stream, [](void *p) { (*(F *)p)(); }, &f);
}

// ---- synchronization within a block ------------------------------------------------------------
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);

// ---- for the shim headers' device functions (mma.h) ---------------------------------------------
// Fails the running launch the way an invalid memory access does (cudaGetLastError reports it,
// with the kernel, block and thread prepended); never returns. Only inside a kernel.
[[noreturn]] void emu_kernel_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The address p would have on a GPU, as far as its alignment goes (the low 8 bits): for device
// memory its offset in its allocation (cudaMalloc aligns to 256 bytes, the emulator only to 16,
// so that reads past the end hit the guard page), anything else (__shared__ statics, locals)
// as it is.
uintptr_t emu_gpu_address(const void *p);
// The calling thread's warp's 32 slots, one per lane (index: lane), where a warp-collective
// call can publish a pointer for the other lanes to read between two __syncwarp()s. NULL at
// the start of every block; whoever sets a slot clears it again.
const void **emu_warp_slots();

// One exchange among the lanes of mask: publishes n bytes of v, waits for every lane of mask,
// then copies lane src's bytes into out (a lane that is not in mask is an error).
void emu_shfl(unsigned mask, const void *v, void *out, size_t n, int src);
int emu_lane();

// Shuffles with CUDA's width rule: lanes form groups of width; a source outside the caller's
// group (up/down past its edge) reads the caller's own value.
template <typename T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    int lane = emu_lane(), base = lane & ~(width - 1);
    T r;
    emu_shfl(mask, &v, &r, sizeof v, base + (src & (width - 1)));
    return r;
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    int lane = emu_lane(), src = lane ^ m, base = lane & ~(width - 1);
    T r;
    emu_shfl(mask, &v, &r, sizeof v, src >= base + width ? lane : src);
    return r;
}
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    int lane = emu_lane(), src = lane - (int)d, base = lane & ~(width - 1);
    T r;
    emu_shfl(mask, &v, &r, sizeof v, src < base ? lane : src);
    return r;
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    int lane = emu_lane(), src = lane + (int)d, base = lane & ~(width - 1);
    T r;
    emu_shfl(mask, &v, &r, sizeof v, src >= base + width ? lane : src);
    return r;
}

// ---- atomics: fibers of one launch never preempt each other, and launches on different host
// threads are serialized by emu.cpp, so a plain read-modify-write is atomic here. Only the
// overloads CUDA has (no generic template: what nvcc rejects should not compile here either).
#define EMU_ATOMIC(T, name, expr)      \
    inline T name(T *p, T v) {         \
        T old = *p;                    \
        *p = (expr);                   \
        return old;                    \
    }
EMU_ATOMIC(int, atomicAdd, old + v)
EMU_ATOMIC(unsigned, atomicAdd, old + v)
EMU_ATOMIC(unsigned long long, atomicAdd, old + v)
EMU_ATOMIC(float, atomicAdd, old + v)
EMU_ATOMIC(double, atomicAdd, old + v)
EMU_ATOMIC(int, atomicMax, v > old ? v : old)
EMU_ATOMIC(unsigned, atomicMax, v > old ? v : old)
EMU_ATOMIC(long long, atomicMax, v > old ? v : old)
EMU_ATOMIC(unsigned long long, atomicMax, v > old ? v : old)
EMU_ATOMIC(int, atomicMin, v < old ? v : old)
EMU_ATOMIC(unsigned, atomicMin, v < old ? v : old)
EMU_ATOMIC(long long, atomicMin, v < old ? v : old)
EMU_ATOMIC(unsigned long long, atomicMin, v < old ? v : old)
EMU_ATOMIC(int, atomicExch, v)
EMU_ATOMIC(unsigned, atomicExch, v)
EMU_ATOMIC(unsigned long long, atomicExch, v)
EMU_ATOMIC(float, atomicExch, v)
#undef EMU_ATOMIC
inline int atomicCAS(int *p, int cmp, int v) { int old = *p; if (old == cmp) *p = v; return old; }
inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v) { unsigned old = *p; if (old == cmp) *p = v; return old; }
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long v) {
    unsigned long long old = *p;
    if (old == cmp) *p = v;
    return old;
}
