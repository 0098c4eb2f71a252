/* int8 attention over a paged int8 KV store (pyw8a8.attention's, under numpy's
 * int8_attention and torch's Int8Cache alike): one call attends every stream (a batch
 * row's KV head) and every query.
 *
 * A task is one stream and a block of queries, the tasks shared by the threads of one
 * parallel region.  A task quantizes its queries (every query head of the stream's GQA
 * group: the keys are read once for all of them) to int8 terms, takes their exact int32
 * sums with the keys a page at a time (a full page is a packed weight of `page` tokens,
 * multiplied on the call path's kernels through its table, call.h; the open page, still
 * filling, by plain loops), turns each row into its probabilities as int8 terms, and takes
 * their exact sums with the values, again a page at a time.  A page's product runs on the
 * task's thread alone: spread over the threads, each page cost a parallel region (at
 * 8,192 tokens of prefill the regions took longer than the arithmetic). */
#ifndef PYW8A8_SIMD_KV_ATTENTION_H
#define PYW8A8_SIMD_KV_ATTENTION_H

#include <stdlib.h>

#include "attention.h"
#include "call.h"
#include "common.h"
#include "team.h"
#if defined(_OPENMP)
#include <omp.h>
#define W8_KV_OMP(directive) _Pragma(#directive)
#else
#define W8_KV_OMP(directive)
#endif

/* What a model's mask and softcapping do to a row's scores, indexed as the row's keys:
 * visible[j] 0 hides key j, add[j] is added to its score (each NULL where the model gave
 * none), and softcap > 0 maps a score s to softcap tanh(s / softcap) first. */
typedef struct {
    const uint8_t *visible;
    const float *add;
    float softcap;
} w8_row_mask;

/* w[j] = (hi[j] steps + lo[j]) (qs k_scale[j]), or without lo hi[j] (qs k_scale[j]), for j
 * in [j0, j1): a row's scores from its exact sums. */
W8_ROW_MATH W8_ROW_INLINE void w8_scores_row(const int32_t *hi, const int32_t *lo, float steps,
                                             float qs, const float *k_scale, int64_t j0,
                                             int64_t j1, float *w)
{
    int64_t j = j0;
#if W8_ROW_VECTORS
    for (; j + W8_MAX_LANES <= j1; j += W8_MAX_LANES) {
        w8_vf h = __builtin_convertvector(*(const w8_vi *)(hi + j), w8_vf);
        if (lo) h = h * steps + __builtin_convertvector(*(const w8_vi *)(lo + j), w8_vf);
        *(w8_vf *)(w + j) = h * (qs * *(const w8_vf *)(k_scale + j));
    }
#endif
    for (; j < j1; j++)
        w[j] = (lo ? (float)hi[j] * steps + (float)lo[j] : (float)hi[j]) * (qs * k_scale[j]);
}

/* w[j] = w[j] a b[j] for j in [j0, j1), and the largest (at least 0). */
W8_ROW_MATH W8_ROW_INLINE float w8_scale_row(float *w, float a, const float *b, int64_t j0,
                                             int64_t j1)
{
    int64_t j = j0;
#if W8_ROW_VECTORS
    for (; j + W8_MAX_LANES <= j1; j += W8_MAX_LANES)
        *(w8_vf *)(w + j) = *(w8_vf *)(w + j) * a * *(const w8_vf *)(b + j);
#endif
    for (; j < j1; j++) w[j] = w[j] * a * b[j];
    return w8_row_max(w, j0, j1, 0.0f);
}

/* w[j] -= q[j] scale for j in [j0, j1): a row's residual after its int8 term q. */
W8_ROW_MATH W8_ROW_INLINE void w8_residual_row(float *w, const int8_t *q, float scale,
                                               int64_t j0, int64_t j1)
{
    int64_t j = j0;
#if W8_ROW_VECTORS
    for (; j + W8_MAX_LANES <= j1; j += W8_MAX_LANES)
        *(w8_vf *)(w + j) = *(w8_vf *)(w + j) -
                            __builtin_convertvector(*(const w8_vb *)(q + j), w8_vf) * scale;
#endif
    for (; j < j1; j++) w[j] -= q[j] * scale;
}

/* Row r of int8 attention's probabilities.  hi (and lo, on a lo_steps finer step, unless
 * NULL): the exact sums of the query row's int8 terms with T keys; the score of key j is
 * that sum times q_step * k_scale[j], and only the keys [j0, j1) are visible (and those
 * `mask` leaves, unless NULL).
 * Their softmax, each probability times v_scale[j], is written as int8 terms p_hi (and
 * p_lo unless NULL) of step *p_step, zero outside [j0, j1): the terms of
 * pyw8a8.attention._exact.quantize_terms, the first as w8_quantize_row rounds (127 / max,
 * a row below 127 FLT_MIN is zero; a row that sees no key too).  w: T floats of scratch. */
W8_ROW_MATH W8_ROW_CLONES static void w8_probability_row(
    const int32_t *hi, const int32_t *lo, int64_t T, int64_t lo_steps, double q_step,
    const float *k_scale, const float *v_scale, int64_t j0, int64_t j1,
    const w8_row_mask *mask, float *w, int8_t *p_hi, int8_t *p_lo, float *p_step)
{
    /* In float: the sums' combination (up to 2^30) rounds to float32 as the score itself
     * does, and double arithmetic here took 3x as long (two lanes a vector). */
    w8_scores_row(hi, lo, (float)lo_steps, (float)q_step, k_scale, j0, j1, w);
    if (mask) {
        if (mask->softcap > 0.0f)
            for (int64_t j = j0; j < j1; j++) w[j] = mask->softcap * tanhf(w[j] / mask->softcap);
        if (mask->visible)
            for (int64_t j = j0; j < j1; j++) w[j] = mask->visible[j] ? w[j] : -INFINITY;
        if (mask->add)
            for (int64_t j = j0; j < j1; j++) w[j] += mask->add[j];
    }
    memset(p_hi, 0, (size_t)T);
    if (p_lo) memset(p_lo, 0, (size_t)T);
    *p_step = 0.0f;
    const float top = w8_row_max(w, j0, j1, -INFINITY);
    if (!(top > -INFINITY)) return; /* no key visible (a padded query): zeros */
    w8_exp_row(w, j0, j1, top);
    const float wmax = w8_scale_row(w, (float)(1.0 / w8_row_sum(w, j0, j1)), v_scale, j0, j1);
    if (!(wmax >= 127.0f * FLT_MIN)) return; /* also an empty row */
    const float scale = wmax / 127.0f;
    w8_round_row(w, j0, j1, 127.0f / wmax, p_hi);
    if (!p_lo) {
        *p_step = scale;
        return;
    }
    const float step = scale / (float)lo_steps;
    w8_residual_row(w, p_hi, scale, j0, j1);
    w8_round_row(w, j0, j1, 1.0f / step, p_lo);
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

/* One layer's attention call.  Positions are the layer's token indices. */
typedef struct {
    /* The queries, (streams, group, nq, d) float32, rotated as the keys are and scaled;
     * query i is at position q_start + i. */
    const float *q;
    int64_t streams, group, nq, d, q_start;
    int query_terms, probability_terms; /* 1 or 2 */
    int64_t lo_steps;
    /* The full pages: page p of stream s is the plans key_plans[s * npages + p] (page x d)
     * and value_plans[...] (d x page), positions span_start + p page ..; their scales
     * (streams, npages page) float32. */
    int64_t npages, page, span_start;
    const w8_plan *const *key_plans, *const *value_plans;
    const float *key_scales, *value_scales;
    /* The open page: open_count tokens from open_start, int8 rows (streams, open_room, d)
     * and scales (streams, open_room). */
    int64_t open_start, open_count, open_room;
    const int8_t *open_keys, *open_values;
    const float *open_key_scales, *open_value_scales;
    int64_t window;  /* a sliding window in tokens, or 0 */
    float softcap;   /* > 0: the scores' tanh softcapping */
    /* The model's mask (at most one of visible, add), or none (causal): column c is
     * position mask_start + c, c < mask_cols; (batch, head, query) strides in elements,
     * mask_sh 0 for one mask of every head. */
    const uint8_t *mask_visible;
    const float *mask_add;
    int64_t mask_start, mask_cols, mask_sb, mask_sh, mask_sq;
    /* Streams per batch row; query head kv_head * group + g of a batch row. */
    int64_t kv_per_batch;
    /* The output, float32, (batch, query, head) strides in elements. */
    float *out;
    int64_t out_sb, out_sq, out_sh;
    int64_t block_rows;  /* queries per task */
    const w8_isa_ops *isa;
    int nthreads;
    const w8_call_api *api; /* the call path (pyw8a8._kernels.CALL_API) */
} w8_kv_attention;

enum { W8_KV_OK = 0, W8_KV_QUERY_NOT_FINITE, W8_KV_NO_MEMORY, W8_KV_KERNEL };

/* The keys a task's products read: pages [p0, p1) and the open page (if `open`), T
 * tokens from position `first`. */
typedef struct {
    int64_t p0, p1, first, T;
    int open;
} w8_kv_span;

static inline int64_t w8_kv_end(const w8_kv_attention *a)
{
    return a->open_count ? a->open_start + a->open_count : a->span_start + a->npages * a->page;
}

/* The keys visible to any of the positions [lo, hi). */
static w8_kv_span w8_kv_span_of(const w8_kv_attention *a, int64_t lo, int64_t hi)
{
    w8_kv_span s;
    const int64_t span_end = a->span_start + a->npages * a->page;
    s.p0 = lo <= a->span_start ? 0 : (lo - a->span_start) / a->page;
    s.p1 = hi >= span_end ? a->npages : (hi - a->span_start + a->page - 1) / a->page;
    if (s.p1 < s.p0) s.p1 = s.p0;
    s.open = a->open_count > 0 && a->open_start < hi && a->open_start + a->open_count > lo;
    s.first = s.p1 > s.p0 ? a->span_start + s.p0 * a->page : a->open_start;
    s.T = (s.p1 - s.p0) * a->page + (s.open ? a->open_count : 0);
    return s;
}

/* A page's exact product on this thread: R int8 rows x (C order, K wide) times plan w
 * (N x K), int32 into out (ldo apart). */
static int w8_kv_page_product(const w8_kv_attention *a, const w8_plan *w, int64_t K,
                              int64_t N, const int8_t *x, int64_t R, int32_t *out,
                              int64_t ldo)
{
    const int64_t ncols = (int64_t)W8_NR * a->isa->npanels;
    const int64_t m_step = (R + a->isa->mr - 1) / a->isa->mr * a->isa->mr;
    const int64_t n_step = (N + ncols - 1) / ncols * ncols;
    const int64_t blocking[6] = {(K + W8_KPAD - 1) / W8_KPAD * W8_KPAD, m_step, n_step,
                                 m_step, n_step, 0};
    w8_call c;
    w8_fault f;
    memset(&c, 0, sizeof c);
    c.x = x, c.int8_input = 1, c.M = R, c.K = K, c.kind = W8_CALL_ONE;
    c.plan[0] = w, c.out[0] = out, c.ldo[0] = ldo, c.out_size = 4;
    c.isa = a->isa, c.nthreads = 1, c.blocking = blocking;
    return a->api->run(&c, &f) == W8_FAULT_NONE ? W8_KV_OK : W8_KV_KERNEL;
}

/* S (R x span.T int32, row-major) = the R int8 rows q8 (R x d) times stream s's keys. */
static int w8_kv_key_sums(const w8_kv_attention *a, int64_t s, w8_kv_span sp,
                          const int8_t *q8, int64_t R, int32_t *S)
{
    for (int64_t p = sp.p0; p < sp.p1; p++)
        if (w8_kv_page_product(a, a->key_plans[s * a->npages + p], a->d, a->page, q8, R,
                               S + (p - sp.p0) * a->page, sp.T))
            return W8_KV_KERNEL;
    if (sp.open)
        w8_int8_dots(q8, R, a->d, a->open_keys + s * a->open_room * a->d, a->open_count,
                     a->d, a->d, S + (sp.T - a->open_count), sp.T);
    return W8_KV_OK;
}

/* acc (R x d int64) = the R int8 rows P (R x span.T) times stream s's values.  cols: R
 * page bytes, part: R d int32 of scratch. */
static int w8_kv_value_sums(const w8_kv_attention *a, int64_t s, w8_kv_span sp,
                            const int8_t *P, int64_t R, int8_t *cols, int32_t *part,
                            int64_t *acc)
{
    const int64_t d = a->d;
    memset(acc, 0, (size_t)(R * d) * sizeof *acc);
    for (int64_t p = sp.p0; p <= sp.p1; p++) {
        const int64_t at = (p - sp.p0) * a->page;
        if (p < sp.p1) {
            for (int64_t r = 0; r < R; r++)
                memcpy(cols + r * a->page, P + r * sp.T + at, (size_t)a->page);
            if (w8_kv_page_product(a, a->value_plans[s * a->npages + p], a->page, d, cols, R,
                                   part, d))
                return W8_KV_KERNEL;
        } else if (sp.open) {
            memset(part, 0, (size_t)(R * d) * sizeof *part);
            w8_int8_row_combinations(P + at, R, sp.T,
                                     a->open_values + s * a->open_room * d, a->open_count,
                                     d, d, part, d);
        } else {
            break;
        }
        for (int64_t i = 0; i < R * d; i++) acc[i] += part[i];
    }
    return W8_KV_OK;
}

/* The scratch of a task of M query rows over T keys, laid out in one buffer. */
typedef struct {
    int8_t *q8, *P, *cols;
    int32_t *S, *part;
    int64_t *acc;
    float *q_step, *p_step, *w, *k_scale, *v_scale;
} w8_kv_scratch;

static size_t w8_kv_scratch_bytes(const w8_kv_attention *a, int64_t M, int64_t T,
                                  w8_kv_scratch *sc, char *base)
{
    const int64_t qr = a->query_terms * M, pr = a->probability_terms * M;
    const size_t sizes[11] = {
        (size_t)(qr * a->d), (size_t)(pr * T), (size_t)(pr * a->page), 4 * (size_t)(qr * T),
        4 * (size_t)(pr * a->d), 8 * (size_t)(pr * a->d), 4 * (size_t)M, 4 * (size_t)M,
        4 * (size_t)T, 4 * (size_t)T, 4 * (size_t)T};
    void **at[11] = {(void **)&sc->q8, (void **)&sc->P, (void **)&sc->cols, (void **)&sc->S,
                     (void **)&sc->part, (void **)&sc->acc, (void **)&sc->q_step,
                     (void **)&sc->p_step, (void **)&sc->w, (void **)&sc->k_scale,
                     (void **)&sc->v_scale};
    size_t total = 0;
    for (int i = 0; i < 11; i++) {
        if (base) *at[i] = base + total;
        total += (sizes[i] + 63) / 64 * 64;
    }
    return total;
}

/* The scales of stream s's keys or values over span sp, into out (sp.T floats). */
static void w8_kv_gather_scales(const w8_kv_attention *a, int64_t s, w8_kv_span sp,
                                const float *full, const float *open, float *out)
{
    const int64_t n_full = (sp.p1 - sp.p0) * a->page;
    if (n_full) /* without full pages `full` is NULL: no offset from it */
        memcpy(out, full + s * a->npages * a->page + sp.p0 * a->page, (size_t)n_full * 4);
    if (sp.open)
        memcpy(out + n_full, open + s * a->open_room, (size_t)a->open_count * 4);
}

/* One task: stream s, queries [i0, i1). */
static int w8_kv_task(const w8_kv_attention *a, int64_t s, int64_t i0, int64_t i1,
                      const w8_kv_scratch *sc)
{
    const int64_t n = i1 - i0, M = a->group * n, d = a->d, end = w8_kv_end(a);
    const int64_t p_lo = a->q_start + i0, p_hi = a->q_start + i1;
    int64_t lo = a->window ? p_lo - a->window + 1 : 0, hi = p_hi;
    const int masked = a->mask_visible || a->mask_add;
    if (masked) lo = a->mask_start, hi = a->mask_start + a->mask_cols;
    if (hi > end) hi = end;
    const w8_kv_span sp = w8_kv_span_of(a, lo, hi);
    const int64_t b = s / a->kv_per_batch, kv_head = s % a->kv_per_batch;
    for (int64_t g = 0; g < a->group; g++)
        for (int64_t i = i0; i < i1; i++) {
            const int64_t r = g * n + (i - i0);
            const float *x = a->q + ((s * a->group + g) * a->nq + i) * d;
            if (w8_int8_terms_row(x, d, a->lo_steps, sc->q8 + r * d,
                                  a->query_terms == 2 ? sc->q8 + (M + r) * d : NULL,
                                  &sc->q_step[r]))
                return W8_KV_QUERY_NOT_FINITE;
        }
    if (w8_kv_key_sums(a, s, sp, sc->q8, a->query_terms * M, sc->S)) return W8_KV_KERNEL;
    w8_kv_gather_scales(a, s, sp, a->key_scales, a->open_key_scales, sc->k_scale);
    w8_kv_gather_scales(a, s, sp, a->value_scales, a->open_value_scales, sc->v_scale);
    for (int64_t r = 0; r < M; r++) {
        const int64_t g = r / n, i = i0 + r % n, pos = a->q_start + i;
        int64_t j0 = 0, j1 = sp.T;
        w8_row_mask mask = {NULL, NULL, a->softcap}, *use = a->softcap > 0 ? &mask : NULL;
        if (masked) {
            const int64_t row = b * a->mask_sb + (kv_head * a->group + g) * a->mask_sh +
                                i * a->mask_sq - (a->mask_start - sp.first);
            if (a->mask_visible) mask.visible = a->mask_visible + row;
            if (a->mask_add) mask.add = a->mask_add + row;
            use = &mask;
            j0 = a->mask_start - sp.first;
            j1 = a->mask_start + a->mask_cols - sp.first;
        } else {
            j1 = pos + 1 - sp.first;
            if (a->window) j0 = pos - a->window + 1 - sp.first;
        }
        j0 = j0 < 0 ? 0 : j0, j1 = j1 > sp.T ? sp.T : j1;
        const int64_t pr = a->probability_terms == 2;
        w8_probability_row(sc->S + r * sp.T, a->query_terms == 2 ? sc->S + (M + r) * sp.T : NULL,
                           sp.T, a->lo_steps, sc->q_step[r], sc->k_scale, sc->v_scale,
                           j0 < j1 ? j0 : 0, j0 < j1 ? j1 : 0, use, sc->w,
                           sc->P + r * sp.T, pr ? sc->P + (M + r) * sp.T : NULL, &sc->p_step[r]);
    }
    const int64_t R = a->probability_terms * M;
    if (w8_kv_value_sums(a, s, sp, sc->P, R, sc->cols, sc->part, sc->acc)) return W8_KV_KERNEL;
    for (int64_t r = 0; r < M; r++) {
        const int64_t g = r / n, i = i0 + r % n;
        float *o = a->out + b * a->out_sb + i * a->out_sq + (kv_head * a->group + g) * a->out_sh;
        const int64_t *hi_sum = sc->acc + r * d, *lo_sum = sc->acc + (M + r) * d;
        const double step = sc->p_step[r];
        for (int64_t k = 0; k < d; k++)
            o[k] = (float)((a->probability_terms == 2 ? (double)(hi_sum[k] * a->lo_steps +
                                                                 lo_sum[k])
                                                      : (double)hi_sum[k]) * step);
    }
    return W8_KV_OK;
}

/* Runs the call: W8_KV_OK, or why not (nothing defined written then). */
static int w8_kv_attend(const w8_kv_attention *a)
{
    if (a->streams == 0 || a->nq == 0 || a->group == 0) return W8_KV_OK;
    const int64_t rows = a->block_rows < 1 ? 1 : a->block_rows;
    const int64_t blocks = (a->nq + rows - 1) / rows, ntasks = a->streams * blocks;
    const int64_t Tmax = w8_kv_end(a) - (a->npages ? a->span_start : a->open_start);
    const int64_t Mmax = a->group * (rows < a->nq ? rows : a->nq);
    w8_kv_scratch layout;
    const size_t bytes = w8_kv_scratch_bytes(a, Mmax, Tmax, &layout, NULL);
    int nthreads = a->nthreads < 1 ? 1 : a->nthreads;
    if (nthreads > ntasks) nthreads = (int)ntasks;
    int status = W8_KV_OK;
    const w8_master_place master = w8_master_here();
    W8_KV_OMP(omp parallel num_threads(nthreads))
    {
        w8_join_team(master);
        void *memory = NULL;
        char *base = posix_memalign(&memory, 64, bytes ? bytes : 64) == 0 ? (char *)memory
                                                                         : NULL;
        w8_kv_scratch sc;
        w8_kv_scratch_bytes(a, Mmax, Tmax, &sc, base);
        if (base == NULL) {
            W8_KV_OMP(omp atomic write)
            status = W8_KV_NO_MEMORY;
        }
        W8_KV_OMP(omp for schedule(dynamic))
        for (int64_t t = 0; t < ntasks; t++) {
            int mine;
            W8_KV_OMP(omp atomic read)
            mine = status;
            if (mine != W8_KV_OK) continue;
            const int64_t s = t % a->streams, i0 = (t / a->streams) * rows;
            const int64_t i1 = i0 + rows < a->nq ? i0 + rows : a->nq;
            mine = w8_kv_task(a, s, i0, i1, &sc);
            if (mine != W8_KV_OK) {
                W8_KV_OMP(omp atomic write)
                status = mine;
            }
        }
        free(memory);
    }
    return status;
}

#undef W8_KV_OMP

#endif
