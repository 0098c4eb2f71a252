/* Micro-benchmarks that give the benchmark's reference figures besides the int8 instruction
 * peaks (each ISA's own, in the registry): the float32 FMA peak and the memory read
 * bandwidth. */
#ifndef PYW8A8_SIMD_MICROBENCH_H
#define PYW8A8_SIMD_MICROBENCH_H

#include "common.h"

#if defined(W8_X86)
/* The float32 reference: 256-bit (or 512-bit) FMAs in independent chains, the instruction
 * numpy's BLAS multiplies float32 with.  It bounds what int8 can gain over float32: the
 * exact AVX2 int8 sequence (avx2.h) spends four instructions, two of them multiplies, on 32
 * multiply-accumulates where an FMA does 8 in one, and on some CPUs that leaves int8 less
 * than 2x ahead (a Zen 3: 171 against 101 GOPS per core).
 * a is 1 at run time but unknown to the compiler, and the sums grow slowly: no denormals,
 * no overflow, nothing to fold. */
W8_PEAK_FN(w8_avx2_peak_fp32, W8_TARGET("avx2,fma"), __m256,
           _mm256_set1_ps(1.0f - (float)(*sink & 1) * 1e-7f), _mm256_set1_ps(1e-3f),
           _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32, 8)

W8_PEAK_FN(w8_avx512_peak_fp32, W8_TARGET("avx2,fma,avx512f"), __m512,
           _mm512_set1_ps(1.0f - (float)(*sink & 1) * 1e-7f), _mm512_set1_ps(1e-3f),
           _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_reduce_add_ps, 16)
#endif

/* The float32 FMA peak loop of the widest vector this CPU runs (`zmm` or not). */
static inline w8_peak_fn w8_fp32_peak(int zmm)
{
#if defined(W8_X86)
    return zmm ? w8_avx512_peak_fp32 : w8_avx2_peak_fp32;
#else
    (void)zmm;
    return NULL;
#endif
}

/* A microkernel that does no arithmetic: it only stores zeros (or leaves the sums as they
 * are, when accumulating), so that a product run with it times everything around the
 * kernels (`python -m pyw8a8 bench --overhead`). */
static inline void w8_noop_ukernel(int rows, int npanels, int64_t kq, const uint8_t *a, int64_t lda,
                            const uint8_t *b, int64_t panel_stride, int32_t *c, int64_t ldc,
                            int accumulate)
{
    (void)kq, (void)a, (void)lda, (void)b, (void)panel_stride;
    if (accumulate) return;
    for (int r = 0; r < rows; r++)
        memset(c + r * ldc, 0, sizeof(int32_t) * W8_NR * (size_t)npanels);
}

/* The finishing variant of w8_noop_ukernel: float zeros over the tile, no arithmetic. */
static inline void w8_noop_ukernel_f32(int rows, int npanels, int64_t kq, const uint8_t *a,
                                       int64_t lda, const uint8_t *b, int64_t panel_stride,
                                       int32_t *c, int64_t ldc, int accumulate,
                                       const w8_tile_finish *fin)
{
    (void)accumulate, (void)fin;
    w8_noop_ukernel(rows, npanels, kq, a, lda, b, panel_stride, c, ldc, 0);
}

/* Reads n bytes (a multiple of 64) in four independent XOR streams of 32-byte vectors:
 * narrow loads cap a core near three a cycle (84 GB/s with 8-byte ones on a Zen 5), below
 * what its L2 and L3 deliver.  On x86 the loop is cloned for AVX2, chosen at load time. */
typedef uint64_t w8_u64x4 __attribute__((vector_size(32)));
#if defined(W8_X86) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static inline uint64_t w8_read_bytes(const uint8_t *p, int64_t n)
{
    w8_u64x4 x[4] = {{0}, {0}, {0}, {0}}, v;
    int64_t i = 0;
    for (; i + 128 <= n; i += 128)
        for (int j = 0; j < 4; j++) {
            memcpy(&v, p + i + 32 * j, sizeof v);
            x[j] ^= v;
        }
    for (; i + 32 <= n; i += 32) {
        memcpy(&v, p + i, sizeof v);
        x[0] ^= v;
    }
    v = x[0] ^ x[1] ^ x[2] ^ x[3];
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

#endif
