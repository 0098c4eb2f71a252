/* The portable C ISA, "scalar": the reference every SIMD ISA must match bit for bit, and
 * the fallback for CPUs without AVX2 (and the base of the Arm build). */
#ifndef PYW8A8_SIMD_SCALAR_H
#define PYW8A8_SIMD_SCALAR_H

#include "common.h"
#include "fwht.h"
#include "vec_scalar.h"

#define W8_SCALAR_MR 4
#define W8_SCALAR_NPANELS 1

/* The integer sums run in uint32: the u8 x s8 sums of the +128 encodings may wrap within an
 * exact K-range (common.h, W8_EXACT_K), and wrapping is defined only for unsigned types. */
W8_INLINE void w8_scalar_store(int32_t *c, const uint32_t *sums, int n, int accumulate)
{
    for (int j = 0; j < n; j++)
        c[j] = (int32_t)(accumulate ? (uint32_t)c[j] + sums[j] : sums[j]);
}

/* A byte of an operand as the instruction reads it: signed (after XOR flip; 0x80 turns a
 * biased weight byte q + 128 back into q) or unsigned, as the u8 operand of vpdpbusd. */
W8_INLINE int32_t w8_scalar_operand(uint8_t byte, int is_signed, uint8_t flip)
{
    return is_signed ? (int32_t)(int8_t)(byte ^ flip) : (int32_t)byte;
}

/* The dot products of a tile in plain C, its operands read as `a_signed`, `b_signed` (with
 * b_flip) say: the scalar ISA multiplies signed by signed; scalar_u8s8 the u8 x s8 of the
 * VNNI and AMX ISAs. */
W8_INLINE void w8_scalar_tile(int rows, int npanels, int64_t kq, const uint8_t *a,
                              int64_t lda, const uint8_t *b, int64_t panel_stride,
                              int32_t *c, int64_t ldc, int accumulate, int a_signed,
                              int b_signed, uint8_t b_flip)
{
    for (int r = 0; r < rows; r++) {
        for (int p = 0; p < npanels; p++) {
            uint32_t acc[W8_NR] = {0};
            const uint8_t *bp = b + p * panel_stride;
            const uint8_t *ar = a + r * lda;
            for (int64_t q = 0; q < kq; q++) {
                const uint8_t *row = bp + q * W8_QUAD_BYTES;
                for (int j = 0; j < W8_NR; j++)
                    for (int i = 0; i < 4; i++)
                        acc[j] += (uint32_t)(w8_scalar_operand(ar[4 * q + i], a_signed, 0) *
                                             w8_scalar_operand(row[4 * j + i], b_signed,
                                                               b_flip));
            }
            w8_scalar_store(c + r * ldc + p * W8_NR, acc, W8_NR, accumulate);
        }
    }
}

static void w8_scalar_ukernel_biased(int rows, int npanels, int64_t kq, const uint8_t *a,
                                     int64_t lda, const uint8_t *b, int64_t ps, int32_t *c,
                                     int64_t ldc, int accumulate)
{
    w8_scalar_tile(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 1, 1, 0x80);
}

static void w8_scalar_ukernel_signed(int rows, int npanels, int64_t kq, const uint8_t *a,
                                     int64_t lda, const uint8_t *b, int64_t ps, int32_t *c,
                                     int64_t ldc, int accumulate)
{
    w8_scalar_tile(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 1, 1, 0);
}

/* The u8 x s8 products of vpdpbusd / tdpbusd in plain C, with the +128 shift and its
 * compensation exactly as the VNNI and AMX ISAs do them, so the compensation logic of the
 * loop nest (W8_CORR_ROW / W8_CORR_COL and the prefix sums) is tested on every CPU.
 * biased: weights are the u8 operand (q + 128); signed: activations are (qa ^ 0x80). */
static void w8_scalar_u8s8_ukernel_biased(int rows, int npanels, int64_t kq,
                                          const uint8_t *a, int64_t lda, const uint8_t *b,
                                          int64_t ps, int32_t *c, int64_t ldc,
                                          int accumulate)
{
    w8_scalar_tile(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 1, 0, 0);
}

static void w8_scalar_u8s8_ukernel_signed(int rows, int npanels, int64_t kq,
                                          const uint8_t *a, int64_t lda, const uint8_t *b,
                                          int64_t ps, int32_t *c, int64_t ldc,
                                          int accumulate)
{
    w8_scalar_tile(rows, npanels, kq, a, lda, b, ps, c, ldc, accumulate, 0, 1, 0);
}

/* A tile's finish from its column j on: every column pointer advanced by j. */
static inline w8_tile_finish w8_finish_from_column(const w8_tile_finish *fin, int j)
{
    w8_tile_finish f = *fin;
    w8_scaling *s[2] = {&f.g, &f.u};
    for (int i = 0; i < 2; i++) {
        if (s[i]->col_corr) s[i]->col_corr += j;
        if (s[i]->b_scale) s[i]->b_scale += j;
        if (s[i]->bias) s[i]->bias += j;
    }
    if (f.up) f.up += j;
    return f;
}

/* The epilogue template's scalar instance is the reference of every other: its tails past
 * the last whole vector call these, which here are the instance itself (one lane: no tail). */
static void w8_scalar_epilogue(const int32_t *acc, int64_t ldacc, int rows, int cols,
                               const w8_tile_finish *fin, float *out, int64_t ldo);
static void w8_scalar_act_tile(float *out, int64_t ldo, int rows, int cols,
                               const w8_tile_finish *fin);

#define W8_V(name) w8_scalar_##name
#define W8_V_TARGET
#include "epilogue.h"
#undef W8_V
#undef W8_V_TARGET

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

W8_ROTATE_ABSMAX_BY(w8_scalar_rotate_absmax, w8_scalar_fwht, w8_scalar_absmax)

/* A SIMD absmax's end: the max of its vector's lanes and of the scalar tail past its last
 * whole vector (0, or 1 if the tail holds NaN/Inf). */
static inline int w8_absmax_finish(const float *lanes, int nlanes, const float *tail,
                                   int64_t ntail, float *amax)
{
    float m = 0.0f;
    if (w8_scalar_absmax(tail, ntail, &m)) return 1;
    for (int j = 0; j < nlanes; j++) m = lanes[j] > m ? lanes[j] : m;
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

/* The instruction peak of this ISA: each chain feeds its own result back into its
 * operand, so no closed form exists and nothing can be hoisted. */
static int64_t w8_scalar_peak(int64_t iters, int32_t *sink)
{
    uint32_t acc[16];
    int8_t a[16];
    for (int j = 0; j < 16; j++) {
        acc[j] = (uint32_t)j;
        a[j] = (int8_t)(*sink + j);
    }
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) {
            acc[j] += (uint32_t)(a[j] * (int8_t)(j + 1));
            a[j] = (int8_t)acc[j];
        }
    for (int j = 0; j < 16; j++) *sink += (int32_t)(acc[j] & 0xFFFF);
    return iters * 16;
}

#endif
