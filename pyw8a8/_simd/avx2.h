/* AVX2 paths for CPUs without VNNI: "avx2", and "avx2_gemv" for products of few rows.
 *
 * vpmaddubsw multiplies u8 by s8 and adds adjacent pairs with int16 saturation: with biased
 * weights (up to 255) times activations (up to 127) a pair reaches 64770 and saturates.
 * Both paths therefore keep each factor's magnitude at most 128:
 *
 *   avx2, the sign trick: |w| * sign(a, w) equals a * w, both factors at most 127, so a
 *   pair is at most 2 * 127 * 127 = 32258 < 32767: exact with no correction.  Biased
 *   weights turn back into signed ones with one XOR.  vpsignb, vpmaddubsw and vpmaddwd all
 *   run on the two vector pipes that multiply on Zen 2/3 (3 of the 4 instructions per 32
 *   multiply-accumulates).
 *
 *   avx2_gemv, the flip trick: |a| times w with its bits flipped where a < 0 (~w = -w - 1),
 *   which is a * w less |a| there; ~w lies in [-128, 126], so a pair is at most
 *   2 * 127 * 128 = 32512: exact.  Its sums are a . w + sum(min(a, 0)), corrected per row
 *   from the activations' prefix sums of their negative values (W8_CORR_NEG).  The flip is
 *   a vpxor, which any vector pipe runs: 2 of 4 instructions on the multiplying pipes.
 *   The row's vpabsb and vpcmpgtb are shared by its 4 B vectors, so this pays where the
 *   B panels stream and the rows are few: measured on Zen 3 (2 threads, K x N = 1152 x
 *   6912, 4096 x 4096, 640 x 2048) 1.3-2.0x "avx2" at M = 1, but 0.8x from M = 8, where
 *   "avx2"'s 4 x 2 tile reads each B vector for 4 rows (_cpu.py's small-M fallback). */
#ifndef PYW8A8_SIMD_AVX2_H
#define PYW8A8_SIMD_AVX2_H

#include "fwht.h"
#include "scalar.h"
#include "vec_avx2.h"
#if defined(W8_X86)

#define W8_V(name) w8_avx2_##name
#define W8_V_TARGET W8_AVX2
#include "epilogue.h"

/* The 4 activation bytes at p in every 32-bit lane. */
W8_AVX2 W8_INLINE __m256i w8_avx2_bcast(const uint8_t *p)
{
    return _mm256_set1_epi32(w8_load_i32(p));
}

/* A B vector of the sign trick: the weights as signed bytes (biased ones, q + 128, turn back
 * into q with one XOR), whose signs go to the activations, and their magnitudes, which every
 * row of the tile shares. */
typedef struct {
    __m256i w, mag;
} w8_avx2_b;

W8_AVX2 W8_INLINE w8_avx2_b w8_avx2_load_b(const uint8_t *p, int biased)
{
    __m256i w = _mm256_loadu_si256((const __m256i *)p);
    if (biased) w = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
    const w8_avx2_b b = {w, _mm256_abs_epi8(w)};
    return b;
}

/* a * b summed over each group of four bytes, through |b| * sign(a, b). */
W8_AVX2 W8_INLINE __m256i w8_avx2_dot(__m256i acc, __m256i a, w8_avx2_b b, int biased)
{
    (void)biased;
    const __m256i pairs = _mm256_maddubs_epi16(b.mag, _mm256_sign_epi8(a, b.w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* avx2: 4 rows x 2 ymm (one panel): 8 accumulators, 2 B vectors and their absolute values, the
 * broadcast row and a product fill 14 of the 16 ymm registers. */
#define W8_AVX2_MR 4
#define W8_AVX2_NPANELS 1
#define W8_UK(name) w8_avx2_##name
#define W8_UK_TARGET W8_AVX2
#define W8_UK_MR W8_AVX2_MR
#define W8_UK_NVEC 2
#define W8_UK_A __m256i
#define W8_UK_B w8_avx2_b
#define W8_UK_BCAST w8_avx2_bcast
#define W8_UK_LOAD_B w8_avx2_load_b
#define W8_UK_DOT w8_avx2_dot
#include "ukernel.h"

/* One A row's broadcast quad as w8_avx2gemv_dot reads it: its magnitudes, and the mask of its
 * negative bytes (for signed weights) or that mask XOR 0x80 (for biased ones: the XOR that
 * also turns them signed).  Each kernel uses one of the two masks; the other is dead code. */
typedef struct {
    __m256i mag, neg, neg_biased;
} w8_avx2gemv_a;

W8_AVX2 W8_INLINE w8_avx2gemv_a w8_avx2gemv_bcast(const uint8_t *p)
{
    const __m256i a = w8_avx2_bcast(p);
    const __m256i neg = _mm256_cmpgt_epi8(_mm256_setzero_si256(), a);
    const w8_avx2gemv_a row = {_mm256_abs_epi8(a), neg,
                               _mm256_xor_si256(neg, _mm256_set1_epi8((char)0x80))};
    return row;
}

/* A B vector as stored (either encoding: the flip's XOR mask turns biased ones signed). */
W8_AVX2 W8_INLINE __m256i w8_avx2_load_quads(const uint8_t *p, int biased)
{
    (void)biased;
    return _mm256_loadu_si256((const __m256i *)p);
}

/* acc + (a . b + sum(min(a, 0))) over each group of four bytes (the flip trick). */
W8_AVX2 W8_INLINE __m256i w8_avx2gemv_dot(__m256i acc, w8_avx2gemv_a a, __m256i b,
                                          int biased)
{
    const __m256i flipped = _mm256_xor_si256(b, biased ? a.neg_biased : a.neg);
    const __m256i pairs = _mm256_maddubs_epi16(a.mag, flipped);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* avx2_gemv: 2 rows x 4 ymm (two panels): 8 accumulators, 4 B vectors, the row's
 * magnitudes and mask and a product fill 15 of the 16 ymm registers.  Each row's
 * broadcast, vpabsb and vpcmpgtb serve 4 multiplies (at M = 1 this tile ran 1.3x a 4 x 2
 * one with the same arithmetic, and 3 x 4 was no faster). */
#define W8_AVX2GEMV_MR 2
#define W8_AVX2GEMV_NPANELS 2
#define W8_UK(name) w8_avx2gemv_##name
#define W8_UK_TARGET W8_AVX2
#define W8_UK_MR W8_AVX2GEMV_MR
#define W8_UK_NVEC 4
#define W8_UK_A w8_avx2gemv_a
#define W8_UK_B __m256i
#define W8_UK_BCAST w8_avx2gemv_bcast
#define W8_UK_LOAD_B w8_avx2_load_quads
#define W8_UK_DOT w8_avx2gemv_dot
#include "ukernel.h"

/* ---- FWHT (the network of fwht.h, template fwht_driver.h): 8 floats per ymm. ---- */

/* The three stages inside one register (h = 1, 2, 4): p holds each lane's partner; lanes
 * whose h bit is set take p - v, the others v + p. */
W8_AVX2 W8_INLINE __m256 w8_avx2_fwht8(__m256 v)
{
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    v = _mm256_fmadd_ps(v, s1, _mm256_permute_ps(v, 0xB1));          /* swap pairs */
    v = _mm256_fmadd_ps(v, s2, _mm256_permute_ps(v, 0x4E));          /* swap pairs of 2 */
    v = _mm256_fmadd_ps(v, s4, _mm256_permute2f128_ps(v, v, 0x01));  /* swap halves */
    return v;
}

#define W8_FW_IN_REG w8_avx2_fwht8
#define W8_FW_NARROW w8_scalar_fwht
#include "fwht_driver.h"

/* w8_prefix_sums_fn: each 64-byte chunk's signed sum from vpsadbw, which adds unsigned
 * bytes, over the bytes XOR (flip ^ 0x80), i.e. the signed values + 128, less 64 * 128:
 * 11 instructions a chunk where the compiler's SSE2 loop of the reference took three times
 * as long (a third of quantizing a row of 2048).  The running total wraps as uint32, as
 * the compensation reads it. */
W8_AVX2 static void w8_avx2_prefix_sums(const uint8_t *q, int64_t Kp, uint8_t flip,
                                        int32_t *psum)
{
    const __m256i to_unsigned = _mm256_set1_epi8((char)(flip ^ 0x80));
    const __m256i zero = _mm256_setzero_si256();
    uint32_t total = 0;
    psum[0] = 0;
    for (int64_t c = 0; c < Kp / W8_KPAD; c++) {
        const __m256i lo = _mm256_loadu_si256((const __m256i *)(q + c * W8_KPAD));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)(q + c * W8_KPAD + 32));
        const __m256i s =
            _mm256_add_epi64(_mm256_sad_epu8(_mm256_xor_si256(lo, to_unsigned), zero),
                             _mm256_sad_epu8(_mm256_xor_si256(hi, to_unsigned), zero));
        const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s),
                                         _mm256_extracti128_si256(s, 1));
        const int64_t biased = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1);
        total += (uint32_t)(biased - W8_KPAD * 128);
        psum[c + 1] = (int32_t)total;
    }
}

/* w8_prefix_sums_fn of W8_CORR_NEG: each 64-byte chunk's sum of min(v, 0) through
 * vpsadbw over |min(v, 0)| (at most 128: an unsigned byte). */
W8_AVX2 static void w8_avx2_negative_prefix_sums(const uint8_t *q, int64_t Kp, uint8_t flip,
                                                 int32_t *psum)
{
    const __m256i vflip = _mm256_set1_epi8((char)flip);
    const __m256i zero = _mm256_setzero_si256();
    int32_t total = 0;
    psum[0] = 0;
    for (int64_t c = 0; c < Kp / W8_KPAD; c++) {
        const __m256i lo = _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(q + c * W8_KPAD)), vflip);
        const __m256i hi = _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(q + c * W8_KPAD + 32)), vflip);
        const __m256i s = _mm256_add_epi64(
            _mm256_sad_epu8(_mm256_abs_epi8(_mm256_min_epi8(lo, zero)), zero),
            _mm256_sad_epu8(_mm256_abs_epi8(_mm256_min_epi8(hi, zero)), zero));
        const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s),
                                         _mm256_extracti128_si256(s, 1));
        total -= (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1));
        psum[c + 1] = total;
    }
}

/* Sign hash of 16 positions per 16-bit-lane register (vpmullw, not the slow 32-bit
 * vpmulld).  Lanes hold positions in the order 0-3, 8-11 | 4-7, 12-15, which is the order
 * that vpunpcklwd / vpunpckhwd (interleaving within 128-bit halves) turn into the float
 * sign masks of positions 0-7 and 8-15. */
W8_AVX2 static void w8_avx2_sign_scale(const float *x, float *y, int64_t n, uint32_t pos,
                                       uint32_t seed, float c)
{
    const __m256i m1 = _mm256_set1_epi16((short)W8_SIGN_M1),
                  m2 = _mm256_set1_epi16((short)W8_SIGN_M2),
                  m3 = _mm256_set1_epi16((short)W8_SIGN_M3),
                  step = _mm256_set1_epi16(16), top = _mm256_set1_epi16((short)0x8000),
                  order = _mm256_setr_epi16(0, 1, 2, 3, 8, 9, 10, 11,
                                            4, 5, 6, 7, 12, 13, 14, 15),
                  zero = _mm256_setzero_si256();
    const __m256 vc = _mm256_set1_ps(c);
    while (n > 0) {
        /* Positions [pos, pos + len) share one window and so one key. */
        const int64_t room = 0x10000 - (int64_t)(pos & 0xFFFFu);
        const int64_t len = n < room ? n : room;
        const uint32_t key = w8_sign_key(pos >> 16, seed);
        const __m256i k0 = _mm256_set1_epi16((short)(key & 0xFFFFu)),
                      k1 = _mm256_set1_epi16((short)(key >> 16));
        __m256i lo = _mm256_add_epi16(_mm256_set1_epi16((short)(pos & 0xFFFFu)), order);
        int64_t i = 0;
        for (; i + 16 <= len; i += 16) {
            __m256i h = _mm256_mullo_epi16(_mm256_xor_si256(lo, k0), m1);
            h = _mm256_xor_si256(h, _mm256_srli_epi16(h, 8));
            h = _mm256_add_epi16(_mm256_mullo_epi16(h, m2), k1);
            h = _mm256_xor_si256(h, _mm256_srli_epi16(h, 7));
            h = _mm256_and_si256(_mm256_mullo_epi16(h, m3), top);
            const __m256 s0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h)),
                         s1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h));
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i),
                                                  _mm256_xor_ps(vc, s0)));
            _mm256_storeu_ps(y + i + 8, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8),
                                                      _mm256_xor_ps(vc, s1)));
            lo = _mm256_add_epi16(lo, step);
        }
        w8_scalar_sign_scale(x + i, y + i, len - i, pos + (uint32_t)i, seed, c);
        x += len;
        y += len;
        pos += (uint32_t)len;
        n -= len;
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
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    return w8_absmax_finish(lanes, 8, x + i, n - i, amax);
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

/* The instruction peak of avx2's inner step: vpsignb + vpmaddubsw + vpmaddwd + vpaddd
 * (32 MACs).  Each chain's accumulator is also its activation operand, so none of the four
 * instructions is loop-invariant (with constant operands the compiler hoists all but the
 * vpaddd). */
W8_AVX2 W8_INLINE __m256i w8_avx2_peak_step(__m256i x, __m256i abs_b, __m256i b)
{
    const w8_avx2_b step = {b, abs_b};
    return w8_avx2_dot(x, x, step, 0);
}

W8_PEAK_FN(w8_avx2_peak, W8_AVX2, __m256i, _mm256_abs_epi8(_mm256_set1_epi8((char)(*sink | 3))),
           _mm256_set1_epi8((char)(*sink | 3)), _mm256_set1_epi32, w8_avx2_peak_step,
           _mm256_add_epi32, _mm256_cvtsi256_si32, 32)
/* The instruction peak of avx2_gemv's inner step: vpxor + vpmaddubsw + vpmaddwd + vpaddd
 * (32 MACs).  Each chain's accumulator is also its mask operand, so none of the four
 * instructions is loop-invariant (with constant operands the compiler hoists all but the
 * vpaddd). */
W8_AVX2 W8_INLINE __m256i w8_avx2gemv_peak_step(__m256i x, __m256i mag, __m256i b)
{
    const __m256i pairs = _mm256_maddubs_epi16(mag, _mm256_xor_si256(b, x));
    return _mm256_add_epi32(x, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

W8_PEAK_FN(w8_avx2gemv_peak, W8_AVX2, __m256i, _mm256_set1_epi8((char)((*sink | 3) & 0x7F)),
           _mm256_set1_epi8((char)(*sink | 3)), _mm256_set1_epi32, w8_avx2gemv_peak_step,
           _mm256_add_epi32, _mm256_cvtsi256_si32, 32)
#undef W8_V
#undef W8_V_TARGET
#endif
#endif
