/* op_table.c — the one table of ops: one line per op. Every other part of the engine
 * finds ops here, by name and domain. The definitions live in the family files. */
#include "ops/op.h"

extern const om_op_def om_op_matmul;
extern const om_op_def om_op_gemm;
extern const om_op_def om_op_fused_matmul;
extern const om_op_def om_op_matmul_grad;
extern const om_op_def om_op_softmax;
extern const om_op_def om_op_log_softmax;
extern const om_op_def om_op_softmax_grad;
extern const om_op_def om_op_log_softmax_grad;
extern const om_op_def om_op_layer_norm;
extern const om_op_def om_op_layer_norm_grad;
extern const om_op_def om_op_softmax_cross_entropy_loss;
extern const om_op_def om_op_softmax_cross_entropy_loss_grad;
extern const om_op_def om_op_nll_loss;
extern const om_op_def om_op_nll_loss_grad;
extern const om_op_def om_op_shape;
extern const om_op_def om_op_size;
extern const om_op_def om_op_constant;
extern const om_op_def om_op_constant_of_shape;
extern const om_op_def om_op_reshape;
extern const om_op_def om_op_flatten;
extern const om_op_def om_op_squeeze;
extern const om_op_def om_op_unsqueeze;
extern const om_op_def om_op_transpose;
extern const om_op_def om_op_gather;
extern const om_op_def om_op_gather_grad;
extern const om_op_def om_op_concat;
extern const om_op_def om_op_concat_grad;
extern const om_op_def om_op_slice;
extern const om_op_def om_op_slice_grad;
extern const om_op_def om_op_expand;
extern const om_op_def om_op_range;
extern const om_op_def om_op_split;
extern const om_op_def om_op_split_grad;
extern const om_op_def om_op_reduce_sum;
extern const om_op_def om_op_reduce_mean;
extern const om_op_def om_op_reduce_max;
extern const om_op_def om_op_reduce_min;
extern const om_op_def om_op_reduce_prod;
extern const om_op_def om_op_reduce_grad;
extern const om_op_def om_op_reduce_min_max_grad;
extern const om_op_def om_op_add;
extern const om_op_def om_op_sub;
extern const om_op_def om_op_mul;
extern const om_op_def om_op_div;
extern const om_op_def om_op_pow;
extern const om_op_def om_op_max;
extern const om_op_def om_op_min;
extern const om_op_def om_op_neg;
extern const om_op_def om_op_relu;
extern const om_op_def om_op_abs;
extern const om_op_def om_op_tanh;
extern const om_op_def om_op_sigmoid;
extern const om_op_def om_op_gelu;
extern const om_op_def om_op_erf;
extern const om_op_def om_op_sqrt;
extern const om_op_def om_op_exp;
extern const om_op_def om_op_log;
extern const om_op_def om_op_reciprocal;
extern const om_op_def om_op_relu_grad;
extern const om_op_def om_op_tanh_grad;
extern const om_op_def om_op_sigmoid_grad;
extern const om_op_def om_op_abs_grad;
extern const om_op_def om_op_gelu_grad;
extern const om_op_def om_op_equal;
extern const om_op_def om_op_where;
extern const om_op_def om_op_identity;
extern const om_op_def om_op_cast;
extern const om_op_def om_op_dropout;
extern const om_op_def om_op_sum_to_shape;
extern const om_op_def om_op_dropout_grad;

static const om_op_def *const op_table[] = {
    &om_op_matmul,
    &om_op_gemm,
    &om_op_fused_matmul,
    &om_op_matmul_grad,
    &om_op_softmax,
    &om_op_log_softmax,
    &om_op_softmax_grad,
    &om_op_log_softmax_grad,
    &om_op_layer_norm,
    &om_op_layer_norm_grad,
    &om_op_softmax_cross_entropy_loss,
    &om_op_softmax_cross_entropy_loss_grad,
    &om_op_nll_loss,
    &om_op_nll_loss_grad,
    &om_op_shape,
    &om_op_size,
    &om_op_constant,
    &om_op_constant_of_shape,
    &om_op_reshape,
    &om_op_flatten,
    &om_op_squeeze,
    &om_op_unsqueeze,
    &om_op_transpose,
    &om_op_gather,
    &om_op_gather_grad,
    &om_op_concat,
    &om_op_concat_grad,
    &om_op_slice,
    &om_op_slice_grad,
    &om_op_expand,
    &om_op_range,
    &om_op_split,
    &om_op_split_grad,
    &om_op_reduce_sum,
    &om_op_reduce_mean,
    &om_op_reduce_max,
    &om_op_reduce_min,
    &om_op_reduce_prod,
    &om_op_reduce_grad,
    &om_op_reduce_min_max_grad,
    &om_op_add,
    &om_op_sub,
    &om_op_mul,
    &om_op_div,
    &om_op_pow,
    &om_op_max,
    &om_op_min,
    &om_op_neg,
    &om_op_relu,
    &om_op_abs,
    &om_op_tanh,
    &om_op_sigmoid,
    &om_op_gelu,
    &om_op_erf,
    &om_op_sqrt,
    &om_op_exp,
    &om_op_log,
    &om_op_reciprocal,
    &om_op_relu_grad,
    &om_op_tanh_grad,
    &om_op_sigmoid_grad,
    &om_op_abs_grad,
    &om_op_gelu_grad,
    &om_op_equal,
    &om_op_where,
    &om_op_identity,
    &om_op_cast,
    &om_op_dropout,
    &om_op_sum_to_shape,
    &om_op_dropout_grad,
};

const om_op_def *om_op_find(const char *name, const char *domain) {
    if (!domain) domain = "";
    if (strcmp(domain, "ai.onnx") == 0) domain = "";
    for (size_t i = 0; i < sizeof op_table / sizeof op_table[0]; i++)
        if (strcmp(op_table[i]->name, name) == 0 &&
            (strcmp(op_table[i]->domain, domain) == 0 || (strcmp(domain, "com.microsoft") == 0 && strcmp(op_table[i]->domain, "ortmod") == 0)))
            return op_table[i];
    return NULL;
}

int om_op_count(void) { return (int)(sizeof op_table / sizeof op_table[0]); }
const om_op_def *om_op_at(int i) { return i >= 0 && i < om_op_count() ? op_table[i] : NULL; }
