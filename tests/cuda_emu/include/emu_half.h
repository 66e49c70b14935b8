// emu_half.h — __half and __nv_bfloat16 for the CUDA emulator (cuda_fp16.h and cuda_bf16.h
// include it): 16-bit storage with the host-side API CUDA's own headers declare (conversions,
// arithmetic and comparison operators), so code that nvcc accepts means the same thing here.
//
// Rounding: float -> 16 bits is round-to-nearest-even through the engine's own converter
// (csrc/core/half.h, what the CPU provider's Cast uses); double -> 16 bits rounds once (to
// float with round-to-odd first, which makes the second rounding exact). Arithmetic on two
// 16-bit values is done in float and rounded once: float's 24 bits are at least twice the
// 11 (fp16) or 8 (bf16) bits plus two, so this is the correctly rounded result a GPU's
// half-precision add/mul/div gives. Integer conversions truncate (CUDA's _rz), NaN to 0.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/half.h"

// double -> float rounded to odd: truncate, then set the last bit when anything was lost
static inline float emu_f64_to_f32_odd(double d) {
    if (d != d) return (float)d;
    float f = (float)d;   // round to nearest
    if ((double)f == d || std::isinf(d)) return f;
    if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);   // now truncated
    uint32_t u = om_f32_bits(f) | 1u;
    return om_bits_f32(u);
}

template <typename I> static inline I emu_float_to_int_rz(float f) {
    if (f != f) return 0;
    if (f <= (float)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
    if (f >= (float)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max();
    return (I)f;
}

struct emu_fmt_fp16 {
    static float to_f32(uint16_t b) { return om_f16_to_f32(b); }
    static uint16_t from_f32(float f) { return om_f32_to_f16(f); }
};
struct emu_fmt_bf16 {
    static float to_f32(uint16_t b) { return om_bf16_to_f32(b); }
    static uint16_t from_f32(float f) { return om_f32_to_bf16(f); }
};

template <class Fmt, class Raw> struct emu_half16 {
    unsigned short __x;

    static emu_half16 from_bits(uint16_t b) { emu_half16 h; h.__x = b; return h; }
    static emu_half16 from_f32(float f) { return from_bits(Fmt::from_f32(f)); }
    static emu_half16 from_f64(double d) { return from_bits(Fmt::from_f32(emu_f64_to_f32_odd(d))); }

    emu_half16() = default;
    emu_half16(const Raw &r) : __x(r.x) {}
    emu_half16(float f) : __x(Fmt::from_f32(f)) {}
    emu_half16(double d) : __x(from_f64(d).__x) {}
    emu_half16(short v) : __x(from_f64(v).__x) {}
    emu_half16(unsigned short v) : __x(from_f64(v).__x) {}
    emu_half16(int v) : __x(from_f64(v).__x) {}
    emu_half16(unsigned v) : __x(from_f64(v).__x) {}
    emu_half16(long v) : __x(from_f64((double)v).__x) {}
    emu_half16(unsigned long v) : __x(from_f64((double)v).__x) {}
    emu_half16(long long v) : __x(from_f64((double)v).__x) {}
    emu_half16(unsigned long long v) : __x(from_f64((double)v).__x) {}
    emu_half16 &operator=(float f) { __x = Fmt::from_f32(f); return *this; }
    emu_half16 &operator=(double d) { __x = from_f64(d).__x; return *this; }

    operator Raw() const { Raw r; r.x = __x; return r; }
    operator float() const { return Fmt::to_f32(__x); }   // no operator double, as in CUDA
    operator signed char() const { return emu_float_to_int_rz<signed char>(*this); }
    operator unsigned char() const { return emu_float_to_int_rz<unsigned char>(*this); }
    operator char() const { return emu_float_to_int_rz<char>(*this); }
    operator short() const { return emu_float_to_int_rz<short>(*this); }
    operator unsigned short() const { return emu_float_to_int_rz<unsigned short>(*this); }
    operator int() const { return emu_float_to_int_rz<int>(*this); }
    operator unsigned() const { return emu_float_to_int_rz<unsigned>(*this); }
    operator long() const { return emu_float_to_int_rz<long>(*this); }
    operator unsigned long() const { return emu_float_to_int_rz<unsigned long>(*this); }
    operator long long() const { return emu_float_to_int_rz<long long>(*this); }
    operator unsigned long long() const { return emu_float_to_int_rz<unsigned long long>(*this); }
    operator bool() const { return (__x & 0x7fffu) != 0; }

    float f() const { return Fmt::to_f32(__x); }
    // hidden friends, as CUDA's operators: `h + 1.0f` is ambiguous here exactly as under nvcc
    friend emu_half16 operator+(const emu_half16 &a, const emu_half16 &b) { return from_f32(a.f() + b.f()); }
    friend emu_half16 operator-(const emu_half16 &a, const emu_half16 &b) { return from_f32(a.f() - b.f()); }
    friend emu_half16 operator*(const emu_half16 &a, const emu_half16 &b) { return from_f32(a.f() * b.f()); }
    friend emu_half16 operator/(const emu_half16 &a, const emu_half16 &b) { return from_f32(a.f() / b.f()); }
    friend emu_half16 &operator+=(emu_half16 &a, const emu_half16 &b) { return a = a + b; }
    friend emu_half16 &operator-=(emu_half16 &a, const emu_half16 &b) { return a = a - b; }
    friend emu_half16 &operator*=(emu_half16 &a, const emu_half16 &b) { return a = a * b; }
    friend emu_half16 &operator/=(emu_half16 &a, const emu_half16 &b) { return a = a / b; }
    friend emu_half16 operator+(const emu_half16 &a) { return a; }
    friend emu_half16 operator-(const emu_half16 &a) { return from_bits((uint16_t)(a.__x ^ 0x8000u)); }
    friend bool operator==(const emu_half16 &a, const emu_half16 &b) { return a.f() == b.f(); }
    friend bool operator!=(const emu_half16 &a, const emu_half16 &b) { return a.f() != b.f(); }   // unordered, as __hneu
    friend bool operator<(const emu_half16 &a, const emu_half16 &b) { return a.f() < b.f(); }
    friend bool operator<=(const emu_half16 &a, const emu_half16 &b) { return a.f() <= b.f(); }
    friend bool operator>(const emu_half16 &a, const emu_half16 &b) { return a.f() > b.f(); }
    friend bool operator>=(const emu_half16 &a, const emu_half16 &b) { return a.f() >= b.f(); }
};
