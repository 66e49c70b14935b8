/* optim_internal.h — what the optimizer kernels share: fp16/bf16 converters (math is
 * fp32; storage may be half), the multi-tensor range splitter, and a small pthread
 * parallel-for. Private to csrc/optim/. */
#ifndef OM_OPTIM_INTERNAL_H
#define OM_OPTIM_INTERNAL_H

#include "core/core.h"
#include "ortmod_optim.h"

#include <stdint.h>
#include <string.h>

/* ---- fp16 / bf16 <-> fp32, round to nearest even (what torch's .half()/.bfloat16() do).
 * Branch-light so that the block loops below vectorize. */
/* union punning (valid C11); memcpy here leaves loads the vectorizer cannot type */
static inline float om_bits_f32(uint32_t u) { union { uint32_t u; float f; } x = {.u = u}; return x.f; }
static inline uint32_t om_f32_bits(float f) { union { float f; uint32_t u; } x = {.f = f}; return x.u; }

static inline float om_f16_to_f32(uint16_t h) {
    /* Shift exponent+mantissa into fp32 position; multiplying by 2^112 rebiases the
     * exponent (15 -> 127) and turns half subnormals into normal floats. Inf/NaN (half
     * exponent 31) get the fp32 all-ones exponent, keeping the payload. */
    uint32_t em = (uint32_t)(h & 0x7fffu);
    float f = om_bits_f32(em << 13) * 0x1p112f;
    uint32_t u = om_f32_bits(f);
    u |= (em >= 0x7c00u) ? 0x7f800000u : 0u;
    return om_bits_f32(u | ((uint32_t)(h & 0x8000u) << 16));
}

static inline uint16_t om_f32_to_f16(float x) {
    /* F. Giesen's float_to_half_fast3_rtne. (Its branches keep this loop scalar; half
     * parameters are the uncommon path — FP16_Optimizer keeps fp32 masters.) */
    uint32_t f = om_f32_bits(x);
    uint32_t sign = f & 0x80000000u;
    f ^= sign;
    uint16_t o;
    if (f >= (uint32_t)(127 + 16) << 23) {                  /* overflow, Inf or NaN */
        o = f > 0x7f800000u ? 0x7e00 : 0x7c00;
    } else if (f < (uint32_t)113 << 23) {                   /* half subnormal or zero */
        const uint32_t magic = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23;
        float t = om_bits_f32(f) + om_bits_f32(magic);
        o = (uint16_t)(om_f32_bits(t) - magic);
    } else {
        uint32_t mant_odd = (f >> 13) & 1u;
        f += ((uint32_t)(15 - 127) << 23) + 0xfffu;
        f += mant_odd;
        o = (uint16_t)(f >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

static inline float om_bf16_to_f32(uint16_t b) { return om_bits_f32((uint32_t)b << 16); }

static inline uint16_t om_f32_to_bf16(float x) {
    uint32_t u = om_f32_bits(x);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;                                    /* quiet NaN */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

/* Converts n values of dtype dt (f32, f16, bf16) at src to fp32 at dst, and back. */
static inline void om_load_f32(om_dtype dt, const void *src, float *restrict dst, int64_t n) {
    if (dt == OM_F16) {
        const uint16_t *restrict s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = om_f16_to_f32(s[i]);
    } else if (dt == OM_BF16) {
        const uint16_t *restrict s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = om_bf16_to_f32(s[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

static inline void om_store_f32(om_dtype dt, const float *restrict src, void *dst, int64_t n) {
    if (dt == OM_F16) {
        uint16_t *restrict d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = om_f32_to_f16(src[i]);
    } else if (dt == OM_BF16) {
        uint16_t *restrict d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = om_f32_to_bf16(src[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* Elements per block when half tensors are converted through fp32 stack buffers. */
#define OM_OPTIM_BLOCK 512

static inline int om_is_float_dtype(om_dtype dt) { return dt == OM_F32 || dt == OM_F16 || dt == OM_BF16; }

/* ---- multi-tensor ranges ---------------------------------------------------------
 * The n tensors of a call are seen as one concatenated range of elements; offsets[k] is
 * where tensor k starts (offsets[n] = total). A worker gets a global [begin, end) and
 * visits the tensor pieces inside it. */
typedef void (*om_piece_fn)(void *ctx, int tensor, int64_t lo, int64_t hi, int part);

void om_visit_pieces(const int64_t *offsets, int n, int64_t begin, int64_t end, int part, void *ctx, om_piece_fn fn);

/* ---- parallel for ------------------------------------------------------------------
 * Splits [0, total) into contiguous parts (multiples of 64 elements, each at least grain
 * elements; at most OM_OPTIM_MAX_PARTS, or the cap om_optim_set_num_threads /
 * ORTMOD_NUM_THREADS set) and runs fn on each, on the engine's thread pool. Parts are
 * numbered in order of begin. Returns the number of parts; fn(ctx, part, begin, end). */
#define OM_OPTIM_MAX_PARTS 64
typedef void (*om_range_fn)(void *ctx, int part, int64_t begin, int64_t end);
int om_parallel_for(int64_t total, int64_t grain, void *ctx, om_range_fn fn);

/* Checks what every optimizer kernel needs of a tensor: CPU, rank 0..OM_MAX_RANK, f32/f16/bf16
 * (f32 only when f32_only), data present when it has elements. what/i name it in errors. */
om_status *om_optim_check_tensor(const om_tensor *t, const char *what, int i, int f32_only);

/* offsets[0..n] of n tensors (see om_visit_pieces); caller frees. */
om_status *om_optim_offsets(int n, const om_tensor *ts, int64_t **offsets);

#endif
