/* The SIMD FWHT (w8_fwht_fn of common.h), written once for any vector width of 4 floats or
 * more: an included template, like ukernel.h.  avx2.h, avx512vnni.h and neon.h select their
 * vocabulary and state the stages inside one register, then include this file (after
 * absmax.h), which defines, for the prefix:
 *
 *   <prefix>_fwht           the transform (the network of fwht.h: the same bits as
 *                           w8_scalar_fwht)
 *   <prefix>_rotate_absmax  a row's rotation with its signs from a table and its absmax
 *                           (w8_rotate_absmax_fn: the same bits as w8_scalar_rotate_absmax)
 *
 * and, inlined into them, <prefix>_fwht_from, _fwht_regs, _fwht_halves, _fwht_pass and
 * the rotation's _inner8, _outer8 and _rotate_absmax8.  At its end it undefines its traits.
 *
 * The vocabulary is the selected one (W8_V, W8_V_TARGET: vec_scalar.h), with traits of the
 * ISA's own, the first two of which name functions:
 *   W8_FW_IN_REG(v)        the stages h < lanes inside one vector
 *   W8_FW_NARROW(x, n)     the transform of n < lanes floats
 *   W8_FW_TWO_BLOCKS       1 where the registers hold two blocks of 8 vectors beside the
 *                          constants (32 zmm), so the rotation overlaps one block's outer
 *                          stages with the next one's inner stages; else 0 */

#include "fwht.h"

/* Vector i of the transform's input: x's, times the signs s's where s != NULL (the sign
 * flip of a rotation, folded into the loads; the same multiply as a separate pass, so the
 * same bits). */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(load_signed)(const float *x, const float *s, int64_t i)
{
    const W8_V(f32) v = W8_V(load_f32)(x + i);
    return s ? W8_V(mul_f32)(v, W8_V(load_f32)(s + i)) : v;
}

/* Whole transform of W8_V(lanes) * nreg contiguous floats (nreg <= 8) in registers, from
 * x (times s) into y. */
W8_V_TARGET W8_INLINE void W8_V(fwht_regs)(const float *x, const float *s, float *y,
                                             int nreg)
{
    W8_V(f32) r[8];
    for (int i = 0; i < nreg; i++)
        r[i] = W8_FW_IN_REG(W8_V(load_signed)(x, s, W8_V(lanes) * i));
    W8_FWHT_REG_STAGES(W8_V(f32), r, nreg, W8_V(add_f32), W8_V(sub_f32))
    for (int i = 0; i < nreg; i++) W8_V(store_f32)(y + W8_V(lanes) * i, r[i]);
}

/* Whole transform of 16 vectors (128 floats of ymm, 64 of NEON) with fewer stores than
 * two full passes (the transform is store-bound): the first half's inner stages are stored
 * once, and the last stage combines them, reloaded from L1, with the second half still in
 * registers.  The same butterflies in the same order as every other ISA, so the same
 * bits. */
W8_V_TARGET W8_INLINE void W8_V(fwht_halves)(const float *x, const float *s, float *y)
{
    enum { HALF = 8 * W8_V(lanes) };
    W8_V(fwht_regs)(x, s, y, 8);
    W8_V(f32) r[8];
    for (int i = 0; i < 8; i++)
        r[i] = W8_FW_IN_REG(W8_V(load_signed)(x, s, HALF + W8_V(lanes) * i));
    W8_FWHT_REG_STAGES(W8_V(f32), r, 8, W8_V(add_f32), W8_V(sub_f32))
    for (int i = 0; i < 8; i++) {
        const W8_V(f32) a = W8_V(load_f32)(y + W8_V(lanes) * i);
        W8_V(store_f32)(y + W8_V(lanes) * i, W8_V(add_f32)(a, r[i]));
        W8_V(store_f32)(y + HALF + W8_V(lanes) * i, W8_V(sub_f32)(a, r[i]));
    }
}

/* `stages` consecutive stages h, 2h, ... (h >= W8_V(lanes)) in one pass over memory: each
 * group of 2^stages vectors at stride h stays in registers for all of them. */
W8_V_TARGET W8_INLINE void W8_V(fwht_pass)(float *x, int64_t n, int64_t h, int stages)
{
    const int nreg = 1 << stages;
    for (int64_t base = 0; base < n; base += h * nreg)
        for (int64_t j = base; j < base + h; j += W8_V(lanes)) {
            W8_V(f32) r[8];
            for (int i = 0; i < nreg; i++) r[i] = W8_V(load_f32)(x + j + i * h);
            W8_FWHT_REG_STAGES(W8_V(f32), r, nreg, W8_V(add_f32), W8_V(sub_f32))
            for (int i = 0; i < nreg; i++) W8_V(store_f32)(x + j + i * h, r[i]);
        }
}

/* y = H (s x) (s NULL: y = H x), n floats, n a power of two; y may be x. */
W8_V_TARGET W8_INLINE void W8_V(fwht_from)(const float *x, const float *s, float *y,
                                             int64_t n)
{
    if (n < W8_V(lanes)) {
        for (int64_t i = 0; i < n; i++) y[i] = s ? x[i] * s[i] : x[i];
        W8_FW_NARROW(y, n);
        return;
    }
    /* Stages h < chunk in chunks of up to 128 floats and 16 vectors (16 ymm, 8 zmm or 16
     * NEON registers), then the rest three at a time.  nreg and stages are literal in each
     * call so the register arrays unroll. */
    enum { MAX_CHUNK = 16 * W8_V(lanes) < 128 ? 16 * W8_V(lanes) : 128 };
    const int64_t chunk = n < MAX_CHUNK ? n : MAX_CHUNK;
    for (int64_t i = 0; i < n; i += chunk) {
        const float *si = s ? s + i : NULL;
        switch (chunk / W8_V(lanes)) {
        case 16: W8_V(fwht_halves)(x + i, si, y + i); break;
        case 8: W8_V(fwht_regs)(x + i, si, y + i, 8); break;
        case 4: W8_V(fwht_regs)(x + i, si, y + i, 4); break;
        case 2: W8_V(fwht_regs)(x + i, si, y + i, 2); break;
        default: W8_V(fwht_regs)(x + i, si, y + i, 1); break;
        }
    }
    for (int64_t h = chunk; h < n;) {
        if (8 * h <= n) {
            W8_V(fwht_pass)(y, n, h, 3);
            h *= 8;
        } else if (4 * h <= n) {
            W8_V(fwht_pass)(y, n, h, 2);
            h *= 4;
        } else {
            W8_V(fwht_pass)(y, n, h, 1);
            h *= 2;
        }
    }
}

W8_V_TARGET static void W8_V(fwht)(float *x, int64_t n) { W8_V(fwht_from)(x, NULL, x, n); }

/* ---- The rotation's pass (w8_rotate_absmax_fn). ---- */

#if W8_FW_TWO_BLOCKS

/* The 8 vectors of a block at x (times s), each through the stages inside it. */
W8_V_TARGET W8_INLINE void W8_V(inner8)(const float *x, const float *s, W8_V(f32) *r)
{
    for (int i = 0; i < 8; i++) r[i] = W8_FW_IN_REG(W8_V(load_signed)(x, s, W8_V(lanes) * i));
}

/* The stages between a block's 8 vectors, stored to y, with their magnitudes in the running
 * maxima m0, m1 and their check for NaN and Inf (absmax.h's) in *bad. */
W8_V_TARGET W8_INLINE void W8_V(outer8)(W8_V(f32) *r, float *y, W8_V(f32) *m0, W8_V(f32) *m1,
                                        int *bad)
{
    const W8_V(f32) fmax = W8_V(set_f32)(3.4028234663852886e38f);
    W8_FWHT_REG_STAGES(W8_V(f32), r, 8, W8_V(add_f32), W8_V(sub_f32))
    for (int i = 0; i < 8; i++) {
        const W8_V(f32) a = W8_V(abs_f32)(r[i]);
        *bad |= W8_V(above_f32)(a, fmax);
        if (i % 2) *m1 = W8_V(max_f32)(*m1, a);
        else *m0 = W8_V(max_f32)(*m0, a);
        W8_V(store_f32)(y + W8_V(lanes) * i, r[i]);
    }
}

/* The rotation and absmax of n floats, whole blocks of 8 vectors, the next block's loads
 * and inner stages beside this one's outer stages: a block is one chain of dependent
 * stages, which the out-of-order window does not overlap with the next block's by itself
 * (a row of 2048 in L1: 0.85x the time of the transform then the absmax pass, and the
 * whole rotated row quantizer 0.93x; Zen 4, AVX-512).  The maximum is one of the values,
 * so it is the absmax pass's, bit for bit. */
W8_V_TARGET W8_INLINE int W8_V(rotate_absmax8)(const float *x, const float *s, float *y,
                                               int64_t n, float *amax)
{
    enum { BLOCK = 8 * W8_V(lanes) };
    W8_V(f32) m0 = W8_V(set_f32)(0.0f), m1 = m0, r[8], next[8];
    int bad = 0;
    W8_V(inner8)(x, s, r);
    for (int64_t k = 0; k + BLOCK < n; k += BLOCK) {
        W8_V(inner8)(x + k + BLOCK, s + k + BLOCK, next);
        W8_V(outer8)(r, y + k, &m0, &m1, &bad);
        for (int i = 0; i < 8; i++) r[i] = next[i];
    }
    W8_V(outer8)(r, y + n - BLOCK, &m0, &m1, &bad);
    if (bad) return 1;
    float lanes[W8_V(lanes)];
    W8_V(store_f32)(lanes, W8_V(max_f32)(m0, m1));
    return w8_absmax_finish(lanes, W8_V(lanes), NULL, 0, amax);
}
#endif

W8_V_TARGET static int W8_V(rotate_absmax)(const float *x, const float *s, float *y,
                                           int64_t K, int64_t block, float *amax)
{
    const int64_t whole = K / block * block, Kr = (K + block - 1) / block * block;
    int64_t k = 0, maxed = 0; /* the values of y whose maximum is in m */
    float m = 0.0f;
#if W8_FW_TWO_BLOCKS
    if (block == 8 * W8_V(lanes) && whole > 0) {
        if (W8_V(rotate_absmax8)(x, s, y, whole, &m)) return 1;
        k = maxed = whole;
    }
#endif
    for (; k < whole; k += block) W8_V(fwht_from)(x + k, s + k, y + k, block);
    if (k < K) { /* the last block, zero-padded */
        for (int64_t i = k; i < K; i++) y[i] = x[i] * s[i];
        memset(y + K, 0, (size_t)(Kr - K) * sizeof(float));
        W8_V(fwht_from)(y + k, NULL, y + k, block);
    }
    float rest;
    if (W8_V(absmax)(y + maxed, Kr - maxed, &rest)) return 1;
    *amax = rest > m ? rest : m;
    return 0;
}

#undef W8_FW_IN_REG
#undef W8_FW_NARROW
#undef W8_FW_TWO_BLOCKS
