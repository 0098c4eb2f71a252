/* Attention over float32 keys and values (pyw8a8.torch's attention where no int8 cache
 * holds them: an encoder's), fused: per query row, the scores of the keys it may see,
 * their softmax and the weighted sum of the values, without a (queries x keys) matrix in
 * memory.  The keys the mask hides at either end of a row are skipped, not computed and
 * thrown away: in a padded batch of sentences (all-MiniLM-L6-v2's encode in `bench
 * --torch`, 93 tokens a row with 20 real ones on average) that is most of the work, which
 * torch's SDPA does in full.
 *
 * One (batch, query head) a task; a task transposes its keys once (head_dim x tokens), so
 * that a block of W8_FA_ROWS query rows times W8_FA_KEYS keys is a register tile added up
 * along head_dim, and the values are summed W8_FA_COLS columns at a time, down the keys.
 * Plain C that the compiler vectorizes, in the widest vectors the CPU has (W8_ROW_CLONES):
 * every sum runs in one fixed order (head_dim, then the keys; the softmax's total in
 * W8_ROW_LANES double lanes), each step a product then a sum (-ffp-contract=off), so
 * every CPU gets the same bits.  Not C's fmaf, which would also round once everywhere: on
 * a CPU without FMA (and in a build for the baseline, as clang's and MSVC's are) it is a
 * libm call an element, 19x the time of the product and sum; with them AVX-512 ran 0-20%
 * slower than with FMA, AVX2 faster (one thread, 32 x 12 x 93 x 32, Zen 5). */
#ifndef PYW8A8_SIMD_FLOAT_ATTENTION_H
#define PYW8A8_SIMD_FLOAT_ATTENTION_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"

#define W8_FA_ROWS 4  /* query rows a tile */
#define W8_FA_KEYS 32 /* keys a score tile: 2 zmm (4 ymm) a row */
#define W8_FA_COLS 32 /* value columns a tile */

/* One call: q (B, Hq, Lq, D), k and v (B, Hkv, Lk, D), out (B, Hq, Lq, D), each with unit
 * stride along D and the given element strides over batch, head and token.  The mask, if
 * any, is bool (`mask_bool`: 0 hides a key) or additive float (`mask_add`, added to the
 * scaled scores; -inf hides), (B, Hq, Lq, Lk) with unit key stride and the strides
 * `ms` (0 along a dimension it is broadcast over).  `causal`: query i sees keys 0..i. */
typedef struct {
    const float *q, *k, *v;
    int64_t qs[3], ks[3], vs[3];
    float *out;
    int64_t os[3];
    const uint8_t *mask_bool;
    const float *mask_add;
    int64_t ms[3];
    int causal;
    int64_t B, Hq, Hkv, Lq, Lk, D;
    float scale;
} w8_float_attention;

/* Columns of the transposed keys and of the scores: Lk in whole tiles, and one tile more,
 * which a tile that starts at the last key reads (zeros). */
static inline int64_t w8_fa_padded_keys(int64_t Lk)
{
    return (Lk + W8_FA_KEYS - 1) / W8_FA_KEYS * W8_FA_KEYS + W8_FA_KEYS;
}

/* The keys a query row sees: [lo, hi), and whether a 0 of a bool mask hides some in
 * between (empty: lo == hi == 0). */
typedef struct {
    int64_t lo, hi, holes;
} w8_fa_span;

/* Floats of scratch one thread needs: the transposed keys and a tile's scores. */
static inline int64_t w8_fa_scratch_floats(const w8_float_attention *a)
{
    const int64_t keys = w8_fa_padded_keys(a->Lk);
    return a->D * keys + W8_FA_ROWS * keys;
}

/* The first nonzero byte of m[j0:j1] (j1 if none), 8 bytes a step: a padded row of a
 * sentence batch hides most of its keys. */
static inline int64_t w8_fa_first_set(const uint8_t *m, int64_t j0, int64_t j1)
{
    uint64_t word;
    for (; j0 + 8 <= j1; j0 += 8) {
        memcpy(&word, m + j0, 8);
        if (word) break;
    }
    while (j0 < j1 && !m[j0]) j0++;
    return j0;
}

/* One past the last nonzero byte of m[j0:j1] (j0 if none). */
static inline int64_t w8_fa_last_set(const uint8_t *m, int64_t j0, int64_t j1)
{
    uint64_t word;
    for (; j1 - 8 >= j0; j1 -= 8) {
        memcpy(&word, m + j1 - 8, 8);
        if (word) break;
    }
    while (j1 > j0 && !m[j1 - 1]) j1--;
    return j1;
}

/* Whether m[j0:j1] holds a zero byte, 8 bytes a step. */
static inline int w8_fa_any_zero(const uint8_t *m, int64_t j0, int64_t j1)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t word;
    for (; j0 + 8 <= j1; j0 += 8) {
        memcpy(&word, m + j0, 8);
        if ((word - ones) & ~word & highs) return 1;
    }
    for (; j0 < j1; j0++)
        if (!m[j0]) return 1;
    return 0;
}

/* Query row i's span, its mask row mb or ma (or neither). */
static inline w8_fa_span w8_fa_row_span(const w8_float_attention *a, const uint8_t *mb,
                                        const float *ma, int64_t i)
{
    int64_t j0 = 0, j1 = a->causal ? (i + 1 < a->Lk ? i + 1 : a->Lk) : a->Lk;
    if (mb) {
        j0 = w8_fa_first_set(mb, j0, j1);
        j1 = w8_fa_last_set(mb, j0, j1);
    } else if (ma) {
        while (j0 < j1 && ma[j0] == -INFINITY) j0++;
        while (j1 > j0 && ma[j1 - 1] == -INFINITY) j1--;
    }
    w8_fa_span span = {0, 0, 0};
    if (j0 < j1) {
        span.lo = j0;
        span.hi = j1;
        span.holes = mb != NULL && w8_fa_any_zero(mb, j0, j1);
    }
    return span;
}

/* The query heads that need spans of their own: every one where the mask differs by
 * head, else one (the spans of a batch row serve all its heads). */
static inline int64_t w8_fa_span_heads(const w8_float_attention *a)
{
    return (a->mask_bool || a->mask_add) && a->ms[1] != 0 ? a->Hq : 1;
}

/* The spans of the Lq query rows of batch row b and query head h into span: computed once
 * for the call (w8_fa_span_heads of them a batch row), not once a task, and once for all
 * rows where every query reads one mask row. */
static void w8_fa_spans(const w8_float_attention *a, int64_t b, int64_t h, w8_fa_span *span)
{
    const uint8_t *MB = a->mask_bool ? a->mask_bool + b * a->ms[0] + h * a->ms[1] : NULL;
    const float *MA = a->mask_add ? a->mask_add + b * a->ms[0] + h * a->ms[1] : NULL;
    for (int64_t i = 0; i < a->Lq; i++)
        span[i] = i > 0 && a->ms[2] == 0 && !a->causal
                      ? span[0]
                      : w8_fa_row_span(a, MB ? MB + i * a->ms[2] : NULL,
                                       MA ? MA + i * a->ms[2] : NULL, i);
}

/* s[r][c] = scale * (q_r . kT[:, c0 + c]) for c < W8_FA_KEYS: the tile, summed along D. */
W8_ROW_MATH static inline void w8_fa_score_tile(const float *const rows[W8_FA_ROWS],
                                                const float *kT, int64_t ldk, int64_t D,
                                                float scale, float *s, int64_t lds)
{
    float acc[W8_FA_ROWS][W8_FA_KEYS];
    memset(acc, 0, sizeof acc);
    for (int64_t d = 0; d < D; d++) {
        const float *kd = kT + d * ldk;
        for (int r = 0; r < W8_FA_ROWS; r++) {
            const float qd = rows[r][d];
            for (int c = 0; c < W8_FA_KEYS; c++) acc[r][c] = acc[r][c] + qd * kd[c];
        }
    }
    for (int r = 0; r < W8_FA_ROWS; r++)
        for (int c = 0; c < W8_FA_KEYS; c++) s[r * lds + c] = acc[r][c] * scale;
}

/* o_r[d0 + c] = inv[r] * sum over keys j of p[r][j] v[j][d0 + c], c < n (<= W8_FA_COLS). */
W8_ROW_MATH static inline void w8_fa_value_tile(const float *p, int64_t ldp, int64_t keys,
                                                const float *v, int64_t ldv, int64_t n,
                                                const float inv[W8_FA_ROWS],
                                                float *const out[W8_FA_ROWS], int rows)
{
    float acc[W8_FA_ROWS][W8_FA_COLS];
    memset(acc, 0, sizeof acc);
    if (n == W8_FA_COLS) {
        for (int64_t j = 0; j < keys; j++) {
            const float *vj = v + j * ldv;
            for (int r = 0; r < W8_FA_ROWS; r++) {
                const float pj = p[r * ldp + j];
                for (int c = 0; c < W8_FA_COLS; c++) acc[r][c] = acc[r][c] + pj * vj[c];
            }
        }
    } else {
        for (int64_t j = 0; j < keys; j++) {
            const float *vj = v + j * ldv;
            for (int r = 0; r < W8_FA_ROWS; r++) {
                const float pj = p[r * ldp + j];
                for (int64_t c = 0; c < n; c++) acc[r][c] = acc[r][c] + pj * vj[c];
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int64_t c = 0; c < n; c++) out[r][c] = acc[r][c] * inv[r];
}

/* The keys any row of the task sees, [first, last), as columns: kT[d][c] = key first + c,
 * then zeros as far as a tile reads; returns first. */
W8_ROW_MATH static inline int64_t w8_fa_keys_transposed(const w8_float_attention *a,
                                                        const w8_fa_span *span,
                                                        const float *K, float *kT,
                                                        int64_t ldk)
{
    int64_t first = a->Lk, last = 0;
    for (int64_t i = 0; i < a->Lq; i++) {
        if (span[i].lo < span[i].hi) {
            first = span[i].lo < first ? span[i].lo : first;
            last = span[i].hi > last ? span[i].hi : last;
        }
    }
    if (first > last) first = last = 0;
    const int64_t width = last - first, D = a->D, ks2 = a->ks[2];
    for (int64_t d = 0; d < D; d++) memset(kT + d * ldk + width, 0, W8_FA_KEYS * sizeof(float));
    const float *K0 = K + first * ks2;
    for (int64_t d = 0; d < D; d++)
        for (int64_t c = 0; c < width; c++) kT[d * ldk + c] = K0[c * ks2 + d];
    return first;
}

/* A row's scores sr over the tile's keys [lo, lo + keys) become its probabilities (the
 * keys it does not see 0), in place; returns 1 / their sum, or 0 where it sees no key
 * (its probabilities then zeros, as SDPA gives).  mb, ma: its bool or additive mask
 * from key lo, or NULL. */
W8_ROW_MATH static inline float w8_fa_probabilities(float *sr, int64_t keys, int64_t lo,
                                                    w8_fa_span sp, const uint8_t *mb,
                                                    const float *ma)
{
    if (sp.lo == sp.hi) {
        memset(sr, 0, (size_t)keys * sizeof(float));
        return 0.0f;
    }
    /* Hidden: the tile's keys outside the row's span, a 0 of a bool mask inside. */
    for (int64_t c = 0; c < sp.lo - lo; c++) sr[c] = -INFINITY;
    for (int64_t c = sp.hi - lo; c < keys; c++) sr[c] = -INFINITY;
    if (sp.holes) {
        for (int64_t c = sp.lo - lo; c < sp.hi - lo; c++) sr[c] = mb[c] ? sr[c] : -INFINITY;
    } else if (ma) {
        for (int64_t c = sp.lo - lo; c < sp.hi - lo; c++) sr[c] = sr[c] + ma[c];
    }
    /* Over the row's own span (the rest is -inf, then 0), so that its lanes and its bits
     * do not depend on the rows it shares a tile with. */
    const float top = w8_row_max(sr, sp.lo - lo, sp.hi - lo, -INFINITY);
    if (top == -INFINITY) { /* every key hidden (or -inf added): zeros */
        memset(sr, 0, (size_t)keys * sizeof(float));
        return 0.0f;
    }
    w8_exp_row(sr, 0, keys, top);
    return (float)(1.0 / w8_row_sum(sr, sp.lo - lo, sp.hi - lo));
}

/* Task t of the call: batch t / Hq, query head t % Hq (its KV head: head / (Hq / Hkv)).
 * spans: w8_fa_spans of each batch row (and head, w8_fa_span_heads); scratch:
 * w8_fa_scratch_floats(a) floats. */
W8_ROW_MATH W8_ROW_CLONES static void w8_float_attention_task(const w8_float_attention *a,
                                                              int64_t t,
                                                              const w8_fa_span *spans,
                                                              float *scratch)
{
    const int64_t b = t / a->Hq, h = t % a->Hq, kvh = h / (a->Hq / a->Hkv), D = a->D;
    const float *Q = a->q + b * a->qs[0] + h * a->qs[1];
    const float *K = a->k + b * a->ks[0] + kvh * a->ks[1];
    const float *V = a->v + b * a->vs[0] + kvh * a->vs[1];
    float *O = a->out + b * a->os[0] + h * a->os[1];
    const uint8_t *MB = a->mask_bool ? a->mask_bool + b * a->ms[0] + h * a->ms[1] : NULL;
    const float *MA = a->mask_add ? a->mask_add + b * a->ms[0] + h * a->ms[1] : NULL;
    const int64_t ldk = w8_fa_padded_keys(a->Lk), heads = w8_fa_span_heads(a);
    float *kT = scratch, *s = kT + D * ldk;
    const w8_fa_span *span = spans + (b * heads + (heads > 1 ? h : 0)) * a->Lq;

    const int64_t first = w8_fa_keys_transposed(a, span, K, kT, ldk);

    for (int64_t i0 = 0; i0 < a->Lq; i0 += W8_FA_ROWS) {
        const int rows = a->Lq - i0 < W8_FA_ROWS ? (int)(a->Lq - i0) : W8_FA_ROWS;
        int64_t lo = a->Lk, hi = 0;
        const float *qrows[W8_FA_ROWS];
        float *orows[W8_FA_ROWS];
        for (int r = 0; r < W8_FA_ROWS; r++) {
            const int64_t i = i0 + (r < rows ? r : 0);
            qrows[r] = r < rows ? Q + i * a->qs[2] : NULL;
            orows[r] = O + i * a->os[2];
            if (r < rows && span[i].lo < span[i].hi) {
                lo = span[i].lo < lo ? span[i].lo : lo;
                hi = span[i].hi > hi ? span[i].hi : hi;
            }
        }
        if (lo >= hi) { /* no row of the tile sees a key: zeros, as SDPA gives */
            for (int r = 0; r < rows; r++) memset(orows[r], 0, (size_t)D * sizeof(float));
            continue;
        }
        /* A missing row of the last tile reads row 0 of the tile, its result unused. */
        for (int r = rows; r < W8_FA_ROWS; r++) qrows[r] = qrows[0];
        const int64_t keys = hi - lo;
        for (int64_t c0 = 0; c0 < keys; c0 += W8_FA_KEYS)
            w8_fa_score_tile(qrows, kT + (lo - first) + c0, ldk, D, a->scale, s + c0, ldk);
        float inv[W8_FA_ROWS];
        for (int r = 0; r < W8_FA_ROWS; r++) {
            const int64_t i = i0 + r;
            const w8_fa_span none = {0, 0, 0};
            inv[r] = w8_fa_probabilities(s + r * ldk, keys, lo, r < rows ? span[i] : none,
                                         MB && r < rows ? MB + i * a->ms[2] + lo : NULL,
                                         MA && r < rows ? MA + i * a->ms[2] + lo : NULL);
        }
        for (int64_t d0 = 0; d0 < D; d0 += W8_FA_COLS) {
            float *outs[W8_FA_ROWS];
            for (int r = 0; r < W8_FA_ROWS; r++) outs[r] = orows[r] + d0;
            w8_fa_value_tile(s, ldk, keys, V + lo * a->vs[2] + d0, a->vs[2],
                             D - d0 < W8_FA_COLS ? D - d0 : W8_FA_COLS, inv, outs, rows);
        }
    }
}

#endif
