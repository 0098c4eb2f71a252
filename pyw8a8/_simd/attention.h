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

/* Lanes of the row's reductions: independent accumulators, which vectorize.  A sum's lanes
 * fix its order (every width adds the same way); a max has no order to keep, so it takes
 * a whole AVX-512 vector (8 lanes took twice as long). */
#define W8_ROW_LANES 8
#define W8_MAX_LANES 16

/* GCC's and clang's generic vectors of 16 lanes: one zmm in the avx512f clone, two ymm or
 * four xmm in the others, the same IEEE operations lane by lane, so the same bits.  The
 * compilers left the plain loops below scalar or in ymm (a row's max in scalar code took
 * 40% of int8 attention's prefill).  Elsewhere the plain loops run. */
#if defined(__GNUC__)
#define W8_ROW_VECTORS 1
/* Inlined into each clone, to run in its vectors (a call would run the baseline's). */
#define W8_ROW_INLINE static inline __attribute__((always_inline))
typedef float w8_vf __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t w8_vi __attribute__((vector_size(64), aligned(4), may_alias));
typedef int8_t w8_vb __attribute__((vector_size(16), aligned(1), may_alias));
typedef float w8_vf8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef double w8_vd __attribute__((vector_size(64)));

/* m ? a : b, lane by lane (a macro: a function returning a vector has an ABI of its own
 * per target, which GCC warns of). */
#define W8_VSELECT(m, a, b) ((w8_vf)(((w8_vi)(a) & (m)) | ((w8_vi)(b) & ~(m))))
#else
#define W8_ROW_INLINE static inline
#endif

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
    /* Clipped first, in float (min and max vectorize; the int32 clip took 2x as long):
     * the same integer, as rounding is monotonic and +-127 are integers. */
    const float c = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
    return (int8_t)(int32_t)((c + magic) - magic);
}

/* The largest of x[j0:j1], at least `floor`. */
W8_ROW_MATH W8_ROW_INLINE float w8_row_max(const float *x, int64_t j0, int64_t j1, float floor)
{
    float lane[W8_MAX_LANES];
    for (int l = 0; l < W8_MAX_LANES; l++) lane[l] = floor;
    int64_t j = j0;
#if W8_ROW_VECTORS
    /* Four accumulators: one waits on each comparison's latency. */
    w8_vf acc[4];
    for (int a = 0; a < 4; a++) memcpy(&acc[a], lane, sizeof acc[a]);
    for (; j + 4 * W8_MAX_LANES <= j1; j += 4 * W8_MAX_LANES)
        for (int a = 0; a < 4; a++) {
            const w8_vf v = *(const w8_vf *)(x + j + a * W8_MAX_LANES);
            acc[a] = W8_VSELECT(v > acc[a], v, acc[a]);
        }
    for (int a = 1; a < 4; a++) acc[0] = W8_VSELECT(acc[a] > acc[0], acc[a], acc[0]);
    memcpy(lane, &acc[0], sizeof acc[0]);
#else
    for (; j + W8_MAX_LANES <= j1; j += W8_MAX_LANES)
        for (int l = 0; l < W8_MAX_LANES; l++)
            lane[l] = x[j + l] > lane[l] ? x[j + l] : lane[l];
#endif
    for (; j < j1; j++) lane[0] = x[j] > lane[0] ? x[j] : lane[0];
    float top = floor;
    for (int l = 0; l < W8_MAX_LANES; l++) top = lane[l] > top ? lane[l] : top;
    return top;
}

/* x[j] = w8_exp_nonpositive(x[j] - top) for j in [j0, j1). */
W8_ROW_MATH W8_ROW_INLINE void w8_exp_row(float *x, int64_t j0, int64_t j1, float top)
{
    int64_t j = j0;
#if W8_ROW_VECTORS
    const float magic = 12582912.0f;
    const w8_vf zero = {0};
    for (; j + W8_MAX_LANES <= j1; j += W8_MAX_LANES) {
        const w8_vf v = *(const w8_vf *)(x + j) - top;
        const w8_vi low = v < -60.0f;
        const w8_vf xc = W8_VSELECT(low, zero - 60.0f, v);
        const w8_vf n = (xc * 1.44269504f + magic) - magic;
        const w8_vf r = (xc - n * 0.693145752f) - n * 1.42860677e-6f;
        const w8_vf p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666667f + r * (0.0416666667f +
                        r * (0.00833333333f + r * 0.00138888889f)))));
        const w8_vi bits = (__builtin_convertvector(n, w8_vi) + 127) << 23;
        const w8_vf e = p * (w8_vf)bits;
        *(w8_vf *)(x + j) = (w8_vf)((w8_vi)e & ~low);
    }
#endif
    for (; j < j1; j++) x[j] = w8_exp_nonpositive(x[j] - top);
}

/* q[j] = w8_round_int8(x[j] * mul) for j in [j0, j1). */
W8_ROW_MATH W8_ROW_INLINE void w8_round_row(const float *x, int64_t j0, int64_t j1, float mul,
                                             int8_t *q)
{
    int64_t j = j0;
#if W8_ROW_VECTORS
    const float magic = 12582912.0f;
    const w8_vf zero = {0};
    for (; j + W8_MAX_LANES <= j1; j += W8_MAX_LANES) {
        w8_vf v = *(const w8_vf *)(x + j) * mul;
        v = W8_VSELECT(v > 127.0f, zero + 127.0f, W8_VSELECT(v < -127.0f, zero - 127.0f, v));
        *(w8_vb *)(q + j) = __builtin_convertvector(
            __builtin_convertvector((v + magic) - magic, w8_vi), w8_vb);
    }
#endif
    for (; j < j1; j++) q[j] = w8_round_int8(x[j] * mul);
}

/* The sum of x[j0:j1], in double. */
W8_ROW_MATH W8_ROW_INLINE double w8_row_sum(const float *x, int64_t j0, int64_t j1)
{
    double lane[W8_ROW_LANES] = {0};
    int64_t j = j0;
#if W8_ROW_VECTORS
    w8_vd sum = {0};
    for (; j + W8_ROW_LANES <= j1; j += W8_ROW_LANES)
        sum += __builtin_convertvector(*(const w8_vf8 *)(x + j), w8_vd);
    memcpy(lane, &sum, sizeof sum);
#else
    for (; j + W8_ROW_LANES <= j1; j += W8_ROW_LANES)
        for (int l = 0; l < W8_ROW_LANES; l++) lane[l] += (double)x[j + l];
#endif
    for (; j < j1; j++) lane[0] += (double)x[j];
    double total = 0.0;
    for (int l = 0; l < W8_ROW_LANES; l++) total += lane[l];
    return total;
}

#endif
