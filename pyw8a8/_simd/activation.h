/* The activations of the fused layer (W8_ACT_* of common.h), written once: an included
 * template.  Each path's header states its vector operations as traits and includes this
 * file, which defines, for its prefix:
 *
 *   <prefix>_scaled     w8_scaling (common.h) of one vector of int32 sums: the path's one
 *                       statement of the epilogue's arithmetic (ukernel.h stores it)
 *   <prefix>_activate   one vector of pre-activations -> their activations
 *   <prefix>_act_tile   w8_act_tile_fn of common.h: the activation, then the gate's product
 *                       with the up projection, over whole vectors of a tile in place
 *                       (w8_scalar_act_tile, the scalar instance, over the columns past them)
 *
 * The scalar instance (scalar.h) is the reference; the others compute the same operations
 * in the same order, with no fused multiply-add (-ffp-contract=off), so every path gives the
 * same bits.  At its end this file undefines every trait and macro of its own.
 *
 * The arithmetic.  silu(x) = x s(x) and gelu_tanh(x) = x s(t), t = x (C1 + C2 x^2), with the
 * logistic s(t) = 1 / (1 + e^-t) for t >= 0 and e^t / (1 + e^t) below, so e^-|t| <= 1 never
 * overflows and the small results keep their precision; gelu(x) = x Phi(x) = x erfc(-x /
 * sqrt 2) / 2 the same way, erfc(z) = tau exp(q(tau) - z^2) for z >= 0, tau = 1 / (1 + z / 2)
 * (the Chebyshev fit of Numerical Recipes' erfcc, relative error below 1.2e-7).  Where the
 * result is ill-conditioned, far in the negative tail (gelu_tanh at x = -10: a relative error
 * d in t costs 87 d), the argument of the exponential and its reduction run in double: t,
 * q - z^2 (z^2 = x^2 / 2 exact in double) and r = y - n ln 2, n = round(y / ln 2).  The rest
 * is float: e^r by its degree-7 Taylor polynomial (|r| <= ln 2 / 2: truncation 5e-9), the
 * scaling by 2^n in two exact-or-once-rounded steps (so results reach the subnormal range
 * correctly), the logistic's sum and quotient (gelu's tau and q(tau) are double too).  The
 * exponent's argument is clamped to [-125, 0] and x to [-1e4, +inf]: beyond them every
 * result rounds to 0 or is x itself, and the limits at -inf come out as -0 instead of
 * -inf * 0.  NaN propagates (every comparison
 * is ordered so that a NaN operand passes through).
 *
 * Traits (F: float vector; D: double vector of half its lanes; I: int32 vector of its
 * lanes):
 *   W8_AF(name), W8_AF_TARGET, W8_AF_LANES, W8_AF_F, W8_AF_D, W8_AF_I
 *   W8_AF_FSET(c), W8_AF_FADD, W8_AF_FSUB, W8_AF_FMUL, W8_AF_FDIV
 *   W8_AF_FMAX(a, b)          a > b ? a : b in each lane (x86 maxps; NaN in b passes)
 *   W8_AF_FMIN(a, b)          a < b ? a : b in each lane (x86 minps)
 *   W8_AF_FSEL_NEG(c, x, y)   c < 0 ? x : y in each lane; W8_AF_ISEL_NEG(c, i, j) the same
 *                             for int32 lanes i, j
 *   W8_AF_DSET(c), W8_AF_DADD, W8_AF_DSUB, W8_AF_DMUL, W8_AF_DDIV, W8_AF_DMAX(a, b) (as FMAX)
 *   W8_AF_DNEGABS(a)          -|a| (the sign bit set)
 *   W8_AF_DLO(f), W8_AF_DHI(f)  the two halves of f in double (exact)
 *   W8_AF_DTOF(lo, hi)        both halves rounded to float (to nearest even), as one F
 *   W8_AF_DLOW32(lo, hi)      the low 32 bits of each double's bit pattern, as one I
 *   W8_AF_ISET(c), W8_AF_IMAX(a, b), W8_AF_ISRA1(i), W8_AF_ISUB(a, b) (modulo 2^32),
 *   W8_AF_ICVT(i) (to float, to nearest even), W8_AF_IPOW2(i) (2^i as float,
 *   -126 <= i <= 127)
 *   W8_AF_FLOAD(p), W8_AF_FSTORE(p, v), W8_AF_ILOAD(p) */

#define W8_AF_GELU_TANH_C1 1.5957691216057308    /* 2 sqrt(2 / pi) */
#define W8_AF_GELU_TANH_C2 0.071354816272600250  /* 2 sqrt(2 / pi) 0.044715 */
#define W8_AF_SHIFTER 6755399441055744.0 /* 1.5 * 2^52: y + it rounds y to an integer
                                             (half to even), held in its low bits */

/* The scaling of one vector of a tile's sums (tile row r, columns col on): the corrections
 * subtracted modulo 2^32 (the compensated sum fits in int32, see W8_EXACT_K), one
 * conversion, w8_apply_scales (the smaller scale first), the bias. */
W8_AF_TARGET W8_INLINE W8_AF_F W8_AF(scaled)(W8_AF_I sums, const w8_scaling *s, int r, int col)
{
    if (s->row_corr) sums = W8_AF_ISUB(sums, W8_AF_ISET(s->row_corr[r]));
    if (s->col_corr) sums = W8_AF_ISUB(sums, W8_AF_ILOAD(s->col_corr + col));
    const W8_AF_F sa = W8_AF_FSET(s->a_scale[r]), sb = W8_AF_FLOAD(s->b_scale + col);
    const W8_AF_F v =
        W8_AF_FMUL(W8_AF_FMUL(W8_AF_ICVT(sums), W8_AF_FMIN(sa, sb)), W8_AF_FMAX(sa, sb));
    return s->bias ? W8_AF_FADD(v, W8_AF_FLOAD(s->bias + col)) : v;
}

/* e^y = p * 2^n for -125 <= y <= 0 (both halves of a vector): returns p, sets n. */
W8_AF_TARGET W8_INLINE W8_AF_F W8_AF(exp_parts)(W8_AF_D ylo, W8_AF_D yhi, W8_AF_I *n)
{
    const W8_AF_D shifter = W8_AF_DSET(W8_AF_SHIFTER), log2e = W8_AF_DSET(1.4426950408889634),
                  ln2 = W8_AF_DSET(0.69314718055994531);
    const W8_AF_D tlo = W8_AF_DADD(W8_AF_DMUL(ylo, log2e), shifter),
                  thi = W8_AF_DADD(W8_AF_DMUL(yhi, log2e), shifter);
    const W8_AF_D rlo = W8_AF_DSUB(ylo, W8_AF_DMUL(W8_AF_DSUB(tlo, shifter), ln2)),
                  rhi = W8_AF_DSUB(yhi, W8_AF_DMUL(W8_AF_DSUB(thi, shifter), ln2));
    *n = W8_AF_DLOW32(tlo, thi);
    const W8_AF_F r = W8_AF_DTOF(rlo, rhi);
    W8_AF_F p = W8_AF_FSET(1.0f / 5040.0f);
    p = W8_AF_FADD(W8_AF_FMUL(p, r), W8_AF_FSET(1.0f / 720.0f));
    p = W8_AF_FADD(W8_AF_FMUL(p, r), W8_AF_FSET(1.0f / 120.0f));
    p = W8_AF_FADD(W8_AF_FMUL(p, r), W8_AF_FSET(1.0f / 24.0f));
    p = W8_AF_FADD(W8_AF_FMUL(p, r), W8_AF_FSET(1.0f / 6.0f));
    p = W8_AF_FADD(W8_AF_FMUL(p, r), W8_AF_FSET(0.5f));
    p = W8_AF_FADD(W8_AF_FMUL(p, r), W8_AF_FSET(1.0f));
    return W8_AF_FADD(W8_AF_FMUL(p, r), W8_AF_FSET(1.0f));
}

/* v * 2^n for -181 <= n <= 0, as (v * 2^(n >> 1)) * 2^(n - (n >> 1)): both factors are
 * normal floats, the first product is exact, so a subnormal result is rounded once. */
W8_AF_TARGET W8_INLINE W8_AF_F W8_AF(scale_pow2)(W8_AF_F v, W8_AF_I n)
{
    const W8_AF_I half = W8_AF_ISRA1(n);
    return W8_AF_FMUL(W8_AF_FMUL(v, W8_AF_IPOW2(half)), W8_AF_IPOW2(W8_AF_ISUB(n, half)));
}

W8_AF_TARGET W8_INLINE W8_AF_F W8_AF(activate)(W8_AF_F x, int act)
{
    if (act == W8_ACT_RELU) return W8_AF_FMAX(W8_AF_FSET(0.0f), x);
    const W8_AF_F xc = W8_AF_FMAX(W8_AF_FSET(-1e4f), x);
    const W8_AF_D lo = W8_AF_DLO(xc), hi = W8_AF_DHI(xc);
    W8_AF_D ylo, yhi;
    W8_AF_F tau = W8_AF_FSET(0.0f);
    if (act == W8_ACT_GELU) {
        /* z = |x| / sqrt 2, tau and q(tau) in double: q sums terms of either sign up to
         * 1.5, whose float roundings would cost several units of the result near x = 0. */
        const W8_AF_D one = W8_AF_DSET(1.0), half = W8_AF_DSET(0.5),
                      neg_sqrt_half = W8_AF_DSET(-0.70710678118654752);
        const W8_AF_D tlo = W8_AF_DDIV(one, W8_AF_DADD(one, W8_AF_DMUL(half, W8_AF_DMUL(
                                                         W8_AF_DNEGABS(lo), neg_sqrt_half)))),
                      thi = W8_AF_DDIV(one, W8_AF_DADD(one, W8_AF_DMUL(half, W8_AF_DMUL(
                                                         W8_AF_DNEGABS(hi), neg_sqrt_half))));
        static const double coef[10] = {0.17087277,  -0.82215223, 1.48851587, -1.13520398,
                                        0.27886807,  -0.18628806, 0.09678418, 0.37409196,
                                        1.00002368, -1.26551223};
        W8_AF_D qlo = W8_AF_DSET(coef[0]), qhi = W8_AF_DSET(coef[0]);
        for (int i = 1; i < 10; i++) {
            qlo = W8_AF_DADD(W8_AF_DMUL(qlo, tlo), W8_AF_DSET(coef[i]));
            qhi = W8_AF_DADD(W8_AF_DMUL(qhi, thi), W8_AF_DSET(coef[i]));
        }
        tau = W8_AF_DTOF(tlo, thi);
        ylo = W8_AF_DSUB(qlo, W8_AF_DMUL(W8_AF_DMUL(lo, lo), half));
        yhi = W8_AF_DSUB(qhi, W8_AF_DMUL(W8_AF_DMUL(hi, hi), half));
    } else if (act == W8_ACT_GELU_TANH) {
        const W8_AF_D c1 = W8_AF_DSET(W8_AF_GELU_TANH_C1),
                      c2 = W8_AF_DSET(W8_AF_GELU_TANH_C2);
        ylo = W8_AF_DNEGABS(
            W8_AF_DMUL(lo, W8_AF_DADD(c1, W8_AF_DMUL(c2, W8_AF_DMUL(lo, lo)))));
        yhi = W8_AF_DNEGABS(
            W8_AF_DMUL(hi, W8_AF_DADD(c1, W8_AF_DMUL(c2, W8_AF_DMUL(hi, hi)))));
    } else { /* W8_ACT_SILU */
        ylo = W8_AF_DNEGABS(lo);
        yhi = W8_AF_DNEGABS(hi);
    }
    const W8_AF_D lowest = W8_AF_DSET(-125.0);
    W8_AF_I n;
    const W8_AF_F p = W8_AF(exp_parts)(W8_AF_DMAX(lowest, ylo), W8_AF_DMAX(lowest, yhi), &n);
    /* Only a negative x takes the exponent n into its result; elsewhere the branch not
     * taken, and the terms that vanish next to 1 or 2, are scaled by 2^-64 at the least (one
     * exact step), so no subnormal number is formed (an x86 assist costs a hundred cycles)
     * unless the result itself is one. */
    const W8_AF_I n_result = W8_AF_ISEL_NEG(xc, n, W8_AF_ISET(0));
    const W8_AF_I n_small = W8_AF_IMAX(n, W8_AF_ISET(-64));
    if (act == W8_ACT_GELU) {
        /* x < 0: x erfc(z) / 2; x >= 0: x (2 - erfc(z)) / 2, with erfc(z) = tau p 2^n. */
        const W8_AF_F half_x = W8_AF_FMUL(W8_AF_FSET(0.5f), xc);
        const W8_AF_F erfc = W8_AF_FMUL(W8_AF_FMUL(tau, p), W8_AF_IPOW2(n_small));
        return W8_AF_FSEL_NEG(
            xc, W8_AF(scale_pow2)(W8_AF_FMUL(W8_AF_FMUL(half_x, tau), p), n_result),
            W8_AF_FMUL(half_x, W8_AF_FSUB(W8_AF_FSET(2.0f), erfc)));
    }
    /* x < 0: x (p / (1 + e^t)) 2^n; x >= 0: x (1 / (1 + e^-t)); e^-|t| = p 2^n. */
    const W8_AF_F den = W8_AF_FADD(W8_AF_FSET(1.0f), W8_AF_FMUL(p, W8_AF_IPOW2(n_small)));
    const W8_AF_F ratio = W8_AF_FDIV(W8_AF_FSEL_NEG(xc, p, W8_AF_FSET(1.0f)), den);
    return W8_AF(scale_pow2)(W8_AF_FMUL(xc, ratio), n_result);
}

W8_AF_TARGET static void W8_AF(act_tile)(float *out, int64_t ldo, int rows, int cols,
                                         const w8_tile_finish *fin)
{
    const int whole = cols / W8_AF_LANES * W8_AF_LANES;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < whole; j += W8_AF_LANES) {
            float *p = out + r * ldo + j;
            W8_AF_F v = W8_AF_FLOAD(p);
            if (fin->act) v = W8_AF(activate)(v, fin->act);
            if (fin->up)
                v = W8_AF_FMUL(v, W8_AF(scaled)(W8_AF_ILOAD(fin->up + r * fin->ld_up + j),
                                                &fin->u, r, j));
            W8_AF_FSTORE(p, v);
        }
    if (whole < cols) {
        const w8_tile_finish tail = w8_finish_from_column(fin, whole);
        w8_scalar_act_tile(out + whole, ldo, rows, cols - whole, &tail);
    }
}

#undef W8_AF_GELU_TANH_C1
#undef W8_AF_GELU_TANH_C2
#undef W8_AF_SHIFTER

#undef W8_AF
#undef W8_AF_TARGET
#undef W8_AF_LANES
#undef W8_AF_F
#undef W8_AF_D
#undef W8_AF_I
#undef W8_AF_FSET
#undef W8_AF_FADD
#undef W8_AF_FSUB
#undef W8_AF_FMUL
#undef W8_AF_FDIV
#undef W8_AF_FMAX
#undef W8_AF_FMIN
#undef W8_AF_FSEL_NEG
#undef W8_AF_ISEL_NEG
#undef W8_AF_IMAX
#undef W8_AF_DSET
#undef W8_AF_DADD
#undef W8_AF_DSUB
#undef W8_AF_DMUL
#undef W8_AF_DDIV
#undef W8_AF_DMAX
#undef W8_AF_DNEGABS
#undef W8_AF_DLO
#undef W8_AF_DHI
#undef W8_AF_DTOF
#undef W8_AF_DLOW32
#undef W8_AF_ISET
#undef W8_AF_ISRA1
#undef W8_AF_ISUB
#undef W8_AF_ICVT
#undef W8_AF_IPOW2
#undef W8_AF_FLOAD
#undef W8_AF_FSTORE
#undef W8_AF_ILOAD
