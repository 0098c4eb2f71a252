/* The intrinsics of the AVX-512 VNNI, AVX-VNNI and AMX ISAs, emulated in plain C, for the
 * test build of tests/c (-DW8_EMULATE, with this folder and SIMDe's headers on the include
 * path): the kernels of every x86 ISA then run, bit for bit as on hardware, on any CPU with
 * AVX2 (the build keeps -mavx2 -mfma, so the AVX2 ISA and SIMDe's fallbacks stay native).
 *
 *   AVX-512 and AVX-VNNI: SIMDe, with its native aliases (the kernels' _mm512_* names).
 *   AMX: the small model below of the tile state and the instructions the AMX ISA uses.
 *
 * Neither can catch what only real hardware shows, such as a tile configuration whose
 * stores the compiler dropped: `_kernels.amx_config_roundtrip` checks that natively. */
#ifndef PYW8A8_TESTS_W8_EMULATE_H
#define PYW8A8_TESTS_W8_EMULATE_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* AVX-VNNI's VEX form computes exactly what AVX512-VL's EVEX form does. */
#define _mm256_dpbusd_avx_epi32(src, a, b) simde_mm256_dpbusd_epi32(src, a, b)
/* Missing in SIMDe 0.8: within each 128-bit lane, permuting one source is shuffling it
 * with itself. */
#define _mm512_permute_ps(a, imm) simde_mm512_shuffle_ps(a, a, imm)
/* Missing in SIMDe 0.8 as well, the conversions between 8 floats and 8 doubles: through
 * the 256-bit conversion of either half (to nearest even, as the hardware rounds). */
#define _mm512_cvtpd_ps(a)                                                               \
    simde_mm256_set_m128(simde_mm256_cvtpd_ps(simde_mm512_extractf64x4_pd(a, 1)),        \
                         simde_mm256_cvtpd_ps(simde_mm512_extractf64x4_pd(a, 0)))
#define _mm512_cvtps_pd(a)                                                               \
    simde_mm512_insertf64x4(                                                             \
        simde_mm512_castpd256_pd512(simde_mm256_cvtps_pd(simde_mm256_castps256_ps128(a))), \
        simde_mm256_cvtps_pd(simde_mm256_extractf128_ps(a, 1)), 1)

/* ---- AMX: eight tiles of at most 16 rows x 64 bytes, per thread as on hardware. ---- */

typedef struct {
    int configured;
    uint8_t config[64];           /* palette, start_row, reserved, colsb[16], rows[16] */
    uint8_t tile[8][16][64];
} w8_emu_amx_state;

static __thread w8_emu_amx_state w8_emu_amx;

static void w8_emu_amx_fault(const char *what, int t)
{
    fprintf(stderr, "emulated AMX fault: %s (tile %d)\n", what, t);
    abort();
}

static int w8_emu_rows(int t) { return w8_emu_amx.config[48 + t]; }

static int w8_emu_colsb(int t)
{
    uint16_t c;
    memcpy(&c, w8_emu_amx.config + 16 + 2 * t, 2);
    return c;
}

static void w8_emu_check_tile(int t)
{
    if (!w8_emu_amx.configured) w8_emu_amx_fault("tile instruction before ldtilecfg", t);
    if (t < 0 || t > 7) w8_emu_amx_fault("no such tile", t);
    if (w8_emu_rows(t) == 0 || w8_emu_colsb(t) == 0) w8_emu_amx_fault("tile not configured", t);
}

/* ldtilecfg: palette 1 with rows <= 16 and colsb <= 64 per tile; zeroes every tile. */
static void w8_emu_tile_loadconfig(const void *cfg)
{
    const uint8_t *c = (const uint8_t *)cfg;
    if (c[0] == 0) {
        memset(&w8_emu_amx, 0, sizeof(w8_emu_amx));
        return;
    }
    if (c[0] != 1) w8_emu_amx_fault("palette other than 1", -1);
    for (int i = 2; i < 16; i++)
        if (c[i]) w8_emu_amx_fault("reserved configuration byte set", -1);
    memcpy(w8_emu_amx.config, c, 64);
    for (int t = 0; t < 8; t++)
        if (w8_emu_rows(t) > 16 || w8_emu_colsb(t) > 64 || w8_emu_colsb(t) % 4)
            w8_emu_amx_fault("tile shape beyond palette 1", t);
    memset(w8_emu_amx.tile, 0, sizeof(w8_emu_amx.tile));
    w8_emu_amx.configured = 1;
}

static void w8_emu_tile_storeconfig(void *cfg)
{
    memcpy(cfg, w8_emu_amx.config, 64);
}

static void w8_emu_tile_release(void) { memset(&w8_emu_amx, 0, sizeof(w8_emu_amx)); }

static void w8_emu_tile_loadd(int t, const void *base, long stride)
{
    w8_emu_check_tile(t);
    memset(w8_emu_amx.tile[t], 0, sizeof(w8_emu_amx.tile[t]));
    for (int r = 0; r < w8_emu_rows(t); r++)
        memcpy(w8_emu_amx.tile[t][r], (const uint8_t *)base + r * stride,
               (size_t)w8_emu_colsb(t));
}

static void w8_emu_tile_stored(int t, void *base, long stride)
{
    w8_emu_check_tile(t);
    for (int r = 0; r < w8_emu_rows(t); r++)
        memcpy((uint8_t *)base + r * stride, w8_emu_amx.tile[t][r], (size_t)w8_emu_colsb(t));
}

static void w8_emu_tile_zero(int t)
{
    w8_emu_check_tile(t);
    memset(w8_emu_amx.tile[t], 0, sizeof(w8_emu_amx.tile[t]));
}

/* C[m][n] += sum over k < colsb(a)/4, i < 4 of A[m][4k+i] * B[k][4n+i] in 32 bits with
 * wrap-around; a_signed / b_signed read the bytes as int8 or uint8. */
static void w8_emu_tile_dp(int c, int a, int b, int a_signed, int b_signed)
{
    w8_emu_check_tile(c);
    w8_emu_check_tile(a);
    w8_emu_check_tile(b);
    if (c == a || c == b || a == b) w8_emu_amx_fault("tile operands must differ", c);
    if (w8_emu_rows(a) != w8_emu_rows(c) || w8_emu_rows(b) != w8_emu_colsb(a) / 4 ||
        w8_emu_colsb(b) != w8_emu_colsb(c))
        w8_emu_amx_fault("tile shapes do not agree", c);
    for (int m = 0; m < w8_emu_rows(c); m++)
        for (int n = 0; n < w8_emu_colsb(c) / 4; n++) {
            uint32_t acc;
            memcpy(&acc, &w8_emu_amx.tile[c][m][4 * n], 4);
            for (int k = 0; k < w8_emu_colsb(a) / 4; k++)
                for (int i = 0; i < 4; i++) {
                    const uint8_t x = w8_emu_amx.tile[a][m][4 * k + i];
                    const uint8_t y = w8_emu_amx.tile[b][k][4 * n + i];
                    const int32_t xv = a_signed ? (int8_t)x : x, yv = b_signed ? (int8_t)y : y;
                    acc += (uint32_t)(xv * yv);
                }
            memcpy(&w8_emu_amx.tile[c][m][4 * n], &acc, 4);
        }
}

/* GCC's own definitions (macros and inline functions of <immintrin.h>) give way to the
 * model from here on. */
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_dpbsud
#undef _tile_dpbusd
#undef _tile_dpbuud
#define _tile_loadconfig(cfg) w8_emu_tile_loadconfig(cfg)
#define _tile_storeconfig(cfg) w8_emu_tile_storeconfig(cfg)
#define _tile_release() w8_emu_tile_release()
#define _tile_loadd(t, base, stride) w8_emu_tile_loadd(t, base, (long)(stride))
#define _tile_stream_loadd(t, base, stride) w8_emu_tile_loadd(t, base, (long)(stride))
#define _tile_stored(t, base, stride) w8_emu_tile_stored(t, base, (long)(stride))
#define _tile_zero(t) w8_emu_tile_zero(t)
#define _tile_dpbssd(c, a, b) w8_emu_tile_dp(c, a, b, 1, 1)
#define _tile_dpbsud(c, a, b) w8_emu_tile_dp(c, a, b, 1, 0)
#define _tile_dpbusd(c, a, b) w8_emu_tile_dp(c, a, b, 0, 1)
#define _tile_dpbuud(c, a, b) w8_emu_tile_dp(c, a, b, 0, 0)

#endif
