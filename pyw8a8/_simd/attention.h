/* One query row of int8 attention (pyw8a8.attention): from the exact integer sums of its
 * scores to its probabilities as int8 terms, in one pass over the row's keys.  Plain C, the
 * same arithmetic on every ISA (the row is float work between two exact products). */
#ifndef PYW8A8_SIMD_ATTENTION_H
#define PYW8A8_SIMD_ATTENTION_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The row's loops vectorize only where the compiler may evaluate float comparisons and
 * products that the source evaluates under a condition: without -ftrapping-math, whose
 * floating-point exception flags nothing here reads.  As fast as numpy's own float passes
 * (a row took 5x as long scalar). */
#if defined(__GNUC__) && !defined(__clang__)
#define W8_ROW_MATH __attribute__((optimize("no-trapping-math")))
#else
#define W8_ROW_MATH
#endif

/* The row in the widest vectors the CPU has, picked at load time (the arithmetic is the
 * same in every width: no fused multiply-add, -ffp-contract=off, and the reductions' lanes
 * fixed by W8_ROW_LANES, so every CPU gets the same bits).  tests/c sets it to one target
 * per build, to compare the widths' bits. */
#ifndef W8_ROW_CLONES
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define W8_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define W8_ROW_CLONES
#endif
#endif

/* Lanes of the row's reductions (max, sum): independent accumulators, which vectorize. */
#define W8_ROW_LANES 8

/* exp(x) for x <= 0, within 2 ulp of float32 down to x = -60, and 0 below: e^-60 (1e-26)
 * of a row's largest probability rounds to 0 in its int8 terms (whose finest step is
 * 1 / 32258 of the largest), and a subnormal product of it would cost a microcode assist
 * per element (10x the row's time).  n = round(x / ln 2), r = x - n ln 2 in two parts, a
 * degree-6 Taylor polynomial of exp(r) (|r| <= ln 2 / 2), times 2^n from the exponent
 * bits.  Branch-free, so a loop of it vectorizes; libm's expf is a call per element. */
W8_ROW_MATH static inline float w8_exp_nonpositive(float x)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float xc = x < -60.0f ? -60.0f : x;
    const float n = (xc * 1.44269504f + magic) - magic;
    const float r = (xc - n * 0.693145752f) - n * 1.42860677e-6f;
    const float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666667f + r * (0.0416666667f +
                    r * (0.00833333333f + r * 0.00138888889f)))));
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float e = p * scale;
    return x < -60.0f ? 0.0f : e;
}

/* v rounded to the nearest integer (ties to even, as rint) and clipped to [-127, 127], for
 * |v| < 2^22 (the row's terms are within 1 of 127 by construction). */
W8_ROW_MATH static inline int8_t w8_round_int8(float v)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const int32_t i = (int32_t)((v + magic) - magic);
    return (int8_t)(i > 127 ? 127 : (i < -127 ? -127 : i));
}

/* The largest of x[j0:j1], at least `floor`. */
W8_ROW_MATH static inline float w8_row_max(const float *x, int64_t j0, int64_t j1, float floor)
{
    float lane[W8_ROW_LANES];
    for (int l = 0; l < W8_ROW_LANES; l++) lane[l] = floor;
    int64_t j = j0;
    for (; j + W8_ROW_LANES <= j1; j += W8_ROW_LANES)
        for (int l = 0; l < W8_ROW_LANES; l++)
            lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
    for (; j < j1; j++) lane[0] = x[j] > lane[0] ? x[j] : lane[0];
    float top = floor;
    for (int l = 0; l < W8_ROW_LANES; l++) top = lane[l] > top ? lane[l] : top;
    return top;
}

/* The sum of x[j0:j1], in double. */
W8_ROW_MATH static inline double w8_row_sum(const float *x, int64_t j0, int64_t j1)
{
    double lane[W8_ROW_LANES] = {0};
    int64_t j = j0;
    for (; j + W8_ROW_LANES <= j1; j += W8_ROW_LANES)
        for (int l = 0; l < W8_ROW_LANES; l++) lane[l] += (double)x[j + l];
    for (; j < j1; j++) lane[0] += (double)x[j];
    double total = 0.0;
    for (int l = 0; l < W8_ROW_LANES; l++) total += lane[l];
    return total;
}

/* Row r of int8 attention's probabilities.  hi (and lo, on a lo_steps finer step, unless
 * NULL): the exact sums of the query row's int8 terms with T keys; the score of key j is
 * that sum times q_step * k_scale[j], and only the keys [j0, j1) are visible.
 * Their softmax, each probability times v_scale[j], is written as int8 terms p_hi (and
 * p_lo unless NULL) of step *p_step, zero outside [j0, j1): the terms of
 * pyw8a8.attention._exact.quantize_terms, the first as w8_quantize_row rounds (127 / max,
 * a row below 127 FLT_MIN is zero).  w: T floats of scratch. */
W8_ROW_MATH W8_ROW_CLONES static void w8_probability_row(
    const int32_t *hi, const int32_t *lo, int64_t T, int64_t lo_steps, double q_step,
    const float *k_scale, const float *v_scale, int64_t j0, int64_t j1, float *w,
    int8_t *p_hi, int8_t *p_lo, float *p_step)
{
    /* In float: the sums' combination (up to 2^30) rounds to float32 as the score itself
     * does, and double arithmetic here took 3x as long (two lanes a vector). */
    const float qs = (float)q_step, steps = (float)lo_steps;
    if (lo) {
        for (int64_t j = j0; j < j1; j++)
            w[j] = ((float)hi[j] * steps + (float)lo[j]) * (qs * k_scale[j]);
    } else {
        for (int64_t j = j0; j < j1; j++) w[j] = (float)hi[j] * (qs * k_scale[j]);
    }
    const float top = w8_row_max(w, j0, j1, -INFINITY);
    for (int64_t j = j0; j < j1; j++) w[j] = w8_exp_nonpositive(w[j] - top);
    const float inv_total = (float)(1.0 / w8_row_sum(w, j0, j1));
    for (int64_t j = j0; j < j1; j++) w[j] = w[j] * inv_total * v_scale[j];
    const float wmax = w8_row_max(w, j0, j1, 0.0f);
    memset(p_hi, 0, (size_t)T);
    if (p_lo) memset(p_lo, 0, (size_t)T);
    if (!(wmax >= 127.0f * FLT_MIN)) { /* also an empty row */
        *p_step = 0.0f;
        return;
    }
    const float scale = wmax / 127.0f, inv = 127.0f / wmax;
    for (int64_t j = j0; j < j1; j++) p_hi[j] = w8_round_int8(w[j] * inv);
    if (!p_lo) {
        *p_step = scale;
        return;
    }
    const float step = scale / (float)lo_steps;
    for (int64_t j = j0; j < j1; j++) p_lo[j] = w8_round_int8((w[j] - p_hi[j] * scale) / step);
    *p_step = step;
}

/* A float row x[0:K] as int8 terms: hi as w8_quantize_row rounds it (x * (127 / max|x|),
 * max|x| / 127 its scale; a row below 127 FLT_MIN is zero), then, unless lo is NULL, its
 * residual x - scale * hi on the lo_steps finer step.  *step: the step of the terms'
 * combined sum, lo_steps hi + lo (or of hi alone).  Returns 1, writing nothing, if the row
 * holds NaN or Inf. */
W8_ROW_MATH W8_ROW_CLONES static int w8_int8_terms_row(const float *x, int64_t K,
                                                      int64_t lo_steps, int8_t *hi,
                                                      int8_t *lo, float *step)
{
    float lane[W8_ROW_LANES] = {0};
    int64_t k = 0;
    for (; k + W8_ROW_LANES <= K; k += W8_ROW_LANES)
        for (int l = 0; l < W8_ROW_LANES; l++) {
            const float a = fabsf(x[k + l]);
            lane[l] = a > lane[l] ? a : lane[l];
        }
    for (; k < K; k++) lane[0] = fabsf(x[k]) > lane[0] ? fabsf(x[k]) : lane[0];
    float amax = 0.0f;
    int finite = 1;
    for (int l = 0; l < W8_ROW_LANES; l++) amax = lane[l] > amax ? lane[l] : amax;
    for (k = 0; k < K; k++) finite &= isfinite(x[k]) != 0;
    if (!finite) return 1;
    if (!(amax >= 127.0f * FLT_MIN)) {
        memset(hi, 0, (size_t)K);
        if (lo) memset(lo, 0, (size_t)K);
        *step = 0.0f;
        return 0;
    }
    const float scale = amax / 127.0f, inv = 127.0f / amax;
    for (k = 0; k < K; k++) hi[k] = w8_round_int8(x[k] * inv);
    if (!lo) {
        *step = scale;
        return 0;
    }
    const float fine = scale / (float)lo_steps;
    for (k = 0; k < K; k++) lo[k] = w8_round_int8((x[k] - hi[k] * scale) / fine);
    *step = fine;
    return 0;
}

/* The exact int32 products of an open page (pyw8a8.attention): its tokens' int8 rows are
 * not packed for the kernels while it fills, and a decode step's few query rows times its
 * < 128 tokens are too small for a packed product's setup.  Plain loops the compiler
 * vectorizes (int8 widened, multiplied and added in int32: exact for K < 133,000). */

/* out[r, n] = sum_k a[r, k] b[n, k], for r < R, n < N (row strides lda, ldb, ldo). */
W8_ROW_CLONES static void w8_int8_dots(const int8_t *a, int64_t R, int64_t lda,
                                       const int8_t *b, int64_t N, int64_t ldb, int64_t K,
                                       int32_t *out, int64_t ldo)
{
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = 0; n < N; n++) {
            const int8_t *x = a + r * lda, *y = b + n * ldb;
            int32_t sum = 0;
            for (int64_t k = 0; k < K; k++) sum += (int32_t)x[k] * (int32_t)y[k];
            out[r * ldo + n] = sum;
        }
}

/* out[r, d] += sum_t p[r, t] v[t, d], for r < R, t < T, d < D (row strides ldp, ldv,
 * ldo). */
W8_ROW_CLONES static void w8_int8_row_combinations(const int8_t *p, int64_t R, int64_t ldp,
                                                   const int8_t *v, int64_t T, int64_t ldv,
                                                   int64_t D, int32_t *out, int64_t ldo)
{
    for (int64_t r = 0; r < R; r++) {
        int32_t *o = out + r * ldo;
        for (int64_t t = 0; t < T; t++) {
            const int32_t w = p[r * ldp + t];
            const int8_t *y = v + t * ldv;
            if (w)
                for (int64_t d = 0; d < D; d++) o[d] += w * (int32_t)y[d];
        }
    }
}

#endif
