/* AVX-VNNI path (VEX-encoded ymm vpdpbusd: Alder Lake and later, Zen 5). vpdpbusd multiplies
 * u8 by s8 and sums four products into int32 without intermediate saturation, so it is
 * exact; one operand must be unsigned, hence the +128 shift and the compensation term. */
#ifndef PYW8A8_SIMD_AVXVNNI_H
#define PYW8A8_SIMD_AVXVNNI_H

#include "avx2.h"
#if defined(W8_X86)

#define W8_AVXVNNI W8_TARGET("avx2,fma,avxvnni")
#define W8_AVXVNNI_MR 6
#define W8_AVXVNNI_NV 1

/* biased != 0: weights are the u8 operand (q + 128), activations the s8 one.
 * biased == 0: activations are the u8 operand (qa ^ 0x80 = qa + 128), weights s8. */
W8_AVXVNNI W8_INLINE void w8_avxvnni_tile(int rows, int64_t kq, const uint8_t *a,
                                          int64_t lda, const uint8_t *b, int32_t *tile,
                                          int biased)
{
    __m256i acc[W8_AVXVNNI_MR][2];
    for (int r = 0; r < W8_AVXVNNI_MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t q = 0; q < kq; q++) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + q * W8_QUAD_BYTES));
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + q * W8_QUAD_BYTES + 32));
        for (int r = 0; r < W8_AVXVNNI_MR; r++) {
            if (r >= rows) break;
            int32_t a4;
            memcpy(&a4, a + r * lda + 4 * q, 4);
            const __m256i av = _mm256_set1_epi32(a4);
            if (biased) {
                acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], b0, av);
                acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], b1, av);
            } else {
                acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], av, b0);
                acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], av, b1);
            }
        }
    }
    for (int r = 0; r < W8_AVXVNNI_MR; r++) {
        if (r >= rows) break;
        _mm256_storeu_si256((__m256i *)(tile + r * W8_TILE_LD), acc[r][0]);
        _mm256_storeu_si256((__m256i *)(tile + r * W8_TILE_LD + 8), acc[r][1]);
    }
}

#define W8_AVXVNNI_DISPATCH(BIASED)                                                      \
    for (int p = 0; p < npanels; p++) {                                                  \
        const uint8_t *bp = b + p * ps;                                                  \
        int32_t *tp = t + p * W8_NR;                                                     \
        switch (rows) {                                                                  \
        case 6: w8_avxvnni_tile(6, kq, a, lda, bp, tp, BIASED); break;                   \
        case 5: w8_avxvnni_tile(5, kq, a, lda, bp, tp, BIASED); break;                   \
        case 4: w8_avxvnni_tile(4, kq, a, lda, bp, tp, BIASED); break;                   \
        case 3: w8_avxvnni_tile(3, kq, a, lda, bp, tp, BIASED); break;                   \
        case 2: w8_avxvnni_tile(2, kq, a, lda, bp, tp, BIASED); break;                   \
        default: w8_avxvnni_tile(1, kq, a, lda, bp, tp, BIASED); break;                  \
        }                                                                                \
    }

W8_AVXVNNI static void w8_avxvnni_ukernel_biased(int rows, int npanels, int64_t kq,
                                                 const uint8_t *a, int64_t lda,
                                                 const uint8_t *b, int64_t ps, int32_t *t)
{
    W8_AVXVNNI_DISPATCH(1)
}

W8_AVXVNNI static void w8_avxvnni_ukernel_signed(int rows, int npanels, int64_t kq,
                                                 const uint8_t *a, int64_t lda,
                                                 const uint8_t *b, int64_t ps, int32_t *t)
{
    W8_AVXVNNI_DISPATCH(0)
}

static const w8_isa_ops w8_avxvnni_ops = {
    "avxvnni", W8_AVXVNNI_MR, W8_AVXVNNI_NV,
    {w8_avxvnni_ukernel_biased, w8_avxvnni_ukernel_signed},
    {W8_CORR_ROW, W8_CORR_COL},
    {0, 0x80},
    w8_avx2_absmax,
    w8_avx2_quantize,
};

#endif
#endif
