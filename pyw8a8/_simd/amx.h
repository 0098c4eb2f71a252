/* AMX-INT8 ISA (Sapphire Rapids and later): one tdpbssd / tdpbsud multiplies a 16 x 64 int8
 * A tile by a 64 x 16 B tile into 16 x 16 int32, 16,384 multiply-accumulates per instruction.
 *
 * A B tile is 16 rows of 64 bytes where row r holds 4 consecutive K values of 16 channels:
 * exactly 16 consecutive quad rows of a packed panel, so B tiles load straight from the
 * packed weight with a 64-byte stride, and A tiles straight from the row-major quantized
 * activations (whose buffers hold whole 16-row tiles, W8_A_ROW_PAD).
 * AMX has every signedness combination, so signed weights need no compensation at all
 * (tdpbssd) and biased weights use tdpbsud with the usual 128 * sum(qa) correction.
 *
 * Eight tiles of 64-byte rows: C tiles 0-3 (row block i, panel j at 2i + j), A tiles 4-5,
 * B tiles 6-7 (16 rows).  One microkernel call is a block of up to 32 x 32 (2 x 2 C tiles)
 * accumulated over its whole K-range, stored once.  The C and A tiles of row block i have
 * the rows that w8_amx_tile_rows last asked for: 16 and 16 at a task's start, fewer for a
 * block of fewer rows, so that a product of 8 rows loads 8-row A tiles and stores its 8
 * rows straight into the output.  The quantizer, FWHT and float epilogue are the AVX-512
 * ones (every AMX CPU has AVX-512).  Linux grants the tile state only on request
 * (w8_amx_request in cpu.h). */
#ifndef PYW8A8_SIMD_AMX_H
#define PYW8A8_SIMD_AMX_H

#include "avx512vnni.h"
#if defined(W8_X86) && (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 || \
                        defined(__clang__) && __clang_major__ >= 12)
#define W8_HAVE_AMX 1

#define W8_AMX W8_TARGET("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#define W8_AMX_MR 32
#define W8_AMX_NPANELS 2

/* The 64-byte tile configuration (palette 1): bytes per row and rows of each tile. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} w8_amx_config;

/* The configurations, one per row count 1..32 of a call's tiles (index rows - 1): constant
 * objects in read-only data, not locals filled by stores: GCC 12 declares
 * _tile_loadconfig's operand as the first 8 bytes of the configuration only, and drops the
 * stores that fill the other 56 of a local one (ldtilecfg then faults).  Row block 1's
 * tiles (2, 3, 5) are left unconfigured when it has no rows. */
#define W8_AMX_B1(R1) ((R1) ? 64 : 0)
#define W8_AMX_BLOCKS(R0, R1)                                                            \
    {1, 0, {0},                                                                          \
     {64, 64, W8_AMX_B1(R1), W8_AMX_B1(R1), 64, W8_AMX_B1(R1), 64, 64, 0, 0, 0, 0, 0, 0, 0, 0}, \
     {R0, R0, R1, R1, R0, R1, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0}}
#define W8_AMX_ROWS(r) W8_AMX_BLOCKS((r) < 16 ? (r) : 16, (r) > 16 ? (r) - 16 : 0)
static const w8_amx_config w8_amx_configs[W8_AMX_MR] W8_ALIGN(64) = {
    W8_AMX_ROWS(1),  W8_AMX_ROWS(2),  W8_AMX_ROWS(3),  W8_AMX_ROWS(4),  W8_AMX_ROWS(5),
    W8_AMX_ROWS(6),  W8_AMX_ROWS(7),  W8_AMX_ROWS(8),  W8_AMX_ROWS(9),  W8_AMX_ROWS(10),
    W8_AMX_ROWS(11), W8_AMX_ROWS(12), W8_AMX_ROWS(13), W8_AMX_ROWS(14), W8_AMX_ROWS(15),
    W8_AMX_ROWS(16), W8_AMX_ROWS(17), W8_AMX_ROWS(18), W8_AMX_ROWS(19), W8_AMX_ROWS(20),
    W8_AMX_ROWS(21), W8_AMX_ROWS(22), W8_AMX_ROWS(23), W8_AMX_ROWS(24), W8_AMX_ROWS(25),
    W8_AMX_ROWS(26), W8_AMX_ROWS(27), W8_AMX_ROWS(28), W8_AMX_ROWS(29), W8_AMX_ROWS(30),
    W8_AMX_ROWS(31), W8_AMX_ROWS(32),
};
#undef W8_AMX_ROWS
#undef W8_AMX_BLOCKS
#undef W8_AMX_B1

/* The row count the calling thread's tiles are configured for (0: none). */
static __thread int w8_amx_rows_configured;

/* Tiles of `rows` rows for the kernel calls that follow on this thread.  ldtilecfg costs
 * about 75 ns, so the loop nest asks once per row block, not per call. */
W8_AMX static void w8_amx_tile_rows(int rows)
{
    if (rows == w8_amx_rows_configured) return;
    _tile_loadconfig(&w8_amx_configs[rows - 1]);
    w8_amx_rows_configured = rows;
}

W8_AMX static void w8_amx_task_begin(void) { w8_amx_tile_rows(W8_AMX_MR); }

W8_AMX static void w8_amx_task_end(void)
{
    _tile_release();
    w8_amx_rows_configured = 0;
}

/* 1 when the tiles hold exactly the configuration asked for (16-row and 8-row tiles), read
 * back with sttilecfg; a test runs it natively, where a configuration byte that the
 * compiler failed to store would show.  GCC 12 declares sttilecfg as writing 8 bytes
 * only: the barrier makes the comparison read all 64 from memory. */
W8_AMX static inline int w8_amx_config_roundtrip(void)
{
    static const int asked[] = {W8_AMX_MR, 8};
    int same = 1;
    for (int i = 0; i < 2; i++) {
        const int rows = asked[i];
        w8_amx_config held;
        memset(&held, 0xAB, sizeof(held));
        w8_amx_task_begin();
        w8_amx_tile_rows(rows);
        _tile_storeconfig(&held);
        __asm__ __volatile__("" : : "r"(&held) : "memory");
        w8_amx_task_end();
        same &= memcmp(&held, &w8_amx_configs[rows - 1], sizeof(held)) == 0;
    }
    return same;
}

/* Tile numbers must be compile-time constants, hence the macros. */
#define W8_AMX_DP(C, A, B, SIGNED_B)                                                     \
    do {                                                                                 \
        if (SIGNED_B) _tile_dpbssd(C, A, B);                                             \
        else _tile_dpbsud(C, A, B);                                                      \
    } while (0)
#define W8_AMX_START(T, P, ACCUMULATE)                                                   \
    do {                                                                                 \
        if (ACCUMULATE) _tile_loadd(T, P, cstride);                                      \
        else _tile_zero(T);                                                              \
    } while (0)

/* rows <= the configured rows (w8_amx_tile_rows) and npanels <= 2; stores the whole tiles
 * of the configured rows (the registry's whole_tiles).  PREFETCH: each step also asks for
 * the same step of the next strip's two panels (the loop nest's next tile column) into L2,
 * so over its k-loop the first row tile of a strip brings in the whole next strip, each
 * line once (gemm_loops.h's w8_kernel_of): from L3 on demand a strip arrived at about
 * 14 GB/s a core where the read probe reaches 23 (64 x 1152 x 6912, issue 60). */
W8_AMX W8_INLINE void w8_amx_tile(int rows, int npanels, int64_t kq, const uint8_t *a,
                                  int64_t lda, const uint8_t *b, int64_t ps, int32_t *c,
                                  int64_t ldc, int accumulate, const int SIGNED_B,
                                  const int PREFETCH)
{
    const int64_t cstride = ldc * (int64_t)sizeof(int32_t);
    const int two_rows = rows > 16, two_panels = npanels > 1;
    W8_AMX_START(0, c, accumulate);
    if (two_panels) W8_AMX_START(1, c + W8_NR, accumulate);
    if (two_rows) {
        W8_AMX_START(2, c + 16 * ldc, accumulate);
        if (two_panels) W8_AMX_START(3, c + 16 * ldc + W8_NR, accumulate);
    }
    /* The plain kernel prefetches nothing: the B panels are read in order, which the
     * hardware prefetchers follow, and 32 prefetches a step of the next step's B tiles took
     * load slots from the tile loads (without them 64 x 1152 x 6912 ran 1.09x as fast, 2
     * Xeon vCPUs).  The next strip's, into L2, are the tuner's to judge. */
    /* The A tiles load with the streaming hint (tileloaddt1): a row tile's activations
     * are read once per strip, and loaded as usual they evict the strip's B panels, which
     * every row tile reads again (1.02-1.05x from 64 rows, 2 Xeon vCPUs). */
    for (int64_t s = 0; s < kq; s += 16) {
        const uint8_t *as = a + 4 * s, *bs = b + s * W8_QUAD_BYTES;
        if (PREFETCH) /* the next strip: the panels after this call's pair */
            for (int line = 0; line < 16; line++) {
                __builtin_prefetch(bs + W8_AMX_NPANELS * ps + 64 * line, 0, 2);
                __builtin_prefetch(bs + (W8_AMX_NPANELS + 1) * ps + 64 * line, 0, 2);
            }
        _tile_stream_loadd(4, as, lda);
        _tile_loadd(6, bs, W8_QUAD_BYTES);
        if (two_panels) _tile_loadd(7, bs + ps, W8_QUAD_BYTES);
        if (two_rows) _tile_stream_loadd(5, as + 16 * lda, lda);
        W8_AMX_DP(0, 4, 6, SIGNED_B);
        if (two_panels) W8_AMX_DP(1, 4, 7, SIGNED_B);
        if (two_rows) {
            W8_AMX_DP(2, 5, 6, SIGNED_B);
            if (two_panels) W8_AMX_DP(3, 5, 7, SIGNED_B);
        }
    }
    _tile_stored(0, c, cstride);
    if (two_panels) _tile_stored(1, c + W8_NR, cstride);
    if (two_rows) {
        _tile_stored(2, c + 16 * ldc, cstride);
        if (two_panels) _tile_stored(3, c + 16 * ldc + W8_NR, cstride);
    }
}

/* The finishing kernels (w8_ukernel_f32_fn): the C tiles stored to a block in L1 rather
 * than to the output, then the AVX-512 epilogue converts its `rows` rows straight into the
 * output, so that the int32 sums make no round trip through the output's lines (beyond
 * L2 for a large output) and no later pass reads them back.  Over a later K-range the
 * partial sums the output holds are copied into the block first (`rows` of them: the
 * tiles load whole tiles of the configured rows).  256 x 1152 x 6912 ran 1.33x as fast
 * (2 Xeon vCPUs; the loop nest's w8_row_block says where the kernel finishes). */
W8_AMX W8_INLINE void w8_amx_tile_f32(int rows, int npanels, int64_t kq, const uint8_t *a,
                                      int64_t lda, const uint8_t *b, int64_t ps, int32_t *c,
                                      int64_t ldc, int accumulate, const w8_tile_finish *fin,
                                      const int SIGNED_B, const int PREFETCH)
{
    enum { LD = W8_AMX_NPANELS * W8_NR };
    W8_ALIGN(64) int32_t sums[W8_AMX_MR * LD];
    const int cols = npanels * W8_NR;
    if (accumulate)
        for (int r = 0; r < rows; r++)
            memcpy(sums + r * LD, c + r * ldc, (size_t)cols * sizeof(int32_t));
    w8_amx_tile(rows, npanels, kq, a, lda, b, ps, sums, LD, accumulate, SIGNED_B, PREFETCH);
    w8_avx512_epilogue(sums, LD, rows, cols, fin, (float *)c, ldc);
}

/* The registry's entries (w8_ukernel_fn and w8_ukernel_f32_fn), one per weight encoding,
 * plain and prefetching. */
#define W8_AMX_ENTRY(name, SIGNED_B, PREFETCH)                                               \
    W8_AMX static void w8_amx_##name(int rows, int npanels, int64_t kq, const uint8_t *a,    \
                                     int64_t lda, const uint8_t *b, int64_t ps, int32_t *c,  \
                                     int64_t ldc, int accumulate)                            \
    {                                                                                        \
        w8_amx_tile(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, SIGNED_B,          \
                    PREFETCH);                                                               \
    }
#define W8_AMX_F32_ENTRY(name, SIGNED_B, PREFETCH)                                           \
    W8_AMX static void w8_amx_##name(int rows, int npanels, int64_t kq, const uint8_t *a,    \
                                     int64_t lda, const uint8_t *b, int64_t ps, int32_t *c,  \
                                     int64_t ldc, int accumulate, const w8_tile_finish *fin) \
    {                                                                                        \
        w8_amx_tile_f32(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, fin,           \
                        SIGNED_B, PREFETCH);                                                 \
    }
W8_AMX_ENTRY(ukernel_biased, 0, 0)
W8_AMX_ENTRY(ukernel_signed, 1, 0)
W8_AMX_ENTRY(ukernel_prefetch_biased, 0, 1)
W8_AMX_ENTRY(ukernel_prefetch_signed, 1, 1)
W8_AMX_F32_ENTRY(ukernel_f32_biased, 0, 0)
W8_AMX_F32_ENTRY(ukernel_f32_signed, 1, 0)
W8_AMX_F32_ENTRY(ukernel_f32_prefetch_biased, 0, 1)
W8_AMX_F32_ENTRY(ukernel_f32_prefetch_signed, 1, 1)
#undef W8_AMX_ENTRY
#undef W8_AMX_F32_ENTRY

/* Instruction peak: four tdpbssd per round on resident tiles. */
W8_AMX static int64_t w8_amx_peak(int64_t iters, int32_t *sink)
{
    W8_ALIGN(64) int8_t src[16 * 64];
    W8_ALIGN(64) int32_t dst[16 * 16];
    memset(src, (int)(*sink & 0x3f) | 1, sizeof(src));
    w8_amx_task_begin();
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, dst, 64);
    *sink += dst[0];
    w8_amx_task_end();
    return iters * 4 * 16 * 16 * 64;
}

#endif
#endif
