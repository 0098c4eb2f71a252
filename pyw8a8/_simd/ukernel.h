/* The register-tiled microkernel of the SIMD ISAs (AVX2, AVX-VNNI, AVX-512 VNNI, NEON and
 * NEON dot product), written once: an included template.  Each ISA header selects its
 * vector vocabulary (W8_V, W8_V_TARGET: vec_scalar.h) and includes its epilogue.h, states
 * its kernel's dot step as the traits below, then includes this file, which defines, for
 * the kernel's prefix:
 *
 *   <prefix>_ukernel_biased, <prefix>_ukernel_signed          w8_ukernel_fn of common.h
 *   <prefix>_ukernel_f32_biased, <prefix>_ukernel_f32_signed  w8_ukernel_f32_fn: the sums
 *                        scaled as the vocabulary's epilogue scales them (<p>_scaled)
 *   <prefix>_ukernel_prefetch_biased, ..._f32_prefetch_signed  the same four, prefetching
 *                        the weight W8_UK_AHEAD bytes ahead (the registry's *_prefetch)
 *
 * and, inlined into the kernels, <prefix>_tile (one tile of ROWS x NVEC vectors, both
 * constants; one row over short panels is <prefix>_row_tile's; both store through
 * <prefix>_store), <prefix>_tile_rows and <prefix>_tiles (the switches that make them
 * constants).  At its end it undefines its traits and its own macros, so the next include
 * starts clean.
 *
 * Traits (macros the including header defines; the last three name functions):
 *   W8_UK(name)            the kernel's function name for `name` (e.g. w8_avx512_##name)
 *   W8_UK_TARGET           its target attribute
 *   W8_UK_MR               rows of a tile, at most 8
 *   W8_UK_NVEC             vectors per tile row, at most 4: W8_UK_NVEC / W8_UK_VPP panels of
 *                          16 channels, each W8_UK_VPP = 16 / lanes vectors of int32 sums
 *   W8_UK_A, W8_UK_B       the types of a broadcast A quad and of a B vector
 *   W8_UK_BCAST(row, q)    quad q of an A row (its 4 values) in every 32-bit lane, as a
 *                          W8_UK_A
 *   W8_UK_LOAD_B(p, BIASED)  a B vector (64 / W8_UK_VPP bytes of a quad row)
 *   W8_UK_DOT(acc, a, b, BIASED)  acc plus the four-product dots of a and b
 *
 * Accumulators are named variables, c<row><vector>, not an array: with an array GCC 12
 * keeps part of a 6 x 4 zmm tile on the stack and copies it between the dot instructions
 * (twice the cycles of the port bound, measured).  Every `if` on ROWS, NVEC, BIASED,
 * FINISH or PREFETCH is on a compile-time constant in each inlined call, so the unused
 * accumulators and branches vanish. */

#include "scalar.h"

#define W8_UK_VPP (16 / W8_V(lanes)) /* vectors per 16-channel panel */

#define W8_UK_EACH_V(F, r) F(r, 0) F(r, 1) F(r, 2) F(r, 3)
#define W8_UK_EACH_RV(F)                                                                 \
    W8_UK_EACH_V(F, 0) W8_UK_EACH_V(F, 1) W8_UK_EACH_V(F, 2) W8_UK_EACH_V(F, 3)          \
    W8_UK_EACH_V(F, 4) W8_UK_EACH_V(F, 5) W8_UK_EACH_V(F, 6) W8_UK_EACH_V(F, 7)
#define W8_UK_EACH_R(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
#define W8_UK_EACH_VEC(F) F(0) F(1) F(2) F(3)
#define W8_UK_EACH_ROWS(F) F(8) F(7) F(6) F(5) F(4) F(3) F(2)

#define W8_UK_DECL_ACC(r, v) W8_V(i32) c##r##v = W8_V(set_i32)(0);
#define W8_UK_DECL_ROW(r) const uint8_t *a##r = r < ROWS ? a + r * lda : a;
/* A vector past NVEC loads vector 0 again: in bounds, and dead (the optimizer drops it). */
#define W8_UK_LOAD_VEC(v)                                                                \
    const W8_UK_B b##v = W8_UK_LOAD_B(                                                   \
        bq + (v < NVEC ? (v / W8_UK_VPP) * ps + (v % W8_UK_VPP) * (64 / W8_UK_VPP) : 0), \
        BIASED);                                                                         \
    (void)b##v;
#define W8_UK_DOT_ONE(r, v)                                                              \
    if (v < NVEC) c##r##v = W8_UK_DOT(c##r##v, ar, b##v, BIASED);
#define W8_UK_DOT_ROW(r)                                                                 \
    if (r < ROWS) {                                                                      \
        const W8_UK_A ar = W8_UK_BCAST(a##r, q);                                         \
        W8_UK_EACH_V(W8_UK_DOT_ONE, r)                                                   \
    }
#define W8_UK_STORE_ONE(r, v)                                                            \
    if (r < ROWS && v < NVEC)                                                            \
        W8_UK(store)(c + r * ldc + v * W8_V(lanes), c##r##v, accumulate, FINISH, fin, r,    \
                     v * W8_V(lanes));

/* The switch cases of tile_rows and tiles: n rows (up to W8_UK_MR; the `if` drops the
 * counts beyond it), and v + 1 vectors (whole panels up to W8_UK_NVEC). */
#define W8_UK_ROWS_CASE(n)                                                               \
    case n:                                                                              \
        if (W8_UK_MR >= n)                                                               \
            W8_UK(tile)(n, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, \
                        PREFETCH, fin);                                                  \
        break;
#define W8_UK_VECS_CASE(v)                                                               \
    case v + 1:                                                                          \
        if (W8_UK_NVEC >= v + 1 && (v + 1) % W8_UK_VPP == 0)                             \
            W8_UK(tile_rows)(rows, v + 1, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, \
                             FINISH, PREFETCH, fin);                                     \
        break;

/* A vector of sums of tile row r, columns col on, stored at dst: added to what dst holds
 * when `accumulate`, scaled to float when FINISH. */
W8_UK_TARGET W8_INLINE void W8_UK(store)(int32_t *dst, W8_V(i32) sums, int accumulate,
                                         const int FINISH, const w8_tile_finish *fin, int r,
                                         int col)
{
    if (accumulate) sums = W8_V(add_i32)(W8_V(load_i32)(dst), sums);
    if (FINISH) W8_V(store_f32)((float *)dst, W8_V(scaled)(sums, &fin->g, r, col));
    else W8_V(store_i32)(dst, sums);
}

/* The prefetching kernels ask for each weight line this many bytes before they read it.
 * A row or two of activations does too little arithmetic to hide the weight's latency from
 * memory, and the hardware prefetcher stops at every 4 KiB page: ahead by 2 KiB, one row's
 * product with a 168 MB weight (1 x 640 x 262144) took 0.85x the time, and a weight held in
 * L2 took up to 1.15x, so the tuner times both kernels (Xeon, AVX-512, 2 threads). */
#define W8_UK_AHEAD 2048

/* One row whose panels are short: the tile's panels one after another, each panel's quads
 * in order, W8_UK_ROW_U of them in flight (four accumulators in all), so the weight is read
 * as one sequential stream.  A tile's panels side by side read NVEC streams one panel long
 * each, and the hardware prefetcher starts over at every tile: a row has too little
 * arithmetic to hide that (as one stream, 1 x 640 x 262144 from memory ran 1.4x as fast;
 * Zen 4, one thread).  Longer panels (beyond W8_UK_ROW_STREAM_MAX_KQ quads) and two rows
 * read as fast or faster side by side, so they keep the tile. */
#define W8_UK_ROW_STREAM_MAX_KQ (1536 / 4) /* the longest panels read as one stream */
#define W8_UK_ROW_U (4 / W8_UK_VPP) /* quads in flight: W8_UK_VPP vectors each */
#define W8_UK_ROW_DOT(i)                                                                 \
    c##i = W8_UK_DOT(c##i, W8_UK_BCAST(a, q + (i) / W8_UK_VPP),                          \
                     W8_UK_LOAD_B(bq + ((i) / W8_UK_VPP) * W8_QUAD_BYTES +                \
                                      ((i) % W8_UK_VPP) * (64 / W8_UK_VPP),               \
                                  BIASED),                                               \
                     BIASED);
W8_UK_TARGET W8_INLINE void W8_UK(row_tile)(const int NVEC, int64_t kq, const uint8_t *a,
                                            const uint8_t *b, int64_t ps, int32_t *c,
                                            int accumulate, const int BIASED,
                                            const int FINISH, const int PREFETCH,
                                            const w8_tile_finish *fin)
{
    for (int panel = 0; panel < NVEC / W8_UK_VPP; panel++) {
        const uint8_t *bp = b + panel * ps;
        W8_V(i32) c0 = W8_V(set_i32)(0), c1 = c0, c2 = c0, c3 = c0;
        for (int64_t q = 0; q < kq; q += W8_UK_ROW_U) { /* kq: a multiple of 16 */
            const uint8_t *bq = bp + q * W8_QUAD_BYTES;
            if (PREFETCH) /* the stream runs on across panels: lines past one are the next's */
                for (int line = 0; line < W8_UK_ROW_U * W8_QUAD_BYTES / 64; line++)
                    __builtin_prefetch(bq + W8_UK_AHEAD + 64 * line, 0, 3);
            W8_UK_ROW_DOT(0) W8_UK_ROW_DOT(1) W8_UK_ROW_DOT(2) W8_UK_ROW_DOT(3)
        }
        /* Accumulator i holds vector i % VPP of the panel: folded onto the first VPP. */
        W8_V(i32) acc[4] = {c0, c1, c2, c3};
        for (int i = W8_UK_VPP; i < 4; i++)
            acc[i % W8_UK_VPP] = W8_V(add_i32)(acc[i % W8_UK_VPP], acc[i]);
        for (int v = 0; v < W8_UK_VPP; v++) {
            const int col = (panel * W8_UK_VPP + v) * W8_V(lanes);
            W8_UK(store)(c + col, acc[v], accumulate, FINISH, fin, 0, col);
        }
    }
}

W8_UK_TARGET W8_INLINE void W8_UK(tile)(const int ROWS, const int NVEC, int64_t kq,
                                        const uint8_t *a, int64_t lda, const uint8_t *b,
                                        int64_t ps, int32_t *c, int64_t ldc, int accumulate,
                                        const int BIASED, const int FINISH, const int PREFETCH,
                                        const w8_tile_finish *fin)
{
    if (ROWS == 1 && kq <= W8_UK_ROW_STREAM_MAX_KQ) {
        W8_UK(row_tile)(NVEC, kq, a, b, ps, c, accumulate, BIASED, FINISH, PREFETCH, fin);
        return;
    }
    W8_UK_EACH_RV(W8_UK_DECL_ACC)
    W8_UK_EACH_R(W8_UK_DECL_ROW)
    for (int64_t q = 0; q < kq; q++) {
        const uint8_t *bq = b + q * W8_QUAD_BYTES;
        if (PREFETCH)
            for (int p = 0; p < NVEC / W8_UK_VPP; p++)
                __builtin_prefetch(bq + p * ps + W8_UK_AHEAD, 0, 3);
        W8_UK_EACH_VEC(W8_UK_LOAD_VEC)
        W8_UK_EACH_R(W8_UK_DOT_ROW)
    }
    W8_UK_EACH_RV(W8_UK_STORE_ONE)
}

/* The row count of a call as a constant: one inlined tile per count up to W8_UK_MR (the
 * `if`s drop the counts beyond it, which no call asks for: a 4-row tile of the 2-row
 * avx2 kernel would only spill). */
W8_UK_TARGET W8_INLINE void W8_UK(tile_rows)(int rows, const int NVEC, int64_t kq,
                                             const uint8_t *a, int64_t lda, const uint8_t *b,
                                             int64_t ps, int32_t *c, int64_t ldc,
                                             int accumulate, const int BIASED,
                                             const int FINISH, const int PREFETCH,
                                             const w8_tile_finish *fin)
{
    switch (rows) {
        W8_UK_EACH_ROWS(W8_UK_ROWS_CASE)
    default:
        W8_UK(tile)(1, NVEC, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, FINISH, PREFETCH,
                    fin);
        break;
    }
}

/* The vector count of a call (its panels times W8_UK_VPP) as a constant: one case per
 * count that is a whole number of panels, up to W8_UK_NVEC (the `if`s drop the others). */
W8_UK_TARGET W8_INLINE void W8_UK(tiles)(int rows, int npanels, int64_t kq, const uint8_t *a,
                                         int64_t lda, const uint8_t *b, int64_t ps,
                                         int32_t *c, int64_t ldc, int accumulate,
                                         const int BIASED, const int FINISH,
                                         const int PREFETCH, const w8_tile_finish *fin)
{
    switch (npanels * W8_UK_VPP) {
        W8_UK_EACH_VEC(W8_UK_VECS_CASE)
    }
}

/* The entry points: BIASED, FINISH and PREFETCH are constants in each. */
#define W8_UK_ENTRY(name, BIASED, PREFETCH)                                              \
    W8_UK_TARGET static void W8_UK(name)(int rows, int npanels, int64_t kq,              \
                                         const uint8_t *a, int64_t lda, const uint8_t *b, \
                                         int64_t ps, int32_t *c, int64_t ldc, int accumulate) \
    {                                                                                    \
        W8_UK(tiles)(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, 0,     \
                     PREFETCH, NULL);                                                    \
    }
#define W8_UK_F32_ENTRY(name, BIASED, PREFETCH)                                          \
    W8_UK_TARGET static void W8_UK(name)(int rows, int npanels, int64_t kq,              \
                                         const uint8_t *a, int64_t lda, const uint8_t *b, \
                                         int64_t ps, int32_t *c, int64_t ldc, int accumulate, \
                                         const w8_tile_finish *fin)                      \
    {                                                                                    \
        W8_UK(tiles)(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, BIASED, 1,     \
                     PREFETCH, fin);                                                     \
    }
W8_UK_ENTRY(ukernel_biased, 1, 0)
W8_UK_ENTRY(ukernel_signed, 0, 0)
W8_UK_F32_ENTRY(ukernel_f32_biased, 1, 0)
W8_UK_F32_ENTRY(ukernel_f32_signed, 0, 0)
W8_UK_ENTRY(ukernel_prefetch_biased, 1, 1)
W8_UK_ENTRY(ukernel_prefetch_signed, 0, 1)
W8_UK_F32_ENTRY(ukernel_f32_prefetch_biased, 1, 1)
W8_UK_F32_ENTRY(ukernel_f32_prefetch_signed, 0, 1)

#undef W8_UK_VPP
#undef W8_UK_EACH_V
#undef W8_UK_EACH_RV
#undef W8_UK_EACH_R
#undef W8_UK_EACH_VEC
#undef W8_UK_EACH_ROWS
#undef W8_UK_ROWS_CASE
#undef W8_UK_VECS_CASE
#undef W8_UK_ENTRY
#undef W8_UK_F32_ENTRY
#undef W8_UK_DECL_ACC
#undef W8_UK_DECL_ROW
#undef W8_UK_LOAD_VEC
#undef W8_UK_DOT_ONE
#undef W8_UK_DOT_ROW
#undef W8_UK_STORE_ONE
#undef W8_UK_ROW_STREAM_MAX_KQ
#undef W8_UK_ROW_U
#undef W8_UK_ROW_DOT
#undef W8_UK_AHEAD

#undef W8_UK
#undef W8_UK_TARGET
#undef W8_UK_MR
#undef W8_UK_NVEC
#undef W8_UK_A
#undef W8_UK_B
#undef W8_UK_BCAST
#undef W8_UK_LOAD_B
#undef W8_UK_DOT
