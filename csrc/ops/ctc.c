/* ctc.c — connectionist temporal classification loss (Graves et al. 2006), as eager PyTorch's
 * CPU kernels compute it (aten/src/ATen/native/LossCTC.cpp): the same recursions, in the same
 * order, in the input's dtype (float32 arithmetic for float32, as eager's scalar_t), so the
 * per-sample losses and gradients are eager's to the last bit where libm agrees.
 *
 * Exports:
 *   om_op_ctc_loss       CTCLoss      (ortmod) (log_probs, targets, input_lengths, target_lengths,
 *                                       targets_mask?; blank, zero_infinity) -> loss, log_alpha?
 *   om_op_ctc_loss_grad  CTCLossGrad  (ortmod) (dloss, log_probs, targets, input_lengths,
 *                                       target_lengths, log_alpha, targets_mask?; blank, zero_infinity)
 *                                       -> dlog_probs
 *
 * Shapes: log_probs (T, N, C) float32/float64, or (T, C) for one unbatched sample (N = 1, loss
 * of rank 0); targets (N, S) padded or (sum of target_lengths,) concatenated, int32/int64;
 * input_lengths, target_lengths N integers (rank 0 or 1); loss (N,): each sample's negative log
 * likelihood, no reduction (ortmod/_export_ctc.py divides and reduces in the graph, as eager's
 * ctc_loss does around _ctc_loss). log_alpha (N, T, 2 S' + 1), S' = S for padded targets and
 * the targets' length for concatenated ones (a bound of every sample's target length: the plan
 * needs the shape before the lengths are read); entries past a sample's input and target
 * lengths are -inf and never read.
 *
 * targets_mask (bool, targets' shape): the concatenated targets are targets[targets_mask] in
 * row-major order — torch.masked_select's result, which the export passes this way instead of
 * through NonZero (its length is data: the engine plans static shapes). S' is then the
 * targets' element count.
 *
 * zero_infinity: a sample whose loss is +inf (no alignment fits its input length) has loss 0
 * and gradient 0 (eager: where(loss == inf, 0, loss) after _ctc_loss, whose backward zeroes
 * that sample). Without it eager's loss is inf and its gradient NaN for t < input_length (the
 * formula below takes exp(-inf + inf)), 0 after: CTCLossGrad gives the same.
 *
 * Refused, naming the node (eager's checks, at plan time when the lengths are constants): blank
 * outside [0, C); a length below 0; an input length above T; a target length above S (padded);
 * concatenated targets whose length is not the sum of target_lengths; and, which eager does not
 * check (its kernel reads out of bounds), a target label outside [0, C). A label equal to blank
 * is computed as eager computes it. float16/bfloat16: eager has no CTC kernel for them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/threadpool.h"
#include "ops/op.h"
#include "ops/op_util.h"

/* The geometry of a CTCLoss/CTCLossGrad node from its log_probs, targets and lengths. */
typedef struct ctc_geom {
    int64_t T, N, C, S;   /* S: padded target width, or the concatenated targets' length */
    int64_t L;            /* 2 S + 1: states of the extended target l' */
    int batched, concat;
    int64_t blank;
    int64_t M;            /* concatenated targets: how many there are (S, or the mask's count) */
} ctc_geom;

static om_status *ctc_geometry(const om_node *n, const om_tensor *lp, const om_tensor *tg, const om_tensor *il,
                               const om_tensor *tl, const om_tensor *mask, int in0, int mask_in, ctc_geom *g) {
    char b1[160], b2[160];
    if (!om_dtype_in(lp->dtype, OM_DT_BIT(OM_F32) | OM_DT_BIT(OM_F64))) {
        if (om_dtype_is_half(lp->dtype))
            return om_error(OM_UNSUPPORTED_OP, "%s node '%s': log_probs of dtype %s: eager PyTorch's ctc_loss has "
                            "no %s kernel (cast the log-probabilities to float32)", n->op->name, om_node_name(n),
                            om_dtype_name(lp->dtype), om_dtype_name(lp->dtype));
        return om_err_dtype(n, in0, lp->dtype);
    }
    OM_TRY(om_check_dtype(n, tg, in0 + 1, OM_DT_INDEX));
    OM_TRY(om_check_dtype(n, il, in0 + 2, OM_DT_INDEX));
    OM_TRY(om_check_dtype(n, tl, in0 + 3, OM_DT_INDEX));
    if (lp->rank != 3 && lp->rank != 2) {
        om_shape_str(lp, b1, sizeof b1);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': log_probs must be (T, N, C) or (T, C), got %s",
                        n->op->name, om_node_name(n), b1);
    }
    g->batched = lp->rank == 3;
    g->T = lp->dims[0];
    g->N = g->batched ? lp->dims[1] : 1;
    g->C = lp->dims[lp->rank - 1];
    if (mask) {
        OM_TRY(om_check_dtype(n, mask, mask_in, OM_DT_BIT(OM_BOOL)));
        int same = mask->rank == tg->rank;
        for (int i = 0; same && i < tg->rank; i++) same = mask->dims[i] == tg->dims[i];
        if (!same) {
            om_shape_str(tg, b1, sizeof b1);
            om_shape_str(mask, b2, sizeof b2);
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': targets %s and targets_mask %s must have one shape",
                            n->op->name, om_node_name(n), b1, b2);
        }
        g->concat = 1;
        g->S = om_tensor_numel(tg);
    } else if (tg->rank == 1) {
        g->concat = 1;
        g->S = tg->dims[0];
    } else if (tg->rank == 2 && tg->dims[0] == g->N) {
        g->concat = 0;
        g->S = tg->dims[1];
    } else {
        om_shape_str(lp, b1, sizeof b1);
        om_shape_str(tg, b2, sizeof b2);
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': targets must be (N, S) padded or 1-D concatenated for "
                        "log_probs %s, got %s", n->op->name, om_node_name(n), b1, b2);
    }
    g->L = 2 * g->S + 1;
    g->M = g->S;
    if (il->rank > 1 || tl->rank > 1 || om_tensor_numel(il) != g->N || om_tensor_numel(tl) != g->N)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input_lengths and target_lengths must have batch size "
                        "%lld elements, got %lld and %lld", n->op->name, om_node_name(n), (long long)g->N,
                        (long long)om_tensor_numel(il), (long long)om_tensor_numel(tl));
    g->blank = om_attr_int(n, "blank", 0);
    if (g->blank < 0 || g->blank >= g->C)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': blank = %lld must be in label range [0, %lld) (eager: "
                        "blank must be in label range)", n->op->name, om_node_name(n), (long long)g->blank,
                            (long long)g->C);
    return NULL;
}

/* eager's argument checks on the lengths (ctc_loss_allocate_outputs), then the labels, which
 * eager does not check: each sample's offset into the targets goes to off[] when off != NULL. */
static om_status *ctc_check_lengths(const om_node *n, const ctc_geom *g, const om_tensor *il, const om_tensor *tl,
                                    int64_t *off) {
    int64_t pos = 0;
    for (int64_t b = 0; b < g->N; b++) {
        const int64_t ib = om_index_at(il, b), tb = om_index_at(tl, b);
        if (ib < 0 || ib > g->T)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': input_lengths[%lld] = %lld is outside [0, %lld], the "
                            "input's length (eager: Expected input_lengths to have value at %s %lld)", n->op->name,
                            om_node_name(n), (long long)b, (long long)ib, (long long)g->T, ib < 0 ? "least" : "most",
                            (long long)(ib < 0 ? 0 : g->T));
        if (tb < 0)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': target_lengths[%lld] = %lld is negative (eager: "
                            "Expected target_lengths to have value at least 0)", n->op->name, om_node_name(n),
                                (long long)b,
                            (long long)tb);
        if (!g->concat && tb > g->S)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': target_lengths[%lld] = %lld is larger than the padded "
                            "targets' width %lld (eager: Expected tensor to have size at least %lld at dimension 1)",
                            n->op->name, om_node_name(n), (long long)b, (long long)tb, (long long)g->S, (long long)tb);
        if (g->concat && tb > g->M - pos)
            return om_error(OM_INVALID_ARGUMENT, "%s node '%s': the target lengths add up to more than the %lld "
                            "concatenated targets", n->op->name, om_node_name(n), (long long)g->M);
        if (off) off[b] = g->concat ? pos : b * g->S;
        pos += tb;
    }
    if (g->concat && pos != g->M)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': %lld concatenated targets, but the target lengths add up "
                        "to %lld (eager: Expected tensor to have size %lld at dimension 0)", n->op->name,
                            om_node_name(n),
                        (long long)g->M, (long long)pos, (long long)pos);
    return NULL;
}

static om_status *ctc_check_labels(const om_node *n, const ctc_geom *g, const om_tensor *tg, const om_tensor *tl,
                                   const int64_t *off) {
    for (int64_t b = 0; b < g->N; b++)
        for (int64_t i = 0, tb = om_index_at(tl, b); i < tb; i++) {
            const int64_t l = om_index_at(tg, off[b] + i);
            if (l < 0 || l >= g->C)
                return om_error(OM_INVALID_ARGUMENT, "%s node '%s': target %lld of sample %lld is %lld, outside the "
                                "label range [0, %lld)", n->op->name, om_node_name(n), (long long)i, (long long)b,
                                    (long long)l,
                                (long long)g->C);
        }
    return NULL;
}

static const om_tensor *opt_in(const om_kernel_ctx *ctx, int i) {
    return ctx->n_in > i && ctx->in[i].dtype != OM_UNDEFINED ? &ctx->in[i] : NULL;
}

static int64_t mask_count(const om_tensor *mask) {
    const uint8_t *m = mask->data;
    int64_t k = 0;
    for (int64_t i = 0, n = om_tensor_numel(mask); i < n; i++) k += m[i] != 0;
    return k;
}

/* ---- CTCLoss ------------------------------------------------------------------------ */

static om_status *ctc_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    ctc_geom g = {0};
    const om_tensor *mask = opt_in(ctx, 4);
    OM_TRY(ctc_geometry(n, &ctx->in[0], &ctx->in[1], &ctx->in[2], &ctx->in[3], mask, 0, 4, &g));
    /* lengths known at plan time (python lists in the trace): refused before the first step */
    if (ctx->in[2].data && ctx->in[3].data && (!mask || mask->data)) {
        if (mask) g.M = mask_count(mask);
        OM_TRY(ctc_check_lengths(n, &g, &ctx->in[2], &ctx->in[3], NULL));
    }
    om_tensor *loss = &ctx->out[0];
    loss->dtype = ctx->in[0].dtype;
    loss->rank = g.batched ? 1 : 0;
    loss->dims[0] = g.N;
    if (ctx->n_out > 1) {
        om_tensor *la = &ctx->out[1];
        la->dtype = ctx->in[0].dtype;
        la->rank = 3;
        la->dims[0] = g.N;
        la->dims[1] = g.T;
        la->dims[2] = g.L;
    }
    return NULL;
}

/* What both kernels read: the tensors, geometry and each sample's target offset. */
typedef struct ctc_job {
    ctc_geom g;
    const om_tensor *tg, *il, *tl;
    const int64_t *off;
    int zero_inf;
    const void *lp, *dl;
    void *loss, *la, *dlp;
    void *beta;           /* CTCLossGrad: two rows of L per sample */
    om_tensor flat;       /* targets[targets_mask], when there is a mask */
} ctc_job;

/* The label of state s of sample b's extended target l' = blank l_0 blank l_1 ... blank. */
static inline int64_t ctc_prime(const ctc_job *j, int64_t b, int64_t s) {
    return s % 2 == 0 ? j->g.blank : om_index_at(j->tg, j->off[b] + s / 2);
}

/* One sample's forward and its negative log likelihood from log_alpha, in eager's order
 * (eq (6)-(8)); and the backward's beta recursion with the alpha*beta collection (eq (10),
 * (11), (16)), then eager's gradient formula. T is float or double, with libm's expf/logf or
 * exp/log as eager's std::exp/std::log. */
#define CTC_KERNELS(SFX, TT, EXP, LOG)                                                                      \
    static TT ctc_nll_##SFX(const ctc_job *j, int64_t b, int64_t il, int64_t tl) {                          \
        typedef TT T;                                                                                       \
        const T neginf = -INFINITY;                                                                         \
        if (il == 0) {                                                                                      \
            T ll = tl == 0 ? (T)0 : neginf;                                                                 \
            return -ll;                                                                                     \
        }                                                                                                   \
        const T *la = (const T *)j->la + (b * j->g.T + il - 1) * j->g.L;                                    \
        if (tl == 0) return -la[0];                                                                         \
        T l1 = la[tl * 2], l2 = la[tl * 2 - 1];                                                             \
        T m = l1 > l2 ? l1 : l2;                                                                            \
        m = m == neginf ? 0 : m;                                                                            \
        return -(LOG(EXP(l1 - m) + EXP(l2 - m)) + m);                                                       \
    }                                                                                                       \
    static void ctc_fwd_##SFX(void *c_, int64_t lo, int64_t hi) {                                           \
        typedef TT T;                                                                                       \
        const ctc_job *j = c_;                                                                              \
        const int64_t N = j->g.N, C = j->g.C, L = j->g.L, Tn = j->g.T, blank = j->g.blank;                  \
        const T neginf = -INFINITY;                                                                         \
        for (int64_t b = lo; b < hi; b++) {                                                                 \
            const int64_t il = om_index_at(j->il, b), tl = om_index_at(j->tl, b);                                     \
            const T *lp = (const T *)j->lp + b * C;   /* lp[t * N * C + c] */                               \
            T *la = (T *)j->la + b * Tn * L;                                                                \
            for (int64_t k = 0; k < Tn * L; k++) la[k] = neginf;                                            \
            if (il > 0) {                                                                                   \
                la[0] = lp[blank];                                                                          \
                if (tl > 0) la[1] = lp[ctc_prime(j, b, 1)];                                                 \
                for (int64_t t = 1; t < il; t++) {                                                          \
                    const T *prev = la + (t - 1) * L, *lpt = lp + t * N * C;                                \
                    T *cur = la + t * L;                                                                    \
                    for (int64_t s = 0; s < 2 * tl + 1; s++) {                                              \
                        const int64_t cp = ctc_prime(j, b, s);                                              \
                        T la1 = prev[s], lamax = la1, la2, la3;                                             \
                        if (s > 0) {                                                                        \
                            la2 = prev[s - 1];                                                              \
                            if (la2 > lamax) lamax = la2;                                                   \
                        } else {                                                                            \
                            la2 = neginf;                                                                   \
                        }                                                                                   \
                        if (s > 1 && ctc_prime(j, b, s - 2) != cp) {                                        \
                            la3 = prev[s - 2];                                                              \
                            if (la3 > lamax) lamax = la3;                                                   \
                        } else {                                                                            \
                            la3 = neginf;                                                                   \
                        }                                                                                   \
                        if (lamax == neginf) lamax = 0;                                                     \
                        cur[s] = LOG(EXP(la1 - lamax) + EXP(la2 - lamax) + EXP(la3 - lamax)) + lamax + lpt[cp];\
                    }                                                                                       \
                }                                                                                           \
            }                                                                                               \
            T nll = ctc_nll_##SFX(j, b, il, tl);                                                            \
            if (j->zero_inf && nll == (T)INFINITY) nll = 0;                                                 \
            ((T *)j->loss)[b] = nll;                                                                        \
        }                                                                                                   \
    }                                                                                                       \
    static void ctc_bwd_##SFX(void *c_, int64_t lo, int64_t hi) {                                           \
        typedef TT T;                                                                                       \
        const ctc_job *j = c_;                                                                              \
        const int64_t N = j->g.N, C = j->g.C, L = j->g.L, Tn = j->g.T, blank = j->g.blank;                  \
        const T neginf = -INFINITY;                                                                         \
        for (int64_t b = lo; b < hi; b++) {                                                                 \
            const int64_t il = om_index_at(j->il, b), tl = om_index_at(j->tl, b);                                     \
            const T nll = ctc_nll_##SFX(j, b, il, tl);                                                      \
            const T *lp = (const T *)j->lp + b * C;                                                         \
            const T *la = (const T *)j->la + b * Tn * L;                                                    \
            T *gr = (T *)j->dlp + b * C;   /* gr[t * N * C + c]: log of the alpha*beta sums, then dlp */    \
            if (j->zero_inf && nll == (T)INFINITY) {                                                        \
                for (int64_t t = 0; t < Tn; t++)                                                            \
                    for (int64_t c = 0; c < C; c++) gr[t * N * C + c] = 0;                                  \
                continue;                                                                                   \
            }                                                                                               \
            for (int64_t t = 0; t < il; t++)                                                                \
                for (int64_t c = 0; c < C; c++) gr[t * N * C + c] = neginf;                                 \
            /* beta rows t+1 and t alternate in two rows of L */                                            \
            T *rows = (T *)j->beta + b * 2 * L;                                                             \
            if (il > 0) {                                                                                   \
                const int64_t tt = il - 1;                                                                  \
                T *lb = rows + (tt % 2) * L;                                                                \
                for (int64_t s = 0; s < L; s++) lb[s] = neginf;                                             \
                lb[2 * tl] = lp[tt * N * C + blank];                                                        \
                gr[tt * N * C + blank] = la[tt * L + 2 * tl] + lb[2 * tl];                                  \
                if (tl > 0) {                                                                               \
                    const int64_t cp = ctc_prime(j, b, 2 * tl - 1);                                         \
                    lb[2 * tl - 1] = lp[tt * N * C + cp];                                                   \
                    gr[tt * N * C + cp] = la[tt * L + 2 * tl - 1] + lb[2 * tl - 1];                         \
                }                                                                                           \
            }                                                                                               \
            for (int64_t t = il - 2; t >= 0; t--) {                                                         \
                const T *next = rows + ((t + 1) % 2) * L;                                                   \
                T *lb = rows + (t % 2) * L;                                                                 \
                for (int64_t s = 2 * tl; s >= 0; s--) {                                                     \
                    T lb1 = next[s], lbmax = lb1, lb2, lb3;                                                 \
                    const int64_t cp = ctc_prime(j, b, s);                                                  \
                    if (s < 2 * tl) {                                                                       \
                        lb2 = next[s + 1];                                                                  \
                        if (lb2 > lbmax) lbmax = lb2;                                                       \
                    } else {                                                                                \
                        lb2 = neginf;                                                                       \
                    }                                                                                       \
                    if (s < 2 * tl - 1 && ctc_prime(j, b, s + 2) != cp) {                                   \
                        lb3 = next[s + 2];                                                                  \
                        if (lb3 > lbmax) lbmax = lb3;                                                       \
                    } else {                                                                                \
                        lb3 = neginf;                                                                       \
                    }                                                                                       \
                    if (lbmax == neginf) lbmax = 0;                                                         \
                    lb[s] = LOG(EXP(lb1 - lbmax) + EXP(lb2 - lbmax) + EXP(lb3 - lbmax)) + lbmax +           \
                            lp[t * N * C + cp];                                                             \
                    const T lab = la[t * L + s] + lb[s];                                                    \
                    T *lcab = &gr[t * N * C + cp];                                                          \
                    if (*lcab == neginf) {                                                                  \
                        *lcab = lab;                                                                        \
                    } else {                                                                                \
                        const T mx = *lcab > lab ? *lcab : lab;                                             \
                        *lcab = LOG(EXP(*lcab - mx) + EXP(lab - mx)) + mx;                                  \
                    }                                                                                       \
                }                                                                                           \
            }                                                                                               \
            const T g = ((const T *)j->dl)[b];                                                              \
            for (int64_t t = 0; t < il; t++)                                                                \
                for (int64_t c = 0; c < C; c++) {                                                           \
                    T *res = &gr[t * N * C + c];                                                            \
                    const T l = lp[t * N * C + c];                                                          \
                    *res = (EXP(l) - EXP(*res + nll - l)) * g;                                              \
                }                                                                                           \
            for (int64_t t = il; t < Tn; t++)                                                               \
                for (int64_t c = 0; c < C; c++) gr[t * N * C + c] = 0;                                      \
        }                                                                                                   \
    }
CTC_KERNELS(f32, float, expf, logf)
CTC_KERNELS(f64, double, exp, log)

/* Validates the data and fills the job common to both kernels. *off (N offsets, then the
 * compacted targets when there is a mask) is the caller's to free. */
static om_status *ctc_job_init(const om_kernel_ctx *ctx, int in0, int mask_in, ctc_job *j, int64_t **off) {
    const om_node *n = ctx->node;
    const om_tensor *lp = &ctx->in[in0], *tg = &ctx->in[in0 + 1], *il = &ctx->in[in0 + 2], *tl = &ctx->in[in0 + 3];
    const om_tensor *mask = opt_in(ctx, mask_in);
    memset(j, 0, sizeof *j);
    OM_TRY(ctc_geometry(n, lp, tg, il, tl, mask, in0, mask_in, &j->g));
    const int64_t N = j->g.N > 0 ? j->g.N : 1, flat_n = mask ? om_tensor_numel(tg) : 0;
    *off = malloc((size_t)(N + flat_n) * sizeof(int64_t));
    if (!*off) return om_error(OM_OUT_OF_MEMORY, "%s node '%s': out of memory", n->op->name, om_node_name(n));
    if (mask) {   /* targets[mask], row-major: masked_select's order */
        int64_t *flat = *off + N, k = 0;
        const uint8_t *m = mask->data;
        for (int64_t i = 0; i < flat_n; i++)
            if (m[i]) flat[k++] = om_index_at(tg, i);
        j->g.M = k;
        j->flat = (om_tensor){.dtype = OM_I64, .rank = 1, .dims = {k}, .data = flat};
        tg = &j->flat;
    }
    om_status *st = ctc_check_lengths(n, &j->g, il, tl, *off);
    if (!st) st = ctc_check_labels(n, &j->g, tg, tl, *off);
    if (st) {
        free(*off);
        *off = NULL;
        return st;
    }
    j->tg = tg;
    j->il = il;
    j->tl = tl;
    j->off = *off;
    j->lp = lp->data;
    j->zero_inf = om_attr_int(n, "zero_infinity", 0) != 0;
    return NULL;
}

/* one sample's work is about T * (2 S + 1) recursion steps */
static int64_t ctc_grain(const ctc_geom *g) {
    const int64_t per = g->T * g->L;
    return per >= OM_GRAIN ? 1 : OM_GRAIN / (per ? per : 1);
}

// log_probs (T, N, C) or (T, C); targets (N, S) or (sum tl); lengths (N); loss (N) or (); log_alpha (N, T, 2S+1)
static om_status *ctc_cpu(om_kernel_ctx *ctx) {
    ctc_job j;
    int64_t *off = NULL;
    OM_TRY(ctc_job_init(ctx, 0, 4, &j, &off));
    void *la_scratch = NULL;
    j.loss = ctx->out[0].data;
    j.la = ctx->n_out > 1 && ctx->out[1].data ? ctx->out[1].data : NULL;
    if (!j.la) {
        la_scratch = j.la = malloc((size_t)(j.g.N * j.g.T * j.g.L) * om_dtype_size(ctx->in[0].dtype) + 1);
        if (!la_scratch) {
            free(off);
            return om_error(OM_OUT_OF_MEMORY, "%s node '%s': out of memory", ctx->node->op->name,
                            om_node_name(ctx->node));
        }
    }
    om_pool_for(j.g.N, ctc_grain(&j.g), ctx->in[0].dtype == OM_F32 ? ctc_fwd_f32 : ctc_fwd_f64, &j);
    free(la_scratch);
    free(off);
    return NULL;
}

static om_status *ctc_grad(om_grad_ctx *c) {
    const int node = c->node;
    if (!c->need_dx[0] || c->dy[0] < 0) return NULL;
    const om_node *n = &c->g->nodes[node];
    const om_dtype dt = c->g->values[n->in[0]].dtype;
    const int64_t blank = om_attr_int(n, "blank", 0), zero_inf = om_attr_int(n, "zero_infinity", 0);
    const int lp = n->in[0], tg = n->in[1], il = n->in[2], tl = n->in[3], dloss = c->dy[0];
    const int mask = n->n_in > 4 ? n->in[4] : -1;
    /* keep log_alpha for the backward (n may move: not used below) */
    const int la = om_node_ensure_output(c->g, node, 1, dt);
    if (la < 0) return om_grad_fail(c, om_error(OM_INTERNAL, "CTCLoss: cannot add the log_alpha output"));
    int in[7] = {dloss, lp, tg, il, tl, la, mask};
    int v = om_emit(c, om_op_ctc_loss_grad_id, in, mask >= 0 ? 7 : 6);
    if (v < 0) return NULL;
    om_emit_attr_int(c, "blank", blank);
    om_emit_attr_int(c, "zero_infinity", zero_inf);
    c->dx[0] = v;
    return NULL;
}

/* ---- CTCLossGrad -------------------------------------------------------------------- */

static om_status *ctc_grad_infer(om_kernel_ctx *ctx) {
    const om_node *n = ctx->node;
    ctc_geom g = {0};
    OM_TRY(ctc_geometry(n, &ctx->in[1], &ctx->in[2], &ctx->in[3], &ctx->in[4], opt_in(ctx, 6), 1, 6, &g));
    const om_tensor *dl = &ctx->in[0], *la = &ctx->in[5];
    if (dl->dtype != ctx->in[1].dtype) return om_err_dtype(n, 0, dl->dtype);
    if (la->dtype != ctx->in[1].dtype) return om_err_dtype(n, 5, la->dtype);
    if (om_tensor_numel(dl) != g.N || dl->rank != (g.batched ? 1 : 0))
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': dloss must hold the %lld per-sample losses' gradients, "
                        "got %lld", n->op->name, om_node_name(n), (long long)g.N, (long long)om_tensor_numel(dl));
    if (la->rank != 3 || la->dims[0] != g.N || la->dims[1] != g.T || la->dims[2] != g.L)
        return om_error(OM_INVALID_ARGUMENT, "%s node '%s': log_alpha must be (%lld, %lld, %lld)", n->op->name,
                        om_node_name(n),
                        (long long)g.N, (long long)g.T, (long long)g.L);
    om_set_shape(&ctx->out[0], &ctx->in[1], ctx->in[1].dtype);
    return NULL;
}

// dloss (N) or (); log_probs, dlog_probs (T, N, C) or (T, C); log_alpha (N, T, 2S+1)
static om_status *ctc_grad_cpu(om_kernel_ctx *ctx) {
    ctc_job j;
    int64_t *off = NULL;
    OM_TRY(ctc_job_init(ctx, 1, 6, &j, &off));
    j.dl = ctx->in[0].data;
    j.la = (void *)ctx->in[5].data;
    j.dlp = ctx->out[0].data;
    j.beta = malloc((size_t)(j.g.N * 2 * j.g.L) * om_dtype_size(ctx->in[1].dtype) + 1);
    if (!j.beta) {
        free(off);
        return om_error(OM_OUT_OF_MEMORY, "%s node '%s': out of memory", ctx->node->op->name, om_node_name(ctx->node));
    }
    om_pool_for(j.g.N, ctc_grain(&j.g), ctx->in[1].dtype == OM_F32 ? ctc_bwd_f32 : ctc_bwd_f64, &j);
    free(j.beta);
    free(off);
    return NULL;
}

/* ---- the defs ------------------------------------------------------------------------- */

const om_op_def om_op_ctc_loss = {
    .name = "CTCLoss", .domain = "ortmod", .min_in = 4, .max_in = 5, .min_out = 1, .max_out = 2,
    .infer = ctc_infer, .grad = ctc_grad, .cpu = ctc_cpu, .diff_inputs = 0x1,
    .attrs = "blank:int zero_infinity:int",
};

const om_op_def om_op_ctc_loss_grad = {
    .name = "CTCLossGrad", .domain = "ortmod", .min_in = 6, .max_in = 7, .min_out = 1, .max_out = 1,
    .infer = ctc_grad_infer, .grad = NULL, .cpu = ctc_grad_cpu, .diff_inputs = 0,
    .attrs = "blank:int zero_infinity:int",
};
