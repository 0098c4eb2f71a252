/* AMX-INT8 path (Sapphire Rapids and later): one tdpbssd / tdpbsud multiplies a 16 x 64 int8
 * A tile by a 64 x 16 B tile into 16 x 16 int32, 16,384 multiply-accumulates per instruction.
 *
 * A B tile is 16 rows of 64 bytes where row r holds 4 consecutive K values of 16 channels:
 * exactly 16 consecutive quad rows of a packed panel, so B tiles load straight from the
 * packed weight with a 64-byte stride, and A tiles straight from the row-major quantized
 * activations (whose buffers hold whole 16-row tiles, W8_A_ROW_PAD).
 * AMX has every signedness combination, so signed weights need no compensation at all
 * (tdpbssd) and biased weights use tdpbsud with the usual 128 * sum(qa) correction.
 *
 * The tiles are configured once per task (w8_amx_task_begin), all eight as 16 rows x 64
 * bytes: C tiles 0-3 (row block i, panel j at 2i + j), A tiles 4-5, B tiles 6-7.  One
 * microkernel call is a 32 x 32 block (2 x 2 C tiles) accumulated over its whole K-range,
 * stored once.  The quantizer, FWHT and float epilogue are the AVX-512 ones (every AMX CPU
 * has AVX-512).  Linux grants the tile state only on request (w8_amx_request in cpu.h). */
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

/* A constant object in read-only data, not a local filled by stores: GCC 12 declares
 * _tile_loadconfig's operand as the first 8 bytes of the configuration only, and drops
 * the stores that fill the other 56 of a local one (ldtilecfg then faults). */
static const w8_amx_config w8_amx_tiles_16x64 W8_ALIGN(64) = {
    1, 0, {0},
    {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0},
    {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0},
};

W8_AMX static void w8_amx_task_begin(void) { _tile_loadconfig(&w8_amx_tiles_16x64); }

W8_AMX static void w8_amx_task_end(void) { _tile_release(); }

/* 1 when the tiles hold exactly the configuration w8_amx_task_begin loads, read back with
 * sttilecfg; a test runs it natively, where a configuration byte that the compiler failed
 * to store would show.  GCC 12 declares sttilecfg as writing 8 bytes only: the barrier
 * makes the comparison read all 64 from memory. */
W8_AMX static inline int w8_amx_config_roundtrip(void)
{
    w8_amx_config held;
    memset(&held, 0xAB, sizeof(held));
    w8_amx_task_begin();
    _tile_storeconfig(&held);
    __asm__ __volatile__("" : : "r"(&held) : "memory");
    w8_amx_task_end();
    return memcmp(&held, &w8_amx_tiles_16x64, sizeof(held)) == 0;
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

/* rows <= 32 and npanels <= 2; stores whole 16-row tiles (the registry's whole_tiles). */
W8_AMX W8_INLINE void w8_amx_tile(int rows, int npanels, int64_t kq, const uint8_t *a,
                                  int64_t lda, const uint8_t *b, int64_t ps, int32_t *c,
                                  int64_t ldc, int accumulate, const int SIGNED_B)
{
    const int64_t cstride = ldc * (int64_t)sizeof(int32_t);
    const int two_rows = rows > 16, two_panels = npanels > 1;
    W8_AMX_START(0, c, accumulate);
    if (two_panels) W8_AMX_START(1, c + W8_NR, accumulate);
    if (two_rows) {
        W8_AMX_START(2, c + 16 * ldc, accumulate);
        if (two_panels) W8_AMX_START(3, c + 16 * ldc + W8_NR, accumulate);
    }
    /* No software prefetch: the B panels are read in order, which the hardware prefetchers
     * follow, and 32 prefetches a step (the next step's B tiles, as this kernel had) took
     * load slots from the tile loads: without them, 64 x 1152 x 6912 ran 1.09x faster and
     * 1024 x 2048 x 640 1.05x (2 Xeon vCPUs; prefetching to L2 instead was no better). */
    for (int64_t s = 0; s < kq; s += 16) {
        const uint8_t *as = a + 4 * s, *bs = b + s * W8_QUAD_BYTES;
        _tile_loadd(4, as, lda);
        _tile_loadd(6, bs, W8_QUAD_BYTES);
        if (two_panels) _tile_loadd(7, bs + ps, W8_QUAD_BYTES);
        if (two_rows) _tile_loadd(5, as + 16 * lda, lda);
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

W8_AMX static void w8_amx_ukernel_biased(int rows, int npanels, int64_t kq,
                                         const uint8_t *a, int64_t lda, const uint8_t *b,
                                         int64_t ps, int32_t *c, int64_t ldc, int accumulate)
{
    w8_amx_tile(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 0);
}

W8_AMX static void w8_amx_ukernel_signed(int rows, int npanels, int64_t kq,
                                         const uint8_t *a, int64_t lda, const uint8_t *b,
                                         int64_t ps, int32_t *c, int64_t ldc, int accumulate)
{
    w8_amx_tile(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 1);
}

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
