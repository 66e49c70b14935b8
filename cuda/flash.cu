// flash.cu — FusedAttention and its gradient for fp16/bf16 on tensor cores (WMMA), without the
// (L, S) score matrix ever reaching device memory: per block, tiles of Q, K, V (and dO) are
// staged in shared memory, each warp multiplies 16-row slices with 16x16x16 fragments, and the
// softmax runs on the fp32 products in shared memory. attention.cu's cuBLAS path (scores
// materialized in fp32) takes fp32 inputs, head dims over FLASH_MAX_D, and every call when
// ORTMOD_CUDA_ATTENTION=materialized.
//
// Forward, per block of BR query rows (16 per warp), two sweeps over the keys in tiles of BC:
//   1. S = Q K^T: the running max m and sum l of exp(logit - m) per row, then lse = m + log l;
//   2. S again, P = exp(logit - lse) (dropped out as the CPU draws it), O += P V in fp32
//      fragments that stay in registers.
// The second product of S costs a third more tensor-core work than an online rescale would, but
// a fragment's rows are opaque under WMMA: rescaling O by row would send it through shared memory
// every tile. Backward, as two kernels that need no atomics:
//   dQ  per block of BR query rows, over key tiles: P from lse, dP = dO V^T,
//       dS = P (dP keep/(1-ratio) - Di), dQ += scale dS K;
//   dKV per block of BK keys (16 per warp), over query tiles of BQ rows: the same P, dP and dS
//       transposed (keys as rows), dV += Pd^T dO, dK += scale dS^T Q.
// Di = rowsum(dO * O) comes from attention.cu. The logits, causal rule, masks, dropout stream and
// fully-masked rows (NaN, or 0 with nan_to_zero) are attention.cu's (attention.cuh's logit()).
//
// Tiles: head dims are padded with zeros to DM = 64 or 128; 4 warps for DM 64, 2 for DM 128, so
// that each kernel's static shared memory stays under 48 KiB. Padded rows and key columns read
// zeros and get -inf logits. Each lane owns half a row (16 entries) of its warp's 16-row slice,
// and walks it starting at a column rotated by its row (no shared-memory bank conflicts).
#include <mma.h>

#include "attention.cuh"

using namespace nvcuda;

#define FL_BC 32   // keys per tile (forward, dQ); query rows per tile (dKV)
// Row stride of each warp's 16-row score tiles: the fp32 products S and dP (floats) and the T tiles
// P, dS written over S (elements). 8 past FL_BC: fragment stores then meet 2 rows per bank
// (8 at 32), fragment loads of P none (4), the lanes' rotated reads none.
#define FL_SLD (FL_BC + 8)

template <int DM> struct flash_tile {
    // staged rows are DM + 8 elements apart: at DM's 128 or 256 bytes every row of a 16x16
    // fragment load would start in the same shared-memory bank
    static const int LD = DM + 8;
    static const int WARPS = DM == 128 ? 2 : 4;
    static const int THREADS = 32 * WARPS;
    static const int ROWS = 16 * WARPS;   // query rows (forward, dQ) or keys (dKV) per block
};

template <typename T> __device__ __forceinline__ T zero_of() { return st<T>(0.0f); }

// rows [r0, r0 + R) of an (n, d) row-major matrix into dst (R, DM) at row stride DM + 8, zeros
// past n rows or d columns; tr: the matrix is given transposed, (d, n) row-major
template <typename T, int R, int DM>
__device__ __forceinline__ void stage_rows(T *dst, const T *src, int64_t r0, int64_t n, int64_t d, int tr) {
    const int LD = flash_tile<DM>::LD;
    if (!tr && d == DM && ((uintptr_t)src & 15) == 0) {   // whole rows: 16-byte loads (8 elements)
        const int CH = DM / 8;
        for (int e = threadIdx.x; e < R * CH; e += blockDim.x) {
            const int r = e / CH, ch = e - r * CH;
            const int64_t gr = r0 + r;
            const uint4 zero = make_uint4(0, 0, 0, 0);
            *(uint4 *)(dst + r * LD + ch * 8) = gr < n ? *(const uint4 *)(src + gr * d + ch * 8) : zero;
        }
        return;
    }
    for (int e = threadIdx.x; e < R * DM; e += blockDim.x) {
        // neighbouring threads read neighbouring elements: along a row, or down a column of src^T
        const int r = tr ? e % R : e / DM, c = tr ? e / R : e - r * DM;
        const int64_t gr = r0 + r;
        dst[r * LD + c] = gr < n && c < d ? src[tr ? c * n + gr : gr * d + c] : zero_of<T>();
    }
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;
template <typename T> using frag_a = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T> using frag_at = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T> using frag_b = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T> using frag_bt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

// out (16, 16 * NT) fp32 at ldo = A (16, 16 * KT) row-major at lda times B^T, B (16 * NT, 16 * KT)
// row-major at ldb: the 16 x N slice of a product of two staged tiles that share their inner dim
template <typename T, int KT, int NT>
__device__ __forceinline__ void mma_abt(float *out, int ldo, const T *A, int lda, const T *B, int ldb) {
    frag_acc c[NT];
    for (int j = 0; j < NT; j++) wmma::fill_fragment(c[j], 0.0f);
    for (int k = 0; k < KT; k++) {
        frag_a<T> a;
        wmma::load_matrix_sync(a, A + k * 16, lda);
        for (int j = 0; j < NT; j++) {
            frag_bt<T> b;
            wmma::load_matrix_sync(b, B + j * 16 * ldb + k * 16, ldb);
            wmma::mma_sync(c[j], a, b, c[j]);
        }
    }
    for (int j = 0; j < NT; j++) wmma::store_matrix_sync(out + j * 16, c[j], ldo, wmma::mem_row_major);
}

// acc[NT] (16, 16 * NT) += A (16, 16 * KT) at lda times B (16 * KT, 16 * NT) at ldb, both row-major
template <typename T, int KT, int NT>
__device__ __forceinline__ void mma_ab_acc(frag_acc *acc, const T *A, int lda, const T *B, int ldb) {
    for (int k = 0; k < KT; k++) {
        frag_a<T> a;
        wmma::load_matrix_sync(a, A + k * 16, lda);
        for (int j = 0; j < NT; j++) {
            frag_b<T> b;
            wmma::load_matrix_sync(b, B + k * 16 * ldb + j * 16, ldb);
            wmma::mma_sync(acc[j], a, b, acc[j]);
        }
    }
}

// Writes acc (16, 16 * NT) times scale to rows [r0, r0 + 16) of dst (n, d) — or of dst^T (d, n)
// when tr — through the warp's 16x16 fp32 staging area, skipping padding
template <typename T, int NT>
__device__ __forceinline__ void write_rows(T *dst, const frag_acc *acc, float *stage, float scale, int64_t r0,
                                           int64_t n, int64_t d, int tr) {
    const int lane = threadIdx.x & 31;
    for (int j = 0; j < NT; j++) {
        wmma::store_matrix_sync(stage, acc[j], 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            const int r = tr ? e & 15 : e >> 4, c = tr ? e >> 4 : e & 15;   // coalesced either way
            const int64_t gr = r0 + r, gc = j * 16 + c;
            if (gr < n && gc < d) dst[tr ? gc * n + gr : gr * d + gc] = st<T>(stage[r * 16 + c] * scale);
        }
        __syncwarp();
    }
}

__device__ __forceinline__ float keep_of(const soft_args &a, uint64_t seed, int64_t flat) {
    return a.dropout ? (rand_uniform(seed, (uint64_t)flat) >= a.ratio ? a.dscale : 0.0f) : 1.0f;
}

// The backward at score (b, i, j), s = q_i . k_j and dp = dO_i . v_j: *pd = P keep/(1-ratio) (what
// multiplied V) and the return dS = P (dp keep/(1-ratio) - Di), P recomputed from lse (NaN: 0)
template <typename T>
__device__ __forceinline__ float score_grad(const soft_args &a, float s, float dp, float lse, float di, const T *mask,
                                            int64_t mb, int64_t b, int64_t i, int64_t j, uint64_t seed, float *pd) {
    float p = expf(logit(a, s, mask, mb, i, j) - lse);
    if (p != p) p = 0.0f;
    const float kp = keep_of(a, seed, (b * a.L + i) * a.S + j);
    *pd = p * kp;
    return p * (dp * kp - di);
}

// ---- forward ---------------------------------------------------------------------------------------

// grid (ceil(L / ROWS), B); Q (B, L, D), K (B, S, D) or K^T, V (B, S, Dv) -> O (B, L, Dv), lse (B, L)
template <typename T, int DM>
__global__ void __launch_bounds__(flash_tile<DM>::THREADS)
flash_fwd_kernel(T *O, float *lse, const T *Q, const T *K, const T *V, const T *mask, flash_args f,
                 const int64_t *seedp) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    typedef flash_tile<DM> tile;
    __shared__ __align__(32) T sQ[tile::ROWS * tile::LD];
    __shared__ __align__(32) T sK[FL_BC * tile::LD];
    __shared__ __align__(32) T sV[FL_BC * tile::LD];
    __shared__ __align__(32) float sS[tile::WARPS][16 * FL_SLD];
    const soft_args &a = f.a;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 16;
    const int64_t b = blockIdx.y, q0 = (int64_t)blockIdx.x * tile::ROWS, i = q0 + 16 * w + r;
    const T *Qb = Q + b * f.q_bs, *Kb = K + b * f.k_bs, *Vb = V + b * f.v_bs;
    const int64_t mb = mask ? mask_base(a, b) : 0;
    const uint64_t seed = seedp ? (uint64_t)*seedp : 0;
    // causal: key tiles past the block's last row are masked for every row
    const int64_t s_end = a.causal ? min(a.S, q0 + tile::ROWS) : a.S;
    float *S_w = sS[w];
    stage_rows<T, tile::ROWS, DM>(sQ, Qb, q0, a.L, f.D, 0);

    // sweep 1: row max and sum
    float m = -INFINITY, l = 0.0f;
    for (int64_t k0 = 0; k0 < s_end; k0 += FL_BC) {
        __syncthreads();
        stage_rows<T, FL_BC, DM>(sK, Kb, k0, a.S, f.D, f.kt);
        __syncthreads();
        mma_abt<T, DM / 16, FL_BC / 16>(S_w, FL_SLD, sQ + 16 * w * tile::LD, tile::LD, sK, tile::LD);
        __syncwarp();
        for (int c = 0; c < 16; c++) {
            const int cc = (c + r) & 15;   // rotated: the 16 rows of a half warp hit 16 banks
            const int64_t j = k0 + c0 + cc;
            const float v = i < a.L && j < a.S ? logit(a, S_w[r * FL_SLD + c0 + cc], mask, mb, i, j) : -INFINITY;
            if (v == -INFINITY) continue;
            if (v > m) { l = l * expf(m - v) + 1.0f; m = v; }
            else l += expf(v - m);
        }
        __syncwarp();
    }
    {   // the two half rows of a row meet
        const float m2 = __shfl_xor_sync(0xffffffffu, m, 1), l2 = __shfl_xor_sync(0xffffffffu, l, 1);
        const float mx = fmaxf(m, m2);
        const float sum = (m == -INFINITY ? 0.0f : l * expf(m - mx)) + (m2 == -INFINITY ? 0.0f : l2 * expf(m2 - mx));
        m = mx + logf(sum);   // now lse; fully masked rows: -inf (P = NaN, or 0 with nan_to_zero)
    }
    if (lse && (lane & 1) == 0 && i < a.L) lse[b * a.L + i] = m;

    // sweep 2: P and O += P V
    frag_acc o[DM / 16];
    for (int j = 0; j < DM / 16; j++) wmma::fill_fragment(o[j], 0.0f);
    T *P_w = (T *)S_w;   // P (16, BC) overwrites the scores once they are read
    for (int64_t k0 = 0; k0 < s_end; k0 += FL_BC) {
        __syncthreads();
        stage_rows<T, FL_BC, DM>(sK, Kb, k0, a.S, f.D, f.kt);
        stage_rows<T, FL_BC, DM>(sV, Vb, k0, a.S, f.Dv, 0);
        __syncthreads();
        mma_abt<T, DM / 16, FL_BC / 16>(S_w, FL_SLD, sQ + 16 * w * tile::LD, tile::LD, sK, tile::LD);
        __syncwarp();
        float p[16];
        for (int c = 0; c < 16; c++) {
            const int cc = (c + r) & 15;   // rotated: the 16 rows of a half warp hit 16 banks
            const int64_t j = k0 + c0 + cc;
            float v = -INFINITY;
            if (i < a.L && j < a.S) v = logit(a, S_w[r * FL_SLD + c0 + cc], mask, mb, i, j);
            float e = i < a.L ? expf(v - m) : 0.0f;
            if (e != e && a.nan_to_zero) e = 0.0f;
            if (a.dropout && i < a.L && j < a.S) {   // a dropped entry is 0, a NaN one too (attention.cu)
                const float k = keep_of(a, seed, (b * a.L + i) * a.S + j);
                e = k != 0.0f ? e * k : 0.0f;
            }
            p[c] = e;
        }
        __syncwarp();
        for (int c = 0; c < 16; c++) P_w[r * FL_SLD + c0 + ((c + r) & 15)] = st<T>(p[c]);
        __syncwarp();
        mma_ab_acc<T, FL_BC / 16, DM / 16>(o, P_w, FL_SLD, sV, tile::LD);
    }
    __syncwarp();
    write_rows<T, DM / 16>(O + b * a.L * f.Dv, o, S_w, 1.0f, q0 + 16 * w, a.L, f.Dv, 0);
#else
    __trap();   // WMMA bf16 needs sm_80; the provider is built for sm_80 and newer
#endif
}

// ---- backward: dQ ----------------------------------------------------------------------------------

// grid (ceil(L / ROWS), B): dQ (B, L, D)
template <typename T, int DM>
__global__ void __launch_bounds__(flash_tile<DM>::THREADS)
flash_dq_kernel(T *dQ, const T *dO, const T *Q, const T *K, const T *V, const T *mask, const float *lse,
                const float *Di, flash_args f, const int64_t *seedp) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    typedef flash_tile<DM> tile;
    __shared__ __align__(32) T sQ[tile::ROWS * tile::LD];
    __shared__ __align__(32) T sdO[tile::ROWS * tile::LD];
    __shared__ __align__(32) T sK[FL_BC * tile::LD];
    __shared__ __align__(32) T sV[FL_BC * tile::LD];
    __shared__ __align__(32) float sS[tile::WARPS][16 * FL_SLD];
    __shared__ __align__(32) float sdP[tile::WARPS][16 * FL_SLD];
    const soft_args &a = f.a;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 16;
    const int64_t b = blockIdx.y, q0 = (int64_t)blockIdx.x * tile::ROWS, i = q0 + 16 * w + r;
    const T *Kb = K + b * f.k_bs, *Vb = V + b * f.v_bs;
    const int64_t mb = mask ? mask_base(a, b) : 0;
    const uint64_t seed = seedp ? (uint64_t)*seedp : 0;
    const int64_t s_end = a.causal ? min(a.S, q0 + tile::ROWS) : a.S;
    const float li = i < a.L ? lse[b * a.L + i] : 0.0f, di = i < a.L ? Di[b * a.L + i] : 0.0f;
    float *S_w = sS[w], *dP_w = sdP[w];
    T *dS_w = (T *)S_w;
    stage_rows<T, tile::ROWS, DM>(sQ, Q + b * f.q_bs, q0, a.L, f.D, 0);
    stage_rows<T, tile::ROWS, DM>(sdO, dO + b * a.L * f.Dv, q0, a.L, f.Dv, 0);
    frag_acc dq[DM / 16];
    for (int j = 0; j < DM / 16; j++) wmma::fill_fragment(dq[j], 0.0f);
    for (int64_t k0 = 0; k0 < s_end; k0 += FL_BC) {
        __syncthreads();
        stage_rows<T, FL_BC, DM>(sK, Kb, k0, a.S, f.D, f.kt);
        stage_rows<T, FL_BC, DM>(sV, Vb, k0, a.S, f.Dv, 0);
        __syncthreads();
        mma_abt<T, DM / 16, FL_BC / 16>(S_w, FL_SLD, sQ + 16 * w * tile::LD, tile::LD, sK, tile::LD);
        mma_abt<T, DM / 16, FL_BC / 16>(dP_w, FL_SLD, sdO + 16 * w * tile::LD, tile::LD, sV, tile::LD);
        __syncwarp();
        float ds[16];
        for (int c = 0; c < 16; c++) {
            const int cc = (c + r) & 15;   // rotated: the 16 rows of a half warp hit 16 banks
            const int64_t j = k0 + c0 + cc;
            float pd;
            ds[c] = i < a.L && j < a.S ? score_grad(a, S_w[r * FL_SLD + c0 + cc], dP_w[r * FL_SLD + c0 + cc], li, di,
                                                    mask, mb, b, i, j, seed, &pd)
                                       : 0.0f;
        }
        __syncwarp();
        for (int c = 0; c < 16; c++) dS_w[r * FL_SLD + c0 + ((c + r) & 15)] = st<T>(ds[c]);
        __syncwarp();
        mma_ab_acc<T, FL_BC / 16, DM / 16>(dq, dS_w, FL_SLD, sK, tile::LD);
    }
    __syncwarp();
    write_rows<T, DM / 16>(dQ + b * a.L * f.D, dq, dP_w, a.scale, q0 + 16 * w, a.L, f.D, 0);
#else
    __trap();
#endif
}

// ---- backward: dK, dV ------------------------------------------------------------------------------

// grid (ceil(S / ROWS), B): dK (B, S, D) or dK^T (B, D, S), dV (B, S, Dv); either may be NULL.
// Keys are the rows here: S^T = K Q^T, dP^T = V dO^T, one warp per 16 keys.
template <typename T, int DM>
__global__ void __launch_bounds__(flash_tile<DM>::THREADS)
flash_dkv_kernel(T *dK, T *dV, const T *dO, const T *Q, const T *K, const T *V, const T *mask, const float *lse,
                 const float *Di, flash_args f, const int64_t *seedp) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    typedef flash_tile<DM> tile;
    __shared__ __align__(32) T sK[tile::ROWS * tile::LD];
    __shared__ __align__(32) T sV[tile::ROWS * tile::LD];
    __shared__ __align__(32) T sQ[FL_BC * tile::LD];
    __shared__ __align__(32) T sdO[FL_BC * tile::LD];
    __shared__ __align__(32) float sS[tile::WARPS][16 * FL_SLD];
    __shared__ __align__(32) float sdP[tile::WARPS][16 * FL_SLD];
    __shared__ float s_lse[FL_BC], s_di[FL_BC];
    const soft_args &a = f.a;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 16;
    const int64_t b = blockIdx.y, k0 = (int64_t)blockIdx.x * tile::ROWS, j = k0 + 16 * w + r;
    const T *Qb = Q + b * f.q_bs, *dOb = dO + b * a.L * f.Dv;
    const int64_t mb = mask ? mask_base(a, b) : 0;
    const uint64_t seed = seedp ? (uint64_t)*seedp : 0;
    // causal: query tiles wholly above the block's first key see none of its keys
    const int64_t q_begin = a.causal ? (k0 / FL_BC) * FL_BC : 0;
    float *S_w = sS[w], *dP_w = sdP[w];
    T *Pd_w = (T *)S_w, *dS_w = (T *)S_w + 16 * FL_SLD;   // both fit where the fp32 scores were
    stage_rows<T, tile::ROWS, DM>(sK, K + b * f.k_bs, k0, a.S, f.D, f.kt);
    stage_rows<T, tile::ROWS, DM>(sV, V + b * f.v_bs, k0, a.S, f.Dv, 0);
    frag_acc dk[DM / 16], dv[DM / 16];
    for (int n = 0; n < DM / 16; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    for (int64_t q0 = q_begin; q0 < a.L; q0 += FL_BC) {
        __syncthreads();
        stage_rows<T, FL_BC, DM>(sQ, Qb, q0, a.L, f.D, 0);
        stage_rows<T, FL_BC, DM>(sdO, dOb, q0, a.L, f.Dv, 0);
        for (int e = threadIdx.x; e < FL_BC; e += blockDim.x) {
            const int64_t i = q0 + e;
            s_lse[e] = i < a.L ? lse[b * a.L + i] : 0.0f;
            s_di[e] = i < a.L ? Di[b * a.L + i] : 0.0f;
        }
        __syncthreads();
        mma_abt<T, DM / 16, FL_BC / 16>(S_w, FL_SLD, sK + 16 * w * tile::LD, tile::LD, sQ, tile::LD);
        mma_abt<T, DM / 16, FL_BC / 16>(dP_w, FL_SLD, sV + 16 * w * tile::LD, tile::LD, sdO, tile::LD);
        __syncwarp();
        float pd[16], ds[16];
        for (int c = 0; c < 16; c++) {
            const int cc = (c + r) & 15;   // rotated: the 16 rows of a half warp hit 16 banks
            const int64_t i = q0 + c0 + cc;
            pd[c] = ds[c] = 0.0f;
            if (i < a.L && j < a.S)
                ds[c] = score_grad(a, S_w[r * FL_SLD + c0 + cc], dP_w[r * FL_SLD + c0 + cc], s_lse[c0 + cc],
                                   s_di[c0 + cc], mask, mb, b, i, j, seed, &pd[c]);
        }
        __syncwarp();
        for (int c = 0; c < 16; c++) {
            const int cc = (c + r) & 15;   // rotated: the 16 rows of a half warp hit 16 banks
            Pd_w[r * FL_SLD + c0 + cc] = st<T>(pd[c]);
            dS_w[r * FL_SLD + c0 + cc] = st<T>(ds[c]);
        }
        __syncwarp();
        mma_ab_acc<T, FL_BC / 16, DM / 16>(dv, Pd_w, FL_SLD, sdO, tile::LD);
        mma_ab_acc<T, FL_BC / 16, DM / 16>(dk, dS_w, FL_SLD, sQ, tile::LD);
    }
    __syncwarp();
    if (dV) write_rows<T, DM / 16>(dV + b * a.S * f.Dv, dv, dP_w, 1.0f, k0 + 16 * w, a.S, f.Dv, 0);
    if (dK) write_rows<T, DM / 16>(dK + b * a.S * f.D, dk, dP_w, a.scale, k0 + 16 * w, a.S, f.D, f.kt);
#else
    __trap();
#endif
}

// ---- host ------------------------------------------------------------------------------------------

static unsigned blocks_for(int64_t n, int rows) { return (unsigned)((n + rows - 1) / rows); }

#define FLASH_DISPATCH(dt, f, ...)                                                                 \
    do {                                                                                           \
        const int wide_ = (f)->D > 64 || (f)->Dv > 64;                                             \
        if ((dt) == OM_F16) {                                                                      \
            typedef __half T;                                                                      \
            if (wide_) { const int DM = 128; __VA_ARGS__; } else { const int DM = 64; __VA_ARGS__; } \
        } else {                                                                                   \
            typedef __nv_bfloat16 T;                                                               \
            if (wide_) { const int DM = 128; __VA_ARGS__; } else { const int DM = 64; __VA_ARGS__; } \
        }                                                                                          \
    } while (0)

static om_status *flash_check(const om_kernel_ctx *ctx, om_dtype dt, const flash_args *f) {
    if (dt != OM_F16 && dt != OM_BF16) return omc_err_dtype(ctx, 0, dt);
    if (f->D > FLASH_MAX_D || f->Dv > FLASH_MAX_D)
        return omc_err_unsupported(ctx, "flash attention with a head dim over 128");
    if (f->B > 65535) return omc_err_unsupported(ctx, "flash attention over more than 65535 batch entries");
    return NULL;
}

om_status *flash_forward(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, const flash_args *f,
                         const void *Q, const void *K, const void *V, const void *mask, const int64_t *seedp, void *O,
                         float *lse) {
    OMC_TRY(flash_check(ctx, dt, f));
    if (!f->B || !f->a.L) return NULL;
    FLASH_DISPATCH(dt, f, {
        dim3 grid(blocks_for(f->a.L, flash_tile<DM>::ROWS), (unsigned)f->B);
        flash_fwd_kernel<T, DM><<<grid, flash_tile<DM>::THREADS, 0, stream_of(x)>>>(
            (T *)O, lse, (const T *)Q, (const T *)K, (const T *)V, (const T *)mask, *f, seedp);
    });
    return omc_launched(ctx);
}

om_status *flash_backward(const om_kernel_ctx *ctx, const om_cuda_exec *x, om_dtype dt, const flash_args *f,
                          const void *dO, const void *Q, const void *K, const void *V, const void *mask,
                          const int64_t *seedp, const float *lse, const float *Di, void *dQ, void *dK, void *dV) {
    OMC_TRY(flash_check(ctx, dt, f));
    if (!f->B) return NULL;
    FLASH_DISPATCH(dt, f, {
        if (dQ && f->a.L) {
            dim3 grid(blocks_for(f->a.L, flash_tile<DM>::ROWS), (unsigned)f->B);
            flash_dq_kernel<T, DM><<<grid, flash_tile<DM>::THREADS, 0, stream_of(x)>>>(
                (T *)dQ, (const T *)dO, (const T *)Q, (const T *)K, (const T *)V, (const T *)mask, lse, Di, *f, seedp);
        }
        if ((dK || dV) && f->a.S) {
            dim3 grid(blocks_for(f->a.S, flash_tile<DM>::ROWS), (unsigned)f->B);
            flash_dkv_kernel<T, DM><<<grid, flash_tile<DM>::THREADS, 0, stream_of(x)>>>(
                (T *)dK, (T *)dV, (const T *)dO, (const T *)Q, (const T *)K, (const T *)V, (const T *)mask, lse, Di, *f,
                seedp);
        }
    });
    return omc_launched(ctx);
}
