/* Portable C path: the reference every SIMD path must match bit for bit, and the fallback
 * for CPUs without AVX2 (and the base of the Arm build). */
#ifndef PYW8A8_SIMD_SCALAR_H
#define PYW8A8_SIMD_SCALAR_H

#include "common.h"

#define W8_SCALAR_MR 4
#define W8_SCALAR_NV 1

/* b_flip = 0x80 turns a biased weight byte (q + 128) back into the signed q. */
W8_INLINE void w8_scalar_tile(int rows, int npanels, int64_t kq, const uint8_t *a,
                              int64_t lda, const uint8_t *b, int64_t panel_stride,
                              int32_t *tile, uint8_t b_flip)
{
    for (int r = 0; r < rows; r++) {
        for (int p = 0; p < npanels; p++) {
            int32_t acc[W8_NR] = {0};
            const uint8_t *bp = b + p * panel_stride;
            const int8_t *ar = (const int8_t *)(a + r * lda);
            for (int64_t q = 0; q < kq; q++) {
                const uint8_t *row = bp + q * W8_QUAD_BYTES;
                for (int c = 0; c < W8_NR; c++)
                    for (int j = 0; j < 4; j++)
                        acc[c] += (int32_t)ar[4 * q + j] *
                                  (int32_t)(int8_t)(row[4 * c + j] ^ b_flip);
            }
            memcpy(tile + r * W8_TILE_LD + p * W8_NR, acc, sizeof(acc));
        }
    }
}

static void w8_scalar_ukernel_biased(int rows, int npanels, int64_t kq, const uint8_t *a,
                                     int64_t lda, const uint8_t *b, int64_t ps, int32_t *t)
{
    w8_scalar_tile(rows, npanels, kq, a, lda, b, ps, t, 0x80);
}

static void w8_scalar_ukernel_signed(int rows, int npanels, int64_t kq, const uint8_t *a,
                                     int64_t lda, const uint8_t *b, int64_t ps, int32_t *t)
{
    w8_scalar_tile(rows, npanels, kq, a, lda, b, ps, t, 0);
}

/* The u8 x s8 products of vpdpbusd / tdpbusd in plain C, with the +128 shift and its
 * compensation exactly as the VNNI and AMX paths do them, so the compensation logic of the
 * loop nest (W8_CORR_ROW / W8_CORR_COL and the prefix sums) is tested on every CPU.
 * biased: weights are the u8 operand (q + 128); signed: activations are (qa ^ 0x80). */
W8_INLINE void w8_u8s8_tile(int rows, int npanels, int64_t kq, const uint8_t *a,
                            int64_t lda, const uint8_t *b, int64_t panel_stride,
                            int32_t *tile, int biased)
{
    for (int r = 0; r < rows; r++) {
        for (int p = 0; p < npanels; p++) {
            int32_t acc[W8_NR] = {0};
            const uint8_t *bp = b + p * panel_stride;
            const uint8_t *ar = a + r * lda;
            for (int64_t q = 0; q < kq; q++) {
                const uint8_t *row = bp + q * W8_QUAD_BYTES;
                for (int c = 0; c < W8_NR; c++)
                    for (int j = 0; j < 4; j++) {
                        const uint8_t wb = row[4 * c + j], ab = ar[4 * q + j];
                        acc[c] += biased ? (int32_t)wb * (int8_t)ab
                                         : (int32_t)ab * (int8_t)wb;
                    }
            }
            memcpy(tile + r * W8_TILE_LD + p * W8_NR, acc, sizeof(acc));
        }
    }
}

static void w8_u8s8_ukernel_biased(int rows, int npanels, int64_t kq, const uint8_t *a,
                                   int64_t lda, const uint8_t *b, int64_t ps, int32_t *t)
{
    w8_u8s8_tile(rows, npanels, kq, a, lda, b, ps, t, 1);
}

static void w8_u8s8_ukernel_signed(int rows, int npanels, int64_t kq, const uint8_t *a,
                                   int64_t lda, const uint8_t *b, int64_t ps, int32_t *t)
{
    w8_u8s8_tile(rows, npanels, kq, a, lda, b, ps, t, 0);
}

static int w8_scalar_absmax(const float *x, int64_t n, float *amax)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (!(v <= 3.4028234663852886e38f)) return 1; /* NaN or Inf */
        m = v > m ? v : m;
    }
    *amax = m;
    return 0;
}

/* rintf rounds half to even in the default rounding mode, like cvtps2dq on x86. */
static void w8_scalar_quantize(const float *x, int64_t n, float inv, uint8_t flip,
                               uint8_t *q)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        q[i] = (uint8_t)((int8_t)(int32_t)rintf(v)) ^ flip;
    }
}

static const w8_isa_ops w8_scalar_ops = {
    "scalar", W8_SCALAR_MR, W8_SCALAR_NV,
    {w8_scalar_ukernel_biased, w8_scalar_ukernel_signed},
    {W8_CORR_NONE, W8_CORR_NONE},
    {0, 0},
    w8_scalar_absmax,
    w8_scalar_quantize,
};

/* Never chosen by default (it is as slow as `scalar`): a test path, forced by name. */
static const w8_isa_ops w8_scalar_u8s8_ops = {
    "scalar_u8s8", W8_SCALAR_MR, W8_SCALAR_NV,
    {w8_u8s8_ukernel_biased, w8_u8s8_ukernel_signed},
    {W8_CORR_ROW, W8_CORR_COL},
    {0, 0x80},
    w8_scalar_absmax,
    w8_scalar_quantize,
};

#endif
