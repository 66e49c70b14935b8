/* fuse_gelu.c — a GELU written out elementwise -> one Gelu (pass "gelu").
 *
 *   tanh form (GPT-2's gelu_new, exported as 8 nodes):
 *     0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))        -> Gelu(approximate="tanh")
 *   erf form:
 *     0.5 x (1 + erf(x / sqrt 2))  (or x * 0.70710678)        -> Gelu
 * with the 0.5 applied to x or to the product, operands of Mul/Add in either order. The
 * constants must match to 1e-5 (relative; for fp16/bf16 constants, to their dtype's
 * rounding): the fused kernel computes the same formula, so results differ by rounding only. Runs before bias_gelu so that Add + this becomes one
 * BiasGelu. */
#include "passes/fuse_match.h"

#define REL 1e-5

/* 1 + f(inner) where f is Tanh or Erf: returns the f node's input (single-use chain), or -1. */
static int one_plus(om_graph *g, const int *uses, int v, om_op_id f, om_node **dead, int *nd) {
    om_node *add = fm_single(g, uses, v, om_op_add_id);
    int t = fm_operand_with_const(g, add, 1.0, REL);
    om_node *fn = t >= 0 ? fm_single(g, uses, t, f) : NULL;
    if (!fn) return -1;
    dead[(*nd)++] = add;
    dead[(*nd)++] = fn;
    return fn->in[0];
}

/* Checks the tanh argument k0 (x + k1 x^3) and returns x, or -1. */
static int tanh_arg(om_graph *g, const int *uses, int v, om_node **dead, int *nd) {
    om_node *m0 = fm_single(g, uses, v, om_op_mul_id);
    int s = fm_operand_with_const(g, m0, 0.7978845608028654, REL);
    om_node *ad = s >= 0 ? fm_single(g, uses, s, om_op_add_id) : NULL;
    if (!ad || ad->n_in != 2) return -1;
    for (int side = 0; side < 2; side++) {
        int x = ad->in[side];
        om_node *m1 = fm_single(g, uses, ad->in[1 - side], om_op_mul_id);
        int p = fm_operand_with_const(g, m1, 0.044715, REL);
        om_node *pw = p >= 0 ? fm_single(g, uses, p, om_op_pow_id) : NULL;
        if (!pw || x < 0 || pw->in[0] != x || !fm_const_near(g, pw->in[1], 3.0, 0)) continue;
        dead[(*nd)++] = m0;
        dead[(*nd)++] = ad;
        dead[(*nd)++] = m1;
        dead[(*nd)++] = pw;
        return x;
    }
    return -1;
}

/* Checks the erf argument x / sqrt2 or x * (1/sqrt2) and returns x, or -1. */
static int erf_arg(om_graph *g, const int *uses, int v, om_node **dead, int *nd) {
    om_node *n = fm_single(g, uses, v, om_op_div_id);
    if (n && fm_const_near(g, n->in[1], 1.4142135623730951, REL)) {
        dead[(*nd)++] = n;
        return n->in[0];
    }
    n = fm_single(g, uses, v, om_op_mul_id);
    int x = fm_operand_with_const(g, n, 0.7071067811865476, REL);
    if (x >= 0) dead[(*nd)++] = n;
    return x;
}

/* x * (1 + f(arg(x))) with x given: the f-part from value v. Returns 1 (tanh) / 0 (erf) / -1. */
static int gelu_tail(om_graph *g, const int *uses, int x, int v, om_node **dead, int *nd) {
    int save = *nd;
    int a = one_plus(g, uses, v, om_op_tanh_id, dead, nd);
    if (a >= 0 && tanh_arg(g, uses, a, dead, nd) == x) return 1;
    *nd = save;
    a = one_plus(g, uses, v, om_op_erf_id, dead, nd);
    if (a >= 0 && erf_arg(g, uses, a, dead, nd) == x) return 0;
    *nd = save;
    return -1;
}

om_status *om_pass_gelu(om_pass_ctx *c) {
    om_graph *g = c->g;
    int *uses = om_graph_use_counts(g);
    if (!uses) return om_error(OM_OUT_OF_MEMORY, "out of memory in gelu");
    om_status *st = NULL;
    for (int k = 0; k < g->n_nodes && !st; k++) {
        om_node *top = &g->nodes[k];
        if (!fm_is(top, om_op_mul_id) || top->n_in != 2 || top->out[0] < 0) continue;
        om_node *dead[16];
        int nd = 0, mode = -1, x = -1;
        /* form A: (x * 0.5) * (1 + f(...)) */
        for (int side = 0; side < 2 && mode < 0; side++) {
            om_node *h = fm_single(g, uses, top->in[side], om_op_mul_id);
            int xx = fm_operand_with_const(g, h, 0.5, 0);
            if (xx < 0) continue;
            nd = 0;
            dead[nd++] = h;
            mode = gelu_tail(g, uses, xx, top->in[1 - side], dead, &nd);
            x = xx;
        }
        /* form B: (x * (1 + f(...))) * 0.5 */
        int inner = mode < 0 ? fm_operand_with_const(g, top, 0.5, 0) : -1;
        om_node *h = inner >= 0 ? fm_single(g, uses, inner, om_op_mul_id) : NULL;
        for (int side = 0; h && h->n_in == 2 && side < 2 && mode < 0; side++) {
            nd = 0;
            dead[nd++] = h;
            x = h->in[side];
            mode = gelu_tail(g, uses, x, h->in[1 - side], dead, &nd);
        }
        if (mode < 0 || x < 0 || !om_dtype_is_float(fm_dtype(g, x))) continue;
        for (int i = 0; i < nd; i++) dead[i]->dead = 1;
        int in[1] = {x}, out[1] = {top->out[0]};
        if ((st = fm_rewrite(c, k, om_op_gelu_id, in, 1, out, 1))) break;
        if (mode == 1) st = om_node_set_string(g, k, "approximate", "tanh");
    }
    free(uses);
    return st;
}
