/* rowsum.c — om_sum_rows (see rowsum.h). */
#include "ops/rowsum.h"

#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/threadpool.h"
#include "ops/broadcast.h"

#define COL_BLOCK 64   /* columns per work unit when columns are shared out */

typedef struct rowsum_job {
    int64_t M, N;
    const void *src;
    void *dst;       /* the result, or R partial rows of N */
    int by_cols;
} rowsum_job;

#define ROWSUM_WORKER(name, T)                                                                \
    OM_VEC_CLONES static void name(void *c, int64_t lo, int64_t hi) {                         \
        const rowsum_job *j = c;                                                              \
        const T *src = j->src;                                                                \
        if (j->by_cols) {   /* columns [lo, hi) blocks, every row */                          \
            const int64_t c0 = lo * COL_BLOCK, c1 = hi * COL_BLOCK < j->N ? hi * COL_BLOCK : j->N; \
            T *restrict d = (T *)j->dst + c0;                                                 \
            const int64_t w = c1 - c0;                                                        \
            for (int64_t k = 0; k < w; k++) d[k] = 0;                                         \
            for (int64_t i = 0; i < j->M; i++) {                                              \
                const T *restrict r = src + i * j->N + c0;                                    \
                for (int64_t k = 0; k < w; k++) d[k] += r[k];                                 \
            }                                                                                 \
        } else {            /* rows [lo, hi) into this range's partial row */                 \
            T *restrict d = (T *)j->dst + (int64_t)om_pool_range_id() * j->N;                 \
            for (int64_t k = 0; k < j->N; k++) d[k] = 0;                                      \
            for (int64_t i = lo; i < hi; i++) {                                               \
                const T *restrict r = src + i * j->N;                                         \
                for (int64_t k = 0; k < j->N; k++) d[k] += r[k];                              \
            }                                                                                 \
        }                                                                                     \
    }
ROWSUM_WORKER(rowsum_f32, float)
ROWSUM_WORKER(rowsum_f64, double)

om_status *om_sum_rows(om_dtype dt, int64_t M, int64_t N, const void *src, void *dst) {
    const size_t es = om_dtype_size(dt);
    if (N <= 0) return NULL;
    if (M <= 0) {
        memset(dst, 0, (size_t)N * es);
        return NULL;
    }
    om_pool_fn fn = dt == OM_F32 ? rowsum_f32 : rowsum_f64;
    const int64_t col_blocks = (N + COL_BLOCK - 1) / COL_BLOCK;
    /* enough column blocks to go around: no partials needed */
    if (col_blocks >= 2 * om_get_num_threads() || M * N < OM_GRAIN) {
        rowsum_job j = {M, N, src, dst, 1};
        om_pool_for(col_blocks, (OM_GRAIN / (M * COL_BLOCK)) + 1, fn, &j);
        return NULL;
    }
    const int R = om_pool_ranges(M, OM_GRAIN / N + 1);
    if (R <= 1) {
        rowsum_job j = {M, N, src, dst, 1};
        fn(&j, 0, col_blocks);
        return NULL;
    }
    char *part = malloc((size_t)R * (size_t)N * es);
    if (!part) return om_error(OM_OUT_OF_MEMORY, "out of memory for %d partial row sums of %lld", R, (long long)N);
    rowsum_job j = {M, N, src, part, 0};
    om_pool_run(M, R, fn, &j);
    /* in range order: the same sum for a given thread count, whoever ran what */
    if (dt == OM_F32) {
        float *d = dst;
        const float *p = (const float *)part;
        for (int64_t k = 0; k < N; k++) d[k] = p[k];
        for (int r = 1; r < R; r++)
            for (int64_t k = 0; k < N; k++) d[k] += p[(int64_t)r * N + k];
    } else {
        double *d = dst;
        const double *p = (const double *)part;
        for (int64_t k = 0; k < N; k++) d[k] = p[k];
        for (int r = 1; r < R; r++)
            for (int64_t k = 0; k < N; k++) d[k] += p[(int64_t)r * N + k];
    }
    free(part);
    return NULL;
}
