/* rnn.c — recurrent layers: LSTM, GRU and the plain (Elman) RNN (ONNX opset 14+, as torch.onnx
 * exports nn.LSTM / nn.GRU / nn.RNN) and their backward ops (backpropagation through time).
 *
 * Exports (rnn.list):
 *   om_op_lstm        LSTM       (X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?)
 *                                -> Y?, Y_h?, Y_c?, gates?, cells?
 *   om_op_gru         GRU        (X, W, R, B?, sequence_lens?, initial_h?)
 *                                -> Y?, Y_h?, gates?, hr?
 *   om_op_rnn         RNN        (X, W, R, B?, sequence_lens?, initial_h?) -> Y?, Y_h?
 *   om_op_lstm_grad   LSTMGrad   (domain ortmod) (X, W, R, initial_h?, initial_c?, Y, gates, cells,
 *                                dY?, dY_h?, dY_c?, sequence_lens?) -> dX, dW, dR, dB, dinitial_h, dinitial_c
 *   om_op_gru_grad    GRUGrad    (domain ortmod) (X, W, R, initial_h?, -, Y, gates, hr,
 *                                dY?, dY_h?, -, sequence_lens?) -> dX, dW, dR, dB, dinitial_h
 *   om_op_rnn_grad    RNNGrad    (domain ortmod) (X, W, R, initial_h?, -, Y, -, -, dY?, dY_h?, -,
 *                                sequence_lens?)
 *                                -> dX, dW, dR, dB, dinitial_h
 *
 * Shapes (ONNX layout 0, which the exporter uses; D = 2 when bidirectional, else 1;
 * G = 4 gates for LSTM, 3 for GRU, 1 for RNN):
 *   X (T, B, I)  W (D, G*H, I)  R (D, G*H, H)  B (D, 2*G*H) = [Wb, Rb]
 *   initial_h, initial_c, Y_h, Y_c (D, B, H)  Y (T, D, B, H)
 * Gate order is ONNX's: LSTM i, o, f, c; GRU z, r, h (the exporter reorders torch's).
 * RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb), f per direction from `activations` (Tanh, the
 * default, or Relu: nn.RNN's nonlinearity).
 *
 * Saved state for the backward — outputs ONNX does not define, reserved by max_out:
 *   LSTM output 3  gates (D, T, B, 4H): i, o, f, c~ after their activations
 *   LSTM output 4  cells (D, T, B, H):  the cell state c_t
 *   GRU  output 2  gates (D, T, B, 3H): z, r, h~ after their activations
 *   GRU  output 3  hr    (D, T, B, H):  H_{t-1} Rh^T + Rbh (the reset-gated recurrent term)
 * The gradient rules add them (and Y, which holds every h_t) with om_node_ensure_output;
 * the forward writes them only when they exist, so inference pays nothing. RNN saves only Y:
 * f'(pre) is a function of h_t = f(pre) (tanh: 1 - h^2; relu: h > 0, so relu'(0) = 0 as in
 * torch).
 *
 * Forward per direction: one GEMM X W^T for all time steps (plus the biases), then per
 * step one GEMM H_{t-1} R^T and the gate nonlinearities. Backward walks the steps in
 * reverse collecting the pre-activation gate gradients dG (T, B, G*H), with one GEMM per
 * step for dH_{t-1} = dG_t R and dR += dG_t^T H_{t-1}; then dX = dG W and dW = dG^T X are
 * one GEMM each, dB a column sum.
 *
 * sequence_lens (I32/I64, each in [0, T]): step t of sequence b runs only when t < len[b] (the
 * reverse direction starts at len[b] - 1); other steps give Y = 0 and leave h (and c) as they were,
 * so Y_h / Y_c are each sequence's state at its last valid step. The backward skips those steps:
 * no gate gradient, dh (and dc) pass straight through, dY there is ignored (Y is a constant 0), and
 * the state before a valid step is rebuilt per sequence (Y[tp], or the initial state where tp is
 * past the end). The gradient rule passes the lengths as the Grad op's input 11.
 *
 * Supported: directions forward/reverse/bidirectional, default activations (RNN: Tanh or Relu
 * per direction), GRU with linear_before_reset = 1 (torch's GRU) or 0. Not supported
 * (UnsupportedOpError naming the node and the attribute): layout = 1, clip, input_forget,
 * peepholes P, activation_alpha/activation_beta, LSTM/GRU
 * activations, RNN activations other than Tanh/Relu (the attrs lists below refuse the
 * attributes at import; rnn_attrs again, for graphs built otherwise).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/gemm.h"
#include "ops/op_util.h"
#include "ops/op.h"
#include "ops/rnn_geom.h"

#define RNN_FLOAT(dt, node, ...)                                                \
    switch (dt) {                                                               \
    case OM_F32: { typedef float T; __VA_ARGS__; } break;                       \
    case OM_F64: { typedef double T; __VA_ARGS__; } break;                      \
    default: return om_err_dtype((node), 0, (dt));                              \
    }

/* For messages: the cell's op name. */
static const char *cell_name(int cell) {
    return om_op_get(cell == CELL_LSTM ? om_op_lstm_id : cell == CELL_GRU ? om_op_gru_id : om_op_rnn_id)->name;
}

static int node_in(const om_node *n, int i) { return i < n->n_in ? n->in[i] : -1; }

/* row-major C (M, N) = alpha op(A) op(B) + beta C, float or double by `f32` */
static void gemm(int f32, int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A, int64_t lda,
                 const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    om_gemm(f32 ? OM_F32 : OM_F64, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- attributes and geometry: ops/rnn_geom.h (shared with cuda/rnn.cu) ---------------- */

/* om_rnn_attrs, and the attributes no RNN op implements by any type (the attrs lists refuse them
 * at import; this, for graphs built otherwise) */
static om_status *rnn_attrs(const om_node *n, int cell, rnn_cfg *c) {
    if (om_attr_find(n, "clip")) return om_err_unsupported(n, "the clip attribute");
    if (om_attr_find(n, "activation_alpha") || om_attr_find(n, "activation_beta"))
        return om_err_unsupported(n, "activation_alpha/activation_beta");
    return om_rnn_attrs(n, cell, c);
}

/* Checks X, W, R (inputs 0..2) and fills T, B, In, H. */
static om_status *rnn_geometry(const om_node *n, const om_tensor *x, const om_tensor *w, const om_tensor *r, rnn_cfg *c) {
    OM_TRY(om_check_float(n, x, 0, OM_UNDEFINED));
    OM_TRY(om_check_float(n, w, 1, x->dtype));
    OM_TRY(om_check_float(n, r, 2, x->dtype));
    return om_rnn_geometry(n, x, w, r, c);
}

/* ---- forward ------------------------------------------------------------------------------ */

static om_status *rnn_check_optional(const om_kernel_ctx *ctx, const rnn_cfg *c) {
    const om_node *n = ctx->node;
    const om_dtype dt = ctx->in[0].dtype;
    for (int i = 3; i <= (c->cell == CELL_LSTM ? 6 : 5); i++) {
        if (!om_in_present(ctx, i)) continue;
        const om_dtype got = ctx->in[i].dtype;
        if (i == 4 ? got != OM_I32 && got != OM_I64 : got != dt) return om_err_dtype(n, i, got);
    }
    return om_rnn_check_optional(ctx, c, om_in_present(ctx, 4) ? ctx->in[4].data : NULL, 1);
}

static void set_dims(om_tensor *o, om_dtype dt, int rank, int64_t a, int64_t b, int64_t c, int64_t d) {
    const int64_t v[4] = {a, b, c, d};
    o->dtype = dt;
    o->rank = rank;
    for (int i = 0; i < rank; i++) o->dims[i] = v[i];
}

static om_status *rnn_infer(om_kernel_ctx *ctx, int cell) {
    rnn_cfg c;
    OM_TRY(rnn_attrs(ctx->node, cell, &c));
    OM_TRY(rnn_geometry(ctx->node, &ctx->in[0], &ctx->in[1], &ctx->in[2], &c));
    OM_TRY(rnn_check_optional(ctx, &c));
    const om_dtype dt = ctx->in[0].dtype;
    const int ns = cell == CELL_LSTM ? 3 : 2;   /* index of the first saved output */
    for (int j = 0; j < ctx->n_out; j++) {
        if (j == 0) set_dims(&ctx->out[j], dt, 4, c.T, c.D, c.B, c.H);
        else if (j < ns) set_dims(&ctx->out[j], dt, 3, c.D, c.B, c.H, 0);
        else if (j == ns) set_dims(&ctx->out[j], dt, 4, c.D, c.T, c.B, c.G * c.H);
        else set_dims(&ctx->out[j], dt, 4, c.D, c.T, c.B, c.H);
    }
    return NULL;
}

static om_status *lstm_infer(om_kernel_ctx *ctx) { return rnn_infer(ctx, CELL_LSTM); }
static om_status *gru_infer(om_kernel_ctx *ctx) { return rnn_infer(ctx, CELL_GRU); }
static om_status *elman_infer(om_kernel_ctx *ctx) { return rnn_infer(ctx, CELL_RNN); }

static void *out_data(const om_kernel_ctx *ctx, int j) { return j < ctx->n_out ? ctx->out[j].data : NULL; }

/* sequence_lens (input 4) as int64 into L (B), or NULL when absent (every sequence full length).
 * ONNX semantics: step t of sequence b runs only when t < L[b] (the reverse direction starts at
 * L[b] - 1); other steps give Y = 0 and leave the state as it was. */
static om_status *read_lens(const om_kernel_ctx *ctx, int idx, int64_t B, int64_t **L) {
    *L = NULL;
    if (!om_in_present(ctx, idx)) return NULL;
    const om_tensor *s = &ctx->in[idx];
    if (s->dtype != OM_I32 && s->dtype != OM_I64) return om_err_dtype(ctx->node, idx, s->dtype);
    int64_t *l = malloc((size_t)(B > 0 ? B : 1) * sizeof *l);
    if (!l) return om_error(OM_OUT_OF_MEMORY, "%s node '%s': out of memory", ctx->node->op->name, om_node_name(ctx->node));
    for (int64_t b = 0; b < B; b++)
        l[b] = s->dtype == OM_I64 ? ((const int64_t *)s->data)[b] : ((const int32_t *)s->data)[b];
    *L = l;
    return NULL;
}

/* h_t lives in Y[t, d] (B, H), or in scratch (T, B, H) when Y is absent */
#define FWD_H(t) (Y ? Y + ((t) * D + d) * B * H : h_tmp + (t) * B * H)

static om_status *rnn_cpu(om_kernel_ctx *ctx, int cell) {
    const om_node *n = ctx->node;
    rnn_cfg c;
    OM_TRY(rnn_attrs(n, cell, &c));
    OM_TRY(rnn_geometry(n, &ctx->in[0], &ctx->in[1], &ctx->in[2], &c));
    OM_TRY(rnn_check_optional(ctx, &c));
    const int64_t nT = c.T, B = c.B, In = c.In, H = c.H, D = c.D, GH = c.G * c.H;
    const int ns = cell == CELL_LSTM ? 3 : 2;
    const int f32 = ctx->in[0].dtype == OM_F32;
    int64_t *L = NULL;
    RNN_FLOAT(ctx->in[0].dtype, n, {
        OM_TRY(read_lens(ctx, 4, B, &L));
        const T *X = ctx->in[0].data, *W = ctx->in[1].data, *R = ctx->in[2].data;
        const T *Bias = om_in_present(ctx, 3) ? ctx->in[3].data : NULL;
        const T *h0 = om_in_present(ctx, 5) ? ctx->in[5].data : NULL;
        const T *c0 = cell == CELL_LSTM && om_in_present(ctx, 6) ? ctx->in[6].data : NULL;
        T *Y = out_data(ctx, 0), *Yh = out_data(ctx, 1), *Yc = cell == CELL_LSTM ? out_data(ctx, 2) : NULL;
        T *Sg = out_data(ctx, ns), *Ss = out_data(ctx, ns + 1);
        /* scratch: gates (T,B,GH) and states (T,B,H) when not saved, h (T,B,H) when Y is absent,
         * zeros (B,H) for absent initial states, GRU's recurrent product (B,GH); with sequence_lens,
         * the carried h (B,H) (Y is 0 past a sequence's end, so the state cannot live there) */
        const int64_t need = (Sg ? 0 : nT * B * GH) + (Ss ? 0 : nT * B * H) + (Y ? 0 : nT * B * H) + B * H + B * GH +
                             (L ? B * H : 0);
        T *scratch = calloc((size_t)(need > 0 ? need : 1), sizeof(T));
        if (!scratch) free(L);
        if (!scratch) return om_error(OM_OUT_OF_MEMORY, "%s node '%s': out of memory", n->op->name, om_node_name(n));
        T *p = scratch;
        T *gates_tmp = Sg ? NULL : p; p += Sg ? 0 : nT * B * GH;
        T *state_tmp = Ss ? NULL : p; p += Ss ? 0 : nT * B * H;
        T *h_tmp = Y ? NULL : p; p += Y ? 0 : nT * B * H;
        T *zeros = p; p += B * H;
        T *rec = p; p += B * GH;
        T *hcar = L ? p : NULL;
        for (int64_t d = 0; d < D; d++) {
            const int rev = d == 1 || c.reverse0;
            const T *Wd = W + d * GH * In, *Rd = R + d * GH * H;
            const T *Wb = Bias ? Bias + d * 2 * GH : NULL, *Rb = Bias ? Bias + d * 2 * GH + GH : NULL;
            T *gates = Sg ? Sg + d * nT * B * GH : gates_tmp;
            T *states = Ss ? Ss + d * nT * B * H : state_tmp;
            // gates (T*B, GH) = X (T*B, I) @ Wd^T (GH, I) + input-side biases
            gemm(f32, 0, 1, nT * B, GH, In, 1.0, X, In, Wd, In, 0.0, gates, GH);
            if (Bias) {
                /* LSTM and GRU's z, r gates take Wb + Rb here; GRU's h gate takes Rbh inside the reset product */
                const int64_t nr = cell == CELL_GRU ? 2 * H : GH;
                for (int64_t row = 0; row < nT * B; row++) {
                    T *restrict g = gates + row * GH;
                    for (int64_t j = 0; j < GH; j++) g[j] += Wb[j] + (j < nr ? Rb[j] : 0);
                }
            }
            const T *hprev = h0 ? h0 + d * B * H : zeros;
            const T *cprev = c0 ? c0 + d * B * H : zeros;
            if (hcar) {
                memcpy(hcar, hprev, (size_t)(B * H) * sizeof(T));
                hprev = hcar;
            }
            for (int64_t s = 0; s < nT; s++) {
                const int64_t t = rev ? nT - 1 - s : s;
                T *restrict g = gates + t * B * GH;
                T *restrict h = FWD_H(t);
                T *restrict st = states + t * B * H;
                if (cell == CELL_LSTM) {
                    // g (B, 4H) += hprev (B, H) @ Rd^T (H, 4H)
                    gemm(f32, 0, 1, B, GH, H, 1.0, hprev, H, Rd, H, 1.0, g, GH);
                    for (int64_t b = 0; b < B; b++) {
                        T *restrict gi = g + b * GH, *restrict go = gi + H, *restrict gf = gi + 2 * H, *restrict gc = gi + 3 * H;
                        const T *restrict cp = cprev + b * H;
                        T *restrict cb = st + b * H, *restrict hb = h + b * H;
                        for (int64_t j = 0; j < H; j++) {
                            const T i_ = (T)(1 / (1 + exp(-(double)gi[j])));
                            const T o_ = (T)(1 / (1 + exp(-(double)go[j])));
                            const T f_ = (T)(1 / (1 + exp(-(double)gf[j])));
                            const T c_ = (T)tanh((double)gc[j]);
                            gi[j] = i_, go[j] = o_, gf[j] = f_, gc[j] = c_;
                            const T cn = f_ * cp[j] + i_ * c_;
                            cb[j] = cn;
                            hb[j] = o_ * (T)tanh((double)cn);
                        }
                    }
                } else if (cell == CELL_RNN) {
                    // g (B, H) += hprev (B, H) @ Rd^T (H, H); h = f(g)   (NaN stays NaN through either)
                    gemm(f32, 0, 1, B, GH, H, 1.0, hprev, H, Rd, H, 1.0, g, GH);
                    if (c.relu[d])
                        for (int64_t k = 0; k < B * H; k++) h[k] = g[k] < 0 ? (T)0 : g[k];
                    else
                        for (int64_t k = 0; k < B * H; k++) h[k] = (T)tanh((double)g[k]);
                } else {
                    // rec (B, 3H) = hprev (B, H) @ Rd^T (H, 3H)   (+ Rbh on the h part when linear_before_reset)
                    if (c.lbr) {
                        gemm(f32, 0, 1, B, GH, H, 1.0, hprev, H, Rd, H, 0.0, rec, GH);
                    } else {
                        /* z, r recurrent parts now; the h part needs r first */
                        gemm(f32, 0, 1, B, 2 * H, H, 1.0, hprev, H, Rd, H, 0.0, rec, GH);
                    }
                    for (int64_t b = 0; b < B; b++) {
                        T *restrict gz = g + b * GH, *restrict gr = gz + H;
                        const T *restrict rz = rec + b * GH, *restrict rr = rz + H;
                        for (int64_t j = 0; j < H; j++) {
                            gz[j] = (T)(1 / (1 + exp(-(double)(gz[j] + rz[j]))));
                            gr[j] = (T)(1 / (1 + exp(-(double)(gr[j] + rr[j]))));
                        }
                    }
                    if (!c.lbr) {
                        /* rec_h (B, H) = (r * hprev) (B, H) @ Rh^T (H, H): r * hprev staged in st */
                        for (int64_t b = 0; b < B; b++)
                            for (int64_t j = 0; j < H; j++) st[b * H + j] = g[b * GH + H + j] * hprev[b * H + j];
                        gemm(f32, 0, 1, B, H, H, 1.0, st, H, Rd + 2 * H * H, H, 0.0, rec + 2 * H, GH);
                    }
                    for (int64_t b = 0; b < B; b++) {
                        T *restrict gz = g + b * GH, *restrict gr = gz + H, *restrict gh = gz + 2 * H;
                        const T *restrict rh = rec + b * GH + 2 * H, *restrict hp = hprev + b * H;
                        T *restrict sb = st + b * H, *restrict hb = h + b * H;
                        for (int64_t j = 0; j < H; j++) {
                            const T hr = rh[j] + (Rb ? Rb[2 * H + j] : 0);
                            const T hh = (T)tanh((double)(gh[j] + (c.lbr ? gr[j] * hr : hr)));
                            gh[j] = hh;
                            sb[j] = hr;   /* lbr: H_{t-1} Rh^T + Rbh; else (r * H_{t-1}) Rh^T + Rbh */
                            hb[j] = (1 - gz[j]) * hh + gz[j] * hp[j];
                        }
                    }
                }
                if (L) {
                    /* past a sequence's end: Y = 0, the state stays (LSTM's cell: the one before) */
                    for (int64_t b = 0; b < B; b++) {
                        if (t < L[b]) {
                            memcpy(hcar + b * H, h + b * H, (size_t)H * sizeof(T));
                            continue;
                        }
                        memset(h + b * H, 0, (size_t)H * sizeof(T));
                        if (cell == CELL_LSTM) memcpy(st + b * H, cprev + b * H, (size_t)H * sizeof(T));
                    }
                }
                if (cell == CELL_LSTM) cprev = st;
                hprev = L ? hcar : h;
            }
            if (Yh) memcpy(Yh + d * B * H, hprev, (size_t)(B * H) * sizeof(T));
            if (Yc) memcpy(Yc + d * B * H, cprev, (size_t)(B * H) * sizeof(T));
        }
        free(scratch);
    });
    free(L);
    return NULL;
}

static om_status *lstm_cpu(om_kernel_ctx *ctx) { return rnn_cpu(ctx, CELL_LSTM); }
static om_status *gru_cpu(om_kernel_ctx *ctx) { return rnn_cpu(ctx, CELL_GRU); }
static om_status *elman_cpu(om_kernel_ctx *ctx) { return rnn_cpu(ctx, CELL_RNN); }

/* ---- gradient rules ---------------------------------------------------------------------- */

static om_status *rnn_grad(om_grad_ctx *c, int cell) {
    const int node = c->node;
    const om_node *n = &c->g->nodes[node];
    const int ny = cell == CELL_LSTM ? 3 : 2;   /* ONNX outputs; saved state follows (none for RNN) */
    int any_dy = 0;
    for (int j = 0; j < ny && j < n->n_out; j++) any_dy |= c->dy[j] >= 0;
    const int diff[6] = {0, 1, 2, 3, 5, 6};
    int any_dx = 0;
    for (int k = 0; k < (cell == CELL_LSTM ? 6 : 5); k++) any_dx |= diff[k] < n->n_in && c->need_dx[diff[k]];
    if (!any_dy || !any_dx) return NULL;
    const int x = node_in(n, 0), w = node_in(n, 1), r = node_in(n, 2), h0 = node_in(n, 5);
    const int c0 = cell == CELL_LSTM ? node_in(n, 6) : -1;
    const int dy0 = n->n_out > 0 ? c->dy[0] : -1, dy1 = n->n_out > 1 ? c->dy[1] : -1;
    const int dy2 = cell == CELL_LSTM && n->n_out > 2 ? c->dy[2] : -1;
    const char *dir = om_attr_string(n, "direction", "forward");
    char dir_copy[32];
    snprintf(dir_copy, sizeof dir_copy, "%s", dir);
    const int64_t hidden = om_attr_int(n, "hidden_size", -1), lbr = om_attr_int(n, "linear_before_reset", 0);
    const char *name = n->name;
    const om_dtype dt = c->g->values[x].dtype;
    const int y = om_node_ensure_output(c->g, node, 0, dt);
    const int s1 = cell == CELL_RNN ? -1 : om_node_ensure_output(c->g, node, ny, dt);
    const int s2 = cell == CELL_RNN ? -1 : om_node_ensure_output(c->g, node, ny + 1, dt);
    if (y < 0 || (cell != CELL_RNN && (s1 < 0 || s2 < 0)))
        return om_grad_fail(c, om_error(OM_INTERNAL, "%s node '%s': cannot add the outputs saved for the backward",
                                        cell_name(cell), name));
    /* the sequence lengths ride along: the backward skips the steps the forward skipped */
    int in[12] = {x, w, r, h0, c0, y, s1, s2, dy0, dy1, dy2, node_in(n, 4)};
    int out[6] = {-1, -1, -1, -1, -1, -1};
    const int nout = cell == CELL_LSTM ? 6 : 5;
    static const om_op_id grad_op[3] = {om_op_lstm_grad_id, om_op_gru_grad_id, om_op_rnn_grad_id};
    if (om_emit_node(c, grad_op[cell], in, in[11] >= 0 ? 12 : 11, out, nout, NULL) < 0) return NULL;
    const int last = om_emit_last(c);
    om_grad_fail(c, om_node_set_string(c->g, last, "direction", dir_copy));
    om_emit_attr_int(c, "hidden_size", hidden);
    if (cell == CELL_GRU) om_emit_attr_int(c, "linear_before_reset", lbr);
    const om_node *fn = &c->g->nodes[node];
    if (cell == CELL_RNN) {   /* (the forward's attr array stays put while nodes are emitted) */
        const char *const *acts = NULL;
        const int na = om_attr_strings(fn, "activations", &acts);
        if (na > 0) om_grad_fail(c, om_node_set_strings(c->g, last, "activations", acts, na));
        fn = &c->g->nodes[node];
    }
    for (int k = 0; k < nout; k++) {
        const int i = diff[k];
        if (i < fn->n_in && fn->in[i] >= 0 && c->need_dx[i]) c->dx[i] = out[k];
    }
    return NULL;
}

static om_status *lstm_grad(om_grad_ctx *c) { return rnn_grad(c, CELL_LSTM); }
static om_status *gru_grad(om_grad_ctx *c) { return rnn_grad(c, CELL_GRU); }
static om_status *elman_grad(om_grad_ctx *c) { return rnn_grad(c, CELL_RNN); }

/* ---- backward ops ------------------------------------------------------------------------ */

static om_status *rnn_grad_check(om_kernel_ctx *ctx, int cell, rnn_cfg *c) {
    const om_node *n = ctx->node;
    OM_TRY(rnn_attrs(n, cell, c));
    OM_TRY(rnn_geometry(n, &ctx->in[0], &ctx->in[1], &ctx->in[2], c));
    for (int i = 3; i < 11 && i < ctx->n_in; i++)
        if (om_in_present(ctx, i) && !(cell == CELL_RNN && (i == 6 || i == 7)) && ctx->in[i].dtype != ctx->in[0].dtype)
            return om_err_dtype(n, i, ctx->in[i].dtype);
    return om_rnn_grad_check(ctx, c);
}

static om_status *rnn_grad_infer(om_kernel_ctx *ctx, int cell) {
    rnn_cfg c;
    OM_TRY(rnn_grad_check(ctx, cell, &c));
    const om_dtype dt = ctx->in[0].dtype;
    for (int j = 0; j < ctx->n_out; j++) {
        if (j < 3) om_set_shape(&ctx->out[j], &ctx->in[j], dt);
        else if (j == 3) set_dims(&ctx->out[j], dt, 2, c.D, 2 * c.G * c.H, 0, 0);
        else set_dims(&ctx->out[j], dt, 3, c.D, c.B, c.H, 0);
    }
    return NULL;
}

static om_status *lstm_grad_infer(om_kernel_ctx *ctx) { return rnn_grad_infer(ctx, CELL_LSTM); }
static om_status *gru_grad_infer(om_kernel_ctx *ctx) { return rnn_grad_infer(ctx, CELL_GRU); }
static om_status *elman_grad_infer(om_kernel_ctx *ctx) { return rnn_grad_infer(ctx, CELL_RNN); }

#define BWD_H(t) (Y + ((t) * D + d) * B * H)
/* step t of sequence b was skipped by the forward (past its length) */
#define PAD(b) (L && t >= L[b])

/* After dh_next = dG R: a skipped step passes its dh straight to the step before. */
#define PASS_THROUGH()                                                                        \
    for (int64_t b = 0; L && b < B; b++)                                                      \
        if (PAD(b)) memcpy(dhn + b * H, dh + b * H, (size_t)H * sizeof(T))

static om_status *rnn_grad_cpu(om_kernel_ctx *ctx, int cell) {
    const om_node *n = ctx->node;
    rnn_cfg c;
    OM_TRY(rnn_grad_check(ctx, cell, &c));
    const int64_t nT = c.T, B = c.B, In = c.In, H = c.H, D = c.D, GH = c.G * c.H;
    const int f32 = ctx->in[0].dtype == OM_F32;
    int64_t *L = NULL;
    RNN_FLOAT(ctx->in[0].dtype, n, {
        OM_TRY(read_lens(ctx, 11, B, &L));
        for (int64_t b = 0; L && b < B; b++)
            if (L[b] < 0 || L[b] > nT) {
                free(L);
                return om_error(OM_INVALID_ARGUMENT, "%s node '%s': sequence_lens[%lld] = %lld is outside [0, %lld]",
                                n->op->name, om_node_name(n), (long long)b, (long long)L[b], (long long)nT);
            }
        const T *X = ctx->in[0].data, *W = ctx->in[1].data, *R = ctx->in[2].data;
        const T *h0 = om_in_present(ctx, 3) ? ctx->in[3].data : NULL;
        const T *c0 = cell == CELL_LSTM && om_in_present(ctx, 4) ? ctx->in[4].data : NULL;
        const T *Y = ctx->in[5].data;
        const T *Sg = cell == CELL_RNN ? NULL : ctx->in[6].data, *Ss = cell == CELL_RNN ? NULL : ctx->in[7].data;
        const T *dY = om_in_present(ctx, 8) ? ctx->in[8].data : NULL;
        const T *dYh = om_in_present(ctx, 9) ? ctx->in[9].data : NULL;
        const T *dYc = cell == CELL_LSTM && om_in_present(ctx, 10) ? ctx->in[10].data : NULL;
        T *dX = out_data(ctx, 0), *dW = out_data(ctx, 1), *dR = out_data(ctx, 2), *dB = out_data(ctx, 3);
        T *dh0 = out_data(ctx, 4), *dc0 = cell == CELL_LSTM ? out_data(ctx, 5) : NULL;
        /* scratch: dG (T,B,GH) input-side pre-activation grads; dGR (T,B,GH) recurrent-side (GRU);
         * dh_next, dc_next, dh, zeros (B,H) each; GRU without linear_before_reset: d(r*hprev) (B,H);
         * with sequence_lens, the per-sequence previous state (B,H) */
        const int64_t need = 2 * nT * B * GH + 6 * B * H;
        T *scratch = calloc((size_t)(need > 0 ? need : 1), sizeof(T));
        if (!scratch) free(L);
        if (!scratch) return om_error(OM_OUT_OF_MEMORY, "%s node '%s': out of memory", n->op->name, om_node_name(n));
        T *dG = scratch, *dGR = cell == CELL_GRU ? scratch + nT * B * GH : dG;
        T *dhn = scratch + 2 * nT * B * GH, *dcn = dhn + B * H, *dh = dcn + B * H, *zeros = dh + B * H;
        T *drh = zeros + B * H, *hpl = drh + B * H;
        if (dR) memset(dR, 0, (size_t)(D * GH * H) * sizeof(T));
        for (int64_t d = 0; d < D; d++) {
            const int rev = d == 1 || c.reverse0;
            const T *Wd = W + d * GH * In, *Rd = R + d * GH * H;
            const T *gates = Sg ? Sg + d * nT * B * GH : NULL, *states = Ss ? Ss + d * nT * B * H : NULL;
            T *dRd = dR ? dR + d * GH * H : NULL;
            for (int64_t k = 0; k < B * H; k++) {
                dhn[k] = dYh ? dYh[d * B * H + k] : 0;
                dcn[k] = dYc ? dYc[d * B * H + k] : 0;
            }
            for (int64_t s = nT - 1; s >= 0; s--) {
                const int64_t t = rev ? nT - 1 - s : s;
                const int64_t tp = rev ? t + 1 : t - 1;   /* the step before, in processing order */
                const T *hprev = s > 0 ? BWD_H(tp) : h0 ? h0 + d * B * H : zeros;
                if (L) {
                    /* the state before step t: Y[tp] while tp is inside the sequence, else the initial
                     * state (the reverse direction's first steps are past the end; Y is 0 there) */
                    for (int64_t b = 0; b < B; b++) {
                        const T *src = s > 0 && tp < L[b] ? BWD_H(tp) : h0 ? h0 + d * B * H : zeros;
                        memcpy(hpl + b * H, src + b * H, (size_t)H * sizeof(T));
                    }
                    hprev = hpl;
                }
                const T *g = gates ? gates + t * B * GH : NULL;
                T *dg = dG + t * B * GH, *dgr = dGR + t * B * GH;
                const T *dyt = dY ? dY + (t * D + d) * B * H : NULL;
                for (int64_t k = 0; k < B * H; k++) dh[k] = dhn[k] + (dyt && !PAD(k / H) ? dyt[k] : 0);
                if (cell == CELL_LSTM) {
                    const T *cs = states + t * B * H;
                    const T *cprev = s > 0 ? states + tp * B * H : c0 ? c0 + d * B * H : zeros;
                    for (int64_t b = 0; b < B; b++) {
                        if (PAD(b)) {   /* a skipped step: no gate gradient; dc passes through */
                            memset(dg + b * GH, 0, (size_t)GH * sizeof(T));
                            continue;
                        }
                        const T *restrict gi = g + b * GH, *restrict go = gi + H, *restrict gf = gi + 2 * H,
                                *restrict gc = gi + 3 * H;
                        const T *restrict cb = cs + b * H, *restrict cp = cprev + b * H, *restrict dhb = dh + b * H;
                        T *restrict di = dg + b * GH, *restrict dov = di + H, *restrict df = di + 2 * H,
                          *restrict dcc = di + 3 * H;
                        T *restrict dcb = dcn + b * H;
                        for (int64_t j = 0; j < H; j++) {
                            const T tc = (T)tanh((double)cb[j]);
                            const T dc = dcb[j] + dhb[j] * go[j] * (1 - tc * tc);
                            dov[j] = dhb[j] * tc * go[j] * (1 - go[j]);
                            di[j] = dc * gc[j] * gi[j] * (1 - gi[j]);
                            df[j] = dc * cp[j] * gf[j] * (1 - gf[j]);
                            dcc[j] = dc * gi[j] * (1 - gc[j] * gc[j]);
                            dcb[j] = dc * gf[j];
                        }
                    }
                    // dh_next (B, H) = dg (B, 4H) @ Rd (4H, H)
                    gemm(f32, 0, 0, B, H, GH, 1.0, dg, GH, Rd, H, 0.0, dhn, H);
                    PASS_THROUGH();
                } else if (cell == CELL_RNN) {
                    // dg = dh f'(pre), from h_t = f(pre): tanh 1 - h^2; relu h > 0 (relu'(0) = 0, as torch)
                    const T *restrict ht = BWD_H(t);
                    if (c.relu[d])
                        for (int64_t k = 0; k < B * H; k++) dg[k] = ht[k] > 0 ? dh[k] : (T)0;
                    else
                        for (int64_t k = 0; k < B * H; k++) dg[k] = dh[k] * (1 - ht[k] * ht[k]);
                    for (int64_t k = 0; L && k < B * H; k++) if (PAD(k / H)) dg[k] = 0;
                    // dh_next (B, H) = dg (B, H) @ Rd (H, H)
                    gemm(f32, 0, 0, B, H, GH, 1.0, dg, GH, Rd, H, 0.0, dhn, H);
                    PASS_THROUGH();
                } else {
                    const T *hr = states + t * B * H;
                    for (int64_t b = 0; b < B; b++) {
                        const T *restrict gz = g + b * GH, *restrict gr = gz + H, *restrict gh = gz + 2 * H;
                        const T *restrict hrb = hr + b * H, *restrict hp = hprev + b * H, *restrict dhb = dh + b * H;
                        T *restrict dz = dg + b * GH, *restrict dr = dz + H, *restrict dah = dz + 2 * H;
                        T *restrict rz = dgr + b * GH, *restrict rr = rz + H, *restrict rh = rz + 2 * H;
                        T *restrict dn = dhn + b * H;
                        if (PAD(b)) {   /* a skipped step: no gate gradient; dh passes through */
                            for (int64_t j = 0; j < GH; j++) dz[j] = 0, rz[j] = 0;
                            for (int64_t j = 0; j < H; j++) dn[j] = dhb[j];
                            continue;
                        }
                        for (int64_t j = 0; j < H; j++) {
                            const T ah = dhb[j] * (1 - gz[j]) * (1 - gh[j] * gh[j]);   /* d pre-activation of h~ */
                            const T az = dhb[j] * (hp[j] - gh[j]) * gz[j] * (1 - gz[j]);
                            /* lbr: pre_h = xw + r * hr; else pre_h = xw + hr with hr = (r*hprev) Rh^T + Rbh */
                            const T ar = c.lbr ? ah * hrb[j] * gr[j] * (1 - gr[j]) : 0;
                            dz[j] = az, dr[j] = ar, dah[j] = ah;
                            rz[j] = az, rr[j] = ar, rh[j] = c.lbr ? ah * gr[j] : ah;
                            dn[j] = dhb[j] * gz[j];
                        }
                    }
                    if (c.lbr) {
                        // dh_next += dgr (B, 3H) @ Rd (3H, H)
                        gemm(f32, 0, 0, B, H, GH, 1.0, dgr, GH, Rd, H, 1.0, dhn, H);
                    } else {
                        // d(r*hprev) (B, H) = dah (B, H) @ Rh (H, H); then dr and dh_next through r*hprev
                        gemm(f32, 0, 0, B, H, H, 1.0, dgr + 2 * H, GH, Rd + 2 * H * H, H, 0.0, drh, H);
                        for (int64_t b = 0; b < B; b++)
                            for (int64_t j = 0; j < H; j++) {
                                const T r_ = g[b * GH + H + j];
                                const T ar = drh[b * H + j] * hprev[b * H + j] * r_ * (1 - r_);
                                dg[b * GH + H + j] = ar;
                                dgr[b * GH + H + j] = ar;
                                dhn[b * H + j] += drh[b * H + j] * r_;
                            }
                        // dh_next += (dz, dr) (B, 2H) @ Rd[0:2H] (2H, H)
                        gemm(f32, 0, 0, B, H, 2 * H, 1.0, dgr, GH, Rd, H, 1.0, dhn, H);
                    }
                }
                if (dRd && (s > 0 || h0)) {
                    if (cell == CELL_GRU && !c.lbr) {
                        // dR[0:2H] += (dz, dr)^T @ hprev; dRh += dah^T @ (r * hprev)
                        gemm(f32, 1, 0, 2 * H, H, B, 1.0, dgr, GH, hprev, H, 1.0, dRd, H);
                        for (int64_t b = 0; b < B; b++)
                            for (int64_t j = 0; j < H; j++) drh[b * H + j] = g[b * GH + H + j] * hprev[b * H + j];
                        gemm(f32, 1, 0, H, H, B, 1.0, dgr + 2 * H, GH, drh, H, 1.0, dRd + 2 * H * H, H);
                    } else {
                        // dRd (GH, H) += dgr^T (GH, B) @ hprev (B, H)
                        gemm(f32, 1, 0, GH, H, B, 1.0, dgr, GH, hprev, H, 1.0, dRd, H);
                    }
                }
            }
            if (dh0) memcpy(dh0 + d * B * H, dhn, (size_t)(B * H) * sizeof(T));
            if (dc0) memcpy(dc0 + d * B * H, dcn, (size_t)(B * H) * sizeof(T));
            // dX (T*B, I) (+)= dG (T*B, GH) @ Wd (GH, I)
            if (dX) gemm(f32, 0, 0, nT * B, In, GH, 1.0, dG, GH, Wd, In, d ? 1.0 : 0.0, dX, In);
            // dW[d] (GH, I) = dG^T (GH, T*B) @ X (T*B, I)
            if (dW) gemm(f32, 1, 0, GH, In, nT * B, 1.0, dG, GH, X, In, 0.0, dW + d * GH * In, In);
            if (dB) {
                T *restrict bw = dB + d * 2 * GH, *restrict br = bw + GH;
                for (int64_t j = 0; j < 2 * GH; j++) bw[j] = 0;
                for (int64_t row = 0; row < nT * B; row++) {
                    const T *restrict a = dG + row * GH, *restrict ar = dGR + row * GH;
                    for (int64_t j = 0; j < GH; j++) bw[j] += a[j];
                    for (int64_t j = 0; j < GH; j++) br[j] += ar[j];
                }
            }
        }
        free(scratch);
    });
    free(L);
    return NULL;
}

static om_status *lstm_grad_cpu(om_kernel_ctx *ctx) { return rnn_grad_cpu(ctx, CELL_LSTM); }
static om_status *gru_grad_cpu(om_kernel_ctx *ctx) { return rnn_grad_cpu(ctx, CELL_GRU); }
static om_status *elman_grad_cpu(om_kernel_ctx *ctx) { return rnn_grad_cpu(ctx, CELL_RNN); }

/* ---- definitions ----------------------------------------------------------------------- */

/* max_out 5 / 4: the ONNX outputs plus the saved state the gradient rule adds (RNN: none, Y is enough) */
const om_op_def om_op_lstm = {
    .name = "LSTM", .domain = "", .min_in = 3, .max_in = 8, .min_out = 0, .max_out = 5,
    .infer = lstm_infer, .grad = lstm_grad, .cpu = lstm_cpu, .diff_inputs = 0x6F,
    .attrs = "direction:string=forward|reverse|bidirectional hidden_size:int input_forget:int=0 layout:int=0",
};
const om_op_def om_op_gru = {
    .name = "GRU", .domain = "", .min_in = 3, .max_in = 6, .min_out = 0, .max_out = 4,
    .infer = gru_infer, .grad = gru_grad, .cpu = gru_cpu, .diff_inputs = 0x2F,
    .attrs = "direction:string=forward|reverse|bidirectional hidden_size:int layout:int=0 linear_before_reset:int",
};
const om_op_def om_op_rnn = {
    .name = "RNN", .domain = "", .min_in = 3, .max_in = 6, .min_out = 0, .max_out = 2,
    .infer = elman_infer, .grad = elman_grad, .cpu = elman_cpu, .diff_inputs = 0x2F,
    .attrs = "activations:strings=Tanh|Relu direction:string=forward|reverse|bidirectional hidden_size:int "
             "layout:int=0",
};
const om_op_def om_op_lstm_grad = {
    .name = "LSTMGrad", .domain = "ortmod", .min_in = 8, .max_in = 12, .min_out = 1, .max_out = 6,
    .infer = lstm_grad_infer, .cpu = lstm_grad_cpu,
    .attrs = "direction:string=forward|reverse|bidirectional hidden_size:int",
};
const om_op_def om_op_gru_grad = {
    .name = "GRUGrad", .domain = "ortmod", .min_in = 8, .max_in = 12, .min_out = 1, .max_out = 5,
    .infer = gru_grad_infer, .cpu = gru_grad_cpu,
    .attrs = "direction:string=forward|reverse|bidirectional hidden_size:int linear_before_reset:int",
};
const om_op_def om_op_rnn_grad = {
    .name = "RNNGrad", .domain = "ortmod", .min_in = 6, .max_in = 12, .min_out = 1, .max_out = 5,
    .infer = elman_grad_infer, .cpu = elman_grad_cpu,
    .attrs = "activations:strings=Tanh|Relu direction:string=forward|reverse|bidirectional hidden_size:int",
};
