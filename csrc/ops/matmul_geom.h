/* matmul_geom.h — the geometry of alpha * op(A) op(B) under numpy's matmul rules (1-D
 * operands, broadcast batch dims), shared by the CPU kernels (ops/matmul.c) and the CUDA
 * ones (cuda/matmul.cu). Plain C that C++ (nvcc) also compiles; errors are the caller's
 * to word. */
#ifndef OM_MATMUL_GEOM_H
#define OM_MATMUL_GEOM_H

#include <string.h>

#include "ortmod.h"

typedef struct om_mm_geom {
    int64_t M, N, K;              /* of the forward product op(A)(M,K) op(B)(K,N) */
    int ta, tb;                   /* effective transposes (a 1-D operand never transposes) */
    int nb;                       /* broadcast batch rank */
    int64_t batch[OM_MAX_RANK];
    int64_t nbatch;
    int64_t a_str[OM_MAX_RANK], b_str[OM_MAX_RANK], y_str[OM_MAX_RANK];
    int y_rank;
    int64_t y_dims[OM_MAX_RANK];
} om_mm_geom;

/* Batch strides (in elements) of an operand whose batch dims are bdims (rank br) right-
 * aligned against the full batch of rank nb; mat = elements per matrix; 0 where broadcast. */
static inline void om_mm_batch_strides(const int64_t *bdims, int br, int nb, int64_t mat, int64_t *str) {
    int64_t s = mat;
    for (int i = nb - 1; i >= 0; i--) {
        int j = i - (nb - br);
        if (j < 0 || bdims[j] == 1) {
            str[i] = 0;
        } else {
            str[i] = s;
            s *= bdims[j];
        }
    }
}

enum { OM_MM_OK = 0, OM_MM_BAD_RANK = 1, OM_MM_NO_MULTIPLY = 2 };

/* Fills g for A (rank ra, dims a) and B; returns OM_MM_OK, OM_MM_BAD_RANK (a rank < 1) or
 * OM_MM_NO_MULTIPLY (inner dims or batch dims disagree). */
static inline int om_mm_geometry(int ra, const int64_t *a, int rb, const int64_t *b, int ta, int tb, om_mm_geom *g) {
    memset(g, 0, sizeof *g);
    if (ra < 1 || rb < 1) return OM_MM_BAD_RANK;
    int64_t ka, kb;
    if (ra == 1) { ta = 0; g->M = 1; ka = a[0]; }
    else { g->M = ta ? a[ra - 1] : a[ra - 2]; ka = ta ? a[ra - 2] : a[ra - 1]; }
    if (rb == 1) { tb = 0; g->N = 1; kb = b[0]; }
    else { g->N = tb ? b[rb - 2] : b[rb - 1]; kb = tb ? b[rb - 1] : b[rb - 2]; }
    g->ta = ta;
    g->tb = tb;
    int bra = ra > 2 ? ra - 2 : 0, brb = rb > 2 ? rb - 2 : 0;
    g->nb = bra > brb ? bra : brb;
    if (ka != kb) return OM_MM_NO_MULTIPLY;
    g->nbatch = 1;
    for (int i = 0; i < g->nb; i++) {
        int ja = i - (g->nb - bra), jb = i - (g->nb - brb);
        int64_t da = ja >= 0 ? a[ja] : 1, db = jb >= 0 ? b[jb] : 1;
        if (da != db && da != 1 && db != 1) return OM_MM_NO_MULTIPLY;
        g->batch[i] = da == 1 ? db : da;
        g->nbatch *= g->batch[i];
    }
    g->K = ka;
    om_mm_batch_strides(a, bra, g->nb, g->M * g->K, g->a_str);
    om_mm_batch_strides(b, brb, g->nb, g->K * g->N, g->b_str);
    om_mm_batch_strides(g->batch, g->nb, g->nb, g->M * g->N, g->y_str);
    g->y_rank = 0;
    for (int i = 0; i < g->nb; i++) g->y_dims[g->y_rank++] = g->batch[i];
    if (ra > 1) g->y_dims[g->y_rank++] = g->M;
    if (rb > 1) g->y_dims[g->y_rank++] = g->N;
    return OM_MM_OK;
}
/* 1 when strides str walk g's whole batch contiguously (matrix size mat); dims of size 1 ignored. */
static inline int om_mm_batch_is_contiguous(const om_mm_geom *g, const int64_t *str, int64_t mat) {
    int64_t s = mat;
    for (int i = g->nb - 1; i >= 0; i--) {
        if (g->batch[i] == 1) continue;
        if (str[i] != s) return 0;
        s *= g->batch[i];
    }
    return 1;
}

/* 1 when strides str do not move along g's batch: one matrix shared by every batch index. */
static inline int om_mm_batch_is_broadcast(const om_mm_geom *g, const int64_t *str) {
    for (int i = 0; i < g->nb; i++)
        if (g->batch[i] != 1 && str[i] != 0) return 0;
    return 1;
}
#endif
