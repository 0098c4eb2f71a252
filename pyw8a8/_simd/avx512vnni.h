/* AVX-512 VNNI ISA (zmm vpdpbusd: Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4).
 * One quad row of a packed panel (16 channels x 4 K values) is exactly one zmm operand.
 * The encodings work as on the AVX-VNNI ISA (avxvnni.h).  The row quantizer and the
 * float epilogue also run here in zmm; the AMX ISA (amx.h) shares them. */
#ifndef PYW8A8_SIMD_AVX512VNNI_H
#define PYW8A8_SIMD_AVX512VNNI_H

#include "avx2.h"
#include "vec_avx512.h"
#if defined(W8_X86)

#define W8_V(name) w8_avx512_##name
#define W8_V_TARGET W8_AVX512
#include "epilogue.h"
#include "absmax.h"

W8_AVX512 W8_INLINE __m512i w8_avx512_dot(__m512i acc, __m512i a, __m512i b, int biased)
{
    return biased ? _mm512_dpbusd_epi32(acc, b, a) : _mm512_dpbusd_epi32(acc, a, b);
}

/* 6 rows x 4 zmm (4 panels, 64 channels): 24 accumulators, 4 B vectors and the broadcast
 * row use 29 of the 32 zmm registers.  Per quad row: 4 B loads and 6 broadcasts (load
 * ports) for 24 vpdpbusd, so the two vpdpbusd ports bound the loop (12 cycles). */
#define W8_AVX512_MR 6
#define W8_AVX512_NPANELS 4
#define W8_UK(name) w8_avx512_##name
#define W8_UK_TARGET W8_AVX512
#define W8_UK_MR W8_AVX512_MR
#define W8_UK_NVEC 4
#define W8_UK_A __m512i
#define W8_UK_B __m512i
#define W8_UK_BCAST w8_avx512_bcast_quad
#define W8_UK_LOAD_B w8_avx512_load_quads /* vpdpbusd takes either encoding as it is */
#define W8_UK_DOT w8_avx512_dot
#include "ukernel.h"

/* The AVX2 quantizer's arithmetic (multiply, clamp, round half to even) 16 floats at a
 * time; the clamp keeps every narrowing below exact. */
W8_AVX512 W8_INLINE __m512i w8_avx512_quantize16(const float *x, __m512 vinv)
{
    const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), vinv);
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
}

/* 64 floats at a time are narrowed with two packs and one permute, four shuffles where
 * four vpmovsdb take eight (the shuffle port bounds this loop on Intel). */
W8_AVX512 static void w8_avx512_quantize(const float *x, int64_t n, float inv, uint8_t flip,
                                         uint8_t *q)
{
    const __m512 vinv = _mm512_set1_ps(inv);
    /* packs leaves 128-bit lane L holding dwords a_L, b_L, c_L, d_L: this puts them back */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7,
                                            11, 15);
    const __m512i vflip512 = _mm512_set1_epi8((char)flip);
    const __m128i vflip = _mm_set1_epi8((char)flip);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i ab = _mm512_packs_epi32(w8_avx512_quantize16(x + i, vinv),
                                              w8_avx512_quantize16(x + i + 16, vinv));
        const __m512i cd = _mm512_packs_epi32(w8_avx512_quantize16(x + i + 32, vinv),
                                              w8_avx512_quantize16(x + i + 48, vinv));
        const __m512i bytes = _mm512_permutexvar_epi32(order, _mm512_packs_epi16(ab, cd));
        _mm512_storeu_si512((void *)(q + i), _mm512_xor_si512(bytes, vflip512));
    }
    for (; i + 16 <= n; i += 16) {
        const __m128i bytes = _mm512_cvtsepi32_epi8(w8_avx512_quantize16(x + i, vinv));
        _mm_storeu_si128((__m128i *)(q + i), _mm_xor_si128(bytes, vflip));
    }
    w8_avx2_quantize(x + i, n - i, inv, flip, q + i);
}

/* ---- FWHT (the network of fwht.h, template fwht_driver.h): 16 floats per zmm. ---- */

/* The four stages inside one register (h = 1, 2, 4, 8); the last two swap 128-bit lanes. */
W8_AVX512 W8_INLINE __m512 w8_avx512_fwht16(__m512 v)
{
    const __m512 s1 = _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1,
                                     1, -1, 1, -1, 1, -1, 1, -1);
    const __m512 s2 = _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1,
                                     1, 1, -1, -1, 1, 1, -1, -1);
    const __m512 s4 = _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1,
                                     1, 1, 1, 1, -1, -1, -1, -1);
    const __m512 s8 = _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1,
                                     -1, -1, -1, -1, -1, -1, -1, -1);
    v = _mm512_fmadd_ps(v, s1, _mm512_permute_ps(v, 0xB1));       /* swap pairs */
    v = _mm512_fmadd_ps(v, s2, _mm512_permute_ps(v, 0x4E));       /* swap pairs of 2 */
    v = _mm512_fmadd_ps(v, s4, _mm512_shuffle_f32x4(v, v, 0xB1)); /* lanes 1, 0, 3, 2 */
    v = _mm512_fmadd_ps(v, s8, _mm512_shuffle_f32x4(v, v, 0x4E)); /* lanes 2, 3, 0, 1 */
    return v;
}

#define W8_FW_IN_REG w8_avx512_fwht16
#define W8_FW_NARROW w8_avx2_fwht
#define W8_FW_TWO_BLOCKS 1
#include "fwht_driver.h"

W8_AVX512 W8_INLINE int32_t w8_avx512_first_lane(__m512i v)
{
    return _mm_cvtsi128_si32(_mm512_castsi512_si128(v));
}

W8_PEAK_FN(w8_avx512_peak, W8_AVX512, __m512i, _mm512_set1_epi8((char)(*sink | 3)),
           _mm512_set1_epi8(5), _mm512_set1_epi32, _mm512_dpbusd_epi32, _mm512_add_epi32,
           w8_avx512_first_lane, 64)

#undef W8_V
#undef W8_V_TARGET
#endif
#endif
