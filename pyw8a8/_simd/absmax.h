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
    /* Four running maxima, so four vectors are in flight: one chain waits out the max
     * instruction's latency on every vector (4 cycles on Intel, 40% of a plain row's
     * quantization at K = 2048; Xeon, AVX-512). */
    W8_V(f32) m0 = W8_V(set_f32)(0.0f), m1 = m0, m2 = m0, m3 = m0;
    int bad = 0;
    int64_t i = 0;
    for (; i + 4 * W8_V(lanes) <= n; i += 4 * W8_V(lanes)) {
        const W8_V(f32) v0 = W8_V(abs_f32)(W8_V(load_f32)(x + i));
        const W8_V(f32) v1 = W8_V(abs_f32)(W8_V(load_f32)(x + i + W8_V(lanes)));
        const W8_V(f32) v2 = W8_V(abs_f32)(W8_V(load_f32)(x + i + 2 * W8_V(lanes)));
        const W8_V(f32) v3 = W8_V(abs_f32)(W8_V(load_f32)(x + i + 3 * W8_V(lanes)));
        /* NaN or > FLT_MAX */
        bad |= W8_V(above_f32)(v0, fmax) | W8_V(above_f32)(v1, fmax) |
               W8_V(above_f32)(v2, fmax) | W8_V(above_f32)(v3, fmax);
        m0 = W8_V(max_f32)(m0, v0), m1 = W8_V(max_f32)(m1, v1);
        m2 = W8_V(max_f32)(m2, v2), m3 = W8_V(max_f32)(m3, v3);
    }
    for (; i + W8_V(lanes) <= n; i += W8_V(lanes)) {
        const W8_V(f32) v = W8_V(abs_f32)(W8_V(load_f32)(x + i));
        bad |= W8_V(above_f32)(v, fmax);
        m0 = W8_V(max_f32)(m0, v);
    }
    if (bad) return 1;
    /* The largest magnitude is one of the inputs, whichever chain holds it. */
    const W8_V(f32) m = W8_V(max_f32)(W8_V(max_f32)(m0, m1), W8_V(max_f32)(m2, m3));
    float lanes[W8_V(lanes)];
    W8_V(store_f32)(lanes, m);
    return w8_absmax_finish(lanes, W8_V(lanes), x + i, n - i, amax);
}
