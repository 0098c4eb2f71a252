/* AVX-512 VNNI path (zmm vpdpbusd: Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4).
 * One quad row of a packed panel (16 channels x 4 K values) is exactly one zmm operand. */
#ifndef PYW8A8_SIMD_AVX512VNNI_H
#define PYW8A8_SIMD_AVX512VNNI_H

#include "avx2.h"
#if defined(W8_X86)

#define W8_AVX512 W8_TARGET("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")
#define W8_AVX512_MR 6
#define W8_AVX512_NV 4

/* rows x nv zmm accumulators (up to 24 of the 32 registers); see avxvnni.h for `biased`. */
W8_AVX512 W8_INLINE void w8_avx512_tile(int rows, int nv, int64_t kq, const uint8_t *a,
                                        int64_t lda, const uint8_t *b, int64_t ps,
                                        int32_t *tile, int biased)
{
    __m512i acc[W8_AVX512_MR][W8_AVX512_NV];
    for (int r = 0; r < W8_AVX512_MR; r++)
        for (int v = 0; v < W8_AVX512_NV; v++) acc[r][v] = _mm512_setzero_si512();
    for (int64_t q = 0; q < kq; q++) {
        __m512i bv[W8_AVX512_NV];
        for (int v = 0; v < W8_AVX512_NV; v++)
            if (v < nv) bv[v] = _mm512_loadu_si512(b + v * ps + q * W8_QUAD_BYTES);
        for (int r = 0; r < W8_AVX512_MR; r++) {
            if (r >= rows) break;
            int32_t a4;
            memcpy(&a4, a + r * lda + 4 * q, 4);
            const __m512i av = _mm512_set1_epi32(a4);
            for (int v = 0; v < W8_AVX512_NV; v++) {
                if (v >= nv) break;
                acc[r][v] = biased ? _mm512_dpbusd_epi32(acc[r][v], bv[v], av)
                                   : _mm512_dpbusd_epi32(acc[r][v], av, bv[v]);
            }
        }
    }
    for (int r = 0; r < W8_AVX512_MR; r++) {
        if (r >= rows) break;
        for (int v = 0; v < W8_AVX512_NV; v++)
            if (v < nv) _mm512_storeu_si512(tile + r * W8_TILE_LD + v * W8_NR, acc[r][v]);
    }
}

#define W8_AVX512_ROWS(NV, BIASED)                                                       \
    switch (rows) {                                                                      \
    case 6: w8_avx512_tile(6, NV, kq, a, lda, b, ps, t, BIASED); break;                  \
    case 5: w8_avx512_tile(5, NV, kq, a, lda, b, ps, t, BIASED); break;                  \
    case 4: w8_avx512_tile(4, NV, kq, a, lda, b, ps, t, BIASED); break;                  \
    case 3: w8_avx512_tile(3, NV, kq, a, lda, b, ps, t, BIASED); break;                  \
    case 2: w8_avx512_tile(2, NV, kq, a, lda, b, ps, t, BIASED); break;                  \
    default: w8_avx512_tile(1, NV, kq, a, lda, b, ps, t, BIASED); break;                 \
    }

#define W8_AVX512_DISPATCH(BIASED)                                                       \
    switch (npanels) {                                                                   \
    case 4: W8_AVX512_ROWS(4, BIASED) break;                                             \
    case 3: W8_AVX512_ROWS(3, BIASED) break;                                             \
    case 2: W8_AVX512_ROWS(2, BIASED) break;                                             \
    default: W8_AVX512_ROWS(1, BIASED) break;                                            \
    }

W8_AVX512 static void w8_avx512_ukernel_biased(int rows, int npanels, int64_t kq,
                                               const uint8_t *a, int64_t lda,
                                               const uint8_t *b, int64_t ps, int32_t *t)
{
    W8_AVX512_DISPATCH(1)
}

W8_AVX512 static void w8_avx512_ukernel_signed(int rows, int npanels, int64_t kq,
                                               const uint8_t *a, int64_t lda,
                                               const uint8_t *b, int64_t ps, int32_t *t)
{
    W8_AVX512_DISPATCH(0)
}

static const w8_isa_ops w8_avx512vnni_ops = {
    "avx512vnni", W8_AVX512_MR, W8_AVX512_NV,
    {w8_avx512_ukernel_biased, w8_avx512_ukernel_signed},
    {W8_CORR_ROW, W8_CORR_COL},
    {0, 0x80},
    w8_avx2_absmax,
    w8_avx2_quantize,
};

#endif
#endif
