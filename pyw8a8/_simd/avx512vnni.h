/* AVX-512 VNNI path (zmm vpdpbusd: Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4).
 * One quad row of a packed panel (16 channels x 4 K values) is exactly one zmm operand.
 * The encodings work as on the AVX-VNNI path (avxvnni.h).  The row quantizer and the
 * float epilogue also run here in zmm; the AMX path (amx.h) shares them. */
#ifndef PYW8A8_SIMD_AVX512VNNI_H
#define PYW8A8_SIMD_AVX512VNNI_H

#include "avx2.h"
#if defined(W8_X86)

#define W8_AVX512 W8_TARGET("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")

W8_AVX512 W8_INLINE __m512i w8_avx512_dot(__m512i acc, __m512i a, __m512i b, int biased)
{
    return biased ? _mm512_dpbusd_epi32(acc, b, a) : _mm512_dpbusd_epi32(acc, a, b);
}

/* The epilogue's scaling and the activations (activation.h) on 16 lanes, 2 x 8 doubles where
 * they need double (AVX-512F only: no DQ conversion). */
#define W8_AF(name) w8_avx512_##name
#define W8_AF_TARGET W8_AVX512
#define W8_AF_LANES 16
#define W8_AF_F __m512
#define W8_AF_D __m512d
#define W8_AF_I __m512i
#define W8_AF_FSET(c) _mm512_set1_ps(c)
#define W8_AF_FADD(a, b) _mm512_add_ps(a, b)
#define W8_AF_FSUB(a, b) _mm512_sub_ps(a, b)
#define W8_AF_FMUL(a, b) _mm512_mul_ps(a, b)
#define W8_AF_FDIV(a, b) _mm512_div_ps(a, b)
#define W8_AF_FMAX(a, b) _mm512_max_ps(a, b)
#define W8_AF_FMIN(a, b) _mm512_min_ps(a, b)
#define W8_AF_FSEL_NEG(c, x, y) \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask(c, _mm512_setzero_ps(), _CMP_LT_OQ), y, x)
#define W8_AF_ISEL_NEG(c, i, j) \
    _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(c, _mm512_setzero_ps(), _CMP_LT_OQ), j, i)
#define W8_AF_DSET(c) _mm512_set1_pd(c)
#define W8_AF_DADD(a, b) _mm512_add_pd(a, b)
#define W8_AF_DSUB(a, b) _mm512_sub_pd(a, b)
#define W8_AF_DMUL(a, b) _mm512_mul_pd(a, b)
#define W8_AF_DDIV(a, b) _mm512_div_pd(a, b)
#define W8_AF_DMAX(a, b) _mm512_max_pd(a, b)
#define W8_AF_DNEGABS(a) \
    _mm512_castsi512_pd(_mm512_or_si512(_mm512_castpd_si512(a), \
                                        _mm512_set1_epi64((long long)0x8000000000000000ull)))
#define W8_AF_DLO(f) _mm512_cvtps_pd(_mm512_castps512_ps256(f))
#define W8_AF_DHI(f) \
    _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)))
#define W8_AF_DTOF(lo, hi)                                                               \
    _mm512_castpd_ps(_mm512_insertf64x4(                                                 \
        _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(lo))),                   \
        _mm256_castps_pd(_mm512_cvtpd_ps(hi)), 1))
#define W8_AF_DLOW32(lo, hi)                                                             \
    _mm512_inserti64x4(                                                                  \
        _mm512_castsi256_si512(_mm512_cvtepi64_epi32(_mm512_castpd_si512(lo))),          \
        _mm512_cvtepi64_epi32(_mm512_castpd_si512(hi)), 1)
#define W8_AF_ISET(c) _mm512_set1_epi32(c)
#define W8_AF_IMAX(a, b) _mm512_max_epi32(a, b)
#define W8_AF_ISRA1(i) _mm512_srai_epi32(i, 1)
#define W8_AF_ISUB(a, b) _mm512_sub_epi32(a, b)
#define W8_AF_ICVT(i) _mm512_cvtepi32_ps(i)
#define W8_AF_IPOW2(i) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(i, _mm512_set1_epi32(127)), 23))
#define W8_AF_FLOAD(p) _mm512_loadu_ps(p)
#define W8_AF_FSTORE(p, v) _mm512_storeu_ps(p, v)
#define W8_AF_ILOAD(p) _mm512_loadu_si512((const void *)(p))
#include "activation.h"

/* The product's scaling (fin->g) of 16 sums, stored as floats at p: the one vector store of
 * the fused kernels and the per-tile epilogue (ukernel.h) of the zmm paths. */
W8_AVX512 W8_INLINE void w8_avx512_store_float(float *p, __m512i sums,
                                               const w8_tile_finish *fin, int r, int col)
{
    _mm512_storeu_ps(p, w8_avx512_scaled(sums, &fin->g, r, col));
}

/* 6 rows x 4 zmm (4 panels, 64 channels): 24 accumulators, 4 B vectors and the broadcast
 * row use 29 of the 32 zmm registers.  Per quad row: 4 B loads and 6 broadcasts (load
 * ports) for 24 vpdpbusd, so the two vpdpbusd ports bound the loop (12 cycles). */
#define W8_AVX512_MR 6
#define W8_AVX512_NPANELS 4
#define W8_UK(name) w8_avx512_##name
#define W8_UK_TARGET W8_AVX512
#define W8_UK_MR W8_AVX512_MR
#define W8_UK_VPP 1
#define W8_UK_NVEC 4
#define W8_UK_VEC __m512i
#define W8_UK_BVEC __m512i
#define W8_UK_BZERO() _mm512_setzero_si512()
#define W8_UK_AVEC __m512i
#define W8_UK_ZERO() _mm512_setzero_si512()
#define W8_UK_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define W8_UK_STORE(p, v) _mm512_storeu_si512((void *)(p), v)
#define W8_UK_ADD(x, y) _mm512_add_epi32(x, y)
#define W8_UK_BCAST(p) _mm512_set1_epi32(w8_load_i32(p))
#define W8_UK_LOAD_B(p, BIASED) _mm512_loadu_si512((const void *)(p))
#define W8_UK_PREP_B(b) (b)
#define W8_UK_DOT(acc, a, b, prep, BIASED) w8_avx512_dot(acc, a, b, BIASED)
#define W8_UK_STORE_FLOAT(p, sums, fin, r, col) w8_avx512_store_float(p, sums, fin, r, col)
#include "ukernel.h"

/* Max |x| of 16 floats at a time; the maximum is one of the inputs whatever the order, so
 * the result equals the scalar one bit for bit. */
W8_AVX512 static int w8_avx512_absmax(const float *x, int64_t n, float *amax)
{
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
    const __m512 fmax = _mm512_set1_ps(3.4028234663852886e38f);
    __m512 m = _mm512_setzero_ps();
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_castsi512_ps(
            _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i)), absmask));
        bad |= _mm512_cmp_ps_mask(v, fmax, _CMP_NLE_UQ); /* NaN or > FLT_MAX */
        m = _mm512_max_ps(m, v);
    }
    if (bad) return 1;
    float lanes[16];
    _mm512_storeu_ps(lanes, m);
    return w8_absmax_finish(lanes, 16, x + i, n - i, amax);
}

/* The AVX2 quantizer's arithmetic (multiply, clamp, round half to even) 16 floats at a
 * time; the clamp makes the saturating narrowing (vpmovsdb) exact. */
W8_AVX512 static void w8_avx512_quantize(const float *x, int64_t n, float inv, uint8_t flip,
                                         uint8_t *q)
{
    const __m512 vinv = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.0f),
                 lo = _mm512_set1_ps(-127.0f);
    const __m128i vflip = _mm_set1_epi8((char)flip);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        const __m128i bytes = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v));
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

#define W8_FW(name) w8_avx512_##name
#define W8_FW_TARGET W8_AVX512
#define W8_FW_VEC __m512
#define W8_FW_LANES 16
#define W8_FW_LOAD(p) _mm512_loadu_ps(p)
#define W8_FW_STORE(p, v) _mm512_storeu_ps(p, v)
#define W8_FW_ADD(x, y) _mm512_add_ps(x, y)
#define W8_FW_SUB(x, y) _mm512_sub_ps(x, y)
#define W8_FW_MUL(x, y) _mm512_mul_ps(x, y)
#define W8_FW_IN_REG(v) w8_avx512_fwht16(v)
#define W8_FW_NARROW(x, n) w8_avx2_fwht(x, n)
#include "fwht_driver.h"

W8_AVX512 W8_INLINE int32_t w8_avx512_first_lane(__m512i v)
{
    return _mm_cvtsi128_si32(_mm512_castsi512_si128(v));
}

W8_PEAK_FN(w8_avx512_peak, W8_AVX512, __m512i, _mm512_set1_epi8((char)(*sink | 3)),
           _mm512_set1_epi8(5), _mm512_set1_epi32, _mm512_dpbusd_epi32, _mm512_add_epi32,
           w8_avx512_first_lane, 64)

#endif
#endif
