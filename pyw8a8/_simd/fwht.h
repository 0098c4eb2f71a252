/* Block randomized Walsh-Hadamard rotation: the sign hash, the in-place FWHT per ISA, and
 * the row transforms shared by the fused quantizer (quant.h) and _rotation.pyx.
 *
 * The rotation of a row of K = nb * block values is, per block of `block` positions,
 *     y = H (c D x),   c = 1 / sqrt(block),
 * with H the unnormalized Sylvester (natural order) Hadamard matrix and D the diagonal of
 * +-1 signs given by w8_sign_bit of the absolute position k in [0, K).  c D is applied in
 * one multiply by +-c (the sign is XORed into c), so the transform never forms H D x, whose
 * values are sqrt(block) times larger: nothing overflows unless the rotated row does.
 * Its inverse (and transpose) is x = D (c H y).
 *
 * Every FWHT here runs the same butterfly network, (a, b) -> (a + b, a - b) on the pairs at
 * distance h = 1, 2, 4, ..., n/2, each butterfly on the outputs of the previous stage; only
 * the schedule differs.  The SIMD stages inside a register compute a + b as fma(a, +1, b)
 * and a - b as fma(b, -1, a): the product is exact, so the single rounding equals that of
 * the add or sub.  Every path therefore returns bit-identical results. */
#ifndef PYW8A8_SIMD_FWHT_H
#define PYW8A8_SIMD_FWHT_H

#include "common.h"
#if defined(W8_ARM64)
#include "neon.h"
#endif
#if defined(W8_X86)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------------------------------
 * Sign hash.  For a fixed seed, positions are split into aligned windows of 65,536; in each
 * window the low 16 bits of the position go through a keyed bijection of 16-bit values and
 * the sign is its top bit, so exactly 32,768 positions of every window are negative.  The
 * key mixes the seed with the window index (the high 16 bits) once per window, in scalar
 * code; per position the work is 16-bit only (three multiplies by odd constants, two
 * xorshifts, a key add and XOR), which SIMD does with vpmullw instead of the slow 32-bit
 * vpmulld.  Each step is a bijection on 16 bits: XOR or add of a constant, multiply by an
 * odd constant, x ^= x >> s.  The xorshifts carry high input bits down into the low bits
 * that the next multiply spreads upward into the top bit; without them bit 15 of x * odd
 * would depend on the position in a way with short-range structure. */
#define W8_SIGN_M1 0xC687u
#define W8_SIGN_M2 0x7E1Bu
#define W8_SIGN_M3 0x6251u

static inline uint32_t w8_sign_key(uint32_t window, uint32_t seed)
{
    uint32_t k = seed ^ (window * 0x9E3779B9u);
    k ^= k >> 16;
    k *= 0x6C8E9CF5u;
    k ^= k >> 15;
    k *= 0x2F4A7C15u;
    k ^= k >> 16;
    return k;
}

/* The keyed 16-bit bijection; the sign is bit 15 of the result. */
static inline uint32_t w8_sign_perm(uint32_t lo, uint32_t key)
{
    uint32_t x = (lo ^ key) & 0xFFFFu;
    x = (x * W8_SIGN_M1) & 0xFFFFu;
    x ^= x >> 8;
    x = (x * W8_SIGN_M2 + (key >> 16)) & 0xFFFFu;
    x ^= x >> 7;
    return (x * W8_SIGN_M3) & 0xFFFFu;
}

/* 1 if position `pos` is negated under `seed`, else 0. */
static inline uint32_t w8_sign_bit(uint32_t pos, uint32_t seed)
{
    return w8_sign_perm(pos & 0xFFFFu, w8_sign_key(pos >> 16, seed)) >> 15;
}

/* y[i] = x[i] * (+-c), negated where w8_sign_bit(pos + i, seed); y may be x. */
typedef void (*w8_sign_scale_fn)(const float *x, float *y, int64_t n, uint32_t pos,
                                 uint32_t seed, float c);

static void w8_sign_scale_scalar(const float *x, float *y, int64_t n, uint32_t pos,
                                 uint32_t seed, float c)
{
    uint32_t cbits;
    memcpy(&cbits, &c, 4);
    while (n > 0) {
        /* Positions [pos, pos + len) share one window and so one key. */
        const int64_t room = 0x10000 - (int64_t)(pos & 0xFFFFu);
        const int64_t len = n < room ? n : room;
        const uint32_t key = w8_sign_key(pos >> 16, seed);
        for (int64_t i = 0; i < len; i++) {
            const uint32_t lo = (pos & 0xFFFFu) + (uint32_t)i;
            const uint32_t bits = cbits ^ ((w8_sign_perm(lo, key) >> 15) << 31);
            float sc;
            memcpy(&sc, &bits, 4);
            y[i] = x[i] * sc;
        }
        x += len;
        y += len;
        pos += (uint32_t)len;
        n -= len;
    }
}

/* ---------------------------------------------------------------------------------------
 * FWHT: x <- H x in place, n a power of two (n = 1 leaves x unchanged). */
typedef void (*w8_fwht_fn)(float *x, int64_t n);

static void w8_fwht_scalar(float *x, int64_t n)
{
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

/* Butterflies between whole registers: the stages of distance 1, 2, ..., nreg/2 registers
 * on an array `r` of `nreg` vectors of type T (shared by the AVX2 and AVX-512 code).  Both
 * loops have constant trip counts once nreg is a literal, so they unroll fully and `r`
 * stays in registers; butterfly p of a stage of distance h pairs j with j + h, where j is
 * p with a zero bit inserted at h. */
#define W8_FWHT_REG_STAGES(T, r, nreg, ADD, SUB)                                         \
    for (int h_ = 1; h_ < (nreg); h_ *= 2)                                               \
        for (int p_ = 0; p_ < (nreg) / 2; p_++) {                                        \
            const int j_ = (p_ / h_) * 2 * h_ + p_ % h_;                                 \
            const T a_ = (r)[j_], b_ = (r)[j_ + h_];                                     \
            (r)[j_] = ADD(a_, b_);                                                       \
            (r)[j_ + h_] = SUB(a_, b_);                                                  \
        }

#if defined(W8_X86)
#define W8_FWHT_AVX2 W8_TARGET("avx2,fma")
#define W8_FWHT_AVX512 W8_TARGET("avx2,fma,avx512f")

/* ---- AVX2: 8 floats per ymm. ---- */

/* The three stages inside one register (h = 1, 2, 4): p holds each lane's partner; lanes
 * whose h bit is set take p - v, the others v + p. */
W8_FWHT_AVX2 W8_INLINE __m256 w8_fwht8_avx2(__m256 v)
{
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    v = _mm256_fmadd_ps(v, s1, _mm256_permute_ps(v, 0xB1));          /* swap pairs */
    v = _mm256_fmadd_ps(v, s2, _mm256_permute_ps(v, 0x4E));          /* swap pairs of 2 */
    v = _mm256_fmadd_ps(v, s4, _mm256_permute2f128_ps(v, v, 0x01));  /* swap halves */
    return v;
}

/* Whole transform of 8 * nreg contiguous floats (nreg <= 8) in registers. */
W8_FWHT_AVX2 W8_INLINE void w8_fwht_avx2_regs(float *x, int nreg)
{
    __m256 r[8];
    for (int i = 0; i < nreg; i++) r[i] = w8_fwht8_avx2(_mm256_loadu_ps(x + 8 * i));
    W8_FWHT_REG_STAGES(__m256, r, nreg, _mm256_add_ps, _mm256_sub_ps)
    for (int i = 0; i < nreg; i++) _mm256_storeu_ps(x + 8 * i, r[i]);
}

/* A 128-block with fewer stores than two full passes (the transform is store-bound): the
 * first half's six inner stages are stored once, and the last stage (h = 64) combines
 * them, reloaded from L1, with the second half still in registers.  The same butterflies
 * in the same order as every other path, so the same bits. */
W8_FWHT_AVX2 W8_INLINE void w8_fwht_avx2_128(float *x)
{
    w8_fwht_avx2_regs(x, 8);
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = w8_fwht8_avx2(_mm256_loadu_ps(x + 64 + 8 * i));
    W8_FWHT_REG_STAGES(__m256, r, 8, _mm256_add_ps, _mm256_sub_ps)
    for (int i = 0; i < 8; i++) {
        const __m256 a = _mm256_loadu_ps(x + 8 * i);
        _mm256_storeu_ps(x + 8 * i, _mm256_add_ps(a, r[i]));
        _mm256_storeu_ps(x + 64 + 8 * i, _mm256_sub_ps(a, r[i]));
    }
}

/* `stages` consecutive stages h, 2h, ... (h >= 8) in one pass over memory: each group of
 * 2^stages vectors at stride h stays in registers for all of them. */
W8_FWHT_AVX2 W8_INLINE void w8_fwht_avx2_pass(float *x, int64_t n, int64_t h, int stages)
{
    const int nreg = 1 << stages;
    for (int64_t base = 0; base < n; base += h * nreg)
        for (int64_t j = base; j < base + h; j += 8) {
            __m256 r[8];
            for (int i = 0; i < nreg; i++) r[i] = _mm256_loadu_ps(x + j + i * h);
            W8_FWHT_REG_STAGES(__m256, r, nreg, _mm256_add_ps, _mm256_sub_ps)
            for (int i = 0; i < nreg; i++) _mm256_storeu_ps(x + j + i * h, r[i]);
        }
}

W8_FWHT_AVX2 static void w8_fwht_avx2(float *x, int64_t n)
{
    if (n < 8) {
        w8_fwht_scalar(x, n);
        return;
    }
    /* Stages h < 128 in chunks of up to 128 floats, then the rest three at a time.  nreg
     * and stages are literal in each call so the register arrays unroll. */
    const int64_t chunk = n < 128 ? n : 128;
    for (int64_t i = 0; i < n; i += chunk) {
        switch (chunk) {
        case 128: w8_fwht_avx2_128(x + i); break;
        case 64: w8_fwht_avx2_regs(x + i, 8); break;
        case 32: w8_fwht_avx2_regs(x + i, 4); break;
        case 16: w8_fwht_avx2_regs(x + i, 2); break;
        default: w8_fwht_avx2_regs(x + i, 1); break;
        }
    }
    for (int64_t h = chunk; h < n;) {
        if (8 * h <= n) {
            w8_fwht_avx2_pass(x, n, h, 3);
            h *= 8;
        } else if (4 * h <= n) {
            w8_fwht_avx2_pass(x, n, h, 2);
            h *= 4;
        } else {
            w8_fwht_avx2_pass(x, n, h, 1);
            h *= 2;
        }
    }
}

/* Sign hash of 16 positions per 16-bit-lane register (vpmullw, not the slow 32-bit
 * vpmulld).  Lanes hold positions in the order 0-3, 8-11 | 4-7, 12-15, which is the order
 * that vpunpcklwd / vpunpckhwd (interleaving within 128-bit halves) turn into the float
 * sign masks of positions 0-7 and 8-15. */
W8_FWHT_AVX2 static void w8_sign_scale_avx2(const float *x, float *y, int64_t n,
                                            uint32_t pos, uint32_t seed, float c)
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
        w8_sign_scale_scalar(x + i, y + i, len - i, pos + (uint32_t)i, seed, c);
        x += len;
        y += len;
        pos += (uint32_t)len;
        n -= len;
    }
}

/* ---- AVX-512: 16 floats per zmm; same structure as AVX2. ---- */

/* The four stages inside one register (h = 1, 2, 4, 8); the last two swap 128-bit lanes. */
W8_FWHT_AVX512 W8_INLINE __m512 w8_fwht16_avx512(__m512 v)
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

W8_FWHT_AVX512 W8_INLINE void w8_fwht_avx512_regs(float *x, int nreg)
{
    __m512 r[8];
    for (int i = 0; i < nreg; i++) r[i] = w8_fwht16_avx512(_mm512_loadu_ps(x + 16 * i));
    W8_FWHT_REG_STAGES(__m512, r, nreg, _mm512_add_ps, _mm512_sub_ps)
    for (int i = 0; i < nreg; i++) _mm512_storeu_ps(x + 16 * i, r[i]);
}

/* As w8_fwht_avx2_pass, for h >= 16. */
W8_FWHT_AVX512 W8_INLINE void w8_fwht_avx512_pass(float *x, int64_t n, int64_t h,
                                                  int stages)
{
    const int nreg = 1 << stages;
    for (int64_t base = 0; base < n; base += h * nreg)
        for (int64_t j = base; j < base + h; j += 16) {
            __m512 r[8];
            for (int i = 0; i < nreg; i++) r[i] = _mm512_loadu_ps(x + j + i * h);
            W8_FWHT_REG_STAGES(__m512, r, nreg, _mm512_add_ps, _mm512_sub_ps)
            for (int i = 0; i < nreg; i++) _mm512_storeu_ps(x + j + i * h, r[i]);
        }
}

W8_FWHT_AVX512 static void w8_fwht_avx512(float *x, int64_t n)
{
    if (n < 16) {
        w8_fwht_avx2(x, n);
        return;
    }
    const int64_t chunk = n < 128 ? n : 128;
    for (int64_t i = 0; i < n; i += chunk) {
        switch (chunk) {
        case 128: w8_fwht_avx512_regs(x + i, 8); break;
        case 64: w8_fwht_avx512_regs(x + i, 4); break;
        case 32: w8_fwht_avx512_regs(x + i, 2); break;
        default: w8_fwht_avx512_regs(x + i, 1); break;
        }
    }
    for (int64_t h = chunk; h < n;) {
        if (8 * h <= n) {
            w8_fwht_avx512_pass(x, n, h, 3);
            h *= 8;
        } else if (4 * h <= n) {
            w8_fwht_avx512_pass(x, n, h, 2);
            h *= 4;
        } else {
            w8_fwht_avx512_pass(x, n, h, 1);
            h *= 2;
        }
    }
}
#endif

/* The FWHT of an instruction-set path (names as in dispatch.h). */
static w8_fwht_fn w8_fwht_for(const char *isa_name)
{
#if defined(W8_X86)
    if (strcmp(isa_name, "avx512vnni") == 0 || strcmp(isa_name, "amx") == 0)
        return w8_fwht_avx512;
    if (strcmp(isa_name, "avx2") == 0 || strcmp(isa_name, "avxvnni") == 0)
        return w8_fwht_avx2;
#endif
#if defined(W8_ARM64)
    if (strcmp(isa_name, "neondot") == 0 || strcmp(isa_name, "neon") == 0)
        return w8_fwht_neon;
#endif
    return w8_fwht_scalar;
}

/* The sign application of a path; every x86 SIMD path shares the AVX2 one (it is a small
 * part of the rotation's cost, and its result is exact whatever the width). */
static w8_sign_scale_fn w8_sign_scale_for(const char *isa_name)
{
#if defined(W8_X86)
    if (strcmp(isa_name, "avx512vnni") == 0 || strcmp(isa_name, "avx2") == 0 ||
        strcmp(isa_name, "avxvnni") == 0)
        return w8_sign_scale_avx2;
#endif
    return w8_sign_scale_scalar;
}

/* ---------------------------------------------------------------------------------------
 * Row transforms; block is a power of two. */

/* 1/sqrt(block), the one value every path multiplies by. */
static inline float w8_rotation_norm(int64_t block)
{
    return (float)(1.0 / sqrt((double)block));
}

/* y = H (c D x) per block (see the top of this file).  x holds K values and y the K
 * rounded up to a multiple of block: a last partial block is zero-padded (the rotation of
 * x with zeros appended), so y may be x only when block divides K. */
static void w8_rotate_row(w8_fwht_fn fwht, w8_sign_scale_fn sign_scale, const float *x,
                          float *y, int64_t K, int64_t block, uint32_t seed)
{
    const float c = w8_rotation_norm(block);
    int64_t k = 0;
    for (; k + block <= K; k += block) {
        sign_scale(x + k, y + k, block, (uint32_t)k, seed, c);
        fwht(y + k, block);
    }
    if (k < K) {
        sign_scale(x + k, y + k, K - k, (uint32_t)k, seed, c);
        memset(y + K, 0, (size_t)(k + block - K) * sizeof(float));
        fwht(y + k, block);
    }
}

/* x = D (c H y) per block: the inverse of w8_rotate_row; x may be y. */
static void w8_unrotate_row(w8_fwht_fn fwht, w8_sign_scale_fn sign_scale, const float *y,
                            float *x, int64_t K, int64_t block, uint32_t seed)
{
    const float c = w8_rotation_norm(block);
    if (x != y) memcpy(x, y, (size_t)K * sizeof(float));
    for (int64_t k = 0; k < K; k += block) {
        fwht(x + k, block);
        sign_scale(x + k, x + k, block, (uint32_t)k, seed, c);
    }
}

#endif
