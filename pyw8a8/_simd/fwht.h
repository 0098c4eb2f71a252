/* Block randomized Walsh-Hadamard rotation: the sign hash, the in-place FWHT per ISA, and
 * the row transforms shared by the fused quantizer (quant.h) and _rows.pyx.
 *
 * The rotation of a row of K = nb * block values is, per block of `block` positions,
 *     y = H (c D x),   c = 1 / sqrt(block),
 * with H the unnormalized Sylvester (natural order) Hadamard matrix and D the diagonal of
 * +-1 signs given by w8_sign_bit of the absolute position k in [0, K).  c D is applied in
 * one multiply by +-c (the sign is XORed into c), so the transform never forms H D x, whose
 * values are sqrt(block) times larger: nothing overflows unless the rotated row does.
 * Its inverse (and transpose) is x = D (c H y).
 *
 * This file holds what every ISA shares: the sign hash, the plain-C FWHT (the reference
 * network) and sign application, and the row transforms; each SIMD FWHT lives in its
 * instruction set's header (avx2.h, avx512vnni.h, neon.h), as the kernels do, the x86 ones
 * instantiating the template fwht_driver.h.
 *
 * Every FWHT runs the same butterfly network, (a, b) -> (a + b, a - b) on the pairs at
 * distance h = 1, 2, 4, ..., n/2, each butterfly on the outputs of the previous stage; only
 * the schedule differs.  The SIMD stages inside a register compute a + b as fma(a, +1, b)
 * and a - b as fma(b, -1, a): the product is exact, so the single rounding equals that of
 * the add or sub.  Every ISA therefore returns bit-identical results. */
#ifndef PYW8A8_SIMD_FWHT_H
#define PYW8A8_SIMD_FWHT_H

#include "common.h"

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

/* The sign application (w8_sign_scale_fn of common.h) in plain C. */
static void w8_scalar_sign_scale(const float *x, float *y, int64_t n, uint32_t pos,
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
 * FWHT (w8_fwht_fn of common.h): x <- H x in place, n a power of two. */

static void w8_scalar_fwht(float *x, int64_t n)
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
 * on an array `r` of `nreg` vectors of type T (of fwht_driver.h, any vector width).  Both
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


/* ---------------------------------------------------------------------------------------
 * Row transforms; block is a power of two. */

/* 1/sqrt(block), the one value every ISA multiplies by. */
static inline float w8_rotation_norm(int64_t block)
{
    return (float)(1.0 / sqrt((double)block));
}

/* y = H (c D x) per block (see the top of this file).  x holds K values and y the K
 * rounded up to a multiple of block: a last partial block is zero-padded (the rotation of
 * x with zeros appended), so y may be x only when block divides K. */
static inline void w8_rotate_row(w8_fwht_fn fwht, w8_sign_scale_fn sign_scale, const float *x,
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

/* The signs of a row's rotation as a table: s[k] = +-c for the positions k in [0, K), the
 * factors w8_rotate_row's sign_scale multiplies by. */
static inline void w8_sign_table(w8_sign_scale_fn sign_scale, float *s, int64_t K,
                                 int64_t block, uint32_t seed)
{
    for (int64_t k = 0; k < K; k++) s[k] = 1.0f;
    sign_scale(s, s, K, 0, seed, w8_rotation_norm(block));
}

/* w8_rotate_absmax_fn through an ISA's in-place FWHT and absmax: w8_rotate_row with the
 * signs from a table (w8_sign_table), each block's multiply then its transform, then the
 * largest magnitude of the K rounded up to block values.  The reference (the scalar ISA's),
 * which each SIMD ISA's fused pass matches bit for bit (fwht_driver.h). */
#define W8_ROTATE_ABSMAX_BY(name, fwht, absmax)                                          \
    static int name(const float *x, const float *s, float *y, int64_t K, int64_t block,   \
                    float *amax)                                                         \
    {                                                                                    \
        const int64_t Kr = (K + block - 1) / block * block;                              \
        for (int64_t k = 0; k < Kr; k += block) {                                        \
            const int64_t n = K - k < block ? K - k : block;                             \
            for (int64_t i = k; i < k + n; i++) y[i] = x[i] * s[i];                      \
            memset(y + k + n, 0, (size_t)(block - n) * sizeof(float));                   \
            fwht(y + k, block);                                                          \
        }                                                                                \
        return absmax(y, Kr, amax);                                                      \
    }

/* x = D (c H y) per block: the inverse of w8_rotate_row; x may be y. */
static inline void w8_unrotate_row(w8_fwht_fn fwht, w8_sign_scale_fn sign_scale, const float *y,
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
