// cuda_bf16.h — the CUDA emulator's __nv_bfloat16 (tests/cuda_emu; the type is in emu_half.h).
#pragma once
#include "emu_half.h"

struct __nv_bfloat16_raw {
    unsigned short x;
};
typedef emu_half16<emu_fmt_bf16, __nv_bfloat16_raw> __nv_bfloat16;

inline float __bfloat162float(__nv_bfloat16 h) { return om_bf16_to_f32(h.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16::from_f32(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16::from_f32(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16::from_f64(d); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return __nv_bfloat16::from_bits(b); }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return a - b; }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return a / b; }
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return -a; }
inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fffu) > 0x7f80u; }
// a 16-bit atomic add rounds at every addition, as the GPU's does
inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v) {
    __nv_bfloat16 old = *p;
    *p = old + v;
    return old;
}
