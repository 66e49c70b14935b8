// attention.cuh — what attention.cu (cuBLAS, scores materialized) and flash.cu (tensor-core
// tiles, scores never leave the chip) share: the softmax's arguments and the logit of one score.
#pragma once
#include "common.cuh"

struct soft_args {
    int64_t L, S, nb;
    int64_t batch[OM_MAX_RANK], m_str[OM_MAX_RANK];
    int64_t m_row, m_col;
    int causal, nan_to_zero, dropout;
    float scale, ratio, dscale;
};

__device__ __forceinline__ int64_t mask_base(const soft_args &a, int64_t t) {
    int64_t off = 0;
    for (int d = a.nb - 1; d >= 0; d--) {
        int64_t i = t % a.batch[d];
        t /= a.batch[d];
        off += i * a.m_str[d];
    }
    return off;
}

// the logit of score s at (t, i, j): scale s + mask (+ causal -inf)
template <typename T>
__device__ __forceinline__ float logit(const soft_args &a, float s, const T *mask, int64_t mb, int64_t i, int64_t j) {
    float v = s * a.scale;
    if (mask) v += (float)ld(mask[mb + i * a.m_row + j * a.m_col]);
    if (a.causal && j > i) v = -INFINITY;
    return v;
}

// Flash kernels (flash.cu): fp16/bf16, head dims D, Dv <= FLASH_MAX_D. Q, K, V with batch strides
// (0: shared over the batch); K given as K^T (D, S) when kt.
#define FLASH_MAX_D 128
struct flash_args {
    soft_args a;
    int64_t B, D, Dv;
    int64_t q_bs, k_bs, v_bs;
    int kt;
};
// O (B, L, Dv) and lse (B, L, fp32; may be NULL)
om_status *flash_forward(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, const flash_args *f,
                         const void *Q, const void *K, const void *V, const void *mask, const int64_t *seedp, void *O,
                         float *lse);
// dQ (B, L, D), dK (B, S, D) or dK^T, dV (B, S, Dv), each may be NULL; Di = rowsum(dO * O) (B, L)
om_status *flash_backward(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, const flash_args *f,
                          const void *dO, const void *Q, const void *K, const void *V, const void *mask,
                          const int64_t *seedp, const float *lse, const float *Di, void *dQ, void *dK, void *dV);
