// cuda_fp16.h — the CUDA emulator's __half (tests/cuda_emu; the type itself is in emu_half.h).
#pragma once
#include "emu_half.h"

struct __half_raw {
    unsigned short x;
};
typedef emu_half16<emu_fmt_fp16, __half_raw> __half;

inline float __half2float(__half h) { return om_f16_to_f32(h.__x); }
inline __half __float2half_rn(float f) { return __half::from_f32(f); }
inline __half __float2half(float f) { return __half::from_f32(f); }
inline __half __double2half(double d) { return __half::from_f64(d); }
inline __half __int2half_rn(int i) { return __half(i); }
inline int __half2int_rz(__half h) { return (int)h; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short b) { return __half::from_bits(b); }
inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hdiv(__half a, __half b) { return a / b; }
inline __half __hneg(__half a) { return -a; }
inline __half __habs(__half a) { return __half::from_bits((uint16_t)(a.__x & 0x7fffu)); }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline int __hisinf(__half a) { return a.__x == 0x7c00u ? 1 : a.__x == 0xfc00u ? -1 : 0; }
inline bool __heq(__half a, __half b) { return a == b; }
inline bool __hne(__half a, __half b) { return a.f() < b.f() || a.f() > b.f(); }   // ordered
inline bool __hlt(__half a, __half b) { return a < b; }
inline bool __hle(__half a, __half b) { return a <= b; }
inline bool __hgt(__half a, __half b) { return a > b; }
inline bool __hge(__half a, __half b) { return a >= b; }
// (no NaN in either: the larger; CUDA's __hmax returns the other operand for one NaN)
inline __half __hmax(__half a, __half b) { return __hisnan(a) ? b : __hisnan(b) ? a : a > b ? a : b; }
inline __half __hmin(__half a, __half b) { return __hisnan(a) ? b : __hisnan(b) ? a : a < b ? a : b; }
// a 16-bit atomic add rounds at every addition, as the GPU's does
inline __half atomicAdd(__half *p, __half v) {
    __half old = *p;
    *p = old + v;
    return old;
}
