/* shape.c — the glue ops torch.onnx.export puts around every model: shapes, constants,
 * views and the data-moving ops (Transpose, Gather, Concat, Slice, Expand, Split).
 *
 * Exports (shape.list):
 *   om_op_shape               Shape            int64 dims of the input (attrs start, end)
 *   om_op_size                Size             int64 element count
 *   om_op_constant            Constant         value | value_float(s) | value_int(s)
 *   om_op_constant_of_shape   ConstantOfShape  a tensor of shape input[0] filled with attr value
 *   om_op_reshape             Reshape          alias; 0 copies a dim (unless allowzero), -1 inferred
 *   om_op_flatten             Flatten          alias; (prod dims[:axis], prod dims[axis:])
 *   om_op_squeeze             Squeeze          alias; axes input (opset 13) or attribute
 *   om_op_unsqueeze           Unsqueeze        alias; axes input (opset 13) or attribute
 *   om_op_transpose           Transpose        permuting copy
 *   om_op_gather              Gather           take along axis; negative indices wrap
 *   om_op_gather_grad         GatherGrad       (ortmod) scatter-add of dy into zeros of Shape(data)
 *   om_op_concat              Concat
 *   om_op_concat_grad         ConcatGrad       (ortmod) the part of dy that came from input `index`
 *   om_op_slice               Slice            opset 13: starts, ends, axes, steps inputs
 *   om_op_slice_grad          SliceGrad        (ortmod) dy scattered into zeros of Shape(x)
 *   om_op_expand              Expand           numpy broadcast of data and shape
 *   om_op_range               Range
 *   om_op_split               Split            opset 18: split input or num_outputs
 *   om_op_split_grad          SplitGrad        (ortmod) concat of the dys, zeros for missing ones
 *
 * Most of these run at plan time on int64 shape data (the planner folds a node whose
 * inputs are all known), so every kernel that only moves data does it by bytes
 * (om_dtype_size) and works for any dtype, fp16/bf16 included (OM_OP_ANY_DTYPE); only
 * GatherGrad adds (its rule takes every float dtype; the CPU kernel float32/float64) and
 * Range computes (float32/float64/int32/int64).
 *
 * Shape-like inputs (Reshape's shape, Slice's starts, axes, ...) must be known at plan
 * time; the shape rules say so with an error otherwise.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/threadpool.h"
#include "ops/op.h"
#include "ops/op_util.h"
#include "ops/slice_geom.h"

/* ---- helpers ----------------------------------------------------------------------- */

static int64_t dims_prod(const int64_t *d, int from, int to) {
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}

static void set_out(om_tensor *o, om_dtype dt, int rank, const int64_t *dims) {
    o->dtype = dt;
    o->rank = rank;
    for (int i = 0; i < rank; i++) o->dims[i] = dims[i];
}

/* Checks that integer input i (what) has data (known at plan time); *n = element count. */
static om_status *known_ints(const om_kernel_ctx *ctx, int i, const char *what, int64_t *n) {
    const om_tensor *t = &ctx->in[i];
    *n = 0;
    if (!om_is_index_dtype(t->dtype)) return om_err_dtype(ctx->node, i, t->dtype);
    *n = om_tensor_numel(t);
    if (!t->data && *n > 0)
        return om_node_error(ctx->node, OM_UNSUPPORTED_OP,
                          "input %d (%s) must be known at plan time, but it is computed from run-time data",
                          i, what);
    return NULL;
}

/* Axes from input `input` when present, else from the "axes" attribute; *count = -1 when
 * neither gives any. */
static om_status *read_axes(const om_kernel_ctx *ctx, int input, int64_t *axes, int *count) {
    *count = -1;
    if (om_in_present(ctx, input)) {
        int64_t k;
        OM_TRY(known_ints(ctx, input, "axes", &k));
        if (k > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "%lld axes given", (long long)k);
        for (int64_t i = 0; i < k; i++) axes[i] = om_index_at(&ctx->in[input], i);
        *count = (int)k;
        return NULL;
    }
    const int64_t *v;
    int k = om_attr_ints(ctx->node, "axes", &v);
    if (k < 0) return NULL;
    if (k > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "%d axes given", k);
    for (int i = 0; i < k; i++) axes[i] = v[i];
    *count = k;
    return NULL;
}

/* Fills dst (total bytes, a multiple of psz) with copies of the psz-byte pattern by
 * doubling: log2(total/psz) memcpys instead of one per element. */
static void fill_pattern(char *dst, size_t total, const void *pat, size_t psz) {
    if (total == 0 || psz == 0) return;
    memcpy(dst, pat, psz);
    size_t filled = psz;
    while (filled < total) {
        size_t n = filled < total - filled ? filled : total - filled;
        memcpy(dst + filled, dst, n);
        filled += n;
    }
}

/* Advances an odometer over n dims and returns the offset moved by the per-dim strides. */
static inline int64_t odometer_next(int n, const int64_t *dims, const int64_t *stride, int64_t *idx, int64_t off) {
    for (int a = n - 1; a >= 0; a--) {
        off += stride[a];
        if (++idx[a] < dims[a]) return off;
        off -= stride[a] * dims[a];
        idx[a] = 0;
    }
    return off;
}

/* dst[j * ds] = src[j * ss] for j < n, elements of esz bytes (strides in elements). */
static void move_strided(void *dst, int64_t ds, const void *src, int64_t ss, int64_t n, size_t esz) {
#define MOVE_STRIDED_T(T)                                                        \
    do {                                                                         \
        T *restrict d_ = (T *)dst;                                               \
        const T *restrict s_ = (const T *)src;                                   \
        for (int64_t j = 0; j < n; j++) d_[j * ds] = s_[j * ss];                 \
    } while (0)
    switch (esz) {
    case 1: MOVE_STRIDED_T(uint8_t); break;
    case 2: MOVE_STRIDED_T(uint16_t); break;
    case 4: MOVE_STRIDED_T(uint32_t); break;
    case 8: MOVE_STRIDED_T(uint64_t); break;
    default:
        for (int64_t j = 0; j < n; j++)
            memcpy((char *)dst + j * ds * (int64_t)esz, (const char *)src + j * ss * (int64_t)esz, esz);
    }
#undef MOVE_STRIDED_T
}

/* Gradient of the view ops: dx = Reshape(dy, Shape(x)), allowzero so that a 0 in x's
 * shape means 0 (not "copy dy's dim"). */
static om_status *reshape_back_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    int x = n->in[0], dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    int shp = om_emit_shape(c, x);
    if (shp < 0) return NULL;
    int dx = om_emit2(c, om_op_reshape_id, dy, shp);
    if (dx < 0) return NULL;
    om_emit_attr_int(c, "allowzero", 1);
    c->dx[0] = dx;
    return NULL;
}

/* View ops alias their input when the planner allows; otherwise copy. */
static om_status *alias_copy_cpu(om_kernel_ctx *ctx) {
    if (ctx->out[0].data && ctx->out[0].data != ctx->in[0].data)
        memcpy(ctx->out[0].data, ctx->in[0].data, om_tensor_nbytes(&ctx->in[0]));
    return NULL;
}

static om_dtype dtype_i64(const om_graph *g, const om_node *n, int k) { return OM_I64; }

/* ---- Shape, Size ------------------------------------------------------------------- */

/* [start, end) of the dims Shape reports (opset 15), clamped to [0, rank]. */
static void shape_range(const om_node *n, int rank, int *start, int *end) {
    int64_t s = om_attr_int(n, "start", 0), e = om_attr_int(n, "end", rank);
    if (s < 0) s += rank;
    if (e < 0) e += rank;
    s = s < 0 ? 0 : s > rank ? rank : s;
    e = e < 0 ? 0 : e > rank ? rank : e;
    *start = (int)s;
    *end = e > s ? (int)e : (int)s;
}

static om_status *shape_infer(om_kernel_ctx *ctx) {
    int s, e;
    shape_range(ctx->node, ctx->in[0].rank, &s, &e);
    int64_t len = e - s;
    set_out(&ctx->out[0], OM_I64, 1, &len);
    return NULL;
}

// y is (end - start,) int64: the input's dims; reads no data
static om_status *shape_cpu(om_kernel_ctx *ctx) {
    int s, e;
    shape_range(ctx->node, ctx->in[0].rank, &s, &e);
    int64_t *y = ctx->out[0].data;
    for (int i = s; i < e; i++) y[i - s] = ctx->in[0].dims[i];
    return NULL;
}

static om_status *size_infer(om_kernel_ctx *ctx) {
    set_out(&ctx->out[0], OM_I64, 0, NULL);
    return NULL;
}

// y is () int64
static om_status *size_cpu(om_kernel_ctx *ctx) {
    *(int64_t *)ctx->out[0].data = om_tensor_numel(&ctx->in[0]);
    return NULL;
}

/* ---- Constant, ConstantOfShape ----------------------------------------------------- */

static om_dtype constant_dtype(const om_graph *g, const om_node *n, int k) {
    const om_attr *a = om_attr_find(n, "value");
    if (a && a->type == OM_ATTR_TENSOR) return a->t.dtype;
    if (om_attr_find(n, "value_float") || om_attr_find(n, "value_floats")) return OM_F32;
    if (om_attr_find(n, "value_int") || om_attr_find(n, "value_ints")) return OM_I64;
    return OM_UNDEFINED;
}

static om_status *constant_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_attr *a;
    om_tensor *y = &ctx->out[0];
    /* ONNX allows exactly one: with two, which one is meant is not for ortmod to pick */
    if (n->n_attr > 1)
        return om_node_error(n, OM_INVALID_ARGUMENT, "a Constant holds one of value, value_float(s), value_int(s), "
                          "not %d of them", n->n_attr);
    if ((a = om_attr_find(n, "value")) && a->type == OM_ATTR_TENSOR) {
        set_out(y, a->t.dtype, a->t.rank, a->t.dims);
    } else if ((a = om_attr_find(n, "value_float")) || (a = om_attr_find(n, "value_int"))) {
        set_out(y, a->type == OM_ATTR_FLOAT ? OM_F32 : OM_I64, 0, NULL);
    } else if ((a = om_attr_find(n, "value_floats")) || (a = om_attr_find(n, "value_ints"))) {
        int64_t len = a->n;
        set_out(y, a->type == OM_ATTR_FLOATS ? OM_F32 : OM_I64, 1, &len);
    } else {
        return om_err_unsupported(n, "Constant needs one of value, value_float(s), value_int(s)");
    }
    return NULL;
}

static om_status *constant_cpu(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    const om_attr *a;
    void *y = ctx->out[0].data;
    if ((a = om_attr_find(n, "value")) && a->type == OM_ATTR_TENSOR) {
        size_t nb = om_tensor_nbytes(&a->t);
        if (nb) memcpy(y, a->t.data, nb);
    } else if ((a = om_attr_find(n, "value_float"))) {
        *(float *)y = a->f;
    } else if ((a = om_attr_find(n, "value_int"))) {
        *(int64_t *)y = a->i;
    } else if ((a = om_attr_find(n, "value_floats"))) {
        if (a->n) memcpy(y, a->floats, (size_t)a->n * sizeof(float));
    } else if ((a = om_attr_find(n, "value_ints"))) {
        if (a->n) memcpy(y, a->ints, (size_t)a->n * sizeof(int64_t));
    } else {
        return om_err_unsupported(n, "Constant needs one of value, value_float(s), value_int(s)");
    }
    return NULL;
}

static om_dtype constant_of_shape_dtype(const om_graph *g, const om_node *n, int k) {
    const om_attr *a = om_attr_find(n, "value");
    return a && a->type == OM_ATTR_TENSOR ? a->t.dtype : OM_F32;
}

static om_status *constant_of_shape_infer(om_kernel_ctx *ctx) {
    int64_t k;
    OM_TRY(known_ints(ctx, 0, "shape", &k));
    if (k > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "rank %lld exceeds %d", (long long)k, OM_MAX_RANK);
    int64_t d[OM_MAX_RANK];
    for (int64_t i = 0; i < k; i++) {
        d[i] = om_index_at(&ctx->in[0], i);
        if (d[i] < 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "negative dim %lld in shape", (long long)d[i]);
    }
    const om_attr *a = om_attr_find(ctx->node, "value");
    if (a && a->type == OM_ATTR_TENSOR && om_tensor_numel(&a->t) != 1)
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "attribute value must hold one element");
    set_out(&ctx->out[0], constant_of_shape_dtype(ctx->g, ctx->node, 0), (int)k, d);
    return NULL;
}

// y is shape[...] filled with the value attribute (default float 0)
static om_status *constant_of_shape_cpu(om_kernel_ctx *ctx) {
    const om_attr *a = om_attr_find(ctx->node, "value");
    om_tensor *y = &ctx->out[0];
    size_t esz = om_dtype_size(y->dtype);
    uint64_t zero = 0;
    const void *pat = a && a->type == OM_ATTR_TENSOR && a->t.data ? a->t.data : (const void *)&zero;
    fill_pattern(y->data, om_tensor_nbytes(y), pat, esz);
    return NULL;
}

/* ---- Reshape, Flatten, Squeeze, Unsqueeze (views) ---------------------------------- */

static om_status *reshape_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *s = &ctx->in[1];
    int64_t k;
    OM_TRY(known_ints(ctx, 1, "shape", &k));
    if (s->rank != 1) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "shape must be 1-D, got rank %d", s->rank);
    if (k > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "rank %lld exceeds %d", (long long)k, OM_MAX_RANK);
    int allowzero = om_attr_int(ctx->node, "allowzero", 0) != 0;
    int64_t d[OM_MAX_RANK], known = 1;
    int unknown = -1;
    for (int i = 0; i < (int)k; i++) {
        int64_t v = om_index_at(s, i);
        if (v == 0 && !allowzero) {
            if (i >= x->rank)
                return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "shape[%d] = 0 copies a dim the rank-%d input lacks", i, x->rank);
            v = x->dims[i];
        } else if (v == -1) {
            if (unknown >= 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "more than one -1 in shape");
            unknown = i;
            d[i] = 1;
            continue;
        } else if (v < 0) {
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "invalid dim %lld in shape", (long long)v);
        }
        d[i] = v;
        if (__builtin_mul_overflow(known, v, &known))   /* the dims are the model's data: any int64 */
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "the dims of shape multiply past int64 (at dim %d = %lld)",
                              i, (long long)v);
    }
    int64_t total = om_tensor_numel(x);
    if (unknown >= 0) {
        if (known == 0 ? total != 0 : total % known != 0)
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "cannot reshape %lld elements with a -1 dim (rest %lld)",
                              (long long)total, (long long)known);
        d[unknown] = known == 0 ? 0 : total / known;
    } else if (known != total) {
        char sx[128];
        om_shape_str(x, sx, sizeof sx);
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "cannot reshape %s (%lld elements) into %lld elements", sx,
                          (long long)total, (long long)known);
    }
    set_out(&ctx->out[0], x->dtype, (int)k, d);
    return NULL;
}

static om_status *flatten_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    int64_t axis = om_attr_int(ctx->node, "axis", 1);
    if (axis < 0) axis += x->rank;
    if (axis < 0 || axis > x->rank)
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "axis %lld out of range for rank %d",
                          (long long)om_attr_int(ctx->node, "axis", 1), x->rank);
    int64_t d[2] = {dims_prod(x->dims, 0, (int)axis), dims_prod(x->dims, (int)axis, x->rank)};
    set_out(&ctx->out[0], x->dtype, 2, d);
    return NULL;
}

static om_status *squeeze_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    int64_t axes[OM_MAX_RANK];
    int k, drop[OM_MAX_RANK] = {0};
    OM_TRY(read_axes(ctx, 1, axes, &k));
    if (k < 0) {
        for (int i = 0; i < x->rank; i++) drop[i] = x->dims[i] == 1;
    } else {
        for (int i = 0; i < k; i++) {
            int a;
            OM_TRY(om_norm_axis(ctx->node, axes[i], x->rank, &a));
            if (x->dims[a] != 1)
                return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "cannot squeeze axis %d of size %lld", a,
                                  (long long)x->dims[a]);
            drop[a] = 1;
        }
    }
    int64_t d[OM_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++)
        if (!drop[i]) d[r++] = x->dims[i];
    set_out(&ctx->out[0], x->dtype, r, d);
    return NULL;
}

static om_status *unsqueeze_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    int64_t axes[OM_MAX_RANK];
    int k;
    OM_TRY(read_axes(ctx, 1, axes, &k));
    if (k < 0) return om_node_error(ctx->node, OM_INVALID_MODEL, "axes missing");
    int R = x->rank + k;
    if (R > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "rank %d exceeds %d", R, OM_MAX_RANK);
    int ins[OM_MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        int a;
        OM_TRY(om_norm_axis(ctx->node, axes[i], R, &a));
        if (ins[a]) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "axis %d repeated", a);
        ins[a] = 1;
    }
    int64_t d[OM_MAX_RANK];
    for (int i = 0, j = 0; i < R; i++) d[i] = ins[i] ? 1 : x->dims[j++];
    set_out(&ctx->out[0], x->dtype, R, d);
    return NULL;
}

/* ---- Transpose --------------------------------------------------------------------- */

/* perm attribute, or reversed dims when absent; checked to be a permutation. */
static om_status *get_perm(const om_node *n, int rank, int *perm) {
    const int64_t *p;
    int k = om_attr_ints(n, "perm", &p);
    if (k < 0) {
        for (int i = 0; i < rank; i++) perm[i] = rank - 1 - i;
        return NULL;
    }
    if (k != rank) return om_node_error(n, OM_INVALID_ARGUMENT, "perm has %d entries for rank %d", k, rank);
    int seen[OM_MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        if (p[i] < 0 || p[i] >= rank || seen[p[i]])
            return om_node_error(n, OM_INVALID_ARGUMENT, "perm is not a permutation of 0..%d", rank - 1);
        seen[p[i]] = 1;
        perm[i] = (int)p[i];
    }
    return NULL;
}

static om_status *transpose_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    int perm[OM_MAX_RANK];
    OM_TRY(get_perm(ctx->node, x->rank, perm));
    int64_t d[OM_MAX_RANK];
    for (int i = 0; i < x->rank; i++) d[i] = x->dims[perm[i]];
    set_out(&ctx->out[0], x->dtype, x->rank, d);
    return NULL;
}

/* Simplifies a transpose: drops size-1 dims and merges input axes that stay adjacent and
 * in order in the output (e.g. (B,T,H,D) perm (0,2,1,3) is (B,T,H,D') with D' = D * esz
 * moving as one block). Returns the new rank r; dims[r] in input order and np[r] with
 * output axis i = input axis np[i]. */
static int transpose_collapse(int rank, const int64_t *xd, const int *perm, int64_t *dims, int *np) {
    int map[OM_MAX_RANK], r1 = 0;
    int64_t d1[OM_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        map[i] = xd[i] == 1 ? -1 : r1;
        if (xd[i] != 1) d1[r1++] = xd[i];
    }
    int p1[OM_MAX_RANK], k = 0;
    for (int i = 0; i < rank; i++)
        if (map[perm[i]] >= 0) p1[k++] = map[perm[i]];
    int gstart[OM_MAX_RANK], glen[OM_MAX_RANK], ng = 0;
    for (int i = 0; i < k; i++) {
        if (ng > 0 && p1[i] == gstart[ng - 1] + glen[ng - 1]) {
            glen[ng - 1]++;
        } else {
            gstart[ng] = p1[i];
            glen[ng] = 1;
            ng++;
        }
    }
    for (int g = 0; g < ng; g++) {
        int pos = 0;
        for (int h = 0; h < ng; h++) pos += gstart[h] < gstart[g];
        np[g] = pos;
        dims[pos] = dims_prod(d1, gstart[g], gstart[g] + glen[g]);
    }
    return ng;
}

/* dst (A, B) row-major, dst[a][b] = src[a + b * sb]: src is contiguous along a. Tiles of
 * 32 x 32 keep both the strided reads and the writes in cache. */
static void transpose_tiled(void *dst, const void *src, int64_t A, int64_t B, int64_t sb, size_t esz) {
    enum { TILE = 32 };
#define TILED_T(T)                                                                     \
    do {                                                                               \
        T *restrict d_ = (T *)dst;                                                     \
        const T *restrict s_ = (const T *)src;                                         \
        for (int64_t a0 = 0; a0 < A; a0 += TILE)                                       \
            for (int64_t b0 = 0; b0 < B; b0 += TILE) {                                 \
                const int64_t a1 = a0 + TILE < A ? a0 + TILE : A;                      \
                const int64_t b1 = b0 + TILE < B ? b0 + TILE : B;                      \
                for (int64_t a = a0; a < a1; a++)                                      \
                    for (int64_t b = b0; b < b1; b++) d_[a * B + b] = s_[a + b * sb];  \
            }                                                                          \
    } while (0)
    switch (esz) {
    case 1: TILED_T(uint8_t); break;
    case 2: TILED_T(uint16_t); break;
    case 4: TILED_T(uint32_t); break;
    case 8: TILED_T(uint64_t); break;
    default:
        for (int64_t a = 0; a < A; a++)
            move_strided((char *)dst + a * B * (int64_t)esz, 1, (const char *)src + a * (int64_t)esz, sb, B, esz);
    }
#undef TILED_T
}

typedef struct tr_args {
    const char *xp;
    char *yp;
    size_t esz;
    int r, mode, nd;             /* mode 0: runs, 1: batch of 2-D transposes, 2: strided rows */
    int64_t od[OM_MAX_RANK], st[OM_MAX_RANK];
} tr_args;

/* outer items [lo, hi) of transpose_cpu's loop (the odometer over od[0..nd) started at lo) */
static void transpose_range(void *c_, int64_t lo, int64_t hi) {
    const tr_args *c = c_;
    const int r = c->r, nd = c->nd;
    const int64_t *od = c->od, *st = c->st;
    const int64_t esz = (int64_t)c->esz;
    int64_t idx[OM_MAX_RANK] = {0}, off = 0, t = lo;
    for (int a = nd - 1; a >= 0; a--) {
        idx[a] = t % od[a];
        t /= od[a];
        off += idx[a] * st[a];
    }
    if (c->mode == 0) {
        const size_t run = (size_t)od[r - 1] * c->esz;
        for (int64_t t = lo; t < hi; t++) {
            memcpy(c->yp + t * (int64_t)run, c->xp + off * esz, run);
            off = odometer_next(nd, od, st, idx, off);
        }
    } else if (c->mode == 1) {
        const int64_t A = od[r - 2], B = od[r - 1];
        for (int64_t t = lo; t < hi; t++) {
            transpose_tiled(c->yp + t * A * B * esz, c->xp + off * esz, A, B, st[r - 1], c->esz);
            off = odometer_next(nd, od, st, idx, off);
        }
    } else {
        const int64_t n = od[r - 1];
        for (int64_t t = lo; t < hi; t++) {
            move_strided(c->yp + t * n * esz, 1, c->xp + off * esz, st[r - 1], n, c->esz);
            off = odometer_next(nd, od, st, idx, off);
        }
    }
}

// x is (d0, ..., dr-1), y is (d[perm[0]], ..., d[perm[r-1]])
static om_status *transpose_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    int perm[OM_MAX_RANK], p[OM_MAX_RANK];
    int64_t dims[OM_MAX_RANK];
    OM_TRY(get_perm(ctx->node, x->rank, perm));
    size_t esz = om_dtype_size(x->dtype);
    if (om_tensor_numel(x) == 0) return NULL;
    int r = transpose_collapse(x->rank, x->dims, perm, dims, p);
    if (r <= 1) {
        memcpy(y->data, x->data, om_tensor_nbytes(x));
        return NULL;
    }
    /* per output axis: its extent and its element stride in x */
    int64_t xs[OM_MAX_RANK], od[OM_MAX_RANK], st[OM_MAX_RANK];
    xs[r - 1] = 1;
    for (int i = r - 2; i >= 0; i--) xs[i] = xs[i + 1] * dims[i + 1];
    for (int i = 0; i < r; i++) {
        od[i] = dims[p[i]];
        st[i] = xs[p[i]];
    }
    tr_args a = {.xp = x->data, .yp = y->data, .esz = esz, .r = r};
    memcpy(a.od, od, sizeof od);
    memcpy(a.st, st, sizeof st);
    int64_t per_item;   /* elements per work item, for the grain */
    if (p[r - 1] == r - 1) {
        /* x's innermost run stays innermost: copy runs of od[r-1] elements */
        a.mode = 0, a.nd = r - 1, per_item = od[r - 1];
    } else if (p[r - 2] == r - 1) {
        /* x's contiguous axis is y's second-to-last: a batch of 2-D transposes */
        a.mode = 1, a.nd = r - 2, per_item = od[r - 2] * od[r - 1];
    } else {
        a.mode = 2, a.nd = r - 1, per_item = od[r - 1];
    }
    const int64_t outer = dims_prod(od, 0, a.nd);
    om_pool_for(outer, per_item >= OM_GRAIN ? 1 : OM_GRAIN / (per_item ? per_item : 1), transpose_range, &a);
    return NULL;
}

/* dx = Transpose(dy, inverse perm); the default (reversed) perm is its own inverse. */
static om_status *transpose_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    int dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    const int64_t *p;
    int k = om_attr_ints(n, "perm", &p);
    int64_t inv[OM_MAX_RANK];
    if (k > OM_MAX_RANK) return om_grad_fail(c, om_node_error(n, OM_INVALID_ARGUMENT, "perm has %d entries", k));
    for (int i = 0; i < k; i++) {
        if (p[i] < 0 || p[i] >= k) return om_grad_fail(c, om_node_error(n, OM_INVALID_ARGUMENT, "invalid perm"));
        inv[p[i]] = i;
    }
    int dx = om_emit1(c, om_op_transpose_id, dy);
    if (dx < 0) return NULL;
    if (k >= 0) om_emit_attr_ints(c, "perm", inv, k);
    c->dx[0] = dx;
    return NULL;
}

/* ---- Gather, GatherGrad ------------------------------------------------------------ */

/* Checks every index against [-N, N) before anything is written. */
static om_status *check_indices(const om_node *node, const om_tensor *ind, int64_t N, int axis) {
    const int64_t k = om_tensor_numel(ind);
    for (int64_t i = 0; i < k; i++) {
        int64_t v = om_index_at(ind, i);
        if (v < -N || v >= N)
            return om_node_error(node, OM_RUNTIME, "index %lld (at position %lld) is out of range for axis %d of size %lld",
                              (long long)v, (long long)i, axis, (long long)N);
    }
    return NULL;
}

static om_status *gather_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1];
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x->rank, &axis));
    if (x->rank == 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "data must have rank >= 1");
    if (!om_is_index_dtype(ind->dtype)) return om_err_dtype(ctx->node, 1, ind->dtype);
    int R = x->rank - 1 + ind->rank;
    if (R > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "rank %d exceeds %d", R, OM_MAX_RANK);
    int64_t d[OM_MAX_RANK];
    int r = 0;
    for (int i = 0; i < axis; i++) d[r++] = x->dims[i];
    for (int i = 0; i < ind->rank; i++) d[r++] = ind->dims[i];
    for (int i = axis + 1; i < x->rank; i++) d[r++] = x->dims[i];
    /* indices known at plan time (a constant) are checked here, by every plan: a CUDA plan's
     * kernel cannot report one without a synchronization (out of range reads 0 there) */
    if (ind->data) OM_TRY(check_indices(ctx->node, ind, x->dims[axis], axis));
    set_out(&ctx->out[0], x->dtype, R, d);
    return NULL;
}

// x is (outer, N, inner), indices has K elements, y is (outer, K, inner)
static om_status *gather_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *ind = &ctx->in[1];
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x->rank, &axis));
    const int64_t N = x->dims[axis], K = om_tensor_numel(ind);
    const int64_t outer = dims_prod(x->dims, 0, axis);
    const size_t row = (size_t)dims_prod(x->dims, axis + 1, x->rank) * om_dtype_size(x->dtype);
    OM_TRY(check_indices(ctx->node, ind, N, axis));
    const char *xp = x->data;
    char *yp = ctx->out[0].data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < K; k++) {
            int64_t i = om_index_at(ind, k);
            if (i < 0) i += N;
            memcpy(yp + (o * K + k) * (int64_t)row, xp + (o * N + i) * (int64_t)row, row);
        }
    return NULL;
}

/* dL/d(data) = GatherGrad(dy, Shape(data), indices; axis): only data is differentiable. */
static om_status *gather_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    int x = n->in[0], ind = n->in[1], dy = c->dy[0];
    int64_t axis = om_attr_int(n, "axis", 0);
    if (dy < 0 || !c->need_dx[0]) return NULL;
    int shp = om_emit_shape(c, x);
    if (shp < 0) return NULL;
    int in[3] = {dy, shp, ind};
    int dx = om_emit(c, om_op_gather_grad_id, in, 3);
    if (dx < 0) return NULL;
    om_emit_attr_int(c, "axis", axis);
    c->dx[0] = dx;
    return NULL;
}

/* Output of shape input `i` (known at plan time) with dtype dt. */
static om_status *infer_from_shape_input(om_kernel_ctx *ctx, int i, om_tensor *out, om_dtype dt) {
    int64_t k;
    OM_TRY(known_ints(ctx, i, "shape", &k));
    if (k > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "rank %lld exceeds %d", (long long)k, OM_MAX_RANK);
    int64_t d[OM_MAX_RANK];
    for (int64_t j = 0; j < k; j++) {
        d[j] = om_index_at(&ctx->in[i], j);
        if (d[j] < 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "negative dim in shape input %d", i);
    }
    OM_TRY(om_check_shape_data(ctx->node, i, d, (int)k, dt));
    set_out(out, dt, (int)k, d);
    return NULL;
}

static om_status *gather_grad_infer(om_kernel_ctx *ctx) {
    OM_TRY(om_check_float(ctx->node, &ctx->in[0], 0, OM_UNDEFINED));
    return infer_from_shape_input(ctx, 1, &ctx->out[0], ctx->in[0].dtype);
}

typedef struct gg_args {
    const void *dy;
    void *dx;
    const om_tensor *ind;
    int64_t N, K, outer, inner;
    size_t esz;
} gg_args;

/* columns [j0, j1) of every row of dx: zero, then accumulate the gathered rows of dy */
#define GATHER_GRAD_WORKER(name, TT)                                                          \
    static void name(void *c_, int64_t j0, int64_t j1) {                                      \
        typedef TT T;                                                                         \
        const gg_args *c = c_;                                                                \
        const int64_t N = c->N, K = c->K, inner = c->inner;                                   \
        const T *dyp = c->dy;                                                                 \
        T *dxp = c->dx;                                                                       \
        for (int64_t r = 0; r < c->outer * N; r++)                                            \
            memset(dxp + r * inner + j0, 0, (size_t)(j1 - j0) * sizeof(T));                   \
        for (int64_t o = 0; o < c->outer; o++)                                                \
            for (int64_t k = 0; k < K; k++) {                                                 \
                int64_t i = om_index_at(c->ind, k);                                                \
                if (i < 0) i += N;                                                            \
                T *restrict d = dxp + (o * N + i) * inner;                                    \
                const T *restrict s = dyp + (o * K + k) * inner;                              \
                for (int64_t j = j0; j < j1; j++) d[j] += s[j];                               \
            }                                                                                 \
    }
GATHER_GRAD_WORKER(gather_grad_f32, float)
GATHER_GRAD_WORKER(gather_grad_f64, double)

// dy is (outer, K, inner), dx is (outer, N, inner): dx[o, idx[k], :] += dy[o, k, :]
static om_status *gather_grad_cpu(om_kernel_ctx *ctx) {
    const om_tensor *dy = &ctx->in[0], *ind = &ctx->in[2];
    om_tensor *dx = &ctx->out[0];
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), dx->rank, &axis));
    if (!om_is_index_dtype(ind->dtype)) return om_err_dtype(ctx->node, 2, ind->dtype);
    const int64_t N = dx->dims[axis], K = om_tensor_numel(ind);
    const int64_t outer = dims_prod(dx->dims, 0, axis), inner = dims_prod(dx->dims, axis + 1, dx->rank);
    OM_TRY(check_indices(ctx->node, ind, N, axis));
    if (dy->dtype != OM_F32 && dy->dtype != OM_F64) return om_err_dtype(ctx->node, 0, dy->dtype);
    gg_args a = {.dy = dy->data, .dx = dx->data, .ind = ind, .N = N, .K = K, .outer = outer, .inner = inner,
                 .esz = om_dtype_size(dy->dtype)};
    /* threads split the row (columns): repeated indices then never race, and every element
     * sums its contributions in index order whatever the thread count */
    const int64_t per_col = outer * (K > N ? K : N);
    const int64_t grain = per_col >= OM_GRAIN / 16 ? 16 : OM_GRAIN / (per_col ? per_col : 1);
    om_pool_for(inner, grain, dy->dtype == OM_F32 ? gather_grad_f32 : gather_grad_f64, &a);
    return NULL;
}

/* ---- Concat, ConcatGrad ------------------------------------------------------------ */

static om_status *concat_infer(om_kernel_ctx *ctx) {
    const om_tensor *x0 = &ctx->in[0];
    int axis;
    if (x0->rank == 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "inputs must have rank >= 1");
    /* ONNX requires axis: a Concat without it is not read as axis 0 */
    if (!om_attr_find(ctx->node, "axis")) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "the axis attribute is missing");
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x0->rank, &axis));
    int64_t d[OM_MAX_RANK];
    for (int i = 0; i < x0->rank; i++) d[i] = x0->dims[i];
    d[axis] = 0;
    for (int k = 0; k < ctx->n_in; k++) {
        const om_tensor *x = &ctx->in[k];
        if (x->dtype != x0->dtype) return om_err_dtype(ctx->node, k, x->dtype);
        int ok = x->rank == x0->rank;
        for (int i = 0; ok && i < x->rank; i++) ok = i == axis || x->dims[i] == x0->dims[i];
        if (!ok) {
            char s0[128], sk[128];
            om_shape_str(x0, s0, sizeof s0);
            om_shape_str(x, sk, sizeof sk);
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "input %d %s does not match input 0 %s off axis %d", k,
                              sk, s0, axis);
        }
        d[axis] += x->dims[axis];
    }
    set_out(&ctx->out[0], x0->dtype, x0->rank, d);
    return NULL;
}

// x_k is (outer, n_k, inner), y is (outer, sum n_k, inner)
static om_status *concat_cpu(om_kernel_ctx *ctx) {
    const om_tensor *y = &ctx->out[0];
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), y->rank, &axis));
    const int64_t outer = dims_prod(y->dims, 0, axis);
    const int64_t inner_bytes = dims_prod(y->dims, axis + 1, y->rank) * (int64_t)om_dtype_size(y->dtype);
    char *yp = y->data;
    for (int64_t o = 0; o < outer; o++)
        for (int k = 0; k < ctx->n_in; k++) {
            const int64_t chunk = ctx->in[k].dims[axis] * inner_bytes;
            if (chunk) memcpy(yp, (const char *)ctx->in[k].data + o * chunk, (size_t)chunk);
            yp += chunk;
        }
    return NULL;
}

/* dx_i = ConcatGrad(dy, Shape(x_0), ..., Shape(x_{n-1}); axis, index=i): one node per
 * input that needs a gradient, each copying only its part of dy. */
static om_status *concat_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int k = n->n_in, dy = c->dy[0];
    const int64_t axis = om_attr_int(n, "axis", 0);
    if (dy < 0) return NULL;
    int *in, *xs;
    OM_NEW(in, 2 * k + 1);
    xs = in + k + 1;
    for (int i = 0; i < k; i++) xs[i] = n->in[i];   /* n moves as nodes are emitted */
    in[0] = dy;
    int ok = 1;
    for (int i = 0; i < k && ok; i++) ok = (in[1 + i] = om_emit_shape(c, xs[i])) >= 0;
    for (int i = 0; i < k && ok; i++) {
        if (!c->need_dx[i]) continue;
        int dx = om_emit(c, om_op_concat_grad_id, in, k + 1);
        ok = dx >= 0;
        om_emit_attr_int(c, "axis", axis);
        om_emit_attr_int(c, "index", i);
        if (ok) c->dx[i] = dx;
    }
    free(in);
    return NULL;
}

static om_status *concat_grad_index(const om_kernel_ctx *ctx, int *index) {
    int64_t i = om_attr_int(ctx->node, "index", 0);
    if (i < 0 || i >= ctx->n_in - 1) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "index %lld out of range", (long long)i);
    *index = (int)i;
    return NULL;
}

static om_status *concat_grad_infer(om_kernel_ctx *ctx) {
    int index = 0;
    OM_TRY(concat_grad_index(ctx, &index));
    for (int i = 1; i < ctx->n_in; i++) {   /* every shape is needed for the offsets */
        int64_t k;
        OM_TRY(known_ints(ctx, i, "shape", &k));
    }
    return infer_from_shape_input(ctx, 1 + index, &ctx->out[0], ctx->in[0].dtype);
}

// dy is (outer, sum n_k, inner), dx is (outer, n_index, inner)
static om_status *concat_grad_cpu(om_kernel_ctx *ctx) {
    const om_tensor *dy = &ctx->in[0];
    om_tensor *dx = &ctx->out[0];
    int index = 0, axis = 0;
    OM_TRY(concat_grad_index(ctx, &index));
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), dy->rank, &axis));
    int64_t before = 0;   /* rows of dy along axis that belong to earlier inputs */
    for (int i = 0; i < index; i++) before += om_index_at(&ctx->in[1 + i], axis);
    const int64_t inner_bytes = dims_prod(dy->dims, axis + 1, dy->rank) * (int64_t)om_dtype_size(dy->dtype);
    const int64_t outer = dims_prod(dy->dims, 0, axis);
    const int64_t chunk = dx->dims[axis] * inner_bytes, stride = dy->dims[axis] * inner_bytes;
    if (chunk == 0) return NULL;
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)dx->data + o * chunk, (const char *)dy->data + o * stride + before * inner_bytes, (size_t)chunk);
    return NULL;
}

/* ---- Slice, SliceGrad -------------------------------------------------------------- */

typedef struct slice_params {
    int64_t start[OM_MAX_RANK], step[OM_MAX_RANK], count[OM_MAX_RANK];
} slice_params;

/* Per-axis start/step/count of a Slice over dims, from inputs starts = in[first],
 * ends, axes (optional), steps (optional), clamped as the ONNX spec says. */
static om_status *slice_params_get(const om_kernel_ctx *ctx, int first, int rank, const int64_t *dims, slice_params *sp) {
    for (int a = 0; a < rank; a++) {
        sp->start[a] = 0;
        sp->step[a] = 1;
        sp->count[a] = dims[a];
    }
    int64_t ns, ne, na, nst;
    OM_TRY(known_ints(ctx, first, "starts", &ns));
    OM_TRY(known_ints(ctx, first + 1, "ends", &ne));
    if (ns != ne) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "%lld starts but %lld ends", (long long)ns, (long long)ne);
    if (ns > rank) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "%lld starts for rank %d", (long long)ns, rank);
    const int has_axes = om_in_present(ctx, first + 2), has_steps = om_in_present(ctx, first + 3);
    if (has_axes) {
        OM_TRY(known_ints(ctx, first + 2, "axes", &na));
        if (na != ns) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "%lld axes for %lld starts", (long long)na, (long long)ns);
    }
    if (has_steps) {
        OM_TRY(known_ints(ctx, first + 3, "steps", &nst));
        if (nst != ns) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "%lld steps for %lld starts", (long long)nst, (long long)ns);
    }
    int seen[OM_MAX_RANK] = {0};
    for (int64_t i = 0; i < ns; i++) {
        int a;
        OM_TRY(om_norm_axis(ctx->node, has_axes ? om_index_at(&ctx->in[first + 2], i) : i, rank, &a));
        if (seen[a]) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "axis %d repeated", a);
        seen[a] = 1;
        const int64_t step = has_steps ? om_index_at(&ctx->in[first + 3], i) : 1, d = dims[a];
        if (step == 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "step 0 on axis %d", a);
        int64_t s = om_index_at(&ctx->in[first], i), e = om_index_at(&ctx->in[first + 1], i);
        sp->count[a] = om_slice_axis(s, e, step, d, &sp->start[a]);
        /* a step that takes at most one element is never taken: as 1, no stride is ever
         * step * (bytes per index), which overflows for a step of INT64_MAX */
        sp->step[a] = sp->count[a] > 1 ? step : 1;
    }
    return NULL;
}

/* Moves the elements of x (dims) selected by sp to/from the dense y: y = x[slice]
 * (scatter 0) or x[slice] = y (scatter 1). Trailing axes taken whole move as one block. */
static void slice_move(size_t esz, int rank, const int64_t *dims, const slice_params *sp, char *x, char *y, int scatter) {
    int m = rank;
    int64_t block = (int64_t)esz;
    while (m > 0 && sp->start[m - 1] == 0 && sp->step[m - 1] == 1 && sp->count[m - 1] == dims[m - 1]) {
        block *= dims[m - 1];
        m--;
    }
    if (dims_prod(sp->count, 0, rank) == 0) return;
    if (m == 0) {
        memcpy(scatter ? x : y, scatter ? y : x, (size_t)block);
        return;
    }
    int64_t xs[OM_MAX_RANK], ost[OM_MAX_RANK], idx[OM_MAX_RANK] = {0};
    xs[m - 1] = block;   /* bytes per step along axis m-1: the whole trailing block */
    for (int a = m - 2; a >= 0; a--) xs[a] = xs[a + 1] * dims[a + 1];
    int64_t off = 0;
    for (int a = 0; a < m; a++) {
        off += sp->start[a] * xs[a];
        ost[a] = sp->step[a] * xs[a];
    }
    const int64_t outer = dims_prod(sp->count, 0, m - 1), c = sp->count[m - 1], step = sp->step[m - 1];
    const size_t bsz = (size_t)block;
    for (int64_t t = 0; t < outer; t++) {
        char *xp = x + off, *yp = y + t * c * block;
        if (step == 1) memcpy(scatter ? xp : yp, scatter ? yp : xp, (size_t)(c * block));
        else if (bsz == 1 || bsz == 2 || bsz == 4 || bsz == 8)
            scatter ? move_strided(xp, step, yp, 1, c, bsz) : move_strided(yp, 1, xp, step, c, bsz);
        else
            for (int64_t j = 0; j < c; j++)
                memcpy(scatter ? xp + j * step * block : yp + j * block, scatter ? yp + j * block : xp + j * step * block, bsz);
        off = odometer_next(m - 1, sp->count, ost, idx, off);
    }
}

static om_status *slice_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    slice_params sp;
    OM_TRY(slice_params_get(ctx, 1, x->rank, x->dims, &sp));
    set_out(&ctx->out[0], x->dtype, x->rank, sp.count);
    return NULL;
}

// x is (d0, ..., dr-1), y is (count0, ..., count r-1)
static om_status *slice_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    slice_params sp;
    OM_TRY(slice_params_get(ctx, 1, x->rank, x->dims, &sp));
    slice_move(om_dtype_size(x->dtype), x->rank, x->dims, &sp, x->data, ctx->out[0].data, 0);
    return NULL;
}

/* dx = SliceGrad(dy, Shape(x), starts, ends[, axes[, steps]]) */
static om_status *slice_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    int in[6] = {c->dy[0], -1, -1, -1, -1, -1}, k = n->n_in + 1, x = n->in[0];
    if (in[0] < 0 || !c->need_dx[0]) return NULL;
    if (k > 6) k = 6;
    for (int i = 2; i < k; i++) in[i] = n->in[i - 1];
    if ((in[1] = om_emit_shape(c, x)) < 0) return NULL;
    int dx = om_emit(c, om_op_slice_grad_id, in, k);
    if (dx < 0) return NULL;
    c->dx[0] = dx;
    return NULL;
}

static om_status *slice_grad_infer(om_kernel_ctx *ctx) {
    OM_TRY(infer_from_shape_input(ctx, 1, &ctx->out[0], ctx->in[0].dtype));
    slice_params sp;
    OM_TRY(slice_params_get(ctx, 2, ctx->out[0].rank, ctx->out[0].dims, &sp));
    for (int a = 0; a < ctx->out[0].rank; a++)
        if (sp.count[a] != (ctx->in[0].rank == ctx->out[0].rank ? ctx->in[0].dims[a] : -1))
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "dy does not have the slice's shape");
    return NULL;
}

// dy is the slice's shape, dx is Shape(x): zeros with dy scattered into the slice
static om_status *slice_grad_cpu(om_kernel_ctx *ctx) {
    om_tensor *dx = &ctx->out[0];
    slice_params sp;
    OM_TRY(slice_params_get(ctx, 2, dx->rank, dx->dims, &sp));
    memset(dx->data, 0, om_tensor_nbytes(dx));
    slice_move(om_dtype_size(dx->dtype), dx->rank, dx->dims, &sp, dx->data, ctx->in[0].data, 1);
    return NULL;
}

/* ---- Expand ------------------------------------------------------------------------ */

static om_status *expand_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0], *s = &ctx->in[1];
    int64_t k;
    OM_TRY(known_ints(ctx, 1, "shape", &k));
    if (k > OM_MAX_RANK) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "rank %lld exceeds %d", (long long)k, OM_MAX_RANK);
    const int R = x->rank > (int)k ? x->rank : (int)k;
    int64_t d[OM_MAX_RANK];
    for (int i = 0; i < R; i++) {
        int ix = i - (R - x->rank), is = i - (R - (int)k);
        int64_t a = ix >= 0 ? x->dims[ix] : 1, b = is >= 0 ? om_index_at(s, is) : 1;
        if (a == b || b == 1) d[i] = a;
        else if (a == 1) d[i] = b;
        else
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "cannot expand dim %lld to %lld (axis %d)", (long long)a,
                              (long long)b, i);
    }
    set_out(&ctx->out[0], x->dtype, R, d);
    return NULL;
}

// x is right-aligned against y (R dims); x's size-1 dims repeat
static om_status *expand_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    om_tensor *y = &ctx->out[0];
    const int R = y->rank;
    if (om_tensor_numel(y) == 0) return NULL;
    int64_t xd[OM_MAX_RANK];
    for (int i = 0; i < R; i++) xd[i] = i < R - x->rank ? 1 : x->dims[i - (R - x->rank)];
    /* trailing dims where x and y agree form one contiguous block */
    int m = R;
    int64_t block = (int64_t)om_dtype_size(x->dtype);
    while (m > 0 && xd[m - 1] == y->dims[m - 1]) {
        block *= y->dims[m - 1];
        m--;
    }
    if (m == 0) {
        memcpy(y->data, x->data, (size_t)block);
        return NULL;
    }
    /* axis m-1 is broadcast (xd 1, y > 1): each outer step fills y->dims[m-1] copies of
     * one block; outer axes step through x with stride 0 where broadcast */
    int64_t xs[OM_MAX_RANK], st[OM_MAX_RANK], idx[OM_MAX_RANK] = {0};
    int64_t s = block;
    for (int a = m - 1; a >= 0; a--) {
        xs[a] = s;
        s *= xd[a];
    }
    for (int a = 0; a < m; a++) st[a] = xd[a] == 1 ? 0 : xs[a];
    const int64_t outer = dims_prod(y->dims, 0, m - 1), run = y->dims[m - 1] * block;
    int64_t off = 0;
    for (int64_t t = 0; t < outer; t++) {
        fill_pattern((char *)y->data + t * run, (size_t)run, (const char *)x->data + off, (size_t)block);
        off = odometer_next(m - 1, y->dims, st, idx, off);
    }
    return NULL;
}

static om_status *expand_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    int x = n->in[0], dy = c->dy[0];
    if (dy < 0 || !c->need_dx[0]) return NULL;
    int dx = om_emit_sum_to(c, dy, x);
    if (dx < 0) return NULL;
    c->dx[0] = dx;
    return NULL;
}

/* ---- Range ------------------------------------------------------------------------- */

static om_status *range_count(const om_kernel_ctx *ctx, int64_t *n) {
    *n = 0;
    for (int i = 0; i < 3; i++) {
        if (!ctx->in[i].data)
            return om_node_error(ctx->node, OM_UNSUPPORTED_OP, "input %d must be known at plan time", i);
        if (om_tensor_numel(&ctx->in[i]) != 1)
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "input %d must be a scalar", i);
        if (ctx->in[i].dtype != ctx->in[0].dtype) return om_err_dtype(ctx->node, i, ctx->in[i].dtype);
    }
    const om_dtype dt = ctx->in[0].dtype;
    if (dt == OM_F32 || dt == OM_F64) {
        double s, l, d;
        if (dt == OM_F32) {
            s = *(const float *)ctx->in[0].data, l = *(const float *)ctx->in[1].data, d = *(const float *)ctx->in[2].data;
        } else {
            s = *(const double *)ctx->in[0].data, l = *(const double *)ctx->in[1].data, d = *(const double *)ctx->in[2].data;
        }
        if (d == 0 || !isfinite(s) || !isfinite(l) || !isfinite(d))
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "start, limit and delta must be finite, delta nonzero");
        double c = ceil((l - s) / d);
        *n = c > 0 ? (int64_t)c : 0;
    } else if (om_is_index_dtype(dt)) {
        int64_t s = om_index_at(&ctx->in[0], 0), l = om_index_at(&ctx->in[1], 0), d = om_index_at(&ctx->in[2], 0);
        if (d == 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "delta is 0");
        int64_t diff = l - s;
        *n = d > 0 ? (diff > 0 ? (diff + d - 1) / d : 0) : (diff < 0 ? (-diff - d - 1) / -d : 0);
    } else {
        return om_err_dtype(ctx->node, 0, dt);
    }
    return NULL;
}

static om_status *range_infer(om_kernel_ctx *ctx) {
    int64_t n = 0;
    OM_TRY(range_count(ctx, &n));
    set_out(&ctx->out[0], ctx->in[0].dtype, 1, &n);
    return NULL;
}

// y is (n,): y[i] = start + i * delta
static om_status *range_cpu(om_kernel_ctx *ctx) {
    const int64_t n = ctx->out[0].dims[0];
    void *y = ctx->out[0].data;
    switch (ctx->in[0].dtype) {
    case OM_F32: {
        const double s = *(const float *)ctx->in[0].data, d = *(const float *)ctx->in[2].data;
        for (int64_t i = 0; i < n; i++) ((float *)y)[i] = (float)(s + (double)i * d);
    } break;
    case OM_F64: {
        const double s = *(const double *)ctx->in[0].data, d = *(const double *)ctx->in[2].data;
        for (int64_t i = 0; i < n; i++) ((double *)y)[i] = s + (double)i * d;
    } break;
    case OM_I32: {
        const int32_t s = *(const int32_t *)ctx->in[0].data, d = *(const int32_t *)ctx->in[2].data;
        for (int64_t i = 0; i < n; i++) ((int32_t *)y)[i] = (int32_t)(s + i * d);
    } break;
    case OM_I64: {
        const int64_t s = *(const int64_t *)ctx->in[0].data, d = *(const int64_t *)ctx->in[2].data;
        for (int64_t i = 0; i < n; i++) ((int64_t *)y)[i] = s + i * d;
    } break;
    default: return om_err_dtype(ctx->node, 0, ctx->in[0].dtype);
    }
    return NULL;
}

/* ---- Split, SplitGrad -------------------------------------------------------------- */

/* Sizes of the n parts along an axis of length dim: from the split input (opset 13+),
 * else the split attribute (older opsets), else n equal chunks of ceil(dim / n) with a
 * smaller last one (opset 18 num_outputs). */
static om_status *split_sizes(const om_kernel_ctx *ctx, int split_input, int64_t dim, int n, int64_t *sizes) {
    const int64_t *av;
    int na;
    int64_t sum = 0;
    if (split_input >= 0 && om_in_present(ctx, split_input)) {
        int64_t k;
        OM_TRY(known_ints(ctx, split_input, "split", &k));
        if (k != n) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "split has %lld entries for %d outputs", (long long)k, n);
        for (int j = 0; j < n; j++) sizes[j] = om_index_at(&ctx->in[split_input], j);
    } else if ((na = om_attr_ints(ctx->node, "split", &av)) >= 0) {
        if (na != n) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "split has %d entries for %d outputs", na, n);
        for (int j = 0; j < n; j++) sizes[j] = av[j];
    } else {
        const int64_t chunk = (dim + n - 1) / n;
        for (int j = 0; j < n; j++) {
            int64_t left = dim - j * chunk;
            sizes[j] = left < 0 ? 0 : left < chunk ? left : chunk;
        }
    }
    for (int j = 0; j < n; j++) {
        if (sizes[j] < 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "negative split size %lld", (long long)sizes[j]);
        if (__builtin_add_overflow(sum, sizes[j], &sum))
            return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "split sizes add up past int64 (at output %d)", j);
    }
    if (sum != dim)
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "split sizes add up to %lld, the axis has %lld", (long long)sum,
                          (long long)dim);
    return NULL;
}

/* Small splits use the stack; a model splitting into more parts pays one malloc. */
#define SPLIT_STACK 64

static om_status *split_infer(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x->rank, &axis));
    if (x->rank == 0) return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "input must have rank >= 1");
    const int n = ctx->n_out;
    /* num_outputs (opset 18) means the equal chunks split_sizes makes for the node's outputs */
    const om_attr *no = om_attr_find(ctx->node, "num_outputs");
    if (no && no->i != n)
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "num_outputs is %lld but the node has %d outputs",
                          (long long)no->i, n);
    if (no && (om_in_present(ctx, 1) || om_attr_find(ctx->node, "split")))
        return om_node_error(ctx->node, OM_INVALID_ARGUMENT, "num_outputs and split are both given");
    int64_t buf[SPLIT_STACK], *sizes = buf;
    if (n > SPLIT_STACK) OM_NEW(sizes, n);
    om_status *st = split_sizes(ctx, 1, x->dims[axis], n, sizes);
    for (int j = 0; !st && j < n; j++) {
        set_out(&ctx->out[j], x->dtype, x->rank, x->dims);
        ctx->out[j].dims[axis] = sizes[j];
    }
    if (sizes != buf) free(sizes);
    return st;
}

// x is (outer, sum n_j, inner), y_j is (outer, n_j, inner)
static om_status *split_cpu(om_kernel_ctx *ctx) {
    const om_tensor *x = &ctx->in[0];
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), x->rank, &axis));
    const int n = ctx->n_out;
    int64_t buf[SPLIT_STACK], *sizes = buf;
    if (n > SPLIT_STACK) OM_NEW(sizes, n);
    om_status *st = split_sizes(ctx, 1, x->dims[axis], n, sizes);
    if (!st) {
        const int64_t outer = dims_prod(x->dims, 0, axis);
        const int64_t inner_bytes = dims_prod(x->dims, axis + 1, x->rank) * (int64_t)om_dtype_size(x->dtype);
        const char *xp = x->data;
        for (int64_t o = 0; o < outer; o++)
            for (int j = 0; j < n; j++) {
                const int64_t chunk = sizes[j] * inner_bytes;
                if (ctx->out[j].data && chunk) memcpy((char *)ctx->out[j].data + o * chunk, xp, (size_t)chunk);
                xp += chunk;
            }
    }
    if (sizes != buf) free(sizes);
    return st;
}

/* dx = SplitGrad(Shape(x), split or absent, dy_0, ..., dy_{n-1}; axis[, split]): the dys
 * concatenated, zeros where a dy is absent (-1). */
static om_status *split_grad(om_grad_ctx *c) {
    const om_node *n = &c->g->nodes[c->node];
    const int k = n->n_out, x = n->in[0], split = n->n_in > 1 ? n->in[1] : -1;
    const int64_t axis = om_attr_int(n, "axis", 0);
    if (!c->need_dx[0]) return NULL;
    const int64_t *av;
    int na = om_attr_ints(n, "split", &av);
    int *in;
    int64_t *sa = NULL;
    OM_NEW(in, k + 2);
    if (na > 0) {
        sa = malloc((size_t)na * sizeof *sa);
        if (!sa) {
            free(in);
            return om_grad_fail(c, om_error(OM_OUT_OF_MEMORY, "out of memory in autodiff"));
        }
        memcpy(sa, av, (size_t)na * sizeof *sa);   /* n's attrs may move as nodes are added */
    }
    for (int j = 0; j < k; j++) in[2 + j] = c->dy[j];
    in[1] = split;
    int dx = (in[0] = om_emit_shape(c, x)) < 0 ? -1 : om_emit(c, om_op_split_grad_id, in, k + 2);
    if (dx >= 0) {
        om_emit_attr_int(c, "axis", axis);
        if (sa) om_emit_attr_ints(c, "split", sa, na);
        c->dx[0] = dx;
    }
    free(in);
    free(sa);
    return NULL;
}

static om_dtype split_grad_dtype(const om_graph *g, const om_node *n, int k) {
    for (int i = 2; i < n->n_in; i++)
        if (n->in[i] >= 0) return g->values[n->in[i]].dtype;
    return OM_UNDEFINED;
}

static om_status *split_grad_infer(om_kernel_ctx *ctx) {
    om_dtype dt = OM_UNDEFINED;
    for (int i = 2; i < ctx->n_in && dt == OM_UNDEFINED; i++) dt = ctx->in[i].dtype;
    if (dt == OM_UNDEFINED) return om_node_error(ctx->node, OM_INTERNAL, "no gradient input");
    return infer_from_shape_input(ctx, 0, &ctx->out[0], dt);
}

// dy_j is (outer, n_j, inner), dx is (outer, sum n_j, inner)
static om_status *split_grad_cpu(om_kernel_ctx *ctx) {
    om_tensor *dx = &ctx->out[0];
    int axis;
    OM_TRY(om_norm_axis(ctx->node, om_attr_int(ctx->node, "axis", 0), dx->rank, &axis));
    const int n = ctx->n_in - 2;
    int64_t buf[SPLIT_STACK], *sizes = buf;
    if (n > SPLIT_STACK) OM_NEW(sizes, n);
    om_status *st = split_sizes(ctx, 1, dx->dims[axis], n, sizes);
    if (!st) {
        const int64_t outer = dims_prod(dx->dims, 0, axis);
        const int64_t inner_bytes = dims_prod(dx->dims, axis + 1, dx->rank) * (int64_t)om_dtype_size(dx->dtype);
        char *p = dx->data;
        for (int64_t o = 0; o < outer; o++)
            for (int j = 0; j < n; j++) {
                const int64_t chunk = sizes[j] * inner_bytes;
                if (om_in_present(ctx, 2 + j)) memcpy(p, (const char *)ctx->in[2 + j].data + o * chunk, (size_t)chunk);
                else memset(p, 0, (size_t)chunk);
                p += chunk;
            }
    }
    if (sizes != buf) free(sizes);
    return st;
}

/* ---- the defs ---------------------------------------------------------------------- */

#define OM_MANY (1 << 20)   /* "any number" of inputs / outputs */

const om_op_def om_op_shape = {
    .name = "Shape", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .flags = OM_OP_SHAPE_ONLY | OM_OP_ANY_DTYPE, .dtype = dtype_i64, .infer = shape_infer, .cpu = shape_cpu, .diff_inputs = 0,
    .attrs = "end:int start:int",
};
const om_op_def om_op_size = {
    .name = "Size", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .flags = OM_OP_SHAPE_ONLY | OM_OP_ANY_DTYPE, .dtype = dtype_i64, .infer = size_infer, .cpu = size_cpu, .diff_inputs = 0,
};
const om_op_def om_op_constant = {
    .name = "Constant", .domain = "", .min_in = 0, .max_in = 0, .min_out = 1, .max_out = 1,
    .dtype = constant_dtype, .flags = OM_OP_ANY_DTYPE, .infer = constant_infer, .cpu = constant_cpu, .diff_inputs = 0,
    .attrs = "value:tensor value_float:float value_floats:floats value_int:int value_ints:ints",
};
const om_op_def om_op_constant_of_shape = {
    .name = "ConstantOfShape", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .dtype = constant_of_shape_dtype, .flags = OM_OP_ANY_DTYPE, .infer = constant_of_shape_infer, .cpu = constant_of_shape_cpu, .diff_inputs = 0,
    .attrs = "value:tensor",
};
const om_op_def om_op_reshape = {
    .name = "Reshape", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ALIAS | OM_OP_ANY_DTYPE, .infer = reshape_infer, .grad = reshape_back_grad, .cpu = alias_copy_cpu, .diff_inputs = 1,
    .attrs = "allowzero:int",
};
const om_op_def om_op_flatten = {
    .name = "Flatten", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ALIAS | OM_OP_ANY_DTYPE, .infer = flatten_infer, .grad = reshape_back_grad, .cpu = alias_copy_cpu, .diff_inputs = 1,
    .attrs = "axis:int",
};
const om_op_def om_op_squeeze = {
    .name = "Squeeze", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ALIAS | OM_OP_ANY_DTYPE, .infer = squeeze_infer, .grad = reshape_back_grad, .cpu = alias_copy_cpu, .diff_inputs = 1,
    .attrs = "axes:ints",
};
const om_op_def om_op_unsqueeze = {
    .name = "Unsqueeze", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ALIAS | OM_OP_ANY_DTYPE, .infer = unsqueeze_infer, .grad = reshape_back_grad, .cpu = alias_copy_cpu, .diff_inputs = 1,
    .attrs = "axes:ints",
};
const om_op_def om_op_transpose = {
    .name = "Transpose", .domain = "", .min_in = 1, .max_in = 1, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = transpose_infer, .grad = transpose_grad, .cpu = transpose_cpu, .diff_inputs = 1,
    .attrs = "perm:ints",
};
const om_op_def om_op_gather = {
    .name = "Gather", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = gather_infer, .grad = gather_grad, .cpu = gather_cpu, .diff_inputs = 1,
    .attrs = "axis:int",
};
const om_op_def om_op_gather_grad = {
    .name = "GatherGrad", .domain = "ortmod", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = gather_grad_infer, .cpu = gather_grad_cpu, .diff_inputs = 0,
    .attrs = "axis:int",
};
const om_op_def om_op_concat = {
    .name = "Concat", .domain = "", .min_in = 1, .max_in = OM_MANY, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = concat_infer, .grad = concat_grad, .cpu = concat_cpu, .diff_inputs = ~0u,
    .attrs = "axis:int",
};
const om_op_def om_op_concat_grad = {
    .name = "ConcatGrad", .domain = "ortmod", .min_in = 2, .max_in = OM_MANY, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = concat_grad_infer, .cpu = concat_grad_cpu, .diff_inputs = 0,
    .attrs = "axis:int index:int",
};
const om_op_def om_op_slice = {
    .name = "Slice", .domain = "", .min_in = 3, .max_in = 5, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = slice_infer, .grad = slice_grad, .cpu = slice_cpu, .diff_inputs = 1,
};
const om_op_def om_op_slice_grad = {
    .name = "SliceGrad", .domain = "ortmod", .min_in = 4, .max_in = 6, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = slice_grad_infer, .cpu = slice_grad_cpu, .diff_inputs = 0,
};
const om_op_def om_op_expand = {
    .name = "Expand", .domain = "", .min_in = 2, .max_in = 2, .min_out = 1, .max_out = 1,
    .flags = OM_OP_ANY_DTYPE, .infer = expand_infer, .grad = expand_grad, .cpu = expand_cpu, .diff_inputs = 1,
};
const om_op_def om_op_range = {
    .name = "Range", .domain = "", .min_in = 3, .max_in = 3, .min_out = 1, .max_out = 1,
    .infer = range_infer, .cpu = range_cpu, .diff_inputs = 0,
    .attrs = "stash_type:int=1",
};
const om_op_def om_op_split = {
    .name = "Split", .domain = "", .min_in = 1, .max_in = 2, .min_out = 1, .max_out = OM_MANY,
    .flags = OM_OP_ANY_DTYPE, .infer = split_infer, .grad = split_grad, .cpu = split_cpu, .diff_inputs = 1,
    .attrs = "axis:int num_outputs:int split:ints",
};
const om_op_def om_op_split_grad = {
    .name = "SplitGrad", .domain = "ortmod", .min_in = 3, .max_in = OM_MANY, .min_out = 1, .max_out = 1,
    .dtype = split_grad_dtype, .flags = OM_OP_ANY_DTYPE, .infer = split_grad_infer, .cpu = split_grad_cpu, .diff_inputs = 0,
    .attrs = "axis:int split:ints",
};
