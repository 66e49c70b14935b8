// mma.h — CUDA's warp matrix functions (nvcuda::wmma) for the CUDA emulator (tests/cuda_emu),
// so that a cuda/*.cu kernel using tensor cores compiles and runs as nvcc makes it run. The
// subset: the 16x16x16 shape; matrix_a / matrix_b fragments of __half or __nv_bfloat16, row- or
// column-major; float accumulators; fill_fragment, load_matrix_sync, store_matrix_sync and
// mma_sync. Anything else fails to compile (a static_assert or no matching overload), as the
// combinations nvcc has no overload for do.
//
// The model: which lane holds which elements of a fragment is unspecified in CUDA, so here every
// lane holds the whole 16x16 tile (num_elements is 256, not a GPU's 8 per lane; x[i] is element
// (i / 16, i % 16) of the tile, but code may only touch all x[i], i < num_elements, the same way
// on every lane). A fragment starts as NaNs (0xff bytes), as uninitialised memory does here.
// mma_sync multiplies in float and sums in float (a tensor core's fp32 accumulation; products of
// two 16-bit values are exact in float, the order of the sums is the only difference).
//
// Every *_sync call is warp-collective and checked as on a GPU it is undefined not to be:
//  - all 32 lanes of the warp must reach it: the call is a __syncwarp() rendezvous, so part of
//    a warp calling it deadlocks and is reported as a diverged __syncwarp is; a lane that meets
//    the others at another __syncwarp or shuffle, or in another wmma call, is reported; a
//    partial warp (a block size that is not a multiple of 32) is reported;
//  - every lane must pass the same pointer, ldm and layout, and (mma_sync, store_matrix_sync)
//    hold the same fragment values: a lane-dependent element-wise operation on a fragment
//    depends on the unspecified mapping, so it is reported;
//  - the pointer must be 256-bit (32-byte) aligned, as a GPU address (device memory by its
//    offset in its cudaMalloc allocation, which a GPU aligns to 256 bytes; __shared__ arrays
//    need __align__(32)), and ldm a multiple of 16 bytes (8 16-bit elements, 4 floats).
// A failed check fails the launch with the kernel, block and thread, like an invalid memory
// access. Memory is read (load) or written (store: every lane writes the same values) while the
// whole warp is inside the call, after every lane's earlier writes and before any lane's later
// ones, as the single warp-wide instruction does on a GPU.
#pragma once
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu.h"

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};

enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment {
    static_assert(m == 16 && n == 16 && k == 16, "the emulator's wmma has only the 16x16x16 shape");
    static_assert(std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value ||
                      std::is_same<Use, accumulator>::value,
                  "a fragment is a wmma::matrix_a, matrix_b or accumulator");
    static_assert(std::is_same<Use, accumulator>::value
                      ? std::is_same<T, float>::value
                      : std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value,
                  "the emulator's wmma: matrix_a/matrix_b of __half or __nv_bfloat16, accumulators of float");
    static_assert(std::is_same<Use, accumulator>::value
                      ? std::is_void<Layout>::value
                      : std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value,
                  "matrix_a/matrix_b fragments take wmma::row_major or col_major, accumulators no layout");

  public:
    typedef T element_type;
    typedef T storage_element_type;
    static constexpr int num_elements = 256;   // the whole tile on every lane (8 on a GPU)
    static constexpr int num_storage_elements = 256;
    T x[num_elements];

    fragment() { memset((void *)x, 0xff, sizeof x); }   // NaN in each element type
};

// ---- the emulation's checks -------------------------------------------------------------------
namespace emu_detail {

template <typename T> inline const char *type_name();
template <> inline const char *type_name<__half>() { return "__half"; }
template <> inline const char *type_name<__nv_bfloat16>() { return "__nv_bfloat16"; }
template <> inline const char *type_name<float>() { return "float"; }
template <typename L> inline const char *layout_name() { return ""; }
template <> inline const char *layout_name<row_major>() { return ", row_major"; }
template <> inline const char *layout_name<col_major>() { return ", col_major"; }
template <typename U> inline const char *use_name();
template <> inline const char *use_name<matrix_a>() { return "matrix_a"; }
template <> inline const char *use_name<matrix_b>() { return "matrix_b"; }
template <> inline const char *use_name<accumulator>() { return "accumulator"; }

// "matrix_a, __half, row_major": what a fragment type is, for messages
template <typename Use, typename T, typename Layout> inline const char *fragment_name() {
    static char name[64];
    if (!name[0]) snprintf(name, sizeof name, "%s, %s%s", use_name<Use>(), type_name<T>(), layout_name<Layout>());
    return name;
}

// A fragment whose values every lane must hold alike.
struct uniform_fragment {
    const char *what;   // "a", "b", "c", "the fragment"
    const void *x;
    size_t size;        // bytes
    float (*value)(const void *x, int i);
};
template <typename T> float value_of(const void *x, int i) { return (float)((const T *)x)[i]; }

// One lane's call, published in its warp slot for the other lanes to compare with.
struct call {
    const char *op;      // "load_matrix_sync"
    const char *types;   // the fragment types
    const void *ptr;
    unsigned ldm;
    int layout;          // layout_t, or -1
    uniform_fragment frags[3];
    int nfrags;
};

inline unsigned linear_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

inline void check_full_warp(const char *op) {
    unsigned nt = blockDim.x * blockDim.y * blockDim.z, base = linear_thread() & ~31u;
    if (base + 32 > nt)
        emu_kernel_error("wmma::%s in a warp of %u lanes (a block of %u threads): it is warp-collective and needs all 32 "
                         "lanes of a full warp", op, nt - base, nt);
}

// The preconditions on a load's or store's pointer and ldm (esize: bytes per element).
inline void check_memory_args(const char *op, const void *p, unsigned ldm, size_t esize) {
    uintptr_t a = emu_gpu_address(p);
    if (a % 32) {
        if (a != (uintptr_t)p)
            emu_kernel_error("wmma::%s: the pointer %p is not 32-byte (256-bit) aligned: it is byte %lld of its device "
                             "allocation, which a GPU aligns to 256 bytes", op, p, (long long)(intptr_t)a);
        emu_kernel_error("wmma::%s: the pointer %p is not 32-byte (256-bit) aligned (a __shared__ array needs "
                         "__align__(32))", op, p);
    }
    unsigned multiple = (unsigned)(16 / esize);
    if (ldm % multiple)
        emu_kernel_error("wmma::%s: ldm %u is not a multiple of %u (16 bytes of %zu-byte elements)", op, ldm, multiple,
                         esize);
}

inline void check_layout(const char *op, layout_t layout) {
    if (layout != mem_row_major && layout != mem_col_major)
        emu_kernel_error("wmma::%s: layout %d is neither wmma::mem_row_major nor mem_col_major", op, (int)layout);
}

// Enters a warp-collective call: waits for the whole warp (the first __syncwarp), then checks
// that every lane is in the same call with the same arguments and fragment values. The lanes
// stay inside until leave() (the second __syncwarp): the slots stay valid meanwhile.
inline void enter(const call &c) {
    check_full_warp(c.op);
    int lane = emu_lane();
    const void **slots = emu_warp_slots();
    slots[lane] = &c;
    __syncwarp();
    for (int l = 0; l < 32; l++)
        if (!slots[l])
            emu_kernel_error("wmma::%s: lane %d of the warp is not in this warp-collective call (it met the others at a "
                             "__syncwarp or shuffle instead): every lane must make the same wmma calls", c.op, l);
    const call &c0 = *(const call *)slots[0];
    if (strcmp(c0.op, c.op) || strcmp(c0.types, c.types))
        emu_kernel_error("lanes 0 and %d of the warp are in different warp-collective calls: wmma::%s(%s) and "
                         "wmma::%s(%s) (every lane must make the same wmma calls)", lane, c0.op, c0.types, c.op, c.types);
    if (c0.ptr != c.ptr || c0.ldm != c.ldm || c0.layout != c.layout)
        emu_kernel_error("wmma::%s: lanes 0 and %d pass different arguments (pointer %p / %p, ldm %u / %u, layout %d / "
                         "%d): they must be the same for every lane of the warp", c.op, lane, c0.ptr, c.ptr, c0.ldm, c.ldm,
                         c0.layout, c.layout);
    for (int f = 0; f < c.nfrags; f++) {
        const uniform_fragment &u = c.frags[f], &u0 = c0.frags[f];
        if (!memcmp(u.x, u0.x, u.size)) continue;
        size_t es = u.size / 256;
        int i = 0;
        while (!memcmp((const char *)u.x + i * es, (const char *)u0.x + i * es, es)) i++;
        emu_kernel_error("wmma::%s: lanes 0 and %d hold different values in %s at element (%d, %d): %.9g / %.9g (an "
                         "element-wise operation on a fragment depended on the lane; which lane holds which element "
                         "is unspecified)", c.op, lane, u.what, i / 16, i % 16, (double)u0.value(u0.x, i),
                         (double)u.value(u.x, i));
    }
}

inline void leave() {
    __syncwarp();
    emu_warp_slots()[emu_lane()] = NULL;
}

template <typename F> inline uniform_fragment uniform(const char *what, const F &f) {
    return uniform_fragment{what, f.x, sizeof f.x, value_of<typename F::element_type>};
}

}   // namespace emu_detail

// ---- the API ------------------------------------------------------------------------------------

// Not warp-collective: every lane sets its own copy (of the whole tile here).
template <typename Use, int m, int n, int k, typename T, typename Layout>
inline void fill_fragment(fragment<Use, m, n, k, T, Layout> &f, const typename std::common_type<T>::type &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

// matrix_a (16 x 16, m x k) or matrix_b (k x n): element (r, c) at p[r * ldm + c] (row_major)
// or p[c * ldm + r] (col_major).
template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator's load_matrix_sync takes a wmma::layout_t");
    using namespace emu_detail;
    const char *op = "load_matrix_sync";
    check_memory_args(op, p, ldm, sizeof(T));
    call c = {op, fragment_name<Use, T, Layout>(), p, ldm, -1, {}, 0};
    enter(c);
    bool row = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) f.x[r * 16 + col] = p[row ? r * ldm + col : col * ldm + r];
    leave();
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                             layout_t layout) {
    using namespace emu_detail;
    const char *op = "load_matrix_sync";
    check_layout(op, layout);
    check_memory_args(op, p, ldm, sizeof(float));
    call c = {op, fragment_name<accumulator, float, void>(), p, ldm, (int)layout, {}, 0};
    enter(c);
    bool row = layout == mem_row_major;
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) f.x[r * 16 + col] = p[row ? r * ldm + col : col * ldm + r];
    leave();
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                              layout_t layout) {
    using namespace emu_detail;
    const char *op = "store_matrix_sync";
    check_layout(op, layout);
    check_memory_args(op, p, ldm, sizeof(float));
    call c = {op, fragment_name<accumulator, float, void>(), p, ldm, (int)layout, {uniform("the fragment", f)}, 1};
    enter(c);
    bool row = layout == mem_row_major;
    for (int r = 0; r < 16; r++)
        for (int col = 0; col < 16; col++) p[row ? r * ldm + col : col * ldm + r] = f.x[r * 16 + col];
    leave();
}

// d = a b + c: products and sums in float. d may be c.
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c) {
    using namespace emu_detail;
    static char types[200];
    if (!types[0])
        snprintf(types, sizeof types, "%s; %s; accumulator, float", fragment_name<matrix_a, T, LA>(),
                 fragment_name<matrix_b, T, LB>());
    call k = {"mma_sync", types, NULL, 0, -1, {uniform("a", a), uniform("b", b), uniform("c", c)}, 3};
    enter(k);
    float fa[256], fb[256], out[256];
    for (int i = 0; i < 256; i++) {
        fa[i] = (float)a.x[i];
        fb[i] = (float)b.x[i];
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = c.x[i * 16 + j];
            for (int l = 0; l < 16; l++) s += fa[i * 16 + l] * fb[l * 16 + j];
            out[i * 16 + j] = s;
        }
    leave();   // (only now: lane 0's c, which may be its d, is compared with until every lane is through)
    memcpy(d.x, out, sizeof out);
}

}   // namespace wmma
}   // namespace nvcuda
