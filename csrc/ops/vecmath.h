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
