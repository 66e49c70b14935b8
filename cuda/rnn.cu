// rnn.cu — LSTM, GRU and the plain RNN (ONNX layout 0, as torch.onnx exports nn.LSTM / nn.GRU /
// nn.RNN) and their backward ops LSTMGrad / GRUGrad / RNNGrad (rnn.c: the same saved state, the
// same step order; RNN saves only Y, its f' a function of h: tanh 1 - h^2, relu h > 0).
//
//   X (T, B, I)  W (D, G*H, I)  R (D, G*H, H)  B (D, 2*G*H) = [Wb, Rb]   (G = 4, 3, 1)
//   initial_h/c, Y_h, Y_c (D, B, H)   Y (T, D, B, H)   gates (D, T, B, G*H)   cells / hr (D, T, B, H)
//
// Per direction the forward does one cuBLAS GEMM X W^T for every time step (plus the biases),
// then per step one GEMM H_{t-1} R^T (two for GRU without linear_before_reset) and one
// elementwise kernel for the gate nonlinearities. The backward walks the steps in reverse: an
// elementwise kernel for the pre-activation gate gradients dG, a GEMM for dH_{t-1} = dG R and
// one for dR += dG^T H_{t-1}; then dX = dG W and dW = dG^T X are one GEMM each and dB column sums.
// Nothing synchronizes: the step loop only enqueues. The step GEMMs read and write column blocks
// of the (B, G*H) gate matrices, so this file calls cuBLAS with explicit leading dimensions.
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>

#include "common.cuh"

// rnn_geom.h reports errors and reads attributes through the engine's names, mapped here onto the
// host table (as conv.cu does for spatial.h)
#define om_error(...) g_host.error(__VA_ARGS__)
#define om_attr_int(n, name, d) g_host.attr_int((n), (name), (d))
#define om_attr_float(n, name, d) g_host.attr_float((n), (name), (d))
#define om_attr_string(n, name, d) g_host.attr_string((n), (name), (d))
#define om_attr_strings(n, name, v) g_host.attr_strings((n), (name), (v))
#include "ops/rnn_geom.h"

// ---- cuBLAS with leading dimensions ----------------------------------------------------------------

// Row-major C (M, N) = op(A) op(B) + beta C, lda/ldb/ldc in elements; only beta 0 and 1 occur.
// c_f32: C is fp32 while A and B are dt (fp16/bf16 products summed over many calls, rounded once).
static om_status *gemm_ld_to(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int ta, int tb, int64_t M,
                             int64_t N, int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb, double beta,
                             void *C, int64_t ldc, int c_f32) {
    if (M <= 0 || N <= 0) return NULL;
    const size_t es = c_f32 ? sizeof(float) : dtype_size(dt);
    if (K <= 0) {   // an empty sum: C = beta C
        if (beta != 0.0) return NULL;
        return omc_cuda(cudaMemset2DAsync(C, (size_t)ldc * es, 0, (size_t)N * es, (size_t)M, stream_of(x)),
                        "cudaMemset2DAsync");
    }
    cudaDataType t;
    cublasComputeType_t ct;
    switch (dt) {   // as matmul.cu: fp32 stays fp32 (no TF32), halves accumulate in fp32
    case OM_F32: t = CUDA_R_32F; ct = CUBLAS_COMPUTE_32F; break;
    case OM_F16: t = CUDA_R_16F; ct = CUBLAS_COMPUTE_32F; break;
    case OM_BF16: t = CUDA_R_16BF; ct = CUBLAS_COMPUTE_32F; break;
    case OM_F64: t = CUDA_R_64F; ct = CUBLAS_COMPUTE_64F; break;
    default: return omc_err_dtype(ctx, 0, dt);
    }
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
        return OMC_ERR(OM_INVALID_ARGUMENT, "node '%s' (%s): GEMM dims exceed cuBLAS's int range", omc_node_name(ctx),
                       omc_op_name(ctx));
    const double one = 1.0;
    const float onef = 1.0f, betaf = (float)beta;
    const void *pa = dt == OM_F64 ? (const void *)&one : (const void *)&onef;
    const void *pb = dt == OM_F64 ? (const void *)&beta : (const void *)&betaf;
    // column-major: C^T (N, M) = op(B)^T op(A)^T
    cublasStatus_t s = cublasGemmEx((cublasHandle_t)x->cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, pa, B, t, (int)ldb, A, t,
                                    (int)lda, pb, C, c_f32 ? CUDA_R_32F : t, (int)ldc, ct, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return OMC_ERR(OM_RUNTIME, "node '%s' (%s): cublasGemmEx failed (cuBLAS status %d)", omc_node_name(ctx),
                       omc_op_name(ctx), (int)s);
    return NULL;
}

static om_status *gemm_ld(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int ta, int tb, int64_t M,
                          int64_t N, int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb, double beta,
                          void *C, int64_t ldc) {
    return gemm_ld_to(ctx, x, dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, 0);
}

// ---- attributes and geometry: ops/rnn_geom.h, shared with rnn.c -------------------------------------

// Attributes, then X, W, R (inputs 0..2): fills T, B, In, H.
static om_status *rnn_config(const om_kernel_ctx *ctx, int cell, rnn_cfg *c) {
    const om_tensor *X = &ctx->in[0], *W = &ctx->in[1], *R = &ctx->in[2];
    OMC_TRY(om_rnn_attrs(ctx->node, cell, c));
    if (W->dtype != X->dtype) return omc_err_dtype(ctx, 1, W->dtype);
    if (R->dtype != X->dtype) return omc_err_dtype(ctx, 2, R->dtype);
    return om_rnn_geometry(ctx->node, X, W, R, c);
}

// The forward's optional inputs: B, sequence_lens, initial_h, initial_c, P. The sequence lengths
// must be known at plan time: reading them here would synchronize.
static om_status *rnn_check_optional(const om_kernel_ctx *ctx, const om_cuda_exec *x, const rnn_cfg *c) {
    const om_dtype dt = ctx->in[0].dtype;
    for (int i = 3; i <= (c->cell == CELL_LSTM ? 6 : 5); i++) {
        if (!present(ctx, i)) continue;
        const om_dtype got = ctx->in[i].dtype;
        if (i == 4 ? got != OM_I32 && got != OM_I64 : got != dt) return omc_err_dtype(ctx, i, got);
    }
    const void *lens = present(ctx, 4) && x->in_host ? x->in_host[4] : NULL;
    if (present(ctx, 4) && !lens) return omc_err_unsupported(ctx, "sequence_lens that are not known at plan time");
    return om_rnn_check_optional(ctx, c, lens, 0);
}

// ---- forward kernels -------------------------------------------------------------------------------------

template <typename A> __device__ __forceinline__ A sigm(A v) { return (A)1 / ((A)1 + exp(-v)); }

// gates (rows, GH) += Wb + Rb on the first nr columns (all of LSTM's; GRU's z and r), Wb alone after
template <typename T>
__global__ void gate_bias_kernel(T *gates, const T *Wb, const T *Rb, int64_t rows, int64_t GH, int64_t nr) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(i, rows * GH) {
        const int64_t j = i % GH;
        gates[i] = st<T>(ld(gates[i]) + (ld(Wb[j]) + (j < nr ? ld(Rb[j]) : (A)0)));
    }
}

// One LSTM step. g (B, 4H): the pre-activations i, o, f, c~ (x W^T + h R^T + biases), replaced by
// their activations; cprev, c, h are (B, H): c = f cprev + i c~, h = o tanh(c)
template <typename T>
__global__ void lstm_cell_kernel(T *g, T *c, T *h, const T *cprev, int64_t B, int64_t H) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, B * H) {
        const int64_t b = k / H, j = k - b * H;
        T *gb = g + b * 4 * H;
        const A i_ = sigm(ld(gb[j])), o_ = sigm(ld(gb[H + j])), f_ = sigm(ld(gb[2 * H + j])), c_ = tanh(ld(gb[3 * H + j]));
        gb[j] = st<T>(i_), gb[H + j] = st<T>(o_), gb[2 * H + j] = st<T>(f_), gb[3 * H + j] = st<T>(c_);
        const A cn = f_ * ld(cprev[k]) + i_ * c_;
        c[k] = st<T>(cn);
        h[k] = st<T>(o_ * tanh(cn));
    }
}

// GRU step, z and r: g (B, 3H) input-side pre-activations, rec (B, 3H) the recurrent products
template <typename T>
__global__ void gru_zr_kernel(T *g, const T *rec, int64_t B, int64_t H) {
    GRID_STRIDE(k, B * 2 * H) {
        const int64_t b = k / (2 * H), at = b * 3 * H + (k - b * 2 * H);
        g[at] = st<T>(sigm(ld(g[at]) + ld(rec[at])));
    }
}

// rh (B, H) = r * hprev, r the second gate block of g (B, 3H)
template <typename T>
__global__ void gru_reset_hidden_kernel(T *rh, const T *g, const T *hprev, int64_t B, int64_t H) {
    GRID_STRIDE(k, B * H) {
        const int64_t b = k / H, j = k - b * H;
        rh[k] = st<T>(ld(g[b * 3 * H + H + j]) * ld(hprev[k]));
    }
}

// GRU step, output: hr = rec_h + Rbh (saved), h~ = tanh(gh + (lbr ? r hr : hr)) (into g's third
// block), h = (1 - z) h~ + z hprev. Without linear_before_reset rec_h already is (r hprev) Rh^T.
template <typename T>
__global__ void gru_out_kernel(T *g, T *saved, T *h, const T *rec, const T *Rb, const T *hprev, int64_t B, int64_t H,
                               int lbr) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, B * H) {
        const int64_t b = k / H, j = k - b * H;
        T *gb = g + b * 3 * H;
        const A hr = ld(rec[b * 3 * H + 2 * H + j]) + (Rb ? ld(Rb[2 * H + j]) : (A)0);
        const A hh = tanh(ld(gb[2 * H + j]) + (lbr ? ld(gb[H + j]) * hr : hr));
        gb[2 * H + j] = st<T>(hh);
        saved[k] = st<T>(hr);
        const A z = ld(gb[j]);
        h[k] = st<T>(((A)1 - z) * hh + z * ld(hprev[k]));
    }
}

// One RNN step: g (B, H) the pre-activations x W^T + h R^T + biases; h = f(g) (NaN stays NaN)
template <typename T>
__global__ void elman_cell_kernel(const T *g, T *h, int64_t n, int relu) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, n) {
        const A v = ld(g[k]);
        h[k] = st<T>(relu ? (v < (A)0 ? (A)0 : v) : tanh(v));
    }
}

// ---- forward --------------------------------------------------------------------------------------------

template <typename T>
static om_status *rnn_forward(const om_kernel_ctx *ctx, const om_cuda_exec *x, const rnn_cfg *c) {
    const om_dtype dt = ctx->in[0].dtype;
    const int lstm = c->cell == CELL_LSTM, ns = lstm ? 3 : 2;   // index of the first saved output
    const int64_t nT = c->T, B = c->B, In = c->In, H = c->H, D = c->D, GH = c->G * c->H;
    const cudaStream_t s = stream_of(x);
    const T *X = (const T *)ctx->in[0].data, *W = (const T *)ctx->in[1].data, *R = (const T *)ctx->in[2].data;
    const T *Bias = present(ctx, 3) ? (const T *)ctx->in[3].data : NULL;
    const T *h0 = present(ctx, 5) ? (const T *)ctx->in[5].data : NULL;
    const T *c0 = lstm && present(ctx, 6) ? (const T *)ctx->in[6].data : NULL;
    T *Y = wanted(ctx, 0) ? (T *)ctx->out[0].data : NULL, *Yh = wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL;
    T *Yc = lstm && wanted(ctx, 2) ? (T *)ctx->out[2].data : NULL;
    T *Sg = wanted(ctx, ns) ? (T *)ctx->out[ns].data : NULL, *Ss = wanted(ctx, ns + 1) ? (T *)ctx->out[ns + 1].data : NULL;
    // scratch: gates (T,B,GH) and states (T,B,H) when not saved, h (T,B,H) when Y is absent, zeros
    // (B,H) for absent initial states, the recurrent products (B,GH)
    const int64_t need = (Sg ? 0 : nT * B * GH) + (Ss ? 0 : nT * B * H) + (Y ? 0 : nT * B * H) + B * H + B * GH;
    T *scratch = NULL;
    OMC_TRY(omc_temp_alloc(x, sizeof(T) * (size_t)need, (void **)&scratch));
    T *p = scratch;
    T *gates_tmp = Sg ? NULL : p;
    p += Sg ? 0 : nT * B * GH;
    T *state_tmp = Ss ? NULL : p;
    p += Ss ? 0 : nT * B * H;
    T *h_tmp = Y ? NULL : p;
    p += Y ? 0 : nT * B * H;
    T *zeros = p, *rec = p + B * H;
    om_status *st = omc_cuda(cudaMemsetAsync(zeros, 0, sizeof(T) * (size_t)(B * H), s), "cudaMemsetAsync");
    for (int64_t d = 0; d < D && !st; d++) {
        const int rev = d == 1 || c->reverse0;
        const T *Wd = W + d * GH * In, *Rd = R + d * GH * H;
        const T *Wb = Bias ? Bias + d * 2 * GH : NULL, *Rb = Bias ? Bias + d * 2 * GH + GH : NULL;
        T *gates = Sg ? Sg + d * nT * B * GH : gates_tmp;
        T *states = Ss ? Ss + d * nT * B * H : state_tmp;
        // gates (T*B, GH) = X (T*B, I) @ Wd^T (GH, I) + the input-side biases
        st = gemm_ld(ctx, x, dt, 0, 1, nT * B, GH, In, X, In, Wd, In, 0.0, gates, GH);
        if (!st && Bias && nT * B > 0) {
            gate_bias_kernel<T><<<grid_for(nT * B * GH), OMC_THREADS, 0, s>>>(gates, Wb, Rb, nT * B, GH,
                                                                              c->cell == CELL_GRU ? 2 * H : GH);
            st = omc_launched(ctx);
        }
        const T *hprev = h0 ? h0 + d * B * H : zeros, *cprev = c0 ? c0 + d * B * H : zeros;
        for (int64_t step = 0; step < nT && !st; step++) {
            const int64_t t = rev ? nT - 1 - step : step;
            T *g = gates + t * B * GH, *h = Y ? Y + (t * D + d) * B * H : h_tmp + t * B * H, *sv = states + t * B * H;
            if (lstm) {
                // g (B, 4H) += hprev (B, H) @ Rd^T (H, 4H)
                st = gemm_ld(ctx, x, dt, 0, 1, B, GH, H, hprev, H, Rd, H, 1.0, g, GH);
                if (st) break;
                lstm_cell_kernel<T><<<grid_for(B * H), OMC_THREADS, 0, s>>>(g, sv, h, cprev, B, H);
                cprev = sv;
            } else if (c->cell == CELL_RNN) {
                // g (B, H) += hprev (B, H) @ Rd^T (H, H); h = f(g)
                st = gemm_ld(ctx, x, dt, 0, 1, B, GH, H, hprev, H, Rd, H, 1.0, g, GH);
                if (st) break;
                elman_cell_kernel<T><<<grid_for(B * H), OMC_THREADS, 0, s>>>(g, h, B * H, c->relu[d]);
            } else {
                // rec (B, 3H) = hprev @ Rd^T; without linear_before_reset only the z, r part now
                st = gemm_ld(ctx, x, dt, 0, 1, B, c->lbr ? GH : 2 * H, H, hprev, H, Rd, H, 0.0, rec, GH);
                if (st) break;
                gru_zr_kernel<T><<<grid_for(B * 2 * H), OMC_THREADS, 0, s>>>(g, rec, B, H);
                if (!c->lbr) {
                    // rec_h (B, H) = (r * hprev) @ Rh^T, r * hprev staged where hr is saved next
                    gru_reset_hidden_kernel<T><<<grid_for(B * H), OMC_THREADS, 0, s>>>(sv, g, hprev, B, H);
                    st = gemm_ld(ctx, x, dt, 0, 1, B, H, H, sv, H, Rd + 2 * H * H, H, 0.0, rec + 2 * H, GH);
                    if (st) break;
                }
                gru_out_kernel<T><<<grid_for(B * H), OMC_THREADS, 0, s>>>(g, sv, h, rec, Rb, hprev, B, H, c->lbr);
            }
            st = omc_launched(ctx);
            hprev = h;
        }
        if (!st && Yh) st = copy_d2d(Yh + d * B * H, hprev, sizeof(T) * (size_t)(B * H), x);
        if (!st && Yc) st = copy_d2d(Yc + d * B * H, cprev, sizeof(T) * (size_t)(B * H), x);
    }
    omc_temp_free(x, scratch);
    return st;
}

static om_status *rnn_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x, int cell) {
    rnn_cfg c;
    OMC_TRY(rnn_config(ctx, cell, &c));
    OMC_TRY(rnn_check_optional(ctx, x, &c));
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, return rnn_forward<T>(ctx, x, &c));
    return NULL;
}
om_status *lstm_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return rnn_cuda(ctx, x, CELL_LSTM); }
om_status *gru_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return rnn_cuda(ctx, x, CELL_GRU); }
om_status *elman_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return rnn_cuda(ctx, x, CELL_RNN); }

// ---- backward kernels -----------------------------------------------------------------------------------

// One LSTM step backwards, per (b, j): dh = dh_next + dy_t; from the saved activations g (B, 4H) = (i, o,
// f, c~) and the cells c, cprev: dg (B, 4H) = the pre-activation gradients; dc (B, H) carries the cell
// gradient to the step before (dc f)
template <typename T>
__global__ void lstm_grad_cell_kernel(T *dg, T *dc, const T *g, const T *cs, const T *cprev, const T *dhn, const T *dyt,
                                      int64_t B, int64_t H) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, B * H) {
        const int64_t b = k / H, j = k - b * H;
        const T *gb = g + b * 4 * H;
        T *db = dg + b * 4 * H;
        const A dh = ld(dhn[k]) + (dyt ? ld(dyt[k]) : (A)0);
        const A gi = ld(gb[j]), go = ld(gb[H + j]), gf = ld(gb[2 * H + j]), gc = ld(gb[3 * H + j]);
        const A tc = tanh(ld(cs[k]));
        const A dcell = ld(dc[k]) + dh * go * ((A)1 - tc * tc);
        db[j] = st<T>(dcell * gc * gi * ((A)1 - gi));
        db[H + j] = st<T>(dh * tc * go * ((A)1 - go));
        db[2 * H + j] = st<T>(dcell * ld(cprev[k]) * gf * ((A)1 - gf));
        db[3 * H + j] = st<T>(dcell * gi * ((A)1 - gc * gc));
        dc[k] = st<T>(dcell * gf);
    }
}

// One GRU step backwards, per (b, j): g (B, 3H) = (z, r, h~) saved, hr the saved recurrent h term.
// dg (B, 3H): input-side pre-activation gradients; dgr (B, 3H): recurrent-side ones (they differ in
// the h block: lbr multiplies by r); dhn becomes dh z (the direct path to h_{t-1}).
template <typename T>
__global__ void gru_grad_cell_kernel(T *dg, T *dgr, T *dhn, const T *g, const T *hr, const T *hprev, const T *dyt,
                                     int64_t B, int64_t H, int lbr) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, B * H) {
        const int64_t b = k / H, j = k - b * H, row = b * 3 * H;
        const A dh = ld(dhn[k]) + (dyt ? ld(dyt[k]) : (A)0);
        const A gz = ld(g[row + j]), gr = ld(g[row + H + j]), gh = ld(g[row + 2 * H + j]);
        const A ah = dh * ((A)1 - gz) * ((A)1 - gh * gh);   // d pre-activation of h~
        const A az = dh * (ld(hprev[k]) - gh) * gz * ((A)1 - gz);
        // lbr: pre_h = xw + r * hr; else pre_h = xw + hr with hr = (r hprev) Rh^T + Rbh (r's gradient follows)
        const A ar = lbr ? ah * ld(hr[k]) * gr * ((A)1 - gr) : (A)0;
        dg[row + j] = st<T>(az), dg[row + H + j] = st<T>(ar), dg[row + 2 * H + j] = st<T>(ah);
        dgr[row + j] = st<T>(az), dgr[row + H + j] = st<T>(ar), dgr[row + 2 * H + j] = st<T>(lbr ? ah * gr : ah);
        dhn[k] = st<T>(dh * gz);
    }
}

// GRU without linear_before_reset: drh = d(r hprev) (B, H) gives r's gradient and a path to h_{t-1}
template <typename T>
__global__ void gru_grad_reset_kernel(T *dg, T *dgr, T *dhn, const T *drh, const T *g, const T *hprev, int64_t B,
                                      int64_t H) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, B * H) {
        const int64_t b = k / H, at = b * 3 * H + H + (k - b * H);
        const A r = ld(g[at]), ar = ld(drh[k]) * ld(hprev[k]) * r * ((A)1 - r);
        dg[at] = st<T>(ar);
        dgr[at] = st<T>(ar);
        dhn[k] = st<T>(ld(dhn[k]) + ld(drh[k]) * r);
    }
}

// One RNN step backwards: dg (B, H) = (dh_next + dy_t) f'(pre), from the step's output h = f(pre):
// tanh 1 - h^2, relu h > 0 (relu'(0) = 0, as torch)
template <typename T>
__global__ void elman_grad_cell_kernel(T *dg, const T *h, const T *dhn, const T *dyt, int64_t n, int relu) {
    typedef typename acc<T>::t A;
    GRID_STRIDE(k, n) {
        const A dh = ld(dhn[k]) + (dyt ? ld(dyt[k]) : (A)0), hk = ld(h[k]);
        dg[k] = st<T>(relu ? (hk > (A)0 ? dh : (A)0) : dh * ((A)1 - hk * hk));
    }
}

// ---- backward --------------------------------------------------------------------------------------------

// LSTMGrad / GRUGrad / RNNGrad inputs: X, W, R, initial_h?, initial_c?, Y, gates, cells|hr, dY?, dY_h?, dY_c?
// (RNNGrad: no gates, no saved state)
static om_status *rnn_grad_check(const om_kernel_ctx *ctx, int cell, rnn_cfg *c) {
    OMC_TRY(rnn_config(ctx, cell, c));
    // input 11, the forward's sequence_lens: the CUDA forward refuses shorter sequences, so no plan
    // reaches here with them; refused by name all the same rather than ignored
    if (present(ctx, 11)) return omc_err_unsupported(ctx, "sequence_lens (the CUDA RNN kernels run full-length sequences only)");
    for (int i = 3; i < 11 && i < ctx->n_in; i++)
        if (present(ctx, i) && !(cell == CELL_RNN && (i == 6 || i == 7)) && ctx->in[i].dtype != ctx->in[0].dtype)
            return omc_err_dtype(ctx, i, ctx->in[i].dtype);
    return om_rnn_grad_check(ctx, c);
}

template <typename T>
static om_status *rnn_backward(const om_kernel_ctx *ctx, const om_cuda_exec *x, const rnn_cfg *c) {
    const om_dtype dt = ctx->in[0].dtype;
    const int lstm = c->cell == CELL_LSTM, elman = c->cell == CELL_RNN, lbr = c->lbr;
    const int64_t nT = c->T, B = c->B, In = c->In, H = c->H, D = c->D, GH = c->G * c->H, BH = B * H;
    const cudaStream_t s = stream_of(x);
    const size_t bh_bytes = sizeof(T) * (size_t)BH;
    const T *X = (const T *)ctx->in[0].data, *W = (const T *)ctx->in[1].data, *R = (const T *)ctx->in[2].data;
    const T *h0 = present(ctx, 3) ? (const T *)ctx->in[3].data : NULL;
    const T *c0 = lstm && present(ctx, 4) ? (const T *)ctx->in[4].data : NULL;
    const T *Y = (const T *)ctx->in[5].data;
    const T *Sg = elman ? NULL : (const T *)ctx->in[6].data, *Ss = elman ? NULL : (const T *)ctx->in[7].data;
    const T *dY = present(ctx, 8) ? (const T *)ctx->in[8].data : NULL;
    const T *dYh = present(ctx, 9) ? (const T *)ctx->in[9].data : NULL;
    const T *dYc = lstm && present(ctx, 10) ? (const T *)ctx->in[10].data : NULL;
    T *dX = wanted(ctx, 0) ? (T *)ctx->out[0].data : NULL, *dW = wanted(ctx, 1) ? (T *)ctx->out[1].data : NULL;
    T *dR = wanted(ctx, 2) ? (T *)ctx->out[2].data : NULL, *dB = wanted(ctx, 3) ? (T *)ctx->out[3].data : NULL;
    T *dh0 = wanted(ctx, 4) ? (T *)ctx->out[4].data : NULL, *dc0 = lstm && wanted(ctx, 5) ? (T *)ctx->out[5].data : NULL;
    // scratch: dG (T,B,GH) input-side pre-activation gradients; dGR (T,B,GH) recurrent-side ones (GRU;
    // LSTM's and RNN's are the same); dh_next, dc_next, zeros and GRU's d(r hprev) (B,H) each
    const int gru = !lstm && !elman;
    const int64_t need = (gru ? 2 : 1) * nT * B * GH + 4 * BH;
    T *scratch = NULL;
    OMC_TRY(omc_temp_alloc(x, sizeof(T) * (size_t)need, (void **)&scratch));
    T *dG = scratch, *dGR = gru ? scratch + nT * B * GH : dG;
    T *dhn = dGR + nT * B * GH, *dcn = dhn + BH, *zeros = dcn + BH, *drh = zeros + BH;
    // dR sums one GEMM per time step: fp16/bf16 sum them in fp32 and round once at the end (a half
    // running sum would round at every step and lose the late, small terms)
    typedef typename acc<T>::t Acc;
    const int r32 = dR && sizeof(T) == 2;
    const size_t r_es = r32 ? sizeof(float) : sizeof(T);
    void *dR_sum = r32 ? NULL : dR;   // (only the fp32 sum is freed at the end)
    om_status *st = NULL;
    if (r32) st = omc_temp_alloc(x, sizeof(float) * (size_t)(D * GH * H), &dR_sum);
    if (!st) st = omc_cuda(cudaMemsetAsync(zeros, 0, bh_bytes, s), "cudaMemsetAsync");
    if (!st && dR) st = omc_cuda(cudaMemsetAsync(dR_sum, 0, r_es * (size_t)(D * GH * H), s), "cudaMemsetAsync");
    for (int64_t d = 0; d < D && !st; d++) {
        const int rev = d == 1 || c->reverse0;
        const T *Wd = W + d * GH * In, *Rd = R + d * GH * H;
        const T *gates = Sg ? Sg + d * nT * B * GH : NULL, *states = Ss ? Ss + d * nT * B * H : NULL;
        char *dRd = dR ? (char *)dR_sum + (size_t)(d * GH * H) * r_es : NULL;
        st = dYh ? copy_d2d(dhn, dYh + d * BH, bh_bytes, x) : omc_cuda(cudaMemsetAsync(dhn, 0, bh_bytes, s), "cudaMemsetAsync");
        if (!st && lstm)
            st = dYc ? copy_d2d(dcn, dYc + d * BH, bh_bytes, x) : omc_cuda(cudaMemsetAsync(dcn, 0, bh_bytes, s), "cudaMemsetAsync");
        for (int64_t step = nT - 1; step >= 0 && !st; step--) {
            const int64_t t = rev ? nT - 1 - step : step;
            const int64_t tp = rev ? t + 1 : t - 1;   // the step before, in processing order
            const T *hprev = step > 0 ? Y + (tp * D + d) * BH : h0 ? h0 + d * BH : zeros;
            const T *g = gates ? gates + t * B * GH : NULL, *dyt = dY ? dY + (t * D + d) * BH : NULL;
            T *dg = dG + t * B * GH, *dgr = dGR + t * B * GH;
            if (lstm) {
                const T *cprev = step > 0 ? states + tp * BH : c0 ? c0 + d * BH : zeros;
                lstm_grad_cell_kernel<T><<<grid_for(BH), OMC_THREADS, 0, s>>>(dg, dcn, g, states + t * BH, cprev, dhn,
                                                                              dyt, B, H);
                // dh_next (B, H) = dg (B, 4H) @ Rd (4H, H)
                st = gemm_ld(ctx, x, dt, 0, 0, B, H, GH, dg, GH, Rd, H, 0.0, dhn, H);
            } else if (elman) {
                elman_grad_cell_kernel<T><<<grid_for(BH), OMC_THREADS, 0, s>>>(dg, Y + (t * D + d) * BH, dhn, dyt, BH,
                                                                               c->relu[d]);
                // dh_next (B, H) = dg (B, H) @ Rd (H, H)
                st = gemm_ld(ctx, x, dt, 0, 0, B, H, GH, dg, GH, Rd, H, 0.0, dhn, H);
            } else {
                gru_grad_cell_kernel<T><<<grid_for(BH), OMC_THREADS, 0, s>>>(dg, dgr, dhn, g, states + t * BH, hprev,
                                                                             dyt, B, H, lbr);
                if (lbr) {
                    // dh_next += dgr (B, 3H) @ Rd (3H, H)
                    st = gemm_ld(ctx, x, dt, 0, 0, B, H, GH, dgr, GH, Rd, H, 1.0, dhn, H);
                } else {
                    // d(r hprev) (B, H) = dh~pre (B, H) @ Rh (H, H); then r's gradient and dh_next through r hprev
                    st = gemm_ld(ctx, x, dt, 0, 0, B, H, H, dgr + 2 * H, GH, Rd + 2 * H * H, H, 0.0, drh, H);
                    if (!st) {
                        gru_grad_reset_kernel<T><<<grid_for(BH), OMC_THREADS, 0, s>>>(dg, dgr, dhn, drh, g, hprev, B, H);
                        // dh_next += (dz, dr) (B, 2H) @ Rd[0:2H] (2H, H)
                        st = gemm_ld(ctx, x, dt, 0, 0, B, H, 2 * H, dgr, GH, Rd, H, 1.0, dhn, H);
                    }
                }
            }
            if (!st && dRd && (step > 0 || h0)) {   // h_{t-1} = 0 adds nothing to dR
                if (gru && !lbr) {
                    // dR[0:2H] += (dz, dr)^T @ hprev; dRh += dh~pre^T @ (r hprev)
                    st = gemm_ld_to(ctx, x, dt, 1, 0, 2 * H, H, B, dgr, GH, hprev, H, 1.0, dRd, H, r32);
                    if (!st) {
                        gru_reset_hidden_kernel<T><<<grid_for(BH), OMC_THREADS, 0, s>>>(drh, g, hprev, B, H);
                        st = gemm_ld_to(ctx, x, dt, 1, 0, H, H, B, dgr + 2 * H, GH, drh, H, 1.0,
                                        dRd + (size_t)(2 * H * H) * r_es, H, r32);
                    }
                } else {
                    // dRd (GH, H) += dgr^T (GH, B) @ hprev (B, H)
                    st = gemm_ld_to(ctx, x, dt, 1, 0, GH, H, B, dgr, GH, hprev, H, 1.0, dRd, H, r32);
                }
            }
            if (!st) st = omc_launched(ctx);
        }
        if (!st && dh0) st = copy_d2d(dh0 + d * BH, dhn, bh_bytes, x);
        if (!st && dc0) st = copy_d2d(dc0 + d * BH, dcn, bh_bytes, x);
        // dX (T*B, I) (+)= dG (T*B, GH) @ Wd (GH, I); dW[d] (GH, I) = dG^T @ X (T*B, I)
        if (!st && dX) st = gemm_ld(ctx, x, dt, 0, 0, nT * B, In, GH, dG, GH, Wd, In, d ? 1.0 : 0.0, dX, In);
        if (!st && dW) st = gemm_ld(ctx, x, dt, 1, 0, GH, In, nT * B, dG, GH, X, In, 0.0, dW + d * GH * In, In);
        if (!st && dB) {
            st = omc_column_sum(ctx, x, dt, dB + d * 2 * GH, dG, nT * B, GH, 0);
            if (!st) st = omc_column_sum(ctx, x, dt, dB + d * 2 * GH + GH, dGR, nT * B, GH, 0);
        }
    }
    if (r32) {
        if (!st) {
            omc_round_kernel<T><<<grid_for(D * GH * H), OMC_THREADS, 0, s>>>(dR, (const Acc *)dR_sum, D * GH * H);
            st = omc_launched(ctx);
        }
        omc_temp_free(x, dR_sum);
    }
    omc_temp_free(x, scratch);
    return st;
}

static om_status *rnn_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x, int cell) {
    rnn_cfg c;
    OMC_TRY(rnn_grad_check(ctx, cell, &c));
    OMC_DISPATCH_FLOAT(ctx->in[0].dtype, ctx, 0, return rnn_backward<T>(ctx, x, &c));
    return NULL;
}
om_status *lstm_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return rnn_grad_cuda(ctx, x, CELL_LSTM); }
om_status *gru_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return rnn_grad_cuda(ctx, x, CELL_GRU); }
om_status *elman_grad_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) { return rnn_grad_cuda(ctx, x, CELL_RNN); }
