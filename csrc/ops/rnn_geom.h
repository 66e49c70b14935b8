/* rnn_geom.h — LSTM / GRU / RNN's configuration and shape checks, shared by the CPU (rnn.c) and
 * CUDA (cuda/rnn.cu) kernels of the forward and backward ops: the same attributes and shapes are
 * accepted, and refused with the same message, on both. Dtype checks stay with each device (the
 * dtypes its kernels take); the callers run them first. Errors and attributes go through
 * om_error, om_attr_int, om_attr_float, om_attr_string and om_attr_strings (cuda/rnn.cu maps them
 * onto its host table, as conv.cu does for spatial.h). Plain C that C++ (nvcc) also compiles.
 *
 * Layouts (ONNX's, seq_length-major): X (T, B, In), W (D, G*H, In), R (D, G*H, H), B (D, 2*G*H),
 * initial_h / initial_c (D, B, H), Y (T, D, B, H); the backward ops' saved gates (D, T, B, G*H)
 * and states (D, T, B, H). */
#ifndef OM_RNN_GEOM_H
#define OM_RNN_GEOM_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/op.h"

enum { CELL_LSTM = 0, CELL_GRU = 1, CELL_RNN = 2 };

typedef struct rnn_cfg {
    int cell;              /* CELL_LSTM / CELL_GRU / CELL_RNN */
    int G;                 /* gates */
    int D;                 /* directions */
    int reverse0;          /* direction 0 runs backwards in time ("reverse") */
    int lbr;               /* GRU linear_before_reset */
    int relu[2];           /* RNN, per direction: the activation is Relu (else Tanh) */
    int64_t T, B, In, H;
} rnn_cfg;

static inline const char *om_rnn_name(const om_node *n) { return n && n->name ? n->name : ""; }

static inline int om_rnn_present(const om_kernel_ctx *ctx, int i) {
    return i < ctx->n_in && ctx->in[i].dtype != OM_UNDEFINED;
}

/* om_err_unsupported's message, from here (the CUDA provider cannot call the engine's) */
static inline om_status *om_rnn_unsupported(const om_node *n, const char *what) {
    return om_error(OM_UNSUPPORTED_OP, "node '%s' (%s): unsupported: %s", n && n->name ? n->name : "?",
                    n && n->op ? n->op->name : "?", what);
}

/* RNN's activations: one per direction, Tanh (the default) or Relu. ONNX's default lists two
 * whatever the direction, so one direction given two takes the first, as onnxruntime does. */
static inline om_status *om_rnn_activations(const om_node *n, rnn_cfg *c) {
    const char *const *acts = NULL;
    const int na = om_attr_strings(n, "activations", &acts);
    if (na <= 0) return NULL;
    if (na != c->D && !(c->D == 1 && na == 2))
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': activations lists %d functions, expected %d (one per "
                        "direction)", n->op->name, om_rnn_name(n), na, (int)c->D);
    for (int d = 0; d < c->D; d++) {
        if (strcmp(acts[d], "Relu") == 0) c->relu[d] = 1;
        else if (strcmp(acts[d], "Tanh") != 0) {
            char what[96];
            snprintf(what, sizeof what, "activation '%.40s' (Tanh and Relu are implemented)", acts[d]);
            return om_rnn_unsupported(n, what);
        }
    }
    return NULL;
}

/* The attributes: fills cell, G, D, reverse0, lbr, relu and H (-1: from W). */
static inline om_status *om_rnn_attrs(const om_node *n, int cell, rnn_cfg *c) {
    memset(c, 0, sizeof *c);
    c->cell = cell;
    c->G = cell == CELL_LSTM ? 4 : cell == CELL_GRU ? 3 : 1;
    const char *dir = om_attr_string(n, "direction", "forward");
    if (strcmp(dir, "forward") == 0) c->D = 1;
    else if (strcmp(dir, "reverse") == 0) c->D = 1, c->reverse0 = 1;
    else if (strcmp(dir, "bidirectional") == 0) c->D = 2;
    else return om_rnn_unsupported(n, "direction other than forward, reverse or bidirectional");
    if (om_attr_int(n, "layout", 0) != 0) return om_rnn_unsupported(n, "layout = 1 (batch-major)");
    /* a float clip (rnn.c's rnn_attrs also refuses one of another type, and activation_alpha /
     * activation_beta, by om_attr_find, which the provider has not: a CUDA plan runs that first) */
    if (!isnan(om_attr_float(n, "clip", NAN))) return om_rnn_unsupported(n, "the clip attribute");
    if (cell == CELL_LSTM && om_attr_int(n, "input_forget", 0) != 0) return om_rnn_unsupported(n, "input_forget = 1");
    if (cell == CELL_RNN) {
        OM_TRY(om_rnn_activations(n, c));
    } else {
        const char *const *acts = NULL;
        if (om_attr_strings(n, "activations", &acts) >= 0) return om_rnn_unsupported(n, "the activations attribute");
    }
    c->lbr = cell == CELL_GRU ? om_attr_int(n, "linear_before_reset", 0) != 0 : 0;
    c->H = om_attr_int(n, "hidden_size", -1);
    return NULL;
}

/* Input idx (t, named what) must have dims (rank, dims). */
static inline om_status *om_rnn_expect_shape(const om_node *n, const om_tensor *t, int idx, const char *what, int rank,
                                             const int64_t *dims) {
    int ok = t->rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t->dims[i] == dims[i];
    if (ok) return NULL;
    char got[128], want[160];
    int k = snprintf(got, sizeof got, "[");
    for (int i = 0; i < t->rank && k < (int)sizeof got - 24; i++)
        k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    snprintf(got + k, sizeof got - (size_t)k, "]");
    k = snprintf(want, sizeof want, "[");
    for (int i = 0; i < rank && k < (int)sizeof want - 24; i++)
        k += snprintf(want + k, sizeof want - (size_t)k, "%s%lld", i ? ", " : "", (long long)dims[i]);
    snprintf(want + k, sizeof want - (size_t)k, "]");
    return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d (%s) has shape %s, expected %s", n->op->name,
                    om_rnn_name(n), idx, what, got, want);
}

/* X, W, R (inputs 0..2) after om_rnn_attrs: fills T, B, In and H. */
static inline om_status *om_rnn_geometry(const om_node *n, const om_tensor *x, const om_tensor *w, const om_tensor *r,
                                         rnn_cfg *c) {
    if (x->rank != 3)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': X must be (seq_length, batch, input_size)", n->op->name,
                        om_rnn_name(n));
    c->T = x->dims[0], c->B = x->dims[1], c->In = x->dims[2];
    if (c->H < 0) {
        if (w->rank != 3)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': W must have rank 3", n->op->name, om_rnn_name(n));
        c->H = w->dims[1] / c->G;
    }
    const int64_t wd[3] = {c->D, c->G * c->H, c->In}, rd[3] = {c->D, c->G * c->H, c->H};
    OM_TRY(om_rnn_expect_shape(n, w, 1, "W", 3, wd));
    OM_TRY(om_rnn_expect_shape(n, r, 2, "R", 3, rd));
    return NULL;
}

/* The forward's optional inputs: B, sequence_lens, initial_h, initial_c, P. seq_lens: the
 * sequence_lens values (I32 or I64 as input 4 is), or NULL where they are not known yet (a
 * shape-only pass). Each must lie in [0, seq_length]. allow_short: the device's kernels implement
 * shorter sequences (the CPU's do; CUDA's do not yet and refuse them by name). */
static inline om_status *om_rnn_check_optional(const om_kernel_ctx *ctx, const rnn_cfg *c, const void *seq_lens,
                                               int allow_short) {
    const om_node *n = ctx->node;
    if (om_rnn_present(ctx, 3)) {
        const int64_t bd[2] = {c->D, 2 * c->G * c->H};
        OM_TRY(om_rnn_expect_shape(n, &ctx->in[3], 3, "B", 2, bd));
    }
    if (om_rnn_present(ctx, 4)) {
        const om_tensor *s = &ctx->in[4];
        int64_t count = 1;
        for (int i = 0; i < s->rank; i++) count *= s->dims[i];
        if (count != c->B)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': sequence_lens must have batch_size elements",
                            n->op->name, om_rnn_name(n));
        for (int64_t b = 0; seq_lens && b < c->B; b++) {
            int64_t v = s->dtype == OM_I64 ? ((const int64_t *)seq_lens)[b] : ((const int32_t *)seq_lens)[b];
            if (v < 0 || v > c->T)
                return om_error(OM_INVALID_ARGUMENT, "%s node '%s': sequence_lens[%lld] = %lld is outside [0, %lld]",
                                n->op->name, om_rnn_name(n), (long long)b, (long long)v, (long long)c->T);
            if (v != c->T && !allow_short) return om_rnn_unsupported(n, "sequence_lens shorter than seq_length on this device");
        }
    }
    const int64_t hd[3] = {c->D, c->B, c->H};
    for (int i = 5; i <= (c->cell == CELL_LSTM ? 6 : 5); i++)
        if (om_rnn_present(ctx, i)) OM_TRY(om_rnn_expect_shape(n, &ctx->in[i], i, i == 5 ? "initial_h" : "initial_c", 3, hd));
    if (c->cell == CELL_LSTM && om_rnn_present(ctx, 7)) return om_rnn_unsupported(n, "peephole weights P");
    return NULL;
}

/* LSTMGrad / GRUGrad / RNNGrad's inputs 3.. after om_rnn_attrs and om_rnn_geometry: initial_h?,
 * initial_c?, Y, gates, saved (cells, GRU's hr), dY?, dY_h?, dY_c? (RNNGrad: no gates, no saved
 * state). */
static inline om_status *om_rnn_grad_check(const om_kernel_ctx *ctx, const rnn_cfg *c) {
    const om_node *n = ctx->node;
    const int64_t hd[3] = {c->D, c->B, c->H}, yd[4] = {c->T, c->D, c->B, c->H};
    const int64_t gd[4] = {c->D, c->T, c->B, c->G * c->H}, sd[4] = {c->D, c->T, c->B, c->H};
    static const char *const names[11] = {"X", "W", "R", "initial_h", "initial_c", "Y",
                                          "gates", "saved", "dY", "dY_h", "dY_c"};
    for (int i = 3; i < 11; i++) {
        if (c->cell == CELL_RNN && (i == 6 || i == 7)) continue;   /* RNN saves only Y */
        if (!om_rnn_present(ctx, i)) {
            if (i >= 5 && i <= 7)
                return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input %d (%s) is required", n->op->name,
                                om_rnn_name(n), i, names[i]);
            continue;
        }
        const int64_t *want = i == 5 || i == 8 ? yd : i == 6 ? gd : i == 7 ? sd : hd;
        OM_TRY(om_rnn_expect_shape(n, &ctx->in[i], i, names[i], i >= 5 && i <= 8 ? 4 : 3, want));
    }
    return NULL;
}

#endif
