/* The x86 SIMD FWHT (w8_fwht_fn of common.h), written once for any vector width: an
 * included template, like ukernel.h.  avx2.h and avx512vnni.h state the vector operations
 * and the stages inside one register, then include this file, which defines, for the
 * prefix:
 *
 *   <prefix>_fwht         the transform (the network of fwht.h: the same bits as
 *                         w8_scalar_fwht)
 *   <prefix>_fwht_signed  the transform of a block times its signs (w8_fwht_signed_fn)
 *
 * and, inlined into them, <prefix>_fwht_from, _fwht_regs, _fwht_halves and _fwht_pass.
 * At its end it undefines its traits.
 *
 * Traits (macros the including header defines):
 *   W8_FW(name)            the path's function name for `name` (e.g. w8_avx2_##name)
 *   W8_FW_TARGET           its target attribute
 *   W8_FW_VEC, W8_FW_LANES  the float vector type and its lanes (a power of two, >= 8)
 *   W8_FW_LOAD(p), W8_FW_STORE(p, v), W8_FW_ADD(x, y), W8_FW_SUB(x, y), W8_FW_MUL(x, y)
 *                          unaligned floats
 *   W8_FW_IN_REG(v)        the stages h < W8_FW_LANES inside one vector
 *   W8_FW_NARROW(x, n)     the transform of n < W8_FW_LANES floats */

#include "fwht.h"

/* Vector i of the transform's input: x's, times the signs s's where s != NULL (the sign
 * flip of a rotation, folded into the loads; the same multiply as a separate pass, so the
 * same bits). */
W8_FW_TARGET W8_INLINE W8_FW_VEC W8_FW(load_signed)(const float *x, const float *s, int64_t i)
{
    const W8_FW_VEC v = W8_FW_LOAD(x + i);
    return s ? W8_FW_MUL(v, W8_FW_LOAD(s + i)) : v;
}

/* Whole transform of W8_FW_LANES * nreg contiguous floats (nreg <= 8) in registers, from
 * x (times s) into y. */
W8_FW_TARGET W8_INLINE void W8_FW(fwht_regs)(const float *x, const float *s, float *y,
                                             int nreg)
{
    W8_FW_VEC r[8];
    for (int i = 0; i < nreg; i++)
        r[i] = W8_FW_IN_REG(W8_FW(load_signed)(x, s, W8_FW_LANES * i));
    W8_FWHT_REG_STAGES(W8_FW_VEC, r, nreg, W8_FW_ADD, W8_FW_SUB)
    for (int i = 0; i < nreg; i++) W8_FW_STORE(y + W8_FW_LANES * i, r[i]);
}

/* Whole transform of 16 vectors (a 128-block of ymm) with fewer stores than two full
 * passes (the transform is store-bound): the first half's inner stages are stored once,
 * and the last stage combines them, reloaded from L1, with the second half still in
 * registers.  The same butterflies in the same order as every other path, so the same
 * bits. */
W8_FW_TARGET W8_INLINE void W8_FW(fwht_halves)(const float *x, const float *s, float *y)
{
    enum { HALF = 8 * W8_FW_LANES };
    W8_FW(fwht_regs)(x, s, y, 8);
    W8_FW_VEC r[8];
    for (int i = 0; i < 8; i++)
        r[i] = W8_FW_IN_REG(W8_FW(load_signed)(x, s, HALF + W8_FW_LANES * i));
    W8_FWHT_REG_STAGES(W8_FW_VEC, r, 8, W8_FW_ADD, W8_FW_SUB)
    for (int i = 0; i < 8; i++) {
        const W8_FW_VEC a = W8_FW_LOAD(y + W8_FW_LANES * i);
        W8_FW_STORE(y + W8_FW_LANES * i, W8_FW_ADD(a, r[i]));
        W8_FW_STORE(y + HALF + W8_FW_LANES * i, W8_FW_SUB(a, r[i]));
    }
}

/* `stages` consecutive stages h, 2h, ... (h >= W8_FW_LANES) in one pass over memory: each
 * group of 2^stages vectors at stride h stays in registers for all of them. */
W8_FW_TARGET W8_INLINE void W8_FW(fwht_pass)(float *x, int64_t n, int64_t h, int stages)
{
    const int nreg = 1 << stages;
    for (int64_t base = 0; base < n; base += h * nreg)
        for (int64_t j = base; j < base + h; j += W8_FW_LANES) {
            W8_FW_VEC r[8];
            for (int i = 0; i < nreg; i++) r[i] = W8_FW_LOAD(x + j + i * h);
            W8_FWHT_REG_STAGES(W8_FW_VEC, r, nreg, W8_FW_ADD, W8_FW_SUB)
            for (int i = 0; i < nreg; i++) W8_FW_STORE(x + j + i * h, r[i]);
        }
}

/* y = H (s x) (s NULL: y = H x), n floats, n a power of two; y may be x. */
W8_FW_TARGET W8_INLINE void W8_FW(fwht_from)(const float *x, const float *s, float *y,
                                             int64_t n)
{
    if (n < W8_FW_LANES) {
        for (int64_t i = 0; i < n; i++) y[i] = s ? x[i] * s[i] : x[i];
        W8_FW_NARROW(y, n);
        return;
    }
    /* Stages h < 128 in chunks of up to 128 floats (16 ymm or 8 zmm), then the rest three
     * at a time.  nreg and stages are literal in each call so the register arrays
     * unroll. */
    const int64_t chunk = n < 128 ? n : 128;
    for (int64_t i = 0; i < n; i += chunk) {
        const float *si = s ? s + i : NULL;
        switch (chunk / W8_FW_LANES) {
        case 16: W8_FW(fwht_halves)(x + i, si, y + i); break;
        case 8: W8_FW(fwht_regs)(x + i, si, y + i, 8); break;
        case 4: W8_FW(fwht_regs)(x + i, si, y + i, 4); break;
        case 2: W8_FW(fwht_regs)(x + i, si, y + i, 2); break;
        default: W8_FW(fwht_regs)(x + i, si, y + i, 1); break;
        }
    }
    for (int64_t h = chunk; h < n;) {
        if (8 * h <= n) {
            W8_FW(fwht_pass)(y, n, h, 3);
            h *= 8;
        } else if (4 * h <= n) {
            W8_FW(fwht_pass)(y, n, h, 2);
            h *= 4;
        } else {
            W8_FW(fwht_pass)(y, n, h, 1);
            h *= 2;
        }
    }
}

W8_FW_TARGET static void W8_FW(fwht)(float *x, int64_t n) { W8_FW(fwht_from)(x, NULL, x, n); }

W8_FW_TARGET static void W8_FW(fwht_signed)(const float *x, const float *s, float *y,
                                            int64_t n)
{
    W8_FW(fwht_from)(x, s, y, n);
}

#undef W8_FW
#undef W8_FW_TARGET
#undef W8_FW_VEC
#undef W8_FW_LANES
#undef W8_FW_LOAD
#undef W8_FW_STORE
#undef W8_FW_ADD
#undef W8_FW_SUB
#undef W8_FW_MUL
#undef W8_FW_IN_REG
#undef W8_FW_NARROW
