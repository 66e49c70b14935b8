/* attention_geom.h — FusedAttention / FusedAttentionGrad's geometry and shape checks, shared by
 * the CPU (attention.c) and CUDA (cuda/attention.cu, whose flash.cu path takes the same geometry)
 * kernels: the same shapes are accepted, and refused with the same message, on both. Dtype checks
 * stay with each device (the dtypes its kernels take), and so does reading the scale factors and
 * the dropout ratio (tensor data on the CPU, host copies known at plan time on CUDA); the callers
 * run the dtype checks first and pass the values to om_attn_factor / om_attn_dropout. Errors,
 * shapes in them and attributes go through om_error, om_shape_str, om_attr_int and om_attr_float
 * (cuda/attention.cu maps them onto its host table and a local formatter, as conv.cu does for
 * spatial.h). Plain C that C++ (nvcc) also compiles.
 *
 *   Q (batch..., L, D), K (batch..., S, D) — or K^T (batch..., D, S) with k_transposed —,
 *   V (batch..., S, Dv), mask additive, broadcast to (batch..., L, S).
 * batch is the numpy broadcast of Q's, K's and the mask's batch dims; V's must broadcast to it.
 * Multi-query and grouped attention (one K/V per group of heads) are K and V of size 1 along
 * the heads dim: a broadcast, stride 0 there. */
#ifndef OM_ATTENTION_GEOM_H
#define OM_ATTENTION_GEOM_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"

typedef struct om_attn_geom {
    int64_t L, S, D, Dv;
    int nb;                          /* batch rank */
    int64_t batch[OM_MAX_RANK], nbatch;
    /* per batch dim, in elements (0 = broadcast along it) */
    int64_t q_str[OM_MAX_RANK], k_str[OM_MAX_RANK], v_str[OM_MAX_RANK], m_str[OM_MAX_RANK];
    int64_t m_row, m_col;            /* mask strides along L and S (0 = broadcast) */
    int has_mask, causal, kt, nan_to_zero, dropout;
    double scale, ratio;
} om_attn_geom;

static inline const char *om_attn_name(const om_node *n) { return n && n->name ? n->name : ""; }

/* "<Op> node '<name>': <what> <t's shape>" (t may be NULL) */
static inline om_status *om_attn_err(const om_node *n, const char *what, const om_tensor *t) {
    char s[128] = "";
    if (t) om_shape_str(t, s, sizeof s);
    return om_error(OM_INVALID_ARGUMENT, "%s node '%s': %s %s", n->op->name, om_attn_name(n), what, s);
}

/* Right-aligned strides (str, per batch dim) of an operand whose batch dims are bd (rank br)
 * against batch (rank nb), each batch item mat elements; -1 when bd does not broadcast to it. */
static inline int om_attn_batch_strides(const int64_t *bd, int br, const int64_t *batch, int nb, int64_t mat,
                                        int64_t *str) {
    int64_t s = mat;
    for (int i = nb - 1; i >= 0; i--) {
        int j = i - (nb - br);
        int64_t d = j >= 0 ? bd[j] : 1;
        if (d != 1 && d != batch[i]) return -1;
        str[i] = d == 1 ? 0 : s;
        s *= d;
    }
    return 0;
}

/* The attributes k_transposed, causal and nan_to_zero, and the geometry of Q, K, V and the mask M
 * (NULL: none): fills every field but scale, ratio and dropout (om_attn_scale, om_attn_factor,
 * om_attn_dropout). */
static inline om_status *om_attn_shapes(const om_node *n, const om_tensor *Q, const om_tensor *K, const om_tensor *V,
                                        const om_tensor *M, om_attn_geom *g) {
    memset(g, 0, sizeof *g);
    const om_tensor *qkv[3] = {Q, K, V};
    for (int i = 0; i < 3; i++)
        if (qkv[i]->rank < 2) return om_attn_err(n, "Q, K and V must have rank >= 2, got", qkv[i]);
    g->kt = om_attr_int(n, "k_transposed", 0) != 0;
    g->causal = om_attr_int(n, "causal", 0) != 0;
    g->nan_to_zero = om_attr_int(n, "nan_to_zero", 0) != 0;
    g->L = Q->dims[Q->rank - 2];
    g->D = Q->dims[Q->rank - 1];
    g->S = g->kt ? K->dims[K->rank - 1] : K->dims[K->rank - 2];
    const int64_t kd = g->kt ? K->dims[K->rank - 2] : K->dims[K->rank - 1];
    if (kd != g->D) return om_attn_err(n, "Q and K differ in the head dim; K is", K);
    if (V->dims[V->rank - 2] != g->S) return om_attn_err(n, "V must have S rows, got", V);
    g->Dv = V->dims[V->rank - 1];
    g->has_mask = M != NULL;
    /* batch = broadcast of Q, K and mask batch dims */
    const int mb = M ? (M->rank > 2 ? M->rank - 2 : 0) : 0;
    int nb = Q->rank - 2;
    if (K->rank - 2 > nb) nb = K->rank - 2;
    if (mb > nb) nb = mb;
    if (V->rank - 2 > nb) return om_attn_err(n, "V has more batch dims than the scores:", V);
    g->nb = nb;
    g->nbatch = 1;
    const om_tensor *ops[3] = {Q, K, M};
    for (int i = 0; i < nb; i++) {
        int64_t d = 1;
        for (int k = 0; k < 3; k++) {
            const om_tensor *t = ops[k];
            if (!t) continue;
            int br = t->rank > 2 ? t->rank - 2 : 0, j = i - (nb - br);
            int64_t e = j >= 0 ? t->dims[j] : 1;
            if (e != 1 && d != 1 && e != d) return om_attn_err(n, "batch dims do not broadcast:", t);
            if (e != 1) d = e;
        }
        g->batch[i] = d;
        g->nbatch *= d;
    }
    if (om_attn_batch_strides(Q->dims, Q->rank - 2, g->batch, nb, g->L * g->D, g->q_str) ||
        om_attn_batch_strides(K->dims, K->rank - 2, g->batch, nb, g->S * g->D, g->k_str) ||
        om_attn_batch_strides(V->dims, V->rank - 2, g->batch, nb, g->S * g->Dv, g->v_str))
        return om_attn_err(n, "batch dims do not broadcast; V is", V);
    if (M) {
        const int64_t ml = M->rank >= 2 ? M->dims[M->rank - 2] : 1, ms = M->rank >= 1 ? M->dims[M->rank - 1] : 1;
        if ((ml != 1 && ml != g->L) || (ms != 1 && ms != g->S))
            return om_attn_err(n, "the mask does not broadcast to (L, S); it is", M);
        g->m_col = ms == 1 ? 0 : 1;
        g->m_row = ml == 1 ? 0 : ms;
        if (om_attn_batch_strides(M->dims, mb, g->batch, nb, ml * ms, g->m_str)) return om_attn_err(n, "bad mask", M);
    }
    /* both providers' GEMMs (BLAS, cuBLAS) take int dims */
    if (g->L > INT32_MAX || g->S > INT32_MAX || g->D > INT32_MAX || g->Dv > INT32_MAX)
        return om_attn_err(n, "dims exceed the BLAS int range", NULL);
    return NULL;
}

/* The scale attribute; returns the inv attribute (bit i: factor f_i divides). */
static inline int om_attn_scale(const om_node *n, om_attn_geom *g) {
    g->scale = om_attr_float(n, "scale", 1.0f);
    return (int)om_attr_int(n, "inv", 0);
}

/* Factor input f_i (i = 0..2) of value v: the effective scale is scale * prod f_i^(+-1). */
static inline void om_attn_factor(om_attn_geom *g, int inv, int i, double v) {
    g->scale = (inv >> i & 1) ? g->scale / v : g->scale * v;
}

/* training_mode (0/1) and the dropout ratio (0.5 when the input is absent); sets dropout and
 * ratio (0 without dropout). */
static inline om_status *om_attn_dropout(const om_node *n, om_attn_geom *g, int training, double ratio) {
    g->dropout = 0;
    g->ratio = 0.0;
    if (training && !(ratio >= 0.0 && ratio <= 1.0)) return om_attn_err(n, "dropout ratio outside [0, 1]", NULL);
    if (training && ratio > 0.0) { g->dropout = 1; g->ratio = ratio; }
    return NULL;
}

#endif
