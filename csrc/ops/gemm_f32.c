/* gemm_f32.c — float32 GEMMs on AVX-512 FMAs, for where the BLAS runs at half the CPU's width.
 *
 * CPU GEMMs go to BLAS (docs/design.md, "Performance habits"). One case is taken here instead: a CPU with AVX-512 whose
 * OpenBLAS runs a kernel without it. OpenBLAS picks its kernel per CPU at load, and a machine may
 * pin an older build to its AVX2 kernel (OPENBLAS_CORETYPE=Haswell: 0.3.21's AVX-512 kernels
 * misbehave on some newer CPUs), which then runs at half of what the cores' 512-bit FMAs give.
 * Measured on one Zen 5 core at the benchmark models' shapes (`python bench/gemm_kernels.py`):
 * OpenBLAS's Haswell kernel 116-128 GFLOP/s, its own AVX-512 kernels (unpinned) 154-249, this
 * kernel 190-254, eager torch's MKL 98-112. Where OpenBLAS runs an AVX-512 kernel (or the BLAS
 * is another one), every product stays with BLAS.
 *
 * Layout (one micro-kernel, as llm.c and BLIS do it): C is cut into tiles of MR x NR (12 x 32:
 * 24 accumulators in zmm registers). For each pass over KC values of k:
 *   B  each panel of NR columns of op(B) is packed [k][t] into a 32 KiB buffer on the stack of
 *      the thread that uses it, where it stays in L1 while every row block's tile reads it;
 *   A  is read where it lies, one broadcast per row and k (row-major or transposed: strides rs,
 *      ks); a last block of fewer than MR rows is copied zero-padded once per pass.
 * Each element of C adds its K products in passes of KC, in order, so the result does not depend
 * on how the work was split among threads. Tiles store masked at the right edge.
 *
 * Threads: ranges of panels (or of row blocks, when C has more of those), on the engine's pool;
 * a range of row blocks packs every panel itself. From inside a parallel range (a convolution's
 * images) the product runs on the calling thread.
 */
#include "ops/gemm.h"

#include <string.h>
#include <strings.h>

#include "core/threadpool.h"

#define MR 12
#define NR 32
#define KC 256

static int64_t f32_calls;   /* products this kernel computed (om_gemm_f32_count) */

/* Benchmarks set it through ctypes (default visibility, as om_release_poison): every float32
 * product then goes to BLAS, so that a comparison with eager PyTorch can run both sides' GEMMs
 * at one vector width (bench_train.py --gemm blas, with OpenBLAS pinned by OPENBLAS_CORETYPE). */
__attribute__((visibility("default"))) int om_gemm_blas_only;

int64_t om_gemm_f32_count(void) { return __atomic_load_n(&f32_calls, __ATOMIC_RELAXED); }

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512vl")))

#include "ops/transpose16.h"

/* OpenBLAS's name for the kernel it loaded; weak, so that another BLAS links too (then absent). */
extern char *openblas_get_corename(void) __attribute__((weak));

/* 1 when this kernel runs float32 products: the CPU has AVX-512 and the BLAS is an OpenBLAS
 * that loaded a kernel without it. Its AVX-512 kernels are SkylakeX's and those built on them. */
static int takes_float32(void) {
    static int wanted = -1;
    if (wanted < 0) {
        static const char *const avx512_cores[] = {"skylakex", "cooperlake", "sapphirerapids", NULL};
        __builtin_cpu_init();
        const char *core = openblas_get_corename ? openblas_get_corename() : NULL;
        int narrower = core != NULL;
        for (int i = 0; core && avx512_cores[i]; i++)
            if (strcasecmp(core, avx512_cores[i]) == 0) narrower = 0;
        wanted = narrower && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
    }
    return wanted;
}

typedef struct f32_job {
    bool ta, tb, by_rows;
    int64_t M, N, K, lda, ldb, ldc, n_blocks, n_panels;
    float alpha, beta;
    const float *A, *B;
    float *C;
} f32_job;

/* the first n of 16 lanes */
static inline __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0; }

/* Rows k0..k0+kc of op(B), its columns j0..j0+NR (zeros past N), to o[k][t]. */
TARGET static void pack_panel(const f32_job *j, int64_t k0, int64_t kc, int64_t j0, float *o) {
    const int64_t n = j->N - j0 < NR ? j->N - j0 : NR;
    if (!j->tb) {   /* op(B) row k is B's row: two (masked) vectors */
        const __mmask16 m0 = lanes(n), m1 = lanes(n - 16);
        for (int64_t k = 0; k < kc; k++) {
            const float *row = j->B + (k0 + k) * j->ldb + j0;
            _mm512_store_ps(o + k * NR, _mm512_maskz_loadu_ps(m0, row));
            _mm512_store_ps(o + k * NR + 16, _mm512_maskz_loadu_ps(m1, row + 16));
        }
        return;
    }
    /* B stored N x K: column t of the panel is B's row j0 + t; 16 rows by 16 k at a time, transposed */
    for (int64_t g = 0; g < NR; g += 16)
        for (int64_t q = 0; q < kc; q += 16) {
            const __mmask16 mk = lanes(kc - q);
            __m512i r[16];
            for (int t = 0; t < 16; t++)
                r[t] = g + t < n ? _mm512_maskz_loadu_epi32(mk, j->B + (j0 + g + t) * j->ldb + k0 + q)
                                 : _mm512_setzero_si512();
            transpose16(r);
            const int64_t s_end = kc - q < 16 ? kc - q : 16;
            for (int64_t s = 0; s < s_end; s++) _mm512_store_si512(o + (q + s) * NR + g, r[s]);
        }
}

/* The tile c (mr x nr, row stride ldc) = alpha * sum_k a(r, k) b[k][t] + beta * c, k in [0, kc),
 * a(r, k) at a[r*rs + k*ks]. */
TARGET static void tile(int64_t kc, const float *a, int64_t rs, int64_t ks, const float *b, float *c, int64_t ldc,
                        int mr, int nr, float alpha, float beta) {
    __m512 acc[MR][2];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_load_ps(b + k * NR), b1 = _mm512_load_ps(b + k * NR + 16);
        const float *ak = a + k * ks;
#pragma GCC unroll 16   /* every accumulator a register: the loop over rows must be unrolled */
        for (int r = 0; r < MR; r++) {
            const __m512 av = _mm512_set1_ps(ak[r * rs]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        if (r >= mr) break;
        float *row = c + r * ldc;
        __m512 y0 = _mm512_mul_ps(acc[r][0], va), y1 = _mm512_mul_ps(acc[r][1], va);
        if (beta != 0.0f) {   /* beta 0 reads nothing of C (a NaN there does not propagate), as BLAS */
            y0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, row), vb, y0);
            y1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, row + 16), vb, y1);
        }
        _mm512_mask_storeu_ps(row, m0, y0);
        _mm512_mask_storeu_ps(row + 16, m1, y1);
    }
}

/* Panels [lo, hi) against every row block (or row blocks [lo, hi) against every panel). */
TARGET static void f32_range(void *ctx, int64_t lo, int64_t hi) {
    const f32_job *j = ctx;
    float panel[KC * NR] __attribute__((aligned(64)));
    float tail[MR * KC] __attribute__((aligned(64)));
    const int64_t b0 = j->by_rows ? lo : 0, b1 = j->by_rows ? hi : j->n_blocks;
    const int64_t p0 = j->by_rows ? 0 : lo, p1 = j->by_rows ? j->n_panels : hi;
    const int64_t rs = j->ta ? 1 : j->lda, ks = j->ta ? j->lda : 1;   /* A (r, k) at A[r*rs + k*ks] */
    const int64_t tail_rows = j->M - (j->n_blocks - 1) * MR;           /* rows of the last block */
    for (int64_t k0 = 0; k0 < j->K; k0 += KC) {
        const int64_t kc = j->K - k0 < KC ? j->K - k0 : KC;
        const float beta = k0 ? 1.0f : j->beta, alpha = j->alpha;
        if (tail_rows < MR && b1 == j->n_blocks) {   /* the short last block, zero-padded, [r][k] */
            const float *a = j->A + (j->n_blocks - 1) * MR * rs + k0 * ks;
            memset(tail, 0, sizeof tail);
            for (int64_t r = 0; r < tail_rows; r++)
                for (int64_t k = 0; k < kc; k++) tail[r * KC + k] = a[r * rs + k * ks];
        }
        for (int64_t p = p0; p < p1; p++) {
            pack_panel(j, k0, kc, p * NR, panel);
            const int nr = (int)(j->N - p * NR < NR ? j->N - p * NR : NR);
            for (int64_t blk = b0; blk < b1; blk++) {
                float *c = j->C + blk * MR * j->ldc + p * NR;
                /* alpha applies to every pass's products: C = alpha * (sum of passes) + beta C */
                if (blk == j->n_blocks - 1 && tail_rows < MR)
                    tile(kc, tail, KC, 1, panel, c, j->ldc, (int)tail_rows, nr, alpha, beta);
                else
                    tile(kc, j->A + blk * MR * rs + k0 * ks, rs, ks, panel, c, j->ldc, MR, nr, alpha, beta);
            }
        }
    }
}

int om_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    /* alpha 0: BLAS scales C and reads neither operand (an inf there gives no NaN); very thin
     * products would waste most of a tile: both stay with BLAS */
    if (__atomic_load_n(&om_gemm_blas_only, __ATOMIC_RELAXED) || !takes_float32() || M < 2 || N < 8 || K <= 0 ||
        alpha == 0.0f)
        return 0;
    f32_job j = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                 .n_blocks = (M + MR - 1) / MR, .n_panels = (N + NR - 1) / NR, .alpha = alpha, .beta = beta,
                 .A = A, .B = B, .C = C};
    j.by_rows = j.n_blocks > j.n_panels;
    const int64_t units = j.by_rows ? j.n_blocks : j.n_panels;
    if (M * N * K < OM_GEMM_SHARE_MIN_FMAS) f32_range(&j, 0, units);
    else om_pool_for(units, 1, f32_range, &j);
    __atomic_fetch_add(&f32_calls, 1, __ATOMIC_RELAXED);
    return 1;
}

#else   /* no AVX-512 build: BLAS always */
int om_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    return 0;
}
#endif
