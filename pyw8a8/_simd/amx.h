/* AMX-INT8 path (Sapphire Rapids and later): one tdpbssd / tdpbsud multiplies a 16 x 64 int8
 * A tile by a 64 x 16 B tile into 16 x 16 int32, 16,384 multiply-accumulates per instruction.
 *
 * A B tile is 16 rows of 64 bytes where row r holds 4 consecutive K values of 16 channels:
 * exactly 16 consecutive quad rows of a packed panel, so tiles load straight from the packed
 * weight with a 64-byte stride; A tiles load from the row-major activations.
 * AMX has every signedness combination, so signed weights need no compensation at all
 * (tdpbssd) and biased weights use tdpbsud with the usual 128 * sum(qa) correction.
 * Linux grants the tile state only on request (w8_amx_request in cpu.h). */
#ifndef PYW8A8_SIMD_AMX_H
#define PYW8A8_SIMD_AMX_H

#include "avx2.h"
#if defined(W8_X86) && (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 || \
                        defined(__clang__) && __clang_major__ >= 12)
#define W8_HAVE_AMX 1

#define W8_AMX W8_TARGET("avx2,fma,amx-tile,amx-int8")
#define W8_AMX_MR 32
#define W8_AMX_NV 2

/* The 64-byte tile configuration (palette 1): bytes per row and rows of each tile.
 * Tiles 0-3: C (row block i, panel j) at 2 * i + j; tiles 4-5: A row blocks; 6-7: B. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} w8_amx_config;

W8_AMX static void w8_amx_configure(int rows0, int rows1, int npanels)
{
    W8_ALIGN(64) w8_amx_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    const int rows[2] = {rows0, rows1};
    for (int i = 0; i < 2; i++) {
        if (rows[i] == 0) continue;
        for (int j = 0; j < npanels; j++) {
            cfg.rows[2 * i + j] = (uint8_t)rows[i];
            cfg.colsb[2 * i + j] = 64;
        }
        cfg.rows[4 + i] = (uint8_t)rows[i];
        cfg.colsb[4 + i] = 64;
    }
    for (int j = 0; j < npanels; j++) {
        cfg.rows[6 + j] = 16;
        cfg.colsb[6 + j] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* Tile numbers must be compile-time constants, hence the unrolled blocks. */
#define W8_AMX_DP(C, A, B, SIGNED_B)                                                     \
    do {                                                                                 \
        if (SIGNED_B) _tile_dpbssd(C, A, B);                                             \
        else _tile_dpbsud(C, A, B);                                                      \
    } while (0)

W8_AMX W8_INLINE void w8_amx_tile(int rows, int npanels, int64_t kq, const uint8_t *a,
                                  int64_t lda, const uint8_t *b, int64_t ps, int32_t *tile,
                                  int signed_b)
{
    const int rows0 = rows < 16 ? rows : 16, rows1 = rows - rows0;
    const int64_t tile_stride = W8_TILE_LD * (int64_t)sizeof(int32_t);
    w8_amx_configure(rows0, rows1, npanels);
    _tile_zero(0);
    if (npanels > 1) _tile_zero(1);
    if (rows1) {
        _tile_zero(2);
        if (npanels > 1) _tile_zero(3);
    }
    /* kq is a multiple of 16: K-ranges are multiples of 64 bytes. */
    for (int64_t s = 0; s < kq; s += 16) {
        const uint8_t *as = a + 4 * s, *bs = b + s * W8_QUAD_BYTES;
        _tile_loadd(4, as, lda);
        _tile_loadd(6, bs, W8_QUAD_BYTES);
        W8_AMX_DP(0, 4, 6, signed_b);
        if (npanels > 1) {
            _tile_loadd(7, bs + ps, W8_QUAD_BYTES);
            W8_AMX_DP(1, 4, 7, signed_b);
        }
        if (rows1) {
            _tile_loadd(5, as + 16 * lda, lda);
            W8_AMX_DP(2, 5, 6, signed_b);
            if (npanels > 1) W8_AMX_DP(3, 5, 7, signed_b);
        }
    }
    _tile_stored(0, tile, tile_stride);
    if (npanels > 1) _tile_stored(1, tile + W8_NR, tile_stride);
    if (rows1) {
        _tile_stored(2, tile + 16 * W8_TILE_LD, tile_stride);
        if (npanels > 1) _tile_stored(3, tile + 16 * W8_TILE_LD + W8_NR, tile_stride);
    }
}

W8_AMX static void w8_amx_ukernel_biased(int rows, int npanels, int64_t kq,
                                         const uint8_t *a, int64_t lda, const uint8_t *b,
                                         int64_t ps, int32_t *t)
{
    w8_amx_tile(rows, npanels, kq, a, lda, b, ps, t, 0);
}

W8_AMX static void w8_amx_ukernel_signed(int rows, int npanels, int64_t kq,
                                         const uint8_t *a, int64_t lda, const uint8_t *b,
                                         int64_t ps, int32_t *t)
{
    w8_amx_tile(rows, npanels, kq, a, lda, b, ps, t, 1);
}

static const w8_isa_ops w8_amx_ops = {
    "amx", W8_AMX_MR, W8_AMX_NV,
    {w8_amx_ukernel_biased, w8_amx_ukernel_signed},
    {W8_CORR_ROW, W8_CORR_NONE},
    {0, 0},
    w8_avx2_absmax,
    w8_avx2_quantize,
};

/* Instruction peak: four tdpbssd per round on resident tiles. */
W8_AMX static int64_t w8_peak_amx(int64_t iters, int32_t *sink)
{
    W8_ALIGN(64) int8_t src[16 * 64];
    W8_ALIGN(64) int32_t dst[16 * 16];
    memset(src, (int)(*sink & 0x3f) | 1, sizeof(src));
    w8_amx_configure(16, 16, 2);
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
    _tile_release();
    return iters * 4 * 16 * 16 * 64;
}

#endif
#endif
