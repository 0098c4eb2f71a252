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
 * overflows and the small results keep their precision; gelu(x) = x Phi(x) = x erfc(z) / 2,
 * z = -x / sqrt 2, the same way: erfc(|z|) = R(a) e^(-a^2 / 2), a = |x|, where R(a) =
 * erfcx(a / sqrt 2) = 1 / (1 + a h(t)), t = (a - 3.5) / (a + 3.5) in [-1, 0.62] for a <= 15,
 * h a degree-10 polynomial fitted to relative error 1.1e-8 (3.6e-8 with its coefficients
 * rounded to float); h lies in [0.79, 1.06], so its terms are small beside the first and the
 * evaluation's roundings stay near one unit, and R(0) is 1 exactly.  The exponentials are
 * e^y = p 2^n, n = round(y / ln 2), p = e^r, r = y - n ln 2 (|r| <= ln 2 / 2), p by its
 * degree-7 Taylor polynomial (truncation 5e-9).  All of it is float32 with fused
 * multiply-adds (fma_f32), the same on every ISA.  Where the result is ill-conditioned, far
 * in the negative tail, y must be exact beyond a float, and is carried as a float and a
 * tail into r: silu's -|x| is exact; gelu's -a^2 / 2 is the float a * a and its rounding
 * error (one fused multiply-add); gelu_tanh's |t| (at x = -10 a relative error d in t costs
 * 87 d) is a (C1 + C2 a^2) with the rounding error of each product and sum kept, about 44
 * bits.  r = y - n ln 2 is exact for a float y (Cody and Waite: ln 2 in a 16-bit head and a
 * tail).  The scaling by 2^n takes two exact-or-once-rounded steps, so results reach the
 * subnormal range correctly.  The exponent's argument is clamped to [-125, 0] (gelu's a to
 * 15, gelu_tanh's to 12) and x to [-1e4, +inf]: beyond them every result rounds to 0 or is
 * x itself, and the limits at -inf come out as -0 instead of -inf * 0.  NaN propagates
 * (every comparison is ordered so that a NaN operand passes through).  Against float64
 * (tests/layer/test_fused_layer.py): gelu within 3.9 units in the last place, gelu_tanh
 * and silu within 3.5.
 */

#define W8_EP_GELU_TANH_C1 1.59576917f     /* 2 sqrt(2 / pi), to float */
#define W8_EP_GELU_TANH_C1_LO -4.53406805e-08f /* and the rest */
#define W8_EP_GELU_TANH_C2 0.0713548139f   /* 2 sqrt(2 / pi) 0.044715, to float */
#define W8_EP_GELU_TANH_C2_LO 2.39883247e-09f
#define W8_EP_GELU_TANH_A_MAX 12.0f        /* |t| = 142 there: e^-|t| x rounds to 0 */
#define W8_EP_SHIFTER 12582912.0f          /* 1.5 * 2^23: y + it rounds y to an integer */
#define W8_EP_LOG2E 1.44269504f             /* 1 / ln 2 */
#define W8_EP_LN2_HI 0.693145751953125f    /* ln 2 to 16 bits: n ln2_hi is exact, |n| < 256 */
#define W8_EP_LN2_LO 1.42860677e-6f        /* ln 2 - ln2_hi */
#define W8_EP_GELU_K 3.5f                  /* the centre of gelu's t */
#define W8_EP_GELU_A_MAX 15.0f             /* gelu's a beyond it: erfc below 1e-49 */

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

/* The rounding error of the float product ab = a * b, exactly: a * b = ab + it. */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(product_error)(W8_V(f32) a, W8_V(f32) b, W8_V(f32) ab)
{
    return W8_V(fma_f32)(a, b, W8_V(sub_f32)(W8_V(set_f32)(0.0f), ab));
}

/* e^r for |r| <= ln 2 / 2 (a little past it: n is rounded from an inexact y / ln 2). */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(exp_poly)(W8_V(f32) r)
{
    static const float inverse_factorial[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
                                               1.0f / 6.0f,   0.5f,          1.0f, 1.0f};
    W8_V(f32) p = W8_V(set_f32)(1.0f / 5040.0f);
    for (int c = 0; c < 7; c++) p = W8_V(fma_f32)(p, r, W8_V(set_f32)(inverse_factorial[c]));
    return p;
}

/* e^(y + tail) = p * 2^n for -125 <= y <= 0 and a tail below y's last place: returns p,
 * sets n.  y - n ln2_hi is exact: n = 0 where |y| < ln 2 / 2, and from there on both are
 * multiples of 2^-25 whose difference is below 1/2, so r has the roundings of n ln2_lo and
 * the tail only. */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(exp_parts)(W8_V(f32) y, W8_V(f32) tail, W8_V(i32) *n)
{
    const W8_V(f32) shifter = W8_V(set_f32)(W8_EP_SHIFTER);
    const W8_V(f32) nf = W8_V(sub_f32)(
        W8_V(fma_f32)(y, W8_V(set_f32)(W8_EP_LOG2E), shifter), shifter);
    W8_V(f32) r = W8_V(fma_f32)(nf, W8_V(set_f32)(-W8_EP_LN2_HI), y);
    r = W8_V(add_f32)(W8_V(fma_f32)(nf, W8_V(set_f32)(-W8_EP_LN2_LO), r), tail);
    *n = W8_V(to_i32)(nf);
    return W8_V(exp_poly)(r);
}

/* v * 2^n for -181 <= n <= 0, as (v * 2^(n >> 1)) * 2^(n - (n >> 1)): both factors are
 * normal floats, the first product is exact, so a subnormal result is rounded once. */
W8_V_TARGET W8_INLINE W8_V(f32) W8_V(scale_pow2)(W8_V(f32) v, W8_V(i32) n)
{
    const W8_V(i32) half = W8_V(sra1_i32)(n);
    return W8_V(mul_f32)(W8_V(mul_f32)(v, W8_V(pow2_i32)(half)),
                         W8_V(pow2_i32)(W8_V(sub_i32)(n, half)));
}

/* The vectors an activation pass evaluates side by side (activate_n). */
#define W8_EP_BATCH 3

/* gelu's first stage over n vectors xc (clamped): erfc(|x| / sqrt 2)'s denominator
 * 1 + a h(a) (den) and its exponential as p 2^e. */
W8_V_TARGET W8_INLINE void W8_V(gelu_parts_n)(const W8_V(f32) *xc, const int n,
                                                W8_V(f32) *gelu_den, W8_V(f32) *p,
                                                W8_V(i32) *e)
{
    const W8_V(f32) one = W8_V(set_f32)(1.0f);
    static const float h[11] = {1.05762053f,      0.248677433f,    -0.0425017551f,
                                -0.0238854773f,   0.013791888f,    0.00330572878f,
                                -0.00434121955f,  -0.000529218407f, 0.00121357664f,
                                0.000232905732f,  -9.71004702e-05f};
    const W8_V(f32) k = W8_V(set_f32)(W8_EP_GELU_K), minus_half = W8_V(set_f32)(-0.5f);
    W8_V(f32) a[W8_EP_BATCH], t[W8_EP_BATCH], q[W8_EP_BATCH];
    for (int i = 0; i < n; i++) {
        a[i] = W8_V(min_f32)(W8_V(abs_f32)(xc[i]), W8_V(set_f32)(W8_EP_GELU_A_MAX));
        t[i] = W8_V(div_f32)(W8_V(sub_f32)(a[i], k), W8_V(add_f32)(a[i], k));
        q[i] = W8_V(set_f32)(h[10]);
    }
    for (int c = 9; c >= 0; c--)
        for (int i = 0; i < n; i++) q[i] = W8_V(fma_f32)(q[i], t[i], W8_V(set_f32)(h[c]));
    for (int i = 0; i < n; i++) {
        /* R(a) = 1 / (1 + a h); -a^2 / 2 as the float -a * a / 2 and the rest. */
        gelu_den[i] = W8_V(fma_f32)(a[i], q[i], one);
        const W8_V(f32) square = W8_V(mul_f32)(a[i], a[i]);
        p[i] = W8_V(exp_parts)(
            W8_V(mul_f32)(minus_half, square),
            W8_V(mul_f32)(minus_half, W8_V(product_error)(a[i], a[i], square)), &e[i]);
    }
}

/* gelu_tanh's first stage over n vectors xc (clamped): e^-|t| as p 2^e. */
W8_V_TARGET W8_INLINE void W8_V(gelu_tanh_parts_n)(const W8_V(f32) *xc, const int n,
                                                     W8_V(f32) *p, W8_V(i32) *e)
{
    const W8_V(f32) zero = W8_V(set_f32)(0.0f);
    /* |t| = a (C1 + C2 a^2), a = |x|: a^2 = square + its rounding error (exact), C2 a^2
     * = u + u_rest (the error of the product and the terms of the constants' and the
     * square's rests), C1 + u = w + w_rest (Knuth's two-sum: exact), then a w. */
    const W8_V(f32) c1 = W8_V(set_f32)(W8_EP_GELU_TANH_C1),
                  c2 = W8_V(set_f32)(W8_EP_GELU_TANH_C2);
    for (int i = 0; i < n; i++) {
        const W8_V(f32) a = W8_V(min_f32)(W8_V(abs_f32)(xc[i]),
                                          W8_V(set_f32)(W8_EP_GELU_TANH_A_MAX));
        const W8_V(f32) square = W8_V(mul_f32)(a, a);
        const W8_V(f32) u = W8_V(mul_f32)(c2, square);
        const W8_V(f32) u_rest = W8_V(fma_f32)(
            c2, W8_V(product_error)(a, a, square),
            W8_V(fma_f32)(W8_V(set_f32)(W8_EP_GELU_TANH_C2_LO), square,
                          W8_V(product_error)(c2, square, u)));
        const W8_V(f32) w = W8_V(add_f32)(c1, u);
        const W8_V(f32) u_part = W8_V(sub_f32)(w, c1);
        const W8_V(f32) w_rest = W8_V(add_f32)(
            W8_V(add_f32)(W8_V(sub_f32)(c1, W8_V(sub_f32)(w, u_part)),
                          W8_V(sub_f32)(u, u_part)),
            W8_V(add_f32)(W8_V(set_f32)(W8_EP_GELU_TANH_C1_LO), u_rest));
        const W8_V(f32) t = W8_V(mul_f32)(a, w);
        const W8_V(f32) t_rest = W8_V(fma_f32)(a, w_rest, W8_V(product_error)(a, w, t));
        p[i] = W8_V(exp_parts)(
            W8_V(max_f32)(W8_V(sub_f32)(zero, t), W8_V(set_f32)(-125.0f)),
            W8_V(sub_f32)(zero, t_rest), &e[i]);
    }
}

/* Activations of n <= W8_EP_BATCH vectors, stage by stage over all of them: each vector's
 * evaluation is one chain of dependent operations (gelu's: two divisions and some twenty
 * multiply-adds), so one vector at a time runs at the chain's latency; n chains side by
 * side run at the pipes' throughput, the same operations on each lane, so the same bits.
 * Constant n (as act_tile passes) unrolls.  Three: gelu over whole rows (the unfused pass)
 * ran 1.1x as fast as with two (AVX-512, Zen 4). */
W8_V_TARGET W8_INLINE void W8_V(activate_n)(W8_V(f32) *v, const int n, int act)
{
    if (act == W8_ACT_RELU) {
        for (int i = 0; i < n; i++) v[i] = W8_V(max_f32)(W8_V(set_f32)(0.0f), v[i]);
        return;
    }
    const W8_V(f32) zero = W8_V(set_f32)(0.0f), one = W8_V(set_f32)(1.0f);
    W8_V(f32) xc[W8_EP_BATCH], gelu_den[W8_EP_BATCH], p[W8_EP_BATCH];
    W8_V(i32) e[W8_EP_BATCH];
    for (int i = 0; i < n; i++) {
        xc[i] = W8_V(max_f32)(W8_V(set_f32)(-1e4f), v[i]);
        gelu_den[i] = one; /* 1 / R(a); unused by the others */
    }
    if (act == W8_ACT_GELU) {
        W8_V(gelu_parts_n)(xc, n, gelu_den, p, e);
    } else if (act == W8_ACT_GELU_TANH) {
        W8_V(gelu_tanh_parts_n)(xc, n, p, e);
    } else { /* W8_ACT_SILU */
        /* -|x| clamped, a NaN to -125 too (max_f32 passes its second operand), so n is
         * never converted from a NaN. */
        for (int i = 0; i < n; i++)
            p[i] = W8_V(exp_parts)(
                W8_V(max_f32)(W8_V(sub_f32)(zero, W8_V(abs_f32)(xc[i])), W8_V(set_f32)(-125.0f)),
                zero, &e[i]);
    }
    for (int i = 0; i < n; i++) {
        /* Only a negative x takes the exponent e into its result; elsewhere the branch not
         * taken, and the terms that vanish next to 1 or 2, are scaled by 2^-64 at the least
         * (one exact step), so no subnormal number is formed (an x86 assist costs a hundred
         * cycles) unless the result itself is one. */
        const W8_V(i32) e_result = W8_V(select_neg_i32)(xc[i], e[i], W8_V(set_i32)(0));
        const W8_V(f32) small = W8_V(pow2_i32)(W8_V(max_i32)(e[i], W8_V(set_i32)(-64)));
        if (act == W8_ACT_GELU) {
            /* x < 0: x erfc(z) / 2; x >= 0: x (2 - erfc(z)) / 2, erfc(z) = (p / (1 + a h))
             * 2^e, the quotient rounded once. */
            const W8_V(f32) half_x = W8_V(mul_f32)(W8_V(set_f32)(0.5f), xc[i]);
            const W8_V(f32) erfc_part = W8_V(div_f32)(p[i], gelu_den[i]);
            const W8_V(f32) erfc = W8_V(mul_f32)(erfc_part, small);
            v[i] = W8_V(select_neg_f32)(
                xc[i], W8_V(scale_pow2)(W8_V(mul_f32)(half_x, erfc_part), e_result),
                W8_V(mul_f32)(half_x, W8_V(sub_f32)(W8_V(set_f32)(2.0f), erfc)));
        } else {
            /* x < 0: x (p / (1 + e^t)) 2^e; x >= 0: x (1 / (1 + e^-t)); e^-|t| = p 2^e. */
            const W8_V(f32) den = W8_V(add_f32)(one, W8_V(mul_f32)(p[i], small));
            const W8_V(f32) logistic =
                W8_V(div_f32)(W8_V(select_neg_f32)(xc[i], p[i], one), den);
            v[i] = W8_V(scale_pow2)(W8_V(mul_f32)(xc[i], logistic), e_result);
        }
    }
}

W8_V_TARGET W8_INLINE W8_V(f32) W8_V(activate)(W8_V(f32) x, int act)
{
    W8_V(activate_n)(&x, 1, act);
    return x;
}

/* The n vectors of a tile from row *r, column *j on, in row order (a group may run into
 * the next row; the columns of a row's whole vectors end at `whole`), which it advances
 * past them: the activation, then the gate's product with the up projection. */
W8_V_TARGET W8_INLINE void W8_V(act_vectors)(float *out, int64_t ldo, int whole, int *r,
                                             int *j, const int n, const w8_tile_finish *fin)
{
    W8_V(f32) v[W8_EP_BATCH];
    int row[W8_EP_BATCH], col[W8_EP_BATCH];
    for (int i = 0; i < n; i++) {
        row[i] = *r;
        col[i] = *j;
        v[i] = W8_V(load_f32)(out + row[i] * ldo + col[i]);
        *j += W8_V(lanes);
        if (*j == whole) {
            *j = 0;
            ++*r;
        }
    }
    if (fin->act) W8_V(activate_n)(v, n, fin->act);
    for (int i = 0; i < n; i++) {
        if (fin->up)
            v[i] = W8_V(mul_f32)(
                v[i], W8_V(scaled)(W8_V(load_i32)(fin->up + row[i] * fin->ld_up + col[i]),
                                   &fin->u, row[i], col[i]));
        W8_V(store_f32)(out + row[i] * ldo + col[i], v[i]);
    }
}

/* A tile's whole vectors in groups of three, and the last four, two or one as pairs or
 * alone (a tile row holds two or four vectors). */
W8_V_TARGET static void W8_V(act_tile)(float *out, int64_t ldo, int rows, int cols,
                                         const w8_tile_finish *fin)
{
    const int whole = cols / W8_V(lanes) * W8_V(lanes);
    int left = whole ? rows * (whole / W8_V(lanes)) : 0, r = 0, j = 0;
    for (; left >= 5 || left == 3; left -= 3) W8_V(act_vectors)(out, ldo, whole, &r, &j, 3, fin);
    for (; left >= 2; left -= 2) W8_V(act_vectors)(out, ldo, whole, &r, &j, 2, fin);
    if (left) W8_V(act_vectors)(out, ldo, whole, &r, &j, 1, fin);
    if (whole < cols) {
        const w8_tile_finish tail = w8_finish_from_column(fin, whole);
        w8_scalar_act_tile(out + whole, ldo, rows, cols - whole, &tail);
    }
}

#undef W8_EP_GELU_TANH_C1
#undef W8_EP_GELU_TANH_C1_LO
#undef W8_EP_GELU_TANH_C2
#undef W8_EP_GELU_TANH_C2_LO
#undef W8_EP_GELU_TANH_A_MAX
#undef W8_EP_SHIFTER
#undef W8_EP_LOG2E
#undef W8_EP_LN2_HI
#undef W8_EP_LN2_LO
#undef W8_EP_GELU_K
#undef W8_EP_GELU_A_MAX
#undef W8_EP_BATCH
