/* The largest magnitude of an activation row, written once: an included template in the
 * names of vec_scalar.h, like epilogue.h, which avx2.h, avx512vnni.h and neon.h include
 * after it (their W8_V and W8_V_TARGET selected).  It defines <prefix>_absmax, the registry's
 * w8_absmax_fn: max |x[i]| into *amax, or 1 where a value is NaN or infinite.
 *
 * The maximum is one of the inputs whatever the order of comparison, so every vocabulary's
 * result is w8_scalar_absmax's bit for bit; the check for NaN and Inf runs on every vector
 * (one mask test each) and decides after the loop. */

W8_V_TARGET static int W8_V(absmax)(const float *x, int64_t n, float *amax)
{
    const W8_V(f32) fmax = W8_V(set_f32)(3.4028234663852886e38f);
    W8_V(f32) m = W8_V(set_f32)(0.0f);
    int bad = 0;
    int64_t i = 0;
    for (; i + W8_V(lanes) <= n; i += W8_V(lanes)) {
        const W8_V(f32) v = W8_V(abs_f32)(W8_V(load_f32)(x + i));
        bad |= W8_V(above_f32)(v, fmax); /* NaN or > FLT_MAX */
        m = W8_V(max_f32)(m, v);
    }
    if (bad) return 1;
    float lanes[W8_V(lanes)];
    W8_V(store_f32)(lanes, m);
    return w8_absmax_finish(lanes, W8_V(lanes), x + i, n - i, amax);
}
