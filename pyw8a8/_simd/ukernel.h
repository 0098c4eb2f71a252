/* The register-tiled microkernel of the SIMD paths (AVX2, AVX-VNNI, AVX-512 VNNI, NEON and
 * NEON dot product), written once: an included template.  Each ISA header states only its
 * intrinsics and its traits, then includes this file, which defines, for its prefix:
 *
 *   <prefix>_ukernel_biased, <prefix>_ukernel_signed          w8_ukernel_fn of common.h
 *   <prefix>_ukernel_f32_biased, <prefix>_ukernel_f32_signed  w8_ukernel_f32_fn
 *   <prefix>_epilogue    w8_epilogue_fn: W8_UK_STORE_FLOAT over each row's whole vectors,
 *                        w8_scalar_epilogue (the reference) over the columns past them
 *                        (the activation and gate follow in activation.h's act_tile)
 *
 * and, inlined into the kernels, <prefix>_tile (one tile of ROWS x NVEC vectors, both
 * constants), <prefix>_tile_rows and <prefix>_tiles (the switches that make them constants).
 * At its end it undefines every trait and every macro of its own, so the next include
 * starts clean.
 *
 * Traits (macros the including header defines):
 *   W8_UK(name)            the path's function name for `name` (e.g. w8_avx512_##name)
 *   W8_UK_TARGET           its target attribute
 *   W8_UK_MR               rows of a tile, at most 8
 *   W8_UK_VPP              vectors per 16-channel panel (1 zmm, 2 ymm, 4 NEON)
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
 *   W8_UK_STORE_FLOAT(p, sums, fin, r, col)  the product's scaling (fin->g, common.h) of
 *                          one vector of sums (tile row r, tile column col), stored as
 *                          floats at p: the path's one definition of that arithmetic
 * Traits that several instantiations share sit in a traits header without include guard,
 * included right before this file (ymm_traits.h, neon_traits.h).
 *
 * Accumulators are named variables, c<row><vector>, not an array: with an array GCC 12
 * keeps part of a 6 x 4 zmm tile on the stack and copies it between the dot instructions
 * (twice the cycles of the port bound, measured).  Every `if` on ROWS, NVEC, BIASED or
 * FINISH is on a compile-time constant in each inlined call, so the unused accumulators
 * and branches vanish. */

#include "scalar.h"

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

/* The row count of a call as a constant: one inlined tile per count up to W8_UK_MR (the
 * `if`s drop the counts beyond it, which no call asks for: a 4-row tile of the 2-row
 * avx2_gemv kernel would only spill). */
W8_UK_TARGET W8_INLINE void W8_UK(tile_rows)(int rows, const int NVEC, int64_t kq,
                                             const uint8_t *a, int64_t lda, const uint8_t *b,
                                             int64_t ps, int32_t *c, int64_t ldc,
                                             int accumulate, const int BIASED,
                                             const int FINISH, const w8_tile_finish *fin)
{
    switch (rows) {
    case 8:
        if (W8_UK_MR >= 8)
            W8_UK(tile)(8, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    case 7:
        if (W8_UK_MR >= 7)
            W8_UK(tile)(7, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    case 6:
        if (W8_UK_MR >= 6)
            W8_UK(tile)(6, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    case 5:
        if (W8_UK_MR >= 5)
            W8_UK(tile)(5, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    case 4:
        if (W8_UK_MR >= 4)
            W8_UK(tile)(4, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    case 3:
        if (W8_UK_MR >= 3)
            W8_UK(tile)(3, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    case 2:
        if (W8_UK_MR >= 2)
            W8_UK(tile)(2, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    default:
        W8_UK(tile)(1, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, fin);
        break;
    }
}

/* The vector count of a call (its panels times W8_UK_VPP) as a constant: one case per
 * count that is a whole number of panels, up to W8_UK_NVEC (the `if`s drop the others). */
W8_UK_TARGET W8_INLINE void W8_UK(tiles)(int rows, int npanels, int64_t kq, const uint8_t *a,
                                         int64_t lda, const uint8_t *b, int64_t ps,
                                         int32_t *c, int64_t ldc, int accumulate,
                                         const int BIASED, const int FINISH,
                                         const w8_tile_finish *fin)
{
    switch (npanels * W8_UK_VPP) {
    case 4:
        if (W8_UK_NVEC >= 4 && 4 % W8_UK_VPP == 0)
            W8_UK(tile_rows)(rows, 4, kq, a, lda, b, ps, c, ldc, accumulate, BIASED,
                             FINISH, fin);
        break;
    case 3:
        if (W8_UK_NVEC >= 3 && 3 % W8_UK_VPP == 0)
            W8_UK(tile_rows)(rows, 3, kq, a, lda, b, ps, c, ldc, accumulate, BIASED,
                             FINISH, fin);
        break;
    case 2:
        if (W8_UK_NVEC >= 2 && 2 % W8_UK_VPP == 0)
            W8_UK(tile_rows)(rows, 2, kq, a, lda, b, ps, c, ldc, accumulate, BIASED,
                             FINISH, fin);
        break;
    case 1:
        if (W8_UK_VPP == 1)
            W8_UK(tile_rows)(rows, 1, kq, a, lda, b, ps, c, ldc, accumulate, BIASED,
                             FINISH, fin);
        break;
    }
}

/* The entry points: BIASED and FINISH are constants in each. */
W8_UK_TARGET static void W8_UK(ukernel_biased)(int rows, int npanels, int64_t kq,
                                               const uint8_t *a, int64_t lda,
                                               const uint8_t *b, int64_t ps, int32_t *c,
                                               int64_t ldc, int accumulate)
{
    W8_UK(tiles)(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 1, 0, NULL);
}

W8_UK_TARGET static void W8_UK(ukernel_signed)(int rows, int npanels, int64_t kq,
                                               const uint8_t *a, int64_t lda,
                                               const uint8_t *b, int64_t ps, int32_t *c,
                                               int64_t ldc, int accumulate)
{
    W8_UK(tiles)(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 0, 0, NULL);
}

W8_UK_TARGET static void W8_UK(ukernel_f32_biased)(int rows, int npanels, int64_t kq,
                                                   const uint8_t *a, int64_t lda,
                                                   const uint8_t *b, int64_t ps, int32_t *c,
                                                   int64_t ldc, int accumulate,
                                                   const w8_tile_finish *fin)
{
    W8_UK(tiles)(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 1, 1, fin);
}

W8_UK_TARGET static void W8_UK(ukernel_f32_signed)(int rows, int npanels, int64_t kq,
                                                   const uint8_t *a, int64_t lda,
                                                   const uint8_t *b, int64_t ps, int32_t *c,
                                                   int64_t ldc, int accumulate,
                                                   const w8_tile_finish *fin)
{
    W8_UK(tiles)(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 0, 1, fin);
}

/* The per-tile epilogue (edge tiles, and paths without fused kernels) with the fused
 * kernels' own vector store, so both give the same bits by construction. */
W8_UK_TARGET static void W8_UK(epilogue)(const int32_t *acc, int64_t ldacc, int rows,
                                         int cols, const w8_tile_finish *fin, float *out,
                                         int64_t ldo)
{
    const int whole = cols / W8_UK_VCOLS * W8_UK_VCOLS;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < whole; j += W8_UK_VCOLS)
            W8_UK_STORE_FLOAT(out + r * ldo + j, W8_UK_LOAD(acc + r * ldacc + j), fin, r, j);
    if (whole < cols) {
        const w8_tile_finish tail = w8_finish_from_column(fin, whole);
        w8_scalar_epilogue(acc + whole, ldacc, rows, cols - whole, &tail, out + whole, ldo);
    }
}

#undef W8_UK_VCOLS
#undef W8_UK_EACH_V
#undef W8_UK_EACH_RV
#undef W8_UK_EACH_R
#undef W8_UK_EACH_VEC
#undef W8_UK_DECL_ACC
#undef W8_UK_DECL_ROW
#undef W8_UK_LOAD_VEC
#undef W8_UK_DOT_ONE
#undef W8_UK_DOT_ROW
#undef W8_UK_STORE_ONE

#undef W8_UK
#undef W8_UK_TARGET
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
#undef W8_UK_DOT
#undef W8_UK_STORE_FLOAT
