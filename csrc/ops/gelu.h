/* gelu.h — GELU's constants and derivative, shared by the Gelu/GeluGrad kernels (elementwise.c)
 * and the fused ones that carry a GELU (fused.c: BiasGelu, MatMulBiasGelu, and MatMulBiasGrad
 * when the GELU's gradient rides on its dx). The float32 forms use vecmath.h's vectorizable
 * erf/tanh/exp; float64 keeps libm.
 *
 *   gelu(x)  = x Phi(x)                            approximate "none" (erf)
 *            = 0.5 x (1 + tanh(k0 (x + k1 x^3)))   approximate "tanh"
 *   gelu'(x) = Phi(x) + x phi(x);  tanh form, with t = tanh(k0 (x + k1 x^3)):
 *              0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 k1 x^2)
 */
#ifndef OM_GELU_H
#define OM_GELU_H

#include <math.h>

#include "ops/vecmath.h"

#define GELU_K0 0.7978845608028654   /* sqrt(2/pi) */
#define GELU_K1 0.044715
#define INV_SQRT2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

static inline float gelu_erf_deriv_f32(float x) {
    return 0.5f * (1.0f + erf_f32(x * (float)INV_SQRT2)) + x * (float)INV_SQRT_2PI * exp_f32(-0.5f * x * x);
}
static inline double gelu_erf_deriv_f64(double x) {
    return 0.5 * (1.0 + erf(x * INV_SQRT2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x);
}
static inline float gelu_tanh_deriv_f32(float x) {
    const float t = tanh_f32((float)GELU_K0 * (x + (float)GELU_K1 * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * (float)GELU_K0 * (1.0f + (float)(3 * GELU_K1) * x * x);
}
static inline double gelu_tanh_deriv_f64(double x) {
    const double t = tanh(GELU_K0 * (x + GELU_K1 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K0 * (1.0 + 3 * GELU_K1 * x * x);
}

#endif
