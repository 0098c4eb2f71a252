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

#include "scalar.h"
#if defined(W8_X86)

#define W8_AVX2 W8_TARGET("avx2,fma")

/* The 4 bytes at p, as one int32 (unaligned). */
W8_INLINE int32_t w8_load_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A B vector as signed bytes: biased weights (q + 128) turn back into q with one XOR. */
W8_AVX2 W8_INLINE __m256i w8_avx2_load_b(const uint8_t *p, int biased)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return biased ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;
}

/* a * b summed over each group of four bytes, through |b| * sign(a, b). */
W8_AVX2 W8_INLINE __m256i w8_avx2_dot(__m256i acc, __m256i a, __m256i b, __m256i abs_b)
{
    const __m256i pairs = _mm256_maddubs_epi16(abs_b, _mm256_sign_epi8(a, b));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* 4 rows x 2 ymm (one panel): 8 accumulators, 2 B vectors and their absolute values, the
 * broadcast row and a product fill 14 of the 16 ymm registers. */
#define W8_AVX2_MR 4
#define W8_AVX2_NV 1
#define W8_UK(name) w8_avx2_##name
#define W8_UK_TARGET W8_AVX2
#define W8_UK_MR W8_AVX2_MR
#define W8_UK_VPP 2
#define W8_UK_NVEC 2
#define W8_UK_VEC __m256i
#define W8_UK_ZERO() _mm256_setzero_si256()
#define W8_UK_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define W8_UK_STORE(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define W8_UK_ADD(x, y) _mm256_add_epi32(x, y)
#define W8_UK_BCAST(p) _mm256_set1_epi32(w8_load_i32(p))
#define W8_UK_LOAD_B(p, BIASED) w8_avx2_load_b(p, BIASED)
#define W8_UK_PREP_B(b) _mm256_abs_epi8(b)
#define W8_UK_DOT(acc, a, b, prep, BIASED) w8_avx2_dot(acc, a, b, prep)
#include "ukernel.h"

/* The float epilogue of common.h, 8 columns at a time; the tail in scalar code computes
 * the same two roundings. */
W8_AVX2 static void w8_avx2_epilogue(const int32_t *acc, int64_t ldacc, int rows, int cols,
                                     const int32_t *row_corr, const int32_t *col_corr,
                                     const float *a_scale, const float *b_scale, float *out,
                                     int64_t ldo)
{
    for (int r = 0; r < rows; r++) {
        const int32_t *t = acc + r * ldacc;
        float *o = out + r * ldo;
        const int32_t rc = row_corr ? row_corr[r] : 0;
        const __m256i vrc = _mm256_set1_epi32(rc);
        const __m256 vsa = _mm256_set1_ps(a_scale[r]);
        int j = 0;
        for (; j + 8 <= cols; j += 8) {
            __m256i v = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(t + j)), vrc);
            if (col_corr)
                v = _mm256_sub_epi32(v, _mm256_loadu_si256((const __m256i *)(col_corr + j)));
            const __m256 s = _mm256_mul_ps(vsa, _mm256_loadu_ps(b_scale + j));
            _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_cvtepi32_ps(v), s));
        }
        w8_scalar_epilogue(t + j, ldacc, 1, cols - j, row_corr ? &rc : NULL,
                           col_corr ? col_corr + j : NULL, a_scale + r, b_scale + j, o + j,
                           ldo);
    }
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
/* The instruction peak of this path's inner step: vpsignb + vpmaddubsw + vpmaddwd + vpaddd
 * (32 MACs).  Each chain's accumulator is also its activation operand, so none of the four
 * instructions is loop-invariant (with constant operands the compiler hoists all but the
 * vpaddd). */
W8_AVX2 static int64_t w8_avx2_peak(int64_t iters, int32_t *sink)
{
    const __m256i ones = _mm256_set1_epi16(1), b = _mm256_set1_epi8((char)(*sink | 3));
    const __m256i m = _mm256_abs_epi8(b);
    __m256i sum = _mm256_setzero_si256();
#define W8_INIT(j) __m256i acc##j = _mm256_set1_epi32(j + *sink);
#define W8_STEP(j)                                                                       \
    acc##j = _mm256_add_epi32(                                                           \
        acc##j, _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(acc##j, b)), ones));
#define W8_SUM(j) sum = _mm256_add_epi32(sum, acc##j);
    W8_PEAK_EACH(W8_INIT)
    for (int64_t i = 0; i < iters; i++) {
        W8_PEAK_EACH(W8_STEP)
    }
    W8_PEAK_EACH(W8_SUM)
#undef W8_INIT
#undef W8_STEP
#undef W8_SUM
    *sink += _mm256_extract_epi32(sum, 0);
    return iters * W8_PEAK_CHAINS * 32;
}
#endif
#endif
