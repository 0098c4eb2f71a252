/* The row arithmetic of attention, int8 (kv_attention.h) and float (float_attention.h):
 * exp, rounding, a row's max and sum.  Plain C, the same arithmetic on every ISA. */
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

#endif
