/* The vector vocabulary of the portable C ISA, one lane wide: the reference of every
 * vec_<isa>.h (vec_avx2.h, vec_avx512.h, vec_neon.h), each of which defines the same names
 * for its own prefix <p> (w8_scalar, w8_avx2, ...), once, as inlined functions.
 *
 * The templates (epilogue.h, absmax.h, fwht_driver.h, ukernel.h) are written in these
 * names only: an instruction-set header selects its vocabulary with
 *
 *   #define W8_V(name) <p>_##name     and     #define W8_V_TARGET <its target attribute>
 *
 * includes the templates, and undefines the two at its end.  A new vector width is one
 * such header; a new kernel on an existing width states only its dot step (ukernel.h).
 *
 * The vocabulary (f32: LANES floats; i32: LANES int32):
 *   <p>_lanes                            an enum constant, LANES
 *   <p>_f32, <p>_i32                     the vector types
 *   set_f32(c), load_f32(p), store_f32(p, v)           unaligned
 *   add_f32, sub_f32, mul_f32, div_f32
 *   fma_f32(a, b, c)  a * b + c rounded once (the fused multiply-add of every ISA)
 *   to_i32(f)         an integral f (|f| < 2^31) as int32, exactly
 *   max_f32(a, b)     a > b ? a : b in each lane (x86 maxps: NaN in b passes); min_f32 as <
 *   abs_f32(v)        |v| (the sign bit cleared)
 *   above_f32(v, c)   an int, nonzero where a lane is NaN or above c (c ordered)
 *   select_neg_f32(c, x, y)     c < 0 ? x : y in each lane; select_neg_i32 the same on i32
 *   set_i32(c), load_i32(p), store_i32(p, v)           unaligned
 *   add_i32, sub_i32 (modulo 2^32), max_i32, sra1_i32(i) (i >> 1, arithmetic)
 *   cvt_i32(i)        to float, to nearest even
 *   pow2_i32(i)       2^i as float, -126 <= i <= 127
 *
 * Every operation is the IEEE one, rounded once (fma_f32 is a fused multiply-add only where
 * a template asks for one: -ffp-contract=off keeps the compiler from fusing any other), so
 * one sequence of them gives the same bits at every width. */
#ifndef PYW8A8_SIMD_VEC_SCALAR_H
#define PYW8A8_SIMD_VEC_SCALAR_H

#include "common.h"

enum { w8_scalar_lanes = 1 };
typedef float w8_scalar_f32;
typedef int32_t w8_scalar_i32;

W8_INLINE float w8_scalar_set_f32(float c) { return c; }
W8_INLINE float w8_scalar_load_f32(const float *p) { return *p; }
W8_INLINE void w8_scalar_store_f32(float *p, float v) { *p = v; }
W8_INLINE float w8_scalar_add_f32(float a, float b) { return a + b; }
W8_INLINE float w8_scalar_sub_f32(float a, float b) { return a - b; }
W8_INLINE float w8_scalar_mul_f32(float a, float b) { return a * b; }
W8_INLINE float w8_scalar_div_f32(float a, float b) { return a / b; }
/* C99's fmaf: one instruction where the compiler targets FMA, else libm's, correctly
 * rounded either way. */
W8_INLINE float w8_scalar_fma_f32(float a, float b, float c) { return fmaf(a, b, c); }
W8_INLINE int32_t w8_scalar_to_i32(float f) { return (int32_t)f; }
W8_INLINE float w8_scalar_max_f32(float a, float b) { return a > b ? a : b; }
W8_INLINE float w8_scalar_min_f32(float a, float b) { return a < b ? a : b; }
W8_INLINE float w8_scalar_abs_f32(float v) { return fabsf(v); }
W8_INLINE int w8_scalar_above_f32(float v, float c) { return !(v <= c); }
W8_INLINE float w8_scalar_select_neg_f32(float c, float x, float y) { return c < 0.0f ? x : y; }

W8_INLINE int32_t w8_scalar_set_i32(int32_t c) { return c; }
W8_INLINE int32_t w8_scalar_load_i32(const int32_t *p) { return *p; }
W8_INLINE void w8_scalar_store_i32(int32_t *p, int32_t v) { *p = v; }
/* Modulo 2^32, as the vector instructions (signed overflow is undefined in C). */
W8_INLINE int32_t w8_scalar_add_i32(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a + (uint32_t)b);
}
W8_INLINE int32_t w8_scalar_sub_i32(int32_t a, int32_t b)
{
    return (int32_t)((uint32_t)a - (uint32_t)b);
}
W8_INLINE int32_t w8_scalar_max_i32(int32_t a, int32_t b) { return a > b ? a : b; }
W8_INLINE int32_t w8_scalar_sra1_i32(int32_t i) { return i >> 1; }
W8_INLINE float w8_scalar_cvt_i32(int32_t i) { return (float)i; }
W8_INLINE float w8_scalar_pow2_i32(int32_t i)
{
    const uint32_t bits = ((uint32_t)i + 127u) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
W8_INLINE int32_t w8_scalar_select_neg_i32(float c, int32_t i, int32_t j)
{
    return c < 0.0f ? i : j;
}

#endif
