/* The SIMD FWHT (w8_fwht_fn of common.h), written once for any vector width of 4 floats or
 * more: an included template, like ukernel.h.  avx2.h, avx512vnni.h and neon.h select their
 * vocabulary and state the stages inside one register, then include this file, which
 * defines, for the prefix:
 *
 *   <prefix>_fwht         the transform (the network of fwht.h: the same bits as
 *                         w8_scalar_fwht)
 *   <prefix>_fwht_signed  the transform of a block times its signs (w8_fwht_signed_fn)
 *
 * and, inlined into them, <prefix>_fwht_from, _fwht_regs, _fwht_halves and _fwht_pass.
 * At its end it undefines its traits.
 *
 * The vocabulary is the selected one (W8_V, W8_V_TARGET: vec_scalar.h), with two traits of
 * the ISA's own, which name functions:
 *   W8_FW_IN_REG(v)        the stages h < lanes inside one vector
 *   W8_FW_NARROW(x, n)     the transform of n < lanes floats */

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

W8_V_TARGET static void W8_V(fwht_signed)(const float *x, const float *s, float *y,
                                            int64_t n)
{
    W8_V(fwht_from)(x, s, y, n);
}

#undef W8_FW_IN_REG
#undef W8_FW_NARROW
