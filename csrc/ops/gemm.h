/* gemm.h — the one way a CPU kernel multiplies matrices.
 *
 *     om_gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
 *
 * Row-major C (M x N) = alpha op(A) op(B) + beta C, op(X) = X or X^T, float32 or float64
 * (dt), leading dimensions in elements as BLAS takes them. float32 operands that hold only bf16
 * values take the bf16 kernel (om_gemm_bf16: same products, fp32 accumulation, twice the rate);
 * other float32 products go to BLAS, or to the engine's AVX-512 kernel where the CPU has AVX-512
 * and OpenBLAS was pinned to a kernel without it (om_gemm_f32); float64 to BLAS. An empty inner
 * dimension (K = 0) gives C = beta C, with beta = 0 writing zeros (BLAS would leave C as it was).
 *
 * Threading: BLAS runs single-threaded; a product big enough to share is cut into blocks of
 * rows (or of columns, when C is wide and short) that run on the engine's pool, the same
 * threads as every other kernel. Called from inside a parallel range, it runs on the
 * calling thread. So the process never holds a second team of BLAS threads spinning
 * between products while torch's or ours wait for cores.
 */
#ifndef OM_GEMM_H
#define OM_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "ortmod.h"

/* Below this many multiply-adds a product is not worth a wake-up of the pool (~2-5 µs; 1M FMAs
 * take ~10 µs on one AVX2 core): it runs on the calling thread (gemm.c, gemm_f32.c). */
#define OM_GEMM_SHARE_MIN_FMAS ((int64_t)1 << 20)

void om_gemm(om_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
             int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);

/* GEMM time, for the engine's profiler (om_engine_set_profiling): while at least one caller has
 * it on, om_gemm adds its wall time to a process-wide count. A product called from inside a
 * parallel range (attention's heads, a convolution's images) runs beside the pool's other
 * threads, each in its own product: it adds its time over the thread count, so that the count
 * stays a wall time when every thread multiplies. The profiler reads the count before and after
 * each kernel: the difference is the kernel's time inside GEMMs, the rest its time outside. */
void om_gemm_timing(bool on);    /* counted: each on is undone by one off */
int64_t om_gemm_time_ns(void);

/* float32 C = alpha op(A) op(B) + beta C on AVX512-BF16, when every value of A and B is a bf16
 * value (the widened operands of a node that computes in bf16): 1 when it computed C, 0 when it
 * did not (no such CPU, an operand bf16 does not hold exactly): then the caller takes its
 * float32 path (ops/gemm_bf16.c). om_gemm tries it for big enough float32 products. */
int om_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* How many products it computed: om_gemm_bf16_count, public (ortmod.h, "testing"). */

/* float32 C = alpha op(A) op(B) + beta C on AVX-512 FMAs (ops/gemm_f32.c), where the CPU has them
 * and the BLAS is an OpenBLAS running a kernel without: 1 when it computed C, 0 when it did not
 * (that case is not this machine's; alpha 0; fewer than 2 rows or 8 columns): then the caller
 * runs sgemm. Counted by om_gemm_f32_count (ortmod.h, "testing"). */
int om_gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
