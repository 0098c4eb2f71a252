/* AVX-VNNI ISA (VEX-encoded ymm vpdpbusd: Alder Lake and later, Zen 5). vpdpbusd multiplies
 * u8 by s8 and sums four products into int32 without intermediate saturation, so it is
 * exact; one operand must be unsigned, hence the +128 shift and the compensation term:
 *   biased weights (q + 128) are the u8 operand, activations the s8 one (W8_CORR_ROW);
 *   signed weights are the s8 operand, activations shifted (qa ^ 0x80) the u8 one
 *   (W8_CORR_COL). */
#ifndef PYW8A8_SIMD_AVXVNNI_H
#define PYW8A8_SIMD_AVXVNNI_H

#include "avx2.h"
#if defined(W8_X86)

#define W8_AVXVNNI W8_TARGET("avx2,fma,avxvnni")

W8_AVXVNNI W8_INLINE __m256i w8_avxvnni_dot(__m256i acc, __m256i a, __m256i b, int biased)
{
    return biased ? _mm256_dpbusd_avx_epi32(acc, b, a) : _mm256_dpbusd_avx_epi32(acc, a, b);
}

/* 6 rows x 2 ymm (one panel): 12 accumulators, 2 B vectors and the broadcast row fill 15
 * of the 16 ymm registers.  The vocabulary, and so the epilogue, FWHT and quantizer, are
 * avx2's. */
#define W8_AVXVNNI_MR 6
#define W8_AVXVNNI_NPANELS 1
#define W8_UK(name) w8_avxvnni_##name
#define W8_UK_TARGET W8_AVXVNNI
#define W8_UK_MR W8_AVXVNNI_MR
#define W8_UK_NVEC 2
#define W8_UK_A __m256i
#define W8_UK_B __m256i
#define W8_UK_BCAST w8_avx2_bcast_quad
#define W8_UK_LOAD_B w8_avx2_load_quads
#define W8_UK_DOT w8_avxvnni_dot
#define W8_V(name) w8_avx2_##name
#include "ukernel.h"
#undef W8_V

/* Without tree-PRE, as avx2.h's probe: with it GCC copied and stored 10 of the 12
 * accumulators to the stack on every round, and the probe read 577 GOPS on 2 Zen 5 threads
 * where the product itself ran at 951 (1055 without). */
W8_PEAK_FN(w8_avxvnni_peak, W8_AVXVNNI W8_NO_TREE_PRE, __m256i,
           _mm256_set1_epi8((char)(*sink | 3)), _mm256_set1_epi8(5), _mm256_set1_epi32,
           _mm256_dpbusd_avx_epi32, _mm256_add_epi32, _mm256_cvtsi256_si32, 32)

#endif
#endif
