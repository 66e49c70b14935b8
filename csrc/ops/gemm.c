/* gemm.c — om_gemm (see gemm.h): the engine's float32 kernels where they apply (gemm_bf16.c,
 * gemm_f32.c), else BLAS per block, blocks on the engine's pool. */
#include "ops/gemm.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"

/* OpenBLAS's own thread count; weak so another BLAS links too. */
extern void openblas_set_num_threads(int n) __attribute__((weak));

/* Rows or columns per block are a multiple of this, so that no thread gets a sliver that
 * the BLAS micro-kernel handles with its slow edge code. */
#define BLOCK_ALIGN 16
/* Below this many multiply-adds packing to bf16 pairs costs more than the faster products save. */
#define BF16_MIN_FMAS ((int64_t)1 << 20)

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) {
    if (openblas_set_num_threads) openblas_set_num_threads(1);
}

typedef struct gemm_job {
    om_dtype dt;
    bool ta, tb, by_rows;
    int64_t M, N, K, lda, ldb, ldc;
    double alpha, beta;
    const char *A, *B;
    char *C;
} gemm_job;

static void blas(om_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                 int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    const enum CBLAS_TRANSPOSE a = ta ? CblasTrans : CblasNoTrans, b = tb ? CblasTrans : CblasNoTrans;
    if (dt == OM_F32)
        cblas_sgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, (float)alpha, A, (int)lda, B, (int)ldb, (float)beta,
                    C, (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* Blocks [lo, hi) of BLOCK_ALIGN rows (or columns) of C. */
static void gemm_blocks(void *ctx, int64_t lo, int64_t hi) {
    const gemm_job *j = ctx;
    const size_t es = j->dt == OM_F32 ? sizeof(float) : sizeof(double);
    const int64_t extent = j->by_rows ? j->M : j->N;
    const int64_t first = lo * BLOCK_ALIGN, last = hi * BLOCK_ALIGN < extent ? hi * BLOCK_ALIGN : extent;
    const int64_t count = last - first;
    if (count <= 0) return;
    if (j->by_rows) {   /* rows first..last of op(A) and of C */
        const char *A = j->A + (size_t)(j->ta ? first : first * j->lda) * es;
        blas(j->dt, j->ta, j->tb, count, j->N, j->K, j->alpha, A, j->lda, j->B, j->ldb, j->beta,
             j->C + (size_t)(first * j->ldc) * es, j->ldc);
    } else {            /* columns first..last of op(B) and of C */
        const char *B = j->B + (size_t)(j->tb ? first * j->ldb : first) * es;
        blas(j->dt, j->ta, j->tb, j->M, count, j->K, j->alpha, j->A, j->lda, B, j->ldb, j->beta,
             j->C + (size_t)first * es, j->ldc);
    }
}

static atomic_int timing_users;
static atomic_llong timed_ns;

void om_gemm_timing(bool on) { atomic_fetch_add_explicit(&timing_users, on ? 1 : -1, memory_order_relaxed); }
int64_t om_gemm_time_ns(void) { return atomic_load_explicit(&timed_ns, memory_order_relaxed); }

static void gemm(om_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                 int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);

void om_gemm(om_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
             int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    if (atomic_load_explicit(&timing_users, memory_order_relaxed) <= 0) {
        gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
    if (om_pool_in_parallel()) {   /* one of the pool's threads, each in a product of its own */
        const int n = om_get_num_threads();
        ns /= n > 1 ? n : 1;
    }
    atomic_fetch_add_explicit(&timed_ns, ns, memory_order_relaxed);
}

static void gemm(om_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                 int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    const size_t es = dt == OM_F32 ? sizeof(float) : sizeof(double);
    if (K <= 0) {   /* an empty sum: C = beta C */
        for (int64_t i = 0; i < M; i++) {
            char *row = (char *)C + (size_t)(i * ldc) * es;
            if (beta == 0) { memset(row, 0, (size_t)N * es); continue; }
            for (int64_t k = 0; k < N; k++) {
                if (dt == OM_F32) ((float *)row)[k] *= (float)beta;
                else ((double *)row)[k] *= beta;
            }
        }
        return;
    }
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    if (ldc < 1) ldc = 1;
    if (dt == OM_F32 && M * N * K >= BF16_MIN_FMAS &&
        om_gemm_bf16(ta, tb, M, N, K, (float)alpha, A, lda, B, ldb, (float)beta, C, ldc))
        return;
    if (dt == OM_F32 && om_gemm_f32(ta, tb, M, N, K, (float)alpha, A, lda, B, ldb, (float)beta, C, ldc)) return;
    gemm_job j = {.dt = dt, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                  .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C};
    /* cut the longer side of C: each block then still multiplies a full-width panel */
    j.by_rows = M >= N;
    const int64_t blocks = ((j.by_rows ? M : N) + BLOCK_ALIGN - 1) / BLOCK_ALIGN;
    /* Two ranges per thread at most (each BLAS call packs its operands once more), so a
     * thread that the OS preempts holds up less; 64 rows or columns at least. */
    int R = M * N * K < OM_GEMM_SHARE_MIN_FMAS ? 1 : om_pool_ranges(blocks, 4);
    const int cap = 2 * om_get_num_threads();
    pthread_once(&blas_once, blas_single_threaded);
    om_pool_run(blocks, R < cap ? R : cap, gemm_blocks, &j);
}
