/* fuse_layer_norm.c — LayerNorm / RMSNorm written out elementwise -> one op (pass "layer_norm").
 *
 *   LayerNorm:  m = ReduceMean(x, -1); d = x - m; v = ReduceMean(d^2 | d*d, -1);
 *               y = d / Sqrt(v + eps) * scale [+ bias]         -> LayerNormalization(axis=-1)
 *   RMSNorm:    v = ReduceMean(x^2 | x*x, -1);
 *               y = x / Sqrt(v + eps) * scale   (or x * Reciprocal(Sqrt(v + eps)) * scale, or
 *               x * (1 / Sqrt(v + eps)) * scale: torch.rsqrt as torch.onnx writes it)
 *                                                              -> SimplifiedLayerNormalization
 * ReduceMean must reduce exactly the last axis (axes = [-1], keepdims = 1), scale (and
 * bias) must be rank-1 parameters or constants, eps a constant scalar. Every intermediate
 * must be read by the pattern alone. */
#include "passes/fuse_match.h"

/* 1 when n is ReduceMean over axes [-1] with keepdims. */
static int mean_last(const om_graph *g, const om_node *n) {
    if (!fm_is(n, om_op_reduce_mean_id) || om_attr_int(n, "keepdims", 1) != 1) return 0;
    const int64_t *ax;
    int na = om_attr_ints(n, "axes", &ax);
    if (na == 1) return ax[0] == -1;
    if (na > 1 || n->n_in < 2 || n->in[1] < 0) return 0;
    const om_tensor *t = g->values[n->in[1]].constant;
    int64_t v[2];
    return t && om_read_ints(t, v, 2) == 1 && v[0] == -1;
}

/* d^2 as Pow(d, 2) or Mul(d, d), the single reader chain: returns the node or NULL. */
static om_node *square_of(om_graph *g, const int *uses, int v, int *d) {
    om_node *p = fm_single(g, uses, v, om_op_pow_id);
    if (p && fm_const_near(g, p->in[1], 2.0, 0)) { *d = p->in[0]; return p; }
    p = fm_single(g, uses, v, om_op_mul_id);
    if (p && p->n_in == 2 && p->in[0] >= 0 && p->in[0] == p->in[1]) { *d = p->in[0]; return p; }
    return NULL;
}

om_status *om_pass_layer_norm(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in layer_norm");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *mul = &g->nodes[k];
        if (!fm_is(mul, om_op_mul_id) || mul->n_in != 2 || mul->out[0] < 0) continue;
        for (int side = 0; side < 2; side++) {
            int scale = mul->in[1 - side], nv = mul->in[side];
            if (!fm_is_vector(g, scale)) continue;
            om_node *dead[12];
            int nd = 0;
            /* a Cast to the dtype it already has between the normalization and the scale
             * (transformers' RMSNorm casts back to the input dtype: a no-op in fp32) */
            om_node *back = fm_single(g, uses, nv, om_op_cast_id);
            if (back && fm_noop_cast(g, back)) {
                dead[nd++] = back;
                nv = back->in[0];
            }
            /* normalized = num / Sqrt(...), num * Reciprocal(Sqrt(...)) or num * (1 / Sqrt(...)) */
            om_node *norm = fm_single(g, uses, nv, om_op_div_id), *sq = NULL;
            int num = -1;
            if (norm) {
                sq = fm_single(g, uses, norm->in[1], om_op_sqrt_id);
                num = norm->in[0];
            } else if ((norm = fm_single(g, uses, nv, om_op_mul_id)) && norm->n_in == 2) {
                for (int s2 = 0; s2 < 2 && !sq; s2++) {
                    om_node *rc = fm_single(g, uses, norm->in[s2], om_op_reciprocal_id);
                    int r_in = rc ? rc->in[0] : -1;
                    if (!rc && (rc = fm_single(g, uses, norm->in[s2], om_op_div_id)) && rc->n_in == 2 &&
                        fm_const_near(g, rc->in[0], 1.0, 0))   /* 1 / Sqrt: torch.rsqrt as exported */
                        r_in = rc->in[1];
                    if (rc && r_in >= 0 && (sq = fm_single(g, uses, r_in, om_op_sqrt_id))) {
                        dead[nd++] = rc;
                        num = norm->in[1 - s2];
                    }
                }
            }
            if (!norm || !sq) continue;
            dead[nd++] = norm;
            dead[nd++] = sq;
            om_node *ae = fm_single(g, uses, sq->in[0], om_op_add_id);
            double eps;
            int vv = -1;
            if (ae && fm_const_scalar(g, ae->in[1], &eps)) vv = ae->in[0];
            else if (ae && fm_const_scalar(g, ae->in[0], &eps)) vv = ae->in[1];
            om_node *var = vv >= 0 ? fm_single(g, uses, vv, om_op_reduce_mean_id) : NULL;
            if (!var || !mean_last(g, var)) continue;
            dead[nd++] = ae;
            dead[nd++] = var;
            int d = -1;
            om_node *sqr = square_of(g, uses, var->in[0], &d);
            if (!sqr || d != num) continue;
            dead[nd++] = sqr;
            /* LayerNorm when num = x - ReduceMean(x): num read by the square and the norm only */
            om_node *sub = fm_producer(g, num);
            int x = -1, is_ln = 0;
            if (fm_is(sub, om_op_sub_id) && uses[num] == (sqr->in[0] == sqr->in[1] && fm_is(sqr, om_op_mul_id) ? 3 : 2)) {
                om_node *mean = fm_single(g, uses, sub->in[1], om_op_reduce_mean_id);
                if (mean && mean->in[0] == sub->in[0] && mean_last(g, mean)) {
                    x = sub->in[0];
                    is_ln = 1;
                    dead[nd++] = sub;
                    dead[nd++] = mean;
                }
            }
            if (!is_ln) x = num;   /* RMSNorm: the numerator is x itself */
            if (x < 0 || fm_dtype(g, x) != fm_dtype(g, scale)) continue;
            /* epsilon is a float attribute, read back as its shortest decimal: a float64
             * graph's eps that does not survive that trip stays unfused */
            if (fm_dtype(g, x) == OM_F64 && om_float_decimal((float)eps) != eps) continue;
            /* LayerNorm's optional bias: the Mul's one reader is Add(., vector) */
            om_node *last = mul;
            int bias = -1;
            if (is_ln) {
                om_node *ba = fm_sole_consumer(g, uses, mul->out[0]);
                int b = fm_is(ba, om_op_add_id) ? fm_other(ba, mul->out[0]) : -1;
                if (b >= 0 && ba->out[0] >= 0 && fm_is_vector(g, b) && fm_dtype(g, b) == fm_dtype(g, x)) {
                    bias = b;
                    last = ba;
                    dead[nd++] = mul;
                }
            }
            for (int i = 0; i < nd; i++) dead[i]->dead = 1;
            int li = fm_index(g, last);
            int in[3] = {x, scale, bias}, out[1] = {last->out[0]};
            if (is_ln) st = fm_rewrite(c, li, om_op_layer_norm_id, in, bias >= 0 ? 3 : 2, out, 1);
            else st = fm_rewrite(c, li, om_op_simplified_layer_norm_id, in, 2, out, 1);
            if (!st) st = om_node_set_int(g, li, "axis", -1);
            if (!st) st = om_node_set_float(g, li, "epsilon", (float)eps);
            break;
        }
    }
    free(uses);
    return st;
}
