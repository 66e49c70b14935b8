/* vecmath.h — branch-free float32 exp/tanh/erf/sigmoid that -O3 vectorizes.
 *
 * libm's tanhf/erff/expf are scalar calls (~20 ns each) that stop -O3 from vectorizing a
 * loop. These versions have no branches (selects are bit masks, so GCC vectorizes them
 * even with -ftrapping-math): max error about 1.5 ulp over the whole range (checked
 * against float64 references). float64 kernels keep libm, whose accuracy the float64
 * finite-difference gradient checks rely on. Shared by elementwise.c, nn.c, loss.c; any
 * kernel may include it.
 */
#ifndef OM_VECMATH_H
#define OM_VECMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* c ? a : b without a branch */
static inline float sel_f32(int c, float a, float b) {
    uint32_t m = (uint32_t)-(int32_t)c;
    return bits_f32((f32_bits(a) & m) | (f32_bits(b) & ~m));
}
static inline float abs_f32(float x) { return bits_f32(f32_bits(x) & 0x7fffffffu); }
static inline float copysign_f32(float mag, float sgn) {
    return bits_f32((f32_bits(mag) & 0x7fffffffu) | (f32_bits(sgn) & 0x80000000u));
}

/* e^x: x = n ln2 + r (Cody-Waite), e^r by the Cephes polynomial, 2^n via the exponent
 * bits. Below -87.34 (denormal results) gives 0, above 88.72 gives inf; NaN stays NaN. */
static inline float exp_f32(float x) {
    const float x0 = x;
    x = sel_f32(x < -87.33654f, -87.33654f, x);
    x = sel_f32(x > 88.37626f, 88.37626f, x);
    const float magic = 12582912.0f;   /* 1.5 * 2^23: adding it rounds to an integer */
    const float t = x * 1.44269504f + magic;
    const float n = t - magic;
    const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    const int32_t ni = (int32_t)(f32_bits(t) - f32_bits(magic));
    float v = y * bits_f32((uint32_t)(ni + 127) << 23);
    v = sel_f32(x0 > 88.72283f, bits_f32(0x7f800000u), v);
    return sel_f32(x0 < -87.33654f, 0.0f, v);
}

static inline double bits_f64(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }
static inline uint64_t f64_bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
static inline double sel_f64(int c, double a, double b) {
    uint64_t m = (uint64_t)-(int64_t)c;
    return bits_f64((f64_bits(a) & m) | (f64_bits(b) & ~m));
}

/* e^x bit for bit as glibc's expf (2.28 on, its algorithm in sysdeps/ieee754/flt-32/e_expf.c, as
 * its FMA build runs: on x86-64 CPUs with AVX2 and FMA, which libm picks there),
 * where the gradient must match libm (exp_f32's 1.5 ulp is amplified by training through
 * BatchNorm): x k/32 ln2 + r in double, 2^(k/32) from a 32-entry table whose exponent bits
 * take k/32's integer part, e^r by a cubic, one rounding to float at the end. Branch-free,
 * so the loop vectorizes (the table read is a gather): 4-5x libm's scalar call at AVX-512.
 * tests/test_vecmath.py checks it against the process's expf. */
static const uint64_t OM_EXP2_TAB32[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};   /* bits of 2^(i/32) less i << 47, so that adding k << 47 scales by 2^(k/32)'s integer part */

static inline float exp_f32_libm(float x) {
    const double N = 32.0, shift = 0x1.8p+52;   /* adding shift rounds to an integer, in the low bits */
    const double invln2N = 0x1.71547652b82fep+0 * N;
    const double c0 = 0x1.c6af84b912394p-5 / N / N / N, c1 = 0x1.ebfce50fac4f3p-3 / N / N,
                 c2 = 0x1.62e42ff0c52d6p-1 / N;
    double xd = x;
    xd = sel_f64(xd < -104.0, -104.0, xd);   /* e^-104 rounds to 0 in float, e^89 to inf: */
    xd = sel_f64(xd > 89.0, 89.0, xd);       /* clamped, the integer k stays in range */
    /* the fused multiply-adds are glibc's: its x86-64 expf is the -mfma build of that C, contracted
     * (the build here is ISO C, which contracts nothing: they are written out) */
    double kd = __builtin_fma(invln2N, xd, shift);
    const uint64_t ki = f64_bits(kd);
    kd -= shift;
    const double r = __builtin_fma(invln2N, xd, -kd);
    const double s = bits_f64(OM_EXP2_TAB32[ki & 31] + (ki << 47));
    const double p = __builtin_fma(c0, r, c1), r2 = r * r;
    const double y = __builtin_fma(p, r2, __builtin_fma(c2, r, 1.0)) * s;
    return sel_f32(x != x, x, (float)y);
}

/* tanh: odd polynomial below 0.625 (Cephes), (1 - e)/(1 + e) with e = exp(-2|x|) above. */
static inline float tanh_f32(float x) {
    const float ax = abs_f32(x), z = x * x;
    const float small =
        ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
         3.33332819422e-1f) * z * x + x;
    const float e = exp_f32(-2.0f * ax);
    const float big = copysign_f32((1.0f - e) / (1.0f + e), x);
    return sel_f32(ax < 0.625f, small, big);
}

/* erf: minimax polynomials (N. Juffa's erff), odd polynomial below 0.9277, 1 - exp(poly)
 * above. */
static inline float erf_f32(float a) {
    const float t = abs_f32(a), s = a * a;
    float r = -1.72853470e-5f * t + 3.83197126e-4f;
    const float u = -3.88396438e-3f * t + 2.42546219e-2f;
    r = r * s + u;
    r = r * t - 1.06777877e-1f;
    r = r * t - 6.34846687e-1f;
    r = r * t - 1.28717512e-1f;
    r = r * t - t;
    const float big = copysign_f32(1.0f - exp_f32(r), a);
    float q = -5.96761703e-4f;
    q = q * s + 4.99119423e-3f;
    q = q * s - 2.67681349e-2f;
    q = q * s + 1.12819925e-1f;
    q = q * s - 3.76125336e-1f;
    q = q * s + 1.28379166e-1f;
    q = q * a + a;
    return sel_f32(t > 0.927734375f, big, q);
}

/* sigmoid from exp(-|x|) only, so nothing overflows. */
static inline float sigmoid_f32(float x) {
    const float e = exp_f32(-abs_f32(x));
    const float s = 1.0f / (1.0f + e);
    return sel_f32(x >= 0.0f, s, e * s);
}
static inline double sigmoid_f64(double x) {
    const double e = exp(-fabs(x));
    const double s = 1.0 / (1.0 + e);
    return x >= 0.0 ? s : e * s;
}


#endif
