/* fuse_match.h — pattern-matching helpers shared by the fusion passes (fuse_*.c).
 *
 * A fusion walks the live nodes, matches a chain backwards from its last node, and then
 * rewrites that last node in place into the fused op (it keeps its index, name and output
 * value, so the topological order and every consumer stay valid) and marks the other
 * chain nodes dead. A chain node other than the last may be removed only if its output is
 * read by the chain alone (use count 1): otherwise the pattern is left alone. Side nodes
 * (a Transpose feeding K, a scale computation) are not touched; DCE drops them when the
 * fused node was their only reader.
 *
 * Shapes are unknown when passes run. A pattern is fused only when what it needs is
 * provable from what is known (ranks of parameters and constants, constant values);
 * what can be checked only with concrete shapes is checked by the fused op's shape rule.
 */
#ifndef OM_FUSE_MATCH_H
#define OM_FUSE_MATCH_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "passes/pass.h"

/* Every value id a pass takes from a node's inputs or outputs may be -1: an absent optional
 * value, and in an imported model any input or output of an internal op (an empty name). The
 * helpers below take -1 and answer "no match"; a pass reads g->values[v] only through them or
 * after checking v >= 0. */

/* The dtype of v, OM_UNDEFINED for an absent value (-1). */
static inline om_dtype fm_dtype(const om_graph *g, int v) { return v < 0 ? OM_UNDEFINED : g->values[v].dtype; }

/* The live node producing v, or NULL (graph input, constant, dead producer). */
static inline om_node *fm_producer(om_graph *g, int v) {
    if (v < 0 || g->values[v].producer < 0) return NULL;
    om_node *n = &g->nodes[g->values[v].producer];
    return n->dead ? NULL : n;
}

/* 1 when n is live and of op. An id names the domain too: the fused and backward ops are
 * "ortmod" ids, and a com.microsoft node resolves to the "ortmod" op of its name. */
static inline int fm_is(const om_node *n, om_op_id op) { return n && !n->dead && n->op_id == op; }

/* The live producer of v if it is an op-typed node whose output v is read only once. */
static inline om_node *fm_single(om_graph *g, const int *uses, int v, om_op_id op) {
    om_node *n = fm_producer(g, v);
    return fm_is(n, op) && uses[v] == 1 ? n : NULL;
}

/* Number of outputs of n that exist. */
static inline int fm_n_outputs(const om_node *n) {
    int k = 0;
    for (int j = 0; j < n->n_out; j++) k += n->out[j] >= 0;
    return k;
}

/* Value of a constant scalar (numel 1, any float — fp16/bf16 included — or int dtype). */
static inline int fm_const_scalar(const om_graph *g, int v, double *out) {
    if (v < 0 || !g->values[v].constant) return 0;
    const om_tensor *t = g->values[v].constant;
    return om_tensor_numel(t) == 1 && om_scalar_get(t, out) == 0;
}

/* 1 when v is a constant scalar within rel of want. A nonzero rel is widened to the
 * rounding of the constant's own dtype: a fp16 model's sqrt(2/pi) is 0.7979 (bf16: 0.7969),
 * and the fused kernel, which uses the exact constant, still differs from the unfused
 * graph by that dtype's rounding only. rel 0 asks for exact equality. */
static inline int fm_const_near(const om_graph *g, int v, double want, double rel) {
    double x;
    if (!fm_const_scalar(g, v, &x)) return 0;
    om_dtype dt = g->values[v].constant->dtype;
    if (rel > 0 && dt == OM_F16 && rel < 0x1p-11) rel = 0x1p-11;
    if (rel > 0 && dt == OM_BF16 && rel < 0x1p-8) rel = 0x1p-8;
    return fabs(x - want) <= rel * fabs(want) + 1e-30;
}

/* The rank of v if provable now: constants, graph inputs with a declared rank. -1 otherwise. */
static inline int fm_rank(const om_graph *g, int v) {
    if (v < 0) return -1;
    if (g->values[v].constant) return g->values[v].constant->rank;
    if (g->values[v].producer < 0) return g->values[v].rank_hint;
    const om_node *n = &g->nodes[g->values[v].producer];
    if (n->op_id == om_op_gemm_id) return 2;
    return -1;
}

/* 1 when v is computed only from constants and shapes (known at plan time, never a
 * gradient path): the scale factors of the attention pattern. */
static inline int fm_shape_derived(const om_graph *g, int v, int depth) {
    if (v < 0) return depth > 0;   /* an absent optional input of a shape node, not an absent scalar */
    if (g->values[v].constant) return 1;
    int p = g->values[v].producer;
    if (p < 0 || depth > 16) return 0;
    const om_node *n = &g->nodes[p];
    if (n->op->flags & OM_OP_SHAPE_ONLY) return 1;
    if (n->op->flags & OM_OP_RANDOM) return 0;
    for (int i = 0; i < n->n_in; i++)
        if (!fm_shape_derived(g, n->in[i], depth + 1)) return 0;
    return 1;
}

/* For a binary node n reading v, the other operand (-1 if n does not read v). */
static inline int fm_other(const om_node *n, int v) {
    if (n->n_in != 2) return -1;
    if (n->in[0] == v) return n->in[1];
    if (n->in[1] == v) return n->in[0];
    return -1;
}

/* For a binary node with one constant-scalar operand near want: the other operand. */
static inline int fm_operand_with_const(const om_graph *g, const om_node *n, double want, double rel) {
    if (!n || n->n_in != 2) return -1;
    if (fm_const_near(g, n->in[1], want, rel)) return n->in[0];
    if (fm_const_near(g, n->in[0], want, rel)) return n->in[1];
    return -1;
}

/* A rank-1 parameter or constant (a per-column bias / scale). */
static inline int fm_is_vector(const om_graph *g, int v) { return fm_rank(g, v) == 1; }

/* 1 when the Cast node n does not change the dtype of its input. */
static inline int fm_noop_cast(const om_graph *g, const om_node *n) {
    return fm_is(n, om_op_cast_id) && n->in[0] >= 0 && n->out[0] >= 0 &&
           om_attr_int(n, "to", 0) == (int64_t)g->values[n->in[0]].dtype;
}

/* 1 when the Dropout node n is exactly a no-op at run time: no training_mode input. */
static inline int fm_dropout_is_identity(const om_node *n) { return n->n_in < 3 || n->in[2] < 0; }

/* The weight of a MatMul(x, w) as a provably 2-D matrix: w itself (*transposed 0), or the
 * input of a Transpose(perm 1,0) of one (*transposed 1, folded as transB). -1 otherwise. */
static inline int fm_matrix_weight(om_graph *g, int w, int *transposed) {
    *transposed = 0;
    if (fm_rank(g, w) == 2) return w;
    om_node *t = fm_producer(g, w);
    const int64_t *perm;
    int np = fm_is(t, om_op_transpose_id) ? om_attr_ints(t, "perm", &perm) : -2;
    if (!t || t->n_in < 1 || fm_rank(g, t->in[0]) != 2 || !(np == -1 || (np == 2 && perm[0] == 1 && perm[1] == 0)))
        return -1;
    *transposed = 1;
    return t->in[0];
}

/* Rewrites node idx as op and reports the fusion. */
static inline om_status *fm_rewrite(om_pass_ctx *c, int idx, om_op_id op, const int *in, int n_in, const int *out,
                                    int n_out) {
    OM_TRY(om_graph_replace_node(c->g, idx, op, in, n_in, out, n_out));
    om_pass_fired(c, c->g->nodes[idx].name);
    return NULL;
}

/* The one live node reading v (and v is not a graph output), or NULL. */
static inline om_node *fm_sole_consumer(om_graph *g, const int *uses, int v) {
    if (v < 0 || uses[v] != 1) return NULL;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return NULL;
    for (int k = 0; k < g->n_nodes; k++) {
        om_node *n = &g->nodes[k];
        if (n->dead) continue;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] == v) return n;
    }
    return NULL;
}

static inline int fm_index(const om_graph *g, const om_node *n) { return (int)(n - g->nodes); }

#endif
