/* op_list.h — the one list of ops, for both devices. csrc/ops/op_table.c (C) expands it into
 * the engine's op table and cuda/provider.cu (C++) into the CUDA provider's kernel table, so an
 * op is added once, here, for both:
 *
 *     OP(om_op_add, "Add", "", add_cuda)
 *        |          |      |   +-- its CUDA kernel: a function of cuda/<family>.cu
 *        |          |      +------ domain: "" for ONNX, "ortmod" for internal ops
 *        |          +------------- name, as the om_op_def spells it (tests/test_op_registry.py)
 *        +------------------------ its om_op_def, defined in csrc/ops/<family>.c
 *
 *     HOST_OP(om_op_constant, "Constant", "", "why it needs no CUDA kernel")
 *
 * The list also generates each op's id (om_op_id, below: om_op_add -> om_op_add_id), by which
 * gradient rules emit and passes match ops, and OM_OP_CHEAP_LIST names the ops recompute may run
 * twice. A new op's rule emits `om_emit2(c, om_op_add_id, a, b)`, never a name: the ONNX import
 * is what reads names (tests/test_op_ids.py).
 *
 * The CUDA provider links with --no-undefined, so an OP whose kernel is missing (or still
 * `static` in its .cu) fails the provider's build. An op without a CUDA kernel is a HOST_OP,
 * with the reason `python scripts/ops.py` prints. Ops are grouped under a comment naming
 * their family (csrc/ops/<family>.c, whose CUDA kernels are in cuda/<family>.cu); the order is
 * the op table's (ortmod._C.op_table(), docs/models.md's ops table). */
#ifndef OM_OP_LIST_H
#define OM_OP_LIST_H

#define OM_OP_LIST(OP, HOST_OP) \
    /* elementwise.c */ \
    OP(om_op_add, "Add", "", add_cuda) \
    OP(om_op_sub, "Sub", "", sub_cuda) \
    OP(om_op_mul, "Mul", "", mul_cuda) \
    OP(om_op_div, "Div", "", div_cuda) \
    OP(om_op_pow, "Pow", "", pow_cuda) \
    OP(om_op_max, "Max", "", max_cuda) \
    OP(om_op_min, "Min", "", min_cuda) \
    OP(om_op_prelu, "PRelu", "", prelu_cuda) \
    OP(om_op_equal, "Equal", "", equal_cuda) \
    OP(om_op_where, "Where", "", where_cuda) \
    OP(om_op_neg, "Neg", "", neg_cuda) \
    OP(om_op_relu, "Relu", "", relu_cuda) \
    OP(om_op_tanh, "Tanh", "", tanh_cuda) \
    OP(om_op_sigmoid, "Sigmoid", "", sigmoid_cuda) \
    OP(om_op_gelu, "Gelu", "", gelu_cuda) \
    OP(om_op_erf, "Erf", "", erf_cuda) \
    OP(om_op_sqrt, "Sqrt", "", sqrt_cuda) \
    OP(om_op_exp, "Exp", "", exp_cuda) \
    OP(om_op_log, "Log", "", log_cuda) \
    OP(om_op_reciprocal, "Reciprocal", "", reciprocal_cuda) \
    OP(om_op_abs, "Abs", "", abs_cuda) \
    OP(om_op_sin, "Sin", "", sin_cuda) \
    OP(om_op_cos, "Cos", "", cos_cuda) \
    OP(om_op_sign, "Sign", "", sign_cuda) \
    OP(om_op_floor, "Floor", "", floor_cuda) \
    OP(om_op_ceil, "Ceil", "", ceil_cuda) \
    OP(om_op_round, "Round", "", round_cuda) \
    OP(om_op_mod, "Mod", "", mod_cuda) \
    OP(om_op_identity, "Identity", "", identity_cuda) \
    OP(om_op_stop_gradient, "StopGradient", "ortmod", identity_cuda) \
    OP(om_op_cast, "Cast", "", cast_cuda) \
    OP(om_op_dropout, "Dropout", "", dropout_cuda) \
    OP(om_op_sum_to_shape, "SumToShape", "ortmod", sum_to_shape_cuda) \
    OP(om_op_relu_grad, "ReluGrad", "ortmod", relu_grad_cuda) \
    OP(om_op_gelu_grad, "GeluGrad", "ortmod", gelu_grad_cuda) \
    OP(om_op_tanh_grad, "TanhGrad", "ortmod", tanh_grad_cuda) \
    OP(om_op_sigmoid_grad, "SigmoidGrad", "ortmod", sigmoid_grad_cuda) \
    OP(om_op_abs_grad, "AbsGrad", "ortmod", abs_grad_cuda) \
    OP(om_op_dropout_grad, "DropoutGrad", "ortmod", dropout_grad_cuda) \
    /* loss.c */ \
    OP(om_op_softmax_cross_entropy_loss, "SoftmaxCrossEntropyLoss", "", sce_cuda) \
    OP(om_op_softmax_cross_entropy_loss_grad, "SoftmaxCrossEntropyLossGrad", "ortmod", sce_grad_cuda) \
    OP(om_op_nll_loss, "NegativeLogLikelihoodLoss", "", nll_cuda) \
    OP(om_op_nll_loss_grad, "NegativeLogLikelihoodLossGrad", "ortmod", nll_grad_cuda) \
    /* matmul.c */ \
    OP(om_op_matmul, "MatMul", "", matmul_cuda) \
    OP(om_op_gemm, "Gemm", "", gemm_cuda) \
    OP(om_op_fused_matmul, "FusedMatMul", "ortmod", matmul_cuda) \
    OP(om_op_matmul_grad, "MatMulGrad", "ortmod", matmul_grad_cuda) \
    /* nn.c */ \
    OP(om_op_softmax, "Softmax", "", softmax_cuda) \
    OP(om_op_log_softmax, "LogSoftmax", "", log_softmax_cuda) \
    OP(om_op_softmax_grad, "SoftmaxGrad", "ortmod", softmax_grad_cuda) \
    OP(om_op_log_softmax_grad, "LogSoftmaxGrad", "ortmod", log_softmax_grad_cuda) \
    OP(om_op_layer_norm, "LayerNormalization", "", layer_norm_cuda) \
    OP(om_op_layer_norm_grad, "LayerNormalizationGrad", "ortmod", layer_norm_grad_cuda) \
    /* reduce.c */ \
    OP(om_op_reduce_sum, "ReduceSum", "", reduce_sum_cuda) \
    OP(om_op_reduce_mean, "ReduceMean", "", reduce_mean_cuda) \
    OP(om_op_reduce_max, "ReduceMax", "", reduce_max_cuda) \
    OP(om_op_reduce_min, "ReduceMin", "", reduce_min_cuda) \
    OP(om_op_reduce_prod, "ReduceProd", "", reduce_prod_cuda) \
    OP(om_op_reduce_l1, "ReduceL1", "", reduce_l1_cuda) \
    OP(om_op_reduce_l2, "ReduceL2", "", reduce_l2_cuda) \
    OP(om_op_reduce_sum_square, "ReduceSumSquare", "", reduce_sum_square_cuda) \
    OP(om_op_reduce_log_sum_exp, "ReduceLogSumExp", "", reduce_log_sum_exp_cuda) \
    OP(om_op_reduce_value_grad, "ReduceValueGrad", "ortmod", reduce_value_grad_cuda) \
    OP(om_op_reduce_grad, "ReduceGrad", "ortmod", reduce_grad_cuda) \
    OP(om_op_reduce_min_max_grad, "ReduceMinMaxGrad", "ortmod", reduce_min_max_grad_cuda) \
    OP(om_op_arg_max, "ArgMax", "", arg_max_cuda) \
    OP(om_op_arg_min, "ArgMin", "", arg_min_cuda) \
    /* topk.c */ \
    OP(om_op_topk, "TopK", "", select_cuda) \
    OP(om_op_sort, "Sort", "ortmod", select_cuda) \
    /* shape.c */ \
    OP(om_op_shape, "Shape", "", shape_cuda) \
    OP(om_op_size, "Size", "", size_cuda) \
    HOST_OP(om_op_constant, "Constant", "", "no inputs: every plan folds it on the host") \
    HOST_OP(om_op_constant_of_shape, "ConstantOfShape", "", "output shape = input values: always folded on the host") \
    OP(om_op_reshape, "Reshape", "", view_cuda) \
    OP(om_op_flatten, "Flatten", "", view_cuda) \
    OP(om_op_squeeze, "Squeeze", "", view_cuda) \
    OP(om_op_unsqueeze, "Unsqueeze", "", view_cuda) \
    OP(om_op_transpose, "Transpose", "", transpose_cuda) \
    OP(om_op_gather, "Gather", "", gather_cuda) \
    OP(om_op_gather_grad, "GatherGrad", "ortmod", gather_grad_cuda) \
    OP(om_op_concat, "Concat", "", concat_cuda) \
    OP(om_op_concat_grad, "ConcatGrad", "ortmod", concat_grad_cuda) \
    OP(om_op_slice, "Slice", "", slice_cuda) \
    OP(om_op_slice_grad, "SliceGrad", "ortmod", slice_grad_cuda) \
    OP(om_op_expand, "Expand", "", expand_cuda) \
    HOST_OP(om_op_range, "Range", "", "output shape = input values: always folded on the host") \
    OP(om_op_split, "Split", "", split_cuda) \
    OP(om_op_split_grad, "SplitGrad", "ortmod", split_grad_cuda) \
    /* conv.c */ \
    OP(om_op_conv, "Conv", "", conv_cuda) \
    OP(om_op_conv_grad_x, "ConvGradX", "ortmod", conv_grad_x_cuda) \
    OP(om_op_conv_grad_w, "ConvGradW", "ortmod", conv_grad_w_cuda) \
    OP(om_op_conv_transpose, "ConvTranspose", "", conv_transpose_cuda) \
    /* norm.c */ \
    OP(om_op_batch_norm, "BatchNormalization", "", batch_norm_cuda) \
    OP(om_op_batch_norm_grad, "BatchNormalizationGrad", "ortmod", batch_norm_grad_cuda) \
    OP(om_op_batch_norm_relu, "BatchNormRelu", "ortmod", batch_norm_relu_cuda) \
    OP(om_op_batch_norm_relu_grad, "BatchNormReluGrad", "ortmod", batch_norm_relu_grad_cuda) \
    /* pool.c */ \
    OP(om_op_max_pool, "MaxPool", "", max_pool_cuda) \
    OP(om_op_max_pool_grad, "MaxPoolGrad", "ortmod", max_pool_grad_cuda) \
    OP(om_op_average_pool, "AveragePool", "", average_pool_cuda) \
    OP(om_op_average_pool_grad, "AveragePoolGrad", "ortmod", average_pool_grad_cuda) \
    OP(om_op_global_average_pool, "GlobalAveragePool", "", global_pool_cuda) \
    OP(om_op_global_max_pool, "GlobalMaxPool", "", global_pool_cuda) \
    OP(om_op_global_pool_grad, "GlobalPoolGrad", "ortmod", global_pool_grad_cuda) \
    /* fused.c */ \
    OP(om_op_matmul_bias, "MatMulBias", "ortmod", matmul_bias_cuda) \
    OP(om_op_matmul_bias_grad, "MatMulBiasGrad", "ortmod", matmul_bias_grad_cuda) \
    OP(om_op_bias_gelu, "BiasGelu", "ortmod", bias_gelu_cuda) \
    OP(om_op_bias_gelu_grad, "BiasGeluGrad", "ortmod", bias_gelu_grad_cuda) \
    OP(om_op_matmul_bias_gelu, "MatMulBiasGelu", "ortmod", matmul_bias_gelu_cuda) \
    OP(om_op_bias_dropout, "BiasDropout", "ortmod", bias_dropout_cuda) \
    OP(om_op_bias_dropout_grad, "BiasDropoutGrad", "ortmod", bias_dropout_grad_cuda) \
    OP(om_op_simplified_layer_norm, "SimplifiedLayerNormalization", "ortmod", rms_norm_cuda) \
    OP(om_op_simplified_layer_norm_grad, "SimplifiedLayerNormalizationGrad", "ortmod", rms_norm_grad_cuda) \
    /* fused_llama.c */ \
    OP(om_op_swiglu, "SwiGLU", "ortmod", swiglu_cuda) \
    OP(om_op_swiglu_grad, "SwiGLUGrad", "ortmod", swiglu_grad_cuda) \
    OP(om_op_fused_rotary, "FusedRotary", "ortmod", fused_rotary_cuda) \
    OP(om_op_fused_rotary_grad, "FusedRotaryGrad", "ortmod", fused_rotary_grad_cuda) \
    /* attention.c */ \
    OP(om_op_fused_attention, "FusedAttention", "ortmod", attention_cuda) \
    OP(om_op_fused_attention_grad, "FusedAttentionGrad", "ortmod", attention_grad_cuda) \
    /* misc.c */ \
    OP(om_op_less, "Less", "", less_cuda) \
    OP(om_op_greater, "Greater", "", greater_cuda) \
    OP(om_op_less_or_equal, "LessOrEqual", "", less_equal_cuda) \
    OP(om_op_greater_or_equal, "GreaterOrEqual", "", greater_equal_cuda) \
    OP(om_op_and, "And", "", and_cuda) \
    OP(om_op_or, "Or", "", or_cuda) \
    OP(om_op_xor, "Xor", "", xor_cuda) \
    OP(om_op_not, "Not", "", not_cuda) \
    OP(om_op_is_nan, "IsNaN", "", is_nan_cuda) \
    OP(om_op_is_inf, "IsInf", "", is_inf_cuda) \
    OP(om_op_clip, "Clip", "", clip_cuda) \
    OP(om_op_clip_grad, "ClipGrad", "ortmod", clip_grad_cuda) \
    OP(om_op_hard_tanh, "HardTanh", "ortmod", clip_cuda) \
    OP(om_op_leaky_relu, "LeakyRelu", "", activation_cuda) \
    OP(om_op_softplus, "Softplus", "", activation_cuda) \
    OP(om_op_elu, "Elu", "", activation_cuda) \
    OP(om_op_selu, "Selu", "", activation_cuda) \
    OP(om_op_hard_sigmoid, "HardSigmoid", "", activation_cuda) \
    OP(om_op_hard_swish, "HardSwish", "", activation_cuda) \
    OP(om_op_mish, "Mish", "", activation_cuda) \
    OP(om_op_softsign, "Softsign", "", activation_cuda) \
    OP(om_op_celu, "Celu", "", activation_cuda) \
    OP(om_op_activation_grad, "ActivationGrad", "ortmod", activation_grad_cuda) \
    OP(om_op_tile, "Tile", "", tile_cuda) \
    OP(om_op_tile_grad, "TileGrad", "ortmod", tile_grad_cuda) \
    OP(om_op_trilu, "Trilu", "", trilu_cuda) \
    OP(om_op_pad, "Pad", "", pad_cuda) \
    OP(om_op_pad_grad, "PadGrad", "ortmod", pad_grad_cuda) \
    OP(om_op_einsum, "Einsum", "", einsum_cuda) \
    /* scan.c */ \
    OP(om_op_cumsum, "CumSum", "", cumsum_cuda) \
    OP(om_op_gather_elements, "GatherElements", "", gather_elements_cuda) \
    OP(om_op_gather_elements_grad, "GatherElementsGrad", "ortmod", gather_elements_grad_cuda) \
    OP(om_op_scatter_elements, "ScatterElements", "", scatter_elements_cuda) \
    /* gather_nd.c */ \
    OP(om_op_gather_nd, "GatherND", "", gather_nd_cuda) \
    OP(om_op_gather_nd_grad, "GatherNDGrad", "ortmod", gather_nd_grad_cuda) \
    OP(om_op_scatter_nd, "ScatterND", "", scatter_nd_cuda) \
    /* rnn.c */ \
    OP(om_op_lstm, "LSTM", "", lstm_cuda) \
    OP(om_op_gru, "GRU", "", gru_cuda) \
    OP(om_op_rnn, "RNN", "", elman_cuda) \
    OP(om_op_lstm_grad, "LSTMGrad", "ortmod", lstm_grad_cuda) \
    OP(om_op_gru_grad, "GRUGrad", "ortmod", gru_grad_cuda) \
    OP(om_op_rnn_grad, "RNNGrad", "ortmod", elman_grad_cuda) \
    /* callback.c */ \
    HOST_OP(om_op_python_op, "PythonOp", "ortmod", "callback: the client runs it on device pointers") \
    HOST_OP(om_op_python_op_grad, "PythonOpGrad", "ortmod", "callback: the client runs it on device pointers") \
    /* ctc.c */ \
    OP(om_op_ctc_loss, "CTCLoss", "ortmod", ctc_cuda) \
    OP(om_op_ctc_loss_grad, "CTCLossGrad", "ortmod", ctc_grad_cuda) \
    /* nonzero.c */ \
    HOST_OP(om_op_nonzero, "NonZero", "", "data-dependent size: the CUDA executor refuses such graphs by name") \
    OP(om_op_one_hot, "OneHot", "", one_hot_cuda) \
    /* end */

/* The ops cheap enough to run twice and whose results are as large as their inputs: what
 * level-1 recompute (plan/recompute.c) clones into the backward instead of keeping alive.
 * Listed by symbol, so a misspelling fails to compile; om_op_cheap(id) reads it. */
#define OM_OP_CHEAP_LIST(X) \
    X(om_op_gelu) X(om_op_relu) X(om_op_tanh) X(om_op_sigmoid) X(om_op_add) X(om_op_sub) X(om_op_mul) \
    X(om_op_div) X(om_op_neg) X(om_op_erf) X(om_op_sqrt) X(om_op_cast) X(om_op_layer_norm) \
    X(om_op_transpose) X(om_op_reshape) X(om_op_flatten) X(om_op_squeeze) X(om_op_unsqueeze) \
    X(om_op_identity) X(om_op_expand) X(om_op_where) X(om_op_bias_gelu) X(om_op_leaky_relu) \
    X(om_op_softplus) X(om_op_simplified_layer_norm) X(om_op_swiglu) X(om_op_fused_rotary)

/* Every op's id: its om_op_def's symbol with _id (om_op_mul -> om_op_mul_id), its index in the
 * op table. Gradient rules emit and passes match by id, so a misspelled op is an undeclared
 * identifier at compile time rather than an "unsupported op" in whichever model first reaches
 * it; the id also carries the domain ("Gelu" and an "ortmod" op of a like name are two ids).
 * Names (strings) are for the ONNX import and for messages. OM_OP_NONE is no op. */
typedef enum om_op_id {
    OM_OP_NONE = -1,
#define OM_OP_ID_(sym, ...) sym##_id,
    OM_OP_LIST(OM_OP_ID_, OM_OP_ID_)
#undef OM_OP_ID_
    OM_OP_COUNT
} om_op_id;

#endif
