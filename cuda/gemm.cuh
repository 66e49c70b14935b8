// gemm.cuh — matmul.cu's cuBLASLt GEMM with a fused epilogue, for the other GEMM ops that fuse a
// bias or a GELU into it (fused.cu's MatMulBias, MatMulBiasGelu and MatMulBiasGrad). The plain
// row-major GEMM, omc_gemm, is in common.cuh.
#pragma once
#include <cublasLt.h>

#include "common.cuh"

// Y (M, N) = X (M, K) op(W) + bias (N), row-major, W (K, N) or with tb (N, K), then epi
// (CUBLASLT_EPILOGUE_BIAS, GELU_BIAS, GELU_AUX_BIAS writing the pre-activation into aux, or DGELU
// reading gelu_x from aux). *done = 0 when cuBLASLt declines (alignment, leading dims, fp64, no
// algorithm): not an error, the caller takes the plain path (omc_fill_bias, then omc_gemm).
om_status *omc_gemm_epilogue(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tb, int64_t M,
                             int64_t N, int64_t K, const void *X, const void *W, const void *bias, void *Y,
                             cublasLtEpilogue_t epi, void *aux, int *done);
// y (rows, cols) = beta * c[i * sm + j * sn]: the bias written before a beta = 1 GEMM
om_status *omc_fill_bias(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *y, const void *c,
                         int64_t rows, int64_t cols, int64_t sm, int64_t sn, double beta);
