/* The vector vocabulary of the zmm ISAs (avx512vnni, and amx's epilogue and FWHT): 16
 * lanes of __m512 / __m512i, doubles in __m512d (8 lanes), prefix w8_avx512; AVX-512F
 * only (no DQ conversion).  The names and their meaning are vec_scalar.h's; the operations
 * that are the same at either x86 width come from vec_x86.h. */
#ifndef PYW8A8_SIMD_VEC_AVX512_H
#define PYW8A8_SIMD_VEC_AVX512_H

#include "common.h"
#if defined(W8_X86)

#define W8_AVX512 W8_TARGET("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")

enum { w8_avx512_lanes = 16 };
typedef __m512 w8_avx512_f32;
typedef __m512d w8_avx512_f64;
typedef __m512i w8_avx512_i32;

#define W8_VX(name) w8_avx512_##name
#define W8_VX_TARGET W8_AVX512
#define W8_VX_BITS 512
#include "vec_x86.h"

/* The lanes where c < 0 (ordered: a NaN lane is not negative). */
W8_AVX512 W8_INLINE __mmask16 w8_avx512_negative(__m512 c)
{
    return _mm512_cmp_ps_mask(c, _mm512_setzero_ps(), _CMP_LT_OQ);
}
W8_AVX512 W8_INLINE __m512 w8_avx512_select_neg_f32(__m512 c, __m512 x, __m512 y)
{
    return _mm512_mask_blend_ps(w8_avx512_negative(c), y, x);
}
W8_AVX512 W8_INLINE __m512i w8_avx512_select_neg_i32(__m512 c, __m512i i, __m512i j)
{
    return _mm512_mask_blend_epi32(w8_avx512_negative(c), j, i);
}

W8_AVX512 W8_INLINE int w8_avx512_above_f32(__m512 v, __m512 c)
{
    return (int)_mm512_cmp_ps_mask(v, c, _CMP_NLE_UQ);
}

/* The sign bit set through the integer OR (AVX-512F has no _mm512_or_pd). */
W8_AVX512 W8_INLINE __m512d w8_avx512_negabs_f64(__m512d a)
{
    return _mm512_castsi512_pd(_mm512_or_si512(
        _mm512_castpd_si512(a), _mm512_set1_epi64((long long)0x8000000000000000ull)));
}
W8_AVX512 W8_INLINE __m512d w8_avx512_lo_f64(__m512 f)
{
    return _mm512_cvtps_pd(_mm512_castps512_ps256(f));
}
W8_AVX512 W8_INLINE __m512d w8_avx512_hi_f64(__m512 f)
{
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
}
W8_AVX512 W8_INLINE __m512 w8_avx512_narrow_f64(__m512d lo, __m512d hi)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(lo))),
        _mm256_castps_pd(_mm512_cvtpd_ps(hi)), 1));
}
W8_AVX512 W8_INLINE __m512i w8_avx512_low32_f64(__m512d lo, __m512d hi)
{
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_castpd_si512(lo))),
        _mm512_cvtepi64_epi32(_mm512_castpd_si512(hi)), 1);
}

#endif
#endif
