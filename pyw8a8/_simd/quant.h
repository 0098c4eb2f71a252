/* Per-row symmetric int8 quantization, shared by every ISA (the ISA-specific parts are the
 * absmax, quantize, FWHT and sign entries of the ISA's registry entry). */
#ifndef PYW8A8_SIMD_QUANT_H
#define PYW8A8_SIMD_QUANT_H

#include "common.h"
#include <float.h>
#include "fwht.h"

/* Rows whose max |x| is below 127 * FLT_MIN quantize to zero: their scale max|x| / 127
 * would be a subnormal float, which cannot carry a faithful scale. */
#define W8_TINY_ROW (127.0f * FLT_MIN)

/* The Kp / 64 + 1 prefix sums of a row's signed values (bytes XOR flip) over 64-element
 * chunks: the compensation term of the +128 encodings over any K-range. */
static inline void w8_prefix_sums(const uint8_t *q, int64_t Kp, uint8_t flip, int32_t *psum)
{
    psum[0] = 0;
    for (int64_t c = 0; c < Kp / W8_KPAD; c++) {
        int32_t s = 0;
        const uint8_t *chunk = q + c * W8_KPAD;
        for (int j = 0; j < W8_KPAD; j++) s += (int8_t)(chunk[j] ^ flip);
        psum[c + 1] = psum[c] + s;
    }
}

/* The Kp / 64 + 1 prefix sums of a row's negative values, min(v, 0) of each signed value
 * v (bytes XOR flip), over 64-element chunks: the W8_CORR_NEG compensation over any
 * K-range. */
static inline void w8_negative_prefix_sums(const uint8_t *q, int64_t Kp, uint8_t flip,
                                           int32_t *psum)
{
    psum[0] = 0;
    for (int64_t c = 0; c < Kp / W8_KPAD; c++) {
        int32_t s = 0;
        const uint8_t *chunk = q + c * W8_KPAD;
        for (int j = 0; j < W8_KPAD; j++) {
            const int8_t v = (int8_t)(chunk[j] ^ flip);
            s += v < 0 ? v : 0;
        }
        psum[c + 1] = psum[c] + s;
    }
}

/* An already quantized row of K int8 values in [-127, 127] as the kernels of ISA `ops`
 * read it: its bytes XOR flip, zero padding to Kp, and (psum != NULL) its prefix sums. */
static inline void w8_load_int8_row(const w8_isa_ops *ops, const int8_t *x, int64_t K,
                                    int64_t Kp, uint8_t flip, uint8_t *q, int32_t *psum)
{
    for (int64_t i = 0; i < K; i++) q[i] = (uint8_t)x[i] ^ flip;
    memset(q + K, flip, (size_t)(Kp - K));
    if (psum) ops->prefix_sums(q, Kp, flip, psum);
}

/* A row of K floats whose largest magnitude is amax, quantized into Kp bytes (zero padding
 * beyond K), with the scale amax / 127 (0 for a zero row) and, when psum != NULL, the
 * Kp / 64 + 1 prefix sums its row correction reads (w8_prefix_sums_fn). */
static inline void w8_quantize_row_by(const w8_isa_ops *ops, const float *x, int64_t K,
                                      int64_t Kp, uint8_t flip, uint8_t *q, float *scale,
                                      int32_t *psum, float amax)
{
    if (amax < W8_TINY_ROW) {
        *scale = 0.0f;
        memset(q, flip, (size_t)Kp);
    } else {
        /* Multiplying by 127 / amax (rather than dividing by the scale) maps the largest
         * element to exactly +-127 and is what every SIMD ISA computes. */
        *scale = amax / 127.0f;
        ops->quantize(x, K, 127.0f / amax, flip, q);
        memset(q + K, flip, (size_t)(Kp - K));
    }
    if (psum) ops->prefix_sums(q, Kp, flip, psum);
}

/* Quantize one row of K floats into Kp bytes (w8_quantize_row_by with its absmax).
 * Returns 1, writing nothing, if the row holds NaN or Inf. */
static inline int w8_quantize_row(const w8_isa_ops *ops, const float *x, int64_t K, int64_t Kp,
                                  uint8_t flip, uint8_t *q, float *scale, int32_t *psum)
{
    float amax;
    if (ops->absmax(x, K, &amax)) return 1;
    w8_quantize_row_by(ops, x, K, Kp, flip, q, scale, psum, amax);
    return 0;
}

/* w8_quantize_row of the block-rotated row (see fwht.h): sign flip with the 1/sqrt(block)
 * normalization (from `signs`, the rotation's w8_sign_table) and FWHT into `scratch` (K
 * rounded up to block floats, one per thread) with its absmax in the same pass
 * (w8_rotate_absmax_fn), then quantization from scratch.  The floats quantized are exactly
 * those that w8_rotate_row returns, so the result equals rotating then quantizing, bit for
 * bit.
 * NaN/Inf in x reach the rotated block (adds and subtracts never make them finite), so
 * such rows still return 1; so does a finite row whose rotation overflows float32, which
 * needs max|x| above FLT_MAX / sqrt(block).  block is a power of two; when it does not
 * divide K the last block is zero-padded: the rotated row has Kr = K rounded up to block
 * values (Kr <= Kp), and only `scratch` holds the padding, never x. */
static inline int w8_quantize_row_rotated(const w8_isa_ops *ops, const float *x, int64_t K,
                                          int64_t Kp, uint8_t flip, uint8_t *q,
                                          float *scale, int32_t *psum, int64_t block,
                                          const float *signs, float *scratch)
{
    const int64_t Kr = (K + block - 1) / block * block;
    float amax;
    if (ops->rotate_absmax(x, signs, scratch, K, block, &amax)) return 1;
    w8_quantize_row_by(ops, scratch, Kr, Kp, flip, q, scale, psum, amax);
    return 0;
}

#endif
