/* Bit-exactness tests of the C core, for every ISA of the registry that
 * this CPU runs, or every one (--all) in the emulated build.
 *
 * The microkernels run through the shared loop nest (w8_gemm_range) on weights packed
 * exactly as pyw8a8/packing.py packs them, and are compared with a plain int64 reference,
 * in int32, int64 (K beyond W8_EXACT_K included) and float32 output, the last bit for bit
 * against the one float formula of the epilogue; the row quantizer and the epilogue of each
 * ISA are compared with the scalar ones, and the FWHT of each ISA (and the NEON one) with
 * w8_scalar_fwht bit for bit and with a naive Hadamard product in double.
 *
 * Usage: test_kernels [--expect NAME] [--all]
 *   --expect NAME  the ISA the dispatcher must pick on this CPU
 *   --all          every ISA of the registry, whatever the CPU (the emulated build)
 * Build: cc -O2 -I pyw8a8/_simd tests/c/test_kernels.c -lm
 * Emulated build (tests/kernels/test_c_kernels.py): add -DW8_EMULATE -mavx2 -mfma -I tests/c
 *   -I <SIMDe headers>: the AVX-512 VNNI, AVX-VNNI and AMX intrinsics become plain C. */
#include "dispatch.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static long n_passed, n_failed;

static void check(int ok, const char *fmt, ...)
{
    if (ok) {
        n_passed++;
        return;
    }
    /* A broken kernel fails thousands of cases; the first few tell what broke. */
    if (n_failed++ < 20) {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL: ");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void)
{
    /* splitmix64: a fixed seed keeps every run identical. */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rand_q(void) { return (int)(rng_next() % 255) - 127; }

/* Uniform in [-1, 1). */
static float rand_f(void)
{
    return (float)((double)(rng_next() >> 11) / 9007199254740992.0 * 2 - 1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("out of memory\n");
        exit(2);
    }
    return p;
}

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* ---------------------------------------------------------------- GEMM ---------------- */

enum { DATA_RANDOM, DATA_POS, DATA_NEG, DATA_MIXED, DATA_ALTERNATING, NUM_DATA };
static const char *const data_names[] = {"random", "all +127", "all -127",
                                         "+127 x -127", "alternating"};

static void fill(int kind, int8_t *qa, int64_t M, int8_t *qw, int64_t N, int64_t K)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            int v = kind == DATA_RANDOM ? rand_q()
                    : kind == DATA_NEG  ? -127
                    : kind == DATA_ALTERNATING ? ((k & 1) ? -127 : 127)
                                               : 127;
            qa[m * K + k] = (int8_t)v;
        }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int v = kind == DATA_RANDOM ? rand_q()
                    : kind == DATA_POS  ? 127
                    : kind == DATA_ALTERNATING ? (((k + n) & 1) ? 127 : -127)
                                               : -127;
            qw[n * K + k] = (int8_t)v;
        }
}

/* The layout of packing._fill_panels: panels [Np/16][Kp/4][16][4], padding encodes 0,
 * biased bytes are q ^ 0x80 (q + 128); psum holds the per-channel prefix sums over 64-K
 * chunks of the signed values. */
static void pack_weight(const int8_t *qw, int64_t N, int64_t K, int64_t Np, int64_t Kp,
                        int enc, uint8_t *panels, int32_t *psum)
{
    const int64_t nch = Kp / W8_KPAD + 1;
    for (int64_t n = 0; n < Np; n++) {
        psum[n * nch] = 0;
        int32_t s = 0;
        for (int64_t k = 0; k < Kp; k++) {
            const int8_t v = n < N && k < K ? qw[n * K + k] : 0;
            const int64_t p = n / W8_NR, c = n % W8_NR, quad = k / 4, j = k % 4;
            panels[((p * (Kp / 4) + quad) * W8_NR + c) * 4 + j] =
                (uint8_t)v ^ (enc == W8_ENC_BIASED ? 0x80 : 0);
            s += v;
            if ((k + 1) % W8_KPAD == 0) psum[n * nch + (k + 1) / W8_KPAD] = s;
        }
    }
}

/* The reference of the prefix sums that ISA `ops`'s row correction reads for encoding enc
 * (the signed values for W8_CORR_ROW, their negative parts for W8_CORR_NEG). */
static w8_prefix_sums_fn reference_row_sums(const w8_isa_ops *ops, int enc)
{
    return ops->corr[enc] == W8_CORR_NEG ? w8_negative_prefix_sums : w8_prefix_sums;
}

/* The reference of w8_expand_row_fn (avx2.h's flip trick): each quad of values v (the
 * bytes XOR flip) as its magnitudes, then its mask, 0xFF where v < 0, XOR 0x80 ^ flip. */
static void reference_expand_row(const uint8_t *q, int64_t Kp, uint8_t flip, uint8_t *row)
{
    for (int64_t k = 0; k < Kp; k++) {
        const int8_t v = (int8_t)(q[k] ^ flip);
        row[k / 4 * 8 + k % 4] = (uint8_t)(v < 0 ? -v : v);
        row[k / 4 * 8 + 4 + k % 4] = (uint8_t)((v < 0 ? 0xFF : 0) ^ 0x80 ^ flip);
    }
}

/* Quantized activations as w8_prepare_row leaves them for encoding enc: rows of Kp values
 * (W8_A_BYTES each: expanded by the reference where the ISA expands them), XOR a_flip,
 * and their prefix sums (the buffer's rows past M, up to whole W8_A_ROW_PAD tiles, are the
 * caller's). */
static void pack_act(const w8_isa_ops *ops, int enc, const int8_t *qa, int64_t M, int64_t K,
                     int64_t Kp, uint8_t *a, int32_t *psum)
{
    const int64_t nch = Kp / W8_KPAD + 1, lda = Kp * W8_A_BYTES(ops);
    const uint8_t flip = ops->a_flip[enc];
    uint8_t *q = xmalloc((size_t)Kp);
    for (int64_t m = 0; m < M; m++) {
        for (int64_t k = 0; k < Kp; k++) q[k] = (uint8_t)(k < K ? qa[m * K + k] : 0) ^ flip;
        reference_row_sums(ops, enc)(q, Kp, flip, psum + m * nch);
        if (ops->expand_row) reference_expand_row(q, Kp, flip, a + m * lda);
        else memcpy(a + m * lda, q, (size_t)Kp);
    }
    free(q);
}

typedef struct {
    const char *what;
    int out_kind;
    int fine;  /* 1: kc = 64, mc = mr, nc = 16 * npanels: every blocking boundary is
                  crossed; 2: kc = 64 only: K-ranges over row blocks of many tiles, whose
                  last range the kernel may finish (gemm_loops.h's w8_row_block) */
    int split; /* four tasks, split at a row and at a panel boundary */
    int prefetch; /* the ISA's prefetching kernels, where it has them */
} gemm_variant;

static const gemm_variant variants[] = {
    {"i64", W8_OUT_I64, 0, 0, 0},
    {"i64 split", W8_OUT_I64, 0, 1, 0},
    {"i32 split", W8_OUT_I32, 0, 1, 0},
    {"i32 fine-blocked split", W8_OUT_I32, 1, 1, 0},
    {"f32", W8_OUT_F32, 0, 0, 0},
    {"f32 fine-blocked split", W8_OUT_F32, 1, 1, 0},
    {"f32 K-ranged", W8_OUT_F32, 2, 0, 0},
    {"i64 prefetching", W8_OUT_I64, 0, 0, 1},
    {"i32 fine-blocked split prefetching", W8_OUT_I32, 1, 1, 1},
    {"f32 prefetching", W8_OUT_F32, 0, 0, 1},
};
#define NUM_VARIANTS (int)(sizeof(variants) / sizeof(variants[0]))

static const int64_t SENTINEL = 0x5A5A5A5A;

static int same_float(float x, float y) { return memcmp(&x, &y, sizeof(float)) == 0; }

/* Scales with every exponent from tiny to large, so the float products are checked across
 * the range. */
static float rand_scale(void) { return ldexpf(0.5f + 0.5f * fabsf(rand_f()), (int)(rng_next() % 40) - 30); }

static void run_gemm(const w8_gemm *g, int split, int64_t Np)
{
    w8_task_begin(g->ops);
    if (split) {
        const int64_t ms = g->M / 2, ns = Np / 32 * 16;
        w8_gemm_range(g, 0, ms, 0, ns);
        w8_gemm_range(g, 0, ms, ns, g->N);
        w8_gemm_range(g, ms, g->M, 0, ns);
        w8_gemm_range(g, ms, g->M, ns, g->N);
    } else {
        w8_gemm_range(g, 0, g->M, 0, g->N);
    }
    w8_task_end(g->ops);
}

static void test_gemm_case(const w8_isa_ops *ops, int kind, int64_t M, int64_t N, int64_t K)
{
    const int64_t Kp = round_up(K, W8_KPAD), Np = round_up(N, W8_NR);
    const int64_t Mp = round_up(M, W8_A_ROW_PAD);
    const int64_t nch = Kp / W8_KPAD + 1, ldo = N + 1; /* one sentinel column per row */
    int8_t *qa = xmalloc((size_t)(M * K)), *qw = xmalloc((size_t)(N * K));
    uint8_t *a = xmalloc((size_t)(Mp * Kp * 2)), *b = xmalloc((size_t)(Np * Kp));
    int32_t *a_psum = xmalloc(sizeof(int32_t) * (size_t)(M * nch));
    int32_t *b_psum = xmalloc(sizeof(int32_t) * (size_t)(Np * nch));
    int64_t *ref = xmalloc(sizeof(int64_t) * (size_t)(M * N));
    int64_t *o64 = xmalloc(sizeof(int64_t) * (size_t)(M * ldo));
    int32_t *o32 = xmalloc(sizeof(int32_t) * (size_t)(M * ldo));
    float *sa = xmalloc(sizeof(float) * (size_t)M), *sb = xmalloc(sizeof(float) * (size_t)N);
    const int exact = Kp <= W8_EXACT_K;

    fill(kind, qa, M, qw, N, K);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t s = 0;
            for (int64_t k = 0; k < K; k++) s += (int64_t)qa[m * K + k] * qw[n * K + k];
            ref[m * N + n] = s;
        }
    for (int64_t m = 0; m < M; m++) sa[m] = rand_scale();
    for (int64_t n = 0; n < N; n++) sb[n] = rand_scale();
    /* Rows past M hold garbage: a kernel may read them (AMX), never use them. */
    const int64_t lda = Kp * W8_A_BYTES(ops);
    for (int64_t i = M * lda; i < Mp * lda; i++) a[i] = (uint8_t)rng_next();

    for (int enc = 0; enc < 2; enc++) {
        pack_act(ops, enc, qa, M, K, Kp, a, a_psum);
        pack_weight(qw, N, K, Np, Kp, enc, b, b_psum);
        for (int v = 0; v < NUM_VARIANTS; v++) {
            const gemm_variant *var = &variants[v];
            if (var->out_kind != W8_OUT_I64 && !exact) continue;
            w8_gemm g = {ops, enc, M, N, Kp, a, lda, a_psum, b, b_psum, sa, sb, NULL,
                              W8_ACT_NONE, NULL, var->out_kind, NULL, ldo, Kp,
                              round_up(M, ops->mr), Np};
            g.prefetch = var->prefetch;
            if (var->fine) g.kc = W8_KPAD;
            if (var->fine == 1) {
                g.mc = ops->mr;
                g.nc = (int64_t)W8_NR * ops->npanels;
            }
            g.out = var->out_kind == W8_OUT_I64 ? (void *)o64 : (void *)o32;
            for (int64_t i = 0; i < M * ldo; i++) o64[i] = o32[i] = (int32_t)SENTINEL;
            run_gemm(&g, var->split, Np);
            /* Column N holds the sentinel: nothing may be written past the last column.
             * The float result must be the epilogue's formula on the exact sum, bit for bit
             * (the sum fits in int32 within W8_EXACT_K). */
            int64_t bad_m = -1, bad_n = -1;
            for (int64_t m = 0; m < M && bad_m < 0; m++)
                for (int64_t n = 0; n <= N; n++) {
                    int ok;
                    if (var->out_kind == W8_OUT_I64) {
                        ok = o64[m * ldo + n] == (n < N ? ref[m * N + n] : SENTINEL);
                    } else if (var->out_kind == W8_OUT_I32 || n == N) {
                        ok = o32[m * ldo + n] == (n < N ? ref[m * N + n] : SENTINEL);
                    } else {
                        const float want =
                            w8_apply_scales((float)(int32_t)ref[m * N + n], sa[m], sb[n]);
                        float got;
                        memcpy(&got, &o32[m * ldo + n], sizeof(float));
                        ok = same_float(got, want);
                    }
                    if (!ok) {
                        bad_m = m, bad_n = n;
                        break;
                    }
                }
            check(bad_m < 0,
                  "%s gemm %s enc=%s %s M=%lld N=%lld K=%lld: first bad at m=%lld n=%lld",
                  ops->name, var->what, enc == W8_ENC_BIASED ? "biased" : "signed",
                  data_names[kind], (long long)M, (long long)N, (long long)K,
                  (long long)bad_m, (long long)bad_n);
        }
    }
    free(qa), free(qw), free(a), free(b), free(a_psum), free(b_psum), free(ref), free(o64),
        free(o32), free(sa), free(sb);
}

/* The fused layer through the loop nest: a product with a bias and each activation, and a
 * gated pair (its up projection in the other weight encoding, so with its own activation
 * format and corrections) against the scalar formula on the exact sums, bit for bit; whole
 * and edge tiles, coarse and fine blocking. */
static void test_fused_gemm(const w8_isa_ops *ops)
{
    static const int64_t shapes[][3] = {{1, 17, 64}, {7, 70, 200}, {13, 100, 640},
                                        {33, 50, 130}, {6, 64, 128}};
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        const int64_t Kp = round_up(K, W8_KPAD), Np = round_up(N, W8_NR);
        const int64_t Mp = round_up(M, W8_A_ROW_PAD), nch = Kp / W8_KPAD + 1;
        const int64_t lda = Kp * W8_A_BYTES(ops);
        int8_t *qa = xmalloc((size_t)(M * K)), *qw[2];
        uint8_t *a[2], *b[2];
        int32_t *a_psum[2], *b_psum[2], *up_sums = xmalloc(sizeof(int32_t) * (size_t)(M * N));
        int64_t *ref[2];
        float *sa = xmalloc(sizeof(float) * (size_t)M), *sb[2], *bias[2];
        float *out = xmalloc(sizeof(float) * (size_t)(M * N));
        for (int64_t i = 0; i < M * K; i++) qa[i] = (int8_t)rand_q();
        for (int64_t m = 0; m < M; m++) sa[m] = rand_scale();
        for (int w = 0; w < 2; w++) {
            qw[w] = xmalloc((size_t)(N * K));
            a[w] = xmalloc((size_t)(Mp * Kp * 2));
            b[w] = xmalloc((size_t)(Np * Kp));
            a_psum[w] = xmalloc(sizeof(int32_t) * (size_t)(M * nch));
            b_psum[w] = xmalloc(sizeof(int32_t) * (size_t)(Np * nch));
            ref[w] = xmalloc(sizeof(int64_t) * (size_t)(M * N));
            sb[w] = xmalloc(sizeof(float) * (size_t)N);
            bias[w] = xmalloc(sizeof(float) * (size_t)N);
            for (int64_t i = 0; i < N * K; i++) qw[w][i] = (int8_t)rand_q();
            for (int64_t n = 0; n < N; n++) {
                sb[w][n] = ldexpf(0.5f + 0.5f * fabsf(rand_f()), -8);
                bias[w][n] = rand_f();
            }
            for (int64_t i = M * lda; i < Mp * lda; i++) a[w][i] = (uint8_t)rng_next();
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    int64_t t = 0;
                    for (int64_t k = 0; k < K; k++) t += (int64_t)qa[m * K + k] * qw[w][n * K + k];
                    ref[w][m * N + n] = t;
                }
        }
        for (int enc = 0; enc < 2; enc++)
            for (int act = W8_ACT_NONE; act <= W8_ACT_SILU; act++)
                for (int gated = 0; gated < 2; gated++)
                    for (int fine = 0; fine < 2; fine++) {
                        if (gated && act == W8_ACT_NONE) continue;
                        const int encs[2] = {enc, 1 - enc};
                        w8_gemm g[2];
                        for (int w = 0; w < 2; w++) {
                            pack_act(ops, encs[w], qa, M, K, Kp, a[w], a_psum[w]);
                            pack_weight(qw[w], N, K, Np, Kp, encs[w], b[w], b_psum[w]);
                            g[w] = (w8_gemm){ops, encs[w], M, N, Kp, a[w], lda, a_psum[w],
                                                  b[w], b_psum[w], sa, sb[w], bias[w],
                                                  w ? W8_ACT_NONE : act, NULL,
                                                  w ? W8_OUT_I32 : W8_OUT_F32,
                                                  w ? (void *)up_sums : (void *)out, N, Kp,
                                                  round_up(M, ops->mr), Np};
                            if (fine) {
                                g[w].kc = W8_KPAD;
                                g[w].mc = ops->mr;
                                g[w].nc = (int64_t)W8_NR * ops->npanels;
                            }
                        }
                        if (gated) g[0].up = &g[1];
                        run_gemm(&g[0], fine, Np);
                        int64_t bad = -1;
                        for (int64_t m = 0; m < M && bad < 0; m++)
                            for (int64_t n = 0; n < N; n++) {
                                float want = w8_apply_scales((float)(int32_t)ref[0][m * N + n],
                                                             sa[m], sb[0][n]) + bias[0][n];
                                if (act) want = w8_scalar_activate(want, act);
                                if (gated)
                                    want = want * (w8_apply_scales(
                                                       (float)(int32_t)ref[1][m * N + n], sa[m],
                                                       sb[1][n]) + bias[1][n]);
                                if (!same_float(out[m * N + n], want)) {
                                    bad = m * N + n;
                                    break;
                                }
                            }
                        check(bad < 0,
                              "%s fused gemm M=%lld N=%lld K=%lld enc=%d act=%d gated=%d "
                              "fine=%d: first bad at %lld",
                              ops->name, (long long)M, (long long)N, (long long)K, enc, act,
                              gated, fine, (long long)bad);
                    }
        for (int w = 0; w < 2; w++)
            free(qw[w]), free(a[w]), free(b[w]), free(a_psum[w]), free(b_psum[w]),
                free(ref[w]), free(sb[w]), free(bias[w]);
        free(qa), free(up_sums), free(sa), free(out);
    }
}

/* The smallest sizes, and sizes just below, at and just above multiples of 16 (panel), 64
 * (K padding) and 128, so every kernel meets full tiles and partial ones of each size. */
static const int64_t sizes[] = {1,  2,  3,  4,   5,   15,  16,  17,
                                63, 64, 65, 127, 128, 129, 640, 1000};
#define NUM_SIZES (int)(sizeof(sizes) / sizeof(sizes[0]))

/* All size triples whose work M * N * K stays under a limit, which keeps the grid fast under
 * emulation: the small sizes meet one another in full and each large size meets the small
 * ones; `big` adds large sizes in all dimensions at once. */
#define GEMM_WORK_LIMIT 70000

static void test_gemm(const w8_isa_ops *ops)
{
    /* Past W8_EXACT_K: per-range int32 sums added in int64.  The extremes make every
     * range's raw u8 x s8 sum wrap around int32 on the +128 ISAs, and the total exceed
     * it (140000 * 127 * 127 > 2^31). */
    for (int kind = DATA_RANDOM; kind <= DATA_NEG; kind++)
        test_gemm_case(ops, kind, 3, 17, W8_EXACT_K + 8928);
    for (int i = 0; i < NUM_SIZES; i++)
        for (int j = 0; j < NUM_SIZES; j++)
            for (int l = 0; l < NUM_SIZES; l++) {
                const int64_t M = sizes[i], N = sizes[j], K = sizes[l];
                if (M * N * K <= GEMM_WORK_LIMIT) test_gemm_case(ops, DATA_RANDOM, M, N, K);
            }
    /* Large sizes in several dimensions at once. */
    static const int64_t big[][3] = {{129, 65, 1000}, {17, 640, 129}, {65, 129, 640},
                                     {1000, 17, 65},  {127, 1000, 63}, {5, 1000, 1000}};
    for (size_t s = 0; s < sizeof(big) / sizeof(big[0]); s++)
        test_gemm_case(ops, DATA_RANDOM, big[s][0], big[s][1], big[s][2]);
    /* Extreme values: the largest sums of either sign (1000 * 127 * 127 at K = 1000). */
    static const int64_t extreme[][3] = {{1, 1, 1},    {4, 16, 64},  {5, 17, 65},
                                         {3, 15, 127}, {17, 33, 1000}, {65, 129, 129}};
    for (int kind = DATA_POS; kind < NUM_DATA; kind++)
        for (size_t s = 0; s < sizeof(extreme) / sizeof(extreme[0]); s++)
            test_gemm_case(ops, kind, extreme[s][0], extreme[s][1], extreme[s][2]);
}

/* ------------------------------------------------------------ quantizer --------------- */

static void compare_quantize(const w8_isa_ops *ops, const float *x, int64_t n, float inv,
                             const char *what)
{
    uint8_t *q0 = xmalloc((size_t)n), *q1 = xmalloc((size_t)n);
    for (int f = 0; f < 2; f++) {
        const uint8_t flip = f ? 0x80 : 0;
        w8_scalar_quantize(x, n, inv, flip, q0);
        ops->quantize(x, n, inv, flip, q1);
        check(memcmp(q0, q1, (size_t)n) == 0, "%s quantize %s n=%lld flip=%d", ops->name,
              what, (long long)n, flip);
    }
    free(q0), free(q1);
}

static void compare_absmax(const w8_isa_ops *ops, const float *x, int64_t n,
                           const char *what)
{
    float m0 = -1.0f, m1 = -1.0f;
    const int r0 = w8_scalar_absmax(x, n, &m0), r1 = ops->absmax(x, n, &m1);
    check(r0 == r1 && (r0 || same_float(m0, m1)),
          "%s absmax %s n=%lld: %d %g vs scalar %d %g", ops->name, what, (long long)n, r1,
          m1, r0, m0);
}

/* The ISA's quantized row against the scalar one, and its prefix sums against the
 * reference of its row correction's sums over those bytes. */
static void compare_quantize_row(const w8_isa_ops *ops, const float *x, int64_t K,
                                 const char *what)
{
    const int64_t Kp = round_up(K, W8_KPAD), nch = Kp / W8_KPAD + 1;
    uint8_t *q0 = xmalloc((size_t)Kp), *q1 = xmalloc((size_t)Kp);
    uint8_t *e0 = xmalloc((size_t)(2 * Kp)), *e1 = xmalloc((size_t)(2 * Kp));
    const size_t psize = sizeof(int32_t) * (size_t)nch;
    int32_t *p0 = xmalloc(psize), *p1 = xmalloc(psize);
    const w8_prefix_sums_fn ref_sums = reference_row_sums(ops, W8_ENC_BIASED);
    for (int f = 0; f < 2; f++) {
        const uint8_t flip = f ? 0x80 : 0;
        float s0 = -1.0f, s1 = -1.0f;
        memset(q0, 0xEE, (size_t)Kp), memset(q1, 0xEE, (size_t)Kp);
        memset(p0, 0, psize), memset(p1, 0, psize);
        const int r0 = w8_quantize_row(w8_isa_lookup("scalar"), x, K, Kp, flip, q0, &s0, NULL);
        const int r1 = w8_quantize_row(ops, x, K, Kp, flip, q1, &s1, p1);
        if (!r0) ref_sums(q0, Kp, flip, p0);
        check(r0 == r1 && same_float(s0, s1) && memcmp(q0, q1, (size_t)Kp) == 0 &&
                  (r0 || memcmp(p0, p1, psize) == 0),
              "%s quantize_row %s K=%lld flip=%d", ops->name, what, (long long)K, flip);
        if (ops->expand_row && !r0) {
            /* The expansion in place, from the quantized bytes in the row's last Kp. */
            memcpy(e1 + Kp, q1, (size_t)Kp);
            ops->expand_row(e1, Kp, flip);
            reference_expand_row(q0, Kp, flip, e0);
            check(memcmp(e0, e1, (size_t)(2 * Kp)) == 0, "%s expand_row %s K=%lld flip=%d",
                  ops->name, what, (long long)K, flip);
        }
    }
    free(q0), free(q1), free(p0), free(p1), free(e0), free(e1);
}

static void test_quantizer(const w8_isa_ops *ops)
{
    enum { MAXN = 1040 };
    float *x = xmalloc(sizeof(float) * MAXN);
    static const int64_t lengths[] = {0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47,
                                      63, 64, 65, 100, 127, 128, 129, 1000, 1031};
    const int nlen = (int)(sizeof(lengths) / sizeof(lengths[0]));

    for (int li = 0; li < nlen; li++) {
        const int64_t n = lengths[li];
        for (int rep = 0; rep < 4; rep++) {
            /* The last scale makes rows too small for a normal scale: quantized to 0. */
            static const float scales[] = {1.0f, 1e-3f, 1e3f, 1e-37f};
            const float scale = scales[rep];
            for (int64_t i = 0; i < n; i++) x[i] = rand_f() * scale;
            compare_absmax(ops, x, n, "random");
            compare_quantize_row(ops, x, n, "random");
            /* Values far beyond +-127 after scaling exercise the clamp. */
            if (rep < 3) compare_quantize(ops, x, n, 300.0f / scale, "clamped");
        }
        /* Exactly half-way after scaling: 0.5, 1.5, 2.5, ... must round to even. */
        for (int64_t i = 0; i < n; i++) x[i] = (float)(4 * ((i % 261) - 130) + 2);
        compare_quantize(ops, x, n, 0.25f, "ties");
        /* Non-finite values anywhere, including in the vector body and in the tail. */
        static const float bad[] = {NAN, INFINITY, -INFINITY};
        if (n > 0)
            for (int bi = 0; bi < 3; bi++) {
                const int64_t pos[] = {0, n / 2, n - 1};
                for (int pi = 0; pi < 3; pi++) {
                    for (int64_t i = 0; i < n; i++) x[i] = rand_f();
                    x[pos[pi]] = bad[bi];
                    compare_absmax(ops, x, n, "non-finite");
                    compare_quantize_row(ops, x, n, "non-finite");
                }
            }
        /* Largest finite magnitude is valid; signed zeros and subnormals too. */
        for (int64_t i = 0; i < n; i++)
            x[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 1e-40f : -FLT_MIN;
        if (n > 2) x[n - 2] = -FLT_MAX;
        compare_absmax(ops, x, n, "edge magnitudes");
        compare_quantize_row(ops, x, n, "edge magnitudes");
    }

    /* The quantizer must round half to even itself, not only agree with the scalar ISA. */
    static const float ties[] = {0.5f,   1.5f,    2.5f, -0.5f,       -1.5f, -2.5f,
                                 126.5f, -126.5f, 127.5f, -127.5f,   3.5f,  -3.5f,
                                 0.49999997f,     1e9f, -1e9f,       0.0f};
    static const int8_t want[] = {0, 2, 2, 0, -2, -2, 126, -126, 127, -127, 4, -4, 0, 127,
                                  -127, 0};
    enum { NT = sizeof(ties) / sizeof(ties[0]) };
    float xt[2 * NT];
    uint8_t qt[2 * NT];
    for (int i = 0; i < 2 * NT; i++) xt[i] = 2.0f * ties[i % NT];
    ops->quantize(xt, 2 * NT, 0.5f, 0, qt);
    for (int i = 0; i < 2 * NT; i++)
        check((int8_t)qt[i] == want[i % NT], "%s quantize tie %g -> %d, want %d", ops->name,
              ties[i % NT], (int8_t)qt[i], want[i % NT]);
    free(x);
}

/* ----------------------------------------------------------------- FWHT --------------- */

typedef struct {
    const char *name;
    w8_fwht_fn fn;
    w8_rotate_absmax_fn rotate_absmax;
} fwht_case;

/* Each rotation's pass must match w8_scalar_rotate_absmax bit for bit (the rotated values,
 * the maximum and the verdict on NaN and Inf): every block size, K of one block, of many
 * (the fused two-block loop of AVX-512 at 128 and its last block) and with a partial last
 * block, and rows with a NaN, an Inf, or values that overflow only once rotated. */
static void test_rotate_absmax(const fwht_case *cases, int ncases)
{
    enum { MAXK = 4 * 4096 };
    float *x = xmalloc(sizeof(float) * MAXK), *s = xmalloc(sizeof(float) * MAXK),
          *y = xmalloc(sizeof(float) * MAXK), *z = xmalloc(sizeof(float) * MAXK);
    for (int64_t block = 16; block <= 4096; block *= 2) {
        const int64_t ks[] = {block, 3 * block, 17 * 128, 3 * block + 5, 7, 1};
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int64_t K = ks[ki], Kr = (K + block - 1) / block * block;
            if (Kr > MAXK) continue;
            w8_sign_table(w8_scalar_sign_scale, s, K, block, (uint32_t)(K + block));
            for (int row = 0; row < 4; row++) {
                for (int64_t i = 0; i < K; i++) x[i] = rand_f();
                const int64_t at = (int64_t)(rng_next() % (uint64_t)K);
                if (row == 1) x[at] = NAN;
                if (row == 2) x[at] = -INFINITY;
                if (row == 3) /* finite, each times its sign positive: a whole block's
                                 first sum, 0.9 sqrt(block) FLT_MAX, overflows */
                    for (int64_t i = 0; i < K; i++) x[i] = s[i] > 0 ? 0.9f * FLT_MAX : -0.9f * FLT_MAX;
                float want_max = -1.0f, got_max = -1.0f;
                memset(z, 0xFF, sizeof(float) * (size_t)Kr);
                const int want = w8_scalar_rotate_absmax(x, s, z, K, block, &want_max);
                if (row < 3 || K >= block)
                    check(want == (row > 0), "scalar rotate_absmax K=%lld block=%lld row %d: %d",
                          (long long)K, (long long)block, row, want);
                for (int c = 0; c < ncases; c++) {
                    memset(y, 0xFF, sizeof(float) * (size_t)Kr);
                    const int got = cases[c].rotate_absmax(x, s, y, K, block, &got_max);
                    check(got == want, "rotate_absmax %s K=%lld block=%lld row %d: returned %d",
                          cases[c].name, (long long)K, (long long)block, row, got);
                    if (want == 0)
                        check(memcmp(y, z, sizeof(float) * (size_t)Kr) == 0 &&
                                  memcmp(&got_max, &want_max, sizeof got_max) == 0,
                              "rotate_absmax %s K=%lld block=%lld differs from the scalar one",
                              cases[c].name, (long long)K, (long long)block);
                }
            }
        }
    }
    free(x), free(s), free(y), free(z);
}

/* Every FWHT runs the butterfly network of w8_scalar_fwht, so each must match it bit for
 * bit; the naive product in double checks that network itself. */
static void test_fwht(const fwht_case *cases, int ncases)
{
    enum { MAXN = 4096 };
    float *x = xmalloc(sizeof(float) * MAXN), *y = xmalloc(sizeof(float) * MAXN),
          *z = xmalloc(sizeof(float) * MAXN);
    double *ref = xmalloc(sizeof(double) * MAXN);
    for (int64_t n = 1; n <= MAXN; n *= 2) {
        double l1 = 0;
        for (int64_t i = 0; i < n; i++) {
            x[i] = rand_f();
            l1 += fabs(x[i]);
        }
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t j = 0; j < n; j++)
                s += __builtin_parityll((unsigned long long)(i & j)) ? -(double)x[j] : x[j];
            ref[i] = s;
        }
        /* Each output is a +-1 sum of the inputs, rounded once per stage. */
        int stages = 0;
        while ((1ll << stages) < n) stages++;
        const double tol = (stages + 1) * FLT_EPSILON * l1;
        memcpy(z, x, sizeof(float) * (size_t)n);
        w8_scalar_fwht(z, n);
        for (int c = 0; c < ncases; c++) {
            memcpy(y, x, sizeof(float) * (size_t)n);
            cases[c].fn(y, n);
            check(memcmp(y, z, sizeof(float) * (size_t)n) == 0,
                  "fwht %s n=%lld differs from w8_scalar_fwht", cases[c].name,
                  (long long)n);
            double worst = 0;
            for (int64_t i = 0; i < n; i++) {
                const double err = fabs(ref[i] - y[i]);
                worst = err > worst ? err : worst;
            }
            check(worst <= tol, "fwht %s n=%lld: error %g > %g", cases[c].name,
                  (long long)n, worst, tol);
        }
    }
    free(x), free(y), free(z), free(ref);
}

/* ------------------------------------------------------------- epilogue --------------- */

/* Every ISA's epilogue against the scalar one, bit for bit: random and extreme sums and
 * corrections (their differences wrap around int32 as the kernels' do), with and without a
 * bias, every width from a partial vector to a full tile, in place (out over the sums) as
 * the loop nest runs it. */
static void test_epilogue(const w8_isa_ops *ops)
{
    enum { ROWS = 5, LD = 70 };
    const w8_isa_ops *scalar = w8_isa_lookup("scalar");
    int32_t acc[ROWS * LD], rc[ROWS], cc[64];
    float sa[ROWS], sb[64], bias[64], want[ROWS * LD], got[ROWS * LD];
    for (int rep = 0; rep < 40; rep++)
        for (int cols = 1; cols <= 64; cols += rep % 2 ? 1 : 7) {
            for (int i = 0; i < ROWS * LD; i++) {
                const uint32_t r = (uint32_t)rng_next();
                acc[i] = rep % 4 == 0 ? (int32_t)r : (int32_t)(r % 4000001) - 2000000;
            }
            for (int r = 0; r < ROWS; r++) {
                rc[r] = rep % 3 ? (int32_t)(rng_next() % 100001) - 50000 : (int32_t)rng_next();
                sa[r] = rand_scale();
            }
            for (int j = 0; j < 64; j++) {
                cc[j] = (int32_t)(rng_next() % 100001) - 50000;
                sb[j] = rand_scale();
                bias[j] = rand_f() * rand_scale();
            }
            for (int corr = 0; corr < 6; corr++) {
                w8_tile_finish fin = {{corr % 3 == 1 ? rc : NULL, corr % 3 == 2 ? cc : NULL,
                                       sa, sb, corr >= 3 ? bias : NULL},
                                      W8_ACT_NONE, NULL, 0, {NULL, NULL, NULL, NULL, NULL}};
                scalar->epilogue(acc, LD, ROWS, cols, &fin, want, LD);
                memcpy(got, acc, sizeof(acc));
                ops->epilogue((const int32_t *)(void *)got, LD, ROWS, cols, &fin, got, LD);
                int ok = 1;
                for (int rr = 0; rr < ROWS; rr++)
                    for (int j = 0; j < cols; j++)
                        ok &= same_float(got[rr * LD + j], want[rr * LD + j]);
                check(ok, "%s epilogue cols=%d corr=%d rep=%d", ops->name, cols, corr, rep);
            }
        }
}

/* A float with the bits b. */
static float float_of_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
}

/* Every ISA's activation pass against the scalar one, bit for bit: each activation over
 * a sweep of every exponent (both signs, random mantissas), the special values (zeros,
 * infinities, NaN, the subnormals, the clamps' edges), with and without the gate's product
 * (an up tile of random sums, corrections, scales and bias). */
static void test_act_tile(const w8_isa_ops *ops)
{
    enum { ROWS = 3, LD = 67, N = ROWS * LD };
    const w8_isa_ops *scalar = w8_isa_lookup("scalar");
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-45f, -1e-45f, 1.2e-38f,
                                    -1.2e-38f, 3.4e38f, -3.4e38f, -1e4f, -1.0001e4f, -9999.0f,
                                    -88.0f, -87.0f, -104.0f, -13.0f, -5.0f, 5.0f, 1e-8f,
                                    -1e-8f, 0.5f, -0.5f, 20.0f, -20.0f, 100.0f};
    float x[N], want[N], got[N], sa[ROWS], sb[LD], bias[LD];
    int32_t up[N], rc[ROWS];
    for (int rep = 0; rep < 300; rep++) {
        for (int i = 0; i < N; i++) {
            const uint32_t r = (uint32_t)rng_next();
            /* exponents in turn across the range; every 7th value special */
            const uint32_t e = (uint32_t)((rep * N + i) % 256);
            x[i] = i % 7 == 0 ? special[(rep + i / 7) % (int)(sizeof(special) / sizeof(float))]
                              : float_of_bits((r & 0x807fffffu) | (e << 23));
            up[i] = (int32_t)(rng_next() % 2000001) - 1000000;
        }
        if (rep % 5 == 0) x[rep % N] = float_of_bits(0x7fc00000u); /* NaN */
        for (int r = 0; r < ROWS; r++) {
            sa[r] = rand_scale();
            rc[r] = (int32_t)(rng_next() % 1001) - 500;
        }
        for (int j = 0; j < LD; j++) {
            sb[j] = rand_scale();
            bias[j] = rand_f();
        }
        for (int act = W8_ACT_NONE; act <= W8_ACT_SILU; act++)
            for (int gated = 0; gated < 2; gated++) {
                if (act == W8_ACT_NONE && !gated) continue;
                const int cols = LD - rep % 19;
                w8_tile_finish fin = {{NULL, NULL, NULL, NULL, NULL}, act,
                                      gated ? up : NULL, LD, {rc, NULL, sa, sb, bias}};
                memcpy(want, x, sizeof(x));
                memcpy(got, x, sizeof(x));
                scalar->act_tile(want, LD, ROWS, cols, &fin);
                ops->act_tile(got, LD, ROWS, cols, &fin);
                int ok = 1, bad = -1;
                for (int i = 0; i < N && ok; i++) {
                    ok = same_float(got[i], want[i]) || (isnan(got[i]) && isnan(want[i]));
                    if (!ok) bad = i;
                }
                check(ok, "%s act_tile act=%d gated=%d rep=%d: x=%a got %a want %a", ops->name,
                      act, gated, rep, bad >= 0 ? x[bad] : 0.0f, bad >= 0 ? got[bad] : 0.0f,
                      bad >= 0 ? want[bad] : 0.0f);
            }
    }
}

/* The activation rows of a call's scratch (w8_row_stride): whole cache lines apart, never
 * closer than a row's bytes, and spread over the 64 sets of an x86 L1: at most 4 of an AMX
 * A tile's 16 rows share a set, for every Kp up to 16384. */
static void test_row_stride(const w8_isa_ops *ops)
{
    for (int64_t Kp = W8_KPAD; Kp <= 16384; Kp += W8_KPAD) {
        const int64_t stride = w8_row_stride(ops, Kp);
        int per_set[64] = {0}, most = 0;
        for (int r = 0; r < 16; r++) {
            const int set = (int)((r * stride / 64) % 64);
            if (++per_set[set] > most) most = per_set[set];
        }
        check(stride >= Kp * W8_A_BYTES(ops) && stride % 64 == 0 && most <= 4,
              "%s: Kp %lld, row stride %lld puts %d of 16 rows in one L1 set", ops->name,
              (long long)Kp, (long long)stride, most);
    }
}

/* ----------------------------------------------------------------- main --------------- */

int main(int argc, char **argv)
{
    const char *expect = NULL;
    int all = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--expect") == 0 && i + 1 < argc) {
            expect = argv[++i];
        } else if (strcmp(argv[i], "--all") == 0) {
            all = 1;
        } else {
            printf("usage: %s [--expect NAME] [--all]\n", argv[0]);
            return 2;
        }
    }
    w8_cpu_features f;
    w8_cpu_detect(&f);
    const char *chosen = w8_isa_best(&f)->name;
    printf("dispatch: %s\n", chosen);
    if (expect)
        check(strcmp(chosen, expect) == 0, "dispatcher picked %s, expected %s", chosen,
              expect);

    fwht_case fwht[W8_NUM_ISAS + 1];
    int nfwht = 0;
    for (int i = 0; i < W8_NUM_ISAS; i++) {
        const w8_isa_ops *ops = &w8_isas[i];
        if (!all && !ops->supported(&f)) {
            printf("skip %s: not supported by this CPU\n", ops->name);
            continue;
        }
        const long before = n_passed + n_failed;
        test_gemm(ops);
        test_fused_gemm(ops);
        test_row_stride(ops);
        if (strcmp(ops->name, "scalar") != 0) {
            test_quantizer(ops);
            test_epilogue(ops);
            test_act_tile(ops);
        }
#if defined(W8_HAVE_AMX)
        if (strcmp(ops->name, "amx") == 0)
            check(w8_amx_config_roundtrip() == 1, "amx tile configuration read back differs");
#endif
        printf("tested %s: %ld checks\n", ops->name, n_passed + n_failed - before);
        fwht[nfwht++] = (fwht_case){ops->name, ops->fwht, ops->rotate_absmax};
    }
#if defined(W8_ARM64)
    /* Directly as well, whichever ISAs use it. */
    fwht[nfwht++] = (fwht_case){"w8_neon_fwht", w8_neon_fwht, w8_neon_rotate_absmax};
#endif
    const long before = n_passed + n_failed;
    test_fwht(fwht, nfwht);
    test_rotate_absmax(fwht, nfwht);
    printf("tested fwht and rotation: %ld checks\n", n_passed + n_failed - before);
    printf("%ld passed, %ld failed\n", n_passed, n_failed);
    return n_failed != 0;
}
