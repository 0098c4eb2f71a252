/* The float attention (_simd/float_attention.h) in every vector width this CPU runs: each
 * build (float_attention_entry.c, one per width) within float32 rounding of a double
 * reference, and all of them the same bits as the plain C build.  Cases: a padding mask,
 * holes in a bool mask, an additive mask with a row that sees nothing, causal with grouped
 * query heads, head_dim not a multiple of the tiles.  Prints "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "float_attention.h"

int fa_default(const w8_float_attention *a);
#if defined(FA_X86)
int fa_avx2(const w8_float_attention *a);
int fa_avx512f(const w8_float_attention *a);
#endif

static long n_passed, n_failed;

static void check(int ok, const char *what, const char *build)
{
    if (ok) {
        n_passed++;
    } else {
        n_failed++;
        printf("FAIL %s: %s\n", build, what);
    }
}

static uint32_t rng = 12345;
static float uniform(void) /* in [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

typedef struct {
    const char *name;
    int64_t B, Hq, Hkv, Lq, Lk, D;
    int mask; /* 0 none, 1 padding (bool, per batch row), 2 holes (bool, per head and
                 query), 3 additive (per batch row and query) */
    int causal;
} fa_case;

/* out = the attention in double, from the same inputs. */
static void reference(const w8_float_attention *a, double *out)
{
    const int64_t D = a->D;
    double *s = malloc(sizeof(double) * (size_t)a->Lk);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->Hq; h++) {
            const int64_t kvh = h / (a->Hq / a->Hkv);
            for (int64_t i = 0; i < a->Lq; i++) {
                const float *q = a->q + b * a->qs[0] + h * a->qs[1] + i * a->qs[2];
                double top = -INFINITY, total = 0.0;
                for (int64_t j = 0; j < a->Lk; j++) {
                    const float *k = a->k + b * a->ks[0] + kvh * a->ks[1] + j * a->ks[2];
                    const int64_t m = b * a->ms[0] + h * a->ms[1] + i * a->ms[2] + j;
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++) dot += (double)q[d] * k[d];
                    s[j] = dot * a->scale;
                    if (a->mask_add) s[j] += a->mask_add[m];
                    if ((a->mask_bool && !a->mask_bool[m]) || (a->causal && j > i))
                        s[j] = -INFINITY;
                    top = s[j] > top ? s[j] : top;
                }
                double *o = out + ((b * a->Hq + h) * a->Lq + i) * D;
                memset(o, 0, sizeof(double) * (size_t)D);
                if (top == -INFINITY) continue;
                for (int64_t j = 0; j < a->Lk; j++) {
                    const double w = exp(s[j] - top);
                    const float *v = a->v + b * a->vs[0] + kvh * a->vs[1] + j * a->vs[2];
                    total += w;
                    for (int64_t d = 0; d < D; d++) o[d] += w * v[d];
                }
                for (int64_t d = 0; d < D; d++) o[d] /= total;
            }
        }
    free(s);
}

static void run_case(const fa_case *c)
{
    const int64_t nq = c->B * c->Hq * c->Lq * c->D, nk = c->B * c->Hkv * c->Lk * c->D;
    float *q = malloc(sizeof(float) * (size_t)nq), *k = malloc(sizeof(float) * (size_t)nk);
    float *v = malloc(sizeof(float) * (size_t)nk), *out = malloc(sizeof(float) * (size_t)nq);
    float *plain = malloc(sizeof(float) * (size_t)nq);
    double *ref = malloc(sizeof(double) * (size_t)nq);
    const int64_t nm = c->B * c->Hq * c->Lq * c->Lk;
    uint8_t *mb = malloc((size_t)nm);
    float *ma = malloc(sizeof(float) * (size_t)nm);
    for (int64_t i = 0; i < nq; i++) q[i] = 2.0f * uniform();
    for (int64_t i = 0; i < nk; i++) k[i] = 2.0f * uniform(), v[i] = uniform();
    w8_float_attention a;
    memset(&a, 0, sizeof a);
    a.q = q, a.k = k, a.v = v, a.out = out;
    a.qs[0] = c->Hq * c->Lq * c->D, a.qs[1] = c->Lq * c->D, a.qs[2] = c->D;
    a.ks[0] = a.vs[0] = c->Hkv * c->Lk * c->D, a.ks[1] = a.vs[1] = c->Lk * c->D;
    a.ks[2] = a.vs[2] = c->D;
    /* the output as transformers lays it out: (B, Lq, Hq, D) */
    a.os[0] = c->Lq * c->Hq * c->D, a.os[1] = c->D, a.os[2] = c->Hq * c->D;
    a.B = c->B, a.Hq = c->Hq, a.Hkv = c->Hkv, a.Lq = c->Lq, a.Lk = c->Lk, a.D = c->D;
    a.scale = 1.0f / sqrtf((float)c->D), a.causal = c->causal;
    if (c->mask == 1) { /* row b sees its first keys, the same for every head and query */
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t j = 0; j < c->Lk; j++) mb[b * c->Lk + j] = j < 1 + (b * 7) % c->Lk;
        a.mask_bool = mb, a.ms[0] = c->Lk;
    } else if (c->mask == 2) {
        for (int64_t i = 0; i < nm; i++) mb[i] = uniform() > -0.2f;
        a.mask_bool = mb, a.ms[0] = c->Hq * c->Lq * c->Lk, a.ms[1] = c->Lq * c->Lk;
        a.ms[2] = c->Lk;
    } else if (c->mask == 3) {
        for (int64_t i = 0; i < nm; i++) ma[i] = uniform() > 0.6f ? -INFINITY : uniform();
        for (int64_t j = 0; j < c->Lk; j++) ma[c->Lk + j] = -INFINITY; /* sees nothing */
        a.mask_add = ma, a.ms[0] = c->Lq * c->Lk, a.ms[2] = c->Lk;
    }
    reference(&a, ref);

    struct {
        const char *name;
        int (*run)(const w8_float_attention *);
        int supported;
    } builds[] = {
        {"default", fa_default, 1},
#if defined(FA_X86)
        {"avx2", fa_avx2, __builtin_cpu_supports("avx2")},
        {"avx512f", fa_avx512f, __builtin_cpu_supports("avx512f")},
#endif
    };
    for (size_t n = 0; n < sizeof builds / sizeof builds[0]; n++) {
        if (!builds[n].supported) continue;
        memset(out, 0xff, sizeof(float) * (size_t)nq); /* NaN: every value must be written */
        check(builds[n].run(&a) == 0, "no memory", builds[n].name);
        int close = 1, same = 1;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t i = 0; i < c->Lq; i++)
                    for (int64_t d = 0; d < c->D; d++) {
                        const float got = out[b * a.os[0] + h * a.os[1] + i * a.os[2] + d];
                        const double want = ref[((b * c->Hq + h) * c->Lq + i) * c->D + d];
                        close &= fabs(got - want) <= 2e-6 + 2e-5 * fabs(want);
                    }
        if (n == 0)
            memcpy(plain, out, sizeof(float) * (size_t)nq);
        else
            same = memcmp(plain, out, sizeof(float) * (size_t)nq) == 0;
        char what[160];
        snprintf(what, sizeof what, "%s: within float32 rounding of the double reference",
                 c->name);
        check(close, what, builds[n].name);
        snprintf(what, sizeof what, "%s: the plain C build's bits", c->name);
        check(same, what, builds[n].name);
        printf("float attention %s, %s: %s\n", builds[n].name, c->name,
               close && same ? "ok" : "FAILED");
    }
    free(q), free(k), free(v), free(out), free(plain), free(ref), free(mb), free(ma);
}

int main(void)
{
    static const fa_case cases[] = {
        {"padding", 5, 3, 3, 13, 13, 32, 1, 0},
        {"holes", 2, 2, 1, 9, 45, 40, 2, 0},
        {"additive", 2, 4, 2, 7, 70, 64, 3, 0},
        {"causal gqa", 2, 4, 2, 11, 11, 72, 0, 1},
        {"long keys", 1, 2, 2, 5, 300, 20, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    printf("%ld passed, %ld failed\n", n_passed, n_failed);
    return n_failed != 0;
}
