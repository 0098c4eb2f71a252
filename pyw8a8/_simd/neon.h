/* Arm ISAs (AArch64): signed int8 x int8 products on NEON.
 *
 * "neondot" uses sdot (vdotq_s32, Armv8.2-A dotprod): each int32 lane gains the sum of four
 * s8 x s8 products with no intermediate rounding or saturation, so it is exact.  It is
 * compiled with a target attribute and chosen at run time (HWCAP_ASIMDDP), so the binary
 * itself stays baseline armv8-a.  "neon" serves armv8-a cores without dotprod.
 *
 * One quad row of a panel (byte 4c + j = channel c, K offset j) is exactly four sdot
 * operands: lane i of the c-th 16-byte vector is channel 4c + i, so four int32x4
 * accumulators hold the 16 channels of one row.  Both ISAs multiply signed by signed:
 * biased weights (q + 128) become q again with one XOR, so neither encoding needs the +128
 * compensation (W8_CORR_NONE) nor shifted activations (a_flip 0).  Both kernels (and their
 * epilogue) are the template of ukernel.h on the vocabulary of vec_neon.h, as is the FWHT
 * (fwht_driver.h); it and the row quantizer use baseline NEON only and serve both ISAs. */
#ifndef PYW8A8_SIMD_NEON_H
#define PYW8A8_SIMD_NEON_H

#include "fwht.h"
#include "scalar.h"
#include "vec_neon.h"
#if defined(W8_ARM64)

#define W8_V(name) w8_neon_##name
#define W8_V_TARGET
#include "epilogue.h"
#include "absmax.h"

#define W8_NEONDOT W8_TARGET("arch=armv8.2-a+dotprod")

/* A B vector (16 bytes: 4 channels x 4 K values) as signed bytes: biased weights (q + 128)
 * turn back into q with one XOR. */
W8_INLINE int8x16_t w8_neon_load_b(const uint8_t *p, int biased)
{
    uint8x16_t v = vld1q_u8(p);
    if (biased) v = veorq_u8(v, vdupq_n_u8(0x80));
    return vreinterpretq_s8_u8(v);
}

/* Quad q of an activation row (its 4 bytes) in every 32-bit lane. */
W8_INLINE int8x16_t w8_neon_bcast(const uint8_t *row, int64_t q)
{
    return vreinterpretq_s8_s32(vdupq_n_s32(w8_load_i32(row + 4 * q)));
}

/* Without sdot: vmull_s8 gives exact int16 products of 2 channels x 4 K values; vpaddq_s16
 * adds K pairs (|a0 w0 + a1 w1| <= 2 * 127 * 128 = 32512 < 32767: activations are clamped
 * to [-127, 127] by the quantizer) into 4 channels x 2 halves, and vpadalq_s16 adds the
 * halves into the int32 accumulator of those 4 channels. */
W8_INLINE int32x4_t w8_neon_dot(int32x4_t acc, int8x16_t a, int8x16_t b, int biased)
{
    (void)biased;
    const int16x8_t lo = vmull_s8(vget_low_s8(b), vget_low_s8(a));
    const int16x8_t hi = vmull_high_s8(b, a);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
}

/* Both Arm ISAs run one tile (neon_kernel.h), 4 rows x one panel; the two kernels differ
 * only in their dot step. */
#define W8_NEON_MR 4
#define W8_NEON_NPANELS 1
#define W8_UK(name) w8_neon_##name
#define W8_UK_TARGET
#define W8_UK_DOT w8_neon_dot
#include "neon_kernel.h"

/* sdot (vdotq_s32, Armv8.2-A dotprod): each int32 lane gains the sum of four s8 x s8
 * products, exact. */
W8_NEONDOT W8_INLINE int32x4_t w8_neondot_dot(int32x4_t acc, int8x16_t a, int8x16_t b,
                                              int biased)
{
    (void)biased;
    return vdotq_s32(acc, b, a);
}

#define W8_UK(name) w8_neondot_##name
#define W8_UK_TARGET W8_NEONDOT
#define W8_UK_DOT w8_neondot_dot
#include "neon_kernel.h"

static void w8_neon_quantize(const float *x, int64_t n, float inv, uint8_t flip, uint8_t *q)
{
    const float32x4_t vinv = vdupq_n_f32(inv), hi = vdupq_n_f32(127.0f),
                      lo = vdupq_n_f32(-127.0f);
    const uint8x16_t vflip = vdupq_n_u8(flip);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        int16x4_t h[4];
        for (int j = 0; j < 4; j++) {
            float32x4_t v = vmulq_f32(vld1q_f32(x + i + 4 * j), vinv);
            v = vminq_f32(vmaxq_f32(v, lo), hi);
            /* Round to nearest, ties to even, like rintf; the clamp makes the narrowing
             * exact. */
            h[j] = vmovn_s32(vcvtnq_s32_f32(v));
        }
        const int8x8_t b01 = vmovn_s16(vcombine_s16(h[0], h[1]));
        const int8x8_t b23 = vmovn_s16(vcombine_s16(h[2], h[3]));
        vst1q_u8(q + i, veorq_u8(vreinterpretq_u8_s8(vcombine_s8(b01, b23)), vflip));
    }
    w8_scalar_quantize(x + i, n - i, inv, flip, q + i);
}

/* ---- FWHT (the network of fwht.h, template fwht_driver.h): 4 floats per register. ---- */

/* The two stages inside one register (h = 1, 2). */
W8_INLINE float32x4_t w8_neon_fwht4(float32x4_t v)
{
    const float32x4_t r = vrev64q_f32(v);             /* x1 x0 x3 x2 */
    v = vtrn1q_f32(vaddq_f32(v, r), vsubq_f32(v, r)); /* x0+x1 x0-x1 x2+x3 x2-x3 */
    const float32x2_t lo = vget_low_f32(v), hi = vget_high_f32(v);
    return vcombine_f32(vadd_f32(lo, hi), vsub_f32(lo, hi));
}

#define W8_FW_IN_REG w8_neon_fwht4
#define W8_FW_NARROW w8_scalar_fwht
#define W8_FW_TWO_BLOCKS 0
#include "fwht_driver.h"

#undef W8_V
#undef W8_V_TARGET
#endif
#endif
