/* The vector vocabulary of the zmm ISAs (avx512vnni, and amx's epilogue and FWHT): 16
 * lanes of __m512 / __m512i, prefix w8_avx512; AVX-512F only.  The names and their meaning
 * are vec_scalar.h's; the operations that are the same at either x86 width come from
 * vec_x86.h. */
#ifndef PYW8A8_SIMD_VEC_AVX512_H
#define PYW8A8_SIMD_VEC_AVX512_H

#include "common.h"
#if defined(W8_X86)

#define W8_AVX512 W8_TARGET("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")

enum { w8_avx512_lanes = 16 };
typedef __m512 w8_avx512_f32;
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

#endif
#endif
