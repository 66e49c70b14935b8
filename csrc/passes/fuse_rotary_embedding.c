/* fuse_rotary_embedding.c — x * cos + rotate_half(x) * sin -> FusedRotary (pass "rotary_embedding").
 *
 * Llama's rotary position embedding, as torch.onnx exports the benchmark's Llama (rotate_half by
 * x.chunk(2, -1)) and transformers' Llama, Mistral, Qwen2 (x[..., :d // 2] and x[..., d // 2 :]):
 *
 *     Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, s, e, axis)), Slice(x, 0, s, axis), axis=-1), sin))
 *
 * operands of the Add and of each Mul in either order. Matched exactly, else left alone:
 *   - the same x feeds both Slices and Mul(x, cos);
 *   - the Concat's two inputs are the Neg (first) and the [0, s) Slice, on one axis that is
 *     provably the last (-1, or rank-1 where x's rank is known: the Slices of transformers'
 *     export name axis 3 of a rank-4 Transpose);
 *   - the first Slice starts where the second ends (one value s), the second starts at a
 *     constant 0, steps are absent or 1; s and e are constants or computed from shapes only
 *     (d/2 of a dynamic export): they become the fused op's inputs, and its shape rule checks
 *     at plan time, with Slice's clamping, that the halves cover the last dim exactly;
 *   - every removed link (the Muls, Concat, Neg, Slices) is read by the pattern alone.
 * cos and sin are whatever the model computes (constants sliced to the sequence, or Cos/Sin of
 * positions); they must broadcast into x, which the shape rule checks, and get gradients when
 * they need them (the fused gradient rule emits them then). The fused op stashes nothing but
 * what the unfused Muls did (cos, sin), and its backward is one pass: dx = dy cos + rot^T(dy sin). */
#include "passes/fuse_match.h"

/* x's rank if it can be proven from its producers, else -1. */
static int rank_of(const om_graph *g, int v, int depth) {
    int r = fm_rank(g, v);
    if (r >= 0 || v < 0 || depth > 8 || g->values[v].producer < 0) return r;
    const om_node *n = &g->nodes[g->values[v].producer];
    if (n->dead) return -1;
    const om_op_id op = n->op_id;
    if (op == om_op_transpose_id) {
        const int64_t *perm;
        int np = om_attr_ints(n, "perm", &perm);
        return np > 0 ? np : -1;
    }
    if (op == om_op_slice_id || op == om_op_neg_id || op == om_op_identity_id || op == om_op_cast_id)
        return n->n_in > 0 ? rank_of(g, n->in[0], depth + 1) : -1;
    return -1;
}

/* A constant int tensor of one element, into *out. */
static int const_int1(const om_graph *g, int v, int64_t *out) {
    if (v < 0 || !g->values[v].constant) return 0;
    const om_tensor *t = g->values[v].constant;
    return (t->dtype == OM_I64 || t->dtype == OM_I32) && om_tensor_numel(t) == 1 && om_read_ints(t, out, 1) == 1;
}

/* 1 when axis a (normalized against rank r when r >= 0) is provably x's last axis. */
static int is_last_axis(int64_t a, int r) { return a == -1 || (r >= 1 && a == r - 1); }

/* A bound (split or end): a 1-element integer constant, or a value computed from shapes only. */
static int bound_ok(const om_graph *g, int v) {
    om_dtype dt = fm_dtype(g, v);
    if (dt != OM_I64 && dt != OM_I32) return 0;
    int64_t c;
    return const_int1(g, v, &c) || (!g->values[v].constant && fm_shape_derived(g, v, 0));
}

/* Slice(x, starts, ends, axes, steps?) on one last axis of x with step 1. */
static int slice_ok(const om_graph *g, const om_node *sl, int x, int r) {
    int64_t axis, step;
    if (sl->n_in < 4 || sl->n_in > 5 || sl->n_attr || sl->in[0] != x || !const_int1(g, sl->in[3], &axis))
        return 0;
    if (sl->n_in == 5 && sl->in[4] >= 0 && !(const_int1(g, sl->in[4], &step) && step == 1)) return 0;
    return is_last_axis(axis, r);
}

/* The rotate_half(x) value rot: on a match returns x, sets *split and *end, and adds the nodes to dead[]. */
static int rotate_half_of(om_graph *g, const int *uses, int rot, int *split, int *end, om_node **dead, int *nd) {
    om_node *cat = fm_single(g, uses, rot, om_op_concat_id);
    if (!cat || cat->n_in != 2 || cat->n_attr != 1) return -1;
    om_node *neg = fm_single(g, uses, cat->in[0], om_op_neg_id);
    om_node *lo = fm_single(g, uses, cat->in[1], om_op_slice_id);              /* x[..., 0:s] */
    om_node *hi = neg && neg->n_in == 1 ? fm_single(g, uses, neg->in[0], om_op_slice_id) : NULL;   /* x[..., s:e] */
    if (!lo || !hi || hi == lo) return -1;
    int x = hi->in[0], r = rank_of(g, x, 0);
    if (x < 0 || !is_last_axis(om_attr_int(cat, "axis", 0), r) || !slice_ok(g, hi, x, r) || !slice_ok(g, lo, x, r))
        return -1;
    int64_t zero, a, b;
    if (!const_int1(g, lo->in[1], &zero) || zero != 0) return -1;
    /* the split: one value, or two constants of one value */
    int s = hi->in[1];
    if (lo->in[2] != s && !(const_int1(g, lo->in[2], &a) && const_int1(g, s, &b) && a == b)) return -1;
    if (!bound_ok(g, s) || !bound_ok(g, hi->in[2])) return -1;
    dead[(*nd)++] = cat;
    dead[(*nd)++] = neg;
    dead[(*nd)++] = lo;
    dead[(*nd)++] = hi;
    *split = s;
    *end = hi->in[2];
    return x;
}

om_status *om_pass_rotary_embedding(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in rotary_embedding");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *add = &g->nodes[k];
        if (!fm_is(add, om_op_add_id) || add->n_in != 2 || add->out[0] < 0) continue;
        int done = 0;
        for (int side = 0; side < 2 && !done; side++) {
            om_node *ms = fm_single(g, uses, add->in[side], om_op_mul_id);        /* rotate_half(x) * sin */
            om_node *mc = fm_single(g, uses, add->in[1 - side], om_op_mul_id);    /* x * cos */
            if (!ms || !mc || ms == mc || ms->n_in != 2 || mc->n_in != 2) continue;
            for (int rs = 0; rs < 2 && !done; rs++) {
                om_node *dead[6];
                int nd = 0, split = -1, end = -1;
                int x = rotate_half_of(g, uses, ms->in[rs], &split, &end, dead, &nd);
                int sin = ms->in[1 - rs];
                if (x < 0 || sin < 0) continue;
                int cos = fm_other(mc, x);
                om_dtype dt = fm_dtype(g, x);
                if (cos < 0 || !om_dtype_is_float(dt) || fm_dtype(g, cos) != dt || fm_dtype(g, sin) != dt) continue;
                for (int i = 0; i < nd; i++) dead[i]->dead = 1;
                ms->dead = mc->dead = 1;
                int in[5] = {x, cos, sin, split, end}, out[1] = {add->out[0]};
                st = fm_rewrite(c, k, om_op_fused_rotary_id, in, 5, out, 1);
                done = 1;
            }
        }
    }
    free(uses);
    return st;
}
