/* Arm paths (AArch64): signed int8 x int8 products on NEON.
 *
 * "neondot" uses sdot (vdotq_s32, Armv8.2-A dotprod): each int32 lane gains the sum of four
 * s8 x s8 products with no intermediate rounding or saturation, so it is exact.  It is
 * compiled with a target attribute and chosen at run time (HWCAP_ASIMDDP), so the binary
 * itself stays baseline armv8-a.  "neon" serves armv8-a cores without dotprod.
 *
 * One quad row of a panel (byte 4c + j = channel c, K offset j) is exactly four sdot
 * operands: lane i of the c-th 16-byte vector is channel 4c + i, so four int32x4
 * accumulators hold the 16 channels of one row.  Both paths multiply signed by signed:
 * biased weights (q + 128) become q again with one XOR, so neither encoding needs the +128
 * compensation (W8_CORR_NONE) nor shifted activations (a_flip 0).  Both kernels (and their
 * epilogues) are the template of ukernel.h with the traits of neon_traits.h; the row
 * quantizer and the FWHT use baseline NEON only and serve both paths. */
#ifndef PYW8A8_SIMD_NEON_H
#define PYW8A8_SIMD_NEON_H

#include "fwht.h"
#include "scalar.h"
#if defined(W8_ARM64)
#include <arm_neon.h>

#define W8_NEONDOT W8_TARGET("arch=armv8.2-a+dotprod")

/* A B vector (16 bytes: 4 channels x 4 K values) as signed bytes: biased weights (q + 128)
 * turn back into q with one XOR. */
W8_INLINE int8x16_t w8_neon_load_b(const uint8_t *p, int biased)
{
    uint8x16_t v = vld1q_u8(p);
    if (biased) v = veorq_u8(v, vdupq_n_u8(0x80));
    return vreinterpretq_s8_u8(v);
}

/* The 4 activation bytes at p in every 32-bit lane. */
W8_INLINE int8x16_t w8_neon_bcast(const uint8_t *p)
{
    return vreinterpretq_s8_s32(vdupq_n_s32(w8_load_i32(p)));
}

/* Without sdot: vmull_s8 gives exact int16 products of 2 channels x 4 K values; vpaddq_s16
 * adds K pairs (|a0 w0 + a1 w1| <= 2 * 127 * 128 = 32512 < 32767: activations are clamped
 * to [-127, 127] by the quantizer) into 4 channels x 2 halves, and vpadalq_s16 adds the
 * halves into the int32 accumulator of those 4 channels. */
W8_INLINE int32x4_t w8_neon_dot(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    const int16x8_t lo = vmull_s8(vget_low_s8(b), vget_low_s8(a));
    const int16x8_t hi = vmull_high_s8(b, a);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
}

/* The epilogue's scaling and the activations (activation.h) on 4 lanes, 2 x 2 doubles where
 * they need double; vcvtq_f32_s32 rounds to nearest even, like the scalar conversion; the
 * comparisons and selections spelled out as x86's maxps orders them (vmaxq would prefer
 * +0 to -0, and NaN to either operand). */
#define W8_AF(name) w8_neon_##name
#define W8_AF_TARGET
#define W8_AF_LANES 4
#define W8_AF_F float32x4_t
#define W8_AF_D float64x2_t
#define W8_AF_I int32x4_t
#define W8_AF_FSET(c) vdupq_n_f32(c)
#define W8_AF_FADD(a, b) vaddq_f32(a, b)
#define W8_AF_FSUB(a, b) vsubq_f32(a, b)
#define W8_AF_FMUL(a, b) vmulq_f32(a, b)
#define W8_AF_FDIV(a, b) vdivq_f32(a, b)
#define W8_AF_FMAX(a, b) vbslq_f32(vcgtq_f32(a, b), a, b)
#define W8_AF_FMIN(a, b) vbslq_f32(vcltq_f32(a, b), a, b)
#define W8_AF_FSEL_NEG(c, x, y) vbslq_f32(vcltq_f32(c, vdupq_n_f32(0.0f)), x, y)
#define W8_AF_ISEL_NEG(c, i, j) vbslq_s32(vcltq_f32(c, vdupq_n_f32(0.0f)), i, j)
#define W8_AF_DSET(c) vdupq_n_f64(c)
#define W8_AF_DADD(a, b) vaddq_f64(a, b)
#define W8_AF_DSUB(a, b) vsubq_f64(a, b)
#define W8_AF_DMUL(a, b) vmulq_f64(a, b)
#define W8_AF_DDIV(a, b) vdivq_f64(a, b)
#define W8_AF_DMAX(a, b) vbslq_f64(vcgtq_f64(a, b), a, b)
#define W8_AF_DNEGABS(a) vnegq_f64(vabsq_f64(a))
#define W8_AF_DLO(f) vcvt_f64_f32(vget_low_f32(f))
#define W8_AF_DHI(f) vcvt_high_f64_f32(f)
#define W8_AF_DTOF(lo, hi) vcvt_high_f32_f64(vcvt_f32_f64(lo), hi)
#define W8_AF_DLOW32(lo, hi) \
    vcombine_s32(vmovn_s64(vreinterpretq_s64_f64(lo)), vmovn_s64(vreinterpretq_s64_f64(hi)))
#define W8_AF_ISET(c) vdupq_n_s32(c)
#define W8_AF_IMAX(a, b) vmaxq_s32(a, b)
#define W8_AF_ISRA1(i) vshrq_n_s32(i, 1)
#define W8_AF_ISUB(a, b) vsubq_s32(a, b)
#define W8_AF_ICVT(i) vcvtq_f32_s32(i)
#define W8_AF_IPOW2(i) vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(i, vdupq_n_s32(127)), 23))
#define W8_AF_FLOAD(p) vld1q_f32(p)
#define W8_AF_FSTORE(p, v) vst1q_f32(p, v)
#define W8_AF_ILOAD(p) vld1q_s32(p)
#include "activation.h"

/* The product's scaling (fin->g) of 4 sums, stored as floats at p: the one vector store of
 * the fused kernels and the per-tile epilogue (ukernel.h) of both Arm paths. */
W8_INLINE void w8_neon_store_float(float *p, int32x4_t sums, const w8_tile_finish *fin,
                                   int r, int col)
{
    vst1q_f32(p, w8_neon_scaled(sums, &fin->g, r, col));
}

/* Both Arm paths: 4 rows x 4 int32x4 (one panel, 16 channels) = 16 accumulators; with the 4
 * B vectors and the broadcast row they use 21 of the 32 NEON registers.  The two kernels
 * differ only in their dot step. */
#define W8_NEON_MR 4
#define W8_NEON_NPANELS 1
#define W8_UK(name) w8_neon_##name
#define W8_UK_TARGET
#define W8_UK_DOT(acc, a, b, prep, BIASED) w8_neon_dot(acc, a, b)
#include "neon_traits.h"
#include "ukernel.h"

/* sdot (vdotq_s32, Armv8.2-A dotprod): each int32 lane gains the sum of four s8 x s8
 * products, exact. */
#define W8_UK(name) w8_neondot_##name
#define W8_UK_TARGET W8_NEONDOT
#define W8_UK_DOT(acc, a, b, prep, BIASED) vdotq_s32(acc, b, a)
#include "neon_traits.h"
#include "ukernel.h"

/* The maximum is one of the inputs whatever the order of comparison, so the result is
 * bit-identical to w8_scalar_absmax. */
static int w8_neon_absmax(const float *x, int64_t n, float *amax)
{
    const float32x4_t fmax = vdupq_n_f32(3.4028234663852886e38f);
    float32x4_t m = vdupq_n_f32(0.0f);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vabsq_f32(vld1q_f32(x + i));
        ok = vandq_u32(ok, vcleq_f32(v, fmax)); /* false for NaN and Inf */
        m = vmaxq_f32(m, v);
    }
    if (vminvq_u32(ok) == 0) return 1;
    float tail;
    if (w8_scalar_absmax(x + i, n - i, &tail)) return 1;
    const float vm = vmaxvq_f32(m);
    *amax = vm > tail ? vm : tail;
    return 0;
}

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

/* In-place unnormalized Walsh-Hadamard transform in natural (Sylvester) order; n is a power
 * of two.  Stages run h = 1, 2, 4, ... with the butterfly (u + v, u - v), and every element
 * goes through the same float operations in the same order as in the plain radix-2 loop,
 * so the result is bit-identical to it; only the grouping into vectors differs. */
static void w8_neon_fwht(float *x, int64_t n)
{
    if (n < 4) {
        if (n == 2) {
            const float u = x[0], v = x[1];
            x[0] = u + v;
            x[1] = u - v;
        }
        return;
    }
    /* Stages h = 1 and h = 2 stay inside each group of four. */
    for (int64_t i = 0; i < n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        const float32x4_t r = vrev64q_f32(v);             /* x1 x0 x3 x2 */
        v = vtrn1q_f32(vaddq_f32(v, r), vsubq_f32(v, r)); /* x0+x1 x0-x1 x2+x3 x2-x3 */
        const float32x2_t lo = vget_low_f32(v), hi = vget_high_f32(v);
        vst1q_f32(x + i, vcombine_f32(vadd_f32(lo, hi), vsub_f32(lo, hi)));
    }
    for (int64_t h = 4; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j += 4) {
                const float32x4_t u = vld1q_f32(x + j), v = vld1q_f32(x + j + h);
                vst1q_f32(x + j, vaddq_f32(u, v));
                vst1q_f32(x + j + h, vsubq_f32(u, v));
            }
}

W8_FWHT_SIGNED_BY(w8_neon_fwht_signed, w8_neon_fwht)

#endif
#endif
