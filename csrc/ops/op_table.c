/* op_table.c — the one table of ops. Every other part of the engine finds ops here, by
 * name and domain. One line per op, grouped by the family file that defines it: adding an
 * op is its definition in the family file plus one line here. */
#include "ops/op.h"

#define OM_OPS(X) \
    /* elementwise.c */ \
    X(om_op_add) \
    X(om_op_sub) \
    X(om_op_mul) \
    X(om_op_div) \
    X(om_op_pow) \
    X(om_op_max) \
    X(om_op_min) \
    X(om_op_equal) \
    X(om_op_where) \
    X(om_op_neg) \
    X(om_op_relu) \
    X(om_op_tanh) \
    X(om_op_sigmoid) \
    X(om_op_gelu) \
    X(om_op_erf) \
    X(om_op_sqrt) \
    X(om_op_exp) \
    X(om_op_log) \
    X(om_op_reciprocal) \
    X(om_op_abs) \
    X(om_op_sin) \
    X(om_op_cos) \
    X(om_op_sign) \
    X(om_op_mod) \
    X(om_op_identity) \
    X(om_op_stop_gradient) \
    X(om_op_cast) \
    X(om_op_dropout) \
    X(om_op_sum_to_shape) \
    X(om_op_relu_grad) \
    X(om_op_gelu_grad) \
    X(om_op_tanh_grad) \
    X(om_op_sigmoid_grad) \
    X(om_op_abs_grad) \
    X(om_op_dropout_grad) \
    /* loss.c */ \
    X(om_op_softmax_cross_entropy_loss) \
    X(om_op_softmax_cross_entropy_loss_grad) \
    X(om_op_nll_loss) \
    X(om_op_nll_loss_grad) \
    /* matmul.c */ \
    X(om_op_matmul) \
    X(om_op_gemm) \
    X(om_op_fused_matmul) \
    X(om_op_matmul_grad) \
    /* nn.c */ \
    X(om_op_softmax) \
    X(om_op_log_softmax) \
    X(om_op_softmax_grad) \
    X(om_op_log_softmax_grad) \
    X(om_op_layer_norm) \
    X(om_op_layer_norm_grad) \
    /* reduce.c */ \
    X(om_op_reduce_sum) \
    X(om_op_reduce_mean) \
    X(om_op_reduce_max) \
    X(om_op_reduce_min) \
    X(om_op_reduce_prod) \
    X(om_op_reduce_grad) \
    X(om_op_reduce_min_max_grad) \
    /* shape.c */ \
    X(om_op_shape) \
    X(om_op_size) \
    X(om_op_constant) \
    X(om_op_constant_of_shape) \
    X(om_op_reshape) \
    X(om_op_flatten) \
    X(om_op_squeeze) \
    X(om_op_unsqueeze) \
    X(om_op_transpose) \
    X(om_op_gather) \
    X(om_op_gather_grad) \
    X(om_op_concat) \
    X(om_op_concat_grad) \
    X(om_op_slice) \
    X(om_op_slice_grad) \
    X(om_op_expand) \
    X(om_op_range) \
    X(om_op_split) \
    X(om_op_split_grad) \
    /* conv.c */ \
    X(om_op_conv) \
    X(om_op_conv_grad_x) \
    X(om_op_conv_grad_w) \
    /* norm.c */ \
    X(om_op_batch_norm) \
    X(om_op_batch_norm_grad) \
    /* pool.c */ \
    X(om_op_max_pool) \
    X(om_op_max_pool_grad) \
    X(om_op_average_pool) \
    X(om_op_average_pool_grad) \
    X(om_op_global_average_pool) \
    X(om_op_global_max_pool) \
    X(om_op_global_pool_grad) \
    /* fused.c */ \
    X(om_op_matmul_bias) \
    X(om_op_matmul_bias_grad) \
    X(om_op_bias_gelu) \
    X(om_op_bias_gelu_grad) \
    X(om_op_matmul_bias_gelu) \
    X(om_op_bias_dropout) \
    X(om_op_bias_dropout_grad) \
    X(om_op_simplified_layer_norm) \
    X(om_op_simplified_layer_norm_grad) \
    /* attention.c */ \
    X(om_op_fused_attention) \
    X(om_op_fused_attention_grad) \
    /* misc.c */ \
    X(om_op_less) \
    X(om_op_greater) \
    X(om_op_less_or_equal) \
    X(om_op_greater_or_equal) \
    X(om_op_and) \
    X(om_op_or) \
    X(om_op_xor) \
    X(om_op_not) \
    X(om_op_is_nan) \
    X(om_op_is_inf) \
    X(om_op_clip) \
    X(om_op_clip_grad) \
    X(om_op_leaky_relu) \
    X(om_op_softplus) \
    X(om_op_elu) \
    X(om_op_selu) \
    X(om_op_hard_sigmoid) \
    X(om_op_hard_swish) \
    X(om_op_mish) \
    X(om_op_softsign) \
    X(om_op_activation_grad) \
    X(om_op_tile) \
    X(om_op_tile_grad) \
    X(om_op_trilu) \
    X(om_op_pad) \
    X(om_op_pad_grad) \
    X(om_op_einsum) \
    /* scan.c */ \
    X(om_op_cumsum) \
    X(om_op_gather_elements) \
    X(om_op_gather_elements_grad) \
    X(om_op_scatter_elements) \
    /* rnn.c */ \
    X(om_op_lstm) \
    X(om_op_gru) \
    X(om_op_lstm_grad) \
    X(om_op_gru_grad) \
    /* callback.c */ \
    X(om_op_python_op) \
    X(om_op_python_op_grad) \
    /* end */

#define OM_DECLARE(sym) extern const om_op_def sym;
OM_OPS(OM_DECLARE)

#define OM_ENTRY(sym) &sym,
static const om_op_def *const op_table[] = {OM_OPS(OM_ENTRY)};

const om_op_def *om_op_find(const char *name, const char *domain) {
    if (!domain || strcmp(domain, "ai.onnx") == 0) domain = "";
    /* ORT exports its contrib ops under com.microsoft; ours of the same name serve them */
    int ms = strcmp(domain, "com.microsoft") == 0;
    for (size_t i = 0; i < sizeof op_table / sizeof op_table[0]; i++)
        if (strcmp(op_table[i]->name, name) == 0 &&
            (strcmp(op_table[i]->domain, domain) == 0 || (ms && strcmp(op_table[i]->domain, "ortmod") == 0)))
            return op_table[i];
    return NULL;
}

int om_op_count(void) { return (int)(sizeof op_table / sizeof op_table[0]); }
const om_op_def *om_op_at(int i) { return i >= 0 && i < om_op_count() ? op_table[i] : NULL; }
