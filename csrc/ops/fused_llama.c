/* fused_llama.c — the fused ops of Llama-style blocks (passes swiglu and rotary_embedding,
 * passes/fuse_swiglu.c and passes/fuse_rotary_embedding.c) and their backward ops. Domain "ortmod".
 *
 * Exports:
 *   om_op_swiglu                 SwiGLU               (gate, up) -> silu(gate) * up = (gate sigmoid(gate)) up
 *   om_op_swiglu_grad            SwiGLUGrad           (dy, gate, up) -> (dgate?, dup?), both of dy's shape
 *   om_op_fused_rotary       FusedRotary      (x, cos, sin, split, end) -> x cos + rotate_half(x) sin
 *   om_op_fused_rotary_grad  FusedRotaryGrad  (dy, cos, sin, split, end, x?) -> (dx?, dcos?, dsin?)
 *                                                     dcos = dy x and dsin = dy rotate_half(x), of dy's shape
 *
 * FusedRotary is not ORT's com.microsoft.RotaryEmbedding nor ONNX 23's RotaryEmbedding (position
 * ids, half-width caches, attributes): another signature, so another name (om_op_find serves
 * com.microsoft nodes with the ortmod op of the same name).
 *
 * SwiGLU broadcasts gate and up against each other as the Mul it replaces does. SwiGLUGrad
 * computes both gradients in one pass over dy, gate and up (sigmoid recomputed, nothing else
 * stashed) at the output's shape; the gradient rule sums each back to its input's shape
 * (SumToShape, which runs in place when nothing was broadcast).
 *
 * rotate_half is torch.cat((-x[..., s:e], x[..., :s]), dim=-1) along x's last dim d, as
 * Llama's reference code (s = d/2) and torch.chunk (s = ceil(d/2)) export it:
 *
 *     rot(x)_j = -x_{s+j}      for j < d - s
 *                 x_{j-(d-s)}  for j >= d - s
 *
 * split (s) and end (e) are the Slices' bounds: values computed from shapes, so known at plan
 * time, where the shape rule clamps them as Slice does and checks that the two halves cover
 * the last dim exactly. cos and sin broadcast into x: the output has x's shape. The transpose
 * gives dx_i = dy_i cos_i + (i < s ? dy_{i+d-s} sin_{i+d-s} : -(dy_{i-s} sin_{i-s})).
 *
 * Every formula is the unfused graph's, operation for operation in the same order (the C code
 * is compiled without FMA contraction), so fp32 and fp64 results are the unfused ones exactly;
 * fp16/bf16 run on fp32 twins (om_cpu_run), rounded once on store, as the CUDA kernels
 * (cuda/fused_llama.cu) do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "ops/broadcast.h"
#include "ops/op_util.h"
#include "ops/op.h"
#include "ops/vecmath.h"

static int wanted(const om_kernel_ctx *ctx, int j) { return j < ctx->n_out && ctx->out[j].data != NULL; }
/* ---- SwiGLU ----------------------------------------------------------------------- */

static om_status *swiglu_infer(om_kernel_ctx *ctx) {
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    OM_TRY(om_check_float(ctx->node, &ctx->in[1], 1, ctx->in[0].dtype));
    om_tensor shape;
    OM_TRY(om_broadcast_shape(&ctx->in[0], &ctx->in[1], &shape));
    om_set_shape(&ctx->out[0], &shape, ctx->in[0].dtype);
    return NULL;
}

/* One pass over the output (or dy) with gate and up broadcast into it: a plan over
 * (out, gate, up) whose runs are unit-stride or held for each operand. */
typedef struct swiglu_job {
    om_bcast p;
    om_dtype dt;
    const void *g, *u, *dy;
    void *y, *dg, *du;    /* forward: y; backward: dg and/or du (NULL when not wanted) */
} swiglu_job;

/* y = (g s) u with s = sigmoid(g): Mul(g, Sigmoid(g)), then Mul(., up). G(i), U(i) index the run. */
#define SWIGLU_FWD(T, SIG, G, U)                                                             \
    for (int64_t i = 0; i < n; i++) {                                                        \
        const T gv = g[G], uv = u[U];                                                        \
        y[i] = (gv * SIG(gv)) * uv;                                                          \
    }

/* t = dy u; dgate = t s + ((t g) s)(1 - s)  (Mul's gradient through g, plus SigmoidGrad's);
 * dup = dy (g s) */
#define SWIGLU_BWD(T, SIG, G, U, STORE)                                                      \
    for (int64_t i = 0; i < n; i++) {                                                        \
        const T gv = g[G], uv = u[U], d = dy[i];                                             \
        const T s = SIG(gv);                                                                 \
        const T t = d * uv;                                                                  \
        const T a = t * s, b = ((t * gv) * s) * ((T)1 - s);                                 \
        const T v = d * (gv * s);                                                            \
        STORE;                                                                               \
    }

/* The run starting at element offsets off (out, gate, up), n long, gate/up stepping sg/su (0 or 1). */
#define SWIGLU_RUN(T, SIG)                                                                                   \
    do {                                                                                                     \
        const T *restrict g = (const T *)j->g + off[1], *restrict u = (const T *)j->u + off[2];              \
        if (j->y) {                                                                                          \
            T *restrict y = (T *)j->y + off[0];                                                              \
            if (sg && su) SWIGLU_FWD(T, SIG, i, i)                                                           \
            else SWIGLU_FWD(T, SIG, i * sg, i * su)                                                          \
            break;                                                                                           \
        }                                                                                                    \
        const T *restrict dy = (const T *)j->dy + off[0];                                                    \
        T *restrict dg = j->dg ? (T *)j->dg + off[0] : NULL, *restrict du = j->du ? (T *)j->du + off[0] : NULL; \
        if (sg && su && dg && du) SWIGLU_BWD(T, SIG, i, i, (dg[i] = a + b, du[i] = v))                      \
        else if (dg && du) SWIGLU_BWD(T, SIG, i * sg, i * su, (dg[i] = a + b, du[i] = v))                   \
        else if (dg) SWIGLU_BWD(T, SIG, i * sg, i * su, (dg[i] = a + b, (void)v))                           \
        else SWIGLU_BWD(T, SIG, i * sg, i * su, ((void)a, (void)b, du[i] = v))                              \
    } while (0)

OM_VEC_CLONES static void swiglu_run_f32(const swiglu_job *j, const int64_t *off, int64_t n, int sg, int su) {
    SWIGLU_RUN(float, sigmoid_f32);
}

static void swiglu_run_f64(const swiglu_job *j, const int64_t *off, int64_t n, int sg, int su) {
    SWIGLU_RUN(double, sigmoid_f64);
}

static void swiglu_range(void *c, int64_t lo, int64_t hi) {
    const swiglu_job *j = c;
    const om_bcast *p = &j->p;
    void (*run)(const swiglu_job *, const int64_t *, int64_t, int, int) = j->dt == OM_F32 ? swiglu_run_f32
                                                                                         : swiglu_run_f64;
    if (p->n_outer == 1) {   /* one run: work items are its elements */
        int64_t off[3] = {lo, p->step[1] ? lo : 0, p->step[2] ? lo : 0};
        run(j, off, hi - lo, p->step[1], p->step[2]);
        return;
    }
    int64_t idx[OM_MAX_RANK], off[OM_BCAST_MAX_OPS];
    om_bcast_start(p, lo, idx, off);
    for (int64_t r = lo; r < hi; r++) {
        run(j, off, p->inner, p->step[1], p->step[2]);
        om_bcast_next(p, idx, off);
    }
}

/* space: the output's (or dy's) shape; gate and up broadcast into it. */
static om_status *swiglu_go(const om_kernel_ctx *ctx, swiglu_job *j, const om_tensor *space, const om_tensor *g,
                            const om_tensor *u) {
    if (j->dt != OM_F32 && j->dt != OM_F64) return om_err_dtype(ctx->node, 0, j->dt);
    if (om_tensor_numel(space) == 0) return NULL;
    const om_tensor *ops[3] = {space, g, u};
    OM_TRY(om_bcast_init(&j->p, ctx->node, space, ops, 3));
    int64_t n = j->p.n_outer == 1 ? j->p.inner : j->p.n_outer;
    int64_t grain = j->p.n_outer == 1 ? OM_GRAIN / 4 : (j->p.inner >= OM_GRAIN / 4 ? 1 : OM_GRAIN / 4 / j->p.inner);
    om_pool_for(n, grain, swiglu_range, j);
    return NULL;
}

// gate, up broadcast to y's shape
static om_status *swiglu_cpu(om_kernel_ctx *ctx) {
    swiglu_job j = {.dt = ctx->in[0].dtype, .g = ctx->in[0].data, .u = ctx->in[1].data, .y = ctx->out[0].data};
    return swiglu_go(ctx, &j, &ctx->out[0], &ctx->in[0], &ctx->in[1]);
}

static om_status *swiglu_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    int gate = f->in[0], up = f->in[1], dy = c->dy[0];
    if (dy < 0) return NULL;
    int in[3] = {dy, gate, up}, out[2], want[2] = {c->need_dx[0], c->need_dx[1]};
    if (!want[0] && !want[1]) return NULL;
    if (om_emit_partial(c, om_op_swiglu_grad_id, in, 3, out, 2, want) < 0) return NULL;
    if (want[0]) c->dx[0] = om_emit_sum_to(c, out[0], gate);
    if (want[1]) c->dx[1] = om_emit_sum_to(c, out[1], up);
    return NULL;
}

static om_status *swiglu_grad_infer(om_kernel_ctx *ctx) {
    const om_tensor *dy = &ctx->in[0];
    OM_TRY(om_check_float(ctx->node, dy, 0, OM_UNDEFINED));
    OM_TRY(om_check_float(ctx->node, &ctx->in[1], 1, dy->dtype));
    OM_TRY(om_check_float(ctx->node, &ctx->in[2], 2, dy->dtype));
    om_tensor shape;
    OM_TRY(om_broadcast_shape(&ctx->in[1], &ctx->in[2], &shape));
    if (!om_shape_equal(&shape, dy)) {
        char s1[128], s2[128];
        om_shape_str(dy, s1, sizeof s1);
        om_shape_str(&shape, s2, sizeof s2);
        return om_error(OM_INVALID_ARGUMENT, "SwiGLUGrad node '%s': dy %s is not the forward's output shape %s",
                        ctx->node->name, s1, s2);
    }
    for (int j = 0; j < ctx->n_out; j++) om_set_shape(&ctx->out[j], dy, dy->dtype);
    return NULL;
}

// dy is (the output's shape), gate and up broadcast into it; dgate, dup of dy's shape
static om_status *swiglu_grad_cpu(om_kernel_ctx *ctx) {
    swiglu_job j = {.dt = ctx->in[0].dtype, .dy = ctx->in[0].data, .g = ctx->in[1].data, .u = ctx->in[2].data,
                    .dg = wanted(ctx, 0) ? ctx->out[0].data : NULL, .du = wanted(ctx, 1) ? ctx->out[1].data : NULL};
    if (!j.dg && !j.du) return NULL;
    return swiglu_go(ctx, &j, &ctx->in[0], &ctx->in[1], &ctx->in[2]);
}

/* ---- FusedRotary -------------------------------------------------------------- */

/* Slice's clamping of a bound v on an axis of length d (ONNX Slice, positive step). */
static int64_t slice_bound(int64_t v, int64_t d) {
    if (v < 0) v += d;
    return v < 0 ? 0 : v > d ? d : v;
}

/* The geometry of a FusedRotary(Grad) node: x's (or dy's) shape as rows of d, the split s,
 * and cos/sin's element strides over x's dims (0 where broadcast). */
typedef struct rope_geom {
    int rank;
    int64_t dims[OM_MAX_RANK];
    int64_t rows, d, s;
    int64_t cstr[OM_MAX_RANK], sstr[OM_MAX_RANK];
} rope_geom;

/* t must broadcast into x (the output keeps x's shape): its strides over x's dims, or an error. */
static om_status *rope_strides(const om_node *n, const om_tensor *x, const om_tensor *t, int i, const char *what,
                               int64_t *str) {
    int ok = t->rank <= x->rank;
    int64_t s = 1;
    for (int k = x->rank - 1; k >= 0; k--) {
        int kt = k - (x->rank - t->rank);
        int64_t td = kt >= 0 ? t->dims[kt] : 1;
        if (td != 1 && td != x->dims[k]) ok = 0;
        str[k] = td == 1 ? 0 : s;
        s *= td;
    }
    if (ok) return NULL;
    char sx[128], st[128];
    om_shape_str(x, sx, sizeof sx);
    om_shape_str(t, st, sizeof st);
    return om_error(OM_INVALID_ARGUMENT, "%s node '%s': %s (input %d) of shape %s does not broadcast into x's shape %s: "
                    "the rotary_embedding pass fused x*cos + rotate_half(x)*sin for a cos and sin that do "
                    "(ORTMOD_DISABLE_PASSES=rotary_embedding runs the ops unfused)", n->op->name, n->name, what, i, st, sx);
}

static om_status *rope_read_bound(const om_kernel_ctx *ctx, int i, int64_t *v) {
    int64_t vals[2];
    if (!om_in_present(ctx, i) || !ctx->in[i].data || om_read_ints(&ctx->in[i], vals, 2) != 1)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d (a rotate_half bound) must be one integer known at "
                        "plan time", ctx->node->op->name, ctx->node->name, i);
    *v = vals[0];
    return NULL;
}

/* x: input xi (FusedRotary's x, the gradient's dy); cos, sin, split, end at ci.. ci+3. */
static om_status *rope_geometry(const om_kernel_ctx *ctx, int xi, int ci, rope_geom *r) {
    const om_node *n = ctx->node;
    const om_tensor *x = &ctx->in[xi];
    OM_TRY(om_check_float(n, x, xi, OM_UNDEFINED));
    OM_TRY(om_check_float(n, &ctx->in[ci], ci, x->dtype));
    OM_TRY(om_check_float(n, &ctx->in[ci + 1], ci + 1, x->dtype));
    if (x->rank < 1)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': x must have rank >= 1", n->op->name, n->name);
    memset(r, 0, sizeof *r);
    r->rank = x->rank;
    memcpy(r->dims, x->dims, sizeof(int64_t) * (size_t)x->rank);
    r->d = x->dims[x->rank - 1];
    r->rows = r->d ? om_tensor_numel(x) / r->d : 0;
    OM_TRY(rope_strides(n, x, &ctx->in[ci], ci, "cos", r->cstr));
    OM_TRY(rope_strides(n, x, &ctx->in[ci + 1], ci + 1, "sin", r->sstr));
    int64_t split = 0, end = 0;
    OM_TRY(rope_read_bound(ctx, ci + 2, &split));
    OM_TRY(rope_read_bound(ctx, ci + 3, &end));
    /* concat(x[s:e], x[0:s]) along the last dim: s + (e - s) elements must be all d of them */
    int64_t s = slice_bound(split, r->d), e = slice_bound(end, r->d);
    int64_t covered = s + (e > s ? e - s : 0);
    if (covered != r->d)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': rotate_half's slices [%lld:%lld] and [0:%lld] cover %lld of the "
                        "last dim's %lld elements (ORTMOD_DISABLE_PASSES=rotary_embedding runs the ops unfused)",
                        n->op->name, n->name, (long long)split, (long long)end, (long long)split, (long long)covered,
                        (long long)r->d);
    r->s = s;
    return NULL;
}

static om_status *rope_infer(om_kernel_ctx *ctx) {
    rope_geom r;
    OM_TRY(rope_geometry(ctx, 0, 1, &r));
    om_set_shape(&ctx->out[0], &ctx->in[0], ctx->in[0].dtype);
    return NULL;
}

typedef struct rope_job {
    rope_geom r;
    om_dtype dt;
    const void *x, *c, *sn, *dy;
    void *y;                 /* forward */
    void *dx, *dc, *ds;      /* backward, each NULL when not wanted */
} rope_job;

/* Element offsets of cos and sin at the start of row `row` (x's leading dims). */
static void rope_row_offsets(const rope_geom *r, int64_t row, int64_t *co, int64_t *so) {
    int64_t c = 0, s = 0;
    for (int k = r->rank - 2; k >= 0 && row; k--) {
        int64_t q = row / r->dims[k], i = row - q * r->dims[k];
        c += i * r->cstr[k];
        s += i * r->sstr[k];
        row = q;
    }
    *co = c;
    *so = s;
}

/* One row of d: m = d - s elements of the negated second half, then s of the first.
 * Forward:  y_k = x_k c_k + (-x_{s+k}) sn_k      (k < m)     y_k = x_k c_k + x_{k-m} sn_k   (k >= m)
 * Backward: dx_k = dy_k c_k + dy_{k+m} sn_{k+m}  (k < s)     dx_k = dy_k c_k + (-(dy_{k-s} sn_{k-s}))
 *           dc_k = dy_k x_k,  ds_k = dy_k rot(x)_k
 * C(k), S(k) index cos's and sin's row (k, or 0 where broadcast along it). */
#define ROPE_ROW(T, C, S)                                                                                \
    do {                                                                                                 \
        if (j->y) {                                                                                      \
            const T *restrict x = (const T *)j->x + base;                                                \
            T *restrict y = (T *)j->y + base;                                                            \
            for (int64_t k = 0; k < m; k++) y[k] = x[k] * c[C(k)] + (-x[s + k]) * sn[S(k)];              \
            for (int64_t k = m; k < d; k++) y[k] = x[k] * c[C(k)] + x[k - m] * sn[S(k)];                 \
            break;                                                                                       \
        }                                                                                                \
        const T *restrict dy = (const T *)j->dy + base;                                                  \
        if (j->dx) {                                                                                     \
            T *restrict dx = (T *)j->dx + base;                                                          \
            for (int64_t k = 0; k < s; k++) dx[k] = dy[k] * c[C(k)] + dy[k + m] * sn[S(k + m)];          \
            for (int64_t k = s; k < d; k++) dx[k] = dy[k] * c[C(k)] + (-(dy[k - s] * sn[S(k - s)]));     \
        }                                                                                                \
        if (j->dc) {                                                                                     \
            const T *restrict x = (const T *)j->x + base;                                                \
            T *restrict dc = (T *)j->dc + base;                                                          \
            for (int64_t k = 0; k < d; k++) dc[k] = dy[k] * x[k];                                        \
        }                                                                                                \
        if (j->ds) {                                                                                     \
            const T *restrict x = (const T *)j->x + base;                                                \
            T *restrict ds = (T *)j->ds + base;                                                          \
            for (int64_t k = 0; k < m; k++) ds[k] = dy[k] * (-x[s + k]);                                 \
            for (int64_t k = m; k < d; k++) ds[k] = dy[k] * x[k - m];                                    \
        }                                                                                                \
    } while (0)
#define ROPE_AT(k) (k)
#define ROPE_HELD(k) 0

#define ROPE_RANGE(T)                                                                                    \
    for (int64_t row = lo; row < hi; row++) {                                                            \
        int64_t co, so;                                                                                  \
        rope_row_offsets(&j->r, row, &co, &so);                                                          \
        const int64_t base = row * d;                                                                    \
        const T *restrict c = (const T *)j->c + co, *restrict sn = (const T *)j->sn + so;                \
        if (cs && ss) ROPE_ROW(T, ROPE_AT, ROPE_AT);                                                     \
        else if (cs) ROPE_ROW(T, ROPE_AT, ROPE_HELD);                                                    \
        else if (ss) ROPE_ROW(T, ROPE_HELD, ROPE_AT);                                                    \
        else ROPE_ROW(T, ROPE_HELD, ROPE_HELD);                                                          \
    }

OM_VEC_CLONES static void rope_range(void *ctx, int64_t lo, int64_t hi) {
    const rope_job *j = ctx;
    const int64_t d = j->r.d, s = j->r.s, m = d - s;
    /* cos/sin step along the row unless broadcast there (a last dim of 1) */
    const int cs = j->r.cstr[j->r.rank - 1] != 0, ss = j->r.sstr[j->r.rank - 1] != 0;
    if (j->dt == OM_F32) {
        ROPE_RANGE(float)
    } else {
        ROPE_RANGE(double)
    }
}

static om_status *rope_go(const om_kernel_ctx *ctx, rope_job *j) {
    if (j->dt != OM_F32 && j->dt != OM_F64) return om_err_dtype(ctx->node, 0, j->dt);
    if (!j->r.rows || !j->r.d) return NULL;
    om_pool_for(j->r.rows, OM_GRAIN / 4 / j->r.d + 1, rope_range, j);
    return NULL;
}

// x is (..., d); cos, sin broadcast into x; split, end: rotate_half's bounds; y like x
static om_status *rope_cpu(om_kernel_ctx *ctx) {
    rope_job j = {.dt = ctx->in[0].dtype, .x = ctx->in[0].data, .c = ctx->in[1].data, .sn = ctx->in[2].data,
                  .y = ctx->out[0].data};
    OM_TRY(rope_geometry(ctx, 0, 1, &j.r));
    return rope_go(ctx, &j);
}

static om_status *rope_grad(om_grad_ctx *c) {
    const om_node *f = &c->g->nodes[c->node];
    int x = f->in[0], cs = f->in[1], sn = f->in[2], dy = c->dy[0];
    if (dy < 0) return NULL;
    int want[3] = {c->need_dx[0], c->need_dx[1], c->need_dx[2]}, out[3];
    if (!want[0] && !want[1] && !want[2]) return NULL;
    /* x is read only for cos's and sin's gradients (normally constants: not wanted) */
    int in[6] = {dy, cs, sn, f->in[3], f->in[4], want[1] || want[2] ? x : -1};
    if (om_emit_partial(c, om_op_fused_rotary_grad_id, in, 6, out, 3, want) < 0) return NULL;
    c->dx[0] = out[0];
    if (want[1]) c->dx[1] = om_emit_sum_to(c, out[1], cs);
    if (want[2]) c->dx[2] = om_emit_sum_to(c, out[2], sn);
    return NULL;
}

static om_status *rope_grad_infer(om_kernel_ctx *ctx) {
    rope_geom r;
    OM_TRY(rope_geometry(ctx, 0, 1, &r));
    const om_tensor *dy = &ctx->in[0];
    if (om_in_present(ctx, 5) && (om_check_float(ctx->node, &ctx->in[5], 5, dy->dtype) || !om_shape_equal(&ctx->in[5], dy)))
        return om_error(OM_INVALID_ARGUMENT, "FusedRotaryGrad node '%s': x must have dy's shape and dtype",
                        ctx->node->name);
    for (int j = 0; j < ctx->n_out; j++) om_set_shape(&ctx->out[j], dy, dy->dtype);
    return NULL;
}

// dy is x's shape (..., d); cos, sin broadcast into it; dx like dy; dcos, dsin (when wanted, from x) like dy
static om_status *rope_grad_cpu(om_kernel_ctx *ctx) {
    rope_job j = {.dt = ctx->in[0].dtype, .dy = ctx->in[0].data, .c = ctx->in[1].data, .sn = ctx->in[2].data,
                  .x = om_in_present(ctx, 5) ? ctx->in[5].data : NULL, .dx = wanted(ctx, 0) ? ctx->out[0].data : NULL,
                  .dc = wanted(ctx, 1) ? ctx->out[1].data : NULL, .ds = wanted(ctx, 2) ? ctx->out[2].data : NULL};
    OM_TRY(rope_geometry(ctx, 0, 1, &j.r));
    if ((j.dc || j.ds) && !j.x)
        return om_error(OM_INVALID_ARGUMENT, "FusedRotaryGrad node '%s': cos's or sin's gradient needs x (input 5)",
                        ctx->node->name);
    if (!j.dx && !j.dc && !j.ds) return NULL;
    return rope_go(ctx, &j);
}

/* ---- the defs --------------------------------------------------------------------- */

/* SwiGLU and SwiGLUGrad read each element of input 0 before writing the same element of
 * output 0 (and the planner merges them only when the shapes agree). FusedRotary reads
 * x_{s+j} after writing y_j: not in place. */
const om_op_def om_op_swiglu = {
    .name = "SwiGLU", .domain = "ortmod", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_INPLACE, .infer = swiglu_infer, .grad = swiglu_grad, .cpu = swiglu_cpu, .diff_inputs = 0x3,
};
const om_op_def om_op_swiglu_grad = {
    .name = "SwiGLUGrad", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 2,
    .flags = OM_OP_INPLACE, .infer = swiglu_grad_infer, .cpu = swiglu_grad_cpu,
};
const om_op_def om_op_fused_rotary = {
    .name = "FusedRotary", .domain = "ortmod", .min_in = 5, .max_in = 5, .min_out = 1, .max_out = 1,
    .infer = rope_infer, .grad = rope_grad, .cpu = rope_cpu, .diff_inputs = 0x7,
};
const om_op_def om_op_fused_rotary_grad = {
    .name = "FusedRotaryGrad", .domain = "ortmod", .min_in = 5, .max_in = 6, .min_out = 1, .max_out = 3,
    .infer = rope_grad_infer, .cpu = rope_grad_cpu,
};
