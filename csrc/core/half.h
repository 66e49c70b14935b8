/* half.h — fp16 and bf16 storage <-> fp32, round to nearest even (what torch's .half() and
 * .bfloat16() do). One copy for the whole engine: Cast's CPU kernel, the optimizer kernels,
 * constants emitted by gradient rules, fusion passes reading constant scalars.
 *
 * fp16/bf16 are storage types: the CPU kernels compute in fp32/fp64 and the CUDA kernels
 * load them to fp32. Branch-light so that loops over blocks vectorize.
 */
#ifndef OM_HALF_H
#define OM_HALF_H

#include <stdint.h>

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
    /* F. Giesen's float_to_half_fast3_rtne: overflow (>= 65520) to inf, NaN stays a
     * (quiet) NaN, subnormals rounded by an fp32 add. */
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

#endif
