/* The float epilogue of a vector vocabulary, written once: an included template in the
 * names of vec_scalar.h.  An instruction-set header selects its vocabulary (W8_V, W8_V_TARGET)
 * and includes this file, which defines, for the vocabulary's prefix:
 *
 *   <prefix>_scaled     w8_scaling (common.h) of one vector of int32 sums: the one statement
 *                       of the product's arithmetic, which the fused kernels (ukernel.h)
 *                       store too
 *   <prefix>_epilogue   w8_epilogue_fn of common.h: the scaling over a tile's whole vectors,
 *                       w8_scalar_epilogue (the reference) over the columns past them
 *   <prefix>_activate_n n vectors of pre-activations -> their activations (W8_ACT_* of
 *                       common.h), stage by stage over the n; <prefix>_activate one vector
 *   <prefix>_act_tile   w8_act_tile_fn of common.h: the activation, then the gate's product
 *                       with the up projection, over whole vectors of a tile in place
 *                       (w8_scalar_act_tile over the columns past them)
 *
 * The scalar instance (scalar.h) is the reference; the others compute the same operations
 * in the same order, with no fused multiply-add (-ffp-contract=off), so every ISA gives the
 * same bits.  At its end this file undefines its own constants.
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
 */

#define W8_EP_GELU_TANH_C1 1.5957691216057308    /* 2 sqrt(2 / pi) */
#define W8_EP_GELU_TANH_C2 0.071354816272600250  /* 2 sqrt(2 / pi) 0.044715 */
#define W8_EP_SHIFTER 6755399441055744.0 /* 1.5 * 2^52: y + it rounds y to an integer
                                             (half to even), held in its low bits */

/* The scaling of one vector of a tile's sums (tile row r, columns col on): the corrections
 * subtracted modulo 2^32 (the compensated sum fits in int32, see W8_EXACT_K), one
 * conversion, w8_apply_scales (the smaller scale first), the bias. */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(scaled)(W8_V(i32) sums, const w8_scaling *s, int r, int col)
{
    if (s->row_corr) sums = W8_V(sub_i32)(sums, W8_V(set_i32)(s->row_corr[r]));
    if (s->col_corr) sums = W8_V(sub_i32)(sums, W8_V(load_i32)(s->col_corr + col));
    const W8_V(f32) sa = W8_V(set_f32)(s->a_scale[r]), sb = W8_V(load_f32)(s->b_scale + col);
    const W8_V(f32) v = W8_V(mul_f32)(
        W8_V(mul_f32)(W8_V(cvt_i32)(sums), W8_V(min_f32)(sa, sb)), W8_V(max_f32)(sa, sb));
    return s->bias ? W8_V(add_f32)(v, W8_V(load_f32)(s->bias + col)) : v;
}

/* The per-tile epilogue (edge tiles, and ISAs without fused kernels) with the fused
 * kernels' own scaling, so both give the same bits by construction. */
W8_V_TARGET static void W8_V(epilogue)(const int32_t *acc, int64_t ldacc, int rows, int cols,
                                       const w8_tile_finish *fin, float *out, int64_t ldo)
{
    const int whole = cols / W8_V(lanes) * W8_V(lanes);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < whole; j += W8_V(lanes))
            W8_V(store_f32)(out + r * ldo + j,
                            W8_V(scaled)(W8_V(load_i32)(acc + r * ldacc + j), &fin->g, r, j));
    if (whole < cols) {
        const w8_tile_finish tail = w8_finish_from_column(fin, whole);
        w8_scalar_epilogue(acc + whole, ldacc, rows, cols - whole, &tail, out + whole, ldo);
    }
}

/* e^y = p * 2^n for -125 <= y <= 0 (both halves of a vector): returns p, sets n. */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(exp_parts)(W8_V(f64) ylo, W8_V(f64) yhi, W8_V(i32) *n)
{
    const W8_V(f64) shifter = W8_V(set_f64)(W8_EP_SHIFTER),
                  log2e = W8_V(set_f64)(1.4426950408889634),
                  ln2 = W8_V(set_f64)(0.69314718055994531);
    const W8_V(f64) tlo = W8_V(add_f64)(W8_V(mul_f64)(ylo, log2e), shifter),
                  thi = W8_V(add_f64)(W8_V(mul_f64)(yhi, log2e), shifter);
    const W8_V(f64) rlo = W8_V(sub_f64)(ylo, W8_V(mul_f64)(W8_V(sub_f64)(tlo, shifter), ln2)),
                  rhi = W8_V(sub_f64)(yhi, W8_V(mul_f64)(W8_V(sub_f64)(thi, shifter), ln2));
    *n = W8_V(low32_f64)(tlo, thi);
    const W8_V(f32) r = W8_V(narrow_f64)(rlo, rhi);
    W8_V(f32) p = W8_V(set_f32)(1.0f / 5040.0f);
    p = W8_V(add_f32)(W8_V(mul_f32)(p, r), W8_V(set_f32)(1.0f / 720.0f));
    p = W8_V(add_f32)(W8_V(mul_f32)(p, r), W8_V(set_f32)(1.0f / 120.0f));
    p = W8_V(add_f32)(W8_V(mul_f32)(p, r), W8_V(set_f32)(1.0f / 24.0f));
    p = W8_V(add_f32)(W8_V(mul_f32)(p, r), W8_V(set_f32)(1.0f / 6.0f));
    p = W8_V(add_f32)(W8_V(mul_f32)(p, r), W8_V(set_f32)(0.5f));
    p = W8_V(add_f32)(W8_V(mul_f32)(p, r), W8_V(set_f32)(1.0f));
    return W8_V(add_f32)(W8_V(mul_f32)(p, r), W8_V(set_f32)(1.0f));
}

/* v * 2^n for -181 <= n <= 0, as (v * 2^(n >> 1)) * 2^(n - (n >> 1)): both factors are
 * normal floats, the first product is exact, so a subnormal result is rounded once. */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(scale_pow2)(W8_V(f32) v, W8_V(i32) n)
{
    const W8_V(i32) half = W8_V(sra1_i32)(n);
    return W8_V(mul_f32)(W8_V(mul_f32)(v, W8_V(pow2_i32)(half)),
                         W8_V(pow2_i32)(W8_V(sub_i32)(n, half)));
}

/* Activations of n <= W8_EP_BATCH vectors, stage by stage over all of them: each vector's
 * evaluation is one chain of dependent operations (gelu's: a division, two nine-step
 * polynomials and the exponential, some 150 cycles on Zen 3), so one vector at a time ran
 * at the chain's latency; n chains side by side run at the pipes' throughput, the same
 * operations on each lane, so the same bits.  Constant n (as act_tile passes) unrolls.
 * Two, not more: gelu's pass alone on Zen 3 (one thread, against torch's gelu in turns)
 * took 3.0-3.7x torch's time one vector at a time, 2.1-2.4x two, 2.7-2.9x three or four
 * (their doubles no longer fit the 16 registers). */
#define W8_EP_BATCH 2
W8_V_TARGET W8_INLINE void W8_V(activate_n)(W8_V(f32) *v, const int n, int act)
{
    if (act == W8_ACT_RELU) {
        for (int i = 0; i < n; i++) v[i] = W8_V(max_f32)(W8_V(set_f32)(0.0f), v[i]);
        return;
    }
    W8_V(f32) xc[W8_EP_BATCH], tau[W8_EP_BATCH];
    W8_V(f64) lo[W8_EP_BATCH], hi[W8_EP_BATCH], ylo[W8_EP_BATCH], yhi[W8_EP_BATCH];
    for (int i = 0; i < n; i++) {
        xc[i] = W8_V(max_f32)(W8_V(set_f32)(-1e4f), v[i]);
        lo[i] = W8_V(lo_f64)(xc[i]);
        hi[i] = W8_V(hi_f64)(xc[i]);
        tau[i] = W8_V(set_f32)(0.0f);
    }
    if (act == W8_ACT_GELU) {
        /* z = |x| / sqrt 2, tau and q(tau) in double: q sums terms of either sign up to
         * 1.5, whose float roundings would cost several units of the result near x = 0. */
        const W8_V(f64) one = W8_V(set_f64)(1.0), half = W8_V(set_f64)(0.5),
                      neg_sqrt_half = W8_V(set_f64)(-0.70710678118654752);
        static const double coef[10] = {0.17087277,  -0.82215223, 1.48851587, -1.13520398,
                                        0.27886807,  -0.18628806, 0.09678418, 0.37409196,
                                        1.00002368, -1.26551223};
        W8_V(f64) tlo[W8_EP_BATCH], thi[W8_EP_BATCH], qlo[W8_EP_BATCH], qhi[W8_EP_BATCH];
        for (int i = 0; i < n; i++) {
            const W8_V(f64) zlo = W8_V(mul_f64)(W8_V(negabs_f64)(lo[i]), neg_sqrt_half),
                          zhi = W8_V(mul_f64)(W8_V(negabs_f64)(hi[i]), neg_sqrt_half);
            tlo[i] = W8_V(div_f64)(one, W8_V(add_f64)(one, W8_V(mul_f64)(half, zlo)));
            thi[i] = W8_V(div_f64)(one, W8_V(add_f64)(one, W8_V(mul_f64)(half, zhi)));
            qlo[i] = qhi[i] = W8_V(set_f64)(coef[0]);
        }
        for (int c = 1; c < 10; c++)
            for (int i = 0; i < n; i++) {
                qlo[i] = W8_V(add_f64)(W8_V(mul_f64)(qlo[i], tlo[i]), W8_V(set_f64)(coef[c]));
                qhi[i] = W8_V(add_f64)(W8_V(mul_f64)(qhi[i], thi[i]), W8_V(set_f64)(coef[c]));
            }
        for (int i = 0; i < n; i++) {
            tau[i] = W8_V(narrow_f64)(tlo[i], thi[i]);
            ylo[i] = W8_V(sub_f64)(qlo[i], W8_V(mul_f64)(W8_V(mul_f64)(lo[i], lo[i]), half));
            yhi[i] = W8_V(sub_f64)(qhi[i], W8_V(mul_f64)(W8_V(mul_f64)(hi[i], hi[i]), half));
        }
    } else if (act == W8_ACT_GELU_TANH) {
        const W8_V(f64) c1 = W8_V(set_f64)(W8_EP_GELU_TANH_C1),
                      c2 = W8_V(set_f64)(W8_EP_GELU_TANH_C2);
        for (int i = 0; i < n; i++) {
            ylo[i] = W8_V(negabs_f64)(W8_V(mul_f64)(
                lo[i], W8_V(add_f64)(c1, W8_V(mul_f64)(c2, W8_V(mul_f64)(lo[i], lo[i])))));
            yhi[i] = W8_V(negabs_f64)(W8_V(mul_f64)(
                hi[i], W8_V(add_f64)(c1, W8_V(mul_f64)(c2, W8_V(mul_f64)(hi[i], hi[i])))));
        }
    } else { /* W8_ACT_SILU */
        for (int i = 0; i < n; i++) {
            ylo[i] = W8_V(negabs_f64)(lo[i]);
            yhi[i] = W8_V(negabs_f64)(hi[i]);
        }
    }
    const W8_V(f64) lowest = W8_V(set_f64)(-125.0);
    for (int i = 0; i < n; i++) {
        W8_V(i32) e;
        const W8_V(f32) p = W8_V(exp_parts)(W8_V(max_f64)(lowest, ylo[i]),
                                            W8_V(max_f64)(lowest, yhi[i]), &e);
        /* Only a negative x takes the exponent e into its result; elsewhere the branch not
         * taken, and the terms that vanish next to 1 or 2, are scaled by 2^-64 at the least
         * (one exact step), so no subnormal number is formed (an x86 assist costs a hundred
         * cycles) unless the result itself is one. */
        const W8_V(i32) e_result = W8_V(select_neg_i32)(xc[i], e, W8_V(set_i32)(0));
        const W8_V(i32) e_small = W8_V(max_i32)(e, W8_V(set_i32)(-64));
        if (act == W8_ACT_GELU) {
            /* x < 0: x erfc(z) / 2; x >= 0: x (2 - erfc(z)) / 2, erfc(z) = tau p 2^e. */
            const W8_V(f32) half_x = W8_V(mul_f32)(W8_V(set_f32)(0.5f), xc[i]);
            const W8_V(f32) erfc =
                W8_V(mul_f32)(W8_V(mul_f32)(tau[i], p), W8_V(pow2_i32)(e_small));
            v[i] = W8_V(select_neg_f32)(
                xc[i], W8_V(scale_pow2)(W8_V(mul_f32)(W8_V(mul_f32)(half_x, tau[i]), p), e_result),
                W8_V(mul_f32)(half_x, W8_V(sub_f32)(W8_V(set_f32)(2.0f), erfc)));
        } else {
            /* x < 0: x (p / (1 + e^t)) 2^e; x >= 0: x (1 / (1 + e^-t)); e^-|t| = p 2^e. */
            const W8_V(f32) den =
                W8_V(add_f32)(W8_V(set_f32)(1.0f), W8_V(mul_f32)(p, W8_V(pow2_i32)(e_small)));
            const W8_V(f32) ratio =
                W8_V(div_f32)(W8_V(select_neg_f32)(xc[i], p, W8_V(set_f32)(1.0f)), den);
            v[i] = W8_V(scale_pow2)(W8_V(mul_f32)(xc[i], ratio), e_result);
        }
    }
}

W8_V_TARGET W8_INLINE W8_V(f32) W8_V(activate)(W8_V(f32) x, int act)
{
    W8_V(activate_n)(&x, 1, act);
    return x;
}

/* One tile row's vectors from column j on, n of them: the activation, then the gate's
 * product with the up projection. */
W8_V_TARGET W8_INLINE void W8_V(act_vectors)(float *p, const int n, int r, int j,
                                             const w8_tile_finish *fin)
{
    W8_V(f32) v[W8_EP_BATCH];
    for (int i = 0; i < n; i++) v[i] = W8_V(load_f32)(p + i * W8_V(lanes));
    if (fin->act) W8_V(activate_n)(v, n, fin->act);
    for (int i = 0; i < n; i++) {
        const int col = j + i * W8_V(lanes);
        if (fin->up)
            v[i] = W8_V(mul_f32)(v[i], W8_V(scaled)(W8_V(load_i32)(fin->up + r * fin->ld_up + col),
                                                    &fin->u, r, col));
        W8_V(store_f32)(p + i * W8_V(lanes), v[i]);
    }
}

W8_V_TARGET static void W8_V(act_tile)(float *out, int64_t ldo, int rows, int cols,
                                         const w8_tile_finish *fin)
{
    const int batch = W8_EP_BATCH * W8_V(lanes);
    const int whole = cols / W8_V(lanes) * W8_V(lanes);
    for (int r = 0; r < rows; r++) {
        int j = 0;
        for (; j + batch <= whole; j += batch)
            W8_V(act_vectors)(out + r * ldo + j, W8_EP_BATCH, r, j, fin);
        for (; j < whole; j += W8_V(lanes)) W8_V(act_vectors)(out + r * ldo + j, 1, r, j, fin);
    }
    if (whole < cols) {
        const w8_tile_finish tail = w8_finish_from_column(fin, whole);
        w8_scalar_act_tile(out + whole, ldo, rows, cols - whole, &tail);
    }
}

#undef W8_EP_GELU_TANH_C1
#undef W8_EP_GELU_TANH_C2
#undef W8_EP_SHIFTER
#undef W8_EP_BATCH
