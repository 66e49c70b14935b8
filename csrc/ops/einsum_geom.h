/* einsum_geom.h — Einsum's equation against its operands, shared by the CPU (misc.c) and CUDA
 * (cuda/misc.cu) kernels: the same labels, sizes, checks and errors on both. Labels: letters a-z
 * A-Z are 0..51, the dims an ellipsis stands for get 52.., right-aligned across operands (numpy
 * broadcasting). Errors go through om_error / om_err_unsupported (cuda/misc.cu maps them onto
 * its host table). */
#ifndef OM_EINSUM_GEOM_H
#define OM_EINSUM_GEOM_H

#include <string.h>

#include "ops/op.h"

static inline const char *ein_node_name(const om_node *n) { return n && n->name ? n->name : ""; }

#define EIN_MAXL 64
#define EIN_MAXT 3

typedef struct ein_term {
    int n;                  /* rank */
    int lab[OM_MAX_RANK];
} ein_term;

typedef struct ein_eq {
    int nin;
    ein_term in[EIN_MAXT - 1], out;
    int64_t size[EIN_MAXL];
    int nell;               /* ellipsis rank (broadcast) */
} ein_eq;

static inline int ein_letter(char ch) {
    if (ch >= 'a' && ch <= 'z') return ch - 'a';
    if (ch >= 'A' && ch <= 'Z') return 26 + ch - 'A';
    return -1;
}

/* Parses one term of s[0:len]; ell_rank: the operand's rank minus its letters (-1: output). */
static inline int ein_term_parse(const char *s, int len, int *letters, int *has_ell, int *pos_ell) {
    int nl = 0;
    *has_ell = 0;
    *pos_ell = -1;
    for (int i = 0; i < len; i++) {
        if (s[i] == ' ') continue;
        if (s[i] == '.') {
            if (i + 2 >= len) return -1;
            if (*has_ell || s[i + 1] != '.' || s[i + 2] != '.') return -1;
            *has_ell = 1;
            *pos_ell = nl;
            i += 2;
            continue;
        }
        int l = ein_letter(s[i]);
        if (l < 0 || nl >= OM_MAX_RANK) return -1;
        letters[nl++] = l;
    }
    return nl;
}

/* Parses eq against operands xs (nin of them); fills sizes. */
static inline om_status *ein_parse(const om_node *n, const char *eq, int nin, const om_tensor *const *xs, ein_eq *e) {
    memset(e, 0, sizeof *e);
    if (nin < 1 || nin > 2) return om_err_unsupported(n, "Einsum with more than 2 operands");
    e->nin = nin;
    const char *arrow = strstr(eq, "->");
    const int lhs_len = arrow ? (int)(arrow - eq) : (int)strlen(eq);
    int count[EIN_MAXL] = {0};
    for (int i = 0; i < EIN_MAXL; i++) e->size[i] = -1;
    int start = 0, t = 0, ell_any = 0;
    int lets[EIN_MAXT][OM_MAX_RANK], nls[EIN_MAXT], has[EIN_MAXT], pos[EIN_MAXT];
    for (int i = 0; i <= lhs_len; i++) {
        if (i < lhs_len && eq[i] != ',') continue;
        if (t >= nin) return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': more terms than inputs in '%s'", ein_node_name(n), eq);
        nls[t] = ein_term_parse(eq + start, i - start, lets[t], &has[t], &pos[t]);
        if (nls[t] < 0) return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': cannot parse '%s'", ein_node_name(n), eq);
        const int er = xs[t]->rank - nls[t];
        if ((has[t] && er < 0) || (!has[t] && er != 0))
            return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': term %d of '%s' does not match rank %d", ein_node_name(n),
                            t, eq, xs[t]->rank);
        if (has[t] && er > e->nell) e->nell = er;
        ell_any |= has[t];
        t++;
        start = i + 1;
    }
    if (t != nin) return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': '%s' has %d terms for %d inputs", ein_node_name(n), eq, t, nin);
    if (52 + e->nell > EIN_MAXL) return om_err_unsupported(n, "Einsum ellipsis rank");
    for (t = 0; t < nin; t++) {
        ein_term *tm = &e->in[t];
        const int er = xs[t]->rank - nls[t];
        tm->n = 0;
        for (int k = 0; k <= nls[t]; k++) {
            if (has[t] && k == pos[t])
                for (int j = 0; j < er; j++) tm->lab[tm->n++] = 52 + (e->nell - er) + j;
            if (k < nls[t]) tm->lab[tm->n++] = lets[t][k];
        }
        for (int d = 0; d < tm->n; d++) {
            const int l = tm->lab[d];
            for (int d2 = 0; d2 < d; d2++)
                if (tm->lab[d2] == l) return om_err_unsupported(n, "Einsum with a repeated label in one operand (diagonal)");
            const int64_t s = xs[t]->dims[d];
            if (e->size[l] < 0 || e->size[l] == 1) e->size[l] = s;
            else if (s != 1 && s != e->size[l])
                return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': label size mismatch (%lld vs %lld) in '%s'",
                                ein_node_name(n), (long long)s, (long long)e->size[l], eq);
            if (l < 52) count[l]++;
        }
    }
    /* output */
    e->out.n = 0;
    if (arrow) {
        int ol[OM_MAX_RANK], oh, op;
        int no = ein_term_parse(arrow + 2, (int)strlen(arrow + 2), ol, &oh, &op);
        if (no < 0) return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': cannot parse the output of '%s'", ein_node_name(n), eq);
        for (int k = 0; k <= no; k++) {
            if (oh && k == op)
                for (int j = 0; j < e->nell; j++) e->out.lab[e->out.n++] = 52 + j;
            if (k < no) {
                if (e->size[ol[k]] < 0)
                    return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': output label not in any input", ein_node_name(n));
                for (int d2 = 0; d2 < e->out.n; d2++)
                    if (e->out.lab[d2] == ol[k]) return om_error(OM_INVALID_ARGUMENT, "Einsum node '%s': repeated output label", ein_node_name(n));
                e->out.lab[e->out.n++] = ol[k];
            }
        }
        if (!oh && e->nell > 0 && ell_any) {
            /* ellipsis dims dropped from the output are summed: fine, they are K labels */
        }
    } else {
        /* implicit output: the ellipsis, then letters used once, alphabetically */
        for (int j = 0; j < e->nell; j++) e->out.lab[e->out.n++] = 52 + j;
        for (int l = 0; l < 52; l++)
            if (count[l] == 1) e->out.lab[e->out.n++] = l;
    }
    if (e->out.n > OM_MAX_RANK) return om_err_unsupported(n, "Einsum output rank");
    return NULL;
}

static inline int ein_has(const ein_term *t, int l) {
    for (int d = 0; d < t->n; d++)
        if (t->lab[d] == l) return d;
    return -1;
}

/* Strides of operand t (with dims) for labels labs[0..nl): 0 where t lacks the label or holds it
 * with size 1. */
static inline void ein_strides(const ein_term *t, const int64_t *dims, const int *labs, int nl, int64_t *str) {
    int64_t s[OM_MAX_RANK], acc = 1;
    for (int d = t->n - 1; d >= 0; d--) {
        s[d] = dims[d] == 1 ? 0 : acc;
        acc *= dims[d];
    }
    for (int i = 0; i < nl; i++) {
        int d = ein_has(t, labs[i]);
        str[i] = d < 0 ? 0 : s[d];
    }
}

/* The equation as one batched GEMM: labels in A, B and the output are the batch (b); in A and the
 * output, rows (i); in B and the output, columns (j); every other label is summed (k) — one
 * operand's alone is read with stride 0 from the other. A is gathered as (b, i, k), B as
 * (b, k, j), the product is (b, i, j); the output reads it with strides so over dims dout. Batch,
 * row and column labels keep the output's order, so that the final gather is cheap. */
typedef struct ein_plan {
    int64_t NB, NI, NJ, NK;
    int na, nbb, nc;                                   /* labels of A's, B's and the product's gather */
    int la[EIN_MAXL], lb[EIN_MAXL], lc[EIN_MAXL];
    int64_t da[EIN_MAXL], db[EIN_MAXL], dc[EIN_MAXL];  /* their sizes */
    int64_t sa[EIN_MAXL], sb[EIN_MAXL];                /* the operands' strides for them */
    int64_t dout[OM_MAX_RANK], so[OM_MAX_RANK];        /* the output's dims, its strides in the product */
} ein_plan;

static inline void ein_plan_make(const ein_eq *e, const om_tensor *const *xs, ein_plan *p) {
    int used[EIN_MAXL] = {0};
    for (int t = 0; t < e->nin; t++)
        for (int d = 0; d < e->in[t].n; d++) used[e->in[t].lab[d]] = 1;
    int bl[EIN_MAXL], il[EIN_MAXL], jl[EIN_MAXL], kl[EIN_MAXL], nb = 0, ni = 0, nj = 0, nk = 0;
    const ein_term *A = &e->in[0], *B = e->nin > 1 ? &e->in[1] : NULL;
    for (int d = 0; d < e->out.n; d++) {
        const int l = e->out.lab[d];
        const int inA = ein_has(A, l) >= 0, inB = B && ein_has(B, l) >= 0;
        if (inA && inB) bl[nb++] = l;
        else if (inA) il[ni++] = l;
        else jl[nj++] = l;
    }
    for (int l = 0; l < EIN_MAXL; l++)
        if (used[l] && ein_has(&e->out, l) < 0) kl[nk++] = l;
    p->NB = p->NI = p->NJ = p->NK = 1;
    for (int i = 0; i < nb; i++) p->NB *= e->size[bl[i]];
    for (int i = 0; i < ni; i++) p->NI *= e->size[il[i]];
    for (int i = 0; i < nj; i++) p->NJ *= e->size[jl[i]];
    for (int i = 0; i < nk; i++) p->NK *= e->size[kl[i]];
    p->na = p->nbb = p->nc = 0;
    for (int i = 0; i < nb; i++) p->la[p->na++] = bl[i], p->lb[p->nbb++] = bl[i], p->lc[p->nc++] = bl[i];
    for (int i = 0; i < ni; i++) p->la[p->na++] = il[i], p->lc[p->nc++] = il[i];
    for (int i = 0; i < nk; i++) p->la[p->na++] = kl[i], p->lb[p->nbb++] = kl[i];
    for (int i = 0; i < nj; i++) p->lb[p->nbb++] = jl[i], p->lc[p->nc++] = jl[i];
    for (int i = 0; i < p->na; i++) p->da[i] = e->size[p->la[i]];
    for (int i = 0; i < p->nbb; i++) p->db[i] = e->size[p->lb[i]];
    for (int i = 0; i < p->nc; i++) p->dc[i] = e->size[p->lc[i]];
    ein_strides(A, xs[0]->dims, p->la, p->na, p->sa);
    if (B) ein_strides(B, xs[1]->dims, p->lb, p->nbb, p->sb);
    int64_t acc = 1, pst[EIN_MAXL];
    for (int i = p->nc - 1; i >= 0; i--) { pst[i] = acc; acc *= p->dc[i]; }
    for (int d = 0; d < e->out.n; d++) {
        int k = 0;
        while (p->lc[k] != e->out.lab[d]) k++;
        p->so[d] = p->dc[k] == 1 ? 0 : pst[k];
        p->dout[d] = e->size[e->out.lab[d]];
    }
}

#endif
