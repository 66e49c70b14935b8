/* elementwise.c — pointwise ops, their broadcast binary forms and their backward helpers.
 *
 * Exports:
 *   om_op_add             Add                              a + b         (broadcast; f32 f64 i32 i64)
 *   om_op_sub             Sub                              a - b
 *   om_op_mul             Mul                              a * b
 *   om_op_div             Div                              a / b         (ints: error on zero divisor)
 *   om_op_pow             Pow                              a ^ b         (float base; exponent float or int)
 *   om_op_max             Max                              max(a, b)     (two inputs)
 *   om_op_min             Min                              min(a, b)     (two inputs)
 *   om_op_prelu           PRelu                            x > 0 ? x : slope * x (slope broadcast to x)
 *   om_op_equal           Equal                            a == b -> bool (no gradient)
 *   om_op_where           Where                            cond ? x : y  (three-way broadcast)
 *   om_op_neg             Neg
 *   om_op_relu            Relu
 *   om_op_tanh            Tanh
 *   om_op_sigmoid         Sigmoid
 *   om_op_gelu            Gelu                             approximate = "none" (erf) | "tanh"
 *   om_op_erf             Erf
 *   om_op_sqrt            Sqrt
 *   om_op_exp             Exp
 *   om_op_log             Log
 *   om_op_reciprocal      Reciprocal
 *   om_op_sin, om_op_cos  Sin, Cos                         (rotary position embeddings)
 *   om_op_sign            Sign                             gradient 0, as torch's
 *   om_op_floor, om_op_ceil, om_op_round  Floor, Ceil, Round (halves to even)  gradient 0, as torch's
 *   om_op_mod             Mod                              fmod = 0: sign of the divisor (Python's %),
 *                                                          1: sign of the dividend (C's fmod)
 *   om_op_abs             Abs
 *   om_op_identity        Identity                         (OM_OP_ALIAS)
 *   om_op_stop_gradient   StopGradient (ortmod)            (OM_OP_ALIAS; blocks the gradient)
 *   om_op_cast            Cast                             to = ONNX dtype (f32 f64 f16 bf16 ints bool)
 *   om_op_dropout         Dropout                          (data, ratio?, training_mode?) -> (out, mask?)
 *   om_op_sum_to_shape    SumToShape    (domain ortmod)    x summed over broadcast axes to a shape
 *   om_op_relu_grad       ReluGrad      (domain ortmod)    (dy, y) -> y <= 0 ? 0 : dy
 *   om_op_gelu_grad       GeluGrad      (domain ortmod)    (dy, x; approximate) -> dy * gelu'(x)
 *   om_op_tanh_grad       TanhGrad      (domain ortmod)    (dy, y) -> dy * (1 - y^2)
 *   om_op_sigmoid_grad    SigmoidGrad   (domain ortmod)    (dy, y) -> dy * y * (1 - y)
 *   om_op_abs_grad        AbsGrad       (domain ortmod)    (dy, x) -> dy * sign(x)
 *   om_op_dropout_grad    DropoutGrad   (domain ortmod)    (dy, mask, ratio?, training_mode?)
 *
 * Kernels receive contiguous row-major tensors. Binary ops iterate with the broadcast
 * planner of broadcast.h (same shape, scalar and trailing-block fast paths). Unary loops
 * are chunked for threads and written so that -O3 vectorizes the ones without libm calls.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <tgmath.h>

#include "core/half.h"
#include "ops/broadcast.h"
#include "ops/op_util.h"
#include "ops/gelu.h"
#include "ops/rowsum.h"
#include "ops/vecmath.h"

/* ---- small helpers ------------------------------------------------------------------ */

/* The float and arithmetic sets (fp16/bf16 included) are op.h's OM_DT_FLOAT / OM_DT_ARITH. */
#define DT_EQ (OM_DT_ARITH | OM_DT_BIT(OM_I8) | OM_DT_BIT(OM_U8) | OM_DT_BIT(OM_BOOL))
#define DT_CAST DT_EQ

static om_status *check_dtype(const om_kernel_ctx *ctx, int i, unsigned allowed) {
    return om_check_dtype(ctx->node, &ctx->in[i], i, allowed);
}

static om_status *check_same_dtype(const om_kernel_ctx *ctx, int i, int j) {
    if (ctx->in[i].dtype != ctx->in[j].dtype)
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (%s): inputs %d and %d differ in dtype (%s vs %s)",
                        ctx->node->name, ctx->node->op->name, i, j, om_dtype_name(ctx->in[i].dtype),
                        om_dtype_name(ctx->in[j].dtype));
    return NULL;
}

static om_status *check_same_numel(const om_kernel_ctx *ctx, int i, int j) {
    if (om_tensor_numel(&ctx->in[i]) != om_tensor_numel(&ctx->in[j])) {
        char a[128], b[128];
        om_shape_str(&ctx->in[i], a, sizeof a);
        om_shape_str(&ctx->in[j], b, sizeof b);
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (%s): inputs %d %s and %d %s differ in size",
                        ctx->node->name, ctx->node->op->name, i, a, j, b);
    }
    return NULL;
}

/* A scalar float input (Dropout's ratio), read whatever its float dtype. */
static om_status *read_scalar_float(const om_kernel_ctx *ctx, int i, double *v) {
    const om_tensor *t = &ctx->in[i];
    if (!t->data || om_tensor_numel(t) != 1)
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (%s): input %d must be a scalar", ctx->node->name,
                        ctx->node->op->name, i);
    if (!om_dtype_is_float(t->dtype) || om_scalar_get(t, v)) return om_err_dtype(ctx->node, i, t->dtype);
    return NULL;
}

static om_dtype vdt(const om_graph *g, int v) { return v >= 0 ? g->values[v].dtype : OM_UNDEFINED; }

/* Copies the forward node's value ids: emitting may grow the node array, so a rule must
 * not hold a node pointer across an emit. */
static void node_io(const om_grad_ctx *c, int *in, int n_in, int *out, int n_out) {
    const om_node *n = &c->g->nodes[c->node];
    for (int i = 0; i < n_in; i++) in[i] = i < n->n_in ? n->in[i] : -1;
    for (int j = 0; j < n_out; j++) out[j] = j < n->n_out ? n->out[j] : -1;
}

/* An emit helper that fails has recorded its error in the grad context (om_grad_fail);
 * the rule just stops and autodiff reports it. */
#define EMIT_OK(v) do { if ((v) < 0) return NULL; } while (0)

static om_dtype dtype_bool(const om_graph *g, const om_node *n, int j) { return OM_BOOL; }

/* ---- float32 vector math: ops/vecmath.h (exp_f32, tanh_f32, erf_f32, sigmoid_f32) -- */

/* ---- shape rules ---------------------------------------------------------------------- */

static om_status *infer_unary_float(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_FLOAT));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

static om_status *infer_unary_arith(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_ARITH));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

/* (dy, saved) -> like dy; saved must have dy's size. */
static om_status *infer_grad2(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_FLOAT));
    OM_TRY(check_same_dtype(ctx, 0, 1));
    OM_TRY(check_same_numel(ctx, 0, 1));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

static om_status *infer_broadcast(om_kernel_ctx *ctx, om_dtype out_dt) {
    om_status *st = om_broadcast_shape(&ctx->in[0], &ctx->in[1], &ctx->out[0]);
    if (st) return om_error_context(st, "node '%s' (%s)", ctx->node->name, ctx->node->op->name);
    ctx->out[0].dtype = out_dt;
    return NULL;
}

static om_status *infer_binary_arith(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_ARITH));
    OM_TRY(check_same_dtype(ctx, 0, 1));
    return infer_broadcast(ctx, ctx->in[0].dtype);
}

static om_status *infer_pow(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_FLOAT));
    OM_TRY(check_dtype(ctx, 1, OM_DT_ARITH));
    return infer_broadcast(ctx, ctx->in[0].dtype);
}

static om_status *infer_equal(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, DT_EQ));
    OM_TRY(check_same_dtype(ctx, 0, 1));
    return infer_broadcast(ctx, OM_BOOL);
}

/* ---- binary arithmetic ------------------------------------------------------------------ */

static om_status *binary_plan(om_kernel_ctx *ctx, om_bcast *p) {
    const om_tensor *ops[3] = {&ctx->out[0], &ctx->in[0], &ctx->in[1]};
    return om_bcast_init(p, ctx->node, &ctx->out[0], ops, 3);
}

/* out = EXPR(x, y), broadcast; for f32 f64 i32 i64 (x, y, out of one dtype). One range
 * worker per dtype (broadcast.h), run on the pool. */
#define BINARY_ARITH_KERNEL(fname, EXPR)                                                       \
    OM_BINARY_WORKER(fname##_f32, float, float, float, EXPR)                                   \
    OM_BINARY_WORKER(fname##_f64, double, double, double, EXPR)                                \
    OM_BINARY_WORKER(fname##_i32, int32_t, int32_t, int32_t, EXPR)                             \
    OM_BINARY_WORKER(fname##_i64, int64_t, int64_t, int64_t, EXPR)                             \
    static om_status *fname(om_kernel_ctx *ctx) {                                              \
        /* a, b broadcast to out (ONNX multidirectional) */                                   \
        om_bcast p;                                                                            \
        OM_TRY(binary_plan(ctx, &p));                                                          \
        void *o = ctx->out[0].data;                                                            \
        const void *a = ctx->in[0].data, *b = ctx->in[1].data;                                 \
        switch (ctx->in[0].dtype) {                                                            \
        case OM_F32: om_binary_run(&p, fname##_f32, o, a, b); break;                           \
        case OM_F64: om_binary_run(&p, fname##_f64, o, a, b); break;                           \
        case OM_I32: om_binary_run(&p, fname##_i32, o, a, b); break;                           \
        case OM_I64: om_binary_run(&p, fname##_i64, o, a, b); break;                           \
        default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);                         \
        }                                                                                      \
        return NULL;                                                                           \
    }

BINARY_ARITH_KERNEL(add_cpu, x + y)
BINARY_ARITH_KERNEL(sub_cpu, x - y)
BINARY_ARITH_KERNEL(mul_cpu, x * y)
/* NaN in either operand propagates (x != x is the NaN test, false for ints). */
BINARY_ARITH_KERNEL(max_cpu, (x != x || x > y) ? x : y)
BINARY_ARITH_KERNEL(min_cpu, (x != x || x < y) ? x : y)
/* torch's prelu: x where x > 0, slope * x elsewhere (NaN stays NaN) */
BINARY_ARITH_KERNEL(prelu_cpu, x > 0 ? x : y * x)

/* Float division is plain IEEE; integer division by zero would trap, so the divisor is
 * scanned first (it is usually a small shape tensor) and reported as an error. */
static om_status *div_int_check(om_kernel_ctx *ctx) {
    /* (also Mod's: it reports itself by the node's op name) */
    const om_tensor *b = &ctx->in[1];
    int64_t n = om_tensor_numel(b), zeros = 0;
    if (b->dtype == OM_I64) {
        const int64_t *p = b->data;
        for (int64_t i = 0; i < n; i++) zeros += p[i] == 0;
    } else if (b->dtype == OM_I32) {
        const int32_t *p = b->data;
        for (int64_t i = 0; i < n; i++) zeros += p[i] == 0;
    }
    if (zeros)
        return om_error(OM_RUNTIME, "node '%s' (%s): integer division by zero", ctx->node->name, ctx->node->op->name);
    return NULL;
}

BINARY_ARITH_KERNEL(div_float_cpu, x / y)
/* INT_MIN / -1 traps on x86: -1 negates (wrapping through unsigned) instead. */
BINARY_ARITH_KERNEL(div_int_cpu, y == -1 ? (int64_t)(0 - (uint64_t)x) : x / y)

static om_status *div_cpu(om_kernel_ctx *ctx) {
    if (ctx->in[1].dtype == OM_I64 || ctx->in[1].dtype == OM_I32) {
        OM_TRY(div_int_check(ctx));
        return div_int_cpu(ctx);
    }
    return div_float_cpu(ctx);
}

/* Mod. fmod = 1 truncates (C's fmod, %); fmod = 0 takes the divisor's sign (Python's %,
 * torch.remainder; ONNX asks fmod = 1 for floats, torch's exporter also emits 0 there). */
#define MOD_FLOOR(r, y) ((r) != 0 && (((r) < 0) != ((y) < 0)) ? (r) + (y) : (r))
static inline float mod_floor_f32(float x, float y) { float r = fmodf(x, y); return MOD_FLOOR(r, y); }
static inline double mod_floor_f64(double x, double y) { double r = fmod(x, y); return MOD_FLOOR(r, y); }
/* (x % -1 is 0, and INT_MIN % -1 traps on x86) */
static inline int64_t mod_trunc_int(int64_t x, int64_t y) { return y == -1 ? 0 : x % y; }
static inline int64_t mod_floor_int(int64_t x, int64_t y) { int64_t r = mod_trunc_int(x, y); return MOD_FLOOR(r, y); }

OM_BINARY_WORKER(mod_fmod_f32, float, float, float, fmodf(x, y))
OM_BINARY_WORKER(mod_fmod_f64, double, double, double, fmod(x, y))
OM_BINARY_WORKER(mod_fmod_i32, int32_t, int32_t, int32_t, mod_trunc_int(x, y))
OM_BINARY_WORKER(mod_fmod_i64, int64_t, int64_t, int64_t, mod_trunc_int(x, y))
OM_BINARY_WORKER(mod_floor_f32_w, float, float, float, mod_floor_f32(x, y))
OM_BINARY_WORKER(mod_floor_f64_w, double, double, double, mod_floor_f64(x, y))
OM_BINARY_WORKER(mod_floor_i32, int32_t, int32_t, int32_t, mod_floor_int(x, y))
OM_BINARY_WORKER(mod_floor_i64, int64_t, int64_t, int64_t, mod_floor_int(x, y))

static om_status *mod_cpu(om_kernel_ctx *ctx) {
    // a, b broadcast to out (ONNX multidirectional), one dtype
    om_bcast p;
    OM_TRY(binary_plan(ctx, &p));
    if (ctx->in[1].dtype == OM_I64 || ctx->in[1].dtype == OM_I32) OM_TRY(div_int_check(ctx));
    int trunc = om_attr_int(ctx->node, "fmod", 0) != 0;
    void *o = ctx->out[0].data;
    const void *a = ctx->in[0].data, *b = ctx->in[1].data;
    switch (ctx->in[0].dtype) {
    case OM_F32: om_binary_run(&p, trunc ? mod_fmod_f32 : mod_floor_f32_w, o, a, b); break;
    case OM_F64: om_binary_run(&p, trunc ? mod_fmod_f64 : mod_floor_f64_w, o, a, b); break;
    case OM_I32: om_binary_run(&p, trunc ? mod_fmod_i32 : mod_floor_i32, o, a, b); break;
    case OM_I64: om_binary_run(&p, trunc ? mod_fmod_i64 : mod_floor_i64, o, a, b); break;
    default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    }
    return NULL;
}

/* Pow: a common exponent is a scalar constant (x**2, x**0.5); those skip libm pow. */
#define POW_LOOP(TA, TB)                                                                      \
    do {                                                                                      \
        if (om_tensor_numel(&ctx->in[1]) == 1 && p.n_outer <= 1) {                          \
            const double e = (double)*(const TB *)ctx->in[1].data;                           \
            const TA *restrict xp = (const TA *)ctx->in[0].data;                              \
            TA *restrict yp = (TA *)ctx->out[0].data;                                         \
            const int64_t n = om_tensor_numel(&ctx->out[0]);                                  \
            if (e == 2.0) OM_CHUNKED(n, { for (int64_t i = om_lo; i < om_hi; i++) yp[i] = xp[i] * xp[i]; }); \
            else if (e == 1.0) OM_CHUNKED(n, { for (int64_t i = om_lo; i < om_hi; i++) yp[i] = xp[i]; }); \
            else if (e == 3.0) OM_CHUNKED(n, { for (int64_t i = om_lo; i < om_hi; i++) yp[i] = xp[i] * xp[i] * xp[i]; }); \
            else if (e == 0.5) OM_CHUNKED(n, { for (int64_t i = om_lo; i < om_hi; i++) yp[i] = sqrt(xp[i]); }); \
            else {                                                                            \
                const TA te = (TA)e;                                                          \
                OM_CHUNKED(n, { for (int64_t i = om_lo; i < om_hi; i++) yp[i] = pow(xp[i], te); }); \
            }                                                                                 \
        } else {                                                                              \
            OM_BINARY_LOOP(&p, TA, ctx->out[0].data, TA, ctx->in[0].data, TB, ctx->in[1].data, pow(x, (TA)y)); \
        }                                                                                     \
    } while (0)

#define POW_EXP(TA)                                                                           \
    switch (ctx->in[1].dtype) {                                                               \
    case OM_F32: POW_LOOP(TA, float); break;                                                  \
    case OM_F64: POW_LOOP(TA, double); break;                                                 \
    case OM_I32: POW_LOOP(TA, int32_t); break;                                                \
    case OM_I64: POW_LOOP(TA, int64_t); break;                                                \
    default: return om_err_dtype(ctx->node, 1, ctx->in[1].dtype);                            \
    }

OM_VEC_CLONES static om_status *pow_cpu(om_kernel_ctx *ctx) {
    // a is any shape (float), b broadcast against it (float or int)
    om_bcast p;
    OM_TRY(binary_plan(ctx, &p));
    switch (ctx->in[0].dtype) {
    case OM_F32: POW_EXP(float); break;
    case OM_F64: POW_EXP(double); break;
    default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    }
    return NULL;
}

OM_VEC_CLONES static om_status *equal_cpu(om_kernel_ctx *ctx) {
    // a, b broadcast to out (bool, one byte per element)
    om_bcast p;
    OM_TRY(binary_plan(ctx, &p));
    void *o = ctx->out[0].data;
    const void *a = ctx->in[0].data, *b = ctx->in[1].data;
    switch (ctx->in[0].dtype) {
    case OM_F32: OM_BINARY_LOOP(&p, uint8_t, o, float, a, float, b, x == y); break;
    case OM_F64: OM_BINARY_LOOP(&p, uint8_t, o, double, a, double, b, x == y); break;
    case OM_I32: OM_BINARY_LOOP(&p, uint8_t, o, int32_t, a, int32_t, b, x == y); break;
    case OM_I64: OM_BINARY_LOOP(&p, uint8_t, o, int64_t, a, int64_t, b, x == y); break;
    case OM_I8: OM_BINARY_LOOP(&p, uint8_t, o, int8_t, a, int8_t, b, x == y); break;
    case OM_U8: OM_BINARY_LOOP(&p, uint8_t, o, uint8_t, a, uint8_t, b, x == y); break;
    case OM_BOOL: OM_BINARY_LOOP(&p, uint8_t, o, uint8_t, a, uint8_t, b, (x != 0) == (y != 0)); break;
    default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    }
    return NULL;
}

/* ---- binary gradients ------------------------------------------------------------------- */

/* d(a+b): dy summed back to each operand's shape (a no-op copy when it was not broadcast). */
static om_status *add_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    if (c->need_dx[0]) EMIT_OK(c->dx[0] = om_emit_sum_to(c, dy, in[0]));
    if (c->need_dx[1]) EMIT_OK(c->dx[1] = om_emit_sum_to(c, dy, in[1]));
    return NULL;
}

static om_status *sub_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    if (c->need_dx[0]) EMIT_OK(c->dx[0] = om_emit_sum_to(c, dy, in[0]));
    if (c->need_dx[1]) {
        /* negate after the reduction: the reduced tensor is the smaller one */
        int s = om_emit_sum_to(c, dy, in[1]);
        EMIT_OK(s);
        EMIT_OK(c->dx[1] = om_emit1(c, om_op_neg_id, s));
    }
    return NULL;
}

static om_status *mul_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    for (int i = 0; i < 2; i++) {
        if (!c->need_dx[i]) continue;
        int t = om_emit2(c, om_op_mul_id, dy, in[1 - i]);
        EMIT_OK(t);
        EMIT_OK(c->dx[i] = om_emit_sum_to(c, t, in[i]));
    }
    return NULL;
}

/* y = a / b:  da = dy / b,  db = -dy * y / b  (reuses y rather than a) */
static om_status *div_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    if (c->need_dx[0]) {
        int t = om_emit2(c, om_op_div_id, dy, in[1]);
        EMIT_OK(t);
        EMIT_OK(c->dx[0] = om_emit_sum_to(c, t, in[0]));
    }
    if (c->need_dx[1]) {
        int q = om_emit2(c, om_op_div_id, out[0], in[1]);
        EMIT_OK(q);
        int t = om_emit2(c, om_op_mul_id, dy, q);
        EMIT_OK(t);
        int s = om_emit_sum_to(c, t, in[1]);
        EMIT_OK(s);
        EMIT_OK(c->dx[1] = om_emit1(c, om_op_neg_id, s));
    }
    return NULL;
}

/* y = a ^ b:  da = dy * b * a^(b-1),  db = dy * y * log(a) */
static om_status *pow_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    om_dtype dt = vdt(c->g, in[0]);
    if (c->need_dx[0]) {
        int b = in[1];
        if (vdt(c->g, b) != dt) {   /* integer exponent: do the arithmetic in a's dtype */
            b = om_emit1(c, om_op_cast_id, in[1]);
            EMIT_OK(b);
            om_emit_attr_int(c, "to", dt);
            c->g->values[b].dtype = dt;
        }
        int one = om_emit_scalar(c, dt, 1.0);
        EMIT_OK(one);
        int bm1 = om_emit2(c, om_op_sub_id, b, one);
        EMIT_OK(bm1);
        int p = om_emit2(c, om_op_pow_id, in[0], bm1);
        EMIT_OK(p);
        int t = om_emit2(c, om_op_mul_id, b, p);
        EMIT_OK(t);
        int u = om_emit2(c, om_op_mul_id, dy, t);
        EMIT_OK(u);
        EMIT_OK(c->dx[0] = om_emit_sum_to(c, u, in[0]));
    }
    if (c->need_dx[1] && vdt(c->g, in[1]) == dt) {
        int l = om_emit1(c, om_op_log_id, in[0]);
        EMIT_OK(l);
        int t = om_emit2(c, om_op_mul_id, out[0], l);
        EMIT_OK(t);
        int u = om_emit2(c, om_op_mul_id, dy, t);
        EMIT_OK(u);
        EMIT_OK(c->dx[1] = om_emit_sum_to(c, u, in[1]));
    }
    return NULL;
}

/* Max/Min: the gradient goes to the operand that was selected (ties go to a). */
/* torch.maximum's backward (minimum's with the comparisons swapped): ties share dy, half each;
 * where a comparison with NaN fails both ways, both inputs get all of dy, as in eager.
 *   da = where(a == b, dy/2, dy) masked to 0 where a < b     db = ... masked to 0 where a > b */
static om_status *maxmin_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    const int is_max = c->g->nodes[c->node].op_id == om_op_max_id;
    int tie = om_emit2(c, om_op_equal_id, in[0], in[1]);
    EMIT_OK(tie);
    int half = om_emit_scalar(c, vdt(c->g, dy), 0.5);
    EMIT_OK(half);
    int zero = om_emit_scalar(c, vdt(c->g, dy), 0.0);
    EMIT_OK(zero);
    int halved = om_emit2(c, om_op_mul_id, dy, half);
    EMIT_OK(halved);
    int sel[3] = {tie, halved, dy};
    int share = om_emit(c, om_op_where_id, sel, 3);
    EMIT_OK(share);
    for (int k = 0; k < 2; k++) {
        if (!c->need_dx[k]) continue;
        /* input k loses where the other one wins */
        int loses = om_emit2(c, (k == 0) == is_max ? om_op_less_id : om_op_greater_id, in[0], in[1]);
        EMIT_OK(loses);
        int pick[3] = {loses, zero, share};
        int t = om_emit(c, om_op_where_id, pick, 3);
        EMIT_OK(t);
        EMIT_OK(c->dx[k] = om_emit_sum_to(c, t, in[k]));
    }
    return NULL;
}

/* torch's prelu backward, in its select form: dx = x > 0 ? dy : slope * dy,
 * dslope = (x > 0 ? 0 : x * dy) summed to the slope's shape */
static om_status *prelu_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    int zero = om_emit_scalar(c, vdt(c->g, dy), 0.0);
    EMIT_OK(zero);
    int pos = om_emit2(c, om_op_greater_id, in[0], zero);
    EMIT_OK(pos);
    if (c->need_dx[0]) {
        int scaled = om_emit2(c, om_op_mul_id, in[1], dy);
        EMIT_OK(scaled);
        int pick[3] = {pos, dy, scaled};
        int t = om_emit(c, om_op_where_id, pick, 3);
        EMIT_OK(t);
        EMIT_OK(c->dx[0] = om_emit_sum_to(c, t, in[0]));
    }
    if (c->need_dx[1]) {
        int xdy = om_emit2(c, om_op_mul_id, in[0], dy);
        EMIT_OK(xdy);
        int pick[3] = {pos, zero, xdy};
        int t = om_emit(c, om_op_where_id, pick, 3);
        EMIT_OK(t);
        EMIT_OK(c->dx[1] = om_emit_sum_to(c, t, in[1]));
    }
    return NULL;
}

/* ---- Where ------------------------------------------------------------------------------ */

static om_dtype dtype_where(const om_graph *g, const om_node *n, int j) {
    return n->n_in > 1 ? vdt(g, n->in[1]) : OM_UNDEFINED;
}

static om_status *infer_where(om_kernel_ctx *ctx) {
    if (ctx->in[0].dtype != OM_BOOL) return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    OM_TRY(check_same_dtype(ctx, 1, 2));
    if (om_dtype_size(ctx->in[1].dtype) == 0) return om_err_dtype(ctx->node, 1, ctx->in[1].dtype);
    om_tensor t = {0};
    om_status *st = om_broadcast_shape(&ctx->in[0], &ctx->in[1], &t);
    if (!st) st = om_broadcast_shape(&t, &ctx->in[2], &ctx->out[0]);
    if (st) return om_error_context(st, "node '%s' (Where)", ctx->node->name);
    ctx->out[0].dtype = ctx->in[1].dtype;
    return NULL;
}

/* Where only moves elements, so it is written per element size, not per dtype. */
#define WHERE_LOOP(U)                                                                         \
    OM_BCAST_RUNS(&p, {                                                                       \
        U *restrict o = (U *)ctx->out[0].data + om_off[0];                                    \
        const uint8_t *restrict cp = (const uint8_t *)ctx->in[0].data + om_off[1];            \
        const U *restrict xp = (const U *)ctx->in[1].data + om_off[2];                        \
        const U *restrict yp = (const U *)ctx->in[2].data + om_off[3];                        \
        const int64_t sc = p.step[1], sx = p.step[2], sy = p.step[3];                         \
        if (sc && sx && sy)                                                                   \
            for (int64_t i = 0; i < p.inner; i++) o[i] = cp[i] ? xp[i] : yp[i];               \
        else                                                                                  \
            for (int64_t i = 0; i < p.inner; i++) o[i] = cp[i * sc] ? xp[i * sx] : yp[i * sy]; \
    })

OM_VEC_CLONES static om_status *where_cpu(om_kernel_ctx *ctx) {
    // cond, x, y broadcast to out
    om_bcast p;
    const om_tensor *ops[4] = {&ctx->out[0], &ctx->in[0], &ctx->in[1], &ctx->in[2]};
    OM_TRY(om_bcast_init(&p, ctx->node, &ctx->out[0], ops, 4));
    switch (om_dtype_size(ctx->out[0].dtype)) {
    case 1: WHERE_LOOP(uint8_t); break;
    case 2: WHERE_LOOP(uint16_t); break;
    case 4: WHERE_LOOP(uint32_t); break;
    case 8: WHERE_LOOP(uint64_t); break;
    default: return om_err_dtype(ctx->node, 1, ctx->in[1].dtype);
    }
    return NULL;
}

/* dx = Where(cond, dy, 0), dy_ = Where(cond, 0, dy), each summed to its operand's shape. */
static om_status *where_grad(om_grad_ctx *c) {
    int in[3], out[1];
    node_io(c, in, 3, out, 1);
    int dy = c->dy[0];
    if (dy < 0) return NULL;
    int zero = om_emit_scalar(c, vdt(c->g, dy), 0.0);
    EMIT_OK(zero);
    for (int i = 1; i <= 2; i++) {
        if (!c->need_dx[i]) continue;
        int w[3] = {in[0], i == 1 ? dy : zero, i == 1 ? zero : dy};
        int t = om_emit(c, om_op_where_id, w, 3);
        EMIT_OK(t);
        EMIT_OK(c->dx[i] = om_emit_sum_to(c, t, in[i]));
    }
    return NULL;
}

/* ---- unary -------------------------------------------------------------------------------- */

/* y = EXPR(x) elementwise: E32 for float32, E64 for float64; range workers on the pool. */
#define UNARY_FLOAT_KERNEL2(fname, E32, E64)                                                 \
    OM_UNARY_WORKER(fname##_f32, float, E32)                                                 \
    OM_UNARY_WORKER(fname##_f64, double, E64)                                                \
    static om_status *fname(om_kernel_ctx *ctx) {                                            \
        /* x is any shape; y like x */                                                       \
        const int64_t n = om_tensor_numel(&ctx->in[0]);                                      \
        void *y = ctx->out[0].data;                                                          \
        const void *x = ctx->in[0].data;                                                     \
        switch (ctx->in[0].dtype) {                                                          \
        case OM_F32: om_ew_run(n, fname##_f32, y, x, NULL); break;                           \
        case OM_F64: om_ew_run(n, fname##_f64, y, x, NULL); break;                           \
        default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);                       \
        }                                                                                    \
        return NULL;                                                                         \
    }

/* y = EXPR(x) elementwise for the float dtypes (EXPR may name T). */
#define UNARY_FLOAT_KERNEL(fname, EXPR) UNARY_FLOAT_KERNEL2(fname, EXPR, EXPR)

/* The same for f32 f64 i32 i64 (ops that also serve shape arithmetic). */
#define UNARY_ARITH_KERNEL(fname, EXPR)                                                      \
    OM_UNARY_WORKER(fname##_f32, float, EXPR)                                                \
    OM_UNARY_WORKER(fname##_f64, double, EXPR)                                               \
    OM_UNARY_WORKER(fname##_i32, int32_t, EXPR)                                              \
    OM_UNARY_WORKER(fname##_i64, int64_t, EXPR)                                              \
    static om_status *fname(om_kernel_ctx *ctx) {                                            \
        /* x is any shape; y like x */                                                       \
        const int64_t n = om_tensor_numel(&ctx->in[0]);                                      \
        void *y = ctx->out[0].data;                                                          \
        const void *x = ctx->in[0].data;                                                     \
        switch (ctx->in[0].dtype) {                                                          \
        case OM_F32: om_ew_run(n, fname##_f32, y, x, NULL); break;                           \
        case OM_F64: om_ew_run(n, fname##_f64, y, x, NULL); break;                           \
        case OM_I32: om_ew_run(n, fname##_i32, y, x, NULL); break;                           \
        case OM_I64: om_ew_run(n, fname##_i64, y, x, NULL); break;                           \
        default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);                       \
        }                                                                                    \
        return NULL;                                                                         \
    }

UNARY_ARITH_KERNEL(neg_cpu, -x)
/* NaN-propagating, -0 kept: torch's relu is clamp_min(x, 0) */
UNARY_ARITH_KERNEL(relu_cpu, x < 0 ? 0 : x)
UNARY_ARITH_KERNEL(abs_cpu, x < 0 ? -x : x)
UNARY_FLOAT_KERNEL2(tanh_cpu, tanh_f32(x), tanh(x))
UNARY_FLOAT_KERNEL2(sigmoid_cpu, sigmoid_f32(x), sigmoid_f64(x))
UNARY_FLOAT_KERNEL2(erf_cpu, erf_f32(x), erf(x))
UNARY_FLOAT_KERNEL(sqrt_cpu, sqrt(x))
UNARY_FLOAT_KERNEL(sin_cpu, sin(x))
UNARY_FLOAT_KERNEL(cos_cpu, cos(x))
/* NaN stays NaN (torch.sign) */
/* torch.sign(NaN) is 0 */
UNARY_ARITH_KERNEL(sign_cpu, (T)((x > 0) - (x < 0)))
UNARY_FLOAT_KERNEL(floor_cpu, floor(x))
UNARY_FLOAT_KERNEL(ceil_cpu, ceil(x))
/* rint: halves to even in the default rounding mode, as ONNX Round and torch.round */
UNARY_FLOAT_KERNEL(round_cpu, rint(x))
UNARY_FLOAT_KERNEL2(exp_cpu, exp_f32(x), exp(x))
UNARY_FLOAT_KERNEL(log_cpu, log(x))
UNARY_FLOAT_KERNEL(reciprocal_cpu, (T)1 / x)

UNARY_FLOAT_KERNEL2(gelu_erf_cpu, 0.5f * x * (1.0f + erf_f32(x * (float)INV_SQRT2)),
                    0.5 * x * (1.0 + erf(x * INV_SQRT2)))
UNARY_FLOAT_KERNEL2(gelu_tanh_cpu, 0.5f * x * (1.0f + tanh_f32((float)GELU_K0 * (x + (float)GELU_K1 * x * x * x))),
                    0.5 * x * (1.0 + tanh(GELU_K0 * (x + GELU_K1 * x * x * x))))

/* approximate: 0 = "none" (erf), 1 = "tanh"; anything else is an error. */
static int gelu_mode(const om_node *n) {
    const char *s = om_attr_string(n, "approximate", "none");
    if (!strcmp(s, "none")) return 0;
    if (!strcmp(s, "tanh")) return 1;
    return -1;
}

static om_status *infer_gelu(om_kernel_ctx *ctx) {
    if (gelu_mode(ctx->node) < 0) return om_err_unsupported(ctx->node, "approximate must be \"none\" or \"tanh\"");
    return infer_unary_float(ctx);
}

static om_status *gelu_cpu(om_kernel_ctx *ctx) {
    switch (gelu_mode(ctx->node)) {
    case 0: return gelu_erf_cpu(ctx);
    case 1: return gelu_tanh_cpu(ctx);
    default: return om_err_unsupported(ctx->node, "approximate must be \"none\" or \"tanh\"");
    }
}

/* ---- fused backward kernels: dx = dy * f'(saved) --------------------------------------- */

#define GRAD2_KERNEL2(fname, E32, E64)                                                       \
    OM_GRAD2_WORKER(fname##_f32, float, E32)                                                 \
    OM_GRAD2_WORKER(fname##_f64, double, E64)                                                \
    static om_status *fname(om_kernel_ctx *ctx) {                                            \
        /* dy and s (the saved x or y) have the same size; dx like dy */                      \
        const int64_t n = om_tensor_numel(&ctx->in[0]);                                      \
        void *dx = ctx->out[0].data;                                                         \
        const void *dy = ctx->in[0].data, *sv = ctx->in[1].data;                             \
        switch (ctx->in[0].dtype) {                                                          \
        case OM_F32: om_ew_run(n, fname##_f32, dx, dy, sv); break;                           \
        case OM_F64: om_ew_run(n, fname##_f64, dx, dy, sv); break;                           \
        default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);                       \
        }                                                                                    \
        return NULL;                                                                         \
    }

#define GRAD2_KERNEL(fname, EXPR) GRAD2_KERNEL2(fname, EXPR, EXPR)

/* threshold_backward: dy where y > 0 or y is NaN (relu(NaN) is NaN, and so is its gradient) */
GRAD2_KERNEL(relu_grad_cpu, s <= 0 ? (T)0 : g)
GRAD2_KERNEL(tanh_grad_cpu, g * ((T)1 - s * s))
GRAD2_KERNEL(sigmoid_grad_cpu, g * s * ((T)1 - s))
/* dy * sgn(x), a product as in eager: a NaN or inf dy at x == 0 gives NaN, not 0 */
GRAD2_KERNEL(abs_grad_cpu, g * (T)((s > 0) - (s < 0)))
/* gelu'(x): gelu.h */
GRAD2_KERNEL2(gelu_erf_grad_cpu, g * gelu_erf_deriv_f32(s), g * gelu_erf_deriv_f64(s))
GRAD2_KERNEL2(gelu_tanh_grad_cpu, g * gelu_tanh_deriv_f32(s), g * gelu_tanh_deriv_f64(s))

static om_status *gelu_grad_cpu(om_kernel_ctx *ctx) {
    switch (gelu_mode(ctx->node)) {
    case 0: return gelu_erf_grad_cpu(ctx);
    case 1: return gelu_tanh_grad_cpu(ctx);
    default: return om_err_unsupported(ctx->node, "approximate must be \"none\" or \"tanh\"");
    }
}

static om_status *infer_gelu_grad(om_kernel_ctx *ctx) {
    if (gelu_mode(ctx->node) < 0) return om_err_unsupported(ctx->node, "approximate must be \"none\" or \"tanh\"");
    return infer_grad2(ctx);
}

/* ---- unary gradients ---------------------------------------------------------------------- */

/* dx = OP(dy, saved), saved = forward input (use_out 0) or output (1). */
static om_status *grad_fused(om_grad_ctx *c, om_op_id op, int use_out) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    EMIT_OK(c->dx[0] = om_emit2(c, op, c->dy[0], use_out ? out[0] : in[0]));
    return NULL;
}

static om_status *neg_grad(om_grad_ctx *c) {
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    EMIT_OK(c->dx[0] = om_emit1(c, om_op_neg_id, c->dy[0]));
    return NULL;
}
static om_status *relu_grad(om_grad_ctx *c) { return grad_fused(c, om_op_relu_grad_id, 1); }
static om_status *tanh_grad(om_grad_ctx *c) { return grad_fused(c, om_op_tanh_grad_id, 1); }
static om_status *sigmoid_grad(om_grad_ctx *c) { return grad_fused(c, om_op_sigmoid_grad_id, 1); }
static om_status *abs_grad(om_grad_ctx *c) { return grad_fused(c, om_op_abs_grad_id, 0); }
static om_status *exp_grad(om_grad_ctx *c) { return grad_fused(c, om_op_mul_id, 1); }
static om_status *log_grad(om_grad_ctx *c) { return grad_fused(c, om_op_div_id, 0); }

static om_status *gelu_grad(om_grad_ctx *c) {
    int tanh_mode = gelu_mode(&c->g->nodes[c->node]) == 1;
    OM_TRY(grad_fused(c, om_op_gelu_grad_id, 0));
    if (tanh_mode && c->dx[0] >= 0)
        om_grad_fail(c, om_node_set_string(c->g, om_emit_last(c), "approximate", "tanh"));
    return NULL;
}

/* erf'(x) = 2/sqrt(pi) exp(-x^2) */
static om_status *erf_grad(om_grad_ctx *c) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int x2 = om_emit2(c, om_op_mul_id, in[0], in[0]);
    EMIT_OK(x2);
    int nx2 = om_emit1(c, om_op_neg_id, x2);
    EMIT_OK(nx2);
    int e = om_emit1(c, om_op_exp_id, nx2);
    EMIT_OK(e);
    int k = om_emit_scalar(c, vdt(c->g, in[0]), 1.1283791670955126);
    EMIT_OK(k);
    int t = om_emit2(c, om_op_mul_id, e, k);
    EMIT_OK(t);
    EMIT_OK(c->dx[0] = om_emit2(c, om_op_mul_id, c->dy[0], t));
    return NULL;
}

/* y = sqrt(x): dx = 0.5 dy / y */
static om_status *sqrt_grad(om_grad_ctx *c) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int h = om_emit_scalar(c, vdt(c->g, out[0]), 0.5);
    EMIT_OK(h);
    int t = om_emit2(c, om_op_mul_id, c->dy[0], h);
    EMIT_OK(t);
    EMIT_OK(c->dx[0] = om_emit2(c, om_op_div_id, t, out[0]));
    return NULL;
}

/* y = 1/x: dx = -dy y^2 */
static om_status *reciprocal_grad(om_grad_ctx *c) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int y2 = om_emit2(c, om_op_mul_id, out[0], out[0]);
    EMIT_OK(y2);
    int t = om_emit2(c, om_op_mul_id, c->dy[0], y2);
    EMIT_OK(t);
    EMIT_OK(c->dx[0] = om_emit1(c, om_op_neg_id, t));
    return NULL;
}

/* sin' = cos, cos' = -sin */
static om_status *sin_grad(om_grad_ctx *c) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int d = om_emit1(c, om_op_cos_id, in[0]);
    EMIT_OK(d);
    EMIT_OK(c->dx[0] = om_emit2(c, om_op_mul_id, c->dy[0], d));
    return NULL;
}

static om_status *cos_grad(om_grad_ctx *c) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int d = om_emit1(c, om_op_sin_id, in[0]);
    EMIT_OK(d);
    int t = om_emit2(c, om_op_mul_id, c->dy[0], d);
    EMIT_OK(t);
    EMIT_OK(c->dx[0] = om_emit1(c, om_op_neg_id, t));
    return NULL;
}

/* sign' = 0 everywhere (and floor', ceil', round', as torch defines them): zeros of x's shape (a gradient, as torch gives one, not "none";
 * Where of two zeros rather than 0 * dy, which an inf in dy would turn into NaN) */
static om_status *sign_grad(om_grad_ctx *c) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int mask = om_emit2(c, om_op_equal_id, in[0], in[0]);
    EMIT_OK(mask);
    int zero = om_emit_scalar(c, vdt(c->g, c->dy[0]), 0.0);
    EMIT_OK(zero);
    int in3[3] = {mask, zero, zero};
    EMIT_OK(c->dx[0] = om_emit(c, om_op_where_id, in3, 3));
    return NULL;
}

/* d(a mod b)/da = 1; the divisor's gradient (-floor or -trunc of a/b) is refused by name */
static om_status *mod_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    if (c->dy[0] < 0) return NULL;
    if (c->need_dx[1])
        return om_error(OM_NO_GRADIENT, "Mod node '%s': the gradient for the divisor is not implemented",
                        c->g->nodes[c->node].name);
    if (c->need_dx[0]) EMIT_OK(c->dx[0] = om_emit_sum_to(c, c->dy[0], in[0]));
    return NULL;
}

/* ---- Identity ------------------------------------------------------------------------------ */

static om_status *infer_identity(om_kernel_ctx *ctx) {
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

static om_status *identity_cpu(om_kernel_ctx *ctx) {
    // y is x (the planner may alias them; then there is nothing to do)
    if (ctx->out[0].data != ctx->in[0].data)
        memmove(ctx->out[0].data, ctx->in[0].data, om_tensor_nbytes(&ctx->in[0]));
    return NULL;
}

static om_status *identity_grad(om_grad_ctx *c) {
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    EMIT_OK(c->dx[0] = om_emit1(c, om_op_identity_id, c->dy[0]));
    return NULL;
}

/* ---- StopGradient -----------------------------------------------------------------------------
 * The capture's mark for a value that does not require grad in PyTorch although it is computed
 * from one that does: x.detach(), a torch.no_grad() block, anything computed only from those.
 * Forward it is Identity (the planner aliases it); autodiff sees diff_inputs == 0 and no rule,
 * so no gradient flows into its input — exactly what eager autograd does. */

/* ---- Cast ------------------------------------------------------------------------------------ */

/* fp16/bf16 <-> fp32 with round to nearest even: core/half.h. */

/* Float -> integer saturates (C leaves out-of-range conversion undefined); NaN -> 0. */
static inline int64_t sat_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}
static inline int64_t id_i64(int64_t v) { return v; }
#define TO_I64(v) _Generic((v), double: sat_i64, default: id_i64)(v)

/* Loads go to int64 when the source is an integer (exact), to double otherwise. */
#define LD_F32(v) ((double)(v))
#define LD_F64(v) ((double)(v))
#define LD_F16(v) ((double)om_f16_to_f32(v))
#define LD_BF16(v) ((double)om_bf16_to_f32(v))
#define LD_INT(v) ((int64_t)(v))
#define LD_BOOL(v) ((int64_t)((v) != 0))
#define ST_F32(v) ((float)(v))
#define ST_F64(v) ((double)(v))
#define ST_F16(v) om_f32_to_f16((float)(v))
#define ST_BF16(v) om_f32_to_bf16((float)(v))
#define ST_I64(v) TO_I64(v)
#define ST_I32(v) ((int32_t)TO_I64(v))
#define ST_I8(v) ((int8_t)TO_I64(v))
#define ST_U8(v) ((uint8_t)TO_I64(v))
#define ST_BOOL(v) ((uint8_t)((v) != 0))

#define CAST_RUN(TS, LD, TD, ST)                                                             \
    do {                                                                                     \
        const TS *restrict sp = (const TS *)ctx->in[0].data;                                 \
        TD *restrict dp = (TD *)ctx->out[0].data;                                            \
        OM_CHUNKED(n, { for (int64_t i = om_lo; i < om_hi; i++) dp[i] = ST(LD(sp[i])); });    \
    } while (0)

#define CAST_TO(TS, LD)                                                                      \
    switch (to) {                                                                            \
    case OM_F32: CAST_RUN(TS, LD, float, ST_F32); break;                                     \
    case OM_F64: CAST_RUN(TS, LD, double, ST_F64); break;                                    \
    case OM_F16: CAST_RUN(TS, LD, uint16_t, ST_F16); break;                                  \
    case OM_BF16: CAST_RUN(TS, LD, uint16_t, ST_BF16); break;                                \
    case OM_I64: CAST_RUN(TS, LD, int64_t, ST_I64); break;                                   \
    case OM_I32: CAST_RUN(TS, LD, int32_t, ST_I32); break;                                   \
    case OM_I8: CAST_RUN(TS, LD, int8_t, ST_I8); break;                                      \
    case OM_U8: CAST_RUN(TS, LD, uint8_t, ST_U8); break;                                     \
    case OM_BOOL: CAST_RUN(TS, LD, uint8_t, ST_BOOL); break;                                 \
    default: return om_err_unsupported(ctx->node, "Cast to this dtype");                    \
    }

static om_dtype dtype_cast(const om_graph *g, const om_node *n, int j) {
    return (om_dtype)om_attr_int(n, "to", OM_UNDEFINED);
}

static int cast_dtype_ok(om_dtype d) { return om_dtype_in(d, DT_CAST); }

static om_status *infer_cast(om_kernel_ctx *ctx) {
    om_dtype to = (om_dtype)om_attr_int(ctx->node, "to", OM_UNDEFINED);
    OM_TRY(check_dtype(ctx, 0, DT_CAST));
    if (!cast_dtype_ok(to)) {
        char what[64];
        snprintf(what, sizeof what, "Cast to ONNX dtype %d", (int)to);
        return om_err_unsupported(ctx->node, what);
    }
    om_set_shape(&ctx->out[0], &ctx->in[0], to);
    return NULL;
}

OM_VEC_CLONES static om_status *cast_cpu(om_kernel_ctx *ctx) {
    // x is any shape; y like x in dtype `to`
    const om_dtype to = ctx->out[0].dtype, from = ctx->in[0].dtype;
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    if (to == from) {
        if (ctx->out[0].data != ctx->in[0].data)
            memmove(ctx->out[0].data, ctx->in[0].data, om_tensor_nbytes(&ctx->in[0]));
        return NULL;
    }
    switch (from) {
    case OM_F32: CAST_TO(float, LD_F32); break;
    case OM_F64: CAST_TO(double, LD_F64); break;
    case OM_F16: CAST_TO(uint16_t, LD_F16); break;
    case OM_BF16: CAST_TO(uint16_t, LD_BF16); break;
    case OM_I64: CAST_TO(int64_t, LD_INT); break;
    case OM_I32: CAST_TO(int32_t, LD_INT); break;
    case OM_I8: CAST_TO(int8_t, LD_INT); break;
    case OM_U8: CAST_TO(uint8_t, LD_INT); break;
    case OM_BOOL: CAST_TO(uint8_t, LD_BOOL); break;
    default: return om_err_dtype(ctx->node, 0, from);
    }
    return NULL;
}

/* Between float dtypes the gradient is cast back; through an integer there is none. */
static om_status *cast_grad(om_grad_ctx *c) {
    int in[1], out[1];
    node_io(c, in, 1, out, 1);
    om_dtype from = vdt(c->g, in[0]), to = vdt(c->g, out[0]);
    if (c->dy[0] < 0 || !c->need_dx[0] || !om_dtype_is_float(from) || !om_dtype_is_float(to)) return NULL;
    int v = om_emit1(c, om_op_cast_id, c->dy[0]);
    EMIT_OK(v);
    om_emit_attr_int(c, "to", from);
    /* the dtype rule ran at emit time, before "to" was set */
    c->g->values[v].dtype = from;
    c->dx[0] = v;
    return NULL;
}

/* ---- Dropout ---------------------------------------------------------------------------------- */

static om_dtype dtype_dropout(const om_graph *g, const om_node *n, int j) {
    return j == 1 ? OM_BOOL : vdt(g, n->in[0]);
}

static om_status *infer_dropout(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_FLOAT));
    if (om_in_present(ctx, 1)) OM_TRY(check_dtype(ctx, 1, OM_DT_FLOAT));
    if (om_in_present(ctx, 2) && ctx->in[2].dtype != OM_BOOL) return om_err_dtype(ctx->node, 2, ctx->in[2].dtype);
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    if (ctx->n_out > 1) om_set_shape(&ctx->out[1], &ctx->in[0], OM_BOOL);
    return NULL;
}

/* ops/op_util.h */
om_status *om_dropout_params(const om_kernel_ctx *ctx, int ri, int ti, double *ratio, int *training, double *scale) {
    *ratio = 0.5;
    *training = 0;
    *scale = 1.0;
    if (om_in_present(ctx, ri)) OM_TRY(read_scalar_float(ctx, ri, ratio));
    if (om_in_present(ctx, ti)) {
        if (!ctx->in[ti].data || om_tensor_numel(&ctx->in[ti]) != 1)
            return om_error(OM_INVALID_ARGUMENT, "node '%s': training_mode must be a scalar bool", ctx->node->name);
        *training = *(const uint8_t *)ctx->in[ti].data != 0;
    }
    if (*training && !(*ratio >= 0.0 && *ratio <= 1.0))
        return om_error(OM_INVALID_ARGUMENT, "node '%s': dropout ratio %g is outside [0, 1]", ctx->node->name,
                        *ratio);
    *scale = *ratio < 1.0 ? 1.0 / (1.0 - *ratio) : 0.0;   /* ratio 1 drops everything */
    return NULL;
}

typedef struct dropout_job {
    om_dtype dt;
    const void *x;      /* Dropout: x; DropoutGrad: dy */
    void *y;            /* Dropout: y; DropoutGrad: dx */
    uint8_t *mask;      /* Dropout: written when wanted; DropoutGrad: read */
    uint64_t seed;
    float ratio;
    double scale;
} dropout_job;

#define DROPOUT_RANGE(name, T)                                                                \
    static void name(void *c, int64_t lo, int64_t hi) {                                       \
        const dropout_job *j = c;                                                             \
        const T *restrict xp = j->x;                                                          \
        T *restrict yp = j->y;                                                                \
        const T s = (T)j->scale;                                                              \
        for (int64_t i = lo; i < hi; i++) {                                                   \
            const int keep = om_rand_uniform(j->seed, (uint64_t)i) >= j->ratio;               \
            if (j->mask) j->mask[i] = (uint8_t)keep;                                          \
            yp[i] = keep ? xp[i] * s : (T)0;                                                  \
        }                                                                                     \
    }                                                                                         \
    OM_VEC_CLONES static void name##_grad(void *c, int64_t lo, int64_t hi) {                  \
        const dropout_job *j = c;                                                             \
        const T *restrict dyp = j->x;                                                         \
        const uint8_t *restrict mp = j->mask;                                                 \
        T *restrict dxp = j->y;                                                               \
        const T s = (T)j->scale;                                                              \
        for (int64_t i = lo; i < hi; i++) dxp[i] = mp[i] ? dyp[i] * s : (T)0;                \
    }
DROPOUT_RANGE(dropout_f32, float)
DROPOUT_RANGE(dropout_f64, double)

static void dropout_range(void *c, int64_t lo, int64_t hi) {
    if (((const dropout_job *)c)->dt == OM_F32) dropout_f32(c, lo, hi);
    else dropout_f64(c, lo, hi);
}

static void dropout_grad_range(void *c, int64_t lo, int64_t hi) {
    if (((const dropout_job *)c)->dt == OM_F32) dropout_f32_grad(c, lo, hi);
    else dropout_f64_grad(c, lo, hi);
}

static om_status *dropout_cpu(om_kernel_ctx *ctx) {
    // x is any shape, flattened to (N,); y like x; mask (N,) bool
    double ratio, scale;
    int training;
    OM_TRY(om_dropout_params(ctx, 1, 2, &ratio, &training, &scale));
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    uint8_t *mask = ctx->n_out > 1 ? (uint8_t *)ctx->out[1].data : NULL;
    if (!training || ratio == 0.0) {
        if (ctx->out[0].data != ctx->in[0].data)
            memmove(ctx->out[0].data, ctx->in[0].data, om_tensor_nbytes(&ctx->in[0]));
        if (mask) memset(mask, 1, (size_t)n);
        return NULL;
    }
    /* mask[i] depends only on (seed, i): the same on any thread split. */
    if (ctx->in[0].dtype != OM_F32 && ctx->in[0].dtype != OM_F64) return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    dropout_job j = {.dt = ctx->in[0].dtype, .x = ctx->in[0].data, .y = ctx->out[0].data, .mask = mask,
                     .seed = ctx->seed, .ratio = (float)ratio, .scale = scale};
    om_pool_for(n, OM_GRAIN, dropout_range, &j);
    return NULL;
}

/* dx = DropoutGrad(dy, mask, ratio, training_mode); without a training_mode input the
 * op is the identity and so is its gradient. The mask output is created if the model did
 * not ask for it, so that the forward saves it. */
static om_status *dropout_grad(om_grad_ctx *c) {
    int in[3], out[2];
    node_io(c, in, 3, out, 2);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    if (in[2] < 0) {
        EMIT_OK(c->dx[0] = om_emit1(c, om_op_identity_id, c->dy[0]));
        return NULL;
    }
    int mask = om_node_ensure_output(c->g, c->node, 1, OM_BOOL);
    if (mask < 0)
        return om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "node '%s': cannot add the Dropout mask output",
                                        c->g->nodes[c->node].name));
    int g_in[4] = {c->dy[0], mask, in[1], in[2]};
    EMIT_OK(c->dx[0] = om_emit(c, om_op_dropout_grad_id, g_in, 4));
    return NULL;
}

static om_status *infer_dropout_grad(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_FLOAT));
    if (ctx->in[1].dtype != OM_BOOL) return om_err_dtype(ctx->node, 1, ctx->in[1].dtype);
    OM_TRY(check_same_numel(ctx, 0, 1));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

static om_status *dropout_grad_cpu(om_kernel_ctx *ctx) {
    // dy, mask are (N,); dx like dy
    double ratio, scale;
    int training;
    OM_TRY(om_dropout_params(ctx, 2, 3, &ratio, &training, &scale));
    const int64_t n = om_tensor_numel(&ctx->in[0]);
    if (!training) {
        if (ctx->out[0].data != ctx->in[0].data)
            memmove(ctx->out[0].data, ctx->in[0].data, om_tensor_nbytes(&ctx->in[0]));
        return NULL;
    }
    if (ctx->in[0].dtype != OM_F32 && ctx->in[0].dtype != OM_F64) return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    dropout_job j = {.dt = ctx->in[0].dtype, .x = ctx->in[0].data, .y = ctx->out[0].data,
                     .mask = (uint8_t *)ctx->in[1].data, .scale = scale};
    om_pool_for(n, OM_GRAIN, dropout_grad_range, &j);
    return NULL;
}

/* ---- SumToShape ------------------------------------------------------------------------------- */

static om_status *infer_sum_to_shape(om_kernel_ctx *ctx) {
    OM_TRY(check_dtype(ctx, 0, OM_DT_ARITH));
    int64_t t[OM_MAX_RANK];
    int r = om_read_ints(&ctx->in[1], t, OM_MAX_RANK);
    if (r < 0)
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (SumToShape): the target shape must be a 1-D int64 "
                        "tensor known at plan time", ctx->node->name);
    const om_tensor *x = &ctx->in[0];
    /* A target of higher rank than x is never a broadcast operand of x (and Expand, the
     * gradient, could not undo it): rejected. */
    if (r > x->rank) {
        char sx[128];
        om_shape_str(x, sx, sizeof sx);
        return om_error(OM_INVALID_ARGUMENT, "node '%s' (SumToShape): %s cannot be summed to a shape of rank %d",
                        ctx->node->name, sx, r);
    }
    for (int i = 0; i < r; i++) {
        int64_t xd = x->dims[i + (x->rank - r)];
        if (t[i] != xd && t[i] != 1) {
            char sx[128];
            om_shape_str(x, sx, sizeof sx);
            return om_error(OM_INVALID_ARGUMENT, "node '%s' (SumToShape): %s cannot be summed to a shape with "
                            "%lld at axis %d", ctx->node->name, sx, (long long)t[i], i);
        }
    }
    ctx->out[0].dtype = x->dtype;
    ctx->out[0].rank = r;
    for (int i = 0; i < r; i++) ctx->out[0].dims[i] = t[i];
    return NULL;
}

/* Accumulates x's runs into out; ACC is the accumulator type for a run summed to one
 * element (double for floats: long rows lose less precision). */
#define SUM_TO_LOOP(T, ACC)                                                                   \
    do {                                                                                      \
        const T *xp = (const T *)ctx->in[0].data;                                             \
        T *op = (T *)ctx->out[0].data;                                                        \
        memset(op, 0, om_tensor_nbytes(&ctx->out[0]));                                        \
        int64_t idx[OM_MAX_RANK], off[OM_BCAST_MAX_OPS];                                      \
        om_bcast_start(&p, 0, idx, off);                                                      \
        for (int64_t b = 0; b < p.n_outer; b++) {                                             \
            const T *restrict xr = xp + off[0];                                               \
            T *restrict orow = op + off[1];                                                   \
            if (p.step[1]) {                                                                  \
                for (int64_t i = 0; i < p.inner; i++) orow[i] += xr[i];                       \
            } else {                                                                          \
                /* four partial sums: independent adds the CPU can overlap */              \
                ACC a0 = 0, a1 = 0, a2 = 0, a3 = 0;                                           \
                int64_t i = 0;                                                                \
                for (; i + 4 <= p.inner; i += 4) {                                            \
                    a0 += xr[i]; a1 += xr[i + 1]; a2 += xr[i + 2]; a3 += xr[i + 3];           \
                }                                                                             \
                for (; i < p.inner; i++) a0 += xr[i];                                         \
                orow[0] += (T)((a0 + a1) + (a2 + a3));                                        \
            }                                                                                 \
            om_bcast_next(&p, idx, off);                                                      \
        }                                                                                     \
    } while (0)

/* 1 when out is x summed over its leading axes only: out's dims, right-aligned, are x's
 * trailing dims, preceded by ones (a bias gradient's pattern). */
static int sums_leading_axes(const om_tensor *x, const om_tensor *out) {
    int i = out->rank - 1, k = x->rank - 1;
    for (; i >= 0 && k >= 0 && out->dims[i] == x->dims[k] && out->dims[i] != 1; i--, k--) {}
    for (; i >= 0; i--)
        if (out->dims[i] != 1) return 0;
    return 1;
}

OM_VEC_CLONES static om_status *sum_to_shape_cpu(om_kernel_ctx *ctx) {
    // x is any shape; out is the target shape: rank <= x's, each dim 1 or x's (right-aligned)
    const om_tensor *x = &ctx->in[0];
    if (om_tensor_numel(&ctx->out[0]) == om_tensor_numel(x)) {   /* nothing was broadcast */
        if (ctx->out[0].data != x->data) memmove(ctx->out[0].data, x->data, om_tensor_nbytes(x));
        return NULL;
    }
    const int64_t N = om_tensor_numel(&ctx->out[0]);
    if ((x->dtype == OM_F32 || x->dtype == OM_F64) && N > 0 && sums_leading_axes(x, &ctx->out[0]))
        return om_sum_rows(x->dtype, om_tensor_numel(x) / N, N, x->data, ctx->out[0].data);   /* on the pool */
    om_bcast p;
    const om_tensor *ops[2] = {x, &ctx->out[0]};
    OM_TRY(om_bcast_init(&p, ctx->node, x, ops, 2));
    switch (x->dtype) {
    case OM_F32: SUM_TO_LOOP(float, double); break;
    case OM_F64: SUM_TO_LOOP(double, double); break;
    case OM_I32: SUM_TO_LOOP(int32_t, int64_t); break;
    case OM_I64: SUM_TO_LOOP(int64_t, int64_t); break;
    default: return om_err_dtype(ctx->node, 0, x->dtype);
    }
    return NULL;
}

/* The adjoint of a sum over broadcast axes is broadcasting back. */
static om_status *sum_to_shape_grad(om_grad_ctx *c) {
    int in[2], out[1];
    node_io(c, in, 2, out, 1);
    if (c->dy[0] < 0 || !c->need_dx[0]) return NULL;
    int s = om_emit_shape(c, in[0]);
    EMIT_OK(s);
    EMIT_OK(c->dx[0] = om_emit2(c, om_op_expand_id, c->dy[0], s));
    return NULL;
}

/* ---- the table entries ------------------------------------------------------------------------ */

/* Elementwise kernels read element i before writing element i: they may run in place.
 * The kernel argument may be followed by more fields: `cpu_fn, .attrs = "..."` (op.h). */
#define BIN(sym, nm, infer_fn, grad_fn, ...)                                                  \
    const om_op_def sym = {.name = nm, .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1, \
                           .flags = OM_OP_INPLACE, .infer = infer_fn, .grad = grad_fn,                      \
                           .diff_inputs = 0x3u, .cpu = __VA_ARGS__};
#define UN(sym, nm, infer_fn, grad_fn, ...)                                                   \
    const om_op_def sym = {.name = nm, .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1, \
                           .flags = OM_OP_INPLACE, .infer = infer_fn, .grad = grad_fn,                      \
                           .diff_inputs = 0x1u, .cpu = __VA_ARGS__};
#define GRAD_OP(sym, nm, infer_fn, ...)                                                       \
    const om_op_def sym = {.name = nm, .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1, \
                           .flags = OM_OP_INPLACE, .infer = infer_fn, .cpu = __VA_ARGS__};

BIN(om_op_add, "Add", infer_binary_arith, add_grad, add_cpu)
BIN(om_op_sub, "Sub", infer_binary_arith, sub_grad, sub_cpu)
BIN(om_op_mul, "Mul", infer_binary_arith, mul_grad, mul_cpu)
BIN(om_op_div, "Div", infer_binary_arith, div_grad, div_cpu)
BIN(om_op_pow, "Pow", infer_pow, pow_grad, pow_cpu)
BIN(om_op_max, "Max", infer_binary_arith, maxmin_grad, max_cpu)
BIN(om_op_min, "Min", infer_binary_arith, maxmin_grad, min_cpu)
BIN(om_op_prelu, "PRelu", infer_binary_arith, prelu_grad, prelu_cpu)
BIN(om_op_mod, "Mod", infer_binary_arith, mod_grad, mod_cpu, .attrs = "fmod:int")

const om_op_def om_op_equal = {.name = "Equal", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1,
                               .max_out = 1, .dtype = dtype_bool, .infer = infer_equal, .cpu = equal_cpu};
const om_op_def om_op_where = {.name = "Where", .domain = "", .min_in = 3, .max_in = 3, .min_out = 1,
                               .max_out = 1, .flags = OM_OP_ANY_DTYPE, .dtype = dtype_where, .infer = infer_where,
                               .grad = where_grad, .cpu = where_cpu, .diff_inputs = 0x6u};

UN(om_op_neg, "Neg", infer_unary_arith, neg_grad, neg_cpu)
UN(om_op_relu, "Relu", infer_unary_arith, relu_grad, relu_cpu)
UN(om_op_abs, "Abs", infer_unary_arith, abs_grad, abs_cpu)
UN(om_op_tanh, "Tanh", infer_unary_float, tanh_grad, tanh_cpu)
UN(om_op_sigmoid, "Sigmoid", infer_unary_float, sigmoid_grad, sigmoid_cpu)
UN(om_op_gelu, "Gelu", infer_gelu, gelu_grad, gelu_cpu, .attrs = "approximate:string=none|tanh")
UN(om_op_erf, "Erf", infer_unary_float, erf_grad, erf_cpu)
UN(om_op_sqrt, "Sqrt", infer_unary_float, sqrt_grad, sqrt_cpu)
UN(om_op_exp, "Exp", infer_unary_float, exp_grad, exp_cpu)
UN(om_op_log, "Log", infer_unary_float, log_grad, log_cpu)
UN(om_op_reciprocal, "Reciprocal", infer_unary_float, reciprocal_grad, reciprocal_cpu)
UN(om_op_sin, "Sin", infer_unary_float, sin_grad, sin_cpu)
UN(om_op_cos, "Cos", infer_unary_float, cos_grad, cos_cpu)
UN(om_op_sign, "Sign", infer_unary_arith, sign_grad, sign_cpu)
UN(om_op_floor, "Floor", infer_unary_float, sign_grad, floor_cpu)
UN(om_op_ceil, "Ceil", infer_unary_float, sign_grad, ceil_cpu)
UN(om_op_round, "Round", infer_unary_float, sign_grad, round_cpu)

const om_op_def om_op_identity = {.name = "Identity", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1,
                                  .max_out = 1, .flags = OM_OP_ALIAS | OM_OP_ANY_DTYPE, .infer = infer_identity,
                                  .grad = identity_grad, .cpu = identity_cpu, .diff_inputs = 0x1u};
const om_op_def om_op_stop_gradient = {.name = "StopGradient", .domain = "ortmod", .min_in = 1, .max_in = 1,
                                      .min_out = 1, .max_out = 1, .flags = OM_OP_ALIAS | OM_OP_ANY_DTYPE,
                                      .infer = infer_identity, .cpu = identity_cpu, .diff_inputs = 0};
/* saturate and round_mode act only on float8 targets, which Cast refuses (DT_CAST): every
 * Cast ortmod runs means the same whatever their values */
const om_op_def om_op_cast = {.name = "Cast", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1,
                              .max_out = 1, .flags = OM_OP_ANY_DTYPE, .dtype = dtype_cast, .infer = infer_cast,
                              .grad = cast_grad, .cpu = cast_cpu, .diff_inputs = 0x1u,
                              .attrs = "to:int saturate:int round_mode:string"};
/* no attributes: a seed attribute is refused, since the masks come from the engine's own
 * random streams (om_engine_options.seed), not from a seed the model fixes */
const om_op_def om_op_dropout = {.name = "Dropout", .domain = "", .min_in = 1, .max_in = 3, .min_out = 1,
                                 .max_out = 2, .flags = OM_OP_RANDOM, .dtype = dtype_dropout,
                                 .infer = infer_dropout, .grad = dropout_grad, .cpu = dropout_cpu,
                                 .diff_inputs = 0x1u};
/* In place: where nothing was broadcast (the same shape) the sum is x itself, and the planner merges
 * the buffers only then, so the gradient of a same-shape Mul/Add operand costs no copy. */
const om_op_def om_op_sum_to_shape = {.name = "SumToShape", .domain = "ortmod", .min_in = 2, .max_in = 2,
                                      .min_out = 1, .max_out = 1, .flags = OM_OP_INPLACE, .infer = infer_sum_to_shape,
                                      .grad = sum_to_shape_grad, .cpu = sum_to_shape_cpu, .diff_inputs = 0x1u};

GRAD_OP(om_op_relu_grad, "ReluGrad", infer_grad2, relu_grad_cpu)
GRAD_OP(om_op_tanh_grad, "TanhGrad", infer_grad2, tanh_grad_cpu)
GRAD_OP(om_op_sigmoid_grad, "SigmoidGrad", infer_grad2, sigmoid_grad_cpu)
GRAD_OP(om_op_abs_grad, "AbsGrad", infer_grad2, abs_grad_cpu)
GRAD_OP(om_op_gelu_grad, "GeluGrad", infer_gelu_grad, gelu_grad_cpu, .attrs = "approximate:string=none|tanh")

const om_op_def om_op_dropout_grad = {.name = "DropoutGrad", .domain = "ortmod", .min_in = 2, .max_in = 4,
                                      .min_out = 1, .max_out = 1, .infer = infer_dropout_grad,
                                      .cpu = dropout_grad_cpu};
