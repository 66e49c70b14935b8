// pointwise.cuh — the pointwise machinery elementwise.cu defines and misc.cu's pointwise ops
// (comparisons and logic, the activations and their gradients) run through: one kernel per shape
// of work, selected by an op code, so both files' ops share the math and its dtype dispatch.
#pragma once
#include "common.cuh"

// comparisons and logic: -> bool
enum { C_EQ, C_LT, C_GT, C_LE, C_GE, L_AND, L_OR, L_XOR };

// unary math and activations (U_LEAKY .. U_CELU: misc.c's activations, in act_kind's order)
enum {
    U_NEG, U_RELU, U_ABS, U_TANH, U_SIGMOID, U_GELU_ERF, U_GELU_TANH, U_ERF, U_SQRT, U_EXP, U_LOG, U_RECIP,
    U_LEAKY, U_SOFTPLUS, U_ELU, U_SELU, U_HARD_SIGMOID, U_HARD_SWISH, U_MISH, U_SOFTSIGN, U_CELU, U_NOT,
    U_SIN, U_COS, U_SIGN, U_FLOOR, U_CEIL, U_ROUND,
};

// an activation's attributes: alpha, beta, gamma
struct act_params { float a, b, g; };

// fused backward helpers: dx = dy * f'(saved)
enum { G_RELU, G_TANH, G_SIGMOID, G_ABS, G_GELU_ERF, G_GELU_TANH, G_ACT };

// out (bool) = a op b, broadcast
om_status *omc_compare(const om_kernel_ctx *ctx, const om_cuda_exec *x, int op);
// y = op(x) elementwise (p: an activation's attributes)
om_status *omc_unary(const om_kernel_ctx *ctx, const om_cuda_exec *x, int op, act_params p = act_params{0, 0, 0});
// dx = op's derivative at the saved input or output (in[1]) times dy (in[0]); G_ACT: activation kind's
om_status *omc_grad2(const om_kernel_ctx *ctx, const om_cuda_exec *x, int op, int kind = 0,
                     act_params p = act_params{0, 0, 0});
