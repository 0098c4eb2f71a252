/* The vector vocabulary of the ymm ISAs (avx2, avxvnni): 8 lanes of __m256 / __m256i,
 * prefix w8_avx2.  The names and their meaning are vec_scalar.h's; the operations that are
 * the same at either x86 width come from vec_x86.h. */
#ifndef PYW8A8_SIMD_VEC_AVX2_H
#define PYW8A8_SIMD_VEC_AVX2_H

#include "common.h"
#if defined(W8_X86)

#define W8_AVX2 W8_TARGET("avx2,fma")

enum { w8_avx2_lanes = 8 };
typedef __m256 w8_avx2_f32;
typedef __m256i w8_avx2_i32;

#define W8_VX(name) w8_avx2_##name
#define W8_VX_TARGET W8_AVX2
#define W8_VX_BITS 256
#include "vec_x86.h"

/* All ones in the lanes where c < 0 (ordered: a NaN lane is not negative). */
W8_AVX2 W8_INLINE __m256 w8_avx2_negative(__m256 c)
{
    return _mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_LT_OQ);
}
W8_AVX2 W8_INLINE __m256 w8_avx2_select_neg_f32(__m256 c, __m256 x, __m256 y)
{
    return _mm256_blendv_ps(y, x, w8_avx2_negative(c));
}
W8_AVX2 W8_INLINE __m256i w8_avx2_select_neg_i32(__m256 c, __m256i i, __m256i j)
{
    return _mm256_blendv_epi8(j, i, _mm256_castps_si256(w8_avx2_negative(c)));
}

W8_AVX2 W8_INLINE int w8_avx2_above_f32(__m256 v, __m256 c)
{
    return _mm256_movemask_ps(_mm256_cmp_ps(v, c, _CMP_NLE_UQ));
}

#endif
#endif
