/* Micro-benchmarks that give the benchmark's reference figures: the int8 instruction peak of
 * each path (independent dependency chains of the exact instruction sequence the path's
 * microkernel issues, operands in registers) and the memory read bandwidth. */
#ifndef PYW8A8_SIMD_MICROBENCH_H
#define PYW8A8_SIMD_MICROBENCH_H

#include "common.h"
#include "amx.h"

/* Each function runs `iters` rounds and returns the multiply-accumulates performed; the
 * result is folded into *sink so the compiler cannot drop the work. */

static int64_t w8_peak_scalar(int64_t iters, int32_t *sink)
{
    /* Each chain feeds its own result back into its operand, so no closed form exists. */
    int32_t acc[16];
    int8_t a[16];
    for (int j = 0; j < 16; j++) {
        acc[j] = j;
        a[j] = (int8_t)(*sink + j);
    }
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++) {
            acc[j] += a[j] * (int8_t)(j + 1);
            a[j] = (int8_t)acc[j];
        }
    for (int j = 0; j < 16; j++) *sink += acc[j];
    return iters * 16;
}

#if defined(W8_X86)
#define W8_PEAK_CHAINS 12

/* The AVX2 path's inner step: vpsignb + vpmaddubsw + vpmaddwd + vpaddd (32 MACs).  Each
 * chain's accumulator is also its activation operand, so none of the four instructions is
 * loop-invariant (with constant operands the compiler hoists all but the vpaddd). */
W8_TARGET("avx2,fma") static int64_t w8_peak_avx2(int64_t iters, int32_t *sink)
{
    __m256i acc[W8_PEAK_CHAINS];
    const __m256i ones = _mm256_set1_epi16(1), b = _mm256_set1_epi8((char)(*sink | 3));
    const __m256i m = _mm256_abs_epi8(b);
    for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm256_set1_epi32(j + *sink);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < W8_PEAK_CHAINS; j++)
            acc[j] = _mm256_add_epi32(
                acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(m, _mm256_sign_epi8(acc[j], b)),
                                          ones));
    for (int j = 1; j < W8_PEAK_CHAINS; j++) acc[0] = _mm256_add_epi32(acc[0], acc[j]);
    *sink += _mm256_extract_epi32(acc[0], 0);
    return iters * W8_PEAK_CHAINS * 32;
}

W8_TARGET("avx2,fma,avxvnni") static int64_t w8_peak_avxvnni(int64_t iters, int32_t *sink)
{
    __m256i acc[W8_PEAK_CHAINS];
    const __m256i a = _mm256_set1_epi8((char)(*sink | 3)), b = _mm256_set1_epi8(5);
    for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm256_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < W8_PEAK_CHAINS; j++)
            acc[j] = _mm256_dpbusd_avx_epi32(acc[j], a, b);
    for (int j = 1; j < W8_PEAK_CHAINS; j++) acc[0] = _mm256_add_epi32(acc[0], acc[j]);
    *sink += _mm256_extract_epi32(acc[0], 0);
    return iters * W8_PEAK_CHAINS * 32;
}

W8_TARGET("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")
static int64_t w8_peak_avx512vnni(int64_t iters, int32_t *sink)
{
    __m512i acc[W8_PEAK_CHAINS];
    const __m512i a = _mm512_set1_epi8((char)(*sink | 3)), b = _mm512_set1_epi8(5);
    for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm512_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
    for (int j = 1; j < W8_PEAK_CHAINS; j++) acc[0] = _mm512_add_epi32(acc[0], acc[j]);
    *sink += _mm512_reduce_add_epi32(acc[0]);
    return iters * W8_PEAK_CHAINS * 64;
}

/* The float32 reference: 256-bit (or 512-bit) FMAs in independent chains, the instruction
 * numpy's BLAS multiplies float32 with.  It bounds what int8 can gain over float32: the
 * exact AVX2 int8 sequence above spends four instructions, two of them multiplies, on 32
 * multiply-accumulates where an FMA does 8 in one, and on some CPUs (the Zen 3 this was
 * measured on: 125 against 102 GOPS per core) that leaves int8 only 1.2x ahead.
 * a is 1 at run time but unknown to the compiler, and the sums grow slowly: no denormals,
 * no overflow, nothing to fold. */
W8_TARGET("avx2,fma") static int64_t w8_peak_fp32_avx2(int64_t iters, int32_t *sink)
{
    __m256 acc[W8_PEAK_CHAINS];
    const __m256 a = _mm256_set1_ps(1.0f - (float)(*sink & 1) * 1e-7f),
                 b = _mm256_set1_ps(1e-3f);
    for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
    for (int j = 1; j < W8_PEAK_CHAINS; j++) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    *sink += (int32_t)_mm256_cvtss_f32(acc[0]);
    return iters * W8_PEAK_CHAINS * 8;
}

W8_TARGET("avx2,fma,avx512f") static int64_t w8_peak_fp32_avx512(int64_t iters, int32_t *sink)
{
    __m512 acc[W8_PEAK_CHAINS];
    const __m512 a = _mm512_set1_ps(1.0f - (float)(*sink & 1) * 1e-7f),
                 b = _mm512_set1_ps(1e-3f);
    for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < W8_PEAK_CHAINS; j++) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
    for (int j = 1; j < W8_PEAK_CHAINS; j++) acc[0] = _mm512_add_ps(acc[0], acc[j]);
    *sink += (int32_t)_mm512_reduce_add_ps(acc[0]);
    return iters * W8_PEAK_CHAINS * 16;
}
#endif

typedef int64_t (*w8_peak_fn)(int64_t iters, int32_t *sink);

static w8_peak_fn w8_peak_for(const char *isa)
{
#if defined(W8_X86)
    if (strcmp(isa, "avx2") == 0) return w8_peak_avx2;
    if (strcmp(isa, "avxvnni") == 0) return w8_peak_avxvnni;
    if (strcmp(isa, "avx512vnni") == 0) return w8_peak_avx512vnni;
    if (strcmp(isa, "fp32-avx2") == 0) return w8_peak_fp32_avx2;
    if (strcmp(isa, "fp32-avx512") == 0) return w8_peak_fp32_avx512;
#if defined(W8_HAVE_AMX)
    if (strcmp(isa, "amx") == 0) return w8_peak_amx;
#endif
#endif
    return w8_peak_scalar;
}

/* Reads n bytes (a multiple of 64) with four independent XOR streams. */
static uint64_t w8_read_bytes(const uint8_t *p, int64_t n)
{
    uint64_t x0 = 0, x1 = 0, x2 = 0, x3 = 0;
    const uint64_t *q = (const uint64_t *)p;
    for (int64_t i = 0; i + 8 <= n / 8; i += 8) {
        x0 ^= q[i] ^ q[i + 4];
        x1 ^= q[i + 1] ^ q[i + 5];
        x2 ^= q[i + 2] ^ q[i + 6];
        x3 ^= q[i + 3] ^ q[i + 7];
    }
    return x0 ^ x1 ^ x2 ^ x3;
}

#endif
