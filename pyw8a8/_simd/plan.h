/* A packed weight's plan (call.h's w8_plan): its settings, sizes and contents checked,
 * its arrays as the kernels read them (an aligned copy of unaligned panels where asked),
 * its rotation's sign table, and the blockings its calls settled, for its last
 * W8_SETTLED_SLOTS row counts per kind of call: a model's layer sees a few in turn
 * (batches of other lengths, a prompt then one token at a time), and a sentence encoder's
 * two batch shapes would otherwise reach the tuner on every call.  The settled slots are
 * read and written under call_path.h's lock. */
#ifndef PYW8A8_SIMD_PLAN_H
#define PYW8A8_SIMD_PLAN_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "common.h"
#include "faults.h"
#include "fwht.h"
#include "tuner.h"

#define W8_SETTLED_SLOTS 8

typedef struct {
    w8_isa_id isa;
    int64_t rows;
    int nthreads;
    w8_blocking blocking;
} w8_settled;

struct w8_plan {
    const uint8_t *panels;
    const int32_t *psum; /* NULL where the encoding needs no sums */
    const float *scales;
    const float *signs;  /* the rotation's sign table (K values), or NULL */
    int64_t N, K, Kp, block;
    int enc, rotate;
    uint32_t seed;
    void *owned_panels;  /* an aligned copy of unaligned panels, or NULL */
    float *owned_signs;
    w8_settled settled[W8_CALL_KINDS][W8_SETTLED_SLOTS];
    int nsettled[W8_CALL_KINDS], next[W8_CALL_KINDS];
};

static int w8_header_fault(const w8_weight_header *h, w8_fault *f)
{
    if (h->format_version != W8_FORMAT_UNPADDED && h->format_version != W8_FORMAT_PADDED)
        return w8_fault_set(f, W8_FAULT_FORMAT, W8_ARG_W1, h->format_version, 0, 0);
    if (h->n < 0 || h->k < 0)
        return w8_fault_set(f, W8_FAULT_SETTING, W8_ARG_W1, W8_SETTING_SHAPE,
                            h->n < 0 ? h->n : h->k, 0);
    if (h->encoding != W8_ENC_BIASED && h->encoding != W8_ENC_SIGNED)
        return w8_fault_set(f, W8_FAULT_SETTING, W8_ARG_W1, W8_SETTING_ENCODING, h->encoding, 0);
    if (h->rotate != 0 && h->rotate != 1)
        return w8_fault_set(f, W8_FAULT_SETTING, W8_ARG_W1, W8_SETTING_ROTATE, h->rotate, 0);
    if (h->block < W8_MIN_BLOCK || h->block > W8_MAX_BLOCK || (h->block & (h->block - 1)))
        return w8_fault_set(f, W8_FAULT_SETTING, W8_ARG_W1, W8_SETTING_BLOCK, h->block, 0);
    if (h->seed < 0 || h->seed > (int64_t)UINT32_MAX)
        return w8_fault_set(f, W8_FAULT_SETTING, W8_ARG_W1, W8_SETTING_SEED, h->seed, 0);
    if (h->rotate && h->format_version == W8_FORMAT_UNPADDED && h->k % h->block)
        return w8_fault_set(f, W8_FAULT_SETTING, W8_ARG_W1, W8_SETTING_PARTIAL_BLOCK, h->k, 0);
    return W8_FAULT_NONE;
}

/* The stored K (rotated_k: K rounded up to a block when rotated) and the packed K. */
static inline int64_t w8_stored_k(const w8_weight_header *h)
{
    return h->rotate ? w8_round_up(h->k, h->block) : h->k;
}

static int w8_layout_fault(const w8_weight_header *h, const w8_weight_arrays *a, w8_fault *f)
{
    const int64_t kp = w8_round_up(w8_stored_k(h), W8_KPAD), np = w8_round_up(h->n, W8_NR);
    const int64_t want[3] = {np * kp, h->encoding == W8_ENC_SIGNED ? np * (kp / W8_KPAD + 1) : 0,
                             h->n};
    const int64_t got[3] = {a->panels_bytes, a->psum_values, a->scales_values};
    for (int i = 0; i < 3; i++)
        if (got[i] != want[i]) return w8_fault_set(f, W8_FAULT_LAYOUT, W8_ARG_W1, i, got[i], want[i]);
    return W8_FAULT_NONE;
}

/* The contents pack_weight makes: values in [-127, 127], zero padding (channels past N,
 * values past the stored K), the signed encoding's prefix sums over 64-value chunks, and
 * finite, non-negative scales.  Every ISA must read the same weights. */
static int w8_contents_fault(const w8_weight_header *h, const w8_weight_arrays *a, w8_fault *f)
{
    const int64_t k_stored = w8_stored_k(h), kp = w8_round_up(k_stored, W8_KPAD);
    const int64_t np = w8_round_up(h->n, W8_NR), chunks = kp / W8_KPAD;
    const uint8_t flip = h->encoding == W8_ENC_BIASED ? 0x80 : 0;
    for (int64_t i = 0; i < h->n; i++)
        if (!(a->scales[i] >= 0.0f) || !isfinite(a->scales[i]))
            return w8_fault_set(f, W8_FAULT_SCALES, W8_ARG_W1, 0, 0, 0);
    for (int64_t row = 0; row < np; row++) {
        const uint8_t *panel = a->panels + (row / W8_NR) * kp * W8_NR;
        const int64_t channel = row % W8_NR;
        int32_t sum = 0;
        for (int64_t k = 0; k < kp; k++) {
            const int8_t q = (int8_t)(panel[(k / 4) * 4 * W8_NR + channel * 4 + k % 4] ^ flip);
            if (q == -128) return w8_fault_set(f, W8_FAULT_CONTENTS, W8_ARG_W1, 0, 0, 0);
            if (q != 0 && (row >= h->n || k >= k_stored))
                return w8_fault_set(f, W8_FAULT_CONTENTS, W8_ARG_W1, 1, 0, 0);
            sum += q;
            if (a->psum_values && (k % W8_KPAD == W8_KPAD - 1 || k == 0)) {
                const int32_t *sums = a->psum + row * (chunks + 1);
                const int ok = k == 0 ? sums[0] == 0 : sums[(k + 1) / W8_KPAD] == sum;
                if (!ok) return w8_fault_set(f, W8_FAULT_CONTENTS, W8_ARG_W1, 1, 0, 0);
            }
        }
    }
    return W8_FAULT_NONE;
}

static void w8_plan_free(w8_plan *p)
{
    if (p == NULL) return;
    free(p->owned_panels);
    free(p->owned_signs);
    free(p);
}

/* A plan of a packed weight (call.h's plan_new); `flags` W8_PLAN_*. */
static w8_plan *w8_plan_new(const w8_weight_header *h, const w8_weight_arrays *a, int flags,
                            w8_fault *f)
{
    memset(f, 0, sizeof *f);
    if (w8_header_fault(h, f) || w8_layout_fault(h, a, f) ||
        ((flags & W8_PLAN_CHECK_CONTENTS) && w8_contents_fault(h, a, f)))
        return NULL;
    w8_plan *p = (w8_plan *)calloc(1, sizeof *p);
    if (p == NULL) {
        w8_fault_set(f, W8_FAULT_NO_MEMORY, W8_ARG_W1, (int64_t)sizeof *p, 0, 0);
        return NULL;
    }
    p->N = h->n, p->K = h->k, p->Kp = w8_round_up(w8_stored_k(h), W8_KPAD);
    p->block = h->block, p->enc = (int)h->encoding, p->rotate = (int)h->rotate;
    p->seed = (uint32_t)h->seed;
    p->panels = a->panels, p->scales = a->scales;
    p->psum = a->psum_values ? a->psum : NULL;
    if ((flags & W8_PLAN_ALIGNED_COPY) && ((uintptr_t)a->panels % 64) && a->panels_bytes) {
        /* Every kernel load of aligned panels is one cache line. */
        if (posix_memalign(&p->owned_panels, 64, (size_t)a->panels_bytes) != 0) {
            w8_plan_free(p);
            w8_fault_set(f, W8_FAULT_NO_MEMORY, W8_ARG_W1, a->panels_bytes, 0, 0);
            return NULL;
        }
        memcpy(p->owned_panels, a->panels, (size_t)a->panels_bytes);
        p->panels = (const uint8_t *)p->owned_panels;
    }
    if (p->rotate && p->K) {
        /* Built once, by the reference: every ISA's sign application gives these bits. */
        if ((p->owned_signs = (float *)malloc((size_t)h->k * sizeof(float))) == NULL) {
            w8_plan_free(p);
            w8_fault_set(f, W8_FAULT_NO_MEMORY, W8_ARG_W1, h->k * 4, 0, 0);
            return NULL;
        }
        w8_sign_table(w8_scalar_sign_scale, p->owned_signs, p->K, p->block, p->seed);
        p->signs = p->owned_signs;
    }
    return p;
}

static int64_t w8_plan_outputs(const w8_plan *p) { return p->N; }

/* The blocking `p` settled for this call, into *b; 0 if none.  The lock held. */
static int w8_settled_blocking(const w8_plan *p, int kind, w8_isa_id isa, int64_t rows,
                               int nthreads, w8_blocking *b)
{
    for (int s = 0; s < p->nsettled[kind]; s++) {
        const w8_settled *slot = &p->settled[kind][s];
        if (slot->rows == rows && slot->nthreads == nthreads && w8_same_isa(slot->isa, isa)) {
            *b = slot->blocking;
            return 1;
        }
    }
    return 0;
}

/* Remember a settled blocking in the slot remembered longest.  The lock held. */
static void w8_remember_blocking(w8_plan *p, int kind, w8_isa_id isa, int64_t rows,
                                 int nthreads, w8_blocking b)
{
    w8_blocking known;
    if (w8_settled_blocking(p, kind, isa, rows, nthreads, &known)) return;
    const int s = p->next[kind];
    p->next[kind] = (s + 1) % W8_SETTLED_SLOTS;
    if (p->nsettled[kind] < W8_SETTLED_SLOTS) p->nsettled[kind]++;
    w8_settled slot = {isa, rows, nthreads, b};
    p->settled[kind][s] = slot;
}

#endif
