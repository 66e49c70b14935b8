// gelu.cuh — GELU and its derivative in the math type A, for every kernel that carries a GELU
// (elementwise.cu's Gelu / GeluGrad, fused.cu's BiasGelu, MatMulBiasGelu's and MatMulBiasGrad's
// GELU passes): csrc/ops/gelu.h's formulas.
#pragma once
#include <math.h>

#define GELU_K0 0.7978845608028654   // sqrt(2/pi)
#define GELU_K1 0.044715
#define INV_SQRT2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

template <typename A> __device__ __forceinline__ A gelu_of(A v, int tanh_mode) {
    return tanh_mode ? (A)0.5 * v * ((A)1 + tanh((A)GELU_K0 * (v + (A)GELU_K1 * v * v * v)))
                     : (A)0.5 * v * ((A)1 + erf(v * (A)INV_SQRT2));
}
template <typename A> __device__ __forceinline__ A gelu_erf_deriv(A v) {
    return (A)0.5 * ((A)1 + erf(v * (A)INV_SQRT2)) + v * (A)INV_SQRT_2PI * exp((A)-0.5 * v * v);
}
template <typename A> __device__ __forceinline__ A gelu_tanh_deriv(A v) {
    A t = tanh((A)GELU_K0 * (v + (A)GELU_K1 * v * v * v));
    return (A)0.5 * ((A)1 + t) + (A)0.5 * v * ((A)1 - t * t) * (A)GELU_K0 * ((A)1 + (A)(3 * GELU_K1) * v * v);
}
template <typename A> __device__ __forceinline__ A gelu_deriv(A v, int tanh_mode) {
    return tanh_mode ? gelu_tanh_deriv(v) : gelu_erf_deriv(v);
}
