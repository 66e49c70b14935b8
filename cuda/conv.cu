// conv.cu — conv.c's ops on the CUDA provider: Conv and its backward ops ConvGradX / ConvGradW;
// ConvTranspose, which is ConvGradX's pass (the input gradient of the convolution whose geometry
// om_window_init_transposed gives). The pooling ops are in pool.cu, BatchNormalization in norm.cu.
//
// Convolution is im2col + cuBLAS, as on the CPU, but over a chunk of images at a time:
//   col   (nb, C*KS, OS)      = im2col(x)                     KS = kernel size, OS = output size
//   y     [n, g] (Mg, OS)     = W_g (Mg, Cg*KS) @ col[n, g]   one strided-batched GEMM per group
//   dcol  [n, g] (Cg*KS, OS)  = W_g^T @ dy[n, g]              then dx = col2im(dcol), a gather
//   dW_g  (Mg, Cg*KS)        += dy_g (Mg, nb*OS) @ col_g^T    col laid out (C*KS, nb*OS) and dy
//                                                            transposed to (M, nb*OS): the batch
//                                                            sum happens inside the GEMM
// A 1x1 kernel with stride 1 and no padding needs no im2col in the forward and ConvGradX.
// col2im is a gather (each input element sums the outputs whose window holds it), so it needs no
// atomics and no zero fill; dB uses one block per channel; elementwise passes are grid-stride loops.
#include <math.h>

#include "common.cuh"

// spatial.h (window geometry: kernel, strides, dilations, pads, auto_pad, ceil_mode, shared with
// conv.c and pool.c) calls the engine's attribute and error functions. The provider reaches the
// engine only through om_cuda_host (the extension's symbols are hidden), so this file maps those
// names onto the host table: both providers resolve a window, and check a convolution's channels
// and groups (conv_geom.h), with the same code.
#define om_error(...) g_host.error(__VA_ARGS__)
#define om_attr_int(n, name, d) g_host.attr_int((n), (name), (d))
#define om_attr_ints(n, name, v) g_host.attr_ints((n), (name), (v))
#define om_attr_string(n, name, d) g_host.attr_string((n), (name), (d))
#include "ops/spatial.h"
#include "ops/conv_geom.h"
#include "window.cuh"

// scratch for im2col is taken in chunks of images of at most this many bytes (the CUDA emulator
// test builds with a few KiB, so that small convolutions take several chunks)
#ifndef CONV_SCRATCH_BYTES
#define CONV_SCRATCH_BYTES ((size_t)256 << 20)
#endif

static om_status *zero_fill(void *p, size_t n, const om_cuda_exec *x) {
    if (!n) return NULL;
    return omc_cuda(cudaMemsetAsync(p, 0, n, stream_of(x)), "cudaMemsetAsync");
}

static int64_t images_per_chunk(int64_t N, size_t per_image) {
    int64_t nb = per_image ? (int64_t)(CONV_SCRATCH_BYTES / per_image) : N;
    if (nb < 1) nb = 1;
    return nb < N ? nb : N;
}

// ---- im2col / col2im --------------------------------------------------------------------------

// x is (nb, C, ID, IH, IW); row r = c*KS + kk of image n goes to col[n*img_stride + r*row_stride + o]
// for o < OS: (nb, C*KS, OS) with img_stride = C*KS*OS, row_stride = OS, or (C*KS, nb*OS) with
// img_stride = OS, row_stride = nb*OS. Taps in the padding read 0. Element moves only: by size.
template <typename U>
__global__ void im2col_kernel(U *col, const U *x, om_window w, int64_t nb, int64_t C, int64_t img_stride,
                              int64_t row_stride) {
    const int64_t OS = w.out[0] * w.out[1] * w.out[2], KS = w.k[0] * w.k[1] * w.k[2];
    const int64_t IS = w.in[0] * w.in[1] * w.in[2];
    GRID_STRIDE(i, nb * C * KS * OS) {
        const int64_t o = i % OS, t = i / OS, kk = t % KS, p = t / KS;   // p = n*C + c
        const int64_t n = p / C, c = p - n * C;
        int64_t od, oh, ow;
        out_coords(w, o, &od, &oh, &ow);
        const int64_t kw = kk % w.k[2], kh = (kk / w.k[2]) % w.k[1], kd = kk / (w.k[2] * w.k[1]);
        const int64_t id = od * w.s[0] - w.pb[0] + kd * w.d[0];
        const int64_t ih = oh * w.s[1] - w.pb[1] + kh * w.d[1];
        const int64_t iw = ow * w.s[2] - w.pb[2] + kw * w.d[2];
        U v = (U)0;
        if (id >= 0 && id < w.in[0] && ih >= 0 && ih < w.in[1] && iw >= 0 && iw < w.in[2])
            v = x[p * IS + (id * w.in[1] + ih) * w.in[2] + iw];
        col[n * img_stride + (c * KS + kk) * row_stride + o] = v;
    }
}

static om_status *im2col(const om_kernel_ctx *ctx, const om_cuda_exec *x, size_t es, void *col, const void *src,
                         const om_window *w, int64_t nb, int64_t C, int64_t img_stride, int64_t row_stride) {
    const int64_t n = nb * C * om_window_k_size(w) * om_window_out_size(w);
    if (!n) return NULL;
    OMC_DISPATCH_SIZE(es, ctx, {
        im2col_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)col, (const U *)src, *w, nb, C, img_stride,
                                                                        row_stride);
    });
    return omc_launched(ctx);
}

// dcol is (nb, C*KS, OS) in T's math type (fp32 for fp16/bf16: the GEMM's sums are rounded once,
// here), dx is (nb, C, ID, IH, IW): dx[p, s] = sum of the dcol entries whose tap is s, plus b[c]
// when b is given (ConvTranspose's bias, C values)
template <typename T>
__global__ void col2im_kernel(T *dx, const typename acc<T>::t *dcol, om_window w, int64_t P, const T *b,
                              int64_t C) {
    typedef typename acc<T>::t A;
    const int64_t OS = w.out[0] * w.out[1] * w.out[2], KS = w.k[0] * w.k[1] * w.k[2];
    const int64_t IS = w.in[0] * w.in[1] * w.in[2];
    GRID_STRIDE(i, P * IS) {
        const int64_t s = i % IS, p = i / IS;
        const int64_t iw = s % w.in[2], ih = (s / w.in[2]) % w.in[1], id = s / (w.in[2] * w.in[1]);
        const A *cp = dcol + p * KS * OS;   // channel c of image n: rows (n*C + c)*KS ...
        A sum = b ? (A)ld(b[p % C]) : (A)0;
        for_windows_of(w, id, ih, iw, [&](int64_t k, int64_t od, int64_t oh, int64_t ow) {
            sum += cp[k * OS + (od * w.out[1] + oh) * w.out[2] + ow];
        });
        dx[i] = st<T>(sum);
    }
}

// ---- GEMMs over (image, group) ------------------------------------------------------------------

// An operand of the per-(image, group) products: base pointer and element strides per image and group.
struct ig_operand {
    const void *p;
    int64_t sn, sg;
};

// O[n, g] = op(P[n, g]) op(Q[n, g]) + beta O[n, g] for n < nb, g < G: one strided-batched GEMM per
// group (batch over images), or per image (batch over groups) when there are more groups than
// images. o_f32: O is fp32 while P and Q are fp16/bf16.
static om_status *gemm_images_groups(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, int tp, int tq,
                                     int64_t M, int64_t N, int64_t K, ig_operand P, ig_operand Q, double beta,
                                     ig_operand O, int o_f32, int64_t nb, int64_t G) {
    const size_t es = dtype_size(dt), eo = o_f32 ? sizeof(float) : es;
#define IG_AT(op, i, s, e) ((const char *)(op).p + (size_t)((i) * (op).s) * (e))
#define IG_GEMM(idx, s_batch, s_step, count)                                                                     \
    (o_f32 ? omc_gemm_f32_out(ctx, x, dt, tp, tq, M, N, K, 1.0, IG_AT(P, idx, s_step, es), P.s_batch,             \
                              IG_AT(Q, idx, s_step, es), Q.s_batch, beta, (float *)IG_AT(O, idx, s_step, eo),     \
                              O.s_batch, count)                                                                  \
           : omc_gemm(ctx, x, dt, tp, tq, M, N, K, 1.0, IG_AT(P, idx, s_step, es), P.s_batch,                     \
                      IG_AT(Q, idx, s_step, es), Q.s_batch, beta, (void *)IG_AT(O, idx, s_step, eo), O.s_batch,   \
                      count))
    if (nb >= G) {
        for (int64_t g = 0; g < G; g++) OMC_TRY(IG_GEMM(g, sn, sg, nb));
    } else {
        for (int64_t n = 0; n < nb; n++) OMC_TRY(IG_GEMM(n, sg, sn, G));
    }
#undef IG_GEMM
#undef IG_AT
    return NULL;
}

// ---- per-channel helpers ------------------------------------------------------------------------

// y is (N, M, S): y = b[m] (the GEMM then adds its product with beta 1: one rounding for both)
template <typename U>
__global__ void channel_fill_kernel(U *y, const U *b, int64_t M, int64_t S, int64_t n) {
    GRID_STRIDE(i, n) y[i] = b[(i / S) % M];
}

// dy is (N, M, S): out[m] = sum over (n, s) of dy — one block per channel
template <typename T>
__global__ void channel_sum_kernel(T *out, const T *dy, int64_t N, int64_t M, int64_t S) {
    typedef typename acc<T>::t A;
    for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
        A s = 0;
        for (int64_t i = threadIdx.x; i < N * S; i += blockDim.x) {
            const int64_t n = i / S, k = i - n * S;
            s += ld(dy[(n * M + m) * S + k]);
        }
        s = block_sum(s);
        if (threadIdx.x == 0) out[m] = st<T>(s);
    }
}

// dy (N, M, S) -> db (M)
static om_status *channel_sum(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, void *db, const void *dy,
                              int64_t N, int64_t M, int64_t S) {
    if (!M) return NULL;
    OMC_DISPATCH_FLOAT(dt, ctx, 0, {
        channel_sum_kernel<T><<<channel_blocks(M), 256, 0, stream_of(x)>>>((T *)db, (const T *)dy, N, M, S);
    });
    return omc_launched(ctx);
}

// ---- Conv --------------------------------------------------------------------------------------

// x is (N, C, *S), w is (M, C/G, *K), b is (M), y is (N, M, *O)
om_status *conv_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *W = &ctx->in[1], *Y = &ctx->out[0];
    if (W->dtype != X->dtype) return omc_err_dtype(ctx, 1, W->dtype);
    conv_geom g;
    OMC_TRY(om_conv_geometry(ctx->node, X->rank, X->dims, W->rank, W->dims, &g));
    if (!numel(Y)) return NULL;
    const om_dtype dt = X->dtype;
    const size_t es = dtype_size(dt);
    const int64_t N = g.w.N, C = g.w.C, CK = g.Cg * g.KS, col_img = C * g.KS * g.OS;
    const int trivial = om_conv_window_trivial(&g.w);
    int64_t nb = trivial ? N : images_per_chunk(N, (size_t)col_img * es);
    const int has_b = present(ctx, 2);
    if (has_b) {
        if (ctx->in[2].dtype != dt) return omc_err_dtype(ctx, 2, ctx->in[2].dtype);
        const int64_t n = numel(Y);
        OMC_DISPATCH_SIZE(es, ctx, {
            channel_fill_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)Y->data,
                                                                                  (const U *)ctx->in[2].data, g.M,
                                                                                  g.OS, n);
        });
        OMC_TRY(omc_launched(ctx));
    }
    void *col = NULL;
    if (!trivial) OMC_TRY(omc_temp_alloc(x, (size_t)(nb * col_img) * es, &col));
    om_status *st = NULL;
    for (int64_t n0 = 0; n0 < N && !st; n0 += nb) {
        const int64_t cnt = nb < N - n0 ? nb : N - n0;
        const void *xs = (const char *)X->data + (size_t)(n0 * C * g.IS) * es;
        // trivial: x itself is the column matrix, (C, OS) per image with OS == IS
        if (!trivial) st = im2col(ctx, x, es, col, xs, &g.w, cnt, C, col_img, g.OS);
        ig_operand P = {W->data, 0, g.Mg * CK};
        ig_operand Q = {trivial ? xs : col, col_img, CK * g.OS};
        ig_operand O = {(char *)Y->data + (size_t)(n0 * g.M * g.OS) * es, g.M * g.OS, g.Mg * g.OS};
        if (!st) st = gemm_images_groups(ctx, x, dt, 0, 0, g.Mg, g.OS, CK, P, Q, has_b ? 1.0 : 0.0, O, 0, cnt, g.G);
    }
    if (col) omc_temp_free(x, col);
    return st;
}

// The input-gradient pass of the convolution of geometry g: dx (N, C, *S) = col2im(W^T @ dy), dy
// (N, M, *O), w (M, C/G, *K) — ConvGradX, and ConvTranspose with its x as dy and its y as dx. b:
// NULL, or C values added to every dx[n, c, :] (ConvTranspose's bias; in the GEMM with beta 1 for
// a 1x1 window, else in col2im's sum: one rounding either way).
static om_status *conv_data_grad(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, const conv_geom &g,
                                 const void *dy, const void *w, const void *b, void *dx) {
    const size_t es = dtype_size(dt);
    const int64_t N = g.w.N, C = g.w.C, CK = g.Cg * g.KS, col_img = C * g.KS * g.OS;
    const int trivial = om_conv_window_trivial(&g.w), no_tap = !trivial && (g.OS == 0 || CK == 0);   // no tap reaches dx
    if (no_tap && !b) return zero_fill(dx, (size_t)(N * C * g.IS) * es, x);
    if (b && (trivial || no_tap)) {   // dx = b, then the GEMM adds (beta 1)
        const int64_t n = N * C * g.IS;
        OMC_DISPATCH_SIZE(es, ctx, {
            channel_fill_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((U *)dx, (const U *)b, C, g.IS, n);
        });
        OMC_TRY(omc_launched(ctx));
        if (no_tap) return NULL;
    }
    // dcol in dY's math type: fp16/bf16 columns are fp32, rounded once by col2im
    const int col32 = !trivial && om_dtype_is_half(dt);
    const size_t ec = col32 ? sizeof(float) : es;
    int64_t nb = trivial ? N : images_per_chunk(N, (size_t)col_img * ec);
    void *col = NULL;
    if (!trivial) OMC_TRY(omc_temp_alloc(x, (size_t)(nb * col_img) * ec, &col));
    om_status *st = NULL;
    for (int64_t n0 = 0; n0 < N && !st; n0 += nb) {
        const int64_t cnt = nb < N - n0 ? nb : N - n0;
        char *dxs = (char *)dx + (size_t)(n0 * C * g.IS) * es;
        // dcol[n, g] (CK, OS) = W_g^T (CK, Mg) @ dy[n, g] (Mg, OS); trivial: dcol is dx itself
        ig_operand P = {w, 0, g.Mg * CK};
        ig_operand Q = {(const char *)dy + (size_t)(n0 * g.M * g.OS) * es, g.M * g.OS, g.Mg * g.OS};
        ig_operand O = {trivial ? (void *)dxs : col, col_img, CK * g.OS};
        st = gemm_images_groups(ctx, x, dt, 1, 0, CK, g.OS, g.Mg, P, Q, b && trivial ? 1.0 : 0.0, O, col32, cnt, g.G);
        if (!st && !trivial) {
            const int64_t P_ = cnt * C, n = P_ * g.IS;
            OMC_DISPATCH_FLOAT(dt, ctx, 0, {
                col2im_kernel<T><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>((T *)dxs, (const A *)col, g.w, P_,
                                                                                (const T *)b, C);
            });
            st = omc_launched(ctx);
        }
    }
    if (col) omc_temp_free(x, col);
    return st;
}

// ConvGradX(dY, W, Shape(X)): dy is (N, M, *O), w is (M, C/G, *K), dx is (N, C, *S)
om_status *conv_grad_x_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dY = &ctx->in[0], *W = &ctx->in[1], *dX = &ctx->out[0];
    if (W->dtype != dY->dtype) return omc_err_dtype(ctx, 1, W->dtype);
    conv_geom g;
    OMC_TRY(om_conv_geometry(ctx->node, dX->rank, dX->dims, W->rank, W->dims, &g));
    if (!numel(dX)) return NULL;
    return conv_data_grad(ctx, x, dY->dtype, g, dY->data, W->data, NULL, dX->data);
}

// ---- ConvTranspose ------------------------------------------------------------------------------

// x is (N, C_in, *S), w is (C_in, C_out/G, *K), b is (C_out), y is (N, C_out, *O): ConvGradX's pass, x as dy
om_status *conv_transpose_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *X = &ctx->in[0], *W = &ctx->in[1], *Y = &ctx->out[0];
    if (W->dtype != X->dtype) return omc_err_dtype(ctx, 1, W->dtype);
    const int has_b = present(ctx, 2);
    if (has_b && ctx->in[2].dtype != X->dtype) return omc_err_dtype(ctx, 2, ctx->in[2].dtype);
    conv_geom g;
    OMC_TRY(om_convt_geometry(ctx->node, X->rank, X->dims, W->rank, W->dims, &g));
    if (!numel(Y)) return NULL;
    return conv_data_grad(ctx, x, X->dtype, g, X->data, W->data, has_b ? ctx->in[2].data : NULL, Y->data);
}

// dy is (nb, M, OS) -> dyT (M, nb*OS)
template <typename U>
__global__ void images_to_columns_kernel(U *dyT, const U *dy, int64_t nb, int64_t M, int64_t OS) {
    GRID_STRIDE(i, nb * M * OS) {
        const int64_t o = i % OS, t = i / OS, n = t % nb, m = t / nb;   // i walks dyT
        dyT[i] = dy[(n * M + m) * OS + o];
    }
}

// ConvGradW(dY, X?, Shape(W)) -> dW, dB?: dy is (N, M, *O), x is (N, C, *S), dw is (M, C/G, *K), db is (M)
om_status *conv_grad_w_cuda(const om_kernel_ctx *ctx, const om_cuda_exec *x) {
    const om_tensor *dY = &ctx->in[0], *X = &ctx->in[1];
    const om_dtype dt = dY->dtype;
    const size_t es = dtype_size(dt);
    if (wanted(ctx, 0) && !present(ctx, 1)) {
        OMC_TRY(zero_fill(ctx->out[0].data, nbytes(&ctx->out[0]), x));   // as conv.c: no X, no dW
    } else if (wanted(ctx, 0)) {
        const om_tensor *dW = &ctx->out[0];
        if (X->dtype != dt) return omc_err_dtype(ctx, 1, X->dtype);
        conv_geom g;
        OMC_TRY(om_conv_geometry(ctx->node, X->rank, X->dims, dW->rank, dW->dims, &g));
        const int64_t N = g.w.N, C = g.w.C, CK = g.Cg * g.KS;
        if (N == 0 || g.OS == 0) {
            OMC_TRY(zero_fill(dW->data, nbytes(dW), x));
        } else if (numel(dW)) {
            // per image: col (C*KS) x OS and dy^T M x OS, both laid out with the images side by side
            const int64_t nb = images_per_chunk(N, (size_t)((C * g.KS + g.M) * g.OS) * es);
            // fp16/bf16 over several chunks: the chunks' products are summed in fp32, rounded once
            const int acc32 = om_dtype_is_half(dt) && nb < N;
            void *col = NULL, *dyT = NULL, *dw32 = NULL;
            OMC_TRY(omc_temp_alloc(x, (size_t)(nb * C * g.KS * g.OS) * es, &col));
            om_status *st = omc_temp_alloc(x, (size_t)(nb * g.M * g.OS) * es, &dyT);
            if (!st && acc32) st = omc_temp_alloc(x, sizeof(float) * (size_t)numel(dW), &dw32);
            for (int64_t n0 = 0; n0 < N && !st; n0 += nb) {
                const int64_t cnt = nb < N - n0 ? nb : N - n0, wide = cnt * g.OS;
                st = im2col(ctx, x, es, col, (const char *)X->data + (size_t)(n0 * C * g.IS) * es, &g.w, cnt, C, g.OS,
                            wide);
                if (st) break;
                const int64_t n = cnt * g.M * g.OS;
                OMC_DISPATCH_SIZE(es, ctx, {
                    images_to_columns_kernel<U><<<grid_for(n), OMC_THREADS, 0, stream_of(x)>>>(
                        (U *)dyT, (const U *)((const char *)dY->data + (size_t)(n0 * g.M * g.OS) * es), cnt, g.M, g.OS);
                });
                if ((st = omc_launched(ctx))) break;
                // dW_g (Mg, CK) (+)= dyT_g (Mg, cnt*OS) @ col_g^T (cnt*OS, CK), batched over the groups
                if (acc32)
                    st = omc_gemm_f32_out(ctx, x, dt, 0, 1, g.Mg, CK, wide, 1.0, dyT, g.Mg * wide, col, CK * wide,
                                          n0 ? 1.0 : 0.0, (float *)dw32, g.Mg * CK, g.G);
                else
                    st = omc_gemm(ctx, x, dt, 0, 1, g.Mg, CK, wide, 1.0, dyT, g.Mg * wide, col, CK * wide,
                                  n0 ? 1.0 : 0.0, dW->data, g.Mg * CK, g.G);
            }
            if (dw32) {
                if (!st) {
                    OMC_DISPATCH_FLOAT(dt, ctx, 0, {
                        omc_round_kernel<T><<<grid_for(numel(dW)), OMC_THREADS, 0, stream_of(x)>>>(
                            (T *)dW->data, (const A *)dw32, numel(dW));
                    });
                    st = omc_launched(ctx);
                }
                omc_temp_free(x, dw32);
            }
            if (dyT) omc_temp_free(x, dyT);
            omc_temp_free(x, col);
            OMC_TRY(st);
        }
    }
    if (wanted(ctx, 1)) {
        if (dY->rank < 3) return omc_err_unsupported(ctx, "dY of rank < 3");
        const int64_t N = dY->dims[0], M = dY->dims[1], S = N > 0 && M > 0 ? numel(dY) / (N * M) : 0;
        OMC_TRY(channel_sum(ctx, x, dt, ctx->out[1].data, dY->data, N, M, S));
    }
    return NULL;
}
