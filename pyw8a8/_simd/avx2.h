/* AVX2 path for CPUs without VNNI.
 *
 * vpmaddubsw multiplies u8 by s8 and adds adjacent pairs with int16 saturation: with biased
 * weights (up to 255) times activations (up to 127) a pair reaches 64770 and saturates.
 * This path therefore works on signed values only, with the sign trick: |w| * sign(a, w)
 * equals a * w, and both factors are at most 127 in magnitude, so a pair is at most
 * 2 * 127 * 127 = 32258 < 32767: exact.  Biased weights are turned back into signed ones
 * with one XOR, so no compensation term is needed for either encoding. */
#ifndef PYW8A8_SIMD_AVX2_H
#define PYW8A8_SIMD_AVX2_H

#include "common.h"
#if defined(W8_X86)
#include <immintrin.h>

#define W8_AVX2 W8_TARGET("avx2,fma")
#define W8_AVX2_MR 4
#define W8_AVX2_NV 1

W8_AVX2 W8_INLINE void w8_avx2_tile(int rows, int64_t kq, const uint8_t *a, int64_t lda,
                                    const uint8_t *b, int32_t *tile, int biased)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i acc[W8_AVX2_MR][2];
    for (int r = 0; r < W8_AVX2_MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t q = 0; q < kq; q++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + q * W8_QUAD_BYTES));
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + q * W8_QUAD_BYTES + 32));
        if (biased) {
            b0 = _mm256_xor_si256(b0, flip);
            b1 = _mm256_xor_si256(b1, flip);
        }
        const __m256i m0 = _mm256_abs_epi8(b0), m1 = _mm256_abs_epi8(b1);
        for (int r = 0; r < W8_AVX2_MR; r++) {
            if (r >= rows) break;
            int32_t a4;
            memcpy(&a4, a + r * lda + 4 * q, 4);
            const __m256i av = _mm256_set1_epi32(a4);
            __m256i p0 = _mm256_maddubs_epi16(m0, _mm256_sign_epi8(av, b0));
            __m256i p1 = _mm256_maddubs_epi16(m1, _mm256_sign_epi8(av, b1));
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
        }
    }
    for (int r = 0; r < W8_AVX2_MR; r++) {
        if (r >= rows) break;
        _mm256_storeu_si256((__m256i *)(tile + r * W8_TILE_LD), acc[r][0]);
        _mm256_storeu_si256((__m256i *)(tile + r * W8_TILE_LD + 8), acc[r][1]);
    }
}

/* Row counts are compile-time constants in each branch so the accumulators stay in
 * registers. */
#define W8_AVX2_DISPATCH(BIASED)                                                         \
    for (int p = 0; p < npanels; p++) {                                                  \
        const uint8_t *bp = b + p * ps;                                                  \
        int32_t *tp = t + p * W8_NR;                                                     \
        switch (rows) {                                                                  \
        case 4: w8_avx2_tile(4, kq, a, lda, bp, tp, BIASED); break;                      \
        case 3: w8_avx2_tile(3, kq, a, lda, bp, tp, BIASED); break;                      \
        case 2: w8_avx2_tile(2, kq, a, lda, bp, tp, BIASED); break;                      \
        default: w8_avx2_tile(1, kq, a, lda, bp, tp, BIASED); break;                     \
        }                                                                                \
    }

W8_AVX2 static void w8_avx2_ukernel_biased(int rows, int npanels, int64_t kq,
                                           const uint8_t *a, int64_t lda, const uint8_t *b,
                                           int64_t ps, int32_t *t)
{
    W8_AVX2_DISPATCH(1)
}

W8_AVX2 static void w8_avx2_ukernel_signed(int rows, int npanels, int64_t kq,
                                           const uint8_t *a, int64_t lda, const uint8_t *b,
                                           int64_t ps, int32_t *t)
{
    W8_AVX2_DISPATCH(0)
}

W8_AVX2 static int w8_avx2_absmax(const float *x, int64_t n, float *amax)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256 fmax = _mm256_set1_ps(3.4028234663852886e38f);
    __m256 m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + i), _mm256_castsi256_ps(absmask));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, fmax, _CMP_NLE_UQ)); /* NaN or > FLT_MAX */
        m = _mm256_max_ps(m, v);
    }
    if (_mm256_movemask_ps(bad)) return 1;
    float lanes[8], tail = 0.0f;
    _mm256_storeu_ps(lanes, m);
    if (w8_scalar_absmax(x + i, n - i, &tail)) return 1;
    for (int j = 0; j < 8; j++) tail = lanes[j] > tail ? lanes[j] : tail;
    *amax = tail;
    return 0;
}

W8_AVX2 static void w8_avx2_quantize(const float *x, int64_t n, float inv, uint8_t flip,
                                     uint8_t *q)
{
    const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f),
                 lo = _mm256_set1_ps(-127.0f);
    const __m256i vflip = _mm256_set1_epi8((char)flip);
    /* packs interleaves 128-bit lanes; this permutation restores element order. */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i r[4];
        for (int j = 0; j < 4; j++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), vinv);
            v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            r[j] = _mm256_cvtps_epi32(v); /* round half to even (MXCSR default) */
        }
        __m256i w01 = _mm256_packs_epi32(r[0], r[1]), w23 = _mm256_packs_epi32(r[2], r[3]);
        __m256i bytes = _mm256_packs_epi16(w01, w23);
        bytes = _mm256_permutevar8x32_epi32(bytes, order);
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_xor_si256(bytes, vflip));
    }
    w8_scalar_quantize(x + i, n - i, inv, flip, q + i);
}

static const w8_isa_ops w8_avx2_ops = {
    "avx2", W8_AVX2_MR, W8_AVX2_NV,
    {w8_avx2_ukernel_biased, w8_avx2_ukernel_signed},
    {W8_CORR_NONE, W8_CORR_NONE},
    {0, 0},
    w8_avx2_absmax,
    w8_avx2_quantize,
};

#endif
#endif
