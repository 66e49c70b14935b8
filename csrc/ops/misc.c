/* misc.c — the rest of what exports emit: comparisons and logic, Clip, activations, Tile,
 * Trilu, Pad, Einsum, and their backward ops.
 *
 * Exports:
 *   om_op_less              Less               a <  b -> bool   (broadcast; floats, i32, i64)
 *   om_op_greater           Greater            a >  b -> bool
 *   om_op_less_or_equal     LessOrEqual        a <= b -> bool
 *   om_op_greater_or_equal  GreaterOrEqual     a >= b -> bool
 *   om_op_and               And                bool, broadcast
 *   om_op_or                Or
 *   om_op_xor               Xor
 *   om_op_not               Not
 *   om_op_is_nan            IsNaN              float -> bool
 *   om_op_is_inf            IsInf              float -> bool (detect_negative, detect_positive)
 *   om_op_clip              Clip               (x, min?, max?)  f32 f64 i32 i64
 *   om_op_clip_grad         ClipGrad           (domain ortmod)  (dy, x, min?, max?) -> dy where min <= x <= max
 *                                              (exclusive=1: 0 where x <= min or x >= max, dy elsewhere, NaN too)
 *   om_op_hard_tanh         HardTanh           (domain ortmod)  (x, min, max): Clip, with hardtanh's gradient
 *   om_op_leaky_relu        LeakyRelu          alpha
 *   om_op_softplus          Softplus
 *   om_op_elu               Elu                alpha
 *   om_op_selu              Selu               alpha, gamma
 *   om_op_hard_sigmoid      HardSigmoid        alpha, beta
 *   om_op_celu              Celu               alpha
 *   om_op_hard_swish        HardSwish
 *   om_op_mish              Mish
 *   om_op_softsign          Softsign
 *   om_op_activation_grad   ActivationGrad     (domain ortmod)  (dy, x; activation, alpha, beta, gamma) -> dx
 *   om_op_tile              Tile               (x, repeats)     any dtype
 *   om_op_tile_grad         TileGrad           (domain ortmod)  (dy, Shape(x)) -> dx (sum over the tiles)
 *   om_op_trilu             Trilu              (x, k?; upper)   any dtype; its gradient is Trilu(dy)
 *   om_op_pad               Pad                (x, pads, value?, axes?; mode constant|reflect|edge|wrap)
 *   om_op_pad_grad          PadGrad            (domain ortmod)  (dy, Shape(x), pads, axes?; mode) -> dx
 *   om_op_einsum            Einsum             1 or 2 operands, ellipsis; permute + reshape + batched GEMM
 *
 * Shape-carrying inputs (Tile's repeats, Pad's pads and axes) must be known at plan time:
 * exports compute them from Shape/Constant, which the planner folds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/broadcast.h"
#include "ops/op_util.h"
#include "ops/einsum_geom.h"
#include "ops/pad_geom.h"
#include "ops/gemm.h"
#include "ops/op.h"

#define MISC_FLOAT(dt, node, i, ...)                                            \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    default: return om_err_dtype((node), (i), (dt));                            \
    }

#define MISC_ARITH(dt, node, i, ...)                                            \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    case OM_I32: { typedef int32_t T; __VA_ARGS__; } break;                     \
    case OM_I64: { typedef int64_t T; __VA_ARGS__; } break;                     \
    default: return om_err_dtype((node), (i), (dt));                            \
    }

#define EMIT_OK(v) do { if ((v) < 0) return NULL; } while (0)

static om_dtype dtype_bool(const om_graph *g, const om_node *n, int j) { return OM_BOOL; }
/* what the shape rules take (fp16/bf16 too); the CPU kernels dispatch f32/f64 (and ints) */
static int is_float(om_dtype d) { return om_dtype_is_float(d); }
static int is_arith(om_dtype d) { return om_dtype_in(d, OM_DT_ARITH); }

static om_status *need_known(const om_node *n, const om_tensor *t, int i, int64_t *vals, int max, int *count) {
    *count = om_read_ints(t, vals, max);
    if (*count < 0)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d must be int64 values known at plan time "
                        "(at most %d)", n->op->name, om_node_name(n), i, max);
    return NULL;
}

/* ---- comparisons and logic ------------------------------------------------------------ */

static om_status *infer_compare(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    if (!is_arith(ctx->in[0].dtype)) return om_err_dtype(n, 0, ctx->in[0].dtype);
    if (ctx->in[1].dtype != ctx->in[0].dtype) return om_err_dtype(n, 1, ctx->in[1].dtype);
    om_status *st = om_broadcast_shape(&ctx->in[0], &ctx->in[1], &ctx->out[0]);
    if (st) return om_error_context(st, "%s node '%s'", n->op->name, om_node_name(n));
    ctx->out[0].dtype = OM_BOOL;
    return NULL;
}

static om_status *infer_logic(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    for (int i = 0; i < ctx->n_in; i++)
        if (ctx->in[i].dtype != OM_BOOL) return om_err_dtype(n, i, ctx->in[i].dtype);
    if (ctx->n_in == 1) {
        om_set_shape(&ctx->out[0], &ctx->in[0], OM_BOOL);
        return NULL;
    }
    om_status *st = om_broadcast_shape(&ctx->in[0], &ctx->in[1], &ctx->out[0]);
    if (st) return om_error_context(st, "%s node '%s'", n->op->name, om_node_name(n));
    ctx->out[0].dtype = OM_BOOL;
    return NULL;
}

#define COMPARE_KERNEL(fname, OPEXPR)                                                         \
    static om_status *fname(om_kernel_ctx *ctx) {                                             \
        om_bcast p;                                                                           \
        const om_tensor *ops[3] = {&ctx->out[0], &ctx->in[0], &ctx->in[1]};                   \
        OM_TRY(om_bcast_init(&p, ctx->node, &ctx->out[0], ops, 3));                           \
        MISC_ARITH(ctx->in[0].dtype, ctx->node, 0,                                            \
                   OM_BINARY_LOOP(&p, uint8_t, ctx->out[0].data, T, ctx->in[0].data, T,       \
                                  ctx->in[1].data, OPEXPR));                                  \
        return NULL;                                                                          \
    }

COMPARE_KERNEL(less_cpu, x < y)
COMPARE_KERNEL(greater_cpu, x > y)
COMPARE_KERNEL(less_equal_cpu, x <= y)
COMPARE_KERNEL(greater_equal_cpu, x >= y)

#define LOGIC_KERNEL(fname, OPEXPR)                                                           \
    static om_status *fname(om_kernel_ctx *ctx) {                                             \
        om_bcast p;                                                                           \
        const om_tensor *ops[3] = {&ctx->out[0], &ctx->in[0], &ctx->in[1]};                   \
        OM_TRY(om_bcast_init(&p, ctx->node, &ctx->out[0], ops, 3));                           \
        OM_BINARY_LOOP(&p, uint8_t, ctx->out[0].data, uint8_t, ctx->in[0].data, uint8_t,      \
                       ctx->in[1].data, OPEXPR);                                              \
        return NULL;                                                                          \
    }

LOGIC_KERNEL(and_cpu, (x != 0) & (y != 0))
LOGIC_KERNEL(or_cpu, (x != 0) | (y != 0))
LOGIC_KERNEL(xor_cpu, (x != 0) ^ (y != 0))

// x, y are (n) bool
static om_status *not_cpu(om_kernel_ctx *ctx) {
    const uint8_t *restrict x = ctx->in[0].data;
    uint8_t *restrict y = ctx->out[0].data;
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    for (int64_t i = 0; i < n; i++) y[i] = !x[i];
    return NULL;
}

static om_status *infer_float_to_bool(om_kernel_ctx *ctx) {
    if (!is_float(ctx->in[0].dtype)) return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    om_set_shape(&ctx->out[0], &ctx->in[0], OM_BOOL);
    return NULL;
}

// x is (n) float, y is (n) bool
static om_status *is_nan_cpu(om_kernel_ctx *ctx) {
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    uint8_t *restrict y = ctx->out[0].data;
    MISC_FLOAT(ctx->in[0].dtype, ctx->node, 0, {
        const T *restrict x = ctx->in[0].data;
        for (int64_t i = 0; i < n; i++) y[i] = x[i] != x[i];
    });
    return NULL;
}

static om_status *is_inf_cpu(om_kernel_ctx *ctx) {
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    const int neg = om_attr_int(ctx->node, "detect_negative", 1) != 0;
    const int pos = om_attr_int(ctx->node, "detect_positive", 1) != 0;
    uint8_t *restrict y = ctx->out[0].data;
    MISC_FLOAT(ctx->in[0].dtype, ctx->node, 0, {
        const T *restrict x = ctx->in[0].data;
        for (int64_t i = 0; i < n; i++) y[i] = (pos && x[i] == (T)INFINITY) || (neg && x[i] == -(T)INFINITY);
    });
    return NULL;
}

/* ---- Clip ------------------------------------------------------------------------------ */

static om_status *clip_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    if (!is_arith(ctx->in[0].dtype)) return om_err_dtype(n, 0, ctx->in[0].dtype);
    int first = n->op_id == om_op_clip_grad_id;   /* ClipGrad: (dy, x, min?, max?) */
    for (int i = 1 + first; i < ctx->n_in; i++) {
        if (!om_in_present(ctx, i)) continue;
        if (ctx->in[i].dtype != ctx->in[first].dtype) return om_err_dtype(n, i, ctx->in[i].dtype);
        if (om_tensor_numel(&ctx->in[i]) != 1)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': min/max must be scalars", n->op->name, om_node_name(n));
    }
    om_set_shape(&ctx->out[0], &ctx->in[first], ctx->in[first].dtype);
    return NULL;
}

// x, y are (n); lo, hi scalars (absent: unbounded)
static om_status *clip_cpu(om_kernel_ctx *ctx) {
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    const int has_lo = om_in_present(ctx, 1), has_hi = om_in_present(ctx, 2);
    MISC_ARITH(ctx->in[0].dtype, ctx->node, 0, {
        const T *restrict x = ctx->in[0].data;
        T *restrict y = ctx->out[0].data;
        const T lo = has_lo ? *(const T *)ctx->in[1].data : 0, hi = has_hi ? *(const T *)ctx->in[2].data : 0;
        /* as numpy.clip: min first, then max (hi < lo gives hi everywhere) */
        for (int64_t i = 0; i < n; i++) {
            T v = x[i];
            if (has_lo) v = v < lo ? lo : v;
            if (has_hi) v = v > hi ? hi : v;
            y[i] = v;
        }
    });
    return NULL;
}

static om_status *clip_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int in[4] = {c->dy[0], n->in[0], n->n_in > 1 ? n->in[1] : -1, n->n_in > 2 ? n->in[2] : -1};
    int k = in[3] >= 0 ? 4 : in[2] >= 0 ? 3 : 2;
    EMIT_OK(c->dx[0] = om_emit(c, om_op_clip_grad_id, in, k));
    return NULL;
}

/* HardTanh (torch's hardtanh and relu6): Clip's forward; its gradient is hardtanh_backward's,
 * 0 at the bounds and dy at NaN, where torch.clamp's (Clip's) is dy at the bounds and 0 at NaN */
static om_status *hard_tanh_grad(om_grad_ctx *c) {
    OM_TRY(clip_grad(c));
    if (c->dx[0] >= 0) om_emit_attr_int(c, "exclusive", 1);
    return NULL;
}

// dy, x, dx are (n): dx = dy where lo <= x <= hi (as torch.clamp's backward), else 0;
// exclusive: dx = 0 where x <= lo or x >= hi, else dy (hardtanh_backward)
static om_status *clip_grad_cpu(om_kernel_ctx *ctx) {
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    const int has_lo = om_in_present(ctx, 2), has_hi = om_in_present(ctx, 3);
    const int exclusive = om_attr_int(ctx->node, "exclusive", 0) != 0;
    MISC_FLOAT(ctx->in[0].dtype, ctx->node, 0, {
        const T *restrict dy = ctx->in[0].data, *restrict x = ctx->in[1].data;
        T *restrict dx = ctx->out[0].data;
        const T lo = has_lo ? *(const T *)ctx->in[2].data : -(T)INFINITY;
        const T hi = has_hi ? *(const T *)ctx->in[3].data : (T)INFINITY;
        if (exclusive)
            for (int64_t i = 0; i < n; i++) dx[i] = x[i] <= lo || x[i] >= hi ? 0 : dy[i];
        else
            for (int64_t i = 0; i < n; i++) dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0;
    });
    return NULL;
}

/* ---- activations ------------------------------------------------------------------------
 * One forward kernel and one ActivationGrad for the family; the op is selected once per
 * call (a switch outside the loops), so each loop body is a plain expression. */

enum { ACT_LEAKY, ACT_SOFTPLUS, ACT_ELU, ACT_SELU, ACT_HARD_SIGMOID, ACT_HARD_SWISH, ACT_MISH, ACT_SOFTSIGN, ACT_CELU };

typedef struct act_params {
    int kind;
    double alpha, beta, gamma;
} act_params;

/* name: the op's (forward) or the grad node's "activation" attribute, which names its forward op */
static int act_kind(const char *name) {
    static const om_op_id ops[] = {om_op_leaky_relu_id, om_op_softplus_id, om_op_elu_id, om_op_selu_id, om_op_hard_sigmoid_id, om_op_hard_swish_id,
                                        om_op_mish_id, om_op_softsign_id, om_op_celu_id};
    for (int i = 0; i < (int)(sizeof ops / sizeof ops[0]); i++)
        if (strcmp(om_op_get(ops[i])->name, name) == 0) return i;
    return -1;
}

static om_status *act_read(const om_node *n, const char *name, act_params *p) {
    p->kind = act_kind(name);
    if (p->kind < 0) return om_err_unsupported(n, "activation");
    static const float dflt_alpha[] = {0.01f, 0, 1.0f, 1.67326319217681884765625f, 0.2f, 0, 0, 0, 1.0f};
    p->alpha = om_attr_float(n, "alpha", dflt_alpha[p->kind]);
    p->beta = om_attr_float(n, "beta", 0.5f);
    p->gamma = om_attr_float(n, "gamma", 1.05070102214813232421875f);
    return NULL;
}

static om_status *act_infer(om_kernel_ctx *ctx) {
    if (!is_float(ctx->in[0].dtype)) return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    for (int i = 1; i < ctx->n_in; i++)
        if (ctx->in[i].dtype != ctx->in[0].dtype || !om_shape_equal(&ctx->in[i], &ctx->in[0]))
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': inputs must match", ctx->node->op->name,
                            om_node_name(ctx->node));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

/* torch's form, x * clamp(x + 3, 0, 6) / 6: NaN propagates and -inf gives NaN, as in eager */
static inline double hard_swish_d(double v) {
    double m = v + 3;
    m = m < 0 ? 0 : m;
    m = m > 6 ? 6 : m;
    return v * m / 6;
}

#define ACT_LOOP(n, ...) for (int64_t i = 0; i < (n); i++) { const T v = x[i]; y[i] = (T)(__VA_ARGS__); }

// x, y are (n)
static om_status *act_cpu(om_kernel_ctx *ctx) {
    act_params p;
    OM_TRY(act_read(ctx->node, ctx->node->op->name, &p));
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    MISC_FLOAT(ctx->in[0].dtype, ctx->node, 0, {
        const T *restrict x = ctx->in[0].data;
        T *restrict y = ctx->out[0].data;
        const T a = (T)p.alpha, b = (T)p.beta, gm = (T)p.gamma;
        switch (p.kind) {
        case ACT_LEAKY: ACT_LOOP(n, v > 0 ? v : a * v); break;
        case ACT_SOFTPLUS: ACT_LOOP(n, v > 0 ? v + log1p(exp(-(double)v)) : log1p(exp((double)v))); break;
        case ACT_ELU: ACT_LOOP(n, v > 0 ? v : a * expm1((double)v)); break;
        case ACT_SELU: ACT_LOOP(n, v > 0 ? gm * v : gm * a * expm1((double)v)); break;
        case ACT_HARD_SIGMOID: ACT_LOOP(n, a * v + b < 0 ? 0 : a * v + b > 1 ? 1 : a * v + b); break;
        case ACT_HARD_SWISH: ACT_LOOP(n, hard_swish_d(v)); break;
        case ACT_MISH: ACT_LOOP(n, v * tanh(v > 0 ? v + log1p(exp(-(double)v)) : log1p(exp((double)v)))); break;
        case ACT_SOFTSIGN: ACT_LOOP(n, v / (1 + (v < 0 ? -v : v))); break;
        case ACT_CELU: ACT_LOOP(n, v <= 0 ? a * expm1((double)v / a) : v); break;   /* torch's elu form */
        }
    });
    return NULL;
}

static om_status *act_grad(om_grad_ctx *c) {
    const int node = c->node;
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    act_params p;
    om_status *st = act_read(&c->g->nodes[node], c->g->nodes[node].op->name, &p);
    if (st) return om_grad_fail(c, st);
    const char *name = c->g->nodes[node].op->name;   /* static string of the op def */
    EMIT_OK(c->dx[0] = om_emit2(c, om_op_activation_grad_id, c->dy[0], c->g->nodes[node].in[0]));
    om_status *s2 = om_node_set_string(c->g, om_emit_last(c), "activation", name);
    if (s2) return om_grad_fail(c, s2);
    om_emit_attr_float(c, "alpha", (float)p.alpha);
    om_emit_attr_float(c, "beta", (float)p.beta);
    om_emit_attr_float(c, "gamma", (float)p.gamma);
    return NULL;
}

/* dx from (g, v) = (dy, x). Each is eager's formula in eager's form: a select where torch
 * selects (ELU's, HardSigmoid's and HardSwish's backward: a NaN x takes the branch its
 * comparison fails into, a NaN or inf dy outside the active range gives 0), a product where
 * torch multiplies. */
#define ACT_GRAD_LOOP(n, ...) \
    for (int64_t i = 0; i < (n); i++) { const T v = x[i], g = dy[i]; dx[i] = (T)(__VA_ARGS__); }

static inline double sigmoid_d(double v) { return v >= 0 ? 1 / (1 + exp(-v)) : exp(v) / (1 + exp(v)); }

// dy, x, dx are (n)
static om_status *act_grad_cpu(om_kernel_ctx *ctx) {
    act_params p;
    OM_TRY(act_read(ctx->node, om_attr_string(ctx->node, "activation", ""), &p));
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    MISC_FLOAT(ctx->in[0].dtype, ctx->node, 0, {
        const T *restrict dy = ctx->in[0].data, *restrict x = ctx->in[1].data;
        T *restrict dx = ctx->out[0].data;
        const T a = (T)p.alpha, b = (T)p.beta, gm = (T)p.gamma;
        switch (p.kind) {
        case ACT_LEAKY: ACT_GRAD_LOOP(n, v > 0 ? g : g * a); break;
        case ACT_SOFTPLUS: ACT_GRAD_LOOP(n, g * sigmoid_d(v)); break;
        case ACT_ELU: ACT_GRAD_LOOP(n, v <= 0 ? g * a * exp((double)v) : g); break;
        case ACT_SELU: ACT_GRAD_LOOP(n, v <= 0 ? g * gm * a * exp((double)v) : g * gm); break;
        case ACT_HARD_SIGMOID: ACT_GRAD_LOOP(n, a * v + b > 0 && a * v + b < 1 ? g * a : 0); break;
        case ACT_HARD_SWISH: ACT_GRAD_LOOP(n, v <= -3 ? 0 : v < 3 ? g * ((double)v / 3 + 0.5) : g); break;
        case ACT_MISH:
            for (int64_t i = 0; i < n; i++) {
                const double v = x[i];
                const double t = tanh(v > 0 ? v + log1p(exp(-v)) : log1p(exp(v)));
                dx[i] = dy[i] * (T)(t + v * sigmoid_d(v) * (1 - t * t));
            }
            break;
        case ACT_SOFTSIGN: ACT_GRAD_LOOP(n, g / ((1 + (v < 0 ? -(double)v : v)) * (1 + (v < 0 ? -(double)v : v)))); break;
        case ACT_CELU: ACT_GRAD_LOOP(n, v <= 0 ? g * exp((double)v / a) : g); break;
        }
    });
    return NULL;
}

/* ---- Tile ------------------------------------------------------------------------------- */

static om_status *tile_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    int64_t rep[OM_MAX_RANK];
    int r;
    OM_TRY(need_known(n, &ctx->in[1], 1, rep, OM_MAX_RANK, &r));
    if (r != x->rank)
        return om_error(OM_INVALID_ARGUMENT, "Tile node '%s': repeats has %d values for rank %d", om_node_name(n), r,
                        x->rank);
    om_set_shape(&ctx->out[0], x, x->dtype);
    for (int i = 0; i < r; i++) {
        if (rep[i] < 0) return om_error(OM_INVALID_ARGUMENT, "Tile node '%s': negative repeats", om_node_name(n));
        ctx->out[0].dims[i] = x->dims[i] * rep[i];
    }
    return NULL;
}

/* Row-major offset in x (dims xd, rank r) of output position o (dims od): each index
 * modulo the input dim. Used by Tile and TileGrad row by row. */
static int64_t tile_src_row(int r, const int64_t *xd, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < r - 1; d++) off = off * xd[d] + idx[d] % xd[d];
    return off * (r ? xd[r - 1] : 1);
}

static void odometer_next(int r, const int64_t *dims, int64_t *idx) {
    for (int d = r - 1; d >= 0; d--) {
        if (++idx[d] < dims[d]) return;
        idx[d] = 0;
    }
}

// x is (*S) any dtype, y is (*S * repeats): each output row copies one input row repeated
static om_status *tile_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    const om_tensor *y = &ctx->out[0];
    const size_t es = om_dtype_size(x->dtype);
    const int r = x->rank;
    const int64_t numel = om_tensor_numel(y);
    if (numel == 0) return NULL;
    if (r == 0) {
        memcpy(y->data, x->data, es);
        return NULL;
    }
    const int64_t W = x->dims[r - 1], OW = y->dims[r - 1];
    const int64_t rows = numel / OW;
    int64_t idx[OM_MAX_RANK] = {0};
    const char *xp = x->data;
    char *yp = y->data;
    for (int64_t row = 0; row < rows; row++) {
        const char *src = xp + (size_t)tile_src_row(r, x->dims, idx) * es;
        char *dst = yp + (size_t)(row * OW) * es;
        for (int64_t t = 0; t < OW; t += W) memcpy(dst + (size_t)t * es, src, (size_t)W * es);
        odometer_next(r - 1, y->dims, idx);
    }
    return NULL;
}

static om_status *tile_grad(om_grad_ctx *c) {
    const int x = c->g->nodes[c->node].in[0];
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int shp = om_emit_shape(c, x);
    EMIT_OK(shp);
    EMIT_OK(c->dx[0] = om_emit2(c, om_op_tile_grad_id, c->dy[0], shp));
    return NULL;
}

static om_status *shape_to_out(const om_node *n, const om_tensor *t, int i, om_dtype dt, om_tensor *out) {
    int64_t d[OM_MAX_RANK];
    int r;
    OM_TRY(need_known(n, t, i, d, OM_MAX_RANK, &r));
    out->dtype = dt;
    out->rank = r;
    for (int i = 0; i < r && i < OM_MAX_RANK; i++) out->dims[i] = d[i];
    return NULL;
}

static om_status *tile_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    if (!is_float(ctx->in[0].dtype)) return om_err_dtype(n, 0, ctx->in[0].dtype);
    OM_TRY(shape_to_out(n, &ctx->in[1], 1, ctx->in[0].dtype, &ctx->out[0]));
    if (ctx->out[0].rank != ctx->in[0].rank)
        return om_error(OM_INVALID_ARGUMENT, "TileGrad node '%s': rank mismatch", om_node_name(n));
    for (int i = 0; i < ctx->out[0].rank; i++)
        if (ctx->out[0].dims[i] == 0 ? ctx->in[0].dims[i] != 0 : ctx->in[0].dims[i] % ctx->out[0].dims[i])
            return om_error(OM_INVALID_ARGUMENT, "TileGrad node '%s': dY is not a tiling of X", om_node_name(n));
    return NULL;
}

// dy is (*S * repeats), dx is (*S): dx = sum of dy over the tiles
static om_status *tile_grad_cpu(om_kernel_ctx *ctx) {
    const om_tensor *dy = &ctx->in[0];
    om_tensor *dx = &ctx->out[0];
    const int r = dx->rank;
    const int64_t numel = om_tensor_numel(dy);
    MISC_FLOAT(dy->dtype, ctx->node, 0, {
        T *dxp = dx->data;
        const T *dyp = dy->data;
        memset(dxp, 0, (size_t)om_tensor_numel(dx) * sizeof(T));
        if (numel == 0) return NULL;
        if (r == 0) { dxp[0] = dyp[0]; return NULL; }
        const int64_t W = dx->dims[r - 1], OW = dy->dims[r - 1], rows = numel / OW;
        int64_t idx[OM_MAX_RANK] = {0};
        for (int64_t row = 0; row < rows; row++) {
            T *restrict d = dxp + tile_src_row(r, dx->dims, idx);
            const T *restrict g = dyp + row * OW;
            for (int64_t t = 0; t < OW; t += W)
                for (int64_t i = 0; i < W; i++) d[i] += g[t + i];
            odometer_next(r - 1, dy->dims, idx);
        }
    });
    return NULL;
}

/* ---- Trilu ------------------------------------------------------------------------------ */

static om_status *trilu_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    if (ctx->in[0].rank < 2)
        return om_error(OM_INVALID_ARGUMENT, "Trilu node '%s': input must have rank >= 2", om_node_name(n));
    if (om_in_present(ctx, 1) && ctx->in[1].dtype != OM_I64) return om_err_dtype(n, 1, ctx->in[1].dtype);
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

// x, y are (B, R, C) any dtype: keeps j - i >= k (upper) or j - i <= k (lower), zeros the rest
static om_status *trilu_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    const int64_t k = om_in_present(ctx, 1) ? *(const int64_t *)ctx->in[1].data : 0;
    const int upper = om_attr_int(ctx->node, "upper", 1) != 0;
    const size_t es = om_dtype_size(x->dtype);
    const int64_t R = x->dims[x->rank - 2], C = x->dims[x->rank - 1];
    const int64_t B = R > 0 && C > 0 ? om_tensor_numel(x) / (R * C) : 0;
    const char *xp = x->data;
    char *yp = ctx->out[0].data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < R; i++) {
            /* kept columns: [lo, hi) */
            int64_t lo = upper ? i + k : 0, hi = upper ? C : i + k + 1;
            lo = lo < 0 ? 0 : lo > C ? C : lo;
            hi = hi < 0 ? 0 : hi > C ? C : hi;
            if (hi < lo) hi = lo;
            const size_t row = (size_t)((b * R + i) * C) * es;
            memset(yp + row, 0, (size_t)C * es);
            memcpy(yp + row + (size_t)lo * es, xp + row + (size_t)lo * es, (size_t)(hi - lo) * es);
        }
    return NULL;
}

static om_status *trilu_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int in[2] = {c->dy[0], n->n_in > 1 ? n->in[1] : -1};
    const int64_t upper = om_attr_int(n, "upper", 1);
    EMIT_OK(c->dx[0] = om_emit(c, om_op_trilu_id, in, in[1] >= 0 ? 2 : 1));
    om_emit_attr_int(c, "upper", upper);
    return NULL;
}

/* ---- Pad -------------------------------------------------------------------------------- */

/* pad_geom, om_pad_geometry and om_pad_src: ops/pad_geom.h (shared with cuda/misc.cu) */

/* pads_t: (2 * n_axes) int64; axes_t: optional. x dims (r, xd). */
static om_status *pad_geometry(const om_node *n, int r, const int64_t *xd, const om_tensor *pads_t,
                               const om_tensor *axes_t, int pads_i, pad_geom *g) {
    int64_t pads[2 * OM_MAX_RANK], axes[OM_MAX_RANK];
    int np, na = r;
    OM_TRY(need_known(n, pads_t, pads_i, pads, 2 * OM_MAX_RANK, &np));
    if (axes_t && axes_t->dtype != OM_UNDEFINED) {
        OM_TRY(need_known(n, axes_t, pads_i + 2, axes, OM_MAX_RANK, &na));
        for (int i = 0; i < na; i++) {
            int a;
            OM_TRY(om_norm_axis(n, axes[i], r, &a));
            axes[i] = a;
        }
    } else {
        for (int i = 0; i < r; i++) axes[i] = i;
    }
    return om_pad_geometry(n, r, xd, pads, np, axes, na, g);
}

static om_status *pad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    pad_geom g;
    const om_tensor *x = &ctx->in[0];
    OM_TRY(pad_geometry(n, x->rank, x->dims, &ctx->in[1], ctx->n_in > 3 ? &ctx->in[3] : NULL, 1, &g));
    if (om_in_present(ctx, 2) && ctx->in[2].dtype != x->dtype) return om_err_dtype(n, 2, ctx->in[2].dtype);
    ctx->out[0].dtype = x->dtype;
    ctx->out[0].rank = g.rank;
    memcpy(ctx->out[0].dims, g.out, sizeof(int64_t) * (size_t)g.rank);
    return NULL;
}

#define PAD_TYPES(dt, node, ...)                                                \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    case OM_I32: { typedef int32_t T; __VA_ARGS__; } break;                     \
    case OM_I64: { typedef int64_t T; __VA_ARGS__; } break;                     \
    case OM_BOOL: case OM_U8: case OM_I8: { typedef uint8_t T; __VA_ARGS__; } break; \
    default: return om_err_dtype((node), 0, (dt));                             \
    }

/* The input row (offset of its first element) feeding output row idx (all dims but the
 * last), or -1 when the row lies in constant padding. */
static int64_t pad_src_row(const pad_geom *g, const int64_t *idx) {
    int64_t off = 0;
    for (int d = 0; d < g->rank - 1; d++) {
        const int64_t s = om_pad_src(g->mode, idx[d], g->pb[d], g->in[d]);
        if (s < 0) return -1;
        off = off * g->in[d] + s;
    }
    return off * g->in[g->rank - 1];
}

// x is (*S), y is (*S + pads)
static om_status *pad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[0];
    pad_geom g;
    OM_TRY(pad_geometry(n, x->rank, x->dims, &ctx->in[1], ctx->n_in > 3 ? &ctx->in[3] : NULL, 1, &g));
    const int64_t numel = om_tensor_numel(&ctx->out[0]);
    if (numel == 0) return NULL;
    const int r = g.rank;
    PAD_TYPES(x->dtype, n, {
        const T *xp = x->data;
        T *yp = ctx->out[0].data;
        const T cv = om_in_present(ctx, 2) && om_tensor_numel(&ctx->in[2]) > 0 ? *(const T *)ctx->in[2].data : (T)0;
        if (r == 0) { yp[0] = xp[0]; return NULL; }
        const int64_t W = g.in[r - 1], OW = g.out[r - 1], pb = g.pb[r - 1], rows = numel / OW;
        int64_t idx[OM_MAX_RANK] = {0};
        for (int64_t row = 0; row < rows; row++) {
            T *restrict y = yp + row * OW;
            const int64_t src = pad_src_row(&g, idx);
            if (src < 0) {
                for (int64_t o = 0; o < OW; o++) y[o] = cv;
            } else {
                const T *restrict xr = xp + src;
                for (int64_t o = 0; o < OW; o++) {
                    const int64_t s = om_pad_src(g.mode, o, pb, W);
                    y[o] = s < 0 ? cv : xr[s];
                }
            }
            odometer_next(r - 1, g.out, idx);
        }
    });
    return NULL;
}

static om_status *pad_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    const int x = n->in[0], pads = n->in[1], axes = n->n_in > 3 ? n->in[3] : -1;
    char mode[16];
    snprintf(mode, sizeof mode, "%s", om_attr_string(n, "mode", "constant"));
    int in[4] = {c->dy[0], -1, pads, axes};
    EMIT_OK(in[1] = om_emit_shape(c, x));
    EMIT_OK(c->dx[0] = om_emit(c, om_op_pad_grad_id, in, axes >= 0 ? 4 : 3));
    om_status *st = om_node_set_string(c->g, om_emit_last(c), "mode", mode);
    if (st) return om_grad_fail(c, st);
    return NULL;
}

static om_status *pad_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    pad_geom g;
    int64_t xd[OM_MAX_RANK];
    int r;
    if (!is_float(ctx->in[0].dtype)) return om_err_dtype(n, 0, ctx->in[0].dtype);
    OM_TRY(need_known(n, &ctx->in[1], 1, xd, OM_MAX_RANK, &r));
    OM_TRY(pad_geometry(n, r, xd, &ctx->in[2], ctx->n_in > 3 ? &ctx->in[3] : NULL, 2, &g));
    if (ctx->in[0].rank != r || memcmp(ctx->in[0].dims, g.out, sizeof(int64_t) * (size_t)r) != 0)
        return om_error(OM_INVALID_ARGUMENT, "PadGrad node '%s': dY does not match the padded X", om_node_name(n));
    ctx->out[0].dtype = ctx->in[0].dtype;
    ctx->out[0].rank = r;
    memcpy(ctx->out[0].dims, xd, sizeof(int64_t) * (size_t)r);
    return NULL;
}

// dy is (*S + pads), dx is (*S): every dy element adds into the element it was copied from
static om_status *pad_grad_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    om_tensor *dx = &ctx->out[0];
    pad_geom g;
    OM_TRY(pad_geometry(n, dx->rank, dx->dims, &ctx->in[2], ctx->n_in > 3 ? &ctx->in[3] : NULL, 2, &g));
    const int64_t numel = om_tensor_numel(&ctx->in[0]);
    const int r = g.rank;
    MISC_FLOAT(dx->dtype, n, 0, {
        const T *dyp = ctx->in[0].data;
        T *dxp = dx->data;
        memset(dxp, 0, (size_t)om_tensor_numel(dx) * sizeof(T));
        if (numel == 0) return NULL;
        if (r == 0) { dxp[0] = dyp[0]; return NULL; }
        const int64_t W = g.in[r - 1], OW = g.out[r - 1], pb = g.pb[r - 1], rows = numel / OW;
        int64_t idx[OM_MAX_RANK] = {0};
        for (int64_t row = 0; row < rows; row++) {
            const int64_t src = pad_src_row(&g, idx);
            if (src >= 0) {
                const T *restrict gy = dyp + row * OW;
                T *restrict d = dxp + src;
                for (int64_t o = 0; o < OW; o++) {
                    const int64_t s = om_pad_src(g.mode, o, pb, W);
                    if (s >= 0) d[s] += gy[o];
                }
            }
            odometer_next(r - 1, g.out, idx);
        }
    });
    return NULL;
}

/* ---- Einsum ---------------------------------------------------------------------------------
 * Labels: letters a-z A-Z are 0..51; the dims an ellipsis stands for get labels 52.., right-
 * aligned across operands (numpy broadcasting). Two operands are computed as one batched GEMM:
 *   batch labels  (in A, B and the output)       -> the GEMM batch
 *   I labels      (in A and the output, not B)    -> GEMM rows
 *   J labels      (in B and the output, not A)    -> GEMM columns
 *   K labels      (everything else)               -> summed; a label of one operand only is
 *                                                    read with stride 0 from the other
 * A is gathered (permute + broadcast) into (batch, I, K), B into (batch, K, J), and the
 * (batch, I, J) product is scattered into the output's label order. */

/* ein_eq, ein_parse, ein_has, ein_strides: ops/einsum_geom.h (shared with cuda/misc.cu) */

static om_status *einsum_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *xs[2] = {&ctx->in[0], ctx->n_in > 1 ? &ctx->in[1] : NULL};
    for (int i = 0; i < ctx->n_in; i++)
        if (!is_float(ctx->in[i].dtype) || ctx->in[i].dtype != ctx->in[0].dtype) return om_err_dtype(n, i, ctx->in[i].dtype);
    ein_eq e;
    OM_TRY(ein_parse(n, om_attr_string(n, "equation", ""), ctx->n_in, xs, &e));
    ctx->out[0].dtype = ctx->in[0].dtype;
    ctx->out[0].rank = e.out.n;
    for (int d = 0; d < e.out.n; d++) ctx->out[0].dims[d] = e.size[e.out.lab[d]];
    return NULL;
}

/* dst (contiguous, dims = size of labs[0..nl)) = src viewed through per-label strides
 * (0 for labels src lacks or holds with size 1). An odometer over all but the last label;
 * the last label is a strided inner loop. */
#define EIN_GATHER(T, dst, src, nl, dims, str)                                                 \
    do {                                                                                       \
        int64_t tot_ = 1;                                                                      \
        for (int d_ = 0; d_ < (nl); d_++) tot_ *= (dims)[d_];                                  \
        if (tot_ == 0) break;                                                                  \
        const int64_t in_ = (nl) ? (dims)[(nl) - 1] : 1, is_ = (nl) ? (str)[(nl) - 1] : 0;     \
        int64_t idx_[EIN_MAXL] = {0};                                                          \
        for (int64_t row_ = 0; row_ < tot_ / in_; row_++) {                                    \
            int64_t off_ = 0;                                                                  \
            for (int d_ = 0; d_ < (nl) - 1; d_++) off_ += idx_[d_] * (str)[d_];                \
            T *restrict o_ = (dst) + row_ * in_;                                               \
            const T *restrict s_ = (src) + off_;                                               \
            for (int64_t i_ = 0; i_ < in_; i_++) o_[i_] = s_[i_ * is_];                        \
            for (int d_ = (nl) - 2; d_ >= 0; d_--) {                                           \
                if (++idx_[d_] < (dims)[d_]) break;                                            \
                idx_[d_] = 0;                                                                  \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static void gemm_f32(int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C) {
    om_gemm(OM_F32, false, false, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
}
static void gemm_f64(int64_t M, int64_t N, int64_t K, const double *A, const double *B, double *C) {
    om_gemm(OM_F64, false, false, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
}
#define EIN_GEMM(T) _Generic((T)0, float: gemm_f32, default: gemm_f64)

// A (*a), B (*b) -> Y (*out) by labels: see the block comment above
static om_status *einsum_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_tensor *xs[2] = {&ctx->in[0], ctx->n_in > 1 ? &ctx->in[1] : NULL};
    ein_eq e;
    OM_TRY(ein_parse(n, om_attr_string(n, "equation", ""), ctx->n_in, xs, &e));
    const om_tensor *y = &ctx->out[0];
    ein_plan P;
    ein_plan_make(&e, xs, &P);
    const ein_term *B = e.nin > 1 ? &e.in[1] : NULL;
    const int64_t NB = P.NB, NI = P.NI, NJ = P.NJ, NK = P.NK;
    const int64_t ysize = om_tensor_numel(y);
    MISC_FLOAT(xs[0]->dtype, n, 0, {
        const T *ap = xs[0]->data;
        T *yp = y->data;
        T *ga = om_alloc((size_t)(NB * NI * NK) * sizeof(T) + 64);
        T *gb = B ? om_alloc((size_t)(NB * NK * NJ) * sizeof(T) + 64) : NULL;
        T *pc = om_alloc((size_t)(NB * NI * NJ) * sizeof(T) + 64);
        if (!ga || !pc || (B && !gb)) {
            om_free(ga); om_free(gb); om_free(pc);
            return om_error(OM_OUT_OF_MEMORY, "Einsum node '%s': out of memory", om_node_name(n));
        }
        EIN_GATHER(T, ga, ap, P.na, P.da, P.sa);
        if (B) {
            const T *bp = xs[1]->data;
            EIN_GATHER(T, gb, bp, P.nbb, P.db, P.sb);
            for (int64_t b = 0; b < NB; b++)
                if (NI && NJ) {
                    if (NK) EIN_GEMM(T)(NI, NJ, NK, ga + b * NI * NK, gb + b * NK * NJ, pc + b * NI * NJ);
                    else memset(pc + b * NI * NJ, 0, (size_t)(NI * NJ) * sizeof(T));
                }
        } else {
            /* one operand: sum over K */
            for (int64_t r = 0; r < NB * NI; r++) {
                const T *restrict s = ga + r * NK;
                T acc = 0;
                for (int64_t k = 0; k < NK; k++) acc += s[k];
                pc[r] = acc;
            }
        }
        if (ysize > 0) EIN_GATHER(T, yp, pc, e.out.n, P.dout, P.so);
        om_free(ga); om_free(gb); om_free(pc);
    });
    return NULL;
}

/* dA = einsum("out,B->A")(dY, B) and dB = einsum("A,out->B")(A, dY) (one operand:
 * dA = einsum("out->A")(dY)); every label of the differentiated operand must appear in
 * the other operand or the output (no summed-alone labels, no dropped ellipsis). Ellipsis
 * broadcasting is undone with SumToShape. */
static om_status *einsum_grad(om_grad_ctx *c) {
    const int node = c->node;
    const om_node *n = &c->g->nodes[node];
    if (c->dy[0] < 0) return NULL;
    const char *eq = om_attr_string(n, "equation", "");
    const int nin = n->n_in;
    int ins[2] = {n->in[0], nin > 1 ? n->in[1] : -1};
    /* parse the labels without shapes: fake operands whose rank matches the letters; the
     * ellipsis rank is unknown at this point, so it is written back as "..." */
    const char *arrow = strstr(eq, "->");
    char terms[3][64];
    {
        const int lhs_len = arrow ? (int)(arrow - eq) : (int)strlen(eq);
        int t = 0, start = 0;
        for (int i = 0; i <= lhs_len && t < 2; i++) {
            if (i < lhs_len && eq[i] != ',') continue;
            int len = i - start;
            if (len > 63) len = 63;
            int k = 0;
            for (int j = 0; j < len; j++) if (eq[start + j] != ' ') terms[t][k++] = eq[start + j];
            terms[t][k] = 0;
            t++;
            start = i + 1;
        }
        if (t != nin) return om_grad_fail(c, om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': bad equation",
                                                      om_node_name(n)));
        if (arrow) {
            int k = 0;
            for (const char *p = arrow + 2; *p && k < 63; p++) if (*p != ' ') terms[2][k++] = *p;
            terms[2][k] = 0;
        } else {
            /* implicit output: the ellipsis (if any), then letters used once, alphabetically */
            int cnt[52] = {0}, ell = 0, k = 0;
            for (int t2 = 0; t2 < nin; t2++)
                for (const char *p = terms[t2]; *p; p++) {
                    if (*p == '.') ell = 1;
                    else if (ein_letter(*p) >= 0) cnt[ein_letter(*p)]++;
                }
            if (ell) { memcpy(terms[2], "...", 3); k = 3; }
            for (int l = 0; l < 52 && k < 63; l++)
                if (cnt[l] == 1) terms[2][k++] = (char)(l < 26 ? 'a' + l : 'A' + l - 26);
            terms[2][k] = 0;
        }
    }
    for (int i = 0; i < nin; i++) {
        if (!c->need_dx[i]) continue;
        /* every label (and the ellipsis) of term i must appear among the grad's inputs */
        const char *mine = terms[i], *other = nin > 1 ? terms[1 - i] : "", *out = terms[2];
        for (const char *p = mine; *p; p++) {
            const int ok = *p == '.' ? (strchr(out, '.') != NULL) : (strchr(out, *p) || strchr(other, *p));
            if (!ok)
                return om_grad_fail(c, om_error(OM_NO_GRADIENT, "Einsum node '%s': no gradient rule for '%s' "
                                                "(operand %d has a label summed in it alone)", om_node_name(n), eq, i));
        }
        char geq[256];
        int gin[2];
        if (nin == 1) {
            snprintf(geq, sizeof geq, "%s->%s", out, mine);
            gin[0] = c->dy[0];
        } else if (i == 0) {
            snprintf(geq, sizeof geq, "%s,%s->%s", out, other, mine);
            gin[0] = c->dy[0];
            gin[1] = ins[1];
        } else {
            snprintf(geq, sizeof geq, "%s,%s->%s", other, out, mine);
            gin[0] = ins[0];
            gin[1] = c->dy[0];
        }
        int v = om_emit(c, om_op_einsum_id, gin, nin);
        EMIT_OK(v);
        om_status *st = om_node_set_string(c->g, om_emit_last(c), "equation", geq);
        if (st) return om_grad_fail(c, st);
        /* broadcast (size-1 or missing ellipsis dims) operands: sum back to the input's shape */
        if (strchr(mine, '.')) EMIT_OK(v = om_emit_sum_to(c, v, ins[i]));
        c->dx[i] = v;
    }
    return NULL;
}

/* ---- the defs ----------------------------------------------------------------------------- */

#define CMP_DEF(sym, NAME, cpu_fn)                                                                      \
    const om_op_def sym = {.name = NAME, .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1, \
                           .dtype = dtype_bool, .infer = infer_compare, .cpu = cpu_fn};
CMP_DEF(om_op_less, "Less", less_cpu)
CMP_DEF(om_op_greater, "Greater", greater_cpu)
CMP_DEF(om_op_less_or_equal, "LessOrEqual", less_equal_cpu)
CMP_DEF(om_op_greater_or_equal, "GreaterOrEqual", greater_equal_cpu)

#define LOGIC_DEF(sym, NAME, nin, cpu_fn)                                                                   \
    const om_op_def sym = {.name = NAME, .domain = "", .min_in = nin, .max_in = nin, .min_out = 1, .max_out = 1, \
                           .dtype = dtype_bool, .infer = infer_logic, .cpu = cpu_fn};
LOGIC_DEF(om_op_and, "And", 2, and_cpu)
LOGIC_DEF(om_op_or, "Or", 2, or_cpu)
LOGIC_DEF(om_op_xor, "Xor", 2, xor_cpu)
LOGIC_DEF(om_op_not, "Not", 1, not_cpu)

const om_op_def om_op_is_nan = {.name = "IsNaN", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
                                .dtype = dtype_bool, .infer = infer_float_to_bool, .cpu = is_nan_cpu};
const om_op_def om_op_is_inf = {.name = "IsInf", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
                                .dtype = dtype_bool, .infer = infer_float_to_bool, .cpu = is_inf_cpu,
                                .attrs = "detect_negative:int detect_positive:int"};

const om_op_def om_op_clip = {.name = "Clip", .domain = "", .min_in = 1, .max_in = 3, .min_out = 1, .max_out = 1,
                              .infer = clip_infer, .grad = clip_grad, .cpu = clip_cpu, .diff_inputs = 0x1};
const om_op_def om_op_clip_grad = {.name = "ClipGrad", .domain = "ortmod", .min_in = 2, .max_in = 4, .min_out = 1,
                                   .max_out = 1, .infer = clip_infer, .cpu = clip_grad_cpu, .attrs = "exclusive:int"};
const om_op_def om_op_hard_tanh = {.name = "HardTanh", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1,
                                   .max_out = 1, .infer = clip_infer, .grad = hard_tanh_grad, .cpu = clip_cpu,
                                   .diff_inputs = 0x1};

/* ACT_DEF(sym, NAME) or ACT_DEF(sym, NAME, .attrs = "..."): the name may be followed by more fields */
#define ACT_DEF(sym, ...)                                                                                    \
    const om_op_def sym = {.domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,               \
                           .infer = act_infer, .grad = act_grad, .cpu = act_cpu, .diff_inputs = 0x1,         \
                           .name = __VA_ARGS__};
ACT_DEF(om_op_leaky_relu, "LeakyRelu", .attrs = "alpha:float")
ACT_DEF(om_op_softplus, "Softplus")
ACT_DEF(om_op_elu, "Elu", .attrs = "alpha:float")
ACT_DEF(om_op_selu, "Selu", .attrs = "alpha:float gamma:float")
ACT_DEF(om_op_hard_sigmoid, "HardSigmoid", .attrs = "alpha:float beta:float")
ACT_DEF(om_op_hard_swish, "HardSwish")
ACT_DEF(om_op_mish, "Mish")
ACT_DEF(om_op_softsign, "Softsign")
ACT_DEF(om_op_celu, "Celu", .attrs = "alpha:float")
const om_op_def om_op_activation_grad = {.name = "ActivationGrad", .domain = "ortmod", .min_in = 2, .max_in = 2,
                                         .min_out = 1, .max_out = 1, .infer = act_infer, .cpu = act_grad_cpu,
                                         .attrs = "activation:string=LeakyRelu|Softplus|Elu|Selu|HardSigmoid|HardSwish|"
                                                  "Mish|Softsign|Celu alpha:float beta:float gamma:float"};

const om_op_def om_op_tile = {.name = "Tile", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
                              .flags = OM_OP_ANY_DTYPE, .infer = tile_infer, .grad = tile_grad, .cpu = tile_cpu,
                              .diff_inputs = 0x1};
const om_op_def om_op_tile_grad = {.name = "TileGrad", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1,
                                   .max_out = 1, .infer = tile_grad_infer, .cpu = tile_grad_cpu};

const om_op_def om_op_trilu = {.name = "Trilu", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
                               .flags = OM_OP_ANY_DTYPE, .infer = trilu_infer, .grad = trilu_grad, .cpu = trilu_cpu,
                               .diff_inputs = 0x1,
                               .attrs = "upper:int"};

const om_op_def om_op_pad = {.name = "Pad", .domain = "", .min_in = 2, .max_in = 4, .min_out = 1, .max_out = 1,
                             .infer = pad_infer, .grad = pad_grad, .cpu = pad_cpu, .diff_inputs = 0x1,
                             .attrs = "mode:string=constant|reflect|edge|wrap"};
const om_op_def om_op_pad_grad = {.name = "PadGrad", .domain = "ortmod", .min_in = 3, .max_in = 4, .min_out = 1,
                                  .max_out = 1, .infer = pad_grad_infer, .cpu = pad_grad_cpu,
                                  .attrs = "mode:string=constant|reflect|edge|wrap"};

const om_op_def om_op_einsum = {.name = "Einsum", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
                                .infer = einsum_infer, .grad = einsum_grad, .cpu = einsum_cpu, .diff_inputs = 0x3,
                                .attrs = "equation:string"};
