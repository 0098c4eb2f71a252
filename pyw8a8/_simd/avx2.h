/* The AVX2 ISA, "avx2", for CPUs without VNNI: the flip trick on expanded rows.
 *
 * vpmaddubsw multiplies u8 by s8 and adds adjacent pairs with int16 saturation: with biased
 * weights (up to 255) times activations (up to 127) a pair reaches 64770 and saturates (ONNX
 * Runtime's AVX2 kernel multiplies so, inexactly).  This ISA keeps each factor's magnitude
 * at most 128: |a| times the weight with its bits flipped where a < 0 (~w = -w - 1), which
 * is a * w less |a| there; ~w lies in [-128, 126], so a pair is at most 2 * 127 * 128 =
 * 32512: exact.  The sums are a . w + sum(min(a, 0)), corrected per row from the
 * activations' prefix sums of their negative values (W8_CORR_NEG).
 *
 * The flip is a vpxor, which any of Zen 3's four vector pipes runs: per 32 multiply-
 * accumulates vpxor, vpmaddubsw, vpmaddwd (by ones) and vpaddd, two of them on the two
 * pipes that multiply, the bound of ONNX Runtime's three-instruction sequence too.  Each row
 * is expanded once per call (w8_avx2_flip_expand_row: per quad its magnitudes, then the mask
 * of its negative values), so a row's quad costs the kernel two broadcast loads and no
 * arithmetic.  The exact alternatives put more of the step on the multiplying pipes: the
 * sign trick |w| * sign(a, w) (vpsignb multiplies: 3 of its 4 instructions) and the flip
 * computing |a| and the mask in the kernel (vpabsb multiplies too); the 2 x 4 tile below
 * runs 1.3x as fast as the sign trick (a Zen 3 core, L1-resident panels). */
#ifndef PYW8A8_SIMD_AVX2_H
#define PYW8A8_SIMD_AVX2_H

#include "fwht.h"
#include "scalar.h"
#include "vec_avx2.h"
#if defined(W8_X86)

#define W8_V(name) w8_avx2_##name
#define W8_V_TARGET W8_AVX2
#include "epilogue.h"
#include "absmax.h"

/* One A row's quad as the flip trick reads it from an expanded row: its magnitudes and its
 * mask, two broadcast loads. */
typedef struct {
    __m256i mag, mask;
} w8_avx2_quad;

W8_AVX2 W8_INLINE w8_avx2_quad w8_avx2_flip_bcast(const uint8_t *row, int64_t q)
{
    const w8_avx2_quad a = {_mm256_set1_epi32(w8_load_i32(row + 8 * q)),
                            _mm256_set1_epi32(w8_load_i32(row + 8 * q + 4))};
    return a;
}

/* acc + (a . w + sum(min(a, 0))) over each group of four bytes: the mask turns the stored
 * weight, in either encoding, into w flipped where a < 0. */
W8_AVX2 W8_INLINE __m256i w8_avx2_flip_dot(__m256i acc, w8_avx2_quad a, __m256i b, int biased)
{
    (void)biased;
    const __m256i pairs = _mm256_maddubs_epi16(a.mag, _mm256_xor_si256(b, a.mask));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* 2 rows x 4 ymm (two panels): 8 accumulators, the row's magnitudes and mask, the ones of
 * vpmaddwd and a product per B vector (GCC folds the B loads into the vpxor).  Each row's
 * two broadcasts serve 4 multiplies: the fastest of the tiles that fit the 16 registers
 * (4 x 2, whose broadcasts serve 2, ran about 5% slower on a Zen 3 core; taller ones
 * spill). */
#define W8_AVX2_MR 2
#define W8_AVX2_NPANELS 2
#define W8_UK(name) w8_avx2_##name
#define W8_UK_TARGET W8_AVX2
#define W8_UK_MR W8_AVX2_MR
#define W8_UK_NVEC 4
#define W8_UK_A w8_avx2_quad
#define W8_UK_B __m256i
#define W8_UK_BCAST w8_avx2_flip_bcast
#define W8_UK_LOAD_B w8_avx2_load_quads /* either encoding: the mask turns biased ones signed */
#define W8_UK_DOT w8_avx2_flip_dot
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
#define W8_FW_TWO_BLOCKS 0
#include "fwht_driver.h"

/* w8_prefix_sums_fn: each 64-byte chunk's signed sum from vpsadbw, which adds unsigned
 * bytes, over the bytes XOR (flip ^ 0x80), i.e. the signed values + 128, less 64 * 128:
 * 11 instructions a chunk where the compiler's SSE2 loop of the reference took three times
 * as long.  The running total wraps as uint32, as the compensation reads it. */
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

/* w8_expand_row_fn of the flip trick: each quad of values v (the bytes XOR flip) becomes
 * its magnitudes |v| and then its mask: 0xFF where v < 0, XOR 0x80 ^ flip, which also
 * turns weights stored biased (the encoding whose rows have flip 0) signed.  In place, 8
 * quads at a time: the 64 bytes written for quads j to j + 7 end where the quantized bytes
 * of quad j + 8 start at the earliest, since 4 (j + 8) <= Kp. */
W8_AVX2 static void w8_avx2_flip_expand_row(uint8_t *row, int64_t Kp, uint8_t flip)
{
    const __m256i unflip = _mm256_set1_epi8((char)flip);
    const __m256i to_signed = _mm256_set1_epi8((char)(flip ^ 0x80));
    for (int64_t j = 0; j < Kp / 4; j += 8) {
        const __m256i v =
            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + Kp + 4 * j)), unflip);
        const __m256i mag = _mm256_abs_epi8(v);
        const __m256i mask =
            _mm256_xor_si256(_mm256_cmpgt_epi8(_mm256_setzero_si256(), v), to_signed);
        /* Per 128-bit half: quads 0, 1 (lo) and 2, 3 (hi) of its 4, each beside its mask. */
        const __m256i lo = _mm256_unpacklo_epi32(mag, mask);
        const __m256i hi = _mm256_unpackhi_epi32(mag, mask);
        _mm256_storeu_si256((__m256i *)(row + 8 * j), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(row + 8 * j + 32),
                            _mm256_permute2x128_si256(lo, hi, 0x31));
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

/* The instruction peak of avx2's inner step: vpxor + vpmaddubsw + vpmaddwd + vpaddd
 * (32 MACs).  Each chain's accumulator is also its mask operand, so none of the four
 * instructions is loop-invariant (with constant operands the compiler hoists all but the
 * vpaddd).  The values do not change the speed, so the magnitudes are the weights and
 * vpmaddwd multiplies its pairs by themselves rather than by ones, and GCC's PRE is off:
 * the 12 chains and their products then fit the 16 registers (otherwise GCC keeps
 * accumulators on the stack, and the "peak" came out at 0.6x the kernel's own rate on a
 * Zen 3 core). */
W8_AVX2 W8_INLINE __m256i w8_avx2_peak_step(__m256i x, __m256i b, __m256i unused)
{
    (void)unused;
    const __m256i pairs = _mm256_maddubs_epi16(b, _mm256_xor_si256(b, x));
    return _mm256_add_epi32(x, _mm256_madd_epi16(pairs, pairs));
}

W8_PEAK_FN(w8_avx2_peak, W8_AVX2 W8_NO_TREE_PRE, __m256i, _mm256_set1_epi8((char)(*sink | 3)),
           _mm256_setzero_si256(), _mm256_set1_epi32, w8_avx2_peak_step, _mm256_add_epi32,
           _mm256_cvtsi256_si32, 32)
#undef W8_V
#undef W8_V_TARGET
#endif
#endif
