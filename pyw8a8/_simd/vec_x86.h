/* The operations of the x86 vocabularies that are the same intrinsic at either width,
 * written once: an included template of vec_avx2.h (ymm) and vec_avx512.h (zmm), which
 * define, before including it,
 *
 *   W8_VX(name)   the vocabulary's name for `name` (w8_avx2_##name, w8_avx512_##name)
 *   W8_VX_TARGET  its target attribute
 *   W8_VX_BITS    its vector width in bits, 256 or 512: the intrinsics are _mm<bits>_<op>
 *
 * and the types W8_VX(f32), W8_VX(i32); they add the operations whose intrinsics differ
 * (the selections).  The names and their meaning are
 * vec_scalar.h's, but for the two operand loads of the x86 microkernels at the end (their
 * traits in ukernel.h).  At its end this file undefines the three and its own macros. */

/* a and b pasted after their expansion; W8_VX_MM(op) is _mm<bits>_<op>. */
#define W8_VX_PASTE(a, b) a##b
#define W8_VX_CAT(a, b) W8_VX_PASTE(a, b)
#define W8_VX_MM(op) W8_VX_CAT(W8_VX_CAT(_mm, W8_VX_BITS), W8_VX_CAT(_, op))

/* One function of two vectors of type T, one intrinsic. */
#define W8_VX_BINARY(T, name, op)                                                        \
    W8_VX_TARGET W8_INLINE T W8_VX(name)(T a, T b) { return W8_VX_MM(op)(a, b); }
W8_VX_BINARY(W8_VX(f32), add_f32, add_ps)
W8_VX_BINARY(W8_VX(f32), sub_f32, sub_ps)
W8_VX_BINARY(W8_VX(f32), mul_f32, mul_ps)
W8_VX_BINARY(W8_VX(f32), div_f32, div_ps)
W8_VX_BINARY(W8_VX(f32), max_f32, max_ps)
W8_VX_BINARY(W8_VX(f32), min_f32, min_ps)
W8_VX_BINARY(W8_VX(i32), add_i32, add_epi32)
W8_VX_BINARY(W8_VX(i32), sub_i32, sub_epi32)
W8_VX_BINARY(W8_VX(i32), max_i32, max_epi32)

W8_VX_TARGET W8_INLINE W8_VX(f32) W8_VX(set_f32)(float c) { return W8_VX_MM(set1_ps)(c); }
W8_VX_TARGET W8_INLINE W8_VX(i32) W8_VX(set_i32)(int32_t c) { return W8_VX_MM(set1_epi32)(c); }

W8_VX_TARGET W8_INLINE W8_VX(f32) W8_VX(load_f32)(const float *p)
{
    return W8_VX_MM(loadu_ps)(p);
}
W8_VX_TARGET W8_INLINE void W8_VX(store_f32)(float *p, W8_VX(f32) v)
{
    W8_VX_MM(storeu_ps)(p, v);
}
/* The si256 / si512 loads and stores, whose pointer types differ: C converts void *. */
W8_VX_TARGET W8_INLINE W8_VX(i32) W8_VX(load_i32)(const int32_t *p)
{
    return W8_VX_MM(W8_VX_CAT(loadu_si, W8_VX_BITS))((const void *)p);
}
W8_VX_TARGET W8_INLINE void W8_VX(store_i32)(int32_t *p, W8_VX(i32) v)
{
    W8_VX_MM(W8_VX_CAT(storeu_si, W8_VX_BITS))((void *)p, v);
}

W8_VX_TARGET W8_INLINE W8_VX(f32) W8_VX(fma_f32)(W8_VX(f32) a, W8_VX(f32) b, W8_VX(f32) c)
{
    return W8_VX_MM(fmadd_ps)(a, b, c);
}
/* Exact for an integral f, whatever the rounding mode. */
W8_VX_TARGET W8_INLINE W8_VX(i32) W8_VX(to_i32)(W8_VX(f32) f)
{
    return W8_VX_MM(cvtps_epi32)(f);
}
W8_VX_TARGET W8_INLINE W8_VX(i32) W8_VX(sra1_i32)(W8_VX(i32) i)
{
    return W8_VX_MM(srai_epi32)(i, 1);
}
W8_VX_TARGET W8_INLINE W8_VX(f32) W8_VX(cvt_i32)(W8_VX(i32) i)
{
    return W8_VX_MM(cvtepi32_ps)(i);
}
/* The sign bit cleared through the integer AND (AVX-512F has no _mm512_and_ps). */
W8_VX_TARGET W8_INLINE W8_VX(f32) W8_VX(abs_f32)(W8_VX(f32) v)
{
    const W8_VX(i32) bits = W8_VX_MM(W8_VX_CAT(castps_si, W8_VX_BITS))(v);
    return W8_VX_MM(W8_VX_CAT(W8_VX_CAT(castsi, W8_VX_BITS), _ps))(
        W8_VX_MM(W8_VX_CAT(and_si, W8_VX_BITS))(bits, W8_VX(set_i32)(0x7fffffff)));
}
/* The exponent field of 2^i, i + 127, shifted into place. */
W8_VX_TARGET W8_INLINE W8_VX(f32) W8_VX(pow2_i32)(W8_VX(i32) i)
{
    const W8_VX(i32) bits = W8_VX_MM(slli_epi32)(W8_VX(add_i32)(i, W8_VX(set_i32)(127)), 23);
    return W8_VX_MM(W8_VX_CAT(W8_VX_CAT(castsi, W8_VX_BITS), _ps))(bits);
}

/* The x86 microkernels' operands: quad q of an activation row (its 4 bytes) in every
 * 32-bit lane, and a B vector of quads as stored (the kernels that read it so take either
 * encoding as it is). */
W8_VX_TARGET W8_INLINE W8_VX(i32) W8_VX(bcast_quad)(const uint8_t *row, int64_t q)
{
    return W8_VX_MM(set1_epi32)(w8_load_i32(row + 4 * q));
}
W8_VX_TARGET W8_INLINE W8_VX(i32) W8_VX(load_quads)(const uint8_t *p, int biased)
{
    (void)biased;
    return W8_VX(load_i32)((const int32_t *)p);
}

#undef W8_VX_PASTE
#undef W8_VX_CAT
#undef W8_VX_MM
#undef W8_VX_BINARY
#undef W8_VX
#undef W8_VX_TARGET
#undef W8_VX_BITS
