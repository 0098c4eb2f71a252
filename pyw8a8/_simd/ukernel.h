/* The register-tiled microkernel of the SIMD paths (AVX2, AVX-VNNI, AVX-512 VNNI, NEON and
 * NEON dot product), written once: an included template.  Each ISA header states only its intrinsics and its
 * traits, then includes this file, which defines <prefix>_ukernel_biased and
 * <prefix>_ukernel_signed (the w8_ukernel_fn of common.h) and undefines the traits.
 *
 * Traits (macros the including header defines):
 *   W8_UK(name)            the path's function name for `name` (e.g. w8_avx512_##name)
 *   W8_UK_TARGET           its target attribute
 *   W8_UK_MR               rows of a tile, at most 8
 *   W8_UK_VPP              vectors per 16-channel panel (1 zmm, 2 ymm)
 *   W8_UK_NVEC             vectors per tile row, at most 4 (W8_UK_NVEC / W8_UK_VPP panels)
 *   W8_UK_VEC              the accumulator vector type (int32 lanes)
 *   W8_UK_ZERO()           an all-zero accumulator
 *   W8_UK_BVEC, W8_UK_BZERO()  the type of a B vector and its zero (x86: W8_UK_VEC)
 *   W8_UK_AVEC             the type of a broadcast A vector (x86: W8_UK_VEC)
 *   W8_UK_LOAD(p), W8_UK_STORE(p, v), W8_UK_ADD(x, y)      int32 lanes, unaligned
 *   W8_UK_BCAST(p)         the 4 bytes at p in every 32-bit lane
 *   W8_UK_LOAD_B(p, BIASED)  a B vector (64 / W8_UK_VPP bytes of a quad row)
 *   W8_UK_PREP_B(b)        per-B-vector work shared by every row of the tile (or b)
 *   W8_UK_DOT(acc, a, b, prep, BIASED)  acc plus the four-product dots of a and b
 *   W8_UK_STORE_FLOAT(p, sums, fin, r, col)  the float epilogue of common.h on one vector
 *                          of sums (tile row r, tile column col), stored as floats at p
 *
 * A header instantiating the template twice with the same vectors defines
 * W8_UK_KEEP_TRAITS before the first include: that include then undefines only W8_UK,
 * W8_UK_TARGET and W8_UK_DOT, and the second one everything.
 *
 * Accumulators are named variables, c<row><vector>, not an array: with an array GCC 12
 * keeps part of a 6 x 4 zmm tile on the stack and copies it between the dot instructions
 * (twice the cycles of the port bound, measured).  Every `if` on ROWS, NVEC or BIASED is on
 * a compile-time constant in each instantiation, so the unused accumulators vanish. */

#define W8_UK_VCOLS (16 / W8_UK_VPP) /* int32 lanes (output channels) per vector */

#define W8_UK_EACH_V(F, r) F(r, 0) F(r, 1) F(r, 2) F(r, 3)
#define W8_UK_EACH_RV(F)                                                                 \
    W8_UK_EACH_V(F, 0) W8_UK_EACH_V(F, 1) W8_UK_EACH_V(F, 2) W8_UK_EACH_V(F, 3)          \
    W8_UK_EACH_V(F, 4) W8_UK_EACH_V(F, 5) W8_UK_EACH_V(F, 6) W8_UK_EACH_V(F, 7)
#define W8_UK_EACH_R(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define W8_UK_EACH_VEC(F) F(0) F(1) F(2) F(3)

#define W8_UK_DECL_ACC(r, v) W8_UK_VEC c##r##v = W8_UK_ZERO();
#define W8_UK_DECL_ROW(r) const uint8_t *a##r = r < ROWS ? a + r * lda : a;
#define W8_UK_LOAD_VEC(v)                                                                \
    W8_UK_BVEC b##v = W8_UK_BZERO(), p##v = W8_UK_BZERO();                               \
    if (v < NVEC) {                                                                      \
        b##v = W8_UK_LOAD_B(bq + (v / W8_UK_VPP) * ps + (v % W8_UK_VPP) * (64 / W8_UK_VPP), \
                            BIASED);                                                     \
        p##v = W8_UK_PREP_B(b##v);                                                       \
    }                                                                                    \
    (void)p##v;
#define W8_UK_DOT_ONE(r, v)                                                              \
    if (v < NVEC) c##r##v = W8_UK_DOT(c##r##v, ar, b##v, p##v, BIASED);
#define W8_UK_DOT_ROW(r)                                                                 \
    if (r < ROWS) {                                                                      \
        const W8_UK_AVEC ar = W8_UK_BCAST(a##r + 4 * q);                                 \
        W8_UK_EACH_V(W8_UK_DOT_ONE, r)                                                   \
    }
#define W8_UK_STORE_ONE(r, v)                                                            \
    if (r < ROWS && v < NVEC) {                                                          \
        int32_t *dst = c + r * ldc + v * W8_UK_VCOLS;                                    \
        const W8_UK_VEC sums = accumulate ? W8_UK_ADD(W8_UK_LOAD(dst), c##r##v) : c##r##v; \
        if (FINISH) W8_UK_STORE_FLOAT((float *)dst, sums, fin, r, v * W8_UK_VCOLS);      \
        else W8_UK_STORE(dst, sums);                                                     \
    }

W8_UK_TARGET W8_INLINE void W8_UK(tile)(const int ROWS, const int NVEC, int64_t kq,
                                        const uint8_t *a, int64_t lda, const uint8_t *b,
                                        int64_t ps, int32_t *c, int64_t ldc, int accumulate,
                                        const int BIASED, const int FINISH,
                                        const w8_tile_finish *fin)
{
    W8_UK_EACH_RV(W8_UK_DECL_ACC)
    W8_UK_EACH_R(W8_UK_DECL_ROW)
    for (int64_t q = 0; q < kq; q++) {
        const uint8_t *bq = b + q * W8_QUAD_BYTES;
        W8_UK_EACH_VEC(W8_UK_LOAD_VEC)
        W8_UK_EACH_R(W8_UK_DOT_ROW)
    }
    W8_UK_EACH_RV(W8_UK_STORE_ONE)
}

/* Row counts and vector counts become constants here, one instantiation per pair. */
#define W8_UK_TILE_CALL(R, NV, BIASED)                                                   \
    W8_UK(tile)(R, NV, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH_, fin)
#define W8_UK_ROWS_CASES(NV, BIASED)                                                     \
    switch (rows) {                                                                      \
    W8_UK_ROW_CASE_8(NV, BIASED)                                                         \
    W8_UK_ROW_CASE_7(NV, BIASED)                                                         \
    W8_UK_ROW_CASE_6(NV, BIASED)                                                         \
    W8_UK_ROW_CASE_5(NV, BIASED)                                                         \
    case 4: W8_UK_TILE_CALL(4, NV, BIASED); break;                                       \
    case 3: W8_UK_TILE_CALL(3, NV, BIASED); break;                                       \
    case 2: W8_UK_TILE_CALL(2, NV, BIASED); break;                                       \
    default: W8_UK_TILE_CALL(1, NV, BIASED); break;                                      \
    }
#if W8_UK_MR >= 8
#define W8_UK_ROW_CASE_8(NV, B) case 8: W8_UK_TILE_CALL(8, NV, B); break;
#else
#define W8_UK_ROW_CASE_8(NV, B)
#endif
#if W8_UK_MR >= 7
#define W8_UK_ROW_CASE_7(NV, B) case 7: W8_UK_TILE_CALL(7, NV, B); break;
#else
#define W8_UK_ROW_CASE_7(NV, B)
#endif
#if W8_UK_MR >= 6
#define W8_UK_ROW_CASE_6(NV, B) case 6: W8_UK_TILE_CALL(6, NV, B); break;
#else
#define W8_UK_ROW_CASE_6(NV, B)
#endif
#if W8_UK_MR >= 5
#define W8_UK_ROW_CASE_5(NV, B) case 5: W8_UK_TILE_CALL(5, NV, B); break;
#else
#define W8_UK_ROW_CASE_5(NV, B)
#endif

/* The panel count of a call sets the vectors per row; a path with one panel per tile
 * (W8_UK_NVEC == W8_UK_VPP) has a single case. */
#define W8_UK_DISPATCH(BIASED)                                                           \
    switch (npanels * W8_UK_VPP) {                                                       \
    W8_UK_VEC_CASE_4(BIASED)                                                             \
    W8_UK_VEC_CASE_3(BIASED)                                                             \
    W8_UK_VEC_CASE_2(BIASED)                                                             \
    default: W8_UK_ROWS_CASES(W8_UK_VPP, BIASED) break;                                  \
    }
#if W8_UK_NVEC >= 4
#define W8_UK_VEC_CASE_4(B) case 4: W8_UK_ROWS_CASES(4, B) break;
#else
#define W8_UK_VEC_CASE_4(B)
#endif
#if W8_UK_NVEC >= 3 && W8_UK_VPP == 1
#define W8_UK_VEC_CASE_3(B) case 3: W8_UK_ROWS_CASES(3, B) break;
#else
#define W8_UK_VEC_CASE_3(B)
#endif
#if W8_UK_NVEC >= 2 && W8_UK_VPP == 1
#define W8_UK_VEC_CASE_2(B) case 2: W8_UK_ROWS_CASES(2, B) break;
#else
#define W8_UK_VEC_CASE_2(B)
#endif

#define FINISH_ 0
W8_UK_TARGET static void W8_UK(ukernel_biased)(int rows, int npanels, int64_t kq,
                                               const uint8_t *a, int64_t lda,
                                               const uint8_t *b, int64_t ps, int32_t *c,
                                               int64_t ldc, int accumulate)
{
    const w8_tile_finish *fin = NULL;
    W8_UK_DISPATCH(1)
}

W8_UK_TARGET static void W8_UK(ukernel_signed)(int rows, int npanels, int64_t kq,
                                               const uint8_t *a, int64_t lda,
                                               const uint8_t *b, int64_t ps, int32_t *c,
                                               int64_t ldc, int accumulate)
{
    const w8_tile_finish *fin = NULL;
    W8_UK_DISPATCH(0)
}
#undef FINISH_

#define FINISH_ 1
W8_UK_TARGET static void W8_UK(ukernel_f32_biased)(int rows, int npanels, int64_t kq,
                                                   const uint8_t *a, int64_t lda,
                                                   const uint8_t *b, int64_t ps, int32_t *c,
                                                   int64_t ldc, int accumulate,
                                                   const w8_tile_finish *fin)
{
    W8_UK_DISPATCH(1)
}

W8_UK_TARGET static void W8_UK(ukernel_f32_signed)(int rows, int npanels, int64_t kq,
                                                   const uint8_t *a, int64_t lda,
                                                   const uint8_t *b, int64_t ps, int32_t *c,
                                                   int64_t ldc, int accumulate,
                                                   const w8_tile_finish *fin)
{
    W8_UK_DISPATCH(0)
}
#undef FINISH_

#undef W8_UK_ROW_CASE_8
#undef W8_UK_ROW_CASE_7
#undef W8_UK_ROW_CASE_6
#undef W8_UK_ROW_CASE_5
#undef W8_UK_VEC_CASE_4
#undef W8_UK_VEC_CASE_3
#undef W8_UK_VEC_CASE_2
#undef W8_UK
#undef W8_UK_TARGET
#undef W8_UK_DOT
#if defined(W8_UK_KEEP_TRAITS)
#undef W8_UK_KEEP_TRAITS
#else
#undef W8_UK_MR
#undef W8_UK_VPP
#undef W8_UK_NVEC
#undef W8_UK_VEC
#undef W8_UK_ZERO
#undef W8_UK_BVEC
#undef W8_UK_BZERO
#undef W8_UK_AVEC
#undef W8_UK_LOAD
#undef W8_UK_STORE
#undef W8_UK_ADD
#undef W8_UK_BCAST
#undef W8_UK_LOAD_B
#undef W8_UK_PREP_B
#undef W8_UK_STORE_FLOAT
#endif
