/* fuse_attention.c — scaled-dot-product attention -> one FusedAttention (pass "attention").
 *
 * Matched as torch.onnx (TorchScript, opset 20) exports F.scaled_dot_product_attention and
 * transformers' GPT-2/BERT eager attention, walking back from the second MatMul:
 *
 *   MatMul(P, V)
 *     P  <- [Dropout] <- [Cast to the same dtype] <- [Where(IsNaN(sm), 0, sm)] <- sm
 *     sm =  Softmax(axis=-1, scores)
 *     scores <- [Add(., mask)] <- [Mul/Div by scalar]* <- MatMul(Qs, Ks)
 *     Qs <- [Mul/Div by scalar] <- Q
 *     Ks <- [Mul/Div by scalar] <- Transpose(K, last two dims swapped) | K^T as is
 *
 * Scalars are constants (folded into the scale attribute) or values computed only from
 * shapes (SDPA's 1/sqrt(head dim) of a dynamic-shape export): those become inputs, read at
 * run time, as does a float64 constant that the float32 attribute cannot hold (0.3 on
 * float64 inputs); the shape rule checks they are scalars. An additive mask of the form
 * Where(Equal(Trilu(Expand(1, shape), upper=0), 0), -inf, 0) — SDPA's is_causal — becomes
 * causal=1 (no mask tensor is read), with the Expand's shape checked to be (L, S) at plan
 * time. Every other mask is an input of the fused op (it may broadcast; it gets a
 * gradient if it needs one). Intermediates must be read by the pattern alone. */
#include "passes/fuse_match.h"

typedef struct factors {
    double scale;
    int in[3], n, inv;      /* non-constant scalar factors, bit i of inv: divides */
    om_node *dead[8];
    int nd;
} factors;

/* If v = Mul(u, s) or Div(u, s) with s a scalar constant or shape-derived value and v read
 * once, records s and returns u; otherwise returns v. */
static int peel_scalar(om_graph *g, const int *uses, int v, factors *f) {
    om_node *n = fm_single(g, uses, v, om_op_mul_id);
    int div = 0;
    if (!n) { n = fm_single(g, uses, v, om_op_div_id); div = 1; }
    if (!n || n->n_in != 2 || f->nd >= 8) return v;
    for (int side = div ? 1 : 0; side < 2; side++) {
        int s = n->in[side], u = n->in[1 - side];
        if (s < 0 || u < 0) return v;
        double cv;
        const int is_const = fm_const_scalar(g, s, &cv) && g->values[s].constant->dtype == g->values[v].dtype;
        if (is_const && !(g->values[s].dtype == OM_F64 && (double)(float)cv != cv)) {
            if (div && cv == 0) return v;
            f->scale = div ? f->scale / cv : f->scale * cv;
        } else if ((is_const || fm_shape_derived(g, s, 0)) && f->n < 3 && om_dtype_is_float(g->values[s].dtype)) {
            /* read at run time, in double: a shape-derived scalar, or a float64 constant that
             * the float32 scale attribute cannot hold (SDPA's scale=0.3 on float64 inputs) */
            if (div) f->inv |= 1 << f->n;
            f->in[f->n++] = s;
        } else {
            continue;
        }
        f->dead[f->nd++] = n;
        return u;
    }
    return v;
}

/* scores = [Mul/Div]* MatMul(...): returns the MatMul (single use) or NULL. */
static om_node *scores_matmul(om_graph *g, const int *uses, int v, factors *f) {
    for (int i = 0; i < 3; i++) {
        int u = peel_scalar(g, uses, v, f);
        if (u == v) break;
        v = u;
    }
    return fm_single(g, uses, v, om_op_matmul_id);
}

/* SDPA's causal mask: returns the Expand's shape value, or -1. */
static int causal_shape(om_graph *g, int mask) {
    om_node *w = fm_producer(g, mask);
    double lo, zero;
    if (!fm_is(w, om_op_where_id) || !fm_const_scalar(g, w->in[1], &lo) || !(lo <= -1e30) ||
        !fm_const_scalar(g, w->in[2], &zero) || zero != 0)
        return -1;
    om_node *eq = fm_producer(g, w->in[0]);
    if (!fm_is(eq, om_op_equal_id)) return -1;
    int tri_v = fm_const_near(g, eq->in[1], 0.0, 0) ? eq->in[0] : fm_const_near(g, eq->in[0], 0.0, 0) ? eq->in[1] : -1;
    om_node *tri = fm_producer(g, tri_v);
    if (!fm_is(tri, om_op_trilu_id) || om_attr_int(tri, "upper", 1) != 0) return -1;
    if (tri->n_in > 1 && tri->in[1] >= 0 && !fm_const_near(g, tri->in[1], 0.0, 0)) return -1;
    om_node *ex = fm_producer(g, tri->in[0]);
    if (!fm_is(ex, om_op_expand_id) || !fm_const_near(g, ex->in[0], 1.0, 0) || ex->in[1] < 0) return -1;
    return fm_shape_derived(g, ex->in[1], 0) ? ex->in[1] : -1;
}

static int is_swap_last2(const om_node *t) {
    const int64_t *perm;
    int np = om_attr_ints(t, "perm", &perm);
    if (np < 2) return 0;
    for (int i = 0; i < np - 2; i++)
        if (perm[i] != i) return 0;
    return perm[np - 2] == np - 1 && perm[np - 1] == np - 2;
}

static om_status *try_fuse(om_pass_ctx *c, const int *uses, int k) {
    om_graph *g = c->g;
    om_node *mm2 = &g->nodes[k];
    if (mm2->n_in != 2 || mm2->in[0] < 0 || mm2->in[1] < 0 || mm2->out[0] < 0) return NULL;
    om_node *dead[32];
    int nd = 0;
    int p = mm2->in[0], V = mm2->in[1];
    om_node *drop = NULL;
    int nan_to_zero = 0;
    /* P <- Dropout / Cast / Where(IsNaN) in any order, each at most once */
    for (int step = 0; step < 4 && p >= 0; step++) {
        om_node *n = fm_single(g, uses, p, om_op_dropout_id);
        if (n && !drop && fm_n_outputs(n) >= 1 && !(n->n_out > 1 && n->out[1] >= 0 && uses[n->out[1]] > 0)) {
            drop = n;
            dead[nd++] = n;
            p = n->in[0];
            continue;
        }
        n = fm_single(g, uses, p, om_op_cast_id);
        if (n && fm_noop_cast(g, n)) {
            dead[nd++] = n;
            p = n->in[0];
            continue;
        }
        n = fm_single(g, uses, p, om_op_where_id);
        if (n && !nan_to_zero && fm_const_near(g, n->in[1], 0.0, 0)) {
            om_node *isn = fm_single(g, uses, n->in[0], om_op_is_nan_id);
            int sm = n->in[2];
            if (isn && sm >= 0 && isn->in[0] == sm && uses[sm] == 2 && fm_is(fm_producer(g, sm), om_op_softmax_id)) {
                nan_to_zero = 1;
                dead[nd++] = n;
                dead[nd++] = isn;
                p = sm;
                continue;
            }
        }
        break;
    }
    om_node *sm = fm_producer(g, p);
    if (!fm_is(sm, om_op_softmax_id) || uses[p] != (nan_to_zero ? 2 : 1) || sm->in[0] < 0) return NULL;
    if (om_attr_int(sm, "axis", g->opset >= 13 ? -1 : 1) != -1) return NULL;
    dead[nd++] = sm;
    factors f = {.scale = 1.0};
    int s = sm->in[0], mask = -1;
    om_node *mm1 = NULL;
    om_node *add = fm_single(g, uses, s, om_op_add_id);
    if (add && add->n_in == 2) {
        for (int side = 0; side < 2 && !mm1; side++) {
            factors f2 = f;
            om_node *m = scores_matmul(g, uses, add->in[side], &f2);
            if (m) { mm1 = m; f = f2; mask = add->in[1 - side]; }
        }
        if (!mm1) return NULL;
        dead[nd++] = add;
    } else {
        mm1 = scores_matmul(g, uses, s, &f);
        if (!mm1) return NULL;
    }
    dead[nd++] = mm1;
    int Q = peel_scalar(g, uses, mm1->in[0], &f);
    int Kv = peel_scalar(g, uses, mm1->in[1], &f);
    int K = Kv, kt = 1;
    om_node *tr = fm_producer(g, Kv);
    if (fm_is(tr, om_op_transpose_id) && is_swap_last2(tr)) { K = tr->in[0]; kt = 0; }
    om_dtype dt = fm_dtype(g, Q);
    if (!om_dtype_is_float(dt) || fm_dtype(g, K) != dt || fm_dtype(g, V) != dt) return NULL;
    /* the scale attribute is float32: a float64 product of exact factors that it cannot hold
     * stays unfused (the kernel computes everything else in the inputs' dtype) */
    if (dt == OM_F64 && (double)(float)f.scale != f.scale) return NULL;
    int cshape = mask >= 0 ? causal_shape(g, mask) : -1;
    if (mask >= 0 && cshape < 0 && fm_dtype(g, mask) != dt) return NULL;
    for (int i = 0; i < f.nd; i++) dead[nd++] = f.dead[i];
    /* the rewrite */
    int lse = om_graph_add_value(g, NULL, om_dtype_stat(dt));   /* FusedAttention's dtype rule */
    int seed = drop && !fm_dropout_is_identity(drop) ? om_graph_add_value(g, NULL, OM_I64) : -1;
    if (lse < 0 || (drop && !fm_dropout_is_identity(drop) && seed < 0))
        return om_error(OM_OUT_OF_MEMORY, "out of memory in attention");
    int in[10] = {Q, K, V, cshape >= 0 ? -1 : mask, -1, -1, -1, -1, -1, cshape};
    for (int i = 0; i < f.n; i++) in[4 + i] = f.in[i];
    if (seed >= 0) {
        in[7] = drop->n_in > 1 ? drop->in[1] : -1;
        in[8] = drop->in[2];
    }
    int n_in = 10;
    while (n_in > 3 && in[n_in - 1] < 0) n_in--;
    int out[3] = {mm2->out[0], lse, seed};
    for (int i = 0; i < nd; i++) dead[i]->dead = 1;
    OM_TRY(fm_rewrite(c, k, om_op_fused_attention_id, in, n_in, out, seed >= 0 ? 3 : 2));
    if (f.scale != 1.0) OM_TRY(om_node_set_float(g, k, "scale", (float)f.scale));
    if (f.inv) OM_TRY(om_node_set_int(g, k, "inv", f.inv));
    if (cshape >= 0) OM_TRY(om_node_set_int(g, k, "causal", 1));
    if (kt) OM_TRY(om_node_set_int(g, k, "k_transposed", 1));
    if (nan_to_zero) OM_TRY(om_node_set_int(g, k, "nan_to_zero", 1));
    return NULL;
}

om_status *om_pass_attention(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in attention");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++)
        if (fm_is(&g->nodes[k], om_op_matmul_id)) st = try_fuse(c, uses, k);
    free(uses);
    return st;
}
