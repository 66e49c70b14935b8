/* gemm_bf16.c — float32 GEMMs whose operands bf16 holds exactly, on AVX512-BF16.
 *
 * A node that computes in bf16 runs its fp32 kernel on widened copies (ops/fold.c), so its GEMMs
 * reach om_gemm as float32 matrices whose every value is a bf16 value. For those, VDPBF16PS
 * computes the same products (a product of two bf16 values is exact in fp32) at twice the rate
 * of fp32 FMAs, accumulating in fp32: a bf16 GEMM with fp32 accumulation, as cuBLAS and oneDNN
 * (eager's bf16 matmul on the CPU) compute it. Only the order of the additions differs from
 * sgemm, as between any two BLAS.
 *
 * The operands are packed to bf16 pairs first; packing checks that each value is a bf16 value
 * (low 16 bits zero) and not a bf16 subnormal (VDPBF16PS reads those as zero). When one is not
 * — any ordinary float32 matrix, at its first elements — om_gemm_bf16 returns 0 and the caller
 * takes its float32 path (om_gemm_f32, else sgemm): the result never depends on which path ran
 * beyond summation order. Results below
 * fp32's normal range (~1.2e-38) are flushed to zero by the instruction.
 *
 * Layout (llm.c-style, one micro-kernel): C is cut into tiles of MR rows x NR columns.
 *   A packed: per block of MR rows, uint32 pairs (A[i][2q], A[i][2q+1]) as bf16: row by row ([r][q])
 *             when A is row-major, pair by pair ([q][r]) when transposed (both packed with vectors)
 *   B packed: per panel of NR columns, per k pair q: NR uint32, each (B[2q][j], B[2q+1][j])
 * An odd K pads the last pair with a zero; edge tiles pad with zero rows/columns and store masked.
 */
#include "ops/gemm.h"

#include <string.h>

#include "core/threadpool.h"

#define MR 8
#define NR 32
_Static_assert(NR % 16 == 0, "B panels pack 16 columns at a time (pack_panel_of_rows, pack_cols)");
#define KC 128   /* k pairs per pass over C: a B panel's slice (KC x NR pairs, 16 KiB) stays in L1 */

static int64_t bf16_calls;   /* products this path computed (om_gemm_bf16_count) */

int64_t om_gemm_bf16_count(void) { return __atomic_load_n(&bf16_calls, __ATOMIC_RELAXED); }

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

#include "ops/transpose16.h"

static int cpu_has_bf16(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
    }
    return has;
}

/* The bf16 bits of f, or sets *bad when f is not a normal bf16 value (or zero, inf, NaN). */
static inline uint32_t bf16_bits(float f, uint32_t *bad) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t exp = u & 0x7f800000u, man = u & 0x007f0000u;
    *bad |= (u & 0xffffu) | (uint32_t)(exp == 0 && man != 0);
    return u >> 16;
}

typedef struct pack_job {
    const float *X;
    int64_t ld, rows, K, Kp, width;   /* width: MR (A blocks) or NR (B panels) */
    bool trans;                       /* element (r, k) at X[k*ld + r] instead of X[r*ld + k] */
    bool row_major;                   /* a block stored [r][q] (A not transposed) instead of [q][r] */
    uint32_t *out;
    int bad;
} pack_job;

/* 16 floats: nonzero when one is not a normal bf16 value (low bits set, or a bf16 subnormal) */
TARGET static inline __mmask16 not_bf16(__m512i v) {
    const __mmask16 low = _mm512_test_epi32_mask(v, _mm512_set1_epi32(0xffff));
    const __mmask16 exp0 = _mm512_testn_epi32_mask(v, _mm512_set1_epi32(0x7f800000));
    return low | (exp0 & _mm512_test_epi32_mask(v, _mm512_set1_epi32(0x007f0000)));
}

/* pairs (x0[t], x1[t]) of two rows, as bf16 bits: x0 in the low half */
TARGET static inline __m512i pair_rows(__m512i x0, __m512i x1) {
    return _mm512_or_si512(_mm512_and_si512(x1, _mm512_set1_epi32((int)0xffff0000u)), _mm512_srli_epi32(x0, 16));
}

/* One row i of X: its k pairs to o[q], q in [0, Kp). */
TARGET static uint32_t pack_row(const pack_job *j, int64_t i, uint32_t *o) {
    uint32_t bad = 0;
    const float *x = j->X + i * j->ld;
    int64_t q = 0;
    __mmask16 m = 0;
    for (; 2 * q + 32 <= j->K; q += 16) {
        const __m512i lo = _mm512_loadu_si512(x + 2 * q), hi = _mm512_loadu_si512(x + 2 * q + 16);
        m |= not_bf16(lo) | not_bf16(hi);
        _mm512_storeu_si512(o + q, (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo));   /* exact: no rounding */
    }
    bad |= m;
    for (; q < j->Kp; q++) {
        const float x1 = 2 * q + 1 < j->K ? x[2 * q + 1] : 0.0f;
        o[q] = bf16_bits(x[2 * q], &bad) | bf16_bits(x1, &bad) << 16;
    }
    return bad;
}

/* Columns c0..c0+width of rows 2q, 2q+1 of X (element (r, k) at X[k*ld + r]) to o[q*width + t]. */
TARGET static uint32_t pack_cols(const pack_job *j, int64_t c0, uint32_t *o) {
    uint32_t bad = 0;
    const int64_t n = j->rows - c0 < j->width ? j->rows - c0 : j->width;   /* real columns */
    const __mmask16 m_lo = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    const __mmask16 m_hi = n >= 32 ? 0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    __mmask16 m = 0;
    for (int64_t q = 0; q < j->Kp; q++) {
        const float *r0 = j->X + 2 * q * j->ld + c0, *r1 = r0 + j->ld;
        const int odd = 2 * q + 1 >= j->K;   /* the pad row of an odd K */
        for (int64_t t = 0; t < j->width; t += 16) {
            const __mmask16 mk = t ? m_hi : m_lo;
            const __m512i x0 = _mm512_maskz_loadu_epi32(mk, r0 + t);
            const __m512i x1 = odd ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi32(mk, r1 + t);
            m |= not_bf16(x0) | not_bf16(x1);
            if (j->width - t >= 16) _mm512_storeu_si512(o + q * j->width + t, pair_rows(x0, x1));
            else _mm256_storeu_si256((__m256i *)(o + q * j->width + t), _mm512_castsi512_si256(pair_rows(x0, x1)));
        }
    }
    return bad | m;
}

/* A panel of B when B is stored transposed (N x K: its columns j are rows of X): 16 rows and 16
 * pairs at a time, converted along each row, then transposed to the panel's [q][t] layout. */
TARGET static uint32_t pack_panel_of_rows(const pack_job *j, int64_t j0, uint32_t *o) {
    __mmask16 bad = 0;
    for (int64_t g = 0; g < j->width; g += 16)
        for (int64_t q0 = 0; q0 < j->Kp; q0 += 16) {
            const int64_t left = j->K - 2 * q0;   /* floats of each row from 2*q0 */
            const __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            const __mmask16 m1 = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            __m512i r[16];
            for (int t = 0; t < 16; t++) {
                const int64_t row = j0 + g + t;
                if (row >= j->rows) { r[t] = _mm512_setzero_si512(); continue; }
                const float *x = j->X + row * j->ld + 2 * q0;
                const __m512i lo = _mm512_maskz_loadu_epi32(m0, x), hi = _mm512_maskz_loadu_epi32(m1, x + 16);
                bad |= not_bf16(lo) | not_bf16(hi);
                r[t] = (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
            }
            transpose16(r);
            const int64_t n = j->Kp - q0 < 16 ? j->Kp - q0 : 16;
            for (int64_t s = 0; s < n; s++) _mm512_storeu_si512(o + (q0 + s) * j->width + g, r[s]);
        }
    return bad;
}

/* Blocks [lo, hi) of `width` rows of X (rows of A, or columns of B seen as rows of B^T). */
TARGET static void pack_blocks(void *ctx, int64_t lo, int64_t hi) {
    pack_job *j = ctx;
    uint32_t bad = 0;
    for (int64_t b = lo; b < hi && !bad; b++) {
        uint32_t *o = j->out + (size_t)b * (size_t)j->Kp * (size_t)j->width;
        if (j->trans) {              /* pairs from two rows of X, contiguous over the block's columns */
            bad |= pack_cols(j, b * j->width, o);
        } else if (!j->row_major) {  /* B's panels, B stored N x K (NR is a multiple of 16) */
            bad |= pack_panel_of_rows(j, b * j->width, o);
        } else {                     /* A's blocks, row by row */
            for (int64_t r = 0; r < j->width; r++) {
                const int64_t i = b * j->width + r;
                if (i < j->rows) bad |= pack_row(j, i, o + r * j->Kp);
                else memset(o + r * j->Kp, 0, sizeof(uint32_t) * (size_t)j->Kp);
            }
        }
    }
    if (bad) __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
}

/* c (mr x nr of a tile, row stride ldc) = alpha * a_blk . b_pan + beta * c, over k pairs [q0, q1)
 * of the packed block (element (r, q) at a[r*rs + q*qs]) and panel */
TARGET static void tile(int64_t q0, int64_t q1, const uint32_t *a, int64_t rs, int64_t qs, const uint32_t *b, float *c,
                        int64_t ldc, int mr, int nr, float alpha, float beta) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t q = q0; q < q1; q++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + q * NR);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + q * NR + 16);
        for (int r = 0; r < MR; r++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[q * qs + r * rs]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < mr; r++) {
        float *row = c + r * ldc;
        for (int v = 0; v < 2; v++) {
            const int cols = nr - 16 * v;
            if (cols <= 0) break;
            const __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
            __m512 y = _mm512_mul_ps(acc[r][v], va);
            if (beta != 0.0f) y = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, row + 16 * v), vb, y);
            _mm512_mask_storeu_ps(row + 16 * v, m, y);
        }
    }
}

typedef struct tile_job {
    const uint32_t *a, *b;
    float *C;
    int64_t M, N, Kp, ldc, n_blocks, n_panels, a_rs, a_qs;   /* a_rs, a_qs: A's packed layout */
    float alpha, beta;
    bool by_rows;
} tile_job;

/* Row blocks [lo, hi) against every panel (by_rows), or panels [lo, hi) against every block, KC k
 * pairs at a time: the inner loop reuses one panel's slice (in L1) over the blocks, and the
 * passes after the first add onto C. */
static void tile_range(void *ctx, int64_t lo, int64_t hi) {
    const tile_job *j = ctx;
    const int64_t b0 = j->by_rows ? lo : 0, b1 = j->by_rows ? hi : j->n_blocks;
    const int64_t p0 = j->by_rows ? 0 : lo, p1 = j->by_rows ? j->n_panels : hi;
    for (int64_t q0 = 0; q0 < j->Kp; q0 += KC) {
        const int64_t q1 = q0 + KC < j->Kp ? q0 + KC : j->Kp;
        const float beta = q0 ? 1.0f : j->beta;
        for (int64_t p = p0; p < p1; p++) {
            const uint32_t *bp = j->b + (size_t)p * (size_t)j->Kp * NR;
            const int nr = (int)(j->N - p * NR < NR ? j->N - p * NR : NR);
            for (int64_t blk = b0; blk < b1; blk++) {
                const int mr = (int)(j->M - blk * MR < MR ? j->M - blk * MR : MR);
                tile(q0, q1, j->a + (size_t)blk * (size_t)j->Kp * MR, j->a_rs, j->a_qs, bp,
                     j->C + blk * MR * j->ldc + p * NR, j->ldc, mr, nr, j->alpha, beta);
            }
        }
    }
}

/* A float32 matrix of ordinary values fails here, at its first elements, before anything is packed. */
static int looks_bf16(const float *X, int64_t rows, int64_t cols, int64_t ld) {
    uint32_t bad = 0;
    for (int64_t i = 0; i < rows && i < 4; i++)
        for (int64_t k = 0; k < cols && k < 16; k++) (void)bf16_bits(X[i * ld + k], &bad);
    return !bad;
}

int om_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (!cpu_has_bf16() || M <= 0 || N <= 0 || K <= 0) return 0;
    if (!looks_bf16(A, ta ? K : M, ta ? M : K, lda) || !looks_bf16(B, tb ? N : K, tb ? K : N, ldb)) return 0;
    const int64_t Kp = (K + 1) / 2, n_blocks = (M + MR - 1) / MR, n_panels = (N + NR - 1) / NR;
    const size_t a_words = (size_t)n_blocks * (size_t)Kp * MR, b_words = (size_t)n_panels * (size_t)Kp * NR;
    uint32_t *buf = om_alloc((a_words + b_words) * sizeof(uint32_t));
    if (!buf) return 0;   /* sgemm needs no scratch */
    /* B's columns are the rows of B^T: B^T (j, k) = B[k*ldb + j], or B[j*ldb + k] when tb */
    pack_job pb = {.X = B, .ld = ldb, .rows = N, .K = K, .Kp = Kp, .width = NR, .trans = !tb, .out = buf + a_words};
    om_pool_for(n_panels, 1, pack_blocks, &pb);
    int ok = !pb.bad;
    if (ok) {
        pack_job pa = {.X = A, .ld = lda, .rows = M, .K = K, .Kp = Kp, .width = MR, .trans = ta,
                       .row_major = !ta, .out = buf};
        om_pool_for(n_blocks, 4, pack_blocks, &pa);
        ok = !pa.bad;
    }
    if (ok) {
        tile_job t = {.a = buf, .b = buf + a_words, .C = C, .M = M, .N = N, .Kp = Kp, .ldc = ldc,
                      .n_blocks = n_blocks, .n_panels = n_panels, .alpha = alpha, .beta = beta,
                      .a_rs = ta ? 1 : Kp, .a_qs = ta ? MR : 1,
                      .by_rows = n_blocks >= n_panels};
        om_pool_for(t.by_rows ? n_blocks : n_panels, 1, tile_range, &t);
        __atomic_fetch_add(&bf16_calls, 1, __ATOMIC_RELAXED);
    }
    om_free(buf);
    return ok;
}

#else   /* no AVX512-BF16 build: sgemm always */
int om_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    return 0;
}
#endif
