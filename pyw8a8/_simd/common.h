/* Shared definitions of the pyw8a8 C core: layout constants, target attributes and the
 * function table that every instruction-set header fills in.
 *
 * Layout contract (shared by every kernel, so one packed weight serves every path):
 *   - K is padded with zeros to a multiple of W8_KPAD (64 bytes: one AMX tile row, one
 *     zmm of int8, and the granularity of the compensation prefix sums).
 *   - A (quantized activations) is row-major, M rows of Kp bytes.
 *   - B (packed weights) is a sequence of panels of W8_NR = 16 output channels; a panel is
 *     Kp/4 "quad rows" of 64 bytes: 16 channels x 4 consecutive K values.  One quad row is
 *     one zmm operand of vpdpbusd, two ymm operands of the AVX2 kernels, and one row of an
 *     AMX B tile.
 *   - Padding (K beyond the real K, channels beyond N) always encodes the value 0, so it
 *     contributes nothing to any dot product in either encoding.
 */
#ifndef PYW8A8_SIMD_COMMON_H
#define PYW8A8_SIMD_COMMON_H

/* syscall() (the AMX permission request) is a GNU/POSIX extension beyond -std=c11. */
#if !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>

#define W8_NR 16            /* output channels per packed panel */
#define W8_KPAD 64          /* K padding and prefix-sum granularity */
#define W8_QUAD_BYTES 64    /* bytes of one quad row of a panel */
#define W8_TILE_LD 64       /* int32 leading dimension of a microkernel result tile */
#define W8_MAX_MR 32        /* largest microkernel row count of any path (AMX) */

/* Largest K-range accumulated in int32 before it is flushed.  The worst |partial| of the
 * biased encoding is 255 * 127 per product (|q| <= 127 after the +128 shift is at most
 * 255 with the activation bias, 254 * 127 with the weight bias); 32768 of them stay
 * below 2^31 (1.06e9), so no K-range ever overflows. */
#define W8_MAX_KC 32768

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define W8_X86 1
#endif
#if defined(__aarch64__)
#define W8_ARM64 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define W8_INLINE static inline __attribute__((always_inline))
#define W8_TARGET(s) __attribute__((target(s)))
#define W8_ALIGN(n) __attribute__((aligned(n)))
#else
#define W8_INLINE static __forceinline
#define W8_TARGET(s)
#define W8_ALIGN(n) __declspec(align(n))
#endif

/* How the int32 accumulators of one K-range are corrected before scaling.
 * The u8 x s8 instructions (vpdpbusd, AMX tdpbusd) need one operand shifted by +128:
 *   W8_CORR_ROW: weights stored biased (q + 128): subtract 128 * sum_k qa[m, k];
 *   W8_CORR_COL: weights signed, activations shifted: subtract 128 * sum_k qw[n, k]. */
enum { W8_CORR_NONE = 0, W8_CORR_ROW = 1, W8_CORR_COL = 2 };

/* Where a K-range result goes. */
enum { W8_OUT_F32 = 0, W8_OUT_I32 = 1, W8_OUT_I64 = 2 };

/* Weight encodings of a packed panel. */
enum { W8_ENC_BIASED = 0, W8_ENC_SIGNED = 1 };

/* A microkernel computes the int32 dot products of `rows` consecutive A rows with `npanels`
 * consecutive B panels over `kq` quad rows, and stores them in tile[r * W8_TILE_LD + c]. */
typedef void (*w8_ukernel_fn)(int rows, int npanels, int64_t kq, const uint8_t *a,
                              int64_t lda, const uint8_t *b, int64_t panel_stride,
                              int32_t *tile);

/* Row max-abs: writes max |x[i]| and returns 0, or returns 1 if the row holds NaN/Inf. */
typedef int (*w8_absmax_fn)(const float *x, int64_t n, float *amax);

/* Quantize n floats: q[i] = clamp(rint(x[i] * inv), -127, 127), XOR `flip` (0 or 0x80). */
typedef void (*w8_quantize_fn)(const float *x, int64_t n, float inv, uint8_t flip, uint8_t *q);

typedef struct {
    const char *name;
    int mr;                       /* microkernel rows */
    int nv;                       /* microkernel panels (columns = 16 * nv) */
    /* Kernels for each weight encoding; both produce exact sum_k qa * qw up to `corr`. */
    w8_ukernel_fn ukernel[2];
    int corr[2];                  /* W8_CORR_* needed by ukernel[encoding] */
    uint8_t a_flip[2];            /* XOR applied to quantized activations for ukernel[enc] */
    w8_absmax_fn absmax;
    w8_quantize_fn quantize;
} w8_isa_ops;

#endif
