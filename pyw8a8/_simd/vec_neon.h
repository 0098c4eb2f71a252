/* The vector vocabulary of the Arm ISAs (neon, neondot): 4 lanes of float32x4_t /
 * int32x4_t, prefix w8_neon; baseline armv8-a.  The names and their meaning are
 * vec_scalar.h's: vcvtq_f32_s32 rounds to nearest even, like the
 * scalar conversion, and the comparisons and selections are spelled out as x86's maxps
 * orders them (vmaxq would prefer +0 to -0, and NaN to either operand). */
#ifndef PYW8A8_SIMD_VEC_NEON_H
#define PYW8A8_SIMD_VEC_NEON_H

#include "common.h"
#if defined(W8_ARM64)
#include <arm_neon.h>

/* Baseline NEON: no target attribute (W8_V_TARGET of the Arm headers is empty). */
enum { w8_neon_lanes = 4 };
typedef float32x4_t w8_neon_f32;
typedef int32x4_t w8_neon_i32;

/* One function of two vectors of type T, one intrinsic; op of f32 (v<op>q_f32) and i32
 * (v<op>q_s32) vectors. */
#define W8_NEON_BINARY(T, name, intrinsic)                                               \
    W8_INLINE T w8_neon_##name(T a, T b) { return intrinsic(a, b); }
#define W8_NEON_ALL_TYPES(op)                                                            \
    W8_NEON_BINARY(float32x4_t, op##_f32, v##op##q_f32)                                  \
    W8_NEON_BINARY(int32x4_t, op##_i32, v##op##q_s32)

W8_NEON_ALL_TYPES(add)
W8_NEON_ALL_TYPES(sub)
W8_NEON_BINARY(float32x4_t, mul_f32, vmulq_f32)
W8_NEON_BINARY(float32x4_t, div_f32, vdivq_f32)
W8_NEON_BINARY(int32x4_t, max_i32, vmaxq_s32)

#undef W8_NEON_BINARY
#undef W8_NEON_ALL_TYPES

W8_INLINE float32x4_t w8_neon_set_f32(float c) { return vdupq_n_f32(c); }
W8_INLINE int32x4_t w8_neon_set_i32(int32_t c) { return vdupq_n_s32(c); }
W8_INLINE float32x4_t w8_neon_load_f32(const float *p) { return vld1q_f32(p); }
W8_INLINE void w8_neon_store_f32(float *p, float32x4_t v) { vst1q_f32(p, v); }
W8_INLINE int32x4_t w8_neon_load_i32(const int32_t *p) { return vld1q_s32(p); }
W8_INLINE void w8_neon_store_i32(int32_t *p, int32x4_t v) { vst1q_s32(p, v); }

/* maxps order: a where a > b, else b (so a NaN b passes, and max(+0, -0) is -0). */
W8_INLINE float32x4_t w8_neon_max_f32(float32x4_t a, float32x4_t b)
{
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}
W8_INLINE float32x4_t w8_neon_min_f32(float32x4_t a, float32x4_t b)
{
    return vbslq_f32(vcltq_f32(a, b), a, b);
}
W8_INLINE float32x4_t w8_neon_fma_f32(float32x4_t a, float32x4_t b, float32x4_t c)
{
    return vfmaq_f32(c, a, b);
}
/* Truncation, exact for an integral f. */
W8_INLINE int32x4_t w8_neon_to_i32(float32x4_t f) { return vcvtq_s32_f32(f); }
W8_INLINE float32x4_t w8_neon_abs_f32(float32x4_t v) { return vabsq_f32(v); }
/* vcleq is false for NaN. */
W8_INLINE int w8_neon_above_f32(float32x4_t v, float32x4_t c)
{
    return vmaxvq_u32(vmvnq_u32(vcleq_f32(v, c))) != 0;
}
W8_INLINE float32x4_t w8_neon_select_neg_f32(float32x4_t c, float32x4_t x, float32x4_t y)
{
    return vbslq_f32(vcltq_f32(c, vdupq_n_f32(0.0f)), x, y);
}
W8_INLINE int32x4_t w8_neon_select_neg_i32(float32x4_t c, int32x4_t i, int32x4_t j)
{
    return vbslq_s32(vcltq_f32(c, vdupq_n_f32(0.0f)), i, j);
}

W8_INLINE int32x4_t w8_neon_sra1_i32(int32x4_t i) { return vshrq_n_s32(i, 1); }
W8_INLINE float32x4_t w8_neon_cvt_i32(int32x4_t i) { return vcvtq_f32_s32(i); }
W8_INLINE float32x4_t w8_neon_pow2_i32(int32x4_t i)
{
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(i, vdupq_n_s32(127)), 23));
}

#endif
#endif
