/* gemm.h — the one way a CPU kernel multiplies matrices.
 *
 *     om_gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
 *
 * Row-major C (M x N) = alpha op(A) op(B) + beta C, op(X) = X or X^T, float32 or float64
 * (dt), leading dimensions in elements as BLAS takes them. An empty inner dimension (K = 0)
 * gives C = beta C, with beta = 0 writing zeros (BLAS would leave C as it was).
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

void om_gemm(om_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
             int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);

#endif
