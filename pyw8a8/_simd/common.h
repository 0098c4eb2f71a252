/* Shared definitions of the pyw8a8 C core: layout constants, target attributes and the
 * function table that every instruction-set header fills in.
 *
 * Layout contract (shared by every kernel, so one packed weight serves every ISA):
 *   - K is padded with zeros to a multiple of W8_KPAD (64 bytes: one AMX tile row, one
 *     zmm of int8, and the granularity of the compensation prefix sums).
 *   - A (quantized activations) is row-major, M rows of Kp bytes (2 Kp where an ISA's
 *     kernels read them expanded: w8_expand_row_fn).
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
#define W8_TILE_LD 64       /* int32 leading dimension of the scratch tile of edge tiles */
#define W8_MAX_MR 32        /* largest microkernel row count of any ISA (AMX) */

/* Quantized activation buffers hold their rows up to a multiple of this: an AMX A tile
 * loads 16 rows at once, whatever the number of real rows (their results are dropped). */
#define W8_A_ROW_PAD 16

/* The widest K-range whose int32 sum is exact: |qa * qw| <= 127 * 127 = 16129 and
 * 131072 * 16129 = 2,114,060,288 < 2^31.  Within it the int32 accumulators may wrap in
 * between (the u8 x s8 products of the +128 encodings reach 255 * 127), but the
 * compensated total fits, and arithmetic modulo 2^32 makes it exact.  Every product with
 * K <= W8_EXACT_K therefore gets one exact int32 sum and one float conversion, whatever
 * the ISA, blocking or thread count; a longer K is summed per W8_EXACT_K-range in int64
 * (see gemm_loops.h). */
#define W8_EXACT_K 131072

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define W8_X86 1
#endif
#if defined(__aarch64__)
#define W8_ARM64 1
#endif

/* W8_EMULATE (the test build of tests/c) compiles every x86 ISA with its intrinsics
 * emulated in plain C: SIMDe for AVX-512 and AVX-VNNI, a model of the AMX tiles
 * (tests/c/w8_emulate.h, on that build's include path only). */
#if defined(W8_EMULATE)
#include "w8_emulate.h"
#elif defined(W8_X86)
#include <immintrin.h>
#endif

/* In the emulated build a target attribute would let GCC vectorize the emulation with the
 * very instructions being emulated. */
#if defined(W8_EMULATE)
#define W8_TARGET(s)
#elif defined(__GNUC__) || defined(__clang__)
#define W8_TARGET(s) __attribute__((target(s)))
#else
#define W8_TARGET(s)
#endif
#if defined(__GNUC__) || defined(__clang__)
#define W8_INLINE static inline __attribute__((always_inline))
#define W8_ALIGN(n) __attribute__((aligned(n)))
#else
#define W8_INLINE static __forceinline
#define W8_ALIGN(n) __declspec(align(n))
#endif

/* GCC's partial-redundancy elimination, off for one function: in a loop of many
 * independent chains of several instructions it keeps extra values live, and GCC 12 then
 * spills accumulators to the stack (avx2.h's peak probe). */
#if defined(__GNUC__) && !defined(__clang__)
#define W8_NO_TREE_PRE __attribute__((optimize("no-tree-pre")))
#else
#define W8_NO_TREE_PRE
#endif

/* The 4 bytes at p, as one int32 (unaligned). */
W8_INLINE int32_t w8_load_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* How the exact int32 sums are corrected before scaling.
 * The u8 x s8 instructions (vpdpbusd, AMX tdpbusd) need one operand shifted by +128:
 *   W8_CORR_ROW: weights stored biased (q + 128): subtract 128 * sum_k qa[m, k];
 *   W8_CORR_COL: weights signed, activations shifted: subtract 128 * sum_k qw[n, k].
 * AVX2's vpmaddubsw multiplies |qa| by the weight with its bits flipped where qa < 0
 * (avx2.h), which is qa * qw less |qa| there:
 *   W8_CORR_NEG: subtract the sum of the row's negative values, sum_k min(qa[m, k], 0). */
enum { W8_CORR_NONE = 0, W8_CORR_ROW = 1, W8_CORR_COL = 2, W8_CORR_NEG = 3 };

/* Whether a correction reads the activation rows' prefix sums. */
#define W8_CORR_READS_ROWS(corr) ((corr) == W8_CORR_ROW || (corr) == W8_CORR_NEG)

/* Where a product's result goes. */
enum { W8_OUT_F32 = 0, W8_OUT_I32 = 1, W8_OUT_I64 = 2 };

/* Weight encodings of a packed panel. */
enum { W8_ENC_BIASED = 0, W8_ENC_SIGNED = 1, W8_NUM_ENCODINGS = 2 };

/* A microkernel computes the raw int32 dot products (before the W8_CORR_* correction) of
 * `rows` consecutive A rows with `npanels` consecutive B panels over `kq` quad rows (a
 * multiple of 16: K-ranges are multiples of 64), and stores them to c[r * ldc + col] for
 * col < 16 * npanels, or adds them to what c holds when `accumulate`. */
typedef void (*w8_ukernel_fn)(int rows, int npanels, int64_t kq, const uint8_t *a,
                              int64_t lda, const uint8_t *b, int64_t panel_stride,
                              int32_t *c, int64_t ldc, int accumulate);

/* The activations a product's float result can go through (applied after the bias):
 * relu max(x, 0); gelu x * Phi(x) (erf form); gelu_tanh x * sigmoid(2 u), u =
 * sqrt(2 / pi) * (x + 0.044715 x^3), which is 0.5 x (1 + tanh u); silu x * sigmoid(x).
 * One float sequence in every ISA (epilogue.h), so every ISA gives the same bits. */
enum { W8_ACT_NONE = 0, W8_ACT_RELU = 1, W8_ACT_GELU = 2, W8_ACT_GELU_TANH = 3,
       W8_ACT_SILU = 4 };

/* How a product's exact int32 sums become its float result, at a tile's origin (row m,
 * column n): the row corrections and activation scales from row m, the column corrections,
 * weight scales and bias from column n; a NULL correction or bias is zero. */
typedef struct {
    const int32_t *row_corr;
    const int32_t *col_corr;
    const float *a_scale;
    const float *b_scale;
    const float *bias;
} w8_scaling;

/* What finishing a tile takes: the product's scaling (the gate's, in a gated pair), then
 * the activation `act` (W8_ACT_*), then, in a gated pair (up != NULL), the product with the
 * up projection's result, from its raw int32 sums at the same tile origin (row stride
 * ld_up) through its own scaling. */
typedef struct {
    w8_scaling g;
    int act;
    const int32_t *up;
    int64_t ld_up;
    w8_scaling u;
} w8_tile_finish;

/* A microkernel that finishes its tile: as w8_ukernel_fn over the last K-range, then the
 * product's scaling (fin->g: corrections, scales, bias) on each sum in registers, stored as
 * float32 over c (the activation and gate follow in w8_act_tile_fn, on the tile in L1). */
typedef void (*w8_ukernel_f32_fn)(int rows, int npanels, int64_t kq, const uint8_t *a,
                                  int64_t lda, const uint8_t *b, int64_t panel_stride,
                                  int32_t *c, int64_t ldc, int accumulate,
                                  const w8_tile_finish *fin);

/* The two scales applied to a converted sum v, the smaller one first: for any finite
 * float32 operands (scales max|row| / 127) neither product can overflow or underflow where
 * the result does not.  |v| >= 1 whenever v != 0, so v * min(sa, sb) is no smaller than a
 * scale, and it exceeds the result's magnitude only when both scales are below 1.  Forming
 * sa * sb first would overflow past max|x| * max|w| = 5.5e42 (NaN from 0 * Inf) and go
 * subnormal below about 1e-20 each.  The scales are positive, so min and max choose
 * the same operands in every ISA's instructions. */
static inline float w8_apply_scales(float v, float sa, float sb)
{
    return (v * (sa < sb ? sa : sb)) * (sa < sb ? sb : sa);
}

/* The scaling of a tile: out[r * ldo + j] = w8_apply_scales((float)(acc[r * ldacc + j] -
 * row_corr[r] - col_corr[j]), a_scale[r], b_scale[j]) + bias[j] for r < rows, j < cols,
 * with fin->g.  out may be acc (the int32 sums are kept in the output buffer until then).
 * Every ISA computes exactly these roundings (the int32 -> float conversion, the two
 * float products and the bias sum), so every ISA gives the same bits. */
typedef void (*w8_epilogue_fn)(const int32_t *acc, int64_t ldacc, int rows, int cols,
                               const w8_tile_finish *fin, float *out, int64_t ldo);

/* The rest of a tile's finish, in place over its scaled floats: out = act(out), times the
 * up projection's scaled result when fin->up (w8_tile_finish). */
typedef void (*w8_act_tile_fn)(float *out, int64_t ldo, int rows, int cols,
                               const w8_tile_finish *fin);

/* Row max-abs: writes max |x[i]| and returns 0, or returns 1 if the row holds NaN/Inf. */
typedef int (*w8_absmax_fn)(const float *x, int64_t n, float *amax);

/* Quantize n floats: q[i] = clamp(rint(x[i] * inv), -127, 127), XOR `flip` (0 or 0x80). */
typedef void (*w8_quantize_fn)(const float *x, int64_t n, float inv, uint8_t flip, uint8_t *q);

/* The Kp / 64 + 1 prefix sums over 64-element chunks of what the ISA's row correction
 * reads, from a row's bytes XOR flip (its signed values): the values themselves for
 * W8_CORR_ROW (quant.h's w8_prefix_sums is the reference), their negative parts for
 * W8_CORR_NEG (w8_negative_prefix_sums). */
typedef void (*w8_prefix_sums_fn)(const uint8_t *q, int64_t Kp, uint8_t flip, int32_t *psum);

/* The activation rows in the wider form some kernels read (avx2's flip trick, avx2.h: each
 * quad of values becomes its 4 magnitudes and then its 4-byte mask, 8 bytes), made in place
 * from the Kp quantized bytes (signed values XOR flip) that the caller left in the row's
 * last Kp bytes; the row is 2 Kp bytes.  The prefix sums are taken from the quantized bytes
 * before. */
typedef void (*w8_expand_row_fn)(uint8_t *row, int64_t Kp, uint8_t flip);

/* FWHT: x <- H x in place, n a power of two (n = 1 leaves x unchanged). */
typedef void (*w8_fwht_fn)(float *x, int64_t n);

/* A row's rotation with its signs from a table (fwht.h's w8_sign_table) and its absmax,
 * the fused quantizer's first pass: per block of `block` values (a power of two),
 * y = H (s x), a last partial block zero-padded, so y holds K rounded up to block values
 * (y apart from x); then max |y| into *amax as w8_absmax_fn, or 1 if y holds NaN or Inf.
 * Bit for bit each block's multiply then w8_fwht_fn, then w8_absmax_fn (fwht.h's
 * W8_ROTATE_ABSMAX_BY). */
typedef int (*w8_rotate_absmax_fn)(const float *x, const float *s, float *y, int64_t K,
                                   int64_t block, float *amax);

/* y[i] = x[i] * (+-c), negated where w8_sign_bit(pos + i, seed); y may be x. */
typedef void (*w8_sign_scale_fn)(const float *x, float *y, int64_t n, uint32_t pos,
                                 uint32_t seed, float c);

/* An instruction-peak loop: `iters` rounds of the ISA's dot instruction in independent
 * chains; returns the multiply-accumulates done and folds a result into *sink. */
typedef int64_t (*w8_peak_fn)(int64_t iters, int32_t *sink);

/* An instruction-peak probe (w8_peak_fn) NAME with target attribute TARGET: W8_PEAK_CHAINS
 * independent chains (enough to cover the latency of any dot instruction at its
 * throughput) of type T, started with INIT(j), stepped `iters` times with c = STEP(c, a, b)
 * (a = A, b = B: expressions of *sink, so nothing is known at compile time), added with ADD,
 * folded into *sink with FOLD; each step is MACS multiply-accumulates.  The chains are
 * named variables, as in the microkernels (ukernel.h): GCC 12 copies and spills an array
 * of them between the instructions being measured. */
#define W8_PEAK_CHAINS 12
#define W8_PEAK_FN(NAME, TARGET, T, A, B, INIT, STEP, ADD, FOLD, MACS)                    \
    TARGET static int64_t NAME(int64_t iters, int32_t *sink)                             \
    {                                                                                    \
        const T a = A, b = B;                                                            \
        T c0 = INIT(0), c1 = INIT(1), c2 = INIT(2), c3 = INIT(3), c4 = INIT(4),           \
          c5 = INIT(5), c6 = INIT(6), c7 = INIT(7), c8 = INIT(8), c9 = INIT(9),           \
          c10 = INIT(10), c11 = INIT(11);                                                \
        for (int64_t i_ = 0; i_ < iters; i_++) {                                         \
            c0 = STEP(c0, a, b), c1 = STEP(c1, a, b), c2 = STEP(c2, a, b);               \
            c3 = STEP(c3, a, b), c4 = STEP(c4, a, b), c5 = STEP(c5, a, b);               \
            c6 = STEP(c6, a, b), c7 = STEP(c7, a, b), c8 = STEP(c8, a, b);               \
            c9 = STEP(c9, a, b), c10 = STEP(c10, a, b), c11 = STEP(c11, a, b);           \
        }                                                                                \
        const T sum = ADD(ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7))), \
                          ADD(ADD(c8, c9), ADD(c10, c11)));                              \
        *sink += (int32_t)FOLD(sum);                                                     \
        return iters * W8_PEAK_CHAINS * (MACS);                                          \
    }

struct w8_cpu_features_s;

/* One ISA: everything that differs between ISAs, in one table entry of
 * the registry (dispatch.h).  Nothing outside the registry names an ISA. */
typedef struct {
    const char *name;
    int mr;                       /* microkernel rows */
    int npanels;                  /* microkernel panels (columns = 16 * npanels) */
    int whole_tiles;              /* the kernel stores whole tiles of the rows tile_rows set
                                     (AMX; mr rows without tile_rows): tiles with fewer rows
                                     go through a scratch tile (ukernel_f32 writes only
                                     its rows) */
    int whole_k;                  /* the whole K by default: the C tiles accumulate over
                                     all of it and are stored once (AMX); the tuner also
                                     times K-ranges whose A block fits in L1 (tuner.h) */
    /* Kernels for each weight encoding; both produce exact sum_k qa * qw up to `corr`. */
    w8_ukernel_fn ukernel[W8_NUM_ENCODINGS];
    /* The same, finishing full-width tiles of any rows to float (or NULL: the loop nest
     * runs `epilogue` after the kernel). */
    w8_ukernel_f32_fn ukernel_f32[W8_NUM_ENCODINGS];
    /* Both again, prefetching the weight ahead of its reads (or NULL: none), for products
     * of one or two row tiles, whose weight streams from beyond L2: the same panels
     * W8_UK_AHEAD bytes on (ukernel.h), the next strip (amx.h). */
    w8_ukernel_fn ukernel_prefetch[W8_NUM_ENCODINGS];
    w8_ukernel_f32_fn ukernel_f32_prefetch[W8_NUM_ENCODINGS];
    int corr[W8_NUM_ENCODINGS];       /* W8_CORR_* needed by ukernel[encoding] */
    uint8_t a_flip[W8_NUM_ENCODINGS]; /* XOR applied to quantized activations for ukernel[enc] */
    int auto_encoding;            /* the W8_ENC_* a weight gets when packed for this ISA */
    w8_epilogue_fn epilogue;
    w8_act_tile_fn act_tile;
    w8_absmax_fn absmax;
    w8_quantize_fn quantize;
    w8_prefix_sums_fn prefix_sums;
    w8_expand_row_fn expand_row;  /* NULL: the kernels read the quantized bytes (W8_A_BYTES) */
    w8_fwht_fn fwht;
    w8_rotate_absmax_fn rotate_absmax;
    w8_sign_scale_fn sign_scale;
    void (*task_begin)(void);     /* per thread, before its first kernel call (AMX tiles) */
    void (*tile_rows)(int rows);  /* per thread, before kernel calls of at most `rows` rows
                                     (1..mr): the rows of the whole tiles stored (AMX), or
                                     NULL */
    void (*task_end)(void);
    w8_peak_fn peak;
    int (*supported)(const struct w8_cpu_features_s *f);
    int explicit_only;            /* a test ISA, never chosen by default */
} w8_isa_ops;

/* Bytes per K value in the activation rows an ISA's kernels read: 1, or 2 where the rows are
 * expanded (w8_expand_row_fn). */
#define W8_A_BYTES(ops) ((ops)->expand_row ? 2 : 1)

/* Bytes from one activation row to the next in a call's scratch: the row's Kp * W8_A_BYTES,
 * and one cache line more where that is a multiple of 2048.  Such rows fall in one or two
 * of the 64 sets of an x86 L1 (set = address bits 6-11), so the rows a microkernel reads
 * together evict each other and the weight's lines: 16 rows of an AMX A tile in a 12-way
 * set, 8 rows in a Zen 4 core's 8 ways.  The row's values start at its first byte. */
static inline int64_t w8_row_stride(const w8_isa_ops *ops, int64_t Kp)
{
    const int64_t bytes = Kp * W8_A_BYTES(ops);
    return bytes % 2048 == 0 ? bytes + 64 : bytes;
}

#endif
