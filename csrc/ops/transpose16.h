/* transpose16.h — a 16 x 16 transpose of 32-bit elements in AVX-512 registers, for the GEMM
 * kernels' packing of operands stored the other way round (gemm_bf16.c, gemm_f32.c). Include it
 * inside a file's x86-64 section, after <immintrin.h>. */
#ifndef OM_TRANSPOSE16_H
#define OM_TRANSPOSE16_H

#include <immintrin.h>

/* r[t][q] -> r[q][t] for 16 x 16 uint32 (t: row of the input, q: its element). After the 32- and
 * 64-bit unpacks, v[m] of rows 4g..4g+3 holds in its 128-bit lane L the element 4L+m of those four
 * rows; two rounds of lane shuffles then gather lane L of the four groups. */
__attribute__((target("avx512f"))) static inline void transpose16(__m512i r[16]) {
    __m512i t[16], v[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) {   /* v[4g + m]: rows 4g..4g+3, elements 4L + m */
        v[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        v[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        v[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        v[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int m = 0; m < 4; m++) {
        const __m512i s_lo = _mm512_shuffle_i32x4(v[m], v[4 + m], 0x44), s_hi = _mm512_shuffle_i32x4(v[m], v[4 + m], 0xee);
        const __m512i t_lo = _mm512_shuffle_i32x4(v[8 + m], v[12 + m], 0x44);
        const __m512i t_hi = _mm512_shuffle_i32x4(v[8 + m], v[12 + m], 0xee);
        r[m] = _mm512_shuffle_i32x4(s_lo, t_lo, 0x88);
        r[4 + m] = _mm512_shuffle_i32x4(s_lo, t_lo, 0xdd);
        r[8 + m] = _mm512_shuffle_i32x4(s_hi, t_hi, 0x88);
        r[12 + m] = _mm512_shuffle_i32x4(s_hi, t_hi, 0xdd);
    }
}

#endif
